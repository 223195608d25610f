"""Broken on purpose: the obvious ways to run and stop a stdlib server (tests, docs, notebooks).

Each function is the naive counterpart of `patterns.server_shutdown.GracefulServer` or
`patterns.server_shutdown.AsyncGracefulServer`; the docs page shows them next to it, and the
tests make each one go wrong. Do not copy these.
"""

from __future__ import annotations

import asyncio
import socketserver
import threading
from collections.abc import Iterable
from typing import Any


def naive_serve(server: socketserver.BaseServer, poll_interval: float = 0.5) -> threading.Thread:
    """Broken on purpose: ``serve_forever()`` on a thread, and nothing tracks the handlers.

    ``serve_forever`` wakes every ``poll_interval`` seconds to look for a stop (W5); the
    handler threads are whatever the server's mix-in makes them: daemons in
    ``ThreadingHTTPServer`` (W2).
    """
    thread = threading.Thread(
        target=server.serve_forever, args=(poll_interval,), name="naive-serve"
    )
    thread.start()
    return thread


def naive_stop(server: socketserver.BaseServer) -> None:
    """Broken on purpose: ``shutdown()`` then ``server_close()``, the documented pair.

    ``shutdown()`` waits for ``serve_forever`` to end, so it deadlocks when called from
    the thread that runs it (W1), and it waits up to ``poll_interval`` (W5).
    ``server_close()`` closes the listener only: a kept-alive connection stays served
    (W4); in a ``ThreadingMixIn`` server it then joins every non-daemon handler with no
    timeout, and none of a ``ThreadingHTTPServer``'s daemon handlers (W3, W2).
    """
    server.shutdown()
    server.server_close()


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
