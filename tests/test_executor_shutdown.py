"""Executor shutdown: each pitfall forced to happen, then the pattern that prevents it."""

from __future__ import annotations

import _thread
import asyncio
import contextlib
import gc
import inspect
import io
import logging
import math
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from unittest import mock

import pytest

from patterns.executor_shutdown import (
    Rejected,
    ShutdownReport,
    TrackingExecutor,
    await_termination,
    feed,
    finish_early,
    run_all,
    shutdown_and_await,
    shutdown_now,
    stop_then_close,
)
from patterns.naive.executor_shutdown import (
    naive_feed,
    naive_finish_early,
    naive_shutdown_now,
    naive_stop_and_wait,
    naive_stop_then_close,
)
from tests.support import (
    MUST_HAPPEN,
    NOISE,
    STAYS_BLOCKED,
    Gate,
    elapsed,
    join_or_fail,
    run_in_thread,
    run_python,
    signal_main_during,
    spawn_python,
    stays_blocked,
    wait_until,
    wait_until_blocked_in,
)


def returns(value: object) -> Callable[[], object]:
    """A task that returns `value`, named so a report of it reads well."""

    def task() -> object:
        return value

    task.__qualname__ = f"returns({value!r})"
    return task


def finish(executor: TrackingExecutor, *gates: Gate) -> None:
    """Release every gate and make sure the executor has really terminated."""
    for gate in gates:
        gate.open()
    executor.shutdown(wait=False)
    assert await_termination(executor, MUST_HAPPEN)


# --- the building blocks ------------------------------------------------------------------


def test_shutdown_now_returns_exactly_the_never_started_callables_in_submission_order() -> None:
    """shutdown_now hands back every queued task, in order, and none that already started."""
    pool = TrackingExecutor(max_workers=1)
    gate = Gate("running task")
    running = pool.submit(gate.arrive)
    queued = [pool.submit(returns(i)) for i in range(5)]
    gate.wait_reached()

    never_started = shutdown_now(pool)

    assert [task() for task in never_started] == [0, 1, 2, 3, 4]
    assert all(f.cancelled() for f in queued)
    assert running.running()
    finish(pool, gate)
    assert running.result() is None


def test_shutdown_now_returns_nothing_when_nothing_was_queued() -> None:
    """With no queued work there is nothing to hand back, and the pool still terminates."""
    pool = TrackingExecutor(max_workers=2)
    assert pool.submit(returns("done")).result(MUST_HAPPEN) == "done"
    assert shutdown_now(pool) == []
    assert await_termination(pool, MUST_HAPPEN)


def test_shutdown_and_await_returns_within_budget_and_names_a_stuck_task() -> None:
    """A task that never finishes cannot hold shutdown_and_await past timeout + force_timeout."""
    pool = TrackingExecutor(max_workers=1)
    gate = Gate("stuck task")
    stuck = pool.submit(gate.arrive)
    queued = pool.submit(returns("never"))
    gate.wait_reached()

    with elapsed() as took:
        report = shutdown_and_await(pool, 0.2, force_timeout=0.3)

    assert took() < 0.2 + 0.3 + NOISE
    assert not report.terminated
    assert report.forced
    assert report.running_futures == (stuck,)
    assert report.still_running == tuple(t.name for t in pool.worker_threads())
    assert len(report.still_running) == 1
    assert [task() for task in report.never_started] == ["never"]
    assert queued.cancelled()
    finish(pool, gate)


def test_shutdown_and_await_lets_queued_work_finish_when_there_is_time() -> None:
    """The graceful phase runs every queued task; nothing is forced or left behind."""
    pool = TrackingExecutor(max_workers=2)
    futures = [pool.submit(returns(i)) for i in range(20)]

    report = shutdown_and_await(pool, MUST_HAPPEN, force_timeout=MUST_HAPPEN)

    assert report.terminated
    assert not report.forced
    assert report.never_started == ()
    assert report.still_running == ()
    assert report.running_futures == ()
    assert [f.result() for f in futures] == list(range(20))
    assert not any(t.is_alive() for t in pool.worker_threads())


def test_shutdown_and_await_is_idempotent() -> None:
    """A second call on a terminated executor reports termination at once."""
    pool = TrackingExecutor(max_workers=1)
    pool.submit(returns(1))
    assert shutdown_and_await(pool, MUST_HAPPEN, force_timeout=0).terminated
    second = shutdown_and_await(pool, MUST_HAPPEN, force_timeout=0)
    assert second.terminated
    assert not second.forced


def test_await_termination_refuses_an_executor_that_was_never_shut_down() -> None:
    """Waiting for termination without a shutdown could only time out, so it is an error."""
    pool = TrackingExecutor(max_workers=1)
    with pytest.raises(RuntimeError, match="shut down"):
        await_termination(pool, 0)
    pool.shutdown()


def test_keyboard_interrupt_while_awaiting_forces_the_executor_and_is_re_raised() -> None:
    """Ctrl-C during the wait cancels queued work and propagates, as Java's idiom does."""
    assert threading.current_thread() is threading.main_thread()
    pool = TrackingExecutor(max_workers=1)
    gate = Gate("stuck task")
    pool.submit(gate.arrive)
    queued = pool.submit(returns("never"))
    gate.wait_reached()
    main = threading.main_thread()
    handled = threading.Event()

    def ctrl_c_once(signum: int, frame: object) -> None:
        # Raise exactly once, however many signals arrive.
        if not handled.is_set():
            handled.set()
            raise KeyboardInterrupt

    def interrupt_main() -> None:
        wait_until_blocked_in(main, "await_termination")
        # A signal that lands in the instant between the last bytecode and the blocking
        # C call is only seen when the wait ends, so repeat it until it has been handled.
        while not handled.wait(0.05):
            signal.pthread_kill(main.ident or 0, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, ctrl_c_once)
    interrupter = threading.Thread(target=interrupt_main, name="interrupter")
    try:
        interrupter.start()
        with pytest.raises(KeyboardInterrupt):
            shutdown_and_await(pool, MUST_HAPPEN, force_timeout=MUST_HAPPEN)
    finally:
        signal.signal(signal.SIGINT, previous)
        handled.set()
        join_or_fail(interrupter)

    assert queued.cancelled()
    finish(pool, gate)


def test_keyboard_interrupt_during_the_forced_wait_calls_on_force_only_once() -> None:
    """on_force runs once even when Ctrl-C lands in the forced wait, after on_force ran."""
    assert threading.current_thread() is threading.main_thread()
    pool = TrackingExecutor(max_workers=1)
    forced = threading.Event()  # set by on_force: the forced wait is about to begin
    calls: list[str] = []
    started = threading.Event()

    def on_force() -> None:
        calls.append("on_force")
        forced.set()

    def interrupt_during_the_forced_wait() -> None:
        started.set()
        # Checkpoint: on_force has run, so the caller is in (or entering) the forced wait.
        assert forced.wait(MUST_HAPPEN)
        # Trips the SIGINT handler in the main thread; returning right after ends the
        # forced wait, and the KeyboardInterrupt is raised at the caller's next bytecode.
        _thread.interrupt_main()

    pool.submit(interrupt_during_the_forced_wait)
    assert started.wait(MUST_HAPPEN)  # running, so the graceful wait cannot succeed
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            # timeout=0: the graceful wait gives up at once, so on_force runs at once;
            # force_timeout is generous, the task ends the forced wait itself.
            shutdown_and_await(pool, 0, force_timeout=MUST_HAPPEN, on_force=on_force)
    finally:
        signal.signal(signal.SIGINT, previous)
        forced.set()  # only matters if on_force never ran: let the task end

    assert calls == ["on_force"]
    finish(pool)


def test_a_failed_task_is_logged_when_it_fails_even_if_nobody_reads_its_future(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """TrackingExecutor logs each failure with its traceback; cancellations are not errors."""

    def boom() -> None:
        raise ValueError("boom")

    pool = TrackingExecutor(max_workers=1)
    gate = Gate()
    pool.submit(gate.arrive)
    pool.submit(boom)
    cancelled = pool.submit(returns("cancelled"))
    gate.wait_reached()
    assert cancelled.cancel()
    gate.open()
    pool.shutdown(wait=True)  # joins the worker, so its done-callbacks have run

    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert errors[0].exc_info is not None
    assert errors[0].exc_info[0] is ValueError


def test_pending_forgets_finished_tasks() -> None:
    """Only unfinished work is remembered, so tracking costs nothing once tasks are done."""
    pool = TrackingExecutor(max_workers=2)
    for f in [pool.submit(returns(i)) for i in range(100)]:
        f.result(MUST_HAPPEN)
    pool.shutdown(wait=True)
    assert pool.pending() == []


# --- the lifecycle contract: start(), stop(timeout), the with block ----------------------


def test_the_constructor_validates_stop_timeout_and_starts_no_thread() -> None:
    """A bad budget is a ValueError naming the option; a good one starts nothing."""
    before = threading.active_count()
    for bad in (-1.0, float("nan"), "5", True):
        with pytest.raises(ValueError, match="stop_timeout"):
            TrackingExecutor(max_workers=1, stop_timeout=bad)  # type: ignore[arg-type]
    pool = TrackingExecutor(max_workers=1, stop_timeout=2.5)
    assert pool.stop_timeout == 2.5
    assert pool.start() is pool
    assert threading.active_count() == before  # workers start lazily, in submit
    assert pool.stop().terminated


def test_start_twice_or_after_stop_raises() -> None:
    """start() never silently skips: a second start, or a start after stop, raises."""
    pool = TrackingExecutor(max_workers=1).start()
    with pytest.raises(RuntimeError, match="already started"):
        pool.start()
    pool.stop()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.start()


def test_stop_on_a_never_started_executor_reports_termination_and_forbids_start() -> None:
    """Stopping what never ran is a clean, terminated stop, and the executor stays stopped."""
    pool = TrackingExecutor(max_workers=1)
    report = pool.stop()
    assert report.terminated
    assert report.still_running == ()
    with pytest.raises(RuntimeError):
        pool.start()
    with pytest.raises(Rejected):
        pool.submit(returns(1))


def test_a_submit_before_start_is_accepted_as_thread_pool_executor_does() -> None:
    """start() only marks the lifecycle: work submitted before it runs, as in the base class."""
    pool = TrackingExecutor(max_workers=1)
    assert pool.submit(returns("early")).result(MUST_HAPPEN) == "early"
    pool.start()
    assert pool.stop().terminated


def test_stop_returns_the_very_same_report_whatever_the_second_timeout() -> None:
    """stop() is idempotent: the first report is the answer for every later call."""
    pool = TrackingExecutor(max_workers=1).start()
    pool.submit(returns(1))
    first = pool.stop(MUST_HAPPEN)
    assert pool.stop() is first
    assert pool.stop(0) is first


def test_stop_refuses_a_negative_timeout() -> None:
    """A negative budget is a ValueError, before and after the executor stopped."""
    pool = TrackingExecutor(max_workers=1).start()
    with pytest.raises(ValueError, match="timeout"):
        pool.stop(-1)
    pool.stop()
    with pytest.raises(ValueError, match="timeout"):
        pool.stop(-0.5)


def test_stop_without_a_timeout_is_bounded_by_stop_timeout_and_forces_with_on_force() -> None:
    """stop() uses stop_timeout, not forever: a stuck task is named, on_force runs once."""
    gate = Gate("stuck task")
    forced: list[str] = []
    pool = TrackingExecutor(max_workers=1, stop_timeout=0.4, on_force=lambda: forced.append("on"))
    pool.start()
    pool.submit(gate.arrive)
    queued = pool.submit(returns("never"))
    gate.wait_reached()

    with elapsed() as took:
        report = pool.stop()

    assert took() < 0.4 + NOISE
    assert not report.terminated
    assert report.forced
    assert forced == ["on"]
    assert report.still_running == tuple(t.name for t in pool.worker_threads())
    assert [task() for task in report.never_started] == ["never"]
    assert queued.cancelled()
    finish(pool, gate)


def test_leaving_a_with_block_stops_within_the_budget_instead_of_waiting_forever() -> None:
    """ThreadPoolExecutor's __exit__ waits without a limit; TrackingExecutor's calls stop()."""
    gate = Gate("stuck task")
    with elapsed() as took, TrackingExecutor(max_workers=1, stop_timeout=0.3) as pool:
        pool.submit(gate.arrive)
        gate.wait_reached()
    assert took() < 0.3 + NOISE
    report = pool.stop()  # the report the with block produced
    assert not report.terminated
    assert len(report.still_running) == 1
    finish(pool, gate)


def test_stop_from_one_of_the_pools_own_tasks_is_a_request_that_returns_at_once() -> None:
    """A task's stop() shuts the pool down, names its own thread, and waits for nothing.

    The task calls stop() as soon as it runs, possibly before its submit has recorded the
    new worker thread: the pool must know it all the same.
    """
    pool = TrackingExecutor(max_workers=1, thread_name_prefix="own").start()
    gate = Gate("the task, once the queue is filled")

    def stops_its_pool() -> object:
        gate.arrive()
        return pool.stop(MUST_HAPPEN)

    future = pool.submit(stops_its_pool)
    gate.wait_reached()
    queued = pool.submit(returns("still runs"))
    gate.open()

    provisional = future.result(MUST_HAPPEN)
    assert not provisional.terminated
    assert provisional.still_running == ("own_0",)
    assert pool.is_shutdown  # the request took effect: graceful, so the queue still runs
    assert queued.result(MUST_HAPPEN) == "still runs"
    report = pool.stop(MUST_HAPPEN)
    assert report.terminated
    assert report is not provisional


# --- a worker thread that cannot start (ThreadPoolExecutor starts them lazily, in submit) --


@contextlib.contextmanager
def worker_start_fails_on(k: int, prefix: str) -> Iterator[None]:
    """Make the k-th start of a thread whose name begins with ``prefix`` fail.

    It fails as CPython does when the OS refuses a thread; other threads start normally.
    """
    real_start = threading.Thread.start
    calls = 0

    def start(thread: threading.Thread) -> None:
        nonlocal calls
        if thread.name.startswith(prefix):
            calls += 1
            if calls == k:
                raise RuntimeError("can't start new thread")
        real_start(thread)

    with mock.patch.object(threading.Thread, "start", start):
        yield


def test_a_worker_that_cannot_start_does_not_turn_an_accepted_task_into_a_rejection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With a worker running, a failed extra start costs parallelism, not the task."""
    pool = TrackingExecutor(max_workers=2, thread_name_prefix="lazy")
    gate = Gate("first task")
    try:
        with worker_start_fails_on(2, "lazy"):
            pool.submit(gate.arrive)
            gate.wait_reached()
            second = pool.submit(returns("second"))  # the pool tries and fails to add a worker
    finally:
        gate.open()  # so no thread is left behind if submit raised
    assert len(pool.worker_threads()) == 1
    assert "could not start" in caplog.text
    finish(pool, gate)
    assert second.result(0) == "second"  # run by the one worker, once the first was done


def test_a_task_rejected_because_no_worker_could_start_never_runs() -> None:
    """Rejected means never run: the task is withdrawn, not left for a later worker."""
    pool = TrackingExecutor(max_workers=1, thread_name_prefix="lazy")
    ran: list[str] = []
    with worker_start_fails_on(1, "lazy"), pytest.raises(Rejected, match="start") as info:
        pool.submit(ran.append, "rejected")
    later = pool.submit(ran.append, "later")  # this one starts a worker
    assert later.result(MUST_HAPPEN) is None
    finish(pool)
    assert ran == ["later"]
    info.value.task()  # the caller still holds the refused task
    assert ran == ["later", "rejected"]


def test_shutdown_and_await_racing_a_submit_waits_for_the_task_it_lets_in() -> None:
    """A shutdown that arrives mid-submit lets that task in and waits for it: none slips past."""
    pool = TrackingExecutor(max_workers=1, thread_name_prefix="racing")
    in_submit = Gate("submit, starting the pool's first worker")
    ran: list[str] = []
    real_start = threading.Thread.start

    def parked_start(thread: threading.Thread) -> None:
        if thread.name.startswith("racing"):
            in_submit.arrive()  # the submit is half done: the task is queued, no worker yet
        real_start(thread)

    with mock.patch.object(threading.Thread, "start", parked_start):
        submitter, submitted = run_in_thread(lambda: pool.submit(ran.append, "task"), "submitter")
        in_submit.wait_reached()
        stopper, stopped = run_in_thread(
            lambda: shutdown_and_await(pool, MUST_HAPPEN, force_timeout=0), "stopper"
        )
        try:
            # It waits for the submit's lock first, to shut the executor down.
            wait_until_blocked_in(stopper, "shutdown")
            assert stays_blocked(stopper)  # it waits for the submit in progress to finish
        finally:
            in_submit.open()
        join_or_fail(submitter)
        join_or_fail(stopper)

    assert submitted["result"].result(0) is None  # accepted, not rejected
    assert ran == ["task"]
    report = stopped["result"]
    assert report.terminated
    assert report.never_started == ()


# --- P1: shutdown(wait=False), then closing a resource the tasks still use ---------------


def write_after(gate: Gate, out: io.StringIO, text: str) -> None:
    """A task that is parked at `gate`, then writes to `out`."""
    gate.arrive()
    out.write(text)


@pytest.mark.race("P1", "shutdown(wait=False), then closing a resource the tasks use")
def test_naive_stop_then_close_breaks_the_running_task(
    record_property: Callable[[str, object], None],
) -> None:
    """shutdown(wait=False) returns while the task still runs, so the close wins the race."""
    pool = ThreadPoolExecutor(max_workers=1)
    out = io.StringIO()
    gate = Gate("task before its write")
    task = pool.submit(write_after, gate, out, "result")
    gate.wait_reached()

    naive_stop_then_close(pool, out)
    gate.open()

    error = task.exception(MUST_HAPPEN)
    record_property(
        "observed", f"the close came first: the task's write raised {type(error).__name__}: {error}"
    )
    assert isinstance(error, ValueError)
    assert "closed file" in str(error)
    pool.shutdown(wait=True)


@pytest.mark.race("P1", "shutdown(wait=False), then closing a resource the tasks use")
def test_stop_then_close_closes_only_after_every_task_is_done() -> None:
    """Awaiting termination first means the task's write lands before the close."""
    pool = TrackingExecutor(max_workers=1)
    out = io.StringIO()
    closed_value: list[str] = []
    out.close = lambda: closed_value.append(out.getvalue())  # type: ignore[method-assign]
    gate = Gate("task before its write")
    task = pool.submit(write_after, gate, out, "result")
    gate.wait_reached()

    stopper, outcome = run_in_thread(
        lambda: stop_then_close(pool, out, MUST_HAPPEN, force_timeout=0), "stopper"
    )
    wait_until_blocked_in(stopper, "await_termination")
    assert closed_value == []  # still waiting: the task has not written yet
    gate.open()
    join_or_fail(stopper)

    assert outcome["result"].terminated
    assert task.result() is None
    assert closed_value == ["result"]


def test_stop_then_close_leaves_the_resource_open_while_a_task_may_still_use_it() -> None:
    """When the deadline passes with a task running, closing would break it, so it is skipped."""
    pool = TrackingExecutor(max_workers=1)
    out = io.StringIO()
    gate = Gate("stuck task")
    pool.submit(write_after, gate, out, "late")
    gate.wait_reached()

    report = stop_then_close(pool, out, 0.05, force_timeout=0.05)

    assert not report.terminated
    assert not out.closed
    finish(pool, gate)
    assert out.getvalue() == "late"


# --- P2: cancel_futures=True is not shutdownNow() ----------------------------------------


@pytest.mark.race("P2", "cancel_futures=True leaves running tasks running, returns nothing")
def test_naive_shutdown_now_leaves_the_running_task_running_and_loses_the_queue(
    caplog: pytest.LogCaptureFixture,
    record_property: Callable[[str, object], None],
) -> None:
    """After shutdown(cancel_futures=True) the running task goes on, and queued work is gone."""
    pool = ThreadPoolExecutor(max_workers=1)
    gate = Gate("long task")
    ran: list[str] = []

    def long_task() -> None:
        gate.arrive()
        ran.append("long task")

    running = pool.submit(long_task)
    queued = pool.submit(lambda: ran.append("queued"))
    gate.wait_reached()

    naive_shutdown_now(pool)  # returns None: there is no list of what it cancelled

    assert queued.cancelled()
    assert running.running()
    assert not running.cancel()  # nothing can stop it from outside
    gate.open()
    pool.shutdown(wait=True)
    record_property(
        "observed",
        f"the running task went on to its end, the queued one never ran: ran={ran},"
        f" {len(caplog.records)} log records",
    )
    # The running task ran to its end; the queued one never ran, and nothing handed it
    # back or even logged that it was dropped.
    assert ran == ["long task"]
    assert caplog.records == []


@pytest.mark.race("P2", "cancel_futures=True leaves running tasks running, returns nothing")
def test_forced_shutdown_returns_the_queue_and_stops_a_cooperative_running_task() -> None:
    """shutdown_and_await hands back queued tasks and on_force stops a task that checks a flag."""
    pool = TrackingExecutor(max_workers=1)
    stop = threading.Event()
    started = threading.Event()

    def cooperative_task() -> str:
        started.set()
        return "stopped early" if stop.wait(MUST_HAPPEN) else "ran to the end"

    running = pool.submit(cooperative_task)
    pool.submit(returns("queued"))
    assert started.wait(MUST_HAPPEN)

    report = shutdown_and_await(pool, 0, force_timeout=MUST_HAPPEN, on_force=stop.set)

    assert report.forced
    assert report.terminated
    assert [task() for task in report.never_started] == ["queued"]
    assert running.result() == "stopped early"


# --- P3: shutdown(wait=True) has no timeout ------------------------------------------------


@pytest.mark.race("P3", "shutdown(wait=True) has no timeout")
def test_naive_shutdown_wait_blocks_for_as_long_as_a_task_is_stuck(
    record_property: Callable[[str, object], None],
) -> None:
    """shutdown(wait=True) cannot give up: it stays blocked until the stuck task is released."""
    pool = ThreadPoolExecutor(max_workers=1)
    gate = Gate("stuck task")
    pool.submit(gate.arrive)
    gate.wait_reached()

    called_at = time.monotonic()
    waiter, _ = run_in_thread(lambda: naive_stop_and_wait(pool), "shutdown-waiter")

    assert stays_blocked(waiter)
    gate.open()
    join_or_fail(waiter)
    record_property(
        "observed",
        f"shutdown(wait=True) stayed blocked {time.monotonic() - called_at:.1f}s,"
        " until the test released the stuck task",
    )


@pytest.mark.race("P3", "shutdown(wait=True) has no timeout")
def test_await_termination_gives_up_after_its_timeout() -> None:
    """await_termination returns False on time while a task is stuck, True once it ends."""
    pool = TrackingExecutor(max_workers=1)
    gate = Gate("stuck task")
    pool.submit(gate.arrive)
    gate.wait_reached()
    pool.shutdown(wait=False)

    with elapsed() as took:
        assert not await_termination(pool, 0.2)
    assert took() < 0.2 + NOISE

    finish(pool, gate)


# --- P4: a `with` block (and interpreter exit) waits forever on a stuck task -------------

STUCK_CHILD = """
import sys
from {module} import {function}

def stuck_on_stdin():
    sys.stdin.readline()  # a blocking call with no timeout: only the parent can end it
    print("task finished", flush=True)

print("calling", flush=True)
{call}
"""


@pytest.mark.race("P4", "a with-block (and interpreter exit) waits forever on a stuck task")
def test_naive_with_block_keeps_the_process_alive_until_the_stuck_task_ends(
    record_property: Callable[[str, object], None],
) -> None:
    """The process cannot leave the with-block, so it outlives main until the task is released."""
    code = STUCK_CHILD.format(
        module="patterns.naive.executor_shutdown",
        function="naive_run_all",
        call="naive_run_all([stuck_on_stdin])\nprint('returned', flush=True)",
    )
    child = spawn_python(textwrap.dedent(code))
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "calling\n"
        called_at = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=0.5)  # it is stuck, however long we look
        out, err = child.communicate(input="release\n", timeout=MUST_HAPPEN)
        held = time.monotonic() - called_at
    finally:
        child.kill()
        child.wait(MUST_HAPPEN)
    record_property(
        "observed",
        f"the with-block held the child {held:.1f}s, until its task was released, then it"
        f" printed {', '.join(map(repr, out.splitlines()))} and exited {child.returncode}",
    )
    assert out.splitlines() == ["task finished", "returned"], err
    assert child.returncode == 0


@pytest.mark.race("P4", "a with-block (and interpreter exit) waits forever on a stuck task")
def test_bounded_shutdown_reports_the_stuck_task_and_lets_the_program_decide_to_exit() -> None:
    """run_all returns on its deadline naming the stuck task; the program escalates to os._exit."""
    call = """
import logging, os
logging.basicConfig(level=logging.ERROR)
report = run_all([stuck_on_stdin], 0.2, force_timeout=0.2)
print("returned", report.terminated, len(report.still_running), flush=True)
os._exit(0 if report.terminated else 3)  # must exit: the stuck thread would block a normal exit
"""
    code = STUCK_CHILD.format(module="patterns.executor_shutdown", function="run_all", call=call)
    child = spawn_python(textwrap.dedent(code))
    try:
        assert child.stdout is not None
        assert child.stderr is not None
        # stdin stays open and is never written: the task stays stuck throughout.
        assert child.stdout.readline() == "calling\n"
        assert child.stdout.readline() == "returned False 1\n"
        assert child.wait(MUST_HAPPEN) == 3
        assert "did not terminate" in child.stderr.read()
    finally:
        child.kill()
        child.communicate(timeout=MUST_HAPPEN)


# --- P5: an exception in a task nobody reads ----------------------------------------------


def fail() -> None:
    """A task that fails."""
    raise ValueError("lost?")


@pytest.mark.race("P5", "an exception in a submitted task that nobody reads")
def test_naive_unread_future_hides_the_exception_completely(
    caplog: pytest.LogCaptureFixture,
    record_property: Callable[[str, object], None],
) -> None:
    """Nothing is logged or printed, not even when the future is garbage-collected."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        pool = ThreadPoolExecutor(max_workers=1)
        pool.submit(fail)  # the future is dropped on the floor
        pool.shutdown(wait=True)
        gc.collect()
    record_property(
        "observed",
        f"the task's failure left no trace: stderr {stderr.getvalue()!r},"
        f" {len(caplog.records)} log records, even after gc.collect()",
    )
    assert stderr.getvalue() == ""
    assert caplog.records == []


@pytest.mark.race("P5", "an exception in a submitted task that nobody reads")
def test_tracking_executor_logs_the_exception_nobody_reads(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every failed task is logged at ERROR with its traceback, read or not."""
    report = run_all([fail], MUST_HAPPEN, force_timeout=0)
    assert report.terminated
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.exc_info is not None
    assert str(record.exc_info[1]) == "lost?"


# --- P6: waiting for a pool from inside one of its own tasks -----------------------------


@pytest.mark.race("P6", "waiting for a pool's termination from inside one of its tasks")
def test_naive_shutdown_wait_inside_a_task_fails_and_skips_the_tasks_own_cleanup(
    record_property: Callable[[str, object], None],
) -> None:
    """A task that calls shutdown(wait=True) on its own pool cannot join itself, and fails."""
    pool = ThreadPoolExecutor(max_workers=1)
    steps: list[str] = []

    future = pool.submit(naive_finish_early, pool, steps)  # waits for its own pool
    error = future.exception(MUST_HAPPEN)
    record_property(
        "observed",
        f"its own shutdown(wait=True) raised {type(error).__name__}: {error},"
        f" {'the cleanup never ran' if 'cleaned up' not in steps else 'the cleanup ran'}",
    )
    assert isinstance(error, RuntimeError)
    assert str(error) == "cannot join current thread"
    assert steps == ["found the answer"]  # the rest of the task never ran
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(returns("more"))  # and the pool is shut down all the same
    pool.shutdown(wait=True)


@pytest.mark.race("P6", "waiting for a pool's termination from inside one of its tasks")
def test_a_task_stops_its_own_pool_with_shutdown_now_and_the_caller_waits() -> None:
    """Inside a task, shutdown_now; waiting is refused there at once and done from outside."""
    pool = TrackingExecutor(max_workers=1)
    gate = Gate("task, once the queue is filled")
    steps: list[str] = []
    refused: list[BaseException] = []

    def task() -> list[Callable[[], object]]:
        gate.arrive()
        with elapsed() as took:
            try:
                shutdown_and_await(pool, 1.0, force_timeout=1.0)  # would wait for itself
            except RuntimeError as exc:
                refused.append(exc)
        assert took() < NOISE  # refused at once, not after the 2 s budget
        assert not pool.is_shutdown  # and refused before it changed anything
        return finish_early(pool, steps)  # asks with shutdown_now, does not wait

    future = pool.submit(task)
    pool.submit(returns("queued"))
    gate.wait_reached()
    gate.open()

    never_started = future.result(MUST_HAPPEN)
    assert await_termination(pool, MUST_HAPPEN)  # the waiting, done from outside
    assert steps == ["found the answer", "cleaned up"]
    assert "from inside one of the executor's own tasks" in str(refused[0])
    assert [task() for task in never_started] == ["queued"]


def test_a_task_waiting_for_its_child_on_its_own_full_pool_starves() -> None:
    """The other self-wait, with no guard here: the child cannot start while its parent waits."""
    pool = ThreadPoolExecutor(max_workers=1)
    children: list[Future[object]] = []

    def parent() -> object:
        child = pool.submit(returns("child"))
        children.append(child)
        return child.result(timeout=STAYS_BLOCKED)  # the only worker is this one

    with pytest.raises(TimeoutError):
        pool.submit(parent).result(MUST_HAPPEN)
    assert children[0].result(MUST_HAPPEN) == "child"  # it runs once the parent gave up
    pool.shutdown(wait=True)


# --- P7: submitting after shutdown ----------------------------------------------------------


def parked_source(gate: Gate, ran: list[str]) -> Iterator[Callable[[], object]]:
    """Yield three tasks; park at `gate` between the first and the second."""

    def task(name: str) -> Callable[[], object]:
        return lambda: ran.append(name)

    yield task("first")
    gate.arrive()
    yield task("second")
    yield task("third")


@pytest.mark.race("P7", "submitting after shutdown loses the task in hand")
def test_naive_feed_loses_the_task_it_held_when_the_executor_shuts_down(
    record_property: Callable[[str, object], None],
) -> None:
    """The RuntimeError carries nothing: the second task never runs and nobody can retry it."""
    pool = ThreadPoolExecutor(max_workers=1)
    gate = Gate("producer between tasks")
    ran: list[str] = []
    source = parked_source(gate, ran)
    producer, outcome = run_in_thread(lambda: naive_feed(pool, source), "producer")
    gate.wait_reached()
    pool.shutdown(wait=True)
    gate.open()
    join_or_fail(producer)

    error = outcome["error"]
    record_property(
        "observed",
        f"submit raised {type(error).__name__}: {error}, the task in hand went with it (ran {ran})",
    )
    assert isinstance(error, RuntimeError)
    assert "cannot schedule new futures" in str(error)
    assert not hasattr(error, "task")
    assert ran == ["first"]
    # The producer had already taken the second task from the source when submit
    # refused it: the source has moved on to the third, so the second is gone for good.
    next(source)()
    assert ran == ["first", "third"]


@pytest.mark.race("P7", "submitting after shutdown loses the task in hand")
def test_feed_hands_back_the_rejected_task_and_leaves_the_rest_unread() -> None:
    """Rejected carries the refused task, so the producer can keep it; later tasks stay queued."""
    pool = TrackingExecutor(max_workers=1)
    gate = Gate("producer between tasks")
    ran: list[str] = []
    source = parked_source(gate, ran)
    producer, outcome = run_in_thread(lambda: feed(pool, source), "producer")
    gate.wait_reached()
    pool.shutdown(wait=True)
    gate.open()
    join_or_fail(producer)

    rejected = outcome["result"]
    assert ran == ["first"]
    rejected()  # the producer still holds the second task and can run or store it
    next(source)()  # and the third was never taken from the source
    assert ran == ["first", "second", "third"]


def test_rejected_is_a_runtime_error_that_names_the_task() -> None:
    """Existing `except RuntimeError` code still catches it, and the message names the task."""
    pool = TrackingExecutor(max_workers=1)
    pool.shutdown()
    with pytest.raises(RuntimeError, match="rejected: cannot schedule new futures") as info:
        pool.submit(returns("late"))
    assert isinstance(info.value, Rejected)
    assert info.value.task() == "late"


# --- what each supported Python version does (checked on 3.11.7, 3.12.1 and 3.13.0) ------


def test_no_form_of_thread_pool_shutdown_takes_a_timeout() -> None:
    """ThreadPoolExecutor.shutdown has only wait and cancel_futures on every supported version."""
    parameters = list(inspect.signature(ThreadPoolExecutor.shutdown).parameters)
    assert parameters == ["self", "wait", "cancel_futures"]


def test_pool_workers_are_the_non_daemon_threads_in_the_private_threads_set() -> None:
    """await_termination may join ``_threads``: it holds the pool's workers, non-daemon threads."""
    pool = TrackingExecutor(max_workers=1)
    gate = Gate("task")
    ran_in: list[threading.Thread] = []

    def task() -> None:
        ran_in.append(threading.current_thread())
        gate.arrive()

    pool.submit(task)
    gate.wait_reached()
    assert pool.worker_threads() == ran_in  # the set holds exactly the thread running the task
    assert not ran_in[0].daemon  # so interpreter exit waits for it (the P4 tests show that)
    finish(pool, gate)
    assert not ran_in[0].is_alive()


def test_asyncio_shutdown_default_executor_timeout_bounds_a_stuck_task_only_on_3_13() -> None:
    """3.11 has no timeout; on 3.12.1 it does not bound a stuck task; on 3.13.0 it does."""
    timeout = 0.1
    gate = Gate("task in the default executor")
    caught: list[str] = []
    took: list[float] = []

    async def shut_down_with_a_stuck_task() -> None:
        loop = asyncio.get_running_loop()
        task = loop.run_in_executor(None, gate.arrive)
        with warnings.catch_warnings(record=True) as records:
            # Only this thread touches the warning filters while the test waits on it.
            warnings.simplefilter("always")
            if sys.version_info < (3, 12):
                with pytest.raises(TypeError, match="timeout"):
                    await loop.shutdown_default_executor(timeout=timeout)  # type: ignore[call-arg]
                gate.wait_reached()
                gate.open()
            else:
                with elapsed() as seconds:
                    await loop.shutdown_default_executor(timeout=timeout)
                took.append(seconds())
        caught.extend(str(r.message) for r in records if r.category is RuntimeWarning)
        await task

    def run_loop() -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(shut_down_with_a_stuck_task())
        finally:
            loop.close()

    runner, outcome = run_in_thread(run_loop, "event loop")
    try:
        gate.wait_reached()
        if sys.version_info[:2] == (3, 12):
            # 3.12.1 first awaits the pool's shutdown(wait=True) and applies the timeout
            # only to a join after it, so a stuck task holds the call past any timeout.
            assert stays_blocked(runner, timeout + NOISE)
            assert took == []
        elif sys.version_info >= (3, 13):
            # 3.13.0 bounds the await itself: a warning, shutdown(wait=False), return.
            wait_until(lambda: bool(took), "shutdown_default_executor returned")
            assert took[0] < timeout + NOISE
            assert "did not finishing joining its threads within 0.1 seconds" in caught[0]
            assert not gate.opened.is_set()  # returned while the task is still stuck
    finally:
        gate.open()
    join_or_fail(runner)
    assert outcome == {"result": None}
    if sys.version_info[:2] == (3, 12):
        assert caught == []  # once released, the join inside finished in time: no warning


# --- the paths users take (with x.start(), Ctrl-C, handlers, budgets) -------------


def test_with_on_a_started_executor_returns_it_and_the_program_exits() -> None:
    """`with TrackingExecutor(...).start():` works and stops at the end: the child exits 0."""
    code = (
        "from patterns.executor_shutdown import TrackingExecutor\n"
        "with TrackingExecutor(max_workers=2).start() as pool:\n"
        "    assert pool.submit(lambda: 41 + 1).result(5) == 42\n"
        "print('terminated' if pool.stop().terminated else 'running')\n"
    )
    done = run_python(code)
    assert (done.returncode, done.stdout, done.stderr) == (0, "terminated\n", "")


def test_with_on_a_shut_down_executor_raises() -> None:
    """Entering an executor that was shut down is a RuntimeError; a running one is returned."""
    pool = TrackingExecutor(max_workers=1).start()
    with pool as entered:
        assert entered is pool
    with pytest.raises(RuntimeError, match="shut down"), pool:
        pass  # pragma: no cover - never entered


def test_a_report_that_says_terminated_with_a_running_thread_cannot_be_built() -> None:
    """ShutdownReport refuses terminated=True with a non-empty still_running."""
    with pytest.raises(ValueError, match=r"terminated=True with still_running="):
        ShutdownReport(terminated=True, still_running=("pool_0",))


def test_ctrl_c_during_stop_leaves_the_next_report_truthful() -> None:
    """After a Ctrl-C interrupts stop(), stop(0) still names the thread running the task."""
    pool = TrackingExecutor(max_workers=1, thread_name_prefix="ctrl-c").start()
    gate = Gate("ignores its stop")
    pool.submit(gate.arrive)
    gate.wait_reached()
    with signal_main_during("await_termination"), pytest.raises(KeyboardInterrupt):
        pool.stop(MUST_HAPPEN)

    report = pool.stop(0)
    assert not report.terminated
    assert report.still_running == ("ctrl-c_0",)
    assert pool.stop(MUST_HAPPEN) is report
    finish(pool, gate)


def test_stop_from_a_signal_handler_during_stop_returns_a_provisional_report_at_once() -> None:
    """A handler's stop() on the thread already inside stop() never blocks: provisional."""
    pool = TrackingExecutor(max_workers=1, thread_name_prefix="handler").start()
    gate = Gate("ignores its stop")
    pool.submit(gate.arrive)
    gate.wait_reached()
    seen: list[ShutdownReport] = []

    def on_sigint(signum: int, frame: object) -> None:
        seen.append(pool.stop(MUST_HAPPEN))
        gate.open()  # the handler returned: let the task finish

    with signal_main_during("await_termination", on_sigint):
        report = pool.stop(MUST_HAPPEN)

    assert [(r.terminated, r.still_running) for r in seen] == [(False, ("handler_0",))]
    assert report.terminated
    assert pool.stop(0) is report


def test_stop_from_on_force_returns_a_provisional_report_at_once() -> None:
    """on_force=lambda: pool.stop(0) runs inside stop(): it gets a provisional report."""
    gate = Gate("stuck task")
    seen: list[ShutdownReport] = []
    pool = TrackingExecutor(
        max_workers=1, thread_name_prefix="forced", on_force=lambda: seen.append(pool.stop(0))
    ).start()
    pool.submit(gate.arrive)
    gate.wait_reached()

    with elapsed() as took:
        report = pool.stop(0.2)

    assert took() < 0.2 + NOISE
    assert [(r.terminated, r.still_running) for r in seen] == [(False, ("forced_0",))]
    assert report.forced
    assert not report.terminated
    assert pool.stop(0) is report
    finish(pool, gate)


def test_a_second_stop_from_another_thread_keeps_to_its_own_budget() -> None:
    """A stop(0.2) while stop() runs returns a provisional report within 0.2 s."""
    pool = TrackingExecutor(max_workers=1, thread_name_prefix="twice").start()
    gate = Gate("running task")
    pool.submit(gate.arrive)
    gate.wait_reached()
    first, first_outcome = run_in_thread(lambda: pool.stop(MUST_HAPPEN), "first-stop")
    wait_until_blocked_in(first, "await_termination")

    with elapsed() as took:
        provisional = pool.stop(0.2)

    assert took() < 0.2 + NOISE
    assert (provisional.terminated, provisional.still_running) == (False, ("twice_0",))
    gate.open()
    join_or_fail(first)
    report = first_outcome["result"]
    assert report.terminated
    assert report is not provisional
    assert pool.stop(0) is report


def test_stop_from_a_signal_handler_that_landed_inside_submit_hands_off() -> None:
    """A handler's stop() on a thread holding the submit lock never waits for that lock."""
    pool = TrackingExecutor(max_workers=1, thread_name_prefix="submitting").start()
    seen: list[ShutdownReport] = []

    def on_sigint(signum: int, frame: object) -> None:
        seen.append(pool.stop(MUST_HAPPEN))

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with pool._tracking_lock:  # where submit() is when a signal lands inside it
            signal.raise_signal(signal.SIGINT)  # the handler runs before this returns
    finally:
        signal.signal(signal.SIGINT, previous)

    (provisional,) = seen
    assert not provisional.terminated
    for thread in [t for t in threading.enumerate() if t.name == "submitting-stopper"]:
        join_or_fail(thread)
    report = pool.stop(MUST_HAPPEN)
    assert report.terminated
    assert report is not provisional


def test_an_on_force_that_raises_is_logged_once_and_the_report_is_recorded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failing on_force neither escapes stop() nor runs again on a retry."""
    gate = Gate("stuck task")
    calls: list[str] = []

    def on_force() -> None:
        calls.append("on_force")
        raise OSError("the token's socket is gone")

    pool = TrackingExecutor(max_workers=1, on_force=on_force).start()
    pool.submit(gate.arrive)
    gate.wait_reached()

    with caplog.at_level(logging.ERROR):
        report = pool.stop(0.1)

    assert report.forced
    assert calls == ["on_force"]
    assert "on_force" in caplog.text
    assert "OSError" in caplog.text
    assert pool.stop(0.1) is report
    assert calls == ["on_force"]
    finish(pool, gate)


def test_a_keyboard_interrupt_from_on_force_is_re_raised_after_the_report_is_recorded() -> None:
    """KeyboardInterrupt from on_force propagates, but only once the report is kept."""
    gate = Gate("stuck task")
    calls: list[str] = []

    def on_force() -> None:
        calls.append("on_force")
        raise KeyboardInterrupt

    pool = TrackingExecutor(max_workers=1, thread_name_prefix="exit", on_force=on_force).start()
    pool.submit(gate.arrive)
    gate.wait_reached()

    with pytest.raises(KeyboardInterrupt):
        pool.stop(0.2)

    report = pool.stop(0)
    assert (report.forced, report.terminated, report.still_running) == (True, False, ("exit_0",))
    assert calls == ["on_force"]
    finish(pool, gate)


@pytest.mark.parametrize(
    "seconds", [math.inf, 1e10, 1e300, 10**400], ids=["inf", "1e10", "1e300", "10**400"]
)
def test_a_huge_or_infinite_budget_means_as_long_as_it_takes(seconds: float) -> None:
    """Infinite and huge budgets are accepted everywhere and never raise OverflowError."""
    pool = TrackingExecutor(max_workers=1, stop_timeout=seconds).start()
    pool.submit(returns(1))
    assert pool.stop().terminated
    assert TrackingExecutor(max_workers=1).stop(seconds).terminated
    other = TrackingExecutor(max_workers=1)
    other.submit(returns(2))
    other.shutdown(wait=False)
    assert await_termination(other, seconds)
    third = TrackingExecutor(max_workers=1)
    third.submit(returns(3))
    assert shutdown_and_await(third, seconds, force_timeout=seconds).terminated


@pytest.mark.parametrize("bad", [math.nan, -1.0, True, "1"])
def test_a_budget_that_is_not_seconds_is_a_value_error_naming_it(bad: object) -> None:
    """nan, negative, bool, str: a ValueError that names the argument, everywhere."""
    with pytest.raises(ValueError, match=r"^stop_timeout must be a number of seconds"):
        TrackingExecutor(max_workers=1, stop_timeout=bad)  # type: ignore[arg-type]
    pool = TrackingExecutor(max_workers=1)
    with pytest.raises(ValueError, match=r"^timeout must be a number of seconds"):
        pool.stop(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^timeout must be a number of seconds"):
        shutdown_and_await(pool, bad, force_timeout=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^force_timeout must be a number of seconds"):
        shutdown_and_await(pool, 0, force_timeout=bad)  # type: ignore[arg-type]
    pool.shutdown(wait=False)
    with pytest.raises(ValueError, match=r"^timeout must be a number of seconds"):
        await_termination(pool, bad)  # type: ignore[arg-type]
    assert pool.stop(0).terminated
