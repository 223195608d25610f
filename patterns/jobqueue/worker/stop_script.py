"""The worker's stop script: RUNNING -> DRAINING -> CANCELLING -> STOPPED, part by part.

TL;DR: `StopScript.request` is ``Worker.request_stop``: it closes the gate (DRAINING) and
the hand-off, and releases the claims no handler took. `StopScript.run` is the owning
stop's work (`~patterns.jobqueue.worker.resumable_stop.ResumableStop` decides which call
owns it): under the stop's deadline it drains the handler threads' pool, cancels what
still runs (CANCELLING), stops the claimer, the settler and last the heartbeat, releases
every job still running, and records the report. `StopScript.provisional` is the report
of what runs now.

Pattern:
    ``patterns.executor_shutdown``'s graceful-then-forced stop for the handler threads
    (``shutdown_and_await``, whose ``on_force`` begins CANCELLING), and
    ``patterns.closable_queue``'s ``shutdown_and_drain`` for the hand-off. Every store
    call of the stop and of the worker's threads keeps to one deadline
    (``patterns.jobqueue.stores.deadline``).

Guarantees:
    * Once `StopScript.request` has returned, no claim starts and no handler starts; a
      claim that was already under way is released unchanged.
    * `StopScript.run` returns within its budget plus scheduling noise, and may run again
      after a Ctrl-C interrupted it: each step is safe to repeat.
    * Leases are renewed until STOPPED, draining included; the heartbeat is stopped last.

See also: ``patterns.jobqueue.worker.worker`` (what wires it),
docs/jobqueue/composition.md (the stop).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from patterns.cancellation import CancelToken
from patterns.closable_queue import ClosableQueue, shutdown_and_drain
from patterns.executor_shutdown import TrackingExecutor, shutdown_and_await
from patterns.jobqueue.stores.deadline import Deadline, bounded_by
from patterns.jobqueue.stores.records import Claim
from patterns.jobqueue.worker import options
from patterns.jobqueue.worker.claimer import Claimer
from patterns.jobqueue.worker.errors import ErrorLog
from patterns.jobqueue.worker.handlers import HandlerLoop
from patterns.jobqueue.worker.heartbeat import Heartbeat
from patterns.jobqueue.worker.ledger import ClaimLedger, Held
from patterns.jobqueue.worker.release import Releaser
from patterns.jobqueue.worker.report import WorkerReport, build_report
from patterns.jobqueue.worker.resumable_stop import ResumableStop
from patterns.jobqueue.worker.settler import Settler
from patterns.jobqueue.worker.shared import Shared
from patterns.jobqueue.worker.states import StateMachine, WorkerState
from patterns.jobqueue.worker.threads import ThreadMarks
from patterns.jobqueue.worker.threads import wait as _wait
from patterns.signal_handlers import SignalHandlers

__all__ = ["Parts", "StopScript"]

logger = logging.getLogger(__name__)

# Seconds after the deadline in which the settler may commit what it holds, the heartbeat
# end, and a thread leave a store call that gave up at the deadline (a busy SQLite file
# is given up within one of its busy waits, BUSY_SLICE; a store call that begins after
# the deadline gets LAST_TRY).
_GRACE = 0.25
_ROW_WAIT = 0.05  # seconds a stop waits to write the worker's row (it has no budget of its own)


@dataclass(frozen=True, slots=True)
class Parts:
    """One worker's parts, built once by the worker in this order; nothing runs yet."""

    root: CancelToken  # cancelled in CANCELLING: every job's token is a child
    # Set by the owning stop: every store call of the worker's threads, and of the stop
    # itself, gives up at it (patterns.jobqueue.stores.deadline).
    deadline: Deadline
    marks: ThreadMarks  # each thread's own "began" and "ended" events
    errors: ErrorLog
    ledger: ClaimLedger  # its condition is the worker's: over the lock of ``Shared``
    life: StateMachine  # RUNNING -> DRAINING -> CANCELLING -> STOPPED
    # Claims from the claimer (and the settler's refills) to the handler threads; closed
    # by request_stop(), which takes back what no handler took yet.
    handoff: ClosableQueue[Claim]
    releaser: Releaser
    claimer: Claimer
    settler: Settler[Held]
    handlers: HandlerLoop
    executor: TrackingExecutor  # the handler threads
    heartbeat: Heartbeat[Held]
    stop: ResumableStop


class StopScript:
    """The stop's request and its work, part by part; see the module docstring.

    Collaborators: ``shared`` (the worker's name, its lock, ``wake``); ``parts``, which
    it stops; ``stop_timeout``, the default budget (and that of a request's store
    calls), of which ``cancel_timeout`` is kept for CANCELLING.
    """

    def __init__(
        self, shared: Shared, parts: Parts, *, stop_timeout: float, cancel_timeout: float | None
    ) -> None:
        self._shared, self._parts, self._name = shared, parts, shared.owner
        self._stop_timeout, self._cancel_timeout = stop_timeout, cancel_timeout
        self._cond = parts.ledger.cond
        self.requested_at: float | None = None  # when request() first ran
        self._gave_up_outside = 0  # store calls that gave up at a deadline of their own
        # Set once, by request(); waited on by Worker.wait_stop_requested() and run().
        self.requested = threading.Event()
        # Set once request() has released every claim it took back from the hand-off (it
        # may run in another thread than stop()): no release happens after the report.
        self._handoff_settled = threading.Event()
        # Guarded by the lock, set by Worker.start: the store's own wake-up feed, if it has
        # one (PostgresStore: LISTEN/NOTIFY), dropped once the claimer left; the signal
        # handlers installed for the worker, put back once the report is recorded.
        self.unsubscribe: Callable[[], object] | None = None
        self.signals: SignalHandlers | None = None

    def request(self, reason: str) -> None:
        """``Worker.request_stop``: RUNNING -> DRAINING, the hand-off closed and released."""
        parts = self._parts
        with self._cond:
            draining = parts.life.state is WorkerState.RUNNING
            if draining:
                self.requested_at = time.monotonic()
                in_hand = parts.ledger.running()
                parts.life.move(WorkerState.DRAINING, f"{reason}; running: {in_hand}")
        self.requested.set()
        if not draining:
            return
        self._shared.wake.set()
        # Its store calls keep to the budget a stop begun now would have, so that a store
        # blocked by someone else cannot hold the caller (a signal handler) past it.
        requested = Deadline()
        requested.set(time.monotonic() + self._stop_timeout)
        try:
            with bounded_by(requested):
                try:
                    for claim in shutdown_and_drain(parts.handoff):  # claims not yet started
                        parts.releaser.release_unstarted(claim)
                finally:
                    self._handoff_settled.set()
        finally:
            requested.finish()
            with self._cond:
                self._gave_up_outside += requested.gave_up
        self._record_row()  # operators watching `workers` see the drain at once

    def run(self, budget: float, start: float) -> WorkerReport:
        """The owning stop's work; each step may run again after a Ctrl-C interrupted it."""
        deadline = start + budget  # a float even for inf; every wait below is capped
        self._parts.deadline.set(deadline)  # every store call of the worker's gives up at it
        try:
            with bounded_by(self._parts.deadline):
                report = self._run_by(deadline, budget, start)
        finally:
            self._parts.deadline.finish()  # cancels a statement still running; ends the timer
        # Last: once Python's own SIGINT handler is back, a Ctrl-C raises right here, and
        # the report must already be the final one.
        self.close_signals()
        return report

    def _run_by(self, deadline: float, budget: float, start: float) -> WorkerReport:
        def left() -> float:
            return min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)

        life = self._parts.life
        with self._cond:
            never_started = life.state is WorkerState.NEW
            if never_started:
                life.move(WorkerState.STOPPED, "never started")
            stopped = life.state is WorkerState.STOPPED  # a stop interrupted after STOPPED
        if never_started:
            self.drop_subscription()  # a start() racing this one may have subscribed
            return self._parts.stop.finish(self.report(start, terminated=True))
        if not stopped:
            report = self._stop_parts(budget, start)
            with self._cond:
                life.move(WorkerState.STOPPED, report.summary())
        else:
            report = self.report(start, terminated=self._parts.marks.all_ended(left))
        return self._parts.stop.finish(report)

    def _stop_parts(self, budget: float, start: float) -> WorkerReport:
        graced = start + budget + _GRACE  # a thread leaving a store call gets the grace too

        def after() -> float:
            return min(max(0.0, graced - time.monotonic()), threading.TIMEOUT_MAX)

        parts = self._parts
        self.request("stop() called")
        drain_budget, cancel_budget = options.split_budget(
            budget, stop_timeout=self._stop_timeout, cancel_timeout=self._cancel_timeout
        )
        # DRAINING is shutdown_and_await's graceful wait; on_force begins CANCELLING.
        pool = shutdown_and_await(
            parts.executor,
            min(drain_budget, threading.TIMEOUT_MAX),
            force_timeout=min(cancel_budget, threading.TIMEOUT_MAX),
            on_force=self._begin_cancelling,
        )
        # The claiming thread left when DRAINING began, unless a claim was in flight.
        claimer = parts.claimer.stop(after())
        # A KeyboardInterrupt inside the claimer's Thread.start (after the thread began)
        # leaves the service without it; the claim loop's own event still says when it left.
        claim_loop_ended = not parts.claimer.loop_began.is_set() or _wait(
            parts.claimer.loop_ended, after()
        )
        # The request that drained the hand-off may be another thread's, still releasing
        # prefetched claims: the report waits for it, or names what it holds.
        handoff_settled = _wait(self._handoff_settled, after())
        # Every handler has handed its outcome over (or outlived the budget): the settler
        # commits what it holds and leaves; a later outcome is committed by its own thread.
        parts.settler.close()
        settler = parts.settler.stop(max(_GRACE, after()))
        self.drop_subscription()  # the claiming thread has left: no wait to end any more
        # Stopped only now, so leases were renewed for as long as a job could still end.
        # Its loop wakes at once; the grace covers a renew in flight at the deadline.
        parts.heartbeat.stop(max(_GRACE, after()))
        parts.releaser.release_still_running()
        parts.heartbeat.forget()  # after the heartbeat, which would write the row again
        # The parts' reports may rest on a Thread.join() a Ctrl-C interrupted (gh-90882):
        # the threads' own "ended" events have the last word.
        return self.report(
            start,
            terminated=pool.terminated
            and claimer.terminated
            and settler.terminated
            and claim_loop_ended
            and handoff_settled
            and parts.marks.all_ended(after),
        )

    def _begin_cancelling(self) -> None:
        life = self._parts.life
        with self._cond:
            if life.state is not WorkerState.DRAINING:  # a stop resumed after a Ctrl-C
                return
        # Tokens first, outside the lock (their callbacks are the handlers' code), then the
        # state: whoever sees CANCELLING finds every running job's token already cancelled.
        self._parts.root.cancel("worker shutting down")  # reaches every job's child token
        with self._cond:
            if life.state is WorkerState.DRAINING:
                running = self._parts.ledger.running()
                life.move(WorkerState.CANCELLING, f"cancelling job(s) {running}")
        self._record_row()

    def _record_row(self) -> None:
        """Write the worker's row now, giving up after `_ROW_WAIT` (inside the deadline).

        The row is for operators: a store blocked by someone else must not spend the
        drain's budget on it, and a row not written (logged) expires by itself, so it
        does not count in the report's ``store_gave_up``.
        """
        quick = Deadline()
        quick.set(time.monotonic() + _ROW_WAIT)
        try:
            with bounded_by(quick):
                self._parts.heartbeat.record()
        finally:
            quick.finish()

    def drop_subscription(self) -> None:
        """End the store's wake-up feed, if the worker subscribed to one."""
        with self._cond:
            unsubscribe, self.unsubscribe = self.unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()

    def close_signals(self) -> None:
        """Put Python's signal handlers back, if the worker installed its own (main thread)."""
        if self.signals is None:
            return
        if threading.current_thread() is not threading.main_thread():
            logger.warning(
                "%s: signal handlers left installed: stop() was not called from the main thread",
                self._name,
            )
            return
        self.signals.stop()
        self.signals = None

    def provisional(self, start: float, caller: str | None) -> WorkerReport:
        """A report of what runs now, not recorded (``caller``: the worker's own thread)."""
        return self.report(start, terminated=False, caller=caller)

    def report(self, start: float, *, terminated: bool, caller: str | None = None) -> WorkerReport:
        """The report of the stop that began at ``start`` (monotonic)."""
        parts = self._parts
        with self._cond:
            return build_report(
                self._name,
                parts.ledger,
                parts.marks,
                parts.errors,
                entered=parts.life.entered,
                failure=parts.claimer.failure,
                start=start,
                terminated=terminated,
                caller=caller,
                store_gave_up=parts.deadline.gave_up + self._gave_up_outside,
            )
