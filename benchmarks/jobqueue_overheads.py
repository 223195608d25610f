"""What the pattern modules add per call or per job, next to the bare standard library (7).

Run it with ``python -m benchmarks.jobqueue_overheads`` (``--help`` for the knobs).
Table 7; the closable queue's own overhead is ``benchmarks.closable_queue``.

* Bulkhead: ``--calls`` (10,000) no-op calls through ``Bulkhead(4, 4).call(f)`` and
  ``Bulkhead(4, 4).submit(f).result()``, next to ``ThreadPoolExecutor(4).submit(f)
  .result()``, from one caller thread and from 4 caller threads at once (the queue of
  4 never fills, so nothing is rejected). Microseconds per call, wall time / calls.
* The job queue's ``Worker`` without a database: ``--jobs`` (20,000) no-op jobs drained
  by ``Worker(concurrency=4)`` from a benchmark-local store that keeps its queue in a
  ``deque`` (claims are O(1); nothing is durable), next to the same number of no-op
  calls submitted to a ``ThreadPoolExecutor(4)``. This is the worker's own cost per
  job: claim hand-off, cancel token, outcome bookkeeping, hooks. Also ``MemoryStore``,
  the project's in-memory store, at two backlog sizes: its claim scans every row, so
  its rate falls as the backlog grows. The executor and the deque-store rows run again
  with the interpreter's thread switch interval at 50 ms instead of 5 ms
  (`sys.setswitchinterval`): the forced switches of the GIL, not the code, make most of
  those rows' spread from run to run. The targets are judged on the default rows.

Each row: median, min and max over ``--runs`` runs (rows interleaved); ratio = the
row's median over the bare standard-library row's; the worker's cost per job on the
deque store is printed against its target (met or not met), and the last line gives the
wall time and the load average at the end. A measurement to read, not a test.
"""

from __future__ import annotations

import argparse
import collections
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks._tables import (
    emit,
    end_line,
    env_int,
    join_threads,
    machine_line,
    measure,
    runs_setting,
    stats_table,
    target,
)

DEQUE_ROW = "Worker(4) + deque store"
WORKER_COST_TARGET = 10.0  # µs per job: the most the worker itself may spend on a job
SLOW_SWITCH = 0.05  # s: the thread switch interval of the comparison rows (the default: 5 ms)


def noop() -> None:
    """The work: nothing, so only the machinery is timed."""


# --- bulkhead vs executor ------------------------------------------------------------------


def per_call(call: Callable[[], object], calls: int, callers: int) -> float:
    """Microseconds of wall time per call when ``callers`` threads share ``calls`` calls."""
    share = calls // callers
    barrier = threading.Barrier(callers + 1)  # every caller starts together with the clock

    def caller() -> None:
        barrier.wait(10.0)
        for _ in range(share):
            call()

    threads = [threading.Thread(target=caller, name=f"caller-{i}") for i in range(callers)]
    for thread in threads:
        thread.start()
    barrier.wait(10.0)
    start = time.perf_counter()
    join_threads(threads, 120.0)
    return (time.perf_counter() - start) / (share * callers) * 1e6


def bulkhead_rows(calls: int, callers: int) -> dict[str, Callable[[], float]]:
    """Each row's measurement: a fresh pool per run, closed afterwards."""
    from patterns.bulkhead import Bulkhead  # noqa: PLC0415

    def executor() -> float:
        with ThreadPoolExecutor(max_workers=4) as pool:
            return per_call(lambda: pool.submit(noop).result(), calls, callers)

    def bulkhead_call() -> float:
        with Bulkhead(4, 4, name="bench") as bulkhead:
            return per_call(lambda: bulkhead.call(noop), calls, callers)

    def bulkhead_submit() -> float:
        with Bulkhead(4, 4, name="bench") as bulkhead:
            return per_call(lambda: bulkhead.submit(noop).result(), calls, callers)

    return {
        "ThreadPoolExecutor(4).submit(f).result()": executor,
        "Bulkhead(4, 4).call(f)": bulkhead_call,
        "Bulkhead(4, 4).submit(f).result()": bulkhead_submit,
    }


# --- the worker without a database ---------------------------------------------------------


class DequeStore:
    """Just enough of the ``Store`` protocol for a ``Worker``: O(1) claims, nothing durable.

    Jobs are ids in a deque; a claim pops up to ``limit`` of them; complete and the other
    transitions accept every claim. It exists to time the worker, not to be a store.
    """

    def __init__(self, jobs: int) -> None:
        from patterns.jobqueue import Job, JobState  # noqa: PLC0415

        self._job, self._running = Job, JobState.RUNNING
        self._queue = collections.deque(range(1, jobs + 1))
        # Guards _queue; taken by the worker's claiming thread.
        self._lock = threading.Lock()

    def claim(self, owner: str, *, lease: float, limit: int = 1) -> list[Any]:
        """Pop up to ``limit`` job ids and return them as claims."""
        from patterns.jobqueue import Claim  # noqa: PLC0415

        until = time.time() + lease
        with self._lock:
            ids = [self._queue.popleft() for _ in range(min(limit, len(self._queue)))]
        return [
            Claim(
                self._job(i, "noop", None, self._running, 0.0, 1, 3, owner, until, None, 0, 0),
                owner,
                until,
            )
            for i in ids
        ]

    def complete(self, claim: Any, result: Any = None) -> bool:
        """Accept."""
        return True

    def settle_many(self, items: Sequence[Any]) -> list[bool | Exception]:
        """Accept every outcome."""
        return [True] * len(items)

    def settle_and_claim(
        self, items: Sequence[Any], owner: str, *, lease: float, limit: int
    ) -> tuple[list[bool | Exception], list[Any]]:
        """Accept every outcome and claim up to ``limit`` jobs in the same call.

        As every real store does (one transaction), so the worker's path is the one it
        takes on SQLite and PostgreSQL: the refill, not the claiming thread.
        """
        return [True] * len(items), self.claim(owner, lease=lease, limit=limit)

    def fail(self, claim: Any, error: str) -> bool:
        """Accept."""
        return True

    def retry(self, claim: Any, error: str, *, run_at: float) -> bool:
        """Accept."""
        return True

    def release(self, claim: Any) -> bool:
        """Accept."""
        return True

    def mark_cancelled(self, claim: Any, reason: str) -> bool:
        """Accept."""
        return True

    def renew(self, claim: Any, *, lease: float) -> Any:
        """Keep the claim as it is."""
        return claim

    def subscribe(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Nothing notifies: the worker's own wake-ups are all there is."""
        return lambda: None

    def record_worker(self, worker_id: str, **row: Any) -> None:
        """No worker rows."""

    def forget_worker(self, worker_id: str) -> None:
        """No worker rows."""

    def next_due(self) -> float | None:
        """Nothing is ever scheduled for later."""
        return None

    def counts(self) -> dict[str, int]:
        """Only the queue length is known."""
        with self._lock:
            queued = len(self._queue)
        return {"queued": queued, "running": 0, "done": 0, "failed": 0}


class Counter:
    """Counts finished jobs from any thread; ``done`` is set at the goal."""

    def __init__(self, goal: int) -> None:
        self.goal = goal
        self.count = 0
        # Guards count; taken by whichever thread finishes a job.
        self._lock = threading.Lock()
        # Set once, by the thread that finishes the last job; waited on by the timer.
        self.done = threading.Event()

    def add(self, *_: object) -> None:
        """Count one job."""
        with self._lock:
            self.count += 1
            if self.count >= self.goal:
                self.done.set()


def drain_worker(store: Any, jobs: int) -> float:
    """Microseconds per job for ``Worker(concurrency=4)`` to drain ``jobs`` from ``store``."""
    from patterns.jobqueue import TaskRegistry, Worker  # noqa: PLC0415

    counter = Counter(jobs)
    tasks = TaskRegistry(on_complete=counter.add)
    tasks.task(name="noop")(lambda payload, ctx: None)
    worker = Worker(store, tasks, concurrency=4)
    start = time.perf_counter()
    worker.start()
    finished = counter.done.wait(300.0)
    seconds = time.perf_counter() - start
    worker.stop(10.0)
    if not finished:
        raise RuntimeError(f"worker drained {counter.count} of {jobs}")
    return seconds / jobs * 1e6


def drain_executor(jobs: int) -> float:
    """Microseconds per job for ``ThreadPoolExecutor(4)`` to run ``jobs`` no-op calls."""
    counter = Counter(jobs)
    with ThreadPoolExecutor(max_workers=4) as pool:
        start = time.perf_counter()
        for _ in range(jobs):
            pool.submit(counter.add)
        finished = counter.done.wait(300.0)
        seconds = time.perf_counter() - start
    if not finished:
        raise RuntimeError(f"executor ran {counter.count} of {jobs}")
    return seconds / jobs * 1e6


def memory_store(jobs: int) -> Any:
    """A ``MemoryStore`` holding ``jobs`` queued no-op jobs."""
    from patterns.jobqueue import MemoryStore  # noqa: PLC0415

    store = MemoryStore()
    store.enqueue_many([{"task": "noop"}] * jobs)
    return store


def with_switch_interval(seconds: float, measure: Callable[[], float]) -> Callable[[], float]:
    """``measure`` run with the interpreter's thread switch interval set to ``seconds``.

    The default is 5 ms: a thread that holds the GIL that long is made to give it up at
    the next chance, whatever it is doing. The rows run at 50 ms show how much of a
    row's spread comes from those forced switches, not from the code under test.
    """

    def measured() -> float:
        before = sys.getswitchinterval()
        sys.setswitchinterval(seconds)
        try:
            return measure()
        finally:
            sys.setswitchinterval(before)

    return measured


def worker_rows(jobs: int, memory_jobs: Sequence[int]) -> dict[str, Callable[[], float]]:
    """Each row's measurement, on fresh stores."""
    rows: dict[str, Callable[[], float]] = {
        "ThreadPoolExecutor(4), submit all": lambda: drain_executor(jobs),
        DEQUE_ROW: lambda: drain_worker(DequeStore(jobs), jobs),
        f"ThreadPoolExecutor(4), switch interval {SLOW_SWITCH * 1e3:g} ms": with_switch_interval(
            SLOW_SWITCH, lambda: drain_executor(jobs)
        ),
        f"{DEQUE_ROW}, switch interval {SLOW_SWITCH * 1e3:g} ms": with_switch_interval(
            SLOW_SWITCH, lambda: drain_worker(DequeStore(jobs), jobs)
        ),
    }
    for size in memory_jobs:
        rows[f"Worker(4) + MemoryStore, {size:,} jobs"] = lambda n=size: drain_worker(
            memory_store(n), n
        )
    return rows


# --- main ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the measurements and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=runs_setting(3), help="(BENCH_RUNS, 3)")
    parser.add_argument(
        "--calls", type=int, default=env_int("BENCH_CALLS", 10_000), help="(BENCH_CALLS, 10000)"
    )
    parser.add_argument(
        "--jobs", type=int, default=env_int("BENCH_JOBS", 20_000), help="(BENCH_JOBS, 20000)"
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    lines = [
        machine_line(),
        f"{args.runs} runs per row; median, min, max; ratio = row / the standard-library row",
    ]
    for callers in (1, 4):
        rows = measure(bulkhead_rows(args.calls, callers), args.runs)
        lines += [
            "",
            (
                f"7a. Bulkhead vs executor, {args.calls:,} no-op calls from {callers} caller "
                f"thread(s), µs per call"
            ),
            *stats_table(
                rows, "µs", reference="ThreadPoolExecutor(4).submit(f).result()", digits=1
            ),
        ]
    emit(lines)
    small = max(1, args.jobs // 10)
    rows = measure(worker_rows(args.jobs, (small, small * 4)), args.runs)
    cost = next(row for row in rows if row.label == DEQUE_ROW).median
    pool = next(row for row in rows if row.label == "ThreadPoolExecutor(4), submit all").median
    emit(
        [
            "",
            (
                f"7b. The job queue Worker's own cost, {args.jobs:,} no-op jobs (MemoryStore rows: "
                "the sizes shown), 4 threads, thread switch interval 5 ms unless the row says "
                "otherwise, µs per job"
            ),
            *stats_table(rows, "µs", reference="ThreadPoolExecutor(4), submit all", digits=1),
            target(
                f"worker cost per job (deque store) <= {WORKER_COST_TARGET:g} µs",
                cost <= WORKER_COST_TARGET,
                f"{cost:.1f} µs",
            ),
            target(
                "worker cost per job (deque store) <= the ThreadPoolExecutor(4) row's",
                cost <= pool,
                f"{cost:.1f} against {pool:.1f} µs, {cost / pool:.2f}x",
            ),
            "",
            end_line(started),
        ]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
