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
      after ``stop()``, raises `RuntimeError`. ``with service.start():`` and
      ``with service:`` both work and both stop the service on the way out.
    * ``stop(timeout=None)`` (``None``: ``stop_timeout``; ``math.inf``: as long as it
      takes) returns within its budget (plus scheduling noise) whatever the work does,
      never raises because the work is stuck, and the first report that completes is
      returned to every later call; ``report.terminated`` is True exactly when the
      thread's own end signal is set (never judged by ``join()``, which a Ctrl-C can
      fool before 3.13), and then every ``finally`` of the work has run.
    * A ``stop()`` from the service's own thread, or from a signal handler that
      interrupted this service's ``start()``/``stop()`` (running it, or waiting for
      another thread's), is a request: it sets the stop event and returns a provisional
      report at once, without deadlocking.
    * An exception from the work is logged at ERROR when it happens and kept in
      ``report.error``.
    * A `HousekeepingDaemon` never keeps the process alive and delays interpreter exit by
      at most its own ``stop_timeout``.
    * An exception (a Ctrl-C) leaving its ``with`` block is logged at WARNING with the
      budget the stop may take, then what the stop left; a second Ctrl-C during that
      wait stops now (``stop(0)``), names what is still running in one line and ends
      in one KeyboardInterrupt, not two chained tracebacks.

Python: 3.11+, standard library only; the exit order it relies on was checked on 3.11.7,
3.12.1 and 3.13.0.

Docs: docs/patterns/daemon_threads.md (the exit order, the pitfalls P15 and P16, why
not ``threading._register_atexit``, the Java counterpart).
"""

from __future__ import annotations

import atexit
import logging
import math
import sys
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
    """What a ``stop()`` call achieved (the first that completes is returned to every later call).

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

    def __post_init__(self) -> None:
        if self.terminated and self.still_running:
            raise ValueError(f"terminated=True with still_running={self.still_running!r}")


class Service(Protocol):
    """The lifecycle contract of something that runs in the background.

    ``start()`` starts it and returns it, all or nothing (what it started is stopped if it
    fails part-way), and only once (`RuntimeError` after a first ``start()`` or a
    ``stop()``). ``stop(timeout=None)`` asks the work to stop, waits at most ``timeout``
    seconds (None: ``stop_timeout``; ``math.inf``: as long as it takes) and reports; the
    first report that completes is recorded and returned to every later call. A stop
    racing it waits at most its own budget for that report, else returns a provisional
    one (not recorded). A stop from the service's own thread, or from a signal handler
    that interrupted a ``start()`` or ``stop()`` of the same service, only asks: it
    returns a provisional report at once. ``with`` starts a service that was never
    started, enters a running one as it is, and stops it on the way out.
    """

    name: str
    stop_timeout: float

    def start(self) -> Self:
        """Start the background work and return self."""

    def stop(self, timeout: float | None = None) -> StopReport:
        """Stop within ``timeout`` (None: ``stop_timeout``) seconds and report."""

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc_info: object) -> None: ...


class _ThreadService:
    """One thread running ``work(stopping)``; shared by the two public services."""

    _daemon = False
    _late_level = logging.ERROR  # how loudly stop() reports a thread that outlived it

    def __init__(
        self, work: Callable[[threading.Event], object], *, name: str, stop_timeout: float
    ) -> None:
        self.name = name
        # The budget of stop() (with, atexit) when none is given.
        self.stop_timeout = _seconds(stop_timeout, "stop_timeout")
        self._work = work
        # Set by the first stop() (from any thread, a request included); waited on by the
        # work, which must return soon after it is set. Never cleared.
        self._stopping = threading.Event()
        # One-shot: taken by the first start(), or by a stop() that came first, never
        # released. No stop path blocks on it (it is only tried), so no lock is waited on
        # by stop(), and a signal handler's stop() cannot deadlock on it.
        self._claim = threading.Lock()
        self._starter: int | None = None  # ident of the thread inside start(), for R4
        self._thread: threading.Thread | None = None
        self._ended: _Ended | None = None
        # Set by start() once Thread.start has returned or raised; waited on (within its
        # budget) by a stop() that raced start(), since until then the thread is not known.
        self._start_settled = threading.Event()
        # Tried (never waited on) by stop(): its holder builds the report.
        self._stop_lock = threading.Lock()
        # Idents of the threads inside stop(), running it or waiting for another's: a stop()
        # that finds its own thread here is a signal handler (or a callback) on top of that
        # call, which cannot go on until it returns, so it returns at once. A set, not a
        # lock: add and discard are atomic, and a handler reading it takes no lock.
        self._in_stop: set[int] = set()
        self._report: StopReport | None = None
        self._reported = threading.Event()  # set once _report is recorded; others wait on it
        self._error: BaseException | None = None  # written by the thread before it ends

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    def start(self) -> Self:
        """Start the thread and return self; see `Service.start`."""
        if not self._claim.acquire(blocking=False):
            raise RuntimeError(f"{self!r} can only be started once, and not after stop()")
        self._starter = threading.get_ident()
        ended = _Ended(self._run)
        thread = threading.Thread(target=ended.run, name=self.name, daemon=self._daemon)
        self._ended, self._thread = ended, thread  # published first, for a racing stop()
        try:
            self._on_start()
            thread.start()
        except BaseException:  # no thread, or a Ctrl-C after it began: stop it, re-raise
            ended.cancel_unstarted()
            self._start_settled.set()
            self.stop()  # the caller gets no service to stop: we do it
            raise
        self._start_settled.set()
        return self

    def _on_start(self) -> None:
        """Called by start() before the thread starts (HousekeepingDaemon registers atexit)."""

    def stop(self, timeout: float | None = None) -> StopReport:
        """Set the stop event, wait at most ``timeout`` seconds, report; see `Service.stop`."""
        began = time.monotonic()
        deadline = began + (self.stop_timeout if timeout is None else _seconds(timeout, "timeout"))
        if self._report is not None:
            return self._report
        own = self._thread is threading.current_thread()
        if own or (self._starter == threading.get_ident() and not self._start_settled.is_set()):
            self._stopping.set()  # a request: the thread cannot wait for itself
            return self._provisional(began)
        return _hand_off(self, began, deadline)  # _stop_once, run by one stop() at a time

    def _provisional(self, began: float) -> StopReport:
        # The current truth, not recorded: a later stop() may still report the end.
        ended = self._ended is not None and self._ended.event.is_set()
        settled = self._start_settled.is_set() or self._thread is None
        done = settled and (self._ended is None or ended)
        still = () if done else (self.name,)
        return StopReport(done, still, self.name, time.monotonic() - began, self._error)

    def _stop_once(self, began: float, deadline: float) -> StopReport:
        self._stopping.set()  # from here on a new thread stops at once
        if self._claim.acquire(blocking=False):  # never started: start() now refuses
            return StopReport(True, (), self.name, time.monotonic() - began)
        # A start() in another thread may still be inside Thread.start: wait for it.
        settled = _wait(self._start_settled, deadline)
        ended, thread = self._ended, self._thread
        terminated = settled and ended is not None and _wait(ended.event, deadline)
        if terminated and thread is not None and thread.ident is not None:
            # Its target has returned; join only lets threading finish its bookkeeping.
            thread.join(_left(deadline))
        still_running = () if terminated else (self.name,)
        elapsed = time.monotonic() - began
        if not terminated:
            logger.log(
                self._late_level, "%s did not stop within %.3gs", self.name, deadline - began
            )
        return StopReport(terminated, still_running, self.name, elapsed, self._error)

    def __enter__(self) -> Self:
        if self._stopping.is_set():
            raise RuntimeError(f"{self!r} was stopped: it cannot be entered again")
        if self._claim.locked():
            return self  # already running: ``with service.start():`` enters it as it is
        return self.start()

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
                self.name,
                why,
                self.stop_timeout,
            )
            report = self.stop()
        except KeyboardInterrupt:  # a second Ctrl-C: a stop with no time left, one line
            report = self.stop(0)
            logger.warning(
                "%s: interrupted: stopping now: still running: %s",
                self.name,
                ", ".join(report.still_running) or "nothing",
            )
            raise KeyboardInterrupt from None  # one traceback, not two chained
        logger.warning(
            "%s: stopped after %s: terminated=%s, still running: %s",
            self.name,
            why,
            report.terminated,
            ", ".join(report.still_running) or "nothing",
        )

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
    logged and the thread is abandoned. An explicit `stop` that records its report
    unregisters that handler; a refused ``start()`` or a request from its own thread
    leaves it registered.
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

    def _on_start(self) -> None:
        # Called only by the start() that claimed the service, so a refused second start()
        # never touches the registration. Registered after this module imported logging,
        # so it runs before the logging.shutdown handler (atexit runs newest first) and
        # can still log (P21).
        atexit.register(self._stop_at_exit)

    def stop(self, timeout: float | None = None) -> StopReport:
        """Stop as `Service.stop` says; the recorded report also unregisters the ``atexit`` handler.

        A request (from the daemon's own thread) or a provisional report leaves the
        handler registered: ``atexit.unregister`` drops every registration of this
        daemon, and the one made by ``start()`` must still stop it at exit.
        """
        report = super().stop(timeout)
        if report is self._report:
            atexit.unregister(self._stop_at_exit)
        return report

    def _stop_at_exit(self) -> None:
        # Called by atexit, which is iterating its handlers: do not unregister here.
        report = super().stop()
        logger.debug("%s stopped at exit: %s", self.name, report)


def every(interval: float, tick: Callable[[], object]) -> Callable[[threading.Event], None]:
    """Work that calls ``tick()`` at once and then every ``interval`` seconds until stopped.

    Between ticks it waits on the stop event, so a stop ends the wait at once; a tick
    already running finishes first. ``interval`` may be ``math.inf`` (tick once).
    """
    seconds = _seconds(interval, "interval")

    def work(stopping: threading.Event) -> None:
        while not stopping.is_set():
            tick()
            _wait(stopping, _deadline(seconds))

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


# --- the lifecycle contract: seconds, deadlines, the thread's own end signal ------------------
#
# The seconds family is the same code in every module that holds it, since a module is
# copied alone (tests/test_copies.py). Every wait of stop() is bounded by one deadline.


def _seconds(value: object, name: str, *, allow_none: bool = False) -> float:
    """``value`` as seconds: a number >= 0 (inf, or a huge one: as long as it takes)."""
    if value is None and allow_none:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return math.inf if value > sys.float_info.max else float(value)


def _deadline(seconds: float) -> float:
    return time.monotonic() + seconds


def _left(deadline: float) -> float:
    """Seconds until ``deadline`` for a C wait: never negative, never above TIMEOUT_MAX."""
    return min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)


def _wait(event: threading.Event, deadline: float) -> bool:
    """Wait for ``event`` until the monotonic ``deadline`` (may be inf); True if it is set."""
    while not event.wait(_left(deadline)):
        if time.monotonic() >= deadline:
            return False
    return True


def _hand_off(service: _ThreadService, began: float, deadline: float) -> StopReport:
    """The stopper hand-off: one stop() builds and records the report; the others wait.

    A stop() that finds its own thread already inside one is a signal handler (or a
    callback) on top of it: a request, answered at once. A stop() racing another waits for
    that report within its own budget, else answers with a provisional one.
    """
    me = threading.get_ident()
    if me in service._in_stop:  # a signal handler inside this thread's stop(): never block
        # No _stopping.set() here: the stop it interrupted sets the event (or the stop that
        # one waits for does) and may be inside that set(), holding the event's lock, which
        # this thread would then wait for forever (E1).
        return service._provisional(began)
    try:  # added inside the try: a Ctrl-C here cannot leave this thread marked inside
        service._in_stop.add(me)
        if service._stop_lock.acquire(blocking=False):
            try:
                if service._report is None:
                    service._report = service._stop_once(began, deadline)
                    service._reported.set()
                return service._report
            finally:
                service._stop_lock.release()
        # Another stop() builds the report: wait for it within our own budget.
        if _wait(service._reported, deadline) and service._report is not None:
            return service._report
        service._stopping.set()
        return service._provisional(began)
    finally:
        service._in_stop.discard(me)


# supervisor._Tracked is its twin, shaped for that module; tests/test_copies.py checks both.
class _Ended:
    """A thread's own end signal, set in its target's ``finally`` (never ``is_alive()``).

    Before 3.13 a Ctrl-C that interrupts ``Thread.join()`` marks a live thread finished
    (gh-90882), so no report is built on ``join()`` or ``is_alive()``; it waits on this.
    """

    def __init__(self, target: Callable[[], object]) -> None:
        self.event = threading.Event()  # set by the thread on its way out; waited on by stop()
        # Taken by the thread as it begins, or by cancel_unstarted() after a failed
        # Thread.start: whoever takes it first decides whether the target ever runs.
        self._claim = threading.Lock()
        self._target = target

    def run(self) -> None:
        try:
            if self._claim.acquire(blocking=False):
                self._target()
        finally:
            self.event.set()

    def cancel_unstarted(self) -> None:
        """After ``Thread.start`` raised: a thread that had not begun will never run the target."""
        if self._claim.acquire(blocking=False):
            self.event.set()
