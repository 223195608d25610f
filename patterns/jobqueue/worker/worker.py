"""The job queue's worker: claim, run, settle, and stop on a deadline, saying what was left.

TL;DR: ``Worker(store, tasks, concurrency=4).start()`` claims due jobs and runs their
handlers on a pool of threads; `Worker.stop` walks one explicit state machine, RUNNING ->
DRAINING -> CANCELLING -> STOPPED, within ``stop_timeout`` and returns a
`WorkerReport` of the jobs it completed, released and left running.

Pattern:
    A short orchestrator over named parts, each in its own module and each built from a
    pattern module used as is (docs/jobqueue/composition.md draws them):

    * ``ledger``: the claims in hand, their states, the free slots, the counters, and
      the gate that ``request_stop`` closes under the lock every claim and job start reads;
    * ``claimer``: a ``BackgroundService`` thread that claims for the free slots and
      hands claims to the handler threads through a ``ClosableQueue``;
    * ``handlers`` and ``runner``: the ``TrackingExecutor`` threads' loop, and one job's
      run with a child ``CancelToken`` and its decided outcome;
    * ``settler`` (and ``fallback``): the group commit of the decided outcomes, which
      claims for the freed slots in the same transaction;
    * ``heartbeat``: a ``HousekeepingDaemon`` renewing every lease held and writing the
      worker's row; ``release``: claims given back; ``errors``: ``ThreadFailure`` records;
    * ``report``, ``states`` and ``options``: the report, the state tables, the checks.

    A job's path: claim (claimer) -> hand over (hand-off queue) -> run and decide
    (handlers, runner) -> queue the outcome (settler) -> group commit (settler) ->
    record (ledger).

Guarantees:
    * Every claimed job ends in exactly one `Outcome`: accepted (done, retried, failed,
      released, cancelled), refused because another claim holds the lease (lost), every
      store call raised (unsettled: the lease expires and it runs again), or a commit
      broke with its outcome unknown (unknown). Nothing is dropped.
    * An error outside the handler is a ``PhaseError`` naming its phase, logged, kept in
      the report and passed to ``on_unexpected_error``; if the store call that settles a
      job raised, one fallback keeps the attempt spent, so ``max_attempts`` bounds its
      runs even when every write fails.
    * Claims that keep raising are retried after a doubling wait up to 30 s; after
      ``store_outage_limit`` seconds the worker stops itself and the report's ``failure``
      says why.
    * Once ``request_stop`` (or `Worker.stop`) has returned, no claim starts and no
      handler starts; a claim that was already under way is released unchanged.
    * `Worker.stop` returns within its budget plus scheduling noise, is idempotent and
      thread-safe, calls ``on_shutdown`` exactly once, and its STOPPED report is final:
      every claim never started is released or named, every outcome handed to the
      settler committed or named. A job still running at the deadline is released (its
      attempt given back): a stop never makes a job fail.
    * Leases are renewed until STOPPED, draining included; the worker's row is written
      by each beat and each transition, and deleted at STOPPED.
    * A job's ``timeout`` is a deadline on its handler's token; an operator's ``cancel``
      reaches its handler at the next beat. A handler's return value is the job's
      ``result`` if the store can keep it, else None with a WARNING naming the job.
    * `Worker.start` is all or nothing, and a worker thread never dies silently: its
      death is logged at CRITICAL, recorded in the report and stops the worker.

Python:
    3.11+. No thread can be interrupted, so a job that ignores its token keeps its
    thread after the deadline, and pool threads are non-daemon and joined at
    interpreter exit, before any ``atexit`` handler runs (on 3.11, 3.12 and 3.13 alike:
    ``tests/jobqueue/test_python_claims.py``): a program that must exit then calls
    ``os._exit`` after logging the report, as the CLI does. A worker must be stopped
    (``with``, `Worker.run` or `Worker.stop`): an ``atexit`` handler runs too late.
    Checked on CPython 3.11.7, 3.12.1 and 3.13.0.

Docs: docs/jobqueue/design.md (the pitfalls of Proletarian's and qdolor's workers);
docs/jobqueue/guarantees.md (each guarantee in full, and what a restart finds);
docs/jobqueue/composition.md (the parts and a job's path).
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Self

from patterns.cancellation import CancelToken
from patterns.closable_queue import ClosableQueue, shutdown_and_drain
from patterns.executor_shutdown import TrackingExecutor, shutdown_and_await
from patterns.jobqueue.stores.deadline import Deadline, bounded_by
from patterns.jobqueue.stores.protocol import WorkerStore
from patterns.jobqueue.stores.records import Claim, JsonValue
from patterns.jobqueue.tasks import Phase, TaskRegistry
from patterns.jobqueue.worker import options
from patterns.jobqueue.worker.claimer import Claimer
from patterns.jobqueue.worker.errors import ErrorLog
from patterns.jobqueue.worker.handlers import HandlerLoop
from patterns.jobqueue.worker.heartbeat import Heartbeat
from patterns.jobqueue.worker.ledger import ClaimLedger, Held
from patterns.jobqueue.worker.outcomes import ClaimState, Outcome
from patterns.jobqueue.worker.release import Releaser
from patterns.jobqueue.worker.report import (
    WorkerReport,
    WorkerStats,
    build_report,
    build_stats,
)
from patterns.jobqueue.worker.runner import JobRunner
from patterns.jobqueue.worker.settler import Settler
from patterns.jobqueue.worker.states import StateMachine, Step, WorkerState
from patterns.jobqueue.worker.stop_once import StopOnce
from patterns.jobqueue.worker.threads import ThreadMarks
from patterns.jobqueue.worker.threads import wait as _wait
from patterns.signal_handlers import SignalHandlers, install_signal_handlers

__all__ = [
    "Outcome",
    "Step",
    "Worker",
    "WorkerReport",
    "WorkerState",
    "WorkerStats",
]

logger = logging.getLogger(__name__)

# Seconds after the deadline in which the settler may commit what it holds, the heartbeat
# end, and a thread leave a store call that gave up at the deadline (a busy SQLite file
# is given up within one of its busy waits, BUSY_SLICE; a store call that begins after
# the deadline gets LAST_TRY).
_GRACE = 0.25
_ROW_WAIT = 0.05  # seconds a stop waits to write the worker's row (it has no budget of its own)
_names = itertools.count(1)


class Worker:
    """Claims due jobs from ``store`` and runs them with the handlers of ``tasks``.

    Args:
        store: where jobs live; the worker never closes it.
        tasks: the handlers, policies and hooks.
        concurrency: handler threads; at most this many jobs are claimed at once, plus
            ``prefetch``.
        prefetch: extra claims the worker may hold beyond ``concurrency`` (default 0).
            Each claim then takes up to ``concurrency + prefetch`` due jobs in one store
            transaction, so a freed handler thread finds its next job waiting. The price:
            a prefetched job holds its lease (and has used an attempt) before it starts;
            the heartbeat renews it and the stop releases it unchanged, but if the
            process dies it waits for its lease to expire, attempt spent, like a running
            job.
        poll_interval: how long an idle worker waits before claiming again; the wait ends
            at once on `wake`, `enqueue`, `request_stop` and when a job finishes.
        stop_timeout: `stop`'s default budget, in seconds.
        cancel_timeout: the part of the budget kept for CANCELLING (default: a quarter);
            DRAINING gets the rest. ``cancel_timeout=stop_timeout`` cancels at once.
        lease: seconds each claim holds its job; renewed every ``heartbeat_interval``
            (default: a third of the lease) while the handler runs, draining included.
            The heartbeat interval must be shorter than the lease (else every lease
            lapses between renewals and every outcome is refused).
        store_outage_limit: seconds the store may keep failing every claim before the
            worker stops itself (default 60): the report's ``failure`` says why, so a
            process can exit non-zero instead of retrying for ever.
        on_shutdown: called exactly once, with the final `WorkerReport`, when the
            worker reaches STOPPED (``report.terminated`` says whether everything ended).
        install_signal_handlers: make the first SIGTERM/SIGINT call `request_stop` and a
            second force the exit; `start` and `stop` must then run in the main thread.
        exit_when_empty: request a stop once no job is due or running anywhere.
        name: the lease owner name (default ``worker-<pid>-<n>``).
        clock: the clock of the run time of a retry and of the worker's row; by default
            the store's own, ``store.clock`` (the database's on PostgreSQL), so due times
            and leases are judged by one clock. Pass another only in tests.
        step_hook: for fault-injection tests: called at every `Step` of each job's life,
            in the thread that is there. None (the default): a no-op.

    Every interval is checked at construction, alone and against the others: a number
    of seconds (not a bool or a str, not nan, not negative), else a `ValueError` naming
    the argument. ``inf`` or a huge number means "as long as it takes" for
    ``poll_interval``, ``stop_timeout``, ``cancel_timeout`` and ``store_outage_limit``
    (waits are capped at `threading.TIMEOUT_MAX`); the lease and the heartbeat interval
    go to the store, so they stay finite, within ``MAX_SECONDS``.

    Lifecycle: `start`, `stop` (bounded, idempotent; from the worker's own threads, a
    request) and a context manager: entering starts a worker that never started and
    returns a running one as it is (``with Worker(...).start():``); leaving stops it. A
    worker runs once: a stopped worker cannot be started or entered again; make a new one.
    """

    def __init__(
        self,
        store: WorkerStore,
        tasks: TaskRegistry,
        *,
        concurrency: int = 4,
        prefetch: int = 0,
        poll_interval: float = 1.0,
        stop_timeout: float = 10.0,
        cancel_timeout: float | None = None,
        lease: float = 30.0,
        heartbeat_interval: float | None = None,
        on_shutdown: Callable[[WorkerReport], object] | None = None,
        install_signal_handlers: bool = False,
        exit_when_empty: bool = False,
        store_outage_limit: float = 60.0,
        name: str | None = None,
        clock: Callable[[], float] | None = None,
        step_hook: Callable[[Step, Claim, Phase | None], object] | None = None,
    ) -> None:
        options.check_counts(concurrency, prefetch)
        beat, poll_interval, stop_timeout, cancel_timeout = options.check_times(
            poll_interval=poll_interval,
            stop_timeout=stop_timeout,
            cancel_timeout=cancel_timeout,
            lease=lease,
            heartbeat_interval=heartbeat_interval,
            store_outage_limit=store_outage_limit,
        )
        if clock is None:  # the store's (a store of one's own may lack it: the local time)
            clock = getattr(store, "clock", time.time)
        self.name = name = name or f"worker-{os.getpid()}-{next(_names)}"
        self._store, self._tasks, self._concurrency = store, tasks, concurrency
        self.stop_timeout, self._cancel_timeout = stop_timeout, cancel_timeout
        self._install_signals = install_signal_handlers
        step = step_hook or _no_step_hook
        cap = min(stop_timeout, threading.TIMEOUT_MAX)  # each part's own stop budget

        # The worker's one lock: it guards the state and the stop's fields below and every
        # part's shared data (the ledger, the settler's outbox, the errors). Never held
        # while a handler, a hook or a store call runs. Its condition is the ledger's:
        # the claimer waits on it for free slots, and every transition notifies it.
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        self._start_called = False  # set by the first start(), so a second one refuses
        self._failure: str | None = None  # why the worker stopped itself, if it did
        # Set by wake(), enqueue(), request_stop() and after each commit; cleared by the
        # claimer before each claim; its idle wait ends at once.
        self._wake = threading.Event()
        # Set once, by request_stop(); waited on by wait_stop_requested() and run().
        self._stop_requested = threading.Event()
        # Set once request_stop() has released every claim it took back from the hand-off
        # (it may run in another thread than stop()): no release happens after the report.
        self._handoff_settled = threading.Event()
        self._signals: SignalHandlers | None = None
        # The store's own wake-up feed, if it has one (PostgresStore: LISTEN/NOTIFY):
        # subscribed by start() with wake(), dropped by the stop once the claimer left.
        self._unsubscribe: Callable[[], object] | None = None

        # The parts, each handed what it uses (patterns.jobqueue.<part>).
        self._root = CancelToken()  # cancelled in CANCELLING: every job's token is a child
        # Set by the owning stop: every store call of the worker's threads, and of the stop
        # itself, gives up at it (patterns.jobqueue.stores.deadline).
        self._deadline = Deadline()
        self._requested_at: float | None = None  # when request_stop first ran
        self._gave_up_outside = 0  # store calls that gave up at a deadline of their own
        # Each thread's own "began" and "ended" events; each runs under the deadline.
        self._marks = ThreadMarks(lambda: bounded_by(self._deadline))
        ledger = self._ledger = ClaimLedger(
            self._cond, root=self._root, slots=concurrency + prefetch, claim_at=max(1, prefetch)
        )
        # RUNNING -> DRAINING -> CANCELLING -> STOPPED; the ledger accepts jobs in RUNNING.
        self._life = StateMachine(
            name, self._cond, lambda new: ledger.accept(new is WorkerState.RUNNING)
        )
        self._stop = StopOnce(
            lock,
            shut_down=self._shut_down,
            provisional=lambda start, caller: self._build_report(
                start, terminated=False, caller=caller
            ),
            own_thread=self._is_own_thread,
            request_stop=self.request_stop,
            on_shutdown=on_shutdown,
            # The error log is built next (it asks this which thread is stopping).
            error=lambda phase, job, exc: self._errors.unexpected(phase, job, exc),  # noqa: PLW0108
            close_signals=self._close_signal_handlers,
        )
        errors = self._errors = ErrorLog(
            name,
            lock=lock,
            on_unexpected_error=tasks.on_unexpected_error,
            own_thread=self._is_own_thread,
            stopping_thread=self._stop.in_stopping_thread,
            defer=self._stop.defer,
            request_stop=self.request_stop,
        )
        # Claims from the claimer (and the settler's refills) to the handler threads;
        # closed by request_stop(), which takes back what no handler took yet.
        self._handoff: ClosableQueue[Claim] = ClosableQueue()
        self._settler: Settler[Held] = Settler(
            store,
            owner=name,
            lease=lease,
            clock=clock,
            lock=lock,
            claiming=lambda: ledger.accepting,
            free_slots=ledger.give_back,
            settled=ledger.record_batch,
            unsettled=ledger.unsettled_pending,
            # The claimer is built below (it releases through the settler): looked up late.
            claimed=lambda claims, want, stopping: self._claimer.hand_over(  # noqa: PLW0108
                claims, want, stopping
            ),
            completed=lambda job, result: errors.hook(
                Phase.ON_COMPLETE, job, tasks.on_complete, job, result
            ),
            error=errors.unexpected,
            died=errors.thread_died,
            before_commit=functools.partial(step, Step.BEFORE_COMMIT),
            after_commit=functools.partial(step, Step.AFTER_COMMIT),
            wake=self._wake,
            stop_timeout=cap,
            track=lambda target: self._marks.track(target, f"{name}-settler"),
        )
        self._release = Releaser(store, ledger, self._settler, error=errors.unexpected)
        self._claimer = Claimer(
            store,
            ledger,
            self._handoff,
            owner=name,
            lease=lease,
            poll_interval=poll_interval,
            outage_limit=options.seconds(store_outage_limit, "store_outage_limit"),
            exit_when_empty=exit_when_empty,
            clock=clock,
            wake=self._wake,
            release_unstarted=self._release.unstarted,
            request_stop=self.request_stop,
            give_up=self._give_up,
            error=errors.unexpected,
            died=errors.thread_died,
            after_claim=lambda claim: step(Step.AFTER_CLAIM, claim, None),
            track=lambda target: self._marks.track(target, f"{name}-claimer"),
            stop_timeout=cap,
        )
        runner = JobRunner(
            tasks,
            ledger,
            owner=name,
            clock=clock,
            stopping=lambda: self._life.state is not WorkerState.RUNNING,
            error=errors.unexpected,
            hook=errors.hook,
            step_hook=step,
        )
        self._handlers = HandlerLoop(
            self._handoff,
            ledger,
            runner,
            self._settler,
            release_unstarted=self._release.unstarted,
            wake=self._wake,
            died=errors.thread_died,
        )
        self._executor = TrackingExecutor(max_workers=concurrency, thread_name_prefix=f"{name}-job")
        self._heartbeat: Heartbeat[Held] = Heartbeat(
            store,
            owner=name,
            lease=lease,
            interval=beat,
            clock=clock,
            lock=lock,
            held=ledger.held,
            state=lambda: self._life.state.value,
            lost=lambda held: ledger.move(held, ClaimState.LOST),
            error=errors.unexpected,
            died=errors.thread_died,
            before_renew=lambda claim: step(Step.HEARTBEAT, claim, None),
            track=lambda target: self._marks.track(target, f"{name}-heartbeat"),
        )

    def __repr__(self) -> str:
        return f"<Worker {self.name} {self._life.state}>"

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def state(self) -> WorkerState:
        """The current state."""
        return self._life.state

    def start(self) -> Self:
        """Start claiming and running jobs; `RuntimeError` if already started or stopped.

        All or nothing: if any step fails part-way (a thread that cannot start, a
        `KeyboardInterrupt`, a `stop` from another thread that got there first), what
        was started is stopped as `stop` does (``on_shutdown`` gets that report, and a
        claim already made is released) and the error is re-raised.
        """
        with self._cond:
            if self._life.state is not WorkerState.NEW or self._start_called:
                raise RuntimeError(f"{self!r}: a worker can be started only once")
            self._start_called = True
        try:
            self._start_parts()
        except BaseException:
            self._abandon_start()
            raise
        return self

    def _start_parts(self) -> None:
        self._heartbeat.started()  # the worker row's started_at (the first beat writes it)
        unsubscribe = self._store.subscribe(self.wake)  # a no-op where nothing notifies
        with self._cond:
            self._unsubscribe = unsubscribe
        if self._install_signals:
            self._signals = install_signal_handlers(self.request_stop)
        with self._cond:
            if self._life.state is not WorkerState.NEW:  # a stop() from another thread came first
                raise RuntimeError(f"{self!r}: stopped before it started")
            self._life.move(WorkerState.RUNNING, f"{self._concurrency} handler thread(s)")
        self._settler.start()
        for started in range(1, self._concurrency + 1):
            name = f"{self.name}-handler-{started}"
            self._executor.submit(self._marks.track(self._handlers.consume, name, handler=True))
            # The pool queues the loop even when it cannot start a thread for it (it logs
            # and goes on while other threads run); a loop that never ends would then wait
            # forever for a thread. A handler slot needs its own thread, so that is a failure,
            # unless a stop came meanwhile (a signal): the loops leave at once, and the pool
            # reuses a thread whose loop has left rather than start another.
            if len(self._executor.worker_threads()) < started:
                with self._cond:
                    if not self._ledger.accepting:
                        # A stop came meanwhile (a signal): an idle handler left at once and
                        # its thread took this loop, which leaves too. Started; now stopping.
                        break
                raise RuntimeError(
                    f"{self!r}: could not start a new thread for handler {started} "
                    f"of {self._concurrency}"
                )
        self._heartbeat.start()
        self._claimer.start()

    def _abandon_start(self) -> None:
        """Undo a start that failed part-way: stop what started, unsubscribe, put signals back."""
        logger.warning("worker %s: start failed part-way; stopping what started", self.name)
        try:
            self.stop()  # waits for a stop another thread began, within the budget
        except Exception:
            logger.exception("worker %s: stopping after a failed start raised", self.name)
        finally:
            # The stop that won a race with this start may have run before these existed.
            self._drop_subscription()
            self._close_signal_handlers()

    def request_stop(self, reason: str = "stop requested") -> None:
        """Begin the shutdown without waiting: RUNNING -> DRAINING. Safe from any thread.

        No claim starts after this returns, idle handler threads leave, and the claims
        handed off but not started are released at once. Running jobs go on (their
        leases still renewed) until `stop` moves on to CANCELLING. Idempotent.
        """
        with self._cond:
            draining = self._life.state is WorkerState.RUNNING
            if draining:
                self._requested_at = time.monotonic()
                in_hand = self._ledger.running()
                self._life.move(WorkerState.DRAINING, f"{reason}; running: {in_hand}")
        self._stop_requested.set()
        if not draining:
            return
        self._wake.set()
        # Its store calls keep to the budget a stop begun now would have, so that a store
        # blocked by someone else cannot hold the caller (a signal handler) past it.
        requested = Deadline()
        requested.set(time.monotonic() + self.stop_timeout)
        try:
            with bounded_by(requested):
                try:
                    for claim in shutdown_and_drain(self._handoff):  # claims not yet started
                        self._release.unstarted(claim)
                finally:
                    self._handoff_settled.set()
        finally:
            requested.finish()
            with self._cond:
                self._gave_up_outside += requested.gave_up
        self._record_row()  # operators watching `workers` see the drain at once

    def wait_stop_requested(self, timeout: float | None = None) -> bool:
        """Block until a stop is requested (signal, `request_stop`, empty queue, a death)."""
        if timeout is None:
            return self._stop_requested.wait()
        return _wait(self._stop_requested, options.seconds(timeout, "timeout"))

    def stop(self, timeout: float | None = None) -> WorkerReport:
        """Drain, cancel, and report, within ``timeout`` (default ``stop_timeout``).

        DRAINING lasts until every running job has ended or the budget minus the cancel
        share is spent; then CANCELLING cancels every running job's token and waits for
        the rest of the budget; then STOPPED: ``on_shutdown(report)`` is called once and
        the report returned. Never blocks past its budget (plus scheduling noise and
        about 0.3 s for a store that does not answer); ``inf`` waits as long as it takes.
        Every store call of the worker's threads and of the stop keeps to the budget
        (`patterns.jobqueue.stores.deadline`): a store locked by another connection is given up
        on at the deadline, and the report says what could not be written
        (``store_gave_up``, ``unsettled``).

        The first stop that completes records its report; later calls return that
        object, whatever their timeout. Any other call returns a provisional report
        (``terminated=False``, what still runs), not recorded:

        * from another thread while a stop runs: after waiting for it within its own
          budget;
        * from the thread already inside `stop` (a signal handler, ``on_shutdown``): at
          once;
        * from one of the worker's own threads (a handler, a hook): at once, after
          `request_stop`; the calling thread is named in ``still_running``, and the next
          `stop` from outside (`run` and ``with`` make it) completes the stop.

        A stop interrupted (Ctrl-C) before it recorded its report records nothing; the
        next `stop` carries on from where it was. A stop before `start` returns a
        terminated report, and `start` then raises. ``timeout`` that is not a number of
        seconds >= 0 (nan, negative, a bool, a str) is a `ValueError`.
        """
        budget = self.stop_timeout if timeout is None else options.seconds(timeout, "timeout")
        return self._stop.stop(budget)

    def run(self) -> WorkerReport:
        """Start, wait until a stop is requested, then `stop`: a worker process's whole life.

        The stop's budget, ``stop_timeout``, counts from the request (a signal, say).
        """
        self.start()
        try:
            self.wait_stop_requested()
        finally:
            requested_at = self._requested_at
            if requested_at is None:
                report = self.stop()
            else:
                spent = time.monotonic() - requested_at
                report = self.stop(max(0.0, self.stop_timeout - spent))
        return report

    def __enter__(self) -> Self:
        """Start the worker if it never started; a running one is returned as it is.

        `RuntimeError` once a stop has begun: a worker runs once.
        """
        with self._cond:
            stopped = self._stop.begun() or self._life.state is WorkerState.STOPPED
            started = self._start_called
        if stopped:
            raise RuntimeError(f"{self!r}: a stopped worker cannot be entered again")
        return self if started else self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- producers and observers ------------------------------------------------------------

    def wake(self) -> None:
        """End an idle wait now: something was enqueued that may be due."""
        self._wake.set()

    def enqueue(
        self,
        name: str,
        payload: JsonValue = None,
        *,
        run_at: float | None = None,
        delay: float | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
    ) -> int:
        """``TaskRegistry.enqueue`` into this worker's store, then `wake` the worker."""
        job_id = self._tasks.enqueue(
            self._store,
            name,
            payload,
            run_at=run_at,
            delay=delay,
            max_attempts=max_attempts,
            timeout=timeout,
        )
        self.wake()
        return job_id

    def stats(self) -> WorkerStats:
        """A consistent snapshot of the worker's counters."""
        with self._cond:
            return build_stats(
                self._life.state, self._ledger, self._errors, overdue=self._heartbeat.overdue
            )

    def running_jobs(self) -> list[int]:
        """Ids of the jobs whose handlers are running now."""
        with self._cond:
            return self._ledger.running()

    # --- the shutdown ------------------------------------------------------------------------

    def _shut_down(self, budget: float, start: float) -> WorkerReport:
        """The owning stop's work; each step may run again after a Ctrl-C interrupted it."""
        deadline = start + budget  # a float even for inf; every wait below is capped
        self._deadline.set(deadline)  # every store call of the worker's gives up at it
        try:
            with bounded_by(self._deadline):
                return self._shut_down_by(deadline, budget, start)
        finally:
            self._deadline.finish()  # cancels a statement still running; ends the timer

    def _shut_down_by(self, deadline: float, budget: float, start: float) -> WorkerReport:
        def left() -> float:
            return min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)

        with self._cond:
            never_started = self._life.state is WorkerState.NEW
            if never_started:
                self._life.move(WorkerState.STOPPED, "never started")
            stopped = self._life.state is WorkerState.STOPPED  # a stop interrupted after STOPPED
        if never_started:
            self._drop_subscription()  # a start() racing this one may have subscribed
            return self._stop.finish(self._build_report(start, terminated=True))
        if not stopped:
            report = self._shut_down_parts(budget, start, left)
            with self._cond:
                self._life.move(WorkerState.STOPPED, report.summary())
        else:
            report = self._build_report(start, terminated=self._marks.all_ended(left))
        return self._stop.finish(report)

    def _shut_down_parts(
        self, budget: float, start: float, left: Callable[[], float]
    ) -> WorkerReport:
        graced = start + budget + _GRACE  # a thread leaving a store call gets the grace too

        def after() -> float:
            return min(max(0.0, graced - time.monotonic()), threading.TIMEOUT_MAX)

        self.request_stop("stop() called")
        drain_budget, cancel_budget = options.split_budget(
            budget, stop_timeout=self.stop_timeout, cancel_timeout=self._cancel_timeout
        )
        # DRAINING is shutdown_and_await's graceful wait; on_force begins CANCELLING.
        pool = shutdown_and_await(
            self._executor,
            min(drain_budget, threading.TIMEOUT_MAX),
            force_timeout=min(cancel_budget, threading.TIMEOUT_MAX),
            on_force=self._begin_cancelling,
        )
        # The claiming thread left when DRAINING began, unless a claim was in flight.
        claimer = self._claimer.stop(after())
        # A KeyboardInterrupt inside the claimer's Thread.start (after the thread began)
        # leaves the service without it; the claim loop's own event still says when it left.
        claim_loop_ended = not self._claimer.loop_began.is_set() or _wait(
            self._claimer.loop_ended, after()
        )
        # The request_stop that drained the hand-off may be another thread's, still
        # releasing prefetched claims: the report waits for it, or names what it holds.
        handoff_settled = _wait(self._handoff_settled, after())
        # Every handler has handed its outcome over (or outlived the budget): the settler
        # commits what it holds and leaves; a later outcome is committed by its own thread.
        self._settler.close()
        settler = self._settler.stop(max(_GRACE, after()))
        self._drop_subscription()  # the claiming thread has left: no wait to end any more
        # Stopped only now, so leases were renewed for as long as a job could still end.
        # Its loop wakes at once; the grace covers a renew in flight at the deadline.
        self._heartbeat.stop(max(_GRACE, after()))
        self._release.still_running()
        self._heartbeat.forget()  # after the heartbeat, which would write the row again
        # The parts' reports may rest on a Thread.join() a Ctrl-C interrupted (gh-90882):
        # the threads' own "ended" events have the last word.
        return self._build_report(
            start,
            terminated=pool.terminated
            and claimer.terminated
            and settler.terminated
            and claim_loop_ended
            and handoff_settled
            and self._marks.all_ended(after),
        )

    def _begin_cancelling(self) -> None:
        with self._cond:
            if self._life.state is not WorkerState.DRAINING:  # a stop resumed after a Ctrl-C
                return
        # Tokens first, outside the lock (their callbacks are the handlers' code), then the
        # state: whoever sees CANCELLING finds every running job's token already cancelled.
        self._root.cancel("worker shutting down")  # reaches every job's child token
        with self._cond:
            if self._life.state is WorkerState.DRAINING:
                running = self._ledger.running()
                self._life.move(WorkerState.CANCELLING, f"cancelling job(s) {running}")
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
                self._heartbeat.record()
        finally:
            quick.finish()

    def _drop_subscription(self) -> None:
        with self._cond:
            unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()

    def _close_signal_handlers(self) -> None:
        if self._signals is None:
            return
        if threading.current_thread() is not threading.main_thread():
            logger.warning(
                "%s: signal handlers left installed: stop() was not called from the main thread",
                self.name,
            )
            return
        self._signals.stop()
        self._signals = None

    def _build_report(
        self, start: float, *, terminated: bool, caller: str | None = None
    ) -> WorkerReport:
        with self._cond:
            return build_report(
                self.name,
                self._ledger,
                self._marks,
                self._errors,
                entered=self._life.entered,
                failure=self._failure,
                start=start,
                terminated=terminated,
                caller=caller,
                store_gave_up=self._deadline.gave_up + self._gave_up_outside,
            )

    def _is_own_thread(self) -> bool:
        current = threading.current_thread()
        return current in self._executor.worker_threads() or current.name in (
            self._claimer.thread_name,
            self._heartbeat.thread_name,
            self._settler.thread_name,
        )

    def _give_up(self, reason: str) -> None:
        """Stop the worker: the store has failed every claim for ``store_outage_limit``."""
        with self._cond:
            self._failure = reason
        logger.critical("worker %s: %s; stopping", self.name, reason)
        self.request_stop(reason)


def _no_step_hook(step: Step, claim: Claim, phase: Phase | None) -> None:
    """The default ``step_hook``: nothing happens at a `Step`."""
