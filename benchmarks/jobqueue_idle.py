"""Idle CPU of worker processes on one SQLite file, and where it goes (table 3d).

Run it with ``python -m benchmarks.jobqueue_idle`` (``--help`` for the knobs).

Each row starts ``--workers`` (3) idle ``python -m patterns.jobqueue worker`` processes on
one fresh SQLite file, with the options the row names, waits until each has logged that it
is running, then reads each one's ``utime + stime`` from ``/proc/<pid>/stat`` before and
after ``--seconds`` (20) of wall time: the CPU share, % of one core, of every thread of
that process. The queue stays empty, so what is measured is the cost of waiting: the
store's watcher (``--watch-interval``), the claimer's poll (``--poll-interval``) and the
heartbeat, which renews the worker row every third of ``--lease``. The first row is the
defaults; each further row turns one of these off or makes it rare, so the differences
say where an idle worker's CPU goes. Rows run one after the other (the workers of a row
side by side), so a row's processes share the machine only with each other. ``/proc``
counts in clock ticks (1/100 s on Linux), so over 20 s a share moves in steps of 0.05 %.

Each value is one worker of one run; median, min and max over ``--runs`` runs times
``--workers`` workers; ratio = the row's median over the defaults'. The target line checks
the defaults against "under 1 % of a core, with a margin" (0.5 %). Linux only (``/proc``).
A measurement to read, not a test.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks._tables import (
    ROOT,
    Row,
    child_env,
    emit,
    end_line,
    env_float,
    env_int,
    machine_line,
    runs_setting,
    scratch_dir,
    stats_table,
    target,
)

TASKS = "patterns.jobqueue.cli.demo_tasks:tasks"
STARTED = "-> RUNNING"  # the worker's log line once it has started
START_TIMEOUT = 60.0  # seconds a worker may take to start (imports, under load)
IDLE_TARGET = 0.5  # % of one core: under the 1 % aim with a margin

DEFAULTS = "defaults (watch 0.015 s, poll 1 s, lease 30 s)"
ROWS: dict[str, list[str]] = {
    DEFAULTS: [],
    "watcher off (--watch-interval 0)": ["--watch-interval", "0"],
    "watcher off, poll 30 s": ["--watch-interval", "0", "--poll-interval", "30"],
    "watcher off, poll 30 s, lease 300 s": [
        *["--watch-interval", "0", "--poll-interval", "30", "--lease", "300"]
    ],
}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of every thread of ``pid`` so far, from ``/proc``."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": state is field 3
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_worker(db: Path, options: Sequence[str]) -> subprocess.Popen[str]:
    """An idle CLI worker on ``db``, returned once it has logged that it is running."""
    command = [sys.executable, "-m", "patterns.jobqueue", "--db", str(db), "worker"]
    child = subprocess.Popen(
        [*command, "--tasks", TASKS, *options],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stderr is not None
    deadline = time.monotonic() + START_TIMEOUT
    for line in child.stderr:  # an idle worker logs nothing more: the pipe never fills
        if STARTED in line:
            return child
        if time.monotonic() > deadline:
            break
    child.kill()
    child.wait()
    raise RuntimeError(f"worker {options} did not start: {child.returncode}")


def idle_shares(db: Path, options: Sequence[str], workers: int, seconds: float) -> list[float]:
    """Each worker's CPU share, % of one core, over ``seconds`` of idle wall time."""
    children: list[subprocess.Popen[str]] = []
    try:
        for _ in range(workers):
            children.append(start_worker(db, options))
        before = [cpu_seconds(child.pid) for child in children]
        started = time.monotonic()
        time.sleep(seconds)
        after = [cpu_seconds(child.pid) for child in children]
        wall = time.monotonic() - started
    finally:
        for child in children:
            child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.communicate()
    return [(b - a) / wall * 100 for a, b in zip(before, after, strict=True)]


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the measurements and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=runs_setting(1), help="(BENCH_RUNS, 1)")
    parser.add_argument(
        "--workers",
        type=int,
        default=env_int("BENCH_IDLE_WORKERS", 3),
        help="worker processes on one file per row (BENCH_IDLE_WORKERS, 3)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=env_float("BENCH_IDLE_SECONDS", 20.0),
        help="idle wall time measured per row and run (BENCH_IDLE_SECONDS, 20)",
    )
    parser.add_argument(
        "--rows", default="", help="only the rows whose label contains this text (all)"
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    rows = [Row(label) for label in ROWS if args.rows in label]
    with scratch_dir("bench-idle-") as tmp:
        for run in range(args.runs):
            for i, row in enumerate(rows):
                db = tmp / f"idle-{run}-{i}.db"
                row.values += idle_shares(db, ROWS[row.label], args.workers, args.seconds)
    lines = [
        machine_line(),
        "",
        (
            f"3d. Idle CPU of {args.workers} CLI workers on one SQLite file, % of one core per "
            f"worker over {args.seconds:g} s ({args.runs} run(s); /proc utime + stime)"
        ),
        *stats_table(rows, "%", reference=DEFAULTS, digits=2, label="worker options"),
    ]
    defaults = next((row for row in rows if row.label == DEFAULTS), None)
    if defaults is not None:
        worst = max(defaults.values)
        lines.append(
            target(
                f"every idle worker < {IDLE_TARGET:g} % of a core (the 1 % aim, with a margin)",
                worst < IDLE_TARGET,
                f"worst {worst:.2f} %",
            )
        )
    emit([*lines, "", end_line(started)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
