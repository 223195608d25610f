# Use it: a consumer thread that is restarted when it dies, at most 3 times a minute.
# prints: restarts=1, healthy=True, terminated=True
import os
import queue
import threading

from patterns.supervisor import Supervisor

q: queue.Queue[int] = queue.Queue()


def consume(stop: threading.Event) -> None:
    while not stop.is_set():  # stop() sets it; a Ctrl-C in the block calls stop() too
        try:
            item = q.get(timeout=0.1)
        except queue.Empty:
            continue
        try:
            print("10 /", item, "=", 10 / item)  # 0 kills this thread; it is restarted
        finally:
            q.task_done()


with Supervisor(consume, name="consumer", max_restarts=3, window=60, interval=0.1) as sup:
    for item in (1, 0, 2):
        q.put(item)
    q.join()
report = sup.stop()
print(f"restarts={report.restarts}, healthy={report.healthy}, terminated={report.terminated}")
if not report.terminated:  # the consumer ignored stop: its thread would hold the exit
    os._exit(3)
