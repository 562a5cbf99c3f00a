"""transformers 5.25.0: assisted (prompt lookup) decoding from a pre-filled
EncoderDecoderCache re-feeds the cached decoder positions (transformers-1 on an
encoder-decoder model), so it does not give greedy's tokens.

Exits 1 when the defect is there, 0 when it is fixed, 2 when it cannot run
(torch or transformers missing, or a transformers without the `cache=`
argument of transformers 5); its last line says which."""

import inspect

try:
    import torch
    import transformers
    from transformers import BartConfig, BartForConditionalGeneration, DynamicCache, EncoderDecoderCache
except ImportError as error:
    print(f"CANNOT RUN (exit 2): {error}; needs transformers (5.25.0 shown) and torch")
    raise SystemExit(2) from None
if "cache" not in inspect.signature(BartForConditionalGeneration.forward).parameters:
    print(f"CANNOT RUN (exit 2): transformers {transformers.__version__} has no `cache=` argument (transformers 5's API)")
    raise SystemExit(2)

config = BartConfig(vocab_size=64, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                    decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, bos_token_id=None,
                    eos_token_id=None, pad_token_id=None, decoder_start_token_id=0, forced_bos_token_id=None,
                    forced_eos_token_id=None, init_std=0.3)
torch.manual_seed(3)
model = BartForConditionalGeneration(config).eval()
for name in ("eos_token_id", "pad_token_id", "bos_token_id", "forced_bos_token_id", "forced_eos_token_id"):
    setattr(model.generation_config, name, None)

encoder_ids = torch.tensor([[11, 12, 13, 14]])
decoded = [0, 5, 9, 17]      # the decoder's sequence so far, already in the cache
prompt = [33, 5, 9]          # the new tokens
decoder_ids = torch.tensor([decoded + prompt])


def prefilled():
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    with torch.no_grad():
        model(input_ids=encoder_ids, decoder_input_ids=torch.tensor([decoded]), cache=cache)
    return cache


def run(**options):
    cache = prefilled()
    with torch.no_grad():
        out = model.generate(input_ids=encoder_ids, attention_mask=torch.ones_like(encoder_ids),
                             decoder_input_ids=decoder_ids, decoder_attention_mask=torch.ones_like(decoder_ids),
                             cache=cache, max_new_tokens=6, do_sample=False, **options)
    return out[0, decoder_ids.shape[1]:].tolist(), int(cache.get_seq_length())


print("transformers", transformers.__version__, "torch", torch.__version__)
greedy, greedy_len = run()
lookup, lookup_len = run(prompt_lookup_num_tokens=3)
print("greedy       ", greedy, "cache length", greedy_len)
print("prompt lookup", lookup, "cache length", lookup_len)
print("expected cache length", len(decoded) + len(prompt) + 6 - 1)
print("same tokens:", greedy == lookup)
failed = greedy != lookup or lookup_len != greedy_len
print("DEFECT PRESENT (exit 1)" if failed else "fixed (exit 0)")
raise SystemExit(1 if failed else 0)
