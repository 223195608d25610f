# Use it: a background thread that main stops on the way out, within 2 s: not a daemon.
# A Ctrl-C in the block still stops it: the with block calls stop().
# prints: terminated=True
import logging
import os
import threading
import time

from patterns.daemon_threads import BackgroundService

batches: list[float] = []


def export(stopping: threading.Event) -> None:
    while not stopping.wait(0.01):  # wakes at once when stop() sets it
        batches.append(time.monotonic())


logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
with BackgroundService(export, name="exporter", stop_timeout=2) as service:
    time.sleep(0.2)  # main's own work
report = service.stop()  # the report of the stop the with block made
print(f"exported {len(batches)} batches; terminated={report.terminated}")
if not report.terminated:  # the thread ignored its event: it would hold the exit
    os._exit(3)
