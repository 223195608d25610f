"""The operator's commands (show, list, requeue, cancel, purge, workers), on SQLite and PostgreSQL.

Each test runs `patterns.jobqueue.cli.main.main` in-process on a fresh queue (an SQLite file
in ``tmp_path``, or a new PostgreSQL database), and moves the jobs through their states
by calling the store directly (claim, release, fail, complete), so every state is
reached deterministically, without a worker or a sleep. PostgreSQL runs need a server:
``scripts/pg-test-cluster.sh run -- .venv/bin/pytest tests/jobqueue/test_cli_operator.py``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from patterns.jobqueue.cli import main as cli
from patterns.jobqueue.cli import store_access
from patterns.jobqueue.stores.memory import MemoryStore
from patterns.jobqueue.stores.postgres.store import PostgresStore
from patterns.jobqueue.stores.protocol import Store
from patterns.jobqueue.stores.records import Claim
from patterns.jobqueue.stores.sqlite.store import SQLiteStore

ERROR = "python -m patterns.jobqueue: error: "
ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


class SharedMemoryStore(MemoryStore):
    """A `MemoryStore` that outlives each command's ``close()`` (closed by the fixture)."""

    def close(self) -> None:
        """Keep the jobs for the next command."""

    def really_close(self) -> None:
        """Close it for good."""
        super().close()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def db(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """The ``--db`` of a new, empty queue: in memory, an SQLite file, a PostgreSQL database.

    "memory" checks the commands against the reference store: every command's
    ``open_store`` returns one shared `MemoryStore`.
    """
    if request.param == "memory":
        shared = SharedMemoryStore()
        monkeypatch.setattr(store_access, "open_store", lambda path, *, create=False: shared)
        yield "memory.db"
        shared.really_close()
    elif request.param == "sqlite":
        path = tmp_path / "q.db"
        SQLiteStore(path).close()
        yield str(path)
    else:
        url: str = request.getfixturevalue("pg_database")
        yield url


@pytest.fixture
def store(db: str) -> Iterator[Store]:
    """The same queue, opened by the test to move jobs between states."""
    if db == "memory.db":
        yield store_access.open_store(db)
        return
    made: Store = PostgresStore(db) if db.startswith("postgresql") else SQLiteStore(db)
    yield made
    made.close()


def run(capsys: pytest.CaptureFixture[str], db: str, *args: str) -> tuple[int, str, str]:
    """``python -m patterns.jobqueue --db DB ARGS``, in-process: (status, stdout, stderr)."""
    status = cli.main(["--db", db, *args])
    out, err = capsys.readouterr()
    return status, out, err


def ok(capsys: pytest.CaptureFixture[str], db: str, *args: str) -> str:
    """Run a command that must succeed silently on stderr; its stdout."""
    status, out, err = run(capsys, db, *args)
    assert (status, err) == (0, ""), (status, out, err)
    return out


def refused(capsys: pytest.CaptureFixture[str], db: str, *args: str) -> str:
    """Run a command that must be refused: exit 2, one line on stderr; that line."""
    status, out, err = run(capsys, db, *args)
    assert (status, out) == (2, ""), (status, out, err)
    [line] = err.splitlines()
    assert line.startswith(ERROR)
    return line[len(ERROR) :]


def fields(text: str) -> dict[str, str]:
    """``show``'s text as {field: value}."""
    lines = text.splitlines()
    assert re.fullmatch(r"job \d+", lines[0]), lines[0]
    return {line[2:19].strip(): line[19:] for line in lines[1:]}


def claim_one(store: Store, owner: str = "w1", lease: float = 30.0) -> Claim:
    """Claim the one due job."""
    [claim] = store.claim(owner, lease=lease)
    return claim


def test_show_follows_a_job_through_its_life(
    capsys: pytest.CaptureFixture[str], db: str, store: Store
) -> None:
    """Queued, running under a lease, released (attempt given back), done with a result."""
    assert ok(capsys, db, "enqueue", "mail", '{"to": "ada"}', "--timeout", "30") == "1\n"
    first_run_at = json.loads(ok(capsys, db, "show", "1", "--json"))["run_at"]
    queued = fields(ok(capsys, db, "show", "1"))
    assert queued["task"] == "mail"
    assert queued["state"] == "queued"
    assert queued["attempts"] == "0 of 3"
    assert re.fullmatch(ISO + r" \((now|[\d.]+ s ago)\)", queued["run at"]), queued["run at"]
    assert queued["lease owner"] == queued["lease until"] == "-"
    assert queued["timeout"] == "30 s per attempt"
    assert queued["cancel requested"] == "no"
    assert queued["payload"] == '{"to": "ada"}'
    assert queued["result"] == "null"

    claim = claim_one(store)
    running = fields(ok(capsys, db, "show", "1"))
    assert running["state"] == "running"
    assert running["attempts"] == "1 of 3"
    assert running["lease owner"] == claim.token
    assert re.fullmatch(ISO + r" \(in (29|30)\.\d s\)", running["lease until"])
    raw = json.loads(ok(capsys, db, "show", "1", "--json"))
    assert raw["fencing_token"] == raw["lease_owner"] == claim.token
    assert raw["lease_until"] == pytest.approx(claim.lease_until)  # raw seconds in JSON
    assert (raw["state"], raw["attempts"], raw["timeout"]) == ("running", 1, 30.0)

    assert store.release(claim)
    released = fields(ok(capsys, db, "show", "1"))
    assert (released["state"], released["attempts"]) == ("queued", "0 of 3")
    assert released["run at"].split(" (")[0] == queued["run at"].split(" (")[0]
    assert json.loads(ok(capsys, db, "show", "1", "--json"))["run_at"] == first_run_at
    assert released["lease owner"] == "-"

    assert store.complete(claim_one(store), {"sent": True})
    done = fields(ok(capsys, db, "show", "1"))
    assert (done["state"], done["attempts"], done["result"]) == ("done", "1 of 3", '{"sent": true}')
    assert refused(capsys, db, "show", "99") == "no job 99"


def test_list_is_newest_first_filtered_and_limited_text_or_json(
    capsys: pytest.CaptureFixture[str], db: str, store: Store
) -> None:
    """One line per job: id, state, task, attempts/max, run_at, the last error shortened."""
    for task in ("a", "b", "a", "a"):
        ok(capsys, db, "enqueue", task)
    assert store.fail(claim_one(store), "boom " * 40)  # job 1
    lines = ok(capsys, db, "list").splitlines()
    assert lines[0].split() == ["ID", "STATE", "TASK", "ATTEMPTS", "RUN", "AT", "LAST", "ERROR"]
    assert [line.split()[:4] for line in lines[1:]] == [
        ["4", "queued", "a", "0/3"],
        ["3", "queued", "a", "0/3"],
        ["2", "queued", "b", "0/3"],
        ["1", "failed", "a", "1/3"],
    ]
    assert lines[-1].endswith(" boom bo...")
    assert len(lines[-1]) < 160
    assert [j["id"] for j in json.loads(ok(capsys, db, "list", "--json", "--task", "a"))] == [
        4,
        3,
        1,
    ]
    only_failed = json.loads(ok(capsys, db, "list", "--state", "failed", "--json"))
    assert [(j["id"], j["state"]) for j in only_failed] == [(1, "failed")]
    assert len(ok(capsys, db, "list", "--limit", "2").splitlines()) == 3
    assert "invalid choice: 'lost'" in refused(capsys, db, "list", "--state", "lost")


def test_requeue_brings_a_dead_letter_back_and_refuses_a_job_that_is_not_failed(
    capsys: pytest.CaptureFixture[str], db: str, store: Store
) -> None:
    """Attempts reset, last error kept; a queued or missing job is refused with exit 2."""
    ok(capsys, db, "enqueue", "a", "--max-attempts", "1")
    ok(capsys, db, "enqueue", "b", "--max-attempts", "1")
    ok(capsys, db, "enqueue", "a")
    assert store.fail(claim_one(store), "dead 1")
    assert store.fail(claim_one(store), "dead 2")
    assert "requeued" in ok(capsys, db, "requeue", "1")
    back = fields(ok(capsys, db, "show", "1"))
    assert (back["state"], back["attempts"], back["last error"]) == ("queued", "0 of 1", "dead 1")
    assert refused(capsys, db, "requeue", "1") == (
        "job 1 is queued, not failed: only a failed job is requeued"
    )
    assert refused(capsys, db, "requeue", "9") == "no job 9"
    assert ok(capsys, db, "requeue", "--failed", "--task", "a") == "requeued 0 job(s)\n"
    assert ok(capsys, db, "requeue", "--failed") == "requeued 1 job(s): 2\n"
    assert "exactly one" in refused(capsys, db, "requeue")
    assert "exactly one" in refused(capsys, db, "requeue", "1", "--failed")
    assert "--task goes with --failed" in refused(capsys, db, "requeue", "1", "--task", "a")


def test_cancel_says_what_happened_and_status_counts_the_cancelled(
    capsys: pytest.CaptureFixture[str], db: str, store: Store
) -> None:
    """Queued: cancelled for good. Running: requested. Finished or missing: exit 2."""
    ok(capsys, db, "enqueue", "a")
    ok(capsys, db, "enqueue", "b")
    claim = claim_one(store)  # job 1 runs
    assert "job 2 cancelled" in ok(capsys, db, "cancel", "2")
    assert "cancel requested" in ok(capsys, db, "cancel", "1")
    assert fields(ok(capsys, db, "show", "1"))["cancel requested"] == "yes"
    renewed = store.renew(claim, lease=30.0)
    assert renewed is not None
    assert renewed.cancel_requested  # what the worker's next heartbeat sees
    assert (
        refused(capsys, db, "cancel", "2") == "job 2 already ended (cancelled): nothing to cancel"
    )
    assert refused(capsys, db, "cancel", "7") == "no job 7"
    assert json.loads(ok(capsys, db, "status", "--json")) == {
        "queued": 0,
        "running": 1,
        "done": 0,
        "failed": 0,
        "cancelled": 1,
    }
    assert "cancelled 1" in " ".join(ok(capsys, db, "status").split())


def test_purge_deletes_only_finished_jobs_of_the_states_asked_for(
    capsys: pytest.CaptureFixture[str], db: str, store: Store
) -> None:
    """Default: every finished state; ``--state`` repeatable; ``--older-than`` an age."""
    for _ in range(4):
        ok(capsys, db, "enqueue", "t")
    assert store.complete(claim_one(store))  # 1 done
    assert store.fail(claim_one(store), "no")  # 2 failed
    ok(capsys, db, "cancel", "3")  # 3 cancelled; 4 stays queued
    assert ok(capsys, db, "purge", "--older-than", "3600") == "purged 0 job(s)\n"
    assert ok(capsys, db, "purge", "--state", "done", "--state", "failed") == "purged 2 job(s)\n"
    assert ok(capsys, db, "purge") == "purged 1 job(s)\n"
    assert json.loads(ok(capsys, db, "status", "--json"))["queued"] == 1
    assert "invalid choice: 'queued'" in refused(capsys, db, "purge", "--state", "queued")


def test_workers_lists_the_live_workers_as_a_table_or_json(
    capsys: pytest.CaptureFixture[str], db: str, store: Store
) -> None:
    """One row per live worker; a row whose time to live has passed is not listed."""
    assert ok(capsys, db, "workers") == "no live workers\n"
    now = store.clock()
    store.record_worker(
        "worker-7-1", host="box", pid=7, state="draining", started_at=now - 5, jobs_held=2, ttl=60
    )
    store.record_worker(
        "worker-8-1", host="box", pid=8, state="running", started_at=now, jobs_held=0, ttl=1e-3
    )
    rows = json.loads(ok(capsys, db, "workers", "--json"))
    live = [r for r in rows if r["id"] == "worker-7-1"]
    assert live == [rows[0]]
    assert (live[0]["host"], live[0]["pid"], live[0]["state"], live[0]["jobs_held"]) == (
        "box",
        7,
        "draining",
        2,
    )
    lines = ok(capsys, db, "workers").splitlines()
    assert lines[0].split() == ["WORKER", "HOST", "PID", "STATE", "STARTED", "LAST", "SEEN", "JOBS"]
    cells = lines[1].split()
    assert cells[:4] == ["worker-7-1", "box", "7", "DRAINING"]
    assert cells[-1] == "2"
    assert "ago)" in lines[1]
