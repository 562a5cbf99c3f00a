"""kvcheck on the example Python store, through the process boundary, as a
user runs it: the fixed store passes, each historic bug is caught by the
property that names it, a failure comes with its trace and replays, an
exception comes with its Python traceback."""

import json
import os
import subprocess

import pytest

from conftest import ADAPTER_PYTHON, BUG_PROPERTIES as BUGS, EXAMPLE, HERE, Run, bug_searches, kvcheck_binary


def test_the_fixed_store_holds_every_property(kvcheck):
    run = kvcheck("run", "--adapter", EXAMPLE, "--cases", "60", "--jobs", "2")
    assert run.status == 0, run.stdout + run.stderr
    verdicts = {p["id"]: p["verdict"] for p in run.applicable()}
    assert verdicts.pop("trim-exact") == "skipped", verdicts  # the store has no Adapter.trim: nothing is trimmed
    assert verdicts.pop("batch-exact") == "skipped", verdicts  # nor Adapter.batch: nothing is batched
    assert verdicts.pop("lease-respected") == "skipped", verdicts  # nor lease_ttl_ms: nothing is leased
    assert set(verdicts.values()) == {"pass"}, verdicts
    # Issue 28: the dumps of an adapter process are killed and cut by power
    # failures too (dump_fork, docs/durability.md): every check applied.
    not_applied = {p["id"]: p["not_applied"] for p in run.report["properties"] if p["not_applied"]}
    assert not_applied == {}, not_applied
    assert run.report["adapter"] == "activation-memory"
    assert run.report["source"] == f"exec:{ADAPTER_PYTHON} {EXAMPLE}"


@pytest.fixture(scope="module")
def bug_search(kvcheck_module):
    """Each bug's search (its property, 400 traces, up to its first
    failure), run once for the module: the tests that read a search's
    result share it (CI time), those of one property in one run
    (bug_searches)."""
    return bug_searches(kvcheck_module, EXAMPLE, BUGS, "--cases", "400", "--failures", "1")


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_each_bug_is_caught_by_the_property_that_names_it(bug_search, bug):
    prop = BUGS[bug]
    run = bug_search(bug)
    assert run.status == 1, run.stdout + run.stderr
    result = run.result(prop)
    assert result["verdict"] == "fail" and result["fault"] is None, result
    assert result["trace"] and result["reproduce"]
    assert result["message"], result


def test_a_bounded_store_is_judged_by_what_it_declares(kvcheck):
    """docs/semantics.md, "Declared store contracts": the example store
    bounded at 4 items (lru, declared) evicts without a violation; with
    the bug that evicts the most recently used item, eviction-as-declared
    fails over the wire, naming what it evicted and what was due."""
    bounded = f"{EXAMPLE} --capacity 4"
    checked = ["--property", "eviction-as-declared", "--property", "stored-immutable", "--property", "store-contract"]
    run = kvcheck("run", "--adapter", bounded, *checked, "--cases", "30", "--replays", "1")
    assert run.status == 0, run.stdout + run.stderr
    assert {p["id"]: p["verdict"] for p in run.report["properties"] if p["id"] in checked} == {
        "eviction-as-declared": "pass", "stored-immutable": "pass", "store-contract": "pass"}
    buggy = kvcheck("run", "--adapter", f"{bounded} --bug evicts_most_recent", "--property", "eviction-as-declared",
                    "--cases", "100", "--failures", "1", "--replays", "1")
    assert buggy.status == 1, buggy.stdout + buggy.stderr
    result = buggy.result("eviction-as-declared")
    assert result["verdict"] == "fail" and result["fault"] is None, result
    assert "expected [" in result["message"] and "least recently used first" in result["message"], result


def test_a_violation_reported_as_also_fails_its_own_row(kvcheck):
    """Issue 42: a row's verdict counts every violation reported on it. The
    stored object handed out by get_cache breaks stored-immutable first
    and single-copy and owned-marker at the same step ("also"): those rows
    fail too, pointing at the trace that showed it."""
    run = kvcheck("run", "--adapter", f"{EXAMPLE} --bug single_id_returns_stored", "--cases", "20", "--replays", "1",
                  "--property", "stored-immutable", "--property", "single-copy", "--property", "owned-marker")
    assert run.status == 1, run.stdout + run.stderr
    verdicts = {p["id"]: p["verdict"] for p in run.report["properties"]}
    pointed = 0
    for row in run.report["properties"]:
        for failure in row.get("failures") or []:
            for also in failure.get("also") or []:
                other = also.split(": ", 1)[0]
                if other in verdicts:
                    assert verdicts[other] == "fail", (other, also, verdicts)
        if (row.get("message") or "").startswith("also at the failing step of"):
            pointed += 1
            assert row["reproduce"] and row["trace"], row
    assert pointed >= 1, verdicts


def test_rows_of_the_other_family_are_left_out_of_the_text_and_marked_in_json(scratch_dir):
    """Issue 42: a contiguous store's table has no paged rows, one line says
    how many were left out and why; the JSON keeps them, marked."""
    # One run writes both (--also-report; CI time: one kvcheck start, not two).
    checked = ["--property", "store-contract", "--property", "op-atomic", "--property", "no-leak", "--cases", "2"]
    json_file = os.path.join(scratch_dir, "report.json")
    text = subprocess.run([kvcheck_binary(), "run", "--adapter", EXAMPLE, *checked, "--replays", "0", "--also-report",
                           "json=" + json_file], cwd=scratch_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=600)
    assert text.returncode == 0, text.stdout + text.stderr
    rows = [line.split()[0] for line in text.stdout.splitlines() if line.split() and line.split()[-1] in ("pass", "n/a")]
    assert "store-contract" in rows and "op-atomic" not in rows and "no-leak" not in rows, text.stdout
    assert "2 properties left out, n/a for every adapter: 2 of the other cache family" in text.stdout, text.stdout
    with open(json_file) as file:
        run = Run(text, json.load(file))
    marked = {p["id"]: p["not_applicable"] for p in run.report["properties"]}
    assert marked["op-atomic"] is True and marked["no-leak"] is True and marked["store-contract"] is False, marked


def test_a_failure_replays_and_shrinks_with_the_same_adapter(kvcheck, bug_search, scratch_dir):
    adapter = f"{EXAMPLE} --bug double_copy"
    assert BUGS["double_copy"] == "single-copy"
    run = bug_search("double_copy")
    result = run.result("single-copy")
    trace_file = os.path.join(bug_search.directory, "traces", "activation-memory+double_copy-single-copy.trace")
    assert os.path.isfile(trace_file)
    assert result["reproduce"].startswith("kvcheck replay ")
    replay = kvcheck("replay", trace_file, "--adapter", adapter)
    assert replay.status == 1 and "ERROR: single-copy:" in replay.stdout, replay.stdout + replay.stderr
    fixed = kvcheck("replay", trace_file, "--adapter", EXAMPLE)
    assert fixed.status == 0 and "every property holds" in fixed.stdout, fixed.stdout + fixed.stderr
    shrunk_file = os.path.join(scratch_dir, "shrunk.trace")
    shrink = kvcheck("shrink", trace_file, "--adapter", adapter, "--out", shrunk_file)
    assert shrink.status == 1 and os.path.isfile(shrunk_file), shrink.stdout + shrink.stderr


def test_a_generation_of_no_token_is_no_false_single_copy_finding(kvcheck, scratch_dir):
    """A generation of max 0 runs no model, so a store whose live sets are
    sampled at the model's forwards reports none: single-copy judges only
    its upper bound and its copies (it said "reported 0 K/V sets alive, but
    2 are" of the correct store). The double copy is still found on it."""
    trace = os.path.join(scratch_dir, "max0.trace")
    with open(trace, "w") as file:
        file.write("add d modern/f32/0:[kv1]\nh7 = get_cache d\ngenerate h7 prompt=1 max=0\n")
    fixed = kvcheck("replay", trace, "--adapter", EXAMPLE, "--property", "single-copy")
    assert fixed.status == 0 and "every property holds" in fixed.stdout, fixed.stdout + fixed.stderr
    doubled = kvcheck("replay", trace, "--adapter", f"{EXAMPLE} --bug double_copy", "--property", "single-copy")
    assert doubled.status == 1 and "ERROR: single-copy: generate from h7 made 1 copies" in doubled.stdout, \
        doubled.stdout + doubled.stderr


def test_a_flipped_byte_of_tensor_data_that_loads_silently_is_found_with_its_offset(kvcheck, scratch_dir, byte=77):
    """Issue 42, item 5: a store that loads a flipped byte of tensor data
    silently fails dump-safe on every trace that flips one (the offset's
    class 2 of 3: tensor data, then its byte), and the failure names the
    real byte offset in the file (it said offset=967004 of a 3,293-byte
    file). The store with its digest refuses the file: no finding."""
    trace = os.path.join(scratch_dir, "flip.trace")
    with open(trace, "w") as file:
        file.write(f"add a modern/f32/7:[kv2]\ndump slot=0\ncorrupt slot=0 offset={2 + 3 * byte} truncate=0\nload slot=0\n")
    silent = kvcheck("replay", trace, "--adapter", f"{EXAMPLE} --bug skips_digest", "--property", "dump-safe")
    assert silent.status == 1 and "ERROR: dump-safe: load of dump slot 0 (corrupted: byte " in silent.stdout, \
        silent.stdout + silent.stderr
    said = silent.stdout.split("(corrupted: byte ", 1)[1]
    offset, size = int(said.split()[0]), int(said.split("flipped (of ", 1)[1].split()[0])
    assert offset < size and f"tensor data: record archive/data/" in said, said
    assert f"of activation-memory.pt flipped (of {size} bytes; " in said, said
    fixed = kvcheck("replay", trace, "--adapter", EXAMPLE, "--property", "dump-safe")
    assert fixed.status == 0 and "every property holds" in fixed.stdout, fixed.stdout + fixed.stderr


def test_an_exception_is_the_steps_engine_error_with_its_traceback(kvcheck):
    adapter = os.path.join(HERE, "raising_adapter.py")
    run = kvcheck("run", "--adapter", adapter, "--property", "merge-correct", "--cases", "200")
    assert run.status == 1, run.stdout + run.stderr
    # The search goes on past every raise, and judges each trace without
    # the merge that raised; no get_cache of several ids ever ran, so
    # merge-correct's pass is starred: not applied to those merges. The
    # raises are the engine-error row's, one group however many ids each
    # merge had, with the trace that raises it.
    merge = run.result("merge-correct")
    assert merge["verdict"] == "pass" and merge["cases"] == 200 and merge["judged"] >= 180, merge
    assert merge["not_applied"].startswith("get_cache of several parts (a merge): each of the "), merge
    assert "asked raised and none ran, so the traces were judged without it" in merge["not_applied"], merge
    result = run.result("engine-error")
    assert result["verdict"] == "fail" and result["fault"] is None
    assert len(result["failures"]) == 1 and result["failures"][0]["count"] >= 20, result["failures"]
    message = result["message"]
    assert message.startswith("found while searching merge-correct: the engine threw: the adapter raised ValueError: planted: a merge of "), message
    assert "Traceback (most recent call last):" in message and "raising_adapter.py" in message, message
    assert "get_cache" in result["trace"]
    assert "the planted error's last words" in result["output"]


_RECORDER = """
import json, os, runpy, sys
sys.path.insert(0, {sdk!r})
from kvcheck_adapter import protocol
receive = protocol.Connection.receive
log = open({log!r}, "a")
def recording(connection):
    request = receive(connection)
    if request is not None:
        log.write(json.dumps({{"op": request.get("op"), "id": request.get("id"), "ids": request.get("ids"),
                              "read_store": request.get("read_store") is True,
                              "read_ids": request.get("read_ids") or []}}) + "\\n")
        log.flush()
    return request
protocol.Connection.receive = recording
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_fill_is_read_once_after_its_last_item_not_after_each(kvcheck, scratch_dir, monkeypatch):
    """Issue 39: a fill is one engine call per item; the reads after it
    (every entry: a fill reaches the whole store) are asked for once, not
    gathered in the reply of each item's add (a full read per item, the
    store growing: quadratic in the fill). The replay still reads and
    judges every entry."""
    log = os.path.join(scratch_dir, "requests.jsonl")
    recorder = os.path.join(scratch_dir, "recorder.py")
    with open(recorder, "w") as file:
        file.write(_RECORDER.format(sdk=os.path.dirname(HERE), log=log))
    python = os.path.join(scratch_dir, "python")
    with open(python, "w") as file:
        file.write(f"#!/bin/sh\nexec {ADAPTER_PYTHON} {recorder} \"$@\"\n")
    os.chmod(python, 0o755)
    monkeypatch.setenv("KVCHECK_PYTHON", python)
    trace = os.path.join(scratch_dir, "fill.trace")
    with open(trace, "w") as file:
        file.write("add a modern/f32/3:[kv2 kv2]\nfill modern/f32/2:[kv1] first=0 count=12\nh1 = get_cache i3\n")
    replay = kvcheck("replay", trace, "--adapter", EXAMPLE, "--quiet")
    assert replay.status == 0, replay.stdout + replay.stderr
    with open(log) as file:
        requests = [json.loads(line) for line in file]
    adds = [r for r in requests if r["op"] == "add" and r["id"].startswith("i")]
    assert [r["id"] for r in adds] == [f"i{k}" for k in range(12)]
    assert not any(r["read_store"] or r["read_ids"] for r in adds), adds
    # Read after the fill, every entry at once (but the last item's, which
    # its add's reply reports as the entry it names), before the next operation.
    after = requests[requests.index(adds[-1]) + 1:]
    reads = [r for r in after[: next(i for i, r in enumerate(after) if r["op"] == "get_cache")] if r["op"] == "read_entries"]
    assert len(reads) == 1 and set(reads[0]["ids"]) == {"a"} | {f"i{k}" for k in range(11)}, after
