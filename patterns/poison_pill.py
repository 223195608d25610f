# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""Stop queue consumers with poison pills: one per consumer, sent once, by the last producer.

TL;DR:
    Consumers run ``consume(q, handle)``, which returns when it takes `PILL`. Producers
    share a `ProducerGroup` and each runs ``produce_and_count_down(q, items, group)``; the
    last one to finish puts one pill per consumer. On a bounded queue, `put_pill` gives up
    cleanly instead of blocking forever, and `join_with_timeout` is the ``Queue.join()``
    with a timeout that Python lacks.

Guarantees:
    * The queue is FIFO, so every item put before a pill is taken before that pill.
    * With `ProducerGroup`, the pills are put after the last item of every producer, and
      exactly once, however many producers fail.
    * `consume` calls ``task_done()`` exactly once per item it takes, whatever the handler
      does; a handler's `Exception` is logged at ERROR and `consume` goes on, a
      `BaseException` ends it (still after its ``task_done()``).
    * `put_pill` and `join_with_timeout` return within their timeout (plus one ``poll``
      slice for `put_pill`), whatever the consumers do.

Python:
    3.11+, standard library only; checked on 3.11.7, 3.12.1 and 3.13.0. From 3.13,
    ``Queue.shutdown()`` (see ``closable_queue``) is the better default.

Docs: docs/patterns/poison_pill.md
"""

from __future__ import annotations

import enum
import logging
import math
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Final, TypeVar

__all__ = [
    "PILL",
    "Pill",
    "ProducerGroup",
    "consume",
    "join_with_timeout",
    "produce_and_count_down",
    "put_pill",
    "send_pills",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Pill(enum.Enum):
    """The type of `PILL`: an enum with a single member, so type checkers can narrow on it.

    A queue that may carry pills is a ``queue.Queue[T | Pill]``; after ``item is PILL``
    is false, a type checker knows ``item`` is a ``T``.
    """

    PILL = "PILL"

    def __repr__(self) -> str:
        return "<PILL>"


#: The poison pill, meaning "no more items will come; stop". Compare it with ``is``.
PILL: Final = Pill.PILL


def consume(q: queue.Queue[T | Pill], handle: Callable[[T], object]) -> int:
    """Handle items from ``q`` in order until a pill arrives; return how many were handled.

    Every item taken, the pill included, gets its ``task_done()`` in the ``finally``, so a
    failing handler cannot leave ``q.join()`` waiting (P13). A handler's `Exception` is
    logged at ERROR and the loop goes on; it is not counted as handled.
    """
    handled = 0
    while True:
        item = q.get()
        try:
            if item is PILL:
                return handled
            handle(item)
            handled += 1
        except Exception:
            logger.exception("consume: handler failed on %r", item)
        finally:
            q.task_done()


def send_pills(q: queue.Queue[T | Pill], consumers: int) -> None:
    """Put one pill per consumer, after everything already in the queue (P10).

    Uses a plain blocking ``put()``: right for an unbounded queue. On a bounded queue whose
    consumers may be dead or stuck, use `put_pill` (P12).
    """
    _check_count("consumers", consumers)
    for _ in range(consumers):
        q.put(PILL)


class ProducerGroup:
    """A countdown shared by the producers; the last one to finish sends the pills (P11).

    Each producer calls `done` exactly once when it has put its last item, in a
    ``finally`` so that a producer that crashes still counts down (`producing` is that
    ``try/finally`` as a context manager). Otherwise a single failed producer would
    leave every consumer waiting for pills that never come.

    With ``stop`` left as None the pills are put with a plain ``put()``, which suits an
    unbounded queue. With a ``stop`` event, each pill goes through `put_pill`, sharing
    ``timeout`` (None: until ``stop`` is set), so a full queue cannot hang the last
    producer; pills that could not be delivered are logged at ERROR. If sending is
    interrupted (Ctrl-C while a ``put()`` waits for room), an ERROR says how many pills
    went in, and the exception propagates: the caller must stop the rest some other way.
    """

    def __init__(
        self,
        q: queue.Queue[Any],
        *,
        producers: int,
        consumers: int,
        stop: threading.Event | None = None,
        timeout: float | None = None,
    ) -> None:
        _check_count("producers", producers)
        _check_count("consumers", consumers)
        if stop is None and timeout is not None:
            raise ValueError("timeout needs a stop event: pass stop=threading.Event()")
        _seconds(timeout, "timeout", allow_none=True)
        self._queue = q
        self._consumers = consumers
        self._stop = stop
        self._timeout = timeout
        # Guards _remaining. Taken briefly by every done(); the pills are put after it is
        # released, by the one caller that brought _remaining to zero, so a put that
        # blocks never holds up another producer's done().
        self._lock = threading.Lock()
        self._remaining = producers

    @property
    def remaining(self) -> int:
        """How many producers have not called `done` yet."""
        with self._lock:
            return self._remaining

    def done(self) -> bool:
        """Count one producer down; the last call sends the pills and returns True.

        Raises `RuntimeError` if called more times than there are producers: that is a
        bug in the caller, and sending the pills twice would hide it.
        """
        with self._lock:
            if self._remaining == 0:
                raise RuntimeError(
                    "ProducerGroup.done() called more times than there are producers"
                )
            self._remaining -= 1
            last = self._remaining == 0
        if last:
            self._send_pills()
        return last

    @contextmanager
    def producing(self) -> Iterator[None]:
        """Run a producer's body and call `done` when it ends, even by an exception."""
        try:
            yield
        finally:
            self.done()

    def _send_pills(self) -> None:
        deadline = _deadline(_seconds(self._timeout, "timeout", allow_none=True))
        sent = 0
        try:
            while sent < self._consumers:
                if self._stop is None:
                    self._queue.put(PILL)
                else:
                    left = max(0.0, deadline - time.monotonic())
                    if not put_pill(self._queue, self._stop, left):
                        logger.error(
                            "ProducerGroup: %d of %d pill(s) not delivered; "
                            "those consumers were not told to stop",
                            self._consumers - sent,
                            self._consumers,
                        )
                        return
                sent += 1
        except BaseException as exc:
            # Ctrl-C in a put() that waits for room, or a queue that refuses items: the
            # count is already zero, so nobody else will send the rest. Say so. (An
            # interrupt just after a put() returned counts that pill as not delivered.)
            logger.error(  # noqa: TRY400 - it propagates; its traceback is the caller's to show
                "ProducerGroup: %r while sending pills: %d of %d pill(s) delivered; "
                "the other consumers were not told to stop",
                exc,
                sent,
                self._consumers,
            )
            raise


def produce_and_count_down(
    q: queue.Queue[T | Pill], items: Iterable[T], group: ProducerGroup
) -> int:
    """Put every item, then count this producer down; return how many items were put (P11).

    The producer sends no pill of its own: the group's last producer sends them all.
    """
    with group.producing():
        count = 0
        for item in items:
            q.put(item)
            count += 1
        return count


def put_pill(
    q: queue.Queue[T | Pill], stop: threading.Event, timeout: float | None, *, poll: float = 0.05
) -> bool:
    """Put a pill into a possibly full queue without blocking forever (P12).

    Tries in slices of ``poll`` seconds; between slices it gives up if ``stop`` is set or
    ``timeout`` seconds have passed (None: no deadline, only ``stop``). Returns True when
    the pill is in the queue, False (with a WARNING saying why) when it is not: the
    consumers are dead or stuck, and the caller must stop them some other way, or close
    the queue instead. inf (or 1e10) for either means as long as it takes.
    """
    deadline = _deadline(_seconds(timeout, "timeout", allow_none=True))
    if _seconds(poll, "poll") == 0:
        raise ValueError("poll must be a number of seconds > 0, not 0")
    while True:
        try:
            q.put(PILL, timeout=min(poll, _left(deadline)))
        except queue.Full:
            pass
        else:
            return True
        if stop.is_set():
            logger.warning("put_pill: stop was set while the queue was full; no pill sent")
            return False
        if time.monotonic() >= deadline:
            logger.warning("put_pill: queue still full after %.3gs; no pill sent", timeout)
            return False


def join_with_timeout(q: queue.Queue[Any], timeout: float) -> bool:
    """``q.join()`` with a timeout: True once every item got its ``task_done()`` (P13).

    Returns False if some item is still unfinished after ``timeout`` seconds (inf: as
    long as it takes). It waits on ``q.all_tasks_done``, the condition ``task_done()``
    notifies, and reads ``q.unfinished_tasks``: public attributes of `queue.Queue`, though
    not in its docs.
    """
    deadline = _deadline(_seconds(timeout, "timeout"))
    with q.all_tasks_done:
        while q.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            q.all_tasks_done.wait(_left(deadline))
        return True


# --- the lifecycle contract: seconds, deadlines, counts ----------------------------------------
#
# The seconds family is the same code in every module that holds it, since a module is
# copied alone (tests/test_copies.py): inf and huge values mean "as long as it takes", and
# every wait built on them is capped by _left, so no OverflowError escapes.


def _seconds(value: object, name: str, *, allow_none: bool = False) -> float:
    """``value`` as a number of seconds; None means forever where allowed (math.inf)."""
    if value is None and allow_none:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return math.inf if value > sys.float_info.max else float(value)


def _deadline(seconds: float) -> float:
    return time.monotonic() + seconds


def _left(deadline: float) -> float:
    """Seconds until ``deadline`` for a C wait: never negative, never above TIMEOUT_MAX."""
    return min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)


def _check_count(name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value!r}")
