"""One rule for every argument that is a number of seconds, checked at every entry point.

The rule (``docs/design.md``, lifecycle contract): ``nan``, a negative number, a ``bool`` and
a string are a `ValueError` that names the argument; ``inf`` and absurdly large numbers
(``1e10``, ``1e300``) either work and mean "as long as it takes" (every wait inside is
capped at `threading.TIMEOUT_MAX`) or are a `ValueError` that names the argument; never an
`OverflowError`, never a thread that dies of one. Each entry below calls one function or
class with the value in the argument it names, in a scenario that ends on its own: the
waits that could block are released by the test once it has seen them block.

Not here: ``ClosableQueue.put/get``. On 3.13 it *is* `queue.Queue`, and before 3.13 its
back-port answers exactly as the standard library does (an `OverflowError` for ``inf``), so
code written against it behaves the same once the back-port is deleted.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import queue
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support import MUST_HAPPEN, recording_hook, run_python, wait_until
from tests.test_contract import CASES

_BLOCKING = {"wait", "join", "_wait_for_tstate_lock", "acquire", "poll", "select", "get",
             "sleep", "wait_for", "put", "_poll", "result"}  # fmt: skip


@contextmanager
def released_when_blocked(release: Callable[[], object]) -> Iterator[None]:
    """Call ``release()`` from a helper once the calling thread is seen waiting.

    Whatever the block does is thus woken by the test, deterministically; if the call
    returns without ever waiting, ``release`` runs when the block ends instead.
    """
    me = threading.get_ident()
    done = threading.Event()

    def blocked() -> bool:
        frame = sys._current_frames().get(me)
        return done.is_set() or (frame is not None and frame.f_code.co_name in _BLOCKING)

    def watch() -> None:
        wait_until(blocked, "the call waits or returns")
        release()

    watcher = threading.Thread(target=watch, name="seconds-releaser")
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join(MUST_HAPPEN)


@dataclass(frozen=True)
class Entry:
    """One argument of one entry point; ``call(value)`` runs a scenario that ends."""

    name: str
    arg: str
    call: Callable[[Any], object]

    def __str__(self) -> str:
        return f"{self.name}-{self.arg}"


def _expect(outcome: bool, value: Any) -> None:
    """``outcome`` must hold, unless the budget was zero: then "not yet" is the truth too."""
    if value != 0:
        assert outcome


# --- every stoppable class of the contract test: stop_timeout, and stop(timeout) ------------


def _built_with(case: Any) -> Callable[[Any], object]:
    return lambda value: case.build(value).start().stop()


def _stopped_with(case: Any) -> Callable[[Any], object]:
    def call(value: Any) -> object:
        thing = case.build(5.0).start()
        try:
            return thing.stop(value)
        finally:
            thing.stop()  # a refused budget must not leave the object running

    return call


def _stoppables() -> list[Entry]:
    entries = []
    for case in CASES:
        entries.append(Entry(case.name, "stop_timeout", _built_with(case)))
        entries.append(Entry(f"{case.name}.stop", "timeout", _stopped_with(case)))
    return entries


# --- daemon_threads and supervisor ----------------------------------------------------------


def _every(value: Any) -> None:
    from patterns.daemon_threads import BackgroundService, every  # noqa: PLC0415

    ticked = threading.Event()
    service = BackgroundService(every(value, ticked.set), name="seconds-every", stop_timeout=5.0)
    service.start()
    try:
        assert ticked.wait(MUST_HAPPEN)
    finally:
        assert service.stop().terminated


def _run_with_service(value: Any) -> None:
    from patterns.daemon_threads import run_with_service  # noqa: PLC0415

    assert (
        run_with_service(lambda: 7, lambda s: s.wait(), name="seconds-rws", stop_timeout=value) == 7
    )


def _supervisor(**options: Any) -> Callable[[Any], None]:
    def call(value: Any) -> None:
        from patterns.supervisor import Supervisor  # noqa: PLC0415

        (arg,) = options
        sup = Supervisor(lambda s: s.wait(), name="seconds-sup", stop_timeout=5.0, **{arg: value})
        assert sup.start().stop().terminated

    return call


def _wait_unhealthy(value: Any) -> None:
    from patterns.supervisor import Supervisor  # noqa: PLC0415

    def die(stopping: threading.Event) -> None:
        raise RuntimeError("seconds-test: dies at once")

    sup = Supervisor(die, name="seconds-dying", max_restarts=0, interval=0.0, stop_timeout=5.0)
    with recording_hook():
        sup.start()
        try:
            _expect(sup.wait_unhealthy(value) is True, value)
        finally:
            sup.stop()


# --- queues ---------------------------------------------------------------------------------


def _pool_put(value: Any) -> None:
    from patterns.closable_queue import ConsumerPool  # noqa: PLC0415

    with ConsumerPool(lambda item: None, consumers=1, name="seconds-pool") as pool:
        pool.put(1, timeout=value)


def _put_pill(**options: Any) -> Callable[[Any], None]:
    def call(value: Any) -> None:
        from patterns.poison_pill import put_pill  # noqa: PLC0415

        (arg,) = options
        q: queue.Queue[Any] = queue.Queue(maxsize=1)
        q.put(0)
        kwargs = {"timeout": None, "poll": 0.01, arg: value}
        with released_when_blocked(q.get):
            assert put_pill(q, threading.Event(), **kwargs) is True

    return call


def _join_with_timeout(value: Any) -> None:
    from patterns.poison_pill import join_with_timeout  # noqa: PLC0415

    q: queue.Queue[Any] = queue.Queue()
    q.put(1)
    q.get()
    with released_when_blocked(q.task_done):
        _expect(join_with_timeout(q, value) is True, value)


def _producer_group(value: Any) -> None:
    from patterns.poison_pill import ProducerGroup  # noqa: PLC0415

    q: queue.Queue[Any] = queue.Queue()
    group = ProducerGroup(q, producers=1, consumers=1, stop=threading.Event(), timeout=value)
    group.done()
    assert q.qsize() == 1


def _async_pool(**options: Any) -> Callable[[Any], None]:
    def call(value: Any) -> None:
        from patterns.async_queue import AsyncConsumerPool  # noqa: PLC0415

        async def handle(item: object) -> None:
            return None

        async def main() -> Any:
            if "stop_timeout" in options:
                pool = AsyncConsumerPool(handle, stop_timeout=value)
                return await pool.start().stop()
            return await AsyncConsumerPool(handle).start().stop(value)

        _expect(asyncio.run(main()).terminated, value)

    return call


# --- bulkhead, executors, cancellation ------------------------------------------------------


def _bulkhead_call(value: Any) -> None:
    from patterns.bulkhead import Bulkhead, BulkheadTimeout  # noqa: PLC0415

    with Bulkhead(max_concurrent=1, queue_size=1, name="seconds-bulkhead") as bulkhead:
        try:
            result = bulkhead.call(lambda: 5, timeout=value)
        except BulkheadTimeout:
            result = None  # no result within 0 s: the truth for a zero budget
        _expect(result == 5, value)


def _job_token_wait(value: Any) -> None:
    from patterns.bulkhead import Bulkhead, current_token  # noqa: PLC0415

    tokens: queue.Queue[Any] = queue.Queue()

    def job() -> bool:
        token = current_token()
        tokens.put(token)
        return token.wait(value)

    bulkhead = Bulkhead(max_concurrent=1, queue_size=1, name="seconds-token").start()
    future = bulkhead.submit(job)
    tokens.get(timeout=MUST_HAPPEN)
    report = bulkhead.stop(5.0, cancel_running=True)  # cancels the token the job waits on
    _expect(future.result(MUST_HAPPEN) is True, value)
    assert report.terminated


def _cancel_token(value: Any) -> None:
    from patterns.cancellation import CancelToken  # noqa: PLC0415

    token = CancelToken(timeout=value)
    with released_when_blocked(token.cancel):
        assert token.wait() is True


def _cancel_child(value: Any) -> None:
    from patterns.cancellation import CancelToken  # noqa: PLC0415

    parent = CancelToken()
    child = parent.child(timeout=value)
    with released_when_blocked(parent.cancel):
        assert child.wait() is True


def _cancel_wait(value: Any) -> None:
    from patterns.cancellation import CancelToken  # noqa: PLC0415

    token = CancelToken()
    with released_when_blocked(token.cancel):
        _expect(token.wait(value) is True, value)


def _cancel_sleep(value: Any) -> None:
    from patterns.cancellation import Cancelled, CancelToken  # noqa: PLC0415

    token = CancelToken()
    with released_when_blocked(token.cancel), pytest.raises(Cancelled):
        token.sleep(value)


def _take(value: Any) -> None:
    from patterns.cancellation import CancelToken, take  # noqa: PLC0415

    q: queue.Queue[int] = queue.Queue()
    q.put(3)
    assert take(q, CancelToken(), poll_interval=value) == 3


def _await_termination(value: Any) -> None:
    from patterns.executor_shutdown import TrackingExecutor, await_termination  # noqa: PLC0415

    gate = threading.Event()
    pool = TrackingExecutor(max_workers=1).start()
    pool.submit(gate.wait, MUST_HAPPEN)
    pool.shutdown(wait=False)
    with released_when_blocked(gate.set):
        _expect(await_termination(pool, value) is True, value)


def _shutdown_and_await(**options: Any) -> Callable[[Any], None]:
    def call(value: Any) -> None:
        from patterns.executor_shutdown import TrackingExecutor, shutdown_and_await  # noqa: PLC0415

        (arg,) = options
        gate = threading.Event()
        pool = TrackingExecutor(max_workers=1).start()
        pool.submit(gate.wait, MUST_HAPPEN)
        kwargs = {"timeout": 5.0, "force_timeout": 1.0, arg: value}
        with released_when_blocked(gate.set):
            _expect(shutdown_and_await(pool, **kwargs).terminated, value)

    return call


def _run_all(**options: Any) -> Callable[[Any], None]:
    def call(value: Any) -> None:
        from patterns.executor_shutdown import run_all  # noqa: PLC0415

        (arg,) = options
        kwargs = {"timeout": 5.0, "force_timeout": 1.0, arg: value}
        _expect(run_all([lambda: None], **kwargs).terminated, value)

    return call


# --- signals, exits and processes -----------------------------------------------------------


def _install_signal_handlers(value: Any) -> None:
    from patterns.signal_handlers import install_signal_handlers  # noqa: PLC0415

    handlers = install_signal_handlers(lambda: None, stop_timeout=value)
    _expect(handlers.stop().terminated, value)


def _sync_run_until_signalled(value: Any) -> None:
    from patterns.signal_handlers import run_until_signalled  # noqa: PLC0415

    _expect(run_until_signalled(lambda stop: None, drain_timeout=value) is True, value)


_FORCE_EXIT = """
import sys
from math import inf, nan
from patterns.exit_hooks import force_exit
value = eval(sys.argv[1], {"inf": inf, "nan": nan})
try:
    force_exit(4, "seconds test", flush_timeout=value)
except ValueError as exc:
    sys.stderr.write(f"ValueError: {exc}\\n")
    sys.exit(5)
"""


def _force_exit(value: Any) -> None:
    done = run_python(_FORCE_EXIT, repr(value), timeout=30)
    if done.returncode == 5:
        raise ValueError(done.stderr)
    assert done.returncode == 4, done.stderr


def _process_pool(**options: Any) -> Callable[[Any], None]:
    def call(value: Any) -> None:
        import multiprocessing  # noqa: PLC0415

        from patterns.process_shutdown import shutdown_process_pool  # noqa: PLC0415

        (arg,) = options
        pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        assert pool.submit(abs, -2).result(MUST_HAPPEN * 3) == 2
        kwargs = {"timeout": 5.0, "force_timeout": 1.0, arg: value}
        try:
            _expect(shutdown_process_pool(pool, **kwargs).terminated, value)
        except ValueError:
            shutdown_process_pool(pool, 5.0, force_timeout=1.0)
            raise

    return call


def _mp_pool(**options: Any) -> Callable[[Any], None]:
    def call(value: Any) -> None:
        import multiprocessing  # noqa: PLC0415

        from patterns.process_shutdown import shutdown_mp_pool  # noqa: PLC0415

        (arg,) = options
        pool = multiprocessing.get_context("spawn").Pool(1)
        assert pool.apply_async(abs, (-2,)).get(MUST_HAPPEN * 3) == 2
        kwargs = {"timeout": 5.0, "force_timeout": 1.0, arg: value}
        try:
            _expect(shutdown_mp_pool(pool, **kwargs).terminated, value)
        except ValueError:
            shutdown_mp_pool(pool, 5.0, force_timeout=1.0)
            raise

    return call


def _collect(value: Any) -> None:
    from concurrent.futures import Future  # noqa: PLC0415

    from patterns.process_shutdown import collect  # noqa: PLC0415

    future: Future[int] = Future()
    with released_when_blocked(lambda: future.set_result(1)):
        _expect(collect([future], value).results == {0: 1}, value)


def _stop_signal_wait(value: Any) -> None:
    import multiprocessing  # noqa: PLC0415

    from patterns.stoppable_process import StopSignal  # noqa: PLC0415

    reader, writer = multiprocessing.Pipe(duplex=False)
    try:
        with released_when_blocked(lambda: writer.send_bytes(b"s")):
            _expect(StopSignal(reader).wait(value) is True, value)
    finally:
        reader.close()
        writer.close()


# --- asyncio --------------------------------------------------------------------------------


def _shutdown_tasks(value: Any) -> None:
    from patterns.asyncio_shutdown import shutdown_tasks  # noqa: PLC0415

    async def main() -> Any:
        task = asyncio.get_running_loop().create_task(asyncio.Event().wait())
        await asyncio.sleep(0)
        return await shutdown_tasks([task], value)

    _expect(asyncio.run(main()).terminated, value)


def _task_set(**options: Any) -> Callable[[Any], None]:
    def call(value: Any) -> None:
        from patterns.asyncio_shutdown import TaskSet  # noqa: PLC0415

        async def main() -> Any:
            if "stop_timeout" in options:
                return await TaskSet(stop_timeout=value).start().stop()
            return await TaskSet().start().stop(value)

        _expect(asyncio.run(main()).terminated, value)

    return call


def _shielded(value: Any) -> None:
    from patterns.asyncio_shutdown import shielded  # noqa: PLC0415

    async def main() -> None:
        async def cleanup() -> str:
            return "saved"

        try:
            assert await shielded(cleanup(), value) == "saved"
        except TimeoutError:  # a zero budget may end before the cleanup's first step
            assert value == 0

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # "coroutine was never awaited"
        try:
            asyncio.run(main())
        finally:
            gc.collect()  # a refused cleanup coroutine is collected now, in this test


def _retry_forever(value: Any) -> None:
    from patterns.asyncio_shutdown import retry_forever  # noqa: PLC0415

    async def main() -> None:
        ran = asyncio.Event()

        async def step() -> None:
            ran.set()

        loop = asyncio.get_running_loop()
        task = loop.create_task(retry_forever(step, delay=value))
        stepped = loop.create_task(ran.wait())
        await asyncio.wait([task, stepped], return_when=asyncio.FIRST_COMPLETED)
        stepped.cancel()
        if task.done():  # it refused the delay before its first step
            await task
        await asyncio.sleep(0)  # let it reach its sleep(delay)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def _run_in_thread_with(value: Any) -> None:
    from patterns.asyncio_shutdown import run_in_thread_with  # noqa: PLC0415

    async def main() -> int:
        return await run_in_thread_with(None, value, lambda token: 9)

    assert asyncio.run(main()) == 9


def _async_signal_handlers_stop(value: Any) -> None:
    from patterns.asyncio_signals import AsyncSignalHandlers  # noqa: PLC0415

    async def main() -> Any:
        handlers = AsyncSignalHandlers(lambda signum: None).start()
        return handlers.stop(value)

    assert asyncio.run(main()).terminated


def _arun(**options: Any) -> Callable[[Any], None]:
    def call(value: Any) -> None:
        from patterns.asyncio_signals import run_until_signalled  # noqa: PLC0415

        async def work(stop: asyncio.Event) -> None:
            return None

        (arg,) = options
        kwargs = {"drain_timeout": 1.0, arg: value}
        _expect(asyncio.run(run_until_signalled(work, **kwargs)).terminated, value)

    return call


# --- the job queue --------------------------------------------------------------------------


def _worker(**options: Any) -> Callable[[Any], None]:
    def call(value: Any) -> None:
        from patterns.jobqueue import MemoryStore, TaskRegistry, Worker  # noqa: PLC0415

        (arg,) = options
        kwargs: dict[str, Any] = {"poll_interval": 0.05, arg: value}
        worker = Worker(
            MemoryStore(), TaskRegistry(), concurrency=1, name="seconds-worker", **kwargs
        )
        assert worker.start().stop(5.0).terminated

    return call


ENTRIES = [
    *_stoppables(),
    Entry("every", "interval", _every),
    Entry("run_with_service", "stop_timeout", _run_with_service),
    Entry("Supervisor", "window", _supervisor(window=None)),
    Entry("Supervisor", "interval", _supervisor(interval=None)),
    Entry("Supervisor.wait_unhealthy", "timeout", _wait_unhealthy),
    Entry("ConsumerPool.put", "timeout", _pool_put),
    Entry("put_pill", "timeout", _put_pill(timeout=None)),
    Entry("put_pill", "poll", _put_pill(poll=None)),
    Entry("join_with_timeout", "timeout", _join_with_timeout),
    Entry("ProducerGroup", "timeout", _producer_group),
    Entry("AsyncConsumerPool", "stop_timeout", _async_pool(stop_timeout=None)),
    Entry("AsyncConsumerPool.stop", "timeout", _async_pool(timeout=None)),
    Entry("Bulkhead.call", "timeout", _bulkhead_call),
    Entry("JobToken.wait", "timeout", _job_token_wait),
    Entry("CancelToken", "timeout", _cancel_token),
    Entry("CancelToken.child", "timeout", _cancel_child),
    Entry("CancelToken.wait", "timeout", _cancel_wait),
    Entry("CancelToken.sleep", "seconds", _cancel_sleep),
    Entry("take", "poll_interval", _take),
    Entry("await_termination", "timeout", _await_termination),
    Entry("shutdown_and_await", "timeout", _shutdown_and_await(timeout=None)),
    Entry("shutdown_and_await", "force_timeout", _shutdown_and_await(force_timeout=None)),
    Entry("run_all", "timeout", _run_all(timeout=None)),
    Entry("run_all", "force_timeout", _run_all(force_timeout=None)),
    Entry("install_signal_handlers", "stop_timeout", _install_signal_handlers),
    Entry("run_until_signalled", "drain_timeout", _sync_run_until_signalled),
    Entry("force_exit", "flush_timeout", _force_exit),
    Entry("shutdown_process_pool", "timeout", _process_pool(timeout=None)),
    Entry("shutdown_process_pool", "force_timeout", _process_pool(force_timeout=None)),
    Entry("shutdown_mp_pool", "timeout", _mp_pool(timeout=None)),
    Entry("shutdown_mp_pool", "force_timeout", _mp_pool(force_timeout=None)),
    Entry("collect", "timeout", _collect),
    Entry("StopSignal.wait", "timeout", _stop_signal_wait),
    Entry("shutdown_tasks", "timeout", _shutdown_tasks),
    Entry("TaskSet", "stop_timeout", _task_set(stop_timeout=None)),
    Entry("TaskSet.stop", "timeout", _task_set(timeout=None)),
    Entry("shielded", "timeout", _shielded),
    Entry("retry_forever", "delay", _retry_forever),
    Entry("run_in_thread_with", "cancel_timeout", _run_in_thread_with),
    Entry("AsyncSignalHandlers.stop", "timeout", _async_signal_handlers_stop),
    Entry("arun_until_signalled", "drain_timeout", _arun(drain_timeout=None)),
    Entry("arun_until_signalled", "cancel_timeout", _arun(cancel_timeout=None)),
    Entry("Worker", "poll_interval", _worker(poll_interval=None)),
    Entry("Worker", "cancel_timeout", _worker(cancel_timeout=None)),
    Entry("Worker", "lease", _worker(lease=None)),
    Entry("Worker", "heartbeat_interval", _worker(heartbeat_interval=None)),
    Entry("Worker", "store_outage_limit", _worker(store_outage_limit=None)),
]  # fmt: skip
each_entry = pytest.mark.parametrize("entry", ENTRIES, ids=str)


def _refusal(entry: Entry, value: Any) -> str | None:
    """Run ``entry`` with ``value``; the ValueError's message if refused, else None."""
    try:
        entry.call(value)
    except ValueError as exc:
        return str(exc)
    return None


def _no_overflow_logged(caplog: pytest.LogCaptureFixture) -> None:
    for record in caplog.records:
        if record.exc_info and record.exc_info[0] is OverflowError:
            pytest.fail(f"an OverflowError was logged: {record.getMessage()}")
        assert "OverflowError" not in record.getMessage()


@each_entry
@pytest.mark.parametrize("bad", [math.nan, -1.0, -math.inf, True, "1"],
                         ids=["nan", "negative", "minus-inf", "bool", "str"])  # fmt: skip
def test_a_value_that_is_not_a_number_of_seconds_is_refused_by_name(entry: Entry, bad: Any) -> None:
    """nan, negative, bool and str: a ValueError that names the argument, nothing started."""
    before = set(threading.enumerate())
    with pytest.raises(ValueError, match=entry.arg):
        entry.call(bad)
    wait_until(lambda: set(threading.enumerate()) <= before, "nothing was left running")


@each_entry
@pytest.mark.parametrize(
    "huge", [math.inf, 1e10, 1e300, 10**400], ids=["inf", "1e10", "1e300", "int-10**400"]
)
def test_an_endless_value_works_or_is_refused_by_name_never_overflows(
    entry: Entry, huge: float, caplog: pytest.LogCaptureFixture
) -> None:
    """Infinite and absurd numbers: "as long as it takes", or a ValueError naming the argument."""
    caplog.set_level(logging.DEBUG)
    before = set(threading.enumerate())
    with recording_hook() as uncaught:
        refused = _refusal(entry, huge)
        assert refused is None or entry.arg in refused
        wait_until(lambda: set(threading.enumerate()) <= before, "nothing was left running")
    assert uncaught == []
    _no_overflow_logged(caplog)


@each_entry
@pytest.mark.parametrize("small", [0, 0.5], ids=["zero", "half"])
def test_an_ordinary_value_works(entry: Entry, small: float) -> None:
    """0 and 0.5 work (0 may be refused, by name, where a zero would spin or mean nothing)."""
    started = time.monotonic()
    refused = _refusal(entry, small)
    if refused is not None:
        assert small == 0, refused
        assert entry.arg in refused
    assert time.monotonic() - started < MUST_HAPPEN * 3
