"""The poison_pill picture, P10: one pill for three consumers.

It ends one of them; the other two stay in ``get()``.

Docs: docs/patterns/poison_pill.md
"""

from __future__ import annotations

import queue
import threading

from patterns import poison_pill
from patterns.naive import poison_pill as naive_poison_pill
from patterns.teaching.lanes import Tracer
from patterns.teaching.scenarios.common import (
    MUST_HAPPEN,
    Scenario,
    blocked_in,
    join_all,
    start_thread,
    still_blocked,
)


def _p10_run(fixed: bool) -> Tracer:
    name = "send_pills(q, 3)" if fixed else "naive_send_pills(q, 3)"
    tracer = Tracer(name, {"MainThread": "main"})
    q: queue.Queue[int | poison_pill.Pill] = queue.Queue()
    exited: queue.Queue[str] = queue.Queue()

    def consumer() -> None:
        tracer.mark("consume(q): waits in get()")
        handled = poison_pill.consume(q, lambda item: tracer.mark(f"handles item {item}"))
        tracer.mark(f"took a pill: returns ({handled} handled)")
        exited.put(threading.current_thread().name)

    threads = [start_thread(f"consumer-{c}", consumer) for c in "ABC"]
    for thread in threads:
        blocked_in(thread, "get")
    for item in range(2):
        q.put(item)
    tracer.mark(name)
    if fixed:
        poison_pill.send_pills(q, consumers=3)
        join_all(*threads)
        tracer.mark("every consumer returned")
        return tracer
    naive_poison_pill.naive_send_pills(q, consumers=3)
    first = exited.get(timeout=MUST_HAPPEN)
    stuck = [t for t in threads if t.name != first]
    for thread in stuck:
        blocked_in(thread, "get")
    if not all(still_blocked(t) for t in stuck):
        raise RuntimeError("P10: a consumer left without a pill")
    for thread in stuck:
        tracer.mark("still blocked in get(): no pill left for it", bad=True, lane=thread.name)
    tracer.mark("(the scenario sends 2 more pills, to end them)")
    poison_pill.send_pills(q, consumers=2)
    join_all(*threads)
    return tracer


P10 = Scenario.of(
    "P10",
    _p10_run,
    "One pill ends one consumer and the others stay in get(); "
    "one pill per consumer ends all three, after every item.",
)
