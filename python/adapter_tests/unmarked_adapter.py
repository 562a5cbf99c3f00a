"""The example store without an owned marker, as real stores are: its
caches carry no `owned` attribute (the store knows the copies it handed out
by identity, and its boundary uses one of them as it is), and the adapter
declares capabilities = {"owned_marker": False}, so that kvcheck derives
"owned" from storage identities: a cache sharing nothing with the store
(docs/semantics.md#ownership).

    unmarked_adapter.py [--bug NAME ...]

--bug NAME (repeatable) plants one of the example store's historic bugs
(activation_memory.BUGS).
"""

import argparse
import os
import sys
import weakref

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import activation_memory  # noqa: E402
import activation_memory_adapter  # noqa: E402
from kvcheck_adapter import cache as kv  # noqa: E402
from kvcheck_adapter import decoder as models  # noqa: E402
from kvcheck_adapter.adapter import serve  # noqa: E402


def unmarked(cache):
    """`cache` with its `owned` attribute taken off (None passes through)."""
    if cache is not None:
        vars(cache).pop("owned", None)
    return cache


class UnmarkedMemory(activation_memory.ActivationMemory):
    """The example store, remembering the owned copies it handed out (weakly,
    by identity) instead of marking them."""

    def __init__(self, bugs=(), model=None):
        super().__init__(bugs=bugs, model=model)
        self.copies = weakref.WeakSet()

    def own(self, cache):
        """`cache` is an owned copy the store handed out: the boundary may
        give it to the model as it is."""
        self.copies.add(unmarked(cache))
        return cache

    def add(self, items):
        items = [activation_memory._as_item(item) for item in items]
        super().add(items)
        for item in items:  # stored: an original now, no one's copy
            unmarked(item.cache)
            self.copies.discard(item.cache)

    def load(self, directory):
        super().load(directory)
        for item in self._items.values():
            unmarked(item.cache)

    def _clone(self, cache):
        return unmarked(super()._clone(cache))

    def get_cache(self, ids):
        result = super().get_cache(ids)
        return None if result is None else self.own(result)

    def generate_returning(self, cache, prompt, max_new_tokens):
        tokens, returned = super().generate_returning(cache, prompt, max_new_tokens)
        return tokens, self.own(returned)  # the caller's copy: a turn from it needs none

    def _own_for_generation(self, cache):
        if cache is None:
            return unmarked(kv.DynamicCache())
        if "stored_to_generation" in self.bugs:
            return cache
        if cache in self.copies and "double_copy" not in self.bugs:
            return cache
        return self._clone(cache)


class UnmarkedAdapter(activation_memory_adapter.ActivationMemoryAdapter):
    description = "the example store without an owned marker (python/adapter_tests/unmarked_adapter.py)"
    capabilities = {"owned_marker": False}

    def __init__(self, bugs=(), model=None):
        super().__init__(bugs, model)
        self.name = "unmarked-memory" + "".join("+" + bug for bug in self.bugs)
        self.store = UnmarkedMemory(bugs=self.bugs, model=model)

    def make_cache(self, content):
        return unmarked(super().make_cache(content))

    def clone(self, cache):
        return self.store.own(self.store._clone(cache))

    def concat(self, caches):
        return self.store.own(kv.concat(caches))

    def to_legacy(self, cache):
        return unmarked(kv.to_legacy(cache))

    def from_legacy(self, cache):
        return unmarked(kv.from_legacy(cache))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bug", action="append", default=[], choices=activation_memory.BUGS)
    args = parser.parse_args()
    model = models.Decoder()
    serve(lambda: UnmarkedAdapter(args.bug, model))


if __name__ == "__main__":
    main()
