"""Hazard: a non-daemon thread waits for an event that nobody sets, so the exit waits for it."""

import threading

stop = threading.Event()
entered = threading.Event()


def work() -> None:
    """Wait for a stop that never comes."""
    entered.set()
    stop.wait()  # nobody sets it


threading.Thread(target=work, name="waiter").start()
entered.wait()
print("main done", flush=True)  # noqa: T201 - the program speaks
