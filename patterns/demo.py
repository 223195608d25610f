"""``make demo``: a terminal walkthrough of the executor-shutdown pitfall and its fix.

Not a pattern module: it prints for a person watching, and it imports a pattern. The job
queue demo replaces it once the job queue exists.
"""

from __future__ import annotations

import io
import logging
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from patterns.executor_shutdown import (
    TrackingExecutor,
    naive_stop_then_close,
    shutdown_and_await,
    stop_then_close,
)


def say(text: str = "") -> None:
    """Print one line of the walkthrough."""
    print(text, flush=True)  # noqa: T201 - this module is a terminal walkthrough


def naive_race() -> None:
    """Shut down without waiting, close the buffer, and watch the task fail."""
    say("1. The race: shutdown(wait=False), then close a buffer the task still writes to.")
    about_to_write, go = threading.Event(), threading.Event()
    out = io.StringIO()

    def write_result() -> None:
        about_to_write.set()
        go.wait(10)
        out.write("the result")

    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(write_result)
    about_to_write.wait(10)  # the task is parked just before its write
    naive_stop_then_close(pool, out)
    go.set()
    say(f"   the task failed with {future.exception(10)!r}")
    say("   and nothing reported it: the exception sat in a future nobody read.")
    pool.shutdown(wait=True)


def fixed() -> None:
    """Await termination first, then close."""
    say("2. The fix: await termination (with a budget), then close.")
    out = io.StringIO()
    pool = TrackingExecutor(max_workers=1)

    def slow_write() -> None:
        time.sleep(0.2)  # a task that takes a moment to produce its result
        out.write("the result")

    pool.submit(slow_write)
    report = stop_then_close(pool, out, 5.0, force_timeout=1.0)
    say(f"   terminated={report.terminated}, buffer closed={out.closed}, in {report.elapsed:.2f}s")


def stuck() -> None:
    """A stuck task cannot hold the shutdown past its budget."""
    say("3. A stuck task: shutdown(wait=True) would wait forever; the idiom returns on time.")
    release = threading.Event()
    pool = TrackingExecutor(max_workers=1)
    pool.submit(release.wait)
    pool.submit(say, "   (never printed: this task never started)")
    report = shutdown_and_await(pool, 0.5, force_timeout=0.5)
    say(
        f"   returned after {report.elapsed:.2f}s (budget 1.0s): terminated={report.terminated}, "
        f"never started={len(report.never_started)}, still running={len(report.still_running)}"
    )
    release.set()  # a real program would log the report and, if it must exit, call os._exit


def main() -> int:
    """Run the walkthrough."""
    logging.basicConfig(
        stream=sys.stdout, level=logging.WARNING, format="   [log] %(levelname)s %(message)s"
    )
    naive_race()
    say()
    fixed()
    say()
    stuck()
    say()
    say("Read docs/patterns/executor_shutdown.md, run notebooks/01-executor-shutdown.ipynb,")
    say("and watch every pitfall happen with `make races`.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
