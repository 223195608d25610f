# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""Stop a server on a deadline: stop listening, drain the requests in flight, close the rest.

TL;DR (asyncio): ``async with AsyncGracefulServer(handle, port=8080) as server: ...`` serves
each connection with ``await handle(conn)``, where the handler wraps each request in
``with conn.request("GET /"):``; ``report = await server.stop(10)`` stops listening, closes
idle connections at once, lets requests in flight finish until the last fifth of the budget
(at most its last second), then aborts and cancels what is left and says what each connection
did.

Pitfall (asyncio): `asyncio.Server.close` stops listening and nothing more: every
connected client goes on being served (W10). `asyncio.Server.wait_closed` returns at once on
3.11 with those connections open, and on 3.12+ waits for every one of them, with no limit,
so one idle keep-alive client hangs the stop (W11). 3.13 adds ``close_clients()`` and
``abort_clients()``, which end the transports but not the handler tasks, and cut a request in
flight as readily as an idle connection; 3.11 and 3.12 have neither (W12). And a handler
that catches `asyncio.CancelledError` and goes on hangs any stop that awaits it (W13).

Pattern (asyncio): `AsyncGracefulServer` starts the server itself, so it sees every
connection's task and transport, and the handler says when it works on a request. Its
``stop`` closes the listener, closes the idle connections at once, waits for the requests
in flight until the drain deadline (closing each connection as its request ends), then
aborts the transports still busy, cancels their handlers and waits for them until the
deadline, and reports. The same code on 3.11, 3.12 and 3.13; it never calls ``wait_closed``
or ``close_clients``.

Guarantees (asyncio):
    * ``await server.stop(timeout)`` returns within ``timeout`` (plus scheduling noise)
      whatever the handlers do, never raises for unfinished work, and names each connection
      that had a request in flight in ``completed`` or ``interrupted``; a handler that
      ignores its cancellation is named in ``still_running``.
    * Once ``stop`` begins, nothing new is served: the listener is closed, idle connections
      are closed and their handlers cancelled, and a connection whose handler had not
      started yet is closed unanswered (counted in ``refused``).
    * A response written (even without ``drain()``) before its ``request()`` block ends is
      flushed before the connection closes; a connection interrupted at the deadline is
      aborted, its unsent data dropped.
    * ``stop`` keeps the lifecycle contract: a second call returns the first report; from a
      handler it is a request that returns at once.

Python:
    3.11+; checked on 3.11.7, 3.12.1 and 3.13.0. ``wait_closed`` changed in 3.12 (:gh:`79033`);
    ``close_clients``/``abort_clients`` are new in 3.13. Until 3.13, asyncio's own callback
    on a connection's task logs a cancelled task as an error, so a connection task here ends
    normally when it is cancelled.

Java: ``com.sun.net.httpserver.HttpServer.stop(delay)`` closes the listening socket, waits up
to ``delay`` seconds for the exchanges in flight, then closes every connection; it reports
nothing.

See also: asyncio_shutdown (``shutdown_tasks``, ``run_until_signalled``) for the signal
and the task-cancelling halves. Docs: docs/patterns/server_shutdown.md
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

__all__ = [
    "AsyncConnection",
    "AsyncGracefulServer",
    "ServerStopReport",
]

logger = logging.getLogger(__name__)

# The share of a stop() budget kept for the forced phase (abort, cancel, wait for the
# handlers), at most _A_FORCE_RESERVE seconds; the drain gets the rest. The thread half's
# _FORCE_SHARE and _FORCE_RESERVE hold the same values.
_A_FORCE_SHARE = 0.2
_A_FORCE_RESERVE = 1.0


# The same code is in asyncio_shutdown.py (each module is copied alone); pinned by
# tests/test_copies.py.
def _seconds(value: object, name: str, *, allow_none: bool = False) -> float:
    """A number of seconds >= 0 as a float; ``math.inf`` means "as long as it takes"."""
    if value is None and allow_none:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return math.inf if value > sys.float_info.max else float(value)  # 10**400: no overflow


def _check_report(terminated: bool, still_running: tuple[str, ...]) -> None:
    if terminated and still_running:
        raise ValueError(f"a report cannot say terminated=True with still_running={still_running}")


@dataclass(frozen=True)
class ServerStopReport:
    """What a server's stop found when it returned.

    Attributes:
        terminated: the listener is closed and every connection and handler had ended by
            the deadline.
        still_running: handlers still running when the stop returned (they ignored the
            close or the cancellation), by name.
        completed: requests in flight when the stop began that finished within the drain,
            by name.
        interrupted: connections closed by force at the drain deadline with a request in
            flight (or half read), by name.
        idle_closed: idle keep-alive connections the stop closed (no request in flight).
        refused: connections accepted after the stop began and closed unanswered (or
            answered 503); connections the kernel refused after the listener closed are not
            seen and not counted.
        elapsed: seconds the stop took.
    """

    terminated: bool
    still_running: tuple[str, ...]
    completed: tuple[str, ...] = ()
    interrupted: tuple[str, ...] = ()
    idle_closed: int = 0
    refused: int = 0
    elapsed: float = 0.0

    def __post_init__(self) -> None:
        _check_report(self.terminated, self.still_running)


def _a_wait_timeout(seconds: float) -> float | None:
    """``seconds`` for `asyncio.wait`: None for "as long as it takes" (no timer at all)."""
    return None if seconds == math.inf else max(seconds, 0.0)


class AsyncConnection:
    """One client connection, as its handler sees it.

    ``reader`` and ``writer`` are the `asyncio.start_server` streams. The handler wraps the
    work on each request in ``with conn.request("GET /x"):``: inside, the connection is
    busy and a stop lets it finish until the drain deadline; outside, it is idle and a stop
    closes it and cancels the handler at its next ``await``. Write and drain the response
    inside the block.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        server: AsyncGracefulServer,
    ) -> None:
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._server = server
        self._request: str | None = None  # what is in flight; None while idle
        self._closed = False  # set once the stop has closed (or aborted) the transport
        self._interrupted = False  # set when the stop cut the request in flight
        self._failed: str | None = None  # the name of the request that raised, if one did

    @property
    def name(self) -> str:
        """The peer and the request in flight, if any, as in ``"127.0.0.1:53114 GET /slow"``."""
        return f"{self.peer} {self._request}" if self._request else self.peer

    @property
    def busy(self) -> bool:
        """Whether the handler is inside a `request` block."""
        return self._request is not None

    @property
    def stopping(self) -> bool:
        """Whether the server has begun to stop (finish this request and wait for no other)."""
        return self._server.stopping

    @contextmanager
    def request(self, what: str = "request") -> Iterator[None]:
        """Mark the connection busy while the block runs; ``what`` names the request."""
        if self._request is not None:
            raise RuntimeError(f"{self.name}: request() blocks do not nest")
        self._request = what or "request"
        try:
            yield
        except BaseException:
            self._failed = self.name  # the handler's failure is logged under this name
            raise
        finally:
            name = self.name
            self._request = None
            self._server._a_request_ended(self, name)

    def _close(self, *, abort: bool) -> None:
        """Close the transport (flushing what was written) or abort it (dropping it)."""
        self._closed = True
        transport = self.writer.transport
        if abort:
            transport.abort()
        else:
            transport.close()


class AsyncGracefulServer:
    """An `asyncio` TCP server whose ``stop`` drains, then forces, on a deadline, and reports.

    The lifecycle contract, mapped to coroutines as ``TaskSet`` does in asyncio_shutdown:
    the constructor touches no loop and no socket; `start` is a plain method that must run
    inside the loop: it binds and listens at once (so a busy port fails there, and
    `address` is known), and the loop serves from its next turn; `stop` is a coroutine,
    ``await server.stop(timeout)``; ``async with`` calls both and enters a running server as
    it is. Everything runs in the loop's thread; calling from another thread is an error,
    as it is for the loop itself.
    """

    def __init__(
        self,
        handler: Callable[[AsyncConnection], Awaitable[object]],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        backlog: int = 100,
        stop_timeout: float = 5.0,
        name: str = "server",
    ) -> None:
        self.stop_timeout = _seconds(stop_timeout, "stop_timeout")
        self.name = name
        self._handler = handler
        self._host, self._port, self._backlog = host, port, backlog
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sock: socket.socket | None = None
        self._address: tuple[str, int] | None = None
        self._serving: asyncio.Task[asyncio.Server] | None = None  # start_server, in the loop
        # Every connection whose handler has not ended, by its task (the loop keeps only
        # weak references to tasks). A task leaves in its done callback.
        self._connections: dict[asyncio.Task[Any], AsyncConnection] = {}
        self._stopping_flag = False  # set by the first stop(): no new request from then on
        # Set by the last request in flight to end once stopping; the drain waits on it.
        self._drained: asyncio.Event | None = None
        self._in_flight: dict[AsyncConnection, str] = {}  # busy when the stop began
        self._completed: list[str] = []
        self._refused = 0
        self._stop_task: asyncio.Task[ServerStopReport] | None = None
        self._report: ServerStopReport | None = None

    @property
    def stopping(self) -> bool:
        """Whether `stop` has been called."""
        return self._stopping_flag

    @property
    def address(self) -> tuple[str, int]:
        """The (host, port) the server listens on; `RuntimeError` before `start`."""
        if self._address is None:
            raise RuntimeError(f"server {self.name!r} is not started")
        return self._address

    @property
    def connections(self) -> int:
        """How many connections have a handler running."""
        return len(self._connections)

    def start(self) -> Self:
        """Bind, listen, and serve from the loop's next turn; all or nothing.

        Raises `RuntimeError` outside a running loop, when started twice or after `stop`,
        and `OSError` when the address cannot be bound (nothing is left open then).
        """
        loop = asyncio.get_running_loop()
        if self._loop is not None or self._stopping_flag:
            raise RuntimeError(f"server {self.name!r}: start() can be called once, before stop()")
        sock = socket.create_server((self._host, self._port), backlog=self._backlog)
        try:
            sock.setblocking(False)
            self._serving = loop.create_task(
                asyncio.start_server(self._a_on_connect, sock=sock, backlog=self._backlog),
                name=f"{self.name}-listen",
            )
        except BaseException:
            sock.close()
            raise
        self._loop, self._sock = loop, sock
        self._address = sock.getsockname()[:2]
        self._drained = asyncio.Event()
        return self

    async def _a_on_connect(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if self._stopping_flag or task is None:  # accepted just before the listener closed
            self._refused += 1
            writer.close()
            return
        conn = AsyncConnection(reader, writer, self)
        self._connections[task] = conn
        task.set_name(f"{self.name}-{conn.peer}")
        task.add_done_callback(self._connections.pop)
        try:
            await self._handler(conn)
        except asyncio.CancelledError:
            # The stop's (or the loop's) way to end this connection. Ending normally instead
            # of cancelled: on 3.11 and 3.12 asyncio's own done callback on this task calls
            # task.exception() and logs a cancelled task as "Exception in callback".
            pass
        except Exception:
            logger.exception("handler for %s failed", conn._failed or conn.name)
        finally:
            writer.close()  # no await here: a pending cancel must not interrupt the cleanup

    def _a_request_ended(self, conn: AsyncConnection, name: str) -> None:
        """A `request` block ended: count it, and close the connection if stopping."""
        if not self._stopping_flag:
            return
        if conn in self._in_flight and not conn._interrupted:
            del self._in_flight[conn]
            self._completed.append(name)
        if not conn._closed:
            conn._closed = True
            # After the handler's current step, so the close and the cancel find it
            # suspended (a cancel of a running task that then returns would end it
            # cancelled); the response it wrote is flushed by close().
            loop = asyncio.get_running_loop()
            loop.call_soon(self._a_close_idle, conn)
        if self._drained is not None and not any(c.busy for c in self._connections.values()):
            self._drained.set()

    def _a_close_idle(self, conn: AsyncConnection) -> None:
        conn._close(abort=False)
        for task, each in self._connections.items():
            if each is conn:
                task.cancel()

    async def stop(self, timeout: float | None = None) -> ServerStopReport:
        """Stop listening, drain, force, and report; at most ``timeout`` seconds.

        ``None`` means ``stop_timeout``; ``math.inf`` waits as long as it takes. The forced
        phase keeps a fifth of the budget, at most a second; the drain gets the rest. Raises
        `ValueError` for a bad timeout, never for work that would not stop (the report names
        it). If the caller is cancelled, the stop goes on and a later ``stop()`` returns its
        report.
        Awaited from a handler, it is a request: the stop starts and a provisional report
        (``terminated=False``, not kept) comes back at once. A ``stop()`` made while another
        is under way waits at most its own ``timeout`` for that one's report.
        """
        budget = self.stop_timeout if timeout is None else _seconds(timeout, "timeout")
        if self._report is not None:
            return self._report
        first = self._stop_task is None
        if not self._stopping_flag:
            self._stopping_flag = True
            # Now, not in the stop's task: a handler that calls stop() inside its request
            # may finish that request before the task runs.
            self._in_flight = {c: c.name for c in self._connections.values() if c.busy}
        if self._loop is None:  # never started: nothing to stop, and it cannot start now
            self._report = ServerStopReport(terminated=True, still_running=())
            return self._report
        if self._stop_task is None:
            self._stop_task = self._loop.create_task(self._a_stop(budget), name=f"{self.name}-stop")
        if asyncio.current_task() in self._connections:  # it would wait for itself
            return self._a_provisional()
        if first:  # bounded by budget already
            return await asyncio.shield(self._stop_task)
        await asyncio.wait([self._stop_task], timeout=_a_wait_timeout(budget))
        return self._report or self._a_provisional()

    def _a_provisional(self) -> ServerStopReport:
        names = tuple(sorted(c.name for t, c in self._connections.items() if not t.done()))
        return ServerStopReport(terminated=False, still_running=names, refused=self._refused)

    async def _a_stop(self, budget: float) -> ServerStopReport:
        started = time.monotonic()
        deadline = started + budget
        drain_until = deadline - min(budget * _A_FORCE_SHARE, _A_FORCE_RESERVE)
        await self._a_stop_listening(drain_until)
        # Idle connections first: closed now, their handlers cancelled at their next await.
        idle_closed = 0
        for task, conn in list(self._connections.items()):
            if conn.busy:
                self._in_flight.setdefault(conn, conn.name)
            elif not conn._closed:
                idle_closed += 1
                conn._close(abort=False)
                task.cancel()
        assert self._drained is not None
        if self._in_flight and not self._drained.is_set():
            logger.info("draining %d request(s) in flight", len(self._in_flight))
            wait = _a_wait_timeout(drain_until - time.monotonic())
            drained = asyncio.get_running_loop().create_task(self._drained.wait())
            await asyncio.wait([drained], timeout=wait)
            drained.cancel()
        # Forced: abort what is still busy; cancel every handler left.
        interrupted: list[str] = []
        for task, conn in list(self._connections.items()):
            if conn.busy:
                conn._interrupted = True
                interrupted.append(conn.name)
                conn._close(abort=True)
            elif not conn._closed:  # a safety net: every idle one was closed above
                idle_closed += 1
                conn._close(abort=False)
            task.cancel()
        if interrupted:
            logger.warning("interrupted at the drain deadline: %s", ", ".join(interrupted))
        pending = [t for t in self._connections if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=_a_wait_timeout(deadline - time.monotonic()))
        still_running = tuple(sorted(c.name for t, c in self._connections.items() if not t.done()))
        if still_running:
            logger.warning(
                "still running after the deadline (cancellation ignored?): %s",
                ", ".join(still_running),
            )
        report = ServerStopReport(
            terminated=not still_running,
            still_running=still_running,
            completed=tuple(self._completed),
            interrupted=tuple(interrupted),
            idle_closed=idle_closed,
            refused=self._refused,
            elapsed=time.monotonic() - started,
        )
        self._report = report
        return report

    async def _a_stop_listening(self, until: float) -> asyncio.Server | None:
        """Close the listener; the server it became, or None if it never got to serve."""
        serving, sock = self._serving, self._sock
        assert serving is not None
        assert sock is not None
        if not serving.done():  # stopped in the same turn as start(): let it finish starting
            await asyncio.wait([serving], timeout=_a_wait_timeout(until - time.monotonic()))
        if serving.done() and not serving.cancelled() and serving.exception() is None:
            server = serving.result()
            server.close()  # stops listening; every connection goes on (W10)
            return server
        if serving.done() and not serving.cancelled():
            logger.error("server %r could not serve", self.name, exc_info=serving.exception())
        serving.cancel()
        sock.close()
        return None

    async def __aenter__(self) -> Self:
        """Start if never started; a running server is returned as is."""
        if self._loop is not None and not self._stopping_flag:
            return self
        return self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
