"""kvcheck on transformers' own cache classes (python/adapters/
transformers_caches_adapter.py; python/README.md "Real engines"), at the
verdicts recorded there, with transformers 5.25.0 from its pinned
environment (.venv/transformers/5.25.0; skipped when it is not installed):
a store of StaticCaches holds every contiguous property (trim-exact too:
the adapter's trim is transformers' crop); generating with
prompt lookup decoding from a stored cache breaks generation-equivalent,
transformers' own bug (docs/findings/transformers-1.md): an expected FAIL,
so that an upstream fix shows up here as a change."""

import os

import pytest

from conftest import PYTHON_DIR, REPO

ADAPTER = os.path.join(PYTHON_DIR, "adapters", "transformers_caches_adapter.py")
VERSION = "5.25.0"
# Small budgets (ctest label real-engines): each run is seconds of CPU.
CASES = "6"
STORE_PROPERTIES = {"stored-immutable", "single-copy", "layout-roundtrip", "merge-correct", "owned-marker",
                    "clone-independent", "generation-equivalent", "store-contract", "trim-exact"}


@pytest.fixture
def transformers_env(monkeypatch):
    environment = os.path.join(REPO, ".venv", "transformers", VERSION)
    if not os.path.isdir(environment):
        pytest.skip(f"transformers {VERSION} is not installed at {environment} (scripts/bootstrap installs it)")
    monkeypatch.setenv("PYTHONPATH", environment)


def test_a_store_of_static_caches_holds_every_store_property(kvcheck, transformers_env):
    run = kvcheck("run", "--adapter", ADAPTER + " --cache static", "--cases", CASES, "--jobs", "2")
    assert run.status == 0, run.stdout + run.stderr
    verdicts = {p["id"]: p["verdict"] for p in run.applicable() if p["id"] in STORE_PROPERTIES}
    assert verdicts == {p: "pass" for p in STORE_PROPERTIES}, verdicts
    assert run.report["adapter"] == f"transformers-{VERSION}-static"


def test_prompt_lookup_from_a_stored_cache_breaks_generation_equivalent(kvcheck, transformers_env):
    # docs/findings/transformers-1.md: assisted decoding's first forward
    # feeds the cached positions again.
    run = kvcheck("run", "--adapter", ADAPTER + " --cache dynamic --decoding prompt-lookup",
                  "--property", "generation-equivalent", "--cases", "30", "--failures", "1", "--replays", "1")
    assert run.status == 1, run.stdout + run.stderr
    result = run.result("generation-equivalent")
    assert result["verdict"] == "fail" and result["fault"] is None, result
    assert "a fresh copy gives" in result["message"], result["message"]
