"""The process_shutdown pictures: M3 and M8 to M10, a child or a pool and how it ends.

M3: ``terminate()`` skips the child's cleanup. M8: leaving ``with Pool()`` kills the task
still running. M9: ``close()`` then ``join()`` waits as long as a stuck task. M10: a pool
worker SIGKILLed mid-task is replaced, and its result never comes. M11: ``terminate()``
waits for ever for a worker deaf to SIGTERM. M12: an idle worker killed holding the task
queue's lock starves its replacement.

Each child writes its steps as marks in a file (JSON lines) that the parent merges with
its own marks by time. M3's child is the race tests' `careful`, started with spawn as the
tests do; M8's pool starts its workers as the tests' pools do (`safe_context`).

Docs: docs/patterns/stoppable_process.md (M3), docs/patterns/process_shutdown.md (M8 to M12)
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import multiprocessing.pool
import os
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from patterns import process_shutdown, stoppable_process
from patterns.naive import process_shutdown as naive_process_shutdown
from patterns.naive import stoppable_process as naive_stoppable_process
from patterns.teaching import process_tasks
from patterns.teaching.lanes import Tracer
from patterns.teaching.scenarios.common import (
    LOOK,
    MUST_HAPPEN,
    Scenario,
    blocked_in,
    join_all,
    merged,
    start_thread,
    still_blocked,
)


def _m3_run(fixed: bool) -> Tracer:
    context = multiprocessing.get_context("spawn")
    marks: list[tuple[int, str, str, bool]] = []

    def mark(text: str, *, bad: bool = False) -> None:
        marks.append((time.perf_counter_ns(), "parent", text, bad))

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "marks")
        ready = context.Event()
        child = stoppable_process.StoppableProcess(
            process_tasks.careful_marked, (ready, str(path)), name="careful", context=context
        )
        mark("StoppableProcess(careful).start(), with spawn")
        child.start()
        try:
            if not ready.wait(MUST_HAPPEN):
                raise RuntimeError("scenario stuck: the M3 child never got ready")
            if fixed:
                mark("child.stop(): one byte down the stop pipe, then join")
                report = child.stop(MUST_HAPPEN)
                mark(
                    f"stop() returned: exit code {report.exitcode}, "
                    f"escalation {report.escalation or 'none'}"
                )
            else:
                process = child._process  # as the race test does: the naive call needs it
                assert process is not None
                mark("naive_stop_process(process): terminate(), then join()")
                naive_stoppable_process.naive_stop_process(process)
                exitcode = process.exitcode
        finally:
            child.stop(MUST_HAPPEN)
        lines = [json.loads(line) for line in path.read_text().splitlines()]
    seen = [str(line["text"]) for line in lines]
    if not fixed:
        if any(text.startswith(("finally", "atexit")) for text in seen):
            raise RuntimeError(f"M3: the terminated child cleaned up after all: {seen}")
        t_ns = time.perf_counter_ns()  # what the parent saw: the child ended in its wait
        ended = "ended by SIGTERM inside stop.wait(): no finally, no atexit"
        marks.append((t_ns, "careful", ended, True))
        mark(f"exit code {exitcode}, and nothing said so")
    marks += [(int(line["t"]), str(line["lane"]), str(line["text"]), False) for line in lines]
    title = "StoppableProcess.stop()" if fixed else "naive_stop_process"
    return merged(title, {"parent": "parent", "careful": "child process"}, marks)


M3 = Scenario.of(
    "M3",
    _m3_run,
    "terminate() ends the child where it waits: its finally and atexit never run, and "
    "the exit code is -15; asked through StoppableProcess.stop(), the child returns, "
    "cleans up and exits with 0.",
    "a process (the child writes its marks to a file, the parent merges them with its "
    "own: perf_counter is one clock for both)",
)


def _child_marks(path: Path) -> list[tuple[int, str, str, bool]]:
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [(int(line["t"]), "worker", str(line["text"]), False) for line in lines]


def _wait_for_mark(path: Path, text: str) -> None:
    deadline = time.monotonic() + MUST_HAPPEN
    while not (path.exists() and text in path.read_text()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"scenario stuck: no {text!r} mark from the pool's worker")
        time.sleep(0.001)  # polling the worker's file: the mark is the observation


def _m8_run(fixed: bool) -> Tracer:
    marks: list[tuple[int, str, str, bool]] = []

    def mark(text: str, *, bad: bool = False, lane: str = "parent") -> None:
        marks.append((time.perf_counter_ns(), lane, text, bad))

    with tempfile.TemporaryDirectory() as tmp:
        go, path = Path(tmp, "go"), Path(tmp, "marks")
        pool = stoppable_process.safe_context().Pool(1)
        try:
            task = process_tasks.item_with_cleanup_marked
            if fixed:
                mark("pool.apply_async(item), then try/finally: shutdown_mp_pool(pool)")
                result = pool.apply_async(task, (str(go), str(path)))
                _wait_for_mark(path, "starts")
                outcome: list[process_shutdown.PoolShutdownReport] = []

                def stop() -> None:
                    outcome.append(
                        process_shutdown.shutdown_mp_pool(
                            pool, MUST_HAPPEN, force_timeout=MUST_HAPPEN, results={"item": result}
                        )
                    )

                mark("shutdown_mp_pool(pool, timeout): close(), then wait for the task")
                stopper = start_thread("stopper", stop)
                blocked_in(stopper, "_wait_for_pool")
                mark("(the scenario lets the item finish)")
                go.touch()
                join_all(stopper)
                report = outcome[0]
                mark(f"returned: terminated={report.terminated}, lost={report.lost}")
                mark(f"result.get(): {result.get(0)!r}")
            else:
                mark("with pool: pool.apply_async(item), then the block's other work")

                def rest_of_block() -> None:
                    _wait_for_mark(path, "starts")
                    mark("the block ends: Pool.__exit__ calls terminate()")

                result = naive_process_shutdown.naive_apply_in_with(
                    pool, task, (str(go), str(path)), then=rest_of_block
                )
                go.touch()  # too late: the worker was killed when the block ended
                try:
                    result.get(LOOK)
                    raise RuntimeError("M8: the task returned after terminate()")
                except multiprocessing.TimeoutError:
                    pass
                t_ns = time.perf_counter_ns()
                seen = _child_marks(path)
                if any("finally" in text for _, _, text, _ in seen):
                    raise RuntimeError("M8: the killed task cleaned up after all")
                marks.append(
                    (t_ns, "worker", "killed by SIGTERM mid-item: no result, no finally", True)
                )
                mark(f"result.get({LOOK}): nothing, ever; no error says why")
        finally:
            process_shutdown.shutdown_mp_pool(pool, 0, force_timeout=MUST_HAPPEN)
        marks += _child_marks(path)
    title = "shutdown_mp_pool" if fixed else "naive_apply_in_with (with Pool())"
    return merged(title, {"parent": "parent", "worker": "pool worker"}, marks)


M8 = Scenario.of(
    "M8",
    _m8_run,
    "Leaving with Pool() calls terminate(): the task still running is killed, with no result "
    "and no finally; shutdown_mp_pool closes the pool and waits, so the task returns and "
    "cleans up.",
    "a process (the pool's worker writes its marks to a file, the parent merges them with its "
    "own: perf_counter is one clock for both)",
)


def _pool_pids(pool: multiprocessing.pool.Pool) -> set[int]:
    """The pids of the workers the pool holds now (its private list, as the tests read it)."""
    return {p.pid for p in list(pool._pool) if p.is_alive() and p.pid}  # type: ignore[attr-defined]


def _wait_for_replacement(pool: multiprocessing.pool.Pool, pid: int) -> None:
    """Return once the pool holds a worker again, and not ``pid``."""
    deadline = time.monotonic() + MUST_HAPPEN
    while not (pids := _pool_pids(pool)) or pid in pids:
        if time.monotonic() > deadline:
            raise RuntimeError("scenario stuck: the pool never replaced its worker")
        time.sleep(0.001)  # polling the pool's list: the replacement is the observation


# M9's budget for shutdown_mp_pool: short, so the picture's run stays short.
_M9_TIMEOUT = 0.2


def _m9_run(fixed: bool) -> Tracer:
    marks: list[tuple[int, str, str, bool]] = []

    def mark(text: str, *, bad: bool = False, lane: str = "parent") -> None:
        marks.append((time.perf_counter_ns(), lane, text, bad))

    with tempfile.TemporaryDirectory() as tmp:
        go, path = Path(tmp, "go"), Path(tmp, "marks")
        pool = stoppable_process.safe_context().Pool(1)
        try:
            mark("pool.apply_async(item): an item that never ends on its own")
            result = pool.apply_async(process_tasks.item_with_cleanup_marked, (str(go), str(path)))
            _wait_for_mark(path, "starts")
            if fixed:
                mark(f"shutdown_mp_pool(pool, timeout={_M9_TIMEOUT}): close(), wait, terminate()")
                start = time.monotonic()
                report = process_shutdown.shutdown_mp_pool(
                    pool, _M9_TIMEOUT, force_timeout=MUST_HAPPEN, results={"item": result}
                )
                took = time.monotonic() - start
                if not (report.terminated and report.forced) or took > _M9_TIMEOUT + MUST_HAPPEN:
                    raise RuntimeError(f"M9: shutdown_mp_pool did the unexpected: {report}")
                marks.append(
                    (
                        time.perf_counter_ns(),
                        "worker",
                        "ended by terminate(): the item given up",
                        False,
                    )
                )
                mark(f"returned on its deadline: forced={report.forced}, lost={report.lost}")
            else:
                mark("naive_close_pool(pool): close(), then join(), no timeout")
                joiner = start_thread(
                    "joiner", lambda: naive_process_shutdown.naive_close_pool(pool)
                )
                blocked_in(joiner, "join")
                if not still_blocked(joiner):
                    raise RuntimeError("M9: join() returned while the item still ran")
                mark(
                    f"join() still blocked after {LOOK} s: it waits as long as the item does",
                    bad=True,
                )
                mark("(the scenario lets the item finish, or join() would wait for ever)")
                go.touch()
                join_all(joiner)
                mark(f"join() returned only now; result.get(): {result.get(0)!r}")
        finally:
            process_shutdown.shutdown_mp_pool(pool, 0, force_timeout=MUST_HAPPEN)
        marks += _child_marks(path)
    title = "shutdown_mp_pool" if fixed else "naive_close_pool (close(), join())"
    return merged(title, {"parent": "parent", "worker": "pool worker"}, marks)


M9 = Scenario.of(
    "M9",
    _m9_run,
    "close() then join() has no timeout: the caller waits as long as the stuck item does; "
    "shutdown_mp_pool waits up to its timeout, then terminates the pool and names the "
    "item lost.",
    "a process (the pool's worker writes its marks to a file, the parent merges them with its "
    "own: perf_counter is one clock for both)",
)


def _m10_run(fixed: bool) -> Tracer:
    marks: list[tuple[int, str, str, bool]] = []

    def mark(text: str, *, bad: bool = False, lane: str = "parent") -> None:
        marks.append((time.perf_counter_ns(), lane, text, bad))

    with tempfile.TemporaryDirectory() as tmp:
        go, path = Path(tmp, "go"), Path(tmp, "marks")  # go is never touched: a long item
        pool = stoppable_process.safe_context().Pool(1)
        task = functools.partial(process_tasks.item_with_cleanup_marked, str(go))
        killed: list[int] = []

        def kill_the_worker() -> None:
            _wait_for_mark(path, "starts")
            (pid,) = _pool_pids(pool)
            mark("os.kill(worker, SIGKILL), as the OOM killer would")
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

        try:
            if fixed:
                mark("pool.map_async(item), then shutdown_mp_pool(pool, timeout=60)")
                result = pool.map_async(task, [str(path)], chunksize=1)
                outcome: list[process_shutdown.PoolShutdownReport] = []

                def stop() -> None:
                    outcome.append(
                        process_shutdown.shutdown_mp_pool(
                            pool, 60, force_timeout=MUST_HAPPEN, results={"map": result}
                        )
                    )

                _wait_for_mark(path, "starts")
                stopper = start_thread("stopper", stop)
                blocked_in(stopper, "_wait_for_pool")
                kill_the_worker()
                join_all(stopper)
                report = outcome[0]
                if report.lost != ("map",):
                    raise RuntimeError(f"M10: shutdown_mp_pool did the unexpected: {report}")
                mark(f"returned at once, not after 60 s: the worker died, lost={report.lost}")
            else:
                mark(f"naive_map(pool, item): map_async(...).get(), watched for {LOOK} s")
                try:
                    naive_process_shutdown.naive_map(pool, task, [str(path)], kill_the_worker, LOOK)
                    raise RuntimeError("M10: map() returned a killed worker's result")
                except multiprocessing.TimeoutError:
                    pass
                _wait_for_replacement(pool, killed[0])
                mark("the pool started a new worker in its place, and said nothing")
                mark(
                    "map() has no result and no error: without a timeout it waits for ever",
                    bad=True,
                )
        finally:
            process_shutdown.shutdown_mp_pool(pool, 0, force_timeout=MUST_HAPPEN)
        t_ns = next(t for t, _, text, _ in marks if text.startswith("os.kill"))
        if any("finally" in text for _, _, text, _ in _child_marks(path)):
            raise RuntimeError("M10: the SIGKILLed item cleaned up after all")
        marks.append((t_ns + 1, "worker", "killed mid-item: no result, no finally", False))
        marks += _child_marks(path)
    title = "shutdown_mp_pool" if fixed else "naive_map (Pool.map)"
    return merged(title, {"parent": "parent", "worker": "pool worker"}, marks)


M10 = Scenario.of(
    "M10",
    _m10_run,
    "A worker SIGKILLed mid-item: the pool replaces it, raises nothing, and map() waits for a "
    "result that never comes; shutdown_mp_pool sees the death, stops waiting at once and "
    "names the result lost.",
    "a process (the pool's worker writes its marks to a file, the parent merges them with its "
    "own: perf_counter is one clock for both)",
)


# M11's budgets for shutdown_mp_pool: SIGKILL comes half-way through force_timeout.
_M11_TIMEOUT, _M11_FORCE = 0.1, 0.6


def _m11_run(fixed: bool) -> Tracer:
    marks: list[tuple[int, str, str, bool]] = []

    def mark(text: str, *, bad: bool = False, lane: str = "parent") -> None:
        marks.append((time.perf_counter_ns(), lane, text, bad))

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "marks")
        pool = stoppable_process.safe_context().Pool(1)
        task = process_tasks.deaf_item_marked
        try:
            if fixed:
                mark("pool.apply_async(item), then shutdown_mp_pool(pool, timeout=0.1)")
                result = pool.apply_async(task, (str(path),))
                _wait_for_mark(path, "starts")
                report = process_shutdown.shutdown_mp_pool(
                    pool, _M11_TIMEOUT, force_timeout=_M11_FORCE, results={"item": result}
                )
                if not report.terminated or report.lost != ("item",):
                    raise RuntimeError(f"M11: shutdown_mp_pool did the unexpected: {report}")
                _wait_for_mark(path, "SIGTERM")  # it came before the SIGKILL, or never
                marks.append(
                    (
                        time.perf_counter_ns(),
                        "worker",
                        "killed by SIGKILL, half-way through force_timeout",
                        False,
                    )
                )
                mark(f"returned within its budget: worker killed and reaped, lost={report.lost}")
            else:
                mark("with pool: pool.apply_async(item), then the block ends")
                block = start_thread(
                    "with-block",
                    lambda: naive_process_shutdown.naive_apply_in_with(
                        pool, task, (str(path),), then=lambda: _wait_for_mark(path, "starts")
                    ),
                )
                blocked_in(block, "_terminate_pool")
                _wait_for_mark(path, "SIGTERM")
                if not still_blocked(block):
                    raise RuntimeError("M11: terminate() returned while its worker lived")
                mark(
                    f"terminate() still waiting {LOOK} s later: it joins the worker, no timeout",
                    bad=True,
                )
                (pid,) = _pool_pids(pool)
                mark("(the scenario SIGKILLs the worker; the naive code never would)")
                os.kill(pid, signal.SIGKILL)
                marks.append((time.perf_counter_ns(), "worker", "killed by the scenario", False))
                join_all(block)
                mark("terminate() returned only now: the block is left")
        finally:
            process_shutdown.shutdown_mp_pool(pool, 0, force_timeout=MUST_HAPPEN)
        marks += _child_marks(path)
    title = "shutdown_mp_pool" if fixed else "naive_apply_in_with (with Pool())"
    return merged(title, {"parent": "parent", "worker": "pool worker"}, marks)


M11 = Scenario.of(
    "M11",
    _m11_run,
    "terminate() sends SIGTERM, then joins each worker with no timeout: a worker deaf to "
    "SIGTERM holds the end of the with block for ever; shutdown_mp_pool sends SIGKILL "
    "half-way through force_timeout and returns within its budget.",
    "a process (the pool's worker writes its marks to a file, the parent merges them with its "
    "own: perf_counter is one clock for both)",
)


def _m12_marks(path: Path) -> list[tuple[int, str, str, bool]]:
    """The workers' marks, the first worker's lane "worker" and the next one's "replacement"."""
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    names = list(dict.fromkeys(str(line["lane"]) for line in lines))
    lane = dict(zip(names, ["worker", "replacement"], strict=False))
    return [(int(line["t"]), lane[str(line["lane"])], str(line["text"]), False) for line in lines]


def _m12_kill_the_idle_worker(
    pool: multiprocessing.pool.Pool, path: Path, mark: Callable[..., None]
) -> None:
    """Kill the pool's one worker while it waits for a task, inside the task queue's lock.

    As the race tests' ``idle_worker_killed_holding_the_lock``; returns once the
    replacement has started.
    """
    pid = pool.apply_async(os.getpid).get(MUST_HAPPEN)
    lock = pool._inqueue._rlock  # type: ignore[attr-defined]
    deadline = time.monotonic() + MUST_HAPPEN
    while lock._semlock._get_value() != 0:  # the idle worker is back inside the lock
        if time.monotonic() > deadline:
            raise RuntimeError("scenario stuck: the idle worker never took the lock")
        time.sleep(0.001)  # polling the lock's value: the observation
    mark("idle: waits for a task inside the queue's lock", lane="worker")
    mark("os.kill(worker, SIGKILL) while it is idle, as the OOM killer would")
    os.kill(pid, signal.SIGKILL)
    mark("killed, the lock still held", lane="worker")
    _wait_for_replacement(pool, pid)
    deadline = time.monotonic() + MUST_HAPPEN
    while len(_m12_marks(path)) < 2:  # the replacement's own mark
        if time.monotonic() > deadline:
            raise RuntimeError("scenario stuck: no mark from the replacement worker")
        time.sleep(0.001)  # polling the workers' file: the mark is the observation
    mark("waits for the lock; the dead worker holds it", lane="replacement")


# M12's budgets for shutdown_mp_pool (terminate() itself waits for the lock: the workers are
# killed half-way through force_timeout).
_M12_TIMEOUT, _M12_FORCE = 0.2, 0.6


def _m12_run(fixed: bool) -> Tracer:
    marks: list[tuple[int, str, str, bool]] = []

    def mark(text: str, *, bad: bool = False, lane: str = "parent") -> None:
        marks.append((time.perf_counter_ns(), lane, text, bad))

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "marks")
        started = "starts (the pool's initializer)"
        mark("Pool(1): one worker, which marks its start")
        pool = stoppable_process.safe_context().Pool(
            1, initializer=process_tasks.mark, initargs=(str(path), started)
        )
        try:
            _m12_kill_the_idle_worker(pool, path, mark)
            lock = pool._inqueue._rlock  # type: ignore[attr-defined]
            if fixed:
                mark(f"shutdown_mp_pool(pool, timeout={_M12_TIMEOUT}): no task is pending")
                report = process_shutdown.shutdown_mp_pool(
                    pool, _M12_TIMEOUT, force_timeout=_M12_FORCE
                )
                if not report.terminated:
                    raise RuntimeError(f"M12: shutdown_mp_pool did the unexpected: {report}")
                mark("killed and reaped", lane="replacement")
                mark("returned: every worker reaped, the dead one's lock freed, terminated=True")
            else:
                mark("naive_close_pool(pool): close(), then join(); no task is pending")
                joiner = start_thread(
                    "joiner", lambda: naive_process_shutdown.naive_close_pool(pool)
                )
                blocked_in(joiner, "join")
                if not still_blocked(joiner):
                    raise RuntimeError("M12: join() returned with the lock still held")
                mark(
                    f"join() still blocked {LOOK} s later: the replacement never gets the lock",
                    bad=True,
                )
                mark("(the scenario frees the lock; the naive code never would)")
                lock.release()
                join_all(joiner)
                mark("join() returned only now")
        finally:
            process_shutdown.shutdown_mp_pool(pool, 0, force_timeout=MUST_HAPPEN)
        marks += _m12_marks(path)
    title = "shutdown_mp_pool" if fixed else "naive_close_pool (close(), join())"
    lanes = {"parent": "parent", "worker": "pool worker", "replacement": "its replacement"}
    return merged(title, lanes, marks)


M12 = Scenario.of(
    "M12",
    _m12_run,
    "A worker killed while idle keeps the task queue's lock: its replacement waits for it for "
    "ever, and so does join(), with no task pending; shutdown_mp_pool reaps every worker, "
    "frees the dead one's lock, and the pool ends.",
    "a process (the pool's workers write their marks to a file, the parent merges them with "
    "its own: perf_counter is one clock for both)",
)
