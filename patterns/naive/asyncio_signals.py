"""Broken on purpose: the asyncio signal handling that `patterns.asyncio_signals` replaces.

Each function shows a pitfall from docs/patterns/asyncio_signals.md; the tests make it
happen. Do not copy them.
"""

from __future__ import annotations

import asyncio
import signal


def naive_install_stop_handler(stop: asyncio.Event) -> None:
    """Broken on purpose: every SIGTERM or SIGINT sets ``stop``, and nothing more (A9).

    The first signal starts the graceful stop; if that stop hangs, a second signal sets
    the event again and changes nothing: the operator's only way out is SIGKILL.
    """
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
