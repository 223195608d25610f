"""A hostile queue file: whoever can write the database must not be able to run code.

Payloads and task names are data. The checks: no module in ``patterns/`` can deserialise
code (no pickle and its relatives, no ``eval``; the one import of a name that is not a
literal is the command line's ``--tasks``, chosen by the operator); a job naming a real,
importable function runs nothing and never imports it, in-process or in the real worker
process; a planted pickle is never unpickled; SQL in task names, payloads, errors and
worker names is stored verbatim; and a new database file, with its ``-wal`` and ``-shm``
files, is readable and writable by its owner only.
"""

from __future__ import annotations

import ast
import io
import os
import pickle
import sqlite3
import stat
import subprocess
import sys
import textwrap
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import patterns
from patterns.jobqueue.cli import main as cli
from patterns.jobqueue.stores.records import JobState
from patterns.jobqueue.stores.sqlite.store import SQLiteStore
from patterns.jobqueue.tasks import TaskRegistry
from patterns.jobqueue.worker.worker import Worker
from tests.support import MUST_HAPPEN, child_env, join_or_fail, run_in_thread

PATTERNS = Path(patterns.__file__).parent
SOURCES = sorted(PATTERNS.rglob("*.py"))

# Modules that turn bytes into code or arbitrary objects.
DESERIALISERS = {"pickle", "_pickle", "cPickle", "marshal", "shelve", "dill", "cloudpickle"}
DESERIALISERS |= {"jsonpickle", "copyreg", "pickletools"}
CODE_BUILTINS = {"eval", "exec", "compile", "__import__"}
# The imports of a name that is not a literal: ``--tasks MODULE:ATTRIBUTE``, typed by the
# operator on the command line, never read from the database; and the package's lazy
# exports, whose module names come from its own fixed table (pinned below).
DYNAMIC_IMPORT_ALLOWED = {
    ("jobqueue/cli/worker_command.py", "load_registry"),
    ("jobqueue/__init__.py", "__getattr__"),
}

SQL = "x'); DROP TABLE jobs; --"
HOSTILE_NAMES = [
    SQL,
    "'; DELETE FROM jobs WHERE '1'='1",
    "name \"with\" 'quotes' and ;semicolons;",
    "Robert'); UPDATE jobs SET state = 'done'; --",
    "back\\slash `tick` $(echo cmd)",  # shell and escape syntax (a NUL is refused: below)
    "%s %d {0} ?",  # placeholders of every flavour
]


@pytest.fixture
def store(db: Path) -> Iterator[SQLiteStore]:
    """A store on ``db``, closed afterwards."""
    made = SQLiteStore(db)
    yield made
    made.close()


def code_names(path: Path) -> set[str]:
    """Every name used in the code of ``path`` (not in its strings or comments)."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return {token.string for token in tokens if token.type == tokenize.NAME}


def run_until_empty(worker: Worker) -> None:
    """Run a worker (exit_when_empty) in a thread until it stops by itself."""
    thread, outcome = run_in_thread(worker.run, "worker-main")
    join_or_fail(thread)
    assert "error" not in outcome, outcome
    assert outcome["result"].terminated


def schema(db: Path) -> list[tuple[str, str]]:
    """The objects in the database file: (type, name)."""
    conn = sqlite3.connect(db)
    try:
        return sorted(conn.execute("SELECT type, name FROM sqlite_master").fetchall())
    finally:
        conn.close()


# --- the source: nothing that turns data into code ------------------------------------------------


def test_no_module_in_patterns_can_deserialise_code() -> None:
    """No pickle, marshal, shelve (or kin) in the code of any module; no eval or exec."""
    assert len(SOURCES) > 10  # the scan sees the package
    deserialisers = {
        (str(path.relative_to(PATTERNS)), name)
        for path in SOURCES
        for name in code_names(path) & DESERIALISERS
    }
    assert deserialisers == set()
    builtins_called = {
        (str(path.relative_to(PATTERNS)), node.func.id)
        for path in SOURCES
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in CODE_BUILTINS
    }
    assert builtins_called == set()


def test_the_only_import_of_a_computed_name_is_the_operators_tasks_option() -> None:
    """import_module and __import__ take literals everywhere but the CLI's --tasks loader."""
    computed = set()
    for path in SOURCES:
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                callee = node.func
                name = (
                    callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", "")
                )
                literal = isinstance(node.args[0], ast.Constant)
                if name in ("import_module", "__import__") and not literal:
                    computed.add((str(path.relative_to(PATTERNS)), function.name))
    assert computed == DYNAMIC_IMPORT_ALLOWED


def test_the_package_imports_lazily_only_its_own_submodules_named_in_its_table() -> None:
    """``patterns.jobqueue.X`` imports the submodule its table names for X, and nothing else."""
    import patterns.jobqueue as package  # noqa: PLC0415

    sources = package._SOURCES
    assert set(sources) == set(package.__all__)
    files = [PATTERNS / "jobqueue" / f"{name.replace('.', '/')}.py" for name in sources.values()]
    assert all(path.is_file() for path in files)
    with pytest.raises(AttributeError, match="no attribute 'os'"):
        package.__getattr__("os")  # a name outside the table is never imported


# --- task names are looked up in the registry, nowhere else ---------------------------------------

EVIL_MODULE = """
from pathlib import Path
Path(__file__).with_name("IMPORTED").write_text("the database made me import this\\n")

def run(*args, **kwargs):
    Path(__file__).with_name("RAN").write_text("and run this\\n")

tasks = None
"""

NAMES_OF_CODE = [
    "evil_module",
    "evil_module:run",
    "evil_module.run",
    "evil_module:tasks",
    "os.system",
    "os:system",
    "builtins.eval",
    "subprocess:run",
    "__import__",
    "eval",
]


def test_a_task_name_that_names_real_code_runs_nothing_and_imports_nothing(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs naming importable functions fail as unknown tasks; no module is ever imported."""
    (tmp_path / "evil_module.py").write_text(EVIL_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))  # importable, if anything tried
    made = SQLiteStore(db)
    try:
        ids = made.enqueue_many([{"task": name, "payload": "echo owned"} for name in NAMES_OF_CODE])
        run_until_empty(Worker(made, TaskRegistry(), poll_interval=0.02, exit_when_empty=True))
        jobs = [made.get(i) for i in ids]
    finally:
        made.close()
    for name, job in zip(NAMES_OF_CODE, jobs, strict=True):
        assert job is not None
        assert job.state is JobState.FAILED
        assert job.last_error == f"unknown task {name!r}: no handler registered under that name"
    assert "evil_module" not in sys.modules
    assert not (tmp_path / "IMPORTED").exists()
    assert not (tmp_path / "RAN").exists()


def test_the_worker_process_imports_only_the_tasks_module_it_was_given(
    db: Path, tmp_path: Path
) -> None:
    """The CLI makes its directory importable for --tasks; a job naming a module there is inert."""
    (tmp_path / "evil_module.py").write_text(EVIL_MODULE)
    (tmp_path / "honest.py").write_text(
        "from patterns.jobqueue.tasks import TaskRegistry\ntasks = TaskRegistry()\n"
    )
    made = SQLiteStore(db)
    try:
        made.enqueue_many([{"task": name} for name in NAMES_OF_CODE])
    finally:
        made.close()
    result = subprocess.run(
        [
            *(sys.executable, "-m", "patterns.jobqueue", "--db", str(db), "worker"),
            *("--tasks", "honest:tasks", "--poll-interval", "0.02", "--exit-when-empty"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=MUST_HAPPEN * 3,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "IMPORTED").exists()
    assert not (tmp_path / "RAN").exists()
    made = SQLiteStore(db)
    try:
        assert made.counts()["failed"] == len(NAMES_OF_CODE)
    finally:
        made.close()


class Tripwire:
    """Unpickling this creates a file: proof that someone unpickled it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def test_a_pickle_planted_in_the_file_is_never_unpickled(store: SQLiteStore, db: Path) -> None:
    """A payload overwritten with pickle bytes fails its job as "not JSON"; nothing is loaded."""
    tasks = TaskRegistry()
    tasks.task(name="t")(lambda payload, ctx: None)
    planted, honest = store.enqueue_many([{"task": "t"}, {"task": "t", "payload": [1]}])
    marker = db.with_name("UNPICKLED")
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute(
            "UPDATE jobs SET payload = ? WHERE id = ?", (pickle.dumps(Tripwire(marker)), planted)
        )
    finally:
        conn.close()
    run_until_empty(Worker(store, tasks, poll_interval=0.02, exit_when_empty=True))
    conn = sqlite3.connect(db)
    try:
        state, error = conn.execute(
            "SELECT state, last_error FROM jobs WHERE id = ?", (planted,)
        ).fetchone()
    finally:
        conn.close()
    assert state == "failed"
    assert f"job {planted} has a payload that is not JSON" in error
    assert not marker.exists()
    assert store.get(honest).state is JobState.DONE  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "payload",
    [
        {"py/object": "os.system", "args": ["echo owned"]},  # jsonpickle's shape
        {"__reduce__": ["os.system", ["echo owned"]]},
        {"__class__": "subprocess.Popen", "__init__": ["sh"]},
        "__import__('os').system('echo owned')",
    ],
    ids=["jsonpickle", "reduce", "class", "expression"],
)
def test_payloads_shaped_like_code_reach_the_handler_as_plain_data(
    store: SQLiteStore, payload: Any
) -> None:
    """Object-looking JSON comes back as the dict or string it is, equal to what went in."""
    received: list[Any] = []
    tasks = TaskRegistry()
    tasks.task(name="t")(lambda payload, ctx: received.append(payload))
    store.enqueue("t", payload)
    run_until_empty(Worker(store, tasks, poll_interval=0.02, exit_when_empty=True))
    assert received == [payload]
    assert type(received[0]) is type(payload)


# --- SQL is always a parameter -------------------------------------------------------------------


def test_sql_in_task_names_payloads_errors_and_worker_names_is_stored_verbatim(
    store: SQLiteStore, db: Path
) -> None:
    """Quotes, semicolons and SQL go in and come out unchanged; the schema is untouched."""
    before = schema(db)
    tasks = TaskRegistry()
    for name in HOSTILE_NAMES:

        @tasks.task(name=name, max_attempts=1)
        def handler(payload: Any, ctx: Any) -> None:
            if payload["fail"]:
                raise ValueError(f"{SQL} in an error message")

    payloads = [
        {"fail": n % 2 == 1, SQL: [SQL, "';--", '"', "\\"]} for n in range(len(HOSTILE_NAMES))
    ]
    ids = [
        tasks.enqueue(store, name, payload)
        for name, payload in zip(HOSTILE_NAMES, payloads, strict=True)
    ]
    worker = Worker(store, tasks, name=f"w{SQL}", poll_interval=0.02, exit_when_empty=True)
    run_until_empty(worker)
    assert schema(db) == before
    for n, (job_id, name, payload) in enumerate(zip(ids, HOSTILE_NAMES, payloads, strict=True)):
        job = store.get(job_id)
        assert job is not None
        assert (job.task, job.payload) == (name, payload)
        if n % 2:
            assert job.state is JobState.FAILED
            assert job.last_error is not None
            assert job.last_error.startswith(f"ValueError: {SQL} in an error message")
        else:
            assert job.state is JobState.DONE
    assert store.counts() == {"queued": 0, "running": 0, "done": 3, "failed": 3, "cancelled": 0}


def test_sql_through_the_command_line_is_data_too(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Enqueue from a shell with SQL in the task name and payload; status still counts one job."""
    payload = '{"q": "\'; DROP TABLE jobs; --", "n": 1}'
    assert cli.main(["--db", str(db), "enqueue", SQL, payload]) == 0
    assert capsys.readouterr().out == "1\n"
    assert cli.main(["--db", str(db), "status", "--json"]) == 0
    assert (
        capsys.readouterr().out
        == '{"queued": 1, "running": 0, "done": 0, "failed": 0, "cancelled": 0}\n'
    )
    made = SQLiteStore(db)
    try:
        job = made.get(1)
    finally:
        made.close()
    assert job is not None
    assert (job.task, job.payload) == (SQL, {"q": "'; DROP TABLE jobs; --", "n": 1})


def test_a_task_name_with_nul_is_refused_with_a_clear_error(store: SQLiteStore) -> None:
    """NUL is not a name character (PostgreSQL text cannot hold it): every store refuses it."""
    with pytest.raises(ValueError, match="task must not contain NUL"):
        store.enqueue("a\x00b")
    assert store.counts()["queued"] == 0


# --- file permissions ----------------------------------------------------------------------------


def mode(path: Path) -> int:
    """The permission bits of ``path``."""
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    """A umask that masks nothing, so only the store decides the new file's mode."""
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def test_a_new_store_file_and_its_wal_and_shm_are_owner_only(db: Path, open_umask: None) -> None:
    """Mode 0600 for the database, its -wal and its -shm, even with a umask of 0."""
    made = SQLiteStore(db)
    try:
        made.enqueue("t", {"secret": "payload"})  # the -wal and -shm exist while it is open
        files = [db, Path(f"{db}-wal"), Path(f"{db}-shm")]
        assert all(path.exists() for path in files)
        assert {path.name: mode(path) for path in files} == dict.fromkeys(
            (path.name for path in files), 0o600
        )
    finally:
        made.close()


def test_the_command_line_creates_the_file_owner_only_and_leaves_an_existing_one_alone(
    tmp_path: Path, open_umask: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """`enqueue` on a new path makes a 0600 file; an existing store keeps the mode it has."""
    new = tmp_path / "new.db"
    assert cli.main(["--db", str(new), "enqueue", "t"]) == 0
    assert mode(new) == 0o600
    shared = tmp_path / "shared.db"
    SQLiteStore(shared).close()
    shared.chmod(0o640)  # the operator's choice, e.g. a group of workers
    assert cli.main(["--db", str(shared), "enqueue", "t"]) == 0
    assert mode(shared) == 0o640
    capsys.readouterr()


def test_concurrent_first_opens_all_succeed_on_one_owner_only_file(tmp_path: Path) -> None:
    """Racing creators: one creates the empty 0600 file, the others adopt it as it is."""
    db = tmp_path / "race.db"
    code = textwrap.dedent(
        f"""
        from patterns.jobqueue.stores.sqlite.store import SQLiteStore
        store = SQLiteStore({str(db)!r})
        store.enqueue("t")
        store.close()
        """
    )
    children = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=child_env(), stderr=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    try:
        errors = [child.communicate(timeout=MUST_HAPPEN * 3)[1] for child in children]
    finally:
        for child in children:
            child.kill()
            child.wait(MUST_HAPPEN)
    assert [child.returncode for child in children] == [0, 0, 0, 0], errors
    assert mode(db) == 0o600
    made = SQLiteStore(db)
    try:
        assert made.counts()["queued"] == 4
    finally:
        made.close()


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The common umask: without the store's care a new file would be world-readable (0644)."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.mark.parametrize("hops", [1, 2], ids=["symlink", "symlink-chain"])
def test_a_dangling_symlink_as_path_creates_an_owner_only_target(
    tmp_path: Path, umask_022: None, hops: int
) -> None:
    """The target a dangling symlink names is created 0600, and so are its -wal and -shm."""
    target = tmp_path / "real" / "q.db"
    target.parent.mkdir()
    link = tmp_path / "link0.db"
    link.symlink_to(target)
    for hop in range(1, hops):
        nxt = tmp_path / f"link{hop}.db"
        nxt.symlink_to(link)
        link = nxt
    made = SQLiteStore(link)
    try:
        made.enqueue("t", {"secret": "payload"})
        files = [target, Path(f"{target}-wal"), Path(f"{target}-shm")]
        assert all(path.exists() for path in files), list(target.parent.iterdir())
        assert {path.name: mode(path) for path in files} == dict.fromkeys(
            (path.name for path in files), 0o600
        )
    finally:
        made.close()
    assert link.is_symlink()


def test_a_new_store_file_is_owner_only_under_the_usual_umask(db: Path, umask_022: None) -> None:
    """With umask 022 the database, its -wal and its -shm are 0600, not 0644."""
    made = SQLiteStore(db)
    try:
        made.enqueue("t")
        files = [db, Path(f"{db}-wal"), Path(f"{db}-shm")]
        assert [mode(path) for path in files] == [0o600] * 3
    finally:
        made.close()
