"""Broken on purpose: the naive versions of ``patterns.daemon_threads`` (P15, P16, P25)."""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def naive_run_with_daemon(
    main: Callable[[], T], work: Callable[[threading.Event], object], *, name: str
) -> T:
    """Broken on purpose: work in a daemon thread is abandoned mid-work at exit (P15).

    Nothing ever sets the stop event. When ``main`` returns, the interpreter exits
    without waiting for the thread: its ``finally`` blocks never run, a file it was
    writing is left half-written, and the exit status is 0 all the same.
    """
    stopping = threading.Event()
    threading.Thread(target=work, args=(stopping,), name=name, daemon=True).start()
    return main()


def naive_run_with_atexit_stop(
    main: Callable[[], T], work: Callable[[threading.Event], object], *, name: str
) -> T:
    """Broken on purpose: an ``atexit`` handler cannot stop a non-daemon thread (P16).

    The interpreter joins every non-daemon thread before it runs any ``atexit`` handler,
    so the handler that would set the stop event waits for the thread, which waits for
    the event: the process hangs after ``main`` returns.
    """
    stopping = threading.Event()
    threading.Thread(target=work, args=(stopping,), name=name).start()
    atexit.register(stopping.set)
    return main()


def naive_stop_by_join(
    thread: threading.Thread, stopping: threading.Event, timeout: float
) -> tuple[bool, tuple[str, ...]]:
    """Broken on purpose: a stop whose report reads ``join()`` and ``is_alive()`` (P25).

    Returns ``(terminated, still_running)``. On 3.11 and 3.12 a Ctrl-C that interrupts
    ``thread.join()`` marks the thread as finished while it still runs (gh-90882), so
    the next call reports ``terminated=True`` and nothing still running: a lie.
    """
    stopping.set()
    thread.join(timeout)
    alive = thread.is_alive()
    return not alive, (thread.name,) if alive else ()
