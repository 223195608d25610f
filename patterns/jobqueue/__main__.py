"""``python -m patterns.jobqueue``: see `patterns.jobqueue.cli` for the commands and exit codes.

The signal handlers come first, before the command line's imports (0.1 s): see
`patterns.jobqueue.signal_guard`. SIGQUIT prints every thread's stack to stderr, and the
process goes on, for every command.
"""

import faulthandler
import signal
import sys

from patterns.jobqueue.signal_guard import SignalGuard

guard = SignalGuard("python -m patterns.jobqueue").install()
faulthandler.register(signal.SIGQUIT, all_threads=True, chain=False)

from patterns.jobqueue.cli import main  # noqa: E402 - after the handlers, on purpose

sys.exit(main(guard=guard))
