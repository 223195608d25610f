"""Broken on purpose: cancellation that does not stop the task, for tests, docs and notebooks.

`naive_crunch` and `naive_receive` are the naive counterparts of ``crunch`` and
``receive`` in ``patterns.cancellation``; `async_raise` is the forced way out that the
pattern exists to avoid (C3). The docs page shows each next to its fix. Do not copy these.
"""

from __future__ import annotations

import ctypes
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

from patterns.cancellation import CancelToken

logger = logging.getLogger(__name__)

T = TypeVar("T")


def naive_crunch(items: Iterable[T], step: Callable[[T], object], token: CancelToken) -> int:
    """Broken on purpose: the token is checked once, before the loop (C1).

    A cancel that arrives while the loop runs is never seen, so the task processes
    every item, however long that takes, and a pool shutdown waits for all of it.
    """
    token.check()
    done = 0
    for item in items:
        step(item)
        done += 1
    return done


def naive_receive(sock: socket.socket, token: CancelToken, bufsize: int = 4096) -> bytes:
    """Broken on purpose: checks the token, then blocks in ``recv`` with no way out (C2).

    A cancel that arrives while ``recv`` waits is not seen until data arrives or the
    peer closes the connection, which may be never.
    """
    token.check()
    return sock.recv(bufsize)


# --- The last resort: not part of the pattern (C3) ------------------------------------


def async_raise(thread: threading.Thread, exc_type: type[BaseException]) -> None:
    """Dangerous: schedule ``exc_type`` to be raised in another thread (C3).

    This calls CPython's ``PyThreadState_SetAsyncExc`` through `ctypes`, and it is the
    counterpart of Java's deprecated ``Thread.stop()``, with the same reasons to avoid
    it:

    * The exception is raised only when the target next runs Python bytecode. A thread
      blocked in C (``Event.wait()``, ``sock.recv()``, ``time.sleep()``, a lock) is not
      interrupted at all: it raises only after the call returns on its own.
    * It can land anywhere: inside a ``finally`` block or an ``__exit__`` method, cutting
      the cleanup short, or inside library code in the middle of updating shared state.
    * The target can catch it, in any broad ``except`` clause on its way out.
    * It is a CPython implementation detail, not part of the language.

    Use it in tests, debuggers and REPL tools, never to stop a task in production: use
    a `CancelToken`, or run uncooperative code in a process that can be killed.

    Raises:
        TypeError: ``exc_type`` is not an exception class.
        ValueError: ``thread`` was never started, has ended, or is unknown.
        SystemError: the C call reported more than one thread changed; the call is undone
            first, as the C-API documentation requires.
    """
    if not (isinstance(exc_type, type) and issubclass(exc_type, BaseException)):
        raise TypeError(f"exc_type must be an exception class, not {exc_type!r}")
    ident = thread.ident
    if ident is None or not thread.is_alive():
        raise ValueError(f"thread {thread.name!r} is not running")
    set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    changed = set_async_exc(ctypes.c_ulong(ident), ctypes.py_object(exc_type))
    if changed == 0:
        raise ValueError(f"thread {thread.name!r} (id {ident}) is unknown to the interpreter")
    if changed > 1:
        set_async_exc(ctypes.c_ulong(ident), None)  # NULL clears what was scheduled
        raise SystemError(f"PyThreadState_SetAsyncExc changed {changed} threads; undone")
    logger.warning("scheduled %s in thread %r", exc_type.__name__, thread.name)
