"""The job queue's data model and the `Store` protocol every store implements.

A store holds jobs and moves them between states, one transaction per transition::

    queued --claim--> running --complete--> done
                         |----fail--------> failed
                         |----retry-------> queued (later run_at, attempt kept)
                         |----release-----> queued (attempt given back, run_at unchanged)
                         |----lease expiry> queued again at the next claim (attempt kept),
                                            or failed once its attempts are spent

Fencing: a claim returns a `Claim` whose ``token`` is unique to that claim. complete, fail,
retry, release and renew succeed only while that token is the job's current lease owner;
otherwise they change nothing and return False, so a worker that lost its lease (it was
paused past the expiry and another worker claimed the job) cannot overwrite the newer
claim's outcome.

Attempts count claims, including claims whose lease later expired: a job that kills its
worker every time ends ``failed`` instead of looping forever. A release (the job was
interrupted by a shutdown, not failed) gives the attempt back.

Time: every store takes a ``clock`` (seconds since the epoch, `time.time` by default) and
uses only it for ``run_at`` and leases, so tests can move time without sleeping; its
`Store.clock` method reads the store's time (the database's, on PostgreSQL).

Wake-ups: `Store.subscribe` registers a callback for "a job may have become due"; only a
store with notifications (PostgreSQL's LISTEN/NOTIFY) ever calls it.

Shared by the stores, so that none imports another: the argument checks and row
preparation (`prepare_enqueue`, `prepare_many`, ``check_*``), and for the SQL stores the
row mapping (`JOB_COLUMNS`, `job_from_row`) and the retry pause (`backoff`).
"""

from __future__ import annotations

import enum
import json
import math
import random
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "JOB_COLUMNS",
    "Claim",
    "Job",
    "JobState",
    "JsonValue",
    "NewJob",
    "Store",
    "backoff",
    "check_lease",
    "check_limit",
    "check_owner",
    "check_time",
    "encode_payload",
    "expired_reason",
    "job_from_row",
    "new_token",
    "prepare_enqueue",
    "prepare_many",
]

JsonValue: TypeAlias = Any  # a value json.dumps accepts: None, bool, int, float, str, list, dict
DEFAULT_MAX_ATTEMPTS = 3


class JobState(enum.StrEnum):
    """Where a job is in its life."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


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


@dataclass(frozen=True)
class Claim:
    """A job taken under a lease; ``token`` is the fencing token of this claim only."""

    job: Job
    token: str
    lease_until: float


def encode_payload(payload: JsonValue) -> str:
    """Serialise a payload to JSON, or raise `TypeError` naming the problem.

    JSON only, on purpose: a queue file someone else can write must never be able to run
    code, so no pickle, and no names looked up from the data.
    """
    try:
        return json.dumps(payload, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"job payload must be JSON-serialisable: {exc}") from exc


# --- argument checks and row preparation, shared by every store so they refuse alike ---

_ENQUEUE_KEYS = frozenset({"task", "payload", "run_at", "delay", "max_attempts"})


@dataclass(frozen=True)
class NewJob:
    """A validated enqueue request: everything a store needs to insert the row."""

    task: str
    payload_json: str
    run_at: float
    max_attempts: int


def check_time(name: str, value: object) -> float:
    """``value`` as a finite float; `TypeError` or `ValueError` naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def prepare_enqueue(
    now: float,
    task: object,
    payload: JsonValue = None,
    *,
    run_at: object = None,
    delay: object = None,
    max_attempts: object = DEFAULT_MAX_ATTEMPTS,
) -> NewJob:
    """Validate `Store.enqueue` arguments; shared by every store so they refuse alike."""
    if not isinstance(task, str):
        raise TypeError(f"task must be a string, got {task!r}")
    if not task.strip():
        raise ValueError(f"task must be a non-empty name, got {task!r}")
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
        raise TypeError(f"max_attempts must be an int, got {max_attempts!r}")
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
    if run_at is not None and delay is not None:
        raise ValueError("pass run_at or delay, not both")
    if run_at is not None:
        when = check_time("run_at", run_at)
    elif delay is not None:
        seconds = check_time("delay", delay)
        if seconds < 0:
            raise ValueError(f"delay must not be negative, got {seconds}")
        when = now + seconds
    else:
        when = now
    return NewJob(task, encode_payload(payload), when, max_attempts)


def prepare_many(now: float, jobs: Sequence[Mapping[str, Any]]) -> list[NewJob]:
    """Validate every `Store.enqueue_many` entry before any is written."""
    if isinstance(jobs, str | bytes | Mapping):
        raise TypeError("enqueue_many takes a sequence of mappings, one per job")
    prepared = []
    for index, spec in enumerate(jobs):
        if not isinstance(spec, Mapping):
            raise TypeError(f"job #{index} must be a mapping of enqueue arguments")
        unknown = set(spec) - _ENQUEUE_KEYS
        if unknown:
            raise ValueError(f"job #{index} has unknown keys {sorted(unknown)}")
        if "task" not in spec:
            raise ValueError(f"job #{index} has no 'task'")
        try:
            prepared.append(prepare_enqueue(now, **dict(spec)))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"job #{index}: {exc}") from exc
    return prepared


def check_owner(owner: object) -> str:
    """``owner`` as a non-empty string, or `TypeError` / `ValueError`."""
    if not isinstance(owner, str):
        raise TypeError(f"owner must be a string, got {owner!r}")
    if not owner:
        raise ValueError("owner must be a non-empty string")
    return owner


def check_lease(lease: object) -> float:
    """``lease`` as a positive finite number of seconds, or `TypeError` / `ValueError`."""
    seconds = check_time("lease", lease)
    if seconds <= 0:
        raise ValueError(f"lease must be positive, got {seconds}")
    return seconds


def check_limit(limit: object) -> int:
    """``limit`` as an int of at least 1, or `TypeError` / `ValueError`."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int, got {limit!r}")
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    return limit


def new_token(owner: str) -> str:
    """A fencing token unique to one claim; the owner prefix is for humans reading logs."""
    return f"{owner}:{uuid.uuid4().hex}"


def expired_reason(attempts: int) -> str:
    """The ``last_error`` of a job failed because its last lease expired."""
    return f"lease expired after {attempts} attempts (worker died?)"


# --- what the SQL stores share: the row of a job, and the pause between two attempts ---

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
)
"""The columns of a SQL store's ``jobs`` table, in the order `job_from_row` reads them."""


def job_from_row(row: Sequence[Any]) -> Job:
    """The `Job` of a row whose values follow `JOB_COLUMNS`, the payload as JSON text.

    Raises `ValueError` naming the job if the payload is not JSON (the stores say which
    file or database it came from). Every call decodes afresh: the `Job` is a snapshot.
    """
    (job_id, task, payload, state, run_at, attempts, max_attempts) = row[:7]
    (lease_owner, lease_until, last_error, created_at, updated_at) = row[7:]
    try:
        value = json.loads(payload)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"job {job_id} has a payload that is not JSON ({exc})") from exc
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
    )


def backoff(first: float, attempt: int, cap: float = math.inf) -> float:
    """Seconds to wait before retry ``attempt`` (1, 2, ...) of a failed transaction.

    ``first`` doubled at each attempt, at most ``cap``, times a random factor in [1, 2)
    (jitter, not crypto) so that clients that failed together do not retry in step.
    """
    return min(first * 2.0 ** (attempt - 1), cap) * (1 + random.random())


class Store(Protocol):
    """What a worker needs from a store. Every method is one transaction and thread-safe."""

    def enqueue(
        self,
        task: str,
        payload: JsonValue = None,
        *,
        run_at: float | None = None,
        delay: float | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> int:
        """Add a job and return its id; a bad payload or argument writes nothing."""
        ...

    def enqueue_many(self, jobs: Sequence[Mapping[str, Any]]) -> list[int]:
        """Add several jobs (each a mapping of `enqueue`'s arguments) in one transaction."""
        ...

    def claim(self, owner: str, *, lease: float, limit: int = 1) -> list[Claim]:
        """Take up to ``limit`` due jobs, oldest ``run_at`` first (ties by id), under a lease.

        Due means queued with ``run_at <= now``, or running with an expired lease. An
        expired job whose attempts are spent is marked failed instead of being returned.
        """
        ...

    def complete(self, claim: Claim) -> bool:
        """Mark the job done; False (and no change) if the claim no longer holds the lease."""
        ...

    def fail(self, claim: Claim, error: str) -> bool:
        """Mark the job failed for good with ``error``; False if the lease was lost."""
        ...

    def retry(self, claim: Claim, error: str, *, run_at: float) -> bool:
        """Queue the job again at ``run_at``, keeping the attempt; False if the lease was lost."""
        ...

    def release(self, claim: Claim) -> bool:
        """Return an interrupted job unchanged: attempt given back, original ``run_at``."""
        ...

    def renew(self, claim: Claim, *, lease: float) -> Claim | None:
        """Extend the lease; the renewed claim, or None if the lease was lost."""
        ...

    def get(self, job_id: int) -> Job | None:
        """The job with this id, or None."""
        ...

    def counts(self) -> dict[str, int]:
        """Number of jobs in each state, every state present (zero included)."""
        ...

    def next_due(self) -> float | None:
        """When the next job becomes claimable (a run_at or a lease expiry); None if never."""
        ...

    def purge(self, *, older_than: float | None = None) -> int:
        """Delete done and failed jobs (updated before ``older_than``); return how many."""
        ...

    def clock(self) -> float:
        """The store's time now, in seconds since the epoch: the time of ``run_at`` and leases.

        A worker computes a retry's ``run_at`` with it. The local stores return their
        constructor's ``clock`` (`time.time` by default); `PostgresStore` returns the
        database's time. Never raises, not even after `close`.
        """
        ...

    def subscribe(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Call ``callback()`` whenever a job may have become due; return an unsubscribe.

        ``callback`` must return quickly and not call back into the store (``Worker.wake``
        is the intended one). A store without notifications (memory, SQLite) never calls
        it and returns an unsubscribe that does nothing: a worker on such a store finds
        new jobs at its next poll. Raises `RuntimeError` once the store is closed.
        """
        ...

    def close(self) -> None:
        """Release the store's resources; idempotent."""
        ...
