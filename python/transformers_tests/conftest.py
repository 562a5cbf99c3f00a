"""Shared set-up of the tests against real transformers: import paths, and
the one rule about the library itself. Run them once per installed version:

    PYTHONPATH=.venv/transformers/<version>:python .venv/bin/python -m pytest python/transformers_tests

Without transformers importable the tests are skipped, unless
KVCHECK_TRANSFORMERS_REQUIRED=1 (CI sets it): then they fail, loudly. With
KVCHECK_TRANSFORMERS_VERSION set, the importable version must be that one."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
REPO = os.path.dirname(PYTHON_DIR)
EXAMPLES = os.path.join(PYTHON_DIR, "examples")
ADAPTER = os.path.join(EXAMPLES, "transformers_memory_adapter.py")

for path in (PYTHON_DIR, EXAMPLES, HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

REQUIRED = os.environ.get("KVCHECK_TRANSFORMERS_REQUIRED") == "1"
WANTED_VERSION = os.environ.get("KVCHECK_TRANSFORMERS_VERSION") or None

try:
    import transformers  # noqa: F401
except ImportError as error:
    IMPORT_ERROR = error
else:
    IMPORT_ERROR = None


def require_transformers():
    """Call at the top of a test module: skips it without transformers, or
    raises (a collection error, which fails the run) when they are required."""
    if IMPORT_ERROR is None:
        return
    message = (
        f"transformers is not importable ({IMPORT_ERROR}); put one on PYTHONPATH,"
        " e.g. PYTHONPATH=.venv/transformers/4.57.6:python"
    )
    if REQUIRED:
        raise ImportError(message + " (KVCHECK_TRANSFORMERS_REQUIRED=1: this is a failure)")
    pytest.skip(message, allow_module_level=True)
