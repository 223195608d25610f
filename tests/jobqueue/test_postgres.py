"""PostgresStore beyond the contract: one clock, SKIP LOCKED, NOTIFY, reconnects, processes.

Every test but the first runs against the real server named by ``PATTERNS_PG_DSN``
(see conftest.py), each in a schema or database of its own. Nothing here waits for time
to pass except where the subject is a lease expiring on the database's clock; those
leases are short (2 s) and every wait for them is bounded.
"""

from __future__ import annotations

import json
import logging
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO
from unittest import mock

import pytest

from patterns.jobqueue.stores.postgres import store as postgres_module
from patterns.jobqueue.stores.postgres.store import (
    SCHEMA_VERSION,
    PostgresStore,
    StoreSchemaError,
    StoreUnavailable,
)
from patterns.jobqueue.stores.records import Claim, JobState
from patterns.jobqueue.tasks import JobContext, TaskRegistry
from patterns.jobqueue.worker.worker import Worker
from tests.jobqueue.conftest import admin_execute
from tests.support import (
    MUST_HAPPEN,
    NOISE,
    STAYS_BLOCKED,
    Gate,
    child_env,
    elapsed,
    join_or_fail,
    run_in_thread,
    spawn_python,
)

LEASE = 60.0
SHORT_LEASE = 2.0  # the worker processes' lease: how long a dead worker's jobs wait


@pytest.fixture
def store(pg_dsn: str, pg_schema: str) -> Iterator[PostgresStore]:
    """A store on a new schema, with the database's clock, closed afterwards."""
    made = PostgresStore(pg_dsn, schema=pg_schema)
    yield made
    made.close()


def named(dsn: str, application_name: str) -> str:
    """The DSN with an application_name, so a test can find (and kill) its connections."""
    from psycopg.conninfo import make_conninfo  # noqa: PLC0415 - optional dependency

    return make_conninfo(dsn, application_name=application_name)


def kill_connections(dsn: str, application_name: str) -> int:
    """Terminate every server session with this application_name; return how many.

    Each is gone when this returns (the 10 s wait of ``pg_terminate_backend``): a store
    finds its session closed before it sends its next statement, and reconnects.
    """
    rows = admin_execute(
        dsn,
        "SELECT count(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity"
        " WHERE application_name = %s AND pid <> pg_backend_pid()",
        (application_name,),
    )
    return int(rows[0][0])


def session_states(dsn: str, application_name: str) -> list[str]:
    """The state of each server session with this application_name (idle, active, ...)."""
    rows = admin_execute(
        dsn,
        "SELECT state FROM pg_stat_activity WHERE application_name = %s",
        (application_name,),
    )
    return sorted(str(row[0]) for row in rows)


class Calls:
    """A subscriber callback that counts its calls and lets a test wait for the next one."""

    def __init__(self) -> None:
        self.count = 0
        # Guards count; notified by each call, waited on by wait_for().
        self.cond = threading.Condition()

    def __call__(self) -> None:
        """Record one call."""
        with self.cond:
            self.count += 1
            self.cond.notify_all()

    def wait_for(self, count: int, timeout: float = MUST_HAPPEN) -> None:
        """Block until the callback has been called ``count`` times in all."""
        with self.cond:
            if not self.cond.wait_for(lambda: self.count >= count, timeout):
                raise AssertionError(f"{count} call(s) expected, got {self.count}")


# --- the optional dependency ----------------------------------------------------------------


def test_the_job_queue_imports_without_psycopg_and_the_store_names_the_extra_to_install() -> None:
    """Without psycopg, the package and the CLI import; making a store says what to install.

    ``from patterns.jobqueue import PostgresStore`` works too: the package exports it.
    """
    code = textwrap.dedent("""
        import sys
        sys.modules["psycopg"] = None  # as if it were not installed
        import patterns.jobqueue, patterns.jobqueue.cli.main
        from patterns.jobqueue import PostgresStore
        assert "PostgresStore" in patterns.jobqueue.__all__
        assert PostgresStore is sys.modules["patterns.jobqueue.stores.postgres.store"].PostgresStore
        try:
            PostgresStore("postgresql://nobody@127.0.0.1:1/none")
        except ImportError as exc:
            print("ImportError:", exc)
    """)
    child = spawn_python(code)
    try:
        out, err = child.communicate(timeout=MUST_HAPPEN)
    finally:
        child.kill()
        child.wait(MUST_HAPPEN)
    assert child.returncode == 0, err
    assert "ImportError: PostgresStore needs psycopg 3" in out
    assert "pip install 'shutdown-patterns[postgres]'" in out


# --- one clock: the database's --------------------------------------------------------------

SKEWED_MACHINE = """
import sys, time
skew, kind, where, schema, role = sys.argv[1:]
_real_time = time.time
time.time = lambda: _real_time() + float(skew)  # this "machine's" clock, before any import
from patterns.jobqueue.stores.postgres.store import PostgresStore
from patterns.jobqueue.stores.sqlite.store import SQLiteStore
store = SQLiteStore(where) if kind == "sqlite" else PostgresStore(where, schema=schema)
if role == "first":
    store.enqueue("t")
claims = store.claim(role, lease=60)
print("claimed", [c.job.id for c in claims], flush=True)
store.close()
"""


def run_skewed(skew: float, kind: str, where: str, schema: str, role: str) -> list[int]:
    """Run one claim in a child process whose clock is ``skew`` seconds off; its job ids."""
    proc = subprocess.run(
        [sys.executable, "-c", SKEWED_MACHINE, str(skew), kind, where, schema, role],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=MUST_HAPPEN * 2,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("claimed")]
    ids: list[int] = json.loads(line.removeprefix("claimed "))
    return ids


@pytest.mark.race("PG1", "leases judged by each machine's clock: a fast clock takes a live job")
def test_naive_client_clocks_let_a_fast_machine_take_over_a_live_lease(
    tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    """With each machine's own clock, one an hour ahead claims a job leased a moment ago."""
    path = str(tmp_path / "shared.db")  # SQLite on a shared disk stands in for any such store
    slow = run_skewed(-1800, "sqlite", path, "", "first")
    fast = run_skewed(+1800, "sqlite", path, "", "second")
    record_property(
        "observed",
        f"the 30 min slow machine claimed jobs {slow}, then the 30 min fast one claimed {fast}"
        " while the first lease (60 s) was live",
    )
    assert slow == [1]
    assert fast == [1]  # the same job, its 60 s lease not over: two machines now run it


@pytest.mark.race("PG1", "leases judged by each machine's clock: a fast clock takes a live job")
def test_the_database_clock_keeps_a_live_lease_whatever_the_client_clocks_say(
    store: PostgresStore, pg_dsn: str, pg_schema: str
) -> None:
    """Skewed machines agree: the lease and the due time are the database's, not theirs."""
    slow = run_skewed(-1800, "postgres", pg_dsn, pg_schema, "first")
    fast = run_skewed(+1800, "postgres", pg_dsn, pg_schema, "second")
    assert slow == [1]  # enqueued by a machine half an hour slow, and due at once
    assert fast == []  # the lease is live by the only clock that counts
    job = store.get(1)
    assert job is not None
    assert job.lease_until is not None
    assert abs(job.lease_until - (job.updated_at + 60)) < 1e-6
    assert abs(job.updated_at - store.clock()) < MUST_HAPPEN * 2  # not 30 minutes off


def test_the_store_clock_reads_the_database_and_falls_back_to_an_estimate(
    store: PostgresStore,
) -> None:
    """clock() is the server's time; after close it still answers, from the last offset."""
    before = store.clock()
    job = store.get(store.enqueue("t"))
    after = store.clock()
    assert job is not None
    assert before <= job.created_at <= after
    store.close()
    assert abs(store.clock() - after) < MUST_HAPPEN  # an estimate, and no exception


# --- the claim ------------------------------------------------------------------------------


def test_a_claim_skips_a_row_another_transaction_holds_instead_of_waiting(
    store: PostgresStore, pg_dsn: str, pg_schema: str
) -> None:
    """While another session holds the oldest job's row lock, a claim takes the next job."""
    import psycopg  # noqa: PLC0415 - optional dependency

    first, second = store.enqueue_many([{"task": "t"}, {"task": "t"}])
    with psycopg.connect(pg_dsn) as other:  # a transaction, open until the block ends
        other.execute(f'SELECT id FROM "{pg_schema}".jobs WHERE id = %s FOR UPDATE', (first,))
        thread, outcome = run_in_thread(lambda: store.claim("w", lease=LEASE), name="claimer")
        join_or_fail(thread)  # returns while the lock is still held: it did not wait
        assert "error" not in outcome, outcome
        assert [c.job.id for c in outcome["result"]] == [second]
        other.rollback()
    assert [c.job.id for c in store.claim("w", lease=LEASE)] == [first]


def test_separate_connections_in_threads_claim_each_job_exactly_once(
    pg_dsn: str, pg_schema: str
) -> None:
    """Four stores (four connections) claim 200 jobs together; no job is taken twice."""
    stores = [PostgresStore(pg_dsn, schema=pg_schema) for _ in range(4)]
    try:
        ids = stores[0].enqueue_many([{"task": "t", "payload": n} for n in range(200)])
        barrier = threading.Barrier(4, timeout=MUST_HAPPEN)

        def claimer(s: PostgresStore, owner: str) -> Callable[[], list[int]]:
            def run() -> list[int]:
                barrier.wait()
                taken = []
                while claims := s.claim(owner, lease=LEASE, limit=3):
                    for claim in claims:
                        taken.append(claim.job.id)
                        assert s.complete(claim)
                return taken

            return run

        threads = [
            run_in_thread(claimer(s, f"w{i}"), name=f"claimer-{i}") for i, s in enumerate(stores)
        ]
        claimed: list[int] = []
        for thread, outcome in threads:
            join_or_fail(thread, MUST_HAPPEN * 2)
            assert "error" not in outcome, outcome
            claimed += outcome["result"]
        assert sorted(claimed) == ids
    finally:
        for s in stores:
            s.close()


def test_no_transaction_is_left_open_while_a_handler_runs(pg_dsn: str, pg_schema: str) -> None:
    """While a handler runs, every session of the worker's store is idle, not in a transaction."""
    app = f"idle-check-{pg_schema}"
    made = PostgresStore(named(pg_dsn, app), schema=pg_schema)
    gate = Gate("handler")
    tasks = TaskRegistry()

    @tasks.task
    def parked(payload: object, ctx: JobContext) -> None:
        gate.arrive()

    listening = Calls()
    try:
        # The listener connects in its own thread: wait until it listens (its first call),
        # or a fast claim could find only the store's own session (seen once under load).
        made.subscribe(listening)
        listening.wait_for(1)
        # No prefetch: a free prefetch slot makes the claiming thread claim again at once, and
        # that claim's own short transaction may be open at the moment of the look (seen 1 in 30
        # runs, more once claims got cheaper); the look is for one left open across a handler.
        with Worker(
            made, tasks, concurrency=1, prefetch=0, poll_interval=0.05, lease=LEASE
        ) as worker:
            worker.enqueue("parked")
            gate.wait_reached()
            states = session_states(pg_dsn, app)
            gate.open()
        assert states == ["idle", "idle"]  # the store's connection and its listener
        assert made.counts()["done"] == 1
    finally:
        gate.open()
        made.close()


def test_the_stores_sessions_end_a_transaction_left_idle_after_ten_seconds(
    store: PostgresStore,
) -> None:
    """A stalled process cannot keep row locks: its idle transaction ends after 10 s."""
    conn = store._db._conn  # the setting is per session: only the store's own session can tell
    assert conn is not None
    row = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()
    conn.rollback()
    assert row == ("10s",)


# --- LISTEN/NOTIFY --------------------------------------------------------------------------


def test_an_enqueue_or_release_on_another_connection_calls_every_subscriber(
    store: PostgresStore, pg_dsn: str, pg_schema: str
) -> None:
    """Each committed enqueue or release anywhere calls the subscribers; unsubscribed, no more."""
    calls = Calls()
    unsubscribe = store.subscribe(calls)
    calls.wait_for(1)  # the listener is listening (a first call: "look now")
    other = PostgresStore(pg_dsn, schema=pg_schema)
    try:
        other.enqueue("t")
        calls.wait_for(2)
        other.enqueue_many([{"task": "t"}, {"task": "t"}])  # one transaction, one call
        calls.wait_for(3)
        (claim,) = other.claim("w", lease=LEASE)
        assert other.release(claim)
        calls.wait_for(4)
        unsubscribe()
        other.enqueue("t")
        assert store.wait_for_notify(MUST_HAPPEN)  # the listener got it...
        assert calls.count == 4  # ...and called nobody
    finally:
        other.close()


def test_a_listener_that_cannot_start_leaves_the_store_usable_and_closable(
    store: PostgresStore, pg_schema: str
) -> None:
    """A subscribe whose listener thread fails to start raises, keeps nobody, and retries later."""
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        if thread.name.startswith("jobqueue-listener-"):
            raise RuntimeError("can't start new thread")
        real_start(thread)

    refused = Calls()
    with (
        mock.patch.object(threading.Thread, "start", start),
        pytest.raises(RuntimeError, match="new thread"),
    ):
        store.subscribe(refused)
    calls = Calls()
    store.subscribe(calls)
    calls.wait_for(1)  # a listener runs now: it calls every subscriber once it listens
    assert refused.count == 0  # the subscription that raised was not kept
    store.close()  # joins the listener; a thread that never started must not make it raise
    listeners = [t for t in threading.enumerate() if t.name == f"jobqueue-listener-{pg_schema}"]
    assert listeners == []


def test_close_waits_for_a_busy_listener_only_within_its_budget(
    pg_dsn: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """close(timeout) returns on its budget while a subscriber holds the listener, and says so."""
    made = PostgresStore(pg_dsn, schema=pg_schema, stop_timeout=MUST_HAPPEN)
    gate = Gate("subscriber holding the listener")
    made.subscribe(gate.arrive)  # called from the listener thread once it listens
    gate.wait_reached()
    (listener,) = [t for t in threading.enumerate() if t.name == f"jobqueue-listener-{pg_schema}"]
    with caplog.at_level(logging.WARNING, logger="patterns.jobqueue.stores.postgres"):
        with elapsed() as took:
            made.close(STAYS_BLOCKED)
        assert took() < STAYS_BLOCKED + NOISE
    assert listener.is_alive()
    assert any("did not end within" in r.getMessage() for r in caplog.records)
    gate.open()
    join_or_fail(listener)
    assert made._listener._wakeup_r.fileno() == -1  # the listener closed what close() left to it
    assert made._listener._wakeup_w.fileno() == -1


def test_a_negative_close_budget_is_refused(pg_dsn: str, store: PostgresStore) -> None:
    """A negative stop_timeout or close(timeout) is a ValueError naming it; the store stays open."""
    with pytest.raises(ValueError, match="stop_timeout"):
        PostgresStore(pg_dsn, stop_timeout=-1)
    with pytest.raises(ValueError, match="timeout"):
        store.close(-1)
    assert store.counts()["queued"] == 0


def test_wait_for_notify_sees_an_enqueue_made_before_the_call(
    store: PostgresStore, pg_dsn: str, pg_schema: str
) -> None:
    """A notification between two calls is kept for the next call; with none, it times out."""
    assert store.wait_for_notify(MUST_HAPPEN)  # listening now
    other = PostgresStore(pg_dsn, schema=pg_schema)
    try:
        other.enqueue("t")  # before the call below
        assert store.wait_for_notify(MUST_HAPPEN)
        assert not store.wait_for_notify(STAYS_BLOCKED)
    finally:
        other.close()


def test_an_idle_worker_runs_a_job_enqueued_elsewhere_long_before_its_poll_interval(
    store: PostgresStore, pg_dsn: str, pg_schema: str
) -> None:
    """With an hour-long poll interval, a job enqueued on another connection runs at once."""
    started = threading.Event()
    tasks = TaskRegistry()

    @tasks.task
    def note(payload: object, ctx: JobContext) -> None:
        started.set()

    other = PostgresStore(pg_dsn, schema=pg_schema)
    try:
        with Worker(store, tasks, poll_interval=3600, lease=LEASE) as worker:
            other.enqueue("note")  # another "machine": this worker is not told directly
            assert started.wait(MUST_HAPPEN)  # not after an hour: the NOTIFY woke it
            report = worker.stop()
        assert report.terminated
    finally:
        other.close()


# --- connection loss ------------------------------------------------------------------------


def test_the_store_reconnects_after_the_server_kills_its_connection(
    pg_dsn: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """pg_terminate_backend on the store's session: the next call reconnects and succeeds."""
    app = f"killed-{pg_schema}"
    made = PostgresStore(named(pg_dsn, app), schema=pg_schema)
    try:
        first = made.enqueue("t")
        assert kill_connections(pg_dsn, app) == 1
        with caplog.at_level(logging.WARNING, logger="patterns.jobqueue.stores.postgres"):
            second = made.enqueue("t")
        assert second > first
        assert made.counts()["queued"] == 2
        assert any("reconnected" in r.getMessage() for r in caplog.records)
    finally:
        made.close()


def test_the_listener_reconnects_and_wakes_subscribers_after_its_connection_is_killed(
    pg_dsn: str, pg_schema: str
) -> None:
    """After its session is killed the listener listens again, says so, and still delivers."""
    app = f"listener-{pg_schema}"
    made = PostgresStore(named(pg_dsn, app), schema=pg_schema)
    other = PostgresStore(pg_dsn, schema=pg_schema)
    try:
        calls = Calls()
        made.subscribe(calls)
        calls.wait_for(1)
        assert kill_connections(pg_dsn, app) == 2  # the store's and the listener's
        calls.wait_for(2)  # listening again: "look now", a notification may have been missed
        other.enqueue("t")
        calls.wait_for(3)
    finally:
        other.close()
        made.close()


def test_a_worker_loses_nothing_when_every_connection_is_killed_mid_job(
    pg_dsn: str, pg_schema: str
) -> None:
    """Killing all the worker's sessions while jobs run: it reconnects and every job ends done."""
    app = f"worker-{pg_schema}"
    made = PostgresStore(named(pg_dsn, app), schema=pg_schema)
    both_running = threading.Barrier(3, timeout=MUST_HAPPEN)  # two handlers and the test
    go = threading.Event()
    done = Calls()  # on_complete: called once the store accepted each job's completion
    tasks = TaskRegistry(on_complete=lambda job, result: done())

    @tasks.task
    def held(payload: object, ctx: JobContext) -> None:
        if payload == "first-two":
            both_running.wait()
            if not go.wait(MUST_HAPPEN):
                raise TimeoutError("the test never let the job go")

    try:
        listening = Calls()
        made.subscribe(listening)
        listening.wait_for(1)  # the listener's session exists: it is killed too
        made.enqueue_many([{"task": "held", "payload": "first-two"}] * 2 + [{"task": "held"}] * 2)
        with Worker(made, tasks, concurrency=2, poll_interval=0.05, lease=LEASE) as worker:
            both_running.wait()  # two jobs mid-run, two queued
            assert kill_connections(pg_dsn, app) == 2  # the store's and the listener's
            go.set()
            done.wait_for(4)
            report = worker.stop()
        assert made.counts() == {"queued": 0, "running": 0, "done": 4, "failed": 0, "cancelled": 0}
        assert report.terminated
        assert not report.thread_failures
        stats = worker.stats()
        assert (stats.done, stats.released, stats.lost, stats.unsettled) == (4, 0, 0, 0)
    finally:
        go.set()
        made.close()


def test_while_the_server_refuses_connections_a_call_raises_store_unavailable_and_changes_nothing(
    pg_dsn: str,
    pg_database: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """During an outage a call retries, then raises; afterwards the store works again."""
    monkeypatch.setattr(postgres_module, "_BACKOFF", 0.01)
    database = pg_database.rsplit("/", 1)[1]
    app = f"outage-{database}"
    made = PostgresStore(named(pg_database, app))
    try:
        made.enqueue("before")
        admin_execute(pg_dsn, f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        assert kill_connections(pg_dsn, app) == 1
        with (
            caplog.at_level(logging.WARNING, logger="patterns.jobqueue.stores.postgres"),
            pytest.raises(StoreUnavailable, match="database unavailable after 5 attempts"),
        ):
            made.enqueue("during")
        retries = [r for r in caplog.records if "retry" in r.getMessage()]
        assert len(retries) == postgres_module.RETRIES - 1
        admin_execute(pg_dsn, f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        assert made.enqueue("after") == 2  # nothing was written during the outage
        assert made.counts()["queued"] == 2
    finally:
        made.close()


def test_an_unreachable_server_is_store_unavailable_and_the_password_is_never_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server nobody listens for fails the constructor quickly, naming host and port only."""
    monkeypatch.setattr(postgres_module, "_BACKOFF", 0.01)
    with pytest.raises(StoreUnavailable) as caught:
        PostgresStore("postgresql://ada:s3cret-pw@127.0.0.1:1/jobs")
    message = str(caught.value)
    assert "ada@127.0.0.1:1/jobs" in message
    assert "s3cret-pw" not in message


# --- the schema -----------------------------------------------------------------------------


def test_a_new_schema_is_created_at_the_current_version(
    store: PostgresStore, pg_dsn: str, pg_schema: str
) -> None:
    """The first store creates the schema, its jobs table and its version row."""
    assert store.schema == pg_schema
    rows = admin_execute(pg_dsn, f'SELECT version FROM "{pg_schema}".schema_version')
    assert rows == [(SCHEMA_VERSION,)]
    tables = admin_execute(
        pg_dsn, "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", (pg_schema,)
    )
    assert tables == [("jobs",), ("schema_version",), ("workers",)]


# The version 1 schema as it was shipped, so a test can build what an old release wrote.
V1_SCHEMA = [
    'CREATE SCHEMA "{schema}"',
    """
    CREATE TABLE "{schema}".schema_version (
        only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
        version  integer NOT NULL
    )
    """,
    'INSERT INTO "{schema}".schema_version (version) VALUES (1)',
    """
    CREATE TABLE "{schema}".jobs (
        id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        task         text        NOT NULL CHECK (task <> ''),
        payload      json        NOT NULL,
        state        text        NOT NULL
                     CHECK (state IN ('queued', 'running', 'done', 'failed')),
        run_at       timestamptz NOT NULL,
        attempts     integer     NOT NULL CHECK (attempts >= 0),
        max_attempts integer     NOT NULL CHECK (max_attempts >= 1),
        lease_owner  text,
        lease_until  timestamptz,
        last_error   text,
        created_at   timestamptz NOT NULL,
        updated_at   timestamptz NOT NULL,
        CHECK ((state = 'running') = (lease_owner IS NOT NULL AND lease_until IS NOT NULL))
    )
    """,
    """CREATE INDEX ON "{schema}".jobs (run_at, id) WHERE state = 'queued'""",
    """CREATE INDEX ON "{schema}".jobs (lease_until) WHERE state = 'running'""",
]


def test_a_version_1_schema_is_migrated_keeping_every_job_and_the_id_sequence(
    pg_dsn: str, pg_schema: str
) -> None:
    """Opening a v1 schema adds the v2 columns and workers table; rows and ids stay."""
    for statement in V1_SCHEMA:
        admin_execute(pg_dsn, statement.format(schema=pg_schema))
    insert = (
        f'INSERT INTO "{pg_schema}".jobs (task, payload, state, run_at, attempts, max_attempts,'
        " lease_owner, lease_until, last_error, created_at, updated_at)"
        " VALUES (%s, %s, %s, now(), %s, 3, %s, %s, %s, now(), now())"
    )
    admin_execute(pg_dsn, insert, ("a", '{"n": 1}', "queued", 0, None, None, None))
    admin_execute(pg_dsn, insert, ("b", "[1]", "running", 1, "w:tok", "2100-01-01", None))
    admin_execute(pg_dsn, insert, ("c", "null", "failed", 3, None, None, "boom"))
    admin_execute(pg_dsn, f'DELETE FROM "{pg_schema}".jobs WHERE task = %s', ("c",))
    store = PostgresStore(pg_dsn, schema=pg_schema)
    try:
        first, second = store.get(1), store.get(2)
        assert first is not None
        assert second is not None
        assert (first.task, first.payload, first.state) == ("a", {"n": 1}, JobState.QUEUED)
        assert (second.lease_owner, second.attempts) == ("w:tok", 1)
        assert (second.timeout, second.result, second.cancel_requested) == (None, None, False)
        assert store.get(3) is None
        assert store.enqueue("d") == 4  # the identity sequence went on, no id reused
        assert store.cancel(1).value == "cancelled"  # the new state is allowed
        assert store.cancel(2).value == "requested"
    finally:
        store.close()
    assert admin_execute(pg_dsn, f'SELECT version FROM "{pg_schema}".schema_version') == [(2,)]


def test_a_newer_schema_version_is_refused_and_left_untouched(
    store: PostgresStore, pg_dsn: str, pg_schema: str
) -> None:
    """A schema written by a newer version raises StoreSchemaError naming both versions."""
    admin_execute(pg_dsn, f'UPDATE "{pg_schema}".schema_version SET version = %s', (99,))
    with pytest.raises(StoreSchemaError, match=f"version 99 is newer.*version {SCHEMA_VERSION}"):
        PostgresStore(pg_dsn, schema=pg_schema)
    assert admin_execute(pg_dsn, f'SELECT version FROM "{pg_schema}".schema_version') == [(99,)]


def test_a_schema_holding_other_tables_is_refused_and_left_untouched(
    pg_dsn: str, pg_schema: str
) -> None:
    """An existing schema with tables but no version is not adopted: nothing is added to it."""
    admin_execute(pg_dsn, f'CREATE SCHEMA "{pg_schema}"')
    admin_execute(pg_dsn, f'CREATE TABLE "{pg_schema}".users (name text)')
    with pytest.raises(StoreSchemaError, match=r"has tables \['users'\] but no job store"):
        PostgresStore(pg_dsn, schema=pg_schema)
    tables = admin_execute(
        pg_dsn, "SELECT tablename FROM pg_tables WHERE schemaname = %s", (pg_schema,)
    )
    assert tables == [("users",)]


def test_a_foreign_jobs_table_at_our_version_is_refused(pg_dsn: str, pg_schema: str) -> None:
    """A schema claiming our version whose jobs table has other columns is refused."""
    admin_execute(pg_dsn, f'CREATE SCHEMA "{pg_schema}"')
    admin_execute(pg_dsn, f'CREATE TABLE "{pg_schema}".schema_version (version integer)')
    admin_execute(pg_dsn, f'INSERT INTO "{pg_schema}".schema_version VALUES (%s)', (1,))
    admin_execute(pg_dsn, f'CREATE TABLE "{pg_schema}".jobs (id bigint, name text)')
    with pytest.raises(StoreSchemaError, match="was not written by this job store"):
        PostgresStore(pg_dsn, schema=pg_schema)
    # Refused before any migration step: the foreign table is as it was.
    columns = admin_execute(
        pg_dsn,
        "SELECT column_name FROM information_schema.columns"
        " WHERE table_schema = %s AND table_name = 'jobs' ORDER BY ordinal_position",
        (pg_schema,),
    )
    assert columns == [("id",), ("name",)]


def test_concurrent_first_opens_create_the_schema_exactly_once(pg_dsn: str, pg_schema: str) -> None:
    """Four stores opening a new schema at the same moment all succeed on one schema."""
    barrier = threading.Barrier(4, timeout=MUST_HAPPEN)

    def open_and_enqueue() -> int:
        barrier.wait()
        made = PostgresStore(pg_dsn, schema=pg_schema)
        try:
            return made.enqueue("t")
        finally:
            made.close()

    threads = [run_in_thread(open_and_enqueue, name=f"opener-{i}") for i in range(4)]
    for thread, outcome in threads:
        join_or_fail(thread)
        assert "error" not in outcome, outcome
    assert admin_execute(pg_dsn, f'SELECT count(*) FROM "{pg_schema}".jobs') == [(4,)]


@pytest.mark.parametrize("schema", ["Jobs", 'x"; DROP SCHEMA public; --', "", "9lives"])
def test_a_schema_name_that_is_not_a_plain_identifier_is_refused(pg_dsn: str, schema: str) -> None:
    """Only lower-case identifiers are accepted as schema names, before anything connects."""
    with pytest.raises(ValueError, match="schema must be a lower-case identifier"):
        PostgresStore(pg_dsn, schema=schema)


def test_hostile_task_names_and_payloads_are_stored_as_data(store: PostgresStore) -> None:
    """SQL in a task name or payload is stored verbatim (parameters, never string building)."""
    task = "x'); DROP TABLE jobs; --"
    payload = {"'; DELETE FROM jobs; --": "\x00\u2028\U0001f600", "$1": "%(clock)s"}
    job_id = store.enqueue(task, payload)
    job = store.get(job_id)
    assert job is not None
    assert (job.task, job.payload) == (task, payload)
    assert store.counts()["queued"] == 1


def test_a_payload_is_kept_as_utf8_and_a_row_escaped_as_before_reads_back_equal(
    store: PostgresStore, pg_dsn: str, pg_schema: str
) -> None:
    """The json column holds the UTF-8 text as given; a row written with escapes reads the same."""
    payload = {"text": "\u0436\u0436 \U0001f600", "nul": "a\x00b", "lone": "\ud800"}
    job_id = store.enqueue("t", payload)
    select = (
        f'SELECT payload::text, octet_length(payload::text) FROM "{pg_schema}".jobs WHERE id = %s'
    )
    [(text, size)] = admin_execute(pg_dsn, select, (job_id,))
    assert text == '{"text":"\u0436\u0436 \U0001f600","nul":"a\\u0000b","lone":"\\ud800"}'
    assert size == len(text.encode("utf-8")) == 53
    escaped = json.dumps(payload, separators=(",", ":"))  # ASCII only, as written before
    update = f'UPDATE "{pg_schema}".jobs SET payload = %s::json WHERE id = %s'
    admin_execute(pg_dsn, update, (escaped, job_id))
    found = store.get(job_id)
    assert found is not None
    assert found.payload == payload


# --- worker processes on one database, through the real command line -----------------------

HOLD_TASKS = r'''
import sys
import threading
from patterns.jobqueue.tasks import TaskRegistry

stdin_lock = threading.Lock()  # one reader at a time: a line goes to exactly one handler

def say(line):
    sys.stdout.write(line + "\n")  # one write per line: two handler threads never mix lines
    sys.stdout.flush()

# "done" is printed once the store accepted the completion, "finished" before it asked.
tasks = TaskRegistry(on_complete=lambda job, result: say(f"done {job.id}"))

@tasks.task(max_attempts=5)
def hold(payload, ctx):
    """Runs until the test writes a line to this worker's stdin; ignores its token."""
    say(f"started {ctx.job_id} attempt {ctx.attempt} at {ctx.job.updated_at!r}")
    with stdin_lock:
        sys.stdin.readline()
    say(f"finished {ctx.job_id}")

@tasks.task
def echo(payload, ctx):
    say(f"ran {ctx.job_id} {payload}")
'''


class Workers:
    """CLI worker processes whose stdout and stderr lines the test reads as they come.

    Every line of every process goes into one queue, tagged ``<name>.out`` or
    ``<name>.err``, and into `seen`; `until` reads lines until a condition on `seen`
    holds, so the test acts on what the processes said, never on elapsed time.
    """

    def __init__(self, cwd: Path, url: str) -> None:
        self.cwd = cwd
        self.url = url
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.lines: queue.Queue[tuple[str, str | None]] = queue.Queue()
        self.seen: dict[str, list[str]] = defaultdict(list)
        self.readers: list[threading.Thread] = []

    def start(self, name: str, *extra: str) -> None:
        """Start ``worker --tasks pgjobs:tasks`` with a short lease, as ``name``."""
        args = ["--db", self.url, "worker", "--tasks", "pgjobs:tasks", "--concurrency", "2"]
        args += ["--lease", str(SHORT_LEASE), "--poll-interval", "0.2", *extra]
        proc = subprocess.Popen(
            [sys.executable, "-m", "patterns.jobqueue", *args],
            cwd=self.cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        self.procs[name] = proc
        assert proc.stdout is not None
        assert proc.stderr is not None
        for stream, tag in ((proc.stdout, f"{name}.out"), (proc.stderr, f"{name}.err")):
            reader = threading.Thread(target=self._pump, args=(stream, tag), name=tag)
            reader.start()
            self.readers.append(reader)

    def _pump(self, stream: IO[str], tag: str) -> None:
        for line in stream:
            self.lines.put((tag, line.rstrip("\n")))
        self.lines.put((tag, None))

    def until(
        self, done: Callable[[dict[str, list[str]]], bool], timeout: float = MUST_HAPPEN
    ) -> None:
        """Read lines until ``done(seen)`` is true; fail with everything seen on timeout."""
        deadline = time.monotonic() + timeout
        while not done(self.seen):
            try:
                tag, line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"timed out; saw {dict(self.seen)}") from None
            if line is not None:
                self.seen[tag].append(line)

    def send(self, name: str, text: str) -> None:
        """Write ``text`` to one worker's stdin."""
        stdin = self.procs[name].stdin
        assert stdin is not None
        stdin.write(text)
        stdin.flush()

    def close(self) -> None:
        """Kill whatever still runs, and join the readers."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(MUST_HAPPEN)
        for reader in self.readers:
            join_or_fail(reader)
        for proc in self.procs.values():
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()


def lines_with(seen: dict[str, list[str]], tag: str, prefix: str) -> list[str]:
    """The lines of one stream that start with ``prefix``."""
    return [line for line in seen[tag] if line.startswith(prefix)]


def started_jobs(seen: dict[str, list[str]], name: str) -> list[int]:
    """Ids of the jobs a worker process started, in order."""
    return [int(line.split()[1]) for line in lines_with(seen, f"{name}.out", "started")]


@pytest.fixture
def workers(tmp_path: Path, pg_database: str) -> Iterator[Workers]:
    """Worker processes on a new database; every one killed and reaped afterwards."""
    (tmp_path / "pgjobs.py").write_text(textwrap.dedent(HOLD_TASKS))
    made = Workers(tmp_path, pg_database)
    yield made
    made.close()


def test_three_worker_processes_one_sigkilled_mid_job_the_survivors_finish_every_job(
    workers: Workers, pg_database: str
) -> None:
    """A SIGKILLed worker's jobs run again on the survivors once its leases expire; all done."""
    store = PostgresStore(pg_database)
    try:
        ids = store.enqueue_many([{"task": "hold", "payload": n} for n in range(9)])
        names = ["a", "b", "c"]
        for name in names:
            workers.start(name, "--prefetch", "0")  # claims for its two threads only
        # Each process claims two jobs and blocks in both: six running, three queued.
        workers.until(lambda seen: all(len(started_jobs(seen, n)) == 2 for n in names))
        victim = set(started_jobs(workers.seen, "a"))
        workers.procs["a"].send_signal(signal.SIGKILL)
        assert workers.procs["a"].wait(MUST_HAPPEN) == -signal.SIGKILL
        held = {job_id: store.get(job_id) for job_id in victim}  # leases no longer renewed
        expiry = max(job.lease_until or 0.0 for job in held.values() if job is not None)
        assert all(j is not None and j.state is JobState.RUNNING for j in held.values())
        for name in ("b", "c"):
            workers.send(name, "go\n" * 20)  # every job they start from now on ends at once

        def done(seen: dict[str, list[str]]) -> set[int]:
            return {
                int(line.split()[1])
                for n in ("b", "c")
                for line in lines_with(seen, f"{n}.out", "done")
            }

        workers.until(lambda seen: done(seen) == set(ids), timeout=MUST_HAPPEN * 3)
        for name in ("b", "c"):
            workers.procs[name].send_signal(signal.SIGTERM)
        for name in ("b", "c"):
            assert workers.procs[name].wait(MUST_HAPPEN) == 0, workers.seen[f"{name}.err"]
        assert store.counts() == {"queued": 0, "running": 0, "done": 9, "failed": 0, "cancelled": 0}
        # The dead worker's jobs were started again by a survivor, after its leases expired.
        restarts = [
            line
            for n in ("b", "c")
            for line in lines_with(workers.seen, f"{n}.out", "started")
            if int(line.split()[1]) in victim
        ]
        assert len(restarts) == 2, restarts
        for line in restarts:
            _, _, _, attempt, _, claimed_at = line.split()
            assert int(attempt) >= 2
            assert float(claimed_at) >= expiry  # by the database's clock
        log = "\n".join(workers.seen["b.err"] + workers.seen["c.err"])
        assert "expired, claiming it again" in log
        # The dead worker's late outcome, had it sent one, is refused: fencing.
        for job_id, job in held.items():
            assert job is not None
            stale = Claim(job, job.lease_owner or "", job.lease_until or 0.0)
            final = store.get(job_id)
            assert store.complete(stale) is False
            assert store.release(stale) is False
            assert store.get(job_id) == final
    finally:
        store.close()


def test_a_paused_worker_whose_leases_were_taken_over_cannot_record_its_late_outcome(
    workers: Workers, pg_database: str
) -> None:
    """SIGSTOP past the lease: another worker finishes the jobs; resumed, its outcomes are lost."""
    store = PostgresStore(pg_database)
    try:
        ids = store.enqueue_many([{"task": "hold"}, {"task": "hold"}])
        workers.start("paused")
        workers.until(lambda seen: len(started_jobs(seen, "paused")) == 2)
        workers.procs["paused"].send_signal(signal.SIGSTOP)  # a long GC pause, a frozen VM
        try:
            workers.start("other")
            workers.send("other", "go\n" * 2)
            workers.until(
                lambda seen: len(lines_with(seen, "other.out", "done")) == 2,
                timeout=MUST_HAPPEN * 3,
            )
            after_takeover = [store.get(i) for i in ids]
            assert [j.state if j else None for j in after_takeover] == [JobState.DONE] * 2
        finally:
            workers.procs["paused"].send_signal(signal.SIGCONT)
        workers.send("paused", "go\n" * 2)  # its handlers return; it tries to complete
        workers.until(lambda seen: sum("(fencing)" in line for line in seen["paused.err"]) == 2)
        assert [store.get(i) for i in ids] == after_takeover  # the late outcomes changed nothing
        for name in ("paused", "other"):
            workers.procs[name].send_signal(signal.SIGTERM)
            assert workers.procs[name].wait(MUST_HAPPEN) == 0, workers.seen[f"{name}.err"]
    finally:
        store.close()


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the CLI to completion (with a timeout) and return its result."""
    return subprocess.run(
        [sys.executable, "-m", "patterns.jobqueue", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=MUST_HAPPEN * 3,
        check=False,
    )


def test_the_cli_enqueues_reports_and_runs_jobs_on_a_postgresql_url(
    workers: Workers, pg_database: str
) -> None:
    """enqueue, status and worker take a postgresql:// URL as --db, as they take a file."""
    cwd = workers.cwd
    first = run_cli(["--db", pg_database, "enqueue", "echo", '{"n": 1}'], cwd)
    assert (first.returncode, first.stdout) == (0, "1\n"), first.stderr
    status = run_cli(["--db", pg_database, "status", "--json"], cwd)
    assert json.loads(status.stdout) == {
        "queued": 1,
        "running": 0,
        "done": 0,
        "failed": 0,
        "cancelled": 0,
    }
    ran = run_cli(
        ["--db", pg_database, "worker", "--tasks", "pgjobs:tasks", "--exit-when-empty"], cwd
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "ran 1 {'n': 1}\ndone 1\n"
    status = run_cli(["--db", pg_database, "status", "--json"], cwd)
    assert json.loads(status.stdout) == {
        "queued": 0,
        "running": 0,
        "done": 1,
        "failed": 0,
        "cancelled": 0,
    }


def test_the_cli_refuses_an_unreachable_server_with_status_2_in_one_line(
    tmp_path: Path,
) -> None:
    """An unreachable --db URL: one error line after the retries, status 2, no password.

    A one-shot command does not print the retries' warnings (the worker does:
    ``tests/jobqueue/test_cli_output.py``).
    """
    result = run_cli(["--db", "postgresql://ada:s3cret-pw@127.0.0.1:1/jobs", "status"], tmp_path)
    assert result.returncode == 2
    [error] = result.stderr.splitlines()
    assert error.startswith("python -m patterns.jobqueue: error: ")
    assert f"database unavailable after {postgres_module.RETRIES} attempts" in error
    assert "s3cret-pw" not in result.stderr


def test_renew_reads_no_payload(store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A renew updates the lease and reads the cancel flag: no payload is sent or parsed."""
    store.enqueue("t", {"blob": "x" * 100_000})
    (claim,) = store.claim("w", lease=60)

    def no_parsing(*args: object, **kwargs: object) -> object:
        raise AssertionError("renew parsed JSON")

    monkeypatch.setattr(json, "loads", no_parsing)
    renewed = store.renew(claim, lease=60)
    monkeypatch.undo()
    assert renewed is not None
    assert renewed.job.payload is claim.job.payload
    assert renewed.lease_until >= claim.lease_until
    assert renewed.cancel_requested is False


def test_create_false_refuses_a_missing_schema_and_creates_nothing(
    pg_dsn: str, pg_schema: str
) -> None:
    """A reader's open (create=False) of a schema without a job store is "no such queue"."""
    with pytest.raises(StoreSchemaError, match="no such queue"):
        PostgresStore(pg_dsn, schema=pg_schema, create=False)
    found = admin_execute(
        pg_dsn, "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (pg_schema,)
    )
    assert found == [(0,)]
    PostgresStore(pg_dsn, schema=pg_schema).close()
    PostgresStore(pg_dsn, schema=pg_schema, create=False).close()
