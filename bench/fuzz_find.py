#!/usr/bin/env python3
"""Time to find a bug, the fuzzer path: fuzz_ops (fuzz/) on each mutant from
an empty corpus, as the fuzz CI's canaries run it (-len_control=0
-max_len=256 -entropic=0), with seeds 1..10, until it aborts on a violation (the target
shrinks the trace before it aborts). Per run: the time to the violation and
the shrink's, as the target reports them (its clock starts at its first
input), libFuzzer's executions to the failure, the shrunk trace's length,
and the process's wall time less the target's start-up (loading libtorch,
measured alone).

    python3 bench/fuzz_find.py [--out bench/results/fuzz_find.json] [--seeds 10]

Builds fuzz_ops without sanitizers (the fuzz-fast preset's settings) in
build/bench-fuzz when it is not there. Before the mutants, measures the
exec/s of fuzz_ops on the reference (from the repository corpus, the
flags of scripts/fuzz-overnight) in that build and in the fuzz-search preset's
(ASan + UBSan, coverage-instrumented, build/fuzz-search, built when missing). Dumps go to /dev/shm, as the target
does by default.
"""

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

BUILD = "build/bench-fuzz"
SANITIZED_BUILD = "build/fuzz-search"  # the fuzz-search preset's: ASan + UBSan, coverage-instrumented
SPEED_SECONDS = 20
MUTANTS = [f"M{i}" for i in range(1, 13)]
RUNS_MAX = 200000
SECONDS_MAX = 60


def scratch_base():
    """Scratch directories (the corpus libFuzzer writes new inputs to, the
    artifacts) go to /dev/shm when there is one: on this machine's ext4,
    creating a file costs about a millisecond (perf: a sixth of a run's time
    in ext4_create), which would measure the disk, not the fuzzer."""
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def build_sanitized():
    if not os.path.exists(os.path.join(SANITIZED_BUILD, "build.ninja")):
        subprocess.run(["cmake", "--preset", "fuzz-search"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", SANITIZED_BUILD, "--target", "fuzz_ops"], check=True, stdout=subprocess.DEVNULL)
    return os.path.join(SANITIZED_BUILD, "fuzz", "fuzz_ops")


def speed(target, seconds):
    """exec/s of fuzz_ops on the reference from a copy of the repository's
    corpus, with the flags scripts/fuzz-overnight gives it."""
    with tempfile.TemporaryDirectory(prefix="kvcheck-fuzz-speed-", dir=scratch_base()) as scratch:
        corpus = os.path.join(scratch, "corpus")
        subprocess.run(["cp", "-r", "corpus/ops", corpus], check=True)
        env = dict(os.environ, KVCHECK_ADAPTER="reference", KVCHECK_ARTIFACT_DIR=scratch,
                   ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "detect_leaks=0"))
        command = [target, "-seed=1", f"-max_total_time={seconds}", "-max_len=1024", "-entropic=0",
                   "-dict=corpus/ops.dict", "-print_final_stats=1", f"-artifact_prefix={scratch}/", corpus]
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        log = done.stdout + done.stderr
        execs = re.search(r"^stat::number_of_executed_units: *(\d+)", log, re.M)
        rate = re.search(r"^stat::average_exec_per_sec: *(\d+)", log, re.M)
        if done.returncode != 0 or not execs or not rate:
            print(log[-2000:], file=sys.stderr)
            sys.exit(f"fuzz_find: the speed run of {target} failed (exit {done.returncode})")
        return {"execs": int(execs.group(1)), "exec_per_s": int(rate.group(1)), "seconds": seconds,
                "command": "KVCHECK_ADAPTER=reference " + " ".join(command[:-2]) + " <copy of corpus/ops>"}


def build():
    if not os.path.exists(os.path.join(BUILD, "build.ninja")):
        subprocess.run(["cmake", "-S", ".", "-B", BUILD, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                        "-DCMAKE_CXX_COMPILER=clang++-14", "-DKVCHECK_FUZZ=ON", "-DKVCHECK_TESTS=OFF",
                        "-DKVCHECK_SANITIZE=OFF", "-DCMAKE_CXX_FLAGS=-fsanitize=fuzzer-no-link",
                        "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -gline-tables-only"],
                       check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", BUILD, "--target", "fuzz_ops"], check=True, stdout=subprocess.DEVNULL)
    return os.path.join(BUILD, "fuzz", "fuzz_ops")


def run(target, mutant, seed, runs):
    with tempfile.TemporaryDirectory(prefix="kvcheck-fuzz-find-", dir=scratch_base()) as scratch:
        corpus = os.path.join(scratch, "corpus")
        os.mkdir(corpus)
        env = dict(os.environ, KVCHECK_ADAPTER=mutant, KVCHECK_ARTIFACT_DIR=scratch)
        command = [target, f"-runs={runs}", f"-seed={seed}", "-len_control=0", "-max_len=256",
                   "-entropic=0", f"-max_total_time={SECONDS_MAX}", "-print_final_stats=1", f"-artifact_prefix={scratch}/", corpus]
        start = time.monotonic()
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        seconds = time.monotonic() - start
        log = done.stdout + done.stderr
        found = re.search(r"^ERROR: ([a-z-]+): ", log, re.M)
        execs = re.search(r"^stat::number_of_executed_units: *(\d+)", log, re.M)
        if execs is None:
            counts = re.findall(r"^#(\d+)", log, re.M)
            execs = int(counts[-1]) if counts else None
        else:
            execs = int(execs.group(1))
        # The target's own clock: from its first input to the violation, then
        # the shrink (start-up, libFuzzer's crash handler and exit excluded).
        timed = re.search(r"^INFO: kvcheck: found after ([0-9.e+-]+) s and (\d+) inputs .*shrunk in ([0-9.e+-]+) s", log, re.M)
        traces = glob.glob(os.path.join(scratch, "crash-*.trace"))
        shrunk_ops = None
        if traces:
            with open(traces[0]) as f:
                shrunk_ops = sum(1 for line in f if line.strip() and not line.startswith("#"))
        return {"seconds": seconds, "failed": done.returncode != 0 and found is not None,
                "find_seconds": float(timed.group(1)) if timed else None,
                "shrink_seconds": float(timed.group(3)) if timed else None,
                "property": found.group(1) if found else None, "execs": execs, "shrunk_ops": shrunk_ops,
                "command": f"KVCHECK_ADAPTER={mutant} " + " ".join(command[:-2])}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results/fuzz_find.json")
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    target = build()
    sanitized = build_sanitized()
    speeds = {"no_sanitizers": speed(target, SPEED_SECONDS), "asan_ubsan": speed(sanitized, SPEED_SECONDS)}
    print(f"fuzz_find: fuzz_ops exec/s on the reference: {speeds['no_sanitizers']['exec_per_s']} without sanitizers, "
          f"{speeds['asan_ubsan']['exec_per_s']} with ASan + UBSan", flush=True)
    startup = statistics.median(run(target, "reference", 1, 1)["seconds"] for _ in range(3))
    results = []
    for mutant in MUTANTS:
        entry = {"mutant": mutant, "seeds": args.seeds, "missed": 0, "seconds": [], "execs": [], "shrunk_ops": [],
                 "properties": [], "find_seconds": [], "shrink_seconds": [], "process_seconds": []}
        for seed in range(1, args.seeds + 1):
            r = run(target, mutant, seed, RUNS_MAX)
            if not r["failed"]:
                entry["missed"] += 1
                continue
            entry["process_seconds"].append(max(0.0, r["seconds"] - startup))
            if r["find_seconds"] is None:
                sys.exit(f"fuzz_find: {mutant} seed {seed}: the target did not report its find and shrink times")
            entry["find_seconds"].append(r["find_seconds"])
            entry["shrink_seconds"].append(r["shrink_seconds"])
            entry["seconds"].append(r["find_seconds"] + r["shrink_seconds"])
            entry["execs"].append(r["execs"] or 0)
            if r["shrunk_ops"] is not None:
                entry["shrunk_ops"].append(r["shrunk_ops"])
            entry["properties"].append(r["property"])
        if not entry["seconds"]:
            entry["seconds"], entry["execs"] = [float("nan")], [0]
        print(f"fuzz_find: {mutant}: median {statistics.median(entry['seconds']):.3f} s, "
              f"{statistics.median(entry['execs']):.0f} execs, missed {entry['missed']}/{args.seeds}", flush=True)
        results.append(entry)
    description = (f"fuzz_ops without sanitizers on each mutant from an empty corpus, seeds 1..{args.seeds}, "
                   f"-len_control=0 -max_len=256 -entropic=0, at most {RUNS_MAX} runs or {SECONDS_MAX} s; verdict = find + shrink "
                   f"as the target times them (from its first input to the violation, then the shrink: the INFO line of "
                   f"its failure report; it includes the first use of every code path: libtorch's lazy set-up, about 0.1 s); the "
                   f"JSON also keeps the process's wall time less its start-up ({startup:.2f} s, loading libtorch, measured "
                   f"alone: under load that difference swings by more than a verdict); corpus, artifacts and dumps on "
                   f"{scratch_base() or 'the temporary directory'}.")
    with open(args.out, "w") as f:
        json.dump({"description": description, "startup_seconds": startup, "mutants": results, "speed": speeds},
                  f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
