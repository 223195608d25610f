"""The mini job queue: the guarantees it shares with the real worker, proven on both, then its own.

The shared tests are written once against `Queue`, a thin adapter over either worker (the
mini ``Worker`` on its ``MiniStore``, or the real ``patterns.jobqueue.Worker`` on a
``SQLiteStore``), so the lesson cannot drift from the product. A handler is written once as
``handler(payload, token)``; the adapter hands the real worker's ``ctx.token`` to it.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import json
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from patterns.cancellation import CancelToken
from patterns.jobqueue import mini
from patterns.jobqueue.mini import MiniReport, MiniStore
from tests.support import (
    MUST_HAPPEN,
    NOISE,
    Gate,
    cannot_start,
    child_env,
    elapsed,
    thread_start_patched,
)

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("mini", "real")
AN_HOUR = 3600.0


@dataclass
class Queue:
    """One worker kind over one SQLite file: enqueue, build a worker, read a job's row."""

    kind: str
    path: Path
    _closing: list[Callable[[], object]] = field(default_factory=list)

    def _store(self, **options: Any) -> Any:
        if self.kind == "mini":
            store: Any = MiniStore(self.path, **options)
        else:
            from patterns.jobqueue import SQLiteStore  # noqa: PLC0415

            store = SQLiteStore(self.path, **options)
        self._closing.append(store.close)
        return store

    def enqueue(self, task: str, payload: Any = None, *, max_attempts: int = 3) -> int:
        """Add a job due now; its id."""
        return int(self._store().enqueue(task, payload, max_attempts=max_attempts))

    def worker(self, handlers: dict[str, Callable[[Any, CancelToken], Any]], *,
               lease: float = 30.0, **options: Any) -> Any:  # fmt: skip
        """A worker of this kind, not started; ``options`` are common to both."""
        options = {"concurrency": 2, "poll_interval": 0.05, "stop_timeout": 1.0} | options
        if self.kind == "mini":
            return mini.Worker(self._store(lease=lease), handlers, backoff=0.01, **options)
        from patterns.jobqueue import Backoff, TaskRegistry, Worker  # noqa: PLC0415

        tasks = TaskRegistry()
        for name, fn in handlers.items():
            # Bind fn now: a closure over the loop variable would see only the last one.
            tasks.task(name=name, retry=Backoff(base=0.01, jitter=0))(
                lambda payload, ctx, fn=fn: fn(payload, ctx.token)
            )
        return Worker(self._store(), tasks, lease=lease, **options)

    def row(self, job_id: int) -> tuple[str, int, Any]:
        """The job's state, attempts and result, read from the file by a connection of its own."""
        with contextlib.closing(sqlite3.connect(self.path)) as conn:
            state, attempts, result = conn.execute(
                "SELECT state, attempts, result FROM jobs WHERE id = ?", (job_id,)
            ).fetchone()
        return state, attempts, None if result is None else json.loads(result)

    def steal(self) -> Any:
        """Claim as another worker whose clock is an hour ahead: every lease held has expired."""
        ahead = lambda: time.time() + AN_HOUR  # noqa: E731
        if self.kind == "mini":
            return self._store(clock=ahead).claim()
        claims = self._store(clock=ahead).claim("thief", lease=60.0)
        return claims[0] if claims else None

    def complete_stolen(self, claim: Any, result: Any) -> bool:
        """Complete the thief's claim; True if the store accepted it."""
        store = self._store()
        if self.kind == "mini":
            return bool(store.write(claim, "done", result=json.dumps(result)))
        return bool(store.complete(claim, result))

    @staticmethod
    def released(report: Any) -> list[int]:
        """The jobs a stop gave back to the queue, their attempt unchanged."""
        if isinstance(report, MiniReport):
            return list(report.released)
        return [job for job, outcome in report.outcomes.items() if outcome == "released"]

    def close(self) -> None:
        """Close every store the adapter opened."""
        for close in self._closing:
            close()


@pytest.fixture(params=KINDS)
def jobs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Queue]:
    """The same test, once on the mini worker and once on the real one."""
    adapter = Queue(request.param, tmp_path / "jobs.sqlite3")
    try:
        yield adapter
    finally:
        adapter.close()


def join_new_threads(before: set[threading.Thread]) -> None:
    """Wait (bounded) for every thread started since ``before``: its last write is then done."""
    for thread in set(threading.enumerate()) - before:
        thread.join(MUST_HAPPEN)
        assert not thread.is_alive(), f"{thread.name} did not end"


# --- the guarantees both workers keep ---------------------------------------------------------


def test_every_enqueued_job_runs_once_and_ends_done_with_its_result(jobs: Queue) -> None:
    """N jobs, one worker: each handler runs once and each job is done with what it returned."""
    count, lock, all_ran, seen = 20, threading.Lock(), threading.Event(), []

    def square(payload: Any, token: CancelToken) -> int:
        with lock:
            seen.append(payload["n"])
            if len(seen) == count:
                all_ran.set()
        return int(payload["n"]) ** 2

    ids = [jobs.enqueue("square", {"n": n}) for n in range(count)]
    with jobs.worker({"square": square}, concurrency=4):
        assert all_ran.wait(MUST_HAPPEN)
    # Leaving the block stops the worker, which drains: every outcome is recorded by then.
    assert sorted(seen) == list(range(count))
    assert [jobs.row(i) for i in ids] == [("done", 1, n * n) for n in range(count)]


def test_a_stop_mid_job_puts_it_back_with_its_attempt_unchanged(jobs: Queue) -> None:
    """A job the stop cancels is interrupted, not failed: queued again, its attempt given back."""
    entered = threading.Event()

    def until_cancelled(payload: Any, token: CancelToken) -> None:
        entered.set()
        token.wait(MUST_HAPPEN)  # the stop's cancel ends the wait at once
        token.check()  # raises Cancelled

    job = jobs.enqueue("wait")
    worker = jobs.worker({"wait": until_cancelled}).start()
    assert entered.wait(MUST_HAPPEN)
    report = worker.stop()
    assert report.terminated
    assert jobs.released(report) == [job]
    assert jobs.row(job) == ("queued", 0, None)


def test_a_failing_job_is_retried_then_ends_failed_after_max_attempts(jobs: Queue) -> None:
    """Each failure is retried after a short backoff until max_attempts; then the job fails."""
    runs, third = [], threading.Event()

    def boom(payload: Any, token: CancelToken) -> None:
        runs.append(payload)
        if len(runs) == 3:
            third.set()
        raise ValueError("boom")

    job = jobs.enqueue("boom", max_attempts=3)
    with jobs.worker({"boom": boom}):
        assert third.wait(MUST_HAPPEN)
    assert len(runs) == 3
    assert jobs.row(job)[:2] == ("failed", 3)


def test_a_job_whose_task_has_no_handler_fails_at_once(jobs: Queue) -> None:
    """A task nobody registered is a failure on its first attempt, never a silent drop."""
    job = jobs.enqueue("nobody-knows-me", max_attempts=5)
    jobs.worker({}, exit_when_empty=True).run()
    assert jobs.row(job)[:2] == ("failed", 1)


def test_a_late_completion_is_refused_once_another_claim_holds_the_lease(jobs: Queue) -> None:
    """The fence: a worker whose lease was taken over cannot overwrite the new claim's outcome."""
    gate = Gate("late handler")

    def late(payload: Any, token: CancelToken) -> str:
        gate.arrive()  # parked while the test takes the lease over; ignores its token
        return "late"

    job = jobs.enqueue("late")
    with jobs.worker({"late": late}, lease=60.0):
        gate.wait_reached()
        thief = jobs.steal()  # its clock is an hour ahead: the lease has expired for it
        assert thief is not None
        gate.open()
    # The worker's stop drained the late handler, whose outcome the store refused.
    assert jobs.row(job) == ("running", 2, None)
    assert jobs.complete_stolen(thief, "thief")
    assert jobs.row(job) == ("done", 2, "thief")


def test_stop_keeps_its_budget_and_names_the_job_whose_handler_ignores_its_token(
    jobs: Queue,
) -> None:
    """A handler that ignores cancellation cannot stretch the stop; the report names its job."""
    before, gate = set(threading.enumerate()), Gate("stubborn handler")
    job = jobs.enqueue("stubborn")
    worker = jobs.worker({"stubborn": lambda payload, token: gate.arrive()}).start()
    try:
        gate.wait_reached()
        with elapsed() as took:
            report = worker.stop(0.5)
        assert took() < 0.5 + NOISE
        assert not report.terminated
        assert f"job {job}" in report.still_running
        assert job in report.still_running_ids
        assert jobs.row(job) == ("queued", 0, None)  # released: a stop never fails a job
    finally:
        gate.open()
    join_new_threads(before)
    assert jobs.row(job) == ("queued", 0, None)  # the handler's late "done" was refused


# --- whole processes: SIGKILL, SIGTERM, Ctrl-C, two signals -------------------------------------


def run_child(kind: str, path: str, phase: str, stop_timeout: str) -> None:
    """A worker process: ``first`` runs until signalled, ``again`` until the queue is empty."""

    def step(payload: Any, token: CancelToken) -> None:
        print(f"start {payload['n']}", flush=True)  # noqa: T201 - the parent's checkpoint
        if payload.get("hang") and phase == "first":
            token.wait(60.0)  # until a stop cancels it, or the process dies here
            token.check()

    adapter = Queue(kind, Path(path))
    first = phase == "first"
    worker = adapter.worker({"step": step}, lease=1.0, stop_timeout=float(stop_timeout),
                            exit_when_empty=not first, install_signal_handlers=first)  # fmt: skip
    report = worker.run()
    adapter.close()
    print(f"stopped terminated={report.terminated}", flush=True)  # noqa: T201 - to the parent


CHILD = "import sys; from tests.jobqueue.test_mini import run_child; run_child(*sys.argv[1:])"


def spawn(jobs: Queue, phase: str, stop_timeout: float) -> subprocess.Popen[str]:
    """Start a worker process on the adapter's file; its stderr (the log) joins its stdout."""
    argv = [sys.executable, "-c", CHILD, jobs.kind, str(jobs.path), phase, str(stop_timeout)]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(), cwd=ROOT
    )


def read_lines(child: subprocess.Popen[str]) -> Callable[[str], None]:
    """A reader of the child's lines; call it to wait (bounded) for a line that has ``text``."""
    lines: queue.Queue[str] = queue.Queue()
    stdout = child.stdout
    assert stdout is not None
    threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()

    def wait_for(text: str) -> None:  # a checkpoint the child reached, never a sleep
        deadline = time.monotonic() + MUST_HAPPEN
        while text not in (line := lines.get(timeout=max(0.0, deadline - time.monotonic()))):
            assert line, f"the child ended before it said {text!r}"

    return wait_for


# how the first worker process ends, its exit status, and what the hanging job is right after
ENDINGS = {
    "SIGKILL": ([signal.SIGKILL], -signal.SIGKILL, ("running", 1)),
    "SIGTERM": ([signal.SIGTERM], 0, ("queued", 0)),
    "Ctrl-C": ([signal.SIGINT], 0, ("queued", 0)),
    "two SIGTERMs": ([signal.SIGTERM, signal.SIGTERM], 128 + signal.SIGTERM, ("running", 1)),
}


@pytest.mark.parametrize("ending", ENDINGS)
def test_no_job_is_lost_when_the_worker_process_ends_mid_job(jobs: Queue, ending: str) -> None:
    """Stopped or killed mid-job, a worker loses nothing: a restarted one finishes every job."""
    signals, status, hanging_after = ENDINGS[ending]
    ids = [jobs.enqueue("step", {"n": n}) for n in range(3)]
    hang = jobs.enqueue("step", {"n": 3, "hang": True})
    # Two signals: a long budget, so the second one surely comes while the first one drains.
    with spawn(jobs, "first", stop_timeout=30.0 if len(signals) > 1 else 1.0) as child:
        try:
            wait_for = read_lines(child)
            wait_for("start 3")
            child.send_signal(signals[0])
            for signum in signals[1:]:  # once the first was heard: two at once may merge into one
                wait_for("received: stopping")
                child.send_signal(signum)
            assert child.wait(MUST_HAPPEN) == status
        finally:
            child.kill()  # only if a check above failed: it has ended otherwise
    assert jobs.row(hang)[:2] == hanging_after
    with spawn(jobs, "again", stop_timeout=1.0) as again:
        assert again.wait(MUST_HAPPEN) == 0
    assert [jobs.row(i)[0] for i in [*ids, hang]] == ["done"] * 4
    assert jobs.row(hang)[1] == (2 if hanging_after[0] == "running" else 1)


# --- the mini worker's own: the lesson's limits, its lifecycle, its page's program ----------------

SOURCE = Path(mini.__file__)
PATTERN_MODULES = {
    "cancellation", "closable_queue", "daemon_threads", "executor_shutdown", "signal_handlers",
    "thread_exceptions",
}  # fmt: skip


def test_the_lesson_fits_its_limits_file_350_worker_150_function_25() -> None:
    """Read at one sitting: the file, its Worker class and each function stay short."""
    tree = ast.parse(SOURCE.read_text(encoding="utf-8"))
    assert len(SOURCE.read_text(encoding="utf-8").splitlines()) <= 350
    [worker] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Worker"]
    assert worker.end_lineno is not None
    assert worker.end_lineno - worker.lineno + 1 <= 150
    long = {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.end_lineno is not None
        if node.end_lineno - node.lineno + 1 > 25
    }
    assert not long, long


def imported_from_patterns() -> dict[str, set[str]]:
    """The names mini.py imports from each ``patterns.<module>``."""
    names: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(SOURCE.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            assert not any(a.name.startswith("patterns") for a in node.names), "use from-imports"
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("patterns."):
            names.setdefault(node.module.removeprefix("patterns."), set()).update(
                alias.name for alias in node.names
            )
    return names


def test_the_lesson_uses_every_pattern_module_through_its_public_names_only() -> None:
    """Each pattern module is imported, only names from its ``__all__``, and each name is used."""
    imported = imported_from_patterns()
    assert set(imported) == PATTERN_MODULES
    tree = ast.parse(SOURCE.read_text(encoding="utf-8"))
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    for module, names in imported.items():
        public = set(importlib.import_module(f"patterns.{module}").__all__)
        assert names <= public, f"{module}: {sorted(names - public)} are not public"
        assert names <= used, f"{module}: {sorted(names - used)} imported, never used"


def test_the_pattern_table_names_every_module_and_name_it_imports() -> None:
    """The table atop the module says which names of which module it uses, and stays true."""
    doc = (mini.__doc__ or "").splitlines()
    for module, names in imported_from_patterns().items():
        listed = {
            word.strip(",")
            for line in doc
            if line.startswith(f"{module} ")
            for word in line.split()
        }
        assert names <= listed, f"{module}: {sorted(names - listed)} missing from the table"


def make_worker(tmp_path: Path, **options: Any) -> mini.Worker:
    """An idle mini worker over an empty queue (close ``worker.store`` at the end)."""
    return mini.Worker(MiniStore(tmp_path / "jobs.sqlite3"), {}, poll_interval=60.0, **options)


def test_building_a_worker_starts_no_thread_and_stop_before_start_refuses_start(
    tmp_path: Path,
) -> None:
    """No thread before start(); a stop first is terminated, and start() is then refused."""
    before = threading.active_count()
    worker = make_worker(tmp_path)
    assert threading.active_count() == before
    report = worker.stop()
    assert report.terminated
    with pytest.raises(RuntimeError):
        worker.start()
    worker.store.close()


def test_start_once_with_a_started_worker_and_a_stop_that_returns_its_first_report(
    tmp_path: Path,
) -> None:
    """`with w.start()` enters the running worker; a second start is refused; stop is idempotent."""
    worker = make_worker(tmp_path)
    with worker.start() as entered:
        assert entered is worker
        with pytest.raises(RuntimeError):
            worker.start()
    first = worker.stop()
    assert first.terminated
    assert worker.stop(0) is first
    worker.store.close()


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_start_is_all_or_nothing_when_a_thread_cannot_start(tmp_path: Path, k: int) -> None:
    """Whichever thread (heartbeat, handlers, claimer) fails to start, none is left running."""
    before = set(threading.enumerate())
    worker = make_worker(tmp_path)
    with thread_start_patched(k, cannot_start), pytest.raises(RuntimeError):
        worker.start()
    join_new_threads(before)
    worker.store.close()


@pytest.mark.parametrize("bad", [float("nan"), -1.0, True, "1"])
def test_a_budget_that_is_not_a_number_of_seconds_is_refused_by_name(
    tmp_path: Path, bad: Any
) -> None:
    """nan, a negative, a bool or a str as a budget is a ValueError naming the argument."""
    worker = make_worker(tmp_path)
    with pytest.raises(ValueError, match="stop_timeout"):
        mini.Worker(worker.store, {}, stop_timeout=bad)
    with pytest.raises(ValueError, match="timeout"):
        worker.stop(bad)
    worker.stop()
    worker.store.close()


def test_an_endless_budget_means_as_long_as_it_takes(tmp_path: Path) -> None:
    """``stop(math.inf)`` waits for the jobs as long as they take, and never overflows."""
    worker = make_worker(tmp_path).start()
    assert worker.stop(float("inf")).terminated
    worker.store.close()


def test_a_job_whose_worker_died_on_its_last_attempt_ends_failed(tmp_path: Path) -> None:
    """A job that kills its worker every time fails once its attempts are spent, never loops."""
    store = MiniStore(tmp_path / "jobs.sqlite3", lease=60.0)
    later = MiniStore(tmp_path / "jobs.sqlite3", clock=lambda: time.time() + AN_HOUR)
    job = store.enqueue("crash", max_attempts=1)
    assert store.claim() is not None  # and its worker dies: the lease is never renewed
    assert later.claim() is None
    assert later.counts()["failed"] == 1
    with contextlib.closing(sqlite3.connect(tmp_path / "jobs.sqlite3")) as conn:
        assert conn.execute("SELECT state FROM jobs WHERE id = ?", (job,)).fetchone() == ("failed",)
    store.close()
    later.close()


def test_the_use_it_program_works_the_queue_until_it_is_empty(tmp_path: Path) -> None:
    """The page's first program runs as shown and leaves every job done."""
    program = ROOT / "examples" / "mini_jobqueue.py"
    db = tmp_path / "jobs.sqlite3"
    result = subprocess.run(
        [sys.executable, str(program), str(db)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=MUST_HAPPEN,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "'done': 5" in result.stderr
    assert "terminated=True" in result.stderr
    assert len(program.read_text(encoding="utf-8").splitlines()) <= 25
