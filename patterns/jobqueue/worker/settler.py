"""The settler: a worker's group commit, one store transaction for many jobs' outcomes.

TL;DR: a handler thread hands its job's decided outcome to `Settler.put` and is free at
once; the settler's thread commits every outcome waiting in one store call (which claims a
job for each slot they freed), reports each outcome back and runs the hooks of the
accepted ones. While one commit is in flight the next batch collects; one that finds the
settler idle is committed at once. The last job in hand (nothing could join its batch) is
committed by its own handler thread (`Settler.take_lead`, `Settler.commit_led`).

Pattern:
    A non-daemon ``BackgroundService`` (``patterns.daemon_threads``): a commit in flight
    is never abandoned. The outbox is closed once, like a closable queue
    (``patterns.closable_queue``): then `Settler.put` refuses and the handler thread
    commits its own outcome. The outbox is guarded by the worker's lock, so a hand-over is
    one lock hold with the claim's move and its slot, and the refill's "may I claim?"
    (the ledger's ``accepting``) is read under the lock ``request_stop`` closes the gate with.

Guarantees:
    * Each outcome is fenced on its own: one refused leaves the others applied.
    * Every outcome handed over is reported back exactly once (``settled``), after its
      commit; a thread dying part-way reports what it had not as unsettled first.
    * A store call that raised takes one bounded fallback (``patterns.jobqueue.worker.fallback``,
      which also reads each job's answer) that keeps the attempt spent: requeued while
      attempts are left, failed after.

See also: ``patterns.jobqueue.worker.worker`` (what wires it),
``patterns.jobqueue.worker.fallback``, ``tests/jobqueue/test_settler.py``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from patterns.daemon_threads import BackgroundService, StopReport
from patterns.jobqueue.stores.records import Claim, Job, JsonValue, Settle
from patterns.jobqueue.tasks import Phase
from patterns.jobqueue.worker.fallback import Fallback, Pending, Run
from patterns.jobqueue.worker.shared import Shared
from patterns.jobqueue.worker.states import Step

__all__ = ["Ledger", "Pending", "Run", "Settler"]

logger = logging.getLogger(__name__)

_R = TypeVar("_R", bound=Run)
_NEVER_SET = threading.Event()  # a led commit's "stopping": the ledger's gate decides there


class Ledger(Protocol[_R]):
    """What the settler reads of the claims in hand, and what it reports back to them."""

    @property
    def accepting(self) -> bool:
        """Whether the refill may claim now (the worker is RUNNING), read with the lock held."""
        ...

    def give_back(self, slots: int) -> None:
        """Free ``slots`` reserved for a refill that no claim filled (lock held)."""
        ...

    def record_batch(self, batch: list[Pending[_R]]) -> None:
        """Record each committed item's ``outcome`` (None: unsettled)."""
        ...

    def unsettled_pending(self, pending: Pending[_R]) -> None:
        """An outcome a dying thread never committed."""
        ...


class Settler(Generic[_R]):
    """Commits handed-over outcomes in groups, in its own thread; see the module docstring.

    Collaborators (none is the worker itself): ``shared`` (the store, the worker's lock
    guarding the outbox, ``error``, ``died``, the step hooks, ``wake``, set after each
    commit, and ``track``, which wraps the thread's target); ``ledger``, the claims in
    hand; ``claimed(claims, want, stopping)``: the refill's claims; ``completed(job,
    result)``: an accepted completion's hook.
    """

    def __init__(
        self,
        shared: Shared,
        ledger: Ledger[_R],
        *,
        claimed: Callable[[list[Claim], int, threading.Event | None], object],
        completed: Callable[[Job, JsonValue], None],
    ) -> None:
        self._shared, self._ledger, self._lock = shared, ledger, shared.lock
        self._claimed, self._completed = claimed, completed
        self._error, self._died, self._wake = shared.error, shared.died, shared.wake
        # Without a step hook (the default) its no-op is not called: two calls a job.
        self._stepping = shared.stepping
        # A job's answer read, and a failed commit's fallback (patterns.jobqueue.worker.fallback).
        self._fallback: Fallback[_R] = Fallback(shared)
        # Guards every field below it, with everything the worker guards by the same lock.
        # Waited on by the settler's thread alone (``_waiting``: it waits and nobody has
        # notified it yet); notified by put() and commit_led() while it waits (once: they
        # clear ``_waiting``), and by close().
        self._ready = threading.Condition(self._lock)
        self._outbox: list[Pending[_R]] = []  # handed over, not yet taken by the thread
        self._closed = False  # set by close() (or the thread's death): put() refuses
        self._waiting = False
        # A commit is running: the thread's, or one led by a handler thread (take_lead).
        # While it runs, outcomes collect in the outbox for the next commit.
        self._in_flight = False
        self._refill = 0  # slots freed by outcomes in the outbox: the commit claims for them
        name = f"{shared.owner}-settler"
        self._service = BackgroundService(
            shared.track(self._loop, name), name=name, stop_timeout=shared.stop_timeout
        )

    @property
    def thread_name(self) -> str:
        """The name of the settler's thread."""
        return self._service.name

    def start(self) -> None:
        """Start the settler's thread."""
        self._service.start()

    def close(self) -> None:
        """No more hand-overs: the thread commits what it has and leaves."""
        with self._lock:
            self._closed = True
            self._ready.notify_all()

    def stop(self, timeout: float) -> StopReport:
        """Wait (within ``timeout``) for the thread to commit what it holds and leave."""
        return self._service.stop(timeout)

    def put(self, pending: Pending[_R]) -> bool:
        """Queue ``pending`` and its slot; False once closed (lock held)."""
        if self._closed:
            return False
        self._outbox.append(pending)
        self._refill += 1  # the commit claims for it with the outcome
        if self._waiting and not self._in_flight:
            # Woken once: until it waits again, the puts after this one need not notify.
            self._waiting = False
            self._ready.notify()
        return True

    def take_lead(self) -> int | None:
        """Let the calling handler thread commit the group itself (lock held).

        For the last job in hand: no thread is woken, and none wakes the handler back.
        None while a commit is in flight or once closed (`put` the outcome then); else the
        commit is the caller's (`commit_led` ends it) and the slots its claim may fill are
        returned (1, or 0 once stopping).
        """
        if self._closed or self._in_flight:
            return None
        self._in_flight = True
        if self._ledger.accepting:
            return 1
        self._ledger.give_back(1)
        return 0

    def commit_led(self, pending: Pending[_R], want: int) -> None:
        """Commit ``pending``, the outbox, then what came meanwhile, in this thread."""
        with self._lock:  # what the others queued goes first, in the same commit
            batch, self._outbox = [*self._outbox, pending], []
            want += self._take_refill(_NEVER_SET)
        try:
            while True:
                self.commit_batch(batch, want, None)
                with self._lock:
                    if not self._outbox or self._closed:
                        break
                    batch, self._outbox = self._outbox, []
                    want = self._take_refill(_NEVER_SET)
        finally:
            with self._lock:
                self._in_flight = False
                if self._outbox and self._waiting:
                    self._waiting = False
                    self._ready.notify()
        if not self._wake.is_set():  # a retry may be due, or exit_when_empty apply now
            self._wake.set()

    def _loop(self, stopping: threading.Event) -> None:
        """Commit every outcome waiting, in one store call, until closed and empty.

        `close` ends the wait (``stopping``, the service's, is not waited on).
        """
        try:
            while True:
                with self._lock:
                    while (not self._outbox or self._in_flight) and not self._closed:
                        self._waiting = True
                        self._ready.wait()
                    self._waiting = False
                    batch, self._outbox = self._outbox, []
                    want = self._take_refill(stopping)
                    self._in_flight = bool(batch)
                if not batch:
                    return
                try:
                    self.commit_batch(batch, want, stopping)
                finally:
                    with self._lock:
                        self._in_flight = False
                if not self._wake.is_set():  # a retry may be due, or exit_when_empty apply now
                    self._wake.set()
        except BaseException as exc:  # noqa: BLE001 - reported; a silent death leaves outcomes unwritten
            with self._lock:
                self._closed = True  # from now on each handler thread commits its own
                left, self._outbox = self._outbox, []
                self._ledger.give_back(self._take_refill(stopping, claiming=False))
            for pending in left:
                self._ledger.unsettled_pending(pending)
            self._died(exc)

    def _take_refill(self, stopping: threading.Event, *, claiming: bool = True) -> int:
        """Reserve the slots the outbox's outcomes freed, for the commit's claim (lock held).

        Once the worker is stopping (or not ``claiming``) no claim is taken: the slots are
        free again at once and 0 is returned.
        """
        want, self._refill = self._refill, 0
        if claiming and self._ledger.accepting and not stopping.is_set():
            return want
        self._ledger.give_back(want)
        return 0

    def commit_batch(
        self, batch: list[Pending[_R]], want: int = 0, stopping: threading.Event | None = None
    ) -> None:
        """Commit ``batch`` in one store call, report each outcome, then run the hooks.

        The call is `~.Store.settle_many`; with ``want`` reserved
        slots, `~.Store.settle_and_claim`, whose transaction claims
        for them too. The claims go to ``claimed``, which frees the slots no claim filled.
        A thread dying part-way (a `BaseException`) reports every outcome it had not
        reported yet as unsettled before it goes.
        """
        try:
            claims = self._commit_group(batch, want)
        except BaseException:
            with self._lock:
                self._ledger.give_back(want)
            for pending in batch:
                self._ledger.unsettled_pending(pending)
            raise
        self._ledger.record_batch(batch)
        if want:  # before the hooks: the handlers start on them while the hooks run
            self._claimed(claims, want, stopping)
        timed = logger.isEnabledFor(logging.INFO)  # once a batch: each completion's line
        for pending in batch:
            if pending.outcome is not pending.success:
                continue
            item = pending.item
            if item.kind is Settle.COMPLETE:
                job = pending.run.claim.job
                if pending.began is not None and timed:
                    took = time.monotonic() - pending.began
                    logger.info("job %d (%s) done in %.2f s", job.id, job.task, took)
                self._completed(job, item.result)
            elif pending.then is not None:
                pending.then()

    def _commit_group(self, batch: list[Pending[_R]], want: int = 0) -> list[Claim]:
        """Set each item's ``outcome``: one store call for all, each fenced on its own.

        With ``want``, that call also claims up to ``want`` jobs: the claims are returned.
        """
        sent = self._step_before(batch) if self._stepping else batch
        if not sent and not want:
            return []
        try:
            items = [pending.item for pending in sent]
            answers, claims = self._fallback.group_call(items, lease=self._shared.lease, want=want)
        except Exception as exc:  # noqa: BLE001 - reported by error()
            if sent:
                self._fallback.group_failed(sent, exc)
            else:
                self._error(Phase.DEQUEUE, None, exc)
            return []
        for pending, answer in zip(sent, answers, strict=True):
            if self._stepping:
                try:
                    self._shared.step(Step.AFTER_COMMIT, pending.item.claim, pending.phase)
                except Exception as exc:  # noqa: BLE001 - as if its own store call raised
                    pending.outcome = self._fallback.raised(pending, exc)
                    continue
            if answer is True:  # accepted, as `Fallback.answered` reads it (one call less)
                pending.outcome = pending.success
            else:
                pending.outcome = self._fallback.answered(pending, answer)
        return claims

    def _step_before(self, batch: list[Pending[_R]]) -> list[Pending[_R]]:
        """Call the step hook before each item's commit; the items it did not raise for."""
        sent: list[Pending[_R]] = []
        for pending in batch:
            try:
                self._shared.step(Step.BEFORE_COMMIT, pending.item.claim, pending.phase)
            except Exception as exc:  # noqa: BLE001 - as if its own store call raised
                pending.outcome = self._fallback.raised(pending, exc)
                continue
            sent.append(pending)
        return sent
