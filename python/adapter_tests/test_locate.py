"""kvcheck_adapter.locate: which kvcheck the SDK runs, how it says so, and
one message for a kvcheck that speaks another protocol."""

import os
import stat

import pytest

from conftest import kvcheck_binary
import kvcheck_adapter
from kvcheck_adapter import locate
from kvcheck_adapter.protocol import PROTOCOL_VERSION


def fake_kvcheck(directory, version_text):
    path = os.path.join(directory, "kvcheck")
    with open(path, "w") as file:
        file.write(f"#!/bin/sh\nprintf '{version_text}'\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


def test_the_build_speaks_this_sdks_version_and_protocol():
    found = locate.locate_kvcheck(kvcheck_binary())
    assert (found.version, found.protocol) == (kvcheck_adapter.__version__, PROTOCOL_VERSION)
    assert found.describe() == f"kvcheck {found.version} at {found.path} (found by the explicit path)"


def test_the_environment_variable_then_path(scratch_dir, monkeypatch):
    path = fake_kvcheck(scratch_dir, f"kvcheck 0.1.0\\nreport format 2, adapter protocol {PROTOCOL_VERSION}\\n")
    monkeypatch.setenv("KVCHECK", path)
    assert locate.locate_kvcheck().found_by == "$KVCHECK"
    monkeypatch.delenv("KVCHECK")
    monkeypatch.setenv("PATH", scratch_dir)
    assert locate.locate_kvcheck().found_by == "PATH"


def test_none_found_says_where_it_looked_and_what_to_do(scratch_dir, monkeypatch):
    monkeypatch.delenv("KVCHECK", raising=False)
    monkeypatch.setenv("PATH", scratch_dir)
    monkeypatch.setattr(locate, "_SOURCE_TREE", scratch_dir)  # not a source tree: no build to fall back on
    with pytest.raises(locate.KvcheckNotFound) as missing:
        locate.locate_kvcheck()
    assert "$KVCHECK: not set" in str(missing.value) and "set $KVCHECK=/path/to/kvcheck" in str(missing.value)
    monkeypatch.setenv("KVCHECK", os.path.join(scratch_dir, "nothing"))
    with pytest.raises(locate.KvcheckNotFound, match=r"\$KVCHECK names .*nothing, which is not an executable"):
        locate.locate_kvcheck()


def test_another_protocol_is_one_message(scratch_dir):
    path = fake_kvcheck(scratch_dir, "kvcheck 9.0.0\\nreport format 9, adapter protocol 99\\n")
    with pytest.raises(locate.KvcheckMismatch) as mismatch:
        locate.locate_kvcheck(path)
    assert str(mismatch.value) == (
        f"kvcheck 9.0.0 at {path} (found by the explicit path) speaks adapter protocol 99, and this kvcheck-adapter "
        f"{kvcheck_adapter.__version__} speaks protocol {PROTOCOL_VERSION}: install the SDK of the same version as "
        f"kvcheck (pip install ./python from kvcheck 9.0.0's sources) or use a kvcheck {kvcheck_adapter.__version__}")
