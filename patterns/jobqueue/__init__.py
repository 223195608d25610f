"""A small durable job queue built from the pattern modules (see docs/jobqueue).

The names most programs need, re-exported from the submodules that define them::

    from patterns.jobqueue import SQLiteStore, TaskRegistry, Worker

    tasks = TaskRegistry()

    @tasks.task(max_attempts=5)
    def send_mail(payload, ctx): ...

    with Worker(SQLiteStore("jobs.sqlite3"), tasks) as worker:
        worker.enqueue("send_mail", {"to": "ada@example.com"})
        ...
"""

from patterns.jobqueue.memory import MemoryStore
from patterns.jobqueue.sqlite import SQLiteStore
from patterns.jobqueue.store import Claim, Job, JobState, Store
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
from patterns.jobqueue.worker import Outcome, Worker, WorkerReport, WorkerState, WorkerStats

__all__ = [
    "Backoff",
    "Claim",
    "Fail",
    "Interrupted",
    "Job",
    "JobContext",
    "JobState",
    "MemoryStore",
    "Outcome",
    "Phase",
    "PhaseError",
    "Retry",
    "SQLiteStore",
    "Store",
    "Task",
    "TaskRegistry",
    "Worker",
    "WorkerReport",
    "WorkerState",
    "WorkerStats",
]
