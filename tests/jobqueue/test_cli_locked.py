"""The command line on a queue another connection holds locked: every wait has its bound.

Another connection holds a lock a command needs: on PostgreSQL ``LOCK TABLE ... ACCESS
EXCLUSIVE``, or the advisory lock under which the schema is created and migrated, as an
operator's shell left mid-transaction or a migration in progress on another machine
would; on SQLite the file's write lock (``BEGIN IMMEDIATE``). A PostgreSQL command is
known to be waiting when the server shows its session waiting for a lock
(``pg_stat_activity`` of the test's own database); only then does the test act. What is
asserted is "within the bound plus a margin", not a speed.

Run with a server:
``scripts/pg-test-cluster.sh run -- .venv/bin/pytest tests/jobqueue/test_cli_locked.py``.
"""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from patterns.jobqueue.stores.postgres.connection import _advisory_key
from patterns.jobqueue.stores.postgres.store import PostgresStore
from patterns.jobqueue.stores.sqlite.store import SQLiteStore
from tests.jobqueue.conftest import admin_execute
from tests.support import MUST_HAPPEN, child_env, elapsed

# Process start, imports and exit, on a shared 2-core machine: with parallel test runs
# (load average 8), a `status --wait 1` took from 1.4 s to 3.5 s from start to exit, and
# once 4 s. What is asserted against it is an end, where before there was none.
NOISE = 5.0
STOP = 2.0  # the worker's --stop-timeout in these tests


def database_of(url: str) -> str:
    """The database name of a ``postgresql://`` URL."""
    return url.rsplit("/", 1)[1]


def waiting_for_a_lock(url: str) -> bool:
    """True when a session of the store (not the test's) waits for a lock in ``url``'s database."""
    rows = admin_execute(
        url,
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND datname = %s AND application_name = 'patterns.jobqueue'",
        (database_of(url),),
    )
    return bool(rows[0][0])


def wait_for_a_waiter(url: str, proc: subprocess.Popen[str] | None = None) -> None:
    """Poll the server's view until a store session waits for a lock (bounded)."""
    give_up_at = time.monotonic() + MUST_HAPPEN
    while not waiting_for_a_lock(url):
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process ended first: {proc.communicate()}")
        assert time.monotonic() < give_up_at, "no store session ever waited for the lock"
        threading.Event().wait(0.01)  # a poll of the server's view, not an ordering


@contextlib.contextmanager
def holding(url: str, lock: str) -> Iterator[None]:
    """Another connection holds ``lock`` ("jobs", "schema" or "advisory") until the block ends."""
    import psycopg  # noqa: PLC0415 - optional: only these tests need it

    statements = {
        "jobs": "LOCK TABLE jobqueue.jobs IN ACCESS EXCLUSIVE MODE",
        "schema": "LOCK TABLE jobqueue.schema_version IN ACCESS EXCLUSIVE MODE",
        "advisory": f"SELECT pg_advisory_xact_lock({_advisory_key('jobqueue')})",
    }
    with psycopg.connect(url) as other:
        other.execute(statements[lock])
        try:
            yield
        finally:
            other.rollback()


@pytest.fixture
def queue_url(pg_database: str) -> str:
    """A database holding a job store with one queued job."""
    store = PostgresStore(pg_database)
    try:
        store.enqueue("noop")
    finally:
        store.close()
    return pg_database


def spawn(*args: str) -> subprocess.Popen[str]:
    """``python -m patterns.jobqueue ARGS`` in a child process, output captured."""
    return subprocess.Popen(
        [sys.executable, "-m", "patterns.jobqueue", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str, str]:
    """(status, stdout, stderr) of ``proc`` within ``timeout``; killed and failed otherwise."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=MUST_HAPPEN)
        raise AssertionError(f"still running after {timeout} s: {err}") from None
    return proc.returncode, out, err


# --- the worker's start-up ------------------------------------------------------------------


@pytest.mark.parametrize("lock", ["schema", "advisory"])
def test_a_sigterm_while_the_worker_waits_for_a_locked_schema_ends_it_within_its_budget(
    queue_url: str, lock: str
) -> None:
    """Start-up keeps --stop-timeout: the schema check gives up at it, exit 5, one line.

    Before: the first SIGTERM was logged and ignored until the lock went away; only a
    second signal ended the worker (143).
    """
    with holding(queue_url, lock):
        proc = spawn(
            "--db", queue_url, "worker", "--tasks", "patterns.jobqueue.cli.demo_tasks:tasks",
            "--stop-timeout", str(STOP),
        )  # fmt: skip
        try:
            wait_for_a_waiter(queue_url, proc)
            with elapsed() as took:
                proc.send_signal(signal.SIGTERM)
                status, _, err = finish(proc, STOP + NOISE)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=MUST_HAPPEN)
    assert status == 5, err
    assert took() < STOP + NOISE, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if "during start-up" in line]
    assert len(lines) == 1, err
    assert "did not answer within the shutdown budget" in lines[0], err
    store = PostgresStore(queue_url)
    try:
        assert store.counts().get("queued") == 1  # nothing claimed, nothing lost
    finally:
        store.close()


# --- one-shot commands: --wait -------------------------------------------------------------

ERROR = "python -m patterns.jobqueue: error: "
WAIT = 1.0  # the --wait of most tests below
DEFAULT_WAIT = 26.0  # what --wait is when not given: as long as SQLite's busy retries last

ONE_SHOT = [
    pytest.param(["status"], "count the jobs", id="status"),
    pytest.param(["list"], "list the jobs", id="list"),
    pytest.param(["show", "1"], "read the job", id="show"),
    pytest.param(["enqueue", "t"], "enqueue", id="enqueue"),
    pytest.param(["cancel", "1"], "cancel the job", id="cancel"),
    pytest.param(["requeue", "1"], "requeue the job", id="requeue"),
    pytest.param(["purge"], "purge jobs", id="purge"),
]


def one_line_after_waiting(
    proc: subprocess.Popen[str], what: str, wait: float
) -> tuple[float, str]:
    """Wait for ``proc`` to give up; check its one line and status 2; (seconds, the line)."""
    with elapsed() as took:
        status, out, err = finish(proc, wait + NOISE)
    assert (status, out) == (2, ""), err
    [line] = err.splitlines()  # no retries, no traceback
    assert line.startswith(ERROR), line
    assert f": cannot {what}: " in line, line
    assert f"the --wait limit ({wait:g} s)" in line, line
    return took(), line


def jobs_in(url: str) -> dict[str, int]:
    """The states that have jobs, and how many each, read through a store of the test's own."""
    store = PostgresStore(url)
    try:
        return {state: count for state, count in store.counts().items() if count}
    finally:
        store.close()


@pytest.mark.parametrize(("command", "what"), ONE_SHOT)
def test_a_one_shot_command_on_a_locked_postgres_table_gives_up_after_wait_in_one_line(
    queue_url: str, command: list[str], what: str
) -> None:
    """``--wait 1`` on a jobs table locked by another connection: one line, exit 2, nothing done.

    Before: every one of these commands waited until it was killed.
    """
    with holding(queue_url, "jobs"):
        proc = spawn("--db", queue_url, *command, "--wait", str(WAIT))
        took, line = one_line_after_waiting(proc, what, WAIT)
    assert WAIT <= took < WAIT + NOISE, line
    assert "lock" in line, line
    assert jobs_in(queue_url) == {"queued": 1}  # nothing written


def test_status_waits_for_the_migration_lock_only_as_long_as_wait(queue_url: str) -> None:
    """The schema's advisory lock (a migration elsewhere) is waited for within --wait too."""
    with holding(queue_url, "advisory"):
        proc = spawn("--db", queue_url, "status", "--wait", str(WAIT))
        took, line = one_line_after_waiting(proc, "count the jobs", WAIT)
    assert WAIT <= took < WAIT + NOISE, line


@pytest.mark.parametrize("lock", ["jobs", "advisory"])
def test_status_without_wait_gives_up_after_the_default_bound_on_postgresql(
    queue_url: str, lock: str
) -> None:
    """No --wait: the same bound as a locked SQLite file, about 26 s, then one line, exit 2.

    Before: ``status`` waited until it was killed.
    """
    with holding(queue_url, lock):
        proc = spawn("--db", queue_url, "status")
        took, line = one_line_after_waiting(proc, "count the jobs", DEFAULT_WAIT)
    assert DEFAULT_WAIT <= took < DEFAULT_WAIT + NOISE, line


def test_ctrl_c_while_enqueue_waits_for_a_locked_postgres_table_is_130_and_writes_nothing(
    queue_url: str,
) -> None:
    """SIGINT during the wait: one line, ``interrupted``, exit 130; no job once the lock goes."""
    with holding(queue_url, "jobs"):
        proc = spawn("--db", queue_url, "enqueue", "t")
        try:
            wait_for_a_waiter(queue_url, proc)
            proc.send_signal(signal.SIGINT)
            status, out, err = finish(proc, NOISE)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=MUST_HAPPEN)
    assert (status, out) == (130, ""), err
    assert err.splitlines() == ["python -m patterns.jobqueue: interrupted"], err
    assert jobs_in(queue_url) == {"queued": 1}


SHORT_BUSY_WAIT = """
import sys
import patterns.jobqueue.stores.sqlite.store as sqlite_store
sqlite_store.BUSY_TIMEOUT = 0.05
from patterns.jobqueue.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def locked_file(tmp_path: Path) -> Iterator[Path]:
    """An SQLite queue with one job, whose write lock another connection holds."""
    path = tmp_path / "q.db"
    store = SQLiteStore(path)
    try:
        store.enqueue("noop")
    finally:
        store.close()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield path
    finally:
        conn.close()


@pytest.mark.parametrize("wait", [0.5, 3.0])
def test_wait_bounds_a_write_on_a_locked_sqlite_file_both_ways(
    locked_file: Path, wait: float
) -> None:
    """--wait is the bound on SQLite too: shorter than the store's retries, or longer.

    With 50 ms busy waits the store's own retries end after about a second; ``--wait
    3`` keeps trying for 3 s, ``--wait 0.5`` gives up after half a second.
    """
    proc = subprocess.Popen(
        [sys.executable, "-c", SHORT_BUSY_WAIT, "--db", str(locked_file), "enqueue", "t",
         "--wait", str(wait)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )  # fmt: skip
    took, line = one_line_after_waiting(proc, "enqueue", wait)
    assert wait <= took < wait + NOISE, line
    assert "database is locked" in line, line


def test_a_wait_longer_than_postgresql_timeouts_take_is_accepted(queue_url: str) -> None:
    """--wait of years: PostgreSQL's timeouts are capped at their largest (24.8 days)."""
    result = subprocess.run(
        [sys.executable, "-m", "patterns.jobqueue", "--db", queue_url, "status", "--json",
         "--wait", "1e9"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=MUST_HAPPEN,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert '"queued": 1' in result.stdout


@pytest.mark.parametrize(
    ("value", "says"),
    [("nan", "finite"), ("-1", ">= 0"), ("soon", "not a number"), ("inf", "finite")],
)
def test_a_bad_wait_is_one_line_and_exit_2(tmp_path: Path, value: str, says: str) -> None:
    """--wait is checked like every other number of seconds, before anything is opened."""
    path = tmp_path / "q.db"
    result = subprocess.run(
        [sys.executable, "-m", "patterns.jobqueue", "--db", str(path), "status", "--wait", value],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=MUST_HAPPEN,
        check=False,
    )
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith(ERROR), line
    assert "wait" in line, line
    assert says in line, line
    assert not path.exists()
