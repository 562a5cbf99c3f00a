"""kvcheck's adapter for the activation-memory store over real transformers
(transformers_memory.py): the glue, with the model's domain.

    PYTHONPATH=.venv/transformers/4.57.6:python KVCHECK_PYTHON=.venv/bin/python \\
      kvcheck run --adapter python/examples/transformers_memory_adapter.py \\
                  --model "$(.venv/bin/python python/examples/transformers_memory_adapter.py --print-model)"

--bug NAME (repeatable) plants one of the store's historic bugs (see
transformers_memory.BUGS); $KVCHECK_EXAMPLE_BUGS (comma-separated) does the
same. --print-model prints the model's domain as `kvcheck run --model`
takes it, and exits. (The adapter declares the same domain in its
handshake: `--model` is only needed to search another one.)

The adapter derives its domain from the model (hello's `model`: the
layers, K/V heads and head_dim of its config, float32, the installed
layout, no odd layers), reads the owned marker from what the store holds
(real caches carry none: Adapter.owned = "derived"), and declares what the
installed transformers can do: one layout, so no conversions.
"""

from __future__ import annotations

import argparse
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(1, os.path.dirname(_HERE))  # the SDK, when run from the source tree

import transformers_memory  # noqa: E402
from kvcheck_adapter import hf  # noqa: E402
from kvcheck_adapter.adapter import Adapter, Item, serve  # noqa: E402
from kvcheck_adapter.crash import power_cut  # noqa: E402




class TransformersMemoryAdapter(Adapter):
    owned = "derived"

    def __init__(self, bugs=(), model=None):
        self.bugs = tuple(bugs)
        self.name = "transformers-memory" + "".join("+" + bug for bug in self.bugs)
        self.description = (
            f"the example store over real transformers {hf.VERSION} ({hf.LAYOUT} DynamicCache)"
            " (python/examples/transformers_memory.py)"
        )
        self.store = transformers_memory.TransformersMemory(bugs=self.bugs, model=model)
        self.model = hf.model_domain(self.store.model)
        self.capabilities = hf.capabilities(self.model)

    # ---- the store ----

    def add(self, id, cache, metadata):
        self.store.add([{"id": id, "cache": cache, "metadata": metadata}])

    def get(self, id):
        item = self.store.get(id)
        return None if item is None else Item(item.cache, item.metadata)

    def get_by_ids(self, ids):
        return [None if item is None else item.id for item in self.store.get_by_ids(ids)]

    def get_all_ids(self):
        return [item.id for item in self.store.get_all()]

    def get_cache(self, ids):
        return self.store.get_cache(ids)

    def delete(self, ids):
        self.store.delete(ids)

    def delete_all(self):
        self.store.delete_all()

    def stored_cache(self, id):
        item = self.store.get(id)  # the stored object itself (a read-only record)
        if item is None:
            raise KeyError(id)
        return item.cache

    def entry_metadata(self, id):
        item = self.store.get(id)
        if item is None:
            raise KeyError(id)
        return item.metadata

    def dump(self, directory):
        self.store.dump(directory)

    def load(self, directory):
        self.store.load(directory)

    def dump_interrupted(self, directory, bytes_budget):
        with power_cut(transformers_memory, bytes_budget):
            self.store.dump(directory)

    # ---- generation ----

    def generate(self, cache, prompt, max_new_tokens):
        return self.store.generate(cache, prompt, max_new_tokens)

    def generate_fresh(self, cache, prompt, max_new_tokens):
        # The store's model on the fresh cache, without the boundary.
        return hf.generate(self.store.model, prompt, cache, max_new_tokens)

    # ---- caches ----

    def make_cache(self, content):
        return hf.materialize(content)

    def clone(self, cache):
        return self.store.copy_of(cache)  # the store's own copy, bugs included

    def concat(self, caches):
        return self.store.merge(caches)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bug", action="append", default=[], choices=transformers_memory.BUGS,
                        help="plant a historic bug (repeatable)")
    hf.add_print_model(parser)
    arguments = parser.parse_args(argv)
    model = hf.model_or_print(arguments)
    if model is None:
        return
    bugs = arguments.bug + [b for b in os.environ.get("KVCHECK_EXAMPLE_BUGS", "").split(",") if b]
    unknown = sorted(set(bugs).difference(transformers_memory.BUGS))
    if unknown:
        parser.error(f"unknown bug(s) {', '.join(unknown)} (known: {', '.join(transformers_memory.BUGS)})")
    for bug, reason in transformers_memory.unavailable_bugs().items():
        if bug in bugs:
            parser.error(f"bug {bug} cannot occur here: {reason}")
    # One model for every engine of the process: generate keeps no state in
    # it between calls, and making it costs more than a trace.
    serve(lambda: TransformersMemoryAdapter(bugs, model))


if __name__ == "__main__":
    main()
