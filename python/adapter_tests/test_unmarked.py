"""An engine without an owned marker (capability "owned_marker" false):
kvcheck derives "owned" from storage identities, so a correct store whose
caches carry no `owned` attribute holds owned-marker, and one that hands
out a stored cache as its copy is still caught (docs/semantics.md#ownership)."""

import os

import activation_memory
from kvcheck_adapter import content, protocol
from kvcheck_adapter.adapter import Server, capabilities_of

from conftest import HERE
from unmarked_adapter import UnmarkedAdapter

UNMARKED = os.path.join(HERE, "unmarked_adapter.py")


def spec(text):
    return content.expand(content.parse_cache_spec(text))


def test_the_adapter_declares_no_marker_and_its_caches_carry_none():
    adapter = UnmarkedAdapter()
    assert capabilities_of(adapter)["owned_marker"] is False
    hello = Server(UnmarkedAdapter).handle({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})
    assert hello["capabilities"]["owned_marker"] is False
    stored = adapter.make_cache(spec("modern/f32/1:[kv3 kv2]"))
    adapter.add("a", stored, {})
    copy, clone = adapter.get_cache(["a"]), adapter.clone(stored)
    merged = adapter.concat([stored, stored])
    for cache in (stored, copy, clone, merged, adapter.to_legacy(copy), adapter.from_legacy(adapter.to_legacy(stored))):
        assert not hasattr(cache, "owned"), cache
    # The store knows its copies without a marker: its boundary uses one as it is.
    assert copy in adapter.store.copies and stored not in adapter.store.copies


def test_an_adapter_without_a_marker_passes_owned_marker_through_kvcheck(kvcheck):
    run = kvcheck("run", "--adapter", UNMARKED, "--property", "owned-marker", "--property", "single-copy",
                  "--property", "stored-immutable", "--cases", "150")
    assert run.status == 0, run.stdout + run.stderr
    assert run.report["adapter"] == "unmarked-memory"
    for prop in ("owned-marker", "single-copy", "stored-immutable"):
        assert run.result(prop)["verdict"] == "pass", run.result(prop)


def test_the_derived_marker_catches_a_stored_cache_handed_out_as_a_copy(kvcheck, scratch_dir):
    # A stored cache handed out by get_cache breaks stored-immutable first, at
    # the same step: a search would report it under that property, so the
    # trace is replayed with owned-marker alone.
    assert "single_id_returns_stored" in activation_memory.BUGS
    trace = os.path.join(scratch_dir, "stored-as-copy.trace")
    with open(trace, "w") as file:
        file.write("add a modern/f32/0:[kv3 kv2]\nh1 = get_cache a\n")
    fixed = kvcheck("replay", trace, "--property", "owned-marker", "--adapter", UNMARKED)
    assert fixed.status == 0, fixed.stdout + fixed.stderr
    buggy = kvcheck("replay", trace, "--property", "owned-marker", "--adapter", f"{UNMARKED} --bug single_id_returns_stored")
    assert buggy.status == 1, buggy.stdout + buggy.stderr
    assert ('ERROR: owned-marker: the copy h1 is not owned: it shares one storage with stored entry "a" '
            "(the engine keeps no owned marker: owned is derived") in buggy.stdout, buggy.stdout
