"""Links a reader follows: notebook links that work in JupyterLab and on the site, CPython issues.

A notebook is opened in two places: in JupyterLab from ``notebooks/``, and on the site, where
``docs/notebooks`` is a link to that folder and MyST resolves a relative link to a ``.md``
file as a link to the rendered page. So a notebook links a docs page by the relative path of
its source, which exists from ``notebooks/`` and names a page of the site; MyST-only syntax
(``{doc}`...```) is shown raw by Jupyter and is not used.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

LINK = re.compile(r"(?<!!)\[[^\]]+\]\(([^)\s]+)\)")
MYST_ROLE = re.compile(r"\{[a-z][\w:-]*\}`")
HEADING = re.compile(r"^#{1,3} +(.+?) *$", re.MULTILINE)
# A CPython issue number written as text: the docs link it with {gh}`NNNNN` (:gh: in a
# docstring), a notebook with a Markdown link.
BARE_GH = re.compile(r"(?<![\w\[/`{-])gh-\d{4,6}\b")


def markdown(notebook: Path) -> str:
    """The Markdown cells of a notebook, one after another."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def slug(heading: str) -> str:
    """The anchor MyST gives a heading (``myst_heading_anchors``)."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"\s", "-", text)


def link_problem(notebook: Path, target: str) -> str | None:
    """Why ``target`` fails in JupyterLab or on the site, or None when it works in both."""
    if re.match(r"[a-z]+:", target):
        return None  # an absolute URL works everywhere
    path, _, anchor = target.partition("#")
    source = (notebook.parent / path).resolve()
    if not source.is_file():
        return f"{target}: no such file from {notebook.parent.name}/ (JupyterLab)"
    try:
        page = source.relative_to(DOCS)
    except ValueError:
        return f"{target}: outside docs/, not a page of the site"
    if page.suffix not in {".md", ".ipynb"} or page.parts[0] in {"_build", "_ext", "_static"}:
        return f"{target}: not a page of the site"
    if anchor and anchor not in {slug(h) for h in HEADING.findall(source.read_text("utf-8"))}:
        return f"{target}: no heading with the anchor #{anchor}"
    return None


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[n.stem for n in NOTEBOOKS])
def test_notebook_links_work_in_jupyterlab_and_on_the_site(notebook: Path) -> None:
    """Every link resolves from notebooks/ to a docs page; no MyST-only role shows raw."""
    text = markdown(notebook)
    targets = LINK.findall(text)
    assert any(not re.match(r"[a-z]+:", t) for t in targets), "no link to its docs page"
    problems = [p for t in targets if (p := link_problem(notebook, t))]
    problems += [f"MyST role, shown raw by Jupyter: {m}" for m in MYST_ROLE.findall(text)]
    problems += [f"CPython issue not linked: {m}" for m in BARE_GH.findall(text)]
    assert not problems, problems


def test_link_problem_catches_what_jupyterlab_or_the_site_cannot_open() -> None:
    """The checker itself: a wrong folder, a non-page, a missing anchor each fail."""
    notebook = NOTEBOOKS[0]
    assert link_problem(notebook, "../docs/guide.md") is None
    assert link_problem(notebook, "https://docs.python.org/3/") is None
    assert "no such file" in str(link_problem(notebook, "../patterns/async_queue.md"))
    assert "outside docs/" in str(link_problem(notebook, "../README.md"))
    assert "not a page" in str(link_problem(notebook, "../docs/conf.py"))
    assert "anchor" in str(link_problem(notebook, "../docs/guide.md#no-such-heading"))


def test_cpython_issues_are_links_in_the_docs_and_rendered_docstrings() -> None:
    """``gh-NNNNN`` written in a docs page or a module docstring is a link to the issue."""
    files = [p for p in DOCS.rglob("*.md") if "_build" not in p.parts]
    files += sorted((ROOT / "patterns").rglob("*.py"))
    found = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".py":  # the module docstring: autodoc renders it
            text = text.split('"""')[1] if text.startswith('"""') else ""
        found += [f"{path.relative_to(ROOT)}: {m}" for m in BARE_GH.findall(text)]
    assert not found, found


def test_make_docs_installs_the_inventory_the_docs_build_reads() -> None:
    """The path `make docs` gives scripts/need.sh is the one docs/conf.py reads by default."""
    conf = (DOCS / "conf.py").read_text(encoding="utf-8")
    path = re.search(r'DEBIAN_INVENTORY = "([^"]+)"', conf)
    assert path, "docs/conf.py names no DEBIAN_INVENTORY"
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert f"scripts/need.sh {path.group(1)} python3.11-doc" in makefile
