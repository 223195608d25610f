"""Daemon and non-daemon threads at exit: each pitfall shown in a child process, then the fix."""

from __future__ import annotations

import concurrent.futures.thread as pool_module
import functools
import gc
import logging
import math
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import pytest

from patterns.daemon_threads import (
    BackgroundService,
    HousekeepingDaemon,
    StopReport,
    every,
    run_with_service,
)
from tests.support import (
    MUST_HAPPEN,
    Gate,
    cannot_start,
    elapsed,
    handler_stops_during_stop,
    handler_stops_inside_the_stop_event_set,
    join_or_fail,
    run_in_thread,
    run_python,
    signal_main_during,
    spawn_python,
    start_at,
    start_then_interrupt,
    thread_start_patched,
    wait_until_blocked_in,
    wait_until_parked_inside,
)

# Scheduling noise allowed on top of a budget. Across a process boundary it also covers
# interpreter teardown and the parent noticing the exit, on a loaded 2-core machine.
NOISE = 1.0

# How long the parent watches a child that must *not* exit. The child is released (or
# killed) by the parent only after this, so the value cannot make a test pass by luck.
HANG_WATCH = 0.5

# The budget the pattern versions stop their service with. Their work is cooperative and
# ends within milliseconds, so the budget is never used up; it is the promise asserted.
STOP_BUDGET = 2.0

P15 = ("P15", "daemon thread killed mid-work: finally skipped, file half-written")
P16 = ("P16", "atexit handler meant to stop a non-daemon thread never runs: hang")

cpython_detail = pytest.mark.skipif(
    sys.implementation.name != "cpython" or not hasattr(threading, "_register_atexit"),
    reason="relies on CPython's private threading._register_atexit",
)


class Child:
    """A child interpreter whose output is read by threads, so that every read is bounded.

    The parent reads marker lines with `expect` before it acts, measures with `exits`,
    and leaving the ``with`` block kills the child if it is still running.
    """

    def __init__(self, code: str) -> None:
        self.process = spawn_python(textwrap.dedent(code))
        self._lines: queue.Queue[str | None] = queue.Queue()  # None: stdout closed
        self._stderr: list[str] = []
        self._readers = [
            threading.Thread(target=self._pump_stdout, name="child-stdout"),
            threading.Thread(target=self._pump_stderr, name="child-stderr"),
        ]
        for reader in self._readers:
            reader.start()

    def _pump_stdout(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def _pump_stderr(self) -> None:
        assert self.process.stderr is not None
        self._stderr.append(self.process.stderr.read())

    def expect(self, *markers: str) -> None:
        """Read the next stdout lines and check they are exactly ``markers``, in order."""
        for marker in markers:
            try:
                line = self._lines.get(timeout=MUST_HAPPEN)
            except queue.Empty:
                raise AssertionError(f"child printed nothing; expected {marker!r}") from None
            assert line == marker, f"expected {marker!r}, got {line!r}; stderr: {self.stderr()}"

    def send(self, text: str) -> None:
        """Write ``text`` to the child's stdin."""
        assert self.process.stdin is not None
        self.process.stdin.write(text)
        self.process.stdin.flush()

    def stays_alive(self, duration: float = HANG_WATCH) -> bool:
        """True if the child has not exited after ``duration`` seconds of watching."""
        try:
            self.process.wait(timeout=duration)
        except subprocess.TimeoutExpired:
            return True
        return False

    def exits(self, timeout: float = MUST_HAPPEN) -> int:
        """Wait (bounded) for the child to exit and return its exit status."""
        return self.process.wait(timeout=timeout)

    def rest(self) -> list[str]:
        """Every stdout line not read yet; call after the child has exited."""
        lines = []
        while (line := self._lines.get(timeout=MUST_HAPPEN)) is not None:
            lines.append(line)
        self._lines.put(None)
        return lines

    def stderr(self) -> str:
        """Everything the child wrote to stderr; complete once it has exited."""
        if self.process.poll() is not None:
            join_or_fail(self._readers[1])
        return "".join(self._stderr)

    def __enter__(self) -> Child:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.process.kill()  # a no-op if it has exited
        self.process.wait(MUST_HAPPEN)
        for reader in self._readers:
            join_or_fail(reader)
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            assert stream is not None
            stream.close()


# --- what each kind of thread means at exit (P15) ---------------------------------------

# The child writes a file in steps from a background thread: a header, one line per row
# it receives, and, in its finally block, the footer. Its main hands it two rows, waits
# until both are on disk, and returns.
EXPORT_CHILD = """
import queue, threading
from patterns.daemon_threads import run_with_service
from patterns.naive.daemon_threads import naive_run_with_daemon

rows = queue.Queue()
both_written = threading.Event()

def export(stopping):
    out = open({path!r}, "w")
    try:
        out.write("BEGIN\\n")
        while not stopping.is_set():
            try:
                row = rows.get(timeout=0.05)  # a bounded wait, so a stop is noticed
            except queue.Empty:
                continue
            out.write(row + "\\n")
            out.flush()
            print("wrote", row, flush=True)
            if row == "row 2":
                both_written.set()
    finally:
        out.write("END\\n")
        out.close()
        print("finally ran", flush=True)

def main():
    rows.put("row 1")
    rows.put("row 2")
    both_written.wait(30)
    print("main done", flush=True)

{function}(main, export, name="export"{extra})
"""


@pytest.mark.race(*P15)
def test_naive_daemon_writer_is_abandoned_mid_file_and_its_finally_never_runs(
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    """The daemon thread dies with the process: no footer, no finally, and exit status 0."""
    path = tmp_path / "export.txt"
    code = EXPORT_CHILD.format(function="naive_run_with_daemon", path=str(path), extra="")
    with Child(code) as child:
        child.expect("wrote row 1", "wrote row 2", "main done")
        status = child.exits()
        after_main = child.rest()
        record_property(
            "observed",
            f"exit status {status}, the daemon's finally"
            f" {'ran' if 'finally ran' in after_main else 'never ran'},"
            f" its file holds {', '.join(map(repr, path.read_text().splitlines()))}",
        )
        assert status == 0
        assert after_main == []  # "finally ran" never printed
        assert child.stderr() == ""  # and nothing else reports the loss
    assert path.read_text() == "BEGIN\nrow 1\nrow 2\n"  # half-written: no END


@pytest.mark.race(*P15)
def test_service_writer_is_stopped_by_main_and_finishes_the_file_within_its_budget(
    tmp_path: Path,
) -> None:
    """A non-daemon service stopped in main's finally writes its footer before the exit."""
    path = tmp_path / "export.txt"
    code = EXPORT_CHILD.format(
        function="run_with_service", path=str(path), extra=f", stop_timeout={STOP_BUDGET}"
    )
    with Child(code) as child:
        child.expect("wrote row 1", "wrote row 2", "main done")
        with elapsed() as took:
            assert child.exits() == 0
        assert child.rest() == ["finally ran"]
    assert took() < STOP_BUDGET + NOISE
    assert path.read_text() == "BEGIN\nrow 1\nrow 2\nEND\n"


NON_DAEMON_CHILD = """
import os, threading

waiting = threading.Event()

def work():
    waiting.set()
    try:
        os.read(0, 1)  # blocked until the parent writes to stdin
    finally:
        print("worker finished", flush=True)

threading.Thread(target=work, name="worker").start()
waiting.wait(30)
print("main done", flush=True)
"""


def test_a_non_daemon_thread_keeps_the_process_alive_after_main_returns() -> None:
    """After main returns, exit waits for the non-daemon thread, whose finally then runs."""
    with Child(NON_DAEMON_CHILD) as child:
        child.expect("main done")
        assert child.stays_alive()
        child.send("x")
        assert child.exits() == 0
        assert child.rest() == ["worker finished"]


# The worker waits until the main thread is in threading._shutdown (step 2's join), says
# so, and then blocks forever; the parent sends SIGINT only after reading that line.
CTRL_C_IN_JOIN_CHILD = """
import atexit, sys, threading

atexit.register(print, "atexit ran", flush=True)
main_ident = threading.get_ident()

def worker():
    try:
        while True:
            frame = sys._current_frames().get(main_ident)
            if frame is not None and frame.f_code.co_name == "_shutdown":
                break
            threading.Event().wait(0.01)  # polling a condition, as wait_until does
        print("main is joining", flush=True)
        threading.Event().wait()
    finally:
        print("worker finished", flush=True)

threading.Thread(target=worker, name="worker").start()
print("main done", flush=True)
"""


def test_ctrl_c_during_the_join_at_exit_abandons_the_non_daemon_thread_and_runs_atexit() -> None:
    """A KeyboardInterrupt in step 2 ends the join: atexit runs, the thread's finally never does."""
    with Child(CTRL_C_IN_JOIN_CHILD) as child:
        child.expect("main done", "main is joining")
        child.process.send_signal(signal.SIGINT)
        assert child.exits() == 0
        assert child.rest() == ["atexit ran"]  # no "worker finished"
        err = child.stderr()
        assert err.rstrip().endswith("KeyboardInterrupt:")
        assert "in _shutdown" in err
        # 3.11 and 3.12 report it as "Exception ignored"; 3.13.0 prints a bare traceback.
        ignored = "Exception ignored in: <module 'threading'"
        assert (ignored in err) is (sys.version_info < (3, 13))


# --- the exit-order deadlock (P16) --------------------------------------------------------

# The worker waits for its stop event. So that a hung child can be released without a
# kill, it also watches a second event that a reader of stdin sets (os.read takes no
# lock that interpreter teardown would need, so the reader can be abandoned safely).
STOP_CHILD = """
import atexit, os, threading
from patterns.daemon_threads import run_with_service
from patterns.naive.daemon_threads import naive_run_with_atexit_stop

released = threading.Event()
started = threading.Event()

def wait_for_release():
    os.read(0, 1)
    released.set()

threading.Thread(target=wait_for_release, daemon=True).start()
atexit.register(print, "atexit ran", flush=True)

def worker(stopping):
    print("worker started", flush=True)
    started.set()
    try:
        while not stopping.wait(0.05):
            if released.is_set():
                print("released by the parent", flush=True)
                return
    finally:
        print("worker stopped", flush=True)

def main():
    started.wait(30)
    print("main done", flush=True)

{function}(main, worker, name="worker"{extra})
"""


@pytest.mark.race(*P16)
def test_naive_atexit_stop_never_runs_because_exit_waits_for_the_thread_first(
    record_property: Callable[[str, object], None],
) -> None:
    """The process hangs after main; atexit runs only once the parent frees the thread."""
    code = STOP_CHILD.format(function="naive_run_with_atexit_stop", extra="")
    with Child(code) as child:
        child.expect("worker started", "main done")
        main_done_at = time.monotonic()
        # Had the atexit handler run, the worker would have stopped and the process
        # exited: still alive means the interpreter is waiting for the thread first.
        assert child.stays_alive()
        child.send("x")
        child.expect("released by the parent", "worker stopped", "atexit ran")
        status = child.exits()
        record_property(
            "observed",
            f"after main the process hung {time.monotonic() - main_done_at:.1f}s, atexit ran only"
            f" once the parent freed the thread, status {status}",
        )
        assert status == 0


@pytest.mark.race(*P16)
def test_service_stopped_in_main_finally_lets_the_process_exit_within_its_budget() -> None:
    """Stopping the service in main's finally ends the thread before exit waits for it."""
    code = STOP_CHILD.format(function="run_with_service", extra=f", stop_timeout={STOP_BUDGET}")
    with Child(code) as child:
        child.expect("worker started", "main done")
        with elapsed() as took:
            assert child.exits() == 0  # stdin is never written: nobody releases it
        assert child.rest() == ["worker stopped", "atexit ran"]
    assert took() < STOP_BUDGET + NOISE


# --- a daemon thread for harmless work, stopped from atexit on a budget --------------------

HOUSEKEEPING_CHILD = """
import atexit, logging, threading
from patterns.daemon_threads import HousekeepingDaemon, every

logging.basicConfig(format="%(levelname)s %(message)s")
atexit.register(print, "atexit ran", flush=True)
first_beat = threading.Event()

def beat():
    print("beat", flush=True)
    first_beat.set()

def heartbeat(stopping):
    try:
        every(60, beat)(stopping)
    finally:
        print("heartbeat stopped", flush=True)

def stuck_cleaner(stopping):
    try:
        beat()
        threading.Event().wait()  # blocked in a call that ignores the stop
    finally:
        print("cleaner stopped", flush=True)

HousekeepingDaemon({work}, name="housekeeping", stop_timeout={budget}).start()
first_beat.wait(30)
print("main done", flush=True)
"""


@pytest.mark.race(*P15)
def test_housekeeping_daemon_is_stopped_cleanly_by_its_atexit_handler() -> None:
    """Its bounded atexit stop ends the daemon's loop, so its finally runs before the exit."""
    code = HOUSEKEEPING_CHILD.format(work="heartbeat", budget=STOP_BUDGET)
    with Child(code) as child:
        child.expect("beat", "main done")
        with elapsed() as took:
            assert child.exits() == 0
        assert child.rest() == ["heartbeat stopped", "atexit ran"]
        assert child.stderr() == ""
    assert took() < STOP_BUDGET + NOISE


def test_housekeeping_daemon_stuck_in_its_work_delays_exit_by_at_most_its_stop_timeout() -> None:
    """A daemon that ignores the stop is abandoned after its budget, with a warning."""
    budget = 0.3
    with Child(HOUSEKEEPING_CHILD.format(work="stuck_cleaner", budget=budget)) as child:
        child.expect("beat", "main done")
        with elapsed() as took:
            assert child.exits() == 0
        assert child.rest() == ["atexit ran"]  # "cleaner stopped" never printed
        assert "WARNING housekeeping did not stop within 0.3s" in child.stderr()
    assert took() < budget + NOISE


# --- what an atexit handler, and code run during finalization, may start -----------------

# The handler forks first, while the child has no thread but its main one, so that 3.12+
# has no reason to warn about forking a multi-threaded process; then it starts a
# non-daemon thread that never ends. Had exit joined that thread, the child would hang.
ATEXIT_START_CHILD = """
import atexit, os, threading

def report(what, outcome):
    print(what + ": " + outcome, flush=True)

def start_from_atexit():
    try:
        pid = os.fork()
    except BaseException as exc:
        report("fork", type(exc).__name__ + ": " + str(exc))
    else:
        if pid == 0:
            os._exit(7)
        report("fork", "child exited %d" % os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    ran = threading.Event()

    def never_ends():
        ran.set()
        threading.Event().wait()

    try:
        threading.Thread(target=never_ends, name="late").start()
    except BaseException as exc:
        report("thread", type(exc).__name__ + ": " + str(exc))
    else:
        report("thread", "started, ran=%s" % ran.wait(30))

atexit.register(start_from_atexit)
print("main done", flush=True)
"""


def atexit_may_start_threads() -> bool:
    """Whether this CPython lets an atexit handler start a thread or fork.

    3.12.0 refused both (gh-104690 checked a flag set before the atexit handlers ran);
    gh-113964 moved the check to after them, in 3.13.0 and, backported, in 3.12.3.
    """
    return not ((3, 12) <= sys.version_info[:3] < (3, 12, 3))


def test_what_an_atexit_handler_may_start_depends_on_the_version() -> None:
    """3.11 and 3.13 let an atexit handler fork and start a thread (not joined); 3.12.1 refuses."""
    with Child(ATEXIT_START_CHILD) as child:
        child.expect("main done")
        assert child.exits() == 0  # a thread started there is not waited for
        if atexit_may_start_threads():
            assert child.rest() == ["fork: child exited 7", "thread: started, ran=True"]
        else:
            assert child.rest() == [
                "fork: RuntimeError: can't fork at interpreter shutdown",
                "thread: RuntimeError: can't create new thread at interpreter shutdown",
            ]
        assert child.stderr() == ""


# A module global's __del__ runs while the interpreter finalizes its modules, after every
# atexit handler: it tries to start a (daemon) thread and to fork from there.
FINALIZING_CHILD = """
import os, sys, threading

class StartsAThreadWhenCollected:
    def __del__(self):
        os.write(1, b"finalizing: %s\\n" % str(sys.is_finalizing()).encode())
        try:
            threading.Thread(target=print, daemon=True).start()
        except BaseException as exc:
            os.write(1, ("thread: %s: %s\\n" % (type(exc).__name__, exc)).encode())
        try:
            pid = os.fork()
        except BaseException as exc:
            os.write(1, ("fork: %s: %s\\n" % (type(exc).__name__, exc)).encode())
        else:
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
            os.write(1, b"fork: forked\\n")

collected_at_exit = StartsAThreadWhenCollected()
print("main done", flush=True)
"""


def test_starting_a_thread_during_finalization_hangs_on_311_and_raises_since_312() -> None:
    """Once finalization has begun, 3.11.7 hangs in Thread.start; 3.12 and 3.13 raise instead."""
    with Child(FINALIZING_CHILD) as child:
        child.expect("main done", "finalizing: True")
        if sys.version_info < (3, 12):
            # The new thread never gets going and start() waits for it: the process
            # hangs until the parent kills it. 3.12 refuses instead (gh-104690).
            assert child.stays_alive()
            return
        error = "RuntimeError" if sys.version_info < (3, 13) else "PythonFinalizationError"
        assert child.exits() == 0
        assert child.rest() == [
            f"thread: {error}: can't create new thread at interpreter shutdown",
            f"fork: {error}: can't fork at interpreter shutdown",
        ]
        if sys.version_info >= (3, 13):
            assert issubclass(PythonFinalizationError, RuntimeError)  # noqa: F821


# --- threading._register_atexit: what it does, and why the project does not rely on it ----

REGISTER_ATEXIT_CHILD = """
import atexit, threading

atexit.register(print, "atexit ran", flush=True)
stopping = threading.Event()
started = threading.Event()

def worker():
    started.set()
    try:
        stopping.wait()
    finally:
        print("worker stopped", flush=True)

def stop():
    print("hook: stop", flush=True)
    stopping.set()

def fail():
    print("hook: fail", flush=True)
    raise RuntimeError("hook failed")

threading.Thread(target=worker, name="worker").start()
{hooks}
started.wait(30)
print("main done", flush=True)
"""


@cpython_detail
def test_cpython_detail_register_atexit_hooks_run_before_non_daemon_threads_are_joined() -> None:
    """CPython detail: a private _register_atexit hook can stop the thread P16 hangs on."""
    code = REGISTER_ATEXIT_CHILD.format(hooks="threading._register_atexit(stop)")
    with Child(code) as child:
        child.expect("main done")
        assert child.exits() == 0
        assert child.rest() == ["hook: stop", "worker stopped", "atexit ran"]


@cpython_detail
def test_cpython_detail_a_failing_register_atexit_hook_abandons_every_non_daemon_thread() -> None:
    """CPython detail: one failing hook skips the other hooks and the join, so finally is lost."""
    hooks = "threading._register_atexit(stop)\nthreading._register_atexit(fail)"
    with Child(REGISTER_ATEXIT_CHILD.format(hooks=hooks)) as child:
        child.expect("main done")
        assert child.exits() == 0
        assert child.rest() == ["hook: fail", "atexit ran"]  # no "hook: stop", no finally
        assert "RuntimeError: hook failed" in child.stderr()


def registered_function(call: Callable[[], object]) -> object:
    """The function a `threading._register_atexit` entry will call, on this version.

    3.11 and 3.12 store ``functools.partial(func, ...)``; 3.13 stores
    ``lambda: func(*arg, **kwargs)`` (gh-109653 dropped the functools import to speed
    up ``import threading``), so there ``func`` is found in the lambda's closure.
    """
    if sys.version_info < (3, 13):
        assert isinstance(call, functools.partial)
        return call.func
    assert not isinstance(call, functools.partial)
    assert call.__code__.co_name == "<lambda>"
    closure = dict(zip(call.__code__.co_freevars, call.__closure__ or (), strict=True))
    return closure["func"].cell_contents


@cpython_detail
def test_cpython_detail_concurrent_futures_joins_its_pools_through_register_atexit() -> None:
    """CPython detail: pool workers are joined by a _register_atexit hook, not by atexit."""
    registered = threading._threading_atexits  # the list _register_atexit appends to
    assert pool_module._python_exit in [registered_function(call) for call in registered]


# --- the service's contract, in process ---------------------------------------------------


def until_stopped(started: threading.Event) -> Callable[[threading.Event], None]:
    """Cooperative work: announce the start, then wait (bounded) for the stop event."""

    def work(stopping: threading.Event) -> None:
        started.set()
        stopping.wait(MUST_HAPPEN)

    return work


def test_stop_returns_within_its_budget_and_reports_work_that_ignores_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stuck thread cannot hold stop() past its timeout; the report says it is still alive."""
    gate = Gate("work that ignores the stop")
    service = BackgroundService(lambda stopping: gate.arrive(), name="stuck")
    service.start()
    gate.wait_reached()

    with elapsed() as took:
        report = service.stop(0.2)

    assert took() < 0.2 + NOISE
    assert report == StopReport(
        terminated=False, still_running=("stuck",), name="stuck", elapsed=report.elapsed
    )
    assert report.elapsed >= 0.15  # it did wait (a timed lock may wake a hair early)
    assert "stuck did not stop within 0.2s" in caplog.text
    gate.open()
    assert service.stop(MUST_HAPPEN) is report  # asking again returns the first report
    for thread in alive_named("stuck"):
        join_or_fail(thread)  # it does end once it can


def test_stop_is_idempotent_and_every_caller_gets_the_same_report() -> None:
    """Concurrent and repeated stops all return the one report, which says the thread ended."""
    started = threading.Event()
    service = BackgroundService(until_stopped(started), name="service")
    assert service.start() is service
    assert started.wait(MUST_HAPPEN)

    stoppers = [run_in_thread(lambda: service.stop(MUST_HAPPEN), f"stopper-{i}") for i in range(3)]
    for thread, _ in stoppers:
        join_or_fail(thread)

    [first, *others] = [outcome["result"] for _, outcome in stoppers]
    assert all(other is first for other in others)
    assert first.terminated
    assert first.still_running == ()
    again = service.stop(0)
    assert again is first
    assert again.error is None


def test_stop_before_start_reports_terminated_and_then_start_is_refused() -> None:
    """A service that never ran has nothing to wait for, and cannot be started afterwards."""
    service = BackgroundService(until_stopped(threading.Event()), name="never")
    report = service.stop(0)
    assert report.terminated
    assert report.still_running == ()
    with pytest.raises(RuntimeError, match="only be started once"):
        service.start()


def test_start_twice_is_refused() -> None:
    """One service, one thread: a second start raises instead of starting another."""
    started = threading.Event()
    service = BackgroundService(until_stopped(started), name="once")
    service.start()
    with pytest.raises(RuntimeError, match="only be started once"):
        service.start()
    assert service.stop(MUST_HAPPEN).terminated


def test_stop_refuses_a_negative_budget_and_none_means_stop_timeout() -> None:
    """A negative timeout is an error; None is the service's own budget, never "forever"."""
    with pytest.raises(ValueError, match="stop_timeout"):
        BackgroundService(until_stopped(threading.Event()), name="budget", stop_timeout=-1)
    service = BackgroundService(until_stopped(threading.Event()), name="budget")
    with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0"):
        service.stop(-1)
    gate = Gate("work that ignores the stop")
    deaf = BackgroundService(lambda stopping: gate.arrive(), name="deaf", stop_timeout=0.2)
    deaf.start()
    gate.wait_reached()
    try:
        with elapsed() as took:
            report = deaf.stop(None)
        assert took() < 0.2 + NOISE
        assert report.still_running == ("deaf",)
    finally:
        gate.open()
    for thread in alive_named("deaf"):
        join_or_fail(thread)


def test_work_that_raises_is_logged_and_returned_in_the_report(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An exception in the work is logged at ERROR with its traceback, and the report carries it."""

    def work(stopping: threading.Event) -> None:
        raise OSError("disk full")

    service = BackgroundService(work, name="failing")
    service.start()
    report = service.stop(MUST_HAPPEN)

    assert report.terminated
    assert isinstance(report.error, OSError)
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.getMessage() == "failing failed"
    assert record.exc_info is not None
    assert record.exc_info[1] is report.error


@pytest.mark.parametrize("kind", [BackgroundService, HousekeepingDaemon])
def test_stop_from_the_services_own_thread_is_a_request_that_returns_at_once(
    kind: type[BackgroundService],
) -> None:
    """A thread cannot wait for itself: its stop() sets the event and says it still runs."""
    seen: dict[str, object] = {}

    def work(stopping: threading.Event) -> None:
        seen["report"] = service.stop(MUST_HAPPEN)
        seen["stopping"] = stopping.is_set()

    service = kind(work, name="self-stopping")
    with elapsed() as took:
        service.start()
        report = service.stop(MUST_HAPPEN)
    assert took() < NOISE  # the request did not wait its MUST_HAPPEN budget for itself
    assert report.terminated
    assert report.error is None
    assert seen["stopping"] is True
    request = seen["report"]
    assert isinstance(request, StopReport)
    assert not request.terminated
    assert request.still_running == ("self-stopping",)
    assert request is not report  # a request is never the recorded report


def test_with_block_stops_the_service_even_when_the_body_raises() -> None:
    """Leaving the with-block, normally or not, stops the service with its stop_timeout."""
    started = threading.Event()

    def body() -> None:
        with BackgroundService(until_stopped(started), name="scoped"):
            assert started.wait(MUST_HAPPEN)
            raise KeyError("boom")

    with pytest.raises(KeyError):
        body()
    assert not any(t.name == "scoped" for t in threading.enumerate())


def test_run_with_service_stops_the_service_when_main_raises() -> None:
    """Main's finally stops the service, so an error in main does not leave it running."""
    started = threading.Event()
    stop_seen: list[bool] = []

    def work(stopping: threading.Event) -> None:
        started.set()
        stop_seen.append(stopping.wait(MUST_HAPPEN))

    def main() -> None:
        assert started.wait(MUST_HAPPEN)
        raise ValueError("main failed")

    with pytest.raises(ValueError, match="main failed"):
        run_with_service(main, work, name="background", stop_timeout=MUST_HAPPEN)
    assert stop_seen == [True]


def test_service_threads_are_non_daemon_and_housekeeping_threads_are_daemon() -> None:
    """The two classes differ in exactly what exit does with their thread."""
    service_started, daemon_started = threading.Event(), threading.Event()
    with (
        BackgroundService(until_stopped(service_started), name="svc"),
        HousekeepingDaemon(until_stopped(daemon_started), name="hk"),
    ):
        assert service_started.wait(MUST_HAPPEN)
        assert daemon_started.wait(MUST_HAPPEN)
        daemon_flags = {t.name: t.daemon for t in threading.enumerate()}
    assert daemon_flags["svc"] is False
    assert daemon_flags["hk"] is True


def test_an_explicit_stop_unregisters_the_housekeeping_atexit_handler() -> None:
    """Once stopped, nothing (atexit included) holds the daemon: it is garbage-collected."""
    daemon = HousekeepingDaemon(until_stopped(threading.Event()), name="hk")
    daemon.start()
    assert daemon.stop(MUST_HAPPEN).terminated
    collected = weakref.ref(daemon)
    del daemon
    gc.collect()
    assert collected() is None


def test_every_ticks_at_once_and_a_stop_cuts_the_interval_short() -> None:
    """The first tick runs at once; a stop ends the wait for the next one immediately."""
    ticked = threading.Event()
    service = BackgroundService(every(60 * MUST_HAPPEN, ticked.set), name="ticker")
    service.start()
    assert ticked.wait(MUST_HAPPEN)
    thread = next(t for t in threading.enumerate() if t.name == "ticker")
    wait_until_blocked_in(thread, "wait")  # parked in the interval wait

    started = time.monotonic()
    report = service.stop(MUST_HAPPEN)

    assert report.terminated
    assert time.monotonic() - started < NOISE  # far below the 600 s interval


# --- start() is all or nothing, and stop() is bounded even while start() runs ---------------


def alive_named(name: str) -> list[threading.Thread]:
    """Threads of that name still alive."""
    return [t for t in threading.enumerate() if t.name == name and t.is_alive()]


@pytest.mark.parametrize("kind", [BackgroundService, HousekeepingDaemon])
def test_a_thread_that_cannot_start_leaves_nothing_running_and_stop_reports_it(
    kind: type[BackgroundService],
) -> None:
    """start() re-raises the failure; nothing runs and no atexit handler is left registered."""
    service = kind(until_stopped(threading.Event()), name="unstartable")
    with thread_start_patched(1, cannot_start), pytest.raises(RuntimeError, match="can't start"):
        service.start()
    assert alive_named("unstartable") == []
    collected = weakref.ref(service)  # no atexit registration may keep it alive
    del service
    gc.collect()
    assert collected() is None


@pytest.mark.parametrize("kind", [BackgroundService, HousekeepingDaemon])
def test_an_interrupt_landing_inside_start_stops_the_thread_that_did_start(
    kind: type[BackgroundService],
) -> None:
    """A Ctrl-C after the thread began but before start() returned stops it before re-raising."""
    started = threading.Event()
    service = kind(until_stopped(started), name="interrupted", stop_timeout=MUST_HAPPEN)
    with (
        thread_start_patched(1, start_then_interrupt),
        pytest.raises(KeyboardInterrupt),
    ):
        service.start()
    assert alive_named("interrupted") == []  # the caller never got a service to stop
    assert service.stop(0).terminated
    collected = weakref.ref(service)  # no atexit registration may keep it alive
    del service
    gc.collect()
    assert collected() is None


def test_run_with_service_interrupted_while_starting_leaves_no_thread_behind() -> None:
    """run_with_service has no service to stop if start() raised: start() must clean up."""
    main_ran: list[bool] = []
    with (
        thread_start_patched(1, start_then_interrupt),
        pytest.raises(KeyboardInterrupt),
    ):
        run_with_service(
            lambda: main_ran.append(True),
            until_stopped(threading.Event()),
            name="background",
            stop_timeout=MUST_HAPPEN,
        )
    assert main_ran == []
    assert alive_named("background") == []


def test_stop_racing_start_returns_within_its_budget_and_the_work_ends() -> None:
    """A stop() while start() is still starting the thread keeps its budget and never raises."""
    gate = Gate("Thread.start in progress")

    ran = threading.Event()
    service = BackgroundService(until_stopped(ran), name="racing")
    with thread_start_patched(2, start_at(gate)):  # the 1st start is the starter thread's
        starter, outcome = run_in_thread(service.start, "starter")
        try:
            gate.wait_reached()
            with elapsed() as took:
                report = service.stop(0.2)
        finally:
            gate.open()
            join_or_fail(starter)
    assert took() < 0.2 + NOISE
    assert not report.terminated  # it could not know yet: the thread was being started
    assert report.still_running == ("racing",)
    assert "error" not in outcome
    assert service.stop(MUST_HAPPEN) is report
    for thread in alive_named("racing"):
        join_or_fail(thread)  # the work saw the stop event and ends


# --- the lifecycle contract on the paths users take -------------------------------

P25 = ("P25", "a Ctrl-C inside Thread.join() marks a live thread finished: the next report lies")
E1 = ("E1", "a handler that sets the event main is waiting on deadlocks")

KINDS = [BackgroundService, HousekeepingDaemon]


@pytest.mark.parametrize("kind", ["BackgroundService", "HousekeepingDaemon"])
def test_with_a_started_service_enters_it_stops_it_and_the_program_exits(kind: str) -> None:
    """``with X(...).start(): pass`` in a fresh interpreter ends at once with status 0."""
    code = f"""
from patterns.daemon_threads import {kind}
with {kind}(lambda stopping: stopping.wait(), name="entered").start() as service:
    pass
print(service.stop(0).terminated)
"""
    try:
        result = run_python(code, timeout=MUST_HAPPEN)
    except subprocess.TimeoutExpired:
        pytest.fail("the child never exited: a non-daemon thread was left running")
    assert (result.returncode, result.stdout) == (0, "True\n"), result.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_entering_a_running_service_returns_it_and_a_stopped_one_refuses(
    kind: type[BackgroundService],
) -> None:
    """Entered while running it is the same object, stopped on exit; entered after stop, raises."""
    started = threading.Event()
    service = kind(until_stopped(started), name="entered", stop_timeout=MUST_HAPPEN)
    with service.start() as entered:
        assert entered is service
        assert started.wait(MUST_HAPPEN)
    report = service.stop(0)
    assert report.terminated
    with pytest.raises(RuntimeError, match="stopped"), service:
        pass
    with pytest.raises(RuntimeError, match="only be started once"):
        service.start()


def test_a_report_cannot_say_terminated_while_naming_a_running_thread() -> None:
    """StopReport refuses terminated=True with a non-empty still_running."""
    with pytest.raises(ValueError, match="terminated=True with still_running"):
        StopReport(terminated=True, still_running=("svc",), name="svc", elapsed=0.0)


@pytest.mark.race(*P25)
@pytest.mark.parametrize("kind", KINDS)
def test_ctrl_c_during_stop_propagates_and_the_next_report_still_names_the_running_thread(
    kind: type[BackgroundService],
) -> None:
    """Reports wait on the thread's own end signal, so a Ctrl-C inside stop() cannot fool them."""
    gate = Gate("work that ignores its stop")
    service = kind(lambda stopping: gate.arrive(), name="deaf")
    service.start()
    gate.wait_reached()
    try:
        with signal_main_during("stop", parked=True), pytest.raises(KeyboardInterrupt):
            service.stop(MUST_HAPPEN)
        report = service.stop(0)
        assert not report.terminated
        assert report.still_running == ("deaf",)
    finally:
        gate.open()
    assert service.stop(MUST_HAPPEN) is report  # the first completed report is the record
    for thread in alive_named("deaf"):
        join_or_fail(thread)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("budget", [math.inf, 1e10, 1e300])
def test_an_unbounded_budget_waits_as_long_as_it_takes_and_never_overflows(
    kind: type[BackgroundService], budget: float
) -> None:
    """Budgets of inf or huge values, in the constructor or in stop(), mean "until it ends"."""
    started = threading.Event()
    service = kind(until_stopped(started), name="patient", stop_timeout=budget).start()
    assert started.wait(MUST_HAPPEN)
    report = service.stop()
    assert report.terminated
    other = kind(until_stopped(threading.Event()), name="patient-too").start()
    assert other.stop(budget).terminated


@pytest.mark.parametrize("bad", [math.nan, -1, -math.inf, True, "1", None, [1]])
def test_a_bad_number_of_seconds_is_a_value_error_naming_the_argument(bad: object) -> None:
    """nan, negative, bool and non-numbers are refused wherever seconds are taken."""
    work = until_stopped(threading.Event())
    for kind in KINDS:
        with pytest.raises(ValueError, match="stop_timeout must be a number of seconds"):
            kind(work, name="bad", stop_timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="interval must be a number of seconds"):
        every(bad, lambda: None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stop_timeout must be a number of seconds"):
        run_with_service(lambda: None, work, name="bad", stop_timeout=bad)  # type: ignore[arg-type]
    if bad is not None:  # stop(None) means stop_timeout
        service = BackgroundService(work, name="bad")
        with pytest.raises(ValueError, match="timeout must be a number of seconds"):
            service.stop(bad)  # type: ignore[arg-type]
        assert service.stop(0).terminated


def test_every_with_an_infinite_interval_ticks_once_and_stops_at_once() -> None:
    """every(inf, tick) never overflows: it ticks, then waits for the stop alone."""
    ticked = threading.Event()
    service = BackgroundService(every(math.inf, ticked.set), name="once").start()
    assert ticked.wait(MUST_HAPPEN)
    assert service.stop(MUST_HAPPEN).terminated


@pytest.mark.race(*E1)
@pytest.mark.parametrize("kind", ["BackgroundService", "HousekeepingDaemon"])
def test_stop_from_a_signal_handler_during_stop_returns_a_provisional_report_at_once(
    kind: str,
) -> None:
    """A handler's stop() on the thread already inside stop() must not wait for itself."""
    setup = f"""
from patterns.daemon_threads import {kind}
service = {kind}(lambda stopping: release.wait(20), name="svc", stop_timeout=20).start()
"""
    assert handler_stops_during_stop(setup) == "False ('svc',) True True True\n"


@pytest.mark.race(*E1)
@pytest.mark.parametrize("kind", ["BackgroundService", "HousekeepingDaemon"])
def test_stop_from_a_signal_handler_inside_the_stops_own_event_set_does_not_deadlock(
    kind: str,
) -> None:
    """The handler's stop() must not set the stop event: the stop it interrupted may hold its lock.

    Forced: the signal lands inside that stop()'s ``stopping.set()``. The handler's stop
    returns a provisional report at once; the interrupted stop goes on and records the end.
    """
    setup = f"from patterns.daemon_threads import {kind} as Kind"
    assert handler_stops_inside_the_stop_event_set(setup) == "False True True True\n"


def test_a_second_stop_waits_only_its_own_budget_and_its_report_is_not_recorded() -> None:
    """A stop racing a longer one returns provisionally on its own deadline; the first records."""
    gate = Gate("work that ignores its stop")
    service = BackgroundService(lambda stopping: gate.arrive(), name="slow").start()
    gate.wait_reached()
    first, outcome = run_in_thread(lambda: service.stop(MUST_HAPPEN), "first-stopper")
    try:
        wait_until_parked_inside(first, "stop")
        with elapsed() as took:
            second = service.stop(0.2)
        assert took() < 0.2 + NOISE
        assert not second.terminated
        assert second.still_running == ("slow",)
    finally:
        gate.open()
        join_or_fail(first)
    recorded = outcome["result"]
    assert recorded.terminated
    assert service.stop(0) is recorded
    assert second is not recorded


def test_a_request_from_the_daemons_own_thread_keeps_it_stopped_at_exit() -> None:
    """Only the recorded stop unregisters: after a request from its own thread, exit still waits.

    The work's cleanup after the request ends only once the main thread is seen waiting in
    the daemon's atexit stop (10 s budget). Without the registration no stop waits for it and
    the interpreter kills it mid-cleanup, however quick the cleanup would be.
    """
    code = """
import threading
from patterns.daemon_threads import HousekeepingDaemon
from tests.support import wait_until_parked_inside

def work(stopping):
    try:
        daemon.stop(0)  # a request: it cannot wait for its own thread
    except RuntimeError:
        pass
    wait_until_parked_inside(threading.main_thread(), "stop")  # exit waits for this cleanup
    print("cleanup done", flush=True)

daemon = HousekeepingDaemon(work, name="hk", stop_timeout=10)
daemon.start()
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "cleanup done\n"


def test_a_refused_second_start_leaves_the_running_daemon_stopped_at_exit() -> None:
    """The atexit stop of the running daemon survives a refused start(): its work ends cleanly."""
    code = """
import logging, sys
from patterns.daemon_threads import HousekeepingDaemon

def work(stopping):
    stopping.wait()
    print("stopped at exit", flush=True)

daemon = HousekeepingDaemon(work, name="hk", stop_timeout=10).start()
try:
    daemon.start()
except RuntimeError:
    print("refused", flush=True)
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "refused\nstopped at exit\n"
