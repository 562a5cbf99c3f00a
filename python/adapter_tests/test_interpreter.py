"""Which interpreter `kvcheck run` starts a `.py` adapter with (issue 42):
--python, else $KVCHECK_PYTHON, else the script's `#!` interpreter, else
an active virtual environment's python ($VIRTUAL_ENV/bin/python), else
the python beside kvcheck, else /usr/bin/python3; and every import error
names --python and why that interpreter was chosen."""

# kvcheck-test-pythons: torch2

import os
import stat
import sys

import pytest

from conftest import EXAMPLE

ADAPTER_BODY = f"import runpy\nrunpy.run_path({EXAMPLE!r}, run_name='__main__')\n"


def wrapper(directory, name):
    """An interpreter at <directory>/bin/python that records its name in
    $KVCHECK_TEST_WHICH, then runs this test's python."""
    bin_dir = os.path.join(directory, name, "bin")
    os.makedirs(bin_dir)
    path = os.path.join(bin_dir, "python")
    with open(path, "w") as file:
        file.write(f'#!/bin/sh\necho {name} >> "$KVCHECK_TEST_WHICH"\nexec {sys.executable} "$@"\n')
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


def adapter(directory, first_line=""):
    path = os.path.join(directory, "my_adapter.py")
    with open(path, "w") as file:
        file.write(first_line + ADAPTER_BODY)
    return path


@pytest.fixture
def which(scratch_dir, monkeypatch):
    """The names of the wrappers that ran, in order; no $KVCHECK_PYTHON."""
    record = os.path.join(scratch_dir, "which.txt")
    monkeypatch.setenv("KVCHECK_TEST_WHICH", record)
    monkeypatch.delenv("KVCHECK_PYTHON", raising=False)
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)

    def names():
        with open(record) as file:
            return sorted(set(file.read().split()))

    return names


def run_once(kvcheck, script, *options):
    run = kvcheck("run", "--adapter", script, *options, "--property", "store-contract", "--cases", "1", "--replays", "0")
    assert run.status == 0, run.stdout + run.stderr
    return run


def test_the_order_python_shebang_virtual_environment(kvcheck, scratch_dir, which, monkeypatch):
    declared = wrapper(scratch_dir, "declared")
    active = wrapper(scratch_dir, "active")
    explicit = wrapper(scratch_dir, "explicit")
    monkeypatch.setenv("VIRTUAL_ENV", os.path.dirname(os.path.dirname(active)))
    run_once(kvcheck, adapter(scratch_dir, f"#!{declared}\n"), "--python", explicit)
    assert which() == ["explicit"]
    os.remove(os.environ["KVCHECK_TEST_WHICH"])
    run_once(kvcheck, adapter(scratch_dir, f"#!{declared} -u\n"))
    assert which() == ["declared"]
    os.remove(os.environ["KVCHECK_TEST_WHICH"])
    # `#!/usr/bin/env python3` names no interpreter: the active environment's.
    run_once(kvcheck, adapter(scratch_dir, "#!/usr/bin/env python3\n"))
    assert which() == ["active"]


def test_every_import_error_names_python_and_why_that_interpreter(kvcheck, scratch_dir, which, monkeypatch):
    active = wrapper(scratch_dir, "active")
    monkeypatch.setenv("VIRTUAL_ENV", os.path.dirname(os.path.dirname(active)))
    script = os.path.join(scratch_dir, "needs_transformers.py")
    with open(script, "w") as file:
        file.write("import kvcheck_not_a_module_anywhere\n")
    run = kvcheck("run", "--adapter", script, "--cases", "1")
    assert run.status == 2, run.stdout + run.stderr
    assert "No module named 'kvcheck_not_a_module_anywhere'" in run.stderr, run.stderr
    assert "hint: " + active + " (chosen by the active virtual environment, $VIRTUAL_ENV)" in run.stderr, run.stderr
    assert "--python PATH" in run.stderr, run.stderr
