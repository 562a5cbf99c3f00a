"""The small deterministic attention decoder of kvcheck (C++
kv::models::Decoder, models/decoder.cpp), in Python over numpy and torch,
driving any cache the way transformers' attention layers do.

A forward reads `cache.get_seq_length(0)` for the position of its first
token, then per layer calls `cache.update(k, v, layer_idx, cache_kwargs)`
with the new tokens' K/V ([1, heads, n, head_dim] tensors in storages of
their own, in the cache's dtype) and attends over the keys and values that
`update` returns. It keeps no reference to a cache between calls.

Equality with C++: the weights come from the same splitmix64 stream, and
every float32 quantity is computed with the same operations in the same
order as decoder.cpp: each sum runs sequentially over its inner index
(np.add.accumulate, never numpy's pairwise sum; a sum that C++ starts from
+0.0 is made +0.0 when it ends as -0.0, wherever the sign of that zero can
reach a result), products are rounded before they are added, no operation
is fused, a prefill token reads no key or value after its own position,
and exp and sin of float32 are glibc's expf and sinf themselves (called
through ctypes for every value whose float64 result rounds too near a
float32 midpoint to be sure of, and for every logit that may be the
largest after sin), because numpy's own float32 exp/sin (and a float64
computation rounded to float32) differ from them in the last bit now and
then. So for the same cache content the logits
are bit for bit those of the C++ decoder, and so are the tokens (the
agreement test checks this against the C++ program). On a platform whose C
library has no expf/sinf to load, exp and sin are computed in float64 and
rounded, and the last bit of a logit may differ from C++.

    model = Decoder(DecoderConfig())                 # 2 layers, 2 heads, seed 1
    memory = memory_cache(model, [5, 9, 2], "modern")
    tokens = generate(model, [7, 3], clone(memory), 8)   # == recomputation
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from . import cache as _cache
from . import copies as _copies


@dataclass(frozen=True)
class DecoderConfig:
    """The C++ DecoderConfig; an eos_token of -1 never stops early."""

    layer_count: int = 2
    head_count: int = 2
    head_dim: int = 4
    vocab_size: int = 32
    eos_token: int = 0
    seed: int = 1
    # The attention window in tokens: a token at position P sees positions
    # max(0, P - window + 1)..P (C++ DecoderConfig::window); 0: full attention.
    window: int = 0


def _check_config(config: DecoderConfig) -> None:
    if config.layer_count < 1:
        raise ValueError("Decoder: layer_count must be >= 1")
    if config.head_count < 1:
        raise ValueError("Decoder: head_count must be >= 1")
    if config.head_dim < 1:
        raise ValueError("Decoder: head_dim must be >= 1")
    if config.vocab_size < 1:
        raise ValueError("Decoder: vocab_size must be >= 1")
    if config.eos_token < -1 or config.eos_token >= config.vocab_size:
        raise ValueError("Decoder: eos_token must be -1 or in [0, vocab_size)")
    if config.window < 0:
        raise ValueError("Decoder: window must be >= 0 (0: full attention)")


# ---- glibc's float32 exp and sin ---------------------------------------------------


def _libm_function(name: str) -> Optional[Callable[[float], float]]:
    path = ctypes.util.find_library("m")
    if path is None:
        return None
    try:
        function = getattr(ctypes.CDLL(path), name)
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_float
    function.argtypes = [ctypes.c_float]
    return function


_EXPF = _libm_function("expf")
_SINF = _libm_function("sinf")


# How near, relative to the value, a float64 result may lie to a float32
# rounding midpoint before the C library's own function must decide its
# rounding. glibc's expf computes in double with a relative error of at most
# 1.69 * 2^-34 before its one rounding (its ULP error is 0.502); sinf within
# 0.0607 ULP of the exact value before it (ULP error 0.5607, that is at
# most 2^-27 relative). Beyond these windows (a margin of 9 and 2 over
# those errors, and far more over numpy's float64 exp and sin, a few ULP of
# a double) the exact value, the C library's double and numpy's lie on one
# side of every midpoint, so rounding numpy's result gives the C library's
# float. (glibc's e_expf.c and s_sinf.c state these bounds; the decoder's
# tests compare the two ways on millions of inputs.)
_EXPF_WINDOW = 2.0**-30
_SINF_WINDOW = 2.0**-26  # for a map of sinf; the readout needs none (_READOUT_MARGIN)
# Below this many values the C library is called for each (a fifth of a
# microsecond a call): the vector way costs a dozen numpy calls, and then a
# C call for each value near a midpoint, a thirty-second of exp's results
# (half of sin's).
_VECTOR_VALUES_MIN = 24
# The readout's argmax of sinf over the logits: sinf lies within 0.5607
# float32 ULP of the exact sine, and numpy's float64 sine within a few
# double ULPs of it; for values of magnitude at most 1 (a float32 ULP of at
# most 2^-23 there, 2^-24 below 1) the two differ by less than 2^-23. A
# logit whose float64 sine lies more than this margin (eight times that)
# below the largest one cannot reach the largest sinf; only those within it
# are computed by sinf itself.
_READOUT_MARGIN = 2.0**-20
# A float64 result of smaller magnitude than this is a float32 zero, and
# so is the C library's: it rounds its own double once, which is within
# far less than a factor 2 of the exact value, and both lie below 2^-150,
# half the smallest float32 subnormal, so both round to zero (of their
# common sign).
_ZERO_BELOW = 2.0**-152


class _MapConstants:
    """_float32_map's operands for `count` values and one window, as arrays
    of that length: numpy combines arrays of one shape several times faster
    than an array with a scalar or a broadcast one."""

    def __init__(self, count: int, window: float):
        guard = int(window * 2.0**53)
        self.low_mask = np.full(count, (1 << 29) - 1, dtype=np.uint64)
        self.below_midpoint = np.full(count, (1 << 28) - guard, dtype=np.uint64)
        self.unsafe_span = np.full(count, 2 * guard, dtype=np.uint64)
        self.normal_min = np.full(count, 2.0**-125)
        self.normal_end = np.full(count, 2.0**127)
        self.zero_below = np.full(count, _ZERO_BELOW)


_map_constants: Dict[Tuple[int, float], _MapConstants] = {}


def _constants_for(count: int, window: float) -> _MapConstants:
    found = _map_constants.get((count, window))
    if found is None:
        if len(_map_constants) >= 1024:
            _map_constants.clear()
        found = _map_constants[(count, window)] = _MapConstants(count, window)
    return found


def _float32_map(
    function, fallback, values: np.ndarray, window: float = 0.0, vector_min: int = _VECTOR_VALUES_MIN
) -> np.ndarray:
    """function (a C float -> float) of each float32 value, bit for bit;
    `fallback` (numpy, float64) when the C library has none. With a
    `window` (see _EXPF_WINDOW), values whose float64 result lies farther
    than it from a float32 rounding midpoint take that result rounded, the
    others the C function's; `vector_min`: the fewest values for that way."""
    if function is None:
        return fallback(values.astype(np.float64)).astype(np.float32)
    flat = values.reshape(-1)
    if window <= 0 or flat.size < vector_min:
        return np.fromiter(map(function, flat.tolist()), dtype=np.float32, count=flat.size).reshape(values.shape)
    constants = _constants_for(flat.size, window)
    wide = fallback(flat.astype(np.float64))
    # A double rounds to float32 by its low 29 mantissa bits: 2^28 is the
    # midpoint. A distance of d double ULPs from it is at least d * 2^-53
    # relative to the value, so d > window * 2^53 (the guard) is far enough:
    # unsafe when low - (2^28 - guard) <= 2 * guard, in wrapping uint64.
    low = np.bitwise_and(wide.view(np.uint64), constants.low_mask)
    unsafe = np.less_equal(np.subtract(low, constants.below_midpoint), constants.unsafe_span)
    # Results that are subnormal or beyond float32's range, and NaNs, are
    # the C function's too; those below _ZERO_BELOW are zeros either way.
    magnitude = np.abs(wide)
    normal = np.logical_and(np.greater_equal(magnitude, constants.normal_min), np.less(magnitude, constants.normal_end))
    settled = np.logical_or(normal, np.less(magnitude, constants.zero_below))
    unsafe = np.less_equal(settled, unsafe)  # near a midpoint, or not settled
    result = wide.astype(np.float32)
    if np.count_nonzero(unsafe):
        at = np.flatnonzero(unsafe)
        result[at] = np.fromiter(map(function, flat[at].tolist()), dtype=np.float32, count=at.size)
    return result.reshape(values.shape)


# ---- float32 arithmetic in C++'s order ------------------------------------------------

# Arrays of one value in a given shape, made once and shared (read-only):
# numpy combines two arrays of one shape several times faster than an
# array and a scalar, and these shapes recur at every forward.
_FILLED_MAX = 4096
_filled: Dict[Tuple[Tuple[int, ...], float], np.ndarray] = {}


def _full(shape: Tuple[int, ...], value: float) -> np.ndarray:
    """A read-only float32 array of `shape` holding `value` (not -0)."""
    found = _filled.get((shape, value))
    if found is None:
        if len(_filled) >= _FILLED_MAX:
            _filled.clear()
        found = np.full(shape, value, dtype=np.float32)
        found.flags.writeable = False
        _filled[(shape, value)] = found
    return found


# The index of the last element along axis 0, 1, 2, ... of an array.
_LAST_ALONG = [(slice(None),) * axis + (-1,) for axis in range(8)]


def _sequential_sum(products: np.ndarray, axis: int) -> np.ndarray:
    """Sum of float32 values along `axis`, index 0 first, each addition
    rounded (never numpy's pairwise sum): every sum of the decoder is this
    one, the +0 of _ordered_sum aside."""
    return np.add.accumulate(products, axis=axis)[_LAST_ALONG[axis]]


def _ordered_sum(products: np.ndarray, axis: int) -> np.ndarray:
    """Sum of float32 products along `axis`, index 0 first, as C++'s
    `sum = 0.0F; for (...) sum += product;` does. A sum that C++ starts from
    +0 is never -0, hence the final + 0.0 (it changes nothing else)."""
    last = _sequential_sum(products, axis)
    return np.add(last, _full(last.shape, 0.0))


# The most products _row_times holds at once (a wide geometry's projection
# is summed in blocks of the inner index, carrying the partial sum).
_PRODUCTS_MAX = 1 << 20


def _row_times(rows: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """rows [n, inner] times a row-major weight [inner, cols], each sum over
    the inner index in ascending order (C++ row_times, per row)."""
    count, inner = rows.shape
    block = max(1, _PRODUCTS_MAX // max(1, count * weight.shape[1]))
    if block >= inner:
        return _ordered_sum(rows[:, :, None] * weight, axis=1)
    total = None
    for start in range(0, inner, block):
        products = rows[:, start : start + block, None] * weight[None, start : start + block, :]
        if total is not None:
            products[:, 0] += total  # the partial sum, then this block's products in order
        total = _sequential_sum(products, axis=1)
    return np.add(total, _full(total.shape, 0.0))


class _SplitMix64:
    """The C++ SplitMix64 weight stream, drawn in blocks."""

    def __init__(self, seed: int):
        self._state = seed & ((1 << 64) - 1)

    def uniform(self, count: int) -> np.ndarray:
        """`count` draws, uniform in [-1, 1) on a grid of 2^-23 (float32).
        The arithmetic runs in place on one uint64 array (the steps wrap
        modulo 2^64, as C++'s do); the top 24 bits minus 2^23, times 2^-23,
        are exact in float32."""
        z = np.arange(1, count + 1, dtype=np.uint64)
        z *= np.uint64(0x9E3779B97F4A7C15)
        z += np.uint64(self._state)
        self._state = (self._state + count * 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
        z ^= z >> np.uint64(30)
        z *= np.uint64(0xBF58476D1CE4E5B9)
        z ^= z >> np.uint64(27)
        z *= np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
        z >>= np.uint64(40)
        values = z.astype(np.float32)
        values -= np.float32(1 << 23)
        values *= np.float32(2.0**-23)
        return values


def _seeded(random: _SplitMix64, rows: int, cols: int, scale: float) -> np.ndarray:
    values = random.uniform(rows * cols)
    if scale != 1.0:  # a product with 1 is the value itself
        values *= np.float32(scale)
    return values.reshape(rows, cols)


# The C++ scales, all 1: see decoder.cpp.
_EMBEDDING_SCALE = _POSITION_SCALE = _PROJECTION_SCALE = _OUTPUT_SCALE = _UNEMBEDDING_SCALE = 1.0
# The readout folds the scaled logits through sin before the argmax, so
# that greedy decoding follows every change of the cache (decoder.cpp).
_READOUT_GAIN = 8.0


def _shape_text(t: Optional[torch.Tensor]) -> str:
    return "(none)" if t is None else "[" + ", ".join(str(size) for size in t.shape) + "]"


def _first_argmax(values: np.ndarray) -> int:
    """The first index of the largest value; a NaN counts as larger than any
    number (at::argmax's rule, as C++ first_argmax). numpy's argmax has the
    same rule: the first NaN if there is one, else the first index of the
    maximum (+0 and -0 compare equal, so the first of them)."""
    return int(np.argmax(values))


def _folded_argmax(scaled: np.ndarray) -> int:
    """_first_argmax(sinf of each value), C++'s readout, computing sinf only
    for the values that can give the largest result (see _READOUT_MARGIN).
    sinf is NaN exactly where the float64 sine is (a NaN or infinite
    input), so a NaN among those is the first NaN of sinf's results."""
    if _SINF is None:
        return _first_argmax(_float32_map(None, np.sin, scaled))
    wide = np.sin(scaled.astype(np.float64))
    best = int(np.argmax(wide))
    top = float(wide[best])
    if top != top:
        return best
    near = np.flatnonzero(np.greater_equal(wide, top - _READOUT_MARGIN))
    if near.size == 1:
        return best
    exact = np.fromiter(map(_SINF, scaled[near].tolist()), dtype=np.float32, count=near.size)
    return int(near[_first_argmax(exact)])


class _Weights:
    """The weights of one geometry (heads, head_dim), E = heads * head_dim:
    embedding [vocab, E], unembedding [E, vocab], the position term's
    frequencies, and per layer the [E, 3E] qkv projection and the [E, E]
    output, drawn from one splitmix64 stream in that order (C++
    Decoder::weights_for)."""

    def __init__(self, seed: int, heads: int, head_dim: int, vocab_size: int, layer_count: int):
        self.heads, self.head_dim = heads, head_dim
        width = heads * head_dim
        random = _SplitMix64(seed)
        self.embedding = _seeded(random, vocab_size, width, _EMBEDDING_SCALE)
        self.unembedding = _seeded(random, width, vocab_size, _UNEMBEDDING_SCALE)
        self.position_rates = [math.pow(10000.0, -float(e - e % 2) / float(width)) for e in range(width)]
        self.layers: List[Tuple[np.ndarray, np.ndarray]] = []
        self._random = random
        self.add_layers(layer_count)
        self.positions: Dict[int, np.ndarray] = {}
        self.extras: Dict[str, np.ndarray] = {}
        self.scale = float(np.float32(1.0 / math.sqrt(float(head_dim))))

    def add_layers(self, layer_count: int) -> None:
        """Draws the layers up to `layer_count`, continuing the stream
        where the last one drawn ended (the layers come last in it)."""
        width = self.heads * self.head_dim
        while len(self.layers) < layer_count:
            qkv = _seeded(self._random, width, 3 * width, _PROJECTION_SCALE)
            out = _seeded(self._random, width, width, _OUTPUT_SCALE)
            self.layers.append((qkv, out))

    def extra_row(self, seed: int, extra: str) -> np.ndarray:
        """Extra keys' [1, E] row: uniform values from the stream seeded by
        _extra_seed (read-only: kept for the next forward under them)."""
        row = self.extras.get(extra)
        if row is None:
            row = _seeded(_SplitMix64(_extra_seed(seed, self.heads, self.head_dim, extra)), 1, self.heads * self.head_dim, _EXTRA_SCALE)
            row.flags.writeable = False
            self.extras[extra] = row
        return row

    def position_row(self, position: int) -> np.ndarray:
        """The sinusoidal term of a position as a [1, E] row, computed in
        double with the C library's sin/cos (math.sin is it) and rounded to
        float32 (read-only: it is kept for the next forward at it)."""
        row = self.positions.get(position)
        if row is None:
            terms = [
                (math.sin if e % 2 == 0 else math.cos)(float(position) * rate)
                for e, rate in enumerate(self.position_rates)
            ]
            row = (np.array(terms, dtype=np.float32) * np.float32(_POSITION_SCALE))[None]
            row.flags.writeable = False
            self.positions[position] = row
        return row


# Extra keys' row (C++ extra_scale, extra_salt: "LoRA").
_EXTRA_SCALE = 1.0
_EXTRA_SALT = 0x4C6F5241


def _extra_seed(seed: int, heads: int, head_dim: int, extra: str) -> int:
    """The seed of extra keys' row (C++ extra_seed): config.seed, the
    geometry, each byte of the extra keys (UTF-8), then their length, each
    folded in by a splitmix64 step."""
    mask = (1 << 64) - 1
    data = extra.encode()
    h = _splitmix64((seed ^ _EXTRA_SALT) & mask)
    h = _splitmix64(h ^ (((heads << 32) | head_dim) & mask))
    for byte in data:
        h = _splitmix64(h ^ byte)
    return _splitmix64(h ^ len(data))


def _geometry_seed(seed: int, heads: int, head_dim: int) -> int:
    """The weight stream's seed of a geometry other than the configured one
    (C++: splitmix64(seed ^ splitmix64(heads << 32 | head_dim)))."""
    mask = (1 << 64) - 1
    return _splitmix64((seed ^ _splitmix64(((heads << 32) | head_dim) & mask)) & mask)


def _splitmix64(x: int) -> int:
    mask = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return x ^ (x >> 31)


class _StepMemo:
    """The results of a forward's pure steps, keyed by everything each one
    reads: a layer's projections by (geometry, layer, token count, the bytes
    of its input rows); its output rows by that and the float32 bytes of
    the keys and values the cache handed back after the update; the next
    token by (geometry, the bytes of the last row). The same computation on
    the same bytes (generation-equivalent reruns a generation on a fresh
    cache of the content the store's should hold) is then looked up, not
    redone; any other input misses. Cached arrays are read-only; the memo
    is emptied when it holds too many entries or bytes."""

    _ENTRIES_MAX = 1 << 14
    _BYTES_MAX = 64 << 20

    def __init__(self) -> None:
        self._entries: Dict[tuple, object] = {}
        self._bytes = 0

    def get(self, key: tuple):
        return self._entries.get(key)

    def put(self, key: tuple, value, size: int):
        """Keeps `value` under `key`; `size`: the bytes the key holds."""
        if len(self._entries) >= self._ENTRIES_MAX or self._bytes + size > self._BYTES_MAX:
            self._entries.clear()
            self._bytes = 0
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
        self._entries[key] = value
        self._bytes += size
        return value


class Decoder:
    """kv::models::Decoder: weights from config.seed, float32 arithmetic in
    the C++ order. `forward` writes K/V in the cache's dtype (that of its
    layer-0 logical keys, else float32); `forward_as` in a chosen one.

    It adapts to the cache it is given, as C++'s does: the first layer whose
    logical keys (else values) are a 4-D [1, H, S, D] tensor gives the
    geometry (H, D), else the configured one; it runs max(config.layer_count,
    the cache's layer count) layers. The weights of the configured geometry
    come from config.seed, those of another from splitmix64(seed ^
    splitmix64(H << 32 | D)); layer i's are the same for any layer count."""

    def __init__(self, config: DecoderConfig = DecoderConfig()):
        _check_config(config)
        self.config = config
        self._weights: Dict[Tuple[int, int], _Weights] = {}
        self._weights_for(config.head_count, config.head_dim, config.layer_count)
        self._steps = _StepMemo()

    @property
    def eos_token(self) -> int:
        return self.config.eos_token

    @property
    def _embedding(self) -> np.ndarray:
        """The configured geometry's token embedding."""
        return self._weights[(self.config.head_count, self.config.head_dim)].embedding

    def _weights_for(self, heads: int, head_dim: int, layer_count: int) -> _Weights:
        """The weights of geometry (heads, head_dim) with at least
        `layer_count` layers, made on first use (more layers are drawn
        when more are needed)."""
        weights = self._weights.get((heads, head_dim))
        if weights is not None:
            weights.add_layers(layer_count)
            return weights
        config = self.config
        configured = (heads, head_dim) == (config.head_count, config.head_dim)
        seed = config.seed if configured else _geometry_seed(config.seed, heads, head_dim)
        weights = _Weights(seed, heads, head_dim, config.vocab_size, layer_count)
        self._weights[(heads, head_dim)] = weights
        return weights

    def _geometry_of(self, cache) -> Tuple[int, int]:
        """(heads, head_dim) of the first layer whose logical keys (else
        values) are a 4-D tensor with heads and head_dim, else the
        configured geometry."""
        return self._shape_of(cache)[0]

    def _shape_of(self, cache) -> Tuple[Tuple[int, int], int]:
        """(_geometry_of, the cache's layer count: 0 for a cache of another
        kind), read in one pass over the layers, as cache.layer_count and
        cache.logical_keys/logical_values read them."""
        layers = getattr(cache, "layers", None)
        if isinstance(layers, list):
            for layer in layers:
                flag = getattr(layer, "is_initialized", None)
                if not (bool(flag) if flag is not None else getattr(layer, "keys", None) is not None):
                    continue  # an uninitialized layer shows the model no keys or values
                keys = getattr(layer, "keys", None)
                values = getattr(layer, "values", None)
                for held in (
                    keys if keys is not None else getattr(layer, "key_cache", None),
                    values if values is not None else getattr(layer, "value_cache", None),
                ):
                    if held is not None and held.dim() == 4 and held.shape[1] > 0 and held.shape[3] > 0:
                        return (int(held.shape[1]), int(held.shape[3])), len(layers)
            return (self.config.head_count, self.config.head_dim), len(layers)
        key_cache = getattr(cache, "key_cache", None)
        value_cache = getattr(cache, "value_cache", None)
        if isinstance(key_cache, list) and isinstance(value_cache, list):
            for layer in range(len(key_cache)):
                for held in (key_cache[layer], value_cache[layer]):
                    if held is not None and held.dim() == 4 and held.shape[1] > 0 and held.shape[3] > 0:
                        return (int(held.shape[1]), int(held.shape[3])), len(key_cache)
            return (self.config.head_count, self.config.head_dim), len(key_cache)
        # A cache of another kind: it says nothing of its geometry.
        return (self.config.head_count, self.config.head_dim), 0

    def _embed_rows(self, weights: _Weights, tokens: Sequence[int], first_position: int, extra: str = "") -> np.ndarray:
        if len(tokens) == 1:  # a decoding step
            token = tokens[0]
            rows = weights.embedding[token : token + 1] + weights.position_row(first_position)
        else:
            positions = np.concatenate([weights.position_row(first_position + i) for i in range(len(tokens))])
            rows = np.add(weights.embedding[tokens], positions)
        if extra:
            rows += weights.extra_row(self.config.seed, extra)
        return rows

    def _check_tokens(self, tokens: Sequence[int]) -> None:
        if len(tokens) == 0:
            raise ValueError("Decoder: forward needs at least one token")
        for token in tokens:
            if not 0 <= token < self.config.vocab_size:
                raise ValueError(f"Decoder: token {token} outside [0, {self.config.vocab_size})")

    def forward(self, tokens: Sequence[int], cache, extra: str = "") -> int:
        """Runs `tokens` on top of `cache` (appending their K/V to it in
        place, in the cache's dtype) and returns the greedy next token.
        `extra`: the request's extra keys (a LoRA adapter's name, a cache
        salt; C++ forward_extra), mixed into every token's first row, so
        the same tokens under other extra keys give other K/V; "" mixes
        nothing in."""
        return self.forward_as(tokens, cache, cache_dtype(cache), extra)

    def forward_as(self, tokens: Sequence[int], cache, dtype: torch.dtype, extra: str = "") -> int:
        """As forward, writing K/V of `dtype`. ValueError on a bad token
        list, a non-floating dtype, or a cache whose layer does not hold
        [1, heads, >= n, head_dim] keys and values of one length after the
        update (C++'s messages)."""
        tokens = [int(token) for token in tokens]
        self._check_tokens(tokens)
        if not dtype.is_floating_point:
            raise ValueError("Decoder: the K/V dtype must be floating")
        with _copies.model_forward(cache):
            return self._forward(tokens, cache, dtype, extra)

    def _forward(self, tokens: List[int], cache, dtype: torch.dtype, extra: str = "") -> int:
        count = len(tokens)
        (heads, dims), cached_layers = self._shape_of(cache)
        layer_count = max(self.config.layer_count, cached_layers)
        weights = self._weights_for(heads, dims, layer_count)
        width = heads * dims
        past = int(cache.get_seq_length(0))
        x = self._embed_rows(weights, tokens, past, extra)
        # torch.arange(past, past + count), made by numpy (a third of the cost).
        cache_kwargs = {"cache_position": torch.from_numpy(np.arange(past, past + count, dtype=np.int64))}
        memo = self._steps
        converts = dtype != torch.float32
        for layer in range(layer_count):
            qkv_weight, out_weight = weights.layers[layer]
            rows = x.tobytes()
            step = (heads, dims, layer, count, rows)
            qkv = memo.get(step)
            if qkv is None:
                qkv = memo.put(step, _row_times(x, qkv_weight), len(rows))
            k = _to_heads(qkv, count, 1, heads, dims)
            v = _to_heads(qkv, count, 2, heads, dims)
            if converts:
                k, v = k.to(dtype), v.to(dtype)
            held_keys, held_values = cache.update(k, v, layer, cache_kwargs)
            keys = _read_back(held_keys, count, layer, "keys", heads, dims)
            values = _read_back(held_values, count, layer, "values", heads, dims)
            total = keys.shape[1]
            if values.shape[1] != total:
                raise ValueError(f"Decoder: layer {layer} holds {total} keys but {values.shape[1]} values")
            # What the layer read from the cache is part of the key: the
            # attention below is a function of it, whatever update did.
            key_bytes, value_bytes = keys.tobytes(), values.tobytes()
            attended_step = (step, total, key_bytes, value_bytes)
            after = memo.get(attended_step)
            if after is None:
                attended = self._attend(qkv, keys, values, count, weights)
                size = len(rows) + len(key_bytes) + len(value_bytes)
                after = memo.put(attended_step, np.add(x, _row_times(attended, out_weight)), size)
            x = after
        last = x[count - 1 : count]
        readout = (heads, dims, last.tobytes())
        token = memo.get(readout)
        if token is None:
            logits = _row_times(last, weights.unembedding)[0]
            scaled = np.multiply(logits, _full(logits.shape, _READOUT_GAIN))
            token = memo.put(readout, _folded_argmax(scaled), width * 4)
        return token

    def _attend(self, qkv: np.ndarray, keys: np.ndarray, values: np.ndarray, count: int, weights: _Weights) -> np.ndarray:
        """Causal attention of the `count` new tokens (C++ attend): the
        query of new token i sits at position P = S - n + i and sees keys
        0..P; softmax(q.k * scale), the maximum subtracted first, then the
        weighted sum of the values. Returns [n, E].

        Three of its sums skip _ordered_sum's final + 0.0, because the sign
        of a zero there reaches nothing: a score's (a zero score, shifted,
        is exp(0) = 1 whatever the signs), the softmax total's (a sum of
        exponents, never -0) and the attended rows' (the output projection
        that reads them starts its own sums from +0, so a zero factor adds
        nothing to them)."""
        heads, dims = weights.heads, weights.head_dim
        width = heads * dims
        total = keys.shape[1]
        # C++ keeps the first maximum of the visible scores, skipping NaN
        # (-inf when every one is NaN): np.fmax skips NaN too. Where all of
        # a row's visible scores are NaN, its maximum may come out NaN
        # instead of -inf; every shifted score of the row is NaN either way.
        window = self.config.window
        if count == 1:
            # One new token (a decoding step): it sees every key (the last
            # `window` with a window: C++ sums from the first it sees), and
            # the arrays go without the token axis.
            if 0 < window < total:
                keys, values = keys[:, total - window :], values[:, total - window :]
            query = qkv[0, :width].reshape(heads, 1, dims)
            scores = _sequential_sum(query * keys, axis=2)  # [H, S]
            scores = np.multiply(scores, _full(scores.shape, weights.scale))
            exponents = _float32_map(
                _EXPF, np.exp, np.subtract(scores, np.fmax.reduce(scores, axis=1, keepdims=True)), _EXPF_WINDOW
            )
            attention = np.divide(exponents, _sequential_sum(exponents, axis=1)[:, None])
            return _sequential_sum(attention[:, :, None] * values, axis=1).reshape(1, width)
        # The keys a query does not see are masked out: their scores are
        # -inf (their exponents +0: after the visible ones, they add nothing
        # to a total), their products with the values +0 (they add nothing
        # to a sum of products either). Where a row's maximum is -inf or NaN
        # its visible exponents are NaN already, and so is its total.
        query = qkv[:, :width].reshape(count, heads, dims)
        scores = _sequential_sum(query[:, :, None, :] * keys, axis=3)  # [n, H, S]
        scores = np.multiply(scores, _full(scores.shape, weights.scale))
        hidden = _hidden(count, heads, total, window)
        scores = np.where(hidden, _full(scores.shape, -np.inf), scores)
        exponents = _float32_map(
            _EXPF, np.exp, np.subtract(scores, np.fmax.reduce(scores, axis=2, keepdims=True)), _EXPF_WINDOW
        )
        attention = np.divide(exponents, _sequential_sum(exponents, axis=2)[:, :, None])
        products = attention[:, :, :, None] * values
        products = np.where(hidden[:, :, :, None], _full(products.shape, 0.0), products)
        return _sequential_sum(products, axis=2).reshape(count, width)


_hidden_masks: Dict[Tuple[int, int, int, int], np.ndarray] = {}


def _hidden(count: int, heads: int, total: int, window: int = 0) -> np.ndarray:
    """[n, H, S] booleans, read-only: True where new token i (at position
    P = S - n + i) does not see key j (j > P; with a window W > 0 also
    j <= P - W: C++ attend's window). A hidden key before the visible ones
    adds a +0 to the sums, which changes no bit of them (see _attend)."""
    found = _hidden_masks.get((count, heads, total, window))
    if found is None:
        if len(_hidden_masks) >= _FILLED_MAX:
            _hidden_masks.clear()
        past = total - count
        positions = (past + np.arange(count))[:, None]
        hidden = np.arange(total)[None, :] > positions  # [n, S]
        if window > 0:
            hidden = np.logical_or(hidden, np.arange(total)[None, :] <= positions - window)
        found = np.ascontiguousarray(np.broadcast_to(hidden[:, None, :], (count, heads, total)))
        found.flags.writeable = False
        _hidden_masks[(count, heads, total, window)] = found
    return found


def _to_heads(qkv: np.ndarray, count: int, part: int, heads: int, dims: int) -> torch.Tensor:
    """Side `part` (0 q, 1 k, 2 v) of the [n, 3E] projections as a new
    [1, heads, n, head_dim] float32 tensor in a storage of its own."""
    width = heads * dims
    if count == 1:
        side = qkv[0, part * width : (part + 1) * width].reshape(1, heads, 1, dims)
    else:
        side = qkv[:, part * width : (part + 1) * width].reshape(count, heads, dims).transpose(1, 0, 2)[None]
    # A copy even where the slice is contiguous: the cache may keep the
    # tensor (and write into it), and qkv may be a memoised step's.
    return torch.from_numpy(np.array(side, dtype=np.float32, order="C"))


def _read_back(held: Optional[torch.Tensor], count: int, layer: int, side: str, heads: int, dims: int) -> np.ndarray:
    """What the cache holds for one side of a layer after the update, as
    a float32 [heads, S, head_dim] array; another geometry is refused."""
    if held is not None and held.dim() == 4:
        shape = held.shape
        if shape[0] == 1 and shape[1] == heads and shape[2] >= count and shape[3] == dims:
            return _float32_array(held)[0]
    raise ValueError(
        f"Decoder: layer {layer} {side} of shape {_shape_text(held)}, expected [1, {heads}, >= {count}, {dims}]"
    )


def _float32_array(held: torch.Tensor) -> np.ndarray:
    """A tensor's values as a float32 numpy array, converted exactly (a
    float32 contiguous tensor is read where it lies, without a copy)."""
    if held.requires_grad:
        held = held.detach()
    if held.is_neg():  # a lazy negation (torch._neg_view): numpy refuses it
        held = held.resolve_neg()
    if held.dtype == torch.float32:
        return held.numpy() if held.is_contiguous() else np.ascontiguousarray(held.numpy())
    if held.dtype == torch.float16:
        return held.numpy().astype(np.float32)
    # Others widened by torch: bfloat16 exactly (numpy has no bfloat16; its
    # bits are the top half of a float32's, NaNs keep sign and payload).
    return held.to(torch.float32).contiguous().numpy()


def cache_dtype(cache) -> torch.dtype:
    """The dtype a model writes into `cache`: that of its layer-0 logical
    keys when it has them, else float32."""
    try:
        keys = _cache.logical_keys(cache, 0)
    except TypeError:
        return torch.float32
    return keys.dtype if keys is not None else torch.float32


# ---- generation ---------------------------------------------------------------------


def generate_stream(model: Decoder, prompt: Sequence[int], cache, max_new_tokens: int) -> Iterator[int]:
    """The model loop, with no boundary (C++ run_model): prefill `prompt` on
    top of `cache` (written in place), then greedy decoding, feeding each
    token back, until EOS (yielded) or `max_new_tokens` tokens."""
    if len(prompt) == 0:
        raise ValueError("generate: the prompt is empty")
    if max_new_tokens < 0:
        raise ValueError("generate: max_new_tokens < 0")
    if max_new_tokens == 0:
        return
    next_token = model.forward(prompt, cache)
    produced = 1
    while True:
        yield next_token
        if next_token == model.eos_token or produced == max_new_tokens:
            return
        next_token = model.forward([next_token], cache)
        produced += 1


def generate(model: Decoder, prompt: Sequence[int], cache, max_new_tokens: int) -> List[int]:
    """generate_stream's tokens as a list. The cache given is the one the
    model writes into: a caller that must keep its cache passes a clone."""
    if len(prompt) == 0:
        raise ValueError("generate: the prompt is empty")
    if max_new_tokens < 0:
        raise ValueError("generate: max_new_tokens < 0")
    return list(generate_stream(model, prompt, cache, max_new_tokens))


def memory_cache(model: Decoder, memory_tokens: Sequence[int], layout: str = "modern", dtype=torch.float32):
    """A new cache of `layout` holding the K/V that `model` writes for
    `memory_tokens` with no past, in `dtype` (torch dtype or kvcheck name);
    an empty token list gives an empty cache. Not owned: it stands for what
    a store holds."""
    if isinstance(dtype, str):
        dtype = _cache._content.TORCH_DTYPES[dtype]
    cache = _cache.DynamicCache() if layout == "modern" else _cache.LegacyDynamicCache()
    if memory_tokens:
        model.forward_as(memory_tokens, cache, dtype)
    return cache


def generate_without_cache(model: Decoder, tokens: Sequence[int], max_new_tokens: int) -> List[int]:
    """Greedy generation with no cache: every step runs the whole sequence
    so far on a fresh float32 cache. Stops at EOS (kept) or the limit."""
    if len(tokens) == 0:
        raise ValueError("generate_without_cache: no tokens")
    if max_new_tokens < 0:
        raise ValueError("generate_without_cache: max_new_tokens < 0")
    sequence = list(tokens)
    generated: List[int] = []
    while len(generated) < max_new_tokens:
        next_token = model.forward_as(sequence, _cache.DynamicCache(), torch.float32)
        generated.append(next_token)
        if next_token == model.eos_token:
            break
        sequence.append(next_token)
    return generated
