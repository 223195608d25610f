"""A durable ``Store`` in one SQLite file: WAL mode, a versioned schema, leases, no server.

TL;DR: ``SQLiteStore(path)`` keeps the job queue in one file that several threads and
several processes can share; every transition is one short ``BEGIN IMMEDIATE`` transaction,
so no transaction is ever held while a handler runs.

Pitfall:
    Three classic ways to lose or duplicate work with SQLite. A claim that reads due jobs
    in a deferred transaction and then updates them lets two processes read the same job
    before either writes (and the upgrade from reader to writer fails with "database is
    locked" without waiting for the busy timeout). A "database is locked" error surfacing
    to the worker mid-claim looks like a lost job. And a store that silently opens a file
    written by a newer version, or a file that is not a job store at all, corrupts it or
    fails later with an unrelated error.

Pattern:
    Every write starts with ``BEGIN IMMEDIATE``: the write lock is taken before the due
    jobs are read, so the read and the update are one step for every process sharing the
    file. SQLite's busy handler waits up to ``BUSY_TIMEOUT`` for that lock; if it still
    fails, the whole transaction is rolled back and retried a bounded number of times with
    backoff, and only then is the error raised (the rollback means no job changed). The
    schema version lives in ``PRAGMA user_version``; opening checks it and the file's
    shape before touching anything.

Guarantees:
    * A job is returned by at most one claim while its lease is live, across threads and
      processes that share the file (given a file system with working locks: a local
      disk, not NFS).
    * Complete, fail, retry, release and renew change the row only while the claim's token
      still holds the lease; they return False (None for renew) otherwise.
    * A failed transaction leaves the file as it was; a committed one survives a process
      crash, and with ``synchronous="FULL"`` a power loss too.
    * Opening a file that is not an SQLite database, a database that is not a job store,
      or a job store with a newer schema raises `StoreFileError` naming the file, and so
      does a transaction that finds the file damaged; none of them changes the file.
    * A new database file is created readable and writable by its owner only (0600);
      SQLite gives its ``-wal`` and ``-shm`` files the same mode.

Python:
    3.11+: it reads the ``sqlite_errorcode`` that errors raised by ``sqlite3`` carry.
    Avoids recent SQL (no ``RETURNING``, no ``STRICT`` tables), so it does not need a
    recent SQLite library. The connection is opened with ``isolation_level=None``, so the
    ``sqlite3`` module never begins a transaction implicitly; its default does, before an
    INSERT, on 3.11, 3.12 and 3.13 alike ("legacy transaction control" is still the
    default of the ``autocommit`` attribute that 3.12 added). Both are pinned by
    ``tests/jobqueue/test_python_claims.py`` on each supported version (checked on
    CPython 3.11.7, 3.12.1 and 3.13.0).

Java:
    The JDBC version of this is ``UPDATE ... WHERE state = 'queued'`` inside a transaction
    with ``SELECT ... FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite has one writer, so
    ``BEGIN IMMEDIATE`` plays the role of the row lock.

See also:
    ``patterns.jobqueue.store`` (the protocol and the state diagram),
    ``patterns.jobqueue.memory`` (the same contract in memory).

Docs: docs/jobqueue/index.md
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from patterns.jobqueue.store import (
    DEFAULT_MAX_ATTEMPTS,
    JOB_COLUMNS,
    Claim,
    Job,
    JobState,
    JsonValue,
    NewJob,
    Store,
    backoff,
    check_lease,
    check_limit,
    check_owner,
    check_time,
    expired_reason,
    job_from_row,
    new_token,
    prepare_enqueue,
    prepare_many,
)

__all__ = ["BUSY_TIMEOUT", "SCHEMA_VERSION", "SQLiteStore", "StoreFileError"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

SCHEMA_VERSION = 1
"""The schema this code writes; kept in the file's ``PRAGMA user_version``."""

BUSY_TIMEOUT = 5.0
"""Seconds SQLite's busy handler waits for another connection's lock, per attempt."""

_BUSY_RETRIES = 5  # transaction attempts before a busy error is raised to the caller
_BACKOFF = 0.05  # seconds before the first retry; doubles each time, plus jitter
_SYNCHRONOUS = frozenset({"NORMAL", "FULL", "EXTRA"})
_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file

# Each entry migrates the schema from version i to i + 1; version 0 is an empty file.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """
        CREATE TABLE jobs (
            id           INTEGER PRIMARY KEY AUTOINCREMENT,  -- ids are never reused
            task         TEXT    NOT NULL CHECK (task <> ''),
            payload      TEXT    NOT NULL,                   -- JSON text, never pickle
            state        TEXT    NOT NULL
                         CHECK (state IN ('queued', 'running', 'done', 'failed')),
            run_at       REAL    NOT NULL,
            attempts     INTEGER NOT NULL CHECK (attempts >= 0),
            max_attempts INTEGER NOT NULL CHECK (max_attempts >= 1),
            lease_owner  TEXT,
            lease_until  REAL,
            last_error   TEXT,
            created_at   REAL    NOT NULL,
            updated_at   REAL    NOT NULL,
            CHECK ((state = 'running') = (lease_owner IS NOT NULL AND lease_until IS NOT NULL))
        )
        """,
        # The claim query: queued jobs by (run_at, id), and running jobs by lease expiry.
        "CREATE INDEX jobs_due ON jobs (state, run_at, id)",
        "CREATE INDEX jobs_lease ON jobs (state, lease_until)",
    ),
)
assert len(_MIGRATIONS) == SCHEMA_VERSION  # a new schema version needs its migration

# The claim's read: two index searches (queued by run_at, running by lease expiry) merged
# in (run_at, id) order, rather than one OR that would scan the whole table.
_DUE_SQL = (
    "SELECT id, run_at, state, lease_owner FROM ("
    " SELECT id, run_at, state, lease_owner FROM jobs"
    "  WHERE state = 'queued' AND run_at <= ?"
    " UNION ALL"
    " SELECT id, run_at, state, lease_owner FROM jobs"
    "  WHERE state = 'running' AND lease_until <= ?"
    ") ORDER BY run_at, id LIMIT ?"
)

_COLUMNS = ", ".join(JOB_COLUMNS)


class StoreFileError(RuntimeError):
    """The file cannot be used as a job store: not a database, not ours, too new, or damaged."""


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    """True for "database is locked" / "database table is locked" (SQLITE_BUSY, LOCKED)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


def _no_op() -> None:
    """The unsubscribe of a store without notifications: there is nothing to undo."""


class SQLiteStore:
    """A thread- and process-safe ``Store`` in the SQLite file at ``path``.

    The file is created with the current schema if it does not exist. ``synchronous`` is
    SQLite's durability setting in WAL mode: ``"NORMAL"`` (the default) may lose the last
    transactions on power loss but never corrupts the file; ``"FULL"`` (or ``"EXTRA"``)
    makes every commit durable at the cost of an fsync per transition.

    One connection serves the whole store, guarded by a lock (see ``_lock``). SQLite lets
    one writer in at a time anyway and every transition here is a short transaction, so a
    connection per thread would buy no write parallelism: threads of one process would
    contend inside SQLite's busy handler, which polls with sleeps, instead of queueing on
    a lock. One connection also means `SQLiteStore.close` can close it from any thread,
    and threads that come and go leave no connections behind. Processes do not share the
    connection: each opens its own store (never use one across ``fork``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.time,
        synchronous: str = "NORMAL",
    ) -> None:
        level = synchronous.upper() if isinstance(synchronous, str) else synchronous
        if level not in _SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {sorted(_SYNCHRONOUS)}, got {level!r}")
        self._path = os.fspath(path)
        self._clock = clock
        self._synchronous = level
        # Guards _conn and _closed: held for every transaction (including its retries), so
        # the connection is used by one thread at a time and close() cannot pull it away
        # mid-transaction. Waited on by any thread calling a store method; the only caller
        # code run while it is held is the clock, which must not call back into the store.
        self._lock = threading.Lock()
        self._closed = False
        self._conn = self._open()

    def __repr__(self) -> str:
        return f"SQLiteStore({self._path!r}, closed={self._closed})"

    @property
    def path(self) -> str:
        """The database file."""
        return self._path

    # --- opening ------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        self._create_owner_only()
        self._check_header()
        try:
            # check_same_thread=False: the connection moves between threads, but _lock
            # makes sure only one uses it at a time, which is what that check protects.
            conn = sqlite3.connect(
                self._path,
                timeout=BUSY_TIMEOUT,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise StoreFileError(f"{self._path}: cannot open job store: {exc}") from exc
        try:
            self._prepare(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _create_owner_only(self) -> None:
        """Create a missing database file readable and writable by its owner only.

        SQLite would create it with mode 0644 (less the umask), so anyone on the machine
        could read every payload. Its -wal and -shm files copy the database file's mode.
        An existing file is left exactly as it is.
        """
        if self._path in ("", ":memory:"):
            return
        try:
            fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return  # an existing file, or another process created it first
        except OSError as exc:
            raise StoreFileError(f"{self._path}: cannot create job store: {exc}") from exc
        os.close(fd)

    def _check_header(self) -> None:
        """Refuse a non-empty file that does not begin with SQLite's header, unopened.

        SQLite takes an empty file for an empty database, and so it must: a new store's
        file stays empty until its first checkpoint (the rest is in the -wal file). But it
        takes a one-byte file for an empty database too, and would write a job store over
        it, so the header is checked here first.
        """
        if self._path in ("", ":memory:"):
            return
        try:
            with open(self._path, "rb") as file:
                head = file.read(len(_HEADER))
        except OSError:
            return  # a directory, say: sqlite3.connect says what is wrong with it
        if head and head != _HEADER:
            raise StoreFileError(
                f"{self._path}: not a usable SQLite database (it has no SQLite header); "
                "is this the job store you meant to open?"
            )

    def _prepare(self, conn: sqlite3.Connection) -> None:
        """Check the file, set it to WAL, and create or migrate the schema."""
        try:
            # Refuse a foreign or newer file before changing anything in it (even its
            # journal mode); the migration checks again under the write lock.
            version = self._retry_busy(lambda: self._inspect(conn))
            mode = self._retry_busy(lambda: conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            if str(mode).lower() != "wal":
                # ':memory:' reports "memory"; some file systems cannot do WAL.
                logger.warning("%s: journal_mode is %s, not WAL", self._path, mode)
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")  # validated above
            if version < SCHEMA_VERSION:
                self._retry_busy(lambda: self._migrate(conn))
            self._check_shape(conn)
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) and _is_busy(exc):
                raise
            code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
            if code in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM):
                # Not the file's content: WAL mode needs to write the file and to create
                # its -wal and -shm files beside it, even just to read.
                raise StoreFileError(
                    f"{self._path}: cannot use the job store ({exc}); the file and its "
                    "directory must be writable (SQLite keeps -wal and -shm files beside it)"
                ) from exc
            raise StoreFileError(
                f"{self._path}: not a usable SQLite database ({exc}); "
                "is this the job store you meant to open?"
            ) from exc

    def _inspect(self, conn: sqlite3.Connection) -> int:
        """The file's schema version, read with its table list in one snapshot."""
        conn.execute("BEGIN")
        try:
            version = self._read_version(conn)
            self._check_version(conn, version)
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        return version

    def _read_version(self, conn: sqlite3.Connection) -> int:
        # The first statement reads the header: a file that is not a database fails here.
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise StoreFileError(
                f"{self._path}: job store schema version {version} is newer than this code "
                f"supports (version {SCHEMA_VERSION}); upgrade patterns.jobqueue to open it"
            )
        return version

    def _check_version(self, conn: sqlite3.Connection, version: int) -> None:
        if version == 0:
            tables = [
                row[0]
                for row in conn.execute(
                    "SELECT name FROM sqlite_master"
                    " WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
                )
            ]
            if tables:
                raise StoreFileError(
                    f"{self._path}: an SQLite database without a job store schema version "
                    f"(it has tables {sorted(tables)}); refusing to add a job store to it"
                )

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Read again under the write lock: another process may have migrated meanwhile.
            version = self._read_version(conn)
            self._check_version(conn, version)
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[target - 1]:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {target}")
                logger.info("%s: job store schema now at version %d", self._path, target)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _check_shape(self, conn: sqlite3.Connection) -> None:
        columns = tuple(row[1] for row in conn.execute("PRAGMA table_info(jobs)"))
        if columns != JOB_COLUMNS:
            raise StoreFileError(
                f"{self._path}: schema version {SCHEMA_VERSION} but table 'jobs' has "
                f"columns {list(columns)}, expected {list(JOB_COLUMNS)}; "
                "this file was not written by this job store"
            )

    # --- transactions -------------------------------------------------------------------

    def _retry_busy(self, step: Callable[[], T]) -> T:
        """Run ``step``, retrying a bounded number of times while the database is busy.

        ``step`` must leave no transaction open when it raises (every caller rolls back),
        so a retry starts from a clean slate and a final failure changed nothing.
        """
        for attempt in range(1, _BUSY_RETRIES + 1):
            try:
                return step()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or attempt == _BUSY_RETRIES:
                    raise
                pause = backoff(_BACKOFF, attempt)
                logger.warning(
                    "%s: database busy (%s), retry %d of %d in %.2f s",
                    self._path,
                    exc,
                    attempt,
                    _BUSY_RETRIES - 1,
                    pause,
                )
                time.sleep(pause)
        raise AssertionError("unreachable")  # pragma: no cover

    def _write(self, body: Callable[[sqlite3.Connection, float], T]) -> T:
        """Run ``body(conn, now)`` in one ``BEGIN IMMEDIATE`` transaction, with retries."""

        def once() -> T:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                # Read the clock under the write lock, so timestamps follow commit order.
                result = body(conn, self._clock())
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return result

        with self._lock:
            self._check_open()
            try:
                return self._retry_busy(once)
            except sqlite3.DatabaseError as exc:
                self._raise_if_damaged(exc)
                raise

    def _read(self, body: Callable[[sqlite3.Connection], T]) -> T:
        """Run a single read statement (a consistent snapshot on its own in WAL mode)."""
        with self._lock:
            self._check_open()
            try:
                return self._retry_busy(lambda: body(self._conn))
            except sqlite3.DatabaseError as exc:
                self._raise_if_damaged(exc)
                raise

    def _raise_if_damaged(self, exc: sqlite3.DatabaseError) -> None:
        """Raise `StoreFileError` naming the file if ``exc`` says the file is damaged.

        Opening checks only the header and the schema, so damage in the pages of the table
        shows up at the first transaction that reads them; that transaction rolled back.
        """
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None and code & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
            raise StoreFileError(
                f"{self._path}: the database file is damaged ({exc}); nothing was changed; "
                "restore it from a backup or recover it with the sqlite3 shell's .recover"
            ) from exc

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")

    def _job(self, row: Sequence[Any]) -> Job:
        try:
            return job_from_row(row)
        except ValueError as exc:
            raise StoreFileError(f"{self._path}: {exc}") from exc

    def _select(self, conn: sqlite3.Connection, job_id: int) -> Job | None:
        row = conn.execute(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else self._job(row)

    # --- the Store protocol -------------------------------------------------------------

    @staticmethod
    def _insert(conn: sqlite3.Connection, new: NewJob, now: float) -> int:
        cursor = conn.execute(
            "INSERT INTO jobs (task, payload, state, run_at, attempts, max_attempts,"
            " created_at, updated_at) VALUES (?, ?, 'queued', ?, 0, ?, ?, ?)",
            (new.task, new.payload_json, new.run_at, new.max_attempts, now, now),
        )
        job_id = cursor.lastrowid
        assert job_id is not None  # an INSERT always sets it
        return job_id

    def enqueue(
        self,
        task: str,
        payload: JsonValue = None,
        *,
        run_at: float | None = None,
        delay: float | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> int:
        """Add a job and return its id; a bad payload or argument writes nothing."""

        # A bad argument raises inside the transaction, which rolls back: nothing written.
        def body(conn: sqlite3.Connection, now: float) -> int:
            new = prepare_enqueue(
                now, task, payload, run_at=run_at, delay=delay, max_attempts=max_attempts
            )
            return self._insert(conn, new, now)

        job_id = self._write(body)
        logger.debug("%s: enqueued job %d (%s)", self._path, job_id, task)
        return job_id

    def enqueue_many(self, jobs: Sequence[Mapping[str, Any]]) -> list[int]:
        """Add several jobs (each a mapping of `enqueue`'s arguments) in one transaction."""

        def body(conn: sqlite3.Connection, now: float) -> list[int]:
            return [self._insert(conn, new, now) for new in prepare_many(now, jobs)]

        ids = self._write(body)
        logger.debug("%s: enqueued %d jobs", self._path, len(ids))
        return ids

    def claim(self, owner: str, *, lease: float, limit: int = 1) -> list[Claim]:
        """Take up to ``limit`` due jobs, oldest ``run_at`` first (ties by id), under a lease.

        Due means queued with ``run_at <= now``, or running with an expired lease
        (``lease_until <= now``). An expired job whose attempts are spent is marked failed
        instead of being returned.
        """
        check_owner(owner)
        seconds = check_lease(lease)
        count = check_limit(limit)

        def body(conn: sqlite3.Connection, now: float) -> list[Claim]:
            spent = conn.execute(
                "SELECT id, attempts FROM jobs WHERE state = 'running'"
                " AND lease_until <= ? AND attempts >= max_attempts",
                (now,),
            ).fetchall()
            for job_id, attempts in spent:
                conn.execute(
                    "UPDATE jobs SET state = 'failed', last_error = ?, lease_owner = NULL,"
                    " lease_until = NULL, updated_at = ? WHERE id = ?",
                    (expired_reason(attempts), now, job_id),
                )
                logger.warning(
                    "%s: job %d failed: %s", self._path, job_id, expired_reason(attempts)
                )
            due = conn.execute(_DUE_SQL, (now, now, count)).fetchall()
            claims = []
            for job_id, _, state, old_owner in due:
                if state == JobState.RUNNING:
                    logger.warning(
                        "%s: job %d: lease of %s expired, claiming it again",
                        self._path,
                        job_id,
                        old_owner,
                    )
                token = new_token(owner)
                conn.execute(
                    "UPDATE jobs SET state = 'running', attempts = attempts + 1,"
                    " lease_owner = ?, lease_until = ?, updated_at = ? WHERE id = ?",
                    (token, now + seconds, now, job_id),
                )
                job = self._claimed(conn, job_id, now)
                if job is not None:
                    claims.append(Claim(job, token, now + seconds))
            return claims

        return self._write(body)

    def _claimed(self, conn: sqlite3.Connection, job_id: int, now: float) -> Job | None:
        """The job just claimed, or None after failing it if its payload is not JSON.

        A hostile or damaged file must not stop the worker: the bad job ends ``failed``
        with the reason, inside the same transaction, and the claim moves on.
        """
        try:
            return self._select(conn, job_id)
        except StoreFileError as exc:
            reason = str(exc)
        conn.execute(
            "UPDATE jobs SET state = 'failed', last_error = ?, lease_owner = NULL,"
            " lease_until = NULL, updated_at = ? WHERE id = ?",
            (reason, now, job_id),
        )
        logger.error("%s; job failed", reason)
        return None

    def _settle(self, claim: Claim, sql: str, params: tuple[Any, ...]) -> bool:
        """Apply ``sql`` (params then id and token) only while the claim holds the lease."""

        def body(conn: sqlite3.Connection, now: float) -> bool:
            cursor = conn.execute(
                f"UPDATE jobs SET {sql}, updated_at = ?"
                " WHERE id = ? AND state = 'running' AND lease_owner = ?",
                (*params, now, claim.job.id, claim.token),
            )
            return cursor.rowcount == 1

        held = self._write(body)
        if not held:
            logger.info(
                "%s: job %d: claim %s no longer holds the lease",
                self._path,
                claim.job.id,
                claim.token,
            )
        return held

    _END_LEASE = "lease_owner = NULL, lease_until = NULL"

    def complete(self, claim: Claim) -> bool:
        """Mark the job done; False (and no change) if the claim no longer holds the lease."""
        return self._settle(claim, f"state = 'done', {self._END_LEASE}", ())

    def fail(self, claim: Claim, error: str) -> bool:
        """Mark the job failed for good with ``error``; False if the lease was lost."""
        return self._settle(
            claim, f"state = 'failed', last_error = ?, {self._END_LEASE}", (str(error),)
        )

    def retry(self, claim: Claim, error: str, *, run_at: float) -> bool:
        """Queue the job again at ``run_at``, keeping the attempt; False if the lease was lost."""
        when = check_time("run_at", run_at)
        return self._settle(
            claim,
            f"state = 'queued', last_error = ?, run_at = ?, {self._END_LEASE}",
            (str(error), when),
        )

    def release(self, claim: Claim) -> bool:
        """Return an interrupted job unchanged: attempt given back, original ``run_at``."""
        return self._settle(
            claim, f"state = 'queued', attempts = MAX(attempts - 1, 0), {self._END_LEASE}", ()
        )

    def renew(self, claim: Claim, *, lease: float) -> Claim | None:
        """Extend the lease; the renewed claim, or None if the lease was lost."""
        seconds = check_lease(lease)

        def body(conn: sqlite3.Connection, now: float) -> Claim | None:
            cursor = conn.execute(
                "UPDATE jobs SET lease_until = ?, updated_at = ?"
                " WHERE id = ? AND state = 'running' AND lease_owner = ?",
                (now + seconds, now, claim.job.id, claim.token),
            )
            if cursor.rowcount != 1:
                return None
            job = self._select(conn, claim.job.id)
            return None if job is None else Claim(job, claim.token, now + seconds)

        renewed = self._write(body)
        if renewed is None:
            logger.info(
                "%s: job %d: claim %s lost its lease, not renewed",
                self._path,
                claim.job.id,
                claim.token,
            )
        return renewed

    def get(self, job_id: int) -> Job | None:
        """The job with this id, or None."""
        return self._read(lambda conn: self._select(conn, job_id))

    def counts(self) -> dict[str, int]:
        """Number of jobs in each state, every state present (zero included)."""
        rows = self._read(
            lambda conn: conn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
        )
        result = {state.value: 0 for state in JobState}
        result.update({state: int(n) for state, n in rows})
        return result

    def next_due(self) -> float | None:
        """When the next job becomes claimable (a run_at or a lease expiry); None if never."""
        row = self._read(
            lambda conn: conn.execute(
                "SELECT MIN(t) FROM ("
                " SELECT MIN(run_at) AS t FROM jobs WHERE state = 'queued'"
                " UNION ALL"
                " SELECT MIN(lease_until) FROM jobs WHERE state = 'running')"
            ).fetchone()
        )
        return None if row[0] is None else float(row[0])

    def purge(self, *, older_than: float | None = None) -> int:
        """Delete done and failed jobs (updated before ``older_than``); return how many."""
        cutoff = None if older_than is None else check_time("older_than", older_than)

        def body(conn: sqlite3.Connection, now: float) -> int:
            sql = "DELETE FROM jobs WHERE state IN ('done', 'failed')"
            params: tuple[float, ...] = ()
            if cutoff is not None:
                sql += " AND updated_at < ?"
                params = (cutoff,)
            return conn.execute(sql, params).rowcount

        purged = self._write(body)
        if purged:
            logger.info("%s: purged %d finished jobs", self._path, purged)
        return purged

    def clock(self) -> float:
        """The store's time now: the ``clock`` it was built with (`time.time` by default)."""
        return self._clock()

    def subscribe(self, callback: Callable[[], object]) -> Callable[[], None]:
        """No notifications here: never calls ``callback``; the unsubscribe does nothing.

        A worker on this store finds new jobs at its next poll. `RuntimeError` once closed.
        """
        self._check_open()
        return _no_op

    def close(self) -> None:
        """Release the store's resources; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._conn.close()


if TYPE_CHECKING:  # mypy --strict proves the store implements the protocol exactly
    _implements: type[Store] = SQLiteStore
