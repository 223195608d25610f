"""Process pools and child processes: each pitfall forced, and the pattern holding.

Where exit, a hang or a signal is involved the scenario runs in a child interpreter in a
process group of its own, which the test kills as a whole when it is done, so nothing
it started can outlive the test. The child scripts print marker lines; the test reads
them (with a timeout) before it acts. Worker processes are started with ``forkserver``
(`safe_context`) except in the test about ``fork`` itself.
"""

from __future__ import annotations

import contextlib
import gc
import math
import multiprocessing
import multiprocessing.pool
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import IO, Any

import pytest

from patterns.naive.process_shutdown import (
    naive_apply_in_with,
    naive_close_pool,
    naive_collect,
    naive_map,
)
from patterns.process_shutdown import (
    PoolShutdownReport,
    collect,
    shutdown_mp_pool,
    shutdown_process_pool,
)
from patterns.stoppable_process import safe_context
from patterns.teaching import process_tasks
from tests.support import (
    MUST_HAPPEN,
    NOISE,
    child_env,
    elapsed,
    join_or_fail,
    run_in_thread,
    stays_blocked,
    wait_until,
    wait_until_blocked_in,
)

# How long a test watches a child that must *not* exit (it is blocked for ever, or for
# 60 s): it can only make the test slower, never let a fixed version pass by luck.
WATCH = 0.5


class Group:
    """A child interpreter leading its own process group, its stdout read line by line.

    Leaving the block SIGKILLs the whole group (the child and every process it started)
    and reaps the child, so a hung scenario costs its timeout and nothing more.
    """

    def __init__(self, code: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
            start_new_session=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put)),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self.err.append)),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _pump(stream: IO[str], put: Callable[[str], object]) -> None:
        for line in stream:
            put(line.rstrip("\n"))

    def __enter__(self) -> Group:
        return self

    def __exit__(self, *exc_info: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(MUST_HAPPEN)
        for reader in self._readers:
            reader.join(MUST_HAPPEN)
            assert not reader.is_alive()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def expect(self, line: str) -> None:
        """Read stdout lines until ``line``; fail (with stderr) if it does not come."""
        while True:
            try:
                got = self.lines.get(timeout=MUST_HAPPEN)
            except queue.Empty:
                raise AssertionError(f"never printed {line!r}; stderr: {self.stderr()}") from None
            if got == line:
                return

    def stays_alive(self, duration: float = WATCH) -> bool:
        """Return True if the child is still running after watching it for ``duration``."""
        try:
            self.proc.wait(duration)
        except subprocess.TimeoutExpired:
            return True
        return False

    def wait(self, timeout: float = MUST_HAPPEN) -> int:
        """Wait for the child's exit; return its status."""
        return self.proc.wait(timeout)

    def killpg(self, sig: int) -> None:
        """Signal the whole group, as a terminal does on Ctrl-C."""
        os.killpg(self.proc.pid, sig)

    def stdout(self) -> list[str]:
        """After the exit: the stdout lines not read yet."""
        for reader in self._readers:
            reader.join(MUST_HAPPEN)
        return list(self.lines.queue)

    def stderr(self) -> str:
        """What the child wrote to stderr so far."""
        return "\n".join(self.err)


def gone(pid: int) -> bool:
    """True if no process (not even a zombie) has this pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def pool() -> Iterator[ProcessPoolExecutor]:
    """A one-worker pool whose worker is already running; force-stopped afterwards."""
    executor = ProcessPoolExecutor(max_workers=1, mp_context=safe_context())
    assert executor.submit(process_tasks.square, 3).result(MUST_HAPPEN) == 9
    yield executor
    shutdown_process_pool(executor, MUST_HAPPEN, force_timeout=MUST_HAPPEN)


def started_pid(path: Path) -> int:
    """Wait until a ``mark_then_sleep`` task has written its pid to ``path``; return it."""
    wait_until(lambda: path.exists() and path.read_text().endswith("\n"), "task started")
    return int(path.read_text())


# --- M1: a stuck worker keeps the pool, and the interpreter's exit, waiting --------------

STUCK_POOL = """
    import sys, time
    from concurrent.futures import Future, ProcessPoolExecutor
    from pathlib import Path
    from patterns.naive.process_shutdown import naive_stop_pool
    from patterns.process_shutdown import shutdown_process_pool
    from patterns.stoppable_process import safe_context
    from patterns.teaching.process_tasks import mark_then_sleep
    path = Path({path!r})
    pool = ProcessPoolExecutor(max_workers=1, mp_context=safe_context())
    pool.submit(mark_then_sleep, str(path), 60)
    while not path.exists():
        time.sleep(0.001)
    print("stopping", flush=True)
    {stop}
    print("stopped", flush=True)
"""


@pytest.mark.race("M1", "a stuck worker keeps the process pool and the exit waiting")
@pytest.mark.parametrize(
    "stop", ["naive_stop_pool(pool)", "pass  # the exit joins the pool"], ids=["with", "exit"]
)
def test_naive_stuck_worker_keeps_shutdown_and_exit_waiting(
    tmp_path: Path, stop: str, record_property: Callable[[str, object], None]
) -> None:
    """Broken: shutdown(), leaving ``with`` and the interpreter's exit wait for a stuck task."""
    code = STUCK_POOL.format(path=str(tmp_path / "pid"), stop=stop)
    with Group(code) as child:
        child.expect("stopping")
        alive = child.stays_alive()
        waiter = "naive_stop_pool()" if stop.startswith("naive") else "the interpreter's exit"
        record_property(
            "observed",
            f"{waiter} {'still' if alive else 'no longer'} waiting {WATCH}s later"
            " for the stuck task",
        )
        assert alive, child.stderr()


@pytest.mark.race("M1", "a stuck worker keeps the process pool and the exit waiting")
def test_shutdown_process_pool_ends_a_stuck_worker_and_the_exit(tmp_path: Path) -> None:
    """shutdown_process_pool returns on its deadline and the process exits at once, status 0."""
    stop = "print(shutdown_process_pool(pool, 0.2, force_timeout=1.0).killed_pids, flush=True)"
    code = STUCK_POOL.format(path=str(tmp_path / "pid"), stop=stop)
    with Group(code) as child:
        child.expect("stopping")
        assert child.wait() == 0, child.stderr()
        pid = int((tmp_path / "pid").read_text())
        assert child.stdout()[:2] == [f"({pid},)", "stopped"]
        assert gone(pid)


@pytest.mark.race("M1", "a stuck worker keeps the process pool and the exit waiting")
def test_shutdown_process_pool_kills_a_60s_task_within_its_budget(
    pool: ProcessPoolExecutor, tmp_path: Path
) -> None:
    """A 60 s task: the call returns within timeout + force_timeout + 1 s, its worker gone."""
    path = tmp_path / "pid"
    running = pool.submit(process_tasks.mark_then_sleep, str(path), 60)
    queued = [pool.submit(process_tasks.square, n) for n in range(4)]
    pid = started_pid(path)
    timeout, force_timeout = 0.3, 4.0
    with elapsed() as took:
        report = shutdown_process_pool(pool, timeout, force_timeout=force_timeout)
    assert took() < timeout + force_timeout + 1.0
    assert report.terminated
    assert report.still_running == ()
    assert report.forced
    assert report.killed_pids == (pid,)
    assert gone(pid)
    with pytest.raises(BrokenProcessPool):
        running.result(0)
    # The call queue holds up to max_workers + 1 items: the last of four queued tasks
    # cannot have left the pool, and every task is accounted for exactly once.
    assert queued[-1].cancelled()
    assert report.lost[0] == "mark_then_sleep"
    assert len(report.never_started) + len(report.lost) == 5
    assert report.never_started == ("square",) * len(report.never_started)


INTERRUPTED_WAIT = """
    import os, sys, threading, time
    from concurrent.futures import ProcessPoolExecutor
    from pathlib import Path
    from patterns.process_shutdown import shutdown_process_pool
    from patterns.stoppable_process import safe_context
    from patterns.teaching.process_tasks import mark_then_sleep
    path = Path({path!r})
    pool = ProcessPoolExecutor(max_workers=1, mp_context=safe_context())
    pool.submit(mark_then_sleep, str(path), 60)
    while not (path.exists() and path.read_text().endswith("\\n")):
        time.sleep(0.001)
    pid = int(path.read_text())
    main = threading.main_thread().ident

    def announce():  # once the main thread waits inside shutdown_process_pool
        while True:
            frame, names = sys._current_frames().get(main), []
            while frame is not None:
                names.append(frame.f_code.co_name)
                frame = frame.f_back
            if "_wait_then_force" in names and "_join_thread" in names:
                print("waiting", flush=True)
                return
            time.sleep(0.001)  # polling an observation

    threading.Thread(target=announce).start()
    start = time.monotonic()
    try:
        shutdown_process_pool(pool, 60, force_timeout=5)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    try:
        os.kill(pid, 0)
        print("worker alive", flush=True)
    except ProcessLookupError:
        print("worker gone", flush=True)
"""


def test_ctrl_c_during_shutdown_process_pool_kills_the_workers_and_propagates(
    tmp_path: Path,
) -> None:
    """A KeyboardInterrupt in the graceful wait kills and reaps the workers, then propagates."""
    with Group(INTERRUPTED_WAIT.format(path=str(tmp_path / "pid"))) as child:
        child.expect("waiting")
        with elapsed() as took:
            child.proc.send_signal(signal.SIGINT)  # the parent only: its workers are busy
            assert child.wait() == 0, child.stderr()
        assert took() < 5.0 + NOISE
        assert child.stdout() == ["interrupted", "worker gone"]


def test_shutdown_process_pool_sends_sigkill_to_a_worker_that_ignores_sigterm(
    pool: ProcessPoolExecutor, tmp_path: Path
) -> None:
    """A worker deaf to SIGTERM is killed half-way through force_timeout and reaped."""
    path = tmp_path / "pid"
    pool.submit(process_tasks.deaf_then_sleep, str(path), 60)
    pid = started_pid(path)
    with elapsed() as took:
        report = shutdown_process_pool(pool, 0.1, force_timeout=2.0)
    assert took() < 0.1 + 2.0 + NOISE
    assert report.terminated
    assert report.killed_pids == (pid,)
    assert gone(pid)


def test_shutdown_process_pool_waits_for_work_that_finishes() -> None:
    """Tasks that finish in time: nothing forced, nothing killed, every result delivered."""
    executor = ProcessPoolExecutor(max_workers=2, mp_context=safe_context())
    futures = [executor.submit(process_tasks.square, n) for n in range(6)]
    report = shutdown_process_pool(executor, MUST_HAPPEN, force_timeout=MUST_HAPPEN)
    assert report == PoolShutdownReport(terminated=True, still_running=(), elapsed=report.elapsed)
    assert [f.result(0) for f in futures] == [n * n for n in range(6)]


def test_shutdown_process_pool_on_an_unused_pool_returns_at_once() -> None:
    """A pool that never started a worker terminates trivially."""
    report = shutdown_process_pool(ProcessPoolExecutor(1), 1.0, force_timeout=1.0)
    assert report.terminated
    assert not report.forced
    assert report.elapsed < NOISE


@pytest.mark.parametrize("bad", [-1, float("nan"), True, "1"])
def test_shutdown_process_pool_refuses_a_bad_budget(bad: float) -> None:
    """A negative or NaN budget, a bool or a string is a ValueError that names the argument."""
    executor = ProcessPoolExecutor(1)
    with pytest.raises(ValueError, match="force_timeout"):
        shutdown_process_pool(executor, 1.0, force_timeout=bad)
    shutdown_process_pool(executor, 1.0, force_timeout=1.0)


def test_pool_workers_live_in_the_private_processes_dict_until_shutdown() -> None:
    """Pins the private attribute shutdown_process_pool reads, on this Python version.

    ``_processes`` maps pid to process while the pool runs, and ``shutdown()`` sets it
    to None (so it must be read first); the manager thread and its wake-up pipe are
    dropped the same way, and the work items are in ``_pending_work_items``.
    """
    executor = ProcessPoolExecutor(max_workers=1, mp_context=safe_context())
    future = executor.submit(process_tasks.square, 2)
    assert future.result(MUST_HAPPEN) == 4
    workers = executor._processes  # type: ignore[attr-defined]
    assert isinstance(workers, dict)
    [(pid, process)] = workers.items()
    assert process.pid == pid
    assert process.is_alive()
    manager = executor._executor_manager_thread  # type: ignore[attr-defined]
    assert isinstance(manager, threading.Thread)
    assert hasattr(executor._executor_manager_thread_wakeup, "wakeup")  # type: ignore[attr-defined]
    assert isinstance(executor._pending_work_items, dict)  # type: ignore[attr-defined]
    assert hasattr(executor, "terminate_workers") == (sys.version_info >= (3, 14))
    executor.shutdown(wait=False)
    assert executor._processes is None  # type: ignore[attr-defined]
    assert executor._executor_manager_thread is None  # type: ignore[attr-defined]
    assert executor._executor_manager_thread_wakeup is None  # type: ignore[attr-defined]
    manager.join(MUST_HAPPEN)
    process.join(MUST_HAPPEN)
    assert process.exitcode == 0


# --- M2: a worker that dies breaks the whole pool -------------------------------------------


def dying_worker(pool: ProcessPoolExecutor, tmp_path: Path, how: str) -> list[Future[int]]:
    """A finished task, one whose worker then dies by ``how``, and one queued behind it."""
    first = pool.submit(process_tasks.square, 5)
    assert first.result(MUST_HAPPEN) == 25
    trigger = tmp_path / "die"
    futures = [first, pool.submit(process_tasks.die_when, str(trigger), how)]
    futures.append(pool.submit(process_tasks.square, 6))
    trigger.touch()  # only now may the worker die: every task was accepted
    return futures


@pytest.mark.race("M2", "a dead worker process breaks the pool: every pending future fails")
@pytest.mark.parametrize("how", ["os._exit", "SIGKILL"])
def test_naive_collect_loses_every_result_when_a_worker_dies(
    pool: ProcessPoolExecutor,
    tmp_path: Path,
    how: str,
    record_property: Callable[[str, object], None],
) -> None:
    """Broken: the first BrokenProcessPool ends the loop, results and all."""
    # The first result is there, and the caller gets none of it, nor what was lost.
    futures = dying_worker(pool, tmp_path, how)
    with pytest.raises(BrokenProcessPool):
        naive_collect(futures)
    record_property(
        "observed",
        f"a worker ended by {how}: the loop raised BrokenProcessPool, and the result"
        f" {futures[0].result(0)} already computed never reached the caller",
    )


@pytest.mark.race("M2", "a dead worker process breaks the pool: every pending future fails")
@pytest.mark.parametrize("how", ["os._exit", "SIGKILL"])
def test_collect_reports_the_results_and_the_work_lost_to_a_dead_worker(
    pool: ProcessPoolExecutor, tmp_path: Path, how: str
) -> None:
    """`collect` keeps the results, names the lost tasks; the pool shuts down without a hang."""
    futures = dying_worker(pool, tmp_path, how)
    outcome = collect(futures, MUST_HAPPEN)
    assert outcome.results == {0: 25}
    assert outcome.errors == {}
    assert outcome.lost == (1, 2)
    with pytest.raises(BrokenProcessPool):
        pool.submit(process_tasks.square, 7)  # a broken pool refuses new work
    with elapsed() as took:
        report = shutdown_process_pool(pool, MUST_HAPPEN, force_timeout=MUST_HAPPEN)
    assert report.terminated
    assert not report.forced
    assert took() < NOISE


def test_collect_keeps_task_errors_apart_from_lost_work(pool: ProcessPoolExecutor) -> None:
    """A task's own exception is an error at its position, not lost work."""
    futures = [pool.submit(process_tasks.square, "x"), pool.submit(process_tasks.square, 3)]
    outcome = collect(futures, MUST_HAPPEN)
    assert isinstance(outcome.errors[0], TypeError)
    assert outcome.results == {1: 9}
    assert outcome.lost == ()


CANCELLED_THEN_BROKEN = """
    import threading, time
    from concurrent.futures import Future, ProcessPoolExecutor
    from pathlib import Path
    from patterns.process_shutdown import shutdown_process_pool
    from patterns.stoppable_process import safe_context
    from patterns.teaching.process_tasks import die_when, square
    seen = []
    threading.excepthook = lambda args: seen.append(args.exc_type.__name__)
    trigger = {path!r}
    pool = ProcessPoolExecutor(max_workers=1, mp_context=safe_context())
    pool.submit(die_when, trigger)
    queued = [pool.submit(square, n) for n in range(3)]  # two fit in the call queue
    while not Path(trigger + ".started").exists():
        time.sleep(0.001)
    assert queued[-1].cancel()  # still PENDING: it cannot have left the pool
    Path(trigger).touch()  # the worker dies now
    report = shutdown_process_pool(pool, 10, force_timeout=10)
    print(seen, report.terminated, flush=True)
"""


def test_a_cancelled_queued_future_kills_the_pool_manager_on_3_11(tmp_path: Path) -> None:
    """Pins: 3.11's manager dies with InvalidStateError on a future cancelled from outside.

    A future the caller cancelled while it was queued is still in the manager's table
    when a worker dies; 3.12+ skip it, 3.11.7 raises in the manager thread.
    """
    with Group(CANCELLED_THEN_BROKEN.format(path=str(tmp_path / "go"))) as child:
        assert child.wait() == 0, child.stderr()
        out = child.stdout()
    crashed = "['InvalidStateError'] True" if sys.version_info < (3, 12) else "[] True"
    assert out == [crashed]


def test_collect_counts_cancelled_and_unfinished_futures_as_lost_and_keeps_its_deadline() -> None:
    """A cancelled future and one pending at the deadline are lost; collect returns in time."""
    done: Future[int] = Future()
    done.set_result(1)
    cancelled: Future[int] = Future()
    cancelled.cancel()
    pending: Future[int] = Future()
    with elapsed() as took:
        outcome = collect([done, cancelled, pending], 0.2)
    assert took() < 0.2 + NOISE
    assert outcome.results == {0: 1}
    assert outcome.lost == (1, 2)


def test_a_report_cannot_say_terminated_with_something_still_running() -> None:
    """The report's constructor refuses a contradiction instead of letting a stop lie."""
    with pytest.raises(ValueError, match="terminated=True with still_running"):
        PoolShutdownReport(terminated=True, still_running=("worker (pid 1)",))


SECONDS: dict[str, tuple[str, Callable[[Any], object]]] = {
    "shutdown_process_pool(timeout)": (
        "timeout",
        lambda v: shutdown_process_pool(ProcessPoolExecutor(1), v, force_timeout=1.0),
    ),
    "shutdown_process_pool(force_timeout)": (
        "force_timeout",
        lambda v: shutdown_process_pool(ProcessPoolExecutor(1), 1.0, force_timeout=v),
    ),
    "collect(timeout)": ("timeout", lambda v: collect([], v)),
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
    executor = ProcessPoolExecutor(max_workers=1, mp_context=safe_context())
    futures = [executor.submit(process_tasks.square, n) for n in range(3)]
    assert collect(futures, huge).results == {0: 0, 1: 1, 2: 4}
    assert shutdown_process_pool(executor, huge, force_timeout=huge).terminated


# --- multiprocessing.Pool: M8 to M11 --------------------------------------------------------
# Pool is the same code in 3.11.7, 3.12.1 and 3.13.0 (Lib/multiprocessing/pool.py differs
# only in a message's spelling and in os.process_cpu_count() for the default size), so
# each pin below states one behaviour for all three, and runs on each.


@pytest.fixture(autouse=True)
def _earlier_pools_collected() -> None:
    """Collect the garbage of earlier tests' pools before this test makes its own.

    A ``Pool`` is cyclic garbage once stopped, and its queues' semaphores are unregistered
    from the resource tracker by finalizers that the cyclic GC runs at any allocation. On
    3.12 one ran inside this process's own call into the tracker (registering the next
    pool's semaphores), which refuses a reentrant call and warns that the semaphore might
    leak: 2 errors in about 30 runs of the race set under load. Collected here, at a known
    point, no finalizer is left for such a call.
    """
    gc.collect()


@pytest.fixture
def mp_pool() -> Iterator[multiprocessing.pool.Pool]:
    """A two-worker Pool (forkserver); whatever is left is forced at the end."""
    pool = safe_context().Pool(2)
    yield pool
    assert shutdown_mp_pool(pool, 0, force_timeout=MUST_HAPPEN).terminated


def worker_pids(pool: multiprocessing.pool.Pool) -> set[int]:
    """The pids of the workers the pool holds now (its private list)."""
    return {p.pid for p in list(pool._pool) if p.is_alive()}  # type: ignore[attr-defined]


def task_files(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The go-ahead file, the started file and the cleanup log of `item_with_cleanup`."""
    return tmp_path / "go", tmp_path / "started", tmp_path / "log"


M8 = ("M8", "leaving `with Pool()` terminates the tasks still running")


@pytest.mark.race(*M8)
def test_naive_with_pool_kills_the_running_task_and_its_finally(
    mp_pool: multiprocessing.pool.Pool,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    """Broken: the block's exit calls terminate(): the task's result and finally are lost."""
    go, started, log = task_files(tmp_path)
    args = (str(go), str(started), str(log))
    result = naive_apply_in_with(
        mp_pool, process_tasks.item_with_cleanup, args, then=lambda: started_pid(started)
    )
    pid = int(started.read_text())
    go.touch()  # too late: the worker was killed with the block's exit
    with pytest.raises(multiprocessing.TimeoutError):
        result.get(WATCH)
    cleanup = log.read_text().splitlines() if log.exists() else []
    record_property(
        "observed",
        f"leaving the with block killed worker {pid} mid-task: get({WATCH}) timed out,"
        f" finally lines written: {cleanup or 'none'}",
    )
    assert gone(pid)
    assert cleanup == []


@pytest.mark.race(*M8)
def test_shutdown_mp_pool_lets_the_running_task_finish_and_clean_up(
    mp_pool: multiprocessing.pool.Pool, tmp_path: Path
) -> None:
    """shutdown_mp_pool closes the pool and waits: the task returns and its finally runs.

    Replace ``with Pool() as pool:`` by try/finally around `shutdown_mp_pool`.
    """
    go, started, log = task_files(tmp_path)
    args = (str(go), str(started), str(log))
    result = mp_pool.apply_async(process_tasks.item_with_cleanup, args)
    pid = started_pid(started)
    thread, outcome = run_in_thread(
        lambda: shutdown_mp_pool(
            mp_pool, MUST_HAPPEN, force_timeout=MUST_HAPPEN, results={"item": result}
        ),
        "stopper",
    )
    wait_until_blocked_in(thread, "_wait_for_pool")
    go.touch()
    join_or_fail(thread)
    report = outcome["result"]
    assert report == PoolShutdownReport(terminated=True, still_running=(), elapsed=report.elapsed)
    assert result.get(0) == "done"
    assert log.read_text().splitlines() == ["finally"]
    assert gone(pid)


M9 = ("M9", "Pool.close() then join() has no timeout: one stuck task holds the caller")


@pytest.mark.race(*M9)
def test_naive_close_and_join_waits_as_long_as_a_stuck_task(
    mp_pool: multiprocessing.pool.Pool,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    """Broken: join() waits for every task, as long as the slowest one takes."""
    go, started, _ = task_files(tmp_path)
    result = mp_pool.apply_async(process_tasks.item_until, (str(go), str(started)))
    started_pid(started)
    thread, outcome = run_in_thread(lambda: naive_close_pool(mp_pool), "naive-join")
    wait_until_blocked_in(thread, "join")
    held = stays_blocked(thread, WATCH)
    go.touch()  # released late: only now can join() return
    join_or_fail(thread)
    record_property(
        "observed",
        f"close(); join() {'still' if held else 'no longer'} blocked {WATCH}s after it"
        " began; it returned only once the task was let go",
    )
    assert held
    assert outcome == {"result": None}
    assert result.get(0) == "done"


@pytest.mark.race(*M9)
def test_shutdown_mp_pool_ends_a_stuck_task_within_its_budget(
    mp_pool: multiprocessing.pool.Pool, tmp_path: Path
) -> None:
    """A 60 s task: shutdown_mp_pool returns within its budget, the worker killed and reaped."""
    path = tmp_path / "pid"
    stuck = mp_pool.apply_async(process_tasks.mark_then_sleep, (str(path), 60))
    pid = started_pid(path)
    quick = mp_pool.apply_async(process_tasks.square, (4,))
    assert quick.get(MUST_HAPPEN) == 16
    timeout, force_timeout = 0.3, 4.0
    with elapsed() as took:
        report = shutdown_mp_pool(
            mp_pool, timeout, force_timeout=force_timeout, results={"stuck": stuck, "quick": quick}
        )
    assert took() < timeout + force_timeout + 1.0
    assert report.terminated
    assert report.forced
    assert report.lost == ("stuck",)
    assert pid in report.killed_pids
    assert gone(pid)


M10 = ("M10", "a Pool worker killed mid-task: the pool replaces it and the result never comes")

# What Pool.map does when a worker is SIGKILLed mid-task, by version: the pool starts a
# replacement, raises nothing, and the result never arrives (pool.py, the three versions).
WHAT_MAP_DOES = {(3, 11): "TimeoutError", (3, 12): "TimeoutError", (3, 13): "TimeoutError"}


@pytest.mark.race(*M10)
def test_naive_map_never_gets_the_result_of_a_killed_worker(
    mp_pool: multiprocessing.pool.Pool,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    """Broken: the pool replaces the killed worker and map() waits; pinned on each version."""
    path, killed = tmp_path / "pid", []

    def kill_the_worker() -> None:
        killed.append(started_pid(path))
        os.kill(killed[0], signal.SIGKILL)  # the OOM killer, an operator, a crash

    try:
        naive_map(mp_pool, process_tasks.sleep_marked, [str(path)], kill_the_worker, WATCH)
        outcome = "returned"
    except multiprocessing.TimeoutError:
        outcome = "TimeoutError"
    except Exception as exc:  # the pin records whatever a version raises
        outcome = type(exc).__name__
    wait_until(lambda: len(worker_pids(mp_pool)) == 2, "the pool replaced its worker")
    replaced = killed[0] not in worker_pids(mp_pool)
    record_property(
        "observed",
        f"{sys.version.split()[0]}: worker {killed[0]} SIGKILLed mid-task; the pool"
        f" {'replaced' if replaced else 'kept'} it; map(timeout={WATCH}) ended in {outcome}",
    )
    assert outcome == WHAT_MAP_DOES[sys.version_info[:2]]
    assert replaced


@pytest.mark.race(*M10)
def test_shutdown_mp_pool_reports_the_task_of_a_killed_worker_lost_without_waiting(
    mp_pool: multiprocessing.pool.Pool, tmp_path: Path
) -> None:
    """A worker killed while shutdown_mp_pool waits: the wait ends at once, its task lost."""
    path = tmp_path / "pid"
    result = mp_pool.map_async(process_tasks.sleep_marked, [str(path)])
    pid = started_pid(path)
    thread, outcome = run_in_thread(
        lambda: shutdown_mp_pool(mp_pool, 60, force_timeout=MUST_HAPPEN, results={"map": result}),
        "stopper",
    )
    wait_until_blocked_in(thread, "_wait_for_pool")
    with elapsed() as took:
        os.kill(pid, signal.SIGKILL)
        join_or_fail(thread)
    assert took() < NOISE  # not the 60 s of its timeout
    report = outcome["result"]
    assert report.terminated
    assert report.forced
    assert report.lost == ("map",)
    assert pid not in report.killed_pids  # it was dead already
    assert all(gone(p) for p in report.killed_pids)


def test_shutdown_mp_pool_bounds_a_death_it_did_not_see(
    mp_pool: multiprocessing.pool.Pool, tmp_path: Path
) -> None:
    """A worker killed (and replaced) before the call: the pool forgot it; the deadline holds."""
    path = tmp_path / "pid"
    result = mp_pool.map_async(process_tasks.sleep_marked, [str(path)])
    pid = started_pid(path)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: pid not in worker_pids(mp_pool), "the pool replaced its worker")
    with elapsed() as took:
        report = shutdown_mp_pool(mp_pool, 0.3, force_timeout=MUST_HAPPEN, results={"map": result})
    assert took() < 0.3 + NOISE
    assert (report.terminated, report.forced, report.lost) == (True, True, ("map",))


M11 = ("M11", "Pool.terminate() waits for ever for a worker that ignores SIGTERM")


@pytest.mark.race(*M11)
def test_naive_with_pool_exit_hangs_on_a_worker_deaf_to_sigterm(
    mp_pool: multiprocessing.pool.Pool,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    """Broken: terminate() sends SIGTERM, then joins each worker with no timeout."""
    path = tmp_path / "pid"
    thread, outcome = run_in_thread(
        lambda: naive_apply_in_with(
            mp_pool, process_tasks.deaf_then_sleep, (str(path), 60), lambda: started_pid(path)
        ),
        "naive-with",
    )
    wait_until_blocked_in(thread, "_terminate_pool")
    held = stays_blocked(thread, WATCH)
    pid = int(path.read_text())
    os.kill(pid, signal.SIGKILL)  # the test ends it; the naive code never would
    join_or_fail(thread)
    record_property(
        "observed",
        f"leaving the with block: terminate() {'still' if held else 'no longer'} waiting"
        f" {WATCH}s later for worker {pid}, which ignores SIGTERM",
    )
    assert held
    assert "result" in outcome


@pytest.mark.race(*M11)
def test_shutdown_mp_pool_kills_a_worker_deaf_to_sigterm(
    mp_pool: multiprocessing.pool.Pool, tmp_path: Path
) -> None:
    """SIGKILL half-way through force_timeout ends a worker that ignores SIGTERM; reaped."""
    path = tmp_path / "pid"
    result = mp_pool.apply_async(process_tasks.deaf_then_sleep, (str(path), 60))
    pid = started_pid(path)
    with elapsed() as took:
        report = shutdown_mp_pool(mp_pool, 0.1, force_timeout=2.0, results={"deaf": result})
    assert took() < 0.1 + 2.0 + NOISE
    assert report.terminated
    assert report.lost == ("deaf",)
    assert pid in report.killed_pids
    assert gone(pid)


M12 = (
    "M12",
    "a Pool worker killed while idle keeps the task queue's lock: join and terminate hang",
)


def idle_worker_killed_holding_the_lock() -> multiprocessing.pool.Pool:
    """A one-worker Pool whose worker was SIGKILLed while it waited for a task, replaced."""
    pool = safe_context().Pool(1)
    pid = pool.apply_async(os.getpid).get(MUST_HAPPEN)
    lock = pool._inqueue._rlock  # type: ignore[attr-defined]
    # An idle worker waits for its next task inside `with inqueue._rlock:`.
    wait_until(lambda: lock._semlock._get_value() == 0, "the idle worker holds the lock")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: worker_pids(pool) - {pid} != set(), "the pool replaced its worker")
    return pool


@pytest.mark.race(*M12)
def test_naive_close_and_join_hang_after_an_idle_worker_was_killed(
    record_property: Callable[[str, object], None],
) -> None:
    """Broken: the dead worker's lock starves its replacement; join() waits, with no task."""
    pool = idle_worker_killed_holding_the_lock()
    thread, outcome = run_in_thread(lambda: naive_close_pool(pool), "naive-join")
    wait_until_blocked_in(thread, "join")
    held = stays_blocked(thread, WATCH)
    pool._inqueue._rlock.release()  # type: ignore[attr-defined]  # the test frees it
    join_or_fail(thread)
    record_property(
        "observed",
        f"{sys.version.split()[0]}: no task pending; close(); join()"
        f" {'still' if held else 'no longer'} blocked {WATCH}s later: the replacement"
        " worker waits for the lock its killed predecessor held",
    )
    assert held
    assert outcome == {"result": None}
    assert shutdown_mp_pool(pool, 0, force_timeout=MUST_HAPPEN).terminated


@pytest.mark.race(*M12)
def test_shutdown_mp_pool_frees_the_lock_a_killed_worker_held() -> None:
    """shutdown_mp_pool reaps every worker, then frees a dead one's lock: the pool ends.

    Only once no worker is left does it release a queue lock that no thread of its own
    process holds, so no live process can be holding it.
    """
    pool = idle_worker_killed_holding_the_lock()
    with elapsed() as took:
        report = shutdown_mp_pool(pool, 0.2, force_timeout=2.0)
    assert took() < 0.2 + 2.0 + NOISE
    assert report.terminated, report.still_running
    assert report.forced
    assert all(gone(p) for p in report.killed_pids)


MP_INTERRUPTED_WAIT = """
    import os, sys, threading, time
    from pathlib import Path
    from patterns.process_shutdown import shutdown_mp_pool
    from patterns.stoppable_process import safe_context
    from patterns.teaching.process_tasks import mark_then_sleep
    path = Path({path!r})
    pool = safe_context().Pool(1)
    pool.apply_async(mark_then_sleep, (str(path), 60))
    while not (path.exists() and path.read_text().endswith("\\n")):
        time.sleep(0.001)
    pid = int(path.read_text())
    main = threading.main_thread().ident

    def announce():  # once the main thread waits inside shutdown_mp_pool
        while True:
            frame, names = sys._current_frames().get(main), []
            while frame is not None:
                names.append(frame.f_code.co_name)
                frame = frame.f_back
            if "_wait_for_pool" in names:
                print("waiting", flush=True)
                return
            time.sleep(0.001)  # polling an observation

    threading.Thread(target=announce).start()
    try:
        shutdown_mp_pool(pool, 60, force_timeout=5)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    try:
        os.kill(pid, 0)
        print("worker alive", flush=True)
    except ProcessLookupError:
        print("worker gone", flush=True)
"""


def test_ctrl_c_during_shutdown_mp_pool_kills_the_workers_and_propagates(tmp_path: Path) -> None:
    """A Ctrl-C in the graceful wait kills and reaps the Pool's workers, and propagates."""
    with Group(MP_INTERRUPTED_WAIT.format(path=str(tmp_path / "pid"))) as child:
        child.expect("waiting")
        with elapsed() as took:
            child.proc.send_signal(signal.SIGINT)  # the parent only: its worker is busy
            assert child.wait() == 0, child.stderr()
        assert took() < 5.0 + NOISE
        assert child.stdout() == ["interrupted", "worker gone"]


# Two workers deaf to SIGTERM, each running a stuck task; once both run, the pool is shut
# down with a forced phase so long (SIGKILL due 30 s into it) that only the Ctrl-C the test
# sends once a worker has got SIGTERM can end it within the test's bound.
FORCED_PHASE_INTERRUPTED = """
    import multiprocessing, time
    from concurrent.futures import ProcessPoolExecutor
    from pathlib import Path
    from patterns.process_shutdown import shutdown_mp_pool, shutdown_process_pool
    from patterns.stoppable_process import ignore_sigint
    from patterns.teaching.process_tasks import deaf_noting_sigterm
    path = Path({path!r})
    context = multiprocessing.get_context({method!r})
    if {shutdown!r} == "shutdown_mp_pool":
        pool = context.Pool(2, initializer=ignore_sigint)
        for _ in range(2):
            pool.apply_async(deaf_noting_sigterm, (str(path), 60))
        shutdown = shutdown_mp_pool
    else:
        pool = ProcessPoolExecutor(2, mp_context=context, initializer=ignore_sigint)
        for _ in range(2):
            pool.submit(deaf_noting_sigterm, str(path), 60)
        shutdown = shutdown_process_pool
    deadline = time.monotonic() + 30  # a bounded wait: the child never hangs the test
    while not (path.exists() and path.read_text().count("\\n") == 2):  # both tasks run
        assert time.monotonic() < deadline, "the two tasks never started"
        time.sleep(0.001)
    try:
        shutdown(pool, 0.5, force_timeout=60)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
"""


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
@pytest.mark.parametrize("shutdown", ["shutdown_mp_pool", "shutdown_process_pool"])
def test_ctrl_c_in_the_forced_phase_kills_and_reaps_workers_deaf_to_sigterm(
    tmp_path: Path, method: str, shutdown: str
) -> None:
    """A Ctrl-C after SIGTERM, before SIGKILL is due, kills and reaps the workers; the exit follows.

    The worker's SIGTERM handler writes a line and carries on, so the test sends the
    SIGINT once the forced phase has sent SIGTERM, 30 s before its SIGKILL is due.
    """
    path = tmp_path / "pid"
    code = FORCED_PHASE_INTERRUPTED.format(path=str(path), method=method, shutdown=shutdown)
    with Group(code) as child:
        term = path.with_name("pid.term")
        wait_until(term.exists, "a worker got SIGTERM: the forced phase has begun")
        pids = [int(line) for line in path.read_text().split()]
        assert len(pids) == 2
        child.proc.send_signal(signal.SIGINT)  # the parent only, as in the graceful wait
        try:
            status = child.wait(MUST_HAPPEN)
        except subprocess.TimeoutExpired:
            alive = [pid for pid in pids if not gone(pid)]
            pytest.fail(
                f"{shutdown} ({method}): the program still runs {MUST_HAPPEN}s after a Ctrl-C"
                f" in the forced phase (it printed {list(child.lines.queue)}); workers alive:"
                f" {alive}; stderr: {child.stderr()}"
            )
        assert status == 0, child.stderr()
        assert child.stdout() == ["interrupted"]
        assert [pid for pid in pids if not gone(pid)] == []


def test_maxtasksperchild_replaces_workers_and_shutdown_mp_pool_follows_them(
    tmp_path: Path,
) -> None:
    """A maxtasksperchild pool is no stop hazard: retired workers exit 0, replacements die.

    With ``maxtasksperchild=1`` each task runs in a new worker, so the worker that
    runs the stuck task is not one the pool started with. A worker that retired is
    not a death (nothing is lost), and the replacement running the stuck task is the
    one killed and reaped.
    """
    pool = safe_context().Pool(1, maxtasksperchild=1)
    pids = [pool.apply_async(os.getpid).get(MUST_HAPPEN) for _ in range(3)]
    assert len(set(pids)) == 3  # a new worker for each task
    path = tmp_path / "pid"
    stuck = pool.apply_async(process_tasks.mark_then_sleep, (str(path), 60))
    pid = started_pid(path)
    assert pid not in pids
    report = shutdown_mp_pool(pool, 0.2, force_timeout=MUST_HAPPEN, results={"stuck": stuck})
    assert report.terminated
    assert report.killed_pids == (pid,)
    assert report.lost == ("stuck",)
    assert all(gone(p) for p in (*pids, pid))


def test_shutdown_mp_pool_refuses_a_bad_budget_and_takes_inf() -> None:
    """Budgets follow the module's rule: NaN, negative, bool, str refused; inf, huge wait."""
    pool = safe_context().Pool(1)
    result = pool.apply_async(process_tasks.square, (5,))
    for name in ("timeout", "force_timeout"):
        for bad in (math.nan, -1.0, -math.inf, True, "1"):
            budgets: dict[str, Any] = {"timeout": 1.0, "force_timeout": 1.0, name: bad}
            with pytest.raises(ValueError, match=rf"^{name} must be a number of seconds"):
                shutdown_mp_pool(pool, **budgets)
    report = shutdown_mp_pool(pool, math.inf, force_timeout=10**400, results={"five": result})
    assert report == PoolShutdownReport(terminated=True, still_running=(), elapsed=report.elapsed)
    assert result.get(0) == 25
    assert shutdown_mp_pool(pool, 1e300, force_timeout=math.inf).terminated  # again: at once
