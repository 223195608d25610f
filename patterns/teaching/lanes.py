"""Record what each thread (or asyncio task) did, and when, then draw it as a lane diagram.

Call `Tracer.mark` from the code being watched (a scenario, never a pattern module); each
call records `time.perf_counter_ns()`, the lane (the current asyncio task's name inside a
task, otherwise the calling thread's name) and a line of text. `Tracer.svg` draws SVG
text: one horizontal lane per thread or task, in the order they were first seen, with
the events numbered in the order they happened and a key below the lanes giving each
event's text and its time since the first event. Stdlib only; 3.11+.
Docs: docs/_ext/lanes.py (the ``race-lanes`` directive).
"""

from __future__ import annotations

import asyncio
import textwrap
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from xml.sax.saxutils import escape

__all__ = ["Event", "Tracer", "current_lane", "render_svg"]

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


def current_lane() -> str:
    """The name of the running asyncio task, or of the calling thread outside any task."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no event loop runs in this thread
        task = None
    return threading.current_thread().name if task is None else task.get_name()


class Tracer:
    """A thread-safe record of events, one lane per thread (or asyncio task).

    ``lanes`` names lanes in advance (thread or task name -> label); `name_lane` adds one
    later, for a thread whose name is known only once it runs. A lane's position is the
    order in which its thread or task first recorded an event.
    """

    def __init__(self, title: str = "", lanes: Mapping[str, str] | None = None) -> None:
        self.title = title
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

        Inside an asyncio task the lane is the task's name: tasks sharing one thread get
        a lane each. ``bad`` marks the failure; ``after`` is an earlier event (in another
        lane) this one had to wait for, drawn as a dotted arrow from it.
        """
        name = current_lane() if lane is None else lane
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

    def svg(self, caption: str = "", *, columns: int = 0) -> str:
        """The lane diagram of everything recorded so far (see `render_svg`)."""
        return render_svg(self, caption, columns=columns)


# --- layout, in viewBox units (the picture scales down with its box) --------------------
_PAD = 8
_LANE_H = 30
_COL_W = 34
_R = 10  # radius of an event mark
_FONT = 12
_KEY_FONT = 12
_KEY_LINE = 16
_CHAR_W = 0.6  # average glyph width as a fraction of the font size (a safe estimate)
_MIN_W = 380


def _ms(ns: int) -> str:
    ms = ns / 1e6
    return f"+{ms:.1f} ms" if ms < 100 else f"+{ms:.0f} ms"


def render_svg(tracer: Tracer, caption: str = "", *, columns: int = 0) -> str:
    """Draw ``tracer``'s events: one lane per thread or task, x by event order, a key.

    The spacing along a lane is the order of the events, not their duration (a real
    interleaving spans microseconds to seconds); each event's time since the first one
    is printed in the key. A lane's thick segment spans its thread's first to last
    event. Every text is escaped. The SVG has a viewBox and no fixed size, so it scales
    to its container. ``columns`` widens the time axis to that many events, so that two
    pictures drawn side by side share one axis.
    """
    events = tracer.events
    lanes = tracer.lanes
    labels = [tracer.label(name) for name in lanes]
    row = {name: i for i, name in enumerate(lanes)}
    label_w = int(max([len(lb) for lb in labels] + [4]) * _FONT * _CHAR_W) + 2 * _PAD
    x0 = label_w + _R + 4
    width = max(_MIN_W, x0 + _COL_W * max(len(events) - 1, columns - 1, 0) + _R + _PAD)
    top = _PAD + (_FONT + 8 if tracer.title else 0)

    def cx(i: int) -> int:
        return x0 + _COL_W * i

    def cy(name: str) -> int:
        return top + _LANE_H * row[name] + _LANE_H // 2

    parts: list[str] = []
    if tracer.title:
        parts.append(
            f'<text x="{_PAD}" y="{_PAD + _FONT}" font-weight="bold">{escape(tracer.title)}</text>'
        )
    for name, lb in zip(lanes, labels, strict=True):
        y = cy(name)
        mine = [e.index for e in events if e.thread == name]
        parts.append(
            f'<line x1="{label_w}" y1="{y}" x2="{width - _PAD}" y2="{y}" stroke="currentColor" '
            f'stroke-opacity="{MUTED_OPACITY}" stroke-dasharray="2 3"/>'
        )
        parts.append(
            f'<line x1="{cx(mine[0])}" y1="{y}" x2="{cx(mine[-1])}" y2="{y}" '
            f'stroke="currentColor" stroke-width="3" stroke-opacity="0.6"/>'
        )
        parts.append(f'<text class="lane" x="{_PAD}" y="{y + _FONT // 3}">{escape(lb)}</text>')
    for event in events:
        if event.after is None:
            continue
        cause = events[event.after]
        x1, y1, x2, y2 = cx(cause.index), cy(cause.thread), cx(event.index), cy(event.thread)
        parts.append(
            f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2 - _R if y2 > y1 else y2 + _R}" '
            f'stroke="currentColor" stroke-dasharray="3 3" stroke-opacity="0.8"/>'
        )
        tip = y2 - _R if y2 > y1 else y2 + _R
        back = -6 if y2 > y1 else 6
        parts.append(
            f'<polygon points="{x2},{tip} {x2 - 4},{tip + back} {x2 + 4},{tip + back}" '
            f'fill="currentColor"/>'
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
            f'<text x="{x}" y="{y + 4}" text-anchor="middle" font-size="11" {colour}>'
            f"{event.index + 1}</text>"
        )

    # The key: "N  +t ms  lane: text", wrapped to the picture's width.
    y = top + _LANE_H * len(lanes) + _PAD + _KEY_LINE
    chars = max(20, int((width - 2 * _PAD - 28) / (_KEY_FONT * _CHAR_W)))
    start = events[0].t_ns if events else 0
    for event in events:
        text = f"{_ms(event.t_ns - start)}  {tracer.label(event.thread)}: {event.text}"
        lines = textwrap.wrap(text, chars) or [""]
        fill = f' fill="{BAD}" font-weight="bold"' if event.bad else ""
        number = f' fill="{BAD}"' if event.bad else ""
        parts.append(
            f'<text x="{_PAD}" y="{y}" font-weight="bold"{number}>{event.index + 1}</text>'
        )
        for line in lines:
            parts.append(f'<text x="{_PAD + 28}" y="{y}"{fill}>{escape(line)}</text>')
            y += _KEY_LINE
    if caption:
        for line in textwrap.wrap(caption, chars + 4):
            parts.append(f'<text x="{_PAD}" y="{y + 4}" font-style="italic">{escape(line)}</text>')
            y += _KEY_LINE
    height = y + _PAD
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="100%" style="max-width:{width}px;height:auto" role="img" '
        f'font-family="system-ui, sans-serif" font-size="{_FONT}" fill="currentColor">'
        f"<title>{escape(tracer.title or 'lane diagram')}</title>" + "".join(parts) + "</svg>"
    )
