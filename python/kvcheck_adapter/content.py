"""The cache content model, bit-exact with kvcheck's C++ side.

kvcheck describes what a cache holds without tensors: per layer, which of
its four slots are present, whether it is initialized, and per slot a list
of segments, each `tokens` tokens whose values are a pure function of the
segment's `seed`. This module is the Python twin of harness/kvcheck/content.h
and harness/content.cpp: the same spec text, the same values, the same
content hash, view, digest and difference texts, so that a Python engine's
report and kvcheck's expectation agree bit for bit.

    spec = parse_cache_spec("modern/bf16/7:[kv3 k~2 KV4 -0]")
    content = expand(spec)                 # per-slot segments
    expected = expected_view(content)      # what a correct engine reports
    view_digest(expected) == view_digest(view_of(cache_holding_content))

Integers that C++ keeps in std::uint64_t are Python ints reduced modulo
2**64 here (or numpy uint64 arrays, which wrap on their own); every such
value this module returns is in [0, 2**64).

Geometry: a slot tensor is [1, heads, tokens, head_dim]. The C++ side fixes
heads 2 and head_dim 4 (the decoder's); CacheContent carries them as fields
so that content of another geometry can be described the same way.
"""

from __future__ import annotations

import dataclasses
import struct
import sys
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
CACHE_HEADS = 2
CACHE_HEAD_DIM = 4

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
    """splitmix64 of every element of a uint64 array (wrapping arithmetic)."""
    assert x.dtype == np.uint64
    x = x + _U64(_GOLDEN)
    x = (x ^ (x >> _U64(30))) * _U64(_MIX_1)
    x = (x ^ (x >> _U64(27))) * _U64(_MIX_2)
    return x ^ (x >> _U64(31))


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
    """The text "<layout>/<dtype>/<seed>:[<layer> ...]" as fields."""

    layout: str = "modern"
    dtype: str = "f32"
    seed: int = 0
    layers: List[LayerSpec] = field(default_factory=list)


def _fail(text: str, fault: str):
    raise ValueError(f"cache spec '{text}': {fault}")


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
    layer.tokens = _parse_count(spec, count, "token count", where, (1 << 63) - 1)
    return layer


def parse_cache_spec(text: str) -> CacheSpec:
    """Parses the compact text form; ValueError with C++'s message on a fault."""
    slash_1 = text.find("/")
    slash_2 = -1 if slash_1 < 0 else text.find("/", slash_1 + 1)
    if slash_2 < 0:
        _fail(text, "expected <layout>/<dtype>/<seed>:[<layer> ...]")
    colon = text.find(":", slash_2 + 1)
    if colon < 0:
        _fail(text, "missing ':' after the seed")
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
    seed = _parse_count(text, text[slash_2 + 1 : colon], "seed", "", _MASK64)
    layers = [_parse_layer(text, word) for word in text[colon + 2 : close].replace("\t", " ").split(" ") if word]
    return CacheSpec(layout, dtype, seed, layers)


def format_cache_spec(spec: CacheSpec) -> str:
    """The text form of a spec; parse_cache_spec(format_cache_spec(s)) == s."""
    if spec.layout not in LAYOUTS:
        raise ValueError("cache spec has an invalid layout")
    if spec.dtype not in DTYPES:
        raise ValueError("cache spec has an invalid dtype")
    words = []
    for layer in spec.layers:
        if layer.slots & ~0b1111:
            raise ValueError(f"cache spec layer slots {layer.slots} name bits beyond the four slots")
        if layer.tokens < 0:
            raise ValueError(f"cache spec layer has negative tokens {layer.tokens}")
        letters = "".join(letter for bit, letter in enumerate(_SLOT_LETTERS) if layer.slots & (1 << bit))
        words.append((letters or "-") + ("" if layer.initialized else "~") + str(layer.tokens))
    return f"{spec.layout}/{spec.dtype}/{spec.seed}:[{' '.join(words)}]"


# ---- the expanded content ------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """`tokens` tokens whose values come from `seed` (slot_value)."""

    seed: int
    tokens: int


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
    """The content a spec describes (C++ kvcheck::expand)."""
    content = CacheContent(layout=spec.layout, dtype=spec.dtype)
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
                slot.segments.append(Segment(slot_seed(spec.seed, i, s), layer_spec.tokens))
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


def slot_value(seed: int, head: int, token: int, dim: int) -> float:
    """Element (head, token, dim) of a segment (C++ kvcheck::slot_value)."""
    index = ((head * 1000003 + token) * 64 + dim) & _MASK64
    mixed = splitmix64(seed ^ splitmix64(index))
    return float(np.float32((mixed % 64) - 32) / np.float32(8.0))


def _segment_values(seed: int, tokens: int, heads: int, head_dim: int) -> np.ndarray:
    """[heads, tokens, head_dim] float32 values of one segment."""
    head = np.arange(heads, dtype=np.uint64)[:, None, None]
    token = np.arange(tokens, dtype=np.uint64)[None, :, None]
    dim = np.arange(head_dim, dtype=np.uint64)[None, None, :]
    index = (head * _U64(1000003) + token) * _U64(64) + dim
    mixed = splitmix64_array(_U64(seed) ^ splitmix64_array(index))
    # (mixed % 64) - 32 is in [-32, 32): exact in float32, and so is /8.
    return ((mixed % _U64(64)).astype(np.int64) - 32).astype(np.float32) / np.float32(8.0)


def slot_values(slot: SlotContent, heads: int = CACHE_HEADS, head_dim: int = CACHE_HEAD_DIM) -> np.ndarray:
    """A slot's values as a [heads, tokens, head_dim] float32 array: the
    concatenation of its segments along tokens (C++ kvcheck::fill_slot)."""
    parts = [_segment_values(s.seed, s.tokens, heads, head_dim) for s in slot.segments if s.tokens > 0]
    if not parts:
        return np.zeros((heads, 0, head_dim), dtype=np.float32)
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)


def slot_tensor(
    slot: SlotContent, dtype: str, heads: int = CACHE_HEADS, head_dim: int = CACHE_HEAD_DIM
) -> Optional[torch.Tensor]:
    """The tensor an engine holds for a slot, as the C++ reference makes it:
    None when absent; an empty tensor of shape [0] when it has no segment;
    else [1, heads, tokens, head_dim], computed in float32 and then cast.
    The tensor has a storage of its own."""
    if not slot.present:
        return None
    torch_dtype = TORCH_DTYPES[dtype]
    if not slot.segments:
        return torch.zeros(0, dtype=torch_dtype)
    values = slot_values(slot, heads, head_dim)
    made = torch.from_numpy(values).reshape(CACHE_BATCH, heads, values.shape[1], head_dim)
    return made if torch_dtype == torch.float32 else made.to(torch_dtype)


# ---- the content hash --------------------------------------------------------------

_TAIL_MARK = 1 << 40
_NEGATIVE_ZERO_BYTES = b"\x00\x00\x00\x80"  # -0.0f, little-endian


_LITTLE_ENDIAN = sys.byteorder == "little"


def _float32_bytes(values) -> bytes:
    """The values as float32, row-major, little-endian bytes."""
    if isinstance(values, torch.Tensor):
        if values.dtype != torch.float32:
            values = values.to(torch.float32)
        if values.requires_grad:
            values = values.detach()
        if values.device.type != "cpu":
            values = values.cpu()
        if not values.is_contiguous():
            values = values.contiguous()
        array = values.numpy()
    else:
        array = np.ascontiguousarray(values, dtype=np.float32)
    return array.tobytes() if _LITTLE_ENDIAN else array.astype("<f4").tobytes()


def _canonical_zeros(raw: bytes) -> bytes:
    bits = np.frombuffer(raw, dtype="<u4").copy()
    bits[bits == 0x80000000] = 0
    return bits.tobytes()


_LANE_STARTS: dict = {}


def _lane_starts(count: int) -> tuple:
    starts = _LANE_STARTS.get(count)
    if starts is None:
        starts = tuple(splitmix64((count * 4 + k) & _MASK64) for k in range(4))
        if len(_LANE_STARTS) < 4096:
            _LANE_STARTS[count] = starts
    return starts


def content_hash(values) -> int:
    """C++ kvcheck::content_hash of values converted to float32, row-major.

    Four lanes; lane k takes the pairs of values at 8i + 2k and 8i + 2k + 1
    as one 64-bit word (low half first); the last 0-7 values go one by one
    to lanes 0, 1, 2, ... marked by bit 40; the lanes are folded in order.
    -0 counts as +0. `values`: a tensor of any dtype and shape, or anything
    numpy turns into float32.

    The lanes are sequential chains of multiplies, which numpy cannot
    vectorise: they run on Python ints, over words struct reads straight
    from the bytes (a pair of little-endian float32 is the word C++ makes)."""
    raw = _float32_bytes(values)
    if _NEGATIVE_ZERO_BYTES in raw:  # maybe a -0 (or those bytes across two values)
        raw = _canonical_zeros(raw)
    count = len(raw) // 4
    full = count - count % 8
    l0, l1, l2, l3 = _lane_starts(count)
    prime, mask = _FNV_PRIME, _MASK64
    words = iter(struct.unpack_from(f"<{full // 2}Q", raw))
    for w0, w1, w2, w3 in zip(words, words, words, words):
        h = ((l0 ^ w0) * prime) & mask
        l0 = h ^ (h >> 29)
        h = ((l1 ^ w1) * prime) & mask
        l1 = h ^ (h >> 29)
        h = ((l2 ^ w2) * prime) & mask
        l2 = h ^ (h >> 29)
        h = ((l3 ^ w3) * prime) & mask
        l3 = h ^ (h >> 29)
    # The last 0-7 values one by one, marked apart from a pair.
    lanes = [l0, l1, l2, l3]
    for k, bits in enumerate(struct.unpack_from(f"<{count - full}I", raw, full * 4)):
        h = ((lanes[k % 4] ^ (bits | _TAIL_MARK)) * prime) & mask
        lanes[k % 4] = h ^ (h >> 29)
    # The fold: splitmix64(hash ^ lane) for each lane in order, inlined.
    result = 0
    for lane in lanes:
        x = ((result ^ lane) + _GOLDEN) & mask
        x = ((x ^ (x >> 30)) * _MIX_1) & mask
        x = ((x ^ (x >> 27)) * _MIX_2) & mask
        result = x ^ (x >> 31)
    return result


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
            values = slot_values(slot, content.heads, content.head_dim)
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


def expected_concat(parts: Sequence[CacheContent]) -> CacheContent:
    """The content of concat(parts) (C++ expected_concat): layer i is the
    concatenation of the parts' logical layer i, initialized; legacy when
    every part is, else modern; dtypes promoted as torch.cat does."""
    if not parts:
        raise ValueError("concat needs at least one cache")
    merged = CacheContent(heads=parts[0].heads, head_dim=parts[0].head_dim)
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
