"""The diagrams the docs draw from docs/diagrams/*.dot say what the code does."""

from __future__ import annotations

import re
from pathlib import Path

from patterns.jobqueue.stores.records import JobState
from patterns.jobqueue.worker.states import TRANSITIONS, WorkerState

ROOT = Path(__file__).resolve().parent.parent
DIAGRAMS = ROOT / "docs" / "diagrams"
EDGE = re.compile(r"^\s*(\w+)\s*->\s*(\w+)", re.MULTILINE)


def edges(name: str) -> set[tuple[str, str]]:
    """Every ``a -> b`` of a diagram (chains of one line are not used in these files)."""
    return set(EDGE.findall((DIAGRAMS / name).read_text(encoding="utf-8")))


def test_the_worker_diagram_has_exactly_the_transitions_of_the_worker() -> None:
    """An arrow the worker cannot take, or a move it can take without an arrow, fails here."""
    drawn = {(a.lower(), b.lower()) for a, b in edges("worker-states.dot")}
    table = {(a.value, b.value) for a, targets in TRANSITIONS.items() for b in targets}
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


def test_the_parts_diagram_links_every_part_the_worker_wires_to_its_api_page() -> None:
    """A part module the worker imports but the diagram leaves out, or a dead link, fails here."""
    worker = (ROOT / "patterns" / "jobqueue" / "worker" / "worker.py").read_text(encoding="utf-8")
    package = r"patterns\.jobqueue\.worker"
    imported = set(re.findall(rf"^from {package}\.(\w+) import", worker, re.MULTILINE))
    imported |= set(re.findall(rf"^from {package} import (\w+)$", worker, re.MULTILINE))
    imported |= set(
        re.findall(r"^from patterns\.jobqueue\.stores\.(deadline) import", worker, re.M)
    )
    # Values, not parts: the job's outcome.
    parts = (imported - {"outcomes"}) | {"worker", "fallback"}
    drawn = (DIAGRAMS / "worker-parts.dot").read_text(encoding="utf-8")
    linked = set(re.findall(r'(?:URL|href)="\.\./api/jobqueue_(\w+)\.html"', drawn))
    assert parts <= linked, f"parts not drawn: {sorted(parts - linked)}"
    pages = {
        p.stem.removeprefix("jobqueue_") for p in (ROOT / "docs" / "api").glob("jobqueue_*.md")
    }
    assert linked <= pages, f"links to no API page: {sorted(linked - pages)}"


def test_the_drain_budget_is_drawn_to_scale_and_its_caption_gives_the_systemd_split() -> None:
    """Each cell is 4 px tall a second; the caption states the seconds drawn for systemd."""
    drawn = (DIAGRAMS / "stop-budget.dot").read_text(encoding="utf-8")
    cells = re.findall(
        r'<td fixedsize="true" width="\d+" height="(\d+)" bgcolor=[^>]*>(.*?)</td>', drawn
    )
    seconds = [(int(height), int(re.findall(r"(\d+) s", text)[0])) for height, text in cells]
    assert len(seconds) == 7, seconds  # four phases for Kubernetes, three for systemd
    assert all(height == 4 * s for height, s in seconds), seconds
    systemd = drawn[drawn.index("<b>systemd</b>") :]
    drawn_split = [int(s) for s in re.findall(r'bgcolor="[^"]+">.*?(\d+) s', systemd)]
    pages = [
        p for p in (ROOT / "docs").rglob("*.md") if "diagrams/stop-budget.dot" in p.read_text()
    ]
    assert pages, "no page shows the diagram"
    for page in pages:  # the signal handlers page, and the server page beside its stop picture
        text = page.read_text(encoding="utf-8")
        caption = text[text.index("diagrams/stop-budget.dot") :].splitlines()[1]
        assert [int(s) for s in re.findall(r"(\d+) s of", caption)] == drawn_split, caption
