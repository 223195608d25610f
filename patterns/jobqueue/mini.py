"""The whole job queue in one file: the pattern modules composed, small enough to read at once.

Pattern: each pattern module keeps one job, used unchanged through its public names.

=================  ==========================================  =================================
module             names                                       its job, and where
=================  ==========================================  =================================
daemon_threads     BackgroundService                           the claimer thread: Worker._claim
daemon_threads     HousekeepingDaemon, every                   the heartbeat: _Jobs.renew
closable_queue     ClosableQueue, ShutDown, shutdown_and_drain the hand-off; request_stop shuts it
executor_shutdown  TrackingExecutor, shutdown_and_await        handler threads; stop: drain, cancel
cancellation       CancelToken                                 a child token per job: _Jobs.run
signal_handlers    install_signal_handlers                     start: 1st signal drains, 2nd forces
thread_exceptions  LoggingExcepthook                           start: a thread's death is logged
=================  ==========================================  =================================
"""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Self

from patterns.cancellation import CancelToken
from patterns.closable_queue import ClosableQueue, ShutDown, shutdown_and_drain
from patterns.daemon_threads import BackgroundService, HousekeepingDaemon, every
from patterns.executor_shutdown import TrackingExecutor, shutdown_and_await
from patterns.signal_handlers import install_signal_handlers
from patterns.thread_exceptions import LoggingExcepthook

__all__ = ["MiniJob", "MiniReport", "MiniStore", "Worker"]

logger = logging.getLogger(__name__)

# --- the store: one table in one file; every write about a claimed job is fenced -------------
_SCHEMA = """CREATE TABLE IF NOT EXISTS jobs (id INTEGER PRIMARY KEY, task TEXT NOT NULL,
    payload TEXT NOT NULL,                 -- JSON: a queue file must never be able to run code
    state TEXT NOT NULL DEFAULT 'queued',  -- queued, running, done, failed
    run_at REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, max_attempts INTEGER NOT NULL,
    lease_token TEXT, lease_until REAL,    -- the claim that holds it: its fencing token, until
    result TEXT, last_error TEXT)"""

# A job whose worker died on its last attempt ends failed instead of killing workers forever.
_EXPIRED_FOR_GOOD = """UPDATE jobs SET state = 'failed', lease_token = NULL, lease_until = NULL,
    last_error = 'its lease expired on its last attempt'
    WHERE state = 'running' AND lease_until < :now AND attempts >= max_attempts"""

# One statement, which SQLite runs atomically: two claims never take the same job.
_CLAIM = """UPDATE jobs SET state = 'running', attempts = attempts + 1,
    lease_token = :token, lease_until = :now + :lease
    WHERE id = (SELECT id FROM jobs WHERE (state = 'queued' AND run_at <= :now)
                OR (state = 'running' AND lease_until < :now) ORDER BY run_at, id LIMIT 1)
    RETURNING id, task, payload, attempts, max_attempts, lease_token"""

# Every write about a claimed job, each made only if the claim still holds the lease.
_END = "lease_token = NULL, lease_until = NULL"
_WRITES = {
    "renew": "lease_until = :now + :lease",  # the heartbeat's: the claim keeps its lease
    "done": f"state = 'done', result = :result, {_END}",
    "retry": f"state = 'queued', run_at = :now + :delay, last_error = :error, {_END}",
    "failed": f"state = 'failed', last_error = :error, {_END}",
    "release": f"state = 'queued', attempts = attempts - 1, {_END}",  # interrupted: no attempt
}


class MiniJob(NamedTuple):
    """One claimed job, a row as claimed; its ``token`` fences every write about it."""

    id: int
    task: str
    payload: str  # JSON
    attempts: int
    max_attempts: int
    token: str


class MiniStore:
    """Jobs in one SQLite table in WAL mode, shared by every process that opens the file."""

    def __init__(self, path: str | os.PathLike[str], *, lease: float = 30.0,
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.lease, self._clock = lease, clock
        self._lock = threading.Lock()  # lends the connection to one thread, for one statement
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._conn.executescript(f"PRAGMA journal_mode=WAL; {_SCHEMA}")

    def _run(self, sql: str, **params: object) -> list[Any]:
        with self._lock:  # autocommit: each statement is a transaction of its own
            return self._conn.execute(sql, params).fetchall()

    def enqueue(self, task: str, payload: Any = None, *, max_attempts: int = 3) -> int:
        """Add a job, due now, and return its id."""
        sql = "INSERT INTO jobs (task, payload, run_at, max_attempts) VALUES (:t, :p, :now, :m)"
        values = {"t": task, "p": json.dumps(payload), "now": self._clock(), "m": max_attempts}
        return int(self._run(f"{sql} RETURNING id", **values)[0][0])

    def claim(self) -> MiniJob | None:
        """Take the next due job, or one whose lease expired, under a new lease; or None."""
        now = self._clock()
        self._run(_EXPIRED_FOR_GOOD, now=now)
        rows = self._run(_CLAIM, token=os.urandom(8).hex(), now=now, lease=self.lease)
        return MiniJob(*rows[0]) if rows else None

    def write(self, job: MiniJob, change: str, **values: object) -> bool:
        """Make one of the ``_WRITES`` to ``job``'s row if its claim holds the lease, else False."""
        sql = f"UPDATE jobs SET {_WRITES[change]} WHERE id = :id AND lease_token = :token"
        values.update(id=job.id, token=job.token, now=self._clock(), lease=self.lease)
        return bool(self._run(f"{sql} RETURNING id", **values))

    def counts(self) -> dict[str, int]:
        """How many jobs are in each state."""
        rows = self._run("SELECT state, COUNT(*) FROM jobs GROUP BY state")
        return {"queued": 0, "running": 0, "done": 0, "failed": 0} | dict(rows)

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()


Handler = Callable[[Any, CancelToken], Any]  # handler(payload, token) -> a JSON result


def _unknown(payload: Any, token: CancelToken) -> Any:  # no handler: fail, never drop the job
    raise LookupError("no handler is registered for this job's task")


class _Jobs:
    """The jobs a worker holds, behind one lock; every outcome goes to the store fenced."""

    def __init__(self, store: MiniStore, tasks: dict[str, Handler], backoff: float, n: int) -> None:
        self.store, self._handlers, self._backoff = store, tasks, backoff
        self.root = CancelToken()  # every job's token is a child; cancelled to force a stop
        self.lock = threading.RLock()  # guards the fields below; never held during a call
        self.slots = threading.Semaphore(n)  # free handler threads (n); the claimer waits for one
        self.stopping = threading.Event()  # the gate: set by request_stop, then no job starts
        self.running: dict[int, tuple[MiniJob, CancelToken]] = {}
        self.released: list[int] = []

    def run(self, job: MiniJob) -> None:
        """Run one job under its own token if the gate is open, else give it back unrun."""
        token = self.root.child()
        with self.lock:
            if started := not self.stopping.is_set():
                self.running[job.id] = (job, token)
        try:
            if started:
                self._call(job, token, self._handlers.get(job.task, _unknown))
            else:
                self.settle(job, "release")
        except Exception:  # a store error, a result that is not JSON: its lease will expire
            logger.exception("job %d: its outcome could not be recorded", job.id)
        finally:
            with self.lock:
                self.running.pop(job.id, None)
            self.slots.release()  # its handler thread is free: the claimer may claim again

    def _call(self, job: MiniJob, token: CancelToken, handler: Handler) -> None:
        """Call the handler and record its outcome; the store refuses it if the lease is lost."""
        try:
            result = handler(json.loads(job.payload), token)
        except BaseException as exc:  # noqa: BLE001 - every handler error is its job's outcome
            if token.cancelled:  # interrupted, not failed: back to the queue as it was
                self.settle(job, "release")
            elif handler is _unknown or job.attempts >= job.max_attempts:
                self.settle(job, "failed", error=repr(exc))
            else:
                delay = self._backoff * 2 ** (job.attempts - 1)
                self.settle(job, "retry", error=repr(exc), delay=delay)
            return
        self.settle(job, "done", result=json.dumps(result))

    def settle(self, job: MiniJob, outcome: str, **values: object) -> None:
        """Record ``outcome`` (``"release"``: back to the queue, attempt given back)."""
        if not self.store.write(job, outcome, **values):  # the fence: another claim holds it
            logger.warning("job %d: %s refused: its lease was taken over", job.id, outcome)
        elif outcome == "release":
            with self.lock:
                self.released.append(job.id)

    def renew(self) -> None:
        """The heartbeat's beat: renew each running job's lease; cancel one whose lease is lost."""
        for job, token in list(self.running.values()):  # one C-level copy: no lock needed
            if not self.store.write(job, "renew"):  # another claim took it: stop the handler
                token.cancel("lease lost")


# --- the worker: the threads, and a stop on a deadline ----------------------------------------


def _seconds(value: object, name: str) -> float:
    """``value`` as seconds >= 0 (inf: as long as it takes), else `ValueError` naming it."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return float(value)


@dataclass(frozen=True)
class MiniReport:
    """What `Worker.stop` did: the lifecycle contract's two fields first, then the jobs."""

    terminated: bool
    still_running: tuple[str, ...]  # "job 7" for each handler past the deadline, then threads
    still_running_ids: tuple[int, ...]  # those jobs: released all the same, the fence refuses
    released: tuple[int, ...]  # every job it gave back to the queue, attempt unchanged

    def __post_init__(self) -> None:
        if self.terminated and self.still_running:
            raise ValueError(f"terminated=True with still_running={self.still_running!r}")


class Worker:
    """Runs a `MiniStore`'s jobs with ``handlers[task](payload, token)`` on threads."""

    def __init__(self, store: MiniStore, handlers: Mapping[str, Handler], *, concurrency: int = 2,
                 poll_interval: float = 0.5, stop_timeout: float = 10.0, backoff: float = 1.0,
                 exit_when_empty: bool = False,
                 install_signal_handlers: bool = False) -> None:  # fmt: skip
        self.store, self._concurrency = store, concurrency
        self._jobs = _Jobs(store, dict(handlers), backoff, concurrency)
        self.stop_timeout = budget = _seconds(stop_timeout, "stop_timeout")
        self._poll = min(_seconds(poll_interval, "poll_interval"), threading.TIMEOUT_MAX)
        self._exit_when_empty, self._own_process = exit_when_empty, install_signal_handlers
        self.name = name = f"mini-{os.getpid()}-{id(self):x}"
        self._stop_requested = self._jobs.stopping  # the gate: set by request_stop, once
        self._handoff: ClosableQueue[MiniJob] = ClosableQueue()
        self._claimer = BackgroundService(self._claim, name=f"{name}-claim", stop_timeout=budget)
        self._pool = TrackingExecutor(concurrency, f"{name}-handler", stop_timeout=budget)
        beat = every(store.lease / 3, self._jobs.renew)  # a third of the lease: two beats may fail
        self._heartbeat = HousekeepingDaemon(beat, name=f"{name}-heartbeat")
        self._undo: list[Callable[[], object]] = []  # puts back the process-wide hooks
        self._started = False  # set by the first start(), under the jobs' lock
        self._stop_lock = threading.Lock()  # held by the stop that runs; others wait, bounded
        self._report: MiniReport | None = None

    def start(self) -> Self:
        """Start the heartbeat, the handler threads and the claimer, or none of them."""
        with self._jobs.lock:
            if self._started or self._stop_requested.is_set():
                raise RuntimeError(f"{self.name} runs once: make a new worker")
            self._started = True
        try:
            if self._own_process:  # the process's signals and thread deaths are ours
                self._undo.append(LoggingExcepthook().install().restore)
                self._undo.append(install_signal_handlers(self.request_stop).stop)
            self._heartbeat.start()
            self._pool.start()
            for _ in range(self._concurrency):
                self._pool.submit(self._consume)
            if len(self._pool.worker_threads()) < self._concurrency:  # the pool would just log it
                raise RuntimeError("a handler thread did not start")  # noqa: TRY301
            self._claimer.start()
        except BaseException:
            self.stop()  # what started is stopped, and the caller gets the error
            raise
        return self

    def request_stop(self) -> None:
        """Claim and start nothing more; claims no thread has taken go back, never run."""
        with self._jobs.lock:  # no job starts after this: _Jobs.run reads it under the lock
            self._stop_requested.set()
        self._jobs.slots.release(self._concurrency)  # wakes the claimer if it waits for a slot
        for job in shutdown_and_drain(self._handoff):
            self._jobs.settle(job, "release")

    def _claim(self, stopping: threading.Event) -> None:
        """The claimer thread: when a handler thread is free, claim a job and hand it over."""
        while self._jobs.slots.acquire() and not self._stop_requested.is_set():
            try:
                job = self.store.claim()
                if job is None and self._exit_when_empty and self._empty():
                    self.request_stop()
            except sqlite3.Error:  # a busy or broken file: logged, and tried again
                logger.exception("%s: claim failed", self.name)
                job = None
            if job is None:  # nothing due: wait a poll interval (a stop ends the wait)
                self._jobs.slots.release()
                self._stop_requested.wait(self._poll)
                continue
            try:
                self._handoff.put(job)
            except ShutDown:  # the stop shut the hand-off while we claimed: never run it
                self._jobs.settle(job, "release")

    def _empty(self) -> bool:
        return sum(n for s, n in self.store.counts().items() if s in ("queued", "running")) == 0

    def _consume(self) -> None:
        """A handler thread: run claims until the hand-off is shut and empty."""
        while True:
            try:
                job = self._handoff.get()
            except ShutDown:
                return
            self._jobs.run(job)

    def stop(self, timeout: float | None = None) -> MiniReport:
        """Drain, then cancel, within ``timeout`` (None: ``stop_timeout``); say what was left."""
        budget = self.stop_timeout if timeout is None else _seconds(timeout, "timeout")
        if (me := threading.current_thread()) in self._pool.worker_threads():
            self.request_stop()  # a handler cannot wait for itself: this is a request
            return self._report_now((me.name,))
        if not self._stop_lock.acquire(timeout=min(budget, threading.TIMEOUT_MAX)):
            return self._report_now(tuple(self._pool.still_running()))  # provisional
        try:  # the first stop runs the script; the later ones return its report
            self._report = self._report or self._shut_down(budget)
            return self._report
        finally:
            self._stop_lock.release()

    def _shut_down(self, budget: float) -> MiniReport:
        """The stop: shut the gate, drain, cancel, release what outlived the budget, report."""
        deadline = time.monotonic() + budget
        self.request_stop()
        drain, force = (budget, budget) if math.isinf(budget) else (budget * 0.75, budget / 4)
        cancel = self._jobs.root.cancel
        pool = shutdown_and_await(self._pool, drain, force_timeout=force, on_force=cancel)
        claimer = self._claimer.stop(max(0.0, deadline - time.monotonic()))
        with self._jobs.lock:
            left = [job for job, _ in self._jobs.running.values()]
        for job in left:  # their handlers ignored the token: the fence refuses them later
            self._jobs.settle(job, "release")
        self._heartbeat.stop(max(0.0, deadline - time.monotonic()))  # last: leases held till now
        for undo in reversed(self._undo):
            undo()
        return self._report_now(pool.still_running + claimer.still_running)

    def _report_now(self, threads: tuple[str, ...]) -> MiniReport:
        with self._jobs.lock:
            ids, released = tuple(self._jobs.running), tuple(self._jobs.released)
            names = (*(f"job {i}" for i in ids), *threads)
        return MiniReport(not names, names, ids, released)

    def run(self) -> MiniReport:
        """Start, wait until a stop is requested (a signal, an empty queue...), then stop."""
        with self:
            self._stop_requested.wait()
        return self.stop()

    def __enter__(self) -> Self:
        return self if self._started else self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
