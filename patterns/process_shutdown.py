# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""Stop a process pool on a deadline: graceful first, then SIGTERM, then SIGKILL, and report.

TL;DR: ``shutdown_process_pool(pool, timeout, force_timeout=...)`` ends a
`ProcessPoolExecutor` within ``timeout + force_timeout`` even when a task never returns,
and says what never started, what was lost and which pids it killed;
``shutdown_mp_pool`` does the same for a `multiprocessing.pool.Pool`. Give the workers
``initializer=ignore_sigint`` and ``mp_context=safe_context()``, both from ``stoppable_process``
(which stops one child process of your own), or copy those two functions.

Guarantees:
    * `shutdown_process_pool` returns within ``timeout + force_timeout`` (plus scheduling
      noise) and never raises because a task is stuck. When ``report.terminated`` is
      true, no worker process it knew of is alive or a zombie: each one was reaped.
    * A callable in ``report.never_started`` never ran and never will; one in
      ``report.lost`` failed with `BrokenProcessPool` (killed while running, or queued
      in the pool's call queue when the pool broke).
    * `shutdown_mp_pool` returns within ``timeout + force_timeout`` too, also when a
      worker was killed mid-task (its task is reported lost, not waited for), ignores
      SIGTERM or died holding a queue lock, and reaps every worker the pool had while it
      watched, replacements too.
    * A `KeyboardInterrupt` (or any error) anywhere in either function, in the graceful
      wait or in the forcing, sends SIGKILL to the workers at once and reaps them before
      it propagates: no worker outlives the program, not even one that ignores SIGTERM.

Python:
    3.11+, POSIX, standard library only; checked on 3.11.7, 3.12.1 and 3.13.0. On 3.11
    to 3.13 the pool's worker processes can only be reached through the private
    ``ProcessPoolExecutor._processes`` (a dict of pid to process), which ``shutdown()``
    sets to None; a test pins this on each version. 3.14's ``terminate_workers()`` and
    ``kill_workers()`` read the same dict, so after a graceful ``shutdown(wait=False)``
    they find no workers: this module signals its own snapshot instead (read from the
    3.14 source; 3.14 is not run here). ``multiprocessing.pool.Pool`` is the same code
    on the three versions: its workers are the private ``_pool`` list, its threads
    ``_worker_handler``, ``_task_handler`` and ``_result_handler``.

Docs: docs/patterns/process_shutdown.md
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import multiprocessing.pool
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

__all__ = [
    "Collected",
    "PoolShutdownReport",
    "collect",
    "shutdown_mp_pool",
    "shutdown_process_pool",
]

logger = logging.getLogger(__name__)

# The share of the forced phase spent waiting for SIGTERM to work before SIGKILL is sent.
_TERM_SHARE = 0.5
# The share of the forced phase allowed for the pool to cancel its queued work.
_CANCEL_SHARE = 0.25
# The longest single wait: Process.join() ends in poll(), which takes whole milliseconds
# in a C int (about 24 days), far below threading.TIMEOUT_MAX. A longer or infinite wait
# is a loop of these.
_LONGEST_WAIT = 86400.0


# --- process pools ------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolShutdownReport:
    """What `shutdown_process_pool` (or `shutdown_mp_pool`) achieved.

    Attributes:
        terminated: no worker process and no pool thread is left running; every worker
            was reaped. With ``forced`` false, every task also finished on its own.
        still_running: names (with pids) of worker processes alive at the deadline, and
            the pool's threads that had not ended.
        forced: the graceful wait ran out, queued work was cancelled and the workers
            were signalled.
        never_started: names of the callables cancelled before they ran, in order.
        lost: names of the callables that failed with `BrokenProcessPool` (for a
            `multiprocessing.pool.Pool`, of the results passed that never arrived).
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

    def __post_init__(self) -> None:
        if self.terminated and self.still_running:
            raise ValueError(f"terminated=True with still_running={self.still_running!r}")


def shutdown_process_pool(
    executor: ProcessPoolExecutor, timeout: float, *, force_timeout: float
) -> PoolShutdownReport:
    """Shut down gracefully, wait up to ``timeout``, then force and wait ``force_timeout`` more.

    Forcing cancels every task that has not started, sends SIGTERM to the live workers,
    SIGKILL to those still alive half-way through ``force_timeout``, and reaps them all.
    Call it before any other ``shutdown()``: that one forgets the worker processes.
    A `KeyboardInterrupt` (or any error) in the wait or the forcing kills the workers at
    once, reaps them within ``force_timeout`` and is re-raised. Either budget may be
    ``math.inf`` (as long as it takes: an infinite ``force_timeout`` never sends SIGKILL);
    a negative or NaN one is a `ValueError`, never a stuck task.
    """
    timeout = _seconds(timeout, "timeout")
    force_timeout = _seconds(force_timeout, "force_timeout")
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
    except BaseException as exc:
        # Ctrl-C while waiting or forcing (or any error): the caller wants out now, so kill
        # rather than wait, reap within force_timeout, and let the interrupt go on.
        _kill_now(pool, force_timeout)
        interrupt = _the_interrupt(exc)
        if interrupt is exc:
            raise
        raise interrupt from exc

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
    deadline = _deadline(_seconds(timeout, "timeout"))
    results: dict[int, Any] = {}
    errors: dict[int, BaseException] = {}
    lost: list[int] = []
    for index, future in enumerate(futures):
        try:
            exc = _exception(future, deadline)
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


# --- multiprocessing.Pool -----------------------------------------------------------------


def shutdown_mp_pool(
    pool: multiprocessing.pool.Pool,
    timeout: float,
    *,
    force_timeout: float,
    results: Mapping[str, _Result] | None = None,
) -> PoolShutdownReport:
    """Close a `multiprocessing.pool.Pool`, wait up to ``timeout``, then terminate it.

    ``close()`` at once; then wait for the tasks until the deadline, or until a worker
    dies (its task would never return); then ``terminate()``, SIGKILL to the workers
    still alive half-way through ``force_timeout``, every worker reaped, and a queue
    lock a dead worker held released (else ``terminate()`` waits for it). Pass the
    results you hold, by name: those not ready at the end are ``lost`` (a Pool cannot
    tell a task that never started from one killed while running, so ``never_started``
    stays empty). A `KeyboardInterrupt` (or any error) anywhere in the wait or the
    forcing sends SIGKILL to every worker at once, reaps them within ``force_timeout``
    and is re-raised. Budgets are checked as `shutdown_process_pool` checks them.
    """
    timeout = _seconds(timeout, "timeout")
    force_timeout = _seconds(force_timeout, "force_timeout")
    start = time.monotonic()
    seen: dict[int, BaseProcess] = {}
    _mp_watch(pool, seen)
    pool.close()
    terminator = threading.Thread(target=pool.terminate, name="Pool.terminate", daemon=True)
    try:
        drained = _wait_for_pool(pool, seen, start + timeout)
        force_start = time.monotonic()
        kill_at = force_start + force_timeout * (1.0 if drained else _TERM_SHARE)
        killed = _force_mp(pool, seen, terminator, kill_at, force_start + force_timeout)
    except BaseException as exc:
        # Ctrl-C while waiting or forcing (or any error): the caller wants out now, so kill
        # rather than wait (a worker may ignore SIGTERM), reap within force_timeout, go on.
        _kill_mp_now(pool, seen, terminator, force_timeout)
        interrupt = _the_interrupt(exc)
        if interrupt is exc:
            raise
        raise interrupt from exc
    lost = [name for name, result in (results or {}).items() if not result.ready()]
    still = [_proc_name(p) for p in _alive(seen.values())]
    still += [t.name for t in (*_mp_threads(pool), terminator) if t.is_alive()]
    report = PoolShutdownReport(
        terminated=not still,
        still_running=tuple(still),
        forced=not drained,
        lost=tuple(lost),
        killed_pids=tuple(killed),
        elapsed=time.monotonic() - start,
    )
    if not drained:
        logger.warning("pool terminated: %d result(s) lost, killed pids %s", len(lost), killed)
    if still:
        logger.error("pool did not terminate: %s still running", ", ".join(still))
    return report


# The threads a Pool runs in the parent (private on 3.11-3.13): one keeps the workers
# (replacing any that exit), one feeds them tasks, one collects the results.
_POOL_THREADS = ("_worker_handler", "_task_handler", "_result_handler")


class _Result(Protocol):
    # What shutdown_mp_pool reads of a result: the AsyncResult that apply_async,
    # map_async and starmap_async return has it.
    def ready(self) -> bool: ...


def _wait_for_pool(
    pool: multiprocessing.pool.Pool, seen: dict[int, BaseProcess], deadline: float
) -> bool:
    # After close() the pool ends by itself once every task has returned: its threads
    # end and each worker exits on a sentinel. A task whose worker died never returns
    # (the pool replaces the worker and forgets the task), so a death ends the wait.
    threads = _mp_threads(pool)
    while True:
        _mp_watch(pool, seen)
        if not any(t.is_alive() for t in threads):
            if not _alive(seen.values()):  # polled only now that no pool thread does
                return True
        elif dead := _mp_died(pool, seen):
            logger.warning("%s died: its task will never return", _proc_name(dead[0]))
            return False
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(0.01, remaining))  # nothing signals "the pool has ended": poll


def _force_mp(
    pool: multiprocessing.pool.Pool,
    seen: dict[int, BaseProcess],
    terminator: threading.Thread,
    kill_at: float,
    deadline: float,
) -> list[int]:
    # Pool.terminate() stops the worker handler (no more replacements), sends SIGTERM
    # and then joins each worker with no timeout: a worker that ignores SIGTERM holds it
    # for ever (M11). So it runs in a thread of its own, and SIGKILL ends what is left.
    killed = [p.pid or 0 for p in _alive(seen.values())]
    terminator.start()
    _join_thread(terminator, kill_at)
    _mp_watch(pool, seen)
    for process in _alive(seen.values()):
        logger.warning("%s outlived SIGTERM: sending SIGKILL", _proc_name(process))
        if process.pid not in killed:
            killed.append(process.pid or 0)
        process.kill()
    _join_all(_alive(seen.values()), deadline)
    if terminator.is_alive() and _all_workers_gone(pool, seen):
        _free_dead_workers_locks(pool)
    _join_thread(terminator, deadline)
    return killed


def _free_dead_workers_locks(pool: multiprocessing.pool.Pool) -> None:
    # A worker waits for its next task holding the task queue's read lock, and sends a
    # result holding the result queue's write lock. Killed meanwhile, it never releases
    # it: its replacement starves, and terminate() waits for the lock for ever (M12).
    # Once every worker is dead, a held lock that no thread of ours holds (the test
    # Lock.__repr__ makes) was a dead worker's: release it, once.
    for queue_name, lock_name in (("_inqueue", "_rlock"), ("_outqueue", "_wlock")):
        lock = getattr(getattr(pool, queue_name, None), lock_name, None)
        semlock = getattr(lock, "_semlock", None)
        if lock is None or semlock is None:
            continue
        if lock.acquire(False):  # free
            lock.release()
        elif semlock._count() == 0:  # held, by no thread of ours: by a dead worker
            logger.warning("releasing %s.%s: a dead worker held it", queue_name, lock_name)
            lock.release()


def _mp_watch(pool: multiprocessing.pool.Pool, seen: dict[int, BaseProcess]) -> None:
    # Pool._pool (private on 3.11-3.13) holds only the current workers: the worker-handler
    # thread drops one that exited and appends its replacement (maxtasksperchild, a crash).
    # So we read it again on every look, keeping every worker we have ever seen.
    for process in list(getattr(pool, "_pool", ())):  # a copy: that thread edits the list
        if isinstance(process, BaseProcess) and process.pid is not None:
            seen.setdefault(process.pid, process)


def _mp_died(pool: multiprocessing.pool.Pool, seen: dict[int, BaseProcess]) -> list[BaseProcess]:
    # Workers the pool's worker-handler thread has reaped and dropped, with an exit code
    # other than 0 (a worker that retired, maxtasksperchild, or got its sentinel): killed
    # by a signal, or ended by an exit code of its own. Only those: reading the exit code
    # of a forkserver worker that thread may be reading too can see 255 instead.
    current = {id(process) for process in list(getattr(pool, "_pool", ()))}
    return [p for p in list(seen.values()) if id(p) not in current and p.exitcode not in (None, 0)]


def _mp_threads(pool: multiprocessing.pool.Pool) -> list[threading.Thread]:
    found = (getattr(pool, name, None) for name in _POOL_THREADS)
    return [thread for thread in found if isinstance(thread, threading.Thread)]


def _all_workers_gone(pool: multiprocessing.pool.Pool, seen: dict[int, BaseProcess]) -> bool:
    handler = getattr(pool, "_worker_handler", None)  # ended: it starts no worker again
    _mp_watch(pool, seen)
    return not (isinstance(handler, threading.Thread) and handler.is_alive()) and not _alive(
        seen.values()
    )


# --- the lifecycle contract: seconds, deadlines, reaping, Ctrl-C-safe waits and kills -----


# The same code is in every pattern module that needs it; pinned by tests/test_copies.py.
def _seconds(value: object, name: str, *, allow_none: bool = False) -> float:
    """A number of seconds >= 0; inf (or None, where allowed) means as long as it takes."""
    if value is None and allow_none:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return math.inf if value > sys.float_info.max else float(value)


def _deadline(seconds: float) -> float:
    """The `time.monotonic` time ``seconds`` from now (inf stays inf)."""
    return time.monotonic() + seconds


def _left(deadline: float) -> float:
    """Seconds until ``deadline``, capped at `threading.TIMEOUT_MAX`; callers cap lower."""
    return min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)


# The same code as in stoppable_process (each module is copied alone), and _proc_name too;
# pinned by tests/test_copies.py.
def _join(process: BaseProcess, deadline: float) -> None:
    # join() reaps the child (waitpid), so a process that ended is not left a zombie.
    while process.exitcode is None and time.monotonic() < deadline:
        process.join(min(_left(deadline), _LONGEST_WAIT))


def _join_all(processes: Iterable[BaseProcess], deadline: float) -> None:
    for process in processes:
        _join(process, deadline)


def _join_thread(thread: threading.Thread, deadline: float) -> None:
    # Not Thread.join(): on 3.11 and 3.12 a Ctrl-C that lands inside join() marks the
    # thread finished while it still runs (gh-90882); for the pool's manager thread,
    # 3.12 then hung at exit in our runs. is_alive() never blocks, so it cannot be hit.
    while thread.is_alive() and time.monotonic() < deadline:
        time.sleep(min(0.01, _left(deadline)))


def _alive(processes: Iterable[BaseProcess]) -> list[BaseProcess]:
    # A copy first: the pool's manager thread may remove a worker from the dict meanwhile.
    return [p for p in list(processes) if p.exitcode is None and p.is_alive()]


def _exception(future: Future[Any], deadline: float) -> BaseException | None:
    while True:  # in waits a lock can take (TIMEOUT_MAX): an infinite deadline is a loop
        try:
            return future.exception(min(_left(deadline), _LONGEST_WAIT))
        except TimeoutError:
            if time.monotonic() >= deadline:
                raise


def _name(fn: object) -> str:
    return str(getattr(fn, "__qualname__", None) or repr(fn))


def _proc_name(process: BaseProcess) -> str:
    return f"{process.name} (pid {process.pid})"


def _the_interrupt(exc: BaseException) -> BaseException:
    """What to re-raise once the workers are killed: the Ctrl-C itself, if it broke a lock.

    A `KeyboardInterrupt` that lands inside threading's own code (``Thread.start()``
    waiting for the thread, a ``Condition``) can surface as a `RuntimeError` such as
    "release unlocked lock", with the interrupt as its context: the caller's
    ``except KeyboardInterrupt`` should still see the Ctrl-C (seen once on 3.12).
    """
    context = exc.__context__
    if isinstance(context, KeyboardInterrupt) and not isinstance(exc, KeyboardInterrupt):
        return context
    return exc


def _kill_now(pool: _Pool, reap: float) -> None:
    pool.executor.shutdown(wait=False, cancel_futures=True)
    _wake(pool.wakeup)
    deadline = _deadline(reap)
    alive = _alive(pool.workers.values())
    for process in alive:
        process.kill()
    _join_all(alive, deadline)
    if pool.manager is not None:
        # Let the manager finish marking the pool broken (it joins the pool's queue
        # threads); 3.12 can hang at exit collecting a pool left half-way through it.
        _join_thread(pool.manager, deadline)
    logger.warning("interrupted: killed worker pids %s", [p.pid for p in alive])


def _kill_mp_now(
    pool: multiprocessing.pool.Pool,
    seen: dict[int, BaseProcess],
    terminator: threading.Thread,
    reap: float,
) -> None:
    # A Ctrl-C: SIGKILL, no SIGTERM and no wait. terminate() (started here unless the
    # forced phase started it) ends the worker handler, so a worker killed before that
    # may still be replaced: kill until the handler has ended and no worker is left.
    deadline = _deadline(reap)
    if terminator.ident is None:  # not started
        terminator.start()
    killed: list[int] = []
    while True:
        _mp_watch(pool, seen)
        alive = _alive(seen.values())
        for process in alive:
            process.kill()
        killed += [p.pid or 0 for p in alive if p.pid not in killed]
        _join_all(alive, deadline)
        if _all_workers_gone(pool, seen) or time.monotonic() >= deadline:
            break
        time.sleep(min(0.01, _left(deadline)))  # for the handler to end
    if terminator.is_alive() and _all_workers_gone(pool, seen):
        _free_dead_workers_locks(pool)
    _join_thread(terminator, deadline)
    logger.warning("interrupted: killed worker pids %s", killed)
