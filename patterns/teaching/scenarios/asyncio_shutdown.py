"""The asyncio_shutdown picture, A7: cancel, then gather, and a task that swallows its cancel.

The lanes are asyncio tasks, all in one thread.

Docs: docs/patterns/asyncio_shutdown.md
"""

from __future__ import annotations

import asyncio

from patterns import asyncio_shutdown
from patterns.naive import asyncio_shutdown as naive_asyncio_shutdown
from patterns.teaching.lanes import Event, Tracer
from patterns.teaching.scenarios.common import LOOK, Scenario, log_as_marks, run_async


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

    with log_as_marks(tracer, asyncio_shutdown.__name__):
        stopper = asyncio.create_task(stop(), name="stopper")
        done, _ = await asyncio.wait([stopper], timeout=None if fixed else LOOK)
    if fixed != bool(done):
        raise RuntimeError(f"A7: the {'fixed' if fixed else 'naive'} stop did the unexpected")
    if not fixed:
        tracer.mark(
            "still waits in gather(), and nothing says for which task", bad=True, lane="stopper"
        )
    tracer.mark("(the scenario sets release, to end stubborn)")
    release.set()
    await asyncio.wait([stopper, *tasks])


def _a7_run(fixed: bool) -> Tracer:
    title = "shutdown_tasks" if fixed else "naive_shutdown_tasks"
    tracer = Tracer(title, {"main": "main"}, tasks=True)
    run_async(lambda: _a7_main(tracer, fixed))
    return tracer


A7 = Scenario.of(
    "A7",
    _a7_run,
    "A task that catches its CancelledError keeps the naive gather waiting, and nothing "
    "names it; shutdown_tasks returns on its deadline with the task named in still_running.",
    "an asyncio task (all of them take turns in one thread, at each await)",
)
