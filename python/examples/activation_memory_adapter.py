"""kvcheck's adapter for the example activation-memory store
(activation_memory.py): the glue a Python engine needs to be checked.

    kvcheck run --adapter python/examples/activation_memory_adapter.py
    kvcheck run --adapter 'python/examples/activation_memory_adapter.py --bug double_copy'
    kvcheck run --adapter 'python/examples/activation_memory_adapter.py --capacity 4 --bug evicts_most_recent'

--bug NAME (repeatable) plants one of the store's historic bugs (see
activation_memory.BUGS); $KVCHECK_EXAMPLE_BUGS (comma-separated) does the
same. --capacity N bounds the store at N items, the least recently used
evicted to make room, and declares so (capacity_items, eviction "lru"). The
adapter only maps kvcheck's operations onto the store's API; the
SDK (kvcheck_adapter.adapter) keeps the handles and computes every
observation (views, storage identities, the owned marker, copies) from the
cache objects the store hands out.
"""

from __future__ import annotations

import argparse
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(1, os.path.dirname(_HERE))  # the SDK, when run from the source tree

import activation_memory  # noqa: E402
from kvcheck_adapter import cache as kv  # noqa: E402
from kvcheck_adapter import decoder as models  # noqa: E402
from kvcheck_adapter.adapter import Adapter, Item, serve  # noqa: E402
from kvcheck_adapter.crash import power_cut  # noqa: E402


class ActivationMemoryAdapter(Adapter):
    description = "the example Python activation-memory store (python/examples/activation_memory.py)"
    # Several clients may call it at once: the store updates its index
    # under a lock (the bug unlocked_index drops it).
    thread_safe = True

    def __init__(self, bugs=(), model=None, capacity=None):
        self.bugs = tuple(bugs)
        self.name = "activation-memory" + (f"-lru{capacity}" if capacity else "") + "".join("+" + bug for bug in self.bugs)
        self.store = activation_memory.ActivationMemory(bugs=self.bugs, model=model, capacity=capacity)
        if capacity is not None:
            # The declared contract (docs/semantics.md, "Declared store contracts").
            self.capacity_items = capacity
            self.eviction = "lru"

    # ---- the store ----

    def add(self, id, cache, metadata):
        self.store.add([{"id": id, "cache": cache, "metadata": metadata}])

    def get(self, id):
        item = self.store.get(id)  # a use: its recency
        return None if item is None else Item(item.cache, item.metadata)

    def get_by_ids(self, ids):
        return [None if item is None else item.id for item in self.store.get_by_ids(ids)]

    def get_all_ids(self):
        return [item.id for item in self.store.get_all()]

    def get_cache(self, ids):
        return self.store.get_cache(ids)

    def stored_ids(self):
        # The SDK lists the store in every reply: a listing of ids, where
        # get_all_ids (the store's get_all) makes a record of every item.
        return self.store.ids()

    def delete(self, ids):
        self.store.delete(ids)

    def delete_all(self):
        self.store.delete_all()

    def stored_cache(self, id):
        item = self.store.peek(id)  # the stored object itself (a read-only record); an observation: no use
        if item is None:
            raise KeyError(id)
        return item.cache

    def entry_metadata(self, id):
        item = self.store.peek(id)
        if item is None:
            raise KeyError(id)
        return item.metadata

    def dump(self, directory):
        self.store.dump(directory)

    def load(self, directory):
        self.store.load(directory)

    def dump_interrupted(self, directory, bytes_budget):
        with power_cut(activation_memory, bytes_budget):
            self.store.dump(directory)

    # ---- generation ----

    def generate(self, cache, prompt, max_new_tokens):
        return self.store.generate(cache, prompt, max_new_tokens)

    def generate_stream(self, cache, prompt, max_new_tokens):
        return self.store.generate_stream(cache, prompt, max_new_tokens)

    def generate_fresh(self, cache, prompt, max_new_tokens):
        # The store's model on the fresh cache, without the boundary.
        return models.generate(self.store.model, prompt, cache, max_new_tokens)

    # ---- caches the model makes ----

    def generate_returning(self, cache, prompt, max_new_tokens):
        return self.store.generate_returning(cache, prompt, max_new_tokens)

    def extract(self, id, prompt):
        self.store.extract(id, prompt)

    def feed(self, cache, tokens):
        # The store's model on the fresh cache, without the boundary.
        self.store.model.forward(tokens, cache)
        return cache

    # ---- caches ----

    def clone(self, cache):
        return self.store._clone(cache)  # the store's own clone, bugs included

    def concat(self, caches):
        return kv.concat(caches)

    def to_legacy(self, cache):
        return kv.to_legacy(cache)

    def from_legacy(self, cache):
        return kv.from_legacy(cache)


def argument_parser(doc: str) -> argparse.ArgumentParser:
    """The command line of an example adapter: --bug NAME (repeatable)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--bug", action="append", default=[], choices=activation_memory.BUGS,
                        help="plant a historic bug (repeatable)")
    parser.add_argument("--capacity", type=int, default=None,
                        help="bound the store at N items, least recently used evicted (declared: lru)")
    return parser


def bugs_of(parser: argparse.ArgumentParser, arguments: argparse.Namespace) -> list:
    """The bugs to plant: --bug's, then $KVCHECK_EXAMPLE_BUGS's (comma-separated)."""
    bugs = arguments.bug + [b for b in os.environ.get("KVCHECK_EXAMPLE_BUGS", "").split(",") if b]
    unknown = sorted(set(bugs).difference(activation_memory.BUGS))
    if unknown:
        parser.error(f"unknown bug(s) {', '.join(unknown)} (known: {', '.join(activation_memory.BUGS)})")
    return bugs


def main(argv=None) -> None:
    parser = argument_parser(__doc__)
    arguments = parser.parse_args(argv)
    bugs = bugs_of(parser, arguments)
    if "evicts_most_recent" in bugs and arguments.capacity is None:
        parser.error("--bug evicts_most_recent needs --capacity N (a bounded store)")
    # One model for every engine of the process: it keeps no state between
    # calls (decoder.py), and making its weights costs a tenth of a trace.
    model = models.Decoder()
    serve(lambda: ActivationMemoryAdapter(bugs, model, arguments.capacity))


if __name__ == "__main__":
    main()
