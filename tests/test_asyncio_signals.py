"""asyncio signals: SIGTERM and a second signal, forced, and the pattern holding the same way.

Signal and exit behaviour runs in a child interpreter that prints flushed marker lines, read
with a timeout before the test acts (sends a signal), so every interleaving is forced;
coroutine tests run their own loop with `asyncio.run`.
"""

from __future__ import annotations

import asyncio
import math
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest

from patterns.asyncio_signals import (
    AsyncSignalHandlers,
    SignalReport,
    TaskShutdownReport,
    run_until_signalled,
)
from tests.support import MUST_HAPPEN, NOISE, child

# The bound for a forced exit after the second signal (its flush takes at most 0.5 s), with
# scheduling noise; a naive child still alive this long after it has ignored the signal.
SECOND_SIGNAL_WATCH = 1.0 + NOISE


# --- A6 and A9: SIGTERM and the second signal ---------------------------------------------

A6_NAIVE = """
import asyncio
async def main():
    try:
        print("ready", flush=True)
        await asyncio.Event().wait()
    finally:
        print("cleanup", flush=True)
asyncio.run(main())
"""

A6_PATTERN = """
import asyncio, sys
from patterns.asyncio_signals import run_until_signalled
async def work(stop):
    print("ready", flush=True)
    await stop.wait()
    print("cleanup", flush=True)
report = asyncio.run(run_until_signalled(work, drain_timeout=30))
print("finished" if report.finished == ("work",) else report, flush=True)
sys.exit(0 if report.terminated else 1)
"""


@pytest.mark.race("A6", "asyncio.run handles SIGINT only: SIGTERM kills it with no cleanup")
def test_naive_asyncio_run_dies_on_sigterm_without_cleanup(
    record_property: Callable[[str, object], None],
) -> None:
    """SIGTERM takes its default action: the process dies and the finally block never runs."""
    with child(A6_NAIVE) as c:
        c.expect("ready")
        c.proc.send_signal(signal.SIGTERM)
        rest = c.rest()
        status = c.proc.returncode
        record_property(
            "observed",
            f"status {status} ({'killed by SIGTERM' if status == -signal.SIGTERM else 'exited'}),"
            f" printed after 'ready': {rest or 'nothing'}, the finally never ran",
        )
        assert rest == []
        assert c.proc.returncode == -signal.SIGTERM


def test_asyncio_run_turns_sigint_into_a_cancellation() -> None:
    """The same program on SIGINT runs its finally: asyncio.Runner cancels the main task."""
    with child(A6_NAIVE) as c:
        c.expect("ready")
        c.proc.send_signal(signal.SIGINT)
        assert c.rest() == ["cleanup"]
        assert c.proc.returncode == -signal.SIGINT  # KeyboardInterrupt re-raised as the signal


@pytest.mark.race("A6", "asyncio.run handles SIGINT only: SIGTERM kills it with no cleanup")
def test_run_until_signalled_stops_gracefully_on_sigterm() -> None:
    """SIGTERM sets the stop event; work cleans up and returns; the exit status is 0."""
    with child(A6_PATTERN) as c:
        c.expect("ready")
        c.proc.send_signal(signal.SIGTERM)
        assert c.rest() == ["cleanup", "finished"]
        assert c.proc.returncode == 0


A9_NAIVE = """
import asyncio
from patterns.naive.asyncio_signals import naive_install_stop_handler
async def main():
    stop = asyncio.Event()
    naive_install_stop_handler(stop)
    print("ready", flush=True)
    await stop.wait()
    print("draining", flush=True)
    await asyncio.Event().wait()  # a drain that never ends
asyncio.run(main())
"""

A9_PATTERN = """
import asyncio
from patterns.asyncio_signals import run_until_signalled
async def work(stop):
    print("ready", flush=True)
    await stop.wait()
    print("draining", flush=True)
    await asyncio.Event().wait()  # a drain that never ends
asyncio.run(run_until_signalled(work, drain_timeout=60))
"""


@pytest.mark.race("A9", "a second SIGTERM during a stuck drain does nothing")
def test_naive_second_sigterm_is_ignored_during_a_stuck_drain(
    record_property: Callable[[str, object], None],
) -> None:
    """The naive handler only sets the event again: the process stays alive."""
    with child(A9_NAIVE) as c:
        c.expect("ready")
        c.proc.send_signal(signal.SIGTERM)
        c.expect("draining")
        c.proc.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            c.proc.wait(SECOND_SIGNAL_WATCH)
        record_property(
            "observed",
            f"the 2nd SIGTERM only set the event again: still alive {SECOND_SIGNAL_WATCH}s later",
        )


@pytest.mark.race("A9", "a second SIGTERM during a stuck drain does nothing")
def test_second_signal_forces_the_exit_with_128_plus_signum() -> None:
    """The second SIGTERM ends the process at once with status 143 (128 + 15)."""
    with child(A9_PATTERN) as c:
        c.expect("ready")
        c.proc.send_signal(signal.SIGTERM)
        c.expect("draining")
        began = time.monotonic()
        c.proc.send_signal(signal.SIGTERM)
        c.proc.wait(MUST_HAPPEN)
        assert time.monotonic() - began < SECOND_SIGNAL_WATCH
        assert c.proc.returncode == 128 + signal.SIGTERM
        c.rest()
        assert any("second signal (SIGTERM)" in line for line in c.err)


def test_async_signal_handlers_put_back_the_previous_handlers() -> None:
    """After stop(), each signal has exactly the handler object it had before start()."""

    def mine(signum: int, frame: object) -> None:
        pass

    async def main() -> None:
        old_term = signal.signal(signal.SIGTERM, mine)
        try:
            before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
            handlers = AsyncSignalHandlers(lambda s: None)
            with handlers:
                assert signal.getsignal(signal.SIGTERM) is not mine
            after = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
            assert after == before
            assert handlers.stop() is handlers.stop()
            with pytest.raises(RuntimeError, match="can be called once"):
                handlers.start()
        finally:
            signal.signal(signal.SIGTERM, old_term)

    asyncio.run(main())


def test_async_signal_handlers_refuse_bad_signals() -> None:
    """An unknown signal number or an empty list is a ValueError that names the problem."""
    with pytest.raises(ValueError, match="signals"):
        AsyncSignalHandlers(lambda s: None, [99999])
    with pytest.raises(ValueError, match="at least one"):
        AsyncSignalHandlers(lambda s: None, [])


def test_async_signal_handlers_start_is_all_or_nothing() -> None:
    """A signal that cannot be handled (SIGKILL) fails start(); the ones before it are put back."""

    async def main() -> None:
        before = signal.getsignal(signal.SIGTERM)
        handlers = AsyncSignalHandlers(lambda s: None, [signal.SIGTERM, signal.SIGKILL])
        with pytest.raises((RuntimeError, OSError)):
            handlers.start()
        assert signal.getsignal(signal.SIGTERM) is before
        assert signal.set_wakeup_fd(-1) == -1  # the loop let go of the wakeup fd too
        assert handlers.stop().terminated

    asyncio.run(main())


NESTED_HANDLERS = """
import asyncio, os, signal
from patterns.asyncio_signals import AsyncSignalHandlers, run_until_signalled

async def inner(stop):
    print("inner running", flush=True)

async def main():
    loop = asyncio.get_running_loop()
    outer = asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, outer.set)  # the program's own loop handler
    with AsyncSignalHandlers(lambda s: outer.set()):
        await run_until_signalled(inner, drain_timeout=1)  # an inner pair, nested
        with AsyncSignalHandlers(lambda s: None, [signal.SIGUSR1]):
            pass
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            outer.clear()
            os.kill(os.getpid(), sig)
            try:
                await asyncio.wait_for(outer.wait(), {timeout})
                print(signal.Signals(sig).name, "reached the outer handler", flush=True)
            except TimeoutError:
                print(signal.Signals(sig).name, "did nothing", flush=True)
    print("done", flush=True)

asyncio.run(main())
"""


def test_an_inner_handler_pair_puts_back_the_loops_own_handler_when_it_stops() -> None:
    """After a nested stop, SIGTERM and SIGUSR1 still reach what the loop had before."""
    with child(NESTED_HANDLERS.format(timeout=MUST_HAPPEN / 4)) as c:
        assert c.rest() == [
            "inner running",
            "SIGUSR1 reached the outer handler",
            "SIGTERM reached the outer handler",
            "done",
        ]
        assert c.proc.returncode == 0


WITH_STARTED_SIGNAL_HANDLERS = """
import asyncio, signal
from patterns.asyncio_signals import AsyncSignalHandlers

async def main():
    handlers = AsyncSignalHandlers(lambda s: None)
    with handlers.start() as same:
        print("same:", same is handlers, flush=True)
    print("put back:", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
    try:
        with handlers:
            pass
    except RuntimeError as exc:
        print("stopped one:", exc, flush=True)

asyncio.run(main())
"""


def test_with_on_started_async_signal_handlers_returns_them_and_the_program_ends() -> None:
    """``with h.start():`` enters the running handlers and stops them; a stopped one raises."""
    with child(WITH_STARTED_SIGNAL_HANDLERS) as c:
        assert c.rest() == [
            "same: True",
            "put back: True",
            "stopped one: AsyncSignalHandlers.start() can be called once, before stop()",
        ]
        assert c.proc.returncode == 0


@pytest.mark.parametrize("budget", [math.inf, 1e10, 1e300, 10**400])
def test_an_infinite_or_huge_budget_waits_as_long_as_it_takes(budget: float) -> None:
    """Infinite and huge budgets are accepted everywhere and never overflow a timer."""

    async def main() -> None:
        async def work(stop: asyncio.Event) -> None:
            return None

        report = await run_until_signalled(work, drain_timeout=budget, cancel_timeout=budget)
        assert report.finished == ("work",)
        assert AsyncSignalHandlers(lambda s: None).stop(budget).terminated

    asyncio.run(main())


@pytest.mark.parametrize("bad", [math.nan, -1, True, "1", object()])
def test_every_seconds_argument_refuses_what_is_not_seconds_and_names_itself(bad: Any) -> None:
    """nan, negative, bool, str: ValueError naming the argument, before anything starts."""

    async def main() -> None:
        with pytest.raises(ValueError, match=r"^timeout must be a number of seconds >= 0"):
            AsyncSignalHandlers(lambda s: None).stop(bad)
        for kwargs in [{"drain_timeout": bad}, {"drain_timeout": 1, "cancel_timeout": bad}]:
            name = next(k for k, v in kwargs.items() if v is bad)
            with pytest.raises(ValueError, match=rf"^{name} must be a number of seconds >= 0"):
                await run_until_signalled(lambda stop: asyncio.sleep(0), **kwargs)

    asyncio.run(main())


def test_a_report_cannot_say_terminated_with_tasks_still_running() -> None:
    """Both reports refuse the lie: terminated=True with a non-empty still_running."""
    with pytest.raises(ValueError, match=r"terminated=True with still_running=.*stubborn"):
        TaskShutdownReport(terminated=True, still_running=("stubborn",))
    with pytest.raises(ValueError, match="terminated=True with still_running="):
        SignalReport(True, ("x",), None)
