"""The SQLite store on a disk that fills up: the WAL gives its space back, the worker recovers.

Every test that fills a disk mounts a real 4 MiB tmpfs (``small_disk``): a full disk is
a real ENOSPC from the kernel, never a mock. That needs root and ``mount``; without
them those tests are skipped with the reason. The filler is another file on the same
disk, written until the kernel refuses; freeing the space is deleting it.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from patterns.jobqueue.stores.sqlite.checkpoint import IDLE_QUIET, IDLE_WAL_BYTES, WatchCheckpoints
from patterns.jobqueue.stores.sqlite.store import SQLiteStore
from tests.support import MUST_HAPPEN, child_env

DISK_BYTES = 4 * 1024 * 1024
FULL = "database or disk is full"
TASKS = "patterns.jobqueue.cli.demo_tasks:tasks"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted for the test, unmounted after it."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("needs root on Linux to mount a 4 MiB tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        # A test that failed may have left a file open there: detach the mount anyway.
        if subprocess.run(["umount", str(disk)], check=False).returncode != 0:
            subprocess.run(["umount", "--lazy", str(disk)], check=True)


def fill(disk: Path) -> Path:
    """Write a file on ``disk`` until the kernel says it is full; the file's path."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with pytest.raises(OSError, match="No space left") as refused:  # noqa: PT012 - ends by raising
            while True:
                os.write(fd, bytes(4096))
    finally:
        os.close(fd)
    assert refused.value.errno == errno.ENOSPC
    return filler


def wal_size(db: Path) -> int:
    """The size of ``db``'s -wal file; 0 if there is none."""
    try:
        return os.path.getsize(f"{db}-wal")
    except FileNotFoundError:
        return 0


def free(disk: Path) -> int:
    """Free bytes on ``disk``."""
    return shutil.disk_usage(disk).free


def test_a_write_that_finds_the_disk_full_checkpoints_the_wal_and_still_raises(
    small_disk: Path,
) -> None:
    """The failed write raises as before; the -wal file is emptied, so the next write fits."""
    db = small_disk / "jobs.db"
    with_rows = SQLiteStore(db, watch_interval=0)
    with_rows.enqueue_many([{"task": "t"} for _ in range(400)])
    with_rows.enqueue_many([{"task": "pad", "payload": "x" * 2000} for _ in range(100)])
    for job_id in range(401, 501):
        with_rows.cancel(job_id)
    with_rows.purge(states=["cancelled"])  # free pages: the checkpoint need not grow the file
    with_rows.close()  # checkpointed: the database file holds every page
    store = SQLiteStore(db, watch_interval=0)
    try:
        for job_id in range(1, 201):
            store.cancel(job_id)  # one transaction each: the -wal file grows
        grown = wal_size(db)
        assert grown > 512 * 1024
        fill(small_disk)
        with pytest.raises(sqlite3.OperationalError, match=FULL):
            store.enqueue("t")
        assert wal_size(db) == 0  # checkpointed into the database file, then cut
        assert free(small_disk) >= grown - 64 * 1024
        job_id = store.enqueue("t")  # the filler is still there: the space went to the WAL
        assert store.counts() == {
            "queued": 201,
            "running": 0,
            "done": 0,
            "failed": 0,
            "cancelled": 200,
        }
        assert store.get(job_id) is not None
    finally:
        store.close()


def test_a_checkpoint_the_full_disk_refused_runs_before_the_next_write(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """When the database file cannot grow either, the checkpoint waits for freed space."""
    db = small_disk / "jobs.db"
    store = SQLiteStore(db, watch_interval=0)
    try:
        for _ in range(80):  # new rows: a checkpoint must grow the database file
            store.enqueue("t", {"pad": "x" * 2000})
        filler = fill(small_disk)
        with (
            caplog.at_level(logging.WARNING, logger="patterns.jobqueue.stores.sqlite"),
            pytest.raises(sqlite3.OperationalError, match=FULL),
        ):
            store.enqueue("t")
        assert "is tried again before each write" in caplog.text
        grown = wal_size(db)
        assert grown > 1024 * 1024  # nothing could be freed yet
        filler.unlink()
        store.enqueue("t")  # checkpoints first, then appends to an empty -wal file
        assert wal_size(db) < 64 * 1024
        assert store.counts()["queued"] == 81
    finally:
        store.close()


def _writer(db: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS t (x)")
    return conn


def test_the_watcher_checkpoints_a_big_wal_once_per_quiet_spell(db: Path) -> None:
    """After IDLE_QUIET without a commit: once, and only if the -wal file is big."""
    writer = _writer(db)
    other = sqlite3.connect(db, isolation_level=None)  # every checkpoint moves its version
    watcher = sqlite3.connect(db, isolation_level=None, timeout=0)

    def version() -> int:
        return int(other.execute("PRAGMA data_version").fetchone()[0])

    try:
        checkpoints = WatchCheckpoints(str(db))
        writer.execute("INSERT INTO t VALUES (?)", ("x" * 1000,))
        small = wal_size(db)
        assert 0 < small < IDLE_WAL_BYTES
        seen = version()
        checkpoints.after_look(watcher, committed=True, waited=0.015)
        checkpoints.after_look(watcher, committed=False, waited=2 * IDLE_QUIET)
        assert (wal_size(db), version()) == (small, seen)  # small: left alone

        checkpoints.after_look(watcher, committed=True, waited=0.015)
        for _ in range(100):
            writer.execute("INSERT INTO t VALUES (?)", ("x" * 4000,))
        assert wal_size(db) > IDLE_WAL_BYTES
        checkpoints.after_look(watcher, committed=False, waited=IDLE_QUIET / 2)
        assert wal_size(db) > IDLE_WAL_BYTES  # not quiet long enough yet
        checkpoints.after_look(watcher, committed=False, waited=IDLE_QUIET / 2)
        assert wal_size(db) == 0

        for _ in range(100):  # not seen by the watcher: the same quiet spell
            writer.execute("INSERT INTO t VALUES (?)", ("x" * 4000,))
        seen = version()
        checkpoints.after_look(watcher, committed=False, waited=10 * IDLE_QUIET)
        assert wal_size(db) > IDLE_WAL_BYTES  # once per spell
        assert version() == seen

        checkpoints.after_look(watcher, committed=True, waited=0.015)  # a new spell
        checkpoints.after_look(watcher, committed=False, waited=IDLE_QUIET)
        assert wal_size(db) == 0
        assert int(writer.execute("SELECT COUNT(*) FROM t").fetchone()[0]) == 201
    finally:
        for conn in (watcher, other, writer):
            conn.close()


class _Logged(logging.Handler):
    """Sets ``seen`` on the first record whose message contains ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.DEBUG)
        self.text = text
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


@contextmanager
def watching(store: SQLiteStore, text: str) -> Iterator[_Logged]:
    """A subscriber on ``store`` (its watcher thread runs), and a log handler for ``text``."""
    logged = _Logged(text)
    store_logger = logging.getLogger("patterns.jobqueue.stores.sqlite")
    level = store_logger.level
    store_logger.addHandler(logged)
    store_logger.setLevel(logging.DEBUG)
    unsubscribe = store.subscribe(lambda: None)  # starts the watcher thread
    try:
        yield logged
    finally:
        unsubscribe()
        store_logger.removeHandler(logged)
        store_logger.setLevel(level)


def test_a_store_with_subscribers_checkpoints_its_wal_when_idle(db: Path) -> None:
    """The watcher thread runs the idle checkpoint on its own: the -wal file is emptied."""
    store = SQLiteStore(db)
    try:
        with watching(store, "WAL checkpoint (idle) done") as watched:
            store.enqueue_many([{"task": "t", "payload": "x" * 4000} for _ in range(100)])
            assert wal_size(db) > IDLE_WAL_BYTES
            assert watched.seen.wait(MUST_HAPPEN)
            assert wal_size(db) == 0
        assert store.counts()["queued"] == 100
    finally:
        store.close()


def test_a_wal_that_outgrows_the_space_left_is_checkpointed_after_the_next_commit(
    small_disk: Path,
) -> None:
    """Before the -wal file takes the last byte, while the database file can still grow."""
    db = small_disk / "jobs.db"
    store = SQLiteStore(db)
    try:
        store.enqueue_many([{"task": "t", "payload": "x" * 4000} for _ in range(150)])
        grown = wal_size(db)
        filler = small_disk / "filler"
        filler.write_bytes(bytes(free(small_disk) - grown * 3 // 2))  # WAL > half of it
        with watching(store, "outgrew half the space left on its disk) done") as watched:
            store.enqueue("t")  # a commit the watcher sees
            assert watched.seen.wait(MUST_HAPPEN)
            assert wal_size(db) < grown
        assert store.counts()["queued"] == 151
    finally:
        store.close()


def test_a_worker_recovers_from_a_full_disk_and_the_wal_gives_its_space_back(
    small_disk: Path,
) -> None:
    """Disk filled under a worker, then freed: every job ends done and the -wal file shrinks.

    Before the checkpoints, the -wal file kept what it had grown to, the worker's commits
    filled the freed space again, and the worker exited 1 after the outage limit with
    jobs left queued.
    """
    db = small_disk / "jobs.db"
    history = SQLiteStore(db, watch_interval=0)  # a database file of 300 KiB or so
    for job_id in history.enqueue_many([{"task": "old", "payload": "x" * 2000}] * 150):
        history.cancel(job_id)
    history.close()
    keep = SQLiteStore(db, watch_interval=0)  # open throughout: the -wal file stays
    try:
        jobs = 100
        for _ in range(jobs):  # one transaction each: the -wal file grows
            keep.enqueue("fast")
        for _ in range(50):  # and more, for jobs that will not run
            keep.cancel(keep.enqueue("fast"))
        filler = fill(small_disk)
        grown = wal_size(db)
        worker = subprocess.Popen(
            [
                *[sys.executable, "-m", "patterns.jobqueue", "--db", str(db), "worker"],
                *["--tasks", TASKS, "--concurrency", "1", "--poll-interval", "0.05"],
                *["--store-outage-limit", "3", "--exit-when-empty"],
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        try:
            assert worker.stderr is not None
            log = []
            for line in worker.stderr:  # the worker logs its failed writes
                log.append(line)
                if FULL in line:
                    break
            filler.unlink()
            _, rest = worker.communicate(timeout=MUST_HAPPEN)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        log.append(rest)
        assert FULL in "".join(log)
        counts = keep.counts()
        assert (worker.returncode, counts["done"]) == (0, jobs), (counts, "".join(log)[-2000:])
        assert wal_size(db) < grown * 3 // 4
        assert free(small_disk) > DISK_BYTES // 4
    finally:
        keep.close()
