"""The Store contract: one suite, run against every store, with a clock the test moves.

PostgresStore takes its time from the database's ``now()``; given a clock, the same SQL
reads that clock through the same parameter instead, so these tests run the production
statements. What only the database clock can show (skewed machines, leases expiring in
real time across processes) is in test_postgres.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from patterns.jobqueue.stores.checks import backoff
from patterns.jobqueue.stores.memory import MemoryStore
from patterns.jobqueue.stores.postgres.store import PostgresStore
from patterns.jobqueue.stores.protocol import Store
from patterns.jobqueue.stores.records import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_PAYLOAD_BYTES,
    MAX_ATTEMPTS_LIMIT,
    MAX_ERROR_CHARS,
    CancelResult,
    Claim,
    Job,
    JobState,
)
from patterns.jobqueue.stores.sqlite.store import SQLiteStore
from tests.support import MUST_HAPPEN, FakeClock, join_or_fail, run_in_thread

START = 1_000_000.0  # the fake clock's first reading (seconds since the epoch)
LEASE = 30.0


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock starting at START, shared by the store and the test."""
    return FakeClock()


StoreFactory = Callable[..., Store]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def make_store(
    request: pytest.FixtureRequest, clock: FakeClock, tmp_path: Path
) -> Iterator[StoreFactory]:
    """Builds each store under test on the fake clock (keywords passed on); closes them after."""
    made: list[Store] = []

    def make(**kwargs: Any) -> Store:
        new: Store
        if request.param == "memory":
            new = MemoryStore(clock=clock, **kwargs)
        elif request.param == "sqlite":
            new = SQLiteStore(tmp_path / f"jobs{len(made)}.db", clock=clock, **kwargs)
        else:
            dsn = request.getfixturevalue("pg_dsn")
            schema = request.getfixturevalue("pg_schema")  # a second store shares it
            new = PostgresStore(dsn, schema=schema, clock=clock, **kwargs)
        made.append(new)
        return new

    yield make
    for each in made:
        each.close()


@pytest.fixture
def store(make_store: StoreFactory) -> Store:
    """Each store under test, on the fake clock, closed afterwards (PostgreSQL: a new schema)."""
    return make_store()


def claim_one(store: Store, owner: str = "worker-a", lease: float = LEASE) -> Claim:
    """Claim exactly one job and return its claim."""
    claims = store.claim(owner, lease=lease)
    assert len(claims) == 1, claims
    return claims[0]


def must_get(store: Store, job_id: int) -> Job:
    """The job with this id, which must exist."""
    job = store.get(job_id)
    assert job is not None
    return job


EMPTY = {"queued": 0, "running": 0, "done": 0, "failed": 0, "cancelled": 0}

# --- enqueue and get ---------------------------------------------------------------------


def test_an_enqueued_job_reads_back_as_written(store: Store, clock: FakeClock) -> None:
    """A job reads back with the task, payload, state, times and attempts it was given."""
    job_id = store.enqueue("email", {"to": ["a@example.org"], "n": 1.5, "ok": True})
    job = must_get(store, job_id)
    assert job.id == job_id
    assert job.task == "email"
    assert job.payload == {"to": ["a@example.org"], "n": 1.5, "ok": True}
    assert job.state is JobState.QUEUED
    assert job.run_at == job.created_at == job.updated_at == clock.now
    assert (job.attempts, job.max_attempts) == (0, DEFAULT_MAX_ATTEMPTS)
    assert (job.lease_owner, job.lease_until, job.last_error) == (None, None, None)


@pytest.mark.parametrize("payload", [None, 0, "text", [1, [2]], {"nested": {"list": []}}])
def test_every_json_payload_round_trips(store: Store, payload: object) -> None:
    """Any JSON value (None by default) comes back equal from get and from claim."""
    job_id = store.enqueue("t", payload)
    assert must_get(store, job_id).payload == payload
    assert claim_one(store).job.payload == payload


def test_get_of_an_unknown_id_is_none(store: Store) -> None:
    """A job id that was never issued reads as None, not an error."""
    assert store.get(12345) is None


@pytest.mark.parametrize("job_id", [-1, 0, 2**63, -(2**63) - 1, 10**30])
def test_an_id_no_job_can_have_is_simply_not_found(store: Store, job_id: int) -> None:
    """Ids outside a 64-bit column are unknown ids: no OverflowError, no range error."""
    assert store.get(job_id) is None
    assert store.requeue(job_id) is False
    assert store.cancel(job_id) is CancelResult.NOT_FOUND


@pytest.mark.parametrize("job_id", ["1", 1.0, None, True])
def test_an_id_that_is_not_an_int_is_a_type_error(store: Store, job_id: object) -> None:
    """get, requeue and cancel take an int id and say so otherwise."""
    for method in (store.get, store.requeue, store.cancel):
        with pytest.raises(TypeError, match="job id must be an int"):
            method(job_id)  # type: ignore[operator]


def test_a_returned_job_is_a_snapshot_that_cannot_change_the_store(store: Store) -> None:
    """Mutating the payload of a returned job leaves the stored job as it was."""
    job_id = store.enqueue("t", {"items": [1, 2]})
    must_get(store, job_id).payload["items"].append(3)
    claim_one(store).job.payload["items"].clear()
    assert must_get(store, job_id).payload == {"items": [1, 2]}


@pytest.mark.parametrize(
    "payload", [object(), {1, 2}, float("nan"), {"when": float("inf")}, b"bytes"]
)
def test_a_payload_that_is_not_json_raises_type_error_and_writes_nothing(
    store: Store, payload: object
) -> None:
    """A non-JSON payload is a TypeError that says so, and no job is written."""
    with pytest.raises(TypeError, match="JSON"):
        store.enqueue("t", payload)
    assert store.counts() == EMPTY
    assert store.next_due() is None


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("",), {}, "task"),
        (("   ",), {}, "task"),
        (("t",), {"max_attempts": 0}, "max_attempts"),
        (("t",), {"delay": -1}, "delay"),
        (("t",), {"delay": 1, "run_at": START}, "run_at or delay"),
        (("t",), {"run_at": float("nan")}, "run_at"),
        (("t",), {"delay": float("inf")}, "delay"),
    ],
)
def test_a_bad_enqueue_argument_raises_value_error_and_writes_nothing(
    store: Store, args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    """Each bad argument is a ValueError naming it, and no job is written."""
    with pytest.raises(ValueError, match=message):
        store.enqueue(*args, **kwargs)
    assert store.counts() == EMPTY


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"max_attempts": 2.5}, "max_attempts"), ({"delay": "soon"}, "delay")],
)
def test_an_argument_of_the_wrong_type_raises_type_error(
    store: Store, kwargs: dict[str, Any], message: str
) -> None:
    """A value of the wrong type is a TypeError naming the argument, and nothing is written."""
    with pytest.raises(TypeError, match=message):
        store.enqueue("t", **kwargs)
    assert store.counts() == EMPTY


def test_enqueue_many_writes_every_job_or_none(store: Store) -> None:
    """One bad job in a batch writes nothing; a good batch gets increasing ids in order."""
    with pytest.raises(TypeError, match="#1"):
        store.enqueue_many([{"task": "a"}, {"task": "b", "payload": object()}])
    with pytest.raises(ValueError, match="unknown keys"):
        store.enqueue_many([{"task": "a", "priority": 1}])
    assert store.counts() == EMPTY
    ids = store.enqueue_many([{"task": "a", "payload": 1}, {"task": "b", "delay": 5}])
    assert len(ids) == 2
    assert ids[0] < ids[1]
    assert [must_get(store, i).task for i in ids] == ["a", "b"]
    assert store.enqueue_many([]) == []


def test_ids_are_never_reused_after_a_purge(store: Store) -> None:
    """A purged job's id is not given to a new job, so an old id never names a new job."""
    first = store.enqueue("t")
    assert store.complete(claim_one(store))
    assert store.purge() == 1
    assert store.enqueue("t") > first


# --- claim: order, time, exclusivity ------------------------------------------------------


def test_claim_takes_the_oldest_run_at_first_and_breaks_ties_by_id(
    store: Store, clock: FakeClock
) -> None:
    """Due jobs come out by run_at, then by id; jobs not yet due stay behind."""
    late = store.enqueue("late", run_at=START - 1)
    tie_1 = store.enqueue("tie", run_at=START - 5)
    tie_2 = store.enqueue("tie", run_at=START - 5)
    early = store.enqueue("early", run_at=START - 10)
    store.enqueue("future", delay=1)
    claims = store.claim("w", lease=LEASE, limit=10)
    assert [c.job.id for c in claims] == [early, tie_1, tie_2, late]
    assert store.claim("w", lease=LEASE, limit=10) == []


def test_claim_takes_at_most_limit_jobs(store: Store) -> None:
    """The limit bounds one claim; the rest stay queued for the next claim."""
    ids = store.enqueue_many([{"task": "t"} for _ in range(5)])
    assert [c.job.id for c in store.claim("w", lease=LEASE, limit=2)] == ids[:2]
    assert [c.job.id for c in store.claim("w", lease=LEASE, limit=2)] == ids[2:4]
    assert store.counts() == {**EMPTY, "queued": 1, "running": 4}


def test_a_delayed_job_is_not_claimed_before_its_run_at(store: Store, clock: FakeClock) -> None:
    """A job enqueued with a delay is due at now + delay exactly, and not a moment before."""
    job_id = store.enqueue("t", delay=10)
    assert must_get(store, job_id).run_at == START + 10
    clock.advance(9.5)
    assert store.claim("w", lease=LEASE) == []
    clock.advance(0.5)
    assert claim_one(store).job.id == job_id


def test_a_run_at_in_the_past_is_due_at_once_and_a_future_one_waits(
    store: Store, clock: FakeClock
) -> None:
    """run_at is used as given: in the past it is due now, in the future it waits."""
    future = store.enqueue("t", run_at=START + 60)
    past = store.enqueue("t", run_at=START - 60)
    assert must_get(store, past).run_at == START - 60
    assert claim_one(store, lease=3600).job.id == past
    assert store.claim("w", lease=LEASE) == []
    clock.advance(60)
    assert claim_one(store).job.id == future


@pytest.mark.parametrize(
    ("owner", "kwargs", "error", "message"),
    [
        ("", {"lease": LEASE}, ValueError, "owner"),
        ("w", {"lease": 0}, ValueError, "lease"),
        ("w", {"lease": -1}, ValueError, "lease"),
        ("w", {"lease": LEASE, "limit": 0}, ValueError, "limit"),
        ("w", {"lease": LEASE, "limit": 1.0}, TypeError, "limit"),
    ],
)
def test_a_bad_claim_argument_raises_and_claims_nothing(
    store: Store, owner: str, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    """An empty owner, a lease <= 0 or a limit < 1 is refused before any job is touched."""
    store.enqueue("t")
    with pytest.raises(error, match=message):
        store.claim(owner, **kwargs)
    assert store.counts() == {**EMPTY, "queued": 1}


def test_a_claim_takes_a_lease_with_a_token_unique_to_that_claim(
    store: Store, clock: FakeClock
) -> None:
    """A claim marks the job running under its own token until now + lease, one attempt."""
    store.enqueue_many([{"task": "t"}, {"task": "t"}])
    first, second = store.claim("worker-a", lease=LEASE, limit=2)
    for claim in (first, second):
        assert claim.token.startswith("worker-a")
        assert claim.lease_until == START + LEASE
        assert claim.job.state is JobState.RUNNING
        assert claim.job.attempts == 1
        assert claim.job.lease_owner == claim.token
        assert must_get(store, claim.job.id) == claim.job
    assert first.token != second.token


def test_concurrent_claimers_get_each_job_exactly_once(store: Store) -> None:
    """Eight threads released together by a barrier claim 120 jobs; no job is claimed twice."""
    ids = store.enqueue_many([{"task": "t", "payload": n} for n in range(120)])
    barrier = threading.Barrier(8, timeout=MUST_HAPPEN)
    taken: list[list[int]] = [[] for _ in range(8)]

    def claimer(index: int) -> Callable[[], None]:
        def run() -> None:
            barrier.wait()
            while claims := store.claim(f"w{index}", lease=LEASE, limit=1 + index % 3):
                for claim in claims:
                    taken[index].append(claim.job.id)
                    assert store.complete(claim)

        return run

    threads = [run_in_thread(claimer(i), name=f"claimer-{i}") for i in range(8)]
    for thread, outcome in threads:
        join_or_fail(thread)
        assert "error" not in outcome, outcome
    claimed = [job_id for per_thread in taken for job_id in per_thread]
    assert sorted(claimed) == ids  # every job once: none lost, none twice
    assert store.counts() == {**EMPTY, "done": 120}


# --- fencing ------------------------------------------------------------------------------


def _stale_and_current(store: Store, clock: FakeClock) -> tuple[Claim, Claim]:
    """A claim whose lease expired and was taken over, and the claim that took it."""
    store.enqueue("t")
    stale = claim_one(store, "worker-a")
    clock.advance(LEASE)
    current = claim_one(store, "worker-b")
    assert current.job.id == stale.job.id
    assert current.token != stale.token
    return stale, current


@pytest.mark.parametrize(
    "action",
    [
        lambda s, c: s.complete(c),
        lambda s, c: s.fail(c, "boom"),
        lambda s, c: s.retry(c, "boom", run_at=START),
        lambda s, c: s.release(c),
        lambda s, c: s.renew(c, lease=LEASE),
        lambda s, c: s.mark_cancelled(c, "stopped"),
    ],
    ids=["complete", "fail", "retry", "release", "renew", "mark_cancelled"],
)
def test_a_claim_whose_lease_was_taken_over_changes_nothing(
    store: Store, clock: FakeClock, action: Callable[[Store, Claim], object]
) -> None:
    """After expiry and a re-claim, the old claim's transitions return False/None and no-op."""
    stale, current = _stale_and_current(store, clock)
    before = must_get(store, stale.job.id)
    clock.advance(1)
    assert action(store, stale) in (False, None)
    assert must_get(store, stale.job.id) == before
    assert store.complete(current)  # the current holder is unaffected
    assert must_get(store, stale.job.id).state is JobState.DONE


@pytest.mark.parametrize(
    "action",
    [
        lambda s, c: s.complete(c),
        lambda s, c: s.fail(c, "boom"),
        lambda s, c: s.retry(c, "boom", run_at=START),
        lambda s, c: s.release(c),
        lambda s, c: s.renew(c, lease=LEASE),
        lambda s, c: s.mark_cancelled(c, "stopped"),
    ],
    ids=["complete", "fail", "retry", "release", "renew", "mark_cancelled"],
)
def test_a_settled_claim_cannot_settle_the_job_again(
    store: Store, action: Callable[[Store, Claim], object]
) -> None:
    """Once a claim completed its job, any further transition with it is refused."""
    store.enqueue("t")
    claim = claim_one(store)
    assert store.complete(claim)
    done = must_get(store, claim.job.id)
    assert action(store, claim) in (False, None)
    assert must_get(store, claim.job.id) == done


def test_a_claim_for_a_purged_job_is_refused(store: Store) -> None:
    """A claim whose job no longer exists returns False instead of raising."""
    store.enqueue("t")
    claim = claim_one(store)
    stale_copy = Claim(claim.job, claim.token, claim.lease_until)
    assert store.fail(claim, "boom")
    assert store.purge() == 1
    assert store.complete(stale_copy) is False
    assert store.renew(stale_copy, lease=LEASE) is None


# --- transitions and attempts -------------------------------------------------------------


def test_complete_marks_the_job_done_and_keeps_the_row(store: Store, clock: FakeClock) -> None:
    """Completing ends the lease and keeps the job readable until an explicit purge."""
    job_id = store.enqueue("t")
    claim = claim_one(store)
    clock.advance(2)
    assert store.complete(claim)
    job = must_get(store, job_id)
    assert job.state is JobState.DONE
    assert (job.lease_owner, job.lease_until) == (None, None)
    assert (job.attempts, job.updated_at) == (1, START + 2)
    assert store.claim("w", lease=LEASE) == []


def test_fail_marks_the_job_failed_with_the_error(store: Store) -> None:
    """Failing ends the job for good and records why."""
    job_id = store.enqueue("t")
    assert store.fail(claim_one(store), "ValueError: bad input")
    job = must_get(store, job_id)
    assert (job.state, job.last_error, job.lease_owner) == (
        JobState.FAILED,
        "ValueError: bad input",
        None,
    )
    assert store.claim("w", lease=LEASE) == []


def test_retry_keeps_the_attempt_and_queues_the_job_at_the_new_time(
    store: Store, clock: FakeClock
) -> None:
    """A retry records the error, moves run_at, keeps attempts, and the job waits until then."""
    job_id = store.enqueue("t")
    assert store.retry(claim_one(store), "timeout", run_at=START + 7)
    job = must_get(store, job_id)
    assert (job.state, job.attempts, job.run_at) == (JobState.QUEUED, 1, START + 7)
    assert (job.last_error, job.lease_owner, job.lease_until) == ("timeout", None, None)
    assert store.claim("w", lease=LEASE) == []
    clock.advance(7)
    assert claim_one(store).job.attempts == 2


def test_release_gives_the_attempt_back_and_keeps_the_original_run_at(
    store: Store, clock: FakeClock
) -> None:
    """An interrupted job goes back exactly as it was: same run_at, same attempts, no lease."""
    job_id = store.enqueue("t", run_at=START - 100)
    clock.advance(50)
    claim = claim_one(store)
    assert claim.job.attempts == 1
    clock.advance(5)
    assert store.release(claim)
    job = must_get(store, job_id)
    assert (job.state, job.attempts, job.run_at) == (JobState.QUEUED, 0, START - 100)
    assert (job.lease_owner, job.lease_until, job.last_error) == (None, None, None)
    assert claim_one(store).job.id == job_id  # due again at once, still first in line


def test_release_after_a_retry_keeps_the_retry_time_and_error(
    store: Store, clock: FakeClock
) -> None:
    """Release undoes only its own claim: earlier attempts and the retry's run_at stay."""
    job_id = store.enqueue("t")
    assert store.retry(claim_one(store), "flaky", run_at=START + 3)
    clock.advance(10)
    assert store.release(claim_one(store))
    job = must_get(store, job_id)
    assert (job.attempts, job.run_at, job.last_error) == (1, START + 3, "flaky")


def test_attempts_count_claims_including_expired_ones(store: Store, clock: FakeClock) -> None:
    """Claims count, releases give back, retries keep, and a lease expiry counts an attempt."""
    job_id = store.enqueue("t", max_attempts=5)
    assert claim_one(store).job.attempts == 1
    clock.advance(LEASE)  # the worker died: its lease expires
    again = claim_one(store)
    assert again.job.attempts == 2
    assert store.release(again)
    assert must_get(store, job_id).attempts == 1
    assert store.retry(claim_one(store), "e", run_at=clock.now)
    assert must_get(store, job_id).attempts == 2
    assert claim_one(store).job.attempts == 3


def test_a_job_that_keeps_killing_its_worker_ends_failed_with_the_reason(
    store: Store, clock: FakeClock
) -> None:
    """When the last attempt's lease expires, the next claim fails the job instead of running it."""
    job_id = store.enqueue("poison", max_attempts=2)
    other = store.enqueue("fine", run_at=START + 2 * LEASE)
    for attempt in (1, 2):
        assert claim_one(store).job.attempts == attempt
        clock.advance(LEASE)  # each time the worker dies and its lease runs out
    assert [c.job.id for c in store.claim("w", lease=LEASE, limit=5)] == [other]
    job = must_get(store, job_id)
    assert job.state is JobState.FAILED
    assert job.attempts == 2
    assert job.last_error is not None
    assert "lease expired after 2 attempts" in job.last_error
    assert (job.lease_owner, job.lease_until) == (None, None)


def test_an_expired_lease_is_not_claimable_a_moment_before_it_ends(
    store: Store, clock: FakeClock
) -> None:
    """A running job is claimable again exactly when its lease ends, not earlier."""
    store.enqueue("t")
    claim_one(store)
    clock.advance(LEASE - 0.5)
    assert store.claim("w", lease=LEASE) == []
    clock.advance(0.5)
    assert len(store.claim("w", lease=LEASE)) == 1


def test_renew_extends_the_lease_and_returns_a_new_claim(store: Store, clock: FakeClock) -> None:
    """A renewal moves lease_until to now + lease under the same token; the job stays protected."""
    store.enqueue("t")
    claim = claim_one(store)
    clock.advance(LEASE - 1)
    renewed = store.renew(claim, lease=LEASE)
    assert renewed is not None
    assert renewed.token == claim.token
    assert renewed.lease_until == clock.now + LEASE
    assert renewed.job.lease_until == renewed.lease_until
    assert renewed.job.attempts == 1  # a renewal is not an attempt
    clock.advance(2)  # past the first lease, inside the renewed one
    assert store.claim("other", lease=LEASE) == []
    assert store.complete(claim)  # the token, not the Claim object, holds the lease


def test_a_late_holder_can_renew_until_someone_else_claims(store: Store, clock: FakeClock) -> None:
    """An expired lease that nobody took over yet still belongs to its claim."""
    store.enqueue("t")
    claim = claim_one(store)
    clock.advance(LEASE + 5)
    renewed = store.renew(claim, lease=LEASE)
    assert renewed is not None
    assert store.claim("other", lease=LEASE) == []
    assert store.complete(renewed)


def test_a_renewal_with_a_bad_lease_is_refused(store: Store) -> None:
    """renew(lease <= 0) is a ValueError and leaves the lease as it was."""
    store.enqueue("t")
    claim = claim_one(store)
    with pytest.raises(ValueError, match="lease"):
        store.renew(claim, lease=0)
    assert must_get(store, claim.job.id).lease_until == claim.lease_until


# --- next_due, counts, purge, close --------------------------------------------------------


def test_next_due_is_the_earliest_run_at_or_lease_expiry(store: Store, clock: FakeClock) -> None:
    """next_due covers queued run_at and running lease ends, ignores finished jobs."""
    assert store.next_due() is None
    store.enqueue("t", delay=100)
    assert store.next_due() == START + 100
    store.enqueue("t", delay=0)
    assert store.next_due() == START
    claim = claim_one(store, lease=20)
    assert store.next_due() == START + 20  # the lease expiry, before the queued job
    assert store.complete(claim)
    assert store.next_due() == START + 100
    clock.advance(100)
    assert store.fail(claim_one(store), "x")
    assert store.next_due() is None


def test_counts_has_every_state_even_when_zero(store: Store, clock: FakeClock) -> None:
    """The counts report all four states and follows every transition."""
    assert store.counts() == EMPTY
    store.enqueue_many([{"task": "t"} for _ in range(4)])
    a, b, c = store.claim("w", lease=LEASE, limit=3)
    assert store.complete(a)
    assert store.fail(b, "x")
    assert store.counts() == {"queued": 1, "running": 1, "done": 1, "failed": 1, "cancelled": 0}
    assert store.release(c)
    assert store.counts() == {"queued": 2, "running": 0, "done": 1, "failed": 1, "cancelled": 0}


def test_purge_deletes_only_finished_jobs_updated_before_the_cutoff(
    store: Store, clock: FakeClock
) -> None:
    """A purge removes done and failed rows (optionally older than a time), never live ones."""
    store.enqueue_many([{"task": "t"} for _ in range(5)])
    old_done, old_failed, new_done, running = store.claim("w", lease=LEASE, limit=4)
    assert store.complete(old_done)
    assert store.fail(old_failed, "x")
    clock.advance(10)
    assert store.complete(new_done)
    assert store.purge(older_than=START + 10) == 2
    assert store.get(old_done.job.id) is None
    assert store.get(old_failed.job.id) is None
    assert store.counts() == {"queued": 1, "running": 1, "done": 1, "failed": 0, "cancelled": 0}
    assert store.purge() == 1
    assert store.counts() == {"queued": 1, "running": 1, "done": 0, "failed": 0, "cancelled": 0}
    assert store.complete(running)


def test_close_is_idempotent_and_a_closed_store_refuses_work(store: Store) -> None:
    """Closing twice is harmless; afterwards every method raises RuntimeError."""
    store.enqueue("t")
    store.close()
    store.close()
    with pytest.raises(RuntimeError, match="closed"):
        store.enqueue("t")
    with pytest.raises(RuntimeError, match="closed"):
        store.claim("w", lease=LEASE)
    with pytest.raises(RuntimeError, match="closed"):
        store.counts()


def test_the_store_clock_is_the_time_of_its_rows_and_still_reads_after_close(
    store: Store, clock: FakeClock
) -> None:
    """``clock()`` reads the time the store stamps rows with, and never raises."""
    assert store.clock() == START
    job_id = store.enqueue("t")
    assert must_get(store, job_id).created_at == store.clock()
    later = clock.advance(5)
    assert store.clock() == later
    store.close()
    assert store.clock() == START + 5


def test_subscribe_returns_an_unsubscribe_and_a_closed_store_refuses_it(store: Store) -> None:
    """Every store takes a subscriber and hands back a callable; closed, it refuses."""
    unsubscribe = store.subscribe(lambda: None)
    assert callable(unsubscribe)
    unsubscribe()
    unsubscribe()  # harmless twice
    store.close()
    with pytest.raises(RuntimeError, match="closed"):
        store.subscribe(lambda: None)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_store_without_notifications_never_calls_its_subscribers(
    kind: str, clock: FakeClock, tmp_path: Path
) -> None:
    """Memory and SQLite have no notifications: enqueue and release call no subscriber."""
    made: Store
    if kind == "memory":
        made = MemoryStore(clock=clock)
    else:
        made = SQLiteStore(tmp_path / "jobs.db", clock=clock)
    calls: list[None] = []
    made.subscribe(lambda: calls.append(None))
    made.enqueue("t")
    assert made.release(claim_one(made))
    made.close()
    assert calls == []


def test_the_backoff_doubles_from_the_first_pause_up_to_the_cap_with_jitter() -> None:
    """Pause n is first * 2**(n-1), capped, times a factor in [1, 2): never less, never 2x."""
    for attempt, base in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (6, 1.0), (30, 1.0)]:
        for _ in range(50):
            pause = backoff(0.1, attempt, cap=1.0)
            assert base <= pause < 2 * base, (attempt, pause)
    assert 0.4 <= backoff(0.1, 3) < 0.8  # no cap by default


# --- limits and hostile values: refused with the argument's name, or stored escaped -------


def test_the_default_payload_limit_is_one_mebibyte(store: Store) -> None:
    """A payload of exactly 1 MiB of JSON is taken; one byte more is refused."""
    assert DEFAULT_MAX_PAYLOAD_BYTES == 1024 * 1024
    fits = "x" * (DEFAULT_MAX_PAYLOAD_BYTES - 2)  # the two quotes make it 1 MiB
    job_id = store.enqueue("t", fits)
    assert must_get(store, job_id).payload == fits
    with pytest.raises(ValueError, match=f"{DEFAULT_MAX_PAYLOAD_BYTES + 1} bytes"):
        store.enqueue("t", fits + "x")
    assert store.counts()["queued"] == 1


def test_a_payload_over_the_limit_is_refused_naming_its_size_and_the_limit(
    make_store: StoreFactory,
) -> None:
    """Over ``max_payload_bytes`` is a ValueError with both numbers; nothing is written."""
    store = make_store(max_payload_bytes=100)
    with pytest.raises(ValueError, match=r"102 bytes .* limit of 100 bytes"):
        store.enqueue("t", "x" * 100)
    with pytest.raises(ValueError, match=r"#1: .*limit of 100"):
        store.enqueue_many([{"task": "t"}, {"task": "t", "payload": "x" * 100}])
    assert store.counts() == EMPTY
    assert store.enqueue("t", "x" * 98) > 0


# Text as an operator writes it: the file of 400,013 bytes holds ``{"text": "жжж..."}`` and
# a newline; its compact JSON is 400,011 bytes of UTF-8 (1,200,011 if every letter were a
# six-byte ``\u`` escape). Emoji take four bytes each, or twelve escaped as a surrogate pair.
UTF8_TEXTS = {"cyrillic": ("\u0436" * 200_000, 400_013), "emoji": ("\U0001f600" * 90_000, 360_013)}


@pytest.mark.parametrize(("text", "file_bytes"), list(UTF8_TEXTS.values()), ids=list(UTF8_TEXTS))
def test_a_payload_is_counted_in_the_utf8_bytes_an_operator_sees(
    store: Store, text: str, file_bytes: int
) -> None:
    """Non-ASCII text is counted as UTF-8, not as escapes, and reads back equal."""
    payload = {"text": text}
    assert len((json.dumps(payload, ensure_ascii=False) + "\n").encode()) == file_bytes
    job_id = store.enqueue("t", payload)
    assert must_get(store, job_id).payload == payload
    assert claim_one(store).job.payload == payload


def test_the_limit_refuses_utf8_text_just_over_one_mebibyte_quoting_its_utf8_size(
    store: Store,
) -> None:
    """Exactly 1 MiB of UTF-8 fits; one letter more is refused, the message quoting UTF-8 bytes."""
    fits = "\u0436" * ((DEFAULT_MAX_PAYLOAD_BYTES - 2) // 2)  # two bytes a letter, two quotes
    assert len(json.dumps(fits, ensure_ascii=False).encode()) == DEFAULT_MAX_PAYLOAD_BYTES
    job_id = store.enqueue("t", fits)
    assert must_get(store, job_id).payload == fits
    with pytest.raises(ValueError, match=f"is {DEFAULT_MAX_PAYLOAD_BYTES + 2} bytes of UTF-8"):
        store.enqueue("t", fits + "\u0436")
    assert store.counts()["queued"] == 1


@pytest.mark.parametrize(
    ("limit", "error"), [(0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError)]
)
def test_a_bad_payload_limit_is_refused_when_the_store_is_built(
    make_store: StoreFactory, limit: object, error: type[Exception]
) -> None:
    """``max_payload_bytes`` must be a positive int, checked by the constructor."""
    with pytest.raises(error, match="max_payload_bytes"):
        make_store(max_payload_bytes=limit)


@pytest.mark.parametrize("text", ["a\u0000b", "\ud800", "caf\u00e9 \U0001f600", "\udfff\x00"])
def test_a_payload_with_nul_or_a_lone_surrogate_round_trips(store: Store, text: str) -> None:
    """JSON escapes NUL and lone surrogates, so such a payload is stored and read back equal."""
    job_id = store.enqueue("t", {"text": text, "list": [text]})
    assert must_get(store, job_id).payload == {"text": text, "list": [text]}
    assert claim_one(store).job.payload == {"text": text, "list": [text]}


HOSTILE_ERRORS = {
    "surrogate": "bad \ud800 value",
    "nul": "a\x00b",
    "huge": "e" * (MAX_ERROR_CHARS * 5),
    "object": ValueError("bad \udc80"),
}


@pytest.mark.parametrize("error", list(HOSTILE_ERRORS.values()), ids=list(HOSTILE_ERRORS))
@pytest.mark.parametrize("method", ["fail", "retry", "mark_cancelled"])
def test_every_error_text_is_stored_whatever_it_contains(
    store: Store, method: str, error: object
) -> None:
    """fail, retry and mark_cancelled never raise because of the text; it is kept escaped, cut."""
    job_id = store.enqueue("t")
    claim = claim_one(store)
    if method == "retry":
        assert store.retry(claim, error, run_at=START)  # type: ignore[arg-type]
    else:
        assert getattr(store, method)(claim, error)
    stored = must_get(store, job_id).last_error
    assert stored is not None
    assert len(stored) <= MAX_ERROR_CHARS
    stored.encode("utf-8")  # storable: no lone surrogate left
    assert "\x00" not in stored
    assert stored.startswith(("bad", "a", "e"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_attempts": MAX_ATTEMPTS_LIMIT + 1}, "max_attempts must be between 1 and 1000000"),
        ({"max_attempts": 10**20}, "max_attempts"),
        ({"delay": 1e15}, "delay"),
        ({"delay": 10**400}, "delay"),
        ({"run_at": 1e300}, "run_at"),
        ({"run_at": -(10**30)}, "run_at"),
        ({"timeout": 1e15}, "timeout"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": float("nan")}, "timeout"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_an_absurd_number_is_a_value_error_naming_the_argument(
    store: Store, kwargs: dict[str, Any], message: str
) -> None:
    """Numbers beyond the documented limits, or too big for a float, write nothing."""
    with pytest.raises(ValueError, match=message):
        store.enqueue("t", **kwargs)
    assert store.counts() == EMPTY


def test_absurd_times_on_other_methods_are_value_errors_naming_the_argument(
    store: Store,
) -> None:
    """Absurd leases, run_at and cutoffs on claim, retry, renew and purge are refused."""
    store.enqueue("t")
    with pytest.raises(ValueError, match="lease"):
        store.claim("w", lease=10**400)
    with pytest.raises(ValueError, match="limit must be between 1 and"):
        store.claim("w", lease=LEASE, limit=10**20)
    with pytest.raises(ValueError, match="limit must be between 1 and"):
        store.list_jobs(limit=2**40)
    claim = claim_one(store)
    with pytest.raises(ValueError, match="run_at"):
        store.retry(claim, "x", run_at=1e15)
    with pytest.raises(ValueError, match="lease"):
        store.renew(claim, lease=1e15)
    with pytest.raises(ValueError, match="older_than"):
        store.purge(older_than=10**400)
    assert must_get(store, claim.job.id).lease_until == claim.lease_until


@pytest.mark.parametrize("task", ["a\x00b", "\ud800", "t" * 201])
def test_a_task_name_that_cannot_be_stored_is_refused(store: Store, task: str) -> None:
    """A task name with NUL, a lone surrogate or over 200 characters is a ValueError."""
    with pytest.raises(ValueError, match="task"):
        store.enqueue(task)
    assert store.counts() == EMPTY


# --- timeout and result ---------------------------------------------------------------------


def test_a_job_keeps_its_timeout_and_a_claim_carries_it(store: Store) -> None:
    """enqueue(timeout=) is stored as seconds; None by default; both reach the claim."""
    timed = store.enqueue("t", timeout=2.5)
    untimed = store.enqueue("t")
    assert must_get(store, timed).timeout == 2.5
    assert must_get(store, untimed).timeout is None
    assert [c.job.timeout for c in store.claim("w", lease=LEASE, limit=2)] == [2.5, None]
    ids = store.enqueue_many([{"task": "t", "timeout": 7}])
    assert must_get(store, ids[0]).timeout == 7.0


@pytest.mark.parametrize("result", [None, 0, "text", [1, {"a": None}], {"n": 1.5}])
def test_complete_stores_the_result_and_get_reads_it_back(store: Store, result: object) -> None:
    """A handler's JSON result is the done job's ``result``; a new job has none."""
    job_id = store.enqueue("t")
    assert must_get(store, job_id).result is None
    assert store.complete(claim_one(store), result)
    job = must_get(store, job_id)
    assert (job.state, job.result) == (JobState.DONE, result)


def test_a_result_that_is_not_json_or_too_big_changes_nothing(make_store: StoreFactory) -> None:
    """complete() with a bad result raises TypeError / ValueError; the claim still holds."""
    store = make_store(max_payload_bytes=50)
    job_id = store.enqueue("t")
    claim = claim_one(store)
    before = must_get(store, job_id)
    with pytest.raises(TypeError, match="result"):
        store.complete(claim, object())
    with pytest.raises(ValueError, match="result is 62 bytes"):
        store.complete(claim, "r" * 60)
    assert must_get(store, job_id) == before
    assert store.complete(claim, "fine")
    assert must_get(store, job_id).result == "fine"


# --- renew touches the lease only -----------------------------------------------------------


def test_renew_keeps_the_callers_job_snapshot_and_reports_no_cancel(
    store: Store, clock: FakeClock
) -> None:
    """The renewed claim holds the same payload object (nothing re-read) and no cancel flag."""
    store.enqueue("t", {"big": ["x"] * 10})
    claim = claim_one(store)
    clock.advance(1)
    renewed = store.renew(claim, lease=LEASE)
    assert renewed is not None
    assert renewed.job.payload is claim.job.payload
    assert renewed.job.id == claim.job.id
    assert renewed.cancel_requested is False


# --- cancel ---------------------------------------------------------------------------------


def test_cancel_on_a_queued_job_cancels_it_and_it_never_runs(
    store: Store, clock: FakeClock
) -> None:
    """A queued job cancelled is counted cancelled, never claimed, and not due."""
    job_id = store.enqueue("t")
    assert store.cancel(job_id) is CancelResult.CANCELLED
    assert must_get(store, job_id).state is JobState.CANCELLED
    assert store.counts() == {**EMPTY, "cancelled": 1}
    clock.advance(3600)
    assert store.claim("w", lease=LEASE) == []
    assert store.next_due() is None
    assert store.cancel(job_id) is CancelResult.FINISHED


def test_cancel_on_a_running_job_is_requested_and_the_next_renew_sees_it(
    store: Store, clock: FakeClock
) -> None:
    """The job stays running (its handler decides); renew returns cancel_requested=True."""
    job_id = store.enqueue("t")
    claim = claim_one(store)
    assert store.cancel(job_id) is CancelResult.REQUESTED
    assert store.cancel(job_id) is CancelResult.REQUESTED  # asking twice is harmless
    job = must_get(store, job_id)
    assert (job.state, job.cancel_requested) == (JobState.RUNNING, True)
    clock.advance(1)
    renewed = store.renew(claim, lease=LEASE)
    assert renewed is not None
    assert renewed.cancel_requested is True
    assert store.mark_cancelled(renewed, "stopped on cancel")
    job = must_get(store, job_id)
    assert (job.state, job.last_error, job.lease_owner) == (
        JobState.CANCELLED,
        "stopped on cancel",
        None,
    )
    assert store.counts() == {**EMPTY, "cancelled": 1}


def test_a_handler_that_ignores_a_cancel_still_completes(store: Store) -> None:
    """A cancel request does not take the lease: the holder may still complete the job."""
    job_id = store.enqueue("t")
    claim = claim_one(store)
    assert store.cancel(job_id) is CancelResult.REQUESTED
    assert store.complete(claim, 42)
    assert must_get(store, job_id).state is JobState.DONE


def test_a_cancel_requested_job_whose_worker_died_ends_cancelled_at_the_next_claim(
    store: Store, clock: FakeClock
) -> None:
    """A claim does not return an expired job with a cancel request: it marks it cancelled."""
    job_id = store.enqueue("t", max_attempts=5)
    stale = claim_one(store)
    assert store.cancel(job_id) is CancelResult.REQUESTED
    clock.advance(LEASE + 1)
    assert store.claim("w2", lease=LEASE) == []
    job = must_get(store, job_id)
    assert job.state is JobState.CANCELLED
    assert job.last_error is not None
    assert "cancel" in job.last_error
    assert store.renew(stale, lease=LEASE) is None


@pytest.mark.parametrize("method", ["release", "retry"])
def test_giving_back_a_cancel_requested_job_ends_it_cancelled(
    store: Store, clock: FakeClock, method: str
) -> None:
    """A release or retry of a job with a cancel request does not queue it: it is cancelled."""
    job_id = store.enqueue("t")
    claim = claim_one(store)
    assert store.cancel(job_id) is CancelResult.REQUESTED
    if method == "release":
        assert store.release(claim)
    else:
        assert store.retry(claim, "boom", run_at=START)
    assert must_get(store, job_id).state is JobState.CANCELLED
    clock.advance(3600)
    assert store.claim("w", lease=LEASE) == []


def test_cancel_on_a_finished_job_changes_nothing_and_on_a_missing_one_says_not_found(
    store: Store,
) -> None:
    """Done and failed jobs stay as they are (FINISHED); an unknown id is NOT_FOUND."""
    done_id, failed_id = store.enqueue_many([{"task": "t"}, {"task": "t"}])
    done, failed = store.claim("w", lease=LEASE, limit=2)
    assert store.complete(done)
    assert store.fail(failed, "x")
    before = (must_get(store, done_id), must_get(store, failed_id))
    assert store.cancel(done_id) is CancelResult.FINISHED
    assert store.cancel(failed_id) is CancelResult.FINISHED
    assert (must_get(store, done_id), must_get(store, failed_id)) == before
    assert store.cancel(999) is CancelResult.NOT_FOUND
    with pytest.raises(TypeError, match="job id"):
        store.cancel("1")  # type: ignore[arg-type]


def test_mark_cancelled_is_fenced_by_the_token(store: Store, clock: FakeClock) -> None:
    """A claim that lost its lease cannot mark the job cancelled."""
    stale, current = _stale_and_current(store, clock)
    assert store.mark_cancelled(stale, "late") is False
    assert must_get(store, current.job.id).state is JobState.RUNNING
    assert store.mark_cancelled(current, "stopped")


# --- requeue --------------------------------------------------------------------------------


def test_requeue_puts_a_failed_job_back_with_attempts_reset_and_its_error_kept(
    store: Store, clock: FakeClock
) -> None:
    """A dead letter goes back to queued, due now, 0 attempts, last_error kept, claimable."""
    job_id = store.enqueue("t", max_attempts=1)
    assert store.fail(claim_one(store), "it broke")
    now = clock.advance(50)
    assert store.requeue(job_id) is True
    job = must_get(store, job_id)
    assert (job.state, job.attempts, job.run_at, job.last_error) == (
        JobState.QUEUED,
        0,
        now,
        "it broke",
    )
    assert (job.lease_owner, job.lease_until, job.cancel_requested, job.result) == (
        None,
        None,
        False,
        None,
    )
    assert claim_one(store).job.attempts == 1


def test_requeue_is_refused_for_a_job_that_is_not_failed(store: Store) -> None:
    """queued, running, done, cancelled and missing jobs are left alone: False."""
    queued, running, done, cancelled = store.enqueue_many([{"task": "t"} for _ in range(4)])
    claims = store.claim("w", lease=LEASE, limit=3)
    assert store.complete(claims[2])
    assert store.release(claims[0])
    assert store.cancel(cancelled) is CancelResult.CANCELLED
    before = [must_get(store, i) for i in (queued, running, done, cancelled)]
    for job_id in (queued, running, done, cancelled, 999):
        assert store.requeue(job_id) is False
    assert [must_get(store, i) for i in (queued, running, done, cancelled)] == before


def test_requeue_failed_requeues_every_failed_job_or_those_of_one_task(store: Store) -> None:
    """requeue_failed(task=) takes only that task's dead letters; without it, all of them."""
    ids = store.enqueue_many([{"task": "a"}, {"task": "b"}, {"task": "a"}, {"task": "c"}])
    claims = store.claim("w", lease=LEASE, limit=4)
    for claim in claims[:3]:
        assert store.fail(claim, "x")
    assert store.complete(claims[3])
    assert store.requeue_failed(task="a") == [ids[0], ids[2]]
    assert store.counts() == {**EMPTY, "queued": 2, "failed": 1, "done": 1}
    assert store.requeue_failed() == [ids[1]]
    assert store.requeue_failed() == []


# --- list_jobs ------------------------------------------------------------------------------


def test_list_jobs_is_newest_first_and_filters_by_state_and_task(store: Store) -> None:
    """list_jobs returns Job snapshots by descending id, filtered, at most limit."""
    ids = store.enqueue_many([{"task": "a"}, {"task": "b"}, {"task": "a"}, {"task": "a"}])
    assert store.fail(claim_one(store), "x")  # ids[0]
    assert [j.id for j in store.list_jobs()] == ids[::-1]
    assert [j.id for j in store.list_jobs(limit=2)] == [ids[3], ids[2]]
    assert [j.id for j in store.list_jobs(task="a")] == [ids[3], ids[2], ids[0]]
    assert [j.id for j in store.list_jobs(state="failed")] == [ids[0]]
    assert [j.id for j in store.list_jobs(state=JobState.QUEUED, task="a")] == [ids[3], ids[2]]
    assert store.list_jobs(task="none") == []
    assert store.list_jobs(state="cancelled") == []
    assert store.list_jobs()[-1] == must_get(store, ids[0])


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"state": "dead"}, ValueError, "unknown job state 'dead'"),
        ({"state": 3}, TypeError, "state"),
        ({"limit": 0}, ValueError, "limit"),
        ({"task": 5}, TypeError, "task"),
    ],
)
def test_a_bad_list_jobs_argument_is_refused_naming_it(
    store: Store, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    """An unknown state, a limit below 1 or a task that is not a name raise."""
    with pytest.raises(error, match=message):
        store.list_jobs(**kwargs)


# --- purge by state -------------------------------------------------------------------------


def test_purge_deletes_only_the_finished_states_asked_for(store: Store, clock: FakeClock) -> None:
    """purge(states=) deletes done, failed or cancelled rows only; the default takes all three."""
    ids = store.enqueue_many([{"task": "t"} for _ in range(5)])
    done, failed, running = store.claim("w", lease=LEASE, limit=3)
    assert store.complete(done)
    assert store.fail(failed, "x")
    assert store.cancel(ids[3]) is CancelResult.CANCELLED
    assert store.purge(states=["cancelled"]) == 1
    assert store.get(ids[3]) is None
    assert store.purge(states={JobState.FAILED, JobState.DONE}, older_than=START) == 0
    assert store.purge(states={JobState.FAILED}) == 1
    assert store.counts() == {**EMPTY, "queued": 1, "running": 1, "done": 1}
    assert store.cancel(ids[4]) is CancelResult.CANCELLED
    assert store.purge() == 2
    assert store.counts() == {**EMPTY, "running": 1}
    assert store.complete(running)


@pytest.mark.parametrize(
    ("states", "error", "message"),
    [
        (["running"], ValueError, "only finished jobs"),
        (["queued", "done"], ValueError, "only finished jobs"),
        (["dead"], ValueError, "unknown job state"),
        ("done", TypeError, "collection"),
    ],
)
def test_purge_refuses_live_or_unknown_states(
    store: Store, states: object, error: type[Exception], message: str
) -> None:
    """Live jobs are never purged: naming queued or running is an error, and nothing goes."""
    store.enqueue("t")
    assert store.fail(claim_one(store), "x")
    with pytest.raises(error, match=message):
        store.purge(states=states)  # type: ignore[arg-type]
    assert store.counts()["failed"] == 1


# --- worker rows ----------------------------------------------------------------------------


def _record(store: Store, worker_id: str, **changes: Any) -> None:
    fields: dict[str, Any] = {
        "host": "box",
        "pid": 42,
        "state": "running",
        "started_at": START,
        "jobs_held": 0,
        "ttl": 10.0,
    }
    fields.update(changes)
    store.record_worker(worker_id, **fields)


def test_a_recorded_worker_is_listed_with_every_field_and_updated_in_place(
    store: Store, clock: FakeClock
) -> None:
    """record_worker inserts, then updates the same row; workers() lists oldest first."""
    _record(store, "w-2", started_at=START + 1, pid=7)
    _record(store, "w-1", jobs_held=1)
    clock.advance(3)
    _record(store, "w-1", state="draining", jobs_held=2, ttl=20.0)
    listed = store.workers()
    assert [w.id for w in listed] == ["w-1", "w-2"]
    first = listed[0]
    assert (first.host, first.pid, first.state, first.jobs_held) == ("box", 42, "draining", 2)
    assert (first.started_at, first.last_seen, first.expires_at) == (
        START,
        START + 3,
        START + 23,
    )
    assert (listed[1].pid, listed[1].last_seen, listed[1].expires_at) == (7, START, START + 10)


def test_a_worker_row_past_its_expiry_is_not_listed_and_is_deleted(
    store: Store, clock: FakeClock
) -> None:
    """A worker that stopped renewing disappears once ``expires_at`` passes, for good."""
    _record(store, "dead", ttl=5.0)
    _record(store, "alive", ttl=50.0)
    clock.advance(5)  # expires_at <= now: gone
    assert [w.id for w in store.workers()] == ["alive"]
    clock.advance(-5)  # the row was deleted, not just hidden
    assert [w.id for w in store.workers()] == ["alive"]
    _record(store, "dead", ttl=5.0)  # a new row after a restart with the same id
    assert [w.id for w in store.workers()] == ["alive", "dead"]  # same start: by id


def test_forget_worker_deletes_its_row_and_is_harmless_twice(store: Store) -> None:
    """A stopped worker removes its row; forgetting an unknown id is not an error."""
    _record(store, "w")
    store.forget_worker("w")
    store.forget_worker("w")
    assert store.workers() == []


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"worker_id": ""}, ValueError, "worker_id"),
        ({"worker_id": "w\ud800"}, ValueError, "worker_id"),
        ({"host": "a\x00b"}, ValueError, "host"),
        ({"pid": -1}, ValueError, "pid"),
        ({"pid": 10**20}, ValueError, "pid"),
        ({"pid": "1"}, TypeError, "pid"),
        ({"jobs_held": 2**40}, ValueError, "jobs_held"),
        ({"ttl": 0}, ValueError, "ttl"),
        ({"ttl": 1e15}, ValueError, "ttl"),
        ({"started_at": float("inf")}, ValueError, "started_at"),
        ({"state": ""}, ValueError, "state"),
    ],
)
def test_a_bad_worker_row_is_refused_naming_the_field(
    store: Store, changes: dict[str, Any], error: type[Exception], message: str
) -> None:
    """record_worker checks every field before writing; nothing is recorded."""
    changes = dict(changes)  # the parameter is shared by every store's run
    worker_id = changes.pop("worker_id", "w")
    with pytest.raises(error, match=message):
        _record(store, worker_id, **changes)
    assert store.workers() == []
