"""The connection of `~.PostgresStore`: one transaction at a time.

A `Database` holds the store's one connection, shared by every thread under a lock, and
runs each store call as one short transaction: it reconnects when the connection was
lost, retries a transaction that failed before ``COMMIT`` was sent (it changed nothing),
and raises `~patterns.jobqueue.stores.records.CommitUnknown` when the connection broke during
``COMMIT``. On its first connection it creates or migrates the store's schema under an
advisory lock, and checks that the schema's tables are a job store's. It also reads the
database's clock, the one clock of every due time and lease.

Docs: docs/jobqueue/many_machines.md
"""

from __future__ import annotations

import hashlib
import logging
import math
import select
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from patterns.jobqueue.stores.checks import backoff
from patterns.jobqueue.stores.deadline import acquire, current, give_up, time_left
from patterns.jobqueue.stores.postgres.schema import (
    COLUMNS,
    MIGRATIONS,
    NOW,
    SHAPES,
    STATEMENTS,
)
from patterns.jobqueue.stores.records import CommitUnknown, StoreUnavailable

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

# StoreSchemaError is defined here, where the schema checks raise it, and documented where
# programs import it from: patterns.jobqueue.stores.postgres.store.
__all__ = ["Database"]

# The store's own logger: everything a PostgresStore says is under one name.
logger = logging.getLogger(__name__)

T = TypeVar("T")

# How Database.transaction runs its body: see there.
Mode = Literal["transaction", "statement", "read"]

# One statement of the schema check, kept to the thread's deadline (Database._prepare).
_Execute = Callable[..., "psycopg.Cursor[tuple[Any, ...]]"]

# libpq settings the store adds when the DSN does not set them: give up on a connection
# attempt after 5 s, and notice a silently dead peer through TCP keepalives within a minute.
_CONNECT_DEFAULTS = {
    "application_name": "patterns.jobqueue",
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
}

# Marks the log records of a retry (the warning before it, the reconnection after it): a
# command-line tool that reports only the outcome filters them out; a worker logs them.
_RETRY = {"retry": True}

# A store never leaves a transaction idle, so a session that does belongs to a stalled
# process (paused, swapped out, stopped between two statements): the server ends it after
# 10 s, instead of letting its row locks hide those jobs from every claim (SKIP LOCKED).
_IDLE_IN_TRANSACTION = "-c idle_in_transaction_session_timeout=10000"

_IDLE_READS = 3  # reads of an idle session's socket before a statement, at most (_alive)

# The largest statement_timeout and lock_timeout PostgreSQL accepts (milliseconds, an int:
# about 24.8 days); a longer deadline is as good as none for one statement.
_MAX_TIMEOUT_MS = 2**31 - 1


class _Retry(Exception):
    """One try of a transaction failed in a way a retry can help with (``error``)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


class StoreSchemaError(RuntimeError):  # re-exported by patterns.jobqueue.stores.postgres.store
    """The PostgreSQL schema cannot be used as a job store: not ours, or too new."""

    # Users import it from, and the docs document it with, the store's module.
    __module__ = "patterns.jobqueue.stores.postgres.store"


def _advisory_key(schema: str) -> int:
    """A stable 64-bit advisory lock key for migrating ``schema``."""
    digest = hashlib.sha256(f"patterns.jobqueue:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class Database:
    """The store's connection to the database at ``dsn``, for the tables of ``schema``.

    Args:
        pg: the ``psycopg`` module (imported by the store: psycopg is optional).
        dsn: a libpq connection string or ``postgresql://`` URL; libpq settings the store
            needs (a connection timeout, TCP keepalives, an idle-in-transaction timeout) are
            added unless it sets them.
        schema: the PostgreSQL schema holding the store's tables.
        clock: the test clock, or None for the database's ``now()``.
        create: False to refuse a schema without a job store
            (`~patterns.jobqueue.stores.postgres.store.StoreSchemaError`) instead of creating one.
        version: the schema version this code writes (migrated to on first connection).
        retries: attempts of one transaction while the connection keeps failing.
        first_pause: seconds before the first retry; doubles each time, plus jitter.
        check_open: raises if the store is closed; called before every attempt.

    Nothing connects before the first `transaction`. ``dsn`` is parsed here: a
    `ValueError` that never quotes it if it is not one.
    """

    def __init__(
        self,
        pg: ModuleType,
        dsn: str,
        schema: str,
        *,
        clock: Callable[[], float] | None,
        create: bool,
        version: int,
        retries: int,
        first_pause: float,
        check_open: Callable[[], None],
    ) -> None:
        from psycopg import conninfo, sql  # noqa: PLC0415 - psycopg is optional: imported on use

        self._pg = pg
        self._schema = schema
        self._test_clock = clock
        self._create = create
        self._version = version
        self._retries = retries
        self._first_pause = first_pause
        self._check_open = check_open
        try:
            params = conninfo.conninfo_to_dict(dsn)
        except self._pg.ProgrammingError:
            # libpq's message may quote any part of the string, the password included.
            raise ValueError(
                "not a valid PostgreSQL connection string or postgresql:// URL"
            ) from None
        for key, value in _CONNECT_DEFAULTS.items():
            params.setdefault(key, value)
        options = str(params.get("options") or "")
        if "idle_in_transaction_session_timeout" not in options:
            params["options"] = f"{options} {_IDLE_IN_TRANSACTION}".strip()
        self.conninfo = conninfo.make_conninfo("", **params)
        host = params.get("host") or "localhost"
        self.where = f"{params.get('user') or ''}@{host}:{params.get('port') or 5432}".lstrip("@")
        self.where += f"/{params.get('dbname') or ''} schema {schema}"
        self._names = {
            "schema": sql.Identifier(schema),
            "jobs": sql.Identifier(schema, "jobs"),
            "workers": sql.Identifier(schema, "workers"),
            "version": sql.Identifier(schema, "schema_version"),
            "columns": sql.SQL(COLUMNS),
            "now": sql.SQL(NOW),
        }
        # The pieces of the settle-and-claim statement are composed per shape, on first use.
        pieces = {"settled", "expire", "due", "take"}
        self.statements = {
            name: self.compose(text) for name, text in STATEMENTS.items() if name not in pieces
        }
        self._migrations = [[self.compose(text) for text in step] for step in MIGRATIONS]

        # Guards _conn, closed, _prepared, _offset and the settle-and-claim statements that
        # the store's _statement adds to statements: held for every transaction (and its
        # reconnection), so the connection serves one thread at a time and close() cannot
        # pull it away mid-transaction. Never held during a retry's backoff sleep. The only
        # caller code run under it is the test clock, which must not call the store.
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None
        self.closed = False
        self._prepared = False
        self._connects = 0
        self._offset = 0.0  # database clock minus time.time(), from the last reading

    def _connected(self, began: float) -> psycopg.Connection[tuple[Any, ...]]:
        """The store's connection, (re)opened and prepared if needed; call with _lock held.

        The schema check keeps to the thread's deadlines, as a store call does: a stop
        during start-up must not wait behind a lock on the schema (`_prepare`).
        """
        old = self._conn
        if old is not None and not old.closed and not old.broken and self._alive(old):
            return old
        self._conn = None
        if old is not None:
            old.close()
        left = time_left(time.monotonic())
        extra: dict[str, Any] = {}
        if left is not None:  # under a deadline; libpq's shortest wait is 2 s
            extra["connect_timeout"] = max(
                2, min(int(_CONNECT_DEFAULTS["connect_timeout"]), math.ceil(left))
            )
        conn: psycopg.Connection[tuple[Any, ...]] = self._pg.connect(
            self.conninfo, autocommit=False, **extra
        )
        try:
            if not self._prepared:
                forget = self._cancel_at_deadlines(conn)
                try:
                    self._prepare(conn, began)
                finally:
                    for undo in forget:
                        undo()
                self._prepared = True
            self._read_offset(conn)
        except BaseException:
            conn.close()
            raise
        self._connects += 1
        if self._connects > 1:
            logger.warning(
                "%s: reconnected (connection %d)", self.where, self._connects, extra=_RETRY
            )
        self._conn = conn
        return conn

    def _alive(self, conn: psycopg.Connection[tuple[Any, ...]]) -> bool:
        """False if the server already closed the idle ``conn`` (its socket says so).

        A session the server ended (``pg_terminate_backend``, a restart) leaves its last
        message and the end of the stream in the socket; reading them now, without waiting,
        costs no round trip and finds the loss before a statement is sent, when a retry is
        still known to be safe. One that breaks later is caught as the statement fails.
        """
        try:
            # The server's last message, then the end of the stream: a read each.
            for _ in range(_IDLE_READS):
                readable, _, _ = select.select([conn.pgconn.socket], [], [], 0)
                if not readable:
                    break
                conn.pgconn.consume_input()  # raises once it reads the end of the stream
        except (OSError, self._pg.Error):
            return False
        return bool(conn.pgconn.status == self._pg.pq.ConnStatus.OK)

    def _read_offset(self, conn: psycopg.Connection[tuple[Any, ...]]) -> float:
        """Read the database clock; remember its offset from ``time.time()``."""
        before = time.time()
        row = conn.execute(self.statements["clock"]).fetchone()
        after = time.time()
        conn.commit()
        assert row is not None
        self._offset = float(row[0]) - (before + after) / 2
        return float(row[0])

    def transaction(
        self,
        body: Callable[[psycopg.Connection[tuple[Any, ...]], float | None], T],
        mode: Literal["transaction", "statement", "read"] = "transaction",
    ) -> T:
        """Run ``body(conn, clock)`` in one transaction, reconnecting when the connection failed.

        ``clock`` is the test clock's reading, or None for the database's ``now()``; it is
        read once per attempt. In the default ``mode``, ``"transaction"``, a failure before
        ``COMMIT`` was sent rolled the transaction back, so the attempt is retried (up to
        ``retries`` times, with backoff outside the lock); a failure during ``COMMIT``
        raises `~patterns.jobqueue.stores.records.CommitUnknown` at once.

        ``"statement"``: ``body`` sends one statement in autocommit, its own transaction,
        with no ``BEGIN`` or ``COMMIT`` round trip. An error the server reports rolled it
        back (retried as above when PostgreSQL asks to retry); a connection that breaks
        while it runs leaves it unknown (`~patterns.jobqueue.stores.records.CommitUnknown`), as a
        break during ``COMMIT`` does; one found closed before it is sent is reconnected
        first. ``"read"``: the same for a body that changes nothing, so a break is retried.
        Under a thread's deadline both run as ``"transaction"`` (the deadline's timeouts are
        set for the transaction).
        """
        last: Exception | None = None
        began = time.monotonic()
        for attempt in range(1, self._retries + 1):
            if time_left(began) == 0.0:
                raise give_up(f"{self.where}: {last}") from last
            acquire(self._lock, began, self.where)  # within this thread's deadline, if any
            try:
                self._check_open()
                return self._attempt(body, began, mode)
            except _Retry as retry:
                last = retry.error
            finally:
                self._lock.release()
            if attempt < self._retries:
                pause = backoff(self._first_pause, attempt)
                left = time_left(began)
                pause = pause if left is None else min(pause, left)
                logger.warning(
                    "%s: database unavailable (%s); retry %d of %d in %.2f s",
                    self.where,
                    " ".join(str(last).split()),
                    attempt,
                    self._retries - 1,
                    pause,
                    extra=_RETRY,
                )
                time.sleep(pause)
        raise StoreUnavailable(
            f"{self.where}: database unavailable after {self._retries} attempts: {last}"
        ) from last

    def _attempt(
        self,
        body: Callable[[psycopg.Connection[tuple[Any, ...]], float | None], T],
        began: float,
        mode: Mode,
    ) -> T:
        """One try of `transaction`, lock held; `_Retry` when retrying can help."""
        committing = False
        conn: psycopg.Connection[tuple[Any, ...]] | None = None
        forget: list[Callable[[], None]] = []
        autocommit = False
        try:
            conn = self._connected(began)
            forget = self._bound(conn, began)
            autocommit = mode != "transaction" and not forget
            clock = None if self._test_clock is None else self._test_clock()
            if autocommit:
                conn.autocommit = True  # client-side: no round trip
                committing = mode == "statement"  # the statement is its own commit
            try:
                result = body(conn, clock)
            except BaseException:
                if not autocommit:
                    self._rollback(conn)
                raise
            if not autocommit:
                committing = True
                conn.commit()
        except self._pg.Error as exc:
            if self._gave_up(exc):
                self._rollback_quietly(conn)
                if committing:
                    raise CommitUnknown(
                        f"{self.where}: COMMIT cancelled at the deadline ({exc}); "
                        "the transaction may or may not have been applied"
                    ) from exc
                raise give_up(f"{self.where}: {' '.join(str(exc).split())}") from exc
            if not self._is_transient(exc, conn):
                raise
            lost = conn is None or conn.closed or conn.broken
            self._drop(conn)
            if committing and lost:  # a server-reported error rolled the statement back
                during = "while its statement ran" if autocommit else "during COMMIT"
                raise CommitUnknown(
                    f"{self.where}: the connection broke {during} ({exc}); "
                    "the transaction may or may not have been applied"
                ) from exc
            raise _Retry(exc) from exc
        finally:
            for undo in forget:
                undo()
            if autocommit and conn is not None:
                self._manual(conn)
        return result

    def _manual(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        """Back to explicit transactions after one autocommit statement; drop it if it cannot."""
        if conn.closed or conn.broken:
            return
        try:
            conn.autocommit = False  # client-side: refused only in a transaction, never here
        except self._pg.Error:
            self._drop(conn)

    def _bound(
        self, conn: psycopg.Connection[tuple[Any, ...]], began: float
    ) -> list[Callable[[], None]]:
        """Keep this transaction to the thread's deadlines; return what undoes the set-up.

        Once a deadline is set, ``statement_timeout`` and ``lock_timeout`` (for this
        transaction only) end each statement by it; a statement still running when a
        deadline passes (it began before the deadline was set) is cancelled then.
        """
        if not current():
            return []
        self._keep_to(conn, began)
        return self._cancel_at_deadlines(conn)

    def _keep_to(self, conn: psycopg.Connection[tuple[Any, ...]], began: float) -> None:
        """End the transaction's next statements by the thread's deadline, if one is set.

        ``statement_timeout`` and ``lock_timeout`` for this transaction only; a deadline
        already passed gives up before the next statement is sent.
        """
        left = time_left(began)
        if left is None:
            return
        if left == 0.0:
            raise give_up(f"{self.where}: not tried")
        ms = str(min(_MAX_TIMEOUT_MS, max(1, math.ceil(left * 1000))))
        conn.execute(
            "SELECT set_config('statement_timeout', %s, true),"
            " set_config('lock_timeout', %s, true)",
            (ms, ms),
        )

    def _cancel_at_deadlines(
        self, conn: psycopg.Connection[tuple[Any, ...]]
    ) -> list[Callable[[], None]]:
        """Have a statement still running on ``conn`` cancelled at the thread's deadlines."""
        # cancel_safe (psycopg 3.2) does not block on a server that does not answer.
        cancel: Callable[[], object] = getattr(conn, "cancel_safe", conn.cancel)
        return [deadline.on_expiry(cancel) for deadline in current()]

    def _gave_up(self, exc: Exception) -> bool:
        """True when ``exc`` is a statement ended by this thread's deadline."""
        errors = self._pg.errors
        cancelled = isinstance(exc, errors.QueryCanceled | errors.LockNotAvailable)
        return cancelled and bool(current())

    def _rollback_quietly(self, conn: psycopg.Connection[Any] | None) -> None:
        if conn is not None and not conn.closed:
            self._rollback(conn)

    def _is_transient(self, exc: Exception, conn: psycopg.Connection[Any] | None) -> bool:
        """True when retrying can help: the connection is gone, or PostgreSQL asks to retry."""
        errors = self._pg.errors
        if isinstance(exc, errors.SerializationFailure | errors.DeadlockDetected):
            return True
        if not isinstance(exc, self._pg.OperationalError | self._pg.InterfaceError):
            return False
        return conn is None or conn.closed or conn.broken

    def _rollback(self, conn: psycopg.Connection[Any]) -> None:
        try:
            conn.rollback()
        except self._pg.Error:
            self._drop(conn)  # a broken connection: the server rolled back for us

    def _drop(self, conn: psycopg.Connection[Any] | None) -> None:
        if conn is not None:
            conn.close()
        if self._conn is conn:
            self._conn = None

    # --- the schema ------------------------------------------------------------------------

    def _prepare(self, conn: psycopg.Connection[tuple[Any, ...]], began: float) -> None:
        """Create or migrate the schema under an advisory lock, then check its shape.

        Each statement keeps to the thread's deadline (`_keep_to`): the advisory lock and
        the schema's tables may be held by another connection for any time (a migration
        on another machine, an operator's ``LOCK TABLE``), and a statement that began
        before the deadline was set is cancelled at it (`_connected`).
        """

        def execute(statement: Any, params: Any = None) -> psycopg.Cursor[tuple[Any, ...]]:
            self._keep_to(conn, began)
            return conn.execute(statement, params)

        try:
            # One migrator per schema at a time, across every process and machine; the lock
            # ends with the transaction.
            execute("SELECT pg_advisory_xact_lock(%s)", (_advisory_key(self._schema),))
            version = self._read_version(execute)
            if version > 0:  # not ours unless its tables are those of its version
                self._check_shape(execute, version)
            for target in range(version + 1, self._version + 1):
                for statement in self._migrations[target - 1]:
                    execute(statement)
                execute(self.compose("UPDATE {version} SET version = %s"), (target,))
                logger.info("%s: job store schema now at version %d", self.where, target)
            self._check_shape(execute, self._version)
            conn.commit()
        except BaseException:
            self._rollback(conn)
            raise

    def compose(self, text: str, **extra: sql.Composable) -> sql.Composed:
        """``text`` with the store's names ({jobs}, {columns}, {now}...) filled in."""
        from psycopg import sql  # noqa: PLC0415 - psycopg is optional: imported on use

        return sql.SQL(text).format(**self._names, **extra)

    def _read_version(self, execute: _Execute) -> int:
        tables = sorted(
            row[0]
            for row in execute(
                "SELECT c.relname FROM pg_class AS c"
                " JOIN pg_namespace AS n ON n.oid = c.relnamespace"
                " WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')",
                (self._schema,),
            )
        )
        if not tables:
            if not self._create:  # a reader must not leave an empty queue behind
                raise StoreSchemaError(
                    f"{self.where}: no such queue (schema {self._schema!r} has no job store)"
                )
            return 0
        if "schema_version" not in tables:
            raise StoreSchemaError(
                f"{self.where}: schema {self._schema!r} has tables {tables} but no job store "
                "schema version; refusing to add a job store to it"
            )
        row = execute(self.compose("SELECT version FROM {version}")).fetchone()
        version = 0 if row is None else int(row[0])
        if version > self._version:
            raise StoreSchemaError(
                f"{self.where}: job store schema version {version} is newer than this code "
                f"supports (version {self._version}); upgrade patterns.jobqueue to open it"
            )
        return version

    def _check_shape(self, execute: _Execute, version: int) -> None:
        for table, expected in SHAPES[version].items():
            columns = tuple(
                row[0]
                for row in execute(
                    "SELECT column_name FROM information_schema.columns"
                    " WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
                    (self._schema, table),
                )
            )
            if columns != expected:
                raise StoreSchemaError(
                    f"{self.where}: schema version {version} but table {table!r} has "
                    f"columns {list(columns)}, expected {list(expected)}; "
                    "this schema was not written by this job store"
                )

    # --- time and closing --------------------------------------------------------------------

    def clock(self) -> float:
        """The database's time now; if it cannot be read, the local time corrected by the offset.

        One round trip (``clock_timestamp()``), no retry, never raises.
        """
        with self._lock:
            conn = self._conn
            if not self.closed and conn is not None and not conn.closed and not conn.broken:
                try:
                    conn.autocommit = True  # one statement, no BEGIN or COMMIT around it
                    try:
                        return self._read_offset(conn)
                    finally:
                        self._manual(conn)
                except self._pg.Error as exc:
                    logger.debug("%s: clock read failed (%s); estimating", self.where, exc)
                    self._rollback(conn)
            return time.time() + self._offset

    def mark_closed(self) -> tuple[bool, psycopg.Connection[tuple[Any, ...]] | None]:
        """Refuse every later transaction; return whether it was open, and the connection.

        The caller closes the connection (after stopping what else it owns).
        """
        with self._lock:
            if self.closed:
                return False, None
            self.closed = True
            conn, self._conn = self._conn, None
            return True, conn
