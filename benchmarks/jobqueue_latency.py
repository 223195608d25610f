"""Job queue latencies next to the peers: wake-up, idle CPU, stop, stop accuracy (tables 3-5).

Run it with ``python -m benchmarks.jobqueue_latency`` (``--help`` for the knobs). huey
is the peer where it has the same operation; without it installed its rows are left
out. Every latency is taken with `time.monotonic` (one clock for every process on the
machine), in milliseconds; each cell is the median [min-max] over the runs.

3. Wake-up, enqueue -> handler start. In-process: ``Worker.enqueue`` on an idle worker
   (``poll_interval`` 1 s, the default; the enqueue wakes it). From another process: a
   producer process enqueues into the same SQLite file; the worker (``--poll``, 0.1 s)
   finds the job at its next poll without the store's watcher (``watch_interval=0``),
   and at the watcher's next look with it (``--watch``, 15 ms, the default: it reads
   ``PRAGMA data_version``, which another connection's commit changes); huey's consumer
   (4 threads, its defaults: ``initial_delay`` 0.1 s, backoff 1.15, ``max_delay`` 10 s)
   always polls. Before each sample the producer pauses a random time up to the poll
   interval, so samples land anywhere in the poll cycle; a poll-bound p50 is about half
   the interval (a watcher-bound one, half the watch interval, plus the claim). Each run
   gives a p50 and a p99 (of ``--samples`` samples; below 100 samples the p99 is the
   largest).
3b. Idle CPU. A child process starts a ``Worker`` (4 threads, poll 1 s) on an empty
   SQLite store, without and with the watcher, lets it settle 0.5 s, then measures its
   CPU time (``resource.getrusage``, user + system, every thread) over ``--idle-seconds``
   of wall time; the rows of one run idle at the same time, in separate processes.
   Then spurious wake-ups: a worker (4 threads) drains ``--drain-jobs`` jobs enqueued
   beforehand, and the table counts the calls its store's watcher made to a subscriber,
   next to the changes of ``PRAGMA data_version`` that a bare connection, read at the
   same interval, saw meanwhile (what a watcher that woke on every change would do).
4. Stop latency. In-process: ``stop()`` of an idle, started worker; huey's
   ``Consumer.stop(graceful=True)``; a bare ``ThreadPoolExecutor(4)`` with four idle
   threads, ``shutdown(wait=True)``. Across processes: SIGTERM -> process exit for an
   idle ``python -m patterns.jobqueue worker`` (the CLI, default poll 1 s), huey's
   consumer (4 threads) and a bare Python process waiting on an `threading.Event` that
   its SIGTERM handler sets. Each child prints a ready marker once its signal handlers
   are in place; the parent waits 0.3 s more (idle), then times from ``os.kill`` to
   the end of ``waitpid``.
5. Stop accuracy. One job ignores its token (it waits on an event only the benchmark
   sets); ``stop(budget)`` is timed and the table gives how long after the budget it
   returned, next to huey's ``Consumer.stop(graceful=True)`` with
   ``shutdown_timeout=budget``. The job is released afterwards and every thread joined.

This is a measurement to read, not a test: nothing here asserts on a time.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import logging
import math
import os
import random
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks._tables import (
    ROOT,
    child_env,
    child_result,
    emit,
    end_line,
    env_float,
    env_int,
    join_threads,
    machine_line,
    percentile,
    render,
    run_child,
    runs_setting,
    scratch_dir,
    target,
)

MODULE = "jobqueue_latency"
READY = "READY"  # the marker a child prints once it can be signalled
SETTLE = 0.3  # seconds a signalled child is left idle after its marker
EXIT_TIMEOUT = 15.0  # seconds a signalled child may take to exit before it is killed
SAMPLE_TIMEOUT = 15.0  # seconds one wake-up sample may take


def have(module: str) -> bool:
    """Whether ``module`` can be imported (a peer of the ``bench`` extra)."""
    import importlib.util  # noqa: PLC0415

    return importlib.util.find_spec(module) is not None


def spread(values: Sequence[float], digits: int = 1) -> str:
    """``median [min-max]`` of ``values``."""
    import statistics  # noqa: PLC0415

    if not values:
        return "-"
    return (
        f"{statistics.median(values):.{digits}f} "
        f"[{min(values):.{digits}f}-{max(values):.{digits}f}]"
    )


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (NaN when empty)."""
    import statistics  # noqa: PLC0415

    return statistics.median(values) if values else float("nan")


def ratio(value: float, reference: float) -> str:
    """``value / reference`` to two decimals, or "-"."""
    if math.isnan(reference) or math.isnan(value) or reference == 0:
        return "-"
    return f"{value / reference:.2f}"


@contextmanager
def saved_signal_handlers() -> Iterator[None]:
    """Put SIGINT, SIGTERM and SIGHUP handlers back as they were (huey's consumer sets them)."""
    names = [s for s in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, s)]
    saved = {name: signal.getsignal(getattr(signal, name)) for name in names}
    try:
        yield
    finally:
        for name, handler in saved.items():
            signal.signal(getattr(signal, name), handler)


def quiet_logs() -> None:
    """Silence the queues' loggers: the overruns measured here are expected, and logged."""
    for name in ("huey", "patterns"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


# --- 3. wake-up latency ----------------------------------------------------------------------


class Stamps:
    """Latencies recorded by handlers: monotonic now minus the enqueue time in the payload."""

    def __init__(self) -> None:
        # Guards latencies; taken by a handler thread when it records a sample.
        self._lock = threading.Lock()
        self.latencies: list[float] = []
        # Set by a handler after it recorded a sample; cleared and waited on by the sampler.
        self.arrived = threading.Event()

    def record(self, sent: float) -> None:
        """Record one sample whose job was enqueued at monotonic time ``sent``."""
        now = time.monotonic()
        with self._lock:
            self.latencies.append(now - sent)
        self.arrived.set()


def project_worker(
    path: Path, stamps: Stamps, poll: float, watch: float | None = None
) -> tuple[Any, Any]:
    """A started ``Worker`` (4 threads) on ``path`` whose ``stamp`` task records latencies.

    ``watch`` is the store's ``watch_interval`` (None: the store's default).
    """
    from patterns.jobqueue import SQLiteStore, TaskRegistry, Worker  # noqa: PLC0415

    tasks = TaskRegistry()
    tasks.task(name="stamp")(lambda payload, ctx: stamps.record(payload["sent"]))
    store = SQLiteStore(path) if watch is None else SQLiteStore(path, watch_interval=watch)
    worker = Worker(store, tasks, concurrency=4, poll_interval=poll)
    worker.start()
    return store, worker


def wake_in_process(path: Path, samples: int) -> list[float]:
    """Latencies of ``Worker.enqueue`` to handler start on an idle worker (poll 1 s)."""
    stamps = Stamps()
    store, worker = project_worker(path, stamps, 1.0)
    try:
        time.sleep(0.05)  # let the claiming thread reach its idle wait
        for _ in range(samples):
            time.sleep(random.uniform(0.002, 0.01))  # idle again, off any rhythm
            stamps.arrived.clear()
            worker.enqueue("stamp", {"sent": time.monotonic()})
            if not stamps.arrived.wait(SAMPLE_TIMEOUT):
                raise TimeoutError("in-process wake-up: the job never started")
    finally:
        worker.stop(5.0)
        store.close()
    return stamps.latencies


@contextmanager
def producer(kind: str, path: Path) -> Iterator[Callable[[], None]]:
    """A producer process: each call of the yielded function enqueues one stamped job.

    ``kind`` is ``project`` (an ``SQLiteStore``) or ``huey``; the child is killed on the
    way out if it has not ended by itself.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", f"benchmarks.{MODULE}", "--child", "producer", kind, str(path)],
        cwd=ROOT,
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    def send() -> None:
        stdin.write("go\n")
        stdin.flush()

    try:
        if stdout.readline().strip() != READY:
            raise RuntimeError(f"{kind} producer did not start")
        yield send
    finally:
        stdin.close()
        try:
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def sample_remote(send: Callable[[], None], stamps: Stamps, samples: int, poll: float) -> None:
    """Ask the producer for ``samples`` jobs, one at a time, a random pause before each."""
    for _ in range(samples):
        time.sleep(random.uniform(0, poll))  # land anywhere in the poll cycle
        stamps.arrived.clear()
        send()
        if not stamps.arrived.wait(SAMPLE_TIMEOUT):
            raise TimeoutError("cross-process wake-up: the job never started")


def wake_cross_process(path: Path, samples: int, poll: float, watch: float) -> list[float]:
    """Latencies of an enqueue by another process to handler start (watcher off if 0)."""
    stamps = Stamps()
    store, worker = project_worker(path, stamps, poll, watch)
    try:
        with producer("project", path) as send:
            sample_remote(send, stamps, samples, poll)
    finally:
        worker.stop(5.0)
        store.close()
    return stamps.latencies


def make_huey(path: Path, stamps: Stamps | None = None) -> tuple[Any, Any]:
    """A ``SqliteHuey`` on ``path`` and its ``stamp`` task (recording into ``stamps``)."""
    from huey import SqliteHuey  # noqa: PLC0415

    huey = SqliteHuey("bench", filename=str(path))

    def stamp(sent: float) -> None:
        if stamps is not None:
            stamps.record(sent)

    return huey, huey.task(name="stamp")(stamp)


def wake_huey(path: Path, samples: int, poll: float) -> list[float]:
    """Latencies of an enqueue by another process to task start in huey's consumer."""
    stamps = Stamps()
    huey, _ = make_huey(path, stamps)
    with saved_signal_handlers():
        consumer = huey.create_consumer(workers=4, worker_type="thread")
        consumer.start()
        try:
            with producer("huey", path) as send:
                sample_remote(send, stamps, samples, poll)
        finally:
            consumer.stop(graceful=True)
            join_threads([t for _, t in consumer.worker_threads], 10.0)
    huey.storage.close()
    return stamps.latencies


def child_producer(kind: str, path: str) -> int:
    """``--child producer KIND PATH``: enqueue one stamped job per line read from stdin."""
    if kind == "project":
        from patterns.jobqueue import SQLiteStore  # noqa: PLC0415

        store = SQLiteStore(path)

        def enqueue() -> None:
            store.enqueue("stamp", {"sent": time.monotonic()})
    else:
        _, stamp = make_huey(Path(path))

        def enqueue() -> None:
            stamp(time.monotonic())

    print(READY, flush=True)  # noqa: T201 - the parent's protocol
    for _ in sys.stdin:
        enqueue()
    return 0


def remote_label(poll: float, watch: float) -> str:
    """The label of a cross-process wake-up row of ours."""
    how = f"watcher every {watch * 1000:g} ms" if watch else "no watcher"
    return f"SQLiteStore.enqueue, other process (poll {poll:g} s, {how})"


def measure_wake(
    runs: int, samples: int, remote_samples: int, poll: float, watch: float
) -> dict[str, Any]:
    """Per-run p50 and p99 latencies (ms) for each wake-up row."""
    rows: dict[str, tuple[Callable[[Path], list[float]], bool]] = {
        "Worker.enqueue, same process": (lambda p: wake_in_process(p, samples), True),
        remote_label(poll, 0): (lambda p: wake_cross_process(p, remote_samples, poll, 0), True),
        remote_label(poll, watch): (
            lambda p: wake_cross_process(p, remote_samples, poll, watch),
            watch > 0,
        ),
        "huey, other process (polls from 0.1 s)": (
            lambda p: wake_huey(p, remote_samples, poll),
            have("huey"),
        ),
    }
    results: dict[str, dict[str, list[float]]] = {}
    with scratch_dir("bench-wake-") as tmp:
        for run in range(runs):
            for index, (label, (fn, available)) in enumerate(rows.items()):
                if not available:
                    continue
                latencies = [x * 1000 for x in fn(tmp / f"wake-{run}-{index}.db")]
                cell = results.setdefault(label, {"p50": [], "p99": []})
                cell["p50"].append(percentile(latencies, 50))
                cell["p99"].append(percentile(latencies, 99))
    return results


def wake_report(
    results: dict[str, dict[str, list[float]]],
    samples: int,
    remote: int,
    poll: float,
    watch: float,
) -> list[str]:
    """Table 3 and its target."""
    huey = results.get("huey, other process (polls from 0.1 s)")
    reference = median(huey["p50"]) if huey else float("nan")
    rows = [
        (label, spread(r["p50"], 2), spread(r["p99"], 2), ratio(median(r["p50"]), reference))
        for label, r in results.items()
    ]
    lines = [
        (
            f"3. Wake-up latency, enqueue -> handler start, ms: {samples} samples per run in "
            f"process, {remote} across processes; the worker's poll interval across processes "
            f"is {poll:g} s; ratio = p50 / huey's p50"
        ),
        *render(("", "p50", "p99", "ratio"), rows),
    ]
    ours = results["Worker.enqueue, same process"]["p50"]
    lines.append(target("in-process wake-up p50 < 2 ms", median(ours) < 2, f"{median(ours):.2f}"))
    watched = results.get(remote_label(poll, watch))
    if watched is not None:
        p50 = median(watched["p50"])
        lines.append(target("cross-process wake-up p50 < 10 ms", p50 < 10, f"{p50:.2f}"))
    return lines


# --- 3b. idle CPU ----------------------------------------------------------------------------

IDLE_POLL = 1.0  # the idle worker's poll interval: Worker's default
IDLE_SETTLE = 0.5  # seconds an idle child runs before its CPU time is measured


def idle_label(watch: float) -> str:
    """The label of an idle-CPU row."""
    how = f"watcher every {watch * 1000:g} ms" if watch else "no watcher"
    return f"idle Worker, SQLite, poll {IDLE_POLL:g} s, {how}"


def child_idle(path: str, watch: str, seconds: str) -> int:
    """``--child idle PATH WATCH SECONDS``: an idle worker's CPU share over SECONDS."""
    from patterns.jobqueue import SQLiteStore, TaskRegistry, Worker  # noqa: PLC0415

    store = SQLiteStore(path, watch_interval=float(watch))
    worker = Worker(store, TaskRegistry(), concurrency=4, poll_interval=IDLE_POLL).start()
    try:
        time.sleep(IDLE_SETTLE)
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        time.sleep(float(seconds))
        after, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - start
    finally:
        worker.stop(5.0)
        store.close()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    child_result({"cpu": cpu / wall})
    return 0


def measure_idle(runs: int, seconds: float, watches: Sequence[float]) -> dict[str, list[float]]:
    """Per-run CPU share (% of one core) of an idle worker, per watch interval."""
    results: dict[str, list[float]] = {idle_label(w): [] for w in watches}
    with scratch_dir("bench-idle-") as tmp, ThreadPoolExecutor(len(watches)) as pool:
        for run in range(runs):
            futures = {
                idle_label(w): pool.submit(
                    run_child,
                    MODULE,
                    ["idle", str(tmp / f"idle-{run}-{i}.db"), str(w), str(seconds)],
                )
                for i, w in enumerate(watches)
            }
            for label, future in futures.items():
                results[label].append(future.result()["cpu"] * 100)
    return results


def drain_wakes(path: Path, jobs: int, watch: float) -> tuple[float, float]:
    """Subscriber calls during a drain of ``jobs`` jobs, and changes a bare watcher saw."""
    import sqlite3  # noqa: PLC0415

    from patterns.jobqueue import SQLiteStore, TaskRegistry, Worker  # noqa: PLC0415

    finished = threading.Event()  # set by the handler that runs the last job
    ran = [0]  # jobs run so far; guarded by ran_lock
    ran_lock = threading.Lock()
    tasks = TaskRegistry()

    @tasks.task(name="t")
    def count(payload: object, ctx: object) -> None:
        with ran_lock:
            ran[0] += 1
            if ran[0] == jobs:
                finished.set()

    producer_store = SQLiteStore(path, watch_interval=0)
    producer_store.enqueue_many([{"task": "t"}] * jobs)
    producer_store.close()
    store = SQLiteStore(path, watch_interval=watch)
    calls = [0]  # incremented by the watcher thread only
    bare = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    changes = [0]  # incremented by the bare watcher thread only
    stop = threading.Event()  # set once the drain is over; the bare watcher waits on it

    def look() -> None:
        last = bare.execute("PRAGMA data_version").fetchone()[0]
        while not stop.wait(watch):
            now = bare.execute("PRAGMA data_version").fetchone()[0]
            changes[0] += now != last
            last = now

    def counted() -> None:
        calls[0] += 1

    looker = threading.Thread(target=look, name="bare-watcher")
    looker.start()
    unsubscribe = store.subscribe(counted)
    try:
        with Worker(store, tasks, concurrency=4):
            if not finished.wait(SAMPLE_TIMEOUT * 4):
                raise TimeoutError("the drain did not finish")
    finally:
        unsubscribe()
        stop.set()
        join_threads([looker], 10.0)
        bare.close()
        store.close()
    return calls[0], changes[0]


def measure_drain_wakes(runs: int, jobs: int, watch: float) -> dict[str, list[float]]:
    """Per run: subscriber calls and bare-watcher changes during a drain."""
    results: dict[str, list[float]] = {"calls": [], "changes": []}
    with scratch_dir("bench-drain-wakes-") as tmp:
        for run in range(runs):
            calls, changes = drain_wakes(tmp / f"drain-{run}.db", jobs, watch)
            results["calls"].append(calls)
            results["changes"].append(changes)
    return results


def drain_wakes_report(results: dict[str, list[float]], jobs: int, watch: float) -> list[str]:
    """The spurious wake-up rows under table 3b."""
    rows = [
        ("subscriber calls by the store's watcher", spread(results["calls"], 0)),
        ("data_version changes a bare watcher saw", spread(results["changes"], 0)),
    ]
    return [
        (
            f"3c. Wake-ups during a drain of {jobs:,} jobs by one worker (4 threads), "
            f"looks every {watch * 1000:g} ms ({len(results['calls'])} runs)"
        ),
        *render(("", "count"), rows),
    ]


def idle_report(results: dict[str, list[float]], seconds: float, watch: float) -> list[str]:
    """Table 3b and its target."""
    rows = [(label, spread(v, 2)) for label, v in results.items()]
    lines = [
        (
            f"3b. Idle CPU, % of one core, over {seconds:g} s of idle wall time per run "
            f"({len(next(iter(results.values())))} runs; the rows of a run idle side by side)"
        ),
        *render(("", "CPU %"), rows),
    ]
    ours = results.get(idle_label(watch))
    if ours is not None:
        lines.append(
            target("idle worker CPU < 1 % of a core", median(ours) < 1, f"{median(ours):.2f} %")
        )
    return lines


# --- 4. stop latency ---------------------------------------------------------------------


def stop_executor(_: Path) -> float:
    """Seconds for ``shutdown(wait=True)`` of a ``ThreadPoolExecutor`` with 4 idle threads."""
    pool = ThreadPoolExecutor(max_workers=4)
    barrier = threading.Barrier(4)  # all four threads exist before the pool goes idle
    started = [pool.submit(barrier.wait, 5.0) for _ in range(4)]
    concurrent.futures.wait(started, 10.0)
    time.sleep(0.02)
    start = time.monotonic()
    pool.shutdown(wait=True)
    return time.monotonic() - start


def stop_huey(path: Path) -> float:
    """Seconds for ``Consumer.stop(graceful=True)`` of an idle huey consumer (4 threads)."""
    huey, _ = make_huey(path)
    with saved_signal_handlers():
        consumer = huey.create_consumer(workers=4, worker_type="thread")
        consumer.start()
        time.sleep(0.02)
        start = time.monotonic()
        consumer.stop(graceful=True)
        seconds = time.monotonic() - start
    join_threads([t for _, t in consumer.worker_threads], 10.0)
    huey.storage.close()
    return seconds


def stop_worker(path: Path) -> float:
    """Seconds for ``Worker.stop()`` of an idle, started worker (4 threads)."""
    from patterns.jobqueue import SQLiteStore, TaskRegistry, Worker  # noqa: PLC0415

    store = SQLiteStore(path)
    worker = Worker(store, TaskRegistry(), concurrency=4).start()
    time.sleep(0.02)  # the claiming thread is in its idle wait
    start = time.monotonic()
    report = worker.stop()
    seconds = time.monotonic() - start
    store.close()
    if not report.terminated:
        raise RuntimeError(f"idle stop did not finish: {report.summary()}")
    return seconds


def measure_stop(samples: int) -> dict[str, list[float]]:
    """Stop latencies (ms) per row, ``samples`` each, rows interleaved."""
    rows: dict[str, Callable[[Path], float]] = {"ThreadPoolExecutor(4).shutdown": stop_executor}
    if have("huey"):
        rows["huey Consumer.stop(graceful=True)"] = stop_huey
    rows["Worker.stop()"] = stop_worker
    results: dict[str, list[float]] = {label: [] for label in rows}
    with scratch_dir("bench-stop-") as tmp:
        for run in range(samples):
            for index, (label, fn) in enumerate(rows.items()):
                results[label].append(fn(tmp / f"stop-{run}-{index}.db") * 1000)
    return results


BARE_CHILD = f"""
import signal, threading
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
print({READY!r}, flush=True)
stop.wait({EXIT_TIMEOUT})
"""


def signal_command(kind: str, path: Path) -> tuple[list[str], str]:
    """The command of a signalled child, and whether its marker comes on stdout or stderr."""
    if kind == "bare":
        return [sys.executable, "-c", BARE_CHILD], "stdout"
    if kind == "cli":
        tasks = "patterns.jobqueue.cli.demo_tasks:tasks"
        command = [sys.executable, "-m", "patterns.jobqueue", "--db", str(path)]
        return [*command, "worker", "--tasks", tasks], "stderr"
    command = [sys.executable, "-m", f"benchmarks.{MODULE}", "--child", "consumer", str(path)]
    return command, "stdout"


def sigterm_to_exit(kind: str, path: Path) -> tuple[float, int]:
    """Seconds from SIGTERM to exit of an idle ``kind`` child, and its exit status."""
    command, stream = signal_command(kind, path)
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Kills the child if anything below hangs; cancelled once it has exited.
    watchdog = threading.Timer(EXIT_TIMEOUT + 15, proc.kill)
    watchdog.start()
    try:
        out = proc.stdout if stream == "stdout" else proc.stderr
        assert out is not None
        for line in out:
            # The CLI logs NEW -> RUNNING after it installed its signal handlers.
            if line.strip() == READY or (kind == "cli" and "-> RUNNING" in line):
                break
        else:
            raise RuntimeError(f"{kind} child exited before its ready marker")
        time.sleep(SETTLE)
        start = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        status = proc.wait()  # a blocking waitpid: returns at the exit, no polling lag
        seconds = time.monotonic() - start
        proc.communicate()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return seconds, status


def child_consumer(path: str) -> int:
    """``--child consumer PATH``: run huey's consumer (4 threads) until signalled."""
    from huey.consumer import Consumer  # noqa: PLC0415

    class MarkedConsumer(Consumer):  # type: ignore[misc]
        def _set_signal_handlers(self) -> None:
            super()._set_signal_handlers()
            print(READY, flush=True)  # noqa: T201 - the parent's protocol

    quiet_logs()
    huey, _ = make_huey(Path(path))
    MarkedConsumer(huey, workers=4, worker_type="thread").run()
    return 0


def measure_sigterm(runs: int) -> tuple[dict[str, list[float]], dict[str, set[int]]]:
    """SIGTERM -> exit (ms) per row, children interleaved, and the exit statuses seen."""
    rows = {
        "bare python, Event + SIGTERM handler": "bare",
        "python -m patterns.jobqueue worker": "cli",
    }
    if have("huey"):
        rows["huey consumer, 4 threads"] = "huey"
    results: dict[str, list[float]] = {label: [] for label in rows}
    statuses: dict[str, set[int]] = {label: set() for label in rows}
    with scratch_dir("bench-sigterm-") as tmp:
        for run in range(runs):
            for label, kind in rows.items():
                seconds, status = sigterm_to_exit(kind, tmp / f"{kind}-{run}.db")
                results[label].append(seconds * 1000)
                statuses[label].add(status)
    return results, statuses


def stop_report(
    idle: dict[str, list[float]],
    sigterm: dict[str, list[float]],
    statuses: dict[str, set[int]],
) -> list[str]:
    """Tables 4a and 4b and their targets."""
    executor = median(idle["ThreadPoolExecutor(4).shutdown"])
    rows = [(label, spread(v, 2), ratio(median(v), executor)) for label, v in idle.items()]
    ours = idle["Worker.stop()"]
    lines = [
        (
            f"4a. Stop latency of an idle pool, in process, ms ({len(ours)} runs each); "
            "ratio = row / ThreadPoolExecutor"
        ),
        *render(("", "stop", "ratio"), rows),
        target("idle Worker.stop() < 5 ms", median(ours) < 5, f"{median(ours):.2f} ms"),
        "",
    ]
    bare_label = "bare python, Event + SIGTERM handler"
    bare = median(sigterm[bare_label])
    rows = [
        (
            label,
            spread(v),
            f"{median(v) - bare:+.1f}",
            ratio(median(v), bare),
            ",".join(str(s) for s in sorted(statuses[label])),
        )
        for label, v in sigterm.items()
    ]
    cli = median(sigterm["python -m patterns.jobqueue worker"])
    lines += [
        (
            f"4b. SIGTERM -> process exit of an idle worker process, ms "
            f"({len(sigterm[bare_label])} runs each; "
            f"signalled {SETTLE:g} s after its ready marker); ratio = row / bare python"
        ),
        *render(("", "signal -> exit", "vs bare", "ratio", "exit status"), rows),
        target(
            "CLI worker exits within 15 ms of bare python",
            cli - bare <= 15,
            f"{cli - bare:+.1f} ms",
        ),
    ]
    return lines


# --- 5. stop accuracy --------------------------------------------------------------------


def accuracy_worker(path: Path, budget: float) -> float:
    """Seconds past ``budget`` that ``Worker.stop(budget)`` took with a stubborn job."""
    from patterns.jobqueue import SQLiteStore, TaskRegistry, Worker  # noqa: PLC0415

    started = threading.Event()  # set by the job when it runs; waited on here
    release = threading.Event()  # set here once stop() returned; the job waits on it only
    tasks = TaskRegistry()

    @tasks.task(name="stubborn")
    def stubborn(payload: object, ctx: object) -> None:
        started.set()
        release.wait(EXIT_TIMEOUT)  # never looks at its token

    store = SQLiteStore(path)
    worker = Worker(store, tasks, concurrency=4).start()
    try:
        worker.enqueue("stubborn")
        if not started.wait(10):
            raise TimeoutError("the stubborn job never started")
        start = time.monotonic()
        report = worker.stop(budget)
        seconds = time.monotonic() - start
        if not report.still_running:
            raise RuntimeError(f"the stubborn job is not reported running: {report.summary()}")
    finally:
        release.set()
        worker.stop(1.0)
        prefix = worker.name
        join_threads([t for t in threading.enumerate() if t.name.startswith(prefix)], 10.0)
        store.close()
    return seconds - budget


def accuracy_huey(path: Path, budget: float) -> float:
    """Seconds past ``budget`` that huey's graceful stop took with a stubborn task."""
    from huey import SqliteHuey  # noqa: PLC0415

    started = threading.Event()  # set by the task when it runs; waited on here
    release = threading.Event()  # set here once stop() returned; the task waits on it only
    huey = SqliteHuey("bench", filename=str(path))

    @huey.task(name="stubborn")
    def stubborn() -> None:
        started.set()
        release.wait(EXIT_TIMEOUT)

    with saved_signal_handlers():
        consumer = huey.create_consumer(workers=4, worker_type="thread", shutdown_timeout=budget)
        consumer.start()
        try:
            stubborn()
            if not started.wait(10):
                raise TimeoutError("the stubborn task never started")
            start = time.monotonic()
            consumer.stop(graceful=True)
            seconds = time.monotonic() - start
        finally:
            release.set()
            consumer.stop_flag.set()
            join_threads([t for _, t in consumer.worker_threads], 10.0)
            join_threads([consumer.scheduler], 10.0)
    huey.storage.close()
    return seconds - budget


def measure_accuracy(runs: int, budgets: Sequence[float]) -> dict[str, list[float]]:
    """Overshoot (ms) past each budget, per row."""
    results: dict[str, list[float]] = {}
    with scratch_dir("bench-accuracy-") as tmp:
        for budget in budgets:
            rows: dict[str, Callable[[Path, float], float]] = {
                f"Worker.stop({budget:g})": accuracy_worker
            }
            if have("huey"):
                rows[f"huey Consumer.stop, shutdown_timeout={budget:g}"] = accuracy_huey
            for run in range(runs):
                for index, (label, fn) in enumerate(rows.items()):
                    path = tmp / f"acc-{budget}-{run}-{index}.db"
                    results.setdefault(label, []).append(fn(path, budget) * 1000)
    return results


def accuracy_report(results: dict[str, list[float]], runs: int) -> list[str]:
    """Table 5 and its target."""
    rows = [(label, spread(v), f"{max(v):.1f}") for label, v in results.items()]
    worst = max(max(v) for label, v in results.items() if label.startswith("Worker"))
    return [
        f"5. Stop accuracy: ms past the budget when one job ignores its token ({runs} runs each)",
        *render(("", "past budget", "worst"), rows),
        target(
            "stop() never returns more than 50 ms after its budget",
            worst <= 50,
            f"worst {worst:.1f} ms",
        ),
    ]


# --- main ----------------------------------------------------------------------------------


def child(argv: list[str]) -> int:
    """The children this benchmark starts: a producer and a huey consumer."""
    quiet_logs()
    if argv[0] == "producer":
        return child_producer(argv[1], argv[2])
    if argv[0] == "consumer":
        return child_consumer(argv[1])
    if argv[0] == "idle":
        return child_idle(argv[1], argv[2], argv[3])
    raise SystemExit(f"unknown child {argv[0]!r}")


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the three measurements and print the tables."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1:])
    from patterns.jobqueue.stores.sqlite.store import WATCH_INTERVAL  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=runs_setting(3), help="(BENCH_RUNS, 3)")
    parser.add_argument(
        "--samples",
        type=int,
        default=env_int("BENCH_SAMPLES", 100),
        help="in-process wake-up samples per run (BENCH_SAMPLES, 100)",
    )
    parser.add_argument(
        "--remote-samples",
        type=int,
        default=env_int("BENCH_REMOTE_SAMPLES", 50),
        help="cross-process wake-up samples per run (BENCH_REMOTE_SAMPLES, 50)",
    )
    parser.add_argument(
        "--poll",
        type=float,
        default=env_float("BENCH_POLL", 0.1),
        help="the worker's poll interval across processes, s (BENCH_POLL, 0.1)",
    )
    parser.add_argument(
        "--watch",
        type=float,
        default=env_float("BENCH_WATCH", WATCH_INTERVAL),
        help="the store's watch_interval across processes and idle, s "
        f"(BENCH_WATCH, {WATCH_INTERVAL:g})",
    )
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=env_float("BENCH_IDLE_SECONDS", 10.0),
        help="idle wall time measured per run, s; 0 skips table 3b (BENCH_IDLE_SECONDS, 10)",
    )
    parser.add_argument(
        "--drain-jobs",
        type=int,
        default=env_int("BENCH_DRAIN_JOBS", 3000),
        help="jobs drained while counting wake-ups; 0 skips table 3c (BENCH_DRAIN_JOBS, 3000)",
    )
    parser.add_argument(
        "--stop-runs",
        type=int,
        default=env_int("BENCH_STOP_RUNS", 15),
        help="idle stops per row (BENCH_STOP_RUNS, 15)",
    )
    parser.add_argument(
        "--signal-runs",
        type=int,
        default=env_int("BENCH_SIGNAL_RUNS", 7),
        help="SIGTERM runs per row and stop-accuracy runs per budget (BENCH_SIGNAL_RUNS, 7)",
    )
    parser.add_argument(
        "--budgets",
        default=os.environ.get("BENCH_BUDGETS", "0.1,0.5"),
        help="stop() budgets in seconds, comma-separated (BENCH_BUDGETS, 0.1,0.5)",
    )
    args = parser.parse_args(argv)
    quiet_logs()
    started = time.monotonic()
    emit([machine_line()])
    if not have("huey"):
        emit(["huey not installed: its rows are left out (pip install -e '.[bench]')"])
    wake = measure_wake(args.runs, args.samples, args.remote_samples, args.poll, args.watch)
    emit(["", *wake_report(wake, args.samples, args.remote_samples, args.poll, args.watch)])
    if args.idle_seconds > 0:
        watches = [0.0, args.watch] if args.watch > 0 else [0.0]
        idle = measure_idle(args.runs, args.idle_seconds, watches)
        emit(["", *idle_report(idle, args.idle_seconds, args.watch)])
    if args.watch > 0 and args.drain_jobs > 0:
        wakes = measure_drain_wakes(args.runs, args.drain_jobs, args.watch)
        emit(["", *drain_wakes_report(wakes, args.drain_jobs, args.watch)])
    idle = measure_stop(args.stop_runs)
    sigterm, statuses = measure_sigterm(args.signal_runs)
    emit(["", *stop_report(idle, sigterm, statuses)])
    budgets = [float(b) for b in args.budgets.split(",") if b.strip()]
    accuracy = measure_accuracy(args.signal_runs, budgets)
    emit(["", *accuracy_report(accuracy, args.signal_runs)])
    emit(["", end_line(started)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
