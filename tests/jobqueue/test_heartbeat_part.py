"""The heartbeat alone: lease renewals and the worker row, with a memory store and no `Worker`.

`Heartbeat.beat` runs in the test's own thread, so each renewal case is one call on a
`MemoryStore` on a fake clock; `Bench` hands the heartbeat its collaborators (the claims
in hand, a lock, recording callbacks) and records what it reports. The death case runs
the heartbeat's own thread. Nothing sleeps.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from patterns.cancellation import CancelToken
from patterns.jobqueue.stores.memory import MemoryStore
from patterns.jobqueue.stores.records import Claim, Job
from patterns.jobqueue.tasks import Phase
from patterns.jobqueue.worker.heartbeat import Heartbeat
from patterns.jobqueue.worker.outcomes import ClaimState
from patterns.jobqueue.worker.states import Step
from tests.jobqueue import fakes
from tests.support import MUST_HAPPEN, FakeClock, wait_until

LEASE = 1_000.0  # fake seconds; only the test moves the fake clock past it
SHORT = 10.0  # a lease the test lets lapse
BEAT = 0.01  # real seconds between two beats of the heartbeat's own thread


@dataclass
class Record:
    """The worker's record of a claim, as far as the heartbeat reads and changes it."""

    claim: Claim
    state: ClaimState
    token: CancelToken
    cancel_requested: bool = False
    handler_token: CancelToken | None = None
    timeout: float | None = None
    overdue_reported: bool = False

    def cancel(self, reason: str) -> CancelToken:
        """The job's token, for the heartbeat to cancel (made with the record, here)."""
        return self.token


class RaisingStore(MemoryStore):
    """A memory store whose ``renew`` raises ``broken`` while it is set."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.broken: BaseException | None = None

    def renew(self, claim: Claim, *, lease: float) -> Claim | None:
        """`MemoryStore.renew`, or ``broken``."""
        if self.broken is not None:
            raise self.broken
        return super().renew(claim, lease=lease)


class Bench:
    """A heartbeat wired to recording callbacks and a dict of claims instead of a worker."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.store = RaisingStore(self.clock)
        self.lock = threading.RLock()
        self.held: dict[int, Record] = {}
        self.state = "running"
        self.lost: list[int] = []
        self.errors: list[tuple[Phase, int | None, BaseException]] = []
        self.deaths: list[BaseException] = []
        self.renewing: list[int] = []
        shared = fakes.shared(
            self.store,
            self.clock,
            lease=LEASE,
            lock=self.lock,
            error=lambda phase, job, exc: self.errors.append((phase, job.id if job else None, exc)),
            died=self.deaths.append,
            step=self._before_renew,
        )
        self.heartbeat: Heartbeat[Record] = Heartbeat(
            shared, interval=BEAT, held=self.held, state=lambda: self.state, lost=self._lost
        )

    def _before_renew(self, step: Step, claim: Claim, phase: Phase | None) -> None:
        assert step is Step.HEARTBEAT
        self.renewing.append(claim.job.id)

    def _lost(self, record: Record) -> None:
        # As the worker does (the lock is held): the waiting claim moves to LOST.
        self.lost.append(record.claim.job.id)
        record.state = ClaimState.LOST

    def hold(self, state: ClaimState, *, lease: float = LEASE) -> Record:
        """Enqueue a job, claim it as ``w1`` and hold it in ``state``."""
        self.store.enqueue("work")
        [claim] = self.store.claim("w1", lease=lease, limit=1)
        record = Record(claim, state, CancelToken())
        self.held[claim.job.id] = record
        return record

    def job(self, job_id: int) -> Job:
        """The job as the store has it."""
        job = self.store.get(job_id)
        assert job is not None
        return job


@pytest.fixture
def bench() -> Iterator[Bench]:
    """A fresh bench; the heartbeat's thread, if started, must end within the budget."""
    bench = Bench()
    yield bench
    assert bench.heartbeat.stop(MUST_HAPPEN).terminated


def test_a_beat_renews_every_claim_in_hand_and_writes_the_worker_row(bench: Bench) -> None:
    """Running, waiting and settling claims renewed (in that order); a lost one left alone."""
    settling = bench.hold(ClaimState.SETTLING)
    waiting = bench.hold(ClaimState.WAITING)
    running = bench.hold(ClaimState.RUNNING)
    gone = bench.hold(ClaimState.LOST)
    bench.heartbeat.started()
    started = bench.clock.now
    now = bench.clock.advance(SHORT)
    bench.heartbeat.beat()
    ids = [r.claim.job.id for r in (running, waiting, settling)]
    assert bench.renewing == ids
    for record in (running, waiting, settling):
        assert record.claim.lease_until == now + LEASE  # the record holds the renewed claim
        assert bench.job(record.claim.job.id).lease_until == now + LEASE
    assert gone.claim.lease_until == started + LEASE
    assert bench.lost == []
    assert bench.errors == []
    [row] = bench.store.workers()
    assert (row.id, row.state, row.jobs_held, row.started_at) == ("w1", "running", 4, started)
    assert row.expires_at == now + 3 * BEAT
    bench.heartbeat.forget()
    assert bench.store.workers() == []


def test_a_lost_lease_is_reported_for_a_waiting_claim_and_cancels_a_running_one(
    bench: Bench,
) -> None:
    """Both leases taken over: the waiting claim is reported lost, the running job cancelled."""
    waiting = bench.hold(ClaimState.WAITING, lease=SHORT)
    running = bench.hold(ClaimState.RUNNING, lease=SHORT)
    bench.clock.advance(SHORT + 1)
    taken = bench.store.claim("w2", lease=LEASE, limit=2)  # another worker takes both over
    assert {c.job.id for c in taken} == {waiting.claim.job.id, running.claim.job.id}
    bench.heartbeat.beat()
    assert bench.lost == [waiting.claim.job.id]
    assert waiting.state is ClaimState.LOST
    assert not waiting.token.cancelled  # it never started: nothing to cancel
    assert running.token.cancelled
    assert running.token.reason == "lease lost"
    assert running.state is ClaimState.RUNNING  # the handler's outcome decides (refused)
    assert bench.errors == []


def test_an_operators_cancel_seen_on_a_renewal_cancels_that_jobs_token_only(bench: Bench) -> None:
    """The renewed claim carries the cancel request: that job's token, no other."""
    cancelled = bench.hold(ClaimState.RUNNING)
    other = bench.hold(ClaimState.RUNNING)
    bench.store.cancel(cancelled.claim.job.id)
    bench.heartbeat.beat()
    assert cancelled.cancel_requested
    assert cancelled.token.reason == "cancelled by operator"
    assert not other.token.cancelled


def test_a_renewal_that_raises_is_reported_and_the_beat_goes_on(bench: Bench) -> None:
    """An Exception from renew: one error per claim, under the heartbeat's phase; no death."""
    records = [bench.hold(ClaimState.RUNNING) for _ in range(2)]
    bench.store.broken = RuntimeError("database is locked (injected)")
    bench.heartbeat.beat()
    assert [(p, i) for p, i, _ in bench.errors] == [
        (Phase.HEARTBEAT, r.claim.job.id) for r in records
    ]
    assert bench.deaths == []
    assert not any(r.token.cancelled for r in records)


def test_a_base_exception_from_the_store_kills_the_thread_loudly(bench: Bench) -> None:
    """A KeyboardInterrupt out of renew ends the thread and is reported as its death."""
    bench.hold(ClaimState.RUNNING)
    died = KeyboardInterrupt("injected into renew")
    bench.store.broken = died
    bench.heartbeat.start()
    wait_until(lambda: bench.deaths != [], "the heartbeat's death reported")
    assert bench.deaths == [died]
    assert bench.errors == []  # a death, not an error the beat goes on after
    assert bench.heartbeat.stop(MUST_HAPPEN).terminated
