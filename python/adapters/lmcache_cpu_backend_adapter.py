"""kvcheck's adapter for LMCache's CPU tier: a store whose every entry is a
`MemoryObj` of LMCache 0.5.6's `LocalCPUBackend` (its hot cache: an
OrderedDict LRU of memory objects with ref and pin counts, evicting under
its allocator's byte budget), allocated by LMCache's `MixedMemoryAllocator`
(one pinned-style buffer carved by its `AddressManager`). The backend's and
the allocator's code are the wheel's, unchanged; what LMCache's import chain
reaches for other backends' sake (numba, aiohttp, zmq, ...) is a placeholder
(`_engine_env.py`, listed below).

    PYTHONPATH=.venv/engines/lmcache-0.5.6 kvcheck run --python .venv/bin/python \\
        --adapter python/adapters/lmcache_cpu_backend_adapter.py
    PYTHONPATH=.venv/engines/lmcache-0.5.6 kvcheck run --python .venv/bin/python \\
        --adapter 'python/adapters/lmcache_cpu_backend_adapter.py --capacity 3'

The mapping (python/README.md, "Real engines"), each call LMCache's own
store and retrieve paths make (`cache_engine.py`, `storage_manager.py`):

| kvcheck | LMCache 0.5.6 |
|---|---|
| add(id, cache) | `allocate(shape [2, layers, tokens, heads x head_dim], f32)` (KV_2LTD, evicting under its budget, `busy_loop=False` as a store's allocation is), the K/V copied in, `submit_put_task(key, obj)`; the caller's object becomes a view of the memory object and keeps the allocation's reference until it is dropped (a handle given by add_handle: until kvcheck releases it; with --get copy the reference is dropped at once); an overwrite first `remove(old key, force=True)` |
| get(id) | a lookup (`contains(key, pin=True)`, `touch_cache()`), then `get_blocking(key)` (a reference for the caller): the memory object itself, read through views of its buffer, held (pinned and referenced) until kvcheck releases the handle (then `unpin` while the key is still its, and `ref_count_down`) |
| get_by_ids | the lookup of each id (a use: its recency) |
| get_cache(ids) | per id, in request order, the retrieve path: lookup, `get_blocking`, the K/V copied out, `ref_count_down`, `unpin`; several ids: their merge |
| delete(ids), delete_all | `remove(key, force=True)` of each |
| listing | `get_keys()`: the hot cache's order, least recently used first |
| generate | the SDK's decoder on a copy of the cache (on the cache itself when it is a copy get_cache handed out) |

Declared (contract differences, docs/semantics.md "Real engines: declared
contract differences"), never papered over:
  - capacity: LMCache's budget is bytes of one buffer carved in units of
    its allocator's alignment. The adapter sets the alignment
    (`MixedMemoryAllocator(align_bytes=UNIT_BYTES)`, what
    `extra_config["local_cpu.pinned_align_bytes"]` sets) above the largest
    entry the declared model makes, so each entry takes exactly one unit and
    a buffer of N units holds N entries: `--capacity N` declares
    capacity_items N. (Entries of several sizes in one buffer fragment it:
    LMCache then evicts while the bytes would fit, which capacity_bytes
    cannot say.) An entry larger than a unit is refused with an error.
  - eviction "unspecified" and listing "recency": LMCache evicts the least
    recently used entry that `can_evict` (reference count 1, no pin): an
    entry a caller holds through `get` is never evicted, which kvcheck's
    `lru` (the least recently used, held or not) would require; its
    hot cache lists least recently used first, a use being a put (an
    overwrite is a new put) and a lookup's `touch_cache`.
  - a store copies: the K/V are copied into LMCache's buffer (an offload),
    so the caller's object is not kept; the store takes it (its owned
    marker cleared). No copy log (`copy_log` false): an add's copy would
    fail single-copy by construction.
  - the budget counts what callers hold: an entry removed (overwritten,
    deleted) while a caller holds it leaves the hot cache but keeps its unit
    of the buffer until the caller lets go (a reference count above 0 is
    never freed: the right thing). kvcheck's capacity counts the entries the
    store lists, so with borrows LMCache evicts while kvcheck counts room:
    eviction-as-declared FAILs with "evicted [x], but the store had room",
    a contract difference, not a finding. It never evicts an entry a caller
    holds, and never frees what a caller holds (stored-immutable passes).
  - when every entry is held by a caller, an add finds no room: LMCache's
    store path then drops the put (`allocate` returns None, the chunk is
    not stored); the adapter raises instead, an engine error of that one
    shape ("no room: every entry is held"), since kvcheck's `unspecified`
    lets a store grow past its capacity then.
  - `clear()` keeps entries in use (it removes only what `can_evict`);
    delete_all is a forced remove of every key instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import weakref

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # the SDK, when run from the source tree
sys.path.insert(0, _HERE)

os.environ.setdefault("LMCACHE_LOG_LEVEL", "ERROR")  # its warnings (evictions, a full pool) are expected here

import _engine_env  # noqa: E402

# Imported only by LMCache's other backends, servers and kernels; none is
# called by LocalCPUBackend or MixedMemoryAllocator (optional imports, which
# LMCache guards itself, nvtx and opentelemetry, stay as they are).
_engine_env.placeholders_for_missing(
    ["numba", "aiohttp", "aiofile", "requests", "transformers", "msgspec", "zmq", "cryptography"], ["lmcache"])

import torch  # noqa: E402

# Entries of a few KiB: one thread. A torch operation over LMCache's buffer
# would start torch's OpenMP pool, and a process running a second thread is
# refused by kvcheck's warm starts (the SDK's fork server).
torch.set_num_threads(1)

from lmcache.utils import CacheEngineKey  # noqa: E402
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.memory_allocators.mixed_memory_allocator import MixedMemoryAllocator  # noqa: E402
from lmcache.v1.pin_monitor import PinMonitor  # noqa: E402
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend  # noqa: E402

from kvcheck_adapter import cache as kv  # noqa: E402
from kvcheck_adapter import decoder as models  # noqa: E402
from kvcheck_adapter.adapter import Adapter, serve  # noqa: E402

from _decoder_calls import DecoderCalls  # noqa: E402

VERSION = "0.5.6"
LAYERS, HEADS, HEAD_DIM = 2, 2, 4  # the SDK decoder's geometry
# One allocation unit: above the largest cache the declared model makes (2
# layers of at most 512 tokens of 2 x 4 float32 keys and values: 64 KiB) and
# the merges of up to 4 of them a handle may store back.
UNIT_BYTES = 256 * 1024
# Without --capacity: LMCache's own alignment (4 KiB) over a buffer more than
# three times what any trace stores (at most about 130 entries of at most
# 64 KiB), so nothing is evicted; making a buffer costs about 0.1 s a trace
# per 32 MiB (LMCache's allocator touches it).
BUFFER_BYTES_UNBOUNDED = 32 * 1024 * 1024
ALIGN_BYTES_UNBOUNDED = 4096
# A pin held this long is force-unpinned by LMCache's PinMonitor thread (300 s
# by default): a wall-clock lease, which kvcheck's traces do not model; set
# beyond any run, so that nothing depends on time.
PIN_TIMEOUT_SEC = 10**9  # without --capacity: more entries than any trace stores
_object_id = id  # the operations' `id` parameters shadow it


def layer_views(memory_obj):
    """The (keys, values) of each layer as [1, heads, tokens, head_dim] views
    of a KV_2LTD memory object's buffer ([2, layers, tokens, heads x head_dim])."""
    kv_tensor = memory_obj.tensor
    tokens = kv_tensor.shape[2]
    return [
        tuple(kv_tensor[side, layer].view(tokens, HEADS, HEAD_DIM).permute(1, 0, 2).unsqueeze(0) for side in (0, 1))
        for layer in range(LAYERS)
    ]


def point_at(cache, memory_obj) -> None:
    """Makes every slot of `cache` a view of the memory object's buffer."""
    cache.layers = []
    for keys, values in layer_views(memory_obj):
        layer = kv.DynamicLayer()
        layer.keys, layer.values, layer.is_initialized = keys, values, True
        cache.layers.append(layer)
    kv.set_owned(cache, False)
    cache.memory_obj = memory_obj


def memory_storage(cache):
    """The storage of a cache viewing an LMCache memory object: the object
    (its address in LMCache's memory); None for any other cache."""
    memory_obj = getattr(cache, "memory_obj", None)
    return None if memory_obj is None else [memory_obj.data_ptr]


def cache_of(memory_obj) -> kv.DynamicCache:
    """An SDK cache whose every slot is a view of the memory object's buffer."""
    cache = kv.DynamicCache()
    point_at(cache, memory_obj)
    return cache


class LMCacheCpuBackendAdapter(DecoderCalls, Adapter):
    listing = "recency"

    def __init__(self, model, capacity=None, get="borrow"):
        self.model_ = model
        self.get_mode = get
        self.name = f"lmcache-{VERSION}-cpu" + (f"-cap{capacity}" if capacity else "") + ("-getcopy" if get == "copy" else "")
        self.description = (f"LMCache {VERSION}'s LocalCPUBackend over its MixedMemoryAllocator "
                            "(python/adapters/lmcache_cpu_backend_adapter.py)")
        if capacity is not None:
            self.capacity_items = capacity
            # LRU among the entries no caller holds: see the module doc. With
            # --get copy no caller holds any: LMCache's LRU is kvcheck's.
            self.eviction = "lru" if get == "copy" else "unspecified"
        self.model = {"layers": LAYERS, "heads": HEADS, "head_dim": HEAD_DIM, "dtypes": ["f32"],
                      "layouts": ["modern"], "odd_layers": False}
        self.capabilities = {
            "legacy_layout": False, "modern_layout": True, "conversions": False, "half_dtypes": False,
            "one_sided_layers": False, "legacy_slot_names": False, "uninitialized_layers": False,
            "generate_stream": False, "copy_log": False,
        }
        self.unit_bytes = UNIT_BYTES if capacity else ALIGN_BYTES_UNBOUNDED
        buffer_bytes = capacity * UNIT_BYTES if capacity else BUFFER_BYTES_UNBOUNDED
        config = LMCacheEngineConfig.from_defaults(
            local_cpu=True, max_local_cpu_size=buffer_bytes / 1024**3, cache_policy="LRU",
            pin_timeout_sec=PIN_TIMEOUT_SEC, pin_check_interval_sec=PIN_TIMEOUT_SEC,
            extra_config={"local_cpu.pinned_align_bytes": self.unit_bytes})
        # The process's one pin monitor, as LMCache's engine builder makes it;
        # its thread only force-unpins pins older than PIN_TIMEOUT_SEC, so it
        # is stopped: a process running a second thread is refused by
        # kvcheck's warm starts (a fork copies one thread).
        PinMonitor.GetOrCreate(config).stop_monitoring()
        self.allocator = MixedMemoryAllocator(buffer_bytes, align_bytes=self.unit_bytes)
        self.backend = LocalCPUBackend(config, memory_allocator=self.allocator)
        weakref.finalize(self, self.allocator.close)
        self.keys = {}  # id -> its key (a new chunk hash each put)
        self.ids = {}  # chunk hash -> id
        self.next_hash = 1
        self.views = {}  # chunk hash -> its stored cache (one object for every read)

    # ---- LMCache's calls ----

    def key(self, chunk_hash):
        return CacheEngineKey("kvcheck", 1, 0, chunk_hash, torch.float32)

    def lookup(self, key) -> bool:
        """A lookup as vLLM's scheduler makes it: pin on a hit, then touch."""
        hit = self.backend.contains(key, pin=True)
        self.backend.touch_cache()
        return hit

    def held(self, id):
        """The memory object of `id` (None when the hot cache has let it go)."""
        key = self.keys.get(id)
        return None if key is None else self.backend.hot_cache.get(key)

    def settle(self):
        """Forget the ids whose keys LMCache no longer holds (evicted)."""
        present = set(self.backend.hot_cache.keys())
        self.keys = {id: key for id, key in self.keys.items() if key in present}
        self.ids = {key.chunk_hash: id for id, key in self.keys.items()}
        self.views = {chunk_hash: cache for chunk_hash, cache in self.views.items() if chunk_hash in self.ids}

    # ---- the store ----

    def add(self, id, cache, metadata):
        parts = [(kv.logical_keys(cache, i), kv.logical_values(cache, i)) for i in range(kv.layer_count(cache))]
        tokens = parts[0][0].shape[2]
        shape = torch.Size([2, LAYERS, tokens, HEADS * HEAD_DIM])
        if self.capacity_items is not None and 2 * LAYERS * tokens * HEADS * HEAD_DIM * 4 > UNIT_BYTES:
            raise ValueError(f"an entry of {tokens} tokens is larger than one allocation unit ({UNIT_BYTES} bytes)")
        old = self.keys.pop(id, None)
        if old is not None:
            self.backend.remove(old, force=True)
        memory_obj = self.backend.allocate(shape, torch.float32, busy_loop=False)
        if memory_obj is None:
            self.settle()
            raise RuntimeError(f"no room for {id!r}: every entry is held (LMCache's store path drops the put)")
        for (keys, values), (key_view, value_view) in zip(parts, layer_views(memory_obj)):
            key_view.copy_(keys)
            value_view.copy_(values)
        key = self.key(self.next_hash)
        self.next_hash += 1
        self.backend.submit_put_task(key, memory_obj)
        if self.get_mode == "copy":
            memory_obj.ref_count_down()  # the allocation's reference: the hot cache holds its own
            kv.set_owned(cache, False)  # the store took the caller's object
        else:
            # The caller keeps its allocation's reference while it holds the
            # object it stored, which becomes the stored memory object (as
            # kvcheck's add_handle means: the handle points at the stored item).
            self.lend(cache, key, memory_obj, pinned=False)
        self.keys[id] = key
        self.settle()

    def lend(self, cache, key, memory_obj, pinned):
        """`cache` becomes a view of `memory_obj`, holding one reference (and
        one pin, when `pinned`) until it is dropped (kvcheck's release); a
        borrow it held before ends first."""
        ending = getattr(cache, "borrow", None)
        if ending is not None:
            ending()
        point_at(cache, memory_obj)
        cache.borrow = weakref.finalize(cache, self.give_back, key, memory_obj, pinned)

    def get(self, id):
        key = self.keys.get(id)
        if key is None or not self.lookup(key):
            return None
        if self.get_mode == "copy":
            copied = self.retrieve(key)
            kv.set_owned(copied, False)  # the stored item as it was read, not a copy the caller may write into
            return copied
        borrowed = kv.DynamicCache()
        self.lend(borrowed, key, self.backend.get_blocking(key), pinned=True)
        return borrowed

    def give_back(self, key, memory_obj, pinned):
        """The end of a borrow: its pin (while the key is still the object's:
        a forced remove released it) and its reference."""
        if pinned and self.backend.hot_cache.get(key) is memory_obj and memory_obj.is_pinned:
            self.backend.unpin(key)
        memory_obj.ref_count_down()

    def get_by_ids(self, ids):
        found = []
        for id in ids:
            key = self.keys.get(id)
            if key is not None and self.lookup(key):
                self.backend.unpin(key)  # a lookup that retrieves nothing
                found.append(id)
            else:
                found.append(None)
        return found

    def get_all_ids(self):
        return [self.ids[key.chunk_hash] for key in self.backend.get_keys()]

    def retrieve(self, key):
        """LMCache's retrieve of one chunk: the K/V copied out of its buffer."""
        memory_obj = self.backend.get_blocking(key)
        try:
            return kv.clone(cache_of(memory_obj))
        finally:
            memory_obj.ref_count_down()
            self.backend.unpin(key)

    def get_cache(self, ids):
        parts = []
        for id in ids:
            key = self.keys.get(id)
            if key is not None and self.lookup(key):
                parts.append(self.retrieve(key))
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else kv.concat(parts)

    def delete(self, ids):
        for id in ids:
            key = self.keys.pop(id, None)
            if key is not None:
                self.backend.remove(key, force=True)
        self.settle()

    def delete_all(self):
        self.delete(list(self.keys))

    def stored_cache(self, id):
        memory_obj = self.held(id)
        if memory_obj is None:
            raise KeyError(id)
        chunk_hash = self.keys[id].chunk_hash
        cache = self.views.get(chunk_hash)
        if cache is None:
            cache = self.views[chunk_hash] = cache_of(memory_obj)
        return cache

    def stored_ids(self):
        return self.get_all_ids()

    def storage(self, cache):
        """A cache in LMCache's buffer is made of its memory object (its
        address in the buffer); any other of its own tensors' storages."""
        return memory_storage(cache) or super().storage(cache)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity", type=int, default=None, metavar="N",
                        help="a buffer of N allocation units: N entries, declared capacity_items N")
    parser.add_argument("--get", choices=("borrow", "copy"), default="borrow",
                        help="get holds the memory object until the handle is released (borrow: eviction "
                             "declared unspecified), or copies it out as a retrieve does (copy: eviction lru)")
    arguments = parser.parse_args(argv)
    if arguments.capacity is not None and arguments.capacity < 1:
        parser.error(f"--capacity is {arguments.capacity}: a positive number of entries")
    model = models.Decoder()
    serve(lambda: LMCacheCpuBackendAdapter(model, arguments.capacity, arguments.get))


if __name__ == "__main__":
    main()
