"""kvcheck on LMCache's L1Manager (python/adapters/lmcache_l1_manager_adapter.py;
python/README.md "Real engines"), at the verdicts recorded there, from its
pinned environment .venv/engines/lmcache-0.5.6 (scripts/bootstrap; skipped
when it is not installed): its read leases (reserve_read/finish_read, each
lock lapsing after read_ttl_seconds, read on kvcheck's virtual clock) hold
lease-respected, and the store under them every property it can be judged
on."""

import os

import pytest

from conftest import PYTHON_DIR, REPO, run_adapter, use_engine

ADAPTER = os.path.join(PYTHON_DIR, "adapters", "lmcache_l1_manager_adapter.py")
ENVIRONMENT = os.path.join(REPO, ".venv", "engines", "lmcache-0.5.6")
JUDGED = {"stored-immutable", "layout-roundtrip", "merge-correct", "owned-marker", "clone-independent",
          "generation-equivalent", "store-contract", "lease-respected", "eviction-as-declared"}


@pytest.fixture
def lmcache(monkeypatch):
    use_engine(monkeypatch, ENVIRONMENT, "LMCache")


def test_lmcache_l1_manager_holds_its_leases_and_every_property_it_can_be_judged_on(kvcheck, lmcache):
    run = run_adapter(kvcheck, ADAPTER, "--cases", "10")
    assert run.status == 0, run.stdout + run.stderr
    assert run.report["adapter"] == "lmcache-0.5.6-l1"
    verdicts = {p["id"]: p["verdict"] for p in run.applicable()}
    assert {p: verdicts.get(p) for p in JUDGED} == {p: "pass" for p in JUDGED}, verdicts
    assert verdicts.get("single-copy") == "skipped", verdicts  # copy_log false: a store copies (declared)
