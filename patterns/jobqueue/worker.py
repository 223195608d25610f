"""The job queue's worker: claim, run, settle, and stop on a deadline, saying what was left.

TL;DR: ``Worker(store, tasks, concurrency=4).start()`` claims due jobs and runs their
handlers on a pool of threads; `Worker.stop` walks one explicit state machine, RUNNING ->
DRAINING -> CANCELLING -> STOPPED, within ``stop_timeout`` and returns a
`WorkerReport` of the jobs it completed, released and left running.

Pattern:
    One state machine, each transition logged as ``worker.<state>``. ``request_stop``
    (RUNNING -> DRAINING) flips a pool-level state under the lock that every claim and
    every job start checks, so no claim starts and no handler starts after it, whatever
    a handler did with its token; the claims handed off but not started are released.
    `Worker.stop` then waits for running jobs for most of its budget (DRAINING), cancels
    every job's token and waits for the rest (CANCELLING), and reports (STOPPED). The
    heartbeat renews leases until the end. Each piece is a pattern module, used as is:

    * the handler threads are a ``TrackingExecutor`` stopped with ``shutdown_and_await``
      (``executor_shutdown``): its graceful wait is DRAINING, its ``on_force`` starts
      CANCELLING;
    * the claiming thread hands claims to the handler threads through a
      ``ClosableQueue`` (``closable_queue``); ``shutdown_and_drain`` closes it and hands back
      the claims no handler took;
    * each job's token is a child of the worker's ``CancelToken`` (``cancellation``), so
      one ``cancel()`` reaches every running job;
    * the claiming thread and the settler are non-daemon ``BackgroundService`` threads
      and the heartbeat (``patterns.jobqueue.heartbeat``) a daemon ``HousekeepingDaemon``
      (``daemon_threads``) that renews every lease held and writes the worker's row. A handler
      thread hands its job's decided outcome to the settler (``patterns.jobqueue.settler``)
      and is free for the next job at once; the settler commits every outcome waiting in one
      `~patterns.jobqueue.store.Store.settle_many` (group commit: while one commit is in
      flight the next batch collects; an idle queue commits a single outcome at once),
      then records the outcomes and runs the hooks;
    * a thread that dies is recorded as a ``ThreadFailure`` (``thread_exceptions``),
      logged, and stops the worker;
    * ``install_signal_handlers=True`` uses ``install_signal_handlers`` (``exit_hooks``):
      the first SIGTERM/SIGINT calls `Worker.request_stop`, a second forces the exit.

    One job's life follows qdolor's lifecycle, with the store call before the hook::

        claim -> ready? -- no --> unreadiness policy -> requeue | abandon -> on_unreadiness
                        -- yes -> handler -> returned: ack (complete) -> on_complete
                                          -> raised: failure policy -> requeue
                                                                    | nack (fail) -> on_failure
                                          -> token cancelled: release (interrupted)

Guarantees:
    * Every claimed job ends in exactly one `Outcome`: one store call that ended it was
      accepted (done, retried, failed, released), or the store refused it because
      another claim holds the lease now (lost), or every store call raised (unsettled:
      the lease expires and the job runs again), or a commit broke with its outcome
      unknown (unknown). Nothing is dropped.
    * An error outside the handler is a ``PhaseError`` naming its phase, logged, kept in
      the report and passed to ``on_unexpected_error``. If it leaves a decision unmade,
      the default policy decides. If the store call that settles a job raised, one
      fallback keeps the attempt spent (requeued with the default backoff while
      attempts are left, failed after, with a storable reason): a job whose handler ran
      is never given its attempt back because an outcome could not be written, so
      ``max_attempts`` bounds its runs even when every write fails.
    * Claims that keep raising are retried after a doubling wait, from
      ``poll_interval`` up to 30 s: a broken store is never polled in a hot loop. Once
      they have failed for ``store_outage_limit`` seconds the worker stops itself and
      its report's ``failure`` says why; a failed claim never counts as "the queue is
      empty" (``exit_when_empty``).
    * Once ``request_stop`` (or `Worker.stop`) has returned, no claim starts and no
      handler starts; a claim that was already under way is released unchanged.
    * The STOPPED report is final: a claim handed off but never started (``prefetch``)
      is released before `Worker.stop` returns, whichever thread requested the stop, or
      named in ``still_held_ids`` if its release had not returned by the deadline; an
      outcome handed to the settler is committed before it returns, or its job is named
      in ``still_running``. Each outcome in a group commit is fenced on its own: one
      refused leaves the others applied, and only the accepted ones run their hooks.
    * `Worker.stop` returns within its budget plus scheduling noise, is idempotent and
      thread-safe, and calls ``on_shutdown`` exactly once (a hook or ``on_shutdown`` that
      raises any BaseException is logged and contained; a Ctrl-C or exit from one run by
      the stopping thread is re-raised once the report is recorded). A Ctrl-C during
      the stop records nothing and the next stop resumes it; a stop from the stopping
      thread itself (a signal handler) answers at once, one from the worker's own
      threads is a request; neither is recorded. The report reads the worker's claim
      records and each thread's own "ended" event, never ``Thread.is_alive()``.
      Jobs still running at the deadline are named in the report and released there
      (their attempt given back, the late handler's outcome refused by fencing): a
      stop never makes a job fail
      (a second signal exits without a stop, so its running job keeps its lease).
      The process is expected to exit right after (a thread cannot be killed); a
      restart finds such a job queued, attempts as before the claim. Only a job whose
      release failed keeps its lease, and runs again once it expires.
    * Leases are renewed until the STOPPED transition, draining included. Each beat
      also writes the worker's row (`~patterns.jobqueue.store.Store.record_worker`:
      state, jobs held; expiring after three beats), as does each transition; STOPPED
      deletes it. A row write that fails is logged (at most once a minute) and never
      stops the worker.
    * A handler's return value is the job's ``result`` if the store can keep it (JSON,
      within its size limit); otherwise the job completes with None and a WARNING
      naming the job and why. Each completed job is logged at INFO with its duration.
    * A job's ``timeout`` (its own, else its task's) is a deadline on the handler's
      token: a handler that stops there (raises, or returns after a checkpoint raised)
      fails the attempt with "timed out after Xs", for the failure policy to retry; one
      that ignores it keeps its thread and slot, is logged once at WARNING and counted
      (``WorkerStats.overdue``).
    * An operator's `~patterns.jobqueue.store.Store.cancel` of a running job reaches
      its handler at the next beat (its token only): a handler that stops ends the job
      ``cancelled``
      (``Outcome.CANCELLED``, no ``on_failure``); one that finishes anyway completes it,
      and the log says it ignored the cancel.
    * `Worker.start` is all or nothing: if it fails part-way (a thread that cannot
      start, a ``KeyboardInterrupt``, a racing `Worker.stop`), what started is stopped,
      a claim already made is released, and the error propagates.
    * A worker thread never dies silently: its death is logged at CRITICAL, recorded in
      the report and stops the worker.

Python:
    3.11+. No thread can be interrupted, so a job that ignores its token keeps its
    thread after the deadline, and pool threads are non-daemon and joined at
    interpreter exit, before any ``atexit`` handler runs (on 3.11, 3.12 and 3.13 alike:
    ``tests/jobqueue/test_python_claims.py``): a program that must exit then calls
    ``os._exit`` after logging the report, as the CLI does. A worker must be stopped
    (``with``, `Worker.run` or `Worker.stop`): an ``atexit`` handler runs too late to do it.
    Checked on CPython 3.11.7, 3.12.1 and 3.13.0.

Docs: docs/jobqueue/design.md (the pitfalls of Proletarian's and qdolor's workers, and
the map from Proletarian's names to these); docs/jobqueue/guarantees.md (what a restart
finds after each way a worker ends).

See also:
    ``patterns.jobqueue.tasks`` (handlers, policies, phases), ``patterns.jobqueue.outcomes``
    (the decision for a job that did not complete), ``patterns.jobqueue.store``
    (the states and the fencing rule), ``patterns.jobqueue.cli`` (the worker process).
"""

from __future__ import annotations

import enum
import functools
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import ParamSpec, Self

from patterns.cancellation import DEADLINE_EXCEEDED, Cancelled, CancelToken
from patterns.closable_queue import ClosableQueue, ShutDown, shutdown_and_drain
from patterns.daemon_threads import BackgroundService
from patterns.executor_shutdown import TrackingExecutor, shutdown_and_await
from patterns.exit_hooks import SignalHandlers, install_signal_handlers
from patterns.jobqueue import options
from patterns.jobqueue.heartbeat import Heartbeat
from patterns.jobqueue.outcomes import CLAIM_MOVES, DEFAULT_POLICY, ClaimState, Outcome, decide
from patterns.jobqueue.settler import Pending, Settler
from patterns.jobqueue.store import (
    Claim,
    CommitUnknown,
    Job,
    JsonValue,
    Settle,
    Settlement,
    Store,
    storable_error,
)
from patterns.jobqueue.tasks import (
    Decision,
    Fail,
    JobContext,
    Phase,
    PhaseError,
    Retry,
    Task,
    TaskRegistry,
)
from patterns.jobqueue.tasks import describe_error as _describe
from patterns.thread_exceptions import ThreadFailure

__all__ = [
    "Outcome",
    "Step",
    "Worker",
    "WorkerReport",
    "WorkerState",
    "WorkerStats",
]

logger = logging.getLogger(__name__)

_MAX_ERRORS_KEPT = 100  # PhaseErrors kept for the report; the count in stats is exact
_MAX_DEQUEUE_BACKOFF = 30.0  # seconds between claims while the store keeps failing
_HEARTBEAT_GRACE = 0.1  # seconds the heartbeat may take to end once the budget is spent
_SETTLER_GRACE = 0.1  # seconds the settler may take to commit what it holds at the deadline
_names = itertools.count(1)
_P = ParamSpec("_P")


class WorkerState(enum.StrEnum):
    """The worker's lifecycle; every change is logged as ``worker.<state>``."""

    NEW = "new"
    RUNNING = "running"  # claiming and running jobs
    DRAINING = "draining"  # no more claims; running jobs may finish; leases still renewed
    CANCELLING = "cancelling"  # running jobs' tokens cancelled; Interrupted jobs released
    STOPPED = "stopped"  # on_shutdown called; the report is final


# The only transitions there are. DRAINING goes straight to STOPPED when every job ended
# within the drain budget; NEW goes to STOPPED when a worker is stopped before it started.
_TRANSITIONS: Mapping[WorkerState, frozenset[WorkerState]] = MappingProxyType(
    {
        WorkerState.NEW: frozenset({WorkerState.RUNNING, WorkerState.STOPPED}),
        WorkerState.RUNNING: frozenset({WorkerState.DRAINING}),
        WorkerState.DRAINING: frozenset({WorkerState.CANCELLING, WorkerState.STOPPED}),
        WorkerState.CANCELLING: frozenset({WorkerState.STOPPED}),
        WorkerState.STOPPED: frozenset(),
    }
)


class Step(enum.StrEnum):
    """A boundary in one job's life where ``Worker(step_hook=...)`` is called (for tests).

    Fault-injection tests park a job at a boundary, or raise there, to prove that a stop,
    a cancellation, an error or a crash at that point loses nothing. The hook is called as
    ``step_hook(step, claim, phase)``; ``phase`` names the store call for the three commit
    steps (``Phase.ACK``, ``Phase.RELEASE``, ...) and is None for the others. The two
    around the store call run in the settler thread for a handler's outcome (each item
    of a group commit in turn), and in the releasing thread for a claim never started.
    """

    AFTER_CLAIM = "after_claim"  # claiming thread: the claim is committed, not yet handed off
    BEFORE_HANDLER = "before_handler"  # handler thread: the job is running, handler not called
    AFTER_HANDLER = "after_handler"  # the handler returned or raised; nothing decided yet
    # Handler thread: the outcome is decided, about to be handed to the settler (which
    # commits it with others); nothing is written yet.
    BEFORE_GROUP_COMMIT = "before_group_commit"
    BEFORE_COMMIT = "before_commit"  # just before the store call that settles the job
    AFTER_COMMIT = "after_commit"  # that store call returned (accepted or refused)
    HEARTBEAT = "heartbeat"  # heartbeat thread: about to renew this claim's lease


@dataclass(frozen=True)
class WorkerReport:
    """What `Worker.stop` achieved.

    Attributes:
        terminated: True when every job in hand was settled and every thread the worker
            started has ended, within the budget.
        still_running: the jobs whose handler was still running at the deadline, named
            ``"job <id>"``, then the names of the handler threads that had not ended (each
            thread's own "ended" event, never ``Thread.is_alive()``; a provisional report
            from one of the worker's own threads names that thread too). Each job was
            released (``released_running_ids``: queued again, its attempt given back, its
            handler's late outcome refused); one whose release failed keeps its lease and
            runs again once that expires. Never non-empty with ``terminated`` True.
        worker: the worker's name.
        still_running_ids: the ids of those jobs, in the same order (the first entries).
        outcomes: for each job the worker held when the stop began (running, or handed
            off but not started), how it was settled during the stop.
        errors: the `~patterns.jobqueue.tasks.PhaseError` records of the worker's life (the
            most recent 100).
        thread_failures: worker threads that died (each also stopped the worker).
        phases: seconds spent in DRAINING and, if it was entered, CANCELLING.
        elapsed: seconds the `Worker.stop` call took.
        still_held_ids: claims never started whose release had not returned by the
            deadline (a store call hanging): they keep their lease until it expires,
            attempt spent. Empty unless ``terminated`` is False.
        released_running_ids: the jobs of ``still_running`` the stop released.
        failure: why the worker stopped itself because it could not work (the store
            failed every claim for ``store_outage_limit``), or None. A process should
            exit non-zero when it is set.
    """

    terminated: bool
    still_running: tuple[str, ...]
    worker: str
    still_running_ids: tuple[int, ...] = ()
    outcomes: Mapping[int, Outcome] = field(default_factory=dict)
    errors: tuple[PhaseError, ...] = ()
    thread_failures: tuple[ThreadFailure, ...] = ()
    phases: Mapping[WorkerState, float] = field(default_factory=dict)
    elapsed: float = 0.0
    still_held_ids: tuple[int, ...] = ()
    released_running_ids: tuple[int, ...] = ()
    failure: str | None = None

    def __post_init__(self) -> None:
        if self.terminated and self.still_running:
            raise ValueError(
                f"a report cannot say terminated=True with still_running={self.still_running!r}"
            )

    @property
    def completed(self) -> tuple[int, ...]:
        """Jobs that ran to an outcome of their own (done, retried or failed) during the stop."""
        ended = (Outcome.DONE, Outcome.RETRIED, Outcome.FAILED)
        return tuple(sorted(i for i, o in self.outcomes.items() if o in ended))

    @property
    def released(self) -> tuple[int, ...]:
        """Jobs given back to the queue unchanged (interrupted, or never started)."""
        return tuple(sorted(i for i, o in self.outcomes.items() if o is Outcome.RELEASED))

    def summary(self) -> str:
        """One line for a log or a terminal."""
        text = (
            f"worker {self.worker} stopped in {self.elapsed:.2f}s: "
            f"{len(self.completed)} completed, {len(self.released)} released, "
            f"{len(self.still_running_ids)} still running"
        )
        if self.still_running_ids:
            kept = [i for i in self.still_running_ids if i not in self.released_running_ids]
            text += f" {list(self.still_running_ids)}"
            if self.released_running_ids:
                text += f" (released {list(self.released_running_ids)}: attempts given back)"
            if kept:
                text += f" (they keep their lease: {kept})"
        threads = self.still_running[len(self.still_running_ids) :]
        if threads:
            text += f"; thread(s) still running: {', '.join(threads)}"
        if self.still_held_ids:
            text += (
                f"; {len(self.still_held_ids)} held, release unfinished {list(self.still_held_ids)}"
            )
        if self.failure:
            text += f"; stopped because {self.failure}"
        if self.errors or self.thread_failures:
            text += f"; {len(self.errors)} error(s), {len(self.thread_failures)} dead thread(s)"
        return text


@dataclass(frozen=True)
class WorkerStats:
    """Counters over the worker's life, as of one `Worker.stats` call."""

    state: WorkerState
    claimed: int
    running: int
    done: int
    retried: int
    failed: int
    released: int
    lost: int
    unsettled: int
    errors: int
    unknown: int = 0
    cancelled: int = 0
    timed_out: int = 0  # attempts that ended because the handler's timeout passed
    overdue: int = 0  # handlers found still running past their timeout (each once)
    awaiting_commit: int = 0  # outcomes handed to the settler, not yet committed (in ``running``)

    @property
    def settled(self) -> int:
        """Claimed jobs that reached an outcome (``claimed - settled`` are still in hand)."""
        return (
            self.done
            + self.retried
            + self.failed
            + self.released
            + self.lost
            + self.unsettled
            + self.unknown
            + self.cancelled
        )


@dataclass(slots=True)
class _Held:
    """One claim the worker holds, from the claim to its outcome; changed under ``_cond``."""

    claim: Claim  # the latest: the heartbeat replaces it with each renewed one
    token: CancelToken  # the handler's, a child of the worker's
    state: ClaimState = ClaimState.WAITING
    outcome: Outcome | None = None  # set once, by _settle
    released_at_deadline: bool = False  # released by the forced stop while it still ran
    cancel_requested: bool = False  # an operator cancelled the job (seen by a renew)
    handler_token: CancelToken | None = None  # the handler's: ``token``'s child with its timeout
    timeout: float | None = None  # seconds the handler may run (the job's, else the task's)
    overdue_reported: bool = False  # the warning for a handler past its deadline was logged
    pending: Pending[_Held] | None = None  # its decided outcome, on its way to the settler


@dataclass(slots=True)
class _Ended:
    """One thread the worker started: its name, and its own "began" and "ended" events.

    Set by the thread's target (wrapped by ``Worker._tracked``), in its first line and its
    ``finally``; read by the reports. Never ``Thread.is_alive()``: before 3.13 a
    ``join()`` interrupted by Ctrl-C marks a live thread finished (gh-90882).
    """

    name: str
    handler: bool  # a handler thread (named in ``still_running``), not the claimer & co.
    began: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)


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
        clock: the store's clock, for the run time of a retry (the same clock as the
            store's; `time.time` for every store by default).
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
        store: Store,
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
        clock: Callable[[], float] = time.time,
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
        self.name = name or f"worker-{os.getpid()}-{next(_names)}"
        self._store = store
        self._tasks = tasks
        self._concurrency = concurrency
        self._poll_interval = poll_interval
        self.stop_timeout = stop_timeout
        self._cancel_timeout = cancel_timeout
        self._lease = lease
        self._on_shutdown = on_shutdown
        self._install_signals = install_signal_handlers
        self._exit_when_empty = exit_when_empty
        self._outage_limit = options.seconds(store_outage_limit, "store_outage_limit")  # inf: never
        self._clock = clock
        self._step_hook = step_hook or _no_step_hook

        # Guards every field below it, up to the events. Waited on by the claiming thread
        # (for free claim slots or a state change); notified by a handler thread when it
        # frees its slot and by every state transition. Never held while a handler, a
        # hook or a store call runs. The settler guards its outbox with it too (and waits
        # on a Condition of its own over it), so a hand-over is one lock hold.
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        self._init_stop()
        self._state = WorkerState.NEW
        self._entered: dict[WorkerState, float] = {}  # monotonic time each state began
        self._slots = concurrency + prefetch  # claims the worker may hold at once
        # Free slots the claiming thread waits for: one without prefetch; with it, enough
        # that a handler thread may be free, and the claim then fills every free slot.
        self._claim_at = max(1, prefetch)
        self._idle = self._slots  # claim slots neither holding a claim nor promised one
        self._claimer_waiting = False  # the claiming thread waits on _cond for a free slot
        # Every claim in hand, by job id, from the claim until its outcome is recorded:
        # the heartbeat renews the WAITING and RUNNING ones.
        self._held: dict[int, _Held] = {}
        self._late: dict[int, Outcome] = {}  # outcomes settled after the stop began
        self._counts = dict.fromkeys(Outcome, 0)
        self._claimed = 0
        self._timed_out_count = 0
        self._init_errors()
        self._start_called = False  # set by the first start(), so a second one refuses
        self._report: WorkerReport | None = None
        self._failure: str | None = None  # why the worker stopped itself, if it did

        # Set by wake(), enqueue(), request_stop() and each handler thread when it frees
        # its slot; cleared by the claiming thread just before each claim; waited on by
        # the claiming thread while idle, so the idle wait ends at once.
        self._wake = threading.Event()
        # Set once, by request_stop() (a signal, exit_when_empty, a dying thread, stop());
        # waited on by wait_stop_requested() and run().
        self._stop_requested = threading.Event()
        # Set by the claiming thread as its loop begins and once it has left it (claims
        # settled); waited on by the stop, which cannot always join that thread (see
        # _shut_down). A loop that begins after the stop began returns without claiming.
        self._claim_loop_began = threading.Event()
        self._claim_loop_ended = threading.Event()
        # Set once request_stop() has settled every claim it took back from the hand-off
        # (it may run in another thread than stop(), a signal handler's or the claimer's);
        # waited on by the stop, so that no release happens after the report is final.
        self._handoff_settled = threading.Event()
        # Set once, when the stop that owns the shutdown has built the final report;
        # waited on by any other stop() call.
        self._stopped = threading.Event()

        # Cancelling it cancels every job's token (each is a child), in CANCELLING.
        self._root = CancelToken()
        # Claims from the claiming thread to the handler threads; never holds more claims
        # than the claim slots allow. Shut down by request_stop(), which takes back what
        # no handler took yet.
        self._handoff: ClosableQueue[Claim] = ClosableQueue()
        # Commits the handlers' outcomes, many per store transaction (group commit), and
        # claims for the slots they free in the same one; it shares the worker's lock.
        self._settler: Settler[_Held] = Settler(
            self._store,
            owner=self.name,
            lease=self._lease,
            clock=self._clock,
            lock=lock,
            claiming=lambda: self._state is WorkerState.RUNNING,
            free_slots=self._give_back,
            settled=self._record_batch,
            unsettled=self._unsettled_pending,
            claimed=self._take_claims,
            completed=lambda job, result: self._hook(
                Phase.ON_COMPLETE, job, self._tasks.on_complete, job, result
            ),
            error=self._unexpected,
            died=self._thread_died,
            before_commit=functools.partial(self._step_hook, Step.BEFORE_COMMIT),
            after_commit=functools.partial(self._step_hook, Step.AFTER_COMMIT),
            wake=self._wake,
            stop_timeout=min(stop_timeout, threading.TIMEOUT_MAX),
            track=lambda target: self._tracked(target, f"{self.name}-settler"),
        )
        self._executor = TrackingExecutor(
            max_workers=concurrency, thread_name_prefix=f"{self.name}-job"
        )
        self._claimer = BackgroundService(
            self._tracked(self._claim_loop, f"{self.name}-claimer"),
            name=f"{self.name}-claimer",
            stop_timeout=min(stop_timeout, threading.TIMEOUT_MAX),
        )
        # Renews every lease held, from the claim to the outcome, and writes the worker's
        # row; it reads the claims in hand under the worker's lock.
        self._heartbeat: Heartbeat[_Held] = Heartbeat(
            self._store,
            owner=self.name,
            lease=self._lease,
            interval=beat,
            clock=self._clock,
            lock=lock,
            held=self._held,
            state=lambda: self._state.value,
            lost=lambda held: self._transition(ClaimState.LOST, held=held),
            error=self._unexpected,
            died=self._thread_died,
            before_renew=lambda claim: self._step_hook(Step.HEARTBEAT, claim, None),
            track=lambda target: self._tracked(target, f"{self.name}-heartbeat"),
        )
        self._signals: SignalHandlers | None = None
        # The store's own wake-up feed, if it has one (PostgresStore: LISTEN/NOTIFY, so a
        # job enqueued on another machine ends the idle wait): subscribed by start() with
        # wake() as the callback, unsubscribed by the stop once the claiming thread left.
        self._unsubscribe: Callable[[], object] | None = None

    def _init_stop(self) -> None:
        # Every thread the worker starts, in start order (appended before it starts).
        self._threads: list[_Ended] = []
        # The thread running the stop that owns the shutdown; None again if that stop was
        # interrupted (Ctrl-C) before it recorded its report, so that the next one resumes.
        self._stop_owner: threading.Thread | None = None
        self._shutdown_hook_called = False  # on_shutdown runs once, even if a stop is retried
        self._released_running: list[int] = []  # released at the deadline, handler running
        # A KeyboardInterrupt or SystemExit from a callback run by the stopping thread
        # (on_shutdown, on_unexpected_error): re-raised once the report is recorded.
        self._deferred: BaseException | None = None

    def _init_errors(self) -> None:
        self._error_count = 0
        self._errors: list[PhaseError] = []
        self._thread_failures: list[ThreadFailure] = []

    def __repr__(self) -> str:
        return f"<Worker {self.name} {self._state}>"

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def state(self) -> WorkerState:
        """The current state."""
        return self._state

    def start(self) -> Self:
        """Start claiming and running jobs; `RuntimeError` if already started or stopped.

        All or nothing: if any step fails part-way (a thread that cannot start, a
        `KeyboardInterrupt`, a `stop` from another thread that got there first), what
        was started is stopped as `stop` does (``on_shutdown`` gets that report, and a
        claim already made is released) and the error is re-raised.
        """
        with self._cond:
            if self._state is not WorkerState.NEW or self._start_called:
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
            if self._state is not WorkerState.NEW:  # a stop() from another thread came first
                raise RuntimeError(f"{self!r}: stopped before it started")
            self._transition(WorkerState.RUNNING, f"{self._concurrency} handler thread(s)")
        self._settler.start()
        for started in range(1, self._concurrency + 1):
            self._executor.submit(
                self._tracked(self._consume, f"{self.name}-handler-{started}", handler=True)
            )
            # The pool queues the loop even when it cannot start a thread for it (it logs
            # and goes on while other threads run); a loop that never ends would then wait
            # forever for a thread. A handler slot needs its own thread, so that is a failure.
            if len(self._executor.worker_threads()) < started:
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
            draining = self._state is WorkerState.RUNNING
            if draining:
                in_hand = self._running()
                self._transition(WorkerState.DRAINING, f"{reason}; running: {in_hand}")
        self._stop_requested.set()
        if not draining:
            return
        self._wake.set()
        self._heartbeat.record()  # operators watching `workers` see the drain at once
        try:
            for claim in shutdown_and_drain(self._handoff):  # claims no handler took yet
                self._settle_unstarted(claim)
        finally:
            self._handoff_settled.set()

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
        the report returned. Never blocks past its budget (plus scheduling noise);
        ``inf`` waits as long as it takes.

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
        start = time.monotonic()
        me = threading.current_thread()
        with self._cond:  # an RLock: a signal handler on the stopping thread gets in
            if self._report is not None:
                return self._report
            inside = self._stop_owner is me
            own = not inside and self._is_own_thread()
            owner = not inside and not own and self._stop_owner is None
            if owner:
                self._stop_owner = me
        if inside:  # a signal handler or a callback of the stop in progress
            return self._report or self._provisional_report(start)
        if own:  # it cannot wait for itself: a request
            self.request_stop(f"stop() called from the worker's own thread {me.name}")
            return self._provisional_report(start, caller=me.name)
        if not owner:
            _wait(self._stopped, budget)
            return self._report or self._provisional_report(start)
        try:
            report = self._shut_down(budget, start)
        except BaseException:
            with self._cond:
                if self._report is None:  # interrupted: the next stop() resumes the shutdown
                    self._stop_owner = None
            raise
        deferred, self._deferred = self._deferred, None
        if deferred is not None:  # a callback's KeyboardInterrupt/SystemExit, now
            raise deferred
        return report

    def run(self) -> WorkerReport:
        """Start, wait until a stop is requested, then `stop`: a worker process's whole life."""
        self.start()
        try:
            self.wait_stop_requested()
        finally:
            report = self.stop()
        return report

    def __enter__(self) -> Self:
        """Start the worker if it never started; a running one is returned as it is.

        `RuntimeError` once a stop has begun: a worker runs once.
        """
        with self._cond:
            stopped = self._stop_owner is not None or self._report is not None
            stopped = stopped or self._state is WorkerState.STOPPED
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
            return WorkerStats(
                state=self._state,
                claimed=self._claimed,
                running=len(self._running()),
                done=self._counts[Outcome.DONE],
                retried=self._counts[Outcome.RETRIED],
                failed=self._counts[Outcome.FAILED],
                released=self._counts[Outcome.RELEASED],
                lost=self._counts[Outcome.LOST],
                unsettled=self._counts[Outcome.UNSETTLED],
                errors=self._error_count,
                unknown=self._counts[Outcome.UNKNOWN],
                cancelled=self._counts[Outcome.CANCELLED],
                timed_out=self._timed_out_count,
                overdue=self._heartbeat.overdue,
                awaiting_commit=sum(
                    1 for h in self._held.values() if h.state is ClaimState.SETTLING
                ),
            )

    def running_jobs(self) -> list[int]:
        """Ids of the jobs whose handlers are running now."""
        with self._cond:
            return self._running()

    # --- the shutdown ------------------------------------------------------------------------

    def _shut_down(self, budget: float, start: float) -> WorkerReport:
        """The owning stop's work; each step may run again after a Ctrl-C interrupted it."""
        deadline = start + budget  # a float even for inf; every wait below is capped

        def left() -> float:
            return min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)

        with self._cond:
            never_started = self._state is WorkerState.NEW
            if never_started:
                self._transition(WorkerState.STOPPED, "never started")
            stopped = self._state is WorkerState.STOPPED  # a stop interrupted after STOPPED
        if never_started:
            self._drop_subscription()  # a start() racing this one may have subscribed
            return self._finish(self._build_report(start, terminated=True))
        if not stopped:
            report = self._shut_down_parts(budget, start, left)
            with self._cond:
                self._transition(WorkerState.STOPPED, report.summary())
        else:
            report = self._build_report(start, terminated=self._threads_ended(left))
        return self._finish(report)

    def _shut_down_parts(
        self, budget: float, start: float, left: Callable[[], float]
    ) -> WorkerReport:
        self.request_stop("stop() called")
        drain_budget, cancel_budget = self._split(budget)
        # DRAINING is shutdown_and_await's graceful wait; on_force begins CANCELLING.
        pool = shutdown_and_await(
            self._executor,
            min(drain_budget, threading.TIMEOUT_MAX),
            force_timeout=min(cancel_budget, threading.TIMEOUT_MAX),
            on_force=self._begin_cancelling,
        )
        # The claiming thread left when DRAINING began, unless a claim was in flight.
        claimer = self._claimer.stop(left())
        # A KeyboardInterrupt inside the claimer's Thread.start (after the thread began)
        # leaves the service without it; the claim loop's own event still says when it left.
        claim_loop_ended = not self._claim_loop_began.is_set() or self._claim_loop_ended.wait(
            left()
        )
        # The request_stop that drained the hand-off may be another thread's, still
        # releasing prefetched claims: the report waits for it, or names what it holds.
        handoff_settled = self._handoff_settled.wait(left())
        # Every handler has handed its outcome over (or outlived the budget): the settler
        # commits what it holds and leaves; a later outcome is committed by its own thread.
        self._settler.close()
        settler = self._settler.stop(max(_SETTLER_GRACE, left()))
        self._drop_subscription()  # the claiming thread has left: no wait to end any more
        # Stopped only now, so leases were renewed for as long as a job could still end.
        # Its loop wakes at once; the grace covers a renew in flight at the deadline.
        self._heartbeat.stop(max(_HEARTBEAT_GRACE, left()))
        self._release_still_running()
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
            and self._threads_ended(left),
        )

    def _split(self, budget: float) -> tuple[float, float]:
        """``budget`` as (DRAINING, CANCELLING) seconds; inf stays inf (no nan from inf - inf)."""
        cancel_timeout, stop_timeout = self._cancel_timeout, self.stop_timeout
        if cancel_timeout is None:
            share = 0.25
        elif cancel_timeout == stop_timeout > 0:
            share = 1.0  # cancels at once, inf included
        elif math.isinf(stop_timeout):  # a finite part of an endless default: kept as is
            cancel = min(cancel_timeout, budget)
            return (budget - cancel if math.isfinite(budget) else budget), cancel
        else:
            share = cancel_timeout / max(stop_timeout, 1e-9)
        cancel = budget * share if share else 0.0
        if share == 1.0:
            return 0.0, budget
        return (budget - cancel if math.isfinite(budget) else budget), cancel

    def _threads_ended(self, left: Callable[[], float]) -> bool:
        """Wait (within ``left()``) until every thread the worker started has ended."""
        return all(_wait(mark.ended, left()) for mark in list(self._threads) if mark.began.is_set())

    def _tracked(
        self, target: Callable[_P, None], name: str, *, handler: bool = False
    ) -> Callable[_P, None]:
        """``target``, for a thread the worker starts: it sets its own `_Ended` events."""
        mark = _Ended(name, handler)
        self._threads.append(mark)

        def run(*args: _P.args, **kwargs: _P.kwargs) -> None:
            mark.name = threading.current_thread().name
            mark.began.set()
            try:
                target(*args, **kwargs)
            finally:
                mark.ended.set()

        return run

    def _unended(self, *, handlers: bool) -> tuple[str, ...]:
        """Names of the worker's (handler) threads that began and have not ended, lock-free."""
        return tuple(
            m.name
            for m in list(self._threads)
            if m.began.is_set() and not m.ended.is_set() and (m.handler or not handlers)
        )

    def _release_still_running(self) -> None:
        """Give back the attempt of every job whose handler outlived the budget.

        A stop must never turn a job failed: kept under its lease, such a job would come
        back once the lease expired with this attempt spent (failed at once with
        ``max_attempts=1``). The process exits right after the report (a thread cannot
        be killed), and the release clears the lease, so the handler's late outcome is
        refused (fencing) and the job runs again from the queue, like an interrupted one.
        """
        with self._cond:
            late = [
                h
                for h in self._held.values()
                if h.state is ClaimState.RUNNING and not h.released_at_deadline
            ]
            for held in late:
                held.released_at_deadline = True
        for held in late:
            job = held.claim.job
            try:
                accepted = self._release(held.claim)
            except Exception as exc:  # noqa: BLE001 - logged by _unexpected
                self._unexpected(Phase.RELEASE, job, exc)
                accepted = False
            if accepted:
                logger.warning(
                    "job %d (%s): still running at the stop deadline: released (attempt "
                    "given back); its handler's late outcome will be refused",
                    job.id,
                    job.task,
                )
                with self._cond:
                    self._released_running.append(job.id)
            else:
                logger.warning(
                    "job %d (%s): still running at the stop deadline and not released; "
                    "it keeps its lease",
                    job.id,
                    job.task,
                )

    def _begin_cancelling(self) -> None:
        with self._cond:
            if self._state is not WorkerState.DRAINING:  # a stop resumed after a Ctrl-C
                return
            running = self._running()
            self._transition(WorkerState.CANCELLING, f"cancelling job(s) {running}")
        self._root.cancel("worker shutting down")  # reaches every job's child token
        self._heartbeat.record()

    def _finish(self, report: WorkerReport) -> WorkerReport:
        with self._cond:
            call, self._shutdown_hook_called = not self._shutdown_hook_called, True
        if call and self._on_shutdown is not None:
            try:
                self._on_shutdown(report)
            except BaseException as exc:  # noqa: BLE001 - a PhaseError: logged by _unexpected
                error = self._unexpected(Phase.ON_SHUTDOWN, None, exc)
                report = replace(report, errors=(*report.errors, error))
                if isinstance(exc, KeyboardInterrupt | SystemExit):
                    self._deferred = self._deferred or exc  # raised once the report is kept
        with self._cond:
            self._report = report
        self._stopped.set()
        # Last: once Python's own SIGINT handler is back, a Ctrl-C raises right here, and
        # the report must already be the final one.
        self._close_signal_handlers()
        return report

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
        now = time.monotonic()
        with self._cond:
            still_running = tuple(self._running())
            waiting = (ClaimState.WAITING, ClaimState.LOST)
            still_held = tuple(sorted(i for i, h in self._held.items() if h.state in waiting))
            entered = dict(self._entered)
            # The handler threads still running are named after the jobs (the claimer,
            # settler and heartbeat only make terminated False: see _threads_ended).
            threads = self._unended(handlers=True)
            if caller is not None and caller not in threads:
                threads = (*threads, caller)
            return WorkerReport(
                terminated=terminated and not still_running and not still_held and not threads,
                still_held_ids=still_held,
                released_running_ids=tuple(sorted(self._released_running)),
                failure=self._failure,
                still_running=(*(f"job {job_id}" for job_id in still_running), *threads),
                worker=self.name,
                still_running_ids=still_running,
                outcomes=MappingProxyType(dict(self._late)),
                errors=tuple(self._errors),
                thread_failures=tuple(self._thread_failures),
                phases=MappingProxyType(_phase_durations(entered, now)),
                elapsed=now - start,
            )

    def _provisional_report(self, start: float, caller: str | None = None) -> WorkerReport:
        """What runs now, ``terminated=False``: never recorded; ``caller`` named if given."""
        return self._build_report(start, terminated=False, caller=caller)

    def _transition(
        self, new: WorkerState | ClaimState, detail: str = "", held: _Held | None = None
    ) -> None:
        """Set and log one state change, checked against its table (call with ``_cond`` held).

        A `WorkerState` moves the worker (logged at INFO, as event ``worker.<state>``,
        and every waiter on ``_cond`` is woken); a claim state moves ``held`` (DEBUG).
        """
        if isinstance(new, ClaimState):
            if held is None:
                raise TypeError("a claim state needs the claim it moves")
            old_claim = held.state
            if new not in CLAIM_MOVES[old_claim]:
                raise RuntimeError(f"job {held.claim.job.id}: no move from {old_claim} to {new}")
            held.state = new
            logger.debug(
                "job %d: %s -> %s", held.claim.job.id, old_claim, new
            )  # lazy: str() is the value
            return
        old = self._state
        if new not in _TRANSITIONS[old]:
            raise RuntimeError(f"{self!r}: no transition from {old} to {new}")
        self._state = new
        self._entered[new] = time.monotonic()
        self._cond.notify_all()
        logger.info(
            "worker %s: %s -> %s: %s",
            self.name,
            old.name,
            new.name,
            detail,
            extra={"event": f"worker.{new.value}", "worker": self.name, "state": new},
        )

    def _is_own_thread(self) -> bool:
        current = threading.current_thread()
        return current in self._executor.worker_threads() or current.name in (
            self._claimer.name,
            self._heartbeat.thread_name,
            self._settler.thread_name,
        )

    def _is_stopping(self) -> bool:
        return self._state is not WorkerState.RUNNING

    def _running(self) -> list[int]:
        """Ids of the jobs whose handler has started and not ended (call with ``_cond`` held)."""
        started = (ClaimState.RUNNING, ClaimState.SETTLING)
        return sorted(i for i, h in self._held.items() if h.state in started)

    # --- the claiming thread ------------------------------------------------------------------

    def _claim_loop(self, stopping: threading.Event) -> None:
        self._claim_loop_began.set()
        try:
            self._claim_until_stopped(stopping)
        except BaseException as exc:  # noqa: BLE001 - logged; a silent death leaves the queue unworked
            self._thread_died(exc)
        finally:
            self._claim_loop_ended.set()

    def _claim_until_stopped(self, stopping: threading.Event) -> None:
        failures = 0
        outage_since = 0.0  # monotonic time of the first claim of a run of failed ones
        while True:
            with self._cond:
                # The pool-level check: a handler that swallowed its Interrupted cannot
                # make this thread claim again, because it reads the worker's state.
                while self._state is WorkerState.RUNNING and self._idle < self._claim_at:
                    self._claimer_waiting = True
                    self._cond.wait()
                self._claimer_waiting = False
                if self._state is not WorkerState.RUNNING or stopping.is_set():
                    return
                want = self._idle
                self._idle -= want  # promised to the claims about to arrive
            self._wake.clear()  # an enqueue from now on ends the idle wait below
            try:
                claims = self._store.claim(self.name, lease=self._lease, limit=want)
                failures = 0
            except Exception as exc:  # noqa: BLE001 - logged; back off and claim again
                claims = []
                failures += 1
                self._unexpected(Phase.DEQUEUE, None, exc)
                now = time.monotonic()
                outage_since = now if failures == 1 else outage_since
                if now - outage_since >= self._outage_limit:
                    self._give_up_on_store(failures, now - outage_since, exc, want)
                    return
            with self._cond:
                self._idle += want - len(claims)
                self._claimed += len(claims)
                self._held.update((c.job.id, _Held(c, self._root.child())) for c in claims)
            for index, claim in enumerate(claims):
                try:
                    self._hand_over(claim, stopping)
                except ShutDown:  # the stop began while we were claiming: give them back
                    for late in claims[index:]:
                        self._settle_unstarted(late)
                    return
                except BaseException:
                    # This thread is dying (_claim_loop records it): the claims no handler
                    # got would otherwise wait out their leases with no outcome recorded.
                    for late in claims[index:]:
                        self._settle_unstarted(late)
                    raise
            if claims:
                continue  # jobs were due: claim again at once
            wait = self._next_wait(failures)
            if wait is None:
                self.request_stop("no job is due or running anywhere (exit when empty)")
                return
            self._wake.wait(min(wait, threading.TIMEOUT_MAX))  # poll_interval may be inf

    def _give_up_on_store(self, failures: int, lasted: float, exc: Exception, want: int) -> None:
        """Stop the worker: the store has failed every claim for ``store_outage_limit``."""
        reason = (
            f"the store failed every claim for {lasted:.1f} s ({failures} claims; "
            f"store_outage_limit {self._outage_limit:g} s): {_describe(exc)}"
        )
        with self._cond:
            self._idle += want  # the claim that failed took no slot
            self._failure = reason
        logger.critical("worker %s: %s; stopping", self.name, reason)
        self.request_stop(reason)

    def _hand_over(self, claim: Claim, stopping: threading.Event) -> None:
        """Put one claim on the hand-off to the handler threads (`ShutDown` once stopping)."""
        self._step_hook(Step.AFTER_CLAIM, claim, None)
        if stopping.is_set():
            # This thread's own service was stopped (a start that failed part-way stops
            # what it started) before the worker's stop began: hand nothing more over.
            raise ShutDown
        self._handoff.put(claim)

    def _next_wait(self, failures: int) -> float | None:
        """Seconds to wait before claiming again: a backoff after failed claims, else idle."""
        if failures:
            # The exponent is capped too: 2.0 ** 1024 overflows, and a store can fail longer.
            doubled = self._poll_interval * 2.0 ** min(failures - 1, 32)
            return min(doubled, _MAX_DEQUEUE_BACKOFF)
        return self._idle_wait()

    def _idle_wait(self) -> float | None:
        """Seconds to wait before the next claim; None to stop (``exit_when_empty``).

        Idle is read first: once this worker holds nothing (every outcome committed),
        the store reads after it see all its commits, so a retry committed meanwhile is
        never missed.
        """
        idle = self._exit_when_empty and self._all_idle()
        try:
            next_due = self._store.next_due()
            now = self._clock()
            if idle:
                running_anywhere = self._store.counts()["running"]
                if running_anywhere == 0 and (next_due is None or next_due > now):
                    return None
        except Exception as exc:  # noqa: BLE001 - logged by _unexpected
            self._unexpected(Phase.DEQUEUE, None, exc)
            return self._poll_interval
        if next_due is not None and next_due > now:
            return min(self._poll_interval, next_due - now)
        return self._poll_interval

    def _all_idle(self) -> bool:
        """No claim held: every slot free and every outcome handed over committed."""
        with self._cond:
            return self._idle == self._slots and not self._held

    # --- the handler threads ------------------------------------------------------------------

    def _consume(self) -> None:
        try:
            while True:
                try:
                    claim = self._handoff.get()
                except ShutDown:
                    return  # closed and empty: the worker is stopping
                pending = self._process(claim)
                with self._cond:  # one lock hold: the outcome to the settler, the slot freed
                    queued = pending is None or self._queue_outcome(pending)
                    # A queued outcome takes its slot along: its commit claims for it.
                    if pending is None or not queued:
                        self._idle += 1
                        if self._claimer_waiting:  # for a free slot: this is one
                            self._cond.notify()
                if pending is not None and not queued:  # the settler is gone: commit here
                    self._settler.commit_batch([pending])
                    self._wake.set()
        except BaseException as exc:  # noqa: BLE001 - logged; a silent death shrinks the pool
            self._thread_died(exc)

    def _process(self, claim: Claim) -> Pending[_Held] | None:
        """Run one handed-off claim; its decided outcome, for the settler (None: settled)."""
        job = claim.job
        with self._cond:
            # Under the lock that request_stop() changes the state with: a job is either
            # running when the stop begins, or released here without being started.
            run = self._held.get(job.id)
            if self._state is not WorkerState.RUNNING or run is None:
                run = None
            elif run.state is ClaimState.WAITING:  # not LOST: its lease still holds
                self._transition(ClaimState.RUNNING, held=run)
            else:
                run = None
        if run is None:
            self._settle_unstarted(claim)
            return None
        try:
            self._lifecycle(run)  # decides the outcome (run.pending) but commits nothing
        except BaseException:  # the thread dies (_consume): its job goes unsettled
            self._unsettled(run)
            raise
        if run.pending is None:  # every path decides an outcome; never left held if not
            self._unsettled(run)
        return run.pending

    def _unsettled(self, run: _Held) -> None:
        """Record the outcome of a job whose commit a dying thread never made or finished."""
        job = run.claim.job
        logger.error("job %d: left unsettled; it runs again when its lease expires", job.id)
        run.outcome, run.pending = Outcome.UNSETTLED, None
        self._record(job, Outcome.UNSETTLED, run)

    def _before_handler(self, run: _Held) -> Task | None:
        """The task to run, or None once a job that must not run now is settled."""
        job = run.claim.job
        task = self._tasks.get(job.task)
        if task is None:
            reason = f"unknown task {job.task!r}: no handler registered under that name"
            self._retry_or_fail(run, reason, lambda: Fail(reason))
            return None
        if task.ready is not None:
            try:
                ready = bool(task.ready(job))
            except Exception as exc:  # noqa: BLE001 - logged by _unexpected
                self._unexpected(Phase.READY, job, exc)
                self._after_failure(run, None, exc)
                return None
            if not ready:
                self._not_ready(run, task)
                return None
        if run.cancel_requested:  # cancelled by an operator while it waited: never run
            self._cancelled(run)
            return None
        return task

    def _lifecycle(self, run: _Held) -> None:
        job = run.claim.job
        task = self._before_handler(run)
        if task is None:
            return
        limit = job.timeout if job.timeout is not None else task.timeout
        # The handler's token: the job's (stop, lease lost, operator's cancel) plus its
        # own deadline, which cancels only this child, with DEADLINE_EXCEEDED as reason.
        # Without a deadline it is the job's token itself (one token less per job).
        token = run.token
        if limit is not None:
            token = run.token.child(timeout=limit)
            with self._cond:
                run.handler_token, run.timeout = token, limit
        ctx = JobContext(job, token, worker=self.name, stopping=self._is_stopping)
        logger.debug("job %d (%s) attempt %d: running", job.id, job.task, job.attempts)
        self._step_hook(Step.BEFORE_HANDLER, run.claim, None)
        began = time.monotonic()
        try:
            result = task.fn(job.payload, ctx)
        except BaseException as exc:  # noqa: BLE001 - every handler error is a job outcome
            self._step_hook(Step.AFTER_HANDLER, run.claim, None)
            if token.cancelled:
                self._stopped_by_token(run, task, token, exc)
                return
            if isinstance(exc, Cancelled):
                logger.warning("job %d: the handler raised Cancelled of its own token", job.id)
            self._after_failure(run, task, exc)
            return
        self._step_hook(Step.AFTER_HANDLER, run.claim, None)
        if ctx.interrupted == DEADLINE_EXCEEDED and not run.token.cancelled:
            # It saw its deadline (a checkpoint raised) and returned: it stopped there.
            self._timed_out(run, task)
            return
        if run.cancel_requested:
            logger.info(
                "job %d (%s): the handler ignored the operator's cancel and finished: "
                "completing it",
                job.id,
                job.task,
            )
        self._settle(
            run,
            Phase.ACK,
            Settlement(Settle.COMPLETE, run.claim, result),
            Outcome.DONE,
            began=began,  # on_complete: run by _commit_batch for an accepted completion
        )

    def _stopped_by_token(
        self, run: _Held, task: Task, token: CancelToken, exc: BaseException
    ) -> None:
        """The handler raised once its token was cancelled: why decides the outcome."""
        job = run.claim.job
        if run.cancel_requested:
            self._cancelled(run)
            return
        if token.reason == DEADLINE_EXCEEDED and not run.token.cancelled:
            self._timed_out(run, task)
            return
        # Interrupted by a stop (or a lost lease), or an error raised on the way out of a
        # cancelled job: given back unchanged (Proletarian leaves such a job queued too).
        logger.info("job %d: interrupted (%s): releasing it (%s)", job.id, token.reason, exc)
        self._settle(run, Phase.RELEASE, Settlement(Settle.RELEASE, run.claim), Outcome.RELEASED)

    def _cancelled(self, run: _Held) -> None:
        job = run.claim.job
        logger.info("job %d (%s): cancelled by operator; its handler stopped", job.id, job.task)
        self._settle(
            run,
            Phase.CANCEL,
            Settlement(Settle.CANCEL, run.claim, error="cancelled by operator"),
            Outcome.CANCELLED,
        )

    def _timed_out(self, run: _Held, task: Task) -> None:
        """The handler stopped at its deadline: a failed attempt, for the failure policy."""
        with self._cond:
            self._timed_out_count += 1
        limit = run.timeout or 0.0
        self._after_failure(run, task, TimeoutError(f"timed out after {limit:g}s"))

    def _after_failure(self, run: _Held, task: Task | None, error: BaseException) -> None:
        """The handler raised (or ``ready`` did, ``task`` None): the failure policy decides."""
        job = run.claim.job
        self._retry_or_fail(
            run,
            _describe(error),
            None if task is None else lambda: task.retry(job, error),
            fallback=lambda: DEFAULT_POLICY(job, error),
            policy_phase=Phase.GET_FAILURE_POLICY,
            on_fail=lambda d: self._hook(
                Phase.ON_FAILURE, job, self._tasks.on_failure, job, error, d
            ),
        )

    def _not_ready(self, run: _Held, task: Task) -> None:
        # The store has no "postpone": a requeue counts as an attempt, so a job that is
        # never ready is abandoned once its attempts are spent instead of looping forever.
        job = run.claim.job
        self._retry_or_fail(
            run,
            "not ready",
            lambda: task.not_ready(job),
            fallback=lambda: Retry(1.0),
            policy_phase=Phase.GET_UNREADINESS_POLICY,
            fail_phase=Phase.ABANDON,
            on_fail=lambda d: self._hook(
                Phase.ON_UNREADINESS, job, self._tasks.on_unreadiness, job, d
            ),
        )

    def _retry_or_fail(
        self,
        run: _Held,
        text: str,
        policy: Callable[[], object] | None,
        *,
        fallback: Callable[[], Decision] = lambda: Fail(""),
        policy_phase: Phase = Phase.GET_FAILURE_POLICY,
        fail_phase: Phase = Phase.NACK,
        on_fail: Callable[[Decision], object] | None = None,
    ) -> None:
        """The one path of a job that did not complete: decide, requeue or fail, then hook.

        ``policy`` decides (``fallback`` does if it is None, raises or returns no
        `Decision`); a `Retry` on the last attempt becomes a `Fail`; the store call
        settles the job; ``on_fail`` runs only once the store accepted the `Fail`.
        """
        job = run.claim.job
        text = storable_error(text)  # what the store keeps: never a reason to raise
        decision, error = decide(job, text, policy, fallback)
        if error is not None:
            self._unexpected(policy_phase, job, error)
        where = f"job {job.id} ({job.task}) attempt {job.attempts} of {job.max_attempts}"
        if isinstance(decision, Retry):
            run_at = self._clock() + decision.delay
            logger.warning("%s: %s: requeued in %.2fs", where, text, decision.delay)
            self._settle(
                run,
                Phase.REQUEUE,
                Settlement(Settle.RETRY, run.claim, error=text, run_at=run_at),
                Outcome.RETRIED,
            )
            return
        reason = storable_error(decision.reason or text)
        verb = "abandoned" if fail_phase is Phase.ABANDON else "failed for good"
        logger.error("%s: %s: %s", where, verb, reason)
        final = decision
        self._settle(
            run,
            fail_phase,
            Settlement(Settle.FAIL, run.claim, error=reason),
            Outcome.FAILED,
            then=None if on_fail is None else lambda: on_fail(final),
        )

    def _settle(
        self,
        run: _Held,
        phase: Phase,
        item: Settlement,
        success: Outcome,
        *,
        then: Callable[[], object] | None = None,
        began: float | None = None,
    ) -> None:
        """Decide the job's outcome: its handler thread hands it over (`_consume`).

        The settler commits it with others (`Settler.commit_batch`), records the outcome,
        then runs ``then`` (the task's hook) only when the outcome is ``success``.
        """
        run.pending = Pending(run, phase, item, success, then, began)
        self._step_hook(Step.BEFORE_GROUP_COMMIT, run.claim, phase)

    def _queue_outcome(self, pending: Pending[_Held]) -> bool:
        """Queue ``pending`` for the settler; False if it is gone (call with ``_cond`` held).

        Either way the claim is SETTLING from here on: the heartbeat leaves it alone, and
        ``running_jobs`` and the report still name it until its outcome is recorded.
        """
        run = pending.run
        self._transition(ClaimState.SETTLING, held=run)
        claim = run.claim  # the heartbeat may have renewed it
        if pending.item.claim is not claim:
            pending.item = replace(pending.item, claim=claim)
        return self._settler.put(pending)

    # --- what the settler reports back -----------------------------------------------------------

    def _give_back(self, slots: int) -> None:
        """Free ``slots`` reserved slots no claim filled (call with ``_cond`` held)."""
        if slots:
            self._idle += slots
            if self._claimer_waiting:
                self._cond.notify()

    def _record_batch(self, batch: list[Pending[_Held]]) -> None:
        """Record each committed outcome and stop holding its claim (one lock hold)."""
        with self._cond:
            for pending in batch:
                run, outcome = pending.run, pending.outcome or Outcome.UNSETTLED
                run.outcome, run.pending = outcome, None  # no cycle: the token dies now
                job_id = run.claim.job.id
                if self._held.get(job_id) is run:
                    del self._held[job_id]
                self._counts[outcome] += 1
                if self._state is not WorkerState.RUNNING:
                    self._late[job_id] = outcome

    def _unsettled_pending(self, pending: Pending[_Held]) -> None:
        """A thread dying part-way: the outcome it had not recorded is unsettled."""
        if pending.run.outcome is None:
            self._unsettled(pending.run)

    def _take_claims(
        self, claims: list[Claim], want: int, stopping: threading.Event | None
    ) -> None:
        """Hold the settler's claims, free the slots they did not fill, hand them over."""
        with self._cond:
            self._give_back(want - len(claims))
            self._claimed += len(claims)
            self._held.update((c.job.id, _Held(c, self._root.child())) for c in claims)
        for index, claim in enumerate(claims):
            try:
                self._hand_over(claim, stopping or threading.Event())
            except BaseException as exc:
                # The stop began meanwhile (ShutDown), or this thread is dying: give the
                # claims no handler got back rather than leave them to their leases.
                for late in claims[index:]:
                    self._settle_unstarted(late)
                if isinstance(exc, ShutDown):
                    return
                raise

    def _release(self, claim: Claim) -> bool:
        """`Store.release`, repeated once if its commit's outcome is unknown.

        The second call is refused if the first one applied; either way the job is not
        left leased with its attempt spent because a connection broke at ``COMMIT``.
        """
        try:
            return self._settler.commit(Phase.RELEASE, claim, self._store.release)
        except CommitUnknown as exc:
            self._unexpected(Phase.RELEASE, claim.job, exc)
            logger.warning(
                "job %d: release: outcome unknown: the commit may or may not have happened; "
                "releasing again (refused if it did)",
                claim.job.id,
            )
            return self._settler.commit(Phase.RELEASE, claim, self._store.release) or True

    def _settle_unstarted(self, claim: Claim) -> None:
        """Release a claim whose handler never started (the stop began, or the lease was lost)."""
        job = claim.job
        with self._cond:
            # Still held (so a report made meanwhile names it) until its outcome is recorded.
            held = self._held.get(job.id)
            claim = claim if held is None else held.claim  # the heartbeat may have renewed it
            lost = held is not None and held.state is ClaimState.LOST
        if lost:
            logger.info("job %d: its lease was lost before it started; not run", job.id)
            self._record(job, Outcome.LOST, held)
            return
        try:
            accepted = self._release(claim)
        except Exception as exc:  # noqa: BLE001 - logged by _unexpected
            self._unexpected(Phase.RELEASE, job, exc)
            outcome = Outcome.UNSETTLED
        else:
            outcome = Outcome.RELEASED if accepted else Outcome.LOST
        logger.info("job %d: released before it started (%s)", job.id, outcome.value)
        self._record(job, outcome, held)

    def _record(self, job: Job, outcome: Outcome, held: _Held | None = None) -> None:
        """Count ``outcome``; with ``held``, also stop holding that claim (one lock hold)."""
        with self._cond:
            if held is not None and self._held.get(job.id) is held:
                del self._held[job.id]
            self._counts[outcome] += 1
            if self._state is not WorkerState.RUNNING:
                self._late[job.id] = outcome

    # --- errors -----------------------------------------------------------------------------

    def _unexpected(self, phase: Phase, job: Job | None, cause: BaseException) -> PhaseError:
        error = PhaseError(phase, job, cause)
        logger.error("%s", error, exc_info=(type(cause), cause, cause.__traceback__))
        with self._cond:
            self._error_count += 1
            self._errors.append(error)
            del self._errors[:-_MAX_ERRORS_KEPT]
        self._hook(None, job, self._tasks.on_unexpected_error, error)
        return error

    def _hook(
        self,
        phase: Phase | None,
        job: Job | None,
        hook: Callable[..., object] | None,
        *args: object,
    ) -> None:
        if hook is None:
            return
        try:
            hook(*args)
        except BaseException as exc:  # logged and contained; see below
            exiting = isinstance(exc, KeyboardInterrupt | SystemExit)
            if (
                exiting
                and not self._is_own_thread()
                and self._stop_owner is not threading.current_thread()
            ):
                raise  # the caller's own Ctrl-C or exit, outside a stop: theirs at once
            if phase is None:  # on_unexpected_error itself: log, never recurse
                logger.exception("on_unexpected_error raised; ignored")
            else:
                self._unexpected(phase, job, exc)
            if exiting and self._stop_owner is threading.current_thread():
                self._deferred = self._deferred or exc  # raised once the stop is recorded

    def _thread_died(self, exc: BaseException) -> None:
        thread = threading.current_thread()
        failure = ThreadFailure.from_exception(thread, type(exc), exc)
        logger.critical(
            "worker %s: thread %r died: %s; stopping the worker",
            self.name,
            thread.name,
            failure.summary,
            exc_info=(type(exc), exc, exc.__traceback__),
        )
        with self._cond:
            self._thread_failures.append(failure)
        self.request_stop(f"thread {thread.name} died")


def _no_step_hook(step: Step, claim: Claim, phase: Phase | None) -> None:
    """The default ``step_hook``: nothing happens at a `Step`."""


def _phase_durations(entered: Mapping[WorkerState, float], now: float) -> dict[WorkerState, float]:
    """Seconds spent in DRAINING and CANCELLING, from the times each state was entered."""
    durations = {}
    for state, after in (
        (WorkerState.DRAINING, (WorkerState.CANCELLING, WorkerState.STOPPED)),
        (WorkerState.CANCELLING, (WorkerState.STOPPED,)),
    ):
        if state in entered:
            ends = [entered[s] for s in after if s in entered]
            durations[state] = min(ends, default=now) - entered[state]
    return durations


def _wait(event: threading.Event, seconds: float) -> bool:
    """``event.wait(seconds)`` for any ``seconds >= 0``, inf included: each wait is capped."""
    deadline = time.monotonic() + seconds
    while not event.wait(min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)):
        if time.monotonic() >= deadline:
            return False
    return True
