"""What the back-ported ``ClosableQueue`` costs next to a plain ``queue.Queue``.

Run it with ``python -m benchmarks.closable_queue`` (``--help`` for the knobs). Two
scenarios, each timed ``--runs`` times per queue class, the classes alternating so that
drift in the machine's speed hits both alike:

* ``1 thread``: one thread puts ``--items`` items on an unbounded queue, then gets them.
* ``1 producer + 1 consumer``: a producer thread puts ``--items`` items on a bounded queue
  (``maxsize=100``) while a consumer thread gets them; timed until both have ended.

The table gives throughput in thousands of items per second (one item = one put plus one
get): median, min and max over the runs, and the ratio of the medians against
``queue.Queue`` (1.00 = the same; below 1 = slower). On Python 3.13 ``ClosableQueue`` runs
the standard library's own methods, so the ratio there is noise. This is a measurement to
read, not a test: nothing here asserts on a time.
"""

from __future__ import annotations

import argparse
import gc
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable

from patterns.closable_queue import ClosableQueue

QueueFactory = Callable[[int], "queue.Queue[int]"]

CLASSES: dict[str, QueueFactory] = {
    "queue.Queue": queue.Queue,
    "ClosableQueue": ClosableQueue,
}


def one_thread(make: QueueFactory, items: int) -> float:
    """Seconds for one thread to put ``items`` items on an unbounded queue and get them back."""
    q = make(0)
    put, get = q.put, q.get
    start = time.perf_counter()
    for i in range(items):
        put(i)
    for _ in range(items):
        get()
    return time.perf_counter() - start


def producer_consumer(make: QueueFactory, items: int) -> float:
    """Seconds for ``items`` items to pass from a producer thread to a consumer thread."""
    q = make(100)

    def produce() -> None:
        for i in range(items):
            q.put(i)

    def consume() -> None:
        for _ in range(items):
            q.get()

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start


SCENARIOS: dict[str, Callable[[QueueFactory, int], float]] = {
    "1 thread": one_thread,
    "1 producer + 1 consumer": producer_consumer,
}


def measure(runs: int, items: int) -> dict[tuple[str, str], list[float]]:
    """Throughputs (items per second) per (scenario, class), runs interleaved across classes."""
    results: dict[tuple[str, str], list[float]] = {}
    for scenario, bench in SCENARIOS.items():
        for run in range(runs):
            order = list(CLASSES.items())
            if run % 2:
                order.reverse()
            for name, make in order:
                gc.collect()
                seconds = bench(make, items)
                results.setdefault((scenario, name), []).append(items / seconds)
    return results


def table(results: dict[tuple[str, str], list[float]]) -> list[str]:
    """Format the results as a fixed-width table, one row per (scenario, class)."""
    head = ("scenario", "queue", "median k/s", "min k/s", "max k/s", "ratio")
    rows = [head]
    for (scenario, name), values in results.items():
        baseline = statistics.median(results[(scenario, "queue.Queue")])
        median = statistics.median(values)
        rows.append(
            (
                scenario,
                name,
                f"{median / 1000:.0f}",
                f"{min(values) / 1000:.0f}",
                f"{max(values) / 1000:.0f}",
                f"{median / baseline:.2f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = []
    for row in rows:
        cells = [
            cell.ljust(width) if i < 2 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells))
    lines.insert(1, "  ".join("-" * width for width in widths))
    return lines


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=9, help="runs per scenario and class")
    parser.add_argument("--items", type=int, default=200_000, help="items per run")
    args = parser.parse_args(argv)
    results = measure(args.runs, args.items)
    version = sys.version.split()[0]
    out = [f"Python {version}, {args.runs} runs of {args.items} items each", *table(results)]
    print("\n".join(out))  # noqa: T201 - the table is this program's output
    return 0


if __name__ == "__main__":
    sys.exit(main())
