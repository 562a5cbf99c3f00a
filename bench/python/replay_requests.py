"""Replays recorded protocol requests (record_requests.py) in process
against the example store, and prints the CPU time they took, by request
kind: the adapter's side of the process benchmark without pipes, kvcheck or
the load of other processes in the figures (CPU time), for comparing two
versions of the SDK request by request.

    /usr/bin/python3 bench/python/replay_requests.py /tmp/requests.jsonl [--runs 3] [--profile tottime]
    /usr/bin/python3 bench/python/replay_requests.py /tmp/requests-*.jsonl   # a file per adapter process

Several recordings (record_requests.py's "{pid}" files: a fork server's
and each of its copies') are replayed one after another, each on a fresh
Server, as each process answered its own; a recording that does not start
with the handshake (a fork copy's: its session was its server's) gets one
first, untimed.

Directories named by dump and load requests are made afresh under a
temporary directory and removed at the end. Replies are encoded as they
would be sent (JSON), and that is timed too. Each run replays every request
in a fresh process (the SDK's memos start empty, as in the adapter
process of a benchmark, which sees each request once). Dumps are written
under $TMPDIR: set TMPDIR=/dev/shm to leave the disk out, as the benchmark
command of BENCHMARKS.md does.

--replies FILE writes the last run's replies there, one JSON line each,
as they would be sent, except for what differs from process to process:
storage identities (addresses, id()s) are numbered in each reply in
order of first appearance (a reply's aliasing is what kvcheck reads from
them; addresses are reused differently from process to process), the
temporary directory is written <dir> and the source tree's root <repo>
(in tracebacks). Two versions of
the SDK answer the same requests alike iff these files are equal.

--switch-off observations|copy-tracker (repeatable) replays with a part of the SDK's
checking switched off (the facts in replies; the dispatch mode that counts
copies), to measure what that part costs. The replies are then not what
kvcheck needs: for measuring only.
"""

import argparse
import collections
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
_REPO = os.path.normpath(_ROOT)
sys.path.insert(0, os.path.join(_ROOT, "python"))
sys.path.insert(0, os.path.join(_ROOT, "python", "examples"))

import activation_memory_adapter  # noqa: E402
from kvcheck_adapter import adapter, decoder  # noqa: E402
from kvcheck_adapter.adapter import Server  # noqa: E402
from kvcheck_adapter.protocol import PROTOCOL_VERSION, _encode, error_reply  # noqa: E402


def _replay(requests, model, directory, profile, replies=None, seconds=None, renamed=None):
    """CPU seconds per request kind of one replay on a fresh Server (added
    to `seconds`); `replies`: a list the encoded replies are appended to."""
    server = Server(lambda: activation_memory_adapter.ActivationMemoryAdapter([], model))
    renamed = {} if renamed is None else renamed
    seconds = collections.defaultdict(float) if seconds is None else seconds
    if requests and requests[0].get("op") != "hello":
        server.handle({"op": "hello", "protocol": PROTOCOL_VERSION})
    for request in requests:
        if "dir" in request:
            path = renamed.setdefault(request["dir"], os.path.join(directory, str(len(renamed))))
            os.makedirs(path, exist_ok=True)
            request = dict(request, dir=path)
        start = time.process_time()
        if profile is not None:
            profile.enable()
        try:
            reply = server.handle(request)
        except Exception as error:  # noqa: BLE001 - as serve_loop does
            reply = error_reply(error)
        encoded = _encode(reply)
        if profile is not None:
            profile.disable()
        seconds[request["op"]] += time.process_time() - start
        if replies is not None:
            replies.append(encoded)
    return seconds


def _normalized(encoded: str, directory: str) -> str:
    """A reply with what differs between processes replaced (see the module
    doc): every integer of a "storage" list by its number in order of first
    appearance in the reply, the temporary directory by <dir>, the source
tree's root by <repo>."""
    identities: dict = {}

    def rename(value):
        if isinstance(value, dict):
            return {
                key: [identities.setdefault(i, len(identities)) for i in item] if key == "storage" else rename(item)
                for key, item in value.items()
            }
        if isinstance(value, list):
            return [rename(item) for item in value]
        if isinstance(value, str):
            return value.replace(directory, "<dir>").replace(_REPO, "<repo>")
        return value

    return json.dumps(rename(json.loads(encoded)), separators=(",", ":"))


def _switch_off(part: str) -> None:
    """Switches off one part of the SDK's checking in this process (see the
    module doc)."""
    if part == "observations":
        adapter.Server._observed = lambda self, handles, ids: {"handles": [], "entries": [], "stored_ids": []}
    elif part == "copy-tracker":
        adapter._Tracker = lambda: None  # as for an engine that logs its copies (take_copies)


def _requests_of(recordings):
    """Each recording's requests, a list per file."""
    per_file = []
    for recording in recordings:
        with open(recording, encoding="utf-8") as lines:
            per_file.append([json.loads(line) for line in lines if line.strip()])
    return per_file


def _one_run(recordings, profile_order, switch_off, replies_path=None) -> None:
    """One replay in this process; prints {op: CPU seconds} as JSON on the
    last line (and the profile before it)."""
    for part in switch_off or ():
        _switch_off(part)
    per_file = _requests_of(recordings)
    model = decoder.Decoder()
    gc.freeze()
    profile = None
    if profile_order:
        import cProfile

        profile = cProfile.Profile()
    directory = tempfile.mkdtemp(prefix="kvcheck-replay-")
    replies = None if replies_path is None else []
    try:
        seconds, renamed = collections.defaultdict(float), {}
        for requests in per_file:
            _replay(requests, model, directory, profile, replies, seconds, renamed)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if replies is not None:
        with open(replies_path, "w", encoding="utf-8") as out:
            for encoded in replies:
                out.write(_normalized(encoded, directory) + "\n")
    if profile is not None:
        import pstats

        pstats.Stats(profile, stream=sys.stderr).sort_stats(profile_order).print_stats(40)
    print(json.dumps(seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recording", nargs="+")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", choices=["tottime", "cumulative"], help="a cProfile listing of the last run (on stderr)")
    parser.add_argument("--switch-off", choices=["observations", "copy-tracker"], action="append", help="measure without this part (see above)")
    parser.add_argument("--replies", help="write the last run's replies to this file (see above)")
    parser.add_argument("--one-run", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.one_run:
        _one_run(arguments.recording, arguments.profile, arguments.switch_off, arguments.replies)
        return
    counts = collections.Counter(request["op"] for requests in _requests_of(arguments.recording) for request in requests)
    runs = []
    for run in range(arguments.runs):
        command = [sys.executable, "-W", "ignore", os.path.abspath(__file__), *arguments.recording, "--one-run"]
        for part in arguments.switch_off or ():
            command += ["--switch-off", part]
        if arguments.profile and run == arguments.runs - 1:
            command += ["--profile", arguments.profile]
        if arguments.replies and run == arguments.runs - 1:
            command += ["--replies", os.path.abspath(arguments.replies)]
        output = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True).stdout
        runs.append(collections.defaultdict(float, json.loads(output.splitlines()[-1])))
    totals = [sum(run.values()) for run in runs]
    median_total = statistics.median(totals)
    print(f"{sum(counts.values())} requests, {arguments.runs} runs (a process each): "
          f"CPU seconds {', '.join(f'{t:.3f}' for t in totals)}; median {median_total:.3f}")
    print(f"{'request':18s} {'count':>6s} {'µs each':>9s} {'share':>6s}   (medians of the runs)")
    for op in sorted(counts, key=lambda op: -statistics.median(run[op] for run in runs)):
        median = statistics.median(run[op] for run in runs)
        print(f"{op:18s} {counts[op]:6d} {median * 1e6 / counts[op]:9.0f} {100 * median / median_total:5.1f}%")


if __name__ == "__main__":
    main()
