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
    python -m patterns.jobqueue demo

``enqueue`` prints the new job's id (``-`` reads the payload from stdin). ``status`` prints
the number of jobs in each state (``--json``: an object keyed by every state). ``show``
prints every field of one job; ``list`` one line per job, newest first; ``workers`` the
live workers. ``requeue`` puts a failed job back in the queue (attempts reset, last error
kept), ``cancel`` cancels a queued job or asks a running one's worker to cancel it,
``purge`` deletes finished jobs. ``worker`` runs a ``Worker`` with the handlers of the
``TaskRegistry`` named by ``MODULE:ATTRIBUTE`` (importable from the current directory or
``PYTHONPATH``), logging to stderr, until a signal stops it (see Signals below).
``demo`` runs a self-contained walkthrough on a temporary database
(`patterns.jobqueue.cli.demo`).

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
locked SQLite file, with how long it waited). This module and `patterns.jobqueue.cli.demo`
print: they are the user interface. The library logs.

Docs: docs/jobqueue/operations.md
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import errno
import importlib
import json
import logging
import math
import os
import re
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn, TextIO, TypeVar

from patterns.exit_hooks import force_exit
from patterns.jobqueue.cli import demo
from patterns.jobqueue.cli.signal_guard import SignalGuard
from patterns.jobqueue.cli.worker_signals import WorkerSignals
from patterns.jobqueue.stores.checks import encode_payload
from patterns.jobqueue.stores.deadline import Deadline, StoreTimeout, bounded_by
from patterns.jobqueue.stores.postgres.store import (
    PostgresStore,
    StoreSchemaError,
    StoreUnavailable,
    is_postgres_url,
)
from patterns.jobqueue.stores.protocol import Store
from patterns.jobqueue.stores.records import (
    FINISHED_STATES,
    MAX_ATTEMPTS_LIMIT,
    MAX_SECONDS,
    CancelResult,
    Job,
    JobState,
    JsonValue,
    WorkerRecord,
)
from patterns.jobqueue.stores.sqlite.schema import is_busy
from patterns.jobqueue.stores.sqlite.store import WATCH_INTERVAL, SQLiteStore, StoreFileError
from patterns.jobqueue.stores.sqlite.watch import WATCH_IDLE_INTERVAL, WATCH_QUIET
from patterns.jobqueue.tasks import TaskRegistry
from patterns.jobqueue.worker.worker import Worker, WorkerReport
from patterns.thread_exceptions import LoggingExcepthook

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

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_STILL_RUNNING = 3
EXIT_OUTPUT = 4
EXIT_STORE_BLOCKED = 5
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for `git log | head -1`
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process ended by Ctrl-C

PROG = "python -m patterns.jobqueue"
DB_VARIABLE = "JOBQUEUE_DB"
"""The environment variable naming the queue when ``--db`` is not given."""

# The longest wait a worker option may ask for: a store's time limit, and what
# threading's waits accept (TIMEOUT_MAX, about 292 years on Linux, less elsewhere).
_MAX_WAIT = min(MAX_SECONDS, threading.TIMEOUT_MAX)
# The shortest idle waits a worker option may ask for: below them an idle worker keeps a
# CPU busy for nothing (--poll-interval 1e-9 took 36 % of a core, --watch-interval 1e-9
# 18 %; 0.01 and 0.001 take about 2 % and 0.2 %, the defaults about 0).
_MIN_POLL_INTERVAL = 0.01
_MIN_WATCH_INTERVAL = 0.001
_MAX_CONCURRENCY = 1000  # threads in one process: more is a typo, not a plan
_MAX_LIMIT = 100_000  # rows one `list` prints
_MAX_ID = 2**63 - 1  # the largest id SQLite and PostgreSQL (bigint) can hold
_MAX_PAYLOAD_INPUT = 64 * 1024 * 1024  # bytes read from stdin or a file, at most
_SHOWN_ERROR = 60  # characters of a last error on a `list` line
# A one-shot command's default --wait: as long as an SQLite file's busy retries last (five
# attempts of its 5 s busy wait, and the backoff between them: 26.5 s measured).
_WAIT = 26.0

T = TypeVar("T")


class UsageError(Exception):
    """The command did nothing: reported as one line on stderr, exit status 2."""


class OutputLost(Exception):
    """Standard output could not be written; ``done`` says what the command changed, if anything.

    Exit status 141, quietly, for a closed pipe when nothing changed; else one line, status 4.
    """

    def __init__(self, cause: OSError, done: str | None = None) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.done = done


# --- the parser: every command and option, checked before anything runs -----------------------


class _Parser(argparse.ArgumentParser):
    """An `argparse.ArgumentParser` whose errors are one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        """Raise ``UsageError`` instead of printing the whole usage text."""
        raise UsageError(message)

    def print_help(self, file: Any = None) -> None:  # Any: typeshed's private SupportsWrite
        """Print the help, flushed: a closed pipe raises here, not at the interpreter's exit.

        Written here, not by argparse, which swallows a failed write (``python -u``, or a
        help longer than the buffer, would exit 0 with nothing printed).
        """
        stream = _stdout() if file is None else file
        try:
            stream.write(self.format_help())
            stream.flush()
        except OSError as exc:
            raise OutputLost(exc) from exc


def _seconds(
    name: str, *, minimum: float, inclusive: bool, maximum: float = MAX_SECONDS
) -> Callable[[str], float]:
    """A parser of a number of seconds in [minimum, maximum] (or (minimum, maximum])."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(
                f"{name} must be a finite number of seconds, got {text}"
            )
        if value < minimum or (value == minimum and not inclusive):
            bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
            raise argparse.ArgumentTypeError(f"{name} must be {bound}, got {text}")
        if value > maximum:
            raise argparse.ArgumentTypeError(
                f"{name} must be at most {maximum:g} seconds, got {text}"
            )
        return value

    parse.__name__ = name
    return parse


def _whole(name: str, *, minimum: int = 1, maximum: int) -> Callable[[str], int]:
    """A parser of a whole number in [minimum, maximum]."""

    def parse(text: str) -> int:
        digits = text.strip()
        if not digits.lstrip("+-").isdigit():
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
        if len(digits) > 30:  # int() of a few thousand digits raises ValueError
            sign = "at least" if digits.startswith("-") else "at most"
            bound = minimum if digits.startswith("-") else maximum
            raise argparse.ArgumentTypeError(f"{name} must be {sign} {bound}, got {digits}")
        value = int(digits)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{name} must be at least {minimum}, got {value}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"{name} must be at most {maximum}, got {value}")
        return value

    parse.__name__ = name
    return parse


_job_id = _whole("job id", maximum=_MAX_ID)


def _poll_interval(text: str) -> float:
    """``--poll-interval``: at least `_MIN_POLL_INTERVAL` seconds."""
    value = _seconds("poll-interval", minimum=0, inclusive=False, maximum=_MAX_WAIT)(text)
    if value < _MIN_POLL_INTERVAL:
        raise argparse.ArgumentTypeError(
            f"poll-interval must be at least {_MIN_POLL_INTERVAL:g} seconds "
            f"(less keeps an idle worker's CPU busy), got {text}"
        )
    return value


def _watch_interval(text: str) -> float:
    """``--watch-interval``: 0 (off), or at least `_MIN_WATCH_INTERVAL` seconds."""
    value = _seconds("watch-interval", minimum=0, inclusive=True, maximum=_MAX_WAIT)(text)
    if 0 < value < _MIN_WATCH_INTERVAL:
        raise argparse.ArgumentTypeError(
            f"watch-interval must be 0 (off) or at least {_MIN_WATCH_INTERVAL:g} seconds "
            f"(less keeps an idle worker's CPU busy), got {text}"
        )
    return value


_DB_HELP = (
    "the queue: an SQLite file (created by enqueue and worker only) or a postgresql:// "
    f"URL; accepted before or after the command (default: ${DB_VARIABLE})"
)

_Command = Callable[[str, str], argparse.ArgumentParser]
"""Adds a command to the parser: ``command(name, help_text)`` returns its sub-parser."""


def _parser() -> _Parser:
    """The whole command line: the global options, then each command in the order of ``--help``."""
    parser = _Parser(prog=PROG, description="A durable job queue on SQLite or PostgreSQL.")
    parser.add_argument("--db", metavar="PATH", default=None, help=_DB_HELP)
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="the worker's log level on stderr (default: INFO)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        # SUPPRESS: absent after the command, it leaves the value given before it alone.
        sub.add_argument("--db", metavar="PATH", default=argparse.SUPPRESS, help=_DB_HELP)
        return sub

    def one_shot(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = command(name, help_text)
        _wait_option(sub)
        return sub

    _enqueue_arguments(one_shot("enqueue", "add a job; prints its id"))
    _worker_arguments(command("worker", "run a worker until signalled"))
    _reading_commands(one_shot)
    _changing_commands(one_shot)
    _json_flag(one_shot("workers", "print the live workers"))
    commands.add_parser("demo", help="run the walkthrough on a temporary database")
    return parser


def _json_flag(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--json", action="store_true", help="print JSON, times as raw seconds since the epoch"
    )


def _wait_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--wait",
        metavar="SECONDS",
        type=_seconds("wait", minimum=0, inclusive=True, maximum=_MAX_WAIT),
        default=None,
        help="seconds to wait for a lock another connection holds on the queue (a table, "
        "the schema's migration lock, an SQLite file's write lock) before giving up with "
        f"one line, exit 2, nothing changed (default: {_WAIT:g}, as long as an SQLite "
        "file's busy retries last)",
    )


def _enqueue_arguments(enqueue: argparse.ArgumentParser) -> None:
    enqueue.add_argument("task", metavar="TASK", help="the task's registered name")
    enqueue.add_argument(
        "payload",
        metavar="JSON_PAYLOAD",
        nargs="?",
        default=None,
        help="the payload as JSON; - reads it from stdin (default: null)",
    )
    enqueue.add_argument(
        "--payload-file",
        metavar="PATH",
        help="read the JSON payload from this file (default: none, JSON_PAYLOAD is used)",
    )
    enqueue.add_argument(
        "--delay",
        metavar="SECONDS",
        type=_seconds("delay", minimum=0, inclusive=True),
        help=f"seconds from now before it may run, 0 to {MAX_SECONDS:g} (default: 0)",
    )
    enqueue.add_argument(
        "--max-attempts",
        metavar="N",
        type=_whole("max-attempts", maximum=MAX_ATTEMPTS_LIMIT),
        help=f"claims before it fails for good, 1 to {MAX_ATTEMPTS_LIMIT} "
        "(default: the task's, with --tasks; else 3)",
    )
    enqueue.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=_seconds("timeout", minimum=0, inclusive=False),
        help="seconds its handler may run per attempt "
        "(default: the task's, with --tasks; else no limit)",
    )
    enqueue.add_argument(
        "--tasks",
        metavar="MODULE:ATTRIBUTE",
        help="a TaskRegistry: its defaults for the task, and a warning for an unknown name "
        "(default: none: 3 attempts, no timeout, no check)",
    )


def _worker_arguments(worker: argparse.ArgumentParser) -> None:
    worker.add_argument(
        "--tasks", required=True, metavar="MODULE:ATTRIBUTE", help="the TaskRegistry to run"
    )
    worker.add_argument(
        "--concurrency",
        metavar="N",
        type=_whole("concurrency", maximum=_MAX_CONCURRENCY),
        default=4,
        help=f"handler threads, 1 to {_MAX_CONCURRENCY} (default: 4)",
    )
    worker.add_argument(
        "--prefetch",
        metavar="N",
        type=_whole("prefetch", minimum=0, maximum=_MAX_CONCURRENCY),
        default=0,
        help=f"claims held beyond --concurrency, waiting for a free handler thread, 0 to "
        f"{_MAX_CONCURRENCY}: a freed thread finds its next job at once, but a prefetched job "
        "holds its lease and has used an attempt before it starts, so if the process is "
        "killed it waits for its lease to expire (default: 0)",
    )
    worker.add_argument(
        "--stop-timeout",
        metavar="SECONDS",
        type=_seconds("stop-timeout", minimum=0, inclusive=True, maximum=_MAX_WAIT),
        default=10.0,
        help="seconds the graceful stop may take: 3/4 draining, 1/4 cancelling (default: 10)",
    )
    worker.add_argument(
        "--poll-interval",
        metavar="SECONDS",
        type=_poll_interval,
        default=1.0,
        help="seconds an idle worker waits before it looks for due jobs again, at least "
        f"{_MIN_POLL_INTERVAL:g} (default: 1)",
    )
    worker.add_argument(
        "--watch-interval",
        metavar="SECONDS",
        type=_watch_interval,
        default=WATCH_INTERVAL,
        help="SQLite: seconds between looks for a commit by another process, which wakes "
        f"an idle worker at once; after {WATCH_QUIET:g} s without one, it looks less often, "
        f"up to {WATCH_IDLE_INTERVAL:g} s apart (or this, if longer); 0 turns it off, else "
        f"at least {_MIN_WATCH_INTERVAL:g} (default: {WATCH_INTERVAL:g}; PostgreSQL wakes "
        "through LISTEN/NOTIFY and ignores it)",
    )
    worker.add_argument(
        "--lease",
        metavar="SECONDS",
        type=_seconds("lease", minimum=0, inclusive=False, maximum=_MAX_WAIT),
        default=30.0,
        help="seconds a claim holds its job, renewed every third of it (default: 30)",
    )
    worker.add_argument(
        "--store-outage-limit",
        metavar="SECONDS",
        type=_seconds("store-outage-limit", minimum=0, inclusive=False, maximum=_MAX_WAIT),
        default=60.0,
        help="seconds the store may fail every claim (a read-only file, a server down) "
        "before the worker stops and exits 1 with the reason (default: 60)",
    )
    worker.add_argument(
        "--exit-when-empty",
        action="store_true",
        help="stop once this worker is idle, no job is due now and none is running in any "
        "worker; jobs due later (a retry waiting out its backoff, a --delay) stay queued "
        "for the next worker, and a running job elsewhere (or its expiring lease) is "
        "waited for; a store that fails every claim is never empty (see "
        "--store-outage-limit) (default: run until signalled)",
    )


def _reading_commands(command: _Command) -> None:
    """``status``, ``show`` and ``list`` (``workers`` comes after the commands that change jobs)."""
    status = command("status", "print the number of jobs in each state")
    _json_flag(status)

    show = command("show", "print every field of one job")
    show.add_argument("id", metavar="ID", type=_job_id)
    _json_flag(show)

    listing = command("list", "print jobs, newest first, one line each")
    listing.add_argument(
        "--state",
        choices=[s.value for s in JobState],
        help="only jobs in this state (default: all)",
    )
    listing.add_argument("--task", metavar="TASK", help="only jobs of this task (default: all)")
    listing.add_argument(
        "--limit",
        metavar="N",
        type=_whole("limit", maximum=_MAX_LIMIT),
        default=50,
        help=f"at most this many jobs, 1 to {_MAX_LIMIT} (default: 50)",
    )
    _json_flag(listing)


def _changing_commands(command: _Command) -> None:
    """``requeue``, ``cancel`` and ``purge``."""
    requeue = command("requeue", "put a failed job back in the queue, attempts reset")
    requeue.add_argument("id", metavar="ID", type=_job_id, nargs="?", help="the failed job")
    requeue.add_argument("--failed", action="store_true", help="every failed job instead")
    requeue.add_argument(
        "--task", metavar="TASK", help="with --failed: only this task's jobs (default: every task)"
    )

    cancel = command("cancel", "cancel a queued job, or ask a running job's worker to")
    cancel.add_argument("id", metavar="ID", type=_job_id)

    finished = sorted(s.value for s in FINISHED_STATES)
    purge = command("purge", "delete finished jobs; prints how many")
    purge.add_argument(
        "--older-than",
        metavar="SECONDS",
        type=_seconds("older-than", minimum=0, inclusive=True),
        help="only jobs that finished at least this many seconds ago (default: 0, any)",
    )
    purge.add_argument(
        "--state",
        action="append",
        choices=finished,
        help=f"only jobs in this state; repeatable (default: all of {', '.join(finished)})",
    )


# --- main: parse, run one command, report -----------------------------------------------------


def main(argv: Sequence[str] | None = None, *, guard: SignalGuard | None = None) -> int:
    """Run the command line; return the exit status (see the module docstring).

    ``guard``: the handlers ``__main__`` installed before its imports. ``worker`` keeps
    them until the process exits; any other command gets the default handlers back.
    """
    try:
        args = _parser().parse_args(argv)
        if guard is not None and args.command != "worker":
            guard.release()  # a SIGINT it held raises KeyboardInterrupt here: "interrupted"
        if args.command == "demo":
            try:
                return demo.run(_stdout())
            except demo.DemoOutputLost as exc:
                raise OutputLost(exc.cause) from exc
        args.db = _queue_name(args)
        if args.command == "worker":
            return _worker(args, guard)
        return _one_shot(args)
    except OutputLost as exc:
        return _output_lost(exc)
    except UsageError as exc:
        _error(str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        # Ctrl-C during a command other than ``worker`` (whose handlers hold SIGINT from
        # start-up to exit): whatever had started was stopped on the way out. One line.
        _say(f"{PROG}: interrupted")
        return EXIT_INTERRUPTED


def _one_shot(args: argparse.Namespace) -> int:
    """Run a command that is not ``worker``: the store's retries unsaid, the output flushed."""
    with _without_retry_warnings():
        status = _COMMANDS[args.command](args)
    _flush()  # here, not at the interpreter's exit, where a failure would be a traceback
    return status


def _say(line: str) -> None:
    """Print ``line`` on stderr; nothing if it was closed at start-up (``2>&-``).

    The line is lost then, never the work; and never printed to stdout instead, where
    ``print(file=None)`` would send it.
    """
    if sys.stderr is not None:
        print(line, file=sys.stderr)  # noqa: T201 - the CLI's output


def _error(text: str) -> None:
    message = " ".join(text.split())  # one line, whatever the cause said
    _say(f"{PROG}: error: {message}")


def _warn(text: str) -> None:
    message = " ".join(text.split())
    _say(f"{PROG}: warning: {message}")


def _stdout() -> TextIO:
    """``sys.stdout``; `OutputLost` if standard output was closed at start-up (``>&-``).

    Python sets ``sys.stdout`` to None then, and ``print`` writes nothing, silently.
    """
    if sys.stdout is None:
        raise OutputLost(OSError(errno.EBADF, "standard output is closed"))
    return sys.stdout


def _out(text: str = "") -> None:
    """Print a line of output (flushed by `main` once the command is done)."""
    try:
        print(text, file=_stdout())
    except OSError as exc:
        raise OutputLost(exc) from exc


def _flush() -> None:
    try:
        _stdout().flush()
    except OSError as exc:
        raise OutputLost(exc) from exc


def _confirm(text: str, *, done: str) -> None:
    """Print the line confirming a change already made; if it is lost, the error says ``done``."""
    try:
        _out(text)
        _flush()
    except OutputLost as exc:
        raise OutputLost(exc.cause, done) from exc.cause


def _output_lost(exc: OutputLost) -> int:
    """Report output that could not be written (see the exit statuses 4 and 141)."""
    # The signal module's recipe for SIGPIPE: what is still buffered would fail again at
    # the interpreter's exit, so standard output goes to devnull from here on.
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        pass  # not a file (a test's capture): nothing is flushed at exit
    else:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    if exc.done is not None:
        _error(f"{exc.done}: {exc.cause}")
        return EXIT_OUTPUT
    if isinstance(exc.cause, BrokenPipeError):
        return EXIT_BROKEN_PIPE  # the reader has what it wanted: no line, as `git log | head`
    _error(f"cannot write the output: {exc.cause}")
    return EXIT_OUTPUT


# The loggers of the stores' retries; both mark those records with a ``retry`` attribute
# (a logger's filter sees only its own records, not its children's).
_STORE_LOGGERS = (
    "patterns.jobqueue.stores.postgres.connection",
    "patterns.jobqueue.stores.sqlite.transactions",
)


class _NoRetries(logging.Filter):
    """Drops the records of a store call's retries."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not hasattr(record, "retry")


@contextlib.contextmanager
def _without_retry_warnings() -> Iterator[None]:
    """A one-shot command's failure is its one error line, which names the retries' last error.

    The worker, a long-running process, logs each retry: an operator watches its log.
    """
    quiet = _NoRetries()
    loggers = [logging.getLogger(name) for name in _STORE_LOGGERS]
    for store_logger in loggers:
        store_logger.addFilter(quiet)
    try:
        yield
    finally:
        for store_logger in loggers:
            store_logger.removeFilter(quiet)


# --- the queue: which one, opened how --------------------------------------------------------


def _queue_name(args: argparse.Namespace) -> str:
    name: str | None = args.db or os.environ.get(DB_VARIABLE) or None
    if name is None:
        raise UsageError(
            f"the following arguments are required: --db (for {args.command}), or set {DB_VARIABLE}"
        )
    if is_postgres_url(name):
        return name
    if name.strip() == ":memory:" or "mode=memory" in name or name.startswith("file::memory:"):
        raise UsageError(
            f"--db {name}: an in-memory database vanishes when this command exits, and "
            "every job with it; give a file path"
        )
    if name.startswith("file:"):
        raise UsageError(f"--db {name}: SQLite URIs are not accepted; give a file path")
    return name


def _store_errors() -> tuple[type[Exception], ...]:
    """What a store raises when it cannot do what it was asked (never a bad argument).

    psycopg's errors count once psycopg is loaded, which a PostgreSQL store does as it
    connects: importing it up front would cost a SQLite worker about 30 ms at every exit.
    """
    errors: list[type[Exception]] = [
        StoreFileError,
        StoreSchemaError,
        StoreUnavailable,
        sqlite3.Error,
        OSError,
    ]
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None:
        errors.append(psycopg.Error)
    return tuple(errors)


def _open_errors() -> tuple[type[Exception], ...]:
    """What opening a store raises for a queue that cannot be used (exit 2)."""
    return (ImportError, ValueError, *_store_errors())


def _shown(db: str) -> str:
    """``db`` fit for a message: a URL's password replaced by ``***``."""
    return re.sub(r"(://[^/@]*?:)[^/@]*@", r"\1***@", db)


def _open_store(
    path: str, *, create: bool = False, watch_interval: float = WATCH_INTERVAL
) -> SQLiteStore | PostgresStore:
    """Open the queue; without ``create``, a queue that does not exist is refused, not made."""
    if not create and not is_postgres_url(path) and not os.path.exists(path):
        raise UsageError(f"no such queue: {path}")
    try:
        if is_postgres_url(path):
            return PostgresStore(path, create=create)
        return SQLiteStore(path, create=create, watch_interval=watch_interval)
    except StoreTimeout:
        raise  # the caller's deadline passed: the caller says what that means
    except _open_errors() as exc:
        raise UsageError(str(exc)) from exc


def _with_store(args: argparse.Namespace, action: Callable[[Store], T], *, what: str) -> T:
    """Open the queue, run ``action`` on it, close it; a store error is one line, exit 2.

    Every store call, the opening included, keeps to ``--wait``
    (`patterns.jobqueue.stores.deadline`): a lock another connection holds is waited for that long
    at most, on either store. Without ``--wait`` the bound is ``_WAIT`` and an SQLite file's own
    busy retries may end sooner; with it, they go on until it passes (a patient deadline).
    """
    wait = _WAIT if args.wait is None else args.wait
    deadline = Deadline(patient=args.wait is not None)
    began = time.monotonic()
    deadline.set(began + wait)
    try:
        with bounded_by(deadline):
            store = _open_store(args.db, create=args.command == "enqueue")
            try:
                return action(store)
            finally:
                store.close()
    except (TypeError, ValueError, StoreFileError) as exc:  # a refused argument, a bad file
        raise UsageError(str(exc)) from exc  # (a StoreFileError names the file itself)
    except StoreTimeout as exc:
        waited = time.monotonic() - began
        raise UsageError(
            f"{_shown(args.db)}: cannot {what}: {exc} (still waiting after {waited:.1f} s, "
            f"the --wait limit ({wait:g} s): another connection holds a lock on the queue, "
            "or the server does not answer); nothing was changed"
        ) from exc
    except _store_errors() as exc:
        detail = str(exc)
        if isinstance(exc, sqlite3.OperationalError) and is_busy(exc):
            # The store's retries waited for another connection's write lock: say how long.
            waited = time.monotonic() - began
            detail += f" (another connection still held the write lock after {waited:.1f} s)"
        raise UsageError(f"{_shown(args.db)}: cannot {what}: {detail}") from exc
    finally:
        deadline.finish()  # ends its timer, if a statement was to be cancelled at it


# --- enqueue ----------------------------------------------------------------------------------


def _read_payload(args: argparse.Namespace) -> tuple[str, str]:
    """(the payload's JSON text, where it came from)."""
    if args.payload is not None and args.payload_file is not None:
        raise UsageError("give the payload as JSON_PAYLOAD or --payload-file, not both")
    if args.payload_file is not None:
        where = f"--payload-file {args.payload_file}"
        try:
            with open(args.payload_file, "rb") as file:
                data = file.read(_MAX_PAYLOAD_INPUT + 1)
        except OSError as exc:
            raise UsageError(f"cannot read {where}: {exc.strerror or exc}") from exc
    elif args.payload == "-":
        where = "stdin"
        if sys.stdin is None:  # closed at start-up (<&-)
            raise UsageError("cannot read the payload from stdin: standard input is closed")
        stream = getattr(sys.stdin, "buffer", None)
        try:
            data = (
                stream.read(_MAX_PAYLOAD_INPUT + 1)
                if stream is not None
                else sys.stdin.read(_MAX_PAYLOAD_INPUT + 1).encode()
            )
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read the payload from stdin: {exc}") from exc
    elif args.payload is None:
        return "null", "the command line"
    else:
        # An argument that is not UTF-8 arrives as surrogate escapes (PEP 383): its bytes
        # are refused as the same bytes from stdin or a file are, not stored escaped.
        where, data = "the command line", os.fsencode(args.payload)
    if len(data) > _MAX_PAYLOAD_INPUT:
        raise UsageError(f"the payload from {where} is over {_MAX_PAYLOAD_INPUT} bytes")
    try:
        return data.decode("utf-8"), where
    except UnicodeDecodeError as exc:
        raise UsageError(f"the payload from {where} is not UTF-8 text: {exc}") from exc


def _parse_payload(text: str, where: str) -> JsonValue:
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError) as exc:
        shown = text if len(text) <= 40 else text[:37] + "..."
        detail = exc if isinstance(exc, ValueError) else "nested too deeply"
        raise UsageError(f"invalid JSON payload {shown!r} from {where}: {detail}") from exc
    try:
        encode_payload(payload)  # NaN, or over the limit: refuse before opening the file
    except (TypeError, ValueError) as exc:
        raise UsageError(f"payload from {where}: {exc}") from exc
    return payload


def _task_defaults(spec: str, name: str) -> dict[str, Any]:
    """The enqueue options the task ``name`` of registry ``spec`` sets; a warning if unknown."""
    registry = _load_registry(spec)
    task = registry.get(name)
    if task is None:
        _warn(
            f"task {name!r} is not in {spec} (registered: "
            f"{', '.join(sorted(registry)) or 'none'}); enqueued anyway"
        )
        return {}
    options: dict[str, Any] = {"max_attempts": task.max_attempts}
    if task.timeout is not None:
        options["timeout"] = task.timeout
    return options


def _enqueue(args: argparse.Namespace) -> int:
    payload = _parse_payload(*_read_payload(args))
    options = {} if args.tasks is None else _task_defaults(args.tasks, args.task)
    if args.max_attempts is not None:
        options["max_attempts"] = args.max_attempts
    if args.timeout is not None:
        options["timeout"] = args.timeout
    job_id = _with_store(
        args,
        lambda store: store.enqueue(args.task, payload, delay=args.delay, **options),
        what="enqueue",
    )
    # The contract: enqueue prints the id. The job is written whether or not it arrives.
    _confirm(str(job_id), done=f"job {job_id} was enqueued, but its id could not be printed")
    return EXIT_OK


# --- reading the queue ------------------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    counts = _with_store(args, lambda store: store.counts(), what="count the jobs")
    ordered = {state.value: counts.get(state.value, 0) for state in JobState}
    if args.json:
        _out(json.dumps(ordered))
    else:
        for state, count in ordered.items():
            _out(f"{state:<9} {count}")
    return EXIT_OK


def _printable(text: object) -> str:
    """``text`` without control characters (a hostile task name cannot move the cursor)."""
    value = str(text)
    if value.isprintable():
        return value
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in value)


def _iso(seconds: float) -> str:
    """Seconds since the epoch as ISO 8601 UTC, milliseconds; the raw number if out of range."""
    try:
        moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    except (OverflowError, ValueError, OSError):
        return f"{seconds:g}"
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _span(seconds: float) -> str:
    """A duration for a human: 3.2 s, 12.5 min, 3.1 h, 4.2 days."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _when(seconds: float | None, now: float) -> str:
    """ISO 8601 UTC and how far from the store's now: "... (in 3.2 s)" or "(4.0 s ago)"."""
    if seconds is None:
        return "-"
    delta = seconds - now
    relative = (
        "now"
        if abs(delta) < 0.05
        else (f"in {_span(delta)}" if delta > 0 else f"{_span(-delta)} ago")
    )
    return f"{_iso(seconds)} ({relative})"


def _job_json(job: Job) -> dict[str, Any]:
    fields = dataclasses.asdict(job)
    fields["state"] = job.state.value
    fields["fencing_token"] = job.lease_owner
    return fields


def _show(args: argparse.Namespace) -> int:
    def read(store: Store) -> tuple[Job | None, float]:
        return store.get(args.id), store.clock()

    job, now = _with_store(args, read, what="read the job")
    if job is None:
        raise UsageError(f"no job {args.id}")
    if args.json:
        _out(json.dumps(_job_json(job)))
        return EXIT_OK
    timeout = "none" if job.timeout is None else f"{job.timeout:g} s per attempt"
    rows = [
        ("task", _printable(job.task)),
        ("state", job.state.value),
        ("attempts", f"{job.attempts} of {job.max_attempts}"),
        ("run at", _when(job.run_at, now)),
        ("created", _when(job.created_at, now)),
        ("updated", _when(job.updated_at, now)),
        ("lease owner", _printable(job.lease_owner) if job.lease_owner else "-"),
        ("lease until", _when(job.lease_until, now)),
        (
            "fencing token",
            "the lease owner (only that claim may settle the job)" if job.lease_owner else "-",
        ),
        ("timeout", timeout),
        ("cancel requested", "yes" if job.cancel_requested else "no"),
        ("last error", _printable(job.last_error) if job.last_error else "-"),
        ("payload", _printable(json.dumps(job.payload))),
        ("result", _printable(json.dumps(job.result))),
    ]
    _out(f"job {job.id}")
    for name, value in rows:
        _out(f"  {name:<17}{value}")
    return EXIT_OK


def _shorten(text: str | None, width: int) -> str:
    if not text:
        return "-"
    flat = " ".join(_printable(text).split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def _list(args: argparse.Namespace) -> int:
    def read(store: Store) -> tuple[list[Job], float]:
        return store.list_jobs(state=args.state, task=args.task, limit=args.limit), store.clock()

    jobs, now = _with_store(args, read, what="list the jobs")
    if args.json:
        _out(json.dumps([_job_json(job) for job in jobs]))
        return EXIT_OK
    rows = [
        (
            str(job.id),
            job.state.value,
            _shorten(job.task, 30),
            f"{job.attempts}/{job.max_attempts}",
            _when(job.run_at, now),
            _shorten(job.last_error, _SHOWN_ERROR),
        )
        for job in jobs
    ]
    _table(("ID", "STATE", "TASK", "ATTEMPTS", "RUN AT", "LAST ERROR"), rows, right=(0,))
    return EXIT_OK


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> None:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        cells = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    _out(line(header))
    for row in rows:
        _out(line(row))


def _workers(args: argparse.Namespace) -> int:
    def read(store: Store) -> tuple[list[WorkerRecord], float]:
        return store.workers(), store.clock()

    records, now = _with_store(args, read, what="list the workers")
    if args.json:
        _out(json.dumps([dataclasses.asdict(record) for record in records]))
        return EXIT_OK
    if not records:
        _out("no live workers")
        return EXIT_OK
    rows = [
        (
            _printable(r.id),
            _printable(r.host),
            str(r.pid),
            r.state.upper(),
            _when(r.started_at, now),
            _when(r.last_seen, now),
            str(r.jobs_held),
        )
        for r in records
    ]
    _table(("WORKER", "HOST", "PID", "STATE", "STARTED", "LAST SEEN", "JOBS"), rows, right=(2, 6))
    return EXIT_OK


# --- changing jobs ----------------------------------------------------------------------------


def _requeue(args: argparse.Namespace) -> int:
    if args.failed == (args.id is not None):
        raise UsageError("requeue takes a job ID or --failed, exactly one of them")
    if args.task is not None and not args.failed:
        raise UsageError("--task goes with --failed")
    if args.failed:
        ids = _with_store(
            args, lambda store: store.requeue_failed(task=args.task), what="requeue jobs"
        )
        _confirm(
            f"requeued {len(ids)} job(s){': ' + ' '.join(map(str, ids)) if ids else ''}",
            done=f"{len(ids)} job(s) were requeued, but their ids could not be printed",
        )
        return EXIT_OK

    def one(store: Store) -> tuple[bool, Job | None]:
        if store.requeue(args.id):
            return True, None
        return False, store.get(args.id)

    done, job = _with_store(args, one, what="requeue the job")
    if done:
        _confirm(
            f"job {args.id} requeued: queued, due now, attempts reset (its last error kept)",
            done=f"job {args.id} was requeued, but this could not be printed",
        )
        return EXIT_OK
    if job is None:
        raise UsageError(f"no job {args.id}")
    raise UsageError(
        f"job {args.id} is {job.state.value}, not failed: only a failed job is requeued"
    )


def _cancel(args: argparse.Namespace) -> int:
    def cancel(store: Store) -> tuple[CancelResult, Job | None]:
        result = store.cancel(args.id)
        return result, (store.get(args.id) if result is CancelResult.FINISHED else None)

    result, job = _with_store(args, cancel, what="cancel the job")
    if result is CancelResult.CANCELLED:
        _confirm(
            f"job {args.id} cancelled: it was queued and will never run",
            done=f"job {args.id} was cancelled, but this could not be printed",
        )
        return EXIT_OK
    if result is CancelResult.REQUESTED:
        _confirm(
            f"job {args.id} is running: cancel requested; its worker's next heartbeat picks "
            "it up (show it to see how it ended)",
            done=f"job {args.id}'s cancel was requested, but this could not be printed",
        )
        return EXIT_OK
    if result is CancelResult.FINISHED:
        state = job.state.value if job is not None else "finished"
        raise UsageError(f"job {args.id} already ended ({state}): nothing to cancel")
    raise UsageError(f"no job {args.id}")


def _purge(args: argparse.Namespace) -> int:
    states = frozenset(args.state) if args.state else FINISHED_STATES

    def purge(store: Store) -> int:
        cutoff = None if args.older_than is None else store.clock() - args.older_than
        return store.purge(older_than=cutoff, states=states)

    count = _with_store(args, purge, what="purge jobs")
    _confirm(
        f"purged {count} job(s)",
        done=f"{count} job(s) were purged, but their count could not be printed",
    )
    return EXIT_OK


# --- the worker -------------------------------------------------------------------------------


def _load_registry(spec: str) -> TaskRegistry:
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise UsageError(f"--tasks must be MODULE:ATTRIBUTE, got {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # "importable from the current directory"
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise UsageError(
            f"cannot import tasks module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    try:
        registry = getattr(module, attribute)
    except AttributeError:
        raise UsageError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(registry, TaskRegistry):
        raise UsageError(f"{spec} is a {type(registry).__name__}, not a TaskRegistry")
    return registry


def _worker(args: argparse.Namespace, guard: SignalGuard | None) -> int:
    if guard is not None:  # from __main__: its handlers stay until the process exits
        return _guarded_worker(args, guard)
    guard = SignalGuard(PROG).install()  # called as a function: put back when it returns
    try:
        return _guarded_worker(args, guard)
    finally:
        guard.hand_over()
        guard.release()


def _guarded_worker(args: argparse.Namespace, guard: SignalGuard) -> int:
    registry = _load_registry(args.tasks)
    # With stderr closed at start-up (2>&-) the logs are lost, not the work.
    handler = logging.NullHandler() if sys.stderr is None else logging.StreamHandler(sys.stderr)
    logging.basicConfig(
        handlers=[handler],
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s",
    )
    # Opening the store keeps to the stop's budget once a stop signal came: a schema that
    # another connection holds locked must not hold the start-up past --stop-timeout.
    start_up = Deadline()  # unset until then

    def stop_start_up() -> None:
        start_up.set(time.monotonic() + args.stop_timeout)

    # Any thread that dies anywhere in the process is logged and makes the status 1.
    with (
        LoggingExcepthook(chain=False) as hook,
        WorkerSignals(guard, before_start=stop_start_up) as signals,
    ):
        if signals.reason() is None:
            try:
                with bounded_by(start_up):
                    store = _open_store(args.db, create=True, watch_interval=args.watch_interval)
            except StoreTimeout as exc:
                logger.error(  # noqa: TRY400 - one line: the cause is the store's lock, not ours
                    "%s during start-up: the store did not answer within the shutdown budget "
                    "(%g s), so the worker never started; no job claimed (%s)",
                    signals.reason() or "a stop signal",
                    args.stop_timeout,
                    " ".join(str(exc).split()),
                )
                return EXIT_STORE_BLOCKED
            finally:
                start_up.finish()
            try:
                report = _run_worker(args, registry, store, signals)
                if report is not None:
                    signals.close()  # from here on a stop signal is ignored: the report decides
                    return _exit_status(report, hook_failures=len(hook.failures))
            finally:
                store.close()
        logger.warning("%s: the worker stopped before it started; no job claimed", signals.reason())
        return EXIT_OK


def _run_worker(
    args: argparse.Namespace, registry: TaskRegistry, store: Store, signals: WorkerSignals
) -> WorkerReport | None:
    """The worker's report; None if a stop signal came before it could start."""
    try:
        worker = Worker(
            store,
            registry,
            concurrency=args.concurrency,
            prefetch=args.prefetch,
            poll_interval=args.poll_interval,
            stop_timeout=args.stop_timeout,
            lease=args.lease,
            store_outage_limit=args.store_outage_limit,
            exit_when_empty=args.exit_when_empty,
            # The store's clock decides due times (the database's, on PostgreSQL).
            clock=store.clock,
        )
    except (TypeError, ValueError) as exc:  # options the worker finds inconsistent
        raise UsageError(str(exc)) from exc
    if signals.attach(worker) is not None:
        return None
    return worker.run()


def _exit_status(report: WorkerReport, *, hook_failures: int) -> int:
    """The worker's exit status, read from its report (see the module docstring)."""
    if report.still_running:
        logger.error("%s", report.summary())
        # Threads still run jobs that ignored their token; a normal exit would join
        # them forever. The stop released them (or their leases will expire).
        force_exit(EXIT_STILL_RUNNING, "shutdown budget spent with jobs still running")
    if report.store_gave_up:
        # The stop kept to its budget by giving up on a store that did not answer; a
        # thread may still be leaving a store call, so exit at once, as for status 1.
        logger.error("%s", report.summary())
        force_exit(EXIT_STORE_BLOCKED, "the store did not answer within the shutdown budget")
    if not report.terminated:
        # No handler is running, but a worker thread did not end (stuck in a store call,
        # say): the interpreter would wait for it at exit, so exit 1 at once. A claim it
        # still held keeps its lease and runs again once the lease expires.
        logger.error("%s; a worker thread did not end in time", report.summary())
        force_exit(EXIT_FAILURE, "a worker thread did not end within the shutdown budget")
    if report.failure is not None:  # the worker stopped itself: the store stayed unusable
        logger.error("%s", report.summary())
        return EXIT_FAILURE
    logger.info("%s", report.summary())
    failed = bool(report.thread_failures or hook_failures)
    return EXIT_FAILURE if failed else EXIT_OK


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "enqueue": _enqueue,
    "status": _status,
    "show": _show,
    "list": _list,
    "requeue": _requeue,
    "cancel": _cancel,
    "purge": _purge,
    "workers": _workers,
}
