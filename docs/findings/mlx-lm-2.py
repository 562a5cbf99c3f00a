"""mlx-lm 0.32.2: RotatingKVCache writes into the arrays its caller gave it.
The first multi-token update_and_fetch of an empty RotatingKVCache keeps the
caller's keys and values arrays themselves (`self.keys = keys`); when they
hold exactly max_size tokens, the next single-token update neither grows
nor cuts the buffer (each of which would make a new array) and assigns the
new token into it in place (`self.keys[..., self._idx : ...] = keys`): the
caller's array changes. KVCache copies what it is given into a buffer of
its own, and a RotatingKVCache given fewer or more than max_size tokens
makes a new array before writing: only this boundary aliases.

Needs only mlx-lm and MLX (pip install mlx-lm; on Linux the mlx[cpu] build):
    python mlx-lm-2.py
Exits 1 when the defect is there (prints what it saw), 0 when it is fixed,
2 when it cannot run (MLX or an mlx-lm without these classes); its last line
says which."""

try:
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache, LRUPromptCache, RotatingKVCache
except ImportError as error:
    print(f"CANNOT RUN (exit 2): {error}; needs mlx-lm (0.32.2 shown) and MLX")
    raise SystemExit(2) from None

MAX_SIZE = 4


def tokens(start, count):
    """K/V of `count` tokens whose values are their positions start.. (1 head of 1)."""
    x = mx.arange(start, start + count, dtype=mx.float32).reshape(1, 1, count, 1)
    return x, x + 0


def positions(array):
    return [int(v) for v in array.reshape(-1).tolist()]


failed = False

# 1. The class alone: a prefill of n tokens, then one decoded token; the
#    caller's arrays afterwards.
for make, n in ((KVCache, MAX_SIZE), (lambda: RotatingKVCache(MAX_SIZE), MAX_SIZE - 1),
                (lambda: RotatingKVCache(MAX_SIZE), MAX_SIZE), (lambda: RotatingKVCache(MAX_SIZE), MAX_SIZE + 1)):
    cache = make()
    keys, values = tokens(0, n)
    cache.update_and_fetch(keys, values)
    cache.update_and_fetch(*tokens(100, 1))
    changed = positions(keys) != list(range(n)) or positions(values) != list(range(n))
    failed |= changed
    print(f"{type(cache).__name__}{f'(max_size={MAX_SIZE})' if isinstance(cache, RotatingKVCache) else ''}: "
          f"prefill of {n} tokens [0..{n - 1}], then one token 100 -> the caller's keys {positions(keys)}"
          f"{'  <- written into' if changed else ''}")

# 2. Through a prompt cache: insert_cache keeps the caller's cache object;
#    its K/V (max_size tokens: a system prompt's, say) prefill a new
#    request's RotatingKVCache, which then decodes one token: the stored
#    entry changes, as every later fetch_nearest_cache shows.
store = LRUPromptCache()
entry = RotatingKVCache(MAX_SIZE)
entry.update_and_fetch(*tokens(0, MAX_SIZE))
store.insert_cache("model", [1, 2, 3, 4], [entry])
before = positions(store.fetch_nearest_cache("model", [1, 2, 3, 4])[0][0].keys_and_values()[0])
request = RotatingKVCache(MAX_SIZE)
request.update_and_fetch(*entry.keys_and_values())  # prefill from the stored entry's K/V
request.update_and_fetch(*tokens(100, 1))  # decode one token on the request's own cache
after = positions(store.fetch_nearest_cache("model", [1, 2, 3, 4])[0][0].keys_and_values()[0])
failed |= before != after
print(f"LRUPromptCache: the stored entry's K/V {before} prefill a new RotatingKVCache; after it decodes one "
      f"token, fetch_nearest_cache gives {after}{'  <- written into' if before != after else ''}")

print("DEFECT PRESENT (exit 1)" if failed else "fixed (exit 0)")
raise SystemExit(1 if failed else 0)
