"""Light-route latency over HTTP while the heavy route is flooded, without and with a bulkhead.

Run it with ``python -m benchmarks.bulkhead_http`` (``--help`` for the knobs). One process
runs a ``wsgiref`` server on 127.0.0.1 with a bounded number of request threads
(``--threads``, 8) and two routes:

* ``/heavy`` does ``--heavy-ms`` (50) of work that holds no lock and no GIL (a sleep,
  standing for a slow database query). ``without`` runs it through ``naive_offload``: a
  ``ThreadPoolExecutor`` of ``--workers`` (2) threads and an unbounded queue. ``with``
  runs it through ``BulkheadMiddleware`` on a ``Bulkhead(--workers, --queue)`` (queue 4):
  the same number of workers, and ``workers + queue`` (6) below the server's thread limit.
* ``/light`` answers at once.

During each run of ``--seconds`` (1.5), ``--heavy-clients`` (16) threads send heavy
requests back to back (a client that gets a 503 waits ``--backoff-ms``, 10, before its
next one; a real client would honour ``Retry-After``), while one client sends a light
request every 10 ms and records how long each took, connect to last byte. The modes
alternate over ``--runs`` (5) runs each. The table gives the light route's latency
percentiles in milliseconds: median, min and max over the runs, and the ratio of the
medians (without / with). Every client, server and pool thread is bounded in count and
time and joined before the next run. This is a measurement to read, not a test: nothing
here asserts on a time.

The module also holds the small server and client the HTTP tests use.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import logging
import math
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from examples.bulkhead_wsgi import BulkheadMiddleware
from patterns.bulkhead import Bulkhead
from patterns.naive.bulkhead import naive_offload

logger = logging.getLogger(__name__)

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

HOST = "127.0.0.1"  # never any other address


class QuietHandler(WSGIRequestHandler):
    """``wsgiref``'s request handler, logging through `logging` instead of stderr."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        """Log one request line at DEBUG."""
        logger.debug("%s " + format, self.address_string(), *args)


class BoundedWSGIServer(ThreadingMixIn, WSGIServer):
    """A ``wsgiref`` server with one thread per request and at most ``threads`` at once.

    When every thread is busy the accept loop waits for one to finish, so new
    connections wait in the listen backlog, as in a server with a fixed thread pool.
    ``stop(timeout)`` ends the accept loop and joins every thread within the budget.
    """

    daemon_threads = False
    block_on_close = False  # stop() joins the request threads itself, with a timeout
    request_queue_size = 128  # the listen backlog: room for a burst of connections

    def __init__(self, app: WSGIApp, threads: int) -> None:
        super().__init__((HOST, 0), QuietHandler)
        self.set_app(app)
        # A slot per request thread: taken by the accept loop before it starts a thread,
        # given back by that thread when its request is done.
        self._slots = threading.BoundedSemaphore(threads)
        # Set by stop(); the accept loop, waiting for a slot, checks it between tries.
        self._stopping = threading.Event()
        # Guards _request_threads, which each request thread adds itself to and removes
        # itself from; stop() reads it to join them.
        self._lock = threading.Lock()
        self._request_threads: set[threading.Thread] = set()
        self._loop = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.05}, name="http-accept"
        )

    @property
    def port(self) -> int:
        """The port the server listens on (chosen by the system)."""
        return int(self.server_address[1])

    def start(self) -> BoundedWSGIServer:
        """Start the accept loop in its own thread; return the server."""
        self._loop.start()
        return self

    def process_request(self, request: Any, client_address: Any) -> None:
        """Wait for a free thread slot, then hand the request to a new thread."""
        while not self._slots.acquire(timeout=0.05):
            if self._stopping.is_set():
                self.shutdown_request(request)
                return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """Serve one request, then give its slot back."""
        current = threading.current_thread()
        with self._lock:
            self._request_threads.add(current)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._request_threads.discard(current)
            self._slots.release()

    def stop(self, timeout: float) -> bool:
        """Stop accepting, join the accept loop and the request threads; True if all ended."""
        deadline = time.monotonic() + timeout
        self._stopping.set()
        if self._loop.is_alive():
            self.shutdown()  # returns once the accept loop has left serve_forever()
            self._loop.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            threads = list(self._request_threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        ended = not self._loop.is_alive() and not any(t.is_alive() for t in threads)
        self.server_close()
        return ended


@contextmanager
def serving(app: WSGIApp, threads: int, stop_timeout: float = 10.0) -> Iterator[BoundedWSGIServer]:
    """Run ``app`` on a `BoundedWSGIServer` for the ``with`` block; stop it on the way out."""
    server = BoundedWSGIServer(app, threads).start()
    try:
        yield server
    finally:
        if not server.stop(stop_timeout):
            raise RuntimeError(f"server threads still running after {stop_timeout}s")


@dataclass(frozen=True)
class Reply:
    """One HTTP response as a client saw it."""

    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float  # connect to last byte


def http_get(port: int, path: str, timeout: float = 10.0) -> Reply:
    """GET ``path`` from 127.0.0.1:``port`` on a new connection; ``timeout`` bounds each step."""
    start = time.perf_counter()
    connection = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
        headers = {name.lower(): value for name, value in response.getheaders()}
        return Reply(response.status, headers, body, time.perf_counter() - start)
    finally:
        connection.close()


def text(status: str, body: str) -> WSGIApp:
    """A WSGI app that answers ``status`` with a plain-text ``body``."""
    data = body.encode()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        start_response(status, [("Content-Type", "text/plain"), ("Content-Length", str(len(data)))])
        return [data]

    return app


def router(routes: dict[str, WSGIApp]) -> WSGIApp:
    """A WSGI app that sends each request to ``routes[PATH_INFO]``, or answers 404."""
    not_found = text("404 Not Found", "no such route")

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        return routes.get(environ.get("PATH_INFO", ""), not_found)(environ, start_response)

    return app


# --- the benchmark -----------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """The knobs of one benchmark run."""

    threads: int = 8
    workers: int = 2
    queue: int = 4
    heavy_ms: float = 50.0
    heavy_clients: int = 16
    backoff_ms: float = 10.0
    seconds: float = 1.5


@dataclass
class RunResult:
    """What one run measured."""

    light: list[float]  # light-route latencies, seconds
    heavy_statuses: dict[int, int]  # status -> count


def heavy_app(seconds: float) -> WSGIApp:
    """The heavy route: ``seconds`` of work that leaves the GIL free, then a 200."""
    done = text("200 OK", "heavy result")

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        time.sleep(seconds)  # stands for a slow query: the work a bulkhead fences off
        return done(environ, start_response)

    return app


def one_run(mode: str, s: Settings) -> RunResult:
    """Serve both routes in ``mode`` (``without`` or ``with``) under load; measure /light."""
    heavy = heavy_app(s.heavy_ms / 1000)
    executor: ThreadPoolExecutor | None = None
    bulkhead: Bulkhead | None = None
    if mode == "without":
        executor = ThreadPoolExecutor(max_workers=s.workers, thread_name_prefix="naive-heavy")
        heavy_route = naive_offload(heavy, executor)
    else:
        bulkhead = Bulkhead(s.workers, s.queue, name="heavy")
        heavy_route = BulkheadMiddleware(heavy, bulkhead, timeout=10.0, retry_after=1).start()
    app = router({"/heavy": heavy_route, "/light": text("200 OK", "light result")})
    stop = threading.Event()  # set when the run's time is up; every client loop checks it
    lock = threading.Lock()  # guards the two result containers below
    light: list[float] = []
    statuses: dict[int, int] = {}
    max_requests = int(s.seconds * 1000) + 100  # a hard bound on every client loop

    try:
        with serving(app, s.threads) as server:

            def heavy_client() -> None:
                for _ in range(max_requests):
                    if stop.is_set():
                        return
                    status = http_get(server.port, "/heavy").status
                    with lock:
                        statuses[status] = statuses.get(status, 0) + 1
                    if status == 503:
                        stop.wait(s.backoff_ms / 1000)

            def light_client() -> None:
                for _ in range(max_requests):
                    if stop.wait(0.01):
                        return
                    reply = http_get(server.port, "/light")
                    with lock:
                        light.append(reply.seconds)

            clients = [
                threading.Thread(target=heavy_client, name=f"heavy-client-{i}")
                for i in range(s.heavy_clients)
            ]
            clients.append(threading.Thread(target=light_client, name="light-client"))
            for client in clients:
                client.start()
            stop.wait(s.seconds)
            stop.set()
            for client in clients:
                client.join(30.0)
                if client.is_alive():
                    raise RuntimeError(f"{client.name} did not finish")
    finally:
        stop.set()
        if executor is not None:
            executor.shutdown(wait=True)
        if bulkhead is not None:
            bulkhead.stop(10.0)
    return RunResult(light, statuses)


def percentile(values: list[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile of ``values`` (p in 0..100)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


STATS: dict[str, Callable[[list[float]], float]] = {
    "p50": lambda v: percentile(v, 50),
    "p95": lambda v: percentile(v, 95),
    "p99": lambda v: percentile(v, 99),
    "max": max,
}


def table(results: dict[str, list[RunResult]]) -> list[str]:
    """Light-route latency rows (ms): median [min-max] over runs per mode, and the ratio."""
    head = ("light route", "without bulkhead", "with bulkhead", "ratio")
    rows: list[tuple[str, ...]] = [head]
    for stat, fn in STATS.items():
        cells: list[str] = [stat]
        medians = {}
        for mode in ("without", "with"):
            values = [fn(run.light) * 1000 for run in results[mode]]
            medians[mode] = statistics.median(values)
            cells.append(f"{medians[mode]:.1f} [{min(values):.1f}-{max(values):.1f}]")
        cells.append(f"{medians['without'] / medians['with']:.0f}x")
        rows.append(tuple(cells))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return lines


def summary(results: dict[str, list[RunResult]]) -> list[str]:
    """One line per mode: light requests answered, heavy statuses seen."""
    lines = []
    for mode, runs in results.items():
        light = sum(len(run.light) for run in runs)
        statuses: dict[int, int] = {}
        for run in runs:
            for status, count in run.heavy_statuses.items():
                statuses[status] = statuses.get(status, 0) + count
        seen = ", ".join(f"{count} x {status}" for status, count in sorted(statuses.items()))
        lines.append(f"{mode} bulkhead: {light} light requests answered; heavy: {seen}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the benchmark and print the table."""
    defaults = Settings()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=5, help="runs per mode")
    parser.add_argument("--seconds", type=float, default=defaults.seconds, help="per run")
    parser.add_argument("--threads", type=int, default=defaults.threads, help="server threads")
    parser.add_argument("--workers", type=int, default=defaults.workers, help="heavy workers")
    parser.add_argument("--queue", type=int, default=defaults.queue, help="bulkhead queue")
    parser.add_argument("--heavy-ms", type=float, default=defaults.heavy_ms)
    parser.add_argument("--heavy-clients", type=int, default=defaults.heavy_clients)
    parser.add_argument("--backoff-ms", type=float, default=defaults.backoff_ms)
    parser.add_argument(
        "--json",
        action="store_true",
        help="print every run's raw measurements as JSON instead of the table",
    )
    args = parser.parse_args(argv)
    s = Settings(
        args.threads,
        args.workers,
        args.queue,
        args.heavy_ms,
        args.heavy_clients,
        args.backoff_ms,
        args.seconds,
    )
    results: dict[str, list[RunResult]] = {"without": [], "with": []}
    for run in range(args.runs):
        for mode in ("without", "with") if run % 2 == 0 else ("with", "without"):
            results[mode].append(one_run(mode, s))
    if args.json:
        raw = {
            mode: [{"light_s": run.light, "heavy_statuses": run.heavy_statuses} for run in runs]
            for mode, runs in results.items()
        }
        print(json.dumps({"settings": dataclasses.asdict(s), "runs": raw}))  # noqa: T201
        return 0
    version = sys.version.split()[0]
    setup = (
        f"Python {version}; {args.runs} runs of {s.seconds}s per mode; {s.threads} server "
        f"threads; heavy: {s.workers} workers, {s.heavy_ms:g} ms each, {s.heavy_clients} "
        f"clients; bulkhead queue {s.queue}"
    )
    out = [
        setup,
        "light-route latency in ms: median [min-max] over the runs; ratio = without / with",
        *table(results),
        *summary(results),
    ]
    print("\n".join(out))  # noqa: T201 - the table is this program's output
    return 0


if __name__ == "__main__":
    sys.exit(main())
