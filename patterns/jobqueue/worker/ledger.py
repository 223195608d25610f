"""The claim ledger: every claim a worker holds, its state, the free slots, the counters.

TL;DR: the worker's one record of its claims, shared by its parts under the worker's
lock: the claimer reserves free slots (`ClaimLedger.reserve`) and holds what it claimed
(`ClaimLedger.hold`); a handler thread starts a job or is told not to
(`ClaimLedger.start`, or `ClaimLedger.try_start` in a hold it has), hands its outcome over
(`ClaimLedger.hand_over`) or frees its slot (`ClaimLedger.free_slot`); every outcome is
recorded exactly once (`ClaimLedger.record`), which stops holding its claim; the
heartbeat renews what ``held`` lists, and cancels a job through `Held.cancel`; a job's
token is made the first time it is asked for (`ClaimLedger.job_token`); the reports read
`ClaimLedger.running` and `ClaimLedger.still_held`.

Pattern:
    A monitor (one lock, one condition) around plain data, as ``patterns.closable_queue``
    guards its items: ``accepting`` is the gate that ``request_stop`` closes under the
    lock every claim and every job start reads, so none starts after it, whatever a
    handler did with its token. Each claim's moves are checked against
    ``CLAIM_MOVES`` (``patterns.jobqueue.worker.outcomes``).

Guarantees:
    * A claim is held from `ClaimLedger.hold` until its outcome is recorded, and recorded once:
      ``claimed - settled`` is exactly what is in hand.
    * A cancel is never lost to a token not made yet: `Held.cancel` keeps its reason
      under the lock `ClaimLedger.job_token` makes the token under, which makes it
      cancelled with that reason (and a child of a cancelled worker's token is cancelled).
    * Slots are never lost: each one reserved by a claim is either filled by a claim,
      given back (`ClaimLedger.give_back`), or freed by the job that used it
      (`ClaimLedger.free_slot`).

See also: ``patterns.jobqueue.worker.worker`` (what wires it), ``patterns.jobqueue.worker.claimer``,
``patterns.jobqueue.worker.handlers``, ``tests/jobqueue/test_claimer.py``.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from patterns.cancellation import CancelToken
from patterns.jobqueue.stores.records import Claim, Job
from patterns.jobqueue.worker.fallback import Pending
from patterns.jobqueue.worker.outcomes import CLAIM_MOVES, ClaimState, Outcome

__all__ = ["ClaimLedger", "Held"]

logger = logging.getLogger(__name__)

_ACTIVE = (ClaimState.WAITING, ClaimState.RUNNING)  # an outcome may still join a group commit


@dataclass(slots=True)
class Held:
    """One claim the worker holds, from the claim to its outcome; changed under the lock."""

    claim: Claim  # the latest: the heartbeat replaces it with each renewed one
    state: ClaimState = ClaimState.WAITING
    # The job's, a child of the worker's, made on first use (`ClaimLedger.job_token`).
    token: CancelToken | None = None
    cancel_reason: str | None = None  # a cancel that came before the token was made
    outcome: Outcome | None = None  # set once, when recorded
    released_at_deadline: bool = False  # released by the forced stop while it still ran
    cancel_requested: bool = False  # an operator cancelled the job (seen by a renew)
    handler_token: CancelToken | None = None  # the handler's: ``token``'s child with its timeout
    timeout: float | None = None  # seconds the handler may run (the job's, else the task's)
    overdue_reported: bool = False  # the warning for a handler past its deadline was logged
    pending: Pending[Held] | None = None  # its decided outcome, on its way to the settler

    def cancel(self, reason: str) -> CancelToken | None:
        """Cancel the job (the worker's lock held): its token, for the caller to cancel.

        None while no token is made: the reason is kept, and `ClaimLedger.job_token`
        makes the token cancelled with it.
        """
        if self.token is None and self.cancel_reason is None:
            self.cancel_reason = reason
        return self.token


class ClaimLedger:
    """The claims in hand, free slots and counters; see the module docstring.

    ``cond`` is the worker's condition over its lock: methods marked "lock held" must be
    called with it held, the others take it; the claimer waits on it for free slots.
    ``root`` is the worker's token: each claim's token is its child. ``slots`` is how
    many claims may be held at once; the claimer waits until ``claim_at`` are free.
    """

    def __init__(
        self, cond: threading.Condition, *, root: CancelToken, slots: int, claim_at: int
    ) -> None:
        self.cond = cond
        self._root = root
        self.slots, self._claim_at = slots, claim_at
        # Claims and job starts are accepted (the worker is RUNNING): opened by start and
        # closed by request_stop, each under the lock (`accept`).
        self.accepting = False
        self.idle = slots  # slots neither holding a claim nor promised to one
        self._claimer_waiting = False
        # Every claim in hand, by job id, from the claim until its outcome is recorded.
        self.held: dict[int, Held] = {}
        self.late: dict[int, Outcome] = {}  # outcomes recorded once accepting closed
        self.counts = dict.fromkeys(Outcome, 0)
        self.claimed = 0
        self.timed_out = 0  # attempts that ended because the handler's timeout passed
        self.released_running: list[int] = []  # released at the stop deadline, still running

    def accept(self, accepting: bool) -> None:
        """Open or close the gate for claims and job starts (lock held); wakes the claimer."""
        self.accepting = accepting
        self.cond.notify_all()

    def reserve(self, stopping: threading.Event) -> int:
        """Wait for ``claim_at`` free slots and promise them all to one claim; 0 once closed."""
        with self.cond:
            while self.accepting and self.idle < self._claim_at:
                self._claimer_waiting = True
                self.cond.wait()
            self._claimer_waiting = False
            if not self.accepting or stopping.is_set():
                return 0
            want, self.idle = self.idle, 0
            return want

    def hold(self, claims: list[Claim], reserved: int) -> None:
        """Hold ``claims``; the ``reserved`` slots they did not fill are free (lock held)."""
        held = self.held
        for claim in claims:  # a plain loop: it runs for every job (fewer calls)
            held[claim.job.id] = Held(claim)
        self.claimed += len(claims)
        self.give_back(reserved - len(claims))

    def job_token(self, held: Held) -> CancelToken:
        """The job's token, a child of the worker's, made on first use (takes the lock).

        Made when the handler first looks at it (or its timeout needs it), not with the
        claim: most handlers never look, and a token is about a microsecond a job. A
        cancel that came first (`Held.cancel`) is applied as it is made, and a child of
        a cancelled worker's token is made cancelled, so a late token misses nothing.
        """
        token = held.token
        if token is None:
            with self.cond:
                token = held.token
                if token is None:
                    token = held.token = self._root.child()
                    if held.cancel_reason is not None:
                        token.cancel(held.cancel_reason)
        return token

    def give_back(self, slots: int) -> None:
        """Free ``slots`` promised slots no claim filled (lock held)."""
        if slots:
            self.idle += slots
            if self._claimer_waiting:
                self.cond.notify()

    def free_slot(self) -> None:
        """A handler thread is free for another job (lock held)."""
        self.give_back(1)

    def start(self, job_id: int) -> Held | None:
        """Move the job to RUNNING if it may start now; None: release it unstarted."""
        with self.cond:
            return self.try_start(job_id)

    def try_start(self, job_id: int) -> Held | None:
        """`start`, with the lock held (a handler thread takes its next claim in that hold)."""
        # Under the lock that request_stop closes the gate with: a job is either running
        # when the stop begins, or released without being started.
        held = self.held.get(job_id)
        if not self.accepting or held is None or held.state is not ClaimState.WAITING:
            return None  # stopping, or LOST: its lease no longer holds
        # WAITING -> RUNNING, as `move` makes it (checked just above), without its call and
        # its debug line: every job passes here, and the runner logs it "running".
        held.state = ClaimState.RUNNING
        return held

    def move(self, held: Held, new: ClaimState) -> None:
        """One claim state change, checked against ``CLAIM_MOVES`` (lock held)."""
        old = held.state
        if new not in CLAIM_MOVES[old]:
            raise RuntimeError(f"job {held.claim.job.id}: no move from {old} to {new}")
        held.state = new
        if logger.isEnabledFor(logging.DEBUG):  # two moves a job: no call when not logged
            logger.debug("job %d: %s -> %s", held.claim.job.id, old, new)

    def record(self, job: Job, outcome: Outcome, held: Held | None = None) -> None:
        """Count ``outcome``; with ``held``, also stop holding that claim."""
        with self.cond:
            self._record(job.id, outcome, held)

    def record_batch(self, batch: list[Pending[Held]]) -> None:
        """Record each committed outcome and stop holding its claim (one lock hold)."""
        with self.cond:
            # `_record` for each, inline: every job passes here.
            in_hand, counts = self.held, self.counts
            late = None if self.accepting else self.late
            for pending in batch:
                held, outcome = pending.run, pending.outcome or Outcome.UNSETTLED
                held.pending = None  # no cycle: the token dies now
                held.outcome = outcome
                job_id = held.claim.job.id
                if in_hand.get(job_id) is held:
                    del in_hand[job_id]
                counts[outcome] += 1
                if late is not None:
                    late[job_id] = outcome

    def _record(self, job_id: int, outcome: Outcome, held: Held | None) -> None:
        if held is not None:
            held.outcome = outcome
            if self.held.get(job_id) is held:
                del self.held[job_id]
        self.counts[outcome] += 1
        if not self.accepting:
            self.late[job_id] = outcome

    def unsettled(self, held: Held) -> None:
        """Record a job whose commit a dying thread never made or finished."""
        logger.error(
            "job %d: left unsettled; it runs again when its lease expires", held.claim.job.id
        )
        held.pending = None
        self.record(held.claim.job, Outcome.UNSETTLED, held)

    def unsettled_pending(self, pending: Pending[Held]) -> None:
        """A thread dying part-way: the outcome it had not recorded is unsettled."""
        if pending.run.outcome is None:
            self.unsettled(pending.run)

    def hand_over(self, held: Held) -> bool:
        """Move a running claim to SETTLING; whether another may join its group (lock held).

        True while another claim is waiting or running: its outcome may still join the
        group commit. One call a job (the move is checked as `move` checks it, unlogged).
        """
        if held.state is not ClaimState.RUNNING:
            self.move(held, ClaimState.SETTLING)  # raises: not a move CLAIM_MOVES allows
        held.state = ClaimState.SETTLING
        # A plain loop, not any() over a generator: it runs for every job (fewer calls).
        # Newest first: the claims still waiting are the last held, and the ones handed
        # over before this one (settling, to be skipped) the first.
        for other in reversed(self.held.values()):
            if other is not held and other.state in _ACTIVE:
                return True
        return False

    def running(self) -> list[int]:
        """Ids of the jobs whose handler has started and not ended (lock held)."""
        started = (ClaimState.RUNNING, ClaimState.SETTLING)
        return sorted(i for i, h in self.held.items() if h.state in started)

    def still_held(self) -> tuple[int, ...]:
        """Ids of claims never started (or lost) that have no outcome yet (lock held)."""
        waiting = (ClaimState.WAITING, ClaimState.LOST)
        return tuple(sorted(i for i, h in self.held.items() if h.state in waiting))

    def settling(self) -> int:
        """Outcomes handed to the settler, not yet committed (lock held)."""
        return sum(1 for h in self.held.values() if h.state is ClaimState.SETTLING)

    def all_idle(self) -> bool:
        """No claim held: every slot free and every outcome handed over committed."""
        with self.cond:
            return self.idle == self.slots and not self.held

    def mark_late_running(self) -> list[Held]:
        """The running jobs not yet released at the deadline, marked released now."""
        with self.cond:
            late = [
                h
                for h in self.held.values()
                if h.state is ClaimState.RUNNING and not h.released_at_deadline
            ]
            for held in late:
                held.released_at_deadline = True
            return late
