"""Copy accounting without the engine's cooperation: which K/V copies an
engine operation makes, and how many K/V sets are alive along a generation.

The C++ reference logs every deliberate copy through kv::Copier (one event
per cache copied, with its bytes) and counts the K/V sets alive on a
generation's path from the copies' lineage (kv::live_sets_on_path, sampled
by run_model before the first forward and after each). A Python engine logs
nothing; this module observes the same facts from below, with a torch
dispatch mode that sees every tensor operator the engine runs.

K/V set, in Python terms: the tensor storages that together hold one copy
of some keys and values. Either
  - an *original*: the storages of a cache registered with
    CopyTracker.track (what a store holds: the caches given to `add`, and
    those a `load` made); or
  - a *copy*: the storages written by the copy operators of one recording
    (one engine operation) at one depth of copying: the copies of tracked
    tensors made before the recording are depth 1, copies of those made in
    the same recording depth 2, and so on. Each source region (a storage
    and the elements of it a tensor views) is copied into a set at most
    once: copying it again at the same depth begins a new set (two clones
    in one operation are two sets); tensors packed into one storage (an
    arena, a pool) are distinct regions, so copying each once is one set.
The model's appends continue a set: after a model forward, a slot of the
cache whose tensor the model replaced (update rebinds a slot to the cat of
its tensor with the new tokens) belongs to the set its tensor belonged to
before the forward. The dispatch mode is paused while a model forward runs
(when it is the innermost mode), so that the model's own operators, a few
dozen per forward, cost nothing here; the slots are compared at the
forward's exit instead. A set is alive while any of its storages is alive (a weak reference
to the storage, so tracking never keeps K/V alive). A copy's lineage is the
sets it was copied from (level 0), the sets those were copied from (level
1), and so on: sets_on_path(cache) is 1 (the cache itself) plus the number
of lineage levels of its sets with a live member, as C++'s
live_sets_on_path, and the peak over a recording is sampled at the entry
and exit of each model forward (decoder.Decoder marks its forwards with
model_forward).

What counts as a copy: an operator that writes the values of tracked
tensors into a storage of another set, outside a model forward, when every
non-empty tensor it copies from is tracked (a cat of a stored tensor with
tokens the engine made itself is an append, not a copy):
  clone              clone(), contiguous() of a non-contiguous tensor,
                     copy.deepcopy of a cache (through storage copies);
  _to_copy           to(dtype or device), float(), half(), new_tensor();
  copy_              copy into an existing tensor: empty_like(x).copy_(x),
                     slice assignment, storage copies;
  cat, stack         merges; a cat of one part is a copy too;
  index_select, index, gather, take, masked_select, repeat
                     copies of selected or repeated rows;
  index_copy(_), index_put(_)
                     writes of tracked values into a buffer (in place:
                     the values' bytes, the rows written);
  any other *_copy   functional copies (narrow_copy, slice_copy, ...).
Each is logged with the bytes it wrote (the output's size in its dtype).
What does not count: views (they share the storage: the same set),
arithmetic (a computation is not a copy), anything inside a model forward
(the model's appends, its float32 read-back of a bfloat16 cache, its new
tokens' K/V: the model writes, it does not copy the store), and copies of
untracked tensors (what the tracker was never told is K/V). A copy of a
cache that holds no K/V element moves no byte, so no operator shows it:
adapter.py accounts for those from the objects an operation hands back.

    tracker = CopyTracker()
    tracker.track(stored_cache)                  # an original
    with tracker.record() as recording:          # one engine operation
        out = store.get_cache(["a"])
    recording.copies                             # one SetCopy, its bytes
    with tracker.record() as recording:
        store.generate(out, [7, 3], 8)
    recording.copies == [], recording.peak_sets_on_path == 2

Observe caches (content.view_of, observe.storage_of) outside a recording:
view_of converts a non-float32 slot to hash it, which a recording would
see as a copy. One recording at a time, on one thread.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode as _current_dispatch_mode

try:
    from torch.utils.weak import StorageWeakRef
except ImportError:  # torch 1.13
    from torch.multiprocessing.reductions import StorageWeakRef

from . import content as _content


_HAS_UNTYPED_STORAGE = hasattr(torch.Tensor, "untyped_storage")
_has_torch_function_unary = torch._C._has_torch_function_unary


def _untyped_storage(tensor: torch.Tensor):
    if _HAS_UNTYPED_STORAGE:
        return tensor.untyped_storage()
    if not _has_torch_function_unary(tensor):
        # What .storage() wraps, without building the TypedStorage
        # around it (a sixth of the cost); a tensor with a
        # __torch_function__ override (a subclass, an active mode) still
        # goes through .storage().
        return tensor._storage()
    return tensor.storage()._storage


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


@dataclass(frozen=True)
class TensorCopy:
    """One copy operator: its name, the bytes it wrote, the sets it read
    from and the set it wrote into (set ids)."""

    op: str
    bytes: int
    sources: Tuple[int, ...]
    target: int


@dataclass
class SetCopy:
    """One K/V set made by copying (C++ CopyEvent): the sets it was copied
    from, the copy operators that wrote it and their bytes."""

    set_id: int
    sources: Tuple[int, ...]
    tensors: int = 0
    bytes: int = 0


class _KvSet:
    """A K/V set: its storages and cache objects (weakly) and the sets it
    was copied from."""

    __slots__ = ("set_id", "storages", "objects", "sources", "__weakref__")

    def __init__(self, set_id: int, sources: Sequence["_KvSet"] = ()):
        self.set_id = set_id
        self.storages: List[StorageWeakRef] = []
        self.objects: List[weakref.ref] = []
        self.sources: List[_KvSet] = list(sources)

    def alive(self) -> bool:
        # Dead storages are dropped on the way: a working set gains two
        # storages per layer per model step, and loses as many.
        self.storages = [storage for storage in self.storages if not storage.expired()]
        if self.storages:
            return True
        self.objects = [reference for reference in self.objects if reference() is not None]
        return bool(self.objects)

    def add_sources(self, sources: Sequence["_KvSet"]) -> None:
        for source in sources:
            if source is not self and all(source is not known for known in self.sources):
                self.sources.append(source)


@dataclass
class Recording:
    """What one recorded operation did: the K/V sets it made by copying
    (in order), each copy operator, and the most K/V sets alive on the path
    of the cache a model wrote into (0 when no model ran)."""

    copies: List[SetCopy] = field(default_factory=list)
    tensor_copies: List[TensorCopy] = field(default_factory=list)
    peak_sets_on_path: int = 0
    model_forwards: int = 0

    @property
    def bytes_copied(self) -> int:
        return sum(copy.bytes for copy in self.copies)


# ---- which operators copy, and what they copy from --------------------------------


def _arg(index: int, name: str) -> Callable[[tuple, dict], object]:
    def get(args: tuple, kwargs: dict):
        if len(args) > index:
            return args[index]
        return kwargs.get(name)

    return get


def _tensors(value) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for t in value if isinstance(t, torch.Tensor)]
    return []


_SELF = _arg(0, "self")
# Operator name -> (what it copies from, where it writes: None = its output).
_COPY_OPS: Dict[str, Tuple[Callable, Optional[Callable]]] = {
    "clone": (_SELF, None),
    "_to_copy": (_SELF, None),
    "copy_": (_arg(1, "src"), _SELF),
    "copy": (_arg(1, "src"), None),
    "cat": (_arg(0, "tensors"), None),
    "stack": (_arg(0, "tensors"), None),
    "index_select": (_SELF, None),
    "index": (_SELF, None),
    "gather": (_SELF, None),
    "take": (_SELF, None),
    "masked_select": (_SELF, None),
    "repeat": (_SELF, None),
    "index_copy": (_arg(3, "source"), None),
    "index_copy_": (_arg(3, "source"), _SELF),
    "index_put": (_arg(2, "values"), None),
    "index_put_": (_arg(2, "values"), _SELF),
}


# The in-place writes of given values into selected rows of a buffer.
_INDEXED_WRITES = frozenset(("index_copy_", "index_put_"))


def _copy_rule(name: str) -> Optional[Tuple[Callable, Optional[Callable]]]:
    rule = _COPY_OPS.get(name)
    if rule is None and name.endswith("_copy"):
        return (_SELF, None)
    return rule


# ---- the tracker ----------------------------------------------------------------------

# The trackers recording now (at most one), for model_forward.
_RECORDING: List["CopyTracker"] = []


class CopyTracker:
    """Tracks K/V sets across operations; records one operation at a time."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        # Storage (its StorageImpl address, stable while a weak reference to
        # it is held) -> (set, weak reference). Entries of dead storages are
        # dropped on sight and swept when the table has doubled.
        self._storages: Dict[int, Tuple[_KvSet, StorageWeakRef]] = {}
        self._sweep_at = 1024
        self._recording: Optional[Recording] = None
        # depth -> (set, the source regions copied into it -> the rows each went to)
        self._open: Dict[int, Tuple[_KvSet, Dict[tuple, Set[Optional[tuple]]]]] = {}
        self._made_here: Dict[int, int] = {}  # set id -> depth, for the sets this recording made
        self._set_copies: Dict[int, SetCopy] = {}
        self._model_depth = 0
        self._mode: Optional[_CopyMode] = None  # the dispatch mode of the recording
        # Cache object (its id) -> (set, weak reference): the objects that
        # are set members themselves (_register).
        self._objects: Dict[int, Tuple[_KvSet, weakref.ref]] = {}
        self._objects_sweep_at = 1024

    # ---- sets and storages ----

    def _key(self, tensor: torch.Tensor) -> int:
        return _untyped_storage(tensor)._cdata

    def set_of_tensor(self, tensor: Optional[torch.Tensor]) -> Optional[_KvSet]:
        """The live set a tensor's storage belongs to, if any (empty: none)."""
        if tensor is None or tensor.numel() == 0:
            return None
        key = self._key(tensor)
        entry = self._storages.get(key)
        if entry is None:
            return None
        if entry[1].expired():
            del self._storages[key]
            return None
        return entry[0]

    def _join(self, tensor: torch.Tensor, kv_set: _KvSet) -> None:
        if tensor.numel() == 0:
            return
        storage = _untyped_storage(tensor)
        key = storage._cdata
        entry = self._storages.get(key)
        if entry is not None and entry[0] is kv_set and not entry[1].expired():
            return
        reference = StorageWeakRef(storage)
        self._storages[key] = (kv_set, reference)
        kv_set.storages.append(reference)
        if len(self._storages) >= self._sweep_at:
            self._sweep()

    def _sweep(self) -> None:
        self._storages = {key: entry for key, entry in self._storages.items() if not entry[1].expired()}
        self._sweep_at = max(1024, 2 * len(self._storages))

    def _register(self, cache, kv_set: _KvSet) -> None:
        """Makes the cache object itself a member of `kv_set`: a cache that
        holds no K/V element is a set by its object alone (C++ counts
        lineage by cache objects, and an empty one is alive as long as it
        is)."""
        reference = weakref.ref(cache)
        self._objects[id(cache)] = (kv_set, reference)
        kv_set.objects.append(reference)
        if len(self._objects) >= self._objects_sweep_at:
            self._objects = {key: entry for key, entry in self._objects.items() if entry[1]() is not None}
            self._objects_sweep_at = max(1024, 2 * len(self._objects))

    def set_of_object(self, cache) -> Optional[_KvSet]:
        """The set a cache object was registered with, if it is alive."""
        entry = self._objects.get(id(cache))
        if entry is None or entry[1]() is not cache:
            return None
        return entry[0]

    def sets_of(self, cache, tensor_sets: Optional[List[Optional[_KvSet]]] = None) -> List[_KvSet]:
        """The sets a cache belongs to: its object's, then its tensors'.
        `tensor_sets`: those of its tensors, when the caller has looked
        them up already (set_of_tensor of each slot, None for none)."""
        if tensor_sets is None:
            tensor_sets = [self.set_of_tensor(t) for t in _cache_tensors(cache)]
        found = [self.set_of_object(cache)] + tensor_sets
        return _unique(s for s in found if s is not None)

    def track(self, cache) -> int:
        """Registers a cache, its object and every tensor it holds, as one
        original K/V set (its earlier lineage, if it was a copy, is
        forgotten: it is what the store holds now, as C++'s Store::add
        clears it). Returns the set id."""
        kv_set = _KvSet(next(self._ids))
        self._register(cache, kv_set)
        for tensor in _cache_tensors(cache):
            self._join(tensor, kv_set)
        return kv_set.set_id

    def adopt(self, cache) -> None:
        """A cache the model wrote into, handed to the caller (a returned
        cache): its tensors in no set (those a model made on a fresh cache,
        or appended to slots that held no element) join the set of the
        cache object, or of its first tensor in a set; a cache with none
        becomes an original. A copy of it is then a copy of K/V, as C++
        counts every cache the model made."""
        found = self.sets_of(cache)
        if found:
            kv_set = found[0]
        else:
            kv_set = _KvSet(next(self._ids))
        if self.set_of_object(cache) is None:
            self._register(cache, kv_set)
        for tensor in _cache_tensors(cache):
            if self.set_of_tensor(tensor) is None:
                self._join(tensor, kv_set)

    def _source_set(self, cache) -> _KvSet:
        """The set that stands for `cache` as a source of a copy: its
        object's or its first tensor's; a cache in no set is registered as
        an original."""
        found = self.sets_of(cache)
        if found:
            return found[0]
        kv_set = _KvSet(next(self._ids))
        self._register(cache, kv_set)
        return kv_set

    def note_copy(self, result, sources: Sequence[object], zero_bytes: bool) -> None:
        """Tells the tracker, after an operation under record(), that the
        cache object `result` is a copy of the cache objects `sources`: the
        sets this recording made that hold its tensors descend from the
        sources' sets, and so does the object itself. `zero_bytes`: no
        tensor was copied (the sources hold no K/V element), so the object
        alone is the new set."""
        source_sets = [self._source_set(source) for source in sources if source is not None]
        made = [s for s in self.sets_of(result) if s.set_id in self._made_here]
        if not made and zero_bytes:
            made = [_KvSet(next(self._ids))]
            self._made_here[made[0].set_id] = 1
        for kv_set in made:
            kv_set.add_sources(source_sets)
        if made and self.set_of_object(result) is None:
            self._register(result, made[0])

    def set_id(self, tensor: Optional[torch.Tensor]) -> Optional[int]:
        kv_set = self.set_of_tensor(tensor)
        return None if kv_set is None else kv_set.set_id

    # ---- the path of a generation ----

    def sets_on_path(self, cache, tensor_sets: Optional[List[Optional[_KvSet]]] = None) -> int:
        """1 (the cache) plus the number of lineage levels of the cache's
        sets with a live member (C++ live_sets_on_path); for a cache holding
        tensors of several sets, the set with the most such levels counts.
        `tensor_sets`: as for sets_of."""
        sets = {id(s): s for s in self.sets_of(cache, tensor_sets)}
        most = 0
        for kv_set in sets.values():
            # Level by level as C++ Copier::record builds a lineage: a set
            # reached by two paths of different lengths is at both levels
            # (the sets only ever come from older ones: no cycle).
            live, level = 0, _unique(kv_set.sources)
            while level:
                if any(source.alive() for source in level):
                    live += 1
                level = _unique(source for member in level for source in member.sources)
            most = max(most, live)
        return 1 + most

    # ---- recording ----

    @contextlib.contextmanager
    def record(self) -> Iterator[Recording]:
        """Records the copies made and the K/V sets alive while the block
        runs (one engine operation)."""
        if _RECORDING:
            raise RuntimeError("a CopyTracker is already recording: one recording at a time")
        recording = Recording()
        self._recording = recording
        self._open.clear()
        self._made_here.clear()
        self._set_copies = {}
        _RECORDING.append(self)
        try:
            with _CopyMode(self) as mode:
                self._mode = mode
                yield recording
        finally:
            self._mode = None
            _RECORDING.remove(self)
            self._recording = None
            self._open.clear()
            # _made_here stays until the next recording: note_copy reads it.

    def _sample(self, cache, tensor_sets: Optional[List[Optional[_KvSet]]] = None) -> None:
        recording = self._recording
        if recording is not None:
            recording.peak_sets_on_path = max(recording.peak_sets_on_path, self.sets_on_path(cache, tensor_sets))

    def _copy_target(
        self, sources: List[_KvSet], source_keys: List[tuple], rows: Optional[tuple] = None
    ) -> _KvSet:
        """The set a copy from `sources` writes into (see the module doc).
        K/V read again start a new copy, but for an indexed write (`rows`:
        the target storage and the rows it writes) into other rows of the
        same buffer that the copy wrote them into: a merge filling a
        StaticCache's buffer part by part, one part repeated."""
        depth = 1 + max((self._made_here.get(s.set_id, 0) for s in sources), default=0)
        opened = self._open.get(depth)
        if opened is None or any(self._read_again(opened[1], key, rows) for key in source_keys):
            kv_set = _KvSet(next(self._ids))
            opened = (kv_set, {})
            self._open[depth] = opened
            self._made_here[kv_set.set_id] = depth
            copy = SetCopy(kv_set.set_id, ())
            self._set_copies[kv_set.set_id] = copy
            self._recording.copies.append(copy)
        kv_set, copied = opened
        for key in source_keys:
            copied.setdefault(key, set()).add(rows)
        for source in sources:
            if all(source is not known for known in kv_set.sources):
                kv_set.sources.append(source)
        copy = self._set_copies[kv_set.set_id]
        copy.sources = tuple(s.set_id for s in kv_set.sources)
        return kv_set

    @staticmethod
    def _read_again(copied: Dict[tuple, Set[Optional[tuple]]], key: tuple, rows: Optional[tuple]) -> bool:
        # Was `key` copied before, other than into other rows of this buffer?
        writes = copied.get(key)
        if not writes:
            return False
        return rows is None or rows in writes or any(w is None or w[0] != rows[0] for w in writes)

    def _observe(self, name: str, args: tuple, kwargs: dict, result) -> None:
        rule = _copy_rule(name)
        if rule is None:
            return
        read, written = rule
        sources = [t for t in _tensors(read(args, kwargs)) if t.numel() > 0]
        target = written(args, kwargs) if written is not None else result
        if not sources or not isinstance(target, torch.Tensor) or target.numel() == 0:
            return
        source_sets = [self.set_of_tensor(t) for t in sources]
        tracked = [s for s in source_sets if s is not None]
        if not tracked:
            return
        if self._model_depth > 0 or len(tracked) < len(source_sets):
            # An append (the model's, or tracked K/V joined with new
            # tokens): the result continues the set it extends; a model's
            # other operators (its read-back conversions) make temporaries.
            if name == "cat":
                self._join(target, tracked[0])
            return
        rows = _rows_written(name, args, kwargs, target, self._key) if name in _INDEXED_WRITES else None
        kv_set = self._copy_target(_unique(tracked), [_region(self._key(t), t) for t in sources], rows)
        self._join(target, kv_set)
        copy = self._set_copies[kv_set.set_id]
        copy.tensors += 1
        # An in-place indexed write fills only the rows it is given (a
        # StaticCache's update writes its new tokens into a buffer of
        # max_cache_len): it wrote its values' bytes, not its target's.
        wrote = sum(_nbytes(t) for t in sources) if name in _INDEXED_WRITES else _nbytes(target)
        copy.bytes += wrote
        self._recording.tensor_copies.append(
            TensorCopy(name, wrote, tuple(s.set_id for s in _unique(tracked)), kv_set.set_id)
        )


def _region(storage_key: int, tensor: torch.Tensor) -> Tuple[int, int, Tuple[int, ...], Tuple[int, ...]]:
    """What a copy reads from: the storage and the elements of it the
    tensor views. Tensors packed into one storage (an arena, a pool) are
    distinct sources: copying each of them once is one copy of the K/V,
    not a copy per tensor (copies are counted by what was written)."""
    return (storage_key, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))


def _rows_written(name: str, args: tuple, kwargs: dict, target: torch.Tensor, key) -> tuple:
    """The target storage and the rows an indexed write fills:
    index_copy_(dim, index, source), index_put_(indices, values)."""
    where = (target.storage_offset(), tuple(target.shape), tuple(target.stride()))
    if name == "index_copy_":
        index = _arg(2, "index")(args, kwargs)
        return (key(target), where, int(_arg(1, "dim")(args, kwargs)), tuple(index.reshape(-1).tolist()))
    indices = _arg(1, "indices")(args, kwargs) or ()
    return (key(target), where, tuple(None if i is None else tuple(i.reshape(-1).tolist()) for i in indices))


def _unique(sets) -> List[_KvSet]:
    seen: Dict[int, _KvSet] = {}
    for kv_set in sets:
        seen.setdefault(id(kv_set), kv_set)
    return list(seen.values())


def _cache_tensors(cache) -> List[torch.Tensor]:
    layout = _content.cache_layout(cache)
    if layout == "legacy":
        held = list(cache.key_cache) + list(cache.value_cache)
    else:
        held = [getattr(layer, name, None) for layer in cache.layers for name in _content.SLOT_NAMES]
    return [t for t in held if isinstance(t, torch.Tensor)]


class _CopyMode(TorchDispatchMode):
    def __init__(self, tracker: CopyTracker):
        super().__init__()
        self._tracker = tracker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if _copy_rule(name) is not None:
            self._tracker._observe(name, args, kwargs, result)
        return result

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch 2.x wraps a mode's __torch_dispatch__ in torch._dynamo.disable
        # unless this says False: an import of torch._dynamo (with sympy:
        # 1.5 s of CPU) at the first operator, in each adapter process, and
        # about a µs more per operator. Nothing is lost without it: Dynamo
        # compiles no frame while a mode of ours is on the stack (it skips
        # them: "non-infra torch dispatch mode present"). torch 1.13 never
        # asks.
        return False


_NO_MODEL = contextlib.nullcontext()


def _slot_entries(cache) -> List[Tuple[Tuple[object, object], object]]:
    """(location, held) of every slot of a cache: the location (holder, key)
    is a modern layer object and an attribute name, or a legacy list and an
    index; held is what the slot holds (a modern slot's only if a tensor)."""
    if _content.cache_layout(cache) == "legacy":
        keys, values = cache.key_cache, cache.value_cache
        return [((keys, i), held) for i, held in enumerate(keys)] + [
            ((values, i), held) for i, held in enumerate(values)
        ]
    entries = []
    for layer in cache.layers:
        for name in _content.SLOT_NAMES:
            held = getattr(layer, name, None)
            entries.append(((layer, name), held if isinstance(held, torch.Tensor) else None))
    return entries


def _slot_at(location) -> Optional[torch.Tensor]:
    holder, key = location
    if isinstance(holder, list):
        return holder[key] if key < len(holder) else None
    held = getattr(holder, key, None)
    return held if isinstance(held, torch.Tensor) else None


def _pause_mode(mode: Optional["_CopyMode"]) -> bool:
    """Pops `mode` off the dispatch mode stack if it is the innermost one;
    True when it did (resume it then)."""
    if mode is None or _current_dispatch_mode() is not mode:
        return False
    mode.__exit__(None, None, None)
    return True


class _ModelForward:
    """One model forward under a recording (model_forward). Each slot's set
    is looked up once at the entry (for the sample and for the appends) and
    once at the exit (the appends joined first, then the sample)."""

    __slots__ = ("_tracker", "_cache", "_before", "_paused")

    def __init__(self, tracker: CopyTracker, cache) -> None:
        self._tracker = tracker
        self._cache = cache
        self._before: List[Tuple[Tuple[object, object], _KvSet]] = []
        self._paused = False

    def __enter__(self) -> None:
        tracker, cache = self._tracker, self._cache
        entries = _slot_entries(cache)
        sets = [tracker.set_of_tensor(held) for _, held in entries]
        tracker._sample(cache, sets)
        self._before = [(location, kv_set) for (location, _), kv_set in zip(entries, sets) if kv_set is not None]
        tracker._model_depth += 1
        self._paused = _pause_mode(tracker._mode)

    def __exit__(self, *exception) -> bool:
        tracker, cache = self._tracker, self._cache
        if self._paused:
            tracker._mode.__enter__()
        tracker._model_depth -= 1
        # The model's appends continue the sets of the slots they extend.
        known: Dict[int, Tuple[torch.Tensor, _KvSet]] = {}
        for location, kv_set in self._before:
            held = _slot_at(location)
            if held is not None and held.numel() > 0:
                found = tracker.set_of_tensor(held)
                if found is None:
                    tracker._join(held, kv_set)
                    found = kv_set
                known[id(held)] = (held, found)
        if tracker._recording is not None:
            tracker._recording.model_forwards += 1
        sets = []
        for _, held in _slot_entries(cache):
            seen = known.get(id(held))
            sets.append(seen[1] if seen is not None and seen[0] is held else tracker.set_of_tensor(held))
        tracker._sample(cache, sets)
        return False


def model_forward(cache):
    """Marks one model forward over `cache` (the cache the model writes
    into): inside it nothing counts as a copy, and the K/V sets on the
    cache's path are sampled at its entry and exit. Free when nothing is
    recording."""
    if not _RECORDING:
        return _NO_MODEL
    return _ModelForward(_RECORDING[0], cache)
