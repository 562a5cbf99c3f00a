"""The fixtures of python/adapter_tests (kvcheck, scratch_dir), shared."""

import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "kvcheck_adapter_tests_conftest",
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "adapter_tests", "conftest.py"))
_shared = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_shared)

kvcheck = _shared.kvcheck
scratch_dir = _shared.scratch_dir
REPO = _shared.REPO
PYTHON_DIR = _shared.PYTHON_DIR
kvcheck_binary = _shared.kvcheck_binary


def use_engine(monkeypatch, environment, engine):
    """PYTHONPATH for the adapter processes: the engine's pinned environment
    (scripts/bootstrap); the test is skipped when it is not installed."""
    import pytest

    if not os.path.isdir(environment):
        pytest.skip(f"{engine} is not installed at {environment} (scripts/bootstrap installs it)")
    monkeypatch.setenv("PYTHONPATH", environment)


def run_adapter(kvcheck, adapter, *arguments):
    """`kvcheck run` of one adapter (its path and options, one string) at 2 jobs."""
    return kvcheck("run", "--adapter", adapter, *arguments, "--jobs", "2", "--timeout", "600")
