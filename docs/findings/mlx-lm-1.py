"""mlx-lm 0.32.2: ConcatenateKVCache.trim lowers the offset but keeps the
trimmed tokens: keys_and_values() still returns them, and the next
update_and_fetch appends after them (and sets the offset back to all of
them). trim_prompt_cache, can_trim_prompt_cache and LRUPromptCache's
fetch_nearest_cache (which trims a deep copy of a longer entry) trust it.

Needs only mlx-lm and MLX (pip install mlx-lm; on Linux the mlx[cpu] build):
    python mlx-lm-1.py
Exits 1 when the defect is there (prints what it saw), 0 when it is fixed,
2 when it cannot run (MLX or an mlx-lm without these classes); its last line
says which."""

try:
    import mlx.core as mx
    from mlx_lm.models import llama
    from mlx_lm.models.cache import (ConcatenateKVCache, KVCache, LRUPromptCache, can_trim_prompt_cache,
                                     trim_prompt_cache)
except ImportError as error:
    print(f"CANNOT RUN (exit 2): {error}; needs mlx-lm (0.32.2 shown) and MLX")
    raise SystemExit(2) from None


def tokens(start, count):
    """K/V of `count` tokens whose values are their positions start.. (1 head of 1)."""
    x = mx.arange(start, start + count, dtype=mx.float32).reshape(1, 1, count, 1)
    return x, x


def positions(cache):
    keys, _ = cache.keys_and_values()
    return [int(v) for v in keys.reshape(-1).tolist()]


failed = False

# 1. The class alone: 5 tokens, trim 3, append 1.
for cls in (KVCache, ConcatenateKVCache):
    cache = cls()
    cache.update_and_fetch(*tokens(0, 5))
    assert can_trim_prompt_cache([cache])
    trimmed = trim_prompt_cache([cache], 3)
    offset, after_trim = cache.offset, positions(cache)
    cache.update_and_fetch(*tokens(100, 1))
    after_append = positions(cache)
    print(f"{cls.__name__}: trimmed {trimmed} of 5 -> offset {offset}, keys_and_values {after_trim}; "
          f"one token appended -> offset {cache.offset}, keys_and_values {after_append}")
    if after_trim != [0, 1] or after_append != [0, 1, 100]:
        failed = True

# 2. Through LRUPromptCache and a model: a cached conversation, then a
# prompt that shares only its first 4 tokens; fetch_nearest_cache trims a
# deep copy of the longer entry to the shared prefix. Generating from it
# should give what a fresh computation of the prompt gives.
args = llama.ModelArgs(model_type="llama", hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5,
                       vocab_size=64, tie_word_embeddings=False)
mx.random.seed(1)
model = llama.Model(args)
mx.eval(model.parameters())


def new_cache():
    return [ConcatenateKVCache() for _ in range(args.num_hidden_layers)]


def logits_of(prompt, cache):
    return model(mx.array([prompt]), cache=cache)[0, -1]


cached = [1, 2, 3, 4, 5, 6, 7, 8]
entry = new_cache()
mx.eval(logits_of(cached, entry))
prompt_cache = LRUPromptCache(max_size=4)
prompt_cache.insert_cache("m", cached, entry)

prompt = [1, 2, 3, 4, 9, 10]
cache, rest = prompt_cache.fetch_nearest_cache("m", prompt)
reused = logits_of(rest, cache)
fresh = logits_of(prompt, new_cache())
print(f"LRUPromptCache: fetch_nearest_cache({prompt}) reuses {len(prompt) - len(rest)} tokens of {cached}, "
      f"the rest {rest}; the cache then holds {cache[0].offset} tokens "
      f"(a fresh computation of the prompt: {len(prompt)})")
difference = float(mx.abs(reused - fresh).max())
print(f"  greedy next token from the reused cache {int(mx.argmax(reused))}, from a fresh one {int(mx.argmax(fresh))}; "
      f"largest logit difference {difference:.4g}")
if difference > 1e-4:
    failed = True

print("DEFECT PRESENT (exit 1)" if failed else "fixed (exit 0)")
raise SystemExit(1 if failed else 0)
