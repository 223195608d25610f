# Use it: an exit hook that still has logging, and a forced exit that keeps the output.
# prints: results: 3 of 3 jobs done
# prints: INFO exit hook: report flushed
import logging
import threading

from patterns.exit_hooks import force_exit, register_exit_hook


def flush_report() -> None:
    logging.getLogger("app").info("exit hook: report flushed")  # logging still works here


logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
register_exit_hook(flush_report)  # runs before logging.shutdown; a failure is logged
worker = threading.Thread(target=lambda: print("results: 3 of 3 jobs done"), name="worker")
worker.start()
worker.join(5)
if worker.is_alive():  # a stuck non-daemon thread would hold the exit: leave now
    force_exit(3, "the worker is stuck")  # logs why, flushes stdout and the log, os._exit(3)
