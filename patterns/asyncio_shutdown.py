# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""Stop coroutines on a deadline: cancel, wait, and say which tasks would not stop.

TL;DR: ``report = await shutdown_tasks(tasks, timeout=5)`` cancels every task and waits at
most ``timeout``; ``async with TaskSet() as tasks: tasks.spawn(coro)`` keeps background
tasks alive and logs their failures; ``await run_until_signalled(work, drain_timeout=10)``
turns SIGTERM or SIGINT into a graceful stop and a second signal into an exit with status
``128 + signum``; ``await run_in_thread(fn)`` runs ``fn(token)`` in a thread and sets
``token`` when the awaiting task is cancelled.

Guarantees:
    * `shutdown_tasks` returns within ``timeout`` (plus scheduling noise) whatever the tasks
      do, never raises for a task that failed or would not stop, and names every task in
      exactly one of ``finished``, ``failed``, ``cancelled`` and ``still_running``.
    * A task spawned by a `TaskSet` is strongly referenced until it ends, so the garbage
      collector cannot destroy it mid-flight; its failure is logged at ERROR, with its
      name, when it happens, so "Task exception was never retrieved" never appears.
    * `TaskSet.stop` keeps the lifecycle contract: bounded by its caller's budget, the same
      report object once one stop has completed, and it refuses new tasks from its first
      call. From one of the set's own tasks it is a request that returns at once.
    * `AsyncSignalHandlers` puts back, when stopped, the loop's own handler for a signal if
      the loop had one (an outer `AsyncSignalHandlers`), else the exact previous Python
      handler.
    * Every number of seconds is checked: ``math.inf`` means as long as it takes; nan, a
      negative number, a bool or a string is a `ValueError` naming the argument.
    * When the task awaiting `run_in_thread` is cancelled, the token is set, the task waits
      at most ``cancel_timeout`` for ``fn`` to return, and a ``fn`` that does not is logged.

Python:
    3.11+ (``Task.cancelling``/``uncancel``, `asyncio.TaskGroup`, `asyncio.timeout`), POSIX
    for the signal handlers; checked on 3.11.7, 3.12.1 and 3.13.0. At exit `asyncio.run`
    waits for the default executor's threads: with no limit on 3.11.7 and 3.12.1, for at
    most 300 s on 3.13.0 (after which the interpreter's own exit still waits for them).

Docs: docs/patterns/asyncio_shutdown.md
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, Self, TypeVar

__all__ = [
    "DEFAULT_CANCEL_TIMEOUT",
    "DEFAULT_SIGNALS",
    "AsyncSignalHandlers",
    "SignalReport",
    "TaskSet",
    "TaskShutdownReport",
    "retry_forever",
    "run_in_thread",
    "run_in_thread_with",
    "run_until_signalled",
    "shutdown_tasks",
]

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

#: The signals a service stops on, SIGTERM (``kill``, Docker, systemd, Kubernetes) and SIGINT.
DEFAULT_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)

#: Seconds `run_in_thread` waits, once cancelled, for its function to notice the token.
DEFAULT_CANCEL_TIMEOUT = 5.0

#: Seconds a forced exit spends flushing logging and stdio before `os._exit`.
_FORCE_FLUSH_TIMEOUT = 0.5


# The same code is in exit_hooks.py (each module is copied alone); pinned by tests/test_copies.py.
def _seconds(value: object, name: str, *, allow_none: bool = False) -> float:
    """A number of seconds >= 0 as a float; ``math.inf`` means "as long as it takes"."""
    if value is None and allow_none:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return math.inf if value > sys.float_info.max else float(value)  # 10**400: no overflow


def _timeout(budget: float) -> float | None:
    """``budget`` for `asyncio.wait`: None for "as long as it takes" (no timer at all)."""
    return None if budget == math.inf else budget


def _check_report(terminated: bool, still_running: tuple[str, ...]) -> None:
    if terminated and still_running:
        raise ValueError(f"a report cannot say terminated=True with still_running={still_running}")


@dataclass(frozen=True)
class TaskShutdownReport:
    """What `shutdown_tasks` (or `TaskSet.stop`) found when it returned.

    Attributes:
        terminated: every task had ended by the deadline.
        still_running: names of the tasks still running: they caught the cancellation
            and carried on, or their cleanup outlasted the budget.
        finished: names of the tasks that returned a result (before or despite the cancel).
        failed: names of the tasks that raised an exception other than the cancellation.
        cancelled: names of the tasks that ended by the cancellation.
        elapsed: seconds the call took.
    """

    terminated: bool
    still_running: tuple[str, ...]
    finished: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    cancelled: tuple[str, ...] = ()
    elapsed: float = 0.0

    def __post_init__(self) -> None:
        _check_report(self.terminated, self.still_running)


async def shutdown_tasks(
    tasks: Iterable[asyncio.Task[Any]], timeout: float, *, log_failures: bool = True
) -> TaskShutdownReport:
    """Cancel ``tasks``, wait at most ``timeout`` seconds, and report what each one did.

    A task that catches `asyncio.CancelledError` and goes on is named in ``still_running``
    instead of hanging the caller (A7). Exceptions of failed tasks are retrieved, and logged
    at ERROR unless ``log_failures`` is false (for a caller that logged them already).
    Raises `ValueError` for a bad ``timeout`` or when the calling task is among ``tasks``.
    If the caller itself is cancelled while waiting, the cancellation propagates; the tasks
    stay cancelled.
    """
    budget = _seconds(timeout, "timeout")
    started = time.monotonic()
    tasks = list(dict.fromkeys(tasks))
    if asyncio.current_task() in tasks:
        raise ValueError("shutdown_tasks() cannot wait for the task that calls it")
    pending = [t for t in tasks if not t.done()]
    for task in pending:
        task.cancel()
    if pending and budget > 0:
        await asyncio.wait(pending, timeout=_timeout(budget))
    finished: list[str] = []
    failed: list[str] = []
    cancelled: list[str] = []
    still_running: list[str] = []
    for task in tasks:
        name = task.get_name()
        if not task.done():
            still_running.append(name)
        elif task.cancelled():
            cancelled.append(name)
        elif (exc := task.exception()) is not None:  # retrieved: no "never retrieved" later
            failed.append(name)
            if log_failures:
                logger.error("task %s failed", name, exc_info=exc)
        else:
            finished.append(name)
    if still_running:
        logger.warning(
            "still running %.3gs after cancel (cancellation swallowed?): %s",
            budget,
            ", ".join(still_running),
        )
    return TaskShutdownReport(
        terminated=not still_running,
        still_running=tuple(still_running),
        finished=tuple(finished),
        failed=tuple(failed),
        cancelled=tuple(cancelled),
        elapsed=time.monotonic() - started,
    )


class TaskSet:
    """Background tasks with strong references, logged failures and a bounded stop.

    The lifecycle contract, mapped to coroutines: the constructor touches no event loop;
    `start` is a plain method (there is nothing to wait for) that must run inside the
    loop, which it remembers; `stop` is a coroutine, ``await tasks.stop(timeout)``,
    because waiting for tasks means letting the loop run; ``async with`` calls both, and
    enters a running set as it is (``async with TaskSet().start() as tasks:``). Once a
    ``stop()`` has completed, every later one returns its report object; one made while
    another is still waiting waits at most its own budget. Everything runs in the loop's
    thread, so no lock is needed; calling from another thread is an error, as it is for
    the loop itself.
    """

    def __init__(self, *, stop_timeout: float = 5.0, name: str = "tasks") -> None:
        self.stop_timeout = _seconds(stop_timeout, "stop_timeout")
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        # The strong references: the loop itself keeps only weak ones (A3). A task leaves
        # the set in its done callback.
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False  # set by the first stop(): spawn() refuses from then on
        self._stopping: asyncio.Task[TaskShutdownReport] | None = None
        self._report: TaskShutdownReport | None = None
        self._failures = 0

    def start(self) -> Self:
        """Bind to the running loop; `RuntimeError` outside one, when started twice or stopped."""
        loop = asyncio.get_running_loop()
        if self._loop is not None or self._closed:
            raise RuntimeError(f"TaskSet {self.name!r}: start() can be called once, before stop()")
        self._loop = loop
        return self

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        """Run ``coro`` as a task that this set references until it ends.

        Raises `RuntimeError` before `start` and once `stop` has begun; the coroutine is
        closed then, so it never runs and never warns that it was not awaited.
        """
        if self._loop is None or self._closed:
            coro.close()
            state = "stopped" if self._closed else "not started"
            raise RuntimeError(f"TaskSet {self.name!r} is {state}: task refused")
        task = self._loop.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._on_done)
        return task

    def _on_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()  # retrieving it is what silences "never retrieved"
        if exc is not None:
            self._failures += 1
            logger.error("task %s failed", task.get_name(), exc_info=exc)

    @property
    def tasks(self) -> frozenset[asyncio.Task[Any]]:
        """The tasks still running (a snapshot)."""
        return frozenset(self._tasks)

    @property
    def failures(self) -> int:
        """How many tasks have ended with an exception so far (each was logged)."""
        return self._failures

    def __len__(self) -> int:
        return len(self._tasks)

    async def stop(self, timeout: float | None = None) -> TaskShutdownReport:
        """Refuse new tasks, cancel the running ones, wait at most ``timeout``; report.

        ``None`` means ``stop_timeout``; ``math.inf`` waits as long as it takes. Raises
        `ValueError` for a bad timeout; never for a task that would not stop (the report
        names it). If the caller is cancelled, the stop goes on and a later ``stop()``
        returns its report. Awaited from one of the set's own tasks, it is a request: the
        stop starts (that task is cancelled too, at its next ``await``) and a provisional
        report naming it comes back at once. A ``stop()`` made while another is under way
        waits at most its own ``timeout`` for that one's report, then returns a
        provisional one. A provisional report says ``terminated=False`` and is not kept;
        the first stop that completes keeps its report, and every later call returns it.
        """
        budget = self.stop_timeout if timeout is None else _seconds(timeout, "timeout")
        if self._report is not None:
            return self._report
        self._closed = True
        first = self._stopping is None
        if self._stopping is None:
            self._stopping = asyncio.get_running_loop().create_task(
                self._stop(budget), name=f"{self.name}-stop"
            )
        if asyncio.current_task() in self._tasks:  # it would wait for itself
            return self._provisional()
        if first:  # bounded by budget already: shutdown_tasks waits at most that
            return await asyncio.shield(self._stopping)
        await asyncio.wait([self._stopping], timeout=_timeout(budget))
        return self._report or self._provisional()

    def _provisional(self) -> TaskShutdownReport:
        names = tuple(sorted(t.get_name() for t in self._tasks if not t.done()))
        return TaskShutdownReport(terminated=False, still_running=names)

    async def _stop(self, budget: float) -> TaskShutdownReport:
        # The done callbacks log failures; shutdown_tasks only retrieves them.
        report = await shutdown_tasks(list(self._tasks), budget, log_failures=False)
        self._report = report
        return report

    async def __aenter__(self) -> Self:
        """Start if never started; a running set is returned as is (``async with s.start():``)."""
        if self._loop is not None and not self._closed:
            return self
        return self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


async def retry_forever(
    step: Callable[[], Awaitable[object]], *, delay: float = 0.0, name: str = "step"
) -> None:
    """Await ``step()`` again and again; log its failures and go on; stop when cancelled.

    It catches `Exception`, never `BaseException`: `asyncio.CancelledError` is a
    `BaseException` (3.8+) and passes through, so cancelling the task stops the loop (A2).
    Code that must catch the cancellation (to clean up, or because it wraps an API that
    raises it) re-raises it, or checks ``asyncio.current_task().cancelling()`` and
    re-raises when it is non-zero.
    """
    _seconds(delay, "delay")
    while True:
        try:
            await step()
        except Exception:
            logger.exception("%s failed; retrying", name)
        await asyncio.sleep(delay)


async def run_in_thread(
    fn: Callable[Concatenate[threading.Event, P], T],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """Run ``fn(token, *args, **kwargs)`` in the default executor; cancelling sets ``token``.

    `asyncio.to_thread` cannot stop its thread: cancelling the awaiting task returns at
    once and leaves the function running, and `asyncio.run` then waits for it at exit (A4,
    A8). Here ``fn`` gets a `threading.Event` to check; when the awaiting task is
    cancelled the token is set and the task waits at most `DEFAULT_CANCEL_TIMEOUT` for
    ``fn`` to return before the `asyncio.CancelledError` goes on. A ``fn`` that does not
    notice in time is logged at WARNING, and its outcome at the end. Context variables are
    copied into the thread, as `asyncio.to_thread` does.
    """
    return await run_in_thread_with(None, DEFAULT_CANCEL_TIMEOUT, fn, *args, **kwargs)


async def run_in_thread_with(
    executor: Executor | None,
    cancel_timeout: float,
    fn: Callable[Concatenate[threading.Event, P], T],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """`run_in_thread` with an ``executor`` (None: the loop's default) and ``cancel_timeout``."""
    budget = _seconds(cancel_timeout, "cancel_timeout")
    loop = asyncio.get_running_loop()
    token = threading.Event()  # set here, in the loop's thread, on cancel; fn reads it
    context = contextvars.copy_context()
    call = functools.partial(context.run, fn, token, *args, **kwargs)
    future = loop.run_in_executor(executor, call)
    try:
        # Shielded: cancelling the task must not cancel `future`, or we could not wait for it.
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        token.set()
        name = getattr(fn, "__name__", repr(fn))
        future.add_done_callback(functools.partial(_log_late_outcome, name))
        if budget > 0:
            await asyncio.wait([future], timeout=_timeout(budget))  # a second cancel ends it
        if not future.done():
            logger.warning("%s still running %.3gs after its token was set", name, budget)
        raise


def _log_late_outcome(name: str, future: asyncio.Future[Any]) -> None:
    """Retrieve the outcome nobody awaits any more (no "exception was never retrieved")."""
    if not future.cancelled() and (exc := future.exception()) is not None:
        logger.error("%s failed after its task was cancelled", name, exc_info=exc)


@dataclass(frozen=True)
class SignalReport:
    """What `AsyncSignalHandlers.stop` left behind (nothing runs, so it always terminated)."""

    terminated: bool
    still_running: tuple[str, ...]
    first_signal: signal.Signals | None  # the signal that called on_stop, if one came

    def __post_init__(self) -> None:
        _check_report(self.terminated, self.still_running)


class AsyncSignalHandlers:
    """Handle SIGTERM like SIGINT in an event loop: stop on the first, exit on the second.

    `asyncio.Runner` (and so `asyncio.run`) turns only SIGINT into a cancellation of the
    main task; SIGTERM keeps its default action and kills the process with no cleanup
    (A6). ``start()`` (in the loop's thread, the main thread) installs each signal with
    ``loop.add_signal_handler``: the first calls ``on_stop(signum)`` in the loop, once; a
    second forces the exit with status ``128 + signum`` (A9). ``stop()`` removes them and
    puts back what was there: the loop's own handler if it had one (an outer
    ``AsyncSignalHandlers``, as nested `run_until_signalled` makes), else the Python
    handler (the loop alone would put back the default). A plain context manager, usable
    inside a coroutine: ``with AsyncSignalHandlers(lambda s: stop.set()):``; it enters a
    running one as it is.
    """

    def __init__(
        self,
        on_stop: Callable[[signal.Signals], object],
        signals: Iterable[int] = DEFAULT_SIGNALS,
    ) -> None:
        try:
            self._signals = tuple(dict.fromkeys(signal.Signals(s) for s in signals))
        except ValueError as exc:
            raise ValueError(f"signals: {exc}") from None
        if not self._signals:
            raise ValueError("signals must name at least one signal")
        self._on_stop = on_stop
        self._loop: asyncio.AbstractEventLoop | None = None
        # What to put back, per signal added: the Python handler, and the loop's own
        # handler (callback and arguments) if the loop had one for it.
        self._previous: dict[signal.Signals, tuple[Any, _LoopHandler | None]] = {}
        self._received: list[signal.Signals] = []
        self._closed = False
        self._report: SignalReport | None = None

    @property
    def first_signal(self) -> signal.Signals | None:
        """The signal that asked to stop, or None if none has arrived yet."""
        return self._received[0] if self._received else None

    def start(self) -> Self:
        """Install the handlers in the running loop, all or nothing.

        Raises `RuntimeError` outside a running loop, outside the main thread, or when
        called twice or after `stop`; whatever was installed is removed again then.
        """
        loop = asyncio.get_running_loop()
        if self._loop is not None or self._closed:
            raise RuntimeError("AsyncSignalHandlers.start() can be called once, before stop()")
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("signal handlers can only be installed from the main thread")
        self._loop = loop
        try:
            for signum in self._signals:
                previous = (signal.getsignal(signum), _loop_handler(loop, signum))
                loop.add_signal_handler(signum, self._on_signal, signum)
                self._previous[signum] = previous
        except BaseException:
            self._remove()
            self._closed = True
            raise
        return self

    def stop(self, timeout: float | None = None) -> SignalReport:
        """Remove the handlers and put back the previous ones; the same report every time.

        ``timeout`` is accepted for the contract; nothing here waits. Call it in the loop's
        thread while the loop is open (or never started).
        """
        _seconds(timeout, "timeout", allow_none=True)
        if self._report is None:
            self._closed = True
            self._remove()
            self._report = SignalReport(True, (), self.first_signal)
        return self._report

    def _remove(self) -> None:
        loop = self._loop
        for signum, (previous, in_loop) in list(self._previous.items()):
            del self._previous[signum]
            if loop is not None and not loop.is_closed():
                loop.remove_signal_handler(signum)  # puts back SIG_DFL / default_int_handler
                if in_loop is not None:  # the loop had one (an outer AsyncSignalHandlers)
                    loop.add_signal_handler(signum, in_loop[0], *in_loop[1])
                    continue
            if getattr(previous, "__name__", "") == "_sighandler_noop":
                # asyncio's placeholder for a loop handler we could not read: putting it
                # back would make the signal do nothing at all. Leave the default.
                logger.warning("%s: the loop's previous handler is lost", signum.name)
            elif previous is not None:  # None: installed outside Python; nothing to put back
                signal.signal(signum, previous)

    def __enter__(self) -> Self:
        """Start if never started; a running one is returned as is (``with h.start():``)."""
        if self._loop is not None and not self._closed:
            return self
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _on_signal(self, signum: signal.Signals) -> None:
        if self._closed:
            return
        self._received.append(signum)
        if len(self._received) == 1:
            logger.warning("%s received: stopping (send it again to exit at once)", signum.name)
            try:
                self._on_stop(signum)
            except Exception:
                logger.exception("on_stop failed; a second signal still forces the exit")
        else:
            _force_exit(128 + signum, f"second signal ({signum.name}) while stopping")


_LoopHandler = tuple[Callable[..., object], tuple[Any, ...]]


def _loop_handler(loop: asyncio.AbstractEventLoop, signum: int) -> _LoopHandler | None:
    """The callback and arguments ``loop`` runs for ``signum``, if it has one and we can see it.

    asyncio has no public way to read a loop's signal handler; its Unix loops keep them
    in ``_signal_handlers`` as `asyncio.Handle` objects. Read with getattr, so that a loop
    without them (uvloop, a future asyncio) only loses the restore, never the start.
    """
    handlers = getattr(loop, "_signal_handlers", None)
    handle = handlers.get(signum) if isinstance(handlers, dict) else None
    callback = getattr(handle, "_callback", None)
    if handle is None or callback is None or handle.cancelled():
        return None
    return callback, tuple(getattr(handle, "_args", None) or ())


def _force_exit(status: int, reason: str) -> None:
    """Log ``reason``, flush logging and stdio for at most half a second, then `os._exit`."""

    def flush() -> None:
        logger.critical("%s: exiting now with status %d", reason, status)
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, OSError, ValueError):
                stream.flush()

    # In a helper thread: a blocked stream must not hold the exit.
    flusher = threading.Thread(target=flush, name="force-exit-flush", daemon=True)
    with contextlib.suppress(RuntimeError):  # no thread to be had: exit without the flush
        flusher.start()
        flusher.join(_FORCE_FLUSH_TIMEOUT)
    os._exit(status)


async def run_until_signalled(
    work: Callable[[asyncio.Event], Coroutine[Any, Any, object]],
    *,
    drain_timeout: float,
    cancel_timeout: float = 1.0,
    signals: Iterable[int] = DEFAULT_SIGNALS,
) -> TaskShutdownReport:
    """Run ``work(stop)`` as a task until it returns or a signal asks to stop.

    The first signal sets ``stop``; ``work`` gets ``drain_timeout`` seconds to finish and
    return, then it is cancelled and gets ``cancel_timeout`` more. The handlers stay
    installed until then, so a second signal forces the exit with status ``128 + signum``.
    Returns the `shutdown_tasks` report of the work task (``finished`` names it when it
    returned by itself; a failure of ``work`` is logged and named in ``failed``).
    """
    drain = _seconds(drain_timeout, "drain_timeout")
    cancel = _seconds(cancel_timeout, "cancel_timeout")
    stop = asyncio.Event()  # set by the first signal; work watches it
    with AsyncSignalHandlers(lambda _signum: stop.set(), signals):
        task = asyncio.get_running_loop().create_task(work(stop), name="work")
        stopped = asyncio.get_running_loop().create_task(stop.wait(), name="stop-wait")
        try:
            await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                logger.info("draining: waiting up to %.3gs for work to stop", drain)
                await asyncio.wait([task], timeout=_timeout(drain))
        finally:
            stopped.cancel()
        return await shutdown_tasks([task], cancel)
