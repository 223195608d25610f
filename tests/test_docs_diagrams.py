"""The diagrams the docs draw from docs/diagrams/*.dot say what the code does."""

from __future__ import annotations

import re
from pathlib import Path

from patterns.jobqueue.store import JobState
from patterns.jobqueue.worker import _TRANSITIONS, WorkerState

DIAGRAMS = Path(__file__).resolve().parent.parent / "docs" / "diagrams"
EDGE = re.compile(r"^\s*(\w+)\s*->\s*(\w+)", re.MULTILINE)


def edges(name: str) -> set[tuple[str, str]]:
    """Every ``a -> b`` of a diagram (chains of one line are not used in these files)."""
    return set(EDGE.findall((DIAGRAMS / name).read_text(encoding="utf-8")))


def test_the_worker_diagram_has_exactly_the_transitions_of_the_worker() -> None:
    """An arrow the worker cannot take, or a move it can take without an arrow, fails here."""
    drawn = {(a.lower(), b.lower()) for a, b in edges("worker-states.dot")}
    table = {(a.value, b.value) for a, targets in _TRANSITIONS.items() for b in targets}
    assert drawn == table
    assert {state for pair in drawn for state in pair} == {s.value for s in WorkerState}


def test_the_job_diagram_has_every_job_state_and_no_other() -> None:
    """The job states drawn are JobState's, and every state can be reached from enqueue."""
    drawn = edges("job-states.dot")
    states = {state for pair in drawn for state in pair} - {"start"}
    assert states == {s.value for s in JobState}
    reached, frontier = set(), {"start"}
    while frontier:
        reached |= frontier
        frontier = {b for a, b in drawn if a in frontier} - reached
    assert reached - {"start"} == states
