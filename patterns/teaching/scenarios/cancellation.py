"""The cancellation picture, C1: a CPU loop that checks its token once.

The naive loop runs every step after the cancel.

Docs: docs/patterns/cancellation.md
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from patterns import cancellation
from patterns.naive import cancellation as naive_cancellation
from patterns.teaching.lanes import Event, Tracer
from patterns.teaching.scenarios.common import Scenario, wait_for

_C1_ITEMS = 4


def _c1_run(fixed: bool) -> Tracer:
    crunch = cancellation.crunch if fixed else naive_cancellation.naive_crunch
    tracer = Tracer("crunch" if fixed else "naive_crunch", {"MainThread": "main"})
    token = cancellation.CancelToken()
    parked, go = threading.Event(), threading.Event()
    cancel_at: list[Event] = []

    def step(item: int) -> None:
        late = bool(cancel_at)
        tracer.mark(
            f"step({item})" + (": the cancel is never looked at" if late and item == 1 else ""),
            bad=late and item == 1,
            after=cancel_at[0] if late and item == 1 else None,
        )
        if item == 0:
            parked.set()
            wait_for(go, "C1 gate")

    def task() -> None:
        try:
            done = crunch(range(_C1_ITEMS), step, token)
        except cancellation.Cancelled as exc:
            tracer.mark(f"raised Cancelled({exc.reason!r}) before step(1)")
            return
        tracer.mark(f"returned {done}: every item processed after the cancel")

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="worker")
    tracer.name_lane("worker_0", "pool worker")
    pool.submit(task)
    wait_for(parked, "C1 step 0 running")
    cancel_at.append(tracer.mark("token.cancel('shutdown')"))
    token.cancel("shutdown")
    tracer.mark("pool.shutdown(wait=True)")
    go.set()
    pool.shutdown(wait=True)
    tracer.mark("shutdown returned")
    return tracer


C1 = Scenario.of(
    "C1",
    _c1_run,
    "The naive loop runs every step after the cancel, and shutdown waits for all of them; "
    "crunch checks the token before each step and stops after the one it was in.",
)
