# Use it: a block that forgets to stop its worker fails, naming the line that started it.
# prints: started at examples/leak_check_use.py
# prints: the second block left nothing running
import logging
import threading

from patterns.leak_check import LeakError, no_leaks


def start_worker(stop: threading.Event) -> threading.Thread:
    worker = threading.Thread(target=stop.wait, name="worker")
    worker.start()
    return worker


logging.basicConfig(level=logging.INFO, format="%(message)s")
stop = threading.Event()
try:
    with no_leaks(grace=0.5):  # what starts in here must end within 0.5 s of the end
        start_worker(stop)  # nothing sets `stop` before the block ends: a leak
except LeakError as error:
    logging.warning("%s", error)  # thread 'worker' started at ...:12 in start_worker
finally:
    stop.set()
with no_leaks(grace=0.5):  # the fix: stop what you started before the block ends
    stop = threading.Event()
    worker = start_worker(stop)
    stop.set()
    worker.join(0.5)
logging.info("the second block left nothing running")
