"""The entry pages' tables: the pitfall catalogue, read from the race tests, and the pattern index.

``pitfall-catalogue`` renders every pitfall, grouped by the page that tells it, in the docs'
reading order. The rows come from ``tests/catalogue.py``, the same reader that
``tests/test_catalogue.py`` uses to check that every ID on a page has both of its race tests,
so the page cannot list a pitfall the tests do not show. ``pattern-index`` renders the home
page's table from the list in ``pattern_index.py``, the list the README's table is made from.
Both tables fit the article column at 1280 px and stack their cells on a phone
(``_static/entry-tables.css``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from docutils import nodes
from docutils.statemachine import StringList
from pattern_index import PATTERNS, docs_table
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

from tests import catalogue

# The docs page of each test file whose name is not tests/test_<module>.py.
PAGES = {
    "test_bulkhead_http": "/patterns/bulkhead",
    "test_postgres": "/jobqueue/many_machines",
    "test_worker_paths": "/jobqueue/design",
    "test_contract": "/design",
}

# Reading order (the sidebar's): the contract, the patterns, then the job queue's pages; each
# page's group is headed by its short name.
READING_ORDER = {
    "/design": "The lifecycle contract",
    **{f"/patterns/{p.stem}": p.name for p in PATTERNS},
    "/jobqueue/design": "The job queue's worker",
    "/jobqueue/many_machines": "The job queue on many machines",
}


def _page(nodeid: str) -> str:
    stem = nodeid.split("::", maxsplit=1)[0].rsplit("/", 1)[-1].removesuffix(".py")
    return PAGES.get(stem, f"/patterns/{stem.removeprefix('test_')}")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _names(nodeids: list[str]) -> str:
    """The tests' function names; a name two files share is followed by its file."""
    names = [n.split("::")[1] for n in nodeids]
    shown = [
        f"`{name}` (in `{n.split('::')[0].rsplit('/', 1)[-1]}`)"
        if names.count(name) > 1
        else f"`{name}`"
        for n, name in zip(nodeids, names, strict=True)
    ]
    return ", ".join(shown) or "(none)"


def _lesson(entry: catalogue.Entry, page: str) -> str:
    """The lesson of the entry's first pattern test on ``page`` (else of its first one)."""
    here = [lesson for n, lesson in entry.lessons.items() if _page(n) == page]
    return here[0] if here else entry.lesson


def _also_shown(
    page: str, entries: dict[str, catalogue.Entry], grouped: dict[str, str]
) -> list[str]:
    """A section for a page whose tests show only pitfalls told first on other pages."""
    rows = [
        (e, next(n for n in e.pattern if _page(n) == page))
        for pitfall, e in sorted(entries.items(), key=lambda kv: catalogue.sort_key(kv[0]))
        if grouped[pitfall] != page and any(_page(n) == page for n in e.pattern)
    ]
    if not rows:
        return []
    return [
        f"## {READING_ORDER[page]}",
        "",
        (
            f"{{doc}}`{page}` shows these pitfalls again, each told first in a section above;"
            " the lesson here is from this page's own test."
        ),
        "",
        "```{container} pitfall-catalogue",
        "| ID | pitfall | lesson |",
        "|---|---|---|",
        *(
            f"| {e.pitfall} | {_cell(e.title)} | {_cell(e.lessons.get(n, e.lesson))} |"
            for e, n in rows
        ),
        "```",
        "",
        '<details class="pitfall-tests">',
        "<summary>The race tests of these pitfalls on this page</summary>",
        "",
        *(f"- {e.pitfall}: {_names([n])} holds" for e, n in rows),
        "",
        "</details>",
        "",
    ]


def catalogue_markdown() -> list[str]:
    """The catalogue as MyST Markdown: a section per page, a table, and its tests folded."""
    groups: dict[str, list[catalogue.Entry]] = {}
    entries = catalogue.entries()
    for pitfall in sorted(entries, key=catalogue.sort_key):
        entry = entries[pitfall]
        # a pitfall is told on the page whose tests show the naive code going wrong
        groups.setdefault(_page((entry.naive or entry.pattern)[0]), []).append(entry)
    order = list(READING_ORDER)
    lines: list[str] = []
    grouped = {e.pitfall: page for page, rows in groups.items() for e in rows}
    pages = set(groups) | set(READING_ORDER)
    for page in sorted(pages, key=lambda p: (p not in order, order.index(p) if p in order else p)):
        if page not in groups:
            lines += _also_shown(page, entries, grouped)
            continue
        rows = groups[page]
        lines += [
            f"## {READING_ORDER.get(page, page.rsplit('/', 1)[-1])}",
            "",
            f"Told on {{doc}}`{page}`.",
            "",
            "```{container} pitfall-catalogue",
            "| ID | pitfall | lesson |",
            "|---|---|---|",
            *(f"| {e.pitfall} | {_cell(e.title)} | {_cell(_lesson(e, page))} |" for e in rows),
            "```",
            "",
            '<details class="pitfall-tests">',
            "<summary>The race tests of these pitfalls</summary>",
            "",
            *(
                f"- {e.pitfall}: {_names(e.naive)} goes wrong; {_names(e.pattern)} holds"
                for e in rows
            ),
            "",
            "</details>",
            "",
        ]
    return lines


class _Table(SphinxDirective):
    """Parse Markdown made by ``markdown()`` in place (its sections go to the page's)."""

    has_content = False
    option_spec: ClassVar[dict[str, Any]] = {}
    titles = False

    def markdown(self) -> list[str]:
        """The Markdown to parse."""
        raise NotImplementedError

    def run(self) -> list[nodes.Node]:
        """Build the Markdown and parse it with the page's own parser."""
        container = nodes.container()
        source = StringList(self.markdown(), source=self.name)
        self.state.nested_parse(source, 0, container, match_titles=self.titles)
        return container.children


class PitfallCatalogue(_Table):
    """Every pitfall, grouped by page in reading order."""

    titles = True

    def markdown(self) -> list[str]:
        """The catalogue's sections."""
        return catalogue_markdown()


class PatternIndex(_Table):
    """The home page's table: what goes wrong, the page, the notebook, the module."""

    def markdown(self) -> list[str]:
        """The table, from the list the README's table is made from."""
        return docs_table()


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the directives and their style sheet."""
    app.add_directive("pitfall-catalogue", PitfallCatalogue)
    app.add_directive("pattern-index", PatternIndex)
    app.add_css_file("entry-tables.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
