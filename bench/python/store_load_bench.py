#!/usr/bin/env python3
"""Checked operations per second on a store of 1,000 items, and the default
run of one adapter, for two kvcheck binaries side by side (issue 29).

    bench/python/store_load_bench.py --before OLD/kvcheck --after NEW/kvcheck \
        --out bench/results/store_load.json

The store trace is plain text every kvcheck reads: 1,000 `add` lines of
small caches, then `--ops` operations over those ids (get, get_cache, a
generation from the copy, delete and re-add, get_by_ids, release), drawn
from a fixed seed. Each binary replays it in turn (`--rounds` times,
interleaved, so both see the same machine load), all properties checked;
checked ops/s = operations in the trace / wall seconds of the replay
(engine start included). The default run is `kvcheck run --adapter
reference` (200 traces per property), interleaved the same way.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time


def store_trace(items, ops, seed):
    rng = random.Random(seed)
    lines = []
    for i in range(items):
        lines.append(f"add i{i} modern/f32/{i}:[kv{rng.randint(1, 4)} kv{rng.randint(1, 4)}]")
    ids = [f"i{i}" for i in range(items)]
    handle = 1
    live = []
    for _ in range(ops):
        kind = rng.randrange(6)
        if kind == 0:
            lines.append(f"h{handle} = get {rng.choice(ids)}")
            live.append(handle)
            handle += 1
        elif kind == 1:
            lines.append(f"h{handle} = get_cache {rng.choice(ids)}")
            lines.append(f"generate h{handle} prompt={rng.randint(1, 31)} max=2")
            live.append(handle)
            handle += 1
        elif kind == 2:
            victim = rng.choice(ids)
            lines.append(f"delete {victim}")
            lines.append(f"add {victim} modern/f32/{rng.randint(0, 999)}:[kv2 kv2]")
        elif kind == 3:
            lines.append("get_by_ids " + " ".join(rng.choice(ids) for _ in range(3)))
        elif kind == 4 and live:
            lines.append(f"release h{live.pop(rng.randrange(len(live)))}")
        else:
            lines.append(f"h{handle} = get_cache {rng.choice(ids)} {rng.choice(ids)}")
            live.append(handle)
            handle += 1
    return "\n".join(lines) + "\n"


def timed(command, cwd):
    start = time.monotonic()
    result = subprocess.run(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seconds = time.monotonic() - start
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", required=True)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--out")
    args = parser.parse_args()

    binaries = {"before": os.path.abspath(args.before), "after": os.path.abspath(args.after)}
    with tempfile.TemporaryDirectory() as work:
        trace = os.path.join(work, "store.trace")
        text = store_trace(args.items, args.ops, args.seed)
        with open(trace, "w") as f:
            f.write(text)
        operations = text.count("\n")
        replay = {name: [] for name in binaries}
        run = {name: [] for name in binaries}
        for _ in range(args.rounds):
            for name, binary in binaries.items():
                replay[name].append(timed([binary, "replay", trace, "--adapter", "reference", "--quiet"], work))
            for name, binary in binaries.items():
                run[name].append(timed([binary, "run", "--adapter", "reference", "--trace-dir", work], work))

    result = {
        "command": " ".join(sys.argv),
        "load_average": os.getloadavg(),
        "store_trace": {"items": args.items, "operations": operations, "seed": args.seed},
        "rounds": args.rounds,
    }
    for name in binaries:
        median = statistics.median(replay[name])
        result[name] = {
            "binary": binaries[name],
            "replay_seconds": replay[name],
            "checked_ops_per_second": operations / median,
            "default_run_seconds": run[name],
        }
    result["default_run_ratio"] = statistics.median(run["after"]) / statistics.median(run["before"])
    result["store_ops_ratio"] = result["after"]["checked_ops_per_second"] / result["before"]["checked_ops_per_second"]
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
