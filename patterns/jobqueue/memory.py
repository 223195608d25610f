"""An in-process ``Store``: a lock and a dict, for tests, notebooks and the worker's own tests.

TL;DR: ``MemoryStore(clock=...)`` implements every method of the ``Store`` protocol with the
same semantics as ``SQLiteStore``, minus durability; both pass one contract test suite.

Pitfall:
    A "simple" in-memory queue that hands out the live row objects lets a caller mutate a
    job behind the store's back, and a check-then-act claim (read the due jobs, then mark
    them running in a second step) gives the same job to two threads that both read
    before either wrote.

Pattern:
    One lock guards every row; each method (one transition) runs entirely under it, so
    a claim's read and write are one atomic step, like a database transaction. Rows keep
    the payload as JSON text and every read builds a fresh ``Job`` from it, so callers get
    snapshots they cannot use to change the store. A claim does not scan the rows: heaps
    of ``(run_at, id)`` for queued jobs and ``(lease_until, id)`` for leases play the part
    of a database's indexes, with lazy deletion (an entry that no longer matches its row
    is dropped when it reaches the top), so draining n jobs costs O(n log n), not O(n²).

Guarantees:
    * Each method is atomic with respect to every other method of the same store.
    * A job is returned by at most one claim while its lease is live; complete, fail,
      retry, release and renew succeed only for the claim whose token holds the lease.
    * Arguments are checked before anything is written: a bad value raises `ValueError`,
      a value of the wrong type (or a payload that is not JSON) raises `TypeError`, and
      the store is unchanged.
    * After `MemoryStore.close` every method but ``close`` and ``clock`` raises `RuntimeError`.

Python:
    3.11+ (``enum.StrEnum``). Nothing version-specific; checked on CPython 3.11.7, 3.12.1
    and 3.13.0.

Java:
    A ``ConcurrentHashMap`` would not be enough for a claim (it spans several rows); the
    counterpart is a ``synchronized`` repository, or an in-memory H2 database in tests.

See also:
    ``patterns.jobqueue.store`` (the protocol and the state diagram),
    ``patterns.jobqueue.sqlite`` (the durable store with the same contract).

Docs: docs/jobqueue/index.md
"""

from __future__ import annotations

import heapq
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from patterns.jobqueue.store import (
    DEFAULT_MAX_ATTEMPTS,
    Claim,
    Job,
    JobState,
    JsonValue,
    NewJob,
    Store,
    check_lease,
    check_limit,
    check_owner,
    check_time,
    expired_reason,
    new_token,
    prepare_enqueue,
    prepare_many,
)

__all__ = ["MemoryStore"]

logger = logging.getLogger(__name__)


@dataclass
class _Row:
    """One job as the memory store keeps it; mutated only under ``MemoryStore._lock``."""

    id: int
    task: str
    payload_json: str
    state: JobState
    run_at: float
    attempts: int
    max_attempts: int
    lease_owner: str | None
    lease_until: float | None
    last_error: str | None
    created_at: float
    updated_at: float

    def snapshot(self) -> Job:
        # json.loads builds a new payload each time: callers cannot mutate the stored one.
        return Job(
            id=self.id,
            task=self.task,
            payload=json.loads(self.payload_json),
            state=self.state,
            run_at=self.run_at,
            attempts=self.attempts,
            max_attempts=self.max_attempts,
            lease_owner=self.lease_owner,
            lease_until=self.lease_until,
            last_error=self.last_error,
            created_at=self.created_at,
            updated_at=self.updated_at,
        )

    def end_lease(self, state: JobState, now: float) -> None:
        self.state = state
        self.lease_owner = None
        self.lease_until = None
        self.updated_at = now


def _no_op() -> None:
    """The unsubscribe of a store without notifications: there is nothing to undo."""


class MemoryStore:
    """A thread-safe, non-durable ``Store``; ``clock`` supplies every timestamp."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        # Guards _rows, _next_id and _closed. Every public method holds it for its whole
        # transition, so no caller ever sees (or acts on) a half-done transition. Nobody
        # waits on it for long: the only caller code run under it is the clock, which must
        # not call back into the store (the lock is not reentrant).
        self._lock = threading.Lock()
        self._rows: dict[int, _Row] = {}
        self._next_id = 1
        self._closed = False
        # The claim's indexes, guarded by _lock like the rows. An entry is live while its
        # row still matches it; a stale one is skipped (and dropped) when it is reached.
        # _queued: (run_at, id) pushed whenever a row becomes queued.
        # _leases: (lease_until, id) pushed whenever a lease is taken or renewed.
        # _expired: (run_at, id) of running rows whose lease has expired, moved there
        # from _leases by a claim, so they compete with queued rows in run_at order.
        self._queued: list[tuple[float, int]] = []
        self._leases: list[tuple[float, int]] = []
        self._expired: list[tuple[float, int]] = []
        self._stale_leases = 0  # lease entries known stale; _leases is compacted past half

    def __repr__(self) -> str:
        return f"MemoryStore(jobs={len(self._rows)}, closed={self._closed})"

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("MemoryStore is closed")

    def _insert(self, new: NewJob, now: float) -> int:
        job_id = self._next_id
        self._next_id += 1
        self._rows[job_id] = _Row(
            id=job_id,
            task=new.task,
            payload_json=new.payload_json,
            state=JobState.QUEUED,
            run_at=new.run_at,
            attempts=0,
            max_attempts=new.max_attempts,
            lease_owner=None,
            lease_until=None,
            last_error=None,
            created_at=now,
            updated_at=now,
        )
        heapq.heappush(self._queued, (new.run_at, job_id))
        return job_id

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
        with self._lock:
            self._check_open()
            now = self._clock()
            new = prepare_enqueue(
                now, task, payload, run_at=run_at, delay=delay, max_attempts=max_attempts
            )
            job_id = self._insert(new, now)
        logger.debug("enqueued job %d (%s) to run at %.3f", job_id, new.task, new.run_at)
        return job_id

    def enqueue_many(self, jobs: Sequence[Mapping[str, Any]]) -> list[int]:
        """Add several jobs (each a mapping of `enqueue`'s arguments) in one transaction."""
        with self._lock:
            self._check_open()
            now = self._clock()
            prepared = prepare_many(now, jobs)
            ids = [self._insert(new, now) for new in prepared]
        logger.debug("enqueued %d jobs", len(ids))
        return ids

    def claim(self, owner: str, *, lease: float, limit: int = 1) -> list[Claim]:
        """Take up to ``limit`` due jobs, oldest ``run_at`` first (ties by id), under a lease.

        Due means queued with ``run_at <= now``, or running with an expired lease
        (``lease_until <= now``). An expired job whose attempts are spent is marked failed
        instead of being returned.
        """
        check_owner(owner)
        seconds = check_lease(lease)
        count = check_limit(limit)
        claims: list[Claim] = []
        with self._lock:
            self._check_open()
            now = self._clock()
            self._expire_leases(now)
            while len(claims) < count:
                row = self._next_claimable(now)
                if row is None:
                    break
                if row.state is JobState.RUNNING:
                    logger.warning(
                        "job %d: lease of %s expired, claiming it again", row.id, row.lease_owner
                    )
                token = new_token(owner)
                row.state = JobState.RUNNING
                row.attempts += 1
                row.lease_owner = token
                row.lease_until = now + seconds
                row.updated_at = now
                heapq.heappush(self._leases, (row.lease_until, row.id))
                claims.append(Claim(row.snapshot(), token, row.lease_until))
        return claims

    def _expire_leases(self, now: float) -> None:
        """Move every lease expired by ``now`` to _expired, failing those with no attempt left.

        Call with the lock held. Like the full scan it replaces, it handles every expired
        lease on each claim, whatever the claim's limit.
        """
        leases = self._leases
        last: tuple[float, int] | None = None
        while leases and leases[0][0] <= now:
            entry = heapq.heappop(leases)
            duplicate, last = entry == last, entry  # equal entries pop one after the other
            until, job_id = entry
            row = self._rows.get(job_id)
            if (
                duplicate
                or row is None
                or row.state is not JobState.RUNNING
                or row.lease_until != until
            ):
                self._stale_leases = max(0, self._stale_leases - 1)
                continue  # ended, renewed or taken again since this entry was pushed
            if row.attempts >= row.max_attempts:
                row.last_error = expired_reason(row.attempts)
                row.end_lease(JobState.FAILED, now)
                logger.warning("job %d failed: %s", row.id, row.last_error)
            else:
                heapq.heappush(self._expired, (row.run_at, row.id))

    def _next_claimable(self, now: float) -> _Row | None:
        """Pop the due row with the smallest ``(run_at, id)``; call with the lock held."""
        queued, expired = self._queued, self._expired
        while queued:  # drop stale entries from the top
            run_at, job_id = queued[0]
            row = self._rows.get(job_id)
            if row is not None and row.state is JobState.QUEUED and row.run_at == run_at:
                break
            heapq.heappop(queued)
        while expired:
            run_at, job_id = expired[0]
            row = self._rows.get(job_id)
            if (
                row is not None
                and row.state is JobState.RUNNING
                and row.lease_until is not None
                and row.run_at == run_at
            ):
                if row.lease_until <= now:
                    break
                # Renewed since it expired (or the clock went back): a lease again.
                heapq.heappush(self._leases, (row.lease_until, row.id))
            heapq.heappop(expired)
        queued_due = bool(queued) and queued[0][0] <= now
        if queued_due and (not expired or queued[0] < expired[0]):
            return self._rows[heapq.heappop(queued)[1]]
        if expired:
            return self._rows[heapq.heappop(expired)[1]]
        return None

    def _lease_ended(self) -> None:
        """Count one stale entry in _leases; compact it once most entries are stale."""
        self._stale_leases += 1
        if self._stale_leases > 64 and self._stale_leases * 2 > len(self._leases):
            self._leases = [
                (until, job_id)
                for until, job_id in self._leases
                if (row := self._rows.get(job_id)) is not None
                and row.state is JobState.RUNNING
                and row.lease_until == until
            ]
            heapq.heapify(self._leases)
            self._stale_leases = 0

    def _held(self, claim: Claim) -> _Row | None:
        """The claim's row if the claim still holds its lease; call with the lock held."""
        self._check_open()
        row = self._rows.get(claim.job.id)
        if row is None or row.state is not JobState.RUNNING or row.lease_owner != claim.token:
            logger.info("job %d: claim %s no longer holds the lease", claim.job.id, claim.token)
            return None
        return row

    def complete(self, claim: Claim) -> bool:
        """Mark the job done; False (and no change) if the claim no longer holds the lease."""
        with self._lock:
            row = self._held(claim)
            if row is None:
                return False
            row.end_lease(JobState.DONE, self._clock())
            self._lease_ended()
            return True

    def fail(self, claim: Claim, error: str) -> bool:
        """Mark the job failed for good with ``error``; False if the lease was lost."""
        with self._lock:
            row = self._held(claim)
            if row is None:
                return False
            row.last_error = str(error)
            row.end_lease(JobState.FAILED, self._clock())
            self._lease_ended()
            return True

    def retry(self, claim: Claim, error: str, *, run_at: float) -> bool:
        """Queue the job again at ``run_at``, keeping the attempt; False if the lease was lost."""
        when = check_time("run_at", run_at)
        with self._lock:
            row = self._held(claim)
            if row is None:
                return False
            row.last_error = str(error)
            row.run_at = when
            row.end_lease(JobState.QUEUED, self._clock())
            self._lease_ended()
            heapq.heappush(self._queued, (row.run_at, row.id))
            return True

    def release(self, claim: Claim) -> bool:
        """Return an interrupted job unchanged: attempt given back, original ``run_at``."""
        with self._lock:
            row = self._held(claim)
            if row is None:
                return False
            row.attempts = max(0, row.attempts - 1)
            row.end_lease(JobState.QUEUED, self._clock())
            self._lease_ended()
            heapq.heappush(self._queued, (row.run_at, row.id))
            return True

    def renew(self, claim: Claim, *, lease: float) -> Claim | None:
        """Extend the lease; the renewed claim, or None if the lease was lost."""
        seconds = check_lease(lease)
        with self._lock:
            row = self._held(claim)
            if row is None:
                return None
            now = self._clock()
            row.lease_until = now + seconds
            row.updated_at = now
            self._lease_ended()  # the entry of the old lease_until
            heapq.heappush(self._leases, (row.lease_until, row.id))
            return Claim(row.snapshot(), claim.token, row.lease_until)

    def get(self, job_id: int) -> Job | None:
        """The job with this id, or None."""
        with self._lock:
            self._check_open()
            row = self._rows.get(job_id)
            return None if row is None else row.snapshot()

    def counts(self) -> dict[str, int]:
        """Number of jobs in each state, every state present (zero included)."""
        result = {state.value: 0 for state in JobState}
        with self._lock:
            self._check_open()
            for row in self._rows.values():
                result[row.state.value] += 1
        return result

    def next_due(self) -> float | None:
        """When the next job becomes claimable (a run_at or a lease expiry); None if never."""
        with self._lock:
            self._check_open()
            times = [
                row.run_at if row.state is JobState.QUEUED else row.lease_until
                for row in self._rows.values()
                if row.state is JobState.QUEUED or row.state is JobState.RUNNING
            ]
        known = [t for t in times if t is not None]
        return min(known) if known else None

    def purge(self, *, older_than: float | None = None) -> int:
        """Delete done and failed jobs (updated before ``older_than``); return how many."""
        cutoff = None if older_than is None else check_time("older_than", older_than)
        finished = (JobState.DONE, JobState.FAILED)
        with self._lock:
            self._check_open()
            doomed = [
                row.id
                for row in self._rows.values()
                if row.state in finished and (cutoff is None or row.updated_at < cutoff)
            ]
            for job_id in doomed:
                del self._rows[job_id]
        if doomed:
            logger.info("purged %d finished jobs", len(doomed))
        return len(doomed)

    def clock(self) -> float:
        """The store's time now: the ``clock`` it was built with (`time.time` by default)."""
        return self._clock()

    def subscribe(self, callback: Callable[[], object]) -> Callable[[], None]:
        """No notifications here: never calls ``callback``; the unsubscribe does nothing.

        A worker on this store finds new jobs at its next poll. `RuntimeError` once closed.
        """
        self._check_open()
        return _no_op

    def close(self) -> None:
        """Release the store's resources; idempotent."""
        with self._lock:
            self._closed = True


if TYPE_CHECKING:  # mypy --strict proves the store implements the protocol exactly
    _implements: type[Store] = MemoryStore
