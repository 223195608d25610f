"""The closable_queue picture, P14: consumers blocked in ``get()`` never see a stop flag.

Docs: docs/patterns/closable_queue.md
"""

from __future__ import annotations

import queue
import threading

from patterns import closable_queue
from patterns.naive import closable_queue as naive_closable_queue
from patterns.teaching.lanes import Event, Tracer
from patterns.teaching.scenarios.common import (
    Scenario,
    blocked_in,
    join_all,
    start_thread,
    still_blocked,
)


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

    threads = [start_thread(f"consumer-{i}", consumer) for i in range(3)]
    for thread in threads:
        blocked_in(thread, "get")
    tracer.mark("stop.set(); join()")
    stop.set()
    if not still_blocked(threads[0]):
        raise RuntimeError("P14: a consumer saw the flag while blocked in get()")
    for thread in threads:
        tracer.mark("still in get(): the flag is never looked at", bad=True, lane=thread.name)
    tracer.mark("join() does not return")
    tracer.mark("puts one wake-up item per consumer")
    for _ in threads:
        q.put("wake-up")
    join_all(*threads)
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
    threads = [start_thread(f"consumer-{i}", consumer) for i in range(3)]
    for thread in threads:
        blocked_in(thread, "get")
    closed = tracer.mark("q.shutdown(); join()")
    q.shutdown()
    join_all(*threads)
    tracer.mark("every consumer returned; nothing handled")
    return tracer


P14 = Scenario(
    "P14",
    _p14_naive,
    _p14_fixed,
    "Consumers waiting in get() never read the stop flag, and the wake-up items "
    "are handled as data; closing the queue wakes every consumer at once.",
)
