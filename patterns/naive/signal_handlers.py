"""Broken on purpose: the textbook signal handling that `patterns.signal_handlers` replaces.

Each function here shows a pitfall from docs/patterns/signal_handlers.md; the tests make it
happen in a child process. Do not copy them.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType

logger = logging.getLogger(__name__)


def naive_install_stop_handler(on_stop: Callable[[], object]) -> None:
    """Broken on purpose: the textbook handler calls ``on_stop`` in the main thread (E1, P22, P24).

    It runs between two bytecodes of whatever the main thread is doing: if that is
    ``stop.wait()`` and ``on_stop`` is ``stop.set``, it waits forever for the event's
    lock, which its own thread holds (E1). It runs only when the main thread runs
    bytecode, so a signal taken by another thread (aimed at it with
    ``signal.pthread_kill``, or handed to it because the main thread blocks the signal)
    leaves a main thread blocked in ``Event.wait()`` asleep (P22). Every signal calls
    ``on_stop`` again, and nothing forces the exit (P24). The previous handlers are lost.
    """

    def handler(signum: int, frame: FrameType | None) -> None:
        on_stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def naive_run_until_interrupted(
    work: Callable[[threading.Event], object], *, cleanup: Callable[[], object] | None = None
) -> None:
    """Broken on purpose: the textbook Ctrl-C loop (P18, P24).

    SIGTERM is not handled, so ``docker stop`` or Kubernetes ends the process with no
    cleanup at all (P18). Ctrl-C raises `KeyboardInterrupt` in the main thread and starts
    the graceful path; a second Ctrl-C raises again inside the drain, so the cleanup is
    skipped, and a stuck non-daemon worker then holds interpreter exit (P24). (It waits on
    an event rather than ``worker.join()``: before 3.13 a Ctrl-C that interrupts
    ``join()`` marks the thread as finished while it still runs, gh-90882.)
    """
    stop = threading.Event()  # set on the first Ctrl-C; work watches it
    done = threading.Event()  # set by the worker when work returns; the main thread waits on it

    def body() -> None:
        work(stop)
        done.set()

    worker = threading.Thread(target=body, name="worker")
    worker.start()
    try:
        done.wait()
    except KeyboardInterrupt:
        logger.warning("interrupted: stopping gracefully")
        stop.set()
        done.wait()  # the graceful drain: where the second Ctrl-C lands
    if cleanup is not None:
        cleanup()
