"""One lifecycle contract, checked on every stoppable class in `patterns/` and the job queue.

The contract (``docs/design.md``): no constructor starts a thread; ``start() -> Self`` is all
or nothing and refuses a second call; ``stop(timeout=None)`` uses the object's
``stop_timeout``, is bounded, never raises for unfinished work and returns the same report
every time; a report starts with ``terminated: bool`` and ``still_running: tuple[str, ...]``;
``with`` starts and stops. A new stoppable class joins `CASES` and is held to all of it.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from unittest import mock

import pytest

from tests.support import NOISE, REAL_START, cannot_start, thread_start_patched


@dataclass(frozen=True)
class Case:
    """How to build one stoppable thing, unstarted, doing trivial work."""

    name: str
    build: Callable[[], Any]

    def __str__(self) -> str:
        return self.name


def _background_service() -> Any:
    from patterns.daemon_threads import BackgroundService  # noqa: PLC0415

    return BackgroundService(lambda stopping: stopping.wait(), name="contract-bg", stop_timeout=5.0)


def _housekeeping_daemon() -> Any:
    from patterns.daemon_threads import HousekeepingDaemon  # noqa: PLC0415

    return HousekeepingDaemon(
        lambda stopping: stopping.wait(), name="contract-daemon", stop_timeout=5.0
    )


def _supervisor() -> Any:
    from patterns.supervisor import Supervisor  # noqa: PLC0415

    return Supervisor(lambda stopping: stopping.wait(), name="contract-sup", stop_timeout=5.0)


def _consumer_pool() -> Any:
    from patterns.closable_queue import ConsumerPool  # noqa: PLC0415

    return ConsumerPool(lambda item: None, consumers=2, name="contract-pool", stop_timeout=5.0)


def _bulkhead() -> Any:
    from patterns.bulkhead import Bulkhead  # noqa: PLC0415

    return Bulkhead(max_concurrent=2, queue_size=2, name="contract-bulkhead", stop_timeout=5.0)


def _tracking_executor() -> Any:
    from patterns.executor_shutdown import TrackingExecutor  # noqa: PLC0415

    return TrackingExecutor(max_workers=2, thread_name_prefix="contract-pool", stop_timeout=5.0)


def _signal_handlers() -> Any:
    from patterns.exit_hooks import SignalHandlers  # noqa: PLC0415

    return SignalHandlers(lambda: None, stop_timeout=5.0)


def _worker() -> Any:
    from patterns.jobqueue import MemoryStore, TaskRegistry, Worker  # noqa: PLC0415

    return Worker(MemoryStore(), TaskRegistry(), concurrency=2, name="contract-worker",
                  poll_interval=60.0, stop_timeout=5.0)  # fmt: skip


def _task_set() -> Any:
    # asyncio's TaskSet has a coroutine stop(); this adapter runs its loop in a thread and
    # gives it the synchronous start()/stop() the contract checks are written against.
    from tests.support import LoopThreadTaskSet  # noqa: PLC0415

    return LoopThreadTaskSet(stop_timeout=5.0)


def _stoppable_process() -> Any:
    from patterns.process_shutdown import StoppableProcess  # noqa: PLC0415
    from patterns.teaching.process_tasks import wait_for_stop  # noqa: PLC0415

    return StoppableProcess(wait_for_stop, name="contract-process", stop_timeout=5.0)


CASES = [
    Case("TrackingExecutor", _tracking_executor),
    Case("ConsumerPool", _consumer_pool),
    Case("BackgroundService", _background_service),
    Case("HousekeepingDaemon", _housekeeping_daemon),
    Case("Supervisor", _supervisor),
    Case("SignalHandlers", _signal_handlers),
    Case("Bulkhead", _bulkhead),
    Case("Worker", _worker),
    Case("TaskSet", _task_set),
    Case("StoppableProcess", _stoppable_process),
]

pytestmark = pytest.mark.parametrize("case", CASES, ids=str)


def _new_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t not in before and t.is_alive()]


def _core(report: Any) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(report))[:2]


def test_building_one_starts_no_thread(case: Case) -> None:
    """A constructor only stores and checks its options; threads start in start()."""
    before = set(threading.enumerate())
    thing = case.build()
    try:
        assert _new_threads(before) == []
    finally:
        thing.stop()


def test_start_returns_the_object_and_a_second_start_is_refused(case: Case) -> None:
    """start() returns self, so ``x = Thing(...).start()`` reads; starting twice is an error."""
    thing = case.build()
    try:
        assert thing.start() is thing
        with pytest.raises(RuntimeError):
            thing.start()
    finally:
        thing.stop()


def test_stop_takes_an_optional_budget_that_defaults_to_stop_timeout(case: Case) -> None:
    """``stop(timeout=None)``: None means the object's own ``stop_timeout``, never forever."""
    thing = case.build()
    try:
        assert inspect.signature(thing.stop).parameters["timeout"].default is None
        assert thing.stop_timeout == 5.0
        with pytest.raises(ValueError, match="timeout"):
            thing.stop(-1.0)
    finally:
        thing.stop()


def test_stop_is_bounded_idempotent_and_reports_the_core_fields_first(case: Case) -> None:
    """A second stop() returns the first report; every report opens with the same two fields."""
    before = set(threading.enumerate())
    thing = case.build().start()
    started = time.monotonic()
    report = thing.stop()
    assert time.monotonic() - started < thing.stop_timeout + NOISE
    assert thing.stop(0.0) is report
    assert dataclasses.is_dataclass(report)
    assert _core(report) == ("terminated", "still_running")
    assert report.terminated is True
    assert report.still_running == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.terminated = False
    assert _new_threads(before) == []


def test_stop_before_start_reports_terminated_and_start_is_then_refused(case: Case) -> None:
    """Stopping a thing that never started is a report, not an error; it cannot start later."""
    thing = case.build()
    report = thing.stop()
    assert (report.terminated, report.still_running) == (True, ())
    with pytest.raises(RuntimeError):
        thing.start()


def test_the_with_block_starts_and_stops_with_the_default_budget(case: Case) -> None:
    """``with`` gives the started object and leaves nothing running; the report stays final."""
    before = set(threading.enumerate())
    with case.build() as thing:
        assert thing.stop_timeout == 5.0
    assert _new_threads(before) == []
    report = thing.stop()
    assert report.terminated is True
    assert thing.stop() is report


def _threads_started_by_start(case: Case) -> list[str]:
    """The names of the threads a normal start() of ``case`` starts, in order."""
    names: list[str] = []

    def counting_start(thread: threading.Thread) -> None:
        names.append(thread.name)
        REAL_START(thread)

    thing = case.build()
    with mock.patch.object(threading.Thread, "start", counting_start):
        thing.start()
    thing.stop()
    return names


@pytest.mark.parametrize("last", [False, True], ids=["first-thread", "last-thread"])
def test_start_is_all_or_nothing_when_a_thread_cannot_start(case: Case, last: bool) -> None:
    """A thread that cannot start part-way: what started is stopped and the error propagates.

    A thing whose start() starts no thread (a pool's threads start on first use) passes
    trivially: nothing can fail part-way.
    """
    before = set(threading.enumerate())
    started = _threads_started_by_start(case)
    assert _new_threads(before) == []
    thing = case.build()
    if not started:
        thing.start()
        assert _new_threads(before) == []
        thing.stop()
        return
    with (
        thread_start_patched(len(started) if last else 1, cannot_start),
        pytest.raises(RuntimeError, match="can't start new thread"),
    ):
        thing.start()
    assert _new_threads(before) == []
    report = thing.stop()
    assert report.terminated is True
