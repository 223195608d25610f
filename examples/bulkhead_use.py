# Use it: at most 2 calls at once and 2 waiting; beyond that a fast "no"; stop() reports.
# A Ctrl-C in the block still stops it: the with block calls stop().
# prints: full:
# prints: results: [True, True, True, True]
# prints: terminated=True
import logging
import os
import threading

from patterns.bulkhead import Bulkhead, BulkheadFull

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
release = threading.Event()
with Bulkhead(max_concurrent=2, queue_size=2, name="db", stop_timeout=2) as db:
    busy = [db.submit(release.wait) for _ in range(4)]  # 2 running, 2 waiting
    try:
        db.call(len, "one too many", timeout=1)
    except BulkheadFull as exc:
        print("full:", exc)
    release.set()
    print("results:", [future.result(timeout=5) for future in busy])
report = db.stop()
print(f"terminated={report.terminated}, still running: {report.still_running}")
if not report.terminated:  # a stuck call's thread would hold the exit
    os._exit(3)
