#!/usr/bin/env python3
"""Regenerates the tables of BENCHMARKS.md from the JSON in bench/results.

    python3 bench/report.py [--results bench/results] [--out BENCHMARKS.md]

Only the part between the markers `<!-- results:begin -->` and
`<!-- results:end -->` is rewritten; the prose around it is kept. Every
number comes from the JSON files of one run (copy.json, harness.json and,
when present, fuzz_find.json; commit.txt names the commit it ran at); the executor's numbers before the checker
change come from executor-before.json, measured once at 3521b8a (the
executor before entry versions) with the same benchmark sources.
"""

import argparse
import json
import os
import statistics
import sys

BEGIN = "<!-- results:begin -->"
END = "<!-- results:end -->"


def load(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def by_name(results):
    if not results:
        return {}
    named = {}
    for b in results["benchmarks"]:
        # Registered names carry Google Benchmark's suffixes; keep the stem.
        stem = "/".join(p for p in b["name"].split("/") if not p.startswith(("iterations:", "manual_time", "real_time", "min_time:")))
        named[stem] = b
    return named


def fmt(x, digits=3):
    if x is None:
        return "-"
    if abs(x) >= 1e5:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.{digits}g}"


def seconds(x):
    if x is None:
        return "-"
    return f"{x * 1e3:.0f} ms" if x < 1 else f"{x:.2f} s"


def mutant_order(name):
    """M1..M37 first, then PM1..PM28: the family's letters, then the number."""
    letters = name.rstrip("0123456789")
    return (len(letters), letters, int(name[len(letters):] or 0))


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def run_header(copy, harness, commit):
    context = (harness or copy or {}).get("context", {})
    load_avg = context.get("load_avg") or []
    return (f"Run of {context.get('date', '?')} on {context.get('host_name', '?')}: {context.get('num_cpus', '?')} CPUs "
            f"at {context.get('mhz_per_cpu', '?')} MHz, load average {', '.join(f'{x:.1f}' for x in load_avg) or '?'} "
            f"when the run started (other work shares the machine: wall-clock numbers carry its load), "
            f"commit {commit or '?'} (and the working tree). Google Benchmark is Debian's build "
            f"({context.get('library_build_type', '?')}); it only keeps the time.")


def clone_section(copy):
    rows = []
    for name, b in copy.items():
        if not name.startswith("clone_vs_memcpy/"):
            continue
        _, dtype, size = name.split("/")
        off = copy.get(f"clone_vs_memcpy_pool_off/{dtype}/{size}", {})
        rows.append([dtype, size, fmt(b["clone_GBps"]), fmt(b["memcpy_GBps"]), fmt(b["memcpy_fresh_GBps"]),
                     f"**{b['clone_vs_memcpy']:.2f}**", f"{b['clone_vs_memcpy_fresh']:.2f}",
                     fmt(b["clone_page_faults"]), fmt(b.get("pool_reused_blocks_per_clone")),
                     "-" if not off else f"{off['clone_vs_memcpy']:.2f}",
                     "-" if not off else fmt(off["clone_page_faults"])])
    return "\n".join([
        "### Clone vs memcpy",
        "",
        "`kv::clone` of a 4-layer modern cache against memcpy of the same bytes, slot by slot, into reused "
        "(resident) buffers and into fresh ones from the allocator; medians of interleaved rounds; GB/s = 1e9 bytes/s. "
        "kv::clone takes slot buffers of 64 KiB and up from its buffer pool (src/kv/buffer_pool.h), which keeps "
        "the blocks of freed copies resident; the last two columns are the same rounds with the pool off (limit 0: "
        "every block from and back to the system). Target: clone/memcpy >= 0.8 from 1 MiB up.",
        "",
        table(["dtype", "cache", "clone GB/s", "memcpy GB/s", "memcpy fresh GB/s", "clone/memcpy",
               "clone/memcpy fresh", "page faults per clone", "pool blocks reused per clone",
               "clone/memcpy, pool off", "page faults per clone, pool off"], rows),
    ])


def merge_section(copy):
    rows = []
    for name, b in copy.items():
        if not name.startswith("merge/"):
            continue
        _, parts, size = name.split("/")
        rows.append([parts.replace("ids", ""), size, fmt(b["merge_GBps"]), fmt(b["clone_GBps"]), f"{b['merge_vs_clone']:.2f}",
                     fmt(b["merge_page_faults"])])
    return "\n".join([
        "### Merge of many ids",
        "",
        "`Store::get_cache(ids)` of k stored caches of total/k bytes each; GB/s of the parts' bytes, against a clone "
        "of one cache of the same total (interleaved); both take their slot buffers from the buffer pool.",
        "",
        table(["ids", "total", "merge GB/s", "clone GB/s", "merge/clone", "page faults per merge"], rows),
    ])


def generation_section(copy):
    rows = []
    for name, b in copy.items():
        if not name.startswith("generation_path/"):
            continue
        _, adapter, size = name.split("/")
        rss = b.get("peak_rss_added_MiB")
        rows.append([adapter, size, fmt(b["copies"]), f"{b['bytes_copied'] / 2**20:.2f} MiB ({b['copied_in_caches']:.0f} caches)",
                     fmt(b["peak_live_sets"]), f"{b['path_ms']:.1f}",
                     "-" if rss is None else f"{rss:.0f} MiB ({b['peak_rss_added_in_caches']:.2f} caches)"])
    return "\n".join([
        "### The generation path",
        "",
        "`generate(get_cache(id))` through the engine interface, prompt of 2 tokens, up to 4 new: the K/V copies and "
        "bytes the engine logs, the peak K/V sets alive it reports, the median time of one path, and the peak resident "
        "memory the path adds (a child process; glibc maps allocations of 1 MiB and up on their own, so freed K/V "
        "leaves at once). The reference must show 1 copy and 2 sets; M3 (the double copy) shows 2 and 3.",
        "",
        table(["adapter", "cache", "copies", "bytes copied", "peak live sets", "path ms", "peak RSS added"], rows),
    ])


def executor_rows(named, key):
    """{(mix, entries): {way: value}}: from executor/<mix>/<N>entries/<way>
    benchmarks (key), and from the interleaved ones (<way>_<key> counters)."""
    rows = {}
    for name, b in named.items():
        if not name.startswith("executor/"):
            continue
        _, mix, entries, mode = name.split("/")
        row = rows.setdefault((mix, int(entries.replace("entries", ""))), {})
        if mode == "interleaved":
            for way in ("checked", "unchecked", "no_generation_rerun"):
                if f"{way}_{key}" in b:
                    row[way] = b[f"{way}_{key}"]
            # The per-round ratios' medians, when the benchmark reports them.
            if "overhead" in b:
                row["overhead/checked"] = b["overhead"]
            if "overhead_no_generation_rerun" in b:
                row["overhead/no_generation_rerun"] = b["overhead_no_generation_rerun"]
        else:
            row[mode] = b.get(key)
    return rows


def executor_section(harness, before, fuzz):
    cpu = executor_rows(harness, "ops_per_cpu_s")
    wall = executor_rows(harness, "ops_per_s")
    before_cpu = executor_rows(before, "ops_per_cpu_s")

    def over(row, mode):
        if row.get(f"overhead/{mode}"):
            return f"{row[f'overhead/{mode}']:.2f}"
        return "-" if not row.get(mode) or not row.get("unchecked") else f"{row['unchecked'] / row[mode]:.2f}"

    rows = []
    mixes = ["mixed", "mixed_no_get_all", "store", "store_no_get_all"]
    for (mix, entries) in sorted(cpu, key=lambda k: (mixes.index(k[0]) if k[0] in mixes else len(mixes), k[1])):
        now = cpu[(mix, entries)]
        was = before_cpu.get((mix, entries), {})
        ratio_before = was["unchecked"] / was["checked"] if was.get("checked") else None
        rows.append([mix, entries, fmt(now.get("checked")), fmt(now.get("every_step")), fmt(now.get("unchecked")),
                     f"**{over(now, 'checked')}**", over(now, "every_step"), over(now, "no_generation_rerun"),
                     fmt(wall[(mix, entries)].get("checked")),
                     "-" if ratio_before is None else f"{ratio_before:.1f}"])
    stateful = harness.get("stateful_property/100cases", {})
    lines = [
        "### Harness throughput",
        "",
        "Executor operations per second on the reference, after N adds, over a seeded mix of 2,000 operations on small "
        "caches (up to 3 layers of up to 5 tokens). `mixed`: the workload's kinds at the uniform swarm's weights, "
        "generation included, files left out; `store`: the same without generation; `<mix>_no_get_all` (1,000 entries): "
        "the same without get_all, whose look-up of every id in the reference's map is a third or more of the "
        "unchecked run at 1,000 entries and costs only a sixth more checked (one comparison of the id lists), so that "
        "its share pulls the overhead of the mix down. Checked: every checker on, "
        "the default schedule (after each step, what it can reach; every entry at full reads: harness/executor.cpp). "
        "Every step: every checker on, every entry, the listing and every handle read after every step "
        "(`RunOptions::every_entry_every_step`, the schedule of the executor before, with entry versions). "
        "Unchecked: no checker (`PropertySet::none()`): the engine's operations and the auditor's model of them, "
        "nothing read from the store and no expected view or digest made (until 08422d4 this run still did the checkers' reading, and until bb80f07 it made every object's expected view and digest: see the notes). "
        "All from one run, rates per CPU-second of the process "
        "(the load of other processes does not inflate them); the wall-clock rate of the checked run beside. "
        "Checked, unchecked and without the generation rerun run interleaved, round by round, in one benchmark "
        "(`executor/<mix>/<N>entries/interleaved`), so their ratios do not carry the machine's drift. "
        "Overhead = checked / unchecked CPU time: the median over rounds of each round's ratio (the order of the ways "
        "reversed every other round); every step: the ratio of the two ways' medians. `no gen. rerun`: the overhead with every checker but "
        "generation-equivalent, whose reference generation on a fresh copy runs the model a second time. "
        "Overhead before versions: the executor of 3521b8a, which re-read and re-hashed every entry after every "
        "step (executor-before.json, measured once, with the decoder of then). Targets: >= 25,000 checked ops/s on "
        "small caches; overhead <= 1.5 at 1,000 entries.",
        "",
        table(["mix", "entries", "checked ops/s", "every-step ops/s", "unchecked ops/s", "overhead",
               "overhead every step", "overhead, no gen. rerun", "checked ops/s (wall)", "overhead before versions"],
              rows),
        "",
    ]
    speed = (fuzz or {}).get("speed")
    if speed:
        fast, asan = speed["no_sanitizers"], speed["asan_ubsan"]
        lines.append(f"Fuzz exec/s of the operation target (`fuzz_ops` on the reference, {fast['seconds']} s from the "
                     f"repository corpus, the flags of `scripts/fuzz-overnight`): **{fast['exec_per_s']:,}** without "
                     f"sanitizers, **{asan['exec_per_s']:,}** with ASan + UBSan "
                     f"(ratio {fast['exec_per_s'] / max(asan['exec_per_s'], 1):.1f}). Command: `{fast['command']}`.")
    else:
        lines.append("Fuzz exec/s of the operation target, with and without sanitizers: not measured in this run "
                     "(`scripts/bench --fuzz` adds it; `scripts/fuzz-speed` measures every target).")
    lines.append("")
    if stateful:
        lines.append(f"Stateful RapidCheck property (its loop without RapidCheck: 100 cases of sizes 0..99, every "
                     f"property after every step, dumps included): **{stateful['cases_per_s']:.0f} cases/s** wall-clock, "
                     f"{stateful['cases_per_cpu_s']:.0f} per CPU-second, {stateful['ops_per_s']:.0f} ops/s.")
    return "\n".join(lines)


def find_section(harness, fuzz):
    rows = []
    for name, b in harness.items():
        if not name.startswith("time_to_find/"):
            continue
        mutant = name.split("/")[1]
        rows.append([mutant, seconds(b["find_s"]), fmt(b["traces_to_failure"]), seconds(b["shrink_s"]),
                     fmt(b["shrunk_ops"]), f"**{seconds(b['verdict_s'])}**", seconds(b["verdict_cpu_s"]),
                     seconds(b["verdict_s_max"]), f"{int(b['missed'])}/{int(b['seeds'])}"])
    rows.sort(key=lambda r: mutant_order(r[0]))
    lines = [
        "### Time to find a bug",
        "",
        "Per mutant, medians over 10 first seeds (100003 apart) of `find_and_shrink` (properties/run_util.h): seeded "
        "traces of the default workload, every property checked, then the shrinker. Verdict = find + shrink. "
        "Target: verdict median <= 0.5 s per mutant.",
        "",
        table(["mutant", "find", "traces to failure", "shrink", "shrunk ops", "verdict", "verdict CPU",
               "verdict max", "missed"], rows),
        "",
    ]
    if fuzz:
        rows = []
        def median_of(m, key):
            return seconds(statistics.median(m[key])) if m.get(key) else "-"

        for m in fuzz["mutants"]:
            rows.append([m["mutant"], median_of(m, "find_seconds"), fmt(statistics.median(m["execs"])),
                         median_of(m, "shrink_seconds"),
                         fmt(statistics.median(m["shrunk_ops"])) if m["shrunk_ops"] else "-",
                         f"**{seconds(statistics.median(m['seconds']))}**", seconds(max(m["seconds"])),
                         f"{m['missed']}/{m['seeds']}"])
        lines += [
            "Fuzzer path: " + fuzz["description"],
            "",
            table(["mutant", "find", "execs to failure", "shrink", "shrunk ops", "verdict", "verdict max", "missed"],
                  rows),
            "",
        ]
    else:
        lines.append("Fuzzer path: not measured in this run (`scripts/bench --fuzz` adds it).")
    return "\n".join(lines)


def durability_section(durability):
    if not durability:
        return "### dump_kill\n\nNot measured in this run (kv_bench_durability)."
    rows = []
    for name, b in durability.items():
        if not name.startswith("dump_kill_step/"):
            continue
        rows.append([name.split("/")[1], f"**{fmt(b['dump_kill_ms'])}**", fmt(b["dump_kill_cpu_ms"]),
                     fmt(b["dump_kill_children_cpu_ms"]), fmt(b["dump_ms"])])
    workload = durability.get("dump_kill_workload", {})
    lines = [
        "### dump_kill",
        "",
        "One `dump_kill` step (docs/durability.md) on the reference over a store of small entries, against one plain "
        "`dump` of the same store: ms per step, medians of 5 interleaved rounds of 8 steps each. A `dump_kill` forks "
        "three processes (a complete dump, a killed one, the fresh engines' loads); their CPU time is the children's "
        "column.",
        "",
        table(["entries", "dump_kill ms", "kvcheck CPU ms", "children CPU ms", "dump ms"], rows),
        "",
    ]
    if workload:
        lines.append(f"The default workload draws {int(workload['dump_kill_steps'])} `dump_kill` steps in the "
                     f"{int(workload['traces'])} traces of a `kvcheck run` search ({int(workload['traces_with_dump_kill'])} "
                     "traces hold one); only the dump-safe search runs them.")
    return "\n".join(lines)


def key_numbers(copy, harness, before, fuzz):
    def get(named, name, key):
        return named.get(name, {}).get(key)

    clone_1 = get(copy, "clone_vs_memcpy/f32/1MiB", "clone_vs_memcpy")
    clone_256 = get(copy, "clone_vs_memcpy/f32/256MiB", "clone_vs_memcpy")
    clone_256_fresh = get(copy, "clone_vs_memcpy/f32/256MiB", "clone_vs_memcpy_fresh")
    lines = ["### Key numbers", ""]
    off_1 = get(copy, "clone_vs_memcpy_pool_off/f32/1MiB", "clone_vs_memcpy")
    off_256 = get(copy, "clone_vs_memcpy_pool_off/f32/256MiB", "clone_vs_memcpy")
    if clone_1 is not None:
        text = (f"- clone/memcpy (float32): {clone_1:.2f} at 1 MiB, {clone_256:.2f} at 256 MiB "
                f"({clone_256_fresh:.2f} of a memcpy into fresh pages)")
        if off_1 is not None and off_256 is not None:
            text += f"; with the buffer pool off: {off_1:.2f} at 1 MiB, {off_256:.2f} at 256 MiB"
        lines.append(text + ".")
    cpu = executor_rows(harness, "ops_per_cpu_s")
    before_cpu = executor_rows(before, "ops_per_cpu_s")
    for mix in ("mixed", "store", "mixed_no_get_all", "store_no_get_all"):
        now = cpu.get((mix, 1000), {})
        was = before_cpu.get((mix, 1000), {})
        if now.get("checked") and now.get("unchecked"):
            ratio = now.get("overhead/checked") or now["unchecked"] / now["checked"]
            text = f"- checker overhead at 1,000 entries ({mix}): {ratio:.2f}"
            if now.get("no_generation_rerun"):
                no_rerun = now.get("overhead/no_generation_rerun") or now["unchecked"] / now["no_generation_rerun"]
                text += f" ({no_rerun:.2f} without generation-equivalent's rerun)"
            if now.get("every_step"):
                text += f"; every entry every step: {now['unchecked'] / now['every_step']:.1f}"
            if was.get("checked"):
                text += f"; before entry versions: {was['unchecked'] / was['checked']:.1f}"
            lines.append(text + ".")
    small = [(mix, cpu.get((mix, 10), {}).get("checked")) for mix in ("mixed", "store")]
    if all(rate for _, rate in small):
        lines.append("- checked ops/s on small caches (10 entries): " +
                     ", ".join(f"{rate:,.0f} ({mix})" for mix, rate in small) + ".")
    finds = [(n.split("/")[1], b["verdict_s"], b["find_s"]) for n, b in harness.items() if n.startswith("time_to_find/")]
    if finds:
        finds.sort(key=lambda f: mutant_order(f[0]))
        lines.append("- seeded path, median time to first failure per mutant, find (verdict = find + shrink): " +
                     ", ".join(f"{m} {seconds(f)} ({seconds(v)})" for m, v, f in finds) + ".")
    if fuzz:
        lines.append("- fuzzer path from an empty corpus, median verdict (find + shrink) per mutant: " +
                     ", ".join(f"{m['mutant']} {seconds(statistics.median(m['seconds']))}" for m in fuzz["mutants"]) + ".")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--results", default="bench/results")
    parser.add_argument("--out", default="BENCHMARKS.md")
    args = parser.parse_args()
    copy_json = load(os.path.join(args.results, "copy.json"))
    harness_json = load(os.path.join(args.results, "harness.json"))
    before = by_name(load(os.path.join(args.results, "executor-before.json")))
    fuzz = load(os.path.join(args.results, "fuzz_find.json"))
    durability = by_name(load(os.path.join(args.results, "durability.json")))
    if not copy_json or not harness_json:
        sys.exit(f"report.py: {args.results} lacks copy.json or harness.json: run scripts/bench")
    copy, harness = by_name(copy_json), by_name(harness_json)
    commit_path = os.path.join(args.results, "commit.txt")
    commit = open(commit_path).read().strip() if os.path.exists(commit_path) else None
    generated = "\n\n".join([
        run_header(copy_json, harness_json, commit),
        key_numbers(copy, harness, before, fuzz),
        clone_section(copy),
        merge_section(copy),
        generation_section(copy),
        executor_section(harness, before, fuzz),
        find_section(harness, fuzz),
        durability_section(durability),
    ])
    text = open(args.out).read() if os.path.exists(args.out) else f"# Benchmarks\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        sys.exit(f"report.py: {args.out} lacks the markers {BEGIN} / {END}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(args.out, "w") as f:
        f.write(head + BEGIN + "\n" + generated + "\n" + END + tail)


if __name__ == "__main__":
    main()
