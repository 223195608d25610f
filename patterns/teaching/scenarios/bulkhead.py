"""The bulkhead picture, B1: a heavy burst takes every request thread, and /light waits.

A two-thread server, in-process: request threads take requests from a backlog, as a
threaded WSGI server takes connections. The race tests do the same over real HTTP.

Docs: docs/patterns/bulkhead.md
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from patterns import bulkhead
from patterns.naive import bulkhead as naive_bulkhead
from patterns.teaching.lanes import Tracer
from patterns.teaching.scenarios.common import (
    LOOK,
    MUST_HAPPEN,
    Scenario,
    blocked_in,
    join_all,
    start_thread,
    wait_for,
)


class _Server:
    def __init__(self, tracer: Tracer, handle: Callable[[str], str]) -> None:
        self.backlog: queue.Queue[str | None] = queue.Queue()
        self.tracer = tracer
        self.handle = handle
        self.answered: dict[str, threading.Event] = {}
        self.threads = [start_thread(f"request-{i}", self._serve) for i in range(2)]

    def _serve(self) -> None:
        while (request := self.backlog.get()) is not None:
            self.tracer.mark(f"takes {request}")
            status = self.handle(request)
            self.tracer.mark(f"answers {request}: {status}")
            self.answered[request].set()

    def send(self, request: str) -> None:
        self.answered[request] = threading.Event()
        self.backlog.put(request)

    def close(self) -> None:
        for _ in self.threads:
            self.backlog.put(None)
        join_all(*self.threads)


def _b1_run(fixed: bool) -> Tracer:
    title = "Bulkhead(1, 0) for /heavy" if fixed else "naive_offload: 1 worker, unbounded queue"
    tracer = Tracer(title, {"MainThread": "main"})
    entered, release = threading.Event(), threading.Event()

    def heavy(environ: dict[str, object], start_response: Callable[..., object]) -> list[bytes]:
        tracer.mark("runs the heavy query")
        entered.set()
        wait_for(release, "B1 heavy query")
        start_response("200 OK", [])
        return [b"done"]

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pool")
    guard = bulkhead.Bulkhead(1, 0, name="heavy")
    offloaded = naive_bulkhead.naive_offload(heavy, pool)

    def handle(request: str) -> str:
        if request.startswith("/light"):
            return "200"
        if not fixed:
            offloaded({}, lambda *_: None)
            return "200"
        try:
            guard.call(heavy, {}, lambda *_: None, timeout=MUST_HAPPEN)
        except bulkhead.BulkheadFull:
            return "503 at once: the bulkhead is full"
        return "200"

    if fixed:
        guard.start()
    server = _Server(tracer, handle)
    try:
        _b1_requests(tracer, server, entered, release, fixed=fixed)
    finally:
        release.set()
        server.close()
        pool.shutdown(wait=True)
        if fixed:
            guard.stop(MUST_HAPPEN)
    return tracer


def _b1_requests(
    tracer: Tracer,
    server: _Server,
    entered: threading.Event,
    release: threading.Event,
    *,
    fixed: bool,
) -> None:
    tracer.mark("GET /heavy (1)")
    server.send("/heavy (1)")
    wait_for(entered, "B1 first heavy query running")
    tracer.mark("GET /heavy (2)")
    server.send("/heavy (2)")
    if fixed:
        wait_for(server.answered["/heavy (2)"], "B1 second heavy refused")
    else:
        for thread in server.threads:
            blocked_in(thread, "result")
    tracer.mark("GET /light")
    server.send("/light")
    light = server.answered["/light"]
    if fixed:
        wait_for(light, "B1 light answered")
    elif light.wait(LOOK):
        raise RuntimeError("B1: the light request found a free request thread")
    else:
        for thread in server.threads:
            tracer.mark(
                "waits in result() for the pool's one worker; /light waits for this thread",
                bad=True,
                lane=thread.name,
            )
    tracer.mark("the heavy query ends")
    release.set()
    wait_for(light, "B1 light answered")
    wait_for(server.answered["/heavy (1)"], "B1 heavy answered")


B1 = Scenario.of(
    "B1",
    _b1_run,
    "The executor has one worker and an unbounded queue, so both request threads wait "
    "on the heavy route and /light waits for a thread; the bulkhead refuses the second "
    "heavy call at once, so /light is answered while the heavy query runs.",
)
