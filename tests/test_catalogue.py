"""One pitfall catalogue: every ID a reader sees has its two race tests."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from tests import catalogue


def test_every_race_entry_has_a_naive_test_and_a_pattern_test() -> None:
    """A pitfall is demonstrated going wrong and shown fixed, never only one of the two."""
    half = {
        e.pitfall: ("no test_naive_*" if not e.naive else "no pattern test")
        for e in catalogue.entries().values()
        if not e.complete
    }
    assert not half, f"race entries missing a half: {half}"


def test_every_naive_race_test_records_what_it_observed() -> None:
    """A naive test takes ``record_property``, so `make races` prints what went wrong."""
    silent = [t for e in catalogue.entries().values() for t in e.silent]
    assert not silent, f"naive race tests that record nothing: {silent}"


def test_every_pitfall_id_in_the_prose_names_a_complete_race_entry() -> None:
    """An ID in a docs page, notebook, README or module points at a pitfall the tests show."""
    known = {p for p, e in catalogue.entries().items() if e.complete}
    dangling = {p: where for p, where in catalogue.references().items() if p not in known}
    assert not dangling, f"pitfall IDs with no pair of race tests: {dangling}"


def test_every_entry_has_one_title(tmp_path: Path) -> None:
    """Two tests naming one ID give it the same title, so the table has one row per pitfall."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_a.py").write_text(
        'import pytest\nP1 = ("P1", "one")\n\n'
        "@pytest.mark.race(*P1)\ndef test_naive_x():\n    pass\n\n"
        '@pytest.mark.race("P1", "one")\ndef test_y():\n'
        '    """Lesson\n    goes on.\n\n    Detail."""\n'
    )
    entry = catalogue.entries(tmp_path)["P1"]
    assert (entry.naive, entry.pattern, entry.lesson, entry.silent) == (
        ["tests/test_a.py::test_naive_x"],
        ["tests/test_a.py::test_y"],
        "Lesson goes on.",
        ["tests/test_a.py::test_naive_x"],  # it takes no record_property
    )


def test_the_id_pattern_skips_lint_codes_and_finds_suffixed_ids(tmp_path: Path) -> None:
    """`# noqa: E501` is not a pitfall; P5b and B3 are."""
    (tmp_path / "README.md").write_text("x = 1  # noqa: E501, B018\nsee P5b and (B3), not P5bb\n")
    for folder in ("docs", "notebooks", "patterns", "benchmarks", "tests"):
        (tmp_path / folder).mkdir()
    assert catalogue.references(tmp_path) == {"P5b": ["README.md"], "B3": ["README.md"]}


def _families(pitfalls: Iterable[str]) -> set[str]:
    return {re.match(r"[A-Z]+", p).group() for p in pitfalls}  # type: ignore[union-attr]


def test_the_catalogue_page_explains_every_family_letter_it_uses_and_no_other() -> None:
    """Each ID prefix in the tables (P, W, PG ...) is in the page's key; the key has no other."""
    page = (catalogue.ROOT / "docs" / "pitfalls.md").read_text(encoding="utf-8")
    # the key is every bold capital prefix written before the tables
    key = set(re.findall(r"\*\*([A-Z]{1,2})\*\*", page.split("{pitfall-catalogue}")[0]))
    used = _families(catalogue.entries())
    assert (used - key, key - used) == (set(), set()), (
        f"families in the tables but not in the key: {sorted(used - key)}; "
        f"in the key but used by no pitfall: {sorted(key - used)}"
    )
