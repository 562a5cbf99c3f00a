"""What a generation step costs with the real model (kvcheck_adapter.hf:
transformers' own model.generate over a real DynamicCache, for the
installed transformers) against the SDK's decoder (kvcheck_adapter.decoder,
kvcheck's bit-exact attention decoder over the SDK's own cache), per
cached length. Prints a table; asserts nothing.

    PYTHONPATH=.venv/transformers/4.57.6:python .venv/bin/python bench/python/generation_cost.py [--repeats 7]

For each cached length, each model generates from a fresh copy of a cache
of that many tokens, prompt 2 tokens, once with 1 new token (prefill) and
once with 1 + steps_count new tokens; a decoding step costs the difference
over steps_count. The median over the repeats of process CPU time, in
milliseconds (CPU time: the machine's other load stays out of the figures).
The copy tracker is not recording (its cost is replay_requests.py's
--switch-off copy-tracker). The two models differ in geometry as kvcheck
runs them: the real one 2 layers of 2 K/V heads x 8 (4 query heads, hidden
32, vocab 64), the decoder 2 layers of 2 heads x 4 (vocab 32).
"""

import argparse
import copy
import os
import statistics
import sys
import time

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(_ROOT, "python"))

import torch  # noqa: E402

from kvcheck_adapter import cache as kv  # noqa: E402
from kvcheck_adapter import content  # noqa: E402
from kvcheck_adapter import decoder  # noqa: E402
from kvcheck_adapter import hf  # noqa: E402
from kvcheck_adapter import wire  # noqa: E402

CACHED_TOKENS = (0, 16, 128, 512, 2048)
PROMPT = [7, 3]
STEPS_COUNT = 16


def _cpu_ms(run) -> float:
    start = time.process_time()
    run()
    return (time.process_time() - start) * 1e3


def _median_ms(make_cache, generate, new_tokens: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        cache = make_cache()  # not timed
        samples.append(_cpu_ms(lambda: generate(cache, new_tokens)))
    return statistics.median(samples)


def _content(layout: str, tokens: int, heads: int, head_dim: int):
    layers = " ".join([f"kv{tokens}"] * 2)
    return content.expand(content.parse_cache_spec(f"{layout}/f32/1/{heads}x{head_dim}:[{layers}]"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    arguments = parser.parse_args()
    torch.set_num_threads(1)  # one core, as each of kvcheck's adapter processes has
    real = hf.tiny_model()
    domain = hf.model_domain(real)
    ours = decoder.Decoder(decoder.DecoderConfig(eos_token=-1))
    models = {
        f"transformers {hf.VERSION}": (
            lambda tokens: hf.materialize(_content(hf.LAYOUT, tokens, domain["heads"], domain["head_dim"])),
            lambda cache, n: hf.generate(real, PROMPT, cache, n),
        ),
        "SDK decoder": (
            lambda tokens: wire.materialize(_content("modern", tokens, 2, 4)),
            lambda cache, n: decoder.generate(ours, PROMPT, cache, n),
        ),
    }
    print(f"generation cost, CPU ms (median of {arguments.repeats}), prompt {len(PROMPT)} tokens, torch {torch.__version__}, 1 thread")
    print(f"{'model':<22} {'cached':>7} {'prefill+1':>10} {'per step':>9}")
    per_step = {}
    for name, (make, generate) in models.items():
        for tokens in CACHED_TOKENS:
            stored = make(tokens)
            fresh = lambda: copy.deepcopy(stored) if name.startswith("transformers") else kv.clone(stored)  # noqa: E731
            _median_ms(fresh, generate, 1 + STEPS_COUNT, 1)  # warm up
            first = _median_ms(fresh, generate, 1, arguments.repeats)
            longer = _median_ms(fresh, generate, 1 + STEPS_COUNT, arguments.repeats)
            step = (longer - first) / STEPS_COUNT
            per_step[(name, tokens)] = step
            print(f"{name:<22} {tokens:>7} {first:>10.2f} {step:>9.3f}")
    print("per-step ratio, real model / SDK decoder:")
    real_name = next(iter(models))
    print("  " + ", ".join(f"{t} cached: {per_step[(real_name, t)] / per_step[('SDK decoder', t)]:.1f}x" for t in CACHED_TOKENS))


if __name__ == "__main__":
    main()
