# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""No silent deaths: hear about every thread and every task that fails.

TL;DR::

    sys.exit(run_main(main))         # logs every thread's failure; status 1 if one failed
    with LoggingExecutor() as pool:  # or future.add_done_callback(log_failure)
        pool.submit(task)            # a failure is logged when it happens, read or not

Guarantees:
    * While a `LoggingExcepthook` is installed, every exception that escapes a thread's
      ``run()``, `SystemExit` included, is logged at ERROR with its traceback, then passed
      to the previous hook. `LoggingExcepthook.restore` leaves `threading.excepthook`
      identical (``is``) to what `LoggingExcepthook.install` found; nested hooks restore in
      reverse order, and an out-of-order restore raises instead of losing a hook.
    * A task submitted to a `LoggingExecutor`, or whose future has `log_failure` as a
      done-callback, is logged at ERROR with its traceback when it fails, before anyone
      can call ``result()``; a cancelled task is not logged.
    * `run_main` returns a non-zero status when a thread failed while ``main`` ran.

Python: 3.11+, standard library only; checked on 3.11.7, 3.12.1 and 3.13.0.

Docs: docs/patterns/thread_exceptions.md (the pitfalls P5b, P8, P8b, P8c, why no hook sees
a pool task, the Java counterpart). Restarting a dead worker: ``supervisor``.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ParamSpec, Self, TypeVar

__all__ = [
    "LoggingExcepthook",
    "LoggingExecutor",
    "ThreadFailure",
    "log_failure",
    "run_main",
]

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

# Guards every read-modify-write of threading.excepthook done by this module, so two
# threads installing or restoring at once cannot both save the same previous hook.
# Held only for those few lines; the hook itself never takes it.
_HOOK_LOCK = threading.Lock()


@dataclass(frozen=True)
class ThreadFailure:
    """How one thread ended when it should not have: the facts, without the exception.

    The exception object is not kept, because it references its traceback, whose frames
    reference the exception again (the reference cycle the `threading.excepthook` docs
    warn about); its text is kept instead.

    Attributes:
        thread_name: the thread's name.
        thread_ident: the thread's ident, or None if it was not known.
        exc_type: the exception's class, or None if the thread returned without raising
            when it was not asked to stop.
        summary: the exception's last traceback line, such as ``"ValueError: boom"``.
        traceback: the whole formatted traceback ("" if there was none).
        ended_at: `time.monotonic` when the thread recorded its end.
    """

    thread_name: str
    thread_ident: int | None
    exc_type: type[BaseException] | None
    summary: str
    traceback: str
    ended_at: float

    @classmethod
    def from_exception(
        cls,
        thread: threading.Thread | None,
        exc_type: type[BaseException],
        exc: BaseException | None,
    ) -> ThreadFailure:
        """Record ``exc`` (of class ``exc_type``), raised in ``thread``, as it is now."""
        tb = exc.__traceback__ if exc is not None else None
        return cls(
            thread_name=thread.name if thread is not None else "<unknown>",
            thread_ident=thread.ident if thread is not None else None,
            exc_type=exc_type,
            summary="".join(traceback.format_exception_only(exc_type, exc)).strip(),
            traceback="".join(traceback.format_exception(exc_type, exc, tb)),
            ended_at=time.monotonic(),
        )


class LoggingExcepthook:
    """A `threading.excepthook` that logs at ERROR, then chains to the hook it replaced.

    Use it as a context manager (``with LoggingExcepthook() as hook:``) or call
    `install` and `restore`. While installed, an exception that escapes any thread's
    ``run()`` is logged through ``logger`` (default: this module's) with the thread's name,
    ident and full traceback, and recorded in `failures`; then the previous hook is called
    (pass ``chain=False`` to stop there, for instance when the previous hook is the default
    one and prints the same traceback to stderr). `SystemExit` from ``sys.exit()`` in a
    thread is reported as well, where the default hook would ignore it.

    Hooks nest: each instance remembers the hook it replaced and `restore` puts exactly
    that object back. Restoring an instance while another one installed later is still
    in place raises `RuntimeError`, because either choice would lose a hook.
    """

    def __init__(self, *, logger: logging.Logger | None = None, chain: bool = True) -> None:
        self.logger = logger if logger is not None else logging.getLogger(__name__)
        self.chain = chain
        # Guards _failures: the hook runs in whichever threads are dying, maybe several at once.
        self._lock = threading.Lock()
        self._failures: list[ThreadFailure] = []
        self._previous: Callable[[threading.ExceptHookArgs], object] | None = None
        self._installed = False

    def install(self) -> Self:
        """Make this the process's `threading.excepthook`; raise if it already is installed."""
        with _HOOK_LOCK:
            if self._installed:
                raise RuntimeError("this LoggingExcepthook is already installed")
            self._previous = threading.excepthook
            threading.excepthook = self
            self._installed = True
        return self

    def restore(self) -> None:
        """Put back the hook that `install` replaced, exactly; do nothing if not installed.

        Raises `RuntimeError`, changing nothing, if another hook was installed on top of
        this one and is still in place: restore that one first.
        """
        with _HOOK_LOCK:
            if not self._installed:
                return
            current = threading.excepthook
            if current is not self:
                raise RuntimeError(
                    f"cannot restore: {current!r} was installed after this hook and is still "
                    "in place; restore hooks in the reverse order of installing them"
                )
            # Exactly what install() found, even None (the stubs do not allow for that).
            threading.excepthook = self._previous  # type: ignore[assignment]
            self._installed = False

    @property
    def installed(self) -> bool:
        """Whether this hook is currently installed."""
        return self._installed

    @property
    def failures(self) -> list[ThreadFailure]:
        """Every failure this hook has seen, oldest first."""
        with self._lock:
            return list(self._failures)

    def __call__(self, args: threading.ExceptHookArgs, /) -> None:
        """Log one uncaught exception, record it, then call the previous hook."""
        try:
            failure = ThreadFailure.from_exception(args.thread, args.exc_type, args.exc_value)
            with self._lock:
                self._failures.append(failure)
            # The exception carries its traceback; exc_value is None only for odd C code.
            exc_info = args.exc_value if args.exc_value is not None else False
            if issubclass(args.exc_type, SystemExit):
                self.logger.error(
                    "sys.exit(%r) in thread %r (ident %s) ended only that thread; "
                    "the process goes on",
                    getattr(args.exc_value, "code", None),
                    failure.thread_name,
                    failure.thread_ident,
                    exc_info=exc_info,
                )
            else:
                self.logger.error(
                    "uncaught exception in thread %r (ident %s): %s",
                    failure.thread_name,
                    failure.thread_ident,
                    failure.summary,
                    exc_info=exc_info,
                )
        finally:
            # Whatever happened above, the hooks installed before this one still hear of it.
            previous = self._previous
            if self.chain and previous is not None:
                previous(args)

    def __enter__(self) -> Self:
        return self.install()

    def __exit__(self, *exc_info: object) -> None:
        self.restore()


def log_failure(future: Future[Any], /, *, task: object = None) -> None:
    """A done-callback that logs the future's exception at ERROR, with its traceback.

    Added with ``future.add_done_callback(log_failure)`` (or ``functools.partial(
    log_failure, task=fn)`` to name the task), it runs in the worker thread right after
    the task fails, whether or not anybody ever calls ``result()``. A cancelled future
    or a successful one logs nothing. It never raises.
    """
    if future.cancelled():
        return
    exc = future.exception()
    if exc is None:
        return
    logger.error(
        "task %r failed: %s",
        task if task is not None else future,
        "".join(traceback.format_exception_only(type(exc), exc)).strip(),
        exc_info=(type(exc), exc, exc.__traceback__),
    )


class LoggingExecutor(ThreadPoolExecutor):
    """A `ThreadPoolExecutor` whose every failed task is logged at ERROR when it fails.

    Python's answer to Java's ``execute()``: the exception still goes into the future,
    as ``submit()`` always does, and `log_failure` also reports it the moment the task
    fails, so dropping the future no longer hides it. A cancelled task is not logged.
    ``map()`` submits through `submit`, so it is covered too.
    """

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Submit ``fn(*args, **kwargs)`` as `ThreadPoolExecutor.submit` does, failures logged."""
        future = super().submit(fn, *args, **kwargs)
        future.add_done_callback(functools.partial(log_failure, task=fn))
        return future


def run_main(main: Callable[[], int | None], *, failure_status: int = 1) -> int:
    """Run ``main`` with a `LoggingExcepthook`; return ``failure_status`` if a thread failed.

    Use it as ``sys.exit(run_main(main))``. A thread counts only if it failed while
    ``main`` ran, so ``main`` must join its threads before it returns; any non-daemon
    thread still running then is logged at WARNING, because its failure can no longer
    change the exit status. An exception from ``main`` itself propagates (the main
    thread's `sys.excepthook` reports it and the status is 1, as usual).
    """
    with LoggingExcepthook() as hook:
        status = main()
    _warn_still_running()  # a failure that comes later cannot change the status
    failures = hook.failures
    if failures and not status:
        logger.error(
            "exiting with status %d: %d thread(s) failed: %s",
            failure_status,
            len(failures),
            [f.thread_name for f in failures],
        )
        return failure_status
    return status or 0


# --- the lifecycle contract: what main leaves running ------------------------------------------


def _warn_still_running() -> None:
    """Name the non-daemon threads still running after ``main``: their failures come too late."""
    still_running = [
        t.name
        for t in threading.enumerate()
        if t is not threading.main_thread() and not t.daemon and t.is_alive()
    ]
    if still_running:
        logger.warning(
            "thread(s) still running after main returned, their failures cannot change "
            "the exit status: %s",
            still_running,
        )
