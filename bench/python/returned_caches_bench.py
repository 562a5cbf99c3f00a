"""The default `kvcheck run --adapter python/examples/activation_memory_adapter.py`,
before and after a change, interleaved round by round (before, after, before,
...): wall-clock seconds of each run, the medians, their ratio, and what each
run checked (the closing counts of its JSON report). Issue 29: with the
returned-cache requests of protocol 4 drawn for the example adapter, the
default run keeps within 1.2x of its wall time before.

    /usr/bin/python3 bench/python/returned_caches_bench.py \\
        --before /work/main/build/default/bin/kvcheck:/work/main/python \\
        --after build/default/bin/kvcheck:python --rounds 5 --out bench/results/returned_caches.json

Each side is KVCHECK:PYTHON_DIR: the kvcheck binary and the python/ tree
(SDK and example) of that version.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time


def run_once(kvcheck: str, python_dir: str, extra):
    adapter = os.path.join(python_dir, "examples", "activation_memory_adapter.py")
    with tempfile.TemporaryDirectory(prefix="kvcheck-bench-") as scratch:
        out = os.path.join(scratch, "report.json")
        command = [kvcheck, "run", "--adapter", adapter, "--report", "json", "--out", out,
                   "--trace-dir", os.path.join(scratch, "traces"), "--quiet"] + list(extra)
        start = time.monotonic()
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.monotonic() - start
        if done.returncode != 0:
            sys.exit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
        with open(out) as file:
            report = json.load(file)
    summary = report.get("summary", {})
    return {"wall_s": round(wall, 3), "summary": summary}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="KVCHECK:PYTHON_DIR of the version before")
    parser.add_argument("--after", required=True, help="KVCHECK:PYTHON_DIR of the version after")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", required=True)
    parser.add_argument("extra", nargs="*", help="more arguments for kvcheck run (after --)")
    arguments = parser.parse_args()
    sides = {name: value.split(":", 1) for name, value in (("before", arguments.before), ("after", arguments.after))}
    runs = {"before": [], "after": []}
    for round_number in range(arguments.rounds):
        for name in ("before", "after"):
            kvcheck, python_dir = sides[name]
            result = run_once(kvcheck, python_dir, arguments.extra)
            runs[name].append(result)
            print(f"round {round_number + 1} {name}: {result['wall_s']:.1f} s", file=sys.stderr, flush=True)
    medians = {name: statistics.median(r["wall_s"] for r in runs[name]) for name in runs}
    result = {
        "command": "kvcheck run --adapter <python_dir>/examples/activation_memory_adapter.py --report json --quiet "
                   + " ".join(arguments.extra),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg(), "python": platform.python_version()},
        "sides": {name: {"kvcheck": sides[name][0], "python_dir": sides[name][1]} for name in sides},
        "rounds": arguments.rounds,
        "runs": runs,
        "median_wall_s": medians,
        "ratio_after_over_before": round(medians["after"] / medians["before"], 3),
    }
    with open(arguments.out, "w") as file:
        json.dump(result, file, indent=1)
        file.write("\n")
    print(json.dumps({"median_wall_s": medians, "ratio": result["ratio_after_over_before"]}), flush=True)


if __name__ == "__main__":
    main()
