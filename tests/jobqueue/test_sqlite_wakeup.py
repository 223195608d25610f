"""SQLiteStore wake-ups: a commit by another connection or process calls the subscribers.

The watcher reads ``PRAGMA data_version``, which changes when another connection commits.
Orderings are forced with events and by observing where a thread is blocked; the one wait
for something that must *not* happen (``STAYS_BLOCKED``) only decides how long we look.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from patterns.jobqueue import JobContext, TaskRegistry, Worker
from patterns.jobqueue.stores.sqlite.store import WATCH_INTERVAL, SQLiteStore
from patterns.jobqueue.stores.sqlite.watch import (
    WATCH_IDLE_INTERVAL,
    WATCH_QUIET,
    DataVersionWatch,
    data_version,
)
from tests.support import (
    MUST_HAPPEN,
    STAYS_BLOCKED,
    cannot_start,
    child_env,
    thread_start_patched,
    wait_until,
)

LEASE = 60.0
LONG_POLL = 30.0  # far longer than MUST_HAPPEN: a job found by a poll fails the test
WATCHER = "jobqueue-watcher"
T = TypeVar("T")


@pytest.fixture
def store(db: Path) -> Iterator[SQLiteStore]:
    """A store on ``db``, closed afterwards."""
    made = SQLiteStore(db)
    yield made
    made.close()


def watchers() -> list[threading.Thread]:
    """The watcher threads of this process that are alive."""
    return [t for t in threading.enumerate() if t.name.startswith(WATCHER) and t.is_alive()]


class Calls:
    """A subscriber callback that counts its calls and sets an event on each."""

    def __init__(self) -> None:
        # Guards count; taken by the watcher thread when it calls, and by the test to read.
        self._lock = threading.Lock()
        self.count = 0
        # Set by each call; cleared and waited on by the test.
        self.called = threading.Event()

    def __call__(self) -> None:
        """Count this call and set the event."""
        with self._lock:
            self.count += 1
        self.called.set()


def idle_worker(store: SQLiteStore, started: threading.Event) -> Worker:
    """A worker with a 30 s poll whose ``note`` task sets ``started``; not started yet."""
    tasks = TaskRegistry()

    @tasks.task
    def note(payload: object, ctx: JobContext) -> None:
        started.set()

    return Worker(store, tasks, poll_interval=LONG_POLL, lease=LEASE)


def wait_until_idle(worker: Worker) -> None:
    """Block until the worker's claiming thread waits out its poll interval (nothing due)."""
    claimer = next(t for t in threading.enumerate() if t.name == f"{worker.name}-claimer")
    idle_wait = threading.Event.wait.__code__  # the idle wait; a slot wait is Condition.wait

    def waiting() -> bool:
        frame = sys._current_frames().get(claimer.ident or -1)
        while frame is not None:
            if frame.f_code is idle_wait:
                return True
            frame = frame.f_back
        return False

    wait_until(waiting, "the claiming thread waits out its poll interval")


def test_a_job_enqueued_through_a_second_store_wakes_an_idle_worker_long_before_its_poll(
    store: SQLiteStore, db: Path
) -> None:
    """An idle worker with a 30 s poll runs a job enqueued on another connection at once."""
    started = threading.Event()
    other = SQLiteStore(db)
    try:
        with idle_worker(store, started) as worker:
            wait_until_idle(worker)  # it claimed, found nothing, and waits 30 s
            other.enqueue("note")  # another connection: this worker is not told directly
            assert started.wait(MUST_HAPPEN)  # not after 30 s: the watcher woke it
            report = worker.stop()
        assert report.terminated
        assert not watchers()  # the worker's stop unsubscribed: the watcher ended
    finally:
        other.close()


def test_a_job_enqueued_by_another_process_wakes_an_idle_worker_long_before_its_poll(
    store: SQLiteStore, db: Path
) -> None:
    """An idle worker with a 30 s poll runs a job enqueued by another process at once."""
    started = threading.Event()
    code = textwrap.dedent(
        f"""
        from patterns.jobqueue import SQLiteStore
        store = SQLiteStore({str(db)!r})
        store.enqueue("note")
        store.close()
        """
    )
    with idle_worker(store, started) as worker:
        wait_until_idle(worker)
        done = subprocess.run(
            [sys.executable, "-c", code],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=MUST_HAPPEN * 3,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert started.wait(MUST_HAPPEN)
        report = worker.stop()
    assert report.terminated


def test_the_first_subscribe_starts_the_watcher_and_the_last_unsubscribe_stops_it(
    store: SQLiteStore,
) -> None:
    """One watcher thread however many subscribe; it ends, joined, with the last unsubscribe."""
    assert not watchers()  # the constructor starts no thread
    first = store.subscribe(Calls())
    second = store.subscribe(Calls())
    assert len(watchers()) == 1
    (thread,) = watchers()
    first()
    assert thread.is_alive()  # one subscriber is left
    second()
    assert not thread.is_alive()  # joined before the unsubscribe returned
    second()  # idempotent
    again = store.subscribe(Calls())  # a new subscriber starts a new watcher
    assert len(watchers()) == 1
    again()
    assert not watchers()


def test_a_watcher_that_cannot_start_fails_the_subscribe_and_subscribes_nobody(
    store: SQLiteStore, db: Path
) -> None:
    """Out of threads: subscribe raises; the next subscribe starts a watcher that works."""
    calls = Calls()
    with thread_start_patched(1, cannot_start), pytest.raises(RuntimeError, match="thread"):
        store.subscribe(calls)
    assert not watchers()
    other = SQLiteStore(db, watch_interval=0)
    try:
        again = store.subscribe(Calls())
        other.enqueue("t")
        assert len(watchers()) == 1
        again()
        assert not calls.called.is_set()  # the failed subscriber was never added
    finally:
        other.close()


def test_a_subscriber_may_unsubscribe_from_its_own_call(store: SQLiteStore, db: Path) -> None:
    """The last unsubscribe, from inside the watcher's call, ends the watcher: no self-join."""
    unsubscribed = threading.Event()  # set by the callback once its unsubscribe returned
    box: list[object] = []

    def once() -> None:
        unsubscribe = box[0]
        assert callable(unsubscribe)
        unsubscribe()
        unsubscribed.set()

    box.append(store.subscribe(once))
    (thread,) = watchers()
    other = SQLiteStore(db, watch_interval=0)
    try:
        other.enqueue("t")
        assert unsubscribed.wait(MUST_HAPPEN)
        thread.join(MUST_HAPPEN)
        assert not thread.is_alive()
    finally:
        other.close()


def test_close_stops_the_watcher_and_a_closed_store_refuses_subscribe(db: Path) -> None:
    """close() ends the watcher thread before it returns; subscribe afterwards raises."""
    made = SQLiteStore(db)
    unsubscribe = made.subscribe(Calls())
    assert len(watchers()) == 1
    made.close()
    assert not watchers()
    unsubscribe()  # after close: nothing left to do, no error
    with pytest.raises(RuntimeError, match="closed"):
        made.subscribe(Calls())


def test_a_commit_by_another_connection_calls_back_and_the_stores_own_commits_do_not(
    store: SQLiteStore, db: Path
) -> None:
    """The store's own enqueues leave the subscriber alone; one by another connection wakes it."""
    calls = Calls()
    unsubscribe = store.subscribe(calls)
    try:
        for _ in range(3):
            store.enqueue("own")  # the worker that enqueued knows already
        assert not calls.called.wait(STAYS_BLOCKED)  # about 40 looks: no call
        other = sqlite3.connect(db, isolation_level=None, timeout=MUST_HAPPEN)
        try:
            other.execute("UPDATE jobs SET run_at = run_at WHERE id = 1")  # a commit elsewhere
        finally:
            other.close()
        assert calls.called.wait(MUST_HAPPEN)
    finally:
        unsubscribe()


def test_a_raising_callback_is_logged_and_the_next_change_still_calls_back(
    store: SQLiteStore, db: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A subscriber that raises is logged; the watcher lives on and calls again."""
    calls = Calls()
    raised = threading.Event()  # set by the raising subscriber, the test waits on it

    def broken() -> None:
        raised.set()
        raise ValueError("subscriber bug")

    other = SQLiteStore(db)
    unsubscribe_broken = store.subscribe(broken)
    unsubscribe = store.subscribe(calls)
    try:
        with caplog.at_level(logging.ERROR, logger="patterns.jobqueue.stores.sqlite"):
            other.enqueue("first")
            assert raised.wait(MUST_HAPPEN)
            assert calls.called.wait(MUST_HAPPEN)  # the others are still called
            calls.called.clear()
            raised.clear()
            other.enqueue("second")
            assert raised.wait(MUST_HAPPEN)
            assert calls.called.wait(MUST_HAPPEN)
        logged = [r for r in caplog.records if "a subscriber raised" in r.getMessage()]
        assert len(logged) >= 2
        assert logged[0].exc_info is not None
        assert "subscriber bug" in str(logged[0].exc_info[1])
        assert len(watchers()) == 1
    finally:
        unsubscribe()
        unsubscribe_broken()
        other.close()


def test_a_watcher_ended_by_a_subscriber_is_logged_and_the_next_subscribe_starts_another(
    store: SQLiteStore, db: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A callback raising SystemExit ends the watcher thread: logged, never silent."""

    def exits() -> None:
        raise SystemExit("a subscriber ended its thread")

    other = SQLiteStore(db)
    try:
        with caplog.at_level(logging.ERROR, logger="patterns.jobqueue.stores.sqlite"):
            unsubscribe = store.subscribe(exits)
            (thread,) = watchers()
            other.enqueue("t")
            thread.join(MUST_HAPPEN)
            assert not thread.is_alive()
        assert any("watcher thread died" in r.getMessage() for r in caplog.records)
        unsubscribe()
        calls = Calls()
        again = store.subscribe(calls)
        other.enqueue("t")
        assert calls.called.wait(MUST_HAPPEN)
        again()
    finally:
        other.close()


@pytest.mark.parametrize("off", [0, 0.0, None])
def test_a_zero_or_none_watch_interval_starts_no_watcher(db: Path, off: float | None) -> None:
    """watch_interval 0 or None: subscribe starts nothing and never calls back."""
    made = SQLiteStore(db, watch_interval=off)
    try:
        calls = Calls()
        unsubscribe = made.subscribe(calls)
        assert not watchers()
        unsubscribe()
    finally:
        made.close()


def test_an_in_memory_store_starts_no_watcher() -> None:
    """A ':memory:' database has no other connection to watch: no thread."""
    made = SQLiteStore(":memory:")
    try:
        made.subscribe(Calls())()
        assert not watchers()
    finally:
        made.close()


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        (-0.001, ValueError, "watch_interval must not be negative"),
        (float("nan"), ValueError, "watch_interval must be finite"),
        (float("inf"), ValueError, "watch_interval must be finite"),
        ("5ms", TypeError, "watch_interval must be a number of seconds"),
        (True, TypeError, "watch_interval must be a number of seconds"),
    ],
)
def test_a_bad_watch_interval_is_refused_naming_it(
    db: Path, value: object, error: type[Exception], words: str
) -> None:
    """The constructor refuses a bad interval, names it, and creates no file."""
    with pytest.raises(error, match=words):
        SQLiteStore(db, watch_interval=value)  # type: ignore[arg-type]
    assert not db.exists()


def test_the_default_watch_interval_is_a_few_milliseconds() -> None:
    """The documented default: a look every few ms, so a cross-process wake takes about that."""
    assert 0 < WATCH_INTERVAL <= 0.015


FORK_CHILD = """
import os, sys, threading, warnings
from patterns.jobqueue import SQLiteStore

path = sys.argv[1]
store = SQLiteStore(path)
parent_calls = threading.Event()
store.subscribe(parent_calls.set)
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads running
    pid = os.fork()
if pid == 0:
    try:
        names = [t.name for t in threading.enumerate()]
        assert names == ["MainThread"], names
        child_calls = threading.Event()
        unsubscribe = store.subscribe(child_calls.set)  # its own watcher, not the parent's
        assert any(t.name.startswith("jobqueue-watcher") for t in threading.enumerate())
        writer = SQLiteStore(path, watch_interval=0)
        writer.enqueue("from-child")
        writer.close()
        assert child_calls.wait(10), "the child's subscriber was never called"
        unsubscribe()
        assert [t.name for t in threading.enumerate()] == ["MainThread"]
    except BaseException as exc:
        print("child:", repr(exc), flush=True)
        os._exit(1)
    os._exit(0)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, "the child failed"
assert parent_calls.wait(10), "the parent's watcher missed the child's commit"
store.close()
print("ok")
"""


def test_a_forked_child_starts_its_own_watcher_and_the_parents_keeps_running(db: Path) -> None:
    """fork(): the child inherits no watcher (its subscribe starts one); the parent's goes on."""
    done = subprocess.run(
        [sys.executable, "-c", FORK_CHILD, str(db)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=MUST_HAPPEN * 3,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "ok"


# --- the watcher's back-off, driven look by look ---------------------------------------------


def no_retry(step: Callable[[], T], *, locked: bool = False) -> T:
    """The store's busy retry, for a file nobody locks: run the step once."""
    return step()


class DrivenWait:
    """The watcher's wait between looks, driven by the test: one look per `look` call.

    Each wait records the timeout the watcher asked for and returns when the test answers,
    so simulated time is the sum of the timeouts and no test step races the watcher.
    """

    def __init__(self) -> None:
        self.asked: queue.Queue[float] = queue.Queue()  # put by the watcher, read by the test
        self._answers: queue.Queue[bool] = queue.Queue()  # put by the test: True stops

    def __call__(self, stop: threading.Lock, timeout: float) -> bool:
        """The watcher's wait: record ``timeout``, return the test's answer (True: stop)."""
        self.asked.put(timeout)
        try:
            return self._answers.get(timeout=MUST_HAPPEN)
        except queue.Empty:
            return True  # the test is gone: end rather than linger

    def first(self) -> float:
        """The timeout of the watcher's first wait, once it is waiting."""
        return self.asked.get(timeout=MUST_HAPPEN)

    def look(self) -> float:
        """Let the watcher look once; the timeout of the wait it asks for next."""
        self._answers.put(False)
        return self.asked.get(timeout=MUST_HAPPEN)

    def stop(self) -> None:
        """End the watcher's current wait with a stop."""
        self._answers.put(True)


def commit(db: Path) -> None:
    """A commit by a connection of its own, as another process's enqueue would be."""
    other = sqlite3.connect(db, isolation_level=None, timeout=MUST_HAPPEN)
    try:
        other.execute("INSERT INTO t VALUES (1)")
    finally:
        other.close()


@pytest.fixture
def driven(db: Path) -> Iterator[tuple[DataVersionWatch, DrivenWait, sqlite3.Connection]]:
    """A watch on ``db`` whose waits the test drives, and the connection it treats as its own."""
    own = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    own.execute("CREATE TABLE t (x)")
    looks = DrivenWait()
    watch = DataVersionWatch(
        str(db),
        WATCH_INTERVAL,
        lock=threading.Lock(),
        own_version=lambda: data_version(own),
        is_closed=lambda: False,
        check_open=lambda: None,
        retry_busy=no_retry,
        wait=looks,
    )
    try:
        yield watch, looks, own
    finally:
        looks.stop()
        watch.close()
        own.close()
    assert not watchers()


def test_an_idle_watcher_backs_off_to_its_idle_interval_and_never_beyond(
    driven: tuple[DataVersionWatch, DrivenWait, sqlite3.Connection],
) -> None:
    """With no commit, looks stay fast for WATCH_QUIET, then slow down to WATCH_IDLE_INTERVAL."""
    watch, looks, own = driven
    calls = Calls()
    watch.subscribe(calls)
    waits = [looks.first()]
    waits += [looks.look() for _ in range(300)]  # 300 looks: about 29 s of simulated idle
    own.execute("INSERT INTO t VALUES (1)")  # the store's own commit: no reason to hurry
    waits.append(looks.look())
    assert calls.count == 0
    assert waits[0] == WATCH_INTERVAL
    first_slower = next(i for i, wait in enumerate(waits) if wait > WATCH_INTERVAL)
    assert WATCH_QUIET <= sum(waits[:first_slower]) < WATCH_QUIET + WATCH_INTERVAL
    assert waits == sorted(waits)  # it only slows down while nothing else commits
    assert max(waits) == waits[-1] == WATCH_IDLE_INTERVAL


def test_a_commit_after_a_long_idle_is_seen_at_the_next_look_and_snaps_back_to_fast_looks(
    driven: tuple[DataVersionWatch, DrivenWait, sqlite3.Connection], db: Path
) -> None:
    """After a long idle a commit is seen within the idle interval, the next within the fast one."""
    watch, looks, _ = driven
    calls = Calls()
    watch.subscribe(calls)
    wait = looks.first()
    for _ in range(300):  # a long idle: the watcher has backed off
        wait = looks.look()
    assert wait == WATCH_IDLE_INTERVAL
    commit(db)  # during the slow wait: it is seen when that wait ends
    wait = looks.look()
    assert calls.count == 1  # called at the first look after the commit
    assert wait == WATCH_INTERVAL  # snapped back at once
    commit(db)  # during the fast wait
    wait = looks.look()  # the look WATCH_INTERVAL after the previous one
    assert calls.count == 2
    assert wait == WATCH_INTERVAL
