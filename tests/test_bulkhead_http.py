"""BulkheadMiddleware: in-process WSGI calls, then real sockets and concurrent HTTP clients.

The HTTP tests run a ``wsgiref`` server on 127.0.0.1 (a port the system picks) with a
bounded number of request threads, from ``benchmarks.bulkhead_http``. Heavy requests are
held at an event until the test releases them, so "every thread is busy" is a state the
test creates, not one it hopes for. Every server, pool and client thread is joined.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import pytest

from benchmarks.bulkhead_http import Reply, http_get, router, serving, text
from examples.bulkhead_wsgi import BulkheadMiddleware
from patterns.bulkhead import Bulkhead, JobToken
from patterns.naive.bulkhead import naive_offload
from tests.support import MUST_HAPPEN, Gate, join_or_fail, run_in_thread, stays_blocked

# --- helpers ------------------------------------------------------------------------------


class HeldRoute:
    """A WSGI route whose requests park until the test sets ``release``.

    ``entered`` counts the requests that reached it (under ``changed``, which is notified
    on every arrival); the route then waits on ``release``, bounded by MUST_HAPPEN.
    """

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.entered = 0
        self.release = threading.Event()  # set by the test; waited on by every request

    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        """Count the arrival, wait for the release, answer 200."""
        with self.changed:
            self.entered += 1
            self.changed.notify_all()
        if not self.release.wait(MUST_HAPPEN):
            raise TimeoutError("the test never released the heavy route")
        return list(text("200 OK", "heavy result")(environ, start_response))

    def wait_entered(self, count: int) -> None:
        """Block until ``count`` requests have reached the route."""
        with self.changed:
            assert self.changed.wait_for(lambda: self.entered >= count, MUST_HAPPEN), (
                f"only {self.entered} of {count} requests reached the heavy route"
            )


class Arrivals:
    """Counts, per path, the requests a server thread started to serve."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.changed = threading.Condition()
        self.counts: dict[str, int] = {}

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        """Count the request, then pass it on."""
        path = environ.get("PATH_INFO", "")
        with self.changed:
            self.counts[path] = self.counts.get(path, 0) + 1
            self.changed.notify_all()
        return self.app(environ, start_response)

    def wait_for(self, path: str, count: int) -> None:
        """Block until ``count`` requests for ``path`` are being served."""
        with self.changed:
            assert self.changed.wait_for(lambda: self.counts.get(path, 0) >= count, MUST_HAPPEN), (
                f"{self.counts.get(path, 0)} of {count} requests for {path} arrived"
            )


class StartResponse:
    """Records what a WSGI app passed to ``start_response``."""

    def __init__(self) -> None:
        self.status = ""
        self.headers: dict[str, str] = {}

    def __call__(self, status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        """Record the status and headers; return a write() that drops its data."""
        self.status = status
        self.headers = dict(headers)
        return lambda data: None


def environ(path: str = "/") -> dict[str, Any]:
    """A minimal WSGI environ for in-process calls."""
    return {"REQUEST_METHOD": "GET", "PATH_INFO": path, "wsgi.url_scheme": "http"}


def get_in_thread(port: int, path: str, name: str, replies: queue.Queue[Reply] | None = None):
    """Start a client thread that GETs ``path``; its reply also goes to ``replies``."""

    def client() -> Reply:
        reply = http_get(port, path, timeout=MUST_HAPPEN)
        if replies is not None:
            replies.put(reply)
        return reply

    return run_in_thread(client, name)


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    """Clean-ups run newest first, so "release the held requests" runs before "stop"."""
    with ExitStack() as exits:
        yield exits


# --- the middleware, in process -----------------------------------------------------------


def test_middleware_passes_the_apps_response_through_unchanged() -> None:
    """Status, headers and every body chunk (write() first) arrive as the app made them."""
    bulkhead = Bulkhead(1, 0, name="pages")  # the middleware starts it
    seen: dict[str, Any] = {}

    class Body:
        closed = False

        def __iter__(self) -> Iterator[bytes]:
            yield b"second,"
            yield b"third"

        def close(self) -> None:
            Body.closed = True

    def app(env: dict[str, Any], start_response: Any) -> Body:
        seen["thread"] = threading.current_thread().name
        seen["token"] = env["bulkhead.token"]
        write = start_response("201 Created", [("X-Custom", "yes"), ("Content-Type", "a/b")])
        write(b"first,")
        return Body()

    recorder = StartResponse()
    with BulkheadMiddleware(app, bulkhead) as middleware:
        assert bulkhead.started
        body = middleware(environ(), recorder)
    assert bulkhead.stopped

    assert recorder.status == "201 Created"
    assert recorder.headers == {"X-Custom": "yes", "Content-Type": "a/b"}
    assert b"".join(body) == b"first,second,third"
    assert Body.closed  # close() ran in the worker, with the rest of the app's work
    assert seen["thread"] == "pages-worker-0"
    assert isinstance(seen["token"], JobToken)
    assert not any(thread.is_alive() for thread in bulkhead.threads)


def test_middleware_starts_nothing_when_built_and_fails_loudly_if_never_started() -> None:
    """A request to a bulkhead nobody started is a RuntimeError (a 500), not a 503."""
    bulkhead = Bulkhead(1, 0, name="forgotten")
    middleware = BulkheadMiddleware(text("200 OK", "never"), bulkhead)
    assert bulkhead.threads == []

    with pytest.raises(RuntimeError, match="not started"):
        middleware(environ(), StartResponse())

    assert middleware.start() is middleware
    recorder = StartResponse()
    assert b"".join(middleware(environ(), recorder)) == b"never"
    assert recorder.status == "200 OK"
    assert middleware.stop(MUST_HAPPEN).terminated


def test_middleware_answers_503_with_retry_after_when_full_and_when_stopped() -> None:
    """A refused request gets 503, Retry-After and a JSON body saying why; the app never runs."""
    bulkhead = Bulkhead(1, 0, name="search").start()
    gate = Gate("running request")
    bulkhead.submit(gate.arrive)
    gate.wait_reached()
    middleware = BulkheadMiddleware(text("200 OK", "never"), bulkhead, retry_after=7)

    full = StartResponse()
    body = json.loads(b"".join(middleware(environ(), full)))
    assert full.status == "503 Service Unavailable"
    assert full.headers["Retry-After"] == "7"
    assert body == {
        "error": "Service Unavailable",
        "message": "The bulkhead is at capacity. Please try again later.",
        "bulkhead": "search",
    }

    gate.open()
    assert bulkhead.stop(MUST_HAPPEN).terminated
    stopped = StartResponse()
    body = json.loads(b"".join(middleware(environ(), stopped)))
    assert stopped.status == "503 Service Unavailable"
    assert stopped.headers["Retry-After"] == "7"
    assert body["message"] == "The bulkhead is stopped."
    stats = bulkhead.stats()
    assert (stats.rejections, stats.shutdown_rejections) == (1, 1)


def test_middleware_answers_504_when_the_timeout_passes() -> None:
    """A request still queued behind a held one at its deadline gets 504."""
    bulkhead = Bulkhead(1, 1, name="reports").start()
    gate = Gate("running request")
    bulkhead.submit(gate.arrive)
    gate.wait_reached()
    middleware = BulkheadMiddleware(text("200 OK", "late"), bulkhead, timeout=0.05)

    recorder = StartResponse()
    body = json.loads(b"".join(middleware(environ(), recorder)))

    assert recorder.status == "504 Gateway Timeout"
    assert "Retry-After" not in recorder.headers
    assert body["error"] == "Gateway Timeout"
    gate.open()
    assert bulkhead.stop(MUST_HAPPEN).terminated
    assert bulkhead.stats().timeouts == 1


def test_middleware_re_raises_the_apps_exception_in_the_request_thread() -> None:
    """An app failure is not a 503 or 504: the server sees the app's own exception."""
    bulkhead = Bulkhead(1, 0).start()

    def broken(env: dict[str, Any], start_response: Any) -> list[bytes]:
        raise KeyError("missing")

    with pytest.raises(KeyError, match="missing"):
        BulkheadMiddleware(broken, bulkhead)(environ(), StartResponse())
    assert bulkhead.stats().errors == 1
    assert bulkhead.stop(MUST_HAPPEN).terminated


def empty_app(environ, start_response):
    """A WSGI app that is never called: the middleware must refuse its options first."""
    raise AssertionError("called")


@pytest.mark.parametrize(
    ("build", "option"),
    [
        (lambda: BulkheadMiddleware(empty_app, None, timeout=-1), "timeout"),
        (lambda: BulkheadMiddleware(empty_app, None, timeout=None), "timeout"),
        (lambda: BulkheadMiddleware(empty_app, None, retry_after=-1), "retry_after"),
        (lambda: BulkheadMiddleware(empty_app, None, retry_after=0.5), "retry_after"),
    ],
)
def test_invalid_middleware_options_are_refused_when_built_with_a_value_error_naming_them(
    build: Callable[[], Any], option: str
) -> None:
    """A bad option fails at construction, naming itself, before any thread starts."""
    before = threading.active_count()
    with pytest.raises(ValueError, match=f"^{option} must be"):
        build()
    assert threading.active_count() == before


# --- B1: over real HTTP, a burst on the heavy route and the light route --------------------


@pytest.mark.race("B1", "an unbounded executor in a server: a heavy burst starves the light route")
def test_naive_unbounded_executor_lets_a_heavy_burst_starve_the_light_route(
    stack: ExitStack, record_property: Callable[[str, object], None]
) -> None:
    """Every server thread waits on the executor's queue, so a light request gets no thread."""
    executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="naive-heavy")
    stack.callback(executor.shutdown, wait=True)
    held = HeldRoute()
    app = Arrivals(router({"/heavy": naive_offload(held, executor), "/light": text("200 OK", "")}))
    server = stack.enter_context(serving(app, threads=4))
    stack.callback(held.release.set)

    heavy = [get_in_thread(server.port, "/heavy", f"heavy-{i}") for i in range(4)]
    app.wait_for("/heavy", 4)  # all four server threads are in the heavy route
    held.wait_entered(2)  # two run on the executor; two wait in its unbounded queue
    light, light_outcome = get_in_thread(server.port, "/light", "light")
    asked_at = time.monotonic()

    assert stays_blocked(light)  # no answer, for as long as we look
    assert app.counts.get("/light", 0) == 0  # it never even reached the app: no thread
    held.release.set()
    join_or_fail(light)
    for thread, _ in heavy:
        join_or_fail(thread)
    light_reply = light_outcome.get("result")
    record_property(
        "observed",
        f"/light got no server thread: answered {getattr(light_reply, 'status', None)}"
        f" after {time.monotonic() - asked_at:.1f}s, only once /heavy was released",
    )
    assert light_outcome["result"].status == 200  # only once the heavy burst was over
    assert [outcome["result"].status for _, outcome in heavy] == [200] * 4


@pytest.mark.race("B1", "an unbounded executor in a server: a heavy burst starves the light route")
def test_bulkhead_sheds_the_heavy_overflow_with_503_and_the_light_route_keeps_answering(
    stack: ExitStack,
) -> None:
    """With workers + queue below the thread limit, heavy overflow gets 503 and light gets 200."""
    bulkhead = Bulkhead(2, 1, name="heavy").start()  # 2 + 1 = 3 < 4 server threads
    stack.callback(lambda: bulkhead.stop(MUST_HAPPEN))
    held = HeldRoute()
    heavy_route = BulkheadMiddleware(held, bulkhead, timeout=MUST_HAPPEN, retry_after=1)
    app = router({"/heavy": heavy_route, "/light": text("200 OK", "light result")})
    server = stack.enter_context(serving(app, threads=4))
    stack.callback(held.release.set)
    replies: queue.Queue[Reply] = queue.Queue()

    heavy = [get_in_thread(server.port, "/heavy", f"heavy-{i}", replies) for i in range(6)]
    held.wait_entered(2)
    shed = [replies.get(timeout=MUST_HAPPEN) for _ in range(3)]  # answered while 3 are held

    assert [reply.status for reply in shed] == [503] * 3
    assert all(reply.headers["retry-after"] == "1" for reply in shed)
    stats = bulkhead.stats()
    assert (stats.active, stats.queued, stats.rejections) == (2, 1, 3)
    light = http_get(server.port, "/light", timeout=MUST_HAPPEN)
    assert light.status == 200
    assert light.body == b"light result"
    assert bulkhead.stats().active == 2  # answered while the heavy route was saturated
    assert http_get(server.port, "/heavy", timeout=MUST_HAPPEN).status == 503

    held.release.set()
    for thread, _ in heavy:
        join_or_fail(thread)
    statuses = sorted(outcome["result"].status for _, outcome in heavy)
    assert statuses == [200, 200, 200, 503, 503, 503]
    assert bulkhead.stop(MUST_HAPPEN).terminated
    assert bulkhead.stats().processed == 3


def test_the_wire_carries_504_on_timeout_and_503_once_stopped(stack: ExitStack) -> None:
    """A caller's timeout is a 504 on the socket; after stop() every request is a 503."""
    bulkhead = Bulkhead(1, 0, name="slow").start()
    stack.callback(lambda: bulkhead.stop(MUST_HAPPEN))
    held = HeldRoute()
    app = router({"/slow": BulkheadMiddleware(held, bulkhead, timeout=0.1, retry_after=5)})
    server = stack.enter_context(serving(app, threads=2))
    stack.callback(held.release.set)

    timed_out = http_get(server.port, "/slow", timeout=MUST_HAPPEN)

    assert timed_out.status == 504
    assert timed_out.headers["content-type"] == "application/json"
    assert json.loads(timed_out.body)["error"] == "Gateway Timeout"
    held.release.set()
    assert bulkhead.stop(MUST_HAPPEN).terminated
    stats = bulkhead.stats()
    assert stats.timeouts == 1
    assert stats.processed + stats.skipped == 1  # it ran to its end, or never started

    stopped = http_get(server.port, "/slow", timeout=MUST_HAPPEN)
    assert stopped.status == 503
    assert stopped.headers["retry-after"] == "5"
    assert json.loads(stopped.body)["message"] == "The bulkhead is stopped."
