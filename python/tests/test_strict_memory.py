"""The strict example store (python/examples/strict_memory.py): it keeps
whatever it is handed, and raises, naming the fault, where it uses a cache
its model (2 layers of 2x4, float32, modern) could not have made: in a
merge and in generation."""

import pytest
import torch

import strict_memory as sm
from kvcheck_adapter import cache as kv
from kvcheck_adapter import content as c
from kvcheck_adapter import decoder as d

MODEL_CACHE = "modern/f32/1:[kv3 kv3]"

# Caches the model cannot have made, each with the words naming why.
OUTSIDE = {
    "legacy/f32/2:[kv3 kv3]": "a legacy cache",
    "modern/f32/3:[kv3]": "1 layers: the model has 2",
    "modern/f32/4:[kv3 kv3 kv3]": "3 layers: the model has 2",
    "modern/f32/5:[kv3 kv2]": "layer 1 keys hold 2 tokens, layer 0 keys 3",
    "modern/f32/6:[kv3 kv0]": "layer 1 keys have shape [0]",
    "modern/f32/7:[kv3 -0]": "layer 1 holds no keys",
    "modern/f32/8:[kv3 k3]": "layer 1 holds no values",
    "modern/bf16/9:[kv3 kv3]": "layer 0 keys are torch.bfloat16",
    "modern/f32/10/2x8:[kv3 kv3]": "layer 0 keys have shape [1, 2, 3, 8]",
}


def cache_of(text):
    return kv.materialize(c.expand(c.parse_cache_spec(text)))


def test_the_models_caches_merge_and_generate():
    store = sm.StrictMemory()
    store.add([{"id": "a", "cache": cache_of(MODEL_CACHE)}, {"id": "b", "cache": cache_of("modern/f32/2:[kv5 kv5]")}])
    merged = store.get_cache(["a", "b"])
    assert store.cache_fault(merged) is None and merged.get_seq_length() == 8
    assert len(store.generate(merged, [7, 3], 4)) > 0
    assert len(store.generate(None, [7, 3], 4)) > 0
    assert len(store.generate(kv.DynamicCache(), [7, 3], 4)) > 0  # a new cache: the model's own start


@pytest.mark.parametrize("text", sorted(OUTSIDE))
def test_a_cache_outside_the_model_is_kept_and_refused_where_it_is_used(text):
    store = sm.StrictMemory()
    store.add([{"id": "a", "cache": cache_of(MODEL_CACHE)}, {"id": "odd", "cache": cache_of(text)}])
    assert store.get("odd") is not None and store.get_cache(["odd"]) is not None  # kept and copied as is
    with pytest.raises(ValueError, match="merge \\(part 1\\): not a cache of the model: " + OUTSIDE[text].replace("[", "\\[")):
        store.get_cache(["a", "odd"])
    with pytest.raises(ValueError, match="generate: not a cache of the model: "):
        store.generate(store.get("odd").cache, [7, 3], 4)
    assert store.cache_fault(store.get("a").cache) is None


def test_the_model_is_the_decoders():
    store = sm.StrictMemory(model=d.Decoder(d.DecoderConfig(layer_count=3, head_count=1, head_dim=8)))
    assert (store.layers, store.heads, store.head_dim) == (3, 1, 8)
    assert store.cache_fault(cache_of("modern/f32/1/1x8:[kv2 kv2 kv2]")) is None
    assert store.cache_fault(cache_of(MODEL_CACHE)) == "2 layers: the model has 3"
    assert sm.DTYPE == torch.float32 and sm.LAYOUT == "modern"


def test_the_historic_bugs_are_activation_memorys():
    assert sm.BUGS == ("stored_to_generation", "single_id_returns_stored", "merge_uninitialized", "shallow_clone", "double_copy",
                       "turn_drops_last_token", "stored_turn_stays_writable", "extract_keeps_working_cache",
                       "evicts_most_recent", "skips_digest", "unlocked_index")
    store = sm.StrictMemory(bugs=["single_id_returns_stored"])
    store.add([{"id": "a", "cache": cache_of(MODEL_CACHE)}])
    assert store.get_cache(["a"]) is store.get("a").cache
