"""The Python adapter SDK: a base class with the operations of kvcheck's
engine interface, and `serve`, the protocol loop that lets kvcheck drive it
from another process (docs/protocol.md).

An engine author implements only the store's operations, on their own
cache objects. The SDK does the rest:
  - the handle table: kvcheck names the caches it is handed by small
    integers; the SDK keeps the objects;
  - the content: kvcheck sends what a cache holds as seeded segments; the
    SDK builds the tensors (make_cache, overridable for another cache class);
  - every observation, computed from the objects themselves: views and
    content hashes (wire.view_json), storage identities (wire.storage_of,
    observe.storage_of's: tensor storages, layer objects, lists), the owned
    marker (`owned`);
  - copy accounting: each operation runs under a copies.CopyTracker, a
    torch dispatch mode that sees the K/V copies the engine makes, with
    their bytes, and the K/V sets alive while its model runs (the model
    marks its forwards with copies.model_forward, as decoder.Decoder does;
    a model that does not reports no live sets). A copy of a cache that
    holds no K/V element moves no byte and no operator shows it: the SDK
    reports it from the objects the operation hands back (a clone, merge or
    from_legacy that hands back a new cache object, a boundary whose model
    ran on another object than the one it was given). An engine that logs
    its copies itself overrides take_copies instead, and returns (tokens,
    peak_live_sets) from generate;
  - metadata: an engine that keeps item metadata implements
    entry_metadata, and its get returns an Item (the cache and the
    metadata it hands back);
  - errors: an exception in an operation is that step's engine error, and
    its Python traceback is in kvcheck's report.

    class MyAdapter(Adapter):
        name = "my-store"
        def __init__(self):
            self.store = MyStore()
        def add(self, id, cache, metadata): self.store.add(id, cache, metadata)
        def get(self, id): return self.store.get(id)
        ...

    if __name__ == "__main__":
        serve(MyAdapter)          # kvcheck run --adapter my_adapter.py

kvcheck makes one engine per trace: `serve` calls the factory again on each
`reset`, in the same process (starting Python with torch costs a second).
"""

from __future__ import annotations

import gc
import os
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from . import cache as _cache
from . import copies as _copies
from . import protocol as _protocol
from . import threads as _threads
from . import wire as _wire
from . import __version__

Cache = Any


class Item:
    """What get hands out when the engine keeps metadata: the cache and the
    item's metadata (a string map), as the store handed them back."""

    __slots__ = ("cache", "metadata")

    def __init__(self, cache: Cache, metadata: Dict[str, str]):
        self.cache = cache
        self.metadata = metadata


class Adapter:
    """An engine as kvcheck drives it. Subclass it and implement the store's
    operations; the ones marked optional switch a capability off while they
    are not implemented (kvcheck then never asks for them)."""

    #: The adapter's name in kvcheck's reports.
    name: str = "python-engine"
    #: One line saying what it is.
    description: str = ""
    #: Capability flags (kvcheck/engine.h Capabilities) that differ from
    #: what the SDK works out from the methods implemented: for example
    #: {"legacy_layout": False} for an engine of the modern layout only,
    #: {"modern_layout": False} for one of the legacy layout only, or
    #: {"owned_marker": False} for one whose caches carry no owned marker
    #: (kvcheck then derives "owned" from storage: sharing nothing stored).
    #: {"window": W} (a number) declares a store window: the engine's model
    #: attends over its last W tokens and its views show only those
    #: (docs/semantics.md, "Store windows").
    #: {"content_tolerance": {"abs": a, "rel": r}} declares a quantized store:
    #: a value it reads back is within a + r * |expected| of what it was
    #: given; its views then carry their values (docs/semantics.md,
    #: "Content tolerance"). A stored entry read twice must still read the same.
    capabilities: Dict[str, Any] = {}
    #: The model whose caches the engine holds (docs/protocol.md, "model"),
    #: or None: then kvcheck draws caches of any layer count, token counts,
    #: layer shapes, dtypes and geometry the capabilities allow. Declared,
    #: every cache kvcheck makes is that model's: for example
    #: {"layers": 2, "heads": 2, "head_dim": 8, "dtypes": ["f32"],
    #:  "layouts": ["modern"], "odd_layers": False}. Every key is required.
    model: Optional[Dict[str, Any]] = None
    #: A bounded store's declared contract (docs/semantics.md, "Declared
    #: store contracts"; docs/protocol.md, "store_policy"). Undeclared: no
    #: capacity, nothing is ever evicted, listing in insertion order.
    #: capacity_items / capacity_bytes: at most this many entries / bytes of
    #: K/V (None: no bound). eviction: "lru" (the least recently used first;
    #: a use is add, get, get_by_ids, get_cache), "fifo" (the first stored
    #: first), "lrs" (the least recently stored first: a store is the only
    #: use, an overwrite moves the entry to the back), "none" (never evicts:
    #: an add past the capacity raises and stores nothing), "unspecified"
    #: (any entry may go, never one handed out by get and still held). With a capacity, an entry evicted as the
    #: policy says is no violation; one evicted against it fails
    #: eviction-as-declared. listing: the order get_all_ids and stored_ids
    #: give, "insertion" (default), "recency" (least recently used first,
    #: as an OrderedDict LRU iterates) or "unordered".
    capacity_items: Optional[int] = None
    capacity_bytes: Optional[int] = None
    eviction: Optional[str] = None
    listing: str = "insertion"
    #: Read leases (docs/semantics.md, "Leases"; docs/protocol.md, "Leases"):
    #: how many ms of kvcheck's virtual clock a lease lives, or None (no
    #: leases). Declared, the engine implements advance_clock, lease and
    #: unlease, and reads no clock but the one advance_clock moves.
    lease_ttl_ms: Optional[int] = None
    #: Why this engine's dump cannot run in a copy of its process (a fork),
    #: or None. dump-safe kills and power-cuts a dump in such a copy
    #: (docs/protocol.md section 10a); an engine whose library hangs or
    #: breaks after a fork (MLX's does) says so here, and its dump-safe row
    #: shows the reason instead of killed dumps.
    dump_fork_absent: Optional[str] = None
    #: Where the owned marker comes from: None, each cache's `owned`
    #: attribute (the SDK's caches carry one); "derived", for caches without
    #: a marker (transformers' own): see derived_owned.
    owned: Optional[str] = None
    #: Whether the engine's methods may be called from several threads at
    #: once. True: kvcheck may send several requests at a time, and the SDK
    #: serves each on a thread of its own under a seeded scheduler that
    #: switches requests at every engine call and at the yield points the
    #: engine shows it (kvcheck_adapter.Lock, kvcheck_adapter.yield_point;
    #: kvcheck_adapter.threads).
    thread_safe: bool = False

    # ---- the store -----------------------------------------------------------------

    def add(self, id: str, cache: Cache, metadata: Dict[str, str]) -> None:
        """Stores `cache` under `id` (an existing id is overwritten). The
        cache is the caller's object: kvcheck either built it from content
        (make_cache) or got it from the engine earlier (a handle)."""
        raise NotImplementedError(f"{type(self).__name__}.add")

    def get(self, id: str) -> Optional[Any]:
        """What the store hands out for `id`: its cache, or an Item (cache
        and metadata) for an engine that keeps metadata; None when missing."""
        raise NotImplementedError(f"{type(self).__name__}.get")

    def get_by_ids(self, ids: Sequence[str]) -> List[Optional[str]]:
        """The ids of the items handed out, in request order; None for a
        missing id."""
        raise NotImplementedError(f"{type(self).__name__}.get_by_ids")

    def get_all_ids(self) -> List[str]:
        """Every stored id, in insertion order."""
        raise NotImplementedError(f"{type(self).__name__}.get_all_ids")

    def get_cache(self, ids: Sequence[str]) -> Optional[Cache]:
        """One id: an owned copy of its cache; several: their merge; None
        when no id exists. When ids exist but none holds tokens: None, or a
        new cache holding no K/V and sharing nothing with the store."""
        raise NotImplementedError(f"{type(self).__name__}.get_cache")

    def delete(self, ids: Sequence[str]) -> None:
        raise NotImplementedError(f"{type(self).__name__}.delete")

    def delete_all(self) -> None:
        raise NotImplementedError(f"{type(self).__name__}.delete_all")

    def stored_cache(self, id: str) -> Cache:
        """The cache object the store holds for `id` (not a copy): what
        kvcheck's observations of stored entries look at. KeyError when
        missing."""
        raise NotImplementedError(f"{type(self).__name__}.stored_cache")

    def stored_ids(self) -> List[str]:
        """The ids the store holds, in insertion order (by default
        get_all_ids)."""
        return list(self.get_all_ids())

    # optional: metadata (capability "metadata")

    def entry_metadata(self, id: str) -> Dict[str, str]:
        """The metadata the store holds for `id` (KeyError when missing).
        With it, get must return Items: kvcheck checks that get hands back
        what add stored, and that dump/load keep it."""
        raise NotImplementedError(f"{type(self).__name__}.entry_metadata")

    # optional: dump / load (capability "dump"), dump_interrupted ("dump_crash")

    def dump(self, directory: str) -> None:
        raise NotImplementedError(f"{type(self).__name__}.dump")

    def load(self, directory: str) -> None:
        """Replaces the store with the dump in `directory`; raises (leaving
        the store as it was) for a missing, truncated or corrupt dump."""
        raise NotImplementedError(f"{type(self).__name__}.load")

    def dump_interrupted(self, directory: str, bytes_budget: int) -> None:
        """A dump that "loses power" after `bytes_budget` bytes are written:
        what was written stays as it is, nothing is cleaned up."""
        raise NotImplementedError(f"{type(self).__name__}.dump_interrupted")

    # ---- generation ----------------------------------------------------------------------

    def generate(self, cache: Optional[Cache], prompt: List[int], max_new_tokens: int) -> Any:
        """Generation through the store's boundary, from `cache` (None: no
        cache). Returns the tokens, or (tokens, peak_live_sets) for an
        engine that counts its K/V sets itself."""
        raise NotImplementedError(f"{type(self).__name__}.generate")

    def generate_stream(self, cache: Optional[Cache], prompt: List[int], max_new_tokens: int) -> Iterable[int]:
        """Optional (capability "generate_stream"): as generate, yielding
        tokens one at a time."""
        raise NotImplementedError(f"{type(self).__name__}.generate_stream")

    def generate_fresh(self, cache: Cache, prompt: List[int], max_new_tokens: int) -> List[int]:
        """The engine's model run directly on `cache`, a fresh cache kvcheck
        built from content: what generation-equivalent compares with. The
        default goes through generate; override it to run the model without
        the boundary, so that a boundary bug cannot hide in the comparison."""
        result = self.generate(cache, prompt, max_new_tokens)
        return list(result[0] if isinstance(result, tuple) else result)

    # optional: caches the model makes (capability "returned_caches", protocol 4;
    # docs/semantics.md, returned caches). On when all three are implemented.

    def generate_returning(self, cache: Optional[Cache], prompt: List[int], max_new_tokens: int) -> Tuple:
        """generate, handing back the cache the model wrote into: returns
        (tokens, cache), or (tokens, peak_live_sets, cache) for an engine
        that counts its K/V sets itself. The cache holds the input's K/V
        (none for None), then those of every token the model was fed: the
        prompt and each generated token but the last (none when
        max_new_tokens is 0). The caller owns it: it carries the owned
        marker and shares nothing with the store; kvcheck reads it,
        generates from it again (a second turn) and stores it (add, as
        add_handle: from then on it is a read-only stored item). It is the
        boundary's copy, or the input itself when that was an owned copy."""
        raise NotImplementedError(f"{type(self).__name__}.generate_returning")

    def extract(self, id: str, prompt: List[int]) -> None:
        """Stores under `id` the memory the model makes of `prompt`: its
        prefill over the prompt on a fresh cache, stored as add stores
        (read-only, marker cleared, no metadata; nothing of it still
        writable by the model)."""
        raise NotImplementedError(f"{type(self).__name__}.extract")

    def feed(self, cache: Cache, tokens: List[int]) -> Cache:
        """The engine's model fed `tokens` on `cache` (a fresh cache kvcheck
        built from content: make_cache), directly, without the store's
        boundary; returns the cache it wrote into (usually `cache`). What a
        returned cache and an extracted memory must hold, as generate_fresh
        is what a generation must give."""
        raise NotImplementedError(f"{type(self).__name__}.feed")

    # optional: trimming (capability "trim"; docs/semantics.md, trimming). On
    # when implemented.

    def trim(self, cache: Cache, keep: int) -> None:
        """Cuts `cache`, which the caller owns (a get_cache copy, a clone, a
        merge, a cache generate_returning handed back), to its first `keep`
        tokens (keep >= 1), in place, as transformers' DynamicCache.crop(keep)
        and mlx-lm's trim_prompt_cache do: every slot holding more keeps its
        first `keep` tokens, the others are unchanged. kvcheck never asks it
        of a stored item (read-only) or a conversion's view. trim-exact
        compares the cache with a fresh one holding the kept prefix (for a
        cache the model made: `feed` of the tokens kept)."""
        raise NotImplementedError(f"{type(self).__name__}.trim")

    # optional: read leases on kvcheck's clock (lease_ttl_ms; docs/semantics.md,
    # leases). All three with lease_ttl_ms.

    def advance_clock(self, ms: int) -> None:
        """kvcheck's virtual clock moves `ms` milliseconds forward (it starts
        at 0). The engine's leases expire by this clock only, never the wall
        clock: a lease taken at t lives while the clock is below t + TTL."""
        raise NotImplementedError(f"{type(self).__name__}.advance_clock")

    def lease(self, id: str) -> None:
        """A read lease on the entry stored under `id` (LMCache's
        reserve_read): its count goes up by one and its expiry moves to now +
        TTL. Raises when nothing is stored under `id`. While it is live, add,
        delete, delete_all and load of the entry raise and change nothing."""
        raise NotImplementedError(f"{type(self).__name__}.lease")

    def unlease(self, id: str) -> None:
        """Gives one live lease on `id` back (LMCache's finish_read). Raises,
        changing nothing, when `id` holds no live lease (none, all given
        back, or expired)."""
        raise NotImplementedError(f"{type(self).__name__}.unlease")

    # optional: batches (capability "batch"; docs/semantics.md, batches). On
    # when implemented.

    def batch(self, rows: List[Cache], repeat: int, reorder: List[int], select: int) -> Cache:
        """One row of a batch, as a new cache the caller owns: the caches
        `rows` (each of batch 1, owned by the caller, one geometry) stacked
        into one cache of batch len(rows), every row repeated `repeat` times
        in place (transformers' batch_repeat_interleave: row j becomes row
        j // repeat), then, when `reorder` is not empty, the rows reordered
        (reorder_cache after a beam step: row j becomes row reorder[j]),
        then row `select` kept (batch_select_indices([select])). The rows
        are unchanged and the result shares no storage with them.
        batch-exact compares it with the cache of the row it came from,
        clone-independent its storage with the rows'."""
        raise NotImplementedError(f"{type(self).__name__}.batch")

    # ---- caches ------------------------------------------------------------------------------

    def make_cache(self, content) -> Cache:
        """A cache holding exactly `content` (content.CacheContent), in the
        engine's own cache class. The default builds this package's
        DynamicCache / LegacyDynamicCache (cache.py)."""
        return _wire.materialize(content)

    def clone(self, cache: Cache) -> Cache:
        raise NotImplementedError(f"{type(self).__name__}.clone")

    def concat(self, caches: Sequence[Cache]) -> Cache:
        raise NotImplementedError(f"{type(self).__name__}.concat")

    # optional: conversions (capability "conversions")

    def to_legacy(self, cache: Cache) -> Cache:
        raise NotImplementedError(f"{type(self).__name__}.to_legacy")

    def from_legacy(self, cache: Cache) -> Cache:
        raise NotImplementedError(f"{type(self).__name__}.from_legacy")

    # ---- observations (the defaults read any cache of either layout) -------------------------

    def is_owned(self, cache: Cache) -> bool:
        """The owned-copy marker: the `owned` attribute, or derived_owned
        for an adapter whose `owned` is "derived"."""
        if self.owned == "derived":
            return derived_owned(self, cache)
        if self.owned is not None:
            raise ValueError(f"{type(self).__name__}.owned is {self.owned!r}: None or \"derived\"")
        return bool(getattr(cache, "owned", False))

    def view(self, cache: Cache) -> Dict[str, Any]:
        """What kvcheck sees of a cache, in the protocol's view form; with
        the values of each slot when the adapter declares a
        "content_tolerance" capability (docs/semantics.md, content tolerance)."""
        return _wire.view_json(cache, with_values=bool(self.capabilities.get("content_tolerance")))

    def storage(self, cache: Cache) -> List[int]:
        """Identities of everything the cache is made of (observe.storage_of)."""
        return _wire.storage_of(cache)

    def take_copies(self) -> Optional[List[Tuple[str, int]]]:
        """For an engine that logs its K/V copies itself: (reason, bytes) of
        each copy since the last call. None (the default): the SDK's copy
        tracker accounts for them."""
        return None


def derived_owned(engine: Adapter, cache: Cache) -> bool:
    """The owned marker of a cache that carries none, derived from what the
    store holds: owned when it is not a stored object and shares no list,
    layer object or tensor storage (the engine's storage identities) with
    any stored entry. (kvcheck asks the marker of the caches an operation
    hands out, where an owned copy and a cache kvcheck made itself are
    alike: it judges the marker of get_cache, clone and concat results, of
    what get hands out and of stored entries, never of made caches.)"""
    identities = set(engine.storage(cache))
    for id in engine.stored_ids():
        stored = engine.stored_cache(id)
        if stored is cache or not identities.isdisjoint(engine.storage(stored)):
            return False
    return True


def _overrides(engine: Adapter, method: str) -> bool:
    return getattr(type(engine), method) is not getattr(Adapter, method)


def store_policy_of(engine: Adapter) -> Optional[Dict[str, Any]]:
    """The handshake's "store_policy" (docs/protocol.md section 3) from the
    adapter's capacity_items, capacity_bytes, eviction and listing; None
    when it declares none of them. A declaration that does not hold
    together raises TypeError or ValueError naming the attribute."""
    policy: Dict[str, Any] = {}
    for name in ("capacity_items", "capacity_bytes"):
        value = getattr(engine, name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{type(engine).__name__}.{name} is {value!r}: a positive int, or None for no bound")
        policy[name] = value
    if engine.eviction is not None:
        if engine.eviction not in _EVICTIONS:
            raise ValueError(f"{type(engine).__name__}.eviction is {engine.eviction!r} (known: {', '.join(_EVICTIONS)})")
        if engine.eviction != "none" and not policy:
            raise ValueError(f"{type(engine).__name__}.eviction is {engine.eviction!r}, but no capacity is declared "
                             "(capacity_items or capacity_bytes)")
        policy["eviction"] = engine.eviction
    elif policy:
        raise ValueError(f"{type(engine).__name__} declares a capacity but no eviction: say how it makes room "
                         f"(eviction = one of {', '.join(_EVICTIONS)})")
    if engine.listing != "insertion":
        if engine.listing not in _LISTINGS:
            raise ValueError(f"{type(engine).__name__}.listing is {engine.listing!r} (known: {', '.join(_LISTINGS)})")
        policy["listing"] = engine.listing
    return policy or None


_EVICTIONS = ("lru", "fifo", "lrs", "none", "unspecified")
_LISTINGS = ("insertion", "recency", "unordered")


def capabilities_of(engine: Adapter) -> Dict[str, bool]:
    """The capability flags kvcheck is told: those the implemented methods
    allow, then the engine's own overrides."""
    flags = {
        "modern_layout": True,
        "conversions": _overrides(engine, "to_legacy") and _overrides(engine, "from_legacy"),
        "dump": _overrides(engine, "dump") and _overrides(engine, "load"),
        "dump_crash": _overrides(engine, "dump_interrupted"),
        "generate_stream": _overrides(engine, "generate_stream"),
        "metadata": _overrides(engine, "entry_metadata"),
        "storage_identity": True,
        "copy_log": True,
        "owned_marker": True,
        "entry_versions": False,
        "returned_caches": all(_overrides(engine, m) for m in ("generate_returning", "extract", "feed")),
        "trim": _overrides(engine, "trim"),
        "thread_safe": bool(engine.thread_safe),
        "batch": _overrides(engine, "batch"),
    }
    flags.update(_paged_flags(engine))
    flags.update(_lease_flags(engine))
    flags.update(engine.capabilities)
    if not flags["dump"]:
        flags["dump_crash"] = False
    return flags


# ---- the paged family (kvcheck_adapter.paged; docs/protocol.md, "Paged requests") ----

_STORE_METHODS = ("add", "get", "get_all_ids", "get_cache", "delete", "delete_all", "stored_cache", "stored_ids")


def _paged_flags(engine: Adapter) -> Dict[str, Any]:
    """A BlockManagerAdapter is a paged engine; without the store's
    operations, a paged one only (its contiguous properties are n/a)."""
    from . import paged as _paged  # imports this module: imported when first needed

    if not _paged.is_paged(engine):
        return {}
    # A manager without fork, import_sequence or rewind has no such operation:
    # kvcheck never draws it (a refusal of one it has must be needed).
    def manager_has(method: str) -> bool:
        return getattr(type(engine), method) is not getattr(_paged.BlockManagerAdapter, method)

    flags = {"paged": True, "store": all(_overrides(engine, method) for method in _STORE_METHODS),
             "paged_fork": manager_has("fork"), "paged_import": manager_has("import_sequence")}
    # Claimed only when true: absent, kvcheck never asks a rewind.
    if manager_has("rewind"):
        flags["paged_rewind"] = True
    # Declared, kvcheck checks the free queue's order (free-order).
    if engine.free_order is not None:
        flags["paged_free_order"] = engine.free_order
    return flags


def _lease_flags(engine: Adapter) -> Dict[str, Any]:
    """lease_ttl_ms, when declared, with the methods it needs."""
    ttl = engine.lease_ttl_ms
    if ttl is None:
        return {}
    if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 1:
        raise ValueError(f"{type(engine).__name__}.lease_ttl_ms is {ttl!r}: a lease lives 1 ms or more (None: no leases)")
    missing = [m for m in ("advance_clock", "lease", "unlease") if not _overrides(engine, m)]
    if missing:
        raise ValueError(f"{type(engine).__name__} declares lease_ttl_ms but does not implement {', '.join(missing)}")
    return {"lease_ttl_ms": ttl}


class RequestError(ValueError):
    """A request kvcheck should not have sent (an unknown operation, a
    missing field)."""


def _field(request: Dict[str, Any], name: str, kind=None):
    if name not in request:
        raise RequestError(f"request '{request.get('op')}' lacks '{name}'")
    value = request[name]
    if kind is not None and not isinstance(value, kind):
        raise RequestError(f"request '{request.get('op')}': '{name}' is not {kind}")
    return value


class _Tracker(_copies.CopyTracker):
    """The copy tracker, also noting which cache objects the model ran on
    during the current recording (the caches copies.model_forward marks).

    A copy of a cache that holds no K/V element moves no byte, so no copy
    operator shows it; what shows it is the model writing into another
    cache object than the one the boundary was given. That object is then
    the boundary's copy of it (note_copy), so that the K/V sets on its path
    count the input as C++'s lineage does."""

    def __init__(self) -> None:
        super().__init__()
        self.model_caches: Set[int] = set()
        self.generation_input: Optional[Cache] = None

    def _sample(self, cache, tensor_sets=None) -> None:
        if self._recording is not None:
            given = self.generation_input
            if given is not None and cache is not given and id(cache) not in self.model_caches:
                self.note_copy(cache, [given], zero_bytes=_cache.footprint(given)[1] == 0)
            self.model_caches.add(id(cache))
        super()._sample(cache, tensor_sets)


class _Session:
    """One engine and what kvcheck holds of it: from a handshake or reset to
    the next."""

    def __init__(self, engine: Adapter):
        self.engine = engine
        self.handles: Dict[int, Optional[Cache]] = {}
        # The metadata get handed out with each handle's item.
        self.handle_metadata: Dict[int, Dict[str, str]] = {}
        self.engine_logs_copies = _overrides(engine, "take_copies")
        # No tracker for an engine that logs its copies itself, or that
        # declares no copy log (capability copy_log false: its caches may not
        # be torch tensors at all, and kvcheck reads no copies from it).
        tracked = not self.engine_logs_copies and capabilities_of(engine)["copy_log"]
        self.tracker = _Tracker() if tracked else None
        self.pending_copies: List[Dict[str, Any]] = []
        # Whether facts carry metadata (the engine keeps it).
        self.metadata = capabilities_of(engine)["metadata"]
        # What the last operation's reply reported, reported again after a
        # generate_fresh (kvcheck forgets everything at each operation).
        self.last_named: Tuple[Sequence[int], Sequence[str]] = ((), ())


class Server:
    """Answers the protocol's requests for engines made by `factory`."""

    def __init__(self, factory: Callable[[], Adapter]):
        self._factory = factory
        self._session: Optional[_Session] = None
        self._op = ""  # the request being answered: the reason of the copies it makes
        # What kvcheck said it reads after the request being answered
        # ("read_store", "read_ids"): reported in its reply.
        self._read_store = False
        self._read_ids: Sequence[str] = ()
        # The handshake's engine declared thread_safe: serve() answers the
        # requests after it side by side (kvcheck_adapter.threads).
        self.thread_safe = False
        self._handlers: Dict[str, Callable[[Dict[str, Any]], Dict[str, Any]]] = {
            name[len("_op_"):]: getattr(self, name) for name in dir(self) if name.startswith("_op_")
        }

    def handle(self, request: Dict[str, Any]) -> Dict[str, Any]:
        op = request.get("op")
        handler = self._handlers.get(op) if isinstance(op, str) else None
        if handler is None and isinstance(op, str) and op.startswith("paged_"):
            handler = self._paged_request
        if handler is None:
            raise RequestError(f"unknown request {op!r} (this SDK speaks protocol {_protocol.PROTOCOL_VERSION})")
        if self._session is None and op not in ("hello", "shutdown"):
            raise RequestError(f"request {op!r} before the handshake")
        if request.get("reset") is True and op not in ("hello", "reset"):
            # kvcheck's reset before a trace, sent with the trace's first
            # request: a fresh engine first, then the request. A factory
            # that fails is no engine error of the request: kvcheck reports
            # it as the reset's failure.
            try:
                self._op_reset(request)
            except Exception as error:  # noqa: BLE001 - reported to kvcheck, which stops
                reply = _protocol.error_reply(error)
                reply["reset_failed"] = True
                return reply
        if _threads.current_scheduler() is not None:
            _threads.yield_point(op)  # every engine call is a point where another request may run
        self._op = op
        self._read_store = request.get("read_store") is True
        self._read_ids = request.get("read_ids") or ()
        return handler(request)

    _TRACKER_STATE = ("_recording", "_open", "_made_here", "_set_copies", "_model_depth", "_mode", "model_caches",
                      "generation_input")

    def _switch_out(self) -> Callable[[], None]:
        """At a switch between requests served side by side: saves what
        the running request keeps in the server and in the copy tracker
        (its recording), leaves them idle for the next, and returns what
        puts them back when the request runs again. A torch dispatch mode
        is its thread's own: the copies a request makes stay its own."""
        session = self._session
        tracker = session.tracker if session is not None else None
        server = (self._op, self._read_store, self._read_ids, session.last_named if session is not None else None)
        recorded = {name: getattr(tracker, name) for name in self._TRACKER_STATE} if tracker is not None else {}
        recording = tracker is not None and tracker in _copies._RECORDING
        if tracker is not None:
            if recording:
                _copies._RECORDING.remove(tracker)
            fresh = _Tracker()
            for name in self._TRACKER_STATE:
                setattr(tracker, name, getattr(fresh, name))

        def restore() -> None:
            self._op, self._read_store, self._read_ids, last_named = server
            if session is not None:
                session.last_named = last_named
            for name, value in recorded.items():
                setattr(tracker, name, value)
            if recording:
                _copies._RECORDING.append(tracker)

        return restore

    # ---- session -----------------------------------------------------------------------

    def _op_hello(self, request):
        theirs = request.get("protocol")
        if theirs != _protocol.PROTOCOL_VERSION:
            return {
                "ok": False,
                "protocol": _protocol.PROTOCOL_VERSION,
                "error": f"this adapter's SDK, kvcheck-adapter {__version__}, speaks protocol version "
                         f"{_protocol.PROTOCOL_VERSION}; kvcheck {request.get('kvcheck') or '(version unknown)'} asked for "
                         f"{theirs}: install the SDK of the same version as kvcheck (pip install ./python from its sources)",
            }
        self._session = _Session(self._factory())
        engine = self._session.engine
        reply = {
            "ok": True,
            "protocol": _protocol.PROTOCOL_VERSION,
            "name": engine.name,
            "description": engine.description,
            "capabilities": capabilities_of(engine),
            "copies_in_replies": True,
        }
        self.thread_safe = bool(engine.thread_safe)
        # dump_fork (docs/protocol.md section 10a): kvcheck kills and power-cuts
        # this engine's dumps in copies of this process.
        if reply["capabilities"].get("dump", True):
            reply["dump_fork"] = engine.dump_fork_absent is None and _protocol.dump_shim() is not None
            if engine.dump_fork_absent is not None:
                reply["dump_fork_absent"] = engine.dump_fork_absent
            elif not reply["dump_fork"]:
                reply["dump_fork_absent"] = ("the dump shim (libkvcheck_dumpshim.so) is not loaded in the adapter process: "
                                             "LD_PRELOAD did not reach it (a wrapper that clears the environment, "
                                             "or a statically linked interpreter)")
        if engine.model is not None:
            if not isinstance(engine.model, dict):
                raise TypeError(f"{type(engine).__name__}.model is a {type(engine.model).__name__}: it declares the "
                                "model's caches as a dict (docs/protocol.md, \"model\") or is None; keep a model "
                                "object under another name")
            reply["model"] = dict(engine.model)
        policy = store_policy_of(engine)
        if policy is not None:
            reply["store_policy"] = policy
        return reply

    def _op_reset(self, request):
        self._session = None  # the old engine goes before the new one is made
        scheduler = _threads.current_scheduler()
        if scheduler is not None:
            scheduler.restart()  # each trace's interleaving from the seed alone
        self._session = _Session(self._factory())
        return {"ok": True}

    def _op_shutdown(self, request):
        return {"ok": True}

    def _paged_request(self, request):
        from . import paged as _paged

        if request["op"] not in _paged.REQUESTS:
            raise RequestError(f"unknown request {request['op']!r} (this SDK speaks protocol {_protocol.PROTOCOL_VERSION})")
        return _paged.handle(self._session.engine, request)

    # ---- the store -------------------------------------------------------------------

    def _op_add(self, request):
        s = self._session
        id = _field(request, "id", str)
        cache = s.engine.make_cache(_wire.content_from_json(_field(request, "cache")))
        metadata = request.get("metadata") or {}
        return self._operation(lambda: s.engine.add(id, cache, dict(metadata)), ids=[id], stored=[id])

    def _op_add_handle(self, request):
        s = self._session
        id, handle = _field(request, "id", str), _field(request, "handle", int)
        cache = self._held(handle, "add_handle")
        return self._operation(lambda: s.engine.add(id, cache, {}), handles=[handle], ids=[id], stored=[id])

    def _op_get(self, request):
        s = self._session
        id, out = _field(request, "id", str), _field(request, "out", int)

        def run():
            got = s.engine.get(id)
            if isinstance(got, Item):
                s.handles[out] = got.cache
                s.handle_metadata[out] = {str(k): str(v) for k, v in dict(got.metadata).items()}
            else:
                s.handles[out] = got
                s.handle_metadata.pop(out, None)

        return self._operation(run, handles=[out], ids=[id])

    def _op_get_by_ids(self, request):
        s = self._session
        ids = _field(request, "ids", list)

        def run():
            items = list(s.engine.get_by_ids(list(ids)))
            for item in items:
                if item is not None and not isinstance(item, str):
                    raise TypeError(f"get_by_ids must return ids (str) or None, not {type(item).__name__}")
            return {"items": items}

        return self._operation(run, ids=ids)

    def _op_get_all_ids(self, request):
        s = self._session
        return self._operation(lambda: {"ids": [str(id) for id in s.engine.get_all_ids()]})

    def _op_get_cache(self, request):
        s = self._session
        ids, out = _field(request, "ids", list), _field(request, "out", int)

        def run():
            s.handles[out] = s.engine.get_cache(list(ids))

        def sources():
            stored = set(s.engine.stored_ids())
            return [s.engine.stored_cache(id) for id in dict.fromkeys(ids) if id in stored]

        return self._operation(run, handles=[out], ids=ids, copy_of=(out, sources))

    def _op_remove(self, request):
        s = self._session
        ids = _field(request, "ids", list)
        return self._operation(lambda: s.engine.delete(list(ids)), ids=ids)

    def _op_advance_clock(self, request):
        s = self._session
        ms = _field(request, "ms", int)
        return self._operation(lambda: s.engine.advance_clock(ms))

    def _op_lease(self, request):
        s = self._session
        id = _field(request, "id", str)
        return self._operation(lambda: s.engine.lease(id), ids=[id])

    def _op_unlease(self, request):
        s = self._session
        id = _field(request, "id", str)
        return self._operation(lambda: s.engine.unlease(id), ids=[id])

    def _op_remove_all(self, request):
        s = self._session
        return self._operation(s.engine.delete_all)

    def _op_dump(self, request):
        s = self._session
        directory = _field(request, "dir", str)
        return self._operation(lambda: s.engine.dump(directory))

    def _op_dump_fork(self, request):
        s = self._session
        directory, log, kill_at = _field(request, "dir", str), _field(request, "log", str), _field(request, "kill_at", int)
        return _protocol.dump_fork(s.engine.dump, directory, log, kill_at)

    def _op_dump_interrupted(self, request):
        s = self._session
        directory, budget = _field(request, "dir", str), _field(request, "bytes_budget", int)
        return self._operation(lambda: s.engine.dump_interrupted(directory, budget))

    def _op_load(self, request):
        s = self._session
        directory = _field(request, "dir", str)

        def run():
            try:
                s.engine.load(directory)
            except Exception as error:  # noqa: BLE001 - a failed load is a result, not an engine error
                return {"error": f"{type(error).__name__}: {error}"}
            return {"error": None}

        reply = self._operation(run)
        if reply["error"] is None and s.tracker is not None:
            for id in s.engine.stored_ids():
                s.tracker.track(s.engine.stored_cache(id))
        return reply

    # ---- generation ------------------------------------------------------------------

    def _op_generate(self, request):
        return self._generation(request, None)

    def _generation(self, request, out: Optional[int]):
        """generate (out None), or generate_returning: `out` then points at
        the cache the model wrote into (protocol 4)."""
        s = self._session
        handle = _field(request, "handle", int)
        prompt = [int(t) for t in _field(request, "prompt", list)]
        max_new_tokens = _field(request, "max_new_tokens", int)
        stream = bool(request.get("stream", False))
        cache = s.handles.get(handle) if handle != 0 else None
        recording_box: List[Any] = []

        def run():
            if out is not None:
                tokens, peak = self._returning(cache, prompt, max_new_tokens, out)
                return {"tokens": tokens, "peak_live_sets": peak}
            if stream:
                result: Any = list(s.engine.generate_stream(cache, prompt, max_new_tokens))
            else:
                result = s.engine.generate(cache, prompt, max_new_tokens)
            if isinstance(result, tuple):
                tokens, peak = result
                return {"tokens": [int(t) for t in tokens], "peak_live_sets": int(peak)}
            return {"tokens": [int(t) for t in result], "peak_live_sets": None}

        named = [handle] if handle != 0 else []
        if out is not None:
            named.append(out)
        if s.tracker is not None:
            s.tracker.generation_input = cache
        try:
            reply = self._operation(run, handles=named, recording_box=recording_box)
        finally:
            if s.tracker is not None:
                s.tracker.generation_input = None
        if reply["peak_live_sets"] is None:
            reply["peak_live_sets"] = recording_box[0].peak_sets_on_path if recording_box else 0
        returned = s.handles.get(out) if out is not None else None
        if cache is not None and s.tracker is not None and not reply["copies"] and _cache.footprint(cache)[1] == 0:
            if any(ran_on != id(cache) for ran_on in s.tracker.model_caches):
                reply["copies"] = [{"reason": self._op, "bytes": 0}]  # see _Tracker
            elif returned is not None and returned is not cache:
                # The boundary's copy of a cache holding no K/V element, which
                # the model never ran on (max_new_tokens 0): no operator shows it.
                s.tracker.note_copy(returned, [cache], zero_bytes=True)
                reply["copies"] = [{"reason": self._op, "bytes": 0}]
        if returned is not None and s.tracker is not None:
            s.tracker.adopt(returned)  # K/V the model made: a copy of it is a copy
        return reply

    # ---- caches the model makes (protocol 4: generate_returning, extract, fed_view) ----

    def _returning(self, cache, prompt: List[int], max_new_tokens: int, out: int) -> Tuple[List[int], Optional[int]]:
        """Runs the engine's generate_returning and binds `out` to the cache
        it hands back: (tokens, peak_live_sets or None)."""
        s = self._session
        result = s.engine.generate_returning(cache, prompt, max_new_tokens)
        if not isinstance(result, tuple) or len(result) not in (2, 3):
            raise TypeError(f"{type(s.engine).__name__}.generate_returning must return (tokens, cache) or "
                            f"(tokens, peak_live_sets, cache), not {type(result).__name__}")
        returned = result[-1]
        if returned is None:
            raise ValueError(f"{type(s.engine).__name__}.generate_returning returned no cache")
        s.handles[out] = returned
        s.handle_metadata.pop(out, None)
        return [int(t) for t in result[0]], (int(result[1]) if len(result) == 3 else None)

    def _op_generate_returning(self, request):
        return self._generation(request, _field(request, "out", int))

    def _op_extract(self, request):
        s = self._session
        id = _field(request, "id", str)
        prompt = [int(t) for t in _field(request, "prompt", list)]
        return self._operation(lambda: s.engine.extract(id, prompt), ids=[id], stored=[id])

    def _op_fed_view(self, request):
        # An observation: a fresh cache, fed outside any recording (kvcheck
        # keeps what the last operation reported).
        s = self._session
        tokens = [int(t) for t in _field(request, "tokens", list)]
        cache = s.engine.make_cache(_wire.content_from_json(_field(request, "cache")))
        if tokens:
            cache = s.engine.feed(cache, tokens)
        return {"ok": True, "view": s.engine.view(cache)}

    def _op_generate_fresh(self, request):
        s = self._session
        prompt = [int(t) for t in _field(request, "prompt", list)]
        max_new_tokens = _field(request, "max_new_tokens", int)
        cache = s.engine.make_cache(_wire.content_from_json(_field(request, "cache")))
        # Not recorded: kvcheck takes the copies before every operation
        # whose copies it counts, so none made here is ever counted.
        tokens = [int(t) for t in s.engine.generate_fresh(cache, prompt, max_new_tokens)]
        handles, ids = s.last_named
        reply = {"ok": True, "tokens": tokens, "copies": []}
        reply["observed"] = self._observed(handles, ids)
        return reply

    # ---- caches ------------------------------------------------------------------------

    def _op_make(self, request):
        s = self._session
        out = _field(request, "out", int)
        made = s.engine.make_cache(_wire.content_from_json(_field(request, "cache")))
        s.handles[out] = made
        if s.tracker is not None:
            s.tracker.track(made)  # K/V of its own: a copy of it is a copy
        return self._reply({"copies": []}, handles=[out])

    def _cache_op(self, request, method: str):
        s = self._session
        source, out = _field(request, "source", int), _field(request, "out", int)
        cache = s.handles.get(source)

        def run():
            s.handles[out] = getattr(s.engine, method)(cache) if cache is not None else None

        copies = method != "to_legacy"  # to_legacy may alias its source (transformers does)
        copy_of = (out, lambda: [cache]) if copies and cache is not None else None
        return self._operation(run, handles=[out, source], copy_of=copy_of)

    def _op_clone(self, request):
        return self._cache_op(request, "clone")

    def _op_to_legacy(self, request):
        return self._cache_op(request, "to_legacy")

    def _op_from_legacy(self, request):
        return self._cache_op(request, "from_legacy")

    def _op_concat(self, request):
        s = self._session
        parts, out = _field(request, "parts", list), _field(request, "out", int)
        caches = [s.handles.get(p) for p in parts]
        present = [c for c in caches if c is not None]

        def run():
            s.handles[out] = s.engine.concat(present) if present else None

        copy_of = (out, lambda: present) if present else None
        return self._operation(run, handles=[out] + [p for p in parts if p != 0], copy_of=copy_of)

    def _op_trim(self, request):
        s = self._session
        handle, keep = _field(request, "handle", int), _field(request, "keep", int)
        cache = self._held(handle, "trim")
        return self._operation(lambda: s.engine.trim(cache, keep), handles=[handle])

    def _op_batch(self, request):
        s = self._session
        rows, out = _field(request, "rows", list), _field(request, "out", int)
        repeat, select = _field(request, "repeat", int), _field(request, "select", int)
        reorder = [int(index) for index in _field(request, "reorder", list)]
        caches = [self._held(row, "batch") for row in rows]

        def run():
            s.handles[out] = s.engine.batch(caches, repeat, reorder, select)

        # No copy_of: the rows hold tokens (kvcheck stacks no empty row), so
        # the tracker sees the steps' copies, each a level of the row's
        # lineage (stack, repeat, reorder, select), which dies with the
        # step; naming the rows as the result's direct sources as well
        # would count the live rows at every level.
        return self._operation(run, handles=[out] + list(rows))

    def _op_release(self, request):
        s = self._session
        handle = _field(request, "handle", int)
        s.handles.pop(handle, None)
        s.handle_metadata.pop(handle, None)
        return self._reply({"copies": []})

    # ---- observations ----------------------------------------------------------------

    def _op_stored_ids(self, request):
        return {"ok": True, "ids": [str(id) for id in self._session.engine.stored_ids()]}

    def _stored(self, id: str) -> Cache:
        try:
            return self._session.engine.stored_cache(id)
        except KeyError:
            raise KeyError(f"no stored entry {id!r}") from None

    def _held(self, handle: int, op: Optional[str] = None) -> Cache:
        """The cache `handle` holds; an error naming `op` when it holds none."""
        cache = self._session.handles.get(handle)
        if cache is None:
            raise ValueError(f"{op + ': ' if op else ''}handle {handle} holds no cache")
        return cache

    def _op_view_entry(self, request):
        return {"ok": True, "view": self._session.engine.view(self._stored(_field(request, "id", str)))}

    def _op_entry_digest(self, request):
        return self._op_view_entry(request)

    def _op_entry_owned(self, request):
        return {"ok": True, "owned": self._session.engine.is_owned(self._stored(_field(request, "id", str)))}

    def _op_storage_of_entry(self, request):
        return {"ok": True, "storage": self._session.engine.storage(self._stored(_field(request, "id", str)))}

    def _op_view_handle(self, request):
        return {"ok": True, "view": self._session.engine.view(self._held(_field(request, "handle", int)))}

    def _op_handle_digest(self, request):
        return self._op_view_handle(request)

    def _op_storage_of_handle(self, request):
        cache = self._session.handles.get(_field(request, "handle", int))
        return {"ok": True, "storage": [] if cache is None else self._session.engine.storage(cache)}

    def _op_handle_facts(self, request):
        # Without the view: kvcheck asks a handle's marker and storage far
        # more often than its content, which it asks for when it needs it.
        session = self._session
        handle = _field(request, "handle", int)
        cache = session.handles.get(handle)
        if cache is None:
            reply = {"ok": True, "exists": False, "owned": False, "storage": []}
        else:
            engine = session.engine
            reply = {"ok": True, "exists": True, "owned": engine.is_owned(cache), "storage": engine.storage(cache)}
        if session.metadata:
            reply["metadata"] = session.handle_metadata.get(handle, {})
        return reply

    def _op_read_entries(self, request):
        ids = _field(request, "ids", list)
        with_storage = bool(request.get("with_storage", True))
        seen: Dict[int, Tuple[Dict[str, Any], List[int]]] = {}
        return {"ok": True, "entries": [self._entry_facts(id, seen, with_storage) for id in ids]}

    def _op_entry_metadata(self, request):
        id = _field(request, "id", str)
        self._stored(id)  # KeyError naming a missing entry
        return {"ok": True, "metadata": self._entry_metadata(id)}

    def _op_handle_metadata(self, request):
        handle = _field(request, "handle", int)
        return {"ok": True, "metadata": self._session.handle_metadata.get(handle, {})}

    def _op_take_copies(self, request):
        s = self._session
        taken, s.pending_copies = s.pending_copies, []
        return {"ok": True, "copies": taken}

    def _op_entry_version(self, request):
        raise RequestError("this adapter does not report entry versions (capability entry_versions is off)")

    def _op_entry_versions(self, request):
        return self._op_entry_version(request)

    # ---- what every operation does ----------------------------------------------------

    def _operation(
        self,
        run: Callable[[], Optional[Dict[str, Any]]],
        handles: Sequence[int] = (),
        ids: Sequence[str] = (),
        stored: Sequence[str] = (),
        recording_box: Optional[List[Any]] = None,
        copy_of: Optional[Tuple[int, Callable[[], List[Cache]]]] = None,
    ) -> Dict[str, Any]:
        """Runs an engine operation under the copy tracker, then replies
        with its result, the copies it made and the facts of what it named.
        `stored`: ids whose caches become originals (the store holds them).
        `copy_of`: (out, sources) for an operation whose semantics copy:
        the cache `out` points at afterwards is a copy of the caches
        sources() gives (the lineage of its K/V sets; a copy of caches
        holding no K/V element (no tensor bytes), which no operator shows,
        is reported as a copy of 0 bytes)."""
        s = self._session
        if s.tracker is None:
            result = run()
            made = [{"reason": str(reason), "bytes": int(size)} for reason, size in (s.engine.take_copies() or [])]
        else:
            s.tracker.model_caches.clear()
            with s.tracker.record() as recording:
                result = run()
            made = [{"reason": self._op, "bytes": copy.bytes} for copy in recording.copies]
            if copy_of is not None:
                made += self._note_copy(copy_of, bool(recording.copies))
            if recording_box is not None:
                recording_box.append(recording)
            # A bounded store may have evicted what it was just given
            # (an item larger than its capacity): nothing to track then.
            held = set(s.engine.stored_ids()) if stored else set()
            for id in stored:
                if id in held:
                    s.tracker.track(s.engine.stored_cache(id))
        reply = self._reply(result or {}, handles, ids)
        reply["copies"] = made
        return reply

    def _note_copy(self, copy_of: Tuple[int, Callable[[], List[Cache]]], copied: bool) -> List[Dict[str, Any]]:
        """The lineage of a copying operation's result, and its copy of 0
        bytes when no operator could show one (see _operation)."""
        s = self._session
        out, sources_of = copy_of
        result = s.handles.get(out)
        sources = sources_of()
        if result is None or any(result is source for source in sources):
            return []
        # A copy's size is its result's, as C++ Copier logs it: a merge of
        # parts whose only tensors sit in uninitialized layers holds nothing.
        zero_bytes = not copied and _cache.footprint(result)[1] == 0
        s.tracker.note_copy(result, sources, zero_bytes)
        return [{"reason": self._op, "bytes": 0}] if zero_bytes else []

    def _reply(self, result: Dict[str, Any], handles: Sequence[int] = (), ids: Sequence[str] = ()):
        self._session.last_named = (tuple(handles), tuple(ids))
        reply = {"ok": True}
        reply.update(result)
        reply["observed"] = self._observed(handles, ids)
        return reply

    def _observed(self, handles: Sequence[int], ids: Sequence[str]) -> Dict[str, Any]:
        """The facts of the handles and stored entries an operation named,
        and of the entries kvcheck said it reads after it ("read_store":
        every one; "read_ids"), as they are after it; a fact that cannot be
        read is left out (kvcheck then asks, and gets the error)."""
        session = self._session
        engine = session.engine
        seen: Dict[int, Tuple[Dict[str, Any], List[int]]] = {}
        handle_facts: List[Dict[str, Any]] = []
        for handle in dict.fromkeys(handles):
            try:
                facts = self._handle_facts(handle, seen)
            except Exception:  # noqa: BLE001 - see the docstring
                continue
            facts["handle"] = handle
            handle_facts.append(facts)
        # Every other live handle's marker and storage (not its view): kvcheck
        # reads them before the next operation that names one, and at its
        # full reads, a request each otherwise. Handles of one cache object
        # (get of one id twice) share one reading.
        named = set(handles)
        storages: Dict[int, List[int]] = {key: found[1] for key, found in seen.items()}
        is_owned, storage_of = engine.is_owned, engine.storage
        for handle, cache in session.handles.items():
            if cache is None or handle in named:
                continue
            try:
                storage = storages.get(id(cache))
                if storage is None:
                    storage = storages[id(cache)] = storage_of(cache)
                handle_facts.append({"handle": handle, "exists": True, "owned": is_owned(cache), "storage": storage})
            except Exception:  # noqa: BLE001 - see the docstring
                continue
        # The listing costs less than the request kvcheck would send for it.
        stored_ids = [str(id) for id in engine.stored_ids()]
        entry_facts: List[Dict[str, Any]] = []
        wanted = stored_ids if self._read_store else list(ids) + list(self._read_ids)
        if wanted:
            present = set(stored_ids)
            for entry_id in dict.fromkeys(wanted):
                if entry_id not in present:
                    continue
                try:
                    facts = self._entry_facts(entry_id, seen, True)
                except Exception:  # noqa: BLE001 - see the docstring
                    continue
                facts["id"] = entry_id
                entry_facts.append(facts)
        return {"handles": handle_facts, "entries": entry_facts, "stored_ids": stored_ids}

    def _look(self, cache: Cache, seen: Dict[int, Tuple[Dict[str, Any], List[int]]]):
        # One reading of an object per reply: a handle and an entry are
        # often the same object.
        found = seen.get(id(cache))
        if found is None:
            engine = self._session.engine
            found = (engine.view(cache), engine.storage(cache))
            seen[id(cache)] = found
        return found

    def _handle_facts(self, handle: int, seen) -> Dict[str, Any]:
        session = self._session
        cache = session.handles.get(handle)
        if cache is None:
            facts = {"exists": False, "owned": False, "storage": []}
        else:
            view, storage = self._look(cache, seen)
            facts = {"exists": True, "owned": session.engine.is_owned(cache), "view": view, "storage": storage}
        if session.metadata:
            facts["metadata"] = session.handle_metadata.get(handle, {})
        return facts

    def _entry_facts(self, id: str, seen, with_storage: bool) -> Dict[str, Any]:
        cache = self._stored(id)
        view, storage = self._look(cache, seen)
        facts = {"owned": self._session.engine.is_owned(cache), "view": view}
        if with_storage:
            facts["storage"] = storage
        if self._session.metadata:
            try:
                facts["metadata"] = self._entry_metadata(id)
            except Exception:  # noqa: BLE001 - left out: kvcheck asks entry_metadata, and gets the error
                pass
        return facts

    def _entry_metadata(self, id: str) -> Dict[str, str]:
        return {str(k): str(v) for k, v in dict(self._session.engine.entry_metadata(id)).items()}


def serve(factory: Callable[[], Adapter]) -> None:
    """Runs the protocol loop for engines made by `factory` (a subclass of
    Adapter, or any callable returning an instance): one at the handshake
    and one at each reset. Returns when kvcheck closes the pipes or asks
    to shut down. Run by hand (not by kvcheck), it says how to run it and
    exits with status 2."""
    connection = _protocol.Connection.from_environment()
    # What exists now (torch, numpy, the engine's modules) lives as long as
    # the process: the cyclic collector need not walk it again at every
    # full collection while requests are answered.
    gc.freeze()
    fork_fd = os.environ.get("KVCHECK_FORK_FD")
    if fork_fd:
        # A fork server: kvcheck's other adapter processes are copies of
        # this one (torch imported once); each copy returns here.
        # (A process running other threads serves as usual instead.)
        connection = _protocol.serve_forks(connection, int(fork_fd), Server(factory).handle)
        if connection is None:
            return
    server = Server(factory)
    # The handshake first: an engine that declares thread_safe has the
    # requests after it answered side by side.
    request = connection.receive()
    if request is None:
        return
    connection.send(_protocol.answer(server.handle, request))
    if request.get("op") == "shutdown":
        return
    if server.thread_safe:
        _threads.serve_side_by_side(connection, server.handle, server._switch_out)
    else:
        _protocol.serve_loop(connection, server.handle)


__all__ = ["Adapter", "Item", "Server", "RequestError", "capabilities_of", "derived_owned", "serve", "store_policy_of"]
