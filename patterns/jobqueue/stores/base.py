"""What the stores of this package share as code: a base class and two ways to settle.

`StoreBase`, the base class of `~.MemoryStore`, `~.SQLiteStore` and `~.PostgresStore`,
writes once the methods whose arguments every store checks alike: the five single-job
outcome methods (`SingleOutcomes`, on one ``_settle_one`` a store provides),
`~.Store.enqueue` (on ``_enqueue``) and `~.Store.record_worker` (on ``_record_worker``).
`settle_each` and `settle_only` give a store of one's own `~.Store.settle_many` and
`~.Store.settle_and_claim` from its single-job methods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from patterns.jobqueue.stores.checks import (
    check_lease,
    check_owner,
    check_share_limit,
    check_time,
    check_worker,
    encode_result,
    storable_error,
)
from patterns.jobqueue.stores.protocol import Store, WorkerStore
from patterns.jobqueue.stores.records import (
    DEFAULT_MAX_ATTEMPTS,
    Claim,
    JsonValue,
    Settle,
    Settlement,
    WorkerRow,
)

__all__ = ["SingleOutcomes", "StoreBase", "settle_each", "settle_only"]


class SingleOutcomes(Store):
    """The five single-job outcome methods of `~.Store`, on one method a store provides.

    `~.Store.complete`, `~.Store.fail`, `~.Store.retry`, `~.Store.release` and
    `~.Store.mark_cancelled` check their arguments alike on every store (a result through
    `~.encode_result`, an error through `~.storable_error`, a retry's ``run_at`` through
    `~.check_time`), then apply one outcome in its own transaction, fenced by the claim's
    token: ``_settle_one(claim, kind, text, when)``, which a store subclassing this
    implements (``text`` and ``when`` as `~.prepare_settlement` returns them).
    """

    _max_payload_bytes: int

    def _settle_one(self, claim: Claim, kind: Settle, text: str | None, when: float) -> bool:
        """Apply one checked outcome in its own transaction; False if the lease is gone."""
        raise NotImplementedError

    def complete(self, claim: Claim, result: JsonValue = None) -> bool:
        text = None if result is None else encode_result(result, self._max_payload_bytes)
        return self._settle_one(claim, Settle.COMPLETE, text, 0.0)

    def fail(self, claim: Claim, error: str) -> bool:
        return self._settle_one(claim, Settle.FAIL, storable_error(error), 0.0)

    def retry(self, claim: Claim, error: str, *, run_at: float) -> bool:
        when = check_time("run_at", run_at)
        return self._settle_one(claim, Settle.RETRY, storable_error(error), when)

    def release(self, claim: Claim) -> bool:
        return self._settle_one(claim, Settle.RELEASE, None, 0.0)

    def mark_cancelled(self, claim: Claim, reason: str) -> bool:
        return self._settle_one(claim, Settle.CANCEL, storable_error(reason), 0.0)


class StoreBase(SingleOutcomes):
    """``SingleOutcomes``, and `~.Store.enqueue` and `~.Store.record_worker`, written once.

    Both take many arguments that every store checks alike, so the stores share them too:
    ``enqueue`` hands ``_enqueue`` its arguments as one mapping (what `~.prepare_enqueue`
    takes, like an item of `~.Store.enqueue_many`), and ``record_worker`` hands
    ``_record_worker`` the `~.WorkerRow` that `~.check_worker` returns. A store subclassing
    this implements those two, and ``_settle_one``.
    """

    def _enqueue(self, spec: Mapping[str, Any]) -> int:
        """Check ``spec`` with `~.prepare_enqueue`, insert the job, and return its id."""
        raise NotImplementedError

    def _record_worker(self, row: WorkerRow) -> None:
        """Insert or update the worker's row, checked, in its own transaction."""
        raise NotImplementedError

    def enqueue(
        self,
        task: str,
        payload: JsonValue = None,
        *,
        run_at: float | None = None,
        delay: float | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | None = None,
    ) -> int:
        return self._enqueue(
            {
                "task": task,
                "payload": payload,
                "run_at": run_at,
                "delay": delay,
                "max_attempts": max_attempts,
                "timeout": timeout,
            }
        )

    def record_worker(
        self,
        worker_id: str,
        *,
        host: str,
        pid: int,
        state: str,
        started_at: float,
        jobs_held: int,
        ttl: float,
    ) -> None:
        self._record_worker(
            check_worker(
                worker_id,
                host=host,
                pid=pid,
                state=state,
                started_at=started_at,
                jobs_held=jobs_held,
                ttl=ttl,
            )
        )


def settle_each(store: WorkerStore, items: Sequence[Settlement]) -> list[bool | Exception]:
    """`~.Store.settle_many`'s meaning, one single-job call (one transaction) per item.

    Not atomic across items: a store error part-way raises with the earlier items applied.
    """
    done: list[bool | Exception] = []
    for item in items:
        claim = item.claim
        try:
            if item.kind is Settle.COMPLETE:
                done.append(store.complete(claim, item.result))
            elif item.kind is Settle.FAIL:
                done.append(store.fail(claim, item.error))
            elif item.kind is Settle.RETRY:
                done.append(store.retry(claim, item.error, run_at=item.run_at))
            elif item.kind is Settle.RELEASE:
                done.append(store.release(claim))
            else:
                done.append(store.mark_cancelled(claim, item.error))
        except (TypeError, ValueError) as exc:  # the item's own data, not the store
            done.append(exc)
    return done


def settle_only(
    store: WorkerStore, items: Sequence[Settlement], owner: str, *, lease: float, limit: int
) -> tuple[list[bool | Exception], list[Claim]]:
    """`~.Store.settle_and_claim` for a store whose claim cannot join its outcomes' transaction.

    Checks ``owner``, ``lease`` and ``limit`` as the shared transaction does, records the
    outcomes with `~.Store.settle_many`, and claims nothing: a worker frees the slots it had
    reserved for the claims, and its claiming thread claims for them in a transaction of
    its own.
    """
    count = check_share_limit(limit)
    if count:
        check_owner(owner)
        check_lease(lease)
    return store.settle_many(items), []
