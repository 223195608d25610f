"""What the command line writes, and how it fails: exit statuses, error lines, output, tables.

Every error is one line on stderr (`error`), never a traceback; standard output is
written by `out` and flushed by `flush`, and a write that fails raises `OutputLost`, which
`output_lost` turns into exit status 4 or 141 (the module docstring of
`patterns.jobqueue.cli.main` has the table). `confirm` prints the line that confirms a
change already made. `printable`, `when`, `shorten` and `table` format what the operator
commands print (`patterns.jobqueue.cli.commands`).

Docs: docs/jobqueue/operations.md
"""

from __future__ import annotations

import datetime
import errno
import os
import sys
from collections.abc import Sequence
from typing import TextIO

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_OUTPUT",
    "EXIT_STILL_RUNNING",
    "EXIT_STORE_BLOCKED",
    "EXIT_USAGE",
    "PROG",
    "OutputLost",
    "UsageError",
    "confirm",
    "error",
    "flush",
    "out",
    "output_lost",
    "printable",
    "say",
    "shorten",
    "stdout",
    "table",
    "warn",
    "when",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_STILL_RUNNING = 3
EXIT_OUTPUT = 4
EXIT_STORE_BLOCKED = 5
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for `git log | head -1`
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process ended by Ctrl-C

PROG = "python -m patterns.jobqueue"
"""The name the command line's lines begin with."""


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


# --- the lines: stderr for errors, stdout for output ----------------------------------------


def say(line: str) -> None:
    """Print ``line`` on stderr; nothing if it was closed at start-up (``2>&-``).

    The line is lost then, never the work; and never printed to stdout instead, where
    ``print(file=None)`` would send it.
    """
    if sys.stderr is not None:
        print(line, file=sys.stderr)  # noqa: T201 - the CLI's output


def error(text: str) -> None:
    """Print ``PROG: error: text`` on stderr, as one line."""
    message = " ".join(text.split())  # one line, whatever the cause said
    say(f"{PROG}: error: {message}")


def warn(text: str) -> None:
    """Print ``PROG: warning: text`` on stderr, as one line."""
    message = " ".join(text.split())
    say(f"{PROG}: warning: {message}")


def stdout() -> TextIO:
    """``sys.stdout``; `OutputLost` if standard output was closed at start-up (``>&-``).

    Python sets ``sys.stdout`` to None then, and ``print`` writes nothing, silently.
    """
    if sys.stdout is None:
        raise OutputLost(OSError(errno.EBADF, "standard output is closed"))
    return sys.stdout


def out(text: str = "") -> None:
    """Print a line of output (`~patterns.jobqueue.cli.main.main` flushes it once done)."""
    try:
        print(text, file=stdout())
    except OSError as exc:
        raise OutputLost(exc) from exc


def flush() -> None:
    """Flush standard output; `OutputLost` if that fails."""
    try:
        stdout().flush()
    except OSError as exc:
        raise OutputLost(exc) from exc


def confirm(text: str, *, done: str) -> None:
    """Print the line confirming a change already made; if it is lost, the error says ``done``."""
    try:
        out(text)
        flush()
    except OutputLost as exc:
        raise OutputLost(exc.cause, done) from exc.cause


def output_lost(exc: OutputLost) -> int:
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
        error(f"{exc.done}: {exc.cause}")
        return EXIT_OUTPUT
    if isinstance(exc.cause, BrokenPipeError):
        return EXIT_BROKEN_PIPE  # the reader has what it wanted: no line, as `git log | head`
    error(f"cannot write the output: {exc.cause}")
    return EXIT_OUTPUT


# --- formats: what the operator commands print ------------------------------------------------


def printable(text: object) -> str:
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


def when(seconds: float | None, now: float) -> str:
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


def shorten(text: str | None, width: int) -> str:
    """``text`` printable, on one line, cut to ``width`` characters with "..."; "-" if empty."""
    if not text:
        return "-"
    flat = " ".join(printable(text).split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> None:
    """Print ``header`` and ``rows`` in aligned columns; the columns in ``right`` right-aligned."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        cells = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    out(line(header))
    for row in rows:
        out(line(row))
