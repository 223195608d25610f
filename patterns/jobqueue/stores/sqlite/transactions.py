"""The SQLite store's transactions: ``BEGIN IMMEDIATE``, busy retries with backoff, damage.

TL;DR: `SQLiteTransactions` is the part of `~.SQLiteStore` that
runs a transaction on the store's one connection: its ``_write`` takes SQLite's write
lock before reading anything (``BEGIN IMMEDIATE``), retries the whole transaction a bounded
number of times with backoff while the database is busy (never holding the store's lock
while it sleeps), and once a transaction finds the file damaged, refuses every later write
before it touches the file. The store inherits it; its ``__init__`` sets the attributes
listed on the class. Messages are logged under
``patterns.jobqueue.stores.sqlite``.

Docs: docs/jobqueue/index.md
"""

from __future__ import annotations

import itertools
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from patterns.jobqueue.stores.checks import backoff
from patterns.jobqueue.stores.deadline import acquire, give_up, patient, time_left
from patterns.jobqueue.stores.sqlite.checkpoint import WalRecovery
from patterns.jobqueue.stores.sqlite.schema import StoreFileError, is_busy

__all__ = ["JoinedTransaction", "SQLiteTransactions"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_BUSY_RETRIES = 5  # transaction attempts before a busy error is raised to the caller
_BACKOFF = 0.05  # seconds before the first retry; doubles each time, plus jitter
_BACKOFF_CAP = 1.0  # the longest pause between two attempts, before jitter


class JoinedTransaction(threading.local):
    """Per thread: ``now``, the time of the open transaction its store calls join, or None.

    `~.SQLiteStore.settle_and_claim` sets it for the calls it makes inside its own
    transaction. A class attribute, so a thread that never set it reads None at once: a
    plain ``threading.local`` raises AttributeError for a name never set, and every
    write looks.
    """

    now: float | None = None


class SQLiteTransactions:
    """Transactions on one connection, used by one thread at a time (a base of the store)."""

    # Set by the store's __init__ (which says what each guards).
    _path: str
    _clock: Callable[[], float]
    _lock: threading.Lock
    _shared: JoinedTransaction
    _closed: bool
    _busy_timeout: float  # seconds an attempt waits for a busy database
    _busy_slice: float  # seconds one of SQLite's busy waits lasts (the connection's timeout)
    _damage: str | None
    _conn: sqlite3.Connection
    _wal: WalRecovery

    def _retry_busy(self, step: Callable[[], T], *, locked: bool = False) -> T:
        """Run ``step``, retrying a bounded number of times while the database is busy.

        ``step`` must leave no transaction open when it raises (every caller rolls back),
        so a retry starts from a clean slate and a final failure changed nothing. With
        ``locked``, each attempt runs holding ``_lock`` on an open store, and the pause
        between attempts does not: another thread's short transaction (a heartbeat's
        renew) gets its turn instead of waiting out this one's backoff.

        An attempt waits for a busy database up to ``_busy_timeout``, in SQLite's busy
        waits of ``_busy_slice`` each (the connection's timeout), so that a thread under a
        stop's deadline (`patterns.jobqueue.stores.deadline`) gives up within a slice of it,
        raising `~patterns.jobqueue.stores.deadline.StoreTimeout`, even if it began waiting before
        the deadline was set. Its wait for ``_lock`` keeps to the deadline too. Under a
        patient deadline (a command's ``--wait``) it retries until that deadline instead
        of ``_BUSY_RETRIES`` times.
        """
        began = time.monotonic()
        if time_left(began) is not None:
            return self._retry_loop(step, locked, began, None)
        # The common case, made short: no deadline bounds this thread, so the first attempt
        # needs none of the loop's bookkeeping (every enqueue would pay for it). The loop
        # runs only once the database was busy, and carries on from that error as if it
        # had made this attempt itself.
        try:
            return self._attempt_unbounded(step, locked)
        except sqlite3.OperationalError as exc:
            if not is_busy(exc):
                raise
            busy = exc
        return self._retry_loop(step, locked, began, busy)

    def _retry_loop(
        self,
        step: Callable[[], T],
        locked: bool,
        began: float,
        busy: sqlite3.OperationalError | None,
    ) -> T:
        """`_retry_busy`'s attempts and pauses; ``busy``: what a first attempt raised, if any."""
        error: sqlite3.OperationalError | None = None
        for attempt in itertools.count(1):
            busy_since = began if attempt == 1 else time.monotonic()
            while True:
                if busy is None:
                    if time_left(began) == 0.0:  # this thread already gave up on the store
                        if error is None:
                            raise give_up(f"{self._path}: not tried")
                        raise give_up(f"{self._path}: database busy ({error})") from error
                    try:
                        return self._attempt(step, locked, began)
                    except sqlite3.OperationalError as exc:
                        if not is_busy(exc):
                            raise
                        busy = exc
                failed, busy = busy, None
                if time_left(began) == 0.0:
                    raise give_up(f"{self._path}: database busy ({failed})") from failed
                if time.monotonic() - busy_since < self._busy_timeout:
                    continue  # SQLite's busy handler waited one slice: wait another
                if attempt >= _BUSY_RETRIES and not patient():
                    raise failed
                error = failed
                break
            pause = backoff(_BACKOFF, attempt, _BACKOFF_CAP)
            left = time_left(began)
            pause = pause if left is None else min(pause, left)
            logger.warning(
                "%s: database busy (%s), retry %d of %s in %.2f s",
                self._path,
                error,
                attempt,
                "those the deadline allows" if patient() else _BUSY_RETRIES - 1,
                pause,
                extra={"retry": True},  # a one-shot command leaves these out (as PostgreSQL's)
            )
            time.sleep(pause)
        raise AssertionError("unreachable")  # pragma: no cover

    def _attempt_unbounded(self, step: Callable[[], T], locked: bool) -> T:
        """`_attempt` for a thread without a deadline: it waits for the lock as long as it takes."""
        if not locked:
            return step()
        with self._lock:
            self._check_open()
            return step()

    def _attempt(self, step: Callable[[], T], locked: bool, began: float) -> T:
        if not locked:
            return step()
        acquire(self._lock, began, self._path)  # within this thread's deadline, if it has one
        try:
            self._check_open()
            return step()
        finally:
            self._lock.release()

    def _write(self, body: Callable[[sqlite3.Connection, float], T]) -> T:
        """Run ``body(conn, now)`` in one ``BEGIN IMMEDIATE`` transaction, with retries.

        Inside `settle_and_claim`'s transaction (this thread, lock held) ``body`` joins it.
        """
        now = self._shared.now
        if now is not None:
            return body(self._conn, now)

        self._wal.before_write()  # a checkpoint owed since a write found the disk full

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
            self._wal.after_failure(exc)  # a full disk: checkpoint, then raise as before
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
