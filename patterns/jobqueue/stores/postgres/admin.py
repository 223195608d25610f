"""The operator's side of `~.PostgresStore`: jobs and workers read.

A worker's path through the store is short: enqueue, claim, settle, renew. The rest of the
`~patterns.jobqueue.stores.protocol.Store` protocol is what an operator (the ``jobqueue`` command, a
dashboard, a test) asks of the queue: a job or a list of them, the counts by state,
requeueing failed jobs, cancelling, purging finished ones, and the table of live workers
that each worker's heartbeat keeps. `PostgresAdmin` holds those methods, each one short
transaction on the store's connection, so that ``store.py`` reads as the worker's path;
`~.PostgresStore` subclasses it, and is the class to use.

Docs: docs/jobqueue/many_machines.md
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, TypeVar

from patterns.jobqueue.stores.base import StoreBase
from patterns.jobqueue.stores.checks import (
    check_job_id,
    check_limit,
    check_state,
    check_states,
    check_text,
    check_time,
)
from patterns.jobqueue.stores.postgres.schema import check_timestamp
from patterns.jobqueue.stores.records import (
    FINISHED_STATES,
    CancelResult,
    Job,
    JobState,
    WorkerRecord,
    WorkerRow,
    job_from_row,
)

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

    from patterns.jobqueue.stores.postgres.connection import Database, Mode

__all__ = ["PostgresAdmin"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class PostgresAdmin(StoreBase):
    """The operator's methods of `~.PostgresStore`, and its worker rows.

    Not a store of its own: `~.PostgresStore` subclasses it
    and sets up what these methods use: the connection (``_db``), its composed statements,
    the text naming the database in log lines and the ``NOTIFY`` channel.
    """

    _db: Database
    _statements: dict[str, sql.Composed]
    _where: str
    _channel: str

    def _transaction(
        self,
        body: Callable[[psycopg.Connection[tuple[Any, ...]], float | None], T],
        mode: Mode = "transaction",
    ) -> T:
        """``body(conn, clock)`` in one transaction: `Database.transaction`."""
        return self._db.transaction(body, mode)

    def _notify(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        # Delivered to every listener when (and only if) the transaction commits.
        conn.execute(self._statements["notify"], {"channel": self._channel})

    # --- jobs ------------------------------------------------------------------------------

    def get(self, job_id: int) -> Job | None:
        if not check_job_id(job_id):  # outside bigint: never issued
            return None

        def body(conn: psycopg.Connection[tuple[Any, ...]], clock: float | None) -> Job | None:
            row = conn.execute(self._statements["get"], {"id": job_id}).fetchone()
            return None if row is None else job_from_row(row)

        return self._transaction(body, "read")

    def list_jobs(
        self, *, state: JobState | str | None = None, task: str | None = None, limit: int = 50
    ) -> list[Job]:
        params = {
            "state": None if state is None else check_state(state).value,
            "task": None if task is None else check_text("task", task),
            "limit": check_limit(limit),
        }
        rows = self._transaction(
            lambda conn, clock: conn.execute(self._statements["list"], params).fetchall(), "read"
        )
        return [job_from_row(row) for row in rows]

    def _requeue(self, job_id: int | None, task: str | None) -> list[int]:
        def body(conn: psycopg.Connection[tuple[Any, ...]], clock: float | None) -> list[int]:
            rows = conn.execute(
                self._statements["requeue"], {"clock": clock, "id": job_id, "task": task}
            ).fetchall()
            if rows:
                self._notify(conn)  # due now: an idle worker may take them
            return sorted(int(row[0]) for row in rows)

        return self._transaction(body)

    def requeue(self, job_id: int) -> bool:
        if not check_job_id(job_id):
            return False
        done = bool(self._requeue(job_id, None))
        if done:
            logger.info("%s: job %d requeued", self._where, job_id)
        return done

    def requeue_failed(self, *, task: str | None = None) -> list[int]:
        ids = self._requeue(None, None if task is None else check_text("task", task))
        if ids:
            logger.info("%s: requeued %d failed jobs", self._where, len(ids))
        return ids

    def cancel(self, job_id: int) -> CancelResult:
        if not check_job_id(job_id):
            return CancelResult.NOT_FOUND

        def body(conn: psycopg.Connection[tuple[Any, ...]], clock: float | None) -> CancelResult:
            statements = self._statements
            params = {"clock": clock, "id": job_id}
            row = conn.execute(statements["cancel_state"], params).fetchone()
            if row is None:
                return CancelResult.NOT_FOUND
            if row[0] == JobState.QUEUED:
                conn.execute(statements["cancel_queued"], params)
                return CancelResult.CANCELLED
            if row[0] == JobState.RUNNING:
                conn.execute(statements["cancel_running"], params)
                return CancelResult.REQUESTED
            return CancelResult.FINISHED

        result = self._transaction(body)
        logger.info("%s: job %d: cancel %s", self._where, job_id, result.value)
        return result

    def counts(self) -> dict[str, int]:
        rows = self._transaction(
            lambda conn, clock: conn.execute(self._statements["counts"]).fetchall(), "read"
        )
        result = {state.value: 0 for state in JobState}
        result.update({state: int(n) for state, n in rows})
        return result

    def purge(
        self, *, older_than: float | None = None, states: Collection[str] = FINISHED_STATES
    ) -> int:
        cutoff = (
            None
            if older_than is None
            else check_timestamp("older_than", check_time("older_than", older_than))
        )
        chosen = sorted(state.value for state in check_states(states))
        params = {"cutoff": cutoff, "states": chosen}
        purged = self._transaction(
            lambda conn, clock: conn.execute(self._statements["purge"], params).rowcount
        )
        if purged:
            logger.info("%s: purged %d finished jobs", self._where, purged)
        return purged

    # --- worker rows -------------------------------------------------------------------------

    def _record_worker(self, row: WorkerRow) -> None:
        params = {
            "id": row.worker_id,
            "host": row.host,
            "pid": row.pid,
            "state": row.state,
            "started_at": row.started_at,
            "jobs_held": row.jobs_held,
            "ttl": row.ttl,
        }

        def body(conn: psycopg.Connection[tuple[Any, ...]], clock: float | None) -> None:
            self._expire_workers(conn, clock)
            conn.execute(self._statements["record_worker"], {**params, "clock": clock})

        self._transaction(body)

    def forget_worker(self, worker_id: str) -> None:
        name = check_text("worker_id", worker_id)
        self._transaction(
            lambda conn, clock: conn.execute(self._statements["forget_worker"], {"id": name})
        )

    def workers(self) -> list[WorkerRecord]:
        def body(
            conn: psycopg.Connection[tuple[Any, ...]], clock: float | None
        ) -> list[WorkerRecord]:
            self._expire_workers(conn, clock)
            return [WorkerRecord(*row) for row in conn.execute(self._statements["workers"])]

        return self._transaction(body)

    def _expire_workers(
        self, conn: psycopg.Connection[tuple[Any, ...]], clock: float | None
    ) -> None:
        gone = conn.execute(self._statements["expire_workers"], {"clock": clock}).rowcount
        if gone:
            logger.info("%s: %d worker rows expired (workers that died?)", self._where, gone)
