"""An activation-memory store over real transformers: the store of
activation_memory.py, with transformers' own DynamicCache objects (of
whatever version is installed) and a real model's `generate`.

It keeps items {id, cache, metadata}. Real caches carry no owned marker, so
the store keeps its own account of the copies it handed out (weakly: a copy
nobody holds is gone from it): get_cache hands out a deep copy (one id) or a
merge (several), and remembers it; storing a cache forgets it. The
generation boundary gives the model the incoming cache itself only when it
is such a copy, else a deep copy of it (copy.deepcopy: new cache, layer
objects, lists and tensors), and never a stored object. So every generation
path copies the stored K/V exactly once: generate(get_cache(ids)) in
get_cache, generate(stored item) at the boundary.

The historic bugs are switchable by name (TransformersMemory(bugs=[...])),
with activation_memory.BUGS's names:
  stored_to_generation      generate hands the incoming cache to the model
                            without copying (the original aliasing bug);
  single_id_returns_stored  get_cache of one id returns the stored object
                            (and takes it for a copy it handed out);
  merge_uninitialized       merged layers are built without setting the
                            initialized flag (only where layers have one,
                            transformers >= 4.57: on 4.56 a layer holding
                            keys is initialized, on <= 4.53 there are no
                            layer objects; the store refuses the bug there);
  shallow_clone             a copy makes new cache and layer objects (and
                            lists) but shares the tensors;
  double_copy               generate copies even a copy get_cache handed
                            out (two copies on the path).

    store = TransformersMemory()
    store.add([{"id": "a", "cache": cache, "metadata": {"source": "doc1"}}])
    tokens = store.generate(store.get_cache(["a"]), [7, 3], 8)   # "a" unchanged
    store.dump("/tmp/mem"); store.load("/tmp/mem")

Run with the SDK and a transformers importable
(PYTHONPATH=.venv/transformers/<version>:python, from the repository root).
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import io
import os
import weakref
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence

import torch

from kvcheck_adapter import cache as kv
from kvcheck_adapter import content as kc
from kvcheck_adapter import hf

BUGS = (
    "stored_to_generation",
    "single_id_returns_stored",
    "merge_uninitialized",
    "shallow_clone",
    "double_copy",
)


def unavailable_bugs() -> Dict[str, str]:
    """The bugs that cannot occur with the installed transformers, each with
    the reason."""
    if hf.HAS_INITIALIZED_FLAG:
        return {}
    if hf.LAYOUT == "legacy":
        reason = f"transformers {hf.VERSION}'s DynamicCache has no layer objects, so no initialized flag to forget"
    else:
        reason = f"transformers {hf.VERSION}'s layers have no initialized flag: a layer holding keys is initialized"
    return {"merge_uninitialized": reason}


# Entries of the account of copies handed out before the dead ones are swept.
_COPIES_SWEEP_AT = 1024

DUMP_FILE_NAME = "transformers-memory.pt"
DUMP_TAG = "kvcheck-example.transformers-memory"
DUMP_VERSION = 1
# The file: DUMP_MAGIC, the payload's length (8 bytes, big-endian), its
# SHA-256, then the payload (a torch.save archive of tuples and tensors, so
# that torch.load(weights_only=True) reads it: no cache object is pickled).
DUMP_MAGIC = b"KVCHECK-TRANSFORMERS-DUMP-1\n"
_DIGEST_BYTES = hashlib.sha256().digest_size
_HEADER_BYTES = len(DUMP_MAGIC) + 8 + _DIGEST_BYTES


class DumpError(Exception):
    """A dump could not be read: missing, truncated, corrupt or of another
    format. The message names the file and what is wrong."""


@dataclass
class MemoryItem:
    """A stored item; the store hands out the item itself for reading."""

    id: str
    cache: object
    metadata: Dict[str, str] = field(default_factory=dict)


def _as_item(item) -> MemoryItem:
    if isinstance(item, MemoryItem):
        return MemoryItem(item.id, item.cache, dict(item.metadata))
    if isinstance(item, dict):
        return MemoryItem(item["id"], item["cache"], dict(item.get("metadata") or {}))
    raise TypeError(f"add: an item is a MemoryItem or a dict with id, cache and metadata, not {type(item).__name__}")


class TransformersMemory:
    """The store. `bugs` names the historic bugs to plant (see BUGS); `model`
    is a transformers causal LM (default hf.tiny_model())."""

    def __init__(self, bugs: Iterable[str] = (), model=None):
        self.bugs = frozenset(bugs)
        unknown = sorted(self.bugs.difference(BUGS))
        if unknown:
            raise ValueError(f"unknown bug(s) {', '.join(unknown)} (known: {', '.join(BUGS)})")
        for bug, reason in unavailable_bugs().items():
            if bug in self.bugs:
                raise ValueError(f"bug {bug} cannot occur here: {reason}")
        self.model = model if model is not None else hf.tiny_model()
        self._items: Dict[str, MemoryItem] = {}  # insertion order, as kept by dict
        # The copies handed out and not stored since: id -> weak reference.
        self._copies: Dict[int, weakref.ref] = {}

    # ---- items ----

    def add(self, items: Iterable) -> None:
        """Stores each item under its id; an existing id is overwritten in
        place (it keeps its position). A stored cache is no copy handed out
        any more. Nothing is stored when an item is malformed."""
        new = [_as_item(item) for item in items]
        for item in new:
            if not isinstance(item.id, str):
                raise TypeError(f"add: an id is a string, not {type(item.id).__name__}")
            if item.cache is None:
                raise ValueError(f"add: item '{item.id}' has no cache")
            for key, value in item.metadata.items():
                if not isinstance(key, str) or not isinstance(value, str):
                    raise TypeError(f"add: item '{item.id}' metadata {key!r}: {value!r} is not a string pair")
            if kv.layout_of(item.cache) != hf.LAYOUT:
                raise TypeError(f"add: item '{item.id}' is not a {hf.LAYOUT} cache of transformers {hf.VERSION}")
        for item in new:
            self._copies.pop(id(item.cache), None)
            self._items[item.id] = item

    def get(self, item_id: str) -> Optional[MemoryItem]:
        item = self._items.get(item_id)
        return None if item is None else MemoryItem(item.id, item.cache, dict(item.metadata))

    def get_by_ids(self, ids: Sequence[str]) -> List[Optional[MemoryItem]]:
        return [self.get(item_id) for item_id in ids]

    def get_all(self) -> List[MemoryItem]:
        return [self.get(item_id) for item_id in self._items]

    def delete(self, ids: Sequence[str]) -> None:
        for item_id in ids:
            self._items.pop(item_id, None)

    def delete_all(self) -> None:
        self._items = {}

    # ---- copies ----

    def _hand_out(self, cache):
        if len(self._copies) >= _COPIES_SWEEP_AT:
            self._copies = {key: ref for key, ref in self._copies.items() if ref() is not None}
        self._copies[id(cache)] = weakref.ref(cache)
        return cache

    def handed_out(self, cache) -> bool:
        """Is `cache` a copy this store handed out (and nobody stored since)?"""
        reference = self._copies.get(id(cache))
        return reference is not None and reference() is cache

    def copy_of(self, cache):
        """A deep copy (new cache, layer objects, lists and tensors), handed
        out: the store's one way of copying a cache."""
        if "shallow_clone" not in self.bugs:
            return self._hand_out(copy.deepcopy(cache))
        twin = copy.copy(cache)
        if hf.LAYOUT == "legacy":
            twin.key_cache, twin.value_cache = list(cache.key_cache), list(cache.value_cache)
        else:
            twin.layers = [copy.copy(layer) for layer in cache.layers]
        return self._hand_out(twin)

    def merge(self, parts: Sequence) -> object:
        """The parts' layers concatenated along tokens, in order, in one copy
        per layer and side, every layer initialized (its true length); a
        layer no part fills is empty. Handed out."""
        layers = []
        for i in range(max(kv.layer_count(part) for part in parts)):
            merged = []
            for side in (kv.logical_keys, kv.logical_values):
                pieces = [t for t in (side(part, i) for part in parts) if t is not None and t.numel() > 0]
                merged.append(torch.cat(pieces, dim=-2) if pieces else kv.empty_slot(torch.float32))
            layers.append((merged[0], merged[1], "merge_uninitialized" not in self.bugs))
        return self._hand_out(hf.cache_of_layers(layers))

    def get_cache(self, ids: Sequence[str]):
        """The ids that exist and hold tokens, in request order (repeats
        kept); none -> None. One: a deep copy of its cache. Several: their
        merge. Either is handed out; stored caches are unchanged."""
        parts = [self._items[i].cache for i in ids if i in self._items and kv.holds_tokens(self._items[i].cache)]
        if not parts:
            return None
        if len(parts) == 1:
            if "single_id_returns_stored" in self.bugs:
                return self._hand_out(parts[0])
            return self.copy_of(parts[0])
        return self.merge(parts)

    # ---- generation ----

    def own_for_generation(self, cache):
        """The boundary: the cache the model may write into."""
        if cache is None:
            return hf.new_cache()
        if "stored_to_generation" in self.bugs:
            return cache
        if self.handed_out(cache) and "double_copy" not in self.bugs:
            return cache  # the path's one copy, made by get_cache
        return self.copy_of(cache)

    def generate(self, cache, prompt: Sequence[int], max_new_tokens: int) -> List[int]:
        """transformers' greedy generation on top of `cache` (None: no
        memory) through the boundary; exactly max_new_tokens tokens."""
        if len(prompt) == 0:
            raise ValueError("generate: the prompt is empty")
        if max_new_tokens < 0:
            raise ValueError("generate: max_new_tokens < 0")
        return hf.generate(self.model, prompt, self.own_for_generation(cache), max_new_tokens)

    # ---- dump and load ----

    def dump(self, directory: str) -> None:
        """Writes the whole store to <directory>/transformers-memory.pt: to a
        temporary file, fsynced, renamed over the previous dump, then the
        directory fsynced. A crash at any point leaves the previous dump
        readable; a temporary file a crash left is removed by the next dump
        or load."""
        os.makedirs(directory, exist_ok=True)
        _remove_stale_temporaries(directory)
        target = os.path.join(directory, DUMP_FILE_NAME)
        temporary = f"{target}.tmp-{os.getpid()}"
        archive = io.BytesIO()
        items = tuple(_encode_item(item) for item in self._items.values())
        torch.save((DUMP_TAG, DUMP_VERSION, hf.LAYOUT, items), archive)
        payload = archive.getvalue()
        header = DUMP_MAGIC + len(payload).to_bytes(8, "big") + hashlib.sha256(payload).digest()
        try:
            with open(temporary, "wb") as file:
                file.write(header + payload)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, target)
        except BaseException:
            if os.path.exists(temporary):
                os.remove(temporary)
            raise
        _fsync_directory(directory)

    def load(self, directory: str) -> None:
        """Replaces the store with the dump in `directory`. DumpError (naming
        the file and the fault) when it is missing, truncated, corrupt or of
        another format; the store is then unchanged."""
        if os.path.isdir(directory):
            _remove_stale_temporaries(directory)
        path = os.path.join(directory, DUMP_FILE_NAME)
        if not os.path.isfile(path):
            raise DumpError(f"cannot load dump: {path} does not exist")
        with open(path, "rb") as file:
            archive = _verified_payload(file.read(), path)
        try:
            payload = torch.load(io.BytesIO(archive), **_SAFE_LOAD_ARGUMENTS)
        except Exception as error:  # torch.load raises many kinds for a bad file
            raise DumpError(f"cannot load dump {path}: {type(error).__name__}: {error}") from None
        self._items = {item.id: item for item in _decode_payload(payload, path)}


# ---- the dump format -----------------------------------------------------------------
#
# A header (DUMP_MAGIC, the payload's length, its SHA-256) and the payload,
# a torch.save pickle of tuples, strings, booleans and tensors only:
#   (DUMP_TAG, DUMP_VERSION, layout, ((id, ((key, value), ...), layers), ...))
# where layers is ((initialized, keys, values), ...), None for an absent
# tensor; a legacy cache's layers are all initialized.

if "weights_only" not in inspect.signature(torch.load).parameters:
    raise ImportError("transformers_memory needs a torch whose torch.load takes weights_only (torch >= 1.13)")
_SAFE_LOAD_ARGUMENTS = {"weights_only": True}


def _encode_cache(cache) -> tuple:
    if hf.LAYOUT == "legacy":
        return tuple((True, k, v) for k, v in zip(cache.key_cache, cache.value_cache))
    return tuple((kc._layer_initialized(layer), layer.keys, layer.values) for layer in cache.layers)


def _encode_item(item: MemoryItem) -> tuple:
    return (item.id, tuple(sorted(item.metadata.items())), _encode_cache(item.cache))


def _check(condition: bool, path: str, fault: str) -> None:
    if not condition:
        raise DumpError(f"corrupt dump {path}: {fault}")


def _decode_slot(value, path: str, where: str) -> Optional[torch.Tensor]:
    if value is None:
        return None
    _check(isinstance(value, torch.Tensor), path, f"{where} is a {type(value).__name__}, not a tensor")
    _check(value.dtype in (torch.float32, torch.float16, torch.bfloat16), path, f"{where} has dtype {value.dtype}")
    return value


def _decode_cache(value, path: str, where: str):
    _check(isinstance(value, tuple), path, f"{where}: the layers are not a tuple")
    layers = []
    for i, layer in enumerate(value):
        _check(
            isinstance(layer, tuple) and len(layer) == 3 and isinstance(layer[0], bool),
            path,
            f"{where} layer {i} is not (initialized, keys, values)",
        )
        keys = _decode_slot(layer[1], path, f"{where} layer {i} keys")
        layers.append((keys, _decode_slot(layer[2], path, f"{where} layer {i} values"), layer[0]))
    try:
        return hf.cache_of_layers(layers)
    except hf.OutsideDomain as error:
        raise DumpError(f"corrupt dump {path}: {where}: {error}") from None


def _decode_payload(payload, path: str) -> List[MemoryItem]:
    _check(isinstance(payload, tuple) and len(payload) == 4, path, "not a (tag, version, layout, items) tuple")
    _check(payload[0] == DUMP_TAG, path, f"tag {payload[0]!r}, expected {DUMP_TAG!r}")
    _check(payload[1] == DUMP_VERSION, path, f"version {payload[1]!r}, expected {DUMP_VERSION}")
    _check(
        payload[2] == hf.LAYOUT,
        path,
        f"a dump of {payload[2]!r} caches; transformers {hf.VERSION}'s DynamicCache is {hf.LAYOUT}",
    )
    _check(isinstance(payload[3], tuple), path, "the items are not a tuple")
    items = []
    for n, entry in enumerate(payload[3]):
        _check(isinstance(entry, tuple) and len(entry) == 3, path, f"item {n} is not (id, metadata, cache)")
        item_id, metadata, cache = entry
        _check(isinstance(item_id, str), path, f"item {n} id is not a string")
        _check(
            isinstance(metadata, tuple)
            and all(isinstance(p, tuple) and len(p) == 2 and all(isinstance(s, str) for s in p) for p in metadata),
            path,
            f"item '{item_id}' metadata is not string pairs",
        )
        items.append(MemoryItem(item_id, _decode_cache(cache, path, f"item '{item_id}'"), dict(metadata)))
    return items


def _verified_payload(data: bytes, path: str) -> bytes:
    """The payload of a dump file, after checking its header, length and
    digest; DumpError naming what is wrong."""
    if not data.startswith(DUMP_MAGIC):
        shown = data[: len(DUMP_MAGIC)]
        raise DumpError(f"corrupt dump {path}: it does not start with {DUMP_MAGIC!r} (found {shown!r}): not a dump of this store")
    _check(len(data) >= _HEADER_BYTES, path, f"truncated: {len(data)} bytes, shorter than the header ({_HEADER_BYTES})")
    length = int.from_bytes(data[len(DUMP_MAGIC) : len(DUMP_MAGIC) + 8], "big")
    payload = data[_HEADER_BYTES:]
    _check(len(payload) >= length, path, f"truncated: {len(payload)} bytes of payload, the header says {length}")
    _check(len(payload) == length, path, f"{len(payload) - length} bytes after the payload the header announces")
    _check(
        hashlib.sha256(payload).digest() == data[len(DUMP_MAGIC) + 8 : _HEADER_BYTES],
        path,
        "the payload's SHA-256 differs from the one written with it (the file changed after it was written)",
    )
    return payload


def _remove_stale_temporaries(directory: str) -> None:
    """Removes the temporary files of dumps that will never finish: those
    of this process (an interrupted dump) and of processes that are gone."""
    prefix = DUMP_FILE_NAME + ".tmp-"
    for name in os.listdir(directory):
        if not name.startswith(prefix) or _writer_alive(name[len(prefix) :]):
            continue
        try:
            os.remove(os.path.join(directory, name))
        except FileNotFoundError:
            pass


def _writer_alive(pid_text: str) -> bool:
    """Is the process that named a temporary file another one still running?"""
    if not pid_text.isdigit() or int(pid_text) == os.getpid() or int(pid_text) <= 0:
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, as another user's
    return True


def _fsync_directory(directory: str) -> None:
    descriptor = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
