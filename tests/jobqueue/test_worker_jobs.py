"""The worker's round-two features: results, per-job timeouts, operators' cancels, worker rows.

Every test runs the real `Worker` on a real `MemoryStore` behind ``test_worker``'s
`RecordingStore`, with the store's time on a `FakeClock`; the last one runs the same
features on every store (memory, a SQLite file, PostgreSQL). Handlers park at a `Gate` or wait
on their token; deadlines are real (a job's timeout is in real seconds, as a handler runs
in real time), short, and only ever waited for through the token, never by sleeping.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from patterns.jobqueue.stores.memory import MemoryStore
from patterns.jobqueue.stores.postgres.store import PostgresStore
from patterns.jobqueue.stores.protocol import Store
from patterns.jobqueue.stores.records import CancelResult, JobState
from patterns.jobqueue.stores.sqlite.store import SQLiteStore
from patterns.jobqueue.tasks import Interrupted, JobContext, TaskRegistry
from patterns.jobqueue.worker.worker import Worker
from tests.jobqueue.test_worker import (
    FOREVER,
    FakeClock,
    RecordingStore,
    boom,
    make_worker,
    run_until_empty,
    running,
)
from tests.support import MUST_HAPPEN, Gate, wait_until

SHORT = 0.05  # a job's timeout, in real seconds: the handlers wait for it on their token
BEAT = 0.01  # real seconds between heartbeats, where a test needs them


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock shared by the store and the worker."""
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> RecordingStore:
    """A recording store on a memory store with the fake clock."""
    return RecordingStore(clock)


def run_one(store: RecordingStore, tasks: TaskRegistry, clock: FakeClock, **kw: Any) -> Worker:
    """Run a worker until the queue is empty; return it (stopped) for its stats."""
    worker = make_worker(store, tasks, clock, exit_when_empty=True, **kw)
    run_until_empty(worker)
    return worker


# --- results ------------------------------------------------------------------------------------


def test_a_handlers_json_return_value_is_stored_as_the_jobs_result_and_passed_to_on_complete(
    store: RecordingStore, clock: FakeClock
) -> None:
    """What the handler returns is the job's ``result``; on_complete gets the same value."""
    seen: list[object] = []
    tasks = TaskRegistry(on_complete=lambda job, result: seen.append(result))
    tasks.task(name="sum")(lambda payload, ctx: {"total": sum(payload)})
    job_id = store.enqueue("sum", [1, 2, 3])
    run_one(store, tasks, clock)
    found = store.get(job_id)
    assert (found.state, found.result) == (JobState.DONE, {"total": 6})
    assert seen == [{"total": 6}]


@pytest.mark.parametrize(
    ("value", "why"),
    [({1, 2}, "JSON-serialisable"), ("x" * (2 * 1024 * 1024), "over the limit")],
    ids=["not-json", "too-big"],
)
def test_a_result_the_store_cannot_keep_completes_the_job_with_none_and_a_warning(
    store: RecordingStore,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
    value: object,
    why: str,
) -> None:
    """A set, or 2 MiB of JSON: the job is still done, its result None, the log says why."""
    tasks = TaskRegistry()
    tasks.task(name="odd")(lambda payload, ctx: value)
    job_id = store.enqueue("odd")
    with caplog.at_level(logging.WARNING, logger="patterns.jobqueue.worker"):
        run_one(store, tasks, clock)
    found = store.get(job_id)
    assert (found.state, found.result) == (JobState.DONE, None)
    [line] = [r.getMessage() for r in caplog.records if "result cannot be stored" in r.getMessage()]
    assert f"job {job_id} (odd)" in line
    assert why in line


def test_a_completed_job_is_logged_at_info_with_its_duration(
    store: RecordingStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """'job 1 (send_email) done in 0.00 s': one INFO line per completed job."""
    tasks = TaskRegistry()
    tasks.task(name="send_email")(lambda payload, ctx: None)
    job_id = store.enqueue("send_email")
    with caplog.at_level(logging.INFO, logger="patterns.jobqueue.worker"):
        run_one(store, tasks, clock)
    lines = [r for r in caplog.records if f"job {job_id} (send_email) done in " in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.INFO]
    assert lines[0].getMessage().endswith(" s")


# --- per-job timeouts -----------------------------------------------------------------------------


def test_a_handler_that_stops_at_its_tasks_timeout_fails_the_attempt_as_timed_out(
    store: RecordingStore, clock: FakeClock
) -> None:
    """ctx.sleep raises at the deadline: a failed attempt 'timed out after 0.05s', no retry left."""
    failures: list[BaseException] = []
    tasks = TaskRegistry(on_failure=lambda job, error, decision: failures.append(error))
    tasks.task(name="slow", timeout=SHORT)(lambda payload, ctx: ctx.sleep(FOREVER))
    job_id = tasks.enqueue(store, "slow", max_attempts=1)
    worker = run_one(store, tasks, clock)
    found = store.get(job_id)
    assert found.state is JobState.FAILED
    assert "timed out after 0.05s" in (found.last_error or "")
    assert [type(e) for e in failures] == [TimeoutError]
    assert (worker.stats().timed_out, worker.stats().failed) == (1, 1)


def test_a_timed_out_attempt_is_retried_by_the_failure_policy(
    store: RecordingStore, clock: FakeClock
) -> None:
    """With attempts left, a timeout is an ordinary failure: requeued, and it runs again."""
    tasks = TaskRegistry()
    tasks.task(name="slow", timeout=SHORT)(lambda payload, ctx: ctx.sleep(FOREVER))
    job_id = tasks.enqueue(store, "slow", max_attempts=2)
    run_one(store, tasks, clock)
    found = store.get(job_id)
    assert (found.state, found.attempts) == (JobState.QUEUED, 1)
    assert "timed out after 0.05s" in (found.last_error or "")


def test_a_jobs_own_timeout_wins_over_its_tasks(store: RecordingStore, clock: FakeClock) -> None:
    """Task timeout FOREVER, job timeout 0.05 s: the job's deadline applies."""
    tasks = TaskRegistry()
    tasks.task(name="slow", timeout=FOREVER)(lambda payload, ctx: ctx.sleep(FOREVER))
    job_id = tasks.enqueue(store, "slow", max_attempts=1, timeout=SHORT)
    assert store.get(job_id).timeout == SHORT
    run_one(store, tasks, clock)
    assert "timed out after 0.05s" in (store.get(job_id).last_error or "")


def test_a_handler_that_returns_after_a_checkpoint_raised_at_its_deadline_timed_out(
    store: RecordingStore, clock: FakeClock
) -> None:
    """Catching Interrupted at the deadline and returning is still a timed-out attempt."""
    tasks = TaskRegistry()

    @tasks.task(timeout=SHORT)
    def swallow(payload: object, ctx: JobContext) -> str:
        try:
            while True:
                ctx.sleep(BEAT)
        except Interrupted:
            return "partial"

    job_id = tasks.enqueue(store, "swallow", max_attempts=1)
    run_one(store, tasks, clock)
    found = store.get(job_id)
    assert (found.state, found.result) == (JobState.FAILED, None)
    assert "timed out" in (found.last_error or "")


def test_a_handler_ignoring_its_timeout_is_reported_once_keeps_its_slot_and_is_counted(
    store: RecordingStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler blocked past its deadline: one WARNING naming it, stats.overdue; it still ends."""
    tasks = TaskRegistry()
    gate = Gate("ignores its token")
    tasks.task(name="stubborn", timeout=SHORT)(lambda payload, ctx: gate.arrive())
    job_id = tasks.enqueue(store, "stubborn")
    worker = make_worker(store, tasks, clock, heartbeat_interval=BEAT)
    with (
        caplog.at_level(logging.WARNING, logger="patterns.jobqueue.worker"),
        running(worker, gate),
    ):
        gate.wait_reached()
        wait_until(lambda: worker.stats().overdue == 1, "the overdue handler reported")
        assert worker.running_jobs() == [job_id]  # it keeps its slot
        gate.open()
        wait_until(lambda: worker.stats().settled == 1, "the handler returned")
    lines = [r.getMessage() for r in caplog.records if "past its timeout" in r.getMessage()]
    assert len(lines) == 1
    assert f"job {job_id} (stubborn)" in lines[0]
    assert worker.stats().overdue == 1


def test_the_registry_enqueues_with_the_tasks_defaults_and_exposes_them(
    store: RecordingStore,
) -> None:
    """get(name) returns the Task with max_attempts and timeout; enqueue uses them by default."""
    tasks = TaskRegistry()
    tasks.task(name="t", max_attempts=7, timeout=12.5)(lambda payload, ctx: None)
    task = tasks.get("t")
    assert task is not None
    assert (task.max_attempts, task.timeout) == (7, 12.5)
    default = store.get(tasks.enqueue(store, "t"))
    assert (default.max_attempts, default.timeout) == (7, 12.5)
    chosen = store.get(tasks.enqueue(store, "t", max_attempts=2, timeout=1.0))
    assert (chosen.max_attempts, chosen.timeout) == (2, 1.0)


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), float("inf"), 1e15])
def test_a_task_timeout_out_of_range_is_refused_naming_the_task(timeout: float) -> None:
    """A zero, negative, nan, infinite or absurd timeout is a ValueError at registration."""
    tasks = TaskRegistry()
    with pytest.raises(ValueError, match=r"task 't'.*timeout"):
        tasks.task(name="t", timeout=timeout)(lambda payload, ctx: None)


# --- an operator's cancel ---------------------------------------------------------------------


def test_a_cancel_reaches_only_that_jobs_handler_which_ends_cancelled(
    store: RecordingStore, clock: FakeClock
) -> None:
    """store.cancel on a running job: the next renew cancels its token; mark_cancelled, no hook."""
    failures: list[int] = []
    tasks = TaskRegistry(on_failure=lambda job, error, decision: failures.append(job.id))
    started = {1: threading.Event(), 2: threading.Event()}
    other_done = threading.Event()

    @tasks.task
    def waits(payload: int, ctx: JobContext) -> None:
        started[payload].set()
        if payload == 1:
            ctx.sleep(FOREVER)  # until cancelled
        else:
            assert other_done.wait(MUST_HAPPEN)
            ctx.check()  # not cancelled: only job 1 was

    first, second = store.enqueue("waits", 1), store.enqueue("waits", 2)
    worker = make_worker(store, tasks, clock, concurrency=2, heartbeat_interval=BEAT)
    with running(worker):
        assert started[1].wait(MUST_HAPPEN)
        assert started[2].wait(MUST_HAPPEN)
        assert store.cancel(first) is CancelResult.REQUESTED
        wait_until(lambda: worker.stats().cancelled == 1, "the cancelled job settled")
        other_done.set()
        wait_until(lambda: worker.stats().done == 1, "the other job done")
    found = store.get(first)
    assert (found.state, found.last_error) == (JobState.CANCELLED, "cancelled by operator")
    assert store.get(second).state is JobState.DONE
    assert failures == []


def test_a_cancel_whose_mark_cancelled_raises_ends_cancelled_through_the_release(
    store: RecordingStore, clock: FakeClock
) -> None:
    """mark_cancelled raising: the fallback release ends the job cancelled, never failed."""
    tasks = TaskRegistry()
    started = threading.Event()

    @tasks.task
    def waits(payload: object, ctx: JobContext) -> None:
        started.set()
        ctx.sleep(FOREVER)

    job_id = store.enqueue("waits", max_attempts=1)
    store.fail_always["mark_cancelled"] = boom("mark_cancelled")
    worker = make_worker(store, tasks, clock, heartbeat_interval=BEAT)
    with running(worker):
        assert started.wait(MUST_HAPPEN)
        store.cancel(job_id)
        wait_until(lambda: worker.stats().settled == 1, "the job settled")
    assert store.get(job_id).state is JobState.CANCELLED


def test_a_handler_that_ignores_a_cancel_completes_and_the_log_says_so(
    store: RecordingStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler that finishes anyway: the job is done, and the log says it ignored the cancel."""
    tasks = TaskRegistry()
    gate = Gate("ignores the cancel")
    tasks.task(name="stubborn")(lambda payload, ctx: gate.arrive())
    job_id = store.enqueue("stubborn")
    worker = make_worker(store, tasks, clock, heartbeat_interval=BEAT)
    with (
        caplog.at_level(logging.INFO, logger="patterns.jobqueue.worker"),
        running(worker, gate),
    ):
        gate.wait_reached()
        store.cancel(job_id)
        wait_until(lambda: "cancel requested by an operator" in caplog.text, "the heartbeat saw it")
        gate.open()
        wait_until(lambda: worker.stats().done == 1, "the job done")
    assert store.get(job_id).state is JobState.DONE
    assert "ignored the operator's cancel" in caplog.text


# --- worker rows ------------------------------------------------------------------------------


def test_the_worker_keeps_a_row_with_its_state_and_jobs_and_removes_it_when_stopped(
    store: RecordingStore, clock: FakeClock
) -> None:
    """record_worker at start, on each beat and each transition; forget_worker at STOPPED."""
    tasks = TaskRegistry()
    gate = Gate("running job")
    tasks.task(name="t")(lambda payload, ctx: gate.arrive())
    store.enqueue("t")
    worker = make_worker(store, tasks, clock, heartbeat_interval=BEAT)
    with running(worker, gate):
        gate.wait_reached()
        wait_until(
            lambda: (
                [(w.id, w.state, w.jobs_held) for w in store.workers()] == [("w1", "running", 1)]
            ),
            "the row shows the running job",
        )
        [row] = store.workers()
        assert row.pid > 0
        assert row.host
        worker.request_stop("test")
        assert [w.state for w in store.workers()] == ["draining"]  # written by request_stop
        gate.open()
    assert store.workers() == []


def test_a_failing_record_worker_is_logged_rate_limited_and_never_stops_the_worker(
    store: RecordingStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Every row write raising: jobs still run; one warning, not one per beat."""
    store.fail_always["record_worker"] = boom("record_worker")
    store.fail_always["forget_worker"] = boom("forget_worker")
    tasks = TaskRegistry()
    tasks.task(name="t")(lambda payload, ctx: ctx.sleep(10 * BEAT))  # a few beats
    job_id = store.enqueue("t")
    with caplog.at_level(logging.WARNING, logger="patterns.jobqueue.worker"):
        worker = run_one(store, tasks, clock, heartbeat_interval=BEAT)
    assert store.get(job_id).state is JobState.DONE
    assert worker.stats().done == 1
    lines = [r for r in caplog.records if "could not write its row" in r.getMessage()]
    assert len(lines) == 1


# --- the same on every store ------------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> Iterator[Store]:
    """Each real store on the fake clock (PostgreSQL: a fresh schema), closed at the end."""
    made: Store
    if request.param == "memory":
        made = MemoryStore(clock=clock)
    elif request.param == "sqlite":
        made = SQLiteStore(tmp_path / "jobs.db", clock=clock)
    else:
        dsn = request.getfixturevalue("pg_dsn")
        made = PostgresStore(dsn, schema=request.getfixturevalue("pg_schema"), clock=clock)
    try:
        yield made
    finally:
        made.close()


def test_results_timeouts_cancels_and_worker_rows_work_alike_on_every_store(
    any_store: Store, clock: FakeClock
) -> None:
    """One worker, four jobs: a result kept, a timeout failed, a cancel ended, a row seen."""
    tasks = TaskRegistry()
    cancel_me = threading.Event()
    tasks.task(name="sum")(lambda payload, ctx: {"total": sum(payload)})
    tasks.task(name="slow", timeout=SHORT)(lambda payload, ctx: ctx.sleep(FOREVER))

    @tasks.task
    def waits(payload: object, ctx: JobContext) -> None:
        cancel_me.set()
        ctx.sleep(FOREVER)  # until the operator's cancel reaches it

    summed = tasks.enqueue(any_store, "sum", [1, 2])
    slow = tasks.enqueue(any_store, "slow", max_attempts=1)
    waiting = tasks.enqueue(any_store, "waits")
    worker = Worker(
        any_store, tasks, concurrency=3, poll_interval=0.02, heartbeat_interval=BEAT, clock=clock
    )
    with worker:
        assert cancel_me.wait(MUST_HAPPEN)
        wait_until(lambda: [w.id for w in any_store.workers()] == [worker.name], "its row")
        assert any_store.cancel(waiting) is CancelResult.REQUESTED
        wait_until(lambda: worker.stats().settled == 3, "all three settled")
    assert any_store.workers() == []
    assert any_store.get(summed).result == {"total": 3}
    timed_out = any_store.get(slow)
    assert timed_out.state is JobState.FAILED
    assert "timed out after 0.05s" in (timed_out.last_error or "")
    cancelled = any_store.get(waiting)
    assert (cancelled.state, cancelled.last_error) == (JobState.CANCELLED, "cancelled by operator")
