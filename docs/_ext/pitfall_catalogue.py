"""The ``pitfall-catalogue`` directive: the table of every pitfall, read from the race tests.

The rows come from ``tests/catalogue.py``, the same reader that ``tests/test_catalogue.py``
uses to check that every ID on a page has both of its race tests, so the page cannot list a
pitfall the tests do not show.
"""

from __future__ import annotations

from typing import Any, ClassVar

from docutils import nodes
from docutils.statemachine import StringList
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


def _page(nodeid: str) -> str:
    stem = nodeid.split("::", maxsplit=1)[0].rsplit("/", 1)[-1].removesuffix(".py")
    return PAGES.get(stem, f"/patterns/{stem.removeprefix('test_')}")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


class PitfallCatalogue(SphinxDirective):
    """Render the catalogue as a Markdown table parsed in place."""

    has_content = False
    option_spec: ClassVar[dict[str, Any]] = {}

    def run(self) -> list[nodes.Node]:
        """Build the table's Markdown and parse it with the page's own parser."""
        lines = [
            "| ID | pitfall | page | naive test (goes wrong) | pattern test (holds) | lesson |",
            "|---|---|---|---|---|---|",
        ]
        entries = catalogue.entries()
        for pitfall in sorted(entries, key=catalogue.sort_key):
            entry = entries[pitfall]
            page = _page((entry.pattern or entry.naive)[0])
            naive = "<br>".join(f"`{n.split('::')[1]}`" for n in entry.naive)
            pattern = "<br>".join(f"`{n.split('::')[1]}`" for n in entry.pattern)
            lines.append(
                f"| {pitfall} | {_cell(entry.title)} | {{doc}}`{page}` "
                f"| {naive or '(none)'} | {pattern or '(none)'} | {_cell(entry.lesson)} |"
            )
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source="pitfall-catalogue"), 0, container)
        return container.children


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the directive."""
    app.add_directive("pitfall-catalogue", PitfallCatalogue)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
