"""Stop a thread pool on a deadline: graceful first, then forced, and say what was left.

TL;DR: ``shutdown_and_await(executor, timeout, force_timeout=...)`` is Java's
"shutdown, awaitTermination, shutdownNow, awaitTermination" idiom for a
`concurrent.futures.ThreadPoolExecutor`, bounded by ``timeout + force_timeout``.

Pitfall:
    `ThreadPoolExecutor.shutdown` has two modes and neither is bounded. ``wait=False``
    returns at once, so code that goes on to close a file or connection races the tasks
    still using it (P1). ``wait=True`` (and leaving a ``with`` block) waits with no
    timeout, forever if one task is stuck (P3, P4). ``cancel_futures=True`` cancels only
    queued work, returns nothing you could resubmit or log, and leaves running tasks
    running (P2). An exception in a task whose future nobody reads is never seen (P5).
    A task that waits for its own pool to terminate waits for itself (P6). A submit
    after shutdown raises a bare `RuntimeError` that takes the task with it (P7).

Pattern:
    `TrackingExecutor` remembers every unfinished future and the callable behind it. On
    top of it, `shutdown_now` returns the never-started callables in submission order,
    `await_termination` waits with a timeout, and `shutdown_and_await` combines them:
    stop accepting work, wait up to ``timeout`` for everything to finish, then cancel
    what never started, ask running tasks to stop (``on_force``), wait up to
    ``force_timeout`` more, and return a `ShutdownReport` of what was left.

Guarantees:
    * `shutdown_and_await` returns within ``timeout + force_timeout`` (plus scheduling
      noise) whatever the tasks do, and never raises because a task is stuck. Called
      from one of the pool's own tasks, it raises `RuntimeError` at once instead of
      waiting for itself (P6).
    * A callable in ``report.never_started`` never ran and never will; every other
      submitted callable ran or is running (``report.still_running``).
    * Every task that fails is logged at ERROR when it fails, read or not.
    * A submit that is refused raises `Rejected`, which carries the refused callable;
      a refused callable never runs, even when the refusal is a worker thread that
      could not start.

Python:
    3.11+; checked on 3.11.7, 3.12.1 and 3.13.0. None of them can stop a running
    thread (`threading.Thread` has no stop or interrupt, `Future.cancel` refuses a
    running task): a running task stops early only if it cooperates (see the
    ``cancellation`` module) and ``on_force`` tells it to. ``shutdown()`` has no
    timeout. Pool workers are non-daemon threads joined at interpreter exit, so a task
    still running after `shutdown_and_await` gave up keeps the process alive when
    ``main`` returns; a program that must exit anyway escalates to `os._exit` after
    logging the report. Waiting for the worker threads to end reads the private
    ``ThreadPoolExecutor._threads``; a test checks on each version that it holds the
    workers.

Java:
    ``shutdown()`` is ``shutdown(wait=False)``; ``shutdownNow()`` is `shutdown_now` minus
    the interrupt (pass ``on_force`` to signal your own cancellation token instead);
    ``awaitTermination`` is `await_termination`; the ``catch (InterruptedException)``
    branch of the idiom is the `KeyboardInterrupt` branch of `shutdown_and_await`;
    ``RejectedExecutionException`` is `Rejected`.

See also:
    ``cancellation`` (cooperative stop for running tasks), ``thread_exceptions``
    (logging every thread's and task's failure), ``daemon_threads`` (what interpreter
    exit waits for).
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

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


class Rejected(RuntimeError):
    """A task was refused because the executor is shut down (Java: RejectedExecutionException).

    It derives from `RuntimeError`, which is what `ThreadPoolExecutor.submit` raises, so
    existing ``except RuntimeError`` code keeps working; ``task`` is the refused work,
    ready to be logged, stored or handed to another executor.
    """

    def __init__(self, task: Callable[[], object], reason: str) -> None:
        super().__init__(f"task {task!r} rejected: {reason}")
        self.task = task


class TrackingExecutor(ThreadPoolExecutor):
    """A `ThreadPoolExecutor` that remembers its unfinished futures and their callables.

    Finished futures are forgotten at once, so memory stays proportional to the work
    still queued or running. Every task that fails is logged at ERROR with its traceback
    at the moment it fails, whether or not anyone ever calls ``result()``. A cancelled
    task is not an error and is not logged; a task ended by a `BaseException` that is
    not an `Exception` (a cooperative ``Cancelled``, say) is logged at WARNING.

    Workers start lazily, in `submit`, and starting one can fail. If another worker is
    running, the task is accepted and waits for it (a WARNING says so); if none is, the
    task is withdrawn and `submit` raises `Rejected`, so a rejected task never runs.
    """

    def __init__(
        self, max_workers: int | None = None, thread_name_prefix: str = "", **kwargs: Any
    ) -> None:
        super().__init__(max_workers, thread_name_prefix, **kwargs)
        # Guards _pending and _shutdown_requested. Held by submit() around the base
        # class's submit, so a snapshot taken under it after shutdown() sees every
        # task the executor accepted. Never held while user code runs.
        self._tracking_lock = threading.Lock()
        self._pending: dict[Future[Any], Callable[[], object]] = {}  # insertion = submission order
        self._shutdown_requested = False

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Submit ``fn(*args, **kwargs)``; raise `Rejected` after shutdown."""
        task: Callable[[], object] = (
            functools.partial(fn, *args, **kwargs) if args or kwargs else fn
        )
        with self._tracking_lock:
            try:
                future = super().submit(fn, *args, **kwargs)
            except (
                RuntimeError
            ) as exc:  # "cannot schedule new futures after (interpreter) shutdown"
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
        """Stop accepting work, as `ThreadPoolExecutor.shutdown` does."""
        with self._tracking_lock:
            self._shutdown_requested = True
        super().shutdown(wait=wait, cancel_futures=cancel_futures)

    @property
    def is_shutdown(self) -> bool:
        """Whether `shutdown` (in any form) has been called."""
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


@dataclass(frozen=True)
class ShutdownReport:
    """What `shutdown_and_await` achieved.

    Attributes:
        terminated: every task finished and every worker thread ended in time.
        forced: the graceful wait ran out and `shutdown_now` was used.
        never_started: callables that were cancelled before they ran, in submission order.
        still_running: futures whose tasks were still running when the deadline passed.
        elapsed: seconds the whole call took.
    """

    terminated: bool
    forced: bool
    never_started: list[Callable[[], object]] = field(default_factory=list)
    still_running: list[Future[Any]] = field(default_factory=list)
    elapsed: float = 0.0


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
    if threading.current_thread() in executor.worker_threads():
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
    Java's idiom does on `InterruptedException`. Called from one of the executor's own
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
    still_running = [future for future, _ in executor.pending() if future.running()]
    report = ShutdownReport(
        terminated, forced, never_started, still_running, time.monotonic() - start
    )
    if not terminated:
        logger.error(
            "executor did not terminate within %.3gs: %d task(s) still running",
            timeout + force_timeout,
            len(still_running),
        )
    return report


# --- Broken on purpose: the naive versions the tests and docs compare against ------------


def naive_stop_then_close(executor: ThreadPoolExecutor, resource: Any) -> None:
    """Broken on purpose: `shutdown(wait=False)` does not wait, so closing races the tasks (P1)."""
    executor.shutdown(wait=False)
    resource.close()


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
            "leaving %r open: %d task(s) may still use it", resource, len(report.still_running)
        )
    return report


def naive_shutdown_now(executor: ThreadPoolExecutor) -> None:
    """Broken on purpose: ``cancel_futures=True`` is not Java's ``shutdownNow()`` (P2).

    Running tasks go on running, and the cancelled tasks are not returned, so nobody can
    log or resubmit them.
    """
    executor.shutdown(wait=False, cancel_futures=True)


def naive_run_all(tasks: list[Callable[[], object]]) -> None:
    """Broken on purpose: the ``with`` block waits forever on a stuck task (P4).

    And the futures it drops hide every exception (P5).
    """
    with ThreadPoolExecutor(max_workers=4) as pool:
        for task in tasks:
            pool.submit(task)


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


def naive_feed(executor: ThreadPoolExecutor, source: Iterator[Callable[[], object]]) -> int:
    """Broken on purpose: a submit after shutdown loses the task in hand (P7).

    The bare `RuntimeError` ends the loop, and the task is gone: not run, not returned,
    not logged.
    """
    submitted = 0
    for task in source:
        executor.submit(task)
        submitted += 1
    return submitted


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
