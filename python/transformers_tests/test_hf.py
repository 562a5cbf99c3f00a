"""kvcheck_adapter.hf on the installed transformers: real caches holding
kvcheck's content read as the content says (the SDK's readers on real
objects), and the tiny real model generating over them."""

import copy

import pytest
import torch

from conftest import require_transformers

require_transformers()

import transformers  # noqa: E402

from kvcheck_adapter import adapter as sdk  # noqa: E402
from kvcheck_adapter import content as c  # noqa: E402
from kvcheck_adapter import copies  # noqa: E402
from kvcheck_adapter import hf  # noqa: E402
from kvcheck_adapter import observe  # noqa: E402
from kvcheck_adapter import wire  # noqa: E402

LAYOUT = hf.LAYOUT
OTHER = "legacy" if LAYOUT == "modern" else "modern"
# In the model's domain (2 layers, 2 heads of 8, float32), and around it:
# empty caches, empty layers, another geometry and dtype (readers only).
SPECS = [
    f"{LAYOUT}/f32/1/2x8:[kv5 kv5]",
    f"{LAYOUT}/f32/2/2x8:[kv1 kv1]",
    f"{LAYOUT}/f32/3/2x8:[kv64 kv64]",
    f"{LAYOUT}/f32/4/2x8:[]",
    f"{LAYOUT}/f32/5/2x8:[kv0 kv0]",
    f"{LAYOUT}/bf16/6/4x2:[kv3 kv7 kv1]",
    f"{LAYOUT}/f16/7:[kv2]",
]
PROMPT = [7, 3]


def content_of(spec):
    return c.expand(c.parse_cache_spec(spec))


@pytest.fixture(scope="module")
def model():
    return hf.tiny_model()


# ---- reading real caches ------------------------------------------------------------------


@pytest.mark.parametrize("spec", SPECS)
def test_a_materialized_real_cache_reads_as_its_content(spec):
    wanted = content_of(spec)
    cache = hf.materialize(wanted)
    assert type(cache) is transformers.DynamicCache
    assert c.view_difference(c.view_of(cache), c.expected_view(wanted)) == ""
    assert wire.view_from_json(wire.view_json(cache)) == c.expected_view(wanted)
    layers = c.parse_cache_spec(spec).layers
    tokens = layers[0].tokens if layers else 0
    assert observe.seq_length(cache) == cache.get_seq_length() == tokens


@pytest.mark.parametrize("spec", SPECS)
def test_storage_identities_of_a_real_cache(spec):
    cache = hf.materialize(content_of(spec))
    ids = wire.storage_of(cache)
    assert ids == observe.storage_of(cache)
    holding = [t for t in _tensors(cache) if t.numel() > 0]
    assert len(ids) == len(set(ids)) == (1 if LAYOUT == "modern" else 2) + (len(cache.layers) if LAYOUT == "modern" else 0) + len(holding)
    twin = copy.deepcopy(cache)
    assert not observe.shares_storage(cache, twin)
    assert wire.view_json(twin) == wire.view_json(cache)


def _tensors(cache):
    if LAYOUT == "legacy":
        return [t for t in cache.key_cache + cache.value_cache if t is not None]
    return [t for layer in cache.layers for t in (layer.keys, layer.values) if t is not None]


@pytest.mark.parametrize("spec", SPECS[:3])
def test_materialize_round_trips_through_the_version_s_own_update(spec):
    """The version's update appends to a materialized cache as to one it
    filled itself: its layers are initialized (flag and all), its length
    true; the content read back is the content given."""
    wanted = content_of(spec)
    cache = hf.materialize(wanted)
    length = cache.get_seq_length()
    new = torch.ones(1, wanted.heads, 2, wanted.head_dim)
    for i in range(len(wanted.layers)):
        keys, values = cache.update(new, new, i)
        assert keys.shape[-2] == length + 2
    assert cache.get_seq_length() == length + 2
    if hf.HAS_INITIALIZED_FLAG:
        assert all(layer.is_initialized for layer in cache.layers)
    again = hf.materialize(wanted)
    assert c.view_difference(c.view_of(again), c.expected_view(wanted)) == ""


def test_an_uninitialized_layer_where_the_version_has_the_flag():
    if LAYOUT == "legacy":
        pytest.skip("a legacy cache has no layer objects: every layer counts as initialized")
    wanted = content_of(f"{LAYOUT}/f32/8/2x8:[kv~3 kv3]")
    if not hf.HAS_INITIALIZED_FLAG:
        with pytest.raises(hf.OutsideDomain, match="initialized"):
            hf.materialize(wanted)
        return
    cache = hf.materialize(wanted)
    assert cache.layers[0].is_initialized is False and cache.layers[0].keys.shape[-2] == 3
    assert c.view_difference(c.view_of(cache), c.expected_view(wanted)) == ""
    assert cache.get_seq_length() == 0  # what the real layer says: the model would drop its tokens


@pytest.mark.parametrize(
    "spec, fault",
    [
        (f"{OTHER}/f32/1/2x8:[kv2 kv2]", "layout"),
        ("modern/f32/1/2x8:[kvKV2 kv2]", "legacy-named" if LAYOUT == "modern" else "layout"),
    ],
)
def test_content_a_real_cache_cannot_hold_is_refused_by_name(spec, fault):
    with pytest.raises(hf.OutsideDomain, match=fault):
        hf.materialize(content_of(spec))


# ---- the model ------------------------------------------------------------------------


def test_the_model_domain_is_the_model_s(model):
    domain = hf.model_domain(model)
    assert domain == {"layers": 2, "heads": 2, "head_dim": 8, "dtypes": ["f32"], "layouts": [LAYOUT], "odd_layers": False}
    assert hf.domain_text(domain) == f"layers=2,heads=2,head_dim=8,dtype=f32,layout={LAYOUT}"
    wide = dict(domain, dtypes=["f32", "bf16"], layouts=["modern", "legacy"], odd_layers=True)
    assert hf.domain_text(wide) == "layers=2,heads=2,head_dim=8,dtype=f32+bf16,layout=modern+legacy,odd_layers=yes"
    assert model.config.max_position_embeddings >= 3 * 2048 + 3 + 4  # kvcheck's largest merge, prompt, new tokens


def test_generation_is_deterministic_and_depends_on_every_cached_token(model):
    wanted = content_of(SPECS[0])
    first = hf.generate(model, PROMPT, hf.materialize(wanted), 6)
    assert len(first) == 6
    assert hf.generate(model, PROMPT, hf.materialize(wanted), 6) == first
    assert hf.generate(hf.tiny_model(), PROMPT, hf.materialize(wanted), 6) == first  # the same seeded weights
    shorter = hf.generate(model, PROMPT, hf.materialize(content_of(f"{LAYOUT}/f32/1/2x8:[kv4 kv4]")), 6)
    other = hf.generate(model, PROMPT, hf.materialize(content_of(f"{LAYOUT}/f32/9/2x8:[kv5 kv5]")), 6)
    assert first != shorter or first != other  # the cache matters (a fixed seed: no flake)


def test_generation_writes_into_the_cache_it_is_given(model):
    cache = hf.materialize(content_of(SPECS[0]))
    hf.generate(model, PROMPT, cache, 4)
    assert cache.get_seq_length() == 5 + len(PROMPT) + 4 - 1  # the last token is not fed back


def test_generation_over_an_empty_cache_and_of_no_tokens(model):
    assert len(hf.generate(model, PROMPT, hf.new_cache(), 3)) == 3
    empty = hf.new_cache()
    assert hf.generate(model, PROMPT, empty, 0) == [] and empty.get_seq_length() == 0
    with pytest.raises(ValueError, match="prompt is empty"):
        hf.generate(model, [], hf.new_cache(), 3)


@pytest.mark.parametrize(
    "spec, fault",
    [
        (f"{LAYOUT}/f32/1:[kv5 kv5]", r"needs float32 \[1, 2, 5, 8\]"),
        (f"{LAYOUT}/f32/1/2x8:[kv5]", "holds 1 layers"),
        (f"{LAYOUT}/f32/1/2x8:[kv5 kv4]", r"needs float32 \[1, 2, 5, 8\]"),
        (f"{LAYOUT}/f16/1/2x8:[kv5 kv5]", "needs float32"),
    ],
)
def test_a_cache_outside_the_domain_is_refused_in_one_sentence(model, spec, fault):
    with pytest.raises(hf.OutsideDomain, match=fault):
        hf.generate(model, PROMPT, hf.materialize(content_of(spec)), 2)


def test_the_copy_tracker_sees_the_real_model_s_forwards(model):
    stored = hf.materialize(content_of(SPECS[0]))
    tracker = copies.CopyTracker()
    tracker.track(stored)
    with tracker.record() as copying:
        working = copy.deepcopy(stored)
    assert [(s.tensors, s.bytes) for s in copying.copies] == [(4, 4 * 2 * 5 * 8 * 4)]
    with tracker.record() as generating:
        hf.generate(model, PROMPT, working, 4)
    # Prefill and three decoding steps; the model's appends are no copies;
    # alive on the path: the stored set and the working one.
    assert generating.model_forwards == 4
    assert generating.copies == []
    assert generating.peak_sets_on_path == 2
    with tracker.record() as aliased:
        hf.generate(model, PROMPT, stored, 2)
    assert aliased.peak_sets_on_path == 1 and aliased.copies == []


def test_a_derived_owned_marker_needs_no_attribute():
    stored, other = hf.materialize(content_of(SPECS[0])), hf.materialize(content_of(SPECS[1]))
    assert not hasattr(stored, "owned")

    class Store(sdk.Adapter):
        owned = "derived"

        def stored_ids(self):
            return ["a"]

        def stored_cache(self, id):
            return stored

    engine = Store()
    assert engine.is_owned(other)
    assert engine.is_owned(copy.deepcopy(stored))
    assert not engine.is_owned(stored)
    shallow = copy.copy(stored)
    if LAYOUT == "modern":
        shallow.layers = [copy.copy(layer) for layer in stored.layers]  # new objects, the same tensors
    else:
        shallow.key_cache, shallow.value_cache = list(stored.key_cache), list(stored.value_cache)
    assert not engine.is_owned(shallow)
