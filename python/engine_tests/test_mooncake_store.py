"""kvcheck on Mooncake's store (python/adapters/mooncake_store_adapter.py;
python/README.md "Real engines"), at the verdicts recorded there, from its
pinned environment .venv/engines/mooncake-0.3.13.post1 (scripts/bootstrap;
skipped when it is not installed): MooncakeDistributedStore against its own
mooncake_master holds every property it can be judged on, written by
upsert_tensor or by upsert_from out of a registered buffer the caller
overwrites at once; the master the adapter starts never outlives kvcheck,
however kvcheck ends; a master that cannot start is an error that says so;
the lease and eviction differences the adapter declares hold."""

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from conftest import PYTHON_DIR, REPO, kvcheck_binary, run_adapter, use_engine

ADAPTER = os.path.join(PYTHON_DIR, "adapters", "mooncake_store_adapter.py")
ENVIRONMENT = os.path.join(REPO, ".venv", "engines", "mooncake-0.3.13.post1")
JUDGED = {"stored-immutable", "layout-roundtrip", "merge-correct", "generation-equivalent", "store-contract"}
# Every read is a copy out of Mooncake's segment: no storage, marker or copy log (declared).
DECLARED_SKIPPED = {"single-copy", "owned-marker", "clone-independent"}
GONE_SECONDS = 120  # for the kernel to end what kvcheck left: seconds on an idle machine


@pytest.fixture
def mooncake(monkeypatch):
    use_engine(monkeypatch, ENVIRONMENT, "Mooncake")


def run_of(kvcheck, options, *arguments):
    return run_adapter(kvcheck, ADAPTER + options, *arguments)


def test_mooncake_store_holds_every_property_it_can_be_judged_on(kvcheck, mooncake):
    run = run_of(kvcheck, "", "--cases", "4")
    assert run.status == 0, run.stdout + run.stderr
    verdicts = {p["id"]: p["verdict"] for p in run.applicable()}
    assert {p: verdicts.get(p) for p in JUDGED} == {p: "pass" for p in JUDGED}, verdicts
    assert {p: verdicts.get(p) for p in DECLARED_SKIPPED} == {p: "skipped" for p in DECLARED_SKIPPED}, verdicts
    assert run.report["adapter"] == "mooncake-0.3.13.post1"


def test_mooncake_store_written_from_a_buffer_the_caller_overwrites_keeps_what_was_stored(kvcheck, mooncake):
    # --write from: every add is upsert_from out of one registered staging
    # buffer that the adapter overwrites as soon as the call returns; an
    # entry that kept pointing at the caller's buffer would change under
    # every later add (stored-immutable, store-contract).
    run = run_of(kvcheck, " --write from", "--property", "stored-immutable", "--property", "store-contract",
                 "--cases", "6")
    assert run.status == 0, run.stdout + run.stderr
    assert run.report["adapter"] == "mooncake-0.3.13.post1-write-from"
    for property_id in ("stored-immutable", "store-contract"):
        assert run.result(property_id)["verdict"] == "pass", run.result(property_id)


def test_a_stored_handle_is_the_callers_no_longer(kvcheck, mooncake, scratch_dir):
    # Found by scripts/real-engines (seed 1, layout-roundtrip, after 55
    # traces; shrunk to these 6 operations): add_handle left the caller's
    # object marked owned, so generate wrote into what kvcheck holds as the
    # stored item (an adapter fault: Mooncake stores a copy).
    trace = os.path.join(scratch_dir, "stored-handle.trace")
    with open(trace, "w") as file:
        file.write("h1 = make modern/f32/0:[kv1 kv1]\nh2 = concat h1\nh4 = concat h2\nadd_handle b h4\n"
                   "generate h4 prompt=1 max=1\nh7 = clone h4\n")
    run = kvcheck("replay", trace, "--adapter", ADAPTER)
    assert run.status == 0, run.stdout + run.stderr


def tagged_processes(tag):
    """(pid, program name) of every process whose environment holds `tag`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as file:
                if tag.encode() not in file.read():
                    continue
            with open(f"/proc/{entry}/comm") as file:
                found.append((int(entry), file.read().strip()))
        except OSError:  # gone, or not ours to read
            continue
    return found


def masters_of(tag):
    return [pid for pid, name in tagged_processes(tag) if name.startswith("mooncake_maste")]


@pytest.mark.parametrize("ending", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_no_mooncake_master_outlives_kvcheck(scratch_dir, mooncake, ending):
    # kvcheck is ended while its adapter processes run traces against their
    # masters; every process it started (and the masters they started) must
    # end: each carries a tag in its environment, inherited from kvcheck's.
    tag = f"KVCHECK_TEST_TAG={uuid.uuid4().hex}"
    environment = dict(os.environ, KVCHECK_TEST_TAG=tag.split("=", 1)[1])
    kvcheck = subprocess.Popen(
        [kvcheck_binary(), "run", "--adapter", ADAPTER, "--cases", "200", "--jobs", "2", "--timeout", "600",
         "--quiet", "--trace-dir", os.path.join(scratch_dir, "traces")],
        cwd=scratch_dir, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while not masters_of(tag):
            assert kvcheck.poll() is None, f"kvcheck ended (status {kvcheck.returncode}) before a master started"
            assert time.monotonic() < deadline, "no mooncake_master started in 600 s"
            time.sleep(0.1)
        kvcheck.send_signal(ending)
        kvcheck.wait()
        deadline = time.monotonic() + GONE_SECONDS
        while tagged_processes(tag) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = tagged_processes(tag)
        assert not left, f"still running {GONE_SECONDS} s after kvcheck ended by {ending.name}: {left}"
    finally:
        if kvcheck.poll() is None:
            kvcheck.kill()
            kvcheck.wait()
        for pid, _ in tagged_processes(tag):  # only what this test started (its tag)
            os.kill(pid, signal.SIGKILL)


def adapter_module():
    """The adapter's module, imported here (its master is started by the tests below)."""
    sys.path.insert(0, ENVIRONMENT)
    sys.path.insert(0, os.path.dirname(ADAPTER))
    try:
        import mooncake_store_adapter
    finally:
        sys.path.remove(ENVIRONMENT)
        sys.path.remove(os.path.dirname(ADAPTER))
    return mooncake_store_adapter


def test_a_master_whose_port_was_taken_is_started_again_on_new_ports(mooncake, monkeypatch):
    adapter = adapter_module()
    # Importing the package starts 5 threads (its buffer pool): the SDK's
    # fork server would refuse every warm start, each property's adapter cold.
    assert "mooncake" not in sys.modules, "the adapter imports the mooncake package before the fork"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = [taken.getsockname()[1]] * 2 + [adapter.free_port() for _ in range(4)]
        monkeypatch.setattr(adapter, "free_port", lambda: ports.pop(0))
        master = adapter.Master()  # the first try's RPC port is taken: its master exits, saying nothing
        try:
            assert master.port != taken.getsockname()[1]
            assert master.process.poll() is None
        finally:
            master.stop()
        ports[:] = [taken.getsockname()[1]] * 2 * adapter.PORT_TRIES
        with pytest.raises(adapter.MooncakeError) as raised:
            adapter.Master()
        assert f"127.0.0.1:{taken.getsockname()[1]} is in use" in str(raised.value), raised.value
        assert f"{adapter.PORT_TRIES} times on new ports" in str(raised.value), raised.value


def test_a_master_that_cannot_start_is_an_error_naming_it_and_what_it_said(mooncake, monkeypatch, scratch_dir):
    adapter = adapter_module()
    stand_in = pathlib.Path(scratch_dir) / "mooncake_master"
    stand_in.write_text("#!/bin/sh\necho 'E1207 master.cpp:1] cannot bind: no such luck' >&2\nexit 3\n")
    stand_in.chmod(0o755)
    monkeypatch.setattr(adapter, "MASTER", str(stand_in))
    with pytest.raises(adapter.MooncakeError) as raised:
        adapter.Master()
    message = str(raised.value)
    assert "exited with status 3 before listening on 127.0.0.1:" in message, message
    assert "is in use" not in message, message
    assert "cannot bind: no such luck" in message, message
    assert str(stand_in) in message, message
    assert "OBJECT_HAS_LEASE" in str(pytest.raises(adapter.MooncakeError, adapter.checked, -706, "remove('a')").value)


def test_the_contract_differences_the_adapter_declares_still_hold(mooncake, monkeypatch):
    # What the adapter's docstring and docs/semantics.md declare of Mooncake's
    # leases and eviction (why delete is a forced remove, why no capacity is
    # declared), held against the pinned wheel, leases long enough (10 min)
    # that no wall-clock expiry enters the test.
    adapter = adapter_module()
    monkeypatch.syspath_prepend(ENVIRONMENT)  # the adapter finds the package without importing it
    from mooncake.store import MooncakeDistributedStore

    master = adapter.Master(("-default_kv_lease_ttl", "600000"))
    store = MooncakeDistributedStore()
    try:
        adapter.checked(store.setup("127.0.0.1", "P2PHANDSHAKE", 16 * 1024 * 1024, 8 * 1024 * 1024, "tcp", "",
                                    f"127.0.0.1:{master.port}"), "setup")  # 16 MiB: the least segment it mounts
        assert store.put("written", b"w" * 100) == 0
        assert store.remove("written") == 0  # a write leases nothing
        assert store.upsert("read", b"x" * 100) == 0
        assert store.get("read") == b"x" * 100  # a read leases it
        assert store.remove("read") == -706  # OBJECT_HAS_LEASE: so kvcheck's delete is remove(force=True)
        assert store.upsert("read", b"y" * 100) == 0  # a lease does not hold off a replacement
        assert store.get("read") == b"y" * 100
        assert store.put("read", b"z" * 100) == 0  # insert-if-absent (kvcache-ai/Mooncake#346): add is upsert
        assert store.get("read") == b"y" * 100
        # A full segment refuses the write (NO_AVAILABLE_HANDLE); its master
        # evicts later, in a thread, only objects whose lease expired: with
        # every object leased (an existence check leases) it evicts none and
        # every write is refused. Eviction is no part of the write kvcheck sees.
        value = bytes(256 * 1024)
        codes = []
        for i in range(70):
            codes.append(store.upsert(f"k{i}", value))
            assert store.is_exist(f"k{i}") == (1 if codes[-1] == 0 else 0)
        refused = codes.index(-200)
        assert 32 <= refused <= 64 and set(codes[:refused]) == {0} and set(codes[refused:]) == {-200}, codes
        assert store.batch_is_exist([f"k{i}" for i in range(refused)]) == [1] * refused
        assert store.upsert(f"k{refused}", value) == -200
    finally:
        store.close()
        master.stop()
