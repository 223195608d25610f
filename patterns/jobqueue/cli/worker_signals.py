"""The worker command's signals while its worker lives: stop, force the exit, report the state.

TL;DR: ``with WorkerSignals(guard) as signals:`` installs
`~patterns.signal_handlers.SignalHandlers` for SIGTERM, SIGINT and SIGHUP over the handlers of
the `~patterns.jobqueue.cli.signal_guard.SignalGuard` and takes what the guard recorded during
start-up. The first stop signal stops the worker attached with `WorkerSignals.attach`,
or, before that, keeps it from starting (``attach`` says why); a second one exits at
once with 128 + its number, unless the worker has reached STOPPED: its report is final
then, and the signal is ignored with one line. SIGUSR1 logs one line of the worker's
state from a thread of its own. `WorkerSignals.close` puts the guard's handlers back:
from then on the process ignores those signals.

See also: `patterns.jobqueue.cli.signal_guard` (before and after), `patterns.signal_handlers`.
"""

from __future__ import annotations

import functools
import logging
import queue
import signal
import threading
from collections.abc import Callable
from typing import Self

from patterns.jobqueue.cli.signal_guard import STATUS_SIGNAL, STOP_SIGNALS, SignalGuard
from patterns.jobqueue.worker.states import WorkerState
from patterns.jobqueue.worker.worker import Worker
from patterns.signal_handlers import SignalHandlers

__all__ = ["WorkerSignals"]

logger = logging.getLogger(__name__)

_JOIN = 1.0  # seconds close() waits for the status thread, which only logs


class _Dispatcher(SignalHandlers):
    """`SignalHandlers` whose dispatcher thread also passes `STATUS_SIGNAL` on to ``on_status``.

    Its dispatcher reads every signal that has a Python-level handler (the guard keeps one
    on SIGUSR1), and a thread is what must answer: the handler itself runs in the main
    thread only once that thread runs Python code, which it may not do for the whole
    drain when the signal was delivered to another thread.
    """

    def __init__(
        self,
        on_stop: Callable[[], object],
        on_status: Callable[[], object],
        stopped: Callable[[], bool],
    ) -> None:
        super().__init__(on_stop, STOP_SIGNALS)
        self._on_status = on_status
        self._stopped = stopped

    def on_signal(self, signum: int) -> None:
        if signum == STATUS_SIGNAL:
            self._on_status()  # a put: the dispatcher stays free for a second stop signal
            return
        if signum in STOP_SIGNALS and self._stopped():
            # The worker's report is final: a second signal has nothing left to force,
            # and must not turn the report's exit status into 128 + its number.
            name = signal.Signals(signum).name
            logger.warning("%s ignored: the worker has stopped and the process is exiting", name)
            return
        super().on_signal(signum)


class WorkerSignals:
    """The stop signals reach the worker; SIGUSR1 logs its state (see the module).

    Lifecycle: entering starts (main thread only); `close` (or leaving) stops, once.
    """

    def __init__(
        self, guard: SignalGuard, *, before_start: Callable[[], object] | None = None
    ) -> None:
        """``before_start`` is called by a stop signal that comes before `attach`, once.

        The command uses it to bound what start-up still does (opening the store) by the
        stop's budget; it runs in the thread that handles the signal.
        """
        self._guard = guard
        self._before_start = before_start
        # SIGUSR1 puts an item, from the dispatcher thread; None ends the status thread,
        # the only reader.
        self._requests: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._handlers = _Dispatcher(
            self._on_stop,
            functools.partial(self._requests.put, STATUS_SIGNAL),
            self._worker_stopped,
        )
        # Guards _worker and _reason: written by attach() (main thread) and by the first
        # stop signal (SignalHandlers' on_stop thread); read by the status thread.
        self._lock = threading.Lock()
        self._worker: Worker | None = None
        self._reason: str | None = None  # why a stop was asked for, once one was
        self._status = threading.Thread(
            target=self._report_status, name="status-on-sigusr1", daemon=True
        )
        self._closed = False

    def __enter__(self) -> Self:
        self._handlers.start()
        try:
            early = self._guard.hand_over()  # what came before start() replaced its handlers
            if early is not None:
                self._stop(f"{early.name} during start-up")
            self._status.start()
            # The dispatcher answers SIGUSR1 now; the guard's own handler stays, silent,
            # so that the signal's default action (death) never happens.
            self._guard.report_status = _silent
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def reason(self) -> str | None:
        """Why a stop was asked for, or None while none was."""
        with self._lock:
            return self._reason

    def attach(self, worker: Worker) -> str | None:
        """Send the stop signals to ``worker`` from now on; or, if one came first, why not.

        A worker refused here must not start: the signal asked to stop before it did.
        """
        with self._lock:
            if self._reason is None:
                self._worker = worker
            return self._reason

    def close(self) -> None:
        """Put the guard's handlers back (they ignore a stop signal), end the status thread."""
        if self._closed:
            return
        self._closed = True
        self._handlers.stop()  # the dispatcher has left: SIGUSR1 is the guard's alone again
        self._guard.report_status = None
        self._requests.put(None)
        if self._status.ident is not None:  # started
            self._status.join(_JOIN)

    def _worker_stopped(self) -> bool:
        """Whether the attached worker reached STOPPED: its report is final."""
        with self._lock:
            worker = self._worker
        return worker is not None and worker.state is WorkerState.STOPPED

    def _on_stop(self) -> None:
        first = self._handlers.first_signal
        self._stop(f"{first.name if first is not None else 'a signal'} received")

    def _stop(self, reason: str) -> None:
        with self._lock:
            first = self._reason is None
            self._reason = self._reason or reason
            worker = self._worker
        if worker is not None:
            worker.request_stop(reason)
        elif first and self._before_start is not None:
            self._before_start()

    def _report_status(self) -> None:
        while self._requests.get() is not None:
            try:
                logger.info("SIGUSR1: %s", self._status_line())
            except Exception:
                logger.exception("SIGUSR1: could not read the worker's state")

    def _status_line(self) -> str:
        with self._lock:
            worker, reason = self._worker, self._reason
        if worker is None:
            return f"starting up, no worker yet{'; stopping: ' + reason if reason else ''}"
        stats = worker.stats()
        running = worker.running_jobs()
        return (
            f"worker {worker.name} {stats.state.upper()}: running job(s) {running or 'none'}; "
            f"claimed {stats.claimed}, done {stats.done}, retried {stats.retried}, "
            f"failed {stats.failed}, cancelled {stats.cancelled}, released {stats.released}, "
            f"lost {stats.lost}, errors {stats.errors}"
        )


def _silent() -> None:
    """The guard's SIGUSR1 while the dispatcher answers it: nothing (no default action)."""
