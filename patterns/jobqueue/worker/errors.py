"""The worker's errors: each one logged, kept for the report, and never a silent death.

TL;DR: `ErrorLog.unexpected` records an error outside a handler as a
`~patterns.jobqueue.tasks.PhaseError` (logged, kept, passed to ``on_unexpected_error``);
`ErrorLog.hook` runs a task's hook with its errors contained; `ErrorLog.thread_died`
records a worker thread's death and stops the worker.

Pattern:
    ``patterns.thread_exceptions``: a thread that dies is a
    `~patterns.thread_exceptions.ThreadFailure` record, logged at CRITICAL, not a
    traceback on stderr that nobody reads. A hook's ``KeyboardInterrupt`` or
    ``SystemExit`` run by the stopping thread is deferred until the report is recorded
    (`~patterns.jobqueue.worker.shared.StoppingThread`), as ``patterns.signal_handlers``
    contains callbacks.

Guarantees:
    * Every error is logged once and counted exactly; the most recent 100 are kept.
    * ``on_unexpected_error`` that raises is logged and ignored (never recursed into).

See also: ``patterns.jobqueue.worker.worker`` (what wires it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from patterns.jobqueue.stores.deadline import StoreTimeout
from patterns.jobqueue.stores.records import CommitUnknown, Job
from patterns.jobqueue.tasks import Phase, PhaseError
from patterns.jobqueue.worker.shared import StoppingThread
from patterns.thread_exceptions import ThreadFailure

__all__ = ["ErrorLog"]

logger = logging.getLogger(__name__)

MAX_ERRORS_KEPT = 100  # PhaseErrors kept for the report; the count in stats is exact


class ErrorLog:
    """The worker's errors and dead threads; see the module docstring.

    Collaborators: ``lock``, the worker's; ``on_unexpected_error(error)``, the tasks' hook;
    ``own_thread()``: is the caller one of the worker's threads; ``stopping``: which
    thread runs the stop, and where a Ctrl-C or exit raised in it is kept for the stop to
    raise once its report is recorded; ``request_stop(reason)``.
    """

    def __init__(
        self,
        worker: str,
        *,
        lock: threading.RLock,
        on_unexpected_error: Callable[[PhaseError], object] | None,
        own_thread: Callable[[], bool],
        stopping: StoppingThread,
        request_stop: Callable[[str], None],
    ) -> None:
        self._worker, self._lock = worker, lock
        self._on_unexpected_error = on_unexpected_error
        self._own_thread, self._stopping = own_thread, stopping
        self._request_stop = request_stop
        self.count = 0  # guarded by ``lock``, with the lists below
        self._errors: list[PhaseError] = []
        self._thread_failures: list[ThreadFailure] = []

    def errors(self) -> tuple[PhaseError, ...]:
        """The most recent errors (lock held)."""
        return tuple(self._errors)

    def thread_failures(self) -> tuple[ThreadFailure, ...]:
        """The worker threads that died (lock held)."""
        return tuple(self._thread_failures)

    def unexpected(self, phase: Phase, job: Job | None, cause: BaseException) -> PhaseError:
        """Log, keep and pass on an error outside a handler; returns its record."""
        error = PhaseError(phase, job, cause)
        if isinstance(cause, StoreTimeout):  # a call the stop gave up on: one line says it
            logger.warning("%s", error)
        elif isinstance(cause, CommitUnknown):
            # A connection cut off during COMMIT (a failover, pg_terminate_backend): the
            # worker handles it as documented, so one line, not a traceback, says what next.
            after = (
                "any job it claimed comes back when its lease expires"
                if job is None
                else f"job {job.id} comes back when its lease expires unless an outcome is "
                "recorded (a fallback follows, refused if the commit applied)"
            )
            logger.warning("%s; %s", " ".join(str(error).split()), after)
        else:
            logger.error("%s", error, exc_info=(type(cause), cause, cause.__traceback__))
        with self._lock:
            self.count += 1
            self._errors.append(error)
            del self._errors[:-MAX_ERRORS_KEPT]
        self.hook(None, job, self._on_unexpected_error, error)
        return error

    def hook(
        self,
        phase: Phase | None,
        job: Job | None,
        hook: Callable[..., object] | None,
        *args: object,
    ) -> None:
        """Run ``hook(*args)``; what it raises is logged and contained (see the class)."""
        if hook is None:
            return
        try:
            hook(*args)
        except BaseException as exc:  # logged and contained; see below
            exiting = isinstance(exc, KeyboardInterrupt | SystemExit)
            stopping = self._stopping.is_current()
            if exiting and not stopping and not self._own_thread():
                raise  # the caller's own Ctrl-C or exit, outside a stop: theirs at once
            if phase is None:  # on_unexpected_error itself: log, never recurse
                logger.exception("on_unexpected_error raised; ignored")
            else:
                self.unexpected(phase, job, exc)
            if exiting and stopping:
                self._stopping.defer(exc)  # raised once the stop is recorded

    def thread_died(self, exc: BaseException) -> None:
        """Record the calling thread's death, log it at CRITICAL and stop the worker."""
        thread = threading.current_thread()
        failure = ThreadFailure.from_exception(thread, type(exc), exc)
        logger.critical(
            "worker %s: thread %r died: %s; stopping the worker",
            self._worker,
            thread.name,
            failure.summary,
            exc_info=(type(exc), exc, exc.__traceback__),
        )
        with self._lock:
            self._thread_failures.append(failure)
        self._request_stop(f"thread {thread.name} died")
