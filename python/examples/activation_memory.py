"""An activation-memory store, transformers style: the kind of Python engine
kvcheck exists to check.

It keeps items {id, cache, metadata}, where a cache is a KV cache of either
layout (kvcheck_adapter.cache stands in for transformers' DynamicCache), and
hands caches to a model (kvcheck_adapter.decoder stands in for
`model.generate(past_key_values=...)`). It knows nothing of kvcheck: the
adapter that exposes it to kvcheck is separate glue.

Ownership, the point of the exercise: a stored cache is read-only by
construction. Whatever leaves the store is either the stored item itself
(get, get_by_ids, get_all: read access) or an owned copy (get_cache: a
clone, or a merge whose every layer is initialized). The generation
boundary clones the incoming cache exactly once, unless it is already an
owned copy, which the model may write into as it is. So
generate(get_cache(ids)) copies the stored K/V once, and the K/V sets alive
during a generation are two, never three.

The historic bugs are switchable by name (ActivationMemory(bugs=[...])):
  stored_to_generation      generate hands the incoming cache to the model
                            without cloning (the original aliasing bug);
  single_id_returns_stored  get_cache of one id returns the stored object;
  merge_uninitialized       merged layers are not marked initialized (the
                            merge reports length 0, the model drops it);
  shallow_clone             a clone copies the cache and layer objects but
                            shares their tensors;
  double_copy               generate clones even an owned copy (get_cache
                            clones, then generation clones again).
Bugs of the caches the model makes (generate_returning, extract; kvcheck's
mutants M30-M32):
  turn_drops_last_token     the cache a generation hands back lost its
                            last token (every slot cut by one);
  stored_turn_stays_writable
                            the store keeps each cache it handed back as a
                            chat session's: a generation from it writes into
                            it, even once the caller stored it;
  extract_keeps_working_cache
                            extract keeps the model's working cache as the
                            session's: the next generation from no cache
                            continues in the stored memory.
A bounded store (ActivationMemory(capacity=N)): at most N items, the least
recently used evicted to make room (a use: add, get, get_by_ids,
get_cache); its adapter declares so (capacity_items, eviction "lru"), and
kvcheck's eviction-as-declared holds it to it. The bug of that policy:
  evicts_most_recent        a full store evicts the most recently used
                            item instead (needs a capacity).
The bug of the dump format (over the process boundary, what the durability
tests' RepairsCrcs is in process):
  skips_digest              load reads the payload without checking the
                            header or the SHA-256 (torch.load checks no
                            CRC): a flipped byte of tensor data loads as
                            another value.

    store = ActivationMemory()
    store.add([{"id": "a", "cache": cache, "metadata": {"source": "doc1"}}])
    tokens = store.generate(store.get_cache(["a"]), [7, 3], 8)   # "a" unchanged
    tokens, turn = store.generate_returning(None, [7, 3], 8)     # a chat's first turn
    more, turn = store.generate_returning(turn, [5], 8)           # its second, in the same cache
    store.add([{"id": "chat", "cache": turn}])                   # stored: read-only from now on
    store.extract("memo", [4, 2, 9])                              # a memory the model makes
    store.dump("/tmp/mem"); store.load("/tmp/mem")

Run with the SDK importable (PYTHONPATH=python, from the repository root).
"""

from __future__ import annotations

import hashlib
import contextlib
import inspect
import io
import os
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, List, Optional, Sequence

import torch

from kvcheck_adapter import cache as kv
from kvcheck_adapter import decoder as models
from kvcheck_adapter import threads

BUGS = (
    "stored_to_generation",
    "single_id_returns_stored",
    "merge_uninitialized",
    "shallow_clone",
    "double_copy",
    "turn_drops_last_token",
    "stored_turn_stays_writable",
    "extract_keeps_working_cache",
    "evicts_most_recent",
    "skips_digest",
    "unlocked_index",
)

# The property of kvcheck's that names each bug (docs/semantics.md#known-bugs:
# M1, M2, M7, M9, M3): what catches it, as the example's tests check.
BUG_PROPERTIES = {
    "stored_to_generation": "stored-immutable",
    "single_id_returns_stored": "stored-immutable",
    "merge_uninitialized": "merge-correct",
    "shallow_clone": "clone-independent",
    "double_copy": "single-copy",
}

# The bugs of the caches the model makes (M30, M31, M32) and the property
# that catches each over the process boundary.
RETURNED_BUG_PROPERTIES = {
    "turn_drops_last_token": "generation-equivalent",
    "stored_turn_stays_writable": "stored-immutable",
    "extract_keeps_working_cache": "stored-immutable",
}

# The bug of a bounded store and the property that catches it over the
# process boundary (the adapter run with --capacity).
CAPACITY_BUG_PROPERTIES = {
    "evicts_most_recent": "eviction-as-declared",
}

# The bug of the dump format and the property that catches it: on every
# trace that flips a byte of tensor data (docs/semantics.md#durability).
DUMP_BUG_PROPERTIES = {
    "skips_digest": "dump-safe",
}

# The bug of a store used by several clients at once (the adapter declares
# thread_safe): its index updated without the lock. It loses an entry only
# with two requests in flight (adapter_tests/test_threads.py, under the
# SDK's scheduler), never with one client; kvcheck's thread level judges
# the paged family only (the example block manager's unlocked_free is
# found there), so `kvcheck run` does not find it yet
# (docs/semantics.md#the-thread-level).
THREAD_BUG_PROPERTIES = {
    "unlocked_index": "linearizable",
}

DUMP_FILE_NAME = "activation-memory.pt"
DUMP_TAG = "kvcheck-example.activation-memory"
DUMP_VERSION = 2
# The file: DUMP_MAGIC, the payload's length (8 bytes, big-endian), its
# SHA-256, then the payload (a torch.save archive). torch.load does not
# check the archive's CRCs (torch 1.13), so a flipped byte in tensor data
# would load as other values: the digest is what refuses it.
DUMP_MAGIC = b"KVCHECK-EXAMPLE-DUMP-2\n"
_DIGEST_BYTES = hashlib.sha256().digest_size
_HEADER_BYTES = len(DUMP_MAGIC) + 8 + _DIGEST_BYTES
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class DumpError(Exception):
    """A dump could not be read: missing, truncated, corrupt or of another
    format. The message names the file and what is wrong."""


@dataclass
class MemoryItem:
    """A stored item. The store hands out the item itself for reading: its
    cache must not be written into (generate clones it first)."""

    id: str
    cache: object
    metadata: Dict[str, str] = field(default_factory=dict)


def _as_item(item) -> MemoryItem:
    if isinstance(item, MemoryItem):
        return MemoryItem(item.id, item.cache, dict(item.metadata))
    if isinstance(item, dict):
        return MemoryItem(item["id"], item["cache"], dict(item.get("metadata") or {}))
    raise TypeError(f"add: an item is a MemoryItem or a dict with id, cache and metadata, not {type(item).__name__}")


class ActivationMemory:
    """The store. `bugs` names the historic bugs to plant (see BUGS)."""

    def __init__(self, bugs: Iterable[str] = (), model: Optional[models.Decoder] = None,
                 capacity: Optional[int] = None):
        self.bugs = frozenset(bugs)
        unknown = sorted(self.bugs.difference(BUGS))
        if unknown:
            raise ValueError(f"unknown bug(s) {', '.join(unknown)} (known: {', '.join(BUGS)})")
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity {capacity}: at least 1, or None for no bound")
        if "evicts_most_recent" in self.bugs and capacity is None:
            raise ValueError("the bug evicts_most_recent needs a capacity (a bounded store)")
        self.model = model if model is not None else models.Decoder()
        self.capacity = capacity
        # The index: replaced whole, never edited in place (_update_index),
        # so that a read takes it as it is without the lock.
        self._items: Dict[str, MemoryItem] = {}  # insertion order, as kept by dict
        self._recency: Dict[str, None] = {}  # least recently used first (with a capacity)
        # Serializes the index's updates: the store is used by several
        # clients at once (its adapter declares thread_safe). A
        # kvcheck_adapter Lock: a plain lock, that kvcheck's schedule sees.
        self._lock = threads.Lock()
        # The planted bugs' chat sessions: caches handed back by
        # generate_returning (stored_turn_stays_writable), the cache extract
        # made (extract_keeps_working_cache).
        self._sessions: List[object] = []
        self._extracted: Optional[object] = None

    # ---- items ----

    def add(self, items: Iterable) -> None:
        """Stores each item under its id; an existing id is overwritten in
        place (it keeps its position). A stored cache is never an owned copy:
        the marker is cleared. Metadata is a map of strings. Nothing is
        stored when an item is malformed (TypeError or ValueError naming it)."""
        new = [_as_item(item) for item in items]
        for item in new:
            if not isinstance(item.id, str):
                raise TypeError(f"add: an id is a string, not {type(item.id).__name__}")
            if item.cache is None:
                raise ValueError(f"add: item '{item.id}' has no cache")
            for key, value in item.metadata.items():
                if not isinstance(key, str) or not isinstance(value, str):
                    raise TypeError(f"add: item '{item.id}' metadata {key!r}: {value!r} is not a string pair")
            kv.layout_of(item.cache)  # a KV cache of either layout, or TypeError
        for item in new:
            kv.set_owned(item.cache, False)

        def store(items: Dict[str, MemoryItem], recency: Dict[str, None]) -> None:
            for item in new:
                if self.capacity is not None and item.id not in items and len(items) >= self.capacity:
                    self._evict(items, recency)
                items[item.id] = item
                recency.pop(item.id, None)
                recency[item.id] = None

        self._update_index(store)

    def _update_index(self, change) -> None:
        """`change(items, recency)` applied to copies of the index, then put
        in its place, under the lock. Between the copy and the put another
        client may run (a yield point of kvcheck's schedule): without the
        lock (the bug unlocked_index) two updates both copy the old index
        and the later put loses the earlier one's change."""
        with contextlib.nullcontext() if "unlocked_index" in self.bugs else self._lock:
            items, recency = dict(self._items), dict(self._recency)
            change(items, recency)
            threads.yield_point("index")
            self._items, self._recency = items, recency

    def _use(self, item_id: str) -> None:
        if self.capacity is None:
            return  # recency decides only what a bounded store evicts

        def use(items: Dict[str, MemoryItem], recency: Dict[str, None]) -> None:
            if item_id in items:
                recency.pop(item_id, None)
                recency[item_id] = None

        self._update_index(use)

    def _evict(self, items: Dict[str, MemoryItem], recency: Dict[str, None]) -> None:
        """Makes room for one item: the least recently used goes (the
        cache anyone holds of it stays theirs)."""
        order = list(recency)
        victim = order[-1] if "evicts_most_recent" in self.bugs else order[0]
        del items[victim]
        del recency[victim]

    # Reads hand out a record of the stored item: its cache is the stored
    # object itself (read-only by contract: generate clones it), its
    # metadata a copy, so that editing it changes nothing stored. Each is a
    # use of the item (its recency); peek reads without using.

    def peek(self, item_id: str) -> Optional[MemoryItem]:
        item = self._items.get(item_id)
        return None if item is None else MemoryItem(item.id, item.cache, dict(item.metadata))

    def get(self, item_id: str) -> Optional[MemoryItem]:
        self._use(item_id)
        return self.peek(item_id)

    def get_by_ids(self, ids: Sequence[str]) -> List[Optional[MemoryItem]]:
        return [self.get(item_id) for item_id in ids]

    def get_all(self) -> List[MemoryItem]:
        return [self.peek(item_id) for item_id in self._items]

    def ids(self) -> List[str]:
        """The stored ids, in insertion order: a listing, not a read (no
        use, no record made per item)."""
        return list(self._items)

    def delete(self, ids: Sequence[str]) -> None:
        def remove(items: Dict[str, MemoryItem], recency: Dict[str, None]) -> None:
            for item_id in ids:
                items.pop(item_id, None)
                recency.pop(item_id, None)

        self._update_index(remove)

    def delete_all(self) -> None:
        def clear(items: Dict[str, MemoryItem], recency: Dict[str, None]) -> None:
            items.clear()
            recency.clear()

        self._update_index(clear)

    # ---- caches ----

    def _clone(self, cache):
        if "shallow_clone" not in self.bugs:
            return kv.clone(cache)
        copy = kv.clone(cache)  # the structure, then the source's tensors put back
        if kv.layout_of(cache) == "legacy":
            copy.key_cache, copy.value_cache = list(cache.key_cache), list(cache.value_cache)
        else:
            for source, twin in zip(cache.layers, copy.layers):
                for name in ("keys", "values", "key_cache", "value_cache"):
                    setattr(twin, name, getattr(source, name, None))
        return copy

    def _merge(self, parts: Sequence):
        """The parts concatenated along tokens: a new owned cache, every
        layer initialized (kv.concat)."""
        return kv.concat(parts)

    def get_cache(self, ids: Sequence[str]):
        """The ids that exist and hold tokens, in request order (repeats
        kept); none -> None. One: an owned clone of its cache. Several: an
        owned merge, every layer initialized. Stored caches are unchanged."""
        parts = [self._items[i].cache for i in ids if i in self._items and kv.holds_tokens(self._items[i].cache)]
        for item_id in ids:
            self._use(item_id)
        if not parts:
            return None
        if len(parts) == 1:
            if "single_id_returns_stored" in self.bugs:
                return parts[0]
            return self._clone(parts[0])
        merged = self._merge(parts)
        if "merge_uninitialized" in self.bugs:
            for layer in getattr(merged, "layers", []):
                layer.is_initialized = False
        return merged

    # ---- generation ----

    def _own_for_generation(self, cache):
        if cache is None:
            if self._extracted is not None:
                return self._extracted  # extract_keeps_working_cache
            fresh = kv.DynamicCache()
            kv.set_owned(fresh, True)  # the caller's when it is handed back (generate_returning)
            return fresh
        if "stored_to_generation" in self.bugs:
            return cache
        if any(session is cache for session in self._sessions):
            return cache  # stored_turn_stays_writable: the session's, stored or not
        if kv.is_owned(cache) and "double_copy" not in self.bugs:
            return cache  # the one copy of this generation: the model may write into it
        return self._clone(cache)

    def generate_stream(self, cache, prompt: Sequence[int], max_new_tokens: int) -> Iterator[int]:
        """Greedy generation on top of `cache` (None: no memory), yielding
        each token: the boundary, then prefill and decoding, to EOS or the
        limit. A cache that is not an owned copy is cloned first."""
        if len(prompt) == 0:
            raise ValueError("generate: the prompt is empty")
        if max_new_tokens < 0:
            raise ValueError("generate: max_new_tokens < 0")
        working = self._own_for_generation(cache)
        return models.generate_stream(self.model, prompt, working, max_new_tokens)

    def generate(self, cache, prompt: Sequence[int], max_new_tokens: int) -> List[int]:
        return list(self.generate_stream(cache, prompt, max_new_tokens))

    # ---- caches the model makes ----

    def generate_returning(self, cache, prompt: Sequence[int], max_new_tokens: int):
        """generate, and the cache the model wrote into: (tokens, cache).
        The cache holds `cache`'s K/V, then those of the prompt and of every
        generated token but the last (transformers' past_key_values after
        generate); the caller owns it (an owned copy: generating from it
        again continues the chat without a copy; storing it makes it a
        read-only item like any other)."""
        if len(prompt) == 0:
            raise ValueError("generate: the prompt is empty")
        if max_new_tokens < 0:
            raise ValueError("generate: max_new_tokens < 0")
        working = self._own_for_generation(cache)
        tokens = list(models.generate_stream(self.model, prompt, working, max_new_tokens))
        if "turn_drops_last_token" in self.bugs:
            _drop_last_token(working)
        if "stored_turn_stays_writable" in self.bugs:
            self._sessions.append(working)
        return tokens, working

    def extract(self, item_id: str, prompt: Sequence[int], metadata: Optional[Dict[str, str]] = None) -> None:
        """Stores under `item_id` the memory the model makes of `prompt`: its
        prefill on a fresh cache, stored as add stores (read-only)."""
        if len(prompt) == 0:
            raise ValueError("extract: the prompt is empty")
        memory = kv.DynamicCache()
        self.model.forward(list(prompt), memory)
        self.add([{"id": item_id, "cache": memory, "metadata": dict(metadata or {})}])
        if "extract_keeps_working_cache" in self.bugs:
            self._extracted = memory

    # ---- dump and load ----

    def dump(self, directory: str) -> None:
        """Writes the whole store to <directory>/activation-memory.pt: to a
        temporary file, fsynced, renamed over the previous dump, then the
        directory fsynced. A crash at any point leaves the previous dump
        readable; a temporary file a crash left is removed by the next dump
        or load."""
        os.makedirs(directory, exist_ok=True)
        _remove_stale_temporaries(directory)
        target = os.path.join(directory, DUMP_FILE_NAME)
        temporary = f"{target}.tmp-{os.getpid()}"
        archive = io.BytesIO()
        torch.save((DUMP_TAG, DUMP_VERSION, tuple(_encode_item(item) for item in self._items.values())), archive)
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
        if not _SAFE_LOAD:
            raise DumpError(f"cannot load dump {path}: torch {torch.__version__} has no safe loader (weights_only)")
        with open(path, "rb") as file:
            data = file.read()
        archive = data[_HEADER_BYTES:] if "skips_digest" in self.bugs else _verified_payload(data, path)
        try:
            payload = torch.load(io.BytesIO(archive), weights_only=True)
        except Exception as error:  # torch.load raises many kinds for a bad file
            raise DumpError(f"cannot load dump {path}: {type(error).__name__}: {error}") from None
        items = _decode_payload(payload, path)
        loaded: Dict[str, MemoryItem] = {}
        for item in items:
            loaded[item.id] = item
        self._items = loaded
        self._recency = dict.fromkeys(loaded)  # used in the dump's order


def _drop_last_token(cache) -> None:
    """turn_drops_last_token: every slot of `cache` cut by its last token."""
    def cut(t):
        return t[:, :, :-1, :] if t is not None and t.dim() == 4 and t.shape[2] > 0 else t

    if kv.layout_of(cache) == "legacy":
        cache.key_cache = [cut(t) for t in cache.key_cache]
        cache.value_cache = [cut(t) for t in cache.value_cache]
        return
    for layer in cache.layers:
        for name in ("keys", "values", "key_cache", "value_cache"):
            if getattr(layer, name, None) is not None:
                setattr(layer, name, cut(getattr(layer, name)))


# ---- the dump format -----------------------------------------------------------------
#
# The file is a header (DUMP_MAGIC, the payload's length, its SHA-256) and
# the payload, a torch.save pickle of tuples only (lists and dicts of one element do not
# load in C++'s torch::pickle_load, and tuples keep the format one shape):
#   (DUMP_TAG, DUMP_VERSION, ((id, ((key, value), ...), cache), ...))
# where a cache is ("modern", ((initialized, keys, values, key_cache,
# value_cache), ...)) with None for an absent slot, or
# ("legacy", (key, ...), (value, ...)).


def _encode_cache(cache) -> tuple:
    if kv.layout_of(cache) == "legacy":
        return ("legacy", tuple(cache.key_cache), tuple(cache.value_cache))
    return (
        "modern",
        tuple(
            (
                bool(layer.is_initialized),
                getattr(layer, "keys", None),
                getattr(layer, "values", None),
                getattr(layer, "key_cache", None),
                getattr(layer, "value_cache", None),
            )
            for layer in cache.layers
        ),
    )


def _encode_item(item: MemoryItem) -> tuple:
    return (item.id, tuple(sorted(item.metadata.items())), _encode_cache(item.cache))


# weights_only (torch >= 1.13) unpickles tensors and plain containers only.
# An older torch has no safe loader: the store refuses to load rather than
# unpickle whatever a dump names.
_SAFE_LOAD = "weights_only" in inspect.signature(torch.load).parameters


def _check(condition: bool, path: str, fault: str) -> None:
    if not condition:
        raise DumpError(f"corrupt dump {path}: {fault}")


def _decode_slot(value, path: str, where: str) -> Optional[torch.Tensor]:
    if value is None:
        return None
    _check(isinstance(value, torch.Tensor), path, f"{where} is a {type(value).__name__}, not a tensor")
    _check(value.dtype in _FLOAT_DTYPES, path, f"{where} has dtype {value.dtype}")
    return value


def _decode_cache(value, path: str, where: str):
    _check(isinstance(value, tuple) and len(value) >= 1, path, f"{where} is not a cache tuple")
    if value[0] == "legacy":
        _check(len(value) == 3 and isinstance(value[1], tuple) and isinstance(value[2], tuple), path, f"{where}: bad legacy cache")
        _check(len(value[1]) == len(value[2]), path, f"{where}: {len(value[1])} keys but {len(value[2])} values")
        cache = kv.LegacyDynamicCache()
        for i, (k, v) in enumerate(zip(value[1], value[2])):
            cache.key_cache.append(_decode_slot(k, path, f"{where} layer {i} keys"))
            cache.value_cache.append(_decode_slot(v, path, f"{where} layer {i} values"))
        return cache
    _check(value[0] == "modern" and len(value) == 2 and isinstance(value[1], tuple), path, f"{where}: bad cache layout")
    cache = kv.DynamicCache()
    for i, layer_value in enumerate(value[1]):
        _check(
            isinstance(layer_value, tuple) and len(layer_value) == 5 and isinstance(layer_value[0], bool),
            path,
            f"{where} layer {i} is not (initialized, keys, values, key_cache, value_cache)",
        )
        layer = kv.DynamicLayer()
        layer.is_initialized = layer_value[0]
        for name, slot in zip(("keys", "values", "key_cache", "value_cache"), layer_value[1:]):
            setattr(layer, name, _decode_slot(slot, path, f"{where} layer {i} {name}"))
        cache.layers.append(layer)
    return cache


def _decode_payload(payload, path: str) -> List[MemoryItem]:
    _check(isinstance(payload, tuple) and len(payload) == 3, path, "not a (tag, version, items) tuple")
    _check(payload[0] == DUMP_TAG, path, f"tag {payload[0]!r}, expected {DUMP_TAG!r}")
    _check(payload[1] == DUMP_VERSION, path, f"version {payload[1]!r}, expected {DUMP_VERSION}")
    _check(isinstance(payload[2], tuple), path, "the items are not a tuple")
    items = []
    for n, entry in enumerate(payload[2]):
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
    expected = data[len(DUMP_MAGIC) + 8 : _HEADER_BYTES]
    _check(
        hashlib.sha256(payload).digest() == expected,
        path,
        "the payload's SHA-256 differs from the one written with it (the file changed after it was written)",
    )
    return payload


def _remove_stale_temporaries(directory: str) -> None:
    """Removes the temporary files of dumps that will never finish: those
    of this process (an interrupted dump) and of processes that are gone.
    A temporary file of another running process is its dump in progress."""
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
