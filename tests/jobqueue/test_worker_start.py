"""The worker's start is all or nothing, and a stop racing it is bounded and never raises.

A failing `threading.Thread.start` is simulated by patching it to raise on the k-th thread
the worker starts; a Ctrl-C is a real SIGINT sent to the main thread from a checkpoint
while it is inside `Worker.start`; a stop racing the start is forced by parking the start
at a `Gate` (in ``Thread.start`` or in the store's ``subscribe``) while another thread stops
the worker. Nothing sleeps to make an interleaving likely.
"""

from __future__ import annotations

import _thread
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pytest

from patterns.daemon_threads import BackgroundService, HousekeepingDaemon
from patterns.executor_shutdown import TrackingExecutor
from patterns.jobqueue.stores.memory import MemoryStore
from patterns.jobqueue.stores.records import Claim, JobState
from patterns.jobqueue.tasks import Phase, TaskRegistry
from patterns.jobqueue.worker.worker import Step, Worker, WorkerReport, WorkerState
from patterns.signal_handlers import SignalHandlers
from tests.support import (
    MUST_HAPPEN,
    NOISE,
    Gate,
    elapsed,
    join_or_fail,
    run_in_thread,
    wait_until,
)

NAME = "w-start"
CONCURRENCY = 2
# The threads Worker.start starts, in order: the settler (it commits the handlers'
# outcomes), the handler threads, the heartbeat, the claimer.
THREADS = (
    [f"{NAME}-settler"] + [f"{NAME}-job"] * CONCURRENCY + [f"{NAME}-heartbeat", f"{NAME}-claimer"]
)

_real_start = threading.Thread.start


class SubscribingStore(MemoryStore):
    """A memory store whose ``subscribe`` keeps its subscribers, and that can park at a gate."""

    def __init__(self) -> None:
        super().__init__()
        self.subscribers: list[Callable[[], object]] = []
        self.park: Gate | None = None

    def subscribe(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Record ``callback``; return the function that forgets it."""
        if self.park is not None:
            self.park.arrive()
        self.subscribers.append(callback)
        return lambda: self.subscribers.remove(callback)


def worker_threads() -> list[threading.Thread]:
    """Every live thread the worker under test started (they are all named after it)."""
    return [t for t in threading.enumerate() if t.name.startswith(NAME)]


def assert_nothing_left(worker: Worker, store: SubscribingStore, job_id: int | None) -> None:
    """Every thread ended, the worker is stopped, the job is queued with no attempt spent."""
    for thread in worker_threads():
        join_or_fail(thread)
    assert worker.state is WorkerState.STOPPED
    assert store.subscribers == []
    if job_id is None:
        return
    job = store.get(job_id)
    assert job is not None
    assert (job.state, job.attempts) == (JobState.QUEUED, 0)


def make_worker(store: SubscribingStore, **kwargs: Any) -> Worker:
    """A worker with two handler threads and no polling, named so its threads can be found."""
    tasks = TaskRegistry()
    tasks.task(name="t")(lambda payload, ctx: None)
    options: dict[str, Any] = {
        "concurrency": CONCURRENCY,
        "poll_interval": MUST_HAPPEN * 60,
        "heartbeat_interval": MUST_HAPPEN * 60,
        "lease": MUST_HAPPEN * 600,  # the heartbeat interval must be shorter
        "stop_timeout": MUST_HAPPEN,
        "name": NAME,
    }
    options.update(kwargs)
    return Worker(store, tasks, **options)


def starts_of_the_worker(on_call: Callable[[int, threading.Thread], None]) -> Any:
    """Patch `Thread.start` so ``on_call(k, thread)`` runs for the k-th thread of the worker.

    ``on_call`` may raise (the start failed) or call the real start itself; a thread of
    anyone else (a signal helper, pytest) starts as usual.
    """
    count = [0]

    def start(thread: threading.Thread) -> None:
        if not thread.name.startswith(NAME):
            _real_start(thread)
            return
        count[0] += 1
        on_call(count[0], thread)

    return mock.patch.object(threading.Thread, "start", start)


def fail_on(k: int) -> Callable[[int, threading.Thread], None]:
    """Start the worker's threads, except the k-th: that one fails as it does out of memory."""

    def on_call(n: int, thread: threading.Thread) -> None:
        if n == k:
            raise RuntimeError("can't start new thread")
        _real_start(thread)

    return on_call


@pytest.fixture
def store() -> Iterator[SubscribingStore]:
    """A fresh subscribing store."""
    store = SubscribingStore()
    yield store
    store.close()


@pytest.mark.parametrize("k", range(1, len(THREADS) + 1), ids=lambda k: THREADS[k - 1])
def test_a_thread_failing_to_start_part_way_stops_what_started_and_reraises(
    store: SubscribingStore, k: int
) -> None:
    """start() is all or nothing: a failure part-way stops every thread it started and re-raises."""
    job_id = store.enqueue("t")
    reports: list[WorkerReport] = []
    worker = make_worker(store, on_shutdown=reports.append)
    try:
        with starts_of_the_worker(fail_on(k)), pytest.raises(RuntimeError, match="new thread"):
            worker.start()
        assert_nothing_left(worker, store, job_id)
        assert len(reports) == 1
        assert worker.stop() is reports[0]  # the failed start's stop made the one report
    finally:
        worker.stop()


def test_a_context_manager_whose_start_fails_leaves_nothing_running(
    store: SubscribingStore,
) -> None:
    """`__exit__` never runs when `__enter__` raised, so `__enter__` must clean up by itself."""
    job_id = store.enqueue("t")
    worker = make_worker(store)
    entered = False
    try:
        with starts_of_the_worker(fail_on(len(THREADS))), pytest.raises(RuntimeError), worker:
            entered = True
        assert not entered
        assert_nothing_left(worker, store, job_id)
    finally:
        worker.stop()


def test_a_failed_start_puts_the_signal_handlers_back(store: SubscribingStore) -> None:
    """A worker that installed its signal handlers and then failed to start removes them."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    job_id = store.enqueue("t")
    worker = make_worker(store, install_signal_handlers=True)
    try:
        with starts_of_the_worker(fail_on(1)), pytest.raises(RuntimeError, match="new thread"):
            worker.start()
        assert {s: signal.getsignal(s) for s in before} == before
        assert_nothing_left(worker, store, job_id)
    finally:
        worker.stop()
        for sig, handler in before.items():
            signal.signal(sig, handler)


@pytest.mark.parametrize("k", range(1, len(THREADS) + 1), ids=lambda k: THREADS[k - 1])
def test_a_keyboard_interrupt_right_after_the_kth_thread_started_leaves_nothing_running(
    store: SubscribingStore, k: int
) -> None:
    """A KeyboardInterrupt landing just after any of start()'s threads began is all or nothing too.

    ``_thread.interrupt_main()`` right after the k-th thread's real start: the interrupt
    is raised in the main thread at its next check, still inside ``start()``.
    """
    store.enqueue("t")

    def on_call(n: int, thread: threading.Thread) -> None:
        _real_start(thread)
        if n == k:
            _thread.interrupt_main()

    worker = make_worker(store)
    try:
        with starts_of_the_worker(on_call), pytest.raises(KeyboardInterrupt):
            worker.start()
        for thread in worker_threads():
            join_or_fail(thread)
        assert worker.state is WorkerState.STOPPED
        assert store.counts()["running"] == 0  # a claim made meanwhile was released
    finally:
        worker.stop()


def test_a_ctrl_c_inside_start_after_a_claim_releases_it_and_stops_everything(
    store: SubscribingStore,
) -> None:
    """A KeyboardInterrupt part-way through start() gives back the claim it made and re-raises.

    The claiming thread has started and claimed the job; the main thread is still inside
    ``Thread.start`` for it (where CPython waits for the new thread to run) when SIGINT
    arrives. The failed start stops the claiming thread's service first, so the claim is
    given back by that thread, before the worker's own stop begins: the job is queued with
    no attempt spent, and the stop's report (which lists what it found held) is empty.
    """
    job_id = store.enqueue("t")
    main = threading.get_ident()  # pytest runs the test in the main thread: SIGINT's thread
    worker: Worker

    interrupted = threading.Event()  # set once the Ctrl-C has landed in the main thread

    def interrupt_after_the_claim(step: Step, claim: Claim, phase: Phase | None) -> None:
        if step is Step.AFTER_CLAIM:
            signal.pthread_kill(main, signal.SIGINT)  # Ctrl-C, while start() still runs
            # Hold the claim until the interrupt has landed; then the claimer goes on, and
            # its service (stopped by the failed start) lets it end.
            assert interrupted.wait(MUST_HAPPEN), "the interrupt never landed"

    claimer_started = threading.Event()  # never set: only the interrupt ends the wait

    def on_call(n: int, thread: threading.Thread) -> None:
        if not thread.name.endswith("-claimer"):
            _real_start(thread)
            return
        try:
            # The interrupt lands in the real start (CPython waits there for the new thread
            # to run, and it claims at once) or in the wait below, still inside Thread.start.
            _real_start(thread)
            claimer_started.wait(MUST_HAPPEN)
        except KeyboardInterrupt:
            interrupted.set()
            raise
        raise AssertionError("the interrupt never arrived")

    worker = make_worker(store, step_hook=interrupt_after_the_claim)
    try:
        with starts_of_the_worker(on_call), pytest.raises(KeyboardInterrupt):
            worker.start()
        assert_nothing_left(worker, store, job_id)
        report = worker.stop()
        assert (report.outcomes, report.still_running) == ({}, ())
    finally:
        worker.stop()


# Where start() is parked while another thread stops the worker: in the store's subscribe
# (still NEW), or just before each later step (RUNNING): starting the settler, submitting
# each handler thread's work, starting the heartbeat, starting the claimer. The gate sits
# outside the locks those steps take, so the stop can run to its end while the start waits.
RACE_POINTS = ["subscribe", "settler", "handler-1", "handler-2", "heartbeat", "claimer"]


PARKED_POOLS: list[TrackingExecutor] = []  # the handler threads' pool a start parked in


def parked_before(where: str, gate: Gate) -> Any:
    """A patch that parks the worker's start at ``gate`` just before the step ``where``."""
    if where == "subscribe":
        return contextlib.nullcontext()  # the store parks it
    if where.startswith("handler-"):
        k = int(where.removeprefix("handler-"))
        real_submit = TrackingExecutor.submit
        calls = [0]

        def submit(executor: TrackingExecutor, fn: Any, /, *args: Any, **kw: Any) -> Any:
            calls[0] += 1
            if calls[0] == k:
                PARKED_POOLS[:] = [executor]
                gate.arrive()
            return real_submit(executor, fn, *args, **kw)

        return mock.patch.object(TrackingExecutor, "submit", submit)
    service = HousekeepingDaemon if where == "heartbeat" else BackgroundService
    real_start = service.start

    def start(self: Any) -> Any:
        if self.name.endswith(f"-{where}"):  # the settler and the claimer share the class
            gate.arrive()
        return real_start(self)

    return mock.patch.object(service, "start", start)


@pytest.mark.parametrize("where", RACE_POINTS)
def test_a_stop_racing_start_is_bounded_never_raises_and_leaves_nothing_running(
    store: SubscribingStore, where: str
) -> None:
    """stop() from another thread while start() is part-way returns a report and wins.

    start() is parked at a gate while another thread stops the worker, within its budget;
    then the start goes on. It must refuse (RuntimeError) and leave nothing running,
    nothing subscribed and the job unclaimed.
    """
    job_id = store.enqueue("t")
    gate = Gate(f"start parked before {where}")
    if where == "subscribe":
        store.park = gate
    worker = make_worker(store)
    try:
        with parked_before(where, gate):
            starter, started = run_in_thread(worker.start, "starter")
            gate.wait_reached()
            with elapsed() as took:
                stopper, stopped = run_in_thread(lambda: worker.stop(1.0), "stopper")
                join_or_fail(stopper)
            assert took() < 1.0 + NOISE
            gate.open()
            join_or_fail(starter)
        assert "error" not in stopped, stopped
        assert isinstance(stopped["result"], WorkerReport)
        assert isinstance(started.get("error"), RuntimeError), started
        assert_nothing_left(worker, store, job_id)
        assert worker.stop() is stopped["result"]
    finally:
        gate.open()
        worker.stop()


def test_a_stop_requested_while_the_handler_threads_start_lets_the_start_finish(
    store: SubscribingStore,
) -> None:
    """A signal's `request_stop` during start() is a stop, not a failed start.

    The start is parked before the second handler thread; another thread requests the
    stop (as the first SIGTERM does), and the first handler's loop leaves at once, so
    the pool has an idle thread and reuses it for the second instead of starting one.
    That is no missing thread: start() returns, and the stop finds nothing running.
    """
    job_id = store.enqueue("t")
    gate = Gate("start parked before handler-2")
    worker = make_worker(store)
    try:
        with parked_before("handler-2", gate):
            starter, started = run_in_thread(worker.start, "starter")
            gate.wait_reached()
            worker.request_stop("SIGTERM received")
            # The pool's own count of idle threads (CPython's ThreadPoolExecutor); the pool
            # is the one whose submit parked the start.
            [pool] = PARKED_POOLS
            idle = pool._idle_semaphore  # type: ignore[attr-defined]
            wait_until(lambda: idle._value > 0, "the first handler thread is idle")
            gate.open()
            join_or_fail(starter)
        assert started.get("result") is worker, started
        report = worker.stop()
        assert report.terminated
        assert report.completed == ()
        assert_nothing_left(worker, store, job_id)
    finally:
        gate.open()
        worker.stop()


def test_two_racing_starts_start_one_worker(store: SubscribingStore) -> None:
    """A second start() while the first is part-way refuses at once and changes nothing."""
    gate = Gate("first start parked in subscribe")
    store.park = gate
    worker = make_worker(store)
    try:
        first, outcome = run_in_thread(worker.start, "first-start")
        gate.wait_reached()
        with pytest.raises(RuntimeError, match="only once"):
            worker.start()
        gate.open()
        join_or_fail(first)
        assert outcome.get("result") is worker, outcome
        assert len(store.subscribers) == 1
        report = worker.stop()
        assert report.terminated
        assert_nothing_left(worker, store, None)
    finally:
        gate.open()
        worker.stop()


def test_a_ctrl_c_just_after_the_stop_put_the_signal_handlers_back_keeps_the_final_report(
    store: SubscribingStore,
) -> None:
    """A KeyboardInterrupt at the very end of stop() cannot turn its report into a provisional one.

    The stop puts the previous SIGINT handler back last; a Ctrl-C right then raises in the
    stop. The worker is stopped all the same, and a later stop() returns the final report.
    """
    before = signal.getsignal(signal.SIGINT)
    reports: list[WorkerReport] = []
    worker = make_worker(store, install_signal_handlers=True, on_shutdown=reports.append)
    real_stop = SignalHandlers.stop

    def stop(handlers: SignalHandlers) -> None:
        real_stop(handlers)
        signal.raise_signal(signal.SIGINT)  # Python's own handler is back: KeyboardInterrupt

    try:
        worker.start()
        with mock.patch.object(SignalHandlers, "stop", stop), pytest.raises(KeyboardInterrupt):
            worker.stop()
        assert signal.getsignal(signal.SIGINT) == before
        assert_nothing_left(worker, store, None)
        assert reports[0].terminated
        assert worker.stop() is reports[0]
    finally:
        signal.signal(signal.SIGINT, before)
        worker.stop()
