"""kvcheck's adapter for the example block manager (block_manager.py): the
glue a Python paged block manager needs to be checked.

    kvcheck run --adapter python/examples/block_manager_adapter.py
    kvcheck run --adapter 'python/examples/block_manager_adapter.py --bug weak_hash'
    kvcheck run --adapter 'python/examples/block_manager_adapter.py --free-order lifo'

--free-order lifo puts freed blocks at the front of the free queue (the
block freed last is taken first), a correct manager too.
--bug NAME (repeatable) plants one of the manager's historic bugs (see
block_manager.BUGS), or its thread bug (block_manager.THREAD_BUGS: found
only with several clients at once, kvcheck's thread level);
$KVCHECK_EXAMPLE_BUGS (comma-separated) does the same. The adapter declares
thread_safe: kvcheck may send it several requests at once, each served on a
thread of its own under the SDK's scheduler (kvcheck_adapter.threads), and
the manager's lock is a kvcheck_adapter.Lock, its pause a yield point.
The adapter maps kvcheck's paged requests onto the manager's calls and
reports its bookkeeping (state); the SDK (kvcheck_adapter.paged) decodes,
keeps the K/V in its shadow store by block id and answers the K/V
observations. The manager has no store of caches: kvcheck reports the
contiguous properties n/a.
"""

from __future__ import annotations

import argparse
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(1, os.path.dirname(_HERE))  # the SDK, when run from the source tree

import block_manager  # noqa: E402
import kvcheck_adapter  # noqa: E402
from kvcheck_adapter.paged import BlockKey, BlockManagerAdapter, ManagerState, serve  # noqa: E402


class BlockManagerExample(BlockManagerAdapter):
    description = "the example vLLM-like block manager (python/examples/block_manager.py)"
    num_blocks = 8
    block_tokens = 2
    # Several clients at once: the manager holds its lock in every call.
    thread_safe = True

    def __init__(self, bugs=(), free_order="fifo"):
        self.bugs = tuple(bugs)
        self.name = ("block-manager" + ("" if free_order == "fifo" else "-" + free_order) + "".join("+" + bug for bug in self.bugs) +
                     (f"-window{self.window}" if self.window else ""))
        self.manager = block_manager.BlockManager(self.num_blocks, self.block_tokens, bugs=self.bugs, free_order=free_order,
                                                  window=self.window, lock=kvcheck_adapter.Lock(),
                                                  pause=kvcheck_adapter.yield_point)
        self.free_order = "back" if free_order == "fifo" else "front"  # declared: kvcheck checks it (free-order)

    # ---- the manager's calls ----

    def allocate(self, seq, tokens, extra):
        return self.manager.allocate(seq, tokens, extra)

    def append(self, seq, tokens):
        return self.manager.append(seq, tokens)

    def fork(self, parent, child):
        self.manager.fork(parent, child)

    def rewind(self, seq, length):
        return self.manager.rewind(seq, length)

    def free(self, seq):
        self.manager.free(seq)

    def lookup(self, tokens, extra):
        return self.manager.lookup(tokens, extra)

    def evict(self):
        self.manager.evict()

    def reset_prefix_cache(self):
        self.manager.reset_prefix_cache()

    def step(self, copies):
        self.manager.step(copies)

    def import_sequence(self, seq, length):
        self.manager.allocate_unknown(seq, length)

    # ---- its bookkeeping ----

    def state(self):
        m = self.manager
        return ManagerState(
            counts=[block.ref_cnt for block in m.blocks],
            keys={block.id: BlockKey(*block.identity) for block in m.blocks if block.identity is not None},
            index={BlockKey(*identity): list(ids) for identity, ids in m.cached.values()},
            free_queue=list(m.free_queue),
            tables={seq: list(table) for seq, table in m.tables.items()},
        )


class BlockManagerWindowExample(BlockManagerExample):
    """The same manager over a model of attention window 3: at each step a
    sequence gives back the blocks behind its window. It has no rewind (the
    blocks behind the window are gone): kvcheck never asks one."""

    window = 3
    rewind = BlockManagerAdapter.rewind


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bug", action="append", default=[], choices=block_manager.BUGS + block_manager.THREAD_BUGS,
                        help="plant a historic bug, or the thread bug (repeatable)")
    parser.add_argument("--free-order", default="fifo", choices=block_manager.FREE_ORDERS,
                        help="where freed blocks join the free queue: the back (fifo) or the front (lifo)")
    parser.add_argument("--window", action="store_true",
                        help="a model of attention window 3: blocks behind every sequence's window are given back")
    arguments = parser.parse_args(argv)
    bugs = arguments.bug + [b for b in os.environ.get("KVCHECK_EXAMPLE_BUGS", "").split(",") if b]
    known = block_manager.BUGS + block_manager.THREAD_BUGS
    unknown = sorted(set(bugs).difference(known))
    if unknown:
        parser.error(f"unknown bug(s) {', '.join(unknown)} (known: {', '.join(known)})")
    made = BlockManagerWindowExample if arguments.window else BlockManagerExample
    serve(lambda: made(bugs, arguments.free_order))


if __name__ == "__main__":
    main()
