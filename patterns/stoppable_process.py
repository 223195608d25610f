# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""Stop one child process: ask it, wait on a deadline, force it only as the last resort, report.

TL;DR: a child process of your own is a `StoppableProcess`: ``start()`` runs
``target(stop, *args)`` in it, and ``stop()`` sends its stop request (a `StopSignal`),
joins on a deadline and terminates only as the last resort, saying so in its report.
`ignore_sigint`, `safe_context` and `abandon_queue` keep a Ctrl-C, a fork and a queue's
unsent items from breaking a child or holding the exit.

Guarantees:
    * `StoppableProcess.stop` returns within its budget; the first stop that completes
      is recorded and every later call returns it, even if the child was killed behind
      its back. With every start method (``fork``, ``forkserver``, ``spawn``) the child's
      ``finally`` blocks and the `atexit` handlers registered in the child run unless the
      report says it had to be terminated or killed (or the child ended itself with
      ``os._exit`` or a crash). Once stopped, it holds no file descriptor of the child.
    * Children started by `StoppableProcess` (and pool workers given
      ``initializer=ignore_sigint``) ignore SIGINT: a Ctrl-C reaches only the parent,
      which decides how they stop.

Python:
    3.11+, POSIX, standard library only; checked on 3.11.7, 3.12.1 and 3.13.0. 3.12+ warn
    when a multi-threaded process forks; ``fork`` and ``forkserver`` children skip their
    `atexit` handlers before 3.13 (``os._exit``), so on 3.11 and 3.12 `StoppableProcess`
    runs them itself, as 3.13 does; 3.14 makes ``forkserver`` the default start method
    on Linux.

Docs: docs/patterns/stoppable_process.md
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import multiprocessing
import multiprocessing.queues
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any, Self

__all__ = [
    "ProcessStopReport",
    "StopSignal",
    "StoppableProcess",
    "abandon_queue",
    "ignore_sigint",
    "safe_context",
]

logger = logging.getLogger(__name__)

# The share of a StoppableProcess budget kept for terminate and kill; the event gets the rest.
_FORCE_SHARE = 0.25
# The share of the forced phase spent waiting for SIGTERM to work before SIGKILL is sent.
_TERM_SHARE = 0.5
# How long a failed start() waits for the child it killed to be reaped.
_ABANDON_WAIT = 5.0
# The longest single wait: Process.join() and Connection.poll() end in poll(), which takes
# whole milliseconds in a C int (about 24 days), far below threading.TIMEOUT_MAX. A longer
# or infinite wait is a loop of these.
_LONGEST_WAIT = 86400.0


# --- one child process: asked first, waited for, forced only as the last resort -----------


@dataclass(frozen=True)
class ProcessStopReport:
    """What `StoppableProcess.stop` achieved.

    Attributes:
        terminated: the child has exited and was reaped.
        still_running: the child's name (with its pid) if it had not exited yet.
        escalation: "" (it stopped when asked), "terminate" or "kill": the last signal sent.
        exitcode: the child's exit code (negative: the signal that ended it), or None.
        elapsed: seconds the stop took.
    """

    terminated: bool
    still_running: tuple[str, ...]
    escalation: str = ""
    exitcode: int | None = None
    elapsed: float = 0.0

    def __post_init__(self) -> None:
        if self.terminated and self.still_running:
            raise ValueError(f"terminated=True with still_running={self.still_running!r}")


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
        deadline = _deadline(_seconds(timeout, "timeout", allow_none=True))
        while not self._reader.poll(min(_left(deadline), _LONGEST_WAIT)):
            if time.monotonic() >= deadline:
                return False
        return True


class StoppableProcess:
    """A child process that is asked to stop, waited for, and forced only as the last resort.

    ``target(stop, *args)`` runs in the child (with SIGINT ignored) and should return
    soon after ``stop.is_set()``, or ``stop.wait()``, says so (a `StopSignal`). The
    default start method is ``spawn``; with ``fork`` and ``forkserver`` the child's own
    `atexit` handlers run when the target ends, on every version. The constructor
    starts nothing; ``start()`` starts the child; ``stop(timeout)`` sends the request,
    waits, then sends SIGTERM and, later, SIGKILL, within the budget; the report says
    which it took. ``with`` starts it if it was never started and stops it at the end.

    ``stop()`` is safe from a signal handler or from a second thread: called on a
    thread already inside ``start()`` or ``stop()`` (a handler) it returns a provisional
    report at once; from another thread while a stop runs it waits at most its own
    budget for that stop, then returns a provisional report. A provisional report says
    ``terminated=False`` and is not recorded.
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
        self.stop_timeout = _seconds(stop_timeout, "stop_timeout")
        self._target = target
        self._args = args
        self._name = name
        self._context = context if context is not None else multiprocessing.get_context("spawn")
        # Held by the thread inside start() or stop(). stop() only ever tries it, or waits
        # for it with its own deadline; _here.busy says "this thread holds it (or is about
        # to)", so a signal handler on that thread never waits for itself.
        self._busy = threading.Lock()
        self._here = threading.local()
        self._started = False
        self._process: BaseProcess | None = None
        self._pid: int | None = None
        self._label = ""
        self._stop_writer: Connection | None = None
        self._escalation = ""
        self._report: ProcessStopReport | None = None

    @property
    def pid(self) -> int | None:
        """The child's pid once started."""
        return self._pid

    def start(self) -> Self:
        """Start the child; `RuntimeError` if started (or tried) or stopped before.

        All or nothing: if anything fails once the child runs (a Ctrl-C too), the child
        is killed and reaped before the error propagates.
        """
        inside = getattr(self._here, "busy", False)  # called by a handler inside stop()?
        self._here.busy = True  # before taking the lock: a handler's stop() must not wait
        try:
            if not self._busy.acquire(blocking=False):
                raise RuntimeError("start() while a start() or stop() of the same object runs")
            try:
                if self._started or self._report is not None:
                    raise RuntimeError("start() on a StoppableProcess already started or stopped")
                self._started = True
                self._spawn()
            finally:
                self._busy.release()
        finally:
            self._here.busy = inside
        return self

    def stop(self, timeout: float | None = None) -> ProcessStopReport:
        """Ask, wait, force near the end of ``timeout``; the first completed report thereafter.

        ``timeout`` defaults to ``stop_timeout``; ``math.inf`` waits as long as it takes
        (and never forces).
        """
        budget = self.stop_timeout if timeout is None else _seconds(timeout, "timeout")
        # Once, whoever calls: the first stop runs _stop_once; a handler on a thread inside
        # start() or stop(), or one that waited out its budget for another, is provisional.
        return self._report or _stop_guarded(self, budget)

    def __enter__(self) -> Self:
        if self._report is not None:
            raise RuntimeError("a stopped StoppableProcess cannot be started again")
        if self._process is not None:  # started with start(): `with p.start():`
            return self
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _stop_once(self, deadline: float) -> ProcessStopReport:
        start = time.monotonic()
        process, writer = self._process, self._stop_writer
        if process is None:  # never started, or its start failed (and was cleaned up)
            self._report = ProcessStopReport(terminated=True, still_running=())
            return self._report
        if writer is not None:
            self._stop_writer = None
            _request_stop(writer)
        budget = max(0.0, deadline - start)
        force_start = start + budget * (1 - _FORCE_SHARE)  # inf stays inf: never forced
        _join(process, force_start)
        if process.exitcode is None:
            self._escalation = "terminate"
            logger.warning("%s ignored its stop request: sending SIGTERM", self._label)
            process.terminate()
            _join(process, force_start + budget * _FORCE_SHARE * _TERM_SHARE)
        if process.exitcode is None:
            self._escalation = "kill"
            logger.warning("%s outlived SIGTERM: sending SIGKILL", self._label)
            process.kill()
            _join(process, deadline)
        exitcode = process.exitcode
        if exitcode is None:
            logger.error("%s still running after stop()", self._label)
        self._report = ProcessStopReport(
            terminated=exitcode is not None,
            still_running=() if exitcode is not None else (self._label,),
            escalation=self._escalation,
            exitcode=exitcode,
            elapsed=time.monotonic() - start,
        )
        if exitcode is not None:
            process.close()  # reaped: release its sentinel and the pipe multiprocessing kept
        return self._report

    def _spawn(self) -> None:
        method = self._context.get_start_method()
        exit_path = sys.version_info < (3, 13) and method in ("fork", "forkserver")
        reader, writer = self._context.Pipe(duplex=False)
        process: BaseProcess | None = None
        try:
            process = self._context.Process(  # type: ignore[attr-defined]
                target=_child_main,
                args=(self._target, StopSignal(reader), self._args, exit_path),
                name=self._name,
            )
            process.start()
            reader.close()  # the child has its own copy now
            self._pid, self._label = process.pid, _proc_name(process)
            self._stop_writer, self._process = writer, process
        except BaseException:
            reader.close()
            self._process = self._stop_writer = None
            _abandon(process, writer)
            raise

    def _provisional(self) -> ProcessStopReport:
        # The truth now, without blocking: a live child is still running.
        process = self._process
        with contextlib.suppress(ValueError):  # closed meanwhile: reaped, so not running
            if process is not None and process.exitcode is None:
                return ProcessStopReport(
                    terminated=False, still_running=(self._label,), escalation=self._escalation
                )
        return ProcessStopReport(terminated=False, still_running=(), escalation=self._escalation)


def _child_main(
    target: Callable[..., object], stop: StopSignal, args: tuple[Any, ...], exit_path: bool
) -> None:
    ignore_sigint()  # before the target runs: a Ctrl-C is the parent's to handle
    if not exit_path:
        target(stop, *args)
        return
    # A fork or forkserver child before 3.13: multiprocessing ends it with os._exit, which
    # skips atexit. Do what 3.13 does: forget the handlers inherited from the process that
    # forked (they are not this child's), and run the child's own when the target ends.
    atexit._clear()
    try:
        target(stop, *args)
    finally:
        atexit._run_exitfuncs()


def _request_stop(writer: Connection) -> None:
    # One byte makes the read end readable even when a forked child holds a copy of the
    # write end (so closing alone would never give it EOF). Neither call blocks.
    with contextlib.suppress(OSError):  # the child is gone, its end closed: nothing to tell
        writer.send_bytes(b"s")
    writer.close()


# --- keeping children out of the way: Ctrl-C, fork, a queue at exit -----------------------


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


# --- the lifecycle contract: seconds, deadlines, reaping, who may stop, a failed start ----


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


# The same code as in process_shutdown (each module is copied alone), and _proc_name too;
# pinned by tests/test_copies.py.
def _join(process: BaseProcess, deadline: float) -> None:
    # join() reaps the child (waitpid), so a process that ended is not left a zombie.
    while process.exitcode is None and time.monotonic() < deadline:
        process.join(min(_left(deadline), _LONGEST_WAIT))


def _stop_guarded(child: StoppableProcess, budget: float) -> ProcessStopReport:
    """Run ``child._stop_once`` once; never wait on the thread that holds the stop itself."""
    if getattr(child._here, "busy", False):  # a handler or callback on a stopping thread
        return child._provisional()
    deadline = _deadline(budget)
    child._here.busy = True
    try:
        if not _acquire(child._busy, deadline):  # another thread's stop outlasted ours
            return child._provisional()
        try:
            return child._report or child._stop_once(deadline)
        finally:
            child._busy.release()
    finally:
        child._here.busy = False


def _acquire(lock: threading.Lock, deadline: float) -> bool:
    # Bounded by the caller's deadline, in waits a lock can take (at most TIMEOUT_MAX).
    while not lock.acquire(timeout=min(_left(deadline), _LONGEST_WAIT)):
        if time.monotonic() >= deadline:
            return False
    return True


def _proc_name(process: BaseProcess) -> str:
    return f"{process.name} (pid {process.pid})"


def _abandon(process: BaseProcess | None, writer: Connection) -> None:
    # A start() that failed part-way: kill and reap what it started, close what it opened.
    _request_stop(writer)
    if process is None or process.pid is None:  # never started
        return
    process.kill()
    _join(process, _deadline(_ABANDON_WAIT))
    if process.exitcode is None:
        logger.error("%s outlived SIGKILL after a failed start()", _proc_name(process))
    else:
        process.close()
