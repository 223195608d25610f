"""Broken on purpose: the obvious ways to stop an asyncio server (tests, docs).

Each function is the naive counterpart of
`patterns.server_shutdown_asyncio.AsyncGracefulServer`; the docs page shows them next to it,
and the tests make each one go wrong. Do not copy these.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


async def naive_stop_server(server: asyncio.Server) -> None:
    """Broken on purpose: ``close()`` then ``wait_closed()``, the stop the asyncio docs show.

    ``close()`` only stops listening: connected clients go on being served (W10). What
    ``wait_closed()`` then does depends on the version (W11): 3.11 returns at once with the
    connections still open; 3.12 and 3.13 wait, with no limit, until every client has
    hung up, so one idle keep-alive client hangs the stop.
    """
    server.close()
    await server.wait_closed()


async def naive_stop_with_close_clients(server: asyncio.Server) -> None:
    """Broken on purpose: ``close()``, ``close_clients()``, ``wait_closed()`` (W12).

    ``close_clients()`` is new in 3.13 (an `AttributeError` on 3.11 and 3.12). It closes
    every transport, busy or idle: a request in flight loses its response, and its handler
    task is neither cancelled nor awaited, so it runs on after the stop returned.
    """
    server.close()
    server.close_clients()  # type: ignore[attr-defined,unused-ignore]  # 3.13+
    await server.wait_closed()


async def naive_cancel_handlers(
    server: asyncio.Server, handlers: Iterable[asyncio.Task[Any]]
) -> None:
    """Broken on purpose: close, cancel every handler task, and wait with no deadline (W13).

    A handler that catches `asyncio.CancelledError` and goes on keeps ``gather`` waiting
    for ever, and nothing says which connection it is.
    """
    server.close()
    tasks = list(handlers)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
