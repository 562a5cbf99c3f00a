"""decoder.py: the model's own contract (its equality with the C++ decoder
is test_agreement's): generation equivalence, sensitivity to every cached
token, how it drives a cache, and its errors. The equivalence and
sensitivity checks are run on planted models too."""

import numpy as np
import pytest
import torch

from kvcheck_adapter import cache as kv
from kvcheck_adapter import content as c
from kvcheck_adapter import decoder as d

MODEL = d.Decoder()
MEMORY = [5, 9, 2, 17, 3, 3]
PROMPTS = [[7, 3], [1], [30, 30, 30, 4]]


def check_generation_equivalent(model, layout):
    """generate(memory cache + prompt) == generate_without_cache(memory + prompt)."""
    memory = d.memory_cache(model, MEMORY, layout)
    for prompt in PROMPTS:
        cached = d.generate(model, prompt, kv.clone(memory), 8)
        assert cached == d.generate_without_cache(model, MEMORY + prompt, 8), prompt


@pytest.mark.parametrize("layout", ["modern", "legacy"])
def test_generation_with_a_memory_equals_recomputation(layout):
    check_generation_equivalent(MODEL, layout)


class _ForgetfulDecoder(d.Decoder):
    """Planted: positions restart at 0 on every forward (the past's length unread)."""

    def _embed_rows(self, weights, tokens, first_position, extra=""):
        return super()._embed_rows(weights, tokens, 0, extra)


class _ShortSightedDecoder(d.Decoder):
    """Planted: attends only over the new tokens, not the cache."""

    def _attend(self, qkv, keys, values, count, weights):
        return super()._attend(qkv, keys[:, -count:], values[:, -count:], count, weights)


@pytest.mark.parametrize("planted", [_ForgetfulDecoder, _ShortSightedDecoder])
def test_equivalence_check_catches_planted_models(planted):
    with pytest.raises(AssertionError):
        check_generation_equivalent(planted(), "modern")


def _drop_token(cache, at):
    for layer in cache.layers:
        keep = [i for i in range(layer.keys.shape[2]) if i != at]
        layer.keys, layer.values = layer.keys[:, :, keep].clone(), layer.values[:, :, keep].clone()


def _double_token(cache, at):
    for layer in cache.layers:
        order = list(range(layer.keys.shape[2]))
        order.insert(at, at)
        layer.keys, layer.values = layer.keys[:, :, order].clone(), layer.values[:, :, order].clone()


def test_every_cached_token_changes_the_generated_tokens():
    memory = d.memory_cache(MODEL, MEMORY, "modern")
    base = d.generate(MODEL, [7, 3], kv.clone(memory), 8)
    for at in range(len(MEMORY)):
        for change in (_drop_token, _double_token):
            changed = kv.clone(memory)
            change(changed, at)
            assert d.generate(MODEL, [7, 3], changed, 8) != base, (change.__name__, at)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_memory_keeps_its_dtype_while_the_model_decodes(dtype):
    memory = d.memory_cache(MODEL, MEMORY, "legacy", dtype)
    working = kv.clone(memory)
    d.generate(MODEL, [7, 3], working, 4)
    assert all(t.dtype == dtype for t in working.key_cache + working.value_cache)
    assert working.get_seq_length() == len(MEMORY) + 2 + 3


def test_generation_stops_at_eos_and_at_the_limit():
    tokens = d.generate(MODEL, [7, 3], kv.DynamicCache(), 200)
    assert len(tokens) < 200 and tokens[-1] == MODEL.eos_token
    assert MODEL.eos_token not in tokens[:-1]
    assert d.generate(MODEL, [7, 3], kv.DynamicCache(), 0) == []
    never = d.Decoder(d.DecoderConfig(eos_token=-1))
    assert len(d.generate(never, [7, 3], kv.DynamicCache(), 40)) == 40
    streamed = list(d.generate_stream(MODEL, [7, 3], kv.DynamicCache(), 200))
    assert streamed == tokens


def test_the_model_drives_any_cache_through_get_seq_length_and_update():
    class Recording:
        """A cache of its own kind: a dict of layers, no kvcheck class."""

        def __init__(self):
            self.calls, self.held = [], {}

        def get_seq_length(self, layer_idx=0):
            self.calls.append(("get_seq_length", layer_idx))
            return self.held[layer_idx][0].shape[2] if layer_idx in self.held else 0

        def update(self, k, v, layer_idx, cache_kwargs=None):
            self.calls.append(("update", layer_idx, tuple(k.shape), tuple(cache_kwargs["cache_position"].tolist())))
            old = self.held.get(layer_idx)
            self.held[layer_idx] = (k, v) if old is None else (torch.cat([old[0], k], 2), torch.cat([old[1], v], 2))
            return self.held[layer_idx]

    cache = Recording()
    first = MODEL.forward([7, 3, 1], cache)
    MODEL.forward([first], cache)
    assert cache.calls == [
        ("get_seq_length", 0), ("update", 0, (1, 2, 3, 4), (0, 1, 2)), ("update", 1, (1, 2, 3, 4), (0, 1, 2)),
        ("get_seq_length", 0), ("update", 0, (1, 2, 1, 4), (3,)), ("update", 1, (1, 2, 1, 4), (3,)),
    ]
    reference = kv.DynamicCache()
    assert MODEL.forward([7, 3, 1], reference) == first


def test_the_model_attends_over_what_update_returns():
    class Doubling(kv.DynamicCache):
        def update(self, k, v, layer_idx, cache_kwargs=None):
            keys, values = super().update(k, v, layer_idx, cache_kwargs)
            return torch.cat([keys, keys], 2), torch.cat([values, values], 2)

    assert MODEL.forward([7, 3, 1, 4], kv.DynamicCache()) != MODEL.forward([7, 3, 1, 4], Doubling())


def test_memoised_steps_answer_only_for_the_bytes_they_read():
    """A rerun on the same cache content is looked up (_StepMemo), and gives
    what a model without a memo computes; a cache whose update hands back
    other keys than the first run saw (one value negated) is computed anew:
    the memo cannot hide what a cache does."""

    class Negating(kv.DynamicCache):
        def update(self, k, v, layer_idx, cache_kwargs=None):
            keys, values = super().update(k, v, layer_idx, cache_kwargs)
            changed = keys.clone()
            changed[0, 0, 0, 0] = -changed[0, 0, 0, 0]
            return changed, values

    model = d.Decoder()
    for tokens in PROMPTS + [MEMORY]:
        plain = model.forward(tokens, kv.DynamicCache())
        assert model.forward(tokens, kv.DynamicCache()) == plain == d.Decoder().forward(tokens, kv.DynamicCache())
        assert model.forward(tokens, Negating()) == d.Decoder().forward(tokens, Negating())
    assert any(model.forward(t, Negating()) != model.forward(t, kv.DynamicCache()) for t in PROMPTS + [MEMORY])


def test_bad_input_is_refused_with_the_c_plus_plus_messages():
    with pytest.raises(ValueError, match=r"Decoder: forward needs at least one token"):
        MODEL.forward([], kv.DynamicCache())
    with pytest.raises(ValueError, match=r"Decoder: token 32 outside \[0, 32\)"):
        MODEL.forward([32], kv.DynamicCache())
    with pytest.raises(ValueError, match="the K/V dtype must be floating"):
        MODEL.forward_as([1], kv.DynamicCache(), torch.int32)
    with pytest.raises(ValueError, match="eos_token must be -1 or in"):
        d.Decoder(d.DecoderConfig(eos_token=32))
    with pytest.raises(ValueError, match="generate: the prompt is empty"):
        d.generate(MODEL, [], kv.DynamicCache(), 3)

    class Odd(kv.DynamicCache):  # holds K/V of three heads
        def update(self, k, v, layer_idx, cache_kwargs=None):
            super().update(k, v, layer_idx, cache_kwargs)
            return torch.zeros(1, 3, 3, 4), None

    with pytest.raises(ValueError, match=r"Decoder: layer 0 keys of shape \[1, 3, 3, 4\], expected \[1, 2, >= 1, 4\]"):
        MODEL.forward([1], Odd())
    with pytest.raises(ValueError, match=r"Decoder: layer 0 holds 4 keys but 1 values"):
        one_sided = kv.DynamicCache()
        one_sided.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), 0)
        one_sided.layers[0].values = None
        MODEL.forward([1], one_sided)


@pytest.mark.parametrize("name, numpy_function", [("_EXPF", np.exp), ("_SINF", np.sin)])
def test_exp_and_sin_are_the_c_librarys_float_functions(name, numpy_function, monkeypatch):
    """The decoder's float32 exp and sin are glibc's expf and sinf, as C++'s
    std::exp(float) and std::sin(float); a float64 computation rounded to
    float32 differs from them at some inputs, found here. (The agreement
    corpus cannot see such a last-bit difference in the tokens.)"""
    function = getattr(d, name)
    assert function is not None, "the C library's function was not found"
    x = (-np.random.default_rng(1).random(200000) * 40).astype(np.float32)
    libm = np.array([function(float(v)) for v in x], dtype=np.float32)
    rounded = numpy_function(x.astype(np.float64)).astype(np.float32)
    differing = x[libm != rounded]
    assert differing.size > 0
    assert np.array_equal(d._float32_map(function, numpy_function, differing), libm[libm != rounded])
    monkeypatch.setattr(d, name, None)  # planted: the float64 fallback
    assert not np.array_equal(d._float32_map(None, numpy_function, differing), libm[libm != rounded])


@pytest.mark.parametrize(
    "name, numpy_function, window, inputs",
    [
        ("_EXPF", np.exp, d._EXPF_WINDOW, lambda rng: -rng.random(2_000_000) * 110),  # subnormal results too
        ("_EXPF", np.exp, d._EXPF_WINDOW, lambda rng: -rng.random(2_000_000) * 20),  # attention's range
        ("_SINF", np.sin, d._SINF_WINDOW, lambda rng: (rng.random(1_000_000) - 0.5) * 4000),
    ],
)
def test_the_vector_way_is_the_c_librarys_function_bit_for_bit(name, numpy_function, window, inputs):
    function = getattr(d, name)
    x = inputs(np.random.default_rng(11)).astype(np.float32)
    x[:4] = [0.0, -0.0, np.float32(-103.97), np.float32(-87.34)]
    libm = d._float32_map(function, numpy_function, x)  # one C call per value
    vector = d._float32_map(function, numpy_function, x, window)
    assert np.array_equal(vector.view(np.uint32), libm.view(np.uint32))
    # Planted: a window far below the C function's own error takes numpy's
    # rounding where the C function rounds the other way.
    narrow = d._float32_map(function, numpy_function, x, window * 2.0**-12)
    assert not np.array_equal(narrow.view(np.uint32), libm.view(np.uint32))


def test_sums_in_blocks_are_the_sums_in_one_pass(monkeypatch):
    rng = np.random.default_rng(4)
    rows = rng.standard_normal((3, 300)).astype(np.float32)
    weight = rng.standard_normal((300, 40)).astype(np.float32)
    whole = d._row_times(rows, weight)
    monkeypatch.setattr(d, "_PRODUCTS_MAX", 3 * 40 * 7)  # blocks of 7 rows of the weight
    assert np.array_equal(d._row_times(rows, weight), whole)
    sequential = np.zeros((3, 40), dtype=np.float32)
    for e in range(300):
        sequential += rows[:, e : e + 1] * weight[e]
    assert np.array_equal(whole, sequential)


def test_the_decoder_adapts_to_the_caches_geometry_and_layer_count():
    memory = kv.materialize(c.expand(c.parse_cache_spec("modern/f32/3/4x8:[kv5 kv5 kv5]")))
    working = kv.clone(memory)
    tokens = d.generate(MODEL, [7, 3], working, 4)
    assert len(working.layers) == 3
    assert all(tuple(layer.keys.shape) == (1, 4, 5 + 2 + len(tokens) - 1, 8) for layer in working.layers)
    # Layer i's weights do not depend on how many layers run; another
    # geometry's are drawn from a seed of their own.
    three = MODEL._weights_for(4, 8, 3)
    assert np.array_equal(d.Decoder()._weights_for(4, 8, 1).layers[0][0], three.layers[0][0])
    assert not np.array_equal(MODEL._weights_for(2, 16, 1).embedding, three.embedding[:, :32])


def test_layers_drawn_later_continue_the_stream():
    """A geometry's weights grown layer by layer (a deeper cache arrives
    later) are those drawn all at once."""
    grown = d.Decoder()
    grown._weights_for(4, 8, 1)
    grown._weights_for(4, 8, 2)
    at_once = d.Decoder()._weights_for(4, 8, 5)
    layers = grown._weights_for(4, 8, 5).layers
    assert len(layers) == 5
    for (qkv, out), (qkv_once, out_once) in zip(layers, at_once.layers):
        assert np.array_equal(qkv, qkv_once) and np.array_equal(out, out_once)


def test_weights_are_the_seeded_stream():
    a, b = d.Decoder(d.DecoderConfig(seed=5)), d.Decoder(d.DecoderConfig(seed=6))
    assert (a._embedding == d.Decoder(d.DecoderConfig(seed=5))._embedding).all()
    assert not (a._embedding == b._embedding).all()
    assert a._embedding.min() >= -1 and a._embedding.max() < 1
    assert (a._embedding * 2**23 == (a._embedding * 2**23).round()).all()


def _c_first_argmax(values):
    """C++ first_argmax, element by element."""
    best = 0
    for c in range(1, len(values)):
        if np.isnan(values[best]):
            break
        if np.isnan(values[c]) or values[c] > values[best]:
            best = c
    return best


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # sin of an infinity
def test_the_readout_is_the_first_argmax_of_sinf_of_every_logit():
    """_folded_argmax computes sinf only for the logits near the largest
    float64 sine; it must pick what C++ picks from sinf of all of them:
    ties, near-ties closer than a float32 ULP, +0/-0, NaN and infinities."""
    rng = np.random.default_rng(3)
    sinf = np.vectorize(lambda v: d._SINF(float(v)), otypes=[np.float32])
    cases = [(rng.standard_normal(32) * 40).astype(np.float32) for _ in range(3000)]
    peak = np.float32(np.pi / 2)
    for _ in range(3000):  # several logits at or next to the sine's peak: the float64 sines nearly tie
        values = (rng.standard_normal(32) * 40).astype(np.float32)
        at = rng.choice(32, size=4, replace=False)
        values[at] = peak + rng.integers(-3, 4, size=4).astype(np.float32) * np.float32(2.0**-22)
        cases.append(values)
    for special in ([0.0, -0.0, 0.0], [-0.0, 0.0], [1.0, np.nan, 2.0, np.nan], [np.inf, 1.0], [3.0, -np.inf, 3.0]):
        cases.append(np.array(special, dtype=np.float32))
    near_ties = 0
    for values in cases:
        exact = sinf(values)
        wide = np.sin(values.astype(np.float64))
        if not np.isnan(wide).all():
            near_ties += int(np.count_nonzero(wide >= np.nanmax(wide) - d._READOUT_MARGIN) > 1)
        assert d._folded_argmax(values) == _c_first_argmax(exact) == d._first_argmax(exact), values
    assert near_ties > 100  # the sinf path was taken


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # inf - inf in the poisoned attention
def test_a_prefill_token_reads_no_value_it_does_not_see():
    """Token i of a prefill attends over rows 0..P of what update handed
    back (C++ reads no further): values the cache hands back after P, even
    infinite ones, change nothing of token i's row. Seen in the next
    layer's keys, which are made from each token's row alone."""

    class Poisoning(kv.DynamicCache):
        def update(self, k, v, layer_idx, cache_kwargs=None):
            keys, values = super().update(k, v, layer_idx, cache_kwargs)
            poisoned = values.clone()
            poisoned[0, :, -1] = float("inf")  # the last new token's own values
            return keys, poisoned

    model = d.Decoder()
    whole = Poisoning()
    model.forward([7, 3, 1], whole)
    prefix = kv.DynamicCache()
    for token in [7, 3]:
        model.forward([token], prefix)  # tokens 0 and 1 see what they see in the prefill, no poison
    assert torch.isfinite(whole.layers[1].keys[0, :, :2]).all()
    assert torch.equal(whole.layers[1].keys[0, :, :2], prefix.layers[1].keys[0, :, :2])
