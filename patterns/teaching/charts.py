"""Small SVG charts drawn from a notebook's own run (teaching aid, not a pattern).

Call :func:`bar_chart` for a few labelled values, :func:`timeline_chart` for counts sampled
over time with labelled moments (a signal, a restart). Each returns an SVG string with a
viewBox (it scales down to a phone's width) drawn in ``currentColor`` (it takes the page's
text colour, so it reads in light and dark themes); show it with ``IPython.display.HTML``,
inline, since an SVG shown as an image cannot see the page's colour. Every text is escaped.
Bad input (nothing to draw, a NaN, series of the wrong length, moments out of order) is a
`ValueError` that names it. Stdlib only; 3.11+.
Docs: notebooks/08-bulkhead.ipynb (bar_chart), notebooks/09-jobqueue.ipynb (timeline_chart).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from xml.sax.saxutils import escape

__all__ = ["bar_chart", "timeline_chart"]

# Series colours: mid tones that read on furo's white and near-black backgrounds alike; each
# series also gets its own dash pattern, so the lines stay apart in grey or for colour-blind eyes.
PALETTE = ("#2f7de1", "#d97706", "#16a34a", "#e5484d", "#8b5cf6", "#0891b2")
DASHES = ("", "7 4", "2 3", "10 3 2 3", "4 2", "1 4")

_FONT = 13
_CHAR_W = 0.6  # average glyph width as a fraction of the font size (a safe estimate)
_PAD = 8


def _svg(width: float, height: float, title: str, body: Sequence[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:g} {height:g}" '
        f'width="100%" style="max-width:{width:g}px;height:auto" role="img" '
        f'font-family="system-ui, sans-serif" font-size="{_FONT}" fill="currentColor">'
        f"<title>{escape(title)}</title>" + "".join(body) + "</svg>"
    )


def _text_w(text: str, font: float = _FONT) -> float:
    return len(text) * font * _CHAR_W


def bar_chart(bars: Sequence[tuple[str, float]], *, unit: str, title: str = "") -> str:
    """Horizontal bars, one per ``(label, value)``, each labelled with value and unit.

    Bars share one scale, from zero to the largest value. A value that is negative, NaN
    or infinite is a `ValueError` naming its bar.
    """
    if not bars:
        raise ValueError("bar_chart needs at least one (label, value) bar; got none")
    for label, value in bars:
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"bar {label!r} has the value {value}; a bar needs a number >= 0")
    width, row = 480, 30
    left = _PAD + max(_text_w(label) for label, _ in bars) + 8
    room = width - _PAD - left - max(_text_w(f"{value:g} {unit}") for _, value in bars) - 6
    if room < width / 4:
        raise ValueError("bar_chart: the bar labels are too long to leave room for the bars")
    top = _PAD + (_FONT + 10 if title else 0)
    height = top + row * len(bars) + _PAD
    biggest = max(value for _, value in bars) or 1.0
    parts = []
    if title:
        parts.append(
            f'<text x="{_PAD}" y="{_PAD + _FONT}" font-weight="bold">{escape(title)}</text>'
        )
    for i, (label, value) in enumerate(bars):
        y = top + i * row
        length = room * value / biggest
        parts.append(
            f'<text x="{left - 8:.1f}" y="{y + 18}" text-anchor="end">{escape(label)}</text>'
            f'<rect class="bar" x="{left:.1f}" y="{y + 5}" width="{length:.1f}" height="18" '
            f'fill-opacity="0.6"/>'
            f'<text x="{left + length + 6:.1f}" y="{y + 18}">{value:g} {escape(unit)}</text>'
        )
    return _svg(width, height, title or "bar chart", parts)


def _step(span: float, target: int) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) giving about ``target`` ticks."""
    raw = span / target
    magnitude = 10.0 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw * 0.999)


def _ticks(lo: float, hi: float, target: int) -> tuple[float, float, list[float]]:
    """Round axis bounds around ``lo``..``hi`` and the ticks between them."""
    span = hi - lo if hi > lo else 1.0
    step = _step(span, target)
    first = math.floor(lo / step + 1e-9) * step
    last = max(math.ceil(hi / step - 1e-9) * step, first + step)
    count = round((last - first) / step)
    return first, last, [round(first + i * step, 10) for i in range(count + 1)]


def _check_timeline(
    times: Sequence[float],
    series: Mapping[str, Sequence[float]],
    markers: Sequence[tuple[float, str]],
) -> None:
    if not times:
        raise ValueError("timeline_chart needs at least one sample time; got none")
    if not series:
        raise ValueError("timeline_chart needs at least one series; got none")
    for i, t in enumerate(times):
        if not math.isfinite(t):
            raise ValueError(f"sample time {i} is {t}, not a finite number")
        if i and t < times[i - 1]:
            raise ValueError(f"sample time {i} ({t}) is earlier than the one before it")
    for name, values in series.items():
        if len(values) != len(times):
            raise ValueError(
                f"series {name!r} has {len(values)} values for {len(times)} sample times"
            )
        for i, value in enumerate(values):
            if not math.isfinite(value):
                raise ValueError(f"series {name!r} has {value} at sample {i}, not a finite number")
    for i, (t, label) in enumerate(markers):
        if not math.isfinite(t):
            raise ValueError(f"marker {label!r} is at {t}, not a finite time")
        if i and t < markers[i - 1][0]:
            before_t, before = markers[i - 1]
            raise ValueError(
                f"marker {label!r} at {t:g} comes before the marker before it "
                f"({before!r} at {before_t:g}); give the markers in time order"
            )


def _legend(names: Sequence[str], width: float, y: float, parts: list[str]) -> float:
    """A line sample and the name of each series, wrapped to ``width``; the y below it."""
    x, row_y = float(_PAD), y + _FONT
    for i, name in enumerate(names):
        entry_w = 24 + _text_w(name) + 14
        if x > _PAD and x + entry_w > width - _PAD:
            x, row_y = float(_PAD), row_y + _FONT + 6
        colour, dash = PALETTE[i % len(PALETTE)], DASHES[i % len(DASHES)]
        parts.append(
            f'<g class="legend"><line x1="{x:.1f}" y1="{row_y - 4}" x2="{x + 20:.1f}" '
            f'y2="{row_y - 4}" stroke="{colour}" stroke-width="2.5" stroke-dasharray="{dash}"/>'
            f'<text x="{x + 24:.1f}" y="{row_y}">{escape(name)}</text></g>'
        )
        x += entry_w
    return row_y + 8


def _marker_rows(
    markers: Sequence[tuple[float, str]], px: Callable[[float], float], width: float
) -> tuple[int, list[tuple[float, float, int, str]]]:
    """Place each marker's label beside the top of its line, in rows, top row first.

    A label starts just right of its line (or ends just left of it, near the right edge).
    Markers come in time order, so a label goes one row below every earlier label that
    reaches its line or its text: it then overlaps no label, and no line crosses it (a
    line runs down from its own label, and the labels below it start further right).
    Returns the number of rows and, per marker, (line x, label x, row, label).
    """
    placed: list[tuple[float, float, int, str]] = []
    ends: list[tuple[float, int]] = []  # (right edge, row) of each label so far
    for t, label in markers:
        x = px(t)
        w = _text_w(label) * 1.2  # bold, often capitals: wider than the average glyph
        start = x + 4 if x + 4 + w <= width - _PAD else max(float(_PAD), x - 4 - w)
        reach = min(start, x)
        row = 1 + max((r for end, r in ends if end + 8 > reach), default=-1)
        ends.append((start + w, row))
        placed.append((x, start, row, label))
    return 1 + max((row for _, _, row, _ in placed), default=-1), placed


def timeline_chart(
    times: Sequence[float],
    series: Mapping[str, Sequence[float]],
    *,
    markers: Sequence[tuple[float, str]] = (),
    x_label: str = "seconds",
    y_label: str = "",
    title: str = "",
) -> str:
    """Step lines of several series sampled at ``times``, with labelled vertical markers.

    ``series`` maps a name (shown in the legend) to one value per sample time; each value
    holds until the next sample. ``markers`` are ``(time, label)`` pairs in time order,
    each drawn as a dashed vertical line with its label beside the line's top, above the
    plot (a label that would overlap another, or be crossed by a line, goes a row lower).
    The time axis covers every sample and every marker.

    Raises `ValueError` for no times or no series, a series whose length is not the number
    of times, a time or value that is not finite, times that go backwards, and markers
    out of time order (drawing them sorted would hide the caller's mistake).
    """
    _check_timeline(times, series, markers)
    width, plot_h = 480, 190
    x_min, x_max, x_ticks = _ticks(
        min([times[0], *(t for t, _ in markers)]), max([times[-1], *(t for t, _ in markers)]), 5
    )
    every = [v for values in series.values() for v in values]
    y_min, y_max, y_ticks = _ticks(min(0.0, *every), max(every), 5)
    y_texts = [f"{v:g}" for v in y_ticks]
    left = _PAD + (_FONT + 6 if y_label else 0) + max(_text_w(t) for t in y_texts) + 6
    right = width - _PAD - _text_w(f"{x_ticks[-1]:g}") / 2

    def px(t: float) -> float:
        return left + (right - left) * (t - x_min) / (x_max - x_min)

    parts: list[str] = []
    y = float(_PAD)
    if title:
        parts.append(f'<text x="{_PAD}" y="{y + _FONT}" font-weight="bold">{escape(title)}</text>')
        y += _FONT + 6
    y = _legend(list(series), width, y, parts)
    rows, placed = _marker_rows(markers, px, width)
    top = y + (_FONT + 4) * rows + 4
    bottom = top + plot_h

    def py(v: float) -> float:
        return bottom - plot_h * (v - y_min) / (y_max - y_min)

    for line_x, label_x, row, label in placed:
        label_y = y + (_FONT + 4) * (row + 1) - 2
        parts.append(
            f'<text class="marker-label" x="{label_x:.1f}" y="{label_y:.1f}" '
            f'font-weight="bold">{escape(label)}</text>'
            f'<line class="marker" x1="{line_x:.1f}" y1="{label_y - _FONT + 2:.1f}" '
            f'x2="{line_x:.1f}" y2="{bottom:.1f}" stroke="currentColor" stroke-dasharray="4 3" '
            f'stroke-opacity="0.8"/>'
        )
    for v, text in zip(y_ticks, y_texts, strict=True):  # grid lines and their values
        parts.append(
            f'<line x1="{left:.1f}" y1="{py(v):.1f}" x2="{right:.1f}" y2="{py(v):.1f}" '
            f'stroke="currentColor" stroke-opacity="0.15"/>'
            f'<text x="{left - 6:.1f}" y="{py(v) + 4:.1f}" text-anchor="end">{text}</text>'
        )
    for v in x_ticks:
        parts.append(
            f'<line x1="{px(v):.1f}" y1="{bottom:.1f}" x2="{px(v):.1f}" y2="{bottom + 4:.1f}" '
            f'stroke="currentColor"/>'
            f'<text x="{px(v):.1f}" y="{bottom + 17:.1f}" text-anchor="middle">{v:g}</text>'
        )
    parts.append(
        f'<path d="M{left:.1f},{top:.1f}V{bottom:.1f}H{right:.1f}" fill="none" '
        f'stroke="currentColor"/>'
    )
    height = bottom + 22
    if x_label:
        height += _FONT + 4
        parts.append(
            f'<text x="{(left + right) / 2:.1f}" y="{height - 4:.1f}" '
            f'text-anchor="middle">{escape(x_label)}</text>'
        )
    if y_label:
        middle = (top + bottom) / 2
        parts.append(
            f'<text x="{_PAD + _FONT}" y="{middle:.1f}" text-anchor="middle" '
            f'transform="rotate(-90 {_PAD + _FONT} {middle:.1f})">{escape(y_label)}</text>'
        )
    for i, (name, values) in enumerate(series.items()):  # last: drawn over everything else
        d = [f"M{px(times[0]):.1f},{py(values[0]):.1f}"]
        d += [f"H{px(t):.1f}V{py(v):.1f}" for t, v in zip(times[1:], values[1:], strict=True)]
        colour, dash = PALETTE[i % len(PALETTE)], DASHES[i % len(DASHES)]
        parts.append(
            f'<path class="series" d="{"".join(d)}" fill="none" stroke="{colour}" '
            f'stroke-width="2.5" stroke-dasharray="{dash}" stroke-linejoin="round">'
            f"<title>{escape(name)}</title></path>"
        )
    return _svg(width, height, title or "timeline chart", parts)
