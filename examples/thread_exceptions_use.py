# Use it: every failed thread and task is logged when it fails, and the exit status says so.
# exit status: 1
# prints: ERROR
# prints: ZeroDivisionError
import logging
import sys
import threading

from patterns.thread_exceptions import LoggingExecutor, run_main


def main() -> int:
    with LoggingExecutor(max_workers=2) as pool:
        pool.submit(int, "seven")  # logged at ERROR when it fails, though nobody reads it
    worker = threading.Thread(target=lambda: 1 / 0, name="divider")
    worker.start()
    worker.join()  # run_main counts only the threads that fail before main returns
    return 0


logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
sys.exit(run_main(main))  # 1: a thread failed (a Ctrl-C is the usual traceback and 130)
