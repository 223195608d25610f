"""The ``race-lanes`` directive: a pitfall's naive and fixed runs, drawn from real runs.

```{race-lanes} executor_shutdown.p1
```

runs ``SCENARIOS["executor_shutdown.p1"]`` from ``patterns.teaching.scenarios`` (written
in ``patterns/teaching/scenarios/executor_shutdown.py``: one module per pattern) while the
page is built and embeds both lane diagrams as inline SVG (so they take the page's text
colour, in light and dark mode), side by side on a wide screen and one above the other
on a narrow one, with a one-line legend and the scenario's caption. Each SVG is drawn at
its own size, never scaled down, so its text reads on a phone. The pictures cannot drift
from the code: they are the code, run again on every build.
"""

from __future__ import annotations

from typing import Any, ClassVar

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

from patterns.teaching.scenarios import SCENARIOS, pair_html


class RaceLanes(SphinxDirective):
    """Run a scenario pair and embed its two SVG lane diagrams."""

    required_arguments = 1
    has_content = False
    option_spec: ClassVar[dict[str, Any]] = {}

    def run(self) -> list[nodes.Node]:
        """Run the naive and the fixed scenario; return one raw HTML figure."""
        key = self.arguments[0]
        if key not in SCENARIOS:
            known = ", ".join(sorted(SCENARIOS))
            raise self.error(f"race-lanes: unknown scenario {key!r}; known: {known}")
        try:
            html = pair_html(key, when="Drawn from runs made while this page was built.")
        except Exception as exc:  # a scenario that broke: one clear build error, not a crash
            raise self.error(f"race-lanes {key}: the scenario failed: {exc!r}") from exc
        return [nodes.raw("", html, format="html")]


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the directive."""
    app.add_directive("race-lanes", RaceLanes)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
