"""cache.py: the update semantics of both layouts, and clone, concat,
to_legacy, from_legacy against the expected content. The checks of the
cache-level operations are functions of the operation they check, run on
the real one and on the planted bugs M4, M5, M6, M7 and M9."""

import pytest
import torch

from conftest import corpus_lines
from kvcheck_adapter import cache as kv
from kvcheck_adapter import content as c
from kvcheck_adapter import observe

SPECS = corpus_lines("spec")
MERGES = [[c.expand(c.parse_cache_spec(part)) for part in line.split(" + ")] for line in corpus_lines("merge")]


def kv_pair(tokens, value=1.0, dtype=torch.float32, heads=2, head_dim=4):
    k = torch.full((1, heads, tokens, head_dim), value, dtype=dtype)
    return k, -k


def materialized(text):
    return kv.materialize(c.expand(c.parse_cache_spec(text)))


# ---- the modern layout ------------------------------------------------------------------------


def test_a_new_modern_cache_has_no_layers_and_update_adds_them():
    cache = kv.DynamicCache()
    assert len(cache) == 0 and cache.get_seq_length() == 0
    keys, values = cache.update(*kv_pair(3), 2)
    assert len(cache.layers) == 3
    assert [layer.is_initialized for layer in cache.layers] == [False, False, True]
    assert tuple(keys.shape) == (1, 2, 3, 4) and torch.equal(values, -keys)
    assert cache.get_seq_length(2) == 3 and cache.get_seq_length(0) == 0 and cache.get_seq_length(7) == 0


def test_update_rebinds_on_the_same_layer_object_and_never_writes_a_tensor():
    cache = kv.DynamicCache()
    cache.update(*kv_pair(2, 1.0), 0)
    layer, old_keys = cache.layers[0], cache.layers[0].keys
    before = old_keys.clone()
    cache.update(*kv_pair(1, 2.0), 0)
    assert cache.layers[0] is layer and layer.keys is not old_keys
    assert torch.equal(old_keys, before) and old_keys._version == 0
    assert cache.get_seq_length() == 3
    assert torch.equal(layer.keys[:, :, 2], torch.full((1, 2, 4), 2.0))


def test_update_copies_the_first_tokens_it_is_given():
    cache = kv.DynamicCache()
    k, v = kv_pair(2)
    keys, _ = cache.update(k, v, 0)
    assert observe.storage_identity(keys) != observe.storage_identity(k)


def test_a_bare_layer_given_tensors_by_assignment_is_not_initialized_and_loses_them():
    cache = kv.DynamicCache()
    layer = kv.DynamicLayer()
    layer.keys, layer.values = kv_pair(5)
    cache.layers.append(layer)
    assert cache.get_seq_length() == 0
    cache.update(*kv_pair(1, 3.0), 0)
    assert cache.get_seq_length() == 1
    assert torch.equal(layer.keys, torch.full((1, 2, 1, 4), 3.0))


def test_lazy_initialization_keeps_the_legacy_named_slots_and_takes_the_incoming_dtype():
    layer = kv.DynamicLayer()
    layer.key_cache, layer.value_cache = kv_pair(4)
    layer.update(*kv_pair(1, dtype=torch.bfloat16))
    assert layer.keys.dtype == torch.bfloat16 and layer.keys.shape[-2] == 1
    assert layer.key_cache.shape[-2] == 4
    assert layer.get_seq_length() == 1


def test_a_layer_with_legacy_named_slots_only_reports_their_length():
    cache = materialized("modern/f32/1:[KV4]")
    assert cache.get_seq_length() == 4
    assert kv.logical_keys(cache, 0) is cache.layers[0].key_cache


def test_update_needs_both_sides_and_a_valid_index():
    cache = kv.DynamicCache()
    with pytest.raises(ValueError, match="update needs both k and v"):
        cache.update(torch.zeros(1, 2, 1, 4), None, 0)
    with pytest.raises(IndexError):
        cache.update(*kv_pair(1), -1)


# ---- the legacy layout --------------------------------------------------------------------------


def test_legacy_update_pads_aliases_replaces_and_concatenates():
    cache = kv.LegacyDynamicCache()
    k, v = kv_pair(2, dtype=torch.float16)
    keys, values = cache.update(k, v, 2)
    assert len(cache.key_cache) == len(cache.value_cache) == 3
    assert [tuple(t.shape) for t in cache.key_cache[:2]] == [(0,), (0,)]
    assert cache.key_cache[0].dtype == torch.float16
    assert keys is k and values is v  # a new slot is the caller's tensor itself
    k2, v2 = kv_pair(3)
    cache.update(k2, v2, 0)
    assert cache.key_cache[0] is k2  # an empty slot is replaced by k
    cache.update(*kv_pair(1, 5.0), 0)
    assert cache.key_cache[0] is not k2 and cache.get_seq_length(0) == 4
    assert torch.equal(k2, torch.full((1, 2, 3, 4), 1.0))
    assert cache.get_seq_length(1) == 0 and cache.get_seq_length(9) == 0


def test_legacy_lists_of_different_lengths_are_refused():
    cache = kv.LegacyDynamicCache()
    cache.key_cache.append(torch.zeros(0))
    with pytest.raises(ValueError, match="key_cache holds 1 layers but value_cache 0"):
        cache.update(*kv_pair(1), 0)
    with pytest.raises(ValueError, match="differ in length"):
        kv.from_legacy(cache)


# ---- clone ------------------------------------------------------------------------------------------

CLONE_SPECS = SPECS + ["modern/f32/1:[]", "modern/f32/1:[k3 v2 K1 V4 kvKV2]"]


def check_clone(clone, text):
    """clone-independent and layout-roundtrip for one spec: same view, owned,
    no list, layer object or storage shared, and filling the copy leaves
    the source alone (an empty cache included)."""
    spec = c.parse_cache_spec(text)
    source = materialized(text)
    before = c.view_of(source)
    copy = clone(source)
    assert c.view_difference(c.view_of(copy), before) == ""
    assert kv.is_owned(copy)
    assert not observe.shares_storage(copy, source), "the copy shares storage with its source"
    copy.update(*kv_pair(1, 7.0, heads=spec.heads, head_dim=spec.head_dim), 0)
    copy.update(*kv_pair(1, 7.0, heads=spec.heads, head_dim=spec.head_dim), 9)
    assert c.view_difference(c.view_of(source), before) == ""


@pytest.mark.parametrize("text", CLONE_SPECS)
def test_clone(text):
    check_clone(kv.clone, text)


def _clone_sharing_an_empty_list(source):  # M4
    copy = kv.clone(source)
    if kv.layout_of(source) == "modern" and not source.layers:
        copy.layers = source.layers
    return copy


def _clone_preferring_legacy_slots(source):  # M5
    copy = kv.clone(source)
    if kv.layout_of(source) == "modern":
        for layer in copy.layers:
            if layer.key_cache is not None:
                layer.keys = layer.key_cache.clone()
            if layer.value_cache is not None:
                layer.values = layer.value_cache.clone()
    return copy


def _clone_by_pairs(source):  # M6: a layer missing a side is dropped
    copy = kv.clone(source)
    if kv.layout_of(source) == "modern":
        for layer in copy.layers:
            if (layer.keys is None) != (layer.values is None):
                layer.keys = layer.values = None
    return copy


def _shallow_clone(source):  # M9
    copy = kv.clone(source)
    if kv.layout_of(source) == "modern":
        for twin, layer in zip(copy.layers, source.layers):
            twin.keys, twin.values, twin.key_cache, twin.value_cache = (
                layer.keys, layer.values, layer.key_cache, layer.value_cache)
    else:
        copy.key_cache, copy.value_cache = list(source.key_cache), list(source.value_cache)
    return copy


@pytest.mark.parametrize(
    "planted, text",
    [
        (_clone_sharing_an_empty_list, "modern/f32/1:[]"),
        (_clone_preferring_legacy_slots, "modern/bf16/20:[kvKV3 kvKV3]"),
        (_clone_by_pairs, "modern/f32/22:[k3 kv3]"),
        (_shallow_clone, "modern/f32/1:[kv3 kv3]"),
        (_shallow_clone, "legacy/f16/5:[kv6 kv6]"),
    ],
)
def test_clone_check_catches_planted_clones(planted, text):
    with pytest.raises(AssertionError):
        check_clone(planted, text)


# ---- concat -----------------------------------------------------------------------------------------


def check_concat(concat, parts):
    """merge-correct: content = the parts' logical layers in order, every
    layer initialized, length = the sum, owned, the parts unchanged."""
    caches = [kv.materialize(part) for part in parts]
    before = [c.view_of(cache) for cache in caches]
    merged = concat(caches)
    expected = c.expected_concat(parts)
    assert c.view_difference(c.view_of(merged), c.expected_view(expected)) == ""
    assert kv.is_owned(merged)
    assert merged.get_seq_length() == c.content_seq_length(expected)
    for cache, view in zip(caches, before):
        assert c.view_difference(c.view_of(cache), view) == ""
        assert not observe.shares_storage(merged, cache)


@pytest.mark.parametrize("parts", MERGES)
def test_concat(parts):
    check_concat(kv.concat, parts)


def test_concat_of_one_part_is_a_copy():
    check_concat(kv.concat, [c.expand(c.parse_cache_spec("modern/f32/3:[kv2 KV3]"))])


def _concat_uninitialized(caches):  # M7
    merged = kv.concat(caches)
    for layer in getattr(merged, "layers", []):
        layer.is_initialized = False
    return merged


def _concat_in_reverse(caches):
    return kv.concat(list(reversed(caches)))


@pytest.mark.parametrize("planted", [_concat_uninitialized, _concat_in_reverse])
def test_concat_check_catches_planted_merges(planted):
    parts = [c.expand(c.parse_cache_spec("modern/f32/1:[kv3 kv3]")), c.expand(c.parse_cache_spec("modern/f32/2:[kv2 kv2]"))]
    with pytest.raises(AssertionError):
        check_concat(planted, parts)


def test_concat_needs_a_part():
    with pytest.raises(ValueError, match="at least one"):
        kv.concat([])


# ---- conversions --------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [t for t in SPECS if t.startswith("modern")])
def test_to_legacy_aliases_and_round_trips(text):
    content = c.expand(c.parse_cache_spec(text))
    cache = kv.materialize(content)
    legacy = kv.to_legacy(cache)
    assert c.view_difference(c.view_of(legacy), c.expected_view(c.expected_to_legacy(content))) == ""
    for i, k in enumerate(legacy.key_cache):
        logical = kv.logical_keys(cache, i)
        assert (k is logical) if logical is not None else k.numel() == 0
    back = kv.from_legacy(legacy)
    assert c.view_difference(c.view_of(back), c.expected_view(c.expected_from_legacy(c.expected_to_legacy(content)))) == ""


@pytest.mark.parametrize("text", [t for t in SPECS if t.startswith("legacy")])
def test_from_legacy_copies_and_round_trips(text):
    content = c.expand(c.parse_cache_spec(text))
    cache = kv.materialize(content)
    modern = kv.from_legacy(cache)
    assert all(layer.is_initialized for layer in modern.layers)
    assert not observe.shares_storage(modern, cache)
    assert c.view_difference(c.view_of(kv.to_legacy(modern)), c.view_of(cache)) == ""


def test_conversions_name_their_direction():
    with pytest.raises(ValueError, match="to_legacy: the cache is already legacy"):
        kv.to_legacy(kv.LegacyDynamicCache())
    with pytest.raises(ValueError, match="from_legacy: the cache is already modern"):
        kv.from_legacy(kv.DynamicCache())


def test_transformers_legacy_tuples():
    cache = materialized("modern/f16/3:[kv2 k~1 KV3]")
    pairs = cache.to_legacy_cache()
    assert len(pairs) == 3 and pairs[0][0] is cache.layers[0].keys
    assert pairs[2][1] is cache.layers[2].value_cache
    back = kv.DynamicCache.from_legacy_cache(pairs)
    assert [layer.get_seq_length() for layer in back.layers] == [2, 0, 3]
    assert not observe.shares_storage(back, cache)
    legacy = kv.LegacyDynamicCache.from_legacy_cache(pairs)
    assert legacy.key_cache[0] is pairs[0][0]  # transformers <= 4.53: no copy


def test_layers_index_and_iterate_as_key_value_pairs():
    modern, legacy = materialized("modern/f32/1:[kv2 K1]"), materialized("legacy/f32/1:[kv2 kv1]")
    assert modern[0] == (modern.layers[0].keys, modern.layers[0].values)
    assert modern[1] == (None, None)
    assert [pair[0] for pair in legacy] == legacy.key_cache
    assert len(list(modern)) == len(modern) == 2


def test_footprint_and_holds_tokens():
    cache = materialized("modern/bf16/1:[kv2 K3 -0]")
    tensors, total = kv.footprint(cache)
    assert tensors == 3 and total == (2 * 2 * 2 * 4 + 2 * 3 * 4) * 2
    assert kv.holds_tokens(cache)
    assert not kv.holds_tokens(materialized("modern/f32/1:[kv~3 kv0]"))
