"""The asyncio_shutdown pictures: A7 and A10 to A12, stops that wait too long or too little.

A7: cancel, then gather, and a task that swallows its cancel. A10: a cleanup under
``asyncio.shield`` that its cancelled caller leaves behind. A11: that cleanup fails, and
its error reaches nobody. A12: ``asyncio.timeout`` around a TaskGroup whose child swallows
its cancel. A13 and A14 differ by version (3.13 fixed both in asyncio itself), so their
captions name the version they ran on: the docs are built with 3.11.

The lanes are asyncio tasks, all in one thread.

Docs: docs/patterns/asyncio_shutdown.md
"""

from __future__ import annotations

import asyncio
import gc
import sys
from typing import Any

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


async def _a11_main(tracer: Tracer, fixed: bool) -> None:
    started, proceed = asyncio.Event(), asyncio.Event()
    cancel_at: list[Event] = []
    loop = asyncio.get_running_loop()
    said: list[str] = []

    def loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        said.append(str(context["message"]))
        tracer.mark(
            f"its OSError reaches nobody: freed, the loop says only {context['message']!r}",
            bad=True,
            lane="save",
        )

    loop.set_exception_handler(loop_error)

    async def save() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.set_name("save")  # the shield's own task: its lane
        del task  # no reference from its own frame: the task can be freed
        tracer.mark("starts writing the state; its I/O takes a while")
        started.set()
        await proceed.wait()
        tracer.mark("the disk is full: raises OSError")
        raise OSError("disk full")

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
                tracer.mark("ends at once, cancelled; its save runs on alone", after=cancel_at[0])
            raise

    worker = asyncio.create_task(service(), name="service")
    await asyncio.wait_for(started.wait(), MUST_HAPPEN)
    (inner,) = asyncio.all_tasks() - {worker, asyncio.current_task()}
    cancel_at.append(tracer.mark("service.cancel(), as a stop does"))
    worker.cancel()
    await asyncio.wait([worker], timeout=LOOK)
    tracer.mark("(the scenario lets the save's I/O end, in failure)")
    proceed.set()
    with log_as_marks(tracer, asyncio_shutdown.__name__):
        await asyncio.wait([worker, inner], timeout=MUST_HAPPEN)
    if not (worker.cancelled() and inner.done()):
        raise RuntimeError("A11: the service or its save did not end")
    del inner
    gc.collect()  # a task's unretrieved exception is reported only when the task is freed
    loop.set_exception_handler(None)
    if said != ([] if fixed else ["Task exception was never retrieved"]):
        raise RuntimeError(f"A11: the loop said {said}")


def _a11_run(fixed: bool) -> Tracer:
    title = "shielded" if fixed else "naive_shielded_cleanup (asyncio.shield)"
    tracer = Tracer(title, {"main": "main"}, tasks=True)
    run_async(lambda: _a11_main(tracer, fixed))
    return tracer


A11 = Scenario.of(
    "A11",
    _a11_run,
    "Cancelled during its shielded save, the naive service leaves; when the save then fails, "
    "nobody hears, until the loop frees the task; shielded waits, logs the failure at ERROR, "
    "then raises the cancel.",
    "an asyncio task (all of them take turns in one thread, at each await)",
)


async def _a12_stubborn(tracer: Tracer, caught: asyncio.Event, release: asyncio.Event) -> None:
    """The race tests' stubborn child: it swallows every cancel until ``release`` is set."""
    task = asyncio.current_task()
    assert task is not None
    task.set_name("stubborn")  # its lane, however the group named it
    tracer.mark("runs; catches every cancel and goes on")
    while not release.is_set():
        try:
            await release.wait()
        except asyncio.CancelledError:
            tracer.mark("catches a cancel and goes on")
            caught.set()
    tracer.mark("released: returns")


# A12's deadline (naive) and stop budget (fixed): short, so the picture's run stays short.
_A12_DEADLINE = 0.01
_A12_BUDGET = 0.1


async def _a12_main(tracer: Tracer, fixed: bool) -> None:
    caught, release, entered = asyncio.Event(), asyncio.Event(), asyncio.Event()
    group = asyncio_shutdown.StoppableTaskGroup(name="workers")

    async def owner() -> None:
        if fixed:
            tracer.mark("async with StoppableTaskGroup() as group: the stubborn child")
            async with group:
                group.create_task(_a12_stubborn(tracer, caught, release), name="stubborn")
                entered.set()
        else:
            tracer.mark(f"naive_run_group: asyncio.timeout({_A12_DEADLINE}) around a TaskGroup")
            children = [_a12_stubborn(tracer, caught, release)]
            await naive_asyncio_shutdown.naive_run_group(children, _A12_DEADLINE)
        tracer.mark("leaves the group")

    task = asyncio.create_task(owner(), name="owner")
    if fixed:
        await asyncio.wait_for(entered.wait(), MUST_HAPPEN)
        tracer.mark(f"group.stop({_A12_BUDGET}): cancel the children, wait at most {_A12_BUDGET} s")
        with log_as_marks(tracer, asyncio_shutdown.__name__):
            report = await group.stop(_A12_BUDGET)
        if report.still_running != ("stubborn",) or not caught.is_set():
            raise RuntimeError(f"A12: stop() did the unexpected: {report}")
        tracer.mark(f"stop() returned on its deadline: still_running={report.still_running}")
    else:
        await asyncio.wait_for(caught.wait(), MUST_HAPPEN)  # the deadline has passed
        tracer.mark("the deadline has passed; owner.cancel() twice, as a stop does")
        task.cancel()
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=LOOK)
        if done:
            raise RuntimeError("A12: the naive group ended past its deadline")
        tracer.mark(
            f"still in the group {LOOK} s later: it caught both cancels", bad=True, lane="owner"
        )
    tracer.mark("(the scenario releases the stubborn child)")
    release.set()
    await asyncio.wait([task], timeout=MUST_HAPPEN)
    if not task.done():
        raise RuntimeError("A12: the owner never left its group")
    failure = None if task.cancelled() else task.exception()
    ended = "cancelled" if task.cancelled() else repr(failure) if failure else "returned"
    tracer.mark(f"the owner ended {ended}")


def _a12_run(fixed: bool) -> Tracer:
    title = "StoppableTaskGroup.stop()" if fixed else "naive_run_group (asyncio.timeout)"
    tracer = Tracer(title, {"main": "main"}, tasks=True)
    run_async(lambda: _a12_main(tracer, fixed))
    return tracer


A12 = Scenario.of(
    "A12",
    _a12_run,
    "A child that swallows its cancel holds a TaskGroup: past asyncio.timeout's deadline, and "
    "through two more cancels, the naive owner still waits; StoppableTaskGroup.stop() returns "
    "on its own deadline and names the child.",
    "an asyncio task (all of them take turns in one thread, at each await)",
)


# The Python these runs are made on: A13 and A14 differ by version.
_PYTHON = f"Python {sys.version_info[0]}.{sys.version_info[1]}"
_FIXED_IN_ASYNCIO = sys.version_info >= (3, 13)


async def _a13_child(tracer: Tracer, ready: asyncio.Event) -> None:
    """The race tests' child whose cleanup fails: its ``finally`` raises."""
    task = asyncio.current_task()
    assert task is not None
    task.set_name("child")  # its lane, however the group named it
    del task
    tracer.mark("waits; its finally flushes a buffer")
    try:
        ready.set()
        await asyncio.Event().wait()
    finally:
        tracer.mark("cancelled: its finally fails, OSError('flush failed')")
        raise OSError("flush failed")


async def _a13_main(tracer: Tracer, fixed: bool) -> None:
    ready = asyncio.Event()

    async def owner() -> None:
        if fixed:
            tracer.mark("async with StoppableTaskGroup(), except* OSError around it")
            try:
                async with asyncio_shutdown.StoppableTaskGroup() as group:
                    group.create_task(_a13_child(tracer, ready))
            except* OSError as failures:
                tracer.mark(f"except* OSError: {len(failures.exceptions)} failure, handled")
        else:
            tracer.mark("naive_run_group_logging_failures: except* Exception around a TaskGroup")
            with log_as_marks(tracer, naive_asyncio_shutdown.__name__):
                await naive_asyncio_shutdown.naive_run_group_logging_failures(
                    [_a13_child(tracer, ready)]
                )
        try:
            await asyncio.sleep(0)  # the next await: a kept cancel is raised here
        except asyncio.CancelledError:
            tracer.mark("CancelledError at its next await: it stops, as asked")
            raise
        tracer.mark("goes on at its next await, as if nobody had asked it to stop", bad=True)

    task = asyncio.create_task(owner(), name="owner")
    await asyncio.wait_for(ready.wait(), MUST_HAPPEN)
    tracer.mark("owner.cancel(), as a stop does")
    task.cancel()
    await asyncio.wait([task], timeout=MUST_HAPPEN)
    if task.cancelled() != (fixed or _FIXED_IN_ASYNCIO):
        raise RuntimeError(f"A13 on {_PYTHON}: the owner did the unexpected")


def _a13_run(fixed: bool) -> Tracer:
    naive = "naive_run_group_logging_failures"
    title = f"{'StoppableTaskGroup' if fixed else naive}, {_PYTHON}"
    tracer = Tracer(title, {"main": "main"}, tasks=True)
    run_async(lambda: _a13_main(tracer, fixed))
    return tracer


A13 = Scenario.of(
    "A13",
    _a13_run,
    f"Drawn on {_PYTHON}. Cancelled while its child's cleanup fails, the naive owner gets an "
    "ExceptionGroup instead of the cancel; once except* has logged it, 3.11 and 3.12 let it "
    "go on (3.13 re-arms the cancel). StoppableTaskGroup re-arms it on every version.",
    "an asyncio task (all of them take turns in one thread, at each await)",
)


class _Stop(Exception):
    """The documented recipe's private exception: a child raises it to stop the group."""


async def _a14_main(tracer: Tracer, fixed: bool) -> None:
    ready, stop = asyncio.Event(), asyncio.Event()
    group = asyncio_shutdown.StoppableTaskGroup()

    async def idle() -> None:
        tracer.mark("runs until the group stops")
        ready.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            tracer.mark("cancelled by the group: ends")
            raise

    async def stopper() -> None:
        await stop.wait()
        tracer.mark("raises _Stop: the recipe's way to stop the group")
        raise _Stop

    async def owner() -> None:
        me = asyncio.current_task()
        assert me is not None
        if fixed:
            tracer.mark("async with StoppableTaskGroup(): its body ends at once")
            async with group:
                group.create_task(idle(), name="idle")
        else:
            tracer.mark("async with TaskGroup(), except* _Stop: its body ends at once")
            try:
                async with asyncio.TaskGroup() as plain:
                    plain.create_task(idle(), name="idle")
                    plain.create_task(stopper(), name="stopper")
            except* _Stop:
                pass
        counted = me.cancelling()
        if counted:
            tracer.mark(
                f"left the group; cancelling() is {counted}: a cancel nobody asked for is counted",
                bad=True,
            )
        else:
            tracer.mark("left the group; cancelling() is 0")

    task = asyncio.create_task(owner(), name="owner")
    await asyncio.wait_for(ready.wait(), MUST_HAPPEN)
    if fixed:
        tracer.mark("group.stop(): the recipe, and the group's own cancel taken back")
        if not (await group.stop(MUST_HAPPEN)).terminated:
            raise RuntimeError("A14: stop() did not end the group")
    else:
        tracer.mark("lets the stopper child raise, as the recipe does")
        stop.set()
    await asyncio.wait([task], timeout=MUST_HAPPEN)
    if not task.done() or task.cancelled():
        raise RuntimeError(f"A14 on {_PYTHON}: the owner did the unexpected")


def _a14_run(fixed: bool) -> Tracer:
    title = f"{'StoppableTaskGroup.stop()' if fixed else 'TaskGroup, the recipe'}, {_PYTHON}"
    tracer = Tracer(title, {"main": "main"}, tasks=True)
    run_async(lambda: _a14_main(tracer, fixed))
    return tracer


A14 = Scenario.of(
    "A14",
    _a14_run,
    f"Drawn on {_PYTHON}. Stopped by the recipe after its body ended, the group cancels its "
    "owner and, on 3.11 and 3.12, never takes the cancel back: cancelling() stays at 1 (0 on "
    "3.13). StoppableTaskGroup takes it back on every version.",
    "an asyncio task (all of them take turns in one thread, at each await)",
)
