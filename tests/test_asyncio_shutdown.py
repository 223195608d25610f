"""asyncio shutdown: each pitfall forced, and the pattern holding under the same interleaving.

Coroutine tests run their own loop with `asyncio.run`; they order events with
`asyncio.Event` and `threading.Event`, never with sleeps. Exit behaviour runs in a
child interpreter that prints flushed marker lines, read with a timeout before the test
acts (sends a signal, writes to stdin), so every interleaving is forced.
"""

from __future__ import annotations

import asyncio
import asyncio.constants
import gc
import logging
import math
import subprocess
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from patterns.asyncio_shutdown import (
    StoppableTaskGroup,
    TaskSet,
    TaskShutdownReport,
    retry_forever,
    run_in_thread,
    run_in_thread_with,
    shielded,
    shutdown_tasks,
)
from patterns.naive.asyncio_shutdown import (
    naive_fire_and_forget,
    naive_keep,
    naive_retry_forever,
    naive_run_blocking,
    naive_run_group,
    naive_run_group_logging_failures,
    naive_shielded_cleanup,
    naive_shutdown_tasks,
)
from tests.support import MUST_HAPPEN, NOISE, STAYS_BLOCKED, LoopThreadTaskSet, child

PY = sys.version_info[:2]


def record_loop_errors(loop: asyncio.AbstractEventLoop) -> list[str]:
    """Replace the loop's exception handler with one that records the messages."""
    messages: list[str] = []
    loop.set_exception_handler(lambda _loop, context: messages.append(context["message"]))
    return messages


# --- A2: a cancellation swallowed by `except BaseException` --------------------------------


async def _cancel_a_poller(poller: Any) -> tuple[asyncio.Task[None], int]:
    """Start ``poller(step)``, cancel it inside step(); return the task and the step count.

    The count is negative when the cancel was swallowed and the test had to end the
    poller itself (it cancels it again while it sits in the sleep outside its ``try``).
    """
    calls = 0
    in_step = asyncio.Event()  # set by step() each time it starts
    quit_ = asyncio.Event()  # set by the test: step() returns at once from then on
    returned = asyncio.Event()  # set by step() when it returns because of quit_
    release = asyncio.Event()  # set by the test to let a blocked step() go on

    async def step() -> None:
        nonlocal calls
        calls += 1
        in_step.set()
        await release.wait()
        if quit_.is_set():
            returned.set()  # no await after this: the poller goes straight to its sleep

    task = asyncio.create_task(poller(step, delay=0.0), name="poller")
    await asyncio.wait_for(in_step.wait(), MUST_HAPPEN)
    in_step.clear()
    task.cancel()
    # Either the task ends (the cancel went through) or step() starts again (swallowed).
    came_back = asyncio.create_task(in_step.wait())
    await asyncio.wait([task, came_back], timeout=MUST_HAPPEN, return_when="FIRST_COMPLETED")
    came_back.cancel()
    if task.done():
        return task, calls
    quit_.set()
    release.set()
    await asyncio.wait_for(returned.wait(), MUST_HAPPEN)
    task.cancel()  # lands in the poller's sleep, outside its try
    await asyncio.wait([task], timeout=MUST_HAPPEN)
    assert task.cancelled()
    return task, -calls


@pytest.mark.race("A2", "except BaseException swallows the cancellation: the task never stops")
def test_naive_retry_forever_swallows_the_cancellation(
    record_property: Callable[[str, object], None],
) -> None:
    """Cancelling the naive poller inside its step only starts the next step."""
    _, calls = asyncio.run(_cancel_a_poller(naive_retry_forever))
    record_property(
        "observed",
        f"except BaseException caught the cancel: step() ran {-calls} times, stopped only by force"
        if calls < 0
        else f"the poller stopped after {calls} step(s)",
    )
    assert calls < 0, "the naive poller stopped on cancel"  # negative: it had to be forced
    assert -calls >= 2  # step() ran again after the cancel


@pytest.mark.race("A2", "except BaseException swallows the cancellation: the task never stops")
def test_retry_forever_stops_when_cancelled() -> None:
    """Catching Exception, not BaseException, lets a cancel stop a retry loop at once."""
    task, calls = asyncio.run(_cancel_a_poller(retry_forever))
    assert task.cancelled()
    assert calls == 1


def test_retry_forever_logs_a_failure_and_retries(caplog: pytest.LogCaptureFixture) -> None:
    """A step that raises is logged with its traceback and run again."""

    async def main() -> int:
        calls = 0
        again = asyncio.Event()

        async def step() -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise ValueError("boom")
            again.set()

        task = asyncio.create_task(retry_forever(step, name="poll"))
        await asyncio.wait_for(again.wait(), MUST_HAPPEN)
        task.cancel()
        await asyncio.wait([task], timeout=MUST_HAPPEN)
        assert task.cancelled()
        return calls

    assert asyncio.run(main()) >= 2
    failures = [r for r in caplog.records if r.getMessage() == "poll failed; retrying"]
    assert len(failures) == 1
    assert failures[0].exc_info is not None
    assert isinstance(failures[0].exc_info[1], ValueError)


def test_code_that_must_catch_the_cancellation_can_tell_with_cancelling() -> None:
    """After a cancel, ``cancelling()`` counts it; ``uncancel()`` is how a catcher takes it back."""

    async def main() -> list[int]:
        seen: list[int] = []
        blocked = asyncio.Event()

        async def catcher() -> str:
            task = asyncio.current_task()
            assert task is not None
            try:
                blocked.set()
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                seen.append(task.cancelling())  # 1: somebody asked this task to stop
                seen.append(task.uncancel())  # 0: the request is withdrawn
                return "kept going"
            return "not reached"

        task = asyncio.create_task(catcher())
        await blocked.wait()
        task.cancel()
        assert await task == "kept going"
        return seen

    assert asyncio.run(main()) == [1, 0]


# --- A7: a shutdown with no deadline ------------------------------------------------------


async def _stubborn(release: asyncio.Event, caught: asyncio.Event) -> str:
    """A task that swallows every cancellation until ``release`` is set."""
    while True:
        try:
            await release.wait()
        except asyncio.CancelledError:
            caught.set()
            continue
        return "released"


@pytest.mark.race("A7", "cancel then gather: one task that swallows the cancel hangs the stop")
def test_naive_shutdown_tasks_waits_forever_for_a_stubborn_task(
    record_property: Callable[[str, object], None],
) -> None:
    """The naive stop is still waiting long after the stubborn task caught its cancel."""

    async def main() -> None:
        release, caught = asyncio.Event(), asyncio.Event()
        stubborn = asyncio.create_task(_stubborn(release, caught), name="stubborn")
        await asyncio.sleep(0)  # let it reach release.wait()
        stopping = asyncio.create_task(naive_shutdown_tasks([stubborn]))
        await asyncio.wait_for(caught.wait(), MUST_HAPPEN)
        done, _ = await asyncio.wait([stopping], timeout=STAYS_BLOCKED)
        record_property(
            "observed",
            f"the task caught its cancel, and cancel-then-gather was still waiting {STAYS_BLOCKED}s"
            " later"
            if not done
            else "cancel-then-gather returned",
        )
        assert not done, "the naive stop returned"
        release.set()  # the test's own way out
        await asyncio.wait_for(stopping, MUST_HAPPEN)

    asyncio.run(main())


@pytest.mark.race("A7", "cancel then gather: one task that swallows the cancel hangs the stop")
def test_shutdown_tasks_returns_on_its_deadline_naming_the_stubborn_task() -> None:
    """shutdown_tasks returns within its budget and names the task that would not stop."""

    async def main() -> TaskShutdownReport:
        release, caught = asyncio.Event(), asyncio.Event()
        stubborn = asyncio.create_task(_stubborn(release, caught), name="stubborn")
        sleeper = asyncio.create_task(asyncio.Event().wait(), name="sleeper")
        await asyncio.sleep(0)
        started = time.monotonic()
        report = await shutdown_tasks([stubborn, sleeper], timeout=STAYS_BLOCKED)
        assert time.monotonic() - started < STAYS_BLOCKED + NOISE
        assert caught.is_set()
        release.set()
        assert await stubborn == "released"
        return report

    report = asyncio.run(main())
    assert not report.terminated
    assert report.still_running == ("stubborn",)
    assert report.cancelled == ("sleeper",)


def test_shutdown_tasks_sorts_every_task_into_one_outcome(caplog: pytest.LogCaptureFixture) -> None:
    """Finished, failed and cancelled tasks are each named once; the failure is logged."""

    async def main() -> TaskShutdownReport:
        async def fail() -> None:
            raise ValueError("boom")

        async def value() -> int:
            return 1

        done = asyncio.create_task(value(), name="done")
        failed = asyncio.create_task(fail(), name="failed")
        waiting = asyncio.create_task(asyncio.Event().wait(), name="waiting")
        await asyncio.wait([done, failed])
        return await shutdown_tasks([done, failed, waiting], timeout=MUST_HAPPEN)

    report = asyncio.run(main())
    assert report.terminated
    assert report.still_running == ()
    assert (report.finished, report.failed, report.cancelled) == (
        ("done",),
        ("failed",),
        ("waiting",),
    )
    logged = [r for r in caplog.records if r.getMessage() == "task failed failed"]
    assert len(logged) == 1


@pytest.mark.parametrize("timeout", [-1, float("nan"), -math.inf, "1", True, None])
def test_shutdown_tasks_refuses_a_bad_timeout(timeout: Any) -> None:
    """A timeout that is not a number of seconds >= 0 is a ValueError naming it."""
    with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0"):
        asyncio.run(shutdown_tasks([], timeout))


def test_shutdown_tasks_refuses_to_wait_for_its_caller() -> None:
    """A task that passes itself gets a ValueError, not a wait for itself."""

    async def main() -> None:
        me = asyncio.current_task()
        assert me is not None
        with pytest.raises(ValueError, match="cannot wait for the task that calls it"):
            await shutdown_tasks([me], 1.0)

    asyncio.run(main())


# --- A3: a fire-and-forget task collected mid-flight ---------------------------------------


async def _waiting_job(started: asyncio.Event, finished: list[str]) -> None:
    """Wait on a future that only this task references, then record that it finished."""
    started.set()
    await asyncio.get_running_loop().create_future()
    finished.append("finished")


def _the_only_other_task() -> weakref.ref[asyncio.Task[Any]]:
    task = next(t for t in asyncio.all_tasks() if t is not asyncio.current_task())
    return weakref.ref(task)


@pytest.mark.race("A3", "a task nobody references is garbage-collected before it finishes")
def test_naive_fire_and_forget_task_is_destroyed_by_the_collector(
    record_property: Callable[[str, object], None],
) -> None:
    """With no strong reference, gc.collect() destroys the waiting task mid-flight."""

    async def main() -> tuple[bool, list[str], list[str]]:
        errors = record_loop_errors(asyncio.get_running_loop())
        started, finished = asyncio.Event(), []
        naive_fire_and_forget(_waiting_job(started, finished))
        await started.wait()
        ref = _the_only_other_task()
        gc.collect()
        return ref() is None, finished, errors

    # Only the gc.collect() above may collect: an automatic collection, whose moment depends
    # on what earlier tests allocated, could take the task before the weak reference to it
    # is made (seen in every race-only run on 3.12 once earlier tests changed).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        collected, finished, errors = asyncio.run(main())
    finally:
        if was_enabled:
            gc.enable()
    record_property(
        "observed",
        f"gc.collect() {'destroyed' if collected else 'kept'} the running task, it finished"
        f" {len(finished)} of 1 jobs, the loop said {errors}",
    )
    assert collected
    assert finished == []
    assert "Task was destroyed but it is pending!" in errors


@pytest.mark.race("A3", "a task nobody references is garbage-collected before it finishes")
def test_task_set_keeps_its_tasks_alive_through_a_collection() -> None:
    """A TaskSet's strong reference survives gc.collect(); stop() then cancels the task."""

    async def main() -> tuple[bool, TaskShutdownReport, list[str]]:
        errors = record_loop_errors(asyncio.get_running_loop())
        started, finished = asyncio.Event(), []
        async with TaskSet() as tasks:
            tasks.spawn(_waiting_job(started, finished), name="job")
            await started.wait()
            ref = _the_only_other_task()
            gc.collect()
            alive = ref() is not None
            report = await tasks.stop()
        return alive, report, errors

    alive, report, errors = asyncio.run(main())
    assert alive
    assert report.cancelled == ("job",)
    assert errors == []


async def _sleeping_job(started: asyncio.Event, wake: asyncio.Event, done: asyncio.Event) -> None:
    """Sleep on one of the loop's timers, then say it finished."""
    started.set()
    await asyncio.sleep(0.01)
    done.set()


async def _job_on_a_kept_event(
    started: asyncio.Event, wake: asyncio.Event, done: asyncio.Event
) -> None:
    """Wait on an event the caller keeps a reference to, then say it finished."""
    started.set()
    await wake.wait()
    done.set()


@pytest.mark.parametrize("job", [_sleeping_job, _job_on_a_kept_event], ids=["sleep", "kept-event"])
def test_an_unreferenced_task_survives_a_collection_while_something_live_will_wake_it(
    job: Callable[[asyncio.Event, asyncio.Event, asyncio.Event], Coroutine[Any, Any, None]],
) -> None:
    """A3 needs a future nobody else holds: a loop timer or a kept event keeps the task alive."""

    async def main() -> tuple[bool, list[str]]:
        errors = record_loop_errors(asyncio.get_running_loop())
        started, wake, done = asyncio.Event(), asyncio.Event(), asyncio.Event()
        naive_fire_and_forget(job(started, wake, done))
        await started.wait()
        ref = _the_only_other_task()
        gc.collect()
        survived = ref() is not None
        wake.set()
        async with asyncio.timeout(MUST_HAPPEN):
            await done.wait()
        return survived, errors

    survived, errors = asyncio.run(main())
    assert survived
    assert errors == []


# --- A5: a task's exception nobody retrieves ----------------------------------------------


async def _fail(message: str) -> None:
    raise ValueError(message)


@pytest.mark.race("A5", "a failed background task is silent until it is collected")
def test_naive_kept_task_fails_silently(
    caplog: pytest.LogCaptureFixture, record_property: Callable[[str, object], None]
) -> None:
    """The naive set keeps the task, so its failure is reported only when the set is emptied."""

    async def main() -> tuple[list[str], list[str]]:
        errors = record_loop_errors(asyncio.get_running_loop())
        kept: set[asyncio.Task[Any]] = set()
        naive_keep(_fail("boom"), kept)
        await asyncio.wait(kept)
        for _ in range(3):
            await asyncio.sleep(0)  # the loop goes on; nothing is reported
        while_running = list(errors)
        kept.clear()
        gc.collect()
        return while_running, errors

    while_running, at_the_end = asyncio.run(main())
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
    record_property(
        "observed",
        f"the task raised ValueError: {len(while_running) + len(logged)} reports while the"
        f" program ran, then at the end {at_the_end}",
    )
    assert while_running == []
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert at_the_end == ["Task exception was never retrieved"]


@pytest.mark.race("A5", "a failed background task is silent until it is collected")
def test_task_set_logs_a_failure_when_it_happens(caplog: pytest.LogCaptureFixture) -> None:
    """A TaskSet logs a failed task at ERROR with its name at once; nothing is left unretrieved."""

    async def main() -> tuple[int, list[str]]:
        errors = record_loop_errors(asyncio.get_running_loop())
        async with TaskSet() as tasks:
            task = tasks.spawn(_fail("boom"), name="failer")
            await asyncio.wait([task])
            await asyncio.sleep(0)  # done callbacks run in the loop's next round
            logged = [r for r in caplog.records if r.getMessage() == "task failer failed"]
            assert len(logged) == 1
            del task
            gc.collect()
            failures = tasks.failures
        return failures, errors

    failures, errors = asyncio.run(main())
    assert failures == 1
    assert errors == []


# --- TaskSet under the lifecycle contract ---------------------------------------------------


def test_task_set_stop_is_idempotent_and_returns_the_same_report() -> None:
    """Two concurrent stops and a later one return the very same report object."""

    async def main() -> None:
        tasks = TaskSet(stop_timeout=MUST_HAPPEN).start()
        tasks.spawn(asyncio.Event().wait(), name="waiter")
        first = asyncio.create_task(tasks.stop())
        second = asyncio.create_task(tasks.stop())
        a, b = await asyncio.gather(first, second)
        assert a is b
        assert await tasks.stop() is a
        assert a.terminated
        assert a.cancelled == ("waiter",)
        assert len(tasks) == 0

    asyncio.run(main())


def test_task_set_refuses_work_outside_its_lifetime() -> None:
    """spawn() before start() or after stop() raises and closes the coroutine unrun."""

    async def main() -> None:
        tasks = TaskSet()
        ran: list[str] = []

        async def job() -> None:
            ran.append("ran")

        with pytest.raises(RuntimeError, match="not started"):
            tasks.spawn(job())
        tasks.start()
        with pytest.raises(RuntimeError, match="start\\(\\) can be called once"):
            tasks.start()
        await tasks.stop()
        with pytest.raises(RuntimeError, match="stopped"):
            tasks.spawn(job())
        await asyncio.sleep(0)
        assert ran == []

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a coroutine never awaited would warn
        asyncio.run(main())


def test_task_set_start_needs_a_running_loop() -> None:
    """start() outside a running loop raises RuntimeError; the constructor touches no loop."""
    tasks = TaskSet()
    with pytest.raises(RuntimeError):
        tasks.start()


def test_task_set_stop_from_its_own_task_is_a_request_that_returns_at_once() -> None:
    """From its own task, stop() starts the stop and returns a provisional report naming it."""

    async def main() -> None:
        got: list[TaskShutdownReport] = []
        async with TaskSet(stop_timeout=MUST_HAPPEN) as tasks:
            tasks.spawn(asyncio.Event().wait(), name="other")

            async def stopper() -> None:
                got.append(await tasks.stop())
                await asyncio.Event().wait()  # cancelled by the stop it asked for

            task = tasks.spawn(stopper(), name="stopper")
            await asyncio.wait([task], timeout=MUST_HAPPEN)
            assert task.cancelled()
        assert got == [TaskShutdownReport(terminated=False, still_running=("other", "stopper"))]
        final = await tasks.stop(0)
        assert (final.terminated, sorted(final.cancelled)) == (True, ["other", "stopper"])
        assert await tasks.stop() is final

    asyncio.run(main())


def test_async_with_on_a_started_task_set_returns_it_and_stops_it() -> None:
    """``async with tasks.start():`` enters the running set; a stopped one cannot be entered."""

    async def main() -> None:
        tasks = TaskSet()
        async with tasks.start() as same:
            assert same is tasks
            waiter = tasks.spawn(asyncio.Event().wait(), name="waiter")
        assert waiter.cancelled()
        assert (await tasks.stop()).cancelled == ("waiter",)
        with pytest.raises(RuntimeError, match="start\\(\\) can be called once"):
            async with tasks:
                pass

    asyncio.run(main())


@pytest.mark.race("A7", "cancel then gather: one task that swallows the cancel hangs the stop")
def test_task_set_a_second_concurrent_stop_is_bounded_by_its_own_budget() -> None:
    """Lesson: a stop that joins one under way waits its own budget, not the other's."""

    async def main() -> None:
        release, caught = asyncio.Event(), asyncio.Event()
        tasks = TaskSet().start()
        tasks.spawn(_stubborn(release, caught), name="stubborn")
        await asyncio.sleep(0)
        first = asyncio.create_task(tasks.stop(MUST_HAPPEN))
        await asyncio.wait_for(caught.wait(), MUST_HAPPEN)  # the first stop is waiting
        started = time.monotonic()
        second = await tasks.stop(STAYS_BLOCKED)
        took = time.monotonic() - started
        release.set()
        report = await first
        assert took < STAYS_BLOCKED + NOISE
        assert second == TaskShutdownReport(terminated=False, still_running=("stubborn",))
        assert (report.terminated, report.finished) == (True, ("stubborn",))
        assert await tasks.stop(0) is report

    asyncio.run(main())


@pytest.mark.parametrize("budget", [math.inf, 1e10, 1e300, 10**400])
def test_an_infinite_or_huge_budget_waits_as_long_as_it_takes(budget: float) -> None:
    """Infinite and huge budgets are accepted everywhere and never overflow a timer."""

    async def main() -> None:
        tasks = TaskSet(stop_timeout=budget).start()
        tasks.spawn(asyncio.Event().wait(), name="waiter")
        assert (await tasks.stop()).cancelled == ("waiter",)
        again = TaskSet().start()
        assert (await again.stop(budget)).terminated
        assert (await shutdown_tasks([], budget)).terminated
        assert await run_in_thread_with(None, budget, lambda token: "done") == "done"

    asyncio.run(main())


@pytest.mark.parametrize("bad", [math.nan, -1, True, "1", object()])
def test_every_seconds_argument_refuses_what_is_not_seconds_and_names_itself(bad: Any) -> None:
    """nan, negative, bool, str: ValueError naming the argument, before anything starts."""

    async def main() -> None:
        for name, call in [
            ("stop_timeout", lambda: TaskSet(stop_timeout=bad)),
            ("delay", lambda: retry_forever(asyncio.sleep, delay=bad).send(None)),
            ("cancel_timeout", lambda: run_in_thread_with(None, bad, print).send(None)),
        ]:
            with pytest.raises(ValueError, match=rf"^{name} must be a number of seconds >= 0"):
                call()
        tasks = TaskSet().start()
        with pytest.raises(ValueError, match=r"^timeout must be a number of seconds >= 0"):
            await tasks.stop(bad)
        await tasks.stop()

    asyncio.run(main())


def test_task_set_stop_is_bounded_by_its_budget() -> None:
    """A task that swallows its cancel makes stop() return on time with the task named."""

    async def main() -> TaskShutdownReport:
        release, caught = asyncio.Event(), asyncio.Event()
        tasks = TaskSet(stop_timeout=STAYS_BLOCKED).start()
        stubborn = tasks.spawn(_stubborn(release, caught), name="stubborn")
        await asyncio.sleep(0)
        started = time.monotonic()
        report = await tasks.stop()
        assert time.monotonic() - started < STAYS_BLOCKED + NOISE
        release.set()
        await stubborn
        return report

    report = asyncio.run(main())
    assert report.still_running == ("stubborn",)
    assert not report.terminated


# --- A4: a thread that a cancel cannot stop -------------------------------------------------


@pytest.mark.race("A4", "cancelling an asyncio.to_thread task leaves its thread running")
def test_naive_to_thread_keeps_running_after_its_task_is_cancelled(
    record_property: Callable[[str, object], None],
) -> None:
    """The awaiting task ends at once, but the blocking function goes on in its thread."""
    started, release, returned = threading.Event(), threading.Event(), threading.Event()

    def blocking() -> None:
        started.set()
        release.wait(MUST_HAPPEN)
        returned.set()

    async def main() -> bool:
        task = asyncio.create_task(naive_run_blocking(blocking))
        await asyncio.to_thread(started.wait, MUST_HAPPEN)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        still_running = not returned.wait(STAYS_BLOCKED)
        release.set()
        return still_running

    still_running = asyncio.run(main())
    record_property(
        "observed",
        f"the task was cancelled at once, its thread {'ran on' if still_running else 'stopped'}"
        f" {STAYS_BLOCKED}s later, until the test released it",
    )
    assert still_running, "the thread stopped on its own"
    assert returned.is_set()  # asyncio.run waited for it


@pytest.mark.race("A4", "cancelling an asyncio.to_thread task leaves its thread running")
def test_run_in_thread_sets_the_token_and_waits_for_the_thread() -> None:
    """Cancelling the task sets the token; the thread has returned when the task ends."""
    started, returned = threading.Event(), threading.Event()

    def blocking(token: threading.Event) -> None:
        started.set()
        if token.wait(MUST_HAPPEN):
            returned.set()

    async def main() -> bool:
        task = asyncio.create_task(run_in_thread(blocking))
        await asyncio.to_thread(started.wait, MUST_HAPPEN)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return returned.is_set()

    assert asyncio.run(main())


def test_run_in_thread_returns_the_result_and_raises_the_error() -> None:
    """Uncancelled, run_in_thread is to_thread with a token: same result, same exception."""

    def add(token: threading.Event, a: int, b: int = 0) -> int:
        assert not token.is_set()
        return a + b

    def fail(token: threading.Event) -> None:
        raise ValueError("boom")

    async def main() -> None:
        assert await run_in_thread(add, 1, b=2) == 3
        with pytest.raises(ValueError, match="boom"):
            await run_in_thread(fail)

    asyncio.run(main())


def test_run_in_thread_gives_up_waiting_after_cancel_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A function that ignores its token delays the cancel by cancel_timeout, then is logged."""
    started, release = threading.Event(), threading.Event()

    def deaf(token: threading.Event) -> None:
        started.set()
        release.wait(MUST_HAPPEN)

    async def main() -> float:
        task = asyncio.create_task(run_in_thread_with(None, STAYS_BLOCKED, deaf))
        await asyncio.to_thread(started.wait, MUST_HAPPEN)
        began = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        took = time.monotonic() - began
        release.set()
        return took

    took = asyncio.run(main())
    assert STAYS_BLOCKED * 0.9 <= took < STAYS_BLOCKED + NOISE
    assert any("still running" in r.getMessage() for r in caplog.records)


# --- TaskGroup and asyncio.timeout: the structured idioms ----------------------------------


def test_task_group_cancels_the_siblings_of_a_failed_task() -> None:
    """One failure in a TaskGroup cancels the others, runs their finally, and raises it."""

    async def main() -> list[str]:
        events: list[str] = []
        waiting = asyncio.Event()

        async def sibling() -> None:
            try:
                waiting.set()
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                events.append("sibling cancelled")
                raise
            finally:
                events.append("sibling cleaned up")

        async def failing() -> None:
            await waiting.wait()
            raise ValueError("boom")

        caught: list[BaseException] = []
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(sibling())
                group.create_task(failing())
        except ExceptionGroup as eg:
            caught.extend(eg.exceptions)
        assert [type(e) for e in caught] == [ValueError]
        return events

    assert asyncio.run(main()) == ["sibling cancelled", "sibling cleaned up"]


def test_asyncio_timeout_is_the_deadline_and_leaves_outside_cancels_alone() -> None:
    """asyncio.timeout turns its own cancel into TimeoutError; a cancel from outside stays one."""

    async def main() -> None:
        me = asyncio.current_task()
        assert me is not None
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.01):
                await asyncio.Event().wait()
        assert me.cancelling() == 0  # the timeout took back its own cancel

        blocked = asyncio.Event()

        async def inner() -> None:
            async with asyncio.timeout(MUST_HAPPEN):
                blocked.set()
                await asyncio.Event().wait()

        task = asyncio.create_task(inner())
        await blocked.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


# --- A10, A11: cleanup shielded from cancellation -------------------------------------------

ShieldHelper = Callable[[Coroutine[Any, Any, None]], Coroutine[Any, Any, None]]


def _bounded_shield(cleanup: Coroutine[Any, Any, None]) -> Coroutine[Any, Any, None]:
    return shielded(cleanup, MUST_HAPPEN, name="save")


async def _service(finish: ShieldHelper, cleanup: Coroutine[Any, Any, None]) -> None:
    """A handler whose last step, a save, must complete even if the handler is cancelled."""
    await finish(cleanup)


async def _save(started: asyncio.Event, proceed: asyncio.Event, log: list[str]) -> None:
    """A cleanup whose I/O completes when the test sets ``proceed``."""
    started.set()
    try:
        await proceed.wait()
    except asyncio.CancelledError:
        log.append("save cancelled")
        raise
    log.append("saved")


def _stop_a_service_mid_cleanup(finish: ShieldHelper) -> tuple[bool, bool, list[str]]:
    """Cancel a handler once its save has started; the save completes only if awaited.

    Returns whether the service ended before its save did, whether it ended cancelled, and
    the save's log once `asyncio.run` has returned (it cancels what is left at exit).
    """
    log: list[str] = []

    async def main() -> tuple[bool, bool]:
        started, proceed = asyncio.Event(), asyncio.Event()
        service = asyncio.create_task(_service(finish, _save(started, proceed, log)))
        await asyncio.wait_for(started.wait(), MUST_HAPPEN)
        service.cancel()
        done, _ = await asyncio.wait([service], timeout=STAYS_BLOCKED)
        if not done:  # the service waits for its save: let the save's I/O complete
            proceed.set()
            done, _ = await asyncio.wait([service], timeout=MUST_HAPPEN)
        assert done
        return not proceed.is_set(), service.cancelled()

    left_early, cancelled = asyncio.run(main())
    return left_early, cancelled, log


@pytest.mark.race(
    "A10", "asyncio.shield: a cancelled caller leaves its cleanup unowned, cut at exit"
)
def test_naive_shielded_cleanup_is_left_behind_and_cut_short_at_exit(
    record_property: Callable[[str, object], None],
) -> None:
    """The naive service ends at its cancel; asyncio.run then cancels the save it left running."""
    left_early, cancelled, log = _stop_a_service_mid_cleanup(naive_shielded_cleanup)
    record_property(
        "observed",
        f"the service {'ended at once' if left_early else 'waited'} (cancelled={cancelled}),"
        f" its shielded save still running; after asyncio.run the save's log is {log}",
    )
    assert left_early
    assert cancelled
    assert log == ["save cancelled"]


@pytest.mark.race(
    "A10", "asyncio.shield: a cancelled caller leaves its cleanup unowned, cut at exit"
)
def test_shielded_cleanup_finishes_before_the_cancellation_goes_on() -> None:
    """shielded() keeps the cancelled caller until its cleanup ends, then re-raises the cancel."""
    left_early, cancelled, log = _stop_a_service_mid_cleanup(_bounded_shield)
    assert not left_early
    assert cancelled  # the cancellation was held, not swallowed
    assert log == ["saved"]


async def _failing_save(started: asyncio.Event, proceed: asyncio.Event) -> None:
    started.set()
    await proceed.wait()
    raise OSError("disk full")


def _cleanup_fails_after_the_cancel(finish: ShieldHelper) -> tuple[bool, list[str]]:
    """Cancel a service mid-cleanup, then make the cleanup fail; return what the loop said."""

    async def main() -> tuple[bool, list[str]]:
        errors = record_loop_errors(asyncio.get_running_loop())
        started, proceed = asyncio.Event(), asyncio.Event()
        service = asyncio.create_task(_service(finish, _failing_save(started, proceed)))
        await asyncio.wait_for(started.wait(), MUST_HAPPEN)
        (inner,) = asyncio.all_tasks() - {service, asyncio.current_task()}
        service.cancel()
        await asyncio.wait([service], timeout=STAYS_BLOCKED)
        proceed.set()
        await asyncio.wait([service, inner], timeout=MUST_HAPPEN)
        assert service.done()
        assert inner.done()
        del inner
        gc.collect()  # the naive cleanup's only report comes when its task is freed
        return service.cancelled(), errors

    return asyncio.run(main())


@pytest.mark.race("A11", "a shielded cleanup that fails after its caller was cancelled is unheard")
def test_naive_shielded_cleanup_failure_reaches_nobody(
    caplog: pytest.LogCaptureFixture, record_property: Callable[[str, object], None]
) -> None:
    """The naive caller sees only its cancel; the OSError surfaces as 'never retrieved'."""
    cancelled, errors = _cleanup_fails_after_the_cancel(naive_shielded_cleanup)
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
    record_property(
        "observed",
        f"the caller ended cancelled={cancelled}; the save's OSError was logged {len(logged)}"
        f" times; the loop said only {errors} when the task was freed",
    )
    assert cancelled
    assert logged == []
    assert errors == ["Task exception was never retrieved"]


@pytest.mark.race("A11", "a shielded cleanup that fails after its caller was cancelled is unheard")
def test_shielded_cleanup_failure_is_logged_and_the_cancel_still_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """shielded() logs a cleanup's failure at ERROR and still re-raises the caller's cancel."""
    cancelled, errors = _cleanup_fails_after_the_cancel(_bounded_shield)
    assert cancelled
    assert errors == []
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert record.getMessage() == "save failed while its caller was being cancelled"
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], OSError)


def test_shielded_returns_the_result_and_raises_the_failure_when_not_cancelled() -> None:
    """Uncancelled, shielded() is a plain await: the cleanup's result or its exception."""

    async def value() -> int:
        return 7

    async def main() -> None:
        assert await shielded(value(), MUST_HAPPEN) == 7
        with pytest.raises(OSError, match="disk full"):
            await shielded(_failing_save(asyncio.Event(), _set_event()), MUST_HAPPEN)

    asyncio.run(main())


def _set_event() -> asyncio.Event:
    event = asyncio.Event()
    event.set()
    return event


@pytest.mark.parametrize("cancel_caller", [False, True], ids=["deadline", "cancelled-caller"])
def test_shielded_cancels_an_overdue_cleanup_at_its_deadline(
    cancel_caller: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """At the deadline the cleanup is cancelled; the caller gets its cancel, else TimeoutError."""

    async def main() -> tuple[type[BaseException], float, list[str]]:
        started, log = asyncio.Event(), []
        caller = asyncio.create_task(
            shielded(_save(started, asyncio.Event(), log), STAYS_BLOCKED, name="save")
        )
        await asyncio.wait_for(started.wait(), MUST_HAPPEN)
        began = time.monotonic()
        if cancel_caller:
            caller.cancel()
        await asyncio.wait([caller], timeout=MUST_HAPPEN)
        took = time.monotonic() - began
        await asyncio.sleep(0)  # the overdue cleanup takes its cancel
        outcome = asyncio.CancelledError if caller.cancelled() else type(caller.exception())
        return outcome, took, log

    outcome, took, log = asyncio.run(main())
    assert outcome is (asyncio.CancelledError if cancel_caller else TimeoutError)
    assert STAYS_BLOCKED * 0.9 <= took < STAYS_BLOCKED + NOISE
    assert log == ["save cancelled"]
    assert any(r.getMessage() == "save still running after 0.2s: cancelled" for r in caplog.records)


def test_shielded_under_asyncio_timeout_finishes_the_cleanup_then_times_out() -> None:
    """A deadline's cancel is held like any other: the cleanup ends, then TimeoutError comes."""

    async def main() -> list[str]:
        started, proceed, log = asyncio.Event(), asyncio.Event(), []

        async def caller() -> None:
            async with asyncio.timeout(0):
                await shielded(_save(started, proceed, log), MUST_HAPPEN)

        task = asyncio.create_task(caller())
        await asyncio.wait_for(started.wait(), MUST_HAPPEN)
        done, _ = await asyncio.wait([task], timeout=STAYS_BLOCKED)
        assert not done  # the timeout has fired (the save started after it) and is held
        proceed.set()
        await asyncio.wait([task], timeout=MUST_HAPPEN)
        assert isinstance(task.exception(), TimeoutError)
        return log

    assert asyncio.run(main()) == ["saved"]


# --- A12, A13: stopping a TaskGroup from outside ----------------------------------------------


class _Stop(Exception):
    pass


def test_the_documented_recipe_stops_a_task_group_and_waits_for_every_finally() -> None:
    """A child that raises a private exception stops the group; the others clean up first."""

    async def main() -> list[str]:
        events: list[str] = []
        ready, stop = asyncio.Event(), asyncio.Event()

        async def worker(name: str) -> None:
            try:
                ready.set()
                await asyncio.Event().wait()
            finally:
                events.append(f"{name} cleaned up")

        async def stopper() -> None:
            await stop.wait()
            raise _Stop

        async def owner() -> None:
            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(worker("a"))
                    group.create_task(worker("b"))
                    group.create_task(stopper())
            except* _Stop:
                events.append("group stopped")

        task = asyncio.create_task(owner())
        await asyncio.wait_for(ready.wait(), MUST_HAPPEN)
        stop.set()
        await asyncio.wait_for(task, MUST_HAPPEN)
        return events

    *cleanups, last = asyncio.run(main())
    assert sorted(cleanups) == ["a cleaned up", "b cleaned up"]  # in either order
    assert last == "group stopped"


def test_asyncio_timeout_around_a_task_group_raises_after_the_children_are_awaited() -> None:
    """At the deadline the children are cancelled and awaited; then TimeoutError is raised."""

    async def main() -> list[str]:
        events: list[str] = []

        async def child() -> None:
            try:
                await asyncio.Event().wait()
            finally:
                await asyncio.sleep(0)  # a cleanup with an await in it
                events.append("child cleaned up")

        try:
            async with asyncio.timeout(0.01), asyncio.TaskGroup() as group:
                group.create_task(child())
        except TimeoutError:
            events.append("TimeoutError")
        return events

    assert asyncio.run(main()) == ["child cleaned up", "TimeoutError"]


async def _stubborn_child(caught: asyncio.Event, release: asyncio.Event) -> str:
    """Swallow every cancel until ``release`` is set."""
    while not release.is_set():
        try:
            await release.wait()
        except asyncio.CancelledError:
            caught.set()
    return "released"


@pytest.mark.race("A12", "asyncio.timeout cannot bound a TaskGroup whose child ignores its cancel")
def test_naive_group_deadline_never_ends_a_group_whose_child_ignores_its_cancel(
    record_property: Callable[[str, object], None],
) -> None:
    """Past its deadline the naive group still waits, and swallows two more cancels of its task."""

    async def main() -> tuple[bool, str]:
        caught, release = asyncio.Event(), asyncio.Event()
        children = [_stubborn_child(caught, release), asyncio.Event().wait()]
        owner = asyncio.create_task(naive_run_group(children, 0.01))
        await asyncio.wait_for(caught.wait(), MUST_HAPPEN)  # the deadline has passed
        owner.cancel()
        owner.cancel()
        done, _ = await asyncio.wait([owner], timeout=STAYS_BLOCKED)
        release.set()  # the test's way out
        await asyncio.wait([owner], timeout=MUST_HAPPEN)
        ended = "cancelled" if owner.cancelled() else repr(owner.exception())
        return bool(done), ended

    done, ended = asyncio.run(main())
    record_property(
        "observed",
        f"the deadline passed and the task was cancelled twice more; {STAYS_BLOCKED}s later the"
        f" group was {'done' if done else 'still waiting'}; after the child gave in: {ended}",
    )
    assert not done


@pytest.mark.race("A12", "asyncio.timeout cannot bound a TaskGroup whose child ignores its cancel")
def test_stoppable_task_group_stop_returns_on_its_deadline_naming_the_stubborn_child() -> None:
    """StoppableTaskGroup.stop() returns within its budget and names the child that held it."""

    async def main() -> tuple[TaskShutdownReport, float, TaskShutdownReport]:
        caught, release, entered = asyncio.Event(), asyncio.Event(), asyncio.Event()
        group = StoppableTaskGroup(name="workers")

        async def owner() -> str:
            async with group:
                group.create_task(_stubborn_child(caught, release), name="stubborn")
                group.create_task(asyncio.Event().wait(), name="sleeper")
                entered.set()
            return "left the group"

        task = asyncio.create_task(owner())
        await asyncio.wait_for(entered.wait(), MUST_HAPPEN)
        began = time.monotonic()
        report = await group.stop(STAYS_BLOCKED)
        took = time.monotonic() - began
        assert caught.is_set()
        release.set()
        assert await asyncio.wait_for(task, MUST_HAPPEN) == "left the group"
        return report, took, await group.stop()

    report, took, again = asyncio.run(main())
    assert took < STAYS_BLOCKED + NOISE
    assert not report.terminated
    assert report.still_running == ("stubborn",)
    assert report.cancelled == ("sleeper",)
    assert again is report  # the first report is kept


def test_stoppable_task_group_keeps_the_childrens_own_exceptions() -> None:
    """The stop's own exception is removed; a child's failure reaches the owner in its group."""

    async def main() -> tuple[list[str], TaskShutdownReport]:
        events: list[str] = []
        ready = asyncio.Event()
        group = StoppableTaskGroup()

        async def fails_on_cancel() -> None:
            try:
                ready.set()
                await asyncio.Event().wait()
            finally:
                events.append("cleanup ran")
                raise OSError("flush failed")

        async def owner() -> None:
            try:
                async with group:
                    group.create_task(fails_on_cancel(), name="flusher")
                    group.create_task(asyncio.Event().wait(), name="idle")
            except* OSError as failures:
                events.append(f"owner got {[str(e) for e in failures.exceptions]}")
            events.append("owner went on")

        task = asyncio.create_task(owner())
        await asyncio.wait_for(ready.wait(), MUST_HAPPEN)
        report = await group.stop(MUST_HAPPEN)
        await asyncio.wait_for(task, MUST_HAPPEN)
        return events, report

    events, report = asyncio.run(main())
    assert events == ["cleanup ran", "owner got ['flush failed']", "owner went on"]
    assert report.terminated
    assert (report.failed, report.cancelled) == (("flusher",), ("idle",))


def test_stoppable_task_group_stop_while_the_group_is_already_aborting() -> None:
    """A stop after a child's failure has begun the abort adds nothing and leaks no coroutine."""

    async def main() -> TaskShutdownReport:
        caught, release = asyncio.Event(), asyncio.Event()
        group = StoppableTaskGroup()
        failures: list[str] = []

        async def owner() -> None:
            try:
                async with group:
                    group.create_task(_stubborn_child(caught, release), name="stubborn")
                    group.create_task(_fail("boom"), name="failer")
            except* ValueError as eg:
                failures.extend(str(e) for e in eg.exceptions)

        task = asyncio.create_task(owner())
        await asyncio.wait_for(caught.wait(), MUST_HAPPEN)  # the group is aborting
        report = await group.stop(STAYS_BLOCKED)
        release.set()
        await asyncio.wait_for(task, MUST_HAPPEN)
        assert failures == ["boom"]
        return report

    with warnings.catch_warnings(record=True) as caught_warnings:
        warnings.simplefilter("always")
        report = asyncio.run(main())
        gc.collect()
    assert [str(w.message) for w in caught_warnings] == []
    assert report.still_running == ("stubborn",)


async def _child_whose_cleanup_fails(ready: asyncio.Event) -> None:
    try:
        ready.set()
        await asyncio.Event().wait()
    finally:
        raise OSError("flush failed")


async def _cancel_an_owner_whose_child_fails(owner_body: Callable[[asyncio.Event], Any]) -> str:
    """Cancel the owner from outside; its child's cleanup fails. What did the owner do next?"""
    ready = asyncio.Event()

    async def owner() -> str:
        await owner_body(ready)
        try:
            await asyncio.sleep(0)  # the next await: a kept cancel is raised here
        except asyncio.CancelledError:
            return "got CancelledError at its next await"
        return "went on as if nobody had asked it to stop"

    task = asyncio.create_task(owner())
    await asyncio.wait_for(ready.wait(), MUST_HAPPEN)
    task.cancel()
    return await asyncio.wait_for(task, MUST_HAPPEN)


@pytest.mark.race("A13", "except* around a TaskGroup eats a stop when a child fails (3.11, 3.12)")
def test_naive_group_failure_swallows_an_outside_cancel_before_3_13(
    record_property: Callable[[str, object], None],
) -> None:
    """On 3.11 and 3.12 the ExceptionGroup replaces the cancel; 3.13 re-arms it (gh-116720)."""

    async def body(ready: asyncio.Event) -> None:
        await naive_run_group_logging_failures([_child_whose_cleanup_fails(ready)])

    outcome = asyncio.run(_cancel_an_owner_whose_child_fails(body))
    record_property("observed", f"Python {PY[0]}.{PY[1]}: the cancelled task {outcome}")
    if PY < (3, 13):
        assert outcome == "went on as if nobody had asked it to stop"
    else:
        assert outcome == "got CancelledError at its next await"


@pytest.mark.race("A13", "except* around a TaskGroup eats a stop when a child fails (3.11, 3.12)")
def test_stoppable_task_group_keeps_an_outside_cancel_on_every_version() -> None:
    """StoppableTaskGroup re-arms the cancel: the owner gets the failure, then the cancel."""
    failures: list[str] = []

    async def body(ready: asyncio.Event) -> None:
        try:
            async with StoppableTaskGroup() as group:
                group.create_task(_child_whose_cleanup_fails(ready))
        except* OSError as group_failures:
            failures.extend(str(e) for e in group_failures.exceptions)

    outcome = asyncio.run(_cancel_an_owner_whose_child_fails(body))
    assert failures == ["flush failed"]
    assert outcome == "got CancelledError at its next await"


async def _stop_a_group_from_outside(use_pattern: bool, body_waits: bool) -> tuple[int, str]:
    """Stop a group of one idle child from another task; return the owner's count and fate.

    ``body_waits``: the stop lands while the body awaits, else after it has ended.
    """
    ready, stop = asyncio.Event(), asyncio.Event()
    group = StoppableTaskGroup()

    async def idle() -> None:
        ready.set()
        await asyncio.Event().wait()

    async def stopper() -> None:
        await stop.wait()
        raise _Stop

    async def owner() -> tuple[int, str]:
        me = asyncio.current_task()
        assert me is not None
        try:
            if use_pattern:
                async with group:
                    group.create_task(idle())
                    if body_waits:
                        await asyncio.Event().wait()
            else:
                async with asyncio.TaskGroup() as plain:
                    plain.create_task(idle())
                    plain.create_task(stopper())
                    if body_waits:
                        await asyncio.Event().wait()
        except* _Stop:
            pass
        counted = me.cancelling()
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            return counted, "got CancelledError at its next await"
        return counted, "went on"

    task = asyncio.create_task(owner())
    await asyncio.wait_for(ready.wait(), MUST_HAPPEN)
    if use_pattern:
        assert (await group.stop(MUST_HAPPEN)).terminated
    else:
        stop.set()
    return await asyncio.wait_for(task, MUST_HAPPEN)


A14 = ("A14", "a TaskGroup that stops after its body ended leaves a cancel counted (3.11, 3.12)")


@pytest.mark.race(*A14)
def test_naive_task_group_stopped_after_its_body_leaves_a_cancel_counted(
    record_property: Callable[[str, object], None],
) -> None:
    """On 3.11 and 3.12 the group never takes back the cancel it sent its task; 3.13 does."""
    after_body = asyncio.run(_stop_a_group_from_outside(use_pattern=False, body_waits=False))
    in_body = asyncio.run(_stop_a_group_from_outside(use_pattern=False, body_waits=True))
    record_property(
        "observed",
        f"Python {PY[0]}.{PY[1]}: stopped after its body ended, the task counts"
        f" cancelling()={after_body[0]} and {after_body[1]}; stopped while the body waited,"
        f" cancelling()={in_body[0]}",
    )
    assert after_body == ((1, "went on") if PY < (3, 13) else (0, "went on"))
    assert in_body == (0, "went on")


@pytest.mark.race(*A14)
def test_stoppable_task_group_leaves_its_owner_uncancelled_on_every_version() -> None:
    """StoppableTaskGroup takes back the group's own cancel: cancelling() is 0 after a stop."""
    for body_waits in (False, True):
        assert asyncio.run(_stop_a_group_from_outside(use_pattern=True, body_waits=body_waits)) == (
            0,
            "went on",
        )


def test_asyncio_timeout_around_a_group_whose_child_fails_on_cancel_on_this_version() -> None:
    """The ExceptionGroup wins over TimeoutError on every version; 3.13 chains one into it."""

    async def main() -> BaseException:
        ready = asyncio.Event()
        try:
            async with asyncio.timeout(0.01), asyncio.TaskGroup() as group:
                group.create_task(_child_whose_cleanup_fails(ready))
        except BaseException as exc:
            assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
            return exc
        raise AssertionError("the group did not raise")

    raised = asyncio.run(main())
    assert isinstance(raised, ExceptionGroup)
    (failure,) = raised.exceptions
    assert isinstance(failure, OSError)
    chained = []
    context = failure.__context__
    while context is not None:
        chained.append(type(context).__name__)
        context = context.__context__
    if PY < (3, 13):
        assert chained == ["CancelledError"]
    else:
        assert chained == ["TimeoutError", "CancelledError"]


def test_stoppable_task_group_stop_outside_its_lifetime_and_from_inside() -> None:
    """Before entry a stop keeps it shut; from the owner it returns at once; after exit, done."""

    async def main() -> None:
        early = StoppableTaskGroup()
        report = await early.stop()
        assert report.terminated
        with pytest.raises(RuntimeError, match="can be entered once"):
            async with early:
                pass

        late = StoppableTaskGroup()
        async with late:
            late.create_task(asyncio.sleep(0), name="quick")
        assert (await late.stop()).terminated

        inner = StoppableTaskGroup()
        async with inner:
            inner.create_task(asyncio.Event().wait(), name="waiter")
            provisional = await inner.stop()  # from the owner: a request
            assert not provisional.terminated
            assert provisional.still_running == ("waiter",)
            refused = asyncio.sleep(0)
            with pytest.raises(RuntimeError, match="is stopping"):
                inner.create_task(refused)
        final = await inner.stop()
        assert final.terminated
        assert final.cancelled == ("waiter",)

    asyncio.run(main())


SWALLOWED = "cancellation swallowed?"


def _swallow_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The messages of the WARNING records that say a cancel was swallowed."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and SWALLOWED in r.getMessage()
    ]


@pytest.mark.parametrize("caller", ["owner", "child"])
def test_stoppable_task_group_stop_from_inside_warns_of_no_swallowed_cancel(
    caller: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A stop from the owner or a child returns a provisional report and logs no false warning."""

    async def main() -> tuple[list[TaskShutdownReport], TaskShutdownReport]:
        group = StoppableTaskGroup(name="workers")
        provisional: list[TaskShutdownReport] = []

        async def stopper() -> None:
            provisional.append(await group.stop())  # a request: returns at once
            await asyncio.Event().wait()  # cancelled here by the stop it asked for

        async with group:
            group.create_task(asyncio.Event().wait(), name="worker")
            if caller == "owner":
                provisional.append(await group.stop())
            else:
                group.create_task(stopper(), name="stopper")
        return provisional, await group.stop()

    with caplog.at_level(logging.WARNING, logger="patterns.asyncio_shutdown"):
        (report,), final = asyncio.run(main())
    running = ("worker",) if caller == "owner" else ("worker", "stopper")
    assert (report.terminated, sorted(report.still_running)) == (False, sorted(running))
    assert (final.terminated, sorted(final.cancelled)) == (True, sorted(running))
    assert _swallow_warnings(caplog) == []


def test_stoppable_task_group_stop_warns_when_a_child_swallows_its_cancel(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A child still running when the budget ends is named in a WARNING: it swallowed its cancel."""

    async def main() -> TaskShutdownReport:
        caught, release, entered = asyncio.Event(), asyncio.Event(), asyncio.Event()
        group = StoppableTaskGroup(name="workers")

        async def owner() -> None:
            async with group:
                group.create_task(_stubborn_child(caught, release), name="stubborn")
                entered.set()

        task = asyncio.create_task(owner())
        await asyncio.wait_for(entered.wait(), MUST_HAPPEN)
        report = await group.stop(0.1)
        assert caught.is_set()
        release.set()
        await asyncio.wait_for(task, MUST_HAPPEN)
        return report

    with caplog.at_level(logging.WARNING, logger="patterns.asyncio_shutdown"):
        report = asyncio.run(main())
    assert report.still_running == ("stubborn",)
    assert _swallow_warnings(caplog) == [
        "still running 0.1s after cancel (cancellation swallowed?): stubborn"
    ]


@pytest.mark.parametrize("bad", [-1, float("nan"), "1", True])
def test_shielded_and_the_group_refuse_seconds_that_are_not_seconds(bad: Any) -> None:
    """A bad timeout or stop_timeout is a ValueError naming it."""
    with pytest.raises(ValueError, match="stop_timeout must be"):
        StoppableTaskGroup(stop_timeout=bad)

    async def main() -> None:
        cleanup = asyncio.sleep(0)
        with pytest.raises(ValueError, match="timeout must be"):
            await shielded(cleanup, bad)
        cleanup.close()

    asyncio.run(main())


# --- the default executor at exit, per version ----------------------------------------------


def test_shutdown_default_executor_timeout_on_this_version() -> None:
    """3.11 has no timeout argument; 3.12.1 accepts it but waits anyway; 3.13 keeps it."""
    release = threading.Event()
    started = threading.Event()

    def job() -> None:
        started.set()
        release.wait(MUST_HAPPEN)

    async def main() -> bool:
        loop = asyncio.get_running_loop()
        pending = loop.run_in_executor(None, job)
        await asyncio.to_thread(started.wait, MUST_HAPPEN)
        if PY < (3, 12):
            assert not hasattr(asyncio.constants, "THREAD_JOIN_TIMEOUT")
            with pytest.raises(TypeError):
                await loop.shutdown_default_executor(0.05)  # type: ignore[call-arg]
            release.set()
            await pending
            return True
        assert asyncio.constants.THREAD_JOIN_TIMEOUT == 300  # what asyncio.run passes
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            shutting = asyncio.create_task(loop.shutdown_default_executor(0.05))
            # 3.13 must return after 0.05 s (bounded generously); 3.11/3.12 are watched 1 s.
            watch = MUST_HAPPEN if PY >= (3, 13) else 1.0
            done, _ = await asyncio.wait([shutting], timeout=watch)
            release.set()
            await shutting
            await pending
        kept = bool(done)
        assert kept == bool([w for w in caught if issubclass(w.category, RuntimeWarning)])
        return kept

    # asyncio.run calls shutdown_default_executor again at the end: nothing is left then.
    kept_its_timeout = asyncio.run(main())
    if PY == (3, 12):
        assert not kept_its_timeout  # 3.12.1: `await future` before the timed join
    else:
        assert kept_its_timeout


A8_NAIVE = """
import asyncio, sys, threading
started = threading.Event()
def job():
    started.set()
    sys.stdin.readline()
    print("job finished", flush=True)
async def main():
    from patterns.naive.asyncio_shutdown import naive_run_blocking
    asyncio.create_task(naive_run_blocking(job))
    await asyncio.to_thread(started.wait, 30)
    print("main returned", flush=True)
asyncio.run(main())
print("run returned", flush=True)
"""

A8_PATTERN = """
import asyncio, threading
from patterns.asyncio_shutdown import run_in_thread
started = threading.Event()
def job(token):
    started.set()
    if token.wait(30):
        print("job saw its token", flush=True)
async def main():
    asyncio.create_task(run_in_thread(job))
    await asyncio.to_thread(started.wait, 30)
    print("main returned", flush=True)
asyncio.run(main())
print("run returned", flush=True)
"""


@pytest.mark.race("A8", "asyncio.run waits at exit for a to_thread job nobody can stop")
def test_naive_asyncio_run_waits_at_exit_for_the_thread(
    record_property: Callable[[str, object], None],
) -> None:
    """After main returns, asyncio.run does not return until the blocking job ends."""
    with child(A8_NAIVE) as c:
        c.expect("main returned")
        with pytest.raises(subprocess.TimeoutExpired):
            c.proc.wait(STAYS_BLOCKED)  # asyncio.run is waiting for the job
        assert c.proc.stdin is not None
        c.proc.stdin.write("\n")
        c.proc.stdin.flush()
        rest = c.rest()
        record_property(
            "observed",
            f"main returned, asyncio.run still waited {STAYS_BLOCKED}s for the thread, then"
            f" printed {rest}, status {c.proc.returncode}",
        )
        assert rest == ["job finished", "run returned"]
        assert c.proc.returncode == 0


@pytest.mark.race("A8", "asyncio.run waits at exit for a to_thread job nobody can stop")
def test_run_in_thread_lets_asyncio_run_end_promptly() -> None:
    """Cancelling the tasks at the end of asyncio.run sets the token, so the exit is prompt."""
    with child(A8_PATTERN) as c:
        c.expect("main returned")
        began = time.monotonic()
        assert c.rest() == ["job saw its token", "run returned"]
        assert time.monotonic() - began < MUST_HAPPEN
        assert c.proc.returncode == 0


A8_SHORT_JOIN = """
import asyncio, asyncio.constants, sys, threading, warnings
warnings.simplefilter("ignore")  # 3.13's RuntimeWarning is not what we look at
asyncio.constants.THREAD_JOIN_TIMEOUT = 0.2  # what asyncio.run passes on 3.12+ (300 s)
started = threading.Event()
def job():
    started.set()
    sys.stdin.readline()
    print("job finished", flush=True)
async def main():
    asyncio.create_task(asyncio.to_thread(job))
    await asyncio.to_thread(started.wait, 30)
    print("main returned", flush=True)
asyncio.run(main())
print("run returned", flush=True)
"""


def test_asyncio_run_at_exit_waits_for_the_default_executor_as_this_version_does() -> None:
    """3.11 and 3.12.1 wait in asyncio.run with no limit; 3.13 gives up there, exit still waits."""
    with child(A8_SHORT_JOIN) as c:
        c.expect("main returned")
        if PY >= (3, 13):
            c.expect("run returned")  # after THREAD_JOIN_TIMEOUT (0.2 s here), job or not
        with pytest.raises(subprocess.TimeoutExpired):
            c.proc.wait(STAYS_BLOCKED)  # in asyncio.run (3.11, 3.12) or interpreter exit
        assert c.proc.stdin is not None
        c.proc.stdin.write("\n")
        c.proc.stdin.flush()
        rest = c.rest()
        assert rest == (["job finished"] if PY >= (3, 13) else ["job finished", "run returned"])
        assert c.proc.returncode == 0


def test_a_task_set_driven_from_synchronous_code_keeps_the_contract() -> None:
    """The sync adapter the contract test uses: bounded stop, the same report, nothing left."""
    before = set(threading.enumerate())
    with LoopThreadTaskSet(stop_timeout=MUST_HAPPEN, name="sync") as tasks:
        pass
    report = tasks.stop()
    assert report is tasks.stop(0.0)
    assert (report.terminated, report.still_running) == (True, ())
    assert report.cancelled == ("sync-waiter",)
    assert [t for t in threading.enumerate() if t not in before] == []


def test_a_report_cannot_say_terminated_with_tasks_still_running() -> None:
    """The report refuses the lie: terminated=True with a non-empty still_running."""
    with pytest.raises(ValueError, match=r"terminated=True with still_running=.*stubborn"):
        TaskShutdownReport(terminated=True, still_running=("stubborn",))
