"""Broken on purpose: the asyncio shutdown code that `patterns.asyncio_shutdown` replaces.

Each function shows a pitfall from docs/patterns/asyncio_shutdown.md; the tests make it
happen. Do not copy them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

T = TypeVar("T")

logger = logging.getLogger(__name__)


async def naive_retry_forever(step: Callable[[], Awaitable[object]], *, delay: float = 0.0) -> None:
    """Broken on purpose: ``except BaseException`` also catches the cancellation (A2).

    Cancelling the task raises `asyncio.CancelledError` inside ``step()``; the handler
    logs it as one more failure and loops, so the task never stops.
    """
    while True:
        try:
            await step()
        except BaseException:  # the bug: CancelledError is a BaseException
            logger.exception("step failed; retrying")
        await asyncio.sleep(delay)


async def naive_shutdown_tasks(tasks: list[asyncio.Task[Any]]) -> None:
    """Broken on purpose: cancel, then wait with no deadline (A7).

    A task that swallows its cancellation keeps ``gather`` waiting forever, and nothing
    says which task it is.
    """
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def naive_fire_and_forget(coro: Coroutine[Any, Any, object]) -> None:
    """Broken on purpose: start a task and drop the only reference to it (A3).

    The event loop keeps only weak references to tasks. A task waiting on a future that
    nothing else references is garbage: the next collection destroys it mid-flight
    ("Task was destroyed but it is pending!") and the rest of the coroutine never runs.
    """
    asyncio.get_running_loop().create_task(coro)


def naive_keep(coro: Coroutine[Any, Any, object], tasks: set[asyncio.Task[Any]]) -> None:
    """Broken on purpose: keep the task, never look at how it ended (A5).

    The reference saves the task from the collector, but its exception is never
    retrieved: nothing is logged while the program runs, and the "Task exception was
    never retrieved" message appears only when the set is finally emptied, if ever.
    """
    tasks.add(asyncio.get_running_loop().create_task(coro))


async def naive_run_blocking(fn: Callable[[], T]) -> T:
    """Broken on purpose: `asyncio.to_thread` cannot stop the thread it started (A4, A8).

    Cancelling the awaiting task ends the await at once, but ``fn`` keeps running in the
    default executor, nobody tells it to stop, and `asyncio.run` waits for it at exit.
    """
    return await asyncio.to_thread(fn)


async def naive_shielded_cleanup(cleanup: Awaitable[T]) -> T:
    """Broken on purpose: `asyncio.shield` alone around a cleanup (A10, A11).

    When the caller is cancelled, the await raises at once: the caller leaves while the
    cleanup still runs, nothing waits for it, `asyncio.run` cancels it at exit, and its
    exception reaches nobody ("Task exception was never retrieved" once it is freed).
    """
    return await asyncio.shield(cleanup)


async def naive_run_group(coros: Iterable[Coroutine[Any, Any, object]], timeout: float) -> None:
    """Broken on purpose: `asyncio.timeout` around a TaskGroup as its deadline (A12).

    At the deadline the group cancels its children and waits for them. A child that
    catches its cancel and goes on keeps it waiting, and the group catches every further
    cancel of this task while it waits: the deadline never ends anything.
    """
    async with asyncio.timeout(timeout), asyncio.TaskGroup() as group:
        for coro in coros:
            group.create_task(coro)


async def naive_run_group_logging_failures(coros: Iterable[Coroutine[Any, Any, object]]) -> None:
    """Broken on purpose on 3.11 and 3.12: ``except*`` around a TaskGroup can eat a stop (A13).

    If this task is cancelled while a child fails (a cleanup that raises), the group raises
    its `ExceptionGroup` instead of the `CancelledError`; 3.11 and 3.12 do not re-arm the
    cancel, so once the failures are logged the task goes on as if nobody had asked.
    """
    try:
        async with asyncio.TaskGroup() as group:
            for coro in coros:
                group.create_task(coro)
    except* Exception as failures:
        logger.exception("%d task(s) failed", len(failures.exceptions))
