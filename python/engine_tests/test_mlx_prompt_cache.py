"""kvcheck on mlx-lm's prompt cache (python/adapters/mlx_prompt_cache_adapter.py;
python/README.md "Real engines"), at the verdicts recorded there, from its
pinned environment .venv/engines/mlx-lm-0.32.2 (scripts/bootstrap; skipped
when it is not installed): LRUPromptCache over KVCaches and the tiny MLX
Llama holds every property it can be judged on (content, generation, the
store's contract); the copy log, storage identities and owned marker are
declared absent (MLX arrays share buffers until written)."""

import os

import pytest

from conftest import PYTHON_DIR, REPO

ADAPTER = os.path.join(PYTHON_DIR, "adapters", "mlx_prompt_cache_adapter.py")
# Small budget (ctest label real-engines).
CASES = "6"
JUDGED = {"stored-immutable", "layout-roundtrip", "merge-correct", "generation-equivalent", "store-contract"}
DECLARED_ABSENT = {"single-copy", "owned-marker", "clone-independent"}


def test_mlx_lm_prompt_cache_holds_every_property_it_can_be_judged_on(kvcheck, monkeypatch):
    environment = os.path.join(REPO, ".venv", "engines", "mlx-lm-0.32.2")
    if not os.path.isdir(environment):
        pytest.skip(f"mlx-lm is not installed at {environment} (scripts/bootstrap installs it)")
    # mlx_lm's package import also loads transformers and huggingface_hub.
    monkeypatch.setenv("PYTHONPATH", environment + os.pathsep + os.path.join(REPO, ".venv", "transformers", "5.25.0"))
    run = kvcheck("run", "--adapter", ADAPTER, "--cases", CASES, "--jobs", "2", "--timeout", "600")
    assert run.status == 0, run.stdout + run.stderr
    verdicts = {p["id"]: p["verdict"] for p in run.applicable()}
    assert {p: verdicts.get(p) for p in JUDGED} == {p: "pass" for p in JUDGED}, verdicts
    assert {p: verdicts.get(p) for p in DECLARED_ABSENT} == {p: "skipped" for p in DECLARED_ABSENT}, verdicts
    assert run.report["adapter"] == "mlx-lm-0.32.2"
