"""The cost of replay verification (docs/semantics.md#reproduction) on the
default run of the bundled adapters: `kvcheck run` with no arguments, with
--replays 0 (no verification, as before issue 33) and with the default (3),
alternated round by round in one session so that both see the same machine.
Optionally a third binary (--baseline, e.g. main's kvcheck) beside them.

    python3 bench/python/replay_cost.py --kvcheck build/default/bin/kvcheck --rounds 2 --out bench/results/replay_cost.json
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time


def one_run(binary, extra, work):
    trace_dir = os.path.join(work, "traces")
    shutil.rmtree(trace_dir, ignore_errors=True)
    os.makedirs(trace_dir)
    report = os.path.join(work, "report.json")
    started = time.monotonic()
    done = subprocess.run([binary, "run", "--quiet", "--report", "json", "--out", report, "--trace-dir", trace_dir] + extra,
                          cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seconds = time.monotonic() - started
    with open(report) as file:
        data = json.load(file)
    failures = [f for a in data["adapters"] for p in a["properties"] for f in p.get("failures", [])]
    kinds = {}
    for f in failures:
        kind = (f.get("reproduction") or {}).get("kind") or "not verified"
        kinds[kind] = kinds.get(kind, 0) + 1
    return {"seconds": round(seconds, 2), "status": done.returncode, "failures": len(failures), "reproduction": kinds}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kvcheck", required=True)
    parser.add_argument("--baseline", help="another kvcheck binary run beside (no --replays option)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    variants = [("replays-0", args.kvcheck, ["--replays", "0"]), ("replays-3", args.kvcheck, [])]
    if args.baseline:
        variants.insert(0, ("baseline", args.baseline, []))
    runs = {name: [] for name, _, _ in variants}
    work = tempfile.mkdtemp(prefix="kvcheck-replay-cost-")
    try:
        for round_ in range(args.rounds):
            order = variants if round_ % 2 == 0 else list(reversed(variants))
            for name, binary, extra in order:
                result = one_run(binary, extra, work)
                runs[name].append(result)
                print(name, result, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    medians = {name: statistics.median(r["seconds"] for r in results) for name, results in runs.items()}
    out = {
        "command": "kvcheck run (no arguments: every bundled adapter and the Python example), --replays 0 against the default 3",
        "kvcheck": args.kvcheck,
        "baseline": args.baseline,
        "rounds": args.rounds,
        "runs": runs,
        "median_seconds": medians,
        "ratio_replays_3_over_0": round(medians["replays-3"] / medians["replays-0"], 3),
        "load_average_at_end": os.getloadavg(),
    }
    with open(args.out, "w") as file:
        json.dump(out, file, indent=2)
        file.write("\n")
    print(json.dumps(out["median_seconds"]), out["ratio_replays_3_over_0"])


if __name__ == "__main__":
    main()
