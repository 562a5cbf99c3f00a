"""kvcheck's adapter for transformers' own cache classes beyond the
DynamicCache the examples use: a store whose every cache is a real
`StaticCache` (preallocated buffers filled from the front, as torch.compile
wants them) or a real `DynamicCache`, over a tiny seeded Llama made in code
(kvcheck_adapter.hf: nothing is downloaded), generating through
transformers' own `generate`: greedy, assisted (prompt lookup) or beam
search, its copies made by the class's update, `copy.deepcopy` or one of
the cache's batch operations.

    PYTHONPATH=.venv/transformers/5.25.0 kvcheck run --python .venv/bin/python \\
        --adapter 'python/adapters/transformers_caches_adapter.py --cache static'
    ... --adapter 'python/adapters/transformers_caches_adapter.py --cache dynamic --decoding prompt-lookup'
    ... --adapter 'python/adapters/transformers_caches_adapter.py --cache dynamic --decoding beam --copy select'
    ... --adapter 'python/adapters/transformers_caches_adapter.py --cache static --sliding-window 8'
    ... --adapter 'python/adapters/transformers_caches_adapter.py --cache encdec --decoding beam --copy select'

The mapping (python/README.md, "Real engines"):

| kvcheck | transformers |
|---|---|
| make | the class's own `update(keys, values, layer)` on a new cache (StaticCache(config, max_cache_len): `index_copy_` into the zeroed buffers) |
| add, get, get_cache(ids), delete | the store: id -> the cache object itself; get hands out the stored object |
| get_cache, clone, concat | a new cache of the class filled by `update` with each part's held K/V in order (static: one `index_copy_` a part; dynamic: one `torch.cat` a layer) |
| get_cache of one id, clone, the boundary's copy, with `--copy` (dynamic) | `deepcopy`: `copy.deepcopy(cache)`; `select`, `repeat`, `reorder`: a new DynamicCache whose layers hold the source's own tensors, then its `batch_select_indices([0])`, `batch_repeat_interleave(1)` or `reorder_cache([0])`, which rebinds each layer to the rows it selects (the copy; the source keeps its tensors). A merge of several is made as above |
| generate | `model.generate(..., cache=copy)`: the boundary copies the input (as clone) unless it is a copy the store handed out; `--decoding prompt-lookup` passes `prompt_lookup_num_tokens=3` (assisted decoding: candidates from n-grams of the input, verified in one forward, rejected ones removed by `cache.crop`); `--decoding beam` passes `num_beams=2` (beam search: the cache expanded to the beams by its `batch_repeat_interleave(2)`, as generate does not expand a cache it is given, then `reorder_cache` after every step; the cache is left holding 2 rows) |
| batch(rows, repeat, reorder, select) | (dynamic) the rows stacked into one DynamicCache (one `torch.cat` a layer along the batch), then its `batch_repeat_interleave(repeat)`, `reorder_cache(reorder)` when there is one, `batch_select_indices([select])`: the row handed out |
| trim(handle, keep) | `cache.crop(keep - held)` on a copy the caller holds (transformers 5's crop takes the tokens to remove, negative; dynamic: the layer's tensors sliced, static: `cumulative_length` lowered) |
| `--cache encdec`: make, copies, merges, batch | the same on the two halves of an EncoderDecoderCache (layers 0 to L-1 self-attention, L to 2L-1 cross-attention), each rebuilt by `EncoderDecoderCache(self_attention, cross_attention)`; `--copy` by its own `deepcopy`, `batch_select_indices`, `batch_repeat_interleave`, `reorder_cache` (both halves) |
| generate_fresh (the reference) | greedy `model.generate` on a DynamicCache holding the same K/V (transformers' default class): a static cache must generate what a dynamic one does; for `--decoding beam`, beam search on it the same way |

What kvcheck sees of a static cache is what the model sees: each layer's
buffers cut to the tokens it holds (hf.logical_cache: views of the same
storages, so sharing is still seen).

Assumptions (contract differences, declared rather than papered over):
  - max_cache_len is 4096: a StaticCache refuses tokens past it (its
    update raises: an engine error), kvcheck's store has no such limit. The
    default scope draws at most 512 tokens a layer, so a merge of up to 8
    such caches and its generation fit; a longer chain of merges would be an
    engine error, never a verdict (the buffer is the model's attention span:
    every forward attends over it, so it is kept this small for speed);
  - a copy is made with `update`, not `copy.deepcopy`: a deep copy of a
    StaticCache copies its whole preallocated buffer (max_cache_len slots),
    which single-copy would count as the wrong number of bytes (a copy of
    the held tokens is what kvcheck's model of a copy is);
  - `--sliding-window N` (docs/semantics.md, store windows): the model is
    a tiny Mistral whose every layer attends over its last N positions, and
    every cache is built from its config, of sliding-window layers:
    DynamicSlidingWindowLayer keeps the last N - 1 tokens (declared window
    N - 1), StaticSlidingWindowLayer min(N, max_cache_len) (declared N).
    transformers has no merge or copy of a windowed cache but deepcopy: a
    copy or merge is a new cache of the class holding the window of the
    concatenation of what the parts hold (each token copied once), its
    count of positions (cumulative_length, cumulative_length_int) set to
    the parts' sum. generate_fresh runs on a plain DynamicCache of the
    whole content make was given (the model's mask does the windowing).
    No batch (a sliding layer counts one position for all its rows), no
    --copy but update, and no prompt lookup with --cache static (its
    sliding layer over max_cache_len > N is not is_croppable: assisted
    decoding raises);
  - QuantizedCache is not offered yet: its stored K/V are its quantized
    ones (fp8 here; quanto and hqq are not installed). kvcheck's vocabulary
    for it is a declared content tolerance (docs/semantics.md "Content
    tolerance"; what a mapping must declare: "Real engines");
  - crop is kvcheck's `trim` of a copy the caller holds (never of a
    stored cache: stored caches are read-only);
  - the batch operations are mapped where kvcheck's model can judge
    them: as the store's copy of one cache (`--copy select|repeat|reorder`:
    a select of rows is a clone, judged by single-copy, clone-independent,
    layout-roundtrip and stored-immutable) and inside beam search
    (`--decoding beam`: the expansion and every reorder act on the cache
    the model writes into, the boundary's copy or an owned copy, never on
    a stored one: stored-immutable; they are the decoding's own working
    state, as the model's appends are, so single-copy counts the copies
    the store makes, not the beams': hf.generate marks them so). They
    need `--cache dynamic`: transformers 5.25's StaticLayer has no
    batch_repeat_interleave or batch_select_indices (Cache's calls raise
    AttributeError on a StaticCache), and a deep copy of a StaticCache
    copies its whole preallocated buffer;
  - kvcheck's `batch` (docs/semantics.md, batches) is mapped onto a
    DynamicCache's batch_repeat_interleave, reorder_cache and
    batch_select_indices in turn; the stacking of the rows is the
    adapter's (one cat a layer): transformers has none. A StaticCache
    claims no batch (StaticLayer has no batch_repeat_interleave or
    batch_select_indices in 5.25);
  - `--cache encdec` (docs/semantics.md "Real engines"): every cache is
    an EncoderDecoderCache over a tiny BART (_encoder_decoder.py), read as
    one cache of 2 x L layers, its self-attention layers then its
    cross-attention layers. kvcheck draws every layer of one length, so a
    cache's encoder input (the cross-attention K/V) is as long as its
    decoder history; a merge concatenates both halves (the decoder
    attends over every part's encoder output: Fusion-in-Decoder's form;
    transformers has no merge); generate runs the encoder on an input as
    long as the cached cross-attention K/V, which the decoder reads
    (is_updated) instead of the encoder's output; a generation grows the
    self-attention layers only. No trim: EncoderDecoderCache.crop cuts the
    self-attention layers only (crop runs inside prompt-lookup decoding);
  - transformers 5.25 has no legacy conversion (DynamicCache's
    to_legacy_cache and from_legacy_cache are gone): nothing to map.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import weakref

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # the SDK, when run from the source tree
sys.path.insert(0, _HERE)  # _encoder_decoder, also when the adapter is run by runpy

import torch  # noqa: E402
import transformers  # noqa: E402

from kvcheck_adapter import cache as kv  # noqa: E402
from kvcheck_adapter import hf  # noqa: E402
from kvcheck_adapter import wire  # noqa: E402
from kvcheck_adapter.adapter import Adapter, serve  # noqa: E402

import _encoder_decoder as encdec  # noqa: E402

CACHES = ("static", "dynamic", "encdec")
DECODINGS = {
    "greedy": {},
    # transformers' prompt lookup decoding: up to 3 candidate tokens a step.
    "prompt-lookup": {"prompt_lookup_num_tokens": 3},
    # beam search over 2 beams: the cache is expanded to the beams first
    # (generate expands the inputs, not a cache it is given), then
    # reorder_cache follows the beams at every step.
    "beam": {"num_beams": 2},
}
# What the reference, generate_fresh, decodes with: greedy for greedy and
# assisted decoding (documented to give greedy's tokens), beam search for
# beam search (on transformers' default class).
FRESH_DECODINGS = {"greedy": "greedy", "prompt-lookup": "greedy", "beam": "beam"}


def _rows_of(cache, operation):
    """A copy of a DynamicCache made by one of transformers' batch
    operations: a new DynamicCache whose layers hold the source's own
    tensors (no copy), then `operation` on it, which rebinds every layer
    holding tokens to the rows it selects (a new tensor: the copy)."""
    shallow = hf.cache_of_layers([(layer.keys, layer.values, layer.is_initialized) for layer in cache.layers])
    operation(shallow)
    return shallow


# How the store copies one cache (get_cache of one id, clone, the
# boundary's copy before a generation); a merge of several is always the
# class's update (static) or one cat a layer (dynamic).
COPIES = {
    "update": None,
    "deepcopy": copy.deepcopy,
    "select": lambda cache: _rows_of(cache, lambda c: c.batch_select_indices(torch.tensor([0]))),
    "repeat": lambda cache: _rows_of(cache, lambda c: c.batch_repeat_interleave(1)),
    "reorder": lambda cache: _rows_of(cache, lambda c: c.reorder_cache(torch.tensor([0]))),
}
MAX_CACHE_LEN = 4096




def positions_of(cache) -> int:
    """The positions `cache` was fed: its get_seq_length, which a
    sliding-window layer counts as every token it was fed
    (cumulative_length, cumulative_length_int), more than the window it
    holds."""
    return int(cache.get_seq_length())


def count_positions(cache, positions: int) -> None:
    """Sets the positions every sliding-window layer of `cache` counts:
    a DynamicSlidingWindowLayer's cumulative_length, a
    StaticSlidingWindowLayer's cumulative_length_int (what get_seq_length
    and the next update read; its tensor cumulative_length is not read
    again once the window is full). For a copy or merge of windowed caches,
    which transformers has no call for: filled by update with the K/V the
    parts hold, the copy goes on from the positions its source was fed."""
    for layer in cache.layers:
        if isinstance(layer, transformers.cache_utils.DynamicSlidingWindowLayer):
            layer.cumulative_length = positions
        elif isinstance(layer, transformers.cache_utils.StaticSlidingWindowLayer):
            layer.cumulative_length_int = positions


def window_tail(pieces, tokens: int):
    """The last `tokens` tokens of the concatenation of `pieces`, (keys,
    values) pairs along the sequence, as views of the pieces (no copy), in
    order."""
    tail = []
    for keys, values in reversed(pieces):
        if tokens <= 0:
            break
        take = min(tokens, keys.shape[-2])
        tail.append((keys[..., keys.shape[-2] - take :, :], values[..., values.shape[-2] - take :, :]))
        tokens -= take
    return tail[::-1]


def held_layers(cache):
    """(keys, values) a layer of `cache` holds, per layer: None for a layer
    holding none."""
    held = hf.logical_cache(cache)
    layers = []
    for i in range(kv.layer_count(held)):
        keys, values = kv.logical_keys(held, i), kv.logical_values(held, i)
        layers.append(None if keys is None or keys.numel() == 0 else (keys, values))
    return layers


def stacked_rows(rows):
    """The rows (caches of batch 1, one geometry) stacked into one
    DynamicCache of batch len(rows): one cat a layer along the batch
    (transformers has no call that stacks caches; batched generation
    starts from a batched prompt)."""
    layers = [held_layers(row) for row in rows]
    return hf.cache_of_layers([
        (torch.cat([held[i][0] for held in layers], dim=0), torch.cat([held[i][1] for held in layers], dim=0), True)
        for i in range(len(layers[0]))
    ])


def select_row(cache, repeat, reorder, select) -> None:
    """transformers' own batch operations on `cache`, in place, as beam
    search and a batched generation call them: batch_repeat_interleave,
    reorder_cache when there is an order, batch_select_indices of one row."""
    cache.batch_repeat_interleave(repeat)
    if reorder:
        cache.reorder_cache(torch.tensor(reorder, dtype=torch.long))
    cache.batch_select_indices(torch.tensor([select], dtype=torch.long))


class TransformersCachesAdapter(Adapter):
    owned = "derived"

    def __init__(self, model, cache_class: str, decoding: str, copying: str = "update"):
        self.model_ = model
        self.cache_class = cache_class
        self.options = DECODINGS[decoding]
        self.fresh_options = DECODINGS[FRESH_DECODINGS[decoding]]
        self.copy_one = COPIES[copying]
        # The model's sliding window (tiny_config(sliding_window=N): every
        # layer of a cache built from the config is a sliding-window layer),
        # or None.
        self.sliding_window = getattr(model.config, "sliding_window", None)
        suffix = "" if self.sliding_window is None else f"+window{self.sliding_window}"
        suffix += "" if decoding == "greedy" else f"+{decoding}"
        suffix += "" if copying == "update" else f"+copy-{copying}"
        self.name = f"transformers-{hf.VERSION}-{cache_class}{suffix}"
        self.description = (
            f"transformers {hf.VERSION}'s {'StaticCache' if cache_class == 'static' else 'DynamicCache'} in a store,"
            f" generating with {decoding} decoding, copying by {copying}"
            + ("" if self.sliding_window is None else f", sliding-window layers of window {self.sliding_window}")
            + " (python/adapters/transformers_caches_adapter.py)"
        )
        self.model = hf.model_domain(model)
        self.capabilities = hf.capabilities(self.model)
        # 5.25's StaticLayer has no batch_repeat_interleave or
        # batch_select_indices: a StaticCache takes no batch (declared). A
        # sliding-window layer counts one position for all its rows: a batch
        # of windowed rows fed different lengths has no transformers form.
        self.capabilities["batch"] = cache_class == "dynamic" and self.sliding_window is None
        if self.sliding_window is not None:
            # docs/semantics.md#store-windows: the tokens a cache keeps at
            # rest. DynamicSlidingWindowLayer keeps the last
            # sliding_window - 1 (its update's keys[..., -sliding_window + 1:, :]:
            # what the next token reads besides itself);
            # StaticSlidingWindowLayer keeps min(sliding_window, max_cache_len).
            self.capabilities["window"] = (
                self.sliding_window - 1 if cache_class == "dynamic" else min(self.sliding_window, MAX_CACHE_LEN)
            )
        self.items = {}  # id -> the stored cache object, in insertion order
        self.handed_out = weakref.WeakSet()  # the copies the store made and has not stored since
        # make_cache's fresh caches -> a full DynamicCache of the whole
        # content, what generate_fresh runs on under a window.
        self.whole = weakref.WeakKeyDictionary()

    # ---- the engine's caches ----

    def new_cache(self):
        if self.cache_class == "static":
            return transformers.StaticCache(config=self.model_.config, max_cache_len=MAX_CACHE_LEN)
        if self.sliding_window is not None:
            return transformers.DynamicCache(config=self.model_.config)  # DynamicSlidingWindowLayers
        return transformers.DynamicCache()

    def filled(self, parts):
        """A new cache of the class holding the parts' K/V in order, layer
        by layer, each part copied once: static, `update` with each part
        (one index_copy_ a part into the buffers); dynamic, DynamicLayers
        holding the parts' concatenation (one cat a layer: a DynamicLayer's
        update would concatenate again what it holds)."""
        layers = [held_layers(part) for part in parts]
        count = max((len(held) for held in layers), default=0)
        pieces = [[held[i] for held in layers if i < len(held) and held[i] is not None] for i in range(count)]
        if self.sliding_window is not None:
            return self.filled_window(pieces, sum(positions_of(part) for part in parts))
        if self.cache_class == "dynamic":
            return hf.cache_of_layers([
                (torch.cat([p[0] for p in layer], dim=-2), torch.cat([p[1] for p in layer], dim=-2), True)
                if layer else (None, None, False)
                for layer in pieces
            ])
        cache = self.new_cache()
        for i, layer in enumerate(pieces):
            for keys, values in layer:
                cache.update(keys, values, i)
        return cache

    def filled_window(self, pieces, positions):
        """A new cache of sliding-window layers holding, per layer, the
        window of the concatenation of `pieces` (the parts' held K/V), each
        of its tokens copied once, and counting `positions` (the parts'
        sum: a copy goes on from the positions its source was fed). Static:
        the class's update with each piece of the window in turn (one
        index_copy_ each: it never fills past the window). Dynamic: one cat
        a layer of the window's pieces, put in the layer as its update
        leaves it (its update would cat once more what it is given)."""
        window = self.capabilities["window"]
        cache = self.new_cache()
        for i, layer in enumerate(pieces):
            if not layer:
                continue
            tail = window_tail(layer, window)
            if self.cache_class == "static":
                for keys, values in tail:
                    cache.update(keys, values, i)
                continue
            keys, values = torch.cat([p[0] for p in tail], dim=-2), torch.cat([p[1] for p in tail], dim=-2)
            sliding = cache.layers[i]
            sliding.lazy_initialization(keys, values)
            sliding.keys, sliding.values = keys, values
        count_positions(cache, positions)
        return cache

    def copy_of(self, parts):
        if len(parts) == 1 and self.copy_one is not None:
            made = self.copy_one(parts[0])
        else:
            made = self.filled(parts)
        self.handed_out.add(made)
        return made

    def make_cache(self, content):
        made = hf.materialize(content)  # a DynamicCache holding the content's own tensors
        if self.cache_class == "dynamic" and self.sliding_window is None:
            return made
        # The class's own update with each layer's whole content: a static
        # layer copies it into its buffers, a sliding-window layer keeps its
        # window of it and counts every position.
        cache = self.new_cache()
        for i, layer in enumerate(made.layers):
            if layer.keys is not None and layer.keys.numel() > 0:
                cache.update(layer.keys, layer.values, i)
        if self.sliding_window is not None:
            self.whole[cache] = made
        return cache

    def clone(self, cache):
        return self.copy_of([cache])

    def concat(self, caches):
        return self.copy_of(list(caches))

    def view(self, cache):
        return wire.view_json(hf.logical_cache(cache))

    # ---- the store ----

    def add(self, id, cache, metadata):
        if not isinstance(cache, (transformers.StaticCache, transformers.DynamicCache)):
            raise TypeError(f"add: {id!r} is a {type(cache).__name__}, not a cache of this store")
        self.handed_out.discard(cache)
        self.items[id] = cache

    def get(self, id):
        return self.items.get(id)

    def get_by_ids(self, ids):
        return [id if id in self.items else None for id in ids]

    def get_all_ids(self):
        return list(self.items)

    def get_cache(self, ids):
        found = [self.items[id] for id in ids if id in self.items]
        holding = [cache for cache in found if any(layer is not None for layer in held_layers(cache))]
        return self.copy_of(holding) if holding else None

    def delete(self, ids):
        for id in ids:
            self.items.pop(id, None)

    def delete_all(self):
        self.items.clear()

    def stored_cache(self, id):
        return self.items[id]

    # ---- generation ----

    def generate(self, cache, prompt, max_new_tokens):
        if cache is None:
            work = self.new_cache()
        elif cache in self.handed_out:
            work = cache  # an owned copy: the model writes into it
        else:
            work = self.copy_of([cache])
        return self.decode(work, prompt, max_new_tokens, self.options)

    def decode(self, cache, prompt, max_new_tokens, options):
        """transformers' generate over `cache`, written into in place."""
        return hf.generate(self.model_, prompt, cache, max_new_tokens, **options)

    # ---- trimming ----

    def trim(self, cache, keep):
        # transformers' own Cache.crop, as assisted decoding calls it. In
        # transformers 5 it takes the tokens to remove, as a negative count
        # (a positive one, the old crop(max_length), raises): a dynamic
        # layer is sliced to keys[..., :-n, :], a static one lowers its
        # cumulative_length (the buffers keep the tokens, which the next
        # update overwrites). Every layer here holds one length (the
        # declared model).
        held_tokens = cache.get_seq_length()
        if held_tokens > keep:
            cache.crop(keep - held_tokens)

    # ---- batches ----

    def batch(self, rows, repeat, reorder, select):
        stacked = stacked_rows(rows)
        select_row(stacked, repeat, reorder, select)
        self.handed_out.add(stacked)  # the caller owns it: a generation writes into it
        return stacked

    def generate_fresh(self, cache, prompt, max_new_tokens):
        # The reference: plain greedy on transformers' default class (full
        # DynamicLayers). Under a window it holds the whole content make_cache
        # was given, and the model's sliding-window mask hides what the
        # window dropped: a windowed cache must generate what the full one
        # does.
        return self.decode(self.fresh_copy(cache), prompt, max_new_tokens, self.fresh_options)

    def fresh_copy(self, cache):
        """A DynamicCache of full layers holding a copy of what `cache`
        holds (under a window, of the whole content make_cache was given)."""
        reference = transformers.DynamicCache()
        for i, layer in enumerate(held_layers(self.whole.get(cache, cache))):
            if layer is not None:
                reference.update(layer[0].clone(), layer[1].clone(), i)
        return reference


class EncoderDecoderCachesAdapter(TransformersCachesAdapter):
    """`--cache encdec`: every cache is a real EncoderDecoderCache (a
    self-attention and a cross-attention DynamicCache) over a tiny BART
    (_encoder_decoder.py), read by kvcheck as one cache of its
    self-attention layers then its cross-attention layers. What differs
    from `--cache dynamic`: each copy, merge, batch and fresh reference is
    split into the two halves and built by EncoderDecoderCache's own
    constructor; one copy (`--copy`) is its deepcopy or its own
    batch_select_indices, batch_repeat_interleave or reorder_cache (both
    halves); generate is BART's, the encoder run on an input as long as the
    cached cross-attention K/V. No trim: EncoderDecoderCache.crop cuts the
    self-attention layers only, kvcheck's trim cuts every layer (crop runs
    inside prompt-lookup decoding instead)."""

    def __init__(self, model, decoding: str, copying: str = "update"):
        super().__init__(model, "dynamic", decoding, copying)
        self.decoder_layers = encdec.decoder_layers(model)
        self.copy_one = ENCDEC_COPIES[copying]
        self.name = self.name.replace("-dynamic", "-encdec")
        self.description = self.description.replace("DynamicCache", "EncoderDecoderCache (tiny BART)")
        self.model = encdec.model_domain(model)
        self.capabilities = hf.capabilities(self.model)
        self.capabilities["batch"] = True
        self.capabilities["trim"] = False

    def new_cache(self):
        return encdec.empty()

    def filled(self, parts):
        return encdec.split(super().filled(parts), self.decoder_layers)

    def make_cache(self, content):
        return encdec.split(hf.materialize(content), self.decoder_layers)

    def add(self, id, cache, metadata):
        if not isinstance(cache, encdec.EncoderDecoder):
            raise TypeError(f"add: {id!r} is a {type(cache).__name__}, not a cache of this store")
        self.handed_out.discard(cache)
        self.items[id] = cache

    def storage(self, cache):
        return cache.storage()

    def batch(self, rows, repeat, reorder, select):
        stacked = encdec.split(stacked_rows(rows), self.decoder_layers)
        select_row(stacked.cache, repeat, reorder, select)  # EncoderDecoderCache's own: both halves
        self.handed_out.add(stacked)
        return stacked

    def decode(self, cache, prompt, max_new_tokens, options):
        return encdec.generate(self.model_, prompt, cache, max_new_tokens, **options)

    def generate_fresh(self, cache, prompt, max_new_tokens):
        # The reference: greedy (or beam search) on a fresh
        # EncoderDecoderCache of copies, which must feed every decoder
        # token once.
        fresh = encdec.split(self.fresh_copy(cache), self.decoder_layers)
        return encdec.generate(self.model_, prompt, fresh, max_new_tokens, fed_once=True, **self.fresh_options)


def _encdec_rows_of(operation):
    """A copy by one of EncoderDecoderCache's batch operations: a new
    EncoderDecoderCache whose layers hold the source's own tensors, then
    `operation` on it (both halves rebound to the rows it selects)."""

    def copy_rows(handle):
        layers = [(layer.keys, layer.values, layer.is_initialized) for layer in handle.layers]
        shallow = encdec.split(hf.cache_of_layers(layers), len(handle.cache.self_attention_cache.layers))
        operation(shallow.cache)
        return shallow

    return copy_rows


ENCDEC_COPIES = {
    "update": None,
    "deepcopy": lambda handle: encdec.EncoderDecoder(copy.deepcopy(handle.cache)),
    "select": _encdec_rows_of(lambda c: c.batch_select_indices(torch.tensor([0]))),
    "repeat": _encdec_rows_of(lambda c: c.batch_repeat_interleave(1)),
    "reorder": _encdec_rows_of(lambda c: c.reorder_cache(torch.tensor([0]))),
}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", choices=CACHES, default="static", help="the store's cache class")
    parser.add_argument("--decoding", choices=sorted(DECODINGS), default="greedy",
                        help="how generate decodes (greedy, assisted by prompt lookup, or beam search)")
    parser.add_argument("--copy", choices=sorted(COPIES), default="update",
                        help="how the store copies one cache (dynamic only but update): copy.deepcopy, or a batch"
                        " operation on a cache holding the source's tensors: batch_select_indices,"
                        " batch_repeat_interleave(1), reorder_cache")
    parser.add_argument("--sliding-window", type=int, default=None, metavar="N",
                        help="a model with sliding-window attention of N positions in every layer (Mistral's"
                        " architecture): the store's caches are made of transformers' sliding-window layers"
                        " (DynamicSlidingWindowLayer, StaticSlidingWindowLayer), declared as kvcheck's store window")
    hf.add_print_model(parser)
    arguments = parser.parse_args(argv)
    if arguments.sliding_window is not None and arguments.sliding_window < 2:
        parser.error(f"--sliding-window {arguments.sliding_window}: a window of at least 2 positions (a dynamic"
                     " sliding layer keeps sliding_window - 1 tokens)")
    if arguments.sliding_window is not None and arguments.copy != "update":
        parser.error("--sliding-window needs --copy update: the batch-operation copies build plain DynamicLayers"
                     " (no window, no count of positions)")
    if arguments.sliding_window is not None and arguments.cache == "static" and arguments.decoding == "prompt-lookup":
        # generate checks is_croppable after the prefill and raises.
        parser.error("--sliding-window with --cache static cannot decode by prompt lookup: a StaticSlidingWindowLayer"
                     f" of max_cache_len {MAX_CACHE_LEN} > sliding_window is not croppable (is_croppable is"
                     " max_cache_len <= sliding_window), and assisted decoding refuses such a cache")
    if arguments.cache == "static" and (arguments.decoding == "beam" or arguments.copy != "update"):
        # transformers 5.25's StaticLayer has no batch_repeat_interleave or
        # batch_select_indices (Cache's calls raise AttributeError), and a
        # deep copy copies its whole preallocated buffer.
        parser.error("--decoding beam and --copy other than update need --cache dynamic: a StaticCache cannot be"
                     " expanded to beams or selected by rows (StaticLayer has no batch_repeat_interleave or"
                     " batch_select_indices), and its deep copy copies all max_cache_len slots")
    if arguments.cache == "encdec":
        if arguments.sliding_window is not None:
            parser.error("--sliding-window needs --cache static or dynamic: the encoder-decoder model has no sliding"
                         " window")
        model = encdec.tiny_model()
        if arguments.print_model:
            print(hf.domain_text(encdec.model_domain(model)))
            return
        serve(lambda: EncoderDecoderCachesAdapter(model, arguments.decoding, arguments.copy))
        return
    model = hf.model_or_print(arguments, hf.tiny_config(sliding_window=arguments.sliding_window))
    if model is None:
        return
    serve(lambda: TransformersCachesAdapter(model, arguments.cache, arguments.decoding, arguments.copy))


if __name__ == "__main__":
    main()
