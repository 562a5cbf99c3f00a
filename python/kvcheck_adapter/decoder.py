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
+0.0 is made +0.0 when it ends as -0.0), products are rounded before they
are added, no operation is fused, and exp and sin of float32 are glibc's
expf and sinf themselves, called through ctypes, because numpy's own
float32 exp/sin (and a float64 computation rounded to float32) differ from
them in the last bit now and then. So for the same cache content the logits
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
_SINF_WINDOW = 2.0**-26
# Below this many values the C library is called for each (a fifth of a
# microsecond a call): the vector way costs a dozen numpy calls, and then a
# C call for each value near a midpoint, a thirty-second of exp's results
# but half of sin's.
_VECTOR_VALUES_MIN = 24
_SINF_VECTOR_VALUES_MIN = 64
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
        return np.array([function(value) for value in flat.tolist()], dtype=np.float32).reshape(values.shape)
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
    unsafe = np.logical_or(unsafe, np.logical_not(settled))
    result = wide.astype(np.float32)
    if np.count_nonzero(unsafe):
        at = np.flatnonzero(unsafe)
        result[at] = [function(value) for value in flat[at].tolist()]
    return result.reshape(values.shape)


# ---- float32 arithmetic in C++'s order ------------------------------------------------

_ZERO = np.float32(0.0)


def _ordered_sum(products: np.ndarray, axis: int) -> np.ndarray:
    """Sum of float32 products along `axis`, index 0 first, as C++'s
    `sum = 0.0F; for (...) sum += product;` does. A sum that C++ starts from
    +0 is never -0, hence the final + 0.0 (it changes nothing else)."""
    last = (slice(None),) * axis + (-1,)
    return np.add.accumulate(products, axis=axis)[last] + _ZERO


# The most products _row_times holds at once (a wide geometry's projection
# is summed in blocks of the inner index, carrying the partial sum).
_PRODUCTS_MAX = 1 << 20


def _row_times(rows: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """rows [n, inner] times a row-major weight [inner, cols], each sum over
    the inner index in ascending order (C++ row_times, per row)."""
    count, inner = rows.shape
    block = max(1, _PRODUCTS_MAX // max(1, count * weight.shape[1]))
    if block >= inner:
        return _ordered_sum(rows[:, :, None] * weight[None, :, :], axis=1)
    total = None
    for start in range(0, inner, block):
        products = rows[:, start : start + block, None] * weight[None, start : start + block, :]
        if total is not None:
            products[:, 0] += total  # the partial sum, then this block's products in order
        total = np.add.accumulate(products, axis=1)[:, -1]
    return total + _ZERO


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
_READOUT_GAIN = np.float32(8.0)


def _shape_text(t: Optional[torch.Tensor]) -> str:
    return "(none)" if t is None else "[" + ", ".join(str(size) for size in t.shape) + "]"


def _first_argmax(values: Sequence[float]) -> int:
    """The first index of the largest value; a NaN counts as larger than any
    number (at::argmax's rule, as C++ first_argmax)."""
    best = 0
    for c in range(1, len(values)):
        current = values[best]
        if math.isnan(current):
            break
        if math.isnan(values[c]) or values[c] > current:
            best = c
    return best


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
        self.scale = np.float32(1.0 / math.sqrt(float(head_dim)))

    def add_layers(self, layer_count: int) -> None:
        """Draws the layers up to `layer_count`, continuing the stream
        where the last one drawn ended (the layers come last in it)."""
        width = self.heads * self.head_dim
        while len(self.layers) < layer_count:
            qkv = _seeded(self._random, width, 3 * width, _PROJECTION_SCALE)
            out = _seeded(self._random, width, width, _OUTPUT_SCALE)
            self.layers.append((qkv, out))

    def position_row(self, position: int) -> np.ndarray:
        """The sinusoidal term of a position, computed in double with the C
        library's sin/cos (math.sin is it) and rounded to float32."""
        row = self.positions.get(position)
        if row is None:
            terms = [
                (math.sin if e % 2 == 0 else math.cos)(float(position) * rate)
                for e, rate in enumerate(self.position_rates)
            ]
            row = np.array(terms, dtype=np.float32) * np.float32(_POSITION_SCALE)
            self.positions[position] = row
        return row


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


def _key_bytes(key: tuple) -> int:
    return sum(_key_bytes(part) if isinstance(part, tuple) else len(part) if isinstance(part, bytes) else 0 for part in key)


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

    def put(self, key: tuple, value):
        size = _key_bytes(key)
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
        try:
            layers = _cache.layer_count(cache)
            for layer in range(layers):
                for held in (_cache.logical_keys(cache, layer), _cache.logical_values(cache, layer)):
                    if held is not None and held.dim() == 4 and held.shape[1] > 0 and held.shape[3] > 0:
                        return int(held.shape[1]), int(held.shape[3])
        except TypeError:  # a cache of another kind: it says nothing of its geometry
            pass
        return self.config.head_count, self.config.head_dim

    def _embed_rows(self, weights: _Weights, tokens: Sequence[int], first_position: int) -> np.ndarray:
        if len(tokens) == 1:  # a decoding step
            return (weights.embedding[tokens[0]] + weights.position_row(first_position))[None]
        rows = [weights.embedding[token] + weights.position_row(first_position + i) for i, token in enumerate(tokens)]
        return np.stack(rows).astype(np.float32, copy=False)

    def _check_tokens(self, tokens: Sequence[int]) -> None:
        if len(tokens) == 0:
            raise ValueError("Decoder: forward needs at least one token")
        for token in tokens:
            if not 0 <= token < self.config.vocab_size:
                raise ValueError(f"Decoder: token {token} outside [0, {self.config.vocab_size})")

    def forward(self, tokens: Sequence[int], cache) -> int:
        """Runs `tokens` on top of `cache` (appending their K/V to it in
        place, in the cache's dtype) and returns the greedy next token."""
        return self.forward_as(tokens, cache, cache_dtype(cache))

    def forward_as(self, tokens: Sequence[int], cache, dtype: torch.dtype) -> int:
        """As forward, writing K/V of `dtype`. ValueError on a bad token
        list, a non-floating dtype, or a cache whose layer does not hold
        [1, heads, >= n, head_dim] keys and values of one length after the
        update (C++'s messages)."""
        tokens = [int(token) for token in tokens]
        self._check_tokens(tokens)
        if not dtype.is_floating_point:
            raise ValueError("Decoder: the K/V dtype must be floating")
        with _copies.model_forward(cache):
            return self._forward(tokens, cache, dtype)

    def _forward(self, tokens: List[int], cache, dtype: torch.dtype) -> int:
        count = len(tokens)
        heads, dims = self._geometry_of(cache)
        try:
            cached_layers = _cache.layer_count(cache)
        except TypeError:
            cached_layers = 0
        weights = self._weights_for(heads, dims, max(self.config.layer_count, cached_layers))
        past = int(cache.get_seq_length(0))
        x = self._embed_rows(weights, tokens, past)
        cache_kwargs = {"cache_position": torch.arange(past, past + count)}
        memo = self._steps
        for layer in range(max(self.config.layer_count, cached_layers)):
            qkv_weight, out_weight = weights.layers[layer]
            step = (heads, dims, layer, count, x.tobytes())
            qkv = memo.get(step)
            if qkv is None:
                qkv = memo.put(step, _row_times(x, qkv_weight))
            k = self._to_heads(qkv, count, 1, heads, dims)
            v = self._to_heads(qkv, count, 2, heads, dims)
            if dtype != torch.float32:
                k, v = k.to(dtype), v.to(dtype)
            held_keys, held_values = cache.update(k, v, layer, cache_kwargs)
            keys = self._read_back(held_keys, count, layer, "keys", heads, dims)
            values = self._read_back(held_values, count, layer, "values", heads, dims)
            if values.shape[1] != keys.shape[1]:
                raise ValueError(
                    f"Decoder: layer {layer} holds {keys.shape[1]} keys but {values.shape[1]} values"
                )
            # What the layer read from the cache is part of the key: the
            # attention below is a function of it, whatever update did.
            attended_step = (step, keys.shape[1], keys.tobytes(), values.tobytes())
            after = memo.get(attended_step)
            if after is None:
                attended = self._attend(qkv, keys, values, count, weights)
                after = memo.put(attended_step, x + _row_times(attended, out_weight))
            x = after
        readout = (heads, dims, x[count - 1].tobytes())
        token = memo.get(readout)
        if token is None:
            logits = _row_times(x[count - 1 : count], weights.unembedding)[0] * _READOUT_GAIN
            folded = _float32_map(_SINF, np.sin, logits, _SINF_WINDOW, _SINF_VECTOR_VALUES_MIN)
            token = memo.put(readout, _first_argmax(folded.tolist()))
        return token

    def _to_heads(self, qkv: np.ndarray, count: int, part: int, heads: int, dims: int) -> torch.Tensor:
        """Side `part` (0 q, 1 k, 2 v) of the [n, 3E] projections as a new
        [1, heads, n, head_dim] float32 tensor in a storage of its own."""
        width = heads * dims
        side = qkv[:, part * width : (part + 1) * width].reshape(count, heads, dims).transpose(1, 0, 2)
        # A copy even where the slice is contiguous: the cache may keep the
        # tensor (and write into it), and qkv may be a memoised step's.
        return torch.from_numpy(np.array(side, dtype=np.float32, order="C")[None])

    def _read_back(
        self, held: Optional[torch.Tensor], count: int, layer: int, side: str, heads: int, dims: int
    ) -> np.ndarray:
        """What the cache holds for one side of a layer after the update, as
        a float32 [heads, S, head_dim] array; another geometry is refused."""
        fits = (
            held is not None
            and held.dim() == 4
            and held.shape[0] == 1
            and held.shape[1] == heads
            and held.shape[2] >= count
            and held.shape[3] == dims
        )
        if not fits:
            raise ValueError(
                f"Decoder: layer {layer} {side} of shape {_shape_text(held)}, "
                f"expected [1, {heads}, >= {count}, {dims}]"
            )
        return _float32_array(held)[0]

    def _attend(self, qkv: np.ndarray, keys: np.ndarray, values: np.ndarray, count: int, weights: _Weights) -> np.ndarray:
        """Causal attention of the `count` new tokens (C++ attend): the
        query of new token i sits at position P = S - n + i and sees keys
        0..P; softmax(q.k * scale) with the maximum subtracted first, then
        the weighted sum of the values. Returns [n, E]."""
        heads, dims = weights.heads, weights.head_dim
        total = keys.shape[1]
        past = total - count
        query = qkv[:, : heads * dims].reshape(count, heads, dims)
        scores = _ordered_sum(query[:, :, None, :] * keys[None, :, :, :], axis=3) * weights.scale  # [n, H, S]
        # C++ keeps the first maximum of the visible scores, skipping NaN
        # (-inf when every one is NaN): np.fmax skips NaN too. Where all of
        # a row's visible scores are NaN, its maximum may come out NaN
        # instead of -inf; every shifted score of the row is NaN either way.
        if count == 1:
            # One new token (a decoding step): it sees every key.
            top = np.fmax.reduce(scores, axis=2)
            shifted = scores - top[:, :, None]
            exponents = _float32_map(_EXPF, np.exp, shifted, _EXPF_WINDOW)
        else:
            visible = np.arange(total)[None, :] < (past + np.arange(count) + 1)[:, None]  # [n, S]
            visible = np.broadcast_to(visible[:, None, :], scores.shape)
            top = np.fmax.reduce(np.where(visible, scores, np.float32(-np.inf)), axis=2)
            exponents = np.zeros_like(scores)
            shifted = (scores - top[:, :, None])[visible]
            exponents[visible] = _float32_map(_EXPF, np.exp, shifted, _EXPF_WINDOW)
        total_weight = _ordered_sum(exponents, axis=2)
        attention = exponents / total_weight[:, :, None]
        result = _ordered_sum(attention[:, :, :, None] * values[None, :, :, :], axis=2)  # [n, H, D]
        return result.reshape(count, heads * dims)


def _float32_array(held: torch.Tensor) -> np.ndarray:
    """A tensor's values as a float32 numpy array, converted exactly (a
    float32 contiguous tensor is read where it lies, without a copy)."""
    if held.requires_grad:
        held = held.detach()
    if held.dtype == torch.float32:
        return held.numpy() if held.is_contiguous() else np.ascontiguousarray(held.numpy())
    if held.dtype == torch.float16:
        return held.numpy().astype(np.float32)
    if held.dtype == torch.bfloat16:
        # numpy has no bfloat16: its bits are the top half of a float32's.
        bits = held.contiguous().view(torch.int16).numpy().astype(np.uint16).astype(np.uint32) << np.uint32(16)
        return bits.view(np.float32)
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
