"""What a reader sees of the pictures drawn inline (SVG): text size, and the race pictures' halves.

`svg_text_sizes` measures every piece of SVG text in a page's article as displayed: its
computed font size times the scale its SVG is drawn at (from ``getScreenCTM``, so a
viewBox shrunk to its box counts, and so does any transform). `check_pictures` turns
that into `Problem` records: text under `MIN_TEXT_PX` (at phone widths, in the race
pictures only: the notebooks' charts still scale down with the column there); a race
picture (``figure.race-lanes``) whose two halves are drawn at different scales; and, at
phone widths, halves side by side instead of one above the other.

Pictures shown as documents of their own are measured too, at both widths: an SVG in an
``<object>`` (graphviz's diagrams) is read through its ``contentDocument``, whose text's
``getScreenCTM`` includes the scale the object is drawn at; an SVG in an ``<img>`` is
fetched and parsed, and each text's ``font-size`` is scaled by the image's displayed width
over its viewBox width.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from playwright.sync_api import Page

from sitetests.site_check import PHONE, Problem

MIN_TEXT_PX = 11.0

# [size in px as displayed, the text, the id of the figure it is in ("" if none)] for each
# piece of visible SVG text in the article.
_SIZES = (
    "(() => { const main = document.querySelector('article') || document.body;"
    " const out = [];"
    " for (const t of main.querySelectorAll('svg text')) {"
    "  const text = t.textContent.trim(); const r = t.getBoundingClientRect();"
    "  if (!text || !(r.width || r.height)) continue;"
    "  const m = t.getScreenCTM(); if (!m) continue;"
    "  const size = parseFloat(getComputedStyle(t).fontSize) * Math.hypot(m.a, m.b);"
    "  const fig = t.closest('figure');"
    "  out.push([size, text.slice(0, 40), fig && fig.id ? fig.id : '', 'inline']); }"
    " const where = e => (e.getAttribute('data') || e.getAttribute('src') || '')"
    "  .split('/').pop();"
    " for (const o of main.querySelectorAll('object')) {"
    "  const doc = o.contentDocument; if (!doc) continue;"
    "  for (const t of doc.querySelectorAll('svg text')) {"
    "   const text = t.textContent.trim(); const m = t.getScreenCTM();"
    "   if (!text || !m) continue;"
    "   const size = parseFloat(doc.defaultView.getComputedStyle(t).fontSize)"
    "    * Math.hypot(m.a, m.b);"
    "   out.push([size, text.slice(0, 40), where(o), 'object']); } }"
    " const imgs = [...main.querySelectorAll('img')].filter(i => /\\.svg($|[?#])/.test(i.src));"
    " return Promise.all(imgs.map(async i => {"
    "  const svg = new DOMParser().parseFromString(await (await fetch(i.src)).text(),"
    "   'image/svg+xml').documentElement;"
    "  const vb = svg.viewBox && svg.viewBox.baseVal && svg.viewBox.baseVal.width;"
    "  const scale = i.getBoundingClientRect().width / (vb || i.naturalWidth);"
    "  for (const t of svg.querySelectorAll('text')) {"
    "   const text = t.textContent.trim(); const f = t.closest('[font-size]');"
    "   if (!text) continue;"
    "   const size = parseFloat(f ? f.getAttribute('font-size') : '16') * scale;"
    "   out.push([size, text.slice(0, 40), where(i), 'img']); } })).then(() => out); })()"
)

# For each race picture: its id, each half's SVG scale (displayed width / viewBox width)
# and box (left, top, bottom).
_HALVES = (
    "[...document.querySelectorAll('article figure.race-lanes')].map(f => [f.id,"
    " [...f.querySelectorAll('.race-lanes-one')].map(h => { const s = h.querySelector('svg');"
    "  const r = h.getBoundingClientRect();"
    "  const scale = s ? s.getBoundingClientRect().width / s.viewBox.baseVal.width : 0;"
    "  return [scale, r.left, r.top, r.bottom]; })])"
)


@dataclass(frozen=True)
class TextSize:
    """One piece of SVG text as displayed: its size in px, its first 40 characters, its figure.

    ``source`` says how the SVG is shown: ``inline``, in an ``object``, or as an ``img``;
    ``figure`` is the id of the inline SVG's figure, or the file name of an object's or image's.
    """

    px: float
    text: str
    figure: str
    source: str = "inline"


def svg_text_sizes(page: Page) -> list[TextSize]:
    """Every visible piece of SVG text in the loaded page's article, with its displayed size."""
    return [
        TextSize(float(px), str(text), str(fig), str(source))
        for px, text, fig, source in page.evaluate(_SIZES)
    ]


def check_pictures(base: str, pages: Sequence[Path], page: Page, width: int) -> list[Problem]:
    """Load each page at ``width``; the text too small to read and the race pictures misdrawn."""
    problems: list[Problem] = []
    for name in pages:
        page.goto(f"{base}/{name.as_posix()}", wait_until="load")
        small = [
            t
            for t in svg_text_sizes(page)
            if t.px < MIN_TEXT_PX - 0.05
            and (width > PHONE or t.figure.startswith("race-lanes") or t.source != "inline")
        ]
        if small:
            least = min(small, key=lambda t: t.px)
            problems.append(
                Problem(
                    str(name),
                    width,
                    "SVG text too small",
                    f"{len(small)} text(s) under {MIN_TEXT_PX:g} px, the smallest "
                    f"{least.px:.1f} px: {least.text!r} in #{least.figure or '?'}"
                    f" ({least.source})",
                )
            )
        for figure, halves in page.evaluate(_HALVES):
            scales = [h[0] for h in halves]
            if len(halves) != 2 or not all(scales):
                problems.append(Problem(str(name), width, "race picture", f"#{figure}: not 2 SVGs"))
                continue
            if abs(scales[0] - scales[1]) > 0.01 * max(scales):
                problems.append(
                    Problem(
                        str(name),
                        width,
                        "race picture halves differ in size",
                        f"#{figure}: drawn at {scales[0]:.2f} and {scales[1]:.2f}",
                    )
                )
            (_, _, _, first_bottom), (_, _, second_top, _) = halves
            if width <= PHONE and second_top < first_bottom - 1:
                problems.append(Problem(str(name), width, "race picture not stacked", f"#{figure}"))
    return problems
