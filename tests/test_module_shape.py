"""Every pattern module reads idea first (docs/design.md, "A pattern module reads idea first").

A reader who opens a pattern file sees its public API and the mechanism it teaches on the
first screens; the lifecycle-contract machinery (seconds checks, provisional reports, the
stopper hand-off, Ctrl-C-safe waits, report self-checks) sits in one marked section at the
end. These checks keep it so:

- no pattern module is over 600 lines;
- its first public class or function starts within its first 250 lines;
- the contract section starts at the one line ``# --- the lifecycle contract`` and holds at
  most a quarter of the module's code lines (lines that are not blank, comments or
  docstrings), and nothing public is defined after it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PATTERNS = Path(__file__).resolve().parent.parent / "patterns"
MODULES = sorted(p.stem for p in PATTERNS.glob("*.py") if p.stem != "__init__")
MARKER = "# --- the lifecycle contract"
MAX_LINES = 600
# The module still over 600 lines, held at its present size (a ratchet: it may only
# shrink) with the reason it could not be cut without dropping tested behaviour.
OVER = {
    # 416 code lines. The module docstring and imports (73 lines), the copies pinned by
    # tests/test_copies.py (force_exit, _log_and_flush, the seconds family: 74) and
    # run_until_signalled (47, on the page) leave 406 lines for the rest, which is 437:
    # SignalHandlers alone 265 (198 code: the all-or-nothing install and put-back, the
    # dispatcher and on_stop threads, the SystemExit hand-off), its contract section 96, its
    # fork hooks 38, the report, _wake_only and install_signal_handlers 38. What would go next
    # is tested behaviour: the stop hand-off, the Ctrl-C-safe redo, the pipe a late dispatcher
    # closes, the signals blocked across a fork.
    "signal_handlers": 631,
}
FIRST_PUBLIC_BY = 250
CONTRACT_SHARE = 0.25


def docstring_lines(tree: ast.Module) -> set[int]:
    """The line numbers taken by docstrings (the module's, each class's and function's)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            first = body[0] if body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def code_lines(text: str) -> list[int]:
    """The numbers of the lines that hold code: not blank, not a comment, not a docstring."""
    skip = docstring_lines(ast.parse(text))
    return [
        number
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.strip().startswith("#") and number not in skip
    ]


@pytest.mark.parametrize("module", MODULES)
def test_a_pattern_module_is_at_most_600_lines(module: str) -> None:
    """A module that needs more teaches two things: make it two modules."""
    lines = (PATTERNS / f"{module}.py").read_text(encoding="utf-8").splitlines()
    limit = OVER.get(module, MAX_LINES)
    assert len(lines) <= limit, f"{module}.py is {len(lines)} lines (at most {limit})"


@pytest.mark.parametrize("module", MODULES)
def test_the_first_public_name_comes_within_the_first_250_lines(module: str) -> None:
    """After the docstring comes what a reader calls, not the helpers it needs."""
    tree = ast.parse((PATTERNS / f"{module}.py").read_text(encoding="utf-8"))
    public = [
        min([node.lineno, *(d.lineno for d in node.decorator_list)])
        for node in tree.body
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and not node.name.startswith("_")
    ]
    assert public, f"{module}.py defines no public class or function"
    first = public[0]
    assert first <= FIRST_PUBLIC_BY, f"{module}.py: the first public name starts at line {first}"


@pytest.mark.parametrize("module", MODULES)
def test_the_contract_machinery_is_one_marked_section_at_the_end(module: str) -> None:
    """One marker line, at most a quarter of the code after it, nothing public there."""
    text = (PATTERNS / f"{module}.py").read_text(encoding="utf-8")
    lines = text.splitlines()
    markers = [n for n, line in enumerate(lines, start=1) if line.startswith(MARKER)]
    assert len(markers) == 1, f"{module}.py has {len(markers)} lines starting {MARKER!r}"
    start = markers[0]
    code = code_lines(text)
    share = sum(1 for n in code if n > start) / len(code)
    assert share <= CONTRACT_SHARE, f"{module}.py: the contract section is {share:.0%} of its code"
    late_public = [
        node.name
        for node in ast.parse(text).body
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and not node.name.startswith("_")
        and node.lineno > start
    ]
    assert late_public == [], f"{module}.py defines public names in its contract section"


@pytest.mark.parametrize("module", sorted(OVER))
def test_an_exception_to_the_600_lines_is_dropped_once_the_module_fits(module: str) -> None:
    """An entry in ``OVER`` for a module that now fits is removed, so the limit applies again."""
    lines = (PATTERNS / f"{module}.py").read_text(encoding="utf-8").splitlines()
    assert len(lines) > MAX_LINES, f"{module}.py fits in {MAX_LINES} lines: drop it from OVER"
