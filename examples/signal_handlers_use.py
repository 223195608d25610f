# Use it: a worker that drains on the first SIGTERM or Ctrl-C, and exits at once on a second.
# prints: working
# prints: drained; cleaned up
# Ctrl-C after: working
import logging
import os
import threading

from patterns.signal_handlers import run_until_signalled


def work(stop: threading.Event) -> None:
    print("working; Ctrl-C or SIGTERM to stop", flush=True)
    while not stop.wait(0.1):
        pass  # take a job, do it; once stop is set, finish the current one and return


logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
if not run_until_signalled(work, drain_timeout=5, cleanup=lambda: print("drained; cleaned up")):
    logging.shutdown()
    os._exit(3)  # work is still running after 5 s: its thread would hold the exit
