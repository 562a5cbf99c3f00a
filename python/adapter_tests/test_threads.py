"""A thread-safe adapter served side by side (kvcheck_adapter.threads;
docs/protocol.md section 11a): the seeded scheduler's turns, its Lock and
yield points, the protocol loop's request ids, and the example store's
lock, whose bug unlocked_index loses an entry only with two clients."""

import json
import os
import sys
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SDK = os.path.dirname(HERE)
sys.path.insert(0, SDK)
sys.path.insert(0, os.path.join(SDK, "examples"))

import activation_memory  # noqa: E402
import kvcheck_adapter  # noqa: E402
from kvcheck_adapter import cache as kv  # noqa: E402
from kvcheck_adapter import threads  # noqa: E402


def _waiting(scheduler, count):
    deadline = time.monotonic() + 60
    while len(scheduler._waiting) < count:
        assert time.monotonic() < deadline, "a client thread never asked for its turn"
        time.sleep(0.001)


def run_clients(seed, clients):
    """Each of `clients` (functions) on a thread of its own under a
    scheduler seeded `seed`, arriving in order; returns the switches made.
    The main thread holds the first turn until every client waits, so that
    the draws alone decide the interleaving."""
    scheduler = threads.Scheduler(seed)
    threads._scheduler = scheduler
    try:
        scheduler.enter()
        started = []
        for index, client in enumerate(clients):
            def body(client=client):
                scheduler.enter()
                try:
                    client()
                finally:
                    scheduler.leave()

            thread = threading.Thread(target=body)
            thread.start()
            started.append(thread)
            _waiting(scheduler, index + 1)
        scheduler.leave()
        for thread in started:
            thread.join(60)
            assert not thread.is_alive()
    finally:
        threads._scheduler = None
    return scheduler.switches


def two_adds(bugs, seed):
    store = activation_memory.ActivationMemory(bugs=bugs)

    def add(id):
        return lambda: store.add([{"id": id, "cache": kv.DynamicCache()}])

    run_clients(seed, [add("a"), add("b")])
    return store.ids()


def test_the_same_seed_replays_the_same_interleaving():
    def trace_of(seed):
        order = []

        def client(name):
            def run():
                for step in range(4):
                    order.append((name, step))
                    kvcheck_adapter.yield_point("step")
            return run

        run_clients(seed, [client("x"), client("y"), client("z")])
        return order

    first = trace_of(7)
    assert trace_of(7) == first
    assert any(trace_of(seed) != first for seed in range(1, 6))


def test_a_lock_held_across_a_yield_keeps_the_others_out():
    lock = kvcheck_adapter.Lock()
    inside = []

    def client():
        for _ in range(3):
            with lock:
                inside.append(1)
                assert len(inside) == 1, "two clients inside the lock at once"
                kvcheck_adapter.yield_point("inside")
                inside.pop()

    for seed in range(5):
        assert run_clients(seed, [client, client, client]) > 0


def test_the_example_store_keeps_every_entry_of_two_clients():
    for seed in range(12):
        assert sorted(two_adds((), seed)) == ["a", "b"], f"seed {seed}"


def test_the_unlocked_index_loses_an_entry_with_two_clients_and_never_with_one():
    lost = [seed for seed in range(12) if sorted(two_adds(("unlocked_index",), seed)) != ["a", "b"]]
    assert lost, "no seed interleaved the two adds' index updates"
    assert sorted(two_adds(("unlocked_index",), lost[0])) != ["a", "b"]  # the seed replays it
    store = activation_memory.ActivationMemory(bugs=("unlocked_index",))
    for id in ("a", "b"):
        store.add([{"id": id, "cache": kv.DynamicCache()}])
    assert store.ids() == ["a", "b"]


def _frame(message):
    payload = json.dumps(message).encode()
    return len(payload).to_bytes(4, "big") + payload


def _read_frame(stream):
    size = int.from_bytes(stream.read(4), "big")
    return json.loads(stream.read(size))


def test_requests_in_flight_are_answered_by_their_ids():
    import activation_memory_adapter
    from kvcheck_adapter import protocol
    from kvcheck_adapter.adapter import Server

    requests_read, requests_write = os.pipe()
    replies_read, replies_write = os.pipe()
    server = Server(activation_memory_adapter.ActivationMemoryAdapter)
    loop = threading.Thread(target=threads.serve_side_by_side,
                            args=(protocol.Connection(requests_read, replies_write), server.handle, server._switch_out))
    loop.start()
    requests = os.fdopen(requests_write, "wb")
    replies = os.fdopen(replies_read, "rb")
    try:
        requests.write(_frame({"op": "hello", "protocol": protocol.PROTOCOL_VERSION}))
        requests.flush()
        hello = _read_frame(replies)
        assert hello["ok"] and hello["capabilities"]["thread_safe"] is True
        # Each reply names its request: the error of an unknown operation
        # quotes the operation's name.
        count = 8
        for rid in range(1, count + 1):
            requests.write(_frame({"rid": rid, "op": f"no_such_op_{rid}"}))
        requests.flush()
        answered = {}
        for _ in range(count):
            reply = _read_frame(replies)
            answered[reply["rid"]] = reply
        assert sorted(answered) == list(range(1, count + 1))
        for rid, reply in answered.items():
            assert not reply["ok"] and f"'no_such_op_{rid}'" in reply["error"], reply
        assert _shut_down(requests, replies)["ok"]
    finally:
        _close(requests, replies, replies_write, loop)


def _shut_down(requests, replies):
    """Asks the protocol loop to end; its reply."""
    requests.write(_frame({"op": "shutdown"}))
    requests.flush()
    return _read_frame(replies)


def _close(requests, replies, replies_write, loop):
    """The pipes closed and the loop's thread ended."""
    requests.close()
    loop.join(60)
    replies.close()
    os.close(replies_write)
    assert not loop.is_alive()


def _serve_batch(seed, count, pause_before_last=0.0, lone=0, threads_of=None):
    """`count` requests served side by side, sent as one batch (each but
    the last marked "wait", docs/protocol.md section 11b) under a
    scheduler seeded `seed`, after `lone` requests sent one at a time
    (each answered before the next, as the operation level sends them);
    each request yields twice. Returns the order the requests' steps ran
    in, and what had run when the last was sent. `threads_of` (a dict)
    gets each request's thread and the loop's ("loop")."""
    from kvcheck_adapter import protocol

    ran = []
    threads_of = {} if threads_of is None else threads_of

    def handle(request):
        threads_of[request["rid"]] = threading.get_ident()
        for step in range(3):
            ran.append((request["rid"], step))
            threads.yield_point("step")
        return {"ok": True}

    requests_read, requests_write = os.pipe()
    replies_read, replies_write = os.pipe()
    previous = os.environ.get("KVCHECK_THREAD_SEED")
    os.environ["KVCHECK_THREAD_SEED"] = str(seed)
    try:
        loop = threading.Thread(target=threads.serve_side_by_side,
                                args=(protocol.Connection(requests_read, replies_write), handle))
        loop.start()
        threads_of["loop"] = loop.ident
    finally:
        if previous is None:
            del os.environ["KVCHECK_THREAD_SEED"]
        else:
            os.environ["KVCHECK_THREAD_SEED"] = previous
    requests = os.fdopen(requests_write, "wb")
    replies = os.fdopen(replies_read, "rb")
    try:
        for rid in range(count + 1, count + 1 + lone):
            requests.write(_frame({"rid": rid, "op": "step"}))
            requests.flush()
            assert _read_frame(replies)["rid"] == rid
        ran.clear()
        for rid in range(1, count):
            requests.write(_frame({"rid": rid, "wait": True, "op": "step"}))
            requests.flush()
        time.sleep(pause_before_last)
        before_last = list(ran)
        requests.write(_frame({"rid": count, "op": "step"}))
        requests.flush()
        assert sorted(_read_frame(replies)["rid"] for _ in range(count)) == list(range(1, count + 1))
        _shut_down(requests, replies)
    finally:
        _close(requests, replies, replies_write, loop)
    return ran, before_last


def test_a_batch_starts_together_and_its_interleaving_is_the_seeds():
    # Nothing of a batch runs before its last request has come.
    _, before_last = _serve_batch(5, 3, pause_before_last=0.2)
    assert before_last == []
    # The same seed and batch give the same interleaving, whatever order
    # the request threads start in; the seeds give more than one.
    orders = {}
    for seed in (1, 2, 3, 4):
        runs = [_serve_batch(seed, 4)[0] for _ in range(3)]
        assert runs[0] == runs[1] == runs[2], (seed, runs)
        orders[seed] = tuple(runs[0])
    assert len(set(orders.values())) > 1, orders


def test_a_request_alone_runs_on_the_loops_thread_and_draws_as_a_batch_of_one():
    # A request with nothing in flight is no batch to interleave: the loop
    # answers it on its own thread (no hand-off per operation), with the
    # scheduler's same calls: it takes its draw, as its own thread's
    # enter did (the batches after it draw on from there), and the same
    # seed still gives the same interleaving.
    where = {}
    _serve_batch(1, 2, lone=2, threads_of=where)
    assert where[3] == where[4] == where["loop"], where
    assert where[1] != where["loop"] and where[2] != where["loop"], where
    after_lone, alone = {}, {}
    for seed in (1, 2, 3, 4):
        runs = [_serve_batch(seed, 4, lone=3)[0] for _ in range(2)]
        assert runs[0] == runs[1], (seed, runs)
        after_lone[seed], alone[seed] = tuple(runs[0]), tuple(_serve_batch(seed, 4)[0])
    assert after_lone != alone, (after_lone, alone)


def test_kvcheck_gives_the_adapter_its_runs_seed(kvcheck, scratch_dir):
    # The seed of the SDK's schedule is the run's --seed, so that a
    # finding replays (docs/protocol.md section 11a).
    script = os.path.join(scratch_dir, "seeded_adapter.py")
    with open(script, "w") as file:
        file.write(
            "import os, sys\n"
            f"sys.path.insert(0, {os.path.join(SDK, 'examples')!r})\n"
            "import activation_memory_adapter as example\n"
            "class Seeded(example.ActivationMemoryAdapter):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.name = 'seed-' + os.environ.get('KVCHECK_THREAD_SEED', 'unset')\n"
            "example.serve(Seeded)\n")
    environment_seed = os.environ.pop("KVCHECK_THREAD_SEED", None)
    try:
        run = kvcheck("run", "--adapter", script, "--seed", "7", "--property", "stored-immutable", "--cases", "1",
                      "--jobs", "1")
    finally:
        if environment_seed is not None:
            os.environ["KVCHECK_THREAD_SEED"] = environment_seed
    assert run.status == 0, run.stdout + run.stderr
    assert run.report["adapter"] == "seed-7", run.report["adapter"]


def test_kvcheck_run_threads_finds_the_unlocked_index_that_one_client_and_the_operation_level_miss(kvcheck):
    # The store family at the thread level over a process adapter
    # (docs/semantics.md#the-thread-level): several requests in flight, the
    # SDK's schedule seeded by the run; the lost entry is linearizable's.
    from conftest import EXAMPLE
    correct = kvcheck("run", "--threads", "--adapter", EXAMPLE, "--cases", "40")
    assert correct.status == 0, correct.stdout + correct.stderr
    assert correct.result("linearizable")["verdict"] == "pass"
    buggy = f"{EXAMPLE} --bug unlocked_index"
    found = kvcheck("run", "--threads", "--adapter", buggy, "--cases", "100")
    assert found.status == 1, found.stdout + found.stderr
    linearizable = found.result("linearizable")
    assert linearizable["verdict"] == "fail", linearizable
    failure = linearizable["failures"][0]
    assert failure["threads"].startswith("threads lanes="), failure
    assert failure["reproduction"] is None, failure  # replayed alike 3 of 3 times
    replay = kvcheck("replay", failure["trace_file"], "--adapter", buggy)
    assert replay.status == 1 and "replayed alike 3 of 3 times" in replay.stdout, replay.stdout + replay.stderr
    assert kvcheck("replay", failure["trace_file"], "--adapter", EXAMPLE).status == 0
    # Each call atomic (the operation level), or one client: every judged
    # property holds.
    for sequential in (["--lanes", "3", "--property", "linearizable", "--cases", "300"], ["--cases", "60"]):
        missed = kvcheck("run", *sequential, "--adapter", buggy)
        assert missed.status == 0, missed.stdout + missed.stderr
        assert any(p["verdict"] == "pass" for p in missed.report["properties"]), missed.report
