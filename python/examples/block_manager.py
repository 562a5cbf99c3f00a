"""An example paged block manager, vLLM-like (v1's KVCacheManager and
BlockPool): metadata only, no tensors. kvcheck checks it through
block_manager_adapter.py, whose SDK base class keeps the K/V the model
would write into real memory (kvcheck_adapter.paged, the shadow store).

What it keeps:
  - a pool of N blocks (block 0 is the null block, never handed out), each
    with a reference count and at most one hash (its identity);
  - a block table and the tokens of each sequence;
  - a prefix index: hash -> the blocks cached under it (a hash is the chain
    of the parent block's hash, the block's tokens and the extra keys);
  - a free queue: freed blocks join the back (or, with free_order="lifo",
    the front: the block freed last is taken first) and keep their hash
    (still hittable) until allocation takes them from the front, which
    evicts the hash;
  - copy-on-write: a write into a block shared with another sequence first
    copies it into a fresh block (the copy holds a reference on its source
    until the worker step);
  - publication at the worker step: a block filled by a request is hashed
    and indexed only once its K/V are written.

Historic bugs of real managers, each switchable by name (BUGS; the
property kvcheck catches it with in BUG_PROPERTIES):
  reuse_keeps_index      a block taken from the free queue for reuse stays
                         in the prefix index under its old hash
  free_no_decrement      a finished request's blocks are never released
  weak_hash              blocks matched by a weak hash (parent, extra keys,
                         the sum of the tokens) with no token check
  cow_by_reference       copy-on-write hands back the shared block itself:
                         the append writes into memory another sequence reads
  hit_not_attached       a hit reports its cached tokens but the table gets
                         fresh blocks, not the cached ones

Used by several clients at once (its adapter declares thread_safe), every
public call holds the manager's lock (`lock`: a kvcheck_adapter.Lock in the
adapter, so that the SDK's scheduler sees it); a release reads a block's
count, pauses (`pause`: kvcheck_adapter.yield_point, where another client
may run) and stores it. Its thread bug (THREAD_BUGS):
  unlocked_free          free runs without the lock: another client's hit,
                         fork or free of a block between the release's read
                         and store of its count is lost (a block held with
                         a count too low, or given back while held)

    manager = BlockManager(8, 2)
    manager.allocate(1, [5, 9, 2], "")      # 0 cached; blocks 1 and 2
    manager.step([])                        # block 1 published
    manager.allocate(2, [5, 9, 7], "")      # 2 cached: block 1 shared
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from typing import Callable, ContextManager, Dict, List, Optional, Sequence, Tuple

FREE_ORDERS = ("fifo", "lifo")

BUGS = ("reuse_keeps_index", "free_no_decrement", "weak_hash", "cow_by_reference", "hit_not_attached")

# The property kvcheck names for each bug: the one a shrunk trace breaks
# first (kvcheck blames a trace on the first property it breaks; the others
# show as "also:"). cow_by_reference also breaks cow-exact, hit_not_attached
# hit-consumed (and op-atomic: its room check counts the hits it does not
# attach).
BUG_PROPERTIES = {
    "reuse_keeps_index": "index-consistent",
    "free_no_decrement": "refcount-exact",
    "weak_hash": "prefix-hit-exact",
    "cow_by_reference": "published-immutable",
    "hit_not_attached": "prefix-hit-exact",
}

# The bug of a manager used by several clients at once, and the property
# the thread level catches it with (kvcheck's thread level, over several
# requests in flight: docs/semantics.md#the-thread-level). One client, or
# each call atomic (the operation level), never sees it.
THREAD_BUGS = ("unlocked_free",)
THREAD_BUG_PROPERTIES = {
    "unlocked_free": "refcount-exact",
}

_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def chain_hash(parent: int, tokens: Sequence[int], extra: str) -> int:
    """A block's hash: its parent's hash, its tokens, its extra keys
    (deterministic across processes, unlike Python's hash of a str)."""
    h = _mix(parent ^ 0x5EED)
    for token in tokens:
        h = _mix(h ^ (token & _MASK))
    for byte in extra.encode():
        h = _mix(h ^ byte)
    return _mix(h ^ len(extra))


class OutOfBlocks(RuntimeError):
    pass


def _locked(method):
    """A public call of the manager: it holds the manager's lock (free
    under the bug unlocked_free does not)."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if method.__name__ == "free" and "unlocked_free" in self.bugs:
            return method(self, *args, **kwargs)
        with self._lock:
            return method(self, *args, **kwargs)

    return call


class Block:
    __slots__ = ("id", "ref_cnt", "hash", "identity", "epoch")

    def __init__(self, block_id: int):
        self.id = block_id
        self.ref_cnt = 0
        self.hash: Optional[int] = None           # the index's key for it
        # (parent hash, tokens, extra): what the hash stands for
        self.identity: Optional[Tuple[int, Tuple[int, ...], str]] = None
        self.epoch = 0                            # bumped at each reuse


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, bugs: Sequence[str] = (), free_order: str = "fifo", window: int = 0,
                 lock: Optional[ContextManager] = None, pause: Callable[[str], None] = lambda point: None):
        if free_order not in FREE_ORDERS:
            raise ValueError(f"unknown free order {free_order!r} (known: {', '.join(FREE_ORDERS)})")
        self.free_order = free_order
        unknown = sorted(set(bugs).difference(BUGS + THREAD_BUGS))
        if unknown:
            raise ValueError(f"unknown bug(s) {', '.join(unknown)} (known: {', '.join(BUGS + THREAD_BUGS)})")
        self._lock = lock if lock is not None else threading.Lock()
        self._pause = pause
        if num_blocks < 2 or block_size < 1:
            raise ValueError("BlockManager: needs at least 2 blocks (the null block and one) of at least 1 token")
        if window < 0:
            raise ValueError("BlockManager: the window must be >= 0 tokens (0: full attention)")
        self.bugs = frozenset(bugs)
        self.block_size = block_size
        # The model's attention window (0: full attention): at each step a
        # sequence gives back the blocks wholly behind its next token's
        # window, the null block 0 in their place (vLLM's SlidingWindowManager).
        self.window = window
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: deque = deque(range(1, num_blocks))
        # hash -> (identity, block ids): duplicates allowed (two requests of
        # one step may compute the same block).
        self.cached: Dict[int, Tuple[Tuple[int, Tuple[int, ...], str], List[int]]] = {}
        self.tables: Dict[int, List[int]] = {}
        self.tokens: Dict[int, List[int]] = {}
        self.extra: Dict[int, str] = {}
        self.imported: set = set()
        # Blocks filled since the last step: published at the step.
        self.to_publish: List[Tuple[int, int, int, Tuple[int, Tuple[int, ...], str]]] = []

    # ---- hashing ----

    def _hash_of(self, parent: int, tokens: Sequence[int], extra: str) -> int:
        if "weak_hash" in self.bugs:
            return chain_hash(parent, [sum(tokens)], extra)
        return chain_hash(parent, tokens, extra)

    def _chain(self, tokens: Sequence[int], extra: str, count: int):
        """(hash, identity) of the first `count` full blocks of `tokens`."""
        b, parent, out = self.block_size, 0, []
        for i in range(count):
            if (i + 1) * b > len(tokens):
                break
            chunk = tuple(tokens[i * b:(i + 1) * b])
            h = self._hash_of(parent, chunk, extra)
            out.append((h, (parent, chunk, extra)))
            parent = h
        return out

    def _hits(self, tokens: Sequence[int], extra: str) -> List[int]:
        hittable = (len(tokens) - 1) // self.block_size  # the model runs over one token at least
        hits = []
        for h, _ in self._chain(tokens, extra, hittable):
            entry = self.cached.get(h)
            if entry is None or not entry[1]:
                break
            hits.append(entry[1][0])
        return hits

    # ---- blocks ----

    def _drop_identity(self, block: Block) -> None:
        if block.hash is not None:
            entry = self.cached.get(block.hash)
            if entry is not None and block.id in entry[1]:
                entry[1].remove(block.id)
                if not entry[1]:
                    del self.cached[block.hash]
        block.hash = None
        block.identity = None

    def _take_free(self) -> Block:
        if not self.free_queue:
            raise OutOfBlocks("out of blocks")
        block = self.blocks[self.free_queue.popleft()]
        if "reuse_keeps_index" in self.bugs:
            block.hash = None  # the block forgets; the index does not
            block.identity = None
        else:
            self._drop_identity(block)
        block.epoch += 1
        block.ref_cnt = 1
        return block

    def _touch(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_cnt == 0:
            self.free_queue.remove(block_id)
        block.ref_cnt += 1

    def _unref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        count = block.ref_cnt
        if count <= 0:
            raise AssertionError(f"block {block_id} released with no reference")
        self._pause("release")  # read, then store: another client runs here only without the lock
        block.ref_cnt = count - 1
        if block.ref_cnt == 0:  # keeps its hash: hittable until reused
            if self.free_order == "lifo":
                self.free_queue.appendleft(block_id)
            else:
                self.free_queue.append(block_id)

    def _fill(self, seq: int, first: int, added: Sequence[int]) -> None:
        """Puts tokens at positions [first, first + len(added)) of `seq`,
        taking blocks as needed; full blocks wait for the step."""
        b, table = self.block_size, self.tables[seq]
        tokens = self.tokens[seq]
        tokens.extend(added)
        for position in range(first, first + len(added)):
            index = position // b
            if index == len(table):
                table.append(self._take_free().id)
            if position % b == b - 1 and seq not in self.imported:
                chain = self._chain(tokens, self.extra[seq], index + 1)
                if len(chain) == index + 1:
                    h, identity = chain[-1]
                    block = self.blocks[table[index]]
                    self.to_publish.append((block.id, block.epoch, h, identity))

    # ---- operations ----

    @_locked
    def allocate(self, seq: int, tokens: Sequence[int], extra: str) -> int:
        if seq in self.tables:
            raise ValueError(f"sequence {seq} exists")
        hits = self._hits(tokens, extra)
        cached = len(hits) * self.block_size
        needed = -(-len(tokens) // self.block_size) - len(hits)
        touched_free = sum(1 for h in set(hits) if self.blocks[h].ref_cnt == 0)
        if needed > len(self.free_queue) - touched_free:
            raise OutOfBlocks(f"sequence {seq} needs {needed} blocks, {len(self.free_queue) - touched_free} free")
        self.tables[seq] = []
        self.tokens[seq] = []
        self.extra[seq] = extra
        if "hit_not_attached" in self.bugs:
            hits_attached: List[int] = []
            for _ in hits:
                self.tables[seq].append(self._take_free().id)
        else:
            hits_attached = hits
        for h in hits_attached:
            self._touch(h)
            self.tables[seq].append(h)
        self.tokens[seq] = list(tokens[:cached])
        self._fill(seq, cached, tokens[cached:])
        return cached

    @_locked
    def append(self, seq: int, added: Sequence[int]) -> List[Tuple[int, int]]:
        table, length, b = self.tables[seq], len(self.tokens[seq]), self.block_size
        last_shared = length % b != 0 and self.blocks[table[-1]].ref_cnt > 1
        needed = -(-(length + len(added)) // b) - len(table) + (1 if last_shared else 0)
        if needed > len(self.free_queue):
            raise OutOfBlocks(f"append to sequence {seq} needs {needed} blocks, {len(self.free_queue)} free")
        copies = []
        if last_shared and "cow_by_reference" not in self.bugs:
            source = table[-1]
            fresh = self._take_free()
            # The table's reference moves to the copy; the pending copy
            # holds one on the source until the step: its count is unchanged.
            table[-1] = fresh.id
            copies.append((source, fresh.id))
        self._fill(seq, length, added)
        return copies

    @_locked
    def rewind(self, seq: int, length: int) -> List[Tuple[int, int]]:
        """`seq` keeps its first `length` tokens (speculative decoding
        rejected the rest): emptied blocks are released, the last first; a
        kept last block left partial loses its hash (its tokens are no
        longer the hash's), or is copied first when shared."""
        table, b = self.tables[seq], self.block_size
        kept_blocks = -(-length // b)
        last = table[kept_blocks - 1]
        partial = length % b != 0
        shared = partial and self.blocks[last].ref_cnt > 1
        if shared and not self.free_queue:
            raise OutOfBlocks(f"rewind of sequence {seq} copies its shared last block, 0 free")
        while len(table) > kept_blocks:
            self._unref(table.pop())
        copies = []
        if shared:
            fresh = self._take_free()
            table[-1] = fresh.id  # the table's reference moves to the copy, as in append
            copies.append((last, fresh.id))
        elif partial:
            self._drop_identity(self.blocks[last])
            self.to_publish = [p for p in self.to_publish if p[0] != last]
        del self.tokens[seq][length:]
        return copies

    @_locked
    def fork(self, parent: int, child: int) -> None:
        if child in self.tables:
            raise ValueError(f"sequence {child} exists")
        for block_id in self.tables[parent]:
            if block_id != 0:  # the null block, behind a window, counts nothing
                self.blocks[block_id].ref_cnt += 1
        self.tables[child] = list(self.tables[parent])
        self.tokens[child] = list(self.tokens[parent])
        self.extra[child] = self.extra[parent]
        if parent in self.imported:
            self.imported.add(child)

    @_locked
    def free(self, seq: int) -> None:
        table = self.tables.pop(seq)
        self.tokens.pop(seq)
        self.extra.pop(seq)
        self.imported.discard(seq)
        if "free_no_decrement" in self.bugs:
            return
        for block_id in reversed(table):
            if block_id != 0:
                self._unref(block_id)

    @_locked
    def lookup(self, tokens: Sequence[int], extra: str) -> int:
        return len(self._hits(tokens, extra)) * self.block_size

    @_locked
    def evict(self) -> None:
        for block_id in list(self.free_queue):
            self._drop_identity(self.blocks[block_id])

    @_locked
    def reset_prefix_cache(self) -> None:
        if self.tables:
            raise RuntimeError(f"reset while {len(self.tables)} sequences hold blocks")
        self.cached.clear()
        for block in self.blocks:
            block.hash = None
            block.identity = None
        self.free_queue = deque(sorted(self.free_queue))

    @_locked
    def step(self, copies: Sequence[Tuple[int, int]]) -> None:
        """The worker boundary: the blocks filled since the last step are
        written now; publish them, then end the copies (their sources are
        no longer read)."""
        for block_id, epoch, h, identity in self.to_publish:
            block = self.blocks[block_id]
            if block.epoch != epoch or block.hash is not None:
                continue  # reused since, or already published
            block.hash, block.identity = h, identity
            entry = self.cached.setdefault(h, (identity, []))
            entry[1].append(block_id)
        self.to_publish.clear()
        for source, _ in copies:
            self._unref(source)
        if self.window > 0:
            for seq, table in self.tables.items():
                self._slide(table, len(self.tokens[seq]))

    def _slide(self, table: List[int], length: int) -> None:
        """Releases the blocks wholly behind the window of the sequence's
        next token (at position `length`, it reads from length - window + 1
        on), the last first; the null block takes their place."""
        behind = min(max(0, length - self.window + 1) // self.block_size, len(table))
        for i in reversed(range(behind)):
            if table[i] == 0:
                break  # released at an earlier step, with all before it
            self._unref(table[i])
            table[i] = 0

    @_locked
    def allocate_unknown(self, seq: int, length: int) -> None:
        """A sequence of `length` tokens whose K/V come from elsewhere (an
        activation memory): its tokens are unknown, its blocks never
        published."""
        if seq in self.tables:
            raise ValueError(f"sequence {seq} exists")
        needed = -(-length // self.block_size)
        if needed > len(self.free_queue):
            raise OutOfBlocks(f"import of {length} tokens needs {needed} blocks, {len(self.free_queue)} free")
        self.tables[seq] = [self._take_free().id for _ in range(needed)]
        self.tokens[seq] = [-1] * length
        self.extra[seq] = ""
        self.imported.add(seq)
