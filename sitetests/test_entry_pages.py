"""The entry pages, the home page and the pitfall catalogue, fit their column on every screen.

Their tables are what a newcomer reads first: a table wider than the article column hides its
last columns off-screen on a desktop, so nothing on these pages may reach past the column or
scroll sideways inside it, at 1280 px and at 390 px.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page

from sitetests.site_check import DESKTOP, PHONE, browser_pages, column_fit, serving

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "docs" / "_build" / "html"
SCREENSHOTS = ROOT / "docs" / "_build" / "screenshots"
ENTRY_PAGES = ("index", "pitfalls")


PAGE = """<!doctype html><html><head><meta name="viewport" content="width=device-width">
<link rel="icon" href="data:,"><title>t</title></head><body>
<article style="width: 600px"><table><tr><td style="white-space: nowrap">{}</td></tr></table>
<details><summary>folded</summary><p style="width: 900px">{}</p></details></article>
</body></html>"""


def test_the_column_check_finds_a_wide_table_and_what_a_details_folds(tmp_path: Path) -> None:
    """A table or a folded paragraph wider than the article is reported; narrow ones are not."""
    (tmp_path / "table.html").write_text(PAGE.format("a cell far too wide " * 10, "folded"))
    (tmp_path / "folded.html").write_text(PAGE.format("a cell", "folded"))
    (tmp_path / "fits.html").write_text(
        PAGE.format("a cell", "folded").replace("width: 900px", "width: 500px")
    )
    found = {}
    with serving(tmp_path) as url, browser_pages() as opened:
        for name in ("table", "folded", "fits"):
            opened[DESKTOP].goto(f"{url}/{name}.html", wait_until="load")
            found[name] = column_fit(opened[DESKTOP])
    assert found["table"].column == 600
    assert found["table"].tables[0] > 600
    assert found["table"].wide[0].startswith("table")
    assert [w.split()[0] for w in found["folded"].wide] == ["p"]
    assert found["fits"].wide == []
    assert found["fits"].tables[0] <= 600


@pytest.mark.parametrize("width", [DESKTOP, PHONE], ids=["desktop", "phone"])
@pytest.mark.parametrize("name", ENTRY_PAGES)
def test_the_entry_pages_tables_fit_the_article_column(
    base: str, tabs: dict[int, Page], name: str, width: int
) -> None:
    """No table (nor anything else) is wider than the column, and nothing scrolls sideways."""
    tab = tabs[width]
    tab.goto(f"{base}/{name}.html", wait_until="load")
    fit = column_fit(tab)
    assert fit.tables, f"{name}.html has no table"
    assert not fit.wide, (
        f"{name}.html @ {width}px: column {fit.column}px, tables {fit.tables}px: "
        + "; ".join(fit.wide)
    )
    assert max(fit.tables) <= fit.column


def test_the_catalogue_is_grouped_by_page_in_reading_order(
    base: str, tabs: dict[int, Page]
) -> None:
    """One section per page, in the sidebar's order, each with its tests folded away.

    The sections with a table are the pages'; the page's last section says how it is made.
    """
    tab = tabs[DESKTOP]
    tab.goto(f"{base}/pitfalls.html", wait_until="load")
    sections = tab.evaluate(
        "[...document.querySelectorAll('article section section')]"
        ".filter(s => s.querySelector('.pitfall-catalogue')).map(s => ["
        " s.querySelector('h2').textContent.replace('¶', '').trim(),"
        " s.querySelector('p a.reference.internal').getAttribute('href'),"
        " s.querySelectorAll('table tbody tr').length,"
        " s.querySelectorAll('details li').length])"
    )
    tab.goto(f"{base}/index.html", wait_until="load")
    sidebar = tab.evaluate(
        "[...document.querySelectorAll('.sidebar-tree a.reference.internal')]"
        ".map(a => a.getAttribute('href'))"
    )
    order = [sidebar.index(href) for _, href, _, _ in sections]
    assert order == sorted(order), sections
    assert all(rows and rows == tests for _, _, rows, tests in sections), sections


def test_next_from_the_home_page_is_the_decision_guide(base: str, tabs: dict[int, Page]) -> None:
    """The sidebar starts with the guide and the principles; "next" reaches the guide first."""
    tab = tabs[DESKTOP]
    tab.goto(f"{base}/index.html", wait_until="load")
    first = tab.evaluate(
        "[...document.querySelectorAll('.sidebar-tree a.reference.internal')]"
        ".slice(0, 2).map(a => a.textContent.trim())"
    )
    assert first == ["Which pattern do I need?", "Why these patterns"]
    assert tab.get_attribute("a.next-page", "href") == "guide.html"


def test_screenshots_of_the_entry_pages(base: str, tabs: dict[int, Page]) -> None:
    """The home page's table and the catalogue's top, desktop and phone, from this very run.

    Written to docs/_build/screenshots/ (the home page's top is test_site.py's ``index-*``).
    """
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for name, shot_name, scroll_to in (
        ("index", "index-table", "article .pattern-index"),
        ("pitfalls", "pitfalls", "article section section"),
    ):
        for width, tab in tabs.items():
            tab.goto(f"{base}/{name}.html", wait_until="load")
            if scroll_to:
                # Scrolled down to, never up (furo shows "back to top" on the way up).
                tab.evaluate(
                    f"window.scrollTo(0, document.querySelector('{scroll_to}')"
                    ".getBoundingClientRect().top + window.scrollY - 90)"
                )
            shot = SCREENSHOTS / f"{shot_name}-{width}.png"
            tab.screenshot(path=str(shot), full_page=False)
            assert shot.stat().st_size > 1000
