"""What the job queue's docstrings say about Python itself, checked on the running version.

Each test runs on every supported version (3.11, 3.12, 3.13) and asserts what *that*
version does, with the expectation chosen from `sys.version_info` where versions differ.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from patterns.jobqueue.stores.sqlite.store import SQLiteStore
from tests.support import MUST_HAPPEN, STAYS_BLOCKED, spawn_python


def test_sqlite_errors_carry_the_sqlite_error_code_the_store_reads() -> None:
    """sqlite.py: an error raised by `sqlite3` names SQLite's result code (3.11+)."""
    conn = sqlite3.connect(":memory:")
    try:
        with pytest.raises(sqlite3.OperationalError) as raised:
            conn.execute("SELECT * FROM no_such_table")
    finally:
        conn.close()
    assert raised.value.sqlite_errorcode == sqlite3.SQLITE_ERROR
    assert raised.value.sqlite_errorname == "SQLITE_ERROR"


def test_the_sqlite3_default_begins_transactions_implicitly_and_isolation_level_none_never_does(
    tmp_path: Path,
) -> None:
    """sqlite.py: the module's default opens a transaction before an INSERT; None never does.

    The default is still "legacy transaction control" on 3.12 and 3.13, which added
    ``Connection.autocommit`` (3.11 has no such attribute).
    """
    for isolation_level, implicit in (("", True), (None, False)):
        conn = sqlite3.connect(tmp_path / "t.db", isolation_level=isolation_level)
        try:
            conn.execute("CREATE TABLE IF NOT EXISTS t (x)")
            conn.execute("INSERT INTO t VALUES (1)")
            assert conn.in_transaction is implicit
            if sys.version_info >= (3, 12):
                assert conn.autocommit == sqlite3.LEGACY_TRANSACTION_CONTROL
            else:
                assert not hasattr(conn, "autocommit")
        finally:
            conn.close()
    store = SQLiteStore(tmp_path / "store.db")
    try:
        store.enqueue("t")
        assert store._conn.in_transaction is False  # the setting under test
    finally:
        store.close()


def test_pool_threads_are_non_daemon_and_interpreter_exit_waits_for_their_task() -> None:
    """worker.py: a `ThreadPoolExecutor` thread is non-daemon; exit waits for its running task.

    The child's main thread returns while a pool task blocks on stdin. If exit did not
    wait for the task, the atexit line would come first (or the task's never).
    """
    with ThreadPoolExecutor(1) as pool:
        daemon = pool.submit(lambda: threading.current_thread().daemon).result()
    assert daemon is False
    child = spawn_python(
        textwrap.dedent(
            """
            import atexit, sys
            from concurrent.futures import ThreadPoolExecutor
            atexit.register(lambda: print("atexit ran", flush=True))
            pool = ThreadPoolExecutor(1)
            pool.submit(lambda: print("task got", sys.stdin.readline().strip(), flush=True))
            print("main returned", flush=True)
            """
        )
    )
    try:
        assert child.stdout is not None
        assert child.stdin is not None
        assert child.stdout.readline() == "main returned\n"
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(STAYS_BLOCKED)  # held by the pool thread, not by luck: see below
        child.stdin.write("go\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=MUST_HAPPEN)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert (out, err, child.returncode) == ("task got go\natexit ran\n", "", 0)
