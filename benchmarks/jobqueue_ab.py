"""The job queue in two checkouts and its peers, interleaved in one run: did it get faster?

Run it with ``python -m benchmarks.jobqueue_ab --before PATH`` where PATH is another checkout
of this project (``git worktree add /tmp/before <commit>``); ``--after`` defaults to this one.
Every measurement runs in a fresh interpreter (``python -c``, from this checkout's root)
whose ``sys.path`` starts with a directory holding only a link to one side's ``patterns``,
so each side runs its own code through the public names only (``from patterns.jobqueue
import SQLiteStore, TaskRegistry, Worker``) and the peers' code is this checkout's
``benchmarks.jobqueue_throughput`` and ``benchmarks.postgres_compare``. The child reports
the ``patterns`` it imported, and the run stops if that is not the side's.

The cases, each at the defaults a user gets, ``Worker(store, tasks, concurrency=4)``:

* drain, SQLite at ``synchronous=NORMAL`` and ``FULL``: ``--jobs`` no-op jobs (10,000) put
  in with ``enqueue_many``, then drained; the rate is jobs over the seconds from
  ``start()`` to the last ``on_complete`` (run after the job's commit), and every job must be
  done afterwards. Peer: huey's consumer, 4 threads (``jobqueue_throughput.drain_huey``).
* enqueue, one job per call, SQLite at ``NORMAL`` and ``FULL``: ``--enqueue-jobs`` calls
  (2,000) of ``SQLiteStore.enqueue("noop", i)`` on a fresh file. Peer: huey's task call.
* drain, PostgreSQL (when ``PATTERNS_PG_DSN`` names a server; ``scripts/pg-test-cluster.sh
  run -- ...`` starts one), as ``benchmarks.postgres_compare`` measures it (first handler
  start to last commit, a fresh database per drain): at the defaults next to pgqueuer at its
  defaults, and with at most 4 jobs in flight (``prefetch=0``) next to pgqueuer with
  ``batch_size=2, max_concurrent_tasks=4``.

``--rounds`` rounds (5); each round runs every case on the before side, the after side and
the peer, in an order that rotates from round to round, so that drift in the machine's speed
hits all three alike. The table gives each one's median (min-max), the median of the
per-round ratios after / before, and each side's median over the peer's median, the ratio
the performance targets are stated in (docs/jobqueue/performance.md). The load average is
printed at the start and the end.
This is a measurement to read, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks._tables import emit, load_average, machine_line, scratch_dir

HERE = Path(__file__).resolve().parent.parent
DSN_VARIABLE = "PATTERNS_PG_DSN"
SIDES = ("before", "after", "peer")

# Run in the child: argv = [code dir, case, sync, file or database, count]; prints JSON.
CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import patterns
from benchmarks.jobqueue_ab import run_case
result = run_case(*sys.argv[2:])
result["patterns"] = patterns.__file__
print(json.dumps(result))
"""


def run_case(case: str, setting: str, target: str, count: str) -> dict[str, Any]:
    """One measurement in this (child) process: ``{"rate": jobs per second}``."""
    from benchmarks import jobqueue_throughput as sqlite_bench  # noqa: PLC0415
    from benchmarks import postgres_compare as pg_bench  # noqa: PLC0415

    n, path = int(count), Path(target)
    if case == "drain":
        seconds = sqlite_bench.drain_project(path, setting, n)  # Worker at its defaults
    elif case == "drain-huey":
        seconds = sqlite_bench.drain_huey(path, setting, n)
    elif case == "enqueue":
        seconds = sqlite_bench.enqueue_project(path, setting, n)
    elif case == "enqueue-huey":
        seconds = sqlite_bench.enqueue_huey(path, setting, n)
    else:  # PostgreSQL: setting is the row's spec (ours) or system (pgqueuer)
        dsn = pg_bench.database_dsn(pg_bench.base_dsn(), target)
        if case == "pg-drain":
            seconds = pg_bench.ours_drain(dsn, setting, n)["seconds"]
        else:
            seconds = pg_bench.pgq_drain(dsn, setting, n)["seconds"]
    return {"rate": n / seconds}


@contextmanager
def code_dir(checkout: Path) -> Iterator[Path]:
    """A directory holding only ``patterns``, a link to ``checkout``'s."""
    with tempfile.TemporaryDirectory(prefix="ab-code-") as tmp:
        (Path(tmp) / "patterns").symlink_to(checkout / "patterns", target_is_directory=True)
        yield Path(tmp)


def measure(code: Path, side_patterns: Path, args: list[str]) -> float:
    """Run one case in a fresh interpreter on ``code``; its rate, checked to be that side's."""
    env = {**os.environ, "PYTHONPATH": "", "PYTHONUNBUFFERED": "1"}
    try:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(code), *args],
            env=env,
            cwd=HERE,
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        ).stdout
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"{' '.join(args)} on {code}: {exc.stderr.strip()[-800:]}") from None
    result = json.loads(out.strip().splitlines()[-1])
    imported = Path(result["patterns"]).resolve().parent
    if imported != side_patterns.resolve():
        raise SystemExit(f"the child imported {imported}, not {side_patterns}")
    return float(result["rate"])


# (label, our case, our setting, peer case, peer setting, count option, target ratio to peer)
SQLITE_CASES = [
    ("drain, SQLite NORMAL", "drain", "NORMAL", "drain-huey", "NORMAL", "jobs", 3.0),
    ("drain, SQLite FULL", "drain", "FULL", "drain-huey", "FULL", "jobs", 3.0),
    (
        "enqueue 1 per call, SQLite NORMAL",
        "enqueue",
        "NORMAL",
        "enqueue-huey",
        "NORMAL",
        "n",
        1.0,
    ),
    ("enqueue 1 per call, SQLite FULL", "enqueue", "FULL", "enqueue-huey", "FULL", "n", 1.0),
]
PG_CASES = [
    ("drain, PostgreSQL, defaults", "pg-drain", "threads=4", "pg-peer", "pgqueuer", "jobs", 1.0),
    (
        "drain, PostgreSQL, <= 4 in flight",
        "pg-drain",
        "threads=4,prefetch=0",
        "pg-peer",
        "pgqueuer-4",
        "jobs",
        2.0,
    ),
]


def main(argv: list[str] | None = None) -> None:
    """Run the rounds and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--before", type=Path, required=True, help="the other checkout")
    parser.add_argument("--after", type=Path, default=HERE, help="default: this checkout")
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs per drain (10,000)")
    parser.add_argument("--enqueue-jobs", type=int, default=2_000, help="enqueue calls (2,000)")
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args(argv)
    counts = {"jobs": options.jobs, "n": options.enqueue_jobs}
    dsn = os.environ.get(DSN_VARIABLE) or None
    cases = SQLITE_CASES + (PG_CASES if dsn else [])
    checkouts = {"before": options.before.resolve(), "after": options.after.resolve()}
    rates: dict[tuple[str, str], list[float]] = {(c[0], s): [] for c in cases for s in SIDES}
    emit([machine_line(), f"load average at the start: {load_average()}"])
    began = time.monotonic()
    with (
        code_dir(checkouts["before"]) as before,
        code_dir(checkouts["after"]) as after,
        scratch_dir("ab-") as tmp,
    ):
        codes = {"before": before, "after": after, "peer": after}
        for round_number in range(options.rounds):
            shift = round_number % len(SIDES)
            order = SIDES[shift:] + SIDES[:shift]
            for label, ours, setting, peer, peer_setting, count, _ in cases:
                for side in order:
                    case, what = (peer, peer_setting) if side == "peer" else (ours, setting)
                    args = [case, what, "", str(counts[count])]
                    side_patterns = checkouts["after" if side == "peer" else side] / "patterns"
                    if case.startswith("pg"):
                        from benchmarks.postgres_compare import fresh_database  # noqa: PLC0415

                        with fresh_database(dsn or "") as database:
                            args[2] = database
                            rate = measure(codes[side], side_patterns, args)
                    else:
                        args[2] = str(tmp / f"{round_number}-{case}-{what}-{side}.db")
                        rate = measure(codes[side], side_patterns, args)
                    rates[label, side].append(rate)
    emit(table(cases, rates, checkouts, options))
    if not dsn:
        emit([f"PostgreSQL left out: {DSN_VARIABLE} is not set."])
    emit([f"{time.monotonic() - began:.0f} s; load average at the end: {load_average()}"])


def table(
    cases: list[tuple[Any, ...]],
    rates: dict[tuple[str, str], list[float]],
    checkouts: dict[str, Path],
    options: argparse.Namespace,
) -> list[str]:
    """The table: medians (min-max), after / before per round, each side over the peer."""

    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"

    lines = [
        f"before: {checkouts['before']}",
        f"after:  {checkouts['after']}",
        (
            f"{options.rounds} rounds; drains of {options.jobs:,} jobs, "
            f"{options.enqueue_jobs:,} enqueue calls; jobs/s, median (min-max)"
        ),
        "",
        (
            "| case | peer | before | after | peer's | after / before | before / peer"
            " | after / peer | target |"
        ),
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for label, _, _, peer, peer_setting, _, goal in cases:
        before, after, peer_rates = (rates[label, side] for side in SIDES)
        per_round = statistics.median(a / b for a, b in zip(after, before, strict=True))
        peer_median = statistics.median(peer_rates)
        vs_before = statistics.median(before) / peer_median
        vs_after = statistics.median(after) / peer_median
        name = peer_setting if peer.startswith("pg") else f"huey ({peer_setting})"
        verdict = "met" if vs_after >= goal else "not met"
        lines.append(
            f"| {label} | {name} | {cell(before)} | {cell(after)} | {cell(peer_rates)} "
            f"| {per_round:.2f} | {vs_before:.2f}x | {vs_after:.2f}x | >= {goal:g}x: {verdict} |"
        )
    return lines


if __name__ == "__main__":
    main()
