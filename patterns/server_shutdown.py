# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""Stop a server on a deadline: not ready, stop accepting, drain, close what is left, report.

TL;DR: wrap a `socketserver` TCP server (``http.server.ThreadingHTTPServer`` included) in a
`GracefulServer`; ``start()`` serves it on a thread of its own and ``stop(timeout)``
returns a `ServerStopReport` within the budget: the readiness check fails first, then
(after an optional ``grace``) the listener closes, idle keep-alive connections close at
once, requests in flight may finish until the drain deadline, the rest are closed by force.
For asyncio, ``async with AsyncGracefulServer(handle, port=8080) as server:`` serves each
connection with ``await handle(conn)`` (the handler wraps each request in ``with
conn.request("GET /"):``, which raises `ServerStopping` once the stop began) and ``await
server.stop(timeout)`` does the same stop.

Guarantees:
    * ``stop()`` returns within its budget and never raises for unfinished work; a second
      call returns the first report. From a handler (or the serve thread, or a signal
      handler interrupting a ``stop()``), it is a request that returns at once.
    * Once the stop began, ``GracefulServer.ready`` is false, ``readiness_path`` answers
      503 and every final HTTP response (the one after a ``100 Continue`` too) carries
      ``Connection: close``; once the ``grace`` is over, nothing new is served: the
      listener closes (then the kernel refuses new connections) and idle connections are
      closed. asyncio has no grace: ``conn.request()`` raises `ServerStopping` once the
      stop began, so a request read then (a pipelined one, already buffered) never
      starts; it is counted in ``refused``.
    * Each connection with a request in flight is named in ``completed``, ``failed``
      or ``interrupted``; a handler that raises is logged at ERROR with its traceback,
      during a stop as before it. Handler threads are not daemons: each is tracked and
      waited for on the deadline; a handler (thread or task) still running is named in
      ``still_running``, never abandoned silently. Such a thread still holds the
      interpreter's exit after ``stop()`` returned: when ``report.terminated`` is False,
      end the process with ``os._exit`` (``examples/server_shutdown_use.py`` does).
    * asyncio: a response written before its ``request()`` block ends is flushed before the
      connection closes; a connection interrupted at the deadline is aborted.

Python:
    3.11+, standard library only; checked on 3.11.7, 3.12.1 and 3.13.0, whose
    ``socketserver`` and ``http.server`` behave alike here. `GracefulServer` serves with its
    own loop (no ``serve_forever`` polling, no ``shutdown()`` that can deadlock) from the
    servers' public methods. asyncio's ``Server.wait_closed`` changed in 3.12
    (:gh:`79033`) and ``close_clients``/``abort_clients`` are new in 3.13;
    `AsyncGracefulServer` uses neither, so it does the same on all three. Until 3.13,
    asyncio logs a cancelled connection task as an error, so a connection task here ends
    normally when it is cancelled.

Docs: docs/patterns/server_shutdown.md
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.server
import logging
import math
import os
import selectors
import signal
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

__all__ = [
    "AsyncConnection",
    "AsyncGracefulServer",
    "GracefulServer",
    "ServerStopReport",
    "ServerStopping",
    "main",
]

logger = logging.getLogger(__name__)

# The share of a stop's budget kept for the forced close and the last wait for the handlers;
# the drain gets the rest. At most `_FORCE_RESERVE` seconds are kept.
_FORCE_SHARE = 0.2
_FORCE_RESERVE = 1.0


# The same code is in asyncio_shutdown.py and exit_hooks.py (each module is copied alone);
# pinned by tests/test_copies.py.
def _seconds(value: object, name: str, *, allow_none: bool = False) -> float:
    """A number of seconds >= 0 as a float; ``math.inf`` means "as long as it takes"."""
    if value is None and allow_none:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return math.inf if value > sys.float_info.max else float(value)  # 10**400: no overflow


def _left(deadline: float) -> float:
    """Seconds until ``deadline`` (a `time.monotonic` value), as a wait accepts them."""
    return max(0.0, min(deadline - time.monotonic(), threading.TIMEOUT_MAX))


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
        completed: requests that ended after the stop began with their handler returning,
            by name: those in flight or half read when it began (HTTP: a request whose
            first byte had arrived), and, over HTTP, those begun during the ``grace``.
            asyncio starts none after the stop began (see ``refused``).
        failed: requests that ended after the stop began because their handler raised, by
            name; each is logged at ERROR with its traceback. Their clients got no answer,
            or part of one.
        interrupted: connections closed by force at the drain deadline with a request in
            flight or half read (HTTP: its request line, once read, names it), by name.
        idle_closed: idle keep-alive connections the stop closed: no byte of a next
            request had arrived. asyncio sees only `AsyncConnection.request` blocks: a
            connection outside one is idle, whatever its handler was reading.
        refused: connections accepted after the stop began and closed unanswered, and
            (asyncio) requests that `AsyncConnection.request` refused because the stop
            had begun; connections the kernel refused after the listener closed are not
            seen and not counted.
        not_ready: readiness checks (``readiness_path``) answered 503 after the stop
            began. With a ``grace``, none means no load balancer asked in time.
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


class _Connection:
    """One accepted connection and the handler thread that serves it.

    ``state`` is "idle" (waiting for a next request), "reading" (a request's first byte
    has arrived, the request is not yet whole), "busy" (a request in flight) or "closed"
    (the stop closed it); it changes only under the server's lock. The stop drains a
    "reading" connection as it drains a "busy" one.
    """

    def __init__(self, sock: Any, address: Any, http: bool) -> None:
        self.sock = sock
        self.address = address
        self.peer = f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)
        self.http = http
        self.state = "idle" if http else "busy"
        self.request = ""  # "GET /slow" while an HTTP request is read or in flight
        self.forced = False  # the stop shut its socket down while a request was in flight
        self.failed = ""  # the name of the request whose handler raised, once one has
        self.thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        """The peer, then the request when known: ``"127.0.0.1:53114 GET /slow"``."""
        return f"{self.peer} {self.request}" if self.request else self.peer

    def shut(self) -> None:
        """Shut the socket down both ways: a handler blocked reading or writing it wakes."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


# What the stop closes as "idle" and what it drains, then forces, as "busy": a request half
# read is in flight.
_STATES = {"idle": ("idle",), "busy": ("busy", "reading")}


def _tracked_http_handler(base: type[Any], owner: GracefulServer) -> type[Any]:
    """``base`` with each request reported to ``owner`` and the readiness path answered."""

    class Tracked(base):  # type: ignore[misc]
        _status = 0  # the status of the response being sent
        _connection_said = False  # whether that response has a Connection header yet

        def parse_request(self) -> bool:
            line = self.raw_requestline.decode("iso-8859-1").split()[:2]
            owner._request_arrives(" ".join(line)[:200])  # the headers may be slow to come
            return bool(super().parse_request()) and owner._request_begins(self)

        def handle_one_request(self) -> None:
            failed = True
            try:
                if self._await_request():
                    super().handle_one_request()
                failed = False
            finally:
                owner._request_ends(self, failed=failed)

        def _await_request(self) -> bool:
            """Wait for the next request's first byte, so a stop sees it half read."""
            peek = getattr(self.rfile, "peek", None)  # None if the handler reads unbuffered
            try:
                if peek is not None and peek(1):
                    owner._request_arrives("")
            except TimeoutError as exc:  # as handle_one_request would say it
                self.log_error("Request timed out: %r", exc)
                self.close_connection = True
                return False
            return True

        def send_response_only(self, code: int, message: str | None = None) -> None:
            # Each response says its own: a "100 Continue" sent for "Expect: 100-continue"
            # comes before the final response of the same request.
            self._status, self._connection_said = code, False
            super().send_response_only(code, message)

        def send_header(self, keyword: str, value: str) -> None:
            if keyword.lower() == "connection":
                self._connection_said = True
                if owner.stopping and self._status >= 200:
                    value = "close"
            super().send_header(keyword, value)

        def end_headers(self) -> None:
            # Once the stop began, no final response invites the client to send another
            # request (an interim 1xx is not the answer; the final one after it says it).
            if owner.stopping and self._status >= 200 and not self._connection_said:
                self.send_header("Connection", "close")
            super().end_headers()

    Tracked.__name__ = Tracked.__qualname__ = f"Tracked{base.__name__}"
    return Tracked


class GracefulServer:
    """A `socketserver` TCP server served on a thread of its own, stopped on a deadline.

    Args:
        server: a bound, listening server (``ThreadingHTTPServer(("127.0.0.1", 0), H)``);
            its handlers run on threads this object starts, whatever its mix-in says.
        stop_timeout: the budget of ``stop()`` with no argument.
        grace: seconds between the readiness check failing and the listener closing, for
            a load balancer to notice; a second ``stop()`` call cuts it short.
        readiness_path: the path an HTTP server answers itself: 200 while ready, 503 once
            the stop began (None: not served; read ``ready`` instead).
        name: the prefix of this object's thread names.

    A handler that raises is logged at ERROR with its traceback, under this module's
    logger; then ``server.handle_error`` is called if the server's class overrides it
    (``BaseServer``'s own would print the traceback a second time).
    """

    def __init__(
        self,
        server: socketserver.TCPServer,
        *,
        stop_timeout: float = 30.0,
        grace: float = 0.0,
        readiness_path: str | None = "/ready",
        name: str = "server",
    ) -> None:
        if not isinstance(server, socketserver.TCPServer):
            raise TypeError(f"server must be a socketserver.TCPServer, not {server!r}")
        self.stop_timeout = _seconds(stop_timeout, "stop_timeout")
        self.grace = _seconds(grace, "grace")
        self.server = server
        self.readiness_path = readiness_path
        self.name = name
        handler_class: Any = server.RequestHandlerClass
        self._http = isinstance(handler_class, type) and issubclass(
            handler_class, http.server.BaseHTTPRequestHandler
        )
        if self._http:
            server.RequestHandlerClass = _tracked_http_handler(handler_class, self)
        # One lock for every field below; `_changed` is notified when a connection ends or
        # changes state, the serve loop ends, the grace is cut or a report is recorded.
        # Re-entrant: a signal handler's stop() may run on a thread that holds it.
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._connections: dict[threading.Thread, _Connection] = {}
        self._threads: list[threading.Thread] = []  # every thread started, for a last join
        self._started = False
        self._stop_began: float | None = None  # monotonic time of the first stop()
        self._closing = False  # the serve loop must end and the listener close
        self._cut_grace = False
        self._serve_thread: threading.Thread | None = None
        self._serve_ended = threading.Event()
        self._wake_r: socket.socket | None = None  # the stop writes a byte to end the loop
        self._wake_w: socket.socket | None = None
        self._stopper: threading.Thread | None = None  # runs a stop asked from inside
        self._stopping_in: threading.Thread | None = None  # the thread inside _stop_once
        # Idents of the threads inside stop(), running it or waiting for another's: a stop()
        # that finds its own thread here is a signal handler on top of that call, which
        # cannot go on until it returns, so it returns at once. A set: add and discard are
        # atomic, and a handler reading it takes no lock.
        self._in_stop: set[int] = set()
        self._report: ServerStopReport | None = None
        self._completed: list[str] = []
        self._failed: list[str] = []
        self._interrupted: list[str] = []
        self._idle_closed = 0
        self._refused = 0
        self._not_ready = 0  # readiness checks answered 503
        self._count = 0

    @property
    def address(self) -> tuple[str, int]:
        """The (host, port) the server listens on."""
        host, port = self.server.server_address[:2]
        return str(host), int(port)

    @property
    def ready(self) -> bool:
        """Whether it serves and no stop began yet, which is what a readiness check reports."""
        return self._started and self._stop_began is None

    @property
    def accepting(self) -> bool:
        """Whether new connections are still served; False once the stop closes the listener."""
        return self._started and not self._closing and not self._serve_ended.is_set()

    @property
    def stopping(self) -> bool:
        """Whether a stop began."""
        return self._stop_began is not None

    @property
    def report(self) -> ServerStopReport | None:
        """The report of the stop that ended it (None until one completed), ``with`` too."""
        return self._report

    def start(self) -> Self:
        """Serve on a new thread; all or nothing, once."""
        with self._lock:
            if self._started or self._stop_began is not None:
                raise RuntimeError(f"{self.name} was started or stopped already")
            self._started = True
        self._wake_r, self._wake_w = socket.socketpair()
        thread = threading.Thread(
            target=self._serve, args=(self._wake_r,), name=f"{self.name}-serve"
        )
        try:
            thread.start()
        except BaseException:
            self._wake_r.close()
            self._wake_w.close()
            self._serve_ended.set()
            raise
        self._serve_thread = thread
        self._threads.append(thread)
        return self

    def __enter__(self) -> Self:
        if not self._started:
            return self.start()
        if self._stop_began is not None:
            raise RuntimeError(f"{self.name} was stopped already")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the serve loop, on its own thread ----------------------------------------------

    def _serve(self, wake: socket.socket) -> None:
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self.server, selectors.EVENT_READ)
                selector.register(wake, selectors.EVENT_READ)
                while not self._closing:
                    events = selector.select()
                    if self._closing:
                        break
                    if any(key.fileobj is self.server for key, _ in events):
                        self._accept()
                    self.server.service_actions()
            self._refuse_backlog()
        finally:
            with contextlib.suppress(OSError):
                self.server.socket.close()  # the kernel refuses new connections from here
            logger.info("%s: listener closed", self.name)
            with self._lock:
                wake.close()
                if self._wake_w is not None:
                    self._wake_w.close()
                self._serve_ended.set()
                self._changed.notify_all()

    def _accept(self) -> None:
        """What ``BaseServer`` does for one ready connection, with a tracked thread."""
        try:
            request, address = self.server.get_request()
        except OSError:
            return
        if not self.server.verify_request(request, address):
            self.server.shutdown_request(request)
            return
        if self._closing:  # the stop began while verify_request ran
            self._refuse(request)
            return
        connection = _Connection(request, address, self._http)
        with self._lock:
            self._count += 1
            thread = threading.Thread(
                target=self._handle, args=(connection,), name=f"{self.name}-conn-{self._count}"
            )
            connection.thread = thread
            self._connections[thread] = connection
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        try:
            thread.start()
        except BaseException:
            with self._lock:
                del self._connections[thread]
            self.server.shutdown_request(request)
            raise

    def _refuse(self, request: Any) -> None:
        with self._lock:
            self._refused += 1
        self.server.shutdown_request(request)

    def _refuse_backlog(self) -> None:
        """Close, unanswered, the connections the kernel accepted that the loop did not."""
        with contextlib.suppress(OSError):
            self.server.socket.setblocking(False)
            while True:
                request, _ = self.server.get_request()
                self._refuse(request)

    # --- one handler thread per connection ----------------------------------------------

    def _handle(self, connection: _Connection) -> None:
        failed = False
        try:
            try:
                self.server.finish_request(connection.sock, connection.address)
            except Exception:  # noqa: BLE001 (as socketserver does: it is reported here)
                if connection.forced or (connection.state == "closed" and not connection.failed):
                    logger.debug("%s: %s ended by the close", self.name, connection.name)
                else:
                    failed = True
                    self._report_failure(connection)
            finally:
                self.server.shutdown_request(connection.sock)
        finally:
            with self._lock:
                if not connection.http and self.stopping and not connection.forced:
                    (self._failed if failed else self._completed).append(connection.name)
                del self._connections[threading.current_thread()]
                self._changed.notify_all()

    def _report_failure(self, connection: _Connection) -> None:
        """Log the handler's exception (being handled) at ERROR; the server's hook if it has one."""
        name = connection.failed or connection.name
        logger.error("%s: request %s failed", self.name, name, exc_info=True)
        if type(self.server).handle_error is not socketserver.BaseServer.handle_error:
            self.server.handle_error(connection.sock, connection.address)

    def _request_arrives(self, what: str) -> None:
        """Called by an HTTP handler as a request arrives; ``what`` is its line once read."""
        with self._lock:
            connection = self._connections.get(threading.current_thread())
            if connection is not None and connection.state in ("idle", "reading"):
                connection.state = "reading"
                connection.request = what

    def _request_begins(self, handler: Any) -> bool:
        """Called by an HTTP handler with the request read: False if it is not to be served."""
        if self.readiness_path is not None and handler.path == self.readiness_path:
            self._answer_readiness(handler)
            return False
        with self._lock:
            connection = self._connections.get(threading.current_thread())
            if connection is None or connection.state == "closed" or connection.forced:
                handler.close_connection = True  # the stop closed it as the request arrived
                return False
            connection.state = "busy"
            connection.request = f"{handler.command} {handler.path}"
            return True

    def _request_ends(self, handler: Any, *, failed: bool) -> None:
        with self._lock:
            connection = self._connections.get(threading.current_thread())
            if connection is None or connection.state not in _STATES["busy"]:
                return
            if failed and not connection.forced:
                connection.failed = connection.name  # _handle logs the exception by it
            # A request half read and not served (a readiness check, a 400) is not counted.
            counted = connection.state == "busy" or failed
            if counted and self.stopping and not connection.forced:
                (self._failed if failed else self._completed).append(connection.name)
            if not connection.forced:
                connection.state = "closed" if self._closing else "idle"
                connection.request = ""
                if self._closing:
                    handler.close_connection = True
            self._changed.notify_all()

    def _answer_readiness(self, handler: Any) -> None:
        ready = self.ready
        if not ready:
            with self._lock:
                self._not_ready += 1
        body = b"ready\n" if ready else b"stopping\n"
        handler.send_response(200 if ready else 503)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(body)

    # --- stop ---------------------------------------------------------------------------

    def stop(self, timeout: float | None = None) -> ServerStopReport:
        """Stop within ``timeout`` (None: ``stop_timeout``) and report; idempotent."""
        me = threading.get_ident()
        if me in self._in_stop:  # a signal handler inside this thread's stop(): never block
            return self._stop(timeout, nested=True)
        try:  # added inside the try: a Ctrl-C here cannot leave this thread marked inside
            self._in_stop.add(me)
            return self._stop(timeout, nested=False)
        finally:
            self._in_stop.discard(me)

    def _stop(self, timeout: float | None, *, nested: bool) -> ServerStopReport:
        budget = _seconds(self.stop_timeout if timeout is None else timeout, "timeout")
        deadline = time.monotonic() + budget
        me = threading.current_thread()
        with self._lock:
            if self._report is not None:
                return self._report
            if self._stop_began is None:
                self._stop_began = time.monotonic()
                logger.info("%s: stopping: not ready", self.name)
            self._cut_grace = self._stopping_in is not None  # a second stop cuts the grace
            self._changed.notify_all()
            inside = me in self._connections or me is self._serve_thread
            if inside or nested or self._stopping_in is me or self._stopper is me:
                # A handler, the serve thread, or a signal handler on a thread already
                # inside stop() (running it or waiting for another thread's): it cannot
                # wait for itself. Start the stop, return.
                if inside and self._stopping_in is None and self._stopper is None:
                    self._stopper = threading.Thread(
                        target=self._stop_once, args=(self.stop_timeout,), name=f"{self.name}-stop"
                    )
                    self._stopper.start()
                return self._provisional()
            if self._stopping_in is not None or self._stopper is not None:
                while self._report is None and self._changed.wait(_left(deadline)):
                    pass
                return self._report or self._provisional()
            self._stopping_in = me
        try:
            return self._stop_once(budget)
        finally:
            with self._lock:
                if self._stopping_in is me:
                    self._stopping_in = None

    def _stop_once(self, budget: float) -> ServerStopReport:
        began = time.monotonic()
        deadline = began + budget
        drain_until = deadline - min(budget * _FORCE_SHARE, _FORCE_RESERVE)
        with self._lock:
            if self._stopper is threading.current_thread():
                self._stopping_in = self._stopper
            grace_until = (self._stop_began or began) + self.grace
            while not self._cut_grace and self._changed.wait(_left(min(grace_until, deadline))):
                pass
            self._closing = True
            self._end_serve_loop()
            while not self._serve_ended.is_set() and self._changed.wait(_left(deadline)):
                pass
            self._close_connections("idle")
            while self._busy() and self._changed.wait(_left(drain_until)):
                pass
            self._close_connections("busy")
            while self._connections and self._changed.wait(_left(deadline)):
                pass
            report = self._make_report(time.monotonic() - began)
            self._report = report
            self._changed.notify_all()
        if report.terminated:
            self.server.server_close()
            for thread in list(self._threads):  # each has ended its work: let it exit
                if thread is not threading.current_thread():
                    thread.join(_left(deadline))
        logger.info("%s: stopped: %s", self.name, report)
        return report

    def _end_serve_loop(self) -> None:
        """Wake the serve loop, which closes the listener; close it here if none runs."""
        if self._serve_thread is None:
            self._serve_ended.set()
            with contextlib.suppress(OSError):
                self.server.socket.close()
        elif self._wake_w is not None:
            with contextlib.suppress(OSError):  # closed already: the loop has ended
                self._wake_w.send(b"x")

    def _close_connections(self, state: str) -> None:
        """Shut down the sockets of the "idle" connections, or the "busy" (and "reading") ones."""
        for connection in self._connections.values():
            if connection.forced or connection.state not in _STATES[state]:
                continue
            if state == "idle":
                connection.state = "closed"
                self._idle_closed += 1
            else:
                connection.forced = True
                self._interrupted.append(connection.name)
                logger.warning("%s: closing %s by force", self.name, connection.name)
            connection.shut()

    def _busy(self) -> bool:
        return any(c.state in _STATES["busy"] and not c.forced for c in self._connections.values())

    def _make_report(self, elapsed: float) -> ServerStopReport:
        still = tuple(c.name for c in self._connections.values())
        if not self._serve_ended.is_set():
            still += (f"{self.name}-serve",)
        return ServerStopReport(
            terminated=not still,
            still_running=still,
            completed=tuple(self._completed),
            failed=tuple(self._failed),
            interrupted=tuple(self._interrupted),
            idle_closed=self._idle_closed,
            refused=self._refused,
            not_ready=self._not_ready,
            elapsed=elapsed,
        )

    def _provisional(self) -> ServerStopReport:
        """A report of the moment, not recorded: the stop is still under way."""
        still = tuple(c.name for c in self._connections.values())
        if self._started and not self._serve_ended.is_set():
            still += (f"{self.name}-serve",)
        return ServerStopReport(
            terminated=False,
            still_running=still or (f"{self.name}-stop",),
            completed=tuple(self._completed),
            failed=tuple(self._failed),
            interrupted=tuple(self._interrupted),
            idle_closed=self._idle_closed,
            refused=self._refused,
            not_ready=self._not_ready,
            elapsed=time.monotonic() - (self._stop_began or time.monotonic()),
        )


# --- asyncio servers -------------------------------------------------------------------


def _a_wait_timeout(seconds: float) -> float | None:
    """``seconds`` for `asyncio.wait`: None for "as long as it takes" (no timer at all)."""
    return None if seconds == math.inf else max(seconds, 0.0)


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


# --- an example: python -m patterns.server_shutdown ------------------------------------


class _SlowHandler(http.server.BaseHTTPRequestHandler):
    """GET /slow?seconds=S streams S*10 lines, one every 0.1 s; any other path is fast."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        seconds = float(query.partition("=")[2] or 1) if path == "/slow" else 0.0
        lines = int(seconds * 10)
        self.send_response(200)
        self.send_header("Content-Length", str(lines * 5 + 5))
        self.end_headers()
        self.wfile.write(b"head\n")  # the client knows the request is in flight
        for _ in range(lines):
            time.sleep(0.1)  # the work itself
            self.wfile.write(b"line\n")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        logger.info("%s %s", self.address_string(), format % args)


def main(argv: list[str] | None = None) -> int:
    """Serve slow requests until SIGTERM or SIGINT, stop on the budget, log the report.

    Exit status 0 when the stop terminated, 1 when handlers were left running.
    """
    parser = argparse.ArgumentParser(prog="python -m patterns.server_shutdown")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--stop-timeout", type=float, default=10.0)
    parser.add_argument("--grace", type=float, default=0.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    signalled = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: signalled.set())
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), _SlowHandler)
    with GracefulServer(httpd, stop_timeout=args.stop_timeout, grace=args.grace) as server:
        logger.info("serving on %s:%d", *server.address)
        signalled.wait()
        report = server.stop()
    logger.info("report: %s", report)
    if not report.terminated:
        logging.shutdown()
        os._exit(1)  # a handler ignored the close: it must not hold the exit
    return 0


if __name__ == "__main__":
    sys.exit(main())
