"""Caches the model makes, through the process boundary (protocol 4,
docs/protocol.md section 7; docs/semantics.md, returned caches): the SDK's
generate_returning, extract and fed_view requests, answered by the example
store, and kvcheck drawing them for a Python adapter: the fixed store
passes with turns and extracts over the wire, and each planted bug of
these paths (M30-M32 in Python) is caught by the property that names it.

The kvcheck runs cost seconds each: they run under torch 2 only (the
request-level tests, a fraction of a second, under both)."""

import pytest
import torch

import activation_memory
import activation_memory_adapter
from conftest import EXAMPLE, cache_json, handle_facts, new_server
from kvcheck_adapter import content
from kvcheck_adapter import protocol
from kvcheck_adapter import wire
from kvcheck_adapter.adapter import Adapter, Server, capabilities_of

TORCH2 = int(torch.__version__.split(".")[0]) >= 2
over_the_wire = pytest.mark.skipif(not TORCH2, reason="kvcheck runs of this file run under torch 2 only (CI time)")


def entry_of(reply, id):
    return next(f for f in reply["observed"]["entries"] if f["id"] == id)


def fed_view(server, cache, tokens):
    reply = server.handle({"op": "fed_view", "tokens": tokens, "cache": cache})
    assert reply["ok"], reply
    return reply["view"]


SPEC = "modern/f32/3:[kv2 kv2]"
EMPTY = {"layout": "modern", "dtype": "f32", "heads": 2, "head_dim": 4, "layers": []}


# ---- requests -------------------------------------------------------------------------


def test_the_capability_follows_the_three_methods():
    _, hello = new_server()
    assert hello["capabilities"]["returned_caches"] is True

    class NoTurns(Adapter):
        def generate_returning(self, cache, prompt, max_new_tokens):
            return [], cache

    assert capabilities_of(NoTurns())["returned_caches"] is False  # no extract, no feed


def test_a_turn_hands_back_the_cache_the_model_wrote_into_and_a_second_turn_continues_it():
    server, _ = new_server()
    server.handle({"op": "add", "id": "a", "metadata": {}, "cache": cache_json(SPEC)})
    stored = server.handle({"op": "get", "id": "a", "out": 1})
    entry_view = entry_of(stored, "a")["view"]
    first = server.handle({"op": "generate_returning", "handle": 1, "prompt": [1, 2], "max_new_tokens": 3, "out": 2})
    plain = server.handle({"op": "generate", "handle": 1, "prompt": [1, 2], "max_new_tokens": 3, "stream": False})
    assert first["tokens"] == plain["tokens"] and len(first["tokens"]) >= 1
    assert len(first["copies"]) == 1 and first["peak_live_sets"] == 2  # the boundary's copy, as generate
    returned = handle_facts(first, 2)
    assert returned["exists"] and returned["owned"]
    assert not set(returned["storage"]) & set(handle_facts(first, 1)["storage"])
    fed = [1, 2] + first["tokens"][:-1]  # the last token is never fed back
    assert returned["view"] == fed_view(server, cache_json(SPEC), fed)
    # Turn 2 from turn 1's cache: an owned copy, written in place; it gives
    # what one generation over both turns from the original gives.
    second = server.handle({"op": "generate_returning", "handle": 2, "prompt": [3], "max_new_tokens": 2, "out": 3})
    assert second["copies"] == []
    assert handle_facts(second, 3)["storage"] == handle_facts(second, 2)["storage"]  # one cache, two handles
    fresh = server.handle({"op": "generate_fresh", "prompt": fed + [3], "max_new_tokens": 2, "cache": cache_json(SPEC)})
    assert second["tokens"] == fresh["tokens"]
    assert handle_facts(second, 3)["view"] == fed_view(server, cache_json(SPEC), fed + [3] + second["tokens"][:-1])
    # Stored back: a read-only item; a generation from it copies it.
    kept = server.handle({"op": "add_handle", "id": "chat", "handle": 3})
    assert entry_of(kept, "chat")["owned"] is False
    server.handle({"op": "get", "id": "chat", "out": 4})
    before = entry_of(server.handle({"op": "get", "id": "chat", "out": 5}), "chat")["view"]
    again = server.handle({"op": "generate", "handle": 4, "prompt": [4], "max_new_tokens": 2, "stream": False})
    assert len(again["copies"]) == 1
    after = server.handle({"op": "get", "id": "chat", "out": 6, "read_ids": ["a"]})
    assert entry_of(after, "chat")["view"] == before
    assert entry_of(after, "a")["view"] == entry_view  # no stored item changed on the way


def test_a_turn_from_no_cache_and_of_no_tokens():
    server, _ = new_server()
    none = server.handle({"op": "generate_returning", "handle": 0, "prompt": [5, 6], "max_new_tokens": 2, "out": 1})
    assert none["copies"] == [] and handle_facts(none, 1)["owned"]
    assert handle_facts(none, 1)["view"] == fed_view(server, EMPTY, [5, 6] + none["tokens"][:-1])
    server.handle({"op": "make", "out": 2, "cache": cache_json("modern/f32/0:[]")})
    nothing = server.handle({"op": "generate_returning", "handle": 2, "prompt": [5], "max_new_tokens": 0, "out": 3})
    assert nothing["tokens"] == [] and nothing["copies"] == [{"reason": "generate_returning", "bytes": 0}]
    assert handle_facts(nothing, 3)["owned"] and handle_facts(nothing, 3)["view"] == handle_facts(nothing, 2)["view"]


def test_extract_stores_what_a_fresh_cache_fed_the_prompt_holds():
    server, _ = new_server()
    reply = server.handle({"op": "extract", "id": "m", "prompt": [4, 2, 9]})
    entry = entry_of(reply, "m")
    assert entry["owned"] is False and reply["copies"] == [] and reply["observed"]["stored_ids"] == ["m"]
    assert entry["view"] == fed_view(server, EMPTY, [4, 2, 9])
    assert fed_view(server, EMPTY, []) == {"layout": "modern", "layers": []}


def test_the_planted_bugs_show_in_the_replies():
    server, _ = new_server(["turn_drops_last_token"])
    reply = server.handle({"op": "generate_returning", "handle": 0, "prompt": [5, 6], "max_new_tokens": 2, "out": 1})
    assert handle_facts(reply, 1)["view"] != fed_view(server, EMPTY, [5, 6] + reply["tokens"][:-1])

    server, _ = new_server(["extract_keeps_working_cache"])
    memory = entry_of(server.handle({"op": "extract", "id": "m", "prompt": [4, 2]}), "m")["view"]
    reply = server.handle({"op": "generate", "handle": 0, "prompt": [1], "max_new_tokens": 1, "stream": False,
                           "read_ids": ["m"]})
    assert entry_of(reply, "m")["view"] != memory

    server, _ = new_server(["stored_turn_stays_writable"])
    server.handle({"op": "generate_returning", "handle": 0, "prompt": [5, 6], "max_new_tokens": 2, "out": 1})
    server.handle({"op": "add_handle", "id": "chat", "handle": 1})
    stored = entry_of(server.handle({"op": "get", "id": "chat", "out": 2}), "chat")["view"]
    reply = server.handle({"op": "generate", "handle": 2, "prompt": [1], "max_new_tokens": 1, "stream": False,
                           "read_ids": ["chat"]})
    assert reply["copies"] == [] and entry_of(reply, "chat")["view"] != stored


# ---- kvcheck over the wire -----------------------------------------------------------


@over_the_wire
def test_the_fixed_store_passes_with_turns_and_extracts_over_the_wire(kvcheck):
    # Every property is checked on every trace a property searches: one
    # property's 40 traces check them all.
    run = kvcheck("run", "--adapter", EXAMPLE, "--property", "generation-equivalent", "--cases", "40", "--stats")
    assert run.status == 0, run.stdout + run.stderr
    assert {p["id"]: p["verdict"] for p in run.applicable()} == {"generation-equivalent": "pass", "engine-error": "pass",
                                                                   "shared-state": "pass"}, run.stdout
    counts = stats_of(run.stderr)
    assert counts["returned_cache_reused"] > 0 and counts["extracted_memory"] > 0, run.stderr


def stats_of(stderr):
    """--stats' counts by shape id ("  extracted_memory   12  a memory ...")."""
    counts = {}
    for line in stderr.splitlines():
        words = line.split()
        if len(words) >= 2 and line.startswith("  ") and words[1].isdigit():
            counts[words[0]] = int(words[1])
    return counts


@over_the_wire
@pytest.mark.parametrize("bug", sorted(activation_memory.RETURNED_BUG_PROPERTIES))
def test_each_bug_of_returned_caches_is_caught_by_its_property(kvcheck, bug):
    prop = activation_memory.RETURNED_BUG_PROPERTIES[bug]
    run = kvcheck("run", "--adapter", f"{EXAMPLE} --bug {bug}", "--property", prop, "--cases", "200", "--failures", "1",
                  "--replays", "0")
    assert run.status == 1, run.stdout + run.stderr
    result = run.result(prop)
    assert result["verdict"] == "fail" and result["fault"] is None, result
    assert result["trace"] and result["reproduce"], result
