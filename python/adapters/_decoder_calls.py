"""The calls of a store adapter whose engine keeps K/V but runs no model of
its own (LMCache's CPU backend, Mooncake's store): generation, fresh
generation, clone and merge done by the SDK's decoder (`self.model_`) over
the SDK's DynamicCache, so that kvcheck judges the store, not a model."""
from __future__ import annotations

from kvcheck_adapter import cache as kv
from kvcheck_adapter import decoder as models


class DecoderCalls:
    """Mixed into an Adapter that sets `self.model_` (a kvcheck_adapter.decoder.Decoder)."""

    def generate(self, cache, prompt, max_new_tokens):
        if cache is None:
            working = kv.DynamicCache()
        elif kv.is_owned(cache):
            working = cache  # a copy the store handed out: the model writes into it
        else:
            working = kv.clone(cache)
        return models.generate(self.model_, prompt, working, max_new_tokens)

    def generate_fresh(self, cache, prompt, max_new_tokens):
        return models.generate(self.model_, prompt, cache, max_new_tokens)

    def clone(self, cache):
        return kv.clone(cache)

    def concat(self, caches):
        return kv.concat(caches)
