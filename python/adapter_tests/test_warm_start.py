"""The fork server of warm starts (docs/protocol.md section 10), driven by
hand as kvcheck drives it: a process offered a fork socket answers the
handshake with "fork", makes a copy per fork request that serves the
pipes it was given, reports each copy's wait status on its status pipe,
kills a copy whose life pipe closes, and refuses a malformed request
without dying. fault_adapter.py --warm (torch-free, quick to start) is the
server; the SDK's protocol module is its fork side."""

import json
import os
import signal
import socket
import struct
import subprocess

import pytest

from conftest import FAULT_ADAPTER, PYTHON_DIR, ADAPTER_PYTHON
from kvcheck_adapter import protocol


class Server:
    """A fault_adapter.py --warm process with its protocol pipes and fork socket."""

    def __init__(self, fault, scratch_dir, *extra, close_stdin=False):
        self.requests_r, self.requests_w = os.pipe()
        self.replies_r, self.replies_w = os.pipe()
        self.socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ, KVCHECK_REQUEST_FD="3", KVCHECK_REPLY_FD="4", KVCHECK_FORK_FD="6",
                   PYTHONPATH=PYTHON_DIR)
        fds = {3: self.requests_r, 4: self.replies_w, 6: theirs.fileno()}

        def place_descriptors():
            copies = {target: os.dup(source) for target, source in fds.items()}
            for target, copy in copies.items():
                os.dup2(copy, target)  # inheritable
            if close_stdin:
                os.close(0)  # as an engine that closes fd 0 before serve()

        self.output = open(os.path.join(scratch_dir, "server.out"), "wb")
        self.process = subprocess.Popen([ADAPTER_PYTHON, FAULT_ADAPTER, "--fault", fault, "--warm", *extra], env=env,
                                        stdout=self.output, stderr=self.output, preexec_fn=place_descriptors,
                                        close_fds=False)  # Python's own descriptors are not inheritable
        theirs.close()
        os.close(self.requests_r)
        os.close(self.replies_w)
        self.connection = protocol.Connection(self.replies_r, self.requests_w)  # we read replies, write requests

    def call(self, request):
        self.connection.send(request)
        return self.connection.receive()

    def fork(self, payload, fds):
        socket.send_fds(self.socket, [json.dumps(payload).encode()], fds)
        return json.loads(self.socket.recv(65536))

    def stop(self):
        self.call({"op": "shutdown"})
        self.process.wait(timeout=60)
        self.output.close()


def copy_pipes(scratch_dir):
    """The asker's ends and the copy's ends of a fork request's descriptors."""
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    status_r, status_w = os.pipe()
    life_r, life_w = os.pipe()
    output = os.open(os.path.join(scratch_dir, "copy.out"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    theirs = [requests_r, replies_w, output, status_w, life_r]
    ours = {"connection": protocol.Connection(replies_r, requests_w), "status": status_r, "life": life_w}
    return theirs, ours


def wait_status(fd):
    data = b""
    while len(data) < 4:
        chunk = os.read(fd, 4 - len(data))
        assert chunk, "the status pipe closed without a status"
        data += chunk
    return struct.unpack("=i", data)[0]


def test_a_copy_serves_its_own_pipes_and_its_end_is_reported(scratch_dir):
    server = Server("exit", scratch_dir)
    try:
        hello = server.call({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})
        assert hello["ok"] and hello["fork"] is True, hello
        theirs, ours = copy_pipes(scratch_dir)
        answer = server.fork({"op": "fork", "id": "t.1"}, theirs)
        for fd in theirs:
            os.close(fd)
        assert answer["ok"] and answer["id"] == "t.1" and answer["pid"] > 0, answer
        copy = ours["connection"]
        copy.send({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})
        assert copy.receive()["name"] == "fault-exit"  # a fresh handshake, on the copy's pipes
        copy.send({"op": "stored_ids"})  # the copy's fault: exit with status 3
        assert copy.receive() is None
        status = wait_status(ours["status"])
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3
        assert os.read(ours["status"], 1) == b""  # then closed
    finally:
        server.stop()
    assert server.process.returncode == 0


def test_a_copy_whose_asker_ends_is_killed(scratch_dir):
    server = Server("hang", scratch_dir)
    try:
        server.call({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})
        theirs, ours = copy_pipes(scratch_dir)
        answer = server.fork({"op": "fork", "id": "t.2"}, theirs)
        for fd in theirs:
            os.close(fd)
        copy = ours["connection"]
        copy.send({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})
        copy.receive()
        copy.send({"op": "stored_ids"})  # the copy hangs on it
        os.close(ours["life"])  # as when the asker dies
        status = wait_status(ours["status"])
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        with pytest.raises(ProcessLookupError):
            os.kill(answer["pid"], 0)
    finally:
        server.stop()


def test_a_malformed_fork_request_is_refused_and_the_server_serves_on(scratch_dir):
    server = Server("none", scratch_dir)
    try:
        server.call({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})
        refused = server.fork({"op": "fork", "id": "t.3"}, [])
        assert refused["ok"] is False and "5 descriptors" in refused["error"], refused
        assert refused["id"] == "t.3", refused  # else kvcheck waits out its 30 s for an answer it can match
        theirs, ours = copy_pipes(scratch_dir)
        answer = server.fork({"op": "fork", "id": "t.4"}, theirs)
        for fd in theirs:
            os.close(fd)
        assert answer["ok"], answer
        ours["connection"].send({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})
        assert ours["connection"].receive()["ok"]
    finally:
        server.stop()
    # shutdown killed the copy still running, and said how it ended
    status = wait_status(ours["status"])
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def test_a_process_running_threads_declines_to_serve_forks(scratch_dir):
    # A fork copies one thread: a process with two answers the handshake
    # without "fork", and serves as a process started cold.
    server = Server("none", scratch_dir, "--thread")
    try:
        hello = server.call({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})
        assert hello["ok"] and "fork" not in hello, hello
        assert server.call({"op": "stored_ids"})["ok"] is False  # the "none" fault: an engine that rejects everything
    finally:
        server.stop()


_THREADS_AT_FORK = """
import os, sys, threading
import numpy  # pip's numpy starts OpenBLAS's pool (a thread per core) here
from kvcheck_adapter import protocol

print(protocol._threads_at_fork())
stop = threading.Event()
pool = threading.Thread(target=stop.wait)
pool.start()
def stop_pool():
    stop.set()
    pool.join()
os.register_at_fork(before=stop_pool)  # a pool that stops itself at a fork
print(protocol._threads(), protocol._threads_at_fork())
busy = threading.Thread(target=threading.Event().wait, daemon=True)
busy.start()  # a thread that keeps running through a fork
print(protocol._threads_at_fork())
"""


def test_threads_that_stop_at_a_fork_do_not_stop_warm_starts():
    # Under .venv's numpy, OpenBLAS's idle pool ran beside every adapter
    # process, and the SDK declined to serve forks: each property's
    # adapter started cold (torch imported again). Such a pool stops
    # itself at a fork (pthread_atfork), so it does not count; a thread
    # that runs on through a fork still does.
    output = subprocess.run([ADAPTER_PYTHON, "-c", _THREADS_AT_FORK], check=True, capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=PYTHON_DIR)).stdout.split()
    assert output == ["1", "2", "1", "2"], output


def test_a_server_without_standard_input_still_makes_working_copies(scratch_dir):
    # With fd 0 closed, the fork request's first descriptor arrives as fd 0;
    # the copy's own set-up puts /dev/null there. Without moving the
    # received descriptors above 2 first, the copy reads /dev/null, not its
    # requests, and exits at once.
    server = Server("exit", scratch_dir, close_stdin=True)
    try:
        server.call({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})
        theirs, ours = copy_pipes(scratch_dir)
        answer = server.fork({"op": "fork", "id": "t.stdin"}, theirs)
        for fd in theirs:
            os.close(fd)
        assert answer["ok"], answer
        copy = ours["connection"]
        copy.send({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})
        reply = copy.receive()
        assert reply is not None and reply["name"] == "fault-exit", reply
        copy.send({"op": "shutdown"})
        assert copy.receive() == {"ok": True}
        assert os.WIFEXITED(wait_status(ours["status"]))
    finally:
        server.stop()
    assert server.process.returncode == 0
