"""The example store over real transformers (transformers_memory.py), at the
SDK's level: through the protocol's Server in process, as kvcheck drives
it. The fixed store keeps every rule the checks here read; each historic bug
shows where kvcheck's property that names it looks."""

import copy
import os

import pytest

from conftest import require_transformers

require_transformers()

import transformers_memory as tm  # noqa: E402
import transformers_memory_adapter as tma  # noqa: E402
from kvcheck_adapter import content as c  # noqa: E402
from kvcheck_adapter import hf  # noqa: E402
from kvcheck_adapter import protocol  # noqa: E402
from kvcheck_adapter import wire  # noqa: E402
from kvcheck_adapter.adapter import Server  # noqa: E402

LAYOUT = hf.LAYOUT
SPEC_A = f"{LAYOUT}/f32/11/2x8:[kv5 kv5]"
SPEC_B = f"{LAYOUT}/f32/12/2x8:[kv3 kv3]"
PROMPT = [7, 3]
NEW_TOKENS = 3
SLOT_BYTES = 2 * 8 * 4  # a token of one slot: 2 heads of 8 float32


@pytest.fixture(scope="module")
def model():
    return hf.tiny_model()


def content_of(spec):
    return c.expand(c.parse_cache_spec(spec))


def serve(model, bugs=()):
    server = Server(lambda: tma.TransformersMemoryAdapter(bugs, model))
    hello = server.handle({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})
    assert hello["ok"], hello
    for id, spec in (("a", SPEC_A), ("b", SPEC_B)):
        reply = server.handle({"op": "add", "id": id, "metadata": {"source": id}, "cache": wire.content_json(content_of(spec))})
        assert reply["ok"], reply
    return server


def facts(reply, handle):
    return next(f for f in reply["observed"]["handles"] if f["handle"] == handle)


def view_of_entry(server, id):
    return wire.view_from_json(server.handle({"op": "view_entry", "id": id})["view"])


def storage_of_entry(server, id):
    return set(server.handle({"op": "storage_of_entry", "id": id})["storage"])


def generate(server, handle):
    return server.handle({"op": "generate", "handle": handle, "prompt": PROMPT, "max_new_tokens": NEW_TOKENS, "stream": False})


def fresh_tokens(model, content):
    return hf.generate(model, PROMPT, hf.materialize(content), NEW_TOKENS)


# ---- the handshake -------------------------------------------------------------------


def test_the_handshake_carries_the_model_domain_and_honest_capabilities(model):
    server = Server(lambda: tma.TransformersMemoryAdapter((), model))
    hello = server.handle({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})
    assert hello["model"] == hf.model_domain(model)
    assert hello["model"]["layouts"] == [LAYOUT]
    flags = hello["capabilities"]
    assert flags["legacy_layout"] == (LAYOUT == "legacy") and flags["modern_layout"] == (LAYOUT == "modern")
    assert not flags["conversions"] and not flags["half_dtypes"]
    assert flags["any_geometry"]  # 2 heads of 8: not kvcheck's default 2x4
    assert not flags["one_sided_layers"] and not flags["legacy_slot_names"] and not flags["uninitialized_layers"]
    assert flags["dump"] and flags["dump_crash"] and flags["metadata"] and not flags["generate_stream"]


def test_a_bug_that_cannot_occur_is_refused_with_the_reason(model):
    if hf.HAS_INITIALIZED_FLAG:
        assert tm.unavailable_bugs() == {}
        return
    with pytest.raises(ValueError, match="merge_uninitialized cannot occur here: .*initialized flag"):
        tm.TransformersMemory(["merge_uninitialized"], model)


# ---- the fixed store --------------------------------------------------------------------


def test_get_cache_hands_out_one_owned_copy_and_generation_copies_no_more(model):
    server = serve(model)
    entry = storage_of_entry(server, "a")
    got = server.handle({"op": "get_cache", "ids": ["a"], "out": 1})
    handle = facts(got, 1)
    assert handle["owned"] and not set(handle["storage"]) & entry
    assert wire.view_from_json(handle["view"]) == c.expected_view(content_of(SPEC_A))
    assert got["copies"] == [{"reason": "get_cache", "bytes": 2 * 2 * 5 * SLOT_BYTES}]
    reply = generate(server, 1)
    assert reply["copies"] == [] and reply["peak_live_sets"] == 2
    assert reply["tokens"] == fresh_tokens(model, content_of(SPEC_A))
    assert view_of_entry(server, "a") == c.expected_view(content_of(SPEC_A))


def test_generation_from_a_stored_item_copies_it_once_and_leaves_it_alone(model):
    server = serve(model)
    got = server.handle({"op": "get", "id": "a", "out": 2})
    assert not facts(got, 2)["owned"]  # the stored object itself
    reply = generate(server, 2)
    assert [copy["bytes"] for copy in reply["copies"]] == [2 * 2 * 5 * SLOT_BYTES] and reply["peak_live_sets"] == 2
    assert reply["tokens"] == fresh_tokens(model, content_of(SPEC_A))
    assert view_of_entry(server, "a") == c.expected_view(content_of(SPEC_A))


def test_a_merge_is_owned_true_to_length_and_generates_as_its_content(model):
    server = serve(model)
    merged = server.handle({"op": "get_cache", "ids": ["b", "a"], "out": 3})
    handle = facts(merged, 3)
    expected = c.expected_concat([content_of(SPEC_B), content_of(SPEC_A)])
    assert handle["owned"]
    assert c.view_difference(wire.view_from_json(handle["view"]), c.expected_view(expected)) == ""
    assert [copy["bytes"] for copy in merged["copies"]] == [2 * 2 * 8 * SLOT_BYTES]
    reply = generate(server, 3)
    assert reply["copies"] == [] and reply["tokens"] == fresh_tokens(model, expected)


def test_clone_concat_and_made_caches(model):
    server = serve(model)
    server.handle({"op": "get", "id": "a", "out": 1})
    clone = server.handle({"op": "clone", "source": 1, "out": 2})
    assert facts(clone, 2)["owned"] and len(clone["copies"]) == 1
    concat = server.handle({"op": "concat", "parts": [1, 2], "out": 3})
    assert facts(concat, 3)["owned"] and len(concat["copies"]) == 1
    assert generate(server, 2)["copies"] == []
    server.handle({"op": "make", "out": 4, "cache": wire.content_json(content_of(SPEC_B))})
    made = generate(server, 4)  # not a copy the store handed out: the boundary copies it
    assert len(made["copies"]) == 1 and made["tokens"] == fresh_tokens(model, content_of(SPEC_B))
    assert generate(server, 0)["copies"] == []


def test_storing_a_copy_handed_out_makes_it_stored(model):
    server = serve(model)
    server.handle({"op": "get_cache", "ids": ["a"], "out": 1})
    stored = server.handle({"op": "add_handle", "id": "c", "handle": 1})
    assert not facts(stored, 1)["owned"]
    assert not server.handle({"op": "entry_owned", "id": "c"})["owned"]
    assert len(generate(server, 1)["copies"]) == 1  # a stored object now: the boundary copies it
    assert view_of_entry(server, "c") == c.expected_view(content_of(SPEC_A))


def test_the_store_s_path_equals_a_fresh_deep_copy(model):
    store = tm.TransformersMemory(model=model)
    store.add([{"id": "a", "cache": hf.materialize(content_of(SPEC_A))}])
    stored = store.get("a").cache
    fresh = hf.generate(model, PROMPT, copy.deepcopy(stored), NEW_TOKENS)
    assert store.generate(stored, PROMPT, NEW_TOKENS) == fresh
    assert store.generate(store.get_cache(["a"]), PROMPT, NEW_TOKENS) == fresh
    assert c.view_of(store.get("a").cache) == c.expected_view(content_of(SPEC_A))


# ---- the historic bugs, each where its property looks ---------------------------------------------


def test_stored_to_generation_writes_into_the_store(model):
    server = serve(model, ["stored_to_generation"])
    server.handle({"op": "get", "id": "a", "out": 1})
    reply = generate(server, 1)
    assert reply["copies"] == []  # single-copy: a stored item's generation copies once
    assert view_of_entry(server, "a") != c.expected_view(content_of(SPEC_A))  # stored-immutable


def test_single_id_returns_stored_hands_out_the_entry(model):
    server = serve(model, ["single_id_returns_stored"])
    got = server.handle({"op": "get_cache", "ids": ["a"], "out": 1})
    handle = facts(got, 1)
    assert not handle["owned"]  # owned-marker: get_cache hands out an owned copy
    assert set(handle["storage"]) & storage_of_entry(server, "a")  # stored-immutable
    assert got["copies"] == []  # single-copy: get_cache copies once
    generate(server, 1)
    assert view_of_entry(server, "a") != c.expected_view(content_of(SPEC_A))


def test_merge_uninitialized_loses_the_merge(model):
    if not hf.HAS_INITIALIZED_FLAG:
        pytest.skip(tm.unavailable_bugs()["merge_uninitialized"])
    server = serve(model, ["merge_uninitialized"])
    merged = server.handle({"op": "get_cache", "ids": ["b", "a"], "out": 1})
    expected = c.expected_concat([content_of(SPEC_B), content_of(SPEC_A)])
    view = wire.view_from_json(facts(merged, 1)["view"])
    assert "initialized" in c.view_difference(view, c.expected_view(expected))  # merge-correct
    assert generate(server, 1)["tokens"] != fresh_tokens(model, expected)  # generation-equivalent


def test_shallow_clone_shares_the_entry_s_tensors(model):
    server = serve(model, ["shallow_clone"])
    got = server.handle({"op": "get_cache", "ids": ["a"], "out": 1})
    handle = facts(got, 1)
    assert set(handle["storage"]) & storage_of_entry(server, "a")  # stored-immutable
    assert not handle["owned"]  # owned-marker
    server.handle({"op": "get", "id": "b", "out": 2})
    clone = server.handle({"op": "clone", "source": 2, "out": 3})
    assert set(facts(clone, 3)["storage"]) & set(facts(clone, 2)["storage"])  # clone-independent


def test_double_copy_copies_a_copy_again(model):
    server = serve(model, ["double_copy"])
    server.handle({"op": "get_cache", "ids": ["a"], "out": 1})
    reply = generate(server, 1)
    assert len(reply["copies"]) == 1  # single-copy: an owned copy's generation copies nothing
    assert reply["peak_live_sets"] == 3


# ---- the derived owned marker ---------------------------------------------------------------


class KeepsItsCopies(tm.TransformersMemory):
    """A store that keeps the copy it hands out as the entry (a copy-on-read
    cache that saves the next read a copy): what it hands out is stored."""

    def get_cache(self, ids):
        result = super().get_cache(ids)
        if result is not None and len(set(ids)) == 1:
            self._items[ids[0]].cache = result
        return result


def test_the_derived_marker_fails_a_store_that_stores_its_own_copy(model):
    server = Server(lambda: _keeping_adapter(model))
    server.handle({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})
    server.handle({"op": "add", "id": "a", "metadata": {}, "cache": wire.content_json(content_of(SPEC_A))})
    got = server.handle({"op": "get_cache", "ids": ["a"], "out": 1})
    assert not facts(got, 1)["owned"]  # kvcheck expects an owned copy: owned-marker fails
    assert set(facts(got, 1)["storage"]) == storage_of_entry(server, "a")


def _keeping_adapter(model):
    adapter = tma.TransformersMemoryAdapter((), model)
    adapter.store = KeepsItsCopies(model=model)
    return adapter


# ---- dump and load ------------------------------------------------------------------------------


def test_dump_and_load_keep_every_entry(model, tmp_path):
    server = serve(model)
    directory = str(tmp_path / "dump")
    assert server.handle({"op": "dump", "dir": directory})["ok"]
    server.handle({"op": "remove_all"})
    assert server.handle({"op": "load", "dir": directory})["error"] is None
    assert server.handle({"op": "stored_ids"})["ids"] == ["a", "b"]
    for id, spec in (("a", SPEC_A), ("b", SPEC_B)):
        assert view_of_entry(server, id) == c.expected_view(content_of(spec))
        assert server.handle({"op": "entry_metadata", "id": id})["metadata"] == {"source": id}
    server.handle({"op": "get_cache", "ids": ["a"], "out": 1})
    assert generate(server, 1)["tokens"] == fresh_tokens(model, content_of(SPEC_A))


def test_a_damaged_dump_is_refused_and_the_store_kept(model, tmp_path):
    store = tm.TransformersMemory(model=model)
    store.add([{"id": "a", "cache": hf.materialize(content_of(SPEC_A))}])
    directory = str(tmp_path / "dump")
    store.dump(directory)
    path = os.path.join(directory, tm.DUMP_FILE_NAME)
    data = open(path, "rb").read()
    for damaged, fault in ((data[:-7], "truncated"), (data[:-1] + bytes([data[-1] ^ 1]), "SHA-256"), (b"x" + data, "does not start")):
        with open(path, "wb") as file:
            file.write(damaged)
        with pytest.raises(tm.DumpError, match=fault):
            store.load(directory)
        assert store.get("a") is not None
    with pytest.raises(tm.DumpError, match="does not exist"):
        store.load(str(tmp_path / "none"))


def test_a_dump_cut_short_leaves_the_previous_one(model, tmp_path):
    server = serve(model)
    directory = str(tmp_path / "dump")
    server.handle({"op": "dump", "dir": directory})
    server.handle({"op": "remove", "ids": ["a"]})
    assert server.handle({"op": "dump_interrupted", "dir": directory, "bytes_budget": 100})["ok"]
    assert server.handle({"op": "load", "dir": directory})["error"] is None
    assert server.handle({"op": "stored_ids"})["ids"] == ["a", "b"]
