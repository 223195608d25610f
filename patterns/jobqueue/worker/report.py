"""The worker's report and stats.

TL;DR: `~patterns.jobqueue.worker.worker.WorkerReport` is what ``Worker.stop`` returns and
`~patterns.jobqueue.worker.worker.WorkerStats` what ``Worker.stats`` returns; `build_report` and
`build_stats` make them from the claim ledger, the worker's threads
(`~patterns.jobqueue.worker.threads.ThreadMarks`) and its errors.

Pattern:
    The lifecycle contract's report (docs/design.md): ``terminated`` and
    ``still_running``, never contradicting each other. A report reads each thread's own
    "ended" event, never ``Thread.is_alive()``: before 3.13 a ``join()`` interrupted by
    Ctrl-C marks a live thread finished (:gh:`90882`), as ``patterns.daemon_threads`` shows.

See also: ``patterns.jobqueue.worker.worker`` (the stop that builds it),
``patterns.jobqueue.worker.ledger`` (what it reads).
"""

# No ``from __future__ import annotations`` here: WorkerReport and WorkerStats name the
# worker's module as theirs, so their annotations must be objects, not names to look up
# in that module (the docs read them with typing.get_type_hints).
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from patterns.jobqueue.tasks import PhaseError
from patterns.jobqueue.worker.errors import ErrorLog
from patterns.jobqueue.worker.ledger import ClaimLedger
from patterns.jobqueue.worker.outcomes import Outcome
from patterns.jobqueue.worker.states import WorkerState
from patterns.jobqueue.worker.threads import ThreadMarks
from patterns.thread_exceptions import ThreadFailure

# WorkerReport and WorkerStats are documented with the Worker, where users import them.
__all__ = ["build_report", "build_stats", "phase_durations"]


@dataclass(frozen=True)
class WorkerReport:
    """What `~patterns.jobqueue.worker.worker.Worker.stop` achieved.

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
        elapsed: seconds the `~patterns.jobqueue.worker.worker.Worker.stop` call took.
        still_held_ids: claims never started whose release had not returned by the
            deadline (a store call hanging): they keep their lease until it expires,
            attempt spent. Empty unless ``terminated`` is False.
        released_running_ids: the jobs of ``still_running`` the stop released.
        failure: why the worker stopped itself because it could not work (the store
            failed every claim for ``store_outage_limit``), or None. A process should
            exit non-zero when it is set.
        store_gave_up: how many store calls gave up at the stop's deadline because the
            store did not answer (a file or table locked by another connection, say):
            the stop kept to its budget instead. What they would have written is named
            by ``unsettled`` and ``still_held_ids`` (those jobs keep their lease and run
            again once it expires); the worker's row expires by itself. ``terminated`` is
            False when it is not 0.
    """

    # Users import it from, and the docs document it with, the worker's module.
    __module__ = "patterns.jobqueue.worker.worker"

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
    store_gave_up: int = 0

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
    def unsettled(self) -> tuple[int, ...]:
        """Jobs whose outcome could not be written; each keeps its lease until it expires."""
        return tuple(sorted(i for i, o in self.outcomes.items() if o is Outcome.UNSETTLED))

    @property
    def released(self) -> tuple[int, ...]:
        """Jobs given back to the queue unchanged (interrupted, or never started)."""
        return tuple(sorted(i for i, o in self.outcomes.items() if o is Outcome.RELEASED))

    def summary(self) -> str:
        """One line for a log or a terminal."""
        text = (
            f"worker {self.worker} stopped in {self.elapsed:.2f}s: "
            # A job released at the deadline while its handler still ran is counted in both
            # "released" (its row) and "still running" (its handler), and said to be so.
            f"{len(self.completed)} completed, "
            f"{len(self.released) + len(self.released_running_ids)} released, "
            f"{len(self.still_running_ids)} still running"
        )
        if self.still_running_ids:
            kept = [i for i in self.still_running_ids if i not in self.released_running_ids]
            text += f" {list(self.still_running_ids)}"
            if self.released_running_ids:
                released = list(self.released_running_ids)
                text += f" (released at the deadline {released}: attempts given back)"
            if kept:
                text += f" (they keep their lease: {kept})"
        threads = self.still_running[len(self.still_running_ids) :]
        if threads:
            text += f"; thread(s) still running: {', '.join(threads)}"
        if self.still_held_ids:
            text += (
                f"; {len(self.still_held_ids)} held, release unfinished {list(self.still_held_ids)}"
            )
        if self.unsettled:
            text += (
                f"; {len(self.unsettled)} unsettled {list(self.unsettled)} (outcome not "
                "written: they keep their lease and run again once it expires)"
            )
        if self.store_gave_up:
            text += (
                f"; gave up on the store at the deadline ({self.store_gave_up} call(s) "
                "unanswered: is it locked by another connection?)"
            )
        if self.failure:
            text += f"; stopped because {self.failure}"
        if self.errors or self.thread_failures:
            text += f"; {len(self.errors)} error(s), {len(self.thread_failures)} dead thread(s)"
        return text


# Its method too (viewcode links a method's source by the function's own module).
WorkerReport.summary.__module__ = "patterns.jobqueue.worker.worker"


@dataclass(frozen=True)
class WorkerStats:
    """Counters over the worker's life, as of one `~.Worker.stats` call."""

    # Users import it from, and the docs document it with, the worker's module.
    __module__ = "patterns.jobqueue.worker.worker"

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


def build_report(
    worker: str,
    ledger: ClaimLedger,
    marks: ThreadMarks,
    errors: ErrorLog,
    *,
    entered: Mapping[WorkerState, float],
    failure: str | None,
    start: float,
    terminated: bool,
    caller: str | None = None,
    store_gave_up: int = 0,
) -> WorkerReport:
    """A report of what runs and what was settled now (call with the ledger's lock held).

    The handler threads still running are named after the jobs (the claimer, settler and
    heartbeat only make ``terminated`` False, through
    `~patterns.jobqueue.worker.threads.ThreadMarks.all_ended`); a ``caller`` (one of the worker's
    own threads asking) is named too.
    """
    now = time.monotonic()
    still_running = tuple(ledger.running())
    still_held = ledger.still_held()
    threads = marks.unended(handlers=True)
    if caller is not None and caller not in threads:
        threads = (*threads, caller)
    return WorkerReport(
        terminated=terminated
        and not still_running
        and not still_held
        and not threads
        and not store_gave_up,
        store_gave_up=store_gave_up,
        still_held_ids=still_held,
        released_running_ids=tuple(sorted(ledger.released_running)),
        failure=failure,
        still_running=(*(f"job {job_id}" for job_id in still_running), *threads),
        worker=worker,
        still_running_ids=still_running,
        outcomes=MappingProxyType(dict(ledger.late)),
        errors=errors.errors(),
        thread_failures=errors.thread_failures(),
        phases=MappingProxyType(phase_durations(entered, now)),
        elapsed=now - start,
    )


def build_stats(
    state: WorkerState, ledger: ClaimLedger, errors: ErrorLog, *, overdue: int
) -> WorkerStats:
    """The worker's counters now (call with the ledger's lock held)."""
    counts = ledger.counts
    return WorkerStats(
        state=state,
        claimed=ledger.claimed,
        running=len(ledger.running()),
        done=counts[Outcome.DONE],
        retried=counts[Outcome.RETRIED],
        failed=counts[Outcome.FAILED],
        released=counts[Outcome.RELEASED],
        lost=counts[Outcome.LOST],
        unsettled=counts[Outcome.UNSETTLED],
        errors=errors.count,
        unknown=counts[Outcome.UNKNOWN],
        cancelled=counts[Outcome.CANCELLED],
        timed_out=ledger.timed_out,
        overdue=overdue,
        awaiting_commit=ledger.settling(),
    )


def phase_durations(entered: Mapping[WorkerState, float], now: float) -> dict[WorkerState, float]:
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
