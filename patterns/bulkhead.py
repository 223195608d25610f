# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""A bulkhead: a fixed pool of worker threads, a bounded wait, and a fast "no".

TL;DR::

    with Bulkhead(max_concurrent=4, queue_size=8, name="db") as db:
        rows = db.call(query, sql, timeout=2.0)  # BulkheadFull at once when full

No Python can stop a running thread: a timed-out handler keeps its worker. Guarantees
and limits: docs/patterns/bulkhead.md; the naive code: patterns/naive/bulkhead.py.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
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
_names = itertools.count(1)  # numbers the bulkheads built without a name


class BulkheadRejected(Exception):
    """The bulkhead named ``bulkhead`` refused the call; it never runs (HTTP 503)."""

    def __init__(self, bulkhead: str, message: str) -> None:
        super().__init__(f"{bulkhead}: {message}")
        self.bulkhead = bulkhead


class BulkheadFull(BulkheadRejected):
    """Every worker was busy and the wait queue was full (or ``queue_size`` is 0)."""


class BulkheadStopped(BulkheadRejected):
    """Stopped: refused at admission (``drained`` False) or released from the queue (True)."""

    def __init__(self, bulkhead: str, *, drained: bool) -> None:
        super().__init__(bulkhead, "stopped while the call was queued" if drained else "stopped")
        self.drained = drained


class BulkheadTimeout(TimeoutError):
    """The caller's ``timeout`` passed first (HTTP 504); the job is not stopped (``started``)."""

    def __init__(self, bulkhead: str, *, started: bool, timeout: float) -> None:
        where = "still running, left to finish" if started else "still queued, will be skipped"
        super().__init__(f"{bulkhead}: no result within {timeout:.3g}s ({where})")
        self.bulkhead, self.started, self.timeout = bulkhead, started, timeout


class Bulkhead:
    """``max_concurrent`` worker threads, a wait queue for ``queue_size`` callers, a fast no.

    Building one starts no thread: `start` (or ``with``) starts the non-daemon workers.
    ``stop_timeout`` is the budget of ``stop()``; ``name`` names threads, errors and logs.
    These four, ``threads`` (the workers), ``started`` (`start` succeeded) and ``stopped``
    (``stop`` was called or a ``start`` failed: for good) are attributes to read, never set.
    """

    def __init__(
        self,
        max_concurrent: int,
        queue_size: int,
        *,
        name: str | None = None,
        stop_timeout: float = 5.0,
    ) -> None:
        self.max_concurrent = _check_count("max_concurrent", max_concurrent, 1)
        self.queue_size = _check_count("queue_size", queue_size, 0)
        self.stop_timeout = _seconds(stop_timeout, "stop_timeout")
        self.name = name if name is not None else f"bulkhead-{next(_names)}"
        # Guards the fields below and _Job.abandoned; never held while user code runs.
        self._lock = _OwnedLock()
        self._wakeup = threading.Condition(cast(threading.Lock, self._lock))  # for idle workers
        self._pending: deque[_Job] = deque()  # accepted, not yet taken by a worker
        self._running: dict[str, _Job] = {}  # by the name of the worker running it
        self.started = self.stopped = False
        self._counts: Counter[str] = Counter()  # the counters of BulkheadStats, by name
        # Each worker, listed (its "ended" event first) before it starts: none is ever unknown.
        self.threads: list[threading.Thread] = []
        self._ended: list[threading.Event] = []
        self._not_starting = threading.Event()  # clear while a start() runs
        self._not_starting.set()
        self._stop_lock = threading.Lock()  # held for the whole of a stop(); see _stop_once
        self._in_stop: set[int] = set()  # idents of the threads inside stop()
        self._report: BulkheadReport | None = None  # the first completed stop's, kept

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> futures.Future[T]:
        """Admit ``fn(*args, **kwargs)`` like `call`; cancel the Future to withdraw a queued job."""
        return self._admit(fn, args, kwargs).future

    def _admit(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Job:
        with self._lock:
            if self.stopped:
                self._counts["shutdown_rejections"] += 1
                raise BulkheadStopped(self.name, drained=False)
            if not self.started:  # a bug in the caller, not a load condition
                raise RuntimeError(f"{self.name}: not started; call start() or use a with block")
            # Running plus waiting, a job whose caller left included (until a worker skips
            # it). With queue_size 0: only while a worker is idle, a hand-off, not a queue.
            if len(self._running) + len(self._pending) >= self.max_concurrent + self.queue_size:
                self._counts["rejections"] += 1
                raise BulkheadFull(self.name, self._holders())
            job = _Job(fn, args, kwargs)
            self._pending.append(job)
            self._counts["accepted"] += 1
            self._wakeup.notify()
        return job

    def call(
        self, fn: Callable[..., T], /, *args: Any, timeout: float | None = None, **kwargs: Any
    ) -> T:
        """Run ``fn(*args, **kwargs)`` on a worker and return its result (or raise its error).

        `BulkheadFull` or `BulkheadStopped` at once when refused; `BulkheadTimeout` when
        ``timeout`` (seconds from admission, queue included; None: no limit) passes first.
        To pass a keyword named ``timeout`` to ``fn``, wrap it with `functools.partial`.
        """
        limit = _seconds(timeout, "timeout", allow_none=True)
        job = self._admit(fn, args, kwargs)
        deadline = _deadline(limit)
        try:
            while not futures.wait([job.future], _left(deadline))[0]:
                if time.monotonic() >= deadline:
                    break
        except BaseException:  # KeyboardInterrupt while waiting: the caller is gone
            self._leave(job, timed_out=False, limit=limit)
            raise
        if not job.future.done():
            self._leave(job, timed_out=True, limit=limit)  # returns if it settled just now
        return cast(T, job.future.result())  # a result, an error, or BulkheadStopped

    def stop(self, timeout: float | None = None, *, cancel_running: bool = False) -> BulkheadReport:
        """Stop for good: release queued callers, refuse later ones, report what still runs.

        Running handlers are left to finish (``cancel_running=True`` cancels their tokens)
        for up to ``timeout`` seconds (None: ``stop_timeout``; inf: as long as it takes).
        The first stop that completes is recorded; one that cannot wait for it (from a
        signal handler, a handler, another thread past its budget) gets a provisional one.
        A token callback's KeyboardInterrupt or SystemExit is raised once the report is kept.
        """
        limit = self.stop_timeout if timeout is None else _seconds(timeout, "timeout")
        return _stop_once(self, limit, cancel_running)  # calls _stop, on every path

    def _stop(self, deadline: float, cancel: bool, exits: list[BaseException]) -> BulkheadReport:
        """Refuse and release, wait until ``deadline`` for each worker to end, report."""
        start = time.monotonic()
        self._begin_stop(cancel, exits)
        _wait(self._not_starting, deadline)  # a start() in progress sees stopped and ends
        for thread, ended in list(zip(self.threads, self._ended, strict=False)):  # one C-level copy
            # The worker's own event, not join() (gh-90882); once set, the join is instant.
            if _wait(ended, deadline) and thread.ident is not None:
                with contextlib.suppress(RuntimeError):  # ident set, not yet marked started
                    thread.join(_left(deadline))
        with self._lock:
            report = self._report_now(final=True, elapsed=time.monotonic() - start)
        if report.still_running:
            where = "; ".join(report.still_running)
            message = "%s: %d handler(s) still running after %.3gs: %s"
            logger.warning(message, self.name, len(report.still_running), report.elapsed, where)
        return report

    def _begin_stop(self, cancel_running: bool, exits: list[BaseException]) -> None:
        """Mark stopped, release the queued callers, wake idle workers; never waits."""
        with self._lock:
            self.stopped = True
            queued, self._pending = self._pending, deque()
            # Same lock as the caller's cancel(): each job is drained or skipped, once.
            released = [job for job in queued if job.future.set_running_or_notify_cancel()]
            self._counts["skipped"] += len(queued) - len(released)
            self._counts["drained"] += len(released)
            self._counts["shutdown_rejections"] += len(released)
            running = list(self._running.values())
            self._wakeup.notify_all()  # idle workers see stopped and end
        for job in released:
            job.future.set_exception(BulkheadStopped(self.name, drained=True))
        for job in running if cancel_running else ():
            job.token._cancel("bulkhead stopped", exits)
        message = "%s: stopped; %d queued caller(s) released, %d handler(s) running"
        logger.info(message, self.name, len(released), len(running))

    def start(self) -> Self:
        """Start the ``max_concurrent`` workers and return the bulkhead: all or nothing.

        RuntimeError if ``start`` was already called, or ``stop`` ran before or during it.
        """
        with self._lock:
            if self.stopped:
                raise RuntimeError(f"{self.name}: stopped; a stopped bulkhead cannot start")
            if self.started or not self._not_starting.is_set():
                raise RuntimeError(f"{self.name}: start() was already called")
            self._not_starting.clear()
        try:
            self._start_workers()
        except BaseException:  # the caller gets nothing to stop: we do it, then re-raise
            self._not_starting.set()
            started = sum(1 for thread in self.threads if thread.ident is not None)
            self.stop()
            logger.warning("%s: start() did not complete; %d worker(s) stopped", self.name, started)
            raise
        self._not_starting.set()
        return self

    def _start_workers(self) -> None:
        """Start every worker, then mark the bulkhead running; raise if stop() came first."""
        for i in range(self.max_concurrent):
            with self._lock:
                if self.stopped:  # stop() ran while we were starting: give up
                    break
                ended = threading.Event()
                name = f"{self.name}-worker-{i}"
                thread = threading.Thread(target=self._work, args=(ended,), name=name)
                self._ended.append(ended)
                self.threads.append(thread)  # listed first: see __init__
            try:
                thread.start()
            except BaseException:
                if thread.ident is None:  # it never ran, so it cannot set its event
                    ended.set()
                raise
        with self._lock:
            if self.stopped:
                raise RuntimeError(f"{self.name}: stopped while start() was starting the workers")
            self.started = True

    def __enter__(self) -> Self:
        """Start the bulkhead if it never was; return it if it runs; refuse once stopped."""
        if self.started and not self.stopped:  # `with bulkhead.start():`
            return self
        return self.start()

    # Also in closable_queue, daemon_threads and supervisor; pinned by tests/test_copies.py.
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

    def stats(self) -> BulkheadStats:
        """A consistent snapshot of the counters and gauges (see `BulkheadStats`)."""
        with self._lock:
            return self._snapshot()

    def _snapshot(self) -> BulkheadStats:
        active, queued = len(self._running), len(self._pending)
        return BulkheadStats(self.name, active=active, queued=queued, **self._counts)

    def _report_now(self, *, final: bool = False, elapsed: float = 0.0) -> BulkheadReport:
        """What runs now, read without the lock; only a ``final`` report can say terminated."""
        running = dict(self._running)  # one C-level copy each: safe without the lock (the GIL)
        found = [
            running[t.name].describe(t.name) if t.name in running else f"{t.name}: (ending)"
            for t, ended in tuple(zip(self.threads, self._ended, strict=False))
            if t.name in running or not ended.is_set()
        ]
        still_running, stats = tuple(sorted(found)), self._snapshot()
        terminated = final and self._not_starting.is_set() and not still_running
        return BulkheadReport(terminated, still_running, self.name, stats.drained, stats, elapsed)

    def __repr__(self) -> str:
        state = "stopped" if self.stopped else "running" if self.started else "not running"
        size = f"max_concurrent={self.max_concurrent} queue_size={self.queue_size}"
        return f"<Bulkhead {self.name!r} {size} {state}>"

    def _holders(self) -> str:
        skipped = sum(1 for job in self._pending if job.future.cancelled())
        return (
            f"full: {len(self._running)} of {self.max_concurrent} worker(s) running "
            f"({self._counts['abandoned']} abandoned by timed-out callers), "
            f"{len(self._pending)} waiting ({skipped} by timed-out callers, to be skipped); "
            f"room for {self.max_concurrent + self.queue_size} in all"
        )

    def _leave(self, job: _Job, *, timed_out: bool, limit: float) -> None:
        """The caller stops waiting; raise `BulkheadTimeout`, or return if it just settled."""
        with self._lock:
            # cancel() succeeds only while the job is queued; a worker's start and
            # stop()'s drain go through the same future lock, so exactly one wins.
            started = not job.future.cancel()
            if started and job not in self._running.values():
                return  # finished or drained as the time ran out: deliver the outcome
            job.abandoned = started  # left running: it keeps its worker
            self._counts["abandoned"] += started
            self._counts["timeouts"] += timed_out
        if started:
            job.token._cancel("caller timed out" if timed_out else "caller interrupted")
        if timed_out:
            logger.debug("%s: caller timed out (%s)", self.name, "running" if started else "queued")
            raise BulkheadTimeout(self.name, started=started, timeout=limit)

    def _work(self, ended: threading.Event) -> None:
        name = threading.current_thread().name
        try:
            while True:
                with self._lock:
                    while not self._pending and not self.stopped:
                        self._wakeup.wait()
                    if not self._pending:  # stopped: stop() drained the queue
                        return
                    job = self._pending.popleft()
                    if not job.future.set_running_or_notify_cancel():
                        self._counts["skipped"] += 1  # the caller left while it was queued
                        continue
                    self._running[name] = job
                self._run(job, name)
        finally:
            ended.set()  # the only "this worker is done" that stop() believes

    def _run(self, job: _Job, name: str) -> None:
        """Run one job, count it, then release its outcome: in that order (B5)."""
        error: BaseException | None = None
        _current.token = job.token
        try:
            result = job.fn(*job.args, **job.kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who re-raises it
            result, error = None, exc
        finally:
            _current.token = None
        with self._lock:
            del self._running[name]  # settled: _leave() now delivers the outcome
            self._counts["processed"] += 1
            self._counts["errors"] += error is not None
            self._counts["abandoned"] -= job.abandoned  # final once settled
        if error is None:
            job.future.set_result(result)
            return
        if job.abandoned:  # nobody else will ever see it
            message = "%s: %s failed after its caller left"
            logger.error(message, self.name, job.describe(name), exc_info=error)
        job.future.set_exception(error)


class JobToken:
    """A one-way "your caller is gone, stop if you can" flag for the function a worker runs.

    From `current_token`; cancelled when the caller's timeout passes while it runs, or on
    ``stop(cancel_running=True)``. Nothing is interrupted: the function must look at it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _callbacks; never held while one runs
        self._event = threading.Event()  # set once, by _cancel(), after reason
        self.reason: str | None = None  #: why it was cancelled ("caller timed out", ...); read only
        self._callbacks: list[Callable[[], object]] = []

    @property
    def cancelled(self) -> bool:
        """Whether the token was cancelled; once True it stays True."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep up to ``timeout`` seconds, waking early on cancel; return `cancelled`."""
        return _wait(self._event, _deadline(_seconds(timeout, "timeout", allow_none=True)))

    def on_cancel(self, callback: Callable[[], object]) -> None:
        """Run ``callback()`` once, on cancel (in that thread, in order) or now if cancelled."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return
        _run_callbacks([callback], None)

    def _cancel(self, reason: str, exits: list[BaseException] | None = None) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self.reason = reason
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        _run_callbacks(callbacks, exits)


# The token of the job this thread runs; set only by a bulkhead's worker.
_current = threading.local()


def current_token() -> JobToken:
    """The `JobToken` of the job this thread is running for a `Bulkhead` (else RuntimeError)."""
    token: JobToken | None = getattr(_current, "token", None)
    if token is None:
        raise RuntimeError("current_token() called outside a function run by a Bulkhead")
    return token


@dataclass(frozen=True, slots=True)
class BulkheadStats:
    """A snapshot of a bulkhead's counters and gauges, all read under one lock.

    Counters only grow: ``accepted``, ``processed`` (returned or raised, counted first),
    ``errors``, ``timeouts``, ``skipped`` (its caller left first), ``rejections`` (full),
    ``shutdown_rejections`` (stopped; ``drained``: queued calls ``stop`` released). Gauges:
    ``active``, ``queued``, ``abandoned`` (running, its caller timed out). Rules: docs page.
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

    ``terminated``: every worker left its loop and no ``start`` still runs; never True with
    ``still_running``: ``"<worker thread>: <function>"`` per handler still running (marked
    `` (abandoned)`` if its caller timed out), ``"<worker thread>: (ending)"`` per idle worker
    not out of its loop. ``drained`` callers released, ``stats`` at the end, ``elapsed`` seconds.
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


@dataclass(eq=False, slots=True)
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    future: futures.Future[Any] = field(default_factory=futures.Future)
    token: JobToken = field(default_factory=JobToken)
    abandoned: bool = False  # its caller timed out while it ran; under the bulkhead's lock

    def describe(self, thread: str) -> str:
        name = getattr(self.fn, "__qualname__", None) or repr(self.fn)
        return f"{thread}: {name}" + (" (abandoned)" if self.abandoned else "")


def _check_count(option: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive integer" if minimum > 0 else "an integer of 0 or more"
        raise ValueError(f"{option} must be {kind}, got {value!r}")
    return value


# --- the lifecycle contract: one stop, bounded, never waiting for itself ------------------


def _stop_once(bulkhead: Bulkhead, limit: float, cancel_running: bool) -> BulkheadReport:
    """`Bulkhead.stop`: keep the first `Bulkhead._stop` to complete; else report what runs now."""
    if bulkhead._report is not None:
        return bulkhead._report
    me = threading.get_ident()
    if me in bulkhead._in_stop:
        return bulkhead._report_now()  # a signal handler inside this thread's stop(): no lock
    if bulkhead._lock.owner == me:  # a signal handler inside call(): it cannot take the lock
        args = (bulkhead, limit, cancel_running)
        threading.Thread(target=_stop_once, args=args, name=f"{bulkhead.name}-stopper").start()
        return bulkhead._report_now()
    if threading.current_thread() in bulkhead.threads:  # from one of its own handlers
        bulkhead._begin_stop(cancel_running, [])  # a callback's Ctrl-C: logged, not raised here
        return bulkhead._report_now()
    exits: list[BaseException] = []
    deadline = _deadline(limit)
    try:  # added inside the try: a Ctrl-C here cannot leave this thread marked inside
        bulkhead._in_stop.add(me)
        while not bulkhead._stop_lock.acquire(timeout=_left(deadline)):
            if time.monotonic() >= deadline:
                return bulkhead._report_now()  # the first stop is still running: its truth now
        try:
            if bulkhead._report is None:
                bulkhead._report = bulkhead._stop(deadline, cancel_running, exits)
            report = bulkhead._report
        finally:
            bulkhead._stop_lock.release()
    finally:
        bulkhead._in_stop.discard(me)
    if exits:
        raise exits[0]  # a token callback's KeyboardInterrupt or SystemExit, once recorded
    return report


def _run_callbacks(todo: list[Callable[[], object]], exits: list[BaseException] | None) -> None:
    """Run each token callback, logging what it raises; the others still run."""
    # A KeyboardInterrupt or SystemExit: to exits, raised by their owner when done; else here.
    pending: list[BaseException] = [] if exits is None else exits
    for callback in todo:
        try:
            callback()
        except BaseException as exc:  # contained: the other callbacks still run
            logger.exception("cancel callback %r failed", callback)
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                pending.append(exc)
    if exits is None and pending:
        raise pending[0]


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


def _wait(event: threading.Event, deadline: float) -> bool:
    while not event.wait(_left(deadline)):
        if time.monotonic() >= deadline:
            return False
    return True


# The same code is in executor_shutdown.py; pinned by tests/test_copies.py.
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
