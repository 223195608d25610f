"""Broken on purpose: the naive consumer and producer that `patterns.closable_queue` fixes.

Docs: docs/patterns/closable_queue.md
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def naive_consume(q: queue.Queue[T], handler: Callable[[T], object], stop: threading.Event) -> None:
    """Broken on purpose: the stop flag is read between items, but the consumer waits in get().

    Setting ``stop`` does nothing to a consumer blocked in ``q.get()``; only an item wakes
    it, and the item that does is then handled as if it were data (P14). A handler exception
    ends the thread, and with it the queue's only reader (P9).
    """
    while not stop.is_set():
        item = q.get()
        try:
            handler(item)
        finally:
            q.task_done()


def naive_produce(q: queue.Queue[T], items: Iterable[T]) -> int:
    """Broken on purpose: ``put()`` on a full queue waits forever once the consumers are gone.

    This is the producer's side of a dead consumer (P9): nothing will ever make room.
    """
    delivered = 0
    for item in items:
        q.put(item)
        delivered += 1
    return delivered
