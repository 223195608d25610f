"""Giving claims back: a claim never started, and a job still running at the stop deadline.

TL;DR: `Releaser.unstarted` releases a claim whose handler never started (the stop began,
or its lease was lost) and records its outcome; `Releaser.still_running` releases, at the
stop's deadline, every job whose handler outlived the budget.

Pattern:
    The "forced" half of ``patterns.executor_shutdown``'s graceful-then-forced stop, for
    jobs: a thread cannot be killed, so the job is given back instead, and fencing makes
    its handler's late outcome harmless (the store refuses it).

Guarantees:
    * A stop never makes a job fail: a job released at the deadline is queued again with
      its attempt given back, like an interrupted one; only one whose release failed
      keeps its lease, and runs again once it expires.
    * A release whose commit's outcome is unknown is repeated once (refused if the first
      applied), so a connection broken at ``COMMIT`` does not leave the job leased.

See also: ``patterns.jobqueue.worker.worker`` (the stop that calls it),
``patterns.jobqueue.stores.protocol`` (the fencing rule).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from patterns.jobqueue.stores.protocol import WorkerStore
from patterns.jobqueue.stores.records import Claim, CommitUnknown, Job
from patterns.jobqueue.tasks import Phase
from patterns.jobqueue.worker.ledger import ClaimLedger, Held
from patterns.jobqueue.worker.outcomes import ClaimState, Outcome
from patterns.jobqueue.worker.settler import Settler

__all__ = ["Releaser"]

logger = logging.getLogger(__name__)


class Releaser:
    """Releases claims the worker will not run; see the module docstring.

    Collaborators: ``store``; ``ledger``; ``settler``, whose
    `~patterns.jobqueue.worker.settler.Settler.commit` makes each store call between the step
    hooks; ``error(phase, job, exc)``.
    """

    def __init__(
        self,
        store: WorkerStore,
        ledger: ClaimLedger,
        settler: Settler[Held],
        *,
        error: Callable[[Phase, Job | None, BaseException], object],
    ) -> None:
        self._store, self._ledger, self._settler, self._error = store, ledger, settler, error

    def unstarted(self, claim: Claim) -> None:
        """Release a claim whose handler never started, and record its outcome."""
        job = claim.job
        with self._ledger.cond:
            # Still held (so a report made meanwhile names it) until its outcome is recorded.
            held = self._ledger.held.get(job.id)
            claim = claim if held is None else held.claim  # the heartbeat may have renewed it
            lost = held is not None and held.state is ClaimState.LOST
        if lost:
            logger.info("job %d: its lease was lost before it started; not run", job.id)
            self._ledger.record(job, Outcome.LOST, held)
            return
        try:
            accepted = self._release(claim)
        except Exception as exc:  # noqa: BLE001 - reported by error()
            self._error(Phase.RELEASE, job, exc)
            outcome = Outcome.UNSETTLED
        else:
            outcome = Outcome.RELEASED if accepted else Outcome.LOST
        logger.info("job %d: released before it started (%s)", job.id, outcome.value)
        self._ledger.record(job, outcome, held)

    def still_running(self) -> None:
        """Give back the attempt of every job whose handler outlived the budget.

        A stop must never turn a job failed: kept under its lease, such a job would come
        back once the lease expired with this attempt spent (failed at once with
        ``max_attempts=1``). The process exits right after the report (a thread cannot
        be killed), and the release clears the lease, so the handler's late outcome is
        refused (fencing) and the job runs again from the queue, like an interrupted one.
        """
        for held in self._ledger.mark_late_running():
            job = held.claim.job
            try:
                accepted = self._release(held.claim)
            except Exception as exc:  # noqa: BLE001 - reported by error()
                self._error(Phase.RELEASE, job, exc)
                accepted = False
            if accepted:
                logger.warning(
                    "job %d (%s): still running at the stop deadline: released (attempt "
                    "given back); its handler's late outcome will be refused",
                    job.id,
                    job.task,
                )
                with self._ledger.cond:
                    self._ledger.released_running.append(job.id)
            else:
                logger.warning(
                    "job %d (%s): still running at the stop deadline and not released; "
                    "it keeps its lease",
                    job.id,
                    job.task,
                )

    def _release(self, claim: Claim) -> bool:
        """`Store.release`, repeated once if its commit's outcome is unknown.

        The second call is refused if the first one applied; either way the job is not
        left leased with its attempt spent because a connection broke at ``COMMIT``.
        """
        try:
            return self._settler.commit(Phase.RELEASE, claim, self._store.release)
        except CommitUnknown as exc:
            self._error(Phase.RELEASE, claim.job, exc)
            logger.warning(
                "job %d: release: outcome unknown: the commit may or may not have happened; "
                "releasing again (refused if it did)",
                claim.job.id,
            )
            return self._settler.commit(Phase.RELEASE, claim, self._store.release) or True
