"""The command line, as other tools see it: real processes, a real SQLite file, real signals.

Each test starts ``python -m patterns.jobqueue`` in a child process on a database in
``tmp_path``. The handlers live in a small tasks module the test writes next to it; they
print a marker line when they start and block on the child's stdin, so the test decides
when a job ends by writing a line, and never guesses with a sleep. The test reads the
child's stdout (markers) and stderr (the worker's log) line by line through `Child`.
"""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import IO

import pytest

from tests.support import MUST_HAPPEN, child_env, elapsed, join_or_fail

PROG = "python -m patterns.jobqueue"

NOISE = 3.0  # process start, imports and the forced exit's flush, on a shared machine

TASKS_MODULE = r'''
import sys
from patterns.jobqueue.tasks import TaskRegistry

tasks = TaskRegistry()
not_a_registry = 42

@tasks.task
def echo(payload, ctx):
    sys.stdout.write(f"ran {ctx.job_id} {payload}\n")
    sys.stdout.flush()

@tasks.task
def blocks(payload, ctx):
    """Ignores its token: it ends only when the test writes a line to the child's stdin."""
    print("started", ctx.job_id, "attempt", ctx.attempt, flush=True)
    sys.stdin.readline()
    print("finished", ctx.job_id, flush=True)
'''


class Child:
    """A CLI child process whose stdout and stderr lines can be awaited one marker at a time."""

    def __init__(
        self,
        args: list[str],
        cwd: Path,
        *,
        stdin: str | None = None,
        python: tuple[str, ...] = ("-m", "patterns.jobqueue"),
    ) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, *python, *args],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        self.lines: dict[str, queue.Queue[str | None]] = {
            "out": queue.Queue(),
            "err": queue.Queue(),
        }
        self.seen: dict[str, list[str]] = {"out": [], "err": []}
        assert self.proc.stdout is not None
        assert self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, "out"), name="out"),
            threading.Thread(target=self._pump, args=(self.proc.stderr, "err"), name="err"),
        ]
        for reader in self._readers:
            reader.start()
        if stdin is not None:
            self.send(stdin)

    def _pump(self, stream: IO[str], name: str) -> None:
        for line in stream:
            self.lines[name].put(line.rstrip("\n"))
        self.lines[name].put(None)  # EOF

    def send(self, text: str) -> None:
        """Write ``text`` to the child's stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def expect(self, stream: str, text: str, timeout: float = MUST_HAPPEN) -> str:
        """Wait for the next line of ``stream`` ("out" or "err") that contains ``text``."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                line = self.lines[stream].get(timeout=max(0.0, remaining))
            except queue.Empty:
                raise AssertionError(f"no {text!r} on std{stream}; saw {self.seen}") from None
            if line is None:
                self.lines[stream].put(None)
                raise AssertionError(f"std{stream} ended before {text!r}; saw {self.seen}")
            self.seen[stream].append(line)
            if text in line:
                return line

    def wait(self, timeout: float = MUST_HAPPEN) -> int:
        """Wait for the exit status."""
        return self.proc.wait(timeout)

    def rest(self, stream: str) -> list[str]:
        """Every line of ``stream`` not read yet (call after the child exited)."""
        self._readers[0 if stream == "out" else 1].join(MUST_HAPPEN)
        lines = []
        while (line := self.lines[stream].get_nowait()) is not None:
            lines.append(line)
        return lines

    def close(self) -> None:
        """Kill the child if it is still running and join the readers."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(MUST_HAPPEN)
        for reader in self._readers:
            join_or_fail(reader)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def run_cli(args: list[str], cwd: Path, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """Run the CLI to completion (with a timeout) and return its result."""
    return subprocess.run(
        [sys.executable, "-m", "patterns.jobqueue", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=MUST_HAPPEN * 3,
        check=False,
    )


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A directory with the test's tasks module; the CLI runs from here."""
    (tmp_path / "jobs.py").write_text(textwrap.dedent(TASKS_MODULE))
    return tmp_path


def status(workdir: Path) -> dict[str, int]:
    """The job counts, through ``status --json``."""
    result = run_cli(["--db", "q.db", "status", "--json"], workdir)
    assert result.returncode == 0, result.stderr
    counts: dict[str, int] = json.loads(result.stdout)
    return counts


WORKER = ["--db", "q.db", "worker", "--tasks", "jobs:tasks", "--poll-interval", "0.05"]


def test_enqueue_prints_the_job_id_and_status_counts_it(workdir: Path) -> None:
    """Enqueue prints each new id; status --json has exactly the four state keys."""
    first = run_cli(["--db", "q.db", "enqueue", "echo", '{"n": 1}'], workdir)
    second = run_cli(
        ["--db", "q.db", "enqueue", "echo", "--delay", "60", "--max-attempts", "5"], workdir
    )
    assert (first.returncode, first.stdout, first.stderr) == (0, "1\n", "")
    assert (second.returncode, second.stdout) == (0, "2\n")
    assert status(workdir) == {"queued": 2, "running": 0, "done": 0, "failed": 0, "cancelled": 0}
    text = run_cli(["--db", "q.db", "status"], workdir)
    assert text.stdout.split() == [
        *("queued", "2", "running", "0", "done", "0", "failed", "0", "cancelled", "0")
    ]


def test_worker_exit_when_empty_runs_every_due_job_and_exits_zero(workdir: Path) -> None:
    """With --exit-when-empty the worker runs what is due and exits 0 once nothing is left."""
    for n in range(3):
        assert run_cli(["--db", "q.db", "enqueue", "echo", str(n)], workdir).returncode == 0
    result = run_cli([*WORKER, "--exit-when-empty", "--concurrency", "1"], workdir)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["ran 1 0", "ran 2 1", "ran 3 2"]
    assert status(workdir) == {"queued": 0, "running": 0, "done": 3, "failed": 0, "cancelled": 0}


def test_sigterm_drains_the_running_job_and_exits_zero(workdir: Path) -> None:
    """The first SIGTERM stops claiming; the running job finishes within the budget; status 0."""
    run_cli(["--db", "q.db", "enqueue", "blocks"], workdir)
    run_cli(["--db", "q.db", "enqueue", "echo", '"never run"'], workdir)
    child = Child([*WORKER, "--concurrency", "1", "--stop-timeout", "60"], workdir)
    try:
        child.expect("out", "started 1")
        child.proc.send_signal(signal.SIGTERM)
        child.expect("err", "RUNNING -> DRAINING")
        child.send("go\n")  # the job ends during the drain
        child.expect("out", "finished 1")
        assert child.wait() == 0
        assert "ran" not in " ".join(child.rest("out"))  # nothing claimed after the signal
        assert any("DRAINING -> STOPPED" in line for line in child.rest("err"))
    finally:
        child.close()
    assert status(workdir) == {"queued": 1, "running": 0, "done": 1, "failed": 0, "cancelled": 0}


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_second_signal_forces_the_exit_at_once(
    workdir: Path, sig: signal.Signals, code: int
) -> None:
    """While the drain waits for a stuck job, a second signal exits with 128 + signum."""
    run_cli(["--db", "q.db", "enqueue", "blocks"], workdir)
    child = Child([*WORKER, "--stop-timeout", "60"], workdir)
    try:
        child.expect("out", "started 1")
        child.proc.send_signal(sig)
        child.expect("err", "RUNNING -> DRAINING")
        with elapsed() as took:
            child.proc.send_signal(sig)
            assert child.wait() == code
        assert took() < NOISE  # against a budget of 60 s
        assert any("second signal" in line for line in child.rest("err"))
    finally:
        child.close()


def test_a_job_ignoring_its_token_past_the_budget_exits_3_promptly_and_is_released(
    workdir: Path,
) -> None:
    """Past the budget the process exits 3 at once; the job was released, attempt given back."""
    run_cli(["--db", "q.db", "enqueue", "blocks"], workdir)
    child = Child([*WORKER, "--stop-timeout", "0.5", "--lease", "60"], workdir)
    try:
        child.expect("out", "started 1 attempt 1")
        with elapsed() as took:
            child.proc.send_signal(signal.SIGTERM)
            assert child.wait() == 3
        assert took() < 0.5 + NOISE
        log = "\n".join(child.rest("err"))
        assert "DRAINING -> CANCELLING" in log
        assert (
            "1 released, 1 still running [1] (released at the deadline [1]: attempts given back)"
            in log
        )
    finally:
        child.close()
    assert status(workdir)["queued"] == 1  # not failed, not waiting out a 60 s lease
    # The next worker runs it at once, as its first attempt again (this time it finishes).
    rerun = run_cli([*WORKER, "--exit-when-empty"], workdir, stdin="go\n")
    assert rerun.returncode == 0, rerun.stderr
    assert "started 1 attempt 1" in rerun.stdout
    assert status(workdir) == {"queued": 0, "running": 0, "done": 1, "failed": 0, "cancelled": 0}


# A worker process that gets SIGINT from itself at a fixed point: just before the command
# installs its signal handlers (the handlers ``main`` put in place for the start-up hold
# it), once the claiming thread has started (the handlers are installed, so it is the
# first, graceful signal), or at the end of the stop just after the command put the
# start-up handlers back (they ignore it). ``signal.raise_signal`` delivers it to the
# calling thread before it returns: no sleep, no timing.
CTRL_C_INSIDE_START = r"""
import signal, sys, threading
from patterns.signal_handlers import SignalHandlers
from patterns.jobqueue.cli import main as cli

where = sys.argv.pop(1)
if where == "after-handlers-closed":
    real_stop = SignalHandlers.stop

    def stop(handlers):
        report = real_stop(handlers)
        signal.raise_signal(signal.SIGINT)  # a second Ctrl-C, just too late for the handlers
        return report

    SignalHandlers.stop = stop
    sys.argv.append("--exit-when-empty")
elif where == "before-handlers":
    real_start = SignalHandlers.start

    def start(handlers):
        signal.raise_signal(signal.SIGINT)
        return real_start(handlers)

    SignalHandlers.start = start
else:
    real_thread_start = threading.Thread.start

    def thread_start(thread):
        real_thread_start(thread)
        if thread.name.endswith("-claimer"):
            signal.raise_signal(signal.SIGINT)

    threading.Thread.start = thread_start
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("where", ["before-handlers", "claimer-started", "after-handlers-closed"])
def test_ctrl_c_inside_the_worker_start_or_end_exits_cleanly_and_leaves_no_job_running(
    workdir: Path, where: str
) -> None:
    """Ctrl-C while the worker starts or ends: no traceback, status 0, no job left running.

    Before the command's handlers are installed, the start-up handlers record it and the
    worker stops before it starts: the job stays queued. Once they are installed it is
    the first signal: the worker drains. Just after the stop put the start-up handlers
    back, they ignore it (one line) and the status is the report's.
    """
    run_cli(["--db", "q.db", "enqueue", "echo", '"x"'], workdir)
    result = subprocess.run(
        [sys.executable, "-c", CTRL_C_INSIDE_START, where, *WORKER],
        cwd=workdir,
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=MUST_HAPPEN * 3,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    counts = status(workdir)
    assert counts["running"] == 0
    assert counts["queued"] + counts["done"] == 1
    if where == "before-handlers":
        assert counts["queued"] == 1  # the worker never started
        assert "SIGINT during start-up: the worker stopped before it started" in result.stderr
    if where == "after-handlers-closed":
        assert counts["done"] == 1  # --exit-when-empty: the stop came once it was done
        assert "-> STOPPED" in result.stderr
        ignored = f"{PROG}: SIGINT ignored: the worker has stopped and the process is exiting"
        assert ignored in result.stderr.splitlines()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--db", "q.db", "enqueue", "echo", "{not json"], "invalid JSON payload"),
        (["--db", "q.db", "enqueue", "echo", "NaN"], "JSON-serialisable"),
        (["--db", "q.db", "enqueue", "echo", "--delay", "-1"], "delay must be >= 0"),
        (["--db", "q.db", "status", "--frobnicate"], "unrecognized arguments: --frobnicate"),
        (["--db", "q.db", "worker"], "the following arguments are required: --tasks"),
        (["--db", "q.db", "worker", "--tasks", "nosuchmodule:tasks"], "cannot import"),
        (["--db", "q.db", "worker", "--tasks", "jobs"], "MODULE:ATTRIBUTE"),
        (["--db", "q.db", "worker", "--tasks", "jobs:missing"], "has no attribute 'missing'"),
        (["--db", "q.db", "worker", "--tasks", "jobs:not_a_registry"], "not a TaskRegistry"),
        (["--db", "q.db", "worker", "--tasks", "jobs:tasks", "--concurrency", "0"], "at least"),
        (["status"], "--db"),
        (["--db", "jobs.py", "status"], "not a usable SQLite database"),
    ],
)
def test_bad_input_exits_2_with_a_one_line_message(
    workdir: Path, args: list[str], message: str
) -> None:
    """Every kind of bad input is refused with exit status 2 and one line naming the problem."""
    result = run_cli(args, workdir)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("python -m patterns.jobqueue: error: ")
    assert message in lines[0]


def test_demo_runs_to_the_end_and_its_tally_reconciles(tmp_path: Path) -> None:
    """`make demo`: it ends by itself, shows the shutdown phases, and nothing is lost."""
    result = run_cli(["demo"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for phase in ("RUNNING -> DRAINING", "DRAINING -> CANCELLING", "CANCELLING -> STOPPED"):
        assert phase in out
    assert "run_at unchanged: interrupted, not failed" in out
    assert "Nothing lost, nothing left behind." in out


def test_the_mini_demo_runs_to_the_end_and_its_tally_reconciles(tmp_path: Path) -> None:
    """``demo --mini``: the mini queue stops mid-job, gives the job back, and loses nothing."""
    result = run_cli(["demo", "--mini"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""
    out = result.stdout
    assert "report: terminated=True" in out, out
    # The two 3 s cooperative jobs, claimed first, were still running when the drain budget
    # was spent: cancelled, and given back with their attempt (other claims may be too).
    for job_id in (1, 2):
        assert f"job {job_id} (steps): queued, attempts 0: interrupted, not failed" in out, out
    [released] = re.findall(r"released \(back in the queue, attempt given back\): (.*)", out)
    assert {"1", "2"} <= set(released.split(", ")), out
    assert "19 enqueued = 18 done + 1 failed + 0 queued or running" in out, out
    assert "Nothing lost, nothing left behind." in out, out
