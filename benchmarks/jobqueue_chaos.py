"""Chaos for the job queue: worker processes signalled, killed, paused and restarted mid-drain.

Run it with ``python -m benchmarks.jobqueue_chaos`` (``--help`` for the knobs; about two
minutes on a 2-core machine). It runs on SQLite, and on PostgreSQL too when
``PATTERNS_PG_DSN`` names a database it may use (``scripts/pg-test-cluster.sh run --``
sets one; the run drops and recreates the ``jobqueue`` schema there).

For each store, ``--jobs`` jobs are enqueued and ``--workers`` real worker processes
(``python -m patterns.jobqueue worker``) drain them while, every ``--every`` seconds, one
of these is done to a random worker that has started (logged ``-> RUNNING``):

* ``TERM``, ``INT``, ``HUP``: a graceful stop, timed from the signal to the exit;
* ``TERM twice``: a second SIGTERM 0.3 s after the first, which forces the exit;
* ``KILL``: SIGKILL, no stop at all;
* ``STOP/CONT``: the process paused for 0.3 s, then resumed;
* PostgreSQL only, ``kill backend``: ``pg_terminate_backend`` on one of the database's
  client connections.

A worker that ended is started again at once. After ``--seconds``, every worker gets a
SIGTERM, and one last worker (``--exit-when-empty``) drains what is left, including the
jobs whose leases the killed workers held.

Each job's handler works for a while (a checkpoint, then a wait blind to the token) and,
just before it returns, appends ``job attempt pid`` to an effects file: the side effect a
real handler has. The counts printed at the end:

* ``lost``: jobs that are not ``done`` at the end (the queue's promise: 0);
* ``duplicated``: jobs whose effect happened more than once. The queue runs a job at
  least once, so a worker that dies between the effect and its commit runs it again;
  a duplicate is explained when every earlier effect's process was SIGKILLed or was
  forced out (exit 3 or 5, a second signal, or a PostgreSQL commit cut off by
  ``kill backend``); ``unexplained`` lists the others, which would be a bug;
* ``stop overruns``: graceful stops whose process outlived ``--stop-timeout`` plus a
  0.5 s allowance for the interpreter's exit;
* the exit statuses seen after each kind of action, a death by a signal written as
  ``-N`` (as `subprocess` reports it): the promise is that a stop signal never kills a
  worker once it has started.

This is a measurement to read, not a test: nothing here asserts on a time.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from patterns.jobqueue import JobContext, PostgresStore, SQLiteStore, TaskRegistry
from patterns.jobqueue.stores.records import JsonValue

ROOT = Path(__file__).resolve().parent.parent
EFFECTS_ENV = "JOBQUEUE_CHAOS_EFFECTS"
EXIT_ALLOWANCE = 0.5  # seconds a stopped worker's interpreter may take to exit
FORCED = {3, 5, 128 + signal.SIGHUP, 128 + signal.SIGINT, 128 + signal.SIGTERM}
GRACEFUL = {"TERM": signal.SIGTERM, "INT": signal.SIGINT, "HUP": signal.SIGHUP}

tasks = TaskRegistry()


@tasks.task
def effect(payload: JsonValue, ctx: JobContext) -> None:
    """Work a while (a checkpoint, then a blind wait), then record the effect once."""
    assert isinstance(payload, dict)
    ctx.sleep(float(str(payload["wait"])))  # a checkpoint: a cancel interrupts it
    time.sleep(float(str(payload["block"])))  # blind to the token, like a library call
    line = f"{ctx.job_id} {ctx.attempt} {os.getpid()}\n"
    fd = os.open(os.environ[EFFECTS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one write with O_APPEND: lines never interleave
    finally:
        os.close(fd)


@dataclass
class Worker:
    """One worker process, its log, and what was done to it."""

    proc: subprocess.Popen[bytes]
    log: Path
    action: str = "none"  # the last action that can end it
    signalled: float | None = None  # when its first stop signal was sent

    def ready(self) -> bool:
        """Whether it has started (its signal handlers are installed before this line)."""
        return "-> RUNNING" in self.log.read_text(errors="replace")


@dataclass
class Tally:
    """What one store's run saw."""

    actions: collections.Counter[str] = field(default_factory=collections.Counter)
    statuses: dict[str, collections.Counter[int]] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter)
    )
    stop_seconds: list[float] = field(default_factory=list)
    forced_pids: set[int] = field(default_factory=set)  # killed, forced, or cut off
    restarts: int = 0


@dataclass
class Chaos:
    """One store's run: the workers, what is done to them, and the tally."""

    db: str
    args: argparse.Namespace
    work: Path
    rng: random.Random
    tally: Tally = field(default_factory=Tally)
    workers: list[Worker] = field(default_factory=list)
    logs: dict[Path, int] = field(default_factory=dict)  # every worker's log and its pid
    started: int = 0

    @property
    def postgres(self) -> bool:
        """Whether the store is PostgreSQL."""
        return self.db.startswith("postgresql://")

    def command(self, *, final: bool = False) -> list[str]:
        """The worker's command line."""
        cli = [sys.executable, "-m", "patterns.jobqueue", "--db", self.db]
        cli += ["worker", "--tasks", "benchmarks.jobqueue_chaos:tasks", "--lease", "3"]
        cli += ["--concurrency", "4", "--stop-timeout", str(self.args.stop_timeout)]
        return [*cli, "--exit-when-empty"] if final else cli

    def env(self) -> dict[str, str]:
        """The workers' environment: where the effects go, and this checkout on the path."""
        return {**os.environ, EFFECTS_ENV: str(self.work / "effects.txt"), "PYTHONPATH": str(ROOT)}

    def start(self) -> Worker:
        """Start one worker, its stderr in a log of its own."""
        self.started += 1
        log = self.work / f"worker-{self.started}.log"
        with log.open("wb") as err:
            proc = subprocess.Popen(
                self.command(), cwd=ROOT, env=self.env(), stdout=subprocess.DEVNULL, stderr=err
            )
        self.logs[log] = proc.pid
        return Worker(proc, log)

    def reap(self) -> None:
        """Record every worker that ended and start another in its place."""
        for i, worker in enumerate(self.workers):
            status = worker.proc.poll()
            if status is None:
                continue
            self.tally.statuses[worker.action][status] += 1
            if worker.signalled is not None and worker.action in GRACEFUL:
                self.tally.stop_seconds.append(time.monotonic() - worker.signalled)
            if status in FORCED or status < 0:
                self.tally.forced_pids.add(worker.proc.pid)
            self.workers[i] = self.start()
            self.tally.restarts += 1

    def act(self, worker: Worker, action: str) -> None:
        """Do ``action`` to ``worker`` (one being stopped already gets only a KILL)."""
        proc = worker.proc
        if worker.signalled is not None and action != "KILL":
            return
        self.tally.actions[action] += 1
        if action in GRACEFUL or action == "TERM twice":
            worker.action, worker.signalled = action, time.monotonic()
            proc.send_signal(GRACEFUL.get(action, signal.SIGTERM))
            if action == "TERM twice":
                threading.Timer(0.3, _signal_if_alive, (proc, signal.SIGTERM)).start()
        elif action == "KILL":
            worker.action = "KILL"
            proc.kill()
        elif action == "STOP/CONT":
            proc.send_signal(signal.SIGSTOP)
            threading.Timer(0.3, _signal_if_alive, (proc, signal.SIGCONT)).start()
        elif action == "kill backend":
            _kill_a_backend(self.db)

    def run(self) -> dict[str, object]:
        """Enqueue, rage for ``--seconds``, stop everything, drain the rest; the counts."""
        store = _open(self.db, fresh=True)
        ids = store.enqueue_many(_payloads(self.args.jobs, self.rng))
        store.close()
        kinds = [*GRACEFUL, "TERM twice", "KILL", "STOP/CONT"]
        kinds += ["kill backend"] if self.postgres else []
        self.workers = [self.start() for _ in range(self.args.workers)]
        began = time.monotonic()
        while time.monotonic() - began < self.args.seconds:
            time.sleep(self.args.every * self.rng.uniform(0.5, 1.5))  # the chaos's pace
            self.reap()
            ready = [w for w in self.workers if w.ready()]
            if ready:
                self.act(self.rng.choice(ready), self.rng.choice(kinds))
        deadline = time.monotonic() + 30  # a worker just restarted: let it install its handlers
        while not all(w.ready() or w.proc.poll() is not None for w in self.workers):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        for worker in self.workers:  # one stop signal each: a second would force the exit
            if worker.signalled is None:
                _signal_if_alive(worker.proc, signal.SIGTERM)
        for worker in self.workers:
            worker.proc.wait(timeout=self.args.stop_timeout + 30)
        self.reap_final()
        with (self.work / "final.log").open("wb") as err:
            final = subprocess.run(
                self.command(final=True),
                cwd=ROOT,
                env=self.env(),
                stdout=subprocess.DEVNULL,
                stderr=err,
                timeout=300,
                check=False,
            )
        store = _open(self.db)
        states = {job: getattr(store.get(job), "state", None) for job in ids}
        store.close()
        return self.counts(
            ids, {job: str(getattr(s, "value", s)) for job, s in states.items()}, final.returncode
        )

    def reap_final(self) -> None:
        """Record the last stops (nothing is restarted)."""
        for worker in self.workers:
            status = worker.proc.returncode
            self.tally.statuses["final TERM" if worker.action == "none" else worker.action][
                status
            ] += 1
            if status in FORCED or status < 0:
                self.tally.forced_pids.add(worker.proc.pid)

    def cut_off(self) -> set[int]:
        """The workers that logged a commit whose outcome was unknown (PostgreSQL)."""
        said = re.compile(r"CommitUnknown|outcome (is )?unknown|commit.{0,40}unknown", re.I)
        return {
            pid for log, pid in self.logs.items() if said.search(log.read_text(errors="replace"))
        }

    def counts(self, ids: list[int], states: dict[int, str], final: int) -> dict[str, object]:
        """The figures the run prints."""
        seen: dict[int, list[int]] = collections.defaultdict(list)  # job -> pids, in order
        effects = self.work / "effects.txt"
        for line in effects.read_text().splitlines() if effects.exists() else []:
            job, _attempt, pid = (int(x) for x in line.split())
            seen[job].append(pid)
        duplicated = {job: pids for job, pids in seen.items() if len(pids) > 1}
        forced = self.tally.forced_pids | self.cut_off()
        unexplained = [job for job, pids in duplicated.items() if not set(pids[:-1]) <= forced]
        stops = self.tally.stop_seconds
        budget = self.args.stop_timeout + EXIT_ALLOWANCE
        return {
            "jobs": len(ids),
            "lost (not done)": sum(1 for job in ids if states[job] != "done"),
            "not done, by state": dict(
                collections.Counter(states[job] for job in ids if states[job] != "done")
            ),
            "no effect": sum(1 for job in ids if job not in seen),
            "duplicated": len(duplicated),
            "unexplained": unexplained,
            "actions": dict(self.tally.actions),
            "restarts": self.tally.restarts,
            "graceful stops": len(stops),
            "slowest stop": f"{max(stops, default=0.0):.2f} s",
            "stop overruns": sum(1 for s in stops if s > budget),
            "exit statuses": {k: dict(v) for k, v in self.tally.statuses.items()},
            "final worker": final,
        }


def _signal_if_alive(proc: subprocess.Popen[bytes], number: int) -> None:
    if proc.poll() is None:
        proc.send_signal(number)


def _payloads(n: int, rng: random.Random) -> list[dict[str, object]]:
    """``n`` jobs, each a short cooperative wait and a shorter blind one."""
    return [
        {
            "task": "effect",
            "payload": {"wait": rng.uniform(0, 0.4), "block": rng.uniform(0, 0.1)},
            # Every kill of a worker costs its jobs an attempt (a job that kills its worker
            # every time must end failed): enough attempts that chaos alone fails none.
            "max_attempts": 100,
        }
        for _ in range(n)
    ]


def _open(db: str, *, fresh: bool = False) -> SQLiteStore | PostgresStore:
    """The store ``db`` names; ``fresh``: its PostgreSQL schema dropped first."""
    if not db.startswith("postgresql://"):
        return SQLiteStore(db)
    if fresh:
        import psycopg  # noqa: PLC0415 - the postgres extra, needed only here

        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("DROP SCHEMA IF EXISTS jobqueue CASCADE")
    return PostgresStore(db)


def _kill_a_backend(db: str) -> None:
    """Terminate one client connection of the database, a worker's or the listener's."""
    import psycopg  # noqa: PLC0415 - the postgres extra, needed only here

    with contextlib.suppress(psycopg.Error), psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend' ORDER BY random() LIMIT 1"
        )


def main(argv: list[str] | None = None) -> int:
    """Run the chaos on each store and print its counts."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=45.0, help="how long the chaos lasts")
    parser.add_argument("--every", type=float, default=0.25, help="seconds between actions")
    parser.add_argument("--stop-timeout", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    args = parser.parse_args(argv)
    dsn = os.environ.get("PATTERNS_PG_DSN", "")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(  # noqa: T201 - a benchmark prints its figures
        f"Python {sys.version.split()[0]}, {args.jobs} jobs, {args.workers} workers, "
        f"{args.seconds:g} s of chaos, an action every ~{args.every:g} s, "
        f"--stop-timeout {args.stop_timeout:g}; load average at the start {load}"
    )
    with tempfile.TemporaryDirectory(prefix="jobqueue-chaos-") as tmp:
        stores = []
        if args.store in {"sqlite", "both"}:
            stores.append(("SQLite", str(Path(tmp, "chaos.sqlite3"))))
        if args.store in {"postgres", "both"} and dsn:
            stores.append(("PostgreSQL", dsn))
        for name, db in stores:
            work = Path(tmp, name)
            work.mkdir()
            counts = Chaos(db, args, work, random.Random(args.seed)).run()
            print(f"\n{name}")  # noqa: T201 - a benchmark prints its figures
            for key, value in counts.items():
                print(f"  {key:18} {value}")  # noqa: T201 - a benchmark prints its figures
    return 0


if __name__ == "__main__":
    sys.exit(main())
