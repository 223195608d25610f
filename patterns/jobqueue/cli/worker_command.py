"""The ``worker`` command: a worker in a process of its own, its signals, its exit status.

`run_worker_command` loads the ``--tasks`` registry (`load_registry`), opens the store
(within the stop's budget once a stop signal has come), runs a
`~patterns.jobqueue.worker.worker.Worker` under
`~patterns.jobqueue.cli.worker_signals.WorkerSignals` and
`~patterns.thread_exceptions.LoggingExcepthook`, and turns the worker's report into the
exit status the module docstring of `patterns.jobqueue.cli.main` lists. A job still
running past the budget, a store that did not answer, or a worker thread that did not end
leave through `~patterns.exit_hooks.force_exit`, because the interpreter would wait for
their threads forever.

Docs: docs/jobqueue/operations.md, docs/jobqueue/composition.md
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import time

from patterns.exit_hooks import force_exit
from patterns.jobqueue.cli.output import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_STILL_RUNNING,
    EXIT_STORE_BLOCKED,
    PROG,
    UsageError,
)
from patterns.jobqueue.cli.signal_guard import SignalGuard
from patterns.jobqueue.cli.store_access import open_store
from patterns.jobqueue.cli.worker_signals import WorkerSignals
from patterns.jobqueue.stores.deadline import Deadline, StoreTimeout, bounded_by
from patterns.jobqueue.stores.protocol import Store
from patterns.jobqueue.tasks import TaskRegistry
from patterns.jobqueue.worker.worker import Worker, WorkerReport
from patterns.thread_exceptions import LoggingExcepthook

__all__ = ["load_registry", "run_worker_command"]

logger = logging.getLogger(__name__)


def load_registry(spec: str) -> TaskRegistry:
    """The registry named by ``--tasks MODULE:ATTRIBUTE``.

    Raises `~patterns.jobqueue.cli.output.UsageError` if it cannot be imported or is not a
    `~patterns.jobqueue.tasks.TaskRegistry`.

    The module's name comes from the operator's command line, never from the queue:
    ``tests/jobqueue/test_hostile_file.py`` allows this dynamic import by its function.
    """
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


def run_worker_command(args: argparse.Namespace, guard: SignalGuard | None) -> int:
    """Run the ``worker`` command until a signal (or an empty queue) stops it: its exit status.

    ``guard``: the handlers ``__main__`` installed, kept until the process exits; without
    one (called as a function) a guard is installed here and put back when it returns.
    """
    if guard is not None:  # from __main__: its handlers stay until the process exits
        return _guarded_worker(args, guard)
    guard = SignalGuard(PROG).install()  # called as a function: put back when it returns
    try:
        return _guarded_worker(args, guard)
    finally:
        guard.hand_over()
        guard.release()


def _guarded_worker(args: argparse.Namespace, guard: SignalGuard) -> int:
    registry = load_registry(args.tasks)
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
                    store = open_store(args.db, create=True, watch_interval=args.watch_interval)
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
    """The worker's exit status, read from its report (see `patterns.jobqueue.cli.main`)."""
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
