"""Use it: a durable job queue in one file, worked until it is empty; Ctrl-C drains it."""

import logging
import sys

from patterns.cancellation import CancelToken
from patterns.exit_hooks import force_exit
from patterns.jobqueue.mini import MiniStore, Worker


def square(payload: dict[str, int], token: CancelToken) -> int:
    """A handler: ``token.check()`` is where a stop that must cancel the job stops it."""
    token.check()
    return payload["n"] ** 2


logging.basicConfig(level=logging.INFO, format="%(message)s")
store = MiniStore(sys.argv[1] if len(sys.argv) > 1 else "jobs.sqlite3")  # outlives the process
for n in range(5):
    store.enqueue("square", {"n": n})
worker = Worker(store, {"square": square}, exit_when_empty=True, install_signal_handlers=True)
report = worker.run()  # until the queue is empty, or SIGTERM / Ctrl-C (a second one forces)
logging.info("%s %s", store.counts(), report)
if not report.terminated:  # a handler ignored its token: its thread would hold the exit
    force_exit(3, f"left running: {report.still_running}")
