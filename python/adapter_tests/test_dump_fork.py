"""dump-safe's kill points and power cuts applied to a Python engine's real
dump (issue 28, item 3; docs/durability.md, "Engines that run as programs of
their own"): kvcheck preloads its dump shim into the adapter process, and
the SDK serves dump_fork, so an engine that uses the SDK is checked with no
change on its side. The engines are the example store, as it is and with
a dump made non-durable (durability_adapter.py).
"""

# Under one interpreter only: the subject is the dump's file calls, not torch.
# kvcheck-test-pythons: torch1

import os

from conftest import EXAMPLE, HERE

DURABILITY_ADAPTER = os.path.join(HERE, "durability_adapter.py")

# Two dumps into one slot, the second killed at two of its calls, then a
# load: every dump_kill also loads each state a power cut right after the
# dump returned may leave.
KILLED_DUMPS = """add a modern/f32/0:[kv3 kv2]
dump slot=0
add b modern/f32/1:[kv2]
dump_kill slot=0 point=2
dump_kill slot=0 point=5
load slot=0
get_all
"""


def replay_killed_dumps(kvcheck, scratch_dir, adapter):
    trace = os.path.join(scratch_dir, "killed-dumps.trace")
    with open(trace, "w") as file:
        file.write(KILLED_DUMPS)
    return kvcheck("replay", trace, "--property", "dump-safe", "--adapter", adapter)


def test_a_dump_that_never_fsyncs_fails_dump_safe_with_a_replay(kvcheck, scratch_dir):
    adapter = f"{DURABILITY_ADAPTER} --dump no_fsync"
    run = kvcheck("run", "--adapter", adapter, "--property", "dump-safe", "--cases", "100", "--failures", "1")
    assert run.status == 1, run.stdout + run.stderr
    result = run.result("dump-safe")
    assert result["verdict"] == "fail" and result["fault"] is None, result
    assert result["not_applied"] is None, result
    assert "a power cut right after the dump returned" in result["message"], result
    assert result["reproduce"].startswith("kvcheck replay "), result
    replay = kvcheck("replay", result["trace_file"], "--adapter", adapter)
    assert replay.status == 1 and "ERROR: dump-safe:" in replay.stdout, replay.stdout + replay.stderr


def test_a_rename_without_an_fsync_of_the_directory_fails_dump_safe(kvcheck, scratch_dir):
    replay = replay_killed_dumps(kvcheck, scratch_dir, f"{DURABILITY_ADAPTER} --dump no_dir_fsync")
    assert replay.status == 1, replay.stdout + replay.stderr
    assert "ERROR: dump-safe:" in replay.stdout, replay.stdout
    assert "a power cut right after the dump returned" in replay.stdout, replay.stdout


def test_the_example_stores_durable_dump_passes_its_kills_and_power_cuts(kvcheck, scratch_dir):
    replay = replay_killed_dumps(kvcheck, scratch_dir, EXAMPLE)
    assert replay.status == 0 and "every property holds" in replay.stdout, replay.stdout + replay.stderr
    run = kvcheck("run", "--adapter", EXAMPLE, "--property", "dump-safe", "--cases", "40")
    assert run.status == 0, run.stdout + run.stderr
    result = run.result("dump-safe")
    assert result["verdict"] == "pass" and result["not_applied"] is None, result


def test_an_adapter_process_without_the_shim_passes_with_the_reason_it_was_not_killed(kvcheck):
    # As a wrapper that clears the environment (or a static program, which
    # ignores LD_PRELOAD): the shim is not in the process, so no dump_fork.
    run = kvcheck("run", "--adapter", f"{DURABILITY_ADAPTER} --dump no_fsync --clear-preload",
                  "--property", "dump-safe", "--cases", "20")
    assert run.status == 0, run.stdout + run.stderr
    result = run.result("dump-safe")
    assert result["verdict"] == "pass", result
    assert result["not_applied"].startswith(
        "kill/power-cut: not applied, because its dumps cannot run in a copy of the adapter process with the dump "
        "shim armed: the dump shim (libkvcheck_dumpshim.so) is not loaded in the adapter process"), result


def test_a_dump_copy_that_stops_itself_is_said_to_have_stopped(kvcheck, scratch_dir):
    """A copy stopped by SIGSTOP was waited on forever by the SDK (and a
    stopped wait status read as an exit status by kvcheck): the SDK kills
    it and replies its status; kvcheck names the stop (issue 43, D22)."""
    replay = replay_killed_dumps(kvcheck, scratch_dir, f"{DURABILITY_ADAPTER} --dump stop")
    text = replay.stdout + replay.stderr
    assert replay.status == 1, text
    assert "did not end its child process normally (stopped by SIGSTOP)" in text, text
    assert "hang" not in text and "status 127" not in text and "status 19" not in text, text
