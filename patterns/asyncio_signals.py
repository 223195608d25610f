# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""Stop an asyncio program on SIGTERM as on Ctrl-C, and let a second signal end it at once.

TL;DR: ``await run_until_signalled(work, drain_timeout=10)`` runs ``work(stop)`` as a task,
turns SIGTERM or SIGINT into ``stop.set()``, gives ``work`` ``drain_timeout`` seconds to
return, then cancels it; a second signal exits at once with status ``128 + signum``.
``with AsyncSignalHandlers(on_stop):`` installs the same two-step handling inside a
coroutine, for a program that shapes its own stop.

Guarantees:
    * The first signal calls ``on_stop(signum)`` once, in the loop; a second one ends the
      process with status ``128 + signum`` after flushing logging and stdio for at most
      half a second, however stuck the drain is.
    * `AsyncSignalHandlers` puts back, when stopped, the loop's own handler for a signal if
      the loop had one (an outer `AsyncSignalHandlers`), else the exact previous one.
    * `run_until_signalled` keeps its handlers installed until ``work`` has ended or been
      cancelled, and names the work task in exactly one outcome of its report.
    * Every number of seconds is checked: ``math.inf`` means as long as it takes; nan, a
      negative number, a bool or a string is a `ValueError` naming the argument.

Python:
    3.11+, POSIX (``loop.add_signal_handler``); checked on 3.11.7, 3.12.1 and 3.13.0.
    `asyncio.run` (through `asyncio.Runner`) turns SIGINT into a cancellation of the main
    task and leaves SIGTERM its default action, which kills the process with no cleanup.

Stopping the tasks themselves (deadlines, ``TaskSet``, threads a cancel can reach) is
patterns/asyncio_shutdown.py; this file needs none of it.

Docs: docs/patterns/asyncio_signals.md
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Self

__all__ = [
    "DEFAULT_SIGNALS",
    "AsyncSignalHandlers",
    "SignalReport",
    "TaskShutdownReport",
    "run_until_signalled",
]

logger = logging.getLogger(__name__)

#: The signals a service stops on, SIGTERM (``kill``, Docker, systemd, Kubernetes) and SIGINT.
DEFAULT_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)

#: Seconds a forced exit spends flushing logging and stdio before `os._exit`.
_FORCE_FLUSH_TIMEOUT = 0.5


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
    Returns a `TaskShutdownReport` of the work task (``finished`` names it when it
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


# --- what run_until_signalled reports: the same code as in patterns/asyncio_shutdown.py ----
#
# TaskShutdownReport, shutdown_tasks and _sort are copies, pinned by tests/test_copies.py,
# so that this file works alone; shutdown_tasks is not exported from here.


@dataclass(frozen=True)
class TaskShutdownReport:
    """What `run_until_signalled` found when it returned: the work task under its outcome.

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

    Here it ends `run_until_signalled`: the work task that outlived its drain is cancelled.

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
    return _sort(tasks, budget, started, log_failures=log_failures)


def _sort(
    tasks: Iterable[asyncio.Task[Any]],
    budget: float,
    started: float,
    *,
    log_failures: bool,
    terminated: bool = True,
    provisional: bool = False,
) -> TaskShutdownReport:
    """Name each task under its outcome; not ``terminated`` if one still runs or the caller says.

    A task still running after the caller waited ``budget`` is logged: it swallowed its
    cancel, or its cleanup is slow. A ``provisional`` report (a stop that cannot wait)
    says ``terminated=False`` and logs nothing, since nobody has waited yet. Here only
    `shutdown_tasks` calls it; the other two flags serve asyncio_shutdown's own stops.
    """
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
    if still_running and not provisional:
        logger.warning(
            "still running %.3gs after cancel (cancellation swallowed?): %s",
            budget,
            ", ".join(still_running),
        )
    return TaskShutdownReport(
        terminated=terminated and not provisional and not still_running,
        still_running=tuple(still_running),
        finished=tuple(finished),
        failed=tuple(failed),
        cancelled=tuple(cancelled),
        elapsed=time.monotonic() - started,
    )


# --- the lifecycle contract: seconds, report self-checks -----------------------------------
#
# _seconds is the seconds family's, the same code in every pattern module that holds it;
# _check_report and _timeout are asyncio_shutdown.py's; all pinned by tests/test_copies.py.
# asyncio's timers do the waiting, so it needs no other.


def _check_report(terminated: bool, still_running: tuple[str, ...]) -> None:
    """A report's self-check: it cannot say it terminated and name what still runs."""
    if terminated and still_running:
        raise ValueError(f"a report cannot say terminated=True with still_running={still_running}")


def _timeout(budget: float) -> float | None:
    """``budget`` for `asyncio.wait`: None for "as long as it takes" (no timer at all)."""
    return None if budget == math.inf else budget


def _seconds(value: object, name: str, *, allow_none: bool = False) -> float:
    """A number of seconds >= 0 as a float; ``math.inf`` means "as long as it takes".

    `_timeout` turns inf into no timer at all for `asyncio.wait`.
    """
    if value is None and allow_none:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return math.inf if value > sys.float_info.max else float(value)  # 10**400: no overflow
