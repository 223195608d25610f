"""Tasks: registration, the handler's context, and the retry and readiness policies."""

from __future__ import annotations

import itertools
import time

import pytest

from patterns.cancellation import Cancelled, CancelToken
from patterns.jobqueue.stores.memory import MemoryStore
from patterns.jobqueue.stores.records import Job, JobState
from patterns.jobqueue.tasks import (
    Backoff,
    Fail,
    Interrupted,
    JobContext,
    Phase,
    PhaseError,
    Retry,
    TaskRegistry,
    requeue_after,
)
from patterns.jobqueue.worker.outcomes import decide
from tests.support import MUST_HAPPEN, elapsed, join_or_fail, run_in_thread, wait_until_blocked_in


def make_job(attempts: int = 1, max_attempts: int = 3, job_id: int = 7) -> Job:
    """A job snapshot as a claim would return it."""
    return Job(
        id=job_id,
        task="t",
        payload={"n": 1},
        state=JobState.RUNNING,
        run_at=100.0,
        attempts=attempts,
        max_attempts=max_attempts,
        lease_owner="w:token",
        lease_until=130.0,
        last_error=None,
        created_at=100.0,
        updated_at=100.0,
    )


# --- registration ----------------------------------------------------------------------------


def test_the_decorator_registers_under_the_function_name_and_returns_the_function() -> None:
    """A bare @tasks.task keeps the handler callable and names the task after it."""
    tasks = TaskRegistry()

    @tasks.task
    def resize(payload, ctx):
        return payload * 2

    task = tasks.get("resize")
    assert task is not None
    assert task.fn is resize
    assert resize(21, None) == 42
    assert "resize" in tasks
    assert list(tasks) == ["resize"]
    assert len(tasks) == 1


def test_the_decorator_takes_a_name_and_policies() -> None:
    """@tasks.task(name=..., max_attempts=..., retry=..., ready=..., not_ready=...) keeps all."""
    tasks = TaskRegistry()
    policy = Backoff(base=2.0, jitter=0)
    ready = lambda job: True  # noqa: E731 - a one-line readiness check
    not_ready = requeue_after(5.0)

    @tasks.task(name="mail", max_attempts=7, retry=policy, ready=ready, not_ready=not_ready)
    def send(payload, ctx):
        return None

    task = tasks.get("mail")
    assert task is not None
    assert (task.max_attempts, task.retry, task.ready, task.not_ready) == (
        7,
        policy,
        ready,
        not_ready,
    )
    assert tasks.get("send") is None


def test_a_task_name_can_be_registered_only_once() -> None:
    """A second handler under the same name is refused instead of silently replacing the first."""
    tasks = TaskRegistry()
    tasks.task(name="x")(lambda payload, ctx: None)
    with pytest.raises(ValueError, match="already registered"):
        tasks.task(name="x")(lambda payload, ctx: None)


def test_max_attempts_below_one_is_refused() -> None:
    """A task that could never run is a configuration error, raised at registration."""
    tasks = TaskRegistry()
    with pytest.raises(ValueError, match="max_attempts"):
        tasks.task(name="never", max_attempts=0)(lambda payload, ctx: None)


def test_enqueue_through_the_registry_uses_the_tasks_max_attempts() -> None:
    """The task's max_attempts is the default; an explicit value wins."""
    tasks = TaskRegistry()
    tasks.task(name="t", max_attempts=9)(lambda payload, ctx: None)
    store = MemoryStore()
    first = tasks.enqueue(store, "t", {"a": 1})
    second = tasks.enqueue(store, "t", None, max_attempts=2, delay=5)
    job_1, job_2 = store.get(first), store.get(second)
    assert job_1 is not None
    assert job_2 is not None
    assert (job_1.max_attempts, job_1.payload) == (9, {"a": 1})
    assert job_2.max_attempts == 2
    assert job_2.run_at > job_1.run_at


def test_enqueue_of_an_unknown_task_name_fails_in_the_producer() -> None:
    """A typo is a LookupError at enqueue time, and nothing is written."""
    tasks = TaskRegistry()
    store = MemoryStore()
    with pytest.raises(LookupError, match="unknown task 'typo'"):
        tasks.enqueue(store, "typo")
    assert store.counts()["queued"] == 0


# --- policies ----------------------------------------------------------------------------


def test_backoff_grows_exponentially_up_to_its_cap() -> None:
    """Without jitter the delays are base * factor ** (attempt - 1), capped."""
    backoff = Backoff(base=1.0, factor=3.0, cap=20.0, jitter=0)
    assert [backoff.delay(n) for n in range(1, 6)] == [1.0, 3.0, 9.0, 20.0, 20.0]


def test_backoff_jitter_shortens_the_delay_by_at_most_its_fraction() -> None:
    """Jitter multiplies the exact delay by a factor in [1 - jitter, 1]."""
    backoff = Backoff(base=10.0, factor=1.0, jitter=0.5)
    assert backoff.delay(1, rand=lambda: 0.0) == 10.0
    assert backoff.delay(1, rand=lambda: 1.0) == 5.0
    assert all(5.0 <= backoff.delay(1) <= 10.0 for _ in range(100))


def test_backoff_as_a_failure_policy_retries_after_its_delay_for_the_jobs_attempt() -> None:
    """Called with a job and an error, a Backoff answers Retry(delay for that attempt)."""
    backoff = Backoff(base=2.0, factor=2.0, jitter=0)
    assert backoff(make_job(attempts=3), ValueError("x")) == Retry(8.0)


@pytest.mark.parametrize("attempt", [1025, 1026, 10**6, 10**30])
def test_backoff_stays_at_its_cap_for_any_attempt_number(attempt: int) -> None:
    """``factor ** n`` past a float's range is simply past the cap: no OverflowError."""
    assert Backoff(base=1.0, factor=2.0, cap=300.0, jitter=0).delay(attempt) == 300.0
    assert 150.0 <= Backoff(cap=300.0, jitter=0.5).delay(attempt) <= 300.0


def test_a_fallback_policy_that_raises_fails_the_job_and_hands_back_the_error() -> None:
    """When no policy can decide, the job fails with the reason; nothing escapes decide()."""

    def broken() -> Retry:
        raise OverflowError("no delay")

    decision, error = decide(make_job(attempts=1), "boom", None, broken)
    assert isinstance(decision, Fail)
    assert decision.reason == "boom (no policy could decide: OverflowError: no delay)"
    assert isinstance(error, OverflowError)


@pytest.mark.parametrize(
    "kwargs", [{"base": -1.0}, {"factor": 0.5}, {"cap": -1.0}, {"jitter": 1.5}]
)
def test_backoff_refuses_nonsense(kwargs: dict[str, float]) -> None:
    """Negative delays, a shrinking factor or jitter above 1 are configuration errors."""
    with pytest.raises(ValueError, match="Backoff"):
        Backoff(**kwargs)


def test_requeue_after_always_answers_retry_with_its_delay() -> None:
    """The default unreadiness policy puts the job back after a fixed delay."""
    assert requeue_after(2.5)(make_job()) == Retry(2.5)
    assert Fail().reason is None


# --- the handler's context ---------------------------------------------------------------------


def test_ctx_sleep_raises_interrupted_as_soon_as_the_token_is_cancelled() -> None:
    """A handler blocked in ctx.sleep wakes at once on cancel and raises Interrupted."""
    token = CancelToken()
    ctx = JobContext(make_job(), token, worker="w")
    sleeper, outcome = run_in_thread(lambda: ctx.sleep(MUST_HAPPEN * 10), "sleeper")
    wait_until_blocked_in(sleeper, "sleep")
    with elapsed() as took:
        token.cancel("worker shutting down")
        join_or_fail(sleeper)
    assert took() < MUST_HAPPEN
    error = outcome["error"]
    assert isinstance(error, Interrupted)
    assert error.reason == "worker shutting down"


def test_ctx_check_raises_interrupted_only_once_cancelled() -> None:
    """ctx.check is a no-op until the token is cancelled, then raises every time."""
    token = CancelToken()
    ctx = JobContext(make_job(), token)
    ctx.check()
    token.cancel("lease lost")
    for _ in range(2):
        with pytest.raises(Interrupted, match="lease lost"):
            ctx.check()


def test_a_token_given_as_a_function_is_made_once_when_first_asked_for() -> None:
    """The worker's way: no token until the handler looks, then the same one every time."""
    made: list[CancelToken] = []

    def make() -> CancelToken:
        made.append(CancelToken())
        return made[-1]

    ctx = JobContext(make_job(), make)
    assert made == []
    assert ctx.token is ctx.token is made[0]
    made[0].cancel("lease lost")
    with pytest.raises(Interrupted, match="lease lost"):
        ctx.check()
    assert len(made) == 1


def test_a_token_that_is_neither_a_token_nor_a_function_is_refused_at_once() -> None:
    """Not a late ``TypeError`` in the handler's first checkpoint: one naming the argument."""
    with pytest.raises(TypeError, match="token must be a CancelToken or a function"):
        JobContext(make_job(), None)  # type: ignore[arg-type]


def test_interrupted_is_a_cancelled_that_except_exception_does_not_swallow() -> None:
    """A handler's `except Exception:` lets Interrupted through, so a stop is never eaten."""
    assert issubclass(Interrupted, Cancelled)
    assert not issubclass(Interrupted, Exception)
    token = CancelToken()
    token.cancel()
    ctx = JobContext(make_job(), token)

    def handler() -> str:
        try:
            ctx.sleep(0)
        except Exception:  # the broad handler a job uses to skip a bad record
            return "swallowed"
        return "not interrupted"

    with pytest.raises(Interrupted):
        handler()


def test_the_context_exposes_the_job_attempt_and_whether_the_worker_is_stopping() -> None:
    """ctx.attempt counts this run; ctx.stopping follows the worker's state."""
    stopping = itertools.chain([False], itertools.repeat(True))
    ctx = JobContext(
        make_job(attempts=2), CancelToken(), worker="w1", stopping=lambda: next(stopping)
    )
    assert (ctx.job_id, ctx.attempt, ctx.worker) == (7, 2, "w1")
    assert ctx.stopping is False
    assert ctx.stopping is True
    assert "job=7" in repr(ctx)


def test_ctx_sleep_sleeps_normally_while_the_token_is_active() -> None:
    """A short ctx.sleep returns after its time when nothing cancels it."""
    ctx = JobContext(make_job(), CancelToken())
    start = time.monotonic()
    ctx.sleep(0.01)
    assert time.monotonic() - start >= 0.01


# --- phase errors ------------------------------------------------------------------------------


def test_a_phase_error_names_its_phase_and_job_and_chains_the_cause() -> None:
    """One error hook can tell a failed ack from a crashed ready check, and see the original."""
    cause = OSError("disk full")
    error = PhaseError(Phase.ACK, make_job(), cause)
    assert error.phase is Phase.ACK
    assert error.job is not None
    assert error.job.id == 7
    assert error.__cause__ is cause
    assert str(error) == "ack failed (job 7, task 't'): OSError: disk full"
    assert str(PhaseError(Phase.DEQUEUE, None, cause)) == "dequeue failed: OSError: disk full"


def test_the_phase_names_are_qdolors_plus_the_workers_own() -> None:
    """Every qdolor phase in its Python spelling, plus release, cancel, heartbeat, on_shutdown."""
    qdolor = {
        "dequeue",
        "ready",
        "ack",
        "on_complete",
        "get_failure_policy",
        "requeue",
        "nack",
        "on_failure",
        "get_unreadiness_policy",
        "abandon",
        "on_unreadiness",
    }
    assert {p.value for p in Phase} == qdolor | {"release", "cancel", "heartbeat", "on_shutdown"}
