"""The pitfall catalogue, read from the race markers of the test files (no import, no pytest).

One catalogue: every ``@pytest.mark.race("P10", "title")`` (or ``race(*P10)`` with
``P10 = ("P10", "title")`` at module level) in ``tests/`` is an entry, and an entry is complete
when it has a ``test_naive_*`` test and a pattern test. `references` finds every pitfall ID
written in the prose a reader sees (docs, notebooks, README, the modules), so a test can check
that each one names a complete entry. ``docs/conf.py`` renders the catalogue page from this.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# P1, P5b, B3, C1, E1, Q1, M10, W1, PG1...: a family prefix, digits, an optional lower-case suffix.
# Ruff's rule codes (E501, B018) look the same, so lint-suppression comments are stripped
# before the search.
ID = re.compile(r"(?<![\w.-])(?:PG\d|P\d{1,2}[a-z]?|[ABCEMQW]\d{1,2}[a-z]?)(?![\w-])")
NOQA = re.compile(r"noqa:?[ A-Z0-9,]*")


@dataclass
class Entry:
    """One pitfall: its ID, title, and the tests that demonstrate it."""

    pitfall: str
    title: str
    naive: list[str] = field(default_factory=list)  # "tests/test_x.py::test_naive_y"
    pattern: list[str] = field(default_factory=list)
    lesson: str = ""  # first docstring paragraph of the first pattern test, on one line
    # each pattern test's first docstring paragraph, by node id (a page whose tests show a
    # pitfall told on another page gives its own lesson)
    lessons: dict[str, str] = field(default_factory=dict)
    # naive tests without a ``record_property`` argument: their row in `make races` would
    # say "(nothing recorded)" instead of what they saw
    silent: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """True when the naive code is shown going wrong and the pattern holding."""
        return bool(self.naive) and bool(self.pattern)


def _race_args(
    decorator: ast.expr, constants: dict[str, tuple[str, str]]
) -> tuple[str, str] | None:
    """The (ID, title) of a ``pytest.mark.race(...)`` decorator, or None for any other."""
    if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)):
        return None
    if decorator.func.attr != "race" or ast.unparse(decorator.func) != "pytest.mark.race":
        return None
    args = decorator.args
    if len(args) == 1 and isinstance(args[0], ast.Starred) and isinstance(args[0].value, ast.Name):
        return constants[args[0].value.id]
    values = [a.value for a in args if isinstance(a, ast.Constant)]
    if len(values) == 2 and all(isinstance(v, str) for v in values):
        return values[0], values[1]
    raise ValueError(f"cannot read race marker {ast.unparse(decorator)}")


def _tests(tree: ast.Module) -> list[ast.FunctionDef]:
    """Test functions at module level and in test classes."""
    found: list[ast.FunctionDef] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            found.append(node)
        elif isinstance(node, ast.ClassDef):
            found.extend(n for n in node.body if isinstance(n, ast.FunctionDef))
    return [f for f in found if f.name.startswith("test_")]


def entries(root: Path = ROOT) -> dict[str, Entry]:
    """Every pitfall with a race test, by ID, from the test files under ``root/tests``."""
    catalogue: dict[str, Entry] = {}
    for path in sorted((root / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants: dict[str, tuple[str, str]] = {}
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Tuple)
                and len(node.value.elts) == 2
                and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str)
                    for e in node.value.elts
                )
            ):
                first, second = (e.value for e in node.value.elts)  # type: ignore[attr-defined]
                constants[node.targets[0].id] = (first, second)
        for function in _tests(tree):
            for decorator in function.decorator_list:
                args = _race_args(decorator, constants)
                if args is None:
                    continue
                pitfall, title = args
                entry = catalogue.setdefault(pitfall, Entry(pitfall, title))
                nodeid = f"{path.relative_to(root).as_posix()}::{function.name}"
                if function.name.startswith("test_naive_"):
                    entry.naive.append(nodeid)
                    arguments = function.args.args + function.args.kwonlyargs
                    if "record_property" not in {a.arg for a in arguments}:
                        entry.silent.append(nodeid)
                else:
                    entry.pattern.append(nodeid)
                    doc = ast.get_docstring(function) or ""
                    lesson = " ".join(doc.split("\n\n")[0].split())
                    if lesson:
                        entry.lessons[nodeid] = lesson
                    if lesson and not entry.lesson:
                        entry.lesson = lesson
    return catalogue


def prose_files(root: Path = ROOT) -> list[Path]:
    """The files a reader reads: README, docs pages, notebooks, the modules, the benchmarks."""
    files = [root / "README.md"]
    files += sorted(p for p in (root / "docs").rglob("*.md") if "_build" not in p.parts)
    files += sorted((root / "notebooks").glob("*.ipynb"))
    files += sorted((root / "patterns").rglob("*.py"))
    files += sorted((root / "benchmarks").glob("*.py"))
    return files


def _text(path: Path) -> str:
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        return "\n".join("".join(cell["source"]) for cell in cells)
    return path.read_text(encoding="utf-8")


def references(root: Path = ROOT) -> dict[str, list[str]]:
    """Every pitfall ID written in a prose file, with the files that write it."""
    found: dict[str, list[str]] = {}
    for path in prose_files(root):
        for line in _text(path).splitlines():
            for pitfall in ID.findall(NOQA.sub("", line)):
                where = found.setdefault(pitfall, [])
                name = path.relative_to(root).as_posix()
                if name not in where:
                    where.append(name)
    return found


def sort_key(pitfall: str) -> tuple[str, int, str]:
    """P2 before P10, P5 before P5b."""
    match = re.fullmatch(r"([A-Z]+)(\d+)([a-z]?)", pitfall)
    assert match, pitfall
    return match.group(1), int(match.group(2)), match.group(3)
