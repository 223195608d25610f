"""This project's PostgresStore beside pgqueuer and procrastinate, on one PostgreSQL server.

Run it inside a throwaway cluster (the peers come from the ``bench`` extra,
``pip install -e '.[bench,postgres]'``)::

    scripts/pg-test-cluster.sh run -- python -m benchmarks.postgres_compare
    PG_TEST_DURABLE=1 scripts/pg-test-cluster.sh run -- python -m benchmarks.postgres_compare

The first runs on the cluster's usual settings (fsync and synchronous_commit off), the
second with both on; the heading prints them. ``make bench`` runs both. ``--help`` for
the knobs; ``--quick`` is a small smoke run. It works against any server named by
``PATTERNS_PG_DSN`` (a ``postgresql://`` URL of a user allowed to create databases),
creating a database per measurement and dropping it afterwards.

Rows: this project, one row per ``--ours`` setting (default ``threads=4``, which
prefetches sixteen, four per thread, ``threads=4,prefetch=0``, at most 4 jobs in flight,
and ``threads=4,prefetch=4``, one claim waiting per thread:
comma-separated keywords of ``Worker`` or of ``PostgresStore``, values as Python literals,
``threads`` meaning ``concurrency``), so that any setting can be measured without editing
this file; procrastinate (``concurrency=4``, psycopg pool); pgqueuer on asyncpg with at most
4 jobs picked at once (``batch_size=2, max_concurrent_tasks=4``; pgqueuer wants the cap at
least twice the batch), and pgqueuer at its defaults (``batch_size=10``, no cap), as its
README runs it.

* drain: ``--jobs`` no-op jobs (5,000) are enqueued in bulk, then a consumer drains them,
  in a fresh interpreter on a fresh database, ``--rounds`` interleaved rounds (3). jobs/s
  counts from the first handler start (``perf_counter`` on the handler's first line) to
  the last commit of an outcome: this project's ``on_complete`` hook (it runs after the
  commit), procrastinate's ``JobManager.finish_job`` returning, pgqueuer's
  ``Queries.log_jobs`` returning (pgqueuer buffers completions and writes them in
  batches: the last batch's write is the end).
* enqueue: ``--enqueue-jobs`` jobs (1,000) one call each (``PostgresStore.enqueue``,
  ``Task.defer_async``, ``Queries.enqueue``), on a fresh database, one connection.
* wake-up: an idle consumer; another connection enqueues one job; from just before the
  enqueue call to the handler's first line, ``--samples`` samples per round, p50 and p90
  over every round. The consumer runs with the row's settings (this project's Worker
  polls every second by default; its NOTIFY ends the wait).
* statements: one more run per system on a database with ``log_statement = 'all'``,
  counting the ``statement:``/``execute`` lines the server logs while ``--count-jobs``
  (1,000) jobs are enqueued one at a time, then while a consumer started for them drains
  them (its start-up and shutdown included). It reads the server log of the throwaway
  cluster (``$PG_TEST_CLUSTER_DIR/server.log``, or ``--server-log``); without one the
  column says "-".

``--kill-test`` instead measures what each system (at its defaults) does after its
consumer is SIGKILLed, in two ways: (a) handlers that block, a consumer killed once it runs
them (12 queued); (b) 2,000 no-op jobs, a consumer killed once 500 handlers have
returned. Then a second consumer with handlers that return at once is
watched for ``--kill-wait`` seconds (75): which jobs run again (a handler that had
returned, or one still running at the kill), after how long, which never run, and how
many have no outcome recorded at the end ("not done": still queued, running or stuck). Each
handler prints a line as it starts and as it returns; the parent reads them.

The heading gives the load average at the start, the last line the wall time and the load
at the end. This is a measurement to read, not a test: nothing here asserts on a time.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import importlib.util
import inspect
import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from benchmarks._tables import (
    ROOT,
    Row,
    child_env,
    child_result,
    emit,
    end_line,
    fmt,
    load_average,
    percentile,
    render,
    run_child,
    target,
)

MODULE = "postgres_compare"
DSN_VARIABLE = "PATTERNS_PG_DSN"
DEFAULT_OURS = ("threads=4", "threads=4,prefetch=0", "threads=4,prefetch=4")
FILL_BATCH = 1_000  # jobs per bulk enqueue while filling a queue
DRAIN_TIMEOUT = 240.0  # seconds one drain may take before the child gives up
PROCRASTINATE = "procrastinate"
PGQ_FOUR = "pgqueuer-4"
PGQ_DEFAULTS = "pgqueuer"
PEERS = {
    # system -> (label, the modules it needs)
    PROCRASTINATE: ("procrastinate (concurrency 4)", ("procrastinate", "psycopg_pool")),
    PGQ_FOUR: ("pgqueuer (asyncpg, at most 4 in flight)", ("pgqueuer", "asyncpg")),
    PGQ_DEFAULTS: ("pgqueuer at its defaults (batch 10)", ("pgqueuer", "asyncpg")),
}
PGQ_SETTINGS = {PGQ_FOUR: {"batch_size": 2, "max_concurrent_tasks": 4}, PGQ_DEFAULTS: {}}
LOGGED = re.compile(r"\bLOG:  (?:statement|execute [^:]*): ")
MARK = "postgres_compare mark"


def have(*modules: str) -> bool:
    """Whether every one of ``modules`` can be imported."""
    return all(importlib.util.find_spec(name) is not None for name in modules)


# --- settings and databases ------------------------------------------------------------


def parse_ours(spec: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``"threads=4,prefetch=4"`` -> (PostgresStore keywords, Worker keywords).

    A key is the name of a keyword of ``PostgresStore`` or of ``Worker`` (``threads`` is
    ``concurrency``); a value is a Python literal, or else the text itself.
    """
    from patterns.jobqueue.stores.postgres.store import PostgresStore  # noqa: PLC0415
    from patterns.jobqueue.worker.worker import Worker  # noqa: PLC0415

    store_keys = set(inspect.signature(PostgresStore).parameters) - {"dsn", "schema"}
    worker_keys = set(inspect.signature(Worker).parameters) - {"store", "tasks"}
    store: dict[str, Any] = {}
    worker: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"--ours {spec!r}: {item!r} is not key=value")
        try:
            value = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError):
            value = text.strip()
        key = "concurrency" if key == "threads" else key
        if key in store_keys:
            store[key] = value
        elif key in worker_keys:
            worker[key] = value
        else:
            raise ValueError(
                f"--ours {spec!r}: {key!r} is a keyword of neither Worker nor PostgresStore"
            )
    return store, worker


def database_dsn(dsn: str, database: str) -> str:
    """``dsn`` (a ``postgresql://`` URL) with its database replaced by ``database``."""
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ValueError(f"{DSN_VARIABLE} must be a postgresql:// URL (asyncpg reads only those)")
    return urlunsplit(parts._replace(path=f"/{database}"))


def base_dsn() -> str:
    """The server to measure on (``PATTERNS_PG_DSN``)."""
    dsn = os.environ.get(DSN_VARIABLE, "").strip()
    if not dsn:
        raise SystemExit(
            f"no server: set {DSN_VARIABLE}, or run scripts/pg-test-cluster.sh run -- "
            "python -m benchmarks.postgres_compare"
        )
    return dsn


@contextmanager
def fresh_database(dsn: str, *, log_statements: bool = False) -> Iterator[str]:
    """A new database's name (its sessions logging every statement, if asked); dropped after."""
    import psycopg  # noqa: PLC0415 - optional, as in the store

    name = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # a generated name
        if log_statements:
            conn.execute(f"ALTER DATABASE \"{name}\" SET log_statement = 'all'")
    try:
        yield name
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def server_line(dsn: str) -> str:
    """The server's version, fsync and synchronous_commit, for the heading."""
    import psycopg  # noqa: PLC0415

    values = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in ("server_version", "fsync", "synchronous_commit"):
            row = conn.execute(f"SHOW {name}").fetchone()  # a fixed name
            values.append(str(row[0]).split()[0] if row else "?")
    version, fsync, commit = values
    return f"PostgreSQL {version}, fsync={fsync}, synchronous_commit={commit}"


# --- this project (in a child) -----------------------------------------------------------


@dataclass
class Marks:
    """Times taken in the handlers and at each recorded outcome (``perf_counter``)."""

    first_start: float = 0.0
    last_commit: float = 0.0
    settled: int = 0
    goal: int = 0  # the number of outcomes that sets done
    done: threading.Event = field(default_factory=threading.Event)


def ours_registry(marks: Marks, hook: Callable[[], None] | None = None) -> Any:
    """A `TaskRegistry` with one no-op task, ``noop``, that marks its start and its commit."""
    from patterns.jobqueue import TaskRegistry  # noqa: PLC0415

    lock = threading.Lock()  # guards marks: handler threads and settling threads write it

    def complete(*_: object) -> None:
        now = time.perf_counter()
        with lock:
            marks.last_commit = max(marks.last_commit, now)
            marks.settled += 1
            if marks.settled == marks.goal:
                marks.done.set()

    tasks = TaskRegistry(on_complete=complete)

    @tasks.task(name="noop")
    def noop(payload: object, ctx: object) -> None:
        now = time.perf_counter()
        with lock:
            if not marks.first_start:
                marks.first_start = now
        if hook is not None:
            hook()

    return tasks


def ours_drain(dsn: str, spec: str, jobs: int) -> dict[str, float]:
    """Fill ``jobs`` no-ops with ``enqueue_many``, then drain them with ``Worker``."""
    from patterns.jobqueue.stores.postgres.store import PostgresStore  # noqa: PLC0415
    from patterns.jobqueue.worker.worker import Worker  # noqa: PLC0415

    store_kw, worker_kw = parse_ours(spec)
    filler = PostgresStore(dsn, **store_kw)
    for first in range(0, jobs, FILL_BATCH):
        filler.enqueue_many([{"task": "noop"}] * min(FILL_BATCH, jobs - first))
    filler.close()
    marks = Marks(goal=jobs)
    store = PostgresStore(dsn, **store_kw)
    worker = Worker(store, ours_registry(marks), **worker_kw)
    worker.start()
    marks.done.wait(DRAIN_TIMEOUT)
    worker.stop(10.0)
    done = store.counts()["done"]
    store.close()
    if done != jobs:
        raise RuntimeError(f"project drain: {done} done of {jobs}")
    return {"seconds": marks.last_commit - marks.first_start}


def ours_enqueue(dsn: str, spec: str, count: int) -> dict[str, float]:
    """Seconds for ``count`` calls of ``PostgresStore.enqueue``."""
    from patterns.jobqueue.stores.postgres.store import PostgresStore  # noqa: PLC0415

    store_kw, _ = parse_ours(spec)
    store = PostgresStore(dsn, **store_kw)
    store.enqueue("noop")  # the schema exists and the connection is open before timing
    enqueue = store.enqueue
    start = time.perf_counter()
    for _ in range(count):
        enqueue("noop")
    seconds = time.perf_counter() - start
    store.close()
    return {"seconds": seconds}


def settle() -> None:
    """A pause that lets the consumer go idle, of random length (a random phase)."""
    time.sleep(random.uniform(0.05, 0.15))  # pacing the samples, not synchronising


def ours_wakeup(dsn: str, spec: str, samples: int) -> dict[str, Any]:
    """Latencies from an enqueue on another connection to the handler's first line."""
    from patterns.jobqueue.stores.postgres.store import PostgresStore  # noqa: PLC0415
    from patterns.jobqueue.worker.worker import Worker  # noqa: PLC0415

    store_kw, worker_kw = parse_ours(spec)
    started: list[float] = []
    ready = threading.Event()  # set by the handler, waited on by the producer loop

    def hook() -> None:
        started.append(time.perf_counter())
        ready.set()

    consumer = PostgresStore(dsn, **store_kw)
    producer = PostgresStore(dsn, **store_kw)
    latencies = []
    try:
        with Worker(consumer, ours_registry(Marks(), hook), **worker_kw):
            time.sleep(0.5)  # the worker reaches its idle wait (pacing, as settle())
            for _ in range(samples):
                settle()
                ready.clear()
                start = time.perf_counter()
                producer.enqueue("noop")
                if not ready.wait(15.0):
                    raise RuntimeError("the job did not start within 15 s")
                latencies.append(started[-1] - start)
    finally:
        producer.close()
        consumer.close()
    return {"latencies": latencies}


def ours_statements(dsn: str, spec: str, count: int, log: Path) -> dict[str, float]:
    """Statements the server logged per enqueue and per drained job (see the docstring)."""
    from patterns.jobqueue.stores.postgres.store import PostgresStore  # noqa: PLC0415
    from patterns.jobqueue.worker.worker import Worker  # noqa: PLC0415

    store_kw, worker_kw = parse_ours(spec)
    counter = LogCounter(dsn, log)
    producer = PostgresStore(dsn, **store_kw)
    producer.counts()  # connected, schema created: not part of the count
    with counter.span() as enqueued:
        for _ in range(count):
            producer.enqueue("noop")
    producer.close()
    marks = Marks(goal=count)
    with counter.span() as drained:
        store = PostgresStore(dsn, **store_kw)
        worker = Worker(store, ours_registry(marks), **worker_kw)
        worker.start()
        marks.done.wait(DRAIN_TIMEOUT)
        worker.stop(10.0)
        store.close()
    return {"enqueue": enqueued[0] / count, "drain": drained[0] / count}


# --- counting the statements the server logs -----------------------------------------------


class LogCounter:
    """Counts the statements a server logs between two marks it is made to log."""

    def __init__(self, dsn: str, log: Path) -> None:
        self._dsn = dsn
        self._log = log

    def _mark(self) -> tuple[str, int]:
        """Log a unique statement; wait until it is in the log; its text and the file size."""
        import psycopg  # noqa: PLC0415

        text = f"{MARK} {uuid.uuid4().hex}"
        with psycopg.connect(self._dsn, autocommit=True) as conn:
            conn.execute(f"SELECT '{text}'")  # a generated text, logged by the server
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            data = self._log.read_bytes()
            if text.encode() in data:
                return text, len(data)
            time.sleep(0.01)
        raise RuntimeError(f"the mark never reached {self._log}: is it this server's log?")

    @contextmanager
    def span(self) -> Iterator[list[int]]:
        """``[count]``: the statements logged between entering and leaving, marks excluded."""
        result = [0]
        begin, _ = self._mark()
        yield result
        end, size = self._mark()
        text = self._log.read_bytes()[:size].decode(errors="replace")
        inside = text[text.index(begin) : text.index(end)]
        lines = [line for line in inside.splitlines() if LOGGED.search(line)]
        result[0] = sum(1 for line in lines if MARK not in line)


# --- procrastinate (in a child) -------------------------------------------------------------


def procrastinate_app(dsn: str, hook: Callable[[], None]) -> tuple[Any, Any]:
    """A procrastinate ``App`` on psycopg with an async no-op task ``noop`` calling ``hook``."""
    import procrastinate  # noqa: PLC0415

    # It warns that an app made in __main__ cannot be found by a worker started apart;
    # every worker here runs in the process that made the app.
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop")
    async def noop() -> None:
        hook()

    return app, noop


def procrastinate_drain(dsn: str, jobs: int) -> dict[str, float]:
    """Fill ``jobs`` no-ops with ``batch_defer_async``; drain with a worker of concurrency 4."""
    marks = Marks()

    def hook() -> None:
        if not marks.first_start:
            marks.first_start = time.perf_counter()

    async def main() -> None:
        app, noop = procrastinate_app(dsn, hook)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            for first in range(0, jobs, FILL_BATCH):
                await noop.batch_defer_async(*[{}] * min(FILL_BATCH, jobs - first))
            finish = app.job_manager.finish_job

            async def finished(*args: Any, **kwargs: Any) -> None:
                await finish(*args, **kwargs)
                marks.last_commit = time.perf_counter()
                marks.settled += 1

            app.job_manager.finish_job = finished
            await app.run_worker_async(concurrency=4, wait=False, install_signal_handlers=False)

    asyncio.run(main())
    if marks.settled != jobs:
        raise RuntimeError(f"procrastinate drain: {marks.settled} finished of {jobs}")
    return {"seconds": marks.last_commit - marks.first_start}


def procrastinate_enqueue(dsn: str, count: int) -> dict[str, float]:
    """Seconds for ``count`` calls of ``defer_async``."""

    async def main() -> float:
        app, noop = procrastinate_app(dsn, lambda: None)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            await noop.defer_async()
            start = time.perf_counter()
            for _ in range(count):
                await noop.defer_async()
            return time.perf_counter() - start

    return {"seconds": asyncio.run(main())}


def procrastinate_wakeup(dsn: str, samples: int) -> dict[str, Any]:
    """Latencies from ``defer_async`` on another app's pool to the task's first line."""
    started: list[float] = []

    async def main() -> list[float]:
        ready = asyncio.Event()

        def hook() -> None:
            started.append(time.perf_counter())
            ready.set()

        app, _ = procrastinate_app(dsn, hook)
        producer, noop = procrastinate_app(dsn, lambda: None)
        latencies = []
        async with app.open_async(), producer.open_async():
            await app.schema_manager.apply_schema_async()
            worker = asyncio.create_task(
                app.run_worker_async(concurrency=4, install_signal_handlers=False)
            )
            await asyncio.sleep(0.5)
            for _ in range(samples):
                await asyncio.sleep(random.uniform(0.05, 0.15))
                ready.clear()
                start = time.perf_counter()
                await noop.defer_async()
                await asyncio.wait_for(ready.wait(), 15.0)
                latencies.append(started[-1] - start)
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
        return latencies

    return {"latencies": asyncio.run(main())}


def procrastinate_statements(dsn: str, count: int, log: Path) -> dict[str, float]:
    """Statements logged per ``defer_async`` and per job a worker drains."""
    counter = LogCounter(dsn, log)

    async def main() -> tuple[int, int]:
        app, noop = procrastinate_app(dsn, lambda: None)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
        producer, noop = procrastinate_app(dsn, lambda: None)
        async with producer.open_async():
            await noop.defer_async()  # the pool is open and warm: not part of the count
            with counter.span() as enqueued:
                for _ in range(count - 1):
                    await noop.defer_async()
        consumer, _ = procrastinate_app(dsn, lambda: None)
        with counter.span() as drained:
            async with consumer.open_async():
                await consumer.run_worker_async(
                    concurrency=4, wait=False, install_signal_handlers=False
                )
        return enqueued[0], drained[0]

    enqueued, drained = asyncio.run(main())
    return {"enqueue": enqueued / (count - 1), "drain": drained / count}


# --- pgqueuer (in a child) ----------------------------------------------------------------


async def pgq_queries(dsn: str, *, install: bool) -> tuple[Any, Any]:
    """(an asyncpg connection, pgqueuer ``Queries`` on it); installs pgqueuer's schema."""
    import asyncpg  # noqa: PLC0415
    from pgqueuer.db import AsyncpgDriver  # noqa: PLC0415
    from pgqueuer.queries import Queries  # noqa: PLC0415

    conn = await asyncpg.connect(dsn)
    queries = Queries(AsyncpgDriver(conn))
    if install:
        await queries.install()
    return conn, queries


def pgq_manager(conn: Any, hook: Callable[[], None]) -> Any:
    """A ``QueueManager`` on ``conn`` with an async no-op entrypoint ``noop`` calling ``hook``."""
    from pgqueuer.db import AsyncpgDriver  # noqa: PLC0415
    from pgqueuer.qm import QueueManager  # noqa: PLC0415
    from pgqueuer.queries import Queries  # noqa: PLC0415

    manager = QueueManager(Queries(AsyncpgDriver(conn)))

    @manager.entrypoint("noop")
    async def noop(job: object) -> None:
        hook()

    return manager


def pgq_run(manager: Any, system: str, *, drain: bool) -> Any:
    """``manager.run`` with the row's settings, in drain mode if asked (a coroutine)."""
    from pgqueuer.types import QueueExecutionMode  # noqa: PLC0415

    mode = QueueExecutionMode.drain if drain else QueueExecutionMode.continuous
    return manager.run(mode=mode, **PGQ_SETTINGS[system])


def pgq_drain(dsn: str, system: str, jobs: int) -> dict[str, float]:
    """Fill ``jobs`` no-ops with one batch ``enqueue`` per thousand, then drain them."""
    marks = Marks()

    def hook() -> None:
        if not marks.first_start:
            marks.first_start = time.perf_counter()

    async def main() -> None:
        conn, queries = await pgq_queries(dsn, install=True)
        for first in range(0, jobs, FILL_BATCH):
            n = min(FILL_BATCH, jobs - first)
            await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
        await conn.close()
        conn, _ = await pgq_queries(dsn, install=False)
        manager = pgq_manager(conn, hook)
        log_jobs = manager.queries.log_jobs

        async def logged(items: list[Any]) -> None:
            await log_jobs(items)
            marks.last_commit = time.perf_counter()
            marks.settled += len(items)

        manager.queries.log_jobs = logged
        await asyncio.wait_for(pgq_run(manager, system, drain=True), DRAIN_TIMEOUT)
        await conn.close()

    asyncio.run(main())
    if marks.settled != jobs:
        raise RuntimeError(f"pgqueuer drain: {marks.settled} logged of {jobs}")
    return {"seconds": marks.last_commit - marks.first_start}


def pgq_enqueue(dsn: str, count: int) -> dict[str, float]:
    """Seconds for ``count`` calls of ``Queries.enqueue`` with one job each."""

    async def main() -> float:
        conn, queries = await pgq_queries(dsn, install=True)
        await queries.enqueue("noop", None)
        start = time.perf_counter()
        for _ in range(count):
            await queries.enqueue("noop", None)
        seconds = time.perf_counter() - start
        await conn.close()
        return seconds

    return {"seconds": asyncio.run(main())}


def pgq_wakeup(dsn: str, system: str, samples: int) -> dict[str, Any]:
    """Latencies from ``Queries.enqueue`` on another connection to the entrypoint's first line."""

    async def main() -> list[float]:
        started: list[float] = []
        ready = asyncio.Event()

        def hook() -> None:
            started.append(time.perf_counter())
            ready.set()

        conn, producer = await pgq_queries(dsn, install=True)
        consumer_conn, _ = await pgq_queries(dsn, install=False)
        manager = pgq_manager(consumer_conn, hook)
        runner = asyncio.create_task(pgq_run(manager, system, drain=False))
        await asyncio.sleep(0.5)
        latencies = []
        for _ in range(samples):
            await asyncio.sleep(random.uniform(0.05, 0.15))
            ready.clear()
            start = time.perf_counter()
            await producer.enqueue("noop", None)
            await asyncio.wait_for(ready.wait(), 15.0)
            latencies.append(started[-1] - start)
        manager.shutdown.set()
        await asyncio.wait_for(runner, 15.0)
        await consumer_conn.close()
        await conn.close()
        return latencies

    return {"latencies": asyncio.run(main())}


def pgq_statements(dsn: str, system: str, count: int, log: Path) -> dict[str, float]:
    """Statements logged per ``Queries.enqueue`` of one job and per job drained."""
    counter = LogCounter(dsn, log)

    async def main() -> tuple[int, int]:
        conn, producer = await pgq_queries(dsn, install=True)
        await producer.enqueue("noop", None)
        with counter.span() as enqueued:
            for _ in range(count - 1):
                await producer.enqueue("noop", None)
        await conn.close()
        with counter.span() as drained:
            consumer_conn, _ = await pgq_queries(dsn, install=False)
            manager = pgq_manager(consumer_conn, lambda: None)
            await asyncio.wait_for(pgq_run(manager, system, drain=True), DRAIN_TIMEOUT)
            await consumer_conn.close()
        return enqueued[0], drained[0]

    enqueued, drained = asyncio.run(main())
    return {"enqueue": enqueued / (count - 1), "drain": drained / count}


# --- the child's entry point ---------------------------------------------------------------


def child(argv: list[str]) -> int:
    """``--child WHAT SYSTEM SPEC DATABASE N [LOG]``: one measurement; prints JSON."""
    what, system, spec, database, n, *rest = argv
    logging.basicConfig(level=logging.CRITICAL)  # the peers log every job at INFO
    dsn = database_dsn(base_dsn(), database)
    count = int(n)
    log = Path(rest[0]) if rest else Path()
    if system == "ours":
        table: dict[str, Callable[[], dict[str, Any]]] = {
            "drain": lambda: ours_drain(dsn, spec, count),
            "enqueue": lambda: ours_enqueue(dsn, spec, count),
            "wakeup": lambda: ours_wakeup(dsn, spec, count),
            "statements": lambda: ours_statements(dsn, spec, count, log),
        }
    elif system == PROCRASTINATE:
        table = {
            "drain": lambda: procrastinate_drain(dsn, count),
            "enqueue": lambda: procrastinate_enqueue(dsn, count),
            "wakeup": lambda: procrastinate_wakeup(dsn, count),
            "statements": lambda: procrastinate_statements(dsn, count, log),
        }
    else:
        table = {
            "drain": lambda: pgq_drain(dsn, system, count),
            "enqueue": lambda: pgq_enqueue(dsn, count),
            "wakeup": lambda: pgq_wakeup(dsn, system, count),
            "statements": lambda: pgq_statements(dsn, system, count, log),
        }
    child_result(table[what]())
    return 0


# --- the SIGKILL test ------------------------------------------------------------------------


KILL_JOBS = 12  # jobs in the queue when the first consumer starts (jobs in flight)
DRAIN_KILL_JOBS = 2_000  # jobs in the queue for the kill in the middle of a drain
DRAIN_KILL_AFTER = 500  # handlers that have returned when that kill comes


def kill_consumer(system: str, database: str, blocking: bool) -> int:
    """A consumer for the kill test at its defaults; prints a line as each handler starts and ends.

    ``start JOB TIME`` and ``end JOB TIME`` (wall clock). With ``blocking`` every handler
    blocks (the consumer to be killed with jobs in flight); without, it returns at once.
    """
    dsn = database_dsn(base_dsn(), database)
    logging.basicConfig(level=logging.CRITICAL)
    lock = threading.Lock()  # one line at a time: handler threads print at the same moment

    def mark(what: str, job: object) -> None:
        with lock:
            print(f"{what} {job} {time.time():.3f}", flush=True)  # noqa: T201 - the parent reads it

    if system == "ours":
        from patterns.jobqueue import TaskRegistry  # noqa: PLC0415
        from patterns.jobqueue.stores.postgres.store import PostgresStore  # noqa: PLC0415
        from patterns.jobqueue.worker.worker import Worker  # noqa: PLC0415

        tasks = TaskRegistry()

        @tasks.task(name="noop")
        def noop(payload: Any, ctx: Any) -> None:
            mark("start", payload["n"])
            if blocking:
                threading.Event().wait()  # blocks until the SIGKILL
            mark("end", payload["n"])

        store = PostgresStore(dsn)
        with Worker(store, tasks, concurrency=4):
            threading.Event().wait()  # runs until the parent ends the process
    elif system == PROCRASTINATE:
        import procrastinate  # noqa: PLC0415

        logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)
        app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

        @app.task(name="noop")
        async def pnoop(n: int) -> None:
            mark("start", n)
            if blocking:
                await asyncio.Event().wait()
            mark("end", n)

        async def run_procrastinate() -> None:
            async with app.open_async():
                await app.run_worker_async(concurrency=4, install_signal_handlers=False)

        asyncio.run(run_procrastinate())
    else:

        async def run_pgq() -> None:
            from pgqueuer.db import AsyncpgDriver  # noqa: PLC0415
            from pgqueuer.qm import QueueManager  # noqa: PLC0415
            from pgqueuer.queries import Queries  # noqa: PLC0415

            conn, _ = await pgq_queries(dsn, install=False)
            manager = QueueManager(Queries(AsyncpgDriver(conn)))

            @manager.entrypoint("noop")
            async def qnoop(job: Any) -> None:
                n = json.loads(job.payload)["n"]
                mark("start", n)
                if blocking:
                    await asyncio.Event().wait()
                mark("end", n)

            await pgq_run(manager, system, drain=False)

        asyncio.run(run_pgq())
    return 0


def kill_fill(system: str, dsn: str, count: int) -> None:
    """Enqueue ``count`` jobs numbered 0.. in ``system``'s schema on ``dsn``."""
    if system == "ours":
        from patterns.jobqueue.stores.postgres.store import PostgresStore  # noqa: PLC0415

        store = PostgresStore(dsn)
        store.enqueue_many([{"task": "noop", "payload": {"n": i}} for i in range(count)])
        store.close()
        return

    async def fill() -> None:
        if system == PROCRASTINATE:
            app, noop = procrastinate_app(dsn, lambda: None)
            async with app.open_async():
                await app.schema_manager.apply_schema_async()
                await noop.batch_defer_async(*[{"n": i} for i in range(count)])
        else:
            conn, queries = await pgq_queries(dsn, install=True)
            payloads = [json.dumps({"n": i}).encode() for i in range(count)]
            await queries.enqueue(["noop"] * count, payloads, [0] * count)
            await conn.close()

    asyncio.run(fill())


class Consumer:
    """A kill-test consumer in a child process, and the lines it printed, read as they come."""

    def __init__(self, system: str, database: str, *, blocking: bool) -> None:
        mode = "block" if blocking else "return"
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                f"benchmarks.{MODULE}",
                "--kill-consumer",
                system,
                database,
                mode,
            ],
            cwd=ROOT,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        # Guards marks; written by the reader thread, read by the parent.
        self._lock = threading.Lock()
        self._marks: dict[str, dict[int, float]] = {"start": {}, "end": {}}
        self._thread = threading.Thread(target=self._read, name="kill-test-reader", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            fields = line.split()
            if len(fields) == 3 and fields[0] in self._marks:  # other output is not ours
                with self._lock:
                    self._marks[fields[0]].setdefault(int(fields[1]), float(fields[2]))

    def marks(self, what: str) -> dict[int, float]:
        """Job number -> the wall-clock time its handler started (or ended), so far."""
        with self._lock:
            return dict(self._marks[what])

    def wait(self, what: str, want: int, until: float, *, quiet: float = 0.0) -> None:
        """Until ``want`` handlers did ``what``, none did for ``quiet`` s, or the time ``until``."""
        seen, since = -1, time.time()
        while time.time() < until:
            count = len(self.marks(what))
            if count >= want:
                return
            if count != seen:
                seen, since = count, time.time()
            elif quiet and count and time.time() - since >= quiet:
                return
            time.sleep(0.05)

    def end(self, sig: int) -> float:
        """Send ``sig``; wait for the exit and the last line; the wall-clock time it was sent."""
        sent = time.time()
        self._proc.send_signal(sig)
        self._proc.wait(10)
        self._thread.join(10)
        return sent


def kill_test(system: str, wait: float, *, mid_drain: bool) -> dict[str, Any]:
    """Kill a consumer, start another, watch it ``wait`` seconds: what ran again, and when.

    With jobs in flight: handlers that block until the kill. In the middle of a drain:
    no-op handlers, killed once ``DRAIN_KILL_AFTER`` have returned.
    """
    dsn = base_dsn()
    total = DRAIN_KILL_JOBS if mid_drain else KILL_JOBS
    with fresh_database(dsn) as database:
        kill_fill(system, database_dsn(dsn, database), total)
        first = Consumer(system, database, blocking=not mid_drain)
        try:
            if mid_drain:
                first.wait("end", DRAIN_KILL_AFTER, time.time() + 60.0)
            else:  # every job it will take has started once none started for a second
                first.wait("start", total, time.time() + 30.0, quiet=1.0)
        finally:
            killed_at = first.end(signal.SIGKILL)
        second = Consumer(system, database, blocking=False)
        try:
            second.wait("start", total + 1, killed_at + wait)  # the whole time
        finally:
            second.end(signal.SIGKILL)
        left = unfinished(system, database_dsn(dsn, database))
    started, ended = first.marks("start"), first.marks("end")
    again = second.marks("start")
    finished = set(ended)
    in_flight = set(started) - finished
    return {
        "finished": len(finished),
        "finished_again": sorted(again[j] - killed_at for j in finished & set(again)),
        "in_flight": len(in_flight),
        "in_flight_again": sorted(again[j] - killed_at for j in in_flight & set(again)),
        "never_started": total - len(started),
        "others_run": len(set(again) - set(started)),
        "not_run": total - len(finished | set(again)),
        "unfinished": left,
    }


UNFINISHED = {
    # system -> the jobs without a recorded outcome (pgqueuer deletes a job once it is done)
    "ours": "SELECT count(*) FROM jobqueue.jobs WHERE state <> 'done'",
    PROCRASTINATE: "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'",
    PGQ_DEFAULTS: "SELECT count(*) FROM pgqueuer",
    PGQ_FOUR: "SELECT count(*) FROM pgqueuer",
}


def unfinished(system: str, dsn: str) -> int:
    """How many of ``system``'s jobs on ``dsn`` have no outcome recorded."""
    import psycopg  # noqa: PLC0415

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(UNFINISHED[system]).fetchone()  # a fixed statement
    return int(row[0]) if row else 0


def when(after: list[float], wait: float) -> str:
    """How long after the kill the re-runs started: a range, or that none did."""
    return f"{min(after):.1f}-{max(after):.1f} s" if after else f"none within {wait:g} s"


def kill_report(systems: list[tuple[str, str]], wait: float) -> list[str]:
    """Run both kill tests on each system; their tables."""
    in_flight_rows, drain_rows = [], []
    for system, label in systems:
        held = kill_test(system, wait, mid_drain=False)
        in_flight_rows.append(
            [
                label,
                str(held["in_flight"]),
                f"{len(held['in_flight_again'])}",
                when(held["in_flight_again"], wait),
                f"{held['others_run']} of {held['never_started']}",
                str(held["unfinished"]),
            ]
        )
        drained = kill_test(system, wait, mid_drain=True)
        drain_rows.append(
            [
                label,
                f"{drained['finished']:,}",
                f"{len(drained['finished_again'])}",
                when(drained["finished_again"], wait),
                str(drained["in_flight"]),
                f"{len(drained['in_flight_again'])}",
                str(drained["not_run"]),
                str(drained["unfinished"]),
            ]
        )
    return [
        (
            f"a. jobs whose handlers block, a consumer SIGKILLed once it runs them ({KILL_JOBS} "
            f"jobs queued); a second consumer watched for {wait:g} s"
        ),
        *render(
            ["", "in flight", "run again", "after the kill", "the others run", "not done"],
            in_flight_rows,
        ),
        "",
        (
            f"b. {DRAIN_KILL_JOBS:,} no-op jobs, the consumer SIGKILLed once {DRAIN_KILL_AFTER} "
            f"handlers returned; a second consumer watched for {wait:g} s"
        ),
        *render(
            [
                "",
                "returned",
                "run again",
                "after the kill",
                "in flight",
                "run again",
                "never run",
                "not done",
            ],
            drain_rows,
        ),
    ]


# --- the parent ------------------------------------------------------------------------------


@dataclass
class System:
    """One row: its label, the child's system name and the ``--ours`` spec (or "")."""

    label: str
    name: str
    spec: str = ""


def systems(ours: list[str]) -> tuple[list[System], list[str]]:
    """The rows to measure, and the peers left out because they are not installed."""
    rows = [System(f"this project ({spec})", "ours", spec) for spec in ours]
    missing = []
    for name, (label, modules) in PEERS.items():
        if have(*modules):
            rows.append(System(label, name))
        else:
            missing.append(label)
    return rows, missing


def enqueue_owners(rows: list[System]) -> set[str]:
    """The rows whose enqueue is measured: the first of each system and store setting.

    Worker settings and pgqueuer's consumer settings do not change how a job is enqueued,
    so rows that differ only there share the first one's figure (their cell stays empty).
    """
    seen: set[str] = set()
    owners = set()
    for row in rows:
        family = "pgqueuer" if row.name in PGQ_SETTINGS else row.name
        key = family + (repr(sorted(parse_ours(row.spec)[0].items())) if row.spec else "")
        if key not in seen:
            seen.add(key)
            owners.add(row.label)
    return owners


def measure(
    rows: list[System], args: argparse.Namespace, log: Path | None
) -> dict[str, dict[str, Any]]:
    """Every measure of every row: drain and enqueue rates, wake-up latencies, statements."""
    dsn = base_dsn()
    results: dict[str, dict[str, Any]] = {
        row.label: {"drain": Row(row.label), "enqueue": Row(row.label), "wakeup": []}
        for row in rows
    }
    owners = enqueue_owners(rows)
    for round_ in range(args.rounds):
        shift = round_ % len(rows)
        for row in rows[shift:] + rows[:shift]:
            measured = results[row.label]
            with fresh_database(dsn) as db:
                out = run_child(MODULE, ["drain", row.name, row.spec, db, str(args.jobs)])
            measured["drain"].values.append(args.jobs / out["seconds"])
            if row.label in owners:
                with fresh_database(dsn) as db:
                    out = run_child(
                        MODULE, ["enqueue", row.name, row.spec, db, str(args.enqueue_jobs)]
                    )
                measured["enqueue"].values.append(args.enqueue_jobs / out["seconds"])
            with fresh_database(dsn) as db:
                out = run_child(MODULE, ["wakeup", row.name, row.spec, db, str(args.samples)])
            measured["wakeup"].extend(out["latencies"])
    if log is not None:
        for row in rows:
            with fresh_database(dsn, log_statements=True) as db:
                out = run_child(
                    MODULE, ["statements", row.name, row.spec, db, str(args.count_jobs), str(log)]
                )
            results[row.label]["statements"] = out
    return results


def table(results: dict[str, dict[str, Any]]) -> list[str]:
    """One row per system: drain, enqueue, wake-up p50 and p90, statements."""
    head = [
        "",
        "drain jobs/s",
        "[min-max]",
        "enqueue jobs/s",
        "wake-up p50",
        "p90",
        "stmts/enqueue",
        "stmts/job",
    ]
    rows = []
    for label, measured in results.items():
        drain: Row = measured["drain"]
        enqueue: Row = measured["enqueue"]
        wake: list[float] = measured["wakeup"]
        counted = measured.get("statements")
        spread = f"{fmt(min(drain.values))}-{fmt(max(drain.values))}" if drain.values else "-"
        rows.append(
            [
                label,
                fmt(drain.median),
                spread,
                fmt(enqueue.median),
                f"{percentile(wake, 50) * 1000:.1f} ms" if wake else "-",
                f"{percentile(wake, 90) * 1000:.1f} ms" if wake else "-",
                fmt(counted["enqueue"], 1) if counted else "-",
                fmt(counted["drain"], 1) if counted else "-",
            ]
        )
    return render(head, rows)


def server_log(args: argparse.Namespace) -> tuple[Path | None, str]:
    """The server log to count statements in, or None and why not."""
    if args.server_log:
        path = Path(args.server_log)
    elif os.environ.get("PG_TEST_CLUSTER_DIR"):
        path = Path(os.environ["PG_TEST_CLUSTER_DIR"]) / "server.log"
    else:
        return None, "statements not counted: no server log (--server-log, or the test cluster)"
    if not path.is_file():
        return None, f"statements not counted: no file {path}"
    return path, (
        f"statements counted in the server log with log_statement=all, over {args.count_jobs:,} "
        "jobs (the drain from the consumer's start to its stop)"
    )


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, measure, print the table (or the kill test's)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1:])
    if argv[:1] == ["--kill-consumer"]:
        return kill_consumer(argv[1], argv[2], argv[3] == "block")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--ours",
        action="append",
        metavar="SETTINGS",
        help='this project\'s settings, e.g. "threads=4,prefetch=4"; repeat for more rows '
        f"(default: {' and '.join(DEFAULT_OURS)})",
    )
    parser.add_argument("--jobs", type=int, default=5_000, help="jobs per drain (5000)")
    parser.add_argument("--enqueue-jobs", type=int, default=1_000, help="one per call (1000)")
    parser.add_argument("--samples", type=int, default=20, help="wake-ups per round (20)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    parser.add_argument("--count-jobs", type=int, default=1_000, help="for the statements")
    parser.add_argument("--server-log", help="the server's log (default: the test cluster's)")
    parser.add_argument("--no-statements", action="store_true", help="skip the count")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 200 jobs, 1 round, 3 samples"
    )
    parser.add_argument("--kill-test", action="store_true", help="only the SIGKILL test")
    parser.add_argument("--kill-wait", type=float, default=75.0, help="seconds to watch (75)")
    args = parser.parse_args(argv)
    if args.quick:
        args.jobs, args.enqueue_jobs, args.samples, args.rounds = 200, 50, 3, 1
        args.count_jobs = 50
    started = time.monotonic()
    load = load_average()
    dsn = base_dsn()
    rows, missing = systems(args.ours or list(DEFAULT_OURS))
    lines = [f"Python {sys.version.split()[0]}, {server_line(dsn)}, load average {load}"]
    if missing:
        lines.append(f"not installed, left out: {', '.join(missing)} (pip install -e '.[bench]')")
    if args.kill_test:
        # A SIGTERM (the test cluster passes one on) unwinds, so no consumer is left behind.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        emit(lines)
        unique: dict[str, str] = {}  # system -> label: each system once, at its defaults
        for row in rows:
            if row.name != PGQ_FOUR:
                unique.setdefault(row.name, "this project (defaults)" if row.spec else row.label)
        emit(["", *kill_report(list(unique.items()), args.kill_wait), "", end_line(started)])
        return 0
    log, counting = (None, "statements not counted (--no-statements)")
    if not args.no_statements:
        log, counting = server_log(args)
    lines.append(
        f"{args.jobs:,} no-op jobs per drain (first handler start to last commit), "
        f"{args.rounds} interleaved rounds, each in a fresh interpreter and database; "
        f"enqueue: {args.enqueue_jobs:,} one per call; wake-up: an idle consumer, "
        f"{args.samples * args.rounds} samples; {counting}"
    )
    emit(lines)
    results = measure(rows, args, log)
    emit(["", *table(results), *pg_targets(results), "", end_line(started)])
    return 0


def pg_targets(results: dict[str, dict[str, Any]]) -> list[str]:
    """The drain targets next to pgqueuer, for the rows measured (none if a row is missing)."""
    pairs = [
        ("threads=4", PGQ_DEFAULTS, 1.0, "at the defaults vs pgqueuer at its defaults"),
        ("threads=4,prefetch=0", PGQ_FOUR, 2.0, "at most 4 in flight vs pgqueuer's 4"),
    ]
    lines = []
    for spec, peer, goal, what in pairs:
        ours = results.get(f"this project ({spec})", {}).get("drain")
        other = results.get(PEERS[peer][0], {}).get("drain")
        if ours is None or other is None or not ours.values or not other.values:
            continue
        ratio = ours.median / other.median
        measured = f"{ratio:.2f}x ({fmt(ours.median)} vs {fmt(other.median)} jobs/s)"
        lines.append(target(f"drain, {what}, >= {goal:g}x", ratio >= goal, measured))
    return lines


if __name__ == "__main__":
    sys.exit(main())
