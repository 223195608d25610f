# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""What runs when a Python program exits, and the way out that skips it on purpose.

TL;DR: `register_exit_hook` registers an `atexit` handler that still has logging and whose
failure is logged with its traceback. `force_exit` is the one sanctioned `os._exit`: it logs
why, flushes logging and stdio within a bound, and exits with the status it is given.

Guarantees:
    * A hook registered with `register_exit_hook` runs before `logging.shutdown`, and its
      failure is logged with its traceback; the exit status stays what it was.
    * `force_exit` ends the process with its status within ``flush_timeout`` (0.5 s by
      default) plus scheduling noise, whatever other threads do; output and log lines
      written before it are flushed unless a stream blocks longer than that.

Python:
    3.11+; checked on 3.11.7, 3.12.1 and 3.13.0. 3.12.1 refuses threads in `atexit`
    handlers (:gh:`104690`, fixed in 3.12.3 by :gh:`113964`), so there `force_exit` exits
    without its flush.

Docs: docs/patterns/exit_hooks.md (the exit sequence, which endings skip it, the Java
counterpart). Turning SIGTERM into an orderly exit is signal_handlers.py.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

__all__ = ["FORCE_FLUSH_TIMEOUT", "force_exit", "register_exit_hook"]

logger = logging.getLogger(__name__)

#: Seconds `force_exit` spends flushing logging and stdio before it calls `os._exit`.
FORCE_FLUSH_TIMEOUT = 0.5


def register_exit_hook(hook: Callable[[], object]) -> Callable[[], None]:
    """Run ``hook`` at interpreter exit, before `logging.shutdown`, and log it if it fails.

    `atexit` runs handlers newest first. `logging` registered its shutdown handler when it
    was first imported, which was before this module finished importing, so ``hook`` runs
    while logging still works; after it, a ``FileHandler`` in mode ``'w'`` would drop the
    line (P21). A failure is logged with its traceback instead of the bare "Exception
    ignored in atexit callback" on stderr; either way the exit status stays what it was
    (P20). Keep hooks quick: each one delays the exit.

    Returns the function actually registered, for `atexit.unregister`.
    """

    def run_hook() -> None:
        try:
            hook()
        except Exception:
            logger.exception("exit hook %r failed", hook)

    atexit.register(run_hook)
    return run_hook


# --- the way out that skips the exit sequence on purpose ------------------------------------
#
# force_exit and _log_and_flush are the same code in signal_handlers.py, whose second signal
# calls them (a module is copied alone); pinned by tests/test_copies.py.


def force_exit(
    status: int, reason: str = "forced exit", *, flush_timeout: float = FORCE_FLUSH_TIMEOUT
) -> NoReturn:
    """Log ``reason``, flush logging and stdio for at most ``flush_timeout`` s, `os._exit`.

    The flush runs in a helper thread, because a stream can block and the exit must not
    wait for it (P19). Where no thread can be started (during finalization; in an `atexit`
    handler on 3.12.1) it exits without the flush.
    """
    budget = _seconds(flush_timeout, "flush_timeout")
    if sys.is_finalizing():
        # No thread can start now: 3.12+ raise, and on 3.11 Thread.start() waits forever
        # for a thread that cannot get going. Exit without the flush.
        os._exit(status)
    flusher = threading.Thread(
        target=_log_and_flush, args=(status, reason), name="force-exit-flush", daemon=True
    )
    try:
        flusher.start()
    except RuntimeError:  # 3.12.0-3.12.2 refuse new threads in atexit handlers (gh-104690)
        os._exit(status)
    flusher.join(min(budget, threading.TIMEOUT_MAX))  # not interrupted: nothing to trust
    os._exit(status)


def _log_and_flush(status: int, reason: str) -> None:
    stuck = [
        t.name
        for t in threading.enumerate()
        if not t.daemon and t is not threading.current_thread() and t.is_alive()
    ]
    logger.critical(
        "%s: exiting now with status %d, skipping finally blocks and atexit handlers "
        "(non-daemon threads still running: %s)",
        reason,
        status,
        ", ".join(stuck) or "none",
    )
    logging.shutdown()  # flushes and closes every handler
    for stream in (sys.stdout, sys.stderr):
        # None without a console, a broken pipe, or already closed: nothing to save.
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()


# --- the lifecycle contract: seconds -------------------------------------------------------
#
# The seconds family, the same code in every pattern module that holds it; pinned by
# tests/test_copies.py. force_exit's budget is its one number of seconds.


def _seconds(value: object, name: str, *, allow_none: bool = False) -> float:
    """A number of seconds >= 0 as a float; ``math.inf`` means "as long as it takes"."""
    if value is None and allow_none:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return math.inf if value > sys.float_info.max else float(value)  # 10**400: no overflow
