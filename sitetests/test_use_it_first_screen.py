"""Each pattern page shows how to use it on its first screen: a desktop reader sees code at once.

At 1280 x 900, the first code block of every pattern page starts above the fold (900 px),
and it is the page's "Use it" program.
"""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Page

from sitetests.site_check import DESKTOP

ROOT = Path(__file__).resolve().parent.parent
FOLD = 900  # the desktop tab's height, in CSS pixels

# Where the article's first code block starts, and the id of the section holding it.
_FIRST_CODE = """() => {
  const pre = document.querySelector('article div.highlight pre');
  if (!pre) return null;
  const section = pre.closest('section[id]');
  return [pre.getBoundingClientRect().top + window.scrollY, section ? section.id : ''];
}"""


def test_the_first_code_block_of_every_pattern_page_starts_on_the_first_screen(
    base: str, tabs: dict[int, Page]
) -> None:
    """On every pattern page at 1280 px, the Use-it program starts above 900 px."""
    tab = tabs[DESKTOP]
    names = sorted(p.stem for p in (ROOT / "docs" / "patterns").glob("*.md"))
    assert names, "no pattern pages"
    late = []
    for name in names:
        tab.goto(f"{base}/patterns/{name}.html", wait_until="load")
        found = tab.evaluate(_FIRST_CODE)
        if found is None:
            late.append(f"{name}: no code block")
            continue
        top, section = found
        if top >= FOLD or section != "use-it":
            late.append(f"{name}: first code block at {top:.0f}px, in section {section!r}")
    assert not late, "\n".join(late)
