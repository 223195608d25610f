"""Broken on purpose: the obvious ways to stop a `ThreadPoolExecutor` (tests, docs, notebooks).

Each function is the naive counterpart of one in ``patterns.executor_shutdown``; the
docs page shows them next to each other. Do not copy these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def naive_stop_then_close(executor: ThreadPoolExecutor, resource: Any) -> None:
    """Broken on purpose: `shutdown(wait=False)` does not wait, so closing races the tasks (P1)."""
    executor.shutdown(wait=False)
    resource.close()


def naive_shutdown_now(executor: ThreadPoolExecutor) -> None:
    """Broken on purpose: ``cancel_futures=True`` is not Java's ``shutdownNow()`` (P2).

    Running tasks go on running, and the cancelled tasks are not returned, so nobody can
    log or resubmit them.
    """
    executor.shutdown(wait=False, cancel_futures=True)


def naive_stop_and_wait(executor: ThreadPoolExecutor) -> None:
    """Broken on purpose: `shutdown(wait=True)` has no timeout, so a stuck task blocks it (P3)."""
    executor.shutdown(wait=True)


def naive_run_all(tasks: list[Callable[[], object]]) -> None:
    """Broken on purpose: the ``with`` block waits forever on a stuck task (P4).

    And the futures it drops hide every exception (P5).
    """
    with ThreadPoolExecutor(max_workers=4) as pool:
        for task in tasks:
            pool.submit(task)


def naive_finish_early(executor: ThreadPoolExecutor, steps: list[str]) -> None:
    """Broken on purpose: a task that waits for its own pool waits for itself (P6).

    ``shutdown(wait=True)`` joins every worker, this task's own thread among them, and
    raises `RuntimeError`; the rest of the task never runs.
    """
    steps.append("found the answer")
    executor.shutdown(wait=True)
    steps.append("cleaned up")


def naive_feed(executor: ThreadPoolExecutor, source: Iterator[Callable[[], object]]) -> int:
    """Broken on purpose: a submit after shutdown loses the task in hand (P7).

    The bare `RuntimeError` ends the loop, and the task is gone: not run, not returned,
    not logged.
    """
    submitted = 0
    for task in source:
        executor.submit(task)
        submitted += 1
    return submitted
