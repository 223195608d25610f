"""Small SVG charts drawn from a notebook's own run (teaching aid, not a pattern).

Call :func:`bar_chart`; it returns an SVG string that scales down (viewBox) and
uses ``currentColor`` so it reads in light and dark themes. Stdlib only.
"""

from __future__ import annotations

from collections.abc import Sequence
from xml.sax.saxutils import escape

__all__ = ["bar_chart"]


def bar_chart(bars: Sequence[tuple[str, float]], *, unit: str, title: str = "") -> str:
    """Horizontal bars, one per ``(label, value)``, each labelled with value and unit."""
    if not bars:
        raise ValueError("bar_chart needs at least one (label, value) bar; got none")
    for label, value in bars:
        if value < 0:
            raise ValueError(f"bar {label!r} has a negative value {value}")
    width, left, row = 600, 200, 30
    top = 30 if title else 10
    height = top + row * len(bars) + 10
    biggest = max(value for _, value in bars) or 1.0
    parts = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
            f'style="max-width:100%;height:auto" font-family="sans-serif" font-size="13">'
        )
    ]
    if title:
        parts.append(f'<text x="10" y="20" fill="currentColor">{escape(title)}</text>')
    for i, (label, value) in enumerate(bars):
        y = top + i * row
        length = (width - left - 110) * value / biggest
        parts.append(
            f'<text x="{left - 8}" y="{y + 18}" text-anchor="end" '
            f'fill="currentColor">{escape(label)}</text>'
        )
        parts.append(
            f'<rect class="bar" x="{left}" y="{y + 5}" width="{length:.1f}" height="18" '
            f'fill="currentColor" fill-opacity="0.6"/>'
        )
        parts.append(
            f'<text x="{left + length + 6:.1f}" y="{y + 18}" '
            f'fill="currentColor">{value:g} {escape(unit)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
