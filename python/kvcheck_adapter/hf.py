"""The real transformers library, as kvcheck's SDK meets it: its
DynamicCache holding given content, and a tiny real model generating over
such a cache exactly as a store does in production.

Whatever transformers is importable is used, told apart by what its objects
have, never by version strings:
  - the layout: a DynamicCache with a `layers` list is modern (>= 4.56), one
    with `key_cache`/`value_cache` lists legacy (<= 4.53);
  - the initialized flag: a modern layer with `is_initialized` (>= 4.57)
    carries it; one without (4.56) is initialized exactly when its keys are
    not None (a placeholder layer until its first update);
  - the name generate and the model's forward give the cache: `cache` when
    the forward takes it (5.x, where `past_key_values` is deprecated), else
    `past_key_values`.

Reading a real cache needs nothing here: wire.view_json, wire.storage_of,
observe.storage_of and observe.seq_length read any cache by its attributes,
transformers' included (tests/test_hf.py checks them on every layout).

This module is named hf, not transformers, so that it can never shadow the
real package.

    model = tiny_model()                          # 2 layers, 2 KV heads of 8, seeded
    cache = materialize(content)                  # a real DynamicCache holding `content`
    tokens = generate(model, [7, 3], cache, 4)    # model.generate over it: 4 new tokens
    model_domain(model)                           # what kvcheck may draw for this model
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import transformers
from transformers import cache_utils as _cache_utils

from . import cache as _cache
from . import content as _content
from . import copies as _copies
from . import observe as _observe
from . import wire as _wire

Tensor = torch.Tensor

# ---- the installed layout ----------------------------------------------------------------

#: "modern" or "legacy": the layout of the installed DynamicCache.
LAYOUT: str = _content.cache_layout(transformers.DynamicCache())

#: Does a modern layer carry an `is_initialized` flag (else a layer holding
#: keys is initialized and one without is a placeholder)?
HAS_INITIALIZED_FLAG: bool = LAYOUT == "modern" and hasattr(_cache_utils.DynamicLayer(), "is_initialized")

VERSION: str = transformers.__version__  # for reports only: nothing here branches on it

# Positions the tiny model takes: the largest cache kvcheck draws (the large
# scope's 2048 tokens a layer, a merge of up to three ids) with its prompt
# and new tokens (6151 positions) fits more than twice over
# (harness/workload.cpp); generate refuses a longer one by name.
POSITIONS_MAX = 16384
PLACEHOLDER_TOKEN = 0  # input_ids of the cached positions: generate never feeds them


class OutsideDomain(ValueError):
    """Content a real cache of the installed transformers cannot hold (the
    other layout, a legacy-named slot, an uninitialized layer holding
    tensors where layers have no flag), or a request the model cannot run."""


def new_cache():
    """A new empty DynamicCache of the installed version."""
    return transformers.DynamicCache()


def _new_layer():
    return _cache_utils.DynamicLayer()


def _lazy_initialization_takes_values() -> bool:
    if LAYOUT != "modern":
        return False
    return len(inspect.signature(_new_layer().lazy_initialization).parameters) >= 2


_LAZY_TAKES_VALUES = _lazy_initialization_takes_values()


def make_layer(keys: Optional[Tensor], values: Optional[Tensor], initialized: bool):
    """A real DynamicLayer holding `keys` and `values` (not copied), with the
    flag given: initialized through the version's own lazy_initialization
    (which sets the flag, dtype and device where the version has them),
    then the tensors put in place. OutsideDomain for what the version's
    layer cannot be: on a version without the flag, an initialized layer
    without keys or an uninitialized one holding tensors."""
    layer = _new_layer()
    if not HAS_INITIALIZED_FLAG and initialized != (keys is not None):
        raise OutsideDomain(
            f"transformers {VERSION}'s layers have no initialized flag (a layer is initialized exactly when it holds"
            f" keys): a layer {'initialized without keys' if initialized else 'holding tensors but uninitialized'}"
            " cannot be built"
        )
    if initialized and keys is not None:
        if _LAZY_TAKES_VALUES:
            layer.lazy_initialization(keys, values if values is not None else keys)
        else:
            layer.lazy_initialization(keys)
    layer.keys, layer.values = keys, values
    if HAS_INITIALIZED_FLAG:
        layer.is_initialized = initialized
    return layer


def cache_of_layers(layers: Sequence[Tuple[Optional[Tensor], Optional[Tensor], bool]]):
    """A real DynamicCache of the installed layout whose layer i holds
    layers[i] = (keys, values, initialized), the tensors themselves (not
    copied). Legacy: the lists hold keys and values (every layer counts as
    initialized; an uninitialized one is OutsideDomain)."""
    cache = new_cache()
    if LAYOUT == "legacy":
        for i, (keys, values, initialized) in enumerate(layers):
            if not initialized:
                raise OutsideDomain(f"layer {i}: a legacy cache (transformers {VERSION}) has no uninitialized layers")
            cache.key_cache.append(keys)
            cache.value_cache.append(values)
        if hasattr(cache, "_seen_tokens"):
            cache._seen_tokens = _observe.seq_length(cache)  # what update would have counted
        return cache
    for keys, values, initialized in layers:
        cache.layers.append(make_layer(keys, values, initialized))
    return cache


def materialize(content: _content.CacheContent):
    """A real DynamicCache of the installed version holding exactly
    `content` (as wire.materialize builds the SDK's own caches): every slot a
    tensor in a storage of its own, bit for bit content.slot_tensor, the
    layers' flags as given. OutsideDomain for content the installed layout
    cannot hold: the other layout, legacy-named slots, an uninitialized layer
    holding tensors on a version whose layers have no flag."""
    if content.layout != LAYOUT:
        raise OutsideDomain(
            f"content of the {content.layout} layout: transformers {VERSION}'s DynamicCache has the {LAYOUT} layout"
        )

    def make(slot):
        return _wire.slot_tensor(slot, content.dtype, content.heads, content.head_dim)

    layers = []
    for i, layer in enumerate(content.layers):
        named = [n for n, s in zip(_content.SLOT_NAMES[2:], layer.slots[2:]) if s.present]
        if named:
            raise OutsideDomain(
                f"layer {i} holds {' and '.join(named)}: transformers {VERSION}'s layers have no legacy-named slots"
            )
        layers.append((make(layer.slots[_content.KEYS]), make(layer.slots[_content.VALUES]), layer.initialized))
    return cache_of_layers(layers)


# ---- the tiny model ------------------------------------------------------------------------


def tiny_config(
    layers: int = 2,
    kv_heads: int = 2,
    query_heads: int = 4,
    head_dim: int = 8,
    vocab: int = 64,
    hidden: int = 32,
    sliding_window: Optional[int] = None,
):
    """A LlamaConfig of a tiny float32 model: eos, bos and pad disabled, so
    that generation always makes exactly max_new_tokens. With
    `sliding_window`, a MistralConfig instead (Llama's architecture with
    sliding-window attention in every layer: each token attends over the
    last `sliding_window` positions, itself included), whose caches built
    from the config (DynamicCache(config=...), StaticCache) are made of
    transformers' sliding-window layers."""
    config_class = transformers.LlamaConfig if sliding_window is None else transformers.MistralConfig
    window = {} if sliding_window is None else {"sliding_window": int(sliding_window)}
    return config_class(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=query_heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=POSITIONS_MAX,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
        **window,
    )


def tiny_model(seed: int = 1, config=None):
    """A LlamaForCausalLM of tiny_config() (or `config`; a MistralForCausalLM
    of a MistralConfig), float32, eval mode, weights drawn from torch's
    generator seeded with `seed` (the global generator is left as it was),
    forwards marked for the copy tracker (mark_forwards). Made in code:
    nothing is downloaded."""
    config = config if config is not None else tiny_config()
    sliding = isinstance(config, transformers.MistralConfig)
    model_class = transformers.MistralForCausalLM if sliding else transformers.LlamaForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    model = model.to(torch.float32).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    model.generation_config.bos_token_id = None
    return mark_forwards(model)


def _cache_argument(model) -> str:
    """The name the model's forward (and so generate) gives the cache."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def mark_forwards(model):
    """Wraps the model's forward (once) in copies.model_forward over the
    cache it is given, as decoder.Decoder marks its own: inside a forward
    nothing counts as a copy (the model's appends), and the K/V sets on the
    cache's path are sampled at its entry and exit. Free when nothing
    records."""
    if getattr(model, "_kvcheck_marked", False):
        return model
    name = _cache_argument(model)
    forward = model.forward

    @functools.wraps(forward)
    def marked(*args, **kwargs):
        cache = kwargs.get(name)
        if cache is None:
            return forward(*args, **kwargs)
        with _copies.model_forward(cache):
            return forward(*args, **kwargs)

    model.forward = marked
    model._kvcheck_marked = True
    return model


def model_domain(model) -> Dict[str, Any]:
    """What kvcheck may draw for this model and the installed layout (the
    hello reply's `model`): its K/V geometry from the config, float32 only,
    the installed layout only, no odd layers (one-sided, legacy-named or
    uninitialized ones, which a real model does not make)."""
    config = model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return {
        "layers": int(config.num_hidden_layers),
        "heads": int(heads),
        "head_dim": int(head_dim),
        "dtypes": ["f32"],
        "layouts": [LAYOUT],
        "odd_layers": False,
    }


def domain_text(domain: Dict[str, Any]) -> str:
    """The domain as `kvcheck run --model` takes it:
    layers=2,heads=2,head_dim=8,dtype=f32,layout=modern (several dtypes or
    layouts joined by '+'; odd_layers=yes only when allowed, no being the
    default)."""
    parts = [f"layers={domain['layers']}", f"heads={domain['heads']}", f"head_dim={domain['head_dim']}"]
    parts += [f"dtype={'+'.join(domain['dtypes'])}", f"layout={'+'.join(domain['layouts'])}"]
    if domain.get("odd_layers"):
        parts.append("odd_layers=yes")
    return ",".join(parts)


def capabilities(domain: Dict[str, Any]) -> Dict[str, bool]:
    """The capability flags of a store of real caches of the installed
    transformers holding `domain`'s caches (model_domain): its one layout (so
    no conversions), float32 caches of the model's geometry (any_geometry
    says it is not kvcheck's default 2x4; the domain says which it is), no
    odd layers, no streaming."""
    return {
        "legacy_layout": LAYOUT == "legacy",
        "conversions": False,
        "half_dtypes": False,
        "one_sided_layers": False,
        "legacy_slot_names": False,
        "uninitialized_layers": False,
        "any_geometry": (domain["heads"], domain["head_dim"]) != (2, 4),
        "generate_stream": False,
        "modern_layout": LAYOUT == "modern",
    }


def add_print_model(parser) -> None:
    """An adapter's --print-model option (see model_or_print)."""
    parser.add_argument("--print-model", action="store_true",
                        help="print the model's domain as kvcheck run --model takes it, and exit")


def model_or_print(arguments, config=None):
    """The tiny model an adapter serves (of `config`, else tiny_config()), or
    None once its domain is printed as `kvcheck run --model` takes it
    (--print-model: the adapter exits)."""
    model = tiny_model(config=config)
    if arguments.print_model:
        print(domain_text(model_domain(model)))
        return None
    return model


def _check_geometry(model, cache) -> int:
    """The tokens the cache holds (its first layer's keys: a sliding-window
    layer holds its window only); OutsideDomain (one sentence) when the
    model cannot run over it."""
    domain = model_domain(model)
    layers = _observe_layers(cache)
    first = layers[0][0] if layers else None
    length = 0 if first is None or first.numel() == 0 else int(first.shape[-2])
    if length > 0 and len(layers) != domain["layers"]:
        raise OutsideDomain(f"the cache holds {len(layers)} layers; the model has {domain['layers']}")
    for i, (keys, values) in enumerate(layers):
        for side, tensor in (("keys", keys), ("values", values)):
            if tensor is None or tensor.numel() == 0:
                if length > 0:
                    raise OutsideDomain(f"layer {i} holds no {side} but the cache holds {length} tokens")
                continue
            wanted = (1, domain["heads"], length, domain["head_dim"])
            if tuple(tensor.shape) != wanted or tensor.dtype != torch.float32:
                raise OutsideDomain(
                    f"layer {i} {side}: {tensor.dtype} {list(tensor.shape)}; the model needs float32 {list(wanted)}"
                )
    return length


def _observe_layers(cache) -> List[Tuple[Optional[Tensor], Optional[Tensor]]]:
    # The keys and values the model would see, per layer.
    cache = logical_cache(cache)
    return [(_cache.logical_keys(cache, i), _cache.logical_values(cache, i)) for i in range(_cache.layer_count(cache))]


class _HeldLayer:
    """A static layer as the model sees it: its buffers cut to the tokens
    it holds (views of them, not copies)."""

    __slots__ = ("keys", "values", "is_initialized")

    def __init__(self, keys: Optional[Tensor], values: Optional[Tensor], initialized: bool):
        self.keys, self.values, self.is_initialized = keys, values, initialized


class _HeldCache:
    __slots__ = ("layers",)

    def __init__(self, layers):
        self.layers = layers


def held_tokens(layer) -> int:
    """The tokens a static layer holds at the front of its preallocated
    buffers (StaticLayer: `cumulative_length`; a sliding one, which keeps
    at most its window: `cumulative_length_int`, capped)."""
    if not getattr(layer, "is_initialized", False):
        return 0
    length = int(getattr(layer, "cumulative_length_int", layer.get_seq_length()))
    return min(length, int(layer.max_cache_len))


def logical_cache(cache):
    """`cache` as a model sees it, for reading: the cache itself unless
    some layer is a static one (transformers' StaticLayer, which
    preallocates max_cache_len slots and fills them from the front), then
    a stand-in whose every layer shows the tokens it holds (views of the
    layer's buffers: the same storages). Read-only: writing through it
    changes the cache."""
    if _content.cache_layout(cache) != "modern" or not any(
        hasattr(layer, "max_cache_len") for layer in cache.layers
    ):
        return cache
    layers = []
    for layer in cache.layers:
        if not hasattr(layer, "max_cache_len"):
            layers.append(layer)
            continue
        held = held_tokens(layer)
        initialized = bool(getattr(layer, "is_initialized", False))
        keys = layer.keys[:, :, :held] if initialized else None
        values = layer.values[:, :, :held] if initialized else None
        layers.append(_HeldLayer(keys, values, initialized))
    return _HeldCache(layers)


@contextlib.contextmanager
def _beams(cache, cached: int, beams: int, marked=None):
    """Beam search over `cache`, the cache the model writes into: generate
    expands the prompt to the beams, not a cache it is given (a cache of
    one row meets rows of `beams`: a size mismatch), so a cache holding
    tokens is expanded first by its own batch_repeat_interleave; generate
    then calls its reorder_cache after every step to follow the beams.
    Both are the decoding's work on the cache the model writes into, its
    own working state as its appends are, and marked so
    (copies.model_forward): they copy that cache, never the store's, which
    single-copy judges. The cache is left holding `beams` rows. `marked`:
    what the copy tracker reads as that cache (by default the cache
    itself; an EncoderDecoderCache's layers view)."""
    if beams <= 1 or cached == 0:
        yield
        return
    marked = cache if marked is None else marked
    with _copies.model_forward(marked):
        cache.batch_repeat_interleave(beams)
    reorder = cache.reorder_cache

    def reorder_marked(beam_idx):
        with _copies.model_forward(marked):
            reorder(beam_idx)

    cache.reorder_cache = reorder_marked
    try:
        yield
    finally:
        del cache.reorder_cache


def generate(model, prompt: Sequence[int], cache, max_new_tokens: int, **options) -> List[int]:
    """transformers' own greedy generation over `cache`, written into in
    place, exactly as a store runs it: input_ids are placeholder tokens for
    the cached positions then the prompt (generate feeds only the positions
    the cache does not hold), an attention mask of ones, do_sample off.
    Returns the max_new_tokens new tokens (eos is disabled); 0 runs nothing.
    `options` go to model.generate as they are (for example
    prompt_lookup_num_tokens=3: assisted decoding, whose greedy output is
    documented to be greedy's; num_beams=2: beam search, the cache expanded
    to the beams by its batch_repeat_interleave first, and left so).
    OutsideDomain for a cache the model cannot run over."""
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise ValueError("generate: the prompt is empty")
    if max_new_tokens < 0:
        raise ValueError("generate: max_new_tokens < 0")
    vocab = model.config.vocab_size
    if any(not 0 <= t < vocab for t in prompt):
        raise OutsideDomain(f"generate: prompt {prompt} has a token outside the vocabulary [0, {vocab})")
    cached = _check_geometry(model, cache)
    # The positions the cache was fed: the tokens it holds, or for a
    # sliding-window layer every position it was fed (cumulative_length),
    # more than the window it keeps. generate numbers the prompt on from it.
    positions = max(cached, _observe.seq_length(cache))
    if positions + len(prompt) + max_new_tokens > POSITIONS_MAX:
        raise OutsideDomain(
            f"generate: {positions} cached + {len(prompt)} prompt + {max_new_tokens} new tokens exceed the model's"
            f" {POSITIONS_MAX} positions"
        )
    if max_new_tokens == 0:
        return []
    input_ids = torch.tensor([[PLACEHOLDER_TOKEN] * positions + prompt], dtype=torch.long)
    arguments = {_cache_argument(model): cache}
    with torch.no_grad(), _beams(cache, cached, int(options.get("num_beams", 1))):
        output = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            **arguments,
            **options,
        )
    tokens = output[0, input_ids.shape[1] :].tolist()
    if len(tokens) != max_new_tokens:
        raise RuntimeError(f"generate made {len(tokens)} tokens, not {max_new_tokens} (is eos disabled?)")
    return tokens


__all__ = [
    "HAS_INITIALIZED_FLAG",
    "LAYOUT",
    "OutsideDomain",
    "POSITIONS_MAX",
    "VERSION",
    "add_print_model",
    "cache_of_layers",
    "capabilities",
    "domain_text",
    "generate",
    "held_tokens",
    "logical_cache",
    "make_layer",
    "mark_forwards",
    "model_or_print",
    "materialize",
    "model_domain",
    "new_cache",
    "tiny_config",
    "tiny_model",
]
