"""Declared store contracts across policies (docs/semantics.md, "Declared
store contracts"), over the wire: a store bounded by items under lru, fifo,
lrs and none (it refuses the add), and one bounded by bytes under lru (an
item larger than the capacity goes at once), each as it declares, pass
eviction-as-declared, stored-immutable and store-contract; a fifo store
that evicts by recency, and an lrs store whose overwrite keeps its place,
fail eviction-as-declared, naming the entries."""

# kvcheck-test-pythons: torch2

import os

import pytest

from conftest import HERE

POLICY_ADAPTER = os.path.join(HERE, "policy_adapter.py")
CHECKED = ["--property", "eviction-as-declared", "--property", "stored-immutable", "--property", "store-contract"]


@pytest.mark.parametrize("policy", ["lru", "fifo", "lrs", "none", "lru-bytes"])
def test_a_store_that_evicts_as_it_declares_passes(kvcheck, monkeypatch, policy):
    monkeypatch.setenv("KVCHECK_TEST_POLICY", policy)
    run = kvcheck("run", "--adapter", POLICY_ADAPTER, *CHECKED, "--cases", "60", "--replays", "1")
    assert run.status == 0, run.stdout + run.stderr
    verdicts = {p["id"]: p["verdict"] for p in run.report["properties"] if p["id"] in CHECKED}
    assert set(verdicts.values()) == {"pass"}, verdicts


# The lrs store's bug differs from its policy only where an entry is
# overwritten before an eviction: at the default seed the search meets it
# after 184 traces (measured), the fifo store's within 100.
@pytest.mark.parametrize("policy, bug, cases, named", [
    ("fifo", "evicts_lru", "100", "(the first stored first; declared: 3 items, eviction fifo)"),
    ("lrs", "evicts_fifo", "200", "(the least recently stored first; declared: 3 items, eviction lrs)"),
])
def test_a_store_evicting_against_its_policy_fails_eviction_as_declared(kvcheck, monkeypatch, policy, bug, cases, named):
    monkeypatch.setenv("KVCHECK_TEST_POLICY", policy)
    monkeypatch.setenv("KVCHECK_TEST_POLICY_BUG", bug)
    run = kvcheck("run", "--adapter", POLICY_ADAPTER, "--property", "eviction-as-declared", "--cases", cases,
                  "--failures", "1")
    assert run.status == 1, run.stdout + run.stderr
    result = run.result("eviction-as-declared")
    assert result["verdict"] == "fail", result
    assert named in result["message"], result["message"]
