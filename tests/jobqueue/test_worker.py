"""The worker: Proletarian's shutdown table, qdolor's lifecycle, fencing, and no silent deaths.

Every test runs the real `Worker` on a real `MemoryStore`, seen through `RecordingStore`, a
pass-through wrapper that records each call (so the order of store calls and hooks can be
asserted), can park a call at a `Gate`, and can make a call raise. Time in the store is a
`FakeClock`, moved by the test; nothing sleeps to make an interleaving likely.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest

from patterns.jobqueue.stores.base import settle_each, settle_only
from patterns.jobqueue.stores.memory import MemoryStore
from patterns.jobqueue.stores.postgres.store import CommitUnknown
from patterns.jobqueue.stores.records import Claim, JobState, Settlement
from patterns.jobqueue.tasks import (
    Backoff,
    Fail,
    Interrupted,
    Phase,
    PhaseError,
    Retry,
    TaskRegistry,
)
from patterns.jobqueue.worker.worker import Outcome, Step, Worker, WorkerReport, WorkerState
from tests.support import (
    MUST_HAPPEN,
    STAYS_BLOCKED,
    FakeClock,
    Gate,
    elapsed,
    join_or_fail,
    run_in_thread,
    wait_until,
)

# Scheduling noise allowed on top of a stop budget (generous: the CI machine is shared).
NOISE = 1.0
# An idle wait no test could ever sit out: a test that finishes proves nobody waited for it.
FOREVER = 600.0
# The lease, in the fake clock's seconds: longer than FOREVER, so that a heartbeat
# interval of FOREVER is valid (shorter than the lease) and never elapses in a test.
LEASE = 1_000.0

TERMINAL = ("complete", "fail", "retry", "release", "mark_cancelled")


class RecordingStore:
    """A real `MemoryStore` behind a recorder; a fake around the code under test, not a mock.

    * ``events`` gets ``("store", method, job_id)`` for every claimed job and every
      terminal call that the store accepted; the tests' hooks and handlers append to
      the same list, so the order of store calls and hooks can be asserted.
    * ``fail_next[method]``: exceptions raised by the next calls of ``method``, one each;
      ``fail_always[method]``: raised by every call.
    * ``park[method]``: a `Gate` the next call of ``method`` waits at before it runs.
    * ``accepted[token]``: the terminal calls each claim got accepted, to check that
      every claimed job ended in exactly one outcome.
    """

    def __init__(self, clock: FakeClock, events: list[tuple[Any, ...]] | None = None) -> None:
        self.inner = MemoryStore(clock=clock)
        self.events: list[tuple[Any, ...]] = [] if events is None else events
        self.fail_next: dict[str, list[BaseException]] = {}
        self.fail_always: dict[str, BaseException] = {}
        self.park: dict[str, Gate] = {}
        self.accepted: dict[str, list[str]] = {}
        self.claims: dict[str, int] = {}  # token -> job id
        self.claim_states: list[WorkerState] = []  # the worker's state at each claim call
        self.worker: Worker | None = None  # set by the test, to record claim_states
        self.renewed_while_draining = threading.Event()
        self._lock = threading.Lock()

    def _before(self, method: str) -> None:
        gate = self.park.pop(method, None)
        if gate is not None:
            gate.arrive()
        with self._lock:
            pending = self.fail_next.get(method)
            error = pending.pop(0) if pending else self.fail_always.get(method)
        if error is not None:
            raise error

    def _terminal(self, method: str, claim: Claim, call: Callable[[], bool]) -> bool:
        self._before(method)
        accepted = call()
        with self._lock:
            if accepted:
                self.accepted.setdefault(claim.token, []).append(method)
                self.events.append(("store", method, claim.job.id))
        return accepted

    # --- the Store protocol ---

    def enqueue(self, task: str, payload: Any = None, **kwargs: Any) -> int:
        """Pass through."""
        return self.inner.enqueue(task, payload, **kwargs)

    def enqueue_many(self, jobs: Any) -> list[int]:
        """Pass through."""
        return self.inner.enqueue_many(jobs)

    def claim(self, owner: str, *, lease: float, limit: int = 1) -> list[Claim]:
        """Record the worker's state and the claimed jobs."""
        if self.worker is not None:
            self.claim_states.append(self.worker.state)
        self._before("claim")
        claims = self.inner.claim(owner, lease=lease, limit=limit)
        with self._lock:
            for claim in claims:
                self.claims[claim.token] = claim.job.id
                self.accepted.setdefault(claim.token, [])
                self.events.append(("store", "claim", claim.job.id))
        return claims

    def complete(self, claim: Claim, result: Any = None) -> bool:
        """Record if accepted."""
        return self._terminal("complete", claim, lambda: self.inner.complete(claim, result))

    def settle_many(self, items: Sequence[Settlement]) -> list[bool | Exception]:
        """One recorded single call per item (each may park or raise as told)."""
        return settle_each(self, items)

    def settle_and_claim(
        self, items: Sequence[Settlement], owner: str, *, lease: float, limit: int
    ) -> tuple[list[bool | Exception], list[Claim]]:
        """The recorded `settle_many`, no claim: the worker's claiming thread claims."""
        return settle_only(self, items, owner, lease=lease, limit=limit)

    def mark_cancelled(self, claim: Claim, reason: str) -> bool:
        """Record if accepted."""
        return self._terminal(
            "mark_cancelled", claim, lambda: self.inner.mark_cancelled(claim, reason)
        )

    def cancel(self, job_id: int) -> Any:
        """Pass through."""
        return self.inner.cancel(job_id)

    def record_worker(self, worker_id: str, **row: Any) -> None:
        """Pass through, unless told to fail."""
        self._before("record_worker")
        self.inner.record_worker(worker_id, **row)

    def forget_worker(self, worker_id: str) -> None:
        """Pass through, unless told to fail."""
        self._before("forget_worker")
        self.inner.forget_worker(worker_id)

    def workers(self) -> list[Any]:
        """Pass through."""
        return self.inner.workers()

    def fail(self, claim: Claim, error: str) -> bool:
        """Record if accepted."""
        return self._terminal("fail", claim, lambda: self.inner.fail(claim, error))

    def retry(self, claim: Claim, error: str, *, run_at: float) -> bool:
        """Record if accepted."""
        return self._terminal("retry", claim, lambda: self.inner.retry(claim, error, run_at=run_at))

    def release(self, claim: Claim) -> bool:
        """Record if accepted."""
        return self._terminal("release", claim, lambda: self.inner.release(claim))

    def renew(self, claim: Claim, *, lease: float) -> Claim | None:
        """Note a renewal made while the worker drains."""
        self._before("renew")
        renewed = self.inner.renew(claim, lease=lease)
        if self.worker is not None and self.worker.state is WorkerState.DRAINING:
            self.renewed_while_draining.set()
        return renewed

    def get(self, job_id: int) -> Any:
        """Pass through."""
        return self.inner.get(job_id)

    def counts(self) -> dict[str, int]:
        """Pass through."""
        return self.inner.counts()

    def next_due(self) -> float | None:
        """Pass through."""
        return self.inner.next_due()

    def purge(self, *, older_than: float | None = None) -> int:
        """Pass through."""
        return self.inner.purge(older_than=older_than)

    def clock(self) -> float:
        """Pass through."""
        return self.inner.clock()

    def subscribe(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Pass through."""
        return self.inner.subscribe(callback)

    def close(self) -> None:
        """Pass through."""
        self.inner.close()


def assert_one_outcome_per_claim(store: RecordingStore, *, unsettled: tuple[int, ...] = ()) -> None:
    """Every claim got exactly one accepted terminal call, except the ones left unsettled."""
    for token, job_id in store.claims.items():
        expected = 0 if job_id in unsettled else 1
        assert len(store.accepted[token]) == expected, (job_id, store.accepted[token])


def recording_registry(events: list[tuple[Any, ...]], errors: list[PhaseError]) -> TaskRegistry:
    """A registry whose four hooks append to ``events`` (and ``errors``)."""

    def on_unexpected_error(error: PhaseError) -> None:
        errors.append(error)
        events.append(("hook", "on_unexpected_error", error.phase.value))

    return TaskRegistry(
        on_complete=lambda job, result: events.append(("hook", "on_complete", job.id)),
        on_failure=lambda job, error, decision: events.append(("hook", "on_failure", job.id)),
        on_unreadiness=lambda job, decision: events.append(("hook", "on_unreadiness", job.id)),
        on_unexpected_error=on_unexpected_error,
    )


def make_worker(store: RecordingStore, tasks: TaskRegistry, clock: FakeClock, **kw: Any) -> Worker:
    """A worker with test defaults: one thread, no polling, the fake clock, a named lease."""
    options: dict[str, Any] = {
        "concurrency": 1,
        "poll_interval": FOREVER,
        "stop_timeout": MUST_HAPPEN,
        "lease": LEASE,
        "heartbeat_interval": FOREVER,
        "name": "w1",
        "clock": clock,
    }
    options.update(kw)
    worker = Worker(store, tasks, **options)
    store.worker = worker
    return worker


def job_threads(worker: Worker) -> list[threading.Thread]:
    """The worker's handler threads, which outlive stop() when a job ignores its token."""
    return [t for t in threading.enumerate() if t.name.startswith(f"{worker.name}-job")]


@contextmanager
def running(worker: Worker, *gates: Gate) -> Iterator[Worker]:
    """Start ``worker``; on the way out open every gate and make sure it stopped."""
    worker.start()
    try:
        yield worker
    finally:
        for gate in gates:
            gate.open()
        worker.stop(MUST_HAPPEN)
        for thread in job_threads(worker):
            join_or_fail(thread)


def wait_until_idle(worker: Worker) -> None:
    """Block until the worker's claiming thread sits in its idle wait (after an empty claim)."""
    deadline = time.monotonic() + MUST_HAPPEN
    while time.monotonic() < deadline:
        for thread in threading.enumerate():
            if thread.name != f"{worker.name}-claimer":
                continue
            frame = sys._current_frames().get(thread.ident or -1)
            while frame is not None:
                caller = frame.f_back
                in_wait = frame.f_code is threading.Event.wait.__code__
                if (
                    in_wait
                    and caller is not None
                    and caller.f_code.co_name == "_claim_until_stopped"
                ):
                    return
                frame = caller
        time.sleep(0.001)  # polling an observation, not waiting for a race
    raise AssertionError(f"{worker.name} was never seen idle")


def raising_base(error: BaseException) -> Callable[..., Any]:
    """A handler or hook that raises ``error`` (any BaseException) every time."""

    def fn(*args: Any) -> Any:
        raise error

    return fn


def run_until_empty(worker: Worker) -> WorkerReport:
    """Run ``worker`` (with exit_when_empty) in a thread until it stops by itself."""
    thread, outcome = run_in_thread(worker.run, "worker-main")
    join_or_fail(thread)
    assert "error" not in outcome, outcome
    report: WorkerReport = outcome["result"]
    return report


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock shared by the store and the worker."""
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> RecordingStore:
    """A recording store on a memory store with the fake clock."""
    return RecordingStore(clock)


# --- Proletarian's shutdown table ---------------------------------------------------------------


def test_shutdown_table_an_idle_worker_stops_at_once(
    store: RecordingStore, clock: FakeClock
) -> None:
    """A worker waiting out a long poll interval leaves on stop() without waiting for it."""
    shutdowns: list[WorkerReport] = []
    worker = make_worker(
        store, TaskRegistry(), clock, poll_interval=FOREVER, on_shutdown=shutdowns.append
    )
    with running(worker):
        wait_until_idle(worker)
        with elapsed() as took:
            report = worker.stop(MUST_HAPPEN)
    assert took() < NOISE  # against a poll interval of FOREVER
    assert report.terminated
    assert report.outcomes == {}
    assert WorkerState.CANCELLING not in report.phases  # nothing was running to cancel
    assert shutdowns == [report]
    assert worker.state is WorkerState.STOPPED


def test_shutdown_table_a_job_blocked_in_ctx_sleep_is_released_unchanged_and_runs_after_restart(
    store: RecordingStore, clock: FakeClock
) -> None:
    """Interrupted is not failed: run_at and attempts are kept, and the next worker runs it."""
    tasks = TaskRegistry()
    started = threading.Event()
    runs: list[int] = []

    @tasks.task
    def long_job(payload, ctx):
        runs.append(ctx.attempt)
        if len(runs) == 1:
            started.set()
            ctx.sleep(FOREVER)  # blocked here when the stop comes

    job_id = store.enqueue("long_job", {"n": 1})
    before = store.get(job_id)
    worker = make_worker(store, tasks, clock, cancel_timeout=MUST_HAPPEN)  # cancel at once
    with running(worker):
        assert started.wait(MUST_HAPPEN)
        report = worker.stop()

    assert report.terminated
    assert report.released == (job_id,)
    assert report.outcomes == {job_id: Outcome.RELEASED}
    after = store.get(job_id)
    assert after.state is JobState.QUEUED
    assert (after.run_at, after.attempts, after.last_error) == (before.run_at, 0, None)

    restarted = make_worker(store, tasks, clock, name="w2", exit_when_empty=True)
    assert run_until_empty(restarted).terminated
    assert store.get(job_id).state is JobState.DONE
    assert runs == [1, 1]  # the interrupted run did not use up an attempt


def test_whoever_sees_cancelling_finds_every_running_jobs_token_already_cancelled(
    store: RecordingStore, clock: FakeClock
) -> None:
    """The state says CANCELLING only once every running job's token is cancelled.

    Read where the state changes: a log handler runs inside the move to CANCELLING, as a
    thread that polls ``worker.state`` could run just after it. The job is then either
    told already, or never sees the state before its token (a test that waits for
    CANCELLING and then lets the job look at its token relies on this).
    """
    tasks = TaskRegistry()
    started = threading.Event()
    tokens: list[Any] = []
    seen: list[bool] = []  # the job's token.cancelled, when the state became CANCELLING

    @tasks.task
    def long_job(payload, ctx):
        tokens.append(ctx.token)
        started.set()
        ctx.sleep(FOREVER)  # until cancelled

    class AtCancelling(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if getattr(record, "state", None) is WorkerState.CANCELLING:
                seen.append(tokens[0].cancelled)

    store.enqueue("long_job")
    worker = make_worker(store, tasks, clock, cancel_timeout=MUST_HAPPEN)  # cancel at once
    log = logging.getLogger("patterns.jobqueue.worker")
    handler, level = AtCancelling(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)  # the state changes are logged at INFO
    try:
        with running(worker):
            assert started.wait(MUST_HAPPEN)
            report = worker.stop()
    finally:
        log.removeHandler(handler)
        log.setLevel(level)

    assert seen == [True]
    assert WorkerState.CANCELLING in report.phases
    assert report.outcomes == {1: Outcome.RELEASED}


def test_shutdown_table_a_job_that_ends_during_the_drain_completes_without_being_cancelled(
    store: RecordingStore, clock: FakeClock
) -> None:
    """DRAINING lets running jobs finish: no token is cancelled if they end within its budget."""
    tasks = TaskRegistry()
    gate = Gate("job mid-work")
    tokens: list[Any] = []

    @tasks.task
    def job(payload, ctx):
        tokens.append(ctx.token)
        gate.arrive()
        return "finished"

    job_id = store.enqueue("job")
    worker = make_worker(store, tasks, clock)
    with running(worker, gate):
        gate.wait_reached()
        stopper, outcome = run_in_thread(worker.stop, "stopper")
        assert worker.wait_stop_requested(MUST_HAPPEN)
        gate.open()
        join_or_fail(stopper)

    report = outcome["result"]
    assert report.terminated
    assert report.completed == (job_id,)
    assert WorkerState.CANCELLING not in report.phases
    assert not tokens[0].cancelled
    assert store.get(job_id).state is JobState.DONE


def test_shutdown_table_a_job_ignoring_its_token_finishes_within_the_budget_and_is_done(
    store: RecordingStore, clock: FakeClock
) -> None:
    """A CPU-bound job that never checks its token runs to its end if that is within the budget."""
    tasks = TaskRegistry()
    gate = Gate("cpu-bound job")
    cancelled_seen = threading.Event()

    @tasks.task
    def crunch(payload, ctx):
        ctx.token.on_cancel(cancelled_seen.set)  # watches the cancel, does not obey it
        gate.arrive()
        return 42

    job_id = store.enqueue("crunch")
    worker = make_worker(store, tasks, clock, cancel_timeout=MUST_HAPPEN)
    with running(worker, gate):
        gate.wait_reached()
        stopper, outcome = run_in_thread(worker.stop, "stopper")
        assert cancelled_seen.wait(MUST_HAPPEN)  # CANCELLING has begun; the job goes on
        gate.open()
        join_or_fail(stopper)

    report = outcome["result"]
    assert report.terminated
    assert report.outcomes == {job_id: Outcome.DONE}
    assert store.get(job_id).state is JobState.DONE


def test_shutdown_table_a_job_ignoring_its_token_past_the_budget_is_reported_and_released(
    store: RecordingStore, clock: FakeClock
) -> None:
    """stop() returns on its deadline naming the job and giving its attempt back: never failed."""
    tasks = TaskRegistry()
    gate = Gate("stuck job")
    shutdowns: list[WorkerReport] = []

    @tasks.task
    def stuck(payload, ctx):
        gate.arrive()

    job_id = store.enqueue("stuck", max_attempts=1)  # kept under its lease, it would fail
    worker = make_worker(store, tasks, clock, on_shutdown=shutdowns.append)
    with running(worker, gate):
        gate.wait_reached()
        with elapsed() as took:
            report = worker.stop(0.2)
        assert took() < 0.2 + NOISE
        job = store.get(job_id)
        assert (job.state, job.attempts, job.lease_owner) == (JobState.QUEUED, 0, None)

    # The handler ended after the report: its outcome was refused (fencing).
    wait_until(lambda: worker.stats().lost == 1, "the late outcome refused")
    assert store.get(job_id).state is JobState.QUEUED
    assert not report.terminated
    # The job, then its handler thread (its own "ended" event was not set).
    assert (report.still_running, report.still_running_ids) == (
        (f"job {job_id}", "w1-job_0"),
        (job_id,),
    )
    assert report.released_running_ids == (job_id,)
    assert set(report.phases) == {WorkerState.DRAINING, WorkerState.CANCELLING}
    assert shutdowns == [report]
    said = f"still running [{job_id}] (released at the deadline [{job_id}]: attempts given back)"
    assert said in report.summary()
    [rerun] = store.inner.claim("restart", lease=LEASE)  # a restart runs it, first attempt
    assert (rerun.job.id, rerun.job.attempts) == (job_id, 1)


def test_a_job_still_running_whose_release_fails_at_the_deadline_keeps_its_lease(
    store: RecordingStore, clock: FakeClock
) -> None:
    """If the deadline's release raises, the report says the job keeps its lease."""
    tasks = TaskRegistry()
    gate = Gate("stuck job")

    @tasks.task
    def stuck(payload, ctx):
        gate.arrive()

    job_id = store.enqueue("stuck")
    worker = make_worker(store, tasks, clock)
    with running(worker, gate):
        gate.wait_reached()
        store.fail_always["release"] = boom("release")
        report = worker.stop(0.2)
        assert store.get(job_id).state is JobState.RUNNING
    assert report.released_running_ids == ()
    assert f"(they keep their lease: [{job_id}])" in report.summary()


@pytest.mark.parametrize("prefetch", [0, None], ids=["prefetch=0", "default"])
def test_shutdown_table_no_job_is_claimed_after_stop_begins_even_when_a_handler_swallowed_it(
    store: RecordingStore, clock: FakeClock, prefetch: int | None
) -> None:
    """The claimer reads the worker's state, not a token: a swallowed stop changes nothing.

    With the default prefetch (four, for one thread), the first claim also took the next
    four jobs: the stop releases them unchanged, never run.
    """
    tasks = TaskRegistry()
    started = threading.Event()
    ran: list[int] = []

    @tasks.task
    def swallow(payload, ctx):
        started.set()
        try:
            ctx.sleep(FOREVER)
        except Interrupted:
            return "carried on"  # the mistake Proletarian cannot survive

    @tasks.task
    def fast(payload, ctx):
        ran.append(ctx.job_id)

    first = store.enqueue("swallow")
    others = [store.enqueue("fast", i) for i in range(5)]
    chosen = {} if prefetch is None else {"prefetch": prefetch}
    worker = make_worker(store, tasks, clock, cancel_timeout=MUST_HAPPEN, **chosen)
    with running(worker):
        assert started.wait(MUST_HAPPEN)
        report = worker.stop()

    assert report.terminated
    prefetched = {} if prefetch == 0 else dict.fromkeys(others[:4], Outcome.RELEASED)
    assert report.outcomes == {first: Outcome.DONE, **prefetched}
    assert ran == []
    assert store.claim_states == [WorkerState.RUNNING]  # one claim, before the stop
    for job_id in others:
        job = store.get(job_id)
        assert (job.state, job.attempts) == (JobState.QUEUED, 0)


def test_a_claim_in_flight_when_the_stop_begins_is_released_unchanged_and_never_run(
    store: RecordingStore, clock: FakeClock
) -> None:
    """Jobs a racing claim took after stop began go straight back, attempts given back."""
    tasks = TaskRegistry()
    ran: list[int] = []
    tasks.task(name="fast")(lambda payload, ctx: ran.append(ctx.job_id))
    ids = [store.enqueue("fast", i) for i in range(3)]
    gate = Gate("claim in flight")
    store.park["claim"] = gate
    worker = make_worker(store, tasks, clock, concurrency=4)
    with running(worker, gate):
        gate.wait_reached()
        worker.request_stop()  # the stop begins while the claim is under way
        gate.open()
        report = worker.stop()

    assert report.terminated
    assert report.released == tuple(ids)
    assert ran == []
    for job_id in ids:
        job = store.get(job_id)
        assert (job.state, job.attempts) == (JobState.QUEUED, 0)
    assert_one_outcome_per_claim(store)


def test_a_handler_error_on_the_way_out_of_a_cancelled_job_releases_it(
    store: RecordingStore, clock: FakeClock
) -> None:
    """An exception that wraps the interrupt still means "interrupted": released, not retried."""
    tasks = TaskRegistry()
    started = threading.Event()

    @tasks.task
    def wraps(payload, ctx):
        started.set()
        try:
            ctx.sleep(FOREVER)
        except Interrupted as exc:
            raise RuntimeError("cleanup failed") from exc

    job_id = store.enqueue("wraps")
    worker = make_worker(store, tasks, clock, cancel_timeout=MUST_HAPPEN)
    with running(worker):
        assert started.wait(MUST_HAPPEN)
        report = worker.stop()
    assert report.outcomes == {job_id: Outcome.RELEASED}
    assert store.get(job_id).attempts == 0


def test_the_heartbeat_keeps_renewing_leases_while_draining(
    store: RecordingStore, clock: FakeClock
) -> None:
    """A live job is never declared dead during the drain: its lease is still renewed."""
    tasks = TaskRegistry()
    gate = Gate("job during the drain")
    tasks.task(name="job")(lambda payload, ctx: gate.arrive())
    job_id = store.enqueue("job")
    worker = make_worker(store, tasks, clock, heartbeat_interval=0.01)
    with running(worker, gate):
        gate.wait_reached()
        stopper, outcome = run_in_thread(worker.stop, "stopper")
        assert store.renewed_while_draining.wait(MUST_HAPPEN)
        gate.open()
        join_or_fail(stopper)
    assert outcome["result"].outcomes == {job_id: Outcome.DONE}


# --- fencing ----------------------------------------------------------------------------------


def test_a_worker_whose_lease_was_taken_over_cannot_complete_the_job(
    store: RecordingStore, clock: FakeClock
) -> None:
    """Once another claim took the expired lease, the old worker's success is refused."""
    tasks = TaskRegistry()
    gate = Gate("paused past its lease")
    completions: list[int] = []
    tasks.on_complete = lambda job, result: completions.append(job.id)
    tasks.task(name="slow")(lambda payload, ctx: gate.arrive())
    job_id = store.enqueue("slow")
    worker = make_worker(store, tasks, clock, lease=LEASE)
    with running(worker, gate):
        gate.wait_reached()
        clock.advance(LEASE + 1)  # the lease expires while the handler is paused
        [takeover] = store.inner.claim("intruder", lease=LEASE)
        stopper, outcome = run_in_thread(worker.stop, "stopper")
        assert worker.wait_stop_requested(MUST_HAPPEN)  # the stop began with the job in hand
        gate.open()
        join_or_fail(stopper)
    report = outcome["result"]

    assert worker.stats().lost == 1
    assert worker.stats().done == 0
    assert completions == []  # on_complete never runs for a refused outcome
    assert report.outcomes == {job_id: Outcome.LOST}
    job = store.get(job_id)
    assert (job.state, job.lease_owner, job.attempts) == (JobState.RUNNING, takeover.token, 2)
    assert store.inner.complete(takeover)  # the newer claim's outcome stands
    assert store.get(job_id).state is JobState.DONE


def test_a_lease_lost_to_a_takeover_cancels_the_job_through_the_heartbeat(
    store: RecordingStore, clock: FakeClock
) -> None:
    """The heartbeat notices the lost lease and cancels the job, whose release is then refused."""
    tasks = TaskRegistry()
    started = threading.Event()
    ended = threading.Event()
    reasons: list[str] = []

    @tasks.task
    def cooperative(payload, ctx):
        started.set()
        try:
            ctx.sleep(FOREVER)
        except Interrupted as exc:
            reasons.append(exc.reason)
            raise
        finally:
            ended.set()

    store.enqueue("cooperative")
    worker = make_worker(store, tasks, clock, lease=LEASE, heartbeat_interval=0.01)
    with running(worker):
        assert started.wait(MUST_HAPPEN)
        clock.advance(LEASE + 1)
        store.inner.claim("intruder", lease=LEASE)
        # The next heartbeat finds the lease gone and cancels the job's token.
        assert ended.wait(MUST_HAPPEN)
        worker.stop()
    assert reasons == ["lease lost"]
    assert worker.stats().lost == 1


# --- qdolor's lifecycle, in order ----------------------------------------------------------------


def lifecycle_tasks(events: list[tuple[Any, ...]], errors: list[PhaseError]) -> TaskRegistry:
    """Tasks for each path of qdolor's lifecycle; ready, handler and policies log to events."""
    tasks = recording_registry(events, errors)

    def ready(answer: bool) -> Callable[[Any], bool]:
        def check(job: Any) -> bool:
            events.append(("ready", job.id))
            return answer

        return check

    def policy(decision: Any) -> Callable[..., Any]:
        def decide(job: Any, *error: Any) -> Any:
            name = "get_failure_policy" if error else "get_unreadiness_policy"
            events.append((name, job.id))
            return decision

        return decide

    def succeeds(payload, ctx):
        events.append(("execute", ctx.job_id))

    def fails(payload, ctx):
        events.append(("execute", ctx.job_id))
        raise ValueError("bad input")

    tasks.task(name="ok", ready=ready(True))(succeeds)
    tasks.task(name="retry", ready=ready(True), retry=policy(Retry(60.0)))(fails)
    tasks.task(name="fail", ready=ready(True), retry=policy(Fail()))(fails)
    tasks.task(name="unready", ready=ready(False), not_ready=policy(Retry(60.0)))(succeeds)
    tasks.task(name="abandon", ready=ready(False), not_ready=policy(Fail("gave up")))(succeeds)
    return tasks


@pytest.mark.parametrize(
    ("task", "expected", "final_state"),
    [
        (
            "ok",
            ["claim", "ready", "execute", "store complete", "hook on_complete"],
            JobState.DONE,
        ),
        (
            "retry",
            ["claim", "ready", "execute", "get_failure_policy", "store retry"],
            JobState.QUEUED,
        ),
        (
            "fail",
            ["claim", "ready", "execute", "get_failure_policy", "store fail", "hook on_failure"],
            JobState.FAILED,
        ),
        ("unready", ["claim", "ready", "get_unreadiness_policy", "store retry"], JobState.QUEUED),
        (
            "abandon",
            ["claim", "ready", "get_unreadiness_policy", "store fail", "hook on_unreadiness"],
            JobState.FAILED,
        ),
    ],
)
def test_lifecycle_order_store_call_first_then_hook(
    store: RecordingStore, clock: FakeClock, task: str, expected: list[str], final_state: JobState
) -> None:
    """ready, execute, the policy, then the store's outcome, then its hook (qdolor 0.2's order)."""
    errors: list[PhaseError] = []
    tasks = lifecycle_tasks(store.events, errors)
    job_id = store.enqueue(task)
    report = run_until_empty(make_worker(store, tasks, clock, exit_when_empty=True))

    assert report.terminated
    steps = [
        f"{e[0]} {e[1]}" if e[0] in ("store", "hook") else e[0]
        for e in store.events
        if e[-1] == job_id
    ]
    assert [s.replace("store claim", "claim") for s in steps] == expected
    assert store.get(job_id).state is final_state
    assert errors == []
    assert_one_outcome_per_claim(store)


def test_an_unknown_task_ends_failed_and_is_never_retried(
    store: RecordingStore, clock: FakeClock
) -> None:
    """A job nobody can run is failed with "unknown task", not dropped and not looped."""
    job_id = store.enqueue("nobody-registered-this", max_attempts=5)
    report = run_until_empty(make_worker(store, TaskRegistry(), clock, exit_when_empty=True))
    assert report.terminated
    job = store.get(job_id)
    assert (job.state, job.attempts) == (JobState.FAILED, 1)
    assert job.last_error is not None
    assert "unknown task 'nobody-registered-this'" in job.last_error


def test_retries_end_failed_once_the_jobs_attempts_are_spent(
    store: RecordingStore, clock: FakeClock
) -> None:
    """A job that always fails runs max_attempts times, back to back with no delay, then fails."""
    tasks = TaskRegistry()
    attempts: list[int] = []

    @tasks.task(retry=Backoff(base=0.0, jitter=0))
    def always(payload, ctx):
        attempts.append(ctx.attempt)
        raise OSError("service down")

    job_id = store.enqueue("always", max_attempts=3)
    run_until_empty(make_worker(store, tasks, clock, exit_when_empty=True))
    job = store.get(job_id)
    assert attempts == [1, 2, 3]
    assert job.state is JobState.FAILED
    assert job.last_error == "OSError: service down (attempt 3 of 3: none left)"


def test_a_retry_is_scheduled_after_the_policys_delay_on_the_stores_clock(
    store: RecordingStore, clock: FakeClock
) -> None:
    """run_at of a retried job is the clock's now plus the delay the policy chose."""
    tasks = TaskRegistry()
    tasks.task(name="flaky", retry=Backoff(base=5.0, jitter=0))(raising_base(ValueError("once")))
    job_id = store.enqueue("flaky")
    start = clock()
    run_until_empty(make_worker(store, tasks, clock, exit_when_empty=True))
    job = store.get(job_id)
    assert (job.state, job.attempts, job.run_at) == (JobState.QUEUED, 1, start + 5.0)
    assert job.last_error == "ValueError: once"


# --- every phase of unexpected error --------------------------------------------------------------


def boom(phase: str) -> RuntimeError:
    """The error injected into one phase."""
    return RuntimeError(f"injected into {phase}")


def raising(phase: str) -> Callable[..., Any]:
    """A hook or policy that raises the injected error on its first call, then returns None."""
    calls = iter(range(1, 1_000_000))

    def hook(*args: Any) -> Any:
        if next(calls) == 1:
            raise boom(phase)

    return hook


def phase_scenario(
    phase: Phase, tasks: TaskRegistry, store: RecordingStore, events: list[tuple[Any, ...]]
) -> str:
    """Configure ``tasks`` and ``store`` so that ``phase`` fails once; return the task to run."""
    ok = lambda payload, ctx: events.append(("execute", ctx.job_id))  # noqa: E731

    def fails(payload, ctx):
        raise ValueError("handler failed")

    if phase is Phase.READY:
        tasks.task(name="t", ready=raising("ready"))(ok)
    elif phase is Phase.ACK:
        store.fail_next["complete"] = [boom("ack")]
        tasks.task(name="t")(ok)
    elif phase is Phase.ON_COMPLETE:
        tasks.on_complete = raising("on_complete")
        tasks.task(name="t")(ok)
    elif phase is Phase.GET_FAILURE_POLICY:
        tasks.task(name="t", retry=raising("get_failure_policy"))(fails)
    elif phase is Phase.REQUEUE:
        store.fail_next["retry"] = [boom("requeue")]
        tasks.task(name="t", retry=lambda job, error: Retry(60.0))(fails)
    elif phase is Phase.NACK:
        store.fail_next["fail"] = [boom("nack")]
        tasks.task(name="t", retry=lambda job, error: Fail())(fails)
    elif phase is Phase.ON_FAILURE:
        tasks.on_failure = raising("on_failure")
        tasks.task(name="t", retry=lambda job, error: Fail())(fails)
    elif phase is Phase.GET_UNREADINESS_POLICY:
        tasks.task(name="t", ready=lambda job: False, not_ready=raising(phase.value))(ok)
    elif phase is Phase.ABANDON:
        store.fail_next["fail"] = [boom("abandon")]
        tasks.task(name="t", ready=lambda job: False, not_ready=lambda job: Fail("no"))(ok)
    elif phase is Phase.ON_UNREADINESS:
        tasks.on_unreadiness = raising("on_unreadiness")
        tasks.task(name="t", ready=lambda job: False, not_ready=lambda job: Fail("no"))(ok)
    elif phase is Phase.DEQUEUE:
        store.fail_next["claim"] = [boom("dequeue")]
        tasks.task(name="t")(ok)
    else:
        raise AssertionError(phase)
    return "t"


JOB_PHASES = [
    Phase.READY,
    Phase.ACK,
    Phase.ON_COMPLETE,
    Phase.GET_FAILURE_POLICY,
    Phase.REQUEUE,
    Phase.NACK,
    Phase.ON_FAILURE,
    Phase.GET_UNREADINESS_POLICY,
    Phase.ABANDON,
    Phase.ON_UNREADINESS,
    Phase.DEQUEUE,
]


@pytest.mark.parametrize("phase", JOB_PHASES, ids=[p.value for p in JOB_PHASES])
def test_an_error_in_any_phase_is_reported_with_its_phase_and_the_job_still_ends_once(
    store: RecordingStore, clock: FakeClock, phase: Phase
) -> None:
    """on_unexpected_error gets a PhaseError naming the phase; every claim ends in one outcome."""
    errors: list[PhaseError] = []
    tasks = recording_registry(store.events, errors)
    task = phase_scenario(phase, tasks, store, store.events)
    tasks.task(name="after")(lambda payload, ctx: store.events.append(("execute", ctx.job_id)))
    job_id = store.enqueue(task)
    after_id = store.enqueue("after")
    # A failed claim is retried after one poll interval: keep that short here.
    worker = make_worker(store, tasks, clock, exit_when_empty=True, poll_interval=0.01)
    report = run_until_empty(worker)

    assert report.terminated
    [error] = errors
    assert error.phase is phase
    assert isinstance(error.__cause__, RuntimeError)
    assert str(error.__cause__) == f"injected into {phase.value}"
    if phase is Phase.DEQUEUE:
        assert error.job is None
    else:
        assert error.job is not None
        assert error.job.id == job_id
    assert list(report.errors) == errors
    assert worker.stats().errors == 1
    assert_one_outcome_per_claim(store)
    assert store.get(after_id).state is JobState.DONE  # the worker went on working


def test_an_error_in_the_heartbeat_is_reported_and_the_job_still_completes(
    store: RecordingStore, clock: FakeClock
) -> None:
    """A renew that raises is a heartbeat PhaseError; the job and the worker carry on."""
    errors: list[PhaseError] = []
    tasks = recording_registry(store.events, errors)
    seen = threading.Event()
    tasks.on_unexpected_error = lambda error: (errors.append(error), seen.set())
    tasks.task(name="t")(lambda payload, ctx: seen.wait(MUST_HAPPEN))
    store.fail_always["renew"] = boom("heartbeat")
    job_id = store.enqueue("t")
    worker = make_worker(store, tasks, clock, exit_when_empty=True, heartbeat_interval=0.01)
    run_until_empty(worker)
    assert errors[0].phase is Phase.HEARTBEAT
    assert errors[0].job is not None
    assert errors[0].job.id == job_id
    assert store.get(job_id).state is JobState.DONE
    assert_one_outcome_per_claim(store)


def test_an_error_in_release_leaves_the_job_unsettled_until_its_lease_expires(
    store: RecordingStore, clock: FakeClock
) -> None:
    """When even the release fails, the job is reported unsettled and stays leased, not lost."""
    errors: list[PhaseError] = []
    tasks = recording_registry(store.events, errors)
    started = threading.Event()

    @tasks.task
    def long_job(payload, ctx):
        started.set()
        ctx.sleep(FOREVER)

    store.fail_always["release"] = boom("release")
    job_id = store.enqueue("long_job")
    worker = make_worker(store, tasks, clock, cancel_timeout=MUST_HAPPEN)
    with running(worker):
        assert started.wait(MUST_HAPPEN)
        report = worker.stop()

    assert [e.phase for e in errors] == [Phase.RELEASE]
    assert report.outcomes == {job_id: Outcome.UNSETTLED}
    assert worker.stats().unsettled == 1
    assert store.get(job_id).state is JobState.RUNNING  # claimable again once the lease ends
    assert_one_outcome_per_claim(store, unsettled=(job_id,))
    clock.advance(LEASE + 1)
    assert [c.job.id for c in store.inner.claim("next", lease=LEASE)] == [job_id]


def test_a_job_whose_completion_can_never_be_recorded_runs_at_most_max_attempts_times(
    store: RecordingStore, clock: FakeClock
) -> None:
    """A complete() that always raises keeps the attempt spent: failed after max_attempts runs."""
    tasks = TaskRegistry()
    runs: list[int] = []
    holder: list[Worker] = []

    @tasks.task(max_attempts=3)
    def ok(payload, ctx):
        runs.append(ctx.attempt)
        if len(runs) > 6:  # the hot loop this test is about: end it, and fail below
            holder[0].request_stop("looping")

    store.fail_always["complete"] = boom("complete")
    job_id = store.enqueue("ok")
    for _ in range(6):  # each round: run what is due, then move past any backoff
        worker = make_worker(store, tasks, clock, exit_when_empty=True, poll_interval=0.01)
        holder[:] = [worker]
        run_until_empty(worker)
        if store.get(job_id).state is JobState.FAILED:
            break
        clock.advance(1_000.0)

    found = store.get(job_id)
    assert runs == [1, 2, 3]
    assert (found.state, found.attempts) == (JobState.FAILED, 3)
    assert "could not be recorded" in (found.last_error or "")


def test_a_job_whose_failure_can_never_be_recorded_is_left_to_its_lease_with_the_attempt_spent(
    store: RecordingStore, clock: FakeClock
) -> None:
    """fail() and retry() always raising: no release, one run per lease, failed at expiry."""
    tasks = TaskRegistry()
    runs: list[int] = []

    @tasks.task
    def bad(payload, ctx):
        runs.append(ctx.attempt)
        raise ValueError(f"bad {payload}")

    store.fail_always["fail"] = boom("fail")
    store.fail_always["retry"] = boom("retry")
    job_id = store.enqueue("bad", "\ud800", max_attempts=2)  # a text UTF-8 cannot hold
    worker = make_worker(store, tasks, clock, poll_interval=0.01)
    with running(worker):
        wait_until(lambda: worker.stats().settled == 1, "the first run is settled")
        found = store.get(job_id)
        assert (found.state, found.attempts) == (JobState.RUNNING, 1)
        assert_one_outcome_per_claim(store, unsettled=(job_id,))  # no release was accepted
        clock.advance(LEASE + 1)  # the lease expires: the second and last attempt
        worker.wake()
        wait_until(lambda: worker.stats().settled == 2, "the second run is settled")
        clock.advance(LEASE + 1)  # expired with its attempts spent: the next claim fails it
        worker.wake()
        wait_until(lambda: store.get(job_id).state is JobState.FAILED, "failed at expiry")
    assert runs == [1, 2]
    assert worker.stats().unsettled == 2
    assert worker.stats().released == 0


def test_a_store_whose_claim_keeps_raising_is_claimed_from_with_exponential_backoff(
    store: RecordingStore, clock: FakeClock
) -> None:
    """Claims back off (doubling from poll_interval, capped); no hot loop, no overflow."""
    store.fail_always["claim"] = boom("claim")
    worker = make_worker(store, TaskRegistry(), clock, poll_interval=0.01)
    with elapsed() as took, running(worker):
        wait_until(lambda: len(store.claim_states) >= 6, "six claims")
        spent = took()
    assert spent >= 0.01 + 0.02 + 0.04 + 0.08 + 0.16  # the five waits between six claims
    # The cap (and no overflow for a long outage): test_claimer.py, on the claimer alone.


class CommitThenBreak(RecordingStore):
    """A store whose complete() commits, then raises CommitUnknown (the reply was lost)."""

    def complete(self, claim: Claim, result: Any = None) -> bool:
        """Commit, then report the broken connection."""
        super().complete(claim)
        raise CommitUnknown("connection lost during COMMIT (injected)")


def test_a_completion_whose_commit_is_unknown_is_reported_as_unknown_not_lost_to_fencing(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Committed but unconfirmed: Outcome.UNKNOWN, no on_complete, and the log says why."""
    store = CommitThenBreak(clock)
    completed: list[int] = []
    tasks = TaskRegistry(on_complete=lambda job, result: completed.append(job.id))
    tasks.task(name="ok")(lambda payload, ctx: None)
    job_id = store.enqueue("ok")
    worker = make_worker(store, tasks, clock, exit_when_empty=True)
    with caplog.at_level(logging.WARNING, logger="patterns.jobqueue.worker"):
        run_until_empty(worker)
    assert store.get(job_id).state is JobState.DONE
    stats = worker.stats()
    assert (stats.unknown, stats.lost, stats.done) == (1, 0, 0)
    assert completed == []  # the hook runs only for an outcome known to be recorded
    text = caplog.text
    assert "outcome unknown: the commit may or may not have happened" in text
    assert "fencing" not in text


def test_a_commit_cut_off_is_one_warning_line_naming_the_job_and_the_lease_not_a_traceback(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """CommitUnknown is handled as documented, so it is logged as news, not as a crash.

    Before: ``complete failed (job 1 ...)`` at ERROR with the whole traceback (about 50
    lines for a real connection cut off by ``pg_terminate_backend``).
    """
    store = CommitThenBreak(clock)
    tasks = TaskRegistry()
    tasks.task(name="ok")(lambda payload, ctx: None)
    job_id = store.enqueue("ok")
    worker = make_worker(store, tasks, clock, exit_when_empty=True)
    with caplog.at_level(logging.DEBUG, logger="patterns.jobqueue"):
        run_until_empty(worker)
    assert worker.stats().unknown == 1
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert [r for r in caplog.records if r.exc_info] == []
    [line] = [r for r in caplog.records if "CommitUnknown" in r.getMessage()]
    assert line.levelno == logging.WARNING
    message = line.getMessage()
    assert "\n" not in message
    assert f"job {job_id}" in message
    assert "lease" in message


def test_a_completion_whose_commit_is_unknown_and_did_not_apply_is_retried(
    store: RecordingStore, clock: FakeClock
) -> None:
    """The fallback after an unknown commit is accepted only if the first did not apply."""
    store.fail_next["complete"] = [CommitUnknown("connection lost before COMMIT (injected)")]
    tasks = TaskRegistry()
    tasks.task(name="ok")(lambda payload, ctx: None)
    job_id = store.enqueue("ok")
    worker = make_worker(store, tasks, clock, exit_when_empty=True)
    run_until_empty(worker)
    found = store.get(job_id)
    assert (found.state, found.attempts) == (JobState.QUEUED, 1)  # attempt kept: bounded
    assert worker.stats().retried == 1


def test_a_release_at_the_deadline_whose_commit_is_unknown_is_made_again(
    store: RecordingStore, clock: FakeClock
) -> None:
    """A stop's release that broke in COMMIT is repeated: the job is never left to fail."""
    tasks = TaskRegistry()
    gate = Gate("stuck job")

    @tasks.task
    def stuck(payload, ctx):
        gate.arrive()

    job_id = store.enqueue("stuck", max_attempts=1)
    worker = make_worker(store, tasks, clock)
    with running(worker, gate):
        gate.wait_reached()
        store.fail_next["release"] = [CommitUnknown("connection lost before COMMIT (injected)")]
        report = worker.stop(0.2)
        found = store.get(job_id)
        assert (found.state, found.attempts) == (JobState.QUEUED, 0)
    assert report.released_running_ids == (job_id,)


@pytest.mark.parametrize("exit_when_empty", [False, True])
def test_a_worker_whose_store_fails_every_claim_past_the_outage_limit_stops_with_the_reason(
    store: RecordingStore, clock: FakeClock, exit_when_empty: bool
) -> None:
    """A store unusable for store_outage_limit stops the worker; a failed claim is not 'empty'."""
    store.fail_always["claim"] = boom("claim")
    worker = make_worker(
        store,
        TaskRegistry(),
        clock,
        poll_interval=0.01,
        store_outage_limit=0.2,
        exit_when_empty=exit_when_empty,
    )
    with elapsed() as took:
        report = run_until_empty(worker)
    assert took() >= 0.2
    assert report.failure is not None
    assert "store_outage_limit" in report.failure
    assert "injected into claim" in report.failure
    assert "stopped because the store failed every claim" in report.summary()
    assert len(store.claim_states) >= 2  # it retried before giving up


def test_a_worker_whose_claims_succeed_again_within_the_limit_goes_on(
    store: RecordingStore, clock: FakeClock
) -> None:
    """Failures shorter than the limit only back off; the worker then runs the job."""
    store.fail_next["claim"] = [boom("claim"), boom("claim")]
    tasks = TaskRegistry()
    tasks.task(name="ok")(lambda payload, ctx: None)
    job_id = store.enqueue("ok")
    worker = make_worker(
        store,
        tasks,
        clock,
        poll_interval=0.01,
        store_outage_limit=MUST_HAPPEN,
        exit_when_empty=True,
    )
    report = run_until_empty(worker)
    assert report.failure is None
    assert store.get(job_id).state is JobState.DONE


def test_an_error_in_on_shutdown_is_reported_in_the_final_report(
    store: RecordingStore, clock: FakeClock
) -> None:
    """on_shutdown runs once; if it raises, the report carries an on_shutdown PhaseError."""
    errors: list[PhaseError] = []
    calls: list[WorkerReport] = []

    def on_shutdown(report: WorkerReport) -> None:
        calls.append(report)
        raise boom("on_shutdown")

    worker = make_worker(
        store, recording_registry(store.events, errors), clock, on_shutdown=on_shutdown
    )
    worker.start()
    report = worker.stop()
    assert len(calls) == 1
    assert report.errors[-1].phase is Phase.ON_SHUTDOWN
    assert [e.phase for e in errors] == [Phase.ON_SHUTDOWN]
    assert worker.stop() is report


def test_an_error_hook_that_raises_is_logged_and_the_worker_goes_on(
    store: RecordingStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """on_unexpected_error failing is logged, not fatal: no recursion, no dead thread."""
    tasks = TaskRegistry(on_complete=raising("on_complete"), on_unexpected_error=raising("hook"))
    tasks.task(name="t")(lambda payload, ctx: None)
    ids = [store.enqueue("t") for _ in range(2)]
    report = run_until_empty(make_worker(store, tasks, clock, exit_when_empty=True))
    assert report.terminated
    assert report.thread_failures == ()
    assert [store.get(i).state for i in ids] == [JobState.DONE, JobState.DONE]
    assert "on_unexpected_error raised; ignored" in caplog.text


def test_a_worker_thread_that_dies_is_recorded_and_stops_the_worker(
    store: RecordingStore, clock: FakeClock
) -> None:
    """A BaseException escaping a commit is no silent death: a ThreadFailure, a stop.

    The one job is the last in hand, so its own handler thread commits it (and dies).
    """
    tasks = TaskRegistry()
    tasks.task(name="t")(lambda payload, ctx: None)
    job_id = store.enqueue("t")

    def die_after_commit(step: Step, claim: Any, phase: Any) -> None:
        if step is Step.AFTER_COMMIT:
            raise SystemExit(3)

    worker = make_worker(store, tasks, clock, step_hook=die_after_commit)
    with running(worker):
        assert worker.wait_stop_requested(MUST_HAPPEN)
        report = worker.stop()
    [failure] = report.thread_failures
    assert failure.exc_type is SystemExit
    assert failure.thread_name.startswith("w1-job")  # the handler thread that led the commit
    assert store.get(job_id).state is JobState.DONE  # the store call had already happened


# --- claiming and waking ----------------------------------------------------------------------


def test_due_jobs_are_claimed_back_to_back_without_waiting_for_the_poll_interval(
    store: RecordingStore, clock: FakeClock
) -> None:
    """Twenty due jobs all run although the poll interval is longer than the whole test."""
    tasks = TaskRegistry()
    tasks.task(name="t")(lambda payload, ctx: None)
    ids = [store.enqueue("t", i) for i in range(20)]
    worker = make_worker(store, tasks, clock, concurrency=3, exit_when_empty=True)
    report = run_until_empty(worker)
    assert report.terminated
    assert {store.get(i).state for i in ids} == {JobState.DONE}
    assert worker.stats().done == 20
    assert worker.stats().claimed == 20


def test_an_enqueue_through_the_worker_ends_its_idle_wait_at_once(
    store: RecordingStore, clock: FakeClock
) -> None:
    """The idle wait is an event: an in-process enqueue wakes it, whatever the poll interval."""
    tasks = TaskRegistry()
    done = threading.Event()
    tasks.on_complete = lambda job, result: done.set()
    tasks.task(name="t")(lambda payload, ctx: None)
    worker = make_worker(store, tasks, clock, poll_interval=FOREVER)
    with running(worker):
        wait_until_idle(worker)  # the first claim found nothing: idle for FOREVER
        job_id = worker.enqueue("t")
        assert done.wait(MUST_HAPPEN)
    assert store.get(job_id).state is JobState.DONE


def test_exit_when_empty_waits_for_a_job_of_a_dead_worker_until_its_lease_expires(
    store: RecordingStore, clock: FakeClock
) -> None:
    """A job running elsewhere keeps the worker alive; once its lease expires it is run here."""
    tasks = TaskRegistry()
    tasks.task(name="t")(lambda payload, ctx: None)
    job_id = store.enqueue("t")
    store.inner.claim("dead-worker", lease=LEASE)
    worker = make_worker(store, tasks, clock, exit_when_empty=True)
    thread, outcome = run_in_thread(worker.run, "worker-main")
    try:
        assert not worker.wait_stop_requested(STAYS_BLOCKED)  # a job is running somewhere
        clock.advance(LEASE + 1)
        worker.wake()
    finally:
        join_or_fail(thread)
    assert outcome["result"].terminated
    job = store.get(job_id)
    assert (job.state, job.attempts) == (JobState.DONE, 2)


def test_exit_when_empty_leaves_jobs_scheduled_for_later_in_the_queue(
    store: RecordingStore, clock: FakeClock
) -> None:
    """Only due jobs are waited for: a job for tomorrow stays queued, untouched."""
    tasks = TaskRegistry()
    tasks.task(name="t")(lambda payload, ctx: None)
    later = store.enqueue("t", delay=86_400)
    report = run_until_empty(make_worker(store, tasks, clock, exit_when_empty=True))
    assert report.terminated
    job = store.get(later)
    assert (job.state, job.attempts) == (JobState.QUEUED, 0)


# --- the lifecycle contract ------------------------------------------------------------------


def test_every_state_transition_is_logged_in_order(
    store: RecordingStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """RUNNING, DRAINING, CANCELLING, STOPPED: one log event per transition, in that order."""
    tasks = TaskRegistry()
    started = threading.Event()

    @tasks.task
    def long_job(payload, ctx):
        started.set()
        ctx.sleep(FOREVER)

    store.enqueue("long_job")
    caplog.set_level(logging.INFO, logger="patterns.jobqueue.worker")
    worker = make_worker(store, tasks, clock, cancel_timeout=MUST_HAPPEN)
    with running(worker):
        assert started.wait(MUST_HAPPEN)
        worker.stop()
    events = [getattr(r, "event", None) for r in caplog.records if hasattr(r, "event")]
    assert events == ["worker.running", "worker.draining", "worker.cancelling", "worker.stopped"]


def test_stop_is_idempotent_and_on_shutdown_runs_exactly_once(
    store: RecordingStore, clock: FakeClock
) -> None:
    """Two concurrent stops and a third later all get the one report; on_shutdown runs once."""
    tasks = TaskRegistry()
    gate = Gate("job holding the stop")
    tasks.task(name="t")(lambda payload, ctx: gate.arrive())
    calls: list[WorkerReport] = []
    store.enqueue("t")
    worker = make_worker(store, tasks, clock, on_shutdown=calls.append)
    with running(worker, gate):
        gate.wait_reached()
        first, first_outcome = run_in_thread(worker.stop, "stop-1")
        assert worker.wait_stop_requested(MUST_HAPPEN)
        second, second_outcome = run_in_thread(worker.stop, "stop-2")
        gate.open()
        join_or_fail(first)
        join_or_fail(second)
    report = first_outcome["result"]
    assert second_outcome["result"] is report
    assert worker.stop() is report
    assert worker.stop(0) is report  # whatever the timeout
    assert calls == [report]
    assert report.terminated


def test_a_stop_before_start_stops_and_a_stopped_worker_cannot_start_again(
    store: RecordingStore, clock: FakeClock
) -> None:
    """Stopping a new worker is harmless and final; start after stop is a clear error."""
    calls: list[WorkerReport] = []
    worker = make_worker(store, TaskRegistry(), clock, on_shutdown=calls.append)
    report = worker.stop()
    assert (report.terminated, report.still_running) == (True, ())
    assert worker.state is WorkerState.STOPPED
    assert calls == [report]
    with pytest.raises(RuntimeError, match="started only once"):
        worker.start()
    assert worker.stop(0) is report


def test_a_second_start_is_refused_and_a_negative_stop_timeout_is_an_error(
    store: RecordingStore, clock: FakeClock
) -> None:
    """A second start() and stop(-1) raise, and the report leads with the contract fields."""
    worker = make_worker(store, TaskRegistry(), clock)
    assert worker.stop_timeout == MUST_HAPPEN
    with worker:
        with pytest.raises(RuntimeError, match="started only once"):
            worker.start()
        with pytest.raises(ValueError, match="timeout"):
            worker.stop(-1)
        assert worker.state is WorkerState.RUNNING
    report = worker.stop()
    assert report.terminated
    assert [f.name for f in dataclasses.fields(report)[:2]] == ["terminated", "still_running"]


def test_stop_from_a_handler_is_a_request_and_request_stop_works_there(
    store: RecordingStore, clock: FakeClock
) -> None:
    """A handler cannot wait for its own pool: its stop() begins the drain and returns."""
    tasks = TaskRegistry()
    provisional: list[WorkerReport] = []
    worker = make_worker(store, tasks, clock)

    @tasks.task
    def stopper(payload, ctx):
        provisional.append(worker.stop())
        worker.request_stop("asked by a job")  # idempotent
        return ctx.stopping

    job_id = store.enqueue("stopper")
    with running(worker):
        assert worker.wait_stop_requested(MUST_HAPPEN)
        report = worker.stop()
    [early] = provisional
    assert (early.terminated, early.still_running) == (False, (f"job {job_id}", "w1-job_0"))
    assert report.outcomes == {job_id: Outcome.DONE}
    assert worker.stop() is report


def test_a_worker_is_a_context_manager_and_reports_its_stats(
    store: RecordingStore, clock: FakeClock
) -> None:
    """Entering starts it, leaving stops it; stats() counts every outcome."""
    tasks = TaskRegistry()
    done = threading.Event()
    tasks.on_complete = lambda job, result: done.set() if job.id == 2 else None
    tasks.task(name="ok")(lambda payload, ctx: None)
    tasks.task(name="bad", retry=lambda job, error: Fail())(raising_base(ValueError("x")))
    store.enqueue("bad")
    store.enqueue("ok")
    with make_worker(store, tasks, clock) as worker:
        assert done.wait(MUST_HAPPEN)
    stats = worker.stats()
    assert (stats.state, stats.claimed, stats.done, stats.failed, stats.running) == (
        WorkerState.STOPPED,
        2,
        1,
        1,
        0,
    )
    assert stats.settled == 2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"concurrency": 0},
        {"poll_interval": 0},
        {"lease": 0},
        {"stop_timeout": -1},
        {"cancel_timeout": 20.0},
    ],
)
def test_nonsense_settings_are_refused(
    store: RecordingStore, clock: FakeClock, kwargs: dict[str, float]
) -> None:
    """Zero threads, a zero poll interval or lease, or a cancel share above budget are errors."""
    with pytest.raises(ValueError, match="must"):
        make_worker(store, TaskRegistry(), clock, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"lease": 30.0, "heartbeat_interval": 30.0}, "heartbeat_interval"),
        ({"lease": 30.0, "heartbeat_interval": 45.0}, "heartbeat_interval"),
        ({"heartbeat_interval": 0}, "heartbeat_interval"),
        ({"heartbeat_interval": -1.0}, "heartbeat_interval"),
        ({"lease": math.inf}, "lease"),
        ({"lease": math.nan}, "lease"),
        ({"lease": 1e15}, "lease"),
        ({"lease": 10**400}, "lease"),
        ({"poll_interval": math.nan}, "poll_interval"),
        ({"stop_timeout": math.nan}, "stop_timeout"),
        ({"cancel_timeout": math.nan}, "cancel_timeout"),
        ({"cancel_timeout": -1.0}, "cancel_timeout"),
        ({"store_outage_limit": 0}, "store_outage_limit"),
        ({"concurrency": 10**9}, "concurrency"),
    ],
)
def test_an_interval_out_of_range_alone_or_against_the_others_is_refused_by_name(
    store: RecordingStore, clock: FakeClock, kwargs: dict[str, float], named: str
) -> None:
    """heartbeat_interval >= lease, nan, or an endless lease: ValueError naming the argument.

    (An endless poll_interval, stop_timeout or store_outage_limit means "as long as it
    takes": tests/jobqueue/test_worker_paths.py.)
    """
    with pytest.raises(ValueError, match=named):
        make_worker(store, TaskRegistry(), clock, **kwargs)


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("lease", ValueError),  # every number of seconds: one error, as every budget
        ("poll_interval", ValueError),
        ("heartbeat_interval", ValueError),
        ("concurrency", TypeError),
    ],
)
def test_a_setting_of_the_wrong_type_is_refused_by_name(
    store: RecordingStore, clock: FakeClock, name: str, error: type[Exception]
) -> None:
    """A string or a bool where a number belongs: an error naming the argument."""
    for bad in ("5", True):
        with pytest.raises(error, match=name):
            make_worker(store, TaskRegistry(), clock, **{name: bad})
