"""The SQL of `~.PostgresStore`: its schema, migrations and statements.

Every table, index and statement the store runs is here, as text with ``{jobs}``,
``{columns}``, ``{now}`` (and a few more) left for the store to fill in with its schema's
quoted names; values are always parameters. The store checks, creates and migrates the
schema with ``MIGRATIONS`` and ``SHAPES``, and composes ``STATEMENTS`` once.

Docs: docs/jobqueue/many_machines.md
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from patterns.jobqueue.stores.records import TABLE_SHAPES, WORKER_COLUMNS

__all__ = [
    "COLUMNS",
    "MIGRATIONS",
    "NOW",
    "SETTLE_ROWS",
    "SHAPES",
    "STATEMENTS",
    "WORKER_COLUMNS",
    "check_timestamp",
    "settle_claim_text",
    "settle_params",
]

# The one time expression of every statement: the transaction's now(), on the database
# server. A test clock (see PostgresStore) replaces it through the same parameter, so the
# SQL the tests run is the SQL production runs.
NOW = "COALESCE(to_timestamp(%(clock)s::float8), now())"

# timestamptz covers 4713 BC to 294276 AD; refuse what to_timestamp() would reject.
_MIN_EPOCH, _MAX_EPOCH = -210_000_000_000.0, 9_000_000_000_000.0


def check_timestamp(name: str, value: float) -> float:
    """``value``, if ``to_timestamp()`` can take it as seconds; `ValueError` naming ``name``."""
    if not _MIN_EPOCH <= value <= _MAX_EPOCH:
        raise ValueError(f"{name} is outside PostgreSQL's timestamp range, got {value!r}")
    return value


def _epoch(column: str) -> str:
    return f"extract(epoch FROM j.{column})::float8"


# The Job fields, in the order of JOB_COLUMNS, from a row aliased ``j``.
COLUMNS = ", ".join(
    [
        "j.id",
        "j.task",
        "j.payload::text",
        "j.state",
        _epoch("run_at"),
        "j.attempts",
        "j.max_attempts",
        "j.lease_owner",
        _epoch("lease_until"),
        "j.last_error",
        _epoch("created_at"),
        _epoch("updated_at"),
        "j.timeout",
        "j.result::text",
        "j.cancel_requested",
    ]
)

# The tables (and their columns) of each schema version: what opening checks a schema has,
# before migrating it and after (the same for both SQL stores).
SHAPES = TABLE_SHAPES

# Each entry migrates the schema from version i to i + 1; version 0 is no schema at all.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        "CREATE SCHEMA IF NOT EXISTS {schema}",
        """
        CREATE TABLE {version} (
            only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
            version  integer NOT NULL
        )
        """,
        "INSERT INTO {version} (version) VALUES (0)",
        """
        CREATE TABLE {jobs} (
            id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- never reused
            task         text        NOT NULL CHECK (task <> ''),
            payload      json        NOT NULL,                 -- JSON text, never pickle
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
        # The claim's two searches: queued jobs by (run_at, id), running ones by expiry.
        "CREATE INDEX ON {jobs} (run_at, id) WHERE state = 'queued'",
        "CREATE INDEX ON {jobs} (lease_until) WHERE state = 'running'",
    ),
    # Version 2: new columns at the end (PostgreSQL can add them in place, and change the
    # state CHECK, unlike SQLite), and the workers table. A payload and a result are json,
    # not jsonb: json keeps the text as written, so a "\u0000" in it (which jsonb refuses)
    # is stored and read back like any other escape.
    (
        """
        ALTER TABLE {jobs}
            ADD COLUMN timeout float8 CHECK (timeout IS NULL OR timeout > 0),  -- seconds
            ADD COLUMN result json,                                            -- once done
            ADD COLUMN cancel_requested boolean NOT NULL DEFAULT false,
            DROP CONSTRAINT jobs_state_check,
            ADD CONSTRAINT jobs_state_check
                CHECK (state IN ('queued', 'running', 'done', 'failed', 'cancelled'))
        """,
        """
        CREATE TABLE {workers} (
            id         text        PRIMARY KEY,  -- the worker's name, its tokens' prefix
            host       text        NOT NULL,
            pid        integer     NOT NULL,
            state      text        NOT NULL,
            started_at timestamptz NOT NULL,
            last_seen  timestamptz NOT NULL,
            expires_at timestamptz NOT NULL,     -- not listed after this: the worker died
            jobs_held  integer     NOT NULL
        )
        """,
    ),
)

# Every statement the store runs, with {jobs}, {columns} and {now} filled in per store.
# Values are always parameters (%(name)s); only the schema name is an identifier, quoted.
STATEMENTS = {
    # One statement, its own transaction in autocommit: the rows, and one NOTIFY (sent when
    # it commits, and only if a row was inserted) that wakes the idle workers everywhere.
    "insert": """
        WITH j AS (
            INSERT INTO {jobs} (task, payload, state, run_at, attempts, max_attempts,
                                created_at, updated_at, timeout)
            SELECT t.task, t.payload::json, 'queued',
                   COALESCE(to_timestamp(t.run_at), {now} + make_interval(secs => t.delay)),
                   0, t.max_attempts, {now}, {now}, t.timeout
              FROM unnest(%(tasks)s::text[], %(payloads)s::text[], %(run_ats)s::float8[],
                          %(delays)s::float8[], %(max_attempts)s::integer[],
                          %(timeouts)s::float8[])
                   WITH ORDINALITY AS t(task, payload, run_at, delay, max_attempts, timeout, n)
             ORDER BY t.n
            RETURNING id
        )
        SELECT array_agg(j.id ORDER BY j.id),
               (SELECT count(pg_notify(%(channel)s, '')) FROM (SELECT FROM j LIMIT 1) AS one)
          FROM j
    """,
    # The same for one job, with plain parameters: no arrays to encode, the common case.
    "insert_one": """
        WITH j AS (
            INSERT INTO {jobs} (task, payload, state, run_at, attempts, max_attempts,
                                created_at, updated_at, timeout)
            VALUES (%(task)s::text, %(payload)s::text::json, 'queued',
                    COALESCE(to_timestamp(%(run_at)s::float8),
                             {now} + make_interval(secs => %(delay)s::float8)),
                    0, %(max_attempts)s::integer, {now}, {now}, %(timeout)s::float8)
            RETURNING id
        )
        SELECT ARRAY[j.id], pg_notify(%(channel)s, '') FROM j
    """,
    "notify": "SELECT pg_notify(%(channel)s, '')",
    # The outcomes of a settle_many, each fenced alone: a row is updated only while its
    # item's token holds the lease, and each kind does what its single-job method does.
    # The items come as one array per column (`settle_params`), so the statement's text and
    # its parameters are the same whatever the batch's size: psycopg converts it once and the
    # server prepares it once. The items' (id, token) pairs are distinct, so no row is
    # joined twice.
    "settled": """
        settled AS (
            UPDATE {jobs} AS j
               SET state = CASE t.kind
                             WHEN 'complete' THEN 'done'
                             WHEN 'fail' THEN 'failed'
                             WHEN 'cancel' THEN 'cancelled'
                             ELSE CASE WHEN j.cancel_requested THEN 'cancelled' ELSE 'queued' END
                           END,
                   result = CASE WHEN t.kind = 'complete' THEN t.result::json ELSE j.result END,
                   last_error = CASE
                                  WHEN t.kind IN ('fail', 'cancel') THEN t.error
                                  WHEN t.kind = 'complete' THEN j.last_error
                                  WHEN j.cancel_requested THEN %(cancelled)s
                                  WHEN t.kind = 'retry' THEN t.error
                                  ELSE j.last_error
                                END,
                   run_at = CASE WHEN t.kind = 'retry' THEN to_timestamp(t.run_at)
                                 ELSE j.run_at END,
                   attempts = CASE WHEN t.kind = 'release' THEN GREATEST(j.attempts - 1, 0)
                                   ELSE j.attempts END,
                   lease_owner = NULL, lease_until = NULL, updated_at = {now}
              FROM unnest(%(ids)s::bigint[], %(owners)s::text[], %(kinds)s::text[],
                          %(results)s::text[], %(errors)s::text[], %(run_ats)s::float8[])
                   AS t(id, token, kind, result, error, run_at)
             WHERE j.id = t.id AND j.state = 'running' AND j.lease_owner = t.token
            RETURNING t.id, t.token, t.kind
        )
    """,
    # The claim, in the same statement as the outcomes it follows (if any). The rows those
    # outcomes changed ({busy}) are left alone: one statement must not change a row twice.
    # First the expired leases that must not run again: cancelled if a cancel was
    # requested, failed if their attempts are spent.
    "expire": """
        cancelled AS (
            UPDATE {jobs} SET state = 'cancelled', last_error = %(cancel_error)s,
                              lease_owner = NULL, lease_until = NULL, updated_at = {now}
             WHERE id IN (SELECT j.id FROM {jobs} AS j
                           WHERE j.state = 'running' AND j.lease_until <= {now}
                             AND j.cancel_requested AND j.id <> ALL({busy})
                             FOR UPDATE SKIP LOCKED)
            RETURNING id
        ), spent AS (
            UPDATE {jobs} AS j SET state = 'failed',
                                   last_error = format(%(spent_error)s, j.attempts),
                                   lease_owner = NULL, lease_until = NULL, updated_at = {now}
             WHERE j.id IN (SELECT s.id FROM {jobs} AS s
                             WHERE s.state = 'running' AND s.lease_until <= {now}
                               AND s.attempts >= s.max_attempts AND NOT s.cancel_requested
                               AND s.id <> ALL({busy})
                               FOR UPDATE SKIP LOCKED)
            RETURNING j.id, j.attempts
        )
    """,
    # The claim's read: due rows that no other transaction has locked, oldest first. One
    # OR over both kinds of due row would read and sort every due row, so each kind is
    # searched on its own, through its partial index, and the two lists are merged: the
    # queued rows in (run_at, id) order straight from their index, stopping after
    # %(limit)s rows, whatever the backlog; the expired leases from the lease_until index
    # (only running jobs, so as many as are in flight, at most), sorted. The rows of the
    # list that loses the merge stay locked until the claim commits, a few milliseconds:
    # a concurrent claim skips them, as it skips every row being claimed.
    "due": """
        queued AS (
            SELECT j.id, j.state, j.lease_owner, j.run_at FROM {jobs} AS j
             WHERE j.state = 'queued' AND j.run_at <= {now}
             ORDER BY j.run_at, j.id
             LIMIT %(limit)s
               FOR UPDATE SKIP LOCKED
        ), expired AS (
            SELECT j.id, j.state, j.lease_owner, j.run_at FROM {jobs} AS j
             WHERE j.state = 'running' AND j.lease_until <= {now}
               AND j.attempts < j.max_attempts AND NOT j.cancel_requested
               AND j.id <> ALL({busy})
             ORDER BY j.run_at, j.id
             LIMIT %(limit)s
               FOR UPDATE SKIP LOCKED
        ), due AS (
            SELECT d.id, d.state, d.lease_owner, row_number() OVER (ORDER BY d.run_at, d.id) AS n
              FROM (SELECT * FROM queued UNION ALL SELECT * FROM expired) AS d
             ORDER BY d.run_at, d.id LIMIT %(limit)s
        )
    """,
    # The claim's write, on the rows locked above: one fencing token per row.
    "take": """
        taken AS (
            UPDATE {jobs} AS j
               SET state = 'running', attempts = j.attempts + 1,
                   lease_owner = (%(tokens)s::text[])[d.n],
                   lease_until = {now} + make_interval(secs => %(lease)s), updated_at = {now}
              FROM due AS d
             WHERE j.id = d.id
            RETURNING {columns}, d.state AS was, d.lease_owner AS was_owner
        )
    """,
    # The lease only: the payload is neither read nor sent back.
    "renew": """
        UPDATE {jobs} AS j
           SET lease_until = {now} + make_interval(secs => %(lease)s), updated_at = {now}
         WHERE j.id = %(id)s AND j.state = 'running' AND j.lease_owner = %(token)s
        RETURNING extract(epoch FROM j.lease_until)::float8,
                  extract(epoch FROM j.updated_at)::float8, j.cancel_requested
    """,
    "get": "SELECT {columns} FROM {jobs} AS j WHERE j.id = %(id)s",
    "list": """
        SELECT {columns} FROM {jobs} AS j
         WHERE (%(state)s::text IS NULL OR j.state = %(state)s::text)
           AND (%(task)s::text IS NULL OR j.task = %(task)s::text)
         ORDER BY j.id DESC LIMIT %(limit)s
    """,
    # A dead letter back in the queue: due now, attempts reset, last_error kept.
    "requeue": """
        UPDATE {jobs} SET state = 'queued', attempts = 0, run_at = {now}, updated_at = {now},
                          cancel_requested = false, result = NULL
         WHERE state = 'failed'
           AND (%(id)s::bigint IS NULL OR id = %(id)s::bigint)
           AND (%(task)s::text IS NULL OR task = %(task)s::text)
        RETURNING id
    """,
    "cancel_state": "SELECT state FROM {jobs} WHERE id = %(id)s FOR UPDATE",
    "cancel_queued": """
        UPDATE {jobs} SET state = 'cancelled', updated_at = {now} WHERE id = %(id)s
    """,
    "cancel_running": """
        UPDATE {jobs} SET cancel_requested = true, updated_at = {now} WHERE id = %(id)s
    """,
    "expire_workers": "DELETE FROM {workers} WHERE expires_at <= {now}",
    "record_worker": """
        INSERT INTO {workers} (id, host, pid, state, started_at, last_seen, expires_at,
                               jobs_held)
        VALUES (%(id)s, %(host)s, %(pid)s, %(state)s, to_timestamp(%(started_at)s::float8),
                {now}, {now} + make_interval(secs => %(ttl)s), %(jobs_held)s)
        ON CONFLICT (id) DO UPDATE
           SET host = excluded.host, pid = excluded.pid, state = excluded.state,
               started_at = excluded.started_at, last_seen = excluded.last_seen,
               expires_at = excluded.expires_at, jobs_held = excluded.jobs_held
    """,
    "forget_worker": "DELETE FROM {workers} WHERE id = %(id)s",
    "workers": """
        SELECT id, host, pid, state, extract(epoch FROM started_at)::float8,
               extract(epoch FROM last_seen)::float8, extract(epoch FROM expires_at)::float8,
               jobs_held
          FROM {workers} ORDER BY started_at, id
    """,
    "counts": "SELECT state, count(*) FROM {jobs} GROUP BY state",
    "next_due": """
        SELECT extract(epoch FROM least(
                   (SELECT min(run_at) FROM {jobs} WHERE state = 'queued'),
                   (SELECT min(lease_until) FROM {jobs} WHERE state = 'running')))::float8
    """,
    "purge": """
        DELETE FROM {jobs}
         WHERE state = ANY(%(states)s::text[])
           AND (%(cutoff)s::float8 IS NULL OR updated_at < to_timestamp(%(cutoff)s::float8))
    """,
    "clock": "SELECT extract(epoch FROM clock_timestamp())::float8",
}

# settle_many sends at most this many items per statement (more make more statements in
# one transaction), so that one statement's arrays, and the rows it locks, stay few.
SETTLE_ROWS = 64


def settle_params(rows: Sequence[tuple[Any, ...]]) -> dict[str, list[Any]]:
    """The ``settled`` statement's parameters: one list per column of the items' rows.

    Each row is (id, token, kind, result, error, run_at), as ``PostgresStore`` builds them.
    """
    names = ("ids", "owners", "kinds", "results", "errors", "run_ats")
    return {name: [row[i] for row in rows] for i, name in enumerate(names)}


def settle_claim_text(settle: bool, *, claim: bool) -> str:
    """One statement: the outcomes of some items if ``settle``, then a claim if ``claim``.

    Its result: a row per job claimed, or one row if none was. Each row holds what was
    settled (a JSON list of ``[id, token, kind]``), the ``NOTIFY`` count (1 if a release
    applied), the count of expired leases cancelled, the expired leases failed (a JSON
    list of ``[id, attempts]``), then, with ``claim``, the claimed job's columns (NULL if
    none) and what the row was before (its state and lease owner).
    """
    parts = []
    if settle:
        parts.append(STATEMENTS["settled"].strip())
    if claim:
        busy = "ARRAY(SELECT id FROM settled)" if settle else "'{{}}'::bigint[]"
        parts += [
            STATEMENTS[name].strip().replace("{busy}", busy) for name in ("expire", "due", "take")
        ]
    released = (
        "(SELECT count(pg_notify(%(channel)s, ''))"
        " FROM (SELECT FROM settled WHERE kind = 'release' LIMIT 1) AS one)"
    )
    columns = [
        "(SELECT json_agg(json_build_array(id, token, kind)) FROM settled)" if settle else "NULL",
        released if settle else "0",
        "(SELECT count(*) FROM cancelled)" if claim else "0",
        "(SELECT json_agg(json_build_array(id, attempts)) FROM spent)" if claim else "NULL",
    ]
    body = f"SELECT {', '.join(columns)}"
    if claim:
        body += ", t.* FROM (SELECT) AS one LEFT JOIN taken AS t ON true"
    # One space for each run of white space: psycopg caches its conversion of a statement
    # only up to 4,096 bytes, and this one's indentation would take it past that. No
    # literal in it holds white space (tests/jobqueue/test_postgres_statements.py).
    return " ".join(("WITH " + ", ".join(parts) + " " + body).split())
