"""trim through the process boundary (docs/protocol.md section 7b;
docs/semantics.md, trimming): the SDK's optional Adapter.trim claims the
capability and answers the request, and kvcheck draws it for a Python
adapter: the example store with a correct trim passes trim-exact (and the
properties that judge what follows a trim), one that keeps a token too
many fails trim-exact.

The kvcheck runs cost seconds each: they run under torch 2 only."""
# kvcheck-test-pythons: torch2

import os

import pytest
import torch

import trim_adapter
from conftest import HERE, cache_json
from kvcheck_adapter import protocol
from kvcheck_adapter.adapter import Adapter, Server, capabilities_of

TORCH2 = int(torch.__version__.split(".")[0]) >= 2
over_the_wire = pytest.mark.skipif(not TORCH2, reason="kvcheck runs of this file run under torch 2 only (CI time)")
TRIM_ADAPTER = os.path.join(HERE, "trim_adapter.py")


def test_the_capability_follows_the_method():
    assert capabilities_of(trim_adapter.TrimAdapter())["trim"] is True
    assert capabilities_of(Adapter())["trim"] is False


def test_a_trim_cuts_the_cache_the_handle_holds_in_place():
    server = Server(lambda: trim_adapter.TrimAdapter())
    assert server.handle({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})["ok"]
    server.handle({"op": "add", "id": "a", "metadata": {}, "cache": cache_json("modern/f32/3:[kv5 kv5]")})
    assert server.handle({"op": "get_cache", "ids": ["a"], "out": 1})["ok"]
    reply = server.handle({"op": "trim", "handle": 1, "keep": 2})
    assert reply["ok"] and reply["copies"] == [], reply
    view = server.handle({"op": "view_handle", "handle": 1})["view"]
    assert [layer["slots"][0]["shape"] for layer in view["layers"]] == [[1, 2, 2, 4], [1, 2, 2, 4]], view
    with pytest.raises(ValueError, match="trim: handle 9 holds no cache"):
        server.handle({"op": "trim", "handle": 9, "keep": 2})


@over_the_wire
def test_a_correct_trim_passes_and_one_keeping_a_token_too_many_fails(kvcheck, monkeypatch):
    run = kvcheck("run", "--adapter", TRIM_ADAPTER, "--property", "trim-exact", "--property", "stored-immutable",
                  "--property", "generation-equivalent", "--cases", "30")
    verdicts = {p["id"]: p["verdict"] for p in run.applicable()}
    assert verdicts["trim-exact"] == "pass" and verdicts["stored-immutable"] == "pass", verdicts
    assert verdicts["generation-equivalent"] == "pass", verdicts
    monkeypatch.setenv("KVCHECK_TEST_TRIM_BUG", "keeps_extra")
    run = kvcheck("run", "--adapter", TRIM_ADAPTER, "--property", "trim-exact", "--cases", "200", "--failures", "1")
    result = run.result("trim-exact")
    assert result["verdict"] == "fail", result
