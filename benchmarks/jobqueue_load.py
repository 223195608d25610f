"""The job queue under load: 100,000 jobs enqueued and drained, and the memory it takes.

Run it with ``python -m benchmarks.jobqueue_load`` (``--help`` for the knobs, among them
``--synchronous FULL``; about 20 s on a 2-core machine). For each size (10,000 and
100,000 jobs by default), on a new SQLite file in a temporary directory, two fresh
processes run one after the other:

* ``enqueue``: a producer adds the jobs with ``SQLiteStore.enqueue_many``, ``--batch``
  jobs per transaction, building each batch only when it is due;
* ``drain``: a ``Worker`` with ``--concurrency`` handler threads runs every job (a handler
  that does nothing) and stops once the queue is empty (``exit_when_empty``).

A third kind of process, ``idle``, opens an empty store and runs a worker that finds
nothing: the memory the runtime itself needs, for comparison.

Each process reports its own peak resident set size, ``VmHWM`` from
``/proc/self/status`` (``resource.getrusage`` where there is no ``/proc``), and the peak
of SQLite's own heap (``sqlite3_memory_highwater``, called through ``ctypes`` on the
library the ``sqlite3`` module loaded; "-" where that fails): the page cache lives there,
and it grows with the file up to ``cache_size`` (2 MiB by default) and no further. Fresh
processes, so one measurement cannot inherit another's high-water mark. The claim that
matters: the peak does not grow with the number of jobs in the table, because claims are
streamed through an index (``LIMIT`` free handler threads at a time) and nothing loads
the whole table. Under the table, the growth from the smallest size to the largest, per
phase, split into SQLite's heap and the rest, and the target line: the peak RSS stays
flat from 10,000 to 100,000 jobs, that is grows by at most 1 MiB beyond what SQLite's
heap grew (the whole growth where the heap cannot be read), in the phase that grew most;
met or not met. This is a measurement to read, not a test: nothing here asserts on a time.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._tables import end_line, machine_line, target
from patterns.jobqueue import SQLiteStore, TaskRegistry, Worker

SIZES = (10_000, 100_000)
MIB = 1024 * 1024
FLAT_MIB = 1.0  # the most the peak RSS may grow (beyond SQLite's heap) from 10k to 100k jobs


def peak_rss() -> int:
    """This process's peak resident set size, in bytes."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, kB elsewhere


def sqlite_heap_peak() -> int:
    """The peak of SQLite's own heap in this process, in bytes; -1 if it cannot be read."""
    try:
        import _sqlite3  # noqa: PLC0415 - the extension module, for the library it loaded

        library = ctypes.CDLL(_sqlite3.__file__)
        highwater = library.sqlite3_memory_highwater
    except (ImportError, OSError, AttributeError):
        return -1
    highwater.restype = ctypes.c_int64
    highwater.argtypes = [ctypes.c_int]
    return int(highwater(0))


def enqueue(db: str, jobs: int, batch: int, synchronous: str) -> dict[str, Any]:
    """Add ``jobs`` jobs, ``batch`` per transaction; only one batch exists at a time."""
    store = SQLiteStore(db, synchronous=synchronous)
    start = time.perf_counter()
    for first in range(0, jobs, batch):
        count = min(batch, jobs - first)
        store.enqueue_many(
            [{"task": "noop", "payload": {"n": n}} for n in range(first, first + count)]
        )
    seconds = time.perf_counter() - start
    counts = store.counts()
    store.close()
    return {"seconds": seconds, "queued": counts["queued"]}


def drain(db: str, concurrency: int, synchronous: str) -> dict[str, Any]:
    """Run every due job with a worker that stops once nothing is due or running."""
    tasks = TaskRegistry()
    tasks.task(name="noop")(lambda payload, ctx: None)
    store = SQLiteStore(db, synchronous=synchronous)
    worker = Worker(store, tasks, concurrency=concurrency, poll_interval=0.05, exit_when_empty=True)
    start = time.perf_counter()
    report = worker.run()
    seconds = time.perf_counter() - start
    counts = store.counts()
    store.close()
    return {"seconds": seconds, "done": counts["done"], "finished": report.terminated}


def child(args: argparse.Namespace) -> int:
    """One measurement, in this (fresh) process; prints one JSON line."""
    if args.child == "enqueue":
        result = enqueue(args.db, args.jobs, args.batch, args.synchronous)
    else:  # "drain" and "idle" (a drain of an empty store)
        result = drain(args.db, args.concurrency, args.synchronous)
    result["peak_rss"] = peak_rss()
    result["sqlite_heap"] = sqlite_heap_peak()
    print(json.dumps(result))  # noqa: T201 - read by the parent process
    return 0


def run_child(kind: str, db: Path, jobs: int, args: argparse.Namespace) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter and return what it reported."""
    command = [
        *(sys.executable, "-m", "benchmarks.jobqueue_load", "--child", kind),
        *("--db", str(db), "--jobs", str(jobs), "--batch", str(args.batch)),
        *("--concurrency", str(args.concurrency), "--synchronous", args.synchronous),
    ]
    root = Path(__file__).resolve().parent.parent
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    )
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, env=env, cwd=root, timeout=600
    )
    if done.returncode != 0:
        raise SystemExit(f"{kind} of {jobs} jobs failed ({done.returncode}):\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def measure(args: argparse.Namespace) -> list[tuple[str, int, dict[str, Any], float]]:
    """(phase, jobs, result, file size) for the idle baseline and each size's two phases."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="jobqueue-load-") as tmp:
        idle_db = Path(tmp) / "idle.db"
        SQLiteStore(idle_db).close()
        rows.append(("idle", 0, run_child("idle", idle_db, 0, args), 0.0))
        for jobs in args.sizes:
            db = Path(tmp) / f"{jobs}.db"
            made = run_child("enqueue", db, jobs, args)
            assert made["queued"] == jobs, made
            size = db.stat().st_size / MIB
            rows.append(("enqueue", jobs, made, size))
            drained = run_child("drain", db, jobs, args)
            assert drained["done"] == jobs, drained
            assert drained["finished"], drained
            rows.append(("drain", jobs, drained, db.stat().st_size / MIB))
    return rows


def mib(value: float) -> str:
    """Bytes as MiB with one decimal; "-" for a value that could not be read (negative)."""
    return "-" if value < 0 else f"{value / MIB:.1f}"


def table(rows: list[tuple[str, int, dict[str, Any], float]]) -> list[str]:
    """The result table, the growth of the peaks from the smallest to the largest size."""
    head = (
        f"{'phase':<8} {'jobs':>8} {'seconds':>8} {'jobs/s':>8} {'peak RSS MiB':>13} "
        f"{'SQLite heap MiB':>16} {'file MiB':>9}"
    )
    lines = [head, "-" * len(head)]
    for phase, jobs, result, size in rows:
        rate = f"{jobs / result['seconds']:,.0f}" if jobs else "-"
        lines.append(
            f"{phase:<8} {jobs:>8,} {result['seconds']:>8.2f} {rate:>8} "
            f"{mib(result['peak_rss']):>13} {mib(result.get('sqlite_heap', -1)):>16} "
            f"{size:>9.1f}"
        )
    sizes = sorted({jobs for _, jobs, _, _ in rows if jobs})
    if len(sizes) < 2:  # a growth needs two sizes
        return [*lines, target("peak RSS stays flat", None, "one size only")]
    small, large = sizes[0], sizes[-1]
    judged: dict[str, tuple[float, str]] = {}  # phase -> (growth judged, how it was measured)
    for phase in ("enqueue", "drain"):
        found = {jobs: r for p, jobs, r, _ in rows if p == phase}
        growth = (found[large]["peak_rss"] - found[small]["peak_rss"]) / MIB
        line = (
            f"{phase}: peak RSS {mib(found[small]['peak_rss'])} MiB for {small:,} jobs, "
            f"{mib(found[large]['peak_rss'])} MiB for {large:,} ({growth:+.2f} MiB"
        )
        judged[phase] = (growth, f"{growth:+.2f} MiB in all")
        heaps = [found[n].get("sqlite_heap", -1) for n in (small, large)]
        if min(heaps) >= 0:
            heap = (heaps[1] - heaps[0]) / MIB
            line += f"; SQLite's heap {heap:+.2f} MiB, the rest {growth - heap:+.2f} MiB"
            judged[phase] = (
                growth - heap,
                f"{growth - heap:+.2f} MiB beyond SQLite's heap, {growth:+.2f} MiB in all",
            )
        lines.append(line + ")")
    worst = max(judged, key=lambda phase: judged[phase][0])
    growth, measured = judged[worst]
    lines.append(
        target(
            f"peak RSS {small:,} -> {large:,} jobs stays flat (grows <= {FLAT_MIB:g} MiB "
            "beyond SQLite's page cache, which cache_size bounds)",
            growth <= FLAT_MIB,
            f"{measured} ({worst}, the larger growth)",
        )
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Measure and print the table (or, with ``--child``, one measurement)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.jobqueue_load", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), metavar="N")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1000, help="jobs per enqueue transaction")
    parser.add_argument(
        "--synchronous", default="NORMAL", choices=["NORMAL", "FULL"], help="the store's setting"
    )
    parser.add_argument("--child", choices=["enqueue", "drain", "idle"], help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--jobs", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    started = time.monotonic()
    print(  # noqa: T201 - a benchmark prints its table
        f"{machine_line()}\n"
        f"SQLite job store (synchronous={args.synchronous}), {args.concurrency} handler "
        f"threads, batches of {args.batch:,}; each phase in a fresh process\n"
    )
    print("\n".join(table(measure(args))))  # noqa: T201 - a benchmark prints its table
    print(f"\n{end_line(started)}")  # noqa: T201 - a benchmark prints its table
    return 0


if __name__ == "__main__":
    sys.exit(main())
