"""The `Store` protocol: what a store does, in the two parts its callers need.

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

Fencing: a claim returns a `~.Claim` whose ``token`` is unique to that claim. complete, fail,
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
``max_payload_bytes`` bytes of it (`~.DEFAULT_MAX_PAYLOAD_BYTES`, 1 MiB, a store constructor
argument); ``max_attempts`` at most `~.MAX_ATTEMPTS_LIMIT`; every time in seconds
within +-`~.MAX_SECONDS`. An error text is stored through `~.storable_error`: lone
surrogates and NUL escaped, at most `~.MAX_ERROR_CHARS`.
A name (task, owner, worker) is refused instead (`~.check_text`): no NUL, no lone surrogate,
at most 200 characters. `Store.renew` never reads the payload, whatever its size.

Two callers, two parts. A worker claims, settles, renews and keeps its row: `WorkerStore`.
An operator (the ``jobqueue`` command, a dashboard, a script) adds jobs, looks at them and
acts on them: `OperatorStore`. Both enqueue, count the jobs by state and read the store's
clock (`SharedStore`, the base of both). `Store` is both, the protocol the stores of this
package implement; `~.Worker` takes a `WorkerStore`, so a store written only for a worker
implements that part alone (``tests/jobqueue/test_worker_store.py`` runs a worker on one),
and the command line takes a `Store`.

======================  ============================================================
part                    methods
======================  ============================================================
`SharedStore`           ``enqueue``, ``counts``, ``clock``
`WorkerStore`           ``claim``, ``settle_many``, ``settle_and_claim``, ``complete``,
                        ``fail``, ``retry``, ``release``, ``mark_cancelled``,
                        ``renew``, ``next_due``, ``subscribe``, ``record_worker``,
                        ``forget_worker``
`OperatorStore`         ``enqueue_many``, ``get``, ``list_jobs``, ``requeue``,
                        ``requeue_failed``, ``cancel``, ``purge``, ``workers``,
                        ``close``
======================  ============================================================

What the protocol's methods take and return is in `~patterns.jobqueue.stores.records`
(`~.Job`, `~.Claim`, `~.Settlement`, ...); the argument checks every store makes before
it writes are in `~patterns.jobqueue.stores.checks`; the code the stores of this package
share (their base class `~.StoreBase`, and `~.settle_each` / `~.settle_only` for a store
of one's own) is in `~patterns.jobqueue.stores.base`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Protocol

from patterns.jobqueue.stores.records import (
    DEFAULT_MAX_ATTEMPTS,
    FINISHED_STATES,
    CancelResult,
    Claim,
    Job,
    JobState,
    JsonValue,
    Settlement,
    WorkerRecord,
)

__all__ = ["OperatorStore", "SharedStore", "Store", "WorkerStore"]


class SharedStore(Protocol):
    """The methods a worker and an operator both call: enqueue, count, read the clock.

    Every method of every part is one transaction and thread-safe. The contract is written
    here once: the stores of this package subclass `Store` and inherit these docstrings; a
    store's own docstring on a method says only what differs on that store. A store of
    one's own may subclass a part too, or just match it.
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

    def counts(self) -> dict[str, int]:
        """Number of jobs in each state, every state present (zero included)."""
        ...

    def clock(self) -> float:
        """The store's time now, in seconds since the epoch: the time of ``run_at`` and leases.

        A worker computes a retry's ``run_at`` with it. The local stores return their
        constructor's ``clock`` (`time.time` by default);
        `~.PostgresStore` returns the database's time. Never
        raises, not even after `close`.
        """
        ...


class WorkerStore(SharedStore, Protocol):
    """What a `~.Worker` needs from a store: claim, settle, renew, wait, keep its row.

    The worker and its parts call only these (and `SharedStore`'s); a store written for a
    worker alone implements this part, and `Store` is this and `OperatorStore` together.
    """

    def claim(self, owner: str, *, lease: float, limit: int = 1) -> list[Claim]:
        """Take up to ``limit`` due jobs, oldest ``run_at`` first (ties by id), under a lease.

        Due means queued with ``run_at <= now``, or running with an expired lease
        (``lease_until <= now``). An expired job whose attempts are spent is marked failed
        instead of being returned, and one with a cancel request is marked cancelled.
        """
        ...

    def settle_many(self, items: Sequence[Settlement]) -> list[bool | Exception]:
        """Record several outcomes in one transaction; one entry per item, in order.

        Each entry means what the single-job method returns: True applied, False refused
        by fencing (that claim alone; the others still apply). Each item is checked
        before the transaction, as its single-job method checks its arguments
        (`~patterns.jobqueue.stores.checks.prepare_settlement`): one the store refuses there (a
        result `~patterns.jobqueue.stores.checks.encode_result` rejects, a bad ``run_at``, not a
        `~patterns.jobqueue.stores.records.Settlement`) is its exception, is never written, and
        the others still apply. The rest apply in order, each fenced alone and doing
        exactly what its single-job method does; so of two items for one claim, the first
        applies and the second is False. A failure of the transaction itself raises, as a
        single call would: nothing applied, or, for a commit whose outcome is unknown
        (`~patterns.jobqueue.stores.records.CommitUnknown` on PostgreSQL), any of it may have. An
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
        (`~patterns.jobqueue.stores.base.settle_only`): the worker's claiming thread then claims
        for the freed slots.
        """
        ...

    def complete(self, claim: Claim, result: JsonValue = None) -> bool:
        """Mark the job done with ``result``; False (no change) if the lease was lost.

        ``result`` must pass `~patterns.jobqueue.stores.checks.encode_result` (JSON, within
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

    def next_due(self) -> float | None:
        """When the next job becomes claimable (a run_at or a lease expiry); None if never."""
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


class OperatorStore(SharedStore, Protocol):
    """What an operator needs from a store: add jobs, look at them, act on them, close it.

    The command line calls only these (and `SharedStore`'s): a dashboard or a script that
    never runs a job needs no more.
    """

    def enqueue_many(self, jobs: Sequence[Mapping[str, Any]]) -> list[int]:
        """Add several jobs (each a mapping of `enqueue`'s arguments) in one transaction."""
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

    def purge(
        self, *, older_than: float | None = None, states: Collection[str] = FINISHED_STATES
    ) -> int:
        """Delete finished jobs in ``states`` (updated before ``older_than``); how many.

        ``states`` may name only finished states (`~.check_states`).
        """
        ...

    def workers(self) -> list[WorkerRecord]:
        """The live workers' rows (not yet expired), oldest ``started_at`` first."""
        ...

    def close(self) -> None:
        """Release the store's resources; idempotent."""
        ...


class Store(WorkerStore, OperatorStore, Protocol):
    """A whole store: what a worker needs and what an operator needs, every method below.

    `~.MemoryStore`, `~.SQLiteStore` and `~.PostgresStore` implement it (and subclass it,
    through `~.StoreBase`); the command line takes one, since it both runs a worker and
    acts on jobs. Each method is documented once, here, whichever part it belongs to.
    """
