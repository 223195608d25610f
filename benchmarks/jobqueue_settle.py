"""What a batch saves: outcomes through ``settle_many`` and claims through ``claim(limit=n)``.

Run it with ``python -m benchmarks.jobqueue_settle`` (``--help`` for the knobs); the
PostgreSQL tables need ``PATTERNS_PG_DSN`` (``make bench`` runs it inside the throwaway
cluster, whose ``fsync`` is off: its figures are round trips and server work, not disk
flushes), and are left out without it.

For each store (SQLite ``synchronous=NORMAL`` and ``FULL`` on a local disk, PostgreSQL),
``--jobs`` (320) jobs are enqueued and claimed, then their outcomes recorded:

* one ``complete()`` per job, one transaction each (the reference row);
* ``settle_many`` with n = 1, 4 and 16 items per call, one transaction per call.

and, the same way, claims: ``claim(limit=1)`` once per job (the reference) against
``claim(limit=n)`` taking n jobs per transaction. Microseconds per job (wall time / jobs),
each row's median, min and max over ``--runs`` runs, rows interleaved; ratio = the row's
median over the reference row's: below 1 is faster. A measurement to read, not a test.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks._tables import (
    emit,
    env_int,
    machine_line,
    measure,
    runs_setting,
    scratch_dir,
    stats_table,
)
from patterns.jobqueue.stores.protocol import Store
from patterns.jobqueue.stores.records import Claim, Settle, Settlement

DSN_VARIABLE = "PATTERNS_PG_DSN"
SIZES = (1, 4, 16)
LEASE = 600.0

Opener = Callable[[], Store]


@contextmanager
def fresh(open_store: Opener, jobs: int) -> Iterator[Store]:
    """A store holding ``jobs`` queued jobs, closed afterwards."""
    store = open_store()
    try:
        store.enqueue_many([{"task": "bench", "payload": n} for n in range(jobs)])
        yield store
    finally:
        store.close()


def claimed(store: Store, jobs: int) -> list[Claim]:
    """Every job, claimed in batches of 64 (not timed)."""
    claims: list[Claim] = []
    while len(claims) < jobs:
        claims += store.claim("bench", lease=LEASE, limit=64)
    return claims


def settle_singly(open_store: Opener, jobs: int) -> float:
    """µs per job: one complete() per job."""
    with fresh(open_store, jobs) as store:
        claims = claimed(store, jobs)
        start = time.perf_counter()
        for claim in claims:
            store.complete(claim, None)
        return (time.perf_counter() - start) / jobs * 1e6


def settle_batched(open_store: Opener, jobs: int, size: int) -> float:
    """µs per job: settle_many with ``size`` items per call."""
    with fresh(open_store, jobs) as store:
        claims = claimed(store, jobs)
        batches = [
            [Settlement(Settle.COMPLETE, claim) for claim in claims[i : i + size]]
            for i in range(0, jobs, size)
        ]
        start = time.perf_counter()
        for batch in batches:
            store.settle_many(batch)
        return (time.perf_counter() - start) / jobs * 1e6


def claim_in(open_store: Opener, jobs: int, size: int) -> float:
    """µs per job: claim(limit=size) until every job is taken."""
    with fresh(open_store, jobs) as store:
        taken = 0
        start = time.perf_counter()
        while taken < jobs:
            taken += len(store.claim("bench", lease=LEASE, limit=size))
        return (time.perf_counter() - start) / jobs * 1e6


SINGLE = "complete(), one per job"
ONE_CLAIM = "claim(limit=1), one per job"


def tables(name: str, open_store: Opener, jobs: int, runs: int, number: str) -> list[str]:
    """The settle table and the claim table of one store."""
    settle: dict[str, Callable[[], float]] = {SINGLE: lambda: settle_singly(open_store, jobs)}
    for size in SIZES:
        settle[f"settle_many, {size} per call"] = (
            lambda size=size: settle_batched(open_store, jobs, size)  # type: ignore[misc]
        )
    claim: dict[str, Callable[[], float]] = {ONE_CLAIM: lambda: claim_in(open_store, jobs, 1)}
    for size in SIZES[1:]:
        claim[f"claim(limit={size})"] = lambda size=size: claim_in(open_store, jobs, size)  # type: ignore[misc]
    return [
        "",
        f"{number}a. {name}: recording {jobs:,} outcomes (complete), µs per job",
        *stats_table(measure(settle, runs), "µs", reference=SINGLE, digits=1),
        "",
        f"{number}b. {name}: claiming {jobs:,} jobs, µs per job",
        *stats_table(measure(claim, runs), "µs", reference=ONE_CLAIM, digits=1),
    ]


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the measurements and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=runs_setting(3), help="(BENCH_RUNS, 3)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=env_int("BENCH_SETTLE_JOBS", 320),
        help="jobs per run, a multiple of 16 (BENCH_SETTLE_JOBS, 320)",
    )
    parser.add_argument("--dsn", default=os.environ.get(DSN_VARIABLE), help=f"(${DSN_VARIABLE})")
    args = parser.parse_args(argv)
    if args.jobs < 16 or args.jobs % 16:
        parser.error(f"--jobs must be a positive multiple of 16, got {args.jobs}")
    started = time.monotonic()
    emit(
        [
            machine_line(),
            f"{args.runs} runs per row; median, min, max; ratio = row / the one-per-job row",
        ]
    )
    from patterns.jobqueue.stores.sqlite.store import SQLiteStore  # noqa: PLC0415

    with scratch_dir("bench-settle-") as tmp:
        for number, level in ((1, "NORMAL"), (2, "FULL")):

            def open_sqlite(level: str = level, tmp: Path = tmp) -> Store:
                return SQLiteStore(tmp / f"{uuid.uuid4().hex}.db", synchronous=level)

            emit(
                tables(
                    f"SQLite, synchronous={level}", open_sqlite, args.jobs, args.runs, f"S{number}"
                )
            )
    if args.dsn:
        from patterns.jobqueue.stores.postgres.store import PostgresStore  # noqa: PLC0415

        schemas: list[str] = []

        def open_pg() -> Store:
            schemas.append(f"bench_{uuid.uuid4().hex[:12]}")
            return PostgresStore(args.dsn, schema=schemas[-1])

        try:
            emit(tables("PostgreSQL", open_pg, args.jobs, args.runs, "S3"))
        finally:
            drop_schemas(args.dsn, schemas)
    else:
        emit(["", f"S3. PostgreSQL: not measured (no server: set {DSN_VARIABLE} or pass --dsn)"])
    emit(["", f"({time.monotonic() - started:.0f} s)"])
    return 0


def drop_schemas(dsn: str, schemas: list[str]) -> None:
    """Drop the benchmark's schemas (generated names)."""
    import psycopg  # noqa: PLC0415 - the postgres extra

    with psycopg.connect(dsn, autocommit=True) as conn:
        for schema in schemas:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')  # type: ignore[arg-type]


if __name__ == "__main__":
    sys.exit(main())
