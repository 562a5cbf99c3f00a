"""kvcheck's adapter for mlx-lm's prompt cache: `LRUPromptCache` (the trie of
token prefixes mlx_lm.server keeps its caches in) holding lists of
`KVCache`, one a layer, over a tiny random-weight Llama made from a
`ModelArgs` (nothing downloaded), generating with mlx-lm's own
`generate_step` on the Linux CPU build of MLX.

    PYTHONPATH=.venv/engines/mlx-lm-0.32.2:.venv/transformers/5.25.0 kvcheck run \\
        --python .venv/bin/python --adapter python/adapters/mlx_prompt_cache_adapter.py

The mapping (python/README.md, "Real engines"):

| kvcheck | mlx-lm 0.32.2 |
|---|---|
| make | a list of new `KVCache`s, each given the layer's K/V by `update_and_fetch` |
| add(id, cache) | `insert_cache(model, key(id), cache)`: the cache keeps the caller's object |
| get(id), stored entry | the object the trie holds for key(id) (read, as the server never hands it out) |
| get_cache(one id) | `fetch_nearest_cache(model, key(id))`: an exact hit, a deep copy |
| get_cache(several), concat | new `KVCache`s given each part's K/V in order by `update_and_fetch` |
| clone | `copy.deepcopy` (what fetch_nearest_cache does) |
| delete(ids) | a new `LRUPromptCache` given the remaining entries again by `insert_cache`, in the order of its LRU (the class has no removal) |
| delete_all | a new `LRUPromptCache` |
| generate | `generate_step(prompt, model, prompt_cache=copy, max_tokens=n)` (greedy): on a deep copy, or on the input itself when it is a copy the store handed out |
| trim(handle, keep) | `trim_prompt_cache(cache, offset - keep)` on a copy the caller holds (each `KVCache.trim` lowers its offset; its buffer keeps the tokens past it, which the next `update_and_fetch` overwrites) |
| dump(dir), load(dir) (`--dump`) | `save_prompt_cache` of every entry's layers, in listing order, the ids in its metadata (under a temporary name, fsynced, renamed: the adapter's); `load_prompt_cache`, then a new `LRUPromptCache` given the entries by `insert_cache` in that order |
| batch(rows, repeat, reorder, select) | mlx-lm's `BatchKVCache` as its `BatchGenerator` uses it: the rows, each repeated `repeat` times in place, stacked by `BatchKVCache.merge` (`_merge_caches`) of the first half and of the second, joined by `extend` (`_extend_cache`); `filter(reorder)` when there is an order; then `extract(select)` (`extract_cache`: a `KVCache` a layer, what the server inserts into its prompt cache), or with `--batch-row filter` `filter([select])` (a `BatchKVCache` of batch 1, which later generations, trims and merges use) |
| view | each layer's `keys_and_values()`, what the attention reads, through numpy (of a `BatchKVCache` row, after its left padding) |

Warm starts: importing MLX and mlx-lm starts no thread, evaluating the
first array does; the adapter evaluates nothing until its first
operation (the model is made at its first generation, process_model), so
kvcheck's fork server (the handshake's process) forks each adapter
process from one import of torch, transformers and mlx-lm.

`--layer-class ConcatenateKVCache` makes every cache of mlx-lm's
ConcatenateKVCache instead of KVCache (what make_prompt_cache makes for a
llama): its trim fails trim-exact, docs/findings/mlx-lm-1.md.

`--layer-class RotatingKVCache` (`--max-kv-size W`, default 4) makes every
layer a `RotatingKVCache(max_size=W, keep=0)`, declared as kvcheck's store
window W (docs/semantics.md, "Store windows"). The llama's attention then
reads a window of W tokens, itself included: the mask of a multi-token
update is the cache's `make_mask` (a causal window of `max_size`); a
single-token update first cuts the buffer to `max_size` and writes over
the oldest (`_idx` rotates to `keep`), so the next token reads the last
`W - 1` and itself. At rest a cache keeps at least its last min(W, n)
tokens: W after decoding, up to `W - 1 + S` after a prefill of S (every
token after a first prefill). So:
  - make writes a layer as a prefill and decoding would: the first half of
    its tokens (rounded up) in one update_and_fetch, the rest one at a time
    (the single-token path fills, cuts and rotates the buffer);
  - view: each layer's `keys_and_values()` read in temporal order by the
    cache's own `_temporal_order` (the buffer as it lies is rotated once it
    wrapped: `_update_concat` reads it the same way), then its last W;
  - merge (get_cache of several): the parts' held K/V in temporal order
    fed in turn, then `offset` raised by the tokens the parts' windows
    dropped, so that the merge numbers its next token after the whole
    concatenation (a RotatingKVCache's offset counts every token its
    model was fed; a part that dropped tokens holds W or more, so the
    merge holds W or more too, a state its update paths expect); the
    arrays fed are the parts' own (`--merge held`, the default) or
    `mx.array` copies (`--merge copy`): a RotatingKVCache keeps the arrays
    of its first update and, when they held exactly max_size tokens,
    writes the next token into them, so a merge changes the stored entry
    it was fed (stored-immutable FAILs: docs/findings/mlx-lm-2.md);
  - trim: only while `is_trimmable` (`offset < max_size`), which is all
    kvcheck asks of a window (a cache that never held W); a refusal is
    raised, not passed on as an untrimmed cache;
  - keep > 0 (what make_prompt_cache(max_kv_size=...) makes for a model
    without a make_cache: `keep=4`, an attention sink of the first 4
    tokens) is not mapped: kvcheck's window is the last W tokens and has
    no kept prefix. keep=0 is what the sliding-window models' make_cache
    makes (gemma3, ministral3, gpt_oss, cohere2, llama's own sliding layers). A
    llama of all sliding layers cannot be built (LlamaModel looks up a
    full-attention layer), so the layers are the full-attention llama's
    with RotatingKVCaches, as `generate --max-kv-size` runs them (there
    with keep=4).

Batches (kvcheck's `batch`, docs/semantics.md "Batches"), KVCache layers
only: ConcatenateKVCache has no merge, and RotatingKVCache's
(BatchRotatingKVCache) is not mapped, as a windowed cache claims no batch
in kvcheck's model (docs/semantics.md, "Store windows"). What kvcheck's
model does not have:
  - left padding never arises: kvcheck's rows are of one geometry (one
    length), so merge pads none, extend joins batches of one `_idx`, and
    filter's shift of the common left padding and extract's cut of a
    row's padding are of 0 tokens. BatchGenerator's prefill of prompts of
    different lengths (`prepare(left_padding=...)`, `prepare(right_padding=
    ...)` then `finalize`'s roll) is not reached: kvcheck has no batch of
    rows of different lengths, and no batched generation (a row is
    generated from alone, after it is handed out);
  - repeat: mlx-lm has no beam search and no repeat_interleave; a row is
    repeated by giving merge the same cache several times (as n requests
    of one prompt cache would be);
  - reorder: `filter` given kvcheck's order as is; BatchGenerator passes
    the rows it keeps, distinct and sorted, but filter indexes the rows
    (`self.keys[batch_indices]`), so any list of row indices, repeats and
    any order, is a selection of rows in that order;
  - `--batch-row alternate` hands rows out by extract and filter in
    turn (each engine's first batch by extract), so that one run judges
    both; a stored BatchKVCache row is dumped and loaded as one
    (save_prompt_cache keeps its offset, left padding and _idx).

Assumptions (contract differences, declared rather than papered over):
  - key(id): a 2-token key per id, distinct and of one length, so that no
    key is a prefix of another: inserting a trimmable cache drops every
    entry whose key is a prefix of its key (`pop_prefixes`), an eviction
    kvcheck's store contract has no name for yet;
  - eviction: none by default (max_size and max_bytes far above anything a
    trace stores). With --max-size N, max_size is N and the adapter
    declares capacity_items N, eviction "lrs", listing "insertion"; what
    insert_cache evicts is no longer listed. mlx-lm evicts the entry least
    recently *stored* first (one LRU tier, "assistant", as every insert
    here is: CacheOrder pops the front of its deque): insert_cache is its
    only use, an overwrite moves the key to the back (`_lru.remove` then
    `push`), fetch_nearest_cache moves nothing (upstream that is by
    design: ml-explore/mlx-lm#1495, "eviction ignores fetch recency (FIFO,
    not LRU)", closed by a maintainer as non-essential; its fix, PR #1496,
    closed unmerged). That is kvcheck's "lrs" exactly (docs/semantics.md,
    "Declared store contracts"); "lru" would differ at every get_cache
    between two stores, "fifo" at every overwrite of an entry still held;
  - max_bytes (and trim_to(n_bytes=...), which mlx_lm.server's
    --prompt-cache-bytes calls) is not mapped, and stays far above any
    trace: LRUPromptCache counts each entry's
    KVCache.nbytes, its buffers, not the K/V it holds, which is what
    kvcheck's capacity_bytes counts. A buffer grows 256 tokens at a time,
    is regrown to the exact sum when a write does not start on a step
    (3 tokens then 300: a 515-token buffer), and a trim keeps it whole
    (measured, 2 K/V heads of 8, float32, one layer: 1 token holds 128
    bytes of K/V in a 32,768-byte buffer; 3 + 300 tokens 38,784 in 65,920;
    300 trimmed to 50, 6,400 in 65,536). The bytes an entry counts are a
    function of its history, not its content, so no declared capacity
    says when mlx-lm evicts: a contract difference (docs/semantics.md,
    "Real engines: declared contract differences"), and nbytes is also
    fixed at insert_cache (an inserted cache the caller grows later keeps
    counting what it held then);
  - the ids are listed by the adapter, those the trie still holds, in
    insertion order (an overwritten id keeping its place): LRUPromptCache
    has no listing, and its LRU's order (the order lrs evicts in) is no
    listing order kvcheck names (recency counts hand-outs);
  - dumps (--dump) are not killed in a fork (dump_fork_absent): MLX hangs
    in a child forked after its first evaluation (which starts its
    threads); and a safetensors file carries no checksum, which
    load_prompt_cache does not check either: a flipped byte of K/V loads
    silently and dump-safe FAILs on it, a contract difference;
  - no storage identities, no copy log: MLX arrays are immutable values whose
    copies share their buffer until written (a deep copy of a KVCache shares
    every buffer with its source: the data addresses are equal), and MLX has
    no dispatch hook the SDK's copy tracker could use. So clone-independent,
    owned-marker and single-copy are skipped; content (stored-immutable,
    layout-roundtrip, merge-correct), generation-equivalent and
    store-contract are judged.
"""

from __future__ import annotations

import argparse
import copy
import functools
import glob
import json
import os
import sys
import types
import weakref

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # the SDK, when run from the source tree

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402
from mlx_lm.models import cache as mlx_cache  # noqa: E402
from mlx_lm.models import llama  # noqa: E402

from kvcheck_adapter import wire  # noqa: E402
from kvcheck_adapter.adapter import Adapter, serve  # noqa: E402

VERSION = "0.32.2"
MODEL_KEY = "tiny-llama"
LAYERS, KV_HEADS, HEAD_DIM, VOCAB = 2, 2, 8, 64
ROTATING_MAX_SIZE = 4  # --layer-class RotatingKVCache's default max_size: kvcheck's window
NO_EVICTION = 1 << 40  # entries and bytes: far above any trace
DUMP_FILE = "prompt-cache.safetensors"
DUMP_IDS = "kvcheck_ids"  # the metadata key of the dumped ids, in listing order
_object_id = id  # the operations' `id` parameters shadow it


def tiny_model(seed: int = 1):
    """A llama.Model of 2 layers, 2 K/V heads of 8, vocabulary 64, weights
    drawn from MLX's generator seeded with `seed`. Its evaluation starts
    MLX's threads: see process_model."""
    args = llama.ModelArgs(
        model_type="llama", hidden_size=32, num_hidden_layers=LAYERS, intermediate_size=64,
        num_attention_heads=4, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, rms_norm_eps=1e-5,
        vocab_size=VOCAB, tie_word_embeddings=False,
    )
    mx.random.seed(seed)
    model = llama.Model(args)
    mx.eval(model.parameters())
    return model


@functools.lru_cache(maxsize=None)
def process_model():
    """The tiny model of seed 1, made at its first generation in this
    process. Importing MLX starts no thread (measured: one thread after
    `import mlx.core` and mlx_lm), its first evaluation does; so nothing
    is evaluated before kvcheck's fork server forks (the handshake makes
    an engine, which evaluates nothing), and each copy, or each process
    started cold, makes its own model from the same seed (the same
    weights: nothing else draws from MLX's generator)."""
    return tiny_model()


def held(layer):
    """The (keys, values) a cache layer holds, in temporal order, as MLX
    arrays: its keys_and_values() (a KVCache's buffers cut to its offset, a
    ConcatenateKVCache's arrays, a RotatingKVCache's buffer, which once it
    rotated is read through its own _temporal_order, as its
    _update_concat does); None when it holds none."""
    if layer.keys is None:
        return None
    keys, values = layer.keys_and_values()
    if isinstance(layer, mlx_cache.RotatingKVCache):
        keys, values = layer._temporal_order(keys), layer._temporal_order(values)
    elif isinstance(layer, mlx_cache.BatchKVCache):
        # A row handed out by --batch-row filter: a BatchKVCache of batch 1,
        # whose keys_and_values() start with its left padding (the mask
        # hides it from the model).
        padding = int(layer.left_padding[0])
        keys, values = keys[..., padding:, :], values[..., padding:, :]
    return None if keys.shape[2] == 0 else (keys, values)


def tokens_held(layer):
    """The tokens a layer holds for its model: its offset (of a
    BatchKVCache of batch 1, its one row's, an array of one)."""
    if isinstance(layer, mlx_cache.BatchKVCache):
        return int(layer.offset[0])
    return layer.offset


def dropped(layer):
    """The tokens a layer was fed but no longer holds (a RotatingKVCache's
    window moved past them): its offset less what it holds; 0 for the
    other classes, which hold every token they were fed."""
    if not isinstance(layer, mlx_cache.RotatingKVCache):
        return 0
    kv = held(layer)
    return layer.offset - (kv[0].shape[2] if kv is not None else 0)


def to_torch(array) -> torch.Tensor:
    return torch.from_numpy(np.array(array, copy=True))


class MlxPromptCacheAdapter(Adapter):
    owned = "derived"

    def __init__(self, max_size=None, dumps=False, layer_class="KVCache", max_kv_size=ROTATING_MAX_SIZE,
                 merge_copies=False, batch_row="extract"):
        # Nothing here evaluates an MLX array (process_model): the fork
        # server's handshake makes one of these before its copies fork.
        self.merge_copies = merge_copies
        self.batch_row = batch_row
        self.batches = 0  # batches served by this engine (--batch-row alternate)
        self.max_size = max_size
        self.layer_class = getattr(mlx_cache, layer_class)
        self.name = (f"mlx-lm-{VERSION}" + (f"-max{max_size}" if max_size else "") + ("-dump" if dumps else "") +
                     ("" if layer_class == "KVCache" else "-" + layer_class) +
                     (f"{max_kv_size}" if layer_class == "RotatingKVCache" else "") +
                     ("-merge-copy" if merge_copies else "") + ("" if batch_row == "extract" else "-batch-" + batch_row))
        self.max_kv_size = max_kv_size if layer_class == "RotatingKVCache" else None
        if max_size is not None:
            self.capacity_items = max_size
            self.eviction = "lrs"  # the least recently stored first: see the module doc
        self.description = f"mlx-lm {VERSION}'s LRUPromptCache of KVCaches (python/adapters/mlx_prompt_cache_adapter.py)"
        self.model = {"layers": LAYERS, "heads": KV_HEADS, "head_dim": HEAD_DIM, "dtypes": ["f32"],
                      "layouts": ["modern"], "odd_layers": False}
        self.capabilities = {
            "legacy_layout": False, "modern_layout": True, "conversions": False, "half_dtypes": False,
            "one_sided_layers": False, "legacy_slot_names": False, "uninitialized_layers": False,
            "any_geometry": True, "generate_stream": False, "storage_identity": False, "copy_log": False,
            "owned_marker": False, "dump": dumps,
            # BatchKVCache batches KVCaches only (merge is KVCache's); module doc.
            "batch": layer_class == "KVCache",
        }
        if self.max_kv_size is not None:
            # A RotatingKVCache(max_size, keep=0) keeps its last max_size
            # tokens at rest (module doc): kvcheck's store window.
            self.capabilities["window"] = self.max_kv_size
        # MLX hangs in a child forked after its first evaluation (an
        # evaluation there waits for a thread the fork did not copy:
        # save_prompt_cache in such a fork, measured, never returns), and a
        # store being dumped has been evaluated: dump-safe cannot kill a dump
        # in a copy of this process.
        self.dump_fork_absent = "MLX hangs in a forked child (save_prompt_cache never returns there)"
        self.prompt_cache = self.new_prompt_cache()
        self.keys = {}  # id -> its trie key, in insertion order
        self.next_key = 0  # keys are never reused: an evicted or deleted id's key stays retired
        self.handed_out = weakref.WeakValueDictionary()  # object id -> a copy handed out

    def new_prompt_cache(self):
        return mlx_cache.LRUPromptCache(max_size=self.max_size or NO_EVICTION, max_bytes=NO_EVICTION)

    def key_of(self, id):
        key = self.keys.get(id)
        if key is None:
            n, self.next_key = self.next_key, self.next_key + 1
            key = [n // VOCAB, n % VOCAB]
        return key

    def holds(self, key):
        try:
            self.prompt_cache._trie.get(MODEL_KEY, key)
        except KeyError:
            return False
        return True

    # ---- caches ----

    def new_layers(self):
        """An empty cache of the chosen class, a layer each (KVCache: what
        make_prompt_cache makes for a llama; RotatingKVCache(max_kv_size,
        keep=0): what it makes under max_kv_size, but keep=0, as a model's
        make_cache makes for its sliding-window layers)."""
        if self.max_kv_size is not None:
            return [self.layer_class(max_size=self.max_kv_size, keep=0) for _ in range(LAYERS)]
        return [self.layer_class() for _ in range(LAYERS)]

    def filled(self, parts):
        """A merge: new layers given each part's held K/V in order by
        update_and_fetch, then counting the tokens the parts' windows
        dropped (a RotatingKVCache's offset counts every token its model
        was fed; mlx-lm has no merge along the sequence, this is the
        adapter's). A part that dropped tokens holds max_kv_size or more,
        so the merge holds that many too, as a RotatingKVCache fed them
        would."""
        cache = self.new_layers()
        for part in parts:
            for layer, source in zip(cache, part):
                kv = held(source)
                if kv is not None:
                    # --merge copy: new arrays (mx.array copies), which no
                    # stored cache holds (docs/findings/mlx-lm-2.md).
                    layer.update_and_fetch(*((mx.array(kv[0]), mx.array(kv[1])) if self.merge_copies else kv))
        for n, layer in enumerate(cache):
            gone = sum(dropped(part[n]) for part in parts if part[n].keys is not None)
            if gone:
                layer.offset += gone
        mx.eval([layer.state[:2] for layer in cache if layer.keys is not None])
        return _Held(cache)

    def hand_out(self, cache):
        cache = cache if isinstance(cache, _Held) else _Held(cache)
        self.handed_out[_object_id(cache)] = cache
        return cache

    def make_cache(self, content):
        cache = self.new_layers()
        for layer, spec in zip(cache, content.layers):
            keys = wire.slot_tensor(spec.slots[0], content.dtype, content.heads, content.head_dim)
            values = wire.slot_tensor(spec.slots[1], content.dtype, content.heads, content.head_dim)
            if keys is not None and keys.numel() > 0:
                self.write(layer, mx.array(keys.numpy()), mx.array(values.numpy()))
        mx.eval([layer.state[:2] for layer in cache if layer.keys is not None])
        return _Held(cache)

    def write(self, layer, keys, values):
        """A new layer given K/V: KVCache and ConcatenateKVCache in one
        update_and_fetch; a RotatingKVCache as a prompt's prefill and then
        decoding write it, the first half (rounded up) in one
        update_and_fetch and the rest one token at a time, so that its
        single-token path fills, trims and rotates its buffer (a prefill
        alone keeps every token in temporal order)."""
        if self.max_kv_size is None:
            layer.update_and_fetch(keys, values)
            return
        n = keys.shape[2]
        prefill = (n + 1) // 2
        layer.update_and_fetch(keys[..., :prefill, :], values[..., :prefill, :])
        for t in range(prefill, n):
            layer.update_and_fetch(keys[..., t:t + 1, :], values[..., t:t + 1, :])

    def clone(self, cache):
        return self.hand_out(copy.deepcopy(list(cache)))

    def concat(self, caches):
        return self.hand_out(self.filled(caches))

    def view(self, cache):
        """Each layer's held K/V in temporal order; of a RotatingKVCache the
        last max_kv_size of them (its window: a prompt's update keeps up to
        max_kv_size - 1 more, which no later token reads)."""
        layers = []
        for layer in cache:
            kv = held(layer)
            if kv is not None and self.max_kv_size is not None:
                kv = (kv[0][..., -self.max_kv_size:, :], kv[1][..., -self.max_kv_size:, :])
            keys, values = (to_torch(kv[0]), to_torch(kv[1])) if kv is not None else (None, None)
            layers.append(types.SimpleNamespace(keys=keys, values=values, is_initialized=True))
        return wire.view_json(types.SimpleNamespace(layers=layers))

    def storage(self, cache):
        return []  # no storage identities (see the module doc)

    # ---- batches: mlx-lm's BatchKVCache ----

    def batch(self, rows, repeat, reorder, select):
        """mlx-lm's BatchKVCache as its BatchGenerator uses it (module doc):
        the rows, each repeated in place, stacked by BatchKVCache.merge of
        each half (a running batch and a new one) joined by extend, a row
        that is a BatchKVCache itself joined by extend too; reordered by filter, and row `select` handed out by extract
        (a KVCache a layer) or, with --batch-row filter, by filter([select])
        (a BatchKVCache of batch 1); --batch-row alternate: by extract and
        filter in turn, each engine's first batch by extract."""
        order = [row for row in rows for _ in range(repeat)]
        half = (len(order) + 1) // 2  # a running batch, and a new one joining it
        batch = None
        for part in [*stacked_parts(order[:half]), *stacked_parts(order[half:])]:
            if batch is None:
                batch = part
            else:
                for layer, other in zip(batch, part):
                    layer.extend(other)
        if reorder:
            for layer in batch:
                layer.filter(reorder)
        self.batches += 1
        if self.batch_row == "extract" or (self.batch_row == "alternate" and self.batches % 2 == 1):
            row = [layer.extract(select) for layer in batch]
        else:
            for layer in batch:
                layer.filter([select])
            row = batch
        mx.eval([layer.state[:2] for layer in row])
        return self.hand_out(row)

    # ---- the store ----

    def add(self, id, cache, metadata):
        key = self.key_of(id)
        self.prompt_cache.insert_cache(MODEL_KEY, key, cache)
        self.handed_out.pop(_object_id(cache), None)  # stored: no copy handed out any more
        self.keys[id] = key
        # What insert_cache evicted to keep max_size is no longer held.
        self.keys = {id: key for id, key in self.keys.items() if self.holds(key)}

    def stored_cache(self, id):
        return self.prompt_cache._trie.get(MODEL_KEY, self.keys[id]).prompt_cache

    def get(self, id):
        return self.stored_cache(id) if id in self.keys else None

    def get_by_ids(self, ids):
        return [id if id in self.keys else None for id in ids]

    def get_all_ids(self):
        return list(self.keys)

    def get_cache(self, ids):
        found = [id for id in ids if id in self.keys]
        parts = [self.stored_cache(id) for id in found]
        holding = [i for i, part in zip(found, parts) if any(held(layer) is not None for layer in part)]
        if not holding:
            return None
        if len(holding) == 1:
            cache, rest = self.prompt_cache.fetch_nearest_cache(MODEL_KEY, self.keys[holding[0]])
            if rest:
                raise RuntimeError(f"fetch_nearest_cache of {holding[0]!r}'s key left tokens {rest}")
            return self.hand_out(cache)
        return self.hand_out(self.filled([self.stored_cache(id) for id in holding]))

    def delete(self, ids):
        gone = [id for id in ids if id in self.keys]
        if not gone:
            return
        kept_keys = {tuple(key) for id, key in self.keys.items() if id not in gone}
        # Given again in the order of mlx-lm's LRU (least recently inserted
        # first), so that the new cache evicts as the old one would have.
        order = [list(tokens) for _, tokens in self.prompt_cache._lru._lrus["assistant"] if tuple(tokens) in kept_keys]
        entries = [(key, self.prompt_cache._trie.get(MODEL_KEY, key).prompt_cache) for key in order]
        self.prompt_cache = self.new_prompt_cache()
        for key, cache in entries:
            self.prompt_cache.insert_cache(MODEL_KEY, key, cache)
        self.keys = {id: key for id, key in self.keys.items() if id not in gone}

    def delete_all(self):
        self.prompt_cache = self.new_prompt_cache()
        self.keys = {}

    # ---- dump and load: mlx-lm's save_prompt_cache / load_prompt_cache ----

    def dump(self, directory):
        """Every entry's KVCaches, in listing order, in one safetensors file
        written by mlx-lm's save_prompt_cache (the ids in its metadata); the
        file handling is the adapter's, as LRUPromptCache keeps nothing on
        disk: written under a temporary name, fsynced, renamed over the
        previous dump, the directory fsynced (a killed dump leaves the
        previous one; its temporary file goes at the next dump or load)."""
        os.makedirs(directory, exist_ok=True)
        remove_stale_temporaries(directory)
        ids = list(self.keys)
        layers = [layer for id in ids for layer in self.stored_cache(id)]
        temporary = os.path.join(directory, f"{DUMP_FILE}.tmp-{os.getpid()}.safetensors")
        try:
            mlx_cache.save_prompt_cache(temporary, layers, {DUMP_IDS: json.dumps(ids)})
            with open(temporary, "rb") as file:
                os.fsync(file.fileno())
            os.replace(temporary, os.path.join(directory, DUMP_FILE))
        except BaseException:
            if os.path.exists(temporary):
                os.remove(temporary)
            raise
        fsync_directory(directory)

    def load(self, directory):
        """A new LRUPromptCache given the dumped entries by insert_cache, in
        the dump's order (so least recently stored first, as they were
        listed); the store is unchanged when load_prompt_cache raises or
        the file is not a dump of this store's shape."""
        if os.path.isdir(directory):
            remove_stale_temporaries(directory)
        path = os.path.join(directory, DUMP_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"cannot load dump: {path} does not exist")
        layers, metadata = mlx_cache.load_prompt_cache(path, return_metadata=True)
        ids = json.loads(metadata.get(DUMP_IDS, "null"))
        if not isinstance(ids, list) or not all(isinstance(id, str) for id in ids) or len(set(ids)) != len(ids):
            raise ValueError(f"cannot load dump {path}: metadata {DUMP_IDS!r} is not a list of distinct ids")
        # Rows a batch handed out by filter (--batch-row filter, alternate)
        # are BatchKVCaches of batch 1, and may be stored.
        classes = (self.layer_class,) if self.batch_row == "extract" else (self.layer_class, mlx_cache.BatchKVCache)
        if len(layers) != LAYERS * len(ids) or not all(type(layer) in classes for layer in layers):
            raise ValueError(f"cannot load dump {path}: {len(layers)} caches "
                             f"({sorted({type(layer).__name__ for layer in layers})}) for {len(ids)} ids of {LAYERS} KVCaches")
        prompt_cache, keys = self.new_prompt_cache(), {}
        for n, id in enumerate(ids):
            keys[id] = self.key_of(id)
            prompt_cache.insert_cache(MODEL_KEY, keys[id], _Held(layers[n * LAYERS:(n + 1) * LAYERS]))
        self.prompt_cache, self.keys = prompt_cache, keys

    # ---- generation ----

    def run(self, cache, prompt, max_new_tokens):
        if max_new_tokens == 0:
            return []
        tokens = []
        for token, _ in generate_step(mx.array(prompt), process_model(), prompt_cache=cache, max_tokens=max_new_tokens):
            tokens.append(int(token))
        return tokens

    def generate(self, cache, prompt, max_new_tokens):
        if cache is None:
            work = self.new_layers()
        elif self.handed_out.get(_object_id(cache)) is cache:
            work = cache  # a copy the store handed out: the model writes into it
        else:
            work = copy.deepcopy(list(cache))
        return self.run(work, prompt, max_new_tokens)

    def generate_fresh(self, cache, prompt, max_new_tokens):
        return self.run(cache, prompt, max_new_tokens)

    # ---- trimming ----

    def trim(self, cache, keep):
        # mlx-lm's own: trim_prompt_cache trims the same number of tokens
        # from every layer (KVCache.trim lowers its offset; the buffer stays),
        # as mlx_lm.server does to reuse a cached prefix. Every layer of a
        # cache here holds one length (the declared model).
        # A RotatingKVCache is trimmable while offset < max_size, and kvcheck
        # asks trim only of a cache that never held its window (W =
        # max_size). trim_prompt_cache trims nothing when a layer refuses:
        # said, rather than judged as a wrong cut.
        held_tokens = tokens_held(cache[0]) if len(cache) else 0
        if held_tokens > keep:
            if not mlx_cache.can_trim_prompt_cache(cache):
                raise RuntimeError(f"trim of a cache holding {held_tokens} tokens to {keep}: "
                                   f"mlx-lm's can_trim_prompt_cache says it cannot be trimmed")
            mlx_cache.trim_prompt_cache(cache, held_tokens - keep)


def remove_stale_temporaries(directory):
    """The temporary files of dumps whose process no longer runs (killed)."""
    for path in glob.glob(os.path.join(directory, f"{DUMP_FILE}.tmp-*.safetensors")):
        pid = path[len(os.path.join(directory, DUMP_FILE)) + len(".tmp-"):-len(".safetensors")]
        if pid.isdigit() and int(pid) != os.getpid() and not process_runs(int(pid)):
            os.remove(path)


def process_runs(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fsync_directory(directory):
    descriptor = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def stacked_parts(rows):
    """The BatchKVCaches (a list, a layer each) that `rows` stack into, in
    order, for extend to join: each run of rows of KVCaches merged by
    BatchKVCache.merge (BatchGenerator's _merge_caches: it copies each
    row's K/V into a new array); each row that is a BatchKVCache itself (a
    row a --batch-row filter batch handed out) a deep copy of it, as
    extend joins batches in place and the rows stay unchanged."""
    run = []
    for row in rows + [None]:
        if row is not None and not isinstance(row[0], mlx_cache.BatchKVCache):
            run.append(row)
            continue
        if run:
            yield [mlx_cache.BatchKVCache.merge([part[n] for part in run]) for n in range(len(run[0]))]
            run = []
        if row is not None:
            yield copy.deepcopy(list(row))


class _Held(list):
    """A list of KVCaches the adapter hands out (weakly referable, unlike a list)."""

    __slots__ = ("__weakref__",)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-size", type=int, default=None, metavar="N",
                        help="LRUPromptCache's max_size (entries); declared as capacity_items N")
    parser.add_argument("--layer-class", default="KVCache", choices=("KVCache", "ConcatenateKVCache", "RotatingKVCache"),
                        help="the cache class of every layer (default KVCache, as make_prompt_cache makes)")
    parser.add_argument("--max-kv-size", type=int, default=ROTATING_MAX_SIZE, metavar="W",
                        help=f"RotatingKVCache's max_size (default {ROTATING_MAX_SIZE}; keep=0): declared as window W")
    parser.add_argument("--dump", action="store_true",
                        help="dump and load the store with mlx-lm's save_prompt_cache / load_prompt_cache")
    parser.add_argument("--merge", choices=("held", "copy"), default="held",
                        help="a merge feeds the parts' held arrays to update_and_fetch (held, the default) or copies "
                             "of them (copy: a RotatingKVCache writes into the arrays it was first given, "
                             "docs/findings/mlx-lm-2.md)")
    parser.add_argument("--batch-row", choices=("extract", "filter", "alternate"), default="extract",
                        help="how a batch hands its row out: BatchKVCache.extract (a KVCache a layer, the default), "
                             "filter([row]) (a BatchKVCache of batch 1, which generations, trims and merges then use), "
                             "or the two in turn (alternate: each engine's first batch by extract)")
    arguments = parser.parse_args(argv)
    if arguments.batch_row != "extract" and arguments.layer_class != "KVCache":
        parser.error(f"--batch-row {arguments.batch_row} needs the default --layer-class KVCache (the only one "
                     "that batches)")
    if arguments.max_size is not None and arguments.max_size < 1:
        parser.error(f"--max-size is {arguments.max_size}: a positive number of entries")
    if arguments.max_kv_size < 2:
        parser.error(f"--max-kv-size is {arguments.max_kv_size}: a window of 2 tokens or more")
    serve(lambda: MlxPromptCacheAdapter(arguments.max_size, arguments.dump, arguments.layer_class,
                                        arguments.max_kv_size, arguments.merge == "copy", arguments.batch_row))


if __name__ == "__main__":
    main()
