"""The layering a reader relies on when copying one file: checked on every module's imports."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PATTERNS = sorted(p for p in (ROOT / "patterns").glob("*.py") if p.name != "__init__.py")
NAIVE = sorted(p for p in (ROOT / "patterns" / "naive").glob("*.py") if p.name != "__init__.py")


def imported_modules(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports, at any depth (function-level included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            names.add(node.module or "")
    return names


@pytest.mark.parametrize("path", PATTERNS, ids=lambda p: p.stem)
def test_a_pattern_module_imports_only_the_standard_library(path: Path) -> None:
    """Copied alone into another project, the file needs nothing but Python itself."""
    foreign = {
        name
        for name in imported_modules(path)
        if name.split(".")[0] not in sys.stdlib_module_names and name != "__future__"
    }
    assert not foreign, f"{path.name} imports {sorted(foreign)}"


@pytest.mark.parametrize("path", NAIVE, ids=lambda p: p.stem)
def test_a_naive_module_imports_at_most_its_own_pattern(path: Path) -> None:
    """``patterns/naive/x.py`` may lean on ``patterns.x`` (shared types), never on another."""
    ours = {name for name in imported_modules(path) if name.split(".")[0] == "patterns"}
    assert ours <= {f"patterns.{path.stem}"}, f"{path.name} imports {sorted(ours)}"


def test_every_pattern_module_has_a_test_file_a_docs_page_and_a_notebook() -> None:
    """Module, test file, docs page and notebook share one name, so a reader finds all four."""
    notebooks = {p.stem.split("-", 1)[1].replace("-", "_") for p in (ROOT / "notebooks").glob("*")}
    missing = [
        f"{path.stem}: {what}"
        for path in PATTERNS
        for what, exists in [
            ("tests", (ROOT / "tests" / f"test_{path.stem}.py").exists()),
            ("docs page", (ROOT / "docs" / "patterns" / f"{path.stem}.md").exists()),
            ("notebook", path.stem in notebooks),
        ]
        if not exists
    ]
    assert not missing, missing


def test_the_broken_versions_live_only_in_patterns_naive() -> None:
    """A copied pattern file holds only the pattern: no ``naive_*`` definition travels with it."""
    found = [
        f"{path.name}: {node.name}"
        for path in PATTERNS
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name.startswith("naive_")
    ]
    assert not found, found


HEADER = (
    "# SPDX-License-Identifier: MIT\n"
    "# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.\n"
    "# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.\n"
)


@pytest.mark.parametrize("path", PATTERNS, ids=lambda p: p.stem)
def test_a_pattern_module_starts_with_its_licence_and_copying_header(path: Path) -> None:
    """The three lines a copied file carries: the licence, where it came from, what it needs."""
    assert path.read_text(encoding="utf-8").startswith(HEADER), f"{path.name}: no header"
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License\n")


def test_every_pattern_module_has_an_api_reference_page() -> None:
    """The API reference is one page per module, under the module's own name."""
    missing = [p.stem for p in PATTERNS if not (ROOT / "docs" / "api" / f"{p.stem}.md").exists()]
    assert not missing, missing


def test_no_notebook_reaches_outside_the_package_through_sys_path() -> None:
    """A notebook imports what the project installs; a program of the repo runs as a program."""
    offenders = [
        path.name
        for path in sorted((ROOT / "notebooks").glob("*.ipynb"))
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]
        if cell["cell_type"] == "code" and "sys.path" in "".join(cell["source"])
    ]
    assert not offenders, offenders
