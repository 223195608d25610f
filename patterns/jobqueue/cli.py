"""``python -m patterns.jobqueue``: the job queue's command line, a contract tools can rely on.

Usage::

    python -m patterns.jobqueue --db PATH enqueue TASK [JSON_PAYLOAD] [--delay S] [--max-attempts N]
    python -m patterns.jobqueue --db PATH worker --tasks MODULE:ATTRIBUTE [--concurrency N]
        [--stop-timeout S] [--poll-interval S] [--lease S] [--exit-when-empty]
    python -m patterns.jobqueue --db PATH status [--json]
    python -m patterns.jobqueue demo

``enqueue`` prints the new job's id. ``status`` prints the number of jobs in each state
(``--json``: an object with the keys ``queued``, ``running``, ``done`` and ``failed``).
``worker`` runs a ``Worker`` on the SQLite file with the handlers of the ``TaskRegistry``
named by ``MODULE:ATTRIBUTE`` (importable from the current directory or ``PYTHONPATH``),
logging to stderr. The first SIGTERM or SIGINT starts the graceful stop (DRAINING, then
CANCELLING, within ``--stop-timeout``); a second one exits at once. ``demo`` runs a
self-contained walkthrough on a temporary database.

``--db`` may also be a ``postgresql://`` URL: the queue then lives in that database's
``jobqueue`` schema (``PostgresStore``), workers on several machines can share it, and an
unreachable server at start-up is exit status 2.

Exit status of ``worker``:

====== =================================================================================
0      stopped cleanly: nothing left running (``--exit-when-empty``, or a signal)
1      stopped, but a worker thread (or any thread) died with an exception
2      bad command-line input, an unimportable ``--tasks``, or a file that is not a store
3      the shutdown budget ran out with jobs still running: they keep their lease (and run
       again once it expires); the process exits at once with `os._exit`, because the
       interpreter would otherwise wait for their non-daemon threads forever
130    a second SIGINT forced the exit (128 + 2), or a SIGINT came before the worker's
       handlers were installed or after they were put back (during start-up, say): what
       had started was stopped, and one line says "interrupted"
143    a second SIGTERM forced the exit (128 + 15)
====== =================================================================================

This module and the demo print: they are the user interface. The library logs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import math
import os
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import NoReturn, TextIO

from patterns.exit_hooks import force_exit
from patterns.jobqueue.demo_tasks import tasks as demo_tasks
from patterns.jobqueue.postgres import (
    PostgresStore,
    StoreSchemaError,
    StoreUnavailable,
    is_postgres_url,
)
from patterns.jobqueue.sqlite import SQLiteStore, StoreFileError
from patterns.jobqueue.store import JobState, Store, encode_payload
from patterns.jobqueue.tasks import TaskRegistry
from patterns.jobqueue.worker import Worker, WorkerReport
from patterns.thread_exceptions import LoggingExcepthook

__all__ = [
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_STILL_RUNNING",
    "EXIT_USAGE",
    "main",
]

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_STILL_RUNNING = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process ended by Ctrl-C

PROG = "python -m patterns.jobqueue"


class UsageError(Exception):
    """Bad command-line input; reported as one line on stderr, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """An `argparse.ArgumentParser` whose errors are one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        """Raise ``UsageError`` instead of printing the whole usage text."""
        raise UsageError(message)


def _number(kind: str, *, minimum: float, inclusive: bool) -> type[float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
            bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
            raise argparse.ArgumentTypeError(f"{kind} must be {bound}, got {text}")
        return value

    parse.__name__ = kind
    return parse  # type: ignore[return-value]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _parser() -> _Parser:
    parser = _Parser(prog=PROG, description="A durable SQLite-backed job queue.")
    parser.add_argument(
        "--db",
        metavar="PATH",
        help="the SQLite file (created on first use), or a postgresql:// URL",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    enqueue = commands.add_parser("enqueue", help="add a job; prints its id")
    enqueue.add_argument("task", metavar="TASK")
    enqueue.add_argument("payload", metavar="JSON_PAYLOAD", nargs="?", default="null")
    enqueue.add_argument("--delay", type=_number("delay", minimum=0, inclusive=True))
    enqueue.add_argument("--max-attempts", type=_positive_int)

    worker = commands.add_parser("worker", help="run a worker until signalled")
    worker.add_argument("--tasks", required=True, metavar="MODULE:ATTRIBUTE")
    worker.add_argument("--concurrency", type=_positive_int, default=4)
    worker.add_argument(
        "--stop-timeout",
        type=_number("stop-timeout", minimum=0, inclusive=True),
        default=10.0,
    )
    worker.add_argument(
        "--poll-interval", type=_number("poll-interval", minimum=0, inclusive=False), default=1.0
    )
    worker.add_argument("--lease", type=_number("lease", minimum=0, inclusive=False), default=30.0)
    worker.add_argument("--exit-when-empty", action="store_true")

    status = commands.add_parser("status", help="print the number of jobs in each state")
    status.add_argument("--json", action="store_true")

    commands.add_parser("demo", help="run the walkthrough on a temporary database")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status (see the module docstring)."""
    try:
        args = _parser().parse_args(argv)
        if args.command == "demo":
            return _demo()
        _require_db(args)
        if args.command == "enqueue":
            return _enqueue(args)
        if args.command == "status":
            return _status(args)
        return _worker(args)
    except UsageError as exc:
        message = " ".join(str(exc).split())  # one line, whatever the cause said
        print(f"{PROG}: error: {message}", file=sys.stderr)  # noqa: T201 - the CLI's output
        return EXIT_USAGE
    except KeyboardInterrupt:
        # Ctrl-C before the worker's own handlers were installed (or after they were put
        # back): whatever had started was stopped on the way out. One line, no traceback.
        print(f"{PROG}: interrupted", file=sys.stderr)  # noqa: T201 - the CLI's output
        return EXIT_INTERRUPTED


def _require_db(args: argparse.Namespace) -> None:
    if not args.db:
        raise UsageError(f"the following arguments are required: --db (for {args.command})")


def _open_store(path: str) -> SQLiteStore | PostgresStore:
    try:
        if is_postgres_url(path):
            return PostgresStore(path)
        return SQLiteStore(path)
    except (StoreFileError, StoreSchemaError, StoreUnavailable, ImportError, ValueError) as exc:
        raise UsageError(str(exc)) from exc


def _enqueue(args: argparse.Namespace) -> int:
    try:
        payload = json.loads(args.payload)
    except json.JSONDecodeError as exc:
        raise UsageError(f"invalid JSON payload {args.payload!r}: {exc}") from exc
    try:
        encode_payload(payload)  # NaN and the like: refuse before opening the file
    except TypeError as exc:
        raise UsageError(str(exc)) from exc
    store = _open_store(args.db)
    try:
        options = {} if args.max_attempts is None else {"max_attempts": args.max_attempts}
        job_id = store.enqueue(args.task, payload, delay=args.delay, **options)
    except (TypeError, ValueError, StoreFileError) as exc:  # the last: a damaged file
        raise UsageError(str(exc)) from exc
    finally:
        store.close()
    print(job_id)  # noqa: T201 - the contract: enqueue prints the id
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    store = _open_store(args.db)
    try:
        counts = store.counts()
    except StoreFileError as exc:  # a damaged file
        raise UsageError(str(exc)) from exc
    finally:
        store.close()
    ordered = {state.value: counts[state.value] for state in JobState}
    if args.json:
        print(json.dumps(ordered))  # noqa: T201 - the CLI's output
    else:
        for state, count in ordered.items():
            print(f"{state:<8} {count}")  # noqa: T201 - the CLI's output
    return EXIT_OK


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


def _worker(args: argparse.Namespace) -> int:
    registry = _load_registry(args.tasks)
    logging.basicConfig(
        stream=sys.stderr,
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s",
    )
    store = _open_store(args.db)
    try:
        return _run_worker(args, registry, store)
    finally:
        store.close()


def _run_worker(args: argparse.Namespace, registry: TaskRegistry, store: Store) -> int:
    # Any thread that dies anywhere in the process is logged and makes the status 1.
    with LoggingExcepthook(chain=False) as hook:
        worker = Worker(
            store,
            registry,
            concurrency=args.concurrency,
            poll_interval=args.poll_interval,
            stop_timeout=args.stop_timeout,
            lease=args.lease,
            install_signal_handlers=True,
            exit_when_empty=args.exit_when_empty,
            # The store's clock decides due times (the database's, on PostgreSQL): retries too.
            clock=store.clock,
        )
        report = worker.run()
        if not report.terminated:
            logger.error("%s", report.summary())
            # Threads still run jobs that ignored their token; a normal exit would join
            # them forever. Their leases make the jobs run again after they expire.
            force_exit(EXIT_STILL_RUNNING, "shutdown budget spent with jobs still running")
        logger.info("%s", report.summary())
        failed = bool(report.thread_failures or hook.failures)
    return EXIT_FAILURE if failed else EXIT_OK


# --- the demo ----------------------------------------------------------------------------------

# (task, payload, how many): claimed oldest first, so the long jobs start at once.
_DEMO_JOBS: tuple[tuple[str, dict[str, object], int], ...] = (
    ("crunch", {"steps": 40, "step": 0.1}, 2),
    ("slow", {"seconds": 0.6}, 6),
    ("fast", {}, 8),
    ("flaky", {"succeed_on": 2}, 2),
    ("doomed", {}, 1),
)
_WHAT = {
    "crunch": "4 s, cooperative: ctx.sleep(0.1) between its 40 steps",
    "slow": "0.6 s in time.sleep: ignores its token",
    "fast": "returns at once",
    "flaky": "fails on attempt 1, succeeds on attempt 2",
    "doomed": "always fails; max_attempts=3",
}
_DEMO_BUDGET = 2.0  # the first worker's shutdown budget: 1.5 s draining, 0.5 s cancelling
_DEMO_STOP_AFTER = 1.0  # seconds the first worker runs before it is stopped


class _Screen:
    """The demo's output: lines, and one live progress line redrawn in place on a terminal."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._live = out.isatty()
        # Guards the output, written by the main thread and by the logging handler
        # (from worker threads); held only while a line is written.
        self._lock = threading.Lock()
        self._progress_shown = False
        self._last_plain = 0.0

    def say(self, text: str = "") -> None:
        with self._lock:
            self._clear()
            print(text, file=self._out, flush=True)

    def progress(self, text: str) -> None:
        with self._lock:
            if self._live:
                self._out.write("\r\x1b[2K   " + text)
                self._out.flush()
                self._progress_shown = True
            elif time.monotonic() - self._last_plain >= 0.5:  # a log file: fewer lines
                self._last_plain = time.monotonic()
                print("   " + text, file=self._out, flush=True)

    def _clear(self) -> None:
        if self._progress_shown:
            self._out.write("\r\x1b[2K")
            self._progress_shown = False


class _ScreenHandler(logging.Handler):
    """Shows the worker's state transitions and warnings as demo lines."""

    def __init__(self, screen: _Screen) -> None:
        super().__init__(logging.INFO)
        self._screen = screen

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "event", None)
        if event is not None:
            self._screen.say(f"   [state] {record.getMessage().split(': ', 1)[1]}")
        elif record.levelno >= logging.WARNING or "interrupted" in record.getMessage():
            self._screen.say(f"   [log] {record.levelname.lower()}: {record.getMessage()}")


def _progress_line(store: SQLiteStore, worker: Worker, started: float) -> str:
    counts = store.counts()
    return (
        f"queued {counts['queued']:>2} | running {counts['running']} | done {counts['done']:>2}"
        f" | failed {counts['failed']} | {worker.state.value} | {time.monotonic() - started:4.1f}s"
    )


def _demo(out: TextIO = sys.stdout) -> int:
    screen = _Screen(out)
    handler = _ScreenHandler(screen)
    jobqueue_logger = logging.getLogger("patterns.jobqueue")
    jobqueue_logger.addHandler(handler)
    previous_level = jobqueue_logger.level
    jobqueue_logger.setLevel(logging.INFO)
    try:
        with tempfile.TemporaryDirectory(prefix="jobqueue-demo-") as tmp:
            return _demo_in(os.path.join(tmp, "jobs.sqlite3"), screen)
    finally:
        jobqueue_logger.removeHandler(handler)
        jobqueue_logger.setLevel(previous_level)


def _demo_in(path: str, screen: _Screen) -> int:
    say = screen.say
    say("The job queue: a durable SQLite queue, a deadline-driven stop, and a restart.")
    say(f"database: {path}")
    store = SQLiteStore(path)
    try:
        say()
        say("1. Enqueue a mix of jobs (claimed oldest first, so the long ones start at once):")
        ids: dict[int, str] = {}
        for name, payload, count in _DEMO_JOBS:
            for _ in range(count):
                ids[demo_tasks.enqueue(store, name, payload)] = name
            say(f"   {count} x {name:<7} {_WHAT[name]}")
        _stop_in_the_middle(screen, store, ids)
        _restart(screen, store)
        say()
        say("5. The tally: every job enqueued is accounted for.")
        return _tally(screen, store, ids)
    finally:
        store.close()


def _stop_in_the_middle(screen: _Screen, store: SQLiteStore, ids: dict[int, str]) -> None:
    say = screen.say
    before = {job_id: store.get(job_id) for job_id in ids}
    say()
    say(
        f"2. Start a worker: 4 threads, a {_DEMO_BUDGET:g} s shutdown budget "
        f"({_DEMO_BUDGET * 0.75:g} s draining, {_DEMO_BUDGET * 0.25:g} s cancelling)."
    )
    worker = Worker(store, demo_tasks, concurrency=4, poll_interval=0.05, stop_timeout=_DEMO_BUDGET)
    started = time.monotonic()
    worker.start()
    while time.monotonic() - started < _DEMO_STOP_AFTER:  # a demo paces itself for the reader
        screen.progress(_progress_line(store, worker, started))
        time.sleep(0.05)
    say()
    say("3. Stop in the middle, as on SIGTERM: stop claiming, let the running jobs finish,")
    say("   cancel the ones still running when the drain budget is spent.")
    report = worker.stop()
    _show_report(screen, report, ids)
    say(f"   in the database now: {_counts_text(store.counts())}")
    for job_id in report.released:
        old, new = before[job_id], store.get(job_id)
        if old is None or new is None:
            continue
        same = new.run_at == old.run_at and new.attempts == old.attempts
        say(
            f"   released job {job_id} ({ids[job_id]}): {new.state.value}, attempts "
            f"{new.attempts}, run_at {'unchanged' if same else 'CHANGED'}: interrupted, not failed"
        )


def _restart(screen: _Screen, store: SQLiteStore) -> None:
    screen.say()
    screen.say("4. Restart: a new worker on the same file finishes the rest.")
    worker = Worker(store, demo_tasks, concurrency=4, poll_interval=0.05, stop_timeout=_DEMO_BUDGET)
    started = time.monotonic()
    worker.start()
    deadline = started + 30.0
    while time.monotonic() < deadline:
        counts = store.counts()
        if counts["queued"] == 0 and counts["running"] == 0:
            break
        screen.progress(_progress_line(store, worker, started))
        time.sleep(0.05)
    worker.stop()
    stats = worker.stats()
    screen.say(
        f"   the second worker settled {stats.settled} claim(s) in "
        f"{time.monotonic() - started:.1f}s: {stats.done} done, {stats.retried} retried, "
        f"{stats.failed} failed"
    )


def _show_report(screen: _Screen, report: WorkerReport, ids: dict[int, str]) -> None:
    def named(job_ids: Sequence[int]) -> str:
        return ", ".join(f"{i} {ids[i]}" for i in job_ids) or "none"

    phases = ", ".join(f"{s.value} {t:.2f}s" for s, t in report.phases.items())
    screen.say(f"   report: terminated={report.terminated} ({phases}, total {report.elapsed:.2f}s)")
    screen.say(f"     completed during the stop: {named(report.completed)}")
    screen.say(f"     released (back in the queue, unchanged): {named(report.released)}")
    screen.say(f"     still running at the deadline: {named(report.still_running_ids)}")


def _counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{state.value} {counts[state.value]}" for state in JobState)


def _tally(screen: _Screen, store: SQLiteStore, ids: dict[int, str]) -> int:
    say = screen.say
    rows: dict[str, dict[str, int]] = {}
    last_errors: list[str] = []
    for job_id, name in ids.items():
        job = store.get(job_id)
        row = rows.setdefault(name, {"jobs": 0, "attempts": 0, **dict.fromkeys(JobState, 0)})
        row["jobs"] += 1
        if job is None:
            continue
        row[job.state] += 1
        row["attempts"] += job.attempts
        if job.state is JobState.FAILED and job.last_error:
            last_errors.append(f"job {job_id} ({name}): {job.last_error}")
    say(f"   {'task':<8} {'enqueued':>8} {'done':>5} {'failed':>6} {'queued':>6} {'attempts':>8}")
    for name, row in rows.items():
        say(
            f"   {name:<8} {row['jobs']:>8} {row[JobState.DONE]:>5} {row[JobState.FAILED]:>6}"
            f" {row[JobState.QUEUED] + row[JobState.RUNNING]:>6} {row['attempts']:>8}"
        )
    for line in last_errors:
        say(f"   {line}")
    counts = store.counts()
    total = sum(counts.values())
    settled = counts["done"] + counts["failed"]
    say(
        f"   {len(ids)} enqueued = {counts['done']} done + {counts['failed']} failed"
        f" + {counts['queued']} queued + {counts['running']} running"
    )
    if total == len(ids) == settled:
        say("   Nothing lost, nothing left behind.")
        return EXIT_OK
    say("   The tally does NOT reconcile.")
    return EXIT_FAILURE
