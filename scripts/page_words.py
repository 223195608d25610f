"""The words a reader meets above Evidence on each pattern page, prose and code apart.

Run after ``make docs``: ``.venv/bin/python scripts/page_words.py`` prints a Markdown table
from the built site (the same count as sitetests/test_pattern_pages.py, whose budget is
1,500 words of prose; code is counted apart, as words in code blocks).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sitetests.test_pattern_pages import SITE, prose_words  # noqa: E402


def main() -> None:
    """Print the table, one row per built pattern page."""
    rows = ["| page | prose words above Evidence | code words above Evidence | code blocks |"]
    rows.append("|---|---:|---:|---:|")
    for page in sorted((SITE / "patterns").glob("*.html")):
        counted = prose_words(page.read_text(encoding="utf-8"))
        rows.append(
            f"| {page.stem} | {counted.above:,} | {counted.code_above:,}"
            f" | {counted.code_blocks_above} |"
        )
    print("\n".join(rows))


if __name__ == "__main__":
    main()
