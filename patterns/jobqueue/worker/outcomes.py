"""A job's outcome: how the worker settled one claim, and the decision when it did not complete.

TL;DR: `~patterns.jobqueue.worker.worker.Outcome` names how the worker settled one claimed job (one
per claim); `ClaimState` says where a claim the worker holds is until then. ``decide(job,
text, policy, fallback)`` asks the task's policy (its failure or its unreadiness policy),
falls back when the policy raises or returns neither `~patterns.jobqueue.tasks.Retry` nor
`~patterns.jobqueue.tasks.Fail`, and turns a ``Retry`` on the job's last attempt into a
``Fail``. The worker then makes the one store call that carries the decision out, and calls
the task's hook.

Guarantees:
    * A decision is always made: a policy that fails is replaced by ``fallback``, a
      fallback that fails too by ``Fail``, and the error is handed back for the worker to
      report.
    * No job is requeued past its ``max_attempts``.

Python: 3.11+; checked on CPython 3.11.7, 3.12.1 and 3.13.0.

Docs: docs/jobqueue/design.md (one job's life, in qdolor's order).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from types import MappingProxyType

from patterns.jobqueue.stores.records import Job
from patterns.jobqueue.tasks import Backoff, Decision, Fail, Retry

__all__ = ["CLAIM_MOVES", "DEFAULT_POLICY", "ClaimState", "Outcome", "decide"]

DEFAULT_POLICY = Backoff()  # decides when a task's own failure policy raised


class Outcome(enum.StrEnum):
    """How the worker settled one claimed job: exactly one of these per claim."""

    # Users import it from, and the docs document it with, the worker's module.
    __module__ = "patterns.jobqueue.worker.worker"

    DONE = "done"  # store.complete accepted
    RETRIED = "retried"  # store.retry accepted: queued again later, attempt counted
    FAILED = "failed"  # store.fail accepted (failed for good, or abandoned as not ready)
    RELEASED = "released"  # store.release accepted: interrupted or never started
    LOST = "lost"  # the store refused: another claim holds the lease now (fencing)
    UNSETTLED = "unsettled"  # every store call raised: the lease will expire, it runs again
    UNKNOWN = "unknown"  # the commit's outcome is unknown (the connection broke in COMMIT)
    CANCELLED = "cancelled"  # store.mark_cancelled accepted: its handler stopped on a cancel


class ClaimState(enum.StrEnum):
    """Where one held claim is; every change goes through ``ClaimLedger.move``."""

    WAITING = "waiting"  # handed off, no handler yet; the heartbeat renews its lease
    RUNNING = "running"  # its handler runs; the heartbeat renews, or cancels it if lost
    SETTLING = "settling"  # its outcome is handed to the settler; renewed until committed
    LOST = "lost"  # its lease was lost before it started: it will not run


# The only moves a claim makes (`Worker._transition` checks each against this table).
CLAIM_MOVES: Mapping[ClaimState, frozenset[ClaimState]] = MappingProxyType(
    {
        ClaimState.WAITING: frozenset({ClaimState.RUNNING, ClaimState.LOST}),
        ClaimState.RUNNING: frozenset({ClaimState.SETTLING}),
        ClaimState.SETTLING: frozenset(),
        ClaimState.LOST: frozenset(),
    }
)


def decide(
    job: Job,
    text: str,
    policy: Callable[[], object] | None,
    fallback: Callable[[], Decision],
) -> tuple[Decision, Exception | None]:
    """The decision for ``job``, and the error of its ``policy`` if it failed.

    ``policy`` decides; ``fallback`` does when it is None, raises, or returns neither a
    `~patterns.jobqueue.tasks.Retry` nor a `~patterns.jobqueue.tasks.Fail`. ``text`` says
    why the job did not complete, for the ``Fail`` reason of a job whose attempts are spent.
    """
    error: Exception | None = None
    if policy is None:
        decision, error = _fallback(fallback, text)
    else:
        try:
            decision = _checked(policy())
        except Exception as exc:  # noqa: BLE001 - handed back to be reported
            decision, _ = _fallback(fallback, text)
            error = exc
    if isinstance(decision, Retry) and job.attempts >= job.max_attempts:
        decision = Fail(f"{text} (attempt {job.attempts} of {job.max_attempts}: none left)")
    return decision, error


def _fallback(fallback: Callable[[], Decision], text: str) -> tuple[Decision, Exception | None]:
    # The last resort must not raise either: a job nobody can decide about fails, with the
    # reason, instead of killing the handler thread and staying `running` for ever.
    try:
        return _checked(fallback()), None
    except Exception as exc:  # noqa: BLE001 - handed back to be reported
        return Fail(f"{text} (no policy could decide: {type(exc).__name__}: {exc})"), exc


def _checked(decision: object) -> Decision:
    if not isinstance(decision, Retry | Fail):
        raise TypeError(f"a policy must return Retry or Fail, got {decision!r}")
    return decision
