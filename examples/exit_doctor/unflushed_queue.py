"""Hazard: 10 MB put on a multiprocessing queue nobody reads; the exit waits for the feeder."""

import multiprocessing

q = multiprocessing.Queue()
q.put(b"x" * 10_000_000)  # more than the pipe holds: the feeder thread blocks writing it
print("main done", flush=True)  # noqa: T201 - the program speaks
