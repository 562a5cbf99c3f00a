"""kvcheck on the store over real transformers, through the process
boundary, as a user runs it:

    kvcheck run --adapter python/examples/transformers_memory_adapter.py --model <domain>

The kvcheck binary is $KVCHECK, else the repository's default build. A
kvcheck that knows the model domain (`run --model`) checks the fixed store
(every property holds) and each bug; one that predates it is told to leave
out the capability it does not know (--no-layout-capability) and, knowing
no domain, draws caches the model cannot run over: the test then checks
that it accepts the adapter and that the first engine error is one of
those, named."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ADAPTER, PYTHON_DIR, REPO, require_transformers

require_transformers()

import transformers_memory  # noqa: E402
from kvcheck_adapter import hf  # noqa: E402

# The property that names each bug of transformers_memory.BUGS, as
# adapter_tests/test_example.py names activation_memory's, but for
# shallow_clone: there the example's clones carry the owned marker whatever
# they share, and clone-independent is what sees them; here the marker is
# derived from what the store holds, and the first thing a shallow copy
# breaks is stored-immutable (the copy get_cache hands out shares the
# entry's storage: a trace counts against the property it breaks first).
BUGS = {
    "stored_to_generation": "stored-immutable",
    "single_id_returns_stored": "stored-immutable",
    "merge_uninitialized": "merge-correct",
    "shallow_clone": "stored-immutable",
    "double_copy": "single-copy",
}


def kvcheck_binary():
    found = os.environ.get("KVCHECK") or os.path.join(REPO, "build", "default", "bin", "kvcheck")
    if not os.path.isfile(found):
        pytest.skip(f"no kvcheck binary at {found} (build it, or set $KVCHECK)")
    return found


def knows_model_domain(binary):
    help_text = subprocess.run([binary, "run", "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    return "--model" in help_text


def run(tmp_path, adapter_args, *args):
    binary = kvcheck_binary()
    report = tmp_path / "report.json"
    domain = hf.domain_text(hf.model_domain(hf.tiny_model()))
    new = knows_model_domain(binary)
    adapter = " ".join([ADAPTER] + list(adapter_args) + ([] if new else ["--no-layout-capability"]))
    # --timeout: starting Python with torch and transformers takes seconds,
    # more on a loaded machine, and kvcheck counts it as the first step's.
    command = [binary, "run", "--adapter", adapter, "--python", sys.executable, "--jobs", "2", "--timeout", "120", "--quiet"]
    command += (["--model", domain] if new else []) + list(args)
    command += ["--report", "json", "--out", str(report), "--trace-dir", str(tmp_path / "traces")]
    # The adapter imports the transformers these tests import, wherever
    # kvcheck starts it.
    import transformers

    paths = [os.path.dirname(os.path.dirname(os.path.abspath(transformers.__file__))), PYTHON_DIR]
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    completed = subprocess.run(
        command, cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=1800
    )
    assert report.is_file(), completed.stdout + completed.stderr
    with open(report) as file:
        found = json.load(file)
    return new, completed, found["adapters"][0]


def verdicts(report):
    return {p["id"]: p for p in report["properties"]}


def test_the_fixed_store_under_kvcheck(tmp_path):
    if knows_model_domain(kvcheck_binary()):
        new, completed, report = run(tmp_path, [], "--cases", "40")
    else:  # one property: the first generation meets a cache outside the domain
        new, completed, report = run(tmp_path, [], "--property", "stored-immutable", "--cases", "20")
    results = verdicts(report)
    if new:
        assert completed.returncode == 0, completed.stdout + completed.stderr
        assert {p["verdict"] for p in results.values()} == {"pass"}, results
        return
    # A kvcheck without the model domain: the adapter is accepted, and what
    # stops the search is a cache outside the model's domain, named.
    assert completed.returncode == 1, completed.stdout + completed.stderr
    error = results["engine-error"]
    assert error["verdict"] == "fail", error
    assert "OutsideDomain" in error["message"], error["message"]


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_each_bug_is_caught_by_the_property_that_names_it(tmp_path, bug):
    binary = kvcheck_binary()
    if not knows_model_domain(binary):
        pytest.skip(f"{binary} has no run --model: it draws caches the model cannot run over")
    if bug in transformers_memory.unavailable_bugs():
        pytest.skip(transformers_memory.unavailable_bugs()[bug])
    prop = BUGS[bug]
    _, completed, report = run(tmp_path, ["--bug", bug], "--property", prop, "--cases", "400")
    assert completed.returncode == 1, completed.stdout + completed.stderr
    result = verdicts(report)[prop]
    assert result["verdict"] == "fail" and result["fault"] is None, result
