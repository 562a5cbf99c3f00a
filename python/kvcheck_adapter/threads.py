"""A thread-safe adapter's requests served side by side (Adapter.thread_safe;
docs/protocol.md section 11a), one thread per request in flight, under a
seeded cooperative scheduler.

Only the thread holding the scheduler's turn runs the engine's Python
code; it keeps the turn until it reaches a yield point: the start of an
engine call, the acquire of a `Lock`, or `yield_point(name)`. There the
scheduler's random source, seeded by $KVCHECK_THREAD_SEED (0 when unset),
picks which thread waiting for the turn runs next; kvcheck sets it to its
run's seed, and each reset (before each trace) draws again from it. The
same seed and the same requests in flight give the same interleaving; when a request
arrives depends on kvcheck's threads, and the GIL's own switches (a
thread blocked outside a yield point, in C code) are not the scheduler's:
a finding that does not replay is reported flaky with its rate
(docs/semantics.md#reproduction).

    class Store(Adapter):
        thread_safe = True
        def __init__(self):
            self.lock = kvcheck_adapter.Lock()       # yields on acquire
        def add(self, id, cache, metadata):
            with self.lock:
                index = dict(self.index)
                kvcheck_adapter.yield_point("add")   # another request may run here
                ...
"""

from __future__ import annotations

import os
import queue
import random
import threading
from typing import Any, Callable, Dict, List, Optional

from . import protocol as _protocol

# Saves what the running request left in shared state at a switch, and
# gives back a function that puts it back (Server._switch_out).
SaveContext = Callable[[], Callable[[], None]]


class Scheduler:
    """Who holds the turn, and who waits for it."""

    def __init__(self, seed: int, save_context: Optional[SaveContext] = None):
        self._condition = threading.Condition()
        self._seed = seed
        self._random = random.Random(seed)
        self._waiting: List[int] = []  # thread idents, in the order they came to wait
        self._running: Optional[int] = None
        # Each request thread's place in arrival order: the draw is among
        # the waiting threads in that order, whenever each came to wait.
        self._order: Dict[int, int] = {}
        self._arrived = 0
        self._admitted = 0  # requests of a batch dispatched, not yet come to wait
        self._save_context = save_context
        self.switches = 0  # turns handed to another thread

    def restart(self) -> None:
        """Draws again from the seed: at kvcheck's reset before each trace
        (no request runs beside the reset), so that a trace's interleaving
        does not depend on the traces the process served before it, and a
        replay in a fresh process draws the same."""
        with self._condition:
            self._random = random.Random(self._seed)

    def admit(self, count: int) -> List[int]:
        """A batch of `count` requests is dispatched, in the order they
        came: their places in arrival order, one for each one's enter.
        None of them, nor any other thread, gets the turn until all have
        come to wait, so that the draws are among the whole batch in the
        order kvcheck sent it, whatever order the threads start in."""
        with self._condition:
            self._admitted += count
            first = self._arrived + 1
            self._arrived += count
            return list(range(first, first + count))

    def _hand_on(self) -> None:
        """Gives the turn to a waiting thread, drawn from the seeded source
        among the waiting ones in arrival order (the caller holds the
        condition); while a batch is still coming to wait, to nobody."""
        if self._waiting and self._admitted == 0:
            self._waiting.sort(key=self._order.__getitem__)
            self._running = self._waiting.pop(self._random.randrange(len(self._waiting)))
        else:
            self._running = None
        self._condition.notify_all()

    def _await_turn(self, me: int) -> None:
        while self._running != me:
            self._condition.wait()

    def enter(self, order: Optional[int] = None) -> None:
        """A request thread asks for its first turn (`order`: its place
        from admit; None: it comes last)."""
        me = threading.get_ident()
        with self._condition:
            if order is None:
                self._arrived += 1
                order = self._arrived
            else:
                self._admitted -= 1
            self._order[me] = order
            self._waiting.append(me)
            if self._running is None:
                self._hand_on()
            self._await_turn(me)

    def leave(self) -> None:
        """A request thread is done: the turn goes on."""
        with self._condition:
            assert self._running == threading.get_ident(), "leave() by a thread without the turn"
            del self._order[threading.get_ident()]
            self._hand_on()

    def yield_turn(self) -> None:
        """A yield point: the running thread joins the waiting ones and
        the scheduler draws who runs next (maybe itself). A thread that
        does not hold the turn (the protocol's own thread, a thread the
        engine started) passes through."""
        me = threading.get_ident()
        with self._condition:
            if self._running != me:
                return
            if not self._waiting:
                return
            self._waiting.append(me)
            self._hand_on()
            if self._running == me:
                return
            self.switches += 1
            restore = self._save_context() if self._save_context is not None else None
            self._await_turn(me)
        if restore is not None:
            restore()


_scheduler: Optional[Scheduler] = None


def current_scheduler() -> Optional[Scheduler]:
    """The scheduler of the requests being served side by side; None in
    an adapter served one request at a time."""
    return _scheduler


def yield_point(name: str = "") -> None:
    """A point where another request may run (the engine's own choice of
    where a race could be). `name` documents it. Free when the adapter is
    served one request at a time."""
    del name  # named for the reader; the schedule is the seed's
    scheduler = _scheduler
    if scheduler is not None:
        scheduler.yield_turn()


class Lock:
    """A lock the scheduler sees: its acquire is a yield point, and a
    request that finds it held yields until its holder releases it (the
    holder runs meanwhile). Served one request at a time, a plain lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def acquire(self) -> bool:
        yield_point("lock")
        while not self._lock.acquire(blocking=_scheduler is None):
            yield_point("lock held")
        return True

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> "Lock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def thread_seed() -> int:
    """The scheduler's seed: $KVCHECK_THREAD_SEED, else 0."""
    text = os.environ.get("KVCHECK_THREAD_SEED", "0")
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"$KVCHECK_THREAD_SEED is {text!r}: an integer seeds the adapter's thread schedule") from None


def serve_side_by_side(connection, handle: Callable[[Dict[str, Any]], Dict[str, Any]],
                       save_context: Optional[SaveContext] = None) -> None:
    """The protocol loop of a thread-safe adapter: each request carrying a
    request id ("rid") runs on a thread of its own (kept for the next
    request once idle), under the scheduler; its reply carries the same
    id. A request that comes alone (no "wait" before it) with nothing in
    flight runs on the loop's own thread instead, under the same
    scheduler calls: the same draws, no hand-off between threads. A request marked "wait" waits for the next one not so marked:
    that batch starts together (docs/protocol.md section 11b). A request
    without an id (a shutdown) is answered in turn, once the requests in
    flight are done."""
    global _scheduler
    scheduler = Scheduler(thread_seed(), save_context)
    sending = threading.Lock()
    idle: "queue.SimpleQueue[queue.SimpleQueue]" = queue.SimpleQueue()  # each idle worker's inbox
    busy = threading.Semaphore(0)  # released once per request answered
    in_flight = 0

    def run(request: Dict[str, Any], order: int) -> None:
        # A request's turns under the scheduler, then its reply.
        scheduler.enter(order)
        try:
            reply = _protocol.answer(handle, request)
        finally:
            scheduler.leave()
        reply["rid"] = request["rid"]
        with sending:
            connection.send(reply)

    def work(inbox: "queue.SimpleQueue") -> None:
        while True:
            item = inbox.get()
            if item is None:
                return
            run(*item)
            idle.put(inbox)
            busy.release()

    def dispatch(request: Dict[str, Any], order: int) -> None:
        try:
            inbox = idle.get_nowait()
        except queue.Empty:
            inbox = queue.SimpleQueue()
            threading.Thread(target=work, args=(inbox,), daemon=True).start()
        inbox.put((request, order))

    held: List[Dict[str, Any]] = []  # a batch's requests marked "wait": more follow
    _scheduler = scheduler
    try:
        while True:
            request = connection.receive()
            if request is None:
                return
            if "rid" in request:
                held.append(request)
                if request.get("wait") is True:
                    continue
                while in_flight and busy.acquire(blocking=False):
                    in_flight -= 1  # answered since
                if len(held) == 1 and in_flight == 0:
                    # A batch of one with nothing in flight (every request
                    # of the operation level; kvcheck sends nothing more
                    # before its reply, section 11b): answered on this
                    # thread, with the scheduler's same calls (the same
                    # draws), without a hand-off to a request thread.
                    run(request, *scheduler.admit(1))
                    held = []
                    continue
                in_flight += len(held)
                for one, order in zip(held, scheduler.admit(len(held))):
                    dispatch(one, order)
                held = []
                continue
            for _ in range(in_flight):
                busy.acquire()
            in_flight = 0
            reply = _protocol.answer(handle, request)
            with sending:
                connection.send(reply)
            if request.get("op") == "shutdown":
                return
    finally:
        _scheduler = None
