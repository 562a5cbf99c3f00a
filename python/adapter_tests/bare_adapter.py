"""The example store's adapter, optionally without the facts replies may
carry, and optionally logging the requests it receives: kvcheck must check
an adapter that reports nothing beyond what each request asks for (one in
another language may not) exactly as one that reports everything, by
asking for what it needs.

    bare_adapter.py [--bare] [--log PATH] [--bug NAME ...]

--bare: no reply carries `observed` (no facts of what an operation named,
no listing), and no fact carries `metadata`; the hints of what kvcheck reads
after an operation ("read_store", "read_ids") are ignored.
--log PATH: appends each request's op to PATH, one a line ("reset" for a
request carrying a reset, before its own op).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import activation_memory  # noqa: E402
import activation_memory_adapter  # noqa: E402
from kvcheck_adapter import decoder as models  # noqa: E402
from kvcheck_adapter import protocol  # noqa: E402
from kvcheck_adapter.adapter import Server  # noqa: E402


class OneAtATime(activation_memory_adapter.ActivationMemoryAdapter):
    """The example, served by the loop below one request at a time: not
    thread_safe (kvcheck then sends no request ids)."""

    thread_safe = False


def strip_facts(op, reply):
    """The reply without anything its request did not ask for."""
    reply.pop("observed", None)
    if op == "handle_facts":
        reply.pop("metadata", None)
    if op == "read_entries":
        for facts in reply.get("entries", ()):
            facts.pop("metadata", None)
    return reply


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bare", action="store_true")
    parser.add_argument("--log")
    parser.add_argument("--bug", action="append", default=[], choices=activation_memory.BUGS)
    args = parser.parse_args()
    model = models.Decoder()
    server = Server(lambda: OneAtATime(args.bug, model))
    log = open(args.log, "a") if args.log else None

    def handle(request):
        if log is not None:
            log.write(("reset\n" if request.get("reset") is True else "") + f"{request.get('op')}\n")
            log.flush()
        if args.bare:
            request = {k: v for k, v in request.items() if k not in ("read_store", "read_ids")}
        reply = server.handle(request)
        return strip_facts(request.get("op"), reply) if args.bare and reply.get("ok") else reply

    protocol.serve_loop(protocol.Connection.from_environment(), handle)


if __name__ == "__main__":
    main()
