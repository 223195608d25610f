"""Naive and fixed runs of each pattern page's main pitfall, traced for a lane diagram.

``SCENARIOS[key]`` (keys such as ``"executor_shutdown.p1"``) holds a `Scenario`: its
``naive()`` and ``fixed()`` each run the real code (``patterns.naive.<module>`` and
``patterns.<module>``) under the interleaving that the module's race tests force, with
`threading.Event` checkpoints instead of sleeps, and return the `Tracer`. The marks are
made here, never inside a pattern module. Each run takes well under a second and leaves
no thread running: a naive run that strands a thread releases it afterwards, and says so
in a mark.

One module per pattern, under the pattern's own name (``scenarios/executor_shutdown.py``
draws ``patterns/executor_shutdown.py``); what they share is in ``scenarios/common.py``.
Docs: docs/_ext/lanes.py
"""

from __future__ import annotations

import html

from patterns.teaching.lanes import BAD, MUTED_OPACITY, svg_width
from patterns.teaching.scenarios import (
    async_queue,
    asyncio_shutdown,
    asyncio_signals,
    bulkhead,
    cancellation,
    closable_queue,
    daemon_threads,
    executor_shutdown,
    poison_pill,
    process_shutdown,
    server_shutdown,
    signal_handlers,
    supervisor,
    thread_exceptions,
)
from patterns.teaching.scenarios.common import Scenario

__all__ = ["LEGEND", "SCENARIOS", "Scenario", "pair_html"]

SCENARIOS: dict[str, Scenario] = {
    "executor_shutdown.p1": executor_shutdown.P1,
    "cancellation.c1": cancellation.C1,
    "poison_pill.p10": poison_pill.P10,
    "closable_queue.p14": closable_queue.P14,
    "thread_exceptions.silent_death": thread_exceptions.SILENT_DEATH,
    "supervisor.p9": supervisor.P9,
    "daemon_threads.p15": daemon_threads.P15,
    "signal_handlers.p18": signal_handlers.P18,
    "signal_handlers.p22": signal_handlers.P22,
    "bulkhead.b1": bulkhead.B1,
    "async_queue.a1": async_queue.A1,
    "asyncio_shutdown.a7": asyncio_shutdown.A7,
    "asyncio_shutdown.a10": asyncio_shutdown.A10,
    "asyncio_shutdown.a11": asyncio_shutdown.A11,
    "asyncio_shutdown.a12": asyncio_shutdown.A12,
    "asyncio_shutdown.a13": asyncio_shutdown.A13,
    "asyncio_shutdown.a14": asyncio_shutdown.A14,
    "asyncio_signals.a6": asyncio_signals.A6,
    "process_shutdown.m3": process_shutdown.M3,
    "process_shutdown.m8": process_shutdown.M8,
    "process_shutdown.m9": process_shutdown.M9,
    "process_shutdown.m10": process_shutdown.M10,
    "process_shutdown.m11": process_shutdown.M11,
    "process_shutdown.m12": process_shutdown.M12,
    "server_shutdown.w2": server_shutdown.W2,
}


def how_to_read(lanes: str = "a thread") -> str:
    """The sentence that says how to read a picture whose lanes are ``lanes``."""
    return (
        f"Each lane is {lanes}; the marks are numbered in the order they happened, spaced "
        "by order, not to scale, and the key gives each mark's time since the first one. "
        "The failure is red, on the lane that failed or is stuck."
    )


def _swatch(body: str) -> str:
    """A small inline drawing for the legend (no text in it)."""
    return (
        '<svg xmlns="http://www.w3.org/2000/svg" width="26" height="12" viewBox="0 0 26 12" '
        'aria-hidden="true" style="vertical-align:middle;margin-right:0.25em">'
        f"{body}</svg>"
    )


# One line under each picture: what its lines and marks mean.
LEGEND = (
    '<p class="race-lanes-legend" style="margin:0.5em 0 0;font-size:0.9em">'
    + _swatch(
        '<line x1="1" y1="6" x2="25" y2="6" stroke="currentColor" stroke-width="3" '
        'stroke-opacity="0.6"/>'
    )
    + "first to last mark &#183; "
    + _swatch(
        f'<line x1="1" y1="6" x2="25" y2="6" stroke="currentColor" '
        f'stroke-opacity="{MUTED_OPACITY}" stroke-dasharray="2 3"/>'
    )
    + "no marks &#183; "
    + _swatch(
        '<line x1="1" y1="6" x2="19" y2="6" stroke="currentColor" stroke-dasharray="3 3"/>'
        '<polygon points="25,6 19,2 19,10" fill="currentColor"/>'
    )
    + "from a cause to what it led to &#183; "
    + _swatch(f'<circle cx="13" cy="6" r="5.5" fill="{BAD}"/>')
    + "the failure</p>"
)


def pair_html(key: str, *, when: str = "Drawn from runs made just now.") -> str:
    """Run ``SCENARIOS[key]`` and return both pictures as one HTML figure with a caption.

    Inline SVG, so the drawing takes the page's text colour (light and dark themes). Both
    halves share one time axis, so they are the same size, drawn unscaled (their text is
    as large on a phone as on a desktop): side by side when there is room for both, one
    above the other when there is not. Titles, keys and the legend are HTML, and wrap.
    """
    scenario = SCENARIOS[key]
    naive, fixed = scenario.naive(), scenario.fixed()
    naive.title = f"Naive: {naive.title}"
    fixed.title = f"Fixed: {fixed.title}"
    columns = max(len(naive.events), len(fixed.events))
    width = max(svg_width(naive, columns), svg_width(fixed, columns))
    # At least 300 px a half: two fit a desktop's column (736 px), not a phone's (358 px),
    # where a key squeezed to half the width would wrap at every other word.
    one = f'class="race-lanes-one" style="flex:1 1 {max(width, 300)}px;min-width:0"'
    caption = f"{scenario.pitfall}: {scenario.caption} {how_to_read(scenario.lanes)} {when}"
    return (
        f'<figure class="race-lanes" id="race-lanes-{html.escape(key.replace(".", "-"))}">'
        '<div class="race-lanes-pair" style="display:flex;flex-wrap:wrap;gap:1em 1.5em">'
        f"<div {one}>{naive.html(columns=columns, width=width)}</div>"
        f"<div {one}>{fixed.html(columns=columns, width=width)}</div>"
        f"</div>{LEGEND}<figcaption><p>{html.escape(caption)}</p></figcaption></figure>"
    )
