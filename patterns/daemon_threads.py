# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""Decide how each background thread ends at exit: stopped by ``main``, or abandoned on purpose.

TL;DR::

    with BackgroundService(work, name="exporter"):   # work(stopping) checks the event
        main()                                       # stop() runs on the way out
    # harmless work (a heartbeat): HousekeepingDaemon(every(5, beat), name="hb").start()

Guarantees:
    * ``start()`` is all or nothing and returns the service; a second ``start()``, or one
      after ``stop()``, raises `RuntimeError`.
    * ``stop(timeout=None)`` (``None``: ``stop_timeout``) returns within its budget (plus
      scheduling noise) whatever the work does, never raises because the work is stuck,
      and returns the same `StopReport` to every call; ``report.terminated`` is True
      exactly when the thread has ended, and then every ``finally`` of the work has run.
    * An exception from the work is logged at ERROR when it happens and kept in
      ``report.error``.
    * A `HousekeepingDaemon` never keeps the process alive and delays interpreter exit by
      at most its own ``stop_timeout``.

Python: 3.11+, standard library only; the exit order it relies on was checked on 3.11.7,
3.12.1 and 3.13.0.

Docs: docs/patterns/daemon_threads.md (the exit order, the pitfalls P15 and P16, why
not ``threading._register_atexit``, the Java counterpart).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
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
    """What the first ``stop()`` call achieved (every later call returns this same object).

    Attributes:
        terminated: the thread has ended (or was never started).
        still_running: the thread's name while it is still running, else empty.
        name: the service's name (also its thread's name).
        elapsed: seconds the ``stop`` call took.
        error: the exception the work raised, if it had failed by then.
    """

    terminated: bool
    still_running: tuple[str, ...]
    name: str
    elapsed: float
    error: BaseException | None = None


class Service(Protocol):
    """The lifecycle contract of something that runs in the background.

    ``start()`` starts it and returns it, all or nothing (what it started is stopped if it
    fails part-way), and only once (`RuntimeError` after a first ``start()`` or a
    ``stop()``). ``stop(timeout=None)`` asks the work to stop, waits at most ``timeout``
    seconds (None: ``stop_timeout``) and reports; every later call (or one racing it)
    returns the same report. Stopped before it started, it reports ``terminated``. Leaving
    a ``with`` block calls ``stop()``, whether the block raised or not.
    """

    name: str
    stop_timeout: float

    def start(self) -> Self:
        """Start the background work and return self."""

    def stop(self, timeout: float | None = None) -> StopReport:
        """Stop within ``timeout`` (None: ``stop_timeout``) seconds; the first report, always."""

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc_info: object) -> None: ...


class _ThreadService:
    """One thread running ``work(stopping)``; shared by the two public services."""

    _daemon = False
    _late_level = logging.ERROR  # how loudly stop() reports a thread that outlived it

    def __init__(
        self, work: Callable[[threading.Event], object], *, name: str, stop_timeout: float
    ) -> None:
        if stop_timeout < 0:
            raise ValueError(f"stop_timeout must be 0 or more seconds, not {stop_timeout!r}")
        self.name = name
        self.stop_timeout = stop_timeout  # the budget of stop() (with, atexit) when none is given
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
        # Held by the stop() that builds the report, for its whole (bounded) run; a stop()
        # racing it waits here, then returns the same report.
        self._stop_lock = threading.Lock()
        self._report: StopReport | None = None
        self._error: BaseException | None = None  # written by the thread before it ends

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    def start(self) -> Self:
        """Start the thread and return self; see `Service.start`."""
        with self._lock:
            if self._thread is not None or self._stopping.is_set():
                raise RuntimeError(f"{self!r} can only be started once, and not after stop()")
            thread = threading.Thread(target=self._run, name=self.name, daemon=self._daemon)
            self._thread = thread  # published first, so a stop() racing us can find it
        try:
            thread.start()
        except BaseException:  # no thread, or a Ctrl-C after it began: stop it, re-raise
            self._start_settled.set()
            self.stop()  # the caller gets no service to stop: we do it
            raise
        self._start_settled.set()
        return self

    def stop(self, timeout: float | None = None) -> StopReport:
        """Set the stop event, join for at most ``timeout`` seconds, report; see `Service.stop`."""
        budget = self.stop_timeout if timeout is None else timeout
        if budget < 0:
            raise ValueError(f"stop() needs a timeout of 0 or more seconds, not {timeout!r}")
        if self._thread is threading.current_thread():
            raise RuntimeError(f"{self!r}: stop() called from its own thread; return instead")
        with self._stop_lock:
            if self._report is None:
                self._report = self._stop_once(budget)
            return self._report

    def _stop_once(self, timeout: float) -> StopReport:
        start = time.monotonic()
        with self._lock:
            thread = self._thread
            self._stopping.set()  # from here on, start() refuses, and a new thread stops at once
        if thread is None:
            return StopReport(True, (), self.name, time.monotonic() - start)
        # A start() in another thread may still be inside Thread.start: wait for it, within
        # the budget, since a thread cannot be joined before Thread.start returns.
        if self._start_settled.wait(timeout) and thread.ident is not None:
            thread.join(max(0.0, start + timeout - time.monotonic()))
        # ident None: Thread.start failed, so no thread ran (or, if a real signal cut
        # start() short before the thread announced itself, it runs with stopping set).
        terminated = self._start_settled.is_set() and not thread.is_alive()
        still_running = () if terminated else (self.name,)
        elapsed = time.monotonic() - start
        if not terminated:
            logger.log(self._late_level, "%s did not stop within %.3gs", self.name, timeout)
        return StopReport(terminated, still_running, self.name, elapsed, self._error)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

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
    ``stopping.wait(t)``. Follows the `Service` contract. If the work ignores the stop,
    `Service.stop` still returns on time (logging an ERROR) but the thread lives on, and
    being non-daemon it will hold the interpreter's exit: log the report and escalate
    (`os._exit`) if the program must end.
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

    def start(self) -> Self:
        """Start the daemon thread, register its stop with ``atexit``, return self."""
        # Registered after this module imported logging, so it runs before the
        # logging.shutdown handler (atexit runs newest first) and can still log (P21).
        atexit.register(self._stop_at_exit)
        try:
            return super().start()
        except BaseException:
            atexit.unregister(self._stop_at_exit)
            raise

    def stop(self, timeout: float | None = None) -> StopReport:
        """Unregister the ``atexit`` handler, then stop as `Service.stop` says."""
        atexit.unregister(self._stop_at_exit)
        return super().stop(timeout)

    def _stop_at_exit(self) -> None:
        # Called by atexit, which is iterating its handlers: do not unregister here.
        report = super().stop()
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
    service = BackgroundService(work, name=name, stop_timeout=stop_timeout).start()
    try:  # start() stops what it started if it fails part-way, so it is outside the try
        return main()
    finally:
        service.stop()
