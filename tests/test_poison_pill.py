"""Poison pills: each pitfall forced to happen, then the pattern that prevents it."""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import math
import multiprocessing
import multiprocessing.queues
import pickle
import queue
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from patterns.naive.poison_pill import (
    naive_consume,
    naive_produce,
    naive_put_pill,
    naive_send_pills,
)
from patterns.poison_pill import (
    PILL,
    Pill,
    ProducerGroup,
    consume,
    join_with_timeout,
    produce_and_count_down,
    put_pill,
    send_pills,
)
from tests.support import (
    MUST_HAPPEN,
    NOISE,
    Gate,
    elapsed,
    join_or_fail,
    run_in_thread,
    stays_blocked,
    wait_until,
    wait_until_blocked_in,
)

P10 = ("P10", "one pill for N consumers leaves N-1 blocked in get() forever")
P11 = ("P11", "each producer sends its own pill: a slow producer's items are stranded")
P12 = ("P12", "a full bounded queue blocks put(PILL) forever")
P13 = ("P13", "Queue.join() hangs when a failing handler skips task_done()")


def drain(q: queue.Queue[Any]) -> list[Any]:
    """Take whatever is left in `q` without blocking, in order."""
    left = []
    while True:
        try:
            left.append(q.get_nowait())
        except queue.Empty:
            return left


def unblock(q: queue.Queue[Any], threads: list[threading.Thread]) -> None:
    """Wake every consumer, producer and joiner a failed test may have left blocked on `q`."""
    drain(q)  # frees the slots a blocked put() waits for
    for thread in threads:
        if thread.is_alive():
            with contextlib.suppress(queue.Full):
                q.put_nowait(PILL)  # wakes a consumer blocked in get()
    while q.unfinished_tasks:
        q.task_done()  # releases a thread blocked in join()


@pytest.fixture
def rescue() -> Iterator[Callable[[Callable[[], object]], None]]:
    """Register wake-up actions that run at teardown, so a failing test cannot leave a hang.

    On success they find nothing to do; they run before the leaked-thread check.
    """
    actions: list[Callable[[], object]] = []
    yield actions.append
    for action in reversed(actions):
        action()


def start_consumers(
    q: queue.Queue[Any],
    names: str,
    handle: Callable[[Any], object],
    *,
    consumer: Callable[..., int] = consume,
) -> tuple[list[tuple[threading.Thread, dict[str, Any]]], queue.Queue[str]]:
    """Start one consumer per letter in `names`; each puts its name in `exited` when it returns."""
    exited: queue.Queue[str] = queue.Queue()

    def body(name: str) -> Callable[[], int]:
        def run() -> int:
            try:
                return consumer(q, handle)
            finally:
                exited.put(name)

        return run

    started = [run_in_thread(body(f"consumer-{c}"), f"consumer-{c}") for c in names]
    return started, exited


def errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The ERROR records logged by the module under test."""
    return [
        r
        for r in caplog.records
        if r.name in {"patterns.poison_pill", "patterns.naive.poison_pill"}
        and r.levelno == logging.ERROR
    ]


# --- the building blocks ------------------------------------------------------------------


def test_pill_is_a_singleton_with_a_readable_repr_that_survives_copy_and_pickle() -> None:
    """PILL keeps its identity through pickling, so it works across a multiprocessing queue."""
    assert repr(PILL) == "<PILL>"
    assert list(Pill) == [PILL]  # a single member: nothing else can be a pill
    assert pickle.loads(pickle.dumps(PILL)) is PILL
    assert copy.deepcopy(PILL) is PILL
    sentinel = object()
    assert pickle.loads(pickle.dumps(sentinel)) is not sentinel  # why a bare object() is not


def test_pill_keeps_its_identity_through_a_multiprocessing_queue() -> None:
    """multiprocessing.Queue pickles every item: PILL comes out as PILL, an object() does not."""
    mq: multiprocessing.queues.Queue[object] = multiprocessing.Queue()
    sentinel = object()
    try:
        mq.put(PILL)
        mq.put(sentinel)
        assert mq.get(timeout=MUST_HAPPEN) is PILL
        assert mq.get(timeout=MUST_HAPPEN) is not sentinel
    finally:
        mq.close()
        mq.join_thread()  # its feeder thread, so the test leaves nothing running


# --- what each Python version has: the claims of the module and page ----------------------


def test_no_supported_version_gives_queue_join_a_timeout() -> None:
    """Queue.join() takes no argument on 3.11, 3.12 and 3.13: hence join_with_timeout."""
    assert list(inspect.signature(queue.Queue.join).parameters) == ["self"]


def test_simple_queue_has_no_task_done_join_or_shutdown() -> None:
    """queue.SimpleQueue cannot count finished work or be closed, on any supported version."""
    for name in ("task_done", "join", "shutdown"):
        assert not hasattr(queue.SimpleQueue, name)


def test_from_3_13_shutdown_wakes_a_put_pill_blocked_on_a_full_queue() -> None:
    """3.13's Queue.shutdown() ends P12: a blocked put(PILL) raises ShutDown; 3.11/3.12 lack it."""
    if sys.version_info < (3, 13):
        assert not hasattr(queue.Queue, "shutdown")
        return
    q: queue.Queue[int | Pill] = queue.Queue(maxsize=1)
    q.put(0)  # full, and no consumer will take it
    sender, sent = run_in_thread(lambda: naive_put_pill(q), "pill sender")
    wait_until_blocked_in(sender, "put")

    q.shutdown()

    join_or_fail(sender)
    assert isinstance(sent.get("error"), queue.ShutDown)
    assert q.get_nowait() == 0  # a graceful shutdown keeps what was queued


def test_one_consumer_handles_every_item_before_the_pill_in_order_then_exits() -> None:
    """FIFO: everything put before the pill is handled, in order; what comes after is not."""
    q: queue.Queue[int | str | Pill] = queue.Queue()
    for i in range(10):
        q.put(i)
    q.put(PILL)
    q.put("after the pill")
    handled: list[object] = []

    assert consume(q, handled.append) == 10  # the pill is already queued, so this returns

    assert handled == list(range(10))
    assert drain(q) == ["after the pill"]
    assert q.unfinished_tasks == 1  # only the item left behind: the pill got its task_done()


def test_consume_logs_a_failing_handler_and_goes_on_with_the_next_item(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A handler's exception is logged at ERROR with its traceback, never swallowed silently."""
    q: queue.Queue[str | Pill] = queue.Queue()
    for item in ["a", "bad", "c", PILL]:
        q.put(item)
    handled: list[str] = []

    def handle(item: str) -> None:
        if item == "bad":
            raise ValueError("cannot handle 'bad'")
        handled.append(item)

    assert consume(q, handle) == 2

    assert handled == ["a", "c"]
    [record] = errors(caplog)
    assert "'bad'" in record.getMessage()
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], ValueError)
    assert q.unfinished_tasks == 0


def test_a_base_exception_in_the_handler_ends_the_consumer_after_its_task_done() -> None:
    """KeyboardInterrupt-like exceptions are not swallowed, and task_done() still runs."""

    class Interrupt(BaseException):
        pass

    q: queue.Queue[str | Pill] = queue.Queue()
    q.put("x")

    def handle(item: str) -> None:
        raise Interrupt

    with pytest.raises(Interrupt):
        consume(q, handle)
    assert q.unfinished_tasks == 0


@pytest.mark.parametrize("count", [0, -1])
def test_send_pills_refuses_a_consumer_count_below_one(count: int) -> None:
    """Zero pills would stop nobody, so a count below one is a bug and says so."""
    with pytest.raises(ValueError, match=f"consumers must be at least 1, got {count}"):
        send_pills(queue.Queue(), count)


@pytest.mark.parametrize(
    ("producers", "consumers", "bad"), [(0, 1, "producers"), (1, 0, "consumers")]
)
def test_producer_group_refuses_counts_below_one(producers: int, consumers: int, bad: str) -> None:
    """The error names the count that is wrong."""
    with pytest.raises(ValueError, match=f"{bad} must be at least 1, got 0"):
        ProducerGroup(queue.Queue(), producers=producers, consumers=consumers)


def test_producer_group_refuses_a_timeout_without_a_stop_event() -> None:
    """A timeout only bounds put_pill, which needs a stop event to watch."""
    with pytest.raises(ValueError, match="timeout needs a stop event"):
        ProducerGroup(queue.Queue(), producers=1, consumers=1, timeout=1.0)


def test_producer_group_refuses_a_negative_timeout() -> None:
    """A negative timeout is a bug, not "give up at once", and the error says which argument."""
    with pytest.raises(ValueError, match=r"timeout must be a number of seconds >= 0, not -1\b"):
        ProducerGroup(queue.Queue(), producers=1, consumers=1, stop=threading.Event(), timeout=-1)


def test_producer_group_sends_every_pill_on_the_last_done_and_only_then() -> None:
    """No pill goes in until the last producer is done; then one per consumer."""
    q: queue.Queue[int | Pill] = queue.Queue()
    group = ProducerGroup(q, producers=3, consumers=2)

    assert group.done() is False
    assert group.done() is False
    assert q.empty()
    assert group.remaining == 1
    assert group.done() is True

    assert group.remaining == 0
    assert drain(q) == [PILL, PILL]


def test_producer_group_done_called_too_often_raises_instead_of_sending_pills_twice() -> None:
    """An extra done() is a caller bug; it is reported, and no extra pill is sent."""
    q: queue.Queue[int | Pill] = queue.Queue()
    group = ProducerGroup(q, producers=1, consumers=1)
    group.done()
    with pytest.raises(RuntimeError, match="more times than there are producers"):
        group.done()
    assert drain(q) == [PILL]


def test_a_crashed_producer_still_counts_down_so_the_consumer_stops(rescue) -> None:
    """producing() is a try/finally: a producer that raises still lets the pills go out."""
    q: queue.Queue[str | Pill] = queue.Queue()
    group = ProducerGroup(q, producers=2, consumers=1)
    handled: list[str] = []
    [(consumer, outcome)], _ = start_consumers(q, "A", handled.append)
    rescue(lambda: unblock(q, [consumer]))

    def crashing_items() -> Iterator[str]:
        yield "c1"
        raise OSError("source went away")

    crashed, crash = run_in_thread(
        lambda: produce_and_count_down(q, crashing_items(), group), "crashing"
    )
    join_or_fail(crashed)
    fine, ok = run_in_thread(lambda: produce_and_count_down(q, ["f1", "f2"], group), "fine")
    join_or_fail(fine)
    join_or_fail(consumer)

    assert isinstance(crash["error"], OSError)
    assert ok["result"] == 2
    assert handled == ["c1", "f1", "f2"]
    assert outcome["result"] == 3
    assert q.empty()


def test_producer_group_with_a_stop_event_gives_up_on_a_full_queue_and_logs_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With stop and timeout, the last producer returns on time and reports the lost pills."""
    q: queue.Queue[int | Pill] = queue.Queue(maxsize=1)
    q.put(0)  # full, and no consumer will ever take it
    group = ProducerGroup(q, producers=1, consumers=2, stop=threading.Event(), timeout=0.1)

    with elapsed() as took:
        assert group.done() is True

    assert took() < 0.1 + NOISE
    [record] = errors(caplog)
    assert "2 of 2 pill(s) not delivered" in record.getMessage()
    assert drain(q) == [0]


def test_put_pill_puts_at_once_when_there_is_room_even_if_stop_is_set() -> None:
    """Stop is only checked while the queue is full: a pill that fits always goes in."""
    q: queue.Queue[int | Pill] = queue.Queue(maxsize=1)
    stop = threading.Event()
    stop.set()
    assert put_pill(q, stop, 0) is True
    assert drain(q) == [PILL]


@pytest.mark.parametrize(
    ("timeout", "poll", "message"),
    [
        (-1.0, 0.05, "timeout must be a number of seconds >= 0, not -1.0"),
        (1.0, 0.0, "poll must be a number of seconds > 0"),
    ],
)
def test_put_pill_refuses_a_negative_timeout_or_a_poll_that_is_not_positive(
    timeout: float, poll: float, message: str
) -> None:
    """Bad arguments fail at once with a message naming the argument."""
    with pytest.raises(ValueError, match=re.escape(message)):
        put_pill(queue.Queue(), threading.Event(), timeout, poll=poll)


def test_join_with_timeout_is_false_while_an_item_is_unfinished_and_true_after() -> None:
    """The bounded join reports an unfinished item instead of waiting for it forever."""
    q: queue.Queue[int] = queue.Queue()
    assert join_with_timeout(q, 0) is True
    q.put(1)
    assert join_with_timeout(q, 0.05) is False
    q.get()
    assert join_with_timeout(q, 0) is False  # taken is not finished
    q.task_done()
    assert join_with_timeout(q, 0) is True


def test_join_with_timeout_wakes_as_soon_as_the_last_task_is_done() -> None:
    """It waits on the condition task_done() notifies, so it returns without polling."""
    q: queue.Queue[int] = queue.Queue()
    q.put(1)
    joiner, outcome = run_in_thread(lambda: join_with_timeout(q, MUST_HAPPEN), "joiner")
    wait_until_blocked_in(joiner, "wait")
    q.get()
    q.task_done()
    join_or_fail(joiner)
    assert outcome["result"] is True


def test_join_with_timeout_refuses_a_negative_timeout() -> None:
    """A negative timeout is a bug, as it is for Queue.put()."""
    with pytest.raises(ValueError, match=r"timeout must be a number of seconds >= 0, not -0\.5"):
        join_with_timeout(queue.Queue(), -0.5)


# --- P10: N consumers need N pills --------------------------------------------------------


@pytest.mark.race(*P10)
def test_naive_one_pill_for_three_consumers_leaves_two_blocked_in_get(
    rescue, record_property: Callable[[str, object], None]
) -> None:
    """One pill stops exactly one consumer; the other two wait in get() for a pill never sent."""
    q: queue.Queue[int | Pill] = queue.Queue()
    handled: list[int] = []
    consumers, exited = start_consumers(q, "ABC", handled.append)
    threads = [t for t, _ in consumers]
    rescue(lambda: unblock(q, threads))
    for i in range(6):
        q.put(i)

    naive_send_pills(q, consumers=3)

    first = exited.get(timeout=MUST_HAPPEN)
    first_out_at = time.monotonic()
    still_waiting = [t for t in threads if t.name != first]
    for thread in still_waiting:
        wait_until_blocked_in(thread, "get")
    assert [stays_blocked(t) for t in still_waiting] == [True, True]
    assert exited.empty()

    send_pills(q, 2)  # release them, so the test leaves nothing running
    for thread in still_waiting:
        join_or_fail(thread)
    record_property(
        "observed",
        f"the one pill stopped {first}, the other {len(still_waiting)} stayed in get()"
        f" {time.monotonic() - first_out_at:.1f}s, until the test sent them pills",
    )
    assert sorted(handled) == list(range(6))


@pytest.mark.race(*P10)
def test_send_pills_stops_every_consumer_after_every_item() -> None:
    """One pill per consumer, put after the last item: every consumer exits, every item handled."""
    q: queue.Queue[int | Pill] = queue.Queue()
    handled: list[int] = []
    consumers, exited = start_consumers(q, "ABC", handled.append)
    for i in range(6):
        q.put(i)

    send_pills(q, consumers=3)

    for thread, _ in consumers:
        join_or_fail(thread)
    assert sorted(exited.get_nowait() for _ in consumers) == [
        "consumer-A",
        "consumer-B",
        "consumer-C",
    ]
    assert sorted(handled) == list(range(6))
    assert sum(outcome["result"] for _, outcome in consumers) == 6
    assert join_with_timeout(q, 0)


# --- P11: several producers must agree who sends the pills --------------------------------


def slow_items(gate: Gate) -> Iterator[str]:
    """A slow producer's source: one item, then a pause the test controls, then two more."""
    yield "b1"
    gate.arrive()
    yield "b2"
    yield "b3"


@pytest.mark.race(*P11)
def test_naive_producers_each_sending_a_pill_strand_the_slow_producers_items(
    rescue, record_property: Callable[[str, object], None]
) -> None:
    """The fast producer's pill stops the consumer; the slow producer's last two items are lost."""
    q: queue.Queue[str | Pill] = queue.Queue()
    handled: list[str] = []
    [(consumer, outcome)], _ = start_consumers(q, "A", handled.append)
    gate = Gate("slow producer between items")
    rescue(gate.open)
    slow, slow_outcome = run_in_thread(lambda: naive_produce(q, slow_items(gate)), "slow")
    rescue(lambda: unblock(q, [consumer, slow]))
    gate.wait_reached()  # "b1" is queued; the slow producer is paused before "b2"

    fast, _ = run_in_thread(lambda: naive_produce(q, ["a1", "a2"]), "fast")
    join_or_fail(fast)  # it put a1, a2 and its own pill
    join_or_fail(consumer)  # that pill stopped the only consumer
    gate.open()
    join_or_fail(slow)
    stranded = [item for item in drain(q) if item is not PILL]
    record_property(
        "observed",
        f"the fast producer's pill stopped the only consumer after {handled}, stranding {stranded}",
    )

    assert outcome["result"] == 3
    assert handled == ["b1", "a1", "a2"]
    assert slow_outcome["result"] == 3
    assert stranded == ["b2", "b3"]


@pytest.mark.race(*P11)
def test_producer_group_sends_the_pills_only_after_the_last_producer_finishes(rescue) -> None:
    """The last producer to finish sends the pill, so no producer's items come after it."""
    q: queue.Queue[str | Pill] = queue.Queue()
    group = ProducerGroup(q, producers=2, consumers=1)
    handled: list[str] = []
    [(consumer, outcome)], _ = start_consumers(q, "A", handled.append)
    gate = Gate("slow producer between items")
    rescue(gate.open)
    slow, _ = run_in_thread(lambda: produce_and_count_down(q, slow_items(gate), group), "slow")
    rescue(lambda: unblock(q, [consumer, slow]))
    gate.wait_reached()

    fast, _ = run_in_thread(lambda: produce_and_count_down(q, ["a1", "a2"], group), "fast")
    join_or_fail(fast)
    assert group.remaining == 1
    wait_until_blocked_in(consumer, "get")
    assert stays_blocked(consumer)  # no pill yet: the slow producer is not done
    gate.open()
    join_or_fail(slow)
    join_or_fail(consumer)

    assert handled == ["b1", "a1", "a2", "b2", "b3"]
    assert outcome["result"] == 5
    assert q.empty()


# --- P12: a full bounded queue blocks the pill --------------------------------------------


def stuck_consumer(
    q: queue.Queue[str | Pill], rescue: Callable[[Callable[[], object]], None]
) -> tuple[threading.Thread, dict[str, Any], Gate, list[str]]:
    """A consumer parked in its handler on the first item, the queue (size 2) full behind it."""
    stuck = Gate("stuck handler")
    handled: list[str] = []

    def handle(item: str) -> None:
        if item == "first":
            stuck.arrive()
        handled.append(item)

    [(consumer, outcome)], _ = start_consumers(q, "A", handle)
    rescue(stuck.open)
    rescue(lambda: unblock(q, [consumer]))
    q.put("first")
    stuck.wait_reached()
    q.put("x")
    q.put("y")
    assert q.full()
    return consumer, outcome, stuck, handled


@pytest.mark.race(*P12)
def test_naive_put_pill_blocks_while_the_full_queue_has_a_stuck_consumer(
    rescue, record_property: Callable[[str, object], None]
) -> None:
    """put(PILL) on a full queue waits like any put, for as long as the consumer is stuck."""
    q: queue.Queue[str | Pill] = queue.Queue(maxsize=2)
    consumer, outcome, stuck, handled = stuck_consumer(q, rescue)

    sender, _ = run_in_thread(lambda: naive_put_pill(q), "pill sender")
    rescue(lambda: unblock(q, [sender]))
    wait_until_blocked_in(sender, "put")
    blocked_at = time.monotonic()
    assert stays_blocked(sender)

    stuck.open()  # release, so the test leaves nothing running
    join_or_fail(sender)
    join_or_fail(consumer)
    record_property(
        "observed",
        f"put(PILL) blocked {time.monotonic() - blocked_at:.1f}s on the full queue,"
        f" until the stuck consumer was released and handled {len(handled)} items",
    )
    assert handled == ["first", "x", "y"]
    assert outcome["result"] == 3


@pytest.mark.race(*P12)
def test_put_pill_gives_up_after_its_timeout_instead_of_blocking_forever(
    rescue, caplog: pytest.LogCaptureFixture
) -> None:
    """put_pill on a queue that stays full returns False within its timeout, and says why."""
    q: queue.Queue[str | Pill] = queue.Queue(maxsize=2)
    consumer, outcome, stuck, handled = stuck_consumer(q, rescue)

    with elapsed() as took:
        delivered = put_pill(q, threading.Event(), 0.2)

    assert delivered is False
    assert 0.2 <= took() < 0.2 + NOISE
    assert any("still full" in r.getMessage() for r in caplog.records)
    stuck.open()
    assert put_pill(q, threading.Event(), MUST_HAPPEN) is True
    join_or_fail(consumer)
    assert handled == ["first", "x", "y"]
    assert outcome["result"] == 3


@pytest.mark.race(*P12)
def test_put_pill_returns_as_soon_as_stop_is_set(rescue) -> None:
    """With no deadline, the stop event alone ends the wait, within one poll slice."""
    q: queue.Queue[str | Pill] = queue.Queue(maxsize=2)
    consumer, _, stuck, _ = stuck_consumer(q, rescue)
    stop = threading.Event()
    sender, sent = run_in_thread(lambda: put_pill(q, stop, None, poll=0.01), "pill sender")
    wait_until_blocked_in(sender, "put")

    stop.set()

    join_or_fail(sender)
    assert sent["result"] is False
    stuck.open()
    send_pills(q, 1)  # the consumer is moving again, so a plain put is safe now
    join_or_fail(consumer)


@pytest.mark.race(*P12)
def test_put_pill_delivers_the_pill_after_the_items_once_a_slot_frees(rescue) -> None:
    """When the consumer moves again the pill goes in, behind the items already queued."""
    q: queue.Queue[str | Pill] = queue.Queue(maxsize=2)
    consumer, outcome, stuck, handled = stuck_consumer(q, rescue)
    sender, sent = run_in_thread(lambda: put_pill(q, threading.Event(), MUST_HAPPEN), "sender")
    wait_until_blocked_in(sender, "put")

    stuck.open()

    join_or_fail(sender)
    join_or_fail(consumer)
    assert sent["result"] is True
    assert handled == ["first", "x", "y"]
    assert outcome["result"] == 3


# --- P13: one missed task_done() and join() waits forever ---------------------------------


def handle_or_fail(handled: list[str]) -> Callable[[str], None]:
    """A handler that raises on "bad" and records everything else."""

    def handle(item: str) -> None:
        if item == "bad":
            raise ValueError("cannot handle 'bad'")
        handled.append(item)

    return handle


@pytest.mark.race(*P13)
def test_naive_consume_skips_task_done_on_an_error_so_join_hangs(
    rescue,
    caplog: pytest.LogCaptureFixture,
    record_property: Callable[[str, object], None],
) -> None:
    """The failed item never gets task_done(), so join() waits although the queue is empty."""
    q: queue.Queue[str | Pill] = queue.Queue()
    for item in ["a", "bad", "c", PILL]:
        q.put(item)
    handled: list[str] = []
    [(consumer, outcome)], _ = start_consumers(
        q, "A", handle_or_fail(handled), consumer=naive_consume
    )
    join_or_fail(consumer)

    joiner, _ = run_in_thread(q.join, "joiner")
    rescue(lambda: unblock(q, [joiner]))
    joined_at = time.monotonic()
    blocked = stays_blocked(joiner)
    record_property(
        "observed",
        f"{len(errors(caplog))} failure logged, queue {'empty' if q.empty() else 'not empty'},"
        f" yet unfinished_tasks is {q.unfinished_tasks}:"
        f" join() {'still blocked' if blocked else 'returned'} after"
        f" {time.monotonic() - joined_at:.1f}s",
    )
    assert blocked
    assert q.empty()
    assert q.unfinished_tasks == 1
    assert outcome["result"] == 2
    assert len(errors(caplog)) == 1  # logged, yet the count is still off

    q.task_done()  # the missing call: release the joiner
    join_or_fail(joiner)


@pytest.mark.race(*P13)
def test_consume_calls_task_done_in_finally_so_join_returns_after_a_failed_item(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """task_done() in a finally runs for every item, failed or not, so join() returns."""
    q: queue.Queue[str | Pill] = queue.Queue()
    for item in ["a", "bad", "c", PILL]:
        q.put(item)
    handled: list[str] = []
    [(consumer, outcome)], _ = start_consumers(q, "A", handle_or_fail(handled))
    join_or_fail(consumer)

    joiner, _ = run_in_thread(q.join, "joiner")
    join_or_fail(joiner)
    assert q.unfinished_tasks == 0
    assert outcome["result"] == 2
    assert handled == ["a", "c"]
    [record] = errors(caplog)
    assert "'bad'" in record.getMessage()


def test_an_interrupted_last_done_logs_how_many_pills_it_delivered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Ctrl-C while the last producer waits to put a pill: an ERROR says who got no pill."""
    main = threading.main_thread()
    assert threading.current_thread() is main  # a SIGINT's KeyboardInterrupt lands here
    q: queue.Queue[int | Pill] = queue.Queue(maxsize=2)
    q.put(0)  # one free slot, and no consumer
    group = ProducerGroup(q, producers=1, consumers=3)

    def interrupt_once_blocked() -> None:
        wait_until(q.full, "the first pill filled the queue")
        wait_until_blocked_in(main, "wait")  # the second pill waits for room
        signal.pthread_kill(main.ident or 0, signal.SIGINT)

    interrupter, _ = run_in_thread(interrupt_once_blocked, "interrupter")
    with pytest.raises(KeyboardInterrupt):
        group.done()
    join_or_fail(interrupter)

    assert drain(q) == [0, PILL]
    [record] = errors(caplog)
    assert "1 of 3 pill(s) delivered" in record.getMessage()
    assert group.remaining == 0  # done() was counted; the caller must stop the rest itself


# --- every number of seconds, inf included ---------------------------------------


@pytest.mark.parametrize("seconds", [math.inf, 1e10, 1e300, pytest.param(10**400, id="10**400")])
def test_join_with_timeout_and_put_pill_take_inf_and_huge_values(seconds: float) -> None:
    """Both inf and 1e10 mean as long as it takes: the waits are capped inside, no OverflowError."""
    q: queue.Queue[int | Pill] = queue.Queue(maxsize=1)
    q.put(1)
    joiner, joined = run_in_thread(lambda: join_with_timeout(q, seconds), "joiner")
    wait_until_blocked_in(joiner, "wait")
    stop = threading.Event()
    putter, put = run_in_thread(lambda: put_pill(q, stop, seconds, poll=seconds), "putter")
    wait_until_blocked_in(putter, "wait")
    assert q.get() == 1  # makes room for the pill: the putter wakes
    join_or_fail(putter)
    assert put == {"result": True}
    q.task_done()
    assert q.get() is PILL
    q.task_done()
    join_or_fail(joiner)
    assert joined == {"result": True}
    group = ProducerGroup(q, producers=1, consumers=1, stop=stop, timeout=seconds)
    assert group.done() is True
    assert drain(q) == [PILL]


@pytest.mark.parametrize("bad", [math.nan, -1, -math.inf, True, "5"])
def test_every_number_of_seconds_refuses_nan_negative_bool_and_str_naming_it(
    bad: object,
) -> None:
    """A timeout or poll that is nan, negative, a bool or a str is a ValueError naming it."""
    q: queue.Queue[int | Pill] = queue.Queue()
    stop = threading.Event()
    with pytest.raises(ValueError, match="timeout must be a number of seconds"):
        join_with_timeout(q, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout must be a number of seconds"):
        put_pill(q, stop, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="poll must be a number of seconds"):
        put_pill(q, stop, 1.0, poll=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout must be a number of seconds"):
        ProducerGroup(q, producers=1, consumers=1, stop=stop, timeout=bad)  # type: ignore[arg-type]
    assert q.empty()
