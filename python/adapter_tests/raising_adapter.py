"""The example store's adapter with one planted exception: get_cache of
several ids raises (after printing a line), so that kvcheck reports the
step's engine error with the Python traceback and the engine's output."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import activation_memory_adapter  # noqa: E402
from kvcheck_adapter.adapter import serve  # noqa: E402


class RaisingAdapter(activation_memory_adapter.ActivationMemoryAdapter):
    def get_cache(self, ids):
        if len(ids) > 1:
            print("the planted error's last words")
            raise ValueError(f"planted: a merge of {len(ids)} ids")
        return super().get_cache(ids)


if __name__ == "__main__":
    serve(RaisingAdapter)
