"""The settler's fallback path: one job's outcome when its group commit could not record it.

TL;DR: the settler's group commit (``patterns.jobqueue.worker.settler``) gets one answer per
job; `Fallback.answered` turns it into the job's `~patterns.jobqueue.worker.worker.Outcome`
(accepted, refused by fencing, or an error of that job alone). When a store call raised,
`Fallback.raised` reports it and makes one bounded fallback call that keeps the attempt
spent: the job is requeued while attempts are left, failed after. When ``settle_many``
itself failed, `Fallback.group_failed` commits each job on its own. `Fallback.commit`
makes one store call between the two step hooks; the worker's release goes through it too.

Pattern:
    Fencing (the lease token on every store call) makes a repeated call safe: a commit
    whose outcome is unknown (`~patterns.jobqueue.stores.records.CommitUnknown`, the connection
    broke in ``COMMIT``) is repeated once with its own kind of call, which the store
    refuses if the first one applied. Nothing here holds a lock or starts a thread: it
    runs in the committing thread: the settler's, or a handler thread (one that led the
    commit of the last job in hand, or any once the settler is gone).

Guarantees:
    * A job whose handler ran is never released by the fallback (its attempt would be
      given back and a job whose outcome can never be recorded would run for ever).
    * At most one fallback call per failed store call; if it raises too, the job is
      unsettled and its lease expiry counts the attempt, so ``max_attempts`` still bounds it.

See also: ``patterns.jobqueue.worker.settler`` (what calls it), ``tests/jobqueue/test_fallback.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Generic, Protocol, TypeVar

from patterns.jobqueue.stores.checks import storable_error
from patterns.jobqueue.stores.protocol import WorkerStore
from patterns.jobqueue.stores.records import Claim, CommitUnknown, Job, Settle, Settlement
from patterns.jobqueue.tasks import Phase
from patterns.jobqueue.tasks import describe_error as _describe
from patterns.jobqueue.worker.outcomes import DEFAULT_POLICY, Outcome

__all__ = ["Fallback", "Pending", "Run"]

# The settler's logger (a child of the worker's): these lines were the worker's own.
logger = logging.getLogger(__name__)


class Run(Protocol):
    """What the settler reads of the worker's record of one claim."""

    @property
    def claim(self) -> Claim:
        """The latest claim (the heartbeat may renew it)."""
        ...

    @property
    def released_at_deadline(self) -> bool:
        """True once the stop released the job at its deadline while its handler ran."""
        ...


_R = TypeVar("_R", bound=Run)


@dataclass(slots=True)
class Pending(Generic[_R]):
    """One decided outcome on its way to the settler's group commit."""

    run: _R  # the worker's record of the claim, handed back with the outcome
    phase: Phase  # the store call's phase, for errors, logs and the step hook
    item: Settlement  # what settle_many records
    success: Outcome  # the outcome when the store accepts it
    then: Callable[[], object] | None  # the task's hook, run only on ``success``
    began: float | None  # monotonic time the handler began (a completion's log line)
    outcome: Outcome | None = None  # set by the settler


_StepHook = Callable[[Claim, Phase], object]


class Fallback(Generic[_R]):
    """One job's outcome from its answer, and its fallback; see the module docstring.

    Collaborators: ``store``; ``owner``, the worker's name (for the log); ``clock``, the
    time a requeue's ``run_at`` is counted from; ``error(phase, job, exc)``: report a
    store call that raised; ``before_commit``/``after_commit(claim, phase)``: the step
    hooks around each store call.
    """

    def __init__(
        self,
        store: WorkerStore,
        *,
        owner: str,
        clock: Callable[[], float],
        error: Callable[[Phase, Job | None, BaseException], object],
        before_commit: _StepHook,
        after_commit: _StepHook,
    ) -> None:
        self._store, self._owner, self._clock, self._error = store, owner, clock, error
        self._before_commit, self._after_commit = before_commit, after_commit

    def answered(self, pending: Pending[_R], answer: bool | Exception) -> Outcome:
        """The outcome of one item from its `~.Store.settle_many` answer."""
        if isinstance(answer, Exception):
            if pending.item.kind is not Settle.COMPLETE:
                return self.raised(pending, answer)
            try:  # a result the store cannot keep: complete with None instead
                answer = self._complete_without_result(pending.item.claim, answer)
            except Exception as exc:  # noqa: BLE001 - reported by error()
                return self.raised(pending, exc)
        if answer:
            return pending.success
        self._log_refused(pending.run, pending.phase)
        return Outcome.LOST

    def raised(self, pending: Pending[_R], exc: Exception) -> Outcome:
        """The job's store call raised: reported, then one bounded fallback (``_fallback``)."""
        self._error(pending.phase, pending.run.claim.job, exc)
        return self._fallback(pending.run, pending.item.claim, pending.phase, exc)

    def group_call(
        self, items: list[Settlement], *, lease: float, want: int
    ) -> tuple[list[bool | Exception], list[Claim]]:
        """The group's one store call, checked: one answer per item, at most ``want`` claims.

        With ``want``, `~.Store.settle_and_claim` (the same
        transaction claims for the freed slots); without,
        `~.Store.settle_many`. A store that answers otherwise
        raises here, so that the group takes its fallback.
        """
        if want:
            answers, claims = self._store.settle_and_claim(
                items, self._owner, lease=lease, limit=want
            )
        else:
            answers, claims = self._store.settle_many(items), []
        if len(answers) != len(items) or len(claims) > want:
            raise RuntimeError(
                f"the group commit returned {len(answers)} answers for {len(items)} items"
                f" and {len(claims)} claims for {want} slots"
            )
        return answers, claims

    def group_failed(self, sent: list[Pending[_R]], exc: Exception) -> None:
        """``settle_many`` itself raised: each job takes the path of its own failed call.

        Alone, or when the commit's outcome is unknown (any item may have applied), each
        goes straight to ``_fallback``, as if its single call had raised. Several items
        whose transaction failed (nothing applied) are then committed one by one; the
        error is reported once, under the first item's phase and job.
        """
        if len(sent) == 1 or isinstance(exc, CommitUnknown):
            for pending in sent:
                pending.outcome = self.raised(pending, exc)
            return
        first = sent[0]
        self._error(first.phase, first.run.claim.job, exc)
        logger.warning(
            "worker %s: the group commit of jobs %s failed; committing each on its own",
            self._owner,
            [pending.run.claim.job.id for pending in sent],
        )
        for pending in sent:
            try:
                answer = self.commit(pending.phase, pending.item.claim, self._settle_one(pending))
            except Exception as again:  # noqa: BLE001 - reported by error()
                pending.outcome = self.raised(pending, again)
            else:
                pending.outcome = self.answered(pending, answer)

    def _settle_one(self, pending: Pending[_R]) -> Callable[[Claim], bool]:
        """One item alone, as `commit`'s action; the item's own exception is raised."""
        item = pending.item

        def action(claim: Claim) -> bool:
            [answer] = self._store.settle_many([replace(item, claim=claim)])
            if not isinstance(answer, Exception):
                return answer
            if item.kind is not Settle.COMPLETE:
                raise answer
            return self._complete_without_result(claim, answer)

        return action

    def _complete_without_result(self, claim: Claim, why: Exception) -> bool:
        job = claim.job
        logger.warning(
            "job %d (%s): its result cannot be stored (%s); completing it with result None",
            job.id,
            job.task,
            why,
        )
        return self._store.complete(claim, None)

    def _fallback(self, run: _R, claim: Claim, phase: Phase, exc: Exception) -> Outcome:
        """The one store call made when the call that settles a job raised.

        Never a release of a job whose handler ran (its attempt would be given back, and
        an outcome that can never be recorded would run the job again at once, for
        ever): the attempt stays spent. A job with attempts left is requeued after the
        default backoff, one without is failed, each with a storable reason; a job
        decided failed stays failed. A commit whose outcome is unknown repeats its own
        kind of call: fencing refuses the second if the first applied. If the fallback
        raises too, the job is unsettled: its lease expires and the store counts the
        attempt, so ``max_attempts`` still bounds its runs.
        """
        job = claim.job
        unknown = isinstance(exc, CommitUnknown)
        reason = storable_error(
            f"its outcome could not be recorded ({phase.value}): {_describe(exc)}"
        )
        action: Callable[[Claim], bool]
        if phase is Phase.RELEASE:
            if not unknown:
                logger.error("job %d: unsettled; it runs again when its lease expires", job.id)
                return Outcome.UNSETTLED
            # The release may have applied; a second one is refused if it did.
            fallback_phase, action, outcome = Phase.RELEASE, self._store.release, Outcome.RELEASED
        elif phase is Phase.CANCEL:
            # A release of a job with a cancel request ends it cancelled in every store
            # (it never runs again), so giving the attempt back cannot loop it.
            fallback_phase, action, outcome = Phase.RELEASE, self._store.release, Outcome.RELEASED
        elif phase in (Phase.NACK, Phase.ABANDON) or job.attempts >= job.max_attempts:
            fallback_phase, outcome = Phase.NACK, Outcome.FAILED
            action = lambda c: self._store.fail(c, reason)  # noqa: E731
        else:
            run_at = self._clock() + DEFAULT_POLICY.delay(job.attempts)
            fallback_phase, outcome = Phase.REQUEUE, Outcome.RETRIED
            action = lambda c: self._store.retry(c, reason, run_at=run_at)  # noqa: E731
        if unknown:
            logger.warning(
                "job %d: %s: outcome unknown: the commit may or may not have happened; "
                "trying %s (refused if it did)",
                job.id,
                phase.value,
                fallback_phase.value,
            )
        try:
            accepted = self.commit(fallback_phase, claim, action)
        except Exception as again:  # noqa: BLE001 - reported by error()
            self._error(fallback_phase, job, again)
            if unknown:
                return Outcome.UNKNOWN
            logger.error(  # noqa: TRY400 - the traceback was just logged
                "job %d: unsettled; it runs again when its lease expires (attempt %d of %d spent)",
                job.id,
                job.attempts,
                job.max_attempts,
            )
            return Outcome.UNSETTLED
        if not accepted:
            if unknown:
                logger.warning(
                    "job %d: %s refused after an unknown commit: the first %s most likely "
                    "applied (or another claim holds the job now); outcome unknown",
                    job.id,
                    fallback_phase.value,
                    phase.value,
                )
                return Outcome.UNKNOWN
            self._log_refused(run, fallback_phase)
            return Outcome.LOST
        logger.warning("job %d: %s instead: %s", job.id, outcome.value, reason)
        return outcome

    def _log_refused(self, run: _R, phase: Phase) -> None:
        job = run.claim.job
        if run.released_at_deadline:
            logger.warning(
                "job %d: %s refused: the job was released at the stop deadline while its "
                "handler still ran; this late outcome is dropped",
                job.id,
                phase.value,
            )
            return
        logger.warning(
            "job %d: %s refused: its lease was taken over by another claim (fencing); "
            "this worker's outcome is dropped",
            job.id,
            phase.value,
        )

    def commit(self, phase: Phase, claim: Claim, action: Callable[[Claim], bool]) -> bool:
        """Make one store call that settles a job, between its two step boundaries."""
        self._before_commit(claim, phase)
        accepted = action(claim)
        self._after_commit(claim, phase)
        return accepted
