"""The worker's prefetch: extra claims held, renewed, released unchanged, or lost before they start.

Every test runs the real `Worker` on a real `MemoryStore` seen through `ClaimLogStore`, the
recording store of ``test_worker`` plus a log of every claim (limit asked, jobs taken) and
every renewal. Time in the store is a `FakeClock` moved by the test; handlers park at a
`Gate` per job, so which claims are waiting (handed off, not started) is always known.
The fairness tests at the end run two workers on one real SQLite file, at the defaults.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from patterns.jobqueue.stores.records import Claim, JobState
from patterns.jobqueue.stores.sqlite.store import SQLiteStore
from patterns.jobqueue.tasks import JobContext, TaskRegistry
from patterns.jobqueue.worker.options import MAX_THREADS, check_counts
from patterns.jobqueue.worker.worker import Outcome, Worker, WorkerReport
from tests.jobqueue.test_worker import (
    FakeClock,
    RecordingStore,
    assert_one_outcome_per_claim,
    make_worker,
    running,
)
from tests.support import (
    MUST_HAPPEN,
    Gate,
    join_or_fail,
    run_in_thread,
    stays_blocked,
    wait_until,
)

LEASE = 1_000.0  # fake seconds: longer than the FOREVER heartbeat of make_worker
HEARTBEAT = 0.01  # real seconds between heartbeat rounds; the store's time is the fake clock


class ClaimLogStore(RecordingStore):
    """`RecordingStore` that also logs each claim and each renewal, and lets a test wait on them."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        # Notified by the worker's threads after each logged claim or renewal; waited on by
        # the test (wait_for). Guards both logs.
        self.changed = threading.Condition()
        self.claim_log: list[tuple[int, list[int]]] = []  # (limit asked, job ids taken)
        self.renew_log: list[tuple[int, Claim | None]] = []  # (job id, renewed claim or None)

    def claim(self, owner: str, *, lease: float, limit: int = 1) -> list[Claim]:
        """Log the limit asked and the jobs taken by one claim transaction."""
        claims = super().claim(owner, lease=lease, limit=limit)
        with self.changed:
            self.claim_log.append((limit, [c.job.id for c in claims]))
            self.changed.notify_all()
        return claims

    def renew(self, claim: Claim, *, lease: float) -> Claim | None:
        """Log which job's lease was renewed, and the result."""
        renewed = super().renew(claim, lease=lease)
        with self.changed:
            self.renew_log.append((claim.job.id, renewed))
            self.changed.notify_all()
        return renewed

    def wait_for(self, predicate: Callable[[], bool], what: str) -> None:
        """Block until ``predicate`` (called with the logs' lock held) holds."""
        with self.changed:
            assert self.changed.wait_for(predicate, MUST_HAPPEN), f"never happened: {what}"


class Parking:
    """A task ``park`` whose handler records its payload and waits at that payload's gate."""

    def __init__(self, store: ClaimLogStore, count: int, **enqueue: Any) -> None:
        self.gates = {n: Gate(f"job {n}") for n in range(1, count + 1)}
        self.ran: list[int] = []  # payloads whose handler started, in order
        self.tasks = TaskRegistry()
        self.tasks.task(name="park")(self._handler)
        self.ids = {n: store.enqueue("park", n, **enqueue) for n in self.gates}

    def _handler(self, payload: int, ctx: JobContext) -> None:
        self.ran.append(payload)
        self.gates[payload].arrive()


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock shared by the store and the worker."""
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> ClaimLogStore:
    """A claim-logging recording store on a memory store with the fake clock."""
    return ClaimLogStore(clock)


def heartbeating_worker(
    store: ClaimLogStore, jobs: Parking, clock: FakeClock, *, prefetch: int
) -> Worker:
    """One handler thread, ``prefetch`` extra claims, and a heartbeat every ``HEARTBEAT``."""
    return make_worker(
        store,
        jobs.tasks,
        clock,
        concurrency=1,
        prefetch=prefetch,
        lease=LEASE,
        heartbeat_interval=HEARTBEAT,
    )


def test_prefetch_holds_the_extra_claims_taken_in_one_transaction_while_the_handler_is_busy(
    store: ClaimLogStore, clock: FakeClock
) -> None:
    """With one handler thread and prefetch=2, one claim takes three jobs and holds all three."""
    jobs = Parking(store, 3)
    start = clock()
    worker = make_worker(store, jobs.tasks, clock, concurrency=1, prefetch=2, lease=LEASE)
    with running(worker, *jobs.gates.values()):
        jobs.gates[1].wait_reached()
        assert store.claim_log == [(3, [jobs.ids[1], jobs.ids[2], jobs.ids[3]])]
        for n in (2, 3):
            job = store.get(jobs.ids[n])
            assert job.state is JobState.RUNNING
            assert job.lease_owner.startswith("w1:")
            assert job.lease_until == start + LEASE
            assert job.attempts == 1
        assert worker.running_jobs() == [jobs.ids[1]]
        assert jobs.ran == [1]
        for gate in jobs.gates.values():
            gate.open()
        wait_until(lambda: worker.stats().done == 3, "all three jobs done")
    assert jobs.ran == [1, 2, 3]
    assert all(taken == [] for _, taken in store.claim_log[1:])  # nothing else was due


def test_the_heartbeat_renews_waiting_claims_so_no_other_client_can_take_them(
    store: ClaimLogStore, clock: FakeClock
) -> None:
    """Claims handed off but not started keep their lease past its first expiry."""
    jobs = Parking(store, 3)
    start = clock()
    waiting = {jobs.ids[2], jobs.ids[3]}
    worker = heartbeating_worker(store, jobs, clock, prefetch=2)
    with running(worker, *jobs.gates.values()):
        jobs.gates[1].wait_reached()
        clock.advance(20.0)
        renewed_at = start + 20.0 + LEASE
        store.wait_for(
            lambda: (
                waiting
                <= {i for i, c in store.renew_log if c is not None and c.lease_until >= renewed_at}
            ),
            "the waiting claims renewed after the clock moved",
        )
        clock.advance(20.0)  # past the original lease of every claim
        assert store.inner.claim("intruder", lease=LEASE, limit=10) == []
        for job_id in waiting:
            job = store.get(job_id)
            assert (job.state, job.attempts) == (JobState.RUNNING, 1)
            assert job.lease_owner.startswith("w1:")
            assert job.lease_until > clock()
        for gate in jobs.gates.values():
            gate.open()
        wait_until(lambda: worker.stats().done == 3, "all three jobs done")
    assert jobs.ran == [1, 2, 3]
    assert_one_outcome_per_claim(store)


def test_stop_releases_waiting_claims_unchanged_and_never_runs_them(
    store: ClaimLogStore, clock: FakeClock
) -> None:
    """A stop gives waiting claims back: queued, attempt returned, run_at kept, never run."""
    jobs = Parking(store, 3, run_at=clock() - 100.0)
    before = {n: store.get(jobs.ids[n]) for n in (2, 3)}
    worker = heartbeating_worker(store, jobs, clock, prefetch=2)
    with running(worker, *jobs.gates.values()):
        jobs.gates[1].wait_reached()
        clock.advance(10.0)
        renewed_at = clock() + LEASE
        store.wait_for(  # the release must use the heartbeat's renewed claims too
            lambda: (
                {jobs.ids[2], jobs.ids[3]}
                <= {i for i, c in store.renew_log if c is not None and c.lease_until >= renewed_at}
            ),
            "the waiting claims renewed",
        )
        worker.request_stop("test")  # releases the waiting claims before it returns
        for n, old in before.items():
            job = store.get(jobs.ids[n])
            assert (job.state, job.attempts, job.run_at) == (JobState.QUEUED, 0, old.run_at)
            assert (job.lease_owner, job.lease_until) == (None, None)
        assert jobs.ran == [1]
        jobs.gates[1].open()
        report = worker.stop(MUST_HAPPEN)
    assert report.terminated
    assert dict(report.outcomes) == {
        jobs.ids[1]: Outcome.DONE,
        jobs.ids[2]: Outcome.RELEASED,
        jobs.ids[3]: Outcome.RELEASED,
    }
    assert report.released == (jobs.ids[2], jobs.ids[3])
    assert jobs.ran == [1]
    assert_one_outcome_per_claim(store)


def stop_requested_elsewhere(
    store: ClaimLogStore, jobs: Parking, worker: Worker
) -> tuple[Gate, threading.Thread]:
    """Job 1 running, 2 and 3 waiting; another thread's request_stop parked in a release."""
    jobs.gates[1].wait_reached()
    store.wait_for(lambda: len(store.claim_log) == 1, "one claim of three jobs")
    releasing = Gate("request_stop's first release")
    store.park["release"] = releasing
    thread, _ = run_in_thread(lambda: worker.request_stop("signal"), "signal-handler")
    releasing.wait_reached()
    jobs.gates[1].open()  # job 1 may finish: the drain has nothing else to wait for
    wait_until(lambda: worker.stats().done == 1, "job 1 done")
    return releasing, thread


def test_a_stop_never_reports_before_another_threads_release_of_prefetched_claims_returned(
    store: ClaimLogStore, clock: FakeClock
) -> None:
    """A release still in flight at the deadline is named in the report, never silently late."""
    jobs = Parking(store, 3)
    worker = make_worker(store, jobs.tasks, clock, concurrency=1, prefetch=2, lease=LEASE)
    with running(worker, *jobs.gates.values()):
        releasing, signal_handler = stop_requested_elsewhere(store, jobs, worker)
        report = worker.stop(0.5)  # the release is parked for the whole budget
        releasing.open()
        join_or_fail(signal_handler)
    assert not report.terminated
    assert report.still_held_ids == (jobs.ids[2], jobs.ids[3])
    assert dict(report.outcomes) == {jobs.ids[1]: Outcome.DONE}


def test_a_stop_waits_for_another_threads_release_of_prefetched_claims_within_its_budget(
    store: ClaimLogStore, clock: FakeClock
) -> None:
    """The STOPPED report is final: the prefetched claims are released before stop() returns."""
    jobs = Parking(store, 3)
    worker = make_worker(store, jobs.tasks, clock, concurrency=1, prefetch=2, lease=LEASE)
    with running(worker, *jobs.gates.values()):
        releasing, signal_handler = stop_requested_elsewhere(store, jobs, worker)
        stopper, stopped = run_in_thread(lambda: worker.stop(MUST_HAPPEN), "stopper")
        assert stays_blocked(stopper)  # waiting for the release, not reporting without it
        releasing.open()
        join_or_fail(stopper)
        join_or_fail(signal_handler)
    report: WorkerReport = stopped["result"]
    assert report.terminated
    assert report.still_held_ids == ()
    assert dict(report.outcomes) == {
        jobs.ids[1]: Outcome.DONE,
        jobs.ids[2]: Outcome.RELEASED,
        jobs.ids[3]: Outcome.RELEASED,
    }
    assert [store.get(jobs.ids[n]).state for n in (2, 3)] == [JobState.QUEUED] * 2
    assert_one_outcome_per_claim(store)


@pytest.mark.parametrize("settled_by", ["a free handler", "the stop"])
def test_a_waiting_claim_taken_over_is_never_run_and_is_lost_while_the_new_claimer_completes_it(
    store: ClaimLogStore, clock: FakeClock, settled_by: str
) -> None:
    """Once the heartbeat finds a waiting claim's lease taken over, the job is lost, not run."""
    jobs = Parking(store, 2)
    first, second = jobs.ids[1], jobs.ids[2]
    worker = heartbeating_worker(store, jobs, clock, prefetch=1)
    with running(worker, *jobs.gates.values()):
        jobs.gates[1].wait_reached()
        assert store.claim_log == [(2, [first, second])]
        held = Gate("heartbeat held before a renewal")
        store.park["renew"] = held  # no renewal between the expiry and the takeover
        held.wait_reached()
        clock.advance(LEASE + 1.0)
        takeover = {c.job.id: c for c in store.inner.claim("intruder", lease=LEASE, limit=10)}
        assert set(takeover) == {first, second}
        with store.changed:
            mark = len(store.renew_log)
        held.open()

        def lost_then_next_round() -> bool:
            # A renewal after the one that found the second job lost is from the next
            # round, so the round that marked it lost has finished.
            log = store.renew_log[mark:]
            found = [k for k, (i, c) in enumerate(log) if i == second and c is None]
            return bool(found) and len(log) > found[0] + 1

        store.wait_for(lost_then_next_round, "the heartbeat found the second lease lost")
        if settled_by == "the stop":
            worker.request_stop("test")
        jobs.gates[1].open()
        wait_until(lambda: worker.stats().lost == 2, "both jobs settled as lost")
        report = worker.stop(MUST_HAPPEN)
    assert jobs.ran == [1]  # the second job's handler never started
    stats = worker.stats()
    assert (stats.lost, stats.done, stats.released) == (2, 0, 0)
    if settled_by == "the stop":
        assert dict(report.outcomes) == {first: Outcome.LOST, second: Outcome.LOST}
    job = store.get(second)
    assert (job.state, job.lease_owner, job.attempts) == (
        JobState.RUNNING,
        takeover[second].token,
        2,
    )
    assert all(accepted == [] for accepted in store.accepted.values())  # the worker wrote nothing
    assert store.inner.complete(takeover[second])
    assert store.get(second).state is JobState.DONE


def test_without_prefetch_the_worker_never_claims_more_than_its_free_handler_threads(
    store: ClaimLogStore, clock: FakeClock
) -> None:
    """With prefetch=0 each claim asks for the free handler threads only, and holds no extra."""
    jobs = Parking(store, 4)
    worker = make_worker(store, jobs.tasks, clock, concurrency=2, prefetch=0, lease=LEASE)
    with running(worker, *jobs.gates.values()):
        jobs.gates[1].wait_reached()
        jobs.gates[2].wait_reached()
        assert store.claim_log == [(2, [jobs.ids[1], jobs.ids[2]])]
        assert store.counts()["running"] == 2
        assert store.counts()["queued"] == 2
        jobs.gates[1].open()
        jobs.gates[3].wait_reached()
        assert store.claim_log[1] == (1, [jobs.ids[3]])
        assert store.counts()["running"] == 2
        assert store.get(jobs.ids[4]).state is JobState.QUEUED
        for gate in jobs.gates.values():
            gate.open()
        wait_until(lambda: worker.stats().done == 4, "all four jobs done")
    assert all(limit <= 2 for limit, _ in store.claim_log)
    assert sorted(jobs.ran) == [1, 2, 3, 4]


@pytest.mark.parametrize("concurrency", [1, 3])
def test_by_default_the_first_claim_takes_four_waiting_jobs_behind_each_handler_thread(
    store: ClaimLogStore, clock: FakeClock, concurrency: int
) -> None:
    """No prefetch argument: prefetch is four per thread, so one transaction claims 5x."""
    jobs = Parking(store, 6 * concurrency)
    worker = make_worker(store, jobs.tasks, clock, concurrency=concurrency, lease=LEASE)
    with running(worker, *jobs.gates.values()):
        for n in range(1, concurrency + 1):
            jobs.gates[n].wait_reached()
        held = [jobs.ids[n] for n in range(1, 5 * concurrency + 1)]
        assert store.claim_log == [(5 * concurrency, held)]
        assert [store.get(i).state for i in held] == [JobState.RUNNING] * (5 * concurrency)
        assert store.counts()["queued"] == concurrency
        assert sorted(worker.running_jobs()) == held[:concurrency]  # the others wait
        for gate in jobs.gates.values():
            gate.open()
        wait_until(lambda: worker.stats().done == 6 * concurrency, "every job done")
    assert sorted(jobs.ran) == list(range(1, 6 * concurrency + 1))
    assert all(limit <= 5 * concurrency for limit, _ in store.claim_log)
    assert_one_outcome_per_claim(store)


def test_by_default_a_stop_releases_the_waiting_claims_at_once_unchanged(
    store: ClaimLogStore, clock: FakeClock
) -> None:
    """No prefetch argument, two threads busy: the stop gives the two waiting jobs back.

    ``request_stop`` returns only once they are released: queued again, the attempt the
    claim spent given back, ``run_at`` kept, never run, while the running jobs go on.
    """
    jobs = Parking(store, 4, run_at=clock() - 100.0)
    waiting = [jobs.ids[3], jobs.ids[4]]
    before = {job_id: store.get(job_id) for job_id in waiting}
    worker = make_worker(store, jobs.tasks, clock, concurrency=2, lease=LEASE)
    with running(worker, *jobs.gates.values()):
        jobs.gates[1].wait_reached()
        jobs.gates[2].wait_reached()
        for job_id in waiting:
            assert (store.get(job_id).state, store.get(job_id).attempts) == (JobState.RUNNING, 1)
        worker.request_stop("test")
        for job_id, old in before.items():
            job = store.get(job_id)
            assert (job.state, job.attempts, job.run_at) == (JobState.QUEUED, 0, old.run_at)
            assert (job.lease_owner, job.lease_until) == (None, None)
        assert worker.running_jobs() == [jobs.ids[1], jobs.ids[2]]
        jobs.gates[1].open()
        jobs.gates[2].open()
        report = worker.stop(MUST_HAPPEN)
    assert report.terminated
    assert dict(report.outcomes) == {
        jobs.ids[1]: Outcome.DONE,
        jobs.ids[2]: Outcome.DONE,
        jobs.ids[3]: Outcome.RELEASED,
        jobs.ids[4]: Outcome.RELEASED,
    }
    assert report.released == tuple(waiting)
    assert sorted(jobs.ran) == [1, 2]
    assert_one_outcome_per_claim(store)


@pytest.mark.parametrize(("concurrency", "default"), [(1, 4), (4, 16), (MAX_THREADS, MAX_THREADS)])
def test_the_default_prefetch_is_four_per_handler_thread_within_the_limit(
    concurrency: int, default: int
) -> None:
    """None means four claims waiting per thread, never more than the limit on counts."""
    assert check_counts(concurrency, None) == default
    assert check_counts(concurrency, 0) == 0


@pytest.mark.parametrize("prefetch", [-1, -5])
def test_a_negative_prefetch_is_refused_with_an_error_naming_it(
    store: ClaimLogStore, prefetch: int
) -> None:
    """A negative prefetch raises ValueError that names the setting and the value."""
    with pytest.raises(ValueError, match=rf"prefetch.*{prefetch}"):
        Worker(store, TaskRegistry(), prefetch=prefetch)


# --- fairness: two workers at the defaults on one SQLite file ---------------------------------


class LoggedSQLite(SQLiteStore):
    """An SQLite store that logs the jobs each claim took (the claimer's and the settler's)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.changed = threading.Condition()
        self.taken: list[list[int]] = []  # job ids, one list per claim that found jobs

    def claim(self, owner: str, *, lease: float, limit: int = 1) -> list[Claim]:
        """Log the jobs taken, if any."""
        claims = super().claim(owner, lease=lease, limit=limit)
        with self.changed:
            self.taken.append([c.job.id for c in claims])
            self.changed.notify_all()
        return claims

    def wait_for_claims(self, count: int) -> None:
        """Block until ``count`` claims (any, empty ones included) have returned."""
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.taken) >= count, MUST_HAPPEN)


class TwoWorkers:
    """``count`` parked jobs on one SQLite file; workers A and B each on their own connection."""

    def __init__(self, tmp_path: Path, count: int) -> None:
        self.path = tmp_path / "q.db"
        self.gates = {n: Gate(f"job {n}") for n in range(1, count + 1)}
        self.ran_by: dict[int, list[str]] = {n: [] for n in self.gates}  # payload -> workers
        self.tasks = TaskRegistry()
        self.tasks.task(name="park")(self._handler)
        filler = SQLiteStore(self.path)
        self.ids = dict(
            zip(
                self.gates,
                filler.enqueue_many([{"task": "park", "payload": n} for n in self.gates]),
                strict=True,
            )
        )
        filler.close()
        self.stores: dict[str, LoggedSQLite] = {}
        self.workers: dict[str, Worker] = {}

    def _handler(self, payload: int, ctx: JobContext) -> None:
        self.ran_by[payload].append(ctx.worker)
        self.gates[payload].arrive()

    def start(self, name: str, **options: Any) -> LoggedSQLite:
        """Start worker ``name`` (two threads, the rest at the defaults but the lease)."""
        store = self.stores[name] = LoggedSQLite(self.path)
        worker = Worker(store, self.tasks, concurrency=2, name=name, lease=LEASE, **options)
        self.workers[name] = worker.start()
        return store

    def ids_of(self, *payloads: int) -> list[int]:
        """The job ids of these payloads."""
        return [self.ids[n] for n in payloads]

    def finish(self) -> dict[str, WorkerReport]:
        """Open every gate, wait until every job is done, stop both workers, close the stores."""
        for gate in self.gates.values():
            gate.open()
        wait_until(
            lambda: sum(w.stats().done for w in self.workers.values()) == len(self.gates),
            "every job done",
        )
        reports = {name: worker.stop(MUST_HAPPEN) for name, worker in self.workers.items()}
        for store in self.stores.values():
            store.close()
        return reports


@pytest.fixture
def two(tmp_path: Path) -> Any:
    """24 parked jobs on one file; every gate opened and every worker stopped at the end."""
    made = TwoWorkers(tmp_path, 24)
    yield made
    for gate in made.gates.values():
        gate.open()
    for worker in made.workers.values():
        worker.stop(MUST_HAPPEN)
    for store in made.stores.values():
        store.close()


def test_two_workers_at_the_defaults_on_one_file_both_get_work_from_a_backlog(
    two: TwoWorkers,
) -> None:
    """A busy worker holds its threads' jobs and four each waiting: the backlog beyond is B's.

    A (two threads, default prefetch eight) claims the ten oldest jobs in one transaction
    and parks on the first two; B, started next, claims the next ten and parks on two of
    them: neither starves. Every job runs once, each by the worker that claimed it.
    """
    a = two.start("A")
    two.gates[1].wait_reached()
    two.gates[2].wait_reached()
    assert a.taken[0] == two.ids_of(*range(1, 11))
    b = two.start("B")
    two.gates[11].wait_reached()
    two.gates[12].wait_reached()
    assert b.taken[0] == two.ids_of(*range(11, 21))  # A's waiting jobs are leased: B skips them
    assert b.counts()["queued"] == 4  # nothing else claimed
    reports = two.finish()
    assert all(report.terminated for report in reports.values())
    assert [len(workers) for workers in two.ran_by.values()] == [1] * 24  # each job once
    ran_by_a = {n for n, workers in two.ran_by.items() if workers == ["A"]}
    ran_by_b = {n for n, workers in two.ran_by.items() if workers == ["B"]}
    assert set(range(1, 11)) <= ran_by_a
    assert set(range(11, 21)) <= ran_by_b
    assert two.workers["A"].stats().done == len(ran_by_a)
    assert two.workers["B"].stats().done == len(ran_by_b)


@pytest.mark.parametrize("prefetch", [None, 0], ids=["default", "prefetch=0"])
def test_the_cost_a_job_waiting_behind_a_busy_worker_is_not_taken_by_an_idle_one(
    tmp_path: Path, prefetch: int | None
) -> None:
    """Four jobs, A's two threads busy: with the default prefetch, jobs 3 and 4 wait for A.

    B, idle, claims nothing: A holds them, leased. With ``prefetch=0`` A claims only for its
    two threads and B takes jobs 3 and 4 at once. This is the price of the default that
    Worker's docstring states.
    """
    two = TwoWorkers(tmp_path, 4)
    chosen = {} if prefetch is None else {"prefetch": prefetch}
    try:
        a = two.start("A", **chosen)
        two.gates[1].wait_reached()
        two.gates[2].wait_reached()
        b = two.start("B", **chosen)
        b.wait_for_claims(1)
        if prefetch is None:
            assert a.taken[0] == two.ids_of(1, 2, 3, 4)
            assert b.taken[0] == []  # everything due is A's
            assert two.workers["B"].running_jobs() == []
        else:
            assert a.taken[0] == two.ids_of(1, 2)
            assert b.taken[0] == two.ids_of(3, 4)
            two.gates[3].wait_reached()
            two.gates[4].wait_reached()
        reports = two.finish()
    finally:
        for gate in two.gates.values():
            gate.open()
        for worker in two.workers.values():
            worker.stop(MUST_HAPPEN)
    assert all(report.terminated for report in reports.values())
    waiting_ran_by = [two.ran_by[3], two.ran_by[4]]
    assert waiting_ran_by == ([["A"], ["A"]] if prefetch is None else [["B"], ["B"]])
