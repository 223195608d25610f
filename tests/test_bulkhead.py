"""Bulkhead: each rule forced with gates (a worker held busy, a caller queued), never sleeps."""

from __future__ import annotations

import _thread
import concurrent.futures
import logging
import math
import queue
import random
import signal
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any
from unittest.mock import patch

import pytest

from patterns.bulkhead import (
    Bulkhead,
    BulkheadFull,
    BulkheadReport,
    BulkheadStats,
    BulkheadStopped,
    BulkheadTimeout,
    JobToken,
    current_token,
)
from patterns.naive.bulkhead import (
    naive_call_with_timeout,
    naive_close,
    naive_run_and_count,
    naive_try_enqueue,
)
from tests.support import (
    MUST_HAPPEN,
    NOISE,
    Gate,
    elapsed,
    join_or_fail,
    run_in_thread,
    run_python,
    signal_main_during,
    stays_blocked,
    wait_until,
    wait_until_blocked_in,
)

# A caller timeout that must run out before the test releases the work: the work is held
# at a gate until then, so the timeout passes however slow the machine is.
SHORT = 0.05

# The one timing assumption in this file, used only where a timeout must pass while the
# handler *runs*: a free worker starts an admitted job within this long. Generous on
# purpose; no race test depends on it.
WORKER_STARTS_WITHIN = 1.0


def finish(bulkhead: Bulkhead, *gates: Gate) -> None:
    """Open every gate, stop the bulkhead and make sure every worker thread has ended.

    The bulkhead may have been stopped already (`stop` then returns that first
    report), so the workers are joined here.
    """
    for gate in gates:
        gate.open()
    bulkhead.stop(MUST_HAPPEN)
    for thread in bulkhead.threads:
        join_or_fail(thread)


def hold(gate: Gate, value: object = "held") -> Callable[[], object]:
    """A job that parks at ``gate`` and then returns ``value``."""

    def held() -> object:
        gate.arrive()
        return value

    return held


def record(ran: list[str], name: str) -> Callable[[], str]:
    """A job that appends ``name`` to ``ran`` when (if ever) it runs."""

    def job() -> str:
        ran.append(name)
        return name

    job.__qualname__ = f"record({name!r})"
    return job


def busy(bulkhead: Bulkhead, gate: Gate) -> Future[object]:
    """Submit a job that holds one of ``bulkhead``'s workers at ``gate``; wait until it does."""
    future = bulkhead.submit(hold(gate))
    gate.wait_reached()
    return future


def check_snapshot(s: BulkheadStats, bulkhead: Bulkhead) -> None:
    """The invariants every `BulkheadStats` snapshot keeps (see its docstring)."""
    assert s.accepted == s.processed + s.skipped + s.drained + s.active + s.queued, s
    assert s.errors <= s.processed, s
    assert s.drained <= s.shutdown_rejections, s
    assert 0 <= s.abandoned <= s.active <= bulkhead.max_concurrent, s
    assert s.active + s.queued <= bulkhead.max_concurrent + bulkhead.queue_size, s


# --- the basics ---------------------------------------------------------------------------


def test_call_runs_the_function_on_a_bulkhead_worker_and_returns_its_result() -> None:
    """The function runs on one of the bulkhead's named threads, with its arguments."""
    bulkhead = Bulkhead(2, 1, name="db").start()

    def where(a: int, *, b: int) -> tuple[str, int]:
        return threading.current_thread().name, a + b

    thread_name, total = bulkhead.call(where, 1, b=2, timeout=MUST_HAPPEN)

    assert total == 3
    assert thread_name.startswith("db-worker-")
    assert bulkhead.stats() == BulkheadStats("db", accepted=1, processed=1)
    finish(bulkhead)


def test_call_re_raises_the_handlers_exception_with_its_original_traceback() -> None:
    """The caller gets the handler's own exception object, its traceback still pointing at it."""
    bulkhead = Bulkhead(1, 0).start()

    def query_fails() -> None:
        raise LookupError("no such row")

    with pytest.raises(LookupError, match="no such row") as info:
        bulkhead.call(query_fails)

    frames = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert frames[-1] == "query_fails"
    assert "call" in frames  # and the caller's own frames, where it was re-raised
    assert bulkhead.stats().errors == 1
    assert bulkhead.stats().processed == 1
    finish(bulkhead)


def test_a_worker_survives_a_failing_handler_and_serves_the_next_call() -> None:
    """An AssertionError (or any exception) ends the call, not the worker."""
    bulkhead = Bulkhead(1, 0).start()

    def broken() -> None:
        raise AssertionError("bug in the handler")

    with pytest.raises(AssertionError):
        bulkhead.call(broken)
    assert bulkhead.call(lambda: "still serving") == "still serving"
    assert bulkhead.stats().processed == 2
    assert bulkhead.stats().errors == 1
    finish(bulkhead)


def test_submit_returns_a_future_at_once_while_the_work_is_held() -> None:
    """submit() never waits for the work; the future gets the result when it ends."""
    bulkhead = Bulkhead(1, 1).start()
    gate = Gate("submitted job")
    future = bulkhead.submit(hold(gate, "answer"))
    gate.wait_reached()

    assert not future.done()
    gate.open()
    assert future.result(MUST_HAPPEN) == "answer"
    finish(bulkhead)


def test_a_full_bulkhead_refuses_the_next_caller_at_once() -> None:
    """One worker held busy and one caller queued: the third caller gets BulkheadFull, no wait."""
    bulkhead = Bulkhead(1, 1, name="reports").start()
    gate = Gate("running job")
    running = busy(bulkhead, gate)
    ran: list[str] = []
    queued = bulkhead.submit(record(ran, "queued"))

    with pytest.raises(BulkheadFull, match=r"^reports: full: 1 of 1 worker\(s\) running"):
        bulkhead.call(record(ran, "refused"), timeout=MUST_HAPPEN)

    stats = bulkhead.stats()
    assert (stats.active, stats.queued, stats.rejections) == (1, 1, 1)
    gate.open()
    assert running.result(MUST_HAPPEN) == "held"
    assert queued.result(MUST_HAPPEN) == "queued"
    assert ran == ["queued"]
    finish(bulkhead)


def test_a_future_cancelled_while_queued_is_skipped_when_a_worker_reaches_it() -> None:
    """Cancelling a submitted future withdraws the job; the worker skips and counts it."""
    bulkhead = Bulkhead(1, 1).start()
    gate = Gate()
    running = busy(bulkhead, gate)
    ran: list[str] = []
    withdrawn = bulkhead.submit(record(ran, "withdrawn"))

    assert withdrawn.cancel()
    gate.open()
    running.result(MUST_HAPPEN)
    assert bulkhead.call(record(ran, "next"), timeout=MUST_HAPPEN) == "next"  # FIFO: after it

    assert ran == ["next"]
    assert bulkhead.stats().skipped == 1
    assert bulkhead.stats().timeouts == 0
    finish(bulkhead)


# --- B3: queue.Queue(maxsize=0) is not a hand-off ----------------------------------------


@pytest.mark.race("B3", "Queue(maxsize=0) is unbounded, so a size-0 hand-off never refuses")
def test_naive_zero_size_queue_accepts_every_job_while_the_worker_is_busy(
    record_property: Callable[[str, object], None],
) -> None:
    """put_nowait() on Queue(maxsize=0) never raises Full: a hundred jobs pile up behind one."""
    jobs: queue.Queue[Callable[[], object]] = queue.Queue(maxsize=0)
    gate = Gate("the only worker")
    worker, _ = run_in_thread(lambda: jobs.get()(), "worker")  # noqa: PLW0108 - get() runs there
    assert naive_try_enqueue(jobs, hold(gate))
    gate.wait_reached()

    accepted = [naive_try_enqueue(jobs, hold(Gate())) for _ in range(100)]
    record_property(
        "observed",
        f"Queue(maxsize=0) took {sum(accepted)} of {len(accepted)} jobs while the only"
        f" worker was busy: {jobs.qsize()} waiting",
    )

    assert all(accepted)
    assert jobs.qsize() == 100
    gate.open()
    join_or_fail(worker)


@pytest.mark.race("B3", "Queue(maxsize=0) is unbounded, so a size-0 hand-off never refuses")
def test_a_size_zero_bulkhead_accepts_a_call_only_when_a_worker_is_free() -> None:
    """queue_size=0 is a hand-off: accepted while a worker is free, refused while none is."""
    bulkhead = Bulkhead(1, 0).start()
    gate = Gate("the only worker")

    running = busy(bulkhead, gate)  # accepted: the worker was free
    with pytest.raises(BulkheadFull):
        bulkhead.submit(lambda: "no room")
    gate.open()
    assert running.result(MUST_HAPPEN) == "held"
    assert bulkhead.call(lambda: "free again", timeout=MUST_HAPPEN) == "free again"

    assert bulkhead.stats().rejections == 1
    assert bulkhead.stats().accepted == 2
    finish(bulkhead)


def test_a_size_zero_bulkhead_with_two_workers_takes_exactly_two_at_once() -> None:
    """With two workers busy the third call is refused; no job ever waits in a queue."""
    bulkhead = Bulkhead(2, 0).start()
    gates = [Gate("first"), Gate("second")]
    futures = [busy(bulkhead, gate) for gate in gates]

    with pytest.raises(BulkheadFull):
        bulkhead.call(lambda: "third")
    assert bulkhead.stats().queued == 0

    finish(bulkhead, *gates)
    assert [f.result() for f in futures] == ["held", "held"]


# --- B2: a caller's timeout, queued and running --------------------------------------------


@pytest.mark.race("B2", "a caller's timeout leaves its job to run for nobody, uncounted")
def test_naive_timeout_leaves_the_queued_job_to_run_later_for_nobody(
    record_property: Callable[[str, object], None],
) -> None:
    """The caller gave up, yet its job still runs once the worker is free; nothing counts it."""
    pool = ThreadPoolExecutor(max_workers=1)
    gate = Gate("running job")
    pool.submit(hold(gate))
    gate.wait_reached()
    ran: list[str] = []

    with pytest.raises(TimeoutError) as gave_up:
        naive_call_with_timeout(pool, record(ran, "abandoned"), SHORT)
    gate.open()
    pool.shutdown(wait=True)
    record_property(
        "observed",
        f"caller gave up with {type(gave_up.value).__name__} after {SHORT}s, but its job"
        f" still ran afterwards: ran={ran}",
    )

    assert ran == ["abandoned"]  # work done for a caller that had already left


@pytest.mark.race("B2", "a caller's timeout leaves its job to run for nobody, uncounted")
def test_a_call_that_times_out_while_queued_is_skipped_and_counted() -> None:
    """BulkheadTimeout at the deadline; the worker later skips the job, and both are counted."""
    bulkhead = Bulkhead(1, 1).start()
    gate = Gate("running job")
    running = busy(bulkhead, gate)
    ran: list[str] = []

    with pytest.raises(BulkheadTimeout) as info:
        bulkhead.call(record(ran, "abandoned"), timeout=SHORT)

    assert not info.value.started
    assert (bulkhead.stats().timeouts, bulkhead.stats().queued) == (1, 1)  # still holds a slot
    gate.open()
    running.result(MUST_HAPPEN)
    assert bulkhead.call(record(ran, "next"), timeout=MUST_HAPPEN) == "next"  # FIFO: after it
    assert ran == ["next"]
    stats = bulkhead.stats()
    assert (stats.skipped, stats.timeouts, stats.processed) == (1, 1, 2)
    check_snapshot(stats, bulkhead)
    finish(bulkhead)


def test_a_call_that_times_out_while_running_finishes_later_and_its_error_is_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The worker is not freed: the job runs on, sees its token cancelled, and its error counts."""
    bulkhead = Bulkhead(1, 0, name="slow").start()
    gate = Gate("running job")
    seen: list[str | None] = []

    def fails_late() -> None:
        token = current_token()
        gate.arrive()
        seen.append(token.reason)
        raise ValueError("failed after the caller left")

    with pytest.raises(BulkheadTimeout) as info:
        bulkhead.call(fails_late, timeout=WORKER_STARTS_WITHIN)

    assert info.value.started
    gate.wait_reached()
    stats = bulkhead.stats()
    assert (stats.timeouts, stats.active, stats.abandoned, stats.processed) == (1, 1, 1, 0)
    with pytest.raises(BulkheadFull):  # the abandoned job still holds the only worker
        bulkhead.call(lambda: "no room")
    finish(bulkhead, gate)

    assert seen == ["caller timed out"]
    stats = bulkhead.stats()
    assert (stats.processed, stats.errors, stats.abandoned, stats.active) == (1, 1, 0, 0)
    [logged] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "failed after its caller left" in logged.getMessage()
    assert logged.exc_info is not None
    assert logged.exc_info[0] is ValueError


def test_a_stopped_bulkhead_reports_an_abandoned_handler_still_running() -> None:
    """stop() names a handler whose caller timed out and that is still holding its worker."""
    bulkhead = Bulkhead(1, 0, name="slow").start()
    gate = Gate("running job")

    with pytest.raises(BulkheadTimeout):
        bulkhead.call(hold(gate), timeout=WORKER_STARTS_WITHIN)
    gate.wait_reached()
    report = bulkhead.stop(0.05)

    assert not report.terminated
    assert report.still_running == ("slow-worker-0: hold.<locals>.held (abandoned)",)
    finish(bulkhead, gate)


def test_a_caller_interrupted_while_waiting_leaves_its_job_running_without_a_timeout() -> None:
    """Ctrl-C in a waiting caller abandons the running job (token cancelled), counted apart."""
    assert threading.current_thread() is threading.main_thread()
    bulkhead = Bulkhead(1, 0).start()
    gate = Gate("running job")
    tokens: list[JobToken] = []

    def job() -> None:
        tokens.append(current_token())
        gate.arrive()

    main = threading.main_thread()
    interrupted = threading.Event()  # set by the handler when it raises, the one time it does

    def on_sigint(signum: int, frame: object) -> None:
        if not interrupted.is_set():
            interrupted.set()
            raise KeyboardInterrupt

    def interrupt_main() -> None:
        gate.wait_reached()
        wait_until_blocked_in(main, "wait")
        # A signal that lands after main's last check but before its lock wait is only
        # handled when the wait ends, so send it again until the handler has run; the
        # handler raises only once.
        for _ in range(int(MUST_HAPPEN / 0.05)):
            signal.pthread_kill(main.ident or 0, signal.SIGINT)
            if interrupted.wait(0.05):
                return

    previous = signal.signal(signal.SIGINT, on_sigint)
    interrupter = threading.Thread(target=interrupt_main, name="interrupter")
    try:
        interrupter.start()
        with pytest.raises(KeyboardInterrupt):
            bulkhead.call(job, timeout=MUST_HAPPEN)
    finally:
        join_or_fail(interrupter)  # no signal is sent after this; a late one finds on_sigint
        signal.signal(signal.SIGINT, previous)

    assert tokens[0].reason == "caller interrupted"
    stats = bulkhead.stats()
    assert (stats.abandoned, stats.timeouts) == (1, 0)
    finish(bulkhead, gate)


# --- B4: closing with callers queued -------------------------------------------------------


@pytest.mark.race("B4", "a close that leaves queued callers waiting and still runs their work")
def test_naive_close_leaves_the_queued_caller_waiting_and_still_runs_its_job(
    record_property: Callable[[str, object], None],
) -> None:
    """After shutdown(wait=False) the queued caller keeps waiting, and its job runs anyway."""
    pool = ThreadPoolExecutor(max_workers=1)
    gate = Gate("running job")
    pool.submit(hold(gate))
    gate.wait_reached()
    ran: list[str] = []
    caller, outcome = run_in_thread(
        lambda: naive_call_with_timeout(pool, record(ran, "queued"), MUST_HAPPEN), "caller"
    )
    wait_until_blocked_in(caller, "result")

    closed_at = time.monotonic()
    naive_close(pool)

    assert stays_blocked(caller)  # not told anything
    gate.open()
    join_or_fail(caller)
    record_property(
        "observed",
        f"caller still waited {time.monotonic() - closed_at:.1f}s after the close, until its"
        f" job ran anyway and returned {outcome.get('result')!r}",
    )
    assert outcome["result"] == "queued"  # it ran after the close
    assert ran == ["queued"]
    pool.shutdown(wait=True)


@pytest.mark.race("B4", "a close that leaves queued callers waiting and still runs their work")
def test_stop_releases_queued_callers_at_once_and_refuses_every_later_one() -> None:
    """The queued caller gets BulkheadStopped before the running job ends; its job never runs."""
    bulkhead = Bulkhead(1, 2, name="export").start()
    gate = Gate("running job")
    running = busy(bulkhead, gate)
    ran: list[str] = []
    caller, outcome = run_in_thread(lambda: bulkhead.call(record(ran, "queued")), "caller")
    wait_until_blocked_in(caller, "wait")

    report = bulkhead.stop(0)  # no wait for the handler held at its gate

    join_or_fail(caller)  # released while the running job is still held at its gate
    assert isinstance(outcome["error"], BulkheadStopped)
    assert outcome["error"].drained
    assert report.drained == 1
    assert report.still_running == ("export-worker-0: hold.<locals>.held",)
    with pytest.raises(BulkheadStopped) as later:
        bulkhead.call(record(ran, "later"))
    assert not later.value.drained
    assert not running.done()  # running handlers are not interrupted
    finish(bulkhead, gate)
    assert running.result() == "held"
    assert ran == []
    stats = bulkhead.stats()
    assert (stats.drained, stats.shutdown_rejections, stats.rejections) == (1, 2, 0)
    assert stats.processed == 1


def test_stop_with_a_timeout_returns_on_time_and_names_the_handler_still_running(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stuck handler cannot hold stop() past its timeout; the report names it."""
    bulkhead = Bulkhead(2, 0, name="pdf").start()
    gate = Gate("stuck job")
    busy(bulkhead, gate)

    with elapsed() as took:
        report = bulkhead.stop(0.2)

    assert took() < 0.2 + NOISE
    assert not report.terminated
    assert len(report.still_running) == 1
    assert report.still_running[0].endswith(": hold.<locals>.held")
    assert "still running after" in caplog.text
    gate.open()
    assert bulkhead.stop(MUST_HAPPEN) is report  # idempotent: the first report, unchanged
    assert report.stats.processed == 0
    finish(bulkhead)
    assert bulkhead.stats().processed == 1


def test_a_second_stop_from_another_thread_keeps_to_its_own_budget() -> None:
    """A stop(0.2) while stop() runs returns a provisional report within 0.2 s."""
    bulkhead = Bulkhead(1, 0, name="twice").start()
    gate = Gate("running job")
    busy(bulkhead, gate)
    first, first_outcome = run_in_thread(lambda: bulkhead.stop(MUST_HAPPEN), "first-stop")
    wait_until_blocked_in(first, "_stop")  # holding the stop, waiting for the handler

    with elapsed() as took:
        provisional = bulkhead.stop(0.2)

    assert took() < 0.2 + NOISE
    assert not provisional.terminated
    assert provisional.still_running == ("twice-worker-0: hold.<locals>.held",)
    gate.open()
    join_or_fail(first)
    report = first_outcome["result"]
    assert report.terminated
    assert report is not provisional  # a provisional report is never recorded
    assert bulkhead.stop(0) is report


def test_stop_with_cancel_running_lets_a_cooperative_handler_stop_early() -> None:
    """cancel_running=True cancels the running handlers' tokens; one that waits on it returns."""
    bulkhead = Bulkhead(1, 0).start()
    started = threading.Event()

    def cooperative() -> str:
        token = current_token()
        started.set()
        return "stopped early" if token.wait(MUST_HAPPEN) else "ran to the end"

    future = bulkhead.submit(cooperative)
    assert started.wait(MUST_HAPPEN)

    report = bulkhead.stop(MUST_HAPPEN, cancel_running=True)

    assert report.terminated
    assert future.result() == "stopped early"


def test_a_bulkhead_in_a_with_block_is_stopped_on_exit() -> None:
    """Leaving the block stops the bulkhead and its workers end within stop_timeout."""
    with Bulkhead(2, 1, stop_timeout=MUST_HAPPEN) as bulkhead:
        assert bulkhead.call(lambda: 42) == 42
    assert bulkhead.stopped
    assert not any(thread.is_alive() for thread in bulkhead.threads)


# --- the cancellation token ---------------------------------------------------------------


def test_token_callbacks_run_once_each_and_one_registered_late_runs_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each callback runs exactly once; a failing one is logged and the others still run."""
    bulkhead = Bulkhead(1, 0).start()
    calls: list[str] = []
    token_box: list[JobToken] = []
    registered = threading.Event()

    def job() -> None:
        token = current_token()
        token_box.append(token)
        token.on_cancel(lambda: calls.append("first"))
        token.on_cancel(lambda: 1 / 0)
        token.on_cancel(lambda: calls.append("third"))
        registered.set()
        token.wait(MUST_HAPPEN)

    bulkhead.submit(job)
    assert registered.wait(MUST_HAPPEN)
    report = bulkhead.stop(MUST_HAPPEN, cancel_running=True)
    assert bulkhead.stop(MUST_HAPPEN, cancel_running=True) is report  # runs nothing again
    token_box[0].on_cancel(lambda: calls.append("late"))

    assert calls == ["first", "third", "late"]
    assert token_box[0].cancelled
    assert token_box[0].reason == "bulkhead stopped"
    assert "cancel callback" in caplog.text
    finish(bulkhead)


def test_current_token_outside_a_bulkhead_job_is_an_error() -> None:
    """Only a function a bulkhead runs has a token."""
    with pytest.raises(RuntimeError, match="outside a function run by a Bulkhead"):
        current_token()


# --- options and independence --------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "option"),
    [
        (lambda: Bulkhead(0, 1), "max_concurrent"),
        (lambda: Bulkhead(-1, 1), "max_concurrent"),
        (lambda: Bulkhead(1.5, 1), "max_concurrent"),
        (lambda: Bulkhead(True, 1), "max_concurrent"),
        (lambda: Bulkhead("2", 1), "max_concurrent"),
        (lambda: Bulkhead(1, -1), "queue_size"),
        (lambda: Bulkhead(1, 0.5), "queue_size"),
        (lambda: Bulkhead(1, 0, stop_timeout=-1), "stop_timeout"),
    ],
)
def test_invalid_options_are_refused_when_built_with_a_value_error_naming_them(
    build: Callable[[], Any], option: str
) -> None:
    """A bad option fails at construction, naming itself, before any thread starts."""
    before = threading.active_count()
    with pytest.raises(ValueError, match=f"^{option} must be"):
        build()
    assert threading.active_count() == before


def test_a_negative_caller_timeout_is_refused_before_admission() -> None:
    """call(timeout=-1) is a ValueError naming the timeout, and nothing is admitted."""
    bulkhead = Bulkhead(1, 0).start()
    with pytest.raises(ValueError, match=r"^timeout must be"):
        bulkhead.call(lambda: None, timeout=-1)
    with pytest.raises(ValueError, match=r"^timeout must be"):
        bulkhead.stop(-1)
    assert bulkhead.stats().accepted == 0
    finish(bulkhead)


def test_independent_bulkheads_protect_different_resources() -> None:
    """A saturated bulkhead refuses its callers; another one in the same process is untouched."""
    database = Bulkhead(1, 0, name="database").start()
    search = Bulkhead(1, 0, name="search").start()
    gate = Gate("slow query")
    busy(database, gate)

    with pytest.raises(BulkheadFull, match=r"^database"):
        database.call(lambda: "refused")
    assert search.call(lambda: "found", timeout=MUST_HAPPEN) == "found"

    assert database.stats().rejections == 1
    assert search.stats().rejections == 0
    assert {t.name for t in database.threads} == {"database-worker-0"}
    assert {t.name for t in search.threads} == {"search-worker-0"}
    finish(database, gate)
    finish(search)


# --- B5: a result released before it is counted -------------------------------------------


@pytest.mark.race("B5", "a result released before it is counted")
def test_naive_counting_after_the_result_lets_its_caller_miss_its_own_call(
    record_property: Callable[[str, object], None],
) -> None:
    """Whoever wakes on the result reads the counter before the increment: processed is 0."""
    counts = {"processed": 0}
    future: Future[str] = Future()
    seen_by_caller: list[int] = []
    future.add_done_callback(lambda _: seen_by_caller.append(counts["processed"]))

    worker, _ = run_in_thread(lambda: naive_run_and_count(lambda: "done", future, counts), "w")
    join_or_fail(worker)
    record_property(
        "observed",
        f"woken by its result, the caller read processed == {', '.join(map(str, seen_by_caller))},"
        f" the counter became {counts['processed']} only later",
    )

    assert future.result() == "done"
    assert seen_by_caller == [0]
    assert counts["processed"] == 1  # counted, but only after the caller had looked


@pytest.mark.race("B5", "a result released before it is counted")
def test_a_caller_that_has_its_result_finds_it_counted() -> None:
    """The bulkhead counts before it releases the result, so even the first look sees it."""
    bulkhead = Bulkhead(1, 0).start()
    gate = Gate("job")
    future = busy(bulkhead, gate)
    seen_by_caller: list[BulkheadStats] = []
    future.add_done_callback(lambda _: seen_by_caller.append(bulkhead.stats()))

    gate.open()

    assert future.result(MUST_HAPPEN) == "held"
    [stats] = seen_by_caller
    assert (stats.processed, stats.active) == (1, 0)
    finish(bulkhead)


# --- the invariants under a randomised workload ---------------------------------------------


def test_stats_invariants_hold_under_a_randomised_concurrent_workload() -> None:
    """Every snapshot, and the final count against what the callers saw, keeps the invariants."""
    bulkhead = Bulkhead(3, 2, name="random").start()
    callers, ops_per_caller = 6, 60
    lock = threading.Lock()  # guards ran, outcomes and done_ops
    ran: dict[int, str] = {}  # job id -> "returned" | "raised", written by the job itself
    outcomes: list[tuple[int, str]] = []  # (job id, what its caller saw)
    done_ops = [0]
    halfway = threading.Event()  # set by the caller whose op reaches half of the total
    sampling_done = threading.Event()  # set by the test once every caller has ended
    violations: list[str] = []

    def job(job_id: int, kind: str, pause: float) -> int:
        if pause:
            current_token().wait(pause)  # cut short if the caller leaves or stop cancels
        with lock:
            ran[job_id] = "raised" if kind == "fail" else "returned"
        if kind == "fail":
            raise ValueError(job_id)
        return job_id

    def caller(index: int) -> None:
        rng = random.Random(20_240_601 + index)
        for op in range(ops_per_caller):
            job_id = index * 1000 + op
            args = (job_id, rng.choice(["ok", "fail"]), rng.choice([0.0, 0.0, 0.002, 0.004]))
            try:
                if rng.random() < 0.25:  # a submit, sometimes withdrawn
                    future = bulkhead.submit(job, *args)
                    if rng.random() < 0.5 and future.cancel():
                        seen = "withdrawn"
                    else:
                        future.result(MUST_HAPPEN)
                        seen = "result"
                else:
                    timeout = rng.choice([None, 0.0, 0.001, 0.003])
                    bulkhead.call(job, *args, timeout=timeout)
                    seen = "result"
            except ValueError:
                seen = "error"
            except BulkheadFull:
                seen = "full"
            except BulkheadStopped as exc:
                seen = "drained" if exc.drained else "stopped"
            except BulkheadTimeout as exc:
                seen = "timeout-running" if exc.started else "timeout-queued"
            with lock:
                outcomes.append((job_id, seen))
                done_ops[0] += 1
                if done_ops[0] == callers * ops_per_caller // 2:
                    halfway.set()

    def sampler() -> None:
        for _ in range(100_000):  # bounded; ends long before that
            try:
                check_snapshot(bulkhead.stats(), bulkhead)
            except AssertionError as exc:
                violations.append(str(exc))
            if sampling_done.wait(0.0005):
                return

    sampling, _ = run_in_thread(sampler, "sampler")
    threads = [run_in_thread(lambda i=i: caller(i), f"caller-{i}") for i in range(callers)]
    assert halfway.wait(MUST_HAPPEN)
    report = bulkhead.stop(MUST_HAPPEN)  # the second half meets a stopped bulkhead
    for thread, outcome in threads:
        join_or_fail(thread)
        assert "error" not in outcome, outcome
    sampling_done.set()
    join_or_fail(sampling)

    assert report.terminated
    assert violations == []
    s = bulkhead.stats()
    check_snapshot(s, bulkhead)
    seen = [what for _, what in outcomes]
    assert len(outcomes) == callers * ops_per_caller
    # Every call is accounted for exactly once, and the counters agree with the callers.
    assert s.accepted + s.rejections + s.shutdown_rejections - s.drained == len(outcomes)
    assert (s.active, s.queued, s.abandoned) == (0, 0, 0)
    assert s.accepted == s.processed + s.skipped + s.drained
    assert s.rejections == seen.count("full")
    assert s.shutdown_rejections == seen.count("stopped") + seen.count("drained")
    assert s.drained == seen.count("drained")
    assert s.timeouts == seen.count("timeout-running") + seen.count("timeout-queued")
    assert s.skipped == seen.count("timeout-queued") + seen.count("withdrawn")
    assert s.processed == len(ran)
    assert s.errors == list(ran.values()).count("raised")
    # And each caller's outcome matches what happened to its job.
    for job_id, what in outcomes:
        if what in ("result", "error", "timeout-running"):
            assert job_id in ran, (job_id, what)
        else:
            assert job_id not in ran, (job_id, what)
    assert "stopped" in seen  # the stop did happen halfway


# --- the lifecycle: no thread in the constructor, start() all or nothing -------------------


def workers_named(prefix: str) -> list[threading.Thread]:
    """The live threads whose name starts with ``prefix`` (a bulkhead's workers)."""
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


def on_kth_start(
    prefix: str,
    k: int,
    instead: Callable[[Callable[[threading.Thread], None], threading.Thread], None],
) -> Any:
    """Patch `threading.Thread.start`: the k-th start of a ``prefix`` thread calls ``instead``.

    ``instead(real_start, thread)`` decides what that start does (raise, or start the
    thread and then interrupt the main thread, or park at a gate first). Every other
    thread, the test's own included, starts as usual.
    """
    real_start = threading.Thread.start
    calls = [0]

    def start(thread: threading.Thread) -> None:
        if thread.name.startswith(prefix):
            calls[0] += 1
            if calls[0] == k:
                instead(real_start, thread)
                return
        real_start(thread)

    return patch.object(threading.Thread, "start", start)


def cannot_start(real_start: Callable[[threading.Thread], None], thread: threading.Thread) -> None:
    """What `Thread.start` does when the system has no thread left to give."""
    raise RuntimeError("can't start new thread")


def test_building_a_bulkhead_starts_no_thread() -> None:
    """The constructor only checks and stores its options; start() is what makes workers."""
    bulkhead = Bulkhead(2, 0, name="idle")
    try:
        assert workers_named("idle-worker-") == []
        assert bulkhead.threads == []
    finally:
        bulkhead.stop(MUST_HAPPEN)


def test_when_the_kth_worker_fails_to_start_none_is_left_running_and_the_error_propagates(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failed start() stops the workers it started and re-raises; nothing keeps running."""
    with (
        on_kth_start("flaky-worker-", 3, cannot_start),  # two workers run by then
        pytest.raises(RuntimeError, match="can't start new thread"),
    ):
        Bulkhead(4, 0, name="flaky").start()

    assert workers_named("flaky-worker-") == []  # stopped and joined before the re-raise
    assert "flaky: start() did not complete; 2 worker(s) stopped" in caplog.text


def test_a_keyboard_interrupt_part_way_through_start_stops_the_workers_already_started() -> None:
    """Ctrl-C landing once the k-th worker runs: start() re-raises it, and no worker is left."""
    assert threading.current_thread() is threading.main_thread()  # interrupt_main's target

    def start_then_interrupt(
        real_start: Callable[[threading.Thread], None], thread: threading.Thread
    ) -> None:
        real_start(thread)
        # Simulates SIGINT: the main thread raises KeyboardInterrupt at its next check,
        # here or in start()'s loop, which has a third worker still to start.
        _thread.interrupt_main()

    bulkhead = Bulkhead(3, 0, name="interrupted")
    try:
        with (
            on_kth_start("interrupted-worker-", 2, start_then_interrupt),
            pytest.raises(KeyboardInterrupt),
        ):
            bulkhead.start()

        assert workers_named("interrupted-worker-") == []
    finally:
        bulkhead.stop(MUST_HAPPEN)  # a start() the interrupt missed left its workers running


def test_a_call_before_start_is_a_clear_error_and_counts_nothing() -> None:
    """submit() and call() on a bulkhead never started raise RuntimeError saying so."""
    bulkhead = Bulkhead(1, 0, name="early")

    with pytest.raises(RuntimeError, match=r"^early: not started; call start\(\)"):
        bulkhead.submit(lambda: "too early")
    with pytest.raises(RuntimeError, match=r"^early: not started"):
        bulkhead.call(lambda: "too early")

    assert bulkhead.stats() == BulkheadStats("early")
    assert not bulkhead.started
    assert bulkhead.start() is bulkhead
    with pytest.raises(RuntimeError, match=r"^early: start\(\) was already called"):
        bulkhead.start()  # a second start() is a bug in the caller: it raises
    assert [t.name for t in bulkhead.threads] == ["early-worker-0"]
    assert bulkhead.call(lambda: "now", timeout=MUST_HAPPEN) == "now"
    finish(bulkhead)


def test_stopping_a_bulkhead_never_started_reports_terminated_and_it_can_never_start() -> None:
    """stop() before start() marks it stopped without error; start() then refuses."""
    bulkhead = Bulkhead(2, 1, name="never")

    report = bulkhead.stop(MUST_HAPPEN)

    assert report.terminated
    assert (report.drained, report.still_running) == (0, ())
    assert bulkhead.stop() is report  # idempotent, whatever the budget
    with pytest.raises(RuntimeError, match=r"^never: stopped; a stopped bulkhead cannot start"):
        bulkhead.start()
    with pytest.raises(BulkheadStopped):
        bulkhead.call(lambda: "refused")
    assert workers_named("never-worker-") == []


def test_stop_racing_a_stuck_start_returns_within_its_budget_and_start_then_gives_up() -> None:
    """stop() during start() neither raises nor waits past its timeout; start() then stops."""
    parked = Gate("second worker's start")

    def park_then_start(
        real_start: Callable[[threading.Thread], None], thread: threading.Thread
    ) -> None:
        parked.arrive()  # start() is stuck here: one worker runs, one is listed, unstarted
        real_start(thread)

    bulkhead = Bulkhead(3, 0, name="racing")
    with on_kth_start("racing-worker-", 2, park_then_start):
        starter, started = run_in_thread(bulkhead.start, "starter")
        parked.wait_reached()

        with elapsed() as took:
            report = bulkhead.stop(0.1)  # a listed, unstarted thread must not be joined

        assert took() < 0.1 + NOISE
        assert not report.terminated  # a start() was still in progress
        parked.open()
        join_or_fail(starter)

    assert isinstance(started["error"], RuntimeError)
    assert "stopped while start() was starting the workers" in str(started["error"])
    assert workers_named("racing-worker-") == []  # the two it started were stopped
    assert len(bulkhead.threads) == 2  # the third was never even made
    assert bulkhead.stop(MUST_HAPPEN) is report


def test_stop_racing_start_waits_for_it_within_its_budget_and_reports_every_worker() -> None:
    """With a budget that lasts, stop() waits for the start() it overtook, then joins all."""
    parked = Gate("second worker's start")

    def park_then_start(
        real_start: Callable[[threading.Thread], None], thread: threading.Thread
    ) -> None:
        parked.arrive()
        real_start(thread)

    bulkhead = Bulkhead(2, 0, name="overtaken")
    with on_kth_start("overtaken-worker-", 2, park_then_start):
        starter, started = run_in_thread(bulkhead.start, "starter")
        parked.wait_reached()
        stopper, stopped = run_in_thread(lambda: bulkhead.stop(MUST_HAPPEN), "stopper")
        wait_until_blocked_in(stopper, "wait")  # waiting for the start() in progress
        assert stays_blocked(stopper)
        parked.open()
        join_or_fail(starter)
        join_or_fail(stopper)

    assert isinstance(started["error"], RuntimeError)
    report = stopped["result"]
    assert report.terminated
    assert [t.name for t in bulkhead.threads] == ["overtaken-worker-0", "overtaken-worker-1"]
    assert not any(t.is_alive() for t in bulkhead.threads)


# --- what each supported Python version does, where the module depends on it ---------------


def test_concurrent_futures_timeout_error_is_the_builtin_so_bulkhead_timeout_is_one() -> None:
    """Since 3.11 the futures TimeoutError is the builtin; BulkheadTimeout is caught as both."""
    assert concurrent.futures.TimeoutError is TimeoutError
    with pytest.raises(concurrent.futures.TimeoutError):
        raise BulkheadTimeout("db", started=False, timeout=1.0)


def test_a_handlers_own_timeout_error_is_its_error_not_the_callers_timeout() -> None:
    """A TimeoutError raised by the handler reaches the caller as it is, counted as an error."""
    bulkhead = Bulkhead(1, 0).start()

    def query() -> None:
        raise TimeoutError("the database timed out")

    with pytest.raises(TimeoutError, match="the database timed out") as info:
        bulkhead.call(query, timeout=MUST_HAPPEN)

    assert not isinstance(info.value, BulkheadTimeout)
    stats = bulkhead.stats()
    assert (stats.errors, stats.timeouts) == (1, 0)
    finish(bulkhead)


def test_joining_a_thread_that_never_started_raises_so_stop_must_skip_it() -> None:
    """Thread.join() on an unstarted thread raises RuntimeError; its ident is None until start."""
    thread = threading.Thread(target=lambda: None, name="never-started")
    assert thread.ident is None
    with pytest.raises(RuntimeError, match="cannot join thread before it is started"):
        thread.join(0)
    thread.start()
    assert thread.ident is not None  # set before start() returns
    join_or_fail(thread)


def test_these_checks_ran_on_a_build_with_the_gil() -> None:
    """The docs' GIL statements were checked on GIL builds only; a free-threaded run says so."""
    gil_disabled = sysconfig.get_config_var("Py_GIL_DISABLED")
    if sys.version_info >= (3, 13):
        assert gil_disabled == 0, "free-threaded build: the bulkhead page was not checked on it"
        assert sys._is_gil_enabled()
    else:
        assert gil_disabled is None  # no free-threaded build before 3.13
        assert not hasattr(sys, "_is_gil_enabled")


# --- the paths users take (with x.start(), Ctrl-C, handlers, budgets) -------------


def test_with_on_a_started_bulkhead_returns_it_and_the_program_exits() -> None:
    """`with Bulkhead(...).start():` runs the block and stops at its end: the child exits."""
    code = (
        "from patterns.bulkhead import Bulkhead\n"
        "with Bulkhead(2, 0, name='idiom').start() as b:\n"
        "    assert b.call(lambda: 41 + 1, timeout=5) == 42\n"
        "print('stopped' if b.stopped else 'running')\n"
    )
    done = run_python(code)
    assert (done.returncode, done.stdout, done.stderr) == (0, "stopped\n", "")


def test_with_on_a_stopped_bulkhead_raises_and_starts_nothing() -> None:
    """Entering a stopped bulkhead is a RuntimeError; entering a running one does not restart."""
    bulkhead = Bulkhead(1, 0, name="entered").start()
    with bulkhead as entered:
        assert entered is bulkhead
        assert len(bulkhead.threads) == 1
    with pytest.raises(RuntimeError, match="stopped"), bulkhead:
        pass  # pragma: no cover - never entered
    assert workers_named("entered-worker-") == []


def test_a_report_that_says_terminated_with_a_running_handler_cannot_be_built() -> None:
    """BulkheadReport refuses terminated=True with a non-empty still_running."""
    stats = BulkheadStats(name="x")
    with pytest.raises(ValueError, match=r"terminated=True with still_running="):
        BulkheadReport(True, ("x-worker-0: f",), "x", 0, stats, 0.0)


def test_ctrl_c_during_stop_leaves_the_next_report_truthful() -> None:
    """After a Ctrl-C interrupts stop(), stop(0) still names the busy worker (gh-90882)."""
    bulkhead = Bulkhead(1, 0, name="ctrl-c").start()
    gate = Gate("ignores its stop")
    busy(bulkhead, gate)
    with signal_main_during("_stop"), pytest.raises(KeyboardInterrupt):
        bulkhead.stop(MUST_HAPPEN)

    report = bulkhead.stop(0)
    assert not report.terminated
    assert report.still_running == ("ctrl-c-worker-0: hold.<locals>.held",)
    assert bulkhead.stop(MUST_HAPPEN) is report  # the first completed stop is the record
    finish(bulkhead, gate)


def test_stop_from_a_signal_handler_during_stop_returns_a_provisional_report_at_once() -> None:
    """A handler's stop() on the thread already inside stop() never blocks: provisional."""
    bulkhead = Bulkhead(1, 0, name="handler").start()
    gate = Gate("ignores its stop")
    busy(bulkhead, gate)
    seen: list[BulkheadReport] = []

    def on_sigint(signum: int, frame: object) -> None:
        seen.append(bulkhead.stop(MUST_HAPPEN))
        gate.open()  # the handler returned: let the work finish

    with signal_main_during("_stop", on_sigint):
        report = bulkhead.stop(MUST_HAPPEN)

    assert [(r.terminated, r.still_running) for r in seen] == [
        (False, ("handler-worker-0: hold.<locals>.held",))
    ]
    assert report.terminated
    assert bulkhead.stop(0) is report


def test_stop_from_a_handler_is_a_request_that_returns_at_once() -> None:
    """A handler's own stop() starts the stop, names its worker, and is not recorded."""
    bulkhead = Bulkhead(1, 1, name="inside").start()
    gate = Gate("queued caller admitted")
    seen: list[BulkheadReport] = []

    def stops_its_bulkhead() -> str:
        gate.arrive()
        seen.append(bulkhead.stop(MUST_HAPPEN))
        return "asked"

    running = bulkhead.submit(stops_its_bulkhead)
    gate.wait_reached()
    queued = bulkhead.submit(lambda: "never")
    gate.open()

    assert running.result(MUST_HAPPEN) == "asked"
    with pytest.raises(BulkheadStopped):
        queued.result(MUST_HAPPEN)
    (provisional,) = seen
    assert not provisional.terminated
    name = "test_stop_from_a_handler_is_a_request_that_returns_at_once.<locals>.stops_its_bulkhead"
    assert provisional.still_running == (f"inside-worker-0: {name}",)
    report = bulkhead.stop(MUST_HAPPEN)
    assert report.terminated
    assert report is not provisional


@pytest.mark.parametrize(
    "seconds", [math.inf, 1e10, 1e300, 10**400], ids=["inf", "1e10", "1e300", "10**400"]
)
def test_a_huge_or_infinite_budget_means_as_long_as_it_takes(seconds: float) -> None:
    """Infinite and huge budgets are accepted everywhere and never raise OverflowError."""
    bulkhead = Bulkhead(1, 0, name="endless", stop_timeout=seconds).start()
    assert bulkhead.call(lambda: "ok", timeout=seconds) == "ok"
    token_waited: list[bool] = []

    def waits() -> None:
        token_waited.append(current_token().wait(seconds))

    bulkhead.submit(waits)
    wait_until(lambda: bulkhead.stats().active == 1, "the handler waits on its token")
    assert bulkhead.stop(cancel_running=True).terminated  # stop_timeout
    assert token_waited == [True]
    assert Bulkhead(1, 0).start().stop(seconds).terminated


@pytest.mark.parametrize("bad", [math.nan, -1.0, True, "1", None])
def test_a_budget_that_is_not_seconds_is_a_value_error_naming_it(bad: object) -> None:
    """nan, negative, bool, str: ValueError naming the argument, at every entry point."""
    with pytest.raises(ValueError, match=r"^stop_timeout must be a number of seconds"):
        Bulkhead(1, 0, stop_timeout=bad)  # type: ignore[arg-type]
    bulkhead = Bulkhead(1, 0).start()
    if bad is not None:  # None means "stop_timeout" for stop(), "no limit" for call()
        with pytest.raises(ValueError, match=r"^timeout must be a number of seconds"):
            bulkhead.stop(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"^timeout must be a number of seconds"):
            bulkhead.call(lambda: None, timeout=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"^timeout must be a number of seconds"):
            JobToken().wait(bad)  # type: ignore[arg-type]
    assert bulkhead.stop(MUST_HAPPEN).terminated


def test_a_token_callback_that_raises_keyboard_interrupt_is_contained_then_re_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every callback runs and the report is recorded before the KeyboardInterrupt."""
    bulkhead = Bulkhead(2, 0, name="callbacks").start()
    registered = [threading.Event(), threading.Event()]
    ran: list[str] = []

    def job(ready: threading.Event, name: str, exc: BaseException) -> Callable[[], None]:
        def runs_until_cancelled() -> None:
            def callback() -> None:
                ran.append(name)
                raise exc

            token = current_token()
            token.on_cancel(callback)
            ready.set()
            token.wait(MUST_HAPPEN)  # running until stop() cancels it

        return runs_until_cancelled

    bulkhead.submit(job(registered[0], "a", KeyboardInterrupt()))
    bulkhead.submit(job(registered[1], "b", RuntimeError("second callback")))
    for ready in registered:
        assert ready.wait(MUST_HAPPEN)
    with caplog.at_level(logging.ERROR), pytest.raises(KeyboardInterrupt):
        bulkhead.stop(MUST_HAPPEN, cancel_running=True)

    assert sorted(ran) == ["a", "b"]
    assert sum("cancel callback" in r.getMessage() for r in caplog.records) == 2
    report = bulkhead.stop(0)
    assert report.terminated
    assert bulkhead.stop(0) is report


def test_bulkhead_full_says_what_holds_the_slots() -> None:
    """A slot held by a job whose caller timed out is named as such in BulkheadFull."""
    bulkhead = Bulkhead(1, 1, name="holders").start()
    gate = Gate("abandoned handler")
    first, outcome = run_in_thread(lambda: bulkhead.call(hold(gate), timeout=SHORT), "caller")
    gate.wait_reached()
    join_or_fail(first)  # its timeout passed while the handler is held at the gate
    assert isinstance(outcome["error"], BulkheadTimeout)
    with pytest.raises(BulkheadTimeout):
        bulkhead.call(lambda: "late", timeout=SHORT)  # queued, then its caller left
    with pytest.raises(BulkheadFull) as info:
        bulkhead.call(lambda: "refused")

    assert str(info.value) == (
        "holders: full: 1 of 1 worker(s) running (1 abandoned by timed-out callers), "
        "1 waiting (1 by timed-out callers, to be skipped); room for 2 in all"
    )
    finish(bulkhead, gate)


def test_stop_from_a_signal_handler_that_landed_inside_a_locked_section_hands_off() -> None:
    """A handler's stop() on a thread holding the bulkhead's lock never waits for it."""
    bulkhead = Bulkhead(1, 0, name="locked").start()
    seen: list[BulkheadReport] = []

    def on_sigint(signum: int, frame: object) -> None:
        seen.append(bulkhead.stop(MUST_HAPPEN))

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        # Where call() or submit() is when a signal lands between two of its bytecodes.
        with bulkhead._lock:
            signal.raise_signal(signal.SIGINT)  # the handler runs before this returns
    finally:
        signal.signal(signal.SIGINT, previous)

    (provisional,) = seen
    assert not provisional.terminated
    stopper = [t for t in threading.enumerate() if t.name == "locked-stopper"]
    for thread in stopper:
        join_or_fail(thread)
    report = bulkhead.stop(MUST_HAPPEN)
    assert report.terminated
    assert report is not provisional
    assert workers_named("locked-worker-") == []
