"""The command line when its output cannot be written, its server is gone or its file locked.

Each test runs ``python -m patterns.jobqueue`` as a child process with a real standard
output: a pipe whose read end is closed before the child starts (every write fails with
EPIPE, whatever the buffering), a real ``| head -1``, or ``/dev/full`` (every write fails
with ENOSPC). The child runs with the shell's default buffering, so output that fits the
buffer fails only when it is flushed. A file is locked by a connection of the test's
holding ``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

import os
import re
import socket
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from patterns.jobqueue.stores.sqlite.store import SQLiteStore
from tests.jobqueue.test_cli import TASKS_MODULE
from tests.support import MUST_HAPPEN, child_env

ERROR = "python -m patterns.jobqueue: error: "
EXIT_OUTPUT = 4
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for `git log | head -1`
# The demo paces itself for a reader: about 8 s by design (a second of work, a stop with a
# 2 s budget, then a restart that runs the two 4 s jobs again). A hang guard of MUST_HAPPEN
# left 2 s for everything else (the interpreter, two workers, every SQLite commit), which a
# busy machine does not always give. test_cli.py's demo test allows it the same.
DEMO_TIMEOUT = 3 * MUST_HAPPEN

needs_dev_full = pytest.mark.skipif(
    not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)"
)


def _env(*, unbuffered: bool = False) -> dict[str, str]:
    env = child_env()
    env.pop("PYTHONUNBUFFERED", None)  # buffered, as from a shell
    if unbuffered:  # as ``python -u``, as many supervisors run it: each write reaches the fd
        env["PYTHONUNBUFFERED"] = "1"
    return env


def run(
    args: list[str],
    stdout: int | IO[bytes],
    *,
    unbuffered: bool = False,
    timeout: float = MUST_HAPPEN,
) -> subprocess.CompletedProcess[str]:
    """Run the CLI with ``stdout`` as its standard output; stderr is captured."""
    return subprocess.run(
        [sys.executable, "-m", "patterns.jobqueue", *args],
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(unbuffered=unbuffered),
        timeout=timeout,
        check=False,
    )


# Closes one file descriptor, then becomes ``python ARGS``: the CLI starts with that
# standard stream closed, as after ``>&-`` or ``2>&-`` in a shell.
CLOSING_EXEC = (
    "import os, sys; os.close(int(sys.argv[1])); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])"
)


def run_closed(
    fd: int,
    args: list[str],
    *,
    cwd: Path | None = None,
    unbuffered: bool = False,
    timeout: float = MUST_HAPPEN,
) -> subprocess.CompletedProcess[str]:
    """Run the CLI with ``fd`` (1 or 2) closed from its start; the other streams captured."""
    return subprocess.run(
        [sys.executable, "-c", CLOSING_EXEC, str(fd), "-m", "patterns.jobqueue", *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=_env(unbuffered=unbuffered),
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def closed_pipe() -> Iterator[int]:
    """The write end of a pipe whose read end is already closed."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        yield write_end
    finally:
        os.close(write_end)


@pytest.fixture
def queue(tmp_path: Path) -> Path:
    """A queue with three jobs (ids 1 to 3)."""
    path = tmp_path / "jobs.db"
    store = SQLiteStore(str(path))
    try:
        for n in range(3):
            store.enqueue("echo", {"n": n})
    finally:
        store.close()
    return path


def job_count(path: Path) -> int:
    """The number of jobs in the queue at ``path``."""
    store = SQLiteStore(str(path), create=False)
    try:
        return sum(store.counts().values())
    finally:
        store.close()


READING = [
    pytest.param(["list", "--limit", "100"], id="list"),
    pytest.param(["list", "--json"], id="list-json"),
    pytest.param(["show", "1"], id="show"),
    pytest.param(["status"], id="status"),
    pytest.param(["status", "--json"], id="status-json"),
    pytest.param(["workers"], id="workers"),
]


@pytest.mark.parametrize("command", READING)
def test_a_reading_command_into_a_closed_pipe_exits_quietly_with_the_sigpipe_status(
    queue: Path, closed_pipe: int, command: list[str]
) -> None:
    """A reader that closed the pipe wanted no more: no traceback, no line, status 141."""
    result = run(["--db", str(queue), *command], closed_pipe)
    assert (result.returncode, result.stderr) == (EXIT_BROKEN_PIPE, "")


def test_help_into_a_closed_pipe_exits_quietly_with_the_sigpipe_status(closed_pipe: int) -> None:
    """``--help | head -1`` is quiet too."""
    result = run(["--help"], closed_pipe)
    assert (result.returncode, result.stderr) == (EXIT_BROKEN_PIPE, "")


def test_list_through_head_exits_quietly_once_head_has_its_line(tmp_path: Path) -> None:
    """``list | head -1`` on more than a pipe holds: head prints the header, list ends quietly."""
    path = tmp_path / "jobs.db"
    store = SQLiteStore(str(path))
    try:
        # 2,000 lines of about 90 bytes: more than the pipe (64 KiB) and head's read hold,
        # so list is still writing when head exits.
        store.enqueue_many([{"task": "echo", "payload": {"n": n}} for n in range(2000)])
    finally:
        store.close()
    listing = subprocess.Popen(
        [sys.executable, "-m", "patterns.jobqueue", "--db", str(path), "list", "--limit", "2000"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
    )
    head = subprocess.run(
        ["head", "-1"], stdin=listing.stdout, capture_output=True, timeout=MUST_HAPPEN, check=False
    )
    assert listing.stdout is not None
    listing.stdout.close()  # head holds the only read end now
    _, err = listing.communicate(timeout=MUST_HAPPEN)
    assert head.stdout.decode().split() == [
        "ID",
        "STATE",
        "TASK",
        "ATTEMPTS",
        "RUN",
        "AT",
        "LAST",
        "ERROR",
    ]
    assert (listing.returncode, err.decode()) == (EXIT_BROKEN_PIPE, "")


@pytest.mark.parametrize("demo", [["demo"], ["demo", "--mini"]], ids=["real", "mini"])
def test_the_demo_into_a_closed_pipe_runs_to_its_end_and_exits_quietly(
    closed_pipe: int, demo: list[str]
) -> None:
    """The walkthrough stops its workers as usual: no traceback from a thread, status 141."""
    result = run(demo, closed_pipe, timeout=DEMO_TIMEOUT)
    assert (result.returncode, result.stderr) == (EXIT_BROKEN_PIPE, "")


@needs_dev_full
@pytest.mark.parametrize("command", READING)
def test_a_reading_command_into_a_full_disk_says_so_in_one_line(
    queue: Path, command: list[str]
) -> None:
    """A write that fails for another reason than a closed pipe is one line and status 4."""
    with open("/dev/full", "wb") as full:
        result = run(["--db", str(queue), *command], full)
    assert result.returncode == EXIT_OUTPUT
    assert result.stderr == (
        f"{ERROR}cannot write the output: [Errno 28] No space left on device\n"
    )


@needs_dev_full
def test_enqueue_into_a_full_disk_says_the_job_was_enqueued(queue: Path) -> None:
    """The job is written: the line names it, so a producer does not enqueue it twice."""
    with open("/dev/full", "wb") as full:
        result = run(["--db", str(queue), "enqueue", "echo", '{"x": 1}'], full)
    assert result.returncode == EXIT_OUTPUT
    assert result.stderr == (
        f"{ERROR}job 4 was enqueued, but its id could not be printed: "
        "[Errno 28] No space left on device\n"
    )
    assert job_count(queue) == 4


def test_enqueue_into_a_closed_pipe_says_the_job_was_enqueued(
    queue: Path, closed_pipe: int
) -> None:
    """The id is the whole output of enqueue: losing it is reported, even on a closed pipe."""
    result = run(["--db", str(queue), "enqueue", "echo"], closed_pipe)
    assert result.returncode == EXIT_OUTPUT
    assert result.stderr == (
        f"{ERROR}job 4 was enqueued, but its id could not be printed: [Errno 32] Broken pipe\n"
    )
    assert job_count(queue) == 4


# --- a standard stream closed at start-up ----------------------------------------------------

CLOSED_STDOUT = "[Errno 9] standard output is closed"


@pytest.mark.parametrize("command", [*READING, pytest.param(["demo"], id="demo")])
def test_a_reading_command_with_stdout_closed_says_so_in_one_line(
    queue: Path, command: list[str]
) -> None:
    """``status >&-``: one line and status 4, not an `AttributeError` traceback."""
    timeout = DEMO_TIMEOUT if command == ["demo"] else MUST_HAPPEN
    result = run_closed(1, ["--db", str(queue), *command], timeout=timeout)
    assert (result.returncode, result.stderr) == (
        EXIT_OUTPUT,
        f"{ERROR}cannot write the output: {CLOSED_STDOUT}\n",
    )


def test_enqueue_with_stdout_closed_says_the_job_was_enqueued(queue: Path) -> None:
    """``enqueue >&-`` wrote the job: the line says so, status 4, as for a full disk."""
    result = run_closed(1, ["--db", str(queue), "enqueue", "echo"])
    assert (result.returncode, result.stderr) == (
        EXIT_OUTPUT,
        f"{ERROR}job 4 was enqueued, but its id could not be printed: {CLOSED_STDOUT}\n",
    )
    assert job_count(queue) == 4


def test_with_stderr_closed_enqueue_and_the_worker_still_do_their_work(tmp_path: Path) -> None:
    """``2>&-`` costs the lines and the logs, never the work: the job is enqueued and done."""
    (tmp_path / "jobs.py").write_text(textwrap.dedent(TASKS_MODULE))
    enqueued = run_closed(2, ["--db", "q.db", "enqueue", "echo", '"x"'], cwd=tmp_path)
    assert (enqueued.returncode, enqueued.stdout) == (0, "1\n")
    worker = ["worker", "--tasks", "jobs:tasks", "--exit-when-empty", "--poll-interval", "0.05"]
    worked = run_closed(2, ["--db", "q.db", *worker], cwd=tmp_path)
    assert (worked.returncode, worked.stdout) == (0, "ran 1 x\n")
    store = SQLiteStore(str(tmp_path / "q.db"), create=False)
    try:
        assert store.counts().get("done") == 1
    finally:
        store.close()


def test_with_stderr_closed_an_error_is_not_printed_on_stdout(tmp_path: Path) -> None:
    """The error line is lost with stderr; it never lands in the output a script reads."""
    result = run_closed(2, ["--db", "missing.db", "status"], cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "")


HELP = [pytest.param(["--help"], id="help"), pytest.param(["worker", "--help"], id="worker-help")]


@pytest.mark.parametrize("command", HELP)
def test_help_into_a_closed_pipe_is_the_sigpipe_status_even_unbuffered(
    closed_pipe: int, command: list[str]
) -> None:
    """``python -u``: argparse's own write fails at once, and it swallowed that: status 0."""
    result = run(command, closed_pipe, unbuffered=True)
    assert (result.returncode, result.stderr) == (EXIT_BROKEN_PIPE, "")


@needs_dev_full
@pytest.mark.parametrize("command", HELP)
@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
def test_help_into_a_full_disk_says_so_in_one_line(command: list[str], unbuffered: bool) -> None:
    """``--help > /dev/full``: one line, status 4, however the output is buffered."""
    with open("/dev/full", "wb") as full:
        result = run(command, full, unbuffered=unbuffered)
    assert (result.returncode, result.stderr) == (
        EXIT_OUTPUT,
        f"{ERROR}cannot write the output: [Errno 28] No space left on device\n",
    )


@pytest.mark.parametrize("command", HELP)
def test_help_with_stdout_closed_says_so_in_one_line(command: list[str]) -> None:
    """``--help >&-``: one line, status 4, not a traceback."""
    result = run_closed(1, command)
    assert (result.returncode, result.stderr) == (
        EXIT_OUTPUT,
        f"{ERROR}cannot write the output: {CLOSED_STDOUT}\n",
    )


@needs_dev_full
@pytest.mark.parametrize(
    ("command", "done"),
    [
        (["cancel", "2"], "job 2 was cancelled, but this could not be printed"),
        (["purge"], "0 job(s) were purged, but their count could not be printed"),
    ],
    ids=["cancel", "purge"],
)
def test_a_change_whose_confirmation_cannot_be_written_says_it_was_made(
    queue: Path, command: list[str], done: str
) -> None:
    """Every command that changes the queue reports a lost confirmation with what it did."""
    with open("/dev/full", "wb") as full:
        result = run(["--db", str(queue), *command], full)
    assert result.returncode == EXIT_OUTPUT
    assert result.stderr == f"{ERROR}{done}: [Errno 28] No space left on device\n"


@pytest.fixture
def unreachable_url() -> Iterator[str]:
    """A postgresql:// URL whose port refuses connections (bound, never listening)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"postgresql://nobody@127.0.0.1:{sock.getsockname()[1]}/nothing"


def test_status_on_an_unreachable_server_is_one_line(unreachable_url: str) -> None:
    """A one-shot command's failure is its error line, without the retries' warnings."""
    result = run(["--db", unreachable_url, "status"], subprocess.DEVNULL)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(ERROR)
    assert "database unavailable after 5 attempts" in lines[0]


def test_the_worker_still_logs_each_retry_on_an_unreachable_server(unreachable_url: str) -> None:
    """The worker, a long-running process, keeps its warnings: only one-shot commands are quiet."""
    result = run(
        ["--db", unreachable_url, "worker", "--tasks", "patterns.jobqueue.cli.demo_tasks:tasks"],
        subprocess.DEVNULL,
    )
    assert result.returncode == 2
    assert result.stderr.count("retry ") == 4, result.stderr
    assert result.stderr.splitlines()[-1].startswith(ERROR)


# --- a file locked by another connection ----------------------------------------------------

# The CLI in a child with SQLite's busy wait cut from 5 s to 50 ms per attempt, so that the
# store gives up on a locked file after its five attempts in about a second, not 26 s.
SHORT_BUSY_WAIT = """
import sys
import patterns.jobqueue.stores.sqlite.store as sqlite_store
sqlite_store.BUSY_TIMEOUT = 0.05
from patterns.jobqueue.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def run_short_busy_wait(args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run the CLI with a 50 ms busy wait per attempt; stdout and stderr are captured."""
    return subprocess.run(
        [sys.executable, "-c", SHORT_BUSY_WAIT, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=MUST_HAPPEN,
        check=False,
    )


@pytest.fixture
def locked(queue: Path) -> Iterator[Path]:
    """The queue, with another connection holding its write lock (``BEGIN IMMEDIATE``)."""
    conn = sqlite3.connect(queue, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield queue
    finally:
        conn.close()


WRITING = [
    pytest.param(["enqueue", "echo", "{}"], "enqueue", id="enqueue"),
    pytest.param(["workers"], "list the workers", id="workers"),
    pytest.param(["cancel", "1"], "cancel the job", id="cancel"),
    pytest.param(["requeue", "1"], "requeue the job", id="requeue"),
    pytest.param(["purge"], "purge jobs", id="purge"),
]


@pytest.mark.parametrize(("command", "what"), WRITING)
def test_a_command_on_a_locked_file_is_one_line_saying_how_long_it_waited(
    locked: Path, command: list[str], what: str
) -> None:
    """The store's busy retries are not printed; the error names the lock and the wait."""
    result = run_short_busy_wait(["--db", str(locked), *command])
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(f"{ERROR}{locked}: cannot {what}: database is locked (another ")
    assert re.search(r"still held the write lock after \d+\.\d s\)$", line), line


def test_the_worker_still_logs_each_busy_retry_on_a_locked_file(locked: Path) -> None:
    """The worker, a long-running process, logs the retries that one-shot commands keep quiet."""
    worker = subprocess.Popen(
        [sys.executable, "-c", SHORT_BUSY_WAIT, "--db", str(locked), "worker",
         "--tasks", "patterns.jobqueue.cli.demo_tasks:tasks"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )  # fmt: skip
    assert worker.stderr is not None
    seen = ""
    try:
        for line in worker.stderr:  # until its first retry (the test's timeout bounds it)
            if "retry 1 of 4" in line:
                seen = line
                break
    finally:
        worker.kill()
        worker.wait(MUST_HAPPEN)
        worker.stderr.close()
    assert "database busy (database is locked), retry 1 of 4" in seen
