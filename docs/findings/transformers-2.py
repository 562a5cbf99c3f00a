"""transformers 5.25.0: DynamicCache.crop keeps the removed tokens' memory (each
layer becomes a view of its old tensors), so a deep copy of a cropped cache, as
transformers' docs copy a prompt cache for reuse, copies and keeps every removed
token too.

Exits 1 when the defect is there, 0 when it is fixed, 2 when it cannot run
(torch or transformers missing, or a transformers without `Cache.layers`,
4.56 and later); its last line says which."""

import copy

try:
    import torch
    import transformers
    from transformers import DynamicCache
except ImportError as error:
    print(f"CANNOT RUN (exit 2): {error}; needs transformers (5.25.0 shown) and torch")
    raise SystemExit(2) from None
if not hasattr(DynamicCache(), "layers"):
    print(f"CANNOT RUN (exit 2): transformers {transformers.__version__} has no `Cache.layers` (4.56 and later)")
    raise SystemExit(2)

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
failed = any(held != kept for held, kept in (bytes_of(cache), bytes_of(reused)))
print("DEFECT PRESENT (exit 1)" if failed else "fixed (exit 0)")
raise SystemExit(1 if failed else 0)
