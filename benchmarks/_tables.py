"""Helpers the job queue benchmarks share: settings from the environment, stats, tables, children.

Not a benchmark itself (``make bench`` runs only ``benchmarks/[a-z]*.py``). Every table
row is a list of per-run values summarised as median [min-max]; the ratio column compares
medians with one reference row of the same table, named in the table's heading.
"""

from __future__ import annotations

import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository: children run from here
CHILD_TIMEOUT = 300.0  # seconds any one child process may run before it is killed


def env_int(name: str, default: int) -> int:
    """An integer setting from the environment variable ``name``, or ``default``."""
    text = os.environ.get(name, "").strip()
    return int(text) if text else default


def env_float(name: str, default: float) -> float:
    """A float setting from the environment variable ``name``, or ``default``."""
    text = os.environ.get(name, "").strip()
    return float(text) if text else default


def runs_setting(default: int) -> int:
    """How many runs each row gets: ``BENCH_RUNS`` if set (at least 1), else ``default``."""
    return max(1, env_int("BENCH_RUNS", default))


def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile of ``values`` (p in 0..100)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


@dataclass
class Row:
    """One table row: a label and the per-run values of one measure."""

    label: str
    values: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def median(self) -> float:
        """The median over the runs (NaN when there are none)."""
        return statistics.median(self.values) if self.values else math.nan


def fmt(value: float, digits: int = 0) -> str:
    """A number with thousands separators and ``digits`` decimals; "-" for NaN."""
    if math.isnan(value):
        return "-"
    return f"{value:,.{digits}f}"


def render(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A fixed-width table: first column left-aligned, the others right-aligned."""
    table = [tuple(head), *(tuple(row) for row in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = [
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in table
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return lines


def stats_table(
    rows: Sequence[Row],
    unit: str,
    *,
    reference: str | None,
    digits: int = 0,
    label: str = "",
) -> list[str]:
    """Rows as median, min, max and ``median / reference median``; notes in a last column."""
    ref = next((row for row in rows if row.label == reference), None)
    head = [label, f"median {unit}", "min", "max", "ratio"]
    has_notes = any(row.note for row in rows)
    if has_notes:
        head.append("")
    cells = []
    for row in rows:
        if row.values:
            low, high = min(row.values), max(row.values)
        else:
            low = high = math.nan
        if ref is None or not ref.values or not row.values or ref.median == 0:
            ratio = "-"
        else:
            ratio = f"{row.median / ref.median:.2f}"
        line = [row.label, fmt(row.median, digits), fmt(low, digits), fmt(high, digits), ratio]
        if has_notes:
            line.append(row.note)
        cells.append(line)
    return render(head, cells)


def verdict(met: bool | None) -> str:
    """The word printed next to a target."""
    if met is None:
        return "not measured"
    return "met" if met else "NOT met"


def target(text: str, met: bool | None, measured: str) -> str:
    """One target line: what the issue asks, what was measured, met or not."""
    return f"  target: {text}: measured {measured}: {verdict(met)}"


def emit(lines: Sequence[str]) -> None:
    """Print lines at once (the tables are these programs' output)."""
    print("\n".join(lines), flush=True)  # noqa: T201 - the tables are the output


def load_average() -> str:
    """The machine's 1, 5 and 15 minute load averages, or "n/a" where there are none."""
    if not hasattr(os, "getloadavg"):
        return "n/a"
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def machine_line() -> str:
    """Python, SQLite, CPU count and load: what a reader needs to compare two runs."""
    import sqlite3  # noqa: PLC0415 - only for its version

    return (
        f"Python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}, "
        f"{os.cpu_count()} CPUs, load average {load_average()}"
    )


def end_line(started: float) -> str:
    """A module's last line: its wall time since ``started`` (monotonic) and the load now.

    Printed at the end of a run next to the load printed at its start, so that a reader
    sees whether something else ran meanwhile (on a quiet machine the 1-minute figure
    stays near the number of threads the benchmark itself keeps busy).
    """
    return f"({time.monotonic() - started:.0f} s; load average at the end {load_average()})"


@contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A temporary directory on local disk (not tmpfs: fsync must cost what it costs)."""
    base = os.environ.get("BENCH_TMPDIR") or None
    with tempfile.TemporaryDirectory(prefix=prefix, dir=base) as tmp:
        yield Path(tmp)


def child_env() -> dict[str, str]:
    """The environment for a child: the repository importable, unbuffered output."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_child(module: str, args: Sequence[str], timeout: float = CHILD_TIMEOUT) -> dict[str, float]:
    """Run ``python -m benchmarks.<module> --child ARGS``; return the JSON on its last line.

    A fresh interpreter per measurement, so one system's threads, caches and connections
    never share a process with another's. Killed after ``timeout`` seconds.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", f"benchmarks.{module}", "--child", *args],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    lines = out.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"child {module} {' '.join(args)} failed with status {proc.returncode}:\n{err[-3000:]}"
        )
    result: dict[str, float] = json.loads(lines[-1])
    return result


def child_result(result: dict[str, float]) -> None:
    """Print a child's result as the JSON line `run_child` reads."""
    print(json.dumps(result), flush=True)  # noqa: T201 - the parent reads it


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` every millisecond until true; `TimeoutError` naming ``what``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(0.001)


def join_threads(threads: Sequence[threading.Thread], timeout: float) -> None:
    """Join every thread within ``timeout`` in all; `RuntimeError` naming any still alive."""
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    alive = [t.name for t in threads if t.is_alive()]
    if alive:
        raise RuntimeError(f"threads still running after {timeout} s: {alive}")


@contextmanager
def pg_schema(dsn: str) -> Iterator[str]:
    """A fresh schema name, and the schema dropped (whatever happened) at the end."""
    import psycopg  # noqa: PLC0415 - optional, as in the store

    name = f"bench_{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')  # a generated name


def measure(rows: Mapping[str, Callable[[], float]], runs: int) -> list[Row]:
    """Run every row ``runs`` times, interleaved, the order reversed on odd runs."""
    results = {label: Row(label) for label in rows}
    for run in range(runs):
        order = list(rows.items())
        if run % 2:
            order.reverse()
        for label, fn in order:
            gc.collect()
            results[label].values.append(fn())
    return list(results.values())
