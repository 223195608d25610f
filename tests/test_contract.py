"""One lifecycle contract, checked on every stoppable class in `patterns/` and the job queue.

The contract (``docs/design.md``): no constructor starts a thread; ``start() -> Self`` is all
or nothing and refuses a second call; ``stop(timeout=None)`` uses the object's
``stop_timeout``, is bounded, never raises for unfinished work and returns the same report
every time; a report starts with ``terminated: bool`` and ``still_running: tuple[str, ...]``;
``with`` starts and stops, and entering a started object returns it. The paths users take
are checked too: ``with x.start()`` and the program exits; a Ctrl-C during ``stop()``; a
``stop()`` from a signal handler (on a thread running a stop, or waiting for another
thread's), from another thread, from the object's own thread; any budget. A new
stoppable class joins `CASES` and is held to all of it.
"""

from __future__ import annotations

import dataclasses
import inspect
import linecache
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from unittest import mock

import pytest

from tests.support import (
    MUST_HAPPEN,
    NOISE,
    REAL_START,
    asleep_in_a_wait,
    cannot_start,
    run_in_thread,
    run_python,
    thread_start_patched,
    wait_until,
)


class Busy:
    """Work that ignores its stop: it runs until the test releases it.

    ``entered`` is set once it runs; ``inside``, if given, is called on the work's own
    thread once ``armed`` is set (a stop from the object's own thread); ``ended`` is set in
    its ``finally``, the test's own truth about whether the work still runs.
    """

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.armed = threading.Event()
        self.release = threading.Event()
        self.ended = threading.Event()
        self.inside: Callable[[], object] | None = None

    def run(self, *_: object) -> None:
        """The work: any arguments (an item, a stop event, a job's payload) are ignored."""
        self.entered.set()
        try:
            # armed: the test has set `inside` (or let the work go); read it only then
            if self.armed.wait(MUST_HAPPEN * 3) and self.inside is not None:
                self.inside()
            self.release.wait(MUST_HAPPEN * 3)
        finally:
            self.ended.set()

    def running(self) -> bool:
        """Whether the work has started and not yet ended."""
        return self.entered.is_set() and not self.ended.is_set()

    def finish(self) -> None:
        """Let the work end."""
        self.release.set()
        self.armed.set()


class _ChildWork(Busy):
    """A child process that ignores its stop request (not SIGTERM): `Busy` for a process."""

    def __init__(self) -> None:
        super().__init__()
        self.pid: int | None = None

    def running(self) -> bool:
        """Whether the child process is alive (a zombie is not)."""
        if self.pid is None:
            return False
        try:
            with open(f"/proc/{self.pid}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return False
        return state not in ("Z", "X")  # a zombie has ended; only its exit status is left

    def finish(self) -> None:
        """Let the work end: SIGTERM, which the child does not ignore."""
        if self.pid is not None and self.running():
            os.kill(self.pid, signal.SIGTERM)


@dataclass(frozen=True)
class Case:
    """How to build one stoppable thing, unstarted and idle; and started, with busy work."""

    name: str
    build: Callable[[float], Any]
    busy: Callable[[Busy, float], Any] | None = None
    own_thread: bool = True  # whether its work runs on a thread of this process
    busy_factory: Callable[[], Busy] = Busy

    def __str__(self) -> str:
        return self.name


def _background_service(stop_timeout: float) -> Any:
    from patterns.daemon_threads import BackgroundService  # noqa: PLC0415

    return BackgroundService(
        lambda stopping: stopping.wait(), name="contract-bg", stop_timeout=stop_timeout
    )


def _busy_background_service(busy: Busy, stop_timeout: float) -> Any:
    from patterns.daemon_threads import BackgroundService  # noqa: PLC0415

    return BackgroundService(busy.run, name="contract-bg", stop_timeout=stop_timeout).start()


def _housekeeping_daemon(stop_timeout: float) -> Any:
    from patterns.daemon_threads import HousekeepingDaemon  # noqa: PLC0415

    return HousekeepingDaemon(
        lambda stopping: stopping.wait(), name="contract-daemon", stop_timeout=stop_timeout
    )


def _busy_housekeeping_daemon(busy: Busy, stop_timeout: float) -> Any:
    from patterns.daemon_threads import HousekeepingDaemon  # noqa: PLC0415

    return HousekeepingDaemon(busy.run, name="contract-daemon", stop_timeout=stop_timeout).start()


def _supervisor(stop_timeout: float) -> Any:
    from patterns.supervisor import Supervisor  # noqa: PLC0415

    return Supervisor(
        lambda stopping: stopping.wait(), name="contract-sup", stop_timeout=stop_timeout
    )


def _busy_supervisor(busy: Busy, stop_timeout: float) -> Any:
    from patterns.supervisor import Supervisor  # noqa: PLC0415

    return Supervisor(busy.run, name="contract-sup", stop_timeout=stop_timeout).start()


def _consumer_pool(stop_timeout: float) -> Any:
    from patterns.closable_queue import ConsumerPool  # noqa: PLC0415

    return ConsumerPool(
        lambda item: None, consumers=2, name="contract-pool", stop_timeout=stop_timeout
    )


def _busy_consumer_pool(busy: Busy, stop_timeout: float) -> Any:
    from patterns.closable_queue import ConsumerPool  # noqa: PLC0415

    pool = ConsumerPool(busy.run, consumers=2, name="contract-pool", stop_timeout=stop_timeout)
    pool.start().put(1)
    return pool


def _bulkhead(stop_timeout: float) -> Any:
    from patterns.bulkhead import Bulkhead  # noqa: PLC0415

    return Bulkhead(
        max_concurrent=2, queue_size=2, name="contract-bulkhead", stop_timeout=stop_timeout
    )


def _busy_bulkhead(busy: Busy, stop_timeout: float) -> Any:
    bulkhead = _bulkhead(stop_timeout).start()
    bulkhead.submit(busy.run)
    return bulkhead


def _tracking_executor(stop_timeout: float) -> Any:
    from patterns.executor_shutdown import TrackingExecutor  # noqa: PLC0415

    return TrackingExecutor(
        max_workers=2, thread_name_prefix="contract-pool", stop_timeout=stop_timeout
    )


def _busy_tracking_executor(busy: Busy, stop_timeout: float) -> Any:
    executor = _tracking_executor(stop_timeout).start()
    executor.submit(busy.run)
    return executor


def _signal_handlers(stop_timeout: float) -> Any:
    from patterns.signal_handlers import SignalHandlers  # noqa: PLC0415

    return SignalHandlers(lambda: None, stop_timeout=stop_timeout)


def _busy_signal_handlers(busy: Busy, stop_timeout: float) -> Any:
    from patterns.signal_handlers import SignalHandlers  # noqa: PLC0415

    # on_stop is the work: it runs on the handlers' own thread once the signal arrives.
    handlers = SignalHandlers(busy.run, signals=(signal.SIGUSR2,), stop_timeout=stop_timeout)
    handlers.start()
    signal.raise_signal(signal.SIGUSR2)
    return handlers


def _worker(stop_timeout: float) -> Any:
    from patterns.jobqueue import MemoryStore, TaskRegistry, Worker  # noqa: PLC0415

    return Worker(MemoryStore(), TaskRegistry(), concurrency=2, name="contract-worker",
                  poll_interval=60.0, stop_timeout=stop_timeout)  # fmt: skip


def _busy_worker(busy: Busy, stop_timeout: float) -> Any:
    from patterns.jobqueue import MemoryStore, TaskRegistry, Worker  # noqa: PLC0415

    store, tasks = MemoryStore(), TaskRegistry()
    tasks.task(name="busy", max_attempts=1)(busy.run)
    tasks.enqueue(store, "busy")
    return Worker(store, tasks, concurrency=2, name="contract-worker",
                  poll_interval=0.05, stop_timeout=stop_timeout).start()  # fmt: skip


def _task_set(stop_timeout: float) -> Any:
    # asyncio's TaskSet has a coroutine stop(); this adapter runs its loop in a thread and
    # gives it the synchronous start()/stop() the contract checks are written against.
    # Its own async paths are checked in tests/test_asyncio_shutdown.py.
    from tests.support import LoopThreadTaskSet  # noqa: PLC0415

    return LoopThreadTaskSet(stop_timeout=stop_timeout)


def _async_consumer_pool(stop_timeout: float) -> Any:
    # The same adapter for asyncio's consumer pool; its own async paths (``async with`` on a
    # started pool, a stop from a consumer) are checked in tests/test_async_queue.py.
    from tests.support import LoopThreadConsumerPool  # noqa: PLC0415

    return LoopThreadConsumerPool(stop_timeout=stop_timeout, name="contract-apool")


def _task_group(stop_timeout: float) -> Any:
    # StoppableTaskGroup is entered by its owner task, not started; this adapter's start()
    # makes that owner (one child that waits to be cancelled) in a loop of its own. Its
    # own async paths are checked in tests/test_asyncio_shutdown.py.
    from tests.support import _LoopThreadAdapter  # noqa: PLC0415

    class LoopThreadTaskGroup(_LoopThreadAdapter):
        def _build(self, stop_timeout: float, name: str) -> Any:
            from patterns.asyncio_shutdown import StoppableTaskGroup  # noqa: PLC0415

            return StoppableTaskGroup(stop_timeout=stop_timeout, name=name)

        async def _begin(self) -> None:
            import asyncio  # noqa: PLC0415

            entered = asyncio.Event()

            async def owner() -> None:
                async with self.inner as group:
                    group.create_task(asyncio.Event().wait(), name=f"{self.name}-waiter")
                    entered.set()

            self.owner = asyncio.get_running_loop().create_task(owner())
            await asyncio.wait_for(entered.wait(), MUST_HAPPEN)

        def _never_started(self) -> Any:
            import asyncio  # noqa: PLC0415

            return asyncio.run(self.inner.stop())

    return LoopThreadTaskGroup(stop_timeout=stop_timeout, name="contract-group")


def _async_graceful_server(stop_timeout: float) -> Any:
    # The same adapter for the asyncio server; its own async paths (a stop from a handler,
    # the drain and the forced phase) are checked in tests/test_server_shutdown_asyncio.py.
    from tests.support import LoopThreadAsyncServer  # noqa: PLC0415

    return LoopThreadAsyncServer(stop_timeout=stop_timeout, name="contract-aserver")


def _stoppable_process(stop_timeout: float) -> Any:
    from patterns.stoppable_process import StoppableProcess  # noqa: PLC0415
    from patterns.teaching.process_tasks import wait_for_stop  # noqa: PLC0415

    return StoppableProcess(wait_for_stop, name="contract-process", stop_timeout=stop_timeout)


def _busy_stoppable_process(busy: Busy, stop_timeout: float) -> Any:
    import multiprocessing  # noqa: PLC0415

    from patterns.stoppable_process import StoppableProcess  # noqa: PLC0415
    from patterns.teaching.process_tasks import stubborn  # noqa: PLC0415

    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    process = StoppableProcess(
        stubborn, (ready, False), name="contract-process", stop_timeout=stop_timeout,
        context=context,
    )  # fmt: skip
    assert isinstance(busy, _ChildWork)
    busy.pid = process.start().pid
    if ready.wait(MUST_HAPPEN):  # the child ignores its stop request from here on
        busy.entered.set()
    return process


def _graceful_server(stop_timeout: float) -> Any:
    import http.server  # noqa: PLC0415

    from patterns.server_shutdown import GracefulServer  # noqa: PLC0415

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    try:
        return GracefulServer(httpd, name="contract-server", stop_timeout=stop_timeout)
    except BaseException:
        httpd.server_close()  # a refused option must not leave the socket open
        raise


def _busy_graceful_server(busy: Busy, stop_timeout: float) -> Any:
    import http.client  # noqa: PLC0415
    import http.server  # noqa: PLC0415

    from patterns.server_shutdown import GracefulServer  # noqa: PLC0415

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the work is a request in flight
            busy.run()

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server = GracefulServer(httpd, name="contract-server", stop_timeout=stop_timeout).start()

    def request() -> None:
        conn = http.client.HTTPConnection(*server.address, timeout=MUST_HAPPEN * 3)
        try:
            conn.request("GET", "/busy")
            conn.getresponse().read()
        except (http.client.HTTPException, OSError):
            pass  # the stop closed the connection by force
        finally:
            conn.close()

    run_in_thread(request, "contract-client")
    return server


CASES = [
    Case("TrackingExecutor", _tracking_executor, _busy_tracking_executor),
    Case("ConsumerPool", _consumer_pool, _busy_consumer_pool),
    Case("BackgroundService", _background_service, _busy_background_service),
    Case("HousekeepingDaemon", _housekeeping_daemon, _busy_housekeeping_daemon),
    Case("Supervisor", _supervisor, _busy_supervisor),
    Case("SignalHandlers", _signal_handlers, _busy_signal_handlers),
    Case("Bulkhead", _bulkhead, _busy_bulkhead),
    Case("Worker", _worker, _busy_worker),
    Case("GracefulServer", _graceful_server, _busy_graceful_server),
    Case("TaskSet", _task_set),
    Case("AsyncConsumerPool", _async_consumer_pool),
    Case("StoppableTaskGroup", _task_group),
    Case("AsyncGracefulServer", _async_graceful_server),
    Case(
        "StoppableProcess",
        _stoppable_process,
        _busy_stoppable_process,
        own_thread=False,
        busy_factory=_ChildWork,
    ),
]
BUSY_CASES = [case for case in CASES if case.busy is not None]

each_case = pytest.mark.parametrize("case", CASES, ids=str)
each_busy_case = pytest.mark.parametrize("case", BUSY_CASES, ids=str)


@contextmanager
def busy_thing(case: Case, stop_timeout: float = 5.0) -> Iterator[tuple[Any, Busy]]:
    """``case``'s object, started, with its work running and ignoring the stop.

    On the way out the work is let go and the object stopped, so nothing outlives the test.
    """
    assert case.busy is not None
    busy = case.busy_factory()
    thing = case.busy(busy, stop_timeout)
    try:
        assert busy.entered.wait(MUST_HAPPEN), f"{case}: the work never started"
        yield thing, busy
    finally:
        busy.armed.set()
        busy.finish()
        thing.stop(MUST_HAPPEN)
        wait_until(lambda: not busy.running(), f"{case}: the work ended")


def _new_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t not in before and t.is_alive()]


def _core(report: Any) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(report))[:2]


@each_case
def test_building_one_starts_no_thread(case: Case) -> None:
    """A constructor only stores and checks its options; threads start in start()."""
    before = set(threading.enumerate())
    thing = case.build(5.0)
    try:
        assert _new_threads(before) == []
    finally:
        thing.stop()


@each_case
def test_start_returns_the_object_and_a_second_start_is_refused(case: Case) -> None:
    """start() returns self, so ``x = Thing(...).start()`` reads; starting twice is an error."""
    thing = case.build(5.0)
    try:
        assert thing.start() is thing
        with pytest.raises(RuntimeError):
            thing.start()
    finally:
        thing.stop()


@each_case
def test_stop_takes_an_optional_budget_that_defaults_to_stop_timeout(case: Case) -> None:
    """``stop(timeout=None)``: None means the object's own ``stop_timeout``, never forever."""
    thing = case.build(5.0)
    try:
        assert inspect.signature(thing.stop).parameters["timeout"].default is None
        assert thing.stop_timeout == 5.0
        with pytest.raises(ValueError, match="timeout"):
            thing.stop(-1.0)
    finally:
        thing.stop()


@each_case
def test_stop_is_bounded_idempotent_and_reports_the_core_fields_first(case: Case) -> None:
    """A second stop() returns the first report; every report opens with the same two fields."""
    before = set(threading.enumerate())
    thing = case.build(5.0).start()
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


@each_case
def test_stop_before_start_reports_terminated_and_start_is_then_refused(case: Case) -> None:
    """Stopping a thing that never started is a report, not an error; it cannot start later."""
    thing = case.build(5.0)
    report = thing.stop()
    assert (report.terminated, report.still_running) == (True, ())
    with pytest.raises(RuntimeError):
        thing.start()


@each_case
def test_the_with_block_starts_and_stops_with_the_default_budget(case: Case) -> None:
    """``with`` gives the started object and leaves nothing running; the report stays final."""
    before = set(threading.enumerate())
    with case.build(5.0) as thing:
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

    thing = case.build(5.0)
    with mock.patch.object(threading.Thread, "start", counting_start):
        thing.start()
    thing.stop()
    return names


@each_case
@pytest.mark.parametrize("last", [False, True], ids=["first-thread", "last-thread"])
def test_start_is_all_or_nothing_when_a_thread_cannot_start(case: Case, last: bool) -> None:
    """A thread that cannot start part-way: what started is stopped and the error propagates.

    A thing whose start() starts no thread (a pool's threads start on first use) passes
    trivially: nothing can fail part-way.
    """
    before = set(threading.enumerate())
    started = _threads_started_by_start(case)
    assert _new_threads(before) == []
    thing = case.build(5.0)
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


# --- the idioms users write: `with x.start()`, and the program exits ------------------------


@each_case
def test_entering_a_started_object_returns_it_and_the_block_stops_it(case: Case) -> None:
    """``with x.start():`` works like ``with open(...)``: the running object is returned."""
    before = set(threading.enumerate())
    thing = case.build(5.0).start()
    try:
        with thing as entered:
            assert entered is thing
        assert _new_threads(before) == []
    finally:
        thing.stop()  # when __enter__ refused, what start() started must not outlive the test
    report = thing.stop()
    assert (report.terminated, report.still_running) == (True, ())


@each_case
def test_entering_a_stopped_object_is_refused(case: Case) -> None:
    """A stopped object cannot run again, not even through ``with``."""
    thing = case.build(5.0)
    thing.stop()
    with pytest.raises(RuntimeError), thing:
        pass


_EXIT_CHILD = """
import sys
from tests.test_contract import CASES
case = next(c for c in CASES if c.name == sys.argv[1])
how = sys.argv[2]
if how == "with-start":
    with case.build(5.0).start() as thing:
        pass
elif how == "with":
    with case.build(5.0) as thing:
        pass
else:
    with case.build(5.0).start() as thing:
        raise SystemExit(3)
sys.stdout.write("left the block\\n")
"""


@each_case
@pytest.mark.parametrize("how", ["with-start", "with", "system-exit"])
def test_the_program_exits_after_the_with_block(case: Case, how: str) -> None:
    """A child process that uses the object in a ``with`` block exits on its own, promptly.

    A thread or child process left running by a refused ``__enter__`` would keep the
    interpreter alive for ever (a non-daemon thread) or until the deadline here.
    """
    done = run_python(_EXIT_CHILD, case.name, how, timeout=30)
    if how == "system-exit":
        assert done.returncode == 3, done.stderr
    else:
        assert done.returncode == 0, done.stderr
        assert done.stdout == "left the block\n"


# --- Ctrl-C during stop(): the next report is still the truth --------------------------------

_BLOCKING = {"wait", "join", "_wait_for_tstate_lock", "acquire", "poll", "select", "result",
             "_poll", "sleep"}  # fmt: skip


# A wait inside stop() that is not the wait for the work. SignalHandlers' _restore waits a
# few milliseconds for its dispatcher thread while it puts the handlers back; a Ctrl-C there
# is held until stop() has finished, waited out its budget and recorded its report (as its
# docs say), so it is not the interrupted wait these tests are about, and a second stop()
# would return that report at once instead of waiting to be interrupted.
_NOT_THE_WORK = {"_restore"}


def _blocked_in_stop(thread: threading.Thread) -> bool:
    """Whether ``thread`` is inside a ``stop`` and, innermost, waiting for the work."""
    frame = sys._current_frames().get(thread.ident or -1)
    innermost = frame
    while frame is not None:
        if frame.f_code.co_name in _NOT_THE_WORK:
            return False
        if frame.f_code.co_name in ("stop", "_stop_once", "naive_stop_by_join"):
            return innermost is not None and innermost.f_code.co_name in _BLOCKING
        frame = frame.f_back
    return False


def _waits_in_stop(thread: threading.Thread) -> bool:
    """Whether ``thread`` is inside a ``stop``, blocked in a wait of any kind.

    Besides `_blocked_in_stop`'s waits, a stop that waits for another thread's stop may
    block in a C ``lock.acquire(timeout=...)`` called straight from its own frame (or from
    a small ``_acquire`` loop), which leaves no Python frame of its own: then the
    innermost frame's current line is that call.
    """
    if _blocked_in_stop(thread):
        return True
    frame = sys._current_frames().get(thread.ident or -1)
    innermost = frame
    while frame is not None:
        if frame.f_code.co_name in ("stop", "_stop"):
            assert innermost is not None
            line = linecache.getline(innermost.f_code.co_filename, innermost.f_lineno)
            return ".acquire(" in line
        frame = frame.f_back
    return False


def _signal_main_when_blocked_in_stop(
    signum: int, blocked: Callable[[threading.Thread], bool] = _blocked_in_stop
) -> threading.Thread:
    """A thread that sends ``signum`` to the main thread once ``blocked(main)`` holds.

    By default that is once stop() waits for the work. The main thread must also be asleep
    in that wait (`asleep_in_a_wait`), not merely have the wait's frame innermost: a signal
    that lands while it is on its way into the C wait is handled only when the wait times
    out, and the stop it was meant to interrupt has then run out its budget.
    """
    main = threading.main_thread()

    def waits() -> bool:
        return blocked(main) and asleep_in_a_wait(main)

    def send() -> None:
        wait_until(waits, "the main thread waits inside stop()")
        assert main.ident is not None
        signal.pthread_kill(main.ident, signum)

    sender = threading.Thread(target=send, name="contract-ctrl-c")
    sender.start()
    return sender


def test_the_signal_senders_wait_until_the_stop_sleeps_in_its_wait() -> None:
    """The senders' checkpoint: a wait's frame innermost inside stop() is not enough.

    A thread on its way into a C wait has released the GIL but is not asleep yet; a signal
    that lands then is handled when the wait returns. Here a frame named ``wait`` inside
    ``stop`` spins instead of sleeping: `_blocked_in_stop` takes it for the wait every
    time, `asleep_in_a_wait` never does (though it sleeps now and then for the GIL that
    the looking thread holds). Once it sleeps in a real wait, both hold.
    """
    spin: list[bool] = [True]
    spinning, done = threading.Event(), threading.Event()

    def wait() -> None:  # named as a wait is, and runs instead of sleeping
        spinning.set()
        while spin:  # plain bytecode: no other frame is ever innermost
            pass
        done.wait(MUST_HAPPEN)  # a real wait: asleep in the kernel

    def stop() -> None:
        wait()

    thread, _ = run_in_thread(stop, "contract-into-a-wait")
    try:
        assert spinning.wait(MUST_HAPPEN)
        looks = [(_blocked_in_stop(thread), asleep_in_a_wait(thread)) for _ in range(100)]
        assert looks == [(True, False)] * 100
        spin.clear()
        wait_until(lambda: _blocked_in_stop(thread) and asleep_in_a_wait(thread), "asleep")
    finally:
        spin.clear()
        done.set()
        thread.join(MUST_HAPPEN)
    assert not thread.is_alive()


P25 = ("P25", "a Ctrl-C inside Thread.join() marks a live thread finished: the next report lies")


@pytest.mark.race(*P25)
@pytest.mark.usefixtures("default_sigint")
def test_naive_a_report_read_from_join_lies_after_a_ctrl_c(
    record_property: Callable[[str, object], None],
) -> None:
    """Before 3.13 the interrupted ``join()`` marks the live thread finished (gh-90882).

    The naive stop's next report then says terminated with nothing still running while
    the thread runs on; 3.13.0 fixed ``join()``, and the same code tells the truth there.
    """
    from patterns.naive.daemon_threads import naive_stop_by_join  # noqa: PLC0415

    stopping, release, ended = threading.Event(), threading.Event(), threading.Event()

    def stubborn(_: object) -> None:
        try:
            release.wait(MUST_HAPPEN * 3)  # ignores `stopping`
        finally:
            ended.set()

    thread = threading.Thread(target=stubborn, args=(stopping,), name="naive-stubborn")
    thread.start()
    try:
        sender = _signal_main_when_blocked_in_stop(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            naive_stop_by_join(thread, stopping, 5.0)
        sender.join(MUST_HAPPEN)
        terminated, still_running = naive_stop_by_join(thread, stopping, 0.0)
        record_property(
            "observed",
            f"on {sys.version_info.major}.{sys.version_info.minor}, after a Ctrl-C in join(), the"
            f" next report said terminated={terminated}, still_running={still_running}"
            f" while the thread ran",
        )
        assert not ended.is_set()  # the thread really is still running
        if sys.version_info < (3, 13):
            assert (terminated, still_running) == (True, ())  # the lie
        else:
            assert (terminated, still_running) == (False, ("naive-stubborn",))
    finally:
        release.set()
        assert ended.wait(MUST_HAPPEN)


@pytest.mark.race(*P25)
@pytest.mark.usefixtures("default_sigint")
@each_busy_case
@pytest.mark.parametrize("interrupts", [1, 2])
def test_ctrl_c_during_stop_leaves_the_next_report_truthful(case: Case, interrupts: int) -> None:
    """A real SIGINT while stop() waits, once or twice: the next stop(0) does not lie.

    Before 3.13 an interrupted ``Thread.join()`` marks a live thread finished (gh-90882);
    a report built on ``is_alive()`` then says terminated while the work still runs.
    """
    with busy_thing(case) as (thing, busy):
        for _ in range(interrupts):
            sender = _signal_main_when_blocked_in_stop(signal.SIGINT)
            with pytest.raises(KeyboardInterrupt):
                thing.stop(5.0)
            sender.join(MUST_HAPPEN)
        report = thing.stop(0.0)
        if busy.running():
            assert report.terminated is False
            assert report.still_running != ()
        if report.terminated:
            assert not busy.running()


@pytest.mark.usefixtures("default_sigint")
@each_busy_case
def test_after_ctrl_c_a_stop_that_sees_the_work_end_says_terminated(case: Case) -> None:
    """The other half of the truth: once the work has ended, the next stop says so."""
    with busy_thing(case) as (thing, busy):
        sender = _signal_main_when_blocked_in_stop(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            thing.stop(5.0)
        sender.join(MUST_HAPPEN)
        busy.finish()
        wait_until(lambda: not busy.running(), "the work ended")
        report = thing.stop(5.0)
        assert (report.terminated, report.still_running) == (True, ())


# --- re-entrant and concurrent stops --------------------------------------------------------


@each_busy_case
def test_stop_from_a_signal_handler_during_stop_returns_at_once(case: Case) -> None:
    """A handler that calls stop() while the main thread is inside stop() must not deadlock.

    It gets a provisional report at once (the work still runs); the outer stop() goes on
    and records the final report.
    """
    inner: dict[str, Any] = {}

    def handler(signum: int, frame: object) -> None:
        began = time.monotonic()
        inner["report"] = thing.stop(5.0)
        inner["took"] = time.monotonic() - began

    before = signal.signal(signal.SIGUSR1, handler)
    try:
        with busy_thing(case) as (thing, busy):
            sender = _signal_main_when_blocked_in_stop(signal.SIGUSR1)

            def release_after_handler() -> None:
                sender.join(MUST_HAPPEN)
                wait_until(lambda: "took" in inner, "the handler's stop() returned")
                busy.finish()

            releaser, _ = run_in_thread(release_after_handler, "contract-releaser")
            outer = thing.stop(MUST_HAPPEN)
            releaser.join(MUST_HAPPEN)
    finally:
        signal.signal(signal.SIGUSR1, before)
    assert inner["took"] < 1.0
    assert inner["report"].terminated is False
    assert outer.terminated is True
    assert thing.stop() is outer


@each_case
def test_stop_from_a_signal_handler_while_waiting_for_another_threads_stop_returns_at_once(
    case: Case,
) -> None:
    """A handler's stop() on a thread that waits for another thread's stop() must not wait.

    Thread A runs stop(10), held by work that ignores it; the main thread's stop(1) waits
    for A's; a signal handler then calls stop(10) on top of that wait. The handler gets a
    provisional report at once, and the main thread's stop() still keeps its own budget of
    1 s: it must not sit under a handler that waits out a budget of its own.
    """
    if case.busy is None:
        pytest.skip(
            f"{case}.stop() is a coroutine: a stop that waits for another is a suspended"
            " task, and a signal handler cannot await a stop on top of it"
        )
    inner: dict[str, Any] = {}

    def handler(signum: int, frame: object) -> None:
        began = time.monotonic()
        inner["report"] = thing.stop(10.0)
        inner["took"] = time.monotonic() - began
        inner["outer_pending"] = "outer" not in waited  # it landed inside the main's stop()

    waited: dict[str, Any] = {}
    before = signal.signal(signal.SIGUSR1, handler)
    try:
        with busy_thing(case) as (thing, busy):
            first_thread, first = run_in_thread(lambda: thing.stop(10.0), "contract-first")
            if case.name == "SignalHandlers":  # its stop() belongs to the main thread
                first_thread.join(MUST_HAPPEN)
                pytest.skip("SignalHandlers.stop() runs on the main thread only")
            wait_until(lambda: _blocked_in_stop(first_thread), "thread A's stop() waits")
            sender = _signal_main_when_blocked_in_stop(signal.SIGUSR1, _waits_in_stop)
            began = time.monotonic()
            waited["outer"] = thing.stop(1.0)
            waited["took"] = time.monotonic() - began
            sender.join(MUST_HAPPEN)
            assert not sender.is_alive()
            waited["first_pending"] = first_thread.is_alive()
            busy.finish()
            first_thread.join(MUST_HAPPEN)
            assert not first_thread.is_alive()
    finally:
        signal.signal(signal.SIGUSR1, before)
    assert inner.get("outer_pending") is True, "the handler ran inside the main's stop()"
    timings = (
        f"the handler's stop(10) took {inner['took']:.2f} s,"
        f" the main thread's stop(1) {waited['took']:.2f} s"
    )
    assert inner["took"] < 1.0, timings
    assert waited["took"] < 1.0 + NOISE, timings
    assert waited["first_pending"] is True, "thread A's stop() was held by the work throughout"
    assert inner["report"].terminated is False
    assert waited["outer"].terminated is False
    final = first["result"]
    assert (final.terminated, final.still_running) == (True, ())
    assert inner["report"] is not final
    assert thing.stop() is final


@each_busy_case
def test_a_second_stop_from_another_thread_keeps_its_own_budget(case: Case) -> None:
    """stop(0.2) while another stop(5) runs returns within 0.2 s (+ noise), provisional."""
    with busy_thing(case) as (thing, busy):
        outer_thread, outer = run_in_thread(lambda: thing.stop(MUST_HAPPEN), "contract-outer")
        if case.name == "SignalHandlers":  # its stop() belongs to the main thread
            outer_thread.join()
            pytest.skip("SignalHandlers.stop() runs on the main thread only")
        wait_until(lambda: _blocked_in_stop(outer_thread), "the first stop() waits")
        began = time.monotonic()
        second = thing.stop(0.2)
        took = time.monotonic() - began
        busy.finish()
        outer_thread.join(MUST_HAPPEN)
    assert took < 0.2 + NOISE
    assert second.terminated is False
    assert outer["result"].terminated is True
    assert thing.stop() is outer["result"]


@each_busy_case
def test_stop_from_the_objects_own_thread_is_a_request(case: Case) -> None:
    """stop() from the work's own thread (a handler, a callback) starts the stop, returns.

    It cannot wait for itself: it returns a provisional report at once that is not
    recorded; the stop completes without it and a later stop() gets the final report.
    """
    if not case.own_thread:
        pytest.skip(f"{case}'s work runs in another process")
    inner: dict[str, Any] = {}
    with busy_thing(case) as (thing, busy):

        def stop_from_inside() -> None:
            began = time.monotonic()
            inner["report"] = thing.stop(0.5)
            inner["took"] = time.monotonic() - began

        busy.inside = stop_from_inside
        busy.armed.set()
        wait_until(lambda: "took" in inner, "the stop() from the work's own thread returned")
        busy.finish()
        wait_until(lambda: not busy.running(), "the work ended")
        final = thing.stop(MUST_HAPPEN)
    assert inner["took"] < 0.5 + NOISE
    assert inner["report"].terminated is False
    assert inner["report"] is not final
    assert (final.terminated, final.still_running) == (True, ())
    assert thing.stop() is final


# --- the report cannot lie about itself -----------------------------------------------------


@each_case
def test_a_report_refuses_terminated_with_something_still_running(case: Case) -> None:
    """``terminated=True`` with a non-empty ``still_running`` is a contradiction: refused."""
    report = case.build(5.0).stop()
    with pytest.raises(ValueError, match="still_running"):
        dataclasses.replace(report, terminated=True, still_running=("someone",))


# --- budgets: inf, huge, nan, negative ------------------------------------------------------


@each_case
@pytest.mark.parametrize("budget", [math.inf, 1e10], ids=["inf", "1e10"])
def test_an_endless_budget_means_as_long_as_it_takes(case: Case, budget: float) -> None:
    """``inf`` and absurd budgets work (waits are capped inside); never an OverflowError."""
    before = set(threading.enumerate())
    thing = case.build(budget).start()
    report = thing.stop()
    assert (report.terminated, report.still_running) == (True, ())
    other = case.build(5.0).start()
    assert other.stop(budget).terminated is True
    assert _new_threads(before) == []


@each_case
@pytest.mark.parametrize("bad", [math.nan, -1.0, True, "1"], ids=["nan", "neg", "bool", "str"])
def test_a_budget_that_is_not_a_number_of_seconds_is_refused_by_name(case: Case, bad: Any) -> None:
    """nan, negative, bool and str budgets are a ValueError that names the argument."""
    with pytest.raises(ValueError, match="stop_timeout"):
        case.build(bad)
    thing = case.build(5.0)
    with pytest.raises(ValueError, match="timeout"):
        thing.stop(bad)
    assert thing.stop().terminated is True
