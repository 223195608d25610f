"""Broken on purpose: the obvious ways to run and stop a stdlib server (tests, docs, notebooks).

Each function is the naive counterpart of `patterns.server_shutdown.GracefulServer`; the docs
page shows them next to it, and the tests make each one go wrong. Do not copy these.
"""

from __future__ import annotations

import socketserver
import threading


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
