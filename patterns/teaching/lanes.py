"""Record what each thread (or asyncio task) did, and when, then draw it as a lane diagram.

Call `Tracer.mark` from the code being watched (a scenario, never a pattern module); each
call records `time.perf_counter_ns()`, the lane (the calling thread's name, or in a
``Tracer(tasks=True)`` the current asyncio task's name inside a task) and a line of text.
`Tracer.svg` draws SVG text: one horizontal lane per thread or task, in the order they were
first seen, with the events numbered in the order they happened; `Tracer.html` adds the
title and the key (each event's text and its time since the first event) as HTML, which
wraps on a narrow screen. Stdlib only; 3.11+.
Docs: docs/_ext/lanes.py (the ``race-lanes`` directive).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from xml.sax.saxutils import escape

__all__ = ["Event", "Tracer", "current_lane", "render_html", "render_svg", "svg_width"]

# Colours that read on furo's light and dark backgrounds alike: everything else is drawn
# in currentColor, which an inline SVG takes from the page's text colour.
BAD = "#e5484d"
MUTED_OPACITY = "0.35"


@dataclass(frozen=True)
class Event:
    """One thing one thread (or task) did: when (perf_counter_ns), in which lane, and what."""

    index: int  # position in the trace, from 0, in the order the events happened
    t_ns: int
    thread: str  # the lane: the name of the thread, asyncio task or process that recorded it
    text: str
    bad: bool = False  # the moment it went wrong: drawn in red
    after: int | None = None  # index of an event in another lane this one waited for


def current_lane(*, tasks: bool = True) -> str:
    """The name of the running asyncio task (if ``tasks``), or else of the calling thread."""
    if not tasks:
        return threading.current_thread().name
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no event loop runs in this thread
        task = None
    return threading.current_thread().name if task is None else task.get_name()


class Tracer:
    """A thread-safe record of events, one lane per thread (or asyncio task).

    ``lanes`` names lanes in advance (thread or task name -> label); `name_lane` adds one
    later, for a thread whose name is known only once it runs. A lane's position is the
    order in which its thread or task first recorded an event. With ``tasks`` a mark made
    inside an asyncio task goes in the task's lane; without, in its thread's, even where
    the caller itself runs in a task (a notebook's kernel runs each cell in one).
    """

    def __init__(
        self, title: str = "", lanes: Mapping[str, str] | None = None, *, tasks: bool = False
    ) -> None:
        self.title = title
        self.tasks = tasks
        # Guards _events and _labels; held only to append, never while waiting.
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self._labels: dict[str, str] = dict(lanes or {})

    def name_lane(self, thread: str, label: str) -> None:
        """Show the lane of the thread (or task) called ``thread`` as ``label``."""
        with self._lock:
            self._labels[thread] = label

    def mark(
        self,
        text: str,
        *,
        bad: bool = False,
        after: Event | None = None,
        lane: str | None = None,
    ) -> Event:
        """Record ``text`` now, in the lane ``lane`` or else the caller's (`current_lane`).

        In a ``Tracer(tasks=True)``, inside an asyncio task the lane is the task's name:
        tasks sharing one thread get a lane each. ``bad`` marks the failure: give it the
        ``lane`` that failed or is stuck, not the observer's. ``after`` is an earlier event
        (in another lane) that this one answered or waited for, drawn as a dashed arrow
        from it.
        """
        name = current_lane(tasks=self.tasks) if lane is None else lane
        with self._lock:  # timestamp taken under the lock, so index order is time order
            return self._append(time.perf_counter_ns(), name, text, bad, after)

    def record(self, t_ns: int, thread: str, text: str, *, bad: bool = False) -> Event:
        """Add an event recorded elsewhere (another process's ``perf_counter_ns()``).

        On Linux and macOS ``perf_counter`` is one clock for every process, so events from
        a child and from this process can share a trace. Raises `ValueError` for an event
        older than the last one, rather than drawing them out of order.
        """
        with self._lock:
            if self._events and t_ns < self._events[-1].t_ns:
                raise ValueError(f"event {text!r} at {t_ns} ns is older than the last one")
            return self._append(t_ns, thread, text, bad, None)

    def _append(self, t_ns: int, thread: str, text: str, bad: bool, after: Event | None) -> Event:
        event = Event(
            index=len(self._events),
            t_ns=t_ns,
            thread=thread,
            text=text,
            bad=bad,
            after=None if after is None else after.index,
        )
        self._events.append(event)
        return event

    @property
    def events(self) -> tuple[Event, ...]:
        """Every event so far, in the order they happened."""
        with self._lock:
            return tuple(self._events)

    def label(self, thread: str) -> str:
        """The label of ``thread``'s lane (its name unless `name_lane` said otherwise)."""
        with self._lock:
            return self._labels.get(thread, thread)

    @property
    def lanes(self) -> tuple[str, ...]:
        """Thread names, one per lane, in first-seen order."""
        return tuple(dict.fromkeys(event.thread for event in self.events))

    def svg(self, *, columns: int = 0, width: int = 0) -> str:
        """The lane diagram of everything recorded so far (see `render_svg`)."""
        return render_svg(self, columns=columns, width=width)

    def html(self, *, columns: int = 0, width: int = 0) -> str:
        """The title, the lane diagram and the key, as HTML (see `render_html`)."""
        return render_html(self, columns=columns, width=width)


# --- layout, in px: the picture is drawn at its own size, never scaled down -------------
# Narrow enough for a phone (a 358 px column at 390 px) with 17 marks; labels above lanes.
_PAD = 6
_R = 8  # radius of an event mark
_COL_W = 19  # from one mark to the next
_FONT = 12  # lane labels
_NUM_FONT = 11  # the numbers in the marks
_LANE_H = 42  # a label row, then the lane's line through the marks
_LINE_Y = 28  # the lane's line, below the top of its row
_CHAR_W = 0.6  # average glyph width as a fraction of the font size (a safe estimate)
_HALO = "paint-order:stroke;stroke:var(--color-background-primary, Canvas);stroke-width:4px"
# The widest picture a phone shows unscaled, with room for a notebook's output margin.
MAX_WIDTH = 340


def _ms(ns: int) -> str:
    ms = ns / 1e6
    return f"+{ms:.1f} ms" if ms < 100 else f"+{ms:.0f} ms"


def svg_width(tracer: Tracer, columns: int = 0) -> int:
    """The width in px of ``tracer``'s picture: its marks or ``columns``, or its longest label."""
    marks = max(len(tracer.events), columns, 1)
    labels = max([len(tracer.label(name)) for name in tracer.lanes] + [4])
    return max(2 * _PAD + 2 * _R + _COL_W * (marks - 1), 2 * _PAD + int(labels * _FONT * _CHAR_W))


def render_svg(tracer: Tracer, *, columns: int = 0, width: int = 0) -> str:
    """Draw ``tracer``'s lanes: one per thread or task, x by event order, each event numbered.

    The spacing along a lane is the order of the events, not their duration (a real
    interleaving spans microseconds to seconds); `render_html` adds the key with each
    event's text and time. A lane's label sits above its line; its thick segment spans its
    first to last event. The SVG is drawn at its own size in px (`svg_width`), so its text
    is never shrunk with it, and shrinks only in a box narrower than that. ``columns``
    widens the time axis to that many events and ``width`` the picture to that many px,
    so that two pictures drawn side by side share one axis and one size. Every text is
    escaped.
    """
    events = tracer.events
    lanes = tracer.lanes
    row = {name: i for i, name in enumerate(lanes)}
    width = max(svg_width(tracer, columns), width)
    height = _PAD + _LANE_H * (len(lanes) - 1) + _LINE_Y + _R + _PAD

    def cx(i: int) -> int:
        return _PAD + _R + _COL_W * i

    def cy(name: str) -> int:
        return _PAD + _LANE_H * row[name] + _LINE_Y

    parts: list[str] = []
    for name in lanes:
        y = cy(name)
        mine = [e.index for e in events if e.thread == name]
        parts.append(
            f'<line x1="{_PAD}" y1="{y}" x2="{width - _PAD}" y2="{y}" stroke="currentColor" '
            f'stroke-opacity="{MUTED_OPACITY}" stroke-dasharray="2 3"/>'
        )
        parts.append(
            f'<line x1="{cx(mine[0])}" y1="{y}" x2="{cx(mine[-1])}" y2="{y}" '
            f'stroke="currentColor" stroke-width="3" stroke-opacity="0.6"/>'
        )
    for event in events:
        if event.after is None:
            continue
        cause = events[event.after]
        x1, y1, x2, y2 = cx(cause.index), cy(cause.thread), cx(event.index), cy(event.thread)
        tip = y2 - _R if y2 > y1 else y2 + _R
        back = -6 if y2 > y1 else 6
        parts.append(
            f'<line class="after" x1="{x1}" y1="{y1}" x2="{x2}" y2="{tip}" '
            f'stroke="currentColor" stroke-dasharray="3 3" stroke-opacity="0.8"/>'
            f'<polygon points="{x2},{tip} {x2 - 4},{tip + back} {x2 + 4},{tip + back}" '
            f'fill="currentColor"/>'
        )
    for name in lanes:  # over the arrows, on a halo of the page's colour
        parts.append(
            f'<text class="lane" x="{_PAD}" y="{cy(name) - _LINE_Y + _FONT + 2}" '
            f'font-weight="bold" style="{_HALO}">{escape(tracer.label(name))}</text>'
        )
    for event in events:
        x, y = cx(event.index), cy(event.thread)
        if event.bad:
            parts.append(f'<circle class="bad" cx="{x}" cy="{y}" r="{_R}" fill="{BAD}"/>')
            colour = 'fill="#fff"'
        else:
            parts.append(
                f'<circle cx="{x}" cy="{y}" r="{_R}" stroke="currentColor" stroke-width="1.5" '
                f'style="fill:var(--color-background-primary, Canvas)"/>'
            )
            colour = 'fill="currentColor"'
        parts.append(
            f'<text x="{x}" y="{y + 4}" text-anchor="middle" font-size="{_NUM_FONT}" '
            f"{colour}>{event.index + 1}</text>"
        )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" style="max-width:100%;height:auto;display:block" '
        f'role="img" font-family="system-ui, sans-serif" font-size="{_FONT}" '
        f'fill="currentColor"><title>{escape(tracer.title or "lane diagram")}</title>'
        + "".join(parts)
        + "</svg>"
    )


def render_html(tracer: Tracer, *, columns: int = 0, width: int = 0) -> str:
    """The title, the lanes (`render_svg`) and the key, as HTML that wraps on a phone.

    The key is a numbered list, one item per event: its time since the first event, its
    lane and its text; the failure in red. Inline styles only, so it reads the same in a
    notebook as on the site.
    """
    events = tracer.events
    start = events[0].t_ns if events else 0
    items = []
    for event in events:
        style = f' class="bad" style="color:{BAD};font-weight:bold"' if event.bad else ""
        items.append(
            f'<li value="{event.index + 1}"{style}>'
            f'<span style="opacity:0.75">{_ms(event.t_ns - start)}</span> '
            f"<b>{escape(tracer.label(event.thread))}</b>: {escape(event.text)}</li>"
        )
    title = (
        f'<p class="race-lanes-title" style="font-weight:bold;margin:0 0 0.3em">'
        f"{escape(tracer.title)}</p>"
        if tracer.title
        else ""
    )
    return (
        title
        + render_svg(tracer, columns=columns, width=width)
        + '<ol class="race-lanes-key" style="margin:0.4em 0 0;padding-left:2.2em">'
        + "".join(items)
        + "</ol>"
    )
