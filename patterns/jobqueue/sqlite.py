"""A durable ``Store`` in one SQLite file: WAL mode, a versioned schema, leases, no server.

TL;DR: ``SQLiteStore(path)`` keeps the job queue in one file that several threads and
several processes can share; every transition (or batch of outcomes, ``settle_many``) is one
short ``BEGIN IMMEDIATE`` transaction, so no transaction is ever held while a handler runs.

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
      still holds the lease; they return False (None for renew) otherwise. So does each
      item of ``settle_many``, whose items commit together (one fsync at FULL) or not at all.
    * A failed transaction leaves the file as it was; a committed one survives a process
      crash, and with ``synchronous="FULL"`` a power loss too.
    * Opening a file that is not an SQLite database, a database that is not a job store
      (its version and its tables' columns are checked before anything is written, the
      switch to WAL included), or a job store with a newer schema raises `StoreFileError`
      naming the file, and so does a transaction that finds the file damaged; none of
      them changes the file, and once damage is found every later write is refused
      before it touches the file. A version 1 file is migrated in one transaction.
    * A new database file is created readable and writable by its owner only (0600),
      through a dangling symlink too; SQLite gives its ``-wal`` and ``-shm`` files the
      same mode.
    * The store's lock is never held while it sleeps between busy retries, and a renew
      touches the lease only (no payload is read).
    * While anyone subscribes, a commit by another connection or process calls the
      subscribers within about ``watch_interval`` (a watcher thread reads ``PRAGMA
      data_version``); the store's own commits do not. The thread starts with the first
      subscriber and is joined by the last unsubscribe and by `SQLiteStore.close`.

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

import dataclasses
import itertools
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypeAlias, TypeVar

from patterns.jobqueue.store import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_PAYLOAD_BYTES,
    FINISHED_STATES,
    JOB_COLUMNS,
    CancelResult,
    Claim,
    Job,
    JobState,
    JsonValue,
    NewJob,
    Settle,
    Settlement,
    SingleOutcomes,
    WorkerRecord,
    backoff,
    cancelled_reason,
    check_job_id,
    check_lease,
    check_limit,
    check_max_payload_bytes,
    check_owner,
    check_share_limit,
    check_state,
    check_states,
    check_text,
    check_time,
    check_worker,
    expired_reason,
    job_from_row,
    new_token,
    prepare_enqueue,
    prepare_many,
    prepare_settlement,
    storable_error,
)

__all__ = ["BUSY_TIMEOUT", "SCHEMA_VERSION", "WATCH_INTERVAL", "SQLiteStore", "StoreFileError"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

SCHEMA_VERSION = 2
"""The schema this code writes; kept in the file's ``PRAGMA user_version``.

Version 2 added the ``cancelled`` state, the job columns ``timeout``, ``result`` and
``cancel_requested``, and the ``workers`` table; opening a version 1 file migrates it.
"""

BUSY_TIMEOUT = 5.0
"""Seconds SQLite's busy handler waits for another connection's lock, per attempt."""

WATCH_INTERVAL = 0.015
"""Seconds between two looks at the file's ``PRAGMA data_version`` while anyone subscribes.

A job enqueued by another process wakes a subscribed worker within about this long (half
of it on average). Each look costs the watcher thread a timed wake-up and a read
transaction, about 110 µs of CPU on the 2-vCPU machine of the performance page (70 of them
the wake-up alone): 1.2 % of a core at 10 ms, so the default is 15 ms. The cost is per
look, so it grows as the interval shrinks (``benchmarks/jobqueue_latency.py``, table 3b).
"""

_WATCH_JOIN = 2.0  # seconds unsubscribe() and close() wait for the watcher thread to end
_BUSY_RETRIES = 5  # transaction attempts before a busy error is raised to the caller
_BACKOFF = 0.05  # seconds before the first retry; doubles each time, plus jitter
_BACKOFF_CAP = 1.0  # the longest pause between two attempts, before jitter
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
    # Version 2. SQLite cannot change a CHECK constraint in place, so the table is rebuilt
    # (one transaction, like every migration): ids are copied, and the AUTOINCREMENT
    # counter (a row of sqlite_sequence) is carried over, so no purged id is ever reused.
    (
        """
        CREATE TABLE jobs_v2 (
            id           INTEGER PRIMARY KEY AUTOINCREMENT,  -- ids are never reused
            task         TEXT    NOT NULL CHECK (task <> ''),
            payload      TEXT    NOT NULL,                   -- JSON text, never pickle
            state        TEXT    NOT NULL CHECK (state IN
                             ('queued', 'running', 'done', 'failed', 'cancelled')),
            run_at       REAL    NOT NULL,
            attempts     INTEGER NOT NULL CHECK (attempts >= 0),
            max_attempts INTEGER NOT NULL CHECK (max_attempts >= 1),
            lease_owner  TEXT,
            lease_until  REAL,
            last_error   TEXT,
            created_at   REAL    NOT NULL,
            updated_at   REAL    NOT NULL,
            timeout      REAL    CHECK (timeout IS NULL OR timeout > 0),  -- seconds
            result       TEXT,                               -- JSON text, once done
            cancel_requested INTEGER NOT NULL DEFAULT 0 CHECK (cancel_requested IN (0, 1)),
            CHECK ((state = 'running') = (lease_owner IS NOT NULL AND lease_until IS NOT NULL))
        )
        """,
        """
        INSERT INTO jobs_v2 (id, task, payload, state, run_at, attempts, max_attempts,
                             lease_owner, lease_until, last_error, created_at, updated_at)
        SELECT id, task, payload, state, run_at, attempts, max_attempts,
               lease_owner, lease_until, last_error, created_at, updated_at FROM jobs
        """,
        "DELETE FROM sqlite_sequence WHERE name = 'jobs_v2'",
        """
        INSERT INTO sqlite_sequence (name, seq)
        SELECT 'jobs_v2', seq FROM sqlite_sequence WHERE name = 'jobs'
        """,
        "DROP TABLE jobs",
        "ALTER TABLE jobs_v2 RENAME TO jobs",
        "CREATE INDEX jobs_due ON jobs (state, run_at, id)",
        "CREATE INDEX jobs_lease ON jobs (state, lease_until)",
        """
        CREATE TABLE workers (
            id         TEXT    PRIMARY KEY,  -- the worker's name, its tokens' prefix
            host       TEXT    NOT NULL,
            pid        INTEGER NOT NULL,
            state      TEXT    NOT NULL,
            started_at REAL    NOT NULL,
            last_seen  REAL    NOT NULL,
            expires_at REAL    NOT NULL,     -- not listed after this: the worker died
            jobs_held  INTEGER NOT NULL
        )
        """,
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

# Every outcome, fenced: it changes the row only while the claim's token holds the lease.
# Each statement takes its assignments' parameters, then updated_at, the id and the token.
_END_LEASE = "lease_owner = NULL, lease_until = NULL"
# A job given back (retry, release) while a cancel is requested would never run again
# usefully: it ends cancelled instead of queued, like MemoryStore._settle_held.
_GIVE_BACK = (
    "state = CASE cancel_requested WHEN 1 THEN 'cancelled' ELSE 'queued' END,"
    " last_error = CASE cancel_requested WHEN 1 THEN ? ELSE {error} END"
)
_GAVE_BACK = cancelled_reason("and its worker gave it back")
_SETTLE_SQL = {
    kind: f"UPDATE jobs SET {assignments}, {_END_LEASE}, updated_at = ?"
    " WHERE id = ? AND state = 'running' AND lease_owner = ?"
    for kind, assignments in {
        Settle.COMPLETE: "state = 'done', result = ?",
        Settle.FAIL: "state = 'failed', last_error = ?",
        Settle.RETRY: _GIVE_BACK.format(error="?") + ", run_at = ?",
        Settle.RELEASE: _GIVE_BACK.format(error="last_error") + ", attempts = MAX(attempts - 1, 0)",
        Settle.CANCEL: "state = 'cancelled', last_error = ?",
    }.items()
}
_Outcome: TypeAlias = tuple[Settle, str | None, float]  # what prepare_settlement returns

_COLUMNS = ", ".join(JOB_COLUMNS)
_WORKER_COLUMNS = (
    "id",
    "host",
    "pid",
    "state",
    "started_at",
    "last_seen",
    "expires_at",
    "jobs_held",
)
# The tables (and their columns) of each schema version: what opening checks a file has.
_SHAPES: dict[int, dict[str, tuple[str, ...]]] = {
    1: {"jobs": JOB_COLUMNS[:12]},  # version 2 added the last three columns
    2: {"jobs": JOB_COLUMNS, "workers": _WORKER_COLUMNS},
}


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


# Watcher connections inherited by a forked child: kept referenced, so never closed there.
_INHERITED: list[sqlite3.Connection] = []


def _check_watch_interval(value: object) -> float | None:
    """``watch_interval`` as positive seconds, or None (0 or None: no watcher)."""
    if value is None:
        return None
    seconds = check_time("watch_interval", value)  # TypeError / ValueError naming it
    if seconds < 0:
        raise ValueError(f"watch_interval must not be negative, got {value!r}")
    return seconds or None


def _data_version(conn: sqlite3.Connection | sqlite3.Cursor) -> int:
    """The connection's ``PRAGMA data_version``: it changes when ANOTHER connection commits."""
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


class _Watcher:
    """One run of the watcher thread: its connection, what it last read, its process."""

    def __init__(self, conn: sqlite3.Connection, seen: int, own: int) -> None:
        self.conn = conn  # used by the watcher thread only, and closed by it as it ends
        self.cursor = conn.cursor()  # reused: one look allocates as little as it can
        self.seen = seen  # conn's data_version at the last look: any commit but conn's own
        self.own = own  # the store's connection's: commits by other connections only
        self.pid = os.getpid()  # a forked child finds a watcher of another process here
        # A one-shot event: held from the start, released once (by the last unsubscribe or
        # by close()); the thread waits on it between looks with acquire(timeout), which is
        # one C call where Event.wait runs a Condition in Python, 100 times a second.
        self.stop = threading.Lock()
        self.stop.acquire()
        self.thread: threading.Thread | None = None


class SQLiteStore(SingleOutcomes):
    """A thread- and process-safe ``Store`` in the SQLite file at ``path``.

    The file is created with the current schema if it does not exist, unless ``create``
    is False: then a missing file raises `StoreFileError` and nothing is created (for
    commands that only read). ``synchronous`` is
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

    Subscribers (`SQLiteStore.subscribe`) add a second connection, read every
    ``watch_interval`` seconds (`WATCH_INTERVAL` by default) by a watcher thread, so that a
    job enqueued by another process wakes a worker at once instead of at its next poll;
    ``watch_interval=0`` (or None) turns it off.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.time,
        synchronous: str = "NORMAL",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        create: bool = True,
        watch_interval: float | None = WATCH_INTERVAL,
    ) -> None:
        level = synchronous.upper() if isinstance(synchronous, str) else synchronous
        if level not in _SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {sorted(_SYNCHRONOUS)}, got {level!r}")
        self._max_payload_bytes = check_max_payload_bytes(max_payload_bytes)
        self._path = os.fspath(path)
        self._create = create
        self._clock = clock
        self._synchronous = level
        # Guards _conn and _closed: held for every transaction attempt, so the connection
        # is used by one thread at a time and close() cannot pull it away mid-transaction.
        # Never held during the pause between two attempts of a busy transaction, so a
        # heartbeat's renew is not kept waiting by another thread's backoff. Waited on by
        # any thread calling a store method; the only caller code run while it is held is
        # the clock, which must not call back into the store.
        self._lock = threading.Lock()
        self._shared = threading.local()  # .now: inside settle_and_claim's transaction
        self._closed = False
        # Set (under _lock) once a transaction found the file damaged: from then on every
        # write is refused before it touches the file, so nothing is written into a file
        # that is known to be broken (a worker's row included) until it is reopened.
        self._damage: str | None = None
        self._init_watch(watch_interval)
        self._conn = self._open()

    def __repr__(self) -> str:
        return f"SQLiteStore({self._path!r}, closed={self._closed})"

    @property
    def path(self) -> str:
        """The database file."""
        return self._path

    # --- opening ------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        if not self._create and not os.path.exists(self._path):
            # A reader (an operator's status or list) must not leave an empty queue behind.
            raise StoreFileError(f"{self._path}: no such queue (the file does not exist)")
        self._create_owner_only()
        self._check_header()
        if os.path.isfile(self._path) and not os.access(self._path, os.W_OK):
            # SQLite would open it read-only without a word (even asked for mode=rw), and
            # the first enqueue or claim would fail instead of the open.
            raise StoreFileError(
                f"{self._path}: the job store file is read-only; a store needs to write it, "
                "even to read (WAL mode)"
            )
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
        An existing file is left exactly as it is. The path is resolved first: with
        ``O_EXCL``, a dangling symlink counts as an existing file, and SQLite would then
        create its target with the default mode.
        """
        if self._path in ("", ":memory:"):
            return
        try:
            target = os.path.realpath(self._path)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
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
            # journal mode): its version and, past version 0, the shape of its tables.
            # The migration checks again under the write lock.
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
        if version > 0:
            self._check_shape(conn, version)
            return
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

    def _check_shape(self, conn: sqlite3.Connection, version: int = SCHEMA_VERSION) -> None:
        """Refuse a file whose tables are not those of its schema ``version``."""
        for table, expected in _SHAPES[version].items():
            columns = tuple(row[1] for row in conn.execute(f"PRAGMA table_info({table})"))
            if columns != expected:
                raise StoreFileError(
                    f"{self._path}: schema version {version} but table {table!r} has "
                    f"columns {list(columns)}, expected {list(expected)}; "
                    "this file was not written by this job store"
                )

    # --- transactions -------------------------------------------------------------------

    def _retry_busy(self, step: Callable[[], T], *, locked: bool = False) -> T:
        """Run ``step``, retrying a bounded number of times while the database is busy.

        ``step`` must leave no transaction open when it raises (every caller rolls back),
        so a retry starts from a clean slate and a final failure changed nothing. With
        ``locked``, each attempt runs holding ``_lock`` on an open store, and the pause
        between attempts does not: another thread's short transaction (a heartbeat's
        renew) gets its turn instead of waiting out this one's backoff.
        """
        for attempt in range(1, _BUSY_RETRIES + 1):
            try:
                if not locked:
                    return step()
                with self._lock:
                    self._check_open()
                    return step()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or attempt == _BUSY_RETRIES:
                    raise
                pause = backoff(_BACKOFF, attempt, _BACKOFF_CAP)
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
        """Run ``body(conn, now)`` in one ``BEGIN IMMEDIATE`` transaction, with retries.

        Inside `settle_and_claim`'s transaction (this thread, lock held) ``body`` joins it.
        """
        now = getattr(self._shared, "now", None)
        if now is not None:
            return body(self._conn, now)

        def once() -> T:
            if self._damage is not None:
                raise StoreFileError(self._damage)
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

        try:
            return self._retry_busy(once, locked=True)
        except sqlite3.DatabaseError as exc:
            self._raise_if_damaged(exc)
            raise

    def _read(self, body: Callable[[sqlite3.Connection], T]) -> T:
        """Run a single read statement (a consistent snapshot on its own in WAL mode)."""
        try:
            return self._retry_busy(lambda: body(self._conn), locked=True)
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
            message = (
                f"{self._path}: the database file is damaged ({exc}); nothing was changed; "
                "restore it from a backup or recover it with the sqlite3 shell's .recover"
            )
            with self._lock:
                self._damage = self._damage or message
            raise StoreFileError(message) from exc

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
            " created_at, updated_at, timeout) VALUES (?, ?, 'queued', ?, 0, ?, ?, ?, ?)",
            (new.task, new.payload_json, new.run_at, new.max_attempts, now, now, new.timeout),
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
        timeout: float | None = None,
    ) -> int:
        # A bad argument raises inside the transaction, which rolls back: nothing written.
        def body(conn: sqlite3.Connection, now: float) -> int:
            new = prepare_enqueue(
                now,
                task,
                payload,
                run_at=run_at,
                delay=delay,
                max_attempts=max_attempts,
                timeout=timeout,
                max_payload_bytes=self._max_payload_bytes,
            )
            return self._insert(conn, new, now)

        job_id = self._write(body)
        logger.debug("%s: enqueued job %d (%s)", self._path, job_id, task)
        return job_id

    def enqueue_many(self, jobs: Sequence[Mapping[str, Any]]) -> list[int]:
        def body(conn: sqlite3.Connection, now: float) -> list[int]:
            prepared = prepare_many(now, jobs, self._max_payload_bytes)
            return [self._insert(conn, new, now) for new in prepared]

        ids = self._write(body)
        logger.debug("%s: enqueued %d jobs", self._path, len(ids))
        return ids

    def claim(self, owner: str, *, lease: float, limit: int = 1) -> list[Claim]:
        check_owner(owner)
        seconds = check_lease(lease)
        count = check_limit(limit)
        reason = cancelled_reason("and its lease expired")

        def body(conn: sqlite3.Connection, now: float) -> list[Claim]:
            cancelled = conn.execute(
                "UPDATE jobs SET state = 'cancelled', last_error = ?, lease_owner = NULL,"
                " lease_until = NULL, updated_at = ?"
                " WHERE state = 'running' AND lease_until <= ? AND cancel_requested = 1",
                (reason, now, now),
            ).rowcount
            if cancelled:
                logger.warning("%s: %d jobs %s", self._path, cancelled, reason)
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
            reason = storable_error(exc)
        conn.execute(
            "UPDATE jobs SET state = 'failed', last_error = ?, lease_owner = NULL,"
            " lease_until = NULL, updated_at = ? WHERE id = ?",
            (reason, now, job_id),
        )
        logger.error("%s; job failed", reason)
        return None

    def _settle_one(self, claim: Claim, kind: Settle, text: str | None, when: float) -> bool:
        """One checked outcome, in its own transaction, only while the claim holds the lease."""
        held = self._write(lambda conn, now: self._settle_in(conn, now, claim, (kind, text, when)))
        if not held:
            self._log_refused(claim)
        return held

    def _log_refused(self, claim: Claim) -> None:
        logger.info(
            "%s: job %d: claim %s no longer holds the lease", self._path, claim.job.id, claim.token
        )

    def _settle_in(
        self, conn: sqlite3.Connection, now: float, claim: Claim, outcome: _Outcome
    ) -> bool:
        """Apply one checked outcome inside the open transaction; False if the lease is gone."""
        kind, text, when = outcome
        if kind is Settle.RETRY:
            params: tuple[Any, ...] = (_GAVE_BACK, text, when)
        elif kind is Settle.RELEASE:
            params = (_GAVE_BACK,)
        else:
            params = (text,)
        cursor = conn.execute(_SETTLE_SQL[kind], (*params, now, claim.job.id, claim.token))
        return cursor.rowcount == 1

    def settle_many(self, items: Sequence[Settlement]) -> list[bool | Exception]:
        """`~patterns.jobqueue.store.Store.settle_many` in one ``BEGIN IMMEDIATE`` transaction.

        One commit for the lot: with ``synchronous="FULL"``, one fsync. A busy database is
        retried and a damaged file raises, as for a single call.
        """
        if not items:
            return []
        done: list[bool | Exception] = []
        checked: list[tuple[int, Claim, _Outcome]] = []
        for index, item in enumerate(items):
            try:
                outcome = prepare_settlement(item, self._max_payload_bytes)
            except (TypeError, ValueError) as exc:
                done.append(exc)
                continue
            done.append(False)
            checked.append((index, item.claim, outcome))

        def body(conn: sqlite3.Connection, now: float) -> list[bool]:
            return [self._settle_in(conn, now, claim, outcome) for _, claim, outcome in checked]

        if checked:
            for (index, claim, _), held in zip(checked, self._write(body), strict=True):
                done[index] = held
                if not held:
                    self._log_refused(claim)
        return done

    def settle_and_claim(
        self, items: Sequence[Settlement], owner: str, *, lease: float, limit: int
    ) -> tuple[list[bool | Exception], list[Claim]]:
        """`~patterns.jobqueue.store.Store.settle_and_claim` in one ``BEGIN IMMEDIATE`` transaction.

        `settle_many` and `claim` run their own code, joined to this transaction; a busy
        database retries the whole of it, a failure rolls all of it back.
        """
        count = check_share_limit(limit)
        if count:
            check_owner(owner)
            check_lease(lease)
        elif not items:
            return [], []

        def body(
            conn: sqlite3.Connection, now: float
        ) -> tuple[list[bool | Exception], list[Claim]]:
            self._shared.now = now
            try:
                done = self.settle_many(items)
                claims = self.claim(owner, lease=lease, limit=count) if count else []
            finally:
                self._shared.now = None
            return done, claims

        return self._write(body)

    def renew(self, claim: Claim, *, lease: float) -> Claim | None:
        seconds = check_lease(lease)

        def body(conn: sqlite3.Connection, now: float) -> Claim | None:
            cursor = conn.execute(
                "UPDATE jobs SET lease_until = ?, updated_at = ?"
                " WHERE id = ? AND state = 'running' AND lease_owner = ?",
                (now + seconds, now, claim.job.id, claim.token),
            )
            if cursor.rowcount != 1:
                return None
            (flag,) = conn.execute(
                "SELECT cancel_requested FROM jobs WHERE id = ?", (claim.job.id,)
            ).fetchone()
            job = dataclasses.replace(claim.job, lease_until=now + seconds, updated_at=now)
            return Claim(job, claim.token, now + seconds, bool(flag))

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
        if not check_job_id(job_id):
            return None
        return self._read(lambda conn: self._select(conn, job_id))

    def list_jobs(
        self, *, state: JobState | str | None = None, task: str | None = None, limit: int = 50
    ) -> list[Job]:
        where, params = ["1 = 1"], []
        if state is not None:
            where.append("state = ?")
            params.append(check_state(state).value)
        if task is not None:
            where.append("task = ?")
            params.append(check_text("task", task))
        sql = f"SELECT {_COLUMNS} FROM jobs WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT ?"
        count = check_limit(limit)
        rows = self._read(lambda conn: conn.execute(sql, (*params, count)).fetchall())
        return [self._job(row) for row in rows]

    _REQUEUE = (
        "UPDATE jobs SET state = 'queued', attempts = 0, run_at = ?, updated_at = ?,"
        " cancel_requested = 0, result = NULL WHERE state = 'failed'"
    )

    def requeue(self, job_id: int) -> bool:
        if not check_job_id(job_id):
            return False

        def body(conn: sqlite3.Connection, now: float) -> bool:
            cursor = conn.execute(f"{self._REQUEUE} AND id = ?", (now, now, job_id))
            return cursor.rowcount == 1

        done = self._write(body)
        if done:
            logger.info("%s: job %d requeued", self._path, job_id)
        return done

    def requeue_failed(self, *, task: str | None = None) -> list[int]:
        name = None if task is None else check_text("task", task)
        where = "" if name is None else " AND task = ?"
        extra: tuple[str, ...] = () if name is None else (name,)

        def body(conn: sqlite3.Connection, now: float) -> list[int]:
            ids = [
                int(row[0])
                for row in conn.execute(
                    f"SELECT id FROM jobs WHERE state = 'failed'{where} ORDER BY id", extra
                )
            ]
            conn.execute(f"{self._REQUEUE}{where}", (now, now, *extra))
            return ids

        ids = self._write(body)
        if ids:
            logger.info("%s: requeued %d failed jobs", self._path, len(ids))
        return ids

    def cancel(self, job_id: int) -> CancelResult:
        if not check_job_id(job_id):
            return CancelResult.NOT_FOUND

        def body(conn: sqlite3.Connection, now: float) -> CancelResult:
            row = conn.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                return CancelResult.NOT_FOUND
            if row[0] == JobState.QUEUED:
                conn.execute(
                    "UPDATE jobs SET state = 'cancelled', updated_at = ? WHERE id = ?",
                    (now, job_id),
                )
                return CancelResult.CANCELLED
            if row[0] == JobState.RUNNING:
                conn.execute(
                    "UPDATE jobs SET cancel_requested = 1, updated_at = ? WHERE id = ?",
                    (now, job_id),
                )
                return CancelResult.REQUESTED
            return CancelResult.FINISHED

        result = self._write(body)
        logger.info("%s: job %d: cancel %s", self._path, job_id, result.value)
        return result

    def counts(self) -> dict[str, int]:
        rows = self._read(
            lambda conn: conn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
        )
        result = {state.value: 0 for state in JobState}
        result.update({state: int(n) for state, n in rows})
        return result

    def next_due(self) -> float | None:
        row = self._read(
            lambda conn: conn.execute(
                "SELECT MIN(t) FROM ("
                " SELECT MIN(run_at) AS t FROM jobs WHERE state = 'queued'"
                " UNION ALL"
                " SELECT MIN(lease_until) FROM jobs WHERE state = 'running')"
            ).fetchone()
        )
        return None if row[0] is None else float(row[0])

    def purge(
        self, *, older_than: float | None = None, states: Collection[str] = FINISHED_STATES
    ) -> int:
        cutoff = None if older_than is None else check_time("older_than", older_than)
        chosen = sorted(state.value for state in check_states(states))
        if not chosen:
            return 0

        def body(conn: sqlite3.Connection, now: float) -> int:
            sql = f"DELETE FROM jobs WHERE state IN ({', '.join('?' * len(chosen))})"
            params: tuple[object, ...] = tuple(chosen)
            if cutoff is not None:
                sql += " AND updated_at < ?"
                params += (cutoff,)
            return conn.execute(sql, params).rowcount

        purged = self._write(body)
        if purged:
            logger.info("%s: purged %d finished jobs", self._path, purged)
        return purged

    def record_worker(
        self,
        worker_id: str,
        *,
        host: str,
        pid: int,
        state: str,
        started_at: float,
        jobs_held: int,
        ttl: float,
    ) -> None:
        row = check_worker(
            worker_id,
            host=host,
            pid=pid,
            state=state,
            started_at=started_at,
            jobs_held=jobs_held,
            ttl=ttl,
        )

        def body(conn: sqlite3.Connection, now: float) -> None:
            self._expire_workers(conn, now)
            conn.execute(
                f"INSERT OR REPLACE INTO workers ({', '.join(_WORKER_COLUMNS)})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.worker_id,
                    row.host,
                    row.pid,
                    row.state,
                    row.started_at,
                    now,
                    now + row.ttl,
                    row.jobs_held,
                ),
            )

        self._write(body)

    def forget_worker(self, worker_id: str) -> None:
        name = check_text("worker_id", worker_id)
        self._write(lambda conn, now: conn.execute("DELETE FROM workers WHERE id = ?", (name,)))

    def workers(self) -> list[WorkerRecord]:
        def body(conn: sqlite3.Connection, now: float) -> list[WorkerRecord]:
            self._expire_workers(conn, now)
            rows = conn.execute(
                f"SELECT {', '.join(_WORKER_COLUMNS)} FROM workers ORDER BY started_at, id"
            ).fetchall()
            return [WorkerRecord(*row) for row in rows]

        return self._write(body)

    def _expire_workers(self, conn: sqlite3.Connection, now: float) -> None:
        gone = conn.execute("DELETE FROM workers WHERE expires_at <= ?", (now,)).rowcount
        if gone:
            logger.info("%s: %d worker rows expired (workers that died?)", self._path, gone)

    def clock(self) -> float:
        return self._clock()

    # --- wake-ups: the data_version watcher -------------------------------------------------

    def _init_watch(self, watch_interval: object) -> None:
        interval = _check_watch_interval(watch_interval)
        if self._path in ("", ":memory:"):
            interval = None  # another connection would open another database: nothing to see
        self._watch_interval = interval
        # Guards _subscribers and _watcher. Held briefly by subscribe(), the unsubscribe
        # functions, close() and the watcher thread (to copy the subscribers, never while
        # calling them). Taken before _lock when both are needed, never after.
        self._watch_lock = threading.Lock()
        self._subscribers: dict[int, Callable[[], object]] = {}
        self._keys = itertools.count()
        self._watcher: _Watcher | None = None

    def subscribe(self, callback: Callable[[], object]) -> Callable[[], None]:
        """`~patterns.jobqueue.store.Store.subscribe` through a watcher thread and ``data_version``.

        The callback is called from the store's watcher thread within about
        ``watch_interval`` seconds of a commit by any other connection to the file, in this
        process or another (SQLite's ``PRAGMA data_version`` changes then); the store's own
        commits do not call it. An exception from it is logged and ignored.

        The first subscription starts the watcher thread with a connection of its own; the
        last unsubscribe and `close` stop it (waiting up to 2 s). If it cannot start, this
        raises and subscribes nobody. With ``watch_interval`` 0 or None, or a ``:memory:``
        database, nothing ever calls ``callback`` and the unsubscribe does nothing.
        """
        with self._watch_lock:
            self._check_open()
            if self._watch_interval is None:
                return _no_op
            watcher = self._own_watcher()
            if watcher is None:
                watcher = self._watcher = self._start_watcher(self._watch_interval)
            key = next(self._keys)
            self._subscribers[key] = callback

        def unsubscribe() -> None:
            with self._watch_lock:
                if self._subscribers.pop(key, None) is None or self._subscribers:
                    return  # already gone, or others still listen
                last = self._own_watcher()
                self._watcher = None
            self._end_watcher(last)

        return unsubscribe

    def _own_watcher(self) -> _Watcher | None:
        """The running watcher of this process, if any; call with _watch_lock held.

        A forked child inherits the parent's record of a watcher, but not its thread: it
        forgets the record and the parent's subscribers, so its own first subscribe starts
        a watcher of its own. The parent's watcher connection is left open in the child,
        never closed there: closing an SQLite connection inherited across fork is unsafe.
        """
        watcher = self._watcher
        if watcher is not None and watcher.pid != os.getpid():
            _INHERITED.append(watcher.conn)
            self._watcher = watcher = None
            self._subscribers.clear()
        return watcher

    def _start_watcher(self, interval: float) -> _Watcher:
        """Open the watcher's connection, read where both connections are, start the thread.

        Both versions are read here, before the subscriber is added, so a commit after
        subscribe() returns is never missed; one before it is the subscriber's to find
        (a worker claims once as it starts).
        """
        try:
            conn = sqlite3.connect(
                self._path, timeout=0, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StoreFileError(
                f"{self._path}: cannot open the watcher's connection: {exc}"
            ) from exc
        try:
            seen = self._retry_busy(lambda: _data_version(conn))
            own = self._retry_busy(lambda: _data_version(self._conn), locked=True)
            watcher = _Watcher(conn, seen, own)
            thread = threading.Thread(
                target=self._watch,
                args=(watcher, interval),
                name=f"jobqueue-watcher-{os.path.basename(self._path)}",
                daemon=True,  # it only reads: a process that exits without close() must not hang
            )
            thread.start()
        except BaseException:
            conn.close()
            raise
        watcher.thread = thread
        logger.debug("%s: watcher started (every %g s)", self._path, interval)
        return watcher

    def _end_watcher(self, watcher: _Watcher | None) -> None:
        """Stop ``watcher``'s thread and wait for it, within `_WATCH_JOIN` seconds."""
        if watcher is None:
            return
        watcher.stop.release()  # once: the watcher record is taken from the store before this
        thread = watcher.thread
        if thread is None or thread is threading.current_thread():
            return  # unsubscribed from inside a callback: the thread ends after it returns
        thread.join(_WATCH_JOIN)
        if thread.is_alive():
            logger.warning(
                "%s: the watcher thread did not end within %g s (a subscriber's call is "
                "still running?); it ends by itself",
                self._path,
                _WATCH_JOIN,
            )

    def _watch(self, watcher: _Watcher, interval: float) -> None:
        """The watcher thread: look every ``interval`` until stopped; log its death."""
        try:
            while not watcher.stop.acquire(timeout=interval):
                if self._changed_elsewhere(watcher):
                    self._fire()
        except BaseException:  # logged: a silent death would leave subscribers only their polls
            logger.exception(
                "%s: the watcher thread died; subscribers find new jobs at their next poll "
                "until they subscribe again",
                self._path,
            )
            with self._watch_lock:
                if self._watcher is watcher:
                    self._watcher = None  # the next subscribe starts a new one
        finally:
            watcher.conn.close()
            logger.debug("%s: watcher stopped", self._path)

    def _changed_elsewhere(self, watcher: _Watcher) -> bool:
        """Whether a connection other than the store's own committed since the last look.

        The watcher's data_version changes on every commit but its own, the store's own
        included (each claim and outcome of a worker in this process); the store's
        connection's changes on other connections' commits only. That one is read only
        after the cheap look saw a change, so an idle store never takes the store's lock.
        """
        try:
            seen = _data_version(watcher.cursor)
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc):
                raise
            return False  # a change stays visible until it is read: look again next time
        if seen == watcher.seen:
            return False
        watcher.seen = seen
        if not self._lock.acquire(timeout=0.05):
            return True  # the store is busy: cannot tell whose commit it was, so wake
        try:
            if self._closed:
                return False
            own = _data_version(self._conn)
        except sqlite3.Error:
            return True  # cannot tell: wake, a spurious wake costs one empty claim
        finally:
            self._lock.release()
        changed, watcher.own = own != watcher.own, own
        return changed

    def _fire(self) -> None:
        with self._watch_lock:
            callbacks = list(self._subscribers.values())
        for callback in callbacks:
            try:
                callback()
            except Exception:
                logger.exception("%s: a subscriber raised; ignored", self._path)

    def close(self) -> None:
        """Release the store's resources (its connections, the watcher thread); idempotent.

        Waits up to 2 s for the watcher thread; one still in a subscriber's call then is
        logged and left to end by itself (it is a daemon thread that only reads).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._conn.close()
        with self._watch_lock:
            watcher = self._own_watcher()
            self._watcher = None
            self._subscribers.clear()
        self._end_watcher(watcher)
