"""The process crash matrix: the real command line, a real database, real signals.

Each test runs ``python -m patterns.jobqueue --db DB worker --tasks crashtasks:tasks``
in child processes, once on a SQLite file in ``tmp_path`` and once on a fresh PostgreSQL
database (``--db postgresql://...``), with handlers from a module the test
writes there (`TASKS_MODULE`). Every handler is idempotent and records each run in a file
per job (``runs/<id>``, appended with ``O_APPEND``): a ``start`` line when it begins and an
``end`` line once its effect is done, each with the attempt and the process id. It also
prints the same line to stdout, which the test reads as a marker before it acts.

For each way a worker process can end (SIGTERM, SIGINT, two signals, SIGKILL, ``os._exit``
in a handler, a handler that hangs past the shutdown budget) the test checks the exit
status, the state of every job right after, and that restarted workers then finish every
job, with a job's effect repeated only where a process died between doing it and
recording it. The soak at the end kills workers with SIGKILL at random moments, round
after round; ``SOAK_ROUNDS`` sets how many rounds (3 by default, a few seconds; about
1.3 s a round) and ``SOAK_SEED`` the random choices. The long soak::

    SOAK_ROUNDS=200 .venv/bin/pytest tests/jobqueue/test_crash_matrix.py -k soak \
        -o faulthandler_timeout=0 -p no:cacheprovider

(its timeout grows with the rounds; ``faulthandler_timeout=0`` spares the stack dump that
would otherwise be printed, harmlessly, once it runs past 55 s).
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest

from patterns.jobqueue.stores.postgres.store import PostgresStore
from patterns.jobqueue.stores.protocol import Store
from patterns.jobqueue.stores.records import Job, JobState
from patterns.jobqueue.stores.sqlite.store import SQLiteStore
from tests.support import MUST_HAPPEN, child_env, elapsed, join_or_fail

NOISE = 3.0  # process start, imports and the forced exit's flush, on a shared machine
SOAK_ROUNDS = int(os.environ.get("SOAK_ROUNDS", "3"))
SOAK_SEED = int(os.environ.get("SOAK_SEED", "20261129"))

TASKS_MODULE = r'''
"""Handlers for the crash matrix: idempotent, and each run is recorded."""
import os
import time

from patterns.jobqueue.tasks import TaskRegistry

HERE = os.path.dirname(os.path.abspath(__file__))
tasks = TaskRegistry()


def record(ctx, event):
    line = f"{event} {ctx.job_id} {ctx.attempt} {os.getpid()}\n"
    path = os.path.join(HERE, "runs", str(ctx.job_id))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())  # one write with O_APPEND: lines never interleave
    finally:
        os.close(fd)
    print(line, end="", flush=True)


@tasks.task(max_attempts=100)
def work(payload, ctx):
    """Cooperative: a checkpoint while it works."""
    record(ctx, "start")
    ctx.sleep(float(payload or 0))
    record(ctx, "end")


@tasks.task(max_attempts=100)
def waits(payload, ctx):
    """Runs until the file named by the payload exists; cooperative (ctx.sleep)."""
    record(ctx, "start")
    while not os.path.exists(os.path.join(HERE, payload)):
        ctx.sleep(0.02)
    record(ctx, "end")


@tasks.task(max_attempts=100)
def stubborn(payload, ctx):
    """Ignores its token on its first run: blocks in time.sleep past any shutdown budget."""
    record(ctx, "start")
    first_run = os.path.join(HERE, "runs", f"stubborn-{ctx.job_id}")
    if not os.path.exists(first_run):
        open(first_run, "w").close()
        time.sleep(60)
    record(ctx, "end")


@tasks.task(max_attempts=100)
def exits(payload, ctx):
    """Ends its own process with os._exit(7) (on attempt 1 only, unless payload is "always")."""
    record(ctx, "start")
    if ctx.attempt == 1 or payload == "always":
        os._exit(7)
    record(ctx, "end")
'''


class Child:
    """A worker process whose output lines are read by threads and awaited by the test."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "patterns.jobqueue", *args],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        self.pid = self.proc.pid
        self.out: queue.Queue[str | None] = queue.Queue()
        self.err: list[str] = []  # the worker's log, kept whole for the checks
        self._err_lines: queue.Queue[str | None] = queue.Queue()
        # Lines read while waiting for another text, per stream. Handler threads run
        # concurrently, so markers can arrive in any order: a later expect finds them here.
        self._unmatched: dict[int, list[str]] = {id(self.out): [], id(self._err_lines): []}
        assert self.proc.stdout is not None
        assert self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self.out), name="out"),
            threading.Thread(
                target=self._pump, args=(self.proc.stderr, self._err_lines), name="err"
            ),
        ]
        for reader in self._readers:
            reader.start()

    def _pump(self, stream: IO[str], lines: queue.Queue[str | None]) -> None:
        for line in stream:
            if lines is self._err_lines:
                self.err.append(line.rstrip("\n"))
            lines.put(line.rstrip("\n"))
        lines.put(None)

    def _expect(self, lines: queue.Queue[str | None], text: str, timeout: float) -> str:
        unmatched = self._unmatched[id(lines)]
        for index, line in enumerate(unmatched):
            if text in line:
                return unmatched.pop(index)
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"no {text!r} from worker {self.pid} within {timeout:g} s; its log: {self.err}"
                ) from None
            if line is None:
                lines.put(None)
                raise AssertionError(f"worker {self.pid} ended before {text!r}: {self.err}")
            if text in line:
                return line
            unmatched.append(line)

    def expect_out(self, text: str, timeout: float = MUST_HAPPEN) -> str:
        """Wait for a stdout line (a handler's marker) containing ``text``, in any order."""
        return self._expect(self.out, text, timeout)

    def expect_log(self, text: str, timeout: float = MUST_HAPPEN) -> str:
        """Wait for a log line containing ``text``, in any order; each line matches once."""
        return self._expect(self._err_lines, text, timeout)

    def wait(self, timeout: float = MUST_HAPPEN) -> int:
        """The exit status (negative: killed by that signal), once all its output is read.

        The readers reach the end of the pipes only after the exit: joined here, ``err``
        is whole (a check of the stop's last log line right after the exit missed it
        under load).
        """
        status = self.proc.wait(timeout)
        for reader in self._readers:
            join_or_fail(reader)
        return status

    def close(self) -> None:
        """Kill the process if it is still running and join the readers."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(MUST_HAPPEN)
        for reader in self._readers:
            join_or_fail(reader)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@dataclass
class Queue:
    """The database, the handlers' run records and every worker started on them."""

    root: Path
    pg_url: str | None = None  # a PostgreSQL database instead of the SQLite file
    children: list[Child] = field(default_factory=list)
    killed: set[int] = field(default_factory=set)  # pids that died without cleaning up

    @property
    def db(self) -> str:
        """What ``--db`` is given: the SQLite file (relative to the workers' cwd) or a URL."""
        return self.pg_url or "q.db"

    def open_store(self) -> Store:
        """A store on the same database as the workers, for the test's own reads and writes."""
        if self.pg_url is not None:
            return PostgresStore(self.pg_url)
        return SQLiteStore(self.root / "q.db")

    def enqueue(self, *jobs: tuple[str, object], max_attempts: int | None = None) -> list[int]:
        """Add jobs (task, payload) in one transaction, as a producer would."""
        store = self.open_store()
        extra = {} if max_attempts is None else {"max_attempts": max_attempts}
        try:
            return store.enqueue_many([{"task": t, "payload": p, **extra} for t, p in jobs])
        finally:
            store.close()

    def worker(
        self,
        *,
        concurrency: int = 1,
        lease: float = 1.0,
        stop_timeout: float = 10.0,
        exit_when_empty: bool = False,
        prefetch: int | None = None,
    ) -> Child:
        """Start ``python -m patterns.jobqueue ... worker`` on the queue.

        ``prefetch`` None: no ``--prefetch``, so the default (as many as ``concurrency``).
        """
        args = [
            "--db",
            self.db,
            "worker",
            "--tasks",
            "crashtasks:tasks",
            "--poll-interval",
            "0.05",
            "--concurrency",
            str(concurrency),
            "--lease",
            str(lease),
            "--stop-timeout",
            str(stop_timeout),
        ]
        if exit_when_empty:
            args.append("--exit-when-empty")
        if prefetch is not None:
            args += ["--prefetch", str(prefetch)]
        child = Child(args, self.root)
        self.children.append(child)
        return child

    def drain(self, *, lease: float = 1.0, concurrency: int = 2) -> Child:
        """A restart: a worker that runs everything (after the leases expire) and exits 0."""
        child = self.worker(concurrency=concurrency, lease=lease, exit_when_empty=True)
        assert child.wait(MUST_HAPPEN * 3) == 0, child.err
        return child

    def jobs(self, ids: list[int]) -> dict[int, Job]:
        """Every job as the database has it now."""
        store = self.open_store()
        try:
            found = {job_id: store.get(job_id) for job_id in ids}
        finally:
            store.close()
        assert all(job is not None for job in found.values()), found  # none lost
        return {job_id: job for job_id, job in found.items() if job is not None}

    def states(self, ids: list[int]) -> list[tuple[JobState, int]]:
        """(state, attempts) of each job, in order."""
        jobs = self.jobs(ids)
        return [(jobs[i].state, jobs[i].attempts) for i in ids]

    def runs(self, job_id: int) -> list[tuple[str, int, int]]:
        """The job's recorded runs: (event, attempt, pid) lines in the order written."""
        path = self.root / "runs" / str(job_id)
        if not path.exists():
            return []
        lines = [line.split() for line in path.read_text().splitlines()]
        return [(event, int(attempt), int(pid)) for event, _, attempt, pid in lines]

    def ends(self, job_id: int) -> int:
        """How many times the job's effect was done."""
        return sum(1 for event, _, _ in self.runs(job_id) if event == "end")

    def release(self, name: str) -> None:
        """Create the file a ``waits`` job is waiting for."""
        (self.root / name).write_text("go\n")


@pytest.fixture(params=["sqlite", "postgres"])
def q(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Queue]:
    """A queue directory with the handlers' module; every worker killed at the end."""
    (tmp_path / "crashtasks.py").write_text(textwrap.dedent(TASKS_MODULE))
    (tmp_path / "runs").mkdir()
    pg_url = request.getfixturevalue("pg_database") if request.param == "postgres" else None
    made = Queue(tmp_path, pg_url)
    try:
        yield made
    finally:
        for child in made.children:
            child.close()


_D, _Q, _R, _F = JobState.DONE, JobState.QUEUED, JobState.RUNNING, JobState.FAILED


# --- one way to end, one test ---------------------------------------------------------------


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"]
)
def test_a_signal_drains_then_cancels_exits_0_and_a_restart_finishes_the_rest(
    q: Queue, sig: signal.Signals
) -> None:
    """One signal: the job that can finish is done, the one that cannot is released; exit 0."""
    ids = q.enqueue(("waits", "go-a"), ("waits", "go-b"), ("work", 0), ("work", 0))
    a, b, _, _ = ids
    child = q.worker(concurrency=2, stop_timeout=2.0)
    child.expect_out(f"start {a} ")
    child.expect_out(f"start {b} ")
    with elapsed() as took:
        child.proc.send_signal(sig)
        child.expect_log("RUNNING -> DRAINING")
        q.release("go-a")  # a finishes during the drain; b waits until it is cancelled
        assert child.wait(2.0 + NOISE) == 0, child.err
    assert took() < 2.0 + NOISE
    # a done; b interrupted and released (attempt given back); c and d never claimed.
    assert q.states(ids) == [(_D, 1), (_Q, 0), (_Q, 0), (_Q, 0)]
    assert any("DRAINING -> CANCELLING" in line for line in child.err)

    q.release("go-b")
    q.drain()
    assert q.states(ids) == [(_D, 1), (_D, 1), (_D, 1), (_D, 1)]
    assert [q.ends(i) for i in ids] == [1, 1, 1, 1]  # every effect exactly once
    assert [event for event, _, _ in q.runs(b)] == ["start", "start", "end"]


@pytest.mark.parametrize(
    ("first", "second", "status"),
    [
        (signal.SIGTERM, signal.SIGTERM, 143),
        (signal.SIGINT, signal.SIGINT, 130),
        (signal.SIGHUP, signal.SIGHUP, 129),
    ],
    ids=["SIGTERM-twice", "SIGINT-twice", "SIGHUP-twice"],
)
def test_a_second_signal_exits_at_once_and_the_running_job_runs_again_after_its_lease(
    q: Queue, first: signal.Signals, second: signal.Signals, status: int
) -> None:
    """Two signals: exit 128 + signal at once; the running job keeps its lease and reruns."""
    ids = q.enqueue(("waits", "go-a"), ("work", 0))
    a, _ = ids
    child = q.worker(stop_timeout=60.0, prefetch=0)  # the other job is never claimed
    child.expect_out(f"start {a} ")
    child.proc.send_signal(first)
    child.expect_log("RUNNING -> DRAINING")
    with elapsed() as took:
        child.proc.send_signal(second)
        assert child.wait(NOISE) == status
    assert took() < NOISE  # against a budget of 60 s
    q.killed.add(child.pid)
    assert q.states(ids) == [(_R, 1), (_Q, 0)]  # a still leased; the other never claimed

    q.release("go-a")
    q.drain()
    assert q.states(ids) == [(_D, 2), (_D, 1)]  # the lease expiry counted an attempt
    assert [q.ends(i) for i in ids] == [1, 1]


def test_sigkill_mid_job_leaves_it_leased_and_a_restart_runs_it_again(q: Queue) -> None:
    """SIGKILL while a job runs: exit -9, the job stays leased (never lost), then reruns once.

    Without prefetch; `test_sigkill_with_claims_prefetched_...` is the default's case.
    """
    ids = q.enqueue(("waits", "go-a"), ("work", 0), ("work", 0))
    a = ids[0]
    child = q.worker(prefetch=0)
    child.expect_out(f"start {a} ")
    child.proc.kill()
    assert child.wait() == -signal.SIGKILL
    q.killed.add(child.pid)
    assert q.states(ids) == [(_R, 1), (_Q, 0), (_Q, 0)]

    q.release("go-a")
    q.drain()
    assert q.states(ids) == [(_D, 2), (_D, 1), (_D, 1)]
    assert [q.ends(i) for i in ids] == [1, 1, 1]


def test_sigkill_with_claims_prefetched_returns_them_at_the_lease_end_and_each_runs_once_more(
    q: Queue,
) -> None:
    """SIGKILL of a worker at its defaults holding claims it never started: nothing is lost.

    Two threads and the default prefetch (eight): the first claim takes the ten oldest
    jobs in one transaction, so once the first job has started, the other eight are held,
    waiting, attempt spent. After the kill they stay leased to the dead worker (no other
    worker can take them) until the lease ends; then another worker claims and runs them,
    each exactly once, with the attempt of the lost claim counted; the eleventh job was
    not claimed by the dead worker and is run once.
    """
    ids = q.enqueue(("waits", "go-a"), ("waits", "go-b"), *[("work", 0)] * 9)
    a, b, *waiting = ids[:10]
    child = q.worker(concurrency=2, lease=1.0)
    child.expect_out(f"start {a} ")  # its claim, and with it the eight waiting, is committed
    child.expect_out(f"start {b} ")
    child.proc.kill()
    assert child.wait() == -signal.SIGKILL
    q.killed.add(child.pid)
    assert q.states(ids) == [(_R, 1)] * 10 + [(_Q, 0)]
    assert all(q.runs(job_id) == [] for job_id in waiting)  # prefetched: held, never started
    owners = {str(job.lease_owner).split(":")[0] for job in q.jobs(ids[:10]).values()}
    assert owners == {f"worker-{child.pid}-1"}  # the dead worker's: its name, then a token

    q.release("go-a")
    q.release("go-b")
    drain = q.drain(lease=1.0)
    assert q.states(ids) == [(_D, 2)] * 10 + [(_D, 1)]  # each lost lease counted an attempt
    assert [q.ends(i) for i in ids] == [1] * 11  # every effect exactly once
    for job_id in waiting:  # run once, by the restart, on the attempt after the lost one
        assert q.runs(job_id) == [("start", 2, drain.pid), ("end", 2, drain.pid)]


def test_os_exit_inside_a_handler_exits_with_its_status_and_the_job_runs_again(q: Queue) -> None:
    """A handler calling os._exit(7) ends the process with 7; a restart reruns that job."""
    ids = q.enqueue(("exits", "once"), ("work", 0))
    child = q.worker(lease=0.5, prefetch=0)  # the other job is never claimed
    assert child.wait() == 7
    q.killed.add(child.pid)
    assert q.states(ids) == [(_R, 1), (_Q, 0)]

    q.drain(lease=0.5)
    assert q.states(ids) == [(_D, 2), (_D, 1)]
    assert [q.ends(i) for i in ids] == [1, 1]


def test_a_job_that_kills_its_worker_every_time_ends_failed_instead_of_looping(q: Queue) -> None:
    """Attempts count claims, expired ones too: a poison job fails once they are spent."""
    store = q.open_store()
    try:
        poison = store.enqueue("exits", "always", max_attempts=2)
    finally:
        store.close()
    for _ in range(2):  # attempt 1, then attempt 2 after the lease expired
        child = q.worker(lease=0.5, exit_when_empty=True)
        assert child.wait(MUST_HAPPEN) == 7
        q.killed.add(child.pid)
    q.drain(lease=0.5)  # the lease expires with no attempt left: failed, not run again
    job = q.jobs([poison])[poison]
    assert (job.state, job.attempts) == (_F, 2)
    assert job.last_error is not None
    assert "lease expired after 2 attempts" in job.last_error
    assert [event for event, _, _ in q.runs(poison)] == ["start", "start"]


def test_a_handler_hanging_past_the_budget_exits_3_and_its_job_is_released_not_failed(
    q: Queue,
) -> None:
    """A job ignoring its token past the budget: exit 3 on time, released with max_attempts=1."""
    store = q.open_store()
    try:
        s = store.enqueue("stubborn", None, max_attempts=1)  # one attempt: a stop must not spend it
        other = store.enqueue("work", 0)
    finally:
        store.close()
    ids = [s, other]
    child = q.worker(stop_timeout=0.5)
    child.expect_out(f"start {s} ")
    with elapsed() as took:
        child.proc.send_signal(signal.SIGTERM)
        assert child.wait(0.5 + NOISE) == 3
    assert took() < 0.5 + NOISE
    q.killed.add(child.pid)
    assert any(f"still running [{s}] (released at the deadline [{s}]" in line for line in child.err)
    assert q.states(ids) == [(_Q, 0), (_Q, 0)]  # given back at the deadline, attempt and all

    q.drain()
    assert q.states(ids) == [(_D, 1), (_D, 1)]
    assert [q.ends(i) for i in ids] == [1, 1]


# --- a store that another connection keeps locked during the stop ----------------------------

STOP = 2.0  # the budget of the locked-store tests


@contextlib.contextmanager
def locked(q: Queue) -> Iterator[None]:
    """Another connection holds the queue's lock, as an operator's shell left mid-transaction.

    SQLite: ``BEGIN IMMEDIATE`` (the write lock). PostgreSQL: both tables in ACCESS
    EXCLUSIVE mode, so that even a read waits. Released when the block ends.
    """
    if q.pg_url is None:
        conn = sqlite3.connect(q.root / "q.db", isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            yield
            conn.execute("ROLLBACK")
        finally:
            conn.close()
        return
    import psycopg  # noqa: PLC0415 - only the PostgreSQL half needs it

    with psycopg.connect(q.pg_url) as pg:
        pg.execute("LOCK TABLE jobqueue.jobs, jobqueue.workers IN ACCESS EXCLUSIVE MODE")
        yield
        pg.rollback()


@pytest.mark.parametrize(
    ("load", "status"), [("idle", 5), ("busy", 5), ("ignores-token", 3)], ids=str
)
def test_a_store_locked_by_another_connection_cannot_hold_the_stop_past_its_budget(
    q: Queue, load: str, status: int
) -> None:
    """SIGTERM with the queue locked: exit within the budget (5, or 3 with a job still running).

    What the stop could not write (a finished job's outcome, a release) keeps its lease:
    once the lock is gone, a restart runs those jobs again and finishes every job.
    """
    jobs = {"idle": [], "busy": [("waits", "go-a"), ("waits", "go-b")], "ignores-token": []}
    ids = q.enqueue(*jobs[load]) if jobs[load] else []
    if load == "ignores-token":
        ids = q.enqueue(("stubborn", None))
    child = q.worker(concurrency=2, stop_timeout=STOP)
    child.expect_log("NEW -> RUNNING")
    for job_id in ids:
        child.expect_out(f"start {job_id} ")
    with locked(q):
        with elapsed() as took:
            child.proc.send_signal(signal.SIGTERM)
            child.expect_log("RUNNING -> DRAINING")
            if load == "busy":
                q.release("go-a")  # both finish during the drain; neither outcome is written
                q.release("go-b")
            exit_status = child.wait(STOP + NOISE)
        assert took() < STOP + NOISE, child.err
    q.killed.add(child.pid)
    assert exit_status == status, child.err
    assert any("gave up on the store at the deadline" in line for line in child.err), child.err
    assert q.states(ids) == [(_R, 1)] * len(ids)  # each keeps its lease: nothing lost

    q.drain()
    assert q.states(ids) == [(_D, 2)] * len(ids)
    # A busy job's effect was done twice: its outcome could not be written the first time.
    assert [q.ends(i) for i in ids] == [2 if load == "busy" else 1] * len(ids)


# --- the soak ------------------------------------------------------------------------------------


@dataclass
class SoakTally:
    """The numbers the soak reports."""

    rounds: int = 0
    kills: int = 0
    jobs: int = 0
    duplicates: int = 0  # jobs whose effect was done more than once
    after_expiry: int = 0  # of those, repeated by a live process once a lease had expired
    interrupted: int = 0  # runs that started and never ended (their process was killed)
    lost: int = 0  # jobs not done at the end of their round (must stay 0)

    def line(self) -> str:
        """One line for the test report."""
        return (
            f"soak: {self.rounds} rounds, {self.kills} SIGKILLs, {self.jobs} jobs, "
            f"{self.duplicates} duplicated effects ({self.after_expiry} not by a killed "
            f"process), {self.interrupted} interrupted runs, "
            f"{self.lost} lost (seed {SOAK_SEED})"
        )


def kill_at_a_random_moment(q: Queue, rng: random.Random) -> None:
    """Start a worker and SIGKILL it right after a random number of handler markers."""
    child = q.worker(concurrency=rng.randint(1, 4), lease=1.0)
    # The first marker comes after the interpreter's start, the imports and the store's
    # connection, which a loaded machine can stretch past MUST_HAPPEN: a longer hang guard.
    child.expect_out(" ", timeout=3 * MUST_HAPPEN)
    for _ in range(rng.randint(0, 7)):  # markers: a run starting or ending, in any thread
        child.expect_out(" ")
    child.proc.kill()
    assert child.wait() == -signal.SIGKILL
    q.killed.add(child.pid)


def explain_duplicates(q: Queue, job_id: int) -> bool:
    """A job's effect may repeat only where at-least-once allows it.

    Every extra ``end`` must be explained: it was done in a process that was then killed
    before the outcome was recorded, or the lease had expired and the store said so in
    the log of the process that claimed the job again. Returns True in that second case.
    """
    ends = [pid for event, _, pid in q.runs(job_id) if event == "end"]
    survivors = [pid for pid in ends if pid not in q.killed]
    if len(survivors) <= 1:
        return False  # at most one effect outside the killed processes: the one recorded
    retaken = f"job {job_id}: lease of "  # "... expired, claiming it again"
    logs = [line for child in q.children for line in child.err]
    assert any(retaken in line for line in logs), (job_id, q.runs(job_id))
    return True


@pytest.mark.timeout(60 + 5 * SOAK_ROUNDS)
def test_sigkill_at_random_moments_with_restarts_loses_no_job_soak(
    q: Queue, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    """Round after round of kill -9 at random moments: every job ends done, none lost."""
    tally = SoakTally()
    for round_number in range(SOAK_ROUNDS):
        rng = random.Random(SOAK_SEED + round_number)
        # Each kill may spend an attempt of the same job (claimed by every worker killed,
        # and again after a lease that expired under load): the default 3 attempts would
        # fail such a job as a poison job, which is the design, not a loss; 10 leave room.
        jobs_ = [("work", rng.uniform(0, 0.02)) for _ in range(rng.randint(20, 40))]
        ids = q.enqueue(*jobs_, max_attempts=10)
        for _ in range(rng.randint(1, 3)):
            kill_at_a_random_moment(q, rng)
            tally.kills += 1
        q.drain(concurrency=rng.randint(1, 4))
        jobs = q.jobs(ids)
        tally.rounds += 1
        tally.jobs += len(ids)
        tally.lost += sum(1 for job in jobs.values() if job.state is not JobState.DONE)
        for job_id in ids:
            runs = q.runs(job_id)
            ends = sum(1 for event, _, _ in runs if event == "end")
            assert ends >= 1, (job_id, runs)  # its effect happened
            tally.duplicates += ends > 1
            tally.interrupted += sum(1 for event, _, _ in runs if event == "start") - ends
            tally.after_expiry += explain_duplicates(q, job_id)
        assert tally.lost == 0, [job for job in jobs.values() if job.state is not JobState.DONE]
    with capsys.disabled():  # the numbers, on the terminal even when the test passes
        sys.stdout.write(f"\n{tally.line()}\n")
    request.node.user_properties.append(("soak", tally.line()))
    assert tally.rounds == SOAK_ROUNDS
    assert tally.lost == 0
