"""The example store (python/examples/activation_memory.py): its operations,
dump and load, and the ownership properties, each a check function run on
the fixed store (must pass) and on the historic bug it names (must fail)."""

import glob
import hashlib
import io
import os

import pytest
import torch

import activation_memory as am
from kvcheck_adapter import cache as kv
from kvcheck_adapter import content as c
from kvcheck_adapter import copies
from kvcheck_adapter import decoder as d
from kvcheck_adapter import observe

MEMORY_A = [5, 9, 2, 17]
MEMORY_B = [3, 3, 8]
PROMPT = [7, 3]


def materialized(text):
    return kv.materialize(c.expand(c.parse_cache_spec(text)))


def filled_store(bugs=(), layout="modern", dtype=torch.float32):
    """A store holding "a" and "b": memories the store's decoder wrote."""
    store = am.ActivationMemory(bugs=bugs)
    store.add(
        [
            {"id": "a", "cache": d.memory_cache(store.model, MEMORY_A, layout, dtype), "metadata": {"source": "doc1"}},
            {"id": "b", "cache": d.memory_cache(store.model, MEMORY_B, layout, dtype), "metadata": {}},
        ]
    )
    return store


def stored_views(store):
    return {item.id: c.view_of(item.cache) for item in store.get_all()}


def assert_unchanged(store, views):
    for item_id, view in views.items():
        assert c.view_difference(c.view_of(store.get(item_id).cache), view) == "", f"entry {item_id} changed"


def assert_independent(store, cache):
    for item in store.get_all():
        assert not observe.shares_storage(cache, item.cache), f"shares storage with entry {item.id}"


# ---- the properties, as checks of a store ----------------------------------------------------


def check_stored_immutable(bugs):
    store = filled_store(bugs)
    views = stored_views(store)
    store.generate(store.get("a").cache, PROMPT, 4)
    handle = store.get_cache(["a"])
    assert_independent(store, handle)  # now: the model rebinds what it writes into
    store.generate(handle, PROMPT, 4)
    store.generate(store.get_cache(["a", "b"]), PROMPT, 4)
    for item in store.get_by_ids(["a", "b", "zzz"]) + store.get_all():
        if item is not None:
            store.generate(item.cache, PROMPT, 2)
    assert_unchanged(store, views)


def check_owned_marker(bugs):
    store = filled_store(bugs)
    one, merged = store.get_cache(["a"]), store.get_cache(["a", "b"])
    for handed_out in (one, merged):
        assert kv.is_owned(handed_out), "get_cache handed out a cache without the owned marker"
        assert_independent(store, handed_out)
    store.add([{"id": "c", "cache": one}])
    assert not kv.is_owned(store.get("c").cache), "a stored cache keeps the owned marker"


def check_merge_correct(bugs):
    parts = [c.expand(c.parse_cache_spec(t)) for t in ("modern/f32/1:[kv3 kv~2 KV1]", "legacy/f32/2:[kv2 kv2]")]
    store = am.ActivationMemory(bugs=bugs)
    store.add([{"id": "x", "cache": kv.materialize(parts[0])}, {"id": "y", "cache": kv.materialize(parts[1])}])
    views = stored_views(store)
    merged = store.get_cache(["x", "missing", "y"])
    expected = c.expected_concat(parts)
    assert c.view_difference(c.view_of(merged), c.expected_view(expected)) == ""
    assert merged.get_seq_length() == 3 + 2
    assert all(merged.get_seq_length(i) == c.content_seq_length(expected, i) for i in range(3))
    assert kv.is_owned(merged)
    assert_unchanged(store, views)


def check_clone_independent(bugs):
    store = am.ActivationMemory(bugs=bugs)
    for n, text in enumerate(["modern/bf16/1:[k3 v2 KV1 kvKV2]", "legacy/f16/2:[kv3 kv0 kv1]"]):
        store.add([{"id": str(n), "cache": materialized(text)}])
        views = stored_views(store)
        copy = store.get_cache([str(n)])
        assert c.view_difference(c.view_of(copy), views[str(n)]) == ""
        assert_independent(store, copy)
        copy.update(torch.ones(1, 2, 1, 4, dtype=torch.bfloat16), torch.ones(1, 2, 1, 4, dtype=torch.bfloat16), 0)
        assert_unchanged(store, views)


def check_single_copy(bugs):
    store = filled_store(bugs, "legacy", torch.bfloat16)
    tracker = copies.CopyTracker()
    for item in store.get_all():
        tracker.track(item.cache)
    for ids in (["a"], ["a", "b"]):
        with tracker.record() as getting:
            handle = store.get_cache(ids)
        with tracker.record() as generating:
            store.generate(handle, PROMPT, 3)
        assert len(getting.copies) + len(generating.copies) == 1, f"get_cache({ids}) + generate copied more than once"
        assert generating.peak_sets_on_path <= 2, "three K/V sets alive during a generation"
    with tracker.record() as direct:
        store.generate(store.get("a").cache, PROMPT, 3)
    assert len(direct.copies) == 1, "generate(stored cache) must copy it exactly once"
    assert direct.peak_sets_on_path == 2


def check_generation_equivalent(bugs):
    store = filled_store(bugs)
    fresh = kv.clone(store.get("a").cache)
    via_store = store.generate(store.get("a").cache, PROMPT, 6)
    assert via_store == d.generate(store.model, PROMPT, fresh, 6)
    assert via_store == d.generate_without_cache(store.model, MEMORY_A + PROMPT, 6)
    # Each part's K/V were written with no past, so a merge is no
    # recomputation of both memories: it is the concatenation of the parts.
    merged = store.generate(store.get_cache(["a", "b"]), PROMPT, 6)
    assert merged == d.generate(store.model, PROMPT, kv.concat([store.get("a").cache, store.get("b").cache]), 6)
    unmerged = d.generate(store.model, PROMPT, kv.DynamicCache(), 6)
    assert merged != unmerged, "the merged memory was ignored"


CHECKS = {
    "stored-immutable": check_stored_immutable,
    "owned-marker": check_owned_marker,
    "merge-correct": check_merge_correct,
    "clone-independent": check_clone_independent,
    "single-copy": check_single_copy,
    "generation-equivalent": check_generation_equivalent,
}

# The property each historic bug must break (it may break others too).
CAUGHT_BY = {
    "stored_to_generation": ["stored-immutable", "single-copy"],
    "single_id_returns_stored": ["owned-marker", "stored-immutable"],
    "merge_uninitialized": ["merge-correct", "generation-equivalent"],
    "shallow_clone": ["clone-independent", "stored-immutable"],
    "double_copy": ["single-copy"],
}


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_the_fixed_store_keeps_every_property(name):
    CHECKS[name](())


@pytest.mark.parametrize("bug, name", [(bug, name) for bug, names in CAUGHT_BY.items() for name in names])
def test_each_bug_is_caught_by_its_property(bug, name):
    with pytest.raises(AssertionError):
        CHECKS[name]((bug,))


def test_every_bug_is_named_and_unknown_ones_are_refused():
    # The bugs of returned caches are caught through kvcheck (adapter_tests/test_returned_caches.py),
    # and so are the bounded store's eviction bug (adapter_tests/test_example.py: eviction-as-declared)
    # and the dump format's (test_example.py: dump-safe); the index without its lock is lost only with
    # two requests in flight (adapter_tests/test_threads.py).
    assert sorted(list(CAUGHT_BY) + list(am.RETURNED_BUG_PROPERTIES) + ["evicts_most_recent"] +
                  list(am.DUMP_BUG_PROPERTIES) + list(am.THREAD_BUG_PROPERTIES)) == sorted(am.BUGS)
    with pytest.raises(ValueError, match="unknown bug"):
        am.ActivationMemory(bugs=["no_such_bug"])


# ---- the operations ----------------------------------------------------------------------------


def test_items_keep_insertion_order_overwrites_keep_their_place_readds_go_last():
    store = am.ActivationMemory()
    for item_id in "abc":
        store.add([{"id": item_id, "cache": materialized("modern/f32/1:[kv1]")}])
    replacement = materialized("legacy/f16/2:[kv2]")
    store.add([am.MemoryItem("b", replacement, {"k": "v"})])
    assert [item.id for item in store.get_all()] == ["a", "b", "c"]
    assert store.get("b").cache is replacement and store.get("b").metadata == {"k": "v"}
    assert not kv.is_owned(replacement)
    store.delete(["a", "zzz"])
    store.add([{"id": "a", "cache": materialized("modern/f32/3:[kv1]")}])
    assert [item.id for item in store.get_all()] == ["b", "c", "a"]
    assert [None if item is None else item.id for item in store.get_by_ids(["c", "x", "c"])] == ["c", None, "c"]
    store.delete_all()
    assert store.get_all() == [] and store.get("a") is None


def test_get_cache_keeps_ids_holding_tokens_and_gives_none_when_none_is_left():
    store = am.ActivationMemory()
    store.add([{"id": "empty", "cache": materialized("modern/f32/1:[kv0 kv~3]")}, {"id": "full", "cache": materialized("modern/f32/2:[kv2]")}])
    assert store.get_cache(["empty", "missing"]) is None
    assert store.get_cache([]) is None
    one = store.get_cache(["empty", "full"])
    assert isinstance(one, kv.DynamicCache) and one.get_seq_length() == 2  # one part left: a clone
    twice = store.get_cache(["full", "full"])
    assert twice.get_seq_length() == 4  # repeats are kept


def test_bad_items_are_refused_and_nothing_is_stored():
    store = am.ActivationMemory()
    with pytest.raises(ValueError, match="item 'b' has no cache"):
        store.add([{"id": "a", "cache": materialized("modern/f32/1:[kv1]")}, {"id": "b", "cache": None}])
    with pytest.raises(TypeError, match="is not a KV cache"):
        store.add([{"id": "a", "cache": "not a cache"}])
    with pytest.raises(TypeError, match="item 'm' metadata 'n': 3 is not a string pair"):
        store.add([{"id": "m", "cache": materialized("modern/f32/1:[kv1]"), "metadata": {"n": 3}}])
    assert store.get_all() == []


def test_reads_hand_out_the_stored_cache_and_a_copy_of_the_metadata():
    store = am.ActivationMemory()
    cache = materialized("modern/f32/1:[kv1]")
    store.add([{"id": "a", "cache": cache, "metadata": {"k": "v"}}])
    item = store.get("a")
    assert item.cache is cache
    item.metadata["k"] = "changed"
    assert store.get("a").metadata == {"k": "v"}


def test_generate_without_a_cache_and_bad_arguments():
    store = am.ActivationMemory()
    assert store.generate(None, PROMPT, 5) == d.generate_without_cache(store.model, PROMPT, 5)
    with pytest.raises(ValueError, match="the prompt is empty"):
        store.generate(None, [], 5)
    with pytest.raises(ValueError, match="max_new_tokens < 0"):
        store.generate(None, PROMPT, -1)


# ---- dump and load -------------------------------------------------------------------------------

DUMP_SPECS = [
    "modern/bf16/1:[kv3 k~2 KV4 -0]",
    "modern/f16/2:[kv~0 kvKV1]",
    "legacy/f32/3:[kv2 kv0 kv5]",
    "legacy/bf16/4:[]",
    "modern/f32/5:[]",
]


def dumped_store(directory):
    store = am.ActivationMemory()
    store.add([{"id": f"item{n}", "cache": materialized(text), "metadata": {"n": str(n), "spec": text}} for n, text in enumerate(DUMP_SPECS)])
    store.dump(directory)
    return store


def snapshot(store):
    return [(item.id, item.metadata, c.view_of(item.cache)) for item in store.get_all()]


def test_dump_and_load_round_trip_bit_exactly(scratch_dir):
    store = dumped_store(scratch_dir)
    loaded = am.ActivationMemory()
    loaded.add([{"id": "stale", "cache": materialized("modern/f32/9:[kv1]")}])
    loaded.load(scratch_dir)
    assert snapshot(loaded) == snapshot(store)  # views compare dtype, shape, hash, flags, layout
    for item in loaded.get_all():
        assert not kv.is_owned(item.cache)
    assert os.listdir(scratch_dir) == [am.DUMP_FILE_NAME]


def test_a_dump_is_fsynced_then_renamed_then_its_directory_fsynced(scratch_dir, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))), real_fsync(fd)))
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", os.path.basename(b))), real_replace(a, b)))
    dumped_store(scratch_dir)
    temporary = [name for kind, name in events if kind == "fsync"][0]
    assert temporary.startswith(am.DUMP_FILE_NAME + ".tmp-")
    assert events == [("fsync", temporary), ("replace", am.DUMP_FILE_NAME), ("fsync", os.path.basename(scratch_dir))]


def test_a_dump_that_fails_midway_leaves_the_previous_dump_and_no_temporary(scratch_dir, monkeypatch):
    store = dumped_store(scratch_dir)
    before = snapshot(store)
    store.add([{"id": "new", "cache": materialized("modern/f32/8:[kv2]")}])

    def failing_save(payload, file):
        file.write(b"PK\x03\x04 half a dump")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        store.dump(scratch_dir)
    monkeypatch.undo()
    assert os.listdir(scratch_dir) == [am.DUMP_FILE_NAME]
    reader = am.ActivationMemory()
    reader.load(scratch_dir)
    assert snapshot(reader) == before


def _gone_pid():
    with open("/proc/sys/kernel/pid_max") as file:
        return int(file.read()) + 1  # above the largest process id: no process has it


@pytest.mark.parametrize("dump_first", [False, True])
def test_a_temporary_left_by_a_killed_dump_is_removed_by_the_next_load_or_dump(scratch_dir, dump_first):
    dumped_store(scratch_dir)
    stale = os.path.join(scratch_dir, f"{am.DUMP_FILE_NAME}.tmp-{_gone_pid()}")
    own = os.path.join(scratch_dir, f"{am.DUMP_FILE_NAME}.tmp-{os.getpid()}")  # this process's interrupted dump
    running = os.path.join(scratch_dir, f"{am.DUMP_FILE_NAME}.tmp-1")  # a dump in progress in a live process
    for path in (stale, own, running):
        with open(path, "wb") as file:
            file.write(b"PK\x03\x04")
    if dump_first:
        am.ActivationMemory().dump(scratch_dir)
    else:
        am.ActivationMemory().load(scratch_dir)
    assert not os.path.exists(stale) and not os.path.exists(own)
    assert os.path.exists(running)


def _framed(path, payload):
    """Writes `payload` as a dump file with a correct header (what a writer
    of another format, or a buggy one, could have written)."""
    archive = io.BytesIO()
    torch.save(payload, archive)
    data = archive.getvalue()
    with open(path, "wb") as file:
        file.write(am.DUMP_MAGIC + len(data).to_bytes(8, "big") + hashlib.sha256(data).digest() + data)


def _flip_tensor_byte(path):
    """One byte of tensor data changed: torch.load alone would load other
    values (it does not check the archive's CRCs)."""
    with open(path, "r+b") as file:
        data = file.read()
        at = data.index(b"/data/0") + 200  # inside the first tensor's record, past its local header
        file.seek(at)
        file.write(bytes([data[at] ^ 0x10]))


def _corrupt_header(path):
    with open(path, "r+b") as file:
        file.seek(len(am.DUMP_MAGIC) + 12)
        file.write(b"\xff" * 8)


def _truncate(path):
    with open(path, "r+b") as file:
        file.truncate(os.path.getsize(path) // 2)


def _truncate_header(path):
    with open(path, "r+b") as file:
        file.truncate(len(am.DUMP_MAGIC) + 3)


def _append(path):
    with open(path, "ab") as file:
        file.write(b"\0")


def _unframed(path):
    torch.save((am.DUMP_TAG, am.DUMP_VERSION, ()), path)


def _foreign(path):
    _framed(path, ("something else", 1, ()))


def _newer(path):
    _framed(path, (am.DUMP_TAG, am.DUMP_VERSION + 1, ()))


def _bad_slot(path):
    _framed(path, (am.DUMP_TAG, am.DUMP_VERSION, (("x", (), ("modern", ((True, torch.zeros(2, dtype=torch.int64), None, None, None),))),)))


@pytest.mark.parametrize(
    "damage, message",
    [
        (os.remove, "does not exist"),
        (_flip_tensor_byte, "SHA-256 differs"),
        (_corrupt_header, "SHA-256 differs"),
        (_truncate, "truncated: .* bytes of payload, the header says"),
        (_truncate_header, "truncated: .* shorter than the header"),
        (_append, "1 bytes after the payload"),
        (_unframed, "does not start with"),
        (_foreign, "tag 'something else'"),
        (_newer, f"version {am.DUMP_VERSION + 1}, expected {am.DUMP_VERSION}"),
        (_bad_slot, "item 'x' layer 0 keys has dtype torch.int64"),
    ],
)
def test_a_bad_dump_is_refused_and_the_store_is_unchanged(scratch_dir, damage, message):
    dumped_store(scratch_dir)
    damage(os.path.join(scratch_dir, am.DUMP_FILE_NAME))
    store = am.ActivationMemory()
    store.add([{"id": "kept", "cache": materialized("modern/f32/9:[kv1]"), "metadata": {"a": "b"}}])
    before = snapshot(store)
    with pytest.raises(am.DumpError, match=message) as error:
        store.load(scratch_dir)
    assert am.DUMP_FILE_NAME in str(error.value)
    assert snapshot(store) == before


def test_load_of_a_missing_directory_names_the_file():
    with pytest.raises(am.DumpError, match="does not exist"):
        am.ActivationMemory().load(os.path.join("/nonexistent", "kvcheck-sdk-test"))
    assert not glob.glob("/nonexistent*")


def test_a_torch_without_a_safe_loader_refuses_to_load_and_keeps_the_store(scratch_dir, monkeypatch):
    dumped_store(scratch_dir)
    store = am.ActivationMemory()
    store.add([{"id": "kept", "cache": materialized("modern/f32/9:[kv1]")}])
    before = snapshot(store)
    monkeypatch.setattr(am, "_SAFE_LOAD", False)  # as on a torch whose load has no weights_only
    with pytest.raises(am.DumpError, match="has no safe loader"):
        store.load(scratch_dir)
    assert snapshot(store) == before
