"""The adapter protocol's transport (docs/protocol.md), in plain Python.

kvcheck starts an adapter as a child process and talks to it over two pipes
of its own: requests arrive on the descriptor named by $KVCHECK_REQUEST_FD,
replies leave on $KVCHECK_REPLY_FD. Each message is a frame: four bytes of
length (big-endian), then that many bytes of UTF-8 JSON, one object. The
process's stdout and stderr are not part of the protocol: kvcheck captures
them and shows their tail with a failure, so `print()` is harmless.

This module needs nothing but the standard library (no torch): the
protocol loop of an adapter written without the SDK's base class, and the
fault-injection adapters of kvcheck's own tests, run on it.

    connection = Connection.from_environment()
    while (request := connection.receive()) is not None:
        connection.send({"ok": True})
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import struct
import sys
import traceback
import warnings
from typing import Any, Callable, Dict, Optional

PROTOCOL_VERSION = 4
# A frame longer than this is not a protocol message.
FRAME_BYTES_MAX = 64 << 20

_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, check_circular=False).encode


class ProtocolError(Exception):
    """A frame that is not a protocol message (cut short, too long, not a
    JSON object)."""


class NotRunByKvcheck(SystemExit):
    """The process was not started by kvcheck (no protocol descriptors)."""


class Connection:
    """The two protocol pipes of an adapter process."""

    # Set in a zygote's copy (zygote.py), which serves pipes that kvcheck
    # gave another process (the launcher it started): the first reply (the
    # handshake's) then says this process's pid, which kvcheck samples and
    # counts with the launcher's (docs/protocol.md section 10b).
    declare_pid = False

    def __init__(self, request_fd: int, reply_fd: int):
        self._requests = os.fdopen(request_fd, "rb", buffering=1 << 16)
        self._reply_fd = reply_fd
        self._declare_pid = Connection.declare_pid

    @classmethod
    def from_environment(cls) -> "Connection":
        """The pipes kvcheck passed ($KVCHECK_REQUEST_FD, $KVCHECK_REPLY_FD).
        Exits with status 2 and a message when they are missing: the script
        was run by hand, not by kvcheck."""
        try:
            request_fd = int(os.environ["KVCHECK_REQUEST_FD"])
            reply_fd = int(os.environ["KVCHECK_REPLY_FD"])
        except (KeyError, ValueError):
            script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "this adapter"
            sys.stderr.write(
                f"{script} is a kvcheck adapter: kvcheck starts it and talks to it over pipes of its own.\n"
                f"Check it with:  kvcheck run --adapter {script}\n"
            )
            raise NotRunByKvcheck(2)
        return cls(request_fd, reply_fd)

    def receive(self) -> Optional[Dict[str, Any]]:
        """The next request, or None when kvcheck closed the pipe."""
        header = self._requests.read(4)
        if not header:
            return None
        if len(header) < 4:
            raise ProtocolError("a frame header was cut short")
        size = int.from_bytes(header, "big")
        if size > FRAME_BYTES_MAX:
            raise ProtocolError(f"a frame of {size} bytes is over the limit of {FRAME_BYTES_MAX}")
        payload = self._requests.read(size)
        if len(payload) < size:
            raise ProtocolError(f"a frame of {size} bytes was cut short at {len(payload)}")
        message = json.loads(payload)
        if not isinstance(message, dict):
            raise ProtocolError("a frame holds JSON that is not an object")
        return message

    def send(self, message: Dict[str, Any]) -> None:
        if self._declare_pid:
            self._declare_pid = False
            message = dict(message, pid=os.getpid())
        payload = _encode(message).encode("utf-8")
        data = len(payload).to_bytes(4, "big") + payload
        view = memoryview(data)
        while view:
            written = os.write(self._reply_fd, view)
            view = view[written:]


# The SDK's own request handling: its frames lead every traceback and say
# nothing about the engine, so they are left out of the report.
_DISPATCH_FILES = {
    os.path.join(os.path.dirname(os.path.abspath(__file__)), name) for name in ("protocol.py", "adapter.py")
}


def error_reply(error: BaseException) -> Dict[str, Any]:
    """The reply to a request the adapter could not carry out: the error
    in one line, and the Python traceback kvcheck shows with the failure
    (from the first frame outside the SDK's request handling, when there
    is one)."""
    frames = error.__traceback__
    while frames is not None and frames.tb_next is not None and os.path.abspath(frames.tb_frame.f_code.co_filename) in _DISPATCH_FILES:
        frames = frames.tb_next
    text = "".join(traceback.format_exception(type(error), error, frames))
    return {"ok": False, "error": f"{type(error).__name__}: {error}", "traceback": text}


def serve_forks(
    connection: Connection, fork_fd: int, handle: Callable[[Dict[str, Any]], Dict[str, Any]]
) -> Optional[Connection]:
    """The fork server of warm starts (docs/protocol.md section 10), for a
    process kvcheck offered a fork socket ($KVCHECK_FORK_FD): answers the
    handshake with "fork": true, then makes a copy of itself for each fork
    request, talking over the pipes the request carries. A process that
    runs more than one thread at a fork (_threads_at_fork) is no server (a fork copies one thread):
    the connection is returned at once, for the caller to serve as usual.
    Otherwise it returns twice in a sense: in each copy, the copy's connection (the caller serves it as a
    process kvcheck started, handshake first); in the server, None when
    kvcheck closes the pipes or asks to shut down (the copies still running
    are killed). The server reaps its copies and sends each one's wait
    status to the process that asked for it; it kills a copy when that
    process's life pipe closes (the process ended)."""
    import socket

    server = socket.socket(fileno=fork_fd)
    if _threads_at_fork() > 1:
        # A fork copies only the calling thread: a lock another thread
        # holds stays locked in the copy forever. Not a server: the caller
        # serves the connection itself, and kvcheck starts every other
        # adapter process cold.
        server.close()
        return connection
    copies = Copies()
    request_fd = connection._requests.fileno()
    serving = True  # the socket is open at the other end

    while True:
        watched = [request_fd] + ([server.fileno()] if serving else []) + copies.watched()
        ready, _, _ = select.select(watched, [], [], copies.select_timeout())
        copies.reap(False)
        if request_fd in ready:
            request = connection.receive()
            if request is None or request.get("op") == "shutdown":
                if request is not None:
                    connection.send({"ok": True})
                copies.kill_all()
                return None
            reply = answer(handle, request)
            if request.get("op") == "hello" and reply.get("ok"):
                reply["fork"] = True
            connection.send(reply)
        copies.kill_orphans(ready)
        if serving and server.fileno() in ready:
            message, fds, _, _ = socket.recv_fds(server, 65536, 8)
            fds = [_above_stdio(fd) for fd in fds]
            if not message and not fds:
                serving = False  # every process holding the other end is gone
                continue
            fork_request = None
            try:
                fork_request = json.loads(message)
                if not isinstance(fork_request, dict) or len(fds) != 5:
                    raise ProtocolError(f"a fork request needs a JSON object and 5 descriptors, got {len(fds)}")
                threads = _threads_at_fork()
                if threads > 1:
                    raise ProtocolError(f"the server runs {threads} threads now: a copy would hold only one")
            except (ValueError, ProtocolError) as error:
                for fd in fds:
                    os.close(fd)
                # The refusal carries the request's id, as every answer does:
                # kvcheck passes over an answer without it (one meant for an
                # earlier request) and would wait out its fork timeout.
                asked = fork_request.get("id") if isinstance(fork_request, dict) else None
                server.send(_encode({"ok": False, "id": asked, "error": str(error)}).encode("utf-8"))
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            server_pid = os.getpid()
            pid = os.fork()
            if pid == 0:
                _die_with_parent(server_pid)
                return _become_copy(connection, server, copies, fork_request, fds)
            for fd in fds[:3]:
                os.close(fd)
            copies.add(pid, fds[3], fds[4])
            server.send(_encode({"ok": True, "id": fork_request.get("id"), "pid": pid}).encode("utf-8"))


class Copies:
    """The live copies a server forked (serve_forks; a zygote, zygote.py),
    each with its status pipe (write end: its wait status goes there when
    it ends, then both its pipes close), its life pipe (read end: end of
    file means that the process that asked for it ended, and the copy is
    killed) and a pidfd, readable when it ends, so that its status reaches
    the asker at once, not at the next look."""

    def __init__(self) -> None:
        self._children: Dict[int, list] = {}  # pid -> [status fd, life fd (-1 once closed), pidfd (-1: none)]

    def add(self, pid: int, status_fd: int, life_fd: int) -> None:
        self._children[pid] = [status_fd, life_fd, _pidfd(pid)]

    def watched(self) -> list:
        """The descriptors to wait on besides the server's own."""
        return [fd for fds in self._children.values() for fd in fds[1:] if fd >= 0]

    def select_timeout(self) -> Optional[float]:
        """Without a pidfd (Linux before 5.3), a look every 50 ms."""
        return 0.05 if any(fds[2] < 0 for fds in self._children.values()) else None

    def reap(self, block: bool) -> None:
        while self._children:
            try:
                pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            fds = self._children.pop(pid, None)
            if fds is None:
                continue
            try:
                os.write(fds[0], struct.pack("=i", status))
            except OSError:
                pass  # the process that asked is gone
            for fd in fds:
                if fd >= 0:
                    os.close(fd)

    def kill_orphans(self, ready: list) -> None:
        """Kills each copy whose life pipe, among `ready`, reports end of file."""
        for pid, fds in list(self._children.items()):
            if fds[1] >= 0 and fds[1] in ready and not os.read(fds[1], 1):
                os.close(fds[1])
                fds[1] = -1
                _kill_group(pid)  # the process that asked for it ended

    def kill_all(self) -> None:
        for pid in list(self._children):
            _kill_group(pid)
        self.reap(True)

    def close_in_copy(self) -> None:
        """In a new copy: closes the descriptors held for the others."""
        for fds in self._children.values():
            for fd in fds:
                if fd >= 0:
                    os.close(fd)
        self._children.clear()


def _kill_group(pid: int) -> None:
    """SIGKILL to the copy `pid` and its process group (it made its own)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _pidfd(pid: int) -> int:
    """A descriptor that becomes readable when process `pid` ends; -1
    where the system has none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return -1


def _above_stdio(fd: int) -> int:
    """`fd`, moved to a number above 2 if it is one of 0, 1, 2. A server
    that closed its standard descriptors receives a fork request's pipes on
    those numbers, and the copy's own set-up (dup2 of /dev/null and its
    output onto 0, 1, 2) would then overwrite them."""
    if fd > 2:
        return fd
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 3)
    os.close(fd)
    return moved


def _threads() -> int:
    """The threads of this process (Linux's /proc; elsewhere Python's own)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


def _threads_at_fork() -> int:
    """The threads this process would run while it forks. Some libraries
    keep idle worker threads that they stop themselves before any fork
    (their pthread_atfork handlers): numpy's OpenBLAS starts one per core
    at import and shuts its pool down at every fork, to start it again at
    its next parallel call. When more than one thread runs, a throwaway
    fork (its copy exits at once) lets those handlers run; what still
    runs after it is counted."""
    threads = _threads()
    if threads > 1:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        threads = _threads()
    return threads


def _die_with_parent(parent: int) -> None:
    """SIGKILL when the fork server dies (Linux's PR_SET_PDEATHSIG), as a
    process kvcheck starts dies with its starter; elsewhere nothing."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(111)  # the server died before the line above


def _become_copy(connection, server, copies, fork_request, fds) -> Connection:
    """In a fork server's new child: its own process group, the asker's
    pipes, output file and address-space limit, nothing of the server's."""
    import resource

    requests, replies, output, status, life = fds
    os.setpgid(0, 0)
    server.close()
    copies.close_in_copy()
    os.close(status)
    os.close(life)
    connection._requests.close()  # the server's pipes to kvcheck
    os.close(connection._reply_fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    os.environ.pop("KVCHECK_FORK_FD", None)
    Connection.declare_pid = False  # kvcheck asked for this copy itself, and knows its pid
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    address_space = fork_request.get("address_space_bytes")
    if isinstance(address_space, int) and address_space > 0:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            address_space = min(address_space, hard)
        resource.setrlimit(resource.RLIMIT_AS, (address_space, hard))
    return Connection(requests, replies)


def dump_shim() -> Optional[Callable[[bytes, int, int], int]]:
    """`kvcheck_dumpshim_arm(dir, log_fd, kill_at)` of the dump shim kvcheck
    preloads into every adapter process (libkvcheck_dumpshim.so, through
    LD_PRELOAD; docs/durability.md), or None when it is not loaded here (a
    wrapper that cleared LD_PRELOAD, a kvcheck without the shim)."""
    try:
        import ctypes

        arm = ctypes.CDLL(None).kvcheck_dumpshim_arm
    except (OSError, AttributeError):
        return None
    arm.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_longlong]
    arm.restype = ctypes.c_int
    return arm


# What a dump copy sends back of the exception that ended it.
_DUMP_ERROR_BYTES_MAX = 60000


def _wait_copy(pid: int, errors: int, chunks: list) -> int:
    """The wait status of the dump copy `pid`, reading what it writes to
    `errors` meanwhile. A copy that stops itself (SIGSTOP) keeps its end
    of the pipe open and is reported only with WUNTRACED: it is killed, and
    its stopped status returned (kvcheck says "stopped by SIGSTOP"), where
    the request hung."""
    while True:
        readable, _, _ = select.select([errors], [], [], 0.05)
        if readable:
            chunk = os.read(errors, 65536)
            if chunk:
                chunks.append(chunk)
                continue
            _, status = os.waitpid(pid, os.WUNTRACED)  # the pipe closed: the copy ended (or is ending)
        else:
            waited, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
            if waited == 0:
                continue
        if os.WIFSTOPPED(status):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return status
        while True:  # what it wrote before it ended
            chunk = os.read(errors, 65536)
            if not chunk:
                return status
            chunks.append(chunk)


def dump_fork(dump: Callable[[str], None], directory: str, log_path: str, kill_at: int) -> Dict[str, Any]:
    """The dump_fork request (docs/protocol.md section 10a): `dump(directory)`
    in a copy of this process (os.fork: the copy holds the engine as it is)
    with the dump shim armed on `directory`, recording to the file
    `log_path` and killing the copy (SIGKILL) just before its counted call
    `kill_at` (-1: never). The copy exits 0, or 3 when the dump raised;
    this process's engine is untouched. The reply carries the copy's wait
    status and what it raised."""
    arm = dump_shim()
    if arm is None:
        raise RuntimeError("dump_fork: the dump shim (libkvcheck_dumpshim.so) is not loaded in this process")
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    errors, errors_out = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    with warnings.catch_warnings():
        # Python 3.12 warns of a fork while other threads run (torch's
        # pools): the copy only dumps and exits, as kvcheck's own dump
        # children do; a dump that waits for a lock another thread held
        # hangs, and is reported as the request's hang.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        status = 3
        try:
            os.close(errors)
            _die_with_parent(parent)
            if arm(os.fsencode(directory), log, kill_at) != 0:
                raise RuntimeError(f"cannot arm the dump shim on {directory!r}")
            dump(directory)
            status = 0
        except BaseException as error:  # noqa: BLE001 - every way out of the dump is reported
            reply = error_reply(error)
            text = reply["error"] + "\n" + reply["traceback"]
            os.write(errors_out, text.encode("utf-8", "replace")[:_DUMP_ERROR_BYTES_MAX])
        os._exit(status)
    os.close(log)
    os.close(errors_out)
    chunks = []
    status = _wait_copy(pid, errors, chunks)
    os.close(errors)
    error = b"".join(chunks).decode("utf-8", "replace")
    return {"ok": True, "status": status, "error": error or None}


def answer(handle: Callable[[Dict[str, Any]], Dict[str, Any]], request: Dict[str, Any]) -> Dict[str, Any]:
    """`handle`'s reply to `request`; an exception it raises becomes an
    error reply (the step's engine error, with the traceback)."""
    try:
        return handle(request)
    except Exception as error:  # noqa: BLE001 - every engine error is reported, none ends the loop
        return error_reply(error)


def serve_loop(connection: Connection, handle: Callable[[Dict[str, Any]], Dict[str, Any]]) -> None:
    """Answers requests until kvcheck closes the pipe or asks to shut down.
    `handle` maps a request to its reply; an exception it raises becomes an
    error reply (the step's engine error, with the traceback)."""
    while True:
        request = connection.receive()
        if request is None:
            return
        connection.send(answer(handle, request))
        if request.get("op") == "shutdown":
            return
