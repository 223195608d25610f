"""The thread_exceptions picture: a worker dies, and the exit status says success.

Docs: docs/patterns/thread_exceptions.md
"""

from __future__ import annotations

import threading

from patterns import thread_exceptions
from patterns.naive import thread_exceptions as naive_thread_exceptions
from patterns.teaching.lanes import Tracer
from patterns.teaching.scenarios.common import Scenario, join_all, log_as_marks, start_thread


def _silent_death_run(fixed: bool) -> Tracer:
    runner = "run_main" if fixed else "naive_run_main"
    tracer = Tracer(runner, {"MainThread": "main"})

    def stand_in_for_the_default_hook(args: threading.ExceptHookArgs) -> None:
        # What the default hook would do, minus the print (kept out of the build log).
        tracer.mark(f"threading.excepthook (the default prints {args.exc_type.__name__})")

    def work() -> None:
        tracer.mark("raises ValueError('bad row 3')")
        raise ValueError("bad row 3")

    def main() -> None:
        worker = start_thread("worker", work)
        join_all(worker)
        tracer.mark(f"joined; worker.is_alive() is {worker.is_alive()}; main returns")

    before = threading.excepthook
    threading.excepthook = stand_in_for_the_default_hook
    try:
        tracer.mark(f"status = {runner}(main)")
        with log_as_marks(tracer, thread_exceptions.__name__):
            if fixed:
                status = thread_exceptions.run_main(main)
            else:
                status = naive_thread_exceptions.naive_run_main(main)
    finally:
        threading.excepthook = before
    tracer.mark(
        f"exit status {status}" + ("" if status else ": a scheduler sees success"),
        bad=not status,
    )
    return tracer


SILENT_DEATH = Scenario.of(
    "P8c",
    _silent_death_run,
    "The worker dies and the exit status is still 0; run_main logs the failure and returns 1.",
)
