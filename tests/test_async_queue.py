"""Async closable queue: every rule of asyncio.Queue.shutdown(), and the sentinel race it fixes.

The semantic tests take the queue class as a parameter: the back-port everywhere and, on
Python 3.13, the standard `asyncio.Queue` too. On 3.13 the back-port is still defined (under
its private name) and runs its own code, so it is checked against the real thing rule for
rule on the same interpreter. Each test is a plain function that runs its scenario with
``asyncio.run``; every wait is bounded, and "stays waiting" is observed, never slept for.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar
from unittest import mock

import pytest

from patterns.async_queue import (
    AsyncConsumerPool,
    AsyncLifoQueueBackport,
    AsyncPoolReport,
    AsyncPriorityQueueBackport,
    AsyncQueueBackport,
    ClosableAsyncLifoQueue,
    ClosableAsyncPriorityQueue,
    ClosableAsyncQueue,
    QueueShutDown,
    consume_until_shutdown,
    put_until_shutdown,
    shutdown_and_drain,
)
from patterns.naive.async_queue import STOP, Stop, naive_consume, naive_stop
from tests.support import MUST_HAPPEN, NOISE, STAYS_BLOCKED, drain

PY313 = sys.version_info >= (3, 13)

A1 = ("A1", "one sentinel for N consumer tasks leaves N-1 waiting in get() forever")

# As in test_closable_queue: the stdlib parameter is generated only where asyncio.Queue has
# shutdown() (3.13+, pinned by test_asyncio_queue_shutdown_exists_exactly_from_3_13_on),
# rather than skipped everywhere else.
QUEUE_CLASSES = [pytest.param(AsyncQueueBackport, id="backport")]
if hasattr(asyncio.Queue, "shutdown"):
    QUEUE_CLASSES.append(pytest.param(asyncio.Queue, id="stdlib"))

PUTS: dict[str, Callable[[Any, object], Awaitable[None]]] = {
    "put": lambda q, x: q.put(x),
    "put_nowait": lambda q, x: _ready(q.put_nowait, x),
}
GETS: dict[str, Callable[[Any], Awaitable[object]]] = {
    "get": lambda q: q.get(),
    "get_nowait": lambda q: _ready(q.get_nowait),
}

both_ways = pytest.mark.parametrize("immediate", [False, True], ids=["graceful", "immediate"])

R = TypeVar("R")


async def _ready(fn: Callable[..., R], *args: object) -> R:
    """Call a non-blocking method inside a coroutine, so puts and gets share one shape."""
    return fn(*args)


def run(scenario: Coroutine[Any, Any, R]) -> R:
    """Run a test's scenario on a fresh loop; a hang becomes a TimeoutError, not a stuck run."""

    async def bounded() -> R:
        return await asyncio.wait_for(scenario, 3 * MUST_HAPPEN)

    return asyncio.run(bounded())


@pytest.fixture(params=QUEUE_CLASSES)
def make_queue(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """The queue class under test: the back-port, and asyncio.Queue where it has shutdown()."""
    return request.param


async def parked(waiters: Any, count: int) -> None:
    """Let the loop run until ``count`` tasks wait in ``waiters`` (a queue's or an Event's).

    It reads the private list of futures the tasks await: an observation of where they
    are. Each ``sleep(0)`` gives every ready task one step, so a few suffice.
    """
    for _ in range(1000):
        if sum(not waiter.done() for waiter in waiters) == count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never saw {count} task(s) waiting")


async def still_pending(tasks: set[asyncio.Task[Any]]) -> bool:
    """True if none of ``tasks`` ends while we watch; only the test can release them."""
    done, _ = await asyncio.wait(tasks, timeout=STAYS_BLOCKED)
    return not done


async def outcome(task: asyncio.Task[Any]) -> Any:
    """The task's result, or the exception it raised (as an object), within MUST_HAPPEN."""
    await asyncio.wait({task}, timeout=MUST_HAPPEN)
    assert task.done(), f"{task.get_name()} did not end within {MUST_HAPPEN}s"
    if task.cancelled():
        return asyncio.CancelledError()
    return task.exception() or task.result()


# --- before shutdown, and the names ----------------------------------------------------------


def test_before_shutdown_it_is_an_ordinary_fifo_queue(make_queue: Callable[..., Any]) -> None:
    """Until shutdown() nothing changes: FIFO order, QueueEmpty, QueueFull, task_done and join."""

    async def scenario() -> None:
        q = make_queue(maxsize=2)
        await q.put("a")
        q.put_nowait("b")
        with pytest.raises(asyncio.QueueFull):
            q.put_nowait("c")
        assert [await q.get(), q.get_nowait()] == ["a", "b"]
        with pytest.raises(asyncio.QueueEmpty):
            q.get_nowait()
        q.task_done()
        q.task_done()
        await asyncio.wait_for(q.join(), MUST_HAPPEN)  # every item is done
        with pytest.raises(ValueError, match="too many times"):
            q.task_done()

    run(scenario())


def test_queue_shut_down_is_its_own_exception_not_empty_or_full() -> None:
    """QueueShutDown is an Exception; code catching QueueEmpty or QueueFull does not swallow it."""
    assert issubclass(QueueShutDown, Exception)
    assert not issubclass(QueueShutDown, (asyncio.QueueEmpty, asyncio.QueueFull))


@both_ways
def test_asyncio_queue_has_no_public_is_shutdown(
    make_queue: Callable[..., Any], immediate: bool
) -> None:
    """Unlike queue.Queue, asyncio.Queue has no is_shutdown attribute, before or after shutdown."""
    q = make_queue()
    assert not hasattr(q, "is_shutdown")
    q.shutdown(immediate=immediate)
    assert not hasattr(q, "is_shutdown")


@both_ways
def test_repr_says_shutdown_once_shut_down(make_queue: Callable[..., Any], immediate: bool) -> None:
    """repr(q) ends with "shutdown" after shutdown() and not before, as 3.13's does."""
    q = make_queue()
    q.put_nowait("a")
    assert "shutdown" not in repr(q)
    q.shutdown(immediate=immediate)
    assert repr(q).endswith(" shutdown>")
    assert repr(q).count("shutdown") == 1


def test_the_closable_queues_are_asyncio_queue_subclasses_and_generic() -> None:
    """Each stands in for its asyncio counterpart, and ClosableAsyncQueue[int] works at runtime."""
    assert issubclass(ClosableAsyncQueue, asyncio.Queue)
    assert issubclass(ClosableAsyncPriorityQueue, asyncio.PriorityQueue)
    assert issubclass(ClosableAsyncLifoQueue, asyncio.LifoQueue)
    assert issubclass(ClosableAsyncPriorityQueue, ClosableAsyncQueue)
    assert ClosableAsyncQueue[int]().maxsize == 0


def test_on_3_13_the_names_are_the_standard_library_and_before_it_the_back_port() -> None:
    """3.13+: the public names are asyncio's own objects; before: the back-port classes."""
    if PY313:
        assert QueueShutDown is asyncio.QueueShutDown  # type: ignore[attr-defined]
        assert ClosableAsyncQueue is asyncio.Queue
        assert ClosableAsyncPriorityQueue is asyncio.PriorityQueue
        assert ClosableAsyncLifoQueue is asyncio.LifoQueue
    else:
        assert QueueShutDown.__module__ == "patterns.async_queue"
        assert ClosableAsyncQueue is AsyncQueueBackport
        assert ClosableAsyncPriorityQueue is AsyncPriorityQueueBackport
        assert ClosableAsyncLifoQueue is AsyncLifoQueueBackport
    # The back-port overrides only what shutdown() changes; the rest is asyncio.Queue's.
    for name in ("put", "put_nowait", "get", "get_nowait", "shutdown"):
        assert name in vars(AsyncQueueBackport)
    for name in ("task_done", "join", "qsize", "empty", "full"):
        assert getattr(AsyncQueueBackport, name) is getattr(asyncio.Queue, name)


# --- what each Python version has: the claims of the docs page, on the version that runs ---


def test_asyncio_queue_shutdown_exists_exactly_from_3_13_on() -> None:
    """asyncio.Queue.shutdown and asyncio.QueueShutDown exist on 3.13 and not before."""
    assert hasattr(asyncio.Queue, "shutdown") is PY313
    assert hasattr(asyncio.PriorityQueue, "shutdown") is PY313
    assert hasattr(asyncio.LifoQueue, "shutdown") is PY313
    assert hasattr(asyncio, "QueueShutDown") is PY313
    # so the stdlib parametrisation exists on exactly the versions that have something to test
    expected = ["backport", "stdlib"] if PY313 else ["backport"]
    assert [param.id for param in QUEUE_CLASSES] == expected


def test_asyncio_and_thread_queues_raise_different_shut_down_exceptions() -> None:
    """On 3.13, except queue.ShutDown does not catch asyncio.QueueShutDown, nor the reverse."""
    if PY313:
        assert not issubclass(asyncio.QueueShutDown, queue.ShutDown)  # type: ignore[attr-defined]
        assert not issubclass(queue.ShutDown, asyncio.QueueShutDown)  # type: ignore[attr-defined]
    else:
        assert not hasattr(queue, "ShutDown")


# --- put after shutdown ------------------------------------------------------------------------


@both_ways
@pytest.mark.parametrize("maxsize", [0, 1, 3], ids=["unbounded", "full", "room"])
@pytest.mark.parametrize("put", list(PUTS.values()), ids=list(PUTS))
def test_every_put_raises_queue_shut_down_after_shutdown_and_adds_nothing(
    make_queue: Callable[..., Any],
    immediate: bool,
    maxsize: int,
    put: Callable[..., Awaitable[None]],
) -> None:
    """After shutdown every put raises QueueShutDown, ahead of QueueFull, and adds nothing."""

    async def scenario() -> None:
        q = make_queue(maxsize=maxsize)
        q.put_nowait("queued")
        q.shutdown(immediate=immediate)
        size, unfinished = q.qsize(), q._unfinished_tasks

        with pytest.raises(QueueShutDown):
            await put(q, "late")

        assert (q.qsize(), q._unfinished_tasks) == (size, unfinished)
        assert drain(q, QueueShutDown) == ([] if immediate else ["queued"])

    run(scenario())


# --- get after shutdown ------------------------------------------------------------------------


@pytest.mark.parametrize("maxsize", [0, 3], ids=["unbounded", "bounded"])
@pytest.mark.parametrize("get", list(GETS.values()), ids=list(GETS))
def test_get_hands_out_what_was_queued_in_order_then_raises_queue_shut_down(
    make_queue: Callable[..., Any], maxsize: int, get: Callable[[Any], Awaitable[object]]
) -> None:
    """A graceful shutdown keeps queued items for get(); the empty queue then raises."""

    async def scenario() -> None:
        q = make_queue(maxsize=maxsize)
        for item in range(3):
            q.put_nowait(item)
        q.shutdown()

        assert [await get(q), await get(q), await get(q)] == [0, 1, 2]
        with pytest.raises(QueueShutDown):
            await get(q)  # instead of waiting, or raising QueueEmpty
        with pytest.raises(QueueShutDown):
            await get(q)  # and every time after

    run(scenario())


@both_ways
@pytest.mark.parametrize("get", list(GETS.values()), ids=list(GETS))
def test_get_on_an_empty_shut_down_queue_raises_queue_shut_down_not_empty(
    make_queue: Callable[..., Any], immediate: bool, get: Callable[[Any], Awaitable[object]]
) -> None:
    """An empty, shut-down queue answers every get with QueueShutDown, never QueueEmpty."""

    async def scenario() -> None:
        q = make_queue()
        q.shutdown(immediate=immediate)
        with pytest.raises(QueueShutDown):
            await get(q)

    run(scenario())


# --- immediate shutdown and task_done accounting ------------------------------------------------


@pytest.mark.parametrize("maxsize", [0, 3], ids=["unbounded", "bounded"])
def test_immediate_shutdown_empties_the_queue_and_counts_each_item_done(
    make_queue: Callable[..., Any], maxsize: int
) -> None:
    """shutdown(immediate=True) drops what is queued, counts it done, and get raises at once."""

    async def scenario() -> None:
        q = make_queue(maxsize=maxsize)
        for item in range(3):
            q.put_nowait(item)

        q.shutdown(immediate=True)

        assert (q.qsize(), q._unfinished_tasks, q.empty(), q.full()) == (0, 0, True, False)
        with pytest.raises(QueueShutDown):
            await q.get()
        await asyncio.wait_for(q.join(), MUST_HAPPEN)  # nothing is unfinished

    run(scenario())


@pytest.mark.parametrize("in_flight", [0, 1, 2])
def test_immediate_shutdown_wakes_join_which_returns_once_nothing_is_in_flight(
    make_queue: Callable[..., Any], in_flight: int
) -> None:
    """A join() waiting at an immediate shutdown returns once the items already taken are done."""

    async def scenario() -> None:
        q = make_queue()
        for item in range(4):
            q.put_nowait(item)
        taken = [q.get_nowait() for _ in range(in_flight)]
        joiner = asyncio.create_task(q.join(), name="joiner")
        await parked(q._finished._waiters, 1)

        q.shutdown(immediate=True)

        assert q._unfinished_tasks == in_flight
        if in_flight:
            assert await still_pending({joiner})  # join() waits for the items in flight
            for _ in taken:
                q.task_done()
        assert await outcome(joiner) is None

    run(scenario())


def test_graceful_shutdown_leaves_join_waiting_for_the_consumers(
    make_queue: Callable[..., Any],
) -> None:
    """shutdown() without immediate does not release join(); only task_done() per item does."""

    async def scenario() -> None:
        q = make_queue()
        q.put_nowait("a")
        q.put_nowait("b")
        joiner = asyncio.create_task(q.join(), name="joiner")
        await parked(q._finished._waiters, 1)

        q.shutdown()

        assert await still_pending({joiner})
        for _ in range(2):
            await q.get()
            q.task_done()
        assert await outcome(joiner) is None

    run(scenario())


@both_ways
def test_task_done_after_shutdown_works_as_before(
    make_queue: Callable[..., Any], immediate: bool
) -> None:
    """task_done() is unchanged by shutdown: one per item, then ValueError, never QueueShutDown."""

    async def scenario() -> None:
        q = make_queue()
        for item in range(3):
            q.put_nowait(item)
        await q.get()  # in flight across the shutdown
        q.shutdown(immediate=immediate)

        q.task_done()
        for _ in drain(q, QueueShutDown):
            q.task_done()

        assert q._unfinished_tasks == 0
        with pytest.raises(ValueError, match="too many times"):
            q.task_done()

    run(scenario())


def test_immediate_shutdown_never_counts_below_zero(make_queue: Callable[..., Any]) -> None:
    """If task_done() was called early, the items removed stop counting at zero."""
    q = make_queue()
    q.put_nowait("a")
    q.put_nowait("b")
    q.task_done()
    q.task_done()  # early: the items are still queued

    q.shutdown(immediate=True)

    assert (q.qsize(), q._unfinished_tasks) == (0, 0)
    with pytest.raises(ValueError, match="too many times"):
        q.task_done()


# --- tasks already waiting when shutdown() is called -------------------------------------------


@both_ways
@pytest.mark.parametrize("maxsize", [0, 2], ids=["unbounded", "bounded"])
def test_every_getter_waiting_at_shutdown_wakes_with_queue_shut_down(
    make_queue: Callable[..., Any], immediate: bool, maxsize: int
) -> None:
    """One shutdown() wakes every task waiting in get(), and each raises QueueShutDown."""

    async def scenario() -> None:
        q = make_queue(maxsize=maxsize)
        getters = [asyncio.create_task(q.get(), name=f"getter-{i}") for i in range(3)]
        await parked(q._getters, 3)

        q.shutdown(immediate=immediate)

        for getter in getters:
            assert isinstance(await outcome(getter), QueueShutDown)
        assert not q._getters

    run(scenario())


@both_ways
def test_every_putter_waiting_on_a_full_queue_wakes_with_queue_shut_down(
    make_queue: Callable[..., Any], immediate: bool
) -> None:
    """Waiting putters all raise QueueShutDown and their items never enter the queue."""

    async def scenario() -> None:
        q = make_queue(maxsize=2)
        q.put_nowait("a")
        q.put_nowait("b")
        putters = [asyncio.create_task(q.put("late"), name=f"putter-{i}") for i in range(3)]
        await parked(q._putters, 3)

        q.shutdown(immediate=immediate)

        for putter in putters:
            assert isinstance(await outcome(putter), QueueShutDown)
        expected = [] if immediate else ["a", "b"]
        assert q._unfinished_tasks == len(expected)
        assert drain(q, QueueShutDown) == expected

    run(scenario())


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
        q.put_nowait(item)

    q.shutdown(immediate=first)
    q.shutdown(immediate=second)

    left = [] if first or second else [0, 1, 2]
    assert q._unfinished_tasks == len(left)
    assert drain(q, QueueShutDown) == left


def test_another_thread_shuts_the_queue_down_through_call_soon_threadsafe(
    make_queue: Callable[..., Any],
) -> None:
    """From another thread, loop.call_soon_threadsafe(q.shutdown) wakes every waiting task."""

    async def scenario() -> None:
        q = make_queue()
        getters = [asyncio.create_task(q.get(), name=f"getter-{i}") for i in range(2)]
        await parked(q._getters, 2)
        loop = asyncio.get_running_loop()
        thread = threading.Thread(target=loop.call_soon_threadsafe, args=(q.shutdown,))
        thread.start()

        for getter in getters:
            assert isinstance(await outcome(getter), QueueShutDown)
        thread.join(MUST_HAPPEN)
        assert not thread.is_alive()

    run(scenario())


# --- the order of events on one loop: woken, then shut down before running -------------------


@both_ways
def test_a_getter_woken_by_a_put_keeps_the_item_unless_an_immediate_shutdown_comes_first(
    make_queue: Callable[..., Any], immediate: bool
) -> None:
    """A woken getter runs later: a graceful shutdown leaves it the item, an immediate one not."""

    async def scenario() -> None:
        q = make_queue()
        getter = asyncio.create_task(q.get(), name="getter")
        await parked(q._getters, 1)

        q.put_nowait("x")  # wakes the getter, which has not run yet
        q.shutdown(immediate=immediate)

        result = await outcome(getter)
        if immediate:
            assert isinstance(result, QueueShutDown)
            assert q._unfinished_tasks == 0  # "x" was dropped and counted done
        else:
            assert result == "x"
            assert q._unfinished_tasks == 1  # still needs its task_done()

    run(scenario())


@pytest.mark.parametrize("side", ["getter", "putter"])
def test_a_waiter_cancelled_after_being_woken_hands_the_wake_up_on(
    make_queue: Callable[..., Any], side: str
) -> None:
    """A cancelled waiter hands its unused wake-up on; the next one takes the item or the room."""

    async def scenario() -> None:
        q = make_queue(maxsize=1)
        if side == "putter":
            q.put_nowait("occupant")
            first = asyncio.create_task(q.put("first"), name="first")
            await parked(q._putters, 1)
            second = asyncio.create_task(q.put("second"), name="second")
            await parked(q._putters, 2)
            assert q.get_nowait() == "occupant"  # makes room: wakes the first putter
        else:
            first = asyncio.create_task(q.get(), name="first")
            await parked(q._getters, 1)
            second = asyncio.create_task(q.get(), name="second")
            await parked(q._getters, 2)
            q.put_nowait("item")  # wakes the first getter

        first.cancel()  # before it ran: the wake-up it received must not be lost

        assert isinstance(await outcome(first), asyncio.CancelledError)
        result = await outcome(second)
        if side == "putter":
            assert result is None
            assert q.get_nowait() == "second"
        else:
            assert result == "item"
        q.shutdown()
        assert drain(q, QueueShutDown) == []

    run(scenario())


def test_a_cancelled_getter_raises_cancelled_error_and_leaves_no_waiter_behind(
    make_queue: Callable[..., Any],
) -> None:
    """Cancellation wins over the queue: a getter cancelled while waiting raises CancelledError."""

    async def scenario() -> None:
        q = make_queue()
        getter = asyncio.create_task(q.get(), name="getter")
        await parked(q._getters, 1)

        getter.cancel()

        assert isinstance(await outcome(getter), asyncio.CancelledError)
        assert not q._getters
        q.shutdown()
        with pytest.raises(QueueShutDown):
            await q.get()

    run(scenario())


# --- the priority and LIFO variants ------------------------------------------------------------

ORDERED = [
    pytest.param(AsyncPriorityQueueBackport, [1, 2, 3], id="backport-priority"),
    pytest.param(AsyncLifoQueueBackport, [2, 1, 3], id="backport-lifo"),
]
if hasattr(asyncio.Queue, "shutdown"):
    ORDERED += [
        pytest.param(asyncio.PriorityQueue, [1, 2, 3], id="stdlib-priority"),
        pytest.param(asyncio.LifoQueue, [2, 1, 3], id="stdlib-lifo"),
    ]


@pytest.mark.parametrize(("make_ordered", "order"), ORDERED)
def test_priority_and_lifo_queues_drain_in_their_own_order_after_shutdown(
    make_ordered: Callable[..., Any], order: list[int]
) -> None:
    """A graceful shutdown keeps each variant's order; an immediate one empties it too."""

    async def scenario() -> None:
        q = make_ordered()
        for item in (3, 1, 2):
            q.put_nowait(item)
        q.shutdown()
        with pytest.raises(QueueShutDown):
            await q.put(0)
        assert [await q.get() for _ in range(3)] == order
        with pytest.raises(QueueShutDown):
            await q.get()

        q = make_ordered()
        q.put_nowait(1)
        q.shutdown(immediate=True)
        assert (q.qsize(), q._unfinished_tasks) == (0, 0)

    run(scenario())


# --- the helpers -------------------------------------------------------------------------------


def test_shutdown_and_drain_ends_like_an_immediate_shutdown_and_returns_what_it_dropped(
    make_queue: Callable[..., Any],
) -> None:
    """Same final state as shutdown(immediate=True), plus the list of what was dropped."""

    async def scenario() -> None:
        twins = [make_queue(), make_queue()]
        for q in twins:
            for item in range(4):
                q.put_nowait(item)
            await q.get()  # one item in flight

        dropped = shutdown_and_drain(twins[0])
        twins[1].shutdown(immediate=True)

        assert dropped == [1, 2, 3]
        for q in twins:
            assert (q.qsize(), q._unfinished_tasks) == (0, 1)
            with pytest.raises(QueueShutDown):
                q.put_nowait(9)
        assert shutdown_and_drain(twins[0]) == []  # and again: nothing left

    run(scenario())


def test_put_until_shutdown_stops_at_shutdown_and_leaves_the_rest_unread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A producer waiting on a full queue returns how many it delivered; later items stay unread."""

    async def scenario() -> None:
        q: ClosableAsyncQueue[int] = ClosableAsyncQueue(maxsize=1)
        items = iter(range(5))
        producer = asyncio.create_task(put_until_shutdown(q, items), name="producer")
        await parked(q._putters, 1)  # type: ignore[attr-defined]

        q.shutdown(immediate=True)

        assert await outcome(producer) == 1  # item 0 went in; item 1 was refused
        assert next(items) == 2

    run(scenario())
    assert "1 item(s) delivered, 1 refused" in caplog.text


def test_consume_until_shutdown_logs_a_failing_handler_and_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A handler's exception is logged with its traceback; every item gets its task_done()."""

    async def handler(item: str) -> None:
        if item == "bad":
            raise ValueError("cannot handle this one")

    async def scenario() -> int:
        q: ClosableAsyncQueue[str] = ClosableAsyncQueue()
        for item in ("ok", "bad", "ok"):
            q.put_nowait(item)
        q.shutdown()
        handled = await consume_until_shutdown(q, handler)
        await asyncio.wait_for(q.join(), MUST_HAPPEN)  # three task_done() calls
        return handled

    assert run(scenario()) == 2
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.exc_info is not None
    assert record.exc_info[0] is ValueError


def test_consume_until_shutdown_lets_cancellation_through_after_task_done() -> None:
    """Cancelling a consumer mid-item raises CancelledError in it; that item still counts done."""

    async def scenario() -> None:
        q: ClosableAsyncQueue[int] = ClosableAsyncQueue()
        busy = asyncio.Event()

        async def handler(item: int) -> None:
            busy.set()
            await asyncio.Event().wait()  # never set: only cancellation gets it out

        q.put_nowait(1)
        consumer = asyncio.create_task(consume_until_shutdown(q, handler), name="consumer")
        await asyncio.wait_for(busy.wait(), MUST_HAPPEN)

        consumer.cancel()

        assert isinstance(await outcome(consumer), asyncio.CancelledError)
        assert q._unfinished_tasks == 0  # type: ignore[attr-defined]

    run(scenario())


# --- A1: one sentinel for N consumer tasks ---------------------------------------------------


@pytest.mark.race(*A1)
def test_naive_one_sentinel_for_three_consumer_tasks_leaves_two_waiting_forever(
    record_property: Callable[[str, object], None],
) -> None:
    """One sentinel stops one consumer task; the other two wait in get() for an item never sent."""

    async def scenario() -> None:
        q: asyncio.Queue[int | Stop] = asyncio.Queue()
        handled: list[int] = []

        async def handler(item: int) -> None:
            handled.append(item)

        consumers = {
            asyncio.create_task(naive_consume(q, handler), name=f"naive-consumer-{i}")
            for i in range(3)
        }
        for item in range(6):
            await q.put(item)

        await naive_stop(q)

        done, waiting = await asyncio.wait(
            consumers, timeout=MUST_HAPPEN, return_when=asyncio.FIRST_COMPLETED
        )
        record_property(
            "observed",
            f"the one sentinel stopped {len(done)} of 3 consumer tasks, {len(waiting)} stayed"
            f" in get() on an empty queue",
        )
        assert len(done) == 1  # the task that took the sentinel
        await parked(q._getters, 2)  # the others, on an empty queue: only a put can wake them
        assert q.empty()
        assert await still_pending(waiting)
        assert sorted(handled) == list(range(6))

        for _ in waiting:  # release: the test sends the sentinels naive_stop did not
            q.put_nowait(STOP)
        done, waiting = await asyncio.wait(waiting, timeout=MUST_HAPPEN)
        assert not waiting

    run(scenario())


@pytest.mark.race(*A1)
def test_shutting_the_queue_down_ends_every_consumer_task_once_the_items_are_handed_out() -> None:
    """One shutdown() ends every consumer task after the queued items, with no sentinel at all."""

    async def scenario() -> None:
        q: ClosableAsyncQueue[int] = ClosableAsyncQueue()
        handled: list[int] = []

        async def handler(item: int) -> None:
            handled.append(item)

        consumers = [
            asyncio.create_task(consume_until_shutdown(q, handler), name=f"consumer-{i}")
            for i in range(3)
        ]
        for item in range(6):
            await q.put(item)

        q.shutdown()

        counts = await asyncio.wait_for(asyncio.gather(*consumers), MUST_HAPPEN)
        assert sum(counts) == 6
        assert sorted(handled) == list(range(6))
        assert q._unfinished_tasks == 0  # type: ignore[attr-defined]

    run(scenario())


# --- the consumer pool -------------------------------------------------------------------------


def test_pool_stop_lets_the_consumers_finish_everything_queued() -> None:
    """A graceful stop hands every queued item to the handler, then every consumer task ends."""

    async def scenario() -> AsyncPoolReport[int]:
        handled: list[int] = []

        async def handler(item: int) -> None:
            handled.append(item)
            await asyncio.sleep(0)  # let the other consumers take turns

        pool = AsyncConsumerPool(handler, consumers=3, name="drain")
        for item in range(50):
            await pool.put(item)
        pool.start()

        report = await pool.stop(MUST_HAPPEN)

        assert sorted(handled) == list(range(50))
        assert all(task.done() for task in pool.tasks)
        with pytest.raises(QueueShutDown):
            await pool.put(50)
        return report

    report = run(scenario())
    assert (report.terminated, report.still_running, report.cancelled) == (True, (), ())
    assert (report.processed, report.failed, report.discarded) == (50, 0, ())


def test_pool_stop_immediate_discards_exactly_what_was_still_queued() -> None:
    """stop(immediate=True) lists every item it dropped; the item in hand is finished."""

    async def scenario() -> None:
        busy, release = asyncio.Event(), asyncio.Event()
        handled: list[int] = []

        async def handler(item: int) -> None:
            busy.set()
            await release.wait()
            handled.append(item)

        pool = AsyncConsumerPool(handler, consumers=1, name="now")
        for item in range(6):
            pool.queue.put_nowait(item)
        pool.start()
        await asyncio.wait_for(busy.wait(), MUST_HAPPEN)

        stopper = asyncio.create_task(pool.stop(MUST_HAPPEN, immediate=True))
        await parked(release._waiters, 1)  # type: ignore[attr-defined]
        assert await still_pending({stopper})  # it waits for the item in hand
        release.set()
        report = await outcome(stopper)

        assert report.discarded == (1, 2, 3, 4, 5)
        assert (report.terminated, report.processed, report.cancelled) == (True, 1, ())
        assert handled == [0]

    run(scenario())


@pytest.mark.parametrize("swallows", [False, True], ids=["accepts", "swallows"])
def test_pool_stop_is_bounded_and_cancels_what_outlives_the_deadline(swallows: bool) -> None:
    """At the deadline the rest is discarded and the late consumers cancelled; stop() returns."""

    async def scenario() -> None:
        busy, gate = asyncio.Event(), asyncio.Event()

        async def stuck(item: int) -> None:
            busy.set()
            try:
                await asyncio.Event().wait()  # never set
            except asyncio.CancelledError:
                if not swallows:
                    raise
                await gate.wait()  # swallows the cancellation and keeps running

        pool = AsyncConsumerPool(stuck, consumers=1, name="late", stop_timeout=0.05)
        for item in range(3):
            pool.queue.put_nowait(item)
        pool.start()
        await asyncio.wait_for(busy.wait(), MUST_HAPPEN)
        loop = asyncio.get_running_loop()
        began = loop.time()

        report = await pool.stop()  # None: stop_timeout, never forever

        assert loop.time() - began < 0.05 + NOISE
        assert report.cancelled == ("late-0",)
        assert report.discarded == (1, 2)
        if swallows:
            assert (report.terminated, report.still_running) == (False, ("late-0",))
            gate.set()
            await asyncio.wait(pool.tasks, timeout=MUST_HAPPEN)
        else:
            assert (report.terminated, report.still_running) == (True, ())
        assert all(task.done() for task in pool.tasks)
        assert (report.processed, report.failed) == (0, 0)  # item 0 was in hand at the deadline
        assert report.interrupted == (() if swallows else (0,))

    run(scenario())


def test_pool_stop_is_idempotent_and_a_concurrent_stop_returns_the_same_report() -> None:
    """A second stop() made while the first runs waits for it; every later call returns it too."""

    async def scenario() -> None:
        release = asyncio.Event()

        async def handler(item: int) -> None:
            await release.wait()

        pool = AsyncConsumerPool(handler, consumers=1, name="twice")
        pool.queue.put_nowait(1)
        pool.start()
        await parked(release._waiters, 1)  # type: ignore[attr-defined]
        first = asyncio.create_task(pool.stop(MUST_HAPPEN), name="first stopper")
        second = asyncio.create_task(pool.stop(MUST_HAPPEN), name="second stopper")

        assert await still_pending({first, second})
        release.set()

        report = await outcome(first)
        assert await outcome(second) is report
        assert await pool.stop(0, immediate=True) is report
        assert report.terminated

    run(scenario())


def test_pool_start_is_all_or_nothing_and_only_once() -> None:
    """A start() that fails part-way cancels the consumers it created and discards the queue."""

    async def scenario() -> None:
        real = asyncio.create_task
        calls = 0

        def second_fails(coro: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 2:
                coro.close()
                raise RuntimeError("cannot create a task")
            return real(coro, **kwargs)

        pool = AsyncConsumerPool(lambda item: asyncio.sleep(0), consumers=3, name="partial")
        pool.queue.put_nowait("queued")
        with (
            mock.patch.object(asyncio, "create_task", second_fails),
            pytest.raises(RuntimeError, match="cannot create"),
        ):
            pool.start()

        [created] = pool.tasks
        report = await pool.stop(MUST_HAPPEN)
        assert created.cancelled()
        assert (report.terminated, report.processed, report.discarded) == (True, 0, ("queued",))
        with pytest.raises(RuntimeError, match="only once"):
            pool.start()

    run(scenario())


def test_pool_refuses_bad_options_and_a_start_without_a_running_loop() -> None:
    """A bad option names itself; start() outside a loop raises and leaves the pool unstarted."""
    for options, bad in [
        ({"consumers": 0}, "consumers"),
        ({"maxsize": -1}, "maxsize"),
        ({"stop_timeout": -1}, "stop_timeout"),
    ]:
        with pytest.raises(ValueError, match=bad):
            AsyncConsumerPool(lambda item: asyncio.sleep(0), **options)
    pool = AsyncConsumerPool(lambda item: asyncio.sleep(0), name="no-loop")
    with pytest.raises(RuntimeError, match="no running event loop"):
        pool.start()
    assert pool.tasks == []

    async def scenario() -> None:
        with pytest.raises(ValueError, match="timeout"):
            await pool.stop(-1)
        pool.start()  # the failed start above did not count
        assert (await pool.stop(MUST_HAPPEN)).terminated

    run(scenario())


def test_pool_async_with_starts_and_stops_and_logs_a_failing_handler(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An async with block starts the pool and stops it; a failing item is logged and counted."""

    async def picky(item: str) -> None:
        if item == "bad":
            raise ValueError("cannot handle this one")

    async def scenario() -> AsyncPoolReport[str]:
        async with AsyncConsumerPool(picky, consumers=2, name="ctx") as pool:
            for item in ("ok", "bad", "ok"):
                await pool.put(item)
        return await pool.stop()  # already stopped by __aexit__: the same report

    report = run(scenario())
    assert (report.terminated, report.processed, report.failed) == (True, 2, 1)
    assert (report.discarded, report.interrupted, report.cancelled) == ((), (), ())
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.exc_info is not None
    assert record.exc_info[0] is ValueError


def test_pool_stop_from_inside_a_handler_does_not_wait_for_its_own_task() -> None:
    """A handler's stop() is a request: it returns at once naming its task; the last one reports."""

    async def scenario() -> None:
        reports: list[AsyncPoolReport[str]] = []

        async def handler(item: str) -> None:
            if item == "stop":
                reports.append(await pool.stop(MUST_HAPPEN))

        pool = AsyncConsumerPool(handler, consumers=2, name="self")
        pool.queue.put_nowait("stop")
        pool.start()
        await asyncio.wait(pool.tasks, timeout=MUST_HAPPEN)

        [report] = reports
        assert "self-0" in report.still_running or "self-1" in report.still_running
        assert (report.terminated, report.cancelled) == (False, ())
        assert all(task.done() for task in pool.tasks)
        final = await pool.stop(0)  # recorded by the last consumer as it ended
        assert (final.terminated, final.processed) == (True, 1)
        assert await pool.stop() is final

    run(scenario())


# --- the lifecycle contract on the paths users take ----------------------------------


def test_pool_report_cannot_say_terminated_while_naming_a_running_consumer() -> None:
    """AsyncPoolReport refuses terminated=True with a non-empty still_running."""
    with pytest.raises(ValueError, match=r"terminated=True with still_running="):
        AsyncPoolReport(True, ("c-0",), 0, 0, (), (), (), 0.0)


def test_pool_async_with_pool_start_enters_the_running_pool_and_a_stopped_one_raises() -> None:
    """Entering a started pool returns it and stops it at the end; a stopped pool is refused."""

    async def scenario() -> None:
        handled: list[int] = []

        async def handler(item: int) -> None:
            handled.append(item)

        async with AsyncConsumerPool(handler, name="entered").start() as pool:
            await pool.put(1)
        assert (await pool.stop(0)).terminated  # __aexit__ stopped it
        assert handled == [1]
        with pytest.raises(RuntimeError, match="stopped"):
            async with pool:
                pass

    run(scenario())


def test_pool_stop_from_a_consumer_is_a_request_and_the_last_consumer_reports_the_drain() -> None:
    """stop(5) from a handler returns at once; all 20 items are handled; the last task reports."""

    async def scenario() -> None:
        inner: list[AsyncPoolReport[int]] = []

        async def handler(item: int) -> None:
            if item == 0:
                inner.append(await pool.stop(5.0))

        pool = AsyncConsumerPool(handler, consumers=1, name="own")
        for item in range(20):
            pool.queue.put_nowait(item)
        pool.start()
        await asyncio.wait(pool.tasks, timeout=MUST_HAPPEN)

        [provisional] = inner
        assert (provisional.terminated, provisional.still_running) == (False, ("own-0",))
        final = await pool.stop(0)
        assert (final.terminated, final.still_running) == (True, ())
        assert (final.processed, final.discarded, final.cancelled) == (20, (), ())
        assert await pool.stop(MUST_HAPPEN) is final

    run(scenario())


def test_pool_a_second_stop_while_one_runs_is_bounded_by_its_own_budget() -> None:
    """stop(0.2) during another stop() returns provisionally after 0.2 s; the first one records."""

    async def scenario() -> None:
        release = asyncio.Event()

        async def handler(item: int) -> None:
            await release.wait()

        pool = AsyncConsumerPool(handler, consumers=1, name="bound")
        pool.queue.put_nowait(1)
        pool.start()
        await parked(release._waiters, 1)  # type: ignore[attr-defined]
        first = asyncio.create_task(pool.stop(MUST_HAPPEN), name="first stopper")
        await asyncio.sleep(0)  # the first stop() runs up to its wait

        loop = asyncio.get_running_loop()
        began = loop.time()
        second = await pool.stop(0.2)
        took = loop.time() - began

        assert 0.2 <= took < 0.2 + NOISE
        assert (second.terminated, second.still_running) == (False, ("bound-0",))
        release.set()
        report = await outcome(first)
        assert report.terminated
        assert await pool.stop(0) is report

    run(scenario())


@pytest.mark.parametrize("seconds", [math.inf, 1e10, 1e300, pytest.param(10**400, id="10**400")])
def test_pool_budgets_accept_inf_and_huge_values(seconds: float) -> None:
    """stop_timeout and stop(timeout) take inf and 1e10, meaning as long as it takes."""

    async def scenario() -> None:
        pool = AsyncConsumerPool(lambda item: asyncio.sleep(0), stop_timeout=seconds).start()
        assert pool.stop_timeout == (math.inf if seconds > 1e308 else seconds)
        await pool.put(1)
        assert (await pool.stop()).processed == 1
        other = AsyncConsumerPool(lambda item: asyncio.sleep(0)).start()
        assert (await other.stop(seconds)).terminated

    run(scenario())


@pytest.mark.parametrize("bad", [math.nan, -1, -math.inf, True, "5"])
def test_pool_budgets_refuse_nan_negative_bool_and_str_naming_the_argument(bad: object) -> None:
    """A number of seconds that is nan, negative, a bool or a str is a ValueError naming it."""
    with pytest.raises(ValueError, match="stop_timeout must be a number of seconds"):
        AsyncConsumerPool(lambda item: asyncio.sleep(0), stop_timeout=bad)  # type: ignore[arg-type]

    async def scenario() -> None:
        pool = AsyncConsumerPool(lambda item: asyncio.sleep(0), name="bad").start()
        with pytest.raises(ValueError, match="timeout must be a number of seconds"):
            await pool.stop(bad)  # type: ignore[arg-type]
        assert (await pool.stop(MUST_HAPPEN)).terminated

    run(scenario())
