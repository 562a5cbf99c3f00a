"""kvcheck on the store over real transformers, through the process
boundary, as a user runs it:

    kvcheck run --adapter python/examples/transformers_memory_adapter.py --model <domain>

The kvcheck binary is $KVCHECK, else the repository's default build. The
adapter declares its model's domain in the handshake, so every cache kvcheck
draws is one the model runs over: the fixed store holds every property, and
each bug is caught by the property that names it."""

import glob
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ADAPTER, PYTHON_DIR, REPO, require_transformers

require_transformers()

import transformers_memory  # noqa: E402
from kvcheck_adapter import hf  # noqa: E402
from kvcheck_adapter import zygote  # noqa: E402

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


def locked_versions():
    """The versions scripts/bootstrap installs: one lock file each."""
    locks = glob.glob(os.path.join(PYTHON_DIR, "requirements", "transformers-*.txt"))
    names = (re.fullmatch(r"transformers-(.*)\.txt", os.path.basename(lock)).group(1) for lock in locks)
    return sorted(names, key=lambda v: tuple(int(part) for part in v.split(".")))


def is_newest():
    import transformers

    return transformers.__version__ == locked_versions()[-1]


def searched_here():
    """The bug searches run on the newest locked version only: each is a
    400-trace search through a real model (minutes of CI per version), and
    what differs between versions - how each bug is made and seen in that
    version's caches - is tested per version, without a search, by
    test_transformers_memory.py. The fixed store's search runs on every
    version: its pass is the verdict each version must get."""
    import transformers

    if not is_newest():
        pytest.skip(f"run on transformers {locked_versions()[-1]} only (this is {transformers.__version__})")


def kvcheck_binary():
    found = os.environ.get("KVCHECK") or os.path.join(REPO, "build", "default", "bin", "kvcheck")
    if not os.path.isfile(found):
        pytest.skip(f"no kvcheck binary at {found} (build it, or set $KVCHECK)")
    return found


def kvcheck_environment():
    """kvcheck's environment: the adapter imports the transformers these
    tests import, wherever kvcheck starts it."""
    import transformers

    paths = [os.path.dirname(os.path.dirname(os.path.abspath(transformers.__file__))), PYTHON_DIR]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths))


# The zygote of the file's runs, while it runs (adapter_zygote).
ZYGOTES = []


@pytest.fixture(scope="module", autouse=True)
def adapter_zygote():
    """On the newest version, which runs a search per bug: one interpreter
    with torch and transformers imported for the file's kvcheck runs, each
    run's adapter processes copies of it (kvcheck_adapter/zygote.py; CI
    time: about 4 CPU-s of imports a run). The older versions run one."""
    if not is_newest() or not os.path.isfile(os.environ.get("KVCHECK") or os.path.join(REPO, "build", "default", "bin",
                                                                                         "kvcheck")):
        yield
        return
    started = zygote.for_kvcheck(kvcheck_binary(), zygote.TRANSFORMERS_MODULES + ("kvcheck_adapter.crash",),
                                 kvcheck_environment(), PYTHON_DIR)
    ZYGOTES.append(started)
    try:
        yield
    finally:
        ZYGOTES.remove(started)
        started.close()


def run(tmp_path, adapter_args, *args):
    binary = kvcheck_binary()
    report = tmp_path / "report.json"
    adapter = " ".join([ADAPTER] + list(adapter_args))
    environment = kvcheck_environment()
    python = sys.executable
    for started in ZYGOTES:
        environment.update(started.variables())
        python = started.python
    # --timeout: starting Python with torch and transformers takes seconds,
    # more on a loaded machine, and kvcheck counts it as the first step's.
    command = [binary, "run", "--adapter", adapter, "--python", python, "--jobs", "2", "--timeout", "120", "--quiet"]
    command += list(args) + ["--report", "json", "--out", str(report), "--trace-dir", str(tmp_path / "traces")]
    completed = subprocess.run(
        command, cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=1800
    )
    for started in ZYGOTES:
        # Every adapter process ran in a copy: one started cold would cost the imports.
        assert "cold:" not in started.log(), started.log()
    assert report.is_file(), completed.stdout + completed.stderr
    with open(report) as file:
        found = json.load(file)
    return completed, found["adapters"][0]


def verdicts(report):
    """The properties that apply: not the paged family's (n/a, skipped)."""
    return {p["id"]: p for p in report["properties"]
            if not (p["verdict"] == "skipped" and (p["message"] or "").startswith("n/a"))}


def test_the_fixed_store_under_kvcheck(tmp_path):
    # The model's domain comes from the adapter's handshake (no --model).
    # 40 traces a property on the newest version, 10 on the older ones (CI
    # time: the run is most of this file's), whose layouts the rest of the
    # files test without a search.
    completed, report = run(tmp_path, [], "--cases", "40" if is_newest() else "10")
    results = verdicts(report)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert results.pop("trim-exact")["verdict"] == "skipped", results  # the store has no Adapter.trim: nothing is trimmed
    assert results.pop("batch-exact")["verdict"] == "skipped", results  # nor Adapter.batch: nothing is batched
    assert results.pop("lease-respected")["verdict"] == "skipped", results  # nor lease_ttl_ms: nothing is leased
    assert {p["verdict"] for p in results.values()} == {"pass"}, results
    assert report["domain"] == hf.domain_text(hf.model_domain(hf.tiny_model())).replace(",", " "), report["domain"]


def test_the_domain_given_on_the_command_line_is_the_one_searched(tmp_path):
    searched_here()  # kvcheck's option, the same on every version
    domain = hf.domain_text(hf.model_domain(hf.tiny_model()))
    completed, report = run(tmp_path, [], "--model", domain, "--property", "store-contract", "--cases", "10")
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert verdicts(report)["store-contract"]["verdict"] == "pass"


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_each_bug_is_caught_by_the_property_that_names_it(tmp_path, bug):
    searched_here()
    if bug in transformers_memory.unavailable_bugs():
        pytest.skip(transformers_memory.unavailable_bugs()[bug])
    prop = BUGS[bug]
    completed, report = run(tmp_path, ["--bug", bug], "--property", prop, "--cases", "400", "--failures", "1")
    assert completed.returncode == 1, completed.stdout + completed.stderr
    result = verdicts(report)[prop]
    assert result["verdict"] == "fail" and result["fault"] is None, result
