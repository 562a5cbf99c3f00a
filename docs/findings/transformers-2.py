"""transformers 5.25.0: DynamicCache.crop keeps the removed tokens' memory (each
layer becomes a view of its old tensors), so a deep copy of a cropped cache, as
transformers' docs copy a prompt cache for reuse, copies and keeps every removed
token too."""
import copy

import torch
import transformers
from transformers import DynamicCache

torch.manual_seed(0)
cache = DynamicCache()
for layer in range(2):
    cache.update(torch.randn(1, 2, 1000, 8), torch.randn(1, 2, 1000, 8), layer)
cache.crop(-990)  # roll back to the first 10 tokens


def bytes_of(cache):
    held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    kept = sum(t.untyped_storage().nbytes() for layer in cache.layers for t in (layer.keys, layer.values))
    return held, kept


print("transformers", transformers.__version__, "torch", torch.__version__)
print("after crop: holds", cache.get_seq_length(), "tokens; K/V bytes held %d, bytes kept alive %d" % bytes_of(cache))
reused = copy.deepcopy(cache)
print("deep copy:  holds", reused.get_seq_length(), "tokens; K/V bytes held %d, bytes copied and kept %d"
      % bytes_of(reused))
print("expected: bytes kept == bytes held:", bytes_of(cache)[0] == bytes_of(cache)[1])
