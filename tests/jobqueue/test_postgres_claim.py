"""PostgresStore's claim: its cost does not grow with the backlog, and its merged order.

The claim searches queued jobs and expired leases separately, each through its partial
index, and merges the two: these tests read the plan PostgreSQL runs for it (EXPLAIN
ANALYZE, in a transaction rolled back) and check the order of the merge on a fake clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from patterns.jobqueue.stores.postgres.store import PostgresStore
from patterns.jobqueue.stores.records import JobState
from tests.jobqueue.conftest import admin_execute
from tests.jobqueue.test_postgres import V1_SCHEMA
from tests.jobqueue.test_store_contract import LEASE, START, FakeClock
from tests.support import join_or_fail, run_in_thread

BACKLOG = 3_000  # queued jobs: the old claim read and sorted every one of them
LIMIT = 10


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock starting at START, shared by the store and the test."""
    return FakeClock()


@pytest.fixture
def store(pg_dsn: str, pg_schema: str, clock: FakeClock) -> Iterator[PostgresStore]:
    """A store on a new schema and the fake clock, closed afterwards."""
    made = PostgresStore(pg_dsn, schema=pg_schema, clock=clock)
    yield made
    made.close()


def due(task: str, *ago: float) -> list[dict[str, Any]]:
    """Jobs of ``task`` (for enqueue_many), each due the given seconds before START."""
    return [{"task": task, "run_at": START - seconds} for seconds in ago]


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan, depth first."""
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


def explain_claim(store: PostgresStore, pg_dsn: str, now: float | None) -> list[dict[str, Any]]:
    """The nodes of the claim's read as PostgreSQL runs it at ``now``, locks rolled back.

    ``now`` is the fake clock's reading, or None for the database's clock.
    """
    import psycopg  # noqa: PLC0415 - optional dependency
    from psycopg import sql  # noqa: PLC0415 - optional dependency

    statement = store._statement(0, claim=True)  # the very statement claim() runs
    params = {
        "clock": now,
        "limit": LIMIT,
        "lease": LEASE,
        "tokens": [f"explain:{n}" for n in range(LIMIT)],
        "cancel_error": "cancelled",
        "spent_error": "spent after %s",
    }
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(store.schema, "jobs")))
        row = conn.execute(
            sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + statement, params
        ).fetchone()
        conn.rollback()
    assert row is not None
    return list(plan_nodes(row[0][0]["Plan"]))


def test_a_claim_reads_a_few_rows_through_the_indexes_whatever_the_backlog(
    store: PostgresStore, pg_dsn: str, clock: FakeClock
) -> None:
    """No sequential scan and no sort of the backlog: each search stops after LIMIT rows."""
    expired = store.enqueue_many([{"task": "t", "run_at": START - 10}] * 3)
    assert len(store.claim("gone", lease=LEASE, limit=3)) == 3
    store.enqueue_many([{"task": "t", "run_at": START - 5}] * BACKLOG)
    clock.advance(LEASE + 1)  # the three leases expired: due next to the backlog

    nodes = explain_claim(store, pg_dsn, clock.now)
    check_plan(nodes, expired=len(expired))

    claims = store.claim("w", lease=LEASE, limit=LIMIT)  # and the claim itself agrees
    assert [c.job.id for c in claims[:3]] == expired


def check_plan(nodes: list[dict[str, Any]], *, expired: int) -> None:
    """The claim's read uses both partial indexes and reads about LIMIT rows, not the backlog."""
    # The scans that read table rows (a Bitmap Index Scan reads only the index).
    scans = [n for n in nodes if n["Node Type"].endswith("Scan") and "Relation Name" in n]
    assert all(n["Node Type"] != "Seq Scan" for n in scans), scans
    index_names = {n.get("Index Name") for n in nodes}
    assert {"jobs_run_at_id_idx", "jobs_lease_until_idx"} <= index_names, nodes
    # The queued jobs come in order from their index, which is read only up to the limit.
    queued = [n for n in scans if n.get("Index Name") == "jobs_run_at_id_idx"]
    assert [n["Node Type"] for n in queued] == ["Index Scan"], nodes
    # The running jobs are searched three times (to cancel, to fail, to claim again), and
    # the jobs taken are found again by id (the primary key) to mark them running.
    searched = [n for n in scans if n.get("Index Name") != "jobs_pkey"]
    examined = sum(n["Actual Rows"] * n["Actual Loops"] for n in searched)
    assert examined <= LIMIT + 3 * expired, scans  # not the BACKLOG queued rows
    # A sort's input, not its output: a top-N sort of the backlog returns LIMIT rows too.
    sorted_rows = [
        sum(child["Actual Rows"] for child in n["Plans"]) for n in nodes if n["Node Type"] == "Sort"
    ]
    assert all(rows <= 2 * LIMIT + expired for rows in sorted_rows), nodes


def test_a_schema_written_by_version_1_needs_no_migration_for_the_claim_indexes(
    pg_dsn: str, pg_schema: str
) -> None:
    """The partial indexes the claim reads exist since version 1: an old schema has them."""
    for statement in V1_SCHEMA:
        admin_execute(pg_dsn, statement.format(schema=pg_schema))
    admin_execute(
        pg_dsn,
        f'INSERT INTO "{pg_schema}".jobs (task, payload, state, run_at, attempts,'
        " max_attempts, created_at, updated_at)"
        " SELECT 't', 'null', 'queued', now() - interval '1 hour', 0, 3, now(), now()"
        " FROM generate_series(1, %s)",
        (BACKLOG,),
    )
    store = PostgresStore(pg_dsn, schema=pg_schema)  # migrates it to the current version
    try:
        check_plan(explain_claim(store, pg_dsn, None), expired=0)
        assert len(store.claim("w", lease=LEASE, limit=LIMIT)) == LIMIT
    finally:
        store.close()


def test_expired_leases_and_queued_jobs_come_out_by_run_at_then_id(
    store: PostgresStore, clock: FakeClock
) -> None:
    """The merge keeps the documented order, ties by id whichever list a job comes from."""
    # Running, to expire: ids e1 < e2 < e3 < a1 < b1; a1 is given back below, so it is a
    # queued job with a SMALLER id than an expired lease (b1) of the same run_at.
    e1, e2, e3, a1, b1 = store.enqueue_many(due("e", 100, 50, 10) + due("tie", 30, 30))
    taken = {c.job.id: c for c in store.claim("gone", lease=LEASE, limit=5)}
    assert sorted(taken) == [e1, e2, e3, a1, b1]
    assert store.retry(taken[a1], "again", run_at=START - 30)  # queued again, same run_at
    # Queued, with larger ids: q1 before e2 by run_at, q2 after e2 (same run_at, larger id).
    q1, q2, q3 = store.enqueue_many(due("q", 90, 50, 10))
    clock.advance(LEASE + 1)

    order = [c.job.id for c in store.claim("w", lease=LEASE, limit=3)]
    order += [c.job.id for c in store.claim("w", lease=LEASE, limit=1)]
    order += [c.job.id for c in store.claim("w", lease=LEASE, limit=2)]
    order += [c.job.id for c in store.claim("w", lease=LEASE, limit=10)]
    assert order == [e1, q1, e2, q2, a1, b1, e3, q3]
    assert store.claim("w", lease=LEASE, limit=10) == []
    states = {job_id: store.get(job_id) for job_id in order}
    assert all(j is not None and j.state == JobState.RUNNING for j in states.values())


def test_only_expired_leases_or_only_queued_jobs_fill_the_limit(
    store: PostgresStore, clock: FakeClock
) -> None:
    """Either list alone fills a claim; neither list's limit starves the other."""
    expired = store.enqueue_many([{"task": "e", "run_at": START - 10}] * 4)
    assert len(store.claim("gone", lease=LEASE, limit=4)) == 4
    clock.advance(LEASE + 1)
    assert [c.job.id for c in store.claim("w", lease=LEASE, limit=3)] == expired[:3]
    queued = store.enqueue_many([{"task": "q", "run_at": START - 20}] * 3)
    assert [c.job.id for c in store.claim("w", lease=LEASE, limit=3)] == queued
    assert [c.job.id for c in store.claim("w", lease=LEASE, limit=3)] == expired[3:]


def test_rows_another_claim_holds_are_skipped_in_both_lists(
    store: PostgresStore, pg_dsn: str, clock: FakeClock
) -> None:
    """Locked rows at the head of either list are skipped, never waited for, never counted."""
    import psycopg  # noqa: PLC0415 - optional dependency

    expired = store.enqueue_many([{"task": "e", "run_at": START - 100}] * 3)
    assert len(store.claim("gone", lease=LEASE, limit=3)) == 3
    queued = store.enqueue_many([{"task": "q", "run_at": START - 50}] * 4)
    clock.advance(LEASE + 1)
    held = [expired[0], expired[1], queued[0], queued[1]]
    with psycopg.connect(pg_dsn) as other:  # a transaction, open until the block ends
        other.execute(
            f'SELECT id FROM "{store.schema}".jobs WHERE id = ANY(%s) FOR UPDATE', (held,)
        )
        thread, outcome = run_in_thread(
            lambda: store.claim("w", lease=LEASE, limit=3), name="claimer"
        )
        join_or_fail(thread)  # returned while the locks are still held: it did not wait
        assert "error" not in outcome, outcome
        assert [c.job.id for c in outcome["result"]] == [expired[2], queued[2], queued[3]]
        other.rollback()
    assert [c.job.id for c in store.claim("w", lease=LEASE, limit=10)] == held
