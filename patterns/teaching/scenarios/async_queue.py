"""The async_queue picture, A1: one sentinel for three consumer tasks.

It ends one task; the other two wait in ``get()``. The lanes are asyncio tasks, all in one
thread.

Docs: docs/patterns/async_queue.md
"""

from __future__ import annotations

import asyncio
from typing import Any

from patterns import async_queue
from patterns.naive import async_queue as naive_async_queue
from patterns.teaching.lanes import Event, Tracer
from patterns.teaching.scenarios.common import LOOK, Scenario, run_async


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
    for name in sorted(task.get_name() for task in waiting):
        tracer.mark("still waits in get() on an empty queue: no STOP left", bad=True, lane=name)
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


def _a1_run(fixed: bool) -> Tracer:
    if fixed:
        title, main = "consume_until_shutdown, q.shutdown()", _a1_fixed_main
    else:
        title, main = "naive_consume, naive_stop", _a1_naive_main
    tracer = Tracer(title, {"main": "main"}, tasks=True)
    run_async(lambda: main(tracer))
    return tracer


A1 = Scenario.of(
    "A1",
    _a1_run,
    "One STOP ends one consumer task and the other two wait in get() on an empty queue; "
    "one shutdown() ends all three once the six items are handed out.",
    "an asyncio task (all of them take turns in one thread, at each await)",
)
