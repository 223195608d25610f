"""The pictures as a reader sees them: SVG text large enough to read, race pictures whole.

Also the checker itself, on pictures drawn wrong on purpose, and the screenshots of three
race pictures at 1280 and 390 px (docs/_build/screenshots/).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page

from sitetests.pictures import check_pictures
from sitetests.site_check import DESKTOP, PHONE, pages_of, serving

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "docs" / "_build" / "html"
SCREENSHOTS = ROOT / "docs" / "_build" / "screenshots"


@pytest.mark.parametrize("width", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_every_svg_text_is_readable_and_race_pictures_keep_their_size(
    tabs: dict[int, Page], width: int
) -> None:
    """11 px or more as displayed; both halves of a race picture one size; stacked on a phone."""
    with serving(SITE) as base:
        problems = check_pictures(base, pages_of(SITE), tabs[width], width)
    assert not problems, "\n".join(map(str, problems))


RACE_PICTURES = ("async_queue", "bulkhead", "asyncio_shutdown")
_NO_OVERLAYS = ".mobile-header, .back-to-top, .skip-to-content { visibility: hidden !important; }"


def test_screenshots_of_three_race_pictures(tabs: dict[int, Page]) -> None:
    """Each figure whole, at 1280 and 390 px, from this very build."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with serving(SITE) as base:
        for name in RACE_PICTURES:
            for width, tab in tabs.items():
                tab.goto(f"{base}/patterns/{name}.html", wait_until="load")
                tab.add_style_tag(content=_NO_OVERLAYS)  # furo's bars would cover the figure
                shot = SCREENSHOTS / f"race-{name}-{width}.png"
                tab.locator("figure.race-lanes").first.screenshot(path=str(shot))
                assert shot.stat().st_size > 1000


def test_graphviz_diagrams_are_inverted_in_dark_mode_only(tabs: dict[int, Page]) -> None:
    """Dark ink on pale boxes would be white boxes on a dark page: dark mode inverts them once."""
    tab = tabs[DESKTOP]
    # For each diagram, how many of the boxes it is drawn in (itself included) invert it:
    # two inversions would give back the white boxes.
    inversions = (
        "[...document.querySelectorAll('object.graphviz, img.graphviz')].map(e => {"
        " let n = 0; for (let a = e; a; a = a.parentElement)"
        "  if (getComputedStyle(a).filter.includes('invert')) n++;"
        " return n; })"
    )
    with serving(SITE) as base:
        try:
            for scheme, expected in (("dark", 1), ("light", 0)):
                tab.emulate_media(color_scheme=scheme)
                tab.goto(f"{base}/patterns/signal_handlers.html", wait_until="load")
                found = tab.evaluate(inversions)
                assert found, "no graphviz diagram on the signal handlers page"
                assert set(found) == {expected}, (scheme, found)
        finally:
            tab.emulate_media(color_scheme="no-preference")


# --- the checker, on pictures drawn wrong on purpose -------------------------------------

PAGE = """<!doctype html><html><head><meta name="viewport" content="width=device-width">
<link rel="icon" href="data:,"><title>t</title></head><body><article>{}</article></body></html>"""


def _svg(width: int, box: str = "") -> str:
    """An SVG ``width`` px wide with 12 px text, in a box styled ``box``."""
    return (
        f'<div class="race-lanes-one" style="{box}"><svg xmlns="http://www.w3.org/2000/svg" '
        f'viewBox="0 0 {width} 40" width="{width}" height="40" '
        f'style="max-width:100%;height:auto" font-size="12"><text x="4" y="20">lane</text>'
        "</svg></div>"
    )


def _figure(*halves: str, side_by_side: bool = False) -> str:
    pair = "display:flex;gap:8px" if side_by_side else "display:flex;flex-wrap:wrap;gap:8px"
    return (
        f'<figure class="race-lanes" id="race-lanes-x"><div style="{pair}">'
        + "".join(halves)
        + "</div></figure>"
    )


def test_the_checker_catches_shrunken_text_unequal_halves_and_a_pair_that_does_not_stack(
    tmp_path: Path, tabs: dict[int, Page]
) -> None:
    """Each page is drawn wrong one way; the good one passes at both widths."""
    good = _figure(_svg(300, "flex:1 1 300px"), _svg(300, "flex:1 1 300px"))
    pages = {
        "good.html": good,
        # 800 px of picture in a 360 px column: 12 px text shows at 5.4 px.
        "shrunk.html": _figure(_svg(800, "width:360px"), _svg(800, "width:360px")),
        "unequal.html": _figure(_svg(300, "width:300px"), _svg(300, "width:200px")),
        "side.html": _figure(_svg(300), _svg(300), side_by_side=True),
    }
    for name, body in pages.items():
        (tmp_path / name).write_text(PAGE.format(body))
    with serving(tmp_path) as base:
        desktop = check_pictures(base, pages_of(tmp_path), tabs[DESKTOP], DESKTOP)
        phone = check_pictures(base, pages_of(tmp_path), tabs[PHONE], PHONE)
    found = {(p.page, p.kind) for p in desktop + phone}
    assert ("shrunk.html", "SVG text too small") in found
    assert ("unequal.html", "race picture halves differ in size") in found
    assert ("side.html", "race picture not stacked") in found
    assert not [p for p in desktop + phone if p.page == "good.html"], found
    assert not [p for p in desktop if p.page == "side.html"]  # side by side is fine there


def _svg_file(width: int) -> str:
    """A standalone SVG ``width`` units wide (a graphviz diagram's shape) with 12-unit text."""
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}pt" height="40pt" '
        f'viewBox="0 0 {width} 40"><g font-size="12"><text x="4" y="20">node</text></g></svg>'
    )


def test_the_checker_measures_diagrams_in_objects_and_images_at_both_widths(
    tmp_path: Path, tabs: dict[int, Page]
) -> None:
    """A diagram shrunk into a narrow box is too small, as an ``<object>`` and as an ``<img>``."""
    (tmp_path / "wide.svg").write_text(_svg_file(800))
    (tmp_path / "narrow.svg").write_text(_svg_file(300))
    shrunk = 'style="width:360px;max-width:100%"'
    pages = {
        # 800 units shown 360 px wide: 12-unit text shows at 5.4 px, at either width.
        "object.html": f'<figure id="f"><object data="wide.svg" type="image/svg+xml" {shrunk}>'
        "</object></figure>",
        "img.html": f'<img src="wide.svg" alt="wide" {shrunk}>',
        # 300 units shown 300 px wide: 12 px text.
        "good.html": '<object data="narrow.svg" type="image/svg+xml" style="width:300px">'
        '</object><img src="narrow.svg" alt="narrow" style="width:300px">',
    }
    for name, body in pages.items():
        (tmp_path / name).write_text(PAGE.format(body))
    with serving(tmp_path) as base:
        found = {
            (p.page, p.width, p.kind)
            for width in (DESKTOP, PHONE)
            for p in check_pictures(base, pages_of(tmp_path), tabs[width], width)
        }
    assert found == {
        (page, width, "SVG text too small")
        for page in ("object.html", "img.html")
        for width in (DESKTOP, PHONE)
    }
