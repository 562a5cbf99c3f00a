"""Observations of a cache object that need no cooperation from the engine
holding it: what it is made of (storage identities), its length, its view.

They read a cache through its attributes only (`layers` and the layer
objects' keys/values/key_cache/value_cache/is_initialized for the modern
layout; the `key_cache`/`value_cache` lists for the legacy one), so they
work on this package's caches and on transformers' DynamicCache alike.
Nothing here runs a torch operator that copies K/V, except view_of for a
slot that is not contiguous float32 (a conversion it makes to hash it):
call them outside a copies.CopyTracker's recording of an engine operation.

    ids = storage_of(cache)             # lists, layer objects, storages
    aliased = bool(set(ids) & set(storage_of(other)))
    seq_length(cache), view_of(cache)
    if fingerprint(cache) == earlier: ...       # nothing observable changed
"""

from __future__ import annotations

from typing import List, Optional

import torch

from . import content as _content
from .content import cache_layout, view_of  # noqa: F401  (re-exported)


_HAS_UNTYPED_STORAGE = hasattr(torch.Tensor, "untyped_storage")
_has_torch_function_unary = torch._C._has_torch_function_unary


def untyped_storage(tensor: torch.Tensor):
    """A tensor's untyped storage, on torch 1.13 (Tensor._storage(), what
    .storage() wraps in a TypedStorage) and 2.x (untyped_storage(), where
    .storage() is deprecated)."""
    if _HAS_UNTYPED_STORAGE:
        return tensor.untyped_storage()
    if not _has_torch_function_unary(tensor):
        # What .storage() wraps, without building the TypedStorage
        # around it (a sixth of the cost); a tensor with a
        # __torch_function__ override (a subclass, an active mode) still
        # goes through .storage().
        return tensor._storage()
    return tensor.storage()._storage


def storage_identity(tensor: Optional[torch.Tensor]) -> Optional[int]:
    """The address of the bytes a tensor's storage holds, or None for an
    absent tensor or a storage of no bytes (it holds nothing to share). Two
    tensors alias iff their identities are equal: views of one storage
    share it, and so do two storages made over the same memory (from_numpy
    of one array twice)."""
    if tensor is None:
        return None
    storage = untyped_storage(tensor)
    if storage.nbytes() == 0:
        return None
    return storage.data_ptr()


def storage_of(cache) -> List[int]:
    """Every identity a cache is made of, in the C++ reference's order:
    modern, the layer list, then per layer its object and the storages of
    its four slots; legacy, the key_cache list, the value_cache list, then
    the storages of the keys and of the values. Lists and layer objects are
    id()s; storages are data addresses (storage_identity). Two caches alias
    iff they share an identity."""
    ids: List[int] = []

    def add_tensor(tensor) -> None:
        identity = storage_identity(tensor)
        if identity is not None:
            ids.append(identity)

    if cache_layout(cache) == "modern":
        ids.append(id(cache.layers))
        for layer in cache.layers:
            ids.append(id(layer))
            for name in _content.SLOT_NAMES:
                add_tensor(getattr(layer, name, None))
    else:
        ids.append(id(cache.key_cache))
        ids.append(id(cache.value_cache))
        for tensor in cache.key_cache:
            add_tensor(tensor)
        for tensor in cache.value_cache:
            add_tensor(tensor)
    return ids


def shares_storage(a, b) -> bool:
    """Is any list, layer object or tensor storage of `a` also part of `b`?"""
    if a is b:
        return True
    return not set(storage_of(a)).isdisjoint(storage_of(b))


def seq_length(cache, layer_idx: int = 0) -> int:
    """cache.get_seq_length(layer_idx) when the cache has it, else what it
    would say: 0 for a missing, uninitialized or empty layer, else the
    logical keys' size along seq."""
    method = getattr(cache, "get_seq_length", None)
    if callable(method):
        return int(method(layer_idx))
    from .cache import logical_keys

    keys = logical_keys(cache, layer_idx)
    return 0 if keys is None or keys.numel() == 0 else int(keys.shape[-2])


def _slot_fingerprint(tensor: Optional[torch.Tensor]):
    if tensor is None:
        return None
    return (
        id(tensor),
        tensor._version,
        tensor.data_ptr(),
        tensor.dtype,
        tuple(tensor.shape),
        tensor.stride(),
        tensor.storage_offset(),
    )


def fingerprint(cache) -> tuple:
    """A cheap value that changes whenever anything view_of or storage_of
    reports of the cache may have changed: the lists and layer objects
    (identities and lengths), the flags, and per slot the tensor object,
    its version counter (bumped by every in-place torch operator, through
    any view), data address, dtype, shape, strides and offset.

    Equal fingerprints mean an equal view and equal storage identities,
    with one exception a checker must know: bytes written without torch
    (through a numpy array sharing the tensor's memory, ctypes, another
    process) bump no version. The fingerprint holds no reference to the
    cache's objects; compare it only while they are alive (an id can be
    reused once its object is gone)."""
    if cache_layout(cache) == "legacy":
        return (
            "legacy",
            id(cache.key_cache),
            id(cache.value_cache),
            tuple(_slot_fingerprint(t) for t in cache.key_cache),
            tuple(_slot_fingerprint(t) for t in cache.value_cache),
        )
    return (
        "modern",
        id(cache.layers),
        tuple(
            (id(layer), _content._layer_initialized(layer))
            + tuple(_slot_fingerprint(getattr(layer, name, None)) for name in _content.SLOT_NAMES)
            for layer in cache.layers
        ),
    )
