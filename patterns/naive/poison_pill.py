"""Broken on purpose: the naive pill code that `patterns.poison_pill` fixes, one per pitfall.

Docs: docs/patterns/poison_pill.md
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable, Iterable
from typing import TypeVar

from patterns.poison_pill import PILL, Pill

logger = logging.getLogger(__name__)

T = TypeVar("T")


def naive_send_pills(q: queue.Queue[T | Pill], consumers: int) -> None:
    """Broken on purpose: one pill stops one consumer, whatever ``consumers`` says (P10).

    The other consumers stay blocked in ``get()`` forever.
    """
    q.put(PILL)


def naive_produce(q: queue.Queue[T | Pill], items: Iterable[T]) -> int:
    """Broken on purpose: every producer sends a pill when *it* is done (P11).

    The first pill stops the consumer while other producers may still be putting items,
    and those items are never processed.
    """
    count = 0
    for item in items:
        q.put(item)
        count += 1
    q.put(PILL)
    return count


def naive_put_pill(q: queue.Queue[T | Pill]) -> None:
    """Broken on purpose: a plain ``put()`` waits forever on a full queue (P12).

    If no consumer takes an item again (dead or stuck), the shutdown path hangs here.
    """
    q.put(PILL)


def naive_consume(q: queue.Queue[T | Pill], handle: Callable[[T], object]) -> int:
    """Broken on purpose: ``task_done()`` is skipped when the handler raises (P13).

    The error is logged, but ``unfinished_tasks`` never returns to zero, so ``q.join()``
    waits forever.
    """
    handled = 0
    while True:
        item = q.get()
        if item is PILL:
            q.task_done()
            return handled
        try:
            handle(item)
            handled += 1
            q.task_done()
        except Exception:
            logger.exception("naive_consume: handler failed on %r", item)
