"""transformers' EncoderDecoderCache as kvcheck reads it, and the tiny
encoder-decoder model (BART's architecture, random weights made in code:
nothing is downloaded) that generates over it, for
transformers_caches_adapter.py's `--cache encdec`.

An EncoderDecoderCache holds two DynamicCaches: the decoder's
self-attention K/V, which grow with every token the decoder is fed, and
the cross-attention K/V, the encoder output's projections, computed once
per encoder input (a layer's `is_updated` flag says it holds them; the
model then reads them and never writes them again). kvcheck sees one
cache of 2 x L layers: layers 0 to L-1 are the self-attention layers,
L to 2L-1 the cross-attention layers (`EncoderDecoder.layers`), so every
tensor of both halves is read, compared and followed for sharing.

    model = tiny_model()                           # 2 decoder layers: kvcheck sees 4
    cache = split(hf.materialize(content), model)  # an EncoderDecoder over a real EncoderDecoderCache
    tokens = generate(model, [7, 3], cache, 4)     # model.generate over it: 4 new tokens
"""

from __future__ import annotations

import functools
from typing import Dict, List, Sequence

import torch
import transformers

from kvcheck_adapter import copies, hf, wire

# A random-weight BART at transformers' init_std (0.02) is almost blind to
# its cache: a redrawn key of one cached token, in either layer, self or
# cross, changed none of 8 greedy tokens. At 0.3 each of them did, so a
# dropped, shared or changed token changes what it generates.
INIT_STD = 0.3
START_TOKEN = hf.PLACEHOLDER_TOKEN  # decoder_start_token_id: a cached position's placeholder
ENCODER_TOKENS_EMPTY = 4  # the encoder input's length when the cache holds no cross-attention K/V


class EncoderDecoder:
    """An EncoderDecoderCache as kvcheck reads it: `layers` is its
    self-attention layers then its cross-attention layers (the layer
    objects themselves, read through on every access). The store, its
    copies and the model all use `cache`, the transformers object; this is
    the handle kvcheck holds (one per EncoderDecoderCache)."""

    __slots__ = ("cache", "__weakref__")

    def __init__(self, cache: transformers.EncoderDecoderCache):
        self.cache = cache

    @property
    def layers(self) -> List:
        return list(self.cache.self_attention_cache.layers) + list(self.cache.cross_attention_cache.layers)

    def storage(self) -> List[int]:
        """The identities it is made of: the EncoderDecoderCache, its two
        DynamicCaches and its is_updated dict (objects: id()), then each
        half's layer list, layer objects and storages (wire.storage_of)."""
        cache = self.cache
        ids = [id(cache), id(cache.self_attention_cache), id(cache.cross_attention_cache), id(cache.is_updated)]
        return ids + wire.storage_of(cache.self_attention_cache) + wire.storage_of(cache.cross_attention_cache)


def split(flat, decoder_layers: int) -> EncoderDecoder:
    """An EncoderDecoderCache whose self-attention cache holds the first
    `decoder_layers` layers of `flat` (a DynamicCache, its layers' tensors
    themselves, not copied) and whose cross-attention cache holds the rest,
    built by transformers' own constructor (which sets `is_updated` for
    every cross-attention layer holding tokens)."""
    layers = [(layer.keys, layer.values, bool(getattr(layer, "is_initialized", layer.keys is not None)))
              for layer in flat.layers]
    self_attention = hf.cache_of_layers(layers[:decoder_layers])
    cross_attention = hf.cache_of_layers(layers[decoder_layers:])
    return EncoderDecoder(transformers.EncoderDecoderCache(self_attention, cross_attention))


def empty() -> EncoderDecoder:
    return EncoderDecoder(transformers.EncoderDecoderCache(transformers.DynamicCache(), transformers.DynamicCache()))


def tiny_config(layers: int = 2, heads: int = 2, head_dim: int = 8, vocab: int = 64):
    """A BartConfig of a tiny float32 encoder-decoder: `layers` encoder and
    decoder layers, `heads` heads of `head_dim` in every attention (BART's
    K/V heads are its attention heads), eos, bos, pad and forced tokens
    disabled (generation makes exactly max_new_tokens), decoder start token
    the placeholder 0."""
    hidden = heads * head_dim
    return transformers.BartConfig(
        vocab_size=vocab,
        d_model=hidden,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=2 * hidden,
        decoder_ffn_dim=2 * hidden,
        max_position_embeddings=hf.POSITIONS_MAX,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        decoder_start_token_id=START_TOKEN,
        forced_bos_token_id=None,
        forced_eos_token_id=None,
        tie_word_embeddings=False,
        init_std=INIT_STD,
    )


def tiny_model(seed: int = 1, config=None):
    """A BartForConditionalGeneration of tiny_config() (or `config`),
    float32, eval mode, weights from torch's generator seeded with `seed`
    (the global generator left as it was), forwards marked for the copy
    tracker over the cache's EncoderDecoder view."""
    config = config if config is not None else tiny_config()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.BartForConditionalGeneration(config)
    model = model.to(torch.float32).eval()
    for name in ("eos_token_id", "pad_token_id", "bos_token_id", "forced_bos_token_id", "forced_eos_token_id"):
        setattr(model.generation_config, name, None)
    return _mark_forwards(model)


def _mark_forwards(model):
    # hf.mark_forwards, over the EncoderDecoder view of the cache the
    # forward is given (the copy tracker reads caches by their layers).
    forward = model.forward

    @functools.wraps(forward)
    def marked(*args, **kwargs):
        cache = kwargs.get("cache")
        if cache is None:
            return forward(*args, **kwargs)
        with copies.model_forward(EncoderDecoder(cache)):
            return forward(*args, **kwargs)

    model.forward = marked
    return model


def decoder_layers(model) -> int:
    return int(model.config.decoder_layers)


def model_domain(model) -> Dict:
    """hf.model_domain of the decoder: 2 x decoder_layers layers (self
    then cross), BART's heads and head_dim."""
    config = model.config
    return {
        "layers": 2 * decoder_layers(model),
        "heads": int(config.decoder_attention_heads),
        "head_dim": int(config.d_model // config.decoder_attention_heads),
        "dtypes": ["f32"],
        "layouts": [hf.LAYOUT],
        "odd_layers": False,
    }


def _held(half, name: str, domain: Dict) -> int:
    """The tokens every layer of one half holds (one length); OutsideDomain
    (one sentence) for a half the model cannot run over."""
    lengths = set()
    for i, layer in enumerate(half.layers):
        for side in ("keys", "values"):
            tensor = getattr(layer, side, None)
            held = 0 if tensor is None or tensor.numel() == 0 else int(tensor.shape[-2])
            lengths.add(held)
            wanted = (1, domain["heads"], held, domain["head_dim"])
            if held and (tuple(tensor.shape) != wanted or tensor.dtype != torch.float32):
                raise hf.OutsideDomain(
                    f"{name} layer {i} {side}: {tensor.dtype} {list(tensor.shape)};"
                    f" the model needs float32 {list(wanted)}"
                )
    if len(lengths) > 1:
        raise hf.OutsideDomain(f"the {name} layers hold {sorted(lengths)} tokens: the model needs one length")
    held = lengths.pop() if lengths else 0
    if held and len(half.layers) != domain["layers"] // 2:
        raise hf.OutsideDomain(
            f"the cache holds {len(half.layers)} {name} layers; the model has {domain['layers'] // 2}")
    return held


def generate(model, prompt: Sequence[int], handle: EncoderDecoder, max_new_tokens: int, fed_once: bool = False,
             **options) -> List[int]:
    """transformers' own generation over the EncoderDecoderCache
    `handle.cache`, written into in place, as hf.generate runs a decoder:
    decoder_input_ids are placeholders (the start token) for the cached
    self-attention positions, then the prompt (generate prepends the start
    token to a prompt that does not begin with it), with a decoder mask of
    ones over all of them, so that generate feeds only what the cache does
    not hold. `fed_once` (the reference's generation): afterwards the cache
    must hold every token of the decoder sequence but the last, once (a
    RuntimeError otherwise: the reference fed a sequence twice or skipped
    one); the engine's own generation is judged by kvcheck instead. The encoder input is as long as the cached
    cross-attention K/V (ENCODER_TOKENS_EMPTY with none): the model reads
    those K/V (is_updated) and never the encoder's output, whose length
    sizes the cross-attention mask only; an empty cache gets the encoder's
    K/V of that fixed input. Beam search expands the cache first
    (hf.generate's beams)."""
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise ValueError("generate: the prompt is empty")
    vocab = model.config.vocab_size
    if any(not 0 <= t < vocab for t in prompt):
        raise hf.OutsideDomain(f"generate: prompt {prompt} has a token outside the vocabulary [0, {vocab})")
    domain = model_domain(model)
    cache = handle.cache
    positions = _held(cache.self_attention_cache, "self-attention", domain)
    encoder_tokens = _held(cache.cross_attention_cache, "cross-attention", domain) or ENCODER_TOKENS_EMPTY
    if max(positions + len(prompt) + 1 + max_new_tokens, encoder_tokens) > hf.POSITIONS_MAX:
        raise hf.OutsideDomain(f"generate: {positions} cached + {len(prompt)} prompt + {max_new_tokens} new tokens"
                               f" exceed the model's {hf.POSITIONS_MAX} positions")
    if max_new_tokens == 0:
        return []
    decoder_ids = torch.tensor([[START_TOKEN] * positions + prompt], dtype=torch.long)
    encoder_ids = torch.arange(encoder_tokens, dtype=torch.long).remainder(vocab).unsqueeze(0)
    with torch.no_grad(), hf._beams(cache, positions, int(options.get("num_beams", 1)), marked=handle):
        output = model.generate(
            input_ids=encoder_ids,
            attention_mask=torch.ones_like(encoder_ids),
            decoder_input_ids=decoder_ids,
            # The whole decoder sequence's mask: generate then feeds only the
            # positions the cache does not hold (without it, it takes the
            # decoder_input_ids as new tokens and feeds the cached positions
            # again).
            decoder_attention_mask=torch.ones_like(decoder_ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            cache=cache,
            **options,
        )
    if fed_once and cache.get_seq_length() != output.shape[1] - 1:
        # Every token of the decoder sequence but the last is in the cache
        # once: anything else is a sequence fed twice or skipped.
        raise RuntimeError(f"generate left {cache.get_seq_length()} self-attention positions in the cache for a"
                           f" decoder sequence of {output.shape[1]} tokens (expected {output.shape[1] - 1})")
    return output[0, -max_new_tokens:].tolist()
