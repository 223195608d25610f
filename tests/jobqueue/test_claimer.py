"""The claimer alone: its claim loop on a memory store, a real ledger and hand-off, no `Worker`.

`Bench` wires a `Claimer` to a `ScriptedStore` (whose next claims can raise), a real
`ClaimLedger` and `ClosableQueue`, and recording callbacks. The claimer's thread is
driven by checkpoints only: its idle or backoff wait is a `Wake` that tells the test
each wait's timeout and ends when the test sets it; claims are read from the hand-off
with a bounded ``get``. Nothing sleeps; every wait is bounded by ``MUST_HAPPEN``.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from patterns.cancellation import CancelToken
from patterns.closable_queue import ClosableQueue
from patterns.jobqueue.stores.records import Claim, Job
from patterns.jobqueue.tasks import Phase
from patterns.jobqueue.worker import claimer as claimer_module
from patterns.jobqueue.worker.claimer import MAX_BACKOFF, Claimer
from patterns.jobqueue.worker.ledger import ClaimLedger
from patterns.jobqueue.worker.outcomes import Outcome
from tests.jobqueue.fakes import ScriptedStore
from tests.support import MUST_HAPPEN, FakeClock, wait_until_parked_inside

LEASE = 1_000.0  # fake seconds: no lease lapses unless the test moves the clock
POLL = 10.0  # the idle wait, in real seconds; the test ends each wait long before (`Wake`)
EMPTY = "no job is due or running anywhere (exit when empty)"


class Wake(threading.Event):
    """The claimer's wake-up event; each wait's timeout goes to ``waits`` as it begins."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: queue.Queue[float | None] = queue.Queue()

    def wait(self, timeout: float | None = None) -> bool:
        """Announce the wait, then wait as `threading.Event.wait` does."""
        self.waits.put(timeout)
        return super().wait(timeout)

    def next_wait(self) -> float | None:
        """The timeout of the claimer's next wait, once it has begun."""
        try:
            return self.waits.get(timeout=MUST_HAPPEN)
        except queue.Empty:
            raise AssertionError("the claimer never began another wait") from None


class Dying(BaseException):
    """What kills the claiming thread in a test (not an `Exception`: nothing catches it)."""


class Bench:
    """A claimer wired to a real ledger and hand-off, and to recording callbacks."""

    def __init__(
        self,
        *,
        slots: int = 2,
        claim_at: int = 1,
        poll_interval: float = POLL,
        outage_limit: float = math.inf,
        exit_when_empty: bool = False,
    ) -> None:
        self.clock = FakeClock()
        self.store = ScriptedStore(self.clock)
        self.cond = threading.Condition(threading.RLock())
        self.ledger = ClaimLedger(self.cond, root=CancelToken(), slots=slots, claim_at=claim_at)
        self.handoff: ClosableQueue[Claim] = ClosableQueue()
        self.wake = Wake()
        self.released: list[int] = []
        self.stops: list[str] = []
        self.gave_up: list[str] = []
        self.errors: list[tuple[Phase, Job | None, BaseException]] = []
        self.deaths: list[BaseException] = []
        self.after_claim: list[int] = []
        self.fail_after_claim: dict[int, BaseException] = {}  # job id -> raised by the hook
        self.shut_after_claim: int | None = None  # job id whose hook closes the hand-off
        self.claimer = Claimer(
            self.store,
            self.ledger,
            self.handoff,
            owner="w1",
            lease=LEASE,
            poll_interval=poll_interval,
            outage_limit=outage_limit,
            exit_when_empty=exit_when_empty,
            clock=self.clock,
            wake=self.wake,
            release_unstarted=lambda claim: self.released.append(claim.job.id),
            request_stop=self.stops.append,
            give_up=self.gave_up.append,
            error=lambda phase, job, exc: self.errors.append((phase, job, exc)),
            died=self.deaths.append,
            after_claim=self._after_claim,
            track=lambda target: target,
            stop_timeout=MUST_HAPPEN,
        )

    def _after_claim(self, claim: Claim) -> None:
        self.after_claim.append(claim.job.id)
        if claim.job.id == self.shut_after_claim:
            self.handoff.shutdown()
        if claim.job.id in self.fail_after_claim:
            raise self.fail_after_claim[claim.job.id]

    def enqueue(self, n: int) -> list[int]:
        """Enqueue ``n`` due jobs; their ids."""
        return [self.store.enqueue("work") for _ in range(n)]

    def open(self) -> None:
        """Open the ledger's gate, as the worker does when it becomes RUNNING."""
        with self.cond:
            self.ledger.accept(True)

    def start(self) -> None:
        """Open the gate and start the claiming thread."""
        self.open()
        self.claimer.start()

    def thread(self) -> threading.Thread:
        """The claiming thread (started)."""
        name = self.claimer.thread_name
        return next(t for t in threading.enumerate() if t.name == name)

    def take(self, n: int) -> list[int]:
        """The ids of the next ``n`` claims on the hand-off, in the order handed over."""
        try:
            return [self.handoff.get(timeout=MUST_HAPPEN).job.id for _ in range(n)]
        except queue.Empty:
            raise AssertionError(f"fewer than {n} claims were handed over") from None

    def finish(self, job_id: int) -> None:
        """What a handler does with a claim: its outcome recorded, its slot free."""
        held = self.ledger.held[job_id]
        self.ledger.record(held.claim.job, Outcome.DONE, held)
        with self.cond:
            self.ledger.free_slot()

    def ended(self) -> bool:
        """Wait (bounded) for the claim loop to end."""
        return self.claimer.loop_ended.wait(MUST_HAPPEN)


@pytest.fixture
def make() -> Iterator[Callable[..., Bench]]:
    """Builds benches; each one's gate is closed and its thread stopped within the budget."""
    benches: list[Bench] = []

    def build(**options: Any) -> Bench:
        bench = Bench(**options)
        benches.append(bench)
        return bench

    yield build
    for bench in benches:
        with bench.cond:
            bench.ledger.accept(False)
        bench.wake.set()
        assert bench.claimer.stop(MUST_HAPPEN).terminated


def test_it_claims_exactly_the_free_slots_and_hands_each_claim_over_in_order(
    make: Callable[..., Bench],
) -> None:
    """Each claim asks for the free slots only; unfilled ones are given back, none lost."""
    bench = make(slots=3)
    ids = bench.enqueue(5)
    bench.start()
    assert bench.take(3) == ids[:3]
    bench.finish(ids[0])
    assert bench.take(1) == [ids[3]]
    with bench.cond:  # two slots freed in one hold: the next claim asks for both
        bench.finish(ids[1])
        bench.finish(ids[2])
    assert bench.take(1) == [ids[4]]
    assert bench.wake.next_wait() == POLL  # nothing left to claim: the idle wait
    # 3, then 1, then 2 (one filled, one given back), then 1 that found nothing.
    assert bench.store.limits == [3, 1, 2, 1]
    with bench.cond:
        assert (bench.ledger.idle, sorted(bench.ledger.held)) == (1, ids[3:])
        assert bench.ledger.claimed == 5
    assert bench.after_claim == ids
    assert (bench.released, bench.errors, bench.stops) == ([], [], [])


def test_a_failing_claim_backs_off_doubling_up_to_30_s_and_reports_each_error(
    make: Callable[..., Bench],
) -> None:
    """Five failed claims wait 10, 20, 30, 30, 30 s (each reported); a good one resets it."""
    bench = make()
    errors = [RuntimeError(f"store down ({n}, injected)") for n in range(5)]
    bench.store.raises["claim"] = list(errors)
    bench.start()
    waits = []
    for _ in errors:
        waits.append(bench.wake.next_wait())
        bench.wake.set()  # end the backoff now: the test is the clock
    assert waits == [POLL, 2 * POLL, MAX_BACKOFF, MAX_BACKOFF, MAX_BACKOFF]
    assert bench.wake.next_wait() == POLL  # claimed fine (nothing due): the idle wait again
    assert [(phase, job) for phase, job, _ in bench.errors] == [(Phase.DEQUEUE, None)] * 5
    assert [exc for _, _, exc in bench.errors] == errors
    with bench.cond:
        assert bench.ledger.idle == 2  # a failed claim took no slot
    assert (bench.gave_up, bench.stops, bench.deaths) == ([], [], [])


def test_next_wait_doubles_from_the_poll_interval_and_never_overflows(
    make: Callable[..., Bench],
) -> None:
    """The backoff after n failures is poll_interval * 2 ** (n - 1), capped at 30 s."""
    bench = make(poll_interval=0.5)
    assert [bench.claimer.next_wait(n) for n in range(1, 9)] == [
        0.5,
        1.0,
        2.0,
        4.0,
        8.0,
        16.0,
        MAX_BACKOFF,
        MAX_BACKOFF,
    ]
    assert bench.claimer.next_wait(100_000) == MAX_BACKOFF  # 2.0 ** 100_000 would overflow


def test_after_outage_limit_seconds_of_failures_it_gives_up_naming_the_limit_and_the_error(
    make: Callable[..., Bench], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Failures for 59 s go on; at 60 s give_up gets the reason, the slots are free, it ends."""
    monotonic = FakeClock(0.0)  # the outage is timed on the claimer's monotonic clock
    monkeypatch.setattr(claimer_module, "time", SimpleNamespace(monotonic=monotonic))
    bench = make(outage_limit=60.0)
    bench.store.raises["claim"] = [
        RuntimeError("store down (injected)"),
        RuntimeError("store down (injected)"),
        ConnectionRefusedError("connection refused (injected)"),
    ]
    bench.start()
    assert bench.wake.next_wait() == POLL
    monotonic.advance(59.0)
    bench.wake.set()
    assert bench.wake.next_wait() == 2 * POLL  # 59 s of failures: under the limit
    assert bench.gave_up == []
    monotonic.advance(1.0)
    bench.wake.set()
    assert bench.ended()
    reason = (
        "the store failed every claim for 60.0 s (3 claims; store_outage_limit 60 s): "
        "ConnectionRefusedError: connection refused (injected)"
    )
    assert bench.gave_up == [reason]
    assert len(bench.errors) == 3
    with bench.cond:
        assert bench.ledger.idle == bench.ledger.slots
    assert (bench.stops, bench.deaths) == ([], [])


@pytest.mark.parametrize("delay", [None, 100.0], ids=["empty", "only-a-job-due-later"])
def test_exit_when_empty_stops_at_once_when_nothing_is_due_or_running(
    make: Callable[..., Bench], delay: float | None
) -> None:
    """An empty queue (or one whose only job is due later): a stop is requested, no wait."""
    bench = make(exit_when_empty=True)
    if delay is not None:
        bench.store.enqueue("work", delay=delay)
    bench.start()
    assert bench.ended()
    assert bench.stops == [EMPTY]
    assert bench.wake.waits.empty()
    with bench.cond:
        assert bench.ledger.idle == bench.ledger.slots


def test_exit_when_empty_waits_while_another_worker_runs_a_job(
    make: Callable[..., Bench],
) -> None:
    """A job running anywhere keeps it polling; once it is done, the stop is requested."""
    bench = make(exit_when_empty=True)
    bench.enqueue(1)
    [other] = bench.store.claim("w2", lease=LEASE, limit=1)
    bench.start()
    assert bench.wake.next_wait() == POLL
    assert bench.stops == []
    assert bench.store.complete(other, "ok")
    bench.wake.set()
    assert bench.ended()
    assert bench.stops == [EMPTY]


def test_exit_when_empty_waits_while_this_worker_still_holds_a_claim(
    make: Callable[..., Bench],
) -> None:
    """Its job committed but not yet recorded: no stop; once recorded, the stop is requested."""
    bench = make(exit_when_empty=True, slots=2)
    [job_id] = bench.enqueue(1)
    bench.open()
    reserved = bench.ledger.reserve(threading.Event())
    [claim] = bench.store.claim("w1", lease=LEASE, limit=1)
    with bench.cond:
        bench.ledger.hold([claim], reserved)
    assert bench.store.complete(claim, "ok")  # the store has nothing due or running now
    bench.claimer.start()
    assert bench.wake.next_wait() == POLL
    assert bench.stops == []
    bench.finish(job_id)
    bench.wake.set()
    assert bench.ended()
    assert bench.stops == [EMPTY]


def test_claims_not_handed_over_once_the_hand_off_is_shut_down_are_released(
    make: Callable[..., Bench],
) -> None:
    """The hand-off closes after the first claim: the other two are released, none dropped."""
    bench = make(slots=3)
    ids = bench.enqueue(3)
    bench.shut_after_claim = ids[1]  # closed while the second claim is on its way
    bench.start()
    assert bench.ended()
    assert bench.take(1) == ids[:1]
    assert bench.released == ids[1:]
    assert bench.store.limits == [3]  # and no claim after it
    assert (bench.deaths, bench.stops) == ([], [])


def test_an_after_claim_hook_that_kills_the_thread_releases_the_rest_and_reports_the_death(
    make: Callable[..., Bench],
) -> None:
    """The hook raises on the second claim: the first was handed over, the rest released."""
    bench = make(slots=3)
    ids = bench.enqueue(3)
    death = Dying("the claiming thread dies here (injected)")
    bench.fail_after_claim[ids[1]] = death
    bench.start()
    assert bench.ended()
    assert bench.take(1) == ids[:1]
    assert bench.released == ids[1:]
    assert bench.after_claim == ids[:2]
    assert bench.deaths == [death]


def test_closing_the_ledgers_gate_ends_the_wait_for_free_slots(
    make: Callable[..., Bench],
) -> None:
    """Every slot held, the claimer waits in reserve; accept(False) alone ends its loop."""
    bench = make(slots=2)
    ids = bench.enqueue(3)
    bench.start()
    assert bench.take(2) == ids[:2]
    wait_until_parked_inside(bench.thread(), "reserve")
    with bench.cond:
        bench.ledger.accept(False)
    assert bench.ended()
    assert bench.store.limits == [2]  # the third job was never claimed
    assert bench.released == []


def test_closing_the_gate_and_waking_ends_the_idle_wait(make: Callable[..., Bench]) -> None:
    """In the idle wait: the gate closed and the wake set (as request_stop does) end the loop."""
    bench = make()
    bench.start()
    assert bench.wake.next_wait() == POLL
    with bench.cond:
        bench.ledger.accept(False)
    bench.wake.set()
    assert bench.ended()
    assert bench.store.limits == [2]
    assert bench.stops == []


def test_hand_over_holds_the_settlers_refill_and_frees_the_slots_no_claim_filled(
    make: Callable[..., Bench],
) -> None:
    """The settler's refill (no stopping event): both claims held and handed over, 1 slot freed."""
    bench = make(slots=3)
    ids = bench.enqueue(2)
    bench.open()
    reserved = bench.ledger.reserve(threading.Event())  # what the settler reserved
    claims = bench.store.claim("w1", lease=LEASE, limit=reserved)
    assert bench.claimer.hand_over(claims, reserved)
    assert bench.take(2) == ids
    with bench.cond:
        assert (bench.ledger.idle, sorted(bench.ledger.held)) == (1, ids)
        assert bench.ledger.claimed == 2
    assert bench.after_claim == ids
    assert bench.released == []


def test_hand_over_once_the_claimers_own_stop_began_releases_every_claim(
    make: Callable[..., Bench],
) -> None:
    """Its stopping event set: nothing is handed over, every claim is released at once."""
    bench = make(slots=2)
    ids = bench.enqueue(2)
    bench.open()
    reserved = bench.ledger.reserve(threading.Event())
    claims = bench.store.claim("w1", lease=LEASE, limit=reserved)
    stopping = threading.Event()
    stopping.set()
    assert not bench.claimer.hand_over(claims, reserved, stopping)
    assert bench.released == ids
    assert bench.handoff.empty()
