"""The job queue's records: a `Job` is made in one call, and stays the dataclass it was.

A store makes a `Job` for every job it hands out, so `Job` writes its own ``__init__``
(the dataclass keeps it), which hands the instance its fields in one call instead of the
frozen dataclass's one ``object.__setattr__`` a field. These tests pin that nothing else
changes, and they are the guard on that ``__init__``: a field added, moved, renamed or
given another default without changing it fails here.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from patterns.jobqueue.stores.records import Job, JobState


def job(**changes: Any) -> Job:
    """A running job, with ``changes``."""
    values: dict[str, Any] = {
        "id": 7,
        "task": "noop",
        "payload": {"n": 1},
        "state": JobState.RUNNING,
        "run_at": 1.0,
        "attempts": 1,
        "max_attempts": 3,
        "lease_owner": "w1",
        "lease_until": 31.0,
        "last_error": None,
        "created_at": 0.5,
        "updated_at": 1.0,
    }
    return Job(**(values | changes))


def test_a_jobs_init_takes_every_field_in_order_with_the_dataclass_defaults() -> None:
    """Positional or keyword, in field order, each field's default: the dataclass's own."""
    parameters = list(inspect.signature(Job).parameters.values())
    fields = dataclasses.fields(Job)
    assert [p.name for p in parameters] == [f.name for f in fields]
    assert [p.default for p in parameters] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default for f in fields
    ]
    assert {p.kind for p in parameters} == {inspect.Parameter.POSITIONAL_OR_KEYWORD}


def test_each_argument_lands_in_its_own_field_by_position_and_by_name() -> None:
    """Fifteen different values: each field holds its own, whichever way it was passed."""
    names = [f.name for f in dataclasses.fields(Job)]
    values = [object() for _ in names]
    assert vars(Job(*values)) == dict(zip(names, values, strict=True))
    assert vars(Job(**dict(zip(names, values, strict=True)))) == dict(
        zip(names, values, strict=True)
    )


def test_a_jobs_init_refuses_arguments_as_the_dataclass_does() -> None:
    """Missing, unknown, doubled and surplus arguments: a TypeError naming the problem."""
    with pytest.raises(TypeError, match="'updated_at'"):
        Job(*range(11))  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="'colour'"):
        job(colour="red")
    with pytest.raises(TypeError, match="multiple values for argument 'id'"):
        Job(*range(12), id=1)  # type: ignore[misc]
    with pytest.raises(TypeError, match="positional"):
        Job(*range(16))  # type: ignore[call-arg]


def test_a_job_made_in_one_call_is_frozen_compared_hashed_and_replaceable() -> None:
    """What the frozen dataclass promised a `Job` still holds."""
    first = job()
    assert (first.timeout, first.result, first.cancel_requested) == (None, None, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.attempts = 2  # type: ignore[misc]
    assert first == job()
    assert hash(job(payload="x")) == hash(job(payload="x"))  # a dict payload is unhashable
    assert first != job(attempts=2)
    later = dataclasses.replace(first, attempts=2, result="ok")
    assert (later.attempts, later.result, later.id) == (2, "ok", 7)
    assert dataclasses.asdict(first)["payload"] == {"n": 1}
    assert repr(first).startswith("Job(id=7, task='noop'")
