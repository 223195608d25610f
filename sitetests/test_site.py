"""The built site, as a reader's browser sees it: at 1280 px and at 390 px (a phone)."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page

from sitetests.site_check import (
    DESKTOP,
    PHONE,
    check_links,
    check_pages,
    pages_of,
    search_hits,
)

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "docs" / "_build" / "html"
SCREENSHOTS = ROOT / "docs" / "_build" / "screenshots"
PAGES = pages_of(SITE)


def test_the_site_is_built_with_every_page() -> None:
    """`make docs` ran first: the home page, the guide and every pattern page are there."""
    assert (SITE / "index.html").exists(), "no built site: run `make docs` first"
    names = {p.as_posix() for p in PAGES}
    patterns = {f"patterns/{p.stem}.html" for p in (ROOT / "docs" / "patterns").glob("*.md")}
    assert {"index.html", "guide.html", "search.html"} | patterns <= names


def test_every_same_site_link_and_anchor_resolves() -> None:
    """No link on any page points at a missing page or at an id its page lacks."""
    problems = check_links(SITE, PAGES)
    assert not problems, "\n".join(map(str, problems))


@pytest.mark.parametrize("width", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_every_page_loads_without_errors_and_fits_the_screen(
    base: str, tabs: dict[int, Page], width: int
) -> None:
    """No console error, no missing resource or image; at 390 px nothing spills sideways."""
    problems = check_pages(base, PAGES, tabs[width], width)
    assert not problems, "\n".join(map(str, problems))


def test_the_search_page_finds_sigterm(base: str, tabs: dict[int, Page]) -> None:
    """The search index is built and loads: "SIGTERM" has results."""
    assert search_hits(base, tabs[DESKTOP], "SIGTERM") > 0


def test_screenshots_of_the_home_page_a_pattern_page_and_the_guide(
    base: str, tabs: dict[int, Page]
) -> None:
    """Written to docs/_build/screenshots/, desktop and phone, from this very run."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for page in ("index", "guide", "patterns/executor_shutdown"):
        for width, tab in tabs.items():
            tab.goto(f"{base}/{page}.html", wait_until="load")
            shot = SCREENSHOTS / f"{page.replace('/', '-')}-{width}.png"
            tab.screenshot(path=str(shot), full_page=False)
            assert shot.stat().st_size > 1000
