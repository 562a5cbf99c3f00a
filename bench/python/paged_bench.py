"""Issue 31's speed figures (BENCHMARKS.md, "Paged block managers from
Python"): the example block manager (python/examples/block_manager_adapter.py)
through the adapter protocol, the time to the first verdict of each
historic bug (`kvcheck run --property P --failures 1 --seed S`, wall time
of the whole command, the adapter process's start included; the median of
three seeds) and the time of a complete run of the correct manager.

    python3 bench/python/paged_bench.py --out bench/results/paged_python.json

This tree's kvcheck is build/default/bin/kvcheck; the adapters run under
$KVCHECK_PYTHON (default /usr/bin/python3, Debian's torch 1.13, whose
adapter processes start warm; under .venv's torch 2 they start cold). Every kvcheck runs in
a scratch directory, removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MANAGER = os.path.join(REPO, "python", "examples", "block_manager_adapter.py")
BINARY = os.path.join(REPO, "build", "default", "bin", "kvcheck")
sys.path.insert(0, os.path.join(REPO, "python", "examples"))

from block_manager import BUG_PROPERTIES as BUGS  # noqa: E402
import kvrun  # noqa: E402

SEEDS = (1, 2, 3)


def timed(args, scratch: str):
    """Runs this tree's kvcheck with a JSON report; (wall seconds, exit status, report)."""
    return kvrun.timed(BINARY, args, scratch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", default="200", help="the complete run's cases per property")
    arguments = parser.parse_args()
    os.environ.setdefault("KVCHECK_PYTHON", "/usr/bin/python3")
    scratch = tempfile.mkdtemp(prefix="kvcheck-paged-bench-")
    try:
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        load = os.getloadavg()
        first = {}
        for bug, prop in BUGS.items():
            runs = []
            for seed in SEEDS:
                seconds, status, report = timed(["run", "--adapter", f"{MANAGER} --bug {bug}", "--property", prop,
                                                 "--failures", "1", "--seed", str(seed)], scratch)
                result = next(p for p in report["adapters"][0]["properties"] if p["id"] == prop)
                runs.append({"seed": seed, "seconds": round(seconds, 2), "exit": status, "verdict": result["verdict"],
                             "shrunk_steps": len((result.get("trace") or "").strip().splitlines()),
                             "traces": result.get("cases")})
                print(f"{bug} seed {seed}: {seconds:.2f} s, {result['verdict']}", flush=True)
            first[bug] = {"property": prop, "runs": runs,
                          "median_s": statistics.median(r["seconds"] for r in runs),
                          "caught": f"{sum(r['verdict'] == 'fail' for r in runs)}/{len(runs)}"}
        seconds, status, report = timed(["run", "--adapter", MANAGER, "--cases", arguments.cases, "--jobs", "2"], scratch)
        verdicts = {p["id"]: p["verdict"] for p in report["adapters"][0]["properties"]}
        complete = {"cases": int(arguments.cases), "seconds": round(seconds, 2), "exit": status, "verdicts": verdicts}
        result = {"started": started, "cpus": os.cpu_count(), "load_average_at_start": [round(x, 2) for x in load],
                  "shared_machine": True, "python": os.environ["KVCHECK_PYTHON"], "seeds": list(SEEDS),
                  "first_verdict": first, "complete_run": complete}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    with open(arguments.out, "w") as file:
        json.dump(result, file, indent=2)
        file.write("\n")
    print(json.dumps({b: f["median_s"] for b, f in first.items()}, indent=2))
    print(f"complete run: {complete['seconds']} s, exit {complete['exit']}")


if __name__ == "__main__":
    main()
