"""The signal_handlers pictures: P18, SIGTERM with no handler; P22, a signal another thread takes.

P18 is the common case (``docker stop``, a rolling update) and the pattern page's picture;
P22, where the main thread sleeps in ``Event.wait()`` meanwhile, is the notebook's. Each
runs in a child interpreter, the race tests' one, with marks.

Docs: docs/patterns/signal_handlers.md, notebooks/20-signal-handlers.ipynb
"""

from __future__ import annotations

import signal
import subprocess

from patterns.teaching.lanes import Tracer
from patterns.teaching.scenarios.common import LOOK, Child, Scenario

_P18_CHILD = """
import atexit
from patterns.signal_handlers import run_until_signalled
from patterns.naive.signal_handlers import naive_run_until_interrupted

atexit.register(mark, "atexit handler runs")

def work(stop):
    mark("takes job b; looks at stop between steps")
    stop.wait()
    mark("stop is set: hands job b back, returns")

def cleanup():
    mark("cleanup: closes the session")

mark("runs work in a thread")
try:
    {call}
finally:
    mark("finally runs")
"""


def _p18_run(fixed: bool) -> Tracer:
    if fixed:
        call = "run_until_signalled(work, drain_timeout=5, cleanup=cleanup)"
    else:
        call = "naive_run_until_interrupted(work, cleanup=cleanup)"
    child = Child(_P18_CHILD.format(call=call))
    try:
        child.expect("takes job b")
        child.mark("SIGTERM, as docker stop or a rolling update sends")
        child.proc.send_signal(signal.SIGTERM)
        status = child.finish()
    finally:
        child.proc.kill()
    if status == -signal.SIGTERM:
        child.mark("killed in job b: not finished, not handed back", bad=True, lane="worker")
        child.mark(f"child exited {status}: no cleanup, no finally, no atexit")
    else:
        child.mark(f"child exited {status}")
    title = call.split("(")[0]
    return child.trace(title, {"MainThread": "child main", "worker": "child worker"})


P18 = Scenario.of(
    "P18",
    _p18_run,
    "With no SIGTERM handler the child dies where it is, halfway through job b: no cleanup, "
    "no finally, no atexit; run_until_signalled turns SIGTERM into a stop request, so the "
    "work hands job b back and every cleanup runs before the exit, with status 0.",
)

_P22_CHILD = """
import inspect, signal
from patterns.signal_handlers import install_signal_handlers
from patterns.naive.signal_handlers import naive_install_stop_handler

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
                child.mark(
                    "sleeps on in stop.wait(): on_stop has not run", bad=True, lane="MainThread"
                )
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
