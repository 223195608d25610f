"""What a cancellation checkpoint costs: ``CancelToken.check()`` next to a bare Event check.

Run it with ``python -m benchmarks.cancellation`` (``--help`` for the knobs). Each row times
``--calls`` calls of one checkpoint on a token that stays active (the case a running
loop pays for on every item), ``--runs`` times, the rows alternating so that drift in
the machine's speed hits them alike:

* ``Event.is_set()``: the floor, a bare `threading.Event` used as a stop flag.
* ``token.check()``: a token without a deadline.
* ``token.check(), with a deadline``: also reads `time.monotonic` on every call.
* ``token.cancelled``: the property, for loops that test instead of raising.

The table gives nanoseconds per call, loop overhead included: median, min and max over the
runs, and the ratio of the medians against ``Event.is_set()``. The cancellation page quotes
these figures. This is a measurement to read, not a test: nothing here asserts on a time.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import threading
import time
from collections.abc import Callable

from patterns.cancellation import CancelToken

Checkpoint = Callable[[], object]


def checkpoints() -> dict[str, Checkpoint]:
    """A fresh, active checkpoint per row (the deadline is far beyond any run)."""
    event = threading.Event()
    plain = CancelToken()
    timed = CancelToken(timeout=3600.0)
    return {
        "Event.is_set()": event.is_set,
        "token.check()": plain.check,
        "token.check(), with a deadline": timed.check,
        "token.cancelled": lambda: plain.cancelled,
    }


def per_call(checkpoint: Checkpoint, calls: int) -> float:
    """Nanoseconds per call of ``checkpoint``, over ``calls`` calls in a plain loop."""
    start = time.perf_counter()
    for _ in range(calls):
        checkpoint()
    return (time.perf_counter() - start) / calls * 1e9


def measure(runs: int, calls: int) -> dict[str, list[float]]:
    """Nanoseconds per call for each row, runs interleaved across rows."""
    rows = checkpoints()
    results: dict[str, list[float]] = {name: [] for name in rows}
    for run in range(runs):
        order = list(rows.items())
        if run % 2:
            order.reverse()
        for name, checkpoint in order:
            gc.collect()
            results[name].append(per_call(checkpoint, calls))
    return results


def table(results: dict[str, list[float]]) -> list[str]:
    """Format the results as a fixed-width table, one row per checkpoint."""
    head = ("checkpoint", "median ns", "min ns", "max ns", "ratio")
    baseline = statistics.median(results["Event.is_set()"])
    rows = [head]
    for name, values in results.items():
        median = statistics.median(values)
        rows.append(
            (
                name,
                f"{median:.0f}",
                f"{min(values):.0f}",
                f"{max(values):.0f}",
                f"{median / baseline:.2f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = []
    for row in rows:
        cells = [
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells))
    lines.insert(1, "  ".join("-" * width for width in widths))
    return lines


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=9, help="runs per checkpoint")
    parser.add_argument("--calls", type=int, default=1_000_000, help="calls per run")
    args = parser.parse_args(argv)
    results = measure(args.runs, args.calls)
    version = sys.version.split()[0]
    out = [f"Python {version}, {args.runs} runs of {args.calls} calls each", *table(results)]
    print("\n".join(out))  # noqa: T201 - the table is this program's output
    return 0


if __name__ == "__main__":
    sys.exit(main())
