"""Exit hooks: what each way of ending runs, each pitfall forced, and the pattern.

Interpreter exit cannot be tested in the test process, so almost every test starts a child
interpreter. The child prints flushed marker lines; the parent reads them, with a timeout,
before it sends a signal or writes to the child's stdin, so every interleaving is forced.
The child harness here (`Child`, `run_child`) serves tests/test_signal_handlers.py too.
"""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO

import pytest

from tests.support import (
    MUST_HAPPEN,
    STAYS_BLOCKED,
    child_env,
    elapsed,
    join_or_fail,
    spawn_python,
)


class Child:
    """A child interpreter whose output arrives line by line through queues.

    Every read has a timeout, so a child that never prints fails the test instead of
    hanging it. Use it as a context manager: leaving the block kills the child if it is
    still running and joins the reader threads.
    """

    def __init__(self, code: str, *python_args: str) -> None:
        code = textwrap.dedent(code)
        if python_args:
            self.proc = subprocess.Popen(
                [sys.executable, *python_args, "-c", code],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=child_env(),
            )
        else:
            self.proc = spawn_python(code)
        self.out: queue.Queue[str] = queue.Queue()  # stdout lines, newline stripped
        self.err: queue.Queue[str] = queue.Queue()  # stderr lines, newline stripped
        self._readers = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self.out), name="out"),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self.err), name="err"),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _pump(stream: IO[str], lines: queue.Queue[str]) -> None:
        for line in stream:
            lines.put(line.rstrip("\n"))

    def __enter__(self) -> Child:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(MUST_HAPPEN)
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        self._join_readers()

    def expect(self, *expected: str) -> None:
        """Read the next stdout lines and check they are exactly ``expected``."""
        for line in expected:
            try:
                got = self.out.get(timeout=MUST_HAPPEN)
            except queue.Empty:
                msg = f"child never printed {line!r}; stderr: {self.stderr()}"
                raise AssertionError(msg) from None
            assert got == line, f"expected {line!r}, got {got!r}; stderr: {self.stderr()}"

    def expect_err(self, predicate: Callable[[str], bool]) -> list[str]:
        """Read stderr lines until one satisfies ``predicate``; return all of them."""
        seen: list[str] = []
        while True:
            try:
                seen.append(self.err.get(timeout=MUST_HAPPEN))
            except queue.Empty:
                msg = f"child never wrote the expected line; stderr: {seen}"
                raise AssertionError(msg) from None
            if predicate(seen[-1]):
                return seen

    def send(self, sig: int) -> None:
        """Send a signal to the child process."""
        self.proc.send_signal(sig)

    def write(self, text: str) -> None:
        """Write to the child's stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def stays_alive(self, duration: float = STAYS_BLOCKED) -> bool:
        """Return True if the child is still running after watching it for ``duration``."""
        try:
            self.proc.wait(duration)
        except subprocess.TimeoutExpired:
            return True
        return False

    def wait(self, timeout: float = MUST_HAPPEN) -> int:
        """Wait for the child to exit and return its status (negative: killed by a signal)."""
        return self.proc.wait(timeout)

    def rest(self) -> list[str]:
        """After the exit: every stdout line not read yet."""
        self._join_readers()
        return list(self.out.queue)

    def stderr(self) -> str:
        """Whatever stderr lines have not been read yet (all of them once the child exited)."""
        if self.proc.poll() is not None:
            self._join_readers()
        return "\n".join(self.err.queue)

    def _join_readers(self) -> None:
        for reader in self._readers:
            join_or_fail(reader)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def how_it_ended(status: int) -> str:
    """A child's exit status in words: a negative status is the signal that killed it."""
    return f"killed by {signal.Signals(-status).name}" if status < 0 else f"exit status {status}"


def run_child(code: str, timeout: float = MUST_HAPPEN) -> subprocess.CompletedProcess[str]:
    """Run a child that needs no interaction, with a timeout."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=timeout,
        check=False,
    )


# --- atexit: which ways of ending run it ---------------------------------------------------

# A child of a background job (``cmd &`` in a non-interactive shell, as some CI runners
# start the tests) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt
# handler at all. Children that demonstrate Ctrl-C first put back what a terminal gives.
ENDING = """
import atexit, os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
atexit.register(print, "atexit ran", flush=True)
try:
    print("ready", flush=True)
    {ending}
finally:
    print("finally ran", flush=True)
"""


@pytest.mark.parametrize(
    ("ending", "sig", "status"),
    [
        pytest.param("pass", None, 0, id="main returns"),
        pytest.param("sys.exit(3)", None, 3, id="sys.exit"),
        pytest.param("raise ValueError('boom')", None, 1, id="unhandled exception"),
        pytest.param("sys.stdin.readline()", signal.SIGINT, -signal.SIGINT, id="Ctrl-C"),
    ],
)
def test_atexit_handlers_run_on_every_orderly_exit(ending: str, sig: int | None, status: int):
    """Return, sys.exit, an unhandled exception and Ctrl-C all run finally, then atexit."""
    with Child(ENDING.format(ending=ending)) as child:
        child.expect("ready")
        if sig is not None:
            child.send(sig)
        assert child.wait() == status
        assert child.rest() == ["finally ran", "atexit ran"]
        if sig == signal.SIGINT:
            assert "KeyboardInterrupt" in child.stderr()


@pytest.mark.parametrize(
    ("ending", "sig", "status"),
    [
        pytest.param("sys.stdin.readline()", signal.SIGTERM, -signal.SIGTERM, id="SIGTERM"),
        pytest.param("sys.stdin.readline()", signal.SIGKILL, -signal.SIGKILL, id="SIGKILL"),
        pytest.param("os._exit(4)", None, 4, id="os._exit"),
    ],
)
def test_atexit_handlers_are_skipped_by_default_sigterm_sigkill_and_os_exit(
    ending: str, sig: int | None, status: int
):
    """Default SIGTERM, SIGKILL and os._exit end the process with no finally and no atexit."""
    with Child(ENDING.format(ending=ending)) as child:
        child.expect("ready")
        if sig is not None:
            child.send(sig)
        assert child.wait() == status
        assert child.rest() == []


def test_atexit_handlers_run_newest_first_one_at_a_time_in_the_main_thread():
    """Unlike JVM shutdown hooks, atexit handlers run in reverse order, sequentially, in main."""
    result = run_child("""
        import atexit, threading
        running = []
        def hook(name):
            running.append(name)
            print(f"start {name} in {threading.current_thread().name}, {len(running)} running")
            running.remove(name)
            print(f"end {name}")
        for name in ("first", "second", "third"):
            atexit.register(hook, name)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "start third in MainThread, 1 running",
        "end third",
        "start second in MainThread, 1 running",
        "end second",
        "start first in MainThread, 1 running",
        "end first",
    ]


@pytest.mark.race("P20", "an exception in an atexit handler only reaches stderr, status 0")
def test_naive_atexit_hook_failure_is_printed_to_stderr_not_logged_and_the_status_stays_0(
    record_property: Callable[[str, object], None],
):
    """A failing handler is printed to stderr, not the app's log; the rest run; status 0."""
    result = run_child("""
        import atexit, logging, sys
        logging.basicConfig(stream=sys.stdout, format="%(levelname)s %(message)s")
        def broken():
            raise RuntimeError("hook failed")
        atexit.register(print, "registered first")
        atexit.register(broken)
        atexit.register(print, "registered last")
    """)
    log_lines = [line for line in result.stdout.splitlines() if line.startswith("ERROR")]
    last_err = (result.stderr.strip().splitlines() or [""])[-1]
    record_property(
        "observed",
        f"{how_it_ended(result.returncode)}, the error reached stderr ({last_err!r})"
        f" and {len(log_lines)} log lines",
    )
    assert result.returncode == 0
    assert result.stdout.splitlines() == ["registered last", "registered first"]  # no log line
    assert "Exception ignored in atexit callback" in result.stderr
    assert "RuntimeError: hook failed" in result.stderr


@pytest.mark.race("P20", "an exception in an atexit handler only reaches stderr, status 0")
def test_register_exit_hook_logs_a_failing_hook_with_its_traceback():
    """register_exit_hook logs a failure with its traceback, so it lands in the app's log."""
    result = run_child("""
        import logging, sys
        from patterns.exit_hooks import register_exit_hook
        logging.basicConfig(stream=sys.stdout, format="%(levelname)s %(message)s")
        def broken():
            raise RuntimeError("hook failed")
        register_exit_hook(broken)
        register_exit_hook(lambda: print("the other hook ran"))
    """)
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0] == "the other hook ran"
    assert lines[1].startswith("ERROR exit hook <function broken")
    assert "RuntimeError: hook failed" in result.stdout
    assert "Exception ignored" not in result.stderr


# --- P19: os._exit skips finally, atexit and the flush of buffered output -----------------

EXIT_NOW = """
import atexit, logging, os, sys
from patterns.exit_hooks import force_exit
logging.basicConfig(stream=sys.stderr, format="log: %(message)s")
atexit.register(print, "atexit ran")
sys.stdout.write("half a line of results")  # stdout is a pipe: block-buffered, still unwritten
try:
    {exit_now}
finally:
    print("finally ran")
"""


def run_buffered_child(code: str) -> subprocess.CompletedProcess[str]:
    """Run a child whose stdout is block-buffered, as it is in production under a pipe."""
    env = child_env()
    del env["PYTHONUNBUFFERED"]  # child_env sets it; with it the text would reach the pipe
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=MUST_HAPPEN,
        check=False,
    )


@pytest.mark.race("P19", "os._exit loses buffered output, finally and atexit")
def test_naive_os_exit_loses_the_buffered_output(
    record_property: Callable[[str, object], None],
):
    """os._exit(3) ends the process at the C level: the buffered text is gone, status 3."""
    result = run_buffered_child(EXIT_NOW.format(exit_now="os._exit(3)"))
    never = [s for s in ("half a line", "finally ran", "atexit ran") if s not in result.stdout]
    record_property(
        "observed",
        f"{how_it_ended(result.returncode)}, stdout {result.stdout!r},"
        f" never printed: {', '.join(map(repr, never)) or '-'}",
    )
    assert result.returncode == 3
    assert result.stdout == ""  # the results, finally and atexit: all gone
    assert result.stderr == ""


@pytest.mark.race("P19", "os._exit loses buffered output, finally and atexit")
def test_force_exit_flushes_stdout_and_the_log_before_it_exits():
    """force_exit logs why and flushes stdio first; finally and atexit are skipped on purpose."""
    result = run_buffered_child(EXIT_NOW.format(exit_now="force_exit(3, 'watchdog fired')"))
    assert result.returncode == 3
    assert result.stdout == "half a line of results"  # and no "finally ran", no "atexit ran"
    assert result.stderr.startswith("log: watchdog fired: exiting now with status 3")


# --- P21: logging after logging.shutdown() ---------------------------------------------------

LATE_LOG = """
{register_import}
def flush_report():
    logging.getLogger("app").warning("exit hook: report flushed")
{register}(flush_report)  # before logging is imported and configured
import logging
logging.basicConfig(filename={path!r}, filemode="w", level=logging.INFO, format="%(message)s")
logging.getLogger("app").info("main done")
"""


@pytest.mark.race("P21", "an atexit handler that logs after logging.shutdown()")
def test_naive_exit_hook_registered_before_logging_loses_its_log_line(
    tmp_path: Path, record_property: Callable[[str, object], None]
):
    """logging.shutdown runs first and closes the file, so the hook's line silently vanishes."""
    log = tmp_path / "app.log"
    code = LATE_LOG.format(
        register_import="import atexit", register="atexit.register", path=str(log)
    )
    result = run_child(code)
    lines = log.read_text().splitlines()
    hook_line = "there" if any("report flushed" in line for line in lines) else "missing"
    record_property(
        "observed",
        f"{how_it_ended(result.returncode)}, stderr {result.stderr!r}, the log file holds"
        f" {lines}, the hook's line is {hook_line}",
    )
    assert result.returncode == 0
    assert result.stderr == ""  # silent
    assert log.read_text().splitlines() == ["main done"]


@pytest.mark.race("P21", "an atexit handler that logs after logging.shutdown()")
def test_register_exit_hook_runs_before_logging_shutdown_so_its_line_is_kept(tmp_path: Path):
    """A hook registered through register_exit_hook runs while logging still works."""
    log = tmp_path / "app.log"
    code = LATE_LOG.format(
        register_import="from patterns.exit_hooks import register_exit_hook",
        register="register_exit_hook",
        path=str(log),
    )
    result = run_child(code)
    assert result.returncode == 0, result.stderr
    assert log.read_text().splitlines() == ["main done", "exit hook: report flushed"]


LATE_LOG_BY_HANDLER = """
import atexit, sys
def late():
    logging.getLogger("app").warning("late line")
atexit.register(late)  # before logging is imported: runs after logging.shutdown()
import logging
{configure}
logging.getLogger("app").warning("main done")
"""


@pytest.mark.parametrize(
    ("configure", "kept"),
    [
        pytest.param("logging.basicConfig(filename={path!r}, filemode='w')", False, id="file w"),
        pytest.param("logging.basicConfig(filename={path!r}, filemode='a')", True, id="file a"),
        pytest.param("logging.basicConfig(stream=sys.stderr)", True, id="stderr"),
        pytest.param("logging.basicConfig(stream=sys.stdout)", True, id="stdout"),
    ],
)
def test_a_line_logged_after_logging_shutdown_is_lost_only_by_a_file_handler_in_w_mode(
    tmp_path: Path, configure: str, kept: bool
):
    """Closed FileHandler in 'w' mode drops it; 'a' mode reopens the file; streams still print.

    The same on 3.11.7, 3.12.1 and 3.13.0: FileHandler.emit reopens a closed stream unless
    the mode is 'w' (so a reopen cannot truncate the file it just wrote).
    """
    log = tmp_path / "app.log"
    code = LATE_LOG_BY_HANDLER.format(configure=configure.format(path=str(log)))
    result = run_child(code)
    assert result.returncode == 0, result.stderr
    output = log.read_text() if log.exists() else result.stderr + result.stdout
    lines = [line.rsplit(":", 1)[-1] for line in output.splitlines()]  # WARNING:app:msg
    assert lines == (["main done", "late line"] if kept else ["main done"]), output


THREAD_AT_EXIT = """
import atexit, sys, threading
def start_a_thread(when):
    thread = threading.Thread(target=lambda: None)
    try:
        thread.start()
    except RuntimeError as exc:
        print(f"{{when}}: {{type(exc).__name__}}: {{exc}}", flush=True)
    else:
        thread.join(10)
        print(f"{{when}}: started", flush=True)

class StartsOneWhenCollected:
    start = staticmethod(start_a_thread)
    def __del__(self):
        self.start("finalizing")

{which}
"""


def test_starting_a_thread_at_exit_what_each_version_does():
    """In atexit: refused on 3.12.1 only (gh-104690; gh-113964 relaxed it); later: on 3.12+."""
    in_atexit = run_child(
        THREAD_AT_EXIT.format(which="atexit.register(start_a_thread, 'in atexit')")
    )
    assert in_atexit.returncode == 0, in_atexit.stderr
    refused = "RuntimeError: can't create new thread at interpreter shutdown"
    expected = {(3, 11): "in atexit: started", (3, 12): f"in atexit: {refused}"}
    assert in_atexit.stdout.splitlines() == [
        expected.get(sys.version_info[:2], "in atexit: started")
    ]

    # A cycle is collected during finalization, after the atexit handlers.
    code = THREAD_AT_EXIT.format(which="x = StartsOneWhenCollected(); x.cycle = x")
    if sys.version_info < (3, 12):
        # 3.11 lets start() begin, and it waits forever for a thread that cannot run.
        with Child(code) as child:
            assert child.stays_alive()
        return
    late = run_child(code)
    assert late.returncode == 0, late.stderr
    error = "PythonFinalizationError" if sys.version_info >= (3, 13) else "RuntimeError"
    assert late.stdout.splitlines() == [
        f"finalizing: {error}: can't create new thread at interpreter shutdown"
    ]


FORCE_EXIT_AT_EXIT = """
import atexit, logging, sys
from patterns.exit_hooks import force_exit
logging.basicConfig(stream=sys.stdout, format="log: %(message)s")

class ForcesWhenCollected:
    force = staticmethod(force_exit)
    def __del__(self):
        self.force(7, "from a finalizer")

{which}
"""


def test_force_exit_from_an_atexit_handler_exits_with_its_status_on_every_version():
    """Status 7 everywhere; the log line is flushed except on 3.12.1, which refuses the thread."""
    result = run_child(
        FORCE_EXIT_AT_EXIT.format(which="atexit.register(force_exit, 7, 'from atexit')")
    )
    assert result.returncode == 7, result.stderr
    logged = sys.version_info[:2] != (3, 12)  # checked on 3.11.7, 3.12.1 and 3.13.0
    lines = result.stdout.splitlines()
    assert [line.split(":", 2)[1].strip() for line in lines] == (["from atexit"] if logged else [])


def test_force_exit_during_finalization_exits_at_once_on_every_version():
    """Called after the atexit handlers, force_exit must not wait for a thread that cannot start."""
    code = FORCE_EXIT_AT_EXIT.format(which="x = ForcesWhenCollected(); x.cycle = x")
    with elapsed() as took:
        result = run_child(code)
    assert result.returncode == 7, result.stderr
    assert took() < MUST_HAPPEN
    assert result.stdout == ""  # no flush thread, so no log line, on purpose


FORCE_EXIT_BUDGET = """
import sys
from patterns.exit_hooks import force_exit
try:
    force_exit(3, "budget", flush_timeout={budget})
except ValueError as exc:
    print(exc, flush=True)
    sys.exit(4)
"""


@pytest.mark.parametrize(
    ("budget", "status", "out"),
    [
        ("float('inf')", 3, ""),
        ("1e300", 3, ""),
        ("float('nan')", 4, "flush_timeout must be a number of seconds >= 0, not nan\n"),
        ("-1", 4, "flush_timeout must be a number of seconds >= 0, not -1\n"),
        ("True", 4, "flush_timeout must be a number of seconds >= 0, not True\n"),
    ],
)
def test_force_exit_takes_an_infinite_flush_budget_and_refuses_one_that_is_not_seconds(
    budget: str, status: int, out: str
):
    """An inf budget flushes and exits, no OverflowError; nan, -1, True: ValueError, no exit."""
    result = run_child(FORCE_EXIT_BUDGET.format(budget=budget))
    assert (result.returncode, result.stdout) == (status, out), result.stderr
