# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""Stop worker processes on a deadline: graceful first, then SIGTERM, then SIGKILL, and report.

TL;DR: ``shutdown_process_pool(pool, timeout, force_timeout=...)`` ends a
`ProcessPoolExecutor` within ``timeout + force_timeout`` even when a task never returns,
and says what never started, what was lost and which pids it killed. A child process of
your own is a `StoppableProcess`: ``stop()`` sends its stop request, joins on a deadline
and terminates only as the last resort, saying so in its report.

Guarantees:
    * `shutdown_process_pool` returns within ``timeout + force_timeout`` (plus scheduling
      noise) and never raises because a task is stuck. When ``report.terminated`` is
      true, no worker process it knew of is alive or a zombie: each one was reaped.
    * A callable in ``report.never_started`` never ran and never will; one in
      ``report.lost`` failed with `BrokenProcessPool` (killed while running, or queued
      in the pool's call queue when the pool broke).
    * `StoppableProcess.stop` returns within its budget, the same report on every call,
      even if the child was killed behind its back; the child's ``finally`` blocks and
      `atexit` handlers run unless the report says it had to be terminated or killed.
    * Children started by `StoppableProcess` (and pool workers given
      ``initializer=ignore_sigint``) ignore SIGINT: a Ctrl-C reaches only the parent,
      which decides how they stop.

Python:
    3.11+, POSIX, standard library only; checked on 3.11.7, 3.12.1 and 3.13.0. On 3.11
    to 3.13 the pool's worker processes can only be reached through the private
    ``ProcessPoolExecutor._processes`` (a dict of pid to process), which ``shutdown()``
    sets to None; a test pins this on each version. 3.14's ``terminate_workers()`` and
    ``kill_workers()`` read the same dict, so after a graceful ``shutdown(wait=False)``
    they find no workers: this module signals its own snapshot instead (read from the
    3.14 source; 3.14 is not run here). 3.12+ warn when a multi-threaded process
    forks; 3.13 runs `atexit` handlers in ``fork`` and ``forkserver`` children; 3.14
    makes ``forkserver`` the default start method on Linux.

Docs: docs/patterns/process_shutdown.md
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import multiprocessing.queues
import signal
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any, Self

__all__ = [
    "Collected",
    "PoolShutdownReport",
    "ProcessStopReport",
    "StopSignal",
    "StoppableProcess",
    "abandon_queue",
    "collect",
    "ignore_sigint",
    "safe_context",
    "shutdown_process_pool",
]

logger = logging.getLogger(__name__)

# The share of the forced phase spent waiting for SIGTERM to work before SIGKILL is sent.
_TERM_SHARE = 0.5
# The share of the forced phase allowed for the pool to cancel its queued work.
_CANCEL_SHARE = 0.25
# The share of a StoppableProcess budget kept for terminate and kill; the event gets the rest.
_FORCE_SHARE = 0.25


def _check_budget(name: str, value: float) -> float:
    if not (isinstance(value, int | float) and 0 <= value < math.inf):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _name(fn: object) -> str:
    return str(getattr(fn, "__qualname__", None) or repr(fn))


def _proc_name(process: BaseProcess) -> str:
    return f"{process.name} (pid {process.pid})"


def _join_all(processes: Iterable[BaseProcess], deadline: float) -> None:
    # join() reaps the child (waitpid), so a process that ended is not left a zombie.
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))


def _join_thread(thread: threading.Thread, deadline: float) -> None:
    # Not Thread.join(): on 3.11 and 3.12 a Ctrl-C that lands inside join() marks the
    # thread finished while it still runs (gh-90882); for the pool's manager thread,
    # 3.12 then hung at exit in our runs. is_alive() never blocks, so it cannot be hit.
    while thread.is_alive() and time.monotonic() < deadline:
        time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))


def _alive(processes: Iterable[BaseProcess]) -> list[BaseProcess]:
    # A copy first: the pool's manager thread may remove a worker from the dict meanwhile.
    return [p for p in list(processes) if p.exitcode is None and p.is_alive()]


# --- process pools ------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolShutdownReport:
    """What `shutdown_process_pool` achieved.

    Attributes:
        terminated: no worker process and no pool thread is left running; every worker
            was reaped. With ``forced`` false, every task also finished on its own.
        still_running: names (with pids) of worker processes alive at the deadline, and
            the pool's manager thread if it had not ended.
        forced: the graceful wait ran out, queued work was cancelled and the workers
            were signalled.
        never_started: names of the callables cancelled before they ran, in order.
        lost: names of the callables that failed with `BrokenProcessPool`.
        killed_pids: pids that were sent SIGTERM (and SIGKILL if they outlived it).
        elapsed: seconds the whole call took.
    """

    terminated: bool
    still_running: tuple[str, ...]
    forced: bool = False
    never_started: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()
    killed_pids: tuple[int, ...] = ()
    elapsed: float = 0.0


def _pool_workers(executor: ProcessPoolExecutor) -> dict[int, BaseProcess]:
    # Private on 3.11-3.13 (and read by 3.14's terminate_workers too): pid -> process,
    # filled as workers are spawned, and set to None by shutdown(). We keep the dict
    # itself, not a copy, so a worker the pool spawns after this call is seen as well.
    if not hasattr(executor, "_processes"):
        logger.warning("this ProcessPoolExecutor has no _processes: cannot reach its workers")
        return {}
    workers = executor._processes
    if workers is None:
        logger.warning("the pool was shut down already: its workers cannot be reached")
        return {}
    if not isinstance(workers, dict):
        raise TypeError(f"ProcessPoolExecutor._processes is {type(workers).__name__}, not dict")
    return workers


def _wake(wakeup: Any) -> None:
    if wakeup is not None:
        with contextlib.suppress(OSError, ValueError):  # closed: the manager has ended
            wakeup.wakeup()


def _wait_until_none_pending(futures: list[Future[Any]], deadline: float) -> None:
    # A future leaves PENDING when the manager thread cancels it or hands it to the
    # workers' call queue (RUNNING). Nothing signals "the manager got round to it", so
    # poll, briefly and within the deadline.
    while any(not (f.running() or f.done()) for f in futures):
        if time.monotonic() >= deadline:
            return
        time.sleep(0.001)


@dataclass(frozen=True)
class _Pool:
    """What shutdown_process_pool needs of a pool's internals, read before its shutdown()."""

    executor: ProcessPoolExecutor
    workers: dict[int, BaseProcess]  # the pool's own dict: workers spawned later show up
    manager: threading.Thread | None
    wakeup: Any  # the manager's wake-up pipe (a private _ThreadWakeup), or None
    items: list[Any]  # the pool's work items (future, fn, args), in submission order


def _wait_then_force(
    pool: _Pool, deadline: float, force_timeout: float
) -> tuple[bool, list[str], list[int]]:
    executor, workers, manager, items = pool.executor, pool.workers, pool.manager, pool.items
    if manager is not None:
        _join_thread(manager, deadline)
    _join_all(_alive(workers.values()), deadline)
    forced = bool(_alive(workers.values())) or (manager is not None and manager.is_alive())
    never_started: list[str] = []
    killed: list[int] = []
    if not forced:
        return forced, never_started, killed
    force_start = time.monotonic()
    force_deadline = force_start + force_timeout
    # The pool's manager thread cancels what has not started, and forgets it. Cancelling
    # here instead would race it: 3.11's manager dies with InvalidStateError when a
    # worker dies after a queued future was cancelled behind its back. This second
    # shutdown() cannot wake the manager (the first one dropped the wake-up pipe), so
    # we use the pipe we kept.
    executor.shutdown(wait=False, cancel_futures=True)
    _wake(pool.wakeup)
    _wait_until_none_pending(
        [item.future for item in items], force_start + force_timeout * _CANCEL_SHARE
    )
    never_started = [_name(item.fn) for item in items if item.future.cancelled()]
    for process in _alive(workers.values()):
        killed.append(process.pid or 0)
        process.terminate()
    _join_all(_alive(workers.values()), force_start + force_timeout * _TERM_SHARE)
    for process in _alive(workers.values()):
        logger.warning("%s outlived SIGTERM: sending SIGKILL", _proc_name(process))
        process.kill()
    _join_all(_alive(workers.values()), force_deadline)
    if manager is not None:
        # A dead worker breaks the pool: the manager fails the running futures with
        # BrokenProcessPool and ends.
        _join_thread(manager, force_deadline)
    return forced, never_started, killed


def _kill_now(pool: _Pool, reap: float) -> None:
    pool.executor.shutdown(wait=False, cancel_futures=True)
    _wake(pool.wakeup)
    deadline = time.monotonic() + reap
    alive = _alive(pool.workers.values())
    for process in alive:
        process.kill()
    _join_all(alive, deadline)
    if pool.manager is not None:
        # Let the manager finish marking the pool broken (it joins the pool's queue
        # threads); 3.12 can hang at exit collecting a pool left half-way through it.
        _join_thread(pool.manager, deadline)
    logger.warning("interrupted: killed worker pids %s", [p.pid for p in alive])


def shutdown_process_pool(
    executor: ProcessPoolExecutor, timeout: float, *, force_timeout: float
) -> PoolShutdownReport:
    """Shut down gracefully, wait up to ``timeout``, then force and wait ``force_timeout`` more.

    Forcing cancels every task that has not started, sends SIGTERM to the live workers,
    SIGKILL to those still alive half-way through ``force_timeout``, and reaps them all.
    Call it before any other ``shutdown()``: that one forgets the worker processes.
    A `KeyboardInterrupt` while it waits kills the workers at once, reaps them within
    ``force_timeout`` and is re-raised. Raises `ValueError` for a negative or infinite
    budget; never for a stuck task.
    """
    timeout = _check_budget("timeout", timeout)
    force_timeout = _check_budget("force_timeout", force_timeout)
    start = time.monotonic()
    workers = _pool_workers(executor)  # before shutdown(), which drops it
    manager: threading.Thread | None = getattr(executor, "_executor_manager_thread", None)
    wakeup = getattr(executor, "_executor_manager_thread_wakeup", None)  # dropped too
    executor.shutdown(wait=False)
    # submit() adds to this dict under the lock shutdown() took, so it is complete now.
    items = list(getattr(executor, "_pending_work_items", {}).values())

    pool = _Pool(executor, workers, manager, wakeup, items)
    try:
        forced, never_started, killed = _wait_then_force(pool, start + timeout, force_timeout)
    except KeyboardInterrupt:
        # Ctrl-C while waiting: the caller wants out now, so kill rather than wait, reap
        # within force_timeout, and let the interrupt go on.
        _kill_now(pool, force_timeout)
        raise

    lost = [
        _name(item.fn)
        for item in items
        if item.future.done()
        and not item.future.cancelled()
        and isinstance(item.future.exception(), BrokenProcessPool)
    ]
    still = [_proc_name(p) for p in _alive(workers.values())]
    if manager is not None and manager.is_alive():
        still.append(manager.name)
    report = PoolShutdownReport(
        terminated=not still,
        still_running=tuple(still),
        forced=forced,
        never_started=tuple(never_started),
        lost=tuple(lost),
        killed_pids=tuple(killed),
        elapsed=time.monotonic() - start,
    )
    if forced:
        logger.warning(
            "process pool forced after %.3gs: %d never started, %d lost, killed pids %s",
            timeout,
            len(never_started),
            len(lost),
            list(killed),
        )
    if still:
        logger.error("process pool did not terminate: %s still running", ", ".join(still))
    return report


@dataclass(frozen=True)
class Collected:
    """What `collect` found: results by position, failures, and work lost to a broken pool."""

    results: dict[int, Any]
    errors: dict[int, BaseException]
    lost: tuple[int, ...]


def collect(futures: list[Future[Any]], timeout: float) -> Collected:
    """Wait up to ``timeout`` for ``futures`` and sort them out; never raises for a task.

    A worker that dies (``os._exit``, SIGKILL, the OOM killer) breaks the whole pool:
    every future not finished fails with `BrokenProcessPool`. Those are reported as
    ``lost`` (positions), apart from the tasks' own errors; the results that did arrive
    are kept. A future still pending at the deadline counts as lost too.
    """
    timeout = _check_budget("timeout", timeout)
    deadline = time.monotonic() + timeout
    results: dict[int, Any] = {}
    errors: dict[int, BaseException] = {}
    lost: list[int] = []
    for index, future in enumerate(futures):
        try:
            exc = future.exception(max(0.0, deadline - time.monotonic()))
        except (TimeoutError, CancelledError):  # still pending at the deadline, or never ran
            lost.append(index)
            continue
        if exc is None:
            results[index] = future.result()
        elif isinstance(exc, BrokenProcessPool):
            lost.append(index)
        else:
            errors[index] = exc
    if lost:
        logger.error("%d of %d task(s) lost (pool broken or timed out)", len(lost), len(futures))
    return Collected(results=results, errors=errors, lost=tuple(lost))


def ignore_sigint() -> None:
    """Make this process ignore SIGINT: a pool ``initializer`` or the first line of a child.

    A Ctrl-C in a terminal reaches every process in the foreground process group; with
    this the parent alone gets `KeyboardInterrupt` and decides how the children stop.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def safe_context() -> BaseContext:
    """A start method that does not fork the current process: ``forkserver``, else ``spawn``.

    A forked child inherits every lock in the state it had at the fork, held ones too,
    but only the thread that forked: a lock another thread held stays locked for ever.
    ``forkserver`` forks from a clean, single-threaded server; ``spawn`` starts afresh.
    """
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def abandon_queue(q: multiprocessing.queues.Queue[Any]) -> None:
    """Let this process exit without waiting for ``q``'s feeder thread; buffered items are lost.

    At exit, `multiprocessing` joins each queue's feeder thread, which waits until every
    item it buffered is written into the pipe: with nobody reading, forever. Call this
    in a producer whose consumer is gone (the items then are lost: better known than hung).
    """
    q.cancel_join_thread()
    q.close()
    logger.warning("abandoned a multiprocessing queue: items not yet sent are lost")


# --- one child process under the lifecycle contract ---------------------------------------


@dataclass(frozen=True)
class ProcessStopReport:
    """What `StoppableProcess.stop` achieved.

    Attributes:
        terminated: the child has exited and was reaped.
        still_running: the child's name (with its pid) if it outlived even SIGKILL.
        escalation: "" (it stopped when asked), "terminate" or "kill": the last signal sent.
        exitcode: the child's exit code (negative: the signal that ended it), or None.
        elapsed: seconds the stop took.
    """

    terminated: bool
    still_running: tuple[str, ...]
    escalation: str = ""
    exitcode: int | None = None
    elapsed: float = 0.0


class StopSignal:
    """The child's end of a stop request: ``is_set()`` and ``wait(timeout)``, as an Event has.

    It is the read end of a pipe; the parent writes one byte and closes its end. Unlike
    a `multiprocessing.Event`, setting it never waits for the child: ``Event.set()``
    waits for every process blocked in ``wait()`` to acknowledge, for ever if one of
    them was killed (M7).
    """

    def __init__(self, reader: Connection) -> None:
        self._reader = reader

    def is_set(self) -> bool:
        """Whether the parent asked this process to stop."""
        return self._reader.poll()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the parent asks this process to stop or ``timeout`` passes."""
        return self._reader.poll(timeout)


def _child_main(target: Callable[..., object], stop: StopSignal, args: tuple[Any, ...]) -> None:
    ignore_sigint()  # before the target runs: a Ctrl-C is the parent's to handle
    target(stop, *args)


def _request_stop(writer: Connection) -> None:
    # One byte makes the read end readable even when a forked child holds a copy of the
    # write end (so closing alone would never give it EOF). Neither call blocks.
    with contextlib.suppress(OSError):  # the child is gone, its end closed: nothing to tell
        writer.send_bytes(b"s")
    writer.close()


class StoppableProcess:
    """A child process that is asked to stop, waited for, and forced only as the last resort.

    ``target(stop, *args)`` runs in the child (with SIGINT ignored) and should return
    soon after ``stop.is_set()``, or ``stop.wait()``, says so (a `StopSignal`). The
    default start method is ``spawn``: before 3.13, ``fork`` and ``forkserver``
    children end with ``os._exit`` and skip their `atexit` handlers. The constructor
    starts nothing;
    ``start()`` starts the child; ``stop(timeout)`` sets the event, waits, then sends
    SIGTERM and, later, SIGKILL, within ``stop_timeout``; the report says which it took.
    """

    def __init__(
        self,
        target: Callable[..., object],
        args: tuple[Any, ...] = (),
        *,
        name: str | None = None,
        stop_timeout: float = 5.0,
        context: BaseContext | None = None,
    ) -> None:
        self.stop_timeout = _check_budget("stop_timeout", stop_timeout)
        self._target = target
        self._args = args
        self._name = name
        self._context = context if context is not None else multiprocessing.get_context("spawn")
        # Guards _process and _report; held for the whole first stop(), so a second
        # caller waits for its report instead of signalling the child again.
        self._lock = threading.Lock()
        self._process: BaseProcess | None = None
        self._stop_writer: Connection | None = None
        self._report: ProcessStopReport | None = None

    @property
    def pid(self) -> int | None:
        """The child's pid once started."""
        return None if self._process is None else self._process.pid

    def start(self) -> Self:
        """Start the child; `RuntimeError` if started or stopped before. All or nothing."""
        with self._lock:
            if self._process is not None or self._report is not None:
                raise RuntimeError("start() on a StoppableProcess that was already started")
            reader, writer = self._context.Pipe(duplex=False)
            process = self._context.Process(  # type: ignore[attr-defined]
                target=_child_main,
                args=(self._target, StopSignal(reader), self._args),
                name=self._name,
            )
            try:
                process.start()
            except BaseException:
                writer.close()  # nothing was started: leave nothing open either
                raise
            finally:
                reader.close()  # the child has its own copy now
            self._stop_writer, self._process = writer, process
        return self

    def stop(self, timeout: float | None = None) -> ProcessStopReport:
        """Send the stop request, wait, force near the end of ``timeout``; same report each call."""
        budget = self.stop_timeout if timeout is None else _check_budget("timeout", timeout)
        with self._lock:
            if self._report is None:
                self._report = self._stop_once(budget)
            return self._report

    def _stop_once(self, budget: float) -> ProcessStopReport:
        start = time.monotonic()
        process, writer = self._process, self._stop_writer
        if process is None or writer is None:
            return ProcessStopReport(terminated=True, still_running=())
        _request_stop(writer)
        force = budget * _FORCE_SHARE
        process.join(budget - force)
        escalation = ""
        if process.exitcode is None:
            escalation = "terminate"
            logger.warning("%s ignored its stop request: sending SIGTERM", _proc_name(process))
            process.terminate()
            process.join(force * _TERM_SHARE)
        if process.exitcode is None:
            escalation = "kill"
            logger.warning("%s outlived SIGTERM: sending SIGKILL", _proc_name(process))
            process.kill()
            process.join(max(0.0, start + budget - time.monotonic()))
        alive = process.exitcode is None
        if alive:
            logger.error("%s still running after stop()", _proc_name(process))
        return ProcessStopReport(
            terminated=not alive,
            still_running=(_proc_name(process),) if alive else (),
            escalation=escalation,
            exitcode=process.exitcode,
            elapsed=time.monotonic() - start,
        )

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
