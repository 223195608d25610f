"""The suite's own rules (tests/conftest.py), proved on a small suite run in a child pytest."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.support import MUST_HAPPEN, child_env

# Each test that changes process-wide state is followed by one that needs it put back.
LEAKY = """
import _thread
import signal
import sys
import threading

HOOKS = (threading.excepthook, sys.unraisablehook)  # pytest's, installed before collection


def test_ignores_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_ctrl_c_raises_again():
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    try:
        _thread.interrupt_main()
        for _ in range(3):
            pass
    except KeyboardInterrupt:
        return
    raise AssertionError("interrupt_main() did nothing")


def test_replaces_the_hooks():
    threading.excepthook = lambda args: None
    sys.unraisablehook = lambda args: None


def test_the_hooks_are_back():
    assert (threading.excepthook, sys.unraisablehook) == HOOKS


def test_blocks_sigusr1_and_sends_it():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)


def test_nothing_is_blocked_or_pending():
    # Delivered here, SIGUSR1 would have ended this process (its default action).
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == set()
    assert signal.sigpending() == set()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
"""

# pytest in a child whose SIGINT is ignored, as a background job of a shell script starts it.
RUN_IGNORING_SIGINT = """
import signal, sys, pytest
signal.signal(signal.SIGINT, signal.SIG_IGN)
sys.exit(pytest.main(["-p", "no:cacheprovider", "-rE", sys.argv[1]]))
"""


def test_a_test_that_leaves_process_state_changed_fails_by_name_and_the_next_starts_clean(
    tmp_path: Path,
) -> None:
    """Each leak fails the test that made it, named; it is put back before the next test."""
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_leaky.py").write_text(LEAKY, encoding="utf-8")

    result = subprocess.run(
        [sys.executable, "-c", RUN_IGNORING_SIGINT, str(tmp_path)],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=3 * MUST_HAPPEN,
        check=False,
    )

    out = result.stdout
    assert result.returncode == 1, out + result.stderr  # tests failed, nothing crashed
    assert "SIGINT was ignored at start (a background job?)" in out
    assert "6 passed, 3 errors" in out, out  # the leaky ones pass, then fail at teardown
    for test, change in [
        ("test_ignores_sigint", "SIGINT handler default_int_handler -> <Handlers.SIG_IGN: 1>"),
        ("test_replaces_the_hooks", "sys.unraisablehook"),
        ("test_blocks_sigusr1_and_sends_it", "signals sent but blocked, still pending: {SIGUSR1}"),
    ]:
        assert f"test_leaky.py::{test} left process-wide state changed (now put back)" in out
        assert change in out, (change, out)
