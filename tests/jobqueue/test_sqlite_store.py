"""SQLiteStore beyond the contract: the file, its schema, and locking across processes."""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from patterns.jobqueue.stores.records import JobState
from patterns.jobqueue.stores.sqlite import schema as sqlite_schema
from patterns.jobqueue.stores.sqlite import store as sqlite_store
from patterns.jobqueue.stores.sqlite import transactions as sqlite_transactions
from patterns.jobqueue.stores.sqlite.store import SCHEMA_VERSION, SQLiteStore, StoreFileError
from tests.support import MUST_HAPPEN, join_or_fail, run_in_thread, spawn_python, stays_blocked

LEASE = 60.0


@pytest.fixture
def store(db: Path) -> Iterator[SQLiteStore]:
    """A store on ``db`` with the real clock, closed afterwards."""
    made = SQLiteStore(db)
    yield made
    made.close()


def raw(path: Path) -> sqlite3.Connection:
    """A plain sqlite3 connection to the file, for looking behind the store's back."""
    return sqlite3.connect(path, isolation_level=None, timeout=MUST_HAPPEN)


def pragma(path: Path, name: str) -> object:
    """Read one PRAGMA from the file through a fresh connection."""
    conn = raw(path)
    try:
        return conn.execute(f"PRAGMA {name}").fetchone()[0]
    finally:
        conn.close()


# --- the file ------------------------------------------------------------------------------


def test_the_file_is_created_on_first_use_in_wal_mode_with_the_schema_version(db: Path) -> None:
    """Opening a missing path creates one database file, in WAL mode, at SCHEMA_VERSION."""
    assert not db.exists()
    SQLiteStore(db).close()
    assert db.is_file()
    assert pragma(db, "journal_mode") == "wal"
    assert pragma(db, "user_version") == SCHEMA_VERSION


@pytest.mark.parametrize(("setting", "level"), [("NORMAL", 1), ("FULL", 2), ("full", 2)])
def test_synchronous_is_applied_to_the_store_connection(db: Path, setting: str, level: int) -> None:
    """The synchronous setting (NORMAL by default, FULL on request) is the connection's."""
    made = SQLiteStore(db, synchronous=setting)
    try:
        # synchronous is per connection, so only the store's own connection can tell.
        assert made._conn.execute("PRAGMA synchronous").fetchone()[0] == level
    finally:
        made.close()


@pytest.mark.parametrize("setting", ["OFF", "fast", ""])
def test_an_unknown_synchronous_setting_is_refused_before_the_file_is_created(
    db: Path, setting: str
) -> None:
    """A synchronous value other than NORMAL, FULL or EXTRA is a ValueError; no file appears."""
    with pytest.raises(ValueError, match="synchronous"):
        SQLiteStore(db, synchronous=setting)
    assert not db.exists()


def test_reopening_the_file_keeps_every_job_and_lease(db: Path) -> None:
    """Jobs, states and live leases survive closing and reopening the store."""
    first = SQLiteStore(db)
    ids = first.enqueue_many([{"task": "a", "payload": {"n": 1}}, {"task": "b"}, {"task": "c"}])
    done, running = first.claim("w", lease=LEASE, limit=2)
    assert first.complete(done)
    before = [first.get(i) for i in ids]
    first.close()
    second = SQLiteStore(db)
    try:
        assert [second.get(i) for i in ids] == before
        assert second.counts() == {
            "queued": 1,
            "running": 1,
            "done": 1,
            "failed": 0,
            "cancelled": 0,
        }
        assert second.complete(running)  # the lease, and so the token, outlived the process
    finally:
        second.close()


def test_committed_work_survives_a_process_that_dies_without_closing(db: Path) -> None:
    """A child that enqueues, claims and then exits abruptly leaves exactly what it committed."""
    code = f"""
        import os
        from patterns.jobqueue.stores.sqlite.store import SQLiteStore
        store = SQLiteStore({str(db)!r})
        store.enqueue_many([{{"task": "t", "payload": n}} for n in range(3)])
        (claim,) = store.claim("doomed", lease=3600)
        print("claimed", claim.job.id, flush=True)
        os._exit(0)  # no close, no checkpoint: the WAL file holds the commits
    """
    child = spawn_python(textwrap.dedent(code))
    try:
        out, err = child.communicate(timeout=MUST_HAPPEN)
    finally:
        child.kill()
        child.wait(MUST_HAPPEN)
    assert child.returncode == 0, err
    claimed = int(out.split()[1])
    reopened = SQLiteStore(db)
    try:
        assert reopened.counts() == {
            "queued": 2,
            "running": 1,
            "done": 0,
            "failed": 0,
            "cancelled": 0,
        }
        job = reopened.get(claimed)
        assert job is not None
        assert job.state is JobState.RUNNING
        assert job.lease_owner is not None
        assert job.lease_owner.startswith("doomed:")
    finally:
        reopened.close()


def query_plan(db: Path, sql: str, params: tuple[object, ...] = ()) -> str:
    """SQLite's EXPLAIN QUERY PLAN for ``sql`` on the file, its steps joined by " | "."""
    conn = raw(db)
    try:
        return " | ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))
    finally:
        conn.close()


def test_the_claim_query_searches_indexes_instead_of_scanning_the_table(
    store: SQLiteStore, db: Path
) -> None:
    """Both halves of the claim's read use their partial index, never a full scan."""
    plan = query_plan(db, sqlite_schema.DUE_SQL, (0, 0, 1))
    assert "SEARCH jobs USING INDEX jobs_queued (run_at<?)" in plan
    assert "SEARCH jobs USING INDEX jobs_leased (lease_until<?)" in plan
    assert "SCAN jobs" not in plan


@pytest.mark.parametrize(
    ("name", "params", "indexes"),
    [
        ("NEXT_DUE_SQL", (), ("jobs_queued", "jobs_leased")),
        ("SPENT_SQL", (0,), ("jobs_leased",)),
        ("CANCEL_EXPIRED_SQL", ("why", 0, 0), ("jobs_leased",)),
    ],
)
def test_the_worker_paths_other_queries_search_the_partial_indexes(
    store: SQLiteStore, db: Path, name: str, params: tuple[object, ...], indexes: tuple[str, ...]
) -> None:
    """The next due time and the expired leases are found through the partial indexes."""
    plan = query_plan(db, getattr(sqlite_schema, name), params)
    for index in indexes:
        assert f"SEARCH jobs USING INDEX {index}" in plan, plan
    assert "SCAN jobs" not in plan


def test_listing_the_running_jobs_reads_their_index_not_the_table(
    store: SQLiteStore, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """list_jobs(state="running") reads jobs_leased; the other states keep the scan by id."""
    seen: list[str] = []
    real_read = store._read

    def spy(body: Callable[[sqlite3.Connection], object]) -> object:
        def traced(conn: sqlite3.Connection) -> object:
            conn.set_trace_callback(seen.append)
            try:
                return body(conn)
            finally:
                conn.set_trace_callback(None)

        return real_read(traced)

    ids = store.enqueue_many([{"task": "t"} for _ in range(3)])
    [claim] = store.claim("w", lease=LEASE)
    monkeypatch.setattr(store, "_read", spy)
    assert [job.id for job in store.list_jobs(state="running")] == [claim.job.id]
    assert [job.id for job in store.list_jobs(state="queued")] == ids[:0:-1]
    running_sql, queued_sql = seen  # as run, the parameters filled in
    assert "SCAN jobs USING INDEX jobs_leased" in query_plan(db, running_sql)
    assert query_plan(db, queued_sql) == "SCAN jobs"


def test_create_false_refuses_a_missing_file_and_creates_nothing(tmp_path: Path) -> None:
    """A reader's open (create=False) of a path that does not exist is "no such queue"."""
    path = tmp_path / "missing.db"
    with pytest.raises(StoreFileError, match="no such queue"):
        SQLiteStore(path, create=False)
    assert list(tmp_path.iterdir()) == []
    SQLiteStore(path).close()
    SQLiteStore(path, create=False).close()  # an existing store opens as usual


def test_a_payload_is_kept_as_utf8_and_a_row_escaped_as_before_reads_back_equal(
    store: SQLiteStore, db: Path
) -> None:
    """The column holds the JSON as UTF-8 text; a row written with escapes reads back the same."""
    payload = {"text": "\u0436\u0436 \U0001f600", "nul": "a\x00b", "lone": "\ud800"}
    job_id = store.enqueue("t", payload)
    conn = raw(db)
    try:
        text, size = conn.execute(
            "SELECT payload, length(CAST(payload AS BLOB)) FROM jobs WHERE id = ?", (job_id,)
        ).fetchone()
        assert text == '{"text":"\u0436\u0436 \U0001f600","nul":"a\\u0000b","lone":"\\ud800"}'
        assert size == len(text.encode("utf-8")) == 53
        escaped = json.dumps(payload, separators=(",", ":"))  # ASCII only, as written before
        conn.execute("UPDATE jobs SET payload = ? WHERE id = ?", (escaped, job_id))
    finally:
        conn.close()
    found = store.get(job_id)
    assert found is not None
    assert found.payload == payload


# --- schema migrations ---------------------------------------------------------------------

# The version 1 schema as it was shipped, so a test can build a file an old release wrote.
V1_SCHEMA = """
CREATE TABLE jobs (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    task         TEXT    NOT NULL CHECK (task <> ''),
    payload      TEXT    NOT NULL,
    state        TEXT    NOT NULL CHECK (state IN ('queued', 'running', 'done', 'failed')),
    run_at       REAL    NOT NULL,
    attempts     INTEGER NOT NULL CHECK (attempts >= 0),
    max_attempts INTEGER NOT NULL CHECK (max_attempts >= 1),
    lease_owner  TEXT,
    lease_until  REAL,
    last_error   TEXT,
    created_at   REAL    NOT NULL,
    updated_at   REAL    NOT NULL,
    CHECK ((state = 'running') = (lease_owner IS NOT NULL AND lease_until IS NOT NULL))
);
CREATE INDEX jobs_due ON jobs (state, run_at, id);
CREATE INDEX jobs_lease ON jobs (state, lease_until);
PRAGMA user_version = 1;
"""


def test_a_version_1_file_is_migrated_keeping_every_job_its_ids_and_the_id_counter(
    db: Path,
) -> None:
    """Opening a v1 file rebuilds it at v2 in one step: same rows, same ids, no id reused."""
    conn = raw(db)
    conn.executescript(V1_SCHEMA)
    insert = (
        "INSERT INTO jobs (task, payload, state, run_at, attempts, max_attempts, lease_owner,"
        " lease_until, last_error, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    rows = [
        ("a", '{"n": 1}', "queued", 10.0, 0, 3, None, None, None, 1.0, 1.0),
        ("b", "[1, 2]", "running", 11.0, 1, 3, "w:tok", 99.0, None, 2.0, 2.0),
        ("c", "null", "failed", 12.0, 3, 3, None, None, "boom", 3.0, 3.0),
        ("d", '"x"', "done", 13.0, 1, 1, None, None, None, 4.0, 4.0),
    ]
    conn.executemany(insert, rows)
    conn.execute("DELETE FROM jobs WHERE id = 4")  # the highest id, purged: never reused
    conn.close()
    store = SQLiteStore(db)
    try:
        jobs = [store.get(i) for i in (1, 2, 3)]
        assert [(j.task, j.payload, j.state.value) for j in jobs if j] == [
            ("a", {"n": 1}, "queued"),
            ("b", [1, 2], "running"),
            ("c", None, "failed"),
        ]
        running = jobs[1]
        assert running is not None
        assert (running.lease_owner, running.lease_until, running.attempts) == ("w:tok", 99.0, 1)
        assert (running.timeout, running.result, running.cancel_requested) == (None, None, False)
        assert store.get(4) is None
        assert store.enqueue("e") == 5
        assert store.cancel(1).value == "cancelled"  # the new state is allowed now
        assert store.requeue(3)
    finally:
        store.close()
    assert pragma(db, "user_version") == SCHEMA_VERSION == 4
    assert pragma(db, "journal_mode") == "wal"
    conn = raw(db)
    try:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert {"jobs", "workers", "jobs_queued", "jobs_leased", "jobs_id_floor"} <= names
        assert not {"jobs_v2", "jobs_v4", "jobs_due", "jobs_lease"} & names
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()


def _version_2_file(db: Path) -> None:
    """A file as version 2 of the store left it: version 1's schema and migration 2."""
    conn = raw(db)
    conn.executescript(V1_SCHEMA)
    conn.execute("BEGIN")
    for statement in sqlite_schema.MIGRATIONS[1]:
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 2")
    conn.execute("COMMIT")
    conn.close()


def test_a_version_2_file_is_migrated_to_partial_indexes_keeping_every_job_and_the_id_counter(
    db: Path,
) -> None:
    """Opening a v2 file swaps its indexes for the partial ones: same rows, ids, id floor."""
    _version_2_file(db)
    conn = raw(db)
    insert = (
        "INSERT INTO jobs (task, payload, state, run_at, attempts, max_attempts, lease_owner,"
        " lease_until, last_error, created_at, updated_at, timeout, result, cancel_requested)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    rows = [
        ("a", '{"n": 1}', "queued", 10.0, 0, 3, None, None, None, 1.0, 1.0, None, None, 0),
        ("b", "[1, 2]", "running", 11.0, 1, 3, "w:tok", 99.0, None, 2.0, 2.0, 5.0, None, 1),
        ("c", "null", "failed", 12.0, 3, 3, None, None, "boom", 3.0, 3.0, None, None, 0),
        ("d", '"x"', "done", 13.0, 1, 1, None, None, None, 4.0, 4.0, None, '"r"', 0),
        ("e", "2", "cancelled", 14.0, 0, 3, None, None, None, 5.0, 5.0, None, None, 0),
        ("f", "3", "done", 15.0, 1, 3, None, None, None, 6.0, 6.0, None, None, 0),
    ]
    conn.executemany(insert, rows)
    conn.execute("DELETE FROM jobs WHERE id = 6")  # the highest id, purged: never reused
    before = conn.execute("SELECT * FROM jobs ORDER BY id").fetchall()
    conn.execute(
        "INSERT OR REPLACE INTO workers VALUES ('w', 'host', 1, 'running', 1.0, 2.0, 1e12, 1)"
    )
    conn.close()
    store = SQLiteStore(db)
    try:
        assert pragma(db, "user_version") == SCHEMA_VERSION == 4
        conn = raw(db)
        try:
            assert conn.execute("SELECT * FROM jobs ORDER BY id").fetchall() == before
            floor = conn.execute("SELECT id FROM jobs_id_floor")
            assert floor.fetchall() == [(6,)]  # AUTOINCREMENT's counter, carried over
            indexes = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index'"))
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        finally:
            conn.close()
        assert indexes == {
            "sqlite_autoindex_workers_1": None,
            "jobs_queued": "CREATE INDEX jobs_queued ON jobs (run_at, id) WHERE state = 'queued'",
            "jobs_leased": (
                "CREATE INDEX jobs_leased ON jobs (lease_until) WHERE state = 'running'"
            ),
        }
        assert [w.id for w in store.workers()] == ["w"]
        assert store.enqueue("g") == 7
        # The claim finds the due queued jobs through the new index, in (run_at, id) order,
        # and the expired lease of a job whose cancel was requested through the other.
        assert [c.job.id for c in store.claim("w2", lease=LEASE, limit=5)] == [1, 7]
        cancelled = store.get(2)
        assert cancelled is not None
        assert cancelled.state is JobState.CANCELLED
    finally:
        store.close()


def test_a_migration_to_partial_indexes_that_fails_leaves_the_version_2_file_as_it_was(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dropping and creating the indexes is one transaction: a failure rolls it all back."""
    _version_2_file(db)
    conn = raw(db)
    conn.execute(
        "INSERT INTO jobs (task, payload, state, run_at, attempts, max_attempts,"
        " created_at, updated_at) VALUES ('a', '1', 'queued', 1, 0, 3, 1, 1)"
    )
    conn.close()
    broken = (*sqlite_schema.MIGRATIONS[2][:-1], "THIS IS NOT SQL")
    monkeypatch.setattr(sqlite_schema, "MIGRATIONS", (*sqlite_schema.MIGRATIONS[:2], broken))
    with pytest.raises(StoreFileError):
        SQLiteStore(db)
    assert pragma(db, "user_version") == 2
    conn = raw(db)
    try:
        assert conn.execute("SELECT task FROM jobs").fetchall() == [("a",)]
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert {"jobs_due", "jobs_lease"} <= names
        assert not {"jobs_queued", "jobs_leased"} & names
    finally:
        conn.close()


def _version_3_file(db: Path) -> None:
    """A file as version 3 of the store left it: AUTOINCREMENT and the partial indexes."""
    _version_2_file(db)
    conn = raw(db)
    conn.execute("BEGIN")
    for statement in sqlite_schema.MIGRATIONS[2]:
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 3")
    conn.execute("COMMIT")
    conn.close()


V3_ROWS = [
    ("a", '{"n": 1}', "queued", 10.0, 0, 3, None, None, None, 1.0, 1.0, None, None, 0),
    ("b", "[1, 2]", "running", 11.0, 1, 3, "w:tok", 99.0, None, 2.0, 2.0, 5.0, None, 1),
    ("c", "null", "failed", 12.0, 3, 3, None, None, "boom", 3.0, 3.0, None, None, 0),
    ("d", '"x"', "done", 13.0, 1, 1, None, None, None, 4.0, 4.0, None, '"r"', 0),
    ("e", "2", "cancelled", 14.0, 0, 3, None, None, None, 5.0, 5.0, None, None, 0),
    ("f", "3", "done", 15.0, 1, 3, None, None, None, 6.0, 6.0, None, None, 0),
    ("g", "4", "done", 16.0, 1, 3, None, None, None, 7.0, 7.0, None, None, 0),
]
V3_INSERT = (
    "INSERT INTO jobs (task, payload, state, run_at, attempts, max_attempts, lease_owner,"
    " lease_until, last_error, created_at, updated_at, timeout, result, cancel_requested)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


@pytest.mark.parametrize("purged", [(7,), (6, 7), (1, 2, 3, 4, 5, 6, 7)], ids=["1", "2", "all"])
def test_a_version_3_file_is_migrated_off_autoincrement_keeping_every_job_and_no_id_reused(
    db: Path, purged: tuple[int, ...]
) -> None:
    """Opening a v3 file rebuilds jobs without AUTOINCREMENT: same rows, ids; no id reused."""
    _version_3_file(db)
    conn = raw(db)
    conn.executemany(V3_INSERT, V3_ROWS)
    # The newest ids, purged before the migration: the next id is still 8, not 7 or less.
    conn.executemany("DELETE FROM jobs WHERE id = ?", [(i,) for i in purged])
    before = conn.execute("SELECT * FROM jobs ORDER BY id").fetchall()
    conn.close()
    store = SQLiteStore(db)
    try:
        assert pragma(db, "user_version") == SCHEMA_VERSION == 4
        conn = raw(db)
        try:
            assert conn.execute("SELECT * FROM jobs ORDER BY id").fetchall() == before
            assert conn.execute("SELECT id FROM jobs_id_floor").fetchall() == [(7,)]
            (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'jobs'").fetchone()
            assert "AUTOINCREMENT" not in sql.upper()
            assert conn.execute("SELECT * FROM sqlite_sequence").fetchall() == []
            indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            assert {"jobs_queued", "jobs_leased"} <= indexes
            assert "jobs_v4" not in indexes
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        finally:
            conn.close()
        assert store.enqueue("h") == 8
        assert store.enqueue_many([{"task": "i"}, {"task": "j"}]) == [9, 10]
    finally:
        store.close()


def test_a_migration_off_autoincrement_that_fails_leaves_the_version_3_file_as_it_was(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rebuild is one transaction: a failure half-way leaves the v3 table and its counter."""
    _version_3_file(db)
    conn = raw(db)
    conn.executemany(V3_INSERT, V3_ROWS[:2])
    conn.close()
    broken = (*sqlite_schema.MIGRATIONS[3][:-1], "THIS IS NOT SQL")
    monkeypatch.setattr(sqlite_schema, "MIGRATIONS", (*sqlite_schema.MIGRATIONS[:3], broken))
    with pytest.raises(StoreFileError):
        SQLiteStore(db)
    assert pragma(db, "user_version") == 3
    conn = raw(db)
    try:
        assert conn.execute("SELECT task FROM jobs ORDER BY id").fetchall() == [("a",), ("b",)]
        assert conn.execute("SELECT seq FROM sqlite_sequence").fetchall() == [(2,)]
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert not {"jobs_v4", "jobs_id_floor"} & names
    finally:
        conn.close()


def test_a_purge_of_the_newest_job_does_not_give_its_id_again(store: SQLiteStore) -> None:
    """Ids go on above a purged newest job even while older ones remain below it."""
    first, second, newest = store.enqueue_many([{"task": "a"}, {"task": "b"}, {"task": "c"}])
    claims = store.claim("w", lease=LEASE, limit=3)
    assert [c.job.id for c in claims] == [first, second, newest]
    assert store.release(claims[0])  # queued again: not purged
    assert store.release(claims[1])
    assert store.complete(claims[2])
    assert store.purge() == 1
    assert store.enqueue("d") == newest + 1  # SQLite alone would give newest again
    for job_id in (first, second, newest + 1):
        assert store.cancel(job_id).value == "cancelled"
    assert store.purge() == 3  # every job: the table is empty
    assert store.enqueue_many([{"task": "e"}, {"task": "f"}]) == [newest + 2, newest + 3]


def test_a_migration_that_fails_leaves_the_version_1_file_as_it_was(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rebuild is one transaction: a failure half-way rolls it all back."""
    conn = raw(db)
    conn.executescript(V1_SCHEMA)
    conn.execute(
        "INSERT INTO jobs (task, payload, state, run_at, attempts, max_attempts,"
        " created_at, updated_at) VALUES ('a', '1', 'queued', 1, 0, 3, 1, 1)"
    )
    conn.close()
    broken = (*sqlite_schema.MIGRATIONS[1][:-1], "THIS IS NOT SQL")
    monkeypatch.setattr(sqlite_schema, "MIGRATIONS", (sqlite_schema.MIGRATIONS[0], broken))
    with pytest.raises(StoreFileError):
        SQLiteStore(db)
    assert pragma(db, "user_version") == 1
    conn = raw(db)
    try:
        assert conn.execute("SELECT task FROM jobs").fetchall() == [("a",)]
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert "jobs_v2" not in names
    finally:
        conn.close()


# --- files that are not (our) job stores -------------------------------------------------


def test_a_newer_schema_version_is_refused_naming_the_file_and_both_versions(db: Path) -> None:
    """A file written by a newer version raises StoreFileError and is left untouched."""
    SQLiteStore(db).close()
    conn = raw(db)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreFileError) as caught:
        SQLiteStore(db)
    message = str(caught.value)
    assert str(db) in message
    assert f"version {SCHEMA_VERSION + 1}" in message
    assert f"version {SCHEMA_VERSION})" in message
    assert pragma(db, "user_version") == SCHEMA_VERSION + 1


@pytest.mark.parametrize(
    "content",
    [
        b"this is a text file, not a database\n" * 200,
        bytes(range(256)) * 64,
        b"SQLite format 3\x00" + b"\xff" * 4080,
    ],
    ids=["text", "binary", "bad-header"],
)
def test_a_file_that_is_not_a_database_is_refused_and_left_unchanged(
    db: Path, content: bytes
) -> None:
    """Garbage raises StoreFileError naming the file, and not one byte of it is rewritten."""
    db.write_bytes(content)
    with pytest.raises(StoreFileError, match="not a usable SQLite database") as caught:
        SQLiteStore(db)
    assert str(db) in str(caught.value)
    assert db.read_bytes() == content


def test_another_applications_database_is_refused_and_left_unchanged(db: Path) -> None:
    """A database with tables but no job store version is not adopted, not even set to WAL."""
    conn = raw(db)
    conn.execute("CREATE TABLE users (name TEXT)")
    conn.close()
    with pytest.raises(StoreFileError, match=r"without a job store schema version.*'users'"):
        SQLiteStore(db)
    assert pragma(db, "journal_mode") == "delete"
    assert pragma(db, "user_version") == 0


def _foreign_file(db: Path, version: int, table: str) -> None:
    conn = sqlite3.connect(db)  # rollback-journal mode, as another application leaves it
    conn.execute(table)
    conn.execute(f"PRAGMA user_version = {version}")
    conn.commit()
    conn.close()


FOREIGN_FILES = {
    "jobs-table-v1": (1, "CREATE TABLE jobs (id INTEGER PRIMARY KEY, name TEXT)"),
    "jobs-table-v2": (2, "CREATE TABLE jobs (id INTEGER PRIMARY KEY, name TEXT)"),
    "other-table-v1": (1, "CREATE TABLE users (name TEXT)"),
    "other-table-v0": (0, "CREATE TABLE users (name TEXT)"),
    "newer": (99, "CREATE TABLE users (name TEXT)"),
}


@pytest.mark.parametrize("case", list(FOREIGN_FILES.values()), ids=list(FOREIGN_FILES))
def test_a_refused_foreign_file_keeps_every_byte_and_gets_no_wal(
    db: Path, case: tuple[int, str]
) -> None:
    """Nothing is written (not even journal_mode=WAL) until the file is known to be ours."""
    _foreign_file(db, *case)
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    with pytest.raises(StoreFileError):
        SQLiteStore(db)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert pragma(db, "journal_mode") == "delete"
    assert not Path(f"{db}-wal").exists()


def test_a_foreign_jobs_table_at_our_version_is_refused(db: Path) -> None:
    """A file claiming our schema version whose jobs table has other columns is refused."""
    conn = raw(db)
    conn.execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    conn.close()
    with pytest.raises(StoreFileError, match="was not written by this job store"):
        SQLiteStore(db)


@pytest.mark.parametrize("where", ["missing-dir", "directory"])
def test_a_path_that_cannot_be_opened_is_a_clear_error(tmp_path: Path, where: str) -> None:
    """A path in a missing directory, or a directory itself, raises StoreFileError naming it."""
    path = tmp_path / "nowhere" / "jobs.db" if where == "missing-dir" else tmp_path
    with pytest.raises(StoreFileError) as caught:
        SQLiteStore(path)
    assert str(path) in str(caught.value)


def test_a_damaged_payload_fails_its_job_and_the_claim_goes_on(
    store: SQLiteStore, db: Path
) -> None:
    """A row whose payload is not JSON ends failed with the reason; other jobs are still claimed."""
    bad, good = store.enqueue_many([{"task": "t", "payload": 1}, {"task": "t", "payload": 2}])
    conn = raw(db)
    conn.execute("UPDATE jobs SET payload = '{not json' WHERE id = ?", (bad,))
    conn.close()
    assert [c.job.id for c in store.claim("w", lease=LEASE, limit=5)] == [good]
    assert store.counts() == {"queued": 0, "running": 1, "done": 0, "failed": 1, "cancelled": 0}
    with pytest.raises(StoreFileError, match=f"job {bad} has a payload that is not JSON"):
        store.get(bad)


def test_hostile_task_names_and_payloads_are_stored_as_data(store: SQLiteStore) -> None:
    """SQL in a task name or payload is stored verbatim (parameters, never string building)."""
    task = "x'); DROP TABLE jobs; --"
    payload = {"'; DELETE FROM jobs; --": "\x00\u2028\U0001f600"}
    job_id = store.enqueue(task, payload)
    job = store.get(job_id)
    assert job is not None
    assert (job.task, job.payload) == (task, payload)
    assert store.counts()["queued"] == 1


# --- locking across connections and processes ---------------------------------------------


def _claim_all(
    store: SQLiteStore, owner: str, barrier: threading.Barrier
) -> Callable[[], list[int]]:
    """A thread body: wait at the barrier, then claim and complete jobs until none is due."""

    def run() -> list[int]:
        barrier.wait()
        taken = []
        while claims := store.claim(owner, lease=LEASE):
            for claim in claims:
                taken.append(claim.job.id)
                assert store.complete(claim)
        return taken

    return run


def test_separate_connections_in_threads_claim_each_job_exactly_once(db: Path) -> None:
    """Four store objects on one file (four connections) claim 80 jobs; none is taken twice."""
    stores = [SQLiteStore(db) for _ in range(4)]
    try:
        ids = stores[0].enqueue_many([{"task": "t"} for _ in range(80)])
        barrier = threading.Barrier(4, timeout=MUST_HAPPEN)
        threads = [
            run_in_thread(_claim_all(s, f"w{i}", barrier), name=f"claimer-{i}")
            for i, s in enumerate(stores)
        ]
        claimed: list[int] = []
        for thread, outcome in threads:
            join_or_fail(thread)
            assert "error" not in outcome, outcome
            claimed += outcome["result"]
        assert sorted(claimed) == ids
    finally:
        for s in stores:
            s.close()


def test_concurrent_first_opens_create_the_schema_exactly_once(db: Path) -> None:
    """Four threads opening a new file at the same moment all succeed on one schema."""
    barrier = threading.Barrier(4, timeout=MUST_HAPPEN)

    def open_and_enqueue() -> int:
        barrier.wait()
        made = SQLiteStore(db)
        try:
            return made.enqueue("t")
        finally:
            made.close()

    threads = [run_in_thread(open_and_enqueue, name=f"opener-{i}") for i in range(4)]
    for thread, outcome in threads:
        join_or_fail(thread)
        assert "error" not in outcome, outcome
    assert pragma(db, "user_version") == SCHEMA_VERSION
    check = SQLiteStore(db)
    try:
        assert check.counts()["queued"] == 4
    finally:
        check.close()


CLAIMER = """
import sys
from patterns.jobqueue.stores.sqlite.store import SQLiteStore
store = SQLiteStore({path!r})
print("ready", flush=True)
if sys.stdin.readline().strip() != "go":
    sys.exit("no go")
while claims := store.claim({owner!r}, lease=600):
    for claim in claims:
        print("claimed", claim.job.id, flush=True)
        assert store.complete(claim)
store.close()
print("done", flush=True)
"""


def test_two_processes_claim_each_job_exactly_once(store: SQLiteStore, db: Path) -> None:
    """Two processes released together claim 300 jobs from one file; each job exactly once."""
    ids = store.enqueue_many([{"task": "t", "payload": n} for n in range(300)])
    children = [spawn_python(CLAIMER.format(path=str(db), owner=f"proc-{n}")) for n in (1, 2)]
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline() == "ready\n"
        for child in children:  # both are open and waiting: start them together
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        outputs = [child.communicate(timeout=MUST_HAPPEN * 3) for child in children]
    finally:
        for child in children:
            child.kill()
            child.wait(MUST_HAPPEN)
    claimed: list[int] = []
    for child, (out, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0, err
        lines = out.splitlines()
        assert lines[-1] == "done", err
        claimed += [int(line.split()[1]) for line in lines[:-1]]
    assert sorted(claimed) == ids  # none lost, none claimed by both processes
    assert store.counts() == {"queued": 0, "running": 0, "done": 300, "failed": 0, "cancelled": 0}


def test_a_claim_waits_for_another_connections_write_lock(store: SQLiteStore, db: Path) -> None:
    """While another connection holds the write lock the claim waits, then takes the job."""
    job_id = store.enqueue("t")
    other = raw(db)
    try:
        other.execute("BEGIN IMMEDIATE")
        thread, outcome = run_in_thread(lambda: store.claim("w", lease=LEASE), name="claimer")
        assert stays_blocked(thread)  # no "database is locked" error: it waits
        other.execute("COMMIT")
        join_or_fail(thread)
    finally:
        other.close()
    assert "error" not in outcome, outcome
    assert [c.job.id for c in outcome["result"]] == [job_id]


def test_a_lock_held_past_every_retry_raises_and_loses_no_job(
    db: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """After bounded retries the claim raises "database is locked"; the job is still queued."""
    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT", 0.02)  # read when the store connects
    monkeypatch.setattr(sqlite_transactions, "_BUSY_RETRIES", 3)
    monkeypatch.setattr(sqlite_transactions, "_BACKOFF", 0.01)
    made = SQLiteStore(db)
    other = raw(db)
    try:
        job_id = made.enqueue("t")
        other.execute("BEGIN IMMEDIATE")
        with (
            caplog.at_level(logging.WARNING, logger="patterns.jobqueue.stores.sqlite"),
            pytest.raises(sqlite3.OperationalError, match="locked"),
        ):
            made.claim("w", lease=LEASE)
        other.execute("ROLLBACK")
        retries = [r for r in caplog.records if "database busy" in r.getMessage()]
        assert len(retries) == 2  # three attempts, two waits between them
        job = made.get(job_id)
        assert job is not None
        assert (job.state, job.attempts, job.lease_owner) == (JobState.QUEUED, 0, None)
        assert [c.job.id for c in made.claim("w", lease=LEASE)] == [job_id]
    finally:
        other.close()
        made.close()


# --- renew touches the lease only; no sleep while holding the lock -------------------------


def test_renew_reads_no_payload(store: SQLiteStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A renew updates the lease and reads the cancel flag: no JSON is parsed, whatever its size."""
    store.enqueue("t", {"blob": "x" * 100_000})
    (claim,) = store.claim("w", lease=LEASE)

    def no_parsing(*args: object, **kwargs: object) -> object:
        raise AssertionError("renew parsed JSON")

    monkeypatch.setattr(json, "loads", no_parsing)
    renewed = store.renew(claim, lease=LEASE)
    monkeypatch.undo()
    assert renewed is not None
    assert renewed.job.payload is claim.job.payload
    assert renewed.lease_until >= claim.lease_until


def test_a_busy_first_attempt_without_a_deadline_is_retried_like_every_other(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The short first attempt of an unbounded call counts as the first of _BUSY_RETRIES."""
    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT", 0.01)  # read when the store connects
    made = SQLiteStore(db)
    other = raw(db)
    pauses: list[float] = []
    try:
        other.execute("BEGIN IMMEDIATE")
        monkeypatch.setattr(sqlite_transactions.time, "sleep", pauses.append)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            made.enqueue("t")
        monkeypatch.undo()
        assert len(pauses) == sqlite_transactions._BUSY_RETRIES - 1
        other.execute("ROLLBACK")
        assert made.counts()["queued"] == 0
    finally:
        other.close()
        made.close()


def test_the_store_lock_is_free_while_it_backs_off_between_busy_retries(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between two attempts of a busy transaction the store's lock is released, then retaken."""
    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT", 0.01)  # read when the store connects
    made = SQLiteStore(db)
    other = raw(db)
    held_while_sleeping: list[bool] = []

    def sleep(seconds: float) -> None:
        held_while_sleeping.append(made._lock.locked())
        if other.in_transaction:
            other.execute("ROLLBACK")  # the next attempt gets the write lock

    try:
        other.execute("BEGIN IMMEDIATE")
        monkeypatch.setattr(sqlite_transactions.time, "sleep", sleep)
        job_id = made.enqueue("t")
        monkeypatch.undo()
        assert held_while_sleeping == [False]
        assert made.get(job_id) is not None
    finally:
        other.close()
        made.close()
