"""The process_shutdown picture, M3: ``terminate()`` skips the child's cleanup.

The child is the race tests' `careful`, each step a mark in a file (JSON lines) that
the parent merges with its own marks by time. Started with spawn, as the tests do.

Docs: docs/patterns/process_shutdown.md
"""

from __future__ import annotations

import json
import multiprocessing
import tempfile
import time
from pathlib import Path

from patterns import process_shutdown
from patterns.naive import process_shutdown as naive_process_shutdown
from patterns.teaching import process_tasks
from patterns.teaching.lanes import Tracer
from patterns.teaching.scenarios.common import MUST_HAPPEN, Scenario, merged


def _m3_run(fixed: bool) -> Tracer:
    context = multiprocessing.get_context("spawn")
    marks: list[tuple[int, str, str, bool]] = []

    def mark(text: str, *, bad: bool = False) -> None:
        marks.append((time.perf_counter_ns(), "parent", text, bad))

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "marks")
        ready = context.Event()
        child = process_shutdown.StoppableProcess(
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
                naive_process_shutdown.naive_stop_process(process)
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
