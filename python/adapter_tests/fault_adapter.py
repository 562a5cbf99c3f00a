"""An adapter that breaks on purpose, for kvcheck's fault tests.

Written from docs/protocol.md alone, with the standard library only (no
torch, no SDK): it also shows that the protocol document is enough to write
an adapter from. It answers the handshake and `reset` (a request of its
own, or a member of the next request), then does its fault on the first
other request:

    --fault crash      kill itself with SIGSEGV
    --fault exit       exit with status 3
    --fault hang       never answer
    --fault memory     allocate memory until killed (up to 3 GiB, then hang)
    --fault garbage    write text that is not a frame on the reply pipe
    --fault close-reply  close the reply pipe and go on running (never exit)
    --fault memory-error  answer with the error reply of a refused allocation
                       (MemoryError, as the SDK words it: what Python raises
                       when the address-space limit refuses memory)
    --fault not-json   answer with a frame that is not JSON
    --fault no-ok      answer with a JSON object without "ok"
    --fault version    answer the handshake with protocol version 99
    --fault refuse     refuse the handshake (an engine that cannot start)
    --fault reset      fail every reset (an engine that cannot be made again);
                       answer every other request as --fault none
    --fault escape     start a process that leaves it (a double fork and
                       setsid), holds --escape-mb MiB resident and writes
                       its pid to --pid-file; then answer as --fault none
    --fault flood      write 20 MiB to stdout, wait (up to 60 s) until its
                       output file is cut, then answer with an error saying so
    --fault none       answer every request with an error (a well-behaved
                       adapter of an engine that rejects everything);
                       --error-bytes N makes each error N bytes longer

--escape-at-hello does what --fault escape does (a double fork and setsid,
--escape-mb, --pid-file) while it answers the handshake, once (not when
the pid file exists): the process kvcheck starts for the handshake, before
any job, leaves a process behind (with --warm, the fork server does, as it
answers the handshake).
--bidi-name names it "fault-<U+202E>KIND" in the handshake (a right-to-left
override, which a terminal would obey if kvcheck's table printed it raw).
--pid-file PATH writes the process id there first; --noise N prints N lines
on stdout and stderr before the fault (kvcheck shows their tail), and
--escapes ends each with what a terminal must never get raw from an engine
(a NUL, a clear-screen escape, an OSC sequence that sets the window
title). --warm
makes it a fork server when kvcheck offers a fork socket (section 10 of
the protocol, through the SDK's stdlib-only protocol module): the faults
then happen in warm copies, which are the server's children, not
kvcheck's. --thread runs a second thread first (a fork server then
declines).
"""

import argparse
import json
import os
import signal
import sys
import time


def read_exactly(fd, count):
    data = b""
    while len(data) < count:
        chunk = os.read(fd, count - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def send(fd, message):
    payload = json.dumps(message).encode("utf-8")
    os.write(fd, len(payload).to_bytes(4, "big") + payload)


def fault(kind, reply_fd):
    if kind == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif kind == "exit":
        os._exit(3)
    elif kind == "hang":
        while True:
            time.sleep(3600)
    elif kind == "memory":
        held = []
        for _ in range(96):  # 3 GiB in 32 MiB pieces, each written so that it is resident
            held.append(b"\x01" * (32 << 20))
            time.sleep(0.02)
        while True:
            time.sleep(3600)
    elif kind == "garbage":
        os.write(reply_fd, b"Hello from the adapter: this is not a protocol frame\n")
        while True:
            time.sleep(3600)
    elif kind == "close-reply":
        os.close(reply_fd)
        while True:
            time.sleep(3600)
    elif kind == "memory-error":
        try:
            bytearray(1 << 46)  # 64 TiB: refused under any address-space limit kvcheck sets
            send(reply_fd, {"ok": False, "error": "RuntimeError: 64 TiB were granted: no address-space limit?"})
        except MemoryError as error:
            send(reply_fd, {"ok": False, "error": f"MemoryError: {error}", "traceback": "Traceback: bytearray(1 << 46)"})
    elif kind == "flood":
        written = 20 << 20
        sys.stdout.flush()
        os.write(1, b"flood\n" * (written // 6))
        waited = 0
        while os.fstat(1).st_size >= written // 2 and waited < 60:
            time.sleep(0.05)
            waited += 0.05
        size = os.fstat(1).st_size
        send(reply_fd, {"ok": False, "error": f"RuntimeError: after writing {written} bytes, my output file holds {size}"})
    elif kind == "not-json":
        os.write(reply_fd, (9).to_bytes(4, "big") + b"not json!")
    elif kind == "no-ok":
        send(reply_fd, {"tokens": []})


def escape(pid_file, megabytes):
    """A grandchild in a session of its own whose parent has exited: to
    anything that follows parents or process groups, it is gone."""
    ready_read, ready_write = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.setsid()
        if os.fork() == 0:
            with open(pid_file, "w") as out:
                out.write(str(os.getpid()))
            held = bytearray(megabytes << 20)
            held[::4096] = b"\x01" * len(held[::4096])  # every page written: resident
            os.write(ready_write, b"x")
            time.sleep(120)  # should nothing kill it
            os._exit(0)
        os._exit(0)
    os.close(ready_write)
    os.read(ready_read, 1)
    os.waitpid(middle, 0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", required=True)
    parser.add_argument("--pid-file")
    parser.add_argument("--bidi-name", action="store_true")
    parser.add_argument("--escape-at-hello", action="store_true")
    parser.add_argument("--error-bytes", type=int, default=0, help="--fault none: add this many bytes to each error")
    parser.add_argument("--escape-mb", type=int, default=0)
    parser.add_argument("--noise", type=int, default=0)
    parser.add_argument("--escapes", action="store_true")
    parser.add_argument("--warm", action="store_true")
    parser.add_argument("--thread", action="store_true", help="run a second thread (no fork server then)")
    args = parser.parse_args()
    if args.thread:
        import threading

        threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
    request_fd = int(os.environ["KVCHECK_REQUEST_FD"])
    reply_fd = int(os.environ["KVCHECK_REPLY_FD"])
    if args.warm and "KVCHECK_FORK_FD" in os.environ:
        from kvcheck_adapter import protocol

        def hello(request):
            if args.escape_at_hello and not os.path.exists(args.pid_file):
                escape(args.pid_file, args.escape_mb)  # from the fork server itself
            return {"ok": True, "protocol": protocol.PROTOCOL_VERSION, "name": f"fault-{args.fault}"}

        copy = protocol.serve_forks(protocol.Connection.from_environment(), int(os.environ["KVCHECK_FORK_FD"]), hello)
        if copy is None:
            return  # the server, shut down
        request_fd, reply_fd = copy._requests.fileno(), copy._reply_fd
    if args.pid_file and args.fault != "escape" and not args.escape_at_hello:
        with open(args.pid_file, "w") as out:
            out.write(str(os.getpid()))
    while True:
        header = read_exactly(request_fd, 4)
        if header is None:
            return
        request = json.loads(read_exactly(request_fd, int.from_bytes(header, "big")))
        op = request["op"]
        if op == "hello" and args.fault == "refuse":
            send(reply_fd, {"ok": False, "error": "RuntimeError: cannot open the store", "traceback": "Traceback: here"})
        elif op == "hello":
            if args.escape_at_hello and not os.path.exists(args.pid_file):
                escape(args.pid_file, args.escape_mb)
            version = 99 if args.fault == "version" else request.get("protocol")  # the version kvcheck speaks
            send(reply_fd, {"ok": True, "protocol": version, "name": ("fault-\u202e" if args.bidi_name else "fault-") + args.fault})
        elif args.fault == "reset" and (op == "reset" or request.get("reset") is True):
            send(reply_fd, {"ok": False, "error": "RuntimeError: the store is locked", "reset_failed": True})
        elif op in ("reset", "shutdown"):
            send(reply_fd, {"ok": True})
            if op == "shutdown":
                return
        elif args.fault in ("none", "reset", "escape"):
            if args.fault == "escape" and args.pid_file and not os.path.exists(args.pid_file):
                escape(args.pid_file, args.escape_mb)
            send(reply_fd, {"ok": False, "error": f"RuntimeError: {op} is not supported" + "x" * args.error_bytes,
                            "traceback": ""})
        else:
            hostile = "\x00\x1b[2J\x1b]0;pwned\x07" if args.escapes else ""
            for i in range(args.noise):
                print(f"noise line {i} on stdout{hostile}")
                print(f"noise line {i} on stderr{hostile}", file=sys.stderr)
            sys.stdout.flush()
            fault(args.fault, reply_fd)


if __name__ == "__main__":
    main()
