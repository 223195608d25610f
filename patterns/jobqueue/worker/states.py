"""The worker's states, the only moves between them, and the steps of one job's life.

TL;DR: `~patterns.jobqueue.worker.worker.WorkerState` is what ``Worker.state`` returns;
`StateMachine.move` makes each change, checked against ``TRANSITIONS`` (a move not in it is
a bug, raised at once) and logged; `~patterns.jobqueue.worker.worker.Step` names the boundaries
where ``Worker(step_hook=...)`` is called, for fault-injection tests.

Pattern:
    One explicit state machine, as ``patterns.executor_shutdown`` walks for one pool: a
    stop is RUNNING -> DRAINING -> CANCELLING -> STOPPED, each change logged as
    ``worker.<state>``. A claim's own states are `~patterns.jobqueue.worker.outcomes.ClaimState`.

See also: ``patterns.jobqueue.worker.worker`` (the moves), docs/jobqueue/design.md.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType

# WorkerState and Step are documented with the Worker, where users import them.
__all__ = ["TRANSITIONS", "StateMachine"]

# The worker's own log: ``worker.<state>`` events are the worker's.
logger = logging.getLogger(__name__)


class WorkerState(enum.StrEnum):
    """The worker's lifecycle; every change is logged as ``worker.<state>``."""

    # Users import it from, and the docs document it with, the worker's module.
    __module__ = "patterns.jobqueue.worker.worker"

    NEW = "new"
    RUNNING = "running"  # claiming and running jobs
    DRAINING = "draining"  # no more claims; running jobs may finish; leases still renewed
    CANCELLING = "cancelling"  # running jobs' tokens cancelled; Interrupted jobs released
    STOPPED = "stopped"  # on_shutdown called; the report is final


# The only transitions there are. DRAINING goes straight to STOPPED when every job ended
# within the drain budget; NEW goes to STOPPED when a worker is stopped before it started.
TRANSITIONS: Mapping[WorkerState, frozenset[WorkerState]] = MappingProxyType(
    {
        WorkerState.NEW: frozenset({WorkerState.RUNNING, WorkerState.STOPPED}),
        WorkerState.RUNNING: frozenset({WorkerState.DRAINING}),
        WorkerState.DRAINING: frozenset({WorkerState.CANCELLING, WorkerState.STOPPED}),
        WorkerState.CANCELLING: frozenset({WorkerState.STOPPED}),
        WorkerState.STOPPED: frozenset(),
    }
)


class StateMachine:
    """The worker's state, changed only by `move` with the worker's lock held.

    ``cond`` is the worker's condition: every move wakes its waiters. ``entered`` holds
    the monotonic time each state began (the report's phases). ``on_move(new)`` runs
    with each move, under the lock (the ledger's gate opens in RUNNING alone).
    """

    def __init__(
        self, worker: str, cond: threading.Condition, on_move: Callable[[WorkerState], None]
    ) -> None:
        self._worker, self._cond, self._on_move = worker, cond, on_move
        self.state = WorkerState.NEW
        self.entered: dict[WorkerState, float] = {}

    def move(self, new: WorkerState, detail: str = "") -> None:
        """Set and log one state change, checked against ``TRANSITIONS`` (lock held)."""
        old = self.state
        if new not in TRANSITIONS[old]:
            raise RuntimeError(f"worker {self._worker}: no transition from {old} to {new}")
        self.state = new
        self.entered[new] = time.monotonic()
        self._on_move(new)
        self._cond.notify_all()
        logger.info(
            "worker %s: %s -> %s: %s",
            self._worker,
            old.name,
            new.name,
            detail,
            extra={"event": f"worker.{new.value}", "worker": self._worker, "state": new},
        )


class Step(enum.StrEnum):
    """A boundary in one job's life where ``Worker(step_hook=...)`` is called (for tests).

    Fault-injection tests park a job at a boundary, or raise there, to prove that a stop,
    a cancellation, an error or a crash at that point loses nothing. The hook is called as
    ``step_hook(step, claim, phase)``; ``phase`` names the store call for the three commit
    steps (``Phase.ACK``, ``Phase.RELEASE``, ...) and is None for the others. The two
    around the store call run in the thread that commits a handler's outcome (each item
    of a group commit in turn): the settler's, or the handler thread that led the commit
    of the last job in hand; and in the releasing thread for a claim never started.
    """

    # Users import it from, and the docs document it with, the worker's module.
    __module__ = "patterns.jobqueue.worker.worker"

    AFTER_CLAIM = "after_claim"  # claiming thread: the claim is committed, not yet handed off
    BEFORE_HANDLER = "before_handler"  # handler thread: the job is running, handler not called
    AFTER_HANDLER = "after_handler"  # the handler returned or raised; nothing decided yet
    # Handler thread: the outcome is decided, about to be handed to the settler (which
    # commits it with others); nothing is written yet.
    BEFORE_GROUP_COMMIT = "before_group_commit"
    BEFORE_COMMIT = "before_commit"  # just before the store call that settles the job
    AFTER_COMMIT = "after_commit"  # that store call returned (accepted or refused)
    HEARTBEAT = "heartbeat"  # heartbeat thread: about to renew this claim's lease
