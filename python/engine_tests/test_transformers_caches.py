"""kvcheck on transformers' own cache classes (python/adapters/
transformers_caches_adapter.py; python/README.md "Real engines"), at the
verdicts recorded there, with transformers 5.25.0 from its pinned
environment (.venv/transformers/5.25.0; skipped when it is not installed):
a store of StaticCaches holds every contiguous property (trim-exact too:
the adapter's trim is transformers' crop); generating with
prompt lookup decoding from a stored cache breaks generation-equivalent,
transformers' own bug (docs/findings/transformers-1.md): an expected FAIL,
so that an upstream fix shows up here as a change. Beam search from stored
caches, with the store's copies made by a batch operation
(batch_select_indices), holds the store properties; a probe running beam
search on the stored cache itself (no boundary copy) fails
stored-immutable, so that check reaches the beams' expansion. Copies by
copy.deepcopy break single-copy after a crop, transformers' own defect
(docs/findings/transformers-2.md): an expected FAIL. EncoderDecoderCaches
(--cache encdec, a tiny BART) under beam search and copies by their own
batch_select_indices hold every property they claim; a probe whose copies
reuse their source's cross-attention cache fails stored-immutable."""

import os
import textwrap

import pytest

from conftest import PYTHON_DIR, REPO, kvcheck_binary
from kvcheck_adapter import zygote

ADAPTER = os.path.join(PYTHON_DIR, "adapters", "transformers_caches_adapter.py")
VERSION = "5.25.0"
# Small budgets (ctest label real-engines): each run is seconds of CPU.
CASES = "6"
# What beam search and a copy by rows can break: every store property but
# merge-correct (a merge is made by cat either way), store-contract and
# trim-exact (neither reaches a batch operation).
BATCH_PROPERTIES = {"stored-immutable", "single-copy", "layout-roundtrip", "owned-marker", "clone-independent",
                    "generation-equivalent"}
STORE_PROPERTIES = {"stored-immutable", "single-copy", "layout-roundtrip", "merge-correct", "owned-marker",
                    "clone-independent", "generation-equivalent", "store-contract", "trim-exact"}


@pytest.fixture(scope="module")
def transformers_zygote():
    """One interpreter with torch and transformers imported for the file's
    kvcheck runs: each run's adapter processes are copies of it
    (kvcheck_adapter/zygote.py; CI time: about 4 CPU-s of imports a run)."""
    environment = os.path.join(REPO, ".venv", "transformers", VERSION)
    if not os.path.isdir(environment):
        pytest.skip(f"transformers {VERSION} is not installed at {environment} (scripts/bootstrap installs it)")
    started = zygote.for_kvcheck(kvcheck_binary(), zygote.TRANSFORMERS_MODULES,
                                 dict(os.environ, PYTHONPATH=environment), PYTHON_DIR)
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def transformers_env(monkeypatch, transformers_zygote):
    monkeypatch.setenv("PYTHONPATH", os.path.join(REPO, ".venv", "transformers", VERSION))
    for name, value in transformers_zygote.variables().items():
        monkeypatch.setenv(name, value)
    yield
    # Every adapter process ran in a copy: a start that fell back to cold
    # (an environment the zygote does not match) would cost the imports.
    assert "cold:" not in transformers_zygote.log(), transformers_zygote.log()


def test_a_store_of_static_caches_holds_every_store_property(kvcheck, transformers_env):
    run = kvcheck("run", "--adapter", ADAPTER + " --cache static", "--cases", CASES, "--jobs", "2")
    assert run.status == 0, run.stdout + run.stderr
    verdicts = {p["id"]: p["verdict"] for p in run.applicable() if p["id"] in STORE_PROPERTIES}
    assert verdicts == {p: "pass" for p in STORE_PROPERTIES}, verdicts
    assert run.report["adapter"] == f"transformers-{VERSION}-static"
    # 5.25's StaticLayer has no batch_repeat_interleave or
    # batch_select_indices: a StaticCache claims no batch.
    assert run.result("batch-exact")["verdict"] == "skipped", run.result("batch-exact")


def test_prompt_lookup_from_a_stored_cache_breaks_generation_equivalent(kvcheck, transformers_env):
    # docs/findings/transformers-1.md: assisted decoding's first forward
    # feeds the cached positions again.
    run = kvcheck("run", "--adapter", ADAPTER + " --cache dynamic --decoding prompt-lookup",
                  "--property", "generation-equivalent", "--cases", "30", "--failures", "1", "--replays", "1")
    assert run.status == 1, run.stdout + run.stderr
    result = run.result("generation-equivalent")
    assert result["verdict"] == "fail" and result["fault"] is None, result
    assert "a fresh copy gives" in result["message"], result["message"]


def test_beam_search_and_copies_by_batch_select_hold_the_store_properties(kvcheck, transformers_env):
    # --decoding beam: batch_repeat_interleave(2), then reorder_cache every
    # step; --copy select: every copy of one cache is batch_select_indices.
    properties = [argument for p in sorted(BATCH_PROPERTIES) for argument in ("--property", p)]
    run = kvcheck("run", "--adapter", ADAPTER + " --cache dynamic --decoding beam --copy select", *properties,
                  "--cases", CASES, "--jobs", "2")
    assert run.status == 0, run.stdout + run.stderr
    verdicts = {p["id"]: p["verdict"] for p in run.applicable() if p["id"] in BATCH_PROPERTIES}
    assert verdicts == {p: "pass" for p in BATCH_PROPERTIES}, verdicts


# kvcheck's batch (docs/semantics.md#batches) on DynamicCaches: the rows
# stacked, then transformers' batch_repeat_interleave, reorder_cache and
# batch_select_indices; the row handed out judged by its content, its
# storage against the rows', its marker, its copies and a generation from
# it.
BATCH_OP_PROPERTIES = {"batch-exact", "clone-independent", "owned-marker", "single-copy", "generation-equivalent",
                       "stored-immutable"}


def test_batches_of_dynamic_caches_hold_batch_exact_and_the_ownership_properties(kvcheck, transformers_env):
    properties = [argument for p in sorted(BATCH_OP_PROPERTIES) for argument in ("--property", p)]
    run = kvcheck("run", "--adapter", ADAPTER + " --cache dynamic", *properties, "--cases", CASES, "--jobs", "2")
    assert run.status == 0, run.stdout + run.stderr
    verdicts = {p["id"]: p["verdict"] for p in run.applicable() if p["id"] in BATCH_OP_PROPERTIES}
    assert verdicts == {p: "pass" for p in BATCH_OP_PROPERTIES}, verdicts


# The probe: beam search straight on what it is given, a stored cache too
# (no boundary copy), so that its batch_repeat_interleave rebinds the stored
# layers to the beams' rows.
PROBE = textwrap.dedent("""
    import runpy
    import sys

    adapter = runpy.run_path(sys.argv.pop(1))
    hf = adapter["hf"]


    class BeamsOnTheStoredCache(adapter["TransformersCachesAdapter"]):
        def generate(self, cache, prompt, max_new_tokens):
            work = self.new_cache() if cache is None else cache
            return hf.generate(self.model_, prompt, work, max_new_tokens, **self.options)


    model = hf.tiny_model()
    adapter["serve"](lambda: BeamsOnTheStoredCache(model, "dynamic", "beam"))
""")


# What the generic search found of the probe (stored-immutable after 22
# traces at the default seed, shrunk to these 3 operations; python/README.md
# "Real engines"), replayed here: beam search from a stored cache.
BEAMS_FROM_A_STORED_CACHE = """\
add c modern/f32/0/2x8:[kv1 kv1]
h1 = get c
generate h1 prompt=1 max=1
"""


def probe_breaks_stored_immutable(kvcheck, scratch_dir, probe_source, trace_text, message, options):
    """Replays `trace_text` on the probe adapter (`probe_source`, run over
    this adapter), asserting stored-immutable's FAIL with `message`, then on
    this adapter with `options`, asserting the pass."""
    probe = os.path.join(scratch_dir, "probe.py")
    trace = os.path.join(scratch_dir, "probe.trace")
    with open(probe, "w") as f:
        f.write(probe_source)
    with open(trace, "w") as f:
        f.write(trace_text)
    caught = kvcheck("replay", trace, "--adapter", f"{probe} {ADAPTER}", "--property", "stored-immutable")
    assert caught.status == 1, caught.stdout + caught.stderr
    assert message in caught.stdout, caught.stdout
    held = kvcheck("replay", trace, "--adapter", f"{ADAPTER} {options}", "--property", "stored-immutable")
    assert held.status == 0, held.stdout + held.stderr


def test_beam_search_on_the_stored_cache_itself_breaks_stored_immutable(kvcheck, transformers_env, scratch_dir):
    probe_breaks_stored_immutable(kvcheck, scratch_dir, PROBE, BEAMS_FROM_A_STORED_CACHE,
                                  "stored-immutable: entry \"c\" layer 0 keys shape [2,2,2,8]",
                                  "--cache dynamic --decoding beam")


def test_a_deep_copy_of_a_cropped_cache_breaks_single_copy(kvcheck, transformers_env):
    # docs/findings/transformers-2.md: crop leaves each layer a view of its
    # old tensors, and a deep copy copies the removed tokens too.
    # At the default budget: the default seed finds it after 165 traces
    # (7 s) since the batch operation joined the draws (10 before).
    run = kvcheck("run", "--adapter", ADAPTER + " --cache dynamic --copy deepcopy", "--property", "single-copy",
                  "--cases", "200", "--failures", "1", "--replays", "1")
    assert run.status == 1, run.stdout + run.stderr
    result = run.result("single-copy")
    assert result["verdict"] == "fail" and result["fault"] is None, result
    assert "but the K/V it copies are" in result["message"], result["message"]


# transformers' sliding-window layers (--sliding-window 8: a tiny Mistral,
# every layer sliding) as kvcheck's store window (docs/semantics.md#store-
# windows): a DynamicSlidingWindowLayer keeps the last sliding_window - 1
# tokens (declared window 7), a StaticSlidingWindowLayer min(sliding_window,
# max_cache_len) (declared 8). Every store property holds, trim-exact
# included (kvcheck trims only a cache that never held its window); a
# windowed DynamicCache claims no batch (one position count for all rows).
@pytest.mark.parametrize("cache_class", ["dynamic", "static"])
def test_sliding_window_layers_hold_every_store_property(kvcheck, transformers_env, cache_class):
    run = kvcheck("run", "--adapter", f"{ADAPTER} --cache {cache_class} --sliding-window 8", "--cases", CASES,
                  "--jobs", "2")
    assert run.status == 0, run.stdout + run.stderr
    assert run.report["adapter"] == f"transformers-{VERSION}-{cache_class}+window8"
    verdicts = {p["id"]: p["verdict"] for p in run.applicable() if p["id"] in STORE_PROPERTIES}
    assert verdicts == {p: "pass" for p in STORE_PROPERTIES}, verdicts
    assert run.result("batch-exact")["verdict"] == "skipped", run.result("batch-exact")


# The probe: a DynamicCache of sliding-window layers declared with the
# window the model attends over (8) instead of the tokens its layers keep
# (sliding_window - 1 = 7): a cache of 9 tokens stored shows 7.
WHOLE_WINDOW_PROBE = textwrap.dedent("""
    import runpy
    import sys

    adapter = runpy.run_path(sys.argv.pop(1))
    hf = adapter["hf"]


    class WholeWindow(adapter["TransformersCachesAdapter"]):
        def __init__(self, *arguments):
            super().__init__(*arguments)
            self.capabilities["window"] = self.sliding_window


    model = hf.tiny_model(config=hf.tiny_config(sliding_window=8))
    adapter["serve"](lambda: WholeWindow(model, "dynamic", "greedy"))
""")


def test_a_dynamic_sliding_layer_declared_with_its_whole_window_breaks_stored_immutable(
        kvcheck, transformers_env, scratch_dir):
    probe_breaks_stored_immutable(kvcheck, scratch_dir, WHOLE_WINDOW_PROBE, "add a modern/f32/0/2x8:[kv9 kv9]\n",
                                  "keys shape [1,2,7,8], expected [1,2,8,8]", "--cache dynamic --sliding-window 8")


# transformers' EncoderDecoderCache (--cache encdec: a tiny BART; kvcheck
# reads its self-attention layers then its cross-attention layers as one
# cache of 4 layers), under beam search with copies by its own
# batch_select_indices: every property it claims holds. It claims no trim
# (EncoderDecoderCache.crop cuts the self-attention layers only).
ENCDEC_CASES = "3"


def test_encoder_decoder_caches_hold_every_property_they_claim(kvcheck, transformers_env):
    run = kvcheck("run", "--adapter", ADAPTER + " --cache encdec --decoding beam --copy select", "--cases",
                  ENCDEC_CASES, "--jobs", "2")
    assert run.status == 0, run.stdout + run.stderr
    assert run.report["adapter"] == f"transformers-{VERSION}-encdec+beam+copy-select"
    claimed = STORE_PROPERTIES - {"trim-exact"} | {"batch-exact"}
    verdicts = {p["id"]: p["verdict"] for p in run.applicable() if p["id"] in claimed}
    assert verdicts == {p: "pass" for p in claimed}, verdicts
    assert run.result("trim-exact")["verdict"] == "skipped", run.result("trim-exact")


# The probe: every copy reuses its source's cross-attention cache (the
# encoder's K/V, fixed per encoder input, shared rather than copied), so
# kvcheck reaches the cross-attention layers: what the generic search
# found of it (stored-immutable after 2 traces at the default seed, shrunk
# to these 2 operations), replayed here.
SHARED_CROSS_ATTENTION_PROBE = textwrap.dedent("""
    import runpy
    import sys

    adapter = runpy.run_path(sys.argv.pop(1))
    encdec, transformers = adapter["encdec"], adapter["transformers"]


    class SharedCrossAttention(adapter["EncoderDecoderCachesAdapter"]):
        def copy_of(self, parts):
            made = super().copy_of(parts)
            made = encdec.EncoderDecoder(transformers.EncoderDecoderCache(
                made.cache.self_attention_cache, parts[0].cache.cross_attention_cache))
            self.handed_out.add(made)
            return made


    model = encdec.tiny_model()
    adapter["serve"](lambda: SharedCrossAttention(model, "greedy"))
""")


def test_an_encoder_decoder_copy_sharing_the_cross_attention_breaks_stored_immutable(
        kvcheck, transformers_env, scratch_dir):
    probe_breaks_stored_immutable(kvcheck, scratch_dir, SHARED_CROSS_ATTENTION_PROBE,
                                  "add d modern/f32/0/2x8:[kv1 kv1 kv1 kv1]\nh3 = get_cache d\n",
                                  "the cache get_cache handed out as h3 shares one storage with stored entry \"d\"",
                                  "--cache encdec")


# The probe: the adapter, holding 600 MiB more at its first operation and
# then waiting to be stopped. A copy of the zygote is not below the process
# kvcheck started: only its handshake's pid makes kvcheck count its memory
# (and its CPU for the hang rule) as the engine's (docs/protocol.md 10b).
MEMORY_HOG_PROBE = textwrap.dedent("""
    import runpy
    import sys
    import time

    from kvcheck_adapter.adapter import Server

    answer = Server.handle


    def handle(self, request):
        if request.get("op") not in ("hello", "shutdown"):
            held = b"\\1" * (600 << 20)
            time.sleep(60)  # killed by kvcheck first, or a hang after --timeout
            del held
        return answer(self, request)


    Server.handle = handle
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
""")


def test_the_memory_of_a_zygote_copy_counts_against_the_limit(kvcheck, transformers_env, scratch_dir, monkeypatch):
    # Cold starts: each job's adapter process is a launcher whose copy's
    # pid kvcheck learns from the handshake (a warm copy's, it learns from
    # the fork server).
    monkeypatch.setenv("KVCHECK_COLD_START", "1")
    probe = os.path.join(scratch_dir, "hog.py")
    with open(probe, "w") as f:
        f.write(MEMORY_HOG_PROBE)
    run = kvcheck("run", "--adapter", f"{probe} {ADAPTER} --cache static", "--property", "stored-immutable",
                  "--cases", "1", "--jobs", "1", "--memory-mb", "500")
    result = run.result("stored-immutable")
    assert result["verdict"] == "fail", result
    assert (result["fault"] or "").startswith("memory: resident memory"), result
