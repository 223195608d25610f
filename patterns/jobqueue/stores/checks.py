"""The checks every store makes before it writes, so that every store refuses alike.

A store calls these before its transaction: `prepare_enqueue` and `prepare_many` turn
`~.Store.enqueue` and `~.Store.enqueue_many` arguments into `~.NewJob` rows,
`prepare_settlement` checks one `~.Settlement` as its single-job method would, and the
``check_*`` functions check one argument each, raising `TypeError` or `ValueError` naming
it. The limits are the same on every store: a payload's JSON text, stored as UTF-8, is at
most ``max_payload_bytes`` bytes of it (`encode_payload`, `~.DEFAULT_MAX_PAYLOAD_BYTES`
by default); ``max_attempts`` at most `~.MAX_ATTEMPTS_LIMIT`; every time in seconds
within +-`~.MAX_SECONDS` (`check_time`); a name is refused unless storable (`check_text`);
an error text is made storable instead (`storable_error`).

Also shared, so that no store imports another: the fencing token of a claim
(`new_token`), the ``last_error`` texts a store writes by itself (`cancelled_reason`,
`expired_reason`), and the pause between two attempts of a failed transaction
(`backoff`).
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from patterns.jobqueue.stores.records import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_PAYLOAD_BYTES,
    FINISHED_STATES,
    MAX_ATTEMPTS_LIMIT,
    MAX_ERROR_CHARS,
    MAX_SECONDS,
    Claim,
    JobState,
    JsonValue,
    NewJob,
    Settle,
    Settlement,
    WorkerRow,
)

__all__ = [
    "backoff",
    "cancelled_reason",
    "check_job_id",
    "check_lease",
    "check_limit",
    "check_max_payload_bytes",
    "check_owner",
    "check_share",
    "check_share_limit",
    "check_state",
    "check_states",
    "check_text",
    "check_time",
    "check_timeout",
    "check_worker",
    "encode_payload",
    "encode_result",
    "expired_reason",
    "new_token",
    "prepare_enqueue",
    "prepare_many",
    "prepare_settlement",
    "storable_error",
]

_MAX_INT32 = 2**31 - 1  # the largest pid, jobs_held or limit accepted
_ENQUEUE_KEYS = frozenset({"task", "payload", "run_at", "delay", "max_attempts", "timeout"})

# What json.dumps(payload, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
# runs, built once: json.dumps builds a new encoder at every call made with options, and
# every enqueue makes one. An encoder keeps nothing between calls, so threads share it.
_JSON = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))


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
        text = _JSON.encode(payload)
    except (TypeError, ValueError, RecursionError) as exc:
        raise TypeError(f"job {what} must be JSON-serialisable: {exc}") from exc
    # json.dumps escapes NUL (which PostgreSQL text cannot hold) as \u0000 even without
    # ensure_ascii. A lone surrogate, which UTF-8 cannot encode, can only be inside a JSON
    # string: backslashreplace writes it as the \udXXX escape that json.loads reads back.
    if text.isascii():
        size = len(text)  # one byte a character: the common case, counted without encoding
    else:
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
    """A handler's return value as JSON text for `~.Store.complete`; raises as `encode_payload`."""
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


def check_time(name: str, value: object) -> float:
    """``value`` as a float within +-`~.MAX_SECONDS`; `TypeError` or `ValueError` naming it."""
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
    """`~.Store.purge`'s ``states`` as JobStates, each one of `~.FINISHED_STATES`."""
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
    if not value or value.isspace():  # what `not value.strip()` says, without a copy
        raise ValueError(f"{name} must be a non-empty name, got {_shown(value)}")
    if "\x00" in value:
        raise ValueError(f"{name} must not contain NUL, got {_shown(value)}")
    if not value.isascii():  # ASCII text (most names) is UTF-8 as it is
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{name} must be valid UTF-8 text (no lone surrogates)") from None
    if len(value) > max_chars:
        raise ValueError(f"{name} is {len(value)} characters, over the limit of {max_chars}")
    return value


def _shown(value: str) -> str:
    """A name as an error message shows it: its repr, cut after 60 characters."""
    return repr(value) if len(value) <= 60 else f"{value[:60]!r}..."


def check_job_id(job_id: object) -> bool:
    """Whether a job could have ``job_id``; `TypeError` if it is not an int.

    An int outside a 64-bit column's range names no job (False), like any unknown id:
    `~.Store.get` returns None for it, `~.Store.requeue` False, `~.Store.cancel` NOT_FOUND.
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
    """Validate `~.Store.record_worker`'s arguments; shared so every store refuses alike."""
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
    """Validate `~.Store.enqueue` arguments; shared by every store so they refuse alike."""
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
    """Validate every `~.Store.enqueue_many` entry before any is written."""
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
    """`~.Store.settle_and_claim`'s ``limit``: 0 (settle only) or what `check_limit` accepts."""
    if limit == 0 and isinstance(limit, int) and not isinstance(limit, bool):
        return 0
    return check_limit(limit)


def check_share(items: Sequence[object], owner: object, lease: object, limit: object) -> int | None:
    """`~.Store.settle_and_claim`'s checks: how many jobs to claim, or None if nothing to do.

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


def prepare_settlement(
    item: object, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
) -> tuple[Settle, str | None, float]:
    """Check one `~.Settlement` as its single-job method would, before any transaction.

    Returns ``(kind, text, run_at)``: ``text`` is the result's JSON (COMPLETE, None for a
    None result), or the `storable_error` of the error (FAIL, RETRY, CANCEL), or None
    (RELEASE); ``run_at`` is the checked time of a RETRY (0.0 otherwise). Raises
    `TypeError` / `ValueError` naming the problem, the item's own exception in
    `~.Store.settle_many`: not a Settlement, an unknown kind, a claim that is not a `~.Claim`,
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


def backoff(first: float, attempt: int, cap: float = math.inf) -> float:
    """Seconds to wait before retry ``attempt`` (1, 2, ...) of a failed transaction.

    ``first`` doubled at each attempt, at most ``cap``, times a random factor in [1, 2)
    (jitter, not crypto) so that clients that failed together do not retry in step.
    """
    return min(first * 2.0 ** (attempt - 1), cap) * (1 + random.random())
