"""``python -m patterns.jobqueue``: see `patterns.jobqueue.cli` for the commands and exit codes.

The signal handlers come first, before the command line's imports (0.1 s): see
`patterns.jobqueue.signal_guard`. SIGQUIT prints every thread's stack to stderr, and the
process goes on, for every command. Once ``main`` has returned, the signals the guard
still holds (the worker's) are ignored until the process exits: see
`SignalGuard.ignore_until_exit`.
"""

import faulthandler
import signal
import sys

from patterns.jobqueue.signal_guard import SignalGuard

guard = SignalGuard("python -m patterns.jobqueue").install()
faulthandler.register(signal.SIGQUIT, all_threads=True, chain=False)

from patterns.jobqueue.cli import main  # noqa: E402 - after the handlers, on purpose

try:
    status = main(guard=guard)
finally:
    guard.ignore_until_exit()  # the interpreter's exit would make a stop signal kill
sys.exit(status)
