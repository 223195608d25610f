"""The worker on the paths users take, each forced, never hoped for.

``with worker.start()``, Ctrl-C during `Worker.stop`, a stop from a signal handler, a
handler, a hook or another thread, any budget, and callbacks that raise.

Every interleaving is forced: the job parks at a `Gate`, and a real signal is sent only once
the main thread is seen waiting inside the stop.
"""

from __future__ import annotations

import logging
import math
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from patterns.jobqueue.stores.memory import MemoryStore
from patterns.jobqueue.stores.records import JobState
from patterns.jobqueue.tasks import Phase, TaskRegistry
from patterns.jobqueue.worker.worker import Outcome, Worker, WorkerReport, WorkerState
from tests.support import (
    MUST_HAPPEN,
    NOISE,
    Gate,
    elapsed,
    join_or_fail,
    run_in_thread,
    run_python,
    signal_main_when_inside,
    wait_until,
    wait_until_blocked_in,
)

CTRL_C = ("P25", "a Ctrl-C inside Thread.join() marks a live thread finished: the next report lies")
E1 = ("E1", "a handler that sets the event main is waiting on deadlocks")

_T = TypeVar("_T")
_LEFT: list[Gate | Worker] = []  # what a failed test must not leave parked or running


def keep(thing: _T) -> _T:
    """Register a gate (opened) or a worker (stopped) for the end of the test, pass or fail."""
    assert isinstance(thing, Gate | Worker)
    _LEFT.append(thing)
    return thing


@pytest.fixture(autouse=True)
def nothing_left_parked() -> Iterator[None]:
    """A failed assertion must not leave a parked job or a running worker to later tests."""
    yield
    left = _LEFT[:]
    _LEFT.clear()
    for gate in (g for g in left if isinstance(g, Gate)):
        gate.open()
    for worker in (w for w in left if isinstance(w, Worker)):
        worker.stop(MUST_HAPPEN)


def parked_worker(gate: Gate, **options: Any) -> tuple[Worker, MemoryStore, int]:
    """A started worker whose one job parks at ``gate``, ignoring its token (it never looks)."""
    store, tasks = MemoryStore(), TaskRegistry()

    @tasks.task(name="parked", max_attempts=1)
    def parked(payload: Any, ctx: Any) -> None:
        gate.arrive()

    job_id = store.enqueue("parked")
    settings: dict[str, Any] = {"concurrency": 1, "poll_interval": 60.0, "name": "w23"}
    settings.update(options)
    worker = keep(Worker(store, tasks, **settings).start())
    gate.wait_reached()
    return worker, store, job_id


def worker_threads_alive(worker: Worker) -> list[str]:
    """Names of the worker's threads that are alive (observed from outside, after the fact)."""
    return [t.name for t in threading.enumerate() if t.name.startswith(worker.name)]


# --- R1: `with worker.start():`, and the program exits -------------------------------------


def test_entering_a_started_worker_returns_it_and_the_block_stops_it() -> None:
    """``with Worker(...).start() as w`` gives the running worker; leaving the block stops it."""
    worker = keep(
        Worker(MemoryStore(), TaskRegistry(), concurrency=2, poll_interval=60.0, name="w23")
    )
    with worker.start() as entered:
        assert entered is worker
        assert worker.state is WorkerState.RUNNING
    assert worker.state is WorkerState.STOPPED
    assert worker.stop().terminated
    assert worker_threads_alive(worker) == []


def test_entering_a_stopped_worker_is_refused() -> None:
    """A worker runs once: entering it after its stop is a RuntimeError, and starts nothing."""
    worker = Worker(MemoryStore(), TaskRegistry(), name="w23")
    worker.stop()
    with pytest.raises(RuntimeError, match="stopped"), worker:
        pass
    assert worker_threads_alive(worker) == []


_WITH_START_CHILD = """
import sys, time
from patterns.jobqueue import MemoryStore, SQLiteStore, TaskRegistry, Worker

tasks = TaskRegistry()
tasks.task(name="double")(lambda payload, ctx: payload * 2)
store = MemoryStore() if sys.argv[1] == "memory" else SQLiteStore(sys.argv[2])
with Worker(store, tasks, concurrency=2, poll_interval=0.05, stop_timeout=5).start() as worker:
    job_id = worker.enqueue("double", 21)
    deadline = time.monotonic() + 10
    while store.get(job_id).state != "done" and time.monotonic() < deadline:
        time.sleep(0.01)  # polling an observation
    sys.stdout.write(f"{store.get(job_id).state} {store.get(job_id).result}\\n")
sys.stdout.write("left the block\\n")
"""


@pytest.mark.parametrize("which", ["memory", "sqlite"])
def test_a_program_using_with_worker_start_exits_on_its_own(which: str, tmp_path: Path) -> None:
    """A child process with ``with Worker(...).start():`` runs its job and exits 0, promptly.

    Before: ``__enter__`` called start() again, which raised, and the non-daemon threads the
    first start() began held the interpreter's exit for ever.
    """
    done = run_python(_WITH_START_CHILD, which, str(tmp_path / "jobs.db"), timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "done 42\nleft the block\n"


# --- R2: Ctrl-C during stop(): the next report is the truth, and the stop still ends -------


@pytest.mark.race(*CTRL_C)
@pytest.mark.usefixtures("default_sigint")
def test_after_ctrl_c_during_stop_a_stop_0_is_truthful_and_recorded() -> None:
    """A real SIGINT in stop(5): stop(0) then says the job and its thread run, and is final.

    Lesson: an interrupted stop must neither lie later nor leave the next stop unable to
    finish; the report reads the worker's own bookkeeping and each thread's "ended" event.
    """
    gate = keep(Gate("ignores its stop"))
    worker, store, job_id = parked_worker(gate)
    try:
        sender = signal_main_when_inside("await_termination", signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            worker.stop(5.0)
        join_or_fail(sender)
        with elapsed() as took:
            report = worker.stop(0.0)
        assert took() < NOISE
        assert report.terminated is False
        assert report.still_running[0] == f"job {job_id}"
        assert "w23-job_0" in report.still_running  # the handler's thread, still in its job
        assert worker.state is WorkerState.STOPPED  # the stop that completed is recorded
    finally:
        gate.open()
    wait_until(lambda: worker.stats().lost == 1, "the late outcome refused (it was released)")
    assert worker.stop(MUST_HAPPEN) is report
    assert store.get(job_id).state is JobState.QUEUED  # given back, never failed
    wait_until(lambda: worker_threads_alive(worker) == [], "every worker thread ended")


@pytest.mark.race(*CTRL_C)
@pytest.mark.usefixtures("default_sigint")
@pytest.mark.parametrize("interrupts", [1, 2])
def test_after_ctrl_c_a_stop_that_sees_the_job_end_reports_terminated(interrupts: int) -> None:
    """Ctrl-C once or twice in stop(), then the job ends: the next stop finishes, truthfully.

    Lesson: a stop a Ctrl-C interrupted records nothing; the next one resumes it.
    """
    gate = keep(Gate("ignores its stop"))
    shutdowns: list[WorkerReport] = []
    worker, _, job_id = parked_worker(gate, on_shutdown=shutdowns.append)
    try:
        for _ in range(interrupts):
            sender = signal_main_when_inside("await_termination", signal.SIGINT)
            with pytest.raises(KeyboardInterrupt):
                worker.stop(5.0)
            join_or_fail(sender)
    finally:
        gate.open()
    report = worker.stop(MUST_HAPPEN)
    assert (report.terminated, report.still_running) == (True, ())
    assert dict(report.outcomes) == {job_id: Outcome.DONE}
    assert shutdowns == [report]
    assert worker.stop() is report
    assert worker_threads_alive(worker) == [] or all(
        t.daemon for t in threading.enumerate() if t.name.startswith(worker.name)
    )


class ParkedClaims(MemoryStore):
    """A store whose claims park at ``gate`` once ``park`` is set (a store call hanging)."""

    def __init__(self, gate: Gate) -> None:
        super().__init__()
        self.gate = gate
        self.park = False

    def claim(self, owner: str, *, lease: float, limit: int = 1) -> Any:
        """`MemoryStore.claim`, after the gate when parking."""
        if self.park:
            self.gate.arrive()
        return super().claim(owner, lease=lease, limit=limit)


def _main_waits_in_a_daemon_threads_stop() -> bool:
    """Whether the main thread waits inside a stop of ``patterns/daemon_threads.py``."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    innermost = frame
    while frame is not None:
        if frame.f_code.co_filename.endswith("daemon_threads.py"):
            assert innermost is not None
            return innermost.f_code.co_name in {"join", "_wait_for_tstate_lock", "wait"}
        frame = frame.f_back
    return False


@pytest.mark.race(*CTRL_C)
@pytest.mark.usefixtures("default_sigint")
def test_after_ctrl_c_in_the_claimers_join_the_report_says_it_still_runs() -> None:
    """A SIGINT inside the join of a claimer stuck in a store call: stop(0) is not terminated.

    Lesson: before 3.13 the interrupted ``join()`` marks the live claimer finished
    (gh-90882); the worker's report reads the claim loop's own "ended" event instead.
    """
    gate = keep(Gate("a claim hanging in the store"))
    store = ParkedClaims(gate)
    worker = keep(Worker(store, TaskRegistry(), concurrency=1, poll_interval=60.0, name="w23"))
    worker.start()
    store.park = True
    worker.wake()  # the claimer claims again, and parks in the store
    gate.wait_reached()
    main = threading.main_thread()

    def send() -> None:
        wait_until(_main_waits_in_a_daemon_threads_stop, "the main thread joins the claimer")
        assert main.ident is not None
        signal.pthread_kill(main.ident, signal.SIGINT)

    sender, _ = run_in_thread(send, "ctrl-c-sender")
    try:
        with pytest.raises(KeyboardInterrupt):
            worker.stop(5.0)
        join_or_fail(sender)
        report = worker.stop(0.0)
        assert report.terminated is False  # the claimer still waits in the store
        assert worker.state is WorkerState.STOPPED
    finally:
        gate.open()
    assert worker.stop() is report
    wait_until(lambda: worker_threads_alive(worker) == [], "the claimer left once released")


def test_a_report_refuses_terminated_with_something_still_running() -> None:
    """``terminated=True`` with a non-empty ``still_running`` is a contradiction: refused."""
    with pytest.raises(ValueError, match=r"terminated=True with still_running=\('job 1',\)"):
        WorkerReport(terminated=True, still_running=("job 1",), worker="w")
    assert WorkerReport(terminated=False, still_running=("job 1",), worker="w").still_running


# --- R3: any budget -------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [math.inf, 1e10, 10**400], ids=["inf", "1e10", "10**400"])
def test_an_endless_budget_means_as_long_as_it_takes(budget: float) -> None:
    """inf, 1e10 (past threading.TIMEOUT_MAX) and a huge int: accepted, never OverflowError."""
    endless = Worker(
        MemoryStore(),
        TaskRegistry(),
        poll_interval=budget,
        stop_timeout=budget,
        cancel_timeout=budget,
        store_outage_limit=budget,
        name="w23",
    )
    assert endless.stop_timeout >= 1e10
    keep(endless).start()
    assert endless.wait_stop_requested(0.0) is False
    assert (endless.stop().terminated, endless.stop().still_running) == (True, ())
    assert endless.wait_stop_requested(budget) is True
    other = keep(Worker(MemoryStore(), TaskRegistry(), poll_interval=budget, name="w23-other"))
    other.start()
    assert other.stop(budget).terminated is True


def test_stop_inf_drains_a_running_job_however_long_it_takes() -> None:
    """stop(inf) waits for the running job (DRAINING has no end): it completes, not released."""
    gate = keep(Gate("finishes once the stop waits"))
    worker, store, job_id = parked_worker(gate, stop_timeout=math.inf)
    main = threading.current_thread()
    opener, _ = run_in_thread(
        lambda: (wait_until_blocked_in(main, "await_termination"), gate.open()), "opener"
    )
    report = worker.stop()
    join_or_fail(opener)
    assert report.terminated
    assert dict(report.outcomes) == {job_id: Outcome.DONE}
    assert WorkerState.CANCELLING not in report.phases
    assert store.get(job_id).state is JobState.DONE


def sleeping_worker(**options: Any) -> tuple[Worker, int]:
    """A started worker whose one job sleeps on its token (it stops once cancelled)."""
    store, tasks = MemoryStore(), TaskRegistry()
    started = threading.Event()

    @tasks.task(name="sleeper", max_attempts=1)
    def sleeper(payload: Any, ctx: Any) -> None:
        started.set()
        ctx.sleep(MUST_HAPPEN * 3)

    job_id = store.enqueue("sleeper")
    worker = keep(Worker(store, tasks, concurrency=1, poll_interval=60.0, name="w23", **options))
    worker.start()
    assert started.wait(MUST_HAPPEN)
    return worker, job_id


def test_an_endless_stop_timeout_with_an_equal_cancel_timeout_cancels_at_once() -> None:
    """stop_timeout = cancel_timeout = inf: the whole (endless) budget is CANCELLING's."""
    worker, job_id = sleeping_worker(stop_timeout=math.inf, cancel_timeout=math.inf)
    with elapsed() as took:
        report = worker.stop()
    assert took() < NOISE
    assert report.terminated
    assert dict(report.outcomes) == {job_id: Outcome.RELEASED}
    assert report.phases[WorkerState.DRAINING] < NOISE


def test_a_finite_cancel_timeout_of_an_endless_stop_timeout_is_kept_in_seconds() -> None:
    """stop_timeout=inf, cancel_timeout=0.2: stop(0.5) drains 0.3 s, then cancels."""
    worker, job_id = sleeping_worker(stop_timeout=math.inf, cancel_timeout=0.2)
    with elapsed() as took:
        report = worker.stop(0.5)
    assert took() < 0.5 + NOISE
    assert dict(report.outcomes) == {job_id: Outcome.RELEASED}
    assert 0.3 - 0.05 < report.phases[WorkerState.DRAINING] < 0.3 + NOISE


SECONDS = ["poll_interval", "stop_timeout", "cancel_timeout", "lease", "heartbeat_interval"]


@pytest.mark.parametrize("name", [*SECONDS, "store_outage_limit"])
@pytest.mark.parametrize("bad", [math.nan, -1.0, True, "1"], ids=["nan", "neg", "bool", "str"])
def test_a_setting_that_is_not_a_number_of_seconds_is_refused_by_name(name: str, bad: Any) -> None:
    """nan, negative, bool and str seconds: a ValueError naming the argument, never TypeError."""
    with pytest.raises(ValueError, match=name):
        Worker(MemoryStore(), TaskRegistry(), **{name: bad})


@pytest.mark.parametrize("bad", [math.nan, -1.0, True, "1"], ids=["nan", "neg", "bool", "str"])
def test_a_stop_or_wait_budget_that_is_not_a_number_of_seconds_is_refused(bad: Any) -> None:
    """stop(bad) and wait_stop_requested(bad): ValueError naming ``timeout``; nothing changes."""
    worker = keep(Worker(MemoryStore(), TaskRegistry(), poll_interval=60.0, name="w23").start())
    try:
        with pytest.raises(ValueError, match="timeout must be a number of seconds"):
            worker.stop(bad)
        with pytest.raises(ValueError, match="timeout must be a number of seconds"):
            worker.wait_stop_requested(bad)
        assert worker.state is WorkerState.RUNNING
    finally:
        assert worker.stop().terminated


# --- R4: stops from a signal handler, a handler, a hook, another thread --------------------


@pytest.mark.race(*E1)
def test_stop_from_a_signal_handler_during_stop_returns_at_once() -> None:
    """A SIGUSR1 handler's stop() while the main thread is inside stop(): provisional, at once.

    Lesson: the thread that owns the stop cannot wait for itself; it gets the current truth.
    """
    gate = keep(Gate("ignores its stop"))
    inner: dict[str, Any] = {}
    worker, _, job_id = parked_worker(gate)

    def handler(signum: int, frame: object) -> None:
        began = time.monotonic()
        inner["report"] = worker.stop(5.0)
        inner["took"] = time.monotonic() - began

    before = signal.signal(signal.SIGUSR1, handler)
    try:
        sender = signal_main_when_inside("await_termination", signal.SIGUSR1)

        def open_after_the_handler() -> None:
            join_or_fail(sender)
            wait_until(lambda: "took" in inner, "the handler's stop() returned")
            gate.open()

        opener, _ = run_in_thread(open_after_the_handler, "opener")
        outer = worker.stop(MUST_HAPPEN)
        join_or_fail(opener)
    finally:
        signal.signal(signal.SIGUSR1, before)
        gate.open()
    assert inner["took"] < NOISE
    assert inner["report"].terminated is False
    assert inner["report"].still_running[0] == f"job {job_id}"
    assert inner["report"] is not outer
    assert outer.terminated is True
    assert worker.stop() is outer


def test_stop_from_on_shutdown_returns_a_provisional_report_at_once() -> None:
    """on_shutdown runs inside the stop: its own stop() gets the report so far, at once."""
    inner: dict[str, Any] = {}

    def on_shutdown(report: WorkerReport) -> None:
        with elapsed() as took:
            inner["report"] = worker.stop(5.0)
        inner["took"] = took()

    worker = keep(
        Worker(
            MemoryStore(), TaskRegistry(), poll_interval=60.0, name="w23", on_shutdown=on_shutdown
        )
    ).start()
    report = worker.stop()
    assert inner["took"] < NOISE
    assert inner["report"] is not report
    assert worker.stop() is report


def test_stop_from_a_handler_is_a_request_that_names_its_thread() -> None:
    """A handler's stop() starts the drain and returns at once; the next stop is the final.

    Lesson: a thread of the worker cannot wait for itself: never "cannot join current thread".
    """
    store, tasks = MemoryStore(), TaskRegistry()
    inner: dict[str, Any] = {}
    gate = keep(Gate("after its stop"))

    @tasks.task(name="stopper", max_attempts=1)
    def stopper(payload: Any, ctx: Any) -> str:
        with elapsed() as took:
            inner["report"] = worker.stop(0.5)
        inner["took"] = took()
        inner["thread"] = threading.current_thread().name
        gate.arrive()
        return "stopped myself"

    worker = keep(Worker(store, tasks, concurrency=1, poll_interval=60.0, name="w23").start())
    job_id = worker.enqueue("stopper")  # once ``worker`` is bound: the handler reads it
    gate.wait_reached()
    assert worker.state is WorkerState.DRAINING  # the request began the stop
    gate.open()
    wait_until(lambda: worker.stats().done == 1, "the job completed")
    final = worker.stop(MUST_HAPPEN)
    assert inner["took"] < 0.5 + NOISE
    early = inner["report"]
    assert early.terminated is False
    assert early.still_running == (f"job {job_id}", inner["thread"])
    assert early is not final
    assert (final.terminated, final.still_running) == (True, ())
    assert dict(final.outcomes) == {job_id: Outcome.DONE}
    assert worker.stop() is final


def test_stop_from_a_hook_on_a_committing_thread_is_a_request_that_names_it() -> None:
    """on_complete runs on the thread that committed: its stop() is a request naming it.

    The one job is the last in hand, so its own handler thread led the commit.
    """
    store, tasks = MemoryStore(), TaskRegistry()
    inner: list[WorkerReport] = []
    hooked: list[str] = []

    def on_complete(job: object, result: object) -> None:
        hooked.append(threading.current_thread().name)
        inner.append(worker.stop())

    tasks.on_complete = on_complete
    tasks.task(name="t")(lambda payload, ctx: None)
    worker = keep(Worker(store, tasks, poll_interval=60.0, name="w23").start())
    worker.enqueue("t")  # once ``worker`` is bound: the hook reads it
    assert worker.wait_stop_requested(MUST_HAPPEN)
    final = worker.stop(MUST_HAPPEN)
    [early] = inner
    assert early.terminated is False
    assert hooked[0].startswith("w23-job")  # a worker thread: the handler that led the commit
    assert hooked[0] in early.still_running
    assert final.terminated
    assert worker.stop() is final


def test_a_second_stop_from_another_thread_keeps_its_own_budget() -> None:
    """stop(0.2) while another thread's stop waits for a job: back in 0.2 s, provisional.

    Lesson: a caller's budget is its own; only the first stop to complete is recorded.
    """
    gate = keep(Gate("ignores its stop"))
    worker, _, job_id = parked_worker(gate)
    try:
        outer_thread, outer = run_in_thread(lambda: worker.stop(MUST_HAPPEN), "outer-stop")
        wait_until_blocked_in(outer_thread, "await_termination")
        with elapsed() as took:
            second = worker.stop(0.2)
        assert took() < 0.2 + NOISE
    finally:
        gate.open()
    join_or_fail(outer_thread)
    assert (second.terminated, second.still_running[0]) == (False, f"job {job_id}")
    assert outer["result"].terminated is True
    assert worker.stop() is outer["result"]


# --- R5: callbacks that raise -------------------------------------------------------------


class Custom(BaseException):
    """A BaseException that is neither KeyboardInterrupt nor SystemExit."""


@pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemExit(2), Custom("odd")])
def test_an_on_shutdown_that_raises_is_logged_and_the_report_is_kept(
    error: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    """on_shutdown raising any BaseException: logged, the report kept, called once.

    A KeyboardInterrupt or SystemExit is re-raised to the caller after that.
    """
    calls: list[WorkerReport] = []

    def on_shutdown(report: WorkerReport) -> None:
        calls.append(report)
        raise error

    worker = keep(
        Worker(
            MemoryStore(), TaskRegistry(), poll_interval=60.0, name="w23", on_shutdown=on_shutdown
        )
    ).start()
    if isinstance(error, KeyboardInterrupt | SystemExit):
        with pytest.raises(type(error)):
            worker.stop()
    else:
        worker.stop()
    report = worker.stop()
    assert worker.stop() is report
    assert len(calls) == 1
    assert report.terminated
    assert [e.phase for e in report.errors] == [Phase.ON_SHUTDOWN]
    assert "on_shutdown failed" in caplog.text
    assert worker_threads_alive(worker) == [] or all(
        t.daemon for t in threading.enumerate() if t.name.startswith(worker.name)
    )


def test_a_hook_that_raises_system_exit_on_the_settler_is_logged_and_contained(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """on_complete raising SystemExit: logged as an error, the next job's hook still runs."""
    store, tasks = MemoryStore(), TaskRegistry()
    hooked: list[int] = []

    def on_complete(job: Any, result: Any) -> None:
        hooked.append(job.id)
        if len(hooked) == 1:
            raise SystemExit("a hook gave up")

    tasks.on_complete = on_complete
    tasks.task(name="t")(lambda payload, ctx: None)
    first = store.enqueue("t")
    worker = keep(Worker(store, tasks, concurrency=1, poll_interval=60.0, name="w23").start())
    wait_until(lambda: hooked == [first], "the first hook ran")
    second = worker.enqueue("t")
    wait_until(lambda: hooked == [first, second], "the second hook ran")
    assert worker.state is WorkerState.RUNNING  # the settler did not die
    report = worker.stop()
    assert report.terminated
    assert report.thread_failures == ()
    assert [(e.phase, e.job.id if e.job else None) for e in report.errors] == [
        (Phase.ON_COMPLETE, first)
    ]
    assert any(
        r.levelno == logging.ERROR and r.exc_info and r.exc_info[0] is SystemExit
        for r in caplog.records
    )
    assert [store.get(i).state for i in (first, second)] == [JobState.DONE] * 2
