"""One stop owns the shutdown; every other ``stop()`` call gets an answer within its budget.

TL;DR: ``Worker.stop`` hands its budget to `StopOnce.stop`, which decides what this call
is: the owner (it runs the worker's stop script and records the report), a call from a
thread already inside a stop (the owner's or one waiting for it: a signal handler, a
hook) or from the worker's own threads (answered at once), or a second caller (waits
for the owner within its own budget). `StopOnce.finish` records the report, calls
``on_shutdown`` once, and puts the signal handlers back last.

Pattern:
    The project's lifecycle contract (docs/design.md): the first finished stop is the
    report; every other caller keeps its own budget; a stop inside a stop returns at
    once; a stop from the object's own thread is a request; a Ctrl-C during a stop
    leaves the next report truthful (the interrupted owner records nothing, and the next
    stop resumes); callbacks are contained (a callback's ``KeyboardInterrupt`` or
    ``SystemExit`` is raised once the report is recorded).

See also: ``patterns.jobqueue.worker.worker`` (the stop script), ``tests/test_contract.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace

from patterns.jobqueue.stores.records import Job
from patterns.jobqueue.tasks import Phase, PhaseError
from patterns.jobqueue.worker.report import WorkerReport
from patterns.jobqueue.worker.threads import wait

__all__ = ["StopOnce"]


class StopOnce:
    """Which ``stop()`` call owns the shutdown, and what the others get; see the module.

    Collaborators: ``lock``, the worker's; ``shut_down(budget, start)``: the stop script,
    which ends with `finish`; ``provisional(start, caller)``: a report of what runs now,
    not recorded; ``own_thread()``: is the caller one of the worker's threads;
    ``request_stop(reason)``; ``on_shutdown(report)``, the user's; ``error(phase, job,
    exc)``; ``close_signals()``: put Python's signal handlers back.
    """

    def __init__(
        self,
        lock: threading.RLock,
        *,
        shut_down: Callable[[float, float], WorkerReport],
        provisional: Callable[[float, str | None], WorkerReport],
        own_thread: Callable[[], bool],
        request_stop: Callable[[str], None],
        on_shutdown: Callable[[WorkerReport], object] | None,
        error: Callable[[Phase, Job | None, BaseException], PhaseError],
        close_signals: Callable[[], None],
    ) -> None:
        self._lock = lock
        self._shut_down, self._provisional = shut_down, provisional
        self._own_thread, self._request_stop = own_thread, request_stop
        self._on_shutdown, self._error, self._close_signals = on_shutdown, error, close_signals
        # Guarded by ``lock``. The report, once the owning stop has recorded it.
        self.report: WorkerReport | None = None
        # The thread running the stop that owns the shutdown; None again if that stop was
        # interrupted (Ctrl-C) before it recorded its report, so that the next one resumes.
        self._owner: threading.Thread | None = None
        self._hook_called = False  # on_shutdown runs once, even if a stop is retried
        # A KeyboardInterrupt or SystemExit from a callback run by the stopping thread
        # (on_shutdown, on_unexpected_error): re-raised once the report is recorded.
        self._deferred: BaseException | None = None
        # Set once the owning stop has recorded the report; waited on by other stops.
        self._stopped = threading.Event()
        # Idents of the threads inside stop(), owning it or waiting for the owner: a stop()
        # that finds its own thread here is a signal handler or a callback on top of that
        # call, which cannot go on until it returns, so it is answered at once. A set, not
        # a lock: add and discard are atomic, and a handler reading it takes no lock.
        self._in_stop: set[int] = set()

    def begun(self) -> bool:
        """A stop has begun or ended (lock held)."""
        return self._owner is not None or self.report is not None

    def in_stopping_thread(self) -> bool:
        """The caller is the thread running the owning stop (a signal handler, a hook)."""
        return self._owner is threading.current_thread()

    def defer(self, exc: BaseException) -> None:
        """Keep a callback's Ctrl-C or exit, for the owning stop to raise once recorded."""
        self._deferred = self._deferred or exc

    def stop(self, budget: float) -> WorkerReport:
        """The report of the stop this call is (see ``Worker.stop`` for each case)."""
        start = time.monotonic()
        ident = threading.get_ident()
        if ident in self._in_stop:  # a signal handler or a callback inside this thread's stop
            return self.report or self._provisional(start, None)
        try:  # added inside the try: a Ctrl-C here cannot leave this thread marked inside
            self._in_stop.add(ident)
            return self._stop(budget, start)
        finally:
            self._in_stop.discard(ident)

    def _stop(self, budget: float, start: float) -> WorkerReport:
        me = threading.current_thread()
        with self._lock:  # an RLock: a signal handler on the stopping thread gets in
            if self.report is not None:
                return self.report
            inside = self._owner is me
            own = not inside and self._own_thread()
            owner = not inside and not own and self._owner is None
            if owner:
                self._owner = me
        if inside:  # a signal handler or a callback of the stop in progress
            return self.report or self._provisional(start, None)
        if own:  # it cannot wait for itself: a request
            self._request_stop(f"stop() called from the worker's own thread {me.name}")
            return self._provisional(start, me.name)
        if not owner:
            wait(self._stopped, budget)
            return self.report or self._provisional(start, None)
        try:
            report = self._shut_down(budget, start)
        except BaseException:
            with self._lock:
                if self.report is None:  # interrupted: the next stop() resumes the shutdown
                    self._owner = None
            raise
        deferred, self._deferred = self._deferred, None
        if deferred is not None:  # a callback's KeyboardInterrupt/SystemExit, now
            raise deferred
        return report

    def finish(self, report: WorkerReport) -> WorkerReport:
        """Call ``on_shutdown`` once, record ``report``, then put the signal handlers back."""
        with self._lock:
            call, self._hook_called = not self._hook_called, True
        if call and self._on_shutdown is not None:
            try:
                self._on_shutdown(report)
            except BaseException as exc:  # noqa: BLE001 - a PhaseError: logged by error()
                error = self._error(Phase.ON_SHUTDOWN, None, exc)
                report = replace(report, errors=(*report.errors, error))
                if isinstance(exc, KeyboardInterrupt | SystemExit):
                    self.defer(exc)  # raised once the report is kept
        with self._lock:
            self.report = report
        self._stopped.set()
        # Last: once Python's own SIGINT handler is back, a Ctrl-C raises right here, and
        # the report must already be the final one.
        self._close_signals()
        return report
