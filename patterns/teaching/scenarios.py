"""Naive and fixed runs of each pattern page's main pitfall, traced for a lane diagram.

``SCENARIOS[key]`` (keys such as ``"executor_shutdown.p1"``) holds a `Scenario`: its
``naive()`` and ``fixed()`` each run the real code (``patterns.naive.<module>`` and
``patterns.<module>``) under the interleaving that the module's race tests force, with
`threading.Event` checkpoints instead of sleeps, and return the `Tracer`. The marks are
made here, never inside a pattern module. Each run takes well under a second and leaves
no thread running: a naive run that strands a thread releases it afterwards, and says so
in a mark. Docs: docs/_ext/lanes.py
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import io
import json
import logging
import multiprocessing
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from patterns import (
    async_queue,
    asyncio_shutdown,
    bulkhead,
    cancellation,
    closable_queue,
    executor_shutdown,
    poison_pill,
    process_shutdown,
    supervisor,
    thread_exceptions,
)
from patterns.naive import async_queue as naive_async_queue
from patterns.naive import asyncio_shutdown as naive_asyncio_shutdown
from patterns.naive import bulkhead as naive_bulkhead
from patterns.naive import cancellation as naive_cancellation
from patterns.naive import closable_queue as naive_closable_queue
from patterns.naive import executor_shutdown as naive_executor_shutdown
from patterns.naive import poison_pill as naive_poison_pill
from patterns.naive import process_shutdown as naive_process_shutdown
from patterns.naive import supervisor as naive_supervisor
from patterns.naive import thread_exceptions as naive_thread_exceptions
from patterns.teaching import process_tasks
from patterns.teaching.lanes import Event, Tracer

__all__ = ["SCENARIOS", "Scenario", "pair_html"]

T = TypeVar("T")

# How long a scenario waits for something that must happen (it happens in microseconds;
# this only turns a broken scenario into an error instead of a hang).
MUST_HAPPEN = 10.0
# How long a naive run watches a thread that must stay blocked before it releases it.
LOOK = 0.05


@dataclass(frozen=True)
class Scenario:
    """A pitfall's naive and fixed runs, and the sentence that says what to look at."""

    pitfall: str
    naive: Callable[[], Tracer]
    fixed: Callable[[], Tracer]
    caption: str
    lanes: str = "a thread"  # what one lane is, for the caption ("an asyncio task" ...)


def _blocked_in(thread: threading.Thread, func_name: str) -> None:
    """Return once ``thread``'s stack has a frame of ``func_name`` (observed, not guessed)."""
    deadline = time.monotonic() + MUST_HAPPEN
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(thread.ident or -1)
        while frame is not None:
            if frame.f_code.co_name == func_name:
                return
            frame = frame.f_back
        time.sleep(0.0005)  # polling an observation, not waiting for a race
    raise RuntimeError(f"{thread.name} was never seen inside {func_name}()")


def _wait(event: threading.Event, what: str) -> None:
    if not event.wait(MUST_HAPPEN):
        raise RuntimeError(f"scenario stuck: {what}")


def _join(*threads: threading.Thread) -> None:
    for thread in threads:
        thread.join(MUST_HAPPEN)
        if thread.is_alive():
            raise RuntimeError(f"scenario left {thread.name} running")


def _thread(name: str, target: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=target, name=name)
    thread.start()
    return thread


class _MarkHandler(logging.Handler):
    def __init__(self, tracer: Tracer) -> None:
        super().__init__(logging.INFO)
        self.tracer = tracer

    def emit(self, record: logging.LogRecord) -> None:
        message = re.sub(r" \(ident \d+\)", "", record.getMessage().split(";")[0])
        self.tracer.mark(f"logs {record.levelname}: {message}")


@contextlib.contextmanager
def _log_as_marks(tracer: Tracer, name: str) -> Iterator[None]:
    """Turn what logger ``name`` logs (INFO and up) into marks, instead of printing it."""
    target = logging.getLogger(name)
    handler = _MarkHandler(tracer)
    propagate, level = target.propagate, target.level
    target.addHandler(handler)
    target.propagate = False
    target.setLevel(logging.INFO)
    try:
        yield
    finally:
        target.removeHandler(handler)
        target.propagate, target.level = propagate, level


def _still_blocked(thread: threading.Thread) -> bool:
    """Watch ``thread`` for `LOOK` seconds: True if it is still alive (it must be)."""
    thread.join(LOOK)
    return thread.is_alive()


# --- executor_shutdown, P1: shutdown(wait=False), then close() ------------------------


class _Out(io.StringIO):
    """The resource the task writes to; its close() is marked in the closing thread."""

    def __init__(self, tracer: Tracer) -> None:
        super().__init__()
        self.tracer = tracer
        self.closed_at: Event | None = None
        self.at_close = ""

    def close(self) -> None:
        self.at_close = self.getvalue()
        self.closed_at = self.tracer.mark("out.close()")
        super().close()


def _p1_task(tracer: Tracer, out: _Out, parked: threading.Event, go: threading.Event) -> None:
    tracer.mark("task has its result, about to write it")
    parked.set()
    _wait(go, "P1 gate")
    try:
        out.write("result")
    except ValueError as exc:
        tracer.mark(f"out.write() raised ValueError: {exc}", bad=True, after=out.closed_at)
        raise
    tracer.mark("out.write('result') done")


def _p1_naive() -> Tracer:
    tracer = Tracer("naive_stop_then_close", {"MainThread": "main", "worker_0": "pool worker"})
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="worker")
    out, parked, go = _Out(tracer), threading.Event(), threading.Event()
    task = pool.submit(_p1_task, tracer, out, parked, go)
    _wait(parked, "P1 task parked")
    tracer.mark("naive_stop_then_close(pool, out)")
    naive_executor_shutdown.naive_stop_then_close(pool, out)
    tracer.mark("returned at once")
    go.set()
    error = task.exception(MUST_HAPPEN)
    pool.shutdown(wait=True)
    tracer.mark(f"the future holds {type(error).__name__}; nobody reads it")
    return tracer


def _p1_fixed() -> Tracer:
    tracer = Tracer(
        "stop_then_close",
        {"MainThread": "main", "worker_0": "pool worker", "stopper": "stopper"},
    )
    pool = executor_shutdown.TrackingExecutor(max_workers=1, thread_name_prefix="worker")
    out, parked, go = _Out(tracer), threading.Event(), threading.Event()
    task = pool.submit(_p1_task, tracer, out, parked, go)
    _wait(parked, "P1 task parked")

    def stop() -> None:
        tracer.mark("stop_then_close(pool, out)")
        report = executor_shutdown.stop_then_close(pool, out, MUST_HAPPEN, force_timeout=0)
        tracer.mark(f"returned: terminated={report.terminated}")

    stopper = _thread("stopper", stop)
    _blocked_in(stopper, "await_termination")
    tracer.mark("stopper waits in await_termination(); let the task go on")
    go.set()
    task.result(MUST_HAPPEN)
    _join(stopper)
    tracer.mark(f"out held {out.at_close!r} when it was closed")
    return tracer


# --- cancellation, C1: a CPU loop that checks its token once -------------------------

_C1_ITEMS = 4


def _c1_run(crunch: Callable[..., int], fixed: bool) -> Tracer:
    tracer = Tracer("crunch" if fixed else "naive_crunch", {"MainThread": "main"})
    token = cancellation.CancelToken()
    parked, go = threading.Event(), threading.Event()
    cancel_at: list[Event] = []

    def step(item: int) -> None:
        late = bool(cancel_at)
        tracer.mark(
            f"step({item})" + (": the cancel is never looked at" if late and item == 1 else ""),
            bad=late and item == 1,
            after=cancel_at[0] if late and item == 1 else None,
        )
        if item == 0:
            parked.set()
            _wait(go, "C1 gate")

    def task() -> None:
        try:
            done = crunch(range(_C1_ITEMS), step, token)
        except cancellation.Cancelled as exc:
            tracer.mark(f"raised Cancelled({exc.reason!r}) before step(1)")
            return
        tracer.mark(f"returned {done}: every item processed after the cancel")

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="worker")
    tracer.name_lane("worker_0", "pool worker")
    pool.submit(task)
    _wait(parked, "C1 step 0 running")
    cancel_at.append(tracer.mark("token.cancel('shutdown')"))
    token.cancel("shutdown")
    tracer.mark("pool.shutdown(wait=True)")
    go.set()
    pool.shutdown(wait=True)
    tracer.mark("shutdown returned")
    return tracer


def _c1_naive() -> Tracer:
    return _c1_run(naive_cancellation.naive_crunch, fixed=False)


def _c1_fixed() -> Tracer:
    return _c1_run(cancellation.crunch, fixed=True)


# --- poison_pill, P10: one pill for three consumers ----------------------------------


def _p10_run(fixed: bool) -> Tracer:
    name = "send_pills(q, 3)" if fixed else "naive_send_pills(q, 3)"
    tracer = Tracer(name, {"MainThread": "main"})
    q: queue.Queue[int | poison_pill.Pill] = queue.Queue()
    exited: queue.Queue[str] = queue.Queue()

    def consumer() -> None:
        tracer.mark("consume(q): waits in get()")
        handled = poison_pill.consume(q, lambda item: tracer.mark(f"handles item {item}"))
        tracer.mark(f"took a pill: returns ({handled} handled)")
        exited.put(threading.current_thread().name)

    threads = [_thread(f"consumer-{c}", consumer) for c in "ABC"]
    for thread in threads:
        _blocked_in(thread, "get")
    for item in range(2):
        q.put(item)
    tracer.mark(name)
    if fixed:
        poison_pill.send_pills(q, consumers=3)
        _join(*threads)
        tracer.mark("every consumer returned")
        return tracer
    naive_poison_pill.naive_send_pills(q, consumers=3)
    first = exited.get(timeout=MUST_HAPPEN)
    stuck = [t for t in threads if t.name != first]
    for thread in stuck:
        _blocked_in(thread, "get")
    if not all(_still_blocked(t) for t in stuck):
        raise RuntimeError("P10: a consumer left without a pill")
    tracer.mark(f"{' and '.join(t.name for t in stuck)} stay blocked in get()", bad=True)
    tracer.mark("(the scenario sends 2 more pills, to end them)")
    poison_pill.send_pills(q, consumers=2)
    _join(*threads)
    return tracer


def _p10_naive() -> Tracer:
    return _p10_run(fixed=False)


def _p10_fixed() -> Tracer:
    return _p10_run(fixed=True)


# --- closable_queue, P14: consumers blocked in get() never see a stop flag ------------


def _p14_naive() -> Tracer:
    tracer = Tracer("naive_consume with a stop flag", {"MainThread": "main"})
    q: queue.Queue[str] = queue.Queue()
    stop = threading.Event()

    def handle(item: str) -> None:
        tracer.mark(f"handles {item!r} as if it were data", bad=True)

    def consumer() -> None:
        tracer.mark("waits in q.get()")
        naive_closable_queue.naive_consume(q, handle, stop)
        tracer.mark("sees the flag: returns")

    threads = [_thread(f"consumer-{i}", consumer) for i in range(3)]
    for thread in threads:
        _blocked_in(thread, "get")
    tracer.mark("stop.set(); join()")
    stop.set()
    if not _still_blocked(threads[0]):
        raise RuntimeError("P14: a consumer saw the flag while blocked in get()")
    tracer.mark("join() does not return: all three still in get()", bad=True)
    tracer.mark("puts one wake-up item per consumer")
    for _ in threads:
        q.put("wake-up")
    _join(*threads)
    return tracer


def _p14_fixed() -> Tracer:
    tracer = Tracer("ClosableQueue.shutdown()", {"MainThread": "main"})
    q: closable_queue.ClosableQueue[str] = closable_queue.ClosableQueue()

    def consumer() -> None:
        tracer.mark("waits in q.get()")
        while True:
            try:
                item = q.get()
            except closable_queue.ShutDown:
                tracer.mark("get() raised ShutDown: returns", after=closed)
                return
            tracer.mark(f"handles {item!r}")

    closed: Event | None = None
    threads = [_thread(f"consumer-{i}", consumer) for i in range(3)]
    for thread in threads:
        _blocked_in(thread, "get")
    closed = tracer.mark("q.shutdown(); join()")
    q.shutdown()
    _join(*threads)
    tracer.mark("every consumer returned; nothing handled")
    return tracer


# --- thread_exceptions: a worker dies, and the exit status says success --------------


def _silent_death_run(fixed: bool) -> Tracer:
    runner = "run_main" if fixed else "naive_run_main"
    tracer = Tracer(runner, {"MainThread": "main"})

    def stand_in_for_the_default_hook(args: threading.ExceptHookArgs) -> None:
        # What the default hook would do, minus the print (kept out of the build log).
        tracer.mark(f"threading.excepthook (the default prints {args.exc_type.__name__})")

    def work() -> None:
        tracer.mark("raises ValueError('bad row 3')")
        raise ValueError("bad row 3")

    def main() -> None:
        worker = _thread("worker", work)
        _join(worker)
        tracer.mark(f"joined; worker.is_alive() is {worker.is_alive()}; main returns")

    before = threading.excepthook
    threading.excepthook = stand_in_for_the_default_hook
    try:
        tracer.mark(f"status = {runner}(main)")
        with _log_as_marks(tracer, thread_exceptions.__name__):
            if fixed:
                status = thread_exceptions.run_main(main)
            else:
                status = naive_thread_exceptions.naive_run_main(main)
    finally:
        threading.excepthook = before
    tracer.mark(
        f"exit status {status}" + ("" if status else ": a scheduler sees success"),
        bad=not status,
    )
    return tracer


def _silent_death_naive() -> Tracer:
    return _silent_death_run(fixed=False)


def _silent_death_fixed() -> Tracer:
    return _silent_death_run(fixed=True)


# --- supervisor, P9: the consumer dies, the producer blocks on the full queue ---------


def _poison(item: str) -> None:
    if item == "poison":
        raise ValueError("cannot handle poison")


def _p9_naive() -> Tracer:
    tracer = Tracer("naive_consume, naive_produce", {"MainThread": "main"})
    q: queue.Queue[str] = queue.Queue(maxsize=1)
    died, at_b = threading.Event(), threading.Event()

    def consumer() -> None:
        tracer.mark("waits in q.get()")
        try:
            naive_supervisor.naive_consume(q, _poison)
        except ValueError as exc:  # what the default hook would print, and nothing more
            tracer.mark(f"dies of ValueError({exc}); the default hook would only print it")
        died.set()

    def items() -> Iterator[str]:
        tracer.mark("puts 'poison'")
        yield "poison"
        _wait(died, "P9 consumer dead")
        tracer.mark("puts 'a': it fits")
        yield "a"
        tracer.mark("puts 'b': the queue is full")
        at_b.set()
        yield "b"
        tracer.mark("put('b') returned")

    consumer_thread = _thread("consumer", consumer)
    _blocked_in(consumer_thread, "get")
    producer = _thread("producer", lambda: naive_supervisor.naive_produce(q, items()))
    _wait(at_b, "P9 producer at 'b'")
    _blocked_in(producer, "put")
    if not _still_blocked(producer):
        raise RuntimeError("P9: the producer's put('b') returned with no consumer")
    tracer.mark("the producer waits in put('b'), forever", bad=True)
    tracer.mark("(the scenario takes 'a' and 'b', to end it)")
    q.get(timeout=MUST_HAPPEN)
    _join(producer, consumer_thread)
    q.get(timeout=MUST_HAPPEN)
    return tracer


def _p9_fixed() -> Tracer:
    tracer = Tracer("Supervisor, produce_until_consumer_dies", {"MainThread": "main"})
    q: queue.Queue[str] = queue.Queue(maxsize=1)
    holding, die, at_b = threading.Event(), threading.Event(), threading.Event()

    def handle(item: str) -> None:
        if item == "poison":
            tracer.mark("takes 'poison'")
            holding.set()
            _wait(die, "P9 gate")
        _poison(item)

    def consume(stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                item = q.get(timeout=0.05)  # a bounded wait, so the stop request is seen
            except queue.Empty:
                continue
            handle(item)

    def items() -> Iterator[str]:
        tracer.mark("puts 'poison'")
        yield "poison"
        _wait(holding, "P9 consumer holding the poison")
        tracer.mark("puts 'a': it fits")
        yield "a"
        tracer.mark("puts 'b': the queue is full")
        at_b.set()
        yield "b"

    with _log_as_marks(tracer, supervisor.__name__):
        watcher = supervisor.Supervisor(consume, name="consumer", max_restarts=0, interval=0)
        watcher.start()
        left: list[list[str]] = []

        def produce() -> None:
            left.append(
                supervisor.produce_until_consumer_dies(
                    q, items(), alive=lambda: watcher.healthy, check_every=0.02
                )
            )
            tracer.mark(f"returned {left[0]}: not delivered, not lost")

        producer = _thread("producer", produce)
        _wait(at_b, "P9 producer at 'b'")
        _blocked_in(producer, "put")
        tracer.mark("lets the consumer fail")
        die.set()
        _join(producer)
        report = watcher.stop(MUST_HAPPEN)
    tracer.mark(f"supervisor.stop(): terminated={report.terminated}")
    return tracer


# --- bulkhead, B1: a heavy burst takes every request thread -------------------------
# A two-thread server, in-process: request threads take requests from a backlog, as a
# threaded WSGI server takes connections. The race tests do the same over real HTTP.


class _Server:
    def __init__(self, tracer: Tracer, handle: Callable[[str], str]) -> None:
        self.backlog: queue.Queue[str | None] = queue.Queue()
        self.tracer = tracer
        self.handle = handle
        self.answered: dict[str, threading.Event] = {}
        self.threads = [_thread(f"request-{i}", self._serve) for i in range(2)]

    def _serve(self) -> None:
        while (request := self.backlog.get()) is not None:
            self.tracer.mark(f"takes {request}")
            status = self.handle(request)
            self.tracer.mark(f"answers {request}: {status}")
            self.answered[request].set()

    def send(self, request: str) -> None:
        self.answered[request] = threading.Event()
        self.backlog.put(request)

    def close(self) -> None:
        for _ in self.threads:
            self.backlog.put(None)
        _join(*self.threads)


def _b1_run(fixed: bool) -> Tracer:
    title = "Bulkhead(1, 0) for /heavy" if fixed else "naive_offload to a 1-worker executor"
    tracer = Tracer(title, {"MainThread": "main"})
    entered, release = threading.Event(), threading.Event()

    def heavy(environ: dict[str, object], start_response: Callable[..., object]) -> list[bytes]:
        tracer.mark("runs the heavy query")
        entered.set()
        _wait(release, "B1 heavy query")
        start_response("200 OK", [])
        return [b"done"]

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pool")
    guard = bulkhead.Bulkhead(1, 0, name="heavy")
    offloaded = naive_bulkhead.naive_offload(heavy, pool)

    def handle(request: str) -> str:
        if request.startswith("/light"):
            return "200"
        if not fixed:
            offloaded({}, lambda *_: None)
            return "200"
        try:
            guard.call(heavy, {}, lambda *_: None, timeout=MUST_HAPPEN)
        except bulkhead.BulkheadFull:
            return "503 at once: the bulkhead is full"
        return "200"

    if fixed:
        guard.start()
    server = _Server(tracer, handle)
    try:
        _b1_requests(tracer, server, entered, release, fixed=fixed)
    finally:
        release.set()
        server.close()
        pool.shutdown(wait=True)
        if fixed:
            guard.stop(MUST_HAPPEN)
    return tracer


def _b1_requests(
    tracer: Tracer,
    server: _Server,
    entered: threading.Event,
    release: threading.Event,
    *,
    fixed: bool,
) -> None:
    tracer.mark("GET /heavy (1)")
    server.send("/heavy (1)")
    _wait(entered, "B1 first heavy query running")
    tracer.mark("GET /heavy (2)")
    server.send("/heavy (2)")
    if fixed:
        _wait(server.answered["/heavy (2)"], "B1 second heavy refused")
    else:
        for thread in server.threads:
            _blocked_in(thread, "result")
    tracer.mark("GET /light")
    server.send("/light")
    light = server.answered["/light"]
    if fixed:
        _wait(light, "B1 light answered")
    elif light.wait(LOOK):
        raise RuntimeError("B1: the light request found a free request thread")
    else:
        tracer.mark("/light waits: both request threads wait in result()", bad=True)
    tracer.mark("the heavy query ends")
    release.set()
    _wait(light, "B1 light answered")
    _wait(server.answered["/heavy (1)"], "B1 heavy answered")


def _b1_naive() -> Tracer:
    return _b1_run(fixed=False)


def _b1_fixed() -> Tracer:
    return _b1_run(fixed=True)


# --- asyncio: the lanes are tasks, all in one thread ---------------------------------


def _run_async(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``asyncio.run(main())`` in a thread of its own, the main task's lane named "main".

    A thread of its own because a notebook's kernel already runs a loop in this one;
    bounded, so a broken scenario is an error instead of a hang.
    """
    outcome: list[T] = []
    failure: list[BaseException] = []

    async def bounded() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.set_name("main")
        async with asyncio.timeout(MUST_HAPPEN):
            outcome.append(await main())

    def run() -> None:
        try:
            asyncio.run(bounded())
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            failure.append(exc)

    _join(_thread("event-loop", run))
    if failure:
        raise failure[0]
    return outcome[0]


async def _parked(q: Any, count: int, what: str) -> None:
    """Let the loop run until ``count`` tasks wait in ``q.get()`` (an asyncio queue).

    Reads the queue's private list of futures its getters await: an observation of where
    they are. Each ``sleep(0)`` gives every ready task one step, so a few suffice.
    """
    for _ in range(1000):
        if sum(not waiter.done() for waiter in q._getters) == count:
            return
        await asyncio.sleep(0)
    raise RuntimeError(f"scenario stuck: never saw {count} task(s) {what}")


# async_queue, A1: one sentinel for three consumer tasks.

_A1_ITEMS = 6


async def _a1_handle(tracer: Tracer, item: int) -> None:
    tracer.mark(f"handles item {item}")
    await asyncio.sleep(0)  # a real handler awaits something: the other tasks get a turn


async def _a1_naive_main(tracer: Tracer) -> None:
    q: asyncio.Queue[int | naive_async_queue.Stop] = asyncio.Queue()

    async def consumer() -> None:
        tracer.mark("naive_consume(q): waits in get()")
        handled = await naive_async_queue.naive_consume(q, lambda i: _a1_handle(tracer, i))
        tracer.mark(f"took STOP: returns ({handled} handled)")

    tracer.mark("starts 3 consumer tasks")
    tasks = {asyncio.create_task(consumer(), name=f"consumer-{i}") for i in range(3)}
    await _parked(q, 3, "waiting in get()")
    tracer.mark(f"puts {_A1_ITEMS} items; naive_stop(q): one STOP")
    for item in range(_A1_ITEMS):
        await q.put(item)
    await naive_async_queue.naive_stop(q)
    done, waiting = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    await _parked(q, 2, "waiting on the empty queue")
    late, _ = await asyncio.wait(waiting, timeout=LOOK)
    if len(done) != 1 or late or not q.empty():
        raise RuntimeError("A1: the one sentinel did not leave exactly two tasks waiting")
    names = " and ".join(sorted(task.get_name() for task in waiting))
    tracer.mark(f"{names} wait in get() on an empty queue, forever; gather() would too", bad=True)
    tracer.mark("(the scenario puts 2 more STOPs, to end them)")
    for _ in waiting:
        q.put_nowait(naive_async_queue.STOP)
    await asyncio.wait(waiting)


async def _a1_fixed_main(tracer: Tracer) -> None:
    q: async_queue.ClosableAsyncQueue[int] = async_queue.ClosableAsyncQueue()
    closed: list[Event] = []

    async def consumer() -> int:
        tracer.mark("consume_until_shutdown(q): waits in get()")
        handled = await async_queue.consume_until_shutdown(q, lambda i: _a1_handle(tracer, i))
        tracer.mark(f"get() raised QueueShutDown: returns ({handled} handled)", after=closed[0])
        return handled

    tracer.mark("starts 3 consumer tasks")
    tasks = [asyncio.create_task(consumer(), name=f"consumer-{i}") for i in range(3)]
    await _parked(q, 3, "waiting in get()")
    closed.append(tracer.mark(f"puts {_A1_ITEMS} items; q.shutdown()"))
    for item in range(_A1_ITEMS):
        await q.put(item)
    q.shutdown()
    counts = await asyncio.gather(*tasks)
    tracer.mark(f"gather() returned: {sum(counts)} items handled, every consumer ended")


def _a1_naive() -> Tracer:
    tracer = Tracer("naive_consume, naive_stop", {"main": "main"})
    _run_async(lambda: _a1_naive_main(tracer))
    return tracer


def _a1_fixed() -> Tracer:
    tracer = Tracer("consume_until_shutdown, q.shutdown()", {"main": "main"})
    _run_async(lambda: _a1_fixed_main(tracer))
    return tracer


# asyncio_shutdown, A7: cancel, then gather, and a task that swallows its cancel.


async def _a7_main(tracer: Tracer, fixed: bool) -> None:
    release = asyncio.Event()
    cancel_at: list[Event] = []

    async def stubborn() -> str:
        tracer.mark("waits in release.wait()")
        while True:
            try:
                await release.wait()
            except asyncio.CancelledError:
                tracer.mark("catches CancelledError and waits again", after=cancel_at[0])
                continue
            tracer.mark("released: returns")
            return "released"

    async def sleeper() -> None:
        tracer.mark("waits for an event nobody sets")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            tracer.mark("CancelledError: ends", after=cancel_at[0])
            raise

    tracer.mark("starts stubborn and sleeper")
    tasks = [
        asyncio.create_task(stubborn(), name="stubborn"),
        asyncio.create_task(sleeper(), name="sleeper"),
    ]
    await asyncio.sleep(0)  # one step each: both reach their wait

    async def stop() -> None:
        if fixed:
            cancel_at.append(tracer.mark(f"shutdown_tasks(tasks, timeout={LOOK})"))
            report = await asyncio_shutdown.shutdown_tasks(tasks, LOOK)
            tracer.mark(
                f"returned: terminated={report.terminated}, "
                f"still_running={report.still_running}, cancelled={report.cancelled}"
            )
        else:
            cancel_at.append(
                tracer.mark("naive_shutdown_tasks(tasks): cancel each, gather with no deadline")
            )
            await naive_asyncio_shutdown.naive_shutdown_tasks(tasks)
            tracer.mark("gather returned")

    with _log_as_marks(tracer, asyncio_shutdown.__name__):
        stopper = asyncio.create_task(stop(), name="stopper")
        done, _ = await asyncio.wait([stopper], timeout=None if fixed else LOOK)
    if fixed != bool(done):
        raise RuntimeError(f"A7: the {'fixed' if fixed else 'naive'} stop did the unexpected")
    if not fixed:
        tracer.mark("the stop still waits in gather(), and nothing says for which task", bad=True)
    tracer.mark("(the scenario sets release, to end stubborn)")
    release.set()
    await asyncio.wait([stopper, *tasks])


def _a7_naive() -> Tracer:
    tracer = Tracer("naive_shutdown_tasks", {"main": "main"})
    _run_async(lambda: _a7_main(tracer, fixed=False))
    return tracer


def _a7_fixed() -> Tracer:
    tracer = Tracer("shutdown_tasks", {"main": "main"})
    _run_async(lambda: _a7_main(tracer, fixed=True))
    return tracer


# --- scenarios that need a process of their own: interpreter exit, signals -----------
# The child prints one JSON line per mark (its perf_counter_ns, thread, text); the parent
# adds its own marks and merges both by time into one trace.

_CHILD_MARK = """
import json, sys, threading, time

def mark(text, bad=False):
    line = json.dumps({"t": time.perf_counter_ns(), "thread": threading.current_thread().name,
                       "text": text, "bad": bad})
    sys.stdout.write(line + "\\n")  # one write per line: threads may mark at once
    sys.stdout.flush()
"""


class _Child:
    """A child interpreter running ``code``; its marks and the parent's, in time order."""

    def __init__(self, code: str, parent_lane: str = "parent") -> None:
        self.parent_lane = parent_lane
        self.marks: list[tuple[int, str, str, bool]] = []
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.mark("starts the child")
        root = Path(__file__).resolve().parent.parent.parent  # the checkout, for `patterns`
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *sys.path])}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD_MARK + code],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.reader = _thread("child-reader", self._read)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))
        self.lines.put(None)

    def mark(self, text: str, *, bad: bool = False) -> None:
        self.marks.append((time.perf_counter_ns(), self.parent_lane, text, bad))

    def expect(self, text: str) -> None:
        """Wait for the child's mark that starts with ``text``, unless it came already.

        Two threads' lines reach the pipe in the order they were written, not marked.
        """
        while not any(mark[2].startswith(text) for mark in self.marks if mark[1] != "parent"):
            item = self.lines.get(timeout=MUST_HAPPEN)
            if item is None:
                raise RuntimeError(f"child ended before {text!r}: {self.marks}")
            self._keep(item)

    def finish(self) -> int:
        """Wait for the child to exit; collect its remaining marks; return its status."""
        try:
            return self.proc.wait(MUST_HAPPEN)
        finally:
            self.close()

    def close(self) -> None:
        """Kill the child if it still runs, and collect what it printed (idempotent)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        _join(self.reader)
        while not self.lines.empty():
            item = self.lines.get_nowait()
            if item is not None:
                self._keep(item)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def _keep(self, item: dict[str, Any]) -> None:
        self.marks.append((int(item["t"]), str(item["thread"]), str(item["text"]), item["bad"]))

    def trace(self, title: str, lanes: dict[str, str]) -> Tracer:
        return _merged(title, lanes, self.marks)


def _merged(title: str, lanes: dict[str, str], marks: list[tuple[int, str, str, bool]]) -> Tracer:
    """A trace of marks (time, lane, text, bad) made in several processes, in time order."""
    tracer = Tracer(title, lanes)
    for t_ns, lane, text, bad in sorted(marks):
        tracer.record(t_ns, lane, text, bad=bad)
    return tracer


# daemon_threads, P15: a daemon thread is abandoned mid-file at exit. The export is the
# race tests' child, with marks.
_P15_CHILD = """
import queue
from patterns.daemon_threads import run_with_service
from patterns.naive.daemon_threads import naive_run_with_daemon

rows = queue.Queue()
both_written = threading.Event()

def export(stopping):
    out = open({path!r}, "w")
    try:
        out.write("BEGIN\\n")
        mark("opens export.txt, writes BEGIN")
        while not stopping.is_set():
            try:
                row = rows.get(timeout=0.05)  # a bounded wait, so a stop is noticed
            except queue.Empty:
                continue
            out.write(row + "\\n")
            out.flush()
            mark("writes " + row)
            if row == "row 2":
                both_written.set()
    finally:
        out.write("END\\n")
        out.close()
        mark("finally: writes END, closes the file")

def main():
    rows.put("row 1")
    rows.put("row 2")
    both_written.wait(30)
    mark("main returns")

{function}(main, export, name="export"{extra})
"""


def _p15_run(fixed: bool) -> Tracer:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "export.txt")
        code = _P15_CHILD.format(
            function="run_with_service" if fixed else "naive_run_with_daemon",
            path=str(path),
            extra=", stop_timeout=5" if fixed else "",
        )
        child = _Child(code)
        try:
            status = child.finish()
        finally:
            child.close()
        last = path.read_text().splitlines()[-1]
    whole = last == "END"
    child.mark(
        f"child exited {status}; export.txt ends with {last!r}"
        + ("" if whole else ": no END, and nothing said so"),
        bad=not whole,
    )
    title = "run_with_service" if fixed else "naive_run_with_daemon"
    return child.trace(title, {"MainThread": "child main", "export": "export thread"})


def _p15_naive() -> Tracer:
    return _p15_run(fixed=False)


def _p15_fixed() -> Tracer:
    return _p15_run(fixed=True)


# exit_hooks, P22: a signal taken by another thread, while the main thread sleeps in
# Event.wait(). The child is the race tests' one, with marks.
_P22_CHILD = """
import inspect, signal
from patterns.exit_hooks import install_signal_handlers
from patterns.naive.exit_hooks import naive_install_stop_handler

# The line of Condition.wait where a wait with no timeout sleeps in C: seeing the main
# thread there means it is asleep, not on its way.
_src, _first = inspect.getsourcelines(threading.Condition.wait)
ASLEEP = _first + next(i for i, s in enumerate(_src)
                       if s.strip() == "waiter.acquire()"
                       and _src[i - 1].strip() == "if timeout is None:")

def main_is_asleep():
    # Asleep in Condition.wait, called by Event.wait, called by the module's own
    # stop.wait() (Thread.start() waits in an Event too: that one does not count).
    frames = []
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return (len(frames) >= 3 and frames[0].f_code is threading.Condition.wait.__code__
            and frames[0].f_lineno == ASLEEP and frames[2].f_code.co_name == "<module>")

stop = threading.Event()

def on_stop():
    mark("on_stop(): stop.set()")
    stop.set()

{install}(on_stop)

def signal_this_thread():
    while not main_is_asleep():
        time.sleep(0.001)  # polling an observation, not waiting for a race
    mark("SIGTERM aimed at this thread (pthread_kill)")
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    mark("signal delivered")

helper = threading.Thread(target=signal_this_thread, name="helper")
helper.start()
mark("stop.wait(), no timeout")
stop.wait()
mark("wakes: stopped")
helper.join()
"""


def _p22_run(fixed: bool) -> Tracer:
    install = "install_signal_handlers" if fixed else "naive_install_stop_handler"
    child = _Child(_P22_CHILD.format(install=install))
    try:
        child.expect("signal delivered")
        if fixed:
            child.expect("wakes")
        else:
            try:
                child.proc.wait(LOOK)
            except subprocess.TimeoutExpired:
                child.mark("the child's main thread sleeps on", bad=True)
            else:
                raise RuntimeError("P22: the naive child exited after a worker's signal")
            child.mark("SIGTERM to the process: the main thread takes this one")
            child.proc.send_signal(signal.SIGTERM)
        status = child.finish()
    finally:
        child.proc.kill()
    child.mark(f"child exited {status}")
    lanes = {"MainThread": "child main", "helper": "child helper"}
    return child.trace(install, lanes)


def _p22_naive() -> Tracer:
    return _p22_run(fixed=False)


def _p22_fixed() -> Tracer:
    return _p22_run(fixed=True)


# process_shutdown, M3: terminate() skips the child's cleanup. The child is the race
# tests' `careful`, each step a mark in a file (JSON lines) that the parent merges with its
# own marks by time. Started with spawn, as the tests do.


def _m3_run(fixed: bool) -> Tracer:
    context = multiprocessing.get_context("spawn")
    marks: list[tuple[int, str, str, bool]] = []

    def mark(text: str, *, bad: bool = False) -> None:
        marks.append((time.perf_counter_ns(), "parent", text, bad))

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "marks")
        ready = context.Event()
        child = process_shutdown.StoppableProcess(
            process_tasks.careful_marked, (ready, str(path)), name="careful", context=context
        )
        mark("StoppableProcess(careful).start(), with spawn")
        child.start()
        try:
            if not ready.wait(MUST_HAPPEN):
                raise RuntimeError("scenario stuck: the M3 child never got ready")
            if fixed:
                mark("child.stop(): one byte down the stop pipe, then join")
                report = child.stop(MUST_HAPPEN)
                mark(
                    f"stop() returned: exit code {report.exitcode}, "
                    f"escalation {report.escalation or 'none'}"
                )
            else:
                process = child._process  # as the race test does: the naive call needs it
                assert process is not None
                mark("naive_stop_process(process): terminate(), then join()")
                naive_process_shutdown.naive_stop_process(process)
                exitcode = process.exitcode
        finally:
            child.stop(MUST_HAPPEN)
        lines = [json.loads(line) for line in path.read_text().splitlines()]
    seen = [str(line["text"]) for line in lines]
    if not fixed:
        if any(text.startswith(("finally", "atexit")) for text in seen):
            raise RuntimeError(f"M3: the terminated child cleaned up after all: {seen}")
        t_ns = time.perf_counter_ns()  # what the parent saw: the child ended in its wait
        marks.append((t_ns, "careful", "ended by SIGTERM inside stop.wait()", False))
        mark(f"exit code {exitcode}: no finally, no atexit, nothing said so", bad=True)
    marks += [(int(line["t"]), str(line["lane"]), str(line["text"]), False) for line in lines]
    title = "StoppableProcess.stop()" if fixed else "naive_stop_process"
    return _merged(title, {"parent": "parent", "careful": "child process"}, marks)


def _m3_naive() -> Tracer:
    return _m3_run(fixed=False)


def _m3_fixed() -> Tracer:
    return _m3_run(fixed=True)


SCENARIOS: dict[str, Scenario] = {
    "executor_shutdown.p1": Scenario(
        "P1",
        _p1_naive,
        _p1_fixed,
        "The naive close overtakes the task's write and the write fails; "
        "stop_then_close waits for the task, so the write lands before the close.",
    ),
    "cancellation.c1": Scenario(
        "C1",
        _c1_naive,
        _c1_fixed,
        "The naive loop runs every step after the cancel, and shutdown waits for all of them; "
        "crunch checks the token before each step and stops after the one it was in.",
    ),
    "poison_pill.p10": Scenario(
        "P10",
        _p10_naive,
        _p10_fixed,
        "One pill ends one consumer and the others stay in get(); "
        "one pill per consumer ends all three, after every item.",
    ),
    "closable_queue.p14": Scenario(
        "P14",
        _p14_naive,
        _p14_fixed,
        "Consumers waiting in get() never read the stop flag, and the wake-up items "
        "are handled as data; closing the queue wakes every consumer at once.",
    ),
    "thread_exceptions.silent_death": Scenario(
        "P8c",
        _silent_death_naive,
        _silent_death_fixed,
        "The worker dies and the exit status is still 0; run_main logs the failure and returns 1.",
    ),
    "supervisor.p9": Scenario(
        "P9",
        _p9_naive,
        _p9_fixed,
        "Once the consumer is dead the naive producer waits on the full queue forever; "
        "under a supervisor the producer notices the death and returns what it could "
        "not deliver.",
    ),
    "daemon_threads.p15": Scenario(
        "P15",
        _p15_naive,
        _p15_fixed,
        "The daemon thread is abandoned at exit, its finally never runs and the file has "
        "no END; a service stopped in main's finally writes END before the process exits.",
    ),
    "exit_hooks.p22": Scenario(
        "P22",
        _p22_naive,
        _p22_fixed,
        "A SIGTERM taken by a helper thread never wakes a main thread asleep in "
        "stop.wait() with the textbook handler; with install_signal_handlers, on_stop "
        "runs in a thread of its own and the main thread wakes.",
    ),
    "bulkhead.b1": Scenario(
        "B1",
        _b1_naive,
        _b1_fixed,
        "With an unbounded executor both request threads wait on the heavy route and "
        "/light waits for a thread; the bulkhead refuses the second heavy call at once, "
        "so /light is answered while the heavy query runs.",
    ),
    "async_queue.a1": Scenario(
        "A1",
        _a1_naive,
        _a1_fixed,
        "One STOP ends one consumer task and the other two wait in get() on an empty queue; "
        "one shutdown() ends all three once the six items are handed out.",
        "an asyncio task (all of them take turns in one thread, at each await)",
    ),
    "asyncio_shutdown.a7": Scenario(
        "A7",
        _a7_naive,
        _a7_fixed,
        "A task that catches its CancelledError keeps the naive gather waiting, and nothing "
        "names it; shutdown_tasks returns on its deadline with the task named in still_running.",
        "an asyncio task (all of them take turns in one thread, at each await)",
    ),
    "process_shutdown.m3": Scenario(
        "M3",
        _m3_naive,
        _m3_fixed,
        "terminate() ends the child where it waits: its finally and atexit never run, and "
        "the exit code is -15; asked through StoppableProcess.stop(), the child returns, "
        "cleans up and exits with 0.",
        "a process (the child writes its marks to a file, the parent merges them with its "
        "own: perf_counter is one clock for both)",
    ),
}


def how_to_read(lanes: str = "a thread") -> str:
    """The sentence that says how to read a picture whose lanes are ``lanes``."""
    return (
        f"Each lane is {lanes}; the marks are numbered in the order they happened, spaced "
        "by order, not to scale, and the key gives each mark's time since the first one. "
        "The failure is red."
    )


def pair_html(key: str, *, when: str = "Drawn from runs made just now.") -> str:
    """Run ``SCENARIOS[key]`` and return both pictures as one HTML figure with a caption.

    Inline SVG, so the drawing takes the page's text colour (light and dark themes);
    side by side when there is room for both, one above the other when there is not.
    """
    scenario = SCENARIOS[key]
    naive, fixed = scenario.naive(), scenario.fixed()
    naive.title = f"Naive: {naive.title}"
    fixed.title = f"Fixed: {fixed.title}"
    columns = max(len(naive.events), len(fixed.events))
    one = 'style="flex:1 1 20em;min-width:0"'
    caption = f"{scenario.pitfall}: {scenario.caption} {how_to_read(scenario.lanes)} {when}"
    return (
        f'<figure class="race-lanes" id="race-lanes-{html.escape(key.replace(".", "-"))}">'
        '<div class="race-lanes-pair" style="display:flex;flex-wrap:wrap;gap:1em">'
        f"<div {one}>{naive.svg(columns=columns)}</div>"
        f"<div {one}>{fixed.svg(columns=columns)}</div>"
        f"</div><figcaption><p>{html.escape(caption)}</p></figcaption></figure>"
    )
