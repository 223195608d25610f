"""The exit_hooks picture, P22: a signal taken by another thread.

The main thread sleeps in ``Event.wait()`` meanwhile. Run in a child interpreter, the race
tests' one, with marks.

Docs: docs/patterns/exit_hooks.md
"""

from __future__ import annotations

import signal
import subprocess

from patterns.teaching.lanes import Tracer
from patterns.teaching.scenarios.common import LOOK, Child, Scenario

_P22_CHILD = """
import inspect, signal
from patterns.exit_hooks import install_signal_handlers
from patterns.naive.exit_hooks import naive_install_stop_handler

# The line of Condition.wait where a wait with no timeout sleeps in C: seeing the main
# thread there means it is asleep, not on its way.
_src, _first = inspect.getsourcelines(threading.Condition.wait)
ASLEEP = _first + next(i for i, s in enumerate(_src)
                       if s.strip() == "waiter.acquire()"
                       and _src[i - 1].strip() == "if timeout is None:")

def main_is_asleep():
    # Asleep in Condition.wait, called by Event.wait, called by the module's own
    # stop.wait() (Thread.start() waits in an Event too: that one does not count).
    frames = []
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return (len(frames) >= 3 and frames[0].f_code is threading.Condition.wait.__code__
            and frames[0].f_lineno == ASLEEP and frames[2].f_code.co_name == "<module>")

stop = threading.Event()

def on_stop():
    mark("on_stop(): stop.set()")
    stop.set()

{install}(on_stop)

def signal_this_thread():
    while not main_is_asleep():
        time.sleep(0.001)  # polling an observation, not waiting for a race
    mark("SIGTERM aimed at this thread (pthread_kill)")
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    mark("signal delivered")

helper = threading.Thread(target=signal_this_thread, name="helper")
helper.start()
mark("stop.wait(), no timeout")
stop.wait()
mark("wakes: stopped")
helper.join()
"""


def _p22_run(fixed: bool) -> Tracer:
    install = "install_signal_handlers" if fixed else "naive_install_stop_handler"
    child = Child(_P22_CHILD.format(install=install))
    try:
        child.expect("signal delivered")
        if fixed:
            child.expect("wakes")
        else:
            try:
                child.proc.wait(LOOK)
            except subprocess.TimeoutExpired:
                child.mark("the child's main thread sleeps on", bad=True)
            else:
                raise RuntimeError("P22: the naive child exited after a worker's signal")
            child.mark("SIGTERM to the process: the main thread takes this one")
            child.proc.send_signal(signal.SIGTERM)
        status = child.finish()
    finally:
        child.proc.kill()
    child.mark(f"child exited {status}")
    lanes = {"MainThread": "child main", "helper": "child helper"}
    return child.trace(install, lanes)


P22 = Scenario.of(
    "P22",
    _p22_run,
    "A SIGTERM taken by a helper thread never wakes a main thread asleep in "
    "stop.wait() with the textbook handler; with install_signal_handlers, on_stop "
    "runs in a thread of its own and the main thread wakes.",
)
