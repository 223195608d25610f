# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""Stop a running task from another thread: the task has to cooperate, and a token is how.

TL;DR: pass a `CancelToken` to every task; the task calls ``token.check()`` in its loops,
``token.sleep()`` / ``token.wait()`` instead of `time.sleep` / `threading.Event.wait`, and
``token.on_cancel(...)`` to close the source of any other blocking call; the canceller
calls ``token.cancel(reason)`` and the task raises `Cancelled` at its next checkpoint.

Guarantees:
    * ``cancel()`` is idempotent and thread-safe: the first reason wins and exactly one
      call returns True.
    * When the winning ``cancel()`` returns, every thread blocked in ``sleep()`` or
      ``wait()`` has been woken, every later checkpoint raises, every ``on_cancel()``
      callback has run exactly once (in the cancelling thread), and every live child
      token is cancelled too, whatever a callback raised: each exception is logged, and
      a KeyboardInterrupt or SystemExit is raised again once all that is done. A token
      never becomes un-cancelled.
    * Every number of seconds (``timeout``, ``seconds``, ``poll_interval``) is checked:
      nan, negative, a bool or a string is a `ValueError` naming it; inf and huge values
      mean as long as it takes and never raise `OverflowError`.
    * A deadline needs no timer thread: it is observed lazily, by ``sleep()``, ``wait()``
      and every checkpoint, and the first observer turns it into
      ``cancel("deadline exceeded")``.
    * `crunch` stops within one ``step`` of a cancel; `receive` returns at once; `take`
      returns within one ``poll_interval``.

Python:
    3.11+, standard library only; checked on 3.11.7, 3.12.1 and 3.13.0, none of which can
    stop a running thread from outside. `Cancelled` is a `BaseException`, as
    ``asyncio.CancelledError`` is. Not yet run on the free-threaded build.

Docs: docs/patterns/cancellation.md
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import queue
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Self, TypeVar

__all__ = ["CancelToken", "Cancelled", "Registration", "crunch", "receive", "take"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEADLINE_EXCEEDED = "deadline exceeded"


# child() prunes its list of weak references once it reaches this length, then at twice the
# live children left: the list stays under 2 * live + 16 entries, pruned O(1) per child.
_PRUNE_AT = 16


class Cancelled(BaseException):
    """Raised at a checkpoint of a task whose token was cancelled (Java: InterruptedException).

    A `BaseException`, as ``asyncio.CancelledError`` is, so that the ``except Exception:``
    that logs and skips a bad item cannot swallow a request to stop; the task boundary
    catches it explicitly. ``reason`` is the token's reason (``"deadline exceeded"``).
    """

    def __init__(self, reason: str = "cancelled") -> None:
        super().__init__(reason)
        self.reason = reason


class Registration:
    """A callback registered with `CancelToken.on_cancel`; also a context manager.

    Leaving the ``with`` block, or calling `remove`, unregisters the callback. A
    callback that has already run, or is running in the cancelling thread, is not
    waited for.
    """

    def __init__(self, token: CancelToken, key: int | None) -> None:
        self._token = token
        self._key = key  # None: the callback ran at registration, nothing to remove

    def remove(self) -> bool:
        """Unregister the callback; True if it had not run and now never will."""
        if self._key is None:
            return False
        return self._token._unregister(self._key)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()


class CancelToken:
    """A thread-safe, one-way "please stop" flag with a reason, an optional deadline and callbacks.

    ``CancelToken(timeout=5.0)`` cancels itself ("deadline exceeded") five seconds after
    it is made, observed lazily: the callbacks and children of a token whose deadline
    passed run in the first thread that observes it. Every method may be called from any
    thread. A token is never reset: make a new one (or a `child`) for the next job.
    """

    def __init__(self, *, timeout: float | None = None) -> None:
        # A float, inf included (never handed to a C wait as it is: see _left).
        self._deadline = (
            None if timeout is None else time.monotonic() + _seconds(timeout, "timeout")
        )
        # Guards _reason, _callbacks and _children. cancel() holds it to flip the state
        # exactly once and to take every callback and child it must notify;
        # on_cancel(), Registration.remove() and child() hold it to add or remove an
        # entry, so an entry is either taken by cancel() or removed, never both.
        # Never held while a callback runs, so a callback may use the token.
        self._lock = threading.Lock()
        # Made by the first wait() (under _lock; set at once if already cancelled), so a
        # token nobody waits on costs no Event. Set once, by the winning cancel(), with
        # _lock held (so it is never set while a callback is still registered). Waited
        # on by wait() and sleep(), each wait bounded by the deadline, which is how a
        # deadline wakes them without a timer.
        self._cancelled: threading.Event | None = None
        self._reason: str | None = None
        self._callbacks: dict[int, Callable[[], object]] = {}  # insertion = registration order
        self._keys = itertools.count()
        # Children are held weakly: a per-job token that nobody references any more is
        # forgotten (pruned in child(), now and then), so a long-lived parent does not grow.
        self._children: list[weakref.ref[CancelToken]] = []
        self._prune_at = _PRUNE_AT  # child() drops the dead references at this length

    def __repr__(self) -> str:
        state = f"cancelled={self._reason!r}" if self._reason is not None else "active"
        return f"<CancelToken {state} deadline={self._deadline!r}>"

    def cancel(self, reason: str = "cancelled") -> bool:
        """Cancel the token; True only for the call that did it, False if it already was.

        The winning call wakes every waiter, then, in this thread, runs the callbacks in
        registration order and cancels the live children with the same reason. Whatever
        a callback raises (an `Exception`, another token's `Cancelled`) is logged and the
        rest still run; a KeyboardInterrupt or SystemExit, from a callback or a child's,
        is raised again once every callback has run and every child is cancelled. Keep
        callbacks quick.
        """
        with self._lock:
            if self._reason is not None:
                return False
            self._reason = reason
            if self._cancelled is not None:
                self._cancelled.set()
            callbacks = list(self._callbacks.values())
            self._callbacks.clear()
            children = [child for ref in self._children if (child := ref()) is not None]
            self._children.clear()
        _notify(callbacks, children, reason)  # outside the lock: a callback may use the token
        return True

    @property
    def cancelled(self) -> bool:
        """Whether the token is cancelled; a passed deadline cancels it here and now."""
        if self._reason is not None:  # set once, under _lock, by the winning cancel()
            return True
        if self._deadline is not None and time.monotonic() >= self._deadline:
            self.cancel(DEADLINE_EXCEEDED)
            return True
        return False

    @property
    def reason(self) -> str | None:
        """The winning reason, ``"deadline exceeded"`` for a deadline, None while active."""
        return self._reason if self.cancelled else None  # observing may cancel it

    @property
    def deadline(self) -> float | None:
        """The deadline as a `time.monotonic` timestamp, or None for no deadline."""
        return self._deadline

    def remaining(self) -> float | None:
        """Seconds left before the deadline: 0.0 once cancelled, None if neither applies.

        The timeout for a blocking call that takes no token (``sock.settimeout(...)``).
        """
        if self.cancelled:
            return 0.0
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - time.monotonic())

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the token is cancelled, its deadline passes, or ``timeout`` runs out.

        True if the token is cancelled, False if ``timeout`` ran out first. Never raises
        `Cancelled`: ``while not token.wait(poll_interval): ...`` is an idle loop.
        """
        until = time.monotonic() + _seconds(timeout, "timeout", allow_none=True)
        while not self.cancelled:  # observes the deadline on every turn
            now = time.monotonic()
            if now >= until:
                return False
            ends = min(until, math.inf if self._deadline is None else self._deadline)
            # Re-checked by the loop, so a wait that ends early (capped) is harmless.
            self._event().wait(_left(ends))
        return True

    def sleep(self, seconds: float) -> None:
        """Sleep like `time.sleep`, but raise `Cancelled` as soon as the token is cancelled.

        A deadline that passes during the sleep also raises. ``sleep(0)`` is a plain
        checkpoint. Raises `ValueError` for a negative length, as `time.sleep` does.
        """
        if self.wait(_seconds(seconds, "seconds")):
            raise Cancelled(self._reason or "cancelled")

    def check(self) -> None:
        """Raise `Cancelled` if the token is cancelled; the checkpoint for CPU loops."""
        if self.cancelled:
            raise Cancelled(self._reason or "cancelled")

    def on_cancel(self, callback: Callable[[], object]) -> Registration:
        """Run ``callback()`` once when the token is cancelled; at once if it already is.

        Makes a blocking call interruptible: the callback closes what the call waits on,
        as in ``with token.on_cancel(lambda: sock.shutdown(socket.SHUT_RDWR)):`` around a
        ``recv``. Leaving the ``with`` block removes the callback. If it runs here, what
        it raises is logged, and a KeyboardInterrupt or SystemExit raised again.
        """
        if not self.cancelled:
            with self._lock:
                if self._reason is None:
                    key = next(self._keys)
                    self._callbacks[key] = callback
                    return Registration(self, key)
        _notify([callback], [], "")
        return Registration(self, None)

    def child(self, *, timeout: float | None = None) -> CancelToken:
        """A new token that is cancelled, with the same reason, when this one is.

        Cancelling the child does not touch the parent; its deadline is the earlier of
        ``timeout`` and the parent's. Held weakly by the parent, so unused children go.
        """
        child = CancelToken(timeout=timeout)
        if self._deadline is not None:
            child._deadline = _earliest(child._deadline, self._deadline)
        # As `cancelled` answers, without its call while no deadline can have passed (a
        # worker makes a child for every job).
        if self._reason is None and (self._deadline is None or not self.cancelled):
            with self._lock:
                if self._reason is None:
                    if len(self._children) >= self._prune_at:  # amortised: O(1) per child
                        self._children = [ref for ref in self._children if ref() is not None]
                        self._prune_at = max(_PRUNE_AT, 2 * len(self._children))
                    self._children.append(weakref.ref(child))
                    return child
        child.cancel(self._reason or "cancelled")
        return child

    def _event(self) -> threading.Event:
        """The Event that cancel() sets: made on the first wait, set if already cancelled."""
        event = self._cancelled
        if event is None:
            with self._lock:
                if self._cancelled is None:
                    self._cancelled = threading.Event()
                    if self._reason is not None:
                        self._cancelled.set()
                event = self._cancelled
        return event

    def _unregister(self, key: int) -> bool:
        with self._lock:
            return self._callbacks.pop(key, None) is not None


# --- CPU-bound work: a checkpoint per unit of work (C1) ------------------------------------


def crunch(items: Iterable[T], step: Callable[[T], object], token: CancelToken) -> int:
    """Call ``step(item)`` for each item, stopping within one step of a cancel (the fix for C1).

    Returns the number of items processed, or raises `Cancelled` before starting the
    next item once the token is cancelled (or its deadline has passed). The step that
    is running when the cancel comes is finished, never interrupted.
    """
    done = 0
    for item in items:
        token.check()  # a checkpoint per item: a cancel is seen within one step
        step(item)
        done += 1
    return done


# --- a blocking call: close its source on cancel (C2) --------------------------------------


def receive(sock: socket.socket, token: CancelToken, bufsize: int = 4096) -> bytes:
    """Receive up to ``bufsize`` bytes, or raise `Cancelled` at once when the token is cancelled.

    A cancel shuts the socket down in both directions, which ends a blocked ``recv`` and
    the conversation; the token's deadline bounds the wait as a socket timeout. Data that
    races a cancel may be returned; the next call then raises `Cancelled`.
    """
    previous_timeout = sock.gettimeout()
    with token.on_cancel(functools.partial(_shut_down, sock)):
        token.check()  # already cancelled: the callback has just run; do not block
        remaining = token.remaining()  # None without a deadline; inf for an endless one
        endless = remaining is None or remaining >= threading.TIMEOUT_MAX
        sock.settimeout(None if endless else remaining)
        try:
            data = sock.recv(bufsize)
        except OSError:  # a timeout is the deadline; anything else after a cancel is ours
            token.check()
            raise
        finally:
            sock.settimeout(previous_timeout)
        token.check()  # woken by the shutdown: report the cancel, not an empty read
    return data


def _shut_down(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed or never connected: nothing is blocked in it
        logger.debug("shutdown of %r on cancel failed", sock, exc_info=True)


# --- a queue: poll with a timeout, never put a pill from a callback -------------------------


def take(q: queue.Queue[T], token: CancelToken, *, poll_interval: float = 0.05) -> T:
    """Get an item from ``q``, or raise `Cancelled` within ``poll_interval`` of a cancel.

    Java's ``BlockingQueue.take()``. A `queue.Queue` has nothing a callback could close,
    so the wait is cut into ``get(timeout=...)`` slices with a checkpoint between them.
    Never put a sentinel from an ``on_cancel`` callback instead: on a full queue the
    ``put`` blocks, and so does ``cancel()``.
    """
    interval = _seconds(poll_interval, "poll_interval")
    if interval == 0:
        raise ValueError("poll_interval must be positive, not 0")
    while True:
        token.check()
        remaining = token.remaining()
        try:
            # Halved: Queue.get adds the timeout to time.time() and subtracts it again,
            # and the rounding could take TIMEOUT_MAX itself past the limit.
            wait = interval if remaining is None else min(interval, remaining)
            return q.get(timeout=min(wait, threading.TIMEOUT_MAX / 2))
        except queue.Empty:
            continue  # a slice ended: look at the token again


# --- the lifecycle contract: seconds, deadlines, contained callbacks -------------------------
#
# The seconds family is the same code in every module that holds it (tests/test_copies.py):
# a module is copied alone, so it cannot import it.


def _seconds(value: object, name: str, *, allow_none: bool = False) -> float:
    """``value`` as seconds; inf, a huge number (and None, if allowed) mean as long as it takes."""
    if value is None and allow_none:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return math.inf if value > sys.float_info.max else float(value)


def _left(deadline: float) -> float:
    """Seconds until ``deadline`` for a C wait: never negative, never above TIMEOUT_MAX."""
    return min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)


def _earliest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _notify(
    callbacks: list[Callable[[], object]], children: list[CancelToken], reason: str
) -> None:
    """Run every callback, then cancel every child; raise the first exit once all are done."""
    exits: list[BaseException] = []
    for callback in callbacks:
        _run_callback(callback, exits)
    for child in children:
        try:
            child.cancel(reason)
        except BaseException as exc:  # noqa: BLE001 - its callbacks logged it; raised below
            exits.append(exc)
    if exits:
        raise exits[0]


def _run_callback(callback: Callable[[], object], exits: list[BaseException]) -> None:
    """Run one callback; log anything it raises, keep an exit for the caller to raise."""
    try:
        callback()
    except BaseException as exc:  # contained: every other callback and child still runs
        logger.exception("on_cancel callback %r raised; the other callbacks still run", callback)
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            exits.append(exc)
