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
    * `ConsumerPool` follows the lifecycle contract: ``start()`` is all or nothing, and
      ``with pool.start():`` enters the running pool; ``stop()`` is bounded by its budget
      (inf: as long as it takes), never raises for unfinished work, never blocks on its
      own thread (from a handler it is a request, from a signal handler it returns a
      provisional report at once), and once one call has completed every later call
      returns its report. Reports come from each consumer's own "ended" event, never
      from ``Thread.is_alive()``. Every item the pool accepted is processed, failed
      (logged) or listed as discarded; a consumer killed by a `BaseException` is logged
      at CRITICAL, and when the last one is gone the queue is shut so no producer hangs.
    * An exception (a Ctrl-C) leaving its ``with`` block is logged at WARNING with the
      budget the stop may take, then what the stop left; a second Ctrl-C during that
      wait stops now (``stop(0)``), names what is still running in one line and ends
      in one KeyboardInterrupt, not two chained tracebacks.

Python:
    3.11+, standard library only; checked on 3.11.7, 3.12.1 and 3.13.0. On 3.13 `ShutDown`
    *is* ``queue.ShutDown`` and `ClosableQueue` adds nothing to `queue.Queue`.

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
from dataclasses import dataclass
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
        """`queue.Queue` itself: since Python 3.13 it has ``shutdown()`` and ``is_shutdown``.

        This subclass adds nothing, so code written against it behaves exactly like the
        standard library and keeps working when the back-port is deleted.
        """

else:

    class ShutDown(Exception):
        """Raised by ``put`` on a shut-down queue, and by ``get`` once it is also empty.

        The same class as ``queue.ShutDown`` on Python 3.13; here, a back-port.
        """

    def _timeout_at(timeout: float | None) -> float | None:
        """A blocking call's ``timeout`` as a `time.monotonic` deadline (None: never)."""
        if timeout is None:
            return None
        if timeout < 0:
            raise ValueError("'timeout' must be a non-negative number")
        return time.monotonic() + timeout

    def _wait_or_raise(
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
                        deadline = _timeout_at(timeout)
                        while self._qsize() >= self.maxsize:
                            _wait_or_raise(self.not_full, deadline, queue.Full)
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
                    deadline = _timeout_at(timeout)
                    while not self._qsize():
                        _wait_or_raise(self.not_empty, deadline, queue.Empty)
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

    Items can be put before ``start()``; they wait for the consumers. Stopping a pool that
    was never started discards what was queued, since no consumer will ever take it.

    Where ``stop()`` is called from decides what it does:

    * from any other thread: it stops the pool within its budget and returns the report;
      the first one to complete is recorded and every later call returns it. A call made
      while another thread's stop runs waits for it within its own budget, then returns a
      provisional report (``terminated=False``) that is not recorded;
    * from a consumer (inside the handler): a request. The queue closes (graceful: the
      consumers drain it; ``immediate=True`` discards it now), the call returns at once a
      provisional report naming its consumer, and the last consumer to end records the
      final report, unless a ``stop()`` from outside does it first;
    * from a signal handler: inside this thread's own ``stop()`` it returns a provisional
      report at once; inside a method of the pool's queue (``put``...), where the main
      thread may hold the queue's lock, it hands the stop to a thread of its own, named
      ``<name>-stopper``, and returns a provisional report at once.
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
        # Guards every field below. Held by consumers to count an item and to note their
        # exit, by start() across each Thread.start() (so a stop() from another thread sees
        # a consumer either started and listed, or not launched at all), and by stop().
        # Never held while a handler runs, while blocking on the queue, or while waiting.
        # Reentrant, so a stop() from a signal handler on a thread holding it cannot deadlock.
        self._lock = threading.RLock()
        self._threads: list[threading.Thread] = []
        # One per consumer, set in the finally of its thread's target: the truth stop()
        # reports from (never Thread.is_alive(), which lies after an interrupted join on
        # 3.11 and 3.12, gh-90882).
        self._ended: dict[threading.Thread, threading.Event] = {}
        self._alive = 0  # consumers launched and not yet ended
        self._started = False
        self._starting = False  # start() is still launching consumers
        self._closed = False
        self._processed = 0
        self._failed = 0
        self._discarded: list[T] = []
        self._stopper: threading.Thread | None = None  # the thread running the first stop()
        self._requested: float | None = None  # when a consumer asked the pool to stop
        self._handed_off = False  # a signal handler started the <name>-stopper thread
        # Idents of the threads inside stop(): one that finds its own thread there is a
        # signal handler (or a callback) and must not block. A set, not a lock: add and
        # discard are atomic, and a handler reading it takes no lock.
        self._in_stop: set[int] = set()
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
        """Queue ``item``; with ``timeout`` None or inf, wait for room as long as it takes.

        Raises:
            ShutDown: the pool is stopping or stopped.
            queue.Full: the queue is bounded and stayed full for ``timeout`` seconds.
            ValueError: ``timeout`` is not a number of seconds >= 0.
        """
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
                    break  # stopped meanwhile
        except BaseException as exc:
            _start_failed(self, exc)
            raise
        _starting_done(self)
        return self

    def stop(self, timeout: float | None = None, *, immediate: bool = False) -> PoolReport[T]:
        """Shut the queue down, wait up to ``timeout`` for the consumers, and report.

        ``immediate=False``: the consumers drain the queue until the deadline; what is
        still queued then is discarded. ``immediate=True``: what is queued is discarded
        now, and each consumer ends after its current item. ``timeout=None`` means
        ``stop_timeout``; inf waits as long as it takes. What a call from a consumer or
        a signal handler does is on the class; it never blocks on its own thread.
        """
        budget = self.stop_timeout if timeout is None else _seconds(timeout, "timeout")
        # Once, whoever calls: the first plain call runs _stop_once, the others report.
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
        """Start the pool if it never started; a running pool is returned as it is.

        So ``with pool:`` and ``with pool.start():`` both work, and both stop it at the end.

        Raises:
            RuntimeError: the pool was stopped (or its start failed).
        """
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self._name}: a stopped pool cannot be entered")
            running = self._started
        return self if running else self.start()

    # The same code is in bulkhead, closable_queue, daemon_threads and supervisor (each
    # module is copied alone); pinned by tests/test_copies.py.
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
                if last:
                    # Normally the queue is already shut down and empty and this finds
                    # nothing. If the last consumer died instead, it shuts the queue so that
                    # producers blocked in put() wake with ShutDown, and reports what nobody
                    # will take.
                    self._discard()
        finally:
            ended.set()
            if last:
                _finish_request(self)

    def _launch(self, name: str) -> bool:
        """Start one consumer and list it; False if the pool was stopped meanwhile."""
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
                # The consumer has not begun (it needs slot.lock) and now never will.
                slot.cancelled = True
                self._alive -= 1
                if not thread.is_alive():  # never started: nothing to wait for or report
                    self._threads.remove(thread)
                    del self._ended[thread]
                raise
        return True

    def _close(self, *, immediate: bool) -> None:
        """Refuse new work, and discard what is queued or let the consumers drain it."""
        with self._lock:
            self._closed = True
            nobody = not self._threads
        if immediate or nobody:  # without consumers, nobody would ever take the rest
            self._discard()
        else:
            self._queue.shutdown()

    def _wait_ended(self, deadline: float) -> bool:
        """Wait until every consumer's ended event is set, or ``deadline``; True if all are."""
        with self._lock:
            consumers = list(self._ended.items())
        all_ended = True
        for thread, ended in consumers:
            if _wait(ended, deadline):
                # Its target has returned: this join only waits for the thread's last steps.
                thread.join(_left(deadline))
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


# --- the lifecycle contract: seconds, deadlines, who may stop, the stopper hand-off ----------


# The same code is in every pattern module that needs it; pinned by tests/test_copies.py.
def _seconds(value: object, name: str, *, allow_none: bool = False) -> float:
    """``value`` as seconds >= 0; inf and huge values (None too, if allowed) mean no limit."""
    if value is None and allow_none:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return math.inf if value > sys.float_info.max else float(value)


def _deadline(seconds: float) -> float:
    """The `time.monotonic` time ``seconds`` from now (inf stays inf)."""
    return time.monotonic() + seconds


def _left(deadline: float) -> float:
    """Seconds until ``deadline``, capped at `threading.TIMEOUT_MAX` so no wait overflows."""
    return min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)


def _wait(event: threading.Event, deadline: float) -> bool:
    """``event.wait()`` until the ``deadline`` (may be inf); True if it was set."""
    while not event.wait(_left(deadline)):
        if time.monotonic() >= deadline:
            return False
    return True


def _start_failed(pool: ConsumerPool[Any], exc: BaseException) -> None:
    """All or nothing: stop the consumers a failed start() launched, within stop_timeout."""
    _starting_done(pool)
    logger.warning("%s: start() failed part-way (%r); stopping the rest", pool._name, exc)
    pool._close(immediate=True)
    pool._wait_ended(_deadline(pool.stop_timeout))


def _starting_done(pool: ConsumerPool[Any]) -> None:
    """End the launch phase; if every consumer already died, act as the last one would."""
    with pool._lock:
        pool._starting = False
        nobody_left = pool._alive == 0
    if nobody_left:
        pool._discard()


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
            return _hand_off(pool, budget, start, immediate=immediate)
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


def _hand_off(
    pool: ConsumerPool[T], budget: float, start: float, *, immediate: bool
) -> PoolReport[T]:
    """Start ``<name>-stopper`` to run the stop; called with ``_lock`` held, never blocks."""
    if not pool._handed_off:
        pool._handed_off = True
        stopper = threading.Thread(
            target=pool.stop,
            args=(budget,),
            kwargs={"immediate": immediate},
            name=f"{pool._name}-stopper",
        )
        try:
            stopper.start()
        except RuntimeError:
            pool._handed_off = False
            logger.exception("%s: cannot hand the stop to a thread; stop() again", pool._name)
    return pool._snapshot(start)


def _record(pool: ConsumerPool[T], report: PoolReport[T]) -> PoolReport[T]:
    """Make ``report`` final unless one already is; return the final one."""
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
    """True if the calling thread is inside a method of ``q`` or of its conditions.

    There it may hold ``q.mutex``, a plain lock: a signal handler that landed there and
    takes the mutex deadlocks its own thread. The frames say where the thread is; the
    ``self`` of each frame whose code is a `queue.Queue` or `threading.Condition`
    method says whether it is this queue.
    """
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
