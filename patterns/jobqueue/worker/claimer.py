"""The claimer: one thread that claims due jobs for the free slots and hands them over.

TL;DR: `Claimer.start` runs the claim loop in its own thread: wait for free slots (the
claim ledger), claim that many due jobs in one store call, put each on the hand-off
queue to the handler threads, and when nothing was due wait for a wake-up or the poll
interval. `Claimer.hand_over` is also how the settler hands over the claims its commit
took for the slots it freed.

Pattern:
    A non-daemon ``BackgroundService`` (``patterns.daemon_threads``) feeding a
    ``ClosableQueue`` (``patterns.closable_queue``): once the stop closes the queue, a
    claim that cannot be handed over is released at once, never left to its lease. The
    pool-level check (the ledger's ``accepting``, read under the worker's lock) means a
    handler that swallowed its cancellation cannot make this thread claim again.

Guarantees:
    * Claims that keep raising are retried after a doubling wait, from ``poll_interval``
      up to 30 s; once they have failed for ``outage_limit`` seconds the worker is stopped
      with the reason (``failure``). A failed claim never counts as an empty queue.
    * With ``exit_when_empty``, the worker is stopped once no job is due or running
      anywhere, read only after this worker holds nothing, so a retry it committed is
      never missed.
    * A claim is handed over, or released (``release_unstarted``): none is dropped.

See also: ``patterns.jobqueue.worker.worker`` (what wires it), ``patterns.jobqueue.worker.ledger``,
``tests/jobqueue/test_claimer.py``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from patterns.closable_queue import ClosableQueue, ShutDown
from patterns.daemon_threads import BackgroundService, StopReport
from patterns.jobqueue.stores.records import Claim
from patterns.jobqueue.tasks import Phase, describe_error
from patterns.jobqueue.worker.ledger import ClaimLedger
from patterns.jobqueue.worker.shared import Shared
from patterns.jobqueue.worker.states import Step

__all__ = ["Claimer", "Polling"]

logger = logging.getLogger(__name__)

MAX_BACKOFF = 30.0  # seconds between claims while the store keeps failing


@dataclass(frozen=True, slots=True)
class Polling:
    """When the claimer claims again, and when it stops claiming for good."""

    interval: float  # the idle wait (``poll_interval``), and the first backoff
    outage_limit: float  # seconds of failed claims before the worker stops itself
    exit_when_empty: bool  # stop once no job is due or running anywhere


class Claimer:
    """Claims jobs for the free slots and hands them over; see the module docstring.

    Collaborators (none is the worker itself): ``shared`` (the store, the lease owner,
    the lease, the store's clock, ``wake``, set to end the idle wait, ``request_stop``,
    ``error``, ``died``, the step hook and ``track``, which wraps the thread's target);
    ``ledger``, the claims in hand and the free slots; ``handoff``, the queue the
    handler threads take claims from; ``polling``, the waits and limits;
    ``release_unstarted(claim)``: give back a claim no handler will take. Once the store
    has failed every claim for ``outage_limit`` it stops the worker, and ``failure``
    (read under the lock) says why.
    """

    def __init__(
        self,
        shared: Shared,
        ledger: ClaimLedger,
        handoff: ClosableQueue[Claim],
        *,
        polling: Polling,
        release_unstarted: Callable[[Claim], None],
    ) -> None:
        self._shared, self._store = shared, shared.store
        self._ledger, self._handoff = ledger, handoff
        self._owner, self._lease, self._clock = shared.owner, shared.lease, shared.clock
        self._poll_interval, self._outage_limit = polling.interval, polling.outage_limit
        self._exit_when_empty = polling.exit_when_empty
        self._wake, self._release_unstarted = shared.wake, release_unstarted
        self._request_stop, self._lock = shared.request_stop, shared.lock
        self.failure: str | None = None  # why the claimer stopped the worker (lock held)
        self._error, self._died = shared.error, shared.died
        self._stepping = shared.stepping  # no step hook (the default): its no-op is not called
        # Set as the loop begins and once it has left it (its claims settled); waited on
        # by the stop, which cannot always join the thread (a Ctrl-C in Thread.start).
        self.loop_began = threading.Event()
        self.loop_ended = threading.Event()
        name = f"{shared.owner}-claimer"
        self._service = BackgroundService(
            shared.track(self._loop, name), name=name, stop_timeout=shared.stop_timeout
        )

    @property
    def thread_name(self) -> str:
        """The name of the claiming thread."""
        return self._service.name

    def start(self) -> None:
        """Start the claiming thread."""
        self._service.start()

    def stop(self, timeout: float) -> StopReport:
        """Wait (within ``timeout``) for the thread to leave; it left when DRAINING began."""
        return self._service.stop(timeout)

    def _loop(self, stopping: threading.Event) -> None:
        self.loop_began.set()
        try:
            self._claim_until_stopped(stopping)
        except BaseException as exc:  # noqa: BLE001 - logged; a silent death leaves the queue unworked
            self._died(exc)
        finally:
            self.loop_ended.set()

    def _claim_until_stopped(self, stopping: threading.Event) -> None:
        failures = 0
        outage_since = 0.0  # monotonic time of the first claim of a run of failed ones
        while want := self._ledger.reserve(stopping):
            self._wake.clear()  # an enqueue from now on ends the idle wait below
            try:
                claims = self._store.claim(self._owner, lease=self._lease, limit=want)
                failures = 0
            except Exception as exc:  # noqa: BLE001 - logged; back off and claim again
                claims = []
                failures += 1
                self._error(Phase.DEQUEUE, None, exc)
                now = time.monotonic()
                outage_since = now if failures == 1 else outage_since
                if now - outage_since >= self._outage_limit:
                    with self._ledger.cond:
                        self._ledger.give_back(want)  # the claim that failed took no slot
                    self._give_up(
                        f"the store failed every claim for {now - outage_since:.1f} s "
                        f"({failures} claims; store_outage_limit {self._outage_limit:g} s): "
                        f"{describe_error(exc)}"
                    )
                    return
            if not self.hand_over(claims, want, stopping):
                return  # the stop began while we were claiming: they were given back
            if claims:
                continue  # jobs were due: claim again at once
            wait = self.next_wait(failures)
            if wait is None:
                self._request_stop("no job is due or running anywhere (exit when empty)")
                return
            self._wake.wait(min(wait, threading.TIMEOUT_MAX))  # poll_interval may be inf

    def _give_up(self, reason: str) -> None:
        """Stop the worker: the store has failed every claim for ``outage_limit``."""
        with self._lock:
            self.failure = reason
        logger.critical("worker %s: %s; stopping", self._owner, reason)
        self._request_stop(reason)

    def hand_over(
        self, claims: list[Claim], reserved: int, stopping: threading.Event | None = None
    ) -> bool:
        """Hold ``claims`` and put each on the hand-off; False once the stop closed it.

        The ``reserved`` slots no claim filled are freed. The claims not handed over (the
        stop began, or this thread is dying) are released at once: they would otherwise
        wait out their leases with no outcome recorded.
        """
        with self._ledger.cond:
            self._ledger.hold(claims, reserved)
        for index, claim in enumerate(claims):
            try:
                if self._stepping:
                    self._shared.step(Step.AFTER_CLAIM, claim, None)
                # This thread's own service was stopped (a start that failed part-way stops
                # what it started) before the worker's stop began: hand nothing more over.
                handed = stopping is None or not stopping.is_set()
                if handed:
                    self._handoff.put(claim)
            except ShutDown:
                handed = False
            except BaseException:
                self._release_all(claims[index:])
                raise
            if not handed:
                self._release_all(claims[index:])
                return False
        return True

    def _release_all(self, claims: list[Claim]) -> None:
        for claim in claims:
            self._release_unstarted(claim)

    def next_wait(self, failures: int) -> float | None:
        """Seconds to wait before claiming again: a backoff after failed claims, else idle."""
        if failures:
            # The exponent is capped too: 2.0 ** 1024 overflows, and a store can fail longer.
            doubled = self._poll_interval * 2.0 ** min(failures - 1, 32)
            return min(doubled, MAX_BACKOFF)
        return self._idle_wait()

    def _idle_wait(self) -> float | None:
        """Seconds to wait before the next claim; None to stop (``exit_when_empty``).

        Idle is read first: once this worker holds nothing (every outcome committed),
        the store reads after it see all its commits, so a retry committed meanwhile is
        never missed.
        """
        idle = self._exit_when_empty and self._ledger.all_idle()
        try:
            next_due = self._store.next_due()
            now = self._clock()
            if idle:
                running_anywhere = self._store.counts()["running"]
                if running_anywhere == 0 and (next_due is None or next_due > now):
                    return None
        except Exception as exc:  # noqa: BLE001 - logged by error()
            self._error(Phase.DEQUEUE, None, exc)
            return self._poll_interval
        if next_due is not None and next_due > now:
            return min(self._poll_interval, next_due - now)
        return self._poll_interval
