"""The site checker itself: a small site broken on purpose must produce every kind of problem."""

from __future__ import annotations

from pathlib import Path

from sitetests.site_check import (
    DESKTOP,
    PHONE,
    browser_pages,
    check_links,
    check_pages,
    pages_of,
    serving,
)

GOOD = """<!doctype html><html><head><meta name="viewport" content="width=device-width">
<link rel="icon" href="data:,"><title>good</title></head><body><h1 id="top">Good</h1>
<p><a href="#top">here</a> <a href="other.html#part">there</a> <a href="https://example.org/">out</a></p>
</body></html>"""

OTHER = """<!doctype html><html><head><meta name="viewport" content="width=device-width">
<link rel="icon" href="data:,"><title>other</title></head>
<body><h2 id="part">Part</h2></body></html>"""

BROKEN = """<!doctype html><html><head><meta name="viewport" content="width=device-width">
<link rel="icon" href="data:,"><title>broken</title></head><body>
<p><a href="missing.html">gone</a> <a href="other.html#nowhere">no such anchor</a></p>
<table><tr><td style="white-space: nowrap">{}</td></tr></table>
<img src="missing.png" alt="lost">
<script>console.error("boom")</script>
</body></html>""".format("a cell that does not wrap, far wider than a phone's screen " * 2)


def _site(tmp_path: Path, *, broken: bool) -> Path:
    (tmp_path / "index.html").write_text(GOOD)
    (tmp_path / "other.html").write_text(OTHER)
    if broken:
        (tmp_path / "broken.html").write_text(BROKEN)
    return tmp_path


def test_a_clean_site_has_no_problems(tmp_path: Path) -> None:
    """The checker is quiet on a site with working links, anchors and a page that fits."""
    site = _site(tmp_path, broken=False)
    pages = pages_of(site)
    assert check_links(site, pages) == []
    with serving(site) as base, browser_pages() as tabs:
        assert check_pages(base, pages, tabs[DESKTOP], DESKTOP) == []
        assert check_pages(base, pages, tabs[PHONE], PHONE) == []


def test_each_kind_of_breakage_is_reported_on_its_page(tmp_path: Path) -> None:
    """A broken link and anchor, a 404 image, a console error and a too-wide table are caught."""
    site = _site(tmp_path, broken=True)
    pages = pages_of(site)
    links = {(p.kind, p.detail) for p in check_links(site, pages) if p.page == "broken.html"}
    assert links == {("broken link", "missing.html"), ("broken anchor", "other.html#nowhere")}
    with serving(site) as base, browser_pages() as tabs:
        desktop = {p.kind for p in check_pages(base, pages, tabs[DESKTOP], DESKTOP)}
        phone = check_pages(base, pages, tabs[PHONE], PHONE)
    assert {"console error", "missing resource", "image not loaded"} <= desktop
    assert "horizontal scroll" not in desktop
    wide = [p for p in phone if p.kind == "horizontal scroll"]
    assert [p.page for p in wide] == ["broken.html"], phone
    spills = [p for p in phone if p.kind.startswith("wider than the screen")]
    assert {p.page for p in spills} == {"broken.html"}, phone
    assert any(p.detail.startswith("table") for p in spills)  # it names what spills


WIDE_CELL = "a cell that does not wrap, far wider than a phone's screen " * 2
PAGE = """<!doctype html><html><head><meta name="viewport" content="width=device-width">
<link rel="icon" href="data:,"><title>{title}</title></head>
<body><div style="overflow-x: auto"><article>{body}</article></div></body></html>"""


def test_a_wide_table_counts_unless_a_box_inside_the_article_scrolls_it(tmp_path: Path) -> None:
    """A theme's scrolling content area hides a spill from the body's width; it still counts."""
    table = f'<table><tr><td style="white-space: nowrap">{WIDE_CELL}</td></tr></table>'
    (tmp_path / "spills.html").write_text(PAGE.format(title="spills", body=table))
    boxed = f'<div style="overflow-x: auto">{table}</div>'
    (tmp_path / "boxed.html").write_text(PAGE.format(title="boxed", body=boxed))
    with serving(tmp_path) as base, browser_pages() as tabs:
        phone = check_pages(base, pages_of(tmp_path), tabs[PHONE], PHONE)
    assert {p.page for p in phone} == {"spills.html"}, phone
    assert all(p.kind.startswith("wider than the screen") for p in phone), phone


def test_at_1280_px_a_table_that_scrolls_in_its_box_is_reported_with_what_it_hides(
    tmp_path: Path,
) -> None:
    """A table wider than its scrolling box hides columns at 1280 px; one that fits does not."""
    cell = "a_test_function_name_written_into_a_table_cell_and_far_too_long_to_wrap " * 3
    section = (
        '<section><h2>Exit statuses</h2><div style="overflow-x: auto; width: 700px">'
        '<table><tr><td style="white-space: nowrap">{}</td></tr></table></div></section>'
    )
    (tmp_path / "scrolls.html").write_text(PAGE.format(title="s", body=section.format(cell)))
    (tmp_path / "fits.html").write_text(PAGE.format(title="f", body=section.format("short")))
    with serving(tmp_path) as base, browser_pages() as tabs:
        desktop = check_pages(base, pages_of(tmp_path), tabs[DESKTOP], DESKTOP)
    assert [(p.page, p.kind) for p in desktop] == [("scrolls.html", "table scrolls sideways")]
    assert "in the section 'Exit statuses'" in desktop[0].detail
    assert int(desktop[0].detail.split(" px hidden")[0]) > 500
