"""The handler threads' loop: take a claim, run it, hand its outcome to the settler.

TL;DR: each of the worker's ``concurrency`` pool threads runs `HandlerLoop.consume`: take
a claim from the hand-off queue (a `HandOff`), start it if the worker still accepts jobs
(else release it unstarted), run it (`~patterns.jobqueue.worker.runner.JobRunner`), and
hand its decided outcome to the settler in the same lock hold that frees the thread's
slot and takes and starts its next queued claim. It returns once the hand-off is closed
and empty.

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

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from patterns.closable_queue import ClosableQueue, ShutDown
from patterns.jobqueue.stores.records import Claim
from patterns.jobqueue.worker.fallback import Pending
from patterns.jobqueue.worker.ledger import ClaimLedger, Held
from patterns.jobqueue.worker.runner import JobRunner
from patterns.jobqueue.worker.settler import Settler
from patterns.jobqueue.worker.shared import Shared

__all__ = ["HandOff", "HandlerLoop"]


class HandOff(ClosableQueue[Claim]):
    """The hand-off queue: a ``ClosableQueue`` of claims, with a fast path for its busy case.

    Every job's claim passes through it once, so its calls are cheaper than the general
    queue's: a `get` that finds a claim takes it in one hold of the queue's lock (no
    ``not_full`` to notify: the queue is unbounded), one that finds none waits as
    ``ClosableQueue.get`` does, and a `put` notifies only while a thread waits in `get`
    that no put's notify is on its way to. Everything else is ``ClosableQueue``'s own.

    Given ``lock`` (the worker's), the queue is guarded by it instead of a lock of its own:
    a handler thread then hands its outcome over and takes its next claim (`take`) in one
    hold. A put stays one short hold a claim: putting a whole batch in the hold that
    records it made the handler threads wait for the lock (twice the thread switches a
    job with two free CPUs).
    """

    def __init__(self, lock: threading.RLock | None = None) -> None:
        super().__init__()  # unbounded: a put never waits
        self.lock = lock  # the lock given, if any
        if lock is not None:  # the base's conditions, over the given lock
            self.mutex = lock  # type: ignore[assignment]  # an RLock serves as well
            self.not_empty = threading.Condition(lock)
            self.not_full = threading.Condition(lock)
            self.all_tasks_done = threading.Condition(lock)
        # Guarded by ``mutex``. ``_asleep``: the threads in get's wait loop. ``_woken``: the
        # notifies put has sent that no thread has returned from a wait with yet (each
        # return takes one back, whatever woke it). A put notifies only while
        # ``_asleep > _woken``, when some thread waits that no notify is on its way to:
        # no notify is wasted on a thread already woken (a busy worker's puts sent ~1 a
        # job before), and no thread sleeps beside a queued claim.
        self._asleep = 0
        self._woken = 0

    def put(self, item: Claim, block: bool = True, timeout: float | None = None) -> None:
        """Queue ``item``; ``ShutDown`` once the queue is shut. Never waits (unbounded)."""
        with self.mutex:
            if self.is_shutdown:
                raise ShutDown
            self.queue.append(item)
            self.unfinished_tasks += 1
            if self._asleep > self._woken:  # a thread waits that no put has woken yet
                self._woken += 1
                self.not_empty.notify()

    def get(self, block: bool = True, timeout: float | None = None) -> Claim:
        """The next claim: at once if one is queued; else wait, as ``ClosableQueue.get`` does."""
        with self.mutex:
            if not self.queue:  # queued items are handed out even once shut, as the base does
                self._wait(block, timeout)
            claim: Claim = self.queue.popleft()
            return claim

    def _wait(self, block: bool, timeout: float | None) -> None:
        """Wait until a claim is queued: `ShutDown` once shut and empty; else `queue.Empty`."""
        if timeout is not None and timeout < 0:
            raise ValueError("'timeout' must be a non-negative number")
        deadline = None if timeout is None else time.monotonic() + timeout
        self._asleep += 1
        try:
            while not self.queue:
                if self.is_shutdown:
                    raise ShutDown
                if not block:
                    raise queue.Empty
                if deadline is None:
                    self.not_empty.wait()
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise queue.Empty
                    self.not_empty.wait(left)
                if self._woken:  # this thread's wake-up, or one sent to nobody
                    self._woken -= 1
        finally:
            self._asleep -= 1

    def take(self) -> Claim | None:
        """The next claim if one is queued, else None; never waits (``mutex`` held)."""
        if self.queue:  # handed out even once shut, as get does
            claim: Claim = self.queue.popleft()
            return claim
        return None


class HandlerLoop:
    """The loop each handler thread runs; see the module docstring.

    Collaborators: ``shared`` (the worker's lock, which guards ``handoff`` too; ``wake``,
    set when this thread commits an outcome itself, and ``died``); ``handoff``, the queue
    of claims from the claimer (and the settler's refills); ``ledger``; ``runner``;
    ``settler``; ``release_unstarted(claim)``: give back a claim that must not start.
    """

    def __init__(
        self,
        shared: Shared,
        handoff: HandOff,
        ledger: ClaimLedger,
        runner: JobRunner,
        settler: Settler[Held],
        *,
        release_unstarted: Callable[[Claim], None],
    ) -> None:
        if handoff.lock is not shared.lock:
            raise ValueError("the hand-off must be guarded by the worker's lock")
        self._handoff, self._ledger, self._runner = handoff, ledger, runner
        self._settler, self._release_unstarted = settler, release_unstarted
        self._lock, self._wake, self._died = shared.lock, shared.wake, shared.died

    def consume(self) -> None:
        """Run claims until the hand-off is closed and empty (one handler thread's life)."""
        runner, ledger = self._runner, self._ledger
        try:
            run: Held | None = None
            while True:
                if run is None:
                    run = self._next()
                    if run is None:
                        return  # closed and empty: the worker is stopping
                try:
                    pending = runner.run(run)  # decides the outcome but commits nothing
                except BaseException:  # the thread dies (below): its job goes unsettled
                    ledger.unsettled(run)
                    raise
                if pending is None:  # every path decides an outcome; never left held if not
                    ledger.unsettled(run)
                run = self._finish(pending)
        except BaseException as exc:  # noqa: BLE001 - logged; a silent death shrinks the pool
            self._died(exc)

    def _next(self) -> Held | None:
        """Wait for a claim that may start and start it; None once the hand-off is shut."""
        while True:
            with self._lock:  # a claim queued: taken and started in one hold
                claim = self._handoff.take()
                run = None if claim is None else self._ledger.try_start(claim.job.id)
            if claim is None:
                try:
                    claim = self._handoff.get()  # may wait
                except ShutDown:
                    return None
                run = self._ledger.start(claim.job.id)
            if run is not None:
                return run
            self._unstarted(claim)

    def _unstarted(self, claim: Claim) -> None:
        """Give back a claim that must not start; its slot is free."""
        self._release_unstarted(claim)
        with self._lock:
            self._ledger.free_slot()

    def _finish(self, pending: Pending[Held] | None) -> Held | None:
        """Hand the outcome over with its slot; the next claim, started, if one is queued.

        One lock hold a job on the busy path: the claim moves to SETTLING (from then on
        the heartbeat leaves it alone, and ``running_jobs`` and the report still name it
        until its outcome is recorded), the outcome goes to the settler, and the next
        queued claim is taken and started, under the lock ``request_stop`` closes the
        gate with. When no other job is waiting or running, no other outcome can join the
        group: this thread commits it (`Settler.take_lead`) rather than wake the settler
        and wait to be woken back.
        """
        claim = run = lead = None
        queued = True  # no outcome (settled already) has nothing to commit either
        with self._lock:
            if pending is not None:
                held = pending.run
                others = self._ledger.hand_over(held)  # RUNNING -> SETTLING
                if pending.item.claim is not held.claim:  # the heartbeat renewed it
                    pending.item = replace(pending.item, claim=held.claim)
                if not others:
                    lead = self._settler.take_lead()
                queued = lead is not None or self._settler.put(pending)
            # A queued or led outcome takes its slot along: its commit claims for it.
            if pending is None or not queued:
                self._ledger.free_slot()
            if lead is None and queued:  # nothing for this thread to commit: the next claim
                claim = self._handoff.take()
                if claim is not None:
                    run = self._ledger.try_start(claim.job.id)
                    if run is not None:
                        return run
        if pending is not None:
            if lead is not None:  # the last job in hand: this thread commits the group
                self._settler.commit_led(pending, lead)
            elif not queued:  # the settler is gone: commit here
                self._settler.commit_batch([pending])
                self._wake.set()
        if claim is not None:
            self._unstarted(claim)
        return None
