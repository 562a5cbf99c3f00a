"""Every reported failure reproduces (issue 33, docs/semantics.md#reproduction):
a failure that needs an earlier engine of the process is reported as
shared-state with a two-part reproducer that fails on replay; one that comes
and goes, flaky with its rate; a refusal that follows a missing cache, by
store-contract; copies of an arena, counted by what was written.
The engines: reproduction_adapter.py."""

import os

from conftest import HERE

ADAPTER = os.path.join(HERE, "reproduction_adapter.py")


def adapter(case):
    return f"{ADAPTER} --case {case}"


def only_failure(run, prop):
    result = run.result(prop)
    assert result["verdict"] == "fail", run.stdout + run.stderr
    assert len(result["failures"]) == 1, result["failures"]
    return result["failures"][0]


def test_state_shared_across_engines_is_reported_with_a_two_part_reproducer(kvcheck, scratch_dir):
    # At this seed the failure is found in the second trace, and the first
    # candidate prefix, the trace as found, fails on its own: it is cut
    # before its own failure (search_job.cpp, runnable_prefix), or no
    # candidate would reproduce it and it would be reported flaky 0 of 3.
    run = kvcheck("run", "--adapter", adapter("shared_default"), "--property", "generation-equivalent", "--cases", "40",
                  "--failures", "1")
    failure = only_failure(run, "generation-equivalent")
    reproduction = failure["reproduction"]
    assert reproduction["kind"] == "shared-state", failure
    assert (reproduction["replays"], reproduction["failed"]) == (3, 0)
    assert reproduction["prefix_failed"] == reproduction["prefix_replays"] == 3
    assert failure["message"].startswith("shared-state: engines share state across instances"), failure["message"]
    assert os.path.isfile(reproduction["prefix_file"]) and reproduction["prefix"]
    assert f"--prefix {reproduction['prefix_file']}" in failure["reproduce"]
    # Its trace alone passed its 3 replays (above); after the prefix, in one
    # engine process, it fails.
    both = kvcheck("replay", failure["trace_file"], "--adapter", adapter("shared_default"), "--prefix",
                   reproduction["prefix_file"])
    assert both.status == 1 and "ERROR: generation-equivalent:" in both.stdout, both.stdout + both.stderr
    assert "--prefix" in both.stdout  # its own reproduce line
    # The engine-level verdict: the adapter's shared-state row fails, with
    # the same two-part reproducer.
    shared = run.result("shared-state")
    assert shared["verdict"] == "fail", shared
    assert [f["reproduction"]["kind"] for f in shared["failures"]] == ["shared-state"], shared["failures"]
    assert shared["failures"][0]["trace"] == failure["trace"]


def test_answers_that_differ_after_other_engines_are_shared_state_though_no_property_fails(kvcheck, scratch_dir):
    # The first to_legacy of the adapter process aliases its source, every
    # later one copies it (both allowed). At this seed the search's first
    # trace has a to_legacy: run again at the end of the search, it answers
    # with a copy where alone it made none.
    run = kvcheck("run", "--adapter", adapter("shared_copy"), "--property", "stored-immutable", "--cases", "10", "--seed",
                  "10", "--failures", "1")
    assert run.result("stored-immutable")["verdict"] == "pass", run.result("stored-immutable")
    shared = run.result("shared-state")
    assert shared["verdict"] == "fail", run.stdout + run.stderr
    finding = shared["failures"][0]
    assert "no property failing" in finding["message"], finding["message"]
    assert '0 copies of 0 bytes", run after the earlier traces of its process' in finding["message"], finding["message"]
    assert finding["reproduction"]["kind"] == "shared-state" and finding["reproduction"]["prefix_failed"] == 3, finding
    alone = kvcheck("replay", finding["trace_file"], "--adapter", adapter("shared_copy"))
    assert alone.status == 0, alone.stdout + alone.stderr
    both = kvcheck("replay", finding["trace_file"], "--adapter", adapter("shared_copy"), "--prefix",
                   finding["reproduction"]["prefix_file"])
    assert both.status == 1 and "ERROR: shared-state: the engine answered otherwise" in both.stdout, both.stdout + both.stderr


def test_a_failure_that_comes_and_goes_is_reported_flaky_with_its_rate(kvcheck, scratch_dir, monkeypatch):
    # Broken in two adapter processes of three, by their order of start:
    # the search's fails, and two of the three replays.
    monkeypatch.setenv("KVCHECK_TEST_PROCESS_COUNTER", os.path.join(scratch_dir, "processes"))
    run = kvcheck("run", "--adapter", adapter("flaky"), "--property", "generation-equivalent", "--cases", "40",
                  "--failures", "1")
    failure = only_failure(run, "generation-equivalent")
    reproduction = failure["reproduction"]
    assert reproduction["kind"] == "flaky", failure
    assert (reproduction["replays"], reproduction["failed"]) == (3, 2)
    assert failure["message"].startswith("flaky: failed 2 of 3 replays on a fresh engine: "), failure["message"]


def test_a_missing_cache_is_store_contracts_not_an_engine_error(kvcheck):
    # get_cache of several ids hands out nothing: merge-correct's follow-up
    # reading of that handle is not asked, and the engine never refuses.
    run = kvcheck("run", "--adapter", adapter("empty_handle"), "--property", "merge-correct", "--property",
                  "store-contract", "--cases", "20", "--failures", "1")
    failure = only_failure(run, "store-contract")
    assert "holds no cache, expected one" in failure["message"], failure
    assert failure["reproduction"]["kind"] == "reproduced"
    assert run.result("merge-correct")["verdict"] == "pass", run.result("merge-correct")
    errors = run.result("engine-error")
    assert errors["verdict"] == "pass" and not errors["failures"], errors


def test_an_arena_is_not_counted_as_copies(kvcheck):
    # A load packs every tensor of one dtype into one storage; a get_cache
    # of one entry then copies each of its tensors once: one copy.
    run = kvcheck("run", "--adapter", adapter("arena"), "--property", "single-copy", "--cases", "60", "--failures", "1")
    result = run.result("single-copy")
    assert result["verdict"] == "pass", result
    assert run.status == 0, run.stdout + run.stderr


def test_a_copy_carved_from_the_stored_entrys_arena_is_said_to_share_one_storage(kvcheck, scratch_dir):
    # get_cache's copy is written into one arena with the stored entry: a
    # copy of every value (counted as the copies the packing wrote), and
    # one storage shared with the entry, which is what the message says.
    trace = os.path.join(scratch_dir, "arena_copy.trace")
    with open(trace, "w") as file:
        file.write("add a modern/f32/0:[kv1 kv2]\nh1 = get_cache a\n")
    replay = kvcheck("replay", trace, "--adapter", adapter("arena_copy"))
    assert replay.status == 1, replay.stdout + replay.stderr
    assert ('ERROR: stored-immutable: the cache get_cache handed out as h1 shares one storage with stored entry "a"'
            in replay.stdout), replay.stdout
    assert 'owned-marker: h1 is marked owned but shares one storage with stored entry "a"' in replay.stdout, replay.stdout
