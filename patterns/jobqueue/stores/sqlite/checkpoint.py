"""The SQLite store's WAL checkpoints: give the ``-wal`` file's space back when it matters.

TL;DR: In WAL mode every commit is appended to the ``-wal`` file, and SQLite folds it back
into the database (a checkpoint) only once it holds 1,000 pages, about 4 MB. On a smaller
disk the file fills the disk first, and a write that fails for lack of space leaves it as
big as ever: the space freed after an outage goes to the same file again, and the store
stays full. So the store runs ``PRAGMA wal_checkpoint(TRUNCATE)`` itself, which copies
the committed pages into the database file and cuts the ``-wal`` file to zero bytes:

* after a write failed for lack of space, and before each later write until one such
  checkpoint finished (`WalRecovery`, every store);
* from the watcher thread of a store with subscribers (a worker, `WatchCheckpoints`):
  when the ``-wal`` file has grown past half the space left on its disk, and once per
  quiet spell (no commit for `IDLE_QUIET` seconds) if it is bigger than `IDLE_WAL_BYTES`.

Guarantees:
    * A write that fails with SQLITE_FULL still raises as before: the checkpoint runs after
      its transaction rolled back, on a connection of its own that never waits for a lock
      (another connection's transaction makes it give up at once), and its own failure is
      logged, never raised.
    * A checkpoint that could not finish (the database file must grow and the disk is
      still full, or another connection was busy) is owed: it is tried again before each
      write until one finishes, so the first write after space was freed gives the
      ``-wal`` file's space back before it appends anything.
    * None of this changes what a commit means: a checkpoint only copies committed pages.

Messages are logged under ``patterns.jobqueue.stores.sqlite``.

Docs: docs/jobqueue/operations.md
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import urllib.parse

__all__ = [
    "IDLE_QUIET",
    "IDLE_WAL_BYTES",
    "WalRecovery",
    "WatchCheckpoints",
    "free_bytes",
    "is_full",
    "truncate_wal",
    "wal_path",
    "wal_size",
]

logger = logging.getLogger(__name__)

_FULL = "database or disk is full"  # SQLite's message for SQLITE_FULL

IDLE_QUIET = 1.0
"""Seconds without a commit to the file before the watcher's idle checkpoint."""

IDLE_WAL_BYTES = 256 * 1024
"""The idle checkpoint runs only when the ``-wal`` file is bigger than this (64 pages)."""


def is_full(exc: BaseException) -> bool:
    """True for SQLite's "database or disk is full" (SQLITE_FULL, error code 13)."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return bool(code & 0xFF == sqlite3.SQLITE_FULL)
    return _FULL in str(exc)


def wal_path(path: str) -> str:
    """The ``-wal`` file of the database at ``path`` (SQLite puts it beside the real file)."""
    return os.path.realpath(path) + "-wal"


def wal_size(wal: str) -> int:
    """The size of the ``-wal`` file in bytes; 0 if there is none."""
    try:
        return os.stat(wal).st_size
    except OSError:
        return 0


def truncate_wal(conn: sqlite3.Connection) -> bool:
    """Run ``PRAGMA wal_checkpoint(TRUNCATE)`` on ``conn``: True if it finished.

    Finished means every committed page is in the database file: the ``-wal`` file was
    cut to zero bytes, or, if a reader kept it, the next writer starts it over instead of
    growing it. Raises `sqlite3.Error` when the checkpoint fails (a full disk).
    """
    busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    return bool(busy == 0 or (frames >= 0 and copied == frames))


def free_bytes(directory: str) -> int | None:
    """Bytes an unprivileged writer may still use on the disk holding ``directory``."""
    try:
        stats = os.statvfs(directory)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


class WatchCheckpoints:
    """The checkpoints the watcher thread runs between its looks; see the module docstring.

    `after_look` is told after each look whether any connection had committed since the
    one before (the watcher's ``data_version`` moved) and how long the watcher waited; it
    checkpoints on ``conn``, the watcher's own connection, which never waits for a lock:

    * after a commit, when the ``-wal`` file has grown bigger than half the space left
      on its disk (two system calls a look): the checkpoint then still has room to grow
      the database file by as much as the ``-wal`` file holds, which it cannot do once
      that file has taken the last byte.
    * once per quiet spell: after `IDLE_QUIET` seconds of waits without a commit, if the
      ``-wal`` file is bigger than `IDLE_WAL_BYTES`. A smaller one is left alone: a
      checkpoint changes every other connection's ``data_version``, so each watcher of
      the file wakes its worker for an empty claim, and an idle worker's heartbeat adds a
      few pages every few seconds, not worth that.
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._wal = wal_path(path)
        self._directory = os.path.dirname(self._wal)
        self._quiet = 0.0  # seconds waited since the last commit seen
        self._idle_done = False  # this quiet spell's checkpoint was considered

    def after_look(self, conn: sqlite3.Connection, committed: bool, waited: float) -> None:
        """Count the wait; checkpoint if the space left or a quiet spell says so. Never raises."""
        if committed:
            self._quiet, self._idle_done = 0.0, False
            if self._outgrew_disk():
                self._checkpoint(conn, "the -wal file outgrew half the space left on its disk")
            return
        if self._idle_done:
            return
        self._quiet += waited
        if self._quiet >= IDLE_QUIET:
            self._idle_done = True
            if wal_size(self._wal) > IDLE_WAL_BYTES:
                self._checkpoint(conn, "idle")

    def _outgrew_disk(self) -> bool:
        size = wal_size(self._wal)
        free = free_bytes(self._directory) if size else None
        return free is not None and 2 * size > free

    def _checkpoint(self, conn: sqlite3.Connection, why: str) -> None:
        """One checkpoint; logged at INFO when it freed the file, else at DEBUG."""
        before = wal_size(self._wal)
        try:
            done = truncate_wal(conn)
        except sqlite3.Error as exc:
            logger.debug("%s: WAL checkpoint (%s) failed: %s", self._path, why, exc)
            return
        logger.log(
            logging.INFO if done and why != "idle" else logging.DEBUG,
            "%s: WAL checkpoint (%s) %s; -wal file %d -> %d bytes",
            self._path,
            why,
            "done" if done else "not finished (another connection was busy)",
            before,
            wal_size(self._wal),
        )


class WalRecovery:
    """The checkpoint a store owes after a write failed for lack of space; see the module.

    ``after_failure(exc)`` is called with every error a write raises (outside its
    transaction, without the store's lock); ``before_write()`` before every write. Both
    are cheap while nothing is owed: one attribute read.
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._wal = "" if path in ("", ":memory:") else wal_path(path)
        # Never creates the file: a database deleted meanwhile stays deleted.
        self._uri = f"file:{urllib.parse.quote(os.path.abspath(path))}?mode=rw"
        self._owed = False  # a write failed for lack of space and no checkpoint finished since
        self._lock = threading.Lock()  # one checkpoint at a time; guards _owed's changes

    @property
    def owed(self) -> bool:
        """True from a write that failed for lack of space until a checkpoint finishes."""
        return self._owed

    def after_failure(self, exc: BaseException) -> None:
        """Checkpoint if ``exc`` says the disk is full (and remember it until one finishes)."""
        if self._wal and is_full(exc):
            self._checkpoint(f"a write failed ({exc})")

    def before_write(self) -> None:
        """Pay a checkpoint still owed, so the space freed since goes to it first."""
        if self._owed:
            self._checkpoint("owed since a write failed for lack of space")

    def _checkpoint(self, why: str) -> None:
        with self._lock:
            owed = self._owed
            before = wal_size(self._wal)
            try:
                conn = sqlite3.connect(self._uri, uri=True, timeout=0, isolation_level=None)
                try:
                    done = truncate_wal(conn)
                finally:
                    conn.close()
            except sqlite3.Error as exc:
                self._owed = True
                if not owed:  # logged once per outage, not at every retry
                    logger.warning(
                        "%s: %s; the WAL checkpoint that would free the -wal file's %d "
                        "bytes failed too (%s): it is tried again before each write",
                        self._path,
                        why,
                        before,
                        exc,
                    )
                return
            self._owed = not done
            if done:
                logger.warning(
                    "%s: %s; WAL checkpointed: -wal file %d -> %d bytes",
                    self._path,
                    why,
                    before,
                    wal_size(self._wal),
                )
