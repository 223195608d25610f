"""The handlers behind ``python -m patterns.jobqueue demo``, usable with the real CLI too.

``python -m patterns.jobqueue --db jobs.sqlite3 worker --tasks
patterns.jobqueue.cli.demo_tasks:tasks`` runs them. Each one shows a different answer to "what
happens to me when the worker stops":

* ``fast``: done in a moment; it never notices a stop.
* ``slow``: takes a while and ignores its token (plain `time.sleep`, standing in for a
  library call that takes no token). It finishes during the drain if the budget allows.
* ``crunch``: long and cooperative: a checkpoint (``ctx.sleep``) between steps, so the
  CANCELLING phase interrupts it and it goes back to the queue, attempt given back.
* ``flaky``: fails its first attempt(s), then succeeds: a retry with backoff.
* ``doomed``: always fails, so it ends ``failed`` once its attempts are spent.
"""

from __future__ import annotations

import time

from patterns.jobqueue.stores.records import JsonValue
from patterns.jobqueue.tasks import Backoff, JobContext, TaskRegistry

__all__ = ["tasks"]

tasks = TaskRegistry()


def _option(payload: JsonValue, key: str, default: float) -> float:
    """``payload[key]`` as a number; ``default`` for a null payload or a missing key."""
    if payload is None:
        return default
    if not isinstance(payload, dict):
        raise TypeError(f"the payload must be a JSON object or null, got {payload!r}")
    return float(payload.get(key, default))


@tasks.task
def fast(payload: JsonValue, ctx: JobContext) -> str:
    """Return at once."""
    return f"fast {payload}"


@tasks.task
def slow(payload: JsonValue, ctx: JobContext) -> str:
    """Block for ``payload["seconds"]`` (default 0.5) without looking at the token."""
    time.sleep(_option(payload, "seconds", 0.5))
    return "slow done"


@tasks.task
def crunch(payload: JsonValue, ctx: JobContext) -> int:
    """Do ``payload["steps"]`` (20) steps of ``payload["step"]`` (0.1) s, each a checkpoint."""
    steps = int(_option(payload, "steps", 20))
    step = _option(payload, "step", 0.1)
    for _ in range(steps):
        ctx.sleep(step)  # a checkpoint: raises Interrupted on cancel
    return steps


@tasks.task(retry=Backoff(base=0.2, factor=2.0, jitter=0.5))
def flaky(payload: JsonValue, ctx: JobContext) -> str:
    """Fail until attempt ``payload["succeed_on"]`` (default 2), then succeed."""
    if ctx.attempt < _option(payload, "succeed_on", 2):
        raise ConnectionError(f"service unavailable (attempt {ctx.attempt})")
    return f"succeeded on attempt {ctx.attempt}"


@tasks.task(max_attempts=3, retry=Backoff(base=0.1, factor=2.0, jitter=0.5))
def doomed(payload: JsonValue, ctx: JobContext) -> None:
    """Always fail: the job ends ``failed`` with its last error once its attempts are spent."""
    raise ValueError(f"malformed input {payload!r}")
