"""The SQLite store's claim and settle in few statements, with the same answers.

A claim looks for ended leases with one index search and runs the statements that end them
only when it finds one; it takes its due jobs with one UPDATE per ``CLAIM_BATCH`` jobs, each
under its own token. What the claim returns and leaves in the file is pinned by the
contract tests (tests/jobqueue/test_store_contract.py); these pin the statements.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from patterns.jobqueue.stores.records import CancelResult, JobState
from patterns.jobqueue.stores.sqlite import schema as sqlite_schema
from patterns.jobqueue.stores.sqlite.store import SQLiteStore
from tests.support import FakeClock

LEASE = 30.0


@pytest.fixture
def clock() -> FakeClock:
    """The store's clock, moved by hand."""
    return FakeClock()


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Iterator[SQLiteStore]:
    """A store in a fresh file, on the fake clock."""
    opened = SQLiteStore(tmp_path / "jobs.db", clock=clock)
    yield opened
    opened.close()


def traced(store: SQLiteStore) -> list[str]:
    """The statements the store's connection runs from now on (expanded, as SQLite traces)."""
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    return statements


def plan(path: Path, sql: str, params: tuple[object, ...]) -> str:
    """SQLite's query plan for ``sql``, its steps joined by " | "."""
    conn = sqlite3.connect(path)
    try:
        return " | ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))
    finally:
        conn.close()


def test_the_claims_statements_search_instead_of_scanning(
    store: SQLiteStore, tmp_path: Path
) -> None:
    """EXPIRED_SQL and QUEUED_DUE_SQL search an index; the claim's UPDATE finds jobs by id."""
    expired = plan(tmp_path / "jobs.db", sqlite_schema.EXPIRED_SQL, (0,))
    assert "SEARCH jobs USING" in expired
    assert "SCAN jobs" not in expired
    queued = plan(tmp_path / "jobs.db", sqlite_schema.QUEUED_DUE_SQL, (0, 1))
    assert "SEARCH jobs USING" in queued
    assert "SCAN jobs" not in queued
    assert "TEMP B-TREE" not in queued  # read in (run_at, id) order from the index, not sorted
    take = plan(tmp_path / "jobs.db", sqlite_schema.claim_sql(2), (1, "a", 2, "b", 0, 0, 1, 2))
    assert "SEARCH jobs USING INTEGER PRIMARY KEY" in take
    assert "SCAN jobs" not in take


def test_a_claim_with_no_lease_ended_is_three_statements_between_begin_and_commit(
    store: SQLiteStore, clock: FakeClock
) -> None:
    """The look for ended leases, the queued jobs' read, one UPDATE: nothing that ends a lease."""
    store.enqueue_many([{"task": "t"}] * 6)
    assert len(store.claim("w", lease=LEASE, limit=2)) == 2  # running, leases still live
    statements = traced(store)
    assert len(store.claim("w", lease=LEASE, limit=4)) == 4
    store._conn.set_trace_callback(None)
    assert len(statements) == 5
    assert statements[:2] == [
        "BEGIN IMMEDIATE",
        sqlite_schema.EXPIRED_SQL.replace("?", repr(clock.now)),
    ]
    assert statements[2].startswith(sqlite_schema.QUEUED_DUE_SQL.split(" <= ")[0])
    assert statements[3].startswith("UPDATE jobs SET state = 'running'")
    assert statements[4] == "COMMIT"


def test_a_claim_that_finds_an_ended_lease_ends_those_it_must_before_reading_due_jobs(
    store: SQLiteStore, clock: FakeClock
) -> None:
    """Cancel requested or no attempt left: ended by the claim, past its limit too."""
    spent, cancelled = store.enqueue_many(
        [{"task": "t", "max_attempts": 1}, {"task": "t", "max_attempts": 5}]
    )
    store.claim("dead", lease=LEASE, limit=2)
    assert store.cancel(cancelled) is CancelResult.REQUESTED
    clock.now += LEASE  # both leases end, exactly now
    first = store.enqueue("t", run_at=clock.now - 2 * LEASE)  # due before both: fills the limit
    statements = traced(store)
    assert [c.job.id for c in store.claim("w", lease=LEASE, limit=1)] == [first]
    store._conn.set_trace_callback(None)
    assert any(s.startswith("UPDATE jobs SET state = 'cancelled'") for s in statements)
    assert any(s.startswith("SELECT id, attempts FROM jobs") for s in statements)
    assert any(s.startswith(sqlite_schema.DUE_SQL.split(" <= ")[0]) for s in statements)
    job = store.get(spent)
    assert job is not None
    assert job.state is JobState.FAILED
    job = store.get(cancelled)
    assert job is not None
    assert job.state is JobState.CANCELLED


def test_a_claim_of_more_jobs_than_one_update_takes_gives_each_its_own_token(
    store: SQLiteStore,
) -> None:
    """2 * CLAIM_BATCH + 3 jobs: one transaction, three UPDATEs, a token per job that fences it."""
    count = 2 * sqlite_schema.CLAIM_BATCH + 3
    ids = store.enqueue_many([{"task": "t", "payload": i} for i in range(count)])
    statements = traced(store)
    claims = store.claim("w", lease=LEASE, limit=count + 5)
    store._conn.set_trace_callback(None)
    assert [c.job.id for c in claims] == ids
    assert len([s for s in statements if s.startswith("UPDATE jobs SET state = 'running'")]) == 3
    assert [s for s in statements if s.startswith(("BEGIN", "COMMIT"))] == [
        "BEGIN IMMEDIATE",
        "COMMIT",
    ]
    assert len({c.token for c in claims}) == count
    for claim in claims:
        job = store.get(claim.job.id)
        assert job is not None
        assert (job.state, job.lease_owner, job.attempts) == (JobState.RUNNING, claim.token, 1)
        assert job == claim.job  # the returned job is the row as the claim left it
    # Each token holds its own job's lease and no other's.
    first, second = claims[0], claims[-1]
    assert not store.complete(type(first)(first.job, second.token, first.lease_until))
    assert store.complete(first)
    assert store.complete(second)
