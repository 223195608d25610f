"""Job queue throughput next to the peers: drain with 4 threads, and enqueue (tables 1-2).

Run it with ``python -m benchmarks.jobqueue_throughput`` (``--help`` for the knobs).
Needs the peers of the ``bench`` extra (huey, persist-queue); a peer that is not
installed is left out of the tables, with a line saying so.

Drain (table 1): ``--jobs`` no-op jobs (``BENCH_JOBS``, 20,000) are enqueued, then
drained with 4 worker threads; the rate is jobs over the seconds from starting the
workers to the last job settled. Every drain runs in a fresh interpreter on a fresh
queue file under a temporary directory on local disk, WAL mode, at
``synchronous=NORMAL`` and then ``FULL``, the systems in a rotating order so that drift
in the machine's speed hits all of them alike. The queue is filled in the same child
before the clock starts (at ``synchronous=OFF`` where the library lets us, since only
the drain is timed), and the drain is checked afterwards (every job done or acked):

* ``SQLiteStore + Worker``: this project, ``Worker(store, tasks, concurrency=4)`` with
  its defaults; a job counts once ``on_complete`` ran, after ``complete`` committed.
  Also at a quarter of the backlog: a rate that does not drop with the backlog shows
  the claim is not quadratic. Its defaults prefetch sixteen (four per handler thread,
  as Celery's default multiplier), at the price described in ``Worker``'s docstring;
  the ``prefetch=4`` row holds one claim waiting per thread (the default of
  2026-12-06), the ``prefetch=0`` row claims only for free handler threads (the default
  before).
* ``huey SqliteHuey``: huey's consumer in-process, ``workers=4, worker_type="thread"``,
  its other options at their defaults; a job counts at its ``complete`` signal. huey
  deletes the task row when it dequeues it (at-most-once). huey has no NORMAL option
  (``fsync=True`` is FULL, ``False`` is OFF), so a storage subclass sets the pragma.
* ``persist-queue SQLiteAckQueue``: ``multithreading=True``, 4 threads doing
  ``get(block=False)`` and ``ack`` until the queue is empty. Acked rows stay in the
  table (the library's default), so each ``get`` scans past them.
* ``raw sqlite3 ceiling``: one thread, one ``BEGIN IMMEDIATE`` transaction to claim the
  oldest queued row (``UPDATE ... WHERE id = (SELECT ... LIMIT 1) RETURNING``, on an
  index over ``(state, id)``) and one to mark it done: two transactions per job, no
  Python around them; what one-job-per-transaction can do at best.
* ``raw sqlite3 batched ceiling``: the same, but each claim transaction takes the 4
  oldest queued rows and one transaction marks those 4 done: what batched claims and
  group commit can reach at best.

PostgreSQL rows, when ``PATTERNS_PG_DSN`` names a server (``make bench`` runs inside a
throwaway cluster that sets it; without one a line says the rows were left out), each
drain in a fresh interpreter and a schema of its own, dropped afterwards. PostgreSQL has
no ``synchronous`` setting of SQLite's kind: the heading gives the server's ``fsync``
and ``synchronous_commit`` (the throwaway cluster runs with both off). Ratios there are
to the raw ceiling:

* ``PostgresStore + Worker``: ``Worker(store, tasks, concurrency=4)``, its defaults, a
  job counting at ``on_complete``, as on SQLite; also at a quarter of the backlog, whose
  rate shows whether the claim's cost grows with the backlog.
* ``raw SKIP LOCKED ceiling``: one connection in autocommit, one prepared statement
  claiming the oldest queued row (``UPDATE ... WHERE id = ANY(ARRAY(SELECT ... ORDER BY id
  LIMIT 1 FOR UPDATE SKIP LOCKED)) RETURNING``, on a partial index over the queued rows'
  ids) and one marking it done: one job per transaction, nothing but the driver around it.
* ``raw SKIP LOCKED batched ceiling``: the same with ``LIMIT 4``, the 4 claimed rows
  marked done by one statement (``id = ANY(...)``): 4 jobs per transaction.

Enqueue (table 2), in this process, a fresh file per measurement: ``--enqueue-jobs``
jobs (2,000) one per call for each system, and ``--jobs`` in one batch for this
project's ``enqueue_many`` and for a raw ``executemany`` in one transaction.

Ratios are medians divided by huey's median at the same ``synchronous`` setting. The
performance targets are printed under each table with met or not met, and the last line
gives the wall time and the load average at the end (the first gives it at the start).
This is a measurement to read, not a test: nothing here asserts on a time.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._tables import (
    Row,
    child_result,
    emit,
    end_line,
    env_int,
    fmt,
    join_threads,
    machine_line,
    pg_schema,
    run_child,
    runs_setting,
    scratch_dir,
    stats_table,
    target,
)

MODULE = "jobqueue_throughput"
SYNCS = ("NORMAL", "FULL")
DRAIN_TIMEOUT = 240.0  # seconds one drain may take before the child gives up
PROJECT = "SQLiteStore + Worker"
PROJECT_SMALL = "SQLiteStore + Worker, 1/4 backlog"
PROJECT_PREFETCH = "SQLiteStore + Worker(prefetch=0)"
PROJECT_ONE_AHEAD = "SQLiteStore + Worker(prefetch=4)"
HUEY = "huey SqliteHuey"
PQ = "persist-queue SQLiteAckQueue"
RAW = "raw sqlite3 ceiling, 1 thread"
RAW_BATCH = 4  # jobs per claim and per settle transaction in the raw batched ceiling
RAW_BATCHED = f"raw sqlite3 batched ceiling, {RAW_BATCH} per txn"
POSTGRES = "PostgreSQL"  # the key of the PostgreSQL rows (no synchronous setting there)
PG_PROJECT = "PostgresStore + Worker"
PG_PROJECT_SMALL = "PostgresStore + Worker, 1/4 backlog"
PG_RAW = "raw SKIP LOCKED ceiling, 1 thread"
PG_RAW_BATCHED = f"raw SKIP LOCKED batched ceiling, {RAW_BATCH} per txn"
DSN_VARIABLE = "PATTERNS_PG_DSN"
PG_FILL_BATCH = 5_000  # jobs per enqueue_many while filling the PostgreSQL queue


def have(module: str) -> bool:
    """Whether ``module`` can be imported (a peer of the ``bench`` extra)."""
    return importlib.util.find_spec(module) is not None


# --- the systems, each draining one prefilled file (run inside a child) ----------------


class Counter:
    """Counts settled jobs from any thread; ``done`` is set at the target count."""

    def __init__(self, goal: int) -> None:
        self.goal = goal
        self.count = 0
        # Guards count; taken by whichever worker thread settles a job.
        self._lock = threading.Lock()
        # Set once, by the thread that settles the last job; waited on by the timer.
        self.done = threading.Event()

    def add(self, *_: object, **__: object) -> None:
        """Count one settled job (any arguments, so it fits every hook)."""
        with self._lock:
            self.count += 1
            if self.count >= self.goal:
                self.done.set()


def drain_project(path: Path, sync: str, jobs: int, prefetch: int | None = None) -> float:
    """Seconds for ``Worker(concurrency=4, prefetch=prefetch)`` to drain ``jobs`` jobs."""
    from patterns.jobqueue import SQLiteStore  # noqa: PLC0415

    store = SQLiteStore(path)
    store.enqueue_many([{"task": "noop"}] * jobs)
    store.close()
    return timed_drain(SQLiteStore(path, synchronous=sync), jobs, "project", prefetch)


def timed_drain(store: Any, jobs: int, what: str, prefetch: int | None = None) -> float:
    """Seconds for ``Worker(store, concurrency=4)`` to run ``jobs`` no-ops; closes ``store``.

    ``prefetch`` None: the Worker's default (four per handler thread).

    A job counts once ``on_complete`` ran (after its commit); afterwards every job must be
    done, or this raises naming ``what``.
    """
    from patterns.jobqueue import TaskRegistry, Worker  # noqa: PLC0415

    counter = Counter(jobs)
    tasks = TaskRegistry(on_complete=counter.add)
    tasks.task(name="noop")(lambda payload, ctx: None)
    # Pass only a prefetch given: jobqueue_ab runs this on code older than prefetch=None.
    options = {} if prefetch is None else {"prefetch": prefetch}
    worker = Worker(store, tasks, concurrency=4, **options)
    start = time.perf_counter()
    worker.start()
    finished = counter.done.wait(DRAIN_TIMEOUT)
    seconds = time.perf_counter() - start
    report = worker.stop(10.0)
    done = store.counts()["done"]
    store.close()
    if not finished or not report.terminated or done != jobs:
        raise RuntimeError(f"{what} drain: {counter.count} counted, {done} done of {jobs}")
    return seconds


def huey_storage(level: str) -> type:
    """Return huey's ``SqliteStorage`` with ``PRAGMA synchronous=level`` on its connection."""
    from huey.storage import SqliteStorage  # noqa: PLC0415

    class Storage(SqliteStorage):  # type: ignore[misc]
        def _create_connection(self) -> sqlite3.Connection:
            conn: sqlite3.Connection = super()._create_connection()
            conn.execute(f"PRAGMA synchronous={level}")
            return conn

    return Storage


def drain_huey(path: Path, sync: str, jobs: int) -> float:
    """Seconds for huey's consumer (4 threads) to drain ``jobs`` prefilled tasks."""
    from huey import SqliteHuey  # noqa: PLC0415
    from huey.signals import SIGNAL_COMPLETE  # noqa: PLC0415

    filler = SqliteHuey("bench", filename=str(path), storage_class=huey_storage("OFF"))
    enqueue = filler.task(name="noop")(lambda: None)
    for _ in range(jobs):
        enqueue()
    filler.storage.close()
    huey = SqliteHuey("bench", filename=str(path), storage_class=huey_storage(sync))
    huey.task(name="noop")(lambda: None)
    counter = Counter(jobs)
    huey.signal(SIGNAL_COMPLETE)(counter.add)
    consumer = huey.create_consumer(workers=4, worker_type="thread")
    start = time.perf_counter()
    consumer.start()
    finished = counter.done.wait(DRAIN_TIMEOUT)
    seconds = time.perf_counter() - start
    consumer.stop(graceful=True)
    left = huey.pending_count()
    huey.storage.close()
    if not finished or left:
        raise RuntimeError(f"huey drain: {counter.count} counted, {left} left of {jobs}")
    return seconds


def pq_class(level: str) -> type:
    """persist-queue's ``SQLiteAckQueue`` with ``PRAGMA synchronous=level`` on both connections."""
    from persistqueue import SQLiteAckQueue  # noqa: PLC0415

    class Queue(SQLiteAckQueue):  # type: ignore[misc]
        def _new_db_connection(self, *args: Any, **kwargs: Any) -> sqlite3.Connection:
            conn: sqlite3.Connection = super()._new_db_connection(*args, **kwargs)
            conn.execute(f"PRAGMA synchronous={level}")
            return conn

    return Queue


def drain_pq(path: Path, sync: str, jobs: int) -> float:
    """Seconds for 4 threads doing get/ack to drain ``jobs`` prefilled items."""
    from persistqueue.exceptions import Empty  # noqa: PLC0415

    filler = pq_class("OFF")(str(path), multithreading=True)
    for i in range(jobs):
        filler.put(i)
    filler.close()
    queue = pq_class(sync)(str(path), multithreading=True)

    def work() -> None:
        while True:
            try:
                item = queue.get(block=False)
            except Empty:
                return
            queue.ack(item)

    threads = [threading.Thread(target=work, name=f"pq-{i}") for i in range(4)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    join_threads(threads, DRAIN_TIMEOUT)
    seconds = time.perf_counter() - start
    acked = queue.acked_count()
    queue.close()
    if acked != jobs:
        raise RuntimeError(f"persist-queue drain: {acked} acked of {jobs}")
    return seconds


RAW_SCHEMA = (
    "CREATE TABLE jobs (id INTEGER PRIMARY KEY, state INTEGER NOT NULL, payload TEXT)",
    "CREATE INDEX jobs_state ON jobs (state, id)",
)


def raw_connect(path: Path, sync: str) -> sqlite3.Connection:
    """An autocommit connection in WAL mode at ``synchronous=sync``, with the raw schema."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={sync}")
    if not conn.execute("SELECT name FROM sqlite_master WHERE name = 'jobs'").fetchone():
        for statement in RAW_SCHEMA:
            conn.execute(statement)
    return conn


def drain_raw(path: Path, sync: str, jobs: int) -> float:
    """Seconds for one thread to claim and complete ``jobs`` rows, one transaction each."""
    conn = raw_connect(path, "OFF")
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO jobs (state, payload) VALUES (0, 'null')", [()] * jobs)
    conn.execute("COMMIT")
    conn.close()
    conn = raw_connect(path, sync)
    execute = conn.execute
    claim = (
        "UPDATE jobs SET state = 1 WHERE id ="
        " (SELECT id FROM jobs WHERE state = 0 ORDER BY id LIMIT 1) RETURNING id, payload"
    )
    start = time.perf_counter()
    while True:
        execute("BEGIN IMMEDIATE")
        row = execute(claim).fetchone()
        execute("COMMIT")
        if row is None:
            break
        execute("BEGIN IMMEDIATE")
        execute("UPDATE jobs SET state = 2 WHERE id = ?", (row[0],))
        execute("COMMIT")
    seconds = time.perf_counter() - start
    done = execute("SELECT COUNT(*) FROM jobs WHERE state = 2").fetchone()[0]
    conn.close()
    if done != jobs:
        raise RuntimeError(f"raw drain: {done} done of {jobs}")
    return seconds


def drain_raw_batched(path: Path, sync: str, jobs: int) -> float:
    """Seconds for one thread to drain ``jobs`` rows, ``RAW_BATCH`` per claim and per settle.

    One transaction claims the ``RAW_BATCH`` oldest queued rows, one marks them done: what
    batched claims and group commit can reach at best, with no Python around them.
    """
    conn = raw_connect(path, "OFF")
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO jobs (state, payload) VALUES (0, 'null')", [()] * jobs)
    conn.execute("COMMIT")
    conn.close()
    conn = raw_connect(path, sync)
    execute = conn.execute
    claim = (
        "UPDATE jobs SET state = 1 WHERE id IN"
        f" (SELECT id FROM jobs WHERE state = 0 ORDER BY id LIMIT {RAW_BATCH})"
        " RETURNING id, payload"
    )
    done_sql = "UPDATE jobs SET state = 2 WHERE id = ?"
    start = time.perf_counter()
    while True:
        execute("BEGIN IMMEDIATE")
        rows = execute(claim).fetchall()
        execute("COMMIT")
        if not rows:
            break
        execute("BEGIN IMMEDIATE")
        conn.executemany(done_sql, [(row[0],) for row in rows])
        execute("COMMIT")
    seconds = time.perf_counter() - start
    done = execute("SELECT COUNT(*) FROM jobs WHERE state = 2").fetchone()[0]
    conn.close()
    if done != jobs:
        raise RuntimeError(f"raw batched drain: {done} done of {jobs}")
    return seconds


# --- PostgreSQL: the server named by PATTERNS_PG_DSN, a schema of its own per drain ------


def pg_dsn() -> str:
    """The DSN of the PostgreSQL server to drain on (``PATTERNS_PG_DSN``)."""
    dsn = os.environ.get(DSN_VARIABLE, "").strip()
    if not dsn:
        raise RuntimeError(f"{DSN_VARIABLE} is not set")
    return dsn


def drain_pg_project(path: Path, sync: str, jobs: int) -> float:
    """Seconds for ``PostgresStore + Worker(concurrency=4)`` to drain ``jobs`` jobs."""
    from patterns.jobqueue.stores.postgres.store import PostgresStore  # noqa: PLC0415

    dsn = pg_dsn()
    with pg_schema(dsn) as schema:
        store = PostgresStore(dsn, schema=schema)
        for first in range(0, jobs, PG_FILL_BATCH):
            store.enqueue_many([{"task": "noop"}] * min(PG_FILL_BATCH, jobs - first))
        store.close()
        return timed_drain(PostgresStore(dsn, schema=schema), jobs, "PostgreSQL")


def drain_pg_raw(path: Path, sync: str, jobs: int, batch: int = 1) -> float:
    """Seconds for one connection to claim (``SKIP LOCKED``) and complete ``jobs`` rows.

    Autocommit, so each statement is its own transaction: one claims the ``batch`` oldest
    queued rows ``FOR UPDATE SKIP LOCKED``, one marks them done. Both are prepared on the
    server.
    """
    import psycopg  # noqa: PLC0415 - optional, as in the store

    dsn = pg_dsn()
    with pg_schema(dsn) as schema, psycopg.connect(dsn, autocommit=True) as conn:
        table = f'"{schema}".jobs'  # a generated name
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(
            f"CREATE TABLE {table} (id bigserial PRIMARY KEY, state int NOT NULL, payload text)"
        )
        # A partial index holds only the queued rows, so the claim never walks past done ones
        # (with an index over every row, the planner prefers the primary key and does).
        conn.execute(f"CREATE INDEX ON {table} (id) WHERE state = 0")
        with conn.transaction(), conn.cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO {table} (state, payload) VALUES (0, 'null')", [()] * jobs
            )
        conn.execute(f"VACUUM ANALYZE {table}")
        claim = (
            f"UPDATE {table} SET state = 1 WHERE id = ANY(ARRAY(SELECT id FROM {table}"
            f" WHERE state = 0 ORDER BY id LIMIT {int(batch)} FOR UPDATE SKIP LOCKED))"
            " RETURNING id, payload"
        )
        complete = f"UPDATE {table} SET state = 2 WHERE id = ANY(%s)"
        execute = conn.execute
        start = time.perf_counter()
        while True:
            rows = execute(claim, prepare=True).fetchall()
            if not rows:
                break
            execute(complete, ([row[0] for row in rows],), prepare=True)
        seconds = time.perf_counter() - start
        counted = execute(f"SELECT count(*) FROM {table} WHERE state = 2").fetchone()
        done = counted[0] if counted else 0
    if done != jobs:
        raise RuntimeError(f"raw PostgreSQL drain: {done} done of {jobs}")
    return seconds


DRAINS: dict[str, Callable[[Path, str, int], float]] = {
    "project": drain_project,
    "project-prefetch": lambda path, sync, jobs: drain_project(path, sync, jobs, prefetch=0),
    "project-one-ahead": lambda path, sync, jobs: drain_project(path, sync, jobs, prefetch=4),
    "huey": drain_huey,
    "pq": drain_pq,
    "raw": drain_raw,
    "raw-batched": drain_raw_batched,
    "pg": drain_pg_project,
    "pg-raw": drain_pg_raw,
    "pg-raw-batched": lambda path, sync, jobs: drain_pg_raw(path, sync, jobs, RAW_BATCH),
}


def child(argv: list[str]) -> int:
    """``--child drain SYSTEM SYNC DIR JOBS``: one drain; prints its seconds as JSON."""
    _, system, sync, directory, jobs = argv
    path = Path(directory) / f"{system}-{sync}.db"
    if system == "pq":
        path = Path(directory) / f"{system}-{sync}"  # persist-queue wants a directory
    gc.collect()
    seconds = DRAINS[system](path, sync, int(jobs))
    child_result({"seconds": seconds})
    return 0


# --- enqueue (in this process) ----------------------------------------------------------


def enqueue_project(path: Path, sync: str, jobs: int) -> float:
    """Seconds for ``jobs`` calls of ``SQLiteStore.enqueue``."""
    from patterns.jobqueue import SQLiteStore  # noqa: PLC0415

    store = SQLiteStore(path, synchronous=sync)
    enqueue = store.enqueue
    start = time.perf_counter()
    for i in range(jobs):
        enqueue("noop", i)
    seconds = time.perf_counter() - start
    store.close()
    return seconds


def enqueue_project_many(path: Path, sync: str, jobs: int) -> float:
    """Seconds for one ``SQLiteStore.enqueue_many`` of ``jobs`` jobs (building the list too)."""
    from patterns.jobqueue import SQLiteStore  # noqa: PLC0415

    store = SQLiteStore(path, synchronous=sync)
    start = time.perf_counter()
    store.enqueue_many([{"task": "noop", "payload": i} for i in range(jobs)])
    seconds = time.perf_counter() - start
    store.close()
    return seconds


def enqueue_huey(path: Path, sync: str, jobs: int) -> float:
    """Seconds for ``jobs`` calls of a huey task (each enqueues one task)."""
    from huey import SqliteHuey  # noqa: PLC0415

    huey = SqliteHuey("bench", filename=str(path), storage_class=huey_storage(sync))
    enqueue = huey.task(name="noop")(lambda i: None)
    start = time.perf_counter()
    for i in range(jobs):
        enqueue(i)
    seconds = time.perf_counter() - start
    huey.storage.close()
    return seconds


def enqueue_pq(path: Path, sync: str, jobs: int) -> float:
    """Seconds for ``jobs`` calls of ``SQLiteAckQueue.put``."""
    queue = pq_class(sync)(str(path), multithreading=True)
    put = queue.put
    start = time.perf_counter()
    for i in range(jobs):
        put(i)
    seconds = time.perf_counter() - start
    queue.close()
    return seconds


def enqueue_raw(path: Path, sync: str, jobs: int) -> float:
    """Seconds for ``jobs`` single-row INSERTs, one transaction each."""
    conn = raw_connect(path, sync)
    execute = conn.execute
    start = time.perf_counter()
    for i in range(jobs):
        execute("BEGIN IMMEDIATE")
        execute("INSERT INTO jobs (state, payload) VALUES (0, ?)", (str(i),))
        execute("COMMIT")
    seconds = time.perf_counter() - start
    conn.close()
    return seconds


def enqueue_raw_many(path: Path, sync: str, jobs: int) -> float:
    """Seconds for one transaction inserting ``jobs`` rows with ``executemany``."""
    conn = raw_connect(path, sync)
    start = time.perf_counter()
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        "INSERT INTO jobs (state, payload) VALUES (0, ?)", ((str(i),) for i in range(jobs))
    )
    conn.execute("COMMIT")
    seconds = time.perf_counter() - start
    conn.close()
    return seconds


# label -> (function, batch?, peer module or None)
ENQUEUES: dict[str, tuple[Callable[[Path, str, int], float], bool, str | None]] = {
    "SQLiteStore.enqueue, 1 per call": (enqueue_project, False, None),
    "huey task call, 1 per call": (enqueue_huey, False, "huey"),
    "persist-queue put, 1 per call": (enqueue_pq, False, "persistqueue"),
    "raw sqlite3 INSERT, 1 txn each": (enqueue_raw, False, None),
    "SQLiteStore.enqueue_many, 1 batch": (enqueue_project_many, True, None),
    "raw sqlite3 executemany, 1 txn": (enqueue_raw_many, True, None),
}
HUEY_ENQUEUE = "huey task call, 1 per call"


# --- the parent ----------------------------------------------------------------------------


def systems() -> list[tuple[str, str, str]]:
    """(label, child system name, peer module or "") for every SQLite drain row we can run."""
    rows = [
        (PROJECT, "project", ""),
        (PROJECT_ONE_AHEAD, "project-one-ahead", ""),
        (PROJECT_PREFETCH, "project-prefetch", ""),
        (HUEY, "huey", "huey"),
        (PQ, "pq", "persistqueue"),
        (RAW, "raw", ""),
        (RAW_BATCHED, "raw-batched", ""),
    ]
    return [row for row in rows if not row[2] or have(row[2])]


PG_SYSTEMS = [(PG_PROJECT, "pg"), (PG_RAW, "pg-raw"), (PG_RAW_BATCHED, "pg-raw-batched")]


def postgres_server() -> tuple[str | None, str]:
    """(DSN, the server's description) when PostgreSQL rows can run, else (None, why not)."""
    dsn = os.environ.get(DSN_VARIABLE, "").strip()
    if not dsn:
        return None, (
            f"PostgreSQL rows left out: {DSN_VARIABLE} is not set "
            "(make bench runs inside a throwaway cluster that sets it)"
        )
    if not have("psycopg"):
        return None, (
            "PostgreSQL rows left out: psycopg not installed (pip install -e '.[postgres]')"
        )
    import psycopg  # noqa: PLC0415 - optional, as in the store

    settings = []
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            for name in ("server_version", "fsync", "synchronous_commit"):
                row = conn.execute(f"SHOW {name}").fetchone()  # a fixed name
                settings.append(str(row[0]).split()[0] if row else "?")
    except psycopg.Error as exc:
        if isinstance(exc, psycopg.ProgrammingError):
            # libpq's parse errors may quote any part of the string, the password included.
            reason = "not a valid connection string or postgresql:// URL"
        else:  # a connection failure's first line names the host and the failure
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return None, f"PostgreSQL rows left out: cannot use the server in {DSN_VARIABLE}: {reason}"
    version, fsync, commit = settings
    return dsn, f"PostgreSQL {version}, fsync={fsync}, synchronous_commit={commit}"


def measure_drain(runs: int, jobs: int, postgres: bool) -> dict[str, dict[str, Row]]:
    """Drain rates per setting (each sync level, and PostgreSQL) and row label.

    The systems rotate between runs, so that a drift in the machine's speed hits all alike.
    """
    todo = systems()
    results: dict[str, dict[str, Row]] = {
        sync: {label: Row(label) for label, _, _ in todo} for sync in SYNCS
    }
    small = max(1, jobs // 4)
    for sync in SYNCS:
        results[sync][PROJECT_SMALL] = Row(PROJECT_SMALL)
    if postgres:
        results[POSTGRES] = {label: Row(label) for label, _ in PG_SYSTEMS}
        results[POSTGRES][PG_PROJECT_SMALL] = Row(PG_PROJECT_SMALL)
    with scratch_dir("bench-drain-") as tmp:
        for run in range(runs):
            directory = tmp / f"run{run}"
            directory.mkdir(exist_ok=True)
            order = todo[run % len(todo) :] + todo[: run % len(todo)]
            for sync in SYNCS:
                for label, system, _ in order:
                    seconds = run_child(MODULE, ["drain", system, sync, str(directory), str(jobs)])
                    results[sync][label].values.append(jobs / seconds["seconds"])
                small_dir = tmp / f"run{run}-small"
                small_dir.mkdir(exist_ok=True)
                seconds = run_child(MODULE, ["drain", "project", sync, str(small_dir), str(small)])
                results[sync][PROJECT_SMALL].values.append(small / seconds["seconds"])
            if postgres:
                shift = run % len(PG_SYSTEMS)
                pg_order = PG_SYSTEMS[shift:] + PG_SYSTEMS[:shift]
                for label, system in pg_order:
                    seconds = run_child(MODULE, ["drain", system, "-", str(directory), str(jobs)])
                    results[POSTGRES][label].values.append(jobs / seconds["seconds"])
                seconds = run_child(MODULE, ["drain", "pg", "-", str(directory), str(small)])
                results[POSTGRES][PG_PROJECT_SMALL].values.append(small / seconds["seconds"])
    return results


def measure_enqueue(runs: int, single: int, batch: int) -> dict[str, dict[str, Row]]:
    """Enqueue rates per sync level and row label, alternating the order between runs."""
    todo = [(label, spec) for label, spec in ENQUEUES.items() if not spec[2] or have(spec[2])]
    results = {sync: {label: Row(label) for label, _ in todo} for sync in SYNCS}
    with scratch_dir("bench-enqueue-") as tmp:
        for run in range(runs):
            order = todo if run % 2 == 0 else todo[::-1]
            for sync in SYNCS:
                for index, (label, (fn, is_batch, _)) in enumerate(order):
                    count = batch if is_batch else single
                    path = tmp / f"r{run}-{sync}-{index}"
                    if fn is not enqueue_pq:
                        path = path.with_suffix(".db")
                    gc.collect()
                    seconds = fn(path, sync, count)
                    results[sync][label].values.append(count / seconds)
    return results


def ratio_target(text: str, ours: Row, other: Row | None, goal: float, name: str) -> str:
    """A target line for ``ours`` median / ``other`` median >= ``goal``."""
    if other is None or not other.values or not ours.values:
        return target(text, None, f"{name} not measured")
    ratio = ours.median / other.median
    return target(
        text, ratio >= goal, f"{ratio:.2f}x ({fmt(ours.median)} vs {fmt(other.median)} jobs/s)"
    )


def drain_report(results: dict[str, dict[str, Row]], jobs: int, postgres: str) -> list[str]:
    """Table 1 (SQLite at each setting, then PostgreSQL or why it was left out) and its targets."""
    lines = [
        (
            f"1. Drain throughput, jobs/s: {jobs:,} no-op jobs, 4 worker threads (raw rows: "
            f"1 thread, a claim and a settle transaction per job, or per {RAW_BATCH} jobs "
            "in the batched row); ratio = row / huey at the same setting"
        )
    ]
    for sync in SYNCS:
        rows = list(results[sync].values())
        lines += ["", f"synchronous={sync}", *stats_table(rows, "jobs/s", reference=HUEY)]
    lines.append("")
    if POSTGRES in results:
        lines += [
            f"{postgres}; ratio = row / the raw SKIP LOCKED ceiling",
            *stats_table(list(results[POSTGRES].values()), "jobs/s", reference=PG_RAW),
        ]
    else:
        lines.append(postgres)
    lines.append("")
    for sync in SYNCS:
        lines.append(
            ratio_target(
                f"drain, 4 handler threads, vs huey, {sync} >= 3x",
                results[sync][PROJECT],
                results[sync].get(HUEY),
                3.0,
                "huey",
            )
        )
    lines.append(
        ratio_target(
            "drain vs the raw one-job-per-transaction ceiling, NORMAL >= 1x",
            results["NORMAL"][PROJECT],
            results["NORMAL"][RAW],
            1.0,
            "the raw ceiling",
        )
    )
    return lines


def enqueue_report(results: dict[str, dict[str, Row]], single: int, batch: int) -> list[str]:
    """Table 2 and its targets."""
    lines = [
        (
            f"2. Enqueue throughput, jobs/s: {single:,} jobs one per call, or {batch:,} in one "
            "batch; ratio = row / huey's one-per-call at the same setting"
        )
    ]
    for sync in SYNCS:
        rows = list(results[sync].values())
        lines += ["", f"synchronous={sync}", *stats_table(rows, "jobs/s", reference=HUEY_ENQUEUE)]
    for sync in SYNCS:
        lines.append(
            ratio_target(
                f"enqueue, 1 per call, vs huey's, {sync} >= 1x",
                results[sync]["SQLiteStore.enqueue, 1 per call"],
                results[sync].get(HUEY_ENQUEUE),
                1.0,
                "huey",
            )
        )
    one = results["NORMAL"]["SQLiteStore.enqueue, 1 per call"].median
    many = results["NORMAL"]["SQLiteStore.enqueue_many, 1 batch"].median
    lines.append(target("enqueue >= 10,000 jobs/s one per call (NORMAL)", one >= 10_000, fmt(one)))
    lines.append(target("enqueue_many >= 100,000 jobs/s (NORMAL)", many >= 100_000, fmt(many)))
    return lines


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run both measurements and print the tables."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--runs", type=int, default=runs_setting(3), help="runs per row (BENCH_RUNS, 3)"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=env_int("BENCH_JOBS", 20_000),
        help="jobs per drain and per batch (BENCH_JOBS, 20000)",
    )
    parser.add_argument(
        "--enqueue-jobs",
        type=int,
        default=env_int("BENCH_ENQUEUE_JOBS", 2_000),
        help="jobs enqueued one per call per measurement (BENCH_ENQUEUE_JOBS, 2000)",
    )
    parser.add_argument("--skip-drain", action="store_true", help="only the enqueue table")
    args = parser.parse_args(argv)
    started = time.monotonic()
    missing = [name for name in ("huey", "persistqueue") if not have(name)]
    lines = [machine_line(), f"{args.runs} runs per row; median [min, max] over the runs"]
    if missing:
        lines.append(f"not installed, left out: {', '.join(missing)} (pip install -e '.[bench]')")
    emit(lines)
    if not args.skip_drain:
        dsn, postgres = postgres_server()
        drains = measure_drain(args.runs, args.jobs, dsn is not None)
        emit(["", *drain_report(drains, args.jobs, postgres)])
    enqueue = measure_enqueue(args.runs, args.enqueue_jobs, args.jobs)
    emit(["", *enqueue_report(enqueue, args.enqueue_jobs, args.jobs)])
    emit(["", end_line(started)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
