"""CPU time the SDK spends building caches from content (wire.materialize,
what make_cache does for `add` and `make` requests) over every cache of
recorded requests (record_requests.py), in process: the part of the
Python example's run that make_cache costs, for comparing two versions of
the SDK side by side.

    /usr/bin/python3 bench/python/make_cost.py /tmp/requests-*.jsonl [--runs 5] [--sdk OTHER_TREE/python]

Each run starts with empty memos (as each adapter process does) and
materializes every cache of the recordings once, in order; prints the
median and the least CPU seconds of the runs."""

import argparse
import json
import os
import statistics
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recording", nargs="+")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sdk", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"),
                        help="the python directory whose kvcheck_adapter is measured (default: this tree's)")
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.sdk))
    from kvcheck_adapter import wire

    contents = []
    for path in args.recording:
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                request = json.loads(line)
                if "cache" in request:
                    contents.append(wire.content_from_json(request["cache"]))

    def run() -> float:
        wire._segment_memo.clear()
        wire._index_memo.clear()
        start = time.process_time()
        for content in contents:
            wire.materialize(content)
        return time.process_time() - start

    run()  # the imports' and allocator's first touches
    times = [run() for _ in range(args.runs)]
    print(f"{len(contents)} caches, {args.runs} runs: CPU seconds median {statistics.median(times):.3f}, least {min(times):.3f}"
          f" (SDK {os.path.abspath(args.sdk)})")


if __name__ == "__main__":
    main()
