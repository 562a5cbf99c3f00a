"""The example store with a batch (docs/semantics.md, batches), for
test_batch.py: the rows stacked along the batch, each repeated in place,
reordered, one kept, as transformers' batch_repeat_interleave,
reorder_cache and batch_select_indices do it to a DynamicCache's layers.
$KVCHECK_TEST_BATCH_BUG "keys_only": the reorder moves the keys but not
the values (M42 in Python)."""

import os
import sys

_PYTHON = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_PYTHON, os.path.join(_PYTHON, "examples")]  # the SDK and the example store, from the source tree

import torch  # noqa: E402

import activation_memory_adapter  # noqa: E402
from kvcheck_adapter import cache as kv  # noqa: E402
from kvcheck_adapter.adapter import serve  # noqa: E402

BUG = os.environ.get("KVCHECK_TEST_BATCH_BUG", "")


def row_of(slots, repeat, reorder, select):
    batch = torch.cat(slots, dim=0).repeat_interleave(repeat, dim=0)
    if reorder:
        batch = batch.index_select(0, torch.tensor(reorder, dtype=torch.long))
    return batch[torch.tensor([select], dtype=torch.long), ...]


class BatchAdapter(activation_memory_adapter.ActivationMemoryAdapter):
    def batch(self, rows, repeat, reorder, select):
        out = kv.DynamicCache()
        for i in range(kv.layer_count(rows[0])):
            keys = row_of([kv.logical_keys(row, i) for row in rows], repeat, reorder, select)
            values = row_of([kv.logical_values(row, i) for row in rows], repeat,
                            [] if BUG == "keys_only" else reorder, select)
            out.update(keys, values, i)
        kv.set_owned(out, True)
        return out


if __name__ == "__main__":
    serve(lambda: BatchAdapter())
