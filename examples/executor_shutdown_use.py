# Use it: run tasks on a pool whose stop takes 2 s at most, then act on what it left.
# A Ctrl-C in the block waits up to 2 s for the tasks (saying so); a second one stops now.
# prints: results: [0, 1, 4, 9, 16, 25, 36, 49]
# prints: terminated=True
import logging
import os
import time

from patterns.executor_shutdown import TrackingExecutor


def square(n: int) -> int:
    time.sleep(0.05)
    return n * n


logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
with TrackingExecutor(max_workers=4, stop_timeout=2) as pool:
    futures = [pool.submit(square, n) for n in range(8)]
    print("results:", [f.result() for f in futures])
report = pool.stop()  # the report of the stop the with block made
print(f"terminated={report.terminated}, still running: {report.still_running}")
if not report.terminated:  # a stuck task's thread is not a daemon: it would hold the exit
    logging.shutdown()
    os._exit(3)
