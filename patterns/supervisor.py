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
      one after ``stop()``, raises `RuntimeError`.
    * ``stop(timeout=None)`` (``None``: ``stop_timeout``) returns within its budget (plus
      scheduling noise), even while another thread is inside ``start()``, never raises for
      a worker that ignores it, and returns the same `SupervisorReport` to every call.
    * `produce_until_consumer_dies` blocks at most ``check_every`` seconds after its
      consumer is gone, and returns the items it could not deliver.

Python: 3.11+, standard library only; checked on 3.11.7, 3.12.1 and 3.13.0.

Docs: docs/patterns/supervisor.md (the pitfall P9, the design, the Java counterpart).
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
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


class Supervisor:
    """Run ``target(stop)`` in a thread, notice when it ends, restart it within a budget.

    ``target`` receives a `threading.Event` that ``stop()`` sets, and should return soon
    after. Any other end is a death: the worker's wrapper logs it with its traceback and
    wakes the supervisor's thread, which calls ``on_death(failure)`` and then restarts the
    worker ``interval`` seconds later or, when ``max_restarts`` restarts already happened
    within the last ``window`` seconds, gives up: it logs at ERROR, becomes unhealthy and
    calls ``on_unhealthy(deaths)``. ``interval`` only paces restarts, so a worker that
    fails at once cannot spin. Callbacks run in the supervisor's thread; an exception from
    one is logged and ignored, and they must not call `stop` (it would wait for itself).
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
        for option, value in [
            ("max_restarts", max_restarts),
            ("window", window),
            ("interval", interval),
            ("stop_timeout", stop_timeout),
        ]:
            if value < 0:
                raise ValueError(f"{option} must be 0 or more, not {value!r}")
        self.target = target
        self.name = name
        self.max_restarts = max_restarts
        self.window = window
        self.interval = interval
        self.stop_timeout = stop_timeout
        self.on_death = on_death
        self.on_unhealthy = on_unhealthy
        # The stop request. Set by stop(); watched by the worker (it is target's argument)
        # and by the supervisor's thread while it paces a restart.
        self._stop = threading.Event()
        # Set by the supervisor's thread when it gives up; waited on by wait_unhealthy().
        self._unhealthy = threading.Event()
        # Guards every field below. Notified by the worker's wrapper when the worker ends
        # and by stop(); waited on by the supervisor's thread. A restart happens only
        # while it is held and the stop request is not set, and start() publishes its two
        # threads while holding it, so once stop() has set the request and taken it, the
        # threads it reads are the last ones (any of them started later sees the request).
        self._changed = threading.Condition()
        # Cleared by start() while it starts its threads, set once both Thread.start calls
        # returned or one raised; a racing stop() waits on it within its budget, because
        # a thread cannot be joined before it has started.
        self._start_settled = threading.Event()
        self._start_settled.set()
        # Held by the stop() that builds the report, for its whole (bounded) run; a stop()
        # racing it waits here, then returns the same report.
        self._stop_lock = threading.Lock()
        self._report: SupervisorReport | None = None
        self._worker: threading.Thread | None = None
        self._ended: list[ThreadFailure | None] = []  # one entry per worker end, not yet handled
        self._deaths: list[ThreadFailure] = []
        self._restart_times: collections.deque[float] = collections.deque()
        self._restarts = 0
        self._supervisor: threading.Thread | None = None

    def start(self) -> Self:
        """Start the worker and the supervisor's thread; `RuntimeError` if started or stopped.

        All or nothing: if either thread cannot be started, or a Ctrl-C lands part-way,
        whatever started is stopped within ``stop_timeout`` and the error re-raised.
        """
        with self._changed:
            if self._supervisor is not None or self._stop.is_set():
                raise RuntimeError(f"supervisor {self.name!r} was already started or stopped")
            self._worker = threading.Thread(target=self._run_worker, name=self.name)
            self._supervisor = threading.Thread(
                target=self._supervise, name=f"{self.name}-supervisor"
            )
            threads = (self._worker, self._supervisor)
            self._start_settled.clear()
        try:
            for thread in threads:
                thread.start()
        except BaseException:
            self._start_settled.set()
            self.stop()  # the caller gets nothing to stop: we do it
            raise
        self._start_settled.set()
        return self

    def stop(self, timeout: float | None = None) -> SupervisorReport:
        """Ask the worker to stop, wait up to ``timeout`` (None: ``stop_timeout``), report.

        Idempotent: every call returns the first call's report (a call racing the first
        waits for it). Refused (`RuntimeError`) from the worker or a callback.
        """
        budget = self.stop_timeout if timeout is None else timeout
        if budget < 0:
            raise ValueError(f"stop() needs a timeout of 0 or more seconds, not {timeout!r}")
        if threading.current_thread() in (self._worker, self._supervisor):
            raise RuntimeError("stop() called from the supervised worker or a callback")
        with self._stop_lock:
            if self._report is None:
                self._report = self._stop_once(budget)
            return self._report

    def _stop_once(self, timeout: float) -> SupervisorReport:
        start = time.monotonic()
        deadline = start + timeout

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        self._stop.set()
        # Timed, so that a restart holding the lock in Thread.start cannot hold stop().
        locked_first = self._changed.acquire(timeout=left())
        try:
            if locked_first:
                self._changed.notify_all()
            # Final from here on when locked: no worker starts once the request is set.
            worker, supervisor = self._worker, self._supervisor
        finally:
            if locked_first:
                self._changed.release()
        # A start() in another thread may still be inside Thread.start: wait, within budget.
        settled = self._start_settled.wait(left()) and locked_first
        # A thread with no ident never ran: its Thread.start failed.
        threads = [t for t in (supervisor, worker) if t is not None and t.ident is not None]
        for thread in threads:  # the supervisor's first: it ends at once unless in a callback
            thread.join(left())
        locked = self._changed.acquire(timeout=left())
        try:
            if locked:
                self._collect_final_end()
            deaths, restarts = tuple(self._deaths), self._restarts
        finally:
            if locked:
                self._changed.release()
        still_running = tuple(t.name for t in threads if t.is_alive())
        if not (settled and locked) and not still_running and worker is not None:
            still_running = (worker.name,)  # not known to have ended: still being started
        terminated = settled and locked and not still_running
        if not terminated:
            logger.error(
                "supervisor %r: worker still running %.3gs after stop was requested",
                self.name,
                timeout,
            )
        elapsed = time.monotonic() - start
        return SupervisorReport(terminated, still_running, self.healthy, restarts, deaths, elapsed)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def healthy(self) -> bool:
        """False once the restart budget was spent and the worker given up."""
        return not self._unhealthy.is_set()

    def wait_unhealthy(self, timeout: float | None = None) -> bool:
        """Block until the supervisor gives up on its worker; False if ``timeout`` ran out."""
        return self._unhealthy.wait(timeout)

    @property
    def restarts(self) -> int:
        """How many times the worker has been restarted."""
        with self._changed:
            return self._restarts

    @property
    def deaths(self) -> list[ThreadFailure]:
        """Every unexpected end of the worker so far, oldest first."""
        with self._changed:
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
            with self._changed:
                self._ended.append(failure)
                self._changed.notify_all()

    def _supervise(self) -> None:
        try:
            self._supervise_loop()
        except BaseException:  # a dead supervisor would hide every later death
            logger.exception("supervisor %r crashed", self.name)
            self._give_up("the supervisor itself crashed; the worker is no longer supervised")

    def _supervise_loop(self) -> None:
        while True:
            with self._changed:
                while not self._ended and not self._stop.is_set():
                    self._changed.wait()
                if self._stop.is_set():
                    return  # stop() collects whatever end is still pending
                failure = self._ended.pop(0)
                if failure is None:  # a clean end, which needs a stop request: see above
                    continue
                self._deaths.append(failure)
            self._call(self.on_death, failure)
            if not self._may_restart():
                self._give_up(
                    f"worker died {len(self.deaths)} time(s), budget of {self.max_restarts} "
                    f"restart(s) per {self.window:g}s spent"
                )
                return
            if self._stop.wait(self.interval):  # pacing; a stop request cuts it short
                return
            with self._changed:
                if self._stop.is_set():
                    return
                worker = threading.Thread(target=self._run_worker, name=self.name)
                worker.start()  # if it raises, _supervise gives up; _worker is the dead one
                self._worker = worker
                self._restart_times.append(time.monotonic())
                self._restarts += 1
                restarts = self._restarts
            logger.warning(
                "supervisor %r: restarted the worker (restart %d, budget %d per %gs)",
                self.name,
                restarts,
                self.max_restarts,
                self.window,
            )

    def _may_restart(self) -> bool:
        now = time.monotonic()
        with self._changed:
            while self._restart_times and now - self._restart_times[0] >= self.window:
                self._restart_times.popleft()
            return len(self._restart_times) < self.max_restarts

    def _give_up(self, reason: str) -> None:
        logger.error("supervisor %r gives up, unhealthy: %s", self.name, reason)
        self._unhealthy.set()
        self._call(self.on_unhealthy, self.deaths)

    def _collect_final_end(self) -> None:
        # Called by stop() with _changed held: a worker that failed while (or after) the
        # stop was requested is still a death, and is kept in the report.
        while self._ended:
            failure = self._ended.pop(0)
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
    iterator = iter(items)
    for item in iterator:
        while True:
            if not alive():
                left = [item, *iterator]
                logger.error("consumer is gone: %d item(s) not delivered", len(left))
                return left
            try:
                q.put(item, timeout=check_every)
                break
            except queue.Full:
                continue
    return []
