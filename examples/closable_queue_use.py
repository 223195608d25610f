# Use it: consumer threads on a closable queue; stop() drains it within 2 s and reports.
# A Ctrl-C in the block still stops the pool (the with block calls stop()).
# prints: processed=20, terminated=True
import logging
import os

from patterns.closable_queue import ConsumerPool

results: list[int] = []
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
with ConsumerPool(lambda n: results.append(n * n), consumers=3, stop_timeout=2) as pool:
    for n in range(20):
        pool.put(n)
report = pool.stop()  # the report of the stop the with block made: consumers drained the queue
print(f"processed={report.processed}, terminated={report.terminated}")
if not report.terminated:  # a stuck consumer's thread is not a daemon: it would hold the exit
    logging.error("still running: %s", report.still_running)
    logging.shutdown()
    os._exit(3)
