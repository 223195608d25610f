"""Stop a running task from another thread: the task has to cooperate, and a token is how.

TL;DR: pass a `CancelToken` to every task; the task calls ``token.check()`` in its loops,
``token.sleep()`` / ``token.wait()`` instead of `time.sleep` / `threading.Event.wait`, and
``token.on_cancel(...)`` to close the source of any other blocking call; the canceller
calls ``token.cancel(reason)`` and the task raises `Cancelled` at its next checkpoint.

Pitfall:
    No Python API stops a running thread (P2). A CPU loop that never looks at a stop flag
    runs to its end after the cancel, and ``shutdown(wait=True)``, a ``with`` block and
    interpreter exit all wait for it (C1). A flag cannot wake a call that is already
    blocked: ``sock.recv()`` or ``Event.wait()`` without a timeout waits for its data or
    its event, whatever the flag says (C2). The forced way out,
    ``PyThreadState_SetAsyncExc``, is no better: it waits for the blocking call too, and
    then it can land inside a ``finally`` block and cut the cleanup short (C3).

Pattern:
    Cooperative cancellation, as in Java's interruption and asyncio's ``Task.cancel``.
    The canceller calls `CancelToken.cancel`; the task reaches a checkpoint often:
    `CancelToken.check` between units of CPU work, `CancelToken.sleep` and
    `CancelToken.wait` for waiting, and `CancelToken.on_cancel` for any other blocking
    call, registering a callback that closes the thing the call waits on (shutting a
    socket down makes a blocked ``recv`` return at once). Every checkpoint raises
    `Cancelled`, a `BaseException`, so it runs the task's ``finally`` blocks on its way
    out and no ``except Exception:`` swallows it; the code that started the task (the
    task boundary) catches it.

Guarantees:
    * ``cancel()`` is idempotent and thread-safe: the first reason wins and exactly one
      call returns True.
    * When the winning ``cancel()`` returns, every thread blocked in ``sleep()`` or
      ``wait()`` has been woken, every later checkpoint raises, every callback registered
      with ``on_cancel()`` has run exactly once (in the cancelling thread), and every
      live child token is cancelled too.
    * A token never becomes un-cancelled, so a `Cancelled` swallowed by mistake is raised
      again at the task's next checkpoint.
    * A deadline needs no timer thread. It is checked lazily: ``sleep()`` and ``wait()``
      wake at the deadline, and any checkpoint or property that observes it first turns
      it into ``cancel("deadline exceeded")``, which runs the callbacks at that moment.
    * `crunch` stops within one ``step`` of a cancel; `receive` returns at once; `take`
      returns within one ``poll_interval``.

Python:
    3.11+, standard library only; checked on 3.11.7, 3.12.1 and 3.13.0, none of which
    can stop a running thread from outside. asyncio's ``Task.cancel`` is the built-in
    form of the same idea for coroutines and is also delivered only at checkpoints
    (``await``); `Cancelled` derives from `BaseException`, as
    ``asyncio.CancelledError`` does. The token's thread safety rests on its lock and
    events, not on the GIL, but it has not been run on the free-threaded build. The
    fenced-off ``async_raise`` uses a CPython C-API function through `ctypes`.

Java:
    ``Thread.interrupt()`` is `CancelToken.cancel`, ``isInterrupted()`` is
    `CancelToken.cancelled`, ``InterruptedException`` is `Cancelled`, ``Thread.sleep`` is
    `CancelToken.sleep`, and an interruptible channel that is closed when its thread is
    interrupted is a callback registered with `CancelToken.on_cancel`. Unlike Java's
    interrupt status, which is cleared when ``InterruptedException`` is thrown, a token
    stays cancelled. ``Thread.stop()`` (deprecated since Java 1.2, and throwing
    ``UnsupportedOperationException`` since JDK 20) is ``async_raise``, with the same
    reasons not to use it.

See also:
    ``executor_shutdown`` (its ``on_force`` hook is where a pool cancels the token its
    running tasks watch), ``thread_exceptions`` (reporting what a thread raised),
    ``exit_hooks`` (turning a signal into a cancel).
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import logging
import queue
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Self, TypeVar

__all__ = [
    "CancelToken",
    "Cancelled",
    "Registration",
    "crunch",
    "receive",
    "take",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEADLINE_EXCEEDED = "deadline exceeded"


class Cancelled(BaseException):
    """Raised at a checkpoint of a task whose token was cancelled (Java: InterruptedException).

    It derives from `BaseException`, not `Exception`, as trio's ``Cancelled`` and
    ``asyncio.CancelledError`` do: the ``except Exception:`` that a task uses to log
    and skip a bad item must not swallow a request to stop. The consequence is that the
    task boundary, the code that runs the task, catches `Cancelled` explicitly (and
    usually reports the task as stopped, not failed). A
    `concurrent.futures.ThreadPoolExecutor` needs nothing: it stores any
    `BaseException` in the task's future. A plain `threading.Thread` whose target lets
    it escape reports it through `threading.excepthook` like any other uncaught
    exception.

    Attributes:
        reason: why the token was cancelled, as given to `CancelToken.cancel` (or
            ``"deadline exceeded"``).
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

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()


class CancelToken:
    """A thread-safe, one-way "please stop" flag with a reason, an optional deadline and callbacks.

    ``CancelToken(timeout=5.0)`` is cancelled with reason ``"deadline exceeded"`` five
    seconds after it is created (measured with `time.monotonic`). No thread watches
    the deadline: it is observed lazily, by `wait` and `sleep` (whose waits end at the
    deadline) and by every checkpoint and property that reads the state. So the
    ``on_cancel`` callbacks and the children of a token whose deadline has passed run
    when the deadline is first observed, in the thread that observes it.

    Every method may be called from any thread. A token is never reset: make a new one
    (or a `child`) for the next piece of work.
    """

    def __init__(self, *, timeout: float | None = None) -> None:
        self._deadline = None if timeout is None else time.monotonic() + timeout
        # Guards _reason, _callbacks and _children. cancel() holds it to flip the state
        # exactly once and to take every callback and child it must notify;
        # on_cancel(), Registration.remove() and child() hold it to add or remove an
        # entry, so an entry is either taken by cancel() or removed, never both.
        # Never held while a callback runs, so a callback may use the token.
        self._lock = threading.Lock()
        # Set once, by the winning cancel(), with _lock held (so it is never set while
        # a callback is still registered). Waited on by wait() and sleep(), each wait
        # bounded by the deadline, which is how a deadline wakes them without a timer.
        self._cancelled = threading.Event()
        self._reason: str | None = None
        self._callbacks: dict[int, Callable[[], object]] = {}  # insertion = registration order
        self._keys = itertools.count()
        # Children are held weakly: a per-job token that nobody references any more is
        # forgotten (pruned in child()), so a long-lived parent does not grow.
        self._children: list[weakref.ref[CancelToken]] = []

    def __repr__(self) -> str:
        state = f"cancelled={self._reason!r}" if self._cancelled.is_set() else "active"
        return f"<CancelToken {state} deadline={self._deadline!r}>"

    def cancel(self, reason: str = "cancelled") -> bool:
        """Cancel the token; True only for the call that did it, False if it already was.

        The winning call wakes every waiter and then, in this thread and before it
        returns, runs the registered callbacks in registration order and cancels the
        live children with the same reason. A callback that raises an `Exception` is
        logged at ERROR with its traceback and the others still run; nothing propagates
        to the caller (a `KeyboardInterrupt` or other `BaseException` does propagate,
        as from any call). Callbacks should be quick: ``cancel()`` waits for them.
        """
        with self._lock:
            if self._reason is not None:
                return False
            self._reason = reason
            self._cancelled.set()
            callbacks = list(self._callbacks.values())
            self._callbacks.clear()
            children = [child for ref in self._children if (child := ref()) is not None]
            self._children.clear()
        for callback in callbacks:
            _run_callback(callback)
        for child in children:
            child.cancel(reason)
        return True

    @property
    def cancelled(self) -> bool:
        """Whether the token is cancelled; a passed deadline cancels it here and now."""
        if self._cancelled.is_set():
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

        Meant as the timeout of a blocking call that takes no token, so that the call at
        least ends by the deadline, as in ``sock.settimeout(token.remaining())`` (which
        `receive` does). It does not make the call end on a cancel: `on_cancel` does.
        """
        if self.cancelled:
            return 0.0
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - time.monotonic())

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the token is cancelled, its deadline passes, or ``timeout`` runs out.

        Returns True if the token is cancelled, False if ``timeout`` ran out first. Never
        raises `Cancelled`: use it where stopping is a normal outcome, such as an idle
        loop's ``while not token.wait(poll_interval): ...``.
        """
        until = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while not self.cancelled:  # observes the deadline on every turn
            now = time.monotonic()
            if until is not None and now >= until:
                return False
            ends = _earliest(until, self._deadline)
            # Re-checked by the loop, so a wait that ends a hair early is harmless.
            self._cancelled.wait(None if ends is None else max(0.0, ends - now))
        return True

    def sleep(self, seconds: float) -> None:
        """Sleep like `time.sleep`, but raise `Cancelled` as soon as the token is cancelled.

        A deadline that passes during the sleep also raises. ``sleep(0)`` is a plain
        checkpoint. Raises `ValueError` for a negative length, as `time.sleep` does.
        """
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        if self.wait(seconds):
            raise Cancelled(self._reason or "cancelled")

    def check(self) -> None:
        """Raise `Cancelled` if the token is cancelled; the checkpoint for CPU loops."""
        if self.cancelled:
            raise Cancelled(self._reason or "cancelled")

    def on_cancel(self, callback: Callable[[], object]) -> Registration:
        """Run ``callback()`` once when the token is cancelled; at once if it already is.

        This is how a blocking call that takes no token is made interruptible: register
        a callback that closes what the call waits on, for example
        ``token.on_cancel(lambda: sock.shutdown(socket.SHUT_RDWR))`` around a ``recv``.
        Use the returned `Registration` as a context manager so the callback is removed
        once the blocking call is over. Exceptions from the callback are logged, as in
        `cancel`.
        """
        if not self.cancelled:
            with self._lock:
                if self._reason is None:
                    key = next(self._keys)
                    self._callbacks[key] = callback
                    return Registration(self, key)
        _run_callback(callback)
        return Registration(self, None)

    def child(self, *, timeout: float | None = None) -> CancelToken:
        """A new token that is cancelled, with the same reason, when this one is.

        Cancelling the child does not touch the parent. The child's deadline is the
        earlier of its own ``timeout`` and the parent's deadline. The parent holds its
        children weakly, so a child that is no longer referenced is simply forgotten.
        A worker can hold one token and hand each job ``worker_token.child()``.
        """
        child = CancelToken(timeout=timeout)
        child._deadline = _earliest(child._deadline, self._deadline)
        if not self.cancelled:
            with self._lock:
                if self._reason is None:
                    self._children = [ref for ref in self._children if ref() is not None]
                    self._children.append(weakref.ref(child))
                    return child
        child.cancel(self._reason or "cancelled")
        return child

    def _unregister(self, key: int) -> bool:
        with self._lock:
            return self._callbacks.pop(key, None) is not None


def _earliest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _run_callback(callback: Callable[[], object]) -> None:
    try:
        callback()
    except Exception:
        logger.exception("on_cancel callback %r raised; the other callbacks still run", callback)


# --- CPU-bound work: a checkpoint per unit of work (C1) ------------------------------------


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


def naive_receive(sock: socket.socket, token: CancelToken, bufsize: int = 4096) -> bytes:
    """Broken on purpose: checks the token, then blocks in ``recv`` with no way out (C2).

    A cancel that arrives while ``recv`` waits is not seen until data arrives or the
    peer closes the connection, which may be never.
    """
    token.check()
    return sock.recv(bufsize)


def receive(sock: socket.socket, token: CancelToken, bufsize: int = 4096) -> bytes:
    """Receive up to ``bufsize`` bytes, or raise `Cancelled` at once when the token is cancelled.

    While ``recv`` waits, a callback registered with `CancelToken.on_cancel` stands
    ready to shut the socket down in both directions, which makes the blocked ``recv``
    return at once. The token's deadline, if any, bounds the wait as a socket timeout
    (the previous timeout is restored). A cancel ends the conversation: once `receive`
    has raised `Cancelled`, the socket is shut down, or is being shut down by the
    cancelling thread. If a cancel races with arriving data, the data may be returned
    and the socket shut down just after; the next call then raises `Cancelled`.
    """
    previous_timeout = sock.gettimeout()
    with token.on_cancel(functools.partial(_shut_down, sock)):
        token.check()  # already cancelled: the callback has just run; do not block
        sock.settimeout(token.remaining())  # None without a deadline
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

    Java's ``BlockingQueue.take()``, which throws on interrupt. A plain `queue.Queue`
    has nothing a callback could close, so the wait is cut into ``get(timeout=...)``
    slices with a checkpoint between them (each slice also ends at the token's
    deadline). Do not make ``get()`` interruptible by putting a sentinel from an
    `CancelToken.on_cancel` callback instead: callbacks run inside ``cancel()``, and a
    blocking ``put`` on a full queue hangs the canceller.
    """
    if poll_interval <= 0:
        raise ValueError("poll_interval must be positive")
    while True:
        token.check()
        remaining = token.remaining()
        try:
            return q.get(
                timeout=poll_interval if remaining is None else min(poll_interval, remaining)
            )
        except queue.Empty:
            continue  # a slice ended: look at the token again


# --- Last resort, fenced off: not part of the pattern (C3) ----------------------------


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
