"""kvcheck's adapter for vLLM's v1 prefix cache: the real KVCacheManager
and BlockPool of vllm 0.33.0 (python/requirements/vllm-0.33.0.txt), driven
on a CPU without a model. kvcheck's SDK (kvcheck_adapter.paged) decodes and
keeps the K/V in its shadow store by block id; the manager decides every
block: which blocks a request's table holds, which a prefix hit shares,
when one is freed, cached, evicted or reused.

    PYTHONPATH=.venv/engines/vllm-0.33.0 \\
        kvcheck run --adapter python/adapters/vllm_block_manager_adapter.py
    ... --adapter 'python/adapters/vllm_block_manager_adapter.py --publish-at-schedule'

How kvcheck's paged operations map onto vLLM's calls (the scheduler's own
sequence of calls, vllm/v1/core/sched/scheduler.py):

- alloc:  a Request (its block hasher = get_request_block_hasher with
  sha256_cbor, the cache salt = the trace's salt), get_computed_blocks,
  allocate_slots(num_new_computed_tokens, new_computed_blocks,
  delay_cache_blocks=True); None (no room) is a refusal.
- append: the tokens join the request (append_output_token_ids, which
  extends its block hashes), allocate_slots(k); None is a refusal (the
  tokens are taken back from the request: vLLM's scheduler would preempt).
- step:   cache_blocks(request, num_computed_tokens) for every request:
  the full blocks are published at the worker boundary, after their K/V
  were written. vLLM's scheduler publishes them when it schedules the
  request (allocate_slots without delay_cache_blocks), before the forward
  pass writes them: --publish-at-schedule drives it that way
  (python/README.md, "Real engines", says what kvcheck reports then and why).
  take_kv_cache_block_copies drains the copy-on-write copies (none in this
  configuration: hash_block_size == block_size, so no partial-block hits).
- free:   free(request).
- lookup: get_computed_blocks of a request that is never allocated
  (read-only: find_longest_cache_hit looks the hashes up). With
  --reuse-lookup, a probe and not vLLM's way, the next alloc of the same
  tokens and salt takes the blocks it computed (python/README.md, "Under
  concurrent clients": found with --lanes, not by one client).
- evict:  evict_blocks(the ids of the free blocks that have a hash).
- reset:  reset_prefix_cache().
- fork, import: not offered (capabilities paged_fork and paged_import
  false: kvcheck never draws them). vLLM's v1 manager has neither
  (parallel sampling is separate requests sharing a prefix through the
  cache; a connector's external KV is a different path).

Observations: block_pool.blocks[i].ref_cnt (the null block's count is not
maintained by vLLM: reported 0), block_hash, the free queue
(free_block_queue.get_all_free_blocks(), front first),
cached_block_hash_to_block, and each request's blocks
(coordinator.single_type_managers[0].req_to_blocks). A block hash is
opaque bytes; the adapter wraps the hash function to remember what each
hash was computed from (parent hash, tokens, extra keys), so a key reports
its tokens. The wrapper returns the same bytes.
"""

from __future__ import annotations

import argparse
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(1, os.path.dirname(_HERE))  # the SDK, when run from the source tree

import _engine_env  # noqa: E402

VLLM_VERSION = "0.33.0"

#: Third-party modules vLLM's import chain reaches only through its server,
#: multimodal, tokenizer and metrics code; a placeholder when not installed.
VLLM_PLACEHOLDER_MODULES = (
    "PIL", "aiohttp", "av", "cloudpickle", "cpuinfo", "cv2", "huggingface_hub", "prometheus_client", "pybase64",
    "requests", "safetensors", "scipy", "soundfile", "soxr", "torchaudio", "torchcodec", "transformers", "uvloop",
)
#: vLLM packages whose __init__ re-exports the whole engine (configs, the
#: distributed runtime, multimodal registries, the engine core, structured
#: output, metrics); their submodules the cache code names load as usual.
VLLM_SKIPPED_INITS = (
    "vllm.config", "vllm.distributed", "vllm.multimodal", "vllm.v1.engine", "vllm.v1.structured_output",
    "vllm.v1.metrics",
)


def _import_vllm():
    _engine_env.placeholders_for_missing(VLLM_PLACEHOLDER_MODULES, ("vllm",))
    for package in VLLM_SKIPPED_INITS:
        _engine_env.skip_package_init(package)
    import vllm  # noqa: F401
    from vllm.v1.core import kv_cache_manager, kv_cache_utils
    from vllm.v1 import kv_cache_interface, request
    from vllm.utils import hashing
    from vllm import sampling_params
    return kv_cache_manager, kv_cache_utils, kv_cache_interface, request, hashing, sampling_params


kv_cache_manager, kv_cache_utils, kv_cache_interface, vllm_request, vllm_hashing, vllm_sampling = _import_vllm()

import torch  # noqa: E402

from kvcheck_adapter.paged import BlockKey, BlockManagerAdapter, ManagerState, OutOfBlocks, serve  # noqa: E402


class _RecordingHash:
    """vLLM's sha256_cbor, remembering what each hash was computed from:
    hash -> (parent hash, block tokens, extra keys). Same bytes out."""

    def __init__(self, function):
        self.function = function
        self.inputs = {}

    def __call__(self, value):
        digest = self.function(value)
        if isinstance(value, tuple) and len(value) == 3:
            self.inputs[bytes(digest)] = value
        return digest


class VllmBlockManager(BlockManagerAdapter):
    description = f"vLLM {VLLM_VERSION} v1 KVCacheManager/BlockPool (prefix caching, one full-attention group)"
    # BlockPool.free_blocks: a freed block without a hash joins the front
    # of the free queue (LIFO, "for better GPU locality"), one with a hash
    # the back (LRU eviction).
    free_order = "front-unhashed"
    num_blocks = 8
    block_tokens = 2

    def __init__(self, publish_at_schedule=False, reuse_lookup=False, window=0):
        self.publish_at_schedule = publish_at_schedule
        # A planted misuse, not vLLM's way (its scheduler calls
        # get_computed_blocks and allocate_slots in one pass): a lookup's
        # computed blocks are kept and handed to the next alloc of the same
        # tokens and salt, as a scheduler that looks up in one pass and
        # allocates in a later one. The probe of python/README.md ("Under
        # concurrent clients"): another client's call in between is found.
        self.reuse_lookup = reuse_lookup
        self.looked_up = {}  # (tokens, salt) -> (computed blocks, cached tokens)
        self.name = (f"vllm-{VLLM_VERSION}" + ("+publish-at-schedule" if publish_at_schedule else "")
                     + ("+reuse-lookup" if reuse_lookup else "") + (f"+sliding-window-{window}" if window else ""))
        if window:
            # SlidingWindowManager: allocate_slots gives back the blocks behind
            # the window (remove_skipped_blocks), the null block in their place.
            self.window = window
            spec = kv_cache_interface.SlidingWindowSpec(
                block_size=self.block_tokens, num_kv_heads=self.heads, head_size=self.head_dim, dtype=torch.float32,
                sliding_window=window)
        else:
            spec = kv_cache_interface.FullAttentionSpec(
                block_size=self.block_tokens, num_kv_heads=self.heads, head_size=self.head_dim, dtype=torch.float32)
        config = kv_cache_interface.KVCacheConfig(
            num_blocks=self.num_blocks, kv_cache_tensors=[],
            kv_cache_groups=[kv_cache_interface.KVCacheGroupSpec(["layer.0"], spec)])
        self.manager = kv_cache_manager.KVCacheManager(
            config, max_model_len=1 << 12, scheduler_block_size=self.block_tokens,
            hash_block_size=self.block_tokens, enable_caching=True)
        self.pool = self.manager.block_pool
        self.hash = _RecordingHash(vllm_hashing.sha256_cbor)
        kv_cache_utils.init_none_hash(self.hash)
        self.none_hash = bytes(kv_cache_utils.NONE_HASH)
        self.hasher = kv_cache_utils.get_request_block_hasher(self.block_tokens, self.hash)
        self.requests = {}  # seq -> Request
        self.lookups = 0

    def _request(self, name, tokens, extra):
        return vllm_request.Request(
            request_id=name, prompt_token_ids=list(tokens), sampling_params=vllm_sampling.SamplingParams(max_tokens=1 << 10), pooling_params=None,
            cache_salt=extra or None, block_hasher=self.hasher)

    # ---- the manager's calls ----

    def allocate(self, seq, tokens, extra):
        request = self._request(f"seq-{seq}", tokens, extra)
        blocks, cached, _ = self.manager.get_computed_blocks(request)
        if (tuple(tokens), extra) in self.looked_up:
            blocks, cached = self.looked_up.pop((tuple(tokens), extra))
        new = self.manager.allocate_slots(
            request, len(tokens) - cached, num_new_computed_tokens=cached, new_computed_blocks=blocks,
            delay_cache_blocks=not self.publish_at_schedule)
        if new is None:
            raise OutOfBlocks(f"vLLM's allocate_slots found no room for {len(tokens) - cached} new tokens")
        request.num_computed_tokens = len(tokens)
        request.status = vllm_request.RequestStatus.RUNNING
        self.requests[seq] = request
        return cached

    def append(self, seq, tokens):
        request = self.requests[seq]
        before = request.num_tokens, len(request.block_hashes)
        request.append_output_token_ids(list(tokens))
        new = self.manager.allocate_slots(request, len(tokens), delay_cache_blocks=not self.publish_at_schedule)
        if new is None:
            del request._output_token_ids[-len(tokens):]
            del request._all_token_ids[before[0]:]
            del request.block_hashes[before[1]:]
            raise OutOfBlocks(f"vLLM's allocate_slots found no room for {len(tokens)} more tokens")
        request.num_computed_tokens += len(tokens)
        return self._take_copies()

    def free(self, seq):
        self.manager.free(self.requests.pop(seq))

    def lookup(self, tokens, extra):
        self.lookups += 1
        blocks, cached, _ = self.manager.get_computed_blocks(self._request(f"lookup-{self.lookups}", tokens, extra))
        if self.reuse_lookup:
            self.looked_up[(tuple(tokens), extra)] = (blocks, cached)
        return cached

    def evict(self):
        self.manager.evict_blocks({b.block_id for b in self.pool.free_block_queue.get_all_free_blocks()
                                   if b.block_hash is not None})

    def reset_prefix_cache(self):
        if not self.manager.reset_prefix_cache():
            raise RuntimeError("vLLM refused reset_prefix_cache with no request holding a block")

    def step(self, copies):
        if not self.publish_at_schedule:
            for request in self.requests.values():
                self.manager.cache_blocks(request, request.num_computed_tokens)
        self._take_copies()

    def _take_copies(self):
        copies, _ = self.manager.take_kv_cache_block_copies()
        return [(c.src_block_id, c.dst_block_id) for c in copies] if copies else []

    # ---- the one observation ----

    def _key(self, block_hash_with_group):
        digest = bytes(kv_cache_utils.get_block_hash(block_hash_with_group))
        parent, tokens, extra = self.hash.inputs[digest]
        parent = None if parent is None or bytes(parent) == self.none_hash else bytes(parent)
        salt = ""
        for key in extra or ():
            if isinstance(key, tuple) and key and key[0] == "cache_salt":
                salt = key[1]
        return BlockKey(parent, tokens, salt)

    def state(self):
        blocks = self.pool.blocks
        counts = [0] + [b.ref_cnt for b in blocks[1:]]
        keys = {b.block_id: self._key(b.block_hash) for b in blocks if b.block_hash is not None}
        index = {}
        for key, held in self.pool.cached_block_hash_to_block._cache.items():
            ids = [held.block_id] if isinstance(held, kv_cache_utils.KVCacheBlock) else list(held)
            index.setdefault(self._key(key), []).extend(ids)
        tables_of = self.manager.coordinator.single_type_managers[0].req_to_blocks
        tables = {seq: [b.block_id for b in tables_of.get(r.request_id, ())] for seq, r in self.requests.items()}
        free = [b.block_id for b in self.pool.free_block_queue.get_all_free_blocks()]
        return ManagerState(counts=counts, keys=keys, index=index, free_queue=free, tables=tables)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publish-at-schedule", action="store_true",
                        help="cache full blocks in allocate_slots, as vLLM's scheduler does, not at the step")
    parser.add_argument("--reuse-lookup", action="store_true",
                        help="a planted misuse (a probe): an alloc takes the blocks its tokens' last lookup computed")
    parser.add_argument("--window", type=int, default=0,
                        help="a sliding-window attention group of this many tokens (vLLM's SlidingWindowManager)")
    args = parser.parse_args(argv)
    serve(lambda: VllmBlockManager(publish_at_schedule=args.publish_at_schedule, reuse_lookup=args.reuse_lookup,
                                   window=args.window))


if __name__ == "__main__":
    main()
