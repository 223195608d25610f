"""The worker's wiring as checks: parts in one direction, small constructors, no private reach.

Read from the source (``ast``), nothing imported or run: the parts' import graph has no
cycle and no part imports the worker's module; every part's constructor takes at most
seven parameters; `Worker` stays a short orchestrator; every file in the worker's folder
stays readable; and no module of the job queue uses a private name (``_x``) of a pattern
module, by import or by attribute.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
PATTERNS = ROOT / "patterns"
JOBQUEUE = PATTERNS / "jobqueue"
WORKER_DIR = JOBQUEUE / "worker"
PACKAGE = "patterns.jobqueue.worker"

MAX_PARAMETERS = 7  # a part's constructor, ``self`` not counted
MAX_WORKER_LINES = 300  # the Worker class, docstring included
MAX_WORKER_INIT_LINES = 60
MAX_FILE_LINES = 650


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _worker_modules() -> dict[str, Path]:
    """Each module of the worker's folder by its short name (``claimer``, ``worker``...)."""
    return {p.stem: p for p in sorted(WORKER_DIR.glob("*.py")) if p.stem != "__init__"}


def _imports(path: Path) -> set[str]:
    """The worker modules ``path`` imports (``from patterns.jobqueue.worker.x import``...)."""
    found: set[str] = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module == PACKAGE:  # from patterns.jobqueue.worker import options
                found.update(alias.name for alias in node.names)
            elif node.module.startswith(PACKAGE + "."):
                found.add(node.module.removeprefix(PACKAGE + ".").split(".")[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE + "."):
                    found.add(alias.name.removeprefix(PACKAGE + ".").split(".")[0])
    return found


def _graph() -> dict[str, set[str]]:
    modules = _worker_modules()
    return {name: _imports(path) & set(modules) - {name} for name, path in modules.items()}


def test_no_part_imports_the_worker_module() -> None:
    """The worker wires the parts; a part that imported it would see the whole worker."""
    importers = sorted(name for name, deps in _graph().items() if "worker" in deps)
    assert importers == [], f"parts importing worker.py: {importers}"


def test_the_worker_modules_import_each_other_without_a_cycle() -> None:
    """A depth-first walk of the import graph of worker/*.py finds no back edge."""
    graph = _graph()
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = [*path[path.index(name) :], name]
            raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
        if name in done:
            return
        for dep in sorted(graph[name]):
            visit(dep, [*path, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def _classes() -> Iterator[tuple[str, ast.ClassDef]]:
    for name, path in _worker_modules().items():
        for node in _tree(path).body:
            if isinstance(node, ast.ClassDef):
                yield name, node


def _init(cls: ast.ClassDef) -> ast.FunctionDef | None:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            return node
    return None


def test_every_part_takes_at_most_seven_constructor_parameters() -> None:
    """Every part of worker/: what its constructor is handed is at most seven things.

    The parts are the classes with an ``__init__`` of their own, but for `Worker`, whose
    parameters are the user's documented options. The dataclasses are records (the report,
    a held claim, the shared object itself), built once and read by name.
    """
    sizes = {}
    for module, cls in _classes():
        init = _init(cls)
        if init is None or cls.name == "Worker":  # the user's options, each documented
            continue
        args = init.args
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        sizes[f"{module}.{cls.name}"] = len(every) - 1 + bool(args.vararg) + bool(args.kwarg)
    assert sizes, "no constructor found: the test reads the wrong folder"
    over = {name: n for name, n in sizes.items() if n > MAX_PARAMETERS}
    assert over == {}, f"constructors over {MAX_PARAMETERS} parameters: {over}"


def test_the_worker_is_a_short_orchestrator() -> None:
    """`Worker` at most 300 lines, its ``__init__`` at most 60: the parts do the work."""
    [worker] = [cls for module, cls in _classes() if cls.name == "Worker"]
    assert worker.end_lineno is not None
    lines = worker.end_lineno - worker.lineno + 1
    assert lines <= MAX_WORKER_LINES, f"Worker is {lines} lines"
    init = _init(worker)
    assert init is not None
    assert init.end_lineno is not None
    init_lines = init.end_lineno - init.lineno + 1
    assert init_lines <= MAX_WORKER_INIT_LINES, f"Worker.__init__ is {init_lines} lines"


def test_the_worker_builds_no_lambda_that_looks_up_a_part_built_later() -> None:
    """No ``lambda ...: self._part...`` in the constructor: each part is built after its needs."""
    [worker] = [cls for module, cls in _classes() if cls.name == "Worker"]
    init = _init(worker)
    assert init is not None
    late = [
        ast.unparse(node)
        for node in ast.walk(init)
        if isinstance(node, ast.Lambda)
        and any(isinstance(n, ast.Name) and n.id == "self" for n in ast.walk(node.body))
    ]
    assert late == []


@pytest.mark.parametrize(
    "path", sorted(JOBQUEUE.rglob("*.py")), ids=lambda p: str(p.relative_to(JOBQUEUE))
)
def test_every_file_of_the_job_queue_is_at_most_650_lines(path: Path) -> None:
    """A file one can read in a sitting, in every room (worker, stores, cli)."""
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_FILE_LINES, f"{path.relative_to(JOBQUEUE)}: {lines} lines"


def _pattern_privates() -> tuple[set[str], set[str]]:
    """The private names of the pattern modules: (module-level, on their classes)."""
    module_level: set[str] = set()
    on_classes: set[str] = set()
    for path in sorted(PATTERNS.glob("*.py")):
        tree = _tree(path)
        for node in tree.body:
            targets: list[ast.expr] = []
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                module_level.add(node.name)
            elif isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign):
                targets = [node.target]
            module_level.update(t.id for t in targets if isinstance(t, ast.Name))
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    on_classes.add(node.name)
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                    on_classes.add(node.attr)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    on_classes.add(node.id)

    def private(names: set[str]) -> set[str]:
        return {n for n in names if n.startswith("_") and not n.startswith("__")}

    return private(module_level), private(on_classes)


def _own_privates(trees: list[ast.Module]) -> set[str]:
    """The private names the job queue defines itself (its own ``self._x``, ``def _x``)."""
    own: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                own.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                own.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif isinstance(node, ast.alias) and node.asname is not None:
                own.add(node.asname)
    return own


def test_the_job_queue_uses_no_private_name_of_a_pattern_module() -> None:
    """Only the patterns' public API: no ``from patterns.x import _y``, no ``obj._y`` of theirs.

    An attribute counts when its name is private to a pattern module (defined there at
    module level or on one of its classes) and the job queue does not define it itself.
    """
    pattern_modules = {p.stem for p in PATTERNS.glob("*.py") if p.stem != "__init__"}
    module_level, on_classes = _pattern_privates()
    paths = sorted(JOBQUEUE.rglob("*.py"))
    trees = [_tree(path) for path in paths]
    own = _own_privates(trees)
    found = []
    for path, tree in zip(paths, trees, strict=True):
        where = path.relative_to(ROOT)
        # Names bound by ``import os`` and the like: ``os._exit`` is the library's own.
        libraries = {
            (alias.asname or alias.name).split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
            if not alias.name.startswith("patterns")
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module is not None:
                parts = node.module.split(".")
                if parts[0] == "patterns" and len(parts) == 2 and parts[1] in pattern_modules:
                    found += [
                        f"{where}:{node.lineno}: from {node.module} import {alias.name}"
                        for alias in node.names
                        if alias.name.startswith("_")
                    ]
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_"):
                name = node.attr
                if name.startswith("__") or name in own:
                    continue
                if isinstance(node.value, ast.Name) and node.value.id in libraries:
                    continue
                if name in module_level or name in on_classes:
                    found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    assert found == []
