"""The "Use it" programs that open each pattern page: each one runs, and each page shows its own.

A program is ``examples/<module>_use.py``; its opening comments say what the test checks:

    # prints: TEXT         TEXT appears in its output (stdout and stderr); one line or more
    # exit status: N       the status it ends with (0 when absent)
    # Ctrl-C after: TEXT   it runs until interrupted: SIGINT is sent once TEXT is printed
                           (and its main thread waits)

Programs added later are picked up by the glob.
"""

from __future__ import annotations

import http.client
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import MUST_HAPPEN, ChildLines, child_env
from tests.test_executor_shutdown_ctrl_c import interrupt

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = sorted((ROOT / "examples").glob("*_use.py"))
PAGES = sorted((ROOT / "docs" / "patterns").glob("*.md"))
SHORTEST, LONGEST = 10, 25  # lines that are not blank


def _promises(program: Path) -> dict[str, list[str]]:
    """The ``# key: value`` lines at the top of a program, by key."""
    found: dict[str, list[str]] = {}
    for line in program.read_text(encoding="utf-8").splitlines():
        match = re.match(r"# (prints|exit status|Ctrl-C after): (.+)", line)
        if match is None:
            if line.startswith("#"):
                continue
            break
        found.setdefault(match[1], []).append(match[2])
    return found


def _spawn(program: Path) -> tuple[subprocess.Popen[str], ChildLines]:
    child = subprocess.Popen(
        [sys.executable, str(program)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(),
        cwd=ROOT,
    )
    assert child.stdout is not None
    return child, ChildLines(child.stdout)


def _reap(child: subprocess.Popen[str]) -> None:
    child.kill()
    child.wait(timeout=MUST_HAPPEN)
    if child.stdout is not None:
        child.stdout.close()


def test_there_is_a_use_it_program_for_every_pattern_page() -> None:
    """Every page in docs/patterns has examples/<page>_use.py (the glob below runs them)."""
    assert PAGES, "no pattern pages found"
    missing = [p.stem for p in PAGES if not (ROOT / "examples" / f"{p.stem}_use.py").exists()]
    assert not missing, f"pages without a Use-it program: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_each_pattern_page_opens_with_its_use_it_program(page: Path) -> None:
    """Title, at most two lead sentences, then "Use it", which includes the page's program."""
    text = page.read_text(encoding="utf-8")
    title, _, rest = text.partition("\n")
    assert title.startswith("# "), title
    lead, _, section = rest.partition("\n## ")
    sentences = [line for line in lead.splitlines() if line.strip()]
    assert len(sentences) <= 2, f"{page.name}: {len(sentences)} lines above Use it"
    heading, _, body = section.partition("\n")
    assert heading == "Use it", f"{page.name}: the first section is {heading!r}"
    body = body.partition("\n## ")[0]
    include = f"```{{literalinclude}} ../../examples/{page.stem}_use.py"
    assert include in body, f"{page.name}: its Use-it section does not include {include}"


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_each_use_it_program_runs_and_keeps_its_promises(program: Path) -> None:
    """The program is 10 to 25 lines, ends with the status it names, and prints what it says."""
    lines = [line for line in program.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert SHORTEST <= len(lines) <= LONGEST, f"{program.name}: {len(lines)} lines"
    promises = _promises(program)
    assert promises.get("prints"), f"{program.name} promises nothing (# prints: ...)"
    status = int(promises.get("exit status", ["0"])[0])
    child, output = _spawn(program)
    try:
        for cue in promises.get("Ctrl-C after", []):
            output.expect(cue)
            interrupt(child)
        assert child.wait(timeout=MUST_HAPPEN * 2) == status, output.rest()
        text = output.rest()
    finally:
        _reap(child)
    for promised in promises["prints"]:
        assert promised in text, f"{program.name} did not print {promised!r}:\n{text}"


def test_the_server_program_exits_on_its_budget_when_a_handler_is_stuck() -> None:
    """A handler sleeping past stop_timeout=5 does not hold the exit: status 3 within 5 s + 2."""
    child, output = _spawn(ROOT / "examples" / "server_shutdown_use.py")
    try:
        port = int(output.expect("serving on port").split()[-1])
        client = http.client.HTTPConnection("127.0.0.1", port, timeout=MUST_HAPPEN)
        client.request("GET", "/30")  # answers its headers, then sleeps 30 s
        assert client.getresponse().status == 200  # the handler is in flight now
        interrupt(child)
        start = time.monotonic()
        status = child.wait(timeout=MUST_HAPPEN * 2)
        took = time.monotonic() - start
        client.close()
        text = output.rest()
    finally:
        _reap(child)
    assert status == 3, text
    assert took < 5 + 2, f"exited {took:.1f}s after Ctrl-C:\n{text}"
    assert "exiting with handlers still running" in text, text
