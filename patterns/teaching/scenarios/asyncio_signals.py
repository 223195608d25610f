"""The asyncio_signals picture: A6, SIGTERM reaching `asyncio.run` with no handler for it.

The child is the race tests' one, with marks: a service whose work waits for its stop event
inside ``try``/``finally``. Naive, plain `asyncio.run`: SIGTERM kills it where it waits;
fixed, `run_until_signalled`: SIGTERM sets the event, the work returns and the finally runs.

Docs: docs/patterns/asyncio_signals.md
"""

from __future__ import annotations

import signal

from patterns.teaching.lanes import Tracer
from patterns.teaching.scenarios.common import Child, Scenario

_A6_CHILD = """
import asyncio
from patterns.asyncio_signals import run_until_signalled

async def work(stop):
    try:
        mark("work: serves; waits for stop")
        await stop.wait()
        mark("stop is set: finishes what is in flight, returns")
    finally:
        mark("finally runs")

{call}
mark("asyncio.run returned")
"""


def _a6_run(fixed: bool) -> Tracer:
    if fixed:
        call = "asyncio.run(run_until_signalled(work, drain_timeout=5))"
    else:
        call = "asyncio.run(work(asyncio.Event()))"
    child = Child(_A6_CHILD.format(call=call))
    try:
        child.expect("work: serves")
        child.mark("SIGTERM, as docker stop or a rolling update sends")
        child.proc.send_signal(signal.SIGTERM)
        status = child.finish()
    finally:
        child.proc.kill()
    if status == -signal.SIGTERM:
        child.mark("killed where it waited: no finally", bad=True, lane="MainThread")
        child.mark(f"child exited {status}: no cleanup ran")
    else:
        child.mark(f"child exited {status}")
    title = "run_until_signalled" if fixed else "asyncio.run"
    return child.trace(title, {"MainThread": "child main"})


A6 = Scenario.of(
    "A6",
    _a6_run,
    "With plain asyncio.run, SIGTERM has its default action: the child dies where its work "
    "waits, and the finally never runs; run_until_signalled turns SIGTERM into the stop "
    "event, so the work returns, its finally runs, and the child exits with status 0.",
    lanes="the child's main thread, where the event loop runs, or the parent",
)
