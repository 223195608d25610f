"""The heartbeat: a worker's lease renewals and its row in the store's ``workers`` table.

TL;DR: `Heartbeat` renews, every ``interval`` seconds, the lease of every claim the
worker holds (running, waiting for a handler, and outcomes waiting for the group
commit), and writes the worker's row (`~.Store.record_worker`:
state, jobs held; it expires after three beats). A waiting claim whose lease is lost is
reported (``lost``) and never runs; a running one has its token cancelled. An
operator's cancel seen on a renewed claim cancels that job's token, and a handler still
running past its timeout is warned about once and counted (`Heartbeat.overdue`).

Pattern:
    Its thread is a daemon ``HousekeepingDaemon`` running ``every(interval, beat)``
    (``patterns.daemon_threads``): it never holds the process at exit, and the worker
    stops it last, so leases are renewed for as long as a job may still end. The claims
    it reads are the worker's, handed over as a mapping (``held``) guarded by the
    worker's lock (``lock``), so a renewal that raced a start, a hand-over or a release
    is recognised and dropped under that lock.

Guarantees:
    * A renewal that raises is reported (``error``) and the beat goes on with the next
      claim; the thread never stops for it.
    * A thread that dies (any BaseException out of a beat) is reported (``died``), never
      silent: a heartbeat that ended quietly would let every lease expire while its job
      runs on.
    * A row write that fails is logged (at most once a minute) and never stops the worker.

See also: ``patterns.jobqueue.worker.worker`` (what wires it),
``tests/jobqueue/test_heartbeat_part.py``.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Generic, Protocol, TypeVar

from patterns.cancellation import DEADLINE_EXCEEDED, CancelToken
from patterns.daemon_threads import HousekeepingDaemon, StopReport, every
from patterns.jobqueue.stores.records import Claim
from patterns.jobqueue.tasks import Phase
from patterns.jobqueue.tasks import describe_error as _describe
from patterns.jobqueue.worker.outcomes import ClaimState
from patterns.jobqueue.worker.shared import Shared
from patterns.jobqueue.worker.states import Step

__all__ = ["Heartbeat", "Held"]

logger = logging.getLogger(__name__)

_OVERDUE_GRACE = 0.5  # seconds past its timeout before a running handler is reported
_ROW_LOG_EVERY = 60.0  # seconds between two log lines about failing worker-row writes


class Held(Protocol):
    """What the heartbeat reads and changes of the worker's record of one claim."""

    claim: Claim  # the latest: each renewal replaces it
    state: ClaimState
    cancel_requested: bool  # an operator cancelled the job (seen by a renewal)
    handler_token: CancelToken | None  # the handler's, with its deadline if it has one
    timeout: float | None  # seconds the handler may run
    overdue_reported: bool  # the warning for a handler past its deadline was logged

    def cancel(self, reason: str) -> CancelToken | None:
        """Cancel the job (lock held): its token to cancel, None if none is made yet."""


_H = TypeVar("_H", bound=Held)


class Heartbeat(Generic[_H]):
    """Renews the worker's leases and writes its row, in a daemon thread; see the module docstring.

    Collaborators (none is the worker itself): ``shared`` (the store; the worker's name,
    the row's key and the thread's name prefix; the lease; the store's clock, for the
    row's ``started_at``; the worker's lock, guarding ``held`` and the records in it;
    ``error``, ``died``, the step hook and ``track``, which wraps the thread's target);
    ``interval``, seconds between beats; ``held``, the claims in hand by job id;
    ``state()`` (lock held): the worker's state for the row; ``lost(held)`` (lock held):
    a waiting claim's lease was lost.
    """

    def __init__(
        self,
        shared: Shared,
        *,
        interval: float,
        held: Mapping[int, _H],
        state: Callable[[], str],
        lost: Callable[[_H], None],
    ) -> None:
        self._shared, self._store, self._owner = shared, shared.store, shared.owner
        self._lease, self._interval, self._clock = shared.lease, interval, shared.clock
        self._lock, self._held, self._state, self._lost = shared.lock, held, state, lost
        self._error, self._died = shared.error, shared.died
        # Guarded by ``lock``, with the records in ``held``.
        self._overdue = 0  # handlers found still running past their timeout (each once)
        self._row_failures = 0  # record_worker calls that raised; logged rate-limited
        self._row_logged_at = -math.inf  # monotonic time of the last such log line
        self._started_at = 0.0  # the store's clock at start, for the worker row
        self._host = socket.gethostname()
        name = f"{shared.owner}-heartbeat"
        beats = every(min(interval, threading.TIMEOUT_MAX), self.beat)
        self._daemon = HousekeepingDaemon(
            shared.track(self._reporting_death(beats), name), name=name
        )

    @property
    def thread_name(self) -> str:
        """The heartbeat thread's name (``<owner>-heartbeat``)."""
        return self._daemon.name

    @property
    def overdue(self) -> int:
        """Handlers found running past their timeout, each counted once (read under the lock)."""
        return self._overdue

    def started(self) -> None:
        """Note the worker's start time (the store's clock) for the row the beats write."""
        self._started_at = self._clock()

    def start(self) -> None:
        """Start the thread: the first beat runs at once."""
        self._daemon.start()

    def stop(self, timeout: float) -> StopReport:
        """Stop the thread; its wait ends at once, a beat under way finishes first."""
        return self._daemon.stop(timeout)

    def _reporting_death(
        self, work: Callable[[threading.Event], None]
    ) -> Callable[[threading.Event], None]:
        """``work`` whose thread, if it dies, is reported (``died``) like any other.

        A heartbeat that ended quietly would let every lease expire while its job runs on.
        """

        def run(stopping: threading.Event) -> None:
            try:
                work(stopping)
            except BaseException as exc:  # noqa: BLE001 - reported by died
                self._died(exc)

        return run

    def beat(self) -> None:
        """One beat: the worker's row, the overdue handlers, then every lease held."""
        self.record()
        self._report_overdue()
        self._renew_leases()

    def _renew_leases(self) -> None:
        """Renew every lease held: running claims, waiting ones, then outcomes to commit.

        An operator's cancel seen on a renewed claim cancels that job's token; a lease
        lost cancels a running job's token and keeps a waiting one from running.
        """
        with self._lock:
            held = [h for h in self._held.values() if h.state is ClaimState.RUNNING]
            held += [h for h in self._held.values() if h.state is ClaimState.WAITING]
            # Outcomes waiting for the group commit (a slow hook or commit before them
            # must not let their leases lapse); one renewed as it commits changes nothing.
            held += [h for h in self._held.values() if h.state is ClaimState.SETTLING]
            snapshot = [(h, h.state, h.claim) for h in held]
        for run, was, claim in snapshot:
            job = claim.job
            try:
                self._shared.step(Step.HEARTBEAT, claim, None)
                renewed = self._store.renew(claim, lease=self._lease)
            except Exception as exc:  # noqa: BLE001 - reported; the heartbeat goes on
                self._error(Phase.HEARTBEAT, job, exc)
                continue
            with self._lock:
                if run.state is not was or self._held.get(job.id) is not run:
                    continue  # started, settling or released meanwhile: not this beat's
                if was is ClaimState.SETTLING:
                    if renewed is not None:
                        run.claim = renewed
                    continue  # the commit under way decides (refused if the lease is lost)
                if renewed is not None:
                    self._renewed(run, renewed)
                    continue
                if was is ClaimState.WAITING:
                    self._lost(run)
                else:
                    token = run.cancel("lease lost")  # cancelled below, outside the lock
            if was is ClaimState.WAITING:
                logger.warning(
                    "job %d: lease lost before it started (taken over?); not running it", job.id
                )
            else:
                logger.warning("job %d: lease lost (taken over?); cancelling the job", job.id)
                if token is not None:
                    token.cancel("lease lost")

    def _renewed(self, run: _H, renewed: Claim) -> None:
        """Keep a waiting or running claim's renewal; an operator's cancel cancels it."""
        # Lock held.
        run.claim = renewed
        cancel = renewed.cancel_requested and not run.cancel_requested
        run.cancel_requested = run.cancel_requested or renewed.cancel_requested
        if cancel:
            # Only this job's token: the handler sees Interrupted at its next checkpoint;
            # its worker is not stopping.
            logger.info("job %d: cancel requested by an operator", renewed.job.id)
            token = run.cancel("cancelled by operator")
            if token is not None:
                token.cancel("cancelled by operator")

    def _report_overdue(self) -> None:
        """Warn once for each handler still running past its timeout, and count it."""
        now = time.monotonic()
        overdue: list[tuple[_H, CancelToken, float]] = []
        with self._lock:
            for held in self._held.values():
                token = held.handler_token
                if held.state is not ClaimState.RUNNING or held.overdue_reported:
                    continue
                if token is None or token.deadline is None:
                    continue
                if now >= token.deadline + _OVERDUE_GRACE:
                    held.overdue_reported = True
                    self._overdue += 1
                    overdue.append((held, token, token.deadline))
        for held, token, deadline in overdue:
            token.cancel(DEADLINE_EXCEEDED)  # what observing the deadline would do
            job = held.claim.job
            logger.warning(
                "job %d (%s): still running %.1f s past its timeout of %gs: the handler "
                "ignores its token; it keeps its handler thread until it returns",
                job.id,
                job.task,
                now - deadline,
                held.timeout or 0.0,
            )

    # --- the worker's row ---------------------------------------------------------------------

    def record(self) -> None:
        """Write the worker's row (state, jobs held); a failure is logged, rate-limited."""
        with self._lock:
            state, held = self._state(), len(self._held)
        try:
            self._store.record_worker(
                self._owner,
                host=self._host,
                pid=os.getpid(),
                state=state,
                started_at=self._started_at,
                jobs_held=held,
                ttl=3 * self._interval,
            )
        except Exception as exc:  # noqa: BLE001 - a row is for operators; never stop for it
            self._row_failed("record_worker", exc)

    def forget(self) -> None:
        """Delete the worker's row (once the thread has stopped, which would write it again)."""
        try:
            self._store.forget_worker(self._owner)
        except Exception as exc:  # noqa: BLE001 - the row expires by itself
            self._row_failed("forget_worker", exc)

    def _row_failed(self, what: str, exc: Exception) -> None:
        now = time.monotonic()
        with self._lock:
            self._row_failures += 1
            failures = self._row_failures
            quiet = now - self._row_logged_at < _ROW_LOG_EVERY
            if not quiet:
                self._row_logged_at = now
        if not quiet:
            logger.warning(
                "worker %s: could not write its row (%s: %d error(s) so far; logged at most "
                "every %g s): %s",
                self._owner,
                what,
                failures,
                _ROW_LOG_EVERY,
                _describe(exc),
            )
