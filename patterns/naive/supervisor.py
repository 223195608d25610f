"""Broken on purpose: the naive versions of ``patterns.supervisor`` (P9)."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def naive_consume(q: queue.Queue[T], handle: Callable[[T], object]) -> None:
    """Broken on purpose: the first exception from ``handle`` ends the thread, and nobody hears.

    The default `threading.excepthook` prints a traceback to stderr, and that is all:
    the queue stops draining and its producers block once it is full (P9).
    """
    while True:
        handle(q.get())


def naive_produce(q: queue.Queue[T], items: Iterable[T]) -> None:
    """Broken on purpose: ``put()`` on a full queue whose consumer died blocks forever (P9)."""
    for item in items:
        q.put(item)
