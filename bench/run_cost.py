#!/usr/bin/env python3
"""What one `kvcheck run` costs, before and after a change, measured side by
side in one run (issue 39): each command is run `--repeats` times by each
binary, the two binaries alternating, and the medians of wall time, CPU
time (user + system, of kvcheck and every process it waited for: its jobs,
adapter processes, dump children) and the largest resident set among
them are kept, with the load average around
each run (the machine may be shared: CPU time carries little of the load,
wall time all of it).

    bench/run_cost.py --before /work/wt/base/build/default/bin/kvcheck \
        --after build/default/bin/kvcheck --out bench/results/run_cost.json

prints a Markdown table (BENCHMARKS.md, "The cost of a run") and writes the
JSON: every run's figures, the commands, the medians. The Python example is
the one of each binary's own source tree (the tree above its build
directory), so that each side runs its own SDK and example store."""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

# The example's path inside a source tree: each binary runs its own tree's
# example, which puts that tree's SDK first on its path (the example and
# the SDK are part of what is measured).
EXAMPLE = os.path.join("python", "examples", "activation_memory_adapter.py")

COMMANDS = {
    "reference": ["run", "--adapter", "reference", "--jobs", "1"],
    "paged-reference": ["run", "--adapter", "paged-reference", "--jobs", "1"],
    "python-example": ["run", "--adapter", EXAMPLE],
}


def tree_of(binary):
    """The source tree a kvcheck binary was built in: the nearest directory
    above it holding python/examples (build/default/bin/kvcheck -> the tree)."""
    directory = os.path.dirname(binary)
    while directory != os.path.dirname(directory):
        if os.path.isdir(os.path.join(directory, "python", "examples")):
            return directory
        directory = os.path.dirname(directory)
    raise SystemExit(f"run_cost.py: no source tree (python/examples) above {binary}")


def arguments_for(binary, name):
    """COMMANDS[name] with the example's path in `binary`'s own tree."""
    return [os.path.join(tree_of(binary), a) if a == EXAMPLE else a for a in COMMANDS[name]]


def run_once(binary, arguments):
    """One run in a scratch directory (its trace files go there): wall
    seconds, CPU seconds (user, system) of it and its descendants, the
    largest resident set of it or any descendant (kvcheck, its jobs, the
    adapter processes), the load average before it."""
    with tempfile.TemporaryDirectory(prefix="kvcheck-run-cost-") as scratch:
        load = os.getloadavg()[0]
        start = time.monotonic()
        process = subprocess.Popen([binary] + arguments + ["--quiet", "--trace-dir", scratch], cwd=scratch,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        stderr = process.stderr.read()
        # wait4's usage is the child's and that of every descendant it waited for.
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.monotonic() - start
        process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"run_cost.py: {binary} {' '.join(arguments)} exited {process.returncode}:\n{stderr}")
    return {"wall_s": wall, "user_s": usage.ru_utime, "sys_s": usage.ru_stime, "max_rss_kib": usage.ru_maxrss,
            "load_1min": load}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the kvcheck binary of the baseline")
    parser.add_argument("--after", required=True, help="the kvcheck binary measured against it")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", action="append", choices=sorted(COMMANDS), help="these commands only")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    names = args.only or list(COMMANDS)
    runs = {name: {"before": [], "after": []} for name in names}
    for name in names:
        for repeat in range(args.repeats):
            for side in ("before", "after"):
                binary = os.path.abspath(args.before if side == "before" else args.after)  # each run has its own cwd
                runs[name][side].append(run_once(binary, arguments_for(binary, name)))
                last = runs[name][side][-1]
                print(f"{name} {side} {repeat + 1}/{args.repeats}: {last['wall_s']:.2f} s wall, "
                      f"{last['user_s'] + last['sys_s']:.2f} s CPU, largest RSS {last['max_rss_kib'] / 1024:.0f} MiB, "
                      f"load {last['load_1min']:.1f}", flush=True)
    medians = {}
    for name in names:
        medians[name] = {}
        for side in ("before", "after"):
            figures = runs[name][side]
            medians[name][side] = {
                "wall_s": statistics.median(f["wall_s"] for f in figures),
                "cpu_s": statistics.median(f["user_s"] + f["sys_s"] for f in figures),
                "user_s": statistics.median(f["user_s"] for f in figures),
                "sys_s": statistics.median(f["sys_s"] for f in figures),
                "max_rss_kib": statistics.median(f["max_rss_kib"] for f in figures),
                "load_1min": statistics.median(f["load_1min"] for f in figures),
            }
    result = {"repeats": args.repeats, "before": args.before, "after": args.after,
              "commands": {name: "kvcheck " + " ".join(COMMANDS[name]) for name in names},
              "trees": {side: tree_of(os.path.abspath(binary)) for side, binary in (("before", args.before), ("after", args.after))},
              "cpus": os.cpu_count(), "medians": medians, "runs": runs,
              "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    with open(args.out, "w") as file:
        json.dump(result, file, indent=1)
    print("\n| command | wall before | wall after | CPU before (user+sys) | CPU after (user+sys) | CPU after/before "
          "| largest RSS before / after | load (1 min) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        b, a = medians[name]["before"], medians[name]["after"]
        print(f"| `{result['commands'][name]}` | {b['wall_s']:.2f} s | {a['wall_s']:.2f} s | "
              f"{b['cpu_s']:.2f} s ({b['user_s']:.2f}+{b['sys_s']:.2f}) | {a['cpu_s']:.2f} s ({a['user_s']:.2f}+{a['sys_s']:.2f}) | "
              f"**{a['cpu_s'] / b['cpu_s']:.2f}** | {b['max_rss_kib'] / 1024:.0f} / {a['max_rss_kib'] / 1024:.0f} MiB | "
              f"{b['load_1min']:.1f} / {a['load_1min']:.1f} |")


if __name__ == "__main__":
    main()
