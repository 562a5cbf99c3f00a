"""copies.py: K/V copies and sets counted by a dispatch mode: clone, concat,
a double copy, zero copies; conversions; the model's own K/V not counted;
the path of a generation. Planted: a model whose forwards are not marked
(its read-back would count as copies), a double copy at the boundary."""

import copy

import pytest
import torch

from activation_memory import ActivationMemory
from kvcheck_adapter import cache as kv
from kvcheck_adapter import content as c
from kvcheck_adapter import copies
from kvcheck_adapter import decoder as d

MODEL = d.Decoder(d.DecoderConfig(eos_token=-1))  # never stops early: a known number of forwards


def materialized(text):
    return kv.materialize(c.expand(c.parse_cache_spec(text)))


@pytest.fixture
def tracker():
    return copies.CopyTracker()


def stored(tracker, text="modern/bf16/1:[kv3 kv3]"):
    cache = materialized(text)
    set_id = tracker.track(cache)
    return cache, set_id


def test_a_clone_is_one_copy_of_its_bytes(tracker):
    source, source_set = stored(tracker, "modern/f16/1:[kv3 k2 -0 KV1]")
    with tracker.record() as recording:
        copy_ = kv.clone(source)
    assert len(recording.copies) == 1
    event = recording.copies[0]
    assert event.sources == (source_set,)
    assert (event.tensors, event.bytes) == kv.footprint(copy_)
    assert {t.op for t in recording.tensor_copies} == {"clone"}
    assert tracker.set_id(copy_.layers[0].keys) == event.set_id
    assert tracker.sets_on_path(copy_) == 2


def test_a_merge_is_one_copy_of_both_parts(tracker):
    a, a_set = stored(tracker, "modern/f32/1:[kv3 kv3]")
    b, b_set = stored(tracker, "legacy/f32/2:[kv2 kv2 kv2]")
    with tracker.record() as recording:
        merged = kv.concat([a, b])
    assert len(recording.copies) == 1
    assert set(recording.copies[0].sources) == {a_set, b_set}
    assert recording.bytes_copied == kv.footprint(merged)[1]
    assert tracker.sets_on_path(merged) == 2


def test_a_double_copy_is_two_copies_and_three_sets(tracker):
    source, _ = stored(tracker)
    with tracker.record() as recording:
        first = kv.clone(source)
        second = kv.clone(first)
    assert len(recording.copies) == 2
    assert recording.copies[1].sources == (recording.copies[0].set_id,)
    assert tracker.sets_on_path(second) == 3
    del first
    assert tracker.sets_on_path(second) == 2  # the middle set is gone; the chain still reaches the stored one
    del source
    assert tracker.sets_on_path(second) == 1


def test_empty_slots_are_no_copies(tracker):
    source, _ = stored(tracker, "modern/f32/1:[kv0 k2]")
    with tracker.record() as recording:
        kv.clone(source)
    assert (recording.copies[0].tensors, recording.copies[0].bytes) == (1, 2 * 2 * 4 * 4)


def test_two_clones_of_one_source_are_two_sets(tracker):
    source, source_set = stored(tracker)
    with tracker.record() as recording:
        kv.clone(source)
        kv.clone(source)
    assert [event.sources for event in recording.copies] == [(source_set,), (source_set,)]


def in_arena(cache):
    """The cache with every tensor moved into one shared storage (an arena,
    as a load that packs its tensors does): each slot a view of it."""
    slots = [(layer, name) for layer in cache.layers for name in ("keys", "values")]
    tensors = [getattr(layer, name) for layer, name in slots]
    arena = torch.empty(sum(t.numel() for t in tensors), dtype=tensors[0].dtype)
    at = 0
    for (layer, name), tensor in zip(slots, tensors):
        view = arena[at:at + tensor.numel()].view(tensor.shape)
        view.copy_(tensor)
        setattr(layer, name, view)
        at += tensor.numel()
    return cache


def test_a_clone_of_tensors_sharing_an_arena_is_one_copy(tracker):
    # Copies are counted by what was written: the arena is not copied once
    # per tensor it holds (issue 33: "made 2 copies" of one get_cache).
    source = in_arena(materialized("modern/f32/2:[kv3 kv3]"))
    assert len({copies._untyped_storage(t).data_ptr() for t in copies._cache_tensors(source)}) == 1
    source_set = tracker.track(source)
    with tracker.record() as recording:
        copy_ = kv.clone(source)
    assert len(recording.copies) == 1
    assert recording.copies[0].sources == (source_set,)
    assert recording.bytes_copied == kv.footprint(copy_)[1]
    assert len(recording.tensor_copies) == 4


def test_no_copy_is_zero_copies(tracker):
    source, _ = stored(tracker)
    with tracker.record() as recording:
        kv.to_legacy(source)  # aliases
        kv.holds_tokens(source)
        source.layers[0].keys[:, :, 1:]  # a view
    assert recording.copies == [] and recording.tensor_copies == []


@pytest.mark.parametrize(
    "make_copy, op",
    [
        (lambda cache: copy.deepcopy(cache), "copy_"),
        (lambda cache: [layer.keys.to(torch.float32) for layer in cache.layers], "_to_copy"),
        (lambda cache: [torch.empty_like(layer.keys).copy_(layer.keys) for layer in cache.layers], "copy_"),
        (lambda cache: [layer.keys.index_select(2, torch.tensor([0, 2])) for layer in cache.layers], "index_select"),
        (lambda cache: kv.from_legacy(kv.to_legacy(cache)), "clone"),
    ],
)
def test_other_copies_count(tracker, make_copy, op):
    source, _ = stored(tracker)
    with tracker.record() as recording:
        made = make_copy(source)  # noqa: F841  (kept alive for the record)
    assert len(recording.copies) == 1
    assert {t.op for t in recording.tensor_copies} == {op}


def test_an_indexed_write_into_a_buffer_counts_the_rows_written(tracker):
    # As a StaticCache's update fills a preallocated buffer: 3 tokens of
    # keys written into a buffer of 64 copy 3 tokens' bytes, not 64's.
    source, _ = stored(tracker, "modern/f32/1:[kv3 kv3]")
    keys = source.layers[0].keys
    buffer = torch.zeros(keys.shape[0], keys.shape[1], 64, keys.shape[3])
    with tracker.record() as recording:
        buffer.index_copy_(2, torch.arange(3), keys)
    assert [t.op for t in recording.tensor_copies] == ["index_copy_"]
    assert recording.bytes_copied == keys.numel() * keys.element_size()


def test_a_part_repeated_into_other_rows_of_a_buffer_is_one_copy(tracker):
    # A StaticCache merge of [a, a]: a's keys written twice, into rows 0-2
    # then 3-5 of one buffer, is one merge; written into two buffers, or
    # into the same rows again, it is a copy made twice.
    source, _ = stored(tracker, "modern/f32/1:[kv3 kv3]")
    keys = source.layers[0].keys
    buffers = [torch.zeros(keys.shape[0], keys.shape[1], 64, keys.shape[3]) for _ in range(2)]
    with tracker.record() as recording:
        buffers[0].index_copy_(2, torch.arange(3), keys)
        buffers[0].index_copy_(2, torch.arange(3, 6), keys)
    assert len(recording.copies) == 1
    for second, rows in ((buffers[1], torch.arange(3)), (buffers[0], torch.arange(3))):
        with tracker.record() as recording:
            buffers[0].index_copy_(2, torch.arange(3), keys)
            second.index_copy_(2, rows, keys)
        assert len(recording.copies) == 2


def test_copies_of_untracked_tensors_and_arithmetic_do_not_count(tracker):
    source, _ = stored(tracker)
    untracked = materialized("modern/f32/9:[kv2]")
    with tracker.record() as recording:
        kv.clone(untracked)
        source.layers[0].keys * 2
    assert recording.copies == []


def check_generation_copies(tracker, model, dtype="bf16"):
    """generate on an owned copy: no copy, two sets on the path."""
    source, _ = stored(tracker, f"modern/{dtype}/1:[kv3 kv3]")
    with tracker.record():
        owned = kv.clone(source)
    with tracker.record() as recording:
        d.generate(model, [7, 3], owned, 4)
    assert recording.copies == [], "the model's own K/V counted as copies"
    assert recording.peak_sets_on_path == 2
    assert recording.model_forwards == 4


def test_the_models_appends_and_read_backs_are_no_copies(tracker):
    check_generation_copies(tracker, MODEL)


def test_the_generation_check_catches_unmarked_model_forwards(tracker, monkeypatch):
    monkeypatch.setattr(copies, "model_forward", lambda cache: copies._NO_MODEL)
    with pytest.raises(AssertionError):
        check_generation_copies(tracker, MODEL)


def test_appends_continue_the_set_they_extend(tracker):
    source, source_set = stored(tracker)
    with tracker.record():
        owned = kv.clone(source)
    owned_set = tracker.set_id(owned.layers[0].keys)
    with tracker.record():
        d.generate(MODEL, [7, 3], owned, 2)
    assert tracker.set_id(owned.layers[0].keys) == owned_set
    assert tracker.set_id(source.layers[0].keys) == source_set


def check_store_generation(bugs, expected):
    """Through the store: copies by get_cache, copies by generate, peak sets."""
    tracker = copies.CopyTracker()
    store = ActivationMemory(bugs=bugs)
    cache = materialized("legacy/f16/1:[kv3 kv3]")
    store.add([{"id": "a", "cache": cache}])
    tracker.track(cache)
    with tracker.record() as getting:
        handle = store.get_cache(["a"])
    with tracker.record() as generating:
        store.generate(handle, [7, 3], 3)
    with tracker.record() as direct:
        store.generate(store.get("a").cache, [7, 3], 3)
    counted = (len(getting.copies), len(generating.copies), generating.peak_sets_on_path,
               len(direct.copies), direct.peak_sets_on_path)
    assert counted == expected


def test_the_store_copies_once_per_generation():
    check_store_generation((), (1, 0, 2, 1, 2))


@pytest.mark.parametrize(
    "bug, counted",
    [("double_copy", (1, 1, 3, 1, 2)), ("stored_to_generation", (1, 0, 2, 0, 1))],
)
def test_the_store_check_catches_planted_boundaries(bug, counted):
    with pytest.raises(AssertionError):
        check_store_generation((bug,), (1, 0, 2, 1, 2))
    check_store_generation((bug,), counted)


def test_one_recording_at_a_time(tracker):
    with tracker.record():
        with pytest.raises(RuntimeError, match="already recording"):
            with copies.CopyTracker().record():
                pass


def test_model_forward_is_free_outside_a_recording():
    assert copies.model_forward(kv.DynamicCache()) is copies._NO_MODEL


def test_tracking_keeps_nothing_alive(tracker):
    source, _ = stored(tracker)
    with tracker.record():
        clone = kv.clone(source)
    storage = clone.layers[0].keys.untyped_storage() if hasattr(torch.Tensor, "untyped_storage") else clone.layers[0].keys.storage()._storage
    reference = copies.StorageWeakRef(storage)
    del storage, clone
    assert reference.expired()


def test_the_dispatch_mode_is_not_wrapped_by_dynamo():
    # torch 2.x wraps a TorchDispatchMode's __torch_dispatch__ in
    # torch._dynamo.disable unless the mode opts out: its first operator
    # then imported torch._dynamo (1.5 s of CPU) in every adapter process.
    hook = copies._CopyMode.__dict__["__torch_dispatch__"]
    assert not hasattr(hook, "__wrapped__"), hook
    assert hook.__qualname__ == "_CopyMode.__torch_dispatch__"
