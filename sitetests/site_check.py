"""Load every page of a built HTML site in headless Chromium and list what a reader would trip on.

`check_site` serves the directory on 127.0.0.1, opens each page at each viewport width and
returns a `Problem` for: a console error or an uncaught script error, a resource answered
with an HTTP error or not loaded at all, an image that did not load, (at phone widths) a
page body wider than the screen, and (at desktop widths) a table that scrolls sideways in
its box. Links and anchors are checked from the HTML files themselves: every same-site link
must name a file that exists, and its ``#fragment`` an id on that page. Nothing leaves the
machine: external links are not followed.

The browser is the system's Chromium (Debian's package; ``scripts/need.sh`` installs it),
driven by Playwright with ``executable_path``, so no browser is downloaded.
"""

from __future__ import annotations

import functools
import html.parser
import http.server
import os
import threading
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from playwright.sync_api import ConsoleMessage, Page, Request, Response, sync_playwright

DESKTOP, PHONE = 1280, 390


@dataclass(frozen=True)
class Problem:
    """One thing wrong on one page; ``width`` is 0 for problems found in the HTML source."""

    page: str
    width: int
    kind: str
    detail: str

    def __str__(self) -> str:
        where = f"{self.page} @ {self.width}px" if self.width else self.page
        return f"{where}: {self.kind}: {self.detail}"


class _Anchors(html.parser.HTMLParser):
    """Collects a page's ids and the targets of its links."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for name in ("id", "name") if tag == "a" else ("id",):
            if values.get(name):
                self.ids.add(str(values[name]))
        if tag == "a" and values.get("href"):
            self.links.append(str(values["href"]))


def pages_of(root: Path) -> list[Path]:
    """Every HTML page of the site, relative to ``root``, static assets left out."""
    return sorted(
        p.relative_to(root)
        for p in root.rglob("*.html")
        if not {"_static", "_sources"} & set(p.relative_to(root).parts)
    )


def check_links(root: Path, pages: Sequence[Path]) -> list[Problem]:
    """Same-site links whose file or ``#fragment`` does not exist."""
    parsed: dict[Path, _Anchors] = {}

    def parse(path: Path) -> _Anchors:
        if path not in parsed:
            anchors = _Anchors()
            anchors.feed(path.read_text(encoding="utf-8"))
            parsed[path] = anchors
        return parsed[path]

    problems = []
    for page in pages:
        source = root / page
        for href in parse(source).links:
            url = urllib.parse.urlsplit(href)
            if url.scheme or url.netloc:  # another site (or mailto:): not followed
                continue
            target = (
                source
                if not url.path
                else (source.parent / urllib.parse.unquote(url.path)).resolve()
            )
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                problems.append(Problem(str(page), 0, "broken link", href))
            elif (
                url.fragment
                and target.suffix == ".html"
                and urllib.parse.unquote(url.fragment) not in parse(target).ids
            ):
                problems.append(Problem(str(page), 0, "broken anchor", href))
    return problems


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        """No access log: the problems list is the report."""


@contextmanager
def serving(root: Path) -> Iterator[str]:
    """Serve ``root`` on 127.0.0.1 for the duration; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="site-server")
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


_BROKEN_IMAGES = "[...document.images].filter(i => !i.complete || !i.naturalWidth).map(i => i.src)"
_OVERFLOW = (
    "(() => { const d = document.documentElement;"
    " return d.scrollWidth > d.clientWidth ? [d.scrollWidth, d.clientWidth] : null; })()"
)
# Content wider than the screen that no scrolling box inside the article holds: it is cut
# off, or it makes the page's whole content area scroll sideways (furo's ``div.content``
# scrolls, so the body's width alone does not show it). A table or a code block that
# scrolls inside its own box is fine: that box fits, and the reader scrolls just it.
_SPILLS = (
    "(() => { const w = document.documentElement.clientWidth; const found = [];"
    " const main = document.querySelector('article') || document.body;"
    " for (const e of main.querySelectorAll('*')) {"
    "  const r = e.getBoundingClientRect();"
    "  if (!r.width || r.right <= w + 1) continue;"
    "  let a = e.parentElement, held = false;"
    "  while (a && a !== main) {"
    "   const ox = getComputedStyle(a).overflowX;"
    "   if ((ox === 'auto' || ox === 'scroll') && a.getBoundingClientRect().right <= w + 1)"
    "    { held = true; break; }"
    "   a = a.parentElement; }"
    "  if (held) continue;"
    "  found.push(e.tagName.toLowerCase() + (e.className ? '.' + String(e.className)"
    "   .trim().split(/\\s+/).join('.') : '') + ' to ' + Math.round(r.right) + 'px');"
    "  if (found.length === 3) break; }"
    " return found; })()"
)

# Tables that scroll sideways inside their box (furo's ``div.table-wrapper``), with how many
# px are hidden, named by the heading of the section they are in. Folded <details> are opened
# first, so a table in a fold is measured too.
_SCROLLING_TABLES = (
    "(() => { document.querySelectorAll('article details').forEach(d => { d.open = true; });"
    " const main = document.querySelector('article') || document.body; const found = [];"
    " for (const t of main.querySelectorAll('table')) {"
    "  let a = t.parentElement;"
    "  while (a && a !== main && !['auto', 'scroll'].includes(getComputedStyle(a).overflowX))"
    "   a = a.parentElement;"
    "  if (!a || a === main || a.scrollWidth <= a.clientWidth + 1) continue;"
    "  const s = t.closest('section'); const h = s && s.querySelector('h1, h2, h3, h4');"
    "  found.push([h ? h.textContent.replace(/[#\\u00b6]/g, '').trim() : '?',"
    "   a.scrollWidth - a.clientWidth]); }"
    " return found; })()"
)


def check_pages(
    base: str,
    pages: Sequence[Path],
    page: Page,
    width: int,
) -> list[Problem]:
    """Load each page in ``page`` (a browser tab at ``width``) and collect what went wrong."""
    problems: list[Problem] = []
    current = [""]

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            problems.append(Problem(current[0], width, "console error", message.text))

    def on_response(response: Response) -> None:
        if response.status >= 400:
            problems.append(
                Problem(current[0], width, "missing resource", f"{response.status} {response.url}")
            )

    page.on("console", on_console)
    page.on(
        "pageerror",
        lambda exc: problems.append(Problem(current[0], width, "script error", str(exc))),
    )
    page.on("response", on_response)

    def on_failed(request: Request) -> None:
        # A request cut short because the tab moved on to the next page (the favicon, often)
        # is not the page's fault; a missing file shows up as an HTTP error instead.
        if request.failure != "net::ERR_ABORTED":
            problems.append(
                Problem(
                    current[0], width, "resource not loaded", f"{request.url} ({request.failure})"
                )
            )

    page.on("requestfailed", on_failed)
    for name in pages:
        current[0] = str(name)
        page.goto(f"{base}/{name.as_posix()}", wait_until="load")
        for src in page.evaluate(_BROKEN_IMAGES):
            problems.append(Problem(str(name), width, "image not loaded", src))
        if width > PHONE:  # on a phone a wide table may scroll in its box; here it must fit
            for heading, hidden in page.evaluate(_SCROLLING_TABLES):
                problems.append(
                    Problem(
                        str(name),
                        width,
                        "table scrolls sideways",
                        f"{hidden} px hidden, in the section {heading!r}",
                    )
                )
        if width <= PHONE:
            overflow = page.evaluate(_OVERFLOW)
            if overflow:
                problems.append(
                    Problem(
                        str(name),
                        width,
                        "horizontal scroll",
                        f"body {overflow[0]}px wide on a {overflow[1]}px screen",
                    )
                )
            for spill in page.evaluate(_SPILLS):
                problems.append(
                    Problem(str(name), width, "wider than the screen, not in a scroll box", spill)
                )
    page.remove_listener("console", on_console)
    page.remove_listener("response", on_response)
    page.remove_listener("requestfailed", on_failed)
    return problems


def search_hits(base: str, page: Page, query: str) -> int:
    """How many results the site's search page lists for ``query``."""
    page.goto(f"{base}/search.html?q={urllib.parse.quote(query)}", wait_until="load")
    page.wait_for_function(
        "document.querySelector('#search-results') &&"
        " !document.querySelector('#search-results').textContent.includes('Searching')",
        timeout=20_000,
    )
    return int(page.evaluate("document.querySelectorAll('#search-results li').length"))


# What sticks out of the article column on the page loaded in a tab: every element whose box
# reaches more than 8 px past the column's edges, and every box that scrolls sideways inside
# it. The 8 px are furo's own: a heading's background reaches 0.5rem into the margin on each
# side, and a table's wrapper is the column's width plus 0.2rem of padding. Folded <details>
# are opened first, so what they hold is measured too.
_COLUMN = (
    "(() => { document.querySelectorAll('article details').forEach(d => { d.open = true; });"
    " const main = document.querySelector('article') || document.body;"
    " const col = main.getBoundingClientRect(); const wide = [];"
    " const name = e => e.tagName.toLowerCase() + (typeof e.className === 'string'"
    "  && e.className.trim() ? '.' + e.className.trim().split(/\\s+/).join('.') : '');"
    " for (const e of main.querySelectorAll('*')) {"
    "  const r = e.getBoundingClientRect();"
    "  if (!r.width) continue;"
    "  if (r.right > col.right + 8 || r.left < col.left - 8) {"
    "   wide.push(name(e) + ' ' + Math.round(r.width) + 'px wide, reaching '"
    "    + Math.round(r.right - col.left) + 'px into the column');"
    "  } else if (e.scrollWidth > e.clientWidth + 1"
    "   && ['auto', 'scroll'].includes(getComputedStyle(e).overflowX)) {"
    "   wide.push(name(e) + ' scrolls sideways: ' + e.scrollWidth + 'px in '"
    "    + e.clientWidth + 'px');"
    "  }"
    "  if (wide.length === 5) break; }"
    " return {column: Math.round(col.width),"
    "  tables: [...main.querySelectorAll('table')]"
    "   .map(t => Math.round(t.getBoundingClientRect().width)),"
    "  wide}; })()"
)


@dataclass(frozen=True)
class ColumnFit:
    """A page's article column: its width, each table's width, and what sticks out of it."""

    column: int
    tables: list[int]
    wide: list[str]


def column_fit(page: Page) -> ColumnFit:
    """Measure the page loaded in ``page``: nothing may reach past the article column or scroll."""
    found = page.evaluate(_COLUMN)
    return ColumnFit(int(found["column"]), [int(w) for w in found["tables"]], list(found["wide"]))


def chromium_path() -> str:
    """The system Chromium: ``$CHROMIUM``, else Debian's ``/usr/bin/chromium``."""
    return os.environ.get("CHROMIUM", "/usr/bin/chromium")


@contextmanager
def browser_pages() -> Iterator[dict[int, Page]]:
    """One tab per viewport width (desktop and phone) in a headless system Chromium."""
    args = ["--no-sandbox"] if os.geteuid() == 0 else []  # Chromium's sandbox refuses root
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=args)
        try:
            yield {
                width: browser.new_context(viewport={"width": width, "height": 900}).new_page()
                for width in (DESKTOP, PHONE)
            }
        finally:
            browser.close()
