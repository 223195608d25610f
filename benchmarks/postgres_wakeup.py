"""How soon an idle worker starts a job enqueued on another connection, on PostgreSQL.

Run it with ``python -m benchmarks.postgres_wakeup`` against the server named by
``PATTERNS_PG_DSN`` (``scripts/pg-test-cluster.sh run -- python -m benchmarks.postgres_wakeup``
starts a throwaway one); ``--help`` for the knobs. It works in a schema of its own and
drops it at the end.

Each sample: the worker is idle (a random pause lets it settle in its wait: 20 to 50 ms,
or up to one poll interval more when it polls, so the enqueue lands at a random phase of
it), another ``PostgresStore`` (another connection, as another machine would have)
enqueues one job, and the latency runs from just before that ``enqueue`` call to the
first line of the handler. Three scenarios:

* ``NOTIFY -> wait_for_notify``: the raw wake-up, without a worker: how long the NOTIFY
  takes from the enqueuing connection to the listening one.
* ``worker, LISTEN/NOTIFY``: a ``Worker`` whose poll interval is long (5 s): the NOTIFY
  ends its idle wait, it claims, and a handler thread starts the job.
* ``worker, polling only``: the same worker on a store without ``subscribe``, polling
  every ``--poll-interval``: what the wake-up saves (about half the interval, on average).

The table gives p50, p90, p99 and the maximum, in milliseconds; the heading gives the
load average at the start, the last line the wall time and the load average at the end.
This is a measurement to read, not a test: nothing here asserts on a time.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from benchmarks._tables import end_line, load_average, pg_schema
from patterns.jobqueue.stores.postgres.store import PostgresStore
from patterns.jobqueue.stores.protocol import Store
from patterns.jobqueue.stores.records import JsonValue
from patterns.jobqueue.tasks import JobContext, TaskRegistry
from patterns.jobqueue.worker.worker import Worker

DSN_VARIABLE = "PATTERNS_PG_DSN"


class PollingOnly:
    """A ``Store`` whose ``subscribe`` never notifies: a worker on it can only poll.

    Everything else is the wrapped store's own method, so the wrapper keeps up with the
    ``Store`` protocol as it grows.
    """

    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    def subscribe(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Never call ``callback``; the unsubscribe does nothing."""
        return lambda: None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def settle(poll_interval: float) -> None:
    """Let the worker reach its idle wait; a random phase of its poll interval, if it polls."""
    spread = poll_interval if poll_interval < 1.0 else 0.03
    time.sleep(0.02 + random.uniform(0.0, spread))  # pacing the samples, not synchronising


def notify_only(dsn: str, schema: str, samples: int, poll_interval: float) -> list[float]:
    """Seconds from an enqueue on one connection to ``wait_for_notify`` returning on another."""
    listener = PostgresStore(dsn, schema=schema)
    producer = PostgresStore(dsn, schema=schema)
    try:
        listener.wait_for_notify(10.0)  # the first return: listening now
        latencies = []
        for _ in range(samples):
            settle(poll_interval)
            start = time.perf_counter()
            producer.enqueue("noop")
            if not listener.wait_for_notify(10.0):
                raise RuntimeError("no notification within 10 s")
            latencies.append(time.perf_counter() - start)
        return latencies
    finally:
        producer.close()
        listener.close()


def with_worker(
    wrap: Callable[[PostgresStore], Store],
) -> Callable[[str, str, int, float], list[float]]:
    """A scenario: a worker on ``wrap(store)``, jobs enqueued through another store."""

    def run(dsn: str, schema: str, samples: int, poll_interval: float) -> list[float]:
        started: list[float] = []
        ready = threading.Event()  # set by the handler, waited on by the producer loop
        tasks = TaskRegistry()

        @tasks.task
        def noop(payload: JsonValue, ctx: JobContext) -> None:
            started.append(time.perf_counter())
            ready.set()

        consumer = PostgresStore(dsn, schema=schema)
        producer = PostgresStore(dsn, schema=schema)
        worker = Worker(wrap(consumer), tasks, concurrency=1, poll_interval=poll_interval)
        latencies = []
        try:
            with worker:
                for _ in range(samples):
                    settle(poll_interval)
                    ready.clear()
                    start = time.perf_counter()
                    producer.enqueue("noop")
                    if not ready.wait(poll_interval + 10.0):
                        raise RuntimeError("the job did not start")
                    latencies.append(started[-1] - start)
        finally:
            producer.close()
            consumer.close()
        return latencies

    return run


SCENARIOS: dict[str, tuple[Callable[[str, str, int, float], list[float]], float]] = {
    # name: (scenario, the worker's poll interval; 0.0: --poll-interval)
    "NOTIFY -> wait_for_notify": (notify_only, 5.0),
    "worker, LISTEN/NOTIFY": (with_worker(lambda store: store), 5.0),
    "worker, polling only": (with_worker(lambda store: cast(Store, PollingOnly(store))), 0.0),
}


def server_version(dsn: str) -> str:
    """The server's version string, for the table's heading."""
    import psycopg  # noqa: PLC0415 - optional dependency, like the store's

    with psycopg.connect(dsn) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]).split()[0] if row else "?"


def percentile(values: list[float], fraction: float) -> float:
    """The value below which ``fraction`` of ``values`` fall (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def table(results: dict[str, tuple[float, list[float]]]) -> list[str]:
    """Format the results, one row per scenario, latencies in milliseconds."""
    head = ("scenario", "poll", "samples", "p50 ms", "p90 ms", "p99 ms", "max ms")
    rows = [head]
    for name, (poll, values) in results.items():
        rows.append(
            (
                name,
                "-" if name.startswith("NOTIFY") else f"{poll:g} s",
                str(len(values)),
                f"{statistics.median(values) * 1000:.1f}",
                f"{percentile(values, 0.90) * 1000:.1f}",
                f"{percentile(values, 0.99) * 1000:.1f}",
                f"{max(values) * 1000:.1f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return lines


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the scenarios and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--dsn", default=os.environ.get(DSN_VARIABLE), help=f"default: ${DSN_VARIABLE}"
    )
    parser.add_argument("--samples", type=int, default=200, help="samples per NOTIFY scenario")
    parser.add_argument("--poll-samples", type=int, default=40, help="samples when polling")
    parser.add_argument("--poll-interval", type=float, default=0.5, help="for polling only (s)")
    args = parser.parse_args(argv)
    if not args.dsn:
        parser.error(
            f"no server: set {DSN_VARIABLE} or pass --dsn, or run it under "
            "scripts/pg-test-cluster.sh run -- python -m benchmarks.postgres_wakeup"
        )
    logging.basicConfig(level=logging.ERROR)  # the store warns about nothing here
    started = time.monotonic()
    load = load_average()  # at the start; the heading is printed once the server is known
    results: dict[str, tuple[float, list[float]]] = {}
    with pg_schema(args.dsn) as schema:
        for name, (scenario, poll) in SCENARIOS.items():
            polling = name.endswith("polling only")
            interval = args.poll_interval if polling else poll
            samples = args.poll_samples if polling else args.samples
            results[name] = (interval, scenario(args.dsn, schema, samples, interval))
    out = [
        (
            f"Python {sys.version.split()[0]}, PostgreSQL {server_version(args.dsn)}: "
            f"enqueue on one connection -> handler start on another; load average {load}"
        ),
        *table(results),
        "",
        end_line(started),
    ]
    print("\n".join(out))  # noqa: T201 - the table is this program's output
    return 0


if __name__ == "__main__":
    sys.exit(main())
