"""Fault injection at every step of a job's life: nothing is lost, whatever happens where.

The worker calls its ``step_hook`` at seven boundaries (`Step`): after the claim, before
and after the handler, as the handler thread hands the outcome to the settler, before and
after each store call that settles the job (in the settler's group commit), and in the
heartbeat. `Script`, the hook used here, parks the job at one boundary behind a `Gate`,
and the test injects one fault while it waits there:

* **stop**: `Worker.request_stop` (the worker moves to DRAINING);
* **cancel**: a `Worker.stop` that cancels at once (the worker is in CANCELLING);
* **exception**: the step itself raises an ordinary exception (no parking);
* **crash**: the process dies there. The worker's view of the database is cut off
  (`FaultStore.sever`: every later call raises) and the parked thread is killed by a
  `SimulatedCrash`; the worker is then discarded and another recovers the job once the
  lease has expired on a fake clock;
* **stall**: the worker freezes there (a GC pause, SIGSTOP) for longer than its lease,
  another worker takes the job over and finishes it, then the frozen one resumes.

After each fault the test checks the invariants: no job is lost (after a recovery worker
ran, every job is ``done`` or ``failed``); right after the fault the job is finished or
claimable again; no outcome is written under a stale lease (fencing); attempts equal
claims minus releases, exactly; and the faulty worker's stop returns within its budget.
Every case runs on every store (memory, a SQLite file, PostgreSQL), with the stores' clock
faked, and nothing sleeps.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from patterns import daemon_threads
from patterns.jobqueue.stores.base import settle_only
from patterns.jobqueue.stores.memory import MemoryStore
from patterns.jobqueue.stores.postgres.store import PostgresStore
from patterns.jobqueue.stores.protocol import Store
from patterns.jobqueue.stores.records import Claim, Job, JobState, Settle, Settlement
from patterns.jobqueue.stores.sqlite.store import SQLiteStore
from patterns.jobqueue.tasks import Phase, PhaseError, Retry, TaskRegistry
from patterns.jobqueue.worker.shared import no_step
from patterns.jobqueue.worker.worker import Outcome, Step, Worker, WorkerReport, WorkerState
from tests.jobqueue import fakes
from tests.support import (
    MUST_HAPPEN,
    FakeClock,
    Gate,
    elapsed,
    join_or_fail,
    run_in_thread,
    wait_until,
)

LEASE = 1_000.0  # fake seconds, longer than FOREVER; only the fake clock moves past it
BUDGET = 5.0  # the faulty worker's shutdown budget; no case should need much of it
NOISE = 1.5  # scheduling noise allowed on top of a budget (the CI machine is shared)
FOREVER = 600.0  # a poll or heartbeat interval that never elapses within a test
BEAT = 0.01  # real seconds between heartbeats, in the cases that need one


class StoreGone(Exception):
    """Raised by every call of a severed `FaultStore`: the crashed process's connection."""


class SimulatedCrash(BaseException):
    """Kills the thread it is raised in, as the end of its process would."""


class InjectedError(Exception):
    """The ordinary exception the "exception" fault raises at a step."""


class Ledger:
    """What the store accepted, across every worker's view of it, for the invariants."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.claims: dict[int, list[str]] = {}  # job id -> the tokens of its claims
        self.accepted: dict[str, list[str]] = {}  # token -> the settling calls accepted
        self.releases: dict[int, int] = {}  # job id -> accepted releases

    def claimed(self, claims: list[Claim]) -> None:
        """Note the claims a store call returned."""
        with self._lock:
            for claim in claims:
                self.claims.setdefault(claim.job.id, []).append(claim.token)
                self.accepted.setdefault(claim.token, [])

    def settled(self, method: str, claim: Claim, accepted: bool) -> None:
        """Note a settling call the store accepted."""
        if not accepted:
            return
        with self._lock:
            self.accepted[claim.token].append(method)
            if method == "release":
                self.releases[claim.job.id] = self.releases.get(claim.job.id, 0) + 1


# The single-job method each kind of settlement stands for, as the ledger names calls.
_METHODS = {
    Settle.COMPLETE: "complete",
    Settle.FAIL: "fail",
    Settle.RETRY: "retry",
    Settle.RELEASE: "release",
    Settle.CANCEL: "mark_cancelled",
}


class FaultStore:
    """One worker's view of a real store: a pass-through that can be cut off.

    A fake around the code under test, not a mock: every call goes to the real store.
    `sever` stands for the end of the process: from then on every call raises
    `StoreGone` before reaching the store, so a crashed worker cannot write anything.
    """

    def __init__(self, inner: Store, ledger: Ledger) -> None:
        self.inner = inner
        self.ledger = ledger
        self.severed = threading.Event()  # set by the test; read before every call
        self.fail_renew: BaseException | None = None  # raised by every renew, if set
        self.jobs_left: int | None = None  # claims return no more jobs than this, if set

    def sever(self) -> None:
        """Cut the connection: nothing this worker does reaches the store any more."""
        self.severed.set()

    def _check(self) -> None:
        if self.severed.is_set():
            raise StoreGone("the process that owned this connection has crashed")

    def enqueue(self, task: str, payload: Any = None, **kwargs: Any) -> int:
        """Pass through."""
        self._check()
        return self.inner.enqueue(task, payload, **kwargs)

    def enqueue_many(self, jobs: Any) -> list[int]:
        """Pass through."""
        self._check()
        return self.inner.enqueue_many(jobs)

    def claim(self, owner: str, *, lease: float, limit: int = 1) -> list[Claim]:
        """Pass through, noting every claim."""
        self._check()
        if self.jobs_left is not None:
            limit = min(limit, self.jobs_left)
            if limit == 0:
                return []
        claims = self.inner.claim(owner, lease=lease, limit=limit)
        if self.jobs_left is not None:
            self.jobs_left -= len(claims)
        self.ledger.claimed(claims)
        return claims

    def complete(self, claim: Claim, result: Any = None) -> bool:
        """Pass through, noting an accepted call."""
        self._check()
        accepted = self.inner.complete(claim, result)
        self.ledger.settled("complete", claim, accepted)
        return accepted

    def settle_many(self, items: Sequence[Settlement]) -> list[bool | Exception]:
        """Pass through (one transaction in the real store), noting each accepted item."""
        self._check()
        answers = self.inner.settle_many(items)
        for item, answer in zip(items, answers, strict=True):
            self.ledger.settled(_METHODS[item.kind], item.claim, answer is True)
        return answers

    def settle_and_claim(
        self, items: Sequence[Settlement], owner: str, *, lease: float, limit: int
    ) -> tuple[list[bool | Exception], list[Claim]]:
        """The noted `settle_many`, no claim: every claim goes through `claim`, noted."""
        return settle_only(self, items, owner, lease=lease, limit=limit)

    def mark_cancelled(self, claim: Claim, reason: str) -> bool:
        """Pass through, noting an accepted call."""
        self._check()
        accepted = self.inner.mark_cancelled(claim, reason)
        self.ledger.settled("mark_cancelled", claim, accepted)
        return accepted

    def record_worker(self, worker_id: str, **row: Any) -> None:
        """Pass through."""
        self._check()
        self.inner.record_worker(worker_id, **row)

    def forget_worker(self, worker_id: str) -> None:
        """Pass through."""
        self._check()
        self.inner.forget_worker(worker_id)

    def fail(self, claim: Claim, error: str) -> bool:
        """Pass through, noting an accepted call."""
        self._check()
        accepted = self.inner.fail(claim, error)
        self.ledger.settled("fail", claim, accepted)
        return accepted

    def retry(self, claim: Claim, error: str, *, run_at: float) -> bool:
        """Pass through, noting an accepted call."""
        self._check()
        accepted = self.inner.retry(claim, error, run_at=run_at)
        self.ledger.settled("retry", claim, accepted)
        return accepted

    def release(self, claim: Claim) -> bool:
        """Pass through, noting an accepted call."""
        self._check()
        accepted = self.inner.release(claim)
        self.ledger.settled("release", claim, accepted)
        return accepted

    def renew(self, claim: Claim, *, lease: float) -> Claim | None:
        """Pass through, or raise ``fail_renew``."""
        self._check()
        if self.fail_renew is not None:
            raise self.fail_renew
        return self.inner.renew(claim, lease=lease)

    def get(self, job_id: int) -> Job | None:
        """Pass through."""
        self._check()
        return self.inner.get(job_id)

    def counts(self) -> dict[str, int]:
        """Pass through."""
        self._check()
        return self.inner.counts()

    def next_due(self) -> float | None:
        """Pass through."""
        self._check()
        return self.inner.next_due()

    def purge(self, *, older_than: float | None = None) -> int:
        """Pass through."""
        self._check()
        return self.inner.purge(older_than=older_than)

    def clock(self) -> float:
        """Pass through (the store's time is not a write: it still answers once severed)."""
        return self.inner.clock()

    def subscribe(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Pass through."""
        self._check()
        return self.inner.subscribe(callback)

    def close(self) -> None:
        """Nothing: the test closes the real store."""


@dataclass
class Rule:
    """One boundary where the script intervenes, once: park there, then maybe raise."""

    step: Step
    phase: Phase | None  # for the commit steps: which store call; None matches any
    park: bool
    error: BaseException | None  # raised after the gate opens (the test may set it meanwhile)
    gate: Gate
    when: Callable[[], bool] | None = None  # the rule applies only once this holds
    claim: Claim | None = None  # the claim that reached it


class Script:
    """The worker's step hook: records every step, and applies the rules, each once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.trace: list[tuple[Step, int, Phase | None]] = []
        self.rules: list[Rule] = []

    def at(
        self,
        step: Step,
        phase: Phase | None = None,
        *,
        park: bool = True,
        error: BaseException | None = None,
        when: Callable[[], bool] | None = None,
    ) -> Rule:
        """Add a rule; the first job to reach ``step`` (and ``phase``) triggers it.

        With ``when``, a step reached while ``when()`` is false passes the rule by (a
        heartbeat step recurs: the rule waits for the first one after ``when`` holds).
        """
        gate = Gate(f"{step.value} {phase or ''}".strip())
        rule = Rule(step, phase, park, error, gate, when)
        self.rules.append(rule)
        return rule

    def __call__(self, step: Step, claim: Claim, phase: Phase | None) -> None:
        """Called by the worker at every step."""
        with self._lock:
            self.trace.append((step, claim.job.id, phase))
            rule = next(
                (
                    r
                    for r in self.rules
                    if r.claim is None
                    and r.step is step
                    and r.phase in (None, phase)
                    and (r.when is None or r.when())
                ),
                None,
            )
            if rule is None:
                return
            rule.claim = claim
        if rule.park:
            rule.gate.arrive()
        else:
            rule.gate.reached.set()
        if rule.error is not None:
            raise rule.error

    def open_all(self) -> None:
        """Let every parked thread go on (the end of a test, whatever happened)."""
        for rule in self.rules:
            rule.gate.open()


@dataclass
class World:
    """One test's store, clock, handlers and records, shared by every worker in it."""

    clock: FakeClock
    inner: Store
    ledger: Ledger = field(default_factory=Ledger)
    runs: list[tuple[int, int, str]] = field(default_factory=list)  # (job, attempt, worker)
    holds: list[tuple[int, str, bool]] = field(default_factory=list)  # (job, worker, cancelled)
    release: threading.Event = field(default_factory=threading.Event)  # ends every hold
    holding: threading.Event = field(default_factory=threading.Event)  # a hold in w1 began
    tasks: TaskRegistry = field(default_factory=TaskRegistry)
    workers: list[Worker] = field(default_factory=list)

    def view(self) -> FaultStore:
        """A new worker's own view of the store."""
        return FaultStore(self.inner, self.ledger)

    def worker(self, store: FaultStore, name: str, **options: Any) -> Worker:
        """A worker with the test defaults: one thread, nothing timed but the stop."""
        settings: dict[str, Any] = {
            "concurrency": 1,
            "poll_interval": FOREVER,
            "stop_timeout": BUDGET,
            "lease": LEASE,
            "heartbeat_interval": FOREVER,
            "name": name,
            "clock": self.clock,
        }
        settings.update(options)
        worker = Worker(store, self.tasks, **settings)
        self.workers.append(worker)
        return worker


def install_work_task(world: World) -> None:
    """The one handler: idempotent, and it records each time it does its work.

    Payloads: ``"plain"`` returns at once; ``"hold"`` runs until the test sets
    ``world.release`` or the job's token is cancelled (only in worker ``w1``, which sets
    ``world.holding`` as the hold begins; the recovery worker finishes it at once);
    ``"fail"`` always raises and ``"fail-once"`` raises on attempt 1. Failures are retried
    at once (on the fake clock).
    """

    @world.tasks.task(name="work", max_attempts=10, retry=lambda job, error: Retry(0.0))
    def work(payload: str, ctx: Any) -> str:
        ctx.check()  # a job cancelled before it starts does nothing
        world.runs.append((ctx.job_id, ctx.attempt, ctx.worker))
        if payload == "hold" and ctx.worker == "w1":
            with ctx.token.on_cancel(world.release.set):
                world.holding.set()  # the job is running: its handler has started
                world.release.wait(MUST_HAPPEN)
            world.holds.append((ctx.job_id, ctx.worker, ctx.token.cancelled))
            ctx.check()
        if payload == "fail" or (payload == "fail-once" and ctx.attempt == 1):
            raise ValueError("the job's own failure")
        return "ok"


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    """A world on each store (PostgreSQL: a fresh schema); every worker stopped at the end."""
    clock = FakeClock()
    inner: Store
    if request.param == "memory":
        inner = MemoryStore(clock=clock)
    elif request.param == "sqlite":
        inner = SQLiteStore(tmp_path / "jobs.db", clock=clock)
    else:
        dsn = request.getfixturevalue("pg_dsn")
        inner = PostgresStore(dsn, schema=request.getfixturevalue("pg_schema"), clock=clock)
    made = World(clock, inner)
    install_work_task(made)
    try:
        yield made
    finally:
        made.release.set()
        for worker in made.workers:
            worker.stop(MUST_HAPPEN)
        inner.close()


def run_to_empty(world: World, name: str) -> WorkerReport:
    """Run a fresh worker until nothing is due or running anywhere, and return its report."""
    worker = world.worker(world.view(), name, exit_when_empty=True)
    thread, outcome = run_in_thread(worker.run, f"{name}-main")
    join_or_fail(thread)
    assert "error" not in outcome, outcome
    report: WorkerReport = outcome["result"]
    assert report.terminated, report.summary()
    return report


def recover(world: World) -> WorkerReport:
    """What a restart does: wait out every lease (on the fake clock), then drain the queue."""
    world.clock.advance(LEASE + 1)
    return run_to_empty(world, "w3")


def first_beat_over(worker: Worker) -> None:
    """Block until ``worker``'s heartbeat has finished its first beat (it waits for the next).

    The first beat runs when the heartbeat thread gets to run, which on a busy machine can
    be after the claim and even after the fault: a renewal after the fake clock has moved
    past the lease, or after the store was cut off. Each case expects it before the fault.
    """
    [thread] = [t for t in threading.enumerate() if t.name == f"{worker.name}-heartbeat"]

    def between_beats() -> bool:
        # Inside every()'s wait for the next beat: the beat before it has returned.
        frame = sys._current_frames().get(thread.ident or -1)
        while frame is not None and frame.f_back is not None:
            if (frame.f_code.co_name, frame.f_back.f_code.co_name) == ("_wait", "work") and (
                frame.f_code.co_filename == daemon_threads.__file__
            ):
                return True
            frame = frame.f_back
        return False

    wait_until(between_beats, f"{thread.name}: its first beat ends")


def stop_within_budget(worker: Worker, budget: float = BUDGET) -> WorkerReport:
    """Stop ``worker`` and check the stop kept to its budget."""
    with elapsed() as took:
        report = worker.stop(budget)
    assert took() < budget + NOISE
    assert report.elapsed < budget + NOISE
    return report


def job(world: World, job_id: int) -> Job:
    """The job as the store has it now."""
    found = world.inner.get(job_id)
    assert found is not None, f"job {job_id} was lost"
    return found


def assert_claimable_or_finished(world: World, job_id: int) -> None:
    """Right after a fault: finished, queued (due within a lease), or on a lease that expires."""
    now = world.clock()
    found = job(world, job_id)
    if found.state is JobState.QUEUED:
        assert found.run_at <= now + LEASE  # a retry's backoff after attempt 1 is a second
    elif found.state is JobState.RUNNING:
        assert found.lease_until is not None
        assert found.lease_until <= now + LEASE
    else:
        assert found.state in (JobState.DONE, JobState.FAILED)


def assert_attempts_are_claims_minus_releases(world: World, job_id: int) -> None:
    """Attempts count claims; an accepted release gives one back. Exactly, no more, no less."""
    claims = len(world.ledger.claims.get(job_id, []))
    releases = world.ledger.releases.get(job_id, 0)
    assert job(world, job_id).attempts == claims - releases


def assert_at_most_one_outcome_per_claim(world: World) -> None:
    """No claim got two settling calls accepted (an outcome is written once per lease)."""
    for token, calls in world.ledger.accepted.items():
        assert len(calls) <= 1, (token, calls)


# --- the matrix ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    """What one (boundary, fault) case must end in.

    Attributes:
        outcome: the faulty worker's outcome for the job.
        state, attempts: the job in the store once the faulty worker is gone.
        final_attempts: after a recovery worker ran (the job is then done).
        runs: how many times the handler did its work, in all (more than one only where
            the fault came after the work and before its outcome was written).
        died: whether a thread of the faulty worker died (and was reported).
    """

    outcome: Outcome
    state: JobState
    attempts: int
    final_attempts: int
    runs: int
    died: bool = False


_D, _Q, _R = JobState.DONE, JobState.QUEUED, JobState.RUNNING
DONE_ONCE = Expect(Outcome.DONE, _D, 1, 1, 1)
TAKEN_OVER = Expect(Outcome.LOST, _D, 2, 2, 2)  # stall: the newer claim's outcome stands

MATRIX: dict[tuple[Step, str], Expect] = {
    # After the claim, before the hand-off: the handler has not started.
    (Step.AFTER_CLAIM, "stop"): Expect(Outcome.RELEASED, _Q, 0, 1, 1),
    (Step.AFTER_CLAIM, "exception"): Expect(Outcome.RELEASED, _Q, 0, 1, 1, died=True),
    (Step.AFTER_CLAIM, "crash"): Expect(Outcome.UNSETTLED, _R, 1, 2, 1, died=True),
    (Step.AFTER_CLAIM, "stall"): TAKEN_OVER,
    # Before the handler: the job is running, its token exists.
    (Step.BEFORE_HANDLER, "stop"): DONE_ONCE,  # running jobs may finish while draining
    (Step.BEFORE_HANDLER, "cancel"): Expect(Outcome.RELEASED, _Q, 0, 1, 1),
    (Step.BEFORE_HANDLER, "exception"): Expect(Outcome.UNSETTLED, _R, 1, 2, 1, died=True),
    (Step.BEFORE_HANDLER, "crash"): Expect(Outcome.UNSETTLED, _R, 1, 2, 1, died=True),
    (Step.BEFORE_HANDLER, "stall"): TAKEN_OVER,
    # After the handler: the work is done, its outcome not yet written.
    (Step.AFTER_HANDLER, "stop"): DONE_ONCE,
    (Step.AFTER_HANDLER, "cancel"): DONE_ONCE,  # a cancel cannot undo finished work
    (Step.AFTER_HANDLER, "exception"): Expect(Outcome.UNSETTLED, _R, 1, 2, 2, died=True),
    (Step.AFTER_HANDLER, "crash"): Expect(Outcome.UNSETTLED, _R, 1, 2, 2, died=True),
    (Step.AFTER_HANDLER, "stall"): TAKEN_OVER,
    # Handed to the settler: decided, not yet in a group commit. Like after the handler:
    # the handler thread is where the fault lands, and nothing is written yet.
    (Step.BEFORE_GROUP_COMMIT, "stop"): DONE_ONCE,
    (Step.BEFORE_GROUP_COMMIT, "cancel"): DONE_ONCE,
    (Step.BEFORE_GROUP_COMMIT, "exception"): Expect(Outcome.UNSETTLED, _R, 1, 2, 2, died=True),
    (Step.BEFORE_GROUP_COMMIT, "crash"): Expect(Outcome.UNSETTLED, _R, 1, 2, 2, died=True),
    (Step.BEFORE_GROUP_COMMIT, "stall"): TAKEN_OVER,
    # Before the commit (store.complete).
    (Step.BEFORE_COMMIT, "stop"): DONE_ONCE,
    (Step.BEFORE_COMMIT, "cancel"): DONE_ONCE,
    # The fallback keeps the attempt spent (a release would give it back: an outcome that
    # can never be written would then run the job again at once, for ever).
    (Step.BEFORE_COMMIT, "exception"): Expect(Outcome.RETRIED, _Q, 1, 2, 2),
    (Step.BEFORE_COMMIT, "crash"): Expect(Outcome.UNSETTLED, _R, 1, 2, 2, died=True),
    (Step.BEFORE_COMMIT, "stall"): TAKEN_OVER,
    # After the commit: the outcome is in the store, whatever happens next.
    (Step.AFTER_COMMIT, "stop"): DONE_ONCE,
    (Step.AFTER_COMMIT, "cancel"): DONE_ONCE,
    # The call "raised" after committing; the fallback retry is refused: lost to this
    # claim, done in the store.
    (Step.AFTER_COMMIT, "exception"): Expect(Outcome.LOST, _D, 1, 1, 1),
    (Step.AFTER_COMMIT, "crash"): Expect(Outcome.UNSETTLED, _D, 1, 1, 1, died=True),
    (Step.AFTER_COMMIT, "stall"): DONE_ONCE,  # nothing left to take over
    # The heartbeat, while a long job runs.
    (Step.HEARTBEAT, "stop"): DONE_ONCE,  # renewals go on while draining
    (Step.HEARTBEAT, "cancel"): Expect(Outcome.RELEASED, _Q, 0, 1, 2),  # interrupted, rerun
    (Step.HEARTBEAT, "exception"): DONE_ONCE,  # a failed renewal is logged; the job goes on
    (Step.HEARTBEAT, "crash"): Expect(Outcome.UNSETTLED, _R, 1, 2, 2, died=True),
    (Step.HEARTBEAT, "stall"): TAKEN_OVER,  # the heartbeat finds the lease lost: cancels
}
# Left out on purpose: "cancel" after the claim. No job token exists yet and no handler
# thread is busy, so a stop that cancels at once may or may not pass through CANCELLING;
# the hand-off sees a stopping worker either way, which is the "stop" case.


def test_the_matrix_has_every_boundary_and_every_fault_that_makes_sense() -> None:
    """Seven boundaries times five faults, less the one combination that cannot be forced."""
    faults = {"stop", "cancel", "exception", "crash", "stall"}
    cases = {(step, fault) for step in Step for fault in faults}
    assert set(MATRIX) == cases - {(Step.AFTER_CLAIM, "cancel")}


def no_stop_running() -> None:
    """What `inject` returns when no stop runs in the background: nothing to wait for."""


def inject(
    world: World, w1: Worker, store: FaultStore, rule: Rule, fault: str
) -> Callable[[], Any]:
    """Apply ``fault`` while the job waits at ``rule``; return what ends a background stop."""
    background: Callable[[], Any] = no_stop_running
    rule.gate.wait_reached()
    if fault == "stop":
        w1.request_stop("injected at a step")
    elif fault == "cancel":
        thread, outcome = run_in_thread(lambda: w1.stop(BUDGET), "stopper")
        wait_until(lambda: w1.state is WorkerState.CANCELLING, "the worker cancels")

        def background() -> Any:
            join_or_fail(thread, BUDGET + NOISE)
            assert "error" not in outcome, outcome
            return outcome["result"]

    elif fault == "crash":
        store.sever()
        rule.error = SimulatedCrash()
        world.release.set()  # the dead process's handler: whatever it does no longer lands
    elif fault == "stall":
        world.clock.advance(LEASE + 1)  # frozen past its lease
        run_to_empty(world, "w2")  # another worker takes the job over and finishes it
    rule.gate.open()
    return background


@pytest.mark.parametrize(("step", "fault"), list(MATRIX), ids=[f"{s.value}-{f}" for s, f in MATRIX])
def test_a_fault_at_any_step_loses_no_job_and_keeps_the_accounts_exact(
    world: World, step: Step, fault: str
) -> None:
    """Whatever the fault and wherever it lands, the job is never lost, nor settled twice."""
    expect = MATRIX[step, fault]
    payload = "hold" if step is Step.HEARTBEAT else "plain"
    job_id = world.inner.enqueue("work", payload, max_attempts=10)
    script = Script()
    commits = (Step.BEFORE_GROUP_COMMIT, Step.BEFORE_COMMIT, Step.AFTER_COMMIT)
    phase = Phase.ACK if step in commits else None
    # A heartbeat step is for the running job: the beats that renew its claim while it
    # waits for a handler thread (a busy machine) pass by.
    when = world.holding.is_set if step is Step.HEARTBEAT else None
    if fault == "exception":
        error = InjectedError(f"injected at {step}")
        rule = script.at(step, phase, park=False, error=error, when=when)
    else:
        rule = script.at(step, phase, when=when)
    store = world.view()
    store.jobs_left = 1  # the faulty worker takes this one job, never a second time
    errors: list[PhaseError] = []
    world.tasks.on_unexpected_error = errors.append
    w1 = world.worker(
        store,
        "w1",
        step_hook=script,
        heartbeat_interval=BEAT if step is Step.HEARTBEAT else FOREVER,
        cancel_timeout=BUDGET if fault == "cancel" else None,
    )
    w1.start()
    try:
        if step is not Step.HEARTBEAT:  # there the beats recur, and the rule parks one
            first_beat_over(w1)
        background = inject(world, w1, store, rule, fault)
        if step is Step.HEARTBEAT and fault in ("stop", "exception"):
            world.release.set()  # the long job may now finish
        wait_until(lambda: w1.stats().settled == 1, "the faulty worker settles its claim")
        report = background() or stop_within_budget(w1)
    finally:
        script.open_all()
        world.release.set()

    # The faulty worker: one outcome for its one claim, and a death is never silent.
    assert w1.stats().claimed == 1
    assert w1.stats().settled == 1
    assert dict(report.outcomes).get(job_id, expect.outcome) is expect.outcome
    assert _outcome_of(w1) is expect.outcome
    assert bool(report.thread_failures) is expect.died
    assert report.elapsed < BUDGET + NOISE
    if fault == "exception" and not expect.died:
        assert [e.phase for e in errors] in ([Phase.ACK], [Phase.HEARTBEAT])

    # Right after the fault: finished or claimable again, attempts exact, fencing held.
    found = job(world, job_id)
    assert (found.state, found.attempts) == (expect.state, expect.attempts)
    assert_claimable_or_finished(world, job_id)
    assert_attempts_are_claims_minus_releases(world, job_id)
    assert_at_most_one_outcome_per_claim(world)
    if fault == "stall" and step is not Step.AFTER_COMMIT:
        assert rule.claim is not None
        assert world.ledger.accepted[rule.claim.token] == []  # nothing under a stale lease
    if step is Step.HEARTBEAT and fault in ("cancel", "stall"):
        assert world.holds == [(job_id, "w1", True)]  # the cancellation reached the job

    # A restart finishes everything: done, attempts exact, work repeated only where due.
    recover(world)
    found = job(world, job_id)
    assert (found.state, found.attempts) == (JobState.DONE, expect.final_attempts)
    assert len(world.runs) == expect.runs, world.runs
    assert_attempts_are_claims_minus_releases(world, job_id)
    assert_at_most_one_outcome_per_claim(world)


def _outcome_of(worker: Worker) -> Outcome:
    """The single outcome the worker recorded, read from its counters."""
    stats = worker.stats()
    counts = {
        Outcome.DONE: stats.done,
        Outcome.RETRIED: stats.retried,
        Outcome.FAILED: stats.failed,
        Outcome.RELEASED: stats.released,
        Outcome.LOST: stats.lost,
        Outcome.UNSETTLED: stats.unsettled,
    }
    [outcome] = [o for o, n in counts.items() if n]
    return outcome


# --- every kind of commit ------------------------------------------------------------------------


@dataclass(frozen=True)
class Commit:
    """A crash just before or just after one kind of settling store call.

    Attributes:
        payload, max_attempts: the job, chosen so the worker makes this kind of call.
        first: a fault applied at an earlier step to bring that call about, or None.
        before, after: (state, attempts) right after a crash before / after the call.
        final: (state, attempts, runs) once a recovery worker has run.
    """

    phase: Phase
    payload: str
    max_attempts: int
    first: tuple[Step, str] | None
    before: tuple[JobState, int]
    after: tuple[JobState, int]
    final_before: tuple[JobState, int, int]
    final_after: tuple[JobState, int, int]


COMMITS = {
    # A failure with attempts left: store.retry. The retry keeps the attempt.
    "retry": Commit(Phase.REQUEUE, "fail-once", 10, None, (_R, 1), (_Q, 1), (_D, 2, 2), (_D, 2, 2)),
    # A failure on the last attempt: store.fail. Crashing before it, the lease expires
    # with no attempt left, so the next claim fails the job instead of running it again.
    "fail": Commit(
        Phase.NACK,
        "fail",
        1,
        None,
        (_R, 1),
        (JobState.FAILED, 1),
        (JobState.FAILED, 1, 1),
        (JobState.FAILED, 1, 1),
    ),
    # An interrupted job (cancelled before its handler): store.release gives the attempt back.
    "release-interrupted": Commit(
        Phase.RELEASE,
        "plain",
        10,
        (Step.BEFORE_HANDLER, "cancel"),
        (_R, 1),
        (_Q, 0),
        (_D, 2, 1),
        (_D, 1, 1),
    ),
    # A claim handed off after the stop began: released without being started.
    "release-unstarted": Commit(
        Phase.RELEASE,
        "plain",
        10,
        (Step.AFTER_CLAIM, "stop"),
        (_R, 1),
        (_Q, 0),
        (_D, 2, 1),
        (_D, 1, 1),
    ),
}


@pytest.mark.parametrize("where", [Step.BEFORE_COMMIT, Step.AFTER_COMMIT], ids=["before", "after"])
@pytest.mark.parametrize("kind", list(COMMITS))
def test_a_crash_before_or_after_any_kind_of_commit_loses_no_job(
    world: World, kind: str, where: Step
) -> None:
    """A process dying on either side of any settling call leaves a job a restart finishes."""
    commit = COMMITS[kind]
    job_id = world.inner.enqueue("work", commit.payload, max_attempts=commit.max_attempts)
    script = Script()
    first = None if commit.first is None else script.at(commit.first[0])
    rule = script.at(where, commit.phase)
    store = world.view()
    store.jobs_left = 1
    fault = None if commit.first is None else commit.first[1]
    w1 = world.worker(
        store, "w1", step_hook=script, cancel_timeout=BUDGET if fault == "cancel" else None
    )
    w1.start()
    try:
        first_beat_over(w1)
        background: Callable[[], Any] = no_stop_running
        if first is not None and fault is not None:
            background = inject(world, w1, store, first, fault)
        inject(world, w1, store, rule, "crash")
        report = background() or stop_within_budget(w1)
    finally:
        script.open_all()
    assert len(report.thread_failures) == 1  # the crashed thread, reported

    state, attempts = commit.before if where is Step.BEFORE_COMMIT else commit.after
    found = job(world, job_id)
    assert (found.state, found.attempts) == (state, attempts)
    assert_claimable_or_finished(world, job_id)
    assert_attempts_are_claims_minus_releases(world, job_id)

    recover(world)
    final = commit.final_before if where is Step.BEFORE_COMMIT else commit.final_after
    found = job(world, job_id)
    assert (found.state, found.attempts, len(world.runs)) == final, world.runs
    if found.state is JobState.FAILED:
        expired = where is Step.BEFORE_COMMIT  # the lease expired on the last attempt
        assert found.last_error is not None
        assert ("lease expired" in found.last_error) is expired, found.last_error
    assert_at_most_one_outcome_per_claim(world)


# --- the harness itself, and a death it found ----------------------------------------------------


def test_the_step_hook_sees_every_boundary_of_a_jobs_life_in_order(world: World) -> None:
    """Claim, handler, commit, and heartbeats while the handler runs: every step is reached."""
    job_id = world.inner.enqueue("work", "hold")
    script = Script()
    w1 = world.worker(world.view(), "w1", step_hook=script, heartbeat_interval=BEAT)
    with w1:
        wait_until(lambda: (Step.HEARTBEAT, job_id, None) in script.trace, "a heartbeat")
        world.release.set()
        wait_until(lambda: w1.stats().done == 1, "the job is done")
    steps = [entry for entry in script.trace if entry[0] is not Step.HEARTBEAT]
    assert steps == [
        (Step.AFTER_CLAIM, job_id, None),
        (Step.BEFORE_HANDLER, job_id, None),
        (Step.AFTER_HANDLER, job_id, None),
        (Step.BEFORE_GROUP_COMMIT, job_id, Phase.ACK),
        (Step.BEFORE_COMMIT, job_id, Phase.ACK),
        (Step.AFTER_COMMIT, job_id, Phase.ACK),
    ]


def test_only_the_default_step_hook_is_skipped() -> None:
    """A worker given no hook has `no_step`, whose call the parts skip (`Shared.stepping`).

    Any hook given is called at every step, even one that does nothing (the test above).
    """
    store = MemoryStore()
    assert not fakes.shared(store, store.clock, lease=1.0, step=no_step).stepping
    assert fakes.shared(store, store.clock, lease=1.0, step=lambda *_: None).stepping


def test_a_heartbeat_thread_that_dies_is_reported_and_stops_the_worker(world: World) -> None:
    """A BaseException ending the heartbeat is a reported death and a stop, not a silent lapse.

    Here it comes from the store's ``renew`` itself (a hook's ``SystemExit`` is contained
    and logged, so it does not end the thread). Without the report nobody
    would know that leases had stopped being renewed, and other workers would soon take
    over jobs that are still running.
    """
    store = world.view()
    job_id = world.inner.enqueue("work", "hold")
    w1 = world.worker(store, "w1", heartbeat_interval=BEAT)
    w1.start()
    try:
        # Once the job runs: a death while the claim still waited for its handler thread
        # would release it unstarted, as any stop does.
        assert world.holding.wait(MUST_HAPPEN), "the job never started"
        store.fail_renew = SystemExit("renew gave up")
        assert w1.wait_stop_requested(MUST_HAPPEN)  # the death stopped the worker
    finally:
        world.release.set()
    report = stop_within_budget(w1)
    [failure] = report.thread_failures
    assert (failure.exc_type, failure.thread_name) == (SystemExit, "w1-heartbeat")
    assert job(world, job_id).state is JobState.DONE  # the running job drained
