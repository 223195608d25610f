"""The job queue's drain in two checkouts, interleaved: is a change slower? (one table).

Run it with ``python -m benchmarks.jobqueue_drain_ab --before PATH`` where PATH is another
checkout of this project (``git worktree add /tmp/before <commit>``); ``--after`` defaults
to this one. Each drain runs in a fresh interpreter whose ``PYTHONPATH`` is the checkout's,
so each side imports its own ``patterns``, through the public names only (``from
patterns.jobqueue import SQLiteStore, PostgresStore, TaskRegistry, Worker``), which both
sides must have.

A drain: ``--jobs`` no-op jobs (10,000) are enqueued with ``enqueue_many``, then
``Worker(store, tasks, concurrency=4)`` at its defaults runs them; the rate is jobs over the
seconds from ``start()`` to the last ``on_complete``, and every job must be done afterwards.
SQLite at ``synchronous=NORMAL`` and ``FULL``, a fresh file each time; PostgreSQL when
``PATTERNS_PG_DSN`` names a server (``scripts/pg-test-cluster.sh run -- ...`` starts one),
a fresh schema each time, dropped afterwards. ``--rounds`` rounds (5), each running every
case on both sides, the side that goes first alternating, so that drift in the machine's
speed hits both alike. The table gives each side's median (min-max) and the median of the
per-round ratios after/before. This is a measurement to read, not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks._tables import emit

HERE = Path(__file__).resolve().parent.parent
DSN_VARIABLE = "PATTERNS_PG_DSN"

# Run in the child, on one side's ``patterns``: prints the drain's jobs per second.
CHILD = """
import sys, threading, time
from patterns.jobqueue import TaskRegistry, Worker
kind, target, jobs = sys.argv[1], sys.argv[2], int(sys.argv[3])
if kind == "postgres":
    from patterns.jobqueue import PostgresStore
    def open_store():
        return PostgresStore(target, schema=sys.argv[4])
else:
    from patterns.jobqueue import SQLiteStore
    def open_store():
        return SQLiteStore(target, synchronous=kind)
filler = open_store()
for first in range(0, jobs, 5000):
    filler.enqueue_many([{"task": "noop"}] * min(5000, jobs - first))
filler.close()
lock, done, count = threading.Lock(), threading.Event(), [0]
def counted(*_args, **_kwargs):
    with lock:
        count[0] += 1
        if count[0] >= jobs:
            done.set()
tasks = TaskRegistry(on_complete=counted)
tasks.task(name="noop")(lambda payload, ctx: None)
store = open_store()
worker = Worker(store, tasks, concurrency=4)
began = time.perf_counter()
worker.start()
finished = done.wait(300)
seconds = time.perf_counter() - began
report = worker.stop(10.0)
left = store.counts()["done"]
store.close()
if not finished or not report.terminated or left != jobs:
    sys.exit(f"drain failed: {count[0]} counted, {left} done of {jobs}")
print(jobs / seconds)
"""


def drain(checkout: Path, kind: str, jobs: int, dsn: str | None) -> float:
    """Jobs per second of one drain on ``checkout``'s code, in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    with tempfile.TemporaryDirectory(prefix="drain-ab-") as tmp:
        if kind == "postgres":
            assert dsn is not None
            schema = f"drain_{uuid.uuid4().hex[:12]}"
            args = [kind, dsn, str(jobs), schema]
        else:
            args = [kind, str(Path(tmp) / "q.sqlite3"), str(jobs)]
        try:
            out = subprocess.run(
                [sys.executable, "-c", CHILD, *args],
                env=env,
                cwd=tmp,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        except subprocess.CalledProcessError as exc:
            raise SystemExit(f"{checkout} {kind}: {exc.stderr.strip()[-600:]}") from None
        finally:
            if kind == "postgres":
                drop_schema(dsn, schema)
    return float(out.split()[-1])


def drop_schema(dsn: str | None, schema: str) -> None:
    """Drop a drain's schema (psycopg is the postgres extra's)."""
    import psycopg  # noqa: PLC0415

    with psycopg.connect(dsn or "", autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def main(argv: list[str] | None = None) -> None:
    """Run the rounds and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--before", type=Path, required=True, help="the other checkout")
    parser.add_argument("--after", type=Path, default=HERE, help="default: this checkout")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args(argv)
    dsn = os.environ.get(DSN_VARIABLE) or None
    kinds = ["NORMAL", "FULL", *(["postgres"] if dsn else [])]
    sides = {"before": options.before.resolve(), "after": options.after.resolve()}
    rates: dict[tuple[str, str], list[float]] = {(k, s): [] for k in kinds for s in sides}
    emit([f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"])
    began = time.monotonic()
    for round_number in range(options.rounds):
        order = list(sides) if round_number % 2 == 0 else list(reversed(sides))
        for kind in kinds:
            for side in order:
                rates[kind, side].append(drain(sides[side], kind, options.jobs, dsn))
    lines = [
        f"before: {sides['before']}",
        f"after:  {sides['after']}",
        f"{options.jobs:,} jobs, Worker(concurrency=4) at its defaults, {options.rounds} rounds",
        "",
        "| drain | before, jobs/s | after, jobs/s | after / before |",
        "|---|---:|---:|---:|",
    ]
    for kind in kinds:
        cells = []
        for side in sides:
            values = rates[kind, side]
            cells.append(
                f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"
            )
        ratios = [a / b for a, b in zip(rates[kind, "after"], rates[kind, "before"], strict=True)]
        name = "PostgreSQL" if kind == "postgres" else f"SQLite, synchronous={kind}"
        lines.append(f"| {name} | {cells[0]} | {cells[1]} | {statistics.median(ratios):.2f} |")
    if not dsn:
        lines += ["", f"PostgreSQL left out: {DSN_VARIABLE} is not set."]
    loads = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines += ["", f"{time.monotonic() - began:.0f} s; load average at the end: {loads}"]
    emit(lines)


if __name__ == "__main__":
    main()
