"""Cache content and views as the adapter protocol carries them
(docs/protocol.md), with the two costs of an adapter made small: building
a cache from content, and reporting what a cache holds.

Content arrives compact: per slot a list of segments [seed, tokens,
precision]; the adapter makes the values (content.slot_values). Views leave
as JSON: per slot its dtype, shape and content hash; kvcheck derives the
digest.

Both are memoised, and both memos are keyed on everything the result
depends on, so they can never answer for a changed tensor:
  - a segment's values by (seed, tokens, precision, heads, head_dim): a
    pure function (the values of a cache's new segments are made together,
    in one pass);
  - a slot's hash by (dtype, shape, the bytes of its values): the hash is
    a function of exactly these. A tensor written in place, by any means,
    has other bytes and misses the memo.

    content = content_from_json(request["cache"])
    cache = materialize(content)           # == cache.materialize(content)
    reply["view"] = view_json(cache)       # == content.view_of(cache)
"""

from __future__ import annotations

from ctypes import string_at as _string_at
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from . import cache as _cache
from . import content as _content
from . import observe as _observe

# Entries each memo keeps at most; it is emptied when full (a run's caches
# repeat within a trace, rarely across many).
_MEMO_ENTRIES_MAX = 1 << 16

_segment_memo: Dict[tuple, np.ndarray] = {}
_hash_memo: Dict[tuple, int] = {}


class WireError(ValueError):
    """Content or a request field that breaks the protocol."""


# ---- content -------------------------------------------------------------------


def _int(value: Any, what: str, low: int = 0, high: int = (1 << 64) - 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise WireError(f"{what} must be an integer in [{low}, {high}], not {value!r}")
    return value


def content_from_json(data: Any) -> _content.CacheContent:
    """The CacheContent a request's "cache" member describes; WireError
    naming the member at fault."""
    if not isinstance(data, dict):
        raise WireError("'cache' must be an object")
    layout, dtype = data.get("layout"), data.get("dtype")
    if layout not in _content.LAYOUTS:
        raise WireError(f"'cache.layout' must be one of {_content.LAYOUTS}, not {layout!r}")
    if dtype not in _content.DTYPES:
        raise WireError(f"'cache.dtype' must be one of {_content.DTYPES}, not {dtype!r}")
    heads = _int(data.get("heads"), "'cache.heads'", 1, _content.CACHE_HEADS_MAX)
    head_dim = _int(data.get("head_dim"), "'cache.head_dim'", 1, _content.CACHE_HEAD_DIM_MAX)
    layers = data.get("layers")
    if not isinstance(layers, list):
        raise WireError("'cache.layers' must be an array")
    content = _content.CacheContent(layout=layout, dtype=dtype, heads=heads, head_dim=head_dim)
    for i, layer in enumerate(layers):
        if not isinstance(layer, dict) or not isinstance(layer.get("initialized"), bool):
            raise WireError(f"'cache.layers[{i}]' must be an object with a boolean 'initialized'")
        slots = layer.get("slots")
        if not isinstance(slots, list) or len(slots) != _content.SLOT_COUNT:
            raise WireError(f"'cache.layers[{i}].slots' must be an array of {_content.SLOT_COUNT} entries")
        made = _content.LayerContent(initialized=layer["initialized"])
        for s, slot in enumerate(slots):
            if slot is None:
                continue
            if not isinstance(slot, list):
                raise WireError(f"'cache.layers[{i}].slots[{s}]' must be null or an array of [seed, tokens, precision]")
            segments = []
            for segment in slot:
                if not isinstance(segment, list) or len(segment) != 3 or segment[2] not in _content.DTYPES:
                    raise WireError(
                        f"a segment of 'cache.layers[{i}].slots[{s}]' is not [seed, tokens, precision]"
                        f" (precision one of {_content.DTYPES}): {segment!r}"
                    )
                segments.append(
                    _content.Segment(
                        _int(segment[0], "a segment's seed"), _int(segment[1], "a segment's tokens", 0, 1 << 32), segment[2]
                    )
                )
            made.slots[s] = _content.SlotContent(True, segments)
        content.layers.append(made)
    return content


_index_memo: Dict[tuple, np.ndarray] = {}


def _index_mix(heads: int, tokens: int, head_dim: int) -> np.ndarray:
    """content.element_index_mix, memoised: the half of content.slot_value
    that does not depend on the seed."""
    key = (heads, tokens, head_dim)
    found = _index_memo.get(key)
    if found is None:
        found = _content.element_index_mix(heads, tokens, head_dim)
        if len(_index_memo) >= _MEMO_ENTRIES_MAX:
            _index_memo.clear()
        _index_memo[key] = found
    return found


def _make_segments(keyed: Dict[tuple, _content.Segment], heads: int, head_dim: int) -> None:
    """Puts the values of the segments `keyed` names (by memo key: (seed,
    tokens, precision, heads, head_dim)) that are not memoised yet into the
    memo, all in one pass of array arithmetic per precision
    (content.slot_value and round_to, element for element): per segment, it
    costs what one numpy call costs. The memo holds each segment as a
    float32 [1, heads, tokens, head_dim] array (never handed out: a slot's
    tensor is a copy)."""
    missing = [(key, segment) for key, segment in keyed.items() if key not in _segment_memo]
    if not missing:
        return
    if len(_segment_memo) + len(missing) > _MEMO_ENTRIES_MAX:
        _segment_memo.clear()  # every segment named is made again: the caller reads them all
        missing = list(keyed.items())
    for precision in _content.DTYPES:
        group = [found for found in missing if found[1].precision == precision]
        if not group:
            continue
        sizes = [heads * segment.tokens * head_dim for _, segment in group]
        if len(group) == 1:
            seeds = np.uint64(group[0][1].seed)
            mixes = _index_mix(heads, group[0][1].tokens, head_dim)
        else:
            seeds = np.repeat(np.array([segment.seed for _, segment in group], dtype=np.uint64), sizes)
            mixes = np.concatenate([_index_mix(heads, segment.tokens, head_dim) for _, segment in group])
        values = _content.round_to_array(precision, _content.segment_values_raw(seeds, mixes))
        start = 0
        for (key, segment), size in zip(group, sizes):
            _segment_memo[key] = values[start : start + size].reshape(_content.CACHE_BATCH, heads, segment.tokens, head_dim)
            start += size


def _slot_keys(slot: _content.SlotContent, heads: int, head_dim: int, keyed: Dict[tuple, _content.Segment]) -> List[tuple]:
    """The memo keys of a slot's segments that hold tokens, in order; each
    is also put in `keyed` (key -> segment)."""
    keys = []
    for segment in slot.segments:
        if segment.tokens > 0:
            key = (segment.seed, segment.tokens, segment.precision, heads, head_dim)
            keyed[key] = segment
            keys.append(key)
    return keys


def _tensor_of(slot: _content.SlotContent, keys: List[tuple], torch_dtype: torch.dtype, heads: int, head_dim: int):
    """slot_tensor of a slot whose segments (memo keys `keys`) are in the memo."""
    if not slot.present:
        return None
    if not slot.segments:
        return torch.zeros(0, dtype=torch_dtype)
    if not keys:
        return torch.zeros(_content.CACHE_BATCH, heads, 0, head_dim, dtype=torch_dtype)
    if len(keys) == 1:
        shared = torch.from_numpy(_segment_memo[keys[0]])  # the memo's: copied below
        if torch_dtype == torch.float32:
            return shared.clone(memory_format=torch.contiguous_format)
        return shared.to(torch_dtype)
    joined = torch.from_numpy(np.concatenate([_segment_memo[key] for key in keys], axis=2))  # a new array
    return joined.clone(memory_format=torch.contiguous_format) if torch_dtype == torch.float32 else joined.to(torch_dtype)


def slot_tensor(
    slot: _content.SlotContent, dtype: str, heads: int, head_dim: int
) -> Optional[torch.Tensor]:
    """content.slot_tensor, bit for bit, from memoised segment values: None
    when absent, a [0] tensor without segments, else [1, heads, T,
    head_dim] in a storage of its own."""
    keyed: Dict[tuple, _content.Segment] = {}
    keys = _slot_keys(slot, heads, head_dim, keyed)
    _make_segments(keyed, heads, head_dim)
    return _tensor_of(slot, keys, _content.TORCH_DTYPES[dtype], heads, head_dim)


def materialize(content: _content.CacheContent) -> Any:
    """cache.materialize(content): a DynamicCache (modern) or
    LegacyDynamicCache (legacy) holding exactly `content`, every slot in a
    storage of its own, the layers' flags as given, not owned. The values
    of the segments not memoised yet are made together first."""
    heads, head_dim = content.heads, content.head_dim
    torch_dtype = _content.TORCH_DTYPES[content.dtype]
    keyed: Dict[tuple, _content.Segment] = {}
    slot_keys = [[_slot_keys(slot, heads, head_dim, keyed) for slot in layer.slots] for layer in content.layers]
    _make_segments(keyed, heads, head_dim)
    if content.layout == "legacy":
        legacy = _cache.LegacyDynamicCache()
        for layer, keys in zip(content.layers, slot_keys):
            legacy.key_cache.append(_tensor_of(layer.slots[_content.KEYS], keys[_content.KEYS], torch_dtype, heads, head_dim))
            legacy.value_cache.append(
                _tensor_of(layer.slots[_content.VALUES], keys[_content.VALUES], torch_dtype, heads, head_dim)
            )
        return legacy
    modern = _cache.DynamicCache()
    for layer, keys in zip(content.layers, slot_keys):
        made = _cache.DynamicLayer()
        made.keys, made.values, made.key_cache, made.value_cache = (
            _tensor_of(slot, slot_keys_of, torch_dtype, heads, head_dim) for slot, slot_keys_of in zip(layer.slots, keys)
        )
        made.is_initialized = layer.initialized
        modern.layers.append(made)
    return modern


# ---- views ---------------------------------------------------------------------------


def _value_bytes(data: torch.Tensor, dtype: str) -> bytes:
    """The bytes of a float tensor's values, row-major. A CPU tensor with
    row-major strides and no negative bit holds exactly these bytes in
    place: they are read there (half the cost of numpy's copy, a quarter
    for bfloat16); any other goes through numpy. (A tensor without storage,
    such as a sparse one, raises RuntimeError either way; a float tensor
    has no conjugate bit.)"""
    if data.device.type == "cpu" and data.is_contiguous() and not data.is_neg():
        count = data.numel() * data.element_size()
        return _string_at(data.data_ptr(), count) if count else b""
    if data.is_neg():  # a lazy negation (torch._neg_view): numpy refuses it
        data = data.resolve_neg()
    if dtype == "bf16":
        data = data.view(torch.int16)  # numpy has no bfloat16; the bits are what count
    return data.numpy().tobytes()  # row-major, whatever the strides


def _slot_json(tensor: Optional[torch.Tensor], pending: List[tuple]) -> Optional[Dict[str, Any]]:
    """What kvcheck sees of one slot tensor (content.slot_view), as JSON. A
    hash not memoised yet is left to _hash_pending: (slot, memo key,
    tensor) goes on `pending`."""
    if tensor is None:
        return None
    dtype = _content.dtype_name(tensor.dtype)
    shape = tuple(tensor.shape)
    slot = {"dtype": dtype, "shape": list(shape), "hash": None}
    try:
        key = (dtype, shape, _value_bytes(tensor.detach() if tensor.requires_grad else tensor, dtype))
    except (RuntimeError, TypeError):
        key = None
    hash_value = None if key is None else _hash_memo.get(key)
    if hash_value is None:
        pending.append((slot, key, tensor))
    else:
        slot["hash"] = hash_value
    return slot


def _hashed(key: Optional[tuple], tensor: torch.Tensor):
    """What content.content_hashes reads of a slot _slot_json left: for
    float32 and bfloat16, the bytes it read (their float32 bit patterns
    are these bytes, or these bytes shifted into the top half, as
    content._float32_bits makes them), without reading the tensor again;
    the tensor itself for float16 (widened by torch, as C++ does) or when
    its bytes could not be read."""
    if key is None:
        return tensor
    dtype, _, data = key
    if dtype == "f32":
        return np.frombuffer(data, dtype=np.float32)
    if dtype == "bf16":
        bits = np.frombuffer(data, dtype=np.uint16).astype(np.uint32)
        bits <<= np.uint32(16)
        return bits.view(np.float32)
    return tensor


def _hash_pending(pending: List[tuple]) -> None:
    """Hashes the slots _slot_json left, together (content.content_hashes),
    and memoises them."""
    if not pending:
        return
    hashes = _content.content_hashes([_hashed(key, tensor) for _, key, tensor in pending])
    if len(_hash_memo) + len(pending) > _MEMO_ENTRIES_MAX:
        _hash_memo.clear()
    for (slot, key, _), hash_value in zip(pending, hashes):
        slot["hash"] = hash_value
        if key is not None:
            _hash_memo[key] = hash_value


def _initialized(layer) -> bool:
    # As content.view_of reads it: transformers 4.57 layers carry the flag;
    # 4.56 ones initialize lazily when their keys are None.
    flag = getattr(layer, "is_initialized", None)
    return bool(flag) if flag is not None else getattr(layer, "keys", None) is not None


def view_json(cache, with_values: bool = False) -> Dict[str, Any]:
    """content.view_of(cache) as the protocol writes a view (duck-typed:
    the modern `layers` list or the legacy `key_cache`/`value_cache`
    lists). With `with_values` (an engine declaring a content tolerance,
    docs/protocol.md section 5), each present slot carries its values too,
    read as float32, row-major."""
    layout = _content.cache_layout(cache)
    layers: List[Dict[str, Any]] = []
    pending: List[tuple] = []
    if layout == "modern":
        for layer in cache.layers:
            keys, values, key_cache, value_cache = (getattr(layer, name, None) for name in _content.SLOT_NAMES)
            # key_cache and value_cache are most often keys and values
            # themselves (the aliases transformers keeps): read once.
            keys_json, values_json = _slot_json(keys, pending), _slot_json(values, pending)
            slots = [
                keys_json,
                values_json,
                keys_json if key_cache is keys else _slot_json(key_cache, pending),
                values_json if value_cache is values else _slot_json(value_cache, pending),
            ]
            layers.append({"initialized": _initialized(layer), "slots": slots})
    else:
        keys, values = cache.key_cache, cache.value_cache
        if len(keys) != len(values):
            raise ValueError(f"legacy cache: key_cache holds {len(keys)} layers but value_cache {len(values)}")
        for k, v in zip(keys, values):
            layers.append({"initialized": True, "slots": [_slot_json(k, pending), _slot_json(v, pending), None, None]})
    _hash_pending(pending)
    view = {"layout": layout, "layers": layers}
    if with_values:
        _add_values(view, cache)
    return view


def _add_values(view: Dict[str, Any], cache) -> None:
    """Each present slot of `view` (view_json of `cache`) given its values."""
    if view["layout"] == "modern":
        tensors = [[getattr(layer, name, None) for name in _content.SLOT_NAMES] for layer in cache.layers]
    else:
        tensors = [[k, v, None, None] for k, v in zip(cache.key_cache, cache.value_cache)]
    for layer, layer_tensors in zip(view["layers"], tensors):
        for slot, tensor in zip(layer["slots"], layer_tensors):
            if slot is not None and tensor is not None:
                slot["values"] = tensor.detach().to(torch.float32).reshape(-1).tolist()


def _storage_identity(tensor: Optional[torch.Tensor]) -> Optional[int]:
    # observe.storage_identity, without making a storage object (a tenth
    # of the cost): a tensor holding elements starts `storage_offset`
    # elements into its storage. An empty one reports no data address, and
    # may still view a storage that holds bytes: it takes the long way.
    if tensor is None:
        return None
    if tensor.numel() > 0 and not tensor.is_cuda:
        return tensor.data_ptr() - tensor.storage_offset() * tensor.element_size()
    return _observe.storage_identity(tensor)


def storage_of(cache) -> List[int]:
    """observe.storage_of(cache): the lists, layer objects and storages a
    cache is made of, in the same order, computed faster."""
    ids: List[int] = []
    if _content.cache_layout(cache) == "modern":
        ids.append(id(cache.layers))
        for layer in cache.layers:
            ids.append(id(layer))
            for name in _content.SLOT_NAMES:
                identity = _storage_identity(getattr(layer, name, None))
                if identity is not None:
                    ids.append(identity)
    else:
        ids.append(id(cache.key_cache))
        ids.append(id(cache.value_cache))
        for tensor in list(cache.key_cache) + list(cache.value_cache):
            identity = _storage_identity(tensor)
            if identity is not None:
                ids.append(identity)
    return ids


def view_from_json(data: Dict[str, Any]) -> _content.CacheView:
    """The CacheView a protocol view describes (for tests and digests)."""
    view = _content.CacheView(layout=data["layout"])
    for layer in data["layers"]:
        slots = [
            _content.SlotView() if slot is None else _content.SlotView(True, slot["dtype"], tuple(slot["shape"]), slot["hash"])
            for slot in layer["slots"]
        ]
        view.layers.append(_content.LayerView(layer["initialized"], slots))
    return view


def content_json(content: _content.CacheContent) -> Dict[str, Any]:
    """The protocol form of a CacheContent (what kvcheck sends)."""
    return {
        "layout": content.layout,
        "dtype": content.dtype,
        "heads": content.heads,
        "head_dim": content.head_dim,
        "layers": [
            {
                "initialized": layer.initialized,
                "slots": [
                    [[segment.seed, segment.tokens, segment.precision] for segment in slot.segments]
                    if slot.present
                    else None
                    for slot in layer.slots
                ],
            }
            for layer in content.layers
        ],
    }


__all__ = [
    "WireError",
    "content_from_json",
    "content_json",
    "materialize",
    "slot_tensor",
    "storage_of",
    "view_from_json",
    "view_json",
]
