"""The stop that runs once, and resumes after a Ctrl-C; every other ``stop()`` gets an answer.

TL;DR: ``Worker.stop`` hands its budget and its stop script to `ResumableStop.stop`, which
decides what this call is: the owner (it runs the script, which records the report with
`ResumableStop.finish`), a call from a thread already inside a stop (the owner's or one
waiting for it: a signal handler, a hook) or from the worker's own threads (answered at
once), or a second caller (waits for the owner within its own budget). A Ctrl-C that
interrupts the owner before it recorded the report leaves no owner: the next ``stop()``
runs the script again, from where it was. `ResumableStop.finish` records the report and
calls ``on_shutdown`` once.

Pattern:
    The project's lifecycle contract (docs/design.md): the first finished stop is the
    report; every other caller keeps its own budget; a stop inside a stop returns at
    once; a stop from the object's own thread is a request; a Ctrl-C during a stop
    leaves the next report truthful (the interrupted owner records nothing, and the next
    stop resumes); callbacks are contained (a callback's ``KeyboardInterrupt`` or
    ``SystemExit`` is raised once the report is recorded).

See also: ``patterns.jobqueue.worker.stop_script`` (the script), ``tests/test_contract.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from patterns.jobqueue.tasks import Phase
from patterns.jobqueue.worker.errors import ErrorLog
from patterns.jobqueue.worker.report import WorkerReport
from patterns.jobqueue.worker.shared import StoppingThread
from patterns.jobqueue.worker.threads import wait

__all__ = ["ResumableStop", "Script"]


class Script(Protocol):
    """The work of the owning stop, and the report of what runs now."""

    def run(self, budget: float, start: float) -> WorkerReport:
        """Stop the worker within ``budget``; ends with `ResumableStop.finish`.

        Interrupted (Ctrl-C), it runs again from where it was at the next ``stop()``.
        """
        ...

    def provisional(self, start: float, caller: str | None) -> WorkerReport:
        """A report of what runs now, not recorded (``caller``: the worker's own thread)."""
        ...


class ResumableStop:
    """Which ``stop()`` call owns the shutdown, and what the others get; see the module.

    Collaborators: ``lock``, the worker's; ``stopping``, where the owner's thread is kept;
    ``errors``, which records an ``on_shutdown`` that raised; ``own_thread()``: is the
    caller one of the worker's threads; ``request_stop(reason)``; ``on_shutdown(report)``,
    the user's.
    """

    def __init__(
        self,
        lock: threading.RLock,
        stopping: StoppingThread,
        errors: ErrorLog,
        *,
        own_thread: Callable[[], bool],
        request_stop: Callable[[str], None],
        on_shutdown: Callable[[WorkerReport], object] | None,
    ) -> None:
        self._lock, self._stopping, self._errors = lock, stopping, errors
        self._own_thread, self._request_stop = own_thread, request_stop
        self._on_shutdown = on_shutdown
        # Guarded by ``lock``, with ``stopping.thread``: the thread running the stop that
        # owns the shutdown; None again if that stop was interrupted (Ctrl-C) before it
        # recorded its report, so that the next one resumes. The report, once recorded:
        self.report: WorkerReport | None = None
        self._hook_called = False  # on_shutdown runs once, even if a stop is retried
        # Set once the owning stop has recorded the report; waited on by other stops.
        self._stopped = threading.Event()
        # Idents of the threads inside stop(), owning it or waiting for the owner: a stop()
        # that finds its own thread here is a signal handler or a callback on top of that
        # call, which cannot go on until it returns, so it is answered at once. A set, not
        # a lock: add and discard are atomic, and a handler reading it takes no lock.
        self._in_stop: set[int] = set()

    def begun(self) -> bool:
        """A stop has begun or ended (lock held)."""
        return self._stopping.thread is not None or self.report is not None

    def stop(self, budget: float, script: Script) -> WorkerReport:
        """The report of the stop this call is (see ``Worker.stop`` for each case)."""
        start = time.monotonic()
        ident = threading.get_ident()
        if ident in self._in_stop:  # a signal handler or a callback inside this thread's stop
            return self.report or script.provisional(start, None)
        try:  # added inside the try: a Ctrl-C here cannot leave this thread marked inside
            self._in_stop.add(ident)
            return self._stop(budget, start, script)
        finally:
            self._in_stop.discard(ident)

    def _stop(self, budget: float, start: float, script: Script) -> WorkerReport:
        me = threading.current_thread()
        with self._lock:  # an RLock: a signal handler on the stopping thread gets in
            if self.report is not None:
                return self.report
            inside = self._stopping.thread is me
            own = not inside and self._own_thread()
            owner = not inside and not own and self._stopping.thread is None
            if owner:
                self._stopping.thread = me
        if inside:  # a signal handler or a callback of the stop in progress
            return self.report or script.provisional(start, None)
        if own:  # it cannot wait for itself: a request
            self._request_stop(f"stop() called from the worker's own thread {me.name}")
            return script.provisional(start, me.name)
        if not owner:
            wait(self._stopped, budget)
            return self.report or script.provisional(start, None)
        try:
            report = script.run(budget, start)
        except BaseException:
            with self._lock:
                if self.report is None:  # interrupted: the next stop() resumes the shutdown
                    self._stopping.thread = None
            raise
        deferred = self._stopping.take_deferred()
        if deferred is not None:  # a callback's KeyboardInterrupt/SystemExit, now
            raise deferred
        return report

    def finish(self, report: WorkerReport) -> WorkerReport:
        """Call ``on_shutdown`` once, then record ``report``: later stops return it."""
        with self._lock:
            call, self._hook_called = not self._hook_called, True
        if call and self._on_shutdown is not None:
            try:
                self._on_shutdown(report)
            except BaseException as exc:  # noqa: BLE001 - a PhaseError: logged by the error log
                error = self._errors.unexpected(Phase.ON_SHUTDOWN, None, exc)
                report = replace(report, errors=(*report.errors, error))
                if isinstance(exc, KeyboardInterrupt | SystemExit):
                    self._stopping.defer(exc)  # raised once the report is kept
        with self._lock:
            self.report = report
        self._stopped.set()
        return report
