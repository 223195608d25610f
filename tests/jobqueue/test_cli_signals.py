"""The signals an operator sends to ``python -m patterns.jobqueue``, at every moment of its life.

Real child processes, real signals. The moments before the worker starts and after it
stopped are held open by checkpoints outside the code under test: an import hook that
waits on stdin when the command line's module (or the tasks module) is first imported,
and an `atexit` handler that waits on stdin once ``main`` has returned. The test sends
its signal while the child waits there, then writes the line that lets it go on.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.jobqueue.test_cli import PROG, TASKS_MODULE, WORKER, Child, run_cli, status
from tests.support import MUST_HAPPEN, child_env

DONE_ONE = {"queued": 0, "running": 0, "done": 1, "failed": 0, "cancelled": 0}
QUEUED_ONE = {"queued": 1, "running": 0, "done": 0, "failed": 0, "cancelled": 0}


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A directory with the tasks module of ``test_cli``; the command runs from here."""
    (tmp_path / "jobs.py").write_text(textwrap.dedent(TASKS_MODULE))
    return tmp_path


def started_job(workdir: Path, *args: str) -> Child:
    """A worker running job 1 (``blocks``), which ends when the test writes a line."""
    assert run_cli(["--db", "q.db", "enqueue", "blocks"], workdir).returncode == 0
    child = Child([*WORKER, "--stop-timeout", "60", *args], workdir)
    child.expect("out", "started 1")
    return child


def finish_with_sigterm(child: Child) -> None:
    """The worker drains on SIGTERM: job 1 finishes, exit status 0."""
    child.proc.send_signal(signal.SIGTERM)
    child.expect("err", "RUNNING -> DRAINING")
    child.send("go\n")
    child.expect("out", "finished 1")
    assert child.wait() == 0


# --- while the worker runs ----------------------------------------------------------------------


def test_sighup_drains_like_sigterm_and_exits_zero(workdir: Path) -> None:
    """The terminal's hang-up is a graceful stop: the running job finishes, status 0."""
    child = started_job(workdir)
    try:
        child.proc.send_signal(signal.SIGHUP)
        child.expect("err", "SIGHUP received: stopping")
        child.expect("err", "RUNNING -> DRAINING")
        child.send("go\n")
        child.expect("out", "finished 1")
        assert child.wait() == 0
    finally:
        child.close()
    assert status(workdir) == DONE_ONE


@pytest.mark.parametrize(
    ("first", "second", "code"),
    [(signal.SIGHUP, signal.SIGHUP, 129), (signal.SIGTERM, signal.SIGHUP, 129)],
    ids=["hup-hup", "term-hup"],
)
def test_a_second_sighup_forces_the_exit_with_128_plus_its_number(
    workdir: Path, first: signal.Signals, second: signal.Signals, code: int
) -> None:
    """During the drain a second stop signal exits at once, 128 + the second one's number."""
    child = started_job(workdir)
    try:
        child.proc.send_signal(first)
        child.expect("err", "RUNNING -> DRAINING")
        child.proc.send_signal(second)
        assert child.wait() == code
        assert any("second signal (SIGHUP)" in line for line in child.rest("err"))
    finally:
        child.close()


def test_sigquit_prints_every_threads_stack_and_the_worker_goes_on(workdir: Path) -> None:
    """SIGQUIT shows where each thread is (the handler's own function too) and stops nothing."""
    child = started_job(workdir)
    try:
        child.proc.send_signal(signal.SIGQUIT)
        child.expect("err", "in blocks")  # the handler thread, blocked in the task function
        child.expect("err", "Current thread")  # the main thread's stack comes last
        child.expect("err", "in _guarded_worker")  # the command, starting or running the worker
        finish_with_sigterm(child)
    finally:
        child.close()
    assert status(workdir) == DONE_ONE


def test_sigusr1_logs_one_line_of_the_workers_state_and_it_goes_on(workdir: Path) -> None:
    """SIGUSR1 logs the state, the running job's id and the counters; the worker carries on."""
    child = started_job(workdir)
    try:
        child.proc.send_signal(signal.SIGUSR1)
        line = child.expect("err", "SIGUSR1:")
        assert "RUNNING: running job(s) [1]; claimed 1, done 0" in line
        child.proc.send_signal(signal.SIGTERM)
        child.expect("err", "RUNNING -> DRAINING")
        child.proc.send_signal(signal.SIGUSR1)  # not a second stop signal
        assert "DRAINING: running job(s) [1]" in child.expect("err", "SIGUSR1:")
        child.send("go\n")
        assert child.wait() == 0
    finally:
        child.close()
    assert status(workdir) == DONE_ONE


# ``python -m patterns.jobqueue ARGS`` whose main thread never takes SIGUSR1: the kernel
# delivers it to another thread (as it may whenever the main thread has a signal pending),
# and the main thread, blocked in a wait, does not run Python's handler until it wakes.
SIGUSR1_ELSEWHERE = r"""
import runpy, signal, sys, threading

def unblock(frame, event, arg):  # each new thread's first event: it takes SIGUSR1
    sys.setprofile(None)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})

threading.setprofile(unblock)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
runpy.run_module("patterns.jobqueue", run_name="__main__", alter_sys=True)
"""


def test_sigusr1_is_answered_when_a_thread_other_than_main_receives_it(workdir: Path) -> None:
    """The state line comes from a thread that reads the signal, not from the main thread."""
    assert run_cli(["--db", "q.db", "enqueue", "blocks"], workdir).returncode == 0
    child = Child([*WORKER, "--stop-timeout", "60"], workdir, python=("-c", SIGUSR1_ELSEWHERE))
    try:
        child.expect("out", "started 1")
        child.proc.send_signal(signal.SIGUSR1)
        assert "RUNNING: running job(s) [1]" in child.expect("err", "SIGUSR1:")
        finish_with_sigterm(child)
    finally:
        child.close()


# --- before the worker starts -------------------------------------------------------------------

# Runs ``python -m patterns.jobqueue ARGS`` as the interpreter does, with a checkpoint: the
# first import of module CHECKPOINT prints "checkpoint" and waits for a line on stdin.
# ``patterns.jobqueue.cli.main`` is the command line's own import (the 0.1 s a signal used to
# kill in); ``jobs`` is the tasks module, which the worker command imports before it starts.
AT_IMPORT = r"""
import runpy, sys

class Checkpoint:
    def __init__(self, name):
        self.name = name

    def find_spec(self, name, path=None, target=None):
        if name == self.name:
            sys.meta_path.remove(self)
            print("checkpoint", flush=True)
            sys.stdin.readline()
        return None

sys.meta_path.insert(0, Checkpoint(sys.argv.pop(1)))
runpy.run_module("patterns.jobqueue", run_name="__main__", alter_sys=True)
"""


def spawn(workdir: Path, script: str, *args: str) -> subprocess.Popen[str]:
    """``python -c script args`` in ``workdir``, every stream a pipe (stdin opens checkpoints)."""
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=workdir,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )


def at_import(workdir: Path, module: str, args: list[str]) -> subprocess.Popen[str]:
    """The command line, waiting at the first import of ``module``."""
    proc = spawn(workdir, AT_IMPORT, module, *args)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "checkpoint\n"
    return proc


def go_on(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """Let the child past its checkpoint; its exit status and stderr."""
    try:
        _, err = proc.communicate("go\n", timeout=MUST_HAPPEN * 3)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=MUST_HAPPEN)
    return proc.returncode, err


@pytest.mark.parametrize("module", ["patterns.jobqueue.cli.main", "jobs"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=str)
def test_a_signal_during_start_up_stops_the_worker_before_it_claims_anything(
    workdir: Path, module: str, sig: signal.Signals
) -> None:
    """A stop signal while modules import: exit 0, one line, no traceback, the job still queued."""
    assert run_cli(["--db", "q.db", "enqueue", "echo", '"x"'], workdir).returncode == 0
    proc = at_import(workdir, module, WORKER)
    proc.send_signal(sig)
    code, err = go_on(proc)
    assert code == 0, err
    assert "Traceback" not in err, err
    assert f"{sig.name} during start-up: the worker stopped before it started" in err
    assert "NEW -> RUNNING" not in err
    assert status(workdir) == QUEUED_ONE


@pytest.mark.parametrize(
    "pair",
    [
        (signal.SIGTERM, signal.SIGINT),
        (signal.SIGINT, signal.SIGHUP),
        (signal.SIGHUP, signal.SIGTERM),
    ],
    ids=lambda pair: "-".join(s.name for s in pair),
)
def test_a_second_signal_during_start_up_exits_at_once(
    workdir: Path, pair: tuple[signal.Signals, signal.Signals]
) -> None:
    """Two stop signals before the worker started: 128 + the second's number, one line.

    Two different signals, because a second SIGTERM sent while the first is still pending
    is merged with it by the kernel; which of the two is handled second is the kernel's
    and CPython's choice, so the test reads it from the line.
    """
    assert run_cli(["--db", "q.db", "enqueue", "echo", '"x"'], workdir).returncode == 0
    proc = at_import(workdir, "patterns.jobqueue.cli.main", WORKER)
    for sig in pair:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=MUST_HAPPEN)  # no line written: it exits at the checkpoint
    second = next(sig for sig in pair if f"({sig.name})" in err)
    assert err == f"{PROG}: second signal ({second.name}) during start-up: exiting at once\n"
    assert proc.returncode == 128 + second
    assert status(workdir) == QUEUED_ONE


def test_ctrl_c_while_a_one_shot_command_starts_up_is_one_line_and_130(workdir: Path) -> None:
    """A command that is not ``worker`` gets its SIGINT once it runs: "interrupted", 130."""
    assert run_cli(["--db", "q.db", "enqueue", "echo", '"x"'], workdir).returncode == 0
    proc = at_import(workdir, "patterns.jobqueue.cli.main", ["--db", "q.db", "status"])
    proc.send_signal(signal.SIGINT)
    code, err = go_on(proc)
    assert (code, err) == (130, f"{PROG}: interrupted\n")


def test_sigusr1_and_sigquit_during_start_up_do_not_kill_it(workdir: Path) -> None:
    """Before the worker exists SIGUSR1 says so and SIGQUIT shows the stack; then it runs."""
    assert run_cli(["--db", "q.db", "enqueue", "echo", '"x"'], workdir).returncode == 0
    proc = at_import(workdir, "patterns.jobqueue.cli.main", [*WORKER, "--exit-when-empty"])
    proc.send_signal(signal.SIGUSR1)
    proc.send_signal(signal.SIGQUIT)
    code, err = go_on(proc)
    assert code == 0, err
    assert f"{PROG}: SIGUSR1: starting up, no worker yet" in err
    assert "in find_spec" in err  # the main thread's stack, at the checkpoint
    assert status(workdir) == DONE_ONE


# --- after the stop -----------------------------------------------------------------------------

# ``python -m patterns.jobqueue ARGS`` with two checkpoints, each printing its name and
# waiting for a line on stdin: "stopped" when the command logs the worker's report (after
# the stop, before ``main`` returns), and "exiting" in an `atexit` handler (the interpreter
# is exiting).
AFTER_STOP = r"""
import atexit, logging, runpy, sys

def checkpoint(name):
    print(name, flush=True)
    sys.stdin.readline()

class Stopped(logging.Filter):
    def filter(self, record):
        if "still running" in record.getMessage():
            checkpoint("stopped")
        return True

atexit.register(checkpoint, "exiting")
logging.getLogger("patterns.jobqueue.cli.worker_command").addFilter(Stopped())
runpy.run_module("patterns.jobqueue", run_name="__main__", alter_sys=True)
"""


def test_signals_after_a_clean_stop_are_ignored_and_the_status_stays_zero(workdir: Path) -> None:
    """A second SIGTERM after the stop (and SIGINT, SIGHUP, SIGUSR1): one line each, exit 0.

    At the interpreter's exit they are ignored silently (SIG_IGN): no second line.
    """
    proc = spawn(workdir, AFTER_STOP, *WORKER)
    try:
        assert proc.stdout is not None
        assert proc.stderr is not None
        for line in proc.stderr:  # the worker is running once it has moved to RUNNING
            if "NEW -> RUNNING" in line:
                break
        proc.send_signal(signal.SIGTERM)  # the first: a fast, clean stop
        assert proc.stdout.readline() == "stopped\n"
        late = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
        for sig in late:
            proc.send_signal(sig)
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "exiting\n"
        for sig in late:
            proc.send_signal(sig)
        _, err = proc.communicate("go\n", timeout=MUST_HAPPEN)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=MUST_HAPPEN)
    assert proc.returncode == 0, err
    for name in ("SIGTERM", "SIGINT", "SIGHUP"):
        assert err.count(f"{PROG}: {name} ignored: the worker has stopped") == 1, err
    assert err.count(f"{PROG}: SIGUSR1: the worker has stopped; exiting") == 1, err


STORM_TRIES = 10  # workers per signal: the window at the interpreter's exit is narrow
STORM_PERIOD = 0.0005  # seconds between two signals of the storm


@pytest.mark.parametrize(
    "sig",
    [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGQUIT],
    ids=lambda sig: sig.name,
)
def test_a_signal_storm_while_the_worker_exits_never_changes_its_status(
    workdir: Path, sig: signal.Signals
) -> None:
    """Signals sent without pause from the worker's STOPPED line to the exit: still status 0.

    The interpreter's finalization puts back the default action of every signal with a
    Python-level handler before the process ends, so a signal in those last milliseconds
    used to kill it.
    """
    for _ in range(STORM_TRIES):
        assert storm_until_exit(WORKER, workdir, sig) == 0


def storm_until_exit(worker: list[str], workdir: Path, sig: signal.Signals) -> int:
    """The exit status of ``worker`` stormed with ``sig`` from its STOPPED line to its exit.

    A stop signal stops it first; a worker stormed with SIGUSR1 or SIGQUIT stops by
    itself (``--exit-when-empty``). Then ``sig`` goes every `STORM_PERIOD` until the exit.
    """
    stops = sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    child = Child(worker if stops else [*worker, "--exit-when-empty"], workdir)
    try:
        child.expect("err", "NEW -> RUNNING")
        if stops:
            child.proc.send_signal(sig)  # the first: a clean stop, nothing running
        child.expect("err", "-> STOPPED")  # the report is final from this line on
        deadline = time.monotonic() + MUST_HAPPEN
        while child.proc.poll() is None and time.monotonic() < deadline:
            child.proc.send_signal(sig)
            time.sleep(STORM_PERIOD)  # the storm's pace, not a synchronisation
        status = child.wait()
        assert status == 0, child.rest("err")[-5:]
        return status
    finally:
        child.close()


# --- the package --------------------------------------------------------------------------------


def test_importing_the_package_imports_no_submodule_until_a_name_is_used() -> None:
    """``python -m`` imports the package first: it must be cheap, and every name still there."""
    code = (
        "import sys, patterns.jobqueue as q\n"
        "print(sorted(m for m in sys.modules if m.startswith('patterns.jobqueue.')))\n"
        "print(all(getattr(q, name).__name__ == name for name in q.__all__))\n"
        "print(sorted(set(q.__all__) - set(dir(q))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=MUST_HAPPEN,
        check=True,
    )
    assert result.stdout.splitlines() == ["[]", "True", "[]"], result.stderr
