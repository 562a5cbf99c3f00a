"""transformers 5.25.0: assisted (prompt lookup) decoding from a pre-filled cache
re-feeds the cached positions, so it does not give greedy's tokens."""
import torch
import transformers
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

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
