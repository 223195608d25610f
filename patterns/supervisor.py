# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""Notice at once when a long-lived worker thread dies, and restart it within a budget.

TL;DR::

    with Supervisor(consume, name="consumer", max_restarts=3, window=60) as supervisor:
        left = produce_until_consumer_dies(q, items, alive=lambda: supervisor.healthy)
    # consume(stop) runs until stop is set; each unasked end is logged and restarted

Guarantees:
    * A worker's end that was not asked for (an exception, or returning while ``stop`` is
      not set) is never hidden: it is logged at ERROR, passed to ``on_death`` and kept in
      ``deaths``, noticed at once (the supervisor waits on a condition, it does not poll).
    * The worker is restarted, ``interval`` seconds later, until ``max_restarts`` restarts
      within ``window`` seconds are spent; then the supervisor is unhealthy (an ERROR
      record and ``on_unhealthy``).
    * ``start()`` is all or nothing and returns the supervisor; a second ``start()``, or
      one after ``stop()``, raises `RuntimeError`; ``with supervisor.start():`` works.
    * ``stop(timeout=None)`` (``None``: ``stop_timeout``; ``math.inf``: as long as it
      takes) returns within its budget (plus scheduling noise), even while another thread
      is inside ``start()``, never raises for a worker that ignores it, and the first
      `SupervisorReport` that completes is returned to every later call. Reports come
      from each thread's own end signal, never from ``join()`` (:gh:`90882`).
    * ``stop()`` from the worker, a callback, or a signal handler that interrupted this
      supervisor's ``start()``/``stop()`` (running it, or waiting for another thread's)
      is a request: it returns at once, provisionally.
    * `produce_until_consumer_dies` blocks at most ``check_every`` seconds after its
      consumer is gone, and returns the items it could not deliver.
    * An exception (a Ctrl-C) leaving its ``with`` block is logged at WARNING with the
      budget the stop may take, then what the stop left; a second Ctrl-C during that
      wait stops now (``stop(0)``), names what is still running in one line and ends
      in one KeyboardInterrupt, not two chained tracebacks.

Python: 3.11+, standard library only; checked on 3.11.7, 3.12.1 and 3.13.0.

Docs: docs/patterns/supervisor.md (the pitfall P9, the design, the Java counterpart).
"""

from __future__ import annotations

import collections
import logging
import math
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Self, TypeVar

__all__ = ["Supervisor", "SupervisorReport", "ThreadFailure", "produce_until_consumer_dies"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class ThreadFailure:
    """How the worker ended when it should not have: the facts, without the exception.

    The exception object is not kept, since its traceback's frames reference it again (a
    reference cycle); its text is. The same record as ``thread_exceptions.ThreadFailure``,
    repeated so that each module can be copied alone.

    Attributes:
        thread_name: the thread's name.
        thread_ident: the thread's ident, or None if it was not known.
        exc_type: the exception's class, or None if the worker returned unasked.
        summary: the exception's last traceback line, such as ``"ValueError: boom"``.
        traceback: the whole formatted traceback ("" if there was none).
        ended_at: `time.monotonic` when the thread recorded its end.
    """

    thread_name: str
    thread_ident: int | None
    exc_type: type[BaseException] | None
    summary: str
    traceback: str
    ended_at: float


@dataclass(frozen=True)
class SupervisorReport:
    """What the first `Supervisor.stop` call achieved (later calls return this same object).

    Attributes:
        terminated: the worker and the supervisor's own thread have both ended.
        still_running: names of the threads still running at the deadline: the worker,
            and the supervisor's own thread if a callback was holding it.
        healthy: False once the restart budget was spent and the worker given up.
        restarts: how many times the worker was restarted.
        deaths: every end of the worker that was not asked for, oldest first.
        elapsed: seconds the `Supervisor.stop` call took.
    """

    terminated: bool
    still_running: tuple[str, ...]
    healthy: bool
    restarts: int
    deaths: tuple[ThreadFailure, ...]
    elapsed: float

    def __post_init__(self) -> None:
        if self.terminated and self.still_running:
            raise ValueError(f"terminated=True with still_running={self.still_running!r}")


class Supervisor:
    """Run ``target(stop)`` in a thread, notice when it ends, restart it within a budget.

    ``target`` receives a `threading.Event` that ``stop()`` sets, and should return soon
    after. Any other end is a death: the worker's wrapper logs it with its traceback and
    wakes the supervisor's thread, which calls ``on_death(failure)`` and then restarts the
    worker ``interval`` seconds later or, when ``max_restarts`` restarts already happened
    within the last ``window`` seconds, gives up: it logs at ERROR, becomes unhealthy and
    calls ``on_unhealthy(deaths)``. ``interval`` only paces restarts, so a worker that
    fails at once cannot spin. Callbacks run in the supervisor's thread; an exception from
    one is logged and ignored. A callback or the worker may call `stop`: it is a request
    that returns at once (see `stop`).
    """

    def __init__(
        self,
        target: Callable[[threading.Event], object],
        *,
        name: str = "worker",
        max_restarts: int = 3,
        window: float = 60.0,
        interval: float = 1.0,
        stop_timeout: float = 5.0,
        on_death: Callable[[ThreadFailure], object] | None = None,
        on_unhealthy: Callable[[list[ThreadFailure]], object] | None = None,
    ) -> None:
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"max_restarts must be an int >= 0, not {max_restarts!r}")
        self.target = target
        self.name = name
        self.max_restarts = max_restarts
        self.window = _seconds(window, "window")
        self.interval = _seconds(interval, "interval")
        self.stop_timeout = _seconds(stop_timeout, "stop_timeout")
        self.on_death = on_death
        self.on_unhealthy = on_unhealthy
        # The stop request. Set by stop() (a request included); watched by the worker (it
        # is target's argument) and by the supervisor's thread. Never cleared.
        self._stop = threading.Event()
        # Set by a worker's wrapper when it ends and by stop(); waited on, and cleared, by
        # the supervisor's thread only. An event rather than a condition, so that stop()
        # (maybe from a signal handler) never waits for a lock to wake it.
        self._wake = threading.Event()
        # Set by the supervisor's thread when it gives up; waited on by wait_unhealthy().
        self._unhealthy = threading.Event()
        # One-shot: taken by the first start(), or by a stop() that came first; only ever
        # tried, never waited on, so no stop path can block on it.
        self._claim = threading.Lock()
        self._starter: int | None = None  # ident of the thread inside start(), for R4
        # Set once both Thread.start calls of start() returned or one raised; a racing
        # stop() waits on it within its budget, because until then the threads are not known.
        self._start_settled = threading.Event()
        # Tried (never waited on) by stop(): its holder builds the report.
        self._stop_lock = threading.Lock()
        # Idents of the threads inside stop(), running it or waiting for another's: a stop()
        # that finds its own thread here is a signal handler (or a callback) on top of that
        # call, which cannot go on until it returns, so it returns at once. A set, not a
        # lock: add and discard are atomic, and a handler reading it takes no lock.
        self._in_stop: set[int] = set()
        self._report: SupervisorReport | None = None
        self._reported = threading.Event()  # set once _report is recorded; others wait on it
        # Written by start() (both) and by the supervisor's thread (_worker, on restart),
        # each a single assignment made before the thread starts, so that a thread can
        # always find itself here. Once the supervisor's thread has ended, _worker is final.
        self._worker: _Tracked | None = None
        self._supervisor: _Tracked | None = None
        # Appended by worker wrappers (one entry per end, None for an asked-for end);
        # popped by the supervisor's thread, and by stop() once that thread is done or
        # out of time. deque.append/popleft and list.append are atomic, so no lock is held.
        self._ended: collections.deque[ThreadFailure | None] = collections.deque()
        self._deaths: list[ThreadFailure] = []
        # Only the supervisor's thread touches these two (the report reads _restarts).
        self._restart_times: collections.deque[float] = collections.deque()
        self._restarts = 0

    def start(self) -> Self:
        """Start the worker and the supervisor's thread; `RuntimeError` if started or stopped.

        All or nothing: if either thread cannot be started, or a Ctrl-C lands part-way,
        whatever started is stopped within ``stop_timeout`` and the error re-raised.
        """
        if not self._claim.acquire(blocking=False):
            raise RuntimeError(f"supervisor {self.name!r} was already started or stopped")
        self._starter = threading.get_ident()
        worker = _Tracked(self._run_worker, self.name)
        supervisor = _Tracked(self._supervise, f"{self.name}-supervisor")
        self._worker, self._supervisor = worker, supervisor  # published for a racing stop()
        try:
            for tracked in (worker, supervisor):
                tracked.thread.start()
        except BaseException:
            worker.cancel_unstarted()
            supervisor.cancel_unstarted()
            self._start_settled.set()
            self.stop()  # the caller gets nothing to stop: we do it
            raise
        self._start_settled.set()
        return self

    def stop(self, timeout: float | None = None) -> SupervisorReport:
        """Ask the worker to stop, wait up to ``timeout`` (None: ``stop_timeout``), report.

        The first report that completes is recorded and returned to every later call. A
        call racing it waits at most its own ``timeout`` for that report, then returns a
        provisional one (not recorded). From the worker or a callback (the supervisor's
        own threads), or from a signal handler that interrupted this supervisor's
        ``start()`` or a ``stop()`` (running it, or waiting for another thread's), it is a
        request: it sets the stop request and returns a provisional report at once,
        naming the threads still running (the caller's own included); a later ``stop()``
        from outside returns the final report.
        """
        began = time.monotonic()
        deadline = began + (self.stop_timeout if timeout is None else _seconds(timeout, "timeout"))
        if self._report is not None:
            return self._report
        me = threading.get_ident()
        current = threading.current_thread()
        own = any(t is not None and t.thread is current for t in (self._supervisor, self._worker))
        if own or (self._starter == me and not self._start_settled.is_set()):
            self._request_stop()
            report = self._current(began, final=False)
            caller = current.name
            if own and caller not in report.still_running:  # it cannot have ended: it asks
                report = replace(report, still_running=(*report.still_running, caller))
            return report
        return _hand_off(self, began, deadline)  # _stop_once, run by one stop() at a time

    def _request_stop(self) -> None:
        self._stop.set()
        self._wake.set()  # the supervisor's thread looks at the request at once

    def _stop_once(self, began: float, deadline: float) -> SupervisorReport:
        self._request_stop()
        if self._claim.acquire(blocking=False):  # never started: start() now refuses
            return SupervisorReport(True, (), self.healthy, 0, (), time.monotonic() - began)
        # A start() in another thread may still be inside Thread.start: wait, within budget.
        if _wait(self._start_settled, deadline):
            supervisor = self._supervisor
            # The supervisor's thread first: it ends at once unless a callback holds it,
            # and once it has ended no restart can happen, so _worker is the last worker.
            if supervisor is not None:
                _wait(supervisor.ended, deadline)
            worker = self._worker
            if worker is not None:
                _wait(worker.ended, deadline)
        report = self._current(began, final=True)
        for tracked in (self._supervisor, self._worker):
            # Only threads whose target has returned: join just lets threading tidy up.
            if tracked is not None and tracked.ended.is_set() and tracked.thread.ident:
                tracked.thread.join(min(_left(deadline), 1.0))
        if not report.terminated:
            logger.error(
                "supervisor %r: worker still running %.3gs after stop was requested",
                self.name,
                deadline - began,
            )
        return report

    def _current(self, began: float, *, final: bool) -> SupervisorReport:
        # The truth now, from the threads' own end signals.
        settled = self._start_settled.is_set()
        tracked = [t for t in (self._supervisor, self._worker) if t is not None]
        still_running = tuple(t.thread.name for t in tracked if t.running())
        if not settled and self._worker is not None and self.name not in still_running:
            still_running = (*still_running, self.name)  # still being started
        terminated = final and settled and not still_running
        if final:
            self._collect_final_end()
        return SupervisorReport(
            terminated,
            still_running,
            self.healthy,
            self._restarts,
            tuple(self._deaths),
            time.monotonic() - began,
        )

    def __enter__(self) -> Self:
        if self._stop.is_set():
            raise RuntimeError(f"supervisor {self.name!r} was stopped: it cannot be entered")
        if self._claim.locked():
            return self  # already running: ``with supervisor.start():`` enters it as it is
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

    @property
    def healthy(self) -> bool:
        """False once the restart budget was spent and the worker given up."""
        return not self._unhealthy.is_set()

    def wait_unhealthy(self, timeout: float | None = None) -> bool:
        """Block until the supervisor gives up on its worker; False if ``timeout`` ran out.

        ``None`` or ``math.inf``: wait as long as it takes.
        """
        seconds = _seconds(timeout, "timeout", allow_none=True)
        return _wait(self._unhealthy, _deadline(seconds))

    @property
    def restarts(self) -> int:
        """How many times the worker has been restarted."""
        return self._restarts

    @property
    def deaths(self) -> list[ThreadFailure]:
        """Every unexpected end of the worker so far, oldest first."""
        return list(self._deaths)

    def _run_worker(self) -> None:
        failure: ThreadFailure | None = None
        try:
            self.target(self._stop)
            if not self._stop.is_set():
                summary = "returned without being asked to stop"
                ident = threading.get_ident()
                failure = ThreadFailure(self.name, ident, None, summary, "", time.monotonic())
                logger.error("worker %r returned without being asked to stop", self.name)
        except BaseException as exc:  # any end of the worker must be reported
            tb = "".join(traceback.format_exception(exc))
            summary = "".join(traceback.format_exception_only(exc)).strip()
            ident = threading.get_ident()
            failure = ThreadFailure(self.name, ident, type(exc), summary, tb, time.monotonic())
            logger.exception("worker %r died: %s", self.name, summary)
        finally:
            # The signal the supervisor waits for: always sent, however the worker ended.
            self._ended.append(failure)
            self._wake.set()

    def _supervise(self) -> None:
        try:
            self._supervise_loop()
        except BaseException:  # a dead supervisor would hide every later death
            logger.exception("supervisor %r crashed", self.name)
            self._give_up("the supervisor itself crashed; the worker is no longer supervised")

    def _supervise_loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()  # before looking, so a later end or stop wakes us again
            while not self._stop.is_set():
                try:
                    failure = self._ended.popleft()
                except IndexError:
                    break
                if failure is None:  # a clean end, which needs a stop request: see above
                    continue
                self._deaths.append(failure)
                if not self._handle_death(failure):
                    return
            if self._stop.is_set():
                return  # stop() collects whatever end is still pending

    def _handle_death(self, failure: ThreadFailure) -> bool:
        """Report one death and restart the worker; False once supervision is over."""
        self._call(self.on_death, failure)
        if not self._may_restart():
            self._give_up(
                f"worker died {len(self._deaths)} time(s), budget of {self.max_restarts} "
                f"restart(s) per {self.window:g}s spent"
            )
            return False
        if _wait(self._stop, _deadline(self.interval)):  # pacing; a stop cuts it short
            return False
        worker = _Tracked(self._run_worker, self.name)
        self._worker = worker  # published first: the new worker's own stop() must find it
        try:
            worker.thread.start()
        except BaseException:  # _supervise gives up; this worker never runs
            worker.cancel_unstarted()
            raise
        self._restart_times.append(time.monotonic())
        self._restarts += 1
        logger.warning(
            "supervisor %r: restarted the worker (restart %d, budget %d per %gs)",
            self.name,
            self._restarts,
            self.max_restarts,
            self.window,
        )
        return True

    def _may_restart(self) -> bool:
        now = time.monotonic()
        while self._restart_times and now - self._restart_times[0] >= self.window:
            self._restart_times.popleft()
        return len(self._restart_times) < self.max_restarts

    def _give_up(self, reason: str) -> None:
        logger.error("supervisor %r gives up, unhealthy: %s", self.name, reason)
        self._unhealthy.set()
        self._call(self.on_unhealthy, self.deaths)

    def _collect_final_end(self) -> None:
        # A worker that failed while (or after) the stop was requested is still a death,
        # and is kept in the report.
        while True:
            try:
                failure = self._ended.popleft()
            except IndexError:
                return
            if failure is not None:
                self._deaths.append(failure)

    def _call(self, callback: Callable[[Any], object] | None, arg: object) -> None:
        if callback is None:
            return
        try:
            callback(arg)
        except Exception:
            logger.exception("supervisor %r: callback %r failed", self.name, callback)


def produce_until_consumer_dies(
    q: queue.Queue[T],
    items: Iterable[T],
    *,
    alive: Callable[[], bool],
    check_every: float = 0.1,
) -> list[T]:
    """Put ``items`` on ``q`` while ``alive()`` is true; return those that were not put (P9).

    A full queue is waited on in slices of ``check_every`` seconds, and ``alive()`` is
    asked between slices, so a dead consumer stops the producer within ``check_every``
    instead of never. Typical ``alive``: ``consumer.is_alive`` or
    ``lambda: supervisor.healthy``. The undelivered items are logged and returned, so the
    caller can store, retry or drop them on purpose. (On 3.13+, a dying consumer can also
    call ``q.shutdown(immediate=True)`` in its ``finally``.)
    """
    slice_ = min(_seconds(check_every, "check_every"), threading.TIMEOUT_MAX)
    iterator = iter(items)
    for item in iterator:
        while True:
            if not alive():
                left = [item, *iterator]
                logger.error("consumer is gone: %d item(s) not delivered", len(left))
                return left
            try:
                q.put(item, timeout=slice_)
                break
            except queue.Full:
                continue
    return []


# --- the lifecycle contract: seconds, deadlines, each thread's own end signal -----------------
#
# The seconds family is the same code in every module that holds it, since a module is
# copied alone (tests/test_copies.py). Every wait of stop() is bounded by one deadline.


def _seconds(value: object, name: str, *, allow_none: bool = False) -> float:
    """``value`` as seconds: a number >= 0 (inf, or a huge one: as long as it takes)."""
    if value is None and allow_none:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return math.inf if value > sys.float_info.max else float(value)


def _deadline(seconds: float) -> float:
    return time.monotonic() + seconds


def _left(deadline: float) -> float:
    """Seconds until ``deadline`` for a C wait: never negative, never above TIMEOUT_MAX."""
    return min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)


def _wait(event: threading.Event, deadline: float) -> bool:
    """Wait for ``event`` until the monotonic ``deadline`` (may be inf); True if it is set."""
    while not event.wait(_left(deadline)):
        if time.monotonic() >= deadline:
            return False
    return True


def _hand_off(supervisor: Supervisor, began: float, deadline: float) -> SupervisorReport:
    """The stopper hand-off: one stop() builds and records the report; the others wait.

    A stop() that finds its own thread already inside one is a signal handler (or a
    callback) on top of it: a request, answered at once. A stop() racing another waits for
    that report within its own budget, else answers with a provisional one.
    """
    me = threading.get_ident()
    if me in supervisor._in_stop:  # a signal handler inside this thread's stop(): never block
        # No _request_stop() here: the stop it interrupted sets the events (or the stop that
        # one waits for does) and may be inside that set(), holding the event's lock, which
        # this thread would then wait for forever (E1).
        return supervisor._current(began, final=False)
    try:  # added inside the try: a Ctrl-C here cannot leave this thread marked inside
        supervisor._in_stop.add(me)
        if supervisor._stop_lock.acquire(blocking=False):
            try:
                if supervisor._report is None:
                    supervisor._report = supervisor._stop_once(began, deadline)
                    supervisor._reported.set()
                return supervisor._report
            finally:
                supervisor._stop_lock.release()
        # Another stop() builds the report: wait for it within our own budget.
        if _wait(supervisor._reported, deadline) and supervisor._report is not None:
            return supervisor._report
    finally:
        supervisor._in_stop.discard(me)
    supervisor._request_stop()
    return supervisor._current(began, final=False)


# daemon_threads._Ended is its twin, shaped for that module; tests/test_copies.py checks both.
class _Tracked:
    """A thread with its own end signal, set in its target's ``finally``.

    Reports wait on ``ended``, never on ``join()``/``is_alive()``: before 3.13 a Ctrl-C
    that interrupts ``Thread.join()`` marks a live thread finished (gh-90882).
    """

    def __init__(self, target: Callable[[], object], name: str) -> None:
        self.ended = threading.Event()  # set by the thread on its way out; waited on by stop()
        # Taken by the thread as it begins, or by cancel_unstarted() after a failed
        # Thread.start: whoever takes it first decides whether the target ever runs.
        self._claim = threading.Lock()
        self._target = target
        self.thread = threading.Thread(target=self._run, name=name)

    def _run(self) -> None:
        try:
            if self._claim.acquire(blocking=False):
                self._target()
        finally:
            self.ended.set()

    def cancel_unstarted(self) -> None:
        """After ``Thread.start`` raised: a thread that had not begun will never run the target."""
        if self._claim.acquire(blocking=False):
            self.ended.set()

    def running(self) -> bool:
        """Started and not yet ended (by its own signal)."""
        return self.thread.ident is not None and not self.ended.is_set()
