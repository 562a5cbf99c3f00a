"""Paged block managers checked by kvcheck: the base class an author maps
their manager's calls onto, and the shadow K/V store that gives a
metadata-only manager real memory (docs/protocol.md, "Paged requests";
docs/semantics.md#paged-caches).

A block manager (vLLM's KVCacheManager, SGLang's RadixCache, your own)
decides *where* K/V go: which blocks a sequence's table holds, which blocks
a prefix hit shares, when a block is copied, freed, published or evicted.
Most keep only that metadata; the K/V live in GPU memory that the model
writes. The SDK keeps that memory for them: a **shadow store** of N blocks
of B slots (per layer keys and values), indexed by block id, written by the
SDK's decoder (kvcheck_adapter.decoder, bit for bit kvcheck's C++ model)
through the block tables and copy instructions the manager reports. So the
content properties (prefix-hit-exact, hit-consumed, cow-exact,
published-immutable, paged-roundtrip) judge what the manager's decisions
would do to real memory: a hit on a reused block reads what the new owner
wrote there; a copy the manager forgot to ask for is not made.

The author implements nine calls (fork and import_sequence optional; a
tenth, rewind, optional too) and one
observation; everything else (decoding, the shadow store, pending writes
until the step, the K/V observations, the protocol) is the SDK's:

    from kvcheck_adapter.paged import BlockManagerAdapter, BlockKey, ManagerState, serve

    class MyAdapter(BlockManagerAdapter):
        name = "my-block-manager"
        num_blocks = 8          # N, block 0 (the null block) included
        block_tokens = 2        # B

        def __init__(self):
            self.manager = MyManager(self.num_blocks, self.block_tokens)

        def allocate(self, seq, tokens, extra):   # -> tokens found cached
            return self.manager.allocate(seq, tokens, extra)
        def append(self, seq, tokens):            # -> copies [(source, destination)]
            return self.manager.append(seq, tokens)
        def fork(self, parent, child):   self.manager.fork(parent, child)
        def free(self, seq):             self.manager.free(seq)
        def lookup(self, tokens, extra): return self.manager.lookup(tokens, extra)
        def evict(self):                 self.manager.evict()
        def reset_prefix_cache(self):    self.manager.reset_prefix_cache()
        def step(self, copies):          self.manager.step(copies)
        def import_sequence(self, seq, length): self.manager.allocate_unknown(seq, length)
        def rewind(self, seq, length):   return self.manager.rewind(seq, length)  # -> copies

        def state(self):
            m = self.manager
            return ManagerState(
                counts=[b.ref_cnt for b in m.blocks],
                keys={b.id: BlockKey(b.hash.parent, b.hash.tokens, b.hash.extra) for b in m.blocks if b.hash},
                index={BlockKey(h.parent, h.tokens, h.extra): ids for h, ids in m.cached.items()},
                free_queue=list(m.free_queue),
                tables={seq: list(t) for seq, t in m.tables.items()})

    if __name__ == "__main__":
        serve(MyAdapter)        # kvcheck run --adapter my_adapter.py

The contract of each call is in its docstring below; the shortest version:

- Sequences are small integers; `tokens` are lists of ints; `extra` is
  the sequence's extra keys as a string ("" or "salt-N"), part of every
  block key (vLLM's extra_keys, a LoRA name, a cache salt). The SDK's
  decoder mixes them into the K/V it computes, as a LoRA does: a hit on a
  block of other extra keys reads K/V computed for another request, which
  prefix-hit-exact and hit-consumed report.
- allocate, append, fork and import_sequence may refuse by raising (any
  exception: out of blocks, say). A refusal must leave the manager as it
  was (op-atomic checks the state before and after). The others must not
  raise.
- Writes are pending until `step` (the worker boundary): the SDK completes
  them first, then calls `step(copies)`, where the manager publishes the
  full blocks written since the last step (puts them in its prefix index)
  and drops the references its pending copies held on their sources.
- A reference count is the number of tables holding the block plus the
  pending copies reading it (refcount-exact). A block is in the free queue
  exactly when its count is 0 (free-iff-unreferenced); a free block may
  keep its key, hittable, until it is reused.
- A prefix hit ends on a block boundary before the last token (the model
  runs over one token at least); the SDK reads the K/V of the first
  `cached // block_tokens` blocks of the new table and computes the rest.

An adapter of a manager that holds the K/V itself (a C++ manager, or a
Python one with real tensors) overrides `block_kv` to report its own
memory instead of the shadow's (see its docstring).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Hashable, List, Optional, Sequence, Tuple

import torch

from . import cache as _cache
from . import content as _content
from . import decoder as _decoder
from . import wire as _wire
from .adapter import Adapter, RequestError, _field, serve

Copy = Tuple[int, int]
_U64 = (1 << 64) - 1
_MODELS: Dict[Any, _decoder.Decoder] = {}


class OutOfBlocks(RuntimeError):
    """What a manager may raise when the pool cannot hold an allocation,
    an append, a fork or an import (any exception is a refusal; this one
    says so plainly)."""


@dataclass(frozen=True)
class BlockKey:
    """A block's identity in the prefix index: its parent's identity (any
    hashable value: an int hash, bytes, a tuple, None for a sequence's first
    block), its tokens, its extra keys. Two keys are the same identity when
    all three are equal; the SDK reports the parent as an opaque 64-bit
    number (kvcheck compares keys only for equality)."""

    parent: Hashable
    tokens: Tuple[int, ...]
    extra: str = ""

    def __post_init__(self):
        object.__setattr__(self, "tokens", tuple(int(t) for t in self.tokens))


@dataclass
class ManagerState:
    """The manager's bookkeeping as it is now (what `state()` returns).

    counts:     the reference count of every block, by id, len == num_blocks
                (block 0, the null block, counts 0);
    keys:       block id -> its BlockKey, for every block that has an
                identity (published, or free but still cached);
    index:      BlockKey -> the blocks the prefix index maps it to, in the
                order a hit prefers them (duplicates of one key allowed);
    free_queue: the free blocks, front first (the next one taken);
    tables:     sequence -> its block table (block ids in token order)."""

    counts: Sequence[int]
    keys: Dict[int, BlockKey] = field(default_factory=dict)
    index: Dict[BlockKey, Sequence[int]] = field(default_factory=dict)
    free_queue: Sequence[int] = ()
    tables: Dict[int, Sequence[int]] = field(default_factory=dict)


def extra_of(salt: int) -> str:
    """A trace's salt as the extra keys string: "" for 0, else "salt-N"
    (as kvcheck's paged reference names it)."""
    return "" if salt == 0 else f"salt-{salt}"


def parent_number(parent: Hashable) -> int:
    """A key's parent as the opaque unsigned 64-bit number the protocol
    carries: an int modulo 2^64, bytes by their first 8 bytes (big-endian)
    mixed with their length, None as 0, anything else by a stable mix of
    its repr."""
    if parent is None:
        return 0
    if isinstance(parent, bool):
        return int(parent)
    if isinstance(parent, int):
        return parent & _U64
    if isinstance(parent, (bytes, bytearray)):
        return _content.splitmix64(int.from_bytes(bytes(parent[:8]).ljust(8, b"\0"), "big") ^ len(parent))
    number = 0
    for byte in repr(parent).encode():
        number = _content.splitmix64(number ^ byte)
    return number


class _Shadow:
    """The K/V memory of a metadata-only manager: per layer keys and values
    [N, heads, B, head_dim] float32, written (complete) and staged
    (pending until the step), and per block the tokens its filled slots hold
    and how many of them are written: kv::paged::Pool's memory without its
    bookkeeping."""

    def __init__(self, blocks: int, block_tokens: int, layers: int, heads: int, head_dim: int):
        self.blocks, self.block_tokens = blocks, block_tokens
        shape = (blocks, heads, block_tokens, head_dim)
        self.keys = [torch.zeros(shape) for _ in range(layers)]
        self.values = [torch.zeros(shape) for _ in range(layers)]
        self.staged_keys = [torch.zeros(shape) for _ in range(layers)]
        self.staged_values = [torch.zeros(shape) for _ in range(layers)]
        self.tokens: List[List[int]] = [[] for _ in range(blocks)]
        self.written = [0] * blocks
        # Bumped at every change of a block's slots: its digest is computed
        # once per version (the state reports every block's after each
        # operation).
        self.version = [0] * blocks
        self.digests: Dict[int, Tuple[int, int]] = {}

    def check(self, block: int) -> None:
        if not 0 < block < self.blocks:
            raise IndexError(f"block {block} is not a block of the pool (1 to {self.blocks - 1}; 0 is the null block)")

    def kv(self, block: int, slots: Optional[int] = None) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (keys, values) [1, heads, n, head_dim] of the block's
        first n filled slots (n = all of them unless `slots`), pending
        writes included."""
        filled = len(self.tokens[block])
        n = filled if slots is None else max(0, min(slots, filled))
        written = min(self.written[block], n)
        out = []
        for l in range(len(self.keys)):
            def side(main, staged):
                return torch.cat([main[block, :, :written], staged[block, :, written:n]], dim=1).unsqueeze(0)
            out.append((side(self.keys[l], self.staged_keys[l]), side(self.values[l], self.staged_values[l])))
        return out

    def stage(self, block: int, slot: int, kv: List[Tuple[torch.Tensor, torch.Tensor]], first: int, n: int) -> None:
        for l, (k, v) in enumerate(kv):
            self.staged_keys[l][block, :, slot:slot + n] = k[0, :, first:first + n]
            self.staged_values[l][block, :, slot:slot + n] = v[0, :, first:first + n]
        self.version[block] += 1
        # A write after the written slots ends makes the slots from there pending.
        self.written[block] = min(self.written[block], slot)

    def write(self, table: Sequence[int], cache, first: int, tokens: Sequence[int]) -> None:
        """Writes cache positions [first, first + len(tokens)) into the
        blocks of `table` (pending), with their tokens. Positions past the
        table's end are not written (hit-consumed reports the short table)."""
        b = self.block_tokens
        kv = [(_cache.logical_keys(cache, l), _cache.logical_values(cache, l)) for l in range(len(self.keys))]
        done = 0
        while done < len(tokens):
            position = first + done
            index, slot = divmod(position, b)
            run = min(b - slot, len(tokens) - done)
            if index >= len(table):
                return
            block = table[index]
            if 0 < block < self.blocks:
                self.stage(block, slot, kv, position, run)
                held = self.tokens[block][:slot]
                held += [-1] * (slot - len(held))
                self.tokens[block] = held + [int(t) for t in tokens[done:done + run]]
                self.version[block] += 1
            done += run

    def copy(self, source: int, destination: int) -> None:
        """Copy-on-write: the destination's pending slots become the
        source's filled slots (tokens and K/V, every layer)."""
        self.check(source)
        self.check(destination)
        filled = len(self.tokens[source])
        kv = self.kv(source)
        self.tokens[destination] = list(self.tokens[source])
        self.written[destination] = 0
        self.version[destination] += 1
        if filled:
            self.stage(destination, 0, kv, 0, filled)

    def cut(self, block: int, slots: int) -> None:
        """A rewind keeps the block's first `slots` filled slots."""
        if slots < len(self.tokens[block]):
            self.tokens[block] = self.tokens[block][:slots]
            self.written[block] = min(self.written[block], slots)
            self.version[block] += 1

    def step(self) -> None:
        for block in range(1, self.blocks):
            filled, done = len(self.tokens[block]), self.written[block]
            if done >= filled:
                continue
            for l in range(len(self.keys)):
                self.keys[l][block, :, done:filled] = self.staged_keys[l][block, :, done:filled]
                self.values[l][block, :, done:filled] = self.staged_values[l][block, :, done:filled]
            self.written[block] = filled
            self.version[block] += 1

    def storage(self) -> List[int]:
        return [t.data_ptr() for group in (self.keys, self.values, self.staged_keys, self.staged_values) for t in group]


def _cache_of(kv: List[Tuple[torch.Tensor, torch.Tensor]]) -> _cache.DynamicCache:
    made = _cache.DynamicCache()
    for l, (k, v) in enumerate(kv):
        made.update(k.clone(), v.clone(), l)
    return made


class _Sequence:
    __slots__ = ("tokens", "next", "extra")

    def __init__(self, tokens: List[int], next_token: int, extra: str = ""):
        self.tokens = tokens
        self.next = next_token
        self.extra = extra  # the request's extra keys: the decoder mixes them into its K/V


class BlockManagerAdapter(Adapter):
    """A paged block manager as kvcheck drives it (the module docstring has
    the example). Subclass it, set the pool's size, and implement the calls
    below on your manager; the SDK decodes, keeps the shadow K/V and answers
    every observation. The adapter is paged only: kvcheck checks the paged
    properties and reports the contiguous ones n/a (unless the subclass
    also implements the store's operations of Adapter, then both)."""

    #: N: the pool's blocks, the null block 0 included (>= 2). Small pools
    #: (8) fill in short traces, so that eviction and reuse happen.
    num_blocks: int = 8
    #: B: token slots per block.
    block_tokens: int = 2
    #: The model's geometry (the SDK's decoder; kvcheck's imports use 2
    #: layers of 2 heads of 4).
    layers: int = 2
    heads: int = 2
    head_dim: int = 4
    #: The model's attention window in tokens (sliding-window attention,
    #: docs/semantics.md#sliding-windows): a token at position P reads
    #: positions P - window + 1..P only. 0: full attention. With a window
    #: the manager may give back the blocks wholly behind a sequence's
    #: window (the first (L - window + 1) // block_tokens of a sequence of
    #: L tokens), putting the null block 0 in their place in its table (as
    #: vLLM's SlidingWindowManager does); the SDK reads the null block as
    #: zeros, which the window never reads.
    window: int = 0
    #: Where freed blocks join the free queue, whose front allocation takes
    #: (kvcheck's free-order property; docs/semantics.md, paged properties):
    #: "back" (FIFO), "front" (LIFO), "front-unhashed" (a block without a
    #: key to the front, one with a key to the back: vLLM's), "lru" (least
    #: recently used first: a block is used by each allocate, append, fork,
    #: rewind or import_sequence whose sequence's table holds it after it),
    #: or "unspecified" (no queue order: an eviction policy of the
    #: manager's own, which may drop a free block's key whenever blocks are
    #: taken). None declares nothing: unspecified.
    free_order: Optional[str] = None

    # ---- what the author implements: the manager's calls --------------------------

    def allocate(self, seq: int, tokens: List[int], extra: str) -> int:
        """A new sequence `seq` of `tokens` (non-empty): look its prefix up,
        share the hit blocks (out of the free queue when free), allocate the
        rest from the free queue, and put the table under `seq`. Return the
        number of tokens found cached (a multiple of block_tokens, less than
        len(tokens)). Raise to refuse (out of blocks), changing nothing. Do
        not publish the new blocks here: they are written at the step."""
        raise NotImplementedError(f"{type(self).__name__}.allocate")

    def append(self, seq: int, tokens: List[int]) -> Optional[Sequence[Copy]]:
        """`tokens` (decoded by the SDK) are appended to `seq`: grow its
        table as needed; a write into a block the sequence shares (count
        above 1) must first copy it: take a free block, put it in the table
        instead, keep a reference on the source for the pending copy (until
        step), and return the copies [(source, destination), ...]. Return
        None or [] when nothing was copied. Raise to refuse, changing
        nothing."""
        raise NotImplementedError(f"{type(self).__name__}.append")

    def fork(self, parent: int, child: int) -> None:
        """`child` (new) shares every block of `parent`. Raise to refuse
        (op-atomic judges that the refusal was needed). Optional: a manager
        without a fork leaves it out, claims `paged_fork` false, and is never
        asked one."""
        raise NotImplementedError(f"{type(self).__name__}.fork")

    def rewind(self, seq: int, length: int) -> Optional[Sequence[Copy]]:
        """`seq` keeps its first `length` tokens (>= 1; speculative decoding
        rejected the rest): blocks left empty leave its table, the last
        first, released as free releases them. Its last kept block, when
        partial now: held alone, it loses its key (and any publication
        pending for it: its tokens are no longer the key's); shared (count
        above 1), it is copied first as append copies (return the copies
        [(source, destination)]). Raise to refuse (no free block for the
        copy), changing nothing. Optional: a manager without it claims
        `paged_rewind` false and is never asked one."""
        raise NotImplementedError(f"{type(self).__name__}.rewind")

    def free(self, seq: int) -> None:
        """Ends `seq` (finished, preempted or aborted): its blocks' counts
        drop (the last block first); blocks at 0 join the free queue where
        `free_order` says, keeping their keys (hittable until taken again)."""
        raise NotImplementedError(f"{type(self).__name__}.free")

    def lookup(self, tokens: List[int], extra: str) -> int:
        """The tokens an allocate of `tokens` would find cached; read-only."""
        raise NotImplementedError(f"{type(self).__name__}.lookup")

    def evict(self) -> None:
        """Drops the identity (key and index entry) of every free block."""
        raise NotImplementedError(f"{type(self).__name__}.evict")

    def reset_prefix_cache(self) -> None:
        """Drops every identity; asked only when no sequence or pending copy
        holds a block."""
        raise NotImplementedError(f"{type(self).__name__}.reset_prefix_cache")

    def step(self, copies: List[Copy]) -> None:
        """The worker boundary. The SDK has completed every pending write;
        publish the blocks that became full since the last step (key them
        and put them in the prefix index), then drop the references that
        `copies` (the copies pending since the last step) held on their
        sources."""
        raise NotImplementedError(f"{type(self).__name__}.step")

    def import_sequence(self, seq: int, length: int) -> None:
        """A new sequence of `length` tokens whose K/V come from a
        contiguous cache (an activation memory) and whose tokens are unknown:
        allocate ceil(length / block_tokens) blocks for it, never published.
        Raise to refuse. Optional: a manager without it claims
        `paged_import` false and is never asked one."""
        raise NotImplementedError(f"{type(self).__name__}.import_sequence")

    def state(self) -> ManagerState:
        """The manager's bookkeeping now (ManagerState). Read-only."""
        raise NotImplementedError(f"{type(self).__name__}.state")

    # ---- optional: a manager that holds K/V itself ---------------------------------

    def block_kv(self, block: int, slots: Optional[int] = None) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (keys, values) [1, heads, n, head_dim] of the block's
        first n filled slots: the shadow store's. A manager holding real
        K/V overrides it (and block_tokens_of) to report its own memory."""
        return self._shadow_store().kv(block, slots)

    def block_tokens_of(self, block: int) -> List[int]:
        """The tokens the block's filled slots hold (-1: unknown)."""
        return list(self._shadow_store().tokens[block])

    # ---- the SDK's side ---------------------------------------------------------------

    def _shadow_store(self) -> _Shadow:
        shadow = self.__dict__.get("_paged_shadow")
        if shadow is None:
            if self.num_blocks < 2 or self.block_tokens < 1:
                raise ValueError(f"{type(self).__name__}: num_blocks must be >= 2 and block_tokens >= 1")
            shadow = _Shadow(self.num_blocks, self.block_tokens, self.layers, self.heads, self.head_dim)
            self.__dict__["_paged_shadow"] = shadow
            self.__dict__["_paged_sequences"] = {}
            self.__dict__["_paged_copies"] = []
            if self.window < 0:
                raise ValueError(f"{type(self).__name__}: window must be >= 0 (0: full attention)")
            config = _decoder.DecoderConfig(self.layers, self.heads, self.head_dim, 32, -1, 1, self.window)
            # One model per geometry for the process: it keeps no state
            # between calls, and making its weights costs a tenth of a trace.
            if config not in _MODELS:
                _MODELS[config] = _decoder.Decoder(config)
            self.__dict__["_paged_model"] = _MODELS[config]
        return shadow

    def _sequences(self) -> Dict[int, _Sequence]:
        self._shadow_store()
        return self.__dict__["_paged_sequences"]

    def _model(self) -> _decoder.Decoder:
        self._shadow_store()
        return self.__dict__["_paged_model"]

    def _pending_copies(self) -> List[Copy]:
        self._shadow_store()
        return self.__dict__["_paged_copies"]

    def _table(self, seq: int) -> List[int]:
        return [int(b) for b in self.state().tables.get(seq, ())]

    def _gather(self, table: Sequence[int], blocks: Optional[int] = None) -> _cache.DynamicCache:
        """The K/V read through `table` (its first `blocks` blocks), as a
        new cache: what the model reads."""
        made = _cache.DynamicCache()
        if self.window > 0:
            # Behind a window the null block stands for a released block: zeros.
            pieces = [self._null_kv() if b == 0 else self.block_kv(b) for b in list(table)[:blocks] if 0 <= b < self.num_blocks]
        else:
            pieces = [self.block_kv(b) for b in list(table)[:blocks] if 0 < b < self.num_blocks]
        pieces = [p for p in pieces if p and p[0][0].shape[2] > 0]
        if pieces:
            for l in range(self.layers):
                made.update(torch.cat([p[l][0] for p in pieces], dim=2), torch.cat([p[l][1] for p in pieces], dim=2), l)
        return made

    def _null_kv(self) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        shape = (1, self.heads, self.block_tokens, self.head_dim)
        return [(torch.zeros(shape), torch.zeros(shape)) for _ in range(self.layers)]

    def paged_alloc(self, seq: int, tokens: List[int], salt: int) -> int:
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("paged_alloc with no tokens")
        if seq in self._sequences():
            raise ValueError(f"paged_alloc: sequence {seq} exists")
        for token in tokens:  # the model's check, before the manager changes anything
            if not 0 <= token < self._model().config.vocab_size:
                raise ValueError(f"paged_alloc: token {token} outside [0, {self._model().config.vocab_size})")
        extra = extra_of(salt)
        cached = int(self.allocate(seq, list(tokens), extra))
        table = self._table(seq)
        b = self.block_tokens
        # The model reads the hit blocks, as the table names them, and runs
        # over the rest.
        start = max(0, min(cached, len(tokens) - 1))
        working = self._gather(table, start // b)
        have = working.get_seq_length(0)
        next_token = self._model().forward(tokens[have:], working, extra)
        self._shadow_store().write(table, working, start, tokens[start:])
        self._sequences()[seq] = _Sequence(list(tokens), next_token, extra)
        return cached

    def paged_append(self, seq: int, count: int) -> List[int]:
        sequence = self._sequences()[seq]
        if count < 1:
            raise ValueError(f"paged_append of {count} tokens")
        working = self._gather(self._table(seq))
        added, next_token = [], sequence.next
        for _ in range(count):
            added.append(next_token)
            next_token = self._model().forward([next_token], working, sequence.extra)
        copies = [(int(s), int(d)) for s, d in (self.append(seq, list(added)) or ())]
        shadow = self._shadow_store()
        for source, destination in copies:
            shadow.copy(source, destination)
        self._pending_copies().extend(copies)
        shadow.write(self._table(seq), working, len(sequence.tokens), added)
        sequence.tokens += added
        sequence.next = next_token
        return added

    def paged_fork(self, parent: int, child: int) -> None:
        if child in self._sequences():
            raise ValueError(f"paged_fork: sequence {child} exists")
        source = self._sequences()[parent]
        self.fork(parent, child)
        self._sequences()[child] = _Sequence(list(source.tokens), source.next, source.extra)

    def paged_rewind(self, seq: int, count: int, token: int) -> None:
        sequence = self._sequences()[seq]
        if count < 1:
            raise ValueError(f"paged_rewind of {count} tokens")
        if not 0 <= token < self._model().config.vocab_size:
            raise ValueError(f"paged_rewind: token {token} outside [0, {self._model().config.vocab_size})")
        kept = max(1, len(sequence.tokens) - count)
        if kept < len(sequence.tokens):
            copies = [(int(s), int(d)) for s, d in (self.rewind(seq, kept) or ())]
            shadow = self._shadow_store()
            for source, destination in copies:
                shadow.copy(source, destination)
            self._pending_copies().extend(copies)
            table = self._table(seq)
            b = self.block_tokens
            last = (kept - 1) // b
            if last < len(table) and 0 < table[last] < self.num_blocks:
                shadow.cut(table[last], kept - last * b)
            sequence.tokens = sequence.tokens[:kept]
        sequence.next = token

    def paged_free(self, seq: int) -> None:
        self.free(seq)
        self._sequences().pop(seq, None)

    def paged_lookup(self, tokens: List[int], salt: int) -> int:
        return int(self.lookup([int(t) for t in tokens], extra_of(salt)))

    def paged_evict(self) -> None:
        self.evict()

    def paged_reset(self) -> None:
        self.reset_prefix_cache()

    def paged_step(self) -> None:
        self._shadow_store().step()
        copies = list(self._pending_copies())
        self.step(copies)
        self._pending_copies().clear()

    def paged_import(self, seq: int, cache) -> None:
        if seq in self._sequences():
            raise ValueError(f"paged_import: sequence {seq} exists")
        length = -1
        if _content.cache_layout(cache) != "modern" or _cache.layer_count(cache) != self.layers:
            raise ValueError(f"paged_import needs a modern cache of {self.layers} layers")
        for l in range(self.layers):
            k, v = _cache.logical_keys(cache, l), _cache.logical_values(cache, l)
            if (k is None or v is None or k.dim() != 4 or k.shape != v.shape or k.shape[0] != 1 or k.shape[1] != self.heads
                    or k.shape[3] != self.head_dim or k.dtype != torch.float32 or v.dtype != torch.float32
                    or (length >= 0 and k.shape[2] != length)):
                raise ValueError(f"paged_import: layer {l} is not float32 keys and values of [1, {self.heads}, S, "
                                 f"{self.head_dim}] with one S in every layer")
            length = k.shape[2]
        if length < 1:
            raise ValueError("paged_import of a cache holding no tokens")
        self.import_sequence(seq, length)
        unknown = [-1] * length
        self._shadow_store().write(self._table(seq), cache, 0, unknown)
        self._sequences()[seq] = _Sequence(unknown, 1)

    def paged_export(self, seq: int) -> _cache.DynamicCache:
        if seq not in self._sequences():
            raise ValueError(f"paged_export: no sequence {seq}")
        return self._gather(self._table(seq))

    # ---- observations ---------------------------------------------------------------

    def paged_state_json(self) -> Dict[str, Any]:
        """The pool as the protocol reports it (docs/protocol.md, "Paged
        requests"): the manager's bookkeeping with the shadow's facts."""
        s = self.state()
        counts = [int(c) for c in s.counts]
        if len(counts) != self.num_blocks:
            raise ValueError(f"{type(self).__name__}.state(): counts has {len(counts)} entries for {self.num_blocks} blocks")
        blocks = []
        for b in range(self.num_blocks):
            tokens = self.block_tokens_of(b) if b > 0 else []
            entry: Dict[str, Any] = {"count": counts[b], "tokens": tokens,
                                     "written": self._written(b) if b > 0 else 0}
            key = s.keys.get(b)
            if key is not None:
                entry["key"] = _key_json(key)
            entry["digest"] = self._digest(b) if tokens else 0
            blocks.append(entry)
        sequences = self._sequences()
        return {
            "block_tokens": self.block_tokens,
            "blocks": blocks,
            "free_queue": [int(b) for b in s.free_queue],
            "index": [{"key": _key_json(key), "blocks": [int(b) for b in ids]} for key, ids in s.index.items()],
            "tables": [{"seq": int(seq), "blocks": [int(b) for b in table],
                        "tokens": list(sequences[seq].tokens) if seq in sequences else []}
                       for seq, table in sorted(s.tables.items())],
            "copies": [{"source": src, "destination": dst} for src, dst in self._pending_copies()],
            **({"window": int(self.window)} if self.window > 0 else {}),
        }

    def _digest(self, block: int) -> int:
        """The digest of the block's filled slots' view; the shadow's is
        computed once per change of the block."""
        if type(self).block_kv is not BlockManagerAdapter.block_kv:
            return _content.digest_of(_cache_of(self.block_kv(block)))
        shadow = self._shadow_store()
        known = shadow.digests.get(block)
        if known is None or known[0] != shadow.version[block]:
            known = (shadow.version[block], _content.digest_of(_cache_of(self.block_kv(block))))
            shadow.digests[block] = known
        return known[1]

    def _written(self, block: int) -> int:
        shadow = self._shadow_store()
        return min(shadow.written[block], len(shadow.tokens[block]))

    def paged_block_view(self, block: int, slots: int) -> Dict[str, Any]:
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"no block {block}")
        return _wire.view_json(_cache_of(self.block_kv(block, slots)))

    def paged_sequence_view(self, seq: int) -> Dict[str, Any]:
        return _wire.view_json(self._gather(self._table(seq)))

    def paged_fresh_view(self, tokens: List[int], first: int, count: int, salt: int = 0) -> Dict[str, Any]:
        if first < 0 or count < 0 or first + count > len(tokens):
            raise ValueError("paged_fresh_view: positions outside the tokens")
        fresh = _cache.DynamicCache()
        if tokens:
            self._model().forward([int(t) for t in tokens], fresh, extra_of(salt))
        part = _cache.DynamicCache()
        for l in range(len(fresh.layers)):
            k, v = _cache.logical_keys(fresh, l), _cache.logical_values(fresh, l)
            part.update(k[:, :, first:first + count].clone(), v[:, :, first:first + count].clone(), l)
        return _wire.view_json(part)

    def paged_pool_storage(self) -> List[int]:
        return self._shadow_store().storage()


def _key_json(key: BlockKey) -> Dict[str, Any]:
    if not isinstance(key, BlockKey):
        raise TypeError(f"a block key is a BlockKey, not {type(key).__name__}")
    return {"parent": parent_number(key.parent), "tokens": list(key.tokens), "extra": key.extra}


def is_paged(engine: Adapter) -> bool:
    return isinstance(engine, BlockManagerAdapter)


# ---- the protocol's paged requests (Server dispatches them here) ------------------------


def _int(request: Dict[str, Any], name: str) -> int:
    value = _field(request, name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise RequestError(f"request '{request.get('op')}': '{name}' is not an integer")
    return value


def _ints(request: Dict[str, Any], name: str) -> List[int]:
    value = _field(request, name, list)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise RequestError(f"request '{request.get('op')}': '{name}' is not a list of integers")
    return value


def _manager(engine: Adapter) -> BlockManagerAdapter:
    if not isinstance(engine, BlockManagerAdapter):
        raise RequestError(f"a paged request to {type(engine).__name__}, which is no BlockManagerAdapter "
                           "(its hello did not claim 'paged')")
    return engine


def _with_state(engine: BlockManagerAdapter, reply: Dict[str, Any]) -> Dict[str, Any]:
    reply["ok"] = True
    reply["state"] = engine.paged_state_json()
    return reply


def handle(engine: Adapter, request: Dict[str, Any]) -> Dict[str, Any]:
    """Answers one paged request (its "op" begins with "paged_") for
    `engine`. Every operation's reply carries the pool's state after it."""
    m = _manager(engine)
    op = request["op"]
    if op == "paged_alloc":
        cached = m.paged_alloc(_int(request, "seq"), _ints(request, "tokens"), _int(request, "salt"))
        return _with_state(m, {"cached": cached})
    if op == "paged_append":
        return _with_state(m, {"tokens": m.paged_append(_int(request, "seq"), _int(request, "count"))})
    if op == "paged_fork":
        m.paged_fork(_int(request, "parent"), _int(request, "child"))
        return _with_state(m, {})
    if op == "paged_free":
        m.paged_free(_int(request, "seq"))
        return _with_state(m, {})
    if op == "paged_lookup":
        return _with_state(m, {"cached": m.paged_lookup(_ints(request, "tokens"), _int(request, "salt"))})
    if op == "paged_evict":
        m.paged_evict()
        return _with_state(m, {})
    if op == "paged_reset":
        m.paged_reset()
        return _with_state(m, {})
    if op == "paged_step":
        m.paged_step()
        return _with_state(m, {})
    if op == "paged_import":
        cache = _wire.materialize(_wire.content_from_json(_field(request, "cache")))
        m.paged_import(_int(request, "seq"), cache)
        return _with_state(m, {})
    if op == "paged_rewind":
        m.paged_rewind(_int(request, "seq"), _int(request, "count"), _int(request, "token"))
        return _with_state(m, {})
    if op == "paged_export":
        exported = m.paged_export(_int(request, "seq"))
        return _with_state(m, {"view": _wire.view_json(exported), "storage": _wire.storage_of(exported)})
    if op == "paged_state":
        return {"ok": True, "state": m.paged_state_json()}
    if op == "paged_block_view":
        return {"ok": True, "view": m.paged_block_view(_int(request, "block"), _int(request, "slots"))}
    if op == "paged_sequence_view":
        return {"ok": True, "view": m.paged_sequence_view(_int(request, "seq"))}
    if op == "paged_fresh_view":
        salt = _int(request, "salt") if "salt" in request else 0  # kvcheck before extra keys mattered sent none
        return {"ok": True, "view": m.paged_fresh_view(_ints(request, "tokens"), _int(request, "first"), _int(request, "count"), salt)}
    if op == "paged_pool_storage":
        return {"ok": True, "storage": m.paged_pool_storage()}
    raise RequestError(f"unknown paged request {op!r}")


REQUESTS = ("paged_alloc", "paged_append", "paged_fork", "paged_free", "paged_lookup", "paged_evict", "paged_reset",
            "paged_step", "paged_import", "paged_export", "paged_rewind", "paged_state", "paged_block_view", "paged_sequence_view",
            "paged_fresh_view", "paged_pool_storage")

__all__ = ["BlockManagerAdapter", "BlockKey", "ManagerState", "OutOfBlocks", "extra_of", "parent_number", "serve"]
