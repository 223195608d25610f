"""asyncio servers: each stop pitfall forced with real TCP clients, and the pattern holding.

Every test runs its own loop with `asyncio.run`, serves a line protocol on 127.0.0.1 port 0
("GET /x" answered "done GET /x"; a request naming "slow" waits for the test's ``release``),
and connects real clients with `asyncio.open_connection`. Events order everything; every
await is bounded by `asyncio.timeout`, so a bug fails the test instead of hanging it. The
pins branch on `sys.version_info` and say what 3.11.7, 3.12.1 and 3.13.0 each do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from patterns.naive.server_shutdown_asyncio import (
    naive_cancel_handlers,
    naive_stop_server,
    naive_stop_with_close_clients,
)
from patterns.server_shutdown_asyncio import AsyncConnection, AsyncGracefulServer, ServerStopReport
from tests.support import MUST_HAPPEN, NOISE, STAYS_BLOCKED

PY = sys.version_info[:2]

W10 = ("W10", "asyncio Server.close() stops listening but a connected client goes on being served")
W11 = ("W11", "asyncio Server.wait_closed(): at once on 3.11, until every client hangs up on 3.12+")
W12 = ("W12", "asyncio close_clients() is 3.13 only, and cuts requests in flight like idle ones")
W13 = ("W13", "asyncio: a handler that ignores its cancellation hangs a stop that awaits it")

Client = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Lines:
    """A line server's handlers, plain and graceful, with the checkpoints a test waits on."""

    def __init__(self, *, stubborn: bool = False) -> None:
        self.in_flight = asyncio.Event()  # set by a slow request once it has begun
        self.release = asyncio.Event()  # set by the test: the slow request may answer
        self.caught = asyncio.Event()  # set by a stubborn handler when it swallows a cancel
        self.stubborn = stubborn
        self.tasks: set[asyncio.Task[Any]] = set()  # every handler task, for the naive stops
        self.lost: list[str] = []  # answers that found their connection gone

    async def plain(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A handler for `asyncio.start_server`: answer lines until the client hangs up."""
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            while line := await reader.readline():
                await self._answer(line, writer)
        finally:
            writer.close()

    async def graceful(self, conn: AsyncConnection) -> None:
        """The same handler for `AsyncGracefulServer`, its task kept in ``tasks``."""
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        await self.serve(conn)

    async def serve(self, conn: AsyncConnection) -> None:
        """Answer each line until the client hangs up, each answer inside a request block.

        Once the stop began, ``conn.request()`` raises `ServerStopping` before its block
        runs: the line just read is not answered, and the exception ends the loop.
        """
        while line := await conn.reader.readline():
            with conn.request(line.decode().strip()):
                await self._answer(line, conn.writer)

    async def _answer(self, line: bytes, writer: asyncio.StreamWriter) -> None:
        if b"slow" in line:
            self.in_flight.set()
            await self._wait_release()
        writer.write(b"done " + line)
        try:
            await writer.drain()
        except ConnectionError as exc:
            self.lost.append(f"{line.decode().strip()}: {type(exc).__name__}")

    async def _wait_release(self) -> None:
        while True:
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                if not self.stubborn:
                    raise
                self.caught.set()  # the bug on show: the cancellation is swallowed
                continue
            return


async def _connect(address: tuple[str, int]) -> Client:
    return await asyncio.open_connection(*address)


async def _ask(client: Client, line: bytes) -> bytes:
    """Send one request line; the answer line, or b"" when the connection has ended."""
    reader, writer = client
    writer.write(line)
    await writer.drain()
    return await reader.readline()


async def _send(client: Client, line: bytes) -> None:
    client[1].write(line)
    await client[1].drain()


async def _rest(client: Client) -> bytes:
    """What the server still sends before the connection ends (b"" for an abort's reset)."""
    try:
        return await client[0].read()
    except ConnectionResetError:
        return b""


async def _hang_up(*clients: Client) -> None:
    for _, writer in clients:
        writer.close()
    for _, writer in clients:
        with contextlib.suppress(ConnectionError):  # the server aborted it first
            await writer.wait_closed()


async def _refused(address: tuple[str, int]) -> bool:
    try:
        client = await _connect(address)
    except ConnectionRefusedError:
        return True
    await _hang_up(client)
    return False


def _address(server: asyncio.Server) -> tuple[str, int]:
    host, port = server.sockets[0].getsockname()[:2]
    return host, port


# --- W10: close() stops listening, nothing more ---------------------------------------------


@pytest.mark.race(*W10)
def test_naive_close_leaves_a_connected_client_served(
    record_property: Callable[[str, object], None],
) -> None:
    """After ``close()`` a new client is refused, but the connected one is still answered."""

    async def main() -> None:
        lines = Lines()
        server = await asyncio.start_server(lines.plain, "127.0.0.1", 0)
        address = _address(server)
        async with asyncio.timeout(MUST_HAPPEN):
            client = await _connect(address)
            assert await _ask(client, b"GET /before\n") == b"done GET /before\n"
            stopping = asyncio.create_task(naive_stop_server(server))
            await asyncio.sleep(0)  # one turn: the naive stop has run close()
            assert not server.is_serving()
            refused = await _refused(address)
            after = await _ask(client, b"GET /after\n")
            record_property(
                "observed",
                f"on {PY[0]}.{PY[1]}, after close() a new client was"
                f" {'refused' if refused else 'accepted'} and the connected one sent"
                f" 'GET /after' and got {after!r}",
            )
            assert refused
            assert after == b"done GET /after\n"  # the bug: still served after the stop
            await _hang_up(client)
            await stopping  # returns on every version once the client has gone (W11)

    asyncio.run(main())


@pytest.mark.race(*W10)
def test_stop_ends_the_connected_clients_and_refuses_new_ones() -> None:
    """stop() closes every connection, not only the listener: nothing is served after it.

    The idle client reads the end of its connection; a request it sends then gets no answer.
    """

    async def main() -> ServerStopReport:
        lines = Lines()
        async with asyncio.timeout(MUST_HAPPEN):
            server = AsyncGracefulServer(lines.graceful, stop_timeout=MUST_HAPPEN).start()
            client = await _connect(server.address)
            assert await _ask(client, b"GET /before\n") == b"done GET /before\n"
            report = await server.stop()
            assert await _refused(server.address)
            assert await _rest(client) == b""  # the end of the connection, no more answers
            await _send(client, b"GET /after\n")
            assert await client[0].readline() == b""
            assert all(task.done() for task in lines.tasks)
            await _hang_up(client)
            return report

    report = asyncio.run(main())
    assert (report.terminated, report.still_running) == (True, ())
    assert (report.idle_closed, report.completed, report.interrupted) == (1, (), ())


# --- W11: what wait_closed() waits for ------------------------------------------------------


@pytest.mark.race(*W11)
def test_naive_wait_closed_with_an_idle_keep_alive_client(
    record_property: Callable[[str, object], None],
) -> None:
    """With an idle client connected, close() + wait_closed() returns at once or hangs.

    3.11.7: ``wait_closed()`` returns at once, the client still served; 3.12.1 and 3.13.0:
    it waits until the idle client hangs up, however long that is.
    """

    async def main() -> None:
        lines = Lines()
        server = await asyncio.start_server(lines.plain, "127.0.0.1", 0)
        async with asyncio.timeout(MUST_HAPPEN):
            client = await _connect(_address(server))
            assert await _ask(client, b"GET /1\n") == b"done GET /1\n"  # now idle, kept alive
            stopping = asyncio.create_task(naive_stop_server(server))
            began = time.monotonic()
            done, _ = await asyncio.wait([stopping], timeout=STAYS_BLOCKED)
            took = time.monotonic() - began
            served = await _ask(client, b"GET /2\n")
            handlers_running = sum(not t.done() for t in lines.tasks)
            record_property(
                "observed",
                f"on {PY[0]}.{PY[1]}, close() + wait_closed() with an idle client connected:"
                + (
                    f" returned after {took:.3f}s"
                    if done
                    else f" still waiting after {STAYS_BLOCKED}s"
                )
                + f"; the client was then answered {served!r};"
                f" {handlers_running} handler(s) running",
            )
            assert served == b"done GET /2\n"
            assert handlers_running == 1
            if PY < (3, 12):
                assert done, "3.11: wait_closed() returns once the listener is closed"
            else:
                assert not done, "3.12+: wait_closed() waits for every connection"
            await _hang_up(client)
            await stopping  # 3.12+: returns once the last client has hung up

    asyncio.run(main())


@pytest.mark.race(*W11)
def test_stop_returns_at_once_with_an_idle_keep_alive_client_on_every_version() -> None:
    """stop() closes an idle keep-alive client and returns at once, on every version.

    It never waits on wait_closed(): the stop returns far inside its budget, with every
    handler ended, on 3.11, 3.12 and 3.13 alike.
    """

    async def main() -> ServerStopReport:
        lines = Lines()
        async with asyncio.timeout(MUST_HAPPEN + NOISE):
            server = AsyncGracefulServer(lines.graceful).start()
            client = await _connect(server.address)
            assert await _ask(client, b"GET /1\n") == b"done GET /1\n"
            report = await server.stop(MUST_HAPPEN)
            assert all(task.done() for task in lines.tasks)
            assert await _rest(client) == b""
            await _hang_up(client)
            return report

    report = asyncio.run(main())
    assert report.elapsed < NOISE  # not the budget: nothing waited for the client
    assert (report.terminated, report.idle_closed) == (True, 1)


# --- W12: 3.13's close_clients() ------------------------------------------------------------


@pytest.mark.race(*W12)
def test_naive_close_clients_is_missing_before_313_and_cuts_requests_in_flight_on_313(
    record_property: Callable[[str, object], None],
) -> None:
    """close_clients(): an AttributeError before 3.13, a cut request on 3.13.

    3.11.7, 3.12.1: ``Server.close_clients`` does not exist. 3.13.0: it closes the busy
    connection too, so the request in flight gets no answer, and its handler runs on after
    the stop returned, its answer lost.
    """

    async def main() -> None:
        lines = Lines()
        server = await asyncio.start_server(lines.plain, "127.0.0.1", 0)
        async with asyncio.timeout(MUST_HAPPEN):
            client = await _connect(_address(server))
            await _send(client, b"GET /slow\n")
            await lines.in_flight.wait()
            if PY < (3, 13):
                assert not hasattr(asyncio.Server, "close_clients")
                assert not hasattr(asyncio.Server, "abort_clients")
                with pytest.raises(AttributeError, match="close_clients"):
                    await naive_stop_with_close_clients(server)
                record_property(
                    "observed",
                    f"on {PY[0]}.{PY[1]}, Server.close_clients does not exist: AttributeError",
                )
                lines.release.set()
                assert await client[0].readline() == b"done GET /slow\n"
                await _hang_up(client)
                if PY >= (3, 12):
                    await server.wait_closed()
                return
            assert hasattr(asyncio.Server, "abort_clients")
            await naive_stop_with_close_clients(server)  # returns: every transport closed
            answer = await _rest(client)
            (handler,) = lines.tasks
            running = not handler.done()
            lines.release.set()
            await handler
            record_property(
                "observed",
                f"on {PY[0]}.{PY[1]}, close_clients() + wait_closed() returned with a request"
                f" in flight; the client got {answer!r}; its handler was"
                f" {'still running' if running else 'done'}; then its answer: {lines.lost}",
            )
            assert answer == b""
            assert running
            assert lines.lost == ["GET /slow: ConnectionResetError"]
            await _hang_up(client)

    asyncio.run(main())


@pytest.mark.race(*W12)
def test_stop_drains_the_request_in_flight_and_closes_idle_clients_on_every_version() -> None:
    """stop() closes idle clients at once and lets the request in flight finish.

    Without close_clients(), on every version: the idle client is closed at once, the
    request in flight is answered, then its connection is closed too.
    """

    async def main() -> tuple[ServerStopReport, str]:
        lines = Lines()
        async with asyncio.timeout(MUST_HAPPEN + NOISE):
            server = AsyncGracefulServer(lines.graceful).start()
            idle = await _connect(server.address)
            assert await _ask(idle, b"GET /1\n") == b"done GET /1\n"
            busy = await _connect(server.address)
            await _send(busy, b"GET /slow\n")
            await lines.in_flight.wait()
            stopping = asyncio.create_task(server.stop(MUST_HAPPEN))
            assert await _rest(idle) == b""  # closed while the other request is in flight
            assert not stopping.done()
            lines.release.set()
            assert await _rest(busy) == b"done GET /slow\n"  # answered, then closed
            report = await stopping
            name = f"127.0.0.1:{busy[1].get_extra_info('sockname')[1]} GET /slow"
            await _hang_up(idle, busy)
            return report, name

    report, name = asyncio.run(main())
    assert (report.terminated, report.still_running) == (True, ())
    assert report.completed == (name,)
    assert (report.interrupted, report.idle_closed) == ((), 1)


# --- W13: a handler that ignores its cancellation -------------------------------------------


@pytest.mark.race(*W13)
def test_naive_cancel_then_gather_waits_for_ever_for_a_stubborn_handler(
    record_property: Callable[[str, object], None],
) -> None:
    """The handler swallowed its cancel, and the naive stop is still waiting for it."""

    async def main() -> None:
        lines = Lines(stubborn=True)
        server = await asyncio.start_server(lines.plain, "127.0.0.1", 0)
        async with asyncio.timeout(MUST_HAPPEN):
            client = await _connect(_address(server))
            await _send(client, b"GET /slow\n")
            await lines.in_flight.wait()
            stopping = asyncio.create_task(naive_cancel_handlers(server, lines.tasks))
            await lines.caught.wait()
            done, _ = await asyncio.wait([stopping], timeout=STAYS_BLOCKED)
            record_property(
                "observed",
                f"on {PY[0]}.{PY[1]}, the handler caught its cancel and cancel-then-gather was"
                + (" still waiting" if not done else " done")
                + f" {STAYS_BLOCKED}s later",
            )
            assert not done, "the naive stop returned"
            lines.release.set()  # the test's own way out
            await _hang_up(client)  # the handler answers, then reads the end and returns
            await stopping

    asyncio.run(main())


@pytest.mark.race(*W13)
def test_stop_returns_on_its_deadline_and_names_the_stubborn_handler() -> None:
    """stop() returns on its deadline and names the handler that would not stop.

    The handler is in still_running, its request in interrupted, and the client's
    connection is aborted.
    """

    async def main() -> tuple[ServerStopReport, float, str, ServerStopReport]:
        lines = Lines(stubborn=True)
        async with asyncio.timeout(MUST_HAPPEN):
            server = AsyncGracefulServer(lines.graceful).start()
            client = await _connect(server.address)
            await _send(client, b"GET /slow\n")
            await lines.in_flight.wait()
            began = time.monotonic()
            report = await server.stop(1.0)
            took = time.monotonic() - began
            assert lines.caught.is_set()
            assert await _rest(client) == b""
            name = f"127.0.0.1:{client[1].get_extra_info('sockname')[1]} GET /slow"
            lines.release.set()
            (handler,) = lines.tasks
            await handler
            again = await server.stop()
            await _hang_up(client)
            return report, took, name, again

    report, took, name, again = asyncio.run(main())
    assert took < 1.0 + NOISE
    assert report.terminated is False
    assert report.still_running == (name,)
    assert report.interrupted == (name,)
    assert again is report  # the first report stays the answer


# --- the handler's API and the stop's other paths -------------------------------------------


def test_a_request_cut_at_the_deadline_is_interrupted_and_asyncio_logs_no_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A handler cancelled at the deadline ends quietly: reported interrupted, terminated.

    On 3.11 and 3.12 asyncio's own callback on a cancelled connection task would log
    "Exception in callback" with the CancelledError; the server's task ends normally instead.
    """

    async def main() -> tuple[ServerStopReport, str]:
        lines = Lines()
        async with asyncio.timeout(MUST_HAPPEN):
            server = AsyncGracefulServer(lines.graceful).start()
            client = await _connect(server.address)
            await _send(client, b"GET /slow\n")
            await lines.in_flight.wait()
            report = await server.stop(0.4)
            assert await _rest(client) == b""
            name = f"127.0.0.1:{client[1].get_extra_info('sockname')[1]} GET /slow"
            for _ in range(3):
                await asyncio.sleep(0)  # let any done callback of the handler task run
            await _hang_up(client)
            return report, name

    with caplog.at_level(logging.DEBUG):
        report, name = asyncio.run(main())
    assert (report.terminated, report.interrupted, report.completed) == (True, (name,), ())
    errors = [r for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR]
    assert errors == []


def test_stop_from_a_handler_is_a_request_that_returns_at_once() -> None:
    """A handler that calls stop() gets a provisional report at once.

    The stop goes on, lets that handler's own request finish, and the next stop() returns
    the final report.
    """

    async def main() -> tuple[ServerStopReport, ServerStopReport, bytes]:
        inner: dict[str, Any] = {}

        async def handle(conn: AsyncConnection) -> None:
            await conn.reader.readline()
            with conn.request("GET /stop"):
                inner["report"] = await server.stop(MUST_HAPPEN)
                conn.writer.write(b"stopping\n")

        async with asyncio.timeout(MUST_HAPPEN):
            server = AsyncGracefulServer(handle).start()
            client = await _connect(server.address)
            await _send(client, b"GET /stop\n")
            answer = await _rest(client)
            final = await server.stop()
            await _hang_up(client)
            return inner["report"], final, answer

    provisional, final, answer = asyncio.run(main())
    assert answer == b"stopping\n"
    assert provisional.terminated is False
    assert len(provisional.still_running) == 1
    assert provisional is not final
    assert (final.terminated, len(final.completed)) == (True, 1)


def test_a_handler_failure_is_logged_and_its_connection_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A handler that raises is logged with its connection's name; the server goes on."""

    async def main() -> tuple[bytes, bytes]:
        async def handle(conn: AsyncConnection) -> None:
            line = await conn.reader.readline()
            with conn.request(line.decode().strip()):
                if b"boom" in line:
                    raise ValueError("boom")
                conn.writer.write(b"ok\n")

        async with asyncio.timeout(MUST_HAPPEN):
            async with AsyncGracefulServer(handle) as server:
                failing = await _connect(server.address)
                await _send(failing, b"GET /boom\n")
                ended = await _rest(failing)
                fine = await _connect(server.address)
                answer = await _ask(fine, b"GET /fine\n")
                await _hang_up(failing, fine)
            return ended, answer

    assert asyncio.run(main()) == (b"", b"ok\n")
    (record,) = [r for r in caplog.records if r.name == "patterns.server_shutdown_asyncio"]
    assert record.getMessage().endswith("GET /boom failed")


def test_request_blocks_do_not_nest() -> None:
    """A request inside a request is a programming error, refused at once."""

    async def main() -> str:
        seen: list[str] = []

        async def handle(conn: AsyncConnection) -> None:
            with conn.request("outer"):
                try:
                    with conn.request("inner"):
                        pass
                except RuntimeError as exc:
                    seen.append(str(exc))
                conn.writer.write(b"ok\n")

        async with asyncio.timeout(MUST_HAPPEN):
            async with AsyncGracefulServer(handle) as server:
                client = await _connect(server.address)
                assert await _rest(client) == b"ok\n"
                await _hang_up(client)
        return seen[0]

    assert asyncio.run(main()).endswith("request() blocks do not nest")


def test_start_needs_a_running_loop_and_a_free_port() -> None:
    """start() outside a loop, or on a port in use, raises and leaves nothing open."""
    with pytest.raises(RuntimeError):
        AsyncGracefulServer(Lines().graceful).start()

    async def main() -> None:
        async with AsyncGracefulServer(Lines().graceful) as first:
            taken = AsyncGracefulServer(Lines().graceful, port=first.address[1])
            with pytest.raises(OSError, match="in use"):
                taken.start()
            report = await taken.stop()
            assert report.terminated

    asyncio.run(main())


def test_start_after_a_failed_start_raises_even_once_the_port_is_free() -> None:
    """A start() after a start() that failed raises RuntimeError, as the contract says."""

    async def main() -> ServerStopReport:
        async with asyncio.timeout(MUST_HAPPEN):
            first = AsyncGracefulServer(Lines().graceful).start()
            taken = AsyncGracefulServer(Lines().graceful, port=first.address[1])
            with pytest.raises(OSError, match="in use"):
                taken.start()
            await first.stop()
            with pytest.raises(RuntimeError, match="start"):
                taken.start()  # the port is free now: the failed start still counts
            return await taken.stop()

    assert asyncio.run(main()).terminated is True


def test_asyncio_logs_a_cancelled_connection_task_as_an_error_before_313(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A cancelled `start_server` handler is logged as an error on 3.11.7 and 3.12.1, not 3.13.0.

    asyncio's done callback on the connection task calls ``task.exception()``, which raises
    for a cancelled task until 3.13 checks ``task.cancelled()`` first. This is why the
    server's own connection task ends normally when it is cancelled.
    """

    async def main() -> None:
        lines = Lines()
        server = await asyncio.start_server(lines.plain, "127.0.0.1", 0)
        async with asyncio.timeout(MUST_HAPPEN):
            client = await _connect(_address(server))
            assert await _ask(client, b"GET /1\n") == b"done GET /1\n"
            (handler,) = lines.tasks
            handler.cancel()
            await asyncio.wait([handler])
            for _ in range(3):
                await asyncio.sleep(0)  # let the handler task's done callbacks run
            await _hang_up(client)
            server.close()
            await server.wait_closed()

    with caplog.at_level(logging.DEBUG):
        asyncio.run(main())
    logged = [
        r
        for r in caplog.records
        if r.name == "asyncio" and r.getMessage().startswith("Exception in callback")
    ]
    if PY < (3, 13):
        assert len(logged) == 1
        assert logged[0].exc_info is not None
        assert logged[0].exc_info[0] is asyncio.CancelledError
    else:
        assert logged == []


def test_a_response_written_without_drain_is_flushed_before_its_connection_closes() -> None:
    """A large response still in the write buffer when its request ends reaches the client.

    The stop closes a finished request's connection with close(), which flushes, not abort().
    """
    big = b"x" * 4_000_000 + b"\n"

    async def main() -> bytes:
        release = asyncio.Event()
        in_flight = asyncio.Event()

        async def handle(conn: AsyncConnection) -> None:
            await conn.reader.readline()
            with conn.request("GET /big"):
                in_flight.set()
                await release.wait()
                conn.writer.write(big)  # no drain(): most of it is still buffered here

        async with asyncio.timeout(MUST_HAPPEN):
            server = AsyncGracefulServer(handle).start()
            client = await _connect(server.address)
            await _send(client, b"GET /big\n")
            await in_flight.wait()
            stopping = asyncio.create_task(server.stop(MUST_HAPPEN))
            release.set()
            received = await _rest(client)
            report = await stopping
            assert report.completed != ()
            await _hang_up(client)
            return received

    assert asyncio.run(main()) == big


def test_a_second_stop_keeps_its_own_budget_and_a_cancelled_caller_leaves_the_stop_going() -> None:
    """A second stop keeps its own budget; cancelling the first caller leaves the stop going.

    stop(0.2) during a draining stop returns a provisional report within 0.2 s; the stop
    goes on after its first caller is cancelled, and the next stop() returns its report.
    """

    async def main() -> tuple[ServerStopReport, float, ServerStopReport]:
        lines = Lines()
        async with asyncio.timeout(MUST_HAPPEN):
            server = AsyncGracefulServer(lines.graceful).start()
            client = await _connect(server.address)
            await _send(client, b"GET /slow\n")
            await lines.in_flight.wait()
            first = asyncio.create_task(server.stop(MUST_HAPPEN))
            await asyncio.sleep(0)  # one turn: the first stop has begun
            began = time.monotonic()
            second = await server.stop(0.2)
            took = time.monotonic() - began
            first.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await first
            lines.release.set()
            assert await _rest(client) == b"done GET /slow\n"  # the stop went on: drained
            final = await server.stop()
            await _hang_up(client)
            return second, took, final

    second, took, final = asyncio.run(main())
    assert took < 0.2 + NOISE
    assert (second.terminated, len(second.still_running)) == (False, 1)
    assert (final.terminated, len(final.completed)) == (True, 1)


# --- what the report counts ------------------------------------------------------------------


def test_a_request_read_after_the_stop_began_is_refused_and_never_starts() -> None:
    """A pipelined request read after the stop began never starts, and is counted in refused.

    The client sends req-1 and req-2 on one connection; the stop begins with req-1 in
    flight. req-2 is buffered, so ``readline()`` returns it at once: ``request()`` refuses
    it (the connection loop ends), req-1's answer is the last thing the client gets.
    """

    async def main() -> tuple[ServerStopReport, list[str], bytes, str]:
        started: list[str] = []
        in_flight, release = asyncio.Event(), asyncio.Event()

        async def handle(conn: AsyncConnection) -> None:
            while line := await conn.reader.readline():
                name = line.decode().strip()
                with conn.request(name):
                    started.append(name)
                    if name == "req-1":
                        in_flight.set()
                        await release.wait()
                    else:
                        await asyncio.sleep(0)  # the work yields to the loop
                    conn.writer.write(f"done {name}\n".encode())

        async with asyncio.timeout(MUST_HAPPEN):
            server = AsyncGracefulServer(handle).start()
            client = await _connect(server.address)
            await _send(client, b"req-1\nreq-2\n")
            await in_flight.wait()
            stopping = asyncio.create_task(server.stop(MUST_HAPPEN))
            while not server.stopping:
                await asyncio.sleep(0)  # a turn of the loop: the stop task has begun
            release.set()
            answers = await _rest(client)
            report = await stopping
            name = f"127.0.0.1:{client[1].get_extra_info('sockname')[1]} req-1"
            await _hang_up(client)
            return report, started, answers, name

    report, started, answers, name = asyncio.run(main())
    assert started == ["req-1"]  # nothing new starts once the stop began
    assert answers == b"done req-1\n"
    assert (report.completed, report.interrupted, report.refused) == ((name,), (), 1)
    assert report.terminated is True


def test_a_request_that_raises_during_the_drain_is_failed_and_logged_not_completed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A request in flight at the stop whose block raises is in failed, logged at ERROR."""

    async def main() -> tuple[ServerStopReport, str]:
        in_flight, release = asyncio.Event(), asyncio.Event()

        async def handle(conn: AsyncConnection) -> None:
            line = await conn.reader.readline()
            with conn.request(line.decode().strip()):
                in_flight.set()
                await release.wait()
                raise ValueError("boom")

        async with asyncio.timeout(MUST_HAPPEN):
            server = AsyncGracefulServer(handle).start()
            client = await _connect(server.address)
            await _send(client, b"GET /boom\n")
            await in_flight.wait()
            stopping = asyncio.create_task(server.stop(MUST_HAPPEN))
            while not server.stopping:
                await asyncio.sleep(0)  # a turn of the loop: the stop task has begun
            release.set()
            assert await _rest(client) == b""
            report = await stopping
            name = f"127.0.0.1:{client[1].get_extra_info('sockname')[1]} GET /boom"
            await _hang_up(client)
            return report, name

    with caplog.at_level(logging.DEBUG):
        report, name = asyncio.run(main())
    assert report.completed == ()
    assert (report.failed, report.interrupted, report.terminated) == ((name,), (), True)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == [f"server: request {name} failed"]
    assert errors[0].exc_info is not None
    assert errors[0].exc_info[0] is ValueError
