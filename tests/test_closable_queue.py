"""Closable queue: every rule of Queue.shutdown(), the consumer pool, and the races they fix.

The semantic tests take the queue class as a parameter: `ClosableQueue` everywhere and, on
Python 3.13, the standard `queue.Queue` too, so the back-port is checked against the real
thing rule for rule wherever both exist.
"""

from __future__ import annotations

import _thread
import asyncio
import json
import logging
import math
import multiprocessing.queues
import queue
import signal
import sys
import threading
import time
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest

from patterns.closable_queue import (
    ClosableQueue,
    ConsumerPool,
    PoolReport,
    ShutDown,
    put_until_shutdown,
    shutdown_and_drain,
)
from patterns.naive.closable_queue import naive_consume, naive_produce
from tests.support import (
    MUST_HAPPEN,
    NOISE,
    STAYS_BLOCKED,
    Gate,
    drain,
    join_or_fail,
    run_in_thread,
    run_python,
    signal_main_during,
    stays_blocked,
    wait_until,
)

PY313 = sys.version_info >= (3, 13)

P14 = ("P14", "consumers blocked in get() cannot be stopped without a pill")
# The same pitfall, with the same title, as in test_thread_exceptions (the catalogue's P9);
# there the cure is a producer that watches its consumer, here a queue the pool closes.
P9 = ("P9", "a consumer thread dies and the producer blocks on a full queue forever")

# The semantic tests run against the standard queue.Queue wherever it has shutdown(), that
# is on 3.13+ (pinned by test_queue_shutdown_exists_exactly_from_3_13_on). Before 3.13 the
# stdlib parameter is not generated rather than skipped: it would have nothing to test, and
# 89 skips that always happen bury the one skip that would matter.
QUEUE_CLASSES = [pytest.param(ClosableQueue, id="ClosableQueue")]
if hasattr(queue.Queue, "shutdown"):
    QUEUE_CLASSES.append(pytest.param(queue.Queue, id="stdlib"))

PUTS: dict[str, Callable[[Any, object], None]] = {
    "put": lambda q, x: q.put(x),
    "put(block=False)": lambda q, x: q.put(x, block=False),
    "put_nowait": lambda q, x: q.put_nowait(x),
    "put(timeout=0)": lambda q, x: q.put(x, timeout=0),
    "put(timeout=long)": lambda q, x: q.put(x, timeout=MUST_HAPPEN),
    "put(timeout=-1)": lambda q, x: q.put(x, timeout=-1),
}

GETS: dict[str, Callable[[Any], object]] = {
    "get": lambda q: q.get(),
    "get(block=False)": lambda q: q.get(block=False),
    "get_nowait": lambda q: q.get_nowait(),
    "get(timeout=0)": lambda q: q.get(timeout=0),
    "get(timeout=long)": lambda q: q.get(timeout=MUST_HAPPEN),
}

BLOCKING_GETS = {name: GETS[name] for name in ("get", "get(timeout=long)")}
BLOCKING_PUTS = {name: PUTS[name] for name in ("put", "put(timeout=long)")}

both_ways = pytest.mark.parametrize("immediate", [False, True], ids=["graceful", "immediate"])


@pytest.fixture(params=QUEUE_CLASSES)
def make_queue(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """The queue class under test: ClosableQueue, and queue.Queue where it has shutdown()."""
    return request.param


def wait_for_waiters(condition: threading.Condition, count: int) -> None:
    """Block until ``count`` threads are parked in ``condition.wait()``.

    It reads the condition's private waiter list: an observation of where the threads
    are, instead of a guess at how long they take to get there.
    """
    wait_until(lambda: len(condition._waiters) >= count, f"{count} thread(s) waiting")


def start_blocked(
    target: Callable[[], object], condition: threading.Condition, names: list[str]
) -> list[tuple[threading.Thread, dict[str, Any]]]:
    """Start one thread per name running ``target``, and return once all wait on ``condition``."""
    started = [run_in_thread(target, name) for name in names]
    wait_for_waiters(condition, len(names))
    return started


# --- before shutdown, and the names ----------------------------------------------------------


def test_before_shutdown_it_is_an_ordinary_fifo_queue(make_queue: Callable[..., Any]) -> None:
    """Until shutdown() is called nothing changes: FIFO order, Empty, Full, task_done and join."""
    q = make_queue(maxsize=2)
    assert q.is_shutdown is False
    q.put("a")
    q.put_nowait("b")
    with pytest.raises(queue.Full):
        q.put_nowait("c")
    with pytest.raises(queue.Full):
        q.put("c", timeout=0)
    assert [q.get(), q.get_nowait()] == ["a", "b"]
    with pytest.raises(queue.Empty):
        q.get_nowait()
    with pytest.raises(queue.Empty):
        q.get(timeout=0)
    with pytest.raises(ValueError, match="non-negative"):
        q.get(timeout=-1)
    q.task_done()
    q.task_done()
    q.join()  # returns at once: every item is done
    with pytest.raises(ValueError, match="too many times"):
        q.task_done()


@both_ways
def test_shutdown_sets_is_shutdown(make_queue: Callable[..., Any], immediate: bool) -> None:
    """is_shutdown is a plain attribute that becomes True on the first shutdown, as in 3.13."""
    q = make_queue()
    q.shutdown(immediate=immediate)
    assert q.is_shutdown is True


def test_shut_down_is_its_own_exception_not_empty_or_full() -> None:
    """ShutDown is an Exception, and code catching Empty or Full does not swallow it."""
    assert issubclass(ShutDown, Exception)
    assert not issubclass(ShutDown, (queue.Empty, queue.Full))


def test_closable_queue_is_a_generic_queue_subclass() -> None:
    """It can stand in for a queue.Queue, and ClosableQueue[int] works at runtime too."""
    assert issubclass(ClosableQueue, queue.Queue)
    assert typing.get_origin(ClosableQueue[int]) is ClosableQueue
    q: ClosableQueue[int] = ClosableQueue()
    q.put(1)
    assert q.get() == 1


def test_on_3_13_the_module_is_the_standard_library_and_before_it_a_back_port() -> None:
    """3.13+: ShutDown is queue.ShutDown and the methods are the stdlib's; before: a back-port."""
    if PY313:
        assert ShutDown is queue.ShutDown
        for name in ("put", "get", "shutdown", "task_done", "join"):
            assert getattr(ClosableQueue, name) is getattr(queue.Queue, name)
    else:
        assert ShutDown.__module__ == "patterns.closable_queue"
        for name in ("put", "get", "shutdown"):
            assert name in vars(ClosableQueue)
        for name in ("task_done", "join", "put_nowait", "get_nowait"):
            assert getattr(ClosableQueue, name) is getattr(queue.Queue, name)


# --- what each Python version has: the claims of the docs page, on the version that runs ---


def test_queue_shutdown_exists_exactly_from_3_13_on() -> None:
    """queue.Queue.shutdown, queue.ShutDown and asyncio's pair all exist on 3.13, none before."""
    assert hasattr(queue.Queue, "shutdown") is PY313
    assert hasattr(queue, "ShutDown") is PY313
    assert hasattr(queue.Queue(), "is_shutdown") is PY313
    assert hasattr(asyncio.Queue, "shutdown") is PY313
    assert hasattr(asyncio, "QueueShutDown") is PY313
    # so the stdlib parametrisation exists on exactly the versions that have something to test
    expected = ["ClosableQueue", "stdlib"] if PY313 else ["ClosableQueue"]
    assert [param.id for param in QUEUE_CLASSES] == expected


def test_simple_queue_and_multiprocessing_queue_have_no_shutdown() -> None:
    """Neither queue.SimpleQueue nor multiprocessing.Queue can be shut down on 3.11 to 3.13."""
    assert not hasattr(queue.SimpleQueue, "shutdown")
    assert not hasattr(multiprocessing.queues.Queue, "shutdown")
    assert not hasattr(multiprocessing.queues.JoinableQueue, "shutdown")


# --- put after shutdown ------------------------------------------------------------------------


@both_ways
@pytest.mark.parametrize("maxsize", [0, 1, 3], ids=["unbounded", "full", "room"])
@pytest.mark.parametrize("put", list(PUTS.values()), ids=list(PUTS))
def test_every_put_raises_shut_down_after_shutdown_and_adds_nothing(
    make_queue: Callable[..., Any], immediate: bool, maxsize: int, put: Callable[..., None]
) -> None:
    """After shutdown every put raises ShutDown, ahead of Full and ValueError, and adds nothing."""
    q = make_queue(maxsize=maxsize)
    q.put("queued")
    q.shutdown(immediate=immediate)
    size, unfinished = q.qsize(), q.unfinished_tasks

    with pytest.raises(ShutDown):
        put(q, "late")

    assert (q.qsize(), q.unfinished_tasks) == (size, unfinished)
    assert drain(q, ShutDown) == ([] if immediate else ["queued"])


# --- get after shutdown ------------------------------------------------------------------------


@pytest.mark.parametrize("maxsize", [0, 3], ids=["unbounded", "bounded"])
@pytest.mark.parametrize("get", list(GETS.values()), ids=list(GETS))
def test_get_hands_out_what_was_queued_in_order_then_raises_shut_down(
    make_queue: Callable[..., Any], maxsize: int, get: Callable[[Any], object]
) -> None:
    """A graceful shutdown keeps queued items for get(); the empty queue then raises ShutDown."""
    q = make_queue(maxsize=maxsize)
    for item in range(3):
        q.put(item)
    q.shutdown()

    assert [get(q), get(q), get(q)] == [0, 1, 2]
    with pytest.raises(ShutDown):
        get(q)  # instead of blocking, or raising Empty
    with pytest.raises(ShutDown):
        get(q)  # and every time after


@both_ways
@pytest.mark.parametrize(
    "get",
    [*GETS.values(), lambda q: q.get(timeout=-1)],
    ids=[*GETS, "get(timeout=-1)"],
)
def test_get_on_an_empty_shut_down_queue_raises_shut_down_not_empty(
    make_queue: Callable[..., Any], immediate: bool, get: Callable[[Any], object]
) -> None:
    """An empty, shut-down queue answers every get with ShutDown, ahead of Empty and ValueError."""
    q = make_queue()
    q.shutdown(immediate=immediate)
    with pytest.raises(ShutDown):
        get(q)


def test_a_bad_timeout_still_raises_value_error_while_items_remain(
    make_queue: Callable[..., Any],
) -> None:
    """While a shut-down queue still holds items, get(timeout=-1) is a ValueError, as before."""
    q = make_queue()
    q.put("left")
    q.shutdown()
    with pytest.raises(ValueError, match="non-negative"):
        q.get(timeout=-1)
    assert q.get_nowait() == "left"


# --- immediate shutdown and task_done accounting ------------------------------------------------


@pytest.mark.parametrize("maxsize", [0, 3], ids=["unbounded", "bounded"])
def test_immediate_shutdown_empties_the_queue_and_counts_each_item_done(
    make_queue: Callable[..., Any], maxsize: int
) -> None:
    """shutdown(immediate=True) drops what is queued, counts it done, and get raises at once."""
    q = make_queue(maxsize=maxsize)
    for item in range(3):
        q.put(item)

    q.shutdown(immediate=True)

    assert (q.qsize(), q.unfinished_tasks, q.empty(), q.full()) == (0, 0, True, False)
    with pytest.raises(ShutDown):
        q.get()
    joiner, _ = run_in_thread(q.join, "joiner")
    join_or_fail(joiner)  # nothing is unfinished, so join() returns


@pytest.mark.parametrize("in_flight", [0, 1, 2])
def test_immediate_shutdown_wakes_join_which_returns_once_nothing_is_in_flight(
    make_queue: Callable[..., Any], in_flight: int
) -> None:
    """A join() blocked at an immediate shutdown returns once items already taken are done."""
    q = make_queue()
    for item in range(4):
        q.put(item)
    taken = [q.get() for _ in range(in_flight)]
    [(joiner, outcome)] = start_blocked(q.join, q.all_tasks_done, ["joiner"])

    q.shutdown(immediate=True)

    assert q.unfinished_tasks == in_flight
    if in_flight:
        assert stays_blocked(joiner)  # join() waits for these (python/cpython#137088 docs it)
        for _ in taken:
            q.task_done()
    join_or_fail(joiner)
    assert "error" not in outcome


def test_graceful_shutdown_leaves_join_waiting_for_the_consumers(
    make_queue: Callable[..., Any],
) -> None:
    """shutdown() without immediate does not release join(); only task_done() for each item does."""
    q = make_queue()
    q.put("a")
    q.put("b")
    [(joiner, _)] = start_blocked(q.join, q.all_tasks_done, ["joiner"])

    q.shutdown()

    assert stays_blocked(joiner)
    for _ in range(2):
        q.get()
        q.task_done()
    join_or_fail(joiner)


@both_ways
def test_task_done_after_shutdown_works_as_before(
    make_queue: Callable[..., Any], immediate: bool
) -> None:
    """task_done() is unchanged by shutdown: one call per item, then ValueError, never ShutDown."""
    q = make_queue()
    for item in range(3):
        q.put(item)
    q.get()  # in flight across the shutdown
    q.shutdown(immediate=immediate)

    q.task_done()
    for _ in drain(q, ShutDown):
        q.task_done()

    assert q.unfinished_tasks == 0
    with pytest.raises(ValueError, match="too many times"):
        q.task_done()


def test_immediate_shutdown_never_counts_below_zero(make_queue: Callable[..., Any]) -> None:
    """If task_done() was called early, the items removed stop counting at zero."""
    q = make_queue()
    q.put("a")
    q.put("b")
    q.task_done()
    q.task_done()  # early: the items are still queued

    q.shutdown(immediate=True)

    assert (q.qsize(), q.unfinished_tasks) == (0, 0)
    with pytest.raises(ValueError, match="too many times"):
        q.task_done()


# --- threads already blocked when shutdown() is called -----------------------------------------


@both_ways
@pytest.mark.parametrize("maxsize", [0, 2], ids=["unbounded", "bounded"])
@pytest.mark.parametrize("get", list(BLOCKING_GETS.values()), ids=list(BLOCKING_GETS))
def test_every_getter_blocked_at_shutdown_wakes_with_shut_down(
    make_queue: Callable[..., Any], immediate: bool, maxsize: int, get: Callable[[Any], object]
) -> None:
    """One shutdown() wakes every thread blocked in get(), and each raises ShutDown."""
    q = make_queue(maxsize=maxsize)
    getters = start_blocked(lambda: get(q), q.not_empty, [f"getter-{i}" for i in range(3)])

    q.shutdown(immediate=immediate)

    for thread, outcome in getters:
        join_or_fail(thread)
        assert isinstance(outcome.get("error"), ShutDown), outcome


@both_ways
@pytest.mark.parametrize("put", list(BLOCKING_PUTS.values()), ids=list(BLOCKING_PUTS))
def test_every_putter_blocked_on_a_full_queue_wakes_with_shut_down(
    make_queue: Callable[..., Any], immediate: bool, put: Callable[..., None]
) -> None:
    """Blocked putters all raise ShutDown and their items never enter the queue."""
    q = make_queue(maxsize=2)
    q.put("a")
    q.put("b")
    putters = start_blocked(lambda: put(q, "late"), q.not_full, [f"putter-{i}" for i in range(3)])

    q.shutdown(immediate=immediate)

    for thread, outcome in putters:
        join_or_fail(thread)
        assert isinstance(outcome.get("error"), ShutDown), outcome
    expected = [] if immediate else ["a", "b"]
    assert q.unfinished_tasks == len(expected)
    assert drain(q, ShutDown) == expected


@pytest.mark.parametrize(
    ("first", "second"),
    [(False, False), (False, True), (True, False), (True, True)],
    ids=["graceful-graceful", "graceful-immediate", "immediate-graceful", "immediate-immediate"],
)
def test_a_second_shutdown_is_harmless_and_an_immediate_one_empties_what_is_left(
    make_queue: Callable[..., Any], first: bool, second: bool
) -> None:
    """Shutting down twice never raises; the queue ends emptied if either call was immediate."""
    q = make_queue()
    for item in range(3):
        q.put(item)

    q.shutdown(immediate=first)
    q.shutdown(immediate=second)

    left = [] if first or second else [0, 1, 2]
    assert q.is_shutdown is True
    assert q.unfinished_tasks == len(left)
    assert drain(q, ShutDown) == left


# --- shutdown_and_drain and put_until_shutdown -------------------------------------------------


def test_shutdown_and_drain_ends_like_an_immediate_shutdown_and_returns_what_it_dropped(
    make_queue: Callable[..., Any],
) -> None:
    """Same final state as shutdown(immediate=True), plus the list of what was dropped."""
    twins = [make_queue(), make_queue()]
    for q in twins:
        for item in range(4):
            q.put(item)
        q.get()  # one item in flight

    dropped = shutdown_and_drain(twins[0])
    twins[1].shutdown(immediate=True)

    assert dropped == [1, 2, 3]
    for q in twins:
        assert (q.is_shutdown, q.qsize(), q.unfinished_tasks) == (True, 0, 1)
    assert shutdown_and_drain(twins[0]) == []  # and again: nothing left


def test_put_until_shutdown_stops_at_shutdown_and_leaves_the_rest_unread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A producer blocked on a full queue returns how many it delivered; later items stay unread."""
    q: ClosableQueue[int] = ClosableQueue(maxsize=1)
    items = iter(range(5))
    [(producer, outcome)] = start_blocked(
        lambda: put_until_shutdown(q, items), q.not_full, ["producer"]
    )

    q.shutdown(immediate=True)

    join_or_fail(producer)
    assert outcome["result"] == 1  # item 0 went in; item 1 was refused
    assert next(items) == 2
    assert "1 item(s) delivered, 1 refused" in caplog.text


# --- P14: consumers blocked in get() -----------------------------------------------------------


@pytest.mark.race(*P14)
def test_naive_consumers_blocked_in_get_ignore_the_stop_flag_until_each_gets_a_pill(
    record_property: Callable[[str, object], None],
) -> None:
    """A stop flag is read only between items, so consumers waiting in get() never see it."""
    q: queue.Queue[str] = queue.Queue()
    stop = threading.Event()
    handled: list[str] = []
    consumers = start_blocked(
        lambda: naive_consume(q, handled.append, stop),
        q.not_empty,
        [f"naive-consumer-{i}" for i in range(3)],
    )

    stop.set()
    stopped_at = time.monotonic()

    assert stays_blocked(consumers[0][0])
    assert all(thread.is_alive() for thread, _ in consumers)
    for _ in consumers:  # the only way out: one item per consumer
        q.put("wake-up")
    for thread, outcome in consumers:
        join_or_fail(thread)
        assert outcome == {"result": None}
    record_property(
        "observed",
        f"after stop.set() all consumers stayed in get() {time.monotonic() - stopped_at:.1f}s,"
        f" and left only by handling {len(handled)} wake-up items as data",
    )
    assert handled == ["wake-up"] * 3  # and each wake-up was handled as if it were data


@pytest.mark.race(*P14)
def test_closing_the_queue_wakes_every_blocked_consumer_at_once() -> None:
    """shutdown() wakes every consumer blocked in get() at once; no pill is handled as data."""
    handled: list[str] = []
    pool: ConsumerPool[str] = ConsumerPool(handled.append, consumers=3, name="p14")
    pool.start()
    wait_for_waiters(pool.queue.not_empty, 3)

    report = pool.stop(timeout=MUST_HAPPEN)

    assert report.terminated
    assert not any(thread.is_alive() for thread in pool.threads)
    assert (report.processed, report.failed, report.discarded) == (0, 0, ())
    assert handled == []


# --- P9: a producer blocked in put() while its consumers are dead -------------------------------


@pytest.mark.race(*P9)
def test_naive_producer_blocks_forever_on_a_full_queue_whose_consumer_died(
    record_property: Callable[[str, object], None],
) -> None:
    """Nothing ever makes room once the consumer is dead, so put() waits for as long as we look."""
    q: queue.Queue[int] = queue.Queue(maxsize=1)

    def handler(item: int) -> None:
        raise RuntimeError(f"cannot handle {item}")

    consumer, died = run_in_thread(
        lambda: naive_consume(q, handler, threading.Event()), "naive-consumer"
    )
    producer, produced = run_in_thread(lambda: naive_produce(q, range(3)), "naive-producer")
    join_or_fail(consumer)
    assert isinstance(died["error"], RuntimeError)  # item 0 killed the only consumer
    wait_for_waiters(q.not_full, 1)  # item 1 fills the queue; item 2 waits
    blocked_at = time.monotonic()

    assert stays_blocked(producer)

    assert q.get_nowait() == 1  # release: the test does the dead consumer's job
    join_or_fail(producer)
    record_property(
        "observed",
        f"consumer died ({type(died['error']).__name__}: {died['error']}), then put() blocked"
        f" {time.monotonic() - blocked_at:.1f}s until the test made room",
    )
    assert produced["result"] == 3
    assert q.get_nowait() == 2


@pytest.mark.race(*P9)
def test_when_the_last_consumer_dies_the_pool_shuts_the_queue_and_the_producer_wakes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The pool shuts the queue when its last consumer dies, so the producer wakes with ShutDown."""
    gate = Gate("handler on item 0")

    def handler(item: int) -> None:
        gate.arrive()
        sys.exit(f"giving up on {item}")  # SystemExit: a thread would die of it silently

    pool: ConsumerPool[int] = ConsumerPool(handler, consumers=1, maxsize=1, name="q1")
    pool.start()
    producer, produced = run_in_thread(lambda: put_until_shutdown(pool.queue, range(5)), "producer")
    gate.wait_reached()  # the consumer holds item 0
    wait_for_waiters(pool.queue.not_full, 1)  # item 1 fills the queue; item 2 waits

    gate.open()  # the only consumer dies

    join_or_fail(producer)
    report = pool.stop(timeout=MUST_HAPPEN)
    assert produced["result"] == 2
    assert (report.processed, report.failed, report.discarded) == (0, 1, (1,))
    assert report.terminated
    [critical] = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert critical.exc_info is not None
    assert critical.exc_info[0] is SystemExit


# --- the consumer pool -------------------------------------------------------------------------


def test_stop_lets_the_consumers_finish_everything_queued_within_the_budget() -> None:
    """A graceful stop hands every queued item to the handler, then every consumer ends."""
    handled: list[int] = []
    pool: ConsumerPool[int] = ConsumerPool(handled.append, consumers=3, name="drain")
    for item in range(50):
        pool.put(item)
    pool.start()

    report = pool.stop(timeout=MUST_HAPPEN)

    assert (report.processed, report.failed, report.discarded) == (50, 0, ())
    assert report.terminated
    assert sorted(handled) == list(range(50))
    with pytest.raises(ShutDown):
        pool.put(50)


def test_stop_immediate_discards_exactly_what_was_still_queued() -> None:
    """stop(immediate=True) lists every item it dropped; the item being handled finishes."""
    gate = Gate("handler on item 0")
    handled: list[int] = []

    def handler(item: int) -> None:
        if item == 0:
            gate.arrive()
        handled.append(item)

    pool: ConsumerPool[int] = ConsumerPool(handler, consumers=1, name="now")
    for item in range(6):
        pool.put(item)
    pool.start()
    gate.wait_reached()

    first = pool.stop(immediate=True, timeout=0)
    gate.open()
    for thread in pool.threads:
        join_or_fail(thread)  # the item in hand is finished, then the consumer ends

    assert first.discarded == (1, 2, 3, 4, 5)
    assert (first.terminated, first.still_running) == (False, ("now-0",))
    assert first.processed == 0
    assert handled == [0]
    assert pool.stop(immediate=True, timeout=MUST_HAPPEN) is first  # the report is final


def test_stop_drains_until_its_deadline_then_discards_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """stop(timeout) returns on its budget with a stuck handler, naming it and what it dropped."""
    gate = Gate("stuck handler")
    handled: list[int] = []

    def handler(item: int) -> None:
        if item == 0:
            gate.arrive()
        handled.append(item)

    pool: ConsumerPool[int] = ConsumerPool(handler, consumers=1, name="stuck")
    for item in range(4):
        pool.put(item)
    pool.start()
    gate.wait_reached()

    report = pool.stop(timeout=0.05)  # returns although the handler never will by itself

    assert (report.terminated, report.still_running) == (False, ("stuck-0",))
    assert report.discarded == (1, 2, 3)
    assert "ran out of time" in caplog.text
    gate.open()
    for thread in pool.threads:
        join_or_fail(thread)  # the stuck consumer finishes its item, then finds the queue shut
    assert handled == [0]
    assert pool.stop(timeout=MUST_HAPPEN) is report


def test_stop_is_idempotent_and_returns_the_first_report() -> None:
    """A second stop(), whatever its arguments, returns the very report of the first."""
    pool: ConsumerPool[int] = ConsumerPool(lambda item: None, consumers=2, name="twice")
    pool.start()
    for item in range(10):
        pool.put(item)

    first = pool.stop(timeout=MUST_HAPPEN)

    assert first.terminated
    assert (first.processed, first.failed, first.discarded) == (10, 0, ())
    assert pool.stop(timeout=MUST_HAPPEN) is first
    assert pool.stop(timeout=0, immediate=True) is first
    assert pool.stop() is first


def test_a_failing_handler_is_logged_and_its_consumer_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each handler exception is logged with its traceback, and the consumer takes the next item."""
    handled: list[int] = []

    def handler(item: int) -> None:
        if item % 2:
            raise ValueError(f"odd item {item}")
        handled.append(item)

    pool: ConsumerPool[int] = ConsumerPool(handler, consumers=1, name="flaky")
    for item in range(6):
        pool.put(item)
    pool.start()
    report = pool.stop(timeout=MUST_HAPPEN)

    assert (report.processed, report.failed) == (3, 3)
    assert handled == [0, 2, 4]  # one consumer, so it survived every failure
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 3
    assert all(r.exc_info is not None and r.exc_info[0] is ValueError for r in errors)


@pytest.mark.parametrize(
    "fatal", [SystemExit("a library gave up"), KeyboardInterrupt()], ids=["SystemExit", "Ctrl-C"]
)
def test_one_dead_consumer_is_logged_and_the_others_go_on(
    caplog: pytest.LogCaptureFixture, fatal: BaseException
) -> None:
    """A consumer killed by sys.exit() is logged at CRITICAL; the queue stays open for the rest."""
    handled: list[object] = []

    def handler(item: object) -> None:
        if item == "exit":
            raise fatal
        handled.append(item)

    pool: ConsumerPool[object] = ConsumerPool(handler, consumers=2, name="half")
    pool.put("exit")
    for item in range(10):
        pool.put(item)
    pool.start()
    joiner, _ = run_in_thread(pool.queue.join, "joiner")
    join_or_fail(joiner)  # every item handed out and done

    assert not pool.queue.is_shutdown  # one consumer is still there
    report = pool.stop(timeout=MUST_HAPPEN)
    assert (report.processed, report.failed, report.discarded) == (10, 1, ())
    assert report.terminated
    assert sorted(handled) == list(range(10))
    assert [r.levelno for r in caplog.records] == [logging.CRITICAL]


def test_the_context_manager_starts_and_stops_the_pool() -> None:
    """Leaving the with-block stops the pool: everything queued is handled and every thread ends."""
    handled: list[int] = []
    with ConsumerPool(handled.append, consumers=2, name="with") as pool:
        for item in range(20):
            pool.put(item)
    assert sorted(handled) == list(range(20))
    assert not any(thread.is_alive() for thread in pool.threads)
    with pytest.raises(ShutDown):
        pool.put(20)


def test_a_pool_starts_once_and_never_after_stop() -> None:
    """start() twice, or after stop(), is a RuntimeError rather than a second set of threads."""
    pool: ConsumerPool[int] = ConsumerPool(lambda item: None, name="once")
    pool.start()
    with pytest.raises(RuntimeError, match="only once"):
        pool.start()
    assert pool.stop(timeout=MUST_HAPPEN).terminated
    with pytest.raises(RuntimeError, match="only once"):
        pool.start()


def test_stopping_a_pool_that_never_started_discards_what_was_queued() -> None:
    """Without consumers nothing would ever take the queued items, so stop() reports them."""
    pool: ConsumerPool[int] = ConsumerPool(lambda item: None, name="unstarted")
    pool.put(1)
    pool.put(2)

    report = pool.stop()

    assert (report.processed, report.discarded) == (0, (1, 2))
    assert (report.terminated, report.still_running) == (True, ())
    with pytest.raises(RuntimeError, match="only once"):
        pool.start()


def test_a_handler_can_stop_its_own_pool_without_deadlocking() -> None:
    """stop() from a handler is a request: it names its own thread; the last one out reports."""
    reports = []

    def handler(item: str) -> None:
        if item == "stop":
            reports.append(pool.stop(immediate=True, timeout=0))

    pool: ConsumerPool[str] = ConsumerPool(handler, consumers=1, name="self")
    for item in ["a", "stop", "b", "c"]:
        pool.put(item)
    pool.start()

    for thread in pool.threads:
        join_or_fail(thread)  # the consumer finishes "stop", then finds the queue shut

    [inner] = reports
    assert (inner.discarded, inner.still_running) == (("b", "c"), ("self-0",))
    assert (inner.processed, inner.terminated) == (1, False)
    final = pool.stop(timeout=0)  # recorded by the consumer as it ended: no waiting needed
    assert (final.terminated, final.processed, final.discarded) == (True, 2, ("b", "c"))
    assert pool.stop(timeout=MUST_HAPPEN) is final


def test_a_bounded_pool_put_times_out_with_full() -> None:
    """pool.put() passes its timeout to the queue: a full, bounded pool raises queue.Full."""
    pool: ConsumerPool[int] = ConsumerPool(lambda item: None, maxsize=1, name="full")
    pool.put(1)
    with pytest.raises(queue.Full):
        pool.put(2, timeout=0)
    assert pool.stop().discarded == (1,)


# --- start() all-or-nothing, and stop() in every window of start() -------------------------------

CONSUMERS = 3


@contextmanager
def thread_start_hook(
    prefix: str, k: int, hook: Callable[[Callable[[], None]], None]
) -> Iterator[None]:
    """Run ``hook(real_start)`` instead of ``Thread.start`` for the k-th thread named ``prefix-*``.

    The other threads start as usual. ``hook`` decides where, relative to the real start,
    the failure or the checkpoint lands. It patches the standard library's ``Thread.start``,
    never the pool, so the pool's own logic runs unchanged.
    """
    real_start = threading.Thread.start
    calls = 0

    def start(thread: threading.Thread) -> None:
        nonlocal calls
        if not thread.name.startswith(f"{prefix}-"):
            real_start(thread)
            return
        calls += 1
        if calls == k:
            hook(lambda: real_start(thread))
        else:
            real_start(thread)

    with mock.patch.object(threading.Thread, "start", start):
        yield


def cannot_start(real_start: Callable[[], None]) -> None:
    """What ``Thread.start`` raises when the OS refuses a new thread; the thread never runs."""
    raise RuntimeError("can't start new thread")


def interrupt_here(real_start: Callable[[], None]) -> None:
    """Deliver a KeyboardInterrupt to the main thread right here, before the thread starts."""
    _thread.interrupt_main()
    deliver_pending_interrupt()


def interrupt_after_start(real_start: Callable[[], None]) -> None:
    """Start the thread, then deliver a KeyboardInterrupt before Thread.start() returns."""
    real_start()
    _thread.interrupt_main()
    deliver_pending_interrupt()


def deliver_pending_interrupt() -> None:
    """Run bytecode until the pending interrupt is raised; fail if it never comes.

    ``interrupt_main()`` only sets a flag that the main thread's eval loop checks between
    instructions, so the interrupt lands inside this loop, not at a random later point.
    """
    deadline = time.monotonic() + MUST_HAPPEN
    while time.monotonic() < deadline:
        pass
    raise AssertionError("the KeyboardInterrupt was never delivered")


def assert_pool_fully_stopped(pool: ConsumerPool[Any], queued: list[Any]) -> None:
    """After a failed start: no consumer runs, stop() reports that, nothing queued is lost."""
    for thread in pool.threads:
        join_or_fail(thread)  # "what started is stopped": bounded, and nothing left running
    report = pool.stop(timeout=MUST_HAPPEN)  # never raises, whatever start() left behind
    assert report.terminated
    assert report.still_running == ()
    assert report.processed + report.failed + len(report.discarded) == len(queued)
    assert pool.queue.is_shutdown
    with pytest.raises(ShutDown):
        pool.put("after a failed start")
    assert pool.stop(timeout=0) is report  # idempotent


@pytest.mark.parametrize("k", range(1, CONSUMERS + 1))
@pytest.mark.parametrize(
    ("hook", "error"),
    [
        (cannot_start, RuntimeError),
        (interrupt_here, KeyboardInterrupt),
        (interrupt_after_start, KeyboardInterrupt),
    ],
    ids=["cannot-start", "interrupt-before-start", "interrupt-after-start"],
)
def test_a_start_failing_part_way_stops_what_started_and_re_raises(
    k: int, hook: Callable[[Callable[[], None]], None], error: type[BaseException]
) -> None:
    """If the k-th consumer cannot start, start() stops the others and re-raises; stop() is safe."""
    assert threading.current_thread() is threading.main_thread()  # interrupt_main's target
    handled: list[int] = []
    pool: ConsumerPool[int] = ConsumerPool(handled.append, consumers=CONSUMERS, name="partial")
    queued = list(range(20))
    for item in queued:
        pool.put(item)

    with thread_start_hook("partial", k, hook), pytest.raises(error):
        pool.start()

    assert_pool_fully_stopped(pool, queued)
    assert sorted([*handled, *pool.stop(timeout=0).discarded]) == queued


def test_a_producer_blocked_during_a_failed_start_wakes_with_shut_down() -> None:
    """A failed start() closes the queue, so a producer waiting on a full queue does not hang."""
    gate = Gate("first consumer's handler")
    handled: list[int] = []

    def handler(item: int) -> None:
        gate.arrive()
        handled.append(item)

    pool: ConsumerPool[int] = ConsumerPool(
        handler, consumers=CONSUMERS, maxsize=1, name="stranded", stop_timeout=0.05
    )
    producer, produced = run_in_thread(lambda: put_until_shutdown(pool.queue, range(5)), "producer")

    def fail_while_the_queue_is_full(real_start: Callable[[], None]) -> None:
        gate.wait_reached()  # consumer 0 holds item 0 ...
        wait_for_waiters(pool.queue.not_full, 1)  # ... item 1 fills the queue, item 2 waits
        raise RuntimeError("can't start new thread")

    with (
        thread_start_hook("stranded", 2, fail_while_the_queue_is_full),
        pytest.raises(RuntimeError, match="can't start new thread"),
    ):
        pool.start()

    join_or_fail(producer)  # woken by the closed queue, while consumer 0 is still busy
    assert produced["result"] == 2  # item 2 was refused with ShutDown
    gate.open()
    assert_pool_fully_stopped(pool, [0, 1])
    report = pool.stop(timeout=0)
    assert (report.processed, report.discarded, handled) == (1, (1,), [0])


@pytest.mark.parametrize(
    "stop",
    [
        lambda pool: pool.stop(timeout=MUST_HAPPEN),
        lambda pool: pool.stop(immediate=True, timeout=MUST_HAPPEN),
    ],
    ids=["stop", "stop-immediate"],
)
@pytest.mark.parametrize("k", range(1, CONSUMERS + 1))
def test_a_stop_from_another_thread_while_start_runs_is_bounded_and_never_raises(
    k: int, stop: Callable[[ConsumerPool[int]], Any]
) -> None:
    """A stop() landing while start() is between consumers returns a report, no error."""
    gate = Gate(f"start of consumer {k}")
    handled: list[int] = []
    pool: ConsumerPool[int] = ConsumerPool(handled.append, consumers=CONSUMERS, name="racing")
    queued = list(range(20))
    for item in queued:
        pool.put(item)

    def park_then_start(real_start: Callable[[], None]) -> None:
        gate.arrive()  # start() is here: consumers 0..k-2 started, consumer k-1 not yet
        real_start()

    with thread_start_hook("racing", k, park_then_start):
        starter, started = run_in_thread(pool.start, "starter")
        gate.wait_reached()
        stopper, stopped = run_in_thread(lambda: stop(pool), "stopper")
        stopper.join(STAYS_BLOCKED)  # a naive stop() fails at once; a correct one may wait
        gate.open()
        join_or_fail(starter)
        join_or_fail(stopper)

    assert "error" not in stopped, stopped
    assert "error" not in started, started
    report = stopped["result"]
    assert report.terminated
    assert pool.stop(timeout=MUST_HAPPEN) is report
    assert not any(thread.is_alive() for thread in pool.threads)
    assert sorted([*handled, *report.discarded]) == queued


def test_enter_failing_part_way_leaves_nothing_running() -> None:
    """A with-block whose start() fails part-way raises, and no consumer is left running."""
    pool: ConsumerPool[int] = ConsumerPool(lambda item: None, consumers=CONSUMERS, name="enter")
    pool.put(1)
    entered = False

    with thread_start_hook("enter", 2, cannot_start), pytest.raises(RuntimeError), pool:
        entered = True

    assert entered is False
    assert_pool_fully_stopped(pool, [1])


@pytest.mark.parametrize("k", range(1, CONSUMERS + 1))
def test_a_stop_from_a_signal_handler_inside_start_neither_deadlocks_nor_raises(k: int) -> None:
    """A stop() in a signal handler inside start() returns on its budget; the consumers then end."""
    assert threading.current_thread() is threading.main_thread()  # where handlers run
    handled: list[int] = []
    pool: ConsumerPool[int] = ConsumerPool(handled.append, consumers=CONSUMERS, name="signal")
    queued = list(range(20))
    for item in queued:
        pool.put(item)
    reports: list[Any] = []

    def handler(signum: int, frame: object) -> None:
        reports.append(pool.stop(timeout=0.1))

    def signal_then_start(real_start: Callable[[], None]) -> None:
        _thread.interrupt_main(signal.SIGUSR1)  # start() holds the pool's lock right here
        deadline = time.monotonic() + MUST_HAPPEN
        while not reports:  # the handler runs between two bytecodes of this loop
            assert time.monotonic() < deadline, "the signal handler never ran"
        real_start()

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        with thread_start_hook("signal", k, signal_then_start):
            pool.start()  # a plain Lock here would deadlock inside the handler
    finally:
        signal.signal(signal.SIGUSR1, previous)

    [inside] = reports
    # The running consumers wait for the lock start() holds, so they outlive this budget;
    # the k-th is listed and about to start, so it is running too as far as stop() knows.
    assert inside.still_running == tuple(f"signal-{i}" for i in range(k))
    assert len(pool.threads) == k  # the stop won: no consumer after the k-th was started
    for thread in pool.threads:
        join_or_fail(thread)  # once start() lets go of the lock, each finds the queue shut
    assert pool.stop(timeout=MUST_HAPPEN) is inside
    assert sorted([*handled, *inside.discarded]) == queued


# --- the lifecycle contract's details ----------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "bad"),
    [
        ({"consumers": 0}, "consumers"),
        ({"maxsize": -1}, "maxsize"),
        ({"stop_timeout": -1}, "stop_timeout"),
    ],
)
def test_the_constructor_names_a_bad_option_and_starts_nothing(
    options: dict[str, Any], bad: str
) -> None:
    """A bad option is a ValueError that names it; a good constructor starts no thread."""
    with pytest.raises(ValueError, match=bad):
        ConsumerPool(lambda item: None, **options)
    pool: ConsumerPool[int] = ConsumerPool(lambda item: None, stop_timeout=0.5)
    assert (pool.threads, pool.stop_timeout) == ([], 0.5)


def test_stop_refuses_a_negative_timeout() -> None:
    """stop(-1) is a ValueError, and the pool can still be stopped properly afterwards."""
    pool: ConsumerPool[int] = ConsumerPool(lambda item: None, name="negative").start()
    with pytest.raises(ValueError, match="timeout"):
        pool.stop(-1)
    assert pool.stop(MUST_HAPPEN).terminated


def test_stop_without_a_timeout_uses_stop_timeout_not_forever() -> None:
    """stop() with no argument is bounded by stop_timeout, even when a handler never returns."""
    gate = Gate("stuck handler")
    pool: ConsumerPool[int] = ConsumerPool(
        lambda item: gate.arrive(), consumers=1, name="budget", stop_timeout=0.05
    )
    pool.put(1)
    pool.start()
    gate.wait_reached()

    report = pool.stop()

    assert (report.terminated, report.still_running) == (False, ("budget-0",))
    gate.open()
    join_or_fail(pool.threads[0])


def test_entering_a_started_pool_returns_it_and_a_stopped_one_raises() -> None:
    """Entering a running pool returns it and stops it at the end; a stopped pool is refused."""
    handled: list[int] = []
    pool: ConsumerPool[int] = ConsumerPool(handled.append, name="entered").start()
    with pool as entered:
        assert entered is pool
        pool.put(1)
    assert pool.stop(0).terminated  # __exit__ stopped it
    assert handled == [1]
    with pytest.raises(RuntimeError, match="stopped"), pool:
        pass
    with pytest.raises(RuntimeError, match="only once"):
        pool.start()


def test_with_pool_start_lets_the_program_exit() -> None:
    """With ConsumerPool(...).start() as pool: works, and the interpreter exits (code 0)."""
    code = (
        "from patterns.closable_queue import ConsumerPool\n"
        "handled = []\n"
        "with ConsumerPool(handled.append, name='exits').start() as pool:\n"
        "    for i in range(10):\n"
        "        pool.put(i)\n"
        "print(sorted(handled) == list(range(10)), pool.stop().terminated)\n"
    )
    done = run_python(code)
    assert (done.returncode, done.stdout.split()) == (0, ["True", "True"]), done.stderr


def test_a_stop_made_while_another_is_running_waits_for_it_and_returns_its_report() -> None:
    """A second, concurrent stop() waits within its budget and returns the first's report."""
    gate = Gate("handler during the first stop")
    pool: ConsumerPool[int] = ConsumerPool(lambda item: gate.arrive(), consumers=1, name="two")
    pool.put(1)
    pool.start()
    gate.wait_reached()
    first, first_outcome = run_in_thread(lambda: pool.stop(MUST_HAPPEN), "first stopper")
    wait_until(lambda: pool.queue.is_shutdown, "the first stop() has begun")
    second, second_outcome = run_in_thread(lambda: pool.stop(MUST_HAPPEN), "second stopper")

    assert stays_blocked(second)  # it waits for the first instead of reporting half-way
    gate.open()
    join_or_fail(first)
    join_or_fail(second)
    assert second_outcome["result"] is first_outcome["result"]
    assert first_outcome["result"].terminated


def test_a_stop_interrupted_by_ctrl_c_can_be_done_again_and_then_is_final() -> None:
    """A KeyboardInterrupt inside stop() propagates; the next stop() does the stop and reports."""
    handled: list[int] = []
    pool: ConsumerPool[int] = ConsumerPool(handled.append, consumers=1, name="ctrl-c").start()
    pool.put(1)

    with (
        mock.patch.object(threading.Thread, "join", side_effect=KeyboardInterrupt),
        pytest.raises(KeyboardInterrupt),
    ):
        pool.stop(MUST_HAPPEN)

    report = pool.stop(MUST_HAPPEN)
    assert (report.terminated, report.still_running) == (True, ())
    assert pool.stop() is report
    assert handled == [1]


# --- the lifecycle contract on the paths users take ----------------------------------


def test_a_report_cannot_say_terminated_while_naming_a_running_consumer() -> None:
    """PoolReport refuses terminated=True with a non-empty still_running."""
    with pytest.raises(ValueError, match=r"terminated=True with still_running="):
        PoolReport(True, ("c-0",), 0, 0, (), 0.0)


def test_ctrl_c_during_stop_leaves_the_next_report_truthful() -> None:
    """After a real SIGINT interrupts stop(), stop(0) names the running consumer (gh-90882)."""
    assert threading.current_thread() is threading.main_thread()  # where SIGINT is handled
    gate = Gate("consumer ignoring its stop")
    pool: ConsumerPool[int] = ConsumerPool(lambda item: gate.arrive(), consumers=1, name="sigint")
    pool.put(1)
    pool.start()
    gate.wait_reached()

    with signal_main_during("stop", parked=True), pytest.raises(KeyboardInterrupt):
        pool.stop(MUST_HAPPEN)

    report = pool.stop(0)
    assert (report.terminated, report.still_running) == (False, ("sigint-0",))
    gate.open()
    join_or_fail(pool.threads[0])
    assert pool.stop(MUST_HAPPEN) is report  # the first stop that completed is the record


@pytest.mark.parametrize("seconds", [math.inf, 1e10, 1e300, pytest.param(10**400, id="10**400")])
def test_every_budget_accepts_inf_and_huge_values_as_as_long_as_it_takes(seconds: float) -> None:
    """stop_timeout, stop(timeout) and put(timeout) take inf and 1e10: no OverflowError."""
    gate = Gate("consumer on item 0")

    def handler(item: int) -> None:
        if item == 0:
            gate.arrive()

    pool: ConsumerPool[int] = ConsumerPool(
        handler, consumers=1, maxsize=1, name="huge", stop_timeout=seconds
    )
    assert pool.stop_timeout == (math.inf if seconds > 1e308 else seconds)
    pool.put(0, timeout=seconds)
    pool.start()
    gate.wait_reached()
    pool.put(1, timeout=seconds)  # the queue is full now
    putter, put = run_in_thread(lambda: pool.put(2, timeout=seconds), "putter")
    wait_for_waiters(pool.queue.not_full, 1)  # parked in a wait that must not overflow
    gate.open()
    join_or_fail(putter)
    assert "error" not in put, put

    report = pool.stop(seconds)
    assert (report.terminated, report.processed, report.discarded) == (True, 3, ())
    assert ConsumerPool(handler, stop_timeout=seconds).stop().terminated  # stop() uses it


@pytest.mark.parametrize(
    "bad", [math.nan, -1, -math.inf, pytest.param(-(10**400), id="-10**400"), True, "5", None]
)
def test_every_budget_refuses_nan_negative_bool_and_str_naming_the_argument(bad: object) -> None:
    """A number of seconds that is nan, negative, a bool or a str is a ValueError naming it."""
    with pytest.raises(ValueError, match="stop_timeout must be a number of seconds"):
        ConsumerPool(lambda item: None, stop_timeout=bad)  # type: ignore[arg-type]
    pool: ConsumerPool[int] = ConsumerPool(lambda item: None, name="bad").start()
    if bad is not None:  # None is valid for these two: stop_timeout, and no time limit
        with pytest.raises(ValueError, match="timeout must be a number of seconds"):
            pool.stop(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="timeout must be a number of seconds"):
            pool.put(1, timeout=bad)  # type: ignore[arg-type]
    assert pool.stop(MUST_HAPPEN).terminated


def test_a_stop_from_a_consumer_is_a_request_the_queue_drains_and_the_last_one_reports(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """stop(5) from a handler returns at once; the pool drains all 20 items and reports it."""
    inner: list[PoolReport[int]] = []

    def handler(item: int) -> None:
        if item == 0:
            inner.append(pool.stop(5.0))

    pool: ConsumerPool[int] = ConsumerPool(handler, consumers=1, name="own")
    for item in range(20):
        pool.put(item)
    pool.start()
    join_or_fail(pool.threads[0])

    [provisional] = inner
    assert (provisional.terminated, provisional.still_running) == (False, ("own-0",))
    final = pool.stop(0)  # recorded by the last consumer as it ended
    assert (final.terminated, final.still_running) == (True, ())
    assert (final.processed, final.failed, final.discarded) == (20, 0, ())
    assert pool.stop(MUST_HAPPEN) is final
    assert "ran out of time" not in caplog.text


def test_a_second_stop_while_one_runs_is_bounded_by_its_own_budget() -> None:
    """stop(0.2) during another stop() returns provisionally after 0.2 s; the first one records."""
    gate = Gate("consumer during the first stop")
    pool: ConsumerPool[int] = ConsumerPool(lambda item: gate.arrive(), consumers=1, name="bound")
    pool.put(1)
    pool.start()
    gate.wait_reached()
    first, first_outcome = run_in_thread(lambda: pool.stop(MUST_HAPPEN), "first stopper")
    wait_until(lambda: pool.queue.is_shutdown, "the first stop() closed the queue")

    began = time.monotonic()
    second = pool.stop(0.2)
    took = time.monotonic() - began

    assert 0.2 <= took < 0.2 + NOISE
    assert (second.terminated, second.still_running) == (False, ("bound-0",))
    gate.open()
    join_or_fail(first)
    assert first_outcome["result"].terminated
    assert pool.stop(0) is first_outcome["result"]


def test_a_stop_from_a_signal_handler_inside_stop_returns_at_once() -> None:
    """A handler's stop() while the main thread waits in stop() returns provisionally at once."""
    assert threading.current_thread() is threading.main_thread()
    gate = Gate("consumer during stop")
    pool: ConsumerPool[int] = ConsumerPool(lambda item: gate.arrive(), consumers=1, name="nested")
    pool.put(1)
    pool.start()
    gate.wait_reached()
    inside: list[tuple[PoolReport[int], float]] = []

    def handler(signum: int, frame: object) -> None:
        began = time.monotonic()
        inside.append((pool.stop(MUST_HAPPEN), time.monotonic() - began))
        gate.open()  # now let the outer stop() finish

    with signal_main_during("stop", handler, signum=signal.SIGUSR1, parked=True):
        outer = pool.stop(MUST_HAPPEN)

    [(provisional, took)] = inside
    assert took < NOISE
    assert (provisional.terminated, provisional.still_running) == (False, ("nested-0",))
    assert outer.terminated
    assert pool.stop(0) is outer


def test_a_stop_from_a_signal_handler_landing_inside_put_does_not_deadlock() -> None:
    """A handler's stop() landing while put() holds the queue's lock hands off; no deadlock."""
    # The profile hook raises a real SIGUSR1 from inside put(), once put() holds the queue's
    # mutex (it is about to call _put); raise_signal() runs the Python handler right there.
    code = """if True:
        import json, signal, sys, threading
        from patterns.closable_queue import ConsumerPool

        handled = []
        pool = ConsumerPool(handled.append, consumers=2, name="sig")
        pool.start()
        inside = []
        signal.signal(signal.SIGUSR1, lambda signum, frame: inside.append(pool.stop(5.0)))

        def profile(frame, event, arg):
            if event == "call" and frame.f_code.co_name == "_put":
                if frame.f_locals.get("self") is pool.queue:
                    sys.setprofile(None)
                    assert pool.queue.mutex.locked()
                    signal.raise_signal(signal.SIGUSR1)

        pool.put(0)
        sys.setprofile(profile)
        pool.put(1)
        sys.setprofile(None)
        [provisional] = inside
        final = pool.stop(10)
        for thread in threading.enumerate():
            if thread is not threading.main_thread():
                thread.join(10)
        print(json.dumps({
            "provisional": [provisional.terminated, list(provisional.still_running)],
            "final": [final.terminated, final.processed, list(final.discarded)],
            "same": pool.stop(0) is final,
            "handled": sorted(handled),
            "left": [t.name for t in threading.enumerate() if t is not threading.main_thread()],
        }))
    """
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "provisional": [False, ["sig-0", "sig-1"]],
        "final": [True, 2, []],
        "same": True,
        "handled": [0, 1],
        "left": [],
    }
