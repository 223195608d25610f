# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""Close an asyncio queue instead of feeding it sentinels: every task blocked on it wakes.

TL;DR:
    ``q.shutdown()`` on a `ClosableAsyncQueue` (3.13's ``asyncio.Queue.shutdown``,
    back-ported to 3.11 and 3.12) makes ``put`` raise `QueueShutDown` at once and ``get``
    raise it once the queue is empty; ``shutdown(immediate=True)`` also empties it, and
    `shutdown_and_drain` empties it and hands the items back. Consumer tasks run
    `consume_until_shutdown`, producers `put_until_shutdown`; neither needs a sentinel.
    `AsyncConsumerPool` runs consumer tasks stopped that way: ``start()``, then
    ``await stop(timeout)`` (or an ``async with`` block) returns an `AsyncPoolReport`.

Guarantees:
    * Once ``shutdown()`` returns, no ``put`` succeeds, and every task blocked in ``put``
      will raise `QueueShutDown` when it next runs; queued items are still handed out in
      order (not after ``immediate=True``), then every ``get``, blocked or not, raises it.
    * ``shutdown(immediate=True)`` counts a ``task_done()`` per removed item (never below
      zero) and releases ``join()`` once nothing taken earlier is still in flight.
    * `consume_until_shutdown` calls ``task_done()`` once per item it takes, logs a
      handler's exception and goes on, and lets cancellation through.
    * `AsyncConsumerPool` follows the lifecycle contract, with ``stop`` a coroutine:
      ``start()`` is all or nothing; ``stop()`` returns within its budget (plus one loop
      turn), never raises for unfinished work, and once one call has completed every
      later call returns its report; from a consumer it is a request that returns at once.
      Each item the pool accepted is processed, failed (logged), discarded, or listed as
      interrupted by a cancellation.

Python:
    3.11+, standard library only; checked on 3.11.7, 3.12.1 and 3.13.0. On 3.13+
    `ClosableAsyncQueue` *is* ``asyncio.Queue`` and `QueueShutDown` *is*
    ``asyncio.QueueShutDown`` (likewise the priority and LIFO variants). The back-port
    classes (`AsyncQueueBackport`...) are defined on every version, so that the tests can
    hold them against the real thing on 3.13; use the ``ClosableAsync*`` names.

Docs: docs/patterns/async_queue.md
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, Self, TypeVar

__all__ = [
    "AsyncConsumerPool",
    "AsyncLifoQueueBackport",
    "AsyncPoolReport",
    "AsyncPriorityQueueBackport",
    "AsyncQueueBackport",
    "ClosableAsyncLifoQueue",
    "ClosableAsyncPriorityQueue",
    "ClosableAsyncQueue",
    "QueueShutDown",
    "consume_until_shutdown",
    "put_until_shutdown",
    "shutdown_and_drain",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class _Ordered(Protocol):
    """What ``asyncio.PriorityQueue`` can order: items compared with ``<``."""

    def __lt__(self, other: Any, /) -> bool: ...


P = TypeVar("P", bound=_Ordered)

if sys.version_info >= (3, 13):
    from asyncio import QueueShutDown
else:

    class QueueShutDown(Exception):
        """Raised by ``put`` on a shut-down queue, and by ``get`` once it is also empty.

        The same class as ``asyncio.QueueShutDown`` on Python 3.13; here, a back-port.
        """


class AsyncQueueBackport(asyncio.Queue[T]):
    """An `asyncio.Queue` with Python 3.13's ``shutdown()``, written for 3.11 and 3.12.

    It is `ClosableAsyncQueue` before 3.13; use that name. It is defined on 3.13 too,
    where it overrides the standard methods with its own, so that one test suite can run
    the back-port and ``asyncio.Queue`` side by side on the same interpreter.

    The waiting works as in the base class, on its state: a task blocked in ``get``
    (``put``) awaits a future it left in ``_getters`` (``_putters``), and whoever makes
    progress possible sets the first one's result. ``shutdown()`` sets them all, and each
    woken task re-checks the flag in its loop. ``task_done``, ``join``, ``qsize``,
    ``empty`` and ``full`` are the base class's and follow the rules through ``get`` and
    ``shutdown``.
    """

    if TYPE_CHECKING:
        # asyncio.Queue's private state (3.11 to 3.13), which typeshed does not declare.
        _getters: deque[asyncio.Future[None]]
        _putters: deque[asyncio.Future[None]]
        _unfinished_tasks: int
        _finished: asyncio.Event

        def _get_loop(self) -> asyncio.AbstractEventLoop: ...
        def _wakeup_next(self, waiters: deque[asyncio.Future[None]]) -> None: ...

    def __init__(self, maxsize: int = 0) -> None:
        super().__init__(maxsize)
        # Set once, by shutdown(); never cleared. Private, as in 3.13: asyncio.Queue has no
        # public is_shutdown (queue.Queue does).
        self._is_shutdown = False

    if sys.version_info < (3, 13):  # 3.13's own _format already says so

        def _format(self) -> str:
            """The end of ``repr(q)``: as in 3.13, it says ``shutdown`` once shut down."""
            return super()._format() + (" shutdown" if self._is_shutdown else "")

    async def put(self, item: T) -> None:
        """Put ``item`` in the queue, waiting for room; raise `QueueShutDown` once shut down.

        A task blocked here on a full queue when ``shutdown()`` is called wakes and raises
        `QueueShutDown`; its item is not added.
        """
        while self.full():
            if self._is_shutdown:
                raise QueueShutDown
            await self._wait_in(self._putters, lambda: not self.full())
        self.put_nowait(item)

    def put_nowait(self, item: T) -> None:
        """Put ``item`` without waiting; `QueueShutDown` once shut down, else as before."""
        if self._is_shutdown:
            raise QueueShutDown
        super().put_nowait(item)

    async def get(self) -> T:
        """Remove and return an item, waiting while the queue is empty.

        After ``shutdown()`` the items still queued are returned as usual; once the queue
        is empty (at once after ``shutdown(immediate=True)``) every call, and every task
        blocked here, raises `QueueShutDown` instead of waiting.
        """
        while self.empty():
            if self._is_shutdown:
                raise QueueShutDown
            await self._wait_in(self._getters, lambda: not self.empty())
        return self.get_nowait()

    def get_nowait(self) -> T:
        """Remove and return an item without waiting.

        On an empty queue: `QueueShutDown` once shut down, else `asyncio.QueueEmpty`.
        """
        if self._is_shutdown and self.empty():
            raise QueueShutDown
        return super().get_nowait()

    def shutdown(self, immediate: bool = False) -> None:
        """Close the queue: ``put`` raises `QueueShutDown` from now on, and blocked tasks wake.

        With ``immediate=False`` the items already queued can still be taken with
        ``get``, which raises `QueueShutDown` once the queue is empty. With
        ``immediate=True`` the queue is emptied now and each removed item is counted as
        done (never below zero), which releases ``join()`` unless items taken earlier
        still await their ``task_done()``. Calling it again is harmless, and
        ``shutdown(immediate=True)`` after a plain one empties what is left.
        """
        self._is_shutdown = True
        if immediate:
            while not self.empty():
                self._get()
                if self._unfinished_tasks > 0:  # task_done() may have been called early
                    self._unfinished_tasks -= 1
            if self._unfinished_tasks == 0:
                self._finished.set()
        # Wake every waiter, not just the first: each one re-checks the flag in its loop.
        for waiters in (self._getters, self._putters):
            while waiters:
                waiter = waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)

    async def _wait_in(
        self, waiters: deque[asyncio.Future[None]], can_proceed: Callable[[], bool]
    ) -> None:
        """Park in ``waiters`` until woken; if cancelled, pass an unused wake-up on."""
        waiter = self._get_loop().create_future()
        waiters.append(waiter)
        try:
            await waiter
        except BaseException:  # CancelledError above all; re-raised below
            waiter.cancel()
            # The waker (or shutdown()) may already have removed it from the deque.
            with contextlib.suppress(ValueError):
                waiters.remove(waiter)
            if can_proceed() and not waiter.cancelled():
                # Woken for an item (or for room) this task will not use: hand it on, or
                # the next waiter stays asleep with the queue ready for it.
                self._wakeup_next(waiters)
            raise


class AsyncPriorityQueueBackport(AsyncQueueBackport[P], asyncio.PriorityQueue[P]):
    """The back-port with ``asyncio.PriorityQueue``'s order, lowest item first.

    It is `ClosableAsyncPriorityQueue` before 3.13; use that name.
    """


class AsyncLifoQueueBackport(AsyncQueueBackport[T], asyncio.LifoQueue[T]):
    """The back-port with ``asyncio.LifoQueue``'s order, last in first out.

    It is `ClosableAsyncLifoQueue` before 3.13; use that name.
    """


if sys.version_info >= (3, 13):
    ClosableAsyncQueue = asyncio.Queue
    ClosableAsyncPriorityQueue = asyncio.PriorityQueue
    ClosableAsyncLifoQueue = asyncio.LifoQueue
else:
    ClosableAsyncQueue = AsyncQueueBackport
    ClosableAsyncPriorityQueue = AsyncPriorityQueueBackport
    ClosableAsyncLifoQueue = AsyncLifoQueueBackport


def shutdown_and_drain(q: ClosableAsyncQueue[T]) -> list[T]:
    """Shut ``q`` down and return the items it still held, each counted as done.

    Ends in the state ``q.shutdown(immediate=True)`` leaves, but hands the dropped items
    back, in queue order. It never awaits, so no other task runs in between.
    """
    q.shutdown()
    removed: list[T] = []
    while True:
        try:
            removed.append(q.get_nowait())
        except QueueShutDown:
            return removed
        q.task_done()


async def put_until_shutdown(q: ClosableAsyncQueue[T], items: Iterable[T]) -> int:
    """Put every item of ``items`` on ``q``, stopping at `QueueShutDown`; return how many.

    A producer waiting on a full queue whose consumers are gone is woken by
    ``shutdown()`` and returns instead of waiting forever. The refused item and the ones
    after it are not put; an iterator's later items stay unread.
    """
    delivered = 0
    for item in items:
        try:
            await q.put(item)
        except QueueShutDown:
            logger.warning("queue shut down: %d item(s) delivered, %r refused", delivered, item)
            return delivered
        delivered += 1
    return delivered


async def consume_until_shutdown(
    q: ClosableAsyncQueue[T], handler: Callable[[T], Awaitable[Any]]
) -> int:
    """Await ``handler(item)`` for each item until the queue is shut down and empty.

    Any number of consumer tasks can share the queue: one ``q.shutdown()`` ends them all
    once the items are handed out, with no sentinel. ``task_done()`` is called once per
    item, whatever the handler does; a handler's `Exception` is logged and the loop goes
    on; cancellation (and any other `BaseException`) ends it. Returns how many items the
    handler completed without raising.
    """
    handled = 0
    while True:
        try:
            item = await q.get()
        except QueueShutDown:
            return handled
        try:
            await handler(item)
        except Exception:
            logger.exception("handler failed on %r; going on", item)
        else:
            handled += 1
        finally:
            q.task_done()


@dataclass(frozen=True)
class AsyncPoolReport(Generic[T]):
    """What an `AsyncConsumerPool` had done when its ``stop()`` returned.

    Attributes:
        terminated: every consumer task had ended.
        still_running: names of the consumer tasks not ended at the deadline (one that
            swallows its cancellation stays here).
        processed: items the handler returned from normally.
        failed: items the handler raised on (each one logged with its traceback).
        discarded: items queued but never handed to the handler, in queue order.
        interrupted: items whose handler was cancelled (a cancelled consumer's item in hand).
        cancelled: names of the consumer tasks cancelled because the deadline passed.
        elapsed: seconds the stop took.
    """

    terminated: bool
    still_running: tuple[str, ...]
    processed: int
    failed: int
    discarded: tuple[T, ...]
    interrupted: tuple[T, ...]
    cancelled: tuple[str, ...]
    elapsed: float

    def __post_init__(self) -> None:
        if self.terminated and self.still_running:
            raise ValueError(f"terminated=True with still_running={self.still_running!r}")


class AsyncConsumerPool(Generic[T]):
    """Consumer tasks that await ``handler(item)`` for each item, stopped by closing the queue.

    The lifecycle contract, in asyncio: ``start()`` is a plain method, called with the
    loop running, that creates the consumer tasks, all or nothing; ``stop(timeout)`` is a
    coroutine (``await pool.stop()``); ``async with`` starts and stops, and entering a
    started pool (``async with pool.start():``) returns it. Items can be put before
    ``start()``; stopping a pool that never started discards them.

    A ``stop()`` awaited by one of the pool's own consumers (inside the handler) is a
    request: the queue closes (graceful: the consumers drain it; ``immediate=True``
    discards it now), the call returns at once a provisional report naming its task, and
    the last consumer to end records the final report, unless a ``stop()`` from another
    task does it first.
    """

    def __init__(
        self,
        handler: Callable[[T], Awaitable[Any]],
        *,
        consumers: int = 2,
        maxsize: int = 0,
        name: str = "consumer",
        stop_timeout: float = 5.0,
    ) -> None:
        # The same checks as closable_queue.ConsumerPool's; tests/test_copies.py pins them.
        if consumers < 1:
            raise ValueError(f"consumers must be at least 1, got {consumers!r}")
        if maxsize < 0:
            raise ValueError(f"maxsize must be >= 0, got {maxsize!r}")
        self.stop_timeout = _seconds(stop_timeout, "stop_timeout")
        self._handler = handler
        self._consumers = consumers
        self._name = name
        self._queue: ClosableAsyncQueue[T] = ClosableAsyncQueue(maxsize)
        # One loop, one thread: no lock. Every field changes only between two awaits.
        self._tasks: list[asyncio.Task[None]] = []
        # Names of the consumers whose body has returned, added in its finally: a task is
        # not done() yet while its own finally runs, and the last one reports from there.
        self._ended: set[str] = set()
        self._alive = 0  # consumer tasks created and not yet ended
        self._started = False
        self._closed = False
        self._processed = 0
        self._failed = 0
        self._discarded: list[T] = []
        self._interrupted: list[T] = []
        self._stopper: asyncio.Task[Any] | None = None  # the task running the first stop()
        self._requested: float | None = None  # loop.time() when a consumer asked to stop
        self._stopped = asyncio.Event()  # set once _report is final
        self._report: AsyncPoolReport[T] | None = None

    @property
    def queue(self) -> ClosableAsyncQueue[T]:
        """The queue producers put on; ``put`` raises `QueueShutDown` once the pool stops."""
        return self._queue

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The consumer tasks (empty before ``start()``)."""
        return list(self._tasks)

    async def put(self, item: T) -> None:
        """Queue ``item`` for the consumers; `QueueShutDown` once the pool is stopping."""
        await self._queue.put(item)

    def start(self) -> Self:
        """Create the consumer tasks on the running loop; return the pool. All or nothing.

        If creating one fails, the tasks already created are cancelled before they ever
        run, what is queued is discarded, and the error propagates.

        Raises:
            RuntimeError: no event loop is running, or the pool was started or stopped.
        """
        if self._started or self._closed:
            raise RuntimeError(f"{self._name}: a pool can be started only once")
        asyncio.get_running_loop()  # RuntimeError("no running event loop") before anything
        self._started = True
        try:
            for i in range(self._consumers):
                task = asyncio.create_task(self._run(), name=f"{self._name}-{i}")
                self._tasks.append(task)
                self._alive += 1
        except BaseException as exc:
            logger.warning("%s: start() failed part-way (%r); cancelling the rest", self._name, exc)
            self._closed = True
            for task in self._tasks:
                task.cancel()  # not run yet: cancelled before its first step
            self._discard()
            raise
        return self

    async def stop(
        self, timeout: float | None = None, *, immediate: bool = False
    ) -> AsyncPoolReport[T]:
        """Shut the queue down, wait up to ``timeout`` for the consumers, and report.

        ``immediate=False``: the consumers drain the queue until the deadline.
        ``immediate=True``: what is queued is discarded now. At the deadline, what is
        still queued is discarded and the consumers still running are cancelled, and
        given one turn of the loop to end. ``timeout=None`` means ``stop_timeout``.
        Idempotent: every later call returns the first call's report; a call made while
        another task is stopping the pool waits for it within its own budget and returns
        a provisional report if that runs out. Never raises for unfinished work.
        """
        budget = self.stop_timeout if timeout is None else _seconds(timeout, "timeout")
        loop = asyncio.get_running_loop()
        start = loop.time()
        if self._report is not None:
            return self._report
        current = asyncio.current_task()
        if current in self._tasks:  # a consumer: a request, it cannot wait for itself
            self._closed = True
            if self._requested is None:
                self._requested = start
            if immediate:
                self._discard()
            else:
                self._queue.shutdown()
            return self._snapshot(loop.time() - start, ())
        if self._stopper is not None:  # another stop() is running
            if self._stopper is not current:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopped.wait(), budget)
                if self._report is not None:
                    return self._report
            return self._snapshot(loop.time() - start, ())
        self._stopper = current
        try:
            report = await self._stop_once(budget, start, immediate=immediate)
        except BaseException:  # cancelled mid-stop: let a later stop() do it all again
            self._stopper = None
            raise
        self._report = report
        self._stopped.set()
        return report

    async def _stop_once(
        self, budget: float, start: float, *, immediate: bool
    ) -> AsyncPoolReport[T]:
        loop = asyncio.get_running_loop()
        self._closed = True
        if immediate or not self._tasks:  # without consumers, nobody would take the rest
            self._discard()
        else:
            self._queue.shutdown()
        waiting = {t for t in self._tasks if not t.done()}
        if waiting:
            _, waiting = await asyncio.wait(waiting, timeout=max(0.0, start + budget - loop.time()))
        cancelled: tuple[str, ...] = ()
        if waiting:
            self._discard()
            for task in waiting:
                task.cancel()
            cancelled = tuple(sorted(t.get_name() for t in waiting))
            await asyncio.sleep(0)  # one turn: a task that accepts cancellation ends here
            logger.error(
                "%s: stop(%.3g) ran out of time: cancelled %s",
                self._name,
                budget,
                ", ".join(cancelled),
            )
        return self._snapshot(loop.time() - start, cancelled)

    async def __aenter__(self) -> Self:
        """Start the pool if it never started; a running pool is returned as it is.

        Raises:
            RuntimeError: the pool was stopped (or its start failed).
        """
        if self._closed:
            raise RuntimeError(f"{self._name}: a stopped pool cannot be entered")
        return self if self._started else self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def _snapshot(self, elapsed: float, cancelled: tuple[str, ...]) -> AsyncPoolReport[T]:
        still_running = tuple(
            t.get_name() for t in self._tasks if not t.done() and t.get_name() not in self._ended
        )
        return AsyncPoolReport(
            terminated=not still_running,
            still_running=still_running,
            processed=self._processed,
            failed=self._failed,
            discarded=tuple(self._discarded),
            interrupted=tuple(self._interrupted),
            cancelled=cancelled,
            elapsed=elapsed,
        )

    def _discard(self) -> None:
        dropped = shutdown_and_drain(self._queue)
        if dropped:
            self._discarded.extend(dropped)
            logger.warning("%s: discarded %d queued item(s)", self._name, len(dropped))

    async def _run(self) -> None:
        """Consumer task body: take items until ``QueueShutDown``; no sentinel, no flag."""
        try:
            while True:
                try:
                    item = await self._queue.get()
                except QueueShutDown:
                    return
                try:
                    await self._handler(item)
                except asyncio.CancelledError:
                    self._interrupted.append(item)  # never lost without a trace
                    raise
                except Exception:
                    self._failed += 1
                    logger.exception("%s: handler failed on %r; going on", self._name, item)
                else:
                    self._processed += 1
                finally:
                    self._queue.task_done()
        finally:
            self._alive -= 1
            task = asyncio.current_task()
            if task is not None:
                self._ended.add(task.get_name())
            if self._alive == 0:
                # Normally the queue is already shut and empty and this finds nothing. If
                # the last consumer was cancelled, producers waiting on it wake instead.
                self._discard()
                if self._requested is not None and self._stopper is None and self._report is None:
                    # A consumer asked for the stop and nobody else is doing it: record.
                    loop = asyncio.get_running_loop()
                    self._report = self._snapshot(loop.time() - self._requested, ())
                    self._stopped.set()


# --- the lifecycle contract: seconds, checked by the one rule -----------------------------
#
# The seconds family, the same code in every pattern module that needs it; pinned by
# tests/test_copies.py. Only _seconds is needed here: asyncio's timers do the waiting.


def _seconds(value: object, name: str, *, allow_none: bool = False) -> float:
    """``value`` as a number of seconds; None means forever where allowed (math.inf).

    inf and huge values (10**400 too, with no OverflowError) are accepted as "as long as
    it takes": asyncio's timers take them as they are, since the loop caps each select()
    on its own.
    """
    if value is None and allow_none:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return math.inf if value > sys.float_info.max else float(value)
