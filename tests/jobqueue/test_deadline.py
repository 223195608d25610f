"""The stop's deadline: every store call under it gives up on time, even one already waiting.

The database is really locked by another connection (SQLite ``BEGIN IMMEDIATE``;
PostgreSQL ``LOCK TABLE ... ACCESS EXCLUSIVE``). A call is known to be waiting when it
has failed one busy wait (SQLite) or when the server shows it waiting for the lock
(PostgreSQL's ``pg_stat_activity``); only then is the deadline set. The bounds are
generous: what is asserted is "within the budget plus a small margin", not a speed.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from patterns.jobqueue.stores.deadline import (
    LAST_TRY,
    Deadline,
    StoreTimeout,
    acquire,
    bounded_by,
    give_up,
    time_left,
)
from patterns.jobqueue.stores.records import StoreUnavailable
from patterns.jobqueue.stores.sqlite.store import BUSY_SLICE, SQLiteStore
from tests.jobqueue.conftest import admin_execute
from tests.support import (
    MUST_HAPPEN,
    NOISE,
    Gate,
    elapsed,
    join_or_fail,
    run_in_thread,
    stays_blocked,
)

MARGIN = BUSY_SLICE + LAST_TRY + NOISE  # one busy wait, one quick try, a shared machine


# --- the deadline itself ------------------------------------------------------------------


def test_a_thread_outside_any_deadline_is_unbounded() -> None:
    """No `bounded_by`: the stores wait as they always did."""
    assert time_left(time.monotonic()) is None


def test_an_unset_deadline_bounds_nothing_until_it_is_set() -> None:
    """Inside `bounded_by` an unset deadline leaves calls unbounded; setting it reaches them."""
    d = Deadline()
    with bounded_by(d):
        began = time.monotonic()
        assert time_left(began) is None
        d.set(time.monotonic() + 60)
        left = time_left(began)
        assert left is not None
        assert 59 < left <= 60
        d.set(float("inf"))
        assert time_left(began) is None  # inf never expires
    assert time_left(began) is None  # outside the block, unbounded again


def test_a_call_that_begins_after_the_deadline_gets_one_quick_try_then_none() -> None:
    """`LAST_TRY` for the first call after the deadline; none once a call gave up."""
    d = Deadline()
    d.set(time.monotonic() - 1)  # already past
    with bounded_by(d):
        left = time_left(time.monotonic())
        assert left is not None
        assert 0 < left <= LAST_TRY
        error = give_up("a call")
        assert isinstance(error, StoreTimeout)
        assert isinstance(error, StoreUnavailable)  # handled wherever a store failure is
        assert time_left(time.monotonic()) == 0.0  # this thread gave up: no more tries
    assert d.gave_up == 1


def test_the_earliest_of_nested_deadlines_wins_and_a_give_up_counts_once() -> None:
    """A stop's deadline inside a request's: the earlier bounds; one give-up, one count."""
    outer, inner = Deadline(), Deadline()
    outer.set(time.monotonic() - 2)
    inner.set(time.monotonic() - 1)
    with bounded_by(outer), bounded_by(inner):
        give_up("a call")
    assert (outer.gave_up, inner.gave_up) == (1, 0)


def test_a_lock_held_by_another_call_is_waited_for_only_until_the_deadline() -> None:
    """`acquire` under a deadline gives up instead of queueing behind another call."""
    lock = threading.Lock()
    d = Deadline()
    d.set(time.monotonic() + 0.2)
    with lock, bounded_by(d), elapsed() as took, pytest.raises(StoreTimeout, match="held"):
        acquire(lock, time.monotonic(), "store")
    assert took() < 0.2 + LAST_TRY + NOISE


def test_at_the_deadline_a_registered_cancel_runs_and_finish_ends_the_timer() -> None:
    """`on_expiry` runs at the deadline; a cancel forgotten first never runs."""
    d = Deadline()
    fired = threading.Event()
    forgotten: list[str] = []
    d.on_expiry(fired.set)
    forget = d.on_expiry(lambda: forgotten.append("ran"))
    forget()
    d.set(time.monotonic() + 0.05)
    assert fired.wait(MUST_HAPPEN)
    d.finish()
    assert forgotten == []
    assert not [t for t in threading.enumerate() if t.name == "store-deadline"]


def test_forget_waits_for_a_cancel_under_way_so_it_never_reaches_the_next_statement() -> None:
    """Once a call's ``forget()`` returns, its cancel is not running and will not run.

    The PostgreSQL store shares one connection: a cancel that the deadline's timer took
    before the call ended, and ran after, cancelled the next thread's statement on it (a
    worker's release, failed as if its own deadline had passed).
    """
    d = Deadline()
    gate = Gate("cancel at the deadline")
    forget = d.on_expiry(gate.arrive)  # the cancel parks at the gate, the timer thread in it
    d.set(time.monotonic())
    gate.wait_reached()

    forgetter, outcome = run_in_thread(forget, "forgetter")
    try:
        assert stays_blocked(forgetter)  # the call ended; its cancel is still under way
    finally:
        gate.open()
    join_or_fail(forgetter)
    assert "error" not in outcome, outcome
    d.finish()


# --- SQLite: a really locked file ---------------------------------------------------------


@pytest.fixture
def sqlite_locked(tmp_path: Path) -> Iterator[SQLiteStore]:
    """A store on a file that another connection holds in ``BEGIN IMMEDIATE``."""
    path = tmp_path / "q.db"
    store = SQLiteStore(path)
    store.enqueue("t")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield store
    finally:
        other.execute("ROLLBACK")
        other.close()
        store.close()


class BusyWatch:
    """Patches a store's attempts so the test knows a call has waited once for the lock."""

    def __init__(self, store: SQLiteStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.waited = threading.Event()
        real = store._attempt

        def attempt(step: Callable[[], Any], locked: bool, began: float) -> Any:
            try:
                return real(step, locked, began)
            except sqlite3.OperationalError:
                self.waited.set()
                raise

        monkeypatch.setattr(store, "_attempt", attempt)


def call_under(d: Deadline, call: Callable[[], object], name: str) -> Callable[[], object]:
    """``call`` as a thread target bounded by ``d``."""

    def run() -> object:
        with bounded_by(d):
            return call()

    return run


def test_a_sqlite_call_already_waiting_gives_up_soon_after_a_deadline_set_later(
    sqlite_locked: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the claim waited 5 busy waits of 5 s (plus backoff) whatever the stop's budget."""
    watch = BusyWatch(sqlite_locked, monkeypatch)
    d = Deadline()
    claim = call_under(d, lambda: sqlite_locked.claim("w", lease=30), "claimer")
    thread, outcome = run_in_thread(claim, "claimer")
    assert watch.waited.wait(MUST_HAPPEN)  # it is inside the busy retries, deadline unset
    with elapsed() as took:
        d.set(time.monotonic() + 0.2)
        join_or_fail(thread)
    assert isinstance(outcome.get("error"), StoreTimeout), outcome
    assert took() < 0.2 + MARGIN
    assert d.gave_up == 1


def test_sqlite_calls_of_several_threads_do_not_queue_past_the_deadline(
    sqlite_locked: SQLiteStore,
) -> None:
    """Three threads on one locked store connection: each gives up by the deadline."""
    d = Deadline()
    d.set(time.monotonic() + 0.3)
    calls = {
        "claim": lambda: sqlite_locked.claim("w", lease=30),
        "row": lambda: sqlite_locked.forget_worker("w"),
        "enqueue": lambda: sqlite_locked.enqueue("t"),
    }
    with elapsed() as took:
        started = [run_in_thread(call_under(d, call, name), name) for name, call in calls.items()]
        for thread, _ in started:
            join_or_fail(thread)
    assert all(isinstance(out.get("error"), StoreTimeout) for _, out in started), started
    assert took() < 0.3 + MARGIN


def test_a_sqlite_call_outside_any_deadline_still_waits_its_busy_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slices change nothing for others: an unbounded call waits the whole busy timeout."""
    from patterns.jobqueue.stores.sqlite import store as sqlite_module  # noqa: PLC0415

    monkeypatch.setattr(sqlite_module, "BUSY_TIMEOUT", 0.35)  # read when the store opens
    path = tmp_path / "q.db"
    store = SQLiteStore(path)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        monkeypatch.setattr("patterns.jobqueue.stores.sqlite.transactions._BUSY_RETRIES", 1)
        with elapsed() as took, pytest.raises(sqlite3.OperationalError, match="locked"):
            store.enqueue("t")
        assert took() >= 0.35  # several slices, one attempt: the busy timeout, not a slice
    finally:
        other.execute("ROLLBACK")
        other.close()
        store.close()


# --- PostgreSQL: a really locked table ----------------------------------------------------


@pytest.fixture
def pg_locked(pg_dsn: str, pg_schema: str) -> Iterator[Any]:
    """A store whose tables another connection holds in ACCESS EXCLUSIVE mode."""
    import psycopg  # noqa: PLC0415 - optional: only these tests need it

    from patterns.jobqueue.stores.postgres.store import PostgresStore  # noqa: PLC0415

    store = PostgresStore(pg_dsn, schema=pg_schema)
    store.enqueue("t")
    with psycopg.connect(pg_dsn) as other:
        other.execute(
            f'LOCK TABLE "{pg_schema}".jobs, "{pg_schema}".workers IN ACCESS EXCLUSIVE MODE'
        )
        try:
            yield store
        finally:
            other.rollback()
            store.close()


def waiting_for_a_lock(dsn: str, schema: str) -> bool:
    """True when a statement on ``schema`` waits for a lock (the store's, behind the test's)."""
    rows = admin_execute(
        dsn,
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND position(%s in query) > 0",
        (schema,),
    )
    return bool(rows[0][0])


def test_a_postgres_statement_already_waiting_is_cancelled_at_a_deadline_set_later(
    pg_locked: Any, pg_dsn: str, pg_schema: str
) -> None:
    """Before: the claim waited in PostgreSQL's lock queue for as long as the lock was held."""
    d = Deadline()
    claim = call_under(d, lambda: pg_locked.claim("w", lease=30), "claimer")
    thread, outcome = run_in_thread(claim, "claimer")
    give_up_at = time.monotonic() + MUST_HAPPEN
    while not waiting_for_a_lock(pg_dsn, pg_schema):  # the server's own view decides
        assert time.monotonic() < give_up_at, "the claim never waited for the lock"
        threading.Event().wait(0.01)  # a poll of that view, not an ordering
    with elapsed() as took:
        d.set(time.monotonic() + 0.2)
        join_or_fail(thread)
    assert isinstance(outcome.get("error"), StoreTimeout), outcome
    assert took() < 0.2 + MARGIN
    d.finish()


def test_postgres_calls_under_a_set_deadline_end_by_it_on_a_locked_table(pg_locked: Any) -> None:
    """statement_timeout and lock_timeout from the time left: both threads give up on time."""
    d = Deadline()
    d.set(time.monotonic() + 0.3)
    calls = {
        "claim": lambda: pg_locked.claim("w", lease=30),
        "row": lambda: pg_locked.forget_worker("w"),
    }
    with elapsed() as took:
        started = [run_in_thread(call_under(d, call, name), name) for name, call in calls.items()]
        for thread, _ in started:
            join_or_fail(thread)
    d.finish()
    assert all(isinstance(out.get("error"), StoreTimeout) for _, out in started), started
    assert took() < 0.3 + MARGIN
