"""Adapter processes that break: each is a FAULT verdict (or exit status 2
for a handshake that fails) with a message naming the cause, and the run
goes on with the next property. The faults come from fault_adapter.py, a
torch-free adapter that breaks on its first operation (deterministic, and
quick to start: a fault's trace is shrunk by starting it again per try).
Time limits are generous: only the hang test waits for one."""

# Under one interpreter only: the faults are the adapter process's and
# kvcheck's handling of them, not the torch's (fault_adapter.py imports
# none), and Debian's interpreter keeps the test in the ASan stage.
# kvcheck-test-pythons: torch1

import os
import shutil
import signal
import subprocess
import time

import pytest

from conftest import EXAMPLE, FAULT_ADAPTER, ADAPTER_PYTHON, adapter_arguments
from kvcheck_adapter import protocol

PROPERTIES = ["stored-immutable", "store-contract"]


def fault_adapter(kind, *extra):
    return " ".join(["exec:" + ADAPTER_PYTHON, FAULT_ADAPTER, "--fault", kind] + list(extra))


def run_adapters(kvcheck, adapters, *options):
    """One `kvcheck run` of `adapters` (CI time: one kvcheck start, most
    of all under ASan); Run.part gives each adapter's results, as a run of
    its own gives them: a fault is its job's, and the jobs of the other
    adapters go on."""
    return kvcheck("run", *adapter_arguments(adapters), *options)


def run_properties(kvcheck, adapters, *options):
    properties = [argument for prop in PROPERTIES for argument in ("--property", prop)]
    return run_adapters(kvcheck, adapters, "--cases", "5", "--jobs", "2", *properties, *options)


def warm(start):
    return ["--warm"] if start == "warm" else []


BROKEN = [
    ("crash", "crash", "was killed by SIGSEGV"),
    ("exit", "exit", "exited with status 3"),
    ("garbage", "protocol", "not a protocol frame on its reply pipe (a length of 1214606444 bytes"),
    ("not-json", "protocol", "a frame that is not JSON"),
    ("no-ok", "protocol", "has no boolean 'ok'"),
]
STARTS = ["cold", "warm"]


def broken_adapter(kind, start):
    # warm: the broken processes are copies of a fork server (section 10).
    return fault_adapter(kind, "--noise", "50", *warm(start))


@pytest.fixture(scope="module")
def broken_run(kvcheck_module):
    """Every broken process of BROKEN, cold and warm, in one kvcheck run;
    each test judges its adapter's part."""
    return run_properties(kvcheck_module, [broken_adapter(kind, start) for kind, _, _ in BROKEN for start in STARTS])


@pytest.mark.parametrize("kind, fault, words", BROKEN)
@pytest.mark.parametrize("start", STARTS)
def test_a_broken_process_is_a_fault_of_each_property(broken_run, kind, fault, words, start):
    run = broken_run
    assert run.status == 1, run.stdout + run.stderr
    results = run.part(broken_adapter(kind, start))
    for prop in PROPERTIES:  # the first fault did not end the run
        result = results[prop]
        assert result["verdict"] == "fail", result
        assert result["fault"].startswith(fault + ": "), result
        assert words in result["fault"], result["fault"]
        assert result["trace"], result  # the trace that met it, shrunk
        assert "noise line 49 on stderr" in result["output"], result["output"]


def process_gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # exited, not yet reaped by init
    except FileNotFoundError:
        return True


@pytest.fixture(scope="module")
def hang_run(kvcheck_module):
    """The hang, cold and warm, in one kvcheck run (one 10 s wait, not
    two), each with its pid file: (run, {start: (adapter, pid file)})."""
    hung = {}
    for start in STARTS:
        pid_file = os.path.join(kvcheck_module.directory, f"adapter-{start}.pid")
        hung[start] = (fault_adapter("hang", "--pid-file", pid_file, "--noise", "3", *warm(start)), pid_file)
    run = run_adapters(kvcheck_module, [adapter for adapter, _ in hung.values()], "--property", "store-contract",
                       "--cases", "5", "--timeout", "10")
    return run, hung


@pytest.mark.parametrize("start", STARTS)
def test_a_hang_is_a_fault_and_the_process_does_not_outlive_it(hang_run, start):
    # warm: the hung copy is the fork server's child; the server kills it
    # when the sandbox child that asked for it is killed.
    run, hung = hang_run
    adapter, pid_file = hung[start]
    assert run.status == 1, run.stdout + run.stderr
    result = run.part(adapter)["store-contract"]
    assert result["fault"] == "hang: no progress for 10 s", result
    assert "noise line 2 on stdout" in result["output"], result["output"]
    with open(pid_file) as file:
        pid = int(file.read())
    deadline = time.monotonic() + 60
    while not process_gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert process_gone(pid), f"the hung adapter process {pid} outlived its sandbox child"


WHERES = ["handshake", "operation"]


def escaping_adapter(start, where, pid_file):
    how = ["none", "--escape-at-hello"] if where == "handshake" else ["escape"]
    return fault_adapter(*how, "--escape-mb", "1", "--pid-file", pid_file, *warm(start))


@pytest.fixture(scope="module")
def escape_run(kvcheck_module):
    """The escapes, cold and warm, from the handshake and from an operation,
    in one kvcheck run (CI time: one kvcheck start, not four), each with its
    pid file; each test looks for its escaped process once kvcheck has
    ended: (run, {(start, where): (adapter, pid file)})."""
    escaping = {}
    for start in STARTS:
        for where in WHERES:
            pid_file = os.path.join(kvcheck_module.directory, f"escaped-{start}-{where}.pid")
            escaping[start, where] = (escaping_adapter(start, where, pid_file), pid_file)
    run = run_adapters(kvcheck_module, [adapter for adapter, _ in escaping.values()], "--property", "store-contract",
                       "--cases", "2")
    return run, escaping


@pytest.mark.parametrize("where", WHERES)
@pytest.mark.parametrize("start", STARTS)
def test_a_process_that_leaves_its_adapter_does_not_outlive_kvcheck(escape_run, start, where):
    # Issue 43, D7: a double fork and setsid (the grandchild's parent exits,
    # it is in a session of its own) from the process kvcheck starts for the
    # handshake, before any job, or from the one a job runs; warm, from the
    # fork server as it answers the handshake, or from one of its copies.
    run, escaping = escape_run
    adapter, pid_file = escaping[start, where]
    assert run.status == 1, run.stdout + run.stderr
    assert run.part(adapter)["engine-error"]["verdict"] == "fail", run.part(adapter)  # answered as --fault none
    with open(pid_file) as file:
        escaped = int(file.read())
    gone = process_gone(escaped)
    if not gone:
        os.kill(escaped, signal.SIGKILL)
    assert gone, f"the escaped process {escaped} outlived kvcheck ({start} start, from the {where})"


@pytest.fixture(scope="module")
def memory_run(kvcheck_module):
    """The adapter over the memory limit, cold and warm, in one kvcheck run."""
    return run_adapters(kvcheck_module, [fault_adapter("memory", *warm(start)) for start in STARTS],
                        "--property", "store-contract", "--cases", "5", "--memory-mb", "1024")


@pytest.mark.parametrize("start", STARTS)
def test_memory_over_the_limit_is_a_fault(memory_run, start):
    # The limit is the sandbox child's and its adapter's together (a warm
    # copy, not the child's descendant, is counted as one): 1 GiB leaves
    # room for a child built with sanitizers; the adapter grows to 3.
    run = memory_run
    assert run.status == 1, run.stdout + run.stderr
    result = run.part(fault_adapter("memory", *warm(start)))["store-contract"]
    assert result["fault"].startswith("memory: "), result
    assert "over the limit of 1024 MiB" in result["fault"]


def test_another_protocol_version_is_refused_with_both_versions(kvcheck):
    run = kvcheck("run", "--adapter", fault_adapter("version"), "--cases", "1")
    assert run.status == 2, run.stdout + run.stderr
    assert f"speaks protocol version 99; this kvcheck speaks version {protocol.PROTOCOL_VERSION}" in run.stderr, run.stderr
    assert run.report is None


def test_a_refused_handshake_is_an_error_with_the_adapters_words(kvcheck):
    run = kvcheck("run", "--adapter", fault_adapter("refuse"), "--cases", "1")
    assert run.status == 2, run.stdout + run.stderr
    assert "refused the handshake: RuntimeError: cannot open the store\nTraceback: here" in run.stderr, run.stderr


def test_an_interpreter_without_torch_is_refused_with_a_hint(kvcheck):
    # -S: no site directories, so no dist-packages and no torch, on any machine.
    run = kvcheck("run", "--adapter", f"exec:{ADAPTER_PYTHON} -S {EXAMPLE}", "--cases", "1")
    assert run.status == 2, run.stdout + run.stderr
    assert "exited with status 1 before answering the handshake" in run.stderr, run.stderr
    assert "ModuleNotFoundError: No module named 'torch'" in run.stderr, run.stderr
    # The hint names --python (harness/cli/adapters.cpp, start_hint: any import error).
    assert "cannot import what the adapter needs; name an interpreter that can with --python" in run.stderr, run.stderr


def path_python_without_torch():
    found = shutil.which("python3")
    if found is None or os.path.realpath(found) == os.path.realpath(ADAPTER_PYTHON):
        return None
    has_torch = subprocess.run([found, "-c", "import torch"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return found if has_torch.returncode != 0 else None


def test_the_python_first_on_path_without_torch_is_refused(kvcheck):
    python = path_python_without_torch()
    if python is None:
        pytest.skip("the python3 on PATH has torch (or is the system one)")
    run = kvcheck("run", "--adapter", EXAMPLE, "--python", python, "--cases", "1")
    assert run.status == 2, run.stdout + run.stderr
    assert "No module named 'torch'" in run.stderr and python in run.stderr, run.stderr


def test_a_command_that_cannot_run_is_refused(kvcheck, scratch_dir):
    run = kvcheck("run", "--adapter", "exec:/nonexistent/engine --flag", "--cases", "1")
    assert run.status == 2
    assert "cannot run the adapter command '/nonexistent/engine --flag': /nonexistent/engine: No such file" in run.stderr
    missing = kvcheck("run", "--adapter", os.path.join(scratch_dir, "missing.py"), "--cases", "1")
    assert missing.status == 2 and "adapter script not found" in missing.stderr


def test_an_engine_that_rejects_everything_fails_by_engine_error_not_fault(kvcheck):
    # Every trace ends in an engine error at its first step, and again
    # without it: the searches go on to their end all the same, no trace
    # can be judged, and the properties are blocked; the errors are grouped by message shape, one
    # group per operation refused, their counts every trace of both searches.
    run = run_properties(kvcheck, [fault_adapter("none")])
    assert run.status == 1
    for prop in PROPERTIES:
        result = run.result(prop)
        assert result["fault"] is None and result["verdict"] == "blocked", result
        assert result["cases"] == 5 and result["judged"] == 0, result
        assert result["message"].startswith("only 0 of 5 traces could be judged (at least 90 % must be): 5 still raised "
                                            "with up to 3 operations that raised left out; "), result
        assert "is not supported\", first at trace " in result["message"], result
    errors = run.result("engine-error")
    assert errors["verdict"] == "fail" and errors["fault"] is None, errors
    assert "is not supported" in errors["message"], errors
    groups = errors["failures"]
    assert sum(group["count"] for group in groups) == 10, groups
    refused = [group["message"].split("RuntimeError: ")[1] for group in groups]
    assert len(set(refused)) == len(refused), refused
    assert all(group["trace"] and group["reproduce"] for group in groups), groups
