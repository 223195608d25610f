"""Hazard: an atexit handler that waits for something that never happens."""

import atexit
import threading

flushed = threading.Event()


def flush_on_exit() -> None:
    """Wait for a flush that nobody will ever signal."""
    flushed.wait()  # the thread that would set it was never started


atexit.register(flush_on_exit)
print("main done", flush=True)  # noqa: T201 - the program speaks
