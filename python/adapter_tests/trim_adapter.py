"""The example store with a trim (docs/semantics.md, trimming), for
test_trim.py: every slot holding more than `keep` tokens sliced to its
first `keep`, in place (a view, as transformers' DynamicLayer.crop slices:
no copy). $KVCHECK_TEST_TRIM_BUG "keeps_extra": it keeps one token too
many (M35 in Python)."""

import os
import sys

_PYTHON = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_PYTHON, os.path.join(_PYTHON, "examples")]  # the SDK and the example store, from the source tree

import activation_memory_adapter  # noqa: E402
from kvcheck_adapter.adapter import serve  # noqa: E402

BUG = os.environ.get("KVCHECK_TEST_TRIM_BUG", "")


def cut(tensor, keep):
    if tensor is None or tensor.dim() != 4 or tensor.shape[2] <= keep:
        return tensor
    return tensor[:, :, :keep]


class TrimAdapter(activation_memory_adapter.ActivationMemoryAdapter):
    def trim(self, cache, keep):
        keep = keep + 1 if BUG == "keeps_extra" else keep
        if hasattr(cache, "layers"):
            for layer in cache.layers:
                for name in ("keys", "values", "key_cache", "value_cache"):
                    setattr(layer, name, cut(getattr(layer, name), keep))
            return
        cache.key_cache[:] = [cut(t, keep) for t in cache.key_cache]
        cache.value_cache[:] = [cut(t, keep) for t in cache.value_cache]


if __name__ == "__main__":
    serve(lambda: TrimAdapter())
