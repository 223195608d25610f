"""Hazard: a pool task that never ends, in a pool nobody shuts down; the exit joins its worker."""

import threading
from concurrent.futures import ThreadPoolExecutor

release = threading.Event()
entered = threading.Event()


def stuck() -> None:
    """A task that never ends."""
    entered.set()
    release.wait()  # nobody sets it


pool = ThreadPoolExecutor(thread_name_prefix="pool")
pool.submit(stuck)
entered.wait()
print("main done", flush=True)  # noqa: T201 - the program speaks
