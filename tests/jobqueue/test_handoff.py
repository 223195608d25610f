"""The hand-off queue alone (`HandOff`): its fast paths keep ``ClosableQueue``'s contract.

A claim is handed out once, in order; a handler asleep in ``get`` is woken by a ``put``
(one per put, however many sleep); the shut queue refuses puts, still hands out what it
holds, then raises `ShutDown`; and ``shutdown_and_drain`` takes back exactly what no
``get`` took. Blocking calls run in threads the test watches; nothing sleeps.
"""

from __future__ import annotations

import queue

import pytest

from patterns.closable_queue import ShutDown, shutdown_and_drain
from patterns.jobqueue.stores.memory import MemoryStore
from patterns.jobqueue.stores.records import Claim
from patterns.jobqueue.worker.handlers import HandOff
from tests.support import (
    MUST_HAPPEN,
    FakeClock,
    join_or_fail,
    run_in_thread,
    wait_until_parked_inside,
)


def _claims(n: int) -> list[Claim]:
    store = MemoryStore(clock=FakeClock())
    store.enqueue_many([{"task": "t"}] * n)
    return store.claim("w", lease=1_000.0, limit=n)


def test_claims_come_out_once_and_in_order() -> None:
    """The fast get takes queued claims in order; an empty queue is `queue.Empty` without a wait."""
    handoff = HandOff()
    claims = _claims(3)
    for claim in claims:
        handoff.put(claim)
    assert [handoff.get() for _ in claims] == claims
    with pytest.raises(queue.Empty):
        handoff.get(block=False)
    with pytest.raises(queue.Empty):
        handoff.get(timeout=0)


def test_a_put_wakes_each_handler_asleep_in_get() -> None:
    """Two handlers asleep, two puts: each is woken with its own claim (no wake-up lost)."""
    handoff = HandOff()
    claims = _claims(2)
    runs = [run_in_thread(handoff.get, f"handler-{i}") for i in range(2)]
    for thread, _ in runs:
        wait_until_parked_inside(thread, "get")
    for claim in claims:
        handoff.put(claim)
    for thread, _ in runs:
        join_or_fail(thread, MUST_HAPPEN)
    assert sorted(out["result"].job.id for _, out in runs) == sorted(c.job.id for c in claims)


def test_the_shut_queue_refuses_puts_hands_out_what_it_holds_then_raises() -> None:
    """Shut: a put raises `ShutDown`, a queued claim is still handed out, then get raises."""
    handoff = HandOff()
    first, second = _claims(2)
    handoff.put(first)
    handoff.shutdown()
    with pytest.raises(ShutDown):
        handoff.put(second)
    assert handoff.get() is first
    with pytest.raises(ShutDown):
        handoff.get()


def test_a_shutdown_wakes_a_handler_asleep_in_get() -> None:
    """A handler asleep in get is woken by the shutdown and raises `ShutDown` (its loop ends)."""
    handoff = HandOff()
    thread, out = run_in_thread(handoff.get, "handler")
    wait_until_parked_inside(thread, "get")
    handoff.shutdown()
    join_or_fail(thread, MUST_HAPPEN)
    assert isinstance(out.get("error"), ShutDown)


def test_drain_takes_back_exactly_what_no_get_took() -> None:
    """``shutdown_and_drain`` (what request_stop uses) takes back the claims not handed out."""
    handoff = HandOff()
    claims = _claims(3)
    for claim in claims:
        handoff.put(claim)
    assert handoff.get() is claims[0]
    assert shutdown_and_drain(handoff) == claims[1:]
    # Every put counted a task, as the base's does: the drain's task_done() calls (one per
    # claim taken back) leave the one claim a handler took, and never go below zero.
    assert handoff.unfinished_tasks == 1
