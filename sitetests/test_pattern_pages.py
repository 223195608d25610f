"""Pattern pages a learner finishes: short above their folded Evidence section.

Each page teaches the problem, the picture, the fix, why it works and its limits, then folds
test names, version notes and internals into a final "Evidence" section. The words a reader
meets before that section are counted in the built HTML: the article's text, without code
blocks, pictures (figures, SVG) and heading link marks.
"""

from __future__ import annotations

import html.parser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "docs" / "_build" / "html"
WORD_BUDGET = 1500

# Text inside these elements is not prose: code, pictures and their captions, scripts.
_NOT_PROSE = {"pre", "svg", "figure", "script", "style"}


class _ProseWords(html.parser.HTMLParser):
    """Counts the article's prose words before and inside the section with id "evidence"."""

    def __init__(self) -> None:
        super().__init__()
        self.above = 0
        self.evidence = 0
        self.code_above = 0  # words in code blocks (<pre>) above Evidence, counted apart
        self.code_blocks_above = 0
        self.folded = False  # a <details> inside the Evidence section
        self._in_article = False
        self._in_evidence = False
        self._skip = 0
        self._headerlink = 0
        self._in_code = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "article":
            self._in_article = True
        if tag == "section" and values.get("id") == "evidence":
            self._in_evidence = True
        if tag == "details" and self._in_evidence:
            self.folded = True
        if tag in _NOT_PROSE:
            self._skip += 1
        if tag == "pre" and self._in_article and not self._in_evidence:
            self.code_blocks_above += 1
            self._in_code = True
        if tag == "a" and "headerlink" in (values.get("class") or "").split():
            self._headerlink += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "article":
            self._in_article = False
        if tag in _NOT_PROSE and self._skip:
            self._skip -= 1
        if tag == "pre":
            self._in_code = False
        if tag == "a" and self._headerlink:
            self._headerlink -= 1

    def handle_data(self, data: str) -> None:
        if self._in_code:
            self.code_above += len(data.split())
        if not self._in_article or self._skip or self._headerlink:
            return
        words = len(data.split())
        if self._in_evidence:
            self.evidence += words
        else:
            self.above += words


def prose_words(page: str) -> _ProseWords:
    """Parse one built page; ``above`` and ``evidence`` are its prose word counts."""
    counter = _ProseWords()
    counter.feed(page)
    counter.close()
    return counter


def test_the_counter_skips_code_and_pictures_and_stops_at_evidence() -> None:
    """Prose counts above Evidence; code, pictures, link marks and the fold do not."""
    page = """<html><body><nav>menu words</nav><article>
    <h1>Title<a class="headerlink" href="#t">¶</a></h1><p>one two three</p>
    <pre>code code code</pre>
    <figure><svg><text>lane</text></svg><figcaption>cap tion</figcaption></figure>
    <section id="evidence"><h2>Evidence</h2>
    <details><summary>open me</summary><p>a b</p></details></section>
    </article></body></html>"""
    counted = prose_words(page)
    assert (counted.above, counted.evidence, counted.folded) == (4, 5, True)
    assert (counted.code_above, counted.code_blocks_above) == (3, 1)


def test_every_pattern_page_stays_under_its_word_budget_above_a_folded_evidence_section() -> None:
    """A reader meets at most 1,500 words before Evidence, which every pattern page folds away."""
    pages = sorted((SITE / "patterns").glob("*.html"))
    sources = sorted((ROOT / "docs" / "patterns").glob("*.md"))
    assert [p.stem for p in pages] == [s.stem for s in sources], "build the docs first"
    problems = []
    for page in pages:
        counted = prose_words(page.read_text(encoding="utf-8"))
        if not counted.folded:
            problems.append(f"{page.name}: no folded Evidence section")
        if counted.above >= WORD_BUDGET:
            problems.append(f"{page.name}: {counted.above} words above Evidence")
    assert not problems, "\n".join(problems)
