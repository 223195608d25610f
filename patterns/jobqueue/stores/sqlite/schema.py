"""The SQLite job store's file: its schema and migrations, the checks made on opening it, its SQL.

TL;DR: `~.SQLiteStore` keeps the job queue in one SQLite file;
this module is what that file holds and how it is opened. `StoreFile` opens a file: it refuses one
that is not a job store (or is a newer one) before changing anything, then sets WAL mode and
creates or migrates the schema (``MIGRATIONS``, one transaction). The statements the
store's transitions run are kept here by name (``DUE_SQL``, ``SETTLE_SQL``, ...), so the
store reads as its transactions.

``StoreFileError`` and ``SCHEMA_VERSION`` are documented with the store, which re-exports
them. Messages are logged under ``patterns.jobqueue.stores.sqlite``.

Docs: docs/jobqueue/index.md
"""

from __future__ import annotations

import functools
import logging
import os
import sqlite3
import stat
from collections.abc import Callable
from typing import Protocol, TypeVar

from patterns.jobqueue.stores.checks import cancelled_reason
from patterns.jobqueue.stores.records import JOB_COLUMNS, TABLE_SHAPES, WORKER_COLUMNS, Settle

__all__ = [
    "CANCEL_EXPIRED_SQL",
    "CLAIM_BATCH",
    "COLUMNS",
    "DUE_SQL",
    "EXPIRED_SQL",
    "FAIL_SQL",
    "GAVE_BACK",
    "HEADER",
    "INSERT_NEXT_SQL",
    "INSERT_SQL",
    "LAST_ID_SQL",
    "MIGRATIONS",
    "NEXT_DUE_SQL",
    "PURGE_FLOOR_SQL",
    "QUEUED_DUE_SQL",
    "RENEW_SQL",
    "REQUEUE_SQL",
    "SETTLE_SQL",
    "SHAPES",
    "SPENT_SQL",
    "WORKER_COLUMNS",
    "RetryBusy",
    "StoreFile",
    "claim_sql",
    "is_busy",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

SCHEMA_VERSION = (
    4  # documented with the store (patterns.jobqueue.stores.sqlite.store.SCHEMA_VERSION)
)

HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file

# Each entry migrates the schema from version i to i + 1; version 0 is an empty file.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
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
    # Version 3. Partial indexes: the claim searches only queued jobs (by run_at, id) and
    # running ones (by lease expiry), so only those rows are indexed. An enqueue then
    # writes one index entry instead of two, and the finished jobs, most rows of a file
    # in use, are in no index at all. A query uses a partial index only if its WHERE says
    # the index's condition literally (state = 'queued', state = 'running').
    (
        "DROP INDEX jobs_due",
        "DROP INDEX jobs_lease",
        "CREATE INDEX jobs_queued ON jobs (run_at, id) WHERE state = 'queued'",
        "CREATE INDEX jobs_leased ON jobs (lease_until) WHERE state = 'running'",
    ),
    # Version 4. No AUTOINCREMENT: its counter is a row of sqlite_sequence that every
    # insert rewrote, one more page for each enqueue's commit to write (about 5 us of its
    # 40). Ids are still never reused: a new id is one more than the largest of the ids in
    # the table and jobs_id_floor.id, which purge raises to the largest id in the table
    # before it deletes (INSERT_SQL, PURGE_FLOOR_SQL). The table is rebuilt, as for
    # version 2: every row copied with its id, and the floor seeded from the old counter,
    # so an id purged before the migration is never given again either.
    (
        """
        CREATE TABLE jobs_v4 (
            id           INTEGER PRIMARY KEY,  -- never reused: see jobs_id_floor
            task         TEXT    NOT NULL CHECK (task <> ''),
            payload      TEXT    NOT NULL,     -- JSON text, never pickle
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
            result       TEXT,                 -- JSON text, once done
            cancel_requested INTEGER NOT NULL DEFAULT 0 CHECK (cancel_requested IN (0, 1)),
            CHECK ((state = 'running') = (lease_owner IS NOT NULL AND lease_until IS NOT NULL))
        )
        """,
        """
        INSERT INTO jobs_v4 (id, task, payload, state, run_at, attempts, max_attempts,
                             lease_owner, lease_until, last_error, created_at, updated_at,
                             timeout, result, cancel_requested)
        SELECT id, task, payload, state, run_at, attempts, max_attempts,
               lease_owner, lease_until, last_error, created_at, updated_at,
               timeout, result, cancel_requested FROM jobs
        """,
        # One row: no id at or below it is ever given again (the largest id purged, or
        # given before version 4: AUTOINCREMENT's counter, which never went down).
        "CREATE TABLE jobs_id_floor (id INTEGER NOT NULL CHECK (id >= 0))",
        """
        INSERT INTO jobs_id_floor (id) SELECT MAX(
            IFNULL((SELECT seq FROM sqlite_sequence WHERE name = 'jobs'), 0),
            IFNULL((SELECT MAX(id) FROM jobs), 0))
        """,
        "DROP TABLE jobs",  # SQLite deletes its sqlite_sequence row with it
        "ALTER TABLE jobs_v4 RENAME TO jobs",
        "CREATE INDEX jobs_queued ON jobs (run_at, id) WHERE state = 'queued'",
        "CREATE INDEX jobs_leased ON jobs (lease_until) WHERE state = 'running'",
    ),
)
assert len(MIGRATIONS) == SCHEMA_VERSION  # a new schema version needs its migration

# The claim's read: two index searches (queued by run_at, running by lease expiry: the
# partial indexes jobs_queued and jobs_leased) merged in (run_at, id) order, rather than
# one OR that would scan the whole table.
_DUE_COLUMNS = ", ".join(JOB_COLUMNS)  # the whole row: the claim reads no more
DUE_SQL = (
    f"SELECT {_DUE_COLUMNS} FROM ("
    f" SELECT {_DUE_COLUMNS} FROM jobs"
    "  WHERE state = 'queued' AND run_at <= ?"
    " UNION ALL"
    f" SELECT {_DUE_COLUMNS} FROM jobs"
    "  WHERE state = 'running' AND lease_until <= ?"
    ") ORDER BY run_at, id LIMIT ?"
)
# DUE_SQL when no running job's lease has ended (EXPIRED_SQL said so): only queued jobs
# can be due, read in (run_at, id) order straight from the index, with no merge or sort.
QUEUED_DUE_SQL = (
    f"SELECT {_DUE_COLUMNS} FROM jobs WHERE state = 'queued' AND run_at <= ?"
    " ORDER BY run_at, id LIMIT ?"
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
GAVE_BACK = cancelled_reason("and its worker gave it back")
SETTLE_SQL = {
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

COLUMNS = ", ".join(JOB_COLUMNS)
# The tables (and their columns) of each schema version: what opening checks a file has
# (the same for both SQL stores up to version 2; version 3, SQLite's own, changed only
# the indexes, and version 4 added the id floor's table).
SHAPES = {
    **TABLE_SHAPES,
    3: TABLE_SHAPES[2],
    4: {**TABLE_SHAPES[2], "jobs_id_floor": ("id",)},  # and no AUTOINCREMENT
}

# The claim's other statements, and the other transitions', in the order the store runs them.
# The id: one more than the largest in the table or the floor, whichever is larger, so
# never one given before, even if purge deleted the job that had the largest. (SQLite's own
# choice, without AUTOINCREMENT, is the first only.) Two reads of pages the insert's commit
# has cached, where AUTOINCREMENT wrote one more page.
INSERT_SQL = (
    "INSERT INTO jobs (id, task, payload, state, run_at, attempts, max_attempts,"
    " created_at, updated_at, timeout) VALUES ("
    "(SELECT MAX(IFNULL((SELECT MAX(id) FROM jobs), 0), id) + 1 FROM jobs_id_floor),"
    " ?, ?, 'queued', ?, 0, ?, ?, ?, ?)"
)
# The rows of enqueue_many after its first: SQLite gives each the table's largest id plus
# one, which is right once the first row, above the floor, is the largest (no purge runs
# inside the transaction); so the batch takes consecutive ids, in order, in one executemany.
INSERT_NEXT_SQL = (
    "INSERT INTO jobs (task, payload, state, run_at, attempts, max_attempts,"
    " created_at, updated_at, timeout) VALUES (?, ?, 'queued', ?, 0, ?, ?, ?, ?)"
)
LAST_ID_SQL = "SELECT MAX(id) FROM jobs"
# Run by purge before it deletes: the floor keeps the largest id the table holds, so the
# next insert goes on above it even if the job with that id is deleted.
PURGE_FLOOR_SQL = "UPDATE jobs_id_floor SET id = MAX(id, IFNULL((SELECT MAX(id) FROM jobs), 0))"
# The claim's first look, one index search: has any running job's lease ended? Nearly
# never, so the claim runs the next two statements and DUE_SQL only when one has, and
# QUEUED_DUE_SQL otherwise, instead of two more statements and a merge on every claim.
EXPIRED_SQL = "SELECT EXISTS (SELECT 1 FROM jobs WHERE state = 'running' AND lease_until <= ?)"
CANCEL_EXPIRED_SQL = (
    "UPDATE jobs SET state = 'cancelled', last_error = ?, lease_owner = NULL,"
    " lease_until = NULL, updated_at = ?"
    " WHERE state = 'running' AND lease_until <= ? AND cancel_requested = 1"
)
SPENT_SQL = (
    "SELECT id, attempts FROM jobs WHERE state = 'running'"
    " AND lease_until <= ? AND attempts >= max_attempts"
)
FAIL_SQL = (
    "UPDATE jobs SET state = 'failed', last_error = ?, lease_owner = NULL,"
    " lease_until = NULL, updated_at = ? WHERE id = ?"
)
CLAIM_BATCH = 64  # jobs one claim_sql statement takes at most: 3 * 64 + 2 parameters


@functools.cache  # one text per batch size, so sqlite3's statement cache reuses it
def claim_sql(count: int) -> str:
    """The UPDATE that claims ``count`` due jobs (1 to ``CLAIM_BATCH``) in one statement.

    Each job takes its own token, picked by a CASE on its id. The parameters are ``count``
    pairs (id, token), then the lease's end and ``updated_at``, then the ``count`` ids.
    """
    tokens = " ".join(["WHEN ? THEN ?"] * count)
    ids = ", ".join(["?"] * count)
    return (
        "UPDATE jobs SET state = 'running', attempts = attempts + 1,"
        f" lease_owner = CASE id {tokens} END, lease_until = ?, updated_at = ?"
        f" WHERE id IN ({ids})"
    )


RENEW_SQL = (
    "UPDATE jobs SET lease_until = ?, updated_at = ?"
    " WHERE id = ? AND state = 'running' AND lease_owner = ?"
)
REQUEUE_SQL = (
    "UPDATE jobs SET state = 'queued', attempts = 0, run_at = ?, updated_at = ?,"
    " cancel_requested = 0, result = NULL WHERE state = 'failed'"
)
NEXT_DUE_SQL = (
    "SELECT MIN(t) FROM ("
    " SELECT MIN(run_at) AS t FROM jobs WHERE state = 'queued'"
    " UNION ALL"
    " SELECT MIN(lease_until) FROM jobs WHERE state = 'running')"
)


class StoreFileError(RuntimeError):
    """The file cannot be used as a job store: not a database, not ours, too new, or damaged."""

    # Users import it from, and the docs document it with, the store's module.
    __module__ = "patterns.jobqueue.stores.sqlite.store"


def is_busy(exc: sqlite3.OperationalError) -> bool:
    """True for "database is locked" / "database table is locked" (SQLITE_BUSY, LOCKED)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


class RetryBusy(Protocol):
    """The store's ``_retry_busy``: run a step, retrying while the database is busy."""

    def __call__(self, step: Callable[[], T], *, locked: bool = False) -> T:
        """Run ``step``; with ``locked``, each attempt holds the store's lock."""
        ...


class StoreFile:
    """Opening the job store file at ``path``: check it, set WAL mode, create or migrate it.

    ``retry_busy`` is the store's busy retry; ``busy_timeout`` the seconds SQLite's busy
    handler waits, per attempt. With ``create`` False a missing file is refused.
    """

    def __init__(
        self,
        path: str,
        *,
        create: bool,
        synchronous: str,
        busy_timeout: float,
        retry_busy: RetryBusy,
    ) -> None:
        self._path = path
        self._create = create
        self._synchronous = synchronous  # checked by the store: one of NORMAL, FULL, EXTRA
        self._busy_timeout = busy_timeout
        self._retry_busy = retry_busy

    def open(self) -> sqlite3.Connection:
        """A connection to the checked file, in WAL mode, with the current schema."""
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
            # check_same_thread=False: the connection moves between threads, but the store's
            # lock makes sure only one uses it at a time, which is what that check protects.
            conn = sqlite3.connect(
                self._path,
                timeout=self._busy_timeout,
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
            _refuse_special(self._path, os.stat(self._path).st_mode)
            # O_NONBLOCK: a FIFO put there since the stat opens at once instead of waiting
            # for a writer; fstat then refuses it, unread.
            fd = os.open(self._path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError:
            return  # a directory, say: sqlite3.connect says what is wrong with it
        try:
            _refuse_special(self._path, os.fstat(fd).st_mode)
            head = os.read(fd, len(HEADER))
        except OSError:
            return
        finally:
            os.close(fd)
        if head and head != HEADER:
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
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")  # checked by the store
            if version < SCHEMA_VERSION:
                self._retry_busy(lambda: self._migrate(conn))
            self._check_shape(conn)
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) and is_busy(exc):
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
                for statement in MIGRATIONS[target - 1]:
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
        for table, expected in SHAPES[version].items():
            columns = tuple(row[1] for row in conn.execute(f"PRAGMA table_info({table})"))
            if columns != expected:
                raise StoreFileError(
                    f"{self._path}: schema version {version} but table {table!r} has "
                    f"columns {list(columns)}, expected {list(expected)}; "
                    "this file was not written by this job store"
                )


_SPECIAL = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _refuse_special(path: str, mode: int) -> None:
    """`StoreFileError` if ``mode`` is a FIFO's, a socket's or a device's: not a queue file.

    Reading a FIFO blocks until someone writes to it (every command would hang), and
    reading a device may do anything; neither can hold a queue.
    """
    for test, name in _SPECIAL:
        if test(mode):
            raise StoreFileError(f"{path}: not a queue file: it is {name}")
