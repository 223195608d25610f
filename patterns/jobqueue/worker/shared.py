"""What every part of one worker shares: one frozen object, built once and handed to each part.

TL;DR: `Shared` holds the store, the worker's name, its one lock, the store's clock, the
lease, a part's stop budget, the wake-up event and the callbacks every part reports
through (``error``, ``died``, ``step``, ``track``, ``request_stop``); `Shared.commit`
makes one store call between its two step boundaries. `no_step` is the step hook of a
worker given none; `Shared.stepping` says whether the parts must call the hook at all.
`StoppingThread` says which thread runs the owning stop and keeps a callback's Ctrl-C for
it: the error log and the stop both read it, so neither is handed the other.

Pattern:
    Dependency injection without a container: the worker builds this once, before any
    part, and every part takes it as its first argument, so no part is handed the worker
    itself and no part needs another one built after it.

See also: ``patterns.jobqueue.worker.worker`` (what builds it),
docs/jobqueue/composition.md (the parts).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from patterns.jobqueue.stores.protocol import WorkerStore
from patterns.jobqueue.stores.records import Claim, Job
from patterns.jobqueue.tasks import Phase
from patterns.jobqueue.worker.states import Step

__all__ = ["Shared", "StoppingThread", "Target", "no_step"]

Target = Callable[[threading.Event], None]  # a part's thread target (it gets its stop event)


def no_step(step: Step, claim: Claim, phase: Phase | None) -> None:
    """The default ``step_hook``: nothing happens at a step."""


@dataclass(frozen=True, slots=True)
class Shared:
    """What every part of one worker shares; see the module docstring."""

    store: WorkerStore
    owner: str  # the worker's name: the lease owner, the row's key, the threads' prefix
    # The worker's one lock: it guards every part's shared data (the ledger, the settler's
    # outbox, the errors). Never held while a handler, a hook or a store call runs.
    lock: threading.RLock
    clock: Callable[[], float]  # the store's: a retry's run time, the row's start time
    lease: float  # seconds each claim holds its job
    stop_timeout: float  # a part's own thread stop budget (finite)
    # Set by wake(), enqueue(), request_stop() and after each commit; the claimer's idle
    # wait ends at once.
    wake: threading.Event
    error: Callable[[Phase, Job | None, BaseException], object]  # an error outside a handler
    died: Callable[[BaseException], None]  # the calling worker thread is dying
    step: Callable[[Step, Claim, Phase | None], object]  # the fault-injection hook
    # Wraps a part's thread target, given the thread's name: it sets the thread's own
    # "began" and "ended" events and runs it under the stop's deadline.
    track: Callable[[Target, str], Target]
    request_stop: Callable[[str], None]  # begin the worker's stop (RUNNING -> DRAINING)

    @property
    def stepping(self) -> bool:
        """Whether a step hook was given, so that the parts call it at each step of a job.

        Six steps a job: calling the no-op at each is a measurable share of the worker's
        own cost per job (``benchmarks/jobqueue_overheads.py``, table 7b).
        """
        return self.step is not no_step

    def commit(self, phase: Phase, claim: Claim, action: Callable[[Claim], bool]) -> bool:
        """Make one store call that settles a job, between its two step boundaries."""
        self.step(Step.BEFORE_COMMIT, claim, phase)
        accepted = action(claim)
        self.step(Step.AFTER_COMMIT, claim, phase)
        return accepted


class StoppingThread:
    """The thread running the owning stop, and a callback's Ctrl-C or exit kept for it.

    Its ``thread`` is set and cleared by the stop (under the worker's lock) and read by
    the error log, which defers a hook's ``KeyboardInterrupt`` or ``SystemExit`` raised in
    that thread (`defer`) until the stop has recorded its report (`take_deferred`).
    """

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self._deferred: BaseException | None = None

    def is_current(self) -> bool:
        """The caller is the thread running the owning stop (a signal handler, a hook)."""
        return self.thread is threading.current_thread()

    def defer(self, exc: BaseException) -> None:
        """Keep a callback's Ctrl-C or exit, for the owning stop to raise once recorded."""
        self._deferred = self._deferred or exc

    def take_deferred(self) -> BaseException | None:
        """What `defer` kept (None if nothing), forgotten now."""
        deferred, self._deferred = self._deferred, None
        return deferred
