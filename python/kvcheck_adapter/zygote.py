"""One interpreter with the heavy imports done, shared by many kvcheck
runs: a *zygote* (docs/protocol.md section 10b; python/README.md "One
interpreter for many runs").

kvcheck starts a Python adapter anew for every run, and an adapter that
imports torch and transformers pays seconds of CPU for that before its
first request. A zygote imports them once. The command kvcheck then runs
for an adapter is a launcher (this file as a script, importing nothing
beyond the standard library): it hands its descriptors, arguments and
environment to the zygote over a Unix socket, and the zygote forks a copy
that runs the adapter script as `python script.py ARGS` would, on the
launcher's pipes. The launcher waits for the copy and ends as it ended
(its exit status, or killed by the same signal), so the process kvcheck
started ends as the adapter did.

The copy is not below the launcher in the process tree: its first reply
(the handshake's) names its pid, and kvcheck samples and counts that
process's tree with the launcher's (its CPU for the hang rule, its
memory). The zygote kills a copy whose launcher ended (kvcheck killed it),
and a copy dies with its zygote; a launcher whose copy was lost that way
says so and exits with status 70.

Whenever a copy could differ from a cold start, the launcher runs the
script itself (exec, the cold start exactly): $KVCHECK_ZYGOTE unset or no
zygote listening there, another interpreter, an environment that differs
in anything but kvcheck's per-process variables, limits the zygote cannot
give, a zygote running more than one thread. The zygote's log says why.

    zygote = Zygote(["torch", "transformers"], adapter_environment)  # imports once
    kvcheck_environment.update(zygote.variables())   # KVCHECK_PYTHON, KVCHECK_ZYGOTE
    ...                                              # kvcheck runs
    zygote.close()
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys

# The only variables in which a launcher's environment may differ from its
# zygote's (a copy takes the launcher's): those kvcheck sets for each
# adapter process (docs/protocol.md section 1) or each run (the thread
# schedule's seed, read when a thread-safe adapter's scheduler starts, not
# at import), one kvcheck alone reads (warm starts off), and these:
PER_PROCESS_VARIABLES = frozenset({"KVCHECK_REQUEST_FD", "KVCHECK_REPLY_FD", "KVCHECK_FORK_FD", "KVCHECK_PROTOCOL",
                                   "KVCHECK_THREAD_SEED", "KVCHECK_COLD_START",
                                   # The shell's and the test runner's, read when used, never at import:
                                   # /bin/sh (the launcher's) sets PWD; pytest sets the test's name and
                                   # the terminal's size.
                                   "PWD", "OLDPWD", "SHLVL", "_", "COLUMNS", "LINES", "PYTEST_CURRENT_TEST"})
# The limits a copy takes from its launcher (kvcheck's sandbox sets them).
LIMITS = ("RLIMIT_AS", "RLIMIT_CORE")
# A launcher's descriptors handed to the copy: kvcheck's 0-4 and 6, and
# any other below this.
DESCRIPTORS_MAX = 10
# The status of a launcher whose copy was lost with its zygote.
LOST_STATUS = 70
# What the transformers adapters (python/adapters/transformers*) import,
# their models' modules included (transformers imports those lazily).
TRANSFORMERS_MODULES = ("torch", "transformers", "transformers.generation.utils", "transformers.cache_utils",
                        "transformers.models.llama.modeling_llama", "transformers.models.mistral.modeling_mistral",
                        "transformers.models.bart.modeling_bart", "kvcheck_adapter.hf", "kvcheck_adapter.adapter",
                        "kvcheck_adapter.cache", "kvcheck_adapter.wire", "kvcheck_adapter.copies")
# How long a launcher waits for the zygote's answer before starting cold.
ANSWER_SECONDS = 30


# ---- the launcher: the process kvcheck starts (standard library only) ----

def _cold(argv: list) -> None:
    """The script run by this interpreter, in this process: a cold start."""
    os.execv(sys.executable, [sys.executable] + argv)


def _open_descriptors() -> list:
    open_fds = []
    for fd in range(DESCRIPTORS_MAX):
        try:
            os.fstat(fd)
        except OSError:
            continue
        open_fds.append(fd)
    return open_fds


def _ask(path: str, argv: list, descriptors: list, status_w: int, life_r: int) -> dict:
    """The zygote's answer to running `argv` on `descriptors`."""
    import resource

    request = {
        "argv": argv,
        "executable": sys.executable,
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "umask": os.umask(0o022),
        "fds": descriptors,
        "limits": {name: list(resource.getrlimit(getattr(resource, name))) for name in LIMITS},
    }
    os.umask(request["umask"])
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as connection:
        connection.settimeout(ANSWER_SECONDS)
        connection.connect(path)
        socket.send_fds(connection, [json.dumps(request).encode("utf-8")], descriptors + [status_w, life_r])
        answer = json.loads(connection.recv(65536) or b"{}")
    return answer if isinstance(answer, dict) else {}


def _end_as(status: int) -> None:
    """Ends this process as a process with wait status `status` ended."""
    import resource
    import signal

    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(number, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [number])
        os.kill(os.getpid(), number)
        os._exit(128 + number)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else LOST_STATUS)


def launch(argv: list) -> None:
    """The launcher's whole life: `argv` (the script and its arguments)
    run in a copy of the zygote at $KVCHECK_ZYGOTE, else cold."""
    path = os.environ.get("KVCHECK_ZYGOTE")
    if not path or not argv:
        _cold(argv)
    descriptors = _open_descriptors()
    status_r, status_w = os.pipe()
    life_r, life_w = os.pipe()
    try:
        answer = _ask(path, argv, descriptors, status_w, life_r)
    except (OSError, ValueError):
        answer = {}
    os.close(status_w)
    os.close(life_r)
    if not answer.get("ok"):
        os.close(status_r)
        os.close(life_w)
        _cold(argv)  # the zygote's log says why
    # The copy holds the pipes now: kvcheck must see them close when it ends.
    for fd in descriptors:
        if fd > 2:
            os.close(fd)
    data = b""
    while len(data) < 4:
        chunk = os.read(status_r, 4 - len(data))
        if not chunk:
            sys.stderr.write(f"kvcheck zygote: the zygote at {path} ended, and the adapter process it ran for this one"
                             f" (pid {answer.get('pid')}) with it\n")
            sys.stderr.flush()
            os._exit(LOST_STATUS)
        data += chunk
    _end_as(struct.unpack("=i", data)[0])


# ---- the zygote: imports once, forks a copy per launcher ----

class Zygote:
    """A zygote process importing `modules` under `environment` (the
    environment kvcheck gives an adapter process, but for its per-process
    variables: adapter_environment() makes it), with its socket, log and
    launcher in a directory of its own. Started and ready (imports done)
    when the constructor returns; close() ends it and its copies."""

    def __init__(self, modules: list, environment: dict):
        import subprocess
        import tempfile

        self.directory = tempfile.mkdtemp(prefix="kvcheck-zygote-")
        self.socket_path = os.path.join(self.directory, "zygote.sock")
        self.log_path = os.path.join(self.directory, "zygote.log")
        self.python = os.path.join(self.directory, "python")
        with open(self.python, "w") as launcher:
            launcher.write(f"#!/bin/sh\nexec '{sys.executable}' -I -S '{os.path.abspath(__file__)}' --launch \"$@\"\n")
        os.chmod(self.python, 0o755)
        environment = dict(environment, KVCHECK_ZYGOTE=self.socket_path, KVCHECK_PYTHON=self.python)
        command = [sys.executable, os.path.abspath(__file__), "--serve", self.socket_path] + list(modules)
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(command, env=environment, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                             stderr=log, cwd=self.directory)
        ready = self._process.stdout.readline()
        self._process.stdout.close()
        if ready != b"ready\n":
            log = self.log()
            self.close()
            raise RuntimeError(f"the zygote did not start: {log}")

    def variables(self) -> dict:
        """What kvcheck's environment needs for its Python adapters to run in copies of this zygote."""
        return {"KVCHECK_ZYGOTE": self.socket_path, "KVCHECK_PYTHON": self.python}

    def log(self) -> str:
        """What the zygote did: a line per launcher ("copy PID: ..." or "cold: why")."""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as log:
                return log.read()
        except OSError:
            return ""

    def close(self) -> None:
        import shutil

        if self._process.poll() is None:
            self._process.terminate()  # the zygote kills its copies and exits
            self._process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def adapter_environment(environment: dict, sdk_dir: str = "", shim: str = "") -> dict:
    """The environment kvcheck gives a Python adapter process when it runs
    with `environment` (harness/process/adapter_process.cpp
    child_environment, harness/cli/adapters.cpp process_command), but for
    the per-process variables: `sdk_dir` first on PYTHONPATH, the dump
    shim `shim` last on LD_PRELOAD, unbuffered output."""
    adapter = dict(environment)
    if sdk_dir:
        adapter["PYTHONPATH"] = sdk_dir + (":" + environment["PYTHONPATH"] if environment.get("PYTHONPATH") else "")
    if shim:
        adapter["LD_PRELOAD"] = (environment["LD_PRELOAD"] + ":" if environment.get("LD_PRELOAD") else "") + shim
        adapter["ASAN_OPTIONS"] = "verify_asan_link_order=0" + (
            ":" + environment["ASAN_OPTIONS"] if environment.get("ASAN_OPTIONS") else "")
    adapter["PYTHONUNBUFFERED"] = "1"
    return adapter


def for_kvcheck(kvcheck: str, modules: list, environment: dict, sdk_dir: str = "") -> Zygote:
    """A zygote importing `modules` for the Python adapters that the
    kvcheck binary `kvcheck` runs when it runs with `environment`, its SDK
    at `sdk_dir` ("" for the wheel's kvcheck, whose SDK is the
    environment's own); the dump shim is the one `kvcheck` loads."""
    return Zygote(modules, adapter_environment(environment, sdk_dir, dump_shim_of(kvcheck)))


def dump_shim_of(kvcheck: str) -> str:
    """The path of the dump shim (libkvcheck_dumpshim.so) that the kvcheck
    binary `kvcheck` loads, and preloads into its adapter processes; "" when
    ldd names none."""
    import subprocess

    listing = subprocess.run(["ldd", kvcheck], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
    for line in listing.splitlines():
        name, _, rest = line.partition("=>")
        if "libkvcheck_dumpshim" in name and rest.strip():
            return os.path.realpath(rest.split("(")[0].strip())
    return ""


def _why_cold(request: dict, environment: dict, limits_here: dict) -> str:
    """Why a copy of this process could differ from the cold start the
    request stands for ("" when it could not); `environment` is the
    zygote's as it started (its imports may have set variables since, as
    they would in the cold start)."""
    from kvcheck_adapter import protocol

    if request.get("executable") != sys.executable:
        return f"another interpreter: {request.get('executable')!r}, not {sys.executable!r}"
    theirs = request.get("env") or {}
    # A variable the zygote's imports set (torch sets TORCHINDUCTOR_CACHE_DIR)
    # may come set to that value: the launcher's environment was made by a
    # process that imported the same (the test itself).
    differ = sorted(name for name in set(theirs) | set(environment)
                    if name not in PER_PROCESS_VARIABLES and theirs.get(name) != environment.get(name)
                    and (name in environment or theirs.get(name) != os.environ.get(name)))
    if differ:
        return "the environment differs in " + ", ".join(differ)
    for name, (soft, hard) in (request.get("limits") or {}).items():
        if name not in limits_here:
            return f"an unknown limit {name}"
        _, hard_here = limits_here[name]
        if hard_here != -1 and (hard == -1 or hard > hard_here):
            return f"{name} of hard limit {hard} above the zygote's {hard_here}"
    threads = protocol._threads_at_fork()
    if threads > 1:
        return f"the zygote runs {threads} threads: a copy would hold only one"
    return ""


def _run_copy(request: dict, fds: list, zygote_pid: int) -> None:
    """In a new copy (never returns): the launcher's descriptors on their
    numbers, its environment, directory and limits, then the script as
    `python script ARGS` runs it; exits as Python would."""
    import atexit
    import fcntl
    import resource
    import runpy
    import signal
    import threading
    import traceback

    from kvcheck_adapter import protocol

    code = 1
    try:
        protocol._die_with_parent(zygote_pid)
        os.setpgid(0, 0)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        targets = request["fds"]
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in fds[:len(targets)]]
        for fd in fds:
            os.close(fd)  # the status and life pipes are the zygote's
        for fd, target in zip(moved, targets):
            os.dup2(fd, target)
            os.close(fd)
        for fd in range(3, DESCRIPTORS_MAX):
            if fd not in targets:
                os.close(fd)  # the zygote's place holders: a cold start has only kvcheck's
        # The zygote's environment (the launcher's, and what the imports
        # set in it, as they would have in the cold start), with the
        # launcher's own per-process variables.
        for name in PER_PROCESS_VARIABLES:
            if name in request["env"]:
                os.environ[name] = request["env"][name]
            else:
                os.environ.pop(name, None)
        os.chdir(request["cwd"])
        os.umask(request["umask"])
        for name, (soft, hard) in request["limits"].items():
            resource.setrlimit(getattr(resource, name), (soft, hard))
        argv = request["argv"]
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.realpath(argv[0]))
        protocol.Connection.declare_pid = True
        try:
            runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as ended:
            if ended.code is None or isinstance(ended.code, int):
                code = ended.code or 0
            else:
                sys.stderr.write(f"{ended.code}\n")
                code = 1
        except BaseException:  # noqa: BLE001 - as Python reports an uncaught exception
            traceback.print_exc()
            code = 1
        threading._shutdown()  # as Python ends: waits for the threads that are not daemons
        atexit._run_exitfuncs()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(socket_path: str, modules: list) -> None:
    """The zygote: imports `modules`, says "ready" on stdout, then forks a
    copy for each launcher that connects, until SIGTERM (then kills its
    copies)."""
    import importlib
    import resource
    import select
    import signal

    # The descriptor numbers a launcher hands over are held (on /dev/null)
    # before anything is imported, so that no module's file takes one of
    # them and finds a copy's pipe on it.
    environment = dict(os.environ)
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    for fd in range(3, DESCRIPTORS_MAX):
        if fd != null:
            os.dup2(null, fd, inheritable=False)
    if null >= DESCRIPTORS_MAX:
        os.close(null)
    from kvcheck_adapter import protocol

    for module in modules:
        importlib.import_module(module)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(socket_path)
    listener.listen(64)
    copies = protocol.Copies()
    stop_r, stop_w = os.pipe()
    signal.signal(signal.SIGTERM, lambda *_: os.write(stop_w, b"x"))
    limits_here = {name: resource.getrlimit(getattr(resource, name)) for name in LIMITS}
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    while True:
        watched = [listener.fileno(), stop_r] + copies.watched()
        try:
            ready, _, _ = select.select(watched, [], [], copies.select_timeout())
        except InterruptedError:
            continue
        copies.reap(False)
        if stop_r in ready:
            copies.kill_all()
            return
        copies.kill_orphans(ready)
        if listener.fileno() not in ready:
            continue
        connection, _ = listener.accept()
        with connection:
            connection.settimeout(ANSWER_SECONDS)
            try:
                message, fds, _, _ = socket.recv_fds(connection, 1 << 20, DESCRIPTORS_MAX + 2)
                request = json.loads(message)
            except (OSError, ValueError):
                continue
            fds = [protocol._above_stdio(fd) for fd in fds]
            why = "a launcher's request is not one" if not isinstance(request, dict) or len(fds) != len(
                request.get("fds", [])) + 2 else _why_cold(request, environment, limits_here)
            if why:
                for fd in fds:
                    os.close(fd)
                sys.stderr.write(f"cold: {why}\n")
                sys.stderr.flush()
                connection.send(json.dumps({"ok": False, "error": why}).encode("utf-8"))
                continue
            sys.stderr.flush()
            zygote_pid = os.getpid()
            pid = os.fork()
            if pid == 0:
                listener.close()
                connection.close()
                os.close(stop_r)
                os.close(stop_w)
                copies.close_in_copy()
                _run_copy(request, fds, zygote_pid)
            for fd in fds[:-2]:
                os.close(fd)
            copies.add(pid, fds[-2], fds[-1])
            sys.stderr.write(f"copy {pid}: {' '.join(request['argv'])}\n")
            sys.stderr.flush()
            connection.send(json.dumps({"ok": True, "pid": pid}).encode("utf-8"))


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--launch":
        launch(sys.argv[2:])
    elif len(sys.argv) >= 3 and sys.argv[1] == "--serve":
        # Run as a script, this file's directory leads sys.path: the SDK's
        # modules would be found by their bare names. The zygote's own
        # directory (nothing to import in it) holds the place that each
        # copy gives its script's directory, as Python does.
        sys.path[0] = os.getcwd()
        serve(sys.argv[2], sys.argv[3:])
    else:
        sys.stderr.write("usage: zygote.py --launch SCRIPT [ARGS...] | --serve SOCKET [MODULE...]\n")
        sys.exit(2)
