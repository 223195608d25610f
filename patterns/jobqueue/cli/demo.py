"""``python -m patterns.jobqueue demo``: the job queue's walkthrough, on a temporary database.

It enqueues fast, slow, cooperative, flaky and doomed jobs (``patterns.jobqueue.cli.demo_tasks``),
starts a worker, stops it in the middle as SIGTERM would (each shutdown phase shown),
restarts a new worker on the same file, and ends with a tally that accounts for every job.
`run` is the whole of it; it prints, because it is a user interface (the library logs).

Docs: docs/jobqueue/index.md
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from patterns.jobqueue.cli.demo_tasks import tasks as demo_tasks
from patterns.jobqueue.stores.records import JobState
from patterns.jobqueue.stores.sqlite.store import SQLiteStore
from patterns.jobqueue.worker.worker import Worker, WorkerReport

__all__ = ["DemoOutputLost", "Screen", "ScreenHandler", "run"]

# (task, payload, how many): claimed oldest first, so the long jobs start at once.
_JOBS: tuple[tuple[str, dict[str, object], int], ...] = (
    ("crunch", {"steps": 40, "step": 0.1}, 2),
    ("slow", {"seconds": 0.6}, 6),
    ("fast", {}, 8),
    ("flaky", {"succeed_on": 2}, 2),
    ("doomed", {}, 1),
)
_WHAT = {
    "crunch": "4 s, cooperative: ctx.sleep(0.1) between its 40 steps",
    "slow": "0.6 s in time.sleep: ignores its token",
    "fast": "returns at once",
    "flaky": "fails on attempt 1, succeeds on attempt 2",
    "doomed": "always fails; max_attempts=3",
}
_BUDGET = 2.0  # the first worker's shutdown budget: 1.5 s draining, 0.5 s cancelling
_STOP_AFTER = 1.0  # seconds the first worker runs before it is stopped


class Screen:
    """The demo's output: lines, and one live progress line redrawn in place on a terminal."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._live = out.isatty()
        # Guards the output, written by the main thread and by the logging handler
        # (from worker threads); held only while a line is written.
        self._lock = threading.Lock()
        self._progress_shown = False
        self._last_plain = 0.0
        # The first write that failed (a closed pipe, a full disk): nothing is written after
        # it, and the walkthrough goes on, so its workers stop as they always do.
        self.lost: OSError | None = None

    def say(self, text: str = "") -> None:
        """Print a line (under the progress line, which it clears)."""
        with self._lock:
            self._write(lambda: self._say(text))

    def _say(self, text: str) -> None:
        self._clear()
        print(text, file=self._out, flush=True)

    def progress(self, text: str) -> None:
        """Redraw the progress line on a terminal; elsewhere print it at most twice a second."""
        with self._lock:
            if self._live:
                self._write(lambda: self._redraw(text))
            elif time.monotonic() - self._last_plain >= 0.5:  # a log file: fewer lines
                self._last_plain = time.monotonic()
                self._write(lambda: print("   " + text, file=self._out, flush=True))

    def _redraw(self, text: str) -> None:
        self._out.write("\r\x1b[2K   " + text)
        self._out.flush()
        self._progress_shown = True

    def _write(self, write: Callable[[], None]) -> None:
        """Run ``write`` (with the lock held) unless a write already failed; keep the failure."""
        if self.lost is not None:
            return
        try:
            write()
        except OSError as exc:
            self.lost = exc

    def _clear(self) -> None:
        if self._progress_shown:
            self._out.write("\r\x1b[2K")
            self._progress_shown = False


class ScreenHandler(logging.Handler):
    """Shows the worker's state transitions and warnings as demo lines."""

    def __init__(self, screen: Screen) -> None:
        super().__init__(logging.INFO)
        self._screen = screen

    def emit(self, record: logging.LogRecord) -> None:
        """Show a state transition or a warning as a demo line; drop the rest."""
        event = getattr(record, "event", None)
        if event is not None:
            self._screen.say(f"   [state] {record.getMessage().split(': ', 1)[1]}")
        elif record.levelno >= logging.WARNING or "interrupted" in record.getMessage():
            self._screen.say(f"   [log] {record.levelname.lower()}: {record.getMessage()}")


def _progress_line(store: SQLiteStore, worker: Worker, started: float) -> str:
    counts = store.counts()
    return (
        f"queued {counts['queued']:>2} | running {counts['running']} | done {counts['done']:>2}"
        f" | failed {counts['failed']} | {worker.state.value} | {time.monotonic() - started:4.1f}s"
    )


def run(out: TextIO = sys.stdout) -> int:
    """Run the walkthrough, writing to ``out``; the exit status: 0 if the tally reconciles.

    If writing to ``out`` fails, the walkthrough still runs to its end (its workers stopped,
    its database removed), then the first write error is raised as `DemoOutputLost`.
    """
    screen = Screen(out)
    handler = ScreenHandler(screen)
    jobqueue_logger = logging.getLogger("patterns.jobqueue")
    jobqueue_logger.addHandler(handler)
    previous_level = jobqueue_logger.level
    jobqueue_logger.setLevel(logging.INFO)
    try:
        with tempfile.TemporaryDirectory(prefix="jobqueue-demo-") as tmp:
            status = _run_in(os.path.join(tmp, "jobs.sqlite3"), screen)
    finally:
        jobqueue_logger.removeHandler(handler)
        jobqueue_logger.setLevel(previous_level)
    if screen.lost is not None:
        raise DemoOutputLost(screen.lost)
    return status


class DemoOutputLost(Exception):
    """The demo's output could not be written; ``cause`` is the first write's error."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _run_in(path: str, screen: Screen) -> int:
    say = screen.say
    say("The job queue: a durable SQLite queue, a deadline-driven stop, and a restart.")
    say(f"database: {path}")
    store = SQLiteStore(path)
    try:
        say()
        say("1. Enqueue a mix of jobs (claimed oldest first, so the long ones start at once):")
        ids: dict[int, str] = {}
        for name, payload, count in _JOBS:
            for _ in range(count):
                ids[demo_tasks.enqueue(store, name, payload)] = name
            say(f"   {count} x {name:<7} {_WHAT[name]}")
        _stop_in_the_middle(screen, store, ids)
        _restart(screen, store)
        say()
        say("5. The tally: every job enqueued is accounted for.")
        return _tally(screen, store, ids)
    finally:
        store.close()


def _stop_in_the_middle(screen: Screen, store: SQLiteStore, ids: dict[int, str]) -> None:
    say = screen.say
    before = {job_id: store.get(job_id) for job_id in ids}
    say()
    say(
        f"2. Start a worker: 4 threads, a {_BUDGET:g} s shutdown budget "
        f"({_BUDGET * 0.75:g} s draining, {_BUDGET * 0.25:g} s cancelling)."
    )
    worker = Worker(store, demo_tasks, concurrency=4, poll_interval=0.05, stop_timeout=_BUDGET)
    started = time.monotonic()
    worker.start()
    while time.monotonic() - started < _STOP_AFTER:  # a demo paces itself for the reader
        screen.progress(_progress_line(store, worker, started))
        time.sleep(0.05)
    say()
    say("3. Stop in the middle, as on SIGTERM: stop claiming, let the running jobs finish,")
    say("   cancel the ones still running when the drain budget is spent, and give back at")
    say("   once the jobs claimed ahead (prefetched, up to four per thread) that never started.")
    # Once the stop is requested no job starts: the jobs running now are those it lets
    # finish or interrupts; the other released jobs were waiting for a thread.
    worker.request_stop("stop() called")
    ran = set(worker.running_jobs())
    report = worker.stop()
    _show_report(screen, report, ids)
    say(f"   in the database now: {_counts_text(store.counts())}")
    for job_id in report.released:
        old, new = before[job_id], store.get(job_id)
        if old is None or new is None:
            continue
        same = new.run_at == old.run_at and new.attempts == old.attempts
        fate = "interrupted, not failed" if job_id in ran else "prefetched, never started"
        say(
            f"   released job {job_id} ({ids[job_id]}): {new.state.value}, attempts "
            f"{new.attempts}, run_at {'unchanged' if same else 'CHANGED'}: {fate}"
        )


def _restart(screen: Screen, store: SQLiteStore) -> None:
    screen.say()
    screen.say("4. Restart: a new worker on the same file finishes the rest.")
    worker = Worker(store, demo_tasks, concurrency=4, poll_interval=0.05, stop_timeout=_BUDGET)
    started = time.monotonic()
    worker.start()
    deadline = started + 30.0
    while time.monotonic() < deadline:
        counts = store.counts()
        if counts["queued"] == 0 and counts["running"] == 0:
            break
        screen.progress(_progress_line(store, worker, started))
        time.sleep(0.05)
    worker.stop()
    stats = worker.stats()
    screen.say(
        f"   the second worker settled {stats.settled} claim(s) in "
        f"{time.monotonic() - started:.1f}s: {stats.done} done, {stats.retried} retried, "
        f"{stats.failed} failed"
    )


def _show_report(screen: Screen, report: WorkerReport, ids: dict[int, str]) -> None:
    def named(job_ids: Sequence[int]) -> str:
        return ", ".join(f"{i} {ids[i]}" for i in job_ids) or "none"

    phases = ", ".join(f"{s.value} {t:.2f}s" for s, t in report.phases.items())
    screen.say(f"   report: terminated={report.terminated} ({phases}, total {report.elapsed:.2f}s)")
    screen.say(f"     completed during the stop: {named(report.completed)}")
    screen.say(f"     released (back in the queue, unchanged): {named(report.released)}")
    screen.say(f"     still running at the deadline: {named(report.still_running_ids)}")


def _counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{state.value} {counts[state.value]}" for state in JobState)


def _tally(screen: Screen, store: SQLiteStore, ids: dict[int, str]) -> int:
    say = screen.say
    rows: dict[str, dict[str, int]] = {}
    last_errors: list[str] = []
    for job_id, name in ids.items():
        job = store.get(job_id)
        row = rows.setdefault(name, {"jobs": 0, "attempts": 0, **dict.fromkeys(JobState, 0)})
        row["jobs"] += 1
        if job is None:
            continue
        row[job.state] += 1
        row["attempts"] += job.attempts
        if job.state is JobState.FAILED and job.last_error:
            last_errors.append(f"job {job_id} ({name}): {job.last_error}")
    say(f"   {'task':<8} {'enqueued':>8} {'done':>5} {'failed':>6} {'queued':>6} {'attempts':>8}")
    for name, row in rows.items():
        say(
            f"   {name:<8} {row['jobs']:>8} {row[JobState.DONE]:>5} {row[JobState.FAILED]:>6}"
            f" {row[JobState.QUEUED] + row[JobState.RUNNING]:>6} {row['attempts']:>8}"
        )
    for line in last_errors:
        say(f"   {line}")
    counts = store.counts()
    total = sum(counts.values())
    cancelled = counts.get("cancelled", 0)
    settled = counts["done"] + counts["failed"] + cancelled
    say(
        f"   {len(ids)} enqueued = {counts['done']} done + {counts['failed']} failed"
        f" + {cancelled} cancelled + {counts['queued']} queued + {counts['running']} running"
    )
    if total == len(ids) == settled:
        say("   Nothing lost, nothing left behind.")
        return 0
    say("   The tally does NOT reconcile.")
    return 1
