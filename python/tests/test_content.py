"""content.py: specs, values, slot tensors, the content hash, views,
digests and difference texts. Every property check is a function of the
implementation it checks, run once on the real one (must pass) and once on
a planted bug (must fail)."""

import struct

import numpy as np
import pytest
import torch

from conftest import corpus_lines
from kvcheck_adapter import cache as kv
from kvcheck_adapter import content as c

SPECS = corpus_lines("spec")


# ---- specs ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", SPECS)
def test_spec_text_round_trips(text):
    assert c.format_cache_spec(c.parse_cache_spec(text)) == text


def test_spec_fields():
    spec = c.parse_cache_spec("modern/bf16/7:[kv3 k~2 KV4 -0]")
    assert (spec.layout, spec.dtype, spec.seed) == ("modern", "bf16", 7)
    assert spec.layers == [
        c.LayerSpec(0b0011, True, 3),
        c.LayerSpec(0b0001, False, 2),
        c.LayerSpec(0b1100, True, 4),
        c.LayerSpec(0b0000, True, 0),
    ]


def test_expand_legacy_layers_hold_both_sides_and_are_initialized():
    content = c.expand(c.parse_cache_spec("legacy/f16/3:[k~2 KV1]"))
    for layer in content.layers:
        assert layer.initialized
        assert [slot.present for slot in layer.slots] == [True, True, False, False]


def test_spec_geometry_is_written_only_when_not_the_default():
    spec = c.parse_cache_spec("legacy/bf16/9/4x16:[kv300 kv300]")
    assert (spec.heads, spec.head_dim) == (4, 16)
    assert c.format_cache_spec(spec) == "legacy/bf16/9/4x16:[kv300 kv300]"
    default = c.parse_cache_spec("legacy/bf16/9/2x4:[kv3]")
    assert (default.heads, default.head_dim) == (2, 4)
    assert c.format_cache_spec(default) == "legacy/bf16/9:[kv3]"
    content = c.expand(spec)
    assert (content.heads, content.head_dim) == (4, 16)
    assert all(seg.precision == "bf16" for layer in content.layers for slot in layer.slots for seg in slot.segments)
    assert c.expected_view(content).layers[0].slots[0].shape == (1, 4, 300, 16)
    with pytest.raises(ValueError, match="invalid geometry 0x4"):
        c.format_cache_spec(c.CacheSpec(heads=0))


def test_expand_gives_each_slot_its_own_seed():
    content = c.expand(c.parse_cache_spec("modern/f32/5:[kvKV2 kv2]"))
    seeds = [slot.segments[0].seed for layer in content.layers for slot in layer.slots if slot.present]
    assert len(set(seeds)) == len(seeds) == 6
    assert seeds[0] == c.slot_seed(5, 0, 0)


# ---- values and tensors ------------------------------------------------------------------


def check_values_match_slot_value(values_of):
    """values_of(slot, heads, head_dim) must hold round_to(precision,
    slot_value) per element, each segment's tokens counted from its start."""
    slot = c.SlotContent(True, [c.Segment(11, 3, "f16"), c.Segment(2**64 - 1, 2, "f32"), c.Segment(5, 4, "bf16")])
    values = values_of(slot, 3, 5)
    assert values.shape == (3, 9, 5)
    starts = [0, 3, 5]
    for head in range(3):
        for token in range(9):
            k = max(i for i, start in enumerate(starts) if start <= token)
            segment, at = slot.segments[k], token - starts[k]
            for dim in range(5):
                expected = c.round_to(segment.precision, c.slot_value(segment.seed, head, at, dim))
                assert values[head, token, dim] == expected


def test_slot_values_are_slot_value_per_element_rounded_to_the_segment():
    check_values_match_slot_value(c.slot_values)


@pytest.mark.parametrize(
    "planted",
    [
        # every segment's tokens counted from the slot's start
        lambda slot, heads, head_dim: c.slot_values(
            c.SlotContent(True, [c.Segment(slot.segments[0].seed, slot.tokens(), "f32")]), heads, head_dim
        ),
        # the segments' precisions ignored
        lambda slot, heads, head_dim: c.slot_values(
            c.SlotContent(True, [c.Segment(s.seed, s.tokens) for s in slot.segments]), heads, head_dim
        ),
    ],
)
def test_slot_values_check_catches_planted_values(planted):
    with pytest.raises(AssertionError):
        check_values_match_slot_value(planted)


def test_segment_values_in_arrays_are_slot_value_for_every_exponent_band():
    """The array form (an exponent table) against the scalar slot_value,
    on enough elements that all 256 values of x's bits 32-39 occur."""
    seeds = np.array([3, 2**64 - 1, 0x9E3779B97F4A7C15], dtype=np.uint64)
    heads, tokens, head_dim = 4, 64, 8
    mix = c.element_index_mix(heads, tokens, head_dim)
    seen = set()
    for seed in seeds.tolist():
        values = c.segment_values_raw(np.uint64(seed), mix).reshape(heads, tokens, head_dim)
        for head in range(heads):
            for token in range(tokens):
                for dim in range(head_dim):
                    expected = c.slot_value(seed, head, token, dim)
                    assert values[head, token, dim].tobytes() == np.float32(expected).tobytes()
                    index = ((head << 40) ^ (token << 16) ^ dim) & (2**64 - 1)
                    seen.add((c.splitmix64(seed ^ c.splitmix64(index)) >> 32) & 0xFF)
    assert len(seen) == 256


def test_slot_values_have_full_mantissas_and_three_magnitude_bands():
    values = c.slot_values(c.SlotContent(True, [c.Segment(3, 4096)]), 2, 4).reshape(-1)
    magnitudes = np.abs(values)
    middle = (magnitudes >= 0.125) & (magnitudes < 4)
    large = (magnitudes >= 2.0**8) & (magnitudes < 2.0**12)
    tiny = (magnitudes >= 2.0**-26) & (magnitudes < 2.0**-14)
    assert np.all(middle | large | tiny)
    assert abs(middle.mean() - 14 / 16) < 0.02 and abs(large.mean() - 1 / 16) < 0.01 and abs(tiny.mean() - 1 / 16) < 0.01
    assert (values < 0).mean() == pytest.approx(0.5, abs=0.02)
    for dtype in ("f16", "bf16"):  # almost none is exact in a half dtype
        assert (c.round_to_array(dtype, values) != values).mean() > 0.99


def _bit_patterns():
    """float32 patterns that test a rounding: random ones, every tie of
    float16 and bfloat16 around a few values, float16's subnormals and
    range edges, zeros, infinities and NaNs."""
    rng = np.random.default_rng(7)
    random = rng.integers(0, 2**32, 200000, dtype=np.uint64).astype(np.uint32)
    edges = np.array(
        [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFC00001, 1, 0x00800000,
         0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001, 0x477FFFFF, 0x47800000, 0x7F7FFFFF,
         0x33000000, 0x33000001, 0x32FFFFFF, 0x33800000, 0x387FC000, 0x387FE000, 0x38800000, 0x38801000],
        dtype=np.uint32,
    )
    base = rng.integers(0, 2**32, 2000, dtype=np.uint64).astype(np.uint32)
    ties_f16 = (base & np.uint32(0xFFFFE000)) | np.uint32(0x1000)
    ties_bf16 = (base & np.uint32(0xFFFF0000)) | np.uint32(0x8000)
    exponents = rng.integers(100, 113, 20000).astype(np.uint32)  # 2^-27 .. 2^-15: float16's subnormals
    subnormal = (base.repeat(10) & np.uint32(0x807FFFFF)) | (exponents << np.uint32(23))
    return np.concatenate([random, edges, ties_f16, ties_bf16, subnormal, subnormal | np.uint32(0xFFF)])


def check_round_to_is_torchs(round_array):
    values = _bit_patterns().view(np.float32)
    for dtype in ("f16", "bf16"):
        expected = torch.from_numpy(values.copy()).to(c.TORCH_DTYPES[dtype]).to(torch.float32).numpy()
        got = round_array(dtype, values)
        same = (got.view(np.uint32) == expected.view(np.uint32)) | (np.isnan(got) & np.isnan(expected))
        assert same.all(), (dtype, values[~same][:5], got[~same][:5], expected[~same][:5])
    assert c.round_to_array("f32", values) is values


def test_round_to_is_torchs_to_bit_for_bit():
    check_round_to_is_torchs(c.round_to_array)
    for dtype in ("f16", "bf16"):
        for bits in (0x3F800FFF, 0x33000001, 0x477FF000, 0x3F801000, 0x3F808000, 0x3F818000):
            value = np.array([bits], dtype=np.uint32).view(np.float32)
            assert c.round_to(dtype, float(value[0])) == float(c.round_to_array(dtype, value)[0])


def _truncating(dtype, values):
    bits = values.view(np.uint32)
    return (bits & np.uint32(0xFFFFE000 if dtype == "f16" else 0xFFFF0000)).view(np.float32)


def _flushing_subnormals(dtype, values):
    rounded = c.round_to_array(dtype, values)
    return np.where(np.abs(values) < 2.0**-14, np.float32(0), rounded).astype(np.float32) if dtype == "f16" else rounded


def _ties_away(dtype, values):
    rounded = c.round_to_array(dtype, values)
    bits = values.view(np.uint32)
    tie = (bits & np.uint32(0x1FFF if dtype == "f16" else 0xFFFF)) == np.uint32(0x1000 if dtype == "f16" else 0x8000)
    away = np.where(tie, (bits + np.uint32(0x1000 if dtype == "f16" else 0x8000)) & np.uint32(0xFFFFE000 if dtype == "f16" else 0xFFFF0000), rounded.view(np.uint32))
    return away.astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("planted", [_truncating, _flushing_subnormals, _ties_away])
def test_round_to_check_catches_planted_roundings(planted):
    with pytest.raises(AssertionError):
        check_round_to_is_torchs(planted)


@pytest.mark.parametrize("dtype", c.DTYPES)
def test_slot_tensor_shapes_and_dtypes(dtype):
    torch_dtype = c.TORCH_DTYPES[dtype]
    assert c.slot_tensor(c.SlotContent(), dtype) is None
    empty = c.slot_tensor(c.SlotContent(True), dtype)
    assert tuple(empty.shape) == (0,) and empty.dtype == torch_dtype
    slot = c.SlotContent(True, [c.Segment(9, 5, dtype)])
    full = c.slot_tensor(slot, dtype, 3, 6)
    assert tuple(full.shape) == (1, 3, 5, 6) and full.dtype == torch_dtype
    assert torch.equal(full.to(torch.float32)[0], torch.from_numpy(c.slot_values(slot, 3, 6)))
    wide = c.slot_tensor(c.SlotContent(True, [c.Segment(9, 5, "f32")]), dtype, 3, 6)  # cast: rounded once more
    assert torch.equal(wide, full)


def test_slot_tensors_have_storages_of_their_own():
    slot = c.SlotContent(True, [c.Segment(9, 5)])
    a, b = c.slot_tensor(slot, "f32"), c.slot_tensor(slot, "f32")
    assert a.data_ptr() != b.data_ptr()


def test_content_bytes_counts_every_present_slot_at_the_content_dtype():
    content = c.expand(c.parse_cache_spec("modern/bf16/1/3x8:[kvKV5 k~2 -0 kv0]"))
    assert c.content_bytes(content) == (4 * 5 + 2) * 3 * 8 * 2
    merged = c.expected_concat([content, c.expand(c.parse_cache_spec("modern/f16/2/3x8:[kv1]"))])
    assert merged.dtype == "f32" and c.content_bytes(merged) == 2 * (5 + 1) * 3 * 8 * 4  # the other merged layers are empty


# ---- the content hash -------------------------------------------------------------------------

LENGTHS = [1, 2, 7, 8, 9, 15, 16, 17, 40, 41]


def ramp(count):
    return [i * 0.5 - 3.0 for i in range(count)]


def check_every_value_counts(hash_of):
    for count in LENGTHS:
        base = ramp(count)
        for i in range(count):
            changed = list(base)
            changed[i] += 0.125
            assert hash_of(changed) != hash_of(base), f"value {i} of {count}"


def _bits_of(value):
    return struct.unpack("<I", struct.pack("<f", value))[0]


def _float_of(bits):
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def check_every_bit_of_every_value_counts(hash_of):
    # Any single-bit change of any value changes the hash, except the sign
    # of a zero, which must not.
    for count in LENGTHS:
        base = ramp(count)
        base_hash = hash_of(base)
        for i in range(count):
            for bit in range(32):
                changed = list(base)
                changed[i] = _float_of(_bits_of(base[i]) ^ (1 << bit))
                if _bits_of(base[i]) | _bits_of(changed[i]) == 0x80000000:
                    assert hash_of(changed) == base_hash, f"value {i} of {count}"
                else:
                    assert hash_of(changed) != base_hash, f"bit {bit} of value {i} of {count}"


def check_positions_count(hash_of):
    for count in LENGTHS:
        base = ramp(count)
        for i in range(count):
            for j in range(i + 1, count):
                swapped = list(base)
                swapped[i], swapped[j] = swapped[j], swapped[i]
                assert hash_of(swapped) != hash_of(base), f"values {i} and {j} of {count}"


def check_the_count_counts(hash_of):
    assert len({hash_of([0.0] * count) for count in range(34)}) == 34


def check_the_sign_of_zero_does_not(hash_of):
    for count in LENGTHS:
        positive = ramp(count)
        negative = list(positive)
        for i in range(0, count, 3):
            positive[i], negative[i] = 0.0, -0.0
        assert hash_of(positive) == hash_of(negative), count


HASH_CHECKS = [
    check_every_value_counts,
    check_every_bit_of_every_value_counts,
    check_positions_count,
    check_the_count_counts,
    check_the_sign_of_zero_does_not,
]


@pytest.mark.parametrize("check", HASH_CHECKS)
def test_content_hash(check):
    check(c.content_hash)


@pytest.mark.parametrize("check", HASH_CHECKS)
def test_content_hashes_hash_each_of_a_batch(check):
    # content_hashes hashes a batch in one pass over all its values: each
    # must come out as its own content_hash, in any position, next to lists
    # of any length, empty ones included.
    check(lambda values: c.content_hashes([values, list(reversed(values)), values])[2])
    check(lambda values: c.content_hashes([[], values, [], [1.5] * 3])[1])
    rng = np.random.default_rng(3)
    batch = [rng.standard_normal(n).astype(np.float32) for n in (0, 0, 5, 8, 240, 240, 17, 0, 240, 8, 1000, 0)]
    assert c.content_hashes(batch) == [c.content_hash(values) for values in batch]
    assert c.content_hashes([]) == []


_M64 = (1 << 64) - 1


def _splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _reference_hash(patterns):
    """The definition of docs/protocol.md on plain integers, one value at a
    time: apart from content.py's arrays."""
    total = 0
    for i, bits in enumerate(patterns):
        total = (total + _splitmix64(i << 32 | (0 if bits == 0x80000000 else bits))) & _M64
    return _splitmix64(total ^ _splitmix64(len(patterns)))


def test_content_hash_is_the_definition():
    rng = np.random.default_rng(11)
    # Past one chunk of c.content_hashes, and across chunks.
    sizes = (0, 1, 3, 64, 241, 0, 1000, c._HASH_CHUNK_WORDS + 5, 2 * c._HASH_CHUNK_WORDS - 7)
    batch = [rng.integers(0, 1 << 32, size=n, dtype=np.uint32) for n in sizes]
    for patterns in batch:
        patterns[:: max(1, len(patterns) // 5)] = 0x80000000  # -0 among them
    values = [patterns.view(np.float32) for patterns in batch]
    expected = [_reference_hash(patterns.tolist()) for patterns in batch]
    assert c.content_hashes(values) == expected
    assert [c.content_hash(torch.from_numpy(v.copy())) for v in values] == expected


def test_content_hash_golden_values():
    # Computed with plain integers apart from the SDK; tests/content_hash_test.cpp
    # checks the C++ side against the same values.
    assert c.content_hash([]) == 0xA706DD2F4D197E6F
    assert c.content_hash([0.0]) == c.content_hash([-0.0]) == 0xD300120A5EA35CAC
    assert c.content_hash([1.0]) == 0x54648985A5013C36
    assert c.content_hash(ramp(7)) == 0xFA7898B490F89F7E
    assert c.content_hash(ramp(9)) == 0xB96AA709F8F55DD4
    assert c.content_hash(ramp(41)) == 0x453A6556EC051DFE
    assert c.content_hash(ramp(1000)) == 0x3C70AE9810CE5BF9
    patterns = [0x7F800000, 0xFF800000, 0x7FC00000, 0x00000001, 0x80000001, 0x3F800000, 0xFFFFFFFF, 0x80000000]
    assert c.content_hash(np.array(patterns, dtype=np.uint32).view(np.float32)) == 0x237FC9EF1D8CC3F8


def _hash_ignoring_the_last_value(values):
    array = np.asarray(values, dtype=np.float32)
    return c.content_hash(array[:-1]) ^ len(array)


def _hash_ignoring_the_low_bit(values):
    patterns = np.asarray(values, dtype=np.float32).view(np.uint32) & np.uint32(0xFFFFFFFE)
    return c.content_hash(patterns.view(np.float32))


def _hash_of_raw_bits(values):  # no canonical zero
    array = np.asarray(values, dtype=np.float32)
    return hash(array.tobytes())


def _hash_of_a_sum(values):  # positions do not count
    return c.content_hash([float(np.sum(np.asarray(values, dtype=np.float64)))] + [len(values)])


@pytest.mark.parametrize(
    "check, planted",
    [
        (check_every_value_counts, _hash_ignoring_the_last_value),
        (check_every_bit_of_every_value_counts, _hash_ignoring_the_low_bit),
        (check_positions_count, _hash_of_a_sum),
        (check_the_count_counts, lambda values: c.content_hash(values[:1])),
        (check_the_sign_of_zero_does_not, _hash_of_raw_bits),
    ],
)
def test_content_hash_checks_catch_planted_hashes(check, planted):
    with pytest.raises(AssertionError):
        check(planted)


def test_content_hash_reads_any_dtype_shape_and_layout_as_float32_row_major():
    values = torch.tensor(ramp(24), dtype=torch.float32).reshape(1, 2, 3, 4)
    expected = c.content_hash(ramp(24))
    assert c.content_hash(values) == expected
    assert c.content_hash(values.to(torch.bfloat16)) == expected  # halves of 1/2 are exact
    assert c.content_hash(values.transpose(2, 3).contiguous().transpose(2, 3)) == expected
    assert c.content_hash(values.numpy()) == expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_content_hash_reads_a_lazily_negated_tensor_as_its_values(dtype):
    # torch._neg_view marks a negation without applying it; numpy refuses
    # such a tensor, so the hash resolves it first.
    values = torch.tensor(ramp(24), dtype=torch.float32).reshape(1, 2, 3, 4).to(dtype)
    lazy = torch._neg_view(values)
    assert lazy.is_neg()
    assert c.content_hash(lazy) == c.content_hash(-values)
    assert c.content_hashes([lazy, values]) == [c.content_hash(-values), c.content_hash(values)]


def test_content_hash_of_bytes_that_look_like_negative_zero_across_two_values():
    # 0x80000000 straddling two values is no -0: the canonical copy keeps it.
    a = struct.unpack("<f", b"\x00\x00\x00\x00")[0]
    b = struct.unpack("<f", b"\x00\x00\x80\x3f")[0]  # 1.0
    straddle = [a, b]
    assert c.content_hash(straddle) == c.content_hash([0.0, 1.0])


# ---- views, digests, differences ---------------------------------------------------------------


@pytest.mark.parametrize("text", SPECS)
def test_view_of_the_materialized_content_is_the_expected_view(text):
    content = c.expand(c.parse_cache_spec(text))
    actual, expected = c.view_of(kv.materialize(content)), c.expected_view(content)
    assert c.view_difference(actual, expected) == ""
    assert actual == expected
    assert c.view_digest(actual) == c.view_digest(expected) == c.expected_digest(content)


def _view(text):
    return c.expected_view(c.expand(c.parse_cache_spec(text)))


@pytest.mark.parametrize(
    "actual, expected, text",
    [
        ("legacy/f32/1:[kv2]", "modern/f32/1:[kv2]", "layout is legacy, expected modern"),
        ("modern/f32/1:[kv2]", "modern/f32/1:[kv2 kv2]", "1 layers, expected 2"),
        ("modern/f32/1:[kv~2]", "modern/f32/1:[kv2]", "layer 0 is not initialized, expected initialized"),
        ("modern/f32/1:[kv2]", "modern/f32/1:[kv~2]", "layer 0 is initialized, expected uninitialized"),
        ("modern/f32/1:[k2]", "modern/f32/1:[kv2]", "layer 0 values is missing"),
        ("modern/f32/1:[kvK2]", "modern/f32/1:[kv2]", "layer 0 key_cache is present, expected absent"),
        ("modern/f16/1:[kv2]", "modern/f32/1:[kv2]", "layer 0 keys dtype f16, expected f32"),
        ("modern/f32/1:[kv3]", "modern/f32/1:[kv2]", "layer 0 keys shape [1,2,3,4], expected [1,2,2,4]"),
        ("modern/f32/2:[kv2]", "modern/f32/1:[kv2]", "layer 0 keys content differs"),
        ("modern/f16/1:[kv0]", "modern/f32/1:[kv0]", ""),  # an empty slot's dtype is not compared
    ],
)
def test_view_difference_texts(actual, expected, text):
    a, e = _view(actual), _view(expected)
    assert c.view_difference(a, e) == text
    assert (c.view_digest(a) == c.view_digest(e)) == (text == "")


def test_slot_views_equal_when_absent_whatever_else():
    assert c.SlotView(False, "f16", (3,), 7) == c.SlotView()
    assert c.SlotView(True, "f16", (0,), 7) != c.SlotView(True, "f16", (0,), 8)


def test_view_of_refuses_what_is_no_cache_and_other_dtypes():
    with pytest.raises(TypeError, match="is not a KV cache"):
        c.view_of(object())
    cache = kv.DynamicCache()
    cache.update(torch.zeros(1, 2, 1, 4, dtype=torch.float64), torch.zeros(1, 2, 1, 4, dtype=torch.float64), 0)
    with pytest.raises(ValueError, match="a cache tensor has dtype torch.float64"):
        c.view_of(cache)


def test_view_of_a_transformers_456_layer_takes_keys_none_as_uninitialized():
    class Layer456:  # transformers 4.56: no is_initialized, lazy on keys is None
        def __init__(self, keys, values):
            self.keys, self.values = keys, values

    class Cache456:
        def __init__(self, layers):
            self.layers = layers

    k = torch.zeros(1, 2, 1, 4)
    view = c.view_of(Cache456([Layer456(None, None), Layer456(k, k)]))
    assert [layer.initialized for layer in view.layers] == [False, True]


# ---- expected results of the operations --------------------------------------------------------


def test_logical_slot_prefers_modern_then_legacy_named_and_needs_initialization():
    content = c.expand(c.parse_cache_spec("modern/f32/1:[kvKV2 KV3 kv~4]"))
    assert c.logical_slot(content, 0, c.KEYS) == content.layers[0].slots[c.KEYS]
    assert c.logical_slot(content, 1, c.KEYS) == content.layers[1].slots[c.KEY_CACHE]
    assert not c.logical_slot(content, 2, c.KEYS).present
    assert not c.logical_slot(content, 3, c.KEYS).present
    assert c.content_seq_length(content, 1) == 3
    assert c.content_holds_tokens(content)
    assert not c.content_holds_tokens(c.expand(c.parse_cache_spec("modern/f32/1:[kv~4 -0]")))


def test_expected_concat_joins_segments_in_order_and_initializes():
    a = c.expand(c.parse_cache_spec("modern/bf16/1:[kv2 kv~2]"))
    b = c.expand(c.parse_cache_spec("legacy/bf16/2:[kv3 kv3 kv3]"))
    merged = c.expected_concat([a, b])
    assert merged.layout == "modern" and merged.dtype == "bf16"
    assert [layer.initialized for layer in merged.layers] == [True, True, True]
    assert merged.layers[0].slots[c.KEYS].segments == a.layers[0].slots[c.KEYS].segments + b.layers[0].slots[c.KEYS].segments
    assert merged.layers[1].slots[c.KEYS].segments == b.layers[1].slots[c.KEYS].segments
    assert c.expected_concat([a, c.expand(c.parse_cache_spec("modern/f16/1:[kv1]"))]).dtype == "f32"


def test_expected_conversions():
    content = c.expand(c.parse_cache_spec("modern/f16/4:[KV2 k~1 kv3]"))
    legacy = c.expected_to_legacy(content)
    assert legacy.layout == "legacy"
    assert legacy.layers[0].slots[c.KEYS].segments == content.layers[0].slots[c.KEY_CACHE].segments
    assert legacy.layers[1].slots[c.KEYS].present and not legacy.layers[1].slots[c.KEYS].segments
    modern = c.expected_from_legacy(legacy)
    assert modern.layout == "modern" and all(layer.initialized for layer in modern.layers)
    assert c.expected_to_legacy(c.expand(c.parse_cache_spec("modern/bf16/1:[-0]"))).dtype == "f32"


@pytest.mark.parametrize("text", SPECS)
def test_digest_of_a_cache_is_the_digest_of_its_view(text):
    cache = kv.materialize(c.expand(c.parse_cache_spec(text)))
    assert c.digest_of(cache) == c.view_digest(c.view_of(cache))
