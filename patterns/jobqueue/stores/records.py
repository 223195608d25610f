"""The job queue's records: the values a store keeps and hands out, and its constants.

A `Job` is a snapshot of one row; a `Claim` is a job taken under a lease (its ``token``
fences every later write about it); a `Settlement` is one claimed job's outcome for
`~patterns.jobqueue.stores.protocol.Store.settle_many`; a `WorkerRecord` is one live worker's
row. `StoreUnavailable` and `CommitUnknown` are the errors of a store on a database server,
defined here so that a worker handles them without importing that store. The SQL stores
share the row mapping (`JOB_COLUMNS`, `job_from_row`) and the tables (`WORKER_COLUMNS`,
`TABLE_SHAPES`).

What a store does with them is the `~patterns.jobqueue.stores.protocol` module's contract;
the checks every store makes before writing them are in `~patterns.jobqueue.stores.checks`.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "FINISHED_STATES",
    "JOB_COLUMNS",
    "MAX_ATTEMPTS_LIMIT",
    "MAX_ERROR_CHARS",
    "MAX_SECONDS",
    "TABLE_SHAPES",
    "WORKER_COLUMNS",
    "CancelResult",
    "Claim",
    "CommitUnknown",
    "Job",
    "JobState",
    "JsonValue",
    "NewJob",
    "Settle",
    "Settlement",
    "StoreUnavailable",
    "WorkerRecord",
    "WorkerRow",
    "job_from_row",
]

JsonValue: TypeAlias = Any  # a value json.dumps accepts: None, bool, int, float, str, list, dict
DEFAULT_MAX_ATTEMPTS = 3
MAX_ATTEMPTS_LIMIT = 1_000_000
"""The largest ``max_attempts`` a store accepts (an absurd number is a mistake, not a policy)."""
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
"""The default limit, in UTF-8 bytes, on the JSON text of a payload or a result (1 MiB)."""
MAX_ERROR_CHARS = 4000
"""An error text longer than this is stored truncated (`~.checks.storable_error`)."""
MAX_SECONDS = 1e10
"""The largest magnitude of any time in seconds a store accepts (about the year 2286)."""


class JobState(enum.StrEnum):
    """Where a job is in its life."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINISHED_STATES = frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELLED})
"""The states a job never leaves by itself; `~.Store.purge` deletes only these."""


class CancelResult(enum.StrEnum):
    """What `~.Store.cancel` did."""

    CANCELLED = "cancelled"  # the job was queued: it is cancelled and will never run
    REQUESTED = "requested"  # the job is running: its worker's next renew sees the request
    FINISHED = "finished"  # the job had already ended (done, failed, cancelled): no change
    NOT_FOUND = "not found"  # no job has this id


class StoreUnavailable(RuntimeError):
    """The database could not be reached within the retries; the call changed nothing.

    Raised by a store on a database server (`~.PostgresStore`); defined here, with the
    records every store shares, so that a worker handles it without importing that store.
    """


class CommitUnknown(StoreUnavailable):
    """The connection broke during ``COMMIT``: the transaction may or may not have applied.

    Unlike its base class, the call may have taken effect. A claim that did commit leaves
    its jobs running under leases nobody holds: they run again once those expire.
    """


@dataclass(frozen=True)
class Job:
    """A snapshot of one job row. Times are seconds since the epoch."""

    id: int
    task: str
    payload: JsonValue
    state: JobState
    run_at: float
    attempts: int
    max_attempts: int
    lease_owner: str | None
    lease_until: float | None
    last_error: str | None
    created_at: float
    updated_at: float
    timeout: float | None = None  # seconds a handler may run (None: no limit)
    result: JsonValue = None  # what the handler returned, once the job is done
    cancel_requested: bool = False  # `Store.cancel` was called while it was running

    # The dataclass's own __init__ sets each field with its own object.__setattr__ (a
    # frozen class refuses plain assignment): 1.6 µs for these fifteen, paid for every
    # job a store hands out. This one takes the same parameters with the same defaults
    # and hands the instance its __dict__ whole, in one call (0.7 µs); the dataclass
    # keeps a class's own __init__. tests/jobqueue/test_records.py fails if a field is
    # added, moved or renamed and this is not changed with it.
    def __init__(  # noqa: PLR0917 - the dataclass's positional fields
        self,
        id: int,  # noqa: A002 - the field's name
        task: str,
        payload: JsonValue,
        state: JobState,
        run_at: float,
        attempts: int,
        max_attempts: int,
        lease_owner: str | None,
        lease_until: float | None,
        last_error: str | None,
        created_at: float,
        updated_at: float,
        timeout: float | None = None,
        result: JsonValue = None,
        cancel_requested: bool = False,
    ) -> None:
        fields = {
            "id": id,
            "task": task,
            "payload": payload,
            "state": state,
            "run_at": run_at,
            "attempts": attempts,
            "max_attempts": max_attempts,
            "lease_owner": lease_owner,
            "lease_until": lease_until,
            "last_error": last_error,
            "created_at": created_at,
            "updated_at": updated_at,
            "timeout": timeout,
            "result": result,
            "cancel_requested": cancel_requested,
        }
        object.__setattr__(self, "__dict__", fields)


@dataclass(frozen=True)
class Claim:
    """A job taken under a lease; ``token`` is the fencing token of this claim only.

    ``cancel_requested`` is True on a claim returned by `~.Store.renew` when someone called
    `~.Store.cancel` on the job since it was claimed; the worker then cancels its handler.
    """

    job: Job
    token: str
    lease_until: float
    cancel_requested: bool = False


class Settle(enum.StrEnum):
    """Which outcome a `Settlement` records (one per single-job method of `~.Store`)."""

    COMPLETE = "complete"  # `Store.complete` with ``result``
    FAIL = "fail"  # `Store.fail` with ``error``
    RETRY = "retry"  # `Store.retry` with ``error`` and ``run_at``
    RELEASE = "release"  # `Store.release`
    CANCEL = "cancel"  # `Store.mark_cancelled` with ``error`` as the reason


@dataclass(frozen=True, slots=True)
class Settlement:
    """One claimed job's outcome, for `~.Store.settle_many`."""

    kind: Settle
    claim: Claim
    result: JsonValue = None  # COMPLETE only
    error: str = ""  # FAIL, RETRY, CANCEL
    run_at: float = 0.0  # RETRY only


@dataclass(frozen=True)
class WorkerRecord:
    """One live worker as `~.Store.workers` lists it (times in the store's clock)."""

    id: str  # the worker's owner name, the prefix of its fencing tokens
    host: str
    pid: int
    state: str  # a WorkerState value: running, draining, cancelling, stopped
    started_at: float
    last_seen: float  # when it last called `Store.record_worker`
    expires_at: float  # the row is no longer listed after this (a worker that died)
    jobs_held: int


@dataclass(frozen=True)
class NewJob:
    """A validated enqueue request: everything a store needs to insert the row."""

    task: str
    payload_json: str
    run_at: float
    max_attempts: int
    timeout: float | None = None


@dataclass(frozen=True)
class WorkerRow:
    """`~.Store.record_worker`'s arguments once checked (see `~.check_worker`)."""

    worker_id: str
    host: str
    pid: int
    state: str
    started_at: float
    jobs_held: int
    ttl: float


# --- what the SQL stores share: the row of a job and the tables ---

JOB_COLUMNS = (
    "id",
    "task",
    "payload",
    "state",
    "run_at",
    "attempts",
    "max_attempts",
    "lease_owner",
    "lease_until",
    "last_error",
    "created_at",
    "updated_at",
    "timeout",
    "result",
    "cancel_requested",
)
"""The columns of a SQL store's ``jobs`` table, in the order `job_from_row` reads them."""

WORKER_COLUMNS = (
    "id",
    "host",
    "pid",
    "state",
    "started_at",
    "last_seen",
    "expires_at",
    "jobs_held",
)
"""The columns of a SQL store's ``workers`` table, in the order of `WorkerRecord`'s fields."""

TABLE_SHAPES: dict[int, dict[str, tuple[str, ...]]] = {
    1: {"jobs": JOB_COLUMNS[:12]},  # version 2 added the last three columns
    2: {"jobs": JOB_COLUMNS, "workers": WORKER_COLUMNS},
}
"""The tables of a SQL store's schema, with their columns, at each schema version."""


def job_from_row(row: Sequence[Any]) -> Job:
    """The `Job` of a row whose values follow `JOB_COLUMNS`, the payload as JSON text.

    Raises `ValueError` naming the job if the payload is not JSON (the stores say which
    file or database it came from). Every call decodes afresh: the `Job` is a snapshot.
    """
    (job_id, task, payload, state, run_at, attempts, max_attempts) = row[:7]
    (lease_owner, lease_until, last_error, created_at, updated_at) = row[7:12]
    (timeout, result, cancel_requested) = row[12:15]
    try:
        value = json.loads(payload)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"job {job_id} has a payload that is not JSON ({exc})") from exc
    try:
        outcome = None if result is None else json.loads(result)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"job {job_id} has a result that is not JSON ({exc})") from exc
    return Job(
        id=int(job_id),
        task=task,
        payload=value,
        state=JobState(state),
        run_at=run_at,
        attempts=attempts,
        max_attempts=max_attempts,
        lease_owner=lease_owner,
        lease_until=lease_until,
        last_error=last_error,
        created_at=created_at,
        updated_at=updated_at,
        timeout=timeout,
        result=outcome,
        cancel_requested=bool(cancel_requested),
    )
