"""The handler threads' loop: take a claim, run it, hand its outcome to the settler.

TL;DR: each of the worker's ``concurrency`` pool threads runs `HandlerLoop.consume`: take
a claim from the hand-off queue (a `HandOff`), start it if the worker still accepts jobs
(else release it unstarted), run it (`~patterns.jobqueue.worker.runner.JobRunner`), and
hand its decided outcome to the settler in the same lock hold that frees the thread's
slot. It returns once the hand-off is closed and empty.

Pattern:
    The consumers of a ``ClosableQueue`` (``patterns.closable_queue``) on a
    ``TrackingExecutor`` (``patterns.executor_shutdown``): a closed queue ends each loop,
    and the executor's graceful wait is the worker's DRAINING.

Guarantees:
    * A job starts only while the ledger accepts jobs, checked under the lock that
      ``request_stop`` closes it with; otherwise it is released unstarted.
    * Every job reaches an outcome: a decided one goes to the settler (or, once the
      settler is gone, is committed by this thread); a thread dying part-way records
      its job unsettled (the lease expires and it runs again) and stops the worker.

See also: ``patterns.jobqueue.worker.worker`` (what wires it), ``patterns.jobqueue.worker.settler``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from patterns.closable_queue import ClosableQueue, ShutDown
from patterns.jobqueue.stores.records import Claim
from patterns.jobqueue.worker.fallback import Pending
from patterns.jobqueue.worker.ledger import ClaimLedger, Held
from patterns.jobqueue.worker.outcomes import ClaimState
from patterns.jobqueue.worker.runner import JobRunner
from patterns.jobqueue.worker.settler import Settler
from patterns.jobqueue.worker.shared import Shared

__all__ = ["HandOff", "HandlerLoop"]


class HandOff(ClosableQueue[Claim]):
    """The hand-off queue: a ``ClosableQueue`` of claims, with a fast path for its busy case.

    Every job's claim passes through it once, so its two calls are cheaper than the
    general queue's when nobody has to wait: a `get` that finds a claim takes it in one
    hold of the queue's lock (no ``not_full`` to notify: the queue is unbounded), and a
    `put` wakes a handler thread only if one is asleep in `get`. A `get` that may wait,
    or finds the queue shut, is ``ClosableQueue``'s own, as is everything else.
    """

    def __init__(self) -> None:
        super().__init__()  # unbounded: a put never waits
        self._asleep = 0  # threads in the slow get, which may wait (guarded by ``mutex``)

    def put(self, item: Claim, block: bool = True, timeout: float | None = None) -> None:
        """Queue ``item``; ``ShutDown`` once the queue is shut. Never waits (unbounded)."""
        with self.mutex:
            if self.is_shutdown:
                raise ShutDown
            self.queue.append(item)
            self.unfinished_tasks += 1
            if self._asleep:  # a get that found nothing is waiting, or about to check again
                self.not_empty.notify()

    def get(self, block: bool = True, timeout: float | None = None) -> Claim:
        """The next claim: at once if one is queued, else as ``ClosableQueue.get`` waits."""
        with self.mutex:
            if self.queue:  # queued items are handed out even once shut, as the base does
                claim: Claim = self.queue.popleft()
                return claim
            # Counted before the lock is let go: a put from now on notifies, and one that
            # came before it queued an item the base get below finds before it waits.
            self._asleep += 1
        try:
            return super().get(block, timeout)
        finally:
            with self.mutex:
                self._asleep -= 1


class HandlerLoop:
    """The loop each handler thread runs; see the module docstring.

    Collaborators: ``shared`` (``wake``, set when this thread commits an outcome
    itself, and ``died``); ``handoff``, the queue of claims from the claimer (and the
    settler's refills); ``ledger``; ``runner``; ``settler``; ``release_unstarted(claim)``:
    give back a claim that must not start.
    """

    def __init__(
        self,
        shared: Shared,
        handoff: ClosableQueue[Claim],
        ledger: ClaimLedger,
        runner: JobRunner,
        settler: Settler[Held],
        *,
        release_unstarted: Callable[[Claim], None],
    ) -> None:
        self._handoff, self._ledger, self._runner = handoff, ledger, runner
        self._settler, self._release_unstarted = settler, release_unstarted
        self._wake, self._died = shared.wake, shared.died

    def consume(self) -> None:
        """Run claims until the hand-off is closed and empty (one handler thread's life)."""
        try:
            while True:
                try:
                    claim = self._handoff.get()
                except ShutDown:
                    return  # closed and empty: the worker is stopping
                pending = self._process(claim)
                with self._ledger.cond:  # one lock hold: the outcome handed over, the slot
                    lead = None if pending is None else self._hand_over(pending)
                    queued = pending is None or lead is not None or self._settler.put(pending)
                    # A queued or led outcome takes its slot along: its commit claims for it.
                    if pending is None or not queued:
                        self._ledger.free_slot()
                if pending is None:
                    continue
                if lead is not None:  # the last job in hand: this thread commits the group
                    self._settler.commit_led(pending, lead)
                elif not queued:  # the settler is gone: commit here
                    self._settler.commit_batch([pending])
                    self._wake.set()
        except BaseException as exc:  # noqa: BLE001 - logged; a silent death shrinks the pool
            self._died(exc)

    def _process(self, claim: Claim) -> Pending[Held] | None:
        """Run one handed-off claim; its decided outcome, for the settler (None: settled)."""
        run = self._ledger.start(claim.job.id)
        if run is None:
            self._release_unstarted(claim)
            return None
        try:
            pending = self._runner.run(run)  # decides the outcome but commits nothing
        except BaseException:  # the thread dies (consume): its job goes unsettled
            self._ledger.unsettled(run)
            raise
        if pending is None:  # every path decides an outcome; never left held if not
            self._ledger.unsettled(run)
        return pending

    def _hand_over(self, pending: Pending[Held]) -> int | None:
        """Move the claim to SETTLING; the slots to claim if this thread leads the commit.

        Lock held. From here on the heartbeat leaves the claim alone, and ``running_jobs``
        and the report still name it until its outcome is recorded. When no other job is
        waiting or running, no other outcome can join the group: this thread commits it
        (`Settler.take_lead`) rather than wake the settler and wait to be woken back.
        """
        run = pending.run
        self._ledger.move(run, ClaimState.SETTLING)
        claim = run.claim  # the heartbeat may have renewed it
        if pending.item.claim is not claim:
            pending.item = replace(pending.item, claim=claim)
        return None if self._ledger.others_active(run) else self._settler.take_lead()
