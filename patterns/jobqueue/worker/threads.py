"""The worker's threads: each one it starts sets its own "began" and "ended" events.

TL;DR: `ThreadMarks.track` wraps the target of each thread the worker starts (the
claimer, the settler, the heartbeat, each handler), running it inside the context the
marks were made with (the worker's: its store calls keep to the stop's deadline);
`ThreadMarks.all_ended` waits for them within a budget, `ThreadMarks.unended` names
the ones still running, for the report, and `ThreadMarks.is_own` says whether the caller
is one of them. `wait` is ``Event.wait`` for any number of
seconds, inf included.

Pattern:
    ``patterns.daemon_threads``'s rule: a report reads each thread's own "ended" event,
    never ``Thread.is_alive()``: before 3.13 a ``join()`` interrupted by Ctrl-C marks a
    live thread finished (:gh:`90882`).

See also: ``patterns.jobqueue.worker.report`` (what reads them),
``patterns.jobqueue.worker.worker``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ParamSpec

__all__ = ["ThreadMarks", "wait"]

_P = ParamSpec("_P")


@dataclass(slots=True)
class _Mark:
    """One thread the worker started: its name, and its own "began" and "ended" events."""

    name: str
    handler: bool  # a handler thread (named in ``still_running``), not the claimer & co.
    thread: threading.Thread | None = None  # the thread running the target, once it began
    began: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)


class ThreadMarks:
    """Every thread the worker starts, in start order, each setting its own events.

    Set by the thread's target (wrapped by `track`), in its first line and its
    ``finally``; read by the reports, lock-free.
    """

    def __init__(
        self,
        around: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
    ) -> None:
        self._marks: list[_Mark] = []  # appended before the thread starts
        self._around = around  # entered by each thread around its target

    def track(
        self, target: Callable[_P, None], name: str, *, handler: bool = False
    ) -> Callable[_P, None]:
        """``target``, for a thread the worker starts: it sets its own events."""
        mark = _Mark(name, handler)
        self._marks.append(mark)

        def run(*args: _P.args, **kwargs: _P.kwargs) -> None:
            mark.thread = threading.current_thread()
            mark.name = mark.thread.name
            mark.began.set()
            try:
                with self._around():
                    target(*args, **kwargs)
            finally:
                mark.ended.set()

        return run

    def all_ended(self, left: Callable[[], float]) -> bool:
        """Wait (within ``left()``) until every thread that began has ended."""
        return all(wait(m.ended, left()) for m in list(self._marks) if m.began.is_set())

    def is_own(self) -> bool:
        """The caller is one of these threads, inside its target (a handler, a hook)."""
        current = threading.current_thread()
        return any(m.thread is current and not m.ended.is_set() for m in list(self._marks))

    def unended(self, *, handlers: bool) -> tuple[str, ...]:
        """Names of the (handler) threads that began and have not ended."""
        return tuple(
            m.name
            for m in list(self._marks)
            if m.began.is_set() and not m.ended.is_set() and (m.handler or not handlers)
        )


def wait(event: threading.Event, seconds: float) -> bool:
    """``event.wait(seconds)`` for any ``seconds >= 0``, inf included: each wait is capped."""
    deadline = time.monotonic() + seconds
    while not event.wait(min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)):
        if time.monotonic() >= deadline:
            return False
    return True
