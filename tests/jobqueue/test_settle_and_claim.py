"""`Store.settle_and_claim`: outcomes and the next claims in one transaction.

Every store (memory, a SQLite file, PostgreSQL) on a fake clock: the shared transaction
answers, and leaves every job, exactly as ``settle_many`` then ``claim`` leave twin jobs
in a twin store; it is one transaction (one COMMIT; a failure in its claim part undoes
its outcomes too); ``limit=0`` settles only; bad arguments write nothing.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from patterns.jobqueue.stores.base import settle_only
from patterns.jobqueue.stores.memory import MemoryStore
from patterns.jobqueue.stores.postgres.store import PostgresStore
from patterns.jobqueue.stores.protocol import Store
from patterns.jobqueue.stores.records import Claim, Job, Settle, Settlement
from patterns.jobqueue.stores.sqlite.store import SQLiteStore
from tests.jobqueue.conftest import admin_execute
from tests.support import FakeClock

START = 1_000_000.0
LEASE = 30.0


class ClaimBreaks(Exception):
    """Raised by a store's claim after it ran, to show the outcomes roll back with it."""


def _breaking(kind: type[Any]) -> type[Any]:
    """A subclass of a store class whose claim raises (after running) once ``broken``."""

    class Breaking(kind):  # type: ignore[misc,valid-type]
        broken = False

        def claim(self, owner: str, *, lease: float, limit: int = 1) -> list[Claim]:
            claims: list[Claim] = super().claim(owner, lease=lease, limit=limit)
            if self.broken:
                raise ClaimBreaks("the claim part of the shared transaction failed")
            return claims

    return Breaking


class _BreakingPostgres(PostgresStore):
    """A PostgreSQL store whose claim fails in the database once ``broken``.

    Its claim is a part of the same statement as the outcomes, so the failure is made
    there: a trigger refuses a claim by ``w2``, after the outcomes' part has run.
    """

    _broken = False

    @property
    def broken(self) -> bool:
        return self._broken

    @broken.setter
    def broken(self, value: bool) -> None:
        self._broken = value
        dsn = self._dsn_for_tests
        jobs = f'"{self.schema}".jobs'
        if value:
            admin_execute(
                dsn,
                f'CREATE FUNCTION "{self.schema}".refuse() RETURNS trigger LANGUAGE plpgsql'
                " AS $$ BEGIN RAISE EXCEPTION 'claim breaks'; END $$",
            )
            admin_execute(
                dsn,
                f"CREATE TRIGGER refuse BEFORE UPDATE ON {jobs} FOR EACH ROW"
                " WHEN (starts_with(NEW.lease_owner, 'w2:')) EXECUTE FUNCTION"
                f' "{self.schema}".refuse()',
            )
        else:
            admin_execute(dsn, f"DROP TRIGGER refuse ON {jobs}")

    def settle_and_claim(self, *args: Any, **kwargs: Any) -> Any:
        import psycopg  # noqa: PLC0415 - optional: only the PostgreSQL tests need it

        try:
            return super().settle_and_claim(*args, **kwargs)
        except psycopg.errors.RaiseException as exc:
            raise ClaimBreaks("the claim part of the shared statement failed") from exc


Maker = Callable[[], Any]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[FakeClock], Any]]:
    """Make stores of one kind (each its own file or schema; breakable claim), closed after."""
    made: list[Any] = []
    schemas: list[str] = []

    def new(clock: FakeClock) -> Any:
        if request.param == "memory":
            store = _breaking(MemoryStore)(clock=clock, max_payload_bytes=1000)
        elif request.param == "sqlite":
            path = tmp_path / f"jobs{len(made)}.db"
            store = _breaking(SQLiteStore)(path, clock=clock, max_payload_bytes=1000)
        else:
            dsn = request.getfixturevalue("pg_dsn")
            schemas.append(f"t_{uuid.uuid4().hex[:16]}")
            store = _BreakingPostgres(dsn, schema=schemas[-1], clock=clock, max_payload_bytes=1000)
            store._dsn_for_tests = dsn
        made.append(store)
        return store

    yield new
    for store in made:
        store.close()
    for schema in schemas:
        admin_execute(
            request.getfixturevalue("pg_dsn"), f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'
        )


def blank(job: Job) -> Job:
    """A job with its fencing token blanked (tokens are random), to compare two stores."""
    return dataclasses.replace(job, lease_owner=None if job.lease_owner is None else "x")


def answers(done: list[bool | Exception]) -> list[object]:
    """Answers comparable across stores: an exception by its type."""
    return [type(a) if isinstance(a, Exception) else a for a in done]


def scene(store: Store, clock: FakeClock) -> list[Settlement]:
    """Eight jobs, four claimed (one then cancelled, one stale); the batch that settles them."""
    store.enqueue_many([{"task": "t", "payload": {"n": n}} for n in range(8)])
    clock.now += 5
    done, retried, cancelled, stale = store.claim("w", lease=LEASE, limit=4)
    store.cancel(cancelled.job.id)
    clock.now += 5
    gone = dataclasses.replace(stale, token="w:not-the-token")
    return [
        Settlement(Settle.COMPLETE, done, result={"ok": 1}),
        Settlement(Settle.RETRY, retried, error="again", run_at=START),  # due again at once
        Settlement(Settle.RELEASE, cancelled),  # cancel requested: ends cancelled
        Settlement(Settle.COMPLETE, gone),  # refused by fencing
        Settlement(Settle.COMPLETE, stale, result=object()),  # not JSON: its own exception
        Settlement(Settle.FAIL, done, error="twice"),  # the same claim again: False
    ]


def every_job(store: Store) -> list[Job]:
    """Every job, oldest first, tokens blanked."""
    return [blank(job) for job in reversed(store.list_jobs(limit=100))]


@pytest.mark.parametrize("limit", [0, 1, 3, 10])
def test_the_shared_transaction_answers_and_leaves_jobs_as_settle_then_claim(
    make: Callable[[FakeClock], Any], limit: int
) -> None:
    """Twin stores, twin jobs: settle_and_claim equals settle_many then claim, field by field."""
    clock, twin_clock = FakeClock(), FakeClock()
    shared, twin = make(clock), make(twin_clock)
    items, twin_items = scene(shared, clock), scene(twin, twin_clock)
    done, claims = shared.settle_and_claim(items, "w2", lease=LEASE, limit=limit)
    twin_done = twin.settle_many(twin_items)
    twin_claims = twin.claim("w2", lease=LEASE, limit=limit) if limit else []
    assert answers(done) == answers(twin_done) == [True, True, True, False, TypeError, False]
    assert [blank(c.job) for c in claims] == [blank(c.job) for c in twin_claims]
    assert [c.lease_until for c in claims] == [c.lease_until for c in twin_claims]
    assert len(claims) == min(limit, 5)  # four never claimed, and the retried one
    assert every_job(shared) == every_job(twin)
    for claim in claims:  # real claims: each holds its lease
        assert shared.complete(claim, None) is True


@pytest.mark.parametrize("make", ["sqlite", "postgres"], indirect=True)
def test_a_failure_in_the_claim_part_undoes_the_outcomes_too(
    make: Callable[[FakeClock], Any],
) -> None:
    """One transaction: the claim raising after it ran leaves every job as before.

    SQL stores only: the memory store has no rollback, and nothing in its claim can fail
    once the arguments passed (checked before the outcomes) and the store is open.
    """
    clock = FakeClock()
    store = make(clock)
    items = scene(store, clock)
    before = every_job(store)
    store.broken = True
    with pytest.raises(ClaimBreaks):
        store.settle_and_claim(items, "w2", lease=LEASE, limit=2)
    assert every_job(store) == before
    store.broken = False
    done, claims = store.settle_and_claim(items, "w2", lease=LEASE, limit=2)
    assert answers(done)[:3] == [True, True, True]
    assert len(claims) == 2


def test_limit_zero_settles_only_and_nothing_at_all_is_a_no_op(
    make: Callable[[FakeClock], Any],
) -> None:
    """limit=0 claims nothing; no items and limit=0 touch nothing, even on a closed store."""
    clock = FakeClock()
    store = make(clock)
    store.enqueue_many([{"task": "t"}] * 3)
    (claim,) = store.claim("w", lease=LEASE)
    done, claims = store.settle_and_claim(
        [Settlement(Settle.COMPLETE, claim)], "w", lease=LEASE, limit=0
    )
    assert (done, claims) == ([True], [])
    assert store.counts()["queued"] == 2
    done, claims = store.settle_and_claim([], "w", lease=LEASE, limit=2)
    assert done == []
    assert len(claims) == 2
    store.close()
    assert store.settle_and_claim([], "w", lease=LEASE, limit=0) == ([], [])
    with pytest.raises(RuntimeError, match="closed"):
        store.settle_and_claim([], "w", lease=LEASE, limit=1)


@pytest.mark.parametrize(
    ("owner", "lease", "limit", "error"),
    [
        ("", LEASE, 1, ValueError),
        ("w", 0.0, 1, ValueError),
        ("w", LEASE, -1, ValueError),
        ("w", LEASE, True, TypeError),
        ("w", LEASE, 1.0, TypeError),
    ],
)
def test_bad_claim_arguments_raise_before_any_outcome_is_written(
    make: Callable[[FakeClock], Any], owner: str, lease: float, limit: Any, error: type
) -> None:
    """The claim's arguments are checked first: the outcomes are not applied either."""
    clock = FakeClock()
    store = make(clock)
    store.enqueue(task="t")
    (claim,) = store.claim("w", lease=LEASE)
    with pytest.raises(error):
        store.settle_and_claim(
            [Settlement(Settle.COMPLETE, claim)], owner, lease=lease, limit=limit
        )
    assert store.counts()["running"] == 1


def test_sqlite_the_shared_transaction_is_one_begin_and_one_commit(tmp_path: Path) -> None:
    """Outcomes of four jobs and a claim of four: BEGIN IMMEDIATE, COMMIT, nothing else."""
    clock = FakeClock()
    store = SQLiteStore(tmp_path / "jobs.db", clock=clock)
    try:
        store.enqueue_many([{"task": "t"}] * 8)
        claims = store.claim("w", lease=LEASE, limit=4)
        statements: list[str] = []
        store._conn.set_trace_callback(statements.append)
        items = [Settlement(Settle.COMPLETE, claim) for claim in claims]
        done, again = store.settle_and_claim(items, "w", lease=LEASE, limit=4)
        store._conn.set_trace_callback(None)
        assert done == [True] * 4
        assert len(again) == 4
        assert [s for s in statements if s.startswith(("BEGIN", "COMMIT", "ROLLBACK"))] == [
            "BEGIN IMMEDIATE",
            "COMMIT",
        ]
    finally:
        store.close()


def test_postgres_the_shared_transaction_is_one_statement(
    pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outcomes of four jobs and a claim of four: one statement, no BEGIN or COMMIT."""
    import psycopg  # noqa: PLC0415 - optional: only the PostgreSQL tests need it

    store = PostgresStore(pg_dsn, schema=pg_schema, clock=FakeClock())
    try:
        store.enqueue_many([{"task": "t"}] * 8)
        claims = store.claim("w", lease=LEASE, limit=4)
        calls: list[str] = []
        real_execute, real_commit = psycopg.Connection.execute, psycopg.Connection.commit

        def execute(conn: psycopg.Connection[Any], *args: Any, **kw: Any) -> Any:
            calls.append("execute")
            return real_execute(conn, *args, **kw)

        def commit(conn: psycopg.Connection[Any]) -> None:
            calls.append("commit")
            real_commit(conn)

        monkeypatch.setattr(psycopg.Connection, "execute", execute)
        monkeypatch.setattr(psycopg.Connection, "commit", commit)
        items = [Settlement(Settle.COMPLETE, claim) for claim in claims]
        done, again = store.settle_and_claim(items, "w", lease=LEASE, limit=4)
        monkeypatch.undo()
        assert done == [True] * 4
        assert len(again) == 4
        assert calls == ["execute"]  # one statement in autocommit: its own COMMIT
    finally:
        store.close()


def test_settle_only_settles_as_settle_many_claims_nothing_and_checks_the_claim_arguments() -> None:
    """The default of a store that cannot share the transaction: its claimer claims later."""
    store = MemoryStore(clock=FakeClock())
    store.enqueue_many([{"task": "t"}] * 3)
    (claim,) = store.claim("w", lease=LEASE)
    item = Settlement(Settle.COMPLETE, claim)
    with pytest.raises(ValueError, match="lease"):
        settle_only(store, [item], "w", lease=0.0, limit=1)
    assert store.counts()["running"] == 1  # checked before anything was written
    assert settle_only(store, [item, item], "w", lease=LEASE, limit=2) == ([True, False], [])
    assert store.counts() == {"queued": 2, "running": 0, "done": 1, "failed": 0, "cancelled": 0}
