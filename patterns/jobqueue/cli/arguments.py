"""The command line's parser: every command and option, each value checked before anything runs.

`build_parser` returns the whole command line, its commands in the order of ``--help``.
A value out of range (a negative ``--delay``, ``--concurrency 0``, a job id past what
the stores hold, an idle interval short enough to keep a CPU busy) is refused here, as
one line and exit status 2 (`~patterns.jobqueue.cli.output.UsageError`), before a store
is opened. The commands are in `patterns.jobqueue.cli.commands` and
`patterns.jobqueue.cli.worker_command`; the exit statuses in the module docstring of
`patterns.jobqueue.cli.main`.

Docs: docs/jobqueue/operations.md
"""

from __future__ import annotations

import argparse
import math
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from patterns.jobqueue.cli.output import PROG, OutputLost, UsageError, stdout
from patterns.jobqueue.cli.store_access import DB_VARIABLE, DEFAULT_WAIT
from patterns.jobqueue.stores.records import (
    FINISHED_STATES,
    MAX_ATTEMPTS_LIMIT,
    MAX_SECONDS,
    JobState,
)
from patterns.jobqueue.stores.sqlite.store import WATCH_INTERVAL
from patterns.jobqueue.stores.sqlite.watch import WATCH_IDLE_INTERVAL, WATCH_QUIET

__all__ = ["build_parser"]

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
        stream = stdout() if file is None else file
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


def build_parser() -> argparse.ArgumentParser:
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
    demo = commands.add_parser("demo", help="run the walkthrough on a temporary database")
    demo.add_argument(
        "--mini",
        action="store_true",
        help="walk through the mini job queue instead (patterns.jobqueue.mini: the whole "
        "queue in one file)",
    )
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
        f"one line, exit 2, nothing changed (default: {DEFAULT_WAIT:g}, as long as an SQLite "
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
        default=None,  # the Worker's default: four per handler thread
        help=f"claims held beyond --concurrency, waiting for a free handler thread, 0 to "
        f"{_MAX_CONCURRENCY}: a freed thread finds its next job at once, but a prefetched job "
        "holds its lease and has used an attempt before it starts, so if the process is "
        "killed it waits for its lease to expire, and no other worker can take it meanwhile "
        "(default: 4 per handler thread, 16 for --concurrency 4; 0 claims only for free "
        "threads)",
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
