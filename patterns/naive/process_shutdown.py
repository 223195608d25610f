"""Broken on purpose: the obvious ways to stop a process pool (tests, docs, notebooks).

Each function is the naive counterpart of one in ``patterns.process_shutdown``; the docs
page shows them next to each other, and the tests make each one go wrong in a child
process. Do not copy these.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing.pool import AsyncResult, Pool
from typing import Any


def naive_stop_pool(executor: ProcessPoolExecutor) -> None:
    """Broken on purpose: ``shutdown()`` (and leaving ``with``) waits for every task (M1).

    A task that never returns keeps this call, and so the interpreter's exit, waiting
    for ever; ``cancel_futures=True`` would not help, it only cancels queued work.
    """
    executor.shutdown(wait=True)


def naive_collect(futures: list[Future[Any]]) -> list[Any]:
    """Broken on purpose: the first `BrokenProcessPool` ends the loop (M2).

    One dead worker fails every unfinished future; this raises at the first of them,
    and the results that did arrive, and which tasks were lost, go with it.
    """
    return [future.result() for future in futures]


def naive_apply_in_with(
    pool: Pool, fn: Callable[..., Any], args: tuple[Any, ...], then: Callable[[], object]
) -> AsyncResult[Any]:
    """Broken on purpose: leaving ``with Pool()`` calls ``terminate()``, not ``join()`` (M8).

    The tasks still running are killed with SIGTERM: their results never arrive and
    their ``finally`` blocks never run. A worker that ignores SIGTERM holds the exit
    of the block for ever (M11). ``then`` is the rest of the block's work.
    """
    with pool:
        result = pool.apply_async(fn, args)
        then()
    return result


def naive_close_pool(pool: Pool) -> None:
    """Broken on purpose: ``join()`` has no timeout: one stuck task holds the caller (M9)."""
    pool.close()
    pool.join()


def naive_map(
    pool: Pool,
    fn: Callable[[Any], Any],
    items: list[Any],
    then: Callable[[], object],
    timeout: float | None = None,
) -> list[Any]:
    """Broken on purpose: a worker killed mid-task leaves ``map()`` waiting for ever (M10).

    ``Pool.map`` is ``map_async(...).get()``, with no timeout. The pool replaces the
    dead worker, raises nothing and forgets the task. ``then`` runs while the tasks
    do; the tests pass a ``timeout`` to see the wait end.
    """
    result = pool.map_async(fn, items, chunksize=1)
    then()
    return result.get(timeout)
