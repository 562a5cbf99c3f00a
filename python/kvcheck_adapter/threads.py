"""A thread-safe adapter's requests served side by side (Adapter.thread_safe;
docs/protocol.md section 11a), one thread per request in flight, under a
seeded cooperative scheduler.

Only the thread holding the scheduler's turn runs the engine's Python
code; it keeps the turn until it reaches a yield point: the start of an
engine call, the acquire of a `Lock`, or `yield_point(name)`. There the
scheduler's random source, seeded by $KVCHECK_THREAD_SEED (0 when unset),
picks which thread waiting for the turn runs next. The same seed and the
same requests in flight give the same interleaving; when a request
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
        self._random = random.Random(seed)
        self._waiting: List[int] = []  # thread idents, in the order they came to wait
        self._running: Optional[int] = None
        self._save_context = save_context
        self.switches = 0  # turns handed to another thread

    def _hand_on(self) -> None:
        """Gives the turn to a waiting thread, drawn from the seeded source
        (the caller holds the condition)."""
        if self._waiting:
            self._running = self._waiting.pop(self._random.randrange(len(self._waiting)))
        else:
            self._running = None
        self._condition.notify_all()

    def _await_turn(self, me: int) -> None:
        while self._running != me:
            self._condition.wait()

    def enter(self) -> None:
        """A request thread asks for its first turn."""
        me = threading.get_ident()
        with self._condition:
            self._waiting.append(me)
            if self._running is None:
                self._hand_on()
            self._await_turn(me)

    def leave(self) -> None:
        """A request thread is done: the turn goes on."""
        with self._condition:
            assert self._running == threading.get_ident(), "leave() by a thread without the turn"
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
    id. A request without one (a shutdown) is answered in turn, once the
    requests in flight are done."""
    global _scheduler
    scheduler = Scheduler(thread_seed(), save_context)
    sending = threading.Lock()
    idle: "queue.SimpleQueue[queue.SimpleQueue]" = queue.SimpleQueue()  # each idle worker's inbox
    busy = threading.Semaphore(0)  # released once per request answered
    in_flight = 0

    def work(inbox: "queue.SimpleQueue") -> None:
        while True:
            request = inbox.get()
            if request is None:
                return
            scheduler.enter()
            try:
                reply = _protocol.answer(handle, request)
            finally:
                scheduler.leave()
            reply["rid"] = request["rid"]
            with sending:
                connection.send(reply)
            idle.put(inbox)
            busy.release()

    def dispatch(request: Dict[str, Any]) -> None:
        try:
            inbox = idle.get_nowait()
        except queue.Empty:
            inbox = queue.SimpleQueue()
            threading.Thread(target=work, args=(inbox,), daemon=True).start()
        inbox.put(request)

    _scheduler = scheduler
    try:
        while True:
            request = connection.receive()
            if request is None:
                return
            if "rid" in request:
                in_flight += 1
                dispatch(request)
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
