"""Broken on purpose: the naive code that `patterns.bulkhead` replaces (B1 to B5).

Each function shows one pitfall; the tests make it go wrong under a forced interleaving,
and the docs page shows it next to the fix. Do not copy these. Docs: docs/patterns/bulkhead.md
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

# A WSGI application (``wsgiref.types.WSGIApplication`` has the full shape).
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def naive_offload(app: WSGIApp, executor: ThreadPoolExecutor) -> WSGIApp:
    """Broken on purpose: an unbounded executor lets a burst take every server thread (B1).

    The executor bounds how many requests run, not how many wait: its queue has no limit,
    so each request thread parks in ``result()``, with no timeout, until a pool worker is
    free. During a burst on this route no thread is left for any other route.
    """

    def offloaded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        return executor.submit(app, environ, start_response).result()

    return offloaded


def naive_call_with_timeout(executor: ThreadPoolExecutor, fn: Callable[[], T], timeout: float) -> T:
    """Broken on purpose: the caller leaves at its timeout, but its job stays (B2).

    A job still queued runs later anyway, for nobody; one already running keeps its
    worker, and if it fails no one sees it. Nothing records either.
    """
    return executor.submit(fn).result(timeout)


def naive_try_enqueue(jobs: queue.Queue[T], job: T) -> bool:
    """Broken on purpose: ``queue.Queue(maxsize=0)`` is unbounded, so it never refuses (B3).

    Bounded admission through ``put_nowait`` works for a size of 1 or more; for a "size 0"
    hand-off it accepts every job, however busy the workers are.
    """
    try:
        jobs.put_nowait(job)
    except queue.Full:
        return False
    return True


def naive_close(executor: ThreadPoolExecutor) -> None:
    """Broken on purpose: ``shutdown(wait=False)`` leaves queued callers waiting (B4).

    Their work is not released: it still runs after the "close", and their callers wait
    until it has, or until their own timeout.
    """
    executor.shutdown(wait=False)


def naive_run_and_count(fn: Callable[[], T], future: Future[T], counts: dict[str, int]) -> None:
    """Broken on purpose: the result is released before it is counted (B5).

    This is the seed's order. Whoever wakes on the future (its done-callbacks, a caller
    in ``result()``) can read the counter before the increment and not find its own call.
    """
    try:
        future.set_result(fn())
    finally:
        counts["processed"] += 1
