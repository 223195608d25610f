# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""Close a queue instead of feeding it pills: every thread blocked in ``put`` or ``get`` wakes.

TL;DR:
    ``q.shutdown()`` on a `ClosableQueue` (3.13's ``Queue.shutdown``, back-ported to 3.11
    and 3.12) makes ``put`` raise `ShutDown` at once and ``get`` raise it once the queue is
    empty; ``shutdown(immediate=True)`` also empties it, and `shutdown_and_drain` empties it
    and hands the items back. `ConsumerPool` runs consumer threads stopped that way:
    ``start()``, then ``stop(timeout)`` (or a ``with`` block) returns a `PoolReport`.

Guarantees:
    * Once ``shutdown()`` returns, no ``put`` succeeds and every blocked putter raises
      `ShutDown`; queued items are still handed out in order (not after ``immediate=True``,
      which counts a ``task_done()`` per removed item), then every ``get`` raises it.
    * `ConsumerPool` follows the lifecycle contract: ``start()`` is all or nothing;
      ``stop()`` keeps to its budget, never raises for unfinished work, never blocks on its
      own thread, and once one call has completed every later call returns its report.
      Every item the pool accepted is processed, failed (logged) or listed as discarded; a
      consumer killed by a `BaseException` is logged at CRITICAL, and the last one to go
      shuts the queue so no producer hangs.
    * A Ctrl-C leaving its ``with`` block is logged with the budget the stop may take; a
      second one stops now (``stop(0)``) and ends in one KeyboardInterrupt, not two.

Python:
    3.11+, stdlib only; checked on 3.11.7, 3.12.1 and 3.13.0 (on 3.13 `ShutDown` is ``queue``'s).

Docs: docs/patterns/closable_queue.md
"""

from __future__ import annotations

import logging
import math
import queue
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, Self, TypeVar

__all__ = [
    "ClosableQueue",
    "ConsumerPool",
    "PoolReport",
    "ShutDown",
    "put_until_shutdown",
    "shutdown_and_drain",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

if sys.version_info >= (3, 13):
    from queue import ShutDown

    class ClosableQueue(queue.Queue[T]):
        """`queue.Queue` itself, which has ``shutdown()`` since 3.13: drop the back-port freely."""
else:

    class ShutDown(Exception):
        """Raised by ``put`` on a shut-down queue, and by ``get`` once it is also empty."""

    def _timeout_at(timeout: float | None) -> float | None:
        if timeout is None:
            return None
        if timeout < 0:
            raise ValueError("'timeout' must be a non-negative number")
        return time.monotonic() + timeout

    def _wait_or_raise(
        condition: threading.Condition, deadline: float | None, timed_out: type[Exception]
    ) -> None:
        if deadline is None:
            condition.wait()
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise timed_out
        condition.wait(remaining)

    class ClosableQueue(queue.Queue[T]):
        """A `queue.Queue` with 3.13's ``shutdown()``; every other method is the base class's."""

        def __init__(self, maxsize: int = 0) -> None:
            super().__init__(maxsize)
            # Set by shutdown() under self.mutex; put() and get() check it after every wake-up.
            self.is_shutdown = False

        def put(self, item: T, block: bool = True, timeout: float | None = None) -> None:
            """`queue.Queue.put`, but `ShutDown` (before `queue.Full` or `ValueError`) once shut."""
            with self.not_full:
                if self.is_shutdown:
                    raise ShutDown
                if self.maxsize > 0:
                    if not block:
                        if self._qsize() >= self.maxsize:
                            raise queue.Full
                    else:
                        deadline = _timeout_at(timeout)
                        while self._qsize() >= self.maxsize:
                            _wait_or_raise(self.not_full, deadline, queue.Full)
                            if self.is_shutdown:  # woken by shutdown(), or shut while asleep
                                raise ShutDown
                self._put(item)
                self.unfinished_tasks += 1
                self.not_empty.notify()

        def get(self, block: bool = True, timeout: float | None = None) -> T:
            """`queue.Queue.get`, but `ShutDown` (no `queue.Empty`, no wait) once shut and empty."""
            with self.not_empty:
                if self.is_shutdown and not self._qsize():
                    raise ShutDown
                if not block:
                    if not self._qsize():
                        raise queue.Empty
                else:
                    deadline = _timeout_at(timeout)
                    while not self._qsize():
                        _wait_or_raise(self.not_empty, deadline, queue.Empty)
                        if self.is_shutdown and not self._qsize():
                            raise ShutDown
                item = self._get()
                self.not_full.notify()
                return item

        def shutdown(self, immediate: bool = False) -> None:
            """Close the queue and wake every blocked caller; ``immediate=True`` also empties it."""
            with self.mutex:
                self.is_shutdown = True
                if immediate:
                    while self._qsize():
                        self._get()
                        self.unfinished_tasks = max(0, self.unfinished_tasks - 1)
                    self.all_tasks_done.notify_all()
                self.not_empty.notify_all()
                self.not_full.notify_all()


def shutdown_and_drain(q: ClosableQueue[T]) -> list[T]:
    """``q.shutdown(immediate=True)`` handing back the items; each is here or got, never both."""
    q.shutdown()  # from here on nothing can be added, so the loop below ends
    removed: list[T] = []
    while True:
        try:
            removed.append(q.get_nowait())
        except ShutDown:
            return removed
        q.task_done()


def put_until_shutdown(q: ClosableQueue[T], items: Iterable[T]) -> int:
    """Put each of ``items`` on ``q`` until `ShutDown` (which wakes a full ``put``); count them."""
    delivered = 0
    for item in items:
        try:
            q.put(item)
        except ShutDown:
            logger.warning("queue shut down: %d item(s) delivered, %r refused", delivered, item)
            return delivered
        delivered += 1
    return delivered


# --- a pool of consumer threads, stopped by closing their queue ------------------------------


@dataclass(frozen=True)
class PoolReport(Generic[T]):
    """What a `ConsumerPool` had done when its ``stop()`` returned.

    Attributes:
        terminated: every consumer thread had ended.
        still_running: names of the consumer threads not ended at the deadline.
        processed: items the handler returned from normally.
        failed: items the handler raised on (each one logged with its traceback).
        discarded: items queued but never handed to the handler, in queue order.
        elapsed: seconds the stop took.
    """

    terminated: bool
    still_running: tuple[str, ...]
    processed: int
    failed: int
    discarded: tuple[T, ...]
    elapsed: float

    def __post_init__(self) -> None:
        if self.terminated and self.still_running:
            raise ValueError(f"terminated=True with still_running={self.still_running!r}")


class ConsumerPool(Generic[T]):
    """Consumer threads that call ``handler(item)`` for each item, stopped by closing the queue.

    Items put before ``start()`` wait for the consumers. A ``stop()`` while another runs waits
    for it within its own budget, else returns a provisional report. From a consumer it is a
    request: the queue closes; the last consumer to end records the report. From a signal
    handler it reports at once (in a queue method, a ``<name>-stopper`` thread does the stop).
    """

    def __init__(
        self,
        handler: Callable[[T], object],
        *,
        consumers: int = 2,
        maxsize: int = 0,
        name: str = "consumer",
        stop_timeout: float = 5.0,
    ) -> None:
        # The same checks as async_queue.AsyncConsumerPool's; tests/test_copies.py pins them.
        if consumers < 1:
            raise ValueError(f"consumers must be at least 1, got {consumers!r}")
        if maxsize < 0:
            raise ValueError(f"maxsize must be >= 0, got {maxsize!r}")
        self.stop_timeout = _seconds(stop_timeout, "stop_timeout")
        self._handler = handler
        self._consumers = consumers
        self._name = name
        self._queue: ClosableQueue[T] = ClosableQueue(maxsize)
        # Guards the fields below, also across each Thread.start(); reentrant for signal handlers.
        self._lock = threading.RLock()
        self._threads: list[threading.Thread] = []
        # Set as each consumer's target ends: stop() reports from these (is_alive() lies, gh-90882).
        self._ended: dict[threading.Thread, threading.Event] = {}
        self._alive = 0  # consumers launched and not yet ended
        self._started = False
        self._starting = False  # start() is still launching consumers
        self._closed = False
        self._processed = self._failed = 0
        self._discarded: list[T] = []
        self._stopper: threading.Thread | None = None  # the thread running the first stop()
        self._requested: float | None = None  # when a consumer asked the pool to stop
        self._handed_off = False  # a signal handler started the <name>-stopper thread
        self._in_stop: set[int] = set()  # threads in stop(); a set, not a lock: atomic
        self._stopped = threading.Event()  # set once _report is final
        self._report: PoolReport[T] | None = None

    @property
    def queue(self) -> ClosableQueue[T]:
        """The queue producers put on; ``put`` raises `ShutDown` once the pool stops."""
        return self._queue

    @property
    def threads(self) -> list[threading.Thread]:
        """The consumer threads (empty before ``start()``)."""
        with self._lock:
            return list(self._threads)

    def put(self, item: T, timeout: float | None = None) -> None:
        """Queue ``item`` within ``timeout`` (else `queue.Full`); `ShutDown` once the pool stops."""
        deadline = _deadline(_seconds(timeout, "timeout", allow_none=True))
        while True:  # in waits of at most TIMEOUT_MAX: 1e10 is no OverflowError
            try:
                self._queue.put(item, timeout=_left(deadline))
            except queue.Full:
                if time.monotonic() >= deadline:
                    raise
            else:
                return

    def start(self) -> Self:
        """Start the consumers, all or nothing; return the pool. Once only, else `RuntimeError`."""
        with self._lock:
            if self._started or self._closed:
                raise RuntimeError(f"{self._name}: a pool can be started only once")
            self._started = True
            self._starting = True
        try:
            for i in range(self._consumers):
                if not self._launch(f"{self._name}-{i}"):
                    break  # stopped meanwhile
        except BaseException as exc:
            _start_failed(self, exc)
            raise
        self._starting_done()
        return self

    def stop(self, timeout: float | None = None, *, immediate: bool = False) -> PoolReport[T]:
        """Close the queue, let the consumers drain it up to ``timeout`` (None: ``stop_timeout``).

        What is left then, or at once with ``immediate=True``, is discarded and reported.
        """
        budget = self.stop_timeout if timeout is None else _seconds(timeout, "timeout")
        return _stop_from_anywhere(self, budget, immediate=immediate)

    def _stop_once(self, budget: float, start: float, *, immediate: bool) -> PoolReport[T]:
        """Refuse new work, let the consumers drain until the deadline, discard the rest."""
        self._close(immediate=immediate)
        if not self._wait_ended(start + budget) and not immediate:
            self._discard()
            report = self._snapshot(start)
            logger.error(
                "%s: stop(%.3g) ran out of time: %d item(s) discarded, still running: %s",
                self._name,
                budget,
                len(report.discarded),
                ", ".join(report.still_running),
            )
            return report
        return self._snapshot(start)

    def __enter__(self) -> Self:
        """Start the pool unless running: ``with pool:`` and ``with pool.start():`` both work."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self._name}: a stopped pool cannot be entered")
            running = self._started
        return self if running else self.start()

    # The same code as in bulkhead, daemon_threads and supervisor; pinned by tests/test_copies.py.
    def __exit__(self, *exc_info: object) -> None:
        """`stop`; with an exception (a Ctrl-C) on its way out, say so; Ctrl-C again: stop now."""
        exc_type = exc_info[0] if exc_info else None
        if exc_type is None:
            self.stop()
            return
        why = getattr(exc_type, "__name__", exc_type)
        try:  # logged inside the try: a second Ctrl-C may come at any moment
            logger.warning(
                "%s: %s: stopping, waiting up to %.3gs (Ctrl-C again: stop now)",
                self._name,
                why,
                self.stop_timeout,
            )
            report = self.stop()
        except KeyboardInterrupt:  # a second Ctrl-C: a stop with no time left, one line
            report = self.stop(0)
            logger.warning(
                "%s: interrupted: stopping now: still running: %s",
                self._name,
                ", ".join(report.still_running) or "nothing",
            )
            raise KeyboardInterrupt from None  # one traceback, not two chained
        logger.warning(
            "%s: stopped after %s: terminated=%s, still running: %s",
            self._name,
            why,
            report.terminated,
            ", ".join(report.still_running) or "nothing",
        )

    def _consume(self) -> None:
        """Take items until the queue is shut down and empty; no pill, no stop flag."""
        while True:
            try:
                item = self._queue.get()
            except ShutDown:
                return
            try:
                self._handle(item)
            finally:
                self._queue.task_done()

    def _handle(self, item: T) -> None:
        ok = False
        try:
            self._handler(item)
            ok = True
        except Exception:
            logger.exception("%s: handler failed on %r; going on", self._name, item)
        finally:
            with self._lock:
                if ok:
                    self._processed += 1
                else:
                    self._failed += 1

    def _run(self, slot: _Slot, ended: threading.Event) -> None:
        """Consumer thread body: consume; the last one out closes the queue and may report."""
        last = False
        try:
            with slot.lock:  # waits until start() knows whether Thread.start() succeeded
                if slot.cancelled:
                    return
            try:
                self._consume()
            except BaseException:  # SystemExit and the like from a handler: never die silently
                logger.critical("%s died", threading.current_thread().name, exc_info=True)
            finally:
                with self._lock:
                    self._alive -= 1
                    last = self._alive == 0 and not self._starting
                if last:  # normally a no-op; if it died, shut the queue so no put() hangs
                    self._discard()
        finally:
            ended.set()
            if last:
                _finish_request(self)

    def _launch(self, name: str) -> bool:
        slot = _Slot()
        ended = threading.Event()
        thread = threading.Thread(target=self._run, args=(slot, ended), name=name)
        with self._lock, slot.lock:
            if self._closed:
                return False
            self._alive += 1
            self._threads.append(thread)
            self._ended[thread] = ended
            try:
                thread.start()
            except BaseException:
                slot.cancelled = True  # it needs slot.lock: it has not begun, and never will
                self._alive -= 1
                if not thread.is_alive():  # never started: nothing to wait for or report
                    self._threads.remove(thread)
                    del self._ended[thread]
                raise
        return True

    def _starting_done(self) -> None:
        with self._lock:  # the launch phase ends; if every consumer died, act as the last one
            self._starting = False
            nobody_left = self._alive == 0
        if nobody_left:
            self._discard()

    def _close(self, *, immediate: bool) -> None:
        with self._lock:
            self._closed = True
            nobody = not self._threads
        if immediate or nobody:  # without consumers, nobody would ever take the rest
            self._discard()
        else:
            self._queue.shutdown()

    def _wait_ended(self, deadline: float) -> bool:
        with self._lock:
            consumers = list(self._ended.items())
        all_ended = True
        for thread, ended in consumers:
            if _wait(ended, deadline):
                thread.join(_left(deadline))  # its target has returned: a short join
            else:
                all_ended = False
        return all_ended

    def _discard(self) -> None:
        dropped = shutdown_and_drain(self._queue)
        if dropped:
            with self._lock:
                self._discarded.extend(dropped)
            logger.warning("%s: discarded %d queued item(s)", self._name, len(dropped))

    def _snapshot(self, start: float) -> PoolReport[T]:
        with self._lock:
            still_running = tuple(t.name for t, ended in self._ended.items() if not ended.is_set())
            return PoolReport(
                terminated=not still_running,
                still_running=still_running,
                processed=self._processed,
                failed=self._failed,
                discarded=tuple(self._discarded),
                elapsed=time.monotonic() - start,
            )


@dataclass(slots=True, eq=False)
class _Slot:
    """Held by ``_launch`` across ``Thread.start()``, taken by the consumer before anything."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    cancelled: bool = False  # its Thread.start() failed: the consumer returns if it runs


# --- the lifecycle contract: seconds, deadlines, who may stop, the stopper hand-off ----------


# Seconds and deadlines: the same code in every pattern module, pinned by tests/test_copies.py.
def _seconds(value: object, name: str, *, allow_none: bool = False) -> float:
    if value is None and allow_none:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return math.inf if value > sys.float_info.max else float(value)


def _deadline(seconds: float) -> float:
    return time.monotonic() + seconds


def _left(deadline: float) -> float:
    return min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)


def _wait(event: threading.Event, deadline: float) -> bool:
    while not event.wait(_left(deadline)):
        if time.monotonic() >= deadline:
            return False
    return True


def _start_failed(pool: ConsumerPool[Any], exc: BaseException) -> None:
    """All or nothing: stop the consumers a failed start() launched, within stop_timeout."""
    pool._starting_done()
    logger.warning("%s: start() failed part-way (%r); stopping the rest", pool._name, exc)
    pool._close(immediate=True)
    pool._wait_ended(_deadline(pool.stop_timeout))


def _stop_from_anywhere(pool: ConsumerPool[T], budget: float, *, immediate: bool) -> PoolReport[T]:
    """Run ``pool._stop_once`` once, whoever calls; never block on the calling thread itself."""
    start = time.monotonic()
    me = threading.get_ident()
    if me in pool._in_stop:  # a signal handler inside this thread's stop(): never block
        return pool._snapshot(start)
    try:  # added inside the try: a Ctrl-C here cannot leave this thread marked inside
        pool._in_stop.add(me)
        return _stop(pool, budget, start, immediate=immediate)
    finally:
        pool._in_stop.discard(me)


def _stop(pool: ConsumerPool[T], budget: float, start: float, *, immediate: bool) -> PoolReport[T]:
    """Sort the callers: a consumer's call is a request, a handler's hands off, one stops."""
    current = threading.current_thread()
    with pool._lock:
        if pool._report is not None:
            return pool._report
        if current in pool._ended:  # a consumer: a request, it cannot wait for itself
            pool._closed = True
            if pool._requested is None:
                pool._requested = start
            request = True
        elif _inside(pool._queue):  # a signal handler that may hold the queue's lock
            pool._closed = True
            _hand_off(pool, budget, immediate=immediate)
            return pool._snapshot(start)
        else:
            request = False
            first = pool._stopper is None
            if first:
                pool._stopper = current
    if request:
        pool._close(immediate=immediate)
        return pool._snapshot(start)
    if not first:  # another thread's stop() is running: wait for it, within our budget
        if _wait(pool._stopped, start + budget) and pool._report is not None:
            return pool._report
        return pool._snapshot(start)
    try:
        report = pool._stop_once(budget, start, immediate=immediate)
    except BaseException:  # Ctrl-C mid-stop: let a later stop() do it all again
        with pool._lock:
            pool._stopper = None
        raise
    return _record(pool, report)


def _hand_off(pool: ConsumerPool[Any], budget: float, *, immediate: bool) -> None:
    """Start ``<name>-stopper`` to run the stop; called with ``_lock`` held, never blocks."""
    if not pool._handed_off:
        pool._handed_off = True
        name, kwargs = f"{pool._name}-stopper", {"immediate": immediate}
        stopper = threading.Thread(target=pool.stop, args=(budget,), kwargs=kwargs, name=name)
        try:
            stopper.start()
        except RuntimeError:
            pool._handed_off = False
            logger.exception("%s: cannot hand the stop to a thread; stop() again", pool._name)


def _record(pool: ConsumerPool[T], report: PoolReport[T]) -> PoolReport[T]:
    with pool._lock:
        if pool._report is None:
            pool._report = report
        final = pool._report
    pool._stopped.set()
    return final


def _finish_request(pool: ConsumerPool[Any]) -> None:
    """The last consumer is gone: if one of them asked for the stop, record its report."""
    with pool._lock:
        if pool._requested is None or pool._stopper is not None or pool._report is not None:
            return  # no request, or a stop() from outside is running and will record
        report = pool._snapshot(pool._requested)
    _record(pool, report)


def _inside(q: queue.Queue[Any]) -> bool:
    """Is this thread in a method of ``q`` or its conditions (maybe holding ``q.mutex``)?"""
    guarded = (q, q.not_empty, q.not_full, q.all_tasks_done)
    codes = {
        f.__code__
        for cls in (*type(q).__mro__, threading.Condition)
        for f in vars(cls).values()
        if isinstance(f, types.FunctionType)
    }
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code in codes and any(frame.f_locals.get("self") is g for g in guarded):
            return True
        frame = frame.f_back
    return False
