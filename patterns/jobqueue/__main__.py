"""``python -m patterns.jobqueue``: `patterns.jobqueue.cli.main` has the commands and exit codes.

The signal handlers come first, before the command line's imports (0.1 s): see
`patterns.jobqueue.cli.signal_guard`. SIGQUIT prints every thread's stack to stderr, and the
process goes on, for every command. Once ``main`` has returned, SIGQUIT and the signals
the guard still holds (the worker's) are ignored until the process exits: see
`SignalGuard.ignore_until_exit`.
"""

import faulthandler
import os
import signal
import sys

from patterns.jobqueue.cli.signal_guard import SignalGuard


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


def _dump_stacks(signum: int, frame: object) -> None:
    """SIGQUIT: every thread's stack on stderr (to /dev/null if it is closed); nothing stops.

    A Python-level handler, so the main thread prints the stacks holding the GIL, while no
    other thread can change its frames. ``faulthandler.register`` reads them from the C
    signal handler while the threads run: once a handler thread's frame read as
    ``File ???`` and the worker died mid-dump.
    """
    faulthandler.dump_traceback(file=sys.stderr if sys.stderr is not None else 2, all_threads=True)


_fill_closed_standard_fds()
guard = SignalGuard("python -m patterns.jobqueue").install()
signal.signal(signal.SIGQUIT, _dump_stacks)

from patterns.jobqueue.cli.main import main  # noqa: E402 - after the handlers, on purpose

try:
    status = main(guard=guard)
finally:
    guard.ignore_until_exit()  # the interpreter's exit would make a stop signal kill
    # The interpreter's exit puts SIG_DFL (a core dump) back on a Python handler, and a
    # stack dump while it is torn down can crash it (SIGSEGV on 3.13): SIG_IGN from here.
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
sys.exit(status)
