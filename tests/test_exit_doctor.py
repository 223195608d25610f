"""The exit doctor on each way a program can hang at exit, each in a child process.

Every hazard program is a file under ``examples/exit_doctor/`` (the docs page shows them and
their reports). The child runs it under ``python -m patterns.exit_doctor --after AFTER
--kill``: the doctor's own ``--after`` is the bounded wait, its ``--kill`` ends the child
with status 3, and ``subprocess.run(timeout=...)`` turns a doctor that failed to act into a
test failure instead of a hang.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from patterns.exit_doctor import KILL_STATUS
from tests.support import child_env, run_python

ROOT = Path(__file__).resolve().parent.parent
HAZARDS = ROOT / "examples" / "exit_doctor"
AFTER = "1"
DEADLINE = 45.0  # the child's whole run; a healthy one takes AFTER plus its start-up


def doctor(*args: str, after: str = AFTER, kill: bool = True) -> subprocess.CompletedProcess[str]:
    """``python -m patterns.exit_doctor --after AFTER [--kill] args...``, run to its end."""
    command = [sys.executable, "-m", "patterns.exit_doctor", "--after", after]
    return subprocess.run(
        [*command, *(["--kill"] if kill else []), *args],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
        cwd=ROOT,
    )


def line_of(path: Path, text: str) -> int:
    """The number of the first line of ``path`` that contains ``text``."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {path}")


def started_at(path: Path, text: str) -> str:
    """What the report says about a thread started on the line of ``path`` holding ``text``."""
    return f"started at {path.relative_to(ROOT)}:{line_of(path, text)} in "


def stack_line(path: Path, text: str, function: str) -> str:
    """A stack entry as the report prints it (the traceback module's format)."""
    return f'File "{path.relative_to(ROOT)}", line {line_of(path, text)}, in {function}'


def assert_killed_after_report(run: subprocess.CompletedProcess[str]) -> None:
    """The program reached its end, then the doctor reported and ended it with its status."""
    assert run.stdout.splitlines()[-1:] == ["main done"], run.stdout
    assert run.returncode == KILL_STATUS, (run.returncode, run.stderr)
    assert run.stderr.endswith(
        f"exit-doctor: ending the process with status {KILL_STATUS} (kill=True)\n"
    ), run.stderr


# --- the six hazards ------------------------------------------------------------------------


def test_a_non_daemon_thread_in_event_wait_is_named_with_where_it_started_and_waits() -> None:
    """A thread the exit joins is reported by name, start line and its own stack."""
    program = HAZARDS / "stuck_thread.py"
    run = doctor(str(program.relative_to(ROOT)))
    assert_killed_after_report(run)
    assert "exit-doctor: the process has not exited 1 s after the main thread finished" in (
        run.stderr
    )
    assert "main thread is in threading._shutdown, which joins every non-daemon thread" in (
        run.stderr
    )
    assert f"non-daemon thread 'waiter' ({started_at(program, '.start()')}<module>)" in run.stderr
    assert stack_line(program, "stop.wait()", "work") in run.stderr


def test_a_stuck_executor_task_is_found_in_concurrent_futures_exit_hook() -> None:
    """A pool never shut down: the exit hook joins its worker, and the report names the task."""
    program = HAZARDS / "stuck_executor.py"
    run = doctor(str(program.relative_to(ROOT)))
    assert_killed_after_report(run)
    assert "main thread is in threading._shutdown, in concurrent.futures' exit hook" in run.stderr
    # started by the pool inside submit(); the report names the program's submit line
    assert f"non-daemon thread 'pool_0' ({started_at(program, 'pool.submit')}<module>" in (
        run.stderr
    )
    assert stack_line(program, "release.wait()", "stuck") in run.stderr
    task = f"{program.relative_to(ROOT)}:{line_of(program, 'def stuck')}"
    assert f"executor worker 'pool_0': running stuck ({task})" in run.stderr


def test_a_queue_feeder_blocked_on_a_full_pipe_is_found_in_multiprocessing_exit_hook() -> None:
    """The feeder is a daemon thread, yet multiprocessing's atexit handler joins it."""
    program = HAZARDS / "unflushed_queue.py"
    run = doctor(str(program.relative_to(ROOT)))
    assert_killed_after_report(run)
    assert "main thread is running multiprocessing's atexit handler" in run.stderr
    assert "in _finalize_join" in run.stderr
    assert "multiprocessing queue feeder thread (a daemon, but joined at exit) " in run.stderr
    assert f"'QueueFeederThread' ({started_at(program, 'q.put')}<module>" in run.stderr
    assert re.search(r"in _send\n\s+n = write\(self._handle, buf\)", run.stderr), run.stderr


def test_a_blocking_atexit_handler_is_named_with_where_it_was_registered() -> None:
    """The main thread's outermost frame is the handler; the doctor recorded its registration."""
    program = HAZARDS / "blocking_atexit.py"
    run = doctor(str(program.relative_to(ROOT)))
    assert_killed_after_report(run)
    where = f"{program.relative_to(ROOT)}:{line_of(program, 'atexit.register')}"
    assert (
        f"main thread is running the atexit handler flush_on_exit, registered at {where}"
        in run.stderr
    )
    assert stack_line(program, "flushed.wait()", "flush_on_exit") in run.stderr
    assert "non-daemon thread" not in run.stderr


def test_a_pool_never_closed_does_not_hold_the_exit_on_any_version() -> None:
    """The multiprocessing exit handler terminates the pool's daemon workers: no hang, no report.

    Checked on 3.11, 3.12 and 3.13: the task still running in a worker is killed, the
    process exits with status 0, and the doctor (given 1 s) stays silent. The test fails if
    a version starts to hold the exit here: the doctor would report and exit with status 3.
    """
    program = HAZARDS / "unclosed_pool.py"
    run = doctor(str(program.relative_to(ROOT)))
    assert (run.returncode, run.stdout, run.stderr) == (0, "main done\n", "")


def test_asyncio_run_waiting_for_its_default_executor_is_reported_before_main_returns() -> None:
    """The doctor counts from the moment asyncio.run starts waiting for the executor's threads."""
    program = HAZARDS / "asyncio_executor.py"
    run = doctor(str(program.relative_to(ROOT)))
    assert_killed_after_report(run)
    assert (
        "the process has not exited 1 s after asyncio.run began waiting for its default executor"
        in run.stderr
    )
    assert "main thread is in asyncio.run, which waits for its default executor's threads" in (
        run.stderr
    )
    assert stack_line(program, "asyncio.run(main())", "<module>") in run.stderr
    assert f"non-daemon thread 'asyncio_0' ({started_at(program, 'run_in_executor')}main" in (
        run.stderr
    )
    assert stack_line(program, "release.wait()", "blocking") in run.stderr
    assert "executor worker 'asyncio_0': running blocking (" in run.stderr


# --- where versions differ ------------------------------------------------------------------

SHORT_EXECUTOR_TIMEOUT = """
import asyncio.constants
import runpy
import sys

asyncio.constants.THREAD_JOIN_TIMEOUT = 0.3  # 300 s in the standard library (3.12+)
runpy.run_path(sys.argv[1], run_name="__main__")
print("asyncio.run returned", flush=True)
"""


def test_only_3_13_ends_asyncio_run_s_wait_at_its_timeout_and_then_the_exit_still_waits(
    tmp_path: Path,
) -> None:
    """3.11 has no timeout; 3.12.1 applies it only after the wait; 3.13 stops waiting.

    asyncio.run's timeout for its default executor (300 s from 3.12) is shortened to 0.3 s.
    On 3.11 and 3.12 the main thread is still in asyncio.run when the doctor reports
    (3.12.1 awaits the shutdown with no timeout and only bounds the join after it). On 3.13
    asyncio.run warns, gives up and returns, and the exit then waits for the same worker in
    concurrent.futures' exit hook: the doctor reports that instead.
    """
    wrapper = tmp_path / "short_timeout.py"
    wrapper.write_text(SHORT_EXECUTOR_TIMEOUT, encoding="utf-8")
    run = doctor(str(wrapper), str(HAZARDS / "asyncio_executor.py"), after="1.5")
    assert run.returncode == KILL_STATUS, run.stderr
    assert "executor worker 'asyncio_0': running blocking (" in run.stderr
    if sys.version_info >= (3, 13):
        assert run.stdout == "main done\nasyncio.run returned\n"
        assert "did not finishing joining its threads within 0.3 seconds" in run.stderr
        assert "after the main thread finished" in run.stderr
        assert "main thread is in threading._shutdown, in concurrent.futures' exit hook" in (
            run.stderr
        )
    else:
        assert run.stdout == "main done\n"
        assert "main thread is in asyncio.run, which waits for its default executor's threads" in (
            run.stderr
        )


THREAD_FROM_ATEXIT = """
import atexit
import threading

never = threading.Event()


def hook():
    try:
        threading.Thread(target=print, args=("helper thread ran",)).start()
    except RuntimeError as exc:
        print(f"refused: {type(exc).__name__}: {exc}", flush=True)
    never.wait()


atexit.register(hook)
"""


def test_only_3_12_refuses_a_thread_started_in_an_atexit_handler_and_the_doctor_reports_anyway(
    tmp_path: Path,
) -> None:
    """3.12.1 refuses new threads at exit (3.11 and 3.13.0 allow them); the watchdog predates it.

    That refusal is why the doctor starts its watchdog at install, not when the exit begins:
    the report comes on every version.
    """
    program = tmp_path / "thread_at_exit.py"
    program.write_text(THREAD_FROM_ATEXIT, encoding="utf-8")
    run = doctor(str(program))
    refused = sys.version_info[:2] == (3, 12)
    expected = (
        "refused: RuntimeError: can't create new thread at interpreter shutdown\n"
        if refused
        else "helper thread ran\n"
    )
    assert run.stdout == expected
    assert run.returncode == KILL_STATUS
    assert "main thread is running the atexit handler hook, registered at " in run.stderr


# --- the program's own exit, signals, and the ways in ----------------------------------------


def test_a_program_that_exits_on_time_gets_no_report_and_keeps_its_exit_status(
    tmp_path: Path,
) -> None:
    """The doctor is silent, and ``sys.exit(7)`` is still status 7."""
    program = tmp_path / "fine.py"
    program.write_text(
        "import sys, threading\n"
        "t = threading.Thread(target=print, args=('worker ran',))\n"
        "t.start()\n"
        "t.join()\n"
        "print(__name__, sys.argv[1:])\n"
        "sys.exit(7)\n",
        encoding="utf-8",
    )
    run = doctor(str(program), "a", "--b", after="0.5")
    assert (run.returncode, run.stdout, run.stderr) == (
        7,
        "worker ran\n__main__ ['a', '--b']\n",
        "",
    )


def test_an_exception_in_the_program_shows_its_own_traceback_and_status_1(tmp_path: Path) -> None:
    """The traceback starts at the program, as without the doctor, and nothing else is said."""
    program = tmp_path / "fails.py"
    program.write_text("def f():\n    return 1 / 0\n\nf()\n", encoding="utf-8")
    run = doctor(str(program))
    assert run.returncode == 1
    assert run.stderr.startswith("Traceback (most recent call last):\n")
    assert f'File "{program}", line 4, in <module>' in run.stderr
    assert run.stderr.endswith("ZeroDivisionError: division by zero\n")
    assert "exit_doctor" not in run.stderr
    assert "runpy" not in run.stderr


def test_a_module_runs_with_dash_m_as_python_would_run_it(tmp_path: Path) -> None:
    """``-m package.module args`` runs it as ``__main__`` with its file as ``argv[0]``."""
    package = tmp_path / "hazpkg"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "tool.py").write_text(
        "import sys\nprint(__name__, sys.argv[0].endswith('tool.py'), sys.argv[1:])\n",
        encoding="utf-8",
    )
    env = child_env()
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    run = subprocess.run(
        [sys.executable, "-m", "patterns.exit_doctor", "-m", "hazpkg.tool", "x", "-v"],
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )
    assert (run.returncode, run.stdout, run.stderr) == (0, "__main__ True ['x', '-v']\n", "")


DEAF_WORKER = """
import signal
import threading

deaf = threading.Event()


def on_term(signum, frame):
    print("the program's handler ran", flush=True)


signal.signal(signal.SIGTERM, on_term)
print("getsignal returns the program's handler:", signal.getsignal(signal.SIGTERM) is on_term)
worker = threading.Thread(target=deaf.wait, name="deaf")
worker.start()
print("ready", flush=True)
worker.join()  # the handler asked nothing of the worker, so this never returns
"""


def test_a_sigterm_the_program_handles_starts_the_count_and_its_handler_still_runs(
    tmp_path: Path,
) -> None:
    """After SIGTERM the doctor waits ``--after``, then reports the main thread still running."""
    program = tmp_path / "deaf.py"
    program.write_text(DEAF_WORKER, encoding="utf-8")
    command = [sys.executable, "-m", "patterns.exit_doctor", "--after", AFTER, "--kill"]
    with subprocess.Popen(
        [*command, str(program)],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as child:
        try:
            assert child.stdout is not None
            assert child.stdout.readline() == "getsignal returns the program's handler: True\n"
            assert child.stdout.readline() == "ready\n"
            child.send_signal(signal.SIGTERM)
            out, err = child.communicate(timeout=DEADLINE)
        finally:
            child.kill()
    assert out == "the program's handler ran\n"
    assert child.returncode == KILL_STATUS
    assert "the process has not exited 1 s after SIGTERM arrived" in err
    assert "main thread is still running the program:" in err
    assert f'File "{program}", line {line_of(program, "worker.join()")}, in <module>' in err
    assert "non-daemon thread 'deaf' (started at " in err


def test_without_kill_the_doctor_reports_once_and_leaves_the_process_alone() -> None:
    """The report ends with a line saying so, and the process is still there after it."""
    program = HAZARDS / "stuck_thread.py"
    command = [sys.executable, "-m", "patterns.exit_doctor", "--after", "0.5", str(program)]
    with subprocess.Popen(
        command, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as child:
        try:
            assert child.stderr is not None
            lines = []
            for line in child.stderr:
                lines.append(line)
                if line.startswith("exit-doctor: leaving the process"):
                    break
            alive = child.poll() is None
        finally:
            child.kill()
            child.communicate(timeout=DEADLINE)
    assert lines[-1] == "exit-doctor: leaving the process as it is (kill=False)\n", lines
    assert "non-daemon thread 'waiter'" in "".join(lines)
    assert alive


def test_the_use_it_example_ends_with_status_3_and_names_the_forgotten_thread() -> None:
    """install() from the program's own code: the report names the thread, then kills."""
    example = ROOT / "examples" / "exit_doctor_use.py"
    run = subprocess.run(
        [sys.executable, str(example)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )
    assert run.stdout == "main: work finished\n"
    assert run.returncode == KILL_STATUS
    start = line_of(example, ".start()")
    assert f"non-daemon thread 'metrics-uploader' (started at {example}:{start} in <module>)" in (
        run.stderr
    )
    assert f'File "{example}", line {line_of(example, "uploads_done.wait()")}' in run.stderr


INSTALL_THEN_POOL = """
from patterns import exit_doctor

exit_doctor.install(after=1, kill=True)

import threading  # imported after install: their exit hooks are registered after the doctor's
from concurrent.futures import ThreadPoolExecutor

entered = threading.Event()
pool = ThreadPoolExecutor(thread_name_prefix="late")
pool.submit(lambda: (entered.set(), threading.Event().wait()))
entered.wait()
print("main done", flush=True)
"""


def test_install_counts_from_the_end_of_main_even_with_executors_imported_after_it() -> None:
    """The doctor's exit hook runs before concurrent.futures' join, whatever the import order.

    Hooks registered with ``threading._register_atexit`` run newest first: had the doctor
    registered its hook before ``concurrent.futures.thread`` was imported, the pool's join
    would run first and the doctor would never start counting. ``install()`` imports it first.
    """
    run = run_python(INSTALL_THEN_POOL, timeout=DEADLINE)
    assert_killed_after_report(run)
    assert "not exited 1 s after the main thread finished" in run.stderr
    assert "executor worker 'late_0': running <lambda> (<string>:" in run.stderr


def test_a_subprocess_a_thread_waits_for_is_listed_with_where_it_was_made(tmp_path: Path) -> None:
    """Popen objects made after install are tracked: pid, arguments, the line that made them."""
    program = tmp_path / "waits_for_child.py"
    program.write_text(
        textwrap.dedent(
            """
            import subprocess, sys, threading
            child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                                     stdin=subprocess.PIPE)
            threading.Thread(target=child.wait, name="reaper").start()
            print("main done", flush=True)
            """
        ),
        encoding="utf-8",
    )
    run = doctor(str(program))
    assert_killed_after_report(run)
    assert re.search(
        rf"subprocess pid \d+ \[.*'-c', 'import sys; sys.stdin.read\(\)'\] "
        rf"\(started at {re.escape(str(program))}:3 in <module>\)",
        run.stderr,
    ), run.stderr
    assert "non-daemon thread 'reaper'" in run.stderr


INSTALL_TWICE = """
import atexit, signal, subprocess, threading
before = (threading.Thread.start, atexit.register, subprocess.Popen.__init__,
          signal.signal, signal.getsignal, signal.getsignal(signal.SIGINT))
from patterns import exit_doctor
first = exit_doctor.install(after=30)
second = exit_doctor.install(after=1, kill=True)
print("same handle:", first is second, first.after, first.kill)
real_signal = before[3]
installed = real_signal(signal.SIGINT, before[5])  # read what is really installed...
real_signal(signal.SIGINT, installed)  # ...and put it back
print("installed:", type(installed).__name__, installed.handler is before[5])
print("getsignal shows the program's:", signal.getsignal(signal.SIGINT) is before[5])
first.uninstall()
first.uninstall()
after = (threading.Thread.start, atexit.register, subprocess.Popen.__init__,
         signal.signal, signal.getsignal, signal.getsignal(signal.SIGINT))
print("restored:", after == before)
print("third is new:", exit_doctor.install() is not first)
"""


def test_install_is_idempotent_and_uninstall_restores_everything_it_patched() -> None:
    """A second install returns the first handle; uninstall (twice) puts every original back."""
    run = run_python(INSTALL_TWICE)
    assert run.stderr == ""
    assert run.stdout.splitlines() == [
        "same handle: True 30.0 False",
        "installed: _Chained True",
        "getsignal shows the program's: True",
        "restored: True",
        "third is new: True",
    ]


@pytest.mark.parametrize("after", ["-1", "nan", "soon"])
def test_a_bad_after_is_refused_with_status_2(after: str) -> None:
    """Seconds are checked: a negative, nan or non-number ``--after`` is a usage error."""
    run = doctor(str(HAZARDS / "stuck_thread.py"), after=after)
    assert run.returncode == 2
    assert "usage: python -m patterns.exit_doctor" in run.stderr


def test_a_missing_script_is_one_line_and_status_2() -> None:
    """Like ``python missing.py``: no traceback."""
    run = doctor("no_such_program.py")
    assert run.returncode == 2
    assert "can't open file 'no_such_program.py'" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the page's reports come from 3.11")
def test_the_reports_on_the_docs_page_are_what_the_doctor_prints_today() -> None:
    """The page shows real runs: each kept report equals a fresh run of its hazard."""
    spec = importlib.util.spec_from_file_location(
        "exit_doctor_reports", ROOT / "scripts" / "exit_doctor_reports.py"
    )
    assert spec
    assert spec.loader
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.names() == sorted(p.stem for p in HAZARDS.glob("*.py"))
    assert len(script.names()) == 6
    for name in script.names():
        kept = (script.REPORTS / f"{name}.txt").read_text(encoding="utf-8")
        assert kept == script.report(name), f"run python scripts/exit_doctor_reports.py ({name})"


ON_DEMAND = """
import threading
from patterns import exit_doctor

doctor = exit_doctor.install(after=60)
release = threading.Event()
worker = threading.Thread(target=release.wait, name="busy")
worker.start()
print(exit_doctor.diagnose())
release.set()
worker.join()
doctor.uninstall()
"""


def test_diagnose_on_demand_shows_the_running_program_and_its_threads() -> None:
    """``diagnose()`` is the same report at any time: main still running, the thread's start."""
    run = run_python(ON_DEMAND)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("exit-doctor: a report asked for; what holds the exit:\n")
    assert "main thread is still running the program:\n" in run.stdout
    assert "non-daemon thread 'busy' (started at <string>:8 in <module>):\n" in run.stdout
