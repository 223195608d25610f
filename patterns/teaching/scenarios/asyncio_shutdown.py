"""The asyncio_shutdown pictures, A7 and A10: a stop that waits for ever, one too little.

A7: cancel, then gather, and a task that swallows its cancel. A10: a cleanup under
``asyncio.shield`` that its cancelled caller leaves behind.

The lanes are asyncio tasks, all in one thread.

Docs: docs/patterns/asyncio_shutdown.md
"""

from __future__ import annotations

import asyncio

from patterns import asyncio_shutdown
from patterns.naive import asyncio_shutdown as naive_asyncio_shutdown
from patterns.teaching.lanes import Event, Tracer
from patterns.teaching.scenarios.common import (
    LOOK,
    MUST_HAPPEN,
    Scenario,
    log_as_marks,
    run_async,
)


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


async def _a10_main(tracer: Tracer, fixed: bool) -> None:
    started, proceed = asyncio.Event(), asyncio.Event()
    cancel_at: list[Event] = []

    async def save() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.set_name("save")  # the shield's own task: its lane
        tracer.mark("starts writing the state; its I/O takes a while")
        started.set()
        try:
            await proceed.wait()
        except asyncio.CancelledError:
            tracer.mark("cancelled by asyncio.run at exit: the state is never written", bad=True)
            raise
        tracer.mark("the state is written")

    async def service() -> None:
        tracer.mark("its last step: the save, shielded from cancellation")
        try:
            if fixed:
                await asyncio_shutdown.shielded(save(), MUST_HAPPEN, name="save")
            else:
                await naive_asyncio_shutdown.naive_shielded_cleanup(save())
        except asyncio.CancelledError:
            if fixed:
                tracer.mark("the save ended: its CancelledError is raised now", after=cancel_at[0])
            else:
                tracer.mark(
                    "CancelledError at once: it ends, its save still running",
                    bad=True,
                    after=cancel_at[0],
                )
            raise

    worker = asyncio.create_task(service(), name="service")
    await asyncio.wait_for(started.wait(), MUST_HAPPEN)
    cancel_at.append(tracer.mark("service.cancel(), as a stop does"))
    worker.cancel()
    done, _ = await asyncio.wait([worker], timeout=LOOK)
    if fixed == bool(done):
        raise RuntimeError(f"A10: the {'fixed' if fixed else 'naive'} service did the unexpected")
    if not fixed:
        tracer.mark("the service is done, so main returns; nobody waits for the save")
        return  # asyncio.run cancels what is left: the save
    tracer.mark("the service still waits for its save; the save's I/O completes")
    proceed.set()
    await asyncio.wait([worker], timeout=MUST_HAPPEN)
    if not worker.cancelled():
        raise RuntimeError("A10: shielded() swallowed the cancellation")
    tracer.mark("the service ended cancelled, after its save")


def _a10_run(fixed: bool) -> Tracer:
    title = "shielded" if fixed else "naive_shielded_cleanup (asyncio.shield)"
    tracer = Tracer(title, {"main": "main"}, tasks=True)
    run_async(lambda: _a10_main(tracer, fixed))
    return tracer


A10 = Scenario.of(
    "A10",
    _a10_run,
    "Cancelled while its shielded save runs, the naive service ends at once and asyncio.run "
    "cancels the save at exit; shielded keeps the service until the save is written, then "
    "raises its CancelledError.",
    "an asyncio task (all of them take turns in one thread, at each await)",
)
