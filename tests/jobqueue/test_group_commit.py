"""Group commit: the handler threads hand their outcomes to one settler thread.

The settler takes every outcome waiting and commits them in one `Store.settle_many`;
while a commit is in flight the next batch collects. These tests park the settler at
`Step.BEFORE_COMMIT` of one job (a `Gate` in the step hook) so that the outcomes of the
others pile up behind it, then check what the batch does: one transaction for all of
them, fencing for each on its own, hooks only after the commit, and every failure path
ending each job in exactly one outcome. The stores are real (`MemoryStore`, and a
SQLite file in the crash test); `BatchLog` only records each batch. Nothing sleeps.
"""

from __future__ import annotations

import signal
import textwrap
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from patterns.jobqueue.stores.memory import MemoryStore
from patterns.jobqueue.stores.postgres.store import CommitUnknown
from patterns.jobqueue.stores.records import Claim, JobState, Settlement
from patterns.jobqueue.stores.sqlite.store import SQLiteStore
from patterns.jobqueue.tasks import Phase, PhaseError, Retry, TaskRegistry
from patterns.jobqueue.worker.worker import Outcome, Step, Worker, WorkerState
from tests.support import (
    MUST_HAPPEN,
    NOISE,
    STAYS_BLOCKED,
    FakeClock,
    Gate,
    join_or_fail,
    run_in_thread,
    run_python,
    wait_until,
)

LEASE = 1_000.0  # fake seconds; only the test moves the fake clock past it
FOREVER = 600.0  # a poll or heartbeat interval no test sits out


class BatchLog(MemoryStore):
    """A memory store that records each `settle_many` batch and can make one raise.

    ``claims_left`` caps what the worker named ``w1`` may claim (so a job whose lease the
    test let expire is not claimed back by the worker itself); ``fail_batch`` is raised
    by the next batch of more than one item, after applying it when ``apply_first``.
    """

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.batches: list[list[int]] = []
        self.shared: list[tuple[list[int], int, list[int]]] = []
        self.claims_left = 1_000
        self.fail_batch: Exception | None = None
        self.apply_first = False

    def claim(self, owner: str, *, lease: float, limit: int = 1) -> list[Claim]:
        """Claim, at most ``claims_left`` jobs in all for the worker under test."""
        if owner == "w1":
            limit = min(limit, self.claims_left)
            if limit == 0:
                return []
        claims = super().claim(owner, lease=lease, limit=limit)
        if owner == "w1":
            self.claims_left -= len(claims)
        return claims

    def settle_and_claim(
        self, items: Sequence[Settlement], owner: str, *, lease: float, limit: int
    ) -> tuple[list[bool | Exception], list[Claim]]:
        """Record (job ids settled, limit, job ids claimed) of each shared transaction."""
        done, claims = super().settle_and_claim(items, owner, lease=lease, limit=limit)
        self.shared.append(
            ([item.claim.job.id for item in items], limit, [c.job.id for c in claims])
        )
        return done, claims

    def settle_many(self, items: Sequence[Settlement]) -> list[bool | Exception]:
        """Record the batch's job ids; raise ``fail_batch`` once for a batch of several."""
        self.batches.append([item.claim.job.id for item in items])
        error = self.fail_batch if len(items) > 1 else None
        if error is None:
            return super().settle_many(items)
        self.fail_batch = None
        if self.apply_first:
            super().settle_many(items)
        raise error


class ParkCommit:
    """A step hook that parks the committing thread at the first commit of one job."""

    def __init__(self) -> None:
        self.job_id: int | None = None
        self.thread: str | None = None  # the name of the thread it parked
        self.gate = Gate("the committing thread, before the first job's commit")

    def __call__(self, step: Step, claim: Claim, phase: Phase | None) -> None:
        """Park at ``BEFORE_COMMIT`` of ``job_id``, once."""
        if step is Step.BEFORE_COMMIT and claim.job.id == self.job_id:
            self.job_id = None
            self.thread = threading.current_thread().name
            self.gate.arrive()


class World:
    """A store, a registry whose ``work`` task waits for ``go`` unless told ``now``."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.store = BatchLog(self.clock)
        self.go = threading.Event()
        self.completed: list[int] = []  # on_complete, in order
        self.errors: list[PhaseError] = []
        self.tasks = TaskRegistry(
            on_complete=lambda job, result: self.completed.append(job.id),
            on_unexpected_error=self.errors.append,
        )
        self.tasks.task(name="work")(self._work)
        self.park = ParkCommit()
        self.workers: list[Worker] = []

    def _work(self, payload: str, ctx: Any) -> str:
        if payload != "now":
            assert self.go.wait(MUST_HAPPEN), "the test never let the job finish"
        return payload

    def worker(self, **options: Any) -> Worker:
        """A worker named w1 on the store, parked by ``park``, nothing timed but the stop."""
        settings: dict[str, Any] = {
            "concurrency": 4,
            "poll_interval": FOREVER,
            "heartbeat_interval": FOREVER,
            "lease": LEASE,
            "stop_timeout": MUST_HAPPEN,
            "name": "w1",
            "clock": self.clock,
            "step_hook": self.park,
        }
        settings.update(options)
        worker = Worker(self.store, self.tasks, **settings)
        self.workers.append(worker)
        return worker

    def first_then_three(self) -> tuple[int, list[int]]:
        """One job that ends at once (its commit parks the settler), then three that wait."""
        first = self.store.enqueue("work", "now")
        others = [self.store.enqueue("work", "wait") for _ in range(3)]
        self.park.job_id = first
        return first, others


@pytest.fixture
def world() -> Iterator[World]:
    """A world; every gate opened and every worker stopped at the end."""
    made = World()
    try:
        yield made
    finally:
        made.go.set()
        made.park.gate.open()
        for worker in made.workers:
            worker.stop(MUST_HAPPEN)


def pile_up_behind_the_first_commit(world: World, worker: Worker, count: int) -> None:
    """Wait until the settler is parked and ``count`` outcomes are handed over in all."""
    world.park.gate.wait_reached()
    world.go.set()
    wait_until(lambda: worker.stats().awaiting_commit == count, f"{count} outcomes handed over")


def test_outcomes_handed_over_while_a_commit_is_in_flight_share_the_next_commit(
    world: World,
) -> None:
    """The three outcomes that arrive during the first commit are committed together, once."""
    first, others = world.first_then_three()
    worker = world.worker().start()
    pile_up_behind_the_first_commit(world, worker, 4)
    assert world.completed == []  # no hook before its commit
    world.park.gate.open()
    wait_until(lambda: worker.stats().settled == 4, "four outcomes recorded")
    report = worker.stop()

    assert report.terminated
    assert world.store.batches[0] == [first]
    assert sorted(world.store.batches[1]) == others
    assert len(world.store.batches) == 2
    assert sorted(world.completed) == sorted([first, *others])
    assert [world.store.get(i).state for i in [first, *others]] == [JobState.DONE] * 4


def test_an_idle_queue_commits_a_single_outcome_at_once(world: World) -> None:
    """Nothing else waiting: the one outcome is committed alone, without any linger."""
    job_id = world.store.enqueue("work", "now")
    worker = world.worker().start()
    wait_until(lambda: worker.stats().done == 1, "the job done")
    worker.stop()
    assert world.store.batches == [[job_id]]
    assert world.completed == [job_id]


def test_a_stale_claim_in_a_batch_is_refused_alone_and_the_others_complete_with_their_hooks(
    world: World,
) -> None:
    """One job's lease is taken over mid-run: in the shared commit it alone is lost, no hook."""
    stale = world.store.enqueue("work", "wait", run_at=world.clock() - 10)  # oldest: taken first
    first, others = world.first_then_three()
    world.store.claims_left = 5
    worker = world.worker(concurrency=5).start()
    world.park.gate.wait_reached()
    world.clock.advance(LEASE + 1)  # every lease has expired; another claimer takes the oldest
    [taken] = world.store.claim("w2", lease=LEASE)
    assert taken.job.id == stale
    pile_up_behind_the_first_commit(world, worker, 5)
    world.park.gate.open()
    wait_until(lambda: worker.stats().settled == 5, "five outcomes recorded")
    report = worker.stop()

    assert sorted(world.store.batches[1]) == sorted([stale, *others])  # one batch, stale inside
    stats = worker.stats()
    assert (stats.done, stats.lost) == (4, 1)
    assert sorted(world.completed) == sorted([first, *others])  # no hook for the lost one
    assert world.store.get(stale).state is JobState.RUNNING  # the newer claim's, untouched
    assert world.store.complete(taken, "theirs")
    assert report.terminated


def test_a_job_between_hand_over_and_commit_is_still_running_and_its_commit_refills_its_slot(
    world: World,
) -> None:
    """Its outcome waits for its commit: still named; the slot it frees waits for that commit.

    The store shares one transaction between outcomes and claims (`settle_and_claim`), so
    the freed slot is the settler's to claim for: the next job runs only once the parked
    commit goes on, and is claimed by that same commit. Without prefetch, so that the one
    slot is the one thread's.
    """
    first = world.store.enqueue("work", "now")
    world.park.job_id = first
    worker = world.worker(concurrency=1, prefetch=0).start()
    world.park.gate.wait_reached()
    assert worker.running_jobs() == [first]  # handed over, not committed: still named
    assert (worker.stats().running, worker.stats().awaiting_commit) == (1, 1)
    second = world.store.enqueue("work", "now")
    worker.wake()
    watch_until = time.monotonic() + STAYS_BLOCKED  # how long we look; the gate holds it
    while time.monotonic() < watch_until:
        assert world.store.get(second).state is JobState.QUEUED, "claimed before the commit"
        time.sleep(0.005)
    assert world.store.get(first).state is JobState.RUNNING
    world.park.gate.open()
    wait_until(lambda: worker.stats().done == 2, "both done")
    assert worker.running_jobs() == []
    worker.stop()
    assert world.completed == [first, second]
    assert world.store.shared[0] == ([first], 1, [second])  # the commit claimed the next


def test_the_stop_commits_what_the_settler_holds_before_it_reports(world: World) -> None:
    """A stop while an outcome waits for its commit reports it done, not running."""
    job_id = world.store.enqueue("work", "now")
    world.park.job_id = job_id
    worker = world.worker().start()
    world.park.gate.wait_reached()
    stopper, stopped = run_in_thread(worker.stop, "stopper")
    wait_until(lambda: worker.state is not WorkerState.RUNNING, "the stop began")
    world.park.gate.open()
    join_or_fail(stopper)
    report = stopped["result"]
    assert report.terminated
    assert dict(report.outcomes) == {job_id: Outcome.DONE}
    assert report.still_running == ()
    assert world.completed == [job_id]


def test_a_stop_whose_settler_is_stuck_past_the_budget_names_the_job_and_keeps_its_budget(
    world: World,
) -> None:
    """A commit hanging in the settler at the deadline: the stop returns on time, jobs named."""
    first = world.store.enqueue("work", "now")
    other = world.store.enqueue("work", "wait")  # still running: the first goes to the settler
    world.park.job_id = first
    worker = world.worker().start()
    pile_up_behind_the_first_commit(world, worker, 2)  # the other's outcome waits behind it
    report = worker.stop(0.5)
    assert report.elapsed < 0.5 + NOISE
    assert not report.terminated
    assert report.still_running == (f"job {first}", f"job {other}")
    world.park.gate.open()  # the commits go on after the report, and are recorded
    wait_until(lambda: worker.stats().done == 2, "the late commits recorded")


def test_a_stop_whose_led_commit_is_stuck_names_the_job_and_the_thread_committing_it(
    world: World,
) -> None:
    """The last job in hand is committed by its own handler thread: stuck, both are named."""
    job_id = world.store.enqueue("work", "now")
    world.park.job_id = job_id
    worker = world.worker().start()
    world.park.gate.wait_reached()
    assert world.park.thread is not None
    assert world.park.thread.startswith("w1-job")  # a handler thread, not the settler
    report = worker.stop(0.5)
    assert report.elapsed < 0.5 + NOISE
    assert not report.terminated
    assert report.still_running == (f"job {job_id}", world.park.thread)
    world.park.gate.open()  # the commit goes on after the report, and is recorded
    wait_until(lambda: worker.stats().done == 1, "the late commit recorded")


def test_a_group_commit_that_raises_commits_each_outcome_on_its_own(world: World) -> None:
    """A failed transaction of several outcomes: each is committed alone; one error reported."""
    first, others = world.first_then_three()
    world.store.fail_batch = RuntimeError("the transaction failed (injected)")
    worker = world.worker().start()
    pile_up_behind_the_first_commit(world, worker, 4)
    world.park.gate.open()
    wait_until(lambda: worker.stats().settled == 4, "four outcomes recorded")
    worker.stop()

    assert worker.stats().done == 4
    assert world.store.batches[2:] == [[i] for i in world.store.batches[1]]  # then one by one
    [error] = world.errors
    assert error.phase is Phase.ACK
    assert error.job is not None
    assert error.job.id == world.store.batches[1][0]
    assert sorted(world.completed) == sorted([first, *others])


def test_a_group_commit_whose_outcome_is_unknown_sends_each_job_to_its_fallback(
    world: World,
) -> None:
    """CommitUnknown for several outcomes: each takes its own fallback, refused: unknown."""
    _, others = world.first_then_three()
    world.store.fail_batch = CommitUnknown("connection lost during COMMIT (injected)")
    world.store.apply_first = True  # it did commit; the reply was lost
    worker = world.worker().start()
    pile_up_behind_the_first_commit(world, worker, 4)
    world.park.gate.open()
    wait_until(lambda: worker.stats().settled == 4, "four outcomes recorded")
    worker.stop()

    stats = worker.stats()
    assert (stats.done, stats.unknown) == (1, 3)
    assert [e.phase for e in world.errors] == [Phase.ACK] * 3
    assert [world.store.get(i).state for i in others] == [JobState.DONE] * 3  # it did apply


def test_after_the_settler_died_each_handler_thread_commits_its_own_outcome(
    world: World,
) -> None:
    """A SystemExit that ends the settler: the next outcome is still committed.

    (A hook's SystemExit is contained and logged; the settler dies here of its own step.)
    """
    first = world.store.enqueue("work", "now")
    second = world.store.enqueue("work", "wait")

    def exits_once(step: Step, claim: Claim, phase: Phase | None) -> None:
        world.park(step, claim, phase)
        if step is Step.AFTER_COMMIT and claim.job.id == first:
            raise SystemExit("the settler gave up")

    worker = world.worker(concurrency=2, step_hook=exits_once).start()
    assert worker.wait_stop_requested(MUST_HAPPEN)  # the settler's death stopped the worker
    world.go.set()
    report = worker.stop()
    [failure] = report.thread_failures
    assert failure.thread_name == "w1-settler"
    assert dict(report.outcomes) == {second: Outcome.DONE}
    assert [world.store.get(i).state for i in (first, second)] == [JobState.DONE] * 2
    assert report.terminated


# --- a process killed between the handler's end and the group commit --------------------------

CHILD = r"""
import os, signal, sys
from patterns.jobqueue.stores.sqlite.store import SQLiteStore
from patterns.jobqueue.tasks import TaskRegistry
from patterns.jobqueue.worker.worker import Step, Worker

db, effects = sys.argv[1], sys.argv[2]
tasks = TaskRegistry()

@tasks.task(name="work")
def work(payload, ctx):
    with open(effects, "a") as f:
        f.write(f"{ctx.job_id} {ctx.attempt}\n")

def die_before_the_group_commit(step, claim, phase):
    if step is Step.BEFORE_GROUP_COMMIT:
        os.kill(os.getpid(), signal.SIGKILL)

Worker(SQLiteStore(db), tasks, lease=0.5, step_hook=die_before_the_group_commit).run()
"""


def test_a_process_killed_between_handler_end_and_group_commit_runs_the_job_again(
    tmp_path: Path,
) -> None:
    """SIGKILL once the effect is done but before its commit: nothing lost, the effect twice."""
    db, effects = tmp_path / "q.db", tmp_path / "effects"
    store = SQLiteStore(db)
    try:
        job_id = store.enqueue("work")
        child = run_python(textwrap.dedent(CHILD), str(db), str(effects))
        assert child.returncode == -signal.SIGKILL, child.stderr
        job = store.get(job_id)
        assert job is not None
        assert (job.state, job.attempts) == (JobState.RUNNING, 1)  # leased, never lost
        assert effects.read_text().splitlines() == [f"{job_id} 1"]

        tasks = TaskRegistry()
        tasks.task(name="work")(lambda payload, ctx: _append(effects, ctx))
        restart = Worker(store, tasks, lease=0.5, poll_interval=0.05, exit_when_empty=True)
        thread, outcome = run_in_thread(restart.run, "restart")
        join_or_fail(thread)
        assert outcome["result"].terminated
        job = store.get(job_id)
        assert job is not None
        assert (job.state, job.attempts) == (JobState.DONE, 2)
        # At least once: the effect was done again (a duplicate), and recorded once.
        assert effects.read_text().splitlines() == [f"{job_id} 1", f"{job_id} 2"]
    finally:
        store.close()


def _append(path: Path, ctx: Any) -> None:
    with path.open("a") as f:
        f.write(f"{ctx.job_id} {ctx.attempt}\n")


class StaleNextDue(BatchLog):
    """Its ``next_due`` can park at a gate once, returning what it read before parking."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.armed = False
        self.gate = Gate("the claimer, holding a next_due read before the commit")

    def next_due(self) -> float | None:
        """Read, then park (when armed), then return the value read."""
        value = super().next_due()
        if self.armed:
            self.armed = False
            self.gate.arrive()
        return value


def test_exit_when_empty_never_exits_on_a_queue_read_taken_before_its_own_commit() -> None:
    """A retry committed between the idle check's two store reads is still seen, and run.

    The claimer reads ``next_due`` (the job is leased: due only at lease expiry), the
    settler then commits the retry (due now), and the claimer reads ``running`` (none):
    deciding "empty" from those two reads would leave the retried job behind. Two slots:
    the claimer has a free one to look with while the handler's slot is the settler's.
    """
    world = World()
    store = world.store = StaleNextDue(world.clock)
    runs: list[int] = []

    @world.tasks.task(name="flaky", retry=lambda job, error: Retry(0.0))
    def flaky(payload: Any, ctx: Any) -> None:
        runs.append(ctx.attempt)
        if ctx.attempt == 1:
            raise ValueError("first attempt fails")

    job_id = store.enqueue("flaky")
    world.park.job_id = job_id
    worker = world.worker(concurrency=2, exit_when_empty=True)
    store.armed = True  # the claimer's first idle check: after the claim, before the commit
    thread, outcome = run_in_thread(worker.run, "worker-main")
    try:
        store.gate.wait_reached()
        world.park.gate.wait_reached()
        world.park.gate.open()
        wait_until(lambda: worker.stats().retried == 1, "the retry committed")
        store.gate.open()
        join_or_fail(thread)
    finally:
        store.gate.open()
        world.park.gate.open()
        worker.stop(MUST_HAPPEN)
    assert outcome["result"].terminated
    assert runs == [1, 2]
    assert store.get(job_id).state is JobState.DONE


class RenewLog(BatchLog):
    """Records the job id of every lease renewal."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.renewed: list[int] = []

    def renew(self, claim: Claim, *, lease: float) -> Claim | None:
        """Renew and record."""
        renewed = super().renew(claim, lease=lease)
        self.renewed.append(claim.job.id)
        return renewed


def test_the_heartbeat_renews_an_outcome_waiting_for_the_group_commit() -> None:
    """An outcome queued behind a slow commit keeps its lease: the heartbeat renews it."""
    world = World()
    store = world.store = RenewLog(world.clock)
    _, others = world.first_then_three()
    worker = world.worker(heartbeat_interval=0.01).start()
    try:
        pile_up_behind_the_first_commit(world, worker, 4)
        renewals = len(store.renewed)
        wait_until(lambda: set(others) <= set(store.renewed[renewals:]), "renewed while queued")
        world.park.gate.open()
        wait_until(lambda: worker.stats().done == 4, "all four done")
    finally:
        world.go.set()
        world.park.gate.open()
        report = worker.stop(MUST_HAPPEN)
    assert report.terminated
