"""The worker's option checks: counts and seconds, alone and against each other.

TL;DR: ``Worker(...)`` calls `check_counts` (``concurrency``, ``prefetch``; it returns the
prefetch to use, None meaning ``PREFETCH_PER_THREAD`` per handler thread) and `check_times` (every
interval) before it builds anything, and `seconds` for each budget handed to a call
(``stop(timeout)``, ``wait_stop_requested(timeout)``); `split_budget` divides a stop's
budget between DRAINING and CANCELLING.

Pattern:
    The project's one rule for seconds (docs/design.md, "Seconds are checked one way
    everywhere"), as each pattern module applies it to its own arguments: a number of
    seconds, not a bool or a str, not nan, not negative, else a `ValueError` naming the
    argument; ``inf`` and huge values mean "as long as it takes" where a wait takes them.

Guarantees:
    * Nothing the worker would misuse gets past construction: a count that is not an int
      in range is a `TypeError` or `ValueError` naming it; an interval a `ValueError`
      naming it, as is a ``cancel_timeout`` above ``stop_timeout`` or a heartbeat
      interval not shorter than the lease.
    * No `OverflowError`: an int too large for a float is ``inf``; the lease (written to
      the store) is kept within `~patterns.jobqueue.stores.records.MAX_SECONDS`.

See also: ``patterns.jobqueue.worker.worker`` (the arguments, documented on
`~patterns.jobqueue.worker.worker.Worker`), ``tests/test_contract_seconds.py``.
"""

from __future__ import annotations

import math

from patterns.jobqueue.stores.checks import check_time

__all__ = [
    "MAX_THREADS",
    "PREFETCH_PER_THREAD",
    "check_counts",
    "check_times",
    "positive",
    "seconds",
    "split_budget",
]

MAX_THREADS = 10_000  # more handler threads (or prefetched claims) than this is a mistake
# The default prefetch per handler thread: Celery's default prefetch multiplier. Four lets
# one claim take a batch big enough that its commit costs little per job (docs/jobqueue/
# performance.md); each of those jobs waits in this worker, out of other workers' reach.
PREFETCH_PER_THREAD = 4


def check_counts(concurrency: object, prefetch: object) -> int:
    """``concurrency`` an int in 1..`MAX_THREADS`, ``prefetch`` one in 0..`MAX_THREADS` or None.

    Returns the prefetch to use: ``prefetch`` itself, or, when it is None (the default),
    ``PREFETCH_PER_THREAD`` claims waiting behind each handler thread, at most ``MAX_THREADS``.
    """
    threads = _count("concurrency", concurrency, least=1)
    if prefetch is None:
        return min(PREFETCH_PER_THREAD * threads, MAX_THREADS)
    return _count("prefetch", prefetch, least=0)


def _count(name: str, value: object, *, least: int) -> int:
    """``value`` if it is an int in ``least``..`MAX_THREADS`, else an error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < least:
        which = "at least 1" if least else "not negative"
        raise ValueError(f"{name} must be {which}, got {value}")
    if value > MAX_THREADS:
        raise ValueError(f"{name} must be at most {MAX_THREADS}, got {value}")
    return value


def seconds(value: object, name: str) -> float:
    """``value`` as seconds >= 0; bool, str, nan or negative: `ValueError` naming ``name``.

    ``inf`` and huge values are kept and mean "as long as it takes": every wait the worker
    makes with them is capped at `threading.TIMEOUT_MAX`, so no `OverflowError` escapes.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        # ValueError, not TypeError: one error for every bad budget (docs/design.md).
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")  # noqa: TRY004
    try:
        result = float(value)
    except OverflowError:  # an int too large for a float
        result = math.inf
    if not result >= 0:  # nan compares False
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return result


def positive(value: object, name: str) -> float:
    """`seconds`, and not 0 (an interval of 0 would spin)."""
    result = seconds(value, name)
    if result == 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return result


def check_times(
    *,
    poll_interval: object,
    stop_timeout: object,
    cancel_timeout: object,
    lease: object,
    heartbeat_interval: object,
    store_outage_limit: object,
) -> tuple[float, float, float, float | None]:
    """Check every interval alone and against the others.

    Returns the heartbeat interval to use, ``poll_interval``, ``stop_timeout`` and
    ``cancel_timeout`` as floats. ``poll_interval``, ``stop_timeout``, ``cancel_timeout`` and
    ``store_outage_limit`` may be ``inf`` (as long as it takes); the lease is written to
    the store, so it is finite, within `~patterns.jobqueue.stores.records.MAX_SECONDS`.
    """
    poll = positive(poll_interval, "poll_interval")
    stop = seconds(stop_timeout, "stop_timeout")
    cancel = None
    if cancel_timeout is not None:
        cancel = seconds(cancel_timeout, "cancel_timeout")
        if cancel > stop:
            raise ValueError(
                f"cancel_timeout must be between 0 and stop_timeout ({stop}), got {cancel}"
            )
    held = check_time("lease", positive(lease, "lease"))  # the store's limit: finite
    positive(store_outage_limit, "store_outage_limit")
    if heartbeat_interval is None:
        return held / 3, poll, stop, cancel
    beat = positive(heartbeat_interval, "heartbeat_interval")
    if beat >= held:
        # Every lease would lapse between two renewals: each outcome refused, each job
        # run again by another claim until its attempts are spent, then failed.
        raise ValueError(
            f"heartbeat_interval must be shorter than the lease ({held} s), got {beat}"
            " (a third of it is the default)"
        )
    return beat, poll, stop, cancel


def split_budget(
    budget: float, *, stop_timeout: float, cancel_timeout: float | None
) -> tuple[float, float]:
    """``budget`` as (DRAINING, CANCELLING) seconds; inf stays inf (no nan from inf - inf).

    ``cancel_timeout`` None keeps a quarter for CANCELLING; equal to ``stop_timeout``, it
    cancels at once; otherwise its share of ``stop_timeout`` (kept as is when that is inf).
    """
    if cancel_timeout is None:
        share = 0.25
    elif cancel_timeout == stop_timeout > 0:
        share = 1.0  # cancels at once, inf included
    elif math.isinf(stop_timeout):  # a finite part of an endless default: kept as is
        cancel = min(cancel_timeout, budget)
        return (budget - cancel if math.isfinite(budget) else budget), cancel
    else:
        share = cancel_timeout / max(stop_timeout, 1e-9)
    cancel = budget * share if share else 0.0
    if share == 1.0:
        return 0.0, budget
    return (budget - cancel if math.isfinite(budget) else budget), cancel
