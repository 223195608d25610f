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
      before it touches the file. A file of an older version is migrated in one
      transaction.
    * A new database file is created readable and writable by its owner only (0600),
      through a dangling symlink too; SQLite gives its ``-wal`` and ``-shm`` files the
      same mode.
    * The store's lock is never held while it sleeps between busy retries, and a renew
      touches the lease only (no payload is read).
    * A write that fails because the disk is full raises as before, and the store then
      checkpoints the WAL so that the ``-wal`` file gives its space back, now or, if the
      disk is still too full for that, before the next write
      (``patterns.jobqueue.stores.sqlite.checkpoint`` says when else it does).
    * While anyone subscribes, a commit by another connection or process calls the
      subscribers within about ``watch_interval`` (a watcher thread reads ``PRAGMA
      data_version``), or within 0.1 s when it is the first after half a second without
      one (the watcher looks less often while nothing happens); the store's own commits
      do not. The thread starts with the first
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
    ``patterns.jobqueue.stores.protocol`` (the protocol and the state diagram),
    ``patterns.jobqueue.stores.memory`` (the same contract in memory). This store's parts:
    ``patterns.jobqueue.stores.sqlite.admin`` (the operator's methods and the worker rows),
    ``patterns.jobqueue.stores.sqlite.schema`` (the schema, migrations, opening checks and SQL),
    ``patterns.jobqueue.stores.sqlite.transactions`` (``BEGIN IMMEDIATE``, busy retries, damage),
    ``patterns.jobqueue.stores.sqlite.watch`` (the ``data_version`` watcher behind ``subscribe``),
    ``patterns.jobqueue.stores.sqlite.checkpoint`` (WAL checkpoints: a full disk, a quiet file).

Docs: docs/jobqueue/index.md
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

from patterns.jobqueue.stores.checks import (
    cancelled_reason,
    check_lease,
    check_limit,
    check_max_payload_bytes,
    check_owner,
    check_share,
    expired_reason,
    new_token,
    prepare_enqueue,
    prepare_many,
    prepare_settlement,
    storable_error,
)
from patterns.jobqueue.stores.records import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Claim,
    Job,
    JobState,
    NewJob,
    Settle,
    Settlement,
)
from patterns.jobqueue.stores.sqlite import schema as sqlite_schema
from patterns.jobqueue.stores.sqlite.admin import SQLiteAdmin
from patterns.jobqueue.stores.sqlite.checkpoint import WalRecovery
from patterns.jobqueue.stores.sqlite.schema import (
    CANCEL_EXPIRED_SQL,
    CLAIM_BATCH,
    DUE_SQL,
    EXPIRED_SQL,
    FAIL_SQL,
    GAVE_BACK,
    INSERT_NEXT_SQL,
    INSERT_SQL,
    LAST_ID_SQL,
    NEXT_DUE_SQL,
    QUEUED_DUE_SQL,
    RENEW_SQL,
    SETTLE_SQL,
    SPENT_SQL,
    StoreFile,
    StoreFileError,
    claim_sql,
)
from patterns.jobqueue.stores.sqlite.transactions import JoinedTransaction
from patterns.jobqueue.stores.sqlite.watch import DataVersionWatch, data_version

__all__ = ["BUSY_TIMEOUT", "SCHEMA_VERSION", "WATCH_INTERVAL", "SQLiteStore", "StoreFileError"]

logger = logging.getLogger(__name__)


SCHEMA_VERSION = sqlite_schema.SCHEMA_VERSION
"""The schema this code writes; kept in the file's ``PRAGMA user_version``.

Version 2 added the ``cancelled`` state, the job columns ``timeout``, ``result`` and
``cancel_requested``, and the ``workers`` table. Version 3 replaced the two indexes over
every row by partial ones over the queued and the running jobs only (what a claim
searches). Version 4 dropped ``AUTOINCREMENT`` (a page less for each enqueue to write)
and keeps ids from being reused with a floor that purge raises instead. Opening a version 1,
2 or 3 file migrates it. The schema and its migrations are in
``patterns.jobqueue.stores.sqlite.schema``.
"""

BUSY_TIMEOUT = 5.0
"""Seconds a transaction waits for another connection's lock, per attempt."""

BUSY_SLICE = 0.1
"""Seconds of one of SQLite's busy waits: a stop's deadline is looked at between two."""

WATCH_INTERVAL = 0.015
"""Seconds between two looks at the file's ``PRAGMA data_version`` while anyone subscribes.

A job enqueued by another process wakes a subscribed worker within about this long (half
of it on average). Each look costs the watcher thread a timed wake-up and a read
transaction, about 110 µs of CPU on the 2-vCPU machine of the performance page (70 of them
the wake-up alone): 1.2 % of a core at 10 ms, so the default is 15 ms. The cost is per
look, so it grows as the interval shrinks (``benchmarks/jobqueue_latency.py``, table 3b).
"""

_SYNCHRONOUS = frozenset({"NORMAL", "FULL", "EXTRA"})

_Outcome: TypeAlias = tuple[Settle, str | None, float]  # what prepare_settlement returns


class SQLiteStore(SQLiteAdmin):
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
        self._clock = clock
        # Guards _conn and _closed: held for every transaction attempt, so the connection
        # is used by one thread at a time and close() cannot pull it away mid-transaction.
        # Never held during the pause between two attempts of a busy transaction, so a
        # heartbeat's renew is not kept waiting by another thread's backoff. Waited on by
        # any thread calling a store method; the only caller code run while it is held is
        # the clock, which must not call back into the store.
        self._lock = threading.Lock()
        # An attempt waits for a busy file up to BUSY_TIMEOUT, in busy waits of one slice.
        self._busy_timeout = BUSY_TIMEOUT
        self._busy_slice = min(BUSY_TIMEOUT, BUSY_SLICE)
        self._shared = JoinedTransaction()  # .now: inside settle_and_claim's transaction
        self._closed = False
        # Set (under _lock) once a transaction found the file damaged: from then on every
        # write is refused before it touches the file, so nothing is written into a file
        # that is known to be broken (a worker's row included) until it is reopened.
        self._damage: str | None = None
        # The WAL checkpoint a write that found the disk full leaves owed, until one
        # finishes (patterns.jobqueue.stores.sqlite.checkpoint).
        self._wal = WalRecovery(self._path)
        # The wake-ups (subscribe): handed the lock, a read of this connection's
        # data_version, the closed flag, and the busy retry (patterns.jobqueue.stores.sqlite.watch).
        self._watch = DataVersionWatch(
            self._path,
            watch_interval,
            lock=self._lock,
            own_version=lambda: data_version(self._conn),
            is_closed=lambda: self._closed,
            check_open=self._check_open,
            retry_busy=self._retry_busy,
        )
        self._conn = StoreFile(
            self._path,
            create=create,
            synchronous=level,
            busy_timeout=self._busy_slice,
            retry_busy=self._retry_busy,
        ).open()

    def __repr__(self) -> str:
        return f"SQLiteStore({self._path!r}, closed={self._closed})"

    @property
    def path(self) -> str:
        """The database file."""
        return self._path

    # --- the worker's path: every method below runs in _write or _read, the transactions ---
    # --- of SQLiteTransactions (transactions.py); the operator's methods are in admin.py ---

    @staticmethod
    def _insert(conn: sqlite3.Connection, new: NewJob, now: float) -> int:
        cursor = conn.execute(
            INSERT_SQL,
            (new.task, new.payload_json, new.run_at, new.max_attempts, now, now, new.timeout),
        )
        job_id = cursor.lastrowid
        assert job_id is not None  # an INSERT always sets it
        return job_id

    def _enqueue(self, spec: Mapping[str, Any]) -> int:
        # A bad argument raises inside the transaction, which rolls back: nothing written.
        def body(conn: sqlite3.Connection, now: float) -> int:
            new = prepare_enqueue(now, **spec, max_payload_bytes=self._max_payload_bytes)
            return self._insert(conn, new, now)

        job_id = self._write(body)
        logger.debug("%s: enqueued job %d (%s)", self._path, job_id, spec["task"])
        return job_id

    def enqueue_many(self, jobs: Sequence[Mapping[str, Any]]) -> list[int]:
        def body(conn: sqlite3.Connection, now: float) -> list[int]:
            prepared = prepare_many(now, jobs, self._max_payload_bytes)
            if not prepared:
                return []
            # The first row's id goes above the floor; the others follow it, one apart
            # (INSERT_NEXT_SQL), so one executemany writes them and their ids are known.
            first = self._insert(conn, prepared[0], now)
            conn.executemany(
                INSERT_NEXT_SQL,
                [
                    (
                        new.task,
                        new.payload_json,
                        new.run_at,
                        new.max_attempts,
                        now,
                        now,
                        new.timeout,
                    )
                    for new in prepared[1:]
                ],
            )
            last = first + len(prepared) - 1
            if conn.execute(LAST_ID_SQL).fetchone()[0] != last:  # never: rolled back if so
                raise AssertionError(f"{self._path}: enqueue_many's ids are not {first}-{last}")
            return list(range(first, last + 1))

        ids = self._write(body)
        logger.debug("%s: enqueued %d jobs", self._path, len(ids))
        return ids

    def claim(self, owner: str, *, lease: float, limit: int = 1) -> list[Claim]:
        check_owner(owner)
        seconds = check_lease(lease)
        count = check_limit(limit)
        reason = cancelled_reason("and its lease expired")

        def body(conn: sqlite3.Connection, now: float) -> list[Claim]:
            # Nearly always no lease has ended, and one index search says so: the two
            # statements that end expired leases run only when one has, and otherwise
            # only queued jobs can be due (the write lock keeps it so until COMMIT).
            if conn.execute(EXPIRED_SQL, (now,)).fetchone()[0]:
                self._end_expired(conn, now, reason)
                due = conn.execute(DUE_SQL, (now, now, count)).fetchall()
            else:
                due = conn.execute(QUEUED_DUE_SQL, (now, count)).fetchall()
            tokens = [new_token(owner) for _ in due]
            self._take(conn, [row[0] for row in due], tokens, now + seconds, now)
            claims = []
            for row, token in zip(due, tokens, strict=True):
                job_id, state, old_owner = row[0], row[3], row[7]
                if state == JobState.RUNNING:
                    logger.warning(
                        "%s: job %d: lease of %s expired, claiming it again",
                        self._path,
                        job_id,
                        old_owner,
                    )
                # The claimed row is the due row with the claim's changes: no SELECT per job.
                claimed = list(row)
                claimed[3], claimed[5] = JobState.RUNNING.value, row[5] + 1
                claimed[7], claimed[8], claimed[11] = token, now + seconds, now
                job = self._claimed(conn, job_id, now, claimed)
                if job is not None:
                    claims.append(Claim(job, token, now + seconds))
            return claims

        return self._write(body)

    def _end_expired(self, conn: sqlite3.Connection, now: float, reason: str) -> None:
        """End the expired leases no claim may take: cancel requested, or no attempt left."""
        cancelled = conn.execute(CANCEL_EXPIRED_SQL, (reason, now, now)).rowcount
        if cancelled:
            logger.warning("%s: %d jobs %s", self._path, cancelled, reason)
        spent = conn.execute(SPENT_SQL, (now,)).fetchall()
        for job_id, attempts in spent:
            conn.execute(FAIL_SQL, (expired_reason(attempts), now, job_id))
            logger.warning("%s: job %d failed: %s", self._path, job_id, expired_reason(attempts))

    @staticmethod
    def _take(
        conn: sqlite3.Connection, ids: list[int], tokens: list[str], until: float, now: float
    ) -> None:
        """Claim the jobs ``ids``, each under its token: one UPDATE per ``CLAIM_BATCH`` jobs."""
        for start in range(0, len(ids), CLAIM_BATCH):
            batch = ids[start : start + CLAIM_BATCH]
            owners = tokens[start : start + CLAIM_BATCH]
            pairs = [value for pair in zip(batch, owners, strict=True) for value in pair]
            conn.execute(claim_sql(len(batch)), (*pairs, until, now, *batch))

    def _claimed(
        self, conn: sqlite3.Connection, job_id: int, now: float, row: Sequence[Any]
    ) -> Job | None:
        """The job just claimed, or None after failing it if its payload is not JSON.

        A hostile or damaged file must not stop the worker: the bad job ends ``failed``
        with the reason, inside the same transaction, and the claim moves on.
        """
        try:
            return self._job(row)
        except StoreFileError as exc:
            reason = storable_error(exc)
        conn.execute(FAIL_SQL, (reason, now, job_id))
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
            params: tuple[Any, ...] = (GAVE_BACK, text, when)
        elif kind is Settle.RELEASE:
            params = (GAVE_BACK,)
        else:
            params = (text,)
        cursor = conn.execute(SETTLE_SQL[kind], (*params, now, claim.job.id, claim.token))
        return cursor.rowcount == 1

    def settle_many(self, items: Sequence[Settlement]) -> list[bool | Exception]:
        """`~.Store.settle_many` in one ``BEGIN IMMEDIATE`` transaction.

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
        """`~.Store.settle_and_claim` in one ``BEGIN IMMEDIATE`` transaction.

        `settle_many` and `claim` run their own code, joined to this transaction; a busy
        database retries the whole of it, a failure rolls all of it back.
        """
        count = check_share(items, owner, lease, limit)
        if count is None:
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
            cursor = conn.execute(RENEW_SQL, (now + seconds, now, claim.job.id, claim.token))
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

    def next_due(self) -> float | None:
        row = self._read(lambda conn: conn.execute(NEXT_DUE_SQL).fetchone())
        return None if row[0] is None else float(row[0])

    def clock(self) -> float:
        return self._clock()

    # --- wake-ups: the data_version watcher (patterns.jobqueue.stores.sqlite.watch) ---------------

    def subscribe(self, callback: Callable[[], object]) -> Callable[[], None]:
        """`~.Store.subscribe` through a watcher thread and ``data_version``.

        The callback is called from the store's watcher thread within about
        ``watch_interval`` seconds of a commit by any other connection to the file, in this
        process or another (SQLite's ``PRAGMA data_version`` changes then); the store's own
        commits do not call it. After `~patterns.jobqueue.stores.sqlite.watch.WATCH_QUIET` seconds
        without such a commit the watcher looks less often, so the first one after a quiet
        spell calls it within `~patterns.jobqueue.stores.sqlite.watch.WATCH_IDLE_INTERVAL` (0.1 s)
        instead. An exception from it is logged and ignored.

        The first subscription starts the watcher thread with a connection of its own; the
        last unsubscribe and `close` stop it (waiting up to 2 s). If it cannot start, this
        raises and subscribes nobody. With ``watch_interval`` 0 or None, or a ``:memory:``
        database, nothing ever calls ``callback`` and the unsubscribe does nothing.
        """
        return self._watch.subscribe(callback)

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
        self._watch.close()
