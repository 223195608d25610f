"""`Store.settle_many`: several outcomes in one transaction, each item fenced alone.

Every case runs on every store (memory, a SQLite file, PostgreSQL) on a fake clock, like
test_store_contract.py: an item of the batch leaves its job exactly as its single-job
method leaves a twin job; a stale claim, a bad item or a repeated claim is refused alone
and the rest apply. Then the store-specific ones: the batch is one transaction (a failure
at COMMIT, or in the middle, applies none of it on SQLite; a connection broken during
COMMIT is `CommitUnknown` on PostgreSQL), and a process SIGKILLed inside the batch's
transaction leaves none of it applied, right after its COMMIT all of it.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from patterns.jobqueue.stores.base import settle_each
from patterns.jobqueue.stores.memory import MemoryStore
from patterns.jobqueue.stores.postgres.store import CommitUnknown, PostgresStore
from patterns.jobqueue.stores.protocol import Store
from patterns.jobqueue.stores.records import Claim, Job, JobState, Settle, Settlement
from patterns.jobqueue.stores.sqlite import store as sqlite_store
from patterns.jobqueue.stores.sqlite import transactions as sqlite_transactions
from patterns.jobqueue.stores.sqlite.store import SQLiteStore, StoreFileError
from tests.jobqueue.conftest import admin_execute
from tests.support import (
    MUST_HAPPEN,
    FakeClock,
    child_env,
    join_or_fail,
    run_in_thread,
    stays_blocked,
)

START = 1_000_000.0
LEASE = 30.0


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock starting at START, shared by the store and the test."""
    return FakeClock()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, clock: FakeClock, tmp_path: Path) -> Iterator[Store]:
    """Each store under test, on the fake clock, closed afterwards (PostgreSQL: a new schema)."""
    made: Store
    if request.param == "memory":
        made = MemoryStore(clock=clock, max_payload_bytes=1000)
    elif request.param == "sqlite":
        made = SQLiteStore(tmp_path / "jobs.db", clock=clock, max_payload_bytes=1000)
    else:
        dsn = request.getfixturevalue("pg_dsn")
        schema = request.getfixturevalue("pg_schema")
        made = PostgresStore(dsn, schema=schema, clock=clock, max_payload_bytes=1000)
    yield made
    made.close()


def claim_all(store: Store, count: int, owner: str = "worker-a") -> list[Claim]:
    """Claim exactly ``count`` jobs, oldest first."""
    claims = store.claim(owner, lease=LEASE, limit=count)
    assert len(claims) == count, claims
    return claims


def must_get(store: Store, job_id: int) -> Job:
    """The job with this id, which must exist."""
    job = store.get(job_id)
    assert job is not None
    return job


def single(store: Store, item: Settlement) -> bool:
    """``item`` recorded by its single-job method (one transaction)."""
    (done,) = settle_each(store, [item])
    assert isinstance(done, bool), done
    return done


def as_twin(job: Job) -> Job:
    """A job with its id blanked, to compare two jobs field by field."""
    return dataclasses.replace(job, id=0)


def outcome(kind: Settle, claim: Claim) -> Settlement:
    """A settlement of ``kind`` with every field its kind reads set (the same for any claim)."""
    return Settlement(kind, claim, result={"r": [1, "x"]}, error="it broke", run_at=START + 60)


KINDS = list(Settle)

# --- each item does what its single method does ------------------------------------------


@pytest.mark.parametrize("alone", [True, False], ids=["alone", "with-another"])
@pytest.mark.parametrize("cancel_requested", [False, True], ids=["plain", "cancel-requested"])
@pytest.mark.parametrize("kind", KINDS, ids=[k.value for k in KINDS])
def test_each_kind_in_a_batch_leaves_its_job_as_its_single_method_leaves_a_twin(
    store: Store, clock: FakeClock, kind: Settle, cancel_requested: bool, alone: bool
) -> None:
    """A batch item and the single call leave two twin jobs equal in every field but the id.

    Alone in its batch or with another item: a store may take another path for one item.
    """
    store.enqueue_many([{"task": "t", "payload": {"p": 1}}] * 3)
    clock.now += 5
    batched, twin, other = claim_all(store, 3)
    if cancel_requested:
        store.cancel(batched.job.id)
        store.cancel(twin.job.id)
    clock.now += 5
    common = {"result": {"r": [1, "x"]}, "error": "it broke", "run_at": START + 600}
    batch = [Settlement(kind, batched, **common)]
    if not alone:
        batch.append(Settlement(Settle.COMPLETE, other))
    assert store.settle_many(batch) == [True] * len(batch)
    assert single(store, Settlement(kind, twin, **common)) is True
    after = must_get(store, batched.job.id)
    assert as_twin(after) == as_twin(must_get(store, twin.job.id))
    assert after.updated_at == clock.now
    assert (after.lease_owner, after.lease_until) == (None, None)


def test_a_batch_of_every_kind_matches_the_single_calls_job_by_job(
    store: Store, clock: FakeClock
) -> None:
    """Five kinds in one batch: the five jobs equal five twins settled one call at a time."""
    store.enqueue_many([{"task": "t", "payload": "same"}] * 10)
    claims = claim_all(store, 10)
    store.cancel(claims[4].job.id)  # the retry pair: it ends cancelled, not queued
    store.cancel(claims[5].job.id)
    clock.now += 1
    batch = [outcome(kind, claim) for kind, claim in zip(KINDS, claims[0::2], strict=True)]
    twins = [outcome(kind, claim) for kind, claim in zip(KINDS, claims[1::2], strict=True)]
    assert store.settle_many(batch) == [True] * 5
    assert [single(store, item) for item in twins] == [True] * 5
    for item, twin in zip(batch, twins, strict=True):
        job = must_get(store, item.claim.job.id)
        assert as_twin(job) == as_twin(must_get(store, twin.claim.job.id)), item.kind
    states = [must_get(store, c.job.id).state for c in claims[0::2]]
    assert states == ["done", "failed", "cancelled", "queued", "cancelled"]


def test_a_release_in_a_batch_gives_the_attempt_back_and_keeps_run_at(
    store: Store, clock: FakeClock
) -> None:
    """A released job is due again at its original run_at with the attempt given back."""
    job_id = store.enqueue("t", run_at=START - 10)
    (claim,) = claim_all(store, 1)
    clock.now += 3
    assert store.settle_many([Settlement(Settle.RELEASE, claim)]) == [True]
    job = must_get(store, job_id)
    assert (job.state, job.attempts, job.run_at) == (JobState.QUEUED, 0, START - 10)
    assert [c.job.id for c in claim_all(store, 1)] == [job_id]


# --- fencing, bad items and repeats, each alone --------------------------------------------


def test_a_stale_claim_inside_a_batch_is_refused_alone_and_the_rest_commit(
    store: Store, clock: FakeClock
) -> None:
    """The claim whose lease expired and was taken over is False; the two others apply."""
    store.enqueue_many([{"task": "t"}] * 3)
    first, stale, third = claim_all(store, 3)
    clock.now += LEASE + 1  # every lease expires; worker-b takes the middle job over
    store.renew(first, lease=LEASE)
    store.renew(third, lease=LEASE)
    (taken,) = store.claim("worker-b", lease=LEASE, limit=1)
    assert taken.job.id == stale.job.id
    batch = [Settlement(Settle.COMPLETE, c, result=c.job.id) for c in (first, stale, third)]
    assert store.settle_many(batch) == [True, False, True]
    assert must_get(store, first.job.id).result == first.job.id
    assert must_get(store, third.job.id).state is JobState.DONE
    kept = must_get(store, stale.job.id)
    assert (kept.state, kept.lease_owner, kept.result) == (JobState.RUNNING, taken.token, None)


def test_a_bad_item_is_its_own_exception_and_the_others_still_apply(store: Store) -> None:
    """Items a single call would refuse are their exceptions; their jobs stay untouched."""
    store.enqueue_many([{"task": "t"}] * 7)
    claims = claim_all(store, 7)
    batch: list[Any] = [
        Settlement(Settle.COMPLETE, claims[0], result="fine"),
        Settlement(Settle.COMPLETE, claims[1], result=object()),  # not JSON
        Settlement(Settle.COMPLETE, claims[2], result="x" * 2000),  # over max_payload_bytes
        Settlement(Settle.RETRY, claims[3], error="e", run_at=math.nan),
        Settlement("finish", claims[4]),  # type: ignore[arg-type]  # not a kind
        (Settle.FAIL, claims[5]),  # not a Settlement
        Settlement(Settle.FAIL, claims[6], error="bad\x00\udc80 text"),  # stored escaped
    ]
    done = store.settle_many(batch)
    assert done[0] is True
    assert done[6] is True
    errors = done[1:6]
    assert [type(e) for e in errors] == [TypeError, ValueError, ValueError, ValueError, TypeError]
    assert "JSON" in str(errors[0])
    assert "max_payload_bytes" in str(errors[1])
    assert "run_at" in str(errors[2])
    assert "'finish'" in str(errors[3])
    assert "Settlement" in str(errors[4])
    for claim in claims[1:6]:
        job = must_get(store, claim.job.id)
        assert (job.state, job.lease_owner) == (JobState.RUNNING, claim.token)
    assert must_get(store, claims[6].job.id).last_error == "bad\\x00\\udc80 text"


def test_a_batch_of_only_bad_items_changes_nothing(store: Store) -> None:
    """Every item refused before writing: each is its exception, and no job changes."""
    store.enqueue("t")
    (claim,) = claim_all(store, 1)
    done = store.settle_many([Settlement(Settle.COMPLETE, claim, result={1, 2})])
    assert isinstance(done[0], TypeError)
    assert must_get(store, claim.job.id).state is JobState.RUNNING


@pytest.mark.parametrize(
    ("first", "second", "state"),
    [
        (Settle.COMPLETE, Settle.COMPLETE, JobState.DONE),
        (Settle.COMPLETE, Settle.FAIL, JobState.DONE),
        (Settle.RELEASE, Settle.COMPLETE, JobState.QUEUED),
        (Settle.FAIL, Settle.RETRY, JobState.FAILED),
    ],
)
def test_two_items_for_one_claim_the_first_applies_and_the_second_is_false(
    store: Store, first: Settle, second: Settle, state: JobState
) -> None:
    """A claim repeated in one batch: the first outcome ends the lease, the second is refused."""
    store.enqueue_many([{"task": "t"}] * 2)
    claim, other = claim_all(store, 2)
    batch = [outcome(first, claim), outcome(Settle.COMPLETE, other), outcome(second, claim)]
    assert store.settle_many(batch) == [True, True, False]
    job = must_get(store, claim.job.id)
    assert job.state is state
    assert job.attempts == (0 if first is Settle.RELEASE else 1)


def test_an_empty_batch_is_a_no_op_even_on_a_closed_store(store: Store) -> None:
    """No items, no transaction: nothing to refuse, nothing raised."""
    assert store.settle_many([]) == []
    store.close()
    assert store.settle_many([]) == []


def test_a_batch_on_a_closed_store_raises_like_a_single_call(store: Store) -> None:
    """A closed store refuses a batch with RuntimeError, as it refuses complete()."""
    store.enqueue("t")
    (claim,) = claim_all(store, 1)
    store.close()
    with pytest.raises(RuntimeError, match="closed"):
        store.settle_many([Settlement(Settle.COMPLETE, claim)])


def test_a_large_batch_applies_every_item(store: Store) -> None:
    """Two hundred outcomes in one call, alternating kinds: each lands on its own job."""
    store.enqueue_many([{"task": "t", "payload": n} for n in range(200)])
    claims = claim_all(store, 200)
    batch = [
        dataclasses.replace(outcome(KINDS[n % 4], claim), result=claim.job.id)
        for n, claim in enumerate(claims)
    ]
    assert store.settle_many(batch) == [True] * 200
    counts = store.counts()
    assert (counts["done"], counts["failed"], counts["queued"]) == (50, 50, 100)
    assert [must_get(store, c.job.id).result for c in claims[0::4]] == [
        c.job.id for c in claims[0::4]
    ]


# --- one transaction: SQLite ---------------------------------------------------------------


class CommitFails:
    """The SQLite store's connection, but the COMMIT of a write to job ``doomed`` fails."""

    def __init__(self, conn: sqlite3.Connection, doomed: int) -> None:
        self._conn = conn
        self._doomed = doomed
        self._wrote = False
        self.failed = 0

    def execute(self, statement: str, params: Any = ()) -> sqlite3.Cursor:
        """Run ``statement``, or fail it if it is the COMMIT of the doomed job's write."""
        if statement.startswith("BEGIN"):
            self._wrote = False
        elif statement.startswith("UPDATE jobs") and self._doomed in params:
            self._wrote = True
        elif statement == "COMMIT" and self._wrote:
            self.failed += 1
            raise sqlite3.OperationalError("disk I/O error (injected at COMMIT)")
        return self._conn.execute(statement, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def test_sqlite_a_batch_whose_commit_fails_applies_none_of_its_items(tmp_path: Path) -> None:
    """COMMIT fails after every UPDATE of the batch ran: it raises and every job is as it was."""
    store = SQLiteStore(tmp_path / "jobs.db")
    try:
        store.enqueue_many([{"task": "t"}] * 3)
        claims = claim_all(store, 3)
        real = store._conn
        failing = CommitFails(real, doomed=claims[2].job.id)
        store._conn = failing  # type: ignore[assignment]
        with pytest.raises(sqlite3.OperationalError, match="injected at COMMIT"):
            store.settle_many([Settlement(Settle.COMPLETE, c) for c in claims])
        assert failing.failed == 1
        store._conn = real
        assert not real.in_transaction
        assert [must_get(store, c.job.id).state for c in claims] == [JobState.RUNNING] * 3
        assert store.settle_many([Settlement(Settle.COMPLETE, c) for c in claims]) == [True] * 3
    finally:
        store.close()


def test_sqlite_a_statement_failing_mid_batch_applies_none_of_its_items(tmp_path: Path) -> None:
    """The second item's UPDATE fails (a trigger aborts it): the first is rolled back too."""
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)
    try:
        store.enqueue_many([{"task": "t"}] * 3)
        claims = claim_all(store, 3)
        with sqlite3.connect(path) as other:
            other.execute(
                "CREATE TRIGGER refuse BEFORE UPDATE ON jobs"
                f" WHEN NEW.id = {claims[1].job.id} AND NEW.state = 'done'"
                " BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END"
            )
        other.close()
        with pytest.raises(sqlite3.IntegrityError, match="refused by a trigger"):
            store.settle_many([Settlement(Settle.COMPLETE, c) for c in claims])
        assert [must_get(store, c.job.id).state for c in claims] == [JobState.RUNNING] * 3
    finally:
        store.close()


def test_sqlite_a_batch_that_finds_the_file_damaged_raises_and_changes_nothing(
    tmp_path: Path,
) -> None:
    """Pages overwritten under the jobs: StoreFileError naming the file; no byte changes."""
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)
    store.enqueue_many([{"task": "t", "payload": {"n": n, "pad": "x" * 200}} for n in range(200)])
    claims = claim_all(store, 200)
    store.close()  # checkpointed: the whole store is in the file
    # The root page of the running jobs' index, which every outcome updates.
    with closing(sqlite3.connect(path)) as conn:
        sql = "SELECT rootpage FROM sqlite_master WHERE name = 'jobs_leased'"
        (root,) = conn.execute(sql).fetchone()
        (size,) = conn.execute("PRAGMA page_size").fetchone()
    data = path.read_bytes()
    start = (root - 1) * size
    damaged = data[:start] + b"\xde\xad\xbe\xef" * (size // 4) + data[start + size :]
    path.write_bytes(damaged)
    store = SQLiteStore(path)
    try:
        batch = [Settlement(Settle.COMPLETE, c) for c in claims]
        for _ in range(2):
            with pytest.raises(StoreFileError, match="the database file is damaged") as caught:
                store.settle_many(batch)
            assert str(path) in str(caught.value)
    finally:
        store.close()
    assert path.read_bytes() == damaged


def test_sqlite_a_batch_waits_for_another_connections_write_lock(tmp_path: Path) -> None:
    """While another connection holds the write lock the batch waits, then applies."""
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        store.enqueue_many([{"task": "t"}] * 2)
        batch = [Settlement(Settle.COMPLETE, c) for c in claim_all(store, 2)]
        other.execute("BEGIN IMMEDIATE")
        thread, result = run_in_thread(lambda: store.settle_many(batch), name="settler")
        assert stays_blocked(thread)  # no "database is locked" error: it waits
        other.execute("COMMIT")
        join_or_fail(thread)
        assert result == {"result": [True, True]}
    finally:
        other.close()
        store.close()


def test_sqlite_a_lock_held_past_every_retry_raises_and_applies_none_of_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the bounded busy retries the batch raises "locked"; every job is as it was."""
    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT", 0.02)  # read when the store connects
    monkeypatch.setattr(sqlite_transactions, "_BUSY_RETRIES", 2)
    monkeypatch.setattr(sqlite_transactions, "_BACKOFF", 0.01)
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        store.enqueue_many([{"task": "t"}] * 2)
        claims = claim_all(store, 2)
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            store.settle_many([Settlement(Settle.COMPLETE, c) for c in claims])
        other.execute("ROLLBACK")
        assert [must_get(store, c.job.id).state for c in claims] == [JobState.RUNNING] * 2
    finally:
        other.close()
        store.close()


# --- one transaction: PostgreSQL -----------------------------------------------------------


@pytest.fixture
def pg_store(pg_dsn: str, pg_schema: str) -> Iterator[PostgresStore]:
    """A PostgreSQL store on the database's own clock, closed afterwards."""
    made = PostgresStore(pg_dsn, schema=pg_schema)
    yield made
    made.close()


def backend_pid(store: PostgresStore) -> int:
    """The server process of the store's connection."""
    conn = store._db._conn
    assert conn is not None
    return int(conn.info.backend_pid)


def terminate(dsn: str, pid: int) -> None:
    """End the server session ``pid`` and wait (up to 10 s) until it is gone."""
    (row,) = admin_execute(dsn, "SELECT pg_terminate_backend(%s, 10000)", (pid,))
    assert row[0] is True


def job_ids(params: object) -> set[int]:
    """The job ids in a store statement's parameters: "id", or the list "ids" of a batch."""
    if not isinstance(params, dict):
        return set()
    return {params["id"]} if "id" in params else set(params.get("ids", ()))


def test_postgres_a_connection_broken_while_the_batch_statement_runs_is_commit_unknown(
    pg_dsn: str, pg_store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session dies as the batch's one statement (its own commit) is sent: CommitUnknown."""
    import psycopg  # noqa: PLC0415 - optional: only the PostgreSQL tests need it

    pg_store.enqueue_many([{"task": "t"}] * 3)
    claims = claim_all(pg_store, 3)
    real_execute = psycopg.Connection.execute
    pid = backend_pid(pg_store)
    doomed = claims[2].job.id
    sent: list[int] = []

    def execute_on_a_dead_session(
        conn: psycopg.Connection[Any], query: Any, params: Any = None, **kw: Any
    ) -> Any:
        if conn.info.backend_pid == pid and doomed in job_ids(params):
            sent.append(pid)
            terminate(pg_dsn, pid)  # gone before the statement reaches it
        return real_execute(conn, query, params, **kw)

    monkeypatch.setattr(psycopg.Connection, "execute", execute_on_a_dead_session)
    with pytest.raises(CommitUnknown, match="while its statement ran"):
        pg_store.settle_many([Settlement(Settle.COMPLETE, c, result=1) for c in claims])
    monkeypatch.undo()
    assert sent == [pid]  # no retry after a statement that may have applied
    assert [must_get(pg_store, c.job.id).state for c in claims] == [JobState.RUNNING] * 3
    assert pg_store.settle_many([Settlement(Settle.COMPLETE, c) for c in claims]) == [True] * 3


def test_postgres_a_connection_lost_before_the_batch_is_retried_and_applied_once(
    pg_dsn: str, pg_store: PostgresStore
) -> None:
    """The store's session was killed between calls: the batch reconnects and applies once."""
    pg_store.enqueue_many([{"task": "t"}] * 2)
    claims = claim_all(pg_store, 2)
    terminate(pg_dsn, backend_pid(pg_store))
    batch = [
        Settlement(Settle.RETRY, claims[0], error="later", run_at=START),
        outcome(Settle.COMPLETE, claims[1]),
    ]
    assert pg_store.settle_many(batch) == [True, True]
    first, second = (must_get(pg_store, c.job.id) for c in claims)
    assert (first.state, first.attempts, first.last_error) == (JobState.QUEUED, 1, "later")
    assert (second.state, second.result) == (JobState.DONE, {"r": [1, "x"]})


class Calls:
    """A subscriber that counts its calls; the test waits for a count."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = threading.Condition()

    def __call__(self) -> None:
        """One call from the store's listener."""
        with self._changed:
            self.count += 1
            self._changed.notify_all()

    def wait_for(self, count: int) -> None:
        """Wait until at least ``count`` calls were made (or fail after MUST_HAPPEN)."""
        with self._changed:
            assert self._changed.wait_for(lambda: self.count >= count, MUST_HAPPEN), self.count


def test_postgres_a_batch_notifies_subscribers_once_if_it_released_a_job(
    pg_dsn: str, pg_schema: str, pg_store: PostgresStore
) -> None:
    """A batch that gives jobs back wakes idle workers elsewhere once; one that does not, never."""
    listener = PostgresStore(pg_dsn, schema=pg_schema)
    try:
        calls = Calls()
        listener.subscribe(calls)
        calls.wait_for(1)  # listening now (a first call: "look now")
        pg_store.enqueue_many([{"task": "t"}] * 4)
        calls.wait_for(2)
        claims = claim_all(pg_store, 4)
        batch = [outcome(Settle.RELEASE, claims[0]), outcome(Settle.RELEASE, claims[1])]
        assert pg_store.settle_many(batch) == [True, True]
        calls.wait_for(3)
        batch = [outcome(Settle.COMPLETE, claims[2]), outcome(Settle.RETRY, claims[3])]
        assert pg_store.settle_many(batch) == [True, True]
        pg_store.enqueue("t")  # delivered after any notification of the batch above
        calls.wait_for(4)
        assert calls.count == 4
    finally:
        listener.close()


# --- a process killed inside the batch's transaction ---------------------------------------

CHILD = r"""
import sys

from patterns.jobqueue.stores.records import Settle, Settlement

where, phase = sys.argv[1], sys.argv[2]


def pause(marker):
    print(marker, flush=True)
    sys.stdin.read()  # the test keeps stdin open: this blocks until it kills us


if where.startswith("postgresql://"):
    import psycopg
    from patterns.jobqueue.stores.postgres.store import PostgresStore

    store = PostgresStore(where, schema=sys.argv[3])
else:
    from patterns.jobqueue.stores.sqlite.store import SQLiteStore, StoreFileError

    store = SQLiteStore(where, synchronous="FULL")
claims = store.claim("child", lease=3600, limit=4)
print(f"claimed {len(claims)}", flush=True)
# The hooks pause at the COMMIT of a transaction that wrote all four outcomes: one batch.
if phase == "inside" and not where.startswith("postgresql://"):
    updates = 0

    def trace(sql):  # called as each statement starts, before it runs
        global updates
        if sql.startswith("BEGIN"):
            updates = 0
        elif sql.startswith("UPDATE jobs"):
            updates += 1
        elif sql == "COMMIT" and updates == 4:
            pause("inside the transaction")

    store._conn.set_trace_callback(trace)
elif phase == "inside":
    # The batch is one statement in autocommit, its own transaction: the last moment the
    # client holds it is just before it is sent.
    real_execute = psycopg.Connection.execute

    def execute(conn, query, params=None, **kwargs):
        if isinstance(params, dict):  # the list "ids" for a batch
            written = set(params.get("ids", ()))
            if {c.job.id for c in claims} <= written:
                pause("inside the transaction")
        return real_execute(conn, query, params, **kwargs)

    psycopg.Connection.execute = execute
done = store.settle_many([Settlement(Settle.COMPLETE, c, result=c.job.id) for c in claims])
pause(f"committed {done}")
"""


def read_line(proc: subprocess.Popen[str]) -> str:
    """The child's next stdout line, within MUST_HAPPEN seconds (a hang fails the test)."""
    assert proc.stdout is not None
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()))  # type: ignore[union-attr]
    reader.start()
    reader.join(MUST_HAPPEN)
    assert not reader.is_alive(), "the child printed nothing"
    return got[0].strip()


@pytest.mark.parametrize("phase", ["inside", "after"])
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_process_killed_inside_a_batch_commit_applies_none_and_after_it_all(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str, phase: str
) -> None:
    """SIGKILL with the batch's transaction open: no item applied; right after COMMIT: all."""
    if kind == "sqlite":
        where, extra = str(tmp_path / "jobs.db"), []
        store: Store = SQLiteStore(where)
    else:
        where = request.getfixturevalue("pg_dsn")
        extra = [request.getfixturevalue("pg_schema")]
        store = PostgresStore(where, schema=extra[0])
    try:
        ids = store.enqueue_many([{"task": "t"}] * 4)
        script = tmp_path / "child.py"
        script.write_text(textwrap.dedent(CHILD))
        proc = subprocess.Popen(
            [sys.executable, str(script), where, phase, *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        try:
            assert read_line(proc) == "claimed 4"
            expected = (
                "inside the transaction"
                if phase == "inside"
                else "committed [True, True, True, True]"
            )
            assert read_line(proc) == expected
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(MUST_HAPPEN) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(MUST_HAPPEN)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        jobs = [must_get(store, job_id) for job_id in ids]
        if phase == "inside":
            assert {(j.state, j.result) for j in jobs} == {(JobState.RUNNING, None)}
            assert all(j.lease_owner and j.lease_owner.startswith("child:") for j in jobs)
        else:
            assert [(j.state, j.result) for j in jobs] == [(JobState.DONE, i) for i in ids]
    finally:
        store.close()


def test_settle_each_is_the_meaning_a_batch_must_match(store: Store) -> None:
    """settle_each (one call per item) gives the same answers as settle_many on twin batches."""
    store.enqueue_many([{"task": "t"}] * 8)
    claims = claim_all(store, 8)
    make: Callable[[list[Claim]], list[Any]] = lambda cs: [  # noqa: E731
        outcome(Settle.COMPLETE, cs[0]),
        Settlement(Settle.COMPLETE, cs[1], result=object()),
        outcome(Settle.FAIL, cs[2]),
        outcome(Settle.FAIL, cs[0]),
    ]
    batched = store.settle_many(make(claims[:4]))
    each = settle_each(store, make(claims[4:]))
    assert [type(x) for x in batched] == [type(x) for x in each]
    assert [x for x in batched if isinstance(x, bool)] == [x for x in each if isinstance(x, bool)]


# --- claim(limit=n): one transaction, a fixed number of statements ---------------------------


def test_sqlite_a_claim_of_many_jobs_is_one_transaction(tmp_path: Path) -> None:
    """claim(limit=16), expired leases to fail included: one BEGIN IMMEDIATE, one COMMIT."""
    clock = FakeClock()
    store = SQLiteStore(tmp_path / "jobs.db", clock=clock)
    try:
        store.enqueue_many([{"task": "t", "max_attempts": 1}] * 5)
        claim_all(store, 5)
        clock.now += LEASE + 1  # their leases expire, with no attempt left
        store.enqueue_many([{"task": "t"}] * 16)
        statements: list[str] = []
        store._conn.set_trace_callback(statements.append)
        assert len(store.claim("w", lease=LEASE, limit=16)) == 16
        store._conn.set_trace_callback(None)
        assert [s for s in statements if s.startswith(("BEGIN", "COMMIT"))] == [
            "BEGIN IMMEDIATE",
            "COMMIT",
        ]
        assert store.counts()["failed"] == 5
    finally:
        store.close()


def test_postgres_a_claim_of_many_jobs_takes_the_same_few_statements_however_many(
    pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """claim(limit=16) failing 10 spent leases: one statement, its own transaction."""
    import psycopg  # noqa: PLC0415 - optional: only the PostgreSQL tests need it

    clock = FakeClock()
    store = PostgresStore(pg_dsn, schema=pg_schema, clock=clock)
    try:
        store.enqueue_many([{"task": "t", "max_attempts": 1}] * 10)
        claim_all(store, 10)
        clock.now += LEASE + 1  # their leases expire, with no attempt left
        store.enqueue_many([{"task": "t"}] * 16)
        calls: list[str] = []
        real_execute, real_commit = psycopg.Connection.execute, psycopg.Connection.commit

        def execute(conn: psycopg.Connection[Any], query: Any, *args: Any, **kw: Any) -> Any:
            calls.append("execute")
            return real_execute(conn, query, *args, **kw)

        def commit(conn: psycopg.Connection[Any]) -> None:
            calls.append("commit")
            real_commit(conn)

        monkeypatch.setattr(psycopg.Connection, "execute", execute)
        monkeypatch.setattr(psycopg.Connection, "commit", commit)
        assert len(store.claim("w", lease=LEASE, limit=16)) == 16
        monkeypatch.undo()
        # expired-and-cancelled, spent, due and take in one statement, autocommit: no COMMIT
        assert calls == ["execute"]
        assert store.counts()["failed"] == 10
    finally:
        store.close()
