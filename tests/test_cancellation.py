"""Cooperative cancellation: the token's contract, then each pitfall forced and its fix."""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import queue
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from patterns.cancellation import (
    Cancelled,
    CancelToken,
    crunch,
    receive,
    take,
)
from patterns.naive.cancellation import async_raise, naive_crunch, naive_receive
from tests.support import (
    MUST_HAPPEN,
    Gate,
    elapsed,
    join_or_fail,
    run_in_thread,
    stays_blocked,
    wait_until_blocked_in,
)

# A deadline short enough to keep the suite fast; tests that use it wait for it to pass
# through the token itself (wait/sleep), never with time.sleep.
SHORT = 0.05

# "Promptly": far below the length of the sleep or block being cut short, far above
# scheduling noise on a loaded machine.
PROMPTLY = 2.0


class ForcedStop(Exception):
    """What the C3 tests force into a thread with async_raise."""


class Stepper:
    """A ``step`` for crunch that records each item and parks at a gate on chosen items."""

    def __init__(self, gates: dict[int, Gate] | None = None) -> None:
        self.gates = gates or {}
        self.done: list[int] = []

    def __call__(self, item: int) -> None:
        """Process one item: park at its gate if it has one, then record it."""
        gate = self.gates.get(item)
        if gate is not None:
            gate.arrive()
        self.done.append(item)

    def open_all(self) -> None:
        """Release every gate, so no task is left parked if an assertion failed."""
        for gate in self.gates.values():
            gate.open()


@pytest.fixture
def socket_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected pair of real sockets, closed after the test."""
    a, b = socket.socketpair()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


# --- the token's contract -----------------------------------------------------------------


def test_a_new_token_is_active_with_no_reason_and_no_deadline() -> None:
    """A fresh token without a timeout is not cancelled and reports no reason or deadline."""
    token = CancelToken()
    assert not token.cancelled
    assert token.reason is None
    assert token.deadline is None
    assert token.remaining() is None
    token.check()  # does not raise


def test_cancel_returns_true_only_for_the_call_that_cancelled() -> None:
    """cancel() is idempotent: the first call returns True, every later call False."""
    token = CancelToken()
    assert token.cancel() is True
    assert token.cancel() is False
    assert token.cancel("again") is False
    assert token.cancelled


def test_the_first_reason_wins() -> None:
    """A later cancel() never overwrites the reason of the first one."""
    token = CancelToken()
    token.cancel("shutting down")
    token.cancel("forced")
    assert token.reason == "shutting down"


def test_concurrent_cancels_elect_exactly_one_winner() -> None:
    """When many threads cancel at once, exactly one gets True and its reason is kept."""
    token = CancelToken()
    parties = 8
    barrier = threading.Barrier(parties)
    results: dict[str, bool] = {}

    def cancel_as(name: str) -> None:
        barrier.wait(MUST_HAPPEN)
        results[name] = token.cancel(name)

    threads = [threading.Thread(target=cancel_as, args=(f"t{i}",)) for i in range(parties)]
    for thread in threads:
        thread.start()
    for thread in threads:
        join_or_fail(thread)

    winners = [name for name, won in results.items() if won]
    assert len(results) == parties
    assert len(winners) == 1
    assert token.reason == winners[0]


def test_cancelled_is_a_base_exception_that_except_exception_does_not_catch() -> None:
    """A task's ``except Exception:`` cannot swallow Cancelled; it carries the reason."""
    token = CancelToken()
    token.cancel("stop")
    outcome = ""
    try:
        try:
            token.check()
        except Exception:
            outcome = "swallowed by except Exception"
    except Cancelled as exc:
        outcome = f"reached the task boundary: {exc.reason}"
    assert outcome == "reached the task boundary: stop"
    assert issubclass(Cancelled, BaseException)
    assert not issubclass(Cancelled, Exception)


def test_check_raises_cancelled_with_the_reason_only_after_cancel() -> None:
    """check() is silent while the token is active and raises Cancelled(reason) after."""
    token = CancelToken()
    token.check()
    token.cancel("user pressed stop")
    with pytest.raises(Cancelled, match="user pressed stop"):
        token.check()
    with pytest.raises(Cancelled):  # a token stays cancelled: every checkpoint raises
        token.check()


def test_the_deadline_is_timeout_seconds_after_creation_on_the_monotonic_clock() -> None:
    """CancelToken(timeout=t) has deadline monotonic()+t, taken when it is created."""
    before = time.monotonic()
    token = CancelToken(timeout=30.0)
    after = time.monotonic()
    assert token.deadline is not None
    assert before + 30.0 <= token.deadline <= after + 30.0
    remaining = token.remaining()
    assert remaining is not None
    assert 0.0 < remaining <= 30.0
    assert not token.cancelled


def test_a_passed_deadline_cancels_the_token_with_reason_deadline_exceeded() -> None:
    """Once its deadline has passed, the token is cancelled for good, reason "deadline exceeded"."""
    token = CancelToken(timeout=0)
    assert token.cancelled
    assert token.reason == "deadline exceeded"
    assert token.remaining() == 0.0
    assert token.cancel("too late") is False
    with pytest.raises(Cancelled, match="deadline exceeded"):
        token.check()


def test_remaining_is_zero_once_cancelled_even_before_the_deadline() -> None:
    """remaining() answers "how long may I still block": nothing, once cancelled."""
    token = CancelToken(timeout=30.0)
    token.cancel()
    assert token.remaining() == 0.0
    assert token.reason == "cancelled"


def test_wait_returns_false_when_its_own_timeout_runs_out_first() -> None:
    """wait(timeout) on an active token returns False after the timeout, without cancelling."""
    token = CancelToken(timeout=30.0)
    assert token.wait(0.01) is False
    assert token.wait(0) is False
    assert not token.cancelled


def test_wait_returns_true_when_another_thread_cancels() -> None:
    """A thread blocked in wait() with no timeout wakes with True when the token is cancelled."""
    token = CancelToken()
    thread, outcome = run_in_thread(token.wait, "waiter")
    wait_until_blocked_in(thread, "wait")
    token.cancel()
    join_or_fail(thread)
    assert outcome == {"result": True}


def test_wait_without_a_timeout_returns_at_the_deadline() -> None:
    """With no timeout of its own, wait() ends at the token's deadline, which cancels the token."""
    token = CancelToken(timeout=SHORT)
    thread, outcome = run_in_thread(token.wait, "waiter")
    join_or_fail(thread)
    assert outcome == {"result": True}
    assert token.reason == "deadline exceeded"


def test_sleep_returns_normally_when_the_token_stays_active() -> None:
    """sleep() on an active token is a plain sleep: it returns and cancels nothing."""
    token = CancelToken()
    with elapsed() as took:
        token.sleep(0.01)
    assert took() >= 0.01
    assert not token.cancelled


def test_sleep_raises_cancelled_promptly_when_another_thread_cancels() -> None:
    """A thread in sleep(60) raises Cancelled(reason) as soon as the token is cancelled."""
    token = CancelToken()
    thread, outcome = run_in_thread(lambda: token.sleep(60), "sleeper")
    wait_until_blocked_in(thread, "sleep")
    token.cancel("shutdown")
    join_or_fail(thread, PROMPTLY)  # ends at its current poll slice (0.05 s)
    assert isinstance(outcome.get("error"), Cancelled)
    assert outcome["error"].reason == "shutdown"


def test_sleep_raises_when_the_deadline_passes_during_the_sleep() -> None:
    """sleep(30) on a token with a short deadline raises Cancelled at the deadline."""
    token = CancelToken(timeout=SHORT)
    with elapsed() as took, pytest.raises(Cancelled, match="deadline exceeded"):
        token.sleep(30)
    assert took() < PROMPTLY


def test_sleep_on_a_cancelled_token_raises_at_once_even_for_zero_seconds() -> None:
    """sleep(0) is a checkpoint: on a cancelled token it raises instead of returning."""
    token = CancelToken()
    token.cancel()
    with pytest.raises(Cancelled):
        token.sleep(0)


def test_sleep_rejects_a_negative_length() -> None:
    """sleep() refuses a negative length, as time.sleep does."""
    with pytest.raises(ValueError, match=r"^seconds must be a number of seconds >= 0, not -1"):
        CancelToken().sleep(-1)


def test_on_cancel_runs_the_callback_once_when_the_token_is_cancelled() -> None:
    """A registered callback runs exactly once, however many times cancel() is called."""
    token = CancelToken()
    calls: list[str] = []
    token.on_cancel(lambda: calls.append("ran"))
    assert calls == []
    token.cancel()
    token.cancel()
    assert calls == ["ran"]


def test_callbacks_run_in_registration_order_in_the_cancelling_thread() -> None:
    """cancel() runs the callbacks itself, in order, before it returns."""
    token = CancelToken()
    seen: list[tuple[int, str]] = []
    for i in range(3):
        token.on_cancel(lambda i=i: seen.append((i, threading.current_thread().name)))

    thread, outcome = run_in_thread(token.cancel, "canceller")
    join_or_fail(thread)

    assert outcome == {"result": True}
    assert seen == [(0, "canceller"), (1, "canceller"), (2, "canceller")]


def test_on_cancel_on_a_cancelled_token_runs_the_callback_immediately() -> None:
    """Registering on a cancelled token runs the callback at once; there is nothing to remove."""
    token = CancelToken()
    token.cancel()
    calls: list[str] = []
    registration = token.on_cancel(lambda: calls.append("ran"))
    assert calls == ["ran"]
    assert registration.remove() is False


def test_a_removed_callback_never_runs() -> None:
    """remove(), or leaving the registration's with block, unregisters the callback for good."""
    token = CancelToken()
    calls: list[str] = []
    registration = token.on_cancel(lambda: calls.append("removed"))
    with token.on_cancel(lambda: calls.append("scoped")):
        pass
    assert registration.remove() is True
    assert registration.remove() is False

    token.cancel()

    assert calls == []


def test_remove_after_the_callback_ran_reports_false() -> None:
    """remove() tells the caller the callback already ran."""
    token = CancelToken()
    registration = token.on_cancel(lambda: None)
    token.cancel()
    assert registration.remove() is False


def test_a_failing_callback_is_logged_and_neither_stops_the_others_nor_reaches_cancel(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A callback's exception is logged at ERROR with its traceback; cancel() and the rest go on."""
    token = CancelToken()
    calls: list[str] = []

    def broken() -> None:
        raise RuntimeError("socket already gone")

    token.on_cancel(broken)
    token.on_cancel(lambda: calls.append("second"))

    with caplog.at_level(logging.ERROR, logger="patterns.cancellation"):
        assert token.cancel() is True

    assert calls == ["second"]
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], RuntimeError)
    assert "socket already gone" in caplog.text


def test_a_passed_deadline_runs_the_callbacks_when_it_is_observed() -> None:
    """No timer thread: a passed deadline runs the callbacks when a wait observes it."""
    token = CancelToken(timeout=SHORT)
    ran_in: list[str] = []
    token.on_cancel(lambda: ran_in.append(threading.current_thread().name))
    thread, outcome = run_in_thread(token.wait, "observer")
    join_or_fail(thread)
    assert outcome == {"result": True}
    # Usually the observer ran them; if the deadline had already passed at registration,
    # on_cancel ran the callback at once in the test's own thread. Either way: once.
    assert len(ran_in) == 1


def test_a_child_is_cancelled_with_its_parents_reason() -> None:
    """Cancelling a parent cancels its live children with the same reason."""
    parent = CancelToken()
    child = parent.child()
    grandchild = child.child()
    assert not child.cancelled
    parent.cancel("worker stopping")
    assert child.reason == "worker stopping"
    assert grandchild.reason == "worker stopping"


def test_cancelling_a_child_leaves_the_parent_active() -> None:
    """Cancellation flows from parent to child only."""
    parent = CancelToken()
    child = parent.child()
    child.cancel("job done")
    assert not parent.cancelled
    assert parent.child().cancelled is False


def test_a_child_of_a_cancelled_parent_starts_cancelled() -> None:
    """A child made after the parent was cancelled is born cancelled, with the parent's reason."""
    parent = CancelToken()
    parent.cancel("too late")
    assert parent.child().reason == "too late"


def test_a_child_deadline_is_the_earlier_of_its_own_and_its_parents() -> None:
    """A child can shorten its parent's deadline but never extend it."""
    parent = CancelToken(timeout=10.0)
    assert parent.child().deadline == parent.deadline
    assert parent.child(timeout=60.0).deadline == parent.deadline
    shorter = parent.child(timeout=1.0).deadline
    assert shorter is not None
    assert parent.deadline is not None
    assert shorter < parent.deadline
    assert CancelToken().child(timeout=1.0).deadline is not None


def test_a_thread_waiting_on_a_child_wakes_when_the_parent_is_cancelled() -> None:
    """A job blocked on its per-job token is woken by cancelling the worker's token."""
    worker_token = CancelToken()
    job_token = worker_token.child()
    thread, outcome = run_in_thread(lambda: job_token.sleep(60), "job")
    wait_until_blocked_in(thread, "sleep")
    worker_token.cancel("shutdown")
    join_or_fail(thread, PROMPTLY)
    assert isinstance(outcome.get("error"), Cancelled)
    assert outcome["error"].reason == "shutdown"


def test_a_parent_does_not_keep_its_children_alive() -> None:
    """A parent holds children weakly, so per-job tokens of a long-lived worker are freed."""
    parent = CancelToken()
    child_ref = weakref.ref(parent.child())
    gc.collect()
    assert child_ref() is None
    parent.cancel()  # a forgotten child is simply skipped


# --- where Cancelled goes at the task boundary ---------------------------------------------


def test_a_thread_pool_stores_cancelled_in_the_future() -> None:
    """A pool task that raises Cancelled leaves the pool healthy; its future holds the exception."""
    token = CancelToken()
    token.cancel("stop")
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(token.check)
    assert isinstance(future.exception(MUST_HAPPEN), Cancelled)
    with pytest.raises(Cancelled, match="stop"):
        future.result()


def test_a_plain_thread_reports_an_escaping_cancelled_through_threading_excepthook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Cancelled that escapes a Thread's target reaches threading.excepthook like any exception."""
    seen: list[type[BaseException]] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_type))
    token = CancelToken()
    token.cancel()
    thread = threading.Thread(target=token.check, name="uncaught")
    thread.start()
    join_or_fail(thread)
    assert seen == [Cancelled]


# --- crunch and receive on their own -------------------------------------------------------


def test_crunch_processes_every_item_in_order_when_not_cancelled() -> None:
    """Without a cancel, crunch is a plain loop over the items and counts them."""
    step = Stepper()
    assert crunch(range(5), step, CancelToken()) == 5
    assert step.done == [0, 1, 2, 3, 4]


def test_crunch_on_a_cancelled_token_runs_no_step() -> None:
    """The first checkpoint comes before the first item."""
    token = CancelToken()
    token.cancel()
    step = Stepper()
    with pytest.raises(Cancelled):
        crunch(range(5), step, token)
    assert step.done == []


def test_receive_returns_the_bytes_that_arrive(
    socket_pair: tuple[socket.socket, socket.socket],
) -> None:
    """While the token is active, receive is recv and leaves the socket as it found it."""
    a, b = socket_pair
    b.sendall(b"hello")
    assert receive(a, CancelToken()) == b"hello"
    assert a.gettimeout() is None
    b.sendall(b"again")
    assert a.recv(16) == b"again"  # still open in both directions


def test_receive_on_a_cancelled_token_raises_without_blocking_and_shuts_the_socket_down(
    socket_pair: tuple[socket.socket, socket.socket],
) -> None:
    """A receive that starts after the cancel raises at once, and the peer sees the end."""
    a, b = socket_pair
    token = CancelToken()
    token.cancel("closing")
    with pytest.raises(Cancelled, match="closing"):
        receive(a, token)
    b.settimeout(MUST_HAPPEN)
    assert b.recv(16) == b""


def test_receive_raises_cancelled_when_the_deadline_passes(
    socket_pair: tuple[socket.socket, socket.socket],
) -> None:
    """The token's deadline bounds the recv, and the socket's own timeout is restored after."""
    a, _ = socket_pair
    a.settimeout(30.0)
    token = CancelToken(timeout=SHORT)
    with elapsed() as took, pytest.raises(Cancelled, match="deadline exceeded"):
        receive(a, token)
    assert took() < PROMPTLY
    assert a.gettimeout() == 30.0


# --- a queue: take() instead of a pill from a callback -------------------------------------


def test_take_returns_an_item_that_is_already_there() -> None:
    """With an item waiting, take is a plain get."""
    q: queue.Queue[str] = queue.Queue()
    q.put("job")
    assert take(q, CancelToken()) == "job"


def test_take_returns_an_item_put_while_it_waits() -> None:
    """An item put by another thread while take waits is returned, across poll slices."""
    q: queue.Queue[str] = queue.Queue()
    thread, outcome = run_in_thread(lambda: take(q, CancelToken(), poll_interval=0.01), "taker")
    wait_until_blocked_in(thread, "take")
    q.put("job")
    join_or_fail(thread)
    assert outcome == {"result": "job"}


def test_take_raises_cancelled_promptly_when_cancelled_while_waiting() -> None:
    """A cancel is seen at the end of the current poll slice, far sooner than PROMPTLY."""
    q: queue.Queue[str] = queue.Queue()
    token = CancelToken()
    thread, outcome = run_in_thread(lambda: take(q, token), "taker")
    wait_until_blocked_in(thread, "take")
    token.cancel("shutdown")
    join_or_fail(thread, PROMPTLY)  # ends at its current poll slice (0.05 s)
    assert isinstance(outcome.get("error"), Cancelled)
    assert outcome["error"].reason == "shutdown"
    assert q.empty()  # nothing was put to wake it


def test_take_raises_cancelled_when_the_deadline_passes() -> None:
    """The token's deadline bounds the wait, even with a poll interval longer than it."""
    q: queue.Queue[str] = queue.Queue()
    with elapsed() as took, pytest.raises(Cancelled, match="deadline exceeded"):
        take(q, CancelToken(timeout=SHORT), poll_interval=60)
    assert took() < PROMPTLY


def test_take_rejects_a_poll_interval_that_is_not_positive() -> None:
    """A zero interval would spin; it is refused."""
    with pytest.raises(ValueError, match="positive"):
        take(queue.Queue(), CancelToken(), poll_interval=0)


def test_a_blocking_put_in_an_on_cancel_callback_hangs_cancel_on_a_full_queue() -> None:
    """Why take() polls: a sentinel put from a callback blocks cancel() while the queue is full."""
    q: queue.Queue[str] = queue.Queue(maxsize=1)
    q.put("backlog")  # full: the consumers are busy or gone
    token = CancelToken()
    token.on_cancel(lambda: q.put("STOP"))  # the tempting way to wake a consumer in get()
    canceller, outcome = run_in_thread(lambda: token.cancel("shutdown"), "canceller")
    try:
        wait_until_blocked_in(canceller, "put")
        assert stays_blocked(canceller)  # cancel() cannot return: its callback is stuck
        assert token.cancelled  # the flag is set, yet the caller of cancel() is held
    finally:
        assert q.get_nowait() == "backlog"  # the release: make room for the sentinel
    join_or_fail(canceller)
    assert outcome == {"result": True}
    assert q.get_nowait() == "STOP"


def test_on_cancel_can_shut_down_a_queue_only_where_queue_has_shutdown() -> None:
    """On 3.13+ a callback can call Queue.shutdown, which never blocks; 3.11 and 3.12 lack it."""
    q: queue.Queue[str] = queue.Queue(maxsize=1)
    if sys.version_info < (3, 13):
        # Checked on 3.11.7 and 3.12.1: there is nothing to close, so take() polls.
        assert not hasattr(q, "shutdown")
        assert not hasattr(queue, "ShutDown")
        return
    q.put("backlog")
    q.shutdown(immediate=True)  # on a full queue, where a put would block, it returns at once
    q = queue.Queue()
    token = CancelToken()
    thread, outcome = run_in_thread(q.get, "consumer")
    with token.on_cancel(lambda: q.shutdown(immediate=True)):
        wait_until_blocked_in(thread, "get")
        assert token.cancel("shutdown")
        join_or_fail(thread, PROMPTLY)
    assert isinstance(outcome.get("error"), queue.ShutDown)


# --- C1: a CPU loop without checkpoints cannot be stopped ----------------------------------


@pytest.mark.race("C1", "CPU loop without checkpoints cannot be stopped")
def test_naive_crunch_ignores_a_cancel_and_processes_every_item(
    record_property: Callable[[str, object], None],
) -> None:
    """naive_crunch checks the token only before its loop, so a cancel mid-loop changes nothing."""
    token = CancelToken()
    step = Stepper({0: Gate("item 0")})
    thread, outcome = run_in_thread(lambda: naive_crunch(range(100), step, token), "naive")
    try:
        step.gates[0].wait_reached()
        token.cancel("shutdown")  # while item 0 is being processed
    finally:
        step.open_all()
    join_or_fail(thread)
    record_property(
        "observed",
        f"cancelled during item 0, yet the loop did {len(step.done)} of 100 items"
        f" and returned {outcome.get('result')!r}",
    )

    assert outcome == {"result": 100}
    assert step.done == list(range(100))  # all 99 items after the cancel were processed


@pytest.mark.race("C1", "CPU loop without checkpoints cannot be stopped")
def test_crunch_stops_within_one_step_of_a_cancel() -> None:
    """A loop that checks the token before every item finishes the current step and stops."""
    token = CancelToken()
    step = Stepper({0: Gate("item 0")})
    thread, outcome = run_in_thread(lambda: crunch(range(100), step, token), "crunch")
    try:
        step.gates[0].wait_reached()
        token.cancel("shutdown")
    finally:
        step.open_all()
    join_or_fail(thread)

    assert isinstance(outcome.get("error"), Cancelled)
    assert step.done == [0]  # the running step finished; no later step started


@pytest.mark.race("C1", "CPU loop without checkpoints cannot be stopped")
def test_naive_crunch_in_a_pool_makes_shutdown_wait_for_every_item(
    record_property: Callable[[str, object], None],
) -> None:
    """After a cancel, shutdown(wait=True) still waits for an uncooperative task's every item."""
    token = CancelToken()
    step = Stepper({0: Gate("item 0"), 50: Gate("item 50")})
    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(naive_crunch, range(100), step, token)
    try:
        step.gates[0].wait_reached()
        token.cancel("shutdown")
        cancelled_at = time.monotonic()
        shutdown, outcome = run_in_thread(lambda: pool.shutdown(wait=True), "shutdown")
        step.gates[0].open()
        step.gates[50].wait_reached()  # the task went on past the cancel...
        assert stays_blocked(shutdown)  # ...and the shutdown waits for it
    finally:
        step.open_all()
    join_or_fail(shutdown)
    waited = time.monotonic() - cancelled_at
    record_property(
        "observed",
        f"after the cancel, shutdown(wait=True) still waited {waited:.1f}s,"
        f" until the task had done all {len(step.done)} items",
    )

    assert outcome == {"result": None}
    assert future.result(0) == 100


@pytest.mark.race("C1", "CPU loop without checkpoints cannot be stopped")
def test_crunch_in_a_pool_lets_shutdown_finish_promptly_after_a_cancel() -> None:
    """After a cancel, a cooperative task stops at its next checkpoint and shutdown() returns."""
    token = CancelToken()
    step = Stepper({0: Gate("item 0"), 50: Gate("item 50")})
    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(crunch, range(100), step, token)
    try:
        step.gates[0].wait_reached()
        token.cancel("shutdown")
        shutdown, outcome = run_in_thread(lambda: pool.shutdown(wait=True), "shutdown")
        step.gates[0].open()
        join_or_fail(shutdown, PROMPTLY)
    finally:
        step.open_all()

    assert outcome == {"result": None}
    assert isinstance(future.exception(0), Cancelled)
    assert not step.gates[50].reached.is_set()
    assert step.done == [0]


# --- C2: a blocking call without a timeout cannot be interrupted ---------------------------


@pytest.mark.race("C2", "blocking call without a timeout cannot be interrupted")
def test_naive_receive_stays_blocked_after_a_cancel(
    socket_pair: tuple[socket.socket, socket.socket],
    record_property: Callable[[str, object], None],
) -> None:
    """A thread blocked in recv does not see the cancel; it wakes only when data comes."""
    a, b = socket_pair
    token = CancelToken()
    thread, outcome = run_in_thread(lambda: naive_receive(a, token), "naive receiver")
    try:
        wait_until_blocked_in(thread, "naive_receive")
        token.cancel("shutdown")
        cancelled_at = time.monotonic()
        assert stays_blocked(thread)
    finally:
        b.sendall(b"late")  # the release: only data (or the peer closing) ends the recv
    join_or_fail(thread)
    record_property(
        "observed",
        f"recv() stayed blocked {time.monotonic() - cancelled_at:.1f}s after the cancel,"
        f" until data came, then returned {outcome.get('result')!r}",
    )

    assert outcome == {"result": b"late"}  # returned as if nothing had happened


@pytest.mark.race("C2", "blocking call without a timeout cannot be interrupted")
def test_receive_returns_at_once_when_cancelled_while_blocked(
    socket_pair: tuple[socket.socket, socket.socket],
) -> None:
    """A cancel shuts the socket down, so the blocked recv returns and receive raises Cancelled."""
    a, b = socket_pair
    token = CancelToken()
    thread, outcome = run_in_thread(lambda: receive(a, token), "receiver")
    try:
        wait_until_blocked_in(thread, "receive")
        token.cancel("shutdown")
        join_or_fail(thread, PROMPTLY)
    finally:
        if thread.is_alive():  # only if the fix failed: release it so no thread leaks
            b.sendall(b"x")

    assert isinstance(outcome.get("error"), Cancelled)
    assert outcome["error"].reason == "shutdown"
    b.settimeout(MUST_HAPPEN)
    assert b.recv(16) == b""  # the peer sees the connection end


# --- C3: a forced async exception waits for blocking calls and cuts finally short ---------


@pytest.mark.race("C3", "forced async exception waits for blocking calls and cuts finally short")
def test_naive_async_raise_waits_for_a_blocking_call_then_cuts_finally_short(
    record_property: Callable[[str, object], None],
) -> None:
    """A forced exception cannot wake a thread blocked in C, and then it cuts finally short."""
    steps: list[str] = []
    in_cleanup = threading.Event()
    flushed = threading.Event()  # stands for a flush that blocks in C (disk, network)

    def worker() -> None:
        try:
            steps.append("work")
        finally:
            steps.append("cleanup started")
            in_cleanup.set()
            flushed.wait()
            steps.append("flushed")
            steps.append("connection released")

    thread, outcome = run_in_thread(worker, "forced")
    try:
        assert in_cleanup.wait(MUST_HAPPEN)
        wait_until_blocked_in(thread, "wait")
        async_raise(thread, ForcedStop)  # the supervisor loses patience
        raised_at = time.monotonic()
        assert stays_blocked(thread)  # not interrupted: it is inside a C call
    finally:
        flushed.set()
    join_or_fail(thread)
    record_property(
        "observed",
        f"{type(outcome.get('error')).__name__} landed only when the C call returned"
        f" ({time.monotonic() - raised_at:.1f}s late), and cut the finally after {steps[-1]!r}",
    )

    assert isinstance(outcome.get("error"), ForcedStop)
    assert steps[:2] == ["work", "cleanup started"]
    assert "connection released" not in steps  # the cleanup was cut short


@pytest.mark.race("C3", "forced async exception waits for blocking calls and cuts finally short")
def test_cooperative_cancel_wakes_a_blocked_sleep_and_runs_finally_fully() -> None:
    """A cancel wakes the task at once, and its finally runs to the end: nothing is forced."""
    steps: list[str] = []
    in_cleanup = threading.Event()
    flushed = threading.Event()
    token = CancelToken()

    def worker() -> None:
        try:
            steps.append("work")
            token.sleep(60)  # blocked, like the naive worker, but at a checkpoint
        finally:
            steps.append("cleanup started")
            in_cleanup.set()
            flushed.wait(MUST_HAPPEN)
            steps.append("flushed")
            steps.append("connection released")

    thread, outcome = run_in_thread(worker, "cooperative")
    try:
        wait_until_blocked_in(thread, "sleep")
        token.cancel("shutdown")
        assert in_cleanup.wait(PROMPTLY)  # woken at once, straight into its cleanup
        wait_until_blocked_in(thread, "wait")
        # The supervisor loses patience, as in the naive test; the steps below show that
        # this escalation lands nothing inside the cleanup.
        token.cancel("forced")
    finally:
        flushed.set()
    join_or_fail(thread)

    assert isinstance(outcome.get("error"), Cancelled)
    assert outcome["error"].reason == "shutdown"
    assert steps == ["work", "cleanup started", "flushed", "connection released"]


# --- async_raise: its errors, and the one thing it does do --------------------------------


def test_async_raise_interrupts_a_thread_that_runs_python_code() -> None:
    """A thread executing bytecode gets the forced exception at its next instruction check."""
    running = threading.Event()
    give_up = threading.Event()  # the release, should async_raise ever fail to land

    def spin() -> None:
        running.set()
        while not give_up.is_set():
            pass

    thread, outcome = run_in_thread(spin, "spinner")
    try:
        assert running.wait(MUST_HAPPEN)
        async_raise(thread, ForcedStop)
        thread.join(MUST_HAPPEN)
    finally:
        give_up.set()
    join_or_fail(thread)
    assert isinstance(outcome.get("error"), ForcedStop)


def test_async_raise_rejects_a_thread_that_was_never_started() -> None:
    """A thread with no id cannot be targeted."""
    with pytest.raises(ValueError, match="not running"):
        async_raise(threading.Thread(target=lambda: None), ForcedStop)


def test_async_raise_rejects_a_thread_that_has_ended() -> None:
    """A finished thread's id may belong to another thread by now, so it is refused."""
    thread = threading.Thread(target=lambda: None)
    thread.start()
    join_or_fail(thread)
    with pytest.raises(ValueError, match="not running"):
        async_raise(thread, ForcedStop)


def test_async_raise_rejects_something_that_is_not_an_exception_class() -> None:
    """Only exception classes can be scheduled; an instance or another type is refused."""
    with pytest.raises(TypeError, match="exception class"):
        async_raise(threading.current_thread(), ForcedStop("an instance"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="exception class"):
        async_raise(threading.current_thread(), int)  # type: ignore[arg-type]


# --- what each supported Python version does (checked on 3.11.7, 3.12.1 and 3.13.0) ------


def test_nothing_in_threading_or_futures_stops_a_running_thread() -> None:
    """No stop or interrupt on Thread, and Future.cancel refuses a task that has started."""
    public = {name for name in dir(threading.Thread) if not name.startswith("_")}
    assert public == {
        "daemon",
        "getName",
        "ident",
        "isDaemon",
        "is_alive",
        "join",
        "name",
        "native_id",
        "run",
        "setDaemon",
        "setName",
        "start",
    }
    gate = Gate("running task")
    pool = ThreadPoolExecutor(max_workers=1)
    running = pool.submit(gate.arrive)
    try:
        gate.wait_reached()
        assert not running.cancel()
        assert running.running()
    finally:
        gate.open()
        pool.shutdown(wait=True)
    assert running.result() is None  # it ran to its end


def test_asyncio_cancelled_error_is_a_base_exception_as_cancelled_is() -> None:
    """Cancelled follows asyncio: except Exception catches neither."""
    for cls in (asyncio.CancelledError, Cancelled):
        assert issubclass(cls, BaseException)
        assert not issubclass(cls, Exception)


def test_asyncio_has_timeout_cancelling_and_uncancel() -> None:
    """The cancellation tools the page names exist on every supported version."""
    assert callable(asyncio.timeout)
    assert callable(asyncio.Task.cancelling)
    assert callable(asyncio.Task.uncancel)


def test_a_socket_timeout_is_an_os_error() -> None:
    """socket.timeout is TimeoutError, an OSError, so receive's except OSError covers it."""
    assert socket.timeout is TimeoutError
    assert issubclass(TimeoutError, OSError)


# --- any budget, and callbacks that raise or exit --------------------------------


@pytest.mark.parametrize(
    "seconds", [math.inf, 1e10, 1e300, 10**400], ids=["inf", "1e10", "1e300", "10**400"]
)
def test_a_huge_or_infinite_timeout_means_as_long_as_it_takes(seconds: float) -> None:
    """Infinite and huge seconds are accepted everywhere and never raise OverflowError."""
    token = CancelToken(timeout=seconds)
    assert not token.wait(0.01)
    assert (token.remaining() or 0.0) > 1e9
    assert not token.child(timeout=seconds).wait(0)
    q: queue.Queue[str] = queue.Queue()
    q.put("item")
    assert take(q, token, poll_interval=seconds) == "item"
    left, right = socket.socketpair()
    with left, right:
        right.sendall(b"data")
        assert receive(left, token) == b"data"

    waiter, waited = run_in_thread(lambda: token.wait(seconds), "waiter")
    sleeper, slept = run_in_thread(lambda: token.sleep(seconds), "sleeper")
    wait_until_blocked_in(waiter, "wait")
    wait_until_blocked_in(sleeper, "wait")
    token.cancel("done")
    join_or_fail(waiter)
    join_or_fail(sleeper)
    assert waited == {"result": True}
    assert isinstance(slept["error"], Cancelled)


@pytest.mark.parametrize("bad", [math.nan, -1.0, True, "1"])
def test_seconds_that_are_not_seconds_are_a_value_error_naming_the_argument(bad: object) -> None:
    """nan, negative, bool, str: ValueError naming the argument, at every entry point."""
    token = CancelToken()
    cases: list[tuple[str, Callable[[], object]]] = [
        ("timeout", lambda: CancelToken(timeout=bad)),  # type: ignore[arg-type]
        ("timeout", lambda: token.child(timeout=bad)),  # type: ignore[arg-type]
        ("timeout", lambda: token.wait(bad)),  # type: ignore[arg-type]
        ("seconds", lambda: token.sleep(bad)),  # type: ignore[arg-type]
        ("poll_interval", lambda: take(queue.Queue(), token, poll_interval=bad)),  # type: ignore[arg-type]
    ]
    for name, call in cases:
        with pytest.raises(ValueError, match=f"^{name} must be a number of seconds >= 0"):
            call()


def test_every_callback_runs_and_every_child_is_cancelled_whatever_a_callback_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Cancelled, KeyboardInterrupt, SystemExit from callbacks: all run, then the exit."""
    token = CancelToken()
    other = CancelToken()
    other.cancel("the other job stopped")
    ran: list[str] = []

    def raises(name: str, exc: BaseException | None) -> Callable[[], None]:
        def callback() -> None:
            ran.append(name)
            if name == "cancelled":
                other.check()  # raises Cancelled, as a callback using another token may
            elif exc is not None:
                raise exc

        return callback

    token.on_cancel(raises("cancelled", None))
    token.on_cancel(raises("interrupt", KeyboardInterrupt()))
    token.on_cancel(raises("exit", SystemExit(2)))
    token.on_cancel(raises("plain", None))
    child = token.child()
    child.on_cancel(raises("child's", None))

    with caplog.at_level(logging.ERROR), pytest.raises(KeyboardInterrupt):
        token.cancel("stop")

    assert ran == ["cancelled", "interrupt", "exit", "plain", "child's"]
    assert child.cancelled
    assert child.reason == "stop"
    assert sum("on_cancel callback" in r.getMessage() for r in caplog.records) == 3
    assert not token.cancel("again")  # nothing is left to retry: it all ran once


def test_a_callback_run_at_registration_is_contained_too(caplog: pytest.LogCaptureFixture) -> None:
    """on_cancel on a cancelled token logs what the callback raises; an exit is re-raised."""
    token = CancelToken()
    token.cancel()
    other = CancelToken()
    other.cancel()
    with caplog.at_level(logging.ERROR):
        token.on_cancel(other.check)  # Cancelled from another token: logged, contained
    assert "on_cancel callback" in caplog.text

    def interrupt() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        token.on_cancel(interrupt)
