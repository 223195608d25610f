"""The leak check: each kind of leak is caught and named by where it started, nothing else is."""

from __future__ import annotations

import asyncio
import logging
import math
import multiprocessing
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from patterns import leak_check
from patterns.leak_check import Leak, LeakCheck, LeakError, Site, no_leaks

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
# How long past its grace a check may take on a loaded machine before it counts as a hang.
MARGIN = 2.0


def next_line() -> int:
    """The line number after the caller's: where the start call under test stands."""
    return sys._getframe(1).f_lineno + 1


def here(line: int, function: str) -> Site:
    """The start site of a call at ``line`` of ``function`` in this file."""
    return Site(__file__, line, function)


def only(leaks: tuple[Leak, ...], kind: str) -> Leak:
    """The one leak of ``kind``; fails when there are none or several."""
    found = [leak for leak in leaks if leak.kind == kind]
    assert len(found) == 1, leaks
    return found[0]


class Parked(threading.Thread):
    """A thread that runs until its ``release`` event is set (and at most 30 s)."""

    def __init__(self, name: str, *, daemon: bool = False) -> None:
        super().__init__(name=name, daemon=daemon)
        self.release = threading.Event()

    def run(self) -> None:
        """Wait for ``release``."""
        self.release.wait(30)

    def stop(self) -> None:
        """Release the thread and join it; fail if it did not end."""
        self.release.set()
        self.join(5)
        assert not self.is_alive()


class EndsWhenJoined(Parked):
    """A thread certainly alive when the check looks, which ends as soon as it is joined."""

    def join(self, timeout: float | None = None) -> None:
        """Release the thread, then join it."""
        self.release.set()
        super().join(timeout)


# --- each kind of leak is caught, and named where it was started ----------------------------


@pytest.mark.parametrize("daemon", [False, True], ids=["non-daemon", "daemon"])
def test_a_leaked_thread_is_named_with_the_line_that_started_it(daemon: bool) -> None:
    """A thread left running fails the block, named with the file:line of its start()."""
    thread = Parked("parked", daemon=daemon)
    check = no_leaks(grace=0.1)
    check.begin()
    line = next_line()
    thread.start()
    leaks = check.end()
    thread.stop()
    leak = only(leaks, "thread")
    assert leak.name == "'parked'" + (" (daemon)" if daemon else "")
    assert leak.started_at == here(
        line, "test_a_leaked_thread_is_named_with_the_line_that_started_it"
    )
    assert str(leak).startswith(f"thread  {leak.name}  started at tests/test_leak_check.py:{line}")


def test_a_leaked_subprocess_is_named_with_its_command_and_popen_line() -> None:
    """A child started with Popen and left running is a leak at the line of the Popen call."""
    check = no_leaks(grace=0.1)
    check.begin()
    line = next_line()
    child = subprocess.Popen(["sleep", "60"])
    leaks = check.end()
    child.kill()
    child.wait(5)
    leak = only(leaks, "process")
    assert leak.name == f"sleep 60 (pid {child.pid})"
    assert leak.started_at == here(
        line, "test_a_leaked_subprocess_is_named_with_its_command_and_popen_line"
    )


def test_a_leaked_multiprocessing_process_is_named_with_its_start_line() -> None:
    """A multiprocessing child left running is a leak at the line of its start()."""
    process = multiprocessing.get_context("fork").Process(
        target=time.sleep, args=(60,), name="sleeper"
    )
    check = no_leaks(grace=0.1)
    check.begin()
    line = next_line()
    process.start()
    leaks = check.end()
    process.kill()
    process.join(5)
    leak = only(leaks, "process")
    assert leak.name == f"sleeper (pid {process.pid})"
    assert leak.started_at == here(
        line, "test_a_leaked_multiprocessing_process_is_named_with_its_start_line"
    )


def test_a_pending_asyncio_task_is_named_with_its_create_task_line() -> None:
    """A task still pending when its ``async with`` block ends is named where it was created."""

    async def main() -> tuple[LeakError | None, int]:
        line = next_line() + 2
        try:
            async with no_leaks(grace=0.1):
                task = asyncio.create_task(asyncio.Event().wait(), name="waiter")
        except LeakError as error:
            task.cancel()
            return error, line
        return None, line

    error, line = asyncio.run(main())
    assert error is not None
    leak = only(error.leaks, "task")
    assert leak.name == "'waiter' (coroutine Event.wait)"
    assert leak.started_at == here(line, "main")


def test_a_task_on_a_loop_that_is_not_running_is_a_leak_of_a_plain_with_block() -> None:
    """``loop.create_task`` outside ``async``: the task never ran, so it is reported."""
    loop = asyncio.new_event_loop()
    try:
        check = no_leaks(grace=0.1)
        check.begin()
        line = next_line()
        task = loop.create_task(asyncio.sleep(60), name="never-ran")
        leaks = check.end()
        task.cancel()
        loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
    finally:
        loop.close()
    leak = only(leaks, "task")
    assert leak.name.startswith("'never-ran'")
    assert leak.started_at == here(
        line, "test_a_task_on_a_loop_that_is_not_running_is_a_leak_of_a_plain_with_block"
    )


def test_an_open_socket_is_named_by_its_inode_and_where_it_was_made() -> None:
    """A socket left open is an fd leak, named ``socket:[inode]`` at the line that made it."""
    check = no_leaks(grace=0.1)
    check.begin()
    line = next_line()
    sock = socket.socket()
    leaks = check.end()
    fd = sock.fileno()
    sock.close()
    leak = only(leaks, "fd")
    assert leak.name.startswith(f"{fd} -> socket:[")
    assert leak.started_at == here(
        line, "test_an_open_socket_is_named_by_its_inode_and_where_it_was_made"
    )


def test_an_open_file_is_named_by_its_path_and_an_unknown_start(tmp_path: Path) -> None:
    """A file left open is an fd leak named by its path; where it was opened is not traced."""
    path = tmp_path / "left-open.txt"
    check = no_leaks(grace=0.1)
    check.begin()
    file = path.open("w", encoding="utf-8")
    leaks = check.end()
    fd = file.fileno()
    file.close()
    leak = only(leaks, "fd")
    assert leak.name == f"{fd} -> {path}"
    assert leak.started_at is None
    assert "opened at unknown" in str(leak)


def test_the_message_lists_every_leak_in_one_block() -> None:
    """One thread and one socket: one heading, then one line each with kind, name and place."""
    thread = Parked("two-of-them")
    sockets: list[socket.socket] = []

    def start_both() -> None:
        thread.start()
        sockets.append(socket.socket())

    with pytest.raises(LeakError) as caught, no_leaks(grace=0.1):
        start_both()
    thread.stop()
    sockets[0].close()
    lines = str(caught.value).splitlines()
    assert lines[0] == "2 left running after the block and a 0.1 s grace period:"
    assert lines[1].startswith("  thread  'two-of-them'  started at tests/test_leak_check.py:")
    assert lines[2].startswith("  fd      ")
    assert len(lines) == 3


# --- what is not a leak -----------------------------------------------------------------


def test_things_that_end_within_the_grace_are_not_reported() -> None:
    """A thread and a child alive at the block's end, which end while the check waits, pass."""
    thread = EndsWhenJoined("ends-when-joined")
    with no_leaks(grace=5):
        thread.start()
        child = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
        )
        assert child.stdin
        child.stdin.close()  # the child ends once it reads the end of its input
        assert thread.is_alive()  # only the check's join() lets it end
    assert not thread.is_alive()
    assert child.returncode == 0


def test_a_task_that_ends_within_the_grace_is_not_reported() -> None:
    """A task still pending when ``async with`` ends, and done one loop turn later, passes."""

    async def main() -> asyncio.Task[None]:
        async with no_leaks(grace=5):
            task = asyncio.create_task(asyncio.sleep(0))
            assert not task.done()
        return task

    assert asyncio.run(main()).done()


def test_what_ran_before_the_block_is_not_its_leak() -> None:
    """A thread started before the block and still running after it is not reported."""
    thread = Parked("older")
    thread.start()
    try:
        with no_leaks(grace=0.1):
            pass
    finally:
        thread.stop()


def test_an_error_in_the_block_is_not_hidden_by_the_leak_report(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The block's own exception propagates; the leaks are logged at WARNING instead."""
    thread = Parked("behind-an-error")

    def start_then_fail() -> None:
        thread.start()
        raise ValueError("the block's own error")

    with (
        caplog.at_level(logging.WARNING, logger="patterns.leak_check"),
        pytest.raises(ValueError, match="the block's own"),
        no_leaks(grace=0.1),
    ):
        start_then_fail()
    thread.stop()
    assert "thread  'behind-an-error'  started at" in caplog.text


# --- the allow-list and the bound -----------------------------------------------------------


def test_the_allow_list_lets_matching_names_through_and_does_not_wait_for_them(
    tmp_path: Path,
) -> None:
    """Allowed threads and fds are neither reported nor waited for; the others still are."""
    allowed, other = Parked("pool-1"), Parked("other")
    check = no_leaks(grace=0.5, allow=[r"^pool-\d+$", r"kept-open\.log$"])
    check.begin()
    allowed.start()
    other.start()
    log = (tmp_path / "kept-open.log").open("w", encoding="utf-8")
    leaks = check.end()
    other.stop()
    allowed.stop()
    log.close()
    assert [leak.name for leak in leaks] == ["'other'"]

    started = time.monotonic()
    with no_leaks(grace=5, allow=[r"^pool-\d+$"]):
        allowed = Parked("pool-2")
        allowed.start()
    elapsed = time.monotonic() - started
    allowed.stop()
    assert elapsed < 5, "the check waited for an allowed thread"


def test_a_thread_that_never_ends_is_reported_within_the_grace_plus_a_margin() -> None:
    """The check waits out its grace and then reports: it never hangs on a stuck thread."""
    stuck = [Parked(f"stuck-{i}") for i in range(3)]
    check = no_leaks(grace=0.5)
    check.begin()
    for thread in stuck:
        thread.start()
    started = time.monotonic()
    leaks = check.end()
    elapsed = time.monotonic() - started
    for thread in stuck:
        thread.stop()
    assert len(leaks) == 3
    assert 0.5 <= elapsed < 0.5 + MARGIN, "one deadline is shared by every wait"


@pytest.mark.parametrize("grace", [-1, math.nan, math.inf, True, "1"])
def test_a_grace_that_could_hang_or_means_nothing_is_refused(grace: object) -> None:
    """Negative, nan, inf, a bool or a string is a ValueError naming ``grace``."""
    with pytest.raises(ValueError, match="grace"):
        LeakCheck(grace=grace)  # type: ignore[arg-type]


# --- the decorator and the hooks ------------------------------------------------------------


def test_the_decorator_checks_each_call() -> None:
    """``@no_leaks()``: a call that leaks raises, a call that cleans up returns its value."""
    threads: list[Parked] = []

    @no_leaks(grace=0.1)
    def work(leave_running: bool) -> str:
        thread = Parked("decorated")
        threads.append(thread)
        thread.start()
        if not leave_running:
            thread.stop()
        return "done"

    assert work(leave_running=False) == "done"
    with pytest.raises(LeakError, match="'decorated'"):
        work(leave_running=True)
    threads[-1].stop()


def test_the_decorator_awaits_a_coroutine_function_inside_the_check() -> None:
    """``@no_leaks()`` on ``async def`` checks after the await, so a forgotten task is caught."""

    @no_leaks(grace=0.1)
    async def work() -> None:
        asyncio.create_task(asyncio.Event().wait(), name="forgotten")  # noqa: RUF006

    async def main() -> None:
        with pytest.raises(LeakError, match="'forgotten'"):
            await work()

    asyncio.run(main())


def test_the_start_hooks_are_counted_and_the_last_check_puts_back_what_it_found() -> None:
    """Nested checks share the hooks; after the last one, ``Thread.start`` is what it was."""
    before = threading.Thread.start  # the original, or the hook when the plugin is on
    with no_leaks():
        assert threading.Thread.start is leak_check._thread_start
        with no_leaks():
            pass
        assert threading.Thread.start is leak_check._thread_start
    assert threading.Thread.start is before


def test_a_start_hook_walks_past_the_standard_library() -> None:
    """A thread started inside the stdlib (a pool) is named by the line that asked for it."""
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    pool = ThreadPoolExecutor(1, thread_name_prefix="pooled")
    release = threading.Event()
    check = no_leaks(grace=0.1)
    check.begin()
    line = next_line()
    pool.submit(release.wait, 30)
    leaks = check.end()
    release.set()
    pool.shutdown(wait=True)
    leak = only(leaks, "thread")
    assert leak.started_at == here(line, "test_a_start_hook_walks_past_the_standard_library")


# --- the pytest plugin ----------------------------------------------------------------------

INNER = """import threading
import pytest

class Stuck(threading.Thread):
    def __init__(self):
        super().__init__(name="inner-stuck", daemon=True)
        self.release = threading.Event()
    def run(self):
        self.release.wait(30)

@pytest.fixture(scope="module")
def service():
    thread = Stuck()
    thread.start()
    yield
    thread.release.set()
    thread.join(5)

def test_uses_a_module_service(service):
    pass

def test_leaks():
    Stuck().start()
"""
INNER_LINE = INNER.splitlines().index("    Stuck().start()") + 1  # makepyfile keeps lines


@pytest.fixture
def inner(pytester: pytest.Pytester) -> Iterator[pytest.Pytester]:
    """A tiny suite whose ``test_leaks`` leaves a thread; the thread is stopped afterwards."""
    pytester.makepyfile(test_inner=INNER)
    yield pytester
    for thread in threading.enumerate():
        if thread.name == "inner-stuck":
            thread.release.set()  # type: ignore[attr-defined]
            thread.join(5)
            assert not thread.is_alive()


def test_the_plugin_fails_the_leaking_test_and_names_its_start_line(
    inner: pytest.Pytester,
) -> None:
    """With ``-p patterns.leak_check --leak-check`` the leak is an error, named by its line."""
    result = inner.runpytest(
        "-p", "patterns.leak_check", "--leak-check", "-o", "leak_check_grace=0.1"
    )
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_leaks*",
            "*1 left running after the block and a 0.1 s grace period:",
            (
                "*thread  'inner-stuck' (daemon)  started at "
                f"test_inner.py:{INNER_LINE} in test_leaks; now at test_inner.py:9 in run"
            ),
        ]
    )
    assert "test_uses_a_module_service" not in result.stdout.str().split("short test summary")[-1]


GC_HELD = """
import os
import pytest

class Pipe:
    def __init__(self):
        self.fds = os.pipe()
    def __del__(self):
        for fd in self.fds:
            os.close(fd)

@pytest.fixture
def pipe():
    yield Pipe()  # its fds close when pytest lets go of the value

KEPT = []

def test_gets_a_pipe_from_a_fixture(pipe):
    pass

def test_keeps_a_pipe_for_good():
    KEPT.append(Pipe())
"""


def test_the_plugin_does_not_blame_a_test_for_a_fixture_value_pytest_still_holds(
    pytester: pytest.Pytester,
) -> None:
    """An fd freed only when a fixture's value is collected is no leak; one kept for good is."""
    pytester.makepyfile(test_gc_held=GC_HELD)
    result = pytester.runpytest(
        "-p", "patterns.leak_check", "--leak-check", "-o", "leak_check_grace=0.1"
    )
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_keeps_a_pipe_for_good*"])


def test_the_plugin_is_turned_on_by_one_ini_line(inner: pytest.Pytester) -> None:
    """``leak_check = true`` in the ini file does what ``--leak-check`` does."""
    inner.makeini("[pytest]\nleak_check = true\nleak_check_grace = 0.1\n")
    result = inner.runpytest("-p", "patterns.leak_check")
    result.assert_outcomes(passed=2, errors=1)


def test_the_plugin_does_nothing_unless_turned_on(inner: pytest.Pytester) -> None:
    """Loaded but not turned on (as when installed), the plugin changes no outcome."""
    result = inner.runpytest("-p", "patterns.leak_check")
    result.assert_outcomes(passed=2)


def test_a_marker_turns_the_check_off_for_one_test(inner: pytest.Pytester) -> None:
    """``@pytest.mark.leak_check(enabled=False)`` exempts a test; allow= works per test too."""
    inner.makepyfile(
        test_inner=INNER.replace(
            "def test_leaks", "@pytest.mark.leak_check(enabled=False)\ndef test_leaks"
        )
        + "\n@pytest.mark.leak_check(allow=[r'^inner-stuck$'])\n"
        + "def test_allowed():\n    Stuck().start()\n"
    )
    result = inner.runpytest(
        "-p", "patterns.leak_check", "--leak-check", "-o", "leak_check_grace=0.1"
    )
    result.assert_outcomes(passed=3)


def test_the_installed_project_registers_the_plugin_under_the_module_name() -> None:
    """The ``pytest11`` entry point is named like the module, so ``-p`` and it never clash."""
    found = [ep.value for ep in entry_points(group="pytest11") if ep.name == "patterns.leak_check"]
    assert found == ["patterns.leak_check"]


def test_the_module_imports_and_works_without_pytest() -> None:
    """Used as a library the module never imports pytest (a blocked import proves it)."""
    code = (
        "import sys; sys.modules['pytest'] = None\n"
        "from patterns.leak_check import no_leaks\n"
        "with no_leaks(): pass\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "ok\n", "")


# --- the page's program -----------------------------------------------------------------------


def test_the_use_it_program_reports_the_forgotten_worker_and_passes_the_fixed_one() -> None:
    """examples/leak_check_use.py: the first block fails naming start_worker, the second passes."""
    done = subprocess.run(
        [sys.executable, "examples/leak_check_use.py"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    source = (ROOT / "examples" / "leak_check_use.py").read_text(encoding="utf-8").splitlines()
    line = source.index("    worker.start()") + 1
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "1 left running after the block and a 0.5 s grace period:",
        f"  thread  'worker'  started at examples/leak_check_use.py:{line} in start_worker",
        "the second block left nothing running",
    ]
