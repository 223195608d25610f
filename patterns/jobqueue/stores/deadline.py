"""A stop's deadline, which every store call on the stop path keeps to.

TL;DR: a `Deadline` is unset until a stop sets it (``deadline.set(monotonic time)``); a
thread that runs under `bounded_by` has every store call it makes give up once the
earliest of its deadlines passes, including a call already waiting when the deadline was
set. Stores read `time_left` (waits on a lock or a busy database, retry pauses,
PostgreSQL's ``statement_timeout``) and call `Deadline.on_expiry` to have a statement
still running at the deadline cancelled. A call that gives up raises `StoreTimeout` and
changed nothing.

Pattern:
    ``patterns.executor_shutdown``'s budget, carried into every blocking call: a stop
    that waits with a timeout but calls a store without one keeps to its budget only
    while the database answers.

A one-shot command of the command line runs under a patient deadline of its own
(``--wait``): there it is how long the operator lets the command wait for a lock.

See also: ``patterns.jobqueue.worker.worker``, ``patterns.jobqueue.cli.store_access`` and
``patterns.jobqueue.cli.worker_command`` (which set it), ``patterns.jobqueue.stores.sqlite.store``
and ``patterns.jobqueue.stores.postgres.store`` (which keep to it).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator

from patterns.jobqueue.stores.records import StoreUnavailable

__all__ = [
    "LAST_TRY",
    "Deadline",
    "StoreTimeout",
    "acquire",
    "bounded_by",
    "give_up",
    "patient",
    "time_left",
]

logger = logging.getLogger(__name__)


class _Bounds(threading.local):
    """Per thread: the `Deadline` objects it runs under (innermost last), and those spent.

    ``deadlines`` is a class attribute, so a thread never bounded reads None at once: a
    plain ``threading.local`` raises AttributeError for a name never set, and every store
    call looks (`time_left`).
    """

    deadlines: list[Deadline] | None = None  # None until the thread's first bounded_by
    spent: set[Deadline]  # those this thread gave up on (`give_up`); set with deadlines


_bounds = _Bounds()

LAST_TRY = 0.1
"""Seconds a store call that begins after its deadline still gets, for one quick try.

The releases a stop writes at its deadline need it; a healthy database answers them in
milliseconds, a blocked one makes them give up at once.
"""


class StoreTimeout(StoreUnavailable):
    """A store call gave up because its thread's `Deadline` passed; it changed nothing.

    Only a call whose ``COMMIT`` was interrupted may have applied: that one raises
    `~patterns.jobqueue.stores.records.CommitUnknown` instead.
    """


class Deadline:
    """A monotonic time after which bounded store calls give up; unset until `set`.

    Thread-safe. A call in flight reads it again at each step, so setting it reaches
    calls already waiting. `gave_up` counts the calls that gave up because of it.

    ``patient``: a store call under it keeps retrying a busy store until the deadline
    passes, instead of giving up after its own number of tries (a command whose operator
    chose how long to wait). A stop's deadline is not patient: it only shortens waits.
    """

    def __init__(self, *, patient: bool = False) -> None:
        self.patient = patient
        self._lock = threading.Lock()
        # Held while the cancels run at the deadline (`_expire`); a call's `forget` takes it
        # first, so once forget returns, no cancel of that call is running or will run: it
        # would reach the connection after the call gave it to another thread's statement.
        self._cancelling = threading.Lock()
        self._at: float | None = None
        self._timer: threading.Timer | None = None
        self._expiry: dict[int, Callable[[], object]] = {}
        self._keys = itertools.count()
        self._gave_up = 0

    def __repr__(self) -> str:
        left = self.left()
        return f"<Deadline {'unset' if left is None else f'{left:.3f}s left'}>"

    def set(self, at: float) -> None:
        """Calls bounded by this deadline give up at ``at`` (a `time.monotonic` reading).

        At ``at``, a statement still running in such a call is cancelled (`on_expiry`).
        Setting it again moves it; ``inf`` never expires (as if unset).
        """
        with self._lock:
            self._at = at if math.isfinite(at) else None
            self._arm()

    def _arm(self) -> None:
        """(Re)start the timer that cancels at the deadline, if anything is to be cancelled."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._at is None or not self._expiry:
            return
        delay = min(max(0.0, self._at - time.monotonic()), threading.TIMEOUT_MAX)
        # A daemon timer: it only cancels statements, and never holds up an exit.
        self._timer = threading.Timer(delay, self._expire)
        self._timer.daemon = True
        self._timer.name = "store-deadline"
        self._timer.start()

    def finish(self) -> None:
        """The stop is over: cancel what still runs under the deadline, end the timer.

        The deadline itself stays as it was. A store call still running in a bounded
        thread now outlived the stop that waited for it.
        """
        with self._lock:
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        if self.left() == 0.0:
            self._expire()

    @property
    def at(self) -> float | None:
        """The deadline (a `time.monotonic` reading), None while unset."""
        return self._at

    def left(self) -> float | None:
        """Seconds until the deadline (0.0 once past), None while unset."""
        at = self._at
        if at is None:
            return None
        return max(0.0, at - time.monotonic())

    @property
    def gave_up(self) -> int:
        """How many store calls gave up because this deadline passed."""
        return self._gave_up

    def note_gave_up(self) -> None:
        """Count one call that gave up (a store calls it as it raises `StoreTimeout`)."""
        with self._lock:
            self._gave_up += 1

    def on_expiry(self, cancel: Callable[[], object]) -> Callable[[], None]:
        """Call ``cancel()`` at the deadline unless the returned function is called first."""
        with self._lock:
            key = next(self._keys)
            self._expiry[key] = cancel
            if self._timer is None:
                self._arm()

        def forget() -> None:
            with self._cancelling, self._lock:
                self._expiry.pop(key, None)

        return forget

    def _expire(self) -> None:
        with self._cancelling:
            with self._lock:
                cancels = list(self._expiry.values())
            for cancel in cancels:
                try:
                    cancel()
                except Exception:  # a cancel that fails leaves the call to its own timeout
                    logger.exception("cancelling a store call at the deadline failed")


@contextlib.contextmanager
def bounded_by(deadline: Deadline) -> Iterator[Deadline]:
    """Store calls this thread makes inside keep to ``deadline`` (and any outer one)."""
    stack = _bounds.deadlines
    if stack is None:
        stack = _bounds.deadlines = []
        _bounds.spent = set()
    stack.append(deadline)
    try:
        yield deadline
    finally:
        stack.pop()
        if deadline not in stack:
            _bounds.spent.discard(deadline)


def current() -> tuple[Deadline, ...]:
    """The deadlines this thread's store calls keep to now (innermost last)."""
    return tuple(_bounds.deadlines or ())


def patient() -> bool:
    """True when this thread runs under a set, patient `Deadline`: retry until it passes."""
    return any(d.patient and d.at is not None for d in current())


def time_left(began: float) -> float | None:
    """Seconds the store call that began at ``began`` may still take; None if unbounded.

    Until the earliest of this thread's deadlines, or `LAST_TRY` after ``began`` if that
    is later and no call of this thread has given up on that deadline yet; 0.0 once
    past. A call reads it again at each wait, so a deadline set while it waits reaches it.
    """
    stack = _bounds.deadlines
    if not stack:
        return None
    spent: set[Deadline] = _bounds.spent
    ends = [d.at if d in spent else max(d.at, began + LAST_TRY) for d in stack if d.at is not None]
    if not ends:
        return None
    return max(0.0, min(ends) - time.monotonic())


def give_up(what: str) -> StoreTimeout:
    """A `StoreTimeout` for ``what``: counted once, on this thread's earliest passed deadline.

    This thread's later calls give up at once on the deadlines that passed (no
    `LAST_TRY`): a stop that found the store blocked does not wait for it call by call.
    """
    passed = [d for d in current() if d.left() == 0.0]
    if passed:
        min(passed, key=lambda d: d.at or 0.0).note_gave_up()
        _bounds.spent.update(passed)
    return StoreTimeout(f"{what}: gave up, the deadline passed")


def acquire(lock: threading.Lock, began: float, what: str) -> None:
    """Take ``lock`` within `time_left` of a call that began at ``began`` (else `StoreTimeout`)."""
    left = time_left(began)
    if left is None:
        lock.acquire()
        return
    if not lock.acquire(timeout=min(left, threading.TIMEOUT_MAX)):
        raise give_up(f"{what}: another call held the store")
