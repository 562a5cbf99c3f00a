"""Load is not a hang (docs/semantics.md#limits): the example Python store,
a correct adapter, checked on a CPU it shares with busy loops, under a
short --timeout, is no FAULT and starts (answers its handshake) every
time. Its processes get a fraction of the CPU, so its steps and its starts
take several times their CPU time in wall time: a limit on wall time alone
would call them hung."""

# Under one interpreter only (the g++ build's): what is tested is kvcheck's limits, not the
# adapter's torch.
# kvcheck-test-pythons: torch2

import os
import subprocess
import sys

from conftest import EXAMPLE

# Busy loops beside kvcheck on its one CPU: kvcheck's processes get about a
# fifth of it. Each ends by itself after HOG_SECONDS should the test die.
HOGS = 4
HOG_SECONDS = 600


def pinned_to(cpu):
    return lambda: os.sched_setaffinity(0, {cpu})


def test_a_correct_adapter_on_a_loaded_cpu_is_no_fault(kvcheck):
    cpus = os.sched_getaffinity(0)
    cpu = min(cpus)
    hog = f"import time\nend = time.monotonic() + {HOG_SECONDS}\nwhile time.monotonic() < end: pass\n"
    hogs = [subprocess.Popen([sys.executable, "-c", hog], preexec_fn=pinned_to(cpu)) for _ in range(HOGS)]
    try:
        # kvcheck and everything it starts share the hogs' CPU (affinity
        # is inherited).
        os.sched_setaffinity(0, {cpu})
        run = kvcheck("run", "--adapter", EXAMPLE, "--property", "stored-immutable", "--property", "dump-safe",
                      "--cases", "8", "--jobs", "2", "--timeout", "1")
    finally:
        os.sched_setaffinity(0, cpus)
        for process in hogs:
            process.kill()
        for process in hogs:
            process.wait()
    assert "handshake" not in run.stderr, run.stderr
    assert run.status == 0, run.stdout + run.stderr
    for prop in ("stored-immutable", "dump-safe"):
        result = run.result(prop)
        assert result["fault"] is None and result["verdict"] == "pass", result
