"""Close a queue instead of feeding it pills: every thread blocked in ``put`` or ``get`` wakes.

TL;DR: ``q.shutdown()`` on a `ClosableQueue` (Python 3.13's ``Queue.shutdown``, back-ported
to 3.11 and 3.12) makes ``put`` raise `ShutDown` at once and ``get`` raise it once the queue
is empty; ``shutdown(immediate=True)`` also empties the queue. `ConsumerPool` is a set of
consumer threads stopped that way, with a bounded ``stop(timeout)`` and a `PoolReport`.

Pitfall:
    A consumer blocked in `queue.Queue.get` has no way out but an item. A stop flag is
    read only between items, so a consumer waiting in ``get()`` never sees it (P14), and
    the usual cure, one poison pill per consumer, goes wrong in several ways: one pill
    for N consumers stops one of them (P10), a pill sent before a slow producer is done
    overtakes its items (P11), and a pill is an item like any other, so ``put(PILL)`` on a
    full bounded queue blocks (P12). The producer's side has the mirror image: once the
    consumers are dead, ``put()`` on a full queue waits forever, and so does ``join()``
    (P9).

Pattern:
    Close the queue itself. `ClosableQueue.shutdown` flips ``is_shutdown`` under the
    queue's lock and wakes every thread blocked in ``put`` or ``get``; from then on
    ``put`` raises `ShutDown`, and ``get`` hands out what is left and then raises
    `ShutDown` instead of blocking. With ``immediate=True`` what is left is dropped at
    once and counted as done, and ``join()`` is woken, so it is not held up by items
    nobody will ever take. `shutdown_now` does the
    same and hands the dropped items back. `ConsumerPool` runs consumers that loop until
    `ShutDown`: ``close()`` lets them drain the queue, ``close(immediate=True)`` stops them
    after their current item, and ``stop(timeout)`` drains until the deadline and then
    discards the rest. `produce` is the producer's side: it stops at `ShutDown` and says
    how many items it delivered.

Guarantees:
    * Once ``shutdown()`` returns, no ``put`` can succeed, and every thread that was
      blocked in ``put`` has been woken and raises `ShutDown`.
    * After ``shutdown(immediate=False)``, every item already queued is still handed out
      by ``get``, in order; after that, and at once after ``shutdown(immediate=True)``,
      every ``get``, blocked or not, raises `ShutDown`.
    * ``shutdown(immediate=True)`` counts a ``task_done()`` for every item it removes,
      never driving the count below zero, and wakes ``join()``; ``join()`` then returns
      unless an item taken before the shutdown is still waiting for its ``task_done()``.
    * ``ConsumerPool.start()`` is all or nothing: if a consumer cannot be started, the
      ones already running are stopped and the error propagates.
    * ``ConsumerPool.stop(timeout)`` and ``close(..., timeout=...)`` return within their
      budget (plus scheduling noise), never raise, are idempotent, and are safe while
      ``start()`` is still running. Each `PoolReport` counts what the handler processed
      and what failed, lists every discarded item, and names the consumer threads still
      running at the deadline. Once every consumer has ended, each item the pool
      accepted was processed, failed or discarded: none is lost silently.
    * A handler's exception is logged with its traceback and the consumer goes on. A
      consumer killed by a `BaseException` (``sys.exit()`` in a handler) is logged at
      CRITICAL, and when the last consumer is gone the queue is shut down and what it
      held is discarded and reported, so producers get `ShutDown` instead of a hang.

Python:
    3.11+, standard library only. Python 3.13 added ``queue.Queue.shutdown`` and
    ``queue.ShutDown`` (gh-96471), and ``asyncio.Queue.shutdown`` with
    ``asyncio.QueueShutDown`` in the same release; ``queue.SimpleQueue`` and
    ``multiprocessing.Queue`` have none (checked on 3.11, 3.12 and 3.13). On 3.13 this
    module re-implements nothing: `ShutDown` *is* ``queue.ShutDown`` and `ClosableQueue`
    is a subclass of `queue.Queue` that adds nothing, so it behaves exactly like the
    standard library. On 3.11 and 3.12 `ClosableQueue` overrides ``put`` and ``get`` and adds
    ``shutdown`` with the same semantics, rule for rule, including the order in which
    errors win (`ShutDown` before `queue.Full`, `queue.Empty` or `ValueError`). The
    back-port uses `queue.Queue`'s undocumented internals (``mutex``, the three
    conditions, ``unfinished_tasks``, ``_qsize``/``_put``/``_get``); its tests run on
    3.11 and 3.12, the versions that use it. It relies on locks only, never on the GIL.

Java:
    ``BlockingQueue`` has no close. Java consumers are stopped with a poison pill or by
    interrupting them (``ExecutorService.shutdownNow()``); ``drainTo(list)`` is the
    nearest thing to `shutdown_now`, and a full queue's ``offer(e, timeout, unit)`` the
    nearest thing to a ``put`` that cannot hang. `ConsumerPool` with ``stop(timeout)`` is
    the ``shutdown()`` / ``awaitTermination()`` / ``shutdownNow()`` idiom for a hand-made
    consumer pool.

See also:
    ``poison_pill`` (when a pill is still the right tool), ``executor_shutdown`` (the same
    stop-on-a-deadline idiom for thread pools), ``thread_exceptions`` (why a dying
    thread must be reported).
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Generic, Self, TypeVar

__all__ = [
    "ClosableQueue",
    "ConsumerPool",
    "PoolReport",
    "ShutDown",
    "produce",
    "shutdown_now",
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


def shutdown_now(q: ClosableQueue[T]) -> list[T]:
    """Shut ``q`` down and return the items it still held, each counted as done.

    ``q.shutdown(immediate=True)`` drops the queued items without saying which; this
    ends in the same state (shut down, empty, ``task_done()`` counted for every removed
    item) and hands them back, in queue order, to be logged or stored. It closes the
    queue first, so no ``put`` can slip in while it empties it. A consumer may still take
    an item while it runs: each item is then either returned here or got by a consumer,
    never both, never neither.
    """
    q.shutdown()  # from here on nothing can be added, so the loop below ends
    removed: list[T] = []
    while True:
        try:
            removed.append(q.get_nowait())
        except ShutDown:
            return removed
        q.task_done()


def produce(q: ClosableQueue[T], items: Iterable[T]) -> int:
    """Put every item of ``items`` on ``q``, stopping at `ShutDown`; return how many were put.

    A producer blocked in ``put()`` on a full queue whose consumers are gone is woken by
    ``shutdown()`` and returns instead of waiting forever (P9). The refused item and the
    ones after it are not put; an iterator's later items stay unread.
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
    """What a `ConsumerPool` did, as of a ``close()`` or ``stop()``.

    Counts are cumulative over the pool's life, so a second call reports the first's work
    too.

    Attributes:
        processed: items the handler returned from normally.
        failed: items the handler raised on (each one logged with its traceback).
        discarded: items that were queued but never handed to the handler, in queue order.
        still_running: names of the consumer threads still alive at the deadline.
        elapsed: seconds the call took.
    """

    processed: int
    failed: int
    discarded: list[T] = field(default_factory=list)
    still_running: list[str] = field(default_factory=list)
    elapsed: float = 0.0

    @property
    def terminated(self) -> bool:
        """Whether every consumer thread had ended when the call returned."""
        return not self.still_running


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

    The lifecycle is the project's contract: ``start()``, ``stop(timeout) -> report``, and
    a context manager whose exit calls ``stop(stop_timeout)``. ``close()`` is the
    finer-grained stop: graceful (consumers finish everything queued) or immediate
    (consumers stop after their current item and the rest is discarded). Both are
    idempotent, bounded by their timeout, and safe to call from any thread, a handler
    included (that consumer is then reported as still running, since it cannot join
    itself).

    Items can be put before ``start()``; they wait for the consumers. Closing a pool that
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
            raise ValueError("a pool needs at least one consumer")
        self._handler = handler
        self._consumers = consumers
        self._name = name
        self._stop_timeout = stop_timeout
        self._queue: ClosableQueue[T] = ClosableQueue(maxsize)
        # Guards every field below. Held by consumers to count an item and to note their
        # exit, by start() across each Thread.start() (so a close() from another thread
        # sees a consumer either started and listed, or not launched at all), and by
        # close() and the report. Never held while a handler runs, while blocking on the
        # queue, or while joining. Reentrant so that a stop() from a signal handler that
        # lands while the main thread holds it does not deadlock; such a stop() returns on
        # its budget and names the consumers it could not wait for (they need this lock
        # to count), and a later stop() joins them.
        self._lock = threading.RLock()
        self._threads: list[threading.Thread] = []
        self._alive = 0  # consumers launched and not yet ended
        self._started = False
        self._starting = False  # start() is still launching consumers
        self._closed = False
        self._processed = 0
        self._failed = 0
        self._discarded: list[T] = []

    @property
    def queue(self) -> ClosableQueue[T]:
        """The queue producers put on (see `produce`); ``put`` raises `ShutDown` once closed."""
        return self._queue

    @property
    def threads(self) -> list[threading.Thread]:
        """The consumer threads (empty before ``start()``)."""
        with self._lock:
            return list(self._threads)

    def put(self, item: T, timeout: float | None = None) -> None:
        """Queue ``item`` for the consumers.

        Raises:
            ShutDown: the pool is closing or closed.
            queue.Full: the queue is bounded and stayed full for ``timeout`` seconds.
        """
        self._queue.put(item, timeout=timeout)

    def start(self) -> Self:
        """Start the consumer threads; return the pool. All or nothing.

        If a consumer cannot be started (``RuntimeError: can't start new thread``, or a
        `KeyboardInterrupt` landing in here), the consumers already running are stopped
        as by ``close(immediate=True, timeout=stop_timeout)`` and the error propagates;
        the pool is then closed, and ``stop()`` reports what was discarded. A ``stop()``
        or ``close()`` that arrives while this runs wins: no further consumer is started.

        Raises:
            RuntimeError: the pool was started or closed before.
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
            logger.warning(
                "%s: start() failed part-way (%r); stopping the consumers that started",
                self._name,
                exc,
            )
            self._close(True, time.monotonic() + self._stop_timeout, time.monotonic())
            raise
        self._starting_done()
        return self

    def _launch(self, name: str) -> bool:
        """Start one consumer and list it; False if the pool was closed meanwhile."""
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

    def close(self, immediate: bool = False, *, timeout: float = 5.0) -> PoolReport[T]:
        """Shut the queue down, wait up to ``timeout`` for the consumers to end, and report.

        ``immediate=False``: the consumers finish everything already queued, then end.
        ``immediate=True``: what is still queued is discarded (and listed in the report),
        and each consumer ends once its current item is done.
        """
        start = time.monotonic()
        return self._close(immediate, start + timeout, start)

    def stop(self, timeout: float = 5.0) -> PoolReport[T]:
        """Graceful first, forced at the deadline: the lifecycle contract's ``stop``.

        The consumers drain the queue for up to ``timeout`` seconds; whatever is still
        queued then is discarded, and the report names the consumers still busy with an
        item. Returns within ``timeout``.
        """
        start = time.monotonic()
        report = self._close(False, start + timeout, start)
        if not report.terminated:
            report = self._close(True, start + timeout, start)
            logger.error(
                "%s: stop(%.3g) ran out of time: %d item(s) discarded, still running: %s",
                self._name,
                timeout,
                len(report.discarded),
                ", ".join(report.still_running),
            )
        return report

    def __enter__(self) -> Self:
        with self._lock:
            started = self._started
        return self if started else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(self._stop_timeout)

    def _close(self, immediate: bool, deadline: float, start: float) -> PoolReport[T]:
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
        with self._lock:
            return PoolReport(
                processed=self._processed,
                failed=self._failed,
                discarded=list(self._discarded),
                still_running=[t.name for t in threads if t.is_alive()],
                elapsed=time.monotonic() - start,
            )

    def _discard(self) -> None:
        dropped = shutdown_now(self._queue)
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
                # blocked in put() wake with ShutDown, and reports what nobody will take (P9).
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


# --- Broken on purpose: the naive versions the tests and docs compare against ------------


def naive_consume(q: queue.Queue[T], handler: Callable[[T], object], stop: threading.Event) -> None:
    """Broken on purpose: the stop flag is read between items, but the consumer waits in get().

    Setting ``stop`` does nothing to a consumer blocked in ``q.get()``; only an item wakes
    it, and the item that does is then handled as if it were data (P14). A handler exception
    ends the thread, and with it the queue's only reader (P9).
    """
    while not stop.is_set():
        item = q.get()
        try:
            handler(item)
        finally:
            q.task_done()


def naive_produce(q: queue.Queue[T], items: Iterable[T]) -> int:
    """Broken on purpose: ``put()`` on a full queue waits forever once the consumers are gone.

    This is the producer's side of a dead consumer (P9): nothing will ever make room.
    """
    delivered = 0
    for item in items:
        q.put(item)
        delivered += 1
    return delivered
