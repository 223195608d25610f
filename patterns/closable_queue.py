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
      `ShutDown`; queued items are still handed out in order (not after ``immediate=True``),
      then every ``get``, blocked or not, raises `ShutDown`.
    * ``shutdown(immediate=True)`` counts a ``task_done()`` per removed item (never below
      zero) and wakes ``join()``.
    * `ConsumerPool` follows the lifecycle contract: ``start()`` is all or nothing;
      ``stop()`` is bounded by its budget, never raises for unfinished work, is safe from
      any thread (a handler, a signal handler, while ``start()`` runs), and returns the
      same report every time. Every item the pool accepted is processed, failed (logged)
      or listed as discarded; a consumer killed by a `BaseException` is logged at CRITICAL,
      and when the last one is gone the queue is shut so that no producer hangs.

Python:
    3.11+, standard library only; checked on 3.11.7, 3.12.1 and 3.13.0. On 3.13 `ShutDown`
    *is* ``queue.ShutDown`` and `ClosableQueue` adds nothing to `queue.Queue`.

Docs: docs/patterns/closable_queue.md
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, Self, TypeVar

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
        """`queue.Queue` itself: since Python 3.13 it has ``shutdown()`` and ``is_shutdown``.

        This subclass adds nothing, so code written against it behaves exactly like the
        standard library and keeps working when the back-port is deleted.
        """

else:

    class ShutDown(Exception):
        """Raised by ``put`` on a shut-down queue, and by ``get`` once it is also empty.

        The same class as ``queue.ShutDown`` on Python 3.13; here, a back-port.
        """

    def _deadline(timeout: float | None) -> float | None:
        """Turn a blocking call's ``timeout`` into a `time.monotonic` deadline (None: never)."""
        if timeout is None:
            return None
        if timeout < 0:
            raise ValueError("'timeout' must be a non-negative number")
        return time.monotonic() + timeout

    def _wait(
        condition: threading.Condition, deadline: float | None, timed_out: type[Exception]
    ) -> None:
        """Wait on ``condition`` until notified or ``deadline``; raise ``timed_out`` after it."""
        if deadline is None:
            condition.wait()
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise timed_out
        condition.wait(remaining)

    class ClosableQueue(queue.Queue[T]):
        """A `queue.Queue` with Python 3.13's ``shutdown()``, for Python 3.11 and 3.12.

        Until ``shutdown()`` is called it is an ordinary `queue.Queue`. The rules after it
        are listed on ``shutdown``; every other method (``task_done``, ``join``, ``qsize``,
        ``put_nowait``, ``get_nowait``...) is the base class's and follows them through
        ``put`` and ``get``.
        """

        def __init__(self, maxsize: int = 0) -> None:
            super().__init__(maxsize)
            # Set once, by shutdown(), under self.mutex; put() and get() read it under the
            # same lock, after every wake-up. The base class's conditions do the waiting:
            # putters wait on not_full, getters on not_empty, join() on all_tasks_done, and
            # shutdown() notifies all of them. A public attribute, as in 3.13.
            self.is_shutdown = False

        def put(self, item: T, block: bool = True, timeout: float | None = None) -> None:
            """Put ``item`` in the queue as `queue.Queue.put` does; raise `ShutDown` once shut down.

            A thread blocked here on a full queue when ``shutdown()`` is called wakes and
            raises `ShutDown`; its item is not added. `ShutDown` wins over `queue.Full`
            and over a negative ``timeout``'s `ValueError`.
            """
            with self.not_full:
                if self.is_shutdown:
                    raise ShutDown
                if self.maxsize > 0:
                    if not block:
                        if self._qsize() >= self.maxsize:
                            raise queue.Full
                    else:
                        deadline = _deadline(timeout)
                        while self._qsize() >= self.maxsize:
                            _wait(self.not_full, deadline, queue.Full)
                            if self.is_shutdown:  # woken by shutdown(), or shut while asleep
                                raise ShutDown
                self._put(item)
                self.unfinished_tasks += 1
                self.not_empty.notify()

        def get(self, block: bool = True, timeout: float | None = None) -> T:
            """Remove and return an item, as `queue.Queue.get` does; raise `ShutDown` when closed.

            After ``shutdown()`` the items still queued are returned as usual; once the
            queue is empty (at once after ``shutdown(immediate=True)``) every call, and
            every thread blocked here, raises `ShutDown` instead of `queue.Empty` or
            waiting.
            """
            with self.not_empty:
                if self.is_shutdown and not self._qsize():
                    raise ShutDown
                if not block:
                    if not self._qsize():
                        raise queue.Empty
                else:
                    deadline = _deadline(timeout)
                    while not self._qsize():
                        _wait(self.not_empty, deadline, queue.Empty)
                        if self.is_shutdown and not self._qsize():
                            raise ShutDown
                item = self._get()
                self.not_full.notify()
                return item

        def shutdown(self, immediate: bool = False) -> None:
            """Close the queue: ``put`` raises `ShutDown` from now on, and blocked callers wake.

            With ``immediate=False`` the items already queued can still be taken with
            ``get``, which raises `ShutDown` once the queue is empty. With
            ``immediate=True`` the queue is emptied now, ``unfinished_tasks`` drops by the
            number of items removed (never below zero), and ``join()`` is woken: it
            returns unless items taken earlier still await their ``task_done()``.
            ``task_done()`` itself works as before. Calling it again is harmless, and
            ``shutdown(immediate=True)`` after a plain one empties what is left.
            """
            with self.mutex:
                self.is_shutdown = True
                if immediate:
                    removed = 0
                    while self._qsize():
                        self._get()
                        removed += 1
                    # As if a consumer had called task_done() for each removed item.
                    self.unfinished_tasks = max(0, self.unfinished_tasks - removed)
                    self.all_tasks_done.notify_all()
                # Every waiter re-checks its loop condition and finds is_shutdown set.
                self.not_empty.notify_all()
                self.not_full.notify_all()


def shutdown_and_drain(q: ClosableQueue[T]) -> list[T]:
    """Shut ``q`` down and return the items it still held, each counted as done.

    Ends in the state ``q.shutdown(immediate=True)`` leaves, but hands the dropped items
    back, in queue order. It closes the queue first, so no ``put`` slips in while it
    empties it; an item a consumer takes meanwhile is either returned here or got by the
    consumer, never both, never neither.
    """
    q.shutdown()  # from here on nothing can be added, so the loop below ends
    removed: list[T] = []
    while True:
        try:
            removed.append(q.get_nowait())
        except ShutDown:
            return removed
        q.task_done()


def put_until_shutdown(q: ClosableQueue[T], items: Iterable[T]) -> int:
    """Put every item of ``items`` on ``q``, stopping at `ShutDown`; return how many were put.

    A producer blocked on a full queue whose consumers are gone is woken by ``shutdown()``
    and returns instead of waiting forever. The refused item and the ones after it are not
    put; an iterator's later items stay unread.
    """
    delivered = 0
    for item in items:
        try:
            q.put(item)
        except ShutDown:
            logger.warning("queue shut down: %d item(s) delivered, %r refused", delivered, item)
            return delivered
        delivered += 1
    return delivered


@dataclass(frozen=True)
class PoolReport(Generic[T]):
    """What a `ConsumerPool` had done when its ``stop()`` returned.

    Attributes:
        terminated: every consumer thread had ended.
        still_running: names of the consumer threads still alive at the deadline.
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


class _Slot:
    """The hand-shake between start() and one consumer whose Thread.start() may fail.

    ``_launch`` holds ``lock`` across ``Thread.start()``; the consumer takes it before doing
    anything. So when start() sees ``Thread.start()`` fail, the consumer cannot have begun,
    and setting ``cancelled`` makes it return at once if it runs at all.
    """

    __slots__ = ("cancelled", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cancelled = False


class ConsumerPool(Generic[T]):
    """Consumer threads that call ``handler(item)`` for each item, stopped by closing the queue.

    Items can be put before ``start()``; they wait for the consumers. Stopping a pool that
    was never started discards what was queued, since no consumer will ever take it.
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
        if consumers < 1:
            raise ValueError(f"consumers must be at least 1, got {consumers!r}")
        if maxsize < 0:
            raise ValueError(f"maxsize must be >= 0, got {maxsize!r}")
        if stop_timeout < 0:
            raise ValueError(f"stop_timeout must be >= 0, got {stop_timeout!r}")
        self._handler = handler
        self._consumers = consumers
        self._name = name
        self.stop_timeout = stop_timeout
        self._queue: ClosableQueue[T] = ClosableQueue(maxsize)
        # Guards every field below. Held by consumers to count an item and to note their
        # exit, by start() across each Thread.start() (so a stop() from another thread sees
        # a consumer either started and listed, or not launched at all), and by stop().
        # Never held while a handler runs, while blocking on the queue, or while joining.
        # Reentrant so that a stop() from a signal handler landing while the main thread
        # holds it does not deadlock; that stop() returns on its budget and names the
        # consumers it could not wait for (they need this lock to count).
        self._lock = threading.RLock()
        self._threads: list[threading.Thread] = []
        self._alive = 0  # consumers launched and not yet ended
        self._started = False
        self._starting = False  # start() is still launching consumers
        self._closed = False
        self._processed = 0
        self._failed = 0
        self._discarded: list[T] = []
        self._stopper: threading.Thread | None = None  # the thread running the first stop()
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
        """Queue ``item`` for the consumers.

        Raises:
            ShutDown: the pool is stopping or stopped.
            queue.Full: the queue is bounded and stayed full for ``timeout`` seconds.
        """
        self._queue.put(item, timeout=timeout)

    def start(self) -> Self:
        """Start the consumer threads; return the pool. All or nothing.

        If a consumer cannot be started (``RuntimeError: can't start new thread``, or a
        `KeyboardInterrupt` landing in here), the consumers already running are stopped as
        by ``stop(immediate=True)`` within ``stop_timeout`` and the error propagates. A
        ``stop()`` that arrives while this runs wins: no further consumer is started.

        Raises:
            RuntimeError: the pool was started or stopped before.
        """
        with self._lock:
            if self._started or self._closed:
                raise RuntimeError(f"{self._name}: a pool can be started only once")
            self._started = True
            self._starting = True
        try:
            for i in range(self._consumers):
                if not self._launch(f"{self._name}-{i}"):
                    break
        except BaseException as exc:
            self._starting_done()
            logger.warning("%s: start() failed part-way (%r); stopping the rest", self._name, exc)
            self._close(immediate=True, deadline=time.monotonic() + self.stop_timeout)
            raise
        self._starting_done()
        return self

    def _launch(self, name: str) -> bool:
        """Start one consumer and list it; False if the pool was stopped meanwhile."""
        slot = _Slot()
        thread = threading.Thread(target=self._run, args=(slot,), name=name)
        with self._lock, slot.lock:
            if self._closed:
                return False
            self._alive += 1
            self._threads.append(thread)
            try:
                thread.start()
            except BaseException:
                # The consumer has not begun (it needs slot.lock) and now never will.
                slot.cancelled = True
                self._alive -= 1
                if not thread.is_alive():  # never started: nothing to join or report
                    self._threads.remove(thread)
                raise
        return True

    def _starting_done(self) -> None:
        """End the launch phase; if every consumer already died, act as the last one would."""
        with self._lock:
            self._starting = False
            nobody_left = self._alive == 0
        if nobody_left:
            self._discard()

    def stop(self, timeout: float | None = None, *, immediate: bool = False) -> PoolReport[T]:
        """Shut the queue down, wait up to ``timeout`` for the consumers, and report.

        ``immediate=False``: the consumers drain the queue until the deadline; what is
        still queued then is discarded. ``immediate=True``: what is queued is discarded
        now, and each consumer ends after its current item. ``timeout=None`` means
        ``stop_timeout``. Idempotent: every later call returns the first call's report; a
        call made while another thread is stopping the pool waits for it within its own
        budget and returns a provisional report if that runs out.
        """
        budget = self.stop_timeout if timeout is None else timeout
        if budget < 0:
            raise ValueError(f"timeout must be None or >= 0, got {timeout!r}")
        start = time.monotonic()
        current = threading.current_thread()
        with self._lock:
            if self._report is not None:
                return self._report
            owner = self._stopper is None
            if owner:
                self._stopper = current
            waits = self._stopper is not current
        if not owner:  # another stop() is running; on this very thread, do not wait for it
            if waits and self._stopped.wait(budget) and self._report is not None:
                return self._report
            return self._snapshot(start, self.threads)
        try:
            report = self._stop_once(budget, start, immediate=immediate)
        except BaseException:  # Ctrl-C mid-stop: let a later stop() do it all again
            with self._lock:
                self._stopper = None
            raise
        with self._lock:
            self._report = report
        self._stopped.set()
        return report

    def _stop_once(self, budget: float, start: float, *, immediate: bool) -> PoolReport[T]:
        deadline = start + budget
        threads = self._close(immediate=immediate, deadline=deadline)
        report = self._snapshot(start, threads)
        if not report.terminated and not immediate:
            self._close(immediate=True, deadline=deadline)
            report = self._snapshot(start, threads)
            logger.error(
                "%s: stop(%.3g) ran out of time: %d item(s) discarded, still running: %s",
                self._name,
                budget,
                len(report.discarded),
                ", ".join(report.still_running),
            )
        return report

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _close(self, *, immediate: bool, deadline: float) -> list[threading.Thread]:
        """Refuse new work, discard or let drain, join until ``deadline``; return the threads."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        if immediate or not threads:  # without consumers, nobody would ever take the rest
            self._discard()
        else:
            self._queue.shutdown()
        current = threading.current_thread()
        for thread in threads:
            # A thread whose start() failed is listed too; only a started one can be joined.
            if thread is not current and thread.is_alive():
                thread.join(max(0.0, deadline - time.monotonic()))
        return threads

    def _snapshot(self, start: float, threads: list[threading.Thread]) -> PoolReport[T]:
        with self._lock:
            still_running = tuple(t.name for t in threads if t.is_alive())
            return PoolReport(
                terminated=not still_running,
                still_running=still_running,
                processed=self._processed,
                failed=self._failed,
                discarded=tuple(self._discarded),
                elapsed=time.monotonic() - start,
            )

    def _discard(self) -> None:
        dropped = shutdown_and_drain(self._queue)
        if dropped:
            with self._lock:
                self._discarded.extend(dropped)
            logger.warning("%s: discarded %d queued item(s)", self._name, len(dropped))

    def _run(self, slot: _Slot) -> None:
        """Consumer thread body: consume, and make sure the end of the last consumer is seen."""
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
            if last:
                # Normally the queue is already shut down and empty and this finds nothing.
                # If the last consumer died instead, it shuts the queue so that producers
                # blocked in put() wake with ShutDown, and reports what nobody will take.
                self._discard()

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
        """Run the handler on one item, log its failure, count the outcome."""
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
