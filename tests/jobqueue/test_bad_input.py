"""Bad input, each refused with an error naming the problem, with nothing lost or half-written.

The library calls are made on both stores; the command line is run in-process through
`patterns.jobqueue.cli.main.main` (exit status and stderr, exactly as a shell sees them), and
in a child process where the process itself is the point (a handler calling ``sys.exit``).
Files are compared byte for byte before and after a refusal.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from patterns.jobqueue.cli import main as cli
from patterns.jobqueue.stores.checks import check_text, encode_payload
from patterns.jobqueue.stores.memory import MemoryStore
from patterns.jobqueue.stores.protocol import Store
from patterns.jobqueue.stores.records import MAX_ERROR_CHARS, JobState
from patterns.jobqueue.stores.sqlite.store import SCHEMA_VERSION, SQLiteStore, StoreFileError
from patterns.jobqueue.tasks import Backoff, PhaseError, TaskRegistry
from patterns.jobqueue.worker.worker import Worker
from tests.support import MUST_HAPPEN, child_env, join_or_fail, run_in_thread

EMPTY = {"queued": 0, "running": 0, "done": 0, "failed": 0, "cancelled": 0}


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Each store in turn."""
    made: Store = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "q.db")
    yield made
    made.close()


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``python -m patterns.jobqueue ARGS``, in-process: (status, stdout, stderr)."""
    status = cli.main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def assert_refused(result: tuple[int, str, str], *needles: str) -> None:
    """Exit status 2 and one line on stderr that names the problem."""
    status, out, err = result
    assert status == cli.EXIT_USAGE, (status, out, err)
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith("python -m patterns.jobqueue: error: ")
    for needle in needles:
        assert needle in line, line


def run_until_empty(worker: Worker) -> None:
    """Run a worker (exit_when_empty) in a thread until it stops by itself."""
    thread, outcome = run_in_thread(worker.run, "worker-main")
    join_or_fail(thread)
    assert "error" not in outcome, outcome
    assert outcome["result"].terminated, outcome["result"].summary()


def quick_worker(store: Store, tasks: TaskRegistry) -> Worker:
    """A worker that runs what is due and stops."""
    return Worker(store, tasks, concurrency=2, poll_interval=0.02, exit_when_empty=True)


def a_store_file(path: Path, jobs: int = 200) -> bytes:
    """A closed job store with ``jobs`` queued jobs (checkpointed: no -wal); its bytes."""
    made = SQLiteStore(path)
    made.enqueue_many([{"task": "t", "payload": {"n": n, "pad": "x" * 200}} for n in range(jobs)])
    made.close()
    assert not Path(f"{path}-wal").exists()
    return path.read_bytes()


def sidecars(path: Path) -> list[str]:
    """The journal files SQLite would create beside ``path``, if any exist."""
    return [s for s in ("-wal", "-shm", "-journal") if Path(f"{path}{s}").exists()]


# --- payloads and arguments ----------------------------------------------------------------------


class Circular(list[Any]):
    """A list that contains itself: json.dumps detects the loop."""


def circular() -> Circular:
    """A payload json.dumps refuses for its loop."""
    loop = Circular()
    loop.append(loop)
    return loop


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        (object(), "Object of type object"),
        ({1, 2}, "Object of type set"),
        (b"bytes", "Object of type bytes"),
        (math.nan, "Out of range float"),
        ({"x": math.inf}, "Out of range float"),
        ({(1, 2): "tuple key"}, "keys must be str"),
        (circular(), "Circular reference"),
    ],
    ids=["object", "set", "bytes", "nan", "inf", "tuple-key", "circular"],
)
def test_a_payload_that_is_not_json_is_refused_and_nothing_is_written(
    store: Store, payload: object, needle: str
) -> None:
    """Enqueue raises TypeError naming JSON and the reason; the store is unchanged."""
    with pytest.raises(TypeError, match="JSON-serialisable") as caught:
        store.enqueue("t", payload)
    assert needle in str(caught.value)
    assert store.counts() == EMPTY


def test_one_bad_job_in_a_batch_refuses_the_whole_batch(store: Store) -> None:
    """enqueue_many is one transaction: a bad third job means no job at all, and it is named."""
    jobs = [{"task": "t", "payload": 1}, {"task": "t", "payload": 2}, {"task": "t", "payload": {3}}]
    with pytest.raises(TypeError, match="job #2"):
        store.enqueue_many(jobs)
    assert store.counts() == EMPTY


@pytest.mark.parametrize(
    ("kwargs", "error", "needle"),
    [
        ({"max_attempts": 0}, ValueError, "max_attempts must be between 1 and 1000000, got 0"),
        ({"max_attempts": -3}, ValueError, "max_attempts must be between 1 and 1000000, got -3"),
        ({"max_attempts": 10**20}, ValueError, "max_attempts must be between 1 and 1000000"),
        ({"delay": 1e15}, ValueError, "delay must be within 1e\\+10 seconds"),
        ({"delay": 10**400}, ValueError, "delay must be finite"),
        ({"run_at": -1e300}, ValueError, "run_at must be within"),
        ({"timeout": 1e15}, ValueError, "timeout must be within"),
        ({"timeout": -1}, ValueError, "timeout must be positive"),
        ({"max_attempts": 1.5}, TypeError, "max_attempts must be an int"),
        ({"max_attempts": True}, TypeError, "max_attempts must be an int"),
        ({"delay": -1}, ValueError, "delay must not be negative"),
        ({"delay": math.nan}, ValueError, "delay must be finite"),
        ({"delay": math.inf}, ValueError, "delay must be finite"),
        ({"delay": "soon"}, TypeError, "delay must be a number"),
        ({"run_at": math.nan}, ValueError, "run_at must be finite"),
        ({"run_at": 1.0, "delay": 1.0}, ValueError, "not both"),
    ],
)
def test_bad_attempts_and_delays_are_refused_naming_the_argument(
    store: Store, kwargs: dict[str, Any], error: type[Exception], needle: str
) -> None:
    """Attempts or times out of range, absurd or of the wrong type: refused, nothing written."""
    with pytest.raises(error, match=needle):
        store.enqueue("t", None, **kwargs)
    assert store.counts() == EMPTY


def test_the_registry_refuses_max_attempts_below_one_and_unknown_tasks(store: Store) -> None:
    """A task with max_attempts=0, or an enqueue of a name nobody registered, writes nothing."""
    tasks = TaskRegistry()
    with pytest.raises(ValueError, match="max_attempts must be at least 1"):
        tasks.task(name="zero", max_attempts=0)(lambda payload, ctx: None)
    tasks.task(name="known")(lambda payload, ctx: None)
    with pytest.raises(LookupError, match=r"unknown task 'nope'; registered: \['known'\]"):
        tasks.enqueue(store, "nope")
    with pytest.raises(ValueError, match="max_attempts must be between 1 and 1000000"):
        tasks.enqueue(store, "known", max_attempts=0)
    assert store.counts() == EMPTY


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["enqueue", "t", "{not json"], "invalid JSON payload '{not json'"),
        (["enqueue", "t", "[1, 2"], "invalid JSON payload"),
        (["enqueue", "t", "NaN"], "JSON-serialisable"),
        (["enqueue", "t", "--max-attempts", "0"], "must be at least 1, got 0"),
        (["enqueue", "t", "--max-attempts", "-1"], "must be at least 1, got -1"),
        (["enqueue", "t", "--delay", "-1"], "delay must be >= 0, got -1"),
        (["enqueue", "t", "--delay", "nan"], "delay must be a finite number of seconds, got nan"),
        (["enqueue", "t", "--delay", "soon"], "'soon' is not a number of seconds"),
        (["worker", "--tasks", "m:t", "--stop-timeout", "-1"], "stop-timeout must be >= 0"),
        # One name for the budget: the old spelling is not an alias.
        (["worker", "--tasks", "m:t", "--shutdown-timeout", "5"], "unrecognized arguments"),
    ],
)
def test_bad_command_line_input_exits_2_and_does_not_even_create_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    """Invalid JSON, max-attempts <= 0, a negative delay or budget: one line, status 2, no file."""
    db = tmp_path / "q.db"
    assert_refused(run_cli(capsys, "--db", str(db), *args), needle)
    assert not db.exists()


# --- handlers ------------------------------------------------------------------------------------


class Unprintable(Exception):
    """An exception whose str() itself raises (a broken __str__ in someone's library)."""

    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class Custom(BaseException):
    """A BaseException that is neither Exception nor SystemExit nor KeyboardInterrupt."""


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (SystemExit(3), "SystemExit: 3"),
        (KeyboardInterrupt(), "KeyboardInterrupt: "),
        (Custom("from a handler"), "Custom: from a handler"),
        (Unprintable(), "Unprintable: <str() of this Unprintable raised>"),
    ],
    ids=["SystemExit", "KeyboardInterrupt", "BaseException", "broken-str"],
)
def test_a_handler_raising_anything_fails_its_job_and_the_worker_thread_lives_on(
    store: Store, error: BaseException, text: str
) -> None:
    """SystemExit, KeyboardInterrupt or a BaseException in a handler is a job failure, no more.

    The thread that ran it survives (no thread failure, nothing reaches
    `threading.excepthook`), the job ends failed with the error's name and text, and the
    next job runs. Before the fix, an exception whose ``str()`` raised killed the thread
    while the worker formatted it, and left its job leased.
    """
    tasks = TaskRegistry()

    @tasks.task(max_attempts=1)
    def bad(payload: Any, ctx: Any) -> None:
        raise error

    tasks.task(name="good")(lambda payload, ctx: "fine")
    bad_id = tasks.enqueue(store, "bad")
    good_id = tasks.enqueue(store, "good")
    worker = quick_worker(store, tasks)
    run_until_empty(worker)
    report = worker.stop()
    assert report.thread_failures == ()
    bad_job, good_job = store.get(bad_id), store.get(good_id)
    assert bad_job is not None
    assert good_job is not None
    assert (bad_job.state, bad_job.attempts) == (JobState.FAILED, 1)
    assert bad_job.last_error is not None
    assert text in bad_job.last_error
    assert good_job.state is JobState.DONE


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Each store in turn, PostgreSQL included (on a fresh schema)."""
    made: Store
    if request.param == "memory":
        made = MemoryStore()
    elif request.param == "sqlite":
        made = SQLiteStore(tmp_path / "q.db")
    else:
        from patterns.jobqueue.stores.postgres.store import PostgresStore  # noqa: PLC0415 - optional

        dsn = request.getfixturevalue("pg_dsn")
        made = PostgresStore(dsn, schema=request.getfixturevalue("pg_schema"))
    yield made
    made.close()


UNSTORABLE = {"lone-surrogate": "\ud800", "nul": "a\x00b", "huge": "e" * 100_000}


@pytest.mark.parametrize("payload", list(UNSTORABLE.values()), ids=list(UNSTORABLE))
def test_an_error_text_no_store_could_keep_as_is_still_ends_the_job_failed_in_its_attempts(
    any_store: Store, payload: str
) -> None:
    """A handler's error quoting a lone surrogate, a NUL or 100 kB is stored, escaped and cut.

    Before the fix SQLite raised UnicodeEncodeError and PostgreSQL DataError when the
    outcome was recorded, the worker gave the attempt back, and the job ran again at once,
    forever. Now each attempt is recorded: two runs, then failed.
    """
    tasks = TaskRegistry()
    runs: list[None] = []

    @tasks.task(max_attempts=2, retry=Backoff(base=0, jitter=0))
    def echo_error(job_payload: Any, ctx: Any) -> None:
        runs.append(None)
        if len(runs) > 10:  # the old hot loop: end it, and let the assertions say why
            return
        raise ValueError(f"bad {job_payload}")

    job_id = tasks.enqueue(any_store, "echo_error", payload)
    run_until_empty(quick_worker(any_store, tasks))
    job = any_store.get(job_id)
    assert job is not None
    assert len(runs) == 2
    assert (job.state, job.attempts) == (JobState.FAILED, 2)
    assert job.last_error is not None
    assert job.last_error.startswith("ValueError: bad ")
    assert len(job.last_error) <= MAX_ERROR_CHARS


def test_a_handler_calling_sys_exit_does_not_end_the_worker_process(tmp_path: Path) -> None:
    """In the real worker process, sys.exit(3) in a handler fails that job; the process goes on."""
    (tmp_path / "exiting.py").write_text(
        textwrap.dedent(
            """
            import sys
            from patterns.jobqueue.tasks import TaskRegistry
            tasks = TaskRegistry()

            @tasks.task(max_attempts=1)
            def quits(payload, ctx):
                sys.exit(3)

            @tasks.task
            def fine(payload, ctx):
                print("fine ran", flush=True)
            """
        )
    )
    db = tmp_path / "q.db"
    made = SQLiteStore(db)
    quits, fine = made.enqueue_many([{"task": "quits", "max_attempts": 1}, {"task": "fine"}])
    made.close()
    result = subprocess.run(
        [
            *(sys.executable, "-m", "patterns.jobqueue", "--db", str(db), "worker"),
            *("--tasks", "exiting:tasks", "--poll-interval", "0.02", "--exit-when-empty"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=MUST_HAPPEN * 3,
        check=False,
    )
    assert result.returncode == 0, result.stderr  # not 3: the handler's exit ended a job
    assert result.stdout == "fine ran\n"
    made = SQLiteStore(db)
    try:
        failed, done = made.get(quits), made.get(fine)
    finally:
        made.close()
    assert failed is not None
    assert done is not None
    assert failed.state is JobState.FAILED
    assert failed.last_error == "SystemExit: 3 (attempt 1 of 1: none left)"
    assert done.state is JobState.DONE


def test_a_handler_returning_something_unserialisable_is_done_results_are_not_stored(
    store: Store,
) -> None:
    """Results are handed to on_complete as they are, never stored, so nothing can fail there."""
    lock = threading.Lock()
    results: list[object] = [object(), {1, 2}, lock, lambda: None, (n for n in range(3))]
    seen: list[object] = []
    tasks = TaskRegistry(on_complete=lambda job, result: seen.append(result))
    tasks.task(name="odd")(lambda payload, ctx: results[payload])
    ids = [tasks.enqueue(store, "odd", n) for n in range(len(results))]
    run_until_empty(quick_worker(store, tasks))
    assert {store.get(i).state for i in ids} == {JobState.DONE}  # type: ignore[union-attr]
    assert sorted(map(id, seen)) == sorted(map(id, results))


def test_an_unknown_task_in_the_queue_fails_once_with_its_name_and_is_never_run(
    store: Store,
) -> None:
    """A job for a task this worker does not know ends failed, named; the others still run."""
    tasks = TaskRegistry()
    tasks.task(name="known")(lambda payload, ctx: None)
    unknown = store.enqueue("no_such_task", max_attempts=5)
    known = store.enqueue("known")
    run_until_empty(quick_worker(store, tasks))
    job = store.get(unknown)
    assert job is not None
    assert (job.state, job.attempts) == (JobState.FAILED, 1)
    assert job.last_error == "unknown task 'no_such_task': no handler registered under that name"
    assert store.get(known).state is JobState.DONE  # type: ignore[union-attr]


# --- the database path and file ------------------------------------------------------------------


def test_a_path_in_a_missing_directory_is_refused_and_no_directory_is_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """StoreFileError naming the path; the CLI exits 2; the directory is not created."""
    path = tmp_path / "missing" / "q.db"
    with pytest.raises(StoreFileError, match="No such file or directory") as caught:
        SQLiteStore(path)
    assert str(path) in str(caught.value)
    assert_refused(run_cli(capsys, "--db", str(path), "enqueue", "t"), str(path))
    assert_refused(run_cli(capsys, "--db", str(path), "status"), str(path))
    assert not path.parent.exists()


@contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """Make ``directory`` unwritable, even for root, for the duration of the block.

    Permission bits do not stop root (CI runs as root). The immutable attribute does:
    ``chattr +i`` needs CAP_LINUX_IMMUTABLE and a file system that supports it (ext4,
    xfs, btrfs; not tmpfs or overlayfs), so where it is unavailable the test is skipped.
    """
    if os.geteuid() != 0:
        directory.chmod(0o500)
        try:
            yield
        finally:
            directory.chmod(0o700)
        return
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("running as root and chattr is missing: no way to make a directory read-only")
    made = subprocess.run(
        [chattr, "+i", str(directory)], capture_output=True, text=True, check=False
    )
    if made.returncode != 0:
        pytest.skip(f"running as root and chattr +i is refused here: {made.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(directory)], check=True)


def test_a_read_only_directory_is_refused_for_a_new_store_and_an_existing_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No file can be created, nor the -wal beside an existing one: a clear error, no change."""
    locked = tmp_path / "locked"
    locked.mkdir()
    existing = locked / "old.db"
    before = a_store_file(existing)
    new = locked / "new.db"
    with read_only(locked):
        with pytest.raises(StoreFileError, match="cannot create job store") as caught:
            SQLiteStore(new)
        assert str(new) in str(caught.value)
        with pytest.raises(StoreFileError, match="directory must be writable"):
            SQLiteStore(existing)
        assert_refused(run_cli(capsys, "--db", str(new), "enqueue", "t"), str(new))
        assert_refused(run_cli(capsys, "--db", str(existing), "status"), "must be writable")
    assert not new.exists()
    assert existing.read_bytes() == before
    assert sidecars(existing) == []


def test_a_read_only_store_file_is_refused_at_open_not_at_the_first_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SQLite would open an unwritable file read-only and fail later: the store says so at once."""
    path = tmp_path / "q.db"
    before = a_store_file(path)
    with read_only(path):
        with pytest.raises(StoreFileError, match="read-only") as caught:
            SQLiteStore(path)
        assert str(path) in str(caught.value)
    assert path.read_bytes() == before


NOT_SQLITE = {
    "text": b"name,email\nada,ada@example.com\n" * 100,
    "binary": bytes(range(256)) * 32,
    "png": b"\x89PNG\r\n\x1a\n" + b"\x00" * 2000,
    "short": b"x",
    "fake-header": b"SQLite format 3\x00" + b"\xff" * 4080,
}


@pytest.mark.parametrize("content", list(NOT_SQLITE.values()), ids=list(NOT_SQLITE))
@pytest.mark.parametrize("command", [["enqueue", "t", "{}"], ["status"]], ids=["enqueue", "status"])
def test_an_existing_file_that_is_not_a_store_is_never_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, command: list[str]
) -> None:
    """Refused with exit 2; the file keeps every byte and gets no -wal or -shm beside it."""
    path = tmp_path / "important.csv"
    path.write_bytes(content)
    assert_refused(run_cli(capsys, "--db", str(path), *command), str(path))
    assert path.read_bytes() == content
    assert sidecars(path) == []


def test_an_empty_file_is_a_valid_empty_database_and_becomes_a_store(tmp_path: Path) -> None:
    """Zero bytes is what SQLite calls an empty database: it is adopted, not refused."""
    path = tmp_path / "empty.db"
    path.touch()
    made = SQLiteStore(path)
    try:
        assert made.counts() == EMPTY
    finally:
        made.close()


TRUNCATIONS: dict[str, Callable[[bytes], bytes]] = {
    "half": lambda data: data[: len(data) // 2],
    "one-page": lambda data: data[:4096],
    "mid-page": lambda data: data[:5000],
    "header-only": lambda data: data[:100],
    "first-page-zeroed": lambda data: data[:200] + b"\x00" * 3000 + data[3200:],
}


@pytest.mark.parametrize("cut", list(TRUNCATIONS.values()), ids=list(TRUNCATIONS))
def test_a_truncated_store_is_refused_at_open_and_left_as_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cut: Callable[[bytes], bytes]
) -> None:
    """A store cut short (a copy that did not finish) is refused, naming the file; no change."""
    path = tmp_path / "q.db"
    damaged = cut(a_store_file(path))
    path.write_bytes(damaged)
    with pytest.raises(StoreFileError) as caught:
        SQLiteStore(path)
    assert str(path) in str(caught.value)
    assert_refused(run_cli(capsys, "--db", str(path), "enqueue", "t"), str(path))
    assert path.read_bytes() == damaged


def test_damage_inside_the_table_is_found_by_the_first_transaction_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The jobs table's root page overwritten: the store opens, each call then says "damaged".

    The header and the schema are intact, so opening succeeds; the first transaction that
    reads a damaged page raises StoreFileError naming the file, rolls back, and leaves
    the file as it was. A worker on such a file reports each failed claim with its phase
    and stays up (a disk may be repaired under it); it never runs or loses a job.
    """
    path = tmp_path / "q.db"
    data = a_store_file(path)
    # The jobs table's root page: every insert and every read of a job goes through it.
    conn = sqlite3.connect(path)
    try:
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'jobs'").fetchone()
        (size,) = conn.execute("PRAGMA page_size").fetchone()
    finally:
        conn.close()
    start = (root - 1) * size
    damaged = data[:start] + b"\xde\xad\xbe\xef" * (size // 4) + data[start + size :]
    assert len(damaged) == len(data)
    path.write_bytes(damaged)
    made = SQLiteStore(path)
    try:
        with pytest.raises(StoreFileError, match="the database file is damaged"):
            made.enqueue("t")
        with pytest.raises(StoreFileError, match="the database file is damaged"):
            made.claim("w", lease=30.0)
        errors: list[PhaseError] = []
        tasks = TaskRegistry(on_unexpected_error=errors.append)
        worker = Worker(made, tasks, poll_interval=0.02)
        with worker:
            deadline = time.monotonic() + MUST_HAPPEN
            while not errors:
                assert time.monotonic() < deadline, "the worker never tried to claim"
                time.sleep(0.005)  # polling an observation, not waiting for a race
        assert worker.stop().thread_failures == ()
        assert errors[0].phase.value == "dequeue"
        assert "damaged" in str(errors[0])
    finally:
        made.close()
    assert_refused(run_cli(capsys, "--db", str(path), "enqueue", "t"), "damaged", str(path))
    assert path.read_bytes() == damaged


def test_a_store_written_by_a_newer_schema_version_is_refused_byte_for_byte_unchanged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both versions and the file are named; not one byte changes, not even the journal mode."""
    path = tmp_path / "q.db"
    a_store_file(path, jobs=3)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.execute("PRAGMA journal_mode = DELETE")  # what a future version might choose
    conn.close()
    before = path.read_bytes()
    for command in (["enqueue", "t"], ["status"]):
        assert_refused(
            run_cli(capsys, "--db", str(path), *command),
            f"schema version {SCHEMA_VERSION + 1} is newer",
            f"(version {SCHEMA_VERSION})",
        )
    with pytest.raises(StoreFileError, match=r"upgrade patterns\.jobqueue"):
        SQLiteStore(path)
    assert path.read_bytes() == before
    assert sidecars(path) == []


# --- the checks' short paths say what the long ones said --------------------------------------

NAMES = {
    "empty": ("", "task must be a non-empty name, got ''"),
    "spaces": ("   ", "task must be a non-empty name, got '   '"),
    "unicode-space": ("\u2003\n", "task must be a non-empty name, got '\\u2003\\n'"),
    "nul": ("a\x00b", "task must not contain NUL, got 'a\\x00b'"),
    "long-nul": ("n" * 70 + "\x00", f"task must not contain NUL, got {'n' * 60!r}..."),
    "surrogate": ("a\ud800", "task must be valid UTF-8 text (no lone surrogates)"),
    "ascii-too-long": ("t" * 201, "task is 201 characters, over the limit of 200"),
    "utf8-too-long": ("\u0436" * 201, "task is 201 characters, over the limit of 200"),
}


@pytest.mark.parametrize(("name", "message"), list(NAMES.values()), ids=list(NAMES))
def test_a_refused_name_is_refused_with_the_same_message_on_every_path(
    name: str, message: str
) -> None:
    """ASCII names skip the UTF-8 check and build their repr only to refuse: same words."""
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        check_text("task", name)
    assert str(caught.value) == message
    assert check_text("task", " a\u2003b ") == " a\u2003b "  # spaces inside a name are fine


PAYLOADS = [
    None,
    0,
    "x",
    [1, 2.5, True, None],
    {"a": {"b": ["c"]}, "": 1},
    {"text": "\u0436\U0001f600", "nul": "a\x00b"},
    "\ud800",
    {"lone": ["\udfff"]},
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_a_payload_is_encoded_as_json_dumps_encodes_it(payload: Any) -> None:
    """The shared encoder writes what json.dumps wrote, and counts UTF-8 bytes as before."""
    text = json.dumps(payload, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    kept = text.encode("utf-8", "backslashreplace").decode("utf-8")
    assert encode_payload(payload) == kept
    size = len(kept.encode("utf-8"))
    with pytest.raises(ValueError, match=f"is {size} bytes of UTF-8 JSON, over the limit"):
        encode_payload(payload, size - 1)
    for bad, error in ((math.nan, "Out of range float"), (object(), "not JSON serializable")):
        with pytest.raises(TypeError, match=f"must be JSON-serialisable: .*{error}"):
            encode_payload([payload, bad])
