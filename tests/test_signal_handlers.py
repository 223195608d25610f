"""Signal handlers: the first signal drains, the second exits; each pitfall forced, and the pattern.

Signals and exits cannot be tested in the test process, so almost every test starts a child
interpreter (the harness is tests/test_exit_hooks.py's). The child prints flushed marker
lines; the parent reads them, with a timeout, before it sends a signal or writes to the
child's stdin, so every interleaving is forced. The handle's own contract is checked in this
process, in its main thread.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any
from unittest import mock

import pytest

from patterns.signal_handlers import (
    SignalHandlers,
    SignalHandlersReport,
    install_signal_handlers,
    run_until_signalled,
)
from tests.support import (
    MUST_HAPPEN,
    NOISE,
    Gate,
    cannot_start,
    child_env,
    elapsed,
    join_or_fail,
    recording_hook,
    run_in_thread,
    thread_start_patched,
    wait_until,
)
from tests.test_exit_hooks import Child, how_it_ended, run_child

# The bound for a forced exit: a second signal ends the process within a second.
FORCED_EXIT_BOUND = 1.0

# What the "kubelet" in the Kubernetes-style tests allows between SIGTERM and SIGKILL.
# Generous, like MUST_HAPPEN: the child exits long before it on any machine.
GRACE_PERIOD = MUST_HAPPEN


def run_group(code: str, timeout: float = MUST_HAPPEN * 3) -> subprocess.CompletedProcess[str]:
    """Run a child in a process group of its own; SIGKILL the whole group when it is done.

    For children that fork: a grandchild that ignores SIGTERM would otherwise outlive the
    test and hold the output pipes open. The group also lets a child send a "terminal"
    Ctrl-C to itself and its children only.
    """
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=MUST_HAPPEN)
        stderr += f"\n[test: timed out after {timeout}s; the process group was killed]"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # any grandchild left behind
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


# Child code shared by several tests: helpers that let the child announce where its main
# thread is, so the parent acts only once it is there.
WATCH_MAIN = """
import inspect, sys, threading, time

def say(line):
    sys.stdout.write(line + "\\n")  # one write per line: threads may say things at once
    sys.stdout.flush()

def main_frames():
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None:
        yield frame
        frame = frame.f_back

def say_when(condition, line):
    # Observe the main thread from a helper instead of guessing how long it takes.
    def watch():
        while not condition():
            time.sleep(0.001)  # polling an observation, not waiting for a race
        say(line)
    threading.Thread(target=watch, name="watcher", daemon=True).start()

def main_is_in(callee, caller):
    return any(f.f_code.co_name == callee and f.f_back is not None
               and f.f_back.f_code.co_name == caller for f in main_frames())

# The line of Condition.wait where a wait without timeout blocks in C, GIL released.
_src, _first = inspect.getsourcelines(threading.Condition.wait)
BLOCKED_LINE = _first + next(i for i, text in enumerate(_src)
                             if text.strip() == "waiter.acquire()"
                             and _src[i - 1].strip() == "if timeout is None:")

def main_in_event_wait(caller):
    # Condition.wait, called by Event.wait, called by caller (Thread.start waits too).
    frames = list(main_frames())
    return (len(frames) >= 3 and frames[0].f_code is threading.Condition.wait.__code__
            and frames[0].f_lineno == BLOCKED_LINE and frames[2].f_code.co_name == caller)

def main_sleep_mark():
    # The main thread's context switches if the kernel has it asleep now, else None (Linux).
    path = "/proc/self/task/%d/status" % threading.main_thread().native_id
    with open(path) as status:
        fields = dict(line.split(":", 1) for line in status.read().splitlines())
    if not fields["State"].strip().startswith("S"):
        return None
    return fields["voluntary_ctxt_switches"], fields["nonvoluntary_ctxt_switches"]

def main_is_asleep_in_event_wait(caller):
    # On the blocking line is not yet asleep: acquire releases the GIL, and only then
    # sleeps in the kernel. A signal landing in between runs CPython's C handler, which
    # sets a flag, and the sleep that follows is never interrupted: the main thread
    # sleeps on and never raises (tests/support.py, asleep_in_a_wait). So the kernel must
    # also have it asleep, twice with no switch between: the second read releases the
    # GIL, which wakes a thread that was only waiting for the GIL.
    if not main_in_event_wait(caller):
        return False
    first = main_sleep_mark()
    return (first is not None and main_sleep_mark() == first
            and main_in_event_wait(caller))
"""


# --- install_signal_handlers: the handle's contract (in this process, main thread) --------


@pytest.fixture
def saved_handlers() -> Iterator[None]:
    """Put back every handler a test may change, and the wakeup fd, whatever happens."""
    sigs = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGINT, signal.SIGTERM)
    saved = {s: signal.getsignal(s) for s in sigs}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(-1)


def noop(signum: int, frame: FrameType | None) -> None:
    """A Python-level handler that does nothing."""


@pytest.mark.usefixtures("saved_handlers")
def test_closing_the_handle_restores_the_previous_handlers_exactly():
    """After stop() each signal has its previous handler object: SIG_DFL, SIG_IGN or a callable."""
    signal.signal(signal.SIGUSR1, noop)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # SIG_IGN in a background job
    sigs = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGINT)
    before = {s: signal.getsignal(s) for s in sigs}

    handlers = install_signal_handlers(lambda: None, signals=sigs)
    assert all(signal.getsignal(s) is not before[s] for s in sigs)
    handlers.stop()
    assert {s: signal.getsignal(s) for s in sigs} == before
    assert all(signal.getsignal(s) is before[s] for s in sigs)
    assert signal.set_wakeup_fd(-1) == -1  # no wakeup fd left behind

    with SignalHandlers(lambda: None, signals=sigs) as again:
        assert again.signals == sigs
    assert all(signal.getsignal(s) is before[s] for s in sigs)
    again.stop()  # closing twice is harmless
    assert again.stopped


@pytest.mark.usefixtures("saved_handlers")
def test_the_constructor_checks_its_options_and_starts_nothing():
    """No thread, no pipe, no handler until start(); a bad option is a ValueError naming it."""
    threads, fds = set(threading.enumerate()), open_fds()
    handlers = SignalHandlers(lambda: None, signals=(signal.SIGUSR1,), stop_timeout=2.5)
    assert handlers.stop_timeout == 2.5
    assert set(threading.enumerate()) == threads
    assert open_fds() == fds
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    assert signal.set_wakeup_fd(-1) == -1
    for bad, name in [({"stop_timeout": -1}, "stop_timeout"), ({"signals": ()}, "signals")]:
        with pytest.raises(ValueError, match=name):
            SignalHandlers(lambda: None, **bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="signals"):
        SignalHandlers(lambda: None, signals=(999,))


@pytest.mark.usefixtures("saved_handlers")
def test_start_runs_once_and_stop_returns_the_same_report_every_time():
    """start() twice or after stop() raises; stop() wants the main thread, then is idempotent."""
    handlers = SignalHandlers(lambda: None, signals=(signal.SIGUSR1,)).start()
    with pytest.raises(RuntimeError, match="once"):
        handlers.start()
    thread, outcome = run_in_thread(handlers.stop, "not-main")
    join_or_fail(thread)
    assert isinstance(outcome["error"], RuntimeError)
    assert signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL  # still ours
    with pytest.raises(ValueError, match="timeout"):
        handlers.stop(-1)
    report = handlers.stop()
    assert report == SignalHandlersReport(terminated=True, still_running=(), first_signal=None)
    assert handlers.stop() is report
    assert handlers.stop(0) is report
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    with pytest.raises(RuntimeError, match="once"):
        handlers.start()


def test_stop_before_start_reports_terminated_and_start_is_then_refused():
    """A never-started handle stops from any thread, changes nothing, and cannot start later."""
    handlers = SignalHandlers(lambda: None, signals=(signal.SIGUSR1,))
    thread, outcome = run_in_thread(handlers.stop, "not-main")
    join_or_fail(thread)
    report = outcome["result"]
    assert report == SignalHandlersReport(terminated=True, still_running=(), first_signal=None)
    assert handlers.stop() is report
    with pytest.raises(RuntimeError, match="once"):
        handlers.start()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


@pytest.mark.usefixtures("saved_handlers")
def test_the_first_signal_calls_on_stop_once_in_a_thread_other_than_main():
    """on_stop runs once, off the main thread; a signal that is not ours does not count."""
    others: list[int] = []
    signal.signal(signal.SIGUSR2, lambda signum, frame: others.append(signum))
    called = threading.Event()
    calls: list[str] = []

    def on_stop() -> None:
        calls.append(threading.current_thread().name)
        called.set()

    with SignalHandlers(on_stop, signals=(signal.SIGUSR1,)) as handlers:
        signal.raise_signal(signal.SIGUSR2)  # also written to the wakeup fd; must be ignored
        signal.raise_signal(signal.SIGUSR1)
        assert called.wait(MUST_HAPPEN)
        assert handlers.first_signal == signal.SIGUSR1
    report = handlers.stop()  # the report of the stop() that leaving the block made
    assert (report.terminated, report.first_signal) == (True, signal.SIGUSR1)
    assert others == [signal.SIGUSR2]  # the other handler still ran, in the main thread
    assert calls == ["on-stop"]


@pytest.mark.usefixtures("saved_handlers")
def test_install_signal_handlers_refuses_to_run_outside_the_main_thread():
    """From another thread it raises a RuntimeError that says why, and changes nothing."""
    before = signal.getsignal(signal.SIGUSR1)
    thread, outcome = run_in_thread(
        lambda: install_signal_handlers(lambda: None, signals=(signal.SIGUSR1,)), "not-main"
    )
    join_or_fail(thread)
    error = outcome["error"]
    assert isinstance(error, RuntimeError)
    assert "main thread" in str(error)
    assert signal.getsignal(signal.SIGUSR1) is before


@pytest.mark.usefixtures("saved_handlers")
def test_installing_is_all_or_nothing():
    """If one signal cannot be handled, the handlers installed before it are put back."""
    signal.signal(signal.SIGUSR1, noop)
    with pytest.raises(OSError, match="Invalid argument"):  # SIGKILL cannot be caught
        install_signal_handlers(lambda: None, signals=(signal.SIGUSR1, signal.SIGKILL))
    assert signal.getsignal(signal.SIGUSR1) is noop
    assert signal.set_wakeup_fd(-1) == -1


@pytest.mark.usefixtures("saved_handlers")
def test_a_second_install_is_refused_while_the_first_is_open():
    """Only one handle can own the wakeup fd; the second install says so and changes nothing."""
    with SignalHandlers(lambda: None, signals=(signal.SIGUSR1,)):
        installed = signal.getsignal(signal.SIGUSR1)
        with pytest.raises(RuntimeError, match="wakeup fd is already set"):
            install_signal_handlers(lambda: None, signals=(signal.SIGUSR1, signal.SIGUSR2))
        assert signal.getsignal(signal.SIGUSR1) is installed
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL


def open_fds() -> set[str]:
    """This process's open file descriptors (Linux)."""
    return set(os.listdir("/proc/self/fd"))


def fail_on_call(
    k: int, real: Callable[..., object], error: BaseException
) -> Callable[..., object]:
    """A stand-in for ``real`` whose k-th call raises ``error``; the others call ``real``."""
    calls = 0

    def flaky(*args: object) -> object:
        nonlocal calls
        calls += 1
        if calls == k:
            raise error
        return real(*args)

    return flaky


@pytest.mark.usefixtures("saved_handlers")
def test_a_dispatcher_that_cannot_start_leaves_handlers_wakeup_fd_and_fds_as_they_were():
    """Thread.start failing part-way through install re-raises and changes nothing."""
    signal.signal(signal.SIGUSR1, noop)
    fds = open_fds()
    error = RuntimeError("can't start new thread")
    flaky = fail_on_call(1, threading.Thread.start, error)
    with mock.patch.object(threading.Thread, "start", flaky), pytest.raises(RuntimeError) as info:
        install_signal_handlers(lambda: None, signals=(signal.SIGUSR1, signal.SIGUSR2))
    assert info.value is error
    assert signal.getsignal(signal.SIGUSR1) is noop
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL
    assert signal.set_wakeup_fd(-1) == -1
    assert open_fds() == fds  # the pipe was closed


@pytest.mark.usefixtures("saved_handlers")
def test_a_signal_that_lands_while_a_failing_install_runs_never_calls_on_stop():
    """A signal caught half-way through an install that then fails is dropped with it."""
    real = signal.signal
    installs = 0

    def flaky(signum: int, handler: object) -> object:
        nonlocal installs
        installs += 1
        if installs == 2:  # SIGUSR1 has our handler, SIGUSR2 is next: fail here
            signal.raise_signal(signal.SIGUSR1)  # lands in the window, written to the pipe
            raise OSError(22, "Invalid argument")
        return real(signal.Signals(signum), handler)  # type: ignore[arg-type]

    called = threading.Event()
    with (
        mock.patch.object(signal, "signal", flaky),
        pytest.raises(OSError, match="Invalid argument"),
    ):
        install_signal_handlers(called.set, signals=(signal.SIGUSR1, signal.SIGUSR2))
    # Install joined the dispatcher before it raised: whatever it was going to do, it did.
    assert not called.is_set()
    assert not [t for t in threading.enumerate() if t.name == "on-stop"]
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    assert signal.set_wakeup_fd(-1) == -1


@pytest.mark.usefixtures("saved_handlers")
def test_a_ctrl_c_before_install_took_sigint_raises_and_leaves_nothing_behind():
    """KeyboardInterrupt half-way through install: everything put back, on_stop never called."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    real = signal.signal
    first = True

    def ctrl_c_first(signum: int, handler: object) -> object:
        nonlocal first
        if first:  # SIGTERM is about to be taken; SIGINT still raises KeyboardInterrupt
            first = False
            signal.raise_signal(signal.SIGINT)  # its number also goes into our pipe
        return real(signal.Signals(signum), handler)  # type: ignore[arg-type]

    called = threading.Event()
    fds = open_fds()
    with mock.patch.object(signal, "signal", ctrl_c_first), pytest.raises(KeyboardInterrupt):
        install_signal_handlers(called.set, signals=(signal.SIGTERM, signal.SIGINT))
    assert not called.is_set()
    assert not [t for t in threading.enumerate() if t.name == "on-stop"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.set_wakeup_fd(-1) == -1
    assert open_fds() == fds


@pytest.mark.usefixtures("saved_handlers")
def test_a_second_ctrl_c_while_closing_still_puts_everything_back_then_raises():
    """Once SIGINT's old handler is back it may raise; stop() finishes first, then re-raises."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGUSR1, noop)
    fds = open_fds()
    handlers = install_signal_handlers(lambda: None, signals=(signal.SIGINT, signal.SIGUSR1))
    real = signal.signal
    pressed = False

    def ctrl_c_once_sigint_is_back(signum: int, handler: object) -> object:
        nonlocal pressed
        previous = real(signal.Signals(signum), handler)  # type: ignore[arg-type]
        if signum == signal.SIGINT and not pressed:
            pressed = True
            signal.raise_signal(signal.SIGINT)  # the impatient Ctrl-C, at the worst moment
        return previous

    with (
        mock.patch.object(signal, "signal", ctrl_c_once_sigint_is_back),
        pytest.raises(KeyboardInterrupt),
    ):
        handlers.stop()
    assert handlers.stopped
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGUSR1) is noop
    assert signal.set_wakeup_fd(-1) == -1
    assert not [t for t in threading.enumerate() if t.name == "signal-dispatcher"]
    assert open_fds() == fds
    assert handlers.stop().terminated  # a second stop returns the report the first made


@pytest.mark.usefixtures("saved_handlers")
def test_a_signal_that_lands_while_installing_is_acted_on_and_stop_stays_bounded(
    caplog: pytest.LogCaptureFixture,
):
    """Caught by our handler mid-install, it calls on_stop once; stop() waits at most 1 s."""
    real = signal.signal

    def signal_after_first(signum: int, handler: object) -> object:
        previous = real(signal.Signals(signum), handler)  # type: ignore[arg-type]
        if signum == signal.SIGUSR1:  # ours now; SIGUSR2 not yet
            signal.raise_signal(signal.SIGUSR1)
        return previous

    gate = Gate("on_stop")
    calls: list[str] = []

    def on_stop() -> None:
        calls.append(threading.current_thread().name)
        gate.arrive()

    with mock.patch.object(signal, "signal", signal_after_first):
        handlers = install_signal_handlers(on_stop, signals=(signal.SIGUSR1, signal.SIGUSR2))
    try:
        gate.wait_reached()
        assert handlers.first_signal == signal.SIGUSR1
        with elapsed() as took:
            report = handlers.stop()  # on_stop is stuck at the gate: stop() gives up on it
        assert took() < 1.0 + NOISE
        assert report == SignalHandlersReport(False, ("on-stop",), signal.SIGUSR1)
        assert "on_stop is still running 1s after stop()" in caplog.text
    finally:
        gate.open()
    for thread in threading.enumerate():
        if thread.name == "on-stop":
            join_or_fail(thread)
    assert calls == ["on-stop"]


@pytest.mark.usefixtures("saved_handlers")
def test_on_stop_still_runs_when_no_thread_can_be_started_for_it(caplog: pytest.LogCaptureFixture):
    """If Thread.start fails for on_stop, the dispatcher survives and calls it itself."""
    called = threading.Event()
    ran_in: list[str] = []

    def on_stop() -> None:
        ran_in.append(threading.current_thread().name)
        called.set()

    flaky = fail_on_call(2, threading.Thread.start, RuntimeError("can't start new thread"))
    with (
        mock.patch.object(threading.Thread, "start", flaky),  # 1: dispatcher, 2: on-stop
        SignalHandlers(on_stop, signals=(signal.SIGUSR1,)) as handlers,
    ):
        signal.raise_signal(signal.SIGUSR1)
        assert called.wait(MUST_HAPPEN)
        assert handlers.first_signal == signal.SIGUSR1
    assert ran_in == ["signal-dispatcher"]
    assert "could not start a thread for on_stop" in caplog.text


def test_a_handler_installed_outside_python_is_left_alone():
    """getsignal() is None for a C-level handler, which could not be put back: it is refused."""
    code = """
        import signal
        from patterns.signal_handlers import install_signal_handlers
        print(signal.getsignal(signal.SIGABRT), flush=True)  # faulthandler's C handler
        try:
            install_signal_handlers(lambda: None, signals=(signal.SIGTERM, signal.SIGABRT))
        except ValueError as exc:
            print("refused:", exc, flush=True)
        untouched = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        print(untouched, signal.set_wakeup_fd(-1), flush=True)
    """
    with Child(code, "-X", "faulthandler") as child:
        child.expect("None")
        line = child.out.get(timeout=MUST_HAPPEN)
        assert line.startswith("refused: SIGABRT has a handler installed outside Python")
        child.expect("True -1")
        assert child.wait() == 0


# --- P18: SIGTERM's default action skips finally and atexit -----------------------------

NAIVE_SERVICE = """
import atexit, sys
from patterns.naive.signal_handlers import naive_run_until_interrupted
atexit.register(print, "atexit ran", flush=True)

def work(stop):
    print("ready", flush=True)
    stop.wait()
    print("work stopped", flush=True)

try:
    naive_run_until_interrupted(work, cleanup=lambda: print("cleanup ran", flush=True))
finally:
    print("finally ran", flush=True)
"""


@pytest.mark.race("P18", "SIGTERM's default action skips finally and atexit")
def test_naive_default_sigterm_skips_the_cleanup_finally_and_atexit(
    record_property: Callable[[str, object], None],
):
    """Without a SIGTERM handler the process dies at once: no cleanup, no finally, no atexit."""
    with Child(NAIVE_SERVICE) as child:
        child.expect("ready")
        child.send(signal.SIGTERM)
        status = child.wait()
        record_property(
            "observed",
            f"{how_it_ended(status)}, printed after 'ready':"
            f" {child.rest() or 'nothing, no cleanup, no finally, no atexit'}",
        )
        assert status == -signal.SIGTERM
        assert child.rest() == []


@pytest.mark.race("P18", "SIGTERM's default action skips finally and atexit")
def test_first_sigterm_calls_on_stop_once_and_the_process_exits_0_after_its_cleanup():
    """With the handlers, SIGTERM calls on_stop once; main's finally, then atexit run; status 0."""
    code = """
        import atexit, threading
        from patterns.signal_handlers import SignalHandlers
        atexit.register(print, "atexit ran", flush=True)
        stop = threading.Event()

        def on_stop():
            print("on_stop called", flush=True)
            stop.set()

        with SignalHandlers(on_stop):
            try:
                print("ready", flush=True)
                stop.wait()
            finally:
                print("finally ran", flush=True)
    """
    with Child(code) as child:
        child.expect("ready")
        child.send(signal.SIGTERM)
        assert child.wait() == 0
        assert child.rest() == ["on_stop called", "finally ran", "atexit ran"]


# --- P22: a signal taken by another thread does not wake the main thread -------------------

# Thread-directed: signal.pthread_kill aims SIGTERM at a helper thread, as the kernel aims
# a synchronous signal (SIGSEGV, SIGFPE) at the thread that caused it.

WORKER_GETS_THE_SIGNAL = (
    WATCH_MAIN
    + """
import signal
from patterns.signal_handlers import install_signal_handlers
from patterns.naive.signal_handlers import naive_install_stop_handler
stop = threading.Event()
{install}(stop.set)

def signal_this_thread():
    while not main_is_asleep_in_event_wait("<module>"):
        time.sleep(0.001)  # polling an observation, not waiting for a race
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # to this thread, not main
    say("signalled a worker thread")

helper = threading.Thread(target=signal_this_thread, name="helper")
helper.start()
stop.wait()  # no timeout
say("stopped")
helper.join()
"""
)


@pytest.mark.race("P22", "a signal caught by a worker thread never wakes a main thread in wait()")
def test_naive_handler_leaves_the_main_thread_asleep_when_a_worker_got_the_signal(
    record_property: Callable[[str, object], None],
):
    """The handler waits for the main thread to run bytecode, and it sleeps in Event.wait()."""
    code = WORKER_GETS_THE_SIGNAL.format(install="naive_install_stop_handler")
    with Child(code) as child:
        child.expect("signalled a worker thread")
        signalled_at = time.monotonic()
        assert child.stays_alive()  # the signal arrived, and the main thread sleeps on
        child.send(signal.SIGTERM)  # to the process: the main thread gets this one, and wakes
        child.expect("stopped")
        record_property(
            "observed",
            f"a worker took SIGTERM, main slept on {time.monotonic() - signalled_at:.1f}s,"
            " until a second SIGTERM to the process woke it",
        )
        assert child.wait() == 0


@pytest.mark.race("P22", "a signal caught by a worker thread never wakes a main thread in wait()")
def test_a_signal_delivered_to_a_worker_thread_still_wakes_the_main_thread():
    """The wakeup fd is written from the worker, so on_stop runs and the main thread wakes."""
    code = WORKER_GETS_THE_SIGNAL.format(install="install_signal_handlers")
    with Child(code) as child:
        lines = {child.out.get(timeout=MUST_HAPPEN) for _ in range(2)}
        assert lines == {"signalled a worker thread", "stopped"}  # in either order
        assert child.wait() == 0


# A process-directed signal (kill, Ctrl-C, docker stop) goes, on Linux, to the main thread
# whenever the main thread does not block it. The trap needs one of two things: a signal
# aimed at a worker thread (above), or a main thread that blocks the signal, so that the
# kernel hands it to a worker instead (below).
MASKED = (
    WATCH_MAIN
    + """
import signal
from patterns.signal_handlers import install_signal_handlers
from patterns.naive.signal_handlers import naive_install_stop_handler
stop = threading.Event()
{install}(stop.set)
worker_ready = threading.Event()

def work():
    {worker_mask}
    worker_ready.set()
    stop.wait()

worker = threading.Thread(target=work, name="worker")
worker.start()
worker_ready.wait()
{main_mask}
say_when(lambda: main_is_asleep_in_event_wait("<module>"), "main asleep")
stop.wait()  # no timeout
say("stopped")
worker.join(10)  # bounded: the parent waits for the output, not for ever
"""
)
BLOCK_SIGTERM = "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})"


def sigterm_is_pending(pid: int) -> bool:
    """Whether SIGTERM waits, undelivered, in the process's shared pending set (Linux)."""
    status = Path(f"/proc/{pid}/status").read_text()
    pending = next(line for line in status.splitlines() if line.startswith("ShdPnd:"))
    return bool(int(pending.split()[1], 16) >> (signal.SIGTERM - 1) & 1)


def masked_child(install: str, *, main_mask: str = "", worker_mask: str = "pass") -> Child:
    """Start the MASKED child with these handlers and signal masks."""
    code = MASKED.format(install=install, main_mask=main_mask, worker_mask=worker_mask)
    return Child(code)


@pytest.mark.race("P22", "a signal caught by a worker thread never wakes a main thread in wait()")
def test_naive_handler_sleeps_through_sigterm_when_the_main_thread_blocks_it(
    record_property: Callable[[str, object], None],
):
    """With SIGTERM blocked in main, the kernel gives it to a worker, and main sleeps on."""
    with masked_child("naive_install_stop_handler", main_mask=BLOCK_SIGTERM) as child:
        child.expect("main asleep")
        child.send(signal.SIGTERM)  # process-directed, as kill and docker stop send it
        wait_until(lambda: not sigterm_is_pending(child.proc.pid), "SIGTERM was delivered")
        delivered_at = time.monotonic()
        alive = child.stays_alive()
        record_property(
            "observed",
            f"SIGTERM delivered (main blocks it, so to a worker), and"
            f" {time.monotonic() - delivered_at:.1f}s later the process"
            f" {'still ran' if alive else 'had exited'}",
        )
        assert alive  # a worker took it; the handler waits for main's bytecode


@pytest.mark.race("P22", "a signal caught by a worker thread never wakes a main thread in wait()")
def test_the_wakeup_fd_wakes_the_main_thread_even_when_it_blocks_the_signal():
    """Whichever thread takes SIGTERM writes the pipe, so on_stop runs and main wakes."""
    with masked_child("install_signal_handlers", main_mask=BLOCK_SIGTERM) as child:
        child.expect("main asleep")
        child.send(signal.SIGTERM)
        child.expect("stopped")
        assert child.wait() == 0


@pytest.mark.race("P22", "a signal caught by a worker thread never wakes a main thread in wait()")
def test_blocking_the_signal_in_the_workers_instead_leaves_it_to_the_main_thread():
    """pthread_sigmask in each worker, not in main: only main can take SIGTERM, and it wakes."""
    with masked_child("naive_install_stop_handler", worker_mask=BLOCK_SIGTERM) as child:
        child.expect("main asleep")
        child.send(signal.SIGTERM)
        child.expect("stopped")
        assert child.wait() == 0


@pytest.mark.skipif(sys.platform != "linux", reason="how Linux picks the receiving thread")
def test_on_linux_a_process_signal_reaches_a_main_thread_that_does_not_block_it():
    """Nobody blocks SIGTERM: Linux gives kill()'s signal to main; the naive handler works."""
    with masked_child("naive_install_stop_handler") as child:
        child.expect("main asleep")
        child.send(signal.SIGTERM)
        child.expect("stopped")
        assert child.wait() == 0


# --- E1: a handler that sets the event the main thread is waiting on deadlocks ------------

SIGNAL_INSIDE_WAIT = """
import faulthandler, signal, sys, threading
from patterns.signal_handlers import install_signal_handlers
from patterns.naive.signal_handlers import naive_install_stop_handler
faulthandler.register(signal.SIGUSR1)  # lets the parent see where the child is stuck
stop = threading.Event()
{install}(stop.set)

def land_signal_inside_wait(frame, event, arg):
    # Deliver SIGTERM at the exact moment stop.wait() holds the event's internal lock, as a
    # signal arriving at that instruction would.
    if frame.f_code is not threading.Event.wait.__code__:
        return None
    def on_line(frame, event, arg):
        if event == "line" and stop._cond._lock.locked():
            sys.settrace(None)
            print("signal lands while stop.wait() holds the event's lock", flush=True)
            signal.raise_signal(signal.SIGTERM)
            return None
        return on_line
    return on_line

sys.settrace(land_signal_inside_wait)
stop.wait()
sys.settrace(None)
print("stopped", flush=True)
"""


@pytest.mark.race("E1", "a handler that sets the event main is waiting on deadlocks")
def test_naive_handler_that_sets_the_event_main_is_waiting_on_deadlocks(
    record_property: Callable[[str, object], None],
):
    """The handler runs inside stop.wait() and waits for the lock its own thread holds: forever."""
    with Child(SIGNAL_INSIDE_WAIT.format(install="naive_install_stop_handler")) as child:
        child.expect("signal lands while stop.wait() holds the event's lock")
        landed_at = time.monotonic()
        assert child.stays_alive()
        child.send(signal.SIGTERM)  # a second SIGTERM re-enters the handler: stuck again
        assert child.stays_alive()
        child.send(signal.SIGUSR1)  # faulthandler dumps every stack
        dump = child.expect_err(lambda line: line.endswith("in <module>"))
        frames = [line.rsplit(" in ", 1)[-1] for line in dump if line.startswith("  File")]
        record_property(
            "observed",
            f"deadlocked {time.monotonic() - landed_at:.1f}s through 2 SIGTERMs, stack: "
            + " <- ".join(f for f in frames if f in {"set", "handler", "wait"}),
        )
        assert frames.index("set") < frames.index("handler") < frames.index("wait")
        # Only SIGKILL ends it (leaving the with-block kills the child).


@pytest.mark.race("E1", "a handler that sets the event main is waiting on deadlocks")
def test_on_stop_can_set_the_event_the_main_thread_is_waiting_on():
    """on_stop runs in its own thread, so it waits for the main thread to release the lock."""
    with Child(SIGNAL_INSIDE_WAIT.format(install="install_signal_handlers")) as child:
        child.expect("signal lands while stop.wait() holds the event's lock", "stopped")
        assert child.wait() == 0


# --- P24: a second Ctrl-C during the graceful shutdown --------------------------------------

NAIVE_CTRL_C = (
    WATCH_MAIN
    + """
import logging, signal
from patterns.naive.signal_handlers import naive_run_until_interrupted
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
logging.basicConfig(stream=sys.stdout, format="log: %(message)s")

def work(stop):
    sys.stdin.readline()  # stuck until the parent answers; it does not watch stop
    say("work finished")

# Each Ctrl-C is sent only once the main thread is asleep in the lock of an Event.wait():
# a KeyboardInterrupt landing in a Condition's bookkeeping instead (before it sleeps) can
# leave the event's lock held, and the worker's done.set() would then hang for ever.
logged = threading.Event()
class Logged(logging.Handler):
    def emit(self, record):
        logged.set()
logging.getLogger().addHandler(Logged())
say_when(lambda: main_is_asleep_in_event_wait("naive_run_until_interrupted"), "waiting")
say_when(lambda: logged.is_set() and main_is_asleep_in_event_wait("naive_run_until_interrupted"),
         "draining")
naive_run_until_interrupted(work, cleanup=lambda: say("cleanup ran"))
"""
)


@pytest.mark.race("P24", "a second Ctrl-C during the graceful shutdown")
def test_naive_second_ctrl_c_abandons_the_cleanup_and_the_stuck_worker_holds_the_exit(
    record_property: Callable[[str, object], None],
):
    """The second KeyboardInterrupt skips the cleanup, and exit still waits for the worker."""
    with Child(NAIVE_CTRL_C) as child:
        child.expect("waiting")
        child.send(signal.SIGINT)
        child.expect("log: interrupted: stopping gracefully", "draining")
        child.send(signal.SIGINT)
        second_at = time.monotonic()
        assert child.stays_alive()  # a traceback, then stuck joining the worker at exit
        child.write("release\n")
        status = child.wait()
        cleanup = "cleanup ran" if "cleanup ran" in child.rest() else "no cleanup"
        record_property(
            "observed",
            f"2nd Ctrl-C: exit waited {time.monotonic() - second_at:.1f}s for the stuck worker,"
            f" then {how_it_ended(status)}, {cleanup}",
        )
        assert status == -signal.SIGINT
        assert child.rest() == ["work finished"]  # and never "cleanup ran"
        assert "KeyboardInterrupt" in child.stderr()


SECOND_SIGNAL = """
import sys, threading
from patterns.signal_handlers import SignalHandlers
stop = threading.Event()

def on_stop():
    print("on_stop called", flush=True)
    stop.set()

worker = threading.Thread(target=sys.stdin.readline, name="stuck-worker")  # non-daemon
with SignalHandlers(on_stop):
    worker.start()
    print("ready", flush=True)
    stop.wait()
    print("draining", flush=True)
    worker.join()  # stuck: the parent never writes to stdin
print("never printed")
"""


@pytest.mark.race("P24", "a second Ctrl-C during the graceful shutdown")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_second_signal_forces_the_exit_within_a_second_even_with_a_stuck_thread(sig: int):
    """The second signal exits with 128 + signum (143, 130) within a second, on_stop ran once."""
    with Child(SECOND_SIGNAL) as child:
        child.expect("ready")
        child.send(sig)
        child.expect("on_stop called", "draining")
        assert child.stays_alive()  # draining, and the worker is stuck
        start = time.monotonic()
        child.send(sig)
        status = child.wait()
        took = time.monotonic() - start
        assert status == 128 + sig
        assert took < FORCED_EXIT_BOUND, f"forced exit took {took:.3f}s"
        assert child.rest() == []  # on_stop once; nothing after the drain ran
        err = child.stderr()
        name = signal.Signals(sig).name
        assert f"second signal ({name}) while stopping: exiting now with status {status}" in err
        assert "stuck-worker" in err


def test_an_on_stop_that_raises_is_logged_and_the_second_signal_still_forces_the_exit():
    """A failing on_stop is logged with its traceback; the second signal still exits with 143."""
    code = """
        import threading
        from patterns.signal_handlers import SignalHandlers

        def on_stop():
            raise RuntimeError("on_stop broke")

        with SignalHandlers(on_stop):
            print("ready", flush=True)
            threading.Event().wait()  # never set: only the second signal ends this
    """
    with Child(code) as child:
        child.expect("ready")
        child.send(signal.SIGTERM)
        seen = child.expect_err(lambda line: line == "RuntimeError: on_stop broke")
        assert "on_stop failed; a second signal still forces the exit" in seen
        child.send(signal.SIGTERM)
        assert child.wait() == 143


# --- A Kubernetes-style termination ---------------------------------------------------------

SERVICE = """
import atexit, logging, sys
from patterns.signal_handlers import force_exit, run_until_signalled
logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="log: %(message)s")
atexit.register(print, "atexit ran", flush=True)
queue = ["a", "b", "c"]  # stands for a durable job queue

def work(stop):
    while queue and not stop.is_set():
        item = queue[0]
        print("working on", item, flush=True)
        sys.stdin.readline()  # the item takes as long as the parent says
        {finish}
    if queue:
        print("handed back", queue, flush=True)  # still queued: another replica takes them

drained = run_until_signalled(
    work, drain_timeout={drain}, cleanup=lambda: print("cleanup ran", flush=True)
)
if not drained:
    force_exit(1, "work overran its drain budget")
"""


def kubelet_stop(child: Child, before_sigkill: Callable[[], None]) -> tuple[int, float]:
    """Send SIGTERM, let ``before_sigkill`` talk to the child, SIGKILL at the grace deadline.

    Returns the exit status and the seconds from SIGTERM to exit.
    """
    start = time.monotonic()
    child.send(signal.SIGTERM)
    before_sigkill()
    try:
        status = child.wait(max(0.0, GRACE_PERIOD - (time.monotonic() - start)))
    except subprocess.TimeoutExpired:
        child.send(signal.SIGKILL)
        raise AssertionError("the grace period ran out: the kubelet sent SIGKILL") from None
    return status, time.monotonic() - start


def test_kubernetes_style_sigterm_drains_the_worker_cleans_up_and_exits_0_in_time():
    """SIGTERM mid-item: the item finishes, the rest is handed back, cleanup runs, status 0."""
    code = SERVICE.format(finish='print("finished", queue.pop(0), flush=True)', drain=5.0)
    with Child(code) as child:
        child.expect("working on a")
        child.write("\n")
        child.expect("finished a", "working on b")

        def finish_the_item_in_hand() -> None:
            child.expect(
                "log: SIGTERM received: stopping (send it again to exit at once)",
                "log: draining: waiting up to 5s for work to stop",
            )
            child.write("\n")

        status, took = kubelet_stop(child, finish_the_item_in_hand)
        assert status == 0
        assert took < GRACE_PERIOD
        assert child.rest() == ["finished b", "handed back ['c']", "cleanup ran", "atexit ran"]


def test_work_that_overruns_the_drain_budget_is_abandoned_and_the_process_exits_in_time():
    """A stuck item is given up after drain_timeout; cleanup still runs, before SIGKILL."""
    drain = 0.3
    code = SERVICE.format(finish="pass", drain=drain)
    with Child(code) as child:
        child.expect("working on a")
        status, took = kubelet_stop(child, lambda: None)  # nobody finishes the item
        assert status == 1
        assert drain <= took < GRACE_PERIOD
        rest = child.rest()
        assert rest[:3] == [
            "log: SIGTERM received: stopping (send it again to exit at once)",
            f"log: draining: waiting up to {drain}s for work to stop",
            f"log: work did not stop within {drain}s; abandoning it",
        ]
        assert rest[3] == "cleanup ran"
        assert rest[4].startswith("log: work overran its drain budget: exiting now with status 1")
        assert "atexit ran" not in rest


# --- Fork: a child forked after install is a process of its own ----------------------------

# A helper for the fork scripts: wait for a child to exit, with a timeout, without sleeping.
WAIT_FOR_CHILD = """
import os, select

def wait_for_exit(pid, timeout):
    # pidfd (Linux 5.3+) becomes readable when the child exits; None if it did not in time.
    pidfd = os.pidfd_open(pid)
    try:
        if not select.select([pidfd], [], [], timeout)[0]:
            return None
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    finally:
        os.close(pidfd)
"""

# The handlers' dispatcher is a thread, so forking after install forks a multi-threaded
# process: 3.12+ emits a DeprecationWarning for that. The child scripts record it instead of
# hiding it, and the tests assert exactly when it appears; the parent process (pytest, with
# filterwarnings=error) never forks.
FORK_AFTER_INSTALL = (
    WAIT_FOR_CHILD
    + """
import signal, sys, threading, warnings
from patterns.signal_handlers import install_signal_handlers
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
called = threading.Event()
handlers = install_signal_handlers(called.set)
ready_r, ready_w = os.pipe()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    pid = os.fork()
if pid == 0:  # the child: what it inherited, then wait for the parent's signal
    wakeup_fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup_fd)  # only looking: put it back
    os.write(ready_w, f"{{signal.getsignal(signal.SIGTERM)!r}} {{wakeup_fd}}\\n".encode())
    {child_then}
    os._exit(0)
print("fork warned:", any(w.category is DeprecationWarning for w in caught), flush=True)
print("child inherited:", os.read(ready_r, 100).decode().strip(), flush=True)
{parent_then}
print("child status:", wait_for_exit(pid, {timeout}), flush=True)
signal.raise_signal(signal.SIGINT)  # the parent's own signal, after the child's is over
print("on_stop called:", called.wait({timeout}), flush=True)
print("first signal:", handlers.first_signal.name, flush=True)
handlers.stop()
"""
)


def expected_fork_warning() -> str:
    """3.12 started warning about fork in a multi-threaded process; the dispatcher is a thread."""
    return f"fork warned: {sys.version_info >= (3, 12)}"


def test_a_child_forked_after_install_dies_on_sigterm_and_its_signal_never_reaches_the_parent():
    """os.fork child: default SIGTERM, no wakeup fd; the parent's on_stop sees only its own."""
    code = FORK_AFTER_INSTALL.format(
        child_then="threading.Event().wait()  # only a signal ends this",
        parent_then="os.kill(pid, signal.SIGTERM)",
        timeout=MUST_HAPPEN,
    )
    result = run_group(code)
    assert result.stdout.splitlines() == [
        expected_fork_warning(),
        "child inherited: <Handlers.SIG_DFL: 0> -1",
        f"child status: {-signal.SIGTERM}",
        "on_stop called: True",
        "first signal: SIGINT",
    ], result.stderr
    assert result.returncode == 0, result.stderr


def test_a_forked_child_closing_its_copy_of_the_handle_leaves_the_parents_handlers_working():
    """The child's stop() must not stop the parent's dispatcher through the shared pipe."""
    code = FORK_AFTER_INSTALL.format(
        # Forked code that leaves the with-block does this; the parent's threads are not
        # the child's, so its report says terminated (status 5 if not).
        child_then="os._exit(0 if handlers.stop().terminated else 5)",
        parent_then="",
        timeout=MUST_HAPPEN,
    )
    result = run_group(code)
    assert result.stdout.splitlines() == [
        expected_fork_warning(),
        "child inherited: <Handlers.SIG_DFL: 0> -1",
        "child status: 0",
        "on_stop called: True",
        "first signal: SIGINT",
    ], result.stderr
    assert result.returncode == 0, result.stderr


def test_a_child_forked_from_a_worker_thread_gets_its_handlers_back_too():
    """The at-fork hook runs in the forking thread, the child's main thread, whichever it was."""
    code = """
        import os, signal, threading, warnings
        from patterns.signal_handlers import SignalHandlers
        # 3.12+ warn about forking with threads running; the fork is the point of the test.
        warnings.simplefilter("ignore", DeprecationWarning)
        with SignalHandlers(lambda: None):
            def fork_here():
                pid = os.fork()
                if pid == 0:
                    handler, fd = signal.getsignal(signal.SIGTERM), signal.set_wakeup_fd(-1)
                    os.write(1, f"child: {handler!r} {fd}\\n".encode())
                    os._exit(0)
                print("child status:", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
            forker = threading.Thread(target=fork_here, name="forker")
            forker.start()
            forker.join(10)
    """
    result = run_group(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["child: <Handlers.SIG_DFL: 0> -1", "child status: 0"]


def test_a_subprocess_started_after_install_gets_default_handlers_and_not_the_pipe():
    """A subprocess execs: handled signals are back to SIG_DFL, and the pipe is not inherited."""
    code = """
        import signal, subprocess, sys
        from patterns.signal_handlers import SignalHandlers
        with SignalHandlers(lambda: None) as handlers:
            write_fd = signal.set_wakeup_fd(-1)
            signal.set_wakeup_fd(write_fd)  # only looking: put it back
            child = (
                "import os, signal, sys\\n"
                "try:\\n"
                "    os.fstat(int(sys.argv[1])); pipe = 'inherited'\\n"
                "except OSError:\\n"
                "    pipe = 'not inherited'\\n"
                "print(repr(signal.getsignal(signal.SIGTERM)), signal.set_wakeup_fd(-1), pipe)"
            )
            subprocess.run([sys.executable, "-c", child, str(write_fd)], check=True, timeout=10)
    """
    result = run_child(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["<Handlers.SIG_DFL: 0> -1 not inherited"]


MULTIPROCESSING_FORK = """
import multiprocessing, os, signal, sys, threading, time, warnings
from pathlib import Path
from patterns.signal_handlers import SignalHandlers

def child(ready):
    ready.set()
    threading.Event().wait()  # only a signal ends this

signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
ctx = multiprocessing.get_context("fork")
called = threading.Event()
with SignalHandlers(called.set) as handlers:
    ready = ctx.Event()
    process = ctx.Process(target=child, args=(ready,), name="forked-child")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        process.start()
    print("fork warned:", any(w.category is DeprecationWarning for w in caught), flush=True)
    assert ready.wait({timeout})
    # Signal once the child is parked in its wait (a futex): a SIGINT that lands after the
    # child's last check for signals and before its wait begins is never seen by that wait.
    deadline = time.monotonic() + {timeout}
    wchan = Path(f"/proc/{{process.pid}}/wchan")
    while not wchan.read_text().startswith("futex"):
        assert time.monotonic() < deadline, "the child never parked in its wait"
        time.sleep(0.001)
    {signal_them}
    process.join({timeout})
    print("child exitcode:", process.exitcode, flush=True)
    if process.exitcode is None:
        process.kill()
        process.join(10)
    {then}
print("parent finished", flush=True)
"""


def test_process_terminate_ends_a_multiprocessing_fork_child_started_after_install():
    """Process.terminate() works on a fork-method child; its SIGTERM never reaches the parent."""
    code = MULTIPROCESSING_FORK.format(
        timeout=MUST_HAPPEN,
        signal_them="process.terminate()",
        then="""signal.raise_signal(signal.SIGINT)
    print("on_stop called:", called.wait(10.0), flush=True)
    print("first signal:", handlers.first_signal.name, flush=True)""",
    )
    result = run_group(code)
    assert result.stdout.splitlines() == [
        expected_fork_warning(),
        f"child exitcode: {-signal.SIGTERM}",
        "on_stop called: True",
        "first signal: SIGINT",
        "parent finished",
    ], result.stderr
    assert result.returncode == 0, result.stderr


def test_one_ctrl_c_to_the_process_group_stops_the_parent_once_and_interrupts_the_child():
    """Ctrl-C reaches both: the child gets KeyboardInterrupt, the parent calls on_stop once."""
    code = MULTIPROCESSING_FORK.format(
        timeout=MUST_HAPPEN,
        # What the terminal does on Ctrl-C: SIGINT to every process in the foreground group.
        signal_them="os.killpg(0, signal.SIGINT)",
        then="""print("on_stop called:", called.wait(10.0), flush=True)
    print("first signal:", handlers.first_signal.name, flush=True)""",
    )
    result = run_group(code)  # a group of its own: the Ctrl-C reaches only the script
    assert result.stdout.splitlines() == [
        expected_fork_warning(),
        "child exitcode: 1",  # multiprocessing's exit code for an exception: KeyboardInterrupt
        "on_stop called: True",
        "first signal: SIGINT",
        "parent finished",
    ], (result.returncode, result.stderr)
    assert result.returncode == 0, result.stderr
    assert "KeyboardInterrupt" in result.stderr  # the child's traceback


# --- Python versions: what each one does, pinned where it runs ------------------------------

JOIN_INTERRUPTED = """
import linecache, signal, sys, threading, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
release = threading.Event()
worker = threading.Thread(target=release.wait, name="worker")
worker.start()
main = threading.main_thread()

def main_waits_in_join():
    # The innermost frame of the main thread is on the line of join() that blocks in C:
    # 3.11 and 3.12 wait in _wait_for_tstate_lock, 3.13 in the thread handle's join().
    frame = sys._current_frames().get(main.ident)
    if frame is None:
        return False
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    return "lock.acquire(block, timeout)" in line or "self._handle.join(" in line

def ctrl_c_inside_join():
    while not main_waits_in_join():
        time.sleep(0.001)  # polling an observation, not waiting for a race
    signal.pthread_kill(main.ident, signal.SIGINT)

threading.Thread(target=ctrl_c_inside_join, name="ctrl-c").start()
try:
    worker.join()
except KeyboardInterrupt:
    print("KeyboardInterrupt out of join(); is_alive:", worker.is_alive(), flush=True)
worker.join(0)
print("join(0) returns; is_alive:", worker.is_alive(), flush=True)
release.set()  # the worker was running all along: it ends only now
"""


def test_a_ctrl_c_inside_thread_join_marks_a_live_thread_finished_before_3_13():
    """gh-90882: on 3.11.7 and 3.12.1 is_alive() turns False while the thread runs; not on 3.13."""
    result = run_child(JOIN_INTERRUPTED)
    assert result.returncode == 0, result.stderr
    alive = sys.version_info >= (3, 13)  # checked on 3.11.7, 3.12.1 and 3.13.0
    assert result.stdout.splitlines() == [
        f"KeyboardInterrupt out of join(); is_alive: {alive}",
        f"join(0) returns; is_alive: {alive}",
    ]


# --- the paths users take ---------------------------------------------------------

WITH_STARTED = """
import signal
from patterns.signal_handlers import SignalHandlers, install_signal_handlers

with SignalHandlers(lambda: None).start() as a:
    print("a running:", not a.stopped, flush=True)
with install_signal_handlers(lambda: None) as b:
    print("b running:", not b.stopped, flush=True)
print("stopped:", a.stopped, b.stopped, signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
try:
    with a:
        pass
except RuntimeError as exc:
    print("a stopped one:", exc)
"""


def test_with_on_a_started_signal_handlers_returns_it_stops_it_at_exit_and_the_program_ends():
    """``with x.start():`` and ``with install_signal_handlers():`` work; a stopped one raises."""
    result = run_child(WITH_STARTED)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "a running: True",
        "b running: True",
        "stopped: True True True",
        "a stopped one: SignalHandlers.start() can be called once, before stop()",
    ]


@pytest.mark.usefixtures("saved_handlers")
@pytest.mark.parametrize("budget", [math.inf, 1e10, 1e300, 10**400])
def test_an_infinite_or_huge_budget_means_as_long_as_it_takes_and_never_overflows(
    budget: float,
):
    """stop_timeout=inf (or huge): the dispatcher ends before its pipe closes; no OverflowError."""
    fds = open_fds()
    handlers = SignalHandlers(lambda: None, signals=(signal.SIGUSR1,), stop_timeout=budget)
    assert handlers.stop_timeout >= 1e10
    with handlers:
        pass
    assert handlers.stop() == SignalHandlersReport(True, (), None)
    assert not [t for t in threading.enumerate() if t.name == "signal-dispatcher"]
    assert open_fds() == fds
    again = SignalHandlers(lambda: None, signals=(signal.SIGUSR1,)).start()
    assert again.stop(budget).terminated


@pytest.mark.usefixtures("saved_handlers")
def test_a_dispatcher_still_running_at_the_deadline_closes_the_pipe_as_it_ends() -> None:
    """stop(0) while the dispatcher is held: the pipe stays open until it ends, then closes."""
    fds = open_fds()
    gate = Gate("on_stop in the dispatcher")
    ran_in: list[threading.Thread] = []

    def on_stop() -> None:
        ran_in.append(threading.current_thread())
        gate.arrive()

    try:
        # No thread for on_stop (the second start), so the dispatcher runs it itself, and
        # on_stop parked at the gate holds the dispatcher past the zero budget.
        with thread_start_patched(2, cannot_start):
            handlers = SignalHandlers(on_stop, signals=(signal.SIGUSR1,)).start()
            signal.raise_signal(signal.SIGUSR1)
            gate.wait_reached()
        [dispatcher] = ran_in
        report = handlers.stop(0)
        assert report == SignalHandlersReport(False, ("signal-dispatcher",), signal.SIGUSR1)
        assert len(open_fds() - fds) == 2  # both ends, still the dispatcher's to read
    finally:
        gate.open()
    join_or_fail(dispatcher)
    assert open_fds() == fds  # closed by the dispatcher on its way out


@pytest.mark.usefixtures("saved_handlers")
def test_a_stop_before_the_dispatcher_has_run_a_line_leaves_it_its_pipe_to_read_and_close() -> None:
    """stop(0) right after start(), the dispatcher not yet in _dispatch: it reads, ends, closes."""
    fds = open_fds()
    gate = Gate("the dispatcher's first line")
    ran_in: list[threading.Thread] = []

    def hold_at_dispatch(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code.co_name == "_dispatch":
            ran_in.append(threading.current_thread())
            gate.arrive()

    previous = threading.gettrace()
    try:
        with recording_hook() as uncaught:
            threading.settrace(hold_at_dispatch)  # for the threads started from here on
            try:
                handlers = SignalHandlers(lambda: None, signals=(signal.SIGUSR1,)).start()
            finally:
                threading.settrace(previous)
            gate.wait_reached()
            [dispatcher] = ran_in
            assert handlers.stop(0) == SignalHandlersReport(False, ("signal-dispatcher",), None)
            gate.open()
            join_or_fail(dispatcher)
    finally:
        gate.open()
    assert uncaught == []  # it read the pipe it was started with, not a cleared field
    assert open_fds() == fds  # and closed it on its way out


@pytest.mark.usefixtures("saved_handlers")
@pytest.mark.parametrize("bad", [math.nan, -1, -math.inf, True, "1", None, object()])
def test_a_budget_that_is_not_a_number_of_seconds_is_a_value_error_naming_it(bad: object):
    """nan, negative, bool, str, None: ValueError naming the argument, and nothing started."""
    with pytest.raises(ValueError, match="stop_timeout must be a number of seconds"):
        SignalHandlers(lambda: None, stop_timeout=bad)  # type: ignore[arg-type]
    handlers = SignalHandlers(lambda: None, signals=(signal.SIGUSR1,)).start()
    if bad is not None:  # None means stop_timeout here
        with pytest.raises(ValueError, match="timeout must be a number of seconds"):
            handlers.stop(bad)  # type: ignore[arg-type]
    assert handlers.stop().terminated
    with pytest.raises(ValueError, match="drain_timeout must be a number of seconds"):
        run_until_signalled(lambda stop: None, drain_timeout=bad)  # type: ignore[arg-type]
    assert signal.set_wakeup_fd(-1) == -1


def test_run_until_signalled_with_an_infinite_drain_budget_returns_when_work_ends():
    """drain_timeout=inf waits as long as work takes, and no longer."""
    code = """
        import signal
        from patterns.signal_handlers import run_until_signalled
        print(run_until_signalled(lambda stop: None, drain_timeout=float("inf")), flush=True)
    """
    result = run_child(textwrap.dedent(code))
    assert (result.returncode, result.stdout) == (0, "True\n"), result.stderr


def main_waits_for_on_stop() -> bool:
    """Whether the main thread is in stop()'s wait for on_stop (not the dispatcher's, before).

    That is ``_wait`` called by ``_stop``; the older code had ``join`` called by ``stop``,
    which the fail-first run of these tests looked for.
    """
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    while frame is not None and frame.f_back is not None:
        pair = (frame.f_code.co_name, frame.f_back.f_code.co_name)
        if pair in {("_wait", "_stop"), ("join", "stop")}:
            return True
        frame = frame.f_back
    return False


def interrupt_main_once_it_waits_for_on_stop(sig: int) -> tuple[threading.Thread, dict[str, Any]]:
    """A helper thread that sends ``sig`` to the main thread once it waits for on_stop."""
    main = threading.main_thread()

    def press() -> None:
        wait_until(main_waits_for_on_stop, "the main thread waits for on_stop in stop()")
        signal.pthread_kill(main.ident or 0, sig)

    return run_in_thread(press, f"sends-{signal.Signals(sig).name}")


@pytest.mark.race("P24", "a second Ctrl-C during the graceful shutdown")
@pytest.mark.usefixtures("saved_handlers")
def test_a_ctrl_c_that_interrupts_stop_leaves_the_next_report_truthful():
    """Lesson: after an interrupted wait, trust the thread's own "ended" event, never is_alive()."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    gate = Gate("on_stop")
    handlers = SignalHandlers(gate.arrive, signals=(signal.SIGUSR1,)).start()
    signal.raise_signal(signal.SIGUSR1)
    gate.wait_reached()
    presser, _ = interrupt_main_once_it_waits_for_on_stop(signal.SIGINT)
    try:
        with pytest.raises(KeyboardInterrupt):
            handlers.stop(MUST_HAPPEN)
        join_or_fail(presser)
        report = handlers.stop(0)  # on_stop is still parked at the gate: the truth, recorded
        assert report == SignalHandlersReport(False, ("on-stop",), signal.SIGUSR1)
        assert handlers.stop(MUST_HAPPEN) is report
    finally:
        gate.open()


@pytest.mark.race("E1", "a handler that sets the event main is waiting on deadlocks")
@pytest.mark.usefixtures("saved_handlers")
def test_stop_from_a_signal_handler_that_interrupted_stop_returns_a_provisional_report_at_once():
    """Lesson: a stop() from a handler runs inside the stop() it interrupted: it must not wait."""
    gate = Gate("on_stop")
    handlers = SignalHandlers(gate.arrive, signals=(signal.SIGUSR1,)).start()
    from_handler: list[tuple[SignalHandlersReport, float]] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        with elapsed() as took:
            report = handlers.stop()
        from_handler.append((report, took()))
        gate.open()  # only now may the stop() it interrupted finish

    signal.signal(signal.SIGUSR2, handler)
    signal.raise_signal(signal.SIGUSR1)
    gate.wait_reached()
    presser, _ = interrupt_main_once_it_waits_for_on_stop(signal.SIGUSR2)
    try:
        final = handlers.stop(MUST_HAPPEN)
    finally:
        gate.open()
    join_or_fail(presser)
    [(provisional, took)] = from_handler
    assert provisional == SignalHandlersReport(False, ("on-stop",), signal.SIGUSR1)
    assert took < NOISE
    assert final == SignalHandlersReport(True, (), signal.SIGUSR1)
    assert handlers.stop(0) is final


@pytest.mark.usefixtures("saved_handlers")
def test_stop_from_on_stop_is_a_request_that_returns_at_once_and_the_main_stop_records():
    """From on_stop's thread: a provisional report naming it, no error; the block's is final."""
    from_on_stop: list[SignalHandlersReport | BaseException] = []
    done = threading.Event()

    def on_stop() -> None:
        try:
            from_on_stop.append(handlers.stop())
        except BaseException as exc:  # the test inspects whatever it was
            from_on_stop.append(exc)
        done.set()

    with SignalHandlers(on_stop, signals=(signal.SIGUSR1,)) as handlers:
        signal.raise_signal(signal.SIGUSR1)
        assert done.wait(MUST_HAPPEN)
        assert not handlers.stopped  # a request: the handlers stay until the main thread
    running = ("signal-dispatcher", "on-stop")  # on_stop's own thread is named
    assert from_on_stop == [SignalHandlersReport(False, running, signal.SIGUSR1)]
    assert handlers.stop() == SignalHandlersReport(True, (), signal.SIGUSR1)


@pytest.mark.usefixtures("saved_handlers")
def test_an_on_stop_that_raises_a_base_exception_is_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
):
    """KeyboardInterrupt in on_stop's thread is logged, not left to threading.excepthook."""
    done = threading.Event()

    def on_stop() -> None:
        done.set()
        raise KeyboardInterrupt("from on_stop")

    with SignalHandlers(on_stop, signals=(signal.SIGUSR1,)) as handlers:
        signal.raise_signal(signal.SIGUSR1)
        assert done.wait(MUST_HAPPEN)
    assert handlers.stop().terminated
    [record] = [r for r in caplog.records if r.exc_info and r.exc_info[0] is KeyboardInterrupt]
    assert "on_stop failed" in record.getMessage()


SYS_EXIT_IN_ON_STOP = """
import logging, sys, threading
from patterns.signal_handlers import SignalHandlers
logging.basicConfig(format="log: %(message)s")

try:
    with SignalHandlers(lambda: sys.exit({code})):
        print("ready", flush=True)
        threading.Event().wait()  # nothing sets it: only the exit ends this
finally:
    print("cleanup ran", flush=True)
print("after the block: not reached", flush=True)
"""


@pytest.mark.race("P8", "sys.exit() in a worker thread is silently ignored")
@pytest.mark.parametrize("code", [0, 3])
def test_sys_exit_in_on_stop_ends_the_program_with_its_code_through_the_main_thread(code: int):
    """Lesson: SystemExit in a helper thread ends only that thread; hand it to the main thread."""
    with Child(SYS_EXIT_IN_ON_STOP.format(code=code)) as child:
        child.expect("ready")
        child.send(signal.SIGTERM)
        assert child.wait() == code
        assert child.rest() == ["cleanup ran"]
        assert f"on_stop raised SystemExit({code}) in thread on-stop" in child.stderr()


def test_a_report_cannot_say_terminated_with_threads_still_running():
    """The report's constructor refuses the lie: terminated=True with a non-empty still_running."""
    with pytest.raises(ValueError, match=r"terminated=True with still_running=.*on-stop"):
        SignalHandlersReport(True, ("on-stop",), None)
    assert SignalHandlersReport(False, ("on-stop",), None).still_running == ("on-stop",)


@pytest.mark.usefixtures("saved_handlers")
def test_sys_exit_in_on_stop_while_the_main_thread_is_in_stop_is_raised_by_stop_after_cleanup():
    """Once stop() has begun, no signal is sent: stop() records its report, then raises the exit."""
    gate = Gate("on_stop")

    def on_stop() -> None:
        gate.arrive()
        sys.exit(4)

    handlers = SignalHandlers(on_stop, signals=(signal.SIGUSR1,)).start()
    signal.raise_signal(signal.SIGUSR1)
    gate.wait_reached()
    opener, _ = run_in_thread(
        lambda: (wait_until(main_waits_for_on_stop, "stop() waits for on_stop"), gate.open()),
        "opens-the-gate",
    )
    with pytest.raises(SystemExit) as exited:
        handlers.stop(MUST_HAPPEN)
    join_or_fail(opener)
    assert exited.value.code == 4
    assert handlers.stop(0) == SignalHandlersReport(True, (), signal.SIGUSR1)
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
