"""How jobs get into `~.PostgresStore`: ``enqueue``, ``enqueue_many`` and the outbox.

Every insert is one statement that also sends the ``NOTIFY`` waking the listeners, and
takes its delay from the database's clock in SQL (a job is due by the database's ``now``,
never by a machine's). ``enqueue_in`` runs the same statement on the caller's connection,
in the caller's transaction, so that a job exists if and only if the caller's own change
commits. `PostgresEnqueue` holds these methods; `~.PostgresStore` subclasses it, and is the
class to use.

Docs: docs/jobqueue/many_machines.md
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from patterns.jobqueue.stores.checks import prepare_enqueue, prepare_many
from patterns.jobqueue.stores.postgres.admin import PostgresAdmin
from patterns.jobqueue.stores.postgres.schema import check_timestamp
from patterns.jobqueue.stores.records import DEFAULT_MAX_ATTEMPTS, JsonValue, NewJob

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresEnqueue"]

logger = logging.getLogger(__name__)

_MAX_ATTEMPTS = 2**31 - 1  # the integer column's range

Params = dict[str, Any]


def _check_job(new: NewJob, *, absolute: bool) -> NewJob:
    if new.max_attempts > _MAX_ATTEMPTS:
        raise ValueError(f"max_attempts must be at most {_MAX_ATTEMPTS}, got {new.max_attempts}")
    check_timestamp("run_at" if absolute else "delay", new.run_at)
    return new


class PostgresEnqueue(PostgresAdmin):
    """The enqueue methods of `~.PostgresStore`, and the insert statement they share.

    Not a store of its own: `~.PostgresStore` subclasses it and sets up what these methods
    use, besides what `~.PostgresAdmin` lists: psycopg (``_pg``), the payload limit and
    the test clock.
    """

    _pg: ModuleType
    _max_payload_bytes: int
    _test_clock: Callable[[], float] | None

    def _check_open(self) -> None:
        if self._db.closed:
            raise RuntimeError(f"{self!r} is closed")

    def _insert_statement(
        self, prepared: list[tuple[NewJob, bool]], clock: float | None
    ) -> tuple[Any, Params]:
        """The insert statement for these jobs, and its parameters (one job: no arrays)."""
        if len(prepared) == 1:
            ((new, absolute),) = prepared
            return self._statements["insert_one"], {
                "clock": clock,
                "channel": self._channel,
                "task": new.task,
                "payload": new.payload_json,
                "run_at": new.run_at if absolute else None,
                "delay": None if absolute else new.run_at,
                "max_attempts": new.max_attempts,
                "timeout": new.timeout,
            }
        return self._statements["insert"], self._insert_params(prepared, clock)

    def _insert_params(self, prepared: list[tuple[NewJob, bool]], clock: float | None) -> Params:
        return {
            "clock": clock,
            "channel": self._channel,
            "tasks": [new.task for new, _ in prepared],
            "payloads": [new.payload_json for new, _ in prepared],
            "run_ats": [new.run_at if absolute else None for new, absolute in prepared],
            "delays": [None if absolute else new.run_at for new, absolute in prepared],
            "max_attempts": [new.max_attempts for new, _ in prepared],
            "timeouts": [new.timeout for new, _ in prepared],
        }

    def _insert(self, prepared: list[tuple[NewJob, bool]]) -> list[int]:
        """Insert validated jobs (each with "is its run_at absolute?") in one statement."""
        if not prepared:
            self._check_open()
            return []

        def body(conn: psycopg.Connection[tuple[Any, ...]], clock: float | None) -> list[int]:
            row = conn.execute(*self._insert_statement(prepared, clock)).fetchone()
            # Ids come from the identity sequence in insertion order, which follows the
            # input order (ORDER BY t.n): sorted ids are the jobs in the order given.
            return [] if row is None or row[0] is None else [int(i) for i in row[0]]

        return self._transaction(body, "statement")

    def _prepare_job(self, spec: Mapping[str, Any]) -> tuple[NewJob, bool]:
        # now=0.0: a delay is added to the database's clock in SQL, not to ours.
        new = prepare_enqueue(0.0, **spec, max_payload_bytes=self._max_payload_bytes)
        absolute = spec["run_at"] is not None
        return _check_job(new, absolute=absolute), absolute

    def _enqueue(self, spec: Mapping[str, Any]) -> int:
        (job_id,) = self._insert([self._prepare_job(spec)])
        logger.debug("%s: enqueued job %d (%s)", self._where, job_id, spec["task"])
        return job_id

    def enqueue_many(self, jobs: Sequence[Mapping[str, Any]]) -> list[int]:
        """`~.Store.enqueue_many` in one statement, with one ``NOTIFY``."""
        prepared = []
        for index, (new, spec) in enumerate(
            zip(prepare_many(0.0, jobs, self._max_payload_bytes), jobs, strict=True)
        ):
            absolute = spec.get("run_at") is not None
            try:
                prepared.append((_check_job(new, absolute=absolute), absolute))
            except ValueError as exc:
                raise ValueError(f"job #{index}: {exc}") from exc
        ids = self._insert(prepared)
        logger.debug("%s: enqueued %d jobs", self._where, len(ids))
        return ids

    def enqueue_in(
        self,
        conn: psycopg.Connection[Any],
        task: str,
        payload: JsonValue = None,
        *,
        run_at: float | None = None,
        delay: float | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | None = None,
    ) -> int:
        """`~.PostgresStore.enqueue` on the caller's connection, in its transaction: an outbox.

        The job and its ``NOTIFY`` commit with the caller's own writes, or neither does:
        a rolled-back transaction leaves no job and wakes nobody. The store neither
        commits nor retries; ``conn`` is the caller's psycopg connection to the same
        database (its transaction, if one is open, is joined). The arguments are checked
        as `~.PostgresStore.enqueue` checks them; a delay counts from that transaction's
        ``now()``. The connection's ``row_factory`` may be any: the store reads its id
        through a cursor of its own factory.
        """
        spec = {
            "task": task,
            "payload": payload,
            "run_at": run_at,
            "delay": delay,
            "max_attempts": max_attempts,
            "timeout": timeout,
        }
        prepared = [self._prepare_job(spec)]
        self._check_open()
        clock = None if self._test_clock is None else self._test_clock()
        # A cursor of our own row factory: the caller's connection may have any (dict_row,
        # a class), and reading the id must not fail after the INSERT ran in its transaction.
        with conn.cursor(row_factory=self._pg.rows.tuple_row) as cursor:
            row = cursor.execute(*self._insert_statement(prepared, clock)).fetchone()
        assert row is not None  # one row in, one id out
        assert row[0] is not None
        return int(row[0][0])
