"""One child process stopped on a deadline, and the pitfalls around it: each forced, and the fix.

Where exit, a hang or a signal is involved the scenario runs in a child interpreter in a
process group of its own (`Group`, shared with the pool tests), which the test kills as a
whole when it is done. Child processes are started with ``forkserver`` (`safe_context`)
or ``spawn`` except in the tests about ``fork`` itself.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import signal
import sys
import textwrap
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from patterns.naive.stoppable_process import naive_stop_process
from patterns.stoppable_process import (
    ProcessStopReport,
    StoppableProcess,
    StopSignal,
    safe_context,
)
from patterns.teaching import process_tasks
from tests.support import (
    MUST_HAPPEN,
    NOISE,
    elapsed,
    join_or_fail,
    run_in_thread,
    run_python,
    wait_until_blocked_in,
)
from tests.test_process_shutdown import WATCH, Group, gone

# --- M3: terminate() skips the child's finally and atexit ---------------------------------


def careful_child(tmp_path: Path, method: str = "spawn") -> tuple[StoppableProcess, Path]:
    """A started StoppableProcess running `careful`, parked in its loop."""
    context = multiprocessing.get_context(method)
    ready = context.Event()
    log = tmp_path / "log"
    child = StoppableProcess(process_tasks.careful, (ready, str(log)), context=context)
    child.start()
    assert ready.wait(MUST_HAPPEN), "the child never got ready"
    return child, log


@pytest.mark.race("M3", "Process.terminate() skips the child's finally and atexit")
def test_naive_terminate_skips_finally_and_atexit(
    tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    """Broken: SIGTERM ends the child where it stands; no cleanup line is written."""
    child, log = careful_child(tmp_path)
    process = child._process
    assert process is not None
    naive_stop_process(process)
    written = log.read_text().splitlines() if log.exists() else []
    record_property(
        "observed",
        f"terminate(): exit code {process.exitcode}, cleanup lines written: {written or 'none'}",
    )
    assert process.exitcode == -signal.SIGTERM
    assert not log.exists()
    child.stop()


@pytest.mark.race("M3", "Process.terminate() skips the child's finally and atexit")
def test_stoppable_process_stops_on_request_and_runs_cleanup(tmp_path: Path) -> None:
    """Asked to stop, the child returns: its finally and atexit run, exit code 0."""
    child, log = careful_child(tmp_path)
    report = child.stop(MUST_HAPPEN)
    assert report.terminated
    assert report.escalation == ""
    assert report.exitcode == 0
    assert log.read_text().splitlines() == ["stopped when asked", "finally", "atexit"]
    assert child.stop() is report
    assert child.pid is not None
    assert gone(child.pid)


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_multiprocessing_skips_fork_and_forkserver_atexit_before_3_13(
    tmp_path: Path, method: str
) -> None:
    """Pins: a plain fork or forkserver Process ends with os._exit; 3.13 runs atexit first."""
    context = multiprocessing.get_context(method)
    stop, ready, log = context.Event(), context.Event(), tmp_path / "log"
    stop.set()
    process = context.Process(target=process_tasks.careful, args=(stop, ready, str(log)))
    process.start()
    process.join(MUST_HAPPEN)
    assert process.exitcode == 0
    process.close()
    at_exit = ["atexit"] if sys.version_info >= (3, 13) else []
    assert log.read_text().splitlines() == ["stopped when asked", "finally", *at_exit]


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_stoppable_process_runs_the_childs_atexit_with_every_start_method(
    tmp_path: Path, method: str
) -> None:
    """The Guarantees hold for each start method on each version: finally, then atexit."""
    child, log = careful_child(tmp_path, method)
    report = child.stop(MUST_HAPPEN)
    assert (report.terminated, report.escalation, report.exitcode) == (True, "", 0)
    assert log.read_text().splitlines() == ["stopped when asked", "finally", "atexit"]


PARENT_ATEXIT = """
    import atexit, multiprocessing
    from patterns.stoppable_process import StoppableProcess
    from patterns.teaching.process_tasks import append, careful
    path = {path!r}
    atexit.register(append, path, "parent's atexit")
    context = multiprocessing.get_context({method!r})
    ready = context.Event()
    child = StoppableProcess(careful, (ready, path), context=context).start()
    assert ready.wait(10)
    print(child.stop(10).exitcode)
"""


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_forked_child_runs_its_own_atexit_handlers_not_its_parents(
    tmp_path: Path, method: str
) -> None:
    """A fork copies the parent's atexit handlers; the child runs only those it registered."""
    path = tmp_path / "log"
    done = run_python(textwrap.dedent(PARENT_ATEXIT.format(path=str(path), method=method)))
    assert (done.returncode, done.stdout) == (0, "0\n"), done.stderr
    lines = path.read_text().splitlines()
    assert lines == ["stopped when asked", "finally", "atexit", "parent's atexit"]


# --- M7: a multiprocessing.Event whose waiter was killed hangs set() ------------------------

EVENT_SET = """
    import multiprocessing, os, signal, time
    from patterns.stoppable_process import StoppableProcess
    from patterns.teaching.process_tasks import careful
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    if {naive}:
        stop = context.Event()
        child = context.Process(target=careful, args=(stop, ready, os.devnull))
        child.start()
    else:
        stoppable = StoppableProcess(careful, (ready, os.devnull), context=context).start()
        child = stoppable._process
    assert ready.wait(10)
    if {naive}:  # wait until the child sleeps in stop.wait() (a private counter, observed)
        deadline = time.monotonic() + 10
        while stop._cond._sleeping_count.get_value() == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
    os.kill(child.pid, signal.SIGKILL)  # the OOM killer, an operator, a crash
    child.join(10)
    print("killed; asking it to stop", flush=True)
    if {naive}:
        stop.set()
    else:
        print(stoppable.stop(10).exitcode, flush=True)
    print("returned", flush=True)
"""


@pytest.mark.race("M7", "a multiprocessing.Event whose waiter was killed hangs set()")
def test_naive_event_set_hangs_after_its_waiter_was_killed(
    record_property: Callable[[str, object], None],
) -> None:
    """Broken: Event.set() waits for every sleeper to acknowledge, a dead one too."""
    with Group(EVENT_SET.format(naive=True)) as child:
        child.expect("killed; asking it to stop")
        alive = child.stays_alive()
        returned = "returned" in child.lines.queue
        record_property(
            "observed",
            f"Event.set() {'returned' if returned else 'had not returned'} {WATCH}s after"
            " its only waiter was killed",
        )
        assert alive, child.stderr()


@pytest.mark.race("M7", "a multiprocessing.Event whose waiter was killed hangs set()")
def test_stop_signal_never_waits_for_the_child() -> None:
    """StoppableProcess signals through a pipe: stop() returns though the child was killed."""
    with Group(EVENT_SET.format(naive=False)) as child:
        child.expect("killed; asking it to stop")
        assert child.wait() == 0, child.stderr()
        assert child.stdout() == [str(-signal.SIGKILL), "returned"]


@pytest.mark.parametrize(("deaf", "escalation"), [(False, "terminate"), (True, "kill")])
def test_stoppable_process_forces_a_stubborn_child_within_its_budget(
    deaf: bool, escalation: str
) -> None:
    """A child that ignores the request is terminated (or killed) as the last resort, saying so."""
    context = safe_context()
    ready = context.Event()
    child = StoppableProcess(process_tasks.stubborn, (ready, deaf), context=context).start()
    assert ready.wait(MUST_HAPPEN)
    with elapsed() as took:
        report = child.stop(1.0)
    assert took() < 1.0 + NOISE
    assert report.terminated
    assert report.escalation == escalation
    assert report.exitcode == -(signal.SIGKILL if deaf else signal.SIGTERM)
    assert child.pid is not None
    assert gone(child.pid)


def test_stoppable_process_lifecycle_edges() -> None:
    """Stop before start is a no-op report; a second start raises; bad budgets raise."""
    child = StoppableProcess(process_tasks.stubborn, (None, False))
    report = child.stop()
    assert report.terminated
    assert report.still_running == ()
    assert child.stop() is report
    with pytest.raises(RuntimeError, match="already started"):
        child.start()
    with pytest.raises(ValueError, match="stop_timeout"):
        StoppableProcess(process_tasks.stubborn, stop_timeout=-1)


# --- M4: a multiprocessing.Queue's feeder thread holds the exit ----------------------------

QUEUE_EXIT = """
    import multiprocessing
    from patterns.naive.stoppable_process import naive_close_queue
    from patterns.stoppable_process import abandon_queue, safe_context
    q = safe_context().Queue()
    q.put(b"x" * (4 << 20))  # more than a pipe holds; the consumer is gone
    print("exiting", flush=True)
    {close}(q)
"""


@pytest.mark.race("M4", "a multiprocessing.Queue's feeder thread holds the exit")
def test_naive_queue_with_unread_items_hangs_the_exit(
    record_property: Callable[[str, object], None],
) -> None:
    """Broken: close() is not enough; the exit joins a feeder blocked on a full pipe."""
    with Group(QUEUE_EXIT.format(close="naive_close_queue")) as child:
        child.expect("exiting")
        alive = child.stays_alive()
        record_property(
            "observed",
            f"after close(), the producer {'still' if alive else 'no longer'} running {WATCH}s"
            " later: its exit joins the feeder thread, blocked on a full pipe",
        )
        assert alive, child.stderr()


@pytest.mark.race("M4", "a multiprocessing.Queue's feeder thread holds the exit")
def test_abandon_queue_lets_the_producer_exit() -> None:
    """cancel_join_thread: the process exits at once, status 0, the loss logged."""
    with Group(QUEUE_EXIT.format(close="abandon_queue")) as child:
        child.expect("exiting")
        assert child.wait() == 0, child.stderr()
        assert "items not yet sent are lost" in child.stderr()


# --- M5: Ctrl-C reaches every process in the foreground group ------------------------------

CTRL_C = """
    import logging, time
    from patterns.naive.stoppable_process import naive_start_child
    from patterns.stoppable_process import StoppableProcess, safe_context
    from patterns.teaching.process_tasks import items
    logging.basicConfig(level=logging.WARNING)
    context = safe_context()
    children, readies, stops = [], [], []
    for name in ("a", "b"):
        ready = context.Event()
        if {naive}:  # the stop request is an Event nobody sets: Ctrl-C ends the children
            stops.append(context.Event())  # kept: a collected Event's semaphore is unlinked
            children.append(naive_start_child(context, items, (stops[-1], ready, name)))
        else:
            children.append(StoppableProcess(items, (ready, name), context=context).start())
        readies.append(ready)
    assert all(r.wait(10) for r in readies)
    try:
        print("ready", flush=True)  # inside the try: the Ctrl-C may come at once
        time.sleep(60)  # until the test's Ctrl-C; 60 s is only a bound
    except KeyboardInterrupt:
        print("parent: interrupted, stopping the children", flush=True)
    for child in children:
        if {naive}:
            child.join(10)
            print("exit code", child.exitcode, flush=True)
        else:
            print("exit code", child.stop(10).exitcode, flush=True)
"""


@pytest.mark.race("M5", "Ctrl-C sends SIGINT to every process in the foreground group")
def test_naive_children_each_get_their_own_keyboard_interrupt(
    record_property: Callable[[str, object], None],
) -> None:
    """Broken: each child dies of its own KeyboardInterrupt, traceback and all, work cut off."""
    with Group(CTRL_C.format(naive=True)) as child:
        child.expect("ready")
        child.killpg(signal.SIGINT)
        assert child.wait() == 0, child.stderr()
        out = child.stdout()
    record_property(
        "observed",
        f"one Ctrl-C: the children ended with {', '.join(out[1:])},"
        f" {child.stderr().count('KeyboardInterrupt')} KeyboardInterrupt tracebacks",
    )
    assert out[0] == "parent: interrupted, stopping the children"
    assert out[1:] == ["exit code 1", "exit code 1"]
    assert child.stderr().count("KeyboardInterrupt") == 2


@pytest.mark.race("M5", "Ctrl-C sends SIGINT to every process in the foreground group")
def test_children_ignore_sigint_and_the_parent_stops_them() -> None:
    """Children ignore SIGINT; the parent alone is interrupted and stops them: clean exits."""
    with Group(CTRL_C.format(naive=False)) as child:
        child.expect("ready")
        child.killpg(signal.SIGINT)
        assert child.wait() == 0, child.stderr()
        out = child.stdout()
    assert out[0] == "parent: interrupted, stopping the children"
    assert sorted(out[1:]) == [
        "a finished cleanly",
        "b finished cleanly",
        "exit code 0",
        "exit code 0",
    ]
    assert "KeyboardInterrupt" not in child.stderr()


POOL_CTRL_C = """
    import time
    from concurrent.futures import ProcessPoolExecutor
    from pathlib import Path
    from patterns.process_shutdown import collect, shutdown_process_pool
    from patterns.stoppable_process import ignore_sigint, safe_context
    from patterns.teaching.process_tasks import item_until
    finish, started = {finish!r}, {started!r}
    pool = ProcessPoolExecutor(2, mp_context=safe_context(), initializer={initializer})
    futures = [pool.submit(item_until, finish, started) for _ in range(2)]
    while not (Path(started).exists() and len(Path(started).read_text().split()) == 2):
        time.sleep(0.001)
    try:
        print("ready", flush=True)  # inside the try: the Ctrl-C may come at once
        time.sleep(60)  # until the test's Ctrl-C; 60 s is only a bound
    except KeyboardInterrupt:
        print("parent: interrupted, letting the items finish", flush=True)
    Path(finish).touch()
    outcome = collect(futures, 10)
    errors = sorted(type(e).__name__ for e in outcome.errors.values())
    print(sorted(outcome.results.values()), errors)
    print(shutdown_process_pool(pool, 10, force_timeout=10).terminated, flush=True)
"""


@pytest.mark.race("M5", "Ctrl-C sends SIGINT to every process in the foreground group")
def test_naive_pool_workers_each_end_their_item_with_keyboard_interrupt(
    tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    """Broken: with the default SIGINT handler every running task ends in KeyboardInterrupt."""
    code = POOL_CTRL_C.format(
        finish=str(tmp_path / "finish"), started=str(tmp_path / "started"), initializer=None
    )
    with Group(code) as child:
        child.expect("ready")
        child.killpg(signal.SIGINT)
        assert child.wait() == 0, child.stderr()
        out = child.stdout()
    results, errors = out[1].split("] ", 1)
    record_property("observed", f"one Ctrl-C, pool workers: results {results}], errors {errors}")
    assert out == [
        "parent: interrupted, letting the items finish",
        "[] ['KeyboardInterrupt', 'KeyboardInterrupt']",
        "True",
    ]


@pytest.mark.race("M5", "Ctrl-C sends SIGINT to every process in the foreground group")
def test_pool_workers_started_with_ignore_sigint_finish_their_items(tmp_path: Path) -> None:
    """initializer=ignore_sigint: only the parent is interrupted; the items finish."""
    code = POOL_CTRL_C.format(
        finish=str(tmp_path / "finish"),
        started=str(tmp_path / "started"),
        initializer="ignore_sigint",
    )
    with Group(code) as child:
        child.expect("ready")
        child.killpg(signal.SIGINT)
        assert child.wait() == 0, child.stderr()
        out = child.stdout()
    assert out == ["parent: interrupted, letting the items finish", "['done', 'done'] []", "True"]
    assert "KeyboardInterrupt" not in child.stderr()


# --- M6: fork() copies a lock another thread holds ------------------------------------------

FORK_LOCK = """
    import threading, warnings
    import multiprocessing
    from patterns.naive.stoppable_process import naive_context
    from patterns.stoppable_process import safe_context
    from patterns.teaching import process_tasks
    warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: "multi-threaded ... fork()"
    holding, release = threading.Event(), threading.Event()
    def holder():
        with process_tasks.LOCK:  # e.g. a connection pool's lock, mid-update
            holding.set()
            release.wait()
    t = threading.Thread(target=holder)
    t.start()
    holding.wait()
    child = {context}().Process(target=process_tasks.take_lock)
    child.start()
    release.set()  # the parent's lock is free again; the child's copy is not
    t.join()
    child.join({join})
    print("child alive" if child.is_alive() else f"child exit {{child.exitcode}}", flush=True)
    if child.is_alive():
        child.kill()
        child.join()
"""


@pytest.mark.race("M6", "fork() while another thread holds a lock: the child's copy stays locked")
def test_naive_fork_leaves_the_child_deadlocked_on_a_copied_lock(
    record_property: Callable[[str, object], None],
) -> None:
    """Broken: the forked child waits for ever on a lock no thread of its own will release."""
    with Group(FORK_LOCK.format(context="naive_context", join=WATCH)) as child:
        assert child.wait() == 0, child.stderr()
        out = child.stdout()
    record_property(
        "observed",
        f"the forked child, {WATCH}s after the parent released the lock: {', '.join(out)}"
        " (blocked on its copy)",
    )
    assert out == ["child alive"]


@pytest.mark.race("M6", "fork() while another thread holds a lock: the child's copy stays locked")
def test_safe_context_child_starts_with_its_own_unlocked_lock() -> None:
    """With forkserver (or spawn) the child imports the module afresh; its lock is free."""
    with Group(FORK_LOCK.format(context="safe_context", join=MUST_HAPPEN)) as child:
        assert child.wait() == 0, child.stderr()
        assert child.stdout() == ["child exit 0"]


FORK_LOGGING = """
    import logging, threading, warnings
    from patterns.naive.stoppable_process import naive_context
    from patterns.teaching import process_tasks
    warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: "multi-threaded ... fork()"
    logging.basicConfig(format="%(message)s")
    handler = logging.getLogger().handlers[0]
    holding, release = threading.Event(), threading.Event()
    def holder():
        handler.acquire()  # as a thread does while it writes a record
        holding.set()
        release.wait()
        handler.release()
    t = threading.Thread(target=holder)
    t.start()
    holding.wait()
    child = naive_context().Process(target=process_tasks.log_one_line)
    child.start()
    child.join({join})
    release.set()
    t.join()
    print("child alive" if child.is_alive() else f"child exit {{child.exitcode}}", flush=True)
    if child.is_alive():
        child.kill()
        child.join()
"""


def test_logging_renews_its_handler_locks_in_a_forked_child() -> None:
    """os.register_at_fork at work: logging gives a forked child fresh handler locks."""
    with Group(FORK_LOGGING.format(join=MUST_HAPPEN)) as child:
        assert child.wait() == 0, child.stderr()
        assert child.stdout() == ["child exit 0"]
    assert "logged in the child" in child.stderr()


FORK_WARNING = """
    import os, threading, warnings
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pid = os.fork()
        if pid == 0:
            os._exit(0)
    os.waitpid(pid, 0)
    stop.set()
    t.join()
    print([f"{w.category.__name__}: {w.message}" for w in caught], flush=True)
"""


def test_fork_with_threads_warns_from_3_12() -> None:
    """Pins: 3.12+ warn (DeprecationWarning) when a multi-threaded process forks; 3.11 does not."""
    with Group(FORK_WARNING) as child:
        assert child.wait() == 0, child.stderr()
        out = child.stdout()
    if sys.version_info >= (3, 12):
        assert out[0].startswith("['DeprecationWarning: This process (pid="), out
        assert "multi-threaded" in out[0]
    else:
        assert out == ["[]"]


def test_default_start_method_is_fork_on_linux_before_3_14() -> None:
    """Pins: the naive default on Linux up to 3.13 is fork (3.14 changes it to forkserver)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the default start method differs by platform")
    expected = "fork" if sys.version_info < (3, 14) else "forkserver"
    assert multiprocessing.get_context().get_start_method() == expected


# --- the lifecycle contract on the paths users take -----------------------------------------


def open_fds() -> int:
    """How many file descriptors this process has open."""
    return len(os.listdir("/proc/self/fd"))


def stubborn_child(deaf: bool = False) -> StoppableProcess:
    """A started StoppableProcess whose child ignores its stop request (and SIGTERM if deaf)."""
    context = safe_context()
    ready = context.Event()
    child = StoppableProcess(process_tasks.stubborn, (ready, deaf), context=context).start()
    assert ready.wait(MUST_HAPPEN), "the child never got ready"
    return child


WITH_START = """
    from patterns.stoppable_process import StoppableProcess, safe_context
    from patterns.teaching.process_tasks import wait_for_stop
    with StoppableProcess(wait_for_stop, context=safe_context()).start() as child:
        print(child.pid, flush=True)
    print(child.stop().exitcode, flush=True)
"""


def test_with_a_started_process_stops_it_and_the_program_exits() -> None:
    """`with StoppableProcess(...).start():` enters the running child, stops it, and exits."""
    done = run_python(textwrap.dedent(WITH_START))
    assert done.returncode == 0, done.stderr
    pid, exitcode = done.stdout.split()
    assert exitcode == "0"
    assert gone(int(pid))


def test_with_starts_a_fresh_process_and_refuses_a_stopped_one() -> None:
    """`with` starts what never started, returns what runs, and refuses what was stopped."""
    with StoppableProcess(process_tasks.wait_for_stop, context=safe_context()) as child:
        assert child.pid is not None
        with child as again:  # running: entered as it is, not started twice
            assert again is child
    report = child.stop()
    assert (report.terminated, report.exitcode) == (True, 0)
    with pytest.raises(RuntimeError, match="stopped"), child:
        pass


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_a_stopped_process_keeps_no_file_descriptor_open(method: str) -> None:
    """Once the child is reaped, its sentinel and pipes are closed: no descriptor leaks."""
    context = multiprocessing.get_context(method)
    warm_up = StoppableProcess(process_tasks.wait_for_stop, context=context).start()
    assert warm_up.stop(MUST_HAPPEN).terminated  # the forkserver or resource tracker is up
    before = open_fds()
    child = StoppableProcess(process_tasks.wait_for_stop, context=context).start()
    assert open_fds() > before
    report = child.stop(MUST_HAPPEN)
    assert report.terminated
    assert open_fds() == before
    assert child.pid is not None
    assert gone(child.pid)
    assert child.stop() is report


def test_a_start_that_failed_is_not_retried_and_leaves_nothing_open() -> None:
    """Like every class here: a second start() raises, even after a failed first one."""
    context = multiprocessing.get_context("spawn")
    warm_up = StoppableProcess(process_tasks.wait_for_stop, context=context).start()
    warm_up.stop(MUST_HAPPEN)
    before = open_fds()
    child = StoppableProcess(lambda stop: None, context=context)  # spawn cannot pickle it
    with pytest.raises((AttributeError, pickle.PicklingError)):
        child.start()
    assert open_fds() == before
    with pytest.raises(RuntimeError, match="already started"):
        child.start()
    assert child.stop() == ProcessStopReport(terminated=True, still_running=())


def test_a_start_interrupted_once_the_child_runs_kills_and_reaps_it() -> None:
    """A Ctrl-C landing just after the child started: start() kills it, then propagates."""
    real_start = BaseProcess.start
    pids: list[int] = []

    def start_then_interrupt(process: BaseProcess) -> None:
        real_start(process)
        pids.append(process.pid or 0)
        raise KeyboardInterrupt

    child = StoppableProcess(process_tasks.wait_for_stop, context=safe_context())
    with (
        mock.patch.object(BaseProcess, "start", start_then_interrupt),
        pytest.raises(KeyboardInterrupt),
    ):
        child.start()
    [pid] = pids
    assert gone(pid)
    with pytest.raises(RuntimeError, match="already started"):
        child.start()


SIGNAL_STOP = """
    import signal, threading
    from patterns.stoppable_process import StoppableProcess, safe_context
    from patterns.teaching.process_tasks import stubborn
    from tests.support import elapsed, wait_until_blocked_in
    context = safe_context()
    ready = context.Event()
    child = StoppableProcess(stubborn, (ready, False), context=context).start()
    assert ready.wait(10)
    main, seen = threading.main_thread(), []

    def handler(signum, frame):  # the stop a SIGTERM or SIGHUP handler would call
        with elapsed() as took:
            seen.append(child.stop(0.1))
        seen.append(took())

    def poke():  # once the main thread is inside stop()
        wait_until_blocked_in(main, "_stop_once")
        signal.pthread_kill(main.ident, signal.SIGUSR1)

    signal.signal(signal.SIGUSR1, handler)
    threading.Thread(target=poke).start()
    report = child.stop(2.0)
    provisional, took = seen
    named = [n.endswith(f"(pid {child.pid})") for n in provisional.still_running] == [True]
    print(provisional.terminated, named, took < 0.5)
    print(report.terminated, report.escalation, child.stop() is report)
"""


@pytest.mark.race("E1", "a handler that sets the event main is waiting on deadlocks")
def test_stop_from_a_signal_handler_during_stop_returns_a_provisional_report() -> None:
    """A handler's stop() on the stopping thread returns at once instead of waiting for itself."""
    done = run_python(textwrap.dedent(SIGNAL_STOP))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["False True True", "True terminate True"]


@pytest.mark.race("P3", "shutdown(wait=True) has no timeout")
def test_a_concurrent_stop_waits_only_its_own_budget() -> None:
    """A second thread's stop(0.2) while a stop runs: provisional after 0.2 s, not recorded."""
    child = stubborn_child()
    first, outcome = run_in_thread(lambda: child.stop(3.0), "first-stop")
    wait_until_blocked_in(first, "_stop_once")
    with elapsed() as took:
        provisional = child.stop(0.2)
    assert took() < 0.2 + NOISE
    assert not provisional.terminated
    assert child.pid is not None
    [name] = provisional.still_running
    assert name.endswith(f"(pid {child.pid})")
    join_or_fail(first)
    report = outcome["result"]
    # Escalated, as the stubborn child makes it; whether SIGTERM reaped it within its share
    # (0.375 s of this budget) or SIGKILL had to is a matter of machine load, not this test's.
    assert report.terminated
    assert report.escalation in ("terminate", "kill")
    assert child.stop() is report


CTRL_C_STOP = """
    import os, signal, threading
    from patterns.stoppable_process import StoppableProcess, safe_context
    from patterns.teaching.process_tasks import stubborn
    from tests.support import wait_until_blocked_in
    context = safe_context()
    ready = context.Event()
    child = StoppableProcess(stubborn, (ready, True), context=context).start()
    assert ready.wait(10)
    main = threading.main_thread()

    def ctrl_c():  # once the main thread waits inside stop()
        wait_until_blocked_in(main, "_stop_once")
        signal.pthread_kill(main.ident, signal.SIGINT)

    threading.Thread(target=ctrl_c).start()
    try:
        child.stop(5.0)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    report = child.stop(0)
    try:
        os.kill(child.pid, 0)
        exists = True
    except ProcessLookupError:
        exists = False
    named = [n.endswith(f"(pid {child.pid})") for n in report.still_running] == [True]
    print(report.terminated, named, report.exitcode, exists)
    print(child.stop() is report)
"""


def test_ctrl_c_during_stop_then_stop_0_reports_the_truth() -> None:
    """A real SIGINT inside stop() propagates; stop(0) then says terminated only if reaped."""
    done = run_python(textwrap.dedent(CTRL_C_STOP))
    assert done.returncode == 0, done.stderr
    interrupted, truth, same = done.stdout.splitlines()
    assert (interrupted, same) == ("interrupted", "True")
    terminated, named, exitcode, exists = truth.split()
    if terminated == "True":  # the SIGKILL of stop(0) was fast enough: reaped, so gone
        assert (named, exitcode, exists) == ("False", str(-signal.SIGKILL), "False")
    else:  # still running when stop(0) looked (it may have died since): said so
        assert (named, exitcode) == ("True", "None")


def test_a_report_cannot_say_terminated_with_something_still_running() -> None:
    """The report's constructor refuses a contradiction instead of letting a stop lie."""
    with pytest.raises(ValueError, match="terminated=True with still_running"):
        ProcessStopReport(terminated=True, still_running=("child (pid 1)",))


def set_signal() -> StopSignal:
    """A StopSignal whose parent already asked it to stop."""
    reader, writer = multiprocessing.Pipe(duplex=False)
    writer.send_bytes(b"s")
    writer.close()
    return StopSignal(reader)


SECONDS: dict[str, tuple[str, Callable[[Any], object]]] = {
    "StoppableProcess(stop_timeout)": (
        "stop_timeout",
        lambda v: StoppableProcess(process_tasks.wait_for_stop, stop_timeout=v),
    ),
    "StoppableProcess.stop(timeout)": (
        "timeout",
        lambda v: StoppableProcess(process_tasks.wait_for_stop).stop(v),
    ),
    "StopSignal.wait(timeout)": ("timeout", lambda v: set_signal().wait(v)),
}


@pytest.mark.parametrize("bad", [math.nan, -1.0, -math.inf, True, "1"], ids=repr)
@pytest.mark.parametrize("entry", list(SECONDS))
def test_every_seconds_argument_refuses_what_is_not_seconds(entry: str, bad: object) -> None:
    """nan, negative, bool and str: a ValueError naming the argument, never a silent 0."""
    name, call = SECONDS[entry]
    with pytest.raises(ValueError, match=rf"^{name} must be a number of seconds >= 0"):
        call(bad)


@pytest.mark.parametrize(
    "huge", [math.inf, 1e10, 1e300, 10**400], ids=["inf", "1e10", "1e300", "10**400"]
)
def test_every_seconds_argument_takes_inf_and_huge_values(huge: float) -> None:
    """Budgets of inf or huge mean "as long as it takes": no OverflowError on any wait."""
    context = safe_context()
    child = StoppableProcess(process_tasks.wait_for_stop, stop_timeout=huge, context=context)
    assert child.start().stop().escalation == ""
    child = StoppableProcess(process_tasks.wait_for_stop, context=context).start()
    assert child.stop(huge).terminated
    assert set_signal().wait(huge)
