"""batch through the process boundary (docs/protocol.md section 7d;
docs/semantics.md, batches): the SDK's optional Adapter.batch claims the
capability and answers the request, and kvcheck draws it for a Python
adapter: the example store with a correct batch passes batch-exact (and
the properties that judge what follows a batch), one whose reorder moves
the keys alone fails batch-exact.

The kvcheck runs cost seconds each: they run under torch 2 only."""
# kvcheck-test-pythons: torch2

import os

import pytest
import torch

import batch_adapter
from conftest import HERE, cache_json
from kvcheck_adapter import protocol
from kvcheck_adapter.adapter import Adapter, Server, capabilities_of

TORCH2 = int(torch.__version__.split(".")[0]) >= 2
over_the_wire = pytest.mark.skipif(not TORCH2, reason="kvcheck runs of this file run under torch 2 only (CI time)")
BATCH_ADAPTER = os.path.join(HERE, "batch_adapter.py")


def test_the_capability_follows_the_method():
    assert capabilities_of(batch_adapter.BatchAdapter())["batch"] is True
    assert capabilities_of(Adapter())["batch"] is False


def test_a_batch_hands_out_the_row_it_selects_as_a_new_owned_cache():
    server = Server(lambda: batch_adapter.BatchAdapter())
    assert server.handle({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})["ok"]
    server.handle({"op": "add", "id": "a", "metadata": {}, "cache": cache_json("modern/f32/3:[kv2 kv2]")})
    server.handle({"op": "add", "id": "b", "metadata": {}, "cache": cache_json("modern/f32/4:[kv2 kv2]")})
    assert server.handle({"op": "get_cache", "ids": ["a"], "out": 1})["ok"]
    assert server.handle({"op": "get_cache", "ids": ["b"], "out": 2})["ok"]
    reply = server.handle({"op": "batch", "rows": [1, 2], "repeat": 2, "reorder": [3, 0, 1, 1], "select": 0, "out": 3})
    assert reply["ok"] and reply["copies"], reply
    row = server.handle({"op": "view_handle", "handle": 3})["view"]
    assert row == server.handle({"op": "view_handle", "handle": 2})["view"], row  # reorder[0] = 3: b's row
    with pytest.raises(ValueError, match="batch: handle 9 holds no cache"):
        server.handle({"op": "batch", "rows": [9], "repeat": 1, "reorder": [], "select": 0, "out": 4})


@over_the_wire
def test_a_correct_batch_passes_and_one_reordering_the_keys_alone_fails(kvcheck, monkeypatch):
    run = kvcheck("run", "--adapter", BATCH_ADAPTER, "--property", "batch-exact", "--property", "clone-independent",
                  "--property", "generation-equivalent", "--cases", "30")
    verdicts = {p["id"]: p["verdict"] for p in run.applicable()}
    assert set(verdicts.values()) == {"pass"}, verdicts
    assert {"batch-exact", "clone-independent", "generation-equivalent"} <= set(verdicts), verdicts
    monkeypatch.setenv("KVCHECK_TEST_BATCH_BUG", "keys_only")
    run = kvcheck("run", "--adapter", BATCH_ADAPTER, "--property", "batch-exact", "--cases", "200", "--failures", "1")
    result = run.result("batch-exact")
    assert result["verdict"] == "fail", result
