# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""Stop a thread pool on a deadline: graceful first, then forced, and say what was left.

TL;DR: ``with TrackingExecutor(max_workers=4, on_force=token.cancel) as pool:`` submits
as usual; leaving the block calls `TrackingExecutor.stop`, which returns a
`ShutdownReport` within ``stop_timeout`` instead of waiting forever. For any
`TrackingExecutor`, ``shutdown_and_await(pool, timeout, force_timeout=...)`` is Java's
"shutdown, awaitTermination, shutdownNow, awaitTermination" idiom.

Guarantees:
    * `TrackingExecutor.stop` returns within its budget and `shutdown_and_await` within
      ``timeout + force_timeout`` (plus scheduling noise), whatever the tasks do, and
      neither raises because a task is stuck; inf means as long as it takes. Called from
      one of the pool's own tasks, ``stop()`` is a request that returns at once and
      `shutdown_and_await` raises `RuntimeError` instead of waiting for itself.
    * The first ``stop()`` that completes records the report every later call returns; a
      ``stop()`` from ``on_force`` or a signal handler during a stop (on a thread running
      it or waiting for another thread's), or from another thread past its own budget,
      returns a provisional report instead of blocking.
    * A callable in ``report.never_started`` never ran and never will; every other
      accepted callable ran, or the thread running it is named in
      ``report.still_running``. "Ran" is the executor's own per-task accounting, not
      ``Thread.join``, which an interrupted wait can make lie (:gh:`90882`).
    * ``on_force`` runs at most once per executor; what it raises is logged, and a
      KeyboardInterrupt or SystemExit from it is raised again once the report is made.
    * A Ctrl-C (any exception) leaving a ``with`` block logs one WARNING line saying how
      long the stop may wait, then what the stop left; ``pool.report`` keeps the report.
      A second Ctrl-C during that wait stops now: what never started is cancelled,
      ``on_force`` runs, one line names what was left, and one KeyboardInterrupt is
      raised (not two chained tracebacks).
    * Every task that fails is logged at ERROR when it fails, read or not.
    * A refused submit raises `Rejected`, which carries the callable; it never runs.

Python:
    3.11+, standard library only; checked on 3.11.7, 3.12.1 and 3.13.0. None of them can
    stop a running thread: a task stops early only if it cooperates (``on_force`` is
    where to tell it). After the tasks have ended, the pool's threads are joined (read
    from the private ``ThreadPoolExecutor._threads``; a test checks it on each version)
    within what is left of the budget, but no report depends on that join.

Docs: docs/patterns/executor_shutdown.md
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import math
import queue
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


# The same code is in bulkhead, cancellation, daemon_threads, process_shutdown and supervisor
# (each module is copied alone); pinned by tests/test_copies.py.
def _seconds(value: object, name: str, *, allow_none: bool = False) -> float:
    """``value`` as seconds; inf (and None, if allowed) means as long as it takes."""
    if value is None and allow_none:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    try:
        return float(value)
    except OverflowError:  # an int too large for a float: as long as it takes
        return math.inf


# The same code is in bulkhead.py (each module is copied alone); pinned by tests/test_copies.py.
def _left(deadline: float) -> float:
    """Seconds to ``deadline`` (inf: forever), capped so no C wait raises OverflowError."""
    return min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)


# The same code is in bulkhead.py (each module is copied alone); pinned by tests/test_copies.py.
class _OwnedLock:
    """A `threading.Lock` that knows which thread holds it.

    A signal handler that calls ``stop()`` on a thread interrupted inside ``submit()``
    must not wait for a lock its own thread can only release after the handler returns.
    """

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


class _Task:
    """One accepted callable, and the name of the thread that runs it once it starts."""

    __slots__ = ("task", "thread")

    def __init__(self, task: Callable[[], object]) -> None:
        self.task = task
        self.thread: str | None = None  # written once, by the worker, as the task starts


class Rejected(RuntimeError):
    """A task was refused because the executor is shut down (Java: RejectedExecutionException).

    A `RuntimeError`, as ``ThreadPoolExecutor.submit`` raises, that carries the refused
    work as ``task``, ready to be logged, stored or handed to another executor.
    """

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

    ``start()`` (or ``with``) marks it started; workers still start lazily, in `submit`,
    which also accepts work before ``start()``, as the base class does. ``stop()`` ends it
    within ``stop_timeout``, the last quarter forced, beginning with ``on_force``.
    Failed tasks are logged at ERROR when they fail; finished futures are forgotten.
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
        # Guards _pending, _shutdown_requested and _started. Held by submit() around the
        # base class's submit, so a snapshot taken under it after shutdown() sees every
        # task the executor accepted. Never held while user code runs.
        self._tracking_lock = _OwnedLock()
        self._pending: dict[Future[Any], _Task] = {}  # insertion = submission order
        self._shutdown_requested = False
        self._started = False
        # Held for the whole of a stop(); a stop() from another thread waits for it
        # within its own budget, then returns a provisional report.
        self._stop_lock = threading.Lock()
        # Idents of the threads inside stop(), holding _stop_lock or waiting for it: a
        # stop() that finds its own thread here is on_force or a signal handler on top of
        # that call, which cannot go on until it returns, so it returns at once. A set,
        # not a lock: add and discard are atomic, and a handler reading it takes no lock.
        self._in_stop: set[int] = set()
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

        The first call that completes records its report; every later call returns it.
        Never raises for a task that is stuck (the report names it). Returns a
        provisional report (not recorded) instead of blocking when called from
        ``on_force`` or a signal handler during a stop, or from another thread once its
        own budget is spent waiting for the stop in progress. From one of the pool's
        own tasks it is a request: the pool shuts down gracefully (queued tasks still
        run), and the next stop() from outside returns the final report.

        Raises:
            ValueError: ``timeout`` is not a number of seconds >= 0.
            KeyboardInterrupt, SystemExit: raised by ``on_force``, again once the report
                is recorded.
        """
        budget = self.stop_timeout if timeout is None else _seconds(timeout, "timeout")
        report = self._report
        if report is not None:
            return report
        me = threading.get_ident()
        if me in self._in_stop:  # on_force, or a signal handler, inside this thread's stop()
            return self._provisional()
        if self._tracking_lock.owner == me:
            # A signal handler on a thread interrupted inside submit(): the lock it holds
            # is only released when the handler returns, so a thread of ours stops.
            name = f"{self._thread_name_prefix}-stopper"
            threading.Thread(target=self.stop, args=(budget,), name=name).start()
            return self._provisional()
        if _own_task(self):  # a request from one of its own tasks: never wait for itself
            self.shutdown(wait=False)
            return self._provisional()
        deadline = time.monotonic() + budget
        exits: list[BaseException] = []
        try:  # added inside the try: a Ctrl-C here cannot leave this thread marked inside
            self._in_stop.add(me)
            while not self._stop_lock.acquire(timeout=_left(deadline)):
                if time.monotonic() >= deadline:
                    return self._provisional()  # the stop in progress: its truth, now
            try:
                if self._report is None:
                    force = budget * _FORCE_SHARE
                    graceful = budget if math.isinf(budget) else budget - force
                    self._report = _shutdown_and_await(self, graceful, force, self._on_force, exits)
                report = self._report
            finally:
                self._stop_lock.release()
        finally:
            self._in_stop.discard(me)
        if exits:
            raise exits[0]
        return report

    def _provisional(self) -> ShutdownReport:
        """What runs now, for a stop() that cannot wait; never recorded, takes no lock."""
        return _report(self, terminated=False, forced=False, never_started=[], start=None)

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
        """The report of the stop that ended it, or of the stop a Ctrl-C forced; None before.

        A forced stop's report is not recorded: a later ``stop()`` looks again.
        """
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
        # The base class's submit() calls this after it has queued the work item, with
        # its shutdown lock (and our _tracking_lock) held; it starts a worker lazily, and
        # Thread.start() can fail ("can't start new thread"). The item is queued by then.
        try:
            super()._adjust_thread_count()
        except RuntimeError:
            if not self._threads:
                # No worker could take the item: withdraw it, so that the Rejected that
                # submit() raises is true and no later worker runs it behind our back.
                self._withdraw_queued()
                raise
            # A worker is running and will take the item: the failure costs parallelism,
            # not the task, so the submit succeeds.
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
        """Names of the threads running one of its tasks now; reads without a lock.

        One C-level copy of the dict is a single step under the GIL, so a signal handler
        may call it whatever its thread was doing.
        """
        return sorted(
            record.thread or "(a pool thread, starting its task)"
            for future, record in tuple(self._pending.items())
            if future.running()
        )

    def worker_threads(self) -> list[threading.Thread]:
        """The pool's worker threads (read from the private ``_threads`` set)."""
        return list(getattr(self, "_threads", ()))

    def _on_done(self, future: Future[Any]) -> None:
        with self._tracking_lock:
            record = self._pending.pop(future, None)
        task = None if record is None else record.task
        if future.cancelled():
            return
        exc = future.exception()
        if exc is None:
            return
        info = (type(exc), exc, exc.__traceback__)
        if isinstance(exc, Exception):
            logger.error("task %r failed", task, exc_info=info)
        else:
            # A BaseException that is not an Exception (a cooperative Cancelled, a
            # KeyboardInterrupt) ended the task on purpose: worth a record, not an error.
            logger.warning("task %r ended by %s", task, type(exc).__name__, exc_info=info)


def shutdown_now(executor: TrackingExecutor) -> list[Callable[[], object]]:
    """Stop accepting work, cancel everything not yet started, and return it in order.

    Java's ``shutdownNow()`` minus the interrupt: running tasks are left running, because
    Python cannot interrupt a thread. Does not block.

    A task is "never started" exactly when `Future.cancel` succeeds on it: cancel and a
    worker's ``set_running_or_notify_cancel`` take the same lock, so each queued task is
    either cancelled here or started by a worker, never both and never neither.
    """
    executor.shutdown(wait=False)  # after this returns no new task can be accepted
    never_started = [task for future, task in executor.pending() if future.cancel()]
    # The cancelled work items are still in the pool's internal queue; let it drop them.
    executor.shutdown(wait=False, cancel_futures=True)
    if never_started:
        logger.warning("shutdown_now: %d task(s) never started", len(never_started))
    return never_started


def await_termination(executor: TrackingExecutor, timeout: float | None) -> bool:
    """After a shutdown, wait until every task has finished and every worker has ended.

    Returns True if the executor terminated within ``timeout`` seconds (None: no limit),
    False if the time ran out. Raises `RuntimeError` if the executor was never shut
    down, since then it could only ever time out, and if it is called from one of the
    executor's own tasks, which would wait for itself (P6).
    """
    _refuse_own_worker(executor)
    if not executor.is_shutdown:
        raise RuntimeError(
            "await_termination() needs an executor that was shut down: "
            "call executor.shutdown(wait=False) or shutdown_now(executor) first"
        )
    deadline = time.monotonic() + _seconds(timeout, "timeout", allow_none=True)
    futures = [future for future, _ in executor.pending()]
    while concurrent.futures.wait(futures, timeout=_left(deadline)).not_done:
        if time.monotonic() >= deadline:
            return False
    # Every task has ended: that is the answer, and it rests on the futures, never on
    # Thread.join or is_alive (gh-90882). The threads are joined only for tidiness:
    # each is returning from its loop (after the done-callbacks, which run in it).
    current = threading.current_thread()
    for thread in executor.worker_threads():
        if thread is not current:
            thread.join(_left(deadline))
    return True


def _own_task(executor: TrackingExecutor) -> bool:
    owner: object = getattr(_current, "executor", None)
    return owner is executor


def _refuse_own_worker(executor: TrackingExecutor) -> None:
    # A task waiting for its own pool to terminate waits for itself: raise before
    # anything is changed, instead of spending the whole budget and reporting failure.
    # The mark is set by the task's wrapper, in the worker, before the task runs.
    if _own_task(executor):
        raise RuntimeError(
            "cannot await termination from inside one of the executor's own tasks: "
            "call shutdown_now(executor) there, and wait from outside the pool"
        )


def shutdown_and_await(
    executor: TrackingExecutor,
    timeout: float,
    *,
    force_timeout: float,
    on_force: Callable[[], object] | None = None,
) -> ShutdownReport:
    """Shut down gracefully, wait up to ``timeout``, then force and wait ``force_timeout`` more.

    ``on_force`` runs at most once per executor, right after `shutdown_now`: the place to
    cancel the token your running tasks watch (Java interrupts them at this point;
    Python cannot). Whatever it raises is logged; a KeyboardInterrupt or SystemExit
    from it is raised again once the report is made. If the calling thread gets
    `KeyboardInterrupt` while waiting, the executor is forced (``on_force`` runs then,
    unless it already has) and the interrupt re-raised, as Java's idiom does on
    ``InterruptedException``. Called from one of the executor's own tasks it raises
    `RuntimeError` at once, having changed nothing (P6). inf waits as long as it takes.
    """
    graceful = _seconds(timeout, "timeout")
    force = _seconds(force_timeout, "force_timeout")
    exits: list[BaseException] = []
    report = _shutdown_and_await(executor, graceful, force, on_force, exits)
    if exits:
        raise exits[0]
    return report


def _shutdown_and_await(
    executor: TrackingExecutor,
    timeout: float,
    force_timeout: float,
    on_force: Callable[[], object] | None,
    exits: list[BaseException],
) -> ShutdownReport:
    """`shutdown_and_await`, leaving a KeyboardInterrupt/SystemExit of on_force in exits."""
    _refuse_own_worker(executor)
    start = time.monotonic()
    forced = False
    never_started: list[Callable[[], object]] = []
    try:
        executor.shutdown(wait=False)
        terminated = await_termination(executor, timeout)
        if not terminated:
            forced = True
            never_started = shutdown_now(executor)
            _run_on_force(executor, on_force, exits)
            terminated = await_termination(executor, force_timeout)
    except KeyboardInterrupt:
        executor._interrupted = _stop_now(executor, on_force, exits, never_started, start)
        raise
    report = _report(
        executor, terminated=terminated, forced=forced, never_started=never_started, start=start
    )
    if not terminated:
        logger.error(
            "executor did not terminate within %.3gs: %d task(s) still running in %s",
            timeout + force_timeout,
            len(report.running_futures),
            ", ".join(report.still_running) or "no thread",
        )
    return report


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
    report = _report(
        executor,
        terminated=not executor.still_running(),
        forced=True,
        never_started=never_started + cancelled,
        start=start,
    )
    logger.warning("interrupted: stopping now: %s", _summary(report))
    return report


def _run_on_force(
    executor: TrackingExecutor,
    on_force: Callable[[], object] | None,
    exits: list[BaseException],
) -> None:
    """Call ``on_force`` once per executor; log what it raises, keep exits for later."""
    if on_force is None or executor._on_force_ran:
        return
    executor._on_force_ran = True  # before the call: an interrupt inside must not repeat it
    try:
        on_force()
    except BaseException as exc:  # contained: the stop still ends and records its report
        logger.exception("on_force %r raised; the stop goes on", on_force)
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            exits.append(exc)


def _summary(report: ShutdownReport) -> str:
    """One line for a log: what a stop left."""
    running = ", ".join(report.still_running) or "nothing"
    return (
        f"terminated={report.terminated}, still running: {running}, "
        f"{len(report.never_started)} never started, {report.elapsed:.3g}s"
    )


def _report(
    executor: TrackingExecutor,
    *,
    terminated: bool,
    forced: bool,
    never_started: list[Callable[[], object]],
    start: float | None,
) -> ShutdownReport:
    """A report from the executor's own accounting, read without a lock."""
    pending = tuple(executor._pending)
    still_running = () if terminated else tuple(executor.still_running())
    return ShutdownReport(
        terminated=terminated,
        still_running=still_running,
        forced=forced,
        never_started=tuple(never_started),
        running_futures=tuple(future for future in pending if future.running()),
        elapsed=0.0 if start is None else time.monotonic() - start,
    )


# --- The fixes for the naive code in patterns/naive/executor_shutdown.py ------------------


def stop_then_close(
    executor: TrackingExecutor, resource: Any, timeout: float, *, force_timeout: float
) -> ShutdownReport:
    """Close ``resource`` only once no task can touch it any more (the fix for P1).

    If the executor did not terminate, the resource is left open (a task still uses it)
    and the report says which tasks are still running.
    """
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
    """Stop the pool from inside one of its tasks by asking, not waiting (the fix for P6).

    Returns the tasks that never started; wait for the running ones from outside the pool.
    """
    steps.append("found the answer")
    never_started = shutdown_now(executor)  # asks and returns: safe from inside a task
    steps.append("cleaned up")
    return never_started


def feed(
    executor: TrackingExecutor, source: Iterator[Callable[[], object]]
) -> Callable[[], object] | None:
    """Submit tasks from ``source`` until it is exhausted or the executor refuses one (P7).

    Returns None when every task was accepted, otherwise the refused task; the tasks after
    it are still unread in ``source``. Nothing is lost either way.
    """
    for task in source:
        try:
            executor.submit(task)
        except Rejected as exc:
            logger.warning("executor shut down: handing back %r", exc.task)
            return exc.task
    return None
