"""One pattern list for the README's table and the docs home page's (docs/_ext/pattern_index.py)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load() -> ModuleType:
    path = ROOT / "docs" / "_ext" / "pattern_index.py"
    spec = importlib.util.spec_from_file_location("pattern_index", path)
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


index = _load()


def test_the_readme_table_is_the_one_made_from_the_list() -> None:
    """Edit the list, then run `python docs/_ext/pattern_index.py`: the README follows it."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert index.readme_with_table(readme) == readme, (
        "README.md's pattern table differs from docs/_ext/pattern_index.py: "
        "run `python docs/_ext/pattern_index.py`"
    )


def test_a_readme_edited_by_hand_is_told_apart() -> None:
    """A row changed in the README alone is rewritten from the list; no markers is an error."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    edited = readme.replace("| Bulkhead |", "| Bulkheads |", 1)
    assert edited != readme
    assert index.readme_with_table(edited) == readme
    with pytest.raises(ValueError, match="markers"):
        index.readme_with_table(readme.replace(index.END, ""))


def test_every_pattern_is_listed_once_with_files_that_exist() -> None:
    """Each pattern module has one row, and every path a row names is in the repository."""
    stems = [p.stem for p in index.PATTERNS]
    modules = sorted(p.stem for p in (ROOT / "patterns").glob("*.py") if p.stem != "__init__")
    pages = sorted(p.stem for p in (ROOT / "docs" / "patterns").glob("*.md"))
    assert sorted(stems) == modules == pages
    for pattern in index.PATTERNS:
        for path in (pattern.module, *pattern.tests, pattern.page, pattern.notebook_path):
            assert (ROOT / path).is_file(), path
        for path in re.findall(r"`([\w/]+\.py)`", pattern.extra_module):
            assert (ROOT / path).is_file(), path


def test_the_list_is_in_the_sidebars_order() -> None:
    """The home page's table and the "Patterns" part of the sidebar list the pages alike."""
    home = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    toctree = re.search(r":caption: Patterns\n\n(.*?)```", home, re.DOTALL)
    assert toctree
    assert toctree.group(1).split() == [f"patterns/{p.stem}" for p in index.PATTERNS]
