"""The cache content model, bit-exact with kvcheck's C++ side.

kvcheck describes what a cache holds without tensors: per layer, which of
its four slots are present, whether it is initialized, and per slot a list
of segments, each `tokens` tokens whose values are a pure function of the
segment's `seed`. This module is the Python twin of harness/kvcheck/content.h
and harness/content.cpp: the same spec text, the same values, the same
content hash, view, digest and difference texts, so that a Python engine's
report and kvcheck's expectation agree bit for bit.

    spec = parse_cache_spec("modern/bf16/7/4x16:[kv3 k~2 KV4 -0]")
    content = expand(spec)                 # per-slot segments
    expected = expected_view(content)      # what a correct engine reports
    view_digest(expected) == view_digest(view_of(cache_holding_content))

Integers that C++ keeps in std::uint64_t are Python ints reduced modulo
2**64 here (or numpy uint64 arrays, which wrap on their own); every such
value this module returns is in [0, 2**64).

The model, in short (docs/semantics.md#content-geometry-values-and-hashes
spells it out): a slot tensor is [1, heads, tokens, head_dim], heads and
head_dim a cache's own (2 and 4 unless its spec says "/<heads>x<head_dim>");
a segment's element (h, t, d) is round_to(precision, slot_value(seed, h, t,
d)), a float32 with a full mantissa rounded to the segment's dtype; an
engine's slot holds those values in the cache's dtype, and reports the
content_hash of them read as float32.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass, field
from typing import Iterable, List, Optional, Sequence

import numpy as np
import torch

# ---- names and fixed geometry ----------------------------------------------

LAYOUTS = ("modern", "legacy")
DTYPES = ("f32", "f16", "bf16")
# The four slots of a layer, in view order. A legacy cache uses keys/values
# for its key_cache/value_cache list entries; key_cache/value_cache here are
# the legacy-named slots a modern layer may carry.
SLOT_NAMES = ("keys", "values", "key_cache", "value_cache")
KEYS, VALUES, KEY_CACHE, VALUE_CACHE = range(4)
SLOT_COUNT = 4

CACHE_BATCH = 1
# The default geometry: a spec or content that names none has it.
CACHE_HEADS = 2
CACHE_HEAD_DIM = 4
# The largest heads and head_dim a spec may carry (C++ cache_heads_max,
# cache_head_dim_max).
CACHE_HEADS_MAX = 256
CACHE_HEAD_DIM_MAX = 1024

TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
_DTYPE_NAMES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}

_MASK64 = (1 << 64) - 1


def dtype_name(dtype: torch.dtype) -> str:
    """The kvcheck name of a cache tensor's dtype; ValueError for any other."""
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise ValueError(f"a cache tensor has dtype {dtype}") from None


# ---- splitmix64 --------------------------------------------------------------

_GOLDEN = 0x9E3779B97F4A7C15
_MIX_1 = 0xBF58476D1CE4E5B9
_MIX_2 = 0x94D049BB133111EB
_FNV_PRIME = 0x100000001B3


def splitmix64(x: int) -> int:
    """kvcheck's splitmix64 of one 64-bit word (C++ content.cpp)."""
    x = (x + _GOLDEN) & _MASK64
    x = ((x ^ (x >> 30)) * _MIX_1) & _MASK64
    x = ((x ^ (x >> 27)) * _MIX_2) & _MASK64
    return x ^ (x >> 31)


_U64 = np.uint64


def splitmix64_array(x: np.ndarray) -> np.ndarray:
    """splitmix64 of every element of a uint64 array (wrapping arithmetic),
    in a new array (the steps after the first write into it)."""
    assert x.dtype == np.uint64
    x = x + _U64(_GOLDEN)
    _splitmix64_mix_in_place(x)
    return x


def _splitmix64_mix_in_place(x: np.ndarray) -> None:
    """The steps of splitmix64 after adding the golden gamma, on a uint64
    array, in place."""
    x ^= x >> _U64(30)
    x *= _U64(_MIX_1)
    x ^= x >> _U64(27)
    x *= _U64(_MIX_2)
    x ^= x >> _U64(31)


def slot_seed(cache_seed: int, layer: int, slot: int) -> int:
    """The seed of the one segment expand() gives slot `slot` of layer `layer`."""
    return splitmix64(splitmix64(cache_seed) ^ ((layer * _FNV_PRIME) & _MASK64) ^ (slot + 1))


# ---- the compact spec --------------------------------------------------------

_SLOT_LETTERS = "kvKV"


@dataclass
class LayerSpec:
    """One layer of a spec: slot bits (bit i = slot i), flag and tokens."""

    slots: int = 0b11
    initialized: bool = True
    tokens: int = 0


@dataclass
class CacheSpec:
    """The text "<layout>/<dtype>/<seed>[/<heads>x<head_dim>]:[<layer> ...]"
    as fields; the geometry is 2x4 when the text gives none."""

    layout: str = "modern"
    dtype: str = "f32"
    seed: int = 0
    layers: List[LayerSpec] = field(default_factory=list)
    heads: int = CACHE_HEADS
    head_dim: int = CACHE_HEAD_DIM


def _fail(text: str, fault: str):
    raise ValueError(f"cache spec '{text}': {fault}")


_INT64_MAX = (1 << 63) - 1


def _parse_count(spec: str, word: str, what: str, where: str, maximum: int) -> int:
    quoted = f"{what} '{word}'"
    if not word:
        _fail(spec, f"missing {what}{where}")
    if word[0] == "-":
        _fail(spec, f"negative {quoted}{where}")
    # As std::from_chars reads it: the leading digits, out of range before
    # anything else is looked at.
    digits = len(word) - len(word.lstrip("0123456789"))
    if digits and int(word[:digits]) > maximum:
        _fail(spec, f"{quoted}{where} is out of range (at most {maximum})")
    if digits == 0 or digits != len(word):
        _fail(spec, f"bad {quoted}{where} (expected decimal digits)")
    return int(word)


def _parse_layer(spec: str, word: str) -> LayerSpec:
    where = f" in layer '{word}'"
    layer = LayerSpec(slots=0)
    at = 0
    if at < len(word) and word[at] == "-":
        at += 1
        if at < len(word) and word[at] in _SLOT_LETTERS:
            _fail(spec, "'-' (no slots) cannot be combined with slot letters" + where)
    else:
        while at < len(word):
            bit = _SLOT_LETTERS.find(word[at])
            if bit < 0:
                break
            if layer.slots & (1 << bit):
                _fail(spec, f"slot letter '{word[at]}' given twice{where}")
            layer.slots |= 1 << bit
            at += 1
        if at == 0 and word and not word[0].isalpha():
            _fail(spec, "expected slot letters (k, v, K, V) or '-' for none" + where)
    if at < len(word) and word[at] == "~":
        layer.initialized = False
        at += 1
    count = word[at:]
    if count and count[0].isalpha():
        _fail(spec, f"bad slot letter '{count[0]}'{where} (expected k, v, K, V or '-' for none)")
    layer.tokens = _parse_count(spec, count, "token count", where, _INT64_MAX)
    return layer


def _parse_geometry(spec: str, word: str) -> tuple:
    """"<heads>x<head_dim>", each at least 1 and at most its maximum."""
    x = word.find("x")
    if x < 0:
        _fail(spec, f"bad geometry '{word}' (expected <heads>x<head_dim>)")
    heads = _parse_count(spec, word[:x], "heads", " in the geometry", _INT64_MAX)
    head_dim = _parse_count(spec, word[x + 1 :], "head_dim", " in the geometry", _INT64_MAX)
    if not 1 <= heads <= CACHE_HEADS_MAX:
        _fail(spec, f"heads {heads} outside [1, {CACHE_HEADS_MAX}]")
    if not 1 <= head_dim <= CACHE_HEAD_DIM_MAX:
        _fail(spec, f"head_dim {head_dim} outside [1, {CACHE_HEAD_DIM_MAX}]")
    return heads, head_dim


def parse_cache_spec(text: str) -> CacheSpec:
    """Parses the compact text form; ValueError with C++'s message on a fault."""
    slash_1 = text.find("/")
    slash_2 = -1 if slash_1 < 0 else text.find("/", slash_1 + 1)
    if slash_2 < 0:
        _fail(text, "expected <layout>/<dtype>/<seed>[/<heads>x<head_dim>]:[<layer> ...]")
    colon = text.find(":", slash_2 + 1)
    if colon < 0:
        _fail(text, "missing ':' after the seed")
    slash_3 = text.find("/", slash_2 + 1, colon)
    if colon + 1 >= len(text) or text[colon + 1] != "[":
        _fail(text, "missing '[' after ':'")
    close = text.find("]", colon + 2)
    if close < 0:
        _fail(text, "missing ']' closing the layer list")
    if close + 1 != len(text):
        _fail(text, f"trailing text '{text[close + 1:]}' after ']'")
    layout = text[:slash_1]
    if layout not in LAYOUTS:
        _fail(text, f"bad layout '{layout}' (expected modern or legacy)")
    dtype = text[slash_1 + 1 : slash_2]
    if dtype not in DTYPES:
        _fail(text, f"bad dtype '{dtype}' (expected f32, f16 or bf16)")
    seed_end = colon if slash_3 < 0 else slash_3
    seed = _parse_count(text, text[slash_2 + 1 : seed_end], "seed", "", _MASK64)
    heads, head_dim = CACHE_HEADS, CACHE_HEAD_DIM
    if slash_3 >= 0:
        heads, head_dim = _parse_geometry(text, text[slash_3 + 1 : colon])
    layers = [_parse_layer(text, word) for word in text[colon + 2 : close].replace("\t", " ").split(" ") if word]
    return CacheSpec(layout, dtype, seed, layers, heads, head_dim)


def format_cache_spec(spec: CacheSpec) -> str:
    """The text form of a spec; parse_cache_spec(format_cache_spec(s)) == s.
    The geometry is written only when it is not the default (2x4)."""
    if spec.layout not in LAYOUTS:
        raise ValueError("cache spec has an invalid layout")
    if spec.dtype not in DTYPES:
        raise ValueError("cache spec has an invalid dtype")
    if not (1 <= spec.heads <= CACHE_HEADS_MAX and 1 <= spec.head_dim <= CACHE_HEAD_DIM_MAX):
        raise ValueError(f"cache spec has an invalid geometry {spec.heads}x{spec.head_dim}")
    words = []
    for layer in spec.layers:
        if layer.slots & ~0b1111:
            raise ValueError(f"cache spec layer slots {layer.slots} name bits beyond the four slots")
        if layer.tokens < 0:
            raise ValueError(f"cache spec layer has negative tokens {layer.tokens}")
        letters = "".join(letter for bit, letter in enumerate(_SLOT_LETTERS) if layer.slots & (1 << bit))
        words.append((letters or "-") + ("" if layer.initialized else "~") + str(layer.tokens))
    geometry = "" if (spec.heads, spec.head_dim) == (CACHE_HEADS, CACHE_HEAD_DIM) else f"/{spec.heads}x{spec.head_dim}"
    return f"{spec.layout}/{spec.dtype}/{spec.seed}{geometry}:[{' '.join(words)}]"


# ---- the expanded content ------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """`tokens` tokens whose values come from `seed` (slot_value), rounded
    to `precision` (a dtype name)."""

    seed: int
    tokens: int
    precision: str = "f32"


@dataclass
class SlotContent:
    """A slot: absent, or present with segments (none: an empty [0] tensor)."""

    present: bool = False
    segments: List[Segment] = field(default_factory=list)

    def tokens(self) -> int:
        return sum(segment.tokens for segment in self.segments)


def _absent_slots() -> List[SlotContent]:
    return [SlotContent() for _ in range(SLOT_COUNT)]


@dataclass
class LayerContent:
    """A layer: its flag (legacy layers always are initialized), four slots."""

    initialized: bool = True
    slots: List[SlotContent] = field(default_factory=_absent_slots)


@dataclass
class CacheContent:
    """What a cache holds, without tensors."""

    layout: str = "modern"
    dtype: str = "f32"
    layers: List[LayerContent] = field(default_factory=list)
    heads: int = CACHE_HEADS
    head_dim: int = CACHE_HEAD_DIM


def expand(spec: CacheSpec) -> CacheContent:
    """The content a spec describes (C++ kvcheck::expand): each present slot
    of layer i with t > 0 tokens holds one segment {slot_seed(seed, i, s),
    t, spec.dtype}."""
    content = CacheContent(layout=spec.layout, dtype=spec.dtype, heads=spec.heads, head_dim=spec.head_dim)
    legacy = spec.layout == "legacy"
    for i, layer_spec in enumerate(spec.layers):
        layer = LayerContent(initialized=legacy or layer_spec.initialized)
        for s in range(SLOT_COUNT):
            present = s < 2 if legacy else bool((layer_spec.slots >> s) & 1)
            if not present:
                continue
            slot = layer.slots[s]
            slot.present = True
            if layer_spec.tokens > 0:
                slot.segments.append(Segment(slot_seed(spec.seed, i, s), layer_spec.tokens, spec.dtype))
        content.layers.append(layer)
    return content


def copy_content(content: CacheContent) -> CacheContent:
    """A deep copy (segments are immutable and shared)."""
    return dataclasses.replace(
        content,
        layers=[
            LayerContent(layer.initialized, [SlotContent(s.present, list(s.segments)) for s in layer.slots])
            for layer in content.layers
        ],
    )


# ---- values ---------------------------------------------------------------------


def _float_of(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def _bits_of(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


def slot_value(seed: int, head: int, token: int, dim: int) -> float:
    """Element (head, token, dim) of a segment before rounding (C++
    kvcheck::slot_value): a float32 whose sign and 23-bit mantissa come from
    x = splitmix64(seed ^ splitmix64((head << 40) ^ (token << 16) ^ dim)),
    its exponent from bits 32-39 of x (mostly [1/8, 4), one in sixteen
    [2^8, 2^12), one in sixteen [2^-26, 2^-14))."""
    index = ((head << 40) ^ (token << 16) ^ dim) & _MASK64
    x = splitmix64(seed ^ splitmix64(index))
    exponent = _slot_exponent((x >> 32) & 0xFF)
    return _float_of((x >> 63) << 31 | (exponent + 127) << 23 | (x & 0x7FFFFF))


def round_to(dtype: str, value: float) -> float:
    """`value` (a float32) rounded to the nearest `dtype` value, ties to
    even, as a float32 (C++ kvcheck::round_to; torch's `.to(dtype)`)."""
    return float(round_to_array(dtype, np.array([value], dtype=np.float32))[0])


_U32 = np.uint32


def _round_to_f16(bits: np.ndarray) -> np.ndarray:
    """float16 rounding on float32 bit patterns (C++ round_to_f16): 10
    mantissa bits, subnormals in steps of 2^-24, ties to even, infinity
    from 65520 up: IEEE's conversion, which numpy's float16 cast is (equal
    to the C++ formula on every one of the 2^32 patterns but NaNs), NaN
    0x7FC00000 with its sign."""
    rounded = bits.view(np.float32).astype(np.float16).astype(np.float32).view(np.uint32)
    nan = (bits & _U32(0x7FFFFFFF)) > _U32(0x7F800000)
    return np.where(nan, (bits & _U32(0x80000000)) | _U32(0x7FC00000), rounded)


def _round_to_bf16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 rounding on float32 bit patterns (C++ round_to_bf16): the top
    16 bits after adding 0x7FFF plus the lowest kept bit; NaN 0x7FC00000."""
    rounded = (bits + _U32(0x7FFF) + ((bits >> _U32(16)) & _U32(1))) & _U32(0xFFFF0000)
    return np.where((bits & _U32(0x7FFFFFFF)) > _U32(0x7F800000), _U32(0x7FC00000), rounded)


def round_to_array(dtype: str, values: np.ndarray) -> np.ndarray:
    """round_to of every element of a float32 array (a new array; the same
    one for f32)."""
    if dtype == "f32":
        return values
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    with np.errstate(over="ignore"):
        rounded = _round_to_f16(bits) if dtype == "f16" else _round_to_bf16(bits)
    return rounded.astype(np.uint32, copy=False).view(np.float32)


def _slot_exponent(r: int) -> int:
    """slot_value's exponent for bits 32-39 of x."""
    return r % 5 - 3 if r < 224 else 8 + r % 4 if r < 240 else -26 + r % 12


# slot_value's biased exponent field for each value of bits 32-39 of x.
_EXPONENT_FIELDS = np.array([(_slot_exponent(r) + 127) << 23 for r in range(256)], dtype=np.uint32)


def segment_values_raw(seeds: np.ndarray, index_mix: np.ndarray) -> np.ndarray:
    """slot_value's float32 for each pair of a segment seed and the
    splitmix64 of an element index (the arrays broadcast), before rounding:
    x's bit 63 as the sign (bit 31 of x >> 32), its low 23 bits as the
    mantissa, the exponent field looked up by bits 32-39."""
    x = splitmix64_array(seeds ^ index_mix)
    high = x >> _U64(32)
    exponent_fields = _EXPONENT_FIELDS[(high & _U64(0xFF)).astype(np.intp)]
    high &= _U64(0x80000000)
    x &= _U64(0x7FFFFF)
    x |= high
    bits = x.astype(np.uint32)
    bits |= exponent_fields
    return bits.view(np.float32)


def element_index_mix(heads: int, tokens: int, head_dim: int) -> np.ndarray:
    """splitmix64 of the element indices (h << 40) ^ (t << 16) ^ d of a
    [heads, tokens, head_dim] segment, row-major and flat: the half of
    slot_value that does not depend on the seed."""
    head = np.arange(heads, dtype=np.uint64)[:, None, None] << _U64(40)
    token = np.arange(tokens, dtype=np.uint64)[None, :, None] << _U64(16)
    dim = np.arange(head_dim, dtype=np.uint64)[None, None, :]
    return splitmix64_array((head ^ token ^ dim).reshape(-1))


def _segment_values(segment: Segment, heads: int, head_dim: int) -> np.ndarray:
    """[heads, tokens, head_dim] float32 values of one segment, rounded to
    its precision."""
    raw = segment_values_raw(_U64(segment.seed), element_index_mix(heads, segment.tokens, head_dim))
    return round_to_array(segment.precision, raw).reshape(heads, segment.tokens, head_dim)


def slot_values(slot: SlotContent, heads: int = CACHE_HEADS, head_dim: int = CACHE_HEAD_DIM) -> np.ndarray:
    """A slot's values as a [heads, tokens, head_dim] float32 array: the
    concatenation of its segments along tokens, each rounded to its
    precision (C++ kvcheck::fill_slot)."""
    parts = [_segment_values(s, heads, head_dim) for s in slot.segments if s.tokens > 0]
    if not parts:
        return np.zeros((heads, 0, head_dim), dtype=np.float32)
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)


def slot_tensor(
    slot: SlotContent, dtype: str, heads: int = CACHE_HEADS, head_dim: int = CACHE_HEAD_DIM
) -> Optional[torch.Tensor]:
    """The tensor an engine holds for a slot, as the C++ reference makes it:
    None when absent; an empty tensor of shape [0] when it has no segment;
    else [1, heads, tokens, head_dim]: fill_slot's float32 values cast to
    `dtype` (exact unless a segment is wider than the slot). The tensor has
    a storage of its own."""
    if not slot.present:
        return None
    torch_dtype = TORCH_DTYPES[dtype]
    if not slot.segments:
        return torch.zeros(0, dtype=torch_dtype)
    values = np.ascontiguousarray(slot_values(slot, heads, head_dim))
    made = torch.from_numpy(values).reshape(CACHE_BATCH, heads, values.shape[1], head_dim)
    return made if torch_dtype == torch.float32 else made.to(torch_dtype)


# ---- the content hash --------------------------------------------------------------


def _float32_bits(values) -> np.ndarray:
    """The values converted to float32, row-major, as a flat array of their
    uint32 bit patterns (which may share memory with `values`: read only).
    A bfloat16 value is the top half of its float32: its bits shifted left
    by 16, as torch converts it, without a torch operation."""
    if isinstance(values, torch.Tensor):
        if values.requires_grad:
            values = values.detach()
        if values.device.type != "cpu":
            values = values.cpu()
        if values.is_neg():  # a lazy negation (torch._neg_view): numpy refuses it
            values = values.resolve_neg()
        if not values.is_contiguous():
            values = values.contiguous()
        if values.dtype == torch.bfloat16:
            bits = values.view(torch.int16).numpy().reshape(-1).view(np.uint16).astype(np.uint32)
            bits <<= _U32(16)
            return bits
        if values.dtype != torch.float32:
            values = values.to(torch.float32)
        array = values.numpy()
    else:
        array = np.ascontiguousarray(values, dtype=np.float32)
    return array.reshape(-1).view(np.uint32)


_NEGATIVE_ZERO_BITS = 0x80000000  # the float32 pattern of -0, hashed as +0's
_HASH_CHUNK_WORDS = 1 << 15  # 256 KiB of words


# Word i of a hash holds the position i in its high 32 bits: i << 32 for
# every i up to the longest list hashed so far, grown as needed.
_positions = np.zeros(0, dtype=np.uint64)


def _shifted_positions(count: int) -> np.ndarray:
    global _positions
    if len(_positions) < count:
        _positions = np.arange(max(count, 2 * len(_positions)), dtype=np.uint64) << _U64(32)
    return _positions[:count]


def _finish(total: int, count: int) -> int:
    """splitmix64(total ^ splitmix64(count)), on Python ints: a batch has
    few lists, and a numpy operation costs more than these."""
    mask = _MASK64
    x = (count + _GOLDEN) & mask
    x = ((x ^ (x >> 30)) * _MIX_1) & mask
    x = ((x ^ (x >> 27)) * _MIX_2) & mask
    x = ((total ^ x ^ (x >> 31)) + _GOLDEN) & mask
    x = ((x ^ (x >> 30)) * _MIX_1) & mask
    x = ((x ^ (x >> 27)) * _MIX_2) & mask
    return x ^ (x >> 31)


def content_hash(values) -> int:
    """C++ kvcheck::content_hash of values converted to float32, row-major:

        splitmix64(S ^ splitmix64(n)),
        S = sum over i < n of splitmix64(i << 32 | bits(v[i])) modulo 2**64,

    bits(v) the float32 pattern of v, -0 read as +0. `values`: a tensor of
    any dtype and shape, or anything numpy turns into float32."""
    return content_hashes([values])[0]


def content_hashes(values_list: Sequence) -> List[int]:
    """content_hash of each of `values_list`, in whole-array operations over
    all their values at once: the words of every list side by side, each
    list's positions from 0; their splitmix64 terms, in place (uint64
    arithmetic wraps modulo 2**64); the sum of each list's terms (an empty
    list sums to 0); then the final mix of each."""
    parts = [_float32_bits(values) for values in values_list]
    if not parts:
        return []
    counts = [len(part) for part in parts]
    words = parts[0].astype(np.uint64) if len(parts) == 1 else np.concatenate(parts, dtype=np.uint64)
    words[words == _U64(_NEGATIVE_ZERO_BITS)] = 0
    # Each non-empty list's terms run from its start to the next non-empty
    # list's start: the segments reduceat sums.
    shifted = _shifted_positions(max(counts))
    starts, at = [], 0
    for count in counts:
        if count:
            words[at : at + count] |= shifted[:count]
            starts.append(at)
        at += count
    # The words made terms (splitmix64) a chunk at a time: the temporaries
    # of a chunk stay in the CPU's cache (a batch may be megabytes).
    for at in range(0, len(words), _HASH_CHUNK_WORDS):
        chunk = words[at : at + _HASH_CHUNK_WORDS]
        chunk += _U64(_GOLDEN)
        _splitmix64_mix_in_place(chunk)
    sums = iter(np.add.reduceat(words, starts).tolist() if starts else [])
    return [_finish(next(sums) if count else 0, count) for count in counts]


# ---- views -------------------------------------------------------------------------


@dataclass(eq=False)
class SlotView:
    """A slot as an engine reports it. Two absent slots are equal whatever
    their other fields (C++ SlotView::operator==)."""

    present: bool = False
    dtype: str = "f32"
    shape: tuple = ()
    hash: int = 0

    def __eq__(self, other):
        if not isinstance(other, SlotView):
            return NotImplemented
        if self.present != other.present:
            return False
        return not self.present or (
            self.dtype == other.dtype and tuple(self.shape) == tuple(other.shape) and self.hash == other.hash
        )


def _absent_views() -> List[SlotView]:
    return [SlotView() for _ in range(SLOT_COUNT)]


@dataclass
class LayerView:
    initialized: bool = True
    slots: List[SlotView] = field(default_factory=_absent_views)


@dataclass
class CacheView:
    """A cache's logical content, layout and flags, as an engine reports it."""

    layout: str = "modern"
    layers: List[LayerView] = field(default_factory=list)


def slot_view(tensor: Optional[torch.Tensor]) -> SlotView:
    """What kvcheck sees of one slot tensor (None: absent)."""
    if tensor is None:
        return SlotView()
    return SlotView(True, dtype_name(tensor.dtype), tuple(tensor.shape), content_hash(tensor))


def _layer_slots(layer) -> List[Optional[torch.Tensor]]:
    return [getattr(layer, name, None) for name in SLOT_NAMES]


def _layer_initialized(layer) -> bool:
    # transformers 4.57 layers carry the flag; 4.56 ones initialize lazily
    # when their keys are None, so there the flag is "keys is not None".
    flag = getattr(layer, "is_initialized", None)
    return bool(flag) if flag is not None else getattr(layer, "keys", None) is not None


def cache_layout(cache) -> str:
    """'modern' for an object with a `layers` list, 'legacy' for one with
    `key_cache`/`value_cache` lists; TypeError otherwise."""
    if isinstance(getattr(cache, "layers", None), list):
        return "modern"
    if isinstance(getattr(cache, "key_cache", None), list) and isinstance(getattr(cache, "value_cache", None), list):
        return "legacy"
    raise TypeError(f"{type(cache).__name__} is not a KV cache: no 'layers' list and no 'key_cache'/'value_cache' lists")


def view_of(cache) -> CacheView:
    """What kvcheck sees of a cache object of either layout (duck-typed: our
    caches, transformers' DynamicCache of 4.56+ and of <= 4.53). A modern
    layer's four slots are its attributes keys, values, key_cache and
    value_cache (absent: missing or None); a legacy layer is the pair of
    list entries, its flag always set."""
    layout = cache_layout(cache)
    view = CacheView(layout=layout)
    if layout == "modern":
        for layer in cache.layers:
            view.layers.append(LayerView(_layer_initialized(layer), [slot_view(t) for t in _layer_slots(layer)]))
        return view
    keys, values = cache.key_cache, cache.value_cache
    if len(keys) != len(values):
        raise ValueError(f"legacy cache: key_cache holds {len(keys)} layers but value_cache {len(values)}")
    for k, v in zip(keys, values):
        view.layers.append(LayerView(True, [slot_view(k), slot_view(v), SlotView(), SlotView()]))
    return view


def _has_any_slot(content: CacheContent) -> bool:
    return any(slot.present for layer in content.layers for slot in layer.slots)


def _effective_dtype(content: CacheContent) -> str:
    # Its own when it holds any tensor, else float32 (what an engine gives a
    # cache it has no tensor to copy from).
    return content.dtype if _has_any_slot(content) else "f32"


def expected_view(content: CacheContent) -> CacheView:
    """What a correct engine reports for `content` (C++ expected_view)."""
    dtype = _effective_dtype(content)
    view = CacheView(layout=content.layout)
    for layer in content.layers:
        layer_view = LayerView(content.layout == "legacy" or layer.initialized)
        for s, slot in enumerate(layer.slots):
            if not slot.present:
                continue
            tokens = slot.tokens()
            # In the dtype the slot has: a segment wider than its slot is
            # rounded once more (a merge never makes one).
            values = round_to_array(dtype, slot_values(slot, content.heads, content.head_dim))
            shape = (0,) if tokens == 0 else (CACHE_BATCH, content.heads, tokens, content.head_dim)
            layer_view.slots[s] = SlotView(True, dtype, shape, content_hash(values))
        view.layers.append(layer_view)
    return view


class ViewDigest:
    """C++ kvcheck::ViewDigest: a 64-bit digest of a view, fed in view order
    (the layout and layer count, then per layer its flag and four slots).
    Views that view_difference finds equal have equal digests (an empty
    slot's dtype is left out, as there)."""

    def __init__(self, layout: str, layers: int):
        self._hash = splitmix64(0x5649455744494745)
        self._mix(LAYOUTS.index(layout))
        self._mix(layers)

    def _mix(self, word: int) -> None:
        # splitmix64(hash ^ word), inlined: a digest mixes 4 words per slot.
        x = ((self._hash ^ (word & _MASK64)) + _GOLDEN) & _MASK64
        x = ((x ^ (x >> 30)) * _MIX_1) & _MASK64
        x = ((x ^ (x >> 27)) * _MIX_2) & _MASK64
        self._hash = x ^ (x >> 31)

    def layer(self, initialized: bool) -> None:
        self._mix(0x11 if initialized else 0x10)

    def absent_slot(self) -> None:
        self._mix(0x20)

    def slot(self, dtype: str, shape: Sequence[int], hash_value: int) -> None:
        empty = len(shape) == 1 and shape[0] == 0
        self._mix(0x21 + (0 if empty else 0x100 * (DTYPES.index(dtype) + 1)))
        self._mix(len(shape))
        for size in shape:
            self._mix(size)
        self._mix(hash_value)

    def value(self) -> int:
        return self._hash


def view_digest(view: CacheView) -> int:
    """C++ kvcheck::view_digest."""
    digest = ViewDigest(view.layout, len(view.layers))
    for layer in view.layers:
        digest.layer(layer.initialized)
        for slot in layer.slots:
            if slot.present:
                digest.slot(slot.dtype, slot.shape, slot.hash)
            else:
                digest.absent_slot()
    return digest.value()


def digest_of(cache) -> int:
    """view_digest(view_of(cache)), without building the view."""
    layout = cache_layout(cache)
    if layout == "legacy":
        keys, values = cache.key_cache, cache.value_cache
        if len(keys) != len(values):
            raise ValueError(f"legacy cache: key_cache holds {len(keys)} layers but value_cache {len(values)}")
        digest = ViewDigest(layout, len(keys))
        for pair in zip(keys, values):
            digest.layer(True)
            for tensor in pair:
                _digest_slot(digest, tensor)
            digest.absent_slot()
            digest.absent_slot()
        return digest.value()
    digest = ViewDigest(layout, len(cache.layers))
    for layer in cache.layers:
        digest.layer(_layer_initialized(layer))
        for name in SLOT_NAMES:
            _digest_slot(digest, getattr(layer, name, None))
    return digest.value()


def _digest_slot(digest: "ViewDigest", tensor: Optional[torch.Tensor]) -> None:
    if tensor is None:
        digest.absent_slot()
    else:
        digest.slot(dtype_name(tensor.dtype), tuple(tensor.shape), content_hash(tensor))


def expected_digest(content: CacheContent) -> int:
    return view_digest(expected_view(content))


def _shape_text(shape: Iterable[int]) -> str:
    return "[" + ",".join(str(size) for size in shape) + "]"


def view_difference(actual: CacheView, expected: CacheView) -> str:
    """The first difference between two views, in C++'s words (for example
    "layer 1 keys content differs"); "" when equal. The dtype of an empty
    slot (shape [0]) is not compared: it holds no value."""
    if actual.layout != expected.layout:
        return f"layout is {actual.layout}, expected {expected.layout}"
    if len(actual.layers) != len(expected.layers):
        return f"{len(actual.layers)} layers, expected {len(expected.layers)}"
    for i, (a, e) in enumerate(zip(actual.layers, expected.layers)):
        layer = f"layer {i}"
        if a.initialized != e.initialized:
            if e.initialized:
                return f"{layer} is not initialized, expected initialized"
            return f"{layer} is initialized, expected uninitialized"
        for s, (x, y) in enumerate(zip(a.slots, e.slots)):
            where = f"{layer} {SLOT_NAMES[s]}"
            if x.present != y.present:
                return where + (" is missing" if y.present else " is present, expected absent")
            if not x.present:
                continue
            empty = len(y.shape) == 1 and y.shape[0] == 0
            if x.dtype != y.dtype and not empty:
                return f"{where} dtype {x.dtype}, expected {y.dtype}"
            if tuple(x.shape) != tuple(y.shape):
                return f"{where} shape {_shape_text(x.shape)}, expected {_shape_text(y.shape)}"
            if x.hash != y.hash:
                return f"{where} content differs"
    return ""


# ---- expected results of the cache-level operations ----------------------------------


def _empty_present() -> SlotContent:
    return SlotContent(present=True)


def logical_slot(content: CacheContent, layer: int, side: int) -> SlotContent:
    """The K (side KEYS) or V (side VALUES) a model sees in a layer: modern,
    the layer's keys/values, else key_cache/value_cache, when initialized;
    legacy, the list entry. Absent when missing, uninitialized or one-sided."""
    if layer >= len(content.layers):
        return SlotContent()
    entry = content.layers[layer]
    if content.layout == "legacy":
        return entry.slots[side]
    if not entry.initialized:
        return SlotContent()
    modern = KEYS if side == KEYS else VALUES
    legacy_named = KEY_CACHE if side == KEYS else VALUE_CACHE
    return entry.slots[modern] if entry.slots[modern].present else entry.slots[legacy_named]


def merged_geometry_ok(parts: Sequence[CacheContent]) -> bool:
    """Do the parts holding tokens share one geometry, as a merge needs?"""
    geometries = {(part.heads, part.head_dim) for part in parts if content_holds_tokens(part)}
    return len(geometries) <= 1


def dtypes_mixed(parts: Sequence[CacheContent]) -> bool:
    """Do the parts that hold a slot (those whose dtype the promotion
    counts) have different dtypes? An engine may refuse such a merge."""
    return len({part.dtype for part in parts if _has_any_slot(part)}) > 1


def expected_concat(parts: Sequence[CacheContent]) -> CacheContent:
    """The content of concat(parts) (C++ expected_concat): layer i is the
    concatenation of the parts' logical layer i, initialized; legacy when
    every part is, else modern; the dtype that of the parts holding any
    slot, promoted as torch.cat does (float16 with bfloat16, or anything
    with float32: float32; float32 when none holds one); the geometry that
    of the parts holding tokens, else the first part's. Segments keep the
    precision of the part they came from."""
    if not parts:
        raise ValueError("concat needs at least one cache")
    merged = CacheContent(heads=parts[0].heads, head_dim=parts[0].head_dim)
    for part in parts:
        if content_holds_tokens(part):
            merged.heads, merged.head_dim = part.heads, part.head_dim
            break
    dtype = None
    for part in parts:
        if not _has_any_slot(part):
            continue
        if dtype is None:
            dtype = part.dtype
        elif dtype != part.dtype:
            dtype = "f32"  # torch promotes f16 with bf16 to f32, and anything with f32
    merged.dtype = dtype or "f32"
    merged.layout = "legacy" if all(part.layout == "legacy" for part in parts) else "modern"
    for i in range(max(len(part.layers) for part in parts)):
        layer = LayerContent(initialized=True)
        for side in (KEYS, VALUES):
            slot = _empty_present()
            for part in parts:
                piece = logical_slot(part, i, side)
                if piece.present:
                    slot.segments.extend(piece.segments)
            layer.slots[side] = slot
        merged.layers.append(layer)
    return merged


def expected_to_legacy(content: CacheContent) -> CacheContent:
    legacy = CacheContent(layout="legacy", dtype=content.dtype, heads=content.heads, head_dim=content.head_dim)
    for i in range(len(content.layers)):
        layer = LayerContent()
        for side in (KEYS, VALUES):
            logical = logical_slot(content, i, side)
            layer.slots[side] = SlotContent(True, list(logical.segments)) if logical.present else _empty_present()
        legacy.layers.append(layer)
    if not _has_any_slot(content):
        legacy.dtype = "f32"  # a cache with no tensor at all converts to float32 empty slots
    return legacy


def expected_from_legacy(content: CacheContent) -> CacheContent:
    modern = copy_content(content)
    modern.layout = "modern"
    for layer in modern.layers:
        layer.initialized = True
        layer.slots[KEY_CACHE] = SlotContent()
        layer.slots[VALUE_CACHE] = SlotContent()
    return modern


def content_holds_tokens(content: CacheContent) -> bool:
    return any(
        logical_slot(content, i, side).tokens() > 0 for i in range(len(content.layers)) for side in (KEYS, VALUES)
    )


def content_seq_length(content: CacheContent, layer: int = 0) -> int:
    return logical_slot(content, layer, KEYS).tokens()


def content_bytes(content: CacheContent) -> int:
    """The bytes of K/V a copy of `content` holds: every present slot's
    elements at the content's dtype (4 bytes for f32, 2 for f16 and bf16)."""
    element_bytes = 4 if content.dtype == "f32" else 2
    per_token = CACHE_BATCH * content.heads * content.head_dim * element_bytes
    return sum(slot.tokens() * per_token for layer in content.layers for slot in layer.slots if slot.present)
