"""``python -m patterns.jobqueue``: the job queue's command line, a contract tools can rely on.

Usage (``--db`` may come before or after the command, or from ``$JOBQUEUE_DB``)::

    python -m patterns.jobqueue --db PATH enqueue TASK [JSON_PAYLOAD | -] [--payload-file F]
        [--delay S] [--max-attempts N] [--timeout S] [--tasks MODULE:ATTRIBUTE] [--wait S]
    python -m patterns.jobqueue --db PATH worker --tasks MODULE:ATTRIBUTE [--concurrency N]
        [--prefetch N] [--stop-timeout S] [--poll-interval S] [--watch-interval S] [--lease S]
        [--store-outage-limit S] [--exit-when-empty]
    python -m patterns.jobqueue --db PATH status [--json] [--wait S]
    python -m patterns.jobqueue --db PATH show ID [--json] [--wait S]
    python -m patterns.jobqueue --db PATH list [--state S] [--task T] [--limit N] [--json]
        [--wait S]
    python -m patterns.jobqueue --db PATH requeue (ID | --failed [--task T]) [--wait S]
    python -m patterns.jobqueue --db PATH cancel ID [--wait S]
    python -m patterns.jobqueue --db PATH purge [--older-than S] [--state S ...] [--wait S]
    python -m patterns.jobqueue --db PATH workers [--json] [--wait S]
    python -m patterns.jobqueue demo [--mini]

``enqueue`` prints the new job's id (``-`` reads the payload from stdin). ``status`` prints
the number of jobs in each state (``--json``: an object keyed by every state). ``show``
prints every field of one job; ``list`` one line per job, newest first; ``workers`` the
live workers. ``requeue`` puts a failed job back in the queue (attempts reset, last error
kept), ``cancel`` cancels a queued job or asks a running one's worker to cancel it,
``purge`` deletes finished jobs. ``worker`` runs a ``Worker`` with the handlers of the
``TaskRegistry`` named by ``MODULE:ATTRIBUTE`` (importable from the current directory or
``PYTHONPATH``), logging to stderr, until a signal stops it (see Signals below).
``demo`` runs a self-contained walkthrough on a temporary database
(`patterns.jobqueue.cli.demo`); ``demo --mini`` runs the same story with the mini job
queue, ``patterns.jobqueue.mini`` (`patterns.jobqueue.cli.mini_demo`).

``--db`` is an SQLite file, or a ``postgresql://`` URL (the queue then lives in that
database's ``jobqueue`` schema, shared by workers on several machines). Every command but
``enqueue`` and ``worker`` refuses a queue that does not exist ("no such queue": an SQLite
path, or a database without the schema) instead of creating it; ``:memory:`` and
``file:`` URIs are refused (the queue would vanish with the process).

``--wait S`` (every command but ``worker`` and ``demo``) bounds how long the command waits
for a lock another connection holds on the queue: a PostgreSQL table, the schema's
migration lock, an SQLite file's write lock. Past it the command gives up, changes
nothing, and exits 2 with one line. The default, 26 s, is as long as an SQLite file's busy
retries last; a longer ``--wait`` makes them go on until it passes.

Exit status:

====== =================================================================================
0      done (``worker``: stopped cleanly, nothing left running; or stopped by a signal
       during start-up before it claimed anything, which one line says)
1      ``worker``: stopped, but a thread died with an exception, a worker thread did not
       end within the budget while no job was running, or the store failed every claim
       for ``--store-outage-limit`` seconds (the report's ``failure``, logged)
2      the command did nothing: bad command-line input, an unimportable ``--tasks``, no
       such queue or job, a file that is not a store (a FIFO, a socket or a device is
       refused unread), a store that cannot be used (a read-only file, an unreachable
       server, a lock another connection held on the queue for the whole ``--wait``,
       26 s by default, on SQLite or PostgreSQL), or a refused request (``requeue`` of a
       job that is not failed, ``cancel`` of a finished job)
3      ``worker``: the shutdown budget ran out with jobs still running (the report's
       ``still_running``): each was released at the deadline (attempt given back, its
       late outcome refused), or, if its release failed, keeps its lease and runs again
       once that expires; the process exits at once with `os._exit`, because the
       interpreter would otherwise wait for their non-daemon threads forever
4      the output could not be written (a full disk, an I/O error, a standard output
       closed at start-up, ``>&-``; for a command that changes the queue, a closed pipe
       too): what the command changed stays changed, and the line says so ("job 31 was
       enqueued, but its id could not be printed: ..."); ``--help`` too
5      ``worker``: the store did not answer within the shutdown budget (a file or table
       locked by another connection, say): the stop gave up on it at the deadline (the
       report's ``store_gave_up``); the jobs whose outcome or release it could not write
       keep their lease and run again once it expires. Also a stop signal during
       start-up while the store was being opened (a schema locked by another
       connection): the opening gave up at the end of the budget, which one line says
129    ``worker``: a second SIGHUP forced the exit (128 + 1), during the stop or the
       start-up; the jobs it was running keep their lease and run again once it expires
130    a second SIGINT forced the exit (128 + 2), as for 129; or a command other than
       ``worker`` got a SIGINT: what had started was stopped, and one line says "interrupted"
141    a command that only reads (or ``demo``, or ``--help``) found its output pipe closed
       (``list | head -1``): it stops quietly, as a process killed by SIGPIPE would (128 + 13)
143    a second SIGTERM forced the exit (128 + 15), as for 129
128+n  killed by signal n (Python's ``subprocess`` says -n): SIGKILL; for other commands
       SIGTERM, SIGHUP, SIGUSR1; any signal but SIGQUIT in the interpreter's own start-up
====== =================================================================================

Signals (``worker``; SIGQUIT for every command):

=============== ==========================================================================
SIGTERM, SIGINT the first starts the graceful stop (DRAINING, then CANCELLING, within
or SIGHUP       ``--stop-timeout``), a second forces the exit (above). From the first line
                of ``__main__`` (before the imports) until the worker starts, the first is
                recorded and the worker stops before it claims anything: exit 0 (or 5,
                above, if opening the store still waited at the end of the budget). After
                the stop (the worker's ``-> STOPPED`` line), until the process exits, each
                is ignored, with one line until the command returns, silently (SIG_IGN)
                while the interpreter exits: the status stays the report's
SIGQUIT         every thread's stack on stderr (``faulthandler``); the process goes on.
                Once the command has returned: ignored, silently
SIGUSR1         one log line: the worker's state, its running job ids and its counters
SIGKILL         the process dies; its running jobs keep their lease and run again once it
                expires
SIGPIPE         ignored by Python: a write to a closed pipe fails instead (141, 4 above)
=============== ==========================================================================

Other commands get the default actions once the command line is parsed: SIGINT is
"interrupted" (130), SIGTERM, SIGHUP and SIGUSR1 kill (a shell says 128 + the number),
and one that came during start-up is delivered then. A signal in the interpreter's own
start-up, before ``__main__``'s first line (20 ms or more, with ``site``), meets
Python's defaults: it kills, or SIGINT prints a ``KeyboardInterrupt`` traceback.

Every error is one line on stderr, never a traceback (a stderr closed at start-up,
``2>&-``, loses the lines and the worker's logs, never the work); a command other than
``worker`` does not print the store's retries, only the error that ends them (for a
locked SQLite file, with how long it waited). The command line's modules print: they are
the user interface. The library logs.

This module parses the command line and runs one command. The parts, in
``patterns.jobqueue.cli``: `~patterns.jobqueue.cli.arguments` (the parser),
`~patterns.jobqueue.cli.store_access` (which queue, opened within ``--wait``),
`~patterns.jobqueue.cli.commands` (``enqueue`` and the operator's commands),
`~patterns.jobqueue.cli.worker_command` (``worker``), `~patterns.jobqueue.cli.output`
(the exit statuses, the lines, the formats), `~patterns.jobqueue.cli.demo` and
`~patterns.jobqueue.cli.mini_demo`.

Docs: docs/jobqueue/operations.md
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from patterns.jobqueue.cli import demo, mini_demo
from patterns.jobqueue.cli.arguments import build_parser
from patterns.jobqueue.cli.commands import COMMANDS
from patterns.jobqueue.cli.output import (
    EXIT_BROKEN_PIPE,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_OUTPUT,
    EXIT_STILL_RUNNING,
    EXIT_STORE_BLOCKED,
    EXIT_USAGE,
    PROG,
    OutputLost,
    UsageError,
    error,
    flush,
    output_lost,
    say,
    stdout,
)
from patterns.jobqueue.cli.signal_guard import SignalGuard
from patterns.jobqueue.cli.store_access import DB_VARIABLE, queue_name, without_retry_warnings
from patterns.jobqueue.cli.worker_command import run_worker_command

__all__ = [
    "DB_VARIABLE",
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_OUTPUT",
    "EXIT_STILL_RUNNING",
    "EXIT_STORE_BLOCKED",
    "EXIT_USAGE",
    "main",
]


# --- main: parse, run one command, report -----------------------------------------------------


def main(argv: Sequence[str] | None = None, *, guard: SignalGuard | None = None) -> int:
    """Run the command line; return the exit status (see the module docstring).

    ``guard``: the handlers ``__main__`` installed before its imports. ``worker`` keeps
    them until the process exits; any other command gets the default handlers back.
    """
    try:
        args = build_parser().parse_args(argv)
        if guard is not None and args.command != "worker":
            guard.release()  # a SIGINT it held raises KeyboardInterrupt here: "interrupted"
        if args.command == "demo":
            walkthrough = mini_demo.run if args.mini else demo.run
            try:
                return walkthrough(stdout())
            except demo.DemoOutputLost as exc:
                raise OutputLost(exc.cause) from exc
        args.db = queue_name(args)
        if args.command == "worker":
            return run_worker_command(args, guard)
        return _one_shot(args)
    except OutputLost as exc:
        return output_lost(exc)
    except UsageError as exc:
        error(str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        # Ctrl-C during a command other than ``worker`` (whose handlers hold SIGINT from
        # start-up to exit): whatever had started was stopped on the way out. One line.
        say(f"{PROG}: interrupted")
        return EXIT_INTERRUPTED


def _one_shot(args: argparse.Namespace) -> int:
    """Run a command that is not ``worker``: the store's retries unsaid, the output flushed."""
    with without_retry_warnings():
        status = COMMANDS[args.command](args)
    flush()  # here, not at the interpreter's exit, where a failure would be a traceback
    return status
