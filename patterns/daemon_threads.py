"""Decide how each background thread ends at exit: stopped by ``main``, or abandoned on purpose.

TL;DR: run background work in a non-daemon `BackgroundService` and call its
``stop(timeout)`` from ``main``'s ``finally`` (or use ``with``); keep daemon threads for
work whose loss is harmless, in a `HousekeepingDaemon`, which still stops cleanly from an
``atexit`` handler when it can within a budget.

Pitfall:
    When ``main`` returns, CPython exits in a fixed order: it runs the private
    ``threading._register_atexit`` hooks (which join pool workers), then joins every
    non-daemon thread with no timeout, then runs ``atexit`` handlers newest first, then
    finalizes, abandoning daemon threads wherever they are. So a daemon thread is
    abandoned mid-work: its ``finally`` blocks never run, a file it was writing is left
    half-written, and the exit status is still 0 (P15). And a non-daemon thread keeps the
    process alive after ``main`` returns; an ``atexit`` handler registered to stop it
    never runs, because the interpreter waits for the thread before it runs any handler:
    the process hangs (P16).

Pattern:
    `BackgroundService` runs ``work(stopping)`` in a non-daemon thread and hands it a
    `threading.Event` that only its ``stop`` sets. The work checks the event between
    steps and waits with ``stopping.wait(t)`` instead of `time.sleep`. ``main``
    starts the service and stops it in its ``finally``; ``stop(timeout)`` sets the event,
    joins for at most ``timeout`` seconds and returns a `StopReport`. `run_with_service`
    is that shape as a function. For a heartbeat or a cache cleaner, `HousekeepingDaemon`
    runs the work in a daemon thread, so it can never hold the exit, and registers a
    bounded stop-and-join with ``atexit``, so at exit it ends cleanly if it can. `every`
    turns a ``tick()`` into such a periodic work loop. Both classes follow the `Service`
    contract.

Guarantees:
    * ``stop(timeout)`` returns within ``timeout`` (plus scheduling noise) whatever the
      work does, never raises because the work is stuck, and may be called again, from
      any thread but the service's own; ``report.terminated`` is True exactly when the
      thread has ended, and then every ``finally`` block of the work has run.
    * An exception from the work ends the thread, is logged at ERROR with its traceback
      when it happens, and is returned in ``report.error``.
    * `run_with_service` stops the service when ``main`` returns or raises; the process
      then exits without waiting on it, unless the work ignored the stop for the whole
      budget (the report says so, and the program can escalate to `os._exit`).
    * A `HousekeepingDaemon` never keeps the process alive, and delays interpreter exit
      by at most its own ``stop_timeout``.

Python:
    3.11+, standard library only. The exit order above was checked on 3.11.7, 3.12.1
    and 3.13.0 (the tests run each step in a child process). What an ``atexit``
    handler may start depends on the patch level: 3.11.7 and 3.13.0 let it start a
    thread or fork (the thread is never joined), while 3.12.1 raises `RuntimeError`
    for both (gh-104690; relaxed by gh-113964, which was backported to 3.12.3, not
    run here). Once finalization has begun, 3.12.1 raises `RuntimeError` and 3.13.0
    ``PythonFinalizationError``, where 3.11.7 hangs. The handler here only sets an
    event and joins, so it works on all of them. ``threading._register_atexit`` is a
    private hook that runs *before* non-daemon threads are joined; `concurrent.futures`
    uses it (since 3.9, bpo-39812) to stop and join pool workers. It would fix P16, but
    this project does not rely on it: it is private and undocumented (gh-86128 asks to
    make it public); an exception in one hook skips the remaining hooks *and* the join
    of every non-daemon thread, silently turning them into daemon threads (checked on
    3.11.7, 3.12.1 and 3.13.0); it still joins with no timeout; and it runs only at
    interpreter exit, while a service must also stop when a test, a reload or an
    embedding application says so.

Java:
    ``Thread.setDaemon(true)`` is ``daemon=True``, with the same abandonment. A JVM
    shutdown hook is a thread run concurrently with the other hooks, in no order, when
    the last user thread ends or on ``System.exit`` or a signal, while user threads may
    still be running. ``atexit`` handlers run one at a time, newest first, and only after
    every non-daemon thread has ended, so unlike a Java hook they cannot be used to stop
    a user thread; the explicit shutdown method the Java article recommends is
    `Service.stop`.

See also:
    ``executor_shutdown`` (pool workers are joined at exit too), ``cancellation``
    (making blocking work notice the stop), ``exit_hooks`` (``atexit`` and signals).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, Self, TypeVar

__all__ = [
    "BackgroundService",
    "HousekeepingDaemon",
    "Service",
    "StopReport",
    "every",
    "run_with_service",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class StopReport:
    """What a ``stop(timeout)`` call achieved.

    Attributes:
        name: the service's name (also its thread's name).
        terminated: the thread has ended (or was never started).
        elapsed: seconds the ``stop`` call took.
        error: the exception the work raised, if it failed.
    """

    name: str
    terminated: bool
    elapsed: float
    error: BaseException | None = None


class Service(Protocol):
    """The project's lifecycle contract for something that runs in the background.

    `start` starts it, `stop` stops it within a budget and reports, and leaving a
    ``with`` block calls ``stop`` with the service's own budget, whether the block
    raised or not.
    """

    name: str

    def start(self) -> None:
        """Start the background work; raise `RuntimeError` if started or stopped before.

        All or nothing: if it fails part-way, what it started is stopped and the error
        re-raised, so a caller that got an exception has nothing to stop.
        """

    def stop(self, timeout: float) -> StopReport:
        """Ask the work to stop and wait at most ``timeout`` seconds for it to end.

        Returns within ``timeout`` plus scheduling noise whatever the work does, and says
        in the report whether it ended. Idempotent: a second call asks again, waits again
        within its own budget and reports again. Stopping a service that never started
        reports it terminated, and it can then no longer be started.
        """

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class _ThreadService:
    """One thread running ``work(stopping)``; shared by the two public services."""

    _daemon = False
    _late_level = logging.ERROR  # how loudly stop() reports a thread that outlived it

    def __init__(
        self, work: Callable[[threading.Event], object], *, name: str, stop_timeout: float
    ) -> None:
        self.name = name
        self.stop_timeout = stop_timeout  # the budget ``with`` (and atexit) stops with
        self._work = work
        # Set once, by the first stop() (from any thread); waited on by the work, which
        # must return soon after it is set. Never cleared.
        self._stopping = threading.Event()
        # Guards _thread and the check in start() against a racing stop(); held only for
        # a few lines, never while a thread is being started or joined.
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        # Set by start() once Thread.start has returned or raised; waited on (within its
        # budget) by a stop() that raced start(), since a thread cannot be joined before then.
        self._start_settled = threading.Event()
        self._error: BaseException | None = None  # written by the thread before it ends

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    def start(self) -> None:
        """Start the thread; see `Service.start`.

        All or nothing: if starting fails part-way (no thread can be started, or a
        Ctrl-C lands after the thread began), the service is stopped within its
        ``stop_timeout`` and the error re-raised; it cannot be started again.
        """
        with self._lock:
            if self._thread is not None or self._stopping.is_set():
                raise RuntimeError(f"{self!r} can only be started once, and not after stop()")
            thread = threading.Thread(target=self._run, name=self.name, daemon=self._daemon)
            self._thread = thread  # published first, so a stop() racing us can find it
        try:
            thread.start()
        except BaseException:
            self._start_settled.set()
            self.stop(self.stop_timeout)  # the caller gets no service to stop: we do it
            raise
        self._start_settled.set()

    def stop(self, timeout: float) -> StopReport:
        """Set the stop event and join for at most ``timeout`` seconds; see `Service.stop`."""
        if timeout is None or timeout < 0:
            raise ValueError("stop() needs a budget: a timeout of 0 or more seconds")
        start = time.monotonic()
        with self._lock:
            thread = self._thread
            self._stopping.set()  # from here on, start() refuses, and a new thread stops at once
        if thread is None:
            return StopReport(self.name, terminated=True, elapsed=time.monotonic() - start)
        if thread is threading.current_thread():
            raise RuntimeError(f"{self!r}: stop() called from its own thread; return instead")
        # A start() in another thread may still be inside Thread.start: wait for it, within
        # the budget, since a thread cannot be joined before Thread.start returns.
        if self._start_settled.wait(timeout) and thread.ident is not None:
            thread.join(max(0.0, start + timeout - time.monotonic()))
        # ident None: Thread.start failed, so no thread ran (or, if a real signal cut
        # start() short before the thread announced itself, it runs with stopping set).
        terminated = self._start_settled.is_set() and not thread.is_alive()
        report = StopReport(self.name, terminated, time.monotonic() - start, self._error)
        if not report.terminated:
            logger.log(self._late_level, "%s did not stop within %.3gs", self.name, timeout)
        return report

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(self.stop_timeout)

    def _run(self) -> None:
        try:
            self._work(self._stopping)
        except BaseException as exc:  # recorded for the report and logged now, never silent
            self._error = exc
            logger.exception("%s failed", self.name)


class BackgroundService(_ThreadService):
    """Background work in a non-daemon thread, stopped by ``main`` with a budget.

    ``work(stopping)`` runs in a thread named ``name`` until it returns; it must return
    soon after ``stopping`` is set, so it checks the event between steps and waits with
    ``stopping.wait(t)``. Follows the `Service` contract; leaving a ``with`` block stops
    it with ``stop_timeout``. If the work ignores the stop, `Service.stop` still returns on time
    (logging an ERROR) but the thread lives on, and being non-daemon it will hold the
    interpreter's exit: log the report and escalate (`os._exit`) if the program must end.
    """

    def __init__(
        self,
        work: Callable[[threading.Event], object],
        *,
        name: str,
        stop_timeout: float = 5.0,
    ) -> None:
        super().__init__(work, name=name, stop_timeout=stop_timeout)


class HousekeepingDaemon(_ThreadService):
    """Work whose loss is harmless (a heartbeat, a cache cleaner) in a daemon thread.

    Being a daemon, it never keeps the process alive. `start` also registers a bounded
    stop-and-join with ``atexit``: when the interpreter exits, the work is asked to stop
    and given ``stop_timeout`` seconds to end cleanly; if it does not, a WARNING is
    logged and the thread is abandoned. An explicit `stop` unregisters that handler.
    Never give it work that must finish (a file write, a commit): that is P15.
    """

    _daemon = True
    _late_level = logging.WARNING  # abandoning it is allowed, so it is not an error

    def __init__(
        self,
        work: Callable[[threading.Event], object],
        *,
        name: str,
        stop_timeout: float = 1.0,
    ) -> None:
        super().__init__(work, name=name, stop_timeout=stop_timeout)

    def start(self) -> None:
        """Start the daemon thread and register its stop with ``atexit``."""
        # Registered after this module imported logging, so it runs before the
        # logging.shutdown handler (atexit runs newest first) and can still log (P21).
        atexit.register(self._stop_at_exit)
        try:
            super().start()
        except BaseException:
            atexit.unregister(self._stop_at_exit)
            raise

    def stop(self, timeout: float) -> StopReport:
        """Unregister the ``atexit`` handler, then stop as `Service.stop` says."""
        atexit.unregister(self._stop_at_exit)
        return super().stop(timeout)

    def _stop_at_exit(self) -> None:
        # Called by atexit, which is iterating its handlers: do not unregister here.
        report = super().stop(self.stop_timeout)
        logger.debug("%s stopped at exit: %s", self.name, report)


def every(interval: float, tick: Callable[[], object]) -> Callable[[threading.Event], None]:
    """Work that calls ``tick()`` at once and then every ``interval`` seconds until stopped.

    Between ticks it waits on the stop event, so a stop ends the wait at once; a tick
    already running finishes first.
    """

    def work(stopping: threading.Event) -> None:
        while not stopping.is_set():
            tick()
            stopping.wait(interval)

    return work


def run_with_service(
    main: Callable[[], T],
    work: Callable[[threading.Event], object],
    *,
    name: str,
    stop_timeout: float,
) -> T:
    """Run ``main()`` while ``work`` runs in a `BackgroundService` stopped in its ``finally``.

    The fix for P15 and P16: the thread is non-daemon, so it is never abandoned, and it
    is stopped by ``main``'s ``finally``, before the interpreter starts waiting for it.
    Returns what ``main`` returns; ``stop_timeout`` bounds the stop.
    """
    service = BackgroundService(work, name=name, stop_timeout=stop_timeout)
    service.start()  # stops what it started if it fails part-way, so outside the try
    try:
        return main()
    finally:
        service.stop(stop_timeout)


# --- Broken on purpose: the naive versions the tests and docs compare against ------------


def naive_run_with_daemon(
    main: Callable[[], T], work: Callable[[threading.Event], object], *, name: str
) -> T:
    """Broken on purpose: work in a daemon thread is abandoned mid-work at exit (P15).

    Nothing ever sets the stop event. When ``main`` returns, the interpreter exits
    without waiting for the thread: its ``finally`` blocks never run, a file it was
    writing is left half-written, and the exit status is 0 all the same.
    """
    stopping = threading.Event()
    threading.Thread(target=work, args=(stopping,), name=name, daemon=True).start()
    return main()


def naive_run_with_atexit_stop(
    main: Callable[[], T], work: Callable[[threading.Event], object], *, name: str
) -> T:
    """Broken on purpose: an ``atexit`` handler cannot stop a non-daemon thread (P16).

    The interpreter joins every non-daemon thread before it runs any ``atexit`` handler,
    so the handler that would set the stop event waits for the thread, which waits for
    the event: the process hangs after ``main`` returns.
    """
    stopping = threading.Event()
    threading.Thread(target=work, args=(stopping,), name=name).start()
    atexit.register(stopping.set)
    return main()
