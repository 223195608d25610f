"""The settler's fallback path alone: a `Fallback` on a memory store, no settler, no `Worker`.

Each case is one call in the test's own thread: `Fallback.raised` as the settler makes it
when a job's store call raised, or `Fallback.answered` with the store's answer. `Bench`
records what the fallback reports (errors, step hooks) and which single-job store calls it
made (`ScriptedStore`, which can make the next ones raise). Nothing sleeps.
"""

from __future__ import annotations

import logging

import pytest

from patterns.jobqueue.stores.records import Claim, CommitUnknown, JobState, Settle, Settlement
from patterns.jobqueue.tasks import Phase
from patterns.jobqueue.worker.fallback import Fallback, Pending
from patterns.jobqueue.worker.outcomes import Outcome
from tests.jobqueue.fakes import Held, ScriptedStore
from tests.support import FakeClock

LEASE = 1_000.0  # fake seconds; only the test moves the fake clock past it
SHORT = 10.0  # a lease the test lets lapse
LOGGER = "patterns.jobqueue.worker.worker"  # the fallback's lines are the worker's (a child logger)


class Bench:
    """A fallback wired to recording callbacks instead of a settler."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.store = ScriptedStore(self.clock)
        self.errors: list[tuple[Phase, int | None]] = []
        self.steps: list[tuple[str, int, Phase]] = []
        self.fallback: Fallback[Held] = Fallback(
            self.store,
            owner="w1",
            clock=self.clock,
            error=lambda phase, job, exc: self.errors.append((phase, job.id if job else None)),
            before_commit=lambda claim, phase: self.steps.append(("before", claim.job.id, phase)),
            after_commit=lambda claim, phase: self.steps.append(("after", claim.job.id, phase)),
        )

    def claim(self, *, lease: float = LEASE) -> Claim:
        """Enqueue one job and claim it as the fallback's worker, ``w1``."""
        self.store.enqueue("work", max_attempts=3)
        [claim] = self.store.claim("w1", lease=lease, limit=1)
        return claim

    @staticmethod
    def pending(run: Held, phase: Phase = Phase.ACK) -> Pending[Held]:
        """A handler's decided outcome: a completion (ACK) or a release (RELEASE)."""
        if phase is Phase.RELEASE:
            item = Settlement(Settle.RELEASE, run.claim)
            return Pending(run, phase, item, Outcome.RELEASED, then=None, began=None)
        item = Settlement(Settle.COMPLETE, run.claim, "ok")
        return Pending(run, phase, item, Outcome.DONE, then=None, began=None)

    def state(self, job_id: int) -> tuple[JobState, int]:
        """The job's state and attempts, as the store has them."""
        job = self.store.get(job_id)
        assert job is not None
        return job.state, job.attempts


@pytest.fixture
def bench() -> Bench:
    """A fresh bench."""
    return Bench()


def _stale(bench: Bench, released_at_deadline: bool) -> Held:
    """A claim whose lease lapsed and that another worker, ``w2``, now holds."""
    stale = bench.claim(lease=SHORT)
    bench.clock.advance(SHORT + 1)
    [taken] = bench.store.claim("w2", lease=LEASE, limit=1)
    assert taken.job.id == stale.job.id
    return Held(stale, released_at_deadline)


@pytest.mark.parametrize(
    ("released_at_deadline", "why"),
    [
        (False, "its lease was taken over by another claim (fencing)"),
        (True, "the job was released at the stop deadline while its handler still ran"),
    ],
)
def test_a_stale_claims_fallback_is_refused_and_logged_as_lost(
    bench: Bench, caplog: pytest.LogCaptureFixture, released_at_deadline: bool, why: str
) -> None:
    """Its completion raised; the one requeue is refused by fencing: lost, logged, untouched."""
    run = _stale(bench, released_at_deadline)
    job_id = run.claim.job.id
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        outcome = bench.fallback.raised(bench.pending(run), RuntimeError("disk full (injected)"))
    assert outcome is Outcome.LOST
    assert bench.store.calls == ["retry"]  # one fallback call, the attempt kept spent
    assert bench.steps == [("before", job_id, Phase.REQUEUE), ("after", job_id, Phase.REQUEUE)]
    assert bench.errors == [(Phase.ACK, job_id)]
    assert f"job {job_id}: requeue refused: {why}" in caplog.text
    assert bench.state(job_id) == (JobState.RUNNING, 2)  # the newer claim's, untouched


def test_a_refused_answer_is_lost_and_logged_without_a_fallback_call(
    bench: Bench, caplog: pytest.LogCaptureFixture
) -> None:
    """The group commit answered False for a stale claim: lost, logged, no other store call."""
    run = _stale(bench, released_at_deadline=False)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert bench.fallback.answered(bench.pending(run), False) is Outcome.LOST
    assert f"job {run.claim.job.id}: ack refused: its lease was taken over" in caplog.text
    assert (bench.store.calls, bench.steps, bench.errors) == ([], [], [])


@pytest.mark.parametrize(
    ("applied", "outcome", "state"),
    [(True, Outcome.UNKNOWN, (JobState.DONE, 1)), (False, Outcome.RETRIED, (JobState.QUEUED, 1))],
)
def test_a_commit_whose_outcome_is_unknown_is_tried_once_more_and_fenced(
    bench: Bench,
    caplog: pytest.LogCaptureFixture,
    applied: bool,
    outcome: Outcome,
    state: tuple[JobState, int],
) -> None:
    """CommitUnknown on a completion: one requeue, refused only if the completion applied."""
    run = Held(bench.claim())
    job_id = run.claim.job.id
    if applied:  # the commit happened; its reply was lost
        assert bench.store.complete(run.claim, "ok")
    unknown = CommitUnknown("connection lost during COMMIT (injected)")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert bench.fallback.raised(bench.pending(run), unknown) is outcome
    assert bench.store.calls == ["retry"]  # once, never again
    assert bench.errors == [(Phase.ACK, job_id)]
    assert f"job {job_id}: ack: outcome unknown" in caplog.text
    assert bench.state(job_id) == state


def test_an_unknown_release_is_released_again_once_and_no_more(bench: Bench) -> None:
    """A release whose outcome is unknown repeats once; if that breaks too, it stays unknown."""
    run = Held(bench.claim())
    job_id = run.claim.job.id
    again = CommitUnknown("connection lost again (injected)")
    bench.store.raises["release"] = [again]
    unknown = CommitUnknown("connection lost during COMMIT (injected)")
    assert bench.fallback.raised(bench.pending(run, Phase.RELEASE), unknown) is Outcome.UNKNOWN
    assert bench.store.calls == ["release"]
    assert bench.errors == [(Phase.RELEASE, job_id), (Phase.RELEASE, job_id)]
    assert bench.state(job_id) == (JobState.RUNNING, 1)  # left to its lease


def test_commit_runs_the_action_between_the_two_step_hooks(bench: Bench) -> None:
    """`Fallback.commit` (the worker's release goes through it): before, the call, after."""
    claim = bench.claim()
    assert bench.fallback.commit(Phase.RELEASE, claim, bench.store.release)
    job_id = claim.job.id
    assert bench.steps == [("before", job_id, Phase.RELEASE), ("after", job_id, Phase.RELEASE)]
    assert bench.store.calls == ["release"]
    assert bench.state(job_id) == (JobState.QUEUED, 0)
