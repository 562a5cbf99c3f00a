"""kvcheck on the example block manager (python/examples/block_manager.py)
through the process boundary, as a user runs it: the correct manager holds
every paged property (the contiguous ones are n/a: it is a paged engine
only), and each historic bug is caught by the property that names it
(block_manager.BUG_PROPERTIES), shrunk. Under Debian's torch 1.13 only:
the SDK's paged side is the same code under either torch (test_paged_sdk.py
runs under both), and a second run of the file would add CI time without
a check. (The cold starts under torch 2 that BENCHMARKS.md, "Paged block
managers from Python", measured are gone: a kvcheck run of the manager
under .venv's torch 2 starts one interpreter and forks the rest, as under
torch 1.13; BENCHMARKS.md, "CI's Python suites".)"""

import os

import pytest
import torch

from conftest import PYTHON_DIR, ADAPTER_PYTHON, adapter_arguments, bug_searches

from block_manager import BUG_PROPERTIES

# Skipped test by test, not the module: a module skipped whole collects no
# test, and pytest then exits with status 5 (a ctest failure).
pytestmark = pytest.mark.skipif(int(torch.__version__.split(".")[0]) >= 2,
                                reason="kvcheck runs of the example block manager run under torch 1.13 only (cheap there)")

MANAGER = os.path.join(PYTHON_DIR, "examples", "block_manager_adapter.py")
# A budget each bug is found well within (BENCHMARKS.md: its median time to
# the first verdict is a few dozen traces at most).
BUG_CASES = "300"


# The correct manager, as it is, with a LIFO free list and with a sliding
# window: the same search of each (its traces are the same whichever
# adapters run beside it), in one kvcheck run (CI time: one kvcheck start,
# not three, most of all under ASan); each test judges its own part.
CORRECT = {"fifo": MANAGER, "lifo": f"{MANAGER} --free-order lifo", "window": f"{MANAGER} --window"}


@pytest.fixture(scope="module")
def correct_run(kvcheck_module):
    run = kvcheck_module("run", *adapter_arguments(CORRECT.values()), "--cases", "40", "--jobs", "2")
    return lambda manager: run.of(f"exec:{ADAPTER_PYTHON} {CORRECT[manager]}")


def test_the_correct_manager_holds_every_paged_property(correct_run):
    run = correct_run("fifo")
    assert run.status == 0, run.stdout + run.stderr
    verdicts = {p["id"]: p["verdict"] for p in run.applicable()}
    assert verdicts and set(verdicts.values()) == {"pass"}, verdicts
    assert set(BUG_PROPERTIES.values()) <= set(verdicts)
    # Paged only: every contiguous property is n/a, without a job (and
    # linearizable, judged with --lanes only).
    other = [p for p in run.report["properties"]
             if p["id"] not in verdicts and p["id"] not in ("engine-error", "linearizable")]
    assert other and all("paged engine only" in p["message"] for p in other), other
    assert "--lanes" in run.result("linearizable")["message"], run.result("linearizable")
    assert run.report["adapter"] == "block-manager"
    assert run.report["source"] == f"exec:{ADAPTER_PYTHON} {MANAGER}"


def test_a_lifo_free_list_holds_every_paged_property(correct_run):
    # Freed blocks join the front (as vLLM's unhashed ones do): a rewind's
    # copy may take back the block the same rewind released (issue 41).
    run = correct_run("lifo")
    assert run.status == 0, run.stdout + run.stderr
    verdicts = {p["id"]: p["verdict"] for p in run.applicable()}
    assert verdicts and set(verdicts.values()) == {"pass"}, verdicts


def test_a_sliding_window_manager_holds_every_paged_property(correct_run):
    # Blocks behind every sequence's window are given back at the step, the
    # null block in their place (docs/semantics.md#sliding-windows).
    run = correct_run("window")
    assert run.status == 0, run.stdout + run.stderr
    verdicts = {p["id"]: p["verdict"] for p in run.applicable()}
    assert verdicts and set(verdicts.values()) == {"pass"}, verdicts
    assert run.report["adapter"] == "block-manager-window3"


# Issue 41's shrunk trace: the rewind releases block 2 and its copy of the
# shared block 1 takes block 2 straight back (LIFO). Published-immutable
# called that a rewrite of a table-held block.
LIFO_REWIND_TRACE = """paged_import seq=2 modern/f32/0:[kv2 kv2]
paged_fork parent=2 child=3
paged_append seq=3 count=1
paged_rewind seq=3 count=2 token=3
"""


def test_a_rewind_taking_back_the_block_it_released_is_no_rewrite(kvcheck, scratch_dir):
    trace_file = os.path.join(scratch_dir, "lifo-rewind.trace")
    with open(trace_file, "w") as file:
        file.write(LIFO_REWIND_TRACE)
    replay = kvcheck("replay", trace_file, "--adapter", f"{MANAGER} --free-order lifo")
    assert replay.status == 0 and "every property holds" in replay.stdout, replay.stdout + replay.stderr


@pytest.fixture(scope="module")
def bug_search(kvcheck_module):
    """Each bug's search, those of one property in one run (bug_searches)."""
    return bug_searches(kvcheck_module, MANAGER, BUG_PROPERTIES, "--cases", BUG_CASES, "--failures", "1",
                        "--replays", "1")


@pytest.mark.parametrize("bug", sorted(BUG_PROPERTIES))
def test_each_bug_is_caught_by_the_property_that_names_it(bug_search, bug):
    prop = BUG_PROPERTIES[bug]
    run = bug_search(bug)
    assert run.status == 1, run.stdout + run.stderr
    result = run.result(prop)
    assert result["verdict"] == "fail" and result["fault"] is None, result
    assert result["trace"] and result["reproduce"] and result["message"], result
    assert len(result["trace"].strip().splitlines()) <= 8, result["trace"]  # shrunk
