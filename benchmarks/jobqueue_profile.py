"""Where one enqueue and one drained job spend their time, on SQLite at the defaults (8).

Run it with ``python -m benchmarks.jobqueue_profile`` (``--help`` for the knobs); it runs
at ``synchronous=NORMAL``, the store's default, or at ``FULL`` with ``--full``. Table 8:
the profiles of one enqueue and of one drained job, to read before and after any change
to the defaults. Every measurement uses a fresh file in a temporary
directory on local disk (``BENCH_TMPDIR`` if set; WAL mode, as the store opens it). A
measurement to read, not a test: nothing here asserts on a time.

1. One enqueue. ``--enqueue-jobs`` (2,000) calls of ``SQLiteStore.enqueue("noop", i)``,
   one per call, as table 2 of ``benchmarks.jobqueue_throughput`` makes them. Table 8a
   times the whole call and, separately and interleaved over ``--runs`` runs, its
   pieces, each as µs per call (the ratio column is the piece's share of the whole call):

   * the raw transaction: ``BEGIN IMMEDIATE``, the store's own ``INSERT_SQL`` with the
     parameters the store passes, ``COMMIT``, on a raw ``sqlite3`` connection (autocommit,
     the store's ``synchronous``) to a file the store created (same schema and indexes);
     then each of those three statements timed on its own (``perf_counter`` around each,
     so each carries about 0.1 µs of timer);
   * the checks: ``prepare_enqueue`` (``stores/checks.py``: the name, ``max_attempts``,
     the times, and ``encode_payload``), ``encode_payload`` alone, the ``json.dumps`` call
     it makes (with its keyword arguments), and ``json.dumps`` with none (for comparison:
     keyword arguments make ``json.dumps`` build a new encoder per call);
   * what is left: the whole call minus the raw transaction minus ``prepare_enqueue``,
     run by run: the store's Python around them (the argument dict, ``_write``, the
     busy retry, the lock, the clock, the debug log call).

   Then the same calls under ``cProfile`` (wall clock), on another fresh file: µs per call
   profiled, calls per enqueue (exact), and the top functions by cumulative and by own
   time, per enqueue. cProfile's hooks make every call dearer: the profiler's cost per
   call is estimated as (µs profiled - µs plain) / calls, and the last column of the
   function tables takes it off each call of the function (an estimate: part of a call's
   hook cost lands in its caller's own time).

2. One drained job. ``--jobs`` (5,000) no-op jobs, enqueued in one ``enqueue_many``, are
   drained by ``Worker(store, tasks, concurrency=4)`` at its defaults; a job counts once
   ``on_complete`` ran, after its outcome committed, and the drain is timed from
   ``start()`` to the last one (the stop is not timed). Table 8b, one row per drain:

   * ``--runs`` plain drains: wall µs per job; CPU µs per job (``getrusage`` of the
     process, user + system, every thread, over the same window); thread switches per job
     (``ru_nvcsw`` and ``ru_nivcsw`` of ``getrusage(RUSAGE_SELF)``, which, unlike
     ``/proc/self/status``, sums every thread of the process, exited ones included).
     The window also holds the store's watcher thread (a wake-up every 15 ms) and the
     heartbeat: a few switches per drain, not per job.
   * one drain with every SQLite statement counted: ``sqlite3.connect`` is wrapped while
     the store and the worker run, so that each connection they open gets a
     ``set_trace_callback`` (the store keeps its connection private); the counts are per
     job, by first keyword, for the store's connection and for the others (the watcher's).
     The callback costs a Python call per statement, so this row's times are a little
     higher.
   * one drain under ``cProfile``, every thread the worker starts profiled on its own:
     ``threading.setprofile`` installs a hook in each new thread whose first call makes
     a ``cProfile.Profile`` for that thread and enables it (on 3.11 a profiler is a
     per-thread ``sys.setprofile`` hook, so each thread's calls are timed by its own
     profiler, unmixed with the others'). The profilers time with ``time.thread_time_ns``,
     the thread's CPU clock, so a thread blocked on a lock or a queue is charged nothing
     while it waits: the tables are CPU spent, not wall time waited. The main thread,
     which only waits, is not profiled. The profiles are merged (``pstats.Stats.add``)
     after the worker stopped and its threads ended. Python 3.12 made cProfile one
     ``sys.monitoring`` tool for the whole interpreter, so on 3.12+ this drain is left
     out with a line saying so.

   Table 8c gives each thread's CPU µs per job (its profile's total) and function calls
   per job (exact); tables 8d and 8e the top functions of the merged profile by
   cumulative and by own CPU time, per job. Reading the thread CPU clock is a system call
   (about 0.25 µs, twice per call), so a profiled drain costs about three times the CPU
   of a plain one: as for the enqueue, the cost per call is estimated from the run
   itself, (process CPU profiled - median process CPU of the plain drains) / calls, and
   the "less profiler" columns take it off each call. The call counts and the ranking
   are what to trust; the plain drains' times are the times.

Knobs: ``--runs`` (``BENCH_RUNS``, 3), ``--enqueue-jobs`` (``BENCH_ENQUEUE_JOBS``, 2,000),
``--jobs`` (``BENCH_JOBS``, 5,000), ``--top`` (15 functions per table), ``--full``.
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import json
import os
import pstats
import re
import resource
import sqlite3
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._tables import (
    ROOT,
    Row,
    emit,
    end_line,
    env_int,
    fmt,
    machine_line,
    measure,
    render,
    runs_setting,
    scratch_dir,
    stats_table,
)
from benchmarks.jobqueue_throughput import Counter as Settled

DRAIN_TIMEOUT = 120.0  # seconds one drain may take before it is called failed
ENQUEUE = "SQLiteStore.enqueue, whole call"
RAW_TXN = "raw BEGIN IMMEDIATE + INSERT + COMMIT"
PREPARE = "prepare_enqueue (all the checks)"
REST = "rest: the store's Python around them"

_files = itertools.count(1)


def new_path(folder: Path) -> Path:
    """A file name not used before in ``folder``."""
    return folder / f"queue-{next(_files)}.db"


# --- 1. one enqueue -------------------------------------------------------------------------


def time_enqueue(folder: Path, sync: str, n: int) -> float:
    """µs per ``SQLiteStore.enqueue("noop", i)``, one per call, on a fresh file."""
    from patterns.jobqueue import SQLiteStore  # noqa: PLC0415

    store = SQLiteStore(new_path(folder), synchronous=sync)
    enqueue = store.enqueue
    start = time.perf_counter()
    for i in range(n):
        enqueue("noop", i)
    seconds = time.perf_counter() - start
    store.close()
    return seconds / n * 1e6


def raw_connection(folder: Path, sync: str) -> sqlite3.Connection:
    """An autocommit connection at ``sync`` to a fresh file that the store created."""
    from patterns.jobqueue import SQLiteStore  # noqa: PLC0415

    path = new_path(folder)
    SQLiteStore(path, synchronous=sync).close()  # the schema, its indexes, WAL mode
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA synchronous = {sync}")
    return conn


def insert_params(i: int) -> tuple[Any, ...]:
    """What ``SQLiteStore._insert`` passes to ``INSERT_SQL`` for ``enqueue("noop", i)``."""
    now = time.time()
    return ("noop", str(i), now, 3, now, now, None)


def time_raw(folder: Path, sync: str, n: int) -> float:
    """µs per raw ``BEGIN IMMEDIATE``, store ``INSERT_SQL``, ``COMMIT``, on a fresh file."""
    from patterns.jobqueue.stores.sqlite.schema import INSERT_SQL  # noqa: PLC0415

    conn = raw_connection(folder, sync)
    execute = conn.execute
    start = time.perf_counter()
    for i in range(n):
        execute("BEGIN IMMEDIATE")
        execute(INSERT_SQL, insert_params(i))
        execute("COMMIT")
    seconds = time.perf_counter() - start
    conn.close()
    return seconds / n * 1e6


def time_raw_piece(folder: Path, sync: str, n: int, piece: int) -> float:
    """µs per call of one statement (0 BEGIN, 1 INSERT, 2 COMMIT) of the raw transaction."""
    from patterns.jobqueue.stores.sqlite.schema import INSERT_SQL  # noqa: PLC0415

    conn = raw_connection(folder, sync)
    execute, clock = conn.execute, time.perf_counter
    spent = [0.0, 0.0, 0.0]
    for i in range(n):
        params = insert_params(i)
        t0 = clock()
        execute("BEGIN IMMEDIATE")
        t1 = clock()
        execute(INSERT_SQL, params)
        t2 = clock()
        execute("COMMIT")
        t3 = clock()
        spent[0] += t1 - t0
        spent[1] += t2 - t1
        spent[2] += t3 - t2
    conn.close()
    return spent[piece] / n * 1e6


def per_call(fn: Callable[[int], object], n: int) -> float:
    """µs per ``fn(i)`` over ``n`` calls."""
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - start) / n * 1e6


def enqueue_rows(folder: Path, sync: str, n: int) -> dict[str, Callable[[], float]]:
    """Table 8a's measured rows (the rest is derived from three of them afterwards)."""
    from patterns.jobqueue.stores.checks import encode_payload, prepare_enqueue  # noqa: PLC0415

    def prepare(i: int) -> object:
        return prepare_enqueue(
            time.time(), "noop", i, run_at=None, delay=None, max_attempts=3, timeout=None
        )

    def dumps(i: int) -> str:
        return json.dumps(i, allow_nan=False, ensure_ascii=False, separators=(",", ":"))

    return {
        ENQUEUE: lambda: time_enqueue(folder, sync, n),
        RAW_TXN: lambda: time_raw(folder, sync, n),
        "  of which BEGIN IMMEDIATE": lambda: time_raw_piece(folder, sync, n, 0),
        "  of which INSERT": lambda: time_raw_piece(folder, sync, n, 1),
        "  of which COMMIT": lambda: time_raw_piece(folder, sync, n, 2),
        PREPARE: lambda: per_call(prepare, n),
        "  of which encode_payload": lambda: per_call(encode_payload, n),
        "    of which json.dumps(payload, its keywords)": lambda: per_call(dumps, n),
        "json.dumps(payload), no keywords (comparison)": lambda: per_call(json.dumps, n),
    }


def profile_enqueue(folder: Path, sync: str, n: int) -> tuple[float, pstats.Stats]:
    """µs per enqueue under ``cProfile`` (wall clock), and the profile."""
    from patterns.jobqueue import SQLiteStore  # noqa: PLC0415

    store = SQLiteStore(new_path(folder), synchronous=sync)
    enqueue = store.enqueue
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    for i in range(n):
        enqueue("noop", i)
    profiler.disable()
    seconds = time.perf_counter() - start
    store.close()
    return seconds / n * 1e6, pstats.Stats(profiler)


def enqueue_part(folder: Path, sync: str, n: int, runs: int, top: int) -> list[str]:
    """Table 8a and the enqueue profile, as lines."""
    rows = measure(enqueue_rows(folder, sync, n), runs)
    by_label = {row.label: row for row in rows}
    rest = Row(REST)
    rest.values = [
        whole - raw - checks
        for whole, raw, checks in zip(
            by_label[ENQUEUE].values,
            by_label[RAW_TXN].values,
            by_label[PREPARE].values,
            strict=True,
        )
    ]
    shown = [*rows[:-1], rest, rows[-1]]  # the rest under the pieces it is left from
    profiled, stats = profile_enqueue(folder, sync, n)
    calls = stats.total_calls / n  # type: ignore[attr-defined]
    plain = by_label[ENQUEUE].median
    bias = max(0.0, (profiled - plain) / calls)
    return [
        "",
        (
            f"8a. One enqueue at synchronous={sync}: {n:,} calls one per call, each piece "
            f"timed on its own, µs per call; ratio = share of the whole call"
        ),
        *stats_table(shown, "µs", reference=ENQUEUE, digits=1),
        "",
        (
            f"Under cProfile (wall clock): {profiled:.1f} µs per enqueue profiled, "
            f"{plain:.1f} µs without (median); {calls:.1f} function calls per enqueue "
            "(C functions included), "
            + (
                f"so the profiler costs about {bias:.2f} µs per call"
                if bias > 0
                else "the profiler's cost lost in the noise of the commits (no correction)"
            )
        ),
        *function_table(
            stats, n, sort="cumulative", top=top, unit="enqueue", what="cumulative time", bias=bias
        ),
        *function_table(
            stats, n, sort="tottime", top=top, unit="enqueue", what="own time", bias=bias
        ),
    ]


# --- 2. one drained job ---------------------------------------------------------------------


@dataclass
class Drain:
    """What one drain measured."""

    label: str
    jobs: int
    seconds: float
    cpu: float  # seconds of user + system time, every thread
    voluntary: int  # thread switches in the window, every thread
    involuntary: int
    statements: dict[tuple[str, str], int] = field(default_factory=dict)  # (conn, kind) -> n
    profiles: list[tuple[str, cProfile.Profile]] = field(default_factory=list)

    def cells(self) -> list[str]:
        """Table 8b's row."""
        per = 1e6 / self.jobs
        counted = sum(self.statements.values())
        return [
            self.label,
            fmt(self.seconds * per, 1),
            fmt(self.cpu * per, 1),
            fmt(self.voluntary / self.jobs, 2),
            fmt(self.involuntary / self.jobs, 2),
            fmt(counted / self.jobs, 2) if self.statements else "-",
        ]


@contextmanager
def traced_connections(counts: dict[tuple[str, str], int]) -> Iterator[None]:
    """Count every statement of every connection ``sqlite3.connect`` opens meanwhile.

    The first connection opened is the store's; later ones (the watcher's) are "other".
    Counted by the statement's first word (BEGIN, COMMIT, UPDATE ...).
    """
    real = sqlite3.connect
    opened = itertools.count()
    lock = threading.Lock()  # the watcher's statements and the store's may come at once

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn: sqlite3.Connection = real(*args, **kwargs)
        who = "store" if next(opened) == 0 else "other"

        def trace(sql: str) -> None:
            key = (who, sql.lstrip().split(None, 1)[0].upper() if sql.strip() else "?")
            with lock:
                counts[key] = counts.get(key, 0) + 1

        conn.set_trace_callback(trace)
        return conn

    sqlite3.connect = connect  # type: ignore[assignment]
    try:
        yield
    finally:
        sqlite3.connect = real


@contextmanager
def thread_profiles(found: list[tuple[str, cProfile.Profile]]) -> Iterator[None]:
    """Give each thread started meanwhile a ``cProfile.Profile`` of its own (thread CPU clock)."""

    def first_call(*_: object) -> None:
        profiler = cProfile.Profile(time.thread_time_ns, 1e-9)
        found.append((threading.current_thread().name, profiler))
        profiler.enable()  # replaces this hook, in this thread only

    threading.setprofile(first_call)
    try:
        yield
    finally:
        threading.setprofile(None)


def drain(folder: Path, sync: str, n: int, label: str, *, trace: bool, profile: bool) -> Drain:
    """Drain ``n`` no-op jobs with ``Worker(store, tasks, concurrency=4)`` at its defaults."""
    from patterns.jobqueue import SQLiteStore, TaskRegistry, Worker  # noqa: PLC0415

    path = new_path(folder)
    filler = SQLiteStore(path)
    filler.enqueue_many([{"task": "noop"}] * n)
    filler.close()
    counts: dict[tuple[str, str], int] = {}
    profiles: list[tuple[str, cProfile.Profile]] = []
    with (
        traced_connections(counts) if trace else _nothing(),
        thread_profiles(profiles) if profile else _nothing(),
    ):
        store = SQLiteStore(path, synchronous=sync)
        settled = Settled(n)
        tasks = TaskRegistry(on_complete=settled.add)
        tasks.task(name="noop")(lambda payload, ctx: None)
        worker = Worker(store, tasks, concurrency=4)
        before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        worker.start()
        finished = settled.done.wait(DRAIN_TIMEOUT)
        seconds = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
        report = worker.stop(10.0)
        done = store.counts()["done"]
        store.close()
    if not finished or not report.terminated or done != n:
        raise RuntimeError(f"{label}: {settled.count} counted, {done} done of {n}")
    return Drain(
        label,
        n,
        seconds,
        (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        after.ru_nvcsw - before.ru_nvcsw,
        after.ru_nivcsw - before.ru_nivcsw,
        counts,
        profiles,
    )


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def thread_role(name: str) -> str:
    """A thread's name without the numbers that differ between runs (pid, counters)."""
    return re.sub(r"\d+", "N", name)


def drain_part(folder: Path, sync: str, n: int, runs: int, top: int) -> list[str]:
    """Tables 8b to 8e, as lines."""
    drains = [
        drain(folder, sync, n, f"plain, run {run + 1}", trace=False, profile=False)
        for run in range(runs)
    ]
    traced = drain(folder, sync, n, "statements counted", trace=True, profile=False)
    drains.append(traced)
    can_profile = sys.version_info < (3, 12)
    if can_profile:
        drains.append(drain(folder, sync, n, "under cProfile", trace=False, profile=True))
    lines = [
        "",
        (
            f"8b. One drained job at synchronous={sync}: Worker(store, tasks, concurrency=4) "
            f"at its defaults draining {n:,} no-op jobs, per job"
        ),
        *render(
            ["drain", "wall µs", "CPU µs", "vol. switches", "invol. switches", "statements"],
            [d.cells() for d in drains],
        ),
        "",
        f"Statements per job by first word (the drain with statements counted, {n:,} jobs)",
        *render(
            ["connection", "statement", "per job", "in all"],
            [
                [who, kind, fmt(count / n, 3), fmt(count)]
                for (who, kind), count in sorted(
                    traced.statements.items(), key=lambda item: (item[0][0] != "store", -item[1])
                )
            ],
        ),
    ]
    if not can_profile:
        return [
            *lines,
            "",
            (
                "The drain under cProfile needs Python 3.11: from 3.12 cProfile is one "
                "sys.monitoring tool for every thread at once, so per-thread profiles are "
                "left out."
            ),
        ]
    profiled = drains[-1]
    cpu: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    merged: pstats.Stats | None = None
    for name, profiler in profiled.profiles:
        stats = pstats.Stats(profiler)
        cpu[thread_role(name)] += stats.total_tt  # type: ignore[attr-defined]
        calls[thread_role(name)] += stats.total_calls  # type: ignore[attr-defined]
        if merged is None:
            merged = stats
        else:
            merged.add(stats)
    alive = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    total = sum(cpu.values()) / n * 1e6
    all_calls = sum(calls.values()) / n
    plain = sorted(d.cpu for d in drains[:runs])[(runs - 1) // 2] / n * 1e6
    bias = max(0.0, (profiled.cpu / n * 1e6 - plain) / all_calls)
    lines += [
        "",
        (
            f"8c. CPU per job by thread, under cProfile (each thread's CPU clock): "
            f"{total:.1f} µs per job in all ({profiled.cpu / n * 1e6:.1f} µs of process CPU) "
            f"against {plain:.1f} µs of process CPU in the plain drains (median): "
            f"{all_calls:.1f} calls per job, so the profiler costs about {bias:.2f} µs per "
            "call; 'less profiler' takes that off each call"
        ),
        *render(
            ["thread (numbers as N)", "CPU µs per job", "less profiler", "calls per job"],
            [
                [
                    role,
                    fmt(seconds / n * 1e6, 1),
                    fmt(seconds / n * 1e6 - calls[role] / n * bias, 1),
                    fmt(calls[role] / n, 1),
                ]
                for role, seconds in cpu.most_common()
            ],
        ),
    ]
    if alive:
        lines.append(f"(threads still alive when the profiles were read: {alive})")
    if merged is not None:
        for sort, what, prefix in (
            ("cumulative", "cumulative CPU time", "8d. "),
            ("tottime", "own CPU time", "8e. "),
        ):
            lines += function_table(
                merged, n, sort=sort, top=top, unit="job", what=what, bias=bias, prefix=prefix
            )
    return lines


# --- the function tables ----------------------------------------------------------------------


def function_name(key: tuple[str, int, str]) -> str:
    """``path:line(function)``, the path relative to the repository or to its package dir."""
    filename, line, function = key
    if filename == "~":  # a C function
        return function
    path = Path(filename)
    try:
        shown = path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        parts = path.parts
        site = next((i for i, p in enumerate(parts) if p in ("site-packages", "lib")), None)
        shown = "/".join(parts[-2:]) if site is None else "/".join(parts[site + 1 :])
        shown = re.sub(r"^python3\.\d+/", "", shown)
    return f"{shown}:{line}({function})"


def function_table(
    stats: pstats.Stats,
    n: int,
    *,
    sort: str,
    top: int,
    unit: str,
    what: str,
    bias: float,
    prefix: str = "",
) -> list[str]:
    """The ``top`` functions by ``sort`` ("cumulative" or "tottime"), per ``unit``.

    The last column is the own time less ``bias`` µs per call (at least 0): an estimate,
    since part of a call's profiler cost lands in its caller's own time instead.
    """
    entries = stats.stats.items()  # type: ignore[attr-defined]
    column = 3 if sort == "cumulative" else 2
    ranked = sorted(entries, key=lambda item: item[1][column], reverse=True)[:top]
    per = 1e6 / n
    return [
        "",
        f"{prefix}Top {top} functions by {what}, per {unit} (µs; calls per {unit})",
        *render(
            ["function", "calls", "own µs", "cum. µs", "own less profiler"],
            [
                [
                    function_name(key)[:100],
                    fmt(nc / n, 2),
                    fmt(tt * per, 2),
                    fmt(ct * per, 2),
                    fmt(max(0.0, tt * per - nc / n * bias), 2),
                ]
                for key, (_cc, nc, tt, ct, _callers) in ranked
            ],
        ),
    ]


# --- main ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run both profiles and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=runs_setting(3), help="(BENCH_RUNS, 3)")
    parser.add_argument(
        "--enqueue-jobs",
        type=int,
        default=env_int("BENCH_ENQUEUE_JOBS", 2_000),
        help="enqueue calls per measurement (BENCH_ENQUEUE_JOBS, 2000)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=env_int("BENCH_JOBS", 5_000),
        help="jobs per drain (BENCH_JOBS, 5000)",
    )
    parser.add_argument("--top", type=int, default=15, help="functions per table (15)")
    parser.add_argument("--full", action="store_true", help="synchronous=FULL, not NORMAL")
    args = parser.parse_args(argv)
    sync = "FULL" if args.full else "NORMAL"
    started = time.monotonic()
    emit(
        [
            machine_line(),
            (
                f"synchronous={sync}; {args.runs} runs per timed row, interleaved; files in "
                f"{os.environ.get('BENCH_TMPDIR') or 'the system temporary directory'}"
            ),
        ]
    )
    with scratch_dir("jobqueue-profile-") as folder:
        emit(enqueue_part(folder, sync, args.enqueue_jobs, args.runs, args.top))
        emit(drain_part(folder, sync, args.jobs, args.runs, args.top))
    emit(["", end_line(started)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
