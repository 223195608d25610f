"""The supervisor picture, P9: the consumer dies, and the producer blocks on the full queue.

Docs: docs/patterns/supervisor.md
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

from patterns import supervisor
from patterns.naive import supervisor as naive_supervisor
from patterns.teaching.lanes import Tracer
from patterns.teaching.scenarios.common import (
    MUST_HAPPEN,
    Scenario,
    blocked_in,
    join_all,
    log_as_marks,
    start_thread,
    still_blocked,
    wait_for,
)


def _poison(item: str) -> None:
    if item == "poison":
        raise ValueError("cannot handle poison")


def _p9_items(
    tracer: Tracer, consumer_done: threading.Event, what: str, at_b: threading.Event
) -> Iterator[str]:
    """The producer's items: 'poison', then, once ``consumer_done`` is set, 'a' and 'b'."""
    tracer.mark("puts 'poison'")
    yield "poison"
    wait_for(consumer_done, what)
    tracer.mark("puts 'a': it fits")
    yield "a"
    tracer.mark("puts 'b': the queue is full")
    at_b.set()
    yield "b"


def _p9_naive() -> Tracer:
    tracer = Tracer("naive_consume, naive_produce", {"MainThread": "main"})
    q: queue.Queue[str] = queue.Queue(maxsize=1)
    died, at_b = threading.Event(), threading.Event()

    def consumer() -> None:
        tracer.mark("waits in q.get()")
        try:
            naive_supervisor.naive_consume(q, _poison)
        except ValueError as exc:  # what the default hook would print, and nothing more
            tracer.mark(f"dies of ValueError({exc}); the default hook would only print it")
        died.set()

    def items() -> Iterator[str]:
        yield from _p9_items(tracer, died, "P9 consumer dead", at_b)
        tracer.mark("put('b') returned")

    consumer_thread = start_thread("consumer", consumer)
    blocked_in(consumer_thread, "get")
    producer = start_thread("producer", lambda: naive_supervisor.naive_produce(q, items()))
    wait_for(at_b, "P9 producer at 'b'")
    blocked_in(producer, "put")
    if not still_blocked(producer):
        raise RuntimeError("P9: the producer's put('b') returned with no consumer")
    tracer.mark("still waits in put('b'): nobody will ever take it", bad=True, lane="producer")
    tracer.mark("(the scenario takes 'a' and 'b', to end it)")
    q.get(timeout=MUST_HAPPEN)
    join_all(producer, consumer_thread)
    q.get(timeout=MUST_HAPPEN)
    return tracer


def _p9_fixed() -> Tracer:
    tracer = Tracer("Supervisor, produce_until_consumer_dies", {"MainThread": "main"})
    q: queue.Queue[str] = queue.Queue(maxsize=1)
    holding, die, at_b = threading.Event(), threading.Event(), threading.Event()

    def handle(item: str) -> None:
        if item == "poison":
            tracer.mark("takes 'poison'")
            holding.set()
            wait_for(die, "P9 gate")
        _poison(item)

    def consume(stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                item = q.get(timeout=0.05)  # a bounded wait, so the stop request is seen
            except queue.Empty:
                continue
            handle(item)

    with log_as_marks(tracer, supervisor.__name__):
        watcher = supervisor.Supervisor(consume, name="consumer", max_restarts=0, interval=0)
        watcher.start()
        left: list[list[str]] = []

        def produce() -> None:
            left.append(
                supervisor.produce_until_consumer_dies(
                    q,
                    _p9_items(tracer, holding, "P9 consumer holding the poison", at_b),
                    alive=lambda: watcher.healthy,
                    check_every=0.02,
                )
            )
            tracer.mark(f"returned {left[0]}: not delivered, not lost")

        producer = start_thread("producer", produce)
        wait_for(at_b, "P9 producer at 'b'")
        blocked_in(producer, "put")
        tracer.mark("lets the consumer fail")
        die.set()
        join_all(producer)
        report = watcher.stop(MUST_HAPPEN)
    tracer.mark(f"supervisor.stop(): terminated={report.terminated}")
    return tracer


P9 = Scenario(
    "P9",
    _p9_naive,
    _p9_fixed,
    "Once the consumer is dead the naive producer waits on the full queue forever; "
    "under a supervisor the producer notices the death and returns what it could "
    "not deliver.",
)
