"""A strict activation-memory store: the store of activation_memory.py
serving one model, and raising, as upstream code does, when it uses a
cache that model could not have made.

A store fed by one model only ever meets that model's caches (and merges
and copies of them): its layer count, its K/V heads and head_dim, its
dtype, the modern layout, every layer holding keys and values of one
token count. Upstream code never checks for anything else; it keeps
whatever it is handed, and fails where it uses a cache that is not one of
those (torch.cat of a missing tensor, an index past a part's layers, an
attention mask of another length than a layer's keys). This store does
the same, with a plain message naming what is wrong
(StrictMemory.cache_fault):

  add, get, get_cache of one id, delete, dump, load
                      keep and copy whatever they are handed, as upstream;
  get_cache of several ids (the merge), and the adapter's concat
                      ValueError unless every part is a cache of the model;
  generate, generate_returning
                      ValueError unless the cache is one of the model's, or
                      a new cache (no layers: the model's own start);
  extract             the model's own prefill: always one of its caches.

A cache of the model: the modern layout (a DynamicCache), exactly the
model's layer count, every layer initialized with keys and values and no
legacy-named slot (no bare or one-sided layer), each K/V tensor float32 of
shape [1, heads, tokens, head_dim] with the model's heads and head_dim,
and one token count in every layer.

Everything else is activation_memory.ActivationMemory's, historic bugs
included (activation_memory.BUGS, switched by the same names).

    store = StrictMemory()                    # decoder.Decoder(): 2 layers of 2x4, float32
    store.add([{"id": "a", "cache": cache}])
    tokens = store.generate(store.get_cache(["a"]), [7, 3], 8)   # ValueError unless "a" is the model's

Run with the SDK importable (PYTHONPATH=python, from the repository root).
"""

from __future__ import annotations

from typing import Iterable, Iterator, Optional, Sequence

import torch

from activation_memory import BUGS, ActivationMemory, DumpError, MemoryItem
from kvcheck_adapter import cache as kv
from kvcheck_adapter import decoder as models

__all__ = ["BUGS", "DTYPE", "DumpError", "LAYOUT", "MemoryItem", "StrictMemory"]

# The one layout and dtype of the model's caches.
LAYOUT = "modern"
DTYPE = torch.float32


class StrictMemory(ActivationMemory):
    """The store for one model: `model` (a decoder.Decoder, default the
    2-layer 2x4 one) gives the layer count (`layers`), `heads` and
    `head_dim`; its caches are float32 and modern."""

    def __init__(self, bugs: Iterable[str] = (), model: Optional[models.Decoder] = None):
        super().__init__(bugs=bugs, model=model)
        config = self.model.config
        self.layers, self.heads, self.head_dim = config.layer_count, config.head_count, config.head_dim

    def cache_fault(self, cache, new_allowed: bool = False) -> Optional[str]:
        """Why `cache` is not one of the model's caches, or None when it is.
        `new_allowed`: a cache without layers (a new one) is accepted."""
        layout = kv.layout_of(cache)
        if layout != LAYOUT:
            return f"a {layout} cache: the model's are {LAYOUT}"
        layers = cache.layers
        if new_allowed and not layers:
            return None
        if len(layers) != self.layers:
            return f"{len(layers)} layers: the model has {self.layers}"
        tokens = None
        for i, layer in enumerate(layers):
            if getattr(layer, "key_cache", None) is not None or getattr(layer, "value_cache", None) is not None:
                return f"layer {i} holds legacy-named slots"
            if not layer.is_initialized:
                return f"layer {i} is not initialized"
            for side in ("keys", "values"):
                held = getattr(layer, side, None)
                if held is None:
                    return f"layer {i} holds no {side}"
                if held.dtype != DTYPE:
                    return f"layer {i} {side} are {held.dtype}: the model's are {DTYPE}"
                if held.dim() != 4 or (held.shape[0], held.shape[1], held.shape[3]) != (1, self.heads, self.head_dim):
                    return f"layer {i} {side} have shape {list(held.shape)}: the model's are [1, {self.heads}, tokens, {self.head_dim}]"
                if tokens is None:
                    tokens = held.shape[2]
                elif held.shape[2] != tokens:
                    return f"layer {i} {side} hold {held.shape[2]} tokens, layer 0 keys {tokens}"
        return None

    def _require(self, cache, operation: str, new_allowed: bool = False) -> None:
        fault = self.cache_fault(cache, new_allowed)
        if fault is not None:
            raise ValueError(f"{operation}: not a cache of the model: {fault}")

    def merge(self, parts: Sequence):
        """The parts, each a cache of the model, concatenated along tokens:
        a new owned cache (ValueError naming the first part that is not)."""
        for n, part in enumerate(parts):
            self._require(part, f"merge (part {n})")
        return super()._merge(parts)

    _merge = merge  # get_cache's merge of several ids

    def check_for_generation(self, cache) -> None:
        """ValueError unless the model can run over `cache`: one of its
        caches, or a new one."""
        self._require(cache, "generate", new_allowed=True)

    def generate_stream(self, cache, prompt: Sequence[int], max_new_tokens: int) -> Iterator[int]:
        if cache is not None:
            self.check_for_generation(cache)
        return super().generate_stream(cache, prompt, max_new_tokens)

    def generate_returning(self, cache, prompt: Sequence[int], max_new_tokens: int):
        if cache is not None:
            self.check_for_generation(cache)
        return super().generate_returning(cache, prompt, max_new_tokens)
