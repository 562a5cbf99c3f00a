"""kvcheck's adapter for the strict example store (strict_memory.py), which
raises where it uses a cache its model could not have made: the glue, with
the model's domain.

    kvcheck run --adapter python/examples/strict_memory_adapter.py
    kvcheck run --adapter 'python/examples/strict_memory_adapter.py --bug double_copy'
    kvcheck run --adapter 'python/examples/strict_memory_adapter.py --undeclared'

The adapter declares the store's model in its handshake (Adapter.model:
its layers, heads and head_dim, float32, the modern layout, no odd
layers), so that every cache kvcheck makes is one the store takes.
--undeclared (or $KVCHECK_STRICT_UNDECLARED=1) leaves the declaration out:
kvcheck then draws caches of any layer count and token counts, and reports
the store's refusals as engine errors, grouped by message (about a quarter
of the traces end in one, so the properties are blocked). The capabilities say what the store
never takes in either case (the legacy layout, half dtypes, odd layer
shapes, geometries other than 2x4), so kvcheck never sends those.

--bug NAME (repeatable) plants one of the store's historic bugs (see
activation_memory.BUGS); $KVCHECK_EXAMPLE_BUGS (comma-separated) does the
same.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(1, os.path.dirname(_HERE))  # the SDK, when run from the source tree

import activation_memory_adapter  # noqa: E402
import strict_memory  # noqa: E402
from kvcheck_adapter import content as kc  # noqa: E402
from kvcheck_adapter import decoder as models  # noqa: E402
from kvcheck_adapter.adapter import serve  # noqa: E402

# What the store never takes, whatever the model: kvcheck sends none of it.
CAPABILITIES = {
    "modern_layout": True,
    "legacy_layout": False,
    "conversions": False,
    "half_dtypes": False,
    "one_sided_layers": False,
    "legacy_slot_names": False,
    "uninitialized_layers": False,
}


def model_domain(store: strict_memory.StrictMemory) -> dict:
    """The store's model as the handshake's `model` declares it."""
    return {
        "layers": store.layers,
        "heads": store.heads,
        "head_dim": store.head_dim,
        "dtypes": [kc.dtype_name(strict_memory.DTYPE)],
        "layouts": [strict_memory.LAYOUT],
        "odd_layers": False,
    }


class StrictMemoryAdapter(activation_memory_adapter.ActivationMemoryAdapter):
    description = "the strict example store, which raises on caches its model could not make (python/examples/strict_memory.py)"

    def __init__(self, bugs=(), model=None, declared=True):
        self.bugs = tuple(bugs)
        self.name = "strict-memory" + "".join("+" + bug for bug in self.bugs)
        self.store = strict_memory.StrictMemory(bugs=self.bugs, model=model)
        self.model = model_domain(self.store) if declared else None
        self.capabilities = dict(CAPABILITIES, any_geometry=(self.store.heads, self.store.head_dim) != (2, 4))

    def concat(self, caches):
        return self.store.merge(caches)

    def generate_fresh(self, cache, prompt, max_new_tokens):
        # The store's model on the fresh cache, without the boundary (but
        # with the store's refusal of caches the model does not make).
        self.store.check_for_generation(cache)
        return super().generate_fresh(cache, prompt, max_new_tokens)

    def feed(self, cache, tokens):
        self.store.check_for_generation(cache)
        return super().feed(cache, tokens)


def main(argv=None) -> None:
    parser = activation_memory_adapter.argument_parser(__doc__)
    parser.add_argument("--undeclared", action="store_true",
                        help="leave the model's declaration out of the handshake ($KVCHECK_STRICT_UNDECLARED=1 too)")
    arguments = parser.parse_args(argv)
    bugs = activation_memory_adapter.bugs_of(parser, arguments)
    declared = not (arguments.undeclared or os.environ.get("KVCHECK_STRICT_UNDECLARED") == "1")
    model = models.Decoder()
    serve(lambda: StrictMemoryAdapter(bugs, model, declared))


if __name__ == "__main__":
    main()
