"""Hazard, or not: a multiprocessing.Pool never closed, with a task still running at exit."""

import multiprocessing
import time

started = multiprocessing.Event()


def slow(seconds: float) -> None:
    """A task that runs for an hour."""
    started.set()
    time.sleep(seconds)


if __name__ == "__main__":
    pool = multiprocessing.get_context("fork").Pool(2)
    pool.apply_async(slow, (3600,))
    started.wait()
    print("main done", flush=True)  # noqa: T201 - the program speaks
