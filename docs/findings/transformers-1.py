"""transformers 5.25.0: assisted (prompt lookup) decoding from a pre-filled cache
re-feeds the cached positions, so it does not give greedy's tokens.

Exits 1 when the defect is there, 0 when it is fixed, 2 when it cannot run
(torch or transformers missing, or a transformers without the `cache=`
argument of transformers 5); its last line says which."""

import inspect

try:
    import torch
    import transformers
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
except ImportError as error:
    print(f"CANNOT RUN (exit 2): {error}; needs transformers (5.25.0 shown) and torch")
    raise SystemExit(2) from None
if "cache" not in inspect.signature(LlamaForCausalLM.forward).parameters:
    print(f"CANNOT RUN (exit 2): transformers {transformers.__version__} has no `cache=` argument (transformers 5's API)")
    raise SystemExit(2)

config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                     bos_token_id=None, eos_token_id=None, pad_token_id=None)
torch.manual_seed(1)
model = LlamaForCausalLM(config).eval()
model.generation_config.eos_token_id = model.generation_config.pad_token_id = None

prefix = [5, 9, 17]          # the conversation so far, already in a cache
prompt = [33]                # the new turn
input_ids = torch.tensor([prefix + prompt])


def prefilled():
    cache = DynamicCache()
    with torch.no_grad():
        model(torch.tensor([prefix]), cache=cache)
    return cache


def run(**options):
    cache = prefilled()
    with torch.no_grad():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), cache=cache,
                             max_new_tokens=6, do_sample=False, **options)
    return out[0, input_ids.shape[1]:].tolist(), int(cache.get_seq_length())


print("transformers", transformers.__version__, "torch", torch.__version__)
greedy, greedy_len = run()
lookup, lookup_len = run(prompt_lookup_num_tokens=3)
print("greedy       ", greedy, "cache length", greedy_len)
print("prompt lookup", lookup, "cache length", lookup_len)
print("expected cache length", len(prefix) + len(prompt) + 6 - 1)
print("same tokens:", greedy == lookup)
failed = greedy != lookup or lookup_len != greedy_len
print("DEFECT PRESENT (exit 1)" if failed else "fixed (exit 0)")
raise SystemExit(1 if failed else 0)
