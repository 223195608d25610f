"""PostgreSQL locked by another connection: the command line keeps its bounds.

Another connection holds a lock a command needs (``LOCK TABLE ... ACCESS EXCLUSIVE``, or
the advisory lock under which the schema is created and migrated), as an operator's
shell left mid-transaction or a migration in progress on another machine would. A
command is known to be waiting when the server shows its session waiting for a lock
(``pg_stat_activity`` of the test's own database); only then does the test act. What is
asserted is "within the bound plus a margin", not a speed.

Run with a server:
``scripts/pg-test-cluster.sh run -- .venv/bin/pytest tests/jobqueue/test_postgres_locked.py``.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from patterns.jobqueue.postgres import PostgresStore
from patterns.jobqueue.postgres_connection import _advisory_key
from tests.jobqueue.conftest import admin_execute
from tests.support import MUST_HAPPEN, child_env, elapsed

NOISE = 3.0  # process start, imports and exit, on a shared machine
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
            "--db", queue_url, "worker", "--tasks", "patterns.jobqueue.demo_tasks:tasks",
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
