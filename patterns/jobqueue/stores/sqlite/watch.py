"""The SQLite store's wake-ups: a watcher thread that notices other connections' commits.

TL;DR: `DataVersionWatch` holds the subscribers of one
`~.SQLiteStore` and, while anyone subscribes, runs a thread
with a connection of its own that reads the file's ``PRAGMA data_version`` every ``watch_interval``
seconds; when a connection other than the store's own committed (a job enqueued by another
process), it calls the subscribers. While no other connection commits, it looks less often
(`WATCH_QUIET`, `WATCH_IDLE_INTERVAL`): each look costs a thread wake-up and a read, which were
most of an idle worker's CPU. The first such commit it sees brings it back to ``watch_interval``.
Between looks it also runs the WAL checkpoints of
`~patterns.jobqueue.stores.sqlite.checkpoint.WatchCheckpoints` (a ``-wal`` file that outgrows the
disk's free space, or a big one in a quiet spell).

The store hands it what it needs (its lock, a read of its connection's ``data_version``, its
closed flag, its busy retry) rather than itself. Its messages are logged on this module's
logger, a child of ``patterns.jobqueue.stores.sqlite``; the guarantees are the store's.

Docs: docs/jobqueue/index.md
"""

from __future__ import annotations

import itertools
import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from typing import Protocol

from patterns.jobqueue.stores.checks import check_time
from patterns.jobqueue.stores.sqlite.checkpoint import WatchCheckpoints
from patterns.jobqueue.stores.sqlite.schema import RetryBusy, StoreFileError, is_busy

__all__ = [
    "WATCH_IDLE_INTERVAL",
    "WATCH_QUIET",
    "DataVersionWatch",
    "Wait",
    "check_watch_interval",
    "data_version",
]

logger = logging.getLogger(__name__)

_WATCH_JOIN = 2.0  # seconds unsubscribe() and close() wait for the watcher thread to end

WATCH_QUIET = 0.5
"""Seconds without another connection's commit before the watcher starts to look less often."""

WATCH_IDLE_INTERVAL = 0.1
"""The longest wait between two looks while nothing changes (or ``watch_interval``, if longer).

After `WATCH_QUIET` seconds without another connection's commit the wait doubles at each
look up to this, so a commit after a quiet spell is seen within this many seconds at worst,
and each one after it within ``watch_interval`` again, until the next quiet spell.
"""


class Wait(Protocol):
    """How the watcher thread waits between looks: True once ``stop`` is released."""

    def __call__(self, stop: threading.Lock, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for ``stop``; True if it was released."""
        ...


def _acquire(stop: threading.Lock, timeout: float) -> bool:
    """The real wait: one C call (Event.wait runs a Condition in Python at every look)."""
    return stop.acquire(timeout=timeout)


class _Looks:
    """When the watcher looks next: every ``fast`` seconds while other connections commit.

    Quiet time is counted as the sum of the waits since the last change, not read from a
    clock: a wait that returns early only means the watcher is stopping.
    """

    def __init__(self, fast: float) -> None:
        self.fast = fast
        self.slow = max(fast, WATCH_IDLE_INTERVAL)
        self.interval = fast  # the next wait
        self.quiet = 0.0  # seconds waited since the last change seen

    def after_look(self, changed: bool) -> None:
        """Back to ``fast`` on a change; after `WATCH_QUIET` without one, double to ``slow``."""
        if changed:
            self.interval, self.quiet = self.fast, 0.0
            return
        self.quiet += self.interval
        if self.quiet >= WATCH_QUIET:
            self.interval = min(self.slow, self.interval * 2)


def _no_op() -> None:
    """The unsubscribe of a store without notifications: there is nothing to undo."""


# Watcher connections inherited by a forked child: kept referenced, so never closed there.
_INHERITED: list[sqlite3.Connection] = []


def check_watch_interval(value: object) -> float | None:
    """``watch_interval`` as positive seconds, or None (0 or None: no watcher)."""
    if value is None:
        return None
    seconds = check_time("watch_interval", value)  # TypeError / ValueError naming it
    if seconds < 0:
        raise ValueError(f"watch_interval must not be negative, got {value!r}")
    return seconds or None


def data_version(conn: sqlite3.Connection | sqlite3.Cursor) -> int:
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
        # one C call where Event.wait runs a Condition in Python, at every look.
        self.stop = threading.Lock()
        self.stop.acquire()
        self.thread: threading.Thread | None = None


class DataVersionWatch:
    """The subscribers of one store at ``path``, and the watcher thread that calls them.

    ``watch_interval`` is checked here (`check_watch_interval`); 0 or None, or a
    ``:memory:`` database, means no watcher: `subscribe` then subscribes nobody. ``wait``
    is how the thread waits between looks (a test hands in one it drives).
    """

    def __init__(
        self,
        path: str,
        watch_interval: object,
        *,
        lock: threading.Lock,
        own_version: Callable[[], int],
        is_closed: Callable[[], bool],
        check_open: Callable[[], None],
        retry_busy: RetryBusy,
        wait: Wait = _acquire,
    ) -> None:
        interval = check_watch_interval(watch_interval)
        if path in ("", ":memory:"):
            interval = None  # another connection would open another database: nothing to see
        self._path = path
        self._watch_interval = interval
        # The store's: its lock (guards its connection), the data_version of its connection
        # (read holding that lock), whether it is closed, its check that it is open (raises
        # if closed), and its busy retry.
        self._lock = lock
        self._own_version = own_version
        self._is_closed = is_closed
        self._check_open = check_open
        self._retry_busy = retry_busy
        self._wait = wait
        # Guards _subscribers and _watcher. Held briefly by subscribe(), the unsubscribe
        # functions, close() and the watcher thread (to copy the subscribers, never while
        # calling them). Taken before the store's lock when both are needed, never after.
        self._watch_lock = threading.Lock()
        self._subscribers: dict[int, Callable[[], object]] = {}
        self._keys = itertools.count()
        self._watcher: _Watcher | None = None

    def subscribe(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Call ``callback`` on other connections' commits, until the returned unsubscribe.

        `~.SQLiteStore.subscribe` says what a subscriber can rely on.
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
            seen = self._retry_busy(lambda: data_version(conn))
            own = self._retry_busy(self._own_version, locked=True)
            watcher = _Watcher(conn, seen, own)
            thread = threading.Thread(
                target=self._run,
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

    def _run(self, watcher: _Watcher, interval: float) -> None:
        """The watcher thread: look until stopped (`_Looks` says when); log its death.

        Between looks it checkpoints the WAL when `WatchCheckpoints` says so.
        """
        looks = _Looks(interval)
        checkpoints = WatchCheckpoints(self._path)
        try:
            while not self._wait(watcher.stop, looks.interval):
                seen = watcher.seen
                changed = self._changed_elsewhere(watcher)
                if changed:
                    self._fire()
                checkpoints.after_look(watcher.conn, watcher.seen != seen, looks.interval)
                looks.after_look(changed)  # the store's own commits leave it backed off
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
            seen = data_version(watcher.cursor)
        except sqlite3.OperationalError as exc:
            if not is_busy(exc):
                raise
            return False  # a change stays visible until it is read: look again next time
        if seen == watcher.seen:
            return False
        watcher.seen = seen
        if not self._lock.acquire(timeout=0.05):
            return True  # the store is busy: cannot tell whose commit it was, so wake
        try:
            if self._is_closed():
                return False
            own = self._own_version()
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
        """Forget every subscriber and stop the watcher thread; called by the store's close."""
        with self._watch_lock:
            watcher = self._own_watcher()
            self._watcher = None
            self._subscribers.clear()
        self._end_watcher(watcher)
