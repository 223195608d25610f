"""Project-wide test rules: no leaked threads or process state; the race table (`make races`)."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

# How long a finished test may take to let its own threads end before they count as leaked.
THREAD_GRACE = 5.0


# --- process-wide state: Ctrl-C as in a terminal, and put back after every test -------------

# SIGINT's handler when the run began, if the suite had to replace it (see pytest_configure).
_SIGINT_AT_START: list[Any] = []


def pytest_configure(config: pytest.Config) -> None:
    """Make Ctrl-C raise KeyboardInterrupt in the suite, as in a program run from a terminal.

    A shell starts a background job (``make test &`` in a script, a CI step run with ``&``)
    with SIGINT ignored. Python then installs no handler of its own: ``interrupt_main()``
    does nothing, a SIGINT sent to the main thread is lost, and every child process the
    tests start inherits the ignoring. Every test of a Ctrl-C would fail, for a reason
    that has nothing to do with the code. The run's own handler is put back at the end.
    """
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL):
        _SIGINT_AT_START.append(signal.signal(signal.SIGINT, signal.default_int_handler))


def pytest_report_header(config: pytest.Config) -> str | None:
    """Say so when the run began with SIGINT ignored (the suite installed Python's handler)."""
    if _SIGINT_AT_START:
        return "SIGINT was ignored at start (a background job?): Python's handler installed"
    return None


# Signals whose disposition is checked after every test. SIGKILL and SIGSTOP cannot change;
# SIGALRM is pytest-timeout's, set around each test and reset to SIG_DFL after it.
_SIGNALS = sorted(signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP, signal.SIGALRM})
_HOOKS: dict[str, tuple[Any, str]] = {
    "threading.excepthook": (threading, "excepthook"),
    "sys.excepthook": (sys, "excepthook"),
    "sys.unraisablehook": (sys, "unraisablehook"),
}


@dataclass
class _ProcessState:
    """What one test may change for every later test, and must put back."""

    handlers: dict[int, Any]  # signal.getsignal of each signal (None: set outside Python)
    mask: set[int]  # the main thread's blocked signals
    wakeup_fd: int  # signal.set_wakeup_fd's file descriptor, -1 for none
    hooks: dict[str, Any]

    @classmethod
    def now(cls) -> _ProcessState:
        """Read the state (from the main thread, where pytest runs every test)."""
        wakeup_fd = signal.set_wakeup_fd(-1)
        if wakeup_fd != -1:
            signal.set_wakeup_fd(wakeup_fd)
        return cls(
            handlers={s: signal.getsignal(s) for s in _SIGNALS},
            mask=set(signal.pthread_sigmask(signal.SIG_BLOCK, [])),
            wakeup_fd=wakeup_fd,
            hooks={name: getattr(*where) for name, where in _HOOKS.items()},
        )

    def changes(self, after: _ProcessState) -> list[str]:
        """What differs in ``after``, one line each."""
        lines = [
            f"{_name(s)} handler {_show(h)} -> {_show(after.handlers[s])}"
            for s, h in self.handlers.items()
            if after.handlers[s] is not h
        ]
        if after.mask != self.mask:
            lines.append(f"signal mask {_names(self.mask)} -> {_names(after.mask)}")
        if after.wakeup_fd != self.wakeup_fd:
            lines.append(f"signal wakeup fd {self.wakeup_fd} -> {after.wakeup_fd}")
        lines += [
            f"{name} {_show(hook)} -> {_show(after.hooks[name])}"
            for name, hook in self.hooks.items()
            if after.hooks[name] is not hook
        ]
        return lines

    def restore(self) -> None:
        """Put this state back (a pending signal first meets the handler the test left)."""
        for name, (owner, attribute) in _HOOKS.items():
            setattr(owner, attribute, self.hooks[name])
        for signum, handler in self.handlers.items():
            if handler is not None and signal.getsignal(signum) is not handler:
                signal.signal(signum, handler)
        signal.set_wakeup_fd(self.wakeup_fd)
        signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _names(signums: set[int]) -> str:
    return "{" + ", ".join(sorted(_name(s) for s in signums)) + "}"


def _show(thing: object) -> str:
    return getattr(thing, "__qualname__", None) or repr(thing)


def _run_pending_signal_handlers() -> None:
    """Run the Python handler of any signal that arrived and has not been handled yet.

    ``signal.signal`` runs pending handlers before it changes one; setting SIGINT's handler
    to itself changes nothing else. (A signal sent by ``interrupt_main()`` from another
    thread while the main thread sat in a C-level wait is handled only at the main
    thread's next check: it must not land in the next test.)
    """
    handler = signal.getsignal(signal.SIGINT)
    if handler is not None:
        signal.signal(signal.SIGINT, handler)


def _attempt(step: Callable[[], object], problems: list[str], what: str) -> None:
    try:
        step()
    except BaseException as exc:  # a pending KeyboardInterrupt included: it is the finding
        problems.append(f"{what}: {type(exc).__name__}: {exc}")


@pytest.fixture(autouse=True)
def process_state_put_back(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test that leaves process-wide state changed, and put the state back.

    Checked after every test (and after every other fixture of it has ended): each signal's
    handler, the main thread's signal mask and pending signals, the wakeup fd, a signal
    still waiting for its Python handler (a Ctrl-C that never landed), and
    ``threading.excepthook``, ``sys.excepthook`` and ``sys.unraisablehook``. Left behind,
    each of these breaks later tests that have nothing to do with it (an ignored SIGINT
    fails every Ctrl-C test after it), so the state is put back and the test that changed
    it fails, named. Threads are `no_leaked_threads`' business.
    """
    before = _ProcessState.now()
    yield
    problems: list[str] = []
    _attempt(_run_pending_signal_handlers, problems, "a signal was still pending, and raised")
    after = _ProcessState.now()
    problems += before.changes(after)
    blocked = signal.sigpending()
    if blocked:
        # Sent while blocked, and for this test: discarded (ignoring a pending signal drops
        # it), so that the restore, which unblocks it, cannot deliver it to the next one.
        problems.append(f"signals sent but blocked, still pending: {_names(set(blocked))}")
        for signum in blocked:
            _attempt(lambda s=signum: signal.signal(s, signal.SIG_IGN), problems, "discarding")
    _attempt(before.restore, problems, "putting the state back raised")
    if problems:
        pytest.fail(
            f"{request.node.nodeid} left process-wide state changed (now put back):\n  "
            + "\n  ".join(problems),
            pytrace=False,
        )


@pytest.fixture
def default_sigint() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt in the main thread, as in a plain program."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Fail any test that leaves a thread running.

    A thread that outlives its test is either a hang waiting to happen or a sign that a
    `stop()` did not do what it promised; either way the test that started it is the one
    that should fail. Threads get a bounded grace period to finish after the test body.
    """
    before = set(threading.enumerate())
    yield
    leaked = [t for t in threading.enumerate() if t not in before]
    for thread in leaked:
        thread.join(THREAD_GRACE / max(len(leaked), 1))
    still = [t.name for t in leaked if t.is_alive()]
    assert not still, f"test left threads running: {still}"


# --- a hang is a failure, never a stuck CI ------------------------------------------------

_SESSION = {"exitstatus": 0}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remember the exit status for `pytest_unconfigure`."""
    _SESSION["exitstatus"] = int(exitstatus)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Exit hard if a non-daemon thread survived the run.

    pytest-timeout fails a hung test, but the thread that hung is still there, and the
    interpreter joins every non-daemon thread at exit with no timeout: the run would end
    its report and then never exit. Dump every thread's stack and exit non-zero instead.
    A SIGINT handler the run replaced (see `pytest_configure`) is put back first.
    """
    if _SIGINT_AT_START:
        signal.signal(signal.SIGINT, _SIGINT_AT_START.pop())
    stuck = [
        t
        for t in threading.enumerate()
        if t is not threading.main_thread() and not t.daemon and t.is_alive()
    ]
    if not stuck:
        return
    sys.stdout.flush()
    sys.stderr.write(f"\nnon-daemon threads still running after the tests: {stuck}\n")
    faulthandler.dump_traceback(all_threads=True)
    sys.stderr.flush()
    os._exit(_SESSION["exitstatus"] or 1)


# --- the race table (`make races`) ---------------------------------------------------------
#
# A naive test says what it saw with pytest's ``record_property("observed", "...")``; the
# table prints that next to the lesson of the pattern test (the first line of its docstring).

TABLE_WIDTH = 100


@dataclass
class _RaceRow:
    title: str
    module: str = ""  # the pattern module (test file name without test_), or "jobqueue"
    naive: list[str] = field(default_factory=list)  # outcomes of test_naive_* tests
    pattern: list[str] = field(default_factory=list)  # outcomes of the pattern tests
    observed: list[str] = field(default_factory=list)  # what the naive tests recorded
    lesson: str = ""  # the first line of the pattern test's docstring


_RACES: dict[str, _RaceRow] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--race-table``, which prints the pitfall table at the end of the run."""
    parser.addoption(
        "--race-table",
        action="store_true",
        help="after the run, print each pitfall: what the naive code did, what the pattern held",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Check every race marker names its pitfall and title, so the table can be built."""
    for item in items:
        marker = item.get_closest_marker("race")
        if marker is None:
            continue
        if len(marker.args) != 2:
            raise pytest.UsageError(
                f"{item.nodeid}: use @pytest.mark.race('P1', 'one-line pitfall title')"
            )


def pytest_report_teststatus(
    report: pytest.TestReport, config: pytest.Config
) -> tuple[str, str, str] | None:
    """With ``--race-table``, a passing test prints nothing: the table is the output."""
    if config.getoption("--race-table") and report.when == "call" and report.passed:
        return "passed", "", ""
    return None


def _module_of(item: pytest.Item) -> str:
    parts = item.nodeid.split("::")[0].split("/")
    if "jobqueue" in parts:
        return "jobqueue"
    return parts[-1].removeprefix("test_").removesuffix(".py")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Iterator[pytest.TestReport]:
    """Record each race test's outcome under its pitfall, and what a naive test observed."""
    report: pytest.TestReport = yield
    marker = item.get_closest_marker("race")
    if marker is not None and (report.when == "call" or report.outcome != "passed"):
        pitfall, title = marker.args
        row = _RACES.setdefault(pitfall, _RaceRow(title, _module_of(item)))
        if item.name.startswith("test_naive_"):
            row.naive.append(report.outcome)
            for key, value in item.user_properties:
                if key == "observed" and str(value) not in row.observed:
                    row.observed.append(str(value))
        else:
            row.pattern.append(report.outcome)
            doc = getattr(getattr(item, "function", None), "__doc__", None) or ""
            if doc.strip() and not row.lesson:
                row.lesson = doc.strip().splitlines()[0]
    return report


def _verdict(outcomes: list[str], yes: str) -> str:
    if not outcomes:
        return "(no test)"
    if all(o == "passed" for o in outcomes):
        return f"{yes} ({len(outcomes)} test{'s' if len(outcomes) > 1 else ''})"
    return f"NO: {outcomes.count('failed')} failed, {outcomes.count('skipped')} skipped"


def _pitfall_order(key: str) -> tuple[str, int, str]:
    letters = key.rstrip("0123456789abcdefghijklmnopqrstuvwxyz")
    digits = "".join(c for c in key[len(letters) :] if c.isdigit())
    return (letters, int(digits or 0), key)


def race_table(races: dict[str, _RaceRow], width: int = TABLE_WIDTH) -> list[str]:
    """The race table's lines: by module, then pitfall; every line at most ``width`` wide."""
    lines = []
    for module in sorted({row.module for row in races.values()}):
        lines.append(module)
        keys = sorted((k for k, r in races.items() if r.module == module), key=_pitfall_order)
        for key in keys:
            row = races[key]
            lines += textwrap.wrap(
                row.title, width, initial_indent=f"  {key:<5}", subsequent_indent=" " * 7
            )
            naive = _verdict(row.naive, "went wrong")
            seen = "; ".join(row.observed) or "(nothing recorded)"
            for label, text in (
                (f"naive:   {naive}:", seen),
                (f"pattern: {_verdict(row.pattern, 'held')}:", row.lesson or "(no lesson)"),
            ):
                lines += textwrap.wrap(
                    f"{label} {text}", width, initial_indent=" " * 7, subsequent_indent=" " * 16
                )
    return lines


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    """Print the race table when ``--race-table`` was given."""
    if not config.getoption("--race-table") or not _RACES:
        return
    terminalreporter.section("race demonstrations: what the naive code did, what the pattern held")
    for line in race_table(_RACES):
        terminalreporter.write_line(line)
