"""Issue 27's speed figures (BENCHMARKS.md, "Issue 27: the strict example and
the cost of going on past errors"):

  - the strict example store (python/examples/strict_memory_adapter.py),
    its model declared: the time to the first verdict of each historic bug
    (`kvcheck run --property P --failures 1`, wall time of the command, the
    adapter process's start included) and to a complete default run;
  - the whole-run time of `kvcheck run` on the bundled adapters, a kvcheck
    built before issue 27 against this one, side by side: round by round,
    the old run then the new one (the machine may be shared: interleaving
    puts both under the same load), each over the adapters both have (the
    reference, M1-M27 and the Python example of its own tree), with each
    binary's defaults (--failures 3 for the new one).

    python3 bench/python/strict_bench.py --old /path/to/old/tree --rounds 3 \\
        --out bench/results/strict.json

The old tree is a checkout of the commit before issue 27 with its kvcheck
built (build/default/bin/kvcheck); this tree's kvcheck is
build/default/bin/kvcheck. Every kvcheck runs in a scratch directory
(removed afterwards), its Python adapters under /usr/bin/python3.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
STRICT = os.path.join(REPO, "python", "examples", "strict_memory_adapter.py")
sys.path.insert(0, os.path.join(REPO, "python", "examples"))
sys.path.insert(1, os.path.join(REPO, "python"))

from activation_memory import BUG_PROPERTIES as BUGS  # noqa: E402
from kvrun import timed  # noqa: E402
COMMON_MUTANTS = [f"M{n}" for n in range(1, 28)]


def git_head(tree: str) -> str:
    return subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()


def verdicts(report) -> dict:
    found = {}
    for adapter in (report or {}).get("adapters", []):
        for prop in adapter["properties"]:
            found[prop["verdict"]] = found.get(prop["verdict"], 0) + 1
    return found


def strict_figures(binary: str, rounds: int, scratch: str) -> dict:
    first_verdicts = {}
    for bug, prop in BUGS.items():
        times, caught = [], 0
        for _ in range(rounds):
            seconds, status, report = timed(binary, ["run", "--adapter", f"{STRICT} --bug {bug}", "--property", prop,
                                                     "--failures", "1"], scratch)
            times.append(seconds)
            result = next(p for p in report["adapters"][0]["properties"] if p["id"] == prop)
            caught += status == 1 and result["verdict"] == "fail"
        first_verdicts[bug] = {"property": prop, "seconds": times, "median_s": statistics.median(times),
                               "caught": f"{caught}/{rounds}"}
    complete, passed = [], []
    for _ in range(rounds):
        seconds, status, report = timed(binary, ["run", "--adapter", STRICT], scratch)
        complete.append(seconds)
        passed.append(verdicts(report))
    return {"first_verdict": first_verdicts,
            "complete_run": {"seconds": complete, "median_s": statistics.median(complete), "verdicts": passed}}


def whole_run_args(tree: str):
    args = ["run"]
    for adapter in ["reference"] + COMMON_MUTANTS + [os.path.join(tree, "python", "examples", "activation_memory_adapter.py")]:
        args += ["--adapter", adapter]
    return args


def side_by_side(old_tree: str, rounds: int, scratch: str) -> dict:
    binaries = {"old": os.path.join(old_tree, "build", "default", "bin", "kvcheck"),
                "new": os.path.join(REPO, "build", "default", "bin", "kvcheck")}
    trees = {"old": old_tree, "new": REPO}
    runs = {"old": [], "new": []}
    for round_index in range(rounds):
        for which in ("old", "new"):
            load = os.getloadavg()[0]
            seconds, status, report = timed(binaries[which], whole_run_args(trees[which]), scratch)
            runs[which].append({"round": round_index + 1, "seconds": seconds, "exit": status,
                                "load_before": round(load, 2), "verdicts": verdicts(report)})
            print(f"round {round_index + 1} {which}: {seconds:.1f} s (exit {status}, load {load:.1f})", flush=True)
    medians = {which: statistics.median(r["seconds"] for r in runs[which]) for which in runs}
    ratios = [n["seconds"] / o["seconds"] for o, n in zip(runs["old"], runs["new"])]
    return {"adapters": "reference, M1-M27, the tree's python/examples/activation_memory_adapter.py",
            "old_commit": git_head(old_tree), "new_commit": git_head(REPO), "runs": runs,
            "median_s": medians, "ratio_of_medians": medians["new"] / medians["old"],
            "ratio_per_round": ratios, "median_ratio_per_round": statistics.median(ratios)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="the tree of the commit before issue 27, its kvcheck built")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True)
    arguments = parser.parse_args()
    os.environ.setdefault("KVCHECK_PYTHON", "/usr/bin/python3")
    scratch = tempfile.mkdtemp(prefix="kvcheck-strict-bench-")
    try:
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        load = os.getloadavg()
        whole = side_by_side(arguments.old, arguments.rounds, scratch)
        strict = strict_figures(os.path.join(REPO, "build", "default", "bin", "kvcheck"), arguments.rounds, scratch)
        result = {"started": started, "cpus": os.cpu_count(), "load_average_at_start": [round(x, 2) for x in load],
                  "shared_machine": True, "rounds": arguments.rounds, "whole_run": whole, "strict_example": strict}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    with open(arguments.out, "w") as file:
        json.dump(result, file, indent=2)
        file.write("\n")
    print(json.dumps({"whole_run_medians": whole["median_s"], "ratio": whole["ratio_of_medians"],
                      "strict_complete_median": strict["complete_run"]["median_s"],
                      "strict_first_verdicts": {b: f["median_s"] for b, f in strict["first_verdict"].items()}}, indent=2))


if __name__ == "__main__":
    main()
