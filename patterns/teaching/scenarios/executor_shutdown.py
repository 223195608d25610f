"""The executor_shutdown picture, P1: ``shutdown(wait=False)``, then ``close()``.

The naive close overtakes the task's write.

Docs: docs/patterns/executor_shutdown.md
"""

from __future__ import annotations

import io
import threading
from concurrent.futures import ThreadPoolExecutor

from patterns import executor_shutdown
from patterns.naive import executor_shutdown as naive_executor_shutdown
from patterns.teaching.lanes import Event, Tracer
from patterns.teaching.scenarios.common import (
    MUST_HAPPEN,
    Scenario,
    blocked_in,
    join_all,
    start_thread,
    wait_for,
)


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
    wait_for(go, "P1 gate")
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
    wait_for(parked, "P1 task parked")
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
    wait_for(parked, "P1 task parked")

    def stop() -> None:
        tracer.mark("stop_then_close(pool, out)")
        report = executor_shutdown.stop_then_close(pool, out, MUST_HAPPEN, force_timeout=0)
        tracer.mark(f"returned: terminated={report.terminated}")

    stopper = start_thread("stopper", stop)
    blocked_in(stopper, "await_termination")
    tracer.mark("stopper waits in await_termination(); let the task go on")
    go.set()
    task.result(MUST_HAPPEN)
    join_all(stopper)
    tracer.mark(f"out held {out.at_close!r} when it was closed")
    return tracer


P1 = Scenario(
    "P1",
    _p1_naive,
    _p1_fixed,
    "The naive close overtakes the task's write and the write fails; "
    "stop_then_close waits for the task, so the write lands before the close.",
)
