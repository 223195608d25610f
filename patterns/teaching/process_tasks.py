"""Functions the process tests, notebook 13 and the M pictures run in child processes.

A child started with ``spawn`` or ``forkserver`` unpickles its target by module and
name, so these cannot live in a test module that pytest imports under another name.
Each one announces that it got where the test needs it (a file or an event) instead of
letting the test guess how long that takes.
"""

from __future__ import annotations

import atexit
import json
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from multiprocessing.synchronize import Event
from pathlib import Path

from patterns.stoppable_process import StopSignal

# Held by a thread of the parent while it forks (M6): a forked child inherits it locked.
LOCK = threading.Lock()


def append(path: str, line: str) -> None:
    """Append one line to ``path`` (an O_APPEND write: whole lines from any process)."""
    with Path(path).open("a") as f:
        f.write(line + "\n")


def square(x: int) -> int:
    """A task that finishes at once."""
    return x * x


def mark_then_sleep(path: str, seconds: float) -> None:
    """A stuck task: write our pid to ``path`` (we are running now), then sleep."""
    append(path, str(os.getpid()))
    time.sleep(seconds)


def deaf_then_sleep(path: str, seconds: float) -> None:
    """A stuck task that also ignores SIGTERM: only SIGKILL ends it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    mark_then_sleep(path, seconds)


def deaf_noting_sigterm(path: str, seconds: float) -> None:
    """A stuck task deaf to SIGTERM that says it got one: a line in ``path`` + ".term".

    It writes its pid to ``path`` (we are running now) and sleeps; a SIGTERM appends its
    pid to ``path`` + ".term" and the sleep goes on. Only SIGKILL ends it.
    """

    def noted(signum: int, frame: object) -> None:
        append(path + ".term", str(os.getpid()))

    signal.signal(signal.SIGTERM, noted)
    mark_then_sleep(path, seconds)


def careful(stop: StopSignal, ready: Event, path: str) -> None:
    """A child with cleanup to do: waits for ``stop``; its finally and atexit write lines."""
    atexit.register(append, path, "atexit")
    try:
        ready.set()
        stop.wait()
        append(path, "stopped when asked")
    finally:
        append(path, "finally")


def mark(path: str, text: str) -> None:
    """Append a timestamped mark for a lane diagram: one JSON line (time, process name, text).

    ``perf_counter_ns`` is one clock for every process on Linux and macOS, so the parent
    can merge these marks with its own by time.
    """
    lane = multiprocessing.current_process().name
    append(path, json.dumps({"t": time.perf_counter_ns(), "lane": lane, "text": text}))


def careful_marked(stop: StopSignal, ready: Event, path: str) -> None:
    """`careful`, with each step a timestamped mark in ``path`` (the M3 race picture)."""
    atexit.register(mark, path, "atexit handler runs")
    try:
        mark(path, "ready; waits in stop.wait()")
        ready.set()
        stop.wait()
        mark(path, "stop.wait() returned: stops when asked")
    finally:
        mark(path, "finally: cleans up")


def stubborn(stop: StopSignal, ready: Event, deaf: bool) -> None:
    """A child that ignores its stop event (and SIGTERM too when ``deaf``)."""
    if deaf:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    time.sleep(60)


def items(stop: StopSignal | Event, ready: Event, name: str) -> None:
    """Work item after item until ``stop`` is set, then say how it ended."""
    ready.set()
    while not stop.is_set():
        stop.wait(0.01)  # one "item"
    sys.stdout.write(f"{name} finished cleanly\n")
    sys.stdout.flush()


def take_lock() -> None:
    """Take `LOCK` once (a forked child whose copy is held never gets past this)."""
    with LOCK:
        pass


def die_when(path: str, how: str = "os._exit") -> None:
    """Say we are running (``path`` + ".started"), then, once ``path`` exists, end abruptly.

    The way a crash or the OOM killer would: ``os._exit`` or SIGKILL.
    """
    append(path + ".started", str(os.getpid()))
    while not Path(path).exists():
        time.sleep(0.001)  # polling for the test's go-ahead
    if how == "os._exit":
        os._exit(3)
    os.kill(os.getpid(), signal.SIGKILL)


def wait_for_stop(stop: StopSignal) -> None:
    """A well-behaved child: it returns as soon as it is asked to stop."""
    stop.wait()


def item_until(path: str, started: str) -> str:
    """One long item: say it started (a line in ``started``), finish once ``path`` exists."""
    append(started, str(os.getpid()))
    while not Path(path).exists():
        time.sleep(0.001)  # polling for the test's go-ahead
    return "done"


def log_one_line() -> None:
    """Log a line through the root logger's handlers (each takes its handler lock)."""
    logging.getLogger("child").warning("logged in the child")


def item_with_cleanup_marked(go: str, marks: str) -> str:
    """`item_with_cleanup`, each step a timestamped mark in ``marks`` (the M8 race picture)."""
    try:
        mark(marks, "starts one long item")
        while not Path(go).exists():
            time.sleep(0.001)  # polling for the scenario's go-ahead
        mark(marks, "the item is done: returns its result")
        return "done"
    finally:
        mark(marks, "finally: cleans up")


def deaf_item_marked(marks: str) -> None:
    """A stuck item that ignores SIGTERM, saying so in ``marks`` (the M11 race picture)."""

    def ignored(signum: int, frame: object) -> None:
        mark(marks, "SIGTERM arrives: ignored, the item goes on")

    signal.signal(signal.SIGTERM, ignored)
    mark(marks, "starts one long item, deaf to SIGTERM")
    time.sleep(60)


def item_with_cleanup(path: str, started: str, log: str) -> str:
    """`item_until`, with a ``finally`` that writes a line to ``log`` (none if killed)."""
    try:
        return item_until(path, started)
    finally:
        append(log, "finally")


def sleep_marked(path: str) -> None:
    """`mark_then_sleep` for 60 s, with one argument (for ``Pool.map``)."""
    mark_then_sleep(path, 60)
