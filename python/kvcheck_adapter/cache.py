"""KV caches in the two layouts of the transformers library, with the exact
in-place `update` semantics a model relies on: the Python twin of the C++
reference (src/kv/cache.h, src/cache.cpp), written from transformers'
documented API.

Two classes, not one with a layout flag: `DynamicCache` is the modern
layout (transformers >= 4.56: a list of layer objects, lazily initialized),
`LegacyDynamicCache` the legacy one (transformers <= 4.53: parallel
`key_cache`/`value_cache` lists). They are different classes in the
versions they model, with different attributes (a modern cache has no
`key_cache` list, a legacy one no `layers`), and everything that observes
a cache here (content.view_of, observe.storage_of) tells the layouts apart
by those attributes, the way it must for transformers' own objects. One
class with a flag would carry both sets of attributes and blur that.

Ownership, in one paragraph: a cache is shared by reference, like any
Python object. `update` mutates the cache it is called on (the layer
objects, the layer list, the slot lists), so whoever holds the cache sees
the new tokens. Tensors are never written in place here: appending rebinds
a slot to a new `torch.cat` result. A cache is *owned* (its `owned`
attribute) only when it shares no storage with anything stored; `clone`
and `concat` make owned caches, everything else leaves the marker clear.

    cache = DynamicCache()
    cache.update(k, v, 0)          # layer 0 lazily initialized, K/V appended
    copy = clone(cache)            # owned, independent: copy.update leaves cache alone

The module-level functions (clone, concat, to_legacy, from_legacy,
logical_keys, ...) take any cache object of either layout, ours or
transformers', through the same attributes.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from . import content as _content

Tensor = torch.Tensor


def _holds_elements(t: Optional[Tensor]) -> bool:
    return t is not None and t.numel() > 0


def empty_slot(dtype: torch.dtype = torch.float32, device=None) -> Tensor:
    """An empty slot tensor (shape [0]), as padding and lazy initialization
    make it. Zeros, not `empty`: no uninitialized memory, even of size 0."""
    return torch.zeros(0, dtype=dtype, device=device)


def _append(slot: Optional[Tensor], piece: Tensor) -> Tensor:
    # A new tensor in every case, as the C++ reference's append: an empty
    # slot is not part of the cat (its dtype does not promote the piece's).
    if not _holds_elements(slot):
        return torch.cat([piece], dim=-2)
    return torch.cat([slot, piece], dim=-2)


def _check_update(key_states, value_states, layer_idx: int) -> None:
    if layer_idx < 0:
        raise IndexError("layer index must be >= 0")
    if key_states is None or value_states is None:
        raise ValueError("update needs both k and v")


class DynamicLayer:
    """A layer object of the modern layout. Each of the four slots is
    optional (None means absent) and independent of the others: a layer may
    hold only keys, only values, or its tensors under the legacy slot names
    (`key_cache`, `value_cache`) of the transition versions.

    A layer made bare and then given tensors by assignment is NOT
    initialized: it reports length 0, and the next `update` lazily
    initializes it, dropping what it held (the real bug of merged caches)."""

    def __init__(self) -> None:
        self.keys: Optional[Tensor] = None
        self.values: Optional[Tensor] = None
        self.key_cache: Optional[Tensor] = None
        self.value_cache: Optional[Tensor] = None
        self.is_initialized = False

    def key(self) -> Optional[Tensor]:
        """The keys the layer exposes: the modern slot, else the legacy-named one."""
        return self.keys if self.keys is not None else self.key_cache

    def value(self) -> Optional[Tensor]:
        return self.values if self.values is not None else self.value_cache

    def lazy_initialization(self, key_states: Tensor, value_states: Optional[Tensor] = None) -> None:
        """Empty keys/values of the incoming dtypes and device; whatever the
        layer held in them is dropped. The legacy-named slots are kept."""
        if value_states is None:
            value_states = key_states
        self.keys = empty_slot(key_states.dtype, key_states.device)
        self.values = empty_slot(value_states.dtype, value_states.device)
        self.is_initialized = True

    def update(
        self, key_states: Tensor, value_states: Tensor, cache_kwargs: Optional[Dict[str, Any]] = None
    ) -> Tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys = _append(self.keys, key_states)
        self.values = _append(self.values, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        keys = self.key()
        if not self.is_initialized or not _holds_elements(keys):
            return 0
        return keys.shape[-2]


class DynamicCache:
    """The modern layout (transformers >= 4.56): a list of layer objects; a
    new cache has no layers."""

    def __init__(self) -> None:
        self.layers: List[DynamicLayer] = []
        self.owned = False

    def update(
        self, key_states: Tensor, value_states: Tensor, layer_idx: int, cache_kwargs: Optional[Dict[str, Any]] = None
    ) -> Tuple[Tensor, Tensor]:
        """Appends k and v ([batch, heads, seq, head_dim]) to layer
        `layer_idx` along seq, in place: missing layers are appended empty,
        an uninitialized layer is lazily initialized, then its slots are
        rebound to cat(slot, k/v, -2) on the same layer object. Returns the
        layer's whole keys and values."""
        _check_update(key_states, value_states, layer_idx)
        while len(self.layers) <= layer_idx:
            self.layers.append(DynamicLayer())
        return self.layers[layer_idx].update(key_states, value_states, cache_kwargs)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """0 when the layer is missing, uninitialized or empty, else keys.shape[-2]."""
        if layer_idx < 0:
            raise IndexError("layer index must be >= 0")
        if layer_idx >= len(self.layers):
            return 0
        return self.layers[layer_idx].get_seq_length()

    @property
    def is_initialized(self) -> bool:
        return all(layer.is_initialized for layer in self.layers)

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, layer_idx: int) -> Tuple[Optional[Tensor], Optional[Tensor]]:
        """(keys, values) of a layer, as transformers' legacy indexing gives them."""
        layer = self.layers[layer_idx]
        return layer.keys, layer.values

    def __iter__(self):
        return (self[i] for i in range(len(self.layers)))

    def to_legacy_cache(self) -> Tuple[Tuple[Optional[Tensor], Optional[Tensor]], ...]:
        """((keys, values), ...) per layer, aliased, as to_legacy gives them."""
        legacy = to_legacy(self)
        return tuple(zip(legacy.key_cache, legacy.value_cache))

    @classmethod
    def from_legacy_cache(cls, past_key_values) -> "DynamicCache":
        """A modern cache holding copies of ((keys, values), ...), every layer
        initialized."""
        legacy = LegacyDynamicCache()
        for k, v in past_key_values or ():
            legacy.key_cache.append(k)
            legacy.value_cache.append(v)
        return from_legacy(legacy)

    def __repr__(self) -> str:
        return f"DynamicCache(layers={len(self.layers)}, owned={self.owned})"


class LegacyDynamicCache:
    """The legacy layout (transformers <= 4.53): parallel `key_cache` and
    `value_cache` lists."""

    def __init__(self) -> None:
        self.key_cache: List[Tensor] = []
        self.value_cache: List[Tensor] = []
        self.owned = False

    def update(
        self, key_states: Tensor, value_states: Tensor, layer_idx: int, cache_kwargs: Optional[Dict[str, Any]] = None
    ) -> Tuple[Tensor, Tensor]:
        """Pads both lists with empty slots up to `layer_idx`; a new slot is
        k itself (an alias of the caller's tensor, as transformers does), an
        empty slot is replaced by k, else the slot is rebound to cat(slot, k)."""
        _check_update(key_states, value_states, layer_idx)
        keys, values = self.key_cache, self.value_cache
        if len(keys) != len(values):
            raise ValueError(f"legacy cache: key_cache holds {len(keys)} layers but value_cache {len(values)}")
        while len(keys) < layer_idx:
            # Padding takes k's dtype, as the C++ reference does (transformers
            # pads with float32 `torch.tensor([])`; an empty slot's dtype is
            # never compared, and the next update replaces it).
            keys.append(empty_slot(key_states.dtype, key_states.device))
            values.append(empty_slot(value_states.dtype, value_states.device))
        if len(keys) == layer_idx:
            keys.append(key_states)
            values.append(value_states)
        elif not _holds_elements(keys[layer_idx]):
            keys[layer_idx] = key_states
            values[layer_idx] = value_states
        else:
            keys[layer_idx] = torch.cat([keys[layer_idx], key_states], dim=-2)
            values[layer_idx] = torch.cat([values[layer_idx], value_states], dim=-2)
        return keys[layer_idx], values[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        if layer_idx < 0:
            raise IndexError("layer index must be >= 0")
        if layer_idx >= len(self.key_cache) or not _holds_elements(self.key_cache[layer_idx]):
            return 0
        return self.key_cache[layer_idx].shape[-2]

    def __len__(self) -> int:
        return len(self.key_cache)

    def __getitem__(self, layer_idx: int) -> Tuple[Tensor, Tensor]:
        return self.key_cache[layer_idx], self.value_cache[layer_idx]

    def __iter__(self):
        return (self[i] for i in range(len(self.key_cache)))

    def to_legacy_cache(self) -> Tuple[Tuple[Tensor, Tensor], ...]:
        return tuple(zip(self.key_cache, self.value_cache))

    @classmethod
    def from_legacy_cache(cls, past_key_values) -> "LegacyDynamicCache":
        """A legacy cache whose slots are the given tensors themselves, as
        transformers <= 4.53 builds it through update (no copy)."""
        cache = cls()
        for k, v in past_key_values or ():
            cache.key_cache.append(k)
            cache.value_cache.append(v)
        return cache

    def __repr__(self) -> str:
        return f"LegacyDynamicCache(layers={len(self.key_cache)}, owned={self.owned})"


# ---- observations the operations share ----------------------------------------------

layout_of = _content.cache_layout


def layer_count(cache) -> int:
    return len(cache.layers) if layout_of(cache) == "modern" else len(cache.key_cache)


def _logical(cache, layer_idx: int, side: int) -> Optional[Tensor]:
    if layer_idx < 0:
        raise IndexError("layer index must be >= 0")
    if layer_idx >= layer_count(cache):
        return None
    if layout_of(cache) == "legacy":
        return (cache.key_cache if side == _content.KEYS else cache.value_cache)[layer_idx]
    layer = cache.layers[layer_idx]
    if not _content._layer_initialized(layer):
        return None
    modern, legacy_named = ("keys", "key_cache") if side == _content.KEYS else ("values", "value_cache")
    held = getattr(layer, modern, None)
    return held if held is not None else getattr(layer, legacy_named, None)


def logical_keys(cache, layer_idx: int) -> Optional[Tensor]:
    """The keys a model sees in a layer: None when the layer is missing,
    uninitialized (modern) or has no keys of either name."""
    return _logical(cache, layer_idx, _content.KEYS)


def logical_values(cache, layer_idx: int) -> Optional[Tensor]:
    return _logical(cache, layer_idx, _content.VALUES)


def _all_slots(cache) -> List[Optional[Tensor]]:
    if layout_of(cache) == "legacy":
        return list(cache.key_cache) + list(cache.value_cache)
    return [getattr(layer, name, None) for layer in cache.layers for name in _content.SLOT_NAMES]


def footprint(cache) -> Tuple[int, int]:
    """(tensors, bytes) of every slot of every layer."""
    held = [t for t in _all_slots(cache) if t is not None]
    return len(held), sum(t.numel() * t.element_size() for t in held)


def holds_tokens(cache) -> bool:
    """Does the cache hold any K or V element a model would see?"""
    return any(
        _holds_elements(logical_keys(cache, i)) or _holds_elements(logical_values(cache, i))
        for i in range(layer_count(cache))
    )


def _cache_dtype_or_none(cache) -> Optional[torch.dtype]:
    # The dtype of the first tensor in any slot of any layer (layer order,
    # then slot order), as the C++ reference's cache_options.
    for i in range(layer_count(cache)):
        if layout_of(cache) == "legacy":
            found = [cache.key_cache[i], cache.value_cache[i]]
        else:
            found = [getattr(cache.layers[i], name, None) for name in _content.SLOT_NAMES]
        for t in found:
            if t is not None:
                return t.dtype
    return None


def is_owned(cache) -> bool:
    return bool(getattr(cache, "owned", False))


def set_owned(cache, owned: bool) -> None:
    cache.owned = owned


# ---- the cache-level operations ----------------------------------------------------------


def _copy(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.clone()


def clone(source) -> Any:
    """An independent owned copy: no tensor, layer object or list is shared
    with `source`; every slot is copied on its own (one-sided layers and
    legacy-named slots included); is_initialized and the layout are kept; an
    empty cache gets new empty lists. The copy is marked owned."""
    if layout_of(source) == "modern":
        copy = DynamicCache()
        for layer in source.layers:
            twin = DynamicLayer()
            twin.keys = _copy(getattr(layer, "keys", None))
            twin.values = _copy(getattr(layer, "values", None))
            twin.key_cache = _copy(getattr(layer, "key_cache", None))
            twin.value_cache = _copy(getattr(layer, "value_cache", None))
            twin.is_initialized = _content._layer_initialized(layer)
            copy.layers.append(twin)
    else:
        copy = LegacyDynamicCache()
        copy.key_cache = [_copy(t) for t in source.key_cache]
        copy.value_cache = [_copy(t) for t in source.value_cache]
    copy.owned = True
    return copy


def _cat_present(pieces: Sequence[Optional[Tensor]], dtype: torch.dtype) -> Optional[Tensor]:
    """The pieces that hold elements concatenated along seq, in `dtype`, in
    one copy (torch.cat promotes mixed pieces; pieces of one other dtype
    are written into a tensor of `dtype`): a merge copies each value once."""
    present = [t for t in pieces if _holds_elements(t)]
    if not present:
        return None
    promoted = present[0].dtype
    for t in present[1:]:
        promoted = torch.promote_types(promoted, t.dtype)
    if promoted == dtype:
        return torch.cat(present, dim=-2)
    shape = list(present[0].shape)
    shape[-2] = sum(t.shape[-2] for t in present)
    return torch.cat(present, dim=-2, out=torch.zeros(shape, dtype=dtype, device=present[0].device))


def concat(parts: Sequence[Any]) -> Any:
    """Concatenation along seq, in the order given: layer i of the result is
    cat(part_0.layer_i, part_1.layer_i, ...) of the parts' logical K/V that
    hold elements, and is initialized (a layer no part fills is empty and
    initialized). The result is legacy when every part is, else modern; its
    dtype is the parts' promoted as torch.cat promotes them (float32 when no
    part holds a tensor). A new owned cache; the parts are not modified."""
    if not parts:
        raise ValueError("concat needs at least one cache")
    layers = max(layer_count(part) for part in parts)
    all_legacy = all(layout_of(part) == "legacy" for part in parts)
    dtype: Optional[torch.dtype] = None
    for part in parts:
        part_dtype = _cache_dtype_or_none(part)
        if part_dtype is not None:
            dtype = part_dtype if dtype is None else torch.promote_types(dtype, part_dtype)
    dtype = dtype or torch.float32
    merged_keys: List[Tensor] = []
    merged_values: List[Tensor] = []
    for i in range(layers):
        for side, into in ((logical_keys, merged_keys), (logical_values, merged_values)):
            merged = _cat_present([side(part, i) for part in parts], dtype)
            into.append(empty_slot(dtype) if merged is None else merged)
    if all_legacy:
        result: Any = LegacyDynamicCache()
        result.key_cache = merged_keys
        result.value_cache = merged_values
    else:
        result = DynamicCache()
        for k, v in zip(merged_keys, merged_values):
            layer = DynamicLayer()
            layer.keys, layer.values = k, v
            layer.is_initialized = True  # a merged layer reports its true length
            result.layers.append(layer)
    result.owned = True
    return result


def to_legacy(cache) -> LegacyDynamicCache:
    """modern -> legacy: slot i holds layer i's logical keys/values, aliased
    (no copy), or an empty slot when the layer is uninitialized or lacks
    that side. ValueError for a legacy cache."""
    if layout_of(cache) == "legacy":
        raise ValueError("to_legacy: the cache is already legacy")
    dtype = _cache_dtype_or_none(cache) or torch.float32
    legacy = LegacyDynamicCache()
    for i in range(layer_count(cache)):
        k, v = logical_keys(cache, i), logical_values(cache, i)
        legacy.key_cache.append(k if k is not None else empty_slot(dtype))
        legacy.value_cache.append(v if v is not None else empty_slot(dtype))
    return legacy


def from_legacy(cache) -> DynamicCache:
    """legacy -> modern: every layer initialized and holding copies of the
    slots (transformers copies them through update); empty slots stay
    empty. Not marked owned (as the C++ reference). ValueError for a modern
    cache."""
    if layout_of(cache) == "modern":
        raise ValueError("from_legacy: the cache is already modern")
    if len(cache.key_cache) != len(cache.value_cache):
        raise ValueError("legacy cache: key_cache and value_cache differ in length")
    modern = DynamicCache()
    for k, v in zip(cache.key_cache, cache.value_cache):
        layer = DynamicLayer()
        layer.keys, layer.values = _copy(k), _copy(v)
        layer.is_initialized = True
        modern.layers.append(layer)
    return modern


def materialize(content: "_content.CacheContent") -> Any:
    """A cache holding exactly `content`, built as the C++ reference's
    materialize builds it: slot tensors from content.slot_tensor, each in a
    storage of its own; the layers' flags as given. Not owned."""
    make = lambda slot: _content.slot_tensor(slot, content.dtype, content.heads, content.head_dim)  # noqa: E731
    if content.layout == "legacy":
        cache: Any = LegacyDynamicCache()
        for layer in content.layers:
            cache.key_cache.append(make(layer.slots[_content.KEYS]))
            cache.value_cache.append(make(layer.slots[_content.VALUES]))
        return cache
    cache = DynamicCache()
    for layer in content.layers:
        made = DynamicLayer()
        made.keys, made.values, made.key_cache, made.value_cache = (make(slot) for slot in layer.slots)
        made.is_initialized = layer.initialized
        cache.layers.append(made)
    return cache
