"""Helpers written again in several pattern modules stay alike in every copy.

A pattern module is copied alone, so it cannot import a helper from another one: a few
small helpers stand in several modules. Each is listed here with the modules that hold it,
and a fix made in one copy fails this test until it is made in the others. Copies are
compared as code, their docstrings and comments aside, so that each copy can explain
itself in its own module's words.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import math
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

PATTERNS = Path(__file__).resolve().parent.parent / "patterns"

# (helper, the modules that hold the same code); the modules' comments point here.
COPIES = [
    ("_OwnedLock", ["bulkhead", "executor_shutdown"]),
    ("ServerStopReport", ["server_shutdown", "server_shutdown_asyncio"]),
    ("TaskShutdownReport", ["asyncio_shutdown", "asyncio_signals"]),
    ("shutdown_tasks", ["asyncio_shutdown", "asyncio_signals"]),
    ("_sort", ["asyncio_shutdown", "asyncio_signals"]),
    ("_timeout", ["asyncio_shutdown", "asyncio_signals"]),
    (
        "_check_report",
        ["asyncio_shutdown", "asyncio_signals", "server_shutdown", "server_shutdown_asyncio"],
    ),
    ("_join", ["process_shutdown", "stoppable_process"]),
    ("_proc_name", ["process_shutdown", "stoppable_process"]),
    ("force_exit", ["exit_hooks", "signal_handlers"]),
    ("_log_and_flush", ["exit_hooks", "signal_handlers"]),
]

# Seconds and deadlines: one family, the same code in every module that holds any of it
# (each module holds the ones it uses). A fix is made here and in every copy.
SECONDS_FAMILY = """
def _seconds(value: object, name: str, *, allow_none: bool = False) -> float:
    if value is None and allow_none:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return math.inf if value > sys.float_info.max else float(value)

def _deadline(seconds: float) -> float:
    return time.monotonic() + seconds

def _left(deadline: float) -> float:
    return min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)

def _wait(event: threading.Event, deadline: float) -> bool:
    while not event.wait(_left(deadline)):
        if time.monotonic() >= deadline:
            return False
    return True
"""
FAMILY = {
    node.name: ast.unparse(node)
    for node in ast.parse(SECONDS_FAMILY).body
    if isinstance(node, ast.FunctionDef)
}
# Names an earlier copy of the family went by: a module holds the family's own instead.
RETIRED = {"_wait_until", "_wait_event", "_seconds_left", "_remaining", "_time_left"}


# The Ctrl-C-aware ``__exit__`` (say what the stop waits for, a second Ctrl-C stops now, one
# traceback), the same in each of these classes; ConsumerPool calls its name ``_name``.
EXITS = [
    ("daemon_threads", "_ThreadService"),
    ("bulkhead", "Bulkhead"),
    ("closable_queue", "ConsumerPool"),
    ("supervisor", "Supervisor"),
]


def code_of(module: str, name: str) -> str:
    """The code of ``patterns.<module>.<name>`` (``Class.method`` too) without docstrings."""
    found: Any = importlib.import_module(f"patterns.{module}")
    for part in name.split("."):
        found = getattr(found, part)
    tree = ast.parse(textwrap.dedent(inspect.getsource(found)))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


@pytest.mark.parametrize(
    ("name", "modules"), COPIES, ids=[f"{name}-{modules[0]}" for name, modules in COPIES]
)
def test_each_copy_of_a_repeated_helper_has_the_same_code(name: str, modules: list[str]) -> None:
    """Every module listed for a helper holds the same code for it."""
    first, *others = modules
    expected = code_of(first, name)
    for module in others:
        assert code_of(module, name) == expected, f"{module}.{name} differs from {first}.{name}"


def pattern_modules() -> list[str]:
    """The stem of every pattern module."""
    return sorted(p.stem for p in PATTERNS.glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("module", pattern_modules())
def test_the_seconds_family_is_the_same_code_in_every_module_that_holds_it(module: str) -> None:
    """``_seconds``, ``_deadline``, ``_left``, ``_wait``: one family, copied unchanged."""
    tree = ast.parse((PATTERNS / f"{module}.py").read_text(encoding="utf-8"))
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert names & RETIRED == set(), f"{module}.py: use the family's names instead"
    for name in sorted(names & FAMILY.keys()):
        assert code_of(module, name) == FAMILY[name], f"{module}.{name} is not the family's"


@pytest.mark.parametrize("module", pattern_modules())
def test_the_deadline_clamp_is_written_once_in_left(module: str) -> None:
    """``min(max(0.0, deadline - now), cap)`` lives in ``_left``; every wait calls it."""
    text = (PATTERNS / f"{module}.py").read_text(encoding="utf-8")
    inside_left = 1 if "def _left(" in text else 0
    assert text.count("min(max(0.0") == inside_left, f"{module}.py clamps outside _left"


def test_each_ctrl_c_aware_exit_has_the_same_code() -> None:
    """A fix to one context manager's Ctrl-C handling is made in every copy."""
    codes = {
        module: code_of(module, f"{cls}.__exit__").replace("self._name", "self.name")
        for module, cls in EXITS
    }
    first = codes[EXITS[0][0]]
    assert {module for module, code in codes.items() if code != first} == set()


def test_every_module_with_the_same_code_is_listed_with_its_copies() -> None:
    """A module that gains a copy of one of these helpers is listed, so its copy is checked."""
    groups = {(name, code_of(modules[0], name)): modules for name, modules in COPIES}
    unlisted = [
        f"{path.stem}.{node.name}"
        for path in sorted(PATTERNS.glob("*.py"))
        for node in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(node, ast.FunctionDef | ast.ClassDef)
        and node.name in {name for name, _ in COPIES}
        and path.stem not in groups.get((node.name, code_of(path.stem, node.name)), [path.stem])
    ]
    assert unlisted == []


# --- one end signal, two shapes: daemon_threads._Ended and supervisor._Tracked ----------------
#
# The same mechanism, shaped for each module (the supervisor's also owns its thread), so the
# code differs; the same checks run against both.


def ended_parts(kind: str, target: Callable[[], object]) -> tuple[Callable[[], None], Any, Any]:
    """(the thread's run, cancel_unstarted, the end event) of a fresh copy around ``target``."""
    if kind == "daemon_threads._Ended":
        from patterns.daemon_threads import _Ended  # noqa: PLC0415

        ended = _Ended(target)
        return ended.run, ended.cancel_unstarted, ended.event
    from patterns.supervisor import _Tracked  # noqa: PLC0415

    tracked = _Tracked(target, "tracked")
    return tracked._run, tracked.cancel_unstarted, tracked.ended


KINDS = ["daemon_threads._Ended", "supervisor._Tracked"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_end_signal_is_set_once_the_target_returned_or_raised(kind: str) -> None:
    """The event is set in the run's ``finally``: after the target, whatever it did."""
    seen: list[bool] = []
    run, _, ended = ended_parts(kind, lambda: seen.append(ended.is_set()))
    run()
    assert (seen, ended.is_set()) == ([False], True)

    def fails() -> None:
        raise ValueError("boom")

    run, _, ended = ended_parts(kind, fails)
    with pytest.raises(ValueError, match="boom"):
        run()
    assert ended.is_set()


@pytest.mark.parametrize("kind", KINDS)
def test_a_cancelled_unstarted_thread_never_runs_its_target(kind: str) -> None:
    """cancel_unstarted() first: the end is signalled at once and a late run does nothing."""
    ran: list[str] = []
    run, cancel_unstarted, ended = ended_parts(kind, lambda: ran.append("ran"))
    cancel_unstarted()
    assert ended.is_set()
    thread = threading.Thread(target=run, name="late")
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    assert ran == []


@pytest.mark.parametrize("kind", KINDS)
def test_cancelling_a_thread_that_began_changes_nothing(kind: str) -> None:
    """The run took the claim first: cancel_unstarted() neither stops nor ends it."""
    inside, release = threading.Event(), threading.Event()
    run, cancel_unstarted, ended = ended_parts(kind, lambda: (inside.set(), release.wait(10)))
    thread = threading.Thread(target=run, name="began")
    thread.start()
    try:
        assert inside.wait(10)
        cancel_unstarted()
        assert not ended.is_set()
    finally:
        release.set()
        thread.join(10)
    assert not thread.is_alive()
    assert ended.is_set()


# --- the thread pool and the task pool: one set of options, checked alike -------------------
#
# closable_queue.ConsumerPool and async_queue.AsyncConsumerPool share their options and the
# checks at the top of their constructors; the rest differs (threads, tasks).


@pytest.mark.parametrize(
    "options",
    [
        {"consumers": 0},
        {"consumers": -1},
        {"maxsize": -1},
        {"stop_timeout": -1},
        {"stop_timeout": math.nan},
        {"stop_timeout": True},
        {"stop_timeout": "1"},
    ],
    ids=repr,
)
def test_both_consumer_pools_refuse_the_same_options_with_the_same_words(
    options: dict[str, Any],
) -> None:
    """A bad option is the same ValueError, word for word, from the thread and the task pool."""
    from patterns.async_queue import AsyncConsumerPool  # noqa: PLC0415
    from patterns.closable_queue import ConsumerPool  # noqa: PLC0415

    messages = []
    for pool in (ConsumerPool, AsyncConsumerPool):
        with pytest.raises(ValueError, match=next(iter(options))) as info:
            pool(lambda item: None, **options)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
