"""A store written for a worker implements `WorkerStore` alone, and a `Worker` runs on it.

`Store` is two parts, one per caller (`patterns.jobqueue.stores.protocol`): what a worker
needs (`WorkerStore`) and what an operator needs (`OperatorStore`), with three methods in
both (`SharedStore`). `WorkerOnlyStore` below has exactly the worker's part, each method
passed to a `MemoryStore`; it is typed so that ``mypy --strict`` accepts it as a
`WorkerStore` (mypy checks patterns/ only: run it on this file to see), and the tests check
at run time that it has no operator method, so a worker that called one would fail here.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable, Sequence

import pytest

from patterns.jobqueue import OperatorStore, Store, WorkerStore
from patterns.jobqueue.stores.memory import MemoryStore
from patterns.jobqueue.stores.protocol import SharedStore
from patterns.jobqueue.stores.records import (
    DEFAULT_MAX_ATTEMPTS,
    Claim,
    JobState,
    JsonValue,
    Settlement,
)
from patterns.jobqueue.tasks import JobContext, TaskRegistry
from patterns.jobqueue.worker.worker import Worker
from tests.support import MUST_HAPPEN, wait_until


def own_methods(protocol: type) -> set[str]:
    """The public methods ``protocol`` declares itself (not those of its bases)."""
    return {
        name
        for name, value in vars(protocol).items()
        if inspect.isfunction(value) and not name.startswith("_")
    }


SHARED = own_methods(SharedStore)
WORKER = own_methods(WorkerStore) | SHARED
OPERATOR_ONLY = own_methods(OperatorStore)


class WorkerOnlyStore:
    """The worker's part of a store and nothing else, each call passed to a `MemoryStore`.

    ``calls`` names each method called, in order; ``operator`` is the memory store itself,
    which the test (the operator here) reads.
    """

    def __init__(self) -> None:
        self.operator = MemoryStore()
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def _called(self, name: str) -> None:
        with self._lock:
            self.calls.append(name)

    # --- SharedStore ---

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
        """Pass to the memory store."""
        self._called("enqueue")
        return self.operator.enqueue(
            task,
            payload,
            run_at=run_at,
            delay=delay,
            max_attempts=max_attempts,
            timeout=timeout,
        )

    def counts(self) -> dict[str, int]:
        """Pass to the memory store."""
        self._called("counts")
        return self.operator.counts()

    def clock(self) -> float:
        """Pass to the memory store."""
        self._called("clock")
        return self.operator.clock()

    # --- WorkerStore ---

    def claim(self, owner: str, *, lease: float, limit: int = 1) -> list[Claim]:
        """Pass to the memory store."""
        self._called("claim")
        return self.operator.claim(owner, lease=lease, limit=limit)

    def settle_many(self, items: Sequence[Settlement]) -> list[bool | Exception]:
        """Pass to the memory store."""
        self._called("settle_many")
        return self.operator.settle_many(items)

    def settle_and_claim(
        self, items: Sequence[Settlement], owner: str, *, lease: float, limit: int
    ) -> tuple[list[bool | Exception], list[Claim]]:
        """Pass to the memory store."""
        self._called("settle_and_claim")
        return self.operator.settle_and_claim(items, owner, lease=lease, limit=limit)

    def complete(self, claim: Claim, result: JsonValue = None) -> bool:
        """Pass to the memory store."""
        self._called("complete")
        return self.operator.complete(claim, result)

    def fail(self, claim: Claim, error: str) -> bool:
        """Pass to the memory store."""
        self._called("fail")
        return self.operator.fail(claim, error)

    def retry(self, claim: Claim, error: str, *, run_at: float) -> bool:
        """Pass to the memory store."""
        self._called("retry")
        return self.operator.retry(claim, error, run_at=run_at)

    def release(self, claim: Claim) -> bool:
        """Pass to the memory store."""
        self._called("release")
        return self.operator.release(claim)

    def mark_cancelled(self, claim: Claim, reason: str) -> bool:
        """Pass to the memory store."""
        self._called("mark_cancelled")
        return self.operator.mark_cancelled(claim, reason)

    def renew(self, claim: Claim, *, lease: float) -> Claim | None:
        """Pass to the memory store."""
        self._called("renew")
        return self.operator.renew(claim, lease=lease)

    def next_due(self) -> float | None:
        """Pass to the memory store."""
        self._called("next_due")
        return self.operator.next_due()

    def subscribe(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Pass to the memory store."""
        self._called("subscribe")
        return self.operator.subscribe(callback)

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
        """Pass to the memory store."""
        self._called("record_worker")
        self.operator.record_worker(
            worker_id,
            host=host,
            pid=pid,
            state=state,
            started_at=started_at,
            jobs_held=jobs_held,
            ttl=ttl,
        )

    def forget_worker(self, worker_id: str) -> None:
        """Pass to the memory store."""
        self._called("forget_worker")
        self.operator.forget_worker(worker_id)


def as_worker_store(store: WorkerOnlyStore) -> WorkerStore:
    """``store`` where a `WorkerStore` is expected: mypy --strict checks every method."""
    return store


def test_the_two_parts_share_three_methods_and_together_are_the_whole_store() -> None:
    """Worker part, operator part and the shared three cover `Store` and nothing else."""
    whole = set().union(*(own_methods(part) for part in Store.__mro__ if part is not object))
    assert {"enqueue", "counts", "clock"} == SHARED
    assert whole == WORKER | OPERATOR_ONLY
    assert not (WORKER & OPERATOR_ONLY)
    assert (len(WORKER), len(OPERATOR_ONLY | SHARED), len(whole)) == (16, 12, 25)


def test_the_worker_only_store_has_the_worker_part_and_no_operator_method() -> None:
    """Every `WorkerStore` method is there; not one of `OperatorStore`'s own is."""
    store = WorkerOnlyStore()
    assert all(callable(getattr(store, name, None)) for name in WORKER)
    assert [name for name in sorted(OPERATOR_ONLY) if hasattr(store, name)] == []
    assert as_worker_store(store) is store


def test_a_store_with_only_the_worker_part_runs_a_worker_to_done_and_stops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Enqueue through the worker, the job ends done, and the stop ends every part cleanly.

    A call of a method the store lacks would raise `AttributeError`; the worker would log
    it (at WARNING or above) or put it in its report, so both are checked empty.
    """
    caplog.set_level(logging.WARNING, logger="patterns.jobqueue")
    tasks = TaskRegistry()

    @tasks.task()
    def double(payload: JsonValue, ctx: JobContext) -> JsonValue:
        return payload * 2

    store = WorkerOnlyStore()
    worker = Worker(store, tasks, concurrency=1, poll_interval=0.05, heartbeat_interval=0.05)
    worker.start()
    try:
        job_id = worker.enqueue("double", 21)
        wait_until(
            lambda: getattr(store.operator.get(job_id), "state", None) is JobState.DONE,
            "the job to be done",
        )
        wait_until(lambda: "record_worker" in store.calls, "the worker's row to be written")
    finally:
        report = worker.stop(MUST_HAPPEN)

    job = store.operator.get(job_id)
    assert job is not None
    assert (job.state, job.result, job.attempts) == (JobState.DONE, 42, 1)
    assert report.terminated
    assert (report.failure, report.errors, report.thread_failures) == (None, (), ())
    assert worker.stats().done == 1
    assert [r.getMessage() for r in caplog.records] == []
    assert store.operator.workers() == []  # forgotten by the stop
    assert {"enqueue", "claim", "record_worker", "forget_worker"} <= set(store.calls)
    assert set(store.calls) <= WORKER
