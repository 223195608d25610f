# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""Stop an asyncio server on a deadline: stop accepting, drain, abort, cancel, report.

TL;DR: ``async with AsyncGracefulServer(handle, port=8080) as server:`` serves each
connection with ``await handle(conn)``; the handler wraps each request in ``with
conn.request("GET /"):``, which raises `ServerStopping` once the stop began. ``await
server.stop(timeout)`` returns a `ServerStopReport` within the budget: the listener and
the idle connections close at once, requests in flight may finish until the drain
deadline, then their connections are aborted and their handlers cancelled.

Guarantees:
    * ``stop()`` returns within its budget and never raises for unfinished work; a second
      call returns the first report. From a handler, it is a request that returns at once.
    * ``conn.request()`` raises `ServerStopping` once the stop began, so a request read
      then (a pipelined one, already buffered) never starts; it is counted in ``refused``.
    * Each connection with a request in flight is named in ``completed``, ``failed`` or
      ``interrupted``; a handler that raises is logged at ERROR with its traceback; a
      handler task that ignores its cancellation is named in ``still_running``.
    * A response written before its ``request()`` block ends is flushed before the
      connection closes; a connection interrupted at the deadline is aborted.

Python:
    3.11+, standard library only; checked on 3.11.7, 3.12.1 and 3.13.0. ``Server.wait_closed``
    changed in 3.12 (:gh:`79033`) and ``close_clients``/``abort_clients`` are new in 3.13;
    `AsyncGracefulServer` uses neither, so it does the same on all three. Until 3.13,
    asyncio logs a cancelled connection task as an error, so a connection task here ends
    normally when it is cancelled.

Docs: docs/patterns/server_shutdown_asyncio.md
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

__all__ = ["AsyncConnection", "AsyncGracefulServer", "ServerStopReport", "ServerStopping"]

logger = logging.getLogger(__name__)

# The forced close keeps this share of a budget (at most `_FORCE_RESERVE` s); the drain, the rest.
_FORCE_SHARE = 0.2
_FORCE_RESERVE = 1.0


# The same code is in server_shutdown.py (each module is copied alone); pinned by
# tests/test_copies.py.
@dataclass(frozen=True)
class ServerStopReport:
    """What a server's stop found when it returned.

    Attributes:
        terminated: the listener is closed and every connection and handler ended in time.
        still_running: handler tasks still running at the deadline (they ignored their
            cancellation), by name.
        completed: requests in flight when the stop began whose ``request()`` block then
            ended normally, by name. None starts after the stop began (see ``refused``).
        failed: requests in flight when the stop began whose block then raised (logged at
            ERROR with its traceback), by name; their clients got no full answer.
        interrupted: connections aborted at the drain deadline with a request in flight,
            by name.
        idle_closed: connections the stop closed outside a ``request()`` block (idle,
            whatever their handler was reading).
        refused: connections accepted after the stop began and closed unanswered, and
            requests that `AsyncConnection.request` refused because the stop had begun.
        not_ready: always 0 here (an HTTP readiness check is ``GracefulServer``'s, in
            server_shutdown.py).
        elapsed: seconds the stop took.
    """

    terminated: bool
    still_running: tuple[str, ...]
    completed: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    interrupted: tuple[str, ...] = ()
    idle_closed: int = 0
    refused: int = 0
    not_ready: int = 0
    elapsed: float = 0.0

    def __post_init__(self) -> None:
        _check_report(self.terminated, self.still_running)


class ServerStopping(Exception):
    """Raised by `AsyncConnection.request` once the server's stop has begun.

    The request is not served and nothing of it has run. Let it propagate out of the
    handler: the server ends the connection without logging an error and counts the request
    in ``refused``. A handler's connection loop needs nothing else to end on it.
    """


class AsyncConnection:
    """One client connection, as its handler sees it.

    ``reader`` and ``writer`` are the `asyncio.start_server` streams. The handler wraps the
    work on each request in ``with conn.request("GET /x"):``: inside, the connection is
    busy and a stop lets it finish until the drain deadline; outside, it is idle and a stop
    closes it and cancels the handler at its next ``await``. Write and drain the response
    inside the block. Once the stop began, ``request()`` raises `ServerStopping` instead:
    a request read then (a pipelined one is read without waiting) never starts.
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
        self._logged: BaseException | None = None  # the failure request() has logged

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
        """Mark the connection busy while the block runs; ``what`` names the request.

        Raises `ServerStopping` (before the block runs) once the server's stop has begun.
        """
        if self._request is not None:
            raise RuntimeError(f"{self.name}: request() blocks do not nest")
        if self._server.stopping:
            self._server._refused += 1
            raise ServerStopping(f"{self.peer}: {what!r} not served: the server is stopping")
        self._request = what or "request"
        failed = False
        try:
            yield
        except Exception as exc:
            if not self._interrupted:  # not a consequence of the stop's abort
                failed = True
                logger.exception("%s: request %s failed", self._server.name, self.name)
                self._logged = exc
            raise
        finally:
            name = self.name
            self._request = None
            self._server._a_request_ended(self, name, failed=failed)

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
        self._start_called = False  # set by start(), even by one that failed
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
        self._failed: list[str] = []
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

        Raises `RuntimeError` outside a running loop, when called a second time (after a
        start that failed too) or after `stop`, and `OSError` when the address cannot be
        bound (nothing is left open then).
        """
        loop = asyncio.get_running_loop()
        if self._start_called or self._stopping_flag:
            raise RuntimeError(f"server {self.name!r}: start() can be called once, before stop()")
        self._start_called = True  # a start that fails here still counts: no second try
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
        if not self._stopping_flag:
            self._stopping_flag = True  # from now on, conn.request() refuses a new request
            # Now, not in the stop's task: a handler that calls stop() inside its request
            # may finish that request before the task runs.
            self._in_flight = {c: c.name for c in self._connections.values() if c.busy}
        return await _stop_or_join(self, budget)  # _a_stop, in a task of its own

    # --- the stop, phase after phase on one deadline -----------------------------------------

    async def _a_stop(self, budget: float) -> ServerStopReport:
        started = time.monotonic()
        deadline = started + budget
        drain_until = deadline - min(budget * _FORCE_SHARE, _FORCE_RESERVE)
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
            failed=tuple(self._failed),
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

    # --- one task per connection: its requests, busy or idle ----------------------------------

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
        except ServerStopping:
            pass  # counted by request(); the connection ends here
        except asyncio.CancelledError:
            # The stop's (or the loop's) way to end this connection. Ending normally instead
            # of cancelled: on 3.11 and 3.12 asyncio's own done callback on this task calls
            # task.exception() and logs a cancelled task as "Exception in callback".
            pass
        except Exception as exc:
            if exc is not conn._logged:  # request() logged its own
                logger.exception("%s: handler for %s failed", self.name, conn.name)
        finally:
            writer.close()  # no await here: a pending cancel must not interrupt the cleanup

    def _a_request_ended(self, conn: AsyncConnection, name: str, *, failed: bool) -> None:
        """A `request` block ended: count it, and close the connection if stopping."""
        if not self._stopping_flag:
            return
        if conn in self._in_flight and not conn._interrupted:
            del self._in_flight[conn]
            (self._failed if failed else self._completed).append(name)
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


# --- the lifecycle contract: seconds, a stop run once, provisional reports ------------------


# The same code is in every pattern module that checks seconds; pinned by tests/test_copies.py.
def _seconds(value: object, name: str, *, allow_none: bool = False) -> float:
    """A number of seconds >= 0 as a float; ``math.inf`` means "as long as it takes"."""
    if value is None and allow_none:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return math.inf if value > sys.float_info.max else float(value)  # 10**400: no overflow


def _a_wait_timeout(seconds: float) -> float | None:
    """``seconds`` for `asyncio.wait`: None for "as long as it takes" (no timer at all)."""
    return None if seconds == math.inf else max(seconds, 0.0)


def _check_report(terminated: bool, still_running: tuple[str, ...]) -> None:
    if terminated and still_running:
        raise ValueError(f"a report cannot say terminated=True with still_running={still_running}")


async def _stop_or_join(server: AsyncGracefulServer, budget: float) -> ServerStopReport:
    """Run `AsyncGracefulServer._a_stop` once, in a task of its own; every call reports.

    A later call returns the first report. A stop from a handler would wait for itself: it
    starts the stop and returns a provisional report. A second call while the first runs
    waits at most its own budget for that one's report. The first caller awaits the task
    through `asyncio.shield`, so a cancelled caller leaves the stop running.
    """
    if server._report is not None:
        return server._report
    if server._loop is None:  # never started: nothing to stop, and it cannot start now
        server._report = ServerStopReport(terminated=True, still_running=())
        return server._report
    first = server._stop_task is None
    if server._stop_task is None:
        server._stop_task = server._loop.create_task(
            server._a_stop(budget), name=f"{server.name}-stop"
        )
    task = server._stop_task
    if asyncio.current_task() in server._connections:  # it would wait for itself
        return _provisional(server)
    if first:  # bounded by budget already
        return await asyncio.shield(task)
    await asyncio.wait([task], timeout=_a_wait_timeout(budget))
    return server._report or _provisional(server)


def _provisional(server: AsyncGracefulServer) -> ServerStopReport:
    """A report of the moment, not kept: the stop is still under way."""
    names = tuple(sorted(c.name for t, c in server._connections.items() if not t.done()))
    return ServerStopReport(terminated=False, still_running=names, refused=server._refused)
