"""Which kvcheck binary to run, and whether it speaks this SDK's protocol.

    found = locate_kvcheck()          # or locate_kvcheck("/opt/kvcheck/bin/kvcheck")
    print(found.describe())           # kvcheck 0.1.0 at /usr/bin/kvcheck (found on PATH)

Looked for in order: the explicit path given (an argument, pytest's
--kvcheck-bin), $KVCHECK, the executable the kvcheck wheel installed beside
this SDK (pip install kvcheck: kvcheck_adapter/_bin/kvcheck), `kvcheck` on
PATH, and, when the SDK is run from
kvcheck's source tree, that tree's build (build/default/bin/kvcheck). The
first that exists is used, and `found_by` says which it was. None found:
KvcheckNotFound, naming the places looked at and how to get one.

The SDK and kvcheck are versioned together (kvcheck_adapter.__version__ is
kvcheck's version); what must agree is the adapter protocol: `kvcheck
--version` names the one it speaks, and a kvcheck that speaks another is
refused with one message (KvcheckMismatch) saying what to install. The
handshake checks the same once more (adapter.py), for a kvcheck run by hand.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Optional

from . import __version__
from .protocol import PROTOCOL_VERSION

ENVIRONMENT_VARIABLE = "KVCHECK"
_SDK_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SOURCE_TREE = os.path.dirname(_SDK_ROOT)

HOW_TO_GET_ONE = (
    "pip install the kvcheck wheel (pip wheel . in kvcheck's sources builds it), or "
    "build it from kvcheck's sources (scripts/bootstrap, then cmake --preset default && cmake --build --preset default), "
    "or install its package (the .deb that `cpack` builds), then put it on PATH, set $KVCHECK=/path/to/kvcheck, "
    "or pass the path (pytest --kvcheck-bin PATH, check_engine(kvcheck=PATH))"
)


class KvcheckNotFound(FileNotFoundError):
    """No kvcheck binary where the SDK looks for one."""


class KvcheckMismatch(RuntimeError):
    """The kvcheck found speaks another adapter protocol than this SDK."""


@dataclass(frozen=True)
class Kvcheck:
    path: str
    found_by: str            # "the explicit path", "$KVCHECK", "the kvcheck wheel", "PATH", "the source tree's build"
    version: str             # "0.1.0"; "" when --version did not say
    protocol: Optional[int]  # None when --version did not say (a kvcheck older than the SDK's versioning)

    def describe(self) -> str:
        return f"kvcheck {self.version or '(version unknown)'} at {self.path} (found by {self.found_by})"


def _candidates(explicit: Optional[str]):
    if explicit:
        yield explicit, "the explicit path"
    from_environment = os.environ.get(ENVIRONMENT_VARIABLE)
    if from_environment:
        yield from_environment, "$" + ENVIRONMENT_VARIABLE
    from ._tool import bundled_kvcheck
    if os.path.isfile(bundled_kvcheck()):
        yield bundled_kvcheck(), "the kvcheck wheel"
    on_path = shutil.which("kvcheck")
    if on_path:
        yield on_path, "PATH"
    if os.path.isfile(os.path.join(_SOURCE_TREE, "CMakeLists.txt")):
        yield os.path.join(_SOURCE_TREE, "build", "default", "bin", "kvcheck"), "the source tree's build"


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _version_of(path: str):
    """(version, protocol) as `kvcheck --version` prints them."""
    try:
        shown = subprocess.run([path, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as error:
        raise KvcheckNotFound(f"{path} is not a kvcheck that runs ({error})") from error
    version = re.search(r"^kvcheck (\S+)", shown, re.MULTILINE)
    protocol = re.search(r"adapter protocol (\d+)", shown)
    if version is None:
        raise KvcheckNotFound(f"{path} is not kvcheck: its --version printed {shown.strip()[:200]!r}")
    return version.group(1), int(protocol.group(1)) if protocol else None


def mismatch_message(found: Kvcheck) -> Optional[str]:
    """One sentence when `found` speaks another protocol than this SDK, else None."""
    if found.protocol is None or found.protocol == PROTOCOL_VERSION:
        return None
    return (f"{found.describe()} speaks adapter protocol {found.protocol}, and this kvcheck-adapter {__version__} "
            f"speaks protocol {PROTOCOL_VERSION}: install the SDK of the same version as kvcheck "
            f"(pip install ./python from kvcheck {found.version}'s sources) or use a kvcheck {__version__}")


def locate_kvcheck(explicit: Optional[str] = None, check_protocol: bool = True) -> Kvcheck:
    """The kvcheck to run (see the module doc). KvcheckNotFound when there is
    none (or an explicit path or $KVCHECK names no executable: a name given
    on purpose is never passed over silently); KvcheckMismatch when it
    speaks another protocol."""
    looked = []
    for path, found_by in _candidates(explicit):
        if not _executable(path):
            if found_by in ("the explicit path", "$" + ENVIRONMENT_VARIABLE):
                raise KvcheckNotFound(f"{found_by} names {path}, which is not an executable file")
            looked.append(f"{path} ({found_by})")
            continue
        version, protocol = _version_of(path)
        found = Kvcheck(os.path.abspath(path), found_by, version, protocol)
        problem = mismatch_message(found) if check_protocol else None
        if problem:
            raise KvcheckMismatch(problem)
        return found
    places = "; ".join(["an explicit path: none given", f"${ENVIRONMENT_VARIABLE}: not set", "PATH: no kvcheck"] + looked)
    raise KvcheckNotFound(f"no kvcheck binary (looked at {places}). To get one: {HOW_TO_GET_ONE}")


__all__ = ["Kvcheck", "KvcheckMismatch", "KvcheckNotFound", "locate_kvcheck", "mismatch_message"]
