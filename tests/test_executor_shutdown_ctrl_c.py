"""Ctrl-C through ``with TrackingExecutor(...)``, in a real child process and real SIGINTs.

The child's task blocks until the test writes a line to the child's stdin; each signal is
sent only once the child has printed (or logged) that it reached the point under test.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import textwrap
from collections.abc import Iterator

from tests.support import MUST_HAPPEN, ChildLines, spawn_python, wait_until

CHILD = textwrap.dedent(
    """
    import logging, sys, threading
    from patterns.executor_shutdown import TrackingExecutor

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    release = threading.Event()

    def until_released():
        sys.stdin.readline()
        release.set()

    threading.Thread(target=until_released, daemon=True).start()
    pool = TrackingExecutor(max_workers=1, thread_name_prefix="pool", stop_timeout=60)
    try:
        with pool:
            pool.submit(release.wait)
            pool.submit(print, "a queued task ran")
            print("inside the with block", flush=True)
            threading.Event().wait()  # until Ctrl-C
    finally:
        print("report:", pool.report, flush=True)
    """
)


def parked(pid: int) -> bool:
    """Whether the process's main thread is asleep in a futex (a lock or GIL wait).

    A SIGINT sent just before a thread enters a timed lock wait is seen by Python only when
    the wait times out (the C handler ran before the wait began, so nothing interrupts it);
    one sent while the thread sleeps in the futex interrupts the wait at once.
    """
    with open(f"/proc/{pid}/task/{pid}/wchan", encoding="ascii") as wchan:
        return wchan.read().startswith("futex")


def interrupt(child: subprocess.Popen[str]) -> None:
    """Send SIGINT once the child's main thread is parked in a wait."""
    wait_until(lambda: parked(child.pid), "the child's main thread waits")
    child.send_signal(signal.SIGINT)


@contextlib.contextmanager
def _interrupted_once() -> Iterator[tuple[subprocess.Popen[str], ChildLines, ChildLines]]:
    """The child, after one Ctrl-C inside its with block and its WARNING line; killed after."""
    child = spawn_python(CHILD)
    try:
        assert child.stdout is not None
        assert child.stderr is not None
        out, err = ChildLines(child.stdout), ChildLines(child.stderr)
        out.expect("inside the with block")
        interrupt(child)
        line = err.expect("waiting up to")
        assert line.startswith("WARNING "), line
        assert "60s" in line, line
        yield child, out, err
    finally:
        child.kill()
        child.wait(timeout=MUST_HAPPEN)
        for pipe in (child.stdin, child.stdout, child.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()


def _release(child: subprocess.Popen[str]) -> None:
    assert child.stdin is not None
    child.stdin.write("go\n")
    child.stdin.close()


def test_a_ctrl_c_through_the_with_block_says_it_waits_and_keeps_the_report() -> None:
    """One WARNING line says how long it waits; the report is logged and kept; one traceback."""
    with _interrupted_once() as (child, out, err):
        _release(child)
        assert child.wait(timeout=MUST_HAPPEN) == -signal.SIGINT
        stdout, stderr = out.rest(), err.rest()
        assert "report: ShutdownReport(terminated=True" in stdout, stdout
        assert "a queued task ran" in stdout.splitlines()  # the graceful stop ran the queued task
        assert "stopped after KeyboardInterrupt: terminated" in stderr, stderr
        assert stderr.count("waiting up to") == 1, stderr
        assert stderr.count("Traceback (most recent call last)") == 1, stderr
        assert "During handling" not in stderr, stderr


def test_a_second_ctrl_c_stops_now_with_one_line_and_one_traceback() -> None:
    """The second Ctrl-C cancels what never started, names what runs, raises one interrupt."""
    with _interrupted_once() as (child, out, err):
        interrupt(child)
        line = err.expect("stopping now")
        assert "still running: pool_0" in line, line
        assert "1 never started" in line, line
        _release(child)  # the running task ends; then the interpreter can exit
        assert child.wait(timeout=MUST_HAPPEN) == -signal.SIGINT
        stdout, stderr = out.rest(), err.rest()
        assert "report: ShutdownReport(terminated=False, still_running=('pool_0',)" in stdout, (
            stdout
        )
        assert "a queued task ran" not in stdout.splitlines()
        assert stderr.count("Traceback (most recent call last)") == 1, stderr
        assert "During handling" not in stderr, stderr
        assert stderr.count("stopping now") == 1, stderr
