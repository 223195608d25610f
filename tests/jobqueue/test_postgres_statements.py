"""PostgresStore's round trips, its place in the package, its outbox and its clock.

The statements are counted at the connection layer, as ``log_statement = all`` would
log them: each ``execute`` is one statement, a ``BEGIN`` goes before the first
statement of a transaction, and each ``commit`` of an open transaction is a ``COMMIT``.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from patterns.jobqueue.stores.postgres.store import PostgresStore
from patterns.jobqueue.stores.protocol import Store
from patterns.jobqueue.stores.records import Settle, Settlement
from patterns.jobqueue.tasks import JobContext, Retry, TaskRegistry
from patterns.jobqueue.worker.worker import Worker
from tests.support import MUST_HAPPEN, wait_until

JOBS = 200  # enough that the worker's fixed calls (its row, LISTEN) weigh little
STATEMENTS_PER_JOB = 1.5  # the bound at the worker's defaults


class StatementCounter:
    """Counts what the store's connections send, as the server's statement log would."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import psycopg  # noqa: PLC0415 - optional: only the PostgreSQL tests need it

        self.count = 0
        self.log: list[str] = []
        # Guards count and log: the worker's threads share the connection under the
        # store's lock, but the listener's connection is its own.
        self._lock = threading.Lock()
        idle = psycopg.pq.TransactionStatus.IDLE
        real_execute, real_commit = psycopg.Connection.execute, psycopg.Connection.commit

        def execute(conn: psycopg.Connection[Any], query: Any, *args: Any, **kw: Any) -> Any:
            begins = not conn.autocommit and conn.info.transaction_status == idle
            with self._lock:
                self.count += 2 if begins else 1
                self.log += ["BEGIN"] * begins + [str(query)[:60]]
            return real_execute(conn, query, *args, **kw)

        def commit(conn: psycopg.Connection[Any]) -> None:
            if conn.info.transaction_status != idle:
                with self._lock:
                    self.count += 1
                    self.log.append("COMMIT")
            real_commit(conn)

        monkeypatch.setattr(psycopg.Connection, "execute", execute)
        monkeypatch.setattr(psycopg.Connection, "commit", commit)

    def take(self) -> int:
        """The count so far, reset to zero."""
        with self._lock:
            count, self.count = self.count, 0
            self.log.clear()
            return count


@pytest.fixture
def store(pg_dsn: str, pg_schema: str) -> Iterator[PostgresStore]:
    """A store on a new schema (the database's clock), closed afterwards."""
    made = PostgresStore(pg_dsn, schema=pg_schema)
    yield made
    made.close()


def test_an_enqueue_is_one_statement_and_enqueue_many_one_for_the_whole_batch(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No BEGIN, no COMMIT, no separate NOTIFY: one statement per call, however many jobs."""
    counter = StatementCounter(monkeypatch)
    store.enqueue("t", {"n": 1})
    assert counter.take() == 1
    store.enqueue_many([{"task": "t", "payload": n} for n in range(50)])
    assert counter.take() == 1
    assert store.counts()["queued"] == 51


@pytest.mark.parametrize("prefetch", [None, 0], ids=["default", "prefetch=0"])
def test_a_worker_at_its_defaults_sends_at_most_one_and_a_half_statements_per_drained_job(
    pg_dsn: str, store: PostgresStore, monkeypatch: pytest.MonkeyPatch, prefetch: int | None
) -> None:
    """Claims and outcomes share statements: the count per job stays under the bound.

    At the defaults (4 threads, prefetch 16) and without prefetch, claiming only for the
    free threads.
    """
    store.enqueue_many([{"task": "noop"}] * JOBS)
    done = threading.Event()
    finished: list[int] = []
    lock = threading.Lock()

    def on_complete(job: Any, result: Any) -> None:
        with lock:
            finished.append(job.id)
            if len(finished) == JOBS:
                done.set()

    tasks = TaskRegistry(on_complete=on_complete)
    tasks.task(name="noop")(lambda payload, ctx: None)
    counter = StatementCounter(monkeypatch)
    chosen = {} if prefetch is None else {"prefetch": prefetch}
    worker = Worker(store, tasks, **chosen)  # the defaults: 4 threads, prefetch 16
    with worker:
        assert done.wait(MUST_HAPPEN * 6), f"{len(finished)} of {JOBS} done"
    sent = counter.take()
    monkeypatch.undo()
    assert store.counts()["done"] == JOBS
    per_job = sent / JOBS
    assert per_job <= STATEMENTS_PER_JOB, f"{sent} statements for {JOBS} jobs: {per_job:.2f}"


# psycopg converts a statement's %(name)s placeholders once and keeps the result only for
# a text of at most 4,096 bytes with at most 50 parameters (psycopg/_queries.py,
# MAX_CACHED_STATEMENT_LENGTH and _PARAMS); a longer one is parsed again at every call.
PSYCOPG_CACHED_BYTES, PSYCOPG_CACHED_PARAMS = 4096, 50


def test_every_batch_size_sends_one_statement_text_that_psycopg_converts_once(
    pg_dsn: str, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outcomes travel as arrays: batches of 1 and 40 send the same short text.

    Its white space is collapsed (no literal in it holds any), so it stays under the size
    psycopg caches its conversion for; the parameters are few, whatever the batch.
    """
    import psycopg  # noqa: PLC0415 - optional: only the PostgreSQL tests need it
    from psycopg import sql  # noqa: PLC0415

    from patterns.jobqueue.stores.postgres.schema import (  # noqa: PLC0415
        STATEMENTS,
        settle_claim_text,
    )

    for name in ("settled", "expire", "due", "take"):  # the parts of the collapsed text
        literals = re.findall(r"'[^']*'", STATEMENTS[name])
        assert [lit for lit in literals if lit != "".join(lit.split())] == [], name
    assert "  " not in settle_claim_text(True, claim=True)
    sent: list[tuple[bytes, int]] = []
    real_execute = psycopg.Connection.execute

    def execute(conn: psycopg.Connection[Any], query: Any, params: Any = None, **kw: Any) -> Any:
        if isinstance(query, sql.Composable) and isinstance(params, dict) and params.get("ids"):
            sent.append((query.as_bytes(conn), len(params)))
        return real_execute(conn, query, params, **kw)

    monkeypatch.setattr(psycopg.Connection, "execute", execute)
    for size in (1, 40):
        store.enqueue_many([{"task": "t"}] * size)
        claims = store.claim("w", lease=30.0, limit=size)
        store.settle_and_claim(
            [Settlement(Settle.COMPLETE, c) for c in claims], "w", lease=30.0, limit=1
        )
    monkeypatch.undo()
    assert len(sent) == 2
    (small, small_params), (large, large_params) = sent
    assert small == large
    assert len(small) <= PSYCOPG_CACHED_BYTES
    assert small_params == large_params <= PSYCOPG_CACHED_PARAMS
    assert store.counts()["done"] == 41


def test_enqueue_in_joins_the_callers_transaction_and_a_rollback_leaves_no_job_and_no_wake_up(
    pg_dsn: str, store: PostgresStore
) -> None:
    """The outbox: the job and its NOTIFY commit with the caller's writes, or neither does."""
    import psycopg  # noqa: PLC0415 - optional: only the PostgreSQL tests need it

    assert store.wait_for_notify(MUST_HAPPEN)  # the first return: listening now
    with psycopg.connect(pg_dsn) as conn:
        job_id = store.enqueue_in(conn, "t", {"order": 1})
        assert store.get(job_id) is None  # not committed yet: invisible to the store
        conn.rollback()
        assert store.get(job_id) is None
        assert not store.wait_for_notify(0.5)  # a rolled-back NOTIFY is never delivered
        kept = store.enqueue_in(conn, "t", {"order": 2}, delay=0.0)
        conn.commit()
    job = store.get(kept)
    assert job is not None
    assert job.payload == {"order": 2}
    assert store.wait_for_notify(MUST_HAPPEN)
    assert store.counts()["queued"] == 1


@pytest.mark.parametrize("factory", ["dict_row", "namedtuple_row", "class_row"])
@pytest.mark.parametrize("autocommit", [False, True], ids=["transaction", "autocommit"])
def test_enqueue_in_works_whatever_the_callers_row_factory_and_writes_once(
    pg_dsn: str, store: PostgresStore, factory: str, autocommit: bool
) -> None:
    """The connection's row factory is the caller's: enqueue_in returns the id, one job written.

    Before: with ``dict_row`` it raised ``KeyError: 0`` after its INSERT ran, so a caller
    that committed (or ran in autocommit) had the job although the call raised.
    """
    import psycopg  # noqa: PLC0415 - optional: only the PostgreSQL tests need it
    from psycopg import rows  # noqa: PLC0415

    @dataclasses.dataclass
    class Ids:
        ids: list[int]

    factories: dict[str, Any] = {
        "dict_row": rows.dict_row,
        "namedtuple_row": rows.namedtuple_row,
        "class_row": rows.class_row(Ids),
    }
    with psycopg.connect(pg_dsn, autocommit=autocommit, row_factory=factories[factory]) as conn:
        job_id = store.enqueue_in(conn, "t", {"order": 1})
        assert isinstance(job_id, int)
        row = conn.execute("SELECT ARRAY[1] AS ids").fetchone()  # its own factory still
        assert row is not None
        assert not isinstance(row, tuple) or factory == "namedtuple_row"
        if not autocommit:
            conn.commit()
    job = store.get(job_id)
    assert job is not None
    assert job.payload == {"order": 1}
    assert store.counts()["queued"] == 1  # written once


RETRY_DELAY = 1_000.0  # seconds a failed job is requeued for (never due again in a test)


def _retry_clock(store: Store, clock: Callable[[], float] | None = None) -> float:
    """The clock reading a worker counted a retry's run time from (``run_at - delay``).

    One job whose handler raises, requeued with ``Retry(RETRY_DELAY)`` by a worker made
    with ``clock`` (None: the default).
    """
    tasks = TaskRegistry()

    @tasks.task(name="flaky", retry=lambda job, error: Retry(RETRY_DELAY))
    def flaky(payload: object, ctx: JobContext) -> None:
        raise RuntimeError("injected")

    job_id = store.enqueue("flaky")
    with Worker(store, tasks, clock=clock, poll_interval=0.01) as worker:
        wait_until(lambda: worker.stats().retried == 1, "the job is retried")
    job = store.get(job_id)
    assert job is not None
    return job.run_at - RETRY_DELAY


def test_a_worker_on_a_postgres_store_takes_the_database_clock_by_default(
    store: PostgresStore,
) -> None:
    """Worker(store, tasks) with no clock: a retry's run time is on the store's clock."""
    before = store.clock()
    counted_from = _retry_clock(store)
    tick = 1e-3  # run_at is kept to the microsecond
    assert before - tick <= counted_from <= store.clock() + tick
    assert _retry_clock(store, clock=lambda: 0.0) == pytest.approx(0.0, abs=tick)


def test_the_worker_default_clock_is_the_store_clock_for_every_store() -> None:
    """A store's own clock is the worker's default: a test clock given to the store applies."""
    from patterns.jobqueue.stores.memory import MemoryStore  # noqa: PLC0415

    assert _retry_clock(MemoryStore(clock=lambda: 42.0)) == 42.0


def test_jobs_claimed_by_an_outcomes_statement_while_a_stop_begins_are_released_unchanged(
    store: PostgresStore,
) -> None:
    """The stop begins between the refill's decision and its statement: its claims go back.

    The only job in hand ends, so its handler thread commits its outcome and claims the next
    job in one statement; the stop is requested just before that statement is sent. What
    it claimed is released at once, attempt given back, and never started.
    """
    from patterns.jobqueue.worker.states import Step  # noqa: PLC0415

    ids = store.enqueue_many([{"task": "noop"}] * 3)
    started: list[int] = []
    tasks = TaskRegistry()
    tasks.task(name="noop")(lambda payload, ctx: started.append(ctx.job_id))
    stopped = threading.Event()
    holder: list[Worker] = []

    def step_hook(step: Step, claim: Any, phase: Any) -> None:
        if step is Step.BEFORE_COMMIT and not stopped.is_set():
            stopped.set()
            holder[0].request_stop("stop during the combined statement")

    # No prefetch: the one job in hand is the only one claimed before its outcome's statement.
    worker = Worker(store, tasks, concurrency=1, prefetch=0, step_hook=step_hook)
    holder.append(worker)
    with worker:
        assert stopped.wait(MUST_HAPPEN)
        assert worker.wait_stop_requested(MUST_HAPPEN)
    report = worker.stop()
    assert report.terminated
    assert started == [ids[0]]  # the refill's claim never ran
    first, *rest = (store.get(i) for i in ids)
    assert first is not None
    assert first.state == "done"
    second, third = rest
    assert second is not None
    assert third is not None
    assert [(j.state, j.attempts) for j in rest] == [("queued", 0)] * 2
    assert second.updated_at > second.created_at  # claimed by that statement, then released
    assert third.updated_at == third.created_at  # never claimed
