# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""A bulkhead: a fixed pool of worker threads, a bounded wait, and a fast "no".

TL;DR::

    with Bulkhead(max_concurrent=4, queue_size=8, name="db") as db:
        rows = db.call(query, sql, timeout=2.0)  # BulkheadFull at once when full

``start()`` starts the workers (building one starts none); ``call`` and ``submit`` run a
function on one of them; ``stop()`` releases the queued callers and reports what still runs.

Guarantees:
    * No constructor starts a thread; ``start()`` starts every worker or none, once.
    * Admission never blocks: at most ``max_concurrent`` handlers run and at most
      ``max_concurrent + queue_size`` jobs run or wait; anyone else gets `BulkheadFull`.
    * Every accepted call ends one way: the result, the handler's exception (with its
      traceback), `BulkheadTimeout` (nothing is cancelled: a queued job is skipped, a
      running one finishes and its `JobToken` is cancelled) or `BulkheadStopped`.
    * A caller that has its result, or its handler's exception, finds it in `Bulkhead.stats`.
    * ``stop()`` keeps to its own budget (inf: as long as it takes), names the handlers
      still running from each worker's own "ended" event (never ``Thread.join``), and
      the first call that completes records the report every later call returns. A call
      from a signal handler during ``stop()`` (one running the stop or waiting for
      another thread's), from another thread while one runs, or
      from a handler returns a provisional report instead of blocking.
    * ``with`` starts a new bulkhead and enters a running one (``with b.start():``);
      a handler that fails after its caller left is logged.
    * An exception (a Ctrl-C) leaving its ``with`` block is logged at WARNING with the
      budget the stop may take, then what the stop left; a second Ctrl-C during that
      wait stops now (``stop(0)``), names what is still running in one line and ends
      in one KeyboardInterrupt, not two chained tracebacks.

Python:
    3.11+, standard library only; checked on CPython 3.11.7, 3.12.1 and 3.13.0 (GIL
    builds). `BulkheadTimeout` is a `TimeoutError`, which ``concurrent.futures`` uses
    since 3.11. No version can stop a running thread: a timed-out handler keeps its worker.

Docs: docs/patterns/bulkhead.md (the pitfalls B1 to B5, the counting rules, Java's
counterpart); the naive code is in ``patterns/naive/bulkhead.py``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, fields
from typing import Any, Self, TypeVar, cast

__all__ = [
    "Bulkhead",
    "BulkheadFull",
    "BulkheadRejected",
    "BulkheadReport",
    "BulkheadStats",
    "BulkheadStopped",
    "BulkheadTimeout",
    "JobToken",
    "current_token",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_names = itertools.count(1)


class BulkheadRejected(Exception):
    """The bulkhead refused the call; the function did not run and never will (HTTP 503).

    Attributes:
        bulkhead: the name of the bulkhead that refused.
    """

    def __init__(self, bulkhead: str, message: str) -> None:
        super().__init__(f"{bulkhead}: {message}")
        self.bulkhead = bulkhead


class BulkheadFull(BulkheadRejected):
    """Every worker was busy and the wait queue was full (or ``queue_size`` is 0)."""


class BulkheadStopped(BulkheadRejected):
    """The bulkhead is stopped: refused at admission, or released from the queue by ``stop``.

    Attributes:
        drained: True if the call had been accepted and was waiting in the queue when
            ``stop`` released it; False if it was refused at admission.
    """

    def __init__(self, bulkhead: str, message: str, *, drained: bool) -> None:
        super().__init__(bulkhead, message)
        self.drained = drained


class BulkheadTimeout(TimeoutError):
    """The caller's timeout passed before the result arrived (HTTP 504); nothing is cancelled.

    A job not yet started is skipped by its worker; a running one runs to its end, and
    its `JobToken` is cancelled.

    Attributes:
        bulkhead: the name of the bulkhead.
        started: whether a worker had started the function when the caller left.
        timeout: the caller's timeout, in seconds.
    """

    def __init__(self, bulkhead: str, *, started: bool, timeout: float) -> None:
        where = "still running, left to finish" if started else "still queued, will be skipped"
        super().__init__(f"{bulkhead}: no result within {timeout:.3g}s ({where})")
        self.bulkhead = bulkhead
        self.started = started
        self.timeout = timeout


class JobToken:
    """A one-way "your caller is gone, stop if you can" flag for the function a worker runs.

    The function gets it from `current_token`. The bulkhead cancels it when the
    caller's timeout passes while the function runs, and when ``stop(cancel_running=True)``
    is called; only the bulkhead can cancel it. Nothing is interrupted: the function
    looks at `cancelled`, waits with `wait` instead of `time.sleep`, or registers a
    callback with `on_cancel` that closes whatever it is blocked on.
    """

    def __init__(self) -> None:
        # Guards _reason and _callbacks; held by _cancel() and on_cancel(), never while a
        # callback runs.
        self._lock = threading.Lock()
        # Set once, by _cancel(), in the thread of the caller that timed out or of stop();
        # waited on by the running function through wait().
        self._event = threading.Event()
        self._reason: str | None = None
        self._callbacks: list[Callable[[], object]] = []

    @property
    def cancelled(self) -> bool:
        """Whether the token was cancelled; once True it stays True."""
        return self._event.is_set()

    @property
    def reason(self) -> str | None:
        """Why it was cancelled (``"caller timed out"``, ``"bulkhead stopped"``), or None."""
        with self._lock:
            return self._reason

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep up to ``timeout`` seconds, waking early on cancel; return `cancelled`."""
        _wait_event(self._event, _deadline(_seconds(timeout, "timeout", allow_none=True)))
        return self._event.is_set()

    def on_cancel(self, callback: Callable[[], object]) -> None:
        """Run ``callback()`` once when the token is cancelled; at once if it already is.

        Callbacks run in the cancelling thread, in registration order. Anything one
        raises is logged and does not stop the others; a KeyboardInterrupt or SystemExit
        is raised again once they have all run.
        """
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return
        exits: list[BaseException] = []
        self._run(callback, exits)
        if exits:
            raise exits[0]

    def _cancel(self, reason: str, exits: list[BaseException] | None = None) -> bool:
        """Cancel with ``reason`` and run the callbacks; False if it was already cancelled.

        A KeyboardInterrupt or SystemExit from a callback is appended to ``exits`` for
        the caller to raise when its own cleanup is done, or raised here if it is None.
        """
        with self._lock:
            if self._event.is_set():
                return False
            self._reason = reason
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        pending: list[BaseException] = [] if exits is None else exits
        for callback in callbacks:
            self._run(callback, pending)
        if exits is None and pending:
            raise pending[0]
        return True

    @staticmethod
    def _run(callback: Callable[[], object], exits: list[BaseException]) -> None:
        try:
            callback()
        except BaseException as exc:  # contained: the other callbacks still run
            logger.exception("cancel callback %r failed", callback)
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                exits.append(exc)


# The token of the job the current thread is running; set only by a bulkhead worker.
_current = threading.local()


def current_token() -> JobToken:
    """The `JobToken` of the job this thread is running for a `Bulkhead`.

    Raises:
        RuntimeError: the calling thread is not running a bulkhead job.
    """
    token: JobToken | None = getattr(_current, "token", None)
    if token is None:
        raise RuntimeError("current_token() called outside a function run by a Bulkhead")
    return token


@dataclass(frozen=True, slots=True)
class BulkheadStats:
    """A snapshot of a bulkhead's counters and gauges, all read under one lock.

    Counters only grow: ``accepted`` (admitted), ``processed`` (handlers that returned or
    raised, caller or no caller; counted before the result is released), ``errors`` (the
    ones that raised), ``timeouts`` (callers whose timeout passed), ``skipped`` (accepted
    jobs dropped unrun because their caller left), ``rejections`` (refused: full) and
    ``shutdown_rejections`` (refused: stopped, plus ``drained``, the queued calls that
    ``stop`` released). Gauges: ``active`` (handlers running), ``queued`` (jobs waiting,
    skipped ones included until a worker reaches them) and ``abandoned`` (handlers still
    running after their caller timed out). Every snapshot keeps
    ``accepted == processed + skipped + drained + active + queued``; the docs page lists
    the other invariants.
    """

    name: str
    accepted: int = 0
    processed: int = 0
    errors: int = 0
    timeouts: int = 0
    skipped: int = 0
    rejections: int = 0
    shutdown_rejections: int = 0
    drained: int = 0
    active: int = 0
    queued: int = 0
    abandoned: int = 0


@dataclass(frozen=True)
class BulkheadReport:
    """What the first ``stop`` call did and found (every later call returns it too).

    Attributes:
        terminated: every worker thread had left its loop when the call returned, and no
            ``start`` was still starting one; never True with a non-empty still_running.
        still_running: one line per handler still running at the deadline:
            ``"<worker thread>: <function>"``, with ``" (abandoned)"`` if its caller had
            timed out, and ``"<worker thread>: (ending)"`` for a worker with no job that
            had not yet left its loop.
        name: the bulkhead's name.
        drained: queued callers that stop released with `BulkheadStopped`.
        stats: the counters as the call returned.
        elapsed: seconds the call took.
    """

    terminated: bool
    still_running: tuple[str, ...]
    name: str
    drained: int
    stats: BulkheadStats
    elapsed: float

    def __post_init__(self) -> None:
        if self.terminated and self.still_running:
            raise ValueError(f"terminated=True with still_running={self.still_running!r}")


_COUNTS = [f.name for f in fields(BulkheadStats) if f.name not in ("name", "active", "queued")]


class _Job:
    """One accepted call: the function, its future and token, and where it stands."""

    __slots__ = ("abandoned", "args", "fn", "future", "kwargs", "settled", "thread", "token")

    def __init__(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.future: Future[Any] = Future()
        self.token = JobToken()
        # The next three are written under the bulkhead's lock only.
        self.settled = False  # its outcome is decided: finished, or drained by stop()
        self.abandoned = False  # its caller timed out while it was running
        self.thread = ""  # the worker running it

    def describe(self) -> str:
        """``"<worker thread>: <function>"``, marked if its caller timed out."""
        name = getattr(self.fn, "__qualname__", None) or repr(self.fn)
        return f"{self.thread}: {name}" + (" (abandoned)" if self.abandoned else "")


def _check_count(option: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive integer" if minimum > 0 else "an integer of 0 or more"
        raise ValueError(f"{option} must be {kind}, got {value!r}")
    return value


# The same code is in cancellation, daemon_threads, executor_shutdown, process_shutdown and
# supervisor (each module is copied alone); pinned by tests/test_copies.py.
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


def _deadline(seconds: float) -> float:
    return time.monotonic() + seconds  # inf stays inf: never handed to a C wait as it is


# The same code is in executor_shutdown.py; pinned by tests/test_copies.py.
def _left(deadline: float) -> float:
    """Seconds to ``deadline``, capped so that no C wait can raise OverflowError."""
    return min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)


def _wait_event(event: threading.Event, deadline: float) -> bool:
    """Wait for ``event`` until ``deadline`` (inf: forever), in capped slices."""
    while not event.wait(_left(deadline)):
        if time.monotonic() >= deadline:
            return False
    return True


def _acquire(lock: threading.Lock, deadline: float) -> bool:
    while not lock.acquire(timeout=_left(deadline)):
        if time.monotonic() >= deadline:
            return False
    return True


# The same code is in executor_shutdown.py; pinned by tests/test_copies.py.
class _OwnedLock:
    """A `threading.Lock` that knows which thread holds it (also a Condition's lock).

    stop() reads `owner`: a signal handler that runs on a thread interrupted while it
    held the lock (inside ``call()``, say) must not wait for that lock, which its own
    thread can only release after the handler returns.
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


class _Worker:
    """A worker thread and its own "ended" event, set in the ``finally`` of its target.

    stop() waits on the event, never on ``Thread.join`` or ``is_alive``: before 3.13 an
    interrupted join marks a live thread finished (gh-90882), and a report built on it lies.
    """

    __slots__ = ("ended", "thread")

    def __init__(self, thread: threading.Thread, ended: threading.Event) -> None:
        self.thread = thread
        self.ended = ended


class Bulkhead:
    """``max_concurrent`` worker threads and a wait queue for ``queue_size`` callers.

    Building one starts no thread: `start` starts the workers, all of them or none, and
    a call before it is a `RuntimeError`. The workers are non-daemon threads, so stop
    the bulkhead (a ``with`` block starts it if needed and stops it), or its idle workers
    keep the process alive. ``stop_timeout`` is the budget of ``stop()`` without an
    argument. Give each bulkhead the resource it protects as its ``name``: it names its
    threads, exceptions and log lines.

    Raises:
        ValueError: ``max_concurrent`` is not a positive integer, ``queue_size`` is not
            an integer of 0 or more, or ``stop_timeout`` is not a number of seconds >= 0
            (nan, negative, a bool or a string); inf means as long as it takes.
    """

    def __init__(
        self,
        max_concurrent: int,
        queue_size: int,
        *,
        name: str | None = None,
        stop_timeout: float = 5.0,
    ) -> None:
        self._max_concurrent = _check_count("max_concurrent", max_concurrent, 1)
        self._queue_size = _check_count("queue_size", queue_size, 0)
        self.stop_timeout = _seconds(stop_timeout, "stop_timeout")
        self.name = name if name is not None else f"bulkhead-{next(_names)}"
        # Guards every field below and every _Job's settled/abandoned/thread. Held by
        # callers to admit and to time out, by workers to take a job and to count it, by
        # stop() to drain, and by stats(). Never held while a handler, a token callback
        # or a future's done-callback runs.
        self._lock = _OwnedLock()
        # Idle workers wait on it for a job or for stop(); admission notifies one,
        # stop() notifies all.
        self._wakeup = threading.Condition(cast(threading.Lock, self._lock))
        self._pending: deque[_Job] = deque()  # accepted, not yet taken by a worker
        self._running: set[_Job] = set()
        self._stopped = False
        # Every BulkheadStats field but the name and the two gauges read off the containers.
        self._counts = dict.fromkeys(_COUNTS, 0)
        # "new" -> "starting" -> "running"; a failed start() ends in _stopped instead.
        self._state = "new"
        # Each worker is listed here before its start() is called, so that a failure or a
        # KeyboardInterrupt in the middle of start() cannot leave a worker nobody knows of.
        self._workers: list[_Worker] = []
        # Clear while a start() is in progress; stop() waits on it (within its budget)
        # before it joins the workers, so that it sees every worker start() will make.
        self._not_starting = threading.Event()
        self._not_starting.set()
        # Held for the whole of a stop() call; a stop() from another thread waits for it
        # within its own budget, then returns a provisional report.
        self._stop_lock = threading.Lock()
        # Idents of the threads inside stop(), holding _stop_lock or waiting for it: a
        # stop() that finds its own thread here is a signal handler or a callback on top
        # of that call, which cannot go on until it returns, so it returns at once. A set,
        # not a lock: add and discard are atomic, and a handler reading it takes no lock.
        self._in_stop: set[int] = set()
        self._report: BulkheadReport | None = None  # the first completed stop's, kept

    def __repr__(self) -> str:
        with self._lock:
            state = "stopped" if self._stopped else self._state
        return (
            f"<Bulkhead {self.name!r} max_concurrent={self._max_concurrent} "
            f"queue_size={self._queue_size} {state}>"
        )

    @property
    def max_concurrent(self) -> int:
        """How many handlers may run at once (the number of worker threads)."""
        return self._max_concurrent

    @property
    def queue_size(self) -> int:
        """How many accepted jobs may wait for a worker; 0 means hand-off only."""
        return self._queue_size

    @property
    def stopped(self) -> bool:
        """Whether ``stop`` was called (or a ``start`` failed); it never runs again."""
        with self._lock:
            return self._stopped

    @property
    def started(self) -> bool:
        """Whether `start` has succeeded (the bulkhead may have been stopped since)."""
        with self._lock:
            return self._state == "running"

    @property
    def threads(self) -> list[threading.Thread]:
        """The worker threads (none before `start`)."""
        with self._lock:
            return [worker.thread for worker in self._workers]

    def start(self) -> Self:
        """Start the ``max_concurrent`` workers and return the bulkhead: all or nothing.

        If a thread fails to start, or the caller is interrupted (KeyboardInterrupt)
        part-way, the workers already started are stopped, the bulkhead is left stopped,
        and the error propagates.

        Raises:
            RuntimeError: ``start`` was already called, or the bulkhead is stopped
                (``stop`` ran before this call, or while it was starting the workers).
        """
        with self._lock:
            if self._stopped:
                raise RuntimeError(f"{self.name}: stopped; a stopped bulkhead cannot start")
            if self._state != "new":
                raise RuntimeError(f"{self.name}: start() was already called")
            self._state = "starting"
            self._not_starting.clear()
        try:
            self._start_workers()
        except BaseException:
            self._abort_start()
            raise
        finally:
            self._not_starting.set()
        return self

    def _start_workers(self) -> None:
        """Start every worker, then mark the bulkhead running; raise if stop() came first."""
        for i in range(self._max_concurrent):
            with self._lock:
                if self._stopped:  # stop() ran while we were starting: give up
                    break
                ended = threading.Event()
                thread = threading.Thread(
                    target=self._work, args=(ended,), name=f"{self.name}-worker-{i}"
                )
                self._workers.append(_Worker(thread, ended))  # listed first: see __init__
            try:
                thread.start()
            except BaseException:
                if thread.ident is None:  # it never ran, so it cannot set its event
                    ended.set()
                raise
        with self._lock:
            if not self._stopped:
                self._state = "running"
                return
        raise RuntimeError(f"{self.name}: stopped while start() was starting the workers")

    def _abort_start(self) -> None:
        """Stop the workers a failed or overtaken `start` began; bounded by stop_timeout."""
        with self._lock:
            self._stopped = True
            self._wakeup.notify_all()  # no job was ever admitted: each worker just ends
            workers = list(self._workers)
        deadline = _deadline(self.stop_timeout)
        for worker in workers:
            _wait_event(worker.ended, deadline)
        started = sum(1 for worker in workers if worker.thread.ident is not None)
        logger.warning("%s: start() did not complete; %d worker(s) stopped", self.name, started)

    def stats(self) -> BulkheadStats:
        """A consistent snapshot of the counters and gauges (see `BulkheadStats`)."""
        with self._lock:
            return self._snapshot()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Admit ``fn(*args, **kwargs)`` and return its `concurrent.futures.Future` at once.

        The future ends with the function's result or exception, or with `BulkheadStopped`
        if ``stop`` releases the job from the queue. Cancelling it while the job is
        queued withdraws the job (a worker skips it); a running job cannot be cancelled.
        A submit has no timeout: wait on the future with one, or use `call`.

        Raises:
            BulkheadFull: every worker is busy and the queue is full.
            BulkheadStopped: the bulkhead is stopped.
        """
        return self._admit(fn, args, kwargs).future

    def call(
        self, fn: Callable[..., T], /, *args: Any, timeout: float | None = None, **kwargs: Any
    ) -> T:
        """Run ``fn(*args, **kwargs)`` on a worker and return its result.

        ``timeout`` (seconds, None for no limit) counts from admission, so time spent in
        the queue uses it up. An exception from ``fn`` is re-raised here with its original
        traceback. The ``timeout`` keyword is the bulkhead's; to pass a keyword of that
        name to ``fn``, wrap it with `functools.partial`.

        Raises:
            BulkheadFull: refused at once: every worker busy and the queue full.
            BulkheadStopped: refused at once, or released from the queue by ``stop``.
            BulkheadTimeout: the timeout passed first; the work was not cancelled.
            ValueError: ``timeout`` is not a number of seconds >= 0 (checked before
                admission); inf is no limit, as None is.
        """
        limit = _seconds(timeout, "timeout", allow_none=True)
        job = self._admit(fn, args, kwargs)
        deadline = _deadline(limit)
        try:
            while not concurrent.futures.wait([job.future], _left(deadline))[0]:
                if time.monotonic() >= deadline:
                    self._leave(job, timed_out=True, limit=limit)
                    break
        except BaseException as exc:  # KeyboardInterrupt while waiting: the caller is gone
            if not isinstance(exc, BulkheadTimeout):
                self._leave(job, timed_out=False, limit=limit)
            raise
        result: T = job.future.result()  # settled by now: a result, an error, BulkheadStopped
        return result

    def stop(self, timeout: float | None = None, *, cancel_running: bool = False) -> BulkheadReport:
        """Stop for good: release queued callers, refuse later ones, report what still runs.

        Queued callers get `BulkheadStopped` at once, and so does every later call.
        Running handlers are not interrupted (``cancel_running=True`` cancels their
        tokens); it waits up to ``timeout`` seconds (None: ``stop_timeout``; inf: as long
        as it takes) for them. The first call that completes records its report and
        every later call returns it. A call from another thread while one runs waits for
        it within its own budget, then returns a provisional report (not recorded). A
        call from inside a stop() (a signal handler on a thread running a stop() or
        waiting for another thread's) returns a provisional report at once. From a
        handler it is a request: the stop begins, the call returns at once a provisional
        report naming that handler, and the next stop() from outside returns the final
        one. A `start` in progress in another thread stops starting workers and fails.

        Raises:
            ValueError: ``timeout`` is not a number of seconds >= 0.
            KeyboardInterrupt, SystemExit: raised by a token callback that
                ``cancel_running`` ran, again once the report is recorded.
        """
        limit = self.stop_timeout if timeout is None else _seconds(timeout, "timeout")
        report = self._report
        if report is not None:
            return report
        me = threading.get_ident()
        if me in self._in_stop:
            return self._provisional()  # a signal handler inside this thread's stop(): no lock
        if self._lock.owner == me:
            # A signal handler on a thread that holds _lock (inside call(), say): it
            # cannot take the lock, so a thread of ours does the stop.
            threading.Thread(
                target=self.stop,
                args=(limit,),
                kwargs={"cancel_running": cancel_running},
                name=f"{self.name}-stopper",
            ).start()
            return self._provisional()
        if self._is_own_worker():  # a request from one of its own handlers
            exits: list[BaseException] = []
            self._begin_stop(cancel_running, exits)
            for exc in exits:  # logged by the token already; this thread is a worker
                logger.warning("%s: %r from a token callback in a worker", self.name, exc)
            return self._provisional()
        deadline = _deadline(limit)
        exits = []
        try:  # added inside the try: a Ctrl-C here cannot leave this thread marked inside
            self._in_stop.add(me)
            if not _acquire(self._stop_lock, deadline):
                return self._provisional()  # the first stop is still running: its truth now
            try:
                if self._report is None:
                    self._report = self._stop(deadline, limit, cancel_running, exits)
                report = self._report
            finally:
                self._stop_lock.release()
        finally:
            self._in_stop.discard(me)
        if exits:
            raise exits[0]
        return report

    def _is_own_worker(self) -> bool:
        owner: object = getattr(_current, "bulkhead", None)
        return owner is self

    def _begin_stop(self, cancel_running: bool, exits: list[BaseException]) -> int:
        """Mark stopped, release the queued callers, wake idle workers; never waits."""
        released: list[_Job] = []
        with self._lock:
            self._stopped = True
            while self._pending:
                job = self._pending.popleft()
                # Same lock as the caller's cancel(): each job is drained or skipped, once.
                if job.future.set_running_or_notify_cancel():
                    job.settled = True
                    released.append(job)
                else:
                    self._counts["skipped"] += 1
            self._counts["drained"] += len(released)
            self._counts["shutdown_rejections"] += len(released)
            running = list(self._running)
            self._wakeup.notify_all()  # idle workers see _stopped and end
        for job in released:
            job.future.set_exception(
                BulkheadStopped(self.name, "stopped while the call was queued", drained=True)
            )
        if cancel_running:
            for job in running:
                job.token._cancel("bulkhead stopped", exits)
        logger.info(
            "%s: stopped; %d queued caller(s) released, %d handler(s) running",
            self.name,
            len(released),
            len(running),
        )
        return len(running)

    def _stop(
        self, deadline: float, limit: float, cancel_running: bool, exits: list[BaseException]
    ) -> BulkheadReport:
        """Drain, refuse, wait until ``deadline`` for the workers' ended events, report."""
        start = time.monotonic()
        self._begin_stop(cancel_running, exits)
        # A start() in progress sees _stopped and stops starting: wait for it.
        _wait_event(self._not_starting, deadline)
        with self._lock:
            workers = list(self._workers)
        for worker in workers:
            # Once its target has returned the join is instant (a few bytecodes at most).
            # A thread that never started has its event set by start(), and no join.
            if _wait_event(worker.ended, deadline) and worker.thread.ident is not None:
                with contextlib.suppress(RuntimeError):  # ident set, not yet marked started
                    worker.thread.join(_left(deadline))
        with self._lock:
            still_running = self._still_running()
            stats = self._snapshot()
        terminated = self._not_starting.is_set() and not still_running
        if still_running:
            logger.warning(
                "%s: %d handler(s) still running after %.3gs: %s",
                self.name,
                len(still_running),
                limit,
                "; ".join(still_running),
            )
        return BulkheadReport(
            terminated, still_running, self.name, stats.drained, stats, time.monotonic() - start
        )

    def _still_running(self) -> tuple[str, ...]:
        """Each running handler, and each worker with no job that has not ended."""
        jobs = tuple(self._running)  # one C-level copy: safe without the lock, under the GIL
        busy = {job.thread for job in jobs}
        idle = [
            f"{w.thread.name}: (ending)"
            for w in tuple(self._workers)
            if not w.ended.is_set() and w.thread.name not in busy
        ]
        return tuple(sorted([job.describe() for job in jobs] + idle))

    def _provisional(self) -> BulkheadReport:
        """The current truth for a stop() that cannot wait; never recorded, takes no lock.

        Called from a signal handler that may have interrupted this thread while it held
        ``_lock``, so it only reads: a copy of a set or dict is one step under the GIL.
        """
        stats = self._snapshot()
        return BulkheadReport(False, self._still_running(), self.name, stats.drained, stats, 0.0)

    def __enter__(self) -> Self:
        """Start the bulkhead if it never was; return it if it runs; refuse once stopped."""
        with self._lock:
            if self._stopped:
                raise RuntimeError(f"{self.name}: stopped; a stopped bulkhead cannot be entered")
            if self._state == "running":  # `with bulkhead.start():`
                return self
        return self.start()

    # The same code is in bulkhead, closable_queue, daemon_threads and supervisor (each
    # module is copied alone); pinned by tests/test_copies.py.
    def __exit__(self, *exc_info: object) -> None:
        """`stop`; with an exception (a Ctrl-C) on its way out, say so; Ctrl-C again: stop now."""
        exc_type = exc_info[0] if exc_info else None
        if exc_type is None:
            self.stop()
            return
        why = getattr(exc_type, "__name__", exc_type)
        try:  # logged inside the try: a second Ctrl-C may come at any moment
            logger.warning(
                "%s: %s: stopping, waiting up to %.3gs (Ctrl-C again: stop now)",
                self.name,
                why,
                self.stop_timeout,
            )
            report = self.stop()
        except KeyboardInterrupt:  # a second Ctrl-C: a stop with no time left, one line
            report = self.stop(0)
            logger.warning(
                "%s: interrupted: stopping now: still running: %s",
                self.name,
                ", ".join(report.still_running) or "nothing",
            )
            raise KeyboardInterrupt from None  # one traceback, not two chained
        logger.warning(
            "%s: stopped after %s: terminated=%s, still running: %s",
            self.name,
            why,
            report.terminated,
            ", ".join(report.still_running) or "nothing",
        )

    # --- the caller's side ----------------------------------------------------------------

    def _admit(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Job:
        """Accept the job or raise at once; never waits."""
        with self._lock:
            if self._stopped:
                self._counts["shutdown_rejections"] += 1
                raise BulkheadStopped(self.name, "stopped", drained=False)
            if self._state != "running":  # a bug in the caller, not a load condition
                raise RuntimeError(f"{self.name}: not started; call start() or use a with block")
            # Running plus waiting, including jobs whose caller left: a skipped job holds
            # its slot until a worker reaches it. With queue_size 0 this admits only
            # while some worker has nothing to do: a hand-off, not a queue.
            if len(self._running) + len(self._pending) >= self._max_concurrent + self._queue_size:
                self._counts["rejections"] += 1
                raise BulkheadFull(self.name, self._holders())
            job = _Job(fn, args, kwargs)
            self._pending.append(job)
            self._counts["accepted"] += 1
            self._wakeup.notify()
        return job

    def _holders(self) -> str:
        """What holds the slots, for `BulkheadFull`: a timed-out caller's job holds one too."""
        abandoned = self._counts["abandoned"]  # running on after its caller timed out
        skipped = sum(1 for job in self._pending if job.future.cancelled())
        # Waiting jobs are counted against the room in all: a job a free worker has not
        # picked up yet waits too, so "waiting" can exceed queue_size.
        return (
            f"full: {len(self._running)} of {self._max_concurrent} worker(s) running "
            f"({abandoned} abandoned by timed-out callers), "
            f"{len(self._pending)} waiting ({skipped} by timed-out callers, to be skipped); "
            f"room for {self._max_concurrent + self._queue_size} in all"
        )

    def _leave(self, job: _Job, *, timed_out: bool, limit: float | None) -> None:
        """The caller stops waiting; raise `BulkheadTimeout`, or return if it just settled."""
        with self._lock:
            # cancel() succeeds only while the job is queued; a worker's start and
            # stop()'s drain go through the same future lock, so exactly one wins.
            if job.future.cancel():
                started = False
            elif job.settled:
                return  # the outcome was decided as the time ran out: deliver it
            else:
                started = True
                job.abandoned = True
                self._counts["abandoned"] += 1
            if timed_out:
                self._counts["timeouts"] += 1
        if started:
            job.token._cancel("caller timed out" if timed_out else "caller interrupted")
        if timed_out:
            logger.debug("%s: caller timed out (%s)", self.name, "running" if started else "queued")
            raise BulkheadTimeout(self.name, started=started, timeout=limit or 0.0)

    # --- the worker's side ----------------------------------------------------------------

    def _work(self, ended: threading.Event) -> None:
        """Worker thread body: take jobs until stopped; skip those whose caller left."""
        _current.bulkhead = self
        try:
            while True:
                with self._lock:
                    while not self._pending and not self._stopped:
                        self._wakeup.wait()
                    if not self._pending:  # stopped: stop() drained the queue
                        return
                    job = self._pending.popleft()
                    if not job.future.set_running_or_notify_cancel():
                        self._counts["skipped"] += 1  # the caller left while it was queued
                        continue
                    job.thread = threading.current_thread().name
                    self._running.add(job)
                self._run(job)
        finally:
            ended.set()  # the only "this worker is done" that stop() believes

    def _run(self, job: _Job) -> None:
        """Run one job, count it, then release its outcome: in that order (B5)."""
        result: Any = None
        error: BaseException | None = None
        _current.token = job.token
        try:
            result = job.fn(*job.args, **job.kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who re-raises it
            error = exc
        finally:
            _current.token = None
        with self._lock:
            self._running.discard(job)
            job.settled = True
            self._counts["processed"] += 1
            if error is not None:
                self._counts["errors"] += 1
            abandoned = job.abandoned
            if abandoned:
                self._counts["abandoned"] -= 1
        if error is not None:
            if abandoned:  # nobody else will ever see it
                logger.error(
                    "%s: %s failed after its caller left",
                    self.name,
                    job.describe(),
                    exc_info=(type(error), error, error.__traceback__),
                )
            job.future.set_exception(error)
        else:
            job.future.set_result(result)

    def _snapshot(self) -> BulkheadStats:
        return BulkheadStats(
            name=self.name,
            active=len(self._running),
            queued=len(self._pending),
            **self._counts,
        )
