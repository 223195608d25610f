"""Fakes shared by the tests of the worker's parts, each built alone (no `Worker`).

`ScriptedStore` is a `MemoryStore` whose next calls can be made to raise and which
records what was asked of it; `Held` is the worker's record of a claim as far as the
settler and its fallback read it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from patterns.jobqueue.stores.memory import MemoryStore
from patterns.jobqueue.stores.records import Claim
from tests.support import FakeClock


class ScriptedStore(MemoryStore):
    """A memory store that records each call the parts make and can make the next ones raise.

    ``raises[name]``: the exceptions the next calls of ``name`` raise, one each (``claim``,
    ``retry``, ``fail``, ``release``). ``calls`` lists the settling calls made (``retry``,
    ``fail``, ``release``); ``limits`` the ``limit`` of each ``claim``, raised or not.
    """

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.calls: list[str] = []
        self.limits: list[int] = []
        self.raises: dict[str, list[Exception]] = {}
        self._calls_lock = threading.Lock()

    def _raise_if_scripted(self, name: str) -> None:
        waiting = self.raises.get(name)
        if waiting:
            raise waiting.pop(0)

    def _call(self, name: str) -> None:
        with self._calls_lock:
            self.calls.append(name)
            self._raise_if_scripted(name)

    def claim(self, owner: str, *, lease: float, limit: int = 1) -> list[Claim]:
        """`MemoryStore.claim`, its limit recorded; raises first if scripted to."""
        with self._calls_lock:
            self.limits.append(limit)
            self._raise_if_scripted("claim")
        return super().claim(owner, lease=lease, limit=limit)

    def retry(self, claim: Claim, error: str, *, run_at: float) -> bool:
        """`MemoryStore.retry`, recorded; raises first if scripted to."""
        self._call("retry")
        return super().retry(claim, error, run_at=run_at)

    def fail(self, claim: Claim, error: str) -> bool:
        """`MemoryStore.fail`, recorded; raises first if scripted to."""
        self._call("fail")
        return super().fail(claim, error)

    def release(self, claim: Claim) -> bool:
        """`MemoryStore.release`, recorded; raises first if scripted to."""
        self._call("release")
        return super().release(claim)


@dataclass
class Held:
    """The worker's record of a claim, as far as the settler and its fallback read it."""

    claim: Claim
    released_at_deadline: bool = False
