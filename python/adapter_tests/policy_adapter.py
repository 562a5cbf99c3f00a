"""A bounded store for the declared-contract tests (test_store_policy.py):
$KVCHECK_TEST_POLICY names its eviction ("lru", "fifo", "lrs", "none",
"lru-bytes": an LRU bounded by bytes) and $KVCHECK_TEST_POLICY_BUG a bug ("" for
none: "evicts_lru" for a fifo store that evicts by recency, "evicts_fifo" for
an lrs store whose overwrite keeps its place)."""

import os
from collections import OrderedDict

from kvcheck_adapter import cache as kv
from kvcheck_adapter import decoder
from kvcheck_adapter.adapter import Adapter, serve
from kvcheck_adapter.cache import footprint

POLICY = os.environ.get("KVCHECK_TEST_POLICY", "lru")
BUG = os.environ.get("KVCHECK_TEST_POLICY_BUG", "")
ITEMS = 3
BYTES = 2048


def size_of(cache):
    return footprint(cache)[1]


class PolicyStore:
    def __init__(self):
        self.items = OrderedDict()  # insertion order
        self.used = OrderedDict()   # recency, least recent first (lrs: only stores count)
        self.model = decoder.Decoder()

    def _use(self, id):
        """A hand-out of `id`: a use, except under lrs (only a store is)."""
        if POLICY != "lrs":
            self._stored(id)

    def _stored(self, id):
        if id in self.items:
            self.used.pop(id, None)
            self.used[id] = None

    def _over(self):
        if POLICY == "lru-bytes":
            return sum(size_of(c) for c in self.items.values()) > BYTES
        return len(self.items) > ITEMS

    def add(self, id, cache):
        """Stores, then trims while over its capacity (as mlx-lm's
        LRUPromptCache does): an item larger than the capacity goes too."""
        kv.set_owned(cache, False)
        if POLICY == "none" and id not in self.items and len(self.items) >= ITEMS:
            raise RuntimeError(f"the store is full ({ITEMS} items)")
        self.items[id] = cache
        self._stored(id)
        while self._over():
            by_recency = (POLICY in ("lru", "lru-bytes", "lrs") or BUG == "evicts_lru") and BUG != "evicts_fifo"
            victim = next(iter(self.used if by_recency else self.items))
            del self.items[victim]
            del self.used[victim]

    def get(self, id):
        self._use(id)
        return self.items.get(id)


class PolicyAdapter(Adapter):
    name = "policy-" + POLICY + ("+" + BUG if BUG else "")
    eviction = "lru" if POLICY == "lru-bytes" else POLICY
    listing = "insertion"

    def __init__(self):
        self.store = PolicyStore()
        if POLICY == "lru-bytes":
            self.capacity_bytes = BYTES
        else:
            self.capacity_items = ITEMS

    def add(self, id, cache, metadata): self.store.add(id, cache)
    def get(self, id): return self.store.get(id)
    def get_by_ids(self, ids): return [i if self.store.get(i) is not None else None for i in ids]
    def get_all_ids(self): return list(self.store.items)
    def stored_cache(self, id): return self.store.items[id]
    def delete(self, ids):
        for i in ids:
            self.store.items.pop(i, None)
            self.store.used.pop(i, None)
    def delete_all(self):
        self.store.items.clear()
        self.store.used.clear()

    def get_cache(self, ids):
        for i in ids:
            self.store._use(i)
        parts = [self.store.items[i] for i in ids if i in self.store.items and kv.holds_tokens(self.store.items[i])]
        if not parts:
            return None
        return kv.clone(parts[0]) if len(parts) == 1 else kv.concat(parts)

    def generate(self, cache, prompt, max_new_tokens):
        working = cache if cache is not None and kv.is_owned(cache) else kv.clone(cache) if cache is not None else kv.DynamicCache()
        return decoder.generate(self.store.model, prompt, working, max_new_tokens)

    def generate_fresh(self, cache, prompt, max_new_tokens): return decoder.generate(self.store.model, prompt, cache, max_new_tokens)
    def clone(self, cache): return kv.clone(cache)
    def concat(self, caches): return kv.concat(caches)


if __name__ == "__main__":
    serve(PolicyAdapter)
