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
      neither raises because a task is stuck. Called from one of the pool's own tasks,
      they raise `RuntimeError` at once instead of waiting for themselves.
    * A callable in ``report.never_started`` never ran and never will; every other
      accepted callable ran, or its thread is named in ``report.still_running``.
    * Every task that fails is logged at ERROR when it fails, read or not.
    * A refused submit raises `Rejected`, which carries the callable; it never runs.

Python:
    3.11+, standard library only; checked on 3.11.7, 3.12.1 and 3.13.0. None of them can
    stop a running thread: a task stops early only if it cooperates (``on_force`` is
    where to tell it). Waiting for the workers reads the private
    ``ThreadPoolExecutor._threads``; a test checks it on each version.

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
        terminated: every task finished and every worker thread ended in time.
        still_running: names of the worker threads still alive at the deadline.
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
        if not (isinstance(stop_timeout, int | float) and 0 <= stop_timeout < math.inf):
            raise ValueError(f"stop_timeout must be a finite number >= 0, got {stop_timeout!r}")
        super().__init__(max_workers, thread_name_prefix, **kwargs)
        self.stop_timeout = float(stop_timeout)
        self._on_force = on_force
        # Guards _pending, _shutdown_requested and _started. Held by submit() around the
        # base class's submit, so a snapshot taken under it after shutdown() sees every
        # task the executor accepted. Never held while user code runs.
        self._tracking_lock = threading.Lock()
        self._pending: dict[Future[Any], Callable[[], object]] = {}  # insertion = submission order
        self._shutdown_requested = False
        self._started = False
        # Held for the whole of the first stop(), so a concurrent stop() waits for its
        # report instead of starting a second shutdown.
        self._stop_lock = threading.Lock()
        self._report: ShutdownReport | None = None

    def start(self) -> Self:
        """Mark the executor started; `RuntimeError` if it was started or shut down before."""
        with self._tracking_lock:
            if self._started or self._shutdown_requested:
                state = "shut down" if self._shutdown_requested else "started"
                raise RuntimeError(f"start() on an executor that was already {state}")
            self._started = True
        return self

    def stop(self, timeout: float | None = None) -> ShutdownReport:
        """`shutdown_and_await` within ``timeout`` (None: ``stop_timeout``); same report each call.

        Raises `ValueError` for a negative timeout and `RuntimeError` when called from
        one of the pool's own tasks; never for a task that is stuck (the report names it).
        A call made while the first one runs waits for it and returns its report.
        """
        budget = self.stop_timeout if timeout is None else timeout
        if not budget >= 0:  # NaN too
            raise ValueError(f"timeout must be >= 0, got {timeout!r}")
        _refuse_own_worker(self)
        with self._stop_lock:
            if self._report is None:
                force = budget * _FORCE_SHARE
                self._report = shutdown_and_await(
                    self, budget - force, force_timeout=force, on_force=self._on_force
                )
            return self._report

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()  # the base class would wait with no timeout

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Submit ``fn(*args, **kwargs)``; raise `Rejected` after shutdown."""
        task: Callable[[], object] = (
            functools.partial(fn, *args, **kwargs) if args or kwargs else fn
        )
        with self._tracking_lock:
            try:
                future = super().submit(fn, *args, **kwargs)
            except RuntimeError as exc:  # "cannot schedule new futures after shutdown"
                raise Rejected(task, str(exc)) from exc
            self._pending[future] = task
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
            return list(self._pending.items())

    def worker_threads(self) -> list[threading.Thread]:
        """The pool's worker threads (read from the private ``_threads`` set)."""
        return list(getattr(self, "_threads", ()))

    def _on_done(self, future: Future[Any]) -> None:
        with self._tracking_lock:
            task = self._pending.pop(future, None)
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
    deadline = None if timeout is None else time.monotonic() + timeout
    futures = [future for future, _ in executor.pending()]
    _, not_done = concurrent.futures.wait(futures, timeout=timeout)
    if not_done:
        return False
    # A future is done before its worker thread returns (done-callbacks run in the
    # worker), so "terminated" also waits for the threads, within the same deadline.
    for thread in executor.worker_threads():
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            return False
    return True


def _refuse_own_worker(executor: TrackingExecutor) -> None:
    # A task waiting for its own pool to terminate waits for itself: raise before
    # anything is changed, instead of spending the whole budget and reporting failure.
    # submit() adds a worker to _threads only after starting it, and its task may run
    # first; submit holds _tracking_lock throughout, so under the lock the set is whole.
    with executor._tracking_lock:
        own = threading.current_thread() in executor.worker_threads()
    if own:
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

    ``on_force`` runs at most once, right after `shutdown_now`: the place to cancel the
    token your running tasks watch (Java interrupts them at this point; Python cannot).
    If the calling thread gets `KeyboardInterrupt` while waiting, the executor is forced
    (``on_force`` runs then, unless it already has) and the interrupt re-raised, as
    Java's idiom does on ``InterruptedException``. Called from one of the executor's own
    tasks it raises `RuntimeError` at once, having changed nothing (P6).
    """
    _refuse_own_worker(executor)
    start = time.monotonic()
    forced = False
    on_force_called = False  # set before the call: an interrupt inside it must not repeat it
    never_started: list[Callable[[], object]] = []
    try:
        executor.shutdown(wait=False)
        terminated = await_termination(executor, timeout)
        if not terminated:
            forced = True
            never_started = shutdown_now(executor)
            if on_force is not None:
                on_force_called = True
                on_force()
            terminated = await_termination(executor, force_timeout)
    except KeyboardInterrupt:
        cancelled = shutdown_now(executor)
        if on_force is not None and not on_force_called:
            on_force()
        logger.warning(
            "interrupted while awaiting termination: forced (%d never started)",
            len(never_started) + len(cancelled),
        )
        raise
    running = tuple(future for future, _ in executor.pending() if future.running())
    threads = tuple(t.name for t in executor.worker_threads() if t.is_alive())
    report = ShutdownReport(
        terminated=terminated,
        still_running=() if terminated else threads,
        forced=forced,
        never_started=tuple(never_started),
        running_futures=running,
        elapsed=time.monotonic() - start,
    )
    if not terminated:
        logger.error(
            "executor did not terminate within %.3gs: %d task(s) still running in %s",
            timeout + force_timeout,
            len(running),
            ", ".join(report.still_running) or "no thread",
        )
    return report


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
