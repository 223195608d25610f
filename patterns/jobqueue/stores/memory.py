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
      retry, release and renew (and each item of ``settle_many``, one atomic step for the
      batch) succeed only for the claim whose token holds the lease.
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
    ``patterns.jobqueue.stores.protocol`` (the protocol and the state diagram),
    ``patterns.jobqueue.stores.sqlite.store`` (the durable store with the same contract).

Docs: docs/jobqueue/index.md
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from patterns.jobqueue.stores.base import StoreBase
from patterns.jobqueue.stores.checks import (
    cancelled_reason,
    check_job_id,
    check_lease,
    check_limit,
    check_max_payload_bytes,
    check_owner,
    check_share,
    check_state,
    check_states,
    check_text,
    check_time,
    expired_reason,
    new_token,
    prepare_enqueue,
    prepare_many,
    prepare_settlement,
)
from patterns.jobqueue.stores.records import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    FINISHED_STATES,
    CancelResult,
    Claim,
    Job,
    JobState,
    NewJob,
    Settle,
    Settlement,
    WorkerRecord,
    WorkerRow,
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
    timeout: float | None = None
    result_json: str | None = None  # the handler's result as JSON text, once done
    cancel_requested: bool = False

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
            timeout=self.timeout,
            result=None if self.result_json is None else json.loads(self.result_json),
            cancel_requested=self.cancel_requested,
        )

    def end_lease(self, state: JobState, now: float) -> None:
        self.state = state
        self.lease_owner = None
        self.lease_until = None
        self.updated_at = now


def _no_op() -> None:
    """The unsubscribe of a store without notifications: there is nothing to undo."""


class MemoryStore(StoreBase):
    """A thread-safe, non-durable ``Store``; ``clock`` supplies every timestamp."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        self._clock = clock
        self._max_payload_bytes = check_max_payload_bytes(max_payload_bytes)
        # Guards _rows, _next_id, _workers and _closed. Every public method holds it for its whole
        # transition, so no caller ever sees (or acts on) a half-done transition. Nobody
        # waits on it for long: the only caller code run under it is the clock, which must
        # not call back into the store (the lock is not reentrant).
        self._lock = threading.RLock()  # settle_and_claim holds it across two calls
        self._rows: dict[int, _Row] = {}
        self._workers: dict[str, WorkerRecord] = {}
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
            timeout=new.timeout,
        )
        heapq.heappush(self._queued, (new.run_at, job_id))
        return job_id

    def _enqueue(self, spec: Mapping[str, Any]) -> int:
        with self._lock:
            self._check_open()
            now = self._clock()
            new = prepare_enqueue(now, **spec, max_payload_bytes=self._max_payload_bytes)
            job_id = self._insert(new, now)
        logger.debug("enqueued job %d (%s) to run at %.3f", job_id, new.task, new.run_at)
        return job_id

    def enqueue_many(self, jobs: Sequence[Mapping[str, Any]]) -> list[int]:
        with self._lock:
            self._check_open()
            now = self._clock()
            prepared = prepare_many(now, jobs, self._max_payload_bytes)
            ids = [self._insert(new, now) for new in prepared]
        logger.debug("enqueued %d jobs", len(ids))
        return ids

    def claim(self, owner: str, *, lease: float, limit: int = 1) -> list[Claim]:
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
                if row.cancel_requested:  # expired while its worker was asked to cancel
                    self._cancel_expired(row, now)
                    continue
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
            if row.cancel_requested:
                self._cancel_expired(row, now)
            elif row.attempts >= row.max_attempts:
                row.last_error = expired_reason(row.attempts)
                row.end_lease(JobState.FAILED, now)
                logger.warning("job %d failed: %s", row.id, row.last_error)
            else:
                heapq.heappush(self._expired, (row.run_at, row.id))

    @staticmethod
    def _cancel_expired(row: _Row, now: float) -> None:
        """End a job whose lease expired after a cancel request: cancelled, never run again."""
        row.last_error = cancelled_reason("and its lease expired")
        row.end_lease(JobState.CANCELLED, now)
        logger.warning("job %d cancelled: %s", row.id, row.last_error)

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

    def settle_many(self, items: Sequence[Settlement]) -> list[bool | Exception]:
        """`~.Store.settle_many` under one hold of the store's lock.

        Nobody sees some of the items applied and others not.
        """
        if not items:
            return []
        done: list[bool | Exception] = []
        checked: list[tuple[int, Claim, Settle, str | None, float]] = []
        for index, item in enumerate(items):  # encoding results takes no lock
            try:
                kind, text, when = prepare_settlement(item, self._max_payload_bytes)
            except (TypeError, ValueError) as exc:
                done.append(exc)
                continue
            done.append(False)
            checked.append((index, item.claim, kind, text, when))
        if checked:
            with self._lock:
                self._check_open()
                now = self._clock()
                for index, claim, kind, text, when in checked:
                    done[index] = self._settle_held(claim, kind, text, when, now)
        return done

    def settle_and_claim(
        self, items: Sequence[Settlement], owner: str, *, lease: float, limit: int
    ) -> tuple[list[bool | Exception], list[Claim]]:
        """`~.Store.settle_and_claim` under one hold of the store's lock.

        Nobody sees what is between the outcomes and the claims.
        """
        count = check_share(items, owner, lease, limit)
        if count is None:
            return [], []
        with self._lock:
            done = self.settle_many(items)
            claims = self.claim(owner, lease=lease, limit=count) if count else []
        return done, claims

    def _settle_one(self, claim: Claim, kind: Settle, text: str | None, when: float) -> bool:
        """One outcome, checked already, in its own hold of the lock."""
        with self._lock:
            self._check_open()
            return self._settle_held(claim, kind, text, when, self._clock())

    def _settle_held(
        self, claim: Claim, kind: Settle, text: str | None, when: float, now: float
    ) -> bool:
        """Apply one checked outcome if the claim still holds the lease; call with the lock held.

        ``text`` is the result's JSON (COMPLETE) or the storable error (FAIL, RETRY,
        CANCEL); ``when`` the new ``run_at`` (RETRY).
        """
        row = self._held(claim)
        if row is None:
            return False
        if kind is Settle.COMPLETE:
            row.result_json = text
            row.end_lease(JobState.DONE, now)
        elif kind is Settle.FAIL or kind is Settle.CANCEL:
            row.last_error = text
            row.end_lease(JobState.FAILED if kind is Settle.FAIL else JobState.CANCELLED, now)
        else:
            if kind is Settle.RETRY:
                row.last_error = text
                row.run_at = when
            else:
                row.attempts = max(0, row.attempts - 1)
            if row.cancel_requested:  # given back, it would never run again: cancelled
                row.last_error = cancelled_reason("and its worker gave it back")
                row.end_lease(JobState.CANCELLED, now)
            else:
                row.end_lease(JobState.QUEUED, now)
                heapq.heappush(self._queued, (row.run_at, row.id))
        self._lease_ended()
        return True

    def renew(self, claim: Claim, *, lease: float) -> Claim | None:
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
            # The caller's snapshot with the new lease: no payload is decoded (a renew
            # costs the same whatever the payload's size).
            job = dataclasses.replace(claim.job, lease_until=row.lease_until, updated_at=now)
            return Claim(job, claim.token, row.lease_until, row.cancel_requested)

    def get(self, job_id: int) -> Job | None:
        check_job_id(job_id)
        with self._lock:
            self._check_open()
            row = self._rows.get(job_id)
            return None if row is None else row.snapshot()

    def list_jobs(
        self, *, state: JobState | str | None = None, task: str | None = None, limit: int = 50
    ) -> list[Job]:
        wanted = None if state is None else check_state(state)
        name = None if task is None else check_text("task", task)
        count = check_limit(limit)
        found: list[Job] = []
        with self._lock:
            self._check_open()
            for job_id in sorted(self._rows, reverse=True):
                row = self._rows[job_id]
                if (wanted is None or row.state is wanted) and (name is None or row.task == name):
                    found.append(row.snapshot())
                    if len(found) == count:
                        break
        return found

    def requeue(self, job_id: int) -> bool:
        check_job_id(job_id)
        with self._lock:
            self._check_open()
            row = self._rows.get(job_id)
            if row is None or row.state is not JobState.FAILED:
                return False
            self._requeue_failed_row(row, self._clock())
        logger.info("job %d requeued", job_id)
        return True

    def requeue_failed(self, *, task: str | None = None) -> list[int]:
        name = None if task is None else check_text("task", task)
        with self._lock:
            self._check_open()
            now = self._clock()
            ids = sorted(
                row.id
                for row in self._rows.values()
                if row.state is JobState.FAILED and (name is None or row.task == name)
            )
            for job_id in ids:
                self._requeue_failed_row(self._rows[job_id], now)
        if ids:
            logger.info("requeued %d failed jobs", len(ids))
        return ids

    def _requeue_failed_row(self, row: _Row, now: float) -> None:
        row.state = JobState.QUEUED
        row.attempts = 0
        row.run_at = now
        row.updated_at = now
        row.cancel_requested = False
        row.result_json = None
        row.lease_owner = None
        row.lease_until = None
        heapq.heappush(self._queued, (row.run_at, row.id))

    def cancel(self, job_id: int) -> CancelResult:
        check_job_id(job_id)
        with self._lock:
            self._check_open()
            row = self._rows.get(job_id)
            if row is None:
                return CancelResult.NOT_FOUND
            if row.state in FINISHED_STATES:
                return CancelResult.FINISHED
            now = self._clock()
            row.updated_at = now
            if row.state is JobState.QUEUED:
                row.state = JobState.CANCELLED
                result = CancelResult.CANCELLED
            else:
                row.cancel_requested = True
                result = CancelResult.REQUESTED
        logger.info("job %d: cancel %s", job_id, result.value)
        return result

    def counts(self) -> dict[str, int]:
        result = {state.value: 0 for state in JobState}
        with self._lock:
            self._check_open()
            for row in self._rows.values():
                result[row.state.value] += 1
        return result

    def next_due(self) -> float | None:
        with self._lock:
            self._check_open()
            times = [
                row.run_at if row.state is JobState.QUEUED else row.lease_until
                for row in self._rows.values()
                if row.state is JobState.QUEUED or row.state is JobState.RUNNING
            ]
        known = [t for t in times if t is not None]
        return min(known) if known else None

    def purge(
        self, *, older_than: float | None = None, states: Collection[str] = FINISHED_STATES
    ) -> int:
        cutoff = None if older_than is None else check_time("older_than", older_than)
        finished = check_states(states)
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

    def _record_worker(self, row: WorkerRow) -> None:
        with self._lock:
            self._check_open()
            now = self._clock()
            self._expire_workers(now)
            self._workers[row.worker_id] = WorkerRecord(
                id=row.worker_id,
                host=row.host,
                pid=row.pid,
                state=row.state,
                started_at=row.started_at,
                last_seen=now,
                expires_at=now + row.ttl,
                jobs_held=row.jobs_held,
            )

    def forget_worker(self, worker_id: str) -> None:
        name = check_text("worker_id", worker_id)
        with self._lock:
            self._check_open()
            self._workers.pop(name, None)

    def workers(self) -> list[WorkerRecord]:
        with self._lock:
            self._check_open()
            self._expire_workers(self._clock())
            return sorted(self._workers.values(), key=lambda w: (w.started_at, w.id))

    def _expire_workers(self, now: float) -> None:
        """Delete the rows of workers not seen before their expiry; call with the lock held."""
        for name in [n for n, w in self._workers.items() if w.expires_at <= now]:
            logger.info(
                "worker %s expired (not seen since %.3f)", name, self._workers[name].last_seen
            )
            del self._workers[name]

    def clock(self) -> float:
        return self._clock()

    def subscribe(self, callback: Callable[[], object]) -> Callable[[], None]:
        self._check_open()
        return _no_op

    def close(self) -> None:
        with self._lock:
            self._closed = True
