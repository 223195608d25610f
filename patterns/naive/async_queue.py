"""Broken on purpose: the sentinel-stopped consumer tasks that `patterns.async_queue` fixes.

Docs: docs/patterns/async_queue.md
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

T = TypeVar("T")


class Stop(enum.Enum):
    """The type of `STOP`, so that a queue can be typed ``asyncio.Queue[T | Stop]``."""

    STOP = "stop"


STOP: Final = Stop.STOP


async def naive_consume(q: asyncio.Queue[T | Stop], handler: Callable[[T], Awaitable[Any]]) -> int:
    """Broken on purpose: a consumer task that returns when it takes the sentinel.

    Correct on its own; what breaks is `naive_stop`, which sends one sentinel however
    many tasks run this loop. Returns how many items it handled.
    """
    handled = 0
    while True:
        item = await q.get()
        if item is STOP:
            return handled
        await handler(item)
        handled += 1


async def naive_stop(q: asyncio.Queue[T | Stop]) -> None:
    """Broken on purpose: one sentinel for N consumer tasks (A1).

    The first consumer to take it returns; the other N-1 wait in ``q.get()`` forever,
    and a program that awaits them (``gather``, a ``TaskGroup``) hangs with them.
    """
    await q.put(STOP)
