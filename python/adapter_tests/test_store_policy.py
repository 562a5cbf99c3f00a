"""Declared store contracts across policies (docs/semantics.md, "Declared
store contracts"), over the wire: a store bounded by items under lru, fifo
and none (it refuses the add), and one bounded by bytes under lru (an
item larger than the capacity goes at once), each as it declares, pass
eviction-as-declared, stored-immutable and store-contract; a fifo store
that evicts by recency fails eviction-as-declared, naming the entries."""

# kvcheck-test-pythons: torch2

import os

import pytest

from conftest import HERE

POLICY_ADAPTER = os.path.join(HERE, "policy_adapter.py")
CHECKED = ["--property", "eviction-as-declared", "--property", "stored-immutable", "--property", "store-contract"]


@pytest.mark.parametrize("policy", ["lru", "fifo", "none", "lru-bytes"])
def test_a_store_that_evicts_as_it_declares_passes(kvcheck, monkeypatch, policy):
    monkeypatch.setenv("KVCHECK_TEST_POLICY", policy)
    run = kvcheck("run", "--adapter", POLICY_ADAPTER, *CHECKED, "--cases", "60", "--replays", "1")
    assert run.status == 0, run.stdout + run.stderr
    verdicts = {p["id"]: p["verdict"] for p in run.report["properties"] if p["id"] in CHECKED}
    assert set(verdicts.values()) == {"pass"}, verdicts


def test_a_fifo_store_evicting_by_recency_fails_eviction_as_declared(kvcheck, monkeypatch):
    monkeypatch.setenv("KVCHECK_TEST_POLICY", "fifo")
    monkeypatch.setenv("KVCHECK_TEST_POLICY_BUG", "evicts_lru")
    run = kvcheck("run", "--adapter", POLICY_ADAPTER, "--property", "eviction-as-declared", "--cases", "100",
                  "--failures", "1")
    assert run.status == 1, run.stdout + run.stderr
    result = run.result("eviction-as-declared")
    assert result["verdict"] == "fail", result
    assert "(the first stored first; declared: 3 items, eviction fifo)" in result["message"], result["message"]
