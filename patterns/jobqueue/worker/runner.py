"""One job's run: call its handler with a cancellable token, and decide its outcome.

TL;DR: `JobRunner.run` takes a claim the ledger moved to RUNNING, calls the task's
handler with a `~patterns.jobqueue.tasks.JobContext`, and decides the job's outcome as a
`~patterns.jobqueue.worker.fallback.Pending` for the settler; it writes nothing.

Pattern:
    Cooperative cancellation (``patterns.cancellation``): the handler's token is a child
    of the job's, which is a child of the worker's, so a stop, a lost lease, an
    operator's cancel and the job's own timeout all reach it the same way, and its reason
    says which. A job's life follows qdolor's lifecycle, the store call before the hook::

        claim -> ready? -- no --> unreadiness policy -> requeue | abandon -> on_unreadiness
                        -- yes -> handler -> returned: ack (complete) -> on_complete
                                          -> raised: failure policy -> requeue
                                                                    | nack (fail) -> on_failure
                                          -> token cancelled: release (interrupted)

Guarantees:
    * Every path decides exactly one outcome: done, retried, failed, released or
      cancelled; a policy that raises or answers nonsense is replaced by the default
      (`~patterns.jobqueue.worker.outcomes.decide`) and reported.
    * A `~patterns.jobqueue.tasks.Retry` on the last attempt becomes a
      `~patterns.jobqueue.tasks.Fail`; every reason is storable.
    * A handler that stops at its timeout fails the attempt with "timed out after Xs";
      one that stops at an operator's cancel ends ``cancelled``; one stopped by the
      worker's stop is released, its attempt given back.

See also: ``patterns.jobqueue.worker.handlers`` (the thread loop that calls it),
``patterns.jobqueue.worker.outcomes`` (the decision), ``patterns.jobqueue.tasks`` (policies).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial

from patterns.cancellation import DEADLINE_EXCEEDED, Cancelled, CancelToken
from patterns.jobqueue.stores.checks import storable_error
from patterns.jobqueue.stores.records import Settle, Settlement
from patterns.jobqueue.tasks import (
    Decision,
    Fail,
    JobContext,
    Phase,
    Retry,
    Task,
    TaskRegistry,
    describe_error,
)
from patterns.jobqueue.worker.fallback import Pending
from patterns.jobqueue.worker.ledger import ClaimLedger, Held
from patterns.jobqueue.worker.outcomes import DEFAULT_POLICY, Outcome, decide
from patterns.jobqueue.worker.shared import Shared
from patterns.jobqueue.worker.states import Step

__all__ = ["JobRunner"]

logger = logging.getLogger(__name__)

_Hook = Callable[..., None]


class JobRunner:
    """Runs one job's handler and decides its outcome; see the module docstring.

    Collaborators: ``shared`` (the worker's name, the store's clock for a retry's run
    time, ``error(phase, job, exc)`` and the step hook); ``tasks``, the handlers,
    policies and hooks; ``ledger``, for the handler's token and the timeout count;
    ``stopping()``: is the worker stopping (what ``ctx.stopping()`` answers); ``hook(phase,
    job, fn, *args)``: run a task's hook, errors contained. One runner serves every
    handler thread: what it knows of a job is in its
    `~patterns.jobqueue.worker.ledger.Held` record.
    """

    def __init__(
        self,
        shared: Shared,
        tasks: TaskRegistry,
        ledger: ClaimLedger,
        *,
        stopping: Callable[[], bool],
        hook: _Hook,
    ) -> None:
        self._tasks, self._ledger, self._owner = tasks, ledger, shared.owner
        self._clock, self._error, self._step = shared.clock, shared.error, shared.step
        self._stopping, self._hook = stopping, hook
        # Without a step hook (the default) its no-op is not called: four calls a job.
        self._stepping = shared.stepping

    def run(self, run: Held) -> Pending[Held] | None:
        """Run the job and return its decided outcome (None: no decision was made)."""
        run.pending = None
        task = self._tasks.get(run.claim.job.task)
        # The checks before the handler, only where one may apply (every job passes here).
        if task is None or task.ready is not None or run.cancel_requested:
            task = self._before_handler(run)
        if task is not None:
            self._call_handler(run, task)
        return run.pending

    def _before_handler(self, run: Held) -> Task | None:
        """The task to run, or None once a job that must not run now is decided."""
        job = run.claim.job
        task = self._tasks.get(job.task)
        if task is None:
            reason = f"unknown task {job.task!r}: no handler registered under that name"
            self._retry_or_fail(run, reason, lambda: Fail(reason))
            return None
        if task.ready is not None:
            try:
                ready = bool(task.ready(job))
            except Exception as exc:  # noqa: BLE001 - reported by error()
                self._error(Phase.READY, job, exc)
                self._after_failure(run, None, exc)
                return None
            if not ready:
                self._not_ready(run, task)
                return None
        if run.cancel_requested:  # cancelled by an operator while it waited: never run
            self._cancelled(run)
            return None
        return task

    def _call_handler(self, run: Held, task: Task) -> None:
        job = run.claim.job
        limit = job.timeout if job.timeout is not None else task.timeout
        # The handler's token: the job's (stop, lease lost, operator's cancel) plus its
        # own deadline, which cancels only this child, with DEADLINE_EXCEEDED as reason.
        # Without a deadline it is the job's token itself, made only if the handler
        # looks at it (`ClaimLedger.job_token`): most never do.
        token: CancelToken | None = None
        if limit is not None:
            token = self._ledger.job_token(run).child(timeout=limit)
            with self._ledger.cond:
                run.handler_token, run.timeout = token, limit
        ctx = JobContext(
            job,
            token if token is not None else partial(self._ledger.job_token, run),
            worker=self._owner,
            stopping=self._stopping,
        )
        if logger.isEnabledFor(logging.DEBUG):  # every job passes here: no call when not logged
            logger.debug("job %d (%s) attempt %d: running", job.id, job.task, job.attempts)
        if self._stepping:
            self._step(Step.BEFORE_HANDLER, run.claim, None)
        began = time.monotonic()
        try:
            result = task.fn(job.payload, ctx)
        except BaseException as exc:  # noqa: BLE001 - every handler error is a job outcome
            if self._stepping:
                self._step(Step.AFTER_HANDLER, run.claim, None)
            token = ctx.token  # made now if the handler never looked: was the job cancelled?
            if token.cancelled:
                self._stopped_by_token(run, task, token, exc)
                return
            if isinstance(exc, Cancelled):
                logger.warning("job %d: the handler raised Cancelled of its own token", job.id)
            self._after_failure(run, task, exc)
            return
        if self._stepping:
            self._step(Step.AFTER_HANDLER, run.claim, None)
        if ctx.interrupted == DEADLINE_EXCEEDED and not self._ledger.job_token(run).cancelled:
            # It saw its deadline (a checkpoint raised) and returned: it stopped there.
            self._timed_out(run, task)
            return
        if run.cancel_requested:
            logger.info(
                "job %d (%s): the handler ignored the operator's cancel and finished: "
                "completing it",
                job.id,
                job.task,
            )
        # Decided done, as `_decide` decides (inline: every completed job passes here).
        complete = Settlement(Settle.COMPLETE, run.claim, result)
        run.pending = Pending(run, Phase.ACK, complete, Outcome.DONE, None, began)
        if self._stepping:
            self._step(Step.BEFORE_GROUP_COMMIT, run.claim, Phase.ACK)

    def _stopped_by_token(
        self, run: Held, task: Task, token: CancelToken, exc: BaseException
    ) -> None:
        """The handler raised once its token was cancelled: why decides the outcome."""
        job = run.claim.job
        if run.cancel_requested:
            self._cancelled(run)
            return
        if token.reason == DEADLINE_EXCEEDED and not self._ledger.job_token(run).cancelled:
            self._timed_out(run, task)
            return
        # Interrupted by a stop (or a lost lease), or an error raised on the way out of a
        # cancelled job: given back unchanged (Proletarian leaves such a job queued too).
        logger.info("job %d: interrupted (%s): releasing it (%s)", job.id, token.reason, exc)
        self._decide(run, Phase.RELEASE, Settlement(Settle.RELEASE, run.claim), Outcome.RELEASED)

    def _cancelled(self, run: Held) -> None:
        job = run.claim.job
        logger.info("job %d (%s): cancelled by operator; its handler stopped", job.id, job.task)
        item = Settlement(Settle.CANCEL, run.claim, error="cancelled by operator")
        self._decide(run, Phase.CANCEL, item, Outcome.CANCELLED)

    def _timed_out(self, run: Held, task: Task) -> None:
        """The handler stopped at its deadline: a failed attempt, for the failure policy."""
        with self._ledger.cond:
            self._ledger.timed_out += 1
        limit = run.timeout or 0.0
        self._after_failure(run, task, TimeoutError(f"timed out after {limit:g}s"))

    def _after_failure(self, run: Held, task: Task | None, error: BaseException) -> None:
        """The handler raised (or ``ready`` did, ``task`` None): the failure policy decides."""
        job = run.claim.job
        self._retry_or_fail(
            run,
            describe_error(error),
            None if task is None else lambda: task.retry(job, error),
            fallback=lambda: DEFAULT_POLICY(job, error),
            policy_phase=Phase.GET_FAILURE_POLICY,
            on_fail=lambda d: self._hook(
                Phase.ON_FAILURE, job, self._tasks.on_failure, job, error, d
            ),
        )

    def _not_ready(self, run: Held, task: Task) -> None:
        # The store has no "postpone": a requeue counts as an attempt, so a job that is
        # never ready is abandoned once its attempts are spent instead of looping forever.
        job = run.claim.job
        self._retry_or_fail(
            run,
            "not ready",
            lambda: task.not_ready(job),
            fallback=lambda: Retry(1.0),
            policy_phase=Phase.GET_UNREADINESS_POLICY,
            fail_phase=Phase.ABANDON,
            on_fail=lambda d: self._hook(
                Phase.ON_UNREADINESS, job, self._tasks.on_unreadiness, job, d
            ),
        )

    def _retry_or_fail(
        self,
        run: Held,
        text: str,
        policy: Callable[[], object] | None,
        *,
        fallback: Callable[[], Decision] = lambda: Fail(""),
        policy_phase: Phase = Phase.GET_FAILURE_POLICY,
        fail_phase: Phase = Phase.NACK,
        on_fail: Callable[[Decision], object] | None = None,
    ) -> None:
        """The one path of a job that did not complete: decide, requeue or fail, then hook.

        ``policy`` decides (``fallback`` does if it is None, raises or returns no
        `Decision`); a `Retry` on the last attempt becomes a `Fail`; the store call
        settles the job; ``on_fail`` runs only once the store accepted the `Fail`.
        """
        job = run.claim.job
        text = storable_error(text)  # what the store keeps: never a reason to raise
        decision, error = decide(job, text, policy, fallback)
        if error is not None:
            self._error(policy_phase, job, error)
        where = f"job {job.id} ({job.task}) attempt {job.attempts} of {job.max_attempts}"
        if isinstance(decision, Retry):
            run_at = self._clock() + decision.delay
            logger.warning("%s: %s: requeued in %.2fs", where, text, decision.delay)
            item = Settlement(Settle.RETRY, run.claim, error=text, run_at=run_at)
            self._decide(run, Phase.REQUEUE, item, Outcome.RETRIED)
            return
        reason = storable_error(decision.reason or text)
        verb = "abandoned" if fail_phase is Phase.ABANDON else "failed for good"
        logger.error("%s: %s: %s", where, verb, reason)
        final = decision
        self._decide(
            run,
            fail_phase,
            Settlement(Settle.FAIL, run.claim, error=reason),
            Outcome.FAILED,
            then=None if on_fail is None else lambda: on_fail(final),
        )

    def _decide(
        self,
        run: Held,
        phase: Phase,
        item: Settlement,
        success: Outcome,
        *,
        then: Callable[[], object] | None = None,
        began: float | None = None,
    ) -> None:
        """The job's outcome, decided: the settler commits it and runs ``then`` on success."""
        run.pending = Pending(run, phase, item, success, then, began)
        if self._stepping:
            self._step(Step.BEFORE_GROUP_COMMIT, run.claim, phase)
