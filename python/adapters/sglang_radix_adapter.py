"""kvcheck's adapter for SGLang's prefix cache: the real RadixCache of
sglang 0.5.23 (python/requirements/sglang-0.5.23.txt) with page_size = B,
driven on a CPU without a model or memory pools. kvcheck's SDK
(kvcheck_adapter.paged) decodes and keeps the K/V in its shadow store by
block id; a block here is a page of the KV pool (slots p*B .. p*B+B-1).

    PYTHONPATH=.venv/engines/sglang-0.5.23 \\
        kvcheck run --adapter python/adapters/sglang_radix_adapter.py

RadixCache decides which pages a prefix hit shares (match_prefix), which
pages become the tree's (insert), who holds them (inc_lock_ref /
dec_lock_ref along the path to the root) and which are freed under
pressure (evict: leaf-first, by its eviction policy, LRU here). The pool's
allocator is not RadixCache's: the adapter's PageAllocator stands for
SGLang's paged token-to-KV allocator (a free list of pages; alloc takes the
front, free_segment returns pages to the back) and records every free.
The glue between them is the scheduler's (schedule_batch / radix_cache.py
`checkpoint`, `_insert_cache`), written here as those functions do it:

- alloc:  match_prefix on the tokens but the last (SGLang matches at most
  input_len - 1 tokens, page-aligned), inc_lock_ref on the matched node;
  the rest of the pages come from the allocator, evicting
  (evict(num_tokens)) first when the allocator is short, as the
  scheduler's allocation does; refused (the lock dropped) when free plus
  evictable pages cannot hold it: the scheduler checks that budget first.
- append: the request's row grows by pages from the allocator (the same
  eviction and refusal); the last page, partial, is the request's own, so
  no write ever goes into a tree page and there is no copy-on-write.
- step:   `checkpoint`: insert the row's full pages (key = the tokens,
  value = the slots); pages the tree already had are duplicates: freed
  (free_segment of row[protected_len:prefix_len]) and the row re-pointed to
  the tree's (path_device_indices); the lock moves to the new last node.
- free:   the request's lock dropped (dec_lock_ref), its own pages (the
  row past the tree's part) freed: the abort path. SGLang inserts a
  finished request's tokens first; here the last step did that for
  everything written before it, and what was not yet written is not
  published.
- lookup: match_prefix (it touches the access times used by LRU and may
  split a node: no page, count or key changes).
- evict:  evict(num_tokens = evictable_size()).
- reset:  reset() and the allocator cleared (flush_cache does both).
- fork, import: not offered (paged_fork and paged_import false: kvcheck
  never draws them): SGLang has no fork of a request's row, and a row
  from outside is not RadixCache's.

Observations, from RadixCache: a page's count is the lock_ref of the tree
node holding it, or 1 for a page of a request's own row (not in the tree);
its key is its position in the tree (parent = the previous page's key on
the path from the root, its B tokens, the node's extra_key); the index is
every tree page under its key. The free queue is the allocator's free list
(its order) followed by the evictable tree pages (lock_ref 0) by id:
RadixCache has no order over them beyond the heap it builds at evict time.
"""

from __future__ import annotations

import argparse
import os
import sys
from array import array

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(1, os.path.dirname(_HERE))  # the SDK, when run from the source tree

import _engine_env  # noqa: E402

SGLANG_VERSION = "0.5.23"

#: Third-party modules SGLang's import chain reaches only through its server,
#: tokenizer and kernel code; a placeholder when not installed.
SGLANG_PLACEHOLDER_MODULES = (
    "orjson", "pybase64", "requests", "PIL", "starlette", "tqdm", "transformers", "tvm_ffi", "huggingface_hub",
    "torchvision", "dill",
)
#: SGLang packages whose __init__ re-exports the whole runtime.
SGLANG_SKIPPED_INITS = (
    "sglang", "sglang.srt", "sglang.srt.utils", "sglang.srt.configs", "sglang.srt.layers",
    "sglang.srt.layers.quantization", "sglang.srt.distributed",
)
#: SGLang modules of GPU kernels and memory pools (triton at import) that
#: radix_cache's imports reach for other caches' sake.
SGLANG_PLACEHOLDER_ENGINE_MODULES = (
    "sglang.kernels.ops.kvcache.mla_buffer", "sglang.kernels.ops.memory.allocator",
    "sglang.srt.mem_cache.memory_pool", "sglang.srt.utils.common", "sglang.srt.observability.metrics_collector",
)


def _import_sglang():
    _engine_env.placeholders_for_missing(SGLANG_PLACEHOLDER_MODULES, ("sglang",))
    for package in SGLANG_SKIPPED_INITS:
        _engine_env.skip_package_init(package)
    _engine_env.placeholder_engine_modules(SGLANG_PLACEHOLDER_ENGINE_MODULES)
    from sglang.srt.mem_cache import base_prefix_cache, radix_cache
    return base_prefix_cache, radix_cache


base_prefix_cache, radix_cache = _import_sglang()

import torch  # noqa: E402

from kvcheck_adapter.paged import BlockKey, BlockManagerAdapter, ManagerState, OutOfBlocks, serve  # noqa: E402


class PageAllocator:
    """The KV pool's page allocator as RadixCache sees it (device,
    free_segment): a free list of pages 1..N-1 (page 0 is the null page)."""

    def __init__(self, pages, page_size):
        self.pages, self.page_size = pages, page_size
        self.device = torch.device("cpu")
        self.clear()

    def clear(self):
        self.free_pages = list(range(1, self.pages))
        self.freed = []  # every page freed, in order (what RadixCache's evict gave back)

    def alloc_pages(self, count):
        taken, self.free_pages = self.free_pages[:count], self.free_pages[count:]
        return taken

    def free_segment(self, indices, start_pos=0):
        slots = [int(i) for i in (indices.tolist() if hasattr(indices, "tolist") else indices)]
        pages = sorted({s // self.page_size for s in slots}, key=lambda p: slots.index(p * self.page_size)
                       if p * self.page_size in slots else 0)
        for page in pages:
            if page in self.free_pages or page == 0:
                raise AssertionError(f"page {page} freed twice (slots {slots})")
            self.free_pages.append(page)
            self.freed.append(page)


class _Request:
    __slots__ = ("tokens", "extra", "slots", "node", "protected")

    def __init__(self, tokens, extra, slots, node, protected):
        self.tokens, self.extra, self.slots, self.node, self.protected = tokens, extra, slots, node, protected


class SglangRadixCache(BlockManagerAdapter):
    description = f"SGLang {SGLANG_VERSION} RadixCache (page_size = B, LRU eviction)"
    # No free queue order: the evictable tree pages are evicted by LRU at
    # allocation (into the allocator's free list, maybe not the pages the
    # allocation then takes), so a free page may lose its key whenever
    # pages are taken (free-order not judged; keys-retained reads it so).
    free_order = "unspecified"
    num_blocks = 8
    block_tokens = 2

    def __init__(self):
        self.name = f"sglang-{SGLANG_VERSION}"
        self.allocator = PageAllocator(self.num_blocks, self.block_tokens)
        self.tree = radix_cache.RadixCache.create_simulated(mock_allocator=self.allocator, page_size=self.block_tokens)
        self.requests = {}

    def _key(self, tokens, extra):
        return radix_cache.RadixKey(token_ids=array("q", tokens), extra_key=extra or None)

    def _slots_of(self, pages):
        b = self.block_tokens
        return [p * b + i for p in pages for i in range(b)]

    def _take(self, count):
        """`count` pages from the allocator, evicting first when it is short;
        None (nothing changed) when free plus evictable pages cannot hold them."""
        short = count - len(self.allocator.free_pages)
        if short > 0:
            if self.tree.evictable_size() // self.block_tokens < short:
                return None
            self.tree.evict(base_prefix_cache.EvictParams(num_tokens=short * self.block_tokens))
            if len(self.allocator.free_pages) < count:
                raise AssertionError(f"RadixCache.evict({short * self.block_tokens}) freed too little")
        return self.allocator.alloc_pages(count)

    # ---- the manager's calls ----

    def allocate(self, seq, tokens, extra):
        b = self.block_tokens
        match = self.tree.match_prefix(base_prefix_cache.MatchPrefixParams(key=self._key(tokens[:-1], extra)))
        cached = int(match.device_prefix_len)
        node = match.last_device_node
        self.tree.inc_lock_ref(node)
        need = -(-len(tokens) // b) - cached // b
        pages = self._take(need)
        if pages is None:
            self.tree.dec_lock_ref(node)
            raise OutOfBlocks(f"{need} pages needed; the allocator and RadixCache's evictable pages hold fewer")
        hit = [int(s) for s in self.tree.path_device_indices(node).tolist()]
        self.requests[seq] = _Request(list(tokens), extra, hit + self._slots_of(pages)[:len(tokens) - cached], node,
                                      cached)
        return cached

    def append(self, seq, tokens):
        request = self.requests[seq]
        b = self.block_tokens
        length = len(request.tokens)
        have = -(-length // b)
        need = -(-(length + len(tokens)) // b) - have
        pages = self._take(need) if need > 0 else []
        if pages is None:
            raise OutOfBlocks(f"{need} pages needed for {len(tokens)} tokens")
        room = [request.slots[-1] + 1 + i for i in range(have * b - length)] if length % b else []
        request.slots += (room + self._slots_of(pages))[:len(tokens)]
        request.tokens += list(tokens)
        return []

    def free(self, seq):
        request = self.requests.pop(seq)
        self.tree.dec_lock_ref(request.node)
        own = request.slots[request.protected:]
        if own:
            self.allocator.free_segment(own)

    def lookup(self, tokens, extra):
        match = self.tree.match_prefix(base_prefix_cache.MatchPrefixParams(key=self._key(tokens[:-1], extra)))
        return int(match.device_prefix_len)

    def evict(self):
        self.tree.evict(base_prefix_cache.EvictParams(num_tokens=self.tree.evictable_size()))

    def reset_prefix_cache(self):
        self.tree.reset()
        self.allocator.clear()

    def step(self, copies):
        b = self.block_tokens
        for request in self.requests.values():
            full = len(request.tokens) // b * b
            if full <= request.protected:
                continue
            key = self._key(request.tokens[:full], request.extra)
            value = torch.tensor(request.slots[:full], dtype=torch.int64)
            result = self.tree.insert(base_prefix_cache.InsertParams(key=key, value=value))
            duplicates = request.slots[request.protected:int(result.prefix_len)]
            if duplicates:
                self.allocator.free_segment(duplicates)
            match = self.tree.match_prefix(base_prefix_cache.MatchPrefixParams(key=key))
            node = match.last_device_node
            indices = [int(s) for s in self.tree.path_device_indices(node).tolist()]
            if len(indices) != full:
                raise AssertionError(f"the tree holds {len(indices)} of the {full} tokens just inserted")
            request.slots[:full] = indices
            self.tree.inc_lock_ref(node)
            self.tree.dec_lock_ref(request.node)
            request.node, request.protected = node, full

    # ---- the one observation ----

    def state(self):
        b = self.block_tokens
        counts = [0] * self.num_blocks
        keys, index, evictable = {}, {}, []
        stack = [(self.tree.root_node, None)]
        while stack:
            node, parent_key = stack.pop()
            for child in node.children.values():
                if child.evicted:
                    continue
                tokens = [int(t) for t in child.key.token_ids][:len(child.key)]
                slots = [int(s) for s in child.value.tolist()]
                key = parent_key
                for i in range(0, len(slots), b):
                    page = slots[i] // b
                    key = BlockKey(key, tokens[i:i + b], child.key.extra_key or "")
                    keys[page] = key
                    index.setdefault(key, []).append(page)
                    counts[page] = child.lock_ref
                    if child.lock_ref == 0:
                        evictable.append(page)
                stack.append((child, key))
        tables = {}
        for seq, request in self.requests.items():
            pages = []
            for s in request.slots:
                if s // b not in pages:
                    pages.append(s // b)
            tables[seq] = pages
            for page in pages:
                if page not in keys:
                    counts[page] += 1
        # The index in page order: the tree's shape (a node split by a
        # match) is no part of the pool's state.
        index = dict(sorted(index.items(), key=lambda entry: min(entry[1])))
        return ManagerState(counts=counts, keys=keys, index=index,
                            free_queue=list(self.allocator.free_pages) + sorted(evictable), tables=tables)


def main(argv=None):
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    serve(SglangRadixCache)


if __name__ == "__main__":
    main()
