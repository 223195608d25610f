"""A small durable job queue built from the pattern modules (see docs/jobqueue).

The names most programs need, re-exported from the submodules that define them::

    from patterns.jobqueue import SQLiteStore, TaskRegistry, Worker

    tasks = TaskRegistry()

    @tasks.task(max_attempts=5)
    def send_mail(payload, ctx): ...

    with Worker(SQLiteStore("jobs.sqlite3"), tasks) as worker:
        worker.enqueue("send_mail", {"to": "ada@example.com"})
        ...

Each name is imported on first use (PEP 562): ``python -m patterns.jobqueue`` imports
this package before its ``__main__`` runs, and ``__main__`` must install its signal
handlers before the 0.1 s the worker's modules take to import (a SIGTERM meanwhile
would kill the process by the default action).
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the 4 ms import of typing (mypy knows it)
if TYPE_CHECKING:
    from patterns.jobqueue.stores.memory import MemoryStore
    from patterns.jobqueue.stores.postgres.store import PostgresStore
    from patterns.jobqueue.stores.protocol import OperatorStore, Store, WorkerStore
    from patterns.jobqueue.stores.records import Claim, Job, JobState
    from patterns.jobqueue.stores.sqlite.store import SQLiteStore
    from patterns.jobqueue.tasks import (
        Backoff,
        Fail,
        Interrupted,
        JobContext,
        Phase,
        PhaseError,
        Retry,
        Task,
        TaskRegistry,
    )
    from patterns.jobqueue.worker.worker import (
        Outcome,
        Worker,
        WorkerReport,
        WorkerState,
        WorkerStats,
    )

__all__ = [
    "Backoff",
    "Claim",
    "Fail",
    "Interrupted",
    "Job",
    "JobContext",
    "JobState",
    "MemoryStore",
    "OperatorStore",
    "Outcome",
    "Phase",
    "PhaseError",
    "PostgresStore",
    "Retry",
    "SQLiteStore",
    "Store",
    "Task",
    "TaskRegistry",
    "Worker",
    "WorkerReport",
    "WorkerState",
    "WorkerStats",
    "WorkerStore",
]

# Each exported name and the submodule it comes from.
_SOURCES = {
    "MemoryStore": "stores.memory",
    "PostgresStore": "stores.postgres.store",  # psycopg is needed once a store is made
    "SQLiteStore": "stores.sqlite.store",
    **dict.fromkeys(("Claim", "Job", "JobState"), "stores.records"),
    **dict.fromkeys(("OperatorStore", "Store", "WorkerStore"), "stores.protocol"),
    **dict.fromkeys(
        (
            "Backoff",
            "Fail",
            "Interrupted",
            "JobContext",
            "Phase",
            "PhaseError",
            "Retry",
            "Task",
            "TaskRegistry",
        ),
        "tasks",
    ),
    **dict.fromkeys(
        ("Outcome", "Worker", "WorkerReport", "WorkerState", "WorkerStats"), "worker.worker"
    ),
}


def __getattr__(name: str) -> object:
    """Import the submodule that defines ``name`` and keep the name here."""
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{source}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
