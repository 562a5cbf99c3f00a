"""kvcheck on the strict example store (examples/strict_memory.py), which
raises on caches its model could not make: with its model declared it
passes every property with no engine error; undeclared, its refusals are
engine errors grouped by message, counted against the traces judged, and
no property fails or is blocked (the traces are judged without the
operations refused); each historic bug is caught by the property that
names it in the declared domain."""

import pytest

from conftest import BUG_PROPERTIES as BUGS, STRICT_EXAMPLE

# Under one interpreter only (.venv's torch 2, as users run it), to keep CI
# short: the store is activation_memory's with checks of what it is handed,
# and test_example runs that store under both torches.
# kvcheck-test-pythons: torch2

DOMAIN = "layers=2 heads=2 head_dim=4 dtype=f32 layout=modern"


def test_declared_the_store_passes_every_property_with_no_engine_error(kvcheck):
    # 60 traces a property in CI; the default budget (200) and 10x, over
    # three seeds, are bench/python/strict_bench.py's (BENCHMARKS.md).
    run = kvcheck("run", "--adapter", STRICT_EXAMPLE, "--cases", "60", "--jobs", "2")
    assert run.status == 0, run.stdout + run.stderr
    assert run.report["domain"] == DOMAIN, run.report["domain"]
    verdicts = {p["id"]: p["verdict"] for p in run.applicable()}
    assert verdicts.pop("trim-exact") == "skipped", verdicts  # the store has no Adapter.trim: nothing is trimmed
    assert verdicts.pop("batch-exact") == "skipped", verdicts  # nor Adapter.batch: nothing is batched
    assert verdicts.pop("lease-respected") == "skipped", verdicts  # nor lease_ttl_ms: nothing is leased
    assert set(verdicts.values()) == {"pass"}, verdicts
    for result in run.applicable():
        if result["id"] not in ("engine-error", "shared-state", "trim-exact", "batch-exact", "lease-respected"):  # the engine-level rows, and three skipped
            assert result["cases"] == 60 and result["judged"] == 60, result
    assert run.result("engine-error")["failures"] == []


def test_undeclared_its_refusals_are_engine_errors_grouped_and_counted(kvcheck):
    properties = ["merge-correct", "generation-equivalent"]
    selected = [arg for prop in properties for arg in ("--property", prop)]
    run = kvcheck("run", "--adapter", f"{STRICT_EXAMPLE} --undeclared", *selected, "--cases", "60", "--jobs", "2")
    assert run.report["domain"] == "any (undeclared)", run.report["domain"]
    for prop in properties:
        result = run.result(prop)
        # Refused, never failed: the store's refusals are not violations,
        # and each trace a refusal ended is judged without the operations
        # refused: at least 90 % of the traces are judged, none blocked.
        assert result["verdict"] == "pass" and result["cases"] == 60, result
        assert result["judged"] >= 54, result
    errors = run.result("engine-error")
    assert errors["verdict"] == "fail" and errors["fault"] is None, errors
    # One row per message shape, whatever the numbers in the messages, each
    # with the traces it raised in.
    groups = errors["failures"]
    raised = sum(group["count"] for group in groups)
    assert 1 <= len(groups) < raised, groups
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
