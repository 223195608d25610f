"""What a job runs: handlers registered by name, their context, and the policies around them.

TL;DR: ``@tasks.task`` registers ``fn(payload, ctx)`` on a `TaskRegistry`; ``ctx.sleep`` and
``ctx.check`` raise `Interrupted` once the worker cancels the job; a failure policy (by
default `Backoff`) answers `Retry` or `Fail`, and ``ready(job)`` with its unreadiness policy
decides whether a job runs now.

Pitfall:
    A queue that imports the handler named in a job row (or unpickles its payload) lets
    anyone who can write the queue run code. A job stopped by a shutdown that is recorded
    as failed loses an attempt and its place in line. A retry policy with no cap, or a
    "not ready yet" that requeues forever, loops a poison job for ever. And an error in
    a hook or a policy, reported without saying where it happened, cannot be told apart
    from a failed acknowledgement.

Pattern:
    Handlers are looked up by task name in a registry the worker's process built itself;
    payloads are JSON. The handler gets a `JobContext` with a ``CancelToken`` from
    ``patterns.cancellation``; `Interrupted` is that module's ``Cancelled``, which the
    worker maps to "release the job unchanged". Policies are plain callables returning
    `Retry` or `Fail`; the job's ``max_attempts`` caps every `Retry`. Errors outside the
    handler are `PhaseError` values tagged with qdolor's `Phase` names.

Guarantees:
    * `JobContext.sleep` and `JobContext.check` raise `Interrupted` as soon as the job's
      token is cancelled, and at every later call.
    * `Interrupted` derives from ``BaseException``: ``except Exception`` never swallows it.
    * A task name is registered once; `TaskRegistry.enqueue` refuses a name nobody
      registered, before anything is written.
    * `Backoff.delay` grows exponentially, never exceeds ``cap``, and jitter only
      shortens it (by at most the ``jitter`` fraction).

Python:
    3.11+. Nothing version-specific.

Java:
    Proletarian's ``handle-job!`` multimethod is the registry; its retry strategy
    (``:retries``, ``:delays``) is a failure policy; ``InterruptedException`` is
    `Interrupted`. qdolor's task configuration (``ready?``, the two policies, the three
    hooks) is the registry's tasks and hooks.

See also:
    ``patterns.jobqueue.worker.worker`` (the order in which all of these are called),
    ``patterns.cancellation`` (the token).
"""

from __future__ import annotations

import enum
import logging
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeAlias, overload

from patterns import cancellation
from patterns.cancellation import Cancelled
from patterns.jobqueue.stores.checks import check_timeout
from patterns.jobqueue.stores.protocol import SharedStore
from patterns.jobqueue.stores.records import (
    DEFAULT_MAX_ATTEMPTS,
    MAX_ATTEMPTS_LIMIT,
    Job,
    JsonValue,
)

__all__ = [
    "Backoff",
    "Decision",
    "Fail",
    "FailurePolicy",
    "Handler",
    "Interrupted",
    "JobContext",
    "Phase",
    "PhaseError",
    "Retry",
    "Task",
    "TaskRegistry",
    "UnreadinessPolicy",
    "requeue_after",
]

logger = logging.getLogger(__name__)


class Interrupted(Cancelled):
    """The job was stopped by its worker, not failed: it goes back to the queue unchanged.

    Raised by `JobContext.sleep` and `JobContext.check` once the worker cancels the job's
    token: in the CANCELLING phase of a shutdown, or when the heartbeat finds the job's
    lease was taken over. The worker then releases the job: its attempt is given back
    and it keeps its original ``run_at`` (Proletarian's rule: interrupted is not failed).

    It is a ``Cancelled``, hence a `BaseException`: the ``except Exception:`` a handler
    uses to skip a bad record does not swallow it. A handler that catches it on purpose
    and returns normally has finished its job, which is then marked done.
    """


@dataclass(frozen=True)
class Retry:
    """Decision: queue the job again ``delay`` seconds from now (the attempt stays counted)."""

    delay: float


@dataclass(frozen=True)
class Fail:
    """Decision: end the job ``failed`` with ``reason`` (the error's text when None)."""

    reason: str | None = None


Decision: TypeAlias = Retry | Fail
Handler: TypeAlias = Callable[[JsonValue, "JobContext"], object]
FailurePolicy: TypeAlias = Callable[[Job, BaseException], Decision]
UnreadinessPolicy: TypeAlias = Callable[[Job], Decision]


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter, usable as a failure policy.

    The delay after attempt ``n`` is ``base * factor ** (n - 1)``, capped at ``cap``, then
    multiplied by a random factor in ``[1 - jitter, 1]`` so that jobs that failed together
    do not all come back at the same instant. ``jitter=0`` makes it exact.
    """

    base: float = 1.0
    factor: float = 2.0
    cap: float = 300.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < 0 or self.factor < 1:
            raise ValueError("Backoff needs base >= 0, cap >= 0 and factor >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("Backoff jitter is a fraction between 0 and 1")

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1 for the first)."""
        try:
            grown = self.base * self.factor ** max(0, attempt - 1)
        except OverflowError:  # past a float's range (2.0 ** 1024), so far past any cap
            grown = math.inf
        return min(self.cap, grown) * (1 - self.jitter * rand())

    def __call__(self, job: Job, error: BaseException) -> Decision:
        """Retry every failure after `delay` (the worker stops at ``max_attempts``)."""
        return Retry(self.delay(job.attempts))


def requeue_after(delay: float) -> UnreadinessPolicy:
    """An unreadiness policy: put a job that is not ready back, ``delay`` seconds later."""

    def policy(job: Job) -> Decision:
        return Retry(delay)

    policy.__qualname__ = f"requeue_after({delay!r})"
    return policy


DEFAULT_NOT_READY_DELAY = 1.0
_REQUEUE_AFTER_DEFAULT = requeue_after(DEFAULT_NOT_READY_DELAY)


@dataclass(frozen=True)
class Task:
    """One registered handler and its policies; made by `TaskRegistry.task`.

    Attributes:
        name: the task name jobs carry.
        fn: the handler, ``fn(payload, ctx)``.
        max_attempts: the default ``max_attempts`` of jobs enqueued through
            `TaskRegistry.enqueue`; the worker obeys the value stored in the job.
        timeout: the default seconds a handler may run per attempt, or None (no limit);
            a job's own ``timeout`` (set at enqueue) wins. The worker puts the deadline
            on the handler's token: a handler that stops there fails the attempt with
            "timed out after Xs" (the failure policy decides about a retry).
        retry: the failure policy: `Retry` or `Fail` for a job whose handler raised.
        ready: the readiness check, or None for "always ready".
        not_ready: the policy for a job whose check said no.
    """

    name: str
    fn: Handler
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retry: FailurePolicy = Backoff()
    ready: Callable[[Job], bool] | None = None
    not_ready: UnreadinessPolicy = _REQUEUE_AFTER_DEFAULT
    timeout: float | None = None


class Phase(enum.StrEnum):
    """Where in a job's life an unexpected error happened (qdolor's phase names).

    There is no phase for the handler itself: its exceptions are job failures and go to
    the failure policy. The last four phases are this worker's additions.
    """

    DEQUEUE = "dequeue"  # store.claim / store.next_due in the claiming thread
    READY = "ready"  # the task's readiness check
    ACK = "ack"  # store.complete after success
    ON_COMPLETE = "on_complete"
    GET_FAILURE_POLICY = "get_failure_policy"
    REQUEUE = "requeue"  # store.retry (a failure or a job that was not ready)
    NACK = "nack"  # store.fail after a failure
    ON_FAILURE = "on_failure"
    GET_UNREADINESS_POLICY = "get_unreadiness_policy"
    ABANDON = "abandon"  # store.fail for a job that was not ready
    ON_UNREADINESS = "on_unreadiness"
    RELEASE = "release"  # store.release: interrupted, never started, or the fallback
    CANCEL = "cancel"  # store.mark_cancelled: the handler stopped on an operator's cancel
    HEARTBEAT = "heartbeat"  # store.renew in the heartbeat thread
    ON_SHUTDOWN = "on_shutdown"


class PhaseError(Exception):
    """An error outside the handler, tagged with its `Phase` and job; the cause is chained.

    Attributes:
        phase: where it happened.
        job: the job being processed, or None (a failed claim has no job yet).
    """

    def __init__(self, phase: Phase, job: Job | None, cause: BaseException) -> None:
        where = "" if job is None else f" (job {job.id}, task {job.task!r})"
        super().__init__(f"{phase.value} failed{where}: {describe_error(cause)}")
        self.phase = phase
        self.job = job
        self.__cause__ = cause


def describe_error(error: BaseException) -> str:
    """``"Type: message"`` for a log line or ``last_error``, even if ``str(error)`` raises.

    The error comes from a handler or a hook, so its ``__str__`` is someone else's code:
    if formatting it failed, the worker thread that was recording the failure would die.
    """
    try:
        message = str(error)
    except Exception:  # noqa: BLE001 - any failure of foreign code; the type still names it
        message = f"<str() of this {type(error).__name__} raised>"
    return f"{type(error).__name__}: {message}"


class JobContext:
    """What a handler gets besides its payload: the job, its token, and checkpoints.

    Attributes:
        job: the job as it was claimed (``job.attempts`` counts this attempt).
        worker: the name of the worker running the job (its lease owner prefix).

    The job's ``CancelToken`` is `token`. It may be given as a function that makes it:
    the function is then called when the token is first asked for, so a handler that
    never looks at its token costs none (the worker passes one).
    """

    def __init__(
        self,
        job: Job,
        token: cancellation.CancelToken | Callable[[], cancellation.CancelToken],
        *,
        worker: str = "",
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        self.job = job
        if isinstance(token, cancellation.CancelToken):
            self._token: cancellation.CancelToken | None = token
        elif callable(token):
            self._token, self._make_token = None, token
        else:
            raise TypeError(f"token must be a CancelToken or a function making one, not {token!r}")
        self.worker = worker
        self._stopping = stopping
        # The reason of the first Interrupted that sleep() or check() raised, or None:
        # the worker tells a handler that stopped at its deadline and returned from one
        # that finished.
        self.interrupted: str | None = None

    def __repr__(self) -> str:
        return f"<JobContext job={self.job.id} attempt={self.attempt} worker={self.worker!r}>"

    @property
    def token(self) -> cancellation.CancelToken:
        """The job's ``CancelToken`` (made now, if it was given as a function).

        Pass it to ``patterns.cancellation`` helpers, or register an ``on_cancel``
        callback to unblock a call that takes no token.
        """
        token = self._token
        if token is None:
            token = self._token = self._make_token()
        return token

    @property
    def job_id(self) -> int:
        """The job's id."""
        return self.job.id

    @property
    def attempt(self) -> int:
        """The number of this attempt, 1 for the first run (expired claims count too)."""
        return self.job.attempts

    @property
    def stopping(self) -> bool:
        """True once the worker has begun to shut down (DRAINING or later).

        The job's token is cancelled only later, when the drain budget is spent; a long
        job that can stop cheaply may look here and raise `Interrupted` itself, earlier.
        """
        return self._stopping()

    def sleep(self, seconds: float) -> None:
        """Sleep like `time.sleep`, but raise `Interrupted` as soon as the job is cancelled."""
        try:
            self.token.sleep(seconds)
        except Cancelled as exc:
            self.interrupted = self.interrupted or exc.reason
            raise Interrupted(exc.reason) from None

    def check(self) -> None:
        """Raise `Interrupted` if the job is cancelled; the checkpoint for CPU loops."""
        try:
            self.token.check()
        except Cancelled as exc:
            self.interrupted = self.interrupted or exc.reason
            raise Interrupted(exc.reason) from None


class TaskRegistry:
    """Handlers by task name, plus the lifecycle hooks every task shares.

    Hooks are called by the worker after the store has recorded the outcome (qdolor
    0.2's order: backend first, then hook), so a hook never runs for an outcome the
    store refused, and a hook's exception cannot undo the outcome:

    * ``on_complete(job, result)`` after the job was marked done, and only when that is
      known: after a commit whose outcome is unknown (the connection broke during
      ``COMMIT``; the worker's ``Outcome.UNKNOWN``) it is not called, though the job may
      well be done;
    * ``on_failure(job, error, decision)`` after it was marked failed for good;
    * ``on_unreadiness(job, decision)`` after a job that was not ready was abandoned;
    * ``on_unexpected_error(error)`` for every `PhaseError`; its own exceptions are
      logged and ignored.
    """

    def __init__(
        self,
        *,
        on_complete: Callable[[Job, object], object] | None = None,
        on_failure: Callable[[Job, BaseException, Fail], object] | None = None,
        on_unreadiness: Callable[[Job, Fail], object] | None = None,
        on_unexpected_error: Callable[[PhaseError], object] | None = None,
    ) -> None:
        self.on_complete = on_complete
        self.on_failure = on_failure
        self.on_unreadiness = on_unreadiness
        self.on_unexpected_error = on_unexpected_error
        self._tasks: dict[str, Task] = {}

    def __repr__(self) -> str:
        return f"<TaskRegistry {sorted(self._tasks)}>"

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._tasks))

    def __len__(self) -> int:
        return len(self._tasks)

    def get(self, name: str) -> Task | None:
        """The task registered under ``name``, or None."""
        return self._tasks.get(name)

    def add(self, task: Task) -> Task:
        """Register ``task``; `ValueError` if its name is taken."""
        if not task.name or not isinstance(task.name, str):
            raise ValueError(f"a task name must be a non-empty string, got {task.name!r}")
        if isinstance(task.max_attempts, bool) or not isinstance(task.max_attempts, int):
            raise TypeError(f"task {task.name!r}: max_attempts must be an int")
        if task.max_attempts < 1:
            raise ValueError(f"task {task.name!r}: max_attempts must be at least 1")
        if task.max_attempts > MAX_ATTEMPTS_LIMIT:
            raise ValueError(
                f"task {task.name!r}: max_attempts must be at most {MAX_ATTEMPTS_LIMIT},"
                f" got {task.max_attempts}"
            )
        try:
            check_timeout(task.timeout)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"task {task.name!r}: {exc}") from None
        if task.name in self._tasks:
            raise ValueError(f"task {task.name!r} is already registered")
        self._tasks[task.name] = task
        return task

    @overload
    def task(self, fn: Handler, /) -> Handler: ...

    @overload
    def task(
        self,
        *,
        name: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        retry: FailurePolicy | None = None,
        ready: Callable[[Job], bool] | None = None,
        not_ready: UnreadinessPolicy | None = None,
        timeout: float | None = None,
    ) -> Callable[[Handler], Handler]: ...

    def task(
        self,
        fn: Handler | None = None,
        *,
        name: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        retry: FailurePolicy | None = None,
        ready: Callable[[Job], bool] | None = None,
        not_ready: UnreadinessPolicy | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Register a handler: ``@tasks.task`` or ``@tasks.task(name=..., retry=...)``.

        ``name`` defaults to the function's ``__name__``; ``retry`` to `Backoff()`;
        ``not_ready`` to ``requeue_after(1.0)``. The function is returned unchanged, so
        it can still be called directly in tests.
        """

        def register(handler: Handler) -> Handler:
            self.add(
                Task(
                    name=name or str(getattr(handler, "__name__", "")),
                    fn=handler,
                    max_attempts=max_attempts,
                    retry=retry if retry is not None else Backoff(),
                    ready=ready,
                    not_ready=not_ready if not_ready is not None else _REQUEUE_AFTER_DEFAULT,
                    timeout=timeout,
                )
            )
            return handler

        return register if fn is None else register(fn)

    def enqueue(
        self,
        store: SharedStore,
        name: str,
        payload: JsonValue = None,
        *,
        run_at: float | None = None,
        delay: float | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
    ) -> int:
        """Enqueue a job for a registered task, with the task's defaults for the rest.

        ``max_attempts`` and ``timeout`` default to the task's (`get` returns the `Task`,
        so a command line can show or use them too).

        Raises `LookupError` for a name nobody registered, so a typo fails here, in the
        producer, instead of as an "unknown task" failure in a worker later.
        """
        task = self._tasks.get(name)
        if task is None:
            raise LookupError(f"unknown task {name!r}; registered: {sorted(self._tasks)}")
        return store.enqueue(
            name,
            payload,
            run_at=run_at,
            delay=delay,
            max_attempts=task.max_attempts if max_attempts is None else max_attempts,
            timeout=task.timeout if timeout is None else timeout,
        )
