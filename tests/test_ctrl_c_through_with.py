"""Ctrl-C through the ``with`` block of each stoppable thing: one WARNING, one traceback.

The first Ctrl-C in the block is logged with the budget the stop may take; a second one
stops now, logs what is still running in one line, and ends in a single KeyboardInterrupt,
not two chained tracebacks. Real SIGINTs to a child; each sent only once the child said it
reached the point under test. (`TrackingExecutor` has its own: test_executor_shutdown_ctrl_c.)
"""

from __future__ import annotations

import signal
import textwrap

import pytest

from tests.support import MUST_HAPPEN, ChildLines, spawn_python
from tests.test_executor_shutdown_ctrl_c import interrupt

# What each child builds, and the work it holds until the test writes a line to its stdin.
CASES = {
    "Bulkhead": (
        "from patterns.bulkhead import Bulkhead",
        "Bulkhead(max_concurrent=1, queue_size=1, name='thing', stop_timeout=60)",
        "thing.submit(hold)",
    ),
    "BackgroundService": (
        "from patterns.daemon_threads import BackgroundService",
        "BackgroundService(hold, name='thing', stop_timeout=60)",
        "pass",
    ),
    "Supervisor": (
        "from patterns.supervisor import Supervisor",
        "Supervisor(hold, name='thing', stop_timeout=60)",
        "pass",
    ),
    "ConsumerPool": (
        "from patterns.closable_queue import ConsumerPool",
        "ConsumerPool(hold, consumers=1, name='thing', stop_timeout=60)",
        "thing.put(1)",
    ),
}

CHILD = """
import logging, sys, threading
{imp}

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
release = threading.Event()
holding = threading.Event()


def hold(*args):
    holding.set()
    release.wait()


def until_released():
    sys.stdin.readline()
    release.set()


threading.Thread(target=until_released, daemon=True).start()
thing = {build}
with thing:
    {work}
    holding.wait()
    print("inside the with block", flush=True)
    threading.Event().wait()  # until Ctrl-C
"""


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_second_ctrl_c_through_the_with_block_stops_now_with_one_traceback(name: str) -> None:
    """One WARNING with the budget, then one line naming what runs, then one KeyboardInterrupt."""
    imp, build, work = CASES[name]
    child = spawn_python(textwrap.dedent(CHILD).format(imp=imp, build=build, work=work))
    try:
        assert child.stdout is not None
        assert child.stderr is not None
        assert child.stdin is not None
        out, err = ChildLines(child.stdout), ChildLines(child.stderr)
        out.expect("inside the with block")
        interrupt(child)
        line = err.expect("waiting up to")
        assert line.startswith("WARNING thing: KeyboardInterrupt"), line
        assert "60s" in line, line
        interrupt(child)
        line = err.expect("stopping now")
        assert line.startswith("WARNING "), line
        assert "still running: thing" in line, "".join(err.seen)
        child.stdin.write("go\n")
        child.stdin.close()
        assert child.wait(timeout=MUST_HAPPEN) == -signal.SIGINT
        stderr = err.rest()
    finally:
        child.kill()
        child.wait(timeout=MUST_HAPPEN)
        for pipe in (child.stdin, child.stdout, child.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()
    assert stderr.count("Traceback (most recent call last)") == 1, stderr
    assert "During handling" not in stderr, stderr
