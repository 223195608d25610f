"""The command line's rough edges: careless and hostile input, each one line and exit 2.

Run in-process through `patterns.jobqueue.cli.main.main` (the exit status and stderr a shell
sees), on SQLite files in ``tmp_path``. Where the worker's own behaviour would need a
process or a long wait, the test replaces `Worker` with a stand-in that returns a chosen
`WorkerReport`, so the mapping from report to exit status is checked exactly.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import pytest

from patterns.jobqueue.cli import arguments, demo_tasks, store_access, worker_command
from patterns.jobqueue.cli import main as cli
from patterns.jobqueue.stores.records import DEFAULT_MAX_PAYLOAD_BYTES, Job
from patterns.jobqueue.stores.sqlite.store import SQLiteStore
from patterns.jobqueue.tasks import JobContext
from patterns.jobqueue.worker.worker import Worker, WorkerReport
from tests.support import MUST_HAPPEN, child_env

ERROR = "python -m patterns.jobqueue: error: "


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``python -m patterns.jobqueue ARGS``, in-process: (status, stdout, stderr)."""
    status = cli.main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def assert_refused(result: tuple[int, str, str], *needles: str) -> str:
    """Exit status 2, nothing on stdout, one line on stderr naming the problem; the line."""
    status, out, err = result
    assert status == cli.EXIT_USAGE, (status, out, err)
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith(ERROR), line
    for needle in needles:
        assert needle in line, line
    return line


def job(path: Path, job_id: int) -> Job:
    """The job as the store has it now."""
    store = SQLiteStore(path)
    try:
        found = store.get(job_id)
    finally:
        store.close()
    assert found is not None
    return found


# --- numbers ----------------------------------------------------------------------------------

HUGE = "100000000000000000000"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["enqueue", "t", "--max-attempts", HUGE],
            f"max-attempts must be at most 1000000, got {HUGE}",
        ),
        (["enqueue", "t", "--max-attempts", "1" * 5000], "max-attempts must be at most 1000000"),
        (["enqueue", "t", "--max-attempts", "2.5"], "'2.5' is not a whole number"),
        (["enqueue", "t", "--delay", "nan"], "delay must be a finite number of seconds, got nan"),
        (["enqueue", "t", "--delay", "inf"], "delay must be a finite number of seconds, got inf"),
        (["enqueue", "t", "--delay", "1e300"], "delay must be at most 1e+10 seconds, got 1e300"),
        (["enqueue", "t", "--timeout", "0"], "timeout must be > 0, got 0"),
        (["enqueue", "t", "--timeout", "1e15"], "timeout must be at most 1e+10 seconds"),
        (["worker", "--tasks", "m:t", "--lease", "1e15"], "lease must be at most"),
        (["worker", "--tasks", "m:t", "--poll-interval", "1e15"], "poll-interval must be at most"),
        (["worker", "--tasks", "m:t", "--watch-interval", "-1"], "watch-interval must be >= 0"),
        (
            ["worker", "--tasks", "m:t", "--poll-interval", "1e-9"],
            (
                "poll-interval must be at least 0.01 seconds (less keeps an idle worker's CPU "
                "busy), got 1e-9"
            ),
        ),
        (
            ["worker", "--tasks", "m:t", "--poll-interval", "0.0099"],
            "poll-interval must be at least 0.01 seconds",
        ),
        (
            ["worker", "--tasks", "m:t", "--watch-interval", "1e-9"],
            (
                "watch-interval must be 0 (off) or at least 0.001 seconds (less keeps an idle "
                "worker's CPU busy), got 1e-9"
            ),
        ),
        (
            ["worker", "--tasks", "m:t", "--watch-interval", "nan"],
            "watch-interval must be a finite",
        ),
        (["worker", "--tasks", "m:t", "--stop-timeout", "1e15"], "stop-timeout must be at most"),
        (["worker", "--tasks", "m:t", "--stop-timeout", "nan"], "stop-timeout must be a finite"),
        (["worker", "--tasks", "m:t", "--concurrency", "100000"], "concurrency must be at most"),
        (["worker", "--tasks", "m:t", "--prefetch", "-1"], "prefetch must be at least 0, got -1"),
        (["worker", "--tasks", "m:t", "--prefetch", "1001"], "prefetch must be at most 1000"),
        (["show", str(2**63)], f"job id must be at most {2**63 - 1}"),
        (["cancel", "0"], "job id must be at least 1, got 0"),
        (["list", "--limit", "0"], "limit must be at least 1"),
        (["purge", "--older-than", "-1"], "older-than must be >= 0, got -1"),
    ],
)
def test_numbers_out_of_range_are_refused_in_one_line_before_anything_is_opened(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    """Huge, infinite, NaN or too-small numbers: exit 2 naming the option and the bound."""
    db = tmp_path / "q.db"
    assert_refused(run_cli(capsys, "--db", str(db), *args), needle)
    assert not db.exists()


SECONDS = {
    "delay",
    "timeout",
    "stop_timeout",
    "poll_interval",
    "watch_interval",
    "lease",
    "older_than",
}


def test_every_option_that_takes_a_value_says_its_default_and_times_say_seconds() -> None:
    """``--help`` of each command: every optional value names its default, and its unit."""
    parser = arguments.build_parser()
    [commands] = [a for a in parser._actions if a.dest == "command"]
    checked = 0
    for sub in [parser, *cast(dict[str, Any], commands.choices).values()]:
        for action in sub._actions:
            if not action.option_strings or action.nargs == 0 or action.required:
                continue  # help, flags, and --tasks of the worker (no default to state)
            text = " ".join((action.help or "").split())
            assert "default" in text, (sub.prog, action.option_strings, text)
            if action.dest in SECONDS:
                assert "second" in text, (sub.prog, action.option_strings, text)
            checked += 1
    assert checked >= 25


def test_exit_when_empty_says_what_it_does_with_jobs_due_later() -> None:
    """A retry waiting out its backoff does not keep the worker: the help says so."""
    parser = arguments.build_parser()
    [commands] = [a for a in parser._actions if a.dest == "command"]
    worker = cast(dict[str, Any], commands.choices)["worker"]
    [flag] = [a for a in worker._actions if a.dest == "exit_when_empty"]
    text = " ".join((flag.help or "").split())
    assert "retry" in text
    assert "stay queued" in text
    assert "running in any worker" in text


# --- which queue ------------------------------------------------------------------------------


def test_db_is_accepted_after_the_command_and_from_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--db`` before or after the command, or ``$JOBQUEUE_DB``; the command line wins."""
    first, second = tmp_path / "a.db", tmp_path / "b.db"
    assert run_cli(capsys, "enqueue", "t", "--db", str(first))[:2] == (0, "1\n")
    monkeypatch.setenv("JOBQUEUE_DB", str(second))
    assert run_cli(capsys, "enqueue", "t")[:2] == (0, "1\n")
    assert run_cli(capsys, "enqueue", "t")[:2] == (0, "2\n")
    assert run_cli(capsys, "--db", str(first), "enqueue", "t")[:2] == (0, "2\n")
    status, out, _ = run_cli(capsys, "status", "--json", "--db", str(first))
    assert (status, json.loads(out)["queued"]) == (0, 2)
    monkeypatch.delenv("JOBQUEUE_DB")
    assert_refused(run_cli(capsys, "status"), "--db", "JOBQUEUE_DB")


READERS = [
    ["status"],
    ["status", "--json"],
    ["show", "1"],
    ["list"],
    ["workers"],
    ["requeue", "1"],
    ["cancel", "1"],
    ["purge"],
]


@pytest.mark.parametrize("args", READERS, ids=" ".join)
def test_a_queue_that_does_not_exist_is_not_created_by_commands_that_only_inspect_or_change_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    """Exit 2 with "no such queue: PATH", and no file; a dangling symlink is not followed."""
    missing = tmp_path / "typo.db"
    assert_refused(run_cli(capsys, "--db", str(missing), *args), f"no such queue: {missing}")
    link = tmp_path / "link.db"
    link.symlink_to(tmp_path / "target.db")
    assert_refused(run_cli(capsys, "--db", str(link), *args), "no such queue")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.db"]


@contextmanager
def not_a_file(kind: str, path: Path) -> Iterator[None]:
    """``path`` made a FIFO, a listening Unix socket, or a symlink to a character device."""
    if kind == "fifo":
        os.mkfifo(path)
        yield
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(str(path))
            server.listen()
            yield
    else:
        path.symlink_to(os.devnull)
        yield


@pytest.mark.parametrize("kind", ["fifo", "socket", "device"])
@pytest.mark.parametrize(
    "args",
    [["status"], ["enqueue", "t"], ["worker", "--tasks", "patterns.jobqueue.cli.demo_tasks:tasks"]],
    ids=lambda args: args[0],
)
def test_a_db_that_is_a_fifo_socket_or_device_is_refused_without_blocking(
    tmp_path: Path, kind: str, args: list[str]
) -> None:
    """Not a queue file: one line, exit 2, at once; a FIFO is never opened for reading."""
    db = tmp_path / "q.db"
    with not_a_file(kind, db):
        result = subprocess.run(
            [sys.executable, "-m", "patterns.jobqueue", "--db", str(db), *args],
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=MUST_HAPPEN,  # it used to block in open() for ever
            check=False,
        )
    assert (result.returncode, result.stdout) == (cli.EXIT_USAGE, "")
    name = {"fifo": "a FIFO", "socket": "a socket", "device": "a character device"}[kind]
    assert result.stderr == f"{ERROR}{db}: not a queue file: it is {name}\n"


@pytest.mark.parametrize("db", [":memory:", "file::memory:", "file:q?mode=memory", "file:q.db"])
@pytest.mark.parametrize("args", [["enqueue", "t"], ["worker", "--tasks", "m:t"], *READERS[:4]])
def test_an_in_memory_database_or_an_sqlite_uri_is_refused_for_every_command(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    db: str,
    args: list[str],
) -> None:
    """The job would vanish with the process: refused, whatever the command."""
    monkeypatch.chdir(tmp_path)
    line = assert_refused(run_cli(capsys, "--db", db, *args), db)
    assert "memory" in line or "URI" in line
    assert list(tmp_path.iterdir()) == []


@contextmanager
def immutable(path: Path) -> Iterator[None]:
    """Make ``path`` unwritable, even for root (``chattr +i``), for the block; else skip."""
    if os.geteuid() != 0:
        path.chmod(0o400)
        try:
            yield
        finally:
            path.chmod(0o600)
        return
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("running as root and chattr is missing: no way to make a file read-only")
    made = subprocess.run([chattr, "+i", str(path)], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"running as root and chattr +i is refused here: {made.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(path)], check=True)


def test_a_read_only_queue_is_refused_in_one_line_by_every_command_and_left_unchanged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file that cannot be written (WAL needs to, even to read): exit 2 naming it, no change."""
    db = tmp_path / "q.db"
    assert run_cli(capsys, "--db", str(db), "enqueue", "t")[0] == 0
    before = db.read_bytes()
    with immutable(db):
        for command in (["enqueue", "t"], ["status"], ["list"], ["cancel", "1"]):
            assert_refused(run_cli(capsys, "--db", str(db), *command), str(db), "read-only")
    assert db.read_bytes() == before


def test_a_worker_on_a_read_only_queue_is_refused_in_one_line_instead_of_looping(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before the worker starts: exit 2 and the reason; with --exit-when-empty it never exits 0.

    A child process, as a shell runs it (the worker installs signal handlers). A store
    that becomes unusable after the worker opened it is the worker's outage limit:
    ``test_the_worker_exit_status_matches_its_report`` maps its report to status 1.
    """
    db = tmp_path / "q.db"
    assert run_cli(capsys, "--db", str(db), "enqueue", "fast")[0] == 0
    command = [
        *("--db", str(db), "worker", "--tasks", "patterns.jobqueue.cli.demo_tasks:tasks"),
        *("--exit-when-empty", "--poll-interval", "0.05", "--store-outage-limit", "0.5"),
    ]
    with immutable(db):
        result = subprocess.run(
            [sys.executable, "-m", "patterns.jobqueue", *command],
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=MUST_HAPPEN * 3,
            check=False,
        )
    assert (result.returncode, result.stdout) == (cli.EXIT_USAGE, ""), result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith(ERROR)
    assert "read-only" in line
    assert job(db, 1).state.value == "queued"  # nothing was claimed, nothing lost


# --- the payload ------------------------------------------------------------------------------


def test_the_payload_comes_from_stdin_or_a_file_and_bad_json_names_where_it_came_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``enqueue TASK -`` reads stdin, ``--payload-file`` a file; errors say which."""
    db = str(tmp_path / "q.db")
    big = {"blob": "x" * (DEFAULT_MAX_PAYLOAD_BYTES // 2)}  # far past what argv should carry
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(json.dumps(big).encode())))
    assert run_cli(capsys, "--db", db, "enqueue", "t", "-")[:2] == (0, "1\n")
    assert job(tmp_path / "q.db", 1).payload == big
    payload_file = tmp_path / "p.json"
    payload_file.write_text('{"n": [1, 2]}\n')
    assert run_cli(capsys, "--db", db, "enqueue", "t", "--payload-file", str(payload_file))[0] == 0
    assert job(tmp_path / "q.db", 2).payload == {"n": [1, 2]}

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"{oops")))
    assert_refused(run_cli(capsys, "--db", db, "enqueue", "t", "-"), "invalid JSON", "from stdin")
    payload_file.write_text("[1,")
    assert_refused(
        run_cli(capsys, "--db", db, "enqueue", "t", "--payload-file", str(payload_file)),
        "invalid JSON",
        f"from --payload-file {payload_file}",
    )
    payload_file.write_bytes(b'"\xff"')
    assert_refused(
        run_cli(capsys, "--db", db, "enqueue", "t", "--payload-file", str(payload_file)),
        "not UTF-8",
    )
    assert_refused(
        run_cli(capsys, "--db", db, "enqueue", "t", "--payload-file", str(tmp_path / "nope")),
        "cannot read --payload-file",
        "No such file",
    )
    assert_refused(
        run_cli(capsys, "--db", db, "enqueue", "t", "1", "--payload-file", str(payload_file)),
        "not both",
    )
    payload_file.write_text(json.dumps("y" * DEFAULT_MAX_PAYLOAD_BYTES))
    assert_refused(
        run_cli(capsys, "--db", db, "enqueue", "t", "--payload-file", str(payload_file)),
        f"over the limit of {DEFAULT_MAX_PAYLOAD_BYTES} bytes",
    )
    assert_refused(run_cli(capsys, "--db", db, "enqueue", "t", "[" * 100_000), "invalid JSON")
    out = run_cli(capsys, "--db", db, "status", "--json")[1]
    assert json.loads(out)["queued"] == 2  # nothing refused was written


@pytest.mark.parametrize("source", ["argument", "stdin", "file"])
def test_a_payload_that_is_not_utf8_is_refused_wherever_it_comes_from(
    tmp_path: Path, source: str
) -> None:
    """The same bytes on the command line, on stdin or in a file: one line, exit 2, no job.

    Python hands an argument that is not UTF-8 over as surrogate escapes, which used to
    be stored as they were.
    """
    data = b'"caf\xe9"'  # Latin-1, not UTF-8
    (tmp_path / "p.json").write_bytes(data)
    sources: dict[str, list[str | bytes]] = {
        "argument": [data],
        "stdin": ["-"],
        "file": ["--payload-file", "p.json"],
    }
    payload = sources[source]
    where = {"argument": "the command line", "stdin": "stdin", "file": "--payload-file p.json"}
    result = subprocess.run(
        [sys.executable, "-m", "patterns.jobqueue", "--db", "q.db", "enqueue", "t", *payload],
        cwd=tmp_path,
        input=data,
        capture_output=True,
        env=child_env(),
        timeout=MUST_HAPPEN,
        check=False,
    )
    assert (result.returncode, result.stdout) == (cli.EXIT_USAGE, b"")
    assert result.stderr.decode() == (
        f"{ERROR}the payload from {where[source]} is not UTF-8 text: 'utf-8' codec can't "
        "decode byte 0xe9 in position 4: invalid continuation byte\n"
    )
    assert not (tmp_path / "q.db").exists()


def test_the_payload_limit_counts_the_utf8_bytes_wc_counts_in_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """400,013 bytes of Cyrillic are taken; a file of 1 MiB + 2 bytes is refused, quoting that."""
    db = str(tmp_path / "q.db")
    payload_file = tmp_path / "p.json"
    payload = {"text": "\u0436" * 200_000}
    payload_file.write_text(json.dumps(payload, ensure_ascii=False) + "\n", encoding="utf-8")
    assert payload_file.stat().st_size == 400_013  # what `wc -c p.json` prints
    assert run_cli(capsys, "--db", db, "enqueue", "t", "--payload-file", str(payload_file))[0] == 0
    assert job(tmp_path / "q.db", 1).payload == payload
    over = json.dumps("\u0436" * (DEFAULT_MAX_PAYLOAD_BYTES // 2), ensure_ascii=False)
    payload_file.write_text(over, encoding="utf-8")
    size = payload_file.stat().st_size
    assert size == DEFAULT_MAX_PAYLOAD_BYTES + 2
    assert_refused(
        run_cli(capsys, "--db", db, "enqueue", "t", "--payload-file", str(payload_file)),
        f"is {size} bytes of UTF-8",
        f"over the limit of {DEFAULT_MAX_PAYLOAD_BYTES} bytes",
    )


# --- enqueue with the registry ----------------------------------------------------------------

TASKS_MODULE = """
from patterns.jobqueue.tasks import TaskRegistry

tasks = TaskRegistry()

@tasks.task(max_attempts=7, timeout=12.5)
def patient(payload, ctx):
    return None
"""


def test_enqueue_with_tasks_uses_the_tasks_defaults_and_warns_about_an_unknown_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registered max_attempts and timeout by default, the command line's when given."""
    (tmp_path / "edge_tasks.py").write_text(textwrap.dedent(TASKS_MODULE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with_tasks = ["--db", "q.db", "enqueue", "--tasks", "edge_tasks:tasks"]
    assert run_cli(capsys, *with_tasks, "patient") == (0, "1\n", "")
    assert run_cli(capsys, *with_tasks, "patient", "--max-attempts", "2", "--timeout", "3")[:2] == (
        0,
        "2\n",
    )
    status, out, err = run_cli(capsys, *with_tasks, "patinet")
    assert (status, out) == (0, "3\n")
    [warning] = err.splitlines()
    assert warning.startswith("python -m patterns.jobqueue: warning: task 'patinet' is not in")
    assert "registered: patient" in warning
    assert [job(tmp_path / "q.db", n).max_attempts for n in (1, 2, 3)] == [7, 2, 3]
    assert [job(tmp_path / "q.db", n).timeout for n in (1, 2, 3)] == [12.5, 3.0, None]
    assert_refused(run_cli(capsys, *with_tasks[:-1], "nosuch:tasks", "patient"), "cannot import")


# --- the worker's exit status, read from its report ---------------------------------------------


class ReportingWorker:
    """Stands in for `Worker`: ``run()`` returns the report the test chose."""

    report: WorkerReport

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def run(self) -> WorkerReport:
        """The chosen report, at once."""
        return self.report


class Exited(Exception):
    """What the stand-in `force_exit` raises instead of ending the test process."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


@pytest.mark.parametrize(
    ("report", "expected"),
    [
        (WorkerReport(terminated=True, still_running=(), worker="w"), 0),
        (WorkerReport(False, ("job 4",), "w", still_running_ids=(4,)), 3),
        # A worker thread did not end, with no job running and no store call given up.
        (WorkerReport(terminated=False, still_running=(), worker="w"), 1),
        (WorkerReport(True, (), "w", failure="the store failed every claim for 60 s"), 1),
        # The stop gave up on a store that did not answer (a locked file).
        (WorkerReport(False, (), "w", store_gave_up=2), 5),
        (WorkerReport(False, ("job 4",), "w", still_running_ids=(4,), store_gave_up=1), 3),
    ],
    ids=[
        "clean",
        "jobs-still-running",
        "stuck-without-jobs",
        "store-unusable",
        "store-blocked",
        "store-blocked-and-jobs-still-running",
    ],
)
def test_the_worker_exit_status_matches_its_report(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    report: WorkerReport,
    expected: int,
) -> None:
    """3 only when the report names jobs still running; a blocked store 5; a stuck thread 1."""
    ReportingWorker.report = report
    monkeypatch.setattr(worker_command, "Worker", ReportingWorker)

    def force_exit(status: int, reason: str = "") -> None:
        raise Exited(status)

    monkeypatch.setattr(worker_command, "force_exit", force_exit)
    tasks = "patterns.jobqueue.cli.demo_tasks:tasks"
    try:
        status = cli.main(["--db", str(tmp_path / "q.db"), "worker", "--tasks", tasks])
    except Exited as exc:
        status = exc.status
    assert status == expected


# --- the demo's handlers ---------------------------------------------------------------------


class Context:
    """The little of `JobContext` the demo handlers read."""

    attempt = 2

    def sleep(self, seconds: float) -> None:
        """A checkpoint that is never cancelled, and takes no time."""


def test_the_demo_handlers_accept_the_default_null_payload() -> None:
    """``enqueue slow`` with no payload sends null: the handlers take their defaults."""
    ctx = cast(JobContext, Context())
    assert demo_tasks.slow({"seconds": 0}, ctx) == "slow done"
    assert demo_tasks.slow(None, cast(JobContext, Context())) == "slow done"  # 0.5 s
    assert demo_tasks.crunch(None, ctx) == 20
    assert demo_tasks.flaky(None, ctx) == "succeeded on attempt 2"
    with pytest.raises(TypeError, match="must be a JSON object or null"):
        demo_tasks.slow([1], ctx)


@pytest.mark.parametrize(
    ("given", "expected"),
    [([], None), (["--watch-interval", "0"], 0.0), (["--watch-interval", "0.001"], 0.001)],
)
def test_the_worker_gives_its_watch_interval_to_the_sqlite_store(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    given: list[str],
    expected: float | None,
) -> None:
    """``--watch-interval`` reaches `SQLiteStore` (the default is the store's own default)."""
    from patterns.jobqueue.stores.sqlite.store import WATCH_INTERVAL  # noqa: PLC0415

    seen: list[object] = []

    class Spy(SQLiteStore):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            seen.append(kwargs.get("watch_interval"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(store_access, "SQLiteStore", Spy)
    db = str(tmp_path / "q.db")
    worker = ["worker", "--tasks", "patterns.jobqueue.cli.demo_tasks:tasks", "--exit-when-empty"]
    code, _, err = run_cli(capsys, "--db", db, *worker, *given)
    assert code == 0, err
    assert seen == [WATCH_INTERVAL if expected is None else expected]


def test_the_idle_intervals_accept_their_floor_and_the_help_names_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The floors are the smallest values accepted, and the help says what they are."""
    worker = ["--db", "q.db", "worker", "--tasks", "m:t"]
    args = arguments.build_parser().parse_args([*worker, "--poll-interval", "0.01"])
    assert args.poll_interval == 0.01
    with pytest.raises(SystemExit):
        cli.main(["worker", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "looks for due jobs again, at least 0.01 (default: 1)" in text
    assert "0 turns it off, else at least 0.001 (default: 0.015;" in text


@pytest.mark.parametrize(
    ("given", "expected"), [([], None), (["--prefetch", "0"], 0), (["--prefetch", "3"], 3)]
)
def test_the_worker_gives_its_prefetch_to_the_worker(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    given: list[str],
    expected: int | None,
) -> None:
    """``--prefetch`` reaches `Worker` (absent: None, the API's default), which runs with it."""
    seen: list[object] = []

    class Spy(Worker):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            seen.append(kwargs.get("prefetch"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(worker_command, "Worker", Spy)
    db = str(tmp_path / "q.db")
    worker = ["worker", "--tasks", "patterns.jobqueue.cli.demo_tasks:tasks", "--exit-when-empty"]
    code, _, err = run_cli(capsys, "--db", db, *worker, *given)
    assert code == 0, err
    assert seen == [expected]


def test_the_watch_interval_help_names_the_back_off(capsys: pytest.CaptureFixture[str]) -> None:
    """The help says when the looks slow down and how far, from the watcher's own constants."""
    from patterns.jobqueue.stores.sqlite.watch import WATCH_IDLE_INTERVAL, WATCH_QUIET  # noqa: PLC0415

    with pytest.raises(SystemExit):
        cli.main(["worker", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"after {WATCH_QUIET:g} s without one, it looks less often, " in text
    assert f"up to {WATCH_IDLE_INTERVAL:g} s apart (or this, if longer)" in text


def test_the_command_line_loads_psycopg_only_for_a_postgresql_queue() -> None:
    """Importing psycopg costs a process about 30 ms at exit: a SQLite worker never pays it.

    Measured with ``benchmarks/jobqueue_latency.py`` (SIGTERM to exit of the CLI worker).
    """
    code = "import sys; from patterns.jobqueue import cli; print('psycopg' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=MUST_HAPPEN,
        check=True,
    )
    assert result.stdout.strip() == "False", result.stderr
