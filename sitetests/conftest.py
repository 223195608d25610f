"""The browser checks' shared fixtures: the built site served locally, and two tabs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page

from sitetests.site_check import browser_pages, serving

SITE = Path(__file__).resolve().parent.parent / "docs" / "_build" / "html"


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    """The built site, served on 127.0.0.1."""
    assert (SITE / "index.html").exists(), "no built site: run `make docs` first"
    with serving(SITE) as url:
        yield url


@pytest.fixture(scope="module")
def tabs() -> Iterator[dict[int, Page]]:
    """A desktop tab and a phone tab in one headless Chromium."""
    with browser_pages() as opened:
        yield opened
