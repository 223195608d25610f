# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""Stop a threaded server on a deadline: not ready, stop accepting, drain, close, report.

TL;DR: wrap a `socketserver` TCP server (``http.server.ThreadingHTTPServer`` included) in a
`GracefulServer`; ``start()`` serves it on a thread of its own and ``stop(timeout)``
returns a `ServerStopReport` within the budget: the readiness check fails first, then
(after an optional ``grace``) the listener closes, idle keep-alive connections close at
once, requests in flight may finish until the drain deadline, the rest are closed by force.
A handler thread still running (not a daemon) is named in ``still_running``: then end the
process with ``os._exit``. For asyncio, see ``server_shutdown_asyncio.py``.

Python:
    3.11+, standard library only; ``socketserver`` and ``http.server`` behave alike here on
    3.11.7, 3.12.1 and 3.13.0. `GracefulServer` serves with its own loop (no polling, no
    ``shutdown()`` that can deadlock), built from the servers' public methods.

Docs: docs/patterns/server_shutdown.md
"""

from __future__ import annotations

import contextlib
import http.server
import logging
import math
import selectors
import socket
import socketserver
import sys
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Self

__all__ = ["GracefulServer", "ServerStopReport"]

logger = logging.getLogger(__name__)

# The forced close keeps this share of a budget (at most `_FORCE_RESERVE` s); the drain, the rest.
_FORCE_SHARE = 0.2
_FORCE_RESERVE = 1.0


# The same code is in server_shutdown_asyncio.py; pinned by tests/test_copies.py.
@dataclass(frozen=True)
class ServerStopReport:
    """What a server's stop found when it returned.

    Attributes:
        terminated: the listener is closed and every connection and handler ended in time.
        still_running: handlers still running at the deadline (they ignored the close), by name.
        completed: requests that ended after the stop began with their handler returning,
            by name: those in flight or half read when it began (HTTP: a request whose
            first byte had arrived), and, over HTTP, those begun during the ``grace``.
        failed: requests that ended after the stop began because their handler raised
            (logged at ERROR with its traceback), by name; their clients got no full answer.
        interrupted: connections closed by force at the drain deadline with a request in
            flight or half read (HTTP: its request line, once read, names it), by name.
        idle_closed: idle keep-alive connections the stop closed (no byte of a next request).
        refused: connections accepted after the stop began and closed unanswered (those
            the kernel refused once the listener closed are not seen).
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

    A handler that raises is logged at ERROR with its traceback, then ``server.handle_error``
    is called if the server's class overrides it (``BaseServer``'s would print it again).
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
        self._in_stop: set[int] = set()  # idents of the threads inside stop(): _stop_guarded
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

    def stop(self, timeout: float | None = None) -> ServerStopReport:
        """Stop within ``timeout`` (None: ``stop_timeout``) and report; idempotent.

        Not ready at once; after the ``grace`` the listener and the idle connections close,
        requests in flight may finish until the drain deadline, the rest are closed by force
        (``_stop_once``). From a handler, the serve thread or a signal handler, it returns at once.
        """
        budget = _seconds(self.stop_timeout if timeout is None else timeout, "timeout")
        return _stop_guarded(self, budget)

    def __enter__(self) -> Self:
        if not self._started:
            return self.start()
        if self._stop_began is not None:
            raise RuntimeError(f"{self.name} was stopped already")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the stop, phase after phase on one deadline -------------------------------------

    def _stop_once(self, budget: float) -> ServerStopReport:
        began = time.monotonic()
        deadline = began + budget
        drain_until = deadline - min(budget * _FORCE_SHARE, _FORCE_RESERVE)
        with self._lock:
            if self._stopper is threading.current_thread():
                self._stopping_in = self._stopper
            grace_until = (self._stop_began or began) + self.grace
            self._changed.wait_for(lambda: self._cut_grace, _left(min(grace_until, deadline)))
            self._closing = True
            self._end_serve_loop()
            self._changed.wait_for(self._serve_ended.is_set, _left(deadline))
            self._close_connections("idle")
            self._changed.wait_for(lambda: not self._busy(), _left(drain_until))
            self._close_connections("busy")
            self._changed.wait_for(lambda: not self._connections, _left(deadline))
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
            with contextlib.suppress(OSError):  # a handler blocked reading or writing wakes
                connection.sock.shutdown(socket.SHUT_RDWR)

    def _busy(self) -> bool:
        return any(c.state in _STATES["busy"] and not c.forced for c in self._connections.values())

    def _make_report(self, elapsed: float) -> ServerStopReport:
        still = tuple(c.name for c in self._connections.values())
        if self._started and not self._serve_ended.is_set():
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
            except Exception:  # as socketserver does: it is reported here
                if connection.forced or (connection.state == "closed" and not connection.failed):
                    logger.debug("%s: %s ended by the close", self.name, connection.name)
                else:
                    failed = True  # logged with its traceback; the server's hook if it has one
                    name = connection.failed or connection.name
                    logger.error("%s: request %s failed", self.name, name, exc_info=True)
                    if type(self.server).handle_error is not socketserver.BaseServer.handle_error:
                        self.server.handle_error(connection.sock, connection.address)
            finally:
                self.server.shutdown_request(connection.sock)
        finally:
            with self._lock:
                if not connection.http and self.stopping and not connection.forced:
                    (self._failed if failed else self._completed).append(connection.name)
                del self._connections[threading.current_thread()]
                self._changed.notify_all()

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


# --- the connections it tracks, and the HTTP handler it wraps ---------------------------


class _Connection:
    """One accepted connection, served by one handler thread; ``state`` changes under the lock.

    "idle" (waiting for a next request), "reading" (a request's first byte has arrived; drained
    as a busy one), "busy" (a request in flight) or "closed" (the stop closed it).
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

    @property
    def name(self) -> str:
        """The peer, then the request when known: ``"127.0.0.1:53114 GET /slow"``."""
        return f"{self.peer} {self.request}" if self.request else self.peer


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
            # Each response says its own: a "100 Continue" comes before the final response.
            self._status, self._connection_said = code, False
            super().send_response_only(code, message)

        def send_header(self, keyword: str, value: str) -> None:
            if keyword.lower() == "connection":
                self._connection_said = True
                if owner.stopping and self._status >= 200:
                    value = "close"
            super().send_header(keyword, value)

        def end_headers(self) -> None:
            # Once the stop began, no final response (an interim 1xx is none) invites another.
            if owner.stopping and self._status >= 200 and not self._connection_said:
                self.send_header("Connection", "close")
            super().end_headers()

    Tracked.__name__ = Tracked.__qualname__ = f"Tracked{base.__name__}"
    return Tracked


# --- the lifecycle contract: seconds, deadlines, the stopper hand-off, provisional reports -


# The same code is in every pattern module that checks seconds; pinned by tests/test_copies.py.
def _seconds(value: object, name: str, *, allow_none: bool = False) -> float:
    """A number of seconds >= 0 as a float; ``math.inf`` means "as long as it takes"."""
    if value is None and allow_none:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return math.inf if value > sys.float_info.max else float(value)  # 10**400: no overflow


def _left(deadline: float) -> float:
    """Seconds until ``deadline``, as a wait accepts them (at most ``TIMEOUT_MAX``)."""
    return min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)


def _check_report(terminated: bool, still_running: tuple[str, ...]) -> None:
    if terminated and still_running:
        raise ValueError(f"a report cannot say terminated=True with still_running={still_running}")


def _stop_guarded(server: GracefulServer, budget: float) -> ServerStopReport:
    """`GracefulServer.stop`, safe from a signal handler that interrupts a ``stop()``."""
    me = threading.get_ident()
    if me in server._in_stop:  # a signal handler on top of this thread's stop(): never block
        return _stop_or_hand_off(server, budget, nested=True)
    try:  # added inside the try: a Ctrl-C here cannot leave this thread marked inside
        server._in_stop.add(me)
        return _stop_or_hand_off(server, budget, nested=False)
    finally:
        server._in_stop.discard(me)


def _stop_or_hand_off(server: GracefulServer, budget: float, *, nested: bool) -> ServerStopReport:
    """Mark the server not ready; run the stop here, or wait for it, or hand it off.

    A second call cuts the grace and waits for the first one's report until its own deadline;
    a call that cannot wait for itself starts the stop on a new thread and returns.
    """
    deadline = time.monotonic() + budget
    me = threading.current_thread()
    with server._lock:
        if server._report is not None:
            return server._report
        if server._stop_began is None:
            server._stop_began = time.monotonic()
            logger.info("%s: stopping: not ready", server.name)
        server._cut_grace = server._stopping_in is not None  # a second stop cuts the grace
        server._changed.notify_all()
        inside = me in server._connections or me is server._serve_thread
        if inside or nested or server._stopping_in is me or server._stopper is me:
            if inside and server._stopping_in is None and server._stopper is None:
                server._stopper = threading.Thread(
                    target=server._stop_once,
                    args=(server.stop_timeout,),
                    name=f"{server.name}-stop",
                )
                server._stopper.start()
            return _provisional(server)
        if server._stopping_in is not None or server._stopper is not None:
            server._changed.wait_for(lambda: server._report is not None, _left(deadline))
            return server._report or _provisional(server)
        server._stopping_in = me
    try:
        return server._stop_once(budget)
    finally:
        with server._lock:
            if server._stopping_in is me:
                server._stopping_in = None


def _provisional(server: GracefulServer) -> ServerStopReport:
    """A report of the moment, not recorded: the stop is still under way."""
    report = server._make_report(time.monotonic() - (server._stop_began or time.monotonic()))
    still = report.still_running or (f"{server.name}-stop",)
    return replace(report, terminated=False, still_running=still)
