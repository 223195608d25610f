"""The operator's side of `~.SQLiteStore`: jobs looked up and acted on, and worker rows.

A worker's path through the store is short: enqueue, claim, settle, renew. The rest of the
`~patterns.jobqueue.stores.protocol.Store` protocol is mostly what an operator (the
``jobqueue`` command, a dashboard, a test) asks of the queue: a job or a list of them, the
counts by state, requeueing failed jobs, cancelling, purging finished ones, and the table
of live workers that each worker's heartbeat keeps. `SQLiteAdmin` holds those methods, each
one short transaction through the store's ``_read`` and ``_write``
(`~.SQLiteTransactions`), so that ``store.py`` reads as the worker's path; `~.SQLiteStore`
subclasses it, and is the class to use. `~.PostgresAdmin` is the same part of the
PostgreSQL store.

Docs: docs/jobqueue/index.md
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Collection, Sequence
from typing import Any

from patterns.jobqueue.stores.base import StoreBase
from patterns.jobqueue.stores.checks import (
    check_job_id,
    check_limit,
    check_state,
    check_states,
    check_text,
    check_time,
)
from patterns.jobqueue.stores.records import (
    FINISHED_STATES,
    CancelResult,
    Job,
    JobState,
    WorkerRecord,
    WorkerRow,
    job_from_row,
)
from patterns.jobqueue.stores.sqlite.schema import (
    COLUMNS,
    PURGE_FLOOR_SQL,
    REQUEUE_SQL,
    WORKER_COLUMNS,
    StoreFileError,
)
from patterns.jobqueue.stores.sqlite.transactions import SQLiteTransactions

__all__ = ["SQLiteAdmin"]

logger = logging.getLogger(__name__)


class SQLiteAdmin(StoreBase, SQLiteTransactions):
    """The operator's methods of `~.SQLiteStore`, its worker rows, and reading a job row.

    Not a store of its own: `~.SQLiteStore` subclasses it and sets up what these methods
    use (the attributes `~.SQLiteTransactions` lists: the connection, its lock, the path).
    """

    # --- rows: every method below runs in _write or _read, the transactions it inherits ---
    # --- from SQLiteTransactions (patterns/jobqueue/stores/sqlite/transactions.py)

    def _job(self, row: Sequence[Any]) -> Job:
        try:
            return job_from_row(row)
        except ValueError as exc:
            raise StoreFileError(f"{self._path}: {exc}") from exc

    def _select(self, conn: sqlite3.Connection, job_id: int) -> Job | None:
        row = conn.execute(f"SELECT {COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else self._job(row)

    # --- jobs -----------------------------------------------------------------------------

    def get(self, job_id: int) -> Job | None:
        if not check_job_id(job_id):
            return None
        return self._read(lambda conn: self._select(conn, job_id))

    def list_jobs(
        self, *, state: JobState | str | None = None, task: str | None = None, limit: int = 50
    ) -> list[Job]:
        where, params, order = ["1 = 1"], [], "id"
        if state is not None:
            chosen = check_state(state)
            where.append("state = ?")
            params.append(chosen.value)
            if chosen is JobState.RUNNING:
                # Running jobs are few (the claims the workers hold), so they are
                # read through their partial index (jobs_leased) and sorted, rather than
                # looked for in a scan of the whole table in id order: SQLite uses that
                # index only with its condition written out, and "+id" stops it from
                # preferring the scan for its order. Not done for the other states: a
                # backlog of queued jobs can be most of the table, and the scan in id
                # order stops after `limit` of them.
                where.append("state = 'running'")
                order = "+id"
        if task is not None:
            where.append("task = ?")
            params.append(check_text("task", task))
        sql = (
            f"SELECT {COLUMNS} FROM jobs WHERE {' AND '.join(where)} ORDER BY {order} DESC LIMIT ?"
        )
        count = check_limit(limit)
        rows = self._read(lambda conn: conn.execute(sql, (*params, count)).fetchall())
        return [self._job(row) for row in rows]

    def requeue(self, job_id: int) -> bool:
        if not check_job_id(job_id):
            return False

        def body(conn: sqlite3.Connection, now: float) -> bool:
            cursor = conn.execute(f"{REQUEUE_SQL} AND id = ?", (now, now, job_id))
            return cursor.rowcount == 1

        done = self._write(body)
        if done:
            logger.info("%s: job %d requeued", self._path, job_id)
        return done

    def requeue_failed(self, *, task: str | None = None) -> list[int]:
        name = None if task is None else check_text("task", task)
        where = "" if name is None else " AND task = ?"
        extra: tuple[str, ...] = () if name is None else (name,)

        def body(conn: sqlite3.Connection, now: float) -> list[int]:
            ids = [
                int(row[0])
                for row in conn.execute(
                    f"SELECT id FROM jobs WHERE state = 'failed'{where} ORDER BY id", extra
                )
            ]
            conn.execute(f"{REQUEUE_SQL}{where}", (now, now, *extra))
            return ids

        ids = self._write(body)
        if ids:
            logger.info("%s: requeued %d failed jobs", self._path, len(ids))
        return ids

    def cancel(self, job_id: int) -> CancelResult:
        if not check_job_id(job_id):
            return CancelResult.NOT_FOUND

        def body(conn: sqlite3.Connection, now: float) -> CancelResult:
            row = conn.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                return CancelResult.NOT_FOUND
            if row[0] == JobState.QUEUED:
                conn.execute(
                    "UPDATE jobs SET state = 'cancelled', updated_at = ? WHERE id = ?",
                    (now, job_id),
                )
                return CancelResult.CANCELLED
            if row[0] == JobState.RUNNING:
                conn.execute(
                    "UPDATE jobs SET cancel_requested = 1, updated_at = ? WHERE id = ?",
                    (now, job_id),
                )
                return CancelResult.REQUESTED
            return CancelResult.FINISHED

        result = self._write(body)
        logger.info("%s: job %d: cancel %s", self._path, job_id, result.value)
        return result

    def counts(self) -> dict[str, int]:
        rows = self._read(
            lambda conn: conn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
        )
        result = {state.value: 0 for state in JobState}
        result.update({state: int(n) for state, n in rows})
        return result

    def purge(
        self, *, older_than: float | None = None, states: Collection[str] = FINISHED_STATES
    ) -> int:
        cutoff = None if older_than is None else check_time("older_than", older_than)
        chosen = sorted(state.value for state in check_states(states))
        if not chosen:
            return 0

        def body(conn: sqlite3.Connection, now: float) -> int:
            sql = f"DELETE FROM jobs WHERE state IN ({', '.join('?' * len(chosen))})"
            params: tuple[object, ...] = tuple(chosen)
            if cutoff is not None:
                sql += " AND updated_at < ?"
                params += (cutoff,)
            conn.execute(PURGE_FLOOR_SQL)  # so no id deleted here is ever given again
            return conn.execute(sql, params).rowcount

        purged = self._write(body)
        if purged:
            logger.info("%s: purged %d finished jobs", self._path, purged)
        return purged

    # --- worker rows ----------------------------------------------------------------------

    def _record_worker(self, row: WorkerRow) -> None:
        def body(conn: sqlite3.Connection, now: float) -> None:
            self._expire_workers(conn, now)
            conn.execute(
                f"INSERT OR REPLACE INTO workers ({', '.join(WORKER_COLUMNS)})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.worker_id,
                    row.host,
                    row.pid,
                    row.state,
                    row.started_at,
                    now,
                    now + row.ttl,
                    row.jobs_held,
                ),
            )

        self._write(body)

    def forget_worker(self, worker_id: str) -> None:
        name = check_text("worker_id", worker_id)
        self._write(lambda conn, now: conn.execute("DELETE FROM workers WHERE id = ?", (name,)))

    def workers(self) -> list[WorkerRecord]:
        def body(conn: sqlite3.Connection, now: float) -> list[WorkerRecord]:
            self._expire_workers(conn, now)
            rows = conn.execute(
                f"SELECT {', '.join(WORKER_COLUMNS)} FROM workers ORDER BY started_at, id"
            ).fetchall()
            return [WorkerRecord(*row) for row in rows]

        return self._write(body)

    def _expire_workers(self, conn: sqlite3.Connection, now: float) -> None:
        gone = conn.execute("DELETE FROM workers WHERE expires_at <= ?", (now,)).rowcount
        if gone:
            logger.info("%s: %d worker rows expired (workers that died?)", self._path, gone)
