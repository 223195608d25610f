"""The command line's rough edges on a ``postgresql://`` URL, where the command talks to the store.

In-process through `patterns.jobqueue.cli.main.main`, on a new database per test (the
``pg_database`` fixture). Run with a server:
``scripts/pg-test-cluster.sh run -- .venv/bin/pytest tests/jobqueue/test_cli_postgres.py``.
The operator's commands run on PostgreSQL in ``test_cli_operator.py``.
"""

from __future__ import annotations

import io
import json
import signal
import textwrap
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from patterns.jobqueue.cli import main as cli
from patterns.jobqueue.stores.postgres.store import PostgresStore
from tests.jobqueue.conftest import admin_execute, url_with_database
from tests.jobqueue.test_cli import TASKS_MODULE
from tests.jobqueue.test_cli_signals import storm_until_exit

ERROR = "python -m patterns.jobqueue: error: "


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``python -m patterns.jobqueue ARGS``, in-process: (status, stdout, stderr)."""
    status = cli.main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def max_attempts(url: str, job_id: int) -> int:
    """The job's max_attempts, read through the store."""
    store = PostgresStore(url)
    try:
        job = store.get(job_id)
    finally:
        store.close()
    assert job is not None
    return job.max_attempts


def test_db_after_the_command_from_the_environment_and_a_payload_from_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, pg_database: str
) -> None:
    """A URL works wherever a path does: after the command, in $JOBQUEUE_DB; stdin payloads."""
    assert run_cli(capsys, "enqueue", "t", "--db", pg_database)[:2] == (0, "1\n")
    monkeypatch.setenv("JOBQUEUE_DB", pg_database)
    monkeypatch.setattr(
        "sys.stdin", io.TextIOWrapper(io.BytesIO(b'{"big": "' + b"x" * 200_000 + b'"}'))
    )
    assert run_cli(capsys, "enqueue", "t", "-") == (0, "2\n", "")
    status, out, _ = run_cli(capsys, "status", "--json")
    assert (status, json.loads(out)["queued"]) == (0, 2)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"{nope")))
    status, out, err = run_cli(capsys, "enqueue", "t", "-")
    assert (status, out) == (2, "")
    assert err.startswith(ERROR + "invalid JSON payload")
    assert "from stdin" in err


def test_enqueue_with_tasks_takes_the_registered_defaults_on_postgresql(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    pg_database: str,
) -> None:
    """The task's max_attempts unless the command line says otherwise; a warning if unknown."""
    (tmp_path / "pg_edge_tasks.py").write_text(
        textwrap.dedent(
            """
            from patterns.jobqueue.tasks import TaskRegistry
            tasks = TaskRegistry()
            tasks.task(name="patient", max_attempts=9)(lambda payload, ctx: None)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    base = ["--db", pg_database, "enqueue", "--tasks", "pg_edge_tasks:tasks"]
    assert run_cli(capsys, *base, "patient") == (0, "1\n", "")
    assert run_cli(capsys, *base, "patient", "--max-attempts", "4")[:2] == (0, "2\n")
    status, out, err = run_cli(capsys, *base, "stranger")
    assert (status, out) == (0, "3\n")
    assert "warning: task 'stranger' is not in pg_edge_tasks:tasks" in err
    assert [max_attempts(pg_database, n) for n in (1, 2, 3)] == [9, 4, 3]


def test_enqueue_into_a_read_only_database_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], pg_dsn: str, pg_database: str
) -> None:
    """A database whose sessions are read-only: one line naming why (not the password), exit 2."""
    assert run_cli(capsys, "--db", pg_database, "enqueue", "t")[:2] == (0, "1\n")
    name = pg_database.rsplit("/", 1)[1]
    admin_execute(pg_dsn, f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    status, out, err = run_cli(capsys, "--db", pg_database, "enqueue", "t")
    assert (status, out) == (2, ""), err
    line = err.splitlines()[-1]
    assert line.startswith(ERROR), err
    assert "read-only" in line
    password = urlsplit(pg_database).password
    assert password, "the test server's URL has a password, so its absence is checked"
    assert password not in err
    status, out, err = run_cli(capsys, "--db", pg_database, "status", "--json")
    assert (status, json.loads(out)["queued"]) == (0, 1), err


def test_a_command_that_only_reads_refuses_a_database_without_a_queue_and_creates_nothing(
    capsys: pytest.CaptureFixture[str], pg_dsn: str, pg_database: str
) -> None:
    """status, list, show, workers on a database with no job store: "no such queue", exit 2."""
    for command in (["status"], ["list"], ["show", "1"], ["workers"], ["purge"]):
        status, out, err = run_cli(capsys, "--db", pg_database, *command)
        assert (status, out) == (2, ""), err
        [line] = err.splitlines()
        assert line.startswith(ERROR)
        assert "no such queue" in line
    name = pg_database.rsplit("/", 1)[1]
    schemas = admin_execute(
        url_with_database(pg_dsn, name),
        "SELECT count(*) FROM information_schema.schemata WHERE schema_name = 'jobqueue'",
    )
    assert schemas == [(0,)]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda sig: sig.name)
def test_a_signal_storm_while_a_postgresql_worker_exits_never_changes_its_status(
    tmp_path: Path, pg_database: str, sig: signal.Signals
) -> None:
    """As on SQLite: stop signals from the STOPPED line to the exit leave the status 0."""
    (tmp_path / "jobs.py").write_text(textwrap.dedent(TASKS_MODULE))
    worker = ["--db", pg_database, "worker", "--tasks", "jobs:tasks", "--poll-interval", "0.05"]
    for _ in range(5):
        assert storm_until_exit(worker, tmp_path, sig) == 0
