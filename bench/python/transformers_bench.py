"""kvcheck over real transformers, per installed version, in one sitting:

  - checked operations per second of `kvcheck run` on the real-transformers
    example store (python/examples/transformers_memory_adapter.py, its model
    domain declared), beside the SDK's own example store
    (activation_memory_adapter.py) run by the same kvcheck and the same
    interpreter right before it, version by version (so each pair shares
    the machine's state);
  - time to the first verdict for each historic bug: `kvcheck run` of the
    property that bug breaks, stopping at its first failure (--failures 1),
    wall time of the whole command (adapter start included), median over
    the seeds.

    .venv/bin/python bench/python/transformers_bench.py \\
        --kvcheck build/default/bin/kvcheck --out bench/results/transformers.json

Prints a Markdown table per measure (BENCHMARKS.md takes them as they are)
and writes the figures as JSON. Every number comes from a run made here;
nothing is assumed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
EXAMPLES = os.path.join(REPO, "python", "examples")
REAL = os.path.join(EXAMPLES, "transformers_memory_adapter.py")
SDK = os.path.join(EXAMPLES, "activation_memory_adapter.py")
VERSIONS_DIR = os.path.join(REPO, ".venv", "transformers")

# The property that names each bug of the real-transformers example, as
# python/transformers_tests/test_end_to_end.py names them (shallow_clone:
# stored-immutable, since the owned marker is derived from what the store
# holds, and a shallow get_cache copy shares its entry's storage first).
BUG_PROPERTY = {
    "stored_to_generation": "stored-immutable",
    "single_id_returns_stored": "stored-immutable",
    "merge_uninitialized": "merge-correct",
    "shallow_clone": "stored-immutable",
    "double_copy": "single-copy",
}

CLOSING = re.compile(r"kvcheck run: (\d+) distinct traces run.*?, (\d+) operations checked, in ([0-9.]+) s")


def environment(version: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(VERSIONS_DIR, version)
    env["KVCHECK_PYTHON"] = sys.executable
    env.pop("KVCHECK_EXAMPLE_BUGS", None)
    return env


def model_text(env: dict) -> str:
    done = subprocess.run([sys.executable, REAL, "--print-model"], env=env, stdout=subprocess.PIPE, check=True, text=True)
    return done.stdout.strip()


def kvcheck_run(kvcheck: str, env: dict, adapter: str, *extra: str) -> dict:
    """One `kvcheck run`: its wall time, exit status, the closing line's
    counts and the JSON report."""
    with tempfile.TemporaryDirectory(prefix="kvcheck-bench-") as scratch:
        report = os.path.join(scratch, "report.json")
        command = [kvcheck, "run", "--adapter", adapter, "--report", "json", "--out", report, "--quiet",
                   "--trace-dir", os.path.join(scratch, "traces"), *extra]
        start = time.monotonic()
        done = subprocess.run(command, env=env, cwd=scratch, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wall = time.monotonic() - start
        with open(report) as file:
            parsed = json.load(file)
    found = CLOSING.search(done.stderr)
    if found is None:
        raise RuntimeError(f"no closing line from {' '.join(command)}:\n{done.stderr}")
    return {"status": done.returncode, "wall_s": wall, "traces": int(found.group(1)),
            "operations": int(found.group(2)), "run_s": float(found.group(3)), "report": parsed}


def verdicts(run: dict) -> dict:
    return {p["id"]: p["verdict"] for p in run["report"]["adapters"][0]["properties"]}


def throughput(kvcheck: str, version: str, cases: int) -> dict:
    env = environment(version)
    model = model_text(env)
    sdk = kvcheck_run(kvcheck, env, SDK, "--cases", str(cases))
    real = kvcheck_run(kvcheck, env, REAL, "--model", model, "--cases", str(cases))
    row = {}
    for name, run in (("sdk_example", sdk), ("transformers_example", real)):
        row[name] = {"operations": run["operations"], "run_s": run["run_s"],
                     "ops_per_s": run["operations"] / run["run_s"], "status": run["status"], "verdicts": verdicts(run)}
    return row


def time_to_verdict(kvcheck: str, version: str, bug: str, seeds: list) -> dict:
    env = environment(version)
    model = model_text(env)
    walls, caught = [], 0
    for seed in seeds:
        run = kvcheck_run(kvcheck, env, f"{REAL} --bug {bug}", "--model", model, "--property", BUG_PROPERTY[bug],
                          "--seed", str(seed), "--failures", "1")
        walls.append(run["wall_s"])
        caught += verdicts(run).get(BUG_PROPERTY[bug]) == "fail"
    return {"property": BUG_PROPERTY[bug], "median_s": statistics.median(walls), "max_s": max(walls),
            "caught": caught, "seeds": len(seeds)}


def unavailable(version: str) -> dict:
    """The bugs that cannot occur on this version, with the reason."""
    code = "import json, transformers_memory; print(json.dumps(transformers_memory.unavailable_bugs()))"
    env = environment(version)
    env["PYTHONPATH"] += os.pathsep + EXAMPLES + os.pathsep + os.path.join(REPO, "python")
    done = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, check=True, text=True)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kvcheck", default=os.path.join(REPO, "build", "default", "bin", "kvcheck"))
    parser.add_argument("--versions", nargs="*", help="transformers versions (default: every one in .venv/transformers)")
    parser.add_argument("--cases", type=int, default=200, help="traces per property of the throughput runs")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per bug for the time to verdict")
    parser.add_argument("--out", help="write the figures as JSON here")
    arguments = parser.parse_args()
    versions = arguments.versions or sorted(os.listdir(VERSIONS_DIR), key=lambda v: tuple(int(p) for p in v.split(".")))
    seeds = list(range(1, arguments.seeds + 1))
    results = {"cases": arguments.cases, "seeds": seeds, "python": sys.executable, "versions": {}}
    for version in versions:
        skipped = unavailable(version)
        bugs = {bug: time_to_verdict(arguments.kvcheck, version, bug, seeds)
                for bug in BUG_PROPERTY if bug not in skipped}
        results["versions"][version] = {"throughput": throughput(arguments.kvcheck, version, arguments.cases),
                                        "time_to_verdict": bugs, "unavailable": skipped}
        print(f"done: transformers {version}", file=sys.stderr)

    print("| transformers | SDK example ops/s | real-transformers example ops/s | ratio | verdicts (real) |")
    print("|---|---|---|---|---|")
    for version, row in results["versions"].items():
        sdk, real = row["throughput"]["sdk_example"], row["throughput"]["transformers_example"]
        passed = sum(v == "pass" for v in real["verdicts"].values())
        print(f"| {version} | {sdk['ops_per_s']:,.0f} | {real['ops_per_s']:,.0f} | {real['ops_per_s'] / sdk['ops_per_s']:.2f} "
              f"| {passed} of {len(real['verdicts'])} pass |")
    print()
    print("| transformers | bug | property | median s | worst s | caught |")
    print("|---|---|---|---|---|---|")
    for version, row in results["versions"].items():
        for bug, found in row["time_to_verdict"].items():
            print(f"| {version} | {bug} | {found['property']} | {found['median_s']:.2f} | {found['max_s']:.2f} "
                  f"| {found['caught']}/{found['seeds']} |")
        for bug, reason in row["unavailable"].items():
            print(f"| {version} | {bug} | - | - | - | cannot occur: {reason} |")
    if arguments.out:
        with open(arguments.out, "w") as file:
            json.dump(results, file, indent=1)
            file.write("\n")


if __name__ == "__main__":
    main()
