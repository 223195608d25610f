"""Use it: a block that forgets to stop its worker fails, and the message says who started it."""

import logging
import sys
import threading

from patterns.leak_check import LeakError, no_leaks


def start_worker(stop: threading.Event) -> threading.Thread:
    """Start a worker thread that runs until ``stop`` is set."""
    worker = threading.Thread(target=stop.wait, name="worker")
    worker.start()
    return worker


def main() -> int:
    """Check a block that leaves its worker running, then one that stops it."""
    stop = threading.Event()
    try:
        with no_leaks(grace=0.5):  # what starts in here must end within 0.5 s of the end
            start_worker(stop)  # nothing sets `stop` before the block ends: a leak
    except LeakError as error:
        logging.warning("%s", error)  # thread 'worker'  started at ...:13 in start_worker
    finally:
        stop.set()
    with no_leaks(grace=0.5):  # the fix: stop what you started before the block ends
        stop = threading.Event()
        worker = start_worker(stop)
        stop.set()
        worker.join(0.5)
    logging.info("the second block left nothing running")
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(main())
