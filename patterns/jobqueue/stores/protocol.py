"""The job queue's data model and the `Store` protocol every store implements.

A store holds jobs and moves them between states, one transaction per transition (or per
batch of outcomes, `Store.settle_many`)::

    queued --claim--> running --complete--> done (with the handler's result)
      |                  |----fail--------> failed --requeue--> queued (attempts reset)
      |                  |----retry-------> queued (later run_at, attempt kept)
      |                  |----release-----> queued (attempt given back, run_at unchanged)
      |                  |----cancelled---> cancelled (its handler stopped on a cancel)
      |                  |----lease expiry> queued again at the next claim (attempt kept),
      |                                     or failed once its attempts are spent
      '--cancel--> cancelled (never runs); cancel on a running job only sets a flag that
                   the worker's next renew sees (``Claim.cancel_requested``)

Fencing: a claim returns a `Claim` whose ``token`` is unique to that claim. complete, fail,
retry, release and renew (and each item of settle_many, alone) succeed only while that token
is the job's current lease owner; otherwise they change nothing and return False, so a
worker that lost its lease (it was paused past the expiry and another worker claimed the
job) cannot overwrite the newer claim's outcome.

Attempts count claims, including claims whose lease later expired: a job that kills its
worker every time ends ``failed`` instead of looping forever. A release (the job was
interrupted by a shutdown, not failed) gives the attempt back.

Time: every store takes a ``clock`` (seconds since the epoch, `time.time` by default) and
uses only it for ``run_at`` and leases, so tests can move time without sleeping; its
`Store.clock` method reads the store's time (the database's, on PostgreSQL).

Wake-ups: `Store.subscribe` registers a callback for "a job may have become due"; a store
that can see other connections' commits calls it (PostgreSQL's LISTEN/NOTIFY, SQLite's
``PRAGMA data_version`` watcher); the memory store never does.

Limits, the same on every store: a payload's JSON text, stored as UTF-8, is at most
``max_payload_bytes`` bytes of it (`DEFAULT_MAX_PAYLOAD_BYTES`, 1 MiB, a store constructor
argument); ``max_attempts`` at most `MAX_ATTEMPTS_LIMIT`; every time in seconds
within +-`MAX_SECONDS`. An error text is stored through `storable_error`: lone
surrogates and NUL escaped, at most `MAX_ERROR_CHARS`.
A name (task, owner, worker) is refused instead (`check_text`): no NUL, no lone surrogate,
at most 200 characters. `Store.renew` never reads the payload, whatever its size.

Shared by the stores, so that none imports another: the argument checks and row
preparation (`prepare_enqueue`, `prepare_many`, ``check_*``), the five single-job outcome
methods, ``enqueue`` and ``record_worker`` on one primitive each store provides
(``StoreBase``, their base class), and for the SQL stores the row mapping (`JOB_COLUMNS`,
`job_from_row`), the tables (`WORKER_COLUMNS`, `TABLE_SHAPES`) and the retry pause
(`backoff`).
"""

from __future__ import annotations

import enum
import json
import math
import os
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

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
    "Store",
    "StoreUnavailable",
    "WorkerRecord",
    "WorkerRow",
    "backoff",
    "cancelled_reason",
    "check_job_id",
    "check_lease",
    "check_limit",
    "check_max_payload_bytes",
    "check_owner",
    "check_share",
    "check_state",
    "check_states",
    "check_text",
    "check_time",
    "check_timeout",
    "check_worker",
    "encode_payload",
    "encode_result",
    "expired_reason",
    "job_from_row",
    "new_token",
    "prepare_enqueue",
    "prepare_many",
    "prepare_settlement",
    "settle_each",
    "settle_only",
    "storable_error",
]

JsonValue: TypeAlias = Any  # a value json.dumps accepts: None, bool, int, float, str, list, dict
DEFAULT_MAX_ATTEMPTS = 3
MAX_ATTEMPTS_LIMIT = 1_000_000
"""The largest ``max_attempts`` a store accepts (an absurd number is a mistake, not a policy)."""
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
"""The default limit, in UTF-8 bytes, on the JSON text of a payload or a result (1 MiB)."""
MAX_ERROR_CHARS = 4000
"""An error text longer than this is stored truncated (`storable_error`)."""
_MAX_INT32 = 2**31 - 1  # the largest pid, jobs_held or limit accepted
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
"""The states a job never leaves by itself; `Store.purge` deletes only these."""


class CancelResult(enum.StrEnum):
    """What `Store.cancel` did."""

    CANCELLED = "cancelled"  # the job was queued: it is cancelled and will never run
    REQUESTED = "requested"  # the job is running: its worker's next renew sees the request
    FINISHED = "finished"  # the job had already ended (done, failed, cancelled): no change
    NOT_FOUND = "not found"  # no job has this id


class StoreUnavailable(RuntimeError):
    """The database could not be reached within the retries; the call changed nothing.

    Raised by a store on a database server
    (`~.PostgresStore`); defined here, with the protocol, so
    that a worker handles it without importing that store.
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


@dataclass(frozen=True)
class Claim:
    """A job taken under a lease; ``token`` is the fencing token of this claim only.

    ``cancel_requested`` is True on a claim returned by `Store.renew` when someone called
    `Store.cancel` on the job since it was claimed; the worker then cancels its handler.
    """

    job: Job
    token: str
    lease_until: float
    cancel_requested: bool = False


class Settle(enum.StrEnum):
    """Which outcome a `Settlement` records (one per single-job method of `Store`)."""

    COMPLETE = "complete"  # `Store.complete` with ``result``
    FAIL = "fail"  # `Store.fail` with ``error``
    RETRY = "retry"  # `Store.retry` with ``error`` and ``run_at``
    RELEASE = "release"  # `Store.release`
    CANCEL = "cancel"  # `Store.mark_cancelled` with ``error`` as the reason


@dataclass(frozen=True, slots=True)
class Settlement:
    """One claimed job's outcome, for `Store.settle_many`."""

    kind: Settle
    claim: Claim
    result: JsonValue = None  # COMPLETE only
    error: str = ""  # FAIL, RETRY, CANCEL
    run_at: float = 0.0  # RETRY only


@dataclass(frozen=True)
class WorkerRecord:
    """One live worker as `Store.workers` lists it (times in the store's clock)."""

    id: str  # the worker's owner name, the prefix of its fencing tokens
    host: str
    pid: int
    state: str  # a WorkerState value: running, draining, cancelling, stopped
    started_at: float
    last_seen: float  # when it last called `Store.record_worker`
    expires_at: float  # the row is no longer listed after this (a worker that died)
    jobs_held: int


def encode_payload(
    payload: JsonValue, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES, *, what: str = "payload"
) -> str:
    """Serialise a payload to JSON, or raise naming the problem.

    `TypeError` if it is not JSON-serialisable; `ValueError` if its JSON text is over
    ``max_bytes`` bytes of UTF-8, the bytes every store keeps and ``wc -c`` counts.
    JSON only, on purpose: a queue file someone else can write must never be able to run
    code, so no pickle, and no names looked up from the data.
    """
    try:
        text = json.dumps(payload, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise TypeError(f"job {what} must be JSON-serialisable: {exc}") from exc
    # json.dumps escapes NUL (which PostgreSQL text cannot hold) as \u0000 even without
    # ensure_ascii. A lone surrogate, which UTF-8 cannot encode, can only be inside a JSON
    # string: backslashreplace writes it as the \udXXX escape that json.loads reads back.
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
        size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise ValueError(
            f"job {what} is {size} bytes of UTF-8 JSON, over the limit of {max_bytes} bytes"
            " (max_payload_bytes)"
        )
    return text


def encode_result(result: JsonValue, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    """A handler's return value as JSON text for `Store.complete`; raises as `encode_payload`."""
    return encode_payload(result, max_bytes, what="result")


def storable_error(text: object, limit: int = MAX_ERROR_CHARS) -> str:
    r"""``text`` as an error text every store can keep, at most ``limit`` characters.

    Lone surrogates (which UTF-8 cannot encode) become ``\udXXX`` escapes and NUL (which
    PostgreSQL text cannot hold) becomes ``\x00``, so the text still says what it was; a
    longer text keeps its start and says how much was cut.
    """
    text = str(text)
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > limit:
        marker = f" ... [{len(text)} characters, cut to {limit}]"
        text = text[: max(0, limit - len(marker))] + marker
    return text


# --- argument checks and row preparation, shared by every store so they refuse alike ---

_ENQUEUE_KEYS = frozenset({"task", "payload", "run_at", "delay", "max_attempts", "timeout"})


@dataclass(frozen=True)
class NewJob:
    """A validated enqueue request: everything a store needs to insert the row."""

    task: str
    payload_json: str
    run_at: float
    max_attempts: int
    timeout: float | None = None


def check_time(name: str, value: object) -> float:
    """``value`` as a float within +-`MAX_SECONDS`; `TypeError` or `ValueError` naming it."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    try:
        seconds = float(value)
    except OverflowError:  # an int too large for a float
        seconds = math.inf
    if not math.isfinite(seconds):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if abs(seconds) > MAX_SECONDS:
        raise ValueError(f"{name} must be within {MAX_SECONDS:g} seconds, got {value!r}")
    return seconds


def check_timeout(timeout: object) -> float | None:
    """A job's ``timeout``: None, or a positive number of seconds."""
    if timeout is None:
        return None
    seconds = check_time("timeout", timeout)
    if seconds <= 0:
        raise ValueError(f"timeout must be positive, got {seconds}")
    return seconds


def check_state(state: object) -> JobState:
    """A job state given by value (``"failed"``) or member; `ValueError` naming the choices."""
    if not isinstance(state, str):
        raise TypeError(f"state must be a string, got {state!r}")
    try:
        return JobState(state)
    except ValueError:
        choices = ", ".join(s.value for s in JobState)
        raise ValueError(f"unknown job state {state!r} (one of {choices})") from None


def check_states(states: object) -> frozenset[JobState]:
    """`Store.purge`'s ``states`` as JobStates, each one of `FINISHED_STATES`."""
    if isinstance(states, str | bytes) or not isinstance(states, Collection):
        raise TypeError(f"states must be a collection of job states, got {states!r}")
    chosen = set()
    for state in states:
        try:
            value = JobState(state)
        except ValueError:
            raise ValueError(f"unknown job state {state!r}") from None
        if value not in FINISHED_STATES:
            raise ValueError(f"only finished jobs can be purged, not {value.value!r} ones")
        chosen.add(value)
    return frozenset(chosen)


def check_text(name: str, value: object, *, max_chars: int = 200) -> str:
    """``value`` as a non-empty name every store can keep (UTF-8, no NUL, at most ``max_chars``).

    `TypeError` if it is not a string, `ValueError` naming ``name`` otherwise: a name is
    refused rather than escaped, since a caller looks jobs up by it.
    """
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {type(value).__name__}")
    shown = repr(value) if len(value) <= 60 else f"{value[:60]!r}..."
    if not value.strip():
        raise ValueError(f"{name} must be a non-empty name, got {shown}")
    if "\x00" in value:
        raise ValueError(f"{name} must not contain NUL, got {shown}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{name} must be valid UTF-8 text (no lone surrogates)") from None
    if len(value) > max_chars:
        raise ValueError(f"{name} is {len(value)} characters, over the limit of {max_chars}")
    return value


def check_job_id(job_id: object) -> bool:
    """Whether a job could have ``job_id``; `TypeError` if it is not an int.

    An int outside a 64-bit column's range names no job (False), like any unknown id:
    `Store.get` returns None for it, `Store.requeue` False, `Store.cancel` NOT_FOUND.
    """
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        raise TypeError(f"job id must be an int, got {job_id!r}")
    return -(2**63) <= job_id < 2**63


def check_max_payload_bytes(value: object) -> int:
    """A store's ``max_payload_bytes``: an int from 1 up; `TypeError` / `ValueError`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_payload_bytes must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"max_payload_bytes must be at least 1, got {value}")
    return value


@dataclass(frozen=True)
class WorkerRow:
    """`Store.record_worker`'s arguments once checked (see `check_worker`)."""

    worker_id: str
    host: str
    pid: int
    state: str
    started_at: float
    jobs_held: int
    ttl: float


def check_worker(
    worker_id: object,
    *,
    host: object,
    pid: object,
    state: object,
    started_at: object,
    jobs_held: object,
    ttl: object,
) -> WorkerRow:
    """Validate `Store.record_worker`'s arguments; shared so every store refuses alike."""
    seconds = check_time("ttl", ttl)
    if seconds <= 0:
        raise ValueError(f"ttl must be positive, got {seconds}")
    return WorkerRow(
        check_text("worker_id", worker_id),
        check_text("host", host),
        _check_count("pid", pid),
        check_text("state", state, max_chars=40),
        check_time("started_at", started_at),
        _check_count("jobs_held", jobs_held),
        seconds,
    )


def _check_count(name: str, value: object) -> int:
    """An int between 0 and 2**31 - 1 (what every store's integer column holds)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if not 0 <= value <= _MAX_INT32:
        raise ValueError(f"{name} must be between 0 and {_MAX_INT32}, got {value}")
    return value


def prepare_enqueue(
    now: float,
    task: object,
    payload: JsonValue = None,
    *,
    run_at: object = None,
    delay: object = None,
    max_attempts: object = DEFAULT_MAX_ATTEMPTS,
    timeout: object = None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> NewJob:
    """Validate `Store.enqueue` arguments; shared by every store so they refuse alike."""
    name = check_text("task", task)
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
        raise TypeError(f"max_attempts must be an int, got {max_attempts!r}")
    if not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT:
        raise ValueError(
            f"max_attempts must be between 1 and {MAX_ATTEMPTS_LIMIT}, got {max_attempts}"
        )
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
    limit = check_timeout(timeout)
    return NewJob(name, encode_payload(payload, max_payload_bytes), when, max_attempts, limit)


def prepare_many(
    now: float,
    jobs: Sequence[Mapping[str, Any]],
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> list[NewJob]:
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
            prepared.append(prepare_enqueue(now, **dict(spec), max_payload_bytes=max_payload_bytes))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"job #{index}: {exc}") from exc
    return prepared


def check_owner(owner: object) -> str:
    """``owner`` as a storable, non-empty name (`check_text`), or `TypeError` / `ValueError`."""
    return check_text("owner", owner)


def check_lease(lease: object) -> float:
    """``lease`` as a positive finite number of seconds, or `TypeError` / `ValueError`."""
    seconds = check_time("lease", lease)
    if seconds <= 0:
        raise ValueError(f"lease must be positive, got {seconds}")
    return seconds


def check_limit(limit: object) -> int:
    """``limit`` as an int from 1 to 2**31 - 1, or `TypeError` / `ValueError`."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int, got {limit!r}")
    if not 1 <= limit <= _MAX_INT32:
        raise ValueError(f"limit must be between 1 and {_MAX_INT32}, got {limit}")
    return limit


def check_share_limit(limit: object) -> int:
    """`Store.settle_and_claim`'s ``limit``: 0 (settle only) or what `check_limit` accepts."""
    if limit == 0 and isinstance(limit, int) and not isinstance(limit, bool):
        return 0
    return check_limit(limit)


def check_share(items: Sequence[object], owner: object, lease: object, limit: object) -> int | None:
    """`Store.settle_and_claim`'s checks: how many jobs to claim, or None if nothing to do.

    ``owner`` and ``lease`` are checked only when there is something to claim; None means
    no items and nothing to claim (``limit=0``).
    """
    count = check_share_limit(limit)
    if count:
        check_owner(owner)
        check_lease(lease)
    elif not items:
        return None
    return count


def new_token(owner: str) -> str:
    """A fencing token unique to one claim; the owner prefix is for humans reading logs.

    128 random bits as 32 hex digits, like ``uuid.uuid4().hex`` but a fifth of its cost
    (no UUID object): one is made for every job claimed.
    """
    return f"{owner}:{os.urandom(16).hex()}"


def cancelled_reason(how: str) -> str:
    """The ``last_error`` of a job a store itself turned cancelled (``how`` says when)."""
    return f"cancelled: a cancel was requested while it ran, {how}"


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


def backoff(first: float, attempt: int, cap: float = math.inf) -> float:
    """Seconds to wait before retry ``attempt`` (1, 2, ...) of a failed transaction.

    ``first`` doubled at each attempt, at most ``cap``, times a random factor in [1, 2)
    (jitter, not crypto) so that clients that failed together do not retry in step.
    """
    return min(first * 2.0 ** (attempt - 1), cap) * (1 + random.random())


class Store(Protocol):
    """What a worker needs from a store. Every method is one transaction and thread-safe.

    The contract is written here once: the stores of this package subclass the protocol
    and inherit these docstrings; a store's own docstring on a method says only what
    differs on that store. A store of one's own may subclass it too, or just match it.
    """

    def enqueue(
        self,
        task: str,
        payload: JsonValue = None,
        *,
        run_at: float | None = None,
        delay: float | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | None = None,
    ) -> int:
        """Add a job and return its id; a bad payload or argument writes nothing.

        ``timeout``: seconds its handler may run per attempt (the worker enforces it).
        A payload over the store's ``max_payload_bytes`` raises `ValueError`.
        """
        ...

    def enqueue_many(self, jobs: Sequence[Mapping[str, Any]]) -> list[int]:
        """Add several jobs (each a mapping of `enqueue`'s arguments) in one transaction."""
        ...

    def claim(self, owner: str, *, lease: float, limit: int = 1) -> list[Claim]:
        """Take up to ``limit`` due jobs, oldest ``run_at`` first (ties by id), under a lease.

        Due means queued with ``run_at <= now``, or running with an expired lease
        (``lease_until <= now``). An expired job whose attempts are spent is marked failed
        instead of being returned, and one with a cancel request is marked cancelled.
        """
        ...

    def complete(self, claim: Claim, result: JsonValue = None) -> bool:
        """Mark the job done with ``result``; False (no change) if the lease was lost.

        ``result`` must pass `~patterns.jobqueue.stores.protocol.encode_result` (JSON, within
        ``max_payload_bytes``), or `TypeError` / `ValueError` is raised and nothing changes.
        """
        ...

    def fail(self, claim: Claim, error: str) -> bool:
        """Mark the job failed for good with ``error``; False if the lease was lost.

        Every method taking an ``error`` stores `~.storable_error` of
        it: it never raises because of the text.
        """
        ...

    def retry(self, claim: Claim, error: str, *, run_at: float) -> bool:
        """Queue the job again at ``run_at``, keeping the attempt; False if the lease was lost.

        A job with a cancel request ends cancelled instead (it would never run again).
        """
        ...

    def release(self, claim: Claim) -> bool:
        """Return an interrupted job unchanged: attempt given back, original ``run_at``.

        False if the lease was lost. A job with a cancel request ends cancelled instead (it
        would never run again).
        """
        ...

    def settle_many(self, items: Sequence[Settlement]) -> list[bool | Exception]:
        """Record several outcomes in one transaction; one entry per item, in order.

        Each entry means what the single-job method returns: True applied, False refused
        by fencing (that claim alone; the others still apply). Each item is checked
        before the transaction, as its single-job method checks its arguments
        (`~patterns.jobqueue.stores.protocol.prepare_settlement`): one the store refuses there (a
        result `~patterns.jobqueue.stores.protocol.encode_result` rejects, a bad ``run_at``, not a
        `~patterns.jobqueue.stores.protocol.Settlement`) is its exception, is never written, and
        the others still apply. The rest apply in order, each fenced alone and doing
        exactly what its single-job method does; so of two items for one claim, the first
        applies and the second is False. A failure of the transaction itself raises, as a
        single call would: nothing applied, or, for a commit whose outcome is unknown
        (`~patterns.jobqueue.stores.protocol.CommitUnknown` on PostgreSQL), any of it may have. An
        empty list is a no-op: no transaction, nothing raised.
        """
        ...

    def settle_and_claim(
        self, items: Sequence[Settlement], owner: str, *, lease: float, limit: int
    ) -> tuple[list[bool | Exception], list[Claim]]:
        """`settle_many` then `claim`, in ONE transaction: the outcomes and the next claims.

        The answers mean exactly what ``settle_many(items)`` followed by
        ``claim(owner, lease=lease, limit=limit)`` would return; a worker that freed
        slots pays one commit (one fsync at ``synchronous=FULL``) for both. ``limit=0``
        settles only. ``owner``, ``lease`` and ``limit`` are checked before anything is
        written. A failure of the transaction raises as
        `settle_many` does: nothing applied and nothing claimed, or, for a commit whose
        outcome is unknown, any of it may have.

        A store that cannot join a claim to that transaction claims nothing
        (`~patterns.jobqueue.stores.protocol.settle_only`): the worker's claiming thread then claims
        for the freed slots.
        """
        ...

    def mark_cancelled(self, claim: Claim, reason: str) -> bool:
        """End a running job as cancelled (its handler stopped on a cancel request).

        ``reason`` is kept as its ``last_error``; False if the lease was lost.
        """
        ...

    def renew(self, claim: Claim, *, lease: float) -> Claim | None:
        """Extend the lease; the renewed claim, or None if the lease was lost.

        Touches the lease only (never reads the payload). The returned claim carries the
        same ``job`` snapshot, the new ``lease_until`` and ``cancel_requested``.
        """
        ...

    def get(self, job_id: int) -> Job | None:
        """The job with this id, or None."""
        ...

    def list_jobs(
        self, *, state: JobState | str | None = None, task: str | None = None, limit: int = 50
    ) -> list[Job]:
        """Up to ``limit`` jobs, newest (highest id) first, filtered by state and task."""
        ...

    def requeue(self, job_id: int) -> bool:
        """Put a failed job back in the queue, due now, its attempts reset to 0.

        Its ``last_error`` is kept. False (no change) if the job is missing or not failed.
        """
        ...

    def requeue_failed(self, *, task: str | None = None) -> list[int]:
        """`requeue` every failed job (of ``task``) in one transaction; their ids, ascending."""
        ...

    def cancel(self, job_id: int) -> CancelResult:
        """Cancel a job: a queued one never runs; a running one gets ``cancel_requested``."""
        ...

    def counts(self) -> dict[str, int]:
        """Number of jobs in each state, every state present (zero included)."""
        ...

    def next_due(self) -> float | None:
        """When the next job becomes claimable (a run_at or a lease expiry); None if never."""
        ...

    def purge(
        self, *, older_than: float | None = None, states: Collection[str] = FINISHED_STATES
    ) -> int:
        """Delete finished jobs in ``states`` (updated before ``older_than``); how many.

        ``states`` may name only finished states (`~.check_states`).
        """
        ...

    def record_worker(
        self,
        worker_id: str,
        *,
        host: str,
        pid: int,
        state: str,
        started_at: float,
        jobs_held: int,
        ttl: float,
    ) -> None:
        """Insert or update this worker's row; ``last_seen`` is now, it expires ``ttl`` later."""
        ...

    def forget_worker(self, worker_id: str) -> None:
        """Delete this worker's row (a worker that stopped); no error if there is none."""
        ...

    def workers(self) -> list[WorkerRecord]:
        """The live workers' rows (not yet expired), oldest ``started_at`` first."""
        ...

    def clock(self) -> float:
        """The store's time now, in seconds since the epoch: the time of ``run_at`` and leases.

        A worker computes a retry's ``run_at`` with it. The local stores return their
        constructor's ``clock`` (`time.time` by default);
        `~.PostgresStore` returns the database's time. Never
        raises, not even after `close`.
        """
        ...

    def subscribe(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Call ``callback()`` whenever a job may have become due; return an unsubscribe.

        It is called after other connections' commits (other processes, other machines)
        that may have made a job due, perhaps also when none did: a worker then claims and
        finds nothing. ``callback`` must return quickly and not call back into the store
        (``Worker.wake`` is the intended one). A store without notifications (memory, or
        SQLite with ``watch_interval=0``) never calls it and returns an unsubscribe that
        does nothing: a worker on such a store finds new jobs at its next poll. Raises
        `RuntimeError` once the store is closed.
        """
        ...

    def close(self) -> None:
        """Release the store's resources; idempotent."""
        ...


class SingleOutcomes(Store):
    """The five single-job outcome methods of `Store`, on one method a store provides.

    `Store.complete`, `Store.fail`, `Store.retry`, `Store.release` and
    `Store.mark_cancelled` check their arguments alike on every store (a result through
    `encode_result`, an error through `storable_error`, a retry's ``run_at`` through
    `check_time`), then apply one outcome in its own transaction, fenced by the claim's
    token: ``_settle_one(claim, kind, text, when)``, which a store subclassing this
    implements (``text`` and ``when`` as `prepare_settlement` returns them).
    """

    _max_payload_bytes: int

    def _settle_one(self, claim: Claim, kind: Settle, text: str | None, when: float) -> bool:
        """Apply one checked outcome in its own transaction; False if the lease is gone."""
        raise NotImplementedError

    def complete(self, claim: Claim, result: JsonValue = None) -> bool:
        text = None if result is None else encode_result(result, self._max_payload_bytes)
        return self._settle_one(claim, Settle.COMPLETE, text, 0.0)

    def fail(self, claim: Claim, error: str) -> bool:
        return self._settle_one(claim, Settle.FAIL, storable_error(error), 0.0)

    def retry(self, claim: Claim, error: str, *, run_at: float) -> bool:
        when = check_time("run_at", run_at)
        return self._settle_one(claim, Settle.RETRY, storable_error(error), when)

    def release(self, claim: Claim) -> bool:
        return self._settle_one(claim, Settle.RELEASE, None, 0.0)

    def mark_cancelled(self, claim: Claim, reason: str) -> bool:
        return self._settle_one(claim, Settle.CANCEL, storable_error(reason), 0.0)


class StoreBase(SingleOutcomes):
    """``SingleOutcomes``, and `Store.enqueue` and `Store.record_worker`, written once.

    Both take many arguments that every store checks alike, so the stores share them too:
    ``enqueue`` hands ``_enqueue`` its arguments as one mapping (what `prepare_enqueue`
    takes, like an item of `Store.enqueue_many`), and ``record_worker`` hands
    ``_record_worker`` the `WorkerRow` that `check_worker` returns. A store subclassing
    this implements those two, and ``_settle_one``.
    """

    def _enqueue(self, spec: Mapping[str, Any]) -> int:
        """Check ``spec`` with `prepare_enqueue`, insert the job, and return its id."""
        raise NotImplementedError

    def _record_worker(self, row: WorkerRow) -> None:
        """Insert or update the worker's row, checked, in its own transaction."""
        raise NotImplementedError

    def enqueue(
        self,
        task: str,
        payload: JsonValue = None,
        *,
        run_at: float | None = None,
        delay: float | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | None = None,
    ) -> int:
        return self._enqueue(
            {
                "task": task,
                "payload": payload,
                "run_at": run_at,
                "delay": delay,
                "max_attempts": max_attempts,
                "timeout": timeout,
            }
        )

    def record_worker(
        self,
        worker_id: str,
        *,
        host: str,
        pid: int,
        state: str,
        started_at: float,
        jobs_held: int,
        ttl: float,
    ) -> None:
        self._record_worker(
            check_worker(
                worker_id,
                host=host,
                pid=pid,
                state=state,
                started_at=started_at,
                jobs_held=jobs_held,
                ttl=ttl,
            )
        )


def prepare_settlement(
    item: object, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
) -> tuple[Settle, str | None, float]:
    """Check one `Settlement` as its single-job method would, before any transaction.

    Returns ``(kind, text, run_at)``: ``text`` is the result's JSON (COMPLETE, None for a
    None result), or the `storable_error` of the error (FAIL, RETRY, CANCEL), or None
    (RELEASE); ``run_at`` is the checked time of a RETRY (0.0 otherwise). Raises
    `TypeError` / `ValueError` naming the problem, the item's own exception in
    `Store.settle_many`: not a Settlement, an unknown kind, a claim that is not a `Claim`,
    a result `encode_result` refuses, a bad ``run_at``.
    """
    if not isinstance(item, Settlement):
        raise TypeError(f"settle_many takes Settlement items, got {type(item).__name__}")
    try:
        kind = Settle(item.kind)
    except ValueError:
        choices = ", ".join(k.value for k in Settle)
        raise ValueError(f"unknown settlement kind {item.kind!r} (one of {choices})") from None
    if not isinstance(item.claim, Claim):
        raise TypeError(f"a settlement's claim must be a Claim, got {type(item.claim).__name__}")
    if kind is Settle.COMPLETE:
        text = None if item.result is None else encode_result(item.result, max_bytes)
        return kind, text, 0.0
    if kind is Settle.RELEASE:
        return kind, None, 0.0
    when = check_time("run_at", item.run_at) if kind is Settle.RETRY else 0.0
    return kind, storable_error(item.error), when


def settle_each(store: Store, items: Sequence[Settlement]) -> list[bool | Exception]:
    """`Store.settle_many`'s meaning, one single-job call (one transaction) per item.

    Not atomic across items: a store error part-way raises with the earlier items applied.
    """
    done: list[bool | Exception] = []
    for item in items:
        claim = item.claim
        try:
            if item.kind is Settle.COMPLETE:
                done.append(store.complete(claim, item.result))
            elif item.kind is Settle.FAIL:
                done.append(store.fail(claim, item.error))
            elif item.kind is Settle.RETRY:
                done.append(store.retry(claim, item.error, run_at=item.run_at))
            elif item.kind is Settle.RELEASE:
                done.append(store.release(claim))
            else:
                done.append(store.mark_cancelled(claim, item.error))
        except (TypeError, ValueError) as exc:  # the item's own data, not the store
            done.append(exc)
    return done


def settle_only(
    store: Store, items: Sequence[Settlement], owner: str, *, lease: float, limit: int
) -> tuple[list[bool | Exception], list[Claim]]:
    """`Store.settle_and_claim` for a store whose claim cannot join its outcomes' transaction.

    Checks ``owner``, ``lease`` and ``limit`` as the shared transaction does, records the
    outcomes with `Store.settle_many`, and claims nothing: a worker frees the slots it had
    reserved for the claims, and its claiming thread claims for them in a transaction of
    its own.
    """
    count = check_share_limit(limit)
    if count:
        check_owner(owner)
        check_lease(lease)
    return store.settle_many(items), []
