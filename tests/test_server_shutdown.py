"""Stopping socketserver / http.server servers: the naive stop goes wrong, GracefulServer holds.

Every request goes over real HTTP (``http.client`` against 127.0.0.1, port 0); a slow request
is a handler that waits on an `threading.Event` the test sets. Interpreter exit and SIGTERM
are tested in child processes, with their output lines as checkpoints.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import logging
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from patterns.naive.server_shutdown import naive_serve, naive_stop
from patterns.server_shutdown import GracefulServer, ServerStopReport
from tests.support import (
    MUST_HAPPEN,
    NOISE,
    STAYS_BLOCKED,
    child_env,
    join_or_fail,
    run_in_thread,
    stays_blocked,
    wait_until,
    wait_until_blocked_in,
)

W1 = ("W1", "shutdown() from the thread running serve_forever() deadlocks")
W2 = ("W2", "ThreadingHTTPServer's daemon handlers are cut off at interpreter exit")
W3 = ("W3", "server_close() joins every non-daemon handler with no timeout, daemons not at all")
W4 = ("W4", "a kept-alive connection is still served after shutdown() and server_close()")
W5 = ("W5", "shutdown() waits up to poll_interval for serve_forever to notice")


class Slow:
    """The test's control over the handlers: /slow waits until ``release`` is set."""

    def __init__(self) -> None:
        self.entered = threading.Event()  # set by a /slow handler once it runs
        self.release = threading.Event()  # set by the test to let /slow answer
        self.threads: list[threading.Thread] = []  # every handler thread, in order
        self.inside: Callable[[Any], object] | None = None  # called on the handler's thread

    def handler(self, protocol: str = "HTTP/1.1") -> type[http.server.BaseHTTPRequestHandler]:
        """A handler class: /slow waits for ``release``; every path answers "done <path>"."""
        slow = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = protocol

            def do_GET(self) -> None:
                slow.threads.append(threading.current_thread())
                if self.path == "/slow":
                    slow.entered.set()
                    if slow.inside is not None:
                        slow.inside(self)
                    slow.release.wait(MUST_HAPPEN)
                body = f"done {self.path}\n".encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        return Handler


def get(conn: http.client.HTTPConnection, path: str) -> tuple[int, str, str | None]:
    """One GET on ``conn``: status, body, the Connection header."""
    conn.request("GET", path)
    response = conn.getresponse()
    return response.status, response.read().decode(), response.getheader("Connection")


def connect(address: tuple[str, int]) -> http.client.HTTPConnection:
    """A client connection to ``address`` (it connects on its first request)."""
    return http.client.HTTPConnection(*address, timeout=MUST_HAPPEN)


def refused(address: tuple[str, int]) -> None:
    """Connect to ``address``, which must raise ConnectionRefusedError (closed if it does not)."""
    socket.create_connection(address, timeout=MUST_HAPPEN).close()


@contextlib.contextmanager
def client(address: tuple[str, int], path: str) -> Iterator[dict[str, Any]]:
    """A GET on its own thread; the dict gets ``result`` (or ``error``) when it ends."""
    conn = connect(address)
    thread, outcome = run_in_thread(lambda: get(conn, path), f"client {path}")
    try:
        yield outcome
    finally:
        try:
            join_or_fail(thread)
        finally:
            conn.close()


@contextlib.contextmanager
def graceful(
    slow: Slow, server_class: type[socketserver.TCPServer] = http.server.ThreadingHTTPServer,
    **options: Any,
) -> Iterator[GracefulServer]:  # fmt: skip
    """A started GracefulServer around ``server_class``; released and stopped on the way out."""
    httpd = server_class(("127.0.0.1", 0), slow.handler())
    server = GracefulServer(httpd, **options).start()
    try:
        yield server
    finally:
        slow.release.set()
        server.stop(MUST_HAPPEN)


# --- W1: shutdown() from the serve thread or from a handler ----------------------------------

_DEADLOCK_CHILD = """
import http.server, sys, threading
from patterns.naive.server_shutdown import naive_stop

where = sys.argv[1]

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        print("calling shutdown from a handler", flush=True)
        naive_stop(self.server)
        print("shutdown returned", flush=True)

class Server(http.server.HTTPServer):
    def service_actions(self):
        if where == "serve-thread":
            print("calling shutdown from the serve thread", flush=True)
            naive_stop(self)
            print("shutdown returned", flush=True)

httpd = Server(("127.0.0.1", 0), Handler)
if where == "handler":
    import http.client
    def request():
        conn = http.client.HTTPConnection(*httpd.server_address[:2])
        conn.request("GET", "/")
    threading.Thread(target=request, daemon=True).start()
httpd.serve_forever(poll_interval=0.01)
print("serve_forever returned", flush=True)
"""


@pytest.mark.race(*W1)
@pytest.mark.parametrize("where", ["serve-thread", "handler"])
def test_naive_shutdown_from_the_serving_thread_deadlocks(
    where: str, record_property: Callable[[str, object], None]
) -> None:
    """shutdown() waits for serve_forever() to end, which is waiting for shutdown() to return.

    From ``service_actions`` (the serve thread) or from a handler of a non-threading
    ``HTTPServer`` (which runs on the serve thread), the child never gets past the call.
    """
    child = subprocess.Popen(
        [sys.executable, "-c", _DEADLOCK_CHILD, where],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()  # the checkpoint: the call was made
        assert line.startswith("calling shutdown"), line
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(STAYS_BLOCKED * 5)  # it must not return; we look for a second
    finally:
        child.kill()
        out, _ = child.communicate(timeout=MUST_HAPPEN)
    record_property(
        "observed",
        f"on {sys.version_info.major}.{sys.version_info.minor}, shutdown() from the {where}"
        f" of an HTTPServer never returned (child killed after {STAYS_BLOCKED * 5:.0f} s)",
    )
    assert "shutdown returned" not in out


@pytest.mark.race(*W1)
def test_naive_shutdown_from_a_threading_handler_returns_within_poll_interval(
    record_property: Callable[[str, object], None],
) -> None:
    """In a ThreadingHTTPServer the handler has its own thread: shutdown() returns, no deadlock.

    The stdlib's warning covers the serve thread; a threaded handler only waits for the
    serve loop's next poll (W5), on 3.11.7, 3.12.1 and 3.13.0 alike.
    """
    slow = Slow()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), slow.handler())
    returned: dict[str, float] = {}

    def shutdown_inside(handler: Any) -> None:
        began = time.monotonic()
        handler.server.shutdown()
        returned["took"] = time.monotonic() - began

    slow.inside = shutdown_inside
    slow.release.set()
    serving = naive_serve(httpd, poll_interval=0.05)
    with client(httpd.server_address[:2], "/slow") as outcome:  # type: ignore[arg-type]
        join_or_fail(serving)
    httpd.server_close()
    for thread in slow.threads:
        join_or_fail(thread)
    record_property(
        "observed",
        f"on {sys.version_info.major}.{sys.version_info.minor}, shutdown() from a"
        f" ThreadingHTTPServer handler returned after {returned['took']:.2f} s; the request"
        f" got {outcome['result'][0]}",
    )
    assert returned["took"] < MUST_HAPPEN
    assert outcome["result"][0] == 200


@pytest.mark.race(*W1)
def test_stop_from_a_handler_or_the_serve_thread_is_a_request_that_returns_at_once() -> None:
    """stop() from inside the server starts the stop and returns; the stop then completes.

    A handler or the serve thread cannot wait for itself: it gets a provisional report at
    once, and a later stop() returns the final one.
    """
    slow = Slow()
    inner: list[tuple[ServerStopReport, float]] = []

    def stop_inside(_: Any) -> None:
        began = time.monotonic()
        inner.append((server.stop(MUST_HAPPEN), time.monotonic() - began))

    slow.inside = stop_inside
    with graceful(slow) as server, client(server.address, "/slow") as outcome:
        wait_until(lambda: bool(inner), "the handler's stop() returned")
        slow.release.set()
    final = server.stop(MUST_HAPPEN)
    (provisional, took), *_ = inner
    assert took < NOISE
    assert provisional.terminated is False
    assert outcome["result"][:2] == (200, "done /slow\n")
    assert final.terminated is True
    assert final.completed == (f"{final.completed[0].split()[0]} GET /slow",)

    class StopsWhileAccepting(http.server.ThreadingHTTPServer):
        def verify_request(self, request: Any, client_address: Any) -> bool:
            began = time.monotonic()
            inner.append((server.stop(MUST_HAPPEN), time.monotonic() - began))
            return True

    inner.clear()
    server = GracefulServer(StopsWhileAccepting(("127.0.0.1", 0), slow.handler())).start()
    with socket.create_connection(server.address, timeout=MUST_HAPPEN):
        wait_until(lambda: bool(inner), "the serve thread's stop() returned")
    final = server.stop(MUST_HAPPEN)
    assert inner[0][1] < NOISE
    assert inner[0][0].terminated is False
    assert final.terminated is True


# --- W2: daemon handlers at interpreter exit -------------------------------------------------

_EXIT_CHILD = """
import http.server, sys, threading
from patterns.naive.server_shutdown import naive_serve, naive_stop
from patterns.server_shutdown import GracefulServer

release = threading.Event()

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        try:
            print("in flight", flush=True)
            release.wait(30)
            self.send_response(200)
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"done\\n")
        finally:
            print("handler finally", flush=True)
    def log_message(self, *args):
        pass

httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(httpd.server_address[1], flush=True)
if sys.argv[1] == "naive":
    naive_serve(httpd)
else:
    server = GracefulServer(httpd, stop_timeout=30).start()
    stopper = None
for line in sys.stdin:
    if line.strip() == "stop":
        if sys.argv[1] == "naive":
            naive_stop(httpd)
            break  # the main thread ends: the interpreter exits
        stopper = threading.Thread(target=lambda: print(server.stop(), flush=True))
        stopper.start()
        print("stopping", flush=True)
    elif line.strip() == "go":
        release.set()
        stopper.join(30)  # bounded: the test reads "main ends" or fails on its own timeout
        break
print("main ends", flush=True)
"""


def _exit_run(kind: str) -> tuple[tuple[int, str] | str, int, str]:
    """Run the child: a request in flight, then "stop" (and for the pattern, "go")."""
    child = subprocess.Popen(
        [sys.executable, "-c", _EXIT_CHILD, kind],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    assert child.stdin is not None
    assert child.stdout is not None
    try:
        port = int(child.stdout.readline())
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=MUST_HAPPEN)
        conn.request("GET", "/slow")
        assert child.stdout.readline() == "in flight\n"
        child.stdin.write("stop\n")
        child.stdin.flush()
        if kind == "pattern":
            assert child.stdout.readline() == "stopping\n"
            child.stdin.write("go\n")
            child.stdin.flush()
        try:
            response = conn.getresponse()
            answer: tuple[int, str] | str = (response.status, response.read().decode())
        except (http.client.RemoteDisconnected, ConnectionResetError) as exc:
            answer = type(exc).__name__
        conn.close()
        out, err = child.communicate(timeout=MUST_HAPPEN * 3)
    finally:
        child.kill()
        child.communicate()
    return answer, child.returncode, out + err


@pytest.mark.race(*W2)
def test_naive_exit_abandons_the_requests_in_flight(
    record_property: Callable[[str, object], None],
) -> None:
    """The main thread ends after naive_stop(): the daemon handler dies mid-request."""
    answer, code, output = _exit_run("naive")
    record_property(
        "observed",
        f"on {sys.version_info.major}.{sys.version_info.minor}, the child exited {code} with the"
        f" request in flight; the client got {answer}; the handler's finally ran:"
        f" {'handler finally' in output}",
    )
    assert code == 0
    assert answer in ("RemoteDisconnected", "ConnectionResetError")
    assert "handler finally" not in output


@pytest.mark.race(*W2)
def test_graceful_server_lets_the_request_in_flight_finish_before_the_exit() -> None:
    """The handler is no daemon and the stop waits for it: the client gets its answer."""
    answer, code, output = _exit_run("pattern")
    assert answer == (200, "done\n"), output
    assert code == 0
    assert "handler finally" in output
    assert "terminated=True" in output
    assert "completed=('127.0.0.1:" in output


# --- W3: server_close() and block_on_close ---------------------------------------------------


class ThreadingTCPHTTPServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """An HTTP server with socketserver's defaults: daemon_threads False, block_on_close True."""


@pytest.mark.race(*W3)
@pytest.mark.parametrize("server_class", [ThreadingTCPHTTPServer, http.server.ThreadingHTTPServer])
def test_naive_server_close_waits_for_ever_or_not_at_all(
    server_class: type[socketserver.TCPServer], record_property: Callable[[str, object], None]
) -> None:
    """Non-daemon handlers: server_close() joins them, no timeout. Daemons: it joins none.

    The same on 3.11.7, 3.12.1 and 3.13.0: ``ThreadingHTTPServer`` sets
    ``daemon_threads = True``, and ``_Threads.append`` keeps no daemon thread to join. With
    a kept-alive connection, a non-daemon handler outlives its request: server_close() then
    waits until the client hangs up.
    """
    slow = Slow()
    httpd = server_class(("127.0.0.1", 0), slow.handler())
    naive_serve(httpd, poll_interval=0.05)
    conn = connect(httpd.server_address[:2])  # type: ignore[arg-type]
    try:
        requester, outcome = run_in_thread(lambda: get(conn, "/slow"), "client /slow")
        assert slow.entered.wait(MUST_HAPPEN)
        stopper, _ = run_in_thread(lambda: naive_stop(httpd), "naive-stop")
        daemons = server_class.daemon_threads
        if daemons:
            join_or_fail(stopper)
            seen = f"server_close() returned, the handler running: {slow.threads[0].is_alive()}"
            still = slow.threads[0].is_alive()
            slow.release.set()
            join_or_fail(requester)
        else:
            wait_until_blocked_in(stopper, "server_close")
            still = stays_blocked(stopper)
            slow.release.set()
            join_or_fail(requester)  # the request was answered...
            kept = stays_blocked(stopper)  # ...and server_close() still waits: keep-alive
            seen = (
                f"server_close() blocked on the running handler: {still}; still blocked after"
                f" the answer, on the kept-alive connection: {kept}"
            )
            assert kept is True
    finally:
        conn.close()  # the client hangs up: the handler ends, and server_close() returns
    join_or_fail(stopper)
    join_or_fail(slow.threads[0])
    record_property(
        "observed",
        f"on {sys.version_info.major}.{sys.version_info.minor}, {server_class.__name__}"
        f" (daemon_threads={daemons}): {seen}",
    )
    assert still is True
    assert outcome["result"][0] == 200


@pytest.mark.race(*W3)
@pytest.mark.parametrize("server_class", [ThreadingTCPHTTPServer, http.server.ThreadingHTTPServer])
def test_graceful_server_stop_is_bounded_and_names_the_handler_it_could_not_end(
    server_class: type[socketserver.TCPServer],
) -> None:
    """stop(timeout) returns on its budget whatever the handler does, and says who is left.

    The stuck request is closed by force at the drain deadline and named in ``interrupted``
    and, while its thread runs on, in ``still_running``.
    """
    slow = Slow()
    with graceful(slow, server_class) as server, client(server.address, "/slow") as outcome:
        assert slow.entered.wait(MUST_HAPPEN)
        began = time.monotonic()
        report = server.stop(0.3)
        took = time.monotonic() - began
        slow.release.set()
    assert took < 0.3 + NOISE
    assert report.terminated is False
    assert [name.split(" ", 1)[1] for name in report.still_running] == ["GET /slow"]
    assert report.interrupted == report.still_running
    assert outcome.get("error") is not None  # the client's connection was closed by force
    assert server.stop() is report


# --- W4: kept-alive connections --------------------------------------------------------------


@pytest.mark.race(*W4)
def test_naive_kept_alive_connection_is_served_after_the_server_stopped(
    record_property: Callable[[str, object], None],
) -> None:
    """shutdown() and server_close() leave the connection's handler thread serving it."""
    slow = Slow()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), slow.handler())
    naive_serve(httpd, poll_interval=0.05)
    conn = connect(httpd.server_address[:2])  # type: ignore[arg-type]
    try:
        assert get(conn, "/first")[0] == 200
        naive_stop(httpd)
        with pytest.raises(ConnectionRefusedError):
            refused(httpd.server_address[:2])  # type: ignore[arg-type]
        alive = slow.threads[0].is_alive()
        second = get(conn, "/after-stop")
    finally:
        conn.close()
    join_or_fail(slow.threads[0])
    record_property(
        "observed",
        f"on {sys.version_info.major}.{sys.version_info.minor}, after shutdown() and"
        f" server_close() the handler thread was alive: {alive}, and a request on the kept-alive"
        f" connection got {second[0]} {second[1].strip()!r}",
    )
    assert alive is True
    assert second[:2] == (200, "done /after-stop\n")


@pytest.mark.race(*W4)
def test_graceful_server_closes_idle_kept_alive_connections_at_once() -> None:
    """An idle kept-alive connection is closed by the stop: its thread ends, nothing more is served.

    A connection busy when the stop began is answered with ``Connection: close``, so its
    client does not send another request on it.
    """
    slow = Slow()
    with graceful(slow) as server:
        idle = connect(server.address)
        try:
            assert get(idle, "/first")[:2] == (200, "done /first\n")
            # The response reached us before its handler thread recorded the request's end:
            # the connection is idle once that thread waits for the next request.
            wait_until_blocked_in(slow.threads[0], "_await_request")
            with client(server.address, "/slow") as busy:
                assert slow.entered.wait(MUST_HAPPEN)
                stopper, result = run_in_thread(lambda: server.stop(MUST_HAPPEN), "stopper")
                wait_until(lambda: not slow.threads[0].is_alive(), "the idle handler ended")
                slow.release.set()
                join_or_fail(stopper)
            with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
                get(idle, "/after-stop")
        finally:
            idle.close()
    report = result["result"]
    assert report.terminated is True
    assert report.idle_closed == 1
    assert busy["result"] == (200, "done /slow\n", "close")
    assert [name.split(" ", 1)[1] for name in report.completed] == ["GET /slow"]


# --- W5: poll_interval -----------------------------------------------------------------------


@pytest.mark.race(*W5)
def test_naive_shutdown_waits_for_the_next_poll(
    record_property: Callable[[str, object], None],
) -> None:
    """serve_forever() checks for a stop only when select() returns: up to poll_interval later.

    The test calls shutdown() once the loop is seen inside a fresh select(2.0); the bound
    asserted is generous (0.5 s), the wait seen is close to 2 s.
    """
    slow = Slow()
    looped = threading.Event()

    class Server(http.server.ThreadingHTTPServer):
        def service_actions(self) -> None:
            looped.set()

    httpd = Server(("127.0.0.1", 0), slow.handler())
    serving = naive_serve(httpd, poll_interval=2.0)
    with socket.create_connection(httpd.server_address[:2], timeout=MUST_HAPPEN):  # type: ignore[arg-type]
        assert looped.wait(MUST_HAPPEN)  # the loop ran once and went back to select()
        wait_until_blocked_in(serving, "select")
        began = time.monotonic()
        naive_stop(httpd)
        took = time.monotonic() - began
    join_or_fail(serving)
    for thread in slow.threads:
        join_or_fail(thread)
    record_property(
        "observed",
        f"on {sys.version_info.major}.{sys.version_info.minor}, shutdown() took {took:.2f} s"
        " with poll_interval=2.0",
    )
    assert took >= 0.5


@pytest.mark.race(*W5)
def test_graceful_server_stops_an_idle_server_without_polling() -> None:
    """GracefulServer's loop wakes on a byte written by stop(): no poll interval to wait out."""
    slow = Slow()
    with graceful(slow) as server:
        began = time.monotonic()
        report = server.stop(MUST_HAPPEN)
        took = time.monotonic() - began
    assert report.terminated is True
    assert took < NOISE


# --- readiness, grace, refusal ---------------------------------------------------------------


def test_readiness_fails_first_while_the_server_still_accepts_during_the_grace() -> None:
    """Once stop() began, /ready answers 503 while new connections are still served.

    The grace ends when a second stop() arrives (or when ``grace`` has passed); then the
    listener closes and new connections are refused by the kernel.
    """
    slow = Slow()
    with graceful(slow, grace=MUST_HAPPEN * 3, readiness_path="/ready") as server:
        probe = connect(server.address)
        try:
            assert get(probe, "/ready")[:2] == (200, "ready\n")
            stopper, result = run_in_thread(lambda: server.stop(MUST_HAPPEN * 4), "stopper")
            wait_until(lambda: not server.ready, "the stop began")
            assert server.accepting is True
            with contextlib.closing(connect(server.address)) as fresh:
                assert get(fresh, "/ready")[:2] == (503, "stopping\n")
            with contextlib.closing(connect(server.address)) as fresh:
                assert get(fresh, "/during-grace") == (200, "done /during-grace\n", "close")
            second = server.stop(MUST_HAPPEN)  # cuts the grace short
            join_or_fail(stopper)
        finally:
            probe.close()
    with pytest.raises(ConnectionRefusedError):
        refused(server.address)
    assert second is result["result"]
    assert second.terminated is True
    assert [name.split(" ", 1)[1] for name in second.completed] == ["GET /during-grace"]


def test_connections_accepted_after_the_listener_began_closing_are_refused() -> None:
    """A connection the serve loop was letting in when the stop came, and the backlog, are refused.

    Both are closed unanswered and counted in ``refused``.
    """
    slow = Slow()
    verifying, let_in = threading.Event(), threading.Event()

    class Gated(http.server.ThreadingHTTPServer):
        def verify_request(self, request: Any, client_address: Any) -> bool:
            verifying.set()
            let_in.wait(MUST_HAPPEN)
            return True

    server = GracefulServer(Gated(("127.0.0.1", 0), slow.handler())).start()
    first = socket.create_connection(server.address, timeout=MUST_HAPPEN)
    second = socket.create_connection(server.address, timeout=MUST_HAPPEN)
    try:
        for sock in (first, second):
            sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert verifying.wait(MUST_HAPPEN)
        stopper, result = run_in_thread(lambda: server.stop(MUST_HAPPEN), "stopper")
        wait_until(lambda: not server.accepting, "the listener is closing")
        let_in.set()
        join_or_fail(stopper)
        answers = [sock.recv(100) for sock in (first, second)]
    finally:
        first.close()
        second.close()
    assert answers == [b"", b""]
    assert result["result"].refused == 2
    assert result["result"].terminated is True


# --- the lifecycle ---------------------------------------------------------------------------


def test_a_plain_tcp_server_is_stopped_by_force_and_reported_by_peer() -> None:
    """A non-HTTP handler is one request per connection: it is busy from accept to end.

    The budget leaves the forced close 0.4 s for the woken handler to end, ample on a loaded
    machine (with 0.04 s, one run in 20 on a loaded 3.12 ended after the deadline).
    """
    entered = threading.Event()

    class Echo(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            entered.set()
            self.rfile.readline()  # blocks until the client writes or the socket is shut

    server = GracefulServer(socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)).start()
    with socket.create_connection(server.address, timeout=MUST_HAPPEN) as sock:
        assert entered.wait(MUST_HAPPEN)
        report = server.stop(2.0)
        assert sock.recv(10) == b""
        peer = f"127.0.0.1:{sock.getsockname()[1]}"
    assert report.terminated is True
    assert report.interrupted == (peer,)


def test_the_constructor_refuses_what_is_not_a_tcp_server_and_bad_seconds() -> None:
    """A wrong server type is a TypeError; a bad grace a ValueError naming it."""
    with pytest.raises(TypeError):
        GracefulServer(object())  # type: ignore[arg-type]
    with (
        http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow().handler()) as httpd,
        pytest.raises(ValueError, match="grace"),
    ):
        GracefulServer(httpd, grace=-1)


# --- the example: SIGTERM to a real server process -------------------------------------------

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "server_shutdown_cli.py"


def _example(stop_timeout: float) -> subprocess.Popen[str]:
    """``python examples/server_shutdown_cli.py`` on a free port with this budget."""
    return subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--port", "0", "--stop-timeout", str(stop_timeout)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
    )  # fmt: skip


def _port_of(child: subprocess.Popen[str]) -> int:
    assert child.stderr is not None
    line = child.stderr.readline()
    assert line.startswith("serving on 127.0.0.1:"), line
    return int(line.rsplit(":", 1)[1])


def _lines_until(child: subprocess.Popen[str], text: str) -> list[str]:
    assert child.stderr is not None
    lines = []
    for line in child.stderr:
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"the child never logged {text!r}: {lines}")


@pytest.mark.parametrize("seconds", [1.0])
def test_sigterm_drains_the_requests_in_flight_then_refuses_and_exits_0(seconds: float) -> None:
    """SIGTERM with two slow requests in flight: both complete, new connections are refused.

    The budget (10 s) is ten times the requests' work; the exit status is 0.
    """
    child = _example(stop_timeout=10.0)
    try:
        port = _port_of(child)
        conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=MUST_HAPPEN) for _ in "ab"]
        responses = []
        for conn in conns:
            conn.request("GET", f"/slow?seconds={seconds}")
            response = conn.getresponse()
            assert response.read(5) == b"head\n"  # the request is in flight
            responses.append(response)
        child.send_signal(signal.SIGTERM)
        _lines_until(child, "listener closed")
        with pytest.raises(ConnectionRefusedError):
            refused(("127.0.0.1", port))
        bodies = [response.read() for response in responses]
        for conn in conns:
            conn.close()
        _, err = child.communicate(timeout=MUST_HAPPEN * 2)
    finally:
        child.kill()
        child.communicate()
    assert child.returncode == 0, err
    assert bodies == [b"line\n" * int(seconds * 10)] * 2
    assert "terminated=True" in err
    assert err.count("GET /slow?seconds=1.0") >= 2


def test_sigterm_with_a_budget_too_short_interrupts_and_names_the_request() -> None:
    """A 2 s budget for a 60 s request: the request is closed by force and named; exit 0.

    The forced close gets the last 0.4 s of the budget; the handler writes every 0.1 s, so
    its next write fails and its thread ends well within it.
    """
    child = _example(stop_timeout=2.0)
    try:
        port = _port_of(child)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=MUST_HAPPEN)
        conn.request("GET", "/slow?seconds=60")
        response = conn.getresponse()
        assert response.read(5) == b"head\n"
        began = time.monotonic()
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=MUST_HAPPEN * 2)
        took = time.monotonic() - began
        with pytest.raises(http.client.IncompleteRead):
            response.read()
        conn.close()
    finally:
        child.kill()
        child.communicate()
    assert child.returncode == 0, err
    assert took < 2.0 + MUST_HAPPEN / 2  # interpreter exit included
    report = next(line for line in err.splitlines() if line.startswith("report:"))
    assert "interrupted=('127.0.0.1:" in report
    assert "GET /slow?seconds=60'" in report
    assert "terminated=True" in report


# --- what the report counts ------------------------------------------------------------------


def _conn_thread(server: GracefulServer, n: int = 1) -> threading.Thread:
    """The handler thread of the server's ``n``-th connection, once it is running."""
    name = f"{server.name}-conn-{n}"
    wait_until(lambda: any(t.name == name for t in threading.enumerate()), "a handler thread")
    return next(t for t in threading.enumerate() if t.name == name)


def _read_until(sock: socket.socket, end: bytes) -> bytes:
    """Bytes from ``sock`` until ``end`` has arrived, or the connection ended."""
    data = b""
    while end not in data and (chunk := sock.recv(4096)):
        data += chunk
    return data


def test_the_final_response_after_100_continue_during_the_stop_says_connection_close() -> None:
    """With ``Expect: 100-continue`` during the stop, the final response says Connection: close.

    The interim ``100 Continue`` is not the answer; the ``200`` after it is, and it is the
    one that tells the client not to send another request.
    """

    class Upload(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upload)
    server = GracefulServer(httpd, grace=MUST_HAPPEN * 3).start()
    stopper, result = run_in_thread(lambda: server.stop(MUST_HAPPEN * 4), "stopper")
    try:
        wait_until(lambda: not server.ready, "the stop began")
        with socket.create_connection(server.address, timeout=MUST_HAPPEN) as sock:
            sock.sendall(
                b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                b"Expect: 100-continue\r\n\r\n"
            )
            interim = _read_until(sock, b"\r\n\r\n")
            sock.sendall(b"hello")
            final = _read_until(sock, b"hello")
    finally:
        second = server.stop(MUST_HAPPEN)  # cuts the grace short
        join_or_fail(stopper)
    assert interim.startswith(b"HTTP/1.1 100 ")
    head, _, body = final.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"\r\nConnection: close" in head
    assert body == b"hello"
    assert second is result["result"]
    assert [name.split(" ", 1)[1] for name in second.completed] == ["POST /upload"]


def _errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "patterns.server_shutdown" and r.levelno >= logging.ERROR
    ]


def test_an_http_request_that_raises_during_the_drain_is_failed_and_logged_at_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A request in flight at the stop whose handler raises is in failed, with its traceback.

    The client gets no response (RemoteDisconnected); the report must not call it completed.
    """
    entered, release = threading.Event(), threading.Event()

    class Boom(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            entered.set()
            release.wait(MUST_HAPPEN)
            raise ValueError("boom")

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    server = GracefulServer(http.server.ThreadingHTTPServer(("127.0.0.1", 0), Boom)).start()
    with client(server.address, "/boom") as outcome:
        assert entered.wait(MUST_HAPPEN)
        stopper, result = run_in_thread(lambda: server.stop(MUST_HAPPEN), "stopper")
        wait_until(lambda: server.stopping, "the stop began")
        release.set()
        join_or_fail(stopper)
    report: ServerStopReport = result["result"]
    assert isinstance(outcome["error"], http.client.RemoteDisconnected)
    assert report.completed == ()
    assert [name.split(" ", 1)[1] for name in report.failed] == ["GET /boom"]
    assert report.terminated is True
    (error,) = _errors(caplog)
    assert error.getMessage() == f"server: request {report.failed[0]} failed"
    assert error.exc_info is not None
    assert error.exc_info[0] is ValueError


def test_a_plain_tcp_handler_that_raises_during_the_drain_is_failed_and_logged_at_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A socketserver handler that raises after the stop began is in failed, logged at ERROR."""
    entered, release = threading.Event(), threading.Event()

    class Boom(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            entered.set()
            release.wait(MUST_HAPPEN)
            raise ValueError("boom")

    server = GracefulServer(socketserver.ThreadingTCPServer(("127.0.0.1", 0), Boom)).start()
    with socket.create_connection(server.address, timeout=MUST_HAPPEN) as sock:
        assert entered.wait(MUST_HAPPEN)
        stopper, result = run_in_thread(lambda: server.stop(MUST_HAPPEN), "stopper")
        wait_until(lambda: server.stopping, "the stop began")
        release.set()
        join_or_fail(stopper)
        assert sock.recv(10) == b""
        peer = f"127.0.0.1:{sock.getsockname()[1]}"
    report: ServerStopReport = result["result"]
    assert report.completed == ()
    assert (report.failed, report.terminated) == ((peer,), True)
    (error,) = _errors(caplog)
    assert error.getMessage() == f"server: request {peer} failed"
    assert error.exc_info is not None
    assert error.exc_info[0] is ValueError


def test_a_request_half_read_at_the_stop_is_drained_then_interrupted_not_idle_closed() -> None:
    """A request whose headers are still arriving when the stop began is in flight, not idle.

    The drain waits for it; its headers never end, so the forced close cuts it at the drain
    deadline and names it in interrupted.
    """
    slow = Slow()
    server = GracefulServer(http.server.ThreadingHTTPServer(("127.0.0.1", 0), slow.handler()))
    server.start()
    try:
        with socket.create_connection(server.address, timeout=MUST_HAPPEN) as sock:
            sock.sendall(b"GET /half HTTP/1.1\r\nHost: x\r\n")  # the headers' end never comes
            wait_until_blocked_in(_conn_thread(server), "parse_headers")
            report = server.stop(1.0)
            assert sock.recv(100) == b""
            peer = f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.stop(MUST_HAPPEN)
    assert report.idle_closed == 0
    assert report.interrupted == (f"{peer} GET /half",)
    assert report.terminated is True


def test_a_half_read_request_whose_rest_arrives_in_the_drain_is_served_and_completed() -> None:
    """A half-read request whose headers end during the drain is answered, then completed.

    An idle client read the end of its connection first: the stop has closed the idle ones
    and is draining. The answer says Connection: close.
    """
    slow = Slow()
    server = GracefulServer(http.server.ThreadingHTTPServer(("127.0.0.1", 0), slow.handler()))
    server.start()
    with (
        contextlib.ExitStack() as stack,
        socket.create_connection(server.address, timeout=MUST_HAPPEN) as half,
        contextlib.closing(connect(server.address)) as idle,
    ):
        stack.callback(server.stop, MUST_HAPPEN)
        half.sendall(b"GET /half HTTP/1.1\r\nHost: x\r\n")
        wait_until_blocked_in(_conn_thread(server), "parse_headers")
        assert get(idle, "/first")[:2] == (200, "done /first\n")
        # Answered, and reading for the next request: idle (socket.SocketIO.readinto).
        wait_until_blocked_in(_conn_thread(server, 2), "readinto")
        stopper, result = run_in_thread(lambda: server.stop(MUST_HAPPEN), "stopper")
        assert idle.sock is not None
        assert idle.sock.recv(10) == b""  # the idle client was closed: the drain is on
        half.sendall(b"\r\n")
        answer = _read_until(half, b"done /half\n")
        join_or_fail(stopper)
        peer = f"127.0.0.1:{half.getsockname()[1]}"
    report: ServerStopReport = result["result"]
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert b"\r\nConnection: close" in answer
    assert (report.completed, report.idle_closed, report.interrupted) == (
        (f"{peer} GET /half",),
        1,
        (),
    )


def test_readiness_answers_during_the_stop_are_counted_in_not_ready_not_refused() -> None:
    """Each readiness check answered 503 after the stop began is counted in not_ready.

    They are not refused work, nor requests completed: they are the load balancer asking.
    """
    slow = Slow()
    with graceful(slow, grace=MUST_HAPPEN * 3) as server:
        stopper, result = run_in_thread(lambda: server.stop(MUST_HAPPEN * 4), "stopper")
        wait_until(lambda: not server.ready, "the stop began")
        for _ in range(2):
            with contextlib.closing(connect(server.address)) as probe:
                assert get(probe, "/ready") == (503, "stopping\n", "close")
        second = server.stop(MUST_HAPPEN)  # cuts the grace short
        join_or_fail(stopper)
    assert second is result["result"]
    assert (second.refused, second.completed, second.interrupted) == (0, (), ())
    assert second.not_ready == 2
