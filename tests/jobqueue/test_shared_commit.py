"""The worker shares one transaction between a batch's outcomes and the claims for its slots.

A handler's freed slot is the settler's: its commit (`Store.settle_and_claim`) claims for
it, so a busy worker pays one transaction per batch, not two. Both threads reserve slots
under the worker's lock before claiming: never more claims than free slots, even while
one shared transaction is held open and the claimer claims too. A process SIGKILLed
inside the shared transaction loses nothing: none of it applied, every job runs.
"""

from __future__ import annotations

import signal
import textwrap
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from patterns.jobqueue.stores.memory import MemoryStore
from patterns.jobqueue.stores.records import Claim, JobState, Settlement
from patterns.jobqueue.stores.sqlite.store import SQLiteStore
from patterns.jobqueue.tasks import TaskRegistry
from patterns.jobqueue.worker.worker import Worker
from tests.support import (
    MUST_HAPPEN,
    Gate,
    join_or_fail,
    run_in_thread,
    run_python,
    wait_until,
)

FOREVER = 3600.0


class Recording(MemoryStore):
    """A memory store noting every transaction that claims or settles, and who holds slots.

    ``calls``: ("claim", limit, claimed) for the claimer's own claims, ("shared", settled,
    limit, claimed) for each `settle_and_claim`. ``hold`` parks the next shared transaction
    inside it (before it settles or claims) at ``gate``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, ...]] = []
        self.hold = False
        self.gate = Gate("the settler, inside its shared transaction")
        self._inside = threading.local()

    def claim(self, owner: str, *, lease: float, limit: int = 1) -> list[Claim]:
        """Claim; a call of the claimer's own (not inside a shared one) is noted."""
        claims = super().claim(owner, lease=lease, limit=limit)
        if not getattr(self._inside, "on", False):
            self.calls.append(("claim", limit, len(claims)))
        return claims

    def settle_and_claim(
        self, items: Sequence[Settlement], owner: str, *, lease: float, limit: int
    ) -> tuple[list[bool | Exception], list[Claim]]:
        """Park first if told to (the transaction is open), then settle and claim; noted."""
        if self.hold:
            self.hold = False
            self.gate.arrive()
        self._inside.on = True
        try:
            done, claims = super().settle_and_claim(items, owner, lease=lease, limit=limit)
        finally:
            self._inside.on = False
        self.calls.append(("shared", len(items), limit, len(claims)))
        return done, claims


class Jobs:
    """A ``work`` task that waits for ``go``, counting how many run at once (and the most)."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.runs: list[int] = []
        self.tasks = TaskRegistry()
        self.tasks.task(name="work")(self.work)

    def work(self, payload: Any, ctx: Any) -> None:
        """Count itself running, wait for ``go``."""
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.runs.append(ctx.job_id)
        try:
            assert self.go.wait(MUST_HAPPEN), "the test never let the jobs finish"
        finally:
            with self.lock:
                self.running -= 1


def worker(store: Recording, jobs: Jobs, **options: Any) -> Worker:
    """A worker with nothing timed but the stop."""
    settings: dict[str, Any] = {
        "concurrency": 4,
        "poll_interval": FOREVER,
        "heartbeat_interval": FOREVER,
        "lease": 2 * FOREVER,
        "stop_timeout": MUST_HAPPEN,
        "name": "w1",
    }
    settings.update(options)
    return Worker(store, jobs.tasks, **settings)


@pytest.mark.parametrize(("prefetch", "first"), [(0, 4), (None, 20)], ids=["prefetch=0", "default"])
def test_a_batch_s_freed_slots_are_refilled_by_the_same_transaction(
    prefetch: int | None, first: int
) -> None:
    """Forty jobs, four threads: one claim of the free slots, then each refill with an outcome.

    The free slots are four, or twenty with the default prefetch (sixteen).
    """
    store, jobs = Recording(), Jobs()
    ids = store.enqueue_many([{"task": "work"}] * 40)
    w = worker(store, jobs, **({} if prefetch is None else {"prefetch": prefetch})).start()
    try:
        wait_until(lambda: jobs.running == 4, "four jobs running")
        jobs.go.set()
        wait_until(lambda: w.stats().done == 40, "all forty done")
    finally:
        report = w.stop()
    assert report.terminated
    assert sorted(jobs.runs) == ids  # each once
    assert jobs.most <= 4
    taken = [call for call in store.calls if call[0] == "claim" and call[2]]
    shared = [call for call in store.calls if call[0] == "shared"]
    assert taken == [("claim", first, first)]  # the claimer's only claim that found jobs
    assert sum(call[3] for call in shared) == 40 - first  # the others: claimed with outcomes
    for _, settled, limit, claimed in shared:
        assert limit == settled  # a slot per outcome: those it frees, no more
        assert claimed <= limit
    # Transactions that did work: one claim, and one per outcome batch (at most 40).
    assert len(taken) + len(shared) <= 41
    assert sum(call[1] for call in shared) == 40


def test_never_more_claims_than_free_slots_while_a_shared_transaction_is_held_open() -> None:
    """The settler's transaction parked with one slot reserved; the claimer takes the others.

    Without prefetch (``prefetch=0``), so that the free slots are the free threads.
    """
    store, jobs = Recording(), Jobs()
    jobs.tasks.task(name="quick")(lambda payload, ctx: None)
    first, quick = store.enqueue("work"), store.enqueue("quick")
    w = worker(store, jobs, concurrency=3, prefetch=0)
    store.hold = True  # the quick job's commit parks inside its transaction
    w.start()
    try:
        store.gate.wait_reached()  # slots: first running, quick's reserved by the settler
        late = store.enqueue_many([{"task": "work"}] * 5)
        w.wake()
        wait_until(lambda: jobs.running == 2, "the claimer filled the one free slot")
        assert (jobs.running, jobs.most) == (2, 2)
        store.gate.open()
        wait_until(lambda: jobs.running == 3, "the shared transaction filled its slot")
        assert w.stats().running <= 3
        jobs.go.set()
        wait_until(lambda: w.stats().done == 7, "all done")
    finally:
        store.gate.open()
        jobs.go.set()
        report = w.stop()
    assert report.terminated
    assert jobs.most == 3
    assert sorted(jobs.runs) == sorted([first, *late])
    claimer = [call for call in store.calls if call[0] == "claim" and call[2]]
    # The claimer never asked for a slot the parked transaction had reserved.
    assert all(limit <= 3 for _, limit, _ in claimer)
    assert ("claim", 1, 1) in claimer  # the free slot, while the shared one was held open
    assert store.get(quick).state is JobState.DONE


CHILD = r"""
import os, signal, sys
from patterns.jobqueue.stores.sqlite.store import SQLiteStore
from patterns.jobqueue.tasks import TaskRegistry
from patterns.jobqueue.worker.worker import Worker

db, effects = sys.argv[1], sys.argv[2]

class DiesInside(SQLiteStore):
    def claim(self, owner, *, lease, limit=1):
        claims = super().claim(owner, lease=lease, limit=limit)
        if getattr(self._shared, "now", None) is not None:  # in the shared transaction
            os.kill(os.getpid(), signal.SIGKILL)  # outcomes written, claims taken: no COMMIT
        return claims

tasks = TaskRegistry()

@tasks.task(name="work")
def work(payload, ctx):
    with open(effects, "a") as f:
        f.write(f"{ctx.job_id} {ctx.attempt}\n")

# No prefetch: the first claim takes two of the four jobs, so the shared transaction
# that settles them has jobs left to claim.
Worker(DiesInside(db), tasks, concurrency=2, prefetch=0, lease=0.5).run()
"""


def test_a_process_killed_inside_the_shared_transaction_loses_nothing(tmp_path: Path) -> None:
    """SIGKILL after its outcomes and claims, before COMMIT: none applied; all jobs run later."""
    db, effects = tmp_path / "q.db", tmp_path / "effects"
    store = SQLiteStore(db)
    try:
        ids = store.enqueue_many([{"task": "work"}] * 4)
        child = run_python(textwrap.dedent(CHILD), str(db), str(effects))
        assert child.returncode == -signal.SIGKILL, child.stderr
        ran = effects.read_text().splitlines()
        jobs = [store.get(i) for i in ids]
        # The first claim took two; one or both ran; the shared commit never happened:
        # those stay running under the dead worker's lease, the others are still queued.
        assert [j.state for j in jobs if j] == [JobState.RUNNING] * 2 + [JobState.QUEUED] * 2
        assert [j.attempts for j in jobs if j] == [1, 1, 0, 0]
        assert set(ran) <= {f"{ids[0]} 1", f"{ids[1]} 1"}
        assert ran

        tasks = TaskRegistry()
        tasks.task(name="work")(lambda payload, ctx: _append(effects, ctx))
        restart = Worker(store, tasks, lease=0.5, poll_interval=0.05, exit_when_empty=True)
        thread, outcome = run_in_thread(restart.run, "restart")
        join_or_fail(thread)
        assert outcome["result"].terminated
        assert [store.get(i).state for i in ids] == [JobState.DONE] * 4  # type: ignore[union-attr]
        again = effects.read_text().splitlines()[len(ran) :]
        assert {line.split()[0] for line in again} == {str(i) for i in ids}  # each ran after
    finally:
        store.close()


def _append(path: Path, ctx: Any) -> None:
    with path.open("a") as f:
        f.write(f"{ctx.job_id} {ctx.attempt}\n")
