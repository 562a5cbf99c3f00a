"""The paged requests of the protocol (docs/protocol.md section 11) on the
SDK's side, without kvcheck: kvcheck_adapter.paged.BlockManagerAdapter over
the example block manager, driven request by request. Cheap: no kvcheck
run, one decoder."""

import pytest

import block_manager
import block_manager_adapter as bma
from kvcheck_adapter import content, protocol, wire
from kvcheck_adapter.adapter import RequestError, Server
from kvcheck_adapter.paged import BlockKey, parent_number


def served(bugs=()):
    server = Server(lambda: bma.BlockManagerExample(bugs))
    hello = server.handle({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})
    return server, hello


def state_of(server):
    return server.handle({"op": "paged_state"})["state"]


def table(state, seq):
    return next(t for t in state["tables"] if t["seq"] == seq)


def test_the_handshake_says_paged_and_no_store():
    _, hello = served()
    assert hello["capabilities"]["paged"] is True
    assert hello["capabilities"]["store"] is False


def test_the_handshake_declares_the_free_order_the_manager_declares():
    _, hello = served()
    assert hello["capabilities"]["paged_free_order"] == "back"
    lifo = Server(lambda: bma.BlockManagerExample((), "lifo")).handle({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})
    assert lifo["capabilities"]["paged_free_order"] == "front"

    class Undeclared(bma.BlockManagerExample):
        def __init__(self):
            super().__init__()
            self.free_order = None

    undeclared = Server(Undeclared).handle({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})
    assert "paged_free_order" not in undeclared["capabilities"]  # kvcheck reads it unspecified


def test_a_lifo_free_list_puts_freed_blocks_at_the_front():
    server = Server(lambda: bma.BlockManagerExample((), "lifo"))
    server.handle({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})
    server.handle({"op": "paged_alloc", "seq": 1, "tokens": [5, 9, 2], "salt": 0})
    freed = server.handle({"op": "paged_free", "seq": 1})["state"]
    assert freed["free_queue"][:2] == [1, 2]  # released the last block first: block 1 joined the front last


def test_an_alloc_hits_what_a_step_published_and_reports_the_state():
    server, _ = served()
    first = server.handle({"op": "paged_alloc", "seq": 1, "tokens": [5, 9, 2], "salt": 0})
    assert first["ok"] and first["cached"] == 0
    assert table(first["state"], 1) == {"seq": 1, "blocks": [1, 2], "tokens": [5, 9, 2]}
    # Written at the step, not before: nothing is published yet.
    assert first["state"]["blocks"][1]["written"] == 0 and first["state"]["index"] == []
    stepped = server.handle({"op": "paged_step"})["state"]
    assert stepped["blocks"][1]["written"] == 2
    assert stepped["index"] == [{"key": {"parent": 0, "tokens": [5, 9], "extra": ""}, "blocks": [1]}]
    assert server.handle({"op": "paged_lookup", "tokens": [5, 9, 7], "salt": 0})["cached"] == 2
    assert server.handle({"op": "paged_lookup", "tokens": [5, 9, 7], "salt": 3})["cached"] == 0  # another extra key
    second = server.handle({"op": "paged_alloc", "seq": 2, "tokens": [5, 9, 7], "salt": 0})
    assert second["cached"] == 2 and table(second["state"], 2)["blocks"][0] == 1
    assert second["state"]["blocks"][1]["count"] == 2


def test_views_are_the_models_and_an_export_shares_no_pool_storage():
    server, _ = served()
    server.handle({"op": "paged_alloc", "seq": 1, "tokens": [5, 9, 2], "salt": 0})
    appended = server.handle({"op": "paged_append", "seq": 1, "count": 3})
    tokens = [5, 9, 2] + appended["tokens"]
    assert table(appended["state"], 1)["tokens"] == tokens
    fresh = server.handle({"op": "paged_fresh_view", "tokens": tokens, "first": 0, "count": len(tokens)})["view"]
    assert server.handle({"op": "paged_sequence_view", "seq": 1})["view"] == fresh
    exported = server.handle({"op": "paged_export", "seq": 1})
    assert exported["view"] == fresh
    pool = set(server.handle({"op": "paged_pool_storage"})["storage"])
    assert pool and pool.isdisjoint(exported["storage"])
    block = server.handle({"op": "paged_block_view", "block": 1, "slots": 2})["view"]
    assert block == server.handle({"op": "paged_fresh_view", "tokens": tokens, "first": 0, "count": 2})["view"]
    # The state's digests are those of the blocks' views, after every change.
    for stepped in (False, True):
        if stepped:
            server.handle({"op": "paged_step"})
        state = state_of(server)
        for b in (1, 2, 3):
            view = server.handle({"op": "paged_block_view", "block": b, "slots": 2})["view"]
            assert state["blocks"][b]["digest"] == content.view_digest(wire.view_from_json(view))


def test_extra_keys_change_the_kv_of_a_sequence_and_of_the_fresh_view():
    server, _ = served()
    server.handle({"op": "paged_alloc", "seq": 1, "tokens": [5, 9, 2], "salt": 0})
    server.handle({"op": "paged_alloc", "seq": 2, "tokens": [5, 9, 2], "salt": 1})
    server.handle({"op": "paged_append", "seq": 2, "count": 2})
    tokens = table(state_of(server), 2)["tokens"]
    salted = server.handle({"op": "paged_fresh_view", "tokens": tokens, "salt": 1, "first": 0, "count": len(tokens)})["view"]
    plain = server.handle({"op": "paged_fresh_view", "tokens": tokens, "salt": 0, "first": 0, "count": len(tokens)})["view"]
    assert server.handle({"op": "paged_sequence_view", "seq": 2})["view"] == salted
    assert salted != plain
    assert server.handle({"op": "paged_export", "seq": 2})["view"] == salted
    # The blocks the two salts computed for [5, 9] hold other K/V.
    blocks = [table(state_of(server), seq)["blocks"][0] for seq in (1, 2)]
    views = [server.handle({"op": "paged_block_view", "block": b, "slots": 2})["view"] for b in blocks]
    assert views[0] != views[1]


def test_a_write_into_a_shared_block_is_copied_and_the_copy_holds_its_source():
    server, _ = served()
    server.handle({"op": "paged_alloc", "seq": 1, "tokens": [5, 9, 2], "salt": 0})
    server.handle({"op": "paged_fork", "parent": 1, "child": 2})
    appended = server.handle({"op": "paged_append", "seq": 2, "count": 1})["state"]
    assert table(appended, 1)["blocks"] == [1, 2]
    copy_block = table(appended, 2)["blocks"][1]
    assert copy_block not in (1, 2)
    assert appended["copies"] == [{"source": 2, "destination": copy_block}]
    assert appended["blocks"][2]["count"] == 2  # seq 1's table and the pending copy
    assert appended["blocks"][copy_block]["tokens"] == [2] + [table(appended, 2)["tokens"][-1]]
    stepped = server.handle({"op": "paged_step"})["state"]
    assert stepped["copies"] == [] and stepped["blocks"][2]["count"] == 1


def test_a_rewind_cuts_the_last_block_drops_its_key_and_the_chosen_token_follows():
    server, hello = served()
    assert hello["capabilities"]["paged_rewind"] is True  # the example manager has a rewind
    server.handle({"op": "paged_alloc", "seq": 1, "tokens": [5, 9, 2, 7, 1], "salt": 0})
    server.handle({"op": "paged_step"})
    rewound = server.handle({"op": "paged_rewind", "seq": 1, "count": 2, "token": 3})["state"]
    assert table(rewound, 1) == {"seq": 1, "blocks": [1, 2], "tokens": [5, 9, 2]}
    assert rewound["blocks"][2]["tokens"] == [2] and rewound["blocks"][2].get("key") is None
    assert rewound["index"] == [{"key": {"parent": 0, "tokens": [5, 9], "extra": ""}, "blocks": [1]}]
    assert server.handle({"op": "paged_append", "seq": 1, "count": 1})["tokens"] == [3]
    tokens = [5, 9, 2, 3]
    fresh = server.handle({"op": "paged_fresh_view", "tokens": tokens, "first": 0, "count": 4})["view"]
    assert server.handle({"op": "paged_sequence_view", "seq": 1})["view"] == fresh
    # A shared last block is copied, as an append copies it.
    server.handle({"op": "paged_fork", "parent": 1, "child": 2})
    forked = server.handle({"op": "paged_rewind", "seq": 2, "count": 1, "token": 1})["state"]
    copy_block = table(forked, 2)["blocks"][1]
    assert copy_block != 2 and forked["copies"] == [{"source": 2, "destination": copy_block}]
    assert forked["blocks"][copy_block]["tokens"] == [2] and forked["blocks"][2]["tokens"] == [2, 3]


def test_a_manager_without_a_rewind_does_not_claim_it():
    class NoRewind(bma.BlockManagerExample):
        rewind = bma.BlockManagerAdapter.rewind

    server = Server(lambda: NoRewind())
    hello = server.handle({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})
    assert "paged_rewind" not in hello["capabilities"]


def test_a_refusal_is_an_error_and_changes_nothing():
    server, _ = served()
    before = state_of(server)
    with pytest.raises(block_manager.OutOfBlocks):
        server.handle({"op": "paged_alloc", "seq": 1, "tokens": list(range(20)), "salt": 0})
    assert state_of(server) == before


def test_an_import_is_exported_as_it_came():
    server, _ = served()
    cache = {"layout": "modern", "dtype": "f32", "heads": 2, "head_dim": 4,
             "layers": [{"initialized": True, "slots": [[[7, 3, "f32"]], [[8, 3, "f32"]], None, None]},
                        {"initialized": True, "slots": [[[9, 3, "f32"]], [[10, 3, "f32"]], None, None]}]}
    imported = server.handle({"op": "paged_import", "seq": 4, "cache": cache})["state"]
    assert table(imported, 4)["tokens"] == [-1, -1, -1] and imported["index"] == []
    expected = wire.view_json(wire.materialize(wire.content_from_json(cache)))
    assert server.handle({"op": "paged_export", "seq": 4})["view"] == expected


def test_bad_requests_are_named():
    server, _ = served()
    with pytest.raises(RequestError, match="unknown request 'paged_nothing'"):
        server.handle({"op": "paged_nothing"})
    with pytest.raises(RequestError, match="'seq'"):
        server.handle({"op": "paged_free"})


def test_keys_parents_are_opaque_64_bit_numbers():
    assert parent_number(None) == 0 and parent_number(-1) == (1 << 64) - 1
    assert parent_number(b"abc") == parent_number(b"abc") != parent_number(b"abd")
    assert parent_number(("x", 1)) == parent_number(("x", 1))
    assert BlockKey(3, [1, 2]).tokens == (1, 2)
