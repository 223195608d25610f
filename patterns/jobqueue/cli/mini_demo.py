"""``python -m patterns.jobqueue demo --mini``: the mini job queue's walkthrough, on a temp file.

The same story as `patterns.jobqueue.cli.demo`, told with ``patterns.jobqueue.mini`` (the
whole queue in one file): it enqueues cooperative, slow, fast, flaky and doomed jobs in a
``MiniStore`` on a temporary SQLite file, starts a mini ``Worker``, stops it in the middle
(the running jobs drain; the ones still running when the drain budget is spent are
cancelled and go back to the queue with their attempt given back), then opens the file
again, as a restarted process would, runs a new worker until the queue is empty, and
ends with a tally that accounts for every job. `run` is the whole of it; it prints,
because it is a user interface (the library logs).

Docs: docs/jobqueue/mini.md
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from patterns.cancellation import CancelToken
from patterns.jobqueue.cli.demo import DemoOutputLost, Screen, ScreenHandler
from patterns.jobqueue.mini import MiniReport, MiniStore, Worker

__all__ = ["run"]

# (task, payload, how many): claimed oldest first, so the long jobs start at once.
_JOBS: tuple[tuple[str, dict[str, Any], int], ...] = (
    ("steps", {"steps": 30, "step": 0.1}, 2),
    ("slow", {"seconds": 0.6}, 6),
    ("fast", {}, 8),
    ("flaky", {}, 2),
    ("doomed", {}, 1),
)
_WHAT = {
    "steps": "3 s, cooperative: token.sleep(0.1) between its 30 steps",
    "slow": "0.6 s in time.sleep: ignores its token",
    "fast": "returns at once",
    "flaky": "fails on its first attempt, succeeds on the next",
    "doomed": "always fails; max_attempts=3",
}
_BUDGET = 2.0  # the first worker's shutdown budget: 1.5 s draining, 0.5 s cancelling
_STOP_AFTER = 1.0  # seconds the first worker runs before it is stopped
_BACKOFF = 0.2  # a failed attempt's retry waits 0.2 s, then 0.4 s


def _handlers() -> dict[str, Callable[[Any, CancelToken], Any]]:
    """The demo's handlers, ``handler(payload, token)``; ``flaky`` remembers its first tries."""
    tried: set[int] = set()
    tried_lock = threading.Lock()

    def steps(payload: dict[str, Any], token: CancelToken) -> int:
        for _ in range(payload["steps"]):
            token.sleep(payload["step"])  # raises Cancelled once the stop cancels the token
        return int(payload["steps"])

    def slow(payload: dict[str, Any], token: CancelToken) -> str:
        time.sleep(payload["seconds"])  # never looks at its token: the drain waits for it
        return "slow done"

    def fast(payload: object, token: CancelToken) -> str:
        return "fast done"

    def flaky(payload: dict[str, Any], token: CancelToken) -> str:
        with tried_lock:
            first = payload["key"] not in tried
            tried.add(payload["key"])
        if first:
            raise ConnectionError("flaky: the first attempt fails")
        return "flaky done"

    def doomed(payload: object, token: CancelToken) -> str:
        raise RuntimeError("doomed: this job always fails")

    return {"steps": steps, "slow": slow, "fast": fast, "flaky": flaky, "doomed": doomed}


def run(out: TextIO = sys.stdout) -> int:
    """Run the walkthrough, writing to ``out``; the exit status: 0 if the tally reconciles.

    If writing to ``out`` fails, the walkthrough still runs to its end (its workers stopped,
    its file removed), then the first write error is raised as
    `~patterns.jobqueue.cli.demo.DemoOutputLost`.
    """
    screen = Screen(out)
    handler = ScreenHandler(screen)  # the mini queue's warnings (a refused outcome) as lines
    mini_logger = logging.getLogger("patterns.jobqueue.mini")
    mini_logger.addHandler(handler)
    try:
        with tempfile.TemporaryDirectory(prefix="jobqueue-mini-demo-") as tmp:
            status = _run_in(os.path.join(tmp, "jobs.sqlite3"), screen)
    finally:
        mini_logger.removeHandler(handler)
    if screen.lost is not None:
        raise DemoOutputLost(screen.lost)
    return status


@contextlib.contextmanager
def _opened(path: str) -> Iterator[MiniStore]:
    store = MiniStore(path)
    try:
        yield store
    finally:
        store.close()


def _rows(path: str) -> dict[int, tuple[str, str, int, str | None]]:
    """Every job in the file: id -> (task, state, attempts, last error), read with plain SQL."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT id, task, state, attempts, last_error FROM jobs").fetchall()
    finally:
        conn.close()
    return {row[0]: (row[1], row[2], row[3], row[4]) for row in rows}


def _run_in(path: str, screen: Screen) -> int:
    say = screen.say
    say("The mini job queue: one file of the pattern modules, a stop on a deadline, a restart.")
    say(f"database: {path}")
    handlers = _handlers()
    with _opened(path) as store:
        say()
        say("1. Enqueue a mix of jobs (claimed oldest first, so the long ones start at once):")
        key = 0
        for name, payload, count in _JOBS:
            for _ in range(count):
                key += 1  # flaky's handler tells its jobs apart by it
                store.enqueue(name, {**payload, "key": key})
            say(f"   {count} x {name:<7} {_WHAT[name]}")
        _stop_in_the_middle(screen, store, handlers, path)
    with _opened(path) as store:  # a new process would open the file again: so does this
        _restart(screen, store, handlers)
    say()
    say("5. The tally: every job enqueued is accounted for.")
    return _tally(screen, path, sum(count for _, _, count in _JOBS))


def _progress_line(store: MiniStore, started: float) -> str:
    counts = store.counts()
    return (
        f"queued {counts['queued']:>2} | running {counts['running']} | done {counts['done']:>2}"
        f" | failed {counts['failed']} | {time.monotonic() - started:4.1f}s"
    )


def _stop_in_the_middle(
    screen: Screen,
    store: MiniStore,
    handlers: dict[str, Callable[[Any, CancelToken], Any]],
    path: str,
) -> None:
    say = screen.say
    say()
    say(
        f"2. Start a mini worker: 4 threads, a {_BUDGET:g} s shutdown budget "
        f"({_BUDGET * 0.75:g} s draining, {_BUDGET * 0.25:g} s cancelling)."
    )
    worker = Worker(
        store, handlers, concurrency=4, poll_interval=0.05, stop_timeout=_BUDGET, backoff=_BACKOFF
    )
    started = time.monotonic()
    worker.start()
    while time.monotonic() - started < _STOP_AFTER:  # a demo paces itself for the reader
        screen.progress(_progress_line(store, started))
        time.sleep(0.05)
    running = {job_id for job_id, row in _rows(path).items() if row[1] == "running"}
    say()
    say("3. Stop in the middle: shut the gate, let the running jobs finish, then cancel")
    say("   the ones still running when the drain budget is spent.")
    stopping = time.monotonic()
    report = worker.stop()
    _show_report(screen, report, time.monotonic() - stopping)
    rows = _rows(path)
    say("   the jobs that were running when the stop began:")
    for job_id in sorted(running):
        task, state, attempts, _ = rows[job_id]
        fate = "interrupted, not failed" if state == "queued" else "finished during the drain"
        say(f"     job {job_id} ({task}): {state}, attempts {attempts}: {fate}")
    say(f"   in the file now: {_counts_text(store.counts())}")


def _show_report(screen: Screen, report: MiniReport, took: float) -> None:
    def named(job_ids: tuple[int, ...]) -> str:
        return ", ".join(map(str, job_ids)) or "none"

    screen.say(f"   report: terminated={report.terminated} (the stop took {took:.2f}s)")
    screen.say(f"     released (back in the queue, attempt given back): {named(report.released)}")
    screen.say(f"     still running at the deadline: {named(report.still_running_ids)}")


def _restart(
    screen: Screen, store: MiniStore, handlers: dict[str, Callable[[Any, CancelToken], Any]]
) -> None:
    screen.say()
    screen.say("4. Restart: the file opened again, a new worker finishes the rest.")
    worker = Worker(
        store, handlers, concurrency=4, poll_interval=0.05, stop_timeout=_BUDGET, backoff=_BACKOFF
    )
    started = time.monotonic()
    worker.start()
    deadline = started + 30.0
    while time.monotonic() < deadline:
        counts = store.counts()
        if counts["queued"] == 0 and counts["running"] == 0:
            break
        screen.progress(_progress_line(store, started))
        time.sleep(0.05)
    report = worker.stop()
    screen.say(
        f"   the queue is empty after {time.monotonic() - started:.1f}s; "
        f"the second worker stopped: terminated={report.terminated}"
    )


def _counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{state} {count}" for state, count in counts.items())


def _tally(screen: Screen, path: str, enqueued: int) -> int:
    say = screen.say
    rows = _rows(path)
    tasks: dict[str, dict[str, int]] = {}
    for task, state, attempts, _ in rows.values():
        row = tasks.setdefault(task, {"jobs": 0, "attempts": 0, "done": 0, "failed": 0, "left": 0})
        row["jobs"] += 1
        row["attempts"] += attempts
        row[state if state in ("done", "failed") else "left"] += 1
    say(f"   {'task':<8} {'enqueued':>8} {'done':>5} {'failed':>6} {'queued':>6} {'attempts':>8}")
    for task, row in tasks.items():
        say(
            f"   {task:<8} {row['jobs']:>8} {row['done']:>5} {row['failed']:>6}"
            f" {row['left']:>6} {row['attempts']:>8}"
        )
    for job_id, (task, state, _, last_error) in rows.items():
        if state == "failed":
            say(f"   job {job_id} ({task}): {last_error}")
    done = sum(1 for row in rows.values() if row[1] == "done")
    failed = sum(1 for row in rows.values() if row[1] == "failed")
    left = len(rows) - done - failed
    say(f"   {enqueued} enqueued = {done} done + {failed} failed + {left} queued or running")
    if len(rows) == enqueued and left == 0:
        say("   Nothing lost, nothing left behind.")
        return 0
    say("   The tally does NOT reconcile.")
    return 1
