# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""Stop coroutines on a deadline: cancel, wait, and say which tasks would not stop.

TL;DR: ``report = await shutdown_tasks(tasks, timeout=5)`` cancels every task and waits at
most ``timeout``; ``async with TaskSet() as tasks: tasks.spawn(coro)`` keeps background
tasks alive and logs their failures; ``await run_in_thread(fn)`` runs ``fn(token)`` in a
thread and sets ``token`` when the awaiting task is cancelled; ``await shielded(save(),
timeout=2)`` finishes a cleanup even when its caller is cancelled, then lets the
cancellation go on; ``async with StoppableTaskGroup() as group:`` is an `asyncio.TaskGroup`
that another task can stop with ``await group.stop(timeout)``.

Guarantees:
    * `shutdown_tasks` returns within ``timeout`` (plus scheduling noise) whatever the tasks
      do, never raises for a task that failed or would not stop, and names every task in
      exactly one of ``finished``, ``failed``, ``cancelled`` and ``still_running``.
    * A task spawned by a `TaskSet` is strongly referenced until it ends; its failure is
      logged at ERROR, with its name, when it happens ("never retrieved" never appears).
      `TaskSet.stop` keeps the lifecycle contract and refuses new tasks from its first call.
    * Every number of seconds is checked: ``math.inf`` means as long as it takes; nan, a
      negative number, a bool or a string is a `ValueError` naming the argument.
    * When the task awaiting `run_in_thread` is cancelled, the token is set, the task waits
      at most ``cancel_timeout`` for ``fn`` to return, and a ``fn`` that does not is logged.
    * `shielded` returns or raises only once its cleanup has ended or its deadline has
      passed; a cancellation of the caller meanwhile is re-raised afterwards, never
      swallowed, and a failure of the cleanup is raised or logged, never lost.
    * `StoppableTaskGroup.stop` returns within its budget even when a child ignores its
      cancel (the report names it); the children's own exceptions still reach the task
      that entered the group, as an `ExceptionGroup`, and on every version a cancel of
      that task from outside survives a child's failure.

Python:
    3.11+ (``Task.cancelling``/``uncancel``, `asyncio.TaskGroup`, `asyncio.timeout`);
    checked on 3.11.7, 3.12.1 and 3.13.0. At exit `asyncio.run` waits for the default
    executor's threads: with no limit on 3.11.7 and 3.12.1, for at most 300 s on 3.13.0
    (after which the interpreter's own exit still waits for them).
    An `asyncio.TaskGroup` that raises an `ExceptionGroup` while its task is being cancelled
    from outside drops that cancellation on 3.11.7 and 3.12.1 and keeps it on 3.13.0
    (gh-116720); `StoppableTaskGroup` keeps it on every version.

Turning SIGTERM into a stop, and a second signal into an exit, is patterns/asyncio_signals.py.

Docs: docs/patterns/asyncio_shutdown.md
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import logging
import math
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
    "StoppableTaskGroup",
    "TaskSet",
    "TaskShutdownReport",
    "retry_forever",
    "run_in_thread",
    "run_in_thread_with",
    "shielded",
    "shutdown_tasks",
]

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

#: Seconds `run_in_thread` waits, once cancelled, for its function to notice the token.
DEFAULT_CANCEL_TIMEOUT = 5.0


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
    says ``terminated=False`` and logs nothing, since nobody has waited yet.
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


class TaskSet:
    """Background tasks with strong references, logged failures and a bounded stop.

    The lifecycle contract, mapped to coroutines: `start` is a plain method, run inside
    the loop, which it remembers; `stop` is a coroutine, ``await tasks.stop(timeout)``,
    because waiting for tasks means letting the loop run; ``async with`` calls both, and
    enters a running set as it is. Everything runs in the loop's thread, so no lock is
    needed; calling from another thread is an error, as it is for the loop itself.
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

        ``None`` means ``stop_timeout``; ``math.inf`` waits as long as it takes. Never
        raises for a task that would not stop (the report names it). If the caller is
        cancelled, the stop goes on and a later ``stop()`` returns its report. From one of
        the set's own tasks it is a request: the stop starts (that task is cancelled too)
        and a provisional report (``terminated=False``, not kept) comes back at once; a
        ``stop()`` made while another is under way waits at most its own ``timeout`` for
        that one's report. Once a stop has completed, every call returns its report.
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
            return _provisional(self._tasks)
        if first:  # bounded by budget already: shutdown_tasks waits at most that
            return await asyncio.shield(self._stopping)
        await asyncio.wait([self._stopping], timeout=_timeout(budget))
        return self._report or _provisional(self._tasks)

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

    async def __aexit__(self, *exc_info: object) -> None:
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
    seconds = _seconds(delay, "delay")  # the checked value: asyncio.sleep(10**400) overflows
    while True:
        try:
            await step()
        except Exception:
            logger.exception("%s failed; retrying", name)
        await asyncio.sleep(seconds)


async def shielded(cleanup: Awaitable[T], timeout: float, *, name: str = "cleanup") -> T:
    """Await ``cleanup`` to its end even if the caller is cancelled meanwhile, within ``timeout``.

    `asyncio.shield` alone gives up on the cleanup when its caller is cancelled: the caller
    leaves at once, nothing waits for the cleanup any more, `asyncio.run` may cancel it at
    exit, and its exception is lost (A10, A11). Here the caller keeps waiting; a
    cancellation that arrives meanwhile is re-raised once the cleanup has ended, and a
    failure of the cleanup is logged at ERROR (it is raised instead when the caller was not
    cancelled). At the deadline the cleanup is cancelled and left referenced until it ends;
    the caller gets its cancellation back, or `TimeoutError` if it had none.
    """
    try:
        budget = _seconds(timeout, "timeout")
    except ValueError:
        if isinstance(cleanup, Coroutine):  # refused before it started: closed, not left unawaited
            cleanup.close()
        raise
    loop = asyncio.get_running_loop()
    inner = asyncio.ensure_future(cleanup)  # the strong reference, for as long as we wait
    deadline = loop.time() + budget
    interrupted: asyncio.CancelledError | None = None  # the caller's, re-raised at the end
    while not inner.done() and (left := deadline - loop.time()) > 0:
        try:
            await asyncio.wait([inner], timeout=_timeout(left))
        except asyncio.CancelledError as exc:  # kept, not swallowed: raised below
            interrupted = interrupted or exc
    if not inner.done():
        inner.cancel()
        _overdue.add(inner)
        inner.add_done_callback(functools.partial(_log_overdue, name))
        logger.warning("%s still running after %.3gs: cancelled", name, budget)
        if interrupted is not None:
            raise interrupted
        raise TimeoutError(f"{name} did not finish within {budget:.3g}s")
    if interrupted is not None:
        if not inner.cancelled() and (failure := inner.exception()) is not None:
            logger.error("%s failed while its caller was being cancelled", name, exc_info=failure)
        raise interrupted
    return inner.result()  # the cleanup's own exception, if it failed


class _StopRequested(Exception):
    """Raised by a child of a `StoppableTaskGroup` to make the `asyncio.TaskGroup` stop."""


async def _raise_stop() -> None:
    raise _StopRequested


def _cancelled_its_task(group: asyncio.TaskGroup) -> bool:
    """Whether ``group`` has cancelled the task that entered it (a child failed).

    TaskGroup keeps this in a private attribute, read with getattr: where it is missing,
    the answer is False and `StoppableTaskGroup` takes nothing back.
    """
    return bool(getattr(group, "_parent_cancel_requested", False))


class StoppableTaskGroup:
    """An `asyncio.TaskGroup` that another task can stop, with a bounded wait and a report.

    The task that enters it (``async with StoppableTaskGroup() as group:``) owns it and
    uses it like a TaskGroup. ``group.stop(timeout)``, from any other task, starts the
    documented recipe: a child that raises a private exception, so the group cancels the
    others and waits for them. The exception is removed on the way out; what the children
    raised themselves reaches the owner as an `ExceptionGroup`. A child that ignores its
    cancel holds the ``async with`` forever, and nothing can end that wait (A12), but
    ``stop`` returns within its budget and names the child.
    """

    def __init__(self, *, stop_timeout: float = 5.0, name: str = "group") -> None:
        self.stop_timeout = _seconds(stop_timeout, "stop_timeout")
        self.name = name
        self._group = asyncio.TaskGroup()
        self._owner: asyncio.Task[Any] | None = None
        self._cancelling = 0  # the owner's cancelling() on entry
        self._children: set[asyncio.Task[Any]] = set()  # live ones, for the report
        self._stopped_at: list[asyncio.Task[Any]] = []  # the children alive at the request
        self._requested = False  # set by the first stop(); create_task refuses from then on
        self._exited: asyncio.Future[None] | None = None  # done when the owner leaves
        self._report: TaskShutdownReport | None = None

    async def __aenter__(self) -> Self:
        """Enter the TaskGroup; `RuntimeError` if entered twice or stopped before."""
        if self._requested or self._owner is not None:
            raise RuntimeError(
                f"StoppableTaskGroup {self.name!r} can be entered once, before stop()"
            )
        await self._group.__aenter__()
        self._owner = asyncio.current_task()
        assert self._owner is not None  # the TaskGroup checked
        self._cancelling = self._owner.cancelling()
        self._exited = asyncio.get_running_loop().create_future()
        return self

    def create_task(
        self, coro: Coroutine[Any, Any, T], *, name: str | None = None
    ) -> asyncio.Task[T]:
        """`asyncio.TaskGroup.create_task`; `RuntimeError` once a stop was requested."""
        if self._requested:
            coro.close()
            raise RuntimeError(f"StoppableTaskGroup {self.name!r} is stopping: task refused")
        task = self._group.create_task(coro, name=name)
        if not task.done():
            self._children.add(task)
            task.add_done_callback(self._children.discard)
        return task

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        cancelled_before_exit = _cancelled_its_task(self._group)
        try:
            await self._group.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            self._settle_cancels(cancelled_before_exit)
            _, rest = group.split(_StopRequested)
            if rest is None:
                return True  # only the stop we asked for: not an error
            raise rest from None  # what the children raised themselves
        else:
            return False  # as the TaskGroup: whatever the body raised goes on
        finally:
            assert self._exited is not None
            self._exited.set_result(None)

    def _settle_cancels(self, cancelled_before_exit: bool) -> None:
        """Leave the owner's cancel count as 3.13's TaskGroup does (gh-116720).

        On 3.11 and 3.12 a TaskGroup that cancels its task while it waits in ``__aexit__``
        (a child failed, or the stop's child raised, after the body ended) never takes that
        cancel back, so ``cancelling()`` stays raised (A14); and when it raises its
        ExceptionGroup it drops a cancel that came from outside (A13). 3.13 does neither.
        """
        owner = self._owner
        if sys.version_info >= (3, 13) or owner is None:
            return
        if _cancelled_its_task(self._group) and not cancelled_before_exit:
            owner.uncancel()  # the group's own cancel
        if owner.cancelling() > self._cancelling:  # a cancel from outside, dropped
            owner.uncancel()
            owner.cancel()  # a CancelledError at the owner's next await

    async def stop(self, timeout: float | None = None) -> TaskShutdownReport:
        """Stop the children and wait at most ``timeout`` for the owner to leave the group.

        ``None`` means ``stop_timeout``. The report names the children that were running
        at the first call; ``terminated`` says the ``async with`` has ended, and a WARNING
        names the children still running at the deadline. Never raises for a child that
        would not stop or that failed: the owner gets those failures. From the owner or
        one of the children it is a request that returns at once, logging nothing, with a
        provisional report (``terminated=False``); a stop before the group was entered
        keeps it from being entered. Once a stop has returned, later calls return its report.
        """
        budget = self.stop_timeout if timeout is None else _seconds(timeout, "timeout")
        started = time.monotonic()
        if self._report is not None:
            return self._report
        if not self._requested:
            self._requested = True
            if self._owner is not None and not self._exited_yet():
                self._stopped_at = list(self._children)
                stop_child = _raise_stop()
                try:
                    self._group.create_task(stop_child, name=f"{self.name}-stop")
                except RuntimeError:  # the group is aborting or finishing already
                    stop_child.close()  # 3.11 and 3.12 leave that to us
        if self._owner is None or self._exited_yet():
            self._report = _sort(self._stopped_at, budget, started, log_failures=False)
            return self._report
        me = asyncio.current_task()
        if me is self._owner or me in self._children:  # it would wait for itself
            return _sort(self._stopped_at, budget, started, log_failures=False, provisional=True)
        assert self._exited is not None
        await asyncio.wait([self._exited], timeout=_timeout(budget))
        exited = self._exited_yet()
        report = _sort(self._stopped_at, budget, started, log_failures=False, terminated=exited)
        if not exited and not report.still_running:  # the owner's own code holds it
            report = dataclasses.replace(report, still_running=(self._owner.get_name(),))
        self._report = self._report or report
        return self._report

    def _exited_yet(self) -> bool:
        return self._exited is not None and self._exited.done()


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


# --- the lifecycle contract: seconds, report self-checks, outcomes nobody awaits ----------
#
# _seconds is the seconds family's, pinned by tests/test_copies.py, as are _check_report and
# _timeout (with TaskShutdownReport, shutdown_tasks and _sort, also in asyncio_signals.py).


def _check_report(terminated: bool, still_running: tuple[str, ...]) -> None:
    """A report's self-check: it cannot say it terminated and name what still runs."""
    if terminated and still_running:
        raise ValueError(f"a report cannot say terminated=True with still_running={still_running}")


def _provisional(tasks: Iterable[asyncio.Task[Any]]) -> TaskShutdownReport:
    """The report of a stop that cannot wait: ``terminated=False``, the live tasks named."""
    names = tuple(sorted(t.get_name() for t in tasks if not t.done()))
    return TaskShutdownReport(terminated=False, still_running=names)


def _timeout(budget: float) -> float | None:
    """``budget`` for `asyncio.wait`: None for "as long as it takes" (no timer at all)."""
    return None if budget == math.inf else budget


# Cleanup tasks whose caller stopped waiting at their deadline: referenced here until they
# end, so the collector cannot destroy them mid-flight, and their outcome is logged then.
_overdue: set[asyncio.Task[Any]] = set()


def _log_overdue(name: str, task: asyncio.Task[Any]) -> None:
    _overdue.discard(task)
    if not task.cancelled() and (exc := task.exception()) is not None:
        logger.error("%s failed after its deadline", name, exc_info=exc)


def _log_late_outcome(name: str, future: asyncio.Future[Any]) -> None:
    """Retrieve the outcome nobody awaits any more (no "exception was never retrieved")."""
    if not future.cancelled() and (exc := future.exception()) is not None:
        logger.error("%s failed after its task was cancelled", name, exc_info=exc)


def _seconds(value: object, name: str, *, allow_none: bool = False) -> float:
    """A number of seconds >= 0 as a float; ``math.inf`` means "as long as it takes".

    `_timeout` turns inf into no timer at all for `asyncio.wait`.
    """
    if value is None and allow_none:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return math.inf if value > sys.float_info.max else float(value)  # 10**400: no overflow
