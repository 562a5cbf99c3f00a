#!/usr/bin/env python3
"""kv_bench_paged's checked operations per second, before and after a change,
side by side (issue 39): `checked_by_pool_size` run `--repeats` times by each
binary, the two alternating, and the medians of each counter kept, with the
load average around each run (the machine may be shared: the CPU-time
counters carry little of the load, the wall-clock ones all of it).

    bench/paged_side_by_side.py --before ../base/build/default/bench/kv_bench_paged \\
        --after build/default/bench/kv_bench_paged --pool-sizes 16,1024 --out bench/results/paged_side_by_side.json

prints a Markdown table (BENCHMARKS.md, "The paged family") and writes the
JSON: every run's counters, the commands, the medians."""

import argparse
import json
import os
import statistics
import subprocess
import tempfile

COUNTERS = ["checked_ops_cpu_s", "unchecked_ops_cpu_s", "checked_ops_s"]


def run_once(binary, pool_sizes):
    """One run of checked_by_pool_size: its counters, the load average before and after."""
    with tempfile.TemporaryDirectory(prefix="kvcheck-paged-bench-") as scratch:
        out = os.path.join(scratch, "run.json")
        load = os.getloadavg()[0]
        completed = subprocess.run([binary, "--benchmark_filter=checked_by_pool_size", "--benchmark_out=" + out,
                                    "--benchmark_out_format=json"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   text=True, env=dict(os.environ, TMPDIR="/dev/shm", KVCHECK_BENCH_POOL_SIZES=pool_sizes))
        if completed.returncode != 0:
            raise SystemExit(f"paged_side_by_side.py: {binary} exited {completed.returncode}:\n{completed.stderr}")
        with open(out) as f:
            counters = json.load(f)["benchmarks"][0]
    return {"counters": {k: v for k, v in counters.items() if "/" in k}, "load_1min": [load, os.getloadavg()[0]]}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the kv_bench_paged of the baseline")
    parser.add_argument("--after", required=True, help="the kv_bench_paged measured against it")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pool-sizes", default="", help="e.g. 16,1024 (KVCHECK_BENCH_POOL_SIZES); all of the benchmark's by default")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    runs = {"before": [], "after": []}
    for _ in range(args.repeats):
        for side in ("before", "after"):
            runs[side].append(run_once(getattr(args, side), args.pool_sizes))
    sizes = sorted({int(k.split("/")[1]) for k in runs["after"][0]["counters"]})
    medians = {side: {f"{c}/{n}": statistics.median(r["counters"][f"{c}/{n}"] for r in runs[side])
                      for c in COUNTERS for n in sizes} for side in runs}
    loads = {side: statistics.median(l for r in runs[side] for l in r["load_1min"]) for side in runs}
    with open(args.out, "w") as f:
        json.dump({"commands": {"before": args.before, "after": args.after}, "pool_sizes": args.pool_sizes, "repeats": args.repeats, "runs": runs,
                   "medians": medians, "load_1min_median": loads}, f, indent=1)
    print("| pool | checked ops/s CPU before | after | after/before | unchecked ops/s CPU before | after | checked ops/s wall before | after |")
    print("|---|---|---|---|---|---|---|---|")
    for n in sizes:
        b, a = medians["before"], medians["after"]
        print(f"| {n:,} | {b[f'checked_ops_cpu_s/{n}']:,.0f} | {a[f'checked_ops_cpu_s/{n}']:,.0f} | "
              f"**{a[f'checked_ops_cpu_s/{n}'] / b[f'checked_ops_cpu_s/{n}']:.1f}x** | {b[f'unchecked_ops_cpu_s/{n}']:,.0f} | "
              f"{a[f'unchecked_ops_cpu_s/{n}']:,.0f} | {b[f'checked_ops_s/{n}']:,.0f} | {a[f'checked_ops_s/{n}']:,.0f} |")
    print(f"load (1 min, median) before {loads['before']:.1f} / after {loads['after']:.1f}")


if __name__ == "__main__":
    main()
