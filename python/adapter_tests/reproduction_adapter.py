"""The example store with one of the bugs whose reports issue 33 is about:
a failure that needs an earlier engine, one that comes and goes, a refusal
that follows another fault, and copies of an arena (test_reproduction.py).

    reproduction_adapter.py --case shared_default|shared_copy|flaky|empty_handle|arena|arena_copy

shared_default  generate with no cache writes into a default argument
                (`def generate(self, cache, ..., _empty=DynamicCache())`):
                module state every engine of the process shares, so a
                generation from nothing continues the previous one's.
shared_copy     the first to_legacy of the process aliases its source,
                every later one copies it: both are
                allowed, so no property fails, but the engine answers
                otherwise after another engine ran (module state).
flaky           generation's first token is wrong in two adapter processes
                of three (by their order of start, counted in the file
                $KVCHECK_TEST_PROCESS_COUNTER): as a bug that depends on
                something outside the trace (an address reused) does.
empty_handle    get_cache of several ids hands out no cache.
arena           a load packs every tensor of one dtype, over all entries,
                into one storage (an arena); nothing is wrong with it.
arena_copy      get_cache of one id carves its copy from one arena with
                the stored entry: a copy, but sharing one storage with it.
"""

import argparse
import fcntl
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import activation_memory_adapter  # noqa: E402
from kvcheck_adapter import cache as kv  # noqa: E402
from kvcheck_adapter import decoder as models  # noqa: E402
from kvcheck_adapter.adapter import serve  # noqa: E402

CASES = ("shared_default", "shared_copy", "flaky", "empty_handle", "arena", "arena_copy")


class SharedDefault(activation_memory_adapter.ActivationMemoryAdapter):
    def generate(self, cache, prompt, max_new_tokens, _empty=kv.DynamicCache()):  # noqa: B008 (the bug)
        if cache is None:
            return models.generate(self.store.model, prompt, _empty, max_new_tokens)
        return super().generate(cache, prompt, max_new_tokens)

    def generate_stream(self, cache, prompt, max_new_tokens):
        return iter(self.generate(cache, prompt, max_new_tokens))


_LEGACY_DONE = [False]  # a to_legacy ran in this process (module state, never reset)


class SharedCopy(activation_memory_adapter.ActivationMemoryAdapter):
    def to_legacy(self, cache):
        legacy = kv.to_legacy(cache)
        if _LEGACY_DONE[0]:
            legacy.key_cache = [t.clone() if isinstance(t, torch.Tensor) else t for t in legacy.key_cache]
            legacy.value_cache = [t.clone() if isinstance(t, torch.Tensor) else t for t in legacy.value_cache]
        _LEGACY_DONE[0] = True
        return legacy


_ORDINAL = {}  # pid -> this process's place among the adapter processes started


def process_ordinal():
    """1 for the first adapter process that makes an engine, 2 for the next, ..."""
    pid = os.getpid()
    if pid not in _ORDINAL:
        path = os.environ["KVCHECK_TEST_PROCESS_COUNTER"]
        with open(path, "a+") as file:
            fcntl.flock(file, fcntl.LOCK_EX)
            file.seek(0)
            count = len(file.read().split()) + 1
            file.write(f"{pid}\n")
        _ORDINAL[pid] = count
    return _ORDINAL[pid]


class Flaky(activation_memory_adapter.ActivationMemoryAdapter):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.broken = process_ordinal() % 3 != 0

    def generate(self, cache, prompt, max_new_tokens):
        tokens = super().generate(cache, prompt, max_new_tokens)
        if self.broken and tokens:
            tokens[0] += 1
        return tokens

    def generate_stream(self, cache, prompt, max_new_tokens):
        return iter(self.generate(cache, prompt, max_new_tokens))


class EmptyHandle(activation_memory_adapter.ActivationMemoryAdapter):
    def get_cache(self, ids):
        if len(ids) > 1:
            return None
        return super().get_cache(ids)


def _pack(caches):
    """Every tensor of the caches, moved into one storage per dtype: each
    slot a view of it."""
    slots = [(layer, name) for cache in caches for layer in getattr(cache, "layers", []) for name in ("keys", "values")]
    slots = [(layer, name) for layer, name in slots if isinstance(getattr(layer, name), torch.Tensor)]
    for dtype in {getattr(layer, name).dtype for layer, name in slots}:
        mine = [(layer, name) for layer, name in slots if getattr(layer, name).dtype == dtype]
        arena = torch.empty(sum(getattr(layer, name).numel() for layer, name in mine), dtype=dtype)
        at = 0
        for layer, name in mine:
            tensor = getattr(layer, name)
            view = arena[at:at + tensor.numel()].view(tensor.shape)
            view.copy_(tensor)
            setattr(layer, name, view)
            at += tensor.numel()


class Arena(activation_memory_adapter.ActivationMemoryAdapter):
    def load(self, directory):
        super().load(directory)
        _pack([item.cache for item in self.store._items.values()])


class ArenaCopy(activation_memory_adapter.ActivationMemoryAdapter):
    def get_cache(self, ids):
        copy = super().get_cache(ids)
        item = self.store._items.get(ids[0]) if len(ids) == 1 else None
        if copy is not None and item is not None:
            _pack([item.cache, copy])
        return copy


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", required=True, choices=CASES)
    case = parser.parse_args(argv).case
    engine = {"shared_default": SharedDefault, "shared_copy": SharedCopy, "flaky": Flaky, "empty_handle": EmptyHandle,
              "arena": Arena, "arena_copy": ArenaCopy}[case]
    model = models.Decoder()

    class Engine(engine):
        pass

    def make():
        made = Engine([], model)
        made.name = f"reproduction-{case}"
        return made

    serve(make)


if __name__ == "__main__":
    main()
