"""The SDK's protocol side in process, without kvcheck: the wire forms of
content and views, the server's handling of requests, its observations and
copy accounting, the framing, and the simulated power cut."""

import json
import os
import re
import threading

import pytest
import torch

import activation_memory
import activation_memory_adapter
from kvcheck_adapter import cache as kv
from kvcheck_adapter import content
from kvcheck_adapter import protocol
from kvcheck_adapter import wire
from kvcheck_adapter.adapter import Adapter, RequestError, Server, capabilities_of, store_policy_of
from kvcheck_adapter.crash import power_cut

from conftest import cache_json, handle_facts, new_server

SPECS = [
    "modern/f32/1:[kv3 kv3]",
    "modern/bf16/7:[kv3 k~2 KV4 -0]",
    "modern/f16/9:[k2 v4 kvKV1]",
    "modern/f32/0:[]",
    "modern/f32/5:[kv0 -0]",
    "legacy/f32/2:[kv2 kv5]",
    "legacy/bf16/3:[kv1]",
    "legacy/f16/4:[kv0]",
]


def contents():
    return [content.expand(content.parse_cache_spec(spec)) for spec in SPECS]


# ---- content and views ------------------------------------------------------------


@pytest.mark.parametrize("spec", SPECS)
def test_materialize_is_the_core_materialize_bit_for_bit(spec):
    wanted = content.expand(content.parse_cache_spec(spec))
    made, reference = wire.materialize(wanted), kv.materialize(wanted)
    assert content.view_of(made) == content.view_of(reference)
    for mine, theirs in zip(kv._all_slots(made), kv._all_slots(reference)):
        assert (mine is None) == (theirs is None)
        if mine is not None:
            assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
            assert torch.equal(mine, theirs)


@pytest.mark.parametrize("spec", SPECS)
def test_materialized_slots_have_storages_of_their_own(spec):
    made = wire.materialize(content.expand(content.parse_cache_spec(spec)))
    again = wire.materialize(content.expand(content.parse_cache_spec(spec)))  # from the segment memo
    identities = [i for i in kv._all_slots(made) if i is not None and i.numel() > 0]
    from kvcheck_adapter.observe import storage_identity

    ids = [storage_identity(t) for t in identities]
    assert len(set(ids)) == len(ids)
    assert not set(ids) & {storage_identity(t) for t in kv._all_slots(again) if t is not None and t.numel() > 0}


def test_a_cache_partly_in_a_full_segment_memo_is_still_made_whole(monkeypatch):
    # A memo emptied because it is full loses the segments found in it
    # before: the cache being made must have them made again.
    monkeypatch.setattr(wire, "_segment_memo", {})
    monkeypatch.setattr(wire, "_MEMO_ENTRIES_MAX", 4)
    first = content.expand(content.parse_cache_spec("modern/f16/9:[kv3 kv2]"))
    both = content.expand(content.parse_cache_spec("modern/f16/9:[kv3 kv2 kv4]"))  # first's 4 segments, and 2 new
    wire.materialize(first)
    made, reference = wire.materialize(both), kv.materialize(both)
    assert content.view_of(made) == content.view_of(reference)


@pytest.mark.parametrize("spec", SPECS)
def test_view_json_is_view_of(spec):
    cache = wire.materialize(content.expand(content.parse_cache_spec(spec)))
    assert wire.view_from_json(wire.view_json(cache)) == content.view_of(cache)
    assert content.view_digest(wire.view_from_json(wire.view_json(cache))) == content.view_digest(content.view_of(cache))


@pytest.mark.parametrize("spec", ["modern/bf16/7:[kv3 k~2 KV4 -0]", "legacy/f16/4:[kv2]"])
def test_an_adapter_with_a_content_tolerance_reports_each_slots_values(spec):
    # docs/protocol.md section 5: the values read as float32, row-major,
    # beside the hash (which stays the hash of these values).
    cache = wire.materialize(content.expand(content.parse_cache_spec(spec)))
    assert "values" not in json.dumps(Adapter().view(cache))

    class Quantized(Adapter):
        capabilities = {"content_tolerance": {"abs": 0.0, "rel": 2.0 ** -8}}

    assert capabilities_of(Quantized())["content_tolerance"] == {"abs": 0.0, "rel": 2.0 ** -8}
    view = Quantized().view(cache)
    assert wire.view_from_json(view) == content.view_of(cache)
    tensors = [[layer.keys, layer.values] for layer in cache.layers] if hasattr(cache, "layers") else \
        [[k, v] for k, v in zip(cache.key_cache, cache.value_cache)]
    for layer, (keys, values) in zip(view["layers"], tensors):
        for slot, tensor in zip(layer["slots"], (keys, values)):
            if slot is not None:
                assert slot["values"] == tensor.float().reshape(-1).tolist()


def test_view_json_sees_every_write_to_a_tensor():
    cache = wire.materialize(content.expand(content.parse_cache_spec("modern/f32/1:[kv3]")))
    before = wire.view_json(cache)
    keys = cache.layers[0].keys
    keys.data.mul_(2)  # a write that bumps no version counter of `keys`
    assert wire.view_json(cache)["layers"][0]["slots"][0]["hash"] != before["layers"][0]["slots"][0]["hash"]
    keys.data.div_(2)
    assert wire.view_json(cache) == before
    keys.numpy()[0, 0, 0, 0] += 1  # and one through numpy's view of the memory
    assert wire.view_json(cache) != before


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_view_json_of_slots_read_in_place_or_through_numpy_is_the_content_hash(dtype):
    # Slots whose bytes the memo reads in place (row-major), and those it
    # copies out through numpy (other strides): each is the hash of its own
    # values, and a write in place is seen.
    base = torch.arange(48, dtype=torch.float32).reshape(1, 2, 6, 4).to(dtype) / 7
    strided = base.transpose(2, 3).contiguous().transpose(2, 3)  # same values, other strides
    assert not strided.is_contiguous()
    cache = cache_of_slots([base, strided, base[:, :, :3]])
    slots = wire.view_json(cache)["layers"][0]["slots"]
    expected = content.content_hashes([base, base[:, :, :3].contiguous()])
    assert [slot["hash"] for slot in slots[:3]] == [expected[0], expected[0], expected[1]]
    base.view(torch.int16 if dtype == torch.bfloat16 else base.dtype).numpy()[0, 0, 0, 1] += 1
    assert wire.view_json(cache)["layers"][0]["slots"][0]["hash"] != expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_view_json_hashes_the_bits_of_every_value_as_content_hash_does(dtype):
    # The view hashes the bytes it read of a slot (float32, bfloat16) or the
    # slot widened by torch (float16): NaNs of any payload and sign, -0,
    # infinities and subnormals hash as content_hash hashes them.
    patterns = [0x7FC00000, 0xFFC00001, 0x7F800001, 0x7FA5A5A5, 0x80000000, 0x7F800000, 0xFF800000, 0x00000001,
                0x807FFFFF, 0x3F800000, 0xBF7FFFFF, 0x00010000, 0x80010000, 0x7FFF0000]
    bits = torch.tensor(patterns * 2 + [0x3F000000, 0x40000000], dtype=torch.int64).to(torch.int32)
    values = bits.view(torch.float32).reshape(1, 1, 30, 1)
    if dtype == torch.bfloat16:
        values = (bits >> 16).to(torch.int16).view(torch.bfloat16).reshape(1, 1, 30, 1)
    elif dtype == torch.float16:
        values = values.to(torch.float16)
    slots = wire.view_json(cache_of_slots([values, None, None]))["layers"][0]["slots"]
    assert slots[0]["hash"] == content.content_hash(values)
    assert slots[0]["hash"] != content.content_hash(values[:, :, 1:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_view_json_and_the_model_read_a_lazily_negated_slot_as_its_values(dtype):
    # torch._neg_view marks a negation without applying it (numpy refuses
    # such a tensor): the view reports the negated values, and the model
    # decodes over them as over the negation made in memory.
    from kvcheck_adapter import decoder

    base = torch.arange(48, dtype=torch.float32).reshape(1, 2, 6, 4).to(dtype) / 7
    lazy = torch._neg_view(base)
    slots = wire.view_json(cache_of_slots([lazy, None, None]))["layers"][0]["slots"]
    assert slots[0]["hash"] == content.content_hash(-base)
    assert (decoder._float32_array(lazy) == decoder._float32_array(-base)).all()


def cache_of_slots(tensors):
    layer = kv.DynamicLayer()
    layer.keys, layer.values, layer.key_cache = tensors
    layer.value_cache = None
    cache = kv.DynamicCache()
    cache.layers.append(layer)
    return cache


def test_view_json_of_a_model_grown_cache_is_view_of():
    from kvcheck_adapter import decoder

    model = decoder.Decoder()
    for spec in ("modern/bf16/3:[kv2 kv2]", "legacy/f32/1:[kv1 kv1]"):
        cache = wire.materialize(content.expand(content.parse_cache_spec(spec)))
        decoder.generate(model, [3, 1], cache, 3)
        assert wire.view_from_json(wire.view_json(cache)) == content.view_of(cache)


@pytest.mark.parametrize("spec", SPECS)
def test_content_round_trips_through_json(spec):
    wanted = content.expand(content.parse_cache_spec(spec))
    assert wire.content_from_json(wire.content_json(wanted)) == wanted


@pytest.mark.parametrize(
    "bad, words",
    [
        ("not an object", "must be an object"),
        ({"layout": "sideways", "dtype": "f32", "layers": []}, "cache.layout"),
        ({"layout": "modern", "dtype": "f64", "layers": []}, "cache.dtype"),
        ({"layout": "modern", "dtype": "f32", "heads": 2, "head_dim": 4, "layers": [{"initialized": True, "slots": [None]}]}, "4 entries"),
        ({"layout": "modern", "dtype": "f32", "heads": 2, "head_dim": 4,
          "layers": [{"initialized": True, "slots": [[[1, 2]], None, None, None]}]}, "seed, tokens, precision"),
        ({"layout": "modern", "dtype": "f32", "heads": 2, "head_dim": 4,
          "layers": [{"initialized": True, "slots": [[[1, 2, "f64"]], None, None, None]}]}, "precision"),
        ({"layout": "modern", "dtype": "f32", "heads": 2, "head_dim": 4,
          "layers": [{"initialized": True, "slots": [[[-1, 2, "f32"]], None, None, None]}]}, "seed"),
        ({"layout": "modern", "dtype": "f32", "heads": 0, "head_dim": 4, "layers": []}, "cache.heads"),
        ({"layout": "modern", "dtype": "f32", "heads": 2, "head_dim": 1025, "layers": []}, "cache.head_dim"),
        ({"layout": "modern", "dtype": "f32", "layers": []}, "cache.heads"),
    ],
)
def test_bad_content_is_refused_by_name(bad, words):
    with pytest.raises(wire.WireError, match=words):
        wire.content_from_json(bad)


# ---- the server --------------------------------------------------------------------


def test_hello_names_the_adapter_and_its_capabilities():
    _, hello = new_server(["double_copy"])
    assert hello["protocol"] == protocol.PROTOCOL_VERSION
    assert hello["name"] == "activation-memory+double_copy"
    assert hello["copies_in_replies"] is True
    flags = hello["capabilities"]
    assert flags["dump"] and flags["dump_crash"] and flags["conversions"] and flags["generate_stream"]
    assert flags["copy_log"] and flags["storage_identity"] and not flags["entry_versions"]


def test_a_hello_of_another_version_is_answered_with_ours():
    server = Server(activation_memory_adapter.ActivationMemoryAdapter)
    reply = server.handle({"op": "hello", "protocol": 7})
    assert reply == {"ok": False, "protocol": protocol.PROTOCOL_VERSION, "error": reply["error"]}
    assert "7" in reply["error"] and str(protocol.PROTOCOL_VERSION) in reply["error"]


def test_capabilities_follow_the_methods_an_engine_implements():
    class Small(Adapter):
        capabilities = {"half_dtypes": False}

    flags = capabilities_of(Small())
    assert not flags["conversions"] and not flags["dump"] and not flags["dump_crash"] and not flags["generate_stream"]
    assert flags["half_dtypes"] is False and flags["copy_log"] and flags["storage_identity"]
    assert flags["owned_marker"] is True  # kvcheck reads the engine's marker unless it says it has none


def test_read_leases_are_declared_with_their_ttl_and_methods():
    # docs/protocol.md 7c: lease_ttl_ms, the one numeric capability; declared
    # without advance_clock, lease and unlease it is refused, naming them.
    class Leasing(Adapter):
        lease_ttl_ms = 1000

        def advance_clock(self, ms):
            pass

        def lease(self, id):
            pass

        def unlease(self, id):
            pass

    class Unleasing(Adapter):
        lease_ttl_ms = 1000

    assert capabilities_of(Leasing())["lease_ttl_ms"] == 1000
    assert "lease_ttl_ms" not in capabilities_of(Adapter())
    with pytest.raises(ValueError, match="does not implement advance_clock, lease, unlease"):
        capabilities_of(Unleasing())
    Leasing.lease_ttl_ms = 0
    with pytest.raises(ValueError, match="a lease lives 1 ms or more"):
        capabilities_of(Leasing())


def test_an_engine_without_a_copy_log_is_not_tracked():
    # Capability copy_log false (an engine whose caches are not torch
    # tensors, as mlx-lm's): the SDK's copy tracker never reads its caches,
    # and every operation reports no copy.
    from kvcheck_adapter.adapter import _Session

    class Untracked(activation_memory_adapter.ActivationMemoryAdapter):
        capabilities = {"copy_log": False}

    class Tracked(activation_memory_adapter.ActivationMemoryAdapter):
        pass

    assert _Session(Untracked(())).tracker is None
    assert _Session(Tracked(())).tracker is not None


MODEL_ADAPTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model_adapter.py")


def test_hello_declares_the_model_an_adapter_names():
    class Declared(Adapter):
        model = {"layers": 2, "heads": 2, "head_dim": 8, "dtypes": ["f32"], "layouts": ["modern"], "odd_layers": False}

    hello = Server(Declared).handle({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})
    assert hello["model"] == Declared.model
    assert hello["capabilities"]["modern_layout"] is True
    _, undeclared = new_server()
    assert "model" not in undeclared

    class ModelObject(Adapter):
        model = object()

    with pytest.raises(TypeError, match="ModelObject.model is a object: it declares the model's caches as a dict"):
        Server(ModelObject).handle({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})


def test_hello_declares_the_store_policy_an_adapter_names():
    """docs/protocol.md section 3, "store_policy": from the adapter's
    capacity_items, capacity_bytes, eviction and listing; absent when
    undeclared; a declaration that does not hold together is refused by name."""
    class Bounded(Adapter):
        capacity_items = 16
        eviction = "lru"
        listing = "recency"

    hello = Server(Bounded).handle({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})
    assert hello["store_policy"] == {"capacity_items": 16, "eviction": "lru", "listing": "recency"}
    _, undeclared = new_server()
    assert "store_policy" not in undeclared
    bounded = activation_memory_adapter.ActivationMemoryAdapter(capacity=4)
    assert store_policy_of(bounded) == {"capacity_items": 4, "eviction": "lru"}
    for attributes, words in [({"capacity_items": 4}, "declares a capacity but no eviction"),
                              ({"eviction": "lru"}, "but no capacity is declared"),
                              ({"capacity_items": 0, "eviction": "lru"}, "capacity_items is 0: a positive int"),
                              ({"capacity_items": 4, "eviction": "random"}, "eviction is 'random' (known: lru, fifo"),
                              ({"listing": "sorted"}, "listing is 'sorted' (known: insertion, recency, unordered)")]:
        adapter = type("Odd", (Adapter,), attributes)()
        with pytest.raises(ValueError, match=re.escape(words)):
            store_policy_of(adapter)


def test_the_declared_model_reaches_kvcheck_and_bounds_its_caches(kvcheck):
    # The adapter raises on any cache outside its model: a pass means none was sent.
    run = kvcheck("run", "--adapter", MODEL_ADAPTER, "--property", "stored-immutable", "--cases", "40", "--jobs", "1")
    assert run.status == 0, run.stderr + json.dumps(run.report, indent=1)
    assert run.report["domain"] == "layers=2 heads=2 head_dim=8 dtype=f32 layout=modern"
    overridden = kvcheck("run", "--adapter", MODEL_ADAPTER, "--property", "stored-immutable", "--cases", "5",
                         "--model", "layers=2,heads=2,head_dim=8,dtype=f32,layout=modern,odd_layers=no")
    assert overridden.status == 0, overridden.stderr
    assert overridden.report["domain"] == "layers=2 heads=2 head_dim=8 dtype=f32 layout=modern"


@pytest.mark.parametrize("model, words", [
    ({"layers": 2, "heads": 2, "head_dim": 8, "dtypes": ["f32"], "layouts": ["modern"]}, "'model': missing member 'odd_layers'"),
    ({"layers": 2, "heads": 2, "head_dim": 8, "dtypes": ["f64"], "layouts": ["modern"], "odd_layers": False},
     "'model': 'dtypes': unknown dtype 'f64'"),
    ({"layers": "2", "heads": 2, "head_dim": 8, "dtypes": ["f32"], "layouts": ["modern"], "odd_layers": False},
     "'model': 'layers'"),
    ({"layers": 0, "heads": 2, "head_dim": 8, "dtypes": ["f32"], "layouts": ["modern"], "odd_layers": False},
     "'layers' must be in [1, 1024], not 0"),
    ({"layers": 2, "heads": 2, "head_dim": 8, "dtypes": [], "layouts": ["modern"], "odd_layers": False},
     "'dtypes' is empty"),
    ({"layers": 2, "heads": 2, "head_dim": 8, "dtypes": ["f32"], "layouts": ["modern"], "odd_layers": False, "vocab": 9},
     "'model': unknown key 'vocab'"),
])
def test_a_malformed_model_is_refused_at_the_handshake_naming_the_key(kvcheck, monkeypatch, model, words):
    monkeypatch.setenv("KVCHECK_TEST_MODEL", json.dumps(model))
    run = kvcheck("run", "--adapter", MODEL_ADAPTER, "--cases", "1")
    assert run.status == 2, run.stderr
    assert words in run.stderr, run.stderr


def test_requests_out_of_place_are_refused():
    server = Server(activation_memory_adapter.ActivationMemoryAdapter)
    with pytest.raises(RequestError, match="before the handshake"):
        server.handle({"op": "stored_ids"})
    server, _ = new_server()
    with pytest.raises(RequestError, match="unknown request 'fly'"):
        server.handle({"op": "fly"})
    with pytest.raises(RequestError, match="lacks 'out'"):
        server.handle({"op": "get", "id": "a"})


def test_an_operation_reports_what_it_named_as_it_is_after():
    server, _ = new_server()
    spec = "modern/f32/3:[kv2 kv2]"
    reply = server.handle({"op": "add", "id": "a", "metadata": {}, "cache": cache_json(spec)})
    expected = content.expected_digest(content.expand(content.parse_cache_spec(spec)))
    entry = reply["observed"]["entries"][0]
    assert entry["id"] == "a" and entry["owned"] is False
    assert content.view_digest(wire.view_from_json(entry["view"])) == expected
    assert reply["observed"]["stored_ids"] == ["a"]
    reply = server.handle({"op": "get_cache", "ids": ["a"], "out": 1})
    facts = handle_facts(reply, 1)
    assert facts["exists"] and facts["owned"]
    assert content.view_digest(wire.view_from_json(facts["view"])) == expected
    assert not set(facts["storage"]) & set(entry["storage"])
    assert reply["copies"] == [{"reason": "get_cache", "bytes": 2 * 2 * (1 * 2 * 2 * 4 * 4)}]
    reply = server.handle({"op": "get", "id": "a", "out": 2})
    facts = handle_facts(reply, 2)
    assert facts["exists"] and not facts["owned"] and facts["storage"] == entry["storage"]
    other = handle_facts(reply, 1)  # a live handle the operation did not name: marker and storage only
    assert other["owned"] and "view" not in other


def test_copies_and_live_sets_of_the_generation_boundary():
    server, _ = new_server()
    server.handle({"op": "add", "id": "a", "metadata": {}, "cache": cache_json("modern/f32/3:[kv2 kv2]")})
    server.handle({"op": "get_cache", "ids": ["a"], "out": 1})
    owned = server.handle({"op": "generate", "handle": 1, "prompt": [1, 2], "max_new_tokens": 2, "stream": False})
    assert owned["copies"] == [] and owned["peak_live_sets"] == 2
    server.handle({"op": "get", "id": "a", "out": 2})
    stored = server.handle({"op": "generate", "handle": 2, "prompt": [1, 2], "max_new_tokens": 2, "stream": True})
    assert len(stored["copies"]) == 1 and stored["peak_live_sets"] == 2
    assert stored["tokens"] == owned["tokens"]
    none = server.handle({"op": "generate", "handle": 0, "prompt": [1], "max_new_tokens": 1, "stream": False})
    assert none["copies"] == []


def test_a_copy_of_an_empty_cache_is_counted_by_the_cache_the_model_wrote_into():
    for bugs, copies in (((), 1), (("stored_to_generation",), 0)):
        server, _ = new_server(bugs)
        server.handle({"op": "make", "out": 1, "cache": cache_json("modern/f32/0:[]")})
        reply = server.handle({"op": "generate", "handle": 1, "prompt": [1], "max_new_tokens": 1, "stream": False})
        assert len(reply["copies"]) == copies, bugs


def test_double_copy_shows_two_copies():
    server, _ = new_server(["double_copy"])
    server.handle({"op": "add", "id": "a", "metadata": {}, "cache": cache_json("modern/f32/3:[kv2]")})
    server.handle({"op": "get_cache", "ids": ["a"], "out": 1})
    reply = server.handle({"op": "generate", "handle": 1, "prompt": [1], "max_new_tokens": 1, "stream": False})
    assert len(reply["copies"]) == 1  # the generation's own copy of the owned cache: one too many


def _bytes(spec):
    return content.content_bytes(content.expand(content.parse_cache_spec(spec)))


def test_every_operation_reports_the_copies_its_semantics_make_with_their_bytes():
    server, _ = new_server()
    modern, legacy = "modern/bf16/3/4x8:[kv5 k~2 KV3]", "legacy/f16/4/4x8:[kv2 kv1]"
    assert server.handle({"op": "add", "id": "a", "metadata": {}, "cache": cache_json(modern)})["copies"] == []
    assert server.handle({"op": "make", "out": 1, "cache": cache_json(legacy)})["copies"] == []
    assert server.handle({"op": "get", "id": "a", "out": 2})["copies"] == []
    clone = server.handle({"op": "clone", "source": 2, "out": 3})
    assert clone["copies"] == [{"reason": "clone", "bytes": _bytes(modern)}]
    assert server.handle({"op": "to_legacy", "source": 2, "out": 4})["copies"] == []  # a view of its source
    converted = server.handle({"op": "from_legacy", "source": 1, "out": 5})
    assert converted["copies"] == [{"reason": "from_legacy", "bytes": _bytes(legacy)}]
    # A merge of bfloat16 and float16: float32 (torch.cat's promotion), each value written once.
    merged = server.handle({"op": "concat", "parts": [2, 0, 1], "out": 6})
    parts = [content.expand(content.parse_cache_spec(spec)) for spec in (modern, legacy)]
    expected = content.expected_concat(parts)
    assert expected.dtype == "f32"
    assert merged["copies"] == [{"reason": "concat", "bytes": content.content_bytes(expected)}]
    assert content.view_digest(wire.view_from_json(handle_facts(merged, 6)["view"])) == content.expected_digest(expected)
    got = server.handle({"op": "get_cache", "ids": ["a", "x", "a"], "out": 7})
    twice = content.expected_concat([parts[0], parts[0]])
    assert got["copies"] == [{"reason": "get_cache", "bytes": content.content_bytes(twice)}]
    assert server.handle({"op": "release", "handle": 7})["copies"] == []


@pytest.mark.parametrize("spec", ["modern/f32/0:[]", "modern/f16/0:[kv0 -~0]", "legacy/bf16/1:[kv0]"])
def test_a_copy_of_a_cache_holding_no_element_is_a_copy_of_0_bytes(spec):
    server, _ = new_server()
    server.handle({"op": "make", "out": 1, "cache": cache_json(spec)})
    method = "from_legacy" if spec.startswith("legacy") else "clone"
    assert server.handle({"op": method, "source": 1, "out": 2})["copies"] == [{"reason": method, "bytes": 0}]
    assert server.handle({"op": "concat", "parts": [1, 1], "out": 3})["copies"] == [{"reason": "concat", "bytes": 0}]
    # The generation boundary's copy: the model writes into another object;
    # the K/V sets on its path are that copy and the cache it was made from.
    reply = server.handle({"op": "generate", "handle": 1, "prompt": [1], "max_new_tokens": 2, "stream": False})
    assert reply["copies"] == [{"reason": "generate", "bytes": 0}] and reply["peak_live_sets"] == 2
    # A copy of a copy: its chain counts while the handles hold it.
    reply = server.handle({"op": "generate", "handle": 2 if method == "clone" else 3, "prompt": [1], "max_new_tokens": 1,
                           "stream": False})
    assert reply["peak_live_sets"] == 2


def test_the_live_sets_count_the_copy_chain_the_trace_holds():
    server, _ = new_server()
    server.handle({"op": "make", "out": 1, "cache": cache_json("modern/f32/1:[kv3 kv3]")})
    server.handle({"op": "clone", "source": 1, "out": 2})
    server.handle({"op": "clone", "source": 2, "out": 3})
    reply = server.handle({"op": "generate", "handle": 3, "prompt": [1], "max_new_tokens": 1, "stream": False})
    assert reply["copies"] == [] and reply["peak_live_sets"] == 3
    server.handle({"op": "clone", "source": 1, "out": 4})
    server.handle({"op": "release", "handle": 1})  # the chain's first level is gone
    reply = server.handle({"op": "generate", "handle": 4, "prompt": [1], "max_new_tokens": 1, "stream": False})
    assert reply["peak_live_sets"] == 1


def test_metadata_is_what_get_hands_back_and_the_store_holds():
    server, hello = new_server()
    assert hello["capabilities"]["metadata"] is True
    server.handle({"op": "add", "id": "a", "metadata": {"k": "v", "x": ""}, "cache": cache_json("modern/f32/1:[kv1]")})
    server.handle({"op": "get", "id": "a", "out": 1})
    assert server.handle({"op": "handle_metadata", "handle": 1})["metadata"] == {"k": "v", "x": ""}
    assert server.handle({"op": "entry_metadata", "id": "a"})["metadata"] == {"k": "v", "x": ""}
    server.handle({"op": "make", "out": 2, "cache": cache_json("modern/f32/1:[kv1]")})
    server.handle({"op": "add_handle", "id": "b", "handle": 2})
    assert server.handle({"op": "entry_metadata", "id": "b"})["metadata"] == {}
    server.handle({"op": "release", "handle": 1})
    assert server.handle({"op": "handle_metadata", "handle": 1})["metadata"] == {}
    assert server.handle({"op": "entry_metadata", "id": "a"})["metadata"] == {"k": "v", "x": ""}
    with pytest.raises(KeyError, match="no stored entry 'zz'"):
        server.handle({"op": "entry_metadata", "id": "zz"})


def test_facts_carry_the_metadata_of_entries_and_of_what_get_handed_back():
    server, _ = new_server()
    reply = server.handle({"op": "add", "id": "a", "metadata": {"k": "v"}, "cache": cache_json("modern/f32/1:[kv1]")})
    assert reply["observed"]["entries"][0]["metadata"] == {"k": "v"}
    reply = server.handle({"op": "get", "id": "a", "out": 1})
    assert handle_facts(reply, 1)["metadata"] == {"k": "v"}
    assert reply["observed"]["entries"][0]["metadata"] == {"k": "v"}
    reply = server.handle({"op": "make", "out": 2, "cache": cache_json("modern/f32/1:[kv1]")})
    assert handle_facts(reply, 2)["metadata"] == {}
    assert "metadata" not in handle_facts(reply, 1)  # not named: marker and storage only
    assert server.handle({"op": "handle_facts", "handle": 1})["metadata"] == {"k": "v"}
    assert server.handle({"op": "handle_facts", "handle": 9})["metadata"] == {}
    assert server.handle({"op": "read_entries", "ids": ["a"], "with_storage": True})["entries"][0]["metadata"] == {"k": "v"}


def test_facts_of_an_engine_without_metadata_carry_none():
    class NoMetadata(activation_memory_adapter.ActivationMemoryAdapter):
        capabilities = {"metadata": False}

    server = Server(NoMetadata)
    server.handle({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})
    reply = server.handle({"op": "add", "id": "a", "metadata": {"k": "v"}, "cache": cache_json("modern/f32/1:[kv1]")})
    assert "metadata" not in reply["observed"]["entries"][0]
    reply = server.handle({"op": "get", "id": "a", "out": 1})
    assert "metadata" not in handle_facts(reply, 1)


def test_a_request_saying_what_kvcheck_reads_next_gets_those_facts():
    server, _ = new_server()
    for id in ("a", "b", "c"):
        server.handle({"op": "add", "id": id, "metadata": {"id": id}, "cache": cache_json("modern/f32/1:[kv1]")})
    plain = server.handle({"op": "make", "out": 1, "cache": cache_json("legacy/f32/1:[kv1]")})
    assert plain["observed"]["entries"] == []
    every = server.handle({"op": "make", "out": 2, "cache": cache_json("legacy/f32/1:[kv1]"), "read_store": True})
    assert [e["id"] for e in every["observed"]["entries"]] == ["a", "b", "c"]
    assert [e["metadata"] for e in every["observed"]["entries"]] == [{"id": "a"}, {"id": "b"}, {"id": "c"}]
    read = server.handle({"op": "read_entries", "ids": ["a", "b", "c"], "with_storage": True})["entries"]
    for reported, asked in zip(every["observed"]["entries"], read):
        assert {k: v for k, v in reported.items() if k != "id"} == asked
    some = server.handle({"op": "get", "id": "a", "out": 3, "read_ids": ["c", "x", "a"]})
    assert [e["id"] for e in some["observed"]["entries"]] == ["a", "c"]  # named first; "x" is not stored
    # The hint is the request's own: the next request without one reports what it names.
    assert server.handle({"op": "release", "handle": 3})["observed"]["entries"] == []


def test_a_reset_sent_with_a_request_answers_it_on_a_fresh_engine():
    server, _ = new_server()
    server.handle({"op": "add", "id": "a", "metadata": {}, "cache": cache_json("modern/f32/3:[kv2]")})
    server.handle({"op": "make", "out": 4, "cache": cache_json("legacy/f32/3:[kv2]")})
    assert server.handle({"op": "stored_ids", "reset": True})["ids"] == []
    assert server.handle({"op": "handle_facts", "handle": 4})["exists"] is False
    server.handle({"op": "add", "id": "b", "metadata": {}, "cache": cache_json("modern/f32/3:[kv2]")})
    reply = server.handle({"op": "add", "id": "c", "metadata": {}, "cache": cache_json("modern/f32/3:[kv2]"), "reset": True})
    assert reply["observed"]["stored_ids"] == ["c"]


def test_a_reset_that_fails_with_a_request_is_answered_as_the_resets_failure():
    made = []

    def factory():
        if made:
            raise RuntimeError("the store is locked")
        made.append(1)
        return activation_memory_adapter.ActivationMemoryAdapter()

    server = Server(factory)
    server.handle({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})
    reply = server.handle({"op": "stored_ids", "reset": True})
    assert reply["ok"] is False and reply["reset_failed"] is True
    assert reply["error"] == "RuntimeError: the store is locked"


def test_reset_gives_a_fresh_engine_and_forgets_handles():
    server, _ = new_server()
    server.handle({"op": "add", "id": "a", "metadata": {}, "cache": cache_json("modern/f32/3:[kv2]")})
    server.handle({"op": "make", "out": 4, "cache": cache_json("legacy/f32/3:[kv2]")})
    assert server.handle({"op": "reset"}) == {"ok": True}
    assert server.handle({"op": "stored_ids"})["ids"] == []
    assert server.handle({"op": "handle_facts", "handle": 4})["exists"] is False


def test_observations_of_what_does_not_exist_are_errors():
    server, _ = new_server()
    with pytest.raises(KeyError, match="no stored entry 'x'"):
        server.handle({"op": "view_entry", "id": "x"})
    with pytest.raises(ValueError, match="handle 9 holds no cache"):
        server.handle({"op": "view_handle", "handle": 9})


def test_a_failed_load_is_a_result(scratch_dir):
    server, _ = new_server()
    reply = server.handle({"op": "load", "dir": os.path.join(scratch_dir, "nothing")})
    assert reply["ok"] and "does not exist" in reply["error"]


def test_read_entries_answers_in_request_order():
    server, _ = new_server()
    for id, spec in (("a", "modern/f32/1:[kv1]"), ("b", "legacy/f32/2:[kv2]")):
        server.handle({"op": "add", "id": id, "metadata": {}, "cache": cache_json(spec)})
    reply = server.handle({"op": "read_entries", "ids": ["b", "a"], "with_storage": False})
    views = [wire.view_from_json(e["view"]) for e in reply["entries"]]
    assert [v.layout for v in views] == ["legacy", "modern"]
    assert all("storage" not in e for e in reply["entries"])


# ---- the transport -------------------------------------------------------------------


def test_frames_round_trip_over_pipes():
    read_fd, write_fd = os.pipe()
    receiver = protocol.Connection(read_fd, -1)
    sender = protocol.Connection(os.open(os.devnull, os.O_RDONLY), write_fd)
    message = {"op": "add", "id": "é\n\"", "seeds": [2**64 - 1, 0]}
    sender.send(message)
    sender.send({"op": "shutdown"})
    os.close(write_fd)
    assert receiver.receive() == message
    assert receiver.receive() == {"op": "shutdown"}
    assert receiver.receive() is None


@pytest.mark.parametrize(
    "raw, words",
    [
        (b"\x00\x00", "cut short"),
        (b"\xff\xff\xff\xff", "over the limit"),
        ((5).to_bytes(4, "big") + b"[1,2]", "not an object"),
        ((9).to_bytes(4, "big") + b"{}", "cut short at 2"),
    ],
)
def test_bad_frames_are_protocol_errors(raw, words):
    read_fd, write_fd = os.pipe()
    os.write(write_fd, raw)
    os.close(write_fd)
    with pytest.raises(protocol.ProtocolError, match=words):
        protocol.Connection(read_fd, -1).receive()


def test_the_loop_answers_an_exception_with_its_traceback_and_goes_on():
    requests_read, requests_write = os.pipe()
    replies_read, replies_write = os.pipe()

    def handle(request):
        if request["op"] == "boom":
            raise ValueError("planted")
        return {"ok": True}

    loop = threading.Thread(target=protocol.serve_loop, args=(protocol.Connection(requests_read, replies_write), handle))
    loop.start()
    kvcheck_side = protocol.Connection(replies_read, requests_write)
    kvcheck_side.send({"op": "boom"})
    kvcheck_side.send({"op": "shutdown"})
    loop.join(timeout=60)
    error = kvcheck_side.receive()
    assert error["ok"] is False and error["error"] == "ValueError: planted"
    assert "Traceback (most recent call last)" in error["traceback"] and "in handle" in error["traceback"]
    assert kvcheck_side.receive() == {"ok": True}
    for fd in (requests_write, replies_write):
        os.close(fd)


# ---- the power cut -------------------------------------------------------------------------


def test_a_power_cut_keeps_the_previous_dump_and_the_bytes_written(scratch_dir):
    store = activation_memory.ActivationMemory()
    store.add([{"id": "a", "cache": wire.materialize(content.expand(content.parse_cache_spec("modern/f32/1:[kv2]")))}])
    store.dump(scratch_dir)
    store.add([{"id": "b", "cache": wire.materialize(content.expand(content.parse_cache_spec("legacy/f32/2:[kv3]")))}])
    for budget in (0, 1, 100, 1000):
        with power_cut(activation_memory, budget):
            store.dump(scratch_dir)
        temporaries = [name for name in os.listdir(scratch_dir) if ".tmp-" in name]
        assert len(temporaries) == 1  # the crash left it; no clean-up ran
        assert os.path.getsize(os.path.join(scratch_dir, temporaries[0])) == budget
        loaded = activation_memory.ActivationMemory()
        loaded.load(scratch_dir)
        assert [item.id for item in loaded.get_all()] == ["a"]
    assert "open" not in vars(activation_memory) and activation_memory.os is os  # put back
    with power_cut(activation_memory, 10**9):
        store.dump(scratch_dir)
    loaded = activation_memory.ActivationMemory()
    loaded.load(scratch_dir)
    assert [item.id for item in loaded.get_all()] == ["a", "b"]


def test_storage_of_is_the_observers_own():
    from kvcheck_adapter import decoder, observe

    model = decoder.Decoder()
    for spec in SPECS:
        cache = wire.materialize(content.expand(content.parse_cache_spec(spec)))
        assert wire.storage_of(cache) == observe.storage_of(cache)
    for spec in ("modern/f32/1:[kv3 kv3]", "legacy/bf16/3:[kv1 kv1]", "modern/f32/0:[]"):
        cache = wire.materialize(content.expand(content.parse_cache_spec(spec)))
        decoder.generate(model, [1], cache, 2)  # the model's appends: new storages
        assert wire.storage_of(cache) == observe.storage_of(cache)
    base = torch.arange(24, dtype=torch.float32).reshape(1, 2, 3, 4)
    odd = kv.DynamicCache()
    layer = kv.DynamicLayer()
    layer.keys, layer.values = base[:, :, 1:], base[:, :, 3:]  # a view into the middle; an empty view of a full storage
    layer.key_cache = base.transpose(2, 3)
    odd.layers.append(layer)
    assert wire.storage_of(odd) == observe.storage_of(odd)
    assert len(set(wire.storage_of(odd)[2:])) == 1  # three views, one storage
