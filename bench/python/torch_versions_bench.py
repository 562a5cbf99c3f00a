"""What the Python adapter side costs under each interpreter (Debian's
torch 1.13, .venv's torch 2.x), for two source trees of the SDK (before
and after a change), in CPU time, rounds interleaved; medians on stdout
and in --out (JSON).

    TMPDIR=/dev/shm /usr/bin/python3 bench/python/torch_versions_bench.py \\
        --before /tmp/old-tree --recording /tmp/requests.jsonl \\
        --kvcheck build/default/bin/kvcheck --rounds 3 --out bench/results/sdk_torch.json

Per round, for each interpreter: `import torch` and the example adapter's
imports (a process each); then for each tree: the replay of the recorded
requests (replay_requests.py --one-run: one process, CPU seconds per
request kind) and, with --kvcheck, `kvcheck run --adapter <tree>/python/
examples/activation_memory_adapter.py --cases N --jobs 1` (CPU of kvcheck
and every adapter process it started, and wall seconds).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_TREE = os.path.normpath(os.path.join(_HERE, "..", ".."))
PYTHONS = {"torch1": "/usr/bin/python3", "torch2": os.path.join(_TREE, ".venv", "bin", "python")}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(command, env=None, cwd=None):
    """(CPU seconds of the command and its descendants, wall seconds, stdout)."""
    before, start = _children_cpu(), time.monotonic()
    out = subprocess.run(command, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         env=env, cwd=cwd).stdout
    return _children_cpu() - before, time.monotonic() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the source tree of the SDK before the change")
    parser.add_argument("--after", default=_TREE, help="the tree after it (default: this one)")
    parser.add_argument("--recording", required=True, help="requests recorded with record-python")
    parser.add_argument("--kvcheck", help="a kvcheck binary: also time kvcheck run of the example")
    parser.add_argument("--cases", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out")
    arguments = parser.parse_args()
    trees = {"before": os.path.abspath(arguments.before), "after": os.path.abspath(arguments.after)}
    samples = {}

    def add(key, value):
        samples.setdefault(key, []).append(value)

    env = dict(os.environ, TMPDIR=os.environ.get("TMPDIR", "/dev/shm"))
    for round_ in range(arguments.rounds):
        for torch_name, python in PYTHONS.items():
            add(f"{torch_name}/import torch cpu", _timed([python, "-c", "import torch"])[0])
            sdk = (f"import sys; sys.path[:0] = ['{trees['after']}/python', '{trees['after']}/python/examples']; "
                   "import activation_memory_adapter")
            add(f"{torch_name}/import example adapter cpu", _timed([python, "-c", sdk])[0])
            for tree_name, tree in trees.items():
                replay = [python, "-W", "ignore", os.path.join(tree, "bench", "python", "replay_requests.py"),
                          arguments.recording, "--one-run"]
                cpu, _, out = _timed(replay, env=env)
                kinds = json.loads(out.splitlines()[-1])
                add(f"{torch_name}/{tree_name}/replay cpu", sum(kinds.values()))
                for kind, seconds in kinds.items():
                    add(f"{torch_name}/{tree_name}/replay/{kind}", seconds)
                if arguments.kvcheck:
                    run = [arguments.kvcheck, "run", "--adapter",
                           os.path.join(tree, "python", "examples", "activation_memory_adapter.py"),
                           "--cases", str(arguments.cases), "--jobs", "1"]
                    cpu, wall, _ = _timed(run, env=dict(env, KVCHECK_PYTHON=python))
                    add(f"{torch_name}/{tree_name}/kvcheck run cpu", cpu)
                    add(f"{torch_name}/{tree_name}/kvcheck run wall", wall)
            print(f"round {round_ + 1} {torch_name} done", file=sys.stderr, flush=True)
        _write(arguments, samples)


def _write(arguments, samples) -> None:
    """Prints the medians so far and writes them to --out (after each round)."""
    medians = {key: statistics.median(values) for key, values in samples.items()}
    for key in sorted(medians):
        if "/replay/" not in key:
            print(f"{key:45s} {medians[key]:8.3f}  ({', '.join(f'{v:.3f}' for v in samples[key])})")
    if arguments.out:
        with open(arguments.out, "w", encoding="utf-8") as out:
            json.dump({"command": " ".join(sys.argv), "load": os.getloadavg(), "rounds": len(next(iter(samples.values()))),
                       "cases": arguments.cases, "medians": medians, "samples": samples}, out, indent=1, sort_keys=True)
            out.write("\n")


if __name__ == "__main__":
    main()
