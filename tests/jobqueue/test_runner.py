"""One job's run and decision alone: a `JobRunner` with a real ledger, no settler, no `Worker`.

Each case claims one job from a `MemoryStore` on a fake clock, starts it in a real
`ClaimLedger` and calls `JobRunner.run` in the test's own thread: the runner writes
nothing, so the store is only where the claims come from, and what is checked is the
`Pending` it returns (phase, settlement, the outcome it expects) and what it reported
on the way (`Bench` records errors, hooks and steps). Nothing sleeps: the timeout case
waits for a handler's real, short deadline.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from patterns.cancellation import CancelToken
from patterns.jobqueue.stores.memory import MemoryStore
from patterns.jobqueue.stores.records import Claim, Job, JsonValue, Settle
from patterns.jobqueue.tasks import Fail, Interrupted, JobContext, Phase, Retry, TaskRegistry
from patterns.jobqueue.worker.fallback import Pending
from patterns.jobqueue.worker.ledger import ClaimLedger, Held
from patterns.jobqueue.worker.outcomes import Outcome
from patterns.jobqueue.worker.runner import JobRunner
from patterns.jobqueue.worker.states import Step
from tests.jobqueue import fakes
from tests.support import MUST_HAPPEN, FakeClock

LEASE = 1_000.0
DEADLINE = 0.05  # real seconds a timed-out handler runs before its token is cancelled


class Bench:
    """A runner wired to a real ledger and to recording callbacks."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.store = MemoryStore(clock=self.clock)
        self.root = CancelToken()
        self.cond = threading.Condition(threading.RLock())
        self.ledger = ClaimLedger(self.cond, root=self.root, slots=1, claim_at=1)
        with self.cond:
            self.ledger.accept(True)
        self.tasks = TaskRegistry()
        self.stopping = False
        self.errors: list[tuple[Phase, int | None, BaseException]] = []
        self.hooks: list[tuple[Phase, int, tuple[Any, ...]]] = []
        self.steps: list[tuple[Step, Phase | None]] = []
        shared = fakes.shared(
            self.store,
            self.clock,
            lease=LEASE,
            error=lambda phase, job, exc: self.errors.append((phase, job.id if job else None, exc)),
            step=self._step,
        )
        self.runner = JobRunner(
            shared, self.tasks, self.ledger, stopping=lambda: self.stopping, hook=self._hook
        )

    def _hook(self, phase: Phase, job: Job, fn: object, *args: Any) -> None:
        self.hooks.append((phase, job.id, args))

    def _step(self, step: Step, claim: Claim, phase: Phase | None) -> None:
        self.steps.append((step, phase))

    def start(self, task: str = "work", payload: JsonValue = None, **options: Any) -> Held:
        """Enqueue one job, claim it and start it in the ledger (RUNNING)."""
        self.store.enqueue(task, payload, **options)
        reserved = self.ledger.reserve(threading.Event())
        [claim] = self.store.claim("w1", lease=LEASE, limit=reserved)
        with self.cond:
            self.ledger.hold([claim], reserved)
        held = self.ledger.start(claim.job.id)
        assert held is not None
        return held

    def run(self, held: Held) -> Pending[Held]:
        """Run the job; the decided outcome, which the runner also keeps on its record."""
        pending = self.runner.run(held)
        assert pending is not None
        assert held.pending is pending
        assert pending.run is held
        assert pending.item.claim is held.claim
        return pending


@pytest.fixture
def bench() -> Bench:
    """A fresh runner."""
    return Bench()


HANDLER_STEPS = [(Step.BEFORE_HANDLER, None), (Step.AFTER_HANDLER, None)]


def test_a_handler_that_returns_completes_the_job_with_its_result(bench: Bench) -> None:
    """ACK with the handler's result, DONE expected; its context is the runner's."""
    seen: list[tuple[int, str, bool]] = []

    @bench.tasks.task(name="work")
    def work(payload: JsonValue, ctx: JobContext) -> JsonValue:
        seen.append((ctx.job_id, ctx.worker, ctx.stopping))
        return {"twice": 2 * int(str(payload))}

    held = bench.start(payload=21)
    pending = bench.run(held)
    assert (pending.phase, pending.item.kind, pending.success) == (
        Phase.ACK,
        Settle.COMPLETE,
        Outcome.DONE,
    )
    assert pending.item.result == {"twice": 42}
    assert pending.then is None  # on_complete is the settler's, run once accepted
    assert pending.began is not None
    assert seen == [(held.claim.job.id, "w1", False)]
    assert bench.steps == [*HANDLER_STEPS, (Step.BEFORE_GROUP_COMMIT, Phase.ACK)]
    assert (bench.errors, bench.hooks) == ([], [])


def test_a_job_of_an_unknown_task_fails_without_running(bench: Bench) -> None:
    """No handler under its name: NACK, failed for good, whatever attempts are left."""
    held = bench.start("nobody-registered-this", max_attempts=3)
    pending = bench.run(held)
    assert (pending.phase, pending.item.kind, pending.success) == (
        Phase.NACK,
        Settle.FAIL,
        Outcome.FAILED,
    )
    assert pending.item.error == (
        "unknown task 'nobody-registered-this': no handler registered under that name"
    )
    assert bench.steps == [(Step.BEFORE_GROUP_COMMIT, Phase.NACK)]


def _never_runs(payload: JsonValue, ctx: JobContext) -> None:
    raise AssertionError("this handler must not run")


@pytest.mark.parametrize(
    ("max_attempts", "expected"),
    [
        (3, (Phase.REQUEUE, Settle.RETRY, Outcome.RETRIED, "not ready")),
        (1, (Phase.ABANDON, Settle.FAIL, Outcome.FAILED, "not ready (attempt 1 of 1: none left)")),
    ],
    ids=["attempts-left", "last-attempt"],
)
def test_a_job_that_is_not_ready_is_requeued_then_abandoned_on_its_last_attempt(
    bench: Bench, max_attempts: int, expected: tuple[Phase, Settle, Outcome, str]
) -> None:
    """ready() says no: REQUEUE after the policy's delay; on the last attempt, ABANDON."""
    bench.tasks.task(name="work", ready=lambda job: False, not_ready=lambda job: Retry(7.0))(
        _never_runs
    )
    held = bench.start(max_attempts=max_attempts)
    pending = bench.run(held)
    phase, kind, _, error = expected
    assert (pending.phase, pending.item.kind, pending.success, pending.item.error) == expected
    assert bench.steps == [(Step.BEFORE_GROUP_COMMIT, phase)]
    if kind is Settle.RETRY:
        assert pending.item.run_at == bench.clock.now + 7.0
        assert pending.then is None
        return
    assert pending.then is not None
    assert bench.hooks == []  # on_unreadiness runs only once the store accepted the Fail
    pending.then()
    assert bench.hooks == [(Phase.ON_UNREADINESS, held.claim.job.id, (held.claim.job, Fail(error)))]


def test_a_ready_check_that_raises_is_reported_and_the_job_retried(bench: Bench) -> None:
    """ready() raising: reported (READY), then the default failure policy requeues the job."""
    broken = RuntimeError("ready check broke (injected)")

    def ready(job: Job) -> bool:
        raise broken

    bench.tasks.task(name="work", ready=ready)(_never_runs)
    held = bench.start(max_attempts=3)
    pending = bench.run(held)
    assert (pending.phase, pending.success) == (Phase.REQUEUE, Outcome.RETRIED)
    assert pending.item.error == "RuntimeError: ready check broke (injected)"
    assert bench.errors == [(Phase.READY, held.claim.job.id, broken)]


@pytest.mark.parametrize(
    ("max_attempts", "expected"),
    [
        (3, (Phase.REQUEUE, Settle.RETRY, Outcome.RETRIED, "ValueError: bad payload")),
        (
            1,
            (
                Phase.NACK,
                Settle.FAIL,
                Outcome.FAILED,
                "ValueError: bad payload (attempt 1 of 1: none left)",
            ),
        ),
    ],
    ids=["attempts-left", "last-attempt"],
)
def test_a_handler_that_raises_is_decided_by_the_tasks_retry_policy(
    bench: Bench, max_attempts: int, expected: tuple[Phase, Settle, Outcome, str]
) -> None:
    """Its policy's Retry requeues the job; on the last attempt the Retry becomes a Fail."""
    asked: list[tuple[int, BaseException]] = []
    raised = ValueError("bad payload")

    def policy(job: Job, exc: BaseException) -> Retry:
        asked.append((job.id, exc))
        return Retry(5.0)

    def work(payload: JsonValue, ctx: JobContext) -> None:
        raise raised

    bench.tasks.task(name="work", retry=policy)(work)
    held = bench.start(max_attempts=max_attempts)
    pending = bench.run(held)
    assert asked == [(held.claim.job.id, raised)]
    phase, kind, _, error = expected
    assert (pending.phase, pending.item.kind, pending.success, pending.item.error) == expected
    assert bench.steps == [*HANDLER_STEPS, (Step.BEFORE_GROUP_COMMIT, phase)]
    assert bench.errors == []
    if kind is Settle.RETRY:
        assert pending.item.run_at == bench.clock.now + 5.0
        assert pending.then is None
        return
    assert pending.then is not None
    pending.then()
    [(hook, job_id, (_, exc, decision))] = bench.hooks
    assert (hook, job_id, exc) == (Phase.ON_FAILURE, held.claim.job.id, raised)
    assert decision == Fail(error)


def test_a_retry_policy_that_raises_is_replaced_by_the_default_and_reported(
    bench: Bench,
) -> None:
    """The policy's own error is reported; the default backoff requeues within 0.5 to 1 s."""
    broken = RuntimeError("policy broke (injected)")

    def policy(job: Job, exc: BaseException) -> Retry:
        raise broken

    def work(payload: JsonValue, ctx: JobContext) -> None:
        raise ValueError("bad payload")

    bench.tasks.task(name="work", retry=policy)(work)
    held = bench.start(max_attempts=3)
    pending = bench.run(held)
    assert (pending.phase, pending.item.kind) == (Phase.REQUEUE, Settle.RETRY)
    assert pending.item.run_at is not None
    assert 0.5 - 1e-6 <= pending.item.run_at - bench.clock.now <= 1.0  # Backoff(), attempt 1
    assert bench.errors == [(Phase.GET_FAILURE_POLICY, held.claim.job.id, broken)]


def test_a_handler_stopped_by_the_workers_stop_is_released(bench: Bench) -> None:
    """The worker's root token cancelled while it ran: RELEASE, its attempt given back."""

    def work(payload: JsonValue, ctx: JobContext) -> None:
        bench.root.cancel("the worker is stopping")
        ctx.check()

    bench.tasks.task(name="work")(work)
    held = bench.start()
    pending = bench.run(held)
    assert (pending.phase, pending.item.kind, pending.success) == (
        Phase.RELEASE,
        Settle.RELEASE,
        Outcome.RELEASED,
    )
    assert pending.then is None
    assert bench.steps == [*HANDLER_STEPS, (Step.BEFORE_GROUP_COMMIT, Phase.RELEASE)]
    assert bench.errors == []


def test_a_handler_stopped_by_an_operators_cancel_ends_cancelled(bench: Bench) -> None:
    """The heartbeat saw the cancel and cancelled the job's token: CANCEL, not a release."""

    def work(payload: JsonValue, ctx: JobContext) -> None:
        with bench.cond:  # what the heartbeat does when a renew says so
            held.cancel_requested = True
            token = held.cancel("cancelled by operator")
        assert token is None  # the handler has not looked at its token yet
        ctx.check()

    bench.tasks.task(name="work")(work)
    held = bench.start()
    pending = bench.run(held)
    assert (pending.phase, pending.item.kind, pending.success) == (
        Phase.CANCEL,
        Settle.CANCEL,
        Outcome.CANCELLED,
    )
    assert pending.item.error == "cancelled by operator"
    assert bench.steps == [*HANDLER_STEPS, (Step.BEFORE_GROUP_COMMIT, Phase.CANCEL)]


def test_a_job_cancelled_before_its_handler_began_never_runs(bench: Bench) -> None:
    """Cancelled by an operator while it waited: CANCEL at once, the handler not called."""
    bench.tasks.task(name="work")(_never_runs)
    held = bench.start()
    held.cancel_requested = True
    pending = bench.run(held)
    assert (pending.phase, pending.success) == (Phase.CANCEL, Outcome.CANCELLED)
    assert bench.steps == [(Step.BEFORE_GROUP_COMMIT, Phase.CANCEL)]


def _sleeps_past_its_deadline(payload: JsonValue, ctx: JobContext) -> None:
    ctx.sleep(MUST_HAPPEN)  # interrupted at the deadline, long before this


def _returns_at_its_deadline(payload: JsonValue, ctx: JobContext) -> str:
    try:
        ctx.sleep(MUST_HAPPEN)
    except Interrupted:  # it swallows the interruption and returns what it has
        return "partial"
    return "finished"


@pytest.mark.parametrize(
    ("handler", "where"),
    [(_sleeps_past_its_deadline, "job"), (_returns_at_its_deadline, "task")],
    ids=["raises-at-deadline", "returns-at-deadline"],
)
def test_a_handler_past_its_timeout_fails_the_attempt(
    bench: Bench, handler: Any, where: str
) -> None:
    """Stopped at its deadline (raising or returning): a failed attempt, "timed out after"."""
    asked: list[BaseException] = []

    def policy(job: Job, exc: BaseException) -> Retry:
        asked.append(exc)
        return Retry(0.0)

    task_timeout = DEADLINE if where == "task" else None
    bench.tasks.task(name="work", retry=policy, timeout=task_timeout)(handler)
    held = bench.start(timeout=DEADLINE if where == "job" else None)
    pending = bench.run(held)
    assert (pending.phase, pending.item.kind, pending.success) == (
        Phase.REQUEUE,
        Settle.RETRY,
        Outcome.RETRIED,
    )
    assert pending.item.error == f"TimeoutError: timed out after {DEADLINE:g}s"
    [timeout] = asked
    assert isinstance(timeout, TimeoutError)
    assert (held.timeout, bench.ledger.timed_out) == (DEADLINE, 1)
    assert held.handler_token is not None
    assert held.token is not None  # a deadline needs the job's token, to be its child's parent
    assert not held.token.cancelled  # only the handler's own token had the deadline
    assert bench.steps == [*HANDLER_STEPS, (Step.BEFORE_GROUP_COMMIT, Phase.REQUEUE)]


def test_a_handler_that_never_looks_at_its_token_costs_no_token(bench: Bench) -> None:
    """No timeout and no look at ``ctx.token``: no token is made for the job at all."""
    bench.tasks.task(name="work")(lambda payload, ctx: "ok")
    held = bench.start()
    pending = bench.run(held)
    assert (pending.success, pending.item.result) == (Outcome.DONE, "ok")
    assert held.token is None


def test_a_handler_that_raises_once_its_lease_is_lost_is_released_though_it_never_looked(
    bench: Bench,
) -> None:
    """The lease was lost (no token made yet), then the handler raised: released, not failed.

    The runner asks for the token when the handler raises, and it is made cancelled
    with the kept reason: the error is the way out of a cancelled job, not a failure.
    """

    def work(payload: JsonValue, ctx: JobContext) -> None:
        with bench.cond:  # what the heartbeat does when a renew finds the lease gone
            assert held.cancel("lease lost") is None
        raise ConnectionResetError("the peer went away")

    bench.tasks.task(name="work")(work)
    held = bench.start()
    pending = bench.run(held)
    assert (pending.phase, pending.item.kind, pending.success) == (
        Phase.RELEASE,
        Settle.RELEASE,
        Outcome.RELEASED,
    )
    assert held.token is not None
    assert held.token.reason == "lease lost"
