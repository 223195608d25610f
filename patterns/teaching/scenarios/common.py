"""What the scenario modules share: the `Scenario` record, the checkpoints, the child runner.

The checkpoints wait at most `MUST_HAPPEN` for what must happen, and watch for `LOOK`
what must not. Docs: docs/_ext/lanes.py
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from patterns.teaching.lanes import Tracer

T = TypeVar("T")

# How long a scenario waits for something that must happen (it happens in microseconds;
# this only turns a broken scenario into an error instead of a hang).
MUST_HAPPEN = 10.0
# How long a naive run watches a thread that must stay blocked before it releases it.
LOOK = 0.05


@dataclass(frozen=True)
class Scenario:
    """A pitfall's naive and fixed runs, and the sentence that says what to look at."""

    pitfall: str
    naive: Callable[[], Tracer]
    fixed: Callable[[], Tracer]
    caption: str
    lanes: str = "a thread"  # what one lane is, for the caption ("an asyncio task" ...)

    @classmethod
    def of(
        cls, pitfall: str, run: Callable[[bool], Tracer], caption: str, lanes: str = "a thread"
    ) -> Scenario:
        """The scenario whose naive run is ``run(False)`` and whose fixed run is ``run(True)``."""
        return cls(pitfall, _bound(run, False), _bound(run, True), caption, lanes)


def _bound(run: Callable[[bool], Tracer], fixed: bool) -> Callable[[], Tracer]:
    """``run(fixed)`` as a function of no arguments, named as written in ``run``'s module."""

    def one() -> Tracer:
        return run(fixed)

    one.__module__ = run.__module__
    one.__qualname__ = f"{run.__qualname__}(fixed={fixed})"
    return one


def blocked_in(thread: threading.Thread, func_name: str) -> None:
    """Return once ``thread``'s stack has a frame of ``func_name`` (observed, not guessed)."""
    deadline = time.monotonic() + MUST_HAPPEN
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(thread.ident or -1)
        while frame is not None:
            if frame.f_code.co_name == func_name:
                return
            frame = frame.f_back
        time.sleep(0.0005)  # polling an observation, not waiting for a race
    raise RuntimeError(f"{thread.name} was never seen inside {func_name}()")


def wait_for(event: threading.Event, what: str) -> None:
    """Wait for ``event``; a scenario stuck at ``what`` is an error, not a hang."""
    if not event.wait(MUST_HAPPEN):
        raise RuntimeError(f"scenario stuck: {what}")


def join_all(*threads: threading.Thread) -> None:
    """Join each thread; one still running after `MUST_HAPPEN` is an error."""
    for thread in threads:
        thread.join(MUST_HAPPEN)
        if thread.is_alive():
            raise RuntimeError(f"scenario left {thread.name} running")


def start_thread(name: str, target: Callable[[], object]) -> threading.Thread:
    """Start a thread named ``name`` (its lane) running ``target``."""
    thread = threading.Thread(target=target, name=name)
    thread.start()
    return thread


class _MarkHandler(logging.Handler):
    def __init__(self, tracer: Tracer) -> None:
        super().__init__(logging.INFO)
        self.tracer = tracer

    def emit(self, record: logging.LogRecord) -> None:
        message = re.sub(r" \(ident \d+\)", "", record.getMessage().split(";")[0])
        self.tracer.mark(f"logs {record.levelname}: {message}")


@contextlib.contextmanager
def log_as_marks(tracer: Tracer, name: str) -> Iterator[None]:
    """Turn what logger ``name`` logs (INFO and up) into marks, instead of printing it."""
    target = logging.getLogger(name)
    handler = _MarkHandler(tracer)
    propagate, level = target.propagate, target.level
    target.addHandler(handler)
    target.propagate = False
    target.setLevel(logging.INFO)
    try:
        yield
    finally:
        target.removeHandler(handler)
        target.propagate, target.level = propagate, level


def still_blocked(thread: threading.Thread) -> bool:
    """Watch ``thread`` for `LOOK` seconds: True if it is still alive (it must be)."""
    thread.join(LOOK)
    return thread.is_alive()


def run_async(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``asyncio.run(main())`` in a thread of its own, the main task's lane named "main".

    A thread of its own because a notebook's kernel already runs a loop in this one;
    bounded, so a broken scenario is an error instead of a hang.
    """
    outcome: list[T] = []
    failure: list[BaseException] = []

    async def bounded() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.set_name("main")
        async with asyncio.timeout(MUST_HAPPEN):
            outcome.append(await main())

    def run() -> None:
        try:
            asyncio.run(bounded())
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            failure.append(exc)

    join_all(start_thread("event-loop", run))
    if failure:
        raise failure[0]
    return outcome[0]


# --- scenarios that need a process of their own: interpreter exit, signals -----------
# The child prints one JSON line per mark (its perf_counter_ns, thread, text); the parent
# adds its own marks and merges both by time into one trace.

_CHILD_MARK = """
import json, sys, threading, time

def mark(text, bad=False):
    line = json.dumps({"t": time.perf_counter_ns(), "thread": threading.current_thread().name,
                       "text": text, "bad": bad})
    sys.stdout.write(line + "\\n")  # one write per line: threads may mark at once
    sys.stdout.flush()
"""


class Child:
    """A child interpreter running ``code``; its marks and the parent's, in time order."""

    def __init__(self, code: str, parent_lane: str = "parent") -> None:
        self.parent_lane = parent_lane
        self.marks: list[tuple[int, str, str, bool]] = []
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.mark("starts the child")
        root = Path(__file__).resolve().parents[3]  # the checkout, for `patterns`
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *sys.path])}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD_MARK + code],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.reader = start_thread("child-reader", self._read)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))
        self.lines.put(None)

    def mark(self, text: str, *, bad: bool = False, lane: str = "") -> None:
        """Mark ``text`` in the parent's lane, or in ``lane`` (what the parent saw of a child's)."""
        self.marks.append((time.perf_counter_ns(), lane or self.parent_lane, text, bad))

    def expect(self, text: str) -> None:
        """Wait for the child's mark that starts with ``text``, unless it came already.

        Two threads' lines reach the pipe in the order they were written, not marked.
        """
        while not any(mark[2].startswith(text) for mark in self.marks if mark[1] != "parent"):
            item = self.lines.get(timeout=MUST_HAPPEN)
            if item is None:
                raise RuntimeError(f"child ended before {text!r}: {self.marks}")
            self._keep(item)

    def finish(self) -> int:
        """Wait for the child to exit; collect its remaining marks; return its status."""
        try:
            return self.proc.wait(MUST_HAPPEN)
        finally:
            self.close()

    def close(self) -> None:
        """Kill the child if it still runs, and collect what it printed (idempotent)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        join_all(self.reader)
        while not self.lines.empty():
            item = self.lines.get_nowait()
            if item is not None:
                self._keep(item)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def _keep(self, item: dict[str, Any]) -> None:
        self.marks.append((int(item["t"]), str(item["thread"]), str(item["text"]), item["bad"]))

    def trace(self, title: str, lanes: dict[str, str]) -> Tracer:
        """The child's marks and the parent's, merged by time."""
        return merged(title, lanes, self.marks)


def merged(title: str, lanes: dict[str, str], marks: list[tuple[int, str, str, bool]]) -> Tracer:
    """A trace of marks (time, lane, text, bad) made in several processes, in time order."""
    tracer = Tracer(title, lanes)
    for t_ns, lane, text, bad in sorted(marks):
        tracer.record(t_ns, lane, text, bad=bad)
    return tracer
