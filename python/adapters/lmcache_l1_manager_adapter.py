"""kvcheck's adapter for LMCache's multi-process L1 tier: a store whose every
entry is a resident object of LMCache 0.5.6's `L1Manager`
(lmcache/v1/distributed/l1_manager.py: objects written through a staging
reservation, read under read locks that lapse after a TTL, deleted only
when no read lock is live), over its own `L1MemoryManager` on the CPU. The
manager's code is the wheel's, unchanged, with one substitution: its read
and write locks (`TTLLock`, a C++ extension reading the machine's steady
clock) are `VirtualTTLLock`s reading kvcheck's virtual clock (below).

    PYTHONPATH=.venv/engines/lmcache-0.5.6 kvcheck run --python .venv/bin/python \\
        --adapter python/adapters/lmcache_l1_manager_adapter.py

The mapping (docs/semantics.md "Leases"), each call the one LMCache's
storage controllers make:

| kvcheck | LMCache 0.5.6 L1Manager |
|---|---|
| add(id, cache) | an id already resident is deleted first (`delete([key])`, no force: a read-locked key answers KEY_IS_LOCKED and the add raises, storing nothing); then `reserve_write([key], [False], layout)` (KV_2LTD: [2, layers, tokens, heads x head_dim], f32), the K/V copied into the staged memory object, `finish_write([key])` |
| get(id), get_cache(ids) | the retrieve path: `reserve_read([key])`, the K/V copied out, `finish_read([key])` |
| lease(id) | `reserve_read([key])`: KEY_NOT_EXIST raises |
| unlease(id) | `finish_read([key])`: KEY_IN_WRONG_STATE (no live read lock: none, or expired) and KEY_NOT_EXIST raise |
| tick ms=N | the virtual clock every lock reads moves N ms |
| delete(ids), delete_all | `is_key_evictable(key)` of each resident id first (a read-locked one: the whole delete raises, nothing deleted), then `delete(keys)` (no force) |
| listing | `get_object_state(key)` of each id stored (declared unordered) |
| after every add and delete | `memcheck()`: LMCache's own allocator oracle; False raises |

The clock (docs/semantics.md "Leases", how a verdict stays independent of
load): LMCache's `TTLLock` (lmcache_native) stamps each lock with the
machine's steady clock and compares it on every `is_locked()`; its clock
cannot be set from Python. The adapter replaces the name `TTLLock` in the
`l1_manager` module (the only place L1Manager makes its locks) with
`VirtualTTLLock`, which implements the native class's documented contract
(lmcache_native.pyi: `lock()` adds one and moves the expiry to now + TTL,
starting again at 1 when the previous TTL had expired; `unlock()` takes one
off, never below 0; `is_locked()` is count > 0 and TTL not expired;
`reset()`) on the virtual clock, in milliseconds. The expiry instant is the native
one: csrc's ttl_lock.cpp holds a lock while `counter > 0 && now <
expiration` (its clock in ms; quoted in LMCache PR #4609's review, and
the reset to 1 in issue #5263), so a lock taken at t with a TTL of T
seconds is held at t + 1000 T - 1 ms and no longer at t + 1000 T, as
kvcheck's semantics say (the native source is not in the wheel: the
instant could not be observed on it). L1Manager's state machine, its
error codes and its memory manager are LMCache's own.

Declared (contract differences, docs/semantics.md "Real engines: declared
contract differences"), never papered over:
  - read_ttl_seconds = 1 (`--read-ttl-seconds`): lease_ttl_ms 1000.
  - an overwrite: L1Manager never overwrites a resident key
    (`reserve_write` answers KEY_NOT_WRITABLE); kvcheck's add replaces, so
    the adapter deletes the key first, as a store controller evicting it
    would, and the entry goes last in `_objects`: listing "unordered".
  - several ids in one delete: L1Manager answers per key (the unlocked
    ones are deleted, the locked ones answer KEY_IS_LOCKED); kvcheck's
    delete is refused whole, so the adapter asks `is_key_evictable` of each
    first and deletes nothing when one is read-locked.
  - a store copies: the K/V are copied into LMCache's memory object (an
    offload), so the caller's object is not kept (its owned marker
    cleared); no copy log (`copy_log` false).
  - a capacity of 4 entries, eviction "lrs" (`--capacity-items`; 0: none
    declared, nothing evicted). L1Manager does not evict by itself: a
    write past its pool answers OUT_OF_MEMORY, and LMCache's
    `L1EvictionController` thread wakes every second of the wall clock and,
    when the pool's usage is at or above a watermark, deletes a fraction of
    the keys its policy tracks. The adapter makes that controller (LRU
    policy, registered on the manager as LMCache does) but never starts its
    thread: when an add of a new id finds the store holding its capacity,
    it runs the loop's eviction pass itself, unchanged but for the trigger
    and the fraction (`get_eviction_actions` with `is_key_evictable` as the
    filter, each action through `execute_eviction_action`, a fraction small
    enough to name one key: the least recently used key not locked). When
    the pass evicts nothing (every key read-locked) the add raises, storing
    nothing, as the allocator's OUT_OF_MEMORY would at a full pool. The
    LRU policy is told of writes (`reserve_write`, `finish_write`) and
    deletes only: a read (`reserve_read`) is no use (recency comes from
    `touch_keys`, which the retrieve path of a store controller calls and
    this adapter does not), so the order is the least recently stored's.
  - write leases (reserve_write/finish_write: a staged object invisible
    until finished, a finish after its write TTL answering
    KEY_IN_WRONG_STATE) are used by every add but not judged: kvcheck's
    vocabulary has read leases only (docs/semantics.md "Leases").
"""

from __future__ import annotations

import argparse
import os
import sys
import weakref

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # the SDK, when run from the source tree
sys.path.insert(0, _HERE)

# The CPU backend's adapter sets up LMCache's import chain (its placeholders,
# one torch thread) and knows the KV_2LTD buffer's views.
from lmcache_cpu_backend_adapter import (  # noqa: E402
    HEAD_DIM, HEADS, LAYERS, VERSION, cache_of, layer_views, memory_storage)

import torch  # noqa: E402
from lmcache.v1.distributed import l1_manager as lmcache_l1  # noqa: E402
from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey  # noqa: E402
from lmcache.v1.distributed.config import EvictionConfig, L1ManagerConfig, L1MemoryManagerConfig  # noqa: E402
from lmcache.v1.distributed.error import L1Error  # noqa: E402
from lmcache.v1.distributed.storage_controllers.eviction_controller import L1EvictionController  # noqa: E402

from kvcheck_adapter import cache as kv  # noqa: E402
from kvcheck_adapter import decoder as models  # noqa: E402
from kvcheck_adapter.adapter import Adapter, serve  # noqa: E402

from _decoder_calls import DecoderCalls  # noqa: E402

POOL_BYTES = 32 * 1024 * 1024  # more than any trace stores: nothing runs out of memory
# get_eviction_actions names at least one key for any fraction above 0, and
# int(keys x fraction) keys: this one names one key in any store kvcheck fills.
ONE_KEY_FRACTION = 1e-9


class VirtualClock:
    """kvcheck's clock, in ms: moved only by the adapter's advance_clock."""

    def __init__(self):
        self.now_ms = 0


class VirtualTTLLock:
    """lmcache_native.TTLLock's documented contract on kvcheck's clock."""

    clock = VirtualClock()  # the adapter's (one adapter per process)

    def __init__(self, ttl_second: int = 300):
        self.ttl_ms = 1000 * int(ttl_second)
        self.count = 0
        self.until_ms = 0

    def _live(self):
        return self.clock.now_ms < self.until_ms

    def lock(self):
        self.count = self.count + 1 if self._live() else 1
        self.until_ms = self.clock.now_ms + self.ttl_ms

    def unlock(self):
        self.count = max(0, self.count - 1)

    def is_locked(self):
        return self.count > 0 and self._live()

    def reset(self):
        self.count = 0
        self.until_ms = 0


lmcache_l1.TTLLock = VirtualTTLLock


class LMCacheL1ManagerAdapter(DecoderCalls, Adapter):
    listing = "unordered"

    def __init__(self, model, read_ttl_seconds=1, capacity_items=4):
        self.model_ = model
        self.name = f"lmcache-{VERSION}-l1"
        self.description = (f"LMCache {VERSION}'s L1Manager (read leases of {read_ttl_seconds} s on kvcheck's clock) "
                            "(python/adapters/lmcache_l1_manager_adapter.py)")
        self.lease_ttl_ms = 1000 * read_ttl_seconds
        self.model = {"layers": LAYERS, "heads": HEADS, "head_dim": HEAD_DIM, "dtypes": ["f32"],
                      "layouts": ["modern"], "odd_layers": False}
        self.capabilities = {
            "legacy_layout": False, "modern_layout": True, "conversions": False, "half_dtypes": False,
            "one_sided_layers": False, "legacy_slot_names": False, "uninitialized_layers": False,
            "generate_stream": False, "copy_log": False,
        }
        VirtualTTLLock.clock = VirtualClock()  # a new adapter's clock starts at 0
        config = L1ManagerConfig(
            memory_config=L1MemoryManagerConfig(size_in_bytes=POOL_BYTES, use_lazy=False, shm_name=""),
            read_ttl_seconds=read_ttl_seconds)
        self.manager = lmcache_l1.L1Manager(config)
        if capacity_items > 0:
            self.capacity_items = capacity_items
            self.eviction = "lrs"
            # Its thread never started: evict_for_a_new_key runs its pass.
            self.evictions = L1EvictionController(self.manager, EvictionConfig(
                eviction_policy="LRU", trigger_watermark=0.0, eviction_ratio=ONE_KEY_FRACTION))
        # Its pool (32 MiB, touched at start) is freed with the adapter: a
        # process runs many traces, each on a new adapter.
        weakref.finalize(self, self.manager.close)
        self.ids = {}  # id -> its key, in the order they were stored
        self.views = {}  # id -> the cache viewing its resident memory object

    # ---- LMCache's calls ----

    def key(self, id):
        return ObjectKey(chunk_hash=id.encode(), model_name="kvcheck", kv_rank=0)

    def check(self, what, answers, allowed=(L1Error.SUCCESS,)):
        """Raises unless LMCache answered each key with one of `allowed`."""
        for key, answer in answers.items():
            error = answer[0] if isinstance(answer, tuple) else answer
            if error not in allowed:
                raise RuntimeError(f"{what} {key.chunk_hash.decode()!r}: LMCache answered {error.name}")

    def memcheck(self):
        if not self.manager.memcheck():
            raise RuntimeError("LMCache's L1Manager.memcheck() failed")

    def resident(self, id):
        """The resident object state of `id`, or None."""
        key = self.ids.get(id)
        return None if key is None else self.manager.get_object_state(key)

    def refuse_read_locked(self, ids, what):
        for id in ids:
            if self.resident(id) is not None and not self.manager.is_key_evictable(self.ids[id]):
                raise RuntimeError(f"{what} {id!r}: LMCache answered KEY_IS_LOCKED (is_key_evictable is False)")

    def evict_for_a_new_key(self):
        """L1EvictionController.eviction_loop's pass, run when an add of a new
        id finds the store at its capacity; raises when it evicts nothing."""
        if not self.capacity_items or len(self.stored_ids()) < self.capacity_items:
            return
        policy = self.evictions._eviction_policy
        for action in policy.get_eviction_actions(ONE_KEY_FRACTION, key_eligible_filter=self.manager.is_key_evictable):
            self.evictions.execute_eviction_action(action)
        for id in [id for id in self.ids if self.resident(id) is None]:
            del self.ids[id]
            self.views.pop(id, None)
        if len(self.stored_ids()) >= self.capacity_items:
            raise RuntimeError(f"reserve_write: the store holds {self.capacity_items} entries and the eviction pass "
                               "evicted none (every key is read-locked): no room, as OUT_OF_MEMORY")

    # ---- the clock and read leases ----

    def advance_clock(self, ms):
        VirtualTTLLock.clock.now_ms += ms

    def lease(self, id):
        self.check("reserve_read", self.manager.reserve_read([self.key(id)]))

    def unlease(self, id):
        self.check("finish_read", self.manager.finish_read([self.key(id)]))

    # ---- the store ----

    def add(self, id, cache, metadata):
        parts = [(kv.logical_keys(cache, i), kv.logical_values(cache, i)) for i in range(kv.layer_count(cache))]
        tokens = parts[0][0].shape[2]
        key = self.key(id)
        if self.resident(id) is not None:
            self.check("delete", self.manager.delete([key]))
            del self.ids[id]
        else:
            self.evict_for_a_new_key()
        layout = MemoryLayoutDesc(shapes=[torch.Size([2, LAYERS, tokens, HEADS * HEAD_DIM])], dtypes=[torch.float32])
        answers = self.manager.reserve_write([key], [False], layout)
        self.check("reserve_write", answers)
        memory_obj = answers[key][1]
        for (keys, values), (key_view, value_view) in zip(parts, layer_views(memory_obj)):
            key_view.copy_(keys)
            value_view.copy_(values)
        self.check("finish_write", self.manager.finish_write([key]))
        self.ids[id] = key
        kv.set_owned(cache, False)  # the store took the caller's object
        self.memcheck()

    def retrieve(self, id):
        """A read under a read lock: the K/V copied out; None for a missing id."""
        key = self.key(id)
        err, memory_obj = self.manager.reserve_read([key])[key]
        if err == L1Error.KEY_NOT_EXIST:
            return None
        self.check("reserve_read", {key: err})
        try:
            return kv.clone(cache_of(memory_obj))
        finally:
            self.check("finish_read", self.manager.finish_read([key]))

    def get(self, id):
        copied = self.retrieve(id)
        if copied is not None:
            kv.set_owned(copied, False)  # the stored item as it was read, not a copy the caller may write into
        return copied

    def get_by_ids(self, ids):
        return [id if self.resident(id) is not None else None for id in ids]

    def get_all_ids(self):
        return self.stored_ids()

    def get_cache(self, ids):
        parts = [part for part in (self.retrieve(id) for id in ids) if part is not None]
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else kv.concat(parts)

    def delete(self, ids):
        self.refuse_read_locked(ids, "delete")
        keys = [self.ids[id] for id in dict.fromkeys(ids) if self.resident(id) is not None]
        if keys:
            self.check("delete", self.manager.delete(keys))
        for id in ids:
            self.ids.pop(id, None)
            self.views.pop(id, None)
        self.memcheck()

    def delete_all(self):
        self.delete(list(self.ids))

    def stored_cache(self, id):
        state = self.resident(id)
        if state is None:
            raise KeyError(id)
        # One object for every read of one memory object.
        held = self.views.get(id)
        if held is None or held.memory_obj is not state.memory_obj:
            held = self.views[id] = cache_of(state.memory_obj)
        return held

    def stored_ids(self):
        return [id for id in self.ids if self.resident(id) is not None]

    def storage(self, cache):
        """A cache in LMCache's pool is made of its memory object (its
        address); any other of its own tensors' storages."""
        return memory_storage(cache) or super().storage(cache)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--read-ttl-seconds", type=int, default=1, metavar="S",
                        help="L1ManagerConfig.read_ttl_seconds: declared lease_ttl_ms 1000 S")
    parser.add_argument("--capacity-items", type=int, default=4, metavar="N",
                        help="entries held before an add runs the eviction pass (0: no capacity declared)")
    arguments = parser.parse_args(argv)
    if arguments.read_ttl_seconds < 1:
        parser.error(f"--read-ttl-seconds is {arguments.read_ttl_seconds}: 1 or more")
    if arguments.capacity_items < 0:
        parser.error(f"--capacity-items is {arguments.capacity_items}: 0 or more")
    model = models.Decoder()
    serve(lambda: LMCacheL1ManagerAdapter(model, arguments.read_ttl_seconds, arguments.capacity_items))


if __name__ == "__main__":
    main()
