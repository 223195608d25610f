# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""Stop a thread pool on a deadline: graceful first, then forced, and say what was left.

TL;DR: ``with TrackingExecutor(max_workers=4, on_force=token.cancel) as pool:`` submits
as usual; leaving the block calls `TrackingExecutor.stop`, which returns a
`ShutdownReport` within ``stop_timeout`` instead of waiting forever. For any
`TrackingExecutor`, ``shutdown_and_await(pool, timeout, force_timeout=...)`` is Java's
"shutdown, awaitTermination, shutdownNow, awaitTermination" idiom.

A callable in ``report.never_started`` never ran and never will; every other one ran, or
its thread is in ``report.still_running``: the executor's own accounting, never
``Thread.join``, which an interrupted wait can make lie (:gh:`90882`). Python 3.11+,
standard library only; no version can stop a running thread: a task stops early only
if it cooperates (``on_force`` tells it). Guarantees and limits: the docs page,
docs/patterns/executor_shutdown.md.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import math
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ParamSpec, Self, TypeVar

__all__ = [
    "Rejected",
    "ShutdownReport",
    "TrackingExecutor",
    "await_termination",
    "feed",
    "finish_early",
    "run_all",
    "shutdown_and_await",
    "shutdown_now",
    "stop_then_close",
]

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

# The share of a stop() budget kept for the forced phase; the graceful wait gets the rest.
_FORCE_SHARE = 0.25

# The executor whose task the current thread is running; set only around a task.
_current = threading.local()


class Rejected(RuntimeError):
    """A submit after shutdown: a `RuntimeError` that carries the refused work as ``task``."""

    def __init__(self, task: Callable[[], object], reason: str) -> None:
        super().__init__(f"task {task!r} rejected: {reason}")
        self.task = task


@dataclass(frozen=True)
class ShutdownReport:
    """What `TrackingExecutor.stop` or `shutdown_and_await` achieved.

    Attributes:
        terminated: every accepted task had finished or been cancelled in time (the
            pool's threads may still be running their last bytecodes and done-callbacks).
        still_running: names of the threads still running a task at the deadline.
        forced: the graceful wait ran out and `shutdown_now` was used.
        never_started: callables cancelled before they ran, in submission order.
        running_futures: futures whose tasks were still running at the deadline.
        elapsed: seconds the whole call took.
    """

    terminated: bool
    still_running: tuple[str, ...]
    forced: bool = False
    never_started: tuple[Callable[[], object], ...] = ()
    running_futures: tuple[Future[Any], ...] = ()
    elapsed: float = 0.0

    def __post_init__(self) -> None:
        if self.terminated and self.still_running:
            raise ValueError(f"terminated=True with still_running={self.still_running!r}")


class TrackingExecutor(ThreadPoolExecutor):
    """A `ThreadPoolExecutor` that remembers its unfinished futures, with a bounded `stop`.

    Workers start lazily, in `submit`, as in the base class (which accepts work before
    ``start()`` too). Failed tasks are logged at ERROR when they fail.
    """

    def __init__(
        self,
        max_workers: int | None = None,
        thread_name_prefix: str = "",
        *,
        stop_timeout: float = 10.0,
        on_force: Callable[[], object] | None = None,
        **kwargs: Any,
    ) -> None:
        budget = _seconds(stop_timeout, "stop_timeout")
        super().__init__(max_workers, thread_name_prefix, **kwargs)
        self.stop_timeout = budget
        self._on_force = on_force
        # Guards _pending, _shutdown_requested and _started; held by submit() around the
        # base class's submit, so that a snapshot taken after shutdown() sees every task.
        self._tracking_lock = _OwnedLock()
        self._pending: dict[Future[Any], _Task] = {}  # insertion = submission order
        self._shutdown_requested = False
        self._started = False
        self._stop_lock = threading.Lock()  # held for the whole of a stop(); see _stop_once
        self._in_stop: set[int] = set()  # idents of the threads inside stop()
        self._report: ShutdownReport | None = None  # the first completed stop's, kept
        self._on_force_ran = False  # set before on_force is called: at most once, ever
        self._interrupted: ShutdownReport | None = None  # what a stop forced by Ctrl-C found

    def start(self) -> Self:
        """Mark the executor started; `RuntimeError` if it was started or shut down before."""
        with self._tracking_lock:
            if self._started or self._shutdown_requested:
                state = "shut down" if self._shutdown_requested else "started"
                raise RuntimeError(f"start() on an executor that was already {state}")
            self._started = True
        return self

    def stop(self, timeout: float | None = None) -> ShutdownReport:
        """`shutdown_and_await` within ``timeout`` (None: ``stop_timeout``; inf: no limit).

        The last quarter of the budget is the forced wait, which begins with ``on_force``.
        The first call that completes records the report every later call returns. A
        call that cannot wait (from ``on_force``, a signal handler, one of the pool's own
        tasks, another thread past its budget) returns a provisional report instead.

        Raises:
            ValueError: ``timeout`` is not a number of seconds >= 0.
            KeyboardInterrupt, SystemExit: from ``on_force``, once the report is recorded.
        """
        budget = self.stop_timeout if timeout is None else _seconds(timeout, "timeout")
        force = budget * _FORCE_SHARE
        graceful = budget if math.isinf(budget) else budget - force
        # shutdown_and_await(self, graceful, force), recorded once, never waiting for itself.
        return _stop_once(self, budget, graceful, force)

    def __enter__(self) -> Self:
        """Start the executor if it never was; return it if it runs; refuse after shutdown."""
        with self._tracking_lock:
            if self._shutdown_requested:
                raise RuntimeError("cannot enter an executor that was shut down")
            if self._started:  # `with pool.start():`
                return self
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        """`stop` (the base class would wait with no timeout); Ctrl-C again: stop now."""
        if exc_type is None:
            self.stop()
            return
        # An exception (a Ctrl-C) is on its way out: say what we wait for, keep the report.
        try:
            if self._report is None and self._pending:
                logger.warning(
                    "%s: waiting up to %.3gs for %d task(s) to finish (Ctrl-C again: stop now)",
                    exc_type.__name__,
                    self.stop_timeout,
                    len(self._pending),
                )
            report = self.stop()
        except KeyboardInterrupt:  # a second Ctrl-C: stop now (stop() did, if it was inside)
            if self._report is None and self._interrupted is None:
                self._interrupted = _stop_now(self, self._on_force, [], [], None)
            raise KeyboardInterrupt from None  # one traceback, not two chained
        logger.warning("stopped after %s: %s", exc_type.__name__, _summary(report))

    @property
    def report(self) -> ShutdownReport | None:
        """The report of the stop that ended it, or (not recorded) of one a Ctrl-C forced."""
        return self._report or self._interrupted

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Submit ``fn(*args, **kwargs)``; raise `Rejected` after shutdown."""
        task: Callable[[], object] = (
            functools.partial(fn, *args, **kwargs) if args or kwargs else fn
        )
        record = _Task(task)

        def run() -> T:
            # Our own accounting (no Thread.join): a task has ended when its future is done.
            record.thread = threading.current_thread().name
            _current.executor = self
            try:
                return fn(*args, **kwargs)
            finally:
                _current.executor = None

        with self._tracking_lock:
            try:
                future = super().submit(run)
            except RuntimeError as exc:  # "cannot schedule new futures after shutdown"
                raise Rejected(task, str(exc)) from exc
            self._pending[future] = record
        # Outside the lock: if the task already finished, the callback runs right here.
        future.add_done_callback(self._on_done)
        return future

    def _adjust_thread_count(self) -> None:
        # Called by the base class's submit() with the work item queued and its locks
        # held, to start a worker lazily; Thread.start() can fail ("can't start new thread").
        try:
            super()._adjust_thread_count()
        except RuntimeError:
            if not self._threads:
                # No worker could take the item: withdraw it, so that the Rejected that
                # submit() raises is true and no later worker runs it behind our back.
                self._withdraw_queued()
                raise
            # A running worker will take the item: it costs parallelism, not the task.
            logger.warning(
                "could not start another worker thread (%d running); the task waits",
                len(self._threads),
                exc_info=True,
            )

    def _withdraw_queued(self) -> None:
        # Only called with no worker thread alive, under the base class's shutdown lock:
        # nothing else takes from the queue, so everything in it is ours to cancel.
        while True:
            try:
                item = self._work_queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                item.future.cancel()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop accepting work, as `ThreadPoolExecutor.shutdown` does (``wait`` is unbounded)."""
        with self._tracking_lock:
            self._shutdown_requested = True
        super().shutdown(wait=wait, cancel_futures=cancel_futures)

    @property
    def is_shutdown(self) -> bool:
        """Whether `shutdown` (in any form, `stop` included) has been called."""
        with self._tracking_lock:
            return self._shutdown_requested

    def pending(self) -> list[tuple[Future[Any], Callable[[], object]]]:
        """Unfinished futures (queued or running) with their callables, in submission order."""
        with self._tracking_lock:
            return [(future, record.task) for future, record in self._pending.items()]

    def still_running(self) -> list[str]:
        """Names of the threads running one of its tasks now; safe from a signal handler."""
        pending = tuple(self._pending.items())  # one C-level copy: no lock needed
        starting = "(a pool thread, starting its task)"
        return sorted(record.thread or starting for future, record in pending if future.running())

    def worker_threads(self) -> list[threading.Thread]:
        """The pool's worker threads (read from the private ``_threads`` set)."""
        return list(getattr(self, "_threads", ()))

    def _on_done(self, future: Future[Any]) -> None:
        with self._tracking_lock:
            record = self._pending.pop(future, None)
        task = None if record is None else record.task
        exc = None if future.cancelled() else future.exception()
        if exc is None:
            return
        if isinstance(exc, Exception):
            logger.error("task %r failed", task, exc_info=exc)
        else:
            # A BaseException that is not an Exception (a cooperative Cancelled, a
            # KeyboardInterrupt) ended the task on purpose: worth a record, not an error.
            logger.warning("task %r ended by %s", task, type(exc).__name__, exc_info=exc)


def shutdown_now(executor: TrackingExecutor) -> list[Callable[[], object]]:
    """Stop accepting work, cancel everything not yet started, and return it in order.

    Java's ``shutdownNow()`` minus the interrupt, which Python cannot do; never blocks.
    A task never started exactly when `Future.cancel` succeeds on it (the page says why).
    """
    executor.shutdown(wait=False)  # after this returns no new task can be accepted
    never_started = [task for future, task in executor.pending() if future.cancel()]
    # The cancelled work items are still in the pool's internal queue; let it drop them.
    executor.shutdown(wait=False, cancel_futures=True)
    if never_started:
        logger.warning("shutdown_now: %d task(s) never started", len(never_started))
    return never_started


def await_termination(executor: TrackingExecutor, timeout: float | None) -> bool:
    """After a shutdown, wait up to ``timeout`` (None: no limit) for every task to end.

    Raises `RuntimeError` if it was never shut down (it could only time out), and from
    one of the executor's own tasks, which would wait for itself (P6).
    """
    _refuse_own_worker(executor)
    if not executor.is_shutdown:
        raise RuntimeError(
            "await_termination() needs an executor that was shut down: "
            "call executor.shutdown(wait=False) or shutdown_now(executor) first"
        )
    deadline = _deadline(_seconds(timeout, "timeout", allow_none=True))
    futures = [future for future, _ in executor.pending()]
    while concurrent.futures.wait(futures, timeout=_left(deadline)).not_done:
        if time.monotonic() >= deadline:
            return False
    # Every task has ended: the answer rests on the futures, never on Thread.join or
    # is_alive (gh-90882). The threads, returning from their loops, are joined for tidiness.
    current = threading.current_thread()
    for thread in executor.worker_threads():
        if thread is not current:
            thread.join(_left(deadline))
    return True


def shutdown_and_await(
    executor: TrackingExecutor,
    timeout: float,
    *,
    force_timeout: float,
    on_force: Callable[[], object] | None = None,
) -> ShutdownReport:
    """Shut down gracefully, wait up to ``timeout``, then force and wait ``force_timeout`` more.

    ``on_force`` runs at most once per executor, right after `shutdown_now`: the place to
    cancel the token your running tasks watch (Java interrupts them here). What it raises
    is logged; a KeyboardInterrupt or SystemExit from it is raised once the report is
    made. From one of the executor's own tasks it raises `RuntimeError` at once (P6).
    """
    graceful = _seconds(timeout, "timeout")
    force = _seconds(force_timeout, "force_timeout")
    _refuse_own_worker(executor)
    start = time.monotonic()
    forced = False
    never_started: list[Callable[[], object]] = []
    exits: list[BaseException] = []  # on_force's KeyboardInterrupt or SystemExit, for later
    try:
        executor.shutdown(wait=False)  # no new task is accepted from here on
        terminated = await_termination(executor, graceful)
        if not terminated:
            forced = True
            never_started = shutdown_now(executor)  # cancel what never started
            _run_on_force(executor, on_force, exits)  # ask the running tasks to stop
            terminated = await_termination(executor, force)
    except KeyboardInterrupt:  # force now, and re-raise (Java: InterruptedException)
        executor._interrupted = _stop_now(executor, on_force, exits, never_started, start)
        raise
    report = _report(
        executor, terminated=terminated, forced=forced, never_started=never_started, start=start
    )
    if not terminated:
        threads = ", ".join(report.still_running) or "no thread"
        message = "executor did not terminate within %.3gs: %d task(s) still running in %s"
        logger.error(message, graceful + force, len(report.running_futures), threads)
    if exits:
        raise exits[0]
    return report


def _report(
    executor: TrackingExecutor,
    *,
    terminated: bool,
    forced: bool,
    never_started: list[Callable[[], object]],
    start: float | None,
) -> ShutdownReport:
    """A report from the executor's own accounting, read without a lock."""
    running = tuple(future for future in tuple(executor._pending) if future.running())
    still_running = () if terminated else tuple(executor.still_running())
    elapsed = 0.0 if start is None else time.monotonic() - start
    return ShutdownReport(terminated, still_running, forced, tuple(never_started), running, elapsed)


def _run_on_force(
    executor: TrackingExecutor, on_force: Callable[[], object] | None, exits: list[BaseException]
) -> None:
    """Call ``on_force`` once per executor; log what it raises, keep exits for later."""
    if on_force is None or executor._on_force_ran:
        return
    executor._on_force_ran = True  # before the call: an interrupt inside must not repeat it
    _call_on_force(on_force, exits)


def _summary(report: ShutdownReport) -> str:
    """One line for a log: what a stop left."""
    running = ", ".join(report.still_running) or "nothing"
    return (
        f"terminated={report.terminated}, still running: {running}, "
        f"{len(report.never_started)} never started, {report.elapsed:.3g}s"
    )


def _refuse_own_worker(executor: TrackingExecutor) -> None:
    # A task waiting for its own pool waits for itself: raise before anything changes.
    if getattr(_current, "executor", None) is executor:
        raise RuntimeError(
            "cannot await termination from inside one of the executor's own tasks: "
            "call shutdown_now(executor) there, and wait from outside the pool"
        )


@dataclass(slots=True)
class _Task:
    """One accepted callable, and the name of the thread that runs it once it starts."""

    task: Callable[[], object]
    thread: str | None = None  # written once, by the worker, as the task starts


# --- The fixes for the naive code in patterns/naive/executor_shutdown.py ------------------


def stop_then_close(
    executor: TrackingExecutor, resource: Any, timeout: float, *, force_timeout: float
) -> ShutdownReport:
    """Close ``resource`` only once no task can touch it any more (the fix for P1)."""
    report = shutdown_and_await(executor, timeout, force_timeout=force_timeout)
    if report.terminated:
        resource.close()
    else:
        logger.error(
            "leaving %r open: %d task(s) may still use it", resource, len(report.running_futures)
        )
    return report


def run_all(
    tasks: list[Callable[[], object]],
    timeout: float,
    *,
    force_timeout: float,
    on_force: Callable[[], object] | None = None,
) -> ShutdownReport:
    """Run ``tasks`` and return within ``timeout + force_timeout``, failures logged (P4, P5)."""
    pool = TrackingExecutor(max_workers=4)
    for task in tasks:
        pool.submit(task)
    return shutdown_and_await(pool, timeout, force_timeout=force_timeout, on_force=on_force)


def finish_early(executor: TrackingExecutor, steps: list[str]) -> list[Callable[[], object]]:
    """Stop the pool from inside one of its tasks by asking, not waiting (the fix for P6)."""
    steps.append("found the answer")
    never_started = shutdown_now(executor)  # asks and returns: safe from inside a task
    steps.append("cleaned up")
    return never_started


def feed(
    executor: TrackingExecutor, source: Iterator[Callable[[], object]]
) -> Callable[[], object] | None:
    """Submit tasks from ``source`` until the executor refuses one, and return it (P7).

    None if every task was accepted; the tasks after a refused one are still in ``source``.
    """
    for task in source:
        try:
            executor.submit(task)
        except Rejected as exc:
            logger.warning("executor shut down: handing back %r", exc.task)
            return exc.task
    return None


# --- the lifecycle contract: one stop, bounded, never waiting for itself ------------------


def _stop_once(
    executor: TrackingExecutor, budget: float, graceful: float, force: float
) -> ShutdownReport:
    """`TrackingExecutor.stop`: the first `shutdown_and_await` that completes is kept."""
    report = executor._report
    if report is not None:
        return report
    me = threading.get_ident()
    if me in executor._in_stop:  # on_force, or a signal handler, inside this thread's stop()
        return _provisional(executor)
    if executor._tracking_lock.owner == me:
        # A signal handler on a thread interrupted inside submit(): the lock it holds
        # is only released when the handler returns, so a thread of ours stops.
        name = f"{executor._thread_name_prefix}-stopper"
        threading.Thread(target=executor.stop, args=(budget,), name=name).start()
        return _provisional(executor)
    if getattr(_current, "executor", None) is executor:  # one of its own tasks: a request
        executor.shutdown(wait=False)
        return _provisional(executor)
    deadline = _deadline(budget)
    exits: list[BaseException] = []  # on_force's KeyboardInterrupt or SystemExit
    on_force = executor._on_force
    if on_force is not None:
        on_force = functools.partial(_call_on_force, on_force, exits)  # raised once recorded
    try:  # added inside the try: a Ctrl-C here cannot leave this thread marked inside
        executor._in_stop.add(me)
        while not executor._stop_lock.acquire(timeout=_left(deadline)):
            if time.monotonic() >= deadline:
                return _provisional(executor)  # the stop in progress: its truth, now
        try:
            if executor._report is None:
                executor._report = shutdown_and_await(
                    executor, graceful, force_timeout=force, on_force=on_force
                )
            report = executor._report
        finally:
            executor._stop_lock.release()
    finally:
        executor._in_stop.discard(me)
    if exits:
        raise exits[0]
    return report


def _provisional(executor: TrackingExecutor) -> ShutdownReport:
    """What runs now, for a stop() that cannot wait; never recorded, takes no lock."""
    return _report(executor, terminated=False, forced=False, never_started=[], start=None)


def _stop_now(
    executor: TrackingExecutor,
    on_force: Callable[[], object] | None,
    exits: list[BaseException],
    never_started: list[Callable[[], object]],
    start: float | None,
) -> ShutdownReport:
    """After a Ctrl-C: cancel what never started, call ``on_force``, log one line, report."""
    executor.shutdown(wait=False)  # shutdown_now() without its own log line
    cancelled = [task for future, task in executor.pending() if future.cancel()]
    executor.shutdown(wait=False, cancel_futures=True)
    _run_on_force(executor, on_force, exits)
    never_started = never_started + cancelled
    terminated = not executor.still_running()
    report = _report(
        executor, terminated=terminated, forced=True, never_started=never_started, start=start
    )
    logger.warning("interrupted: stopping now: %s", _summary(report))
    return report


def _call_on_force(on_force: Callable[[], object], exits: list[BaseException]) -> None:
    """Call ``on_force``; log what it raises; a KeyboardInterrupt or SystemExit goes to exits."""
    try:
        on_force()
    except BaseException as exc:  # contained: the stop still ends and records its report
        logger.exception("on_force %r raised; the stop goes on", on_force)
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            exits.append(exc)


# Seconds and deadlines, pinned by tests/test_copies.py: inf means as long as it takes.
def _seconds(value: object, name: str, *, allow_none: bool = False) -> float:
    if value is None and allow_none:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return math.inf if value > sys.float_info.max else float(value)


def _deadline(seconds: float) -> float:
    return time.monotonic() + seconds  # inf stays inf: never handed to a C wait as it is


def _left(deadline: float) -> float:
    return min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)  # no OverflowError


# The same code is in bulkhead.py (each module is copied alone); pinned by tests/test_copies.py.
class _OwnedLock:
    """A `threading.Lock` that knows its holder: a signal handler must not wait for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.owner: int | None = None  # the holder's ident; written only by the holder

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not self._lock.acquire(blocking, timeout):
            return False
        self.owner = threading.get_ident()
        return True

    def release(self) -> None:
        self.owner = None
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()
