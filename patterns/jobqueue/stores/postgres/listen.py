"""The wake-up feed of `~.PostgresStore`: its ``LISTEN`` thread.

Every enqueue and release on any machine sends a ``NOTIFY`` on the store's channel. A
`Listener` keeps one connection of its own listening on that channel, in a daemon thread
that reconnects with backoff when the connection is lost, and calls every subscriber
after each notification, and again each time it (re)starts listening, since one may have
been missed meanwhile. `Listener.close` ends its wait at once through a socket pair, and
waits for the thread within a budget.

Docs: docs/jobqueue/many_machines.md
"""

from __future__ import annotations

import itertools
import logging
import selectors
import socket
import threading
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from patterns.jobqueue.stores.checks import backoff

if TYPE_CHECKING:
    import psycopg

__all__ = ["Listener"]

# The store's own logger: everything a PostgresStore says is under one name.
logger = logging.getLogger(__name__)

_LISTEN_BACKOFF_MAX = 5.0  # the listener's longest wait between reconnection attempts


class Listener:
    """The listener thread of one store: ``LISTEN`` on ``channel``, calling each subscriber.

    Args:
        pg: the ``psycopg`` module (imported by the store: psycopg is optional).
        conninfo: the libpq connection string of the listener's own connection.
        channel: the ``NOTIFY`` channel to listen on.
        name: the thread's name.
        where: how log messages name the store.
        first_pause: seconds before the first reconnection attempt; doubles each time, plus
            jitter, up to 5 s.
        check_open: raises if the store is closed; called with the listener's lock held
            before a subscription starts the thread, so none starts after `close`.

    The thread starts with the first `subscribe` or `wait`, and runs until `close`.
    """

    def __init__(
        self,
        pg: ModuleType,
        conninfo: str,
        channel: str,
        *,
        name: str,
        where: str,
        first_pause: float,
        check_open: Callable[[], None],
    ) -> None:
        self._pg = pg
        self._conninfo = conninfo
        self._channel = channel
        self._name = name
        self._where = where
        self._first_pause = first_pause
        self._check_open = check_open
        # Guards _subscribers, _thread, _stopping, _ended and _orphaned. Held briefly by
        # subscribe(), the unsubscribe functions, close() and the listener thread (to copy
        # the subscribers before calling them, never while calling them).
        self._lock = threading.Lock()
        self._subscribers: dict[int, Callable[[], object]] = {}
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._ended = False  # set by the listener thread as it ends
        self._orphaned = False  # set by close() when the listener outlived its budget
        # close() writes a byte to _wakeup_w; the listener selects on _wakeup_r next to its
        # connection's socket, so close() ends its wait (or its backoff) at once.
        self._wakeup_r, self._wakeup_w = socket.socketpair()
        # Set by the listener thread on every notification (and reconnection); waited on
        # and cleared by wait().
        self._notified = threading.Event()

    def subscribe(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Call ``callback`` after each notification; return the function that unsubscribes.

        Starts the thread first: if it cannot start, this raises and subscribes nobody.
        """
        with self._lock:
            self._check_open()
            self._start()  # first: if it cannot start, nobody is subscribed
            key = next(self._keys)
            self._subscribers[key] = callback

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers.pop(key, None)

        return unsubscribe

    def wait(self, timeout: float) -> bool:
        """Block until a notification, or ``timeout`` seconds; True if one came (see the store)."""
        with self._lock:
            self._check_open()
            self._start()
        if not self._notified.wait(timeout):
            return False
        self._notified.clear()
        return True

    def _start(self) -> None:
        """Start the listener thread if it is not running; call with _lock held."""
        if self._thread is not None:
            return
        listener = threading.Thread(target=self._listen_loop, name=self._name, daemon=True)
        # Daemon: it only reads notifications, so nothing is lost if the process exits
        # without close(); a non-daemon thread would keep such a process alive forever.
        listener.start()
        # Only a started thread is kept: one that failed to start would never be tried
        # again, and close() cannot join it.
        self._thread = listener

    def _fire(self, why: str) -> None:
        self._notified.set()
        with self._lock:
            callbacks = list(self._subscribers.values())
        logger.debug("%s: waking %d subscriber(s): %s", self._where, len(callbacks), why)
        for callback in callbacks:
            try:
                callback()
            except Exception:
                logger.exception("%s: a subscriber raised; ignored", self._where)

    def _should_stop(self) -> bool:
        with self._lock:
            return self._stopping

    def _listen_loop(self) -> None:
        try:
            self._listen_until_closed()
        finally:
            with self._lock:
                self._ended = True
                orphaned = self._orphaned
            if orphaned:  # close() gave up waiting and left the wake-up sockets to us
                self._close_wakeup()

    def _listen_until_closed(self) -> None:
        from psycopg import pq, sql  # noqa: PLC0415 - psycopg is optional: imported on use

        failures = 0
        with selectors.DefaultSelector() as selector:
            selector.register(self._wakeup_r, selectors.EVENT_READ)
            while not self._should_stop():
                conn: psycopg.Connection[tuple[Any, ...]] | None = None
                try:
                    conn = self._pg.connect(self._conninfo, autocommit=True)
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
                    if failures:
                        logger.warning("%s: listening again", self._where)
                    failures = 0
                    self._fire("listening")  # anything enqueued before LISTEN: look now
                    fd = conn.pgconn.socket
                    selector.register(fd, selectors.EVENT_READ)
                    try:
                        while not self._should_stop():
                            selector.select()  # the connection's socket, or close()
                            pgconn = conn.pgconn
                            pgconn.consume_input()  # raises once the connection is gone
                            if pgconn.status != pq.ConnStatus.OK:
                                raise self._pg.OperationalError("the connection was lost")
                            notified = False
                            while pgconn.notifies() is not None:
                                notified = True
                            if notified:
                                self._fire("notified")
                    finally:
                        selector.unregister(fd)
                except Exception as exc:  # noqa: BLE001 - logged; the listener must not die
                    # A connection error, or anything else: either way back off and listen
                    # again; meanwhile subscribers still have their poll interval.
                    failures += 1
                    pause = backoff(self._first_pause, failures, _LISTEN_BACKOFF_MAX)
                    logger.warning(
                        "%s: listener connection failed (%s); reconnecting in %.2f s",
                        self._where,
                        " ".join(str(exc).split()),
                        pause,
                    )
                    selector.select(pause)  # ended early by close()
                finally:
                    if conn is not None:
                        conn.close()
        logger.debug("%s: listener stopped", self._where)

    def _close_wakeup(self) -> None:
        self._wakeup_r.close()
        self._wakeup_w.close()

    def close(self, budget: float) -> None:
        """Stop the thread, waiting up to ``budget`` seconds; call once, after the store closed.

        A thread still running then (a connection attempt, or a subscriber that does not
        return) is logged and left to end by itself, closing the wake-up sockets as it ends.
        """
        with self._lock:
            self._stopping = True
            listener = self._thread
            self._subscribers.clear()
        self._wakeup_w.send(b"x")  # ends the listener's select at once
        if listener is not None:
            listener.join(budget)
        with self._lock:
            # A listener still in a connection attempt (connect_timeout) or a subscriber's
            # call ends after that, by itself, and needs its wake-up socket until then.
            orphaned = self._orphaned = listener is not None and not self._ended
        if orphaned:
            logger.warning("%s: the listener thread did not end within %.2f s", self._where, budget)
        else:
            self._close_wakeup()
