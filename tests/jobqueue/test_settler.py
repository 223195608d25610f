"""The settler alone: its group commit, with a fake store and no `Worker`.

`Settler.commit_batch` runs in the test's own thread, so each case is one call on a
`MemoryStore` whose ``settle_many`` the test can make raise (`FlakyStore`); `Bench`
hands the settler its collaborators and records what it reports back. The refill cases
run the settler's thread, handing it two outcomes in one lock hold so that they make
one batch. Nothing sleeps.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pytest

from patterns.jobqueue.stores.memory import MemoryStore
from patterns.jobqueue.stores.postgres.store import CommitUnknown
from patterns.jobqueue.stores.records import Claim, Job, JobState, JsonValue, Settle, Settlement
from patterns.jobqueue.tasks import Phase
from patterns.jobqueue.worker.outcomes import Outcome
from patterns.jobqueue.worker.settler import Pending, Settler
from tests.jobqueue.fakes import Held
from tests.support import MUST_HAPPEN, FakeClock, wait_until

LEASE = 1_000.0  # fake seconds; only the test moves the fake clock past it
SHORT = 10.0  # a lease the test lets lapse


class FlakyStore(MemoryStore):
    """A memory store that records each shared transaction and can make ``settle_many`` raise.

    ``broken`` is raised by every ``settle_many`` while set (after applying the items when
    ``apply_first``: the commit happened, its reply was lost).
    """

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.broken: Exception | None = None
        self.apply_first = False
        self.shared: list[tuple[list[int], int, list[int]]] = []

    def settle_many(self, items: Sequence[Settlement]) -> list[bool | Exception]:
        """`MemoryStore.settle_many`, or ``broken``."""
        if self.broken is None:
            return super().settle_many(items)
        if self.apply_first:
            super().settle_many(items)
        raise self.broken

    def settle_and_claim(
        self, items: Sequence[Settlement], owner: str, *, lease: float, limit: int
    ) -> tuple[list[bool | Exception], list[Claim]]:
        """Record (job ids settled, limit, job ids claimed) of each shared transaction."""
        answers, claims = super().settle_and_claim(items, owner, lease=lease, limit=limit)
        self.shared.append(([i.claim.job.id for i in items], limit, [c.job.id for c in claims]))
        return answers, claims


class Bench:
    """A settler wired to recording callbacks instead of a worker."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.store = FlakyStore(self.clock)
        self.lock = threading.RLock()
        self.claiming = True  # what the worker's state says: RUNNING
        self.freed = 0
        self.settled: dict[int, Outcome | None] = {}
        self.unsettled: list[int] = []
        self.claimed: list[tuple[list[int], int]] = []
        self.completed: list[int] = []
        self.errors: list[tuple[Phase, int | None]] = []
        self.deaths: list[BaseException] = []
        self.steps: list[tuple[str, int, Phase]] = []
        self.wake = threading.Event()
        self.settler: Settler[Held] = Settler(
            self.store,
            owner="w1",
            lease=LEASE,
            clock=self.clock,
            lock=self.lock,
            claiming=lambda: self.claiming,
            free_slots=self._free,
            settled=self._settled,
            unsettled=lambda pending: self.unsettled.append(pending.run.claim.job.id),
            claimed=self._claimed,
            completed=self._completed,
            error=lambda phase, job, exc: self.errors.append(
                (phase, None if job is None else job.id)
            ),
            died=self.deaths.append,
            before_commit=lambda claim, phase: self.steps.append(("before", claim.job.id, phase)),
            after_commit=lambda claim, phase: self.steps.append(("after", claim.job.id, phase)),
            wake=self.wake,
            stop_timeout=MUST_HAPPEN,
            track=lambda target: target,
        )

    def _free(self, slots: int) -> None:
        self.freed += slots

    def _settled(self, batch: list[Pending[Held]]) -> None:
        self.settled.update((p.run.claim.job.id, p.outcome) for p in batch)

    def _claimed(self, claims: list[Claim], want: int, stopping: threading.Event | None) -> None:
        self.claimed.append(([c.job.id for c in claims], want))
        self.freed += want - len(claims)

    def _completed(self, job: Job, result: JsonValue) -> None:
        self.completed.append(job.id)

    def claim(self, n: int, *, lease: float = LEASE, max_attempts: int = 3) -> list[Claim]:
        """Enqueue ``n`` jobs and claim them as the settler's worker, ``w1``."""
        for _ in range(n):
            self.store.enqueue("work", max_attempts=max_attempts)
        return self.store.claim("w1", lease=lease, limit=n)

    @staticmethod
    def completion(claim: Claim) -> Pending[Held]:
        """A handler's decided completion, as the worker hands it over."""
        item = Settlement(Settle.COMPLETE, claim, "ok")
        return Pending(Held(claim), Phase.ACK, item, Outcome.DONE, then=None, began=None)

    def state(self, job_id: int) -> tuple[JobState, int]:
        """The job's state and attempts, as the store has them."""
        job = self.store.get(job_id)
        assert job is not None
        return job.state, job.attempts


@pytest.fixture
def bench() -> Iterator[Bench]:
    """A fresh bench; its settler's thread, if started, must end within the budget."""
    bench = Bench()
    yield bench
    bench.settler.close()
    assert bench.settler.stop(MUST_HAPPEN).terminated


def test_a_batch_is_one_commit_and_each_accepted_completion_runs_its_hook(bench: Bench) -> None:
    """Three outcomes, one settle_many: each reported done, then each hook, in order."""
    claims = bench.claim(3)
    bench.settler.commit_batch([bench.completion(c) for c in claims])
    ids = [c.job.id for c in claims]
    assert bench.settled == dict.fromkeys(ids, Outcome.DONE)
    assert bench.completed == ids
    assert [bench.state(i) for i in ids] == [(JobState.DONE, 1)] * 3
    assert [s[0] for s in bench.steps] == ["before"] * 3 + ["after"] * 3
    assert bench.errors == []


def test_a_group_commit_that_fails_sends_each_job_alone_then_to_its_fallback(
    bench: Bench,
) -> None:
    """settle_many always raising: each job tried alone, then its fallback keeps the attempt."""
    *retried, last = bench.claim(2) + bench.claim(1, max_attempts=1)
    bench.store.broken = RuntimeError("disk full (injected)")
    bench.settler.commit_batch([bench.completion(c) for c in [*retried, last]])
    ids = [c.job.id for c in retried]
    # Attempts left: requeued after the default backoff; none left: failed. Never released.
    assert bench.settled == {**dict.fromkeys(ids, Outcome.RETRIED), last.job.id: Outcome.FAILED}
    assert [bench.state(i) for i in ids] == [(JobState.QUEUED, 1)] * 2
    assert bench.state(last.job.id) == (JobState.FAILED, 1)
    # The group's error once (under its first job), then each job's own failed call.
    first = ids[0]
    assert bench.errors == [(Phase.ACK, first), *((Phase.ACK, i) for i in [*ids, last.job.id])]
    assert bench.completed == []  # no hook for an outcome that is not the one decided


@pytest.mark.parametrize(
    ("applied", "outcome", "state"),
    [(True, Outcome.UNKNOWN, JobState.DONE), (False, Outcome.RETRIED, JobState.QUEUED)],
)
def test_a_group_commit_whose_outcome_is_unknown_sends_each_job_straight_to_its_fallback(
    bench: Bench, applied: bool, outcome: Outcome, state: JobState
) -> None:
    """CommitUnknown: no one-by-one retry; each fallback is refused only if the commit applied."""
    claims = bench.claim(3)
    bench.store.broken = CommitUnknown("connection lost during COMMIT (injected)")
    bench.store.apply_first = applied
    bench.settler.commit_batch([bench.completion(c) for c in claims])
    ids = [c.job.id for c in claims]
    assert bench.settled == dict.fromkeys(ids, outcome)
    assert [bench.state(i)[0] for i in ids] == [state] * 3
    assert bench.errors == [(Phase.ACK, i) for i in ids]  # each job's own, no group line
    assert bench.completed == []  # the worker cannot know that the job is done


def test_a_stale_claim_in_a_batch_is_refused_alone_and_the_others_complete(bench: Bench) -> None:
    """A lease taken over while its handler ran: lost, no hook; the batch's others are done."""
    first = bench.claim(1)[0]
    stale = bench.claim(1, lease=SHORT)[0]
    last = bench.claim(1)[0]
    bench.clock.advance(SHORT + 1)
    [taken] = bench.store.claim("w2", lease=LEASE, limit=1)  # another worker takes it over
    assert taken.job.id == stale.job.id
    bench.settler.commit_batch([bench.completion(c) for c in (first, stale, last)])
    assert bench.settled == {
        first.job.id: Outcome.DONE,
        stale.job.id: Outcome.LOST,
        last.job.id: Outcome.DONE,
    }
    assert bench.completed == [first.job.id, last.job.id]
    assert bench.state(stale.job.id) == (JobState.RUNNING, 2)  # the newer claim's, untouched
    assert bench.errors == []


def test_the_outcome_commit_claims_a_job_for_each_slot_its_outcomes_freed(bench: Bench) -> None:
    """Two outcomes handed over in one lock hold: one settle_and_claim settles both, claims two."""
    claims = bench.claim(2)
    waiting = [bench.store.enqueue("work") for _ in range(3)]
    bench.settler.start()
    with bench.lock:  # one hold: the thread takes both in one batch
        assert all(bench.settler.put(bench.completion(c)) for c in claims)
    wait_until(lambda: len(bench.settled) == 2, "the batch committed")
    ids = [c.job.id for c in claims]
    assert bench.store.shared == [(ids, 2, waiting[:2])]
    assert bench.claimed == [(waiting[:2], 2)]  # to the worker, before the hooks run
    assert bench.settled == dict.fromkeys(ids, Outcome.DONE)
    assert [bench.state(i) for i in waiting] == [
        (JobState.RUNNING, 1),
        (JobState.RUNNING, 1),
        (JobState.QUEUED, 0),
    ]
    assert bench.freed == 0
    wait_until(bench.wake.is_set, "the claimer woken after the commit")


def test_once_the_worker_is_stopping_the_outcome_commit_claims_nothing_and_frees_the_slots(
    bench: Bench,
) -> None:
    """claiming() False (the worker left RUNNING): settle_many alone, both slots freed at once."""
    claims = bench.claim(2)
    waiting = bench.store.enqueue("work")
    bench.claiming = False
    bench.settler.start()
    with bench.lock:
        assert all(bench.settler.put(bench.completion(c)) for c in claims)
    wait_until(lambda: len(bench.settled) == 2, "the batch committed")
    assert bench.store.shared == []
    assert bench.claimed == []
    assert bench.freed == 2
    assert bench.state(waiting) == (JobState.QUEUED, 0)


def test_a_closed_settler_refuses_a_hand_over_and_leaves_once_its_outbox_is_committed(
    bench: Bench,
) -> None:
    """After close(), put() says no (the handler thread commits its own) and the thread ends."""
    [claim] = bench.claim(1)
    bench.settler.start()
    bench.settler.close()
    assert bench.settler.stop(MUST_HAPPEN).terminated
    with bench.lock:
        assert not bench.settler.put(bench.completion(claim))
    assert bench.settled == {}
    assert bench.deaths == []


def test_the_outcome_commit_frees_the_slots_no_claim_filled(bench: Bench) -> None:
    """Two slots freed, one job due: the commit claims it and the other slot is free again."""
    claims = bench.claim(2)
    waiting = bench.store.enqueue("work")
    bench.settler.start()
    with bench.lock:
        assert all(bench.settler.put(bench.completion(c)) for c in claims)
    wait_until(lambda: len(bench.settled) == 2, "the batch committed")
    ids = [c.job.id for c in claims]
    assert bench.store.shared == [(ids, 2, [waiting])]
    assert bench.claimed == [([waiting], 2)]
    assert bench.freed == 1
    assert bench.completed == ids


@pytest.mark.parametrize(
    ("error", "applied", "outcome"),
    [
        (RuntimeError("disk full (injected)"), False, Outcome.RETRIED),
        (CommitUnknown("connection lost during COMMIT (injected)"), True, Outcome.UNKNOWN),
    ],
    ids=["failed", "unknown"],
)
def test_an_outcome_commit_that_raises_claims_nothing_and_each_outcome_takes_its_fallback(
    bench: Bench, error: Exception, applied: bool, outcome: Outcome
) -> None:
    """settle_and_claim raising: each item's fallback decides; both slots are freed, none held."""
    claims = bench.claim(2)
    waiting = bench.store.enqueue("work")
    bench.store.broken = error
    bench.store.apply_first = applied
    bench.settler.start()
    with bench.lock:
        assert all(bench.settler.put(bench.completion(c)) for c in claims)
    wait_until(lambda: len(bench.settled) == 2, "the batch committed")
    ids = [c.job.id for c in claims]
    assert bench.settled == dict.fromkeys(ids, outcome)
    assert bench.store.shared == []  # the shared transaction raised: no claim in it
    assert bench.claimed == [([], 2)]
    assert bench.freed == 2
    assert bench.state(waiting) == (JobState.QUEUED, 0)
    assert bench.completed == []
    assert bench.deaths == []


def test_only_an_accepted_failure_runs_its_hook(bench: Bench) -> None:
    """Two failures in one batch, one on a stale claim: only the accepted one's hook runs."""
    good = bench.claim(1)[0]
    stale = bench.claim(1, lease=SHORT)[0]
    bench.clock.advance(SHORT + 1)
    assert bench.store.claim("w2", lease=LEASE, limit=1)[0].job.id == stale.job.id
    hooked: list[int] = []

    def failure(claim: Claim) -> Pending[Held]:
        item = Settlement(Settle.FAIL, claim, error="ValueError: bad payload")
        then = lambda: hooked.append(claim.job.id)  # noqa: E731 - the task's on_failure
        return Pending(Held(claim), Phase.NACK, item, Outcome.FAILED, then=then, began=None)

    bench.settler.commit_batch([failure(good), failure(stale)])
    assert bench.settled == {good.job.id: Outcome.FAILED, stale.job.id: Outcome.LOST}
    assert hooked == [good.job.id]
    assert bench.state(good.job.id) == (JobState.FAILED, 1)
