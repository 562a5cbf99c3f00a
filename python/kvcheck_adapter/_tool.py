"""`kvcheck` installed by pip: the console script of the kvcheck wheel
(pyproject.toml at the repository root), which runs the executable the
wheel put beside this module (_bin/kvcheck).

It runs it with two things set: its own name as argv[0], and
$KVCHECK_SDK_PYTHON, this interpreter, which kvcheck uses for a `.py`
adapter when nothing before it in kvcheck's order chooses one (--python,
$KVCHECK_PYTHON, the script's #! line, an active virtual environment:
harness/cli/adapters.cpp, python_of): the environment kvcheck was
installed into is the one that has the SDK (and, usually, the user's
engine).
"""

from __future__ import annotations

import os
import sys

SDK_PYTHON_VARIABLE = "KVCHECK_SDK_PYTHON"


def bundled_kvcheck() -> str:
    """The path of the wheel's executable (it may be absent: the SDK alone,
    python/pyproject.toml, has none)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "kvcheck")


def main() -> None:
    path = bundled_kvcheck()
    if not os.access(path, os.X_OK):
        sys.exit(f"kvcheck: {path} is missing: this kvcheck_adapter was installed without the kvcheck executable "
                 "(the SDK alone, kvcheck-adapter); install the kvcheck wheel, or put a kvcheck built from the "
                 "sources on PATH")
    os.environ.setdefault(SDK_PYTHON_VARIABLE, sys.executable)
    os.execv(path, ["kvcheck"] + sys.argv[1:])


if __name__ == "__main__":
    main()
