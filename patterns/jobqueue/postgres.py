"""A ``Store`` on PostgreSQL, for workers on several machines sharing one queue.

TL;DR: ``PostgresStore("postgresql://user@host/db")`` keeps the job queue in a PostgreSQL
schema: claims take a lease in one short ``SELECT ... FOR UPDATE SKIP LOCKED`` transaction,
the database's clock decides every due time and lease, an enqueue wakes idle workers on
every machine through ``LISTEN/NOTIFY``, and a lost connection is retried, not fatal.

Pitfall:
    Four ways a queue on a database server loses, duplicates or stalls work. Proletarian
    holds the claiming transaction (and its row lock) open while the job runs: a
    connection per busy thread, an ``idle_in_transaction_session_timeout`` that kills long
    jobs, and a claim that waits behind every running job unless it skips locked rows.
    A claim that reads due jobs and then updates them in a second statement, without a
    row lock, gives one job to two workers. Workers that judge leases by their own clocks
    disagree as soon as the clocks do: a machine whose clock runs a minute fast takes over
    jobs whose leases are still live. And a connection dropped by a failover, a restart
    or ``pg_terminate_backend`` that surfaces as an exception kills the worker, or looks
    like a lost job.

Pattern:
    A claim is one transaction of a few milliseconds: ``SELECT ... FOR UPDATE SKIP
    LOCKED`` picks the due rows no other claim is taking at that moment, an ``UPDATE``
    marks them running under a lease (a fencing token and an expiry), and ``COMMIT``. No
    transaction is open while a handler runs: the lease protects the job, the heartbeat
    renews it, and every outcome is written only while the claim's token still holds it.
    Every timestamp is computed in SQL from the transaction's ``now()``, so the database
    server's clock is the only clock that matters. Each enqueue (and release) sends a
    ``NOTIFY`` that is delivered when it commits; a listener thread on its own connection
    turns it into a call to each `PostgresStore.subscribe` callback, which a ``Worker``
    uses to end its idle wait. A statement that fails because the connection broke before
    ``COMMIT`` was sent changed nothing, so the store reconnects and retries it with
    backoff; a break during ``COMMIT`` leaves the outcome unknown and raises
    `~patterns.jobqueue.store.CommitUnknown`, which the worker handles like any failed
    store call (the lease brings the job back). The schema lives in its own PostgreSQL
    schema with a version table, created and migrated under an advisory lock.

Guarantees:
    * A job is returned by at most one claim while its lease is live, across every
      connection and machine, and a claim never waits for another transaction's row
      locks (``SKIP LOCKED``).
    * Due times, lease expiries and ``created_at``/``updated_at`` all come from the
      database server's clock; the clocks of the machines running workers are never read
      for them.
    * Complete, fail, retry, release and renew change the row only while the claim's
      token still holds the lease; they return False (None for renew) otherwise. So does
      each item of ``settle_many``, whose items commit together in one transaction.
    * A call that raises `~patterns.jobqueue.store.StoreUnavailable` (other than
      `~patterns.jobqueue.store.CommitUnknown`) changed nothing. Connection loss is
      retried ``RETRIES`` times with backoff first.
    * Every subscriber is called after each commit that enqueued or released a job, and
      again each time the listener (re)connects, since a notification may have been
      missed while it was away; a call means "look now", and may find nothing.
    * Opening a schema written by a newer version, or a schema holding other tables,
      raises `StoreSchemaError` and changes nothing.

Python:
    3.11+, and psycopg 3.1+ (``pip install 'shutdown-patterns[postgres]'``), imported only
    when a store is made: ``import patterns.jobqueue`` works without it. PostgreSQL 10+
    (identity columns; ``SKIP LOCKED`` needs 9.5); tested on 15, and the tests need 13+
    (``DROP DATABASE ... WITH (FORCE)``). Checked on CPython 3.11.7, 3.12.1 and 3.13.0.

Java:
    The claim is the usual JDBC one, ``SELECT ... FOR UPDATE SKIP LOCKED`` then
    ``UPDATE`` in one short transaction; Proletarian runs the same query but keeps its
    transaction open for the whole job. The listener is PgJDBC's
    ``PGConnection.getNotifications(timeout)`` loop on a dedicated connection, and the
    reconnect loop is what a connection pool's validation and retry do for a JDBC worker.

See also:
    ``patterns.jobqueue.store`` (the protocol and the state diagram),
    ``patterns.jobqueue.sqlite`` (the same contract in one file, for one machine),
    ``patterns.jobqueue.postgres_connection`` (the connection, retries and migrations),
    ``patterns.jobqueue.postgres_admin`` (the operator's methods and the worker rows),
    ``patterns.jobqueue.postgres_schema`` (every table and statement, as SQL text),
    ``patterns.jobqueue.postgres_listen`` (the ``LISTEN`` thread behind `PostgresStore.subscribe`),
    ``docs/jobqueue/many_machines.md`` (topology, leases, clocks, rolling deploys).

Docs: docs/jobqueue/many_machines.md
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from types import ModuleType
from typing import TYPE_CHECKING, Any

from patterns.jobqueue.postgres_admin import PostgresAdmin
from patterns.jobqueue.postgres_connection import Database, StoreSchemaError
from patterns.jobqueue.postgres_listen import Listener
from patterns.jobqueue.postgres_schema import (
    MIGRATIONS,
    SETTLE_ROWS,
    SINGLE,
    STATEMENTS,
    check_timestamp,
    settle_names,
)
from patterns.jobqueue.store import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Claim,
    CommitUnknown,
    JobState,
    NewJob,
    Settle,
    Settlement,
    StoreUnavailable,
    cancelled_reason,
    check_lease,
    check_limit,
    check_max_payload_bytes,
    check_owner,
    check_share,
    expired_reason,
    job_from_row,
    new_token,
    prepare_enqueue,
    prepare_many,
    prepare_settlement,
)

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

__all__ = [
    "RETRIES",
    "SCHEMA_VERSION",
    "CommitUnknown",  # defined in patterns.jobqueue.store, with the protocol; re-exported
    "PostgresStore",
    "StoreSchemaError",
    "StoreUnavailable",  # the same
    "is_postgres_url",
]

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 2
"""The schema this code writes; kept in the ``schema_version`` table of the store's schema.

Version 2 added the ``cancelled`` state, the job columns ``timeout``, ``result`` and
``cancel_requested``, and the ``workers`` table; opening a version 1 schema migrates it.
"""

RETRIES = 5
"""Attempts of one store call while the connection keeps failing before ``COMMIT``."""

_BACKOFF = 0.1  # seconds before the first retry; doubles each time, plus jitter
_MAX_ATTEMPTS = 2**31 - 1  # the integer column's range
# The NOTIFY channel is "patterns.jobqueue.<schema>", and a channel name has 63 bytes at most.
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,44}")
_URL_SCHEMES = ("postgresql://", "postgres://")

assert len(MIGRATIONS) == SCHEMA_VERSION  # a new schema version needs its migration


def is_postgres_url(text: str) -> bool:
    """True for a ``postgresql://`` (or ``postgres://``) URL, which `PostgresStore` takes."""
    return text.startswith(_URL_SCHEMES)


def _import_psycopg() -> ModuleType:
    try:
        return importlib.import_module("psycopg")
    except ImportError as exc:
        raise ImportError(
            "PostgresStore needs psycopg 3, an optional dependency: "
            "pip install 'shutdown-patterns[postgres]'"
        ) from exc


def _check_job(new: NewJob, *, absolute: bool) -> NewJob:
    if new.max_attempts > _MAX_ATTEMPTS:
        raise ValueError(f"max_attempts must be at most {_MAX_ATTEMPTS}, got {new.max_attempts}")
    check_timestamp("run_at" if absolute else "delay", new.run_at)
    return new


class PostgresStore(PostgresAdmin):
    """A ``Store`` in the PostgreSQL database at ``dsn``, shared by any number of machines.

    Args:
        dsn: a libpq connection string or ``postgresql://`` URL. The store adds
            ``application_name=patterns.jobqueue``, ``connect_timeout=5``, TCP
            keepalives and ``idle_in_transaction_session_timeout=10s`` unless the DSN
            sets them.
        schema: the PostgreSQL schema holding the store's tables, created (with the
            current schema version) on first use; one queue per schema.
        clock: leave it None. Given, it replaces the database's ``now()`` in every
            statement (the SQL is unchanged, only a parameter differs), so a test can move
            time without sleeping, as with the other stores. A store given a clock is
            only as right as that clock: never use one with workers on several machines.
        stop_timeout: `close`'s default budget, in seconds, for the listener thread to end
            (5 s: longer than a connection attempt to an unreachable server takes).
        max_payload_bytes: the largest payload (and result) JSON text accepted, in bytes.
        create: False for commands that only read: a schema without a job store then
            raises `StoreSchemaError` ("no such queue") and nothing is created.

    The constructor connects, checks or creates the schema, and raises
    `~patterns.jobqueue.store.StoreUnavailable` if the server cannot be reached within
    ``RETRIES`` attempts, `StoreSchemaError` if the schema is not usable, and `ImportError`
    naming the extra to install if psycopg is missing.

    A time a caller passes in, a retry's ``run_at`` or a worker row's ``started_at``, is on
    the database's clock: a worker reads it from `clock`.

    One connection serves every call, guarded by a lock, as in ``SQLiteStore``: every call
    is one short transaction, so a connection per thread would mostly add connections to
    the server's limit. Subscribers add a second connection, for ``LISTEN``, read by a
    daemon thread (`PostgresStore.subscribe`).

    The store is a resource, not a service: the constructor opens it and `close` releases
    it, as with a file or a connection, and as every ``Store`` does. It has no life of its
    own to start: the one thread it owns, the listener, starts with the first subscriber,
    and `close` stops it within ``stop_timeout``.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "jobqueue",
        clock: Callable[[], float] | None = None,
        stop_timeout: float = 5.0,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        create: bool = True,
    ) -> None:
        if stop_timeout < 0:
            raise ValueError(f"stop_timeout must not be negative, got {stop_timeout}")
        self.stop_timeout = stop_timeout
        self._max_payload_bytes = check_max_payload_bytes(max_payload_bytes)
        self._pg = _import_psycopg()
        if not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema):
            raise ValueError(
                "schema must be a lower-case identifier (letters, digits, _; at most 45), "
                f"got {schema!r}"
            )
        # The one connection every call shares, one transaction at a time (postgres_connection).
        self._db = Database(
            self._pg,
            dsn,
            schema,
            clock=clock,
            create=create,
            version=SCHEMA_VERSION,
            retries=RETRIES,
            first_pause=_BACKOFF,
            check_open=self._check_open,
        )
        self._where = self._db.where
        # The composed statements, and the thread-local that settle_and_claim's transaction
        # sets: the connection's, named here as the methods below use them.
        self._statements, self._settle_sql = self._db.statements, self._db.settle_sql
        self._shared = self._db.shared
        self._schema = schema
        self._test_clock = clock
        if clock is not None:
            logger.warning(
                "%s: a clock was given, so the database clock is not used: tests only",
                self._where,
            )
        self._channel = f"patterns.jobqueue.{schema}"
        # The wake-up feed: LISTEN on a connection of its own, in a thread started by the
        # first subscribe() or wait_for_notify() (postgres_listen).
        self._listener = Listener(
            self._pg,
            self._db.conninfo,
            self._channel,
            name=f"jobqueue-listener-{schema}",
            where=self._where,
            first_pause=_BACKOFF,
            check_open=self._check_open,
        )

        try:
            self._transaction(lambda conn, clock: None)  # connect, create or check the schema
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"PostgresStore({self._where!r}, closed={self._db.closed})"

    @property
    def schema(self) -> str:
        """The PostgreSQL schema holding the store's tables."""
        return self._schema

    def _check_open(self) -> None:
        if self._db.closed:
            raise RuntimeError(f"{self!r} is closed")

    # --- the Store protocol ----------------------------------------------------------------

    def _insert(self, prepared: list[tuple[NewJob, bool]]) -> list[int]:
        """Insert validated jobs (each with "is its run_at absolute?") in one transaction."""

        def body(conn: psycopg.Connection[tuple[Any, ...]], clock: float | None) -> list[int]:
            rows = conn.execute(
                self._statements["insert"],
                {
                    "clock": clock,
                    "tasks": [new.task for new, _ in prepared],
                    "payloads": [new.payload_json for new, _ in prepared],
                    "run_ats": [new.run_at if absolute else None for new, absolute in prepared],
                    "delays": [None if absolute else new.run_at for new, absolute in prepared],
                    "max_attempts": [new.max_attempts for new, _ in prepared],
                    "timeouts": [new.timeout for new, _ in prepared],
                },
            ).fetchall()
            if rows:
                self._notify(conn)
            # Ids come from the identity sequence in insertion order, which follows the
            # input order (ORDER BY t.n): sorted ids are the jobs in the order given.
            return sorted(int(row[0]) for row in rows)

        return self._transaction(body)

    def _enqueue(self, spec: Mapping[str, Any]) -> int:
        # now=0.0: a delay is added to the database's clock in SQL, not to ours.
        new = prepare_enqueue(0.0, **spec, max_payload_bytes=self._max_payload_bytes)
        absolute = spec["run_at"] is not None
        (job_id,) = self._insert([(_check_job(new, absolute=absolute), absolute)])
        logger.debug("%s: enqueued job %d (%s)", self._where, job_id, spec["task"])
        return job_id

    def enqueue_many(self, jobs: Sequence[Mapping[str, Any]]) -> list[int]:
        prepared = []
        for index, (new, spec) in enumerate(
            zip(prepare_many(0.0, jobs, self._max_payload_bytes), jobs, strict=True)
        ):
            absolute = spec.get("run_at") is not None
            try:
                prepared.append((_check_job(new, absolute=absolute), absolute))
            except ValueError as exc:
                raise ValueError(f"job #{index}: {exc}") from exc
        ids = self._insert(prepared)
        logger.debug("%s: enqueued %d jobs", self._where, len(ids))
        return ids

    def claim(self, owner: str, *, lease: float, limit: int = 1) -> list[Claim]:
        """`~patterns.jobqueue.store.Store.claim`, on the database's clock (its ``now``).

        Rows that another transaction holds locked at this moment are skipped, never
        waited for (``SKIP LOCKED``).
        """
        check_owner(owner)
        seconds = check_timestamp("lease", check_lease(lease))
        count = check_limit(limit)
        cancel_reason = cancelled_reason("and its lease expired")

        def body(conn: psycopg.Connection[tuple[Any, ...]], clock: float | None) -> list[Claim]:
            statements = self._statements
            cancelled = conn.execute(
                statements["cancel_expired"], {"clock": clock, "error": cancel_reason}
            ).rowcount
            if cancelled:
                logger.warning("%s: %d jobs %s", self._where, cancelled, cancel_reason)
            spent = conn.execute(statements["spent"], {"clock": clock}).fetchall()
            if spent:  # all in one statement: a claim's round trips do not grow with them
                reasons = [expired_reason(attempts) for _, attempts in spent]
                conn.execute(
                    statements["fail_spent"],
                    {"clock": clock, "ids": [row[0] for row in spent], "errors": reasons},
                )
                for (job_id, _), reason in zip(spent, reasons, strict=True):
                    logger.warning("%s: job %d failed: %s", self._where, job_id, reason)
            due = conn.execute(statements["due"], {"clock": clock, "limit": count}).fetchall()
            if not due:
                return []
            for job_id, state, old_owner in due:
                if state == JobState.RUNNING:
                    logger.warning(
                        "%s: job %d: lease of %s expired, claiming it again",
                        self._where,
                        job_id,
                        old_owner,
                    )
            rows = conn.execute(
                statements["take"],
                {
                    "clock": clock,
                    "lease": seconds,
                    "ids": [row[0] for row in due],
                    "tokens": [new_token(owner) for _ in due],
                },
            ).fetchall()
            jobs = sorted((job_from_row(row) for row in rows), key=lambda j: (j.run_at, j.id))
            return [Claim(job, job.lease_owner or "", job.lease_until or 0.0) for job in jobs]

        return self._transaction(body)

    def settle_and_claim(
        self, items: Sequence[Settlement], owner: str, *, lease: float, limit: int
    ) -> tuple[list[bool | Exception], list[Claim]]:
        """`~patterns.jobqueue.store.Store.settle_and_claim` in one transaction: one ``COMMIT``.

        `settle_many` and `claim` run their own code, joined to this transaction, so the
        claim is the same ``SKIP LOCKED`` claim; a connection lost before ``COMMIT`` retries
        the whole of it, during ``COMMIT`` raises `~patterns.jobqueue.store.CommitUnknown`.
        """
        count = check_share(items, owner, lease, limit)
        if count is None:
            return [], []
        if count:
            check_timestamp("lease", lease)

        def body(
            conn: psycopg.Connection[tuple[Any, ...]], clock: float | None
        ) -> tuple[list[bool | Exception], list[Claim]]:
            self._shared.txn = (conn, clock)
            try:
                done = self.settle_many(items)
                claims = self.claim(owner, lease=lease, limit=count) if count else []
            finally:
                self._shared.txn = None
            return done, claims

        return self._transaction(body)

    def _settle_one(self, claim: Claim, kind: Settle, text: str | None, when: float) -> bool:
        """Apply one checked outcome only while the claim holds the lease; notify on release."""
        params: dict[str, Any]
        if kind is Settle.COMPLETE:
            params = {"result": text}
        elif kind is Settle.RETRY:
            run_at = check_timestamp("run_at", when)
            gave_back = cancelled_reason("and its worker gave it back")
            params = {"error": text, "run_at": run_at, "cancelled": gave_back}
        elif kind is Settle.RELEASE:
            params = {"cancelled": cancelled_reason("and its worker gave it back")}
        else:
            params = {"error": text}
        outcome = SINGLE[kind]

        def body(conn: psycopg.Connection[tuple[Any, ...]], clock: float | None) -> bool:
            cursor = conn.execute(
                self._settle_sql[outcome],
                {"clock": clock, "id": claim.job.id, "token": claim.token, **params},
            )
            held = cursor.rowcount == 1
            if held and outcome == "release":
                self._notify(conn)  # due again now: another idle worker may take it
            return held

        held = self._transaction(body)
        if not held:
            logger.info(
                "%s: job %d: claim %s no longer holds the lease",
                self._where,
                claim.job.id,
                claim.token,
            )
        return held

    def retry(self, claim: Claim, error: str, *, run_at: float) -> bool:
        """`~patterns.jobqueue.store.Store.retry`; ``run_at`` is on the database's clock.

        A worker computes it from `clock`.
        """
        return super().retry(claim, error, run_at=run_at)

    def settle_many(self, items: Sequence[Settlement]) -> list[bool | Exception]:
        """`~patterns.jobqueue.store.Store.settle_many` in one ``UPDATE ... FROM (VALUES ...)``.

        A retry's ``run_at`` is also checked against PostgreSQL's range before the
        transaction. The statement fences each row by its own token (one statement per
        ``SETTLE_ROWS`` items; one item takes its single-job statement), then one ``COMMIT``:
        a batch of up to that many costs the round trips of a single call (``BEGIN``, the
        statement, ``COMMIT``). A release that applied sends one ``NOTIFY``. The connection
        breaking before ``COMMIT`` is retried; during ``COMMIT`` it raises
        `~patterns.jobqueue.store.CommitUnknown`, as for a single call.
        """
        if not items:
            return []
        done: list[bool | Exception] = []
        sent: dict[tuple[int, str], int] = {}  # (job id, token) -> the index of its item
        rows: list[tuple[int, str, str, str | None, str | None, float]] = []
        for index, item in enumerate(items):
            try:
                kind, text, when = prepare_settlement(item, self._max_payload_bytes)
                if kind is Settle.RETRY:
                    check_timestamp("run_at", when)
            except (TypeError, ValueError) as exc:
                done.append(exc)
                continue
            done.append(False)
            key = (item.claim.job.id, item.claim.token)
            if key in sent:
                continue  # the same claim again: the first item ends its lease, this is False
            sent[key] = index
            result, error = (text, None) if kind is Settle.COMPLETE else (None, text)
            rows.append((*key, kind.value, result, error, when))
        if not rows:
            return done
        reason = cancelled_reason("and its worker gave it back")

        def body(
            conn: psycopg.Connection[tuple[Any, ...]], clock: float | None
        ) -> list[tuple[Any, ...]]:
            common = {"clock": clock, "cancelled": reason}
            if len(rows) == 1:  # the single-job statement: the same change, a simpler plan
                (job_id, token, kind, result, error, when) = rows[0]
                single = {"id": job_id, "token": token, "result": result, "error": error}
                cursor = conn.execute(
                    self._settle_sql[SINGLE[Settle(kind)]], {**common, **single, "run_at": when}
                )
                applied = [rows[0][:3]] if cursor.rowcount == 1 else []
            else:
                applied = []
                for start in range(0, len(rows), SETTLE_ROWS):
                    chunk = rows[start : start + SETTLE_ROWS]
                    params = dict(common)
                    for n, row in enumerate(chunk):
                        params.update(zip(settle_names(n), row, strict=True))
                    statement = self._settle_statement(len(chunk))
                    applied += conn.execute(statement, params).fetchall()
            if any(kind == Settle.RELEASE for _, _, kind in applied):
                self._notify(conn)  # due again now: another idle worker may take it
            return applied

        for job_id, token, _ in self._transaction(body):
            done[sent.pop((int(job_id), token))] = True
        for job_id, token in sent:
            logger.info(
                "%s: job %d: claim %s no longer holds the lease", self._where, job_id, token
            )
        return done

    def _settle_statement(self, count: int) -> sql.Composed:
        """settle_many's statement for ``count`` items; call in a transaction (it adds it).

        One text per count, so that each gets its own prepared statement whose plan knows
        how many rows it joins: the plan is made once per count, not at every call.
        """
        name = f"settle_many {count}"  # made on first use, kept with the other statements
        statement = self._statements.get(name)
        if statement is None:
            from psycopg import sql  # noqa: PLC0415 - psycopg is optional: imported on use

            values = ", ".join(
                "({}::bigint, {}::text, {}::text, {}::text, {}::text, {}::float8)".format(
                    *(f"%({param})s" for param in settle_names(n))
                )
                for n in range(count)
            )
            statement = self._db.compose(STATEMENTS["settle_many"], values=sql.SQL(values))
            self._statements[name] = statement
        return statement

    def renew(self, claim: Claim, *, lease: float) -> Claim | None:
        seconds = check_timestamp("lease", check_lease(lease))

        def body(conn: psycopg.Connection[tuple[Any, ...]], clock: float | None) -> Claim | None:
            row = conn.execute(
                self._statements["renew"],
                {"clock": clock, "lease": seconds, "id": claim.job.id, "token": claim.token},
            ).fetchone()
            if row is None:
                return None
            until, updated, flag = float(row[0]), float(row[1]), bool(row[2])
            job = replace(claim.job, lease_until=until, updated_at=updated)
            return Claim(job, claim.token, until, flag)

        renewed = self._transaction(body)
        if renewed is None:
            logger.info(
                "%s: job %d: claim %s lost its lease, not renewed",
                self._where,
                claim.job.id,
                claim.token,
            )
        return renewed

    def next_due(self) -> float | None:
        row = self._transaction(
            lambda conn, clock: conn.execute(self._statements["next_due"]).fetchone()
        )
        return None if row is None or row[0] is None else float(row[0])

    # --- time -----------------------------------------------------------------------------

    def clock(self) -> float:
        """The database's time now, in seconds since the epoch: a worker's ``clock``.

        One round trip (``clock_timestamp()``), no retry. If the database cannot be read
        it returns the local time corrected by the offset measured at the last reading,
        and never raises: a worker computing a retry's run time must not fail because of
        it. With a test clock, that clock's reading.
        """
        if self._test_clock is not None:
            return self._test_clock()
        return self._db.clock()

    # --- wake-ups ---------------------------------------------------------------------------

    def subscribe(self, callback: Callable[[], object]) -> Callable[[], None]:
        """`~patterns.jobqueue.store.Store.subscribe` through ``LISTEN`` on a connection of its own.

        The callback is called from the store's listener thread after every commit that
        enqueued or released a job in this schema, from any connection on any machine, and
        each time the listener has (re)started listening, because a notification may have
        been missed before. An exception from it is logged and ignored.

        The first subscription starts the listener: a daemon thread with its own
        connection that reconnects with backoff when the connection is lost. It runs
        until `close`. If that thread cannot start, this raises and subscribes nobody;
        the next call tries again.
        """
        return self._listener.subscribe(callback)

    def wait_for_notify(self, timeout: float) -> bool:
        """Block until a job may have become due, or ``timeout`` seconds; True if one may have.

        A notification that arrived since the last call returned True counts, so a loop
        of "claim until empty, then wait_for_notify" misses none. Meant for one such loop
        per store; a ``Worker`` uses `subscribe` instead, so that a stop ends its wait.
        """
        return self._listener.wait(timeout)

    # --- closing ------------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """Release the store's resources (connections, listener thread); idempotent.

        Waits up to ``timeout`` seconds (default ``stop_timeout``) for the listener thread
        to end; one still running then (a connection attempt, or a subscriber that does
        not return) is logged and left to end by itself: it is a daemon thread that only
        reads notifications. A negative ``timeout`` is a `ValueError`.
        """
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must not be negative, got {timeout}")
        budget = self.stop_timeout if timeout is None else timeout
        opened, conn = self._db.mark_closed()
        if not opened:
            return
        self._listener.close(budget)
        if conn is not None:
            conn.close()
