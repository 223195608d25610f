"""Close an asyncio queue instead of feeding it sentinels: every task blocked on it wakes.

TL;DR:
    ``q.shutdown()`` on a `ClosableAsyncQueue` (3.13's ``asyncio.Queue.shutdown``,
    back-ported to 3.11 and 3.12) makes ``put`` raise `QueueShutDown` at once and ``get``
    raise it once the queue is empty; ``shutdown(immediate=True)`` also empties it, and
    `shutdown_and_drain` empties it and hands the items back. Consumer tasks run
    `consume_until_shutdown`, producers `put_until_shutdown`; neither needs a sentinel.

Guarantees:
    * Once ``shutdown()`` returns, no ``put`` succeeds, and every task blocked in ``put``
      will raise `QueueShutDown` when it next runs; queued items are still handed out in
      order (not after ``immediate=True``), then every ``get``, blocked or not, raises it.
    * ``shutdown(immediate=True)`` counts a ``task_done()`` per removed item (never below
      zero) and releases ``join()`` once nothing taken earlier is still in flight.
    * `consume_until_shutdown` calls ``task_done()`` once per item it takes, logs a
      handler's exception and goes on, and lets cancellation through.

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
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

__all__ = [
    "AsyncLifoQueueBackport",
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
