"""Broken on purpose: the obvious ways to stop a child process (tests, docs, notebooks).

Each function is the naive counterpart of one in ``patterns.stoppable_process``; the docs
page shows them next to each other, and the tests make each one go wrong in a child
process. Do not copy these.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.queues
from collections.abc import Callable
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any


def naive_stop_process(process: BaseProcess) -> None:
    """Broken on purpose: SIGTERM's default action ends the child at once (M3).

    The child's ``finally`` blocks and `atexit` handlers never run: files half
    written, temporary files left, nothing flushed.
    """
    process.terminate()
    process.join()


def naive_close_queue(q: multiprocessing.queues.Queue[Any]) -> None:
    """Broken on purpose: ``close()`` does not stop the exit from waiting for the feeder (M4).

    At exit `multiprocessing` still joins the queue's feeder thread, which is blocked
    writing buffered items into a pipe that nobody reads.
    """
    q.close()


def naive_start_child(
    context: BaseContext, target: Callable[..., object], args: tuple[Any, ...]
) -> BaseProcess:
    """Broken on purpose: the child keeps the default SIGINT handler (M5).

    A Ctrl-C in the terminal reaches the whole foreground process group, so each
    child raises its own `KeyboardInterrupt` wherever it is, prints its own
    traceback, and its current item is lost.
    """
    process: BaseProcess = context.Process(target=target, args=args)  # type: ignore[attr-defined]
    process.start()
    return process


def naive_context() -> BaseContext:
    """Broken on purpose: ``fork`` copies locks held by other threads, held for ever (M6).

    It was the default start method on Linux up to 3.13.
    """
    return multiprocessing.get_context("fork")
