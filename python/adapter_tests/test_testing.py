"""check_engine, the one call a Python project's tests make: it passes
quietly on a correct engine and fails with kvcheck's report on a bug."""

import os

import pytest

from conftest import kvcheck_binary
import activation_memory_adapter
from kvcheck_adapter.testing import KvcheckError, check_engine


def test_a_correct_engine_passes_and_the_report_is_returned():
    report = check_engine(activation_memory_adapter.ActivationMemoryAdapter, kvcheck=kvcheck_binary(),
                          properties=["single-copy", "clone-independent"], cases=20)
    assert [(p["id"], p["verdict"]) for p in report["properties"]] == [
        ("single-copy", "pass"), ("clone-independent", "pass"), ("engine-error", "pass"), ("shared-state", "pass")]


def test_a_bug_fails_with_the_report():
    with pytest.raises(AssertionError) as failure:
        check_engine(activation_memory_adapter.ActivationMemoryAdapter, args=[["shallow_clone"]],
                     kvcheck=kvcheck_binary(), properties=["clone-independent"], cases=300)
    text = str(failure.value)
    assert "adapter activation-memory+shallow_clone fails" in text
    assert "ERROR: clone-independent:" in text and "shares one storage with its source" in text
    assert "reproduce: kvcheck replay" in text


def test_an_adapter_kvcheck_cannot_start_is_an_error(scratch_dir):
    with pytest.raises(KvcheckError, match="exit status 2"):
        check_engine(f"{scratch_dir}/missing.py", kvcheck=kvcheck_binary(), cases=1)


def test_a_local_class_cannot_be_served():
    class Local(activation_memory_adapter.ActivationMemoryAdapter):
        pass

    with pytest.raises(ValueError, match="cannot be served from another process"):
        check_engine(Local, kvcheck=kvcheck_binary())


def test_the_build_trees_kvcheck_is_found_without_path_or_environment(monkeypatch, scratch_dir):
    from conftest import REPO
    from kvcheck_adapter.testing import find_kvcheck

    monkeypatch.delenv("KVCHECK", raising=False)
    monkeypatch.setenv("PATH", scratch_dir)  # no kvcheck on PATH
    assert find_kvcheck() == os.path.join(REPO, "build", "default", "bin", "kvcheck")
