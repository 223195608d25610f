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
    A claim is one statement in autocommit, its own transaction of a few milliseconds:
    ``SELECT ... FOR UPDATE SKIP LOCKED`` picks the due rows no other claim is taking at
    that moment and an ``UPDATE`` marks them running under a lease (a fencing token and an
    expiry), both parts of one statement, with the outcomes a worker has to record when it
    has some: one round trip, one commit. No transaction is open while a handler runs: the
    lease protects the job, the heartbeat renews it, and every outcome is written only
    while the claim's token still holds it. Every timestamp is computed in SQL from the
    transaction's ``now()``, so the database server's clock is the only clock that
    matters. Each enqueue (and release) sends a ``NOTIFY`` from its own statement, delivered
    when it commits; a listener thread on its own connection turns it into a call to each
    `PostgresStore.subscribe` callback, which a ``Worker`` uses to end its idle wait.
    `PostgresStore.enqueue_in` runs the enqueue in the caller's transaction (an outbox).
    A session the server closed is found before a statement is sent, and reconnected;
    a statement that fails because the connection broke before ``COMMIT`` was sent changed
    nothing, so the store reconnects and retries it with backoff; a break during
    ``COMMIT``, or while a statement that is its own commit runs, leaves the outcome
    unknown and raises `~patterns.jobqueue.stores.records.CommitUnknown`, which the worker handles
    like any failed store call (the lease brings the job back). The schema lives in its
    own PostgreSQL schema with a version table, created and migrated under an advisory
    lock.

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
    * A call that raises `~patterns.jobqueue.stores.records.StoreUnavailable` (other than
      `~patterns.jobqueue.stores.records.CommitUnknown`) changed nothing. Connection loss is
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
    ``UPDATE``, here in one statement; Proletarian runs the same query but keeps its
    transaction open for the whole job. The listener is PgJDBC's
    ``PGConnection.getNotifications(timeout)`` loop on a dedicated connection, and the
    reconnect loop is what a connection pool's validation and retry do for a JDBC worker.

See also:
    ``patterns.jobqueue.stores.protocol`` (the protocol and the state diagram),
    ``patterns.jobqueue.stores.sqlite.store`` (the same contract in one file, for one machine),
    ``patterns.jobqueue.stores.postgres.connection`` (the connection, retries and migrations),
    ``patterns.jobqueue.stores.postgres.enqueue`` (enqueue, enqueue_many and the outbox),
    ``patterns.jobqueue.stores.postgres.admin`` (the operator's methods and the worker rows),
    ``patterns.jobqueue.stores.postgres.schema`` (every table and statement, as SQL text),
    ``patterns.jobqueue.stores.postgres.listen`` (the ``LISTEN`` thread behind
    `PostgresStore.subscribe`), ``docs/jobqueue/many_machines.md`` (topology, leases, clocks,
    rolling deploys).

Docs: docs/jobqueue/many_machines.md
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from types import ModuleType
from typing import TYPE_CHECKING, Any

from patterns.jobqueue.stores.checks import (
    cancelled_reason,
    check_lease,
    check_limit,
    check_max_payload_bytes,
    check_owner,
    check_share,
    expired_reason,
    new_token,
    prepare_settlement,
)
from patterns.jobqueue.stores.postgres.connection import Database, StoreSchemaError
from patterns.jobqueue.stores.postgres.enqueue import PostgresEnqueue
from patterns.jobqueue.stores.postgres.listen import Listener
from patterns.jobqueue.stores.postgres.schema import (
    MIGRATIONS,
    SETTLE_ROWS,
    check_timestamp,
    settle_claim_text,
    settle_params,
)
from patterns.jobqueue.stores.records import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Claim,
    CommitUnknown,
    JobState,
    Settle,
    Settlement,
    StoreUnavailable,
    job_from_row,
)

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

__all__ = [
    "RETRIES",
    "SCHEMA_VERSION",
    "CommitUnknown",  # defined in patterns.jobqueue.stores.records, with the records; re-exported
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
# The NOTIFY channel is "patterns.jobqueue.<schema>", and a channel name has 63 bytes at most.
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,44}")
_URL_SCHEMES = ("postgresql://", "postgres://")

assert len(MIGRATIONS) == SCHEMA_VERSION  # a new schema version needs its migration

Params = dict[str, Any]
_Row = tuple[int, str, str, str | None, str | None, float]  # one settle_many item, checked
_CANCEL_EXPIRED = cancelled_reason("and its lease expired")
_GIVEN_BACK = (Settle.RETRY.value, Settle.RELEASE.value)  # back in the queue: claimable
# expired_reason() as a format() string for SQL, where the attempts are known.
_MARK = 987654321
_SPENT = expired_reason(_MARK).replace(str(_MARK), "%s")


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


class PostgresStore(PostgresEnqueue):
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
    `~patterns.jobqueue.stores.records.StoreUnavailable` if the server cannot be reached within
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
        # The composed statements: the connection's, named here as the methods below use them.
        self._statements = self._db.statements
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

    # --- the worker's path (enqueue.py adds jobs; admin.py has the operator's methods) ---

    def claim(self, owner: str, *, lease: float, limit: int = 1) -> list[Claim]:
        """`~.Store.claim`, on the database's clock (its ``now``).

        One statement in autocommit, no ``BEGIN``/``COMMIT``. Rows that another
        transaction holds locked at this moment are skipped, never waited for (``SKIP
        LOCKED``).
        """
        check_owner(owner)
        seconds = check_timestamp("lease", check_lease(lease))
        return self._settle_and_claim([], owner, seconds, check_limit(limit))[1]

    def settle_and_claim(
        self, items: Sequence[Settlement], owner: str, *, lease: float, limit: int
    ) -> tuple[list[bool | Exception], list[Claim]]:
        """`~.Store.settle_and_claim` in ONE statement, autocommit.

        The outcomes and the claim are parts of one statement (common table expressions),
        so they commit together, with no ``BEGIN`` or ``COMMIT`` round trip; the claim is
        the same ``SKIP LOCKED`` claim and leaves the settled rows alone. A connection lost
        while it runs raises `~patterns.jobqueue.stores.records.CommitUnknown`.
        """
        count = check_share(items, owner, lease, limit)
        if count is None:
            return [], []
        if count:
            check_timestamp("lease", lease)
        return self._settle_and_claim(items, owner, lease, count)

    def _settle_one(self, claim: Claim, kind: Settle, text: str | None, when: float) -> bool:
        """Apply one checked outcome only while the claim holds the lease; notify on release."""
        if kind is Settle.RETRY:
            check_timestamp("run_at", when)
        result, error = (text, None) if kind is Settle.COMPLETE else (None, text)
        row = (claim.job.id, claim.token, kind.value, result, error, when)
        held = bool(self._run([row], None, 0.0, 0)[0])
        if not held:
            logger.info(
                "%s: job %d: claim %s no longer holds the lease",
                self._where,
                claim.job.id,
                claim.token,
            )
        return held

    def retry(self, claim: Claim, error: str, *, run_at: float) -> bool:
        """`~.Store.retry`; ``run_at`` is on the database's clock.

        A worker computes it from `clock`.
        """
        return super().retry(claim, error, run_at=run_at)

    def settle_many(self, items: Sequence[Settlement]) -> list[bool | Exception]:
        """`~.Store.settle_many` in one ``UPDATE ... FROM (VALUES ...)``.

        A retry's ``run_at`` is also checked against PostgreSQL's range first. The
        statement fences each row by its own token and sends one ``NOTIFY`` if a release
        applied; up to ``SETTLE_ROWS`` items it is one statement in autocommit, its own
        transaction (no ``BEGIN`` or ``COMMIT``), and more items take one statement per
        ``SETTLE_ROWS`` in one transaction. A connection that breaks while the statement
        (or the ``COMMIT``) runs raises `~patterns.jobqueue.stores.records.CommitUnknown`; one
        found broken before is reconnected and the call retried.
        """
        if not items:
            return []
        return self._settle_and_claim(items, "", 0.0, 0)[0]

    def _settle_and_claim(
        self, items: Sequence[Settlement], owner: str, lease: float, count: int
    ) -> tuple[list[bool | Exception], list[Claim]]:
        """Settle ``items`` (checked here, each alone) and claim ``count`` jobs: one statement."""
        done: list[bool | Exception] = []
        sent: dict[tuple[int, str], int] = {}  # (job id, token) -> the index of its item
        rows: list[_Row] = []
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
        if not rows and not count:
            return done, []
        applied, claims = self._run(rows, owner, lease, count)
        for job_id, token in applied:
            done[sent.pop((job_id, token))] = True
        for job_id, token in sent:
            logger.info(
                "%s: job %d: claim %s no longer holds the lease", self._where, job_id, token
            )
        return done, claims

    def _run(
        self, rows: list[_Row], owner: str | None, lease: float, count: int
    ) -> tuple[list[tuple[int, str]], list[Claim]]:
        """The settle-and-claim statement(s): which (id, token) applied, and the claims.

        One statement, unless there are more than ``SETTLE_ROWS`` items, or a retry or a
        release must be claimable by the claim that follows it (a statement cannot see
        its own changes): then one transaction runs the claim after the outcomes.
        """
        plan = [(rows[i : i + SETTLE_ROWS], False) for i in range(0, len(rows), SETTLE_ROWS)]
        if count:
            given_back = any(row[2] in _GIVEN_BACK for row in rows)
            if plan and not given_back:
                plan[-1] = (plan[-1][0], True)
            else:
                plan.append(([], True))
        common: Params = {
            "cancelled": cancelled_reason("and its worker gave it back"),
            "channel": self._channel,
        }
        if count:
            common.update(
                limit=count,
                lease=lease,
                tokens=[new_token(owner or "") for _ in range(count)],
                cancel_error=_CANCEL_EXPIRED,
                spent_error=_SPENT,
            )

        def body(
            conn: psycopg.Connection[tuple[Any, ...]], clock: float | None
        ) -> list[list[tuple[Any, ...]]]:
            results = []
            for chunk, claim in plan:
                params = {**common, "clock": clock, **(settle_params(chunk) if chunk else {})}
                statement = self._statement(bool(chunk), claim=claim)
                results.append(conn.execute(statement, params).fetchall())
            return results

        results = self._transaction(body, "statement" if len(plan) == 1 else "transaction")
        # Every row of a statement's result repeats what it settled: read the first.
        applied = [(int(i), str(t)) for rs in results if rs[0][0] for i, t, _ in rs[0][0]]
        if not count:
            return applied, []
        last = results[-1]
        if last[0][2]:
            logger.warning("%s: %d jobs %s", self._where, last[0][2], _CANCEL_EXPIRED)
        for job_id, attempts in last[0][3] or []:
            logger.warning("%s: job %d failed: %s", self._where, job_id, expired_reason(attempts))
        taken = [r for r in last if r[4] is not None]
        for r in taken:
            if r[-2] == JobState.RUNNING:
                logger.warning(
                    "%s: job %d: lease of %s expired, claiming it again", self._where, r[4], r[-1]
                )
        jobs = sorted((job_from_row(r[4:-2]) for r in taken), key=lambda j: (j.run_at, j.id))
        return applied, [Claim(job, job.lease_owner or "", job.lease_until or 0.0) for job in jobs]

    def _statement(self, settle: bool, *, claim: bool) -> sql.Composed:
        """The statement settling items if ``settle`` (and claiming, if ``claim``); call locked.

        Three texts in all, whatever the batch's size, so each is prepared once.
        """
        name = f"settle {settle} claim {claim}"  # made on first use, kept with the others
        statement = self._statements.get(name)
        if statement is None:
            statement = self._db.compose(settle_claim_text(settle, claim=claim))
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

        renewed = self._transaction(body, "statement")
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
            lambda conn, clock: conn.execute(self._statements["next_due"]).fetchone(), "read"
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
        """`~.Store.subscribe` through ``LISTEN`` on a connection of its own.

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
