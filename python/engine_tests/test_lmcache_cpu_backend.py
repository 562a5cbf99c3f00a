"""kvcheck on LMCache's CPU tier (python/adapters/lmcache_cpu_backend_adapter.py;
python/README.md "Real engines"), at the verdicts recorded there, from its
pinned environment .venv/engines/lmcache-0.5.6 (scripts/bootstrap; skipped
when it is not installed): LocalCPUBackend over its MixedMemoryAllocator
holds every property it can be judged on; bounded, it evicts exactly as its
LRU says when no caller holds an entry (--get copy), never an entry a
caller holds (get borrows), and its budget counts the memory a caller still
holds of an entry removed since: the one contract difference, asserted as
such so that a change shows."""

import os

import pytest

from conftest import PYTHON_DIR, REPO, run_adapter, use_engine

ADAPTER = os.path.join(PYTHON_DIR, "adapters", "lmcache_cpu_backend_adapter.py")
ENVIRONMENT = os.path.join(REPO, ".venv", "engines", "lmcache-0.5.6")
JUDGED = {"stored-immutable", "layout-roundtrip", "merge-correct", "owned-marker", "clone-independent",
          "generation-equivalent", "store-contract"}
BOUNDED = ("--property", "eviction-as-declared", "--property", "stored-immutable")


@pytest.fixture
def lmcache(monkeypatch):
    use_engine(monkeypatch, ENVIRONMENT, "LMCache")


def run_of(kvcheck, options, *arguments):
    return run_adapter(kvcheck, ADAPTER + options, *arguments)


def test_lmcache_cpu_backend_holds_every_property_it_can_be_judged_on(kvcheck, lmcache):
    run = run_of(kvcheck, "", "--cases", "6")
    assert run.status == 0, run.stdout + run.stderr
    verdicts = {p["id"]: p["verdict"] for p in run.applicable()}
    assert {p: verdicts.get(p) for p in JUDGED} == {p: "pass" for p in JUDGED}, verdicts
    assert verdicts.get("single-copy") == "skipped", verdicts  # copy_log false: a store copies (declared)
    assert run.report["adapter"] == "lmcache-0.5.6-cpu"


def test_lmcache_cpu_backend_bounded_evicts_least_recently_used_when_nothing_is_held(kvcheck, lmcache):
    # --get copy: a get copies out and unpins, as LMCache's retrieve does, so
    # no caller holds an entry and LMCache's LRU (a put and a lookup's touch
    # are uses; an overwrite is a new put) is kvcheck's lru exactly. Declared
    # fifo instead, it FAILs at trace 40 of these 40 (fill, add i6, add i2:
    # evicted [i7], expected [i6]; measured).
    run = run_of(kvcheck, " --capacity 2 --get copy", *BOUNDED, "--cases", "40")
    assert run.status == 0, run.stdout + run.stderr
    assert run.report["adapter"] == "lmcache-0.5.6-cpu-cap2-getcopy"
    assert run.result("eviction-as-declared")["verdict"] == "pass", run.result("eviction-as-declared")
    assert run.result("stored-immutable")["verdict"] == "pass", run.result("stored-immutable")


def test_lmcache_cpu_backend_bounded_never_evicts_a_held_entry_but_counts_held_removed_memory(kvcheck, lmcache):
    # get borrows (a pin and a reference until release), eviction declared
    # unspecified. LMCache never evicts an entry a caller holds, and what a
    # caller holds is never freed under it (stored-immutable passes); but an
    # entry removed (overwritten, deleted) while held keeps its unit of the
    # buffer until released, so LMCache evicts, or has no room, while
    # kvcheck's count of entries says there is room: the declared difference
    # (docs/semantics.md, "Real engines: declared contract differences").
    run = run_of(kvcheck, " --capacity 3", *BOUNDED, "--cases", "40", "--failures", "3")
    assert run.report["adapter"] == "lmcache-0.5.6-cpu-cap3", run.stdout + run.stderr
    assert run.result("stored-immutable")["verdict"] == "pass", run.result("stored-immutable")
    eviction = run.result("eviction-as-declared")
    assert eviction["verdict"] == "fail", eviction
    for failure in eviction["failures"]:
        assert "but the store had room" in failure["message"], failure
        assert "which a live handle holds" not in failure["message"], failure
