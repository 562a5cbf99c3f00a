"""kvcheck on the strict example store (examples/strict_memory.py), which
raises on caches its model could not make: with its model declared it
passes every property with no engine error; undeclared, its refusals are
engine errors grouped by message, counted against the traces judged, and
no property fails; each historic bug is caught by the property that
names it in the declared domain."""

import pytest
import torch

from conftest import BUG_PROPERTIES as BUGS, STRICT_EXAMPLE

# Under one interpreter only (.venv's torch 2, as users run it), to keep CI
# short: the store is activation_memory's with checks of what it is handed,
# and test_example runs that store under both torches.
pytestmark = pytest.mark.skipif(int(torch.__version__.split(".")[0]) < 2, reason="run under torch 2 only (CI time)")

DOMAIN = "layers=2 heads=2 head_dim=4 dtype=f32 layout=modern"


def test_declared_the_store_passes_every_property_with_no_engine_error(kvcheck):
    run = kvcheck("run", "--adapter", STRICT_EXAMPLE, "--jobs", "2")
    assert run.status == 0, run.stdout + run.stderr
    assert run.report["domain"] == DOMAIN, run.report["domain"]
    verdicts = {p["id"]: p["verdict"] for p in run.applicable()}
    assert set(verdicts.values()) == {"pass"}, verdicts
    for result in run.applicable():
        if result["id"] != "engine-error":
            assert result["cases"] == 200 and result["judged"] == 200, result
    assert run.result("engine-error")["failures"] == []


def test_undeclared_its_refusals_are_engine_errors_grouped_and_counted(kvcheck):
    properties = ["merge-correct", "generation-equivalent"]
    selected = [arg for prop in properties for arg in ("--property", prop)]
    run = kvcheck("run", "--adapter", f"{STRICT_EXAMPLE} --undeclared", *selected, "--cases", "60", "--jobs", "2")
    assert run.report["domain"] == "any (undeclared)", run.report["domain"]
    unjudged = 0
    for prop in properties:
        result = run.result(prop)
        # Refused, never failed: the store's refusals are not violations.
        assert result["verdict"] in ("pass", "blocked") and result["cases"] == 60, result
        assert result["judged"] < 60, result
        unjudged += result["cases"] - result["judged"]
    errors = run.result("engine-error")
    assert errors["verdict"] == "fail" and errors["fault"] is None, errors
    # One row per message shape, whatever the numbers in the messages, each
    # with the traces it ended; together, every trace not judged.
    groups = errors["failures"]
    assert 1 <= len(groups) < unjudged and sum(group["count"] for group in groups) == unjudged, groups
    assert all("not a cache of the model" in group["message"] for group in groups), groups
    assert all(group["trace"] and group["reproduce"] for group in groups[:1]), groups


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_each_bug_is_caught_by_the_property_that_names_it(kvcheck, bug):
    prop = BUGS[bug]
    run = kvcheck("run", "--adapter", f"{STRICT_EXAMPLE} --bug {bug}", "--property", prop, "--cases", "400",
                  "--failures", "1")
    assert run.status == 1, run.stdout + run.stderr
    result = run.result(prop)
    assert result["verdict"] == "fail" and result["fault"] is None, result
    assert result["trace"] and result["reproduce"], result
    assert run.result("engine-error")["failures"] == [], run.result("engine-error")
