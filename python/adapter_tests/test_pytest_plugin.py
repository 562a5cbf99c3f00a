"""The pytest plugin (kvcheck_adapter.pytest_plugin), run by pytester the way
a user runs it: each property an item, a violation a FAILED item whose text
is kvcheck's report, -k selecting, the options passed through to kvcheck."""

import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree

import pytest

from conftest import EXAMPLE, PYTHON_DIR, kvcheck_binary

PAGED_EXAMPLE = os.path.join(PYTHON_DIR, "examples", "block_manager_adapter.py")

pytest_plugins = ["pytester"]
PLUGIN = ["-p", "kvcheck_adapter.pytest_plugin"]


@pytest.fixture(autouse=True)
def sdk_importable(monkeypatch):
    """The pytest processes import the SDK from the source tree."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [PYTHON_DIR, os.environ.get("PYTHONPATH")])))


@pytest.fixture(autouse=True)
def nothing_left(pytester):
    """pytester's directory (the runs' files, traces and reports) goes with
    the test: pytest would keep the last runs' around."""
    yield
    shutil.rmtree(str(pytester.path), ignore_errors=True)


@pytest.fixture
def run(pytester):
    """pytest with the plugin (the entry point loads it once installed; here
    it is named), kvcheck the build's, traces in pytester's directory."""
    def run_pytest(*args):
        # --kvcheck-bin=PATH: as two words, pytest would take PATH for a test
        # path when it picks the rootdir.
        return pytester.runpytest_subprocess(*PLUGIN, "--kvcheck-bin=" + kvcheck_binary(), "-p", "no:cacheprovider",
                                             *args)
    return run_pytest


@pytest.fixture(scope="module")
def collected():
    """One `pytest --collect-only -q` of the example store and the example
    block manager together (CI time: one pytest and one `kvcheck list` an
    adapter, not three pytests listing the store twice), run as `run` runs
    pytest: collected(adapter) is a LineMatcher of the lines that name
    that adapter."""
    directory = tempfile.mkdtemp(prefix="kvcheck-plugin-test-")
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [PYTHON_DIR, os.environ.get("PYTHONPATH")])))
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", *PLUGIN, "--kvcheck-bin=" + kvcheck_binary(), "-p",
                               "no:cacheprovider", "--kvcheck-adapter", EXAMPLE, "--kvcheck-adapter", PAGED_EXAMPLE,
                               "--collect-only", "-q"], cwd=directory, env=environment, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=900)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return lambda adapter: pytest.LineMatcher([line for line in done.stdout.splitlines()
                                               if os.path.basename(adapter) in line])


def test_each_property_is_an_item_and_k_selects(run, collected):
    result = run("--kvcheck-adapter", EXAMPLE, "--kvcheck-cases", "5", "-v", "-k", "single-copy or stored-immutable")
    result.assert_outcomes(passed=2, deselected=result.parseoutcomes()["deselected"])
    result.stdout.fnmatch_lines(["kvcheck: kvcheck * at * (found by the explicit path)",
                                 "*activation_memory_adapter.py::stored-immutable PASSED*",
                                 "*activation_memory_adapter.py::single-copy PASSED*"])
    names = [line.split("::")[1] for line in collected(EXAMPLE).lines if "::" in line]
    assert "single-copy" in names and "engine-error" in names and "shared-state" in names, names
    assert len(names) == len(set(names)) > 5, names


@pytest.mark.parametrize("adapter, kept, left_out, why", [
    (EXAMPLE, "single-copy", ["refcount-exact", "eviction-as-declared"],
     "of the other cache family (paged or contiguous), 1 judging a capacity, and none is declared"),
    (PAGED_EXAMPLE, "refcount-exact", ["single-copy", "stored-immutable"], "of the other cache family (paged or contiguous)"),
])
def test_properties_an_adapter_cannot_be_judged_on_are_not_collected(collected, adapter, kept, left_out, why):
    """Issue 42, item 4: a contiguous store collected the 15 paged rows (and
    a paged block manager the contiguous ones) as SKIPPED items; they are
    left out, and one line says how many and why, as the reports say it."""
    lines = collected(adapter)
    names = [line.split("::")[1] for line in lines.lines if "::" in line]
    assert kept in names and "engine-error" in names, names
    assert not set(left_out) & set(names), names
    lines.fnmatch_lines([f"kvcheck: *{os.path.basename(adapter)}: * properties left out, n/a for this adapter: *{why}*"])


def test_a_violation_fails_with_the_shrunk_trace_and_the_replay_command(run, pytester):
    result = run("--kvcheck-adapter", f"{EXAMPLE} --bug shallow_clone", "--kvcheck-cases", "300", "--kvcheck-seed",
                 "5", "--kvcheck-args", "--failures 1", "-k", "clone-independent", "--junitxml", "report.xml")
    result.assert_outcomes(failed=1, deselected=result.parseoutcomes()["deselected"])
    text = result.stdout.str()
    assert "kvcheck: clone-independent fails on" in text and "(seed 5)" in text, text
    assert "ERROR: clone-independent:" in text and "shares one storage with its source" in text, text
    assert "shrunk trace:" in text and "reproduce: kvcheck replay" in text, text
    assert "Traceback" not in text, text
    result.stdout.fnmatch_lines(["FAILED *activation_memory_adapter.py?--bug shallow_clone?::clone-independent*"])
    # The replay command names a trace file the run kept.
    trace_file = next(word for line in result.stdout.lines if "reproduce: kvcheck replay" in line
                      for word in line.split() if word.endswith(".trace"))
    assert os.path.isfile(os.path.join(str(pytester.path), trace_file)), trace_file
    cases = ElementTree.parse(os.path.join(str(pytester.path), "report.xml")).getroot().iter("testcase")
    # (pytest 7 names the testcase by the whole node id past the file, pytest 9 by the item's name.)
    failed = [case.get("name") for case in cases if case.find("failure") is not None]
    assert len(failed) == 1 and failed[0].endswith("clone-independent"), failed


def test_a_test_file_names_its_adapter_with_the_marker(run, pytester):
    pytester.makepyfile(test_store=f"""
        import pytest

        @pytest.mark.kvcheck({EXAMPLE!r}, cases=5)
        def test_store(kvcheck_property):
            kvcheck_property.check()
    """)
    result = run("-v", "-k", "single-copy")
    result.assert_outcomes(passed=1, deselected=result.parseoutcomes()["deselected"])
    result.stdout.fnmatch_lines(["*test_store.py::test_store?single-copy? PASSED*"])


def test_no_kvcheck_is_one_message_saying_what_to_do(pytester, scratch_dir):
    missing = os.path.join(scratch_dir, "kvcheck")
    result = pytester.runpytest_subprocess(*PLUGIN, "--kvcheck-bin", missing, "--kvcheck-adapter", EXAMPLE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*the explicit path names {missing}, which is not an executable file*"])


def test_options_the_plugin_sets_itself_are_a_usage_error(run):
    """--kvcheck-args "--report html" made kvcheck write HTML where the
    plugin reads JSON: every item failed with a JSONDecodeError traceback
    (issue 43, D23)."""
    for args, named in (("--report html", "--report"), ("--out=r.json", "--out"), ("--trace-dir t", "--trace-dir")):
        result = run("--kvcheck-adapter", EXAMPLE, "--kvcheck-args=" + args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, (args, result.stdout.str(), result.stderr.str())
        result.stderr.fnmatch_lines([f"*--kvcheck-args may not hold {named}: the kvcheck plugin sets it itself*"])
        assert "JSONDecodeError" not in result.stdout.str() + result.stderr.str()
