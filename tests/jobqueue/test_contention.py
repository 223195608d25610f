"""Contention: several worker processes and a producer on one SQLite file, and a lock hog.

Three worker processes (two handler threads each) and a producer process share one
database while the test itself now and then takes SQLite's write lock and holds it until
some process reports that it found the database busy. Every process runs the real code
with a short busy timeout (`BUSY_TIMEOUT` set to 50 ms through `LAUNCH`), so "database is
locked" does happen, often, and the store's retry with backoff is what must absorb it.

Each run of a job appends one line (job id, lease token, start, end, pid) to a shared
file. The checks: every job ran exactly once and is ``done``; no two runs of a job
overlap; every worker exits 0 on SIGTERM; the producer enqueued everything; and no busy
error ever escaped the store (no failed claim, acknowledgement or enqueue in any log).
"""

from __future__ import annotations

import itertools
import json
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
from pathlib import Path
from typing import IO

import pytest

from patterns.jobqueue.stores.sqlite.store import SQLiteStore
from tests.support import MUST_HAPPEN, child_env, join_or_fail

NOISE = 3.0
JOBS = 300
WORKERS = 3
SEED = 8

TASKS_MODULE = r'''
"""A job that takes a moment and records its run: (job, lease token, start, end, pid)."""
import os
import time

from patterns.jobqueue.tasks import TaskRegistry

HERE = os.path.dirname(os.path.abspath(__file__))
tasks = TaskRegistry()


@tasks.task
def job(payload, ctx):
    start = time.time()
    time.sleep(0.001 * (payload % 4))  # a little work, so runs in different threads overlap
    end = time.time()
    line = f"{ctx.job_id} {ctx.job.lease_owner} {start:.6f} {end:.6f} {os.getpid()}\n"
    fd = os.open(os.path.join(HERE, "runs.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
'''

# Runs the real code in a child with a 50 ms busy timeout, so that lock contention turns
# into "database is locked" errors and the store's retries, instead of silent waits.
# The backoff is stretched so that the retries outlast the test's lock hog comfortably.
LAUNCH = """
import sys
import patterns.jobqueue.stores.sqlite.store as sqlite_store
import patterns.jobqueue.stores.sqlite.transactions as sqlite_transactions
sqlite_store.BUSY_TIMEOUT = 0.05
sqlite_transactions._BACKOFF = 0.2
{body}
"""

WORKER = """
from patterns.jobqueue.cli.main import main
sys.exit(main(sys.argv[1:]))
"""

PRODUCER = """
import json, logging, random
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
store = sqlite_store.SQLiteStore(sys.argv[1])
rng = random.Random(int(sys.argv[3]))
left = int(sys.argv[2])
ids = []
while left:
    batch = min(left, rng.randint(1, 5))
    ids += store.enqueue_many([{"task": "job", "payload": rng.randint(0, 3)} for _ in range(batch)])
    left -= batch
store.close()
print(json.dumps(ids), flush=True)
"""


class Proc:
    """A child process; its stderr lines are collected and can be awaited."""

    def __init__(self, body: str, args: list[str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCH.format(body=body), *args],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self.err_lines: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None
        assert self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self.out), name="out"),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self.err), name="err"),
        ]
        for reader in self._readers:
            reader.start()

    def _pump(self, stream: IO[str], lines: list[str]) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))
            if lines is self.err:
                self.err_lines.put(line)

    def wait(self, timeout: float) -> int:
        """The exit status, once the output has been read to the end."""
        status = self.proc.wait(timeout)
        for reader in self._readers:
            join_or_fail(reader)
        return status

    def close(self) -> None:
        """Kill the process if it is still running and join the readers."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.wait(MUST_HAPPEN)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """The test's child processes, killed (if still running) at the end."""
    started: list[Proc] = []
    try:
        yield started
    finally:
        for proc in started:
            proc.close()


def wait_for_done(db: Path, count: int) -> None:
    """Poll the job counts (an observation) until ``count`` jobs are done."""
    store = SQLiteStore(db)
    try:
        deadline = time.monotonic() + MUST_HAPPEN * 3
        while store.counts()["done"] < count:
            assert time.monotonic() < deadline, store.counts()
            time.sleep(0.01)  # polling an observation, not waiting for a race
    finally:
        store.close()


def hog_the_write_lock(db: Path, workers: list[Proc]) -> None:
    """Hold SQLite's write lock until some worker reports the database busy, then let go."""
    for proc in workers:
        while not proc.err_lines.empty():
            proc.err_lines.get_nowait()
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        deadline = time.monotonic() + MUST_HAPPEN
        busy = False
        while not busy:
            assert time.monotonic() < deadline, "no worker found the database busy"
            for proc in workers:
                try:
                    busy = busy or "database busy" in proc.err_lines.get(timeout=0.005)
                except queue.Empty:
                    continue
        conn.execute("COMMIT")
    finally:
        conn.close()


def test_workers_and_a_producer_on_one_file_run_every_job_once_and_survive_busy_errors(
    tmp_path: Path, procs: list[Proc]
) -> None:
    """Many processes, one file, a lock hog: each job runs exactly once, nobody dies."""
    (tmp_path / "contend.py").write_text(textwrap.dedent(TASKS_MODULE))
    db = tmp_path / "q.db"
    SQLiteStore(db).close()  # the schema, before anyone races to create it
    workers = [
        Proc(
            WORKER,
            [
                "--db",
                str(db),
                "--log-level",
                "WARNING",
                "worker",
                "--tasks",
                "contend:tasks",
                "--concurrency",
                "2",
                "--poll-interval",
                "0.02",
                "--stop-timeout",
                "5",
            ],
            tmp_path,
        )
        for _ in range(WORKERS)
    ]
    procs.extend(workers)
    producer = Proc(PRODUCER, [str(db), str(JOBS), str(SEED)], tmp_path)
    procs.append(producer)

    rng = random.Random(SEED)
    for share in sorted(rng.sample(range(JOBS // 10, JOBS - JOBS // 10), 3)):
        wait_for_done(db, share)
        hog_the_write_lock(db, workers)
    assert producer.wait(MUST_HAPPEN * 3) == 0, producer.err
    ids = json.loads(producer.out[-1])
    assert len(ids) == len(set(ids)) == JOBS
    wait_for_done(db, JOBS)
    for proc in workers:
        proc.proc.send_signal(signal.SIGTERM)
    for proc in workers:
        assert proc.wait(5 + NOISE) == 0, proc.err

    store = SQLiteStore(db)
    try:
        assert store.counts() == {
            "queued": 0,
            "running": 0,
            "done": JOBS,
            "failed": 0,
            "cancelled": 0,
        }
    finally:
        store.close()
    runs: dict[int, list[tuple[str, float, float]]] = {}
    for line in (tmp_path / "runs.log").read_text().splitlines():
        job_id, token, start, end, _ = line.split()
        runs.setdefault(int(job_id), []).append((token, float(start), float(end)))
    assert sorted(runs) == sorted(ids)  # every job ran
    for job_id, job_runs in runs.items():
        assert len(job_runs) == 1, (job_id, job_runs)  # and exactly once
        ordered = sorted(job_runs, key=lambda run: run[1])
        for earlier, later in itertools.pairwise(ordered):
            assert earlier[2] <= later[1], (job_id, job_runs)  # never two at once

    logs = [line for proc in [*workers, producer] for line in proc.err]
    assert any("database busy" in line for line in logs)  # the retries did happen
    escaped = [line for line in logs if "failed" in line or "Traceback" in line]
    assert escaped == []  # and no busy error got past them: no failed claim, ack or enqueue
