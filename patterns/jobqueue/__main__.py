"""``python -m patterns.jobqueue``: see `patterns.jobqueue.cli` for the commands and exit codes.

The signal handlers come first, before the command line's imports (0.1 s): see
`patterns.jobqueue.signal_guard`. SIGQUIT prints every thread's stack to stderr, and the
process goes on, for every command. Once ``main`` has returned, SIGQUIT and the signals
the guard still holds (the worker's) are ignored until the process exits: see
`SignalGuard.ignore_until_exit`.
"""

import faulthandler
import os
import signal
import sys

from patterns.jobqueue.signal_guard import SignalGuard


def _fill_closed_standard_fds() -> None:
    """Put /dev/null on fd 0, 1 or 2 if it is closed (``2>&-``), before anything opens a file.

    Otherwise the next file opened takes that number (the worker's wakeup pipe, say), and
    a line meant for stderr (the guard's, ``faulthandler``'s) is written into it.
    ``sys.stdin``, ``sys.stdout`` and ``sys.stderr`` stay None: the command knows it.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: fd itself
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


_fill_closed_standard_fds()
guard = SignalGuard("python -m patterns.jobqueue").install()
# faulthandler puts back the disposition it found (at unregister(), or at the interpreter's
# exit): SIG_IGN, so that a SIGQUIT in the process's last milliseconds does not dump core.
signal.signal(signal.SIGQUIT, signal.SIG_IGN)
# With stderr closed, the stacks go to /dev/null: SIGQUIT still does not end the process.
faulthandler.register(
    signal.SIGQUIT, file=sys.stderr if sys.stderr is not None else 2, all_threads=True, chain=False
)

from patterns.jobqueue.cli import main  # noqa: E402 - after the handlers, on purpose

try:
    status = main(guard=guard)
finally:
    guard.ignore_until_exit()  # the interpreter's exit would make a stop signal kill
    # A stack dump while the interpreter is torn down can crash it (SIGSEGV on 3.13):
    # from here on SIGQUIT gets what faulthandler found, SIG_IGN.
    faulthandler.unregister(signal.SIGQUIT)
sys.exit(status)
