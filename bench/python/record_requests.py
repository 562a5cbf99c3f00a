"""Runs a kvcheck adapter script with every request it receives appended
to a file, one JSON object per line: the input of replay_requests.py.

Used as the interpreter kvcheck starts (a KVCHECK_PYTHON wrapper calls
it), e.g. for the process benchmark:

    KVCHECK_PYTHON=bench/python/record-python KVCHECK_RECORD=/tmp/requests.jsonl \\
        build/bench/bench/kv_bench_process --benchmark_filter=boundary/python_vs_reference/

usage: record_requests.py ADAPTER_SCRIPT [ARGUMENTS...]
($KVCHECK_RECORD names the file; requests are appended. A "{pid}" in it is
replaced by the id of the process that received the request: the fork
server's copies then write a file each, which replay_requests.py replays
each on a fresh Server, as the copies ran.)
"""

import json
import os
import runpy
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

from kvcheck_adapter import protocol  # noqa: E402


def main() -> None:
    if len(sys.argv) < 2 or "KVCHECK_RECORD" not in os.environ:
        sys.exit(__doc__)
    pattern = os.environ["KVCHECK_RECORD"]
    records = {}  # by process: a fork copy opens its own file
    receive = protocol.Connection.receive

    def recording_receive(connection):
        request = receive(connection)
        if request is not None:
            pid = os.getpid()
            record = records.get(pid)
            if record is None:
                record = records[pid] = open(pattern.replace("{pid}", str(pid)), "a", encoding="utf-8")
            record.write(json.dumps(request, separators=(",", ":")) + "\n")
            record.flush()
        return request

    protocol.Connection.receive = recording_receive
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
