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
    * ``stop_script`` and ``resumable_stop``: the stop, part by part, and which
      ``stop()`` call owns it;
    * ``shared``: what every part is handed (the store, the lock, the callbacks);
      ``report``, ``states`` and ``options``: the report, the state tables, the checks.

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
from patterns.executor_shutdown import TrackingExecutor
from patterns.jobqueue.stores.deadline import Deadline, bounded_by
from patterns.jobqueue.stores.protocol import WorkerStore
from patterns.jobqueue.stores.records import Claim, JsonValue
from patterns.jobqueue.tasks import Phase, TaskRegistry
from patterns.jobqueue.worker import options
from patterns.jobqueue.worker.claimer import Claimer, Polling
from patterns.jobqueue.worker.errors import ErrorLog
from patterns.jobqueue.worker.handlers import HandlerLoop, HandOff
from patterns.jobqueue.worker.heartbeat import Heartbeat
from patterns.jobqueue.worker.ledger import ClaimLedger, Held
from patterns.jobqueue.worker.outcomes import ClaimState, Outcome
from patterns.jobqueue.worker.release import Releaser
from patterns.jobqueue.worker.report import WorkerReport, WorkerStats, build_stats
from patterns.jobqueue.worker.resumable_stop import ResumableStop
from patterns.jobqueue.worker.runner import JobRunner
from patterns.jobqueue.worker.settler import Settler
from patterns.jobqueue.worker.shared import Shared, StoppingThread, no_step
from patterns.jobqueue.worker.states import StateMachine, Step, WorkerState
from patterns.jobqueue.worker.stop_script import Parts, StopScript
from patterns.jobqueue.worker.threads import ThreadMarks
from patterns.jobqueue.worker.threads import wait as _wait
from patterns.signal_handlers import install_signal_handlers

__all__ = [
    "Outcome",
    "Step",
    "Worker",
    "WorkerReport",
    "WorkerState",
    "WorkerStats",
]

logger = logging.getLogger(__name__)

_names = itertools.count(1)


class Worker:
    """Claims due jobs from ``store`` and runs them with the handlers of ``tasks``.

    Args:
        store: where jobs live; the worker never closes it.
        tasks: the handlers, policies and hooks.
        concurrency: handler threads; at most this many jobs are claimed at once, plus
            ``prefetch``.
        prefetch: extra claims the worker may hold beyond ``concurrency``, waiting for a
            free handler thread (default None: four per thread, Celery's default; 0 turns
            it off). Each claim then takes up to ``concurrency + prefetch`` due jobs in one
            store transaction, so a freed handler thread finds its next job waiting and the
            claim's commit overlaps the jobs running. The price: a prefetched job holds
            its lease (and has used an attempt) before it starts; the heartbeat renews it
            and the stop releases it unchanged at once, but if the process dies it waits
            for its lease to expire, attempt spent, like a running job; and meanwhile no
            other worker can take it. With long jobs and idle workers elsewhere, 0 lets
            each job go to whichever worker has a free thread.
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
        prefetch: int | None = None,
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
        prefetch = options.check_counts(concurrency, prefetch)  # None: 4 per thread
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
        self.stop_timeout = stop_timeout
        self._install_signals = install_signal_handlers
        self._start_called = False  # set by the first start(), so a second one refuses
        # The parts, each handed what it uses (see _wire): nothing runs until start().
        outage_limit = options.seconds(store_outage_limit, "store_outage_limit")
        self._shared, self._parts = _wire(
            store,
            tasks,
            name=name,
            clock=clock,
            lease=lease,
            slots=(concurrency, prefetch),
            beat=beat,
            polling=Polling(poll_interval, outage_limit, exit_when_empty),
            part_budget=min(stop_timeout, threading.TIMEOUT_MAX),
            hooks=(step_hook or no_step, on_shutdown, self.request_stop),
        )
        self._cond = self._parts.ledger.cond  # the condition over the worker's one lock
        self._script = StopScript(
            self._shared, self._parts, stop_timeout=stop_timeout, cancel_timeout=cancel_timeout
        )

    def __repr__(self) -> str:
        return f"<Worker {self.name} {self._parts.life.state}>"

    @property
    def state(self) -> WorkerState:
        """The current state."""
        return self._parts.life.state

    def start(self) -> Self:
        """Start claiming and running jobs; `RuntimeError` if already started or stopped.

        All or nothing: if any step fails part-way (a thread that cannot start, a
        `KeyboardInterrupt`, a `stop` from another thread that got there first), what
        was started is stopped as `stop` does (``on_shutdown`` gets that report, and a
        claim already made is released) and the error is re-raised.
        """
        with self._cond:
            if self._parts.life.state is not WorkerState.NEW or self._start_called:
                raise RuntimeError(f"{self!r}: a worker can be started only once")
            self._start_called = True
        try:
            self._start_parts()
        except BaseException:
            self._abandon_start()
            raise
        return self

    def _start_parts(self) -> None:
        parts, script = self._parts, self._script
        parts.heartbeat.started()  # the worker row's started_at (the first beat writes it)
        unsubscribe = self._store.subscribe(self.wake)  # a no-op where nothing notifies
        with self._cond:
            script.unsubscribe = unsubscribe
        if self._install_signals:
            script.signals = install_signal_handlers(self.request_stop)
        with self._cond:
            if parts.life.state is not WorkerState.NEW:  # a stop() from another thread came first
                raise RuntimeError(f"{self!r}: stopped before it started")
            parts.life.move(WorkerState.RUNNING, f"{self._concurrency} handler thread(s)")
        parts.settler.start()
        for started in range(1, self._concurrency + 1):
            name = f"{self.name}-handler-{started}"
            parts.executor.submit(parts.marks.track(parts.handlers.consume, name, handler=True))
            # The pool queues the loop even when it cannot start a thread for it (it logs
            # and goes on while other threads run); a loop that never ends would then wait
            # forever for a thread. A handler slot needs its own thread, so that is a failure,
            # unless a stop came meanwhile (a signal): the loops leave at once, and the pool
            # reuses a thread whose loop has left rather than start another.
            if len(parts.executor.worker_threads()) < started:
                with self._cond:
                    if not parts.ledger.accepting:
                        # A stop came meanwhile (a signal): an idle handler left at once and
                        # its thread took this loop, which leaves too. Started; now stopping.
                        break
                raise RuntimeError(
                    f"{self!r}: could not start a new thread for handler {started} "
                    f"of {self._concurrency}"
                )
        parts.heartbeat.start()
        parts.claimer.start()

    def _abandon_start(self) -> None:
        """Undo a start that failed part-way: stop what started, unsubscribe, put signals back."""
        logger.warning("worker %s: start failed part-way; stopping what started", self.name)
        try:
            self.stop()  # waits for a stop another thread began, within the budget
        except Exception:
            logger.exception("worker %s: stopping after a failed start raised", self.name)
        finally:
            # The stop that won a race with this start may have run before these existed.
            self._script.drop_subscription()
            self._script.close_signals()

    def request_stop(self, reason: str = "stop requested") -> None:
        """Begin the shutdown without waiting: RUNNING -> DRAINING. Safe from any thread.

        No claim starts after this returns, idle handler threads leave, and the claims
        handed off but not started are released at once. Running jobs go on (their
        leases still renewed) until `stop` moves on to CANCELLING. Idempotent.
        """
        self._script.request(reason)

    def wait_stop_requested(self, timeout: float | None = None) -> bool:
        """Block until a stop is requested (signal, `request_stop`, empty queue, a death)."""
        if timeout is None:
            return self._script.requested.wait()
        return _wait(self._script.requested, options.seconds(timeout, "timeout"))

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
        return self._parts.stop.stop(budget, self._script)

    def run(self) -> WorkerReport:
        """Start, wait until a stop is requested, then `stop`: a worker process's whole life.

        The stop's budget, ``stop_timeout``, counts from the request (a signal, say).
        """
        self.start()
        try:
            self.wait_stop_requested()
        finally:
            requested_at = self._script.requested_at
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
            stopped = self._parts.stop.begun() or self._parts.life.state is WorkerState.STOPPED
            started = self._start_called
        if stopped:
            raise RuntimeError(f"{self!r}: a stopped worker cannot be entered again")
        return self if started else self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def wake(self) -> None:
        """End an idle wait now: something was enqueued that may be due."""
        self._shared.wake.set()

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
            p = self._parts
            return build_stats(p.life.state, p.ledger, p.errors, overdue=p.heartbeat.overdue)

    def running_jobs(self) -> list[int]:
        """Ids of the jobs whose handlers are running now."""
        with self._cond:
            return self._parts.ledger.running()


def _wire(
    store: WorkerStore,
    tasks: TaskRegistry,
    *,
    name: str,
    clock: Callable[[], float],
    lease: float,
    slots: tuple[int, int],
    beat: float,
    polling: Polling,
    part_budget: float,
    hooks: tuple[
        Callable[[Step, Claim, Phase | None], object],
        Callable[[WorkerReport], object] | None,
        Callable[[str], None],
    ],
) -> tuple[Shared, Parts]:
    """Build one worker's parts, each after what it uses; ``slots``: (concurrency, prefetch).

    ``hooks``: the step hook, ``on_shutdown`` and the worker's ``request_stop``.
    """
    step, on_shutdown, request_stop = hooks
    concurrency, prefetch = slots
    # The worker's one lock: it guards the state, the stop's fields and every part's shared
    # data (the ledger, the settler's outbox, the errors). Never held while a handler, a
    # hook or a store call runs. Its condition is the ledger's: the claimer waits on it for
    # free slots, and every transition notifies it.
    lock = threading.RLock()
    deadline = Deadline()
    # Each thread's own "began" and "ended" events; each runs under the stop's deadline.
    marks = ThreadMarks(functools.partial(bounded_by, deadline))
    stopping = StoppingThread()  # which thread runs the stop: read by the error log
    errors = ErrorLog(
        name,
        lock=lock,
        on_unexpected_error=tasks.on_unexpected_error,
        own_thread=marks.is_own,
        stopping=stopping,
        request_stop=request_stop,
    )
    wake = threading.Event()
    shared = Shared(
        store, name, lock, clock, lease, part_budget, wake,
        errors.unexpected, errors.thread_died, step, marks.track, request_stop,
    )  # fmt: skip
    root = CancelToken()
    cond = threading.Condition(lock)
    ledger = ClaimLedger(cond, root=root, slots=concurrency + prefetch, claim_at=max(1, prefetch))
    # RUNNING -> DRAINING -> CANCELLING -> STOPPED; the ledger accepts jobs in RUNNING.
    life = StateMachine(name, cond, lambda new: ledger.accept(new is WorkerState.RUNNING))
    handoff = HandOff(lock)  # guarded by the worker's lock: see HandlerLoop
    releaser = Releaser(shared, ledger)
    unstarted = releaser.release_unstarted
    claimer = Claimer(shared, ledger, handoff, polling=polling, release_unstarted=unstarted)
    settler: Settler[Held] = Settler(
        shared,
        ledger,
        claimed=claimer.hand_over,
        completed=lambda job, result: errors.hook(
            Phase.ON_COMPLETE, job, tasks.on_complete, job, result
        ),
    )
    runner = JobRunner(
        shared,
        tasks,
        ledger,
        stopping=lambda: life.state is not WorkerState.RUNNING,
        hook=errors.hook,
    )
    heartbeat: Heartbeat[Held] = Heartbeat(
        shared,
        interval=beat,
        held=ledger.held,
        state=lambda: life.state.value,
        lost=lambda held: ledger.move(held, ClaimState.LOST),
    )
    return shared, Parts(
        root=root,
        deadline=deadline,
        marks=marks,
        errors=errors,
        ledger=ledger,
        life=life,
        handoff=handoff,
        releaser=releaser,
        claimer=claimer,
        settler=settler,
        handlers=HandlerLoop(shared, handoff, ledger, runner, settler, release_unstarted=unstarted),
        executor=TrackingExecutor(max_workers=concurrency, thread_name_prefix=f"{name}-job"),
        heartbeat=heartbeat,
        stop=ResumableStop(
            lock,
            stopping,
            errors,
            own_thread=marks.is_own,
            request_stop=request_stop,
            on_shutdown=on_shutdown,
        ),
    )
