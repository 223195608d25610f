"""The claim ledger alone: its slots, its gate, its records and its claims' moves, no `Worker`.

Claims come from a `MemoryStore` on a fake clock; the ledger is called in the test's
thread, except `ClaimLedger.reserve`, which blocks and so runs in a thread the test
watches (`run_in_thread`) and releases by freeing slots. Nothing sleeps.
"""

from __future__ import annotations

import itertools
import threading

import pytest

from patterns.cancellation import CancelToken
from patterns.jobqueue.stores.memory import MemoryStore
from patterns.jobqueue.stores.records import Claim, Settle, Settlement
from patterns.jobqueue.tasks import Phase
from patterns.jobqueue.worker.fallback import Pending
from patterns.jobqueue.worker.ledger import ClaimLedger, Held
from patterns.jobqueue.worker.outcomes import CLAIM_MOVES, ClaimState, Outcome
from tests.support import (
    FakeClock,
    join_or_fail,
    run_in_thread,
    stays_blocked,
    wait_until_blocked_in,
    wait_until_parked_inside,
)

LEASE = 1_000.0


class Bench:
    """A ledger with its own lock and condition, and a store to claim real jobs from."""

    def __init__(self, *, slots: int = 3, claim_at: int = 1) -> None:
        self.store = MemoryStore(clock=FakeClock())
        self.root = CancelToken()
        self.cond = threading.Condition(threading.RLock())
        self.ledger = ClaimLedger(self.cond, root=self.root, slots=slots, claim_at=claim_at)
        self.open()

    def open(self, accepting: bool = True) -> None:
        """Open (or close) the gate, as the worker's state machine does."""
        with self.cond:
            self.ledger.accept(accepting)

    def claims(self, n: int) -> list[Claim]:
        """``n`` fresh claims on the store's jobs."""
        for _ in range(n):
            self.store.enqueue("work")
        return self.store.claim("w1", lease=LEASE, limit=n)

    def hold(self, n: int) -> list[Held]:
        """Reserve every free slot, hold ``n`` new claims in them; their records."""
        reserved = self.ledger.reserve(threading.Event())
        claims = self.claims(n)
        with self.cond:
            self.ledger.hold(claims, reserved)
            return [self.ledger.held[c.job.id] for c in claims]

    def accounted(self) -> None:
        """Every slot either free or holding a claim: never negative, never more."""
        with self.cond:
            assert 0 <= self.ledger.idle <= self.ledger.slots
            assert self.ledger.idle + len(self.ledger.held) == self.ledger.slots


def _pending(held: Held, outcome: Outcome | None) -> Pending[Held]:
    item = Settlement(Settle.COMPLETE, held.claim, "ok")
    pending = Pending(held, Phase.ACK, item, Outcome.DONE, then=None, began=None)
    pending.outcome = outcome
    held.pending = pending
    return pending


@pytest.fixture
def bench() -> Bench:
    """A fresh ledger of three slots, its gate open."""
    return Bench()


def test_reserve_waits_until_claim_at_slots_are_free_then_promises_every_free_one() -> None:
    """claim_at=2: one free slot is not enough; the second frees the claimer, which takes both."""
    bench = Bench(slots=4, claim_at=2)
    held = bench.hold(4)
    thread, outcome = run_in_thread(lambda: bench.ledger.reserve(threading.Event()), "reserve")
    wait_until_parked_inside(thread, "reserve")
    bench.ledger.record(held[0].claim.job, Outcome.DONE, held[0])
    with bench.cond:
        bench.ledger.free_slot()
    assert stays_blocked(thread)
    bench.ledger.record(held[1].claim.job, Outcome.DONE, held[1])
    with bench.cond:
        bench.ledger.free_slot()
    join_or_fail(thread)
    assert outcome == {"result": 2}
    assert bench.ledger.idle == 0


def test_reserve_promises_nothing_once_the_gate_is_closed_or_the_claimer_stopping(
    bench: Bench,
) -> None:
    """Gate closed, or the claimer's stopping event set: 0, and the free slots stay free."""
    stopping = threading.Event()
    stopping.set()
    assert bench.ledger.reserve(stopping) == 0
    bench.open(False)
    assert bench.ledger.reserve(threading.Event()) == 0
    assert bench.ledger.idle == 3


def test_closing_the_gate_ends_a_wait_for_free_slots(bench: Bench) -> None:
    """A claimer waiting for slots gets 0 as soon as accept(False) closes the gate."""
    bench.hold(3)
    thread, outcome = run_in_thread(lambda: bench.ledger.reserve(threading.Event()), "reserve")
    wait_until_parked_inside(thread, "reserve")
    bench.open(False)
    join_or_fail(thread)
    assert outcome == {"result": 0}


def test_hold_give_back_and_free_slot_account_for_every_slot(bench: Bench) -> None:
    """Two claims for three reserved slots: one given back; each job's end frees its slot."""
    held = bench.hold(2)
    bench.accounted()
    assert (bench.ledger.idle, bench.ledger.claimed) == (1, 2)
    assert all(h.state is ClaimState.WAITING for h in held)
    assert all(h.token is None for h in held)  # made on first use (job_token)
    bench.root.cancel("stopping")  # each claim's token is a child of the worker's
    assert all(bench.ledger.job_token(h).reason == "stopping" for h in held)
    for record in held:
        bench.ledger.record(record.claim.job, Outcome.DONE, record)
        with bench.cond:
            bench.ledger.free_slot()
        bench.accounted()
    assert bench.ledger.all_idle()
    assert bench.ledger.idle == bench.ledger.slots


def test_start_moves_a_waiting_claim_to_running_once(bench: Bench) -> None:
    """The gate open: start() returns the record, RUNNING; a second start() refuses."""
    [held] = bench.hold(1)
    job_id = held.claim.job.id
    assert bench.ledger.start(job_id) is held
    assert held.state is ClaimState.RUNNING
    assert bench.ledger.start(job_id) is None
    assert bench.ledger.start(job_id + 100) is None  # not held at all


def test_no_job_starts_once_the_gate_is_closed(bench: Bench) -> None:
    """accept(False): start() returns None and the claim stays WAITING, to be released."""
    [held] = bench.hold(1)
    bench.open(False)
    assert bench.ledger.start(held.claim.job.id) is None
    assert held.state is ClaimState.WAITING


def test_a_lost_claim_never_starts(bench: Bench) -> None:
    """A claim whose lease was lost before its handler began is never started."""
    [held] = bench.hold(1)
    with bench.cond:
        bench.ledger.move(held, ClaimState.LOST)
    assert bench.ledger.start(held.claim.job.id) is None
    assert held.state is ClaimState.LOST


def test_record_and_record_batch_count_each_outcome_once_and_stop_holding_the_claim(
    bench: Bench,
) -> None:
    """One outcome per claim: counted, set on its record, and the claim no longer held."""
    first, second, third = bench.hold(3)
    bench.ledger.record(first.claim.job, Outcome.DONE, first)
    batch = [_pending(second, Outcome.RETRIED), _pending(third, None)]
    bench.ledger.record_batch(batch)
    assert bench.ledger.held == {}
    assert (first.outcome, second.outcome, third.outcome) == (
        Outcome.DONE,
        Outcome.RETRIED,
        Outcome.UNSETTLED,  # a batch item with no outcome was never committed
    )
    assert second.pending is None
    assert third.pending is None
    counted = {o: n for o, n in bench.ledger.counts.items() if n}
    assert counted == {Outcome.DONE: 1, Outcome.RETRIED: 1, Outcome.UNSETTLED: 1}
    assert sum(bench.ledger.counts.values()) == bench.ledger.claimed
    assert bench.ledger.late == {}  # every one recorded while the gate was open


def test_an_outcome_without_its_record_is_counted_and_nothing_held_is_touched(
    bench: Bench,
) -> None:
    """record(job, outcome) alone (a release of a claim not held) only counts."""
    [held] = bench.hold(1)
    [other] = bench.claims(1)
    bench.ledger.record(other.job, Outcome.RELEASED)
    assert bench.ledger.counts[Outcome.RELEASED] == 1
    assert bench.ledger.held == {held.claim.job.id: held}


def test_outcomes_recorded_once_the_gate_is_closed_are_kept_as_late(bench: Bench) -> None:
    """After accept(False), each outcome recorded is also listed in ``late`` by job id."""
    early, late = bench.hold(2)
    bench.ledger.record(early.claim.job, Outcome.DONE, early)
    bench.open(False)
    bench.ledger.record(late.claim.job, Outcome.RELEASED, late)
    assert bench.ledger.late == {late.claim.job.id: Outcome.RELEASED}


def test_unsettled_records_a_claim_a_dying_thread_left_and_stops_holding_it(
    bench: Bench,
) -> None:
    """unsettled(): UNSETTLED, counted once; unsettled_pending() skips one already recorded."""
    first, second = bench.hold(2)
    bench.ledger.unsettled(first)
    assert first.outcome is Outcome.UNSETTLED
    bench.ledger.record(second.claim.job, Outcome.DONE, second)
    bench.ledger.unsettled_pending(_pending(second, Outcome.DONE))
    assert second.outcome is Outcome.DONE
    assert bench.ledger.counts[Outcome.UNSETTLED] == 1
    assert bench.ledger.held == {}


def test_the_views_name_each_claim_by_its_state() -> None:
    """running(), still_held(), settling() and mark_late_running() read the claims' states."""
    bench = Bench(slots=4)
    waiting, running, settling, lost = bench.hold(4)
    with bench.cond:
        for record, moves in [
            (running, [ClaimState.RUNNING]),
            (settling, [ClaimState.RUNNING, ClaimState.SETTLING]),
            (lost, [ClaimState.LOST]),
        ]:
            for state in moves:
                bench.ledger.move(record, state)
        assert bench.ledger.running() == sorted([running.claim.job.id, settling.claim.job.id])
        assert bench.ledger.still_held() == tuple(sorted([waiting.claim.job.id, lost.claim.job.id]))
        assert bench.ledger.settling() == 1
    assert bench.ledger.mark_late_running() == [running]
    assert running.released_at_deadline
    assert bench.ledger.mark_late_running() == []  # each marked once


@pytest.mark.parametrize(
    ("old", "new"),
    list(itertools.product(ClaimState, ClaimState)),
    ids=str,
)
def test_every_claim_move_is_checked_against_claim_moves(old: ClaimState, new: ClaimState) -> None:
    """A move in CLAIM_MOVES is made; any other raises and leaves the state as it was."""
    bench = Bench()
    [claim] = bench.claims(1)
    held = Held(claim, state=old)
    with bench.cond:
        if new in CLAIM_MOVES[old]:
            bench.ledger.move(held, new)
            assert held.state is new
        else:
            with pytest.raises(RuntimeError, match=f"no move from {old} to {new}"):
                bench.ledger.move(held, new)
            assert held.state is old


def test_a_jobs_token_is_made_once_on_first_use_and_a_cancel_before_it_is_kept(
    bench: Bench,
) -> None:
    """No token with the claim; a cancel that comes first is applied as the token is made."""
    first, second = bench.hold(2)
    assert (first.token, second.token) == (None, None)
    with bench.cond:
        assert first.cancel("lease lost") is None  # nothing to cancel yet: the reason is kept
        assert first.cancel("cancelled by operator") is None  # the first reason wins
    token = bench.ledger.job_token(first)
    assert (token.cancelled, token.reason) == (True, "lease lost")
    assert bench.ledger.job_token(first) is token is first.token  # made once
    made = bench.ledger.job_token(second)
    assert not made.cancelled
    with bench.cond:
        assert second.cancel("lease lost") is made  # made already: the caller cancels it
    assert not made.cancelled


def test_a_token_asked_for_while_a_cancel_holds_the_lock_is_made_cancelled(
    bench: Bench,
) -> None:
    """The handler asks for its token while the heartbeat cancels the job: not lost.

    The heartbeat holds the worker's lock; the handler thread, having found no token,
    blocks on that lock inside `job_token`; the cancel finds no token and keeps its
    reason; once the lock is let go, the token is made, and made cancelled.
    """
    [held] = bench.hold(1)
    with bench.cond:
        thread, got = run_in_thread(lambda: bench.ledger.job_token(held), "handler")
        wait_until_blocked_in(thread, "job_token")
        assert stays_blocked(thread)  # on the lock: it has already seen no token
        assert held.cancel("lease lost") is None
    join_or_fail(thread)
    assert got["result"].reason == "lease lost"
