"""The example store's adapter declaring the model whose caches it holds
(Adapter.model), and raising, as a real engine does, on a cache outside it.

    model_adapter.py

$KVCHECK_TEST_MODEL (JSON), when set: the declaration sent in the
handshake instead of the default (2 layers of 2 heads of 8, float32,
modern, no odd layers); it may be malformed, for the tests of kvcheck's
errors.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import activation_memory_adapter  # noqa: E402
from kvcheck_adapter.adapter import serve  # noqa: E402

DEFAULT_MODEL = {"layers": 2, "heads": 2, "head_dim": 8, "dtypes": ["f32"], "layouts": ["modern"], "odd_layers": False}


def outside(model, cache):
    """Why `cache` is not one of the model's caches, or None."""
    if not hasattr(cache, "layers"):
        return "a legacy cache"
    layers = [(layer.keys, layer.values) for layer in cache.layers]
    if len(layers) != model["layers"]:
        return f"{len(layers)} layers"
    for keys, values in layers:
        if keys is None or values is None or keys.shape[2] < 1 or keys.shape != layers[0][0].shape:
            return "a layer outside the model"
        if tuple(keys.shape) != (1, model["heads"], keys.shape[2], model["head_dim"]):
            return f"geometry {tuple(keys.shape)}"
    return None


def main(argv=None) -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    declared = json.loads(os.environ.get("KVCHECK_TEST_MODEL") or json.dumps(DEFAULT_MODEL))

    class ModelAdapter(activation_memory_adapter.ActivationMemoryAdapter):
        name = "model-adapter"
        model = declared
        # Its decoder (2 layers of 2 x 4) is not the model it declares: a
        # cache the model makes (a turn from none, an extract) would be
        # outside the declaration. It claims none.
        capabilities = {"returned_caches": False}

        def add(self, id, cache, metadata):
            fault = outside(declared, cache) if isinstance(declared, dict) else None
            if fault:
                raise ValueError(f"not a cache of the model: {fault}")
            return super().add(id, cache, metadata)

    serve(lambda: ModelAdapter([]))


if __name__ == "__main__":
    main()
