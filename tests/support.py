"""Helpers that force an interleaving instead of hoping for one.

Every helper here blocks on a `threading.Event` or joins with a timeout; none of them
sleeps to make a race likely. A bounded wait in a test can only make the test slower,
never wrong: the thing waited for is released by the test itself, after the check.
"""

from __future__ import annotations

import _thread
import contextlib
import itertools
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any
from unittest import mock

# How long a test is willing to wait for something that *must* happen. Generous on
# purpose: on a loaded 2-core CI machine a thread can be descheduled for a while, and
# the wait ends as soon as the event happens, so a large value costs nothing.
MUST_HAPPEN = 10.0

# How long a test watches for something that must *not* happen (a thread that must
# stay blocked). The blocker is released only by the test after the check, so this
# value cannot make the test pass by luck; it only decides how long we look.
STAYS_BLOCKED = 0.2

# Scheduling noise allowed on top of a deadline that code under test promises to keep
# (the executor issue asks for +0.5 s at most): `took() < budget + NOISE`.
NOISE = 0.5


class Gate:
    """A checkpoint a task reaches and then waits at until the test opens it.

    `reached` is set by the task (``gate.arrive()``); the test waits on it with
    `wait_reached()`, acts while the task is parked, then calls `open()`.
    """

    def __init__(self, name: str = "gate") -> None:
        self.name = name
        self.reached = threading.Event()  # set by the task when it arrives
        self.opened = threading.Event()  # set by the test to let the task go on

    def arrive(self, timeout: float = MUST_HAPPEN) -> None:
        """Called by the task: announce arrival, then wait until the test opens the gate."""
        self.reached.set()
        if not self.opened.wait(timeout):
            raise TimeoutError(f"{self.name}: the test never opened the gate")

    def wait_reached(self, timeout: float = MUST_HAPPEN) -> None:
        """Called by the test: block until the task is parked at the gate."""
        if not self.reached.wait(timeout):
            raise AssertionError(f"{self.name}: the task never reached the gate")

    def open(self) -> None:
        """Let the parked task go on."""
        self.opened.set()


def join_or_fail(thread: threading.Thread, timeout: float = MUST_HAPPEN) -> None:
    """Join `thread` with a timeout and fail loudly if it is still alive."""
    thread.join(timeout)
    assert not thread.is_alive(), f"thread {thread.name} did not end within {timeout}s"


def stays_blocked(thread: threading.Thread, duration: float = STAYS_BLOCKED) -> bool:
    """Return True if `thread` is still alive after watching it for `duration` seconds."""
    thread.join(duration)
    return thread.is_alive()


def run_in_thread(fn: Callable[[], Any], name: str) -> tuple[threading.Thread, dict[str, Any]]:
    """Start `fn` in a thread; the returned dict gets ``result`` or ``error`` when it ends.

    The error is recorded rather than left to `threading.excepthook`, so a test can
    assert on it (and pytest does not turn it into an unhandled-thread warning).
    """
    outcome: dict[str, Any] = {}

    def body() -> None:
        try:
            outcome["result"] = fn()
        except BaseException as exc:  # the test inspects whatever it was
            outcome["error"] = exc

    thread = threading.Thread(target=body, name=name)
    thread.start()
    return thread, outcome


def wait_until_blocked_in(
    thread: threading.Thread, func_name: str, timeout: float = MUST_HAPPEN
) -> None:
    """Block until `thread`'s stack contains a frame of the function `func_name`.

    This observes where the thread *is*, instead of guessing how long it takes to get
    there; it returns as soon as the thread has been seen inside `func_name`.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(thread.ident or -1)
        while frame is not None:
            if frame.f_code.co_name == func_name:
                return
            frame = frame.f_back
        time.sleep(0.001)  # polling an observation, not waiting for a race
    raise AssertionError(f"{thread.name} was never seen inside {func_name}()")


# The innermost Python frame of a thread parked in a blocking wait (a lock, an event, a
# join), on 3.11 to 3.13.
_PARKED = frozenset({"wait", "join", "_wait_for_tstate_lock", "acquire"})


def _sleep_mark(thread: threading.Thread) -> tuple[int, int] | None:
    """``thread``'s context switches so far if the kernel has it asleep now, else None."""
    try:
        with open(f"/proc/self/task/{thread.native_id}/status", encoding="utf-8") as status:
            fields = dict(line.split(":", 1) for line in status.read().splitlines())
    except FileNotFoundError:  # the thread has ended
        return None
    if not fields["State"].strip().startswith("S"):  # R: running, or runnable
        return None
    return int(fields["voluntary_ctxt_switches"]), int(fields["nonvoluntary_ctxt_switches"])


def asleep_in_a_wait(thread: threading.Thread) -> bool:
    """Whether the kernel has ``thread`` asleep in a wait, where a signal interrupts it at once.

    A Python frame in a wait (``Event.wait``, ``lock.acquire``) does not say that: the C
    call releases the GIL first and only then sleeps, and a thread preempted in between is
    runnable, not asleep. A signal landing there runs only CPython's C handler, which sets
    a flag that is read when the wait returns: the Python handler runs when the timeout
    expires (10 s late, in tests/test_contract.py). Sent while the thread sleeps, the
    signal interrupts the wait and the handler runs at once.

    A thread also sleeps while it waits for the GIL, which the caller holds. So it must be
    seen asleep twice with no context switch between: the second look opens and reads a
    file, which releases the GIL, and a thread waiting for the GIL is woken by that (it is
    then running or runnable, or it has slept again and the count moved). Linux (/proc).
    """
    first = _sleep_mark(thread)
    return first is not None and _sleep_mark(thread) == first


def wait_until_parked_inside(
    thread: threading.Thread, func_name: str, timeout: float = MUST_HAPPEN
) -> None:
    """Block until `thread` is parked in a blocking wait somewhere inside `func_name`().

    Used before a real signal is sent to the main thread, so that it lands while a
    ``stop()`` is blocked, which is the case being tested: asleep in the wait, not only
    with the wait's frame innermost (see `asleep_in_a_wait`).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(thread.ident or -1)
        names = []
        while frame is not None:
            names.append(frame.f_code.co_name)
            frame = frame.f_back
        if names and names[0] in _PARKED and func_name in names and asleep_in_a_wait(thread):
            return
        time.sleep(0.001)  # polling an observation, not waiting for a race
    raise AssertionError(f"{thread.name} was never seen parked inside {func_name}()")


def signal_main_when_inside(func_name: str, signum: int) -> threading.Thread:
    """A thread that sends ``signum`` to the main thread once it is seen inside ``func_name``.

    A real signal (``signal.pthread_kill``), as a Ctrl-C or a ``kill`` would deliver it, at
    the point the test names; the caller joins the returned thread.
    """
    main = threading.main_thread()

    def send() -> None:
        wait_until_blocked_in(main, func_name)
        assert main.ident is not None
        signal.pthread_kill(main.ident, signum)

    sender = threading.Thread(target=send, name="signal-sender")
    sender.start()
    return sender


@contextmanager
def signal_main_during(
    func_name: str,
    handler: Callable[[int, Any], Any] | int = signal.default_int_handler,
    *,
    signum: int = signal.SIGINT,
    parked: bool = False,
) -> Iterator[None]:
    """Within the block, a real ``signum`` reaches the main thread once it is inside ``func_name``.

    ``handler`` is installed for the block (by default Ctrl-C raises `KeyboardInterrupt`,
    as in a terminal) and the previous one restored after it. With ``parked`` the signal
    waits until the main thread is parked in a blocking wait there, not merely inside.
    The sender is joined before the handler is restored, so no signal comes after, and a
    block that ends without the signal having been sent fails.
    """
    main = threading.main_thread()
    sent = threading.Event()

    def send() -> None:
        if parked:
            wait_until_parked_inside(main, func_name)
        else:
            wait_until_blocked_in(main, func_name)
        assert main.ident is not None
        signal.pthread_kill(main.ident, signum)
        sent.set()

    previous = signal.signal(signum, handler)
    sender = threading.Thread(target=send, name="signal-sender")
    try:
        sender.start()
        yield
    finally:
        if sender.ident is not None:
            join_or_fail(sender)
        signal.signal(signum, previous)
    assert sent.is_set(), f"no signal was sent: the main thread was never seen in {func_name}()"


# A child script: a signal handler calls ``service.stop()`` on the main thread while that
# thread is already waiting in ``service.stop()``. ``{setup}`` builds ``service``, started,
# whose work waits on ``release``; ``{settled}`` is what must hold first, when the stop waits
# for something else before the work (the signal must land in the wait for the work). The
# script prints what the handler's stop() reported (terminated, still_running, returned in
# under a second), then whether the outer stop() terminated and is the recorded report.
_HANDLER_STOPS_DURING_STOP = """
import signal, threading, time
from tests.support import wait_until, wait_until_parked_inside

release, handled = threading.Event(), threading.Event()
{setup}
seen = {{}}

def handler(signum, frame):
    began = time.monotonic()
    report = service.stop(20)
    seen["handler"] = (report.terminated, report.still_running, time.monotonic() - began)
    handled.set()

def helper():
    wait_until(lambda: {settled}, "the stop's waits before the work's are over")
    wait_until_parked_inside(threading.main_thread(), "stop")
    signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
    handled.wait(5)
    release.set()

signal.signal(signal.SIGUSR1, handler)
threading.Thread(target=helper).start()
report = service.stop(20)
terminated, still, took = seen["handler"]
print(terminated, still, took < 1.0, report.terminated, service.stop(0) is report)
"""


def handler_stops_during_stop(setup: str, settled: str = "True") -> str:
    """Run the child script above with ``setup``; return its output, or fail on a deadlock."""
    code = _HANDLER_STOPS_DURING_STOP.format(setup=setup, settled=settled)
    return _child_output_or_deadlock(
        code, 3 * MUST_HAPPEN, "the handler's stop() waited for the stop() it interrupted"
    )


def _child_output_or_deadlock(code: str, timeout: float, deadlock: str) -> str:
    """A child script's output within ``timeout``; else an AssertionError naming ``deadlock``."""
    try:
        result = run_python(code, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"deadlock: {deadlock}") from None
    assert result.returncode == 0, result.stderr
    return result.stdout


# A child script: a signal handler calls ``service.stop()`` while the stop() it interrupted is
# inside the stop event's ``set()``, holding the event's lock (E1). ``{setup}`` imports the
# class as ``Kind``, built with ``work(stopping)``: the work makes that set() raise SIGUSR1
# from notify_all(), which runs under the lock, and raise_signal runs the Python handler
# before it returns, as a real signal's handler runs between two bytecodes there. The script
# prints what the handler's stop() reported (terminated, returned in under a second), then
# whether the outer stop() terminated and is the recorded report.
_HANDLER_STOPS_INSIDE_SET = """
import signal, threading, time
{setup}

armed, release, seen = threading.Event(), threading.Event(), {{}}

def work(stopping):
    cond = stopping._cond  # Event.set() calls cond.notify_all() with the event's lock held
    notify_all = cond.notify_all

    def notify_all_then_signal():
        del cond.notify_all  # once
        signal.raise_signal(signal.SIGUSR1)
        notify_all()

    cond.notify_all = notify_all_then_signal
    armed.set()
    release.wait(20)

def handler(signum, frame):
    began = time.monotonic()
    report = service.stop(20)
    seen["handler"] = (report.terminated, time.monotonic() - began < 1.0)
    release.set()

signal.signal(signal.SIGUSR1, handler)
service = Kind(work, name="svc", stop_timeout=20).start()
armed.wait(20)
report = service.stop(20)
print(*seen["handler"], report.terminated, service.stop(0) is report)
"""


def handler_stops_inside_the_stop_event_set(setup: str) -> str:
    """Run the child script above with ``setup``; return its output, or fail on a deadlock."""
    code = _HANDLER_STOPS_INSIDE_SET.format(setup=setup)
    return _child_output_or_deadlock(
        code, MUST_HAPPEN, "the handler's stop() waited for the event lock its own thread holds"
    )


def drain(q: Any, shut_down: type[Exception]) -> list[object]:
    """Take items with ``get_nowait()`` until the queue raises ``shut_down``; return them.

    Any other exception (the queue's Empty) is a failure: the queue was not shut down.
    """
    items = []
    while True:
        try:
            items.append(q.get_nowait())
        except shut_down:
            return items


def wait_until(condition: Callable[[], bool], what: str, timeout: float = MUST_HAPPEN) -> None:
    """Poll an observation until it holds; the test has arranged that it must."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.001)  # polling an observation, not waiting for a race


@contextmanager
def elapsed() -> Iterator[Callable[[], float]]:
    """Measure the wall time of a block; the yielded function returns the seconds taken."""
    start = time.monotonic()
    end: list[float] = []
    try:
        yield lambda: (end[0] if end else time.monotonic()) - start
    finally:
        end.append(time.monotonic())


def child_env() -> dict[str, str]:
    """Environment for a child interpreter: unbuffered output, this checkout importable."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env


def spawn_python(code: str, **kwargs: Any) -> subprocess.Popen[str]:
    """Start ``python -c code`` with pipes, for interpreter-exit behaviour."""
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
        **kwargs,
    )


def run_python(
    code: str, *args: str, timeout: float = MUST_HAPPEN
) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code args...`` to its end (or ``timeout``), output captured as text."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# --- a start() that fails or is interrupted part-way ---------------------------------------

REAL_START = threading.Thread.start


@contextmanager
def thread_start_patched(k: int, action: Callable[[threading.Thread], None]) -> Iterator[None]:
    """Patch `threading.Thread.start` so that its ``k``-th call (from 1) runs ``action``.

    ``action`` gets the thread and the real start (`REAL_START`) is its to call, or not: it
    can fail before starting, start and then be interrupted, or park at a gate first.
    """
    calls = itertools.count(1)

    def start(thread: threading.Thread) -> None:
        if next(calls) == k:
            action(thread)
        else:
            REAL_START(thread)

    with mock.patch.object(threading.Thread, "start", start):
        yield


def cannot_start(thread: threading.Thread) -> None:
    """What `Thread.start` raises when the system is out of threads."""
    raise RuntimeError("can't start new thread")


def start_then_interrupt(thread: threading.Thread) -> None:
    """Start the thread for real, then let a Ctrl-C land before start() returns."""
    REAL_START(thread)
    _thread.interrupt_main()  # the main thread's signal flag is set, as Ctrl-C would
    pending_checkpoint()  # ...and the KeyboardInterrupt is raised at the next check


def start_at(gate: Gate) -> Callable[[threading.Thread], None]:
    """An action for `thread_start_patched`: park at ``gate``, then start the thread for real.

    The test acts (a ``stop()`` racing ``start()``, say) while ``Thread.start`` is under way.
    """

    def start(thread: threading.Thread) -> None:
        gate.arrive()
        REAL_START(thread)

    return start


def pending_checkpoint() -> None:
    """A Python-level call: the interpreter runs pending signal handlers on entering it."""


# --- uncaught thread exceptions, recorded instead of reaching pytest -----------------------


@contextmanager
def recording_hook() -> Iterator[list[tuple[type[BaseException], str]]]:
    """Install the test's own threading.excepthook, which records (type, thread name).

    It keeps uncaught thread exceptions away from pytest's hook (which would turn them
    into errors), and is restored exactly, checked by identity, when the block ends.
    """
    seen: list[tuple[type[BaseException], str]] = []

    def record(args: threading.ExceptHookArgs) -> None:
        seen.append((args.exc_type, args.thread.name if args.thread else "?"))

    before = threading.excepthook
    threading.excepthook = record
    try:
        yield seen
    finally:
        assert threading.excepthook is record, "a hook installed by the test leaked"
        threading.excepthook = before


# --- asyncio objects driven from synchronous code (the lifecycle contract test is synchronous)


class _LoopThreadAdapter:
    """An asyncio object with a coroutine ``stop()`` behind a synchronous start()/stop().

    `start` starts an event loop in a thread of its own and starts the object in it
    (`_begin`); `stop` awaits the object's own stop in that loop (bounded by the budget),
    lets the loop's other tasks end (`_end_tasks`), then stops the loop, joins its thread
    and closes it. The report is the object's own, the same object on every call.
    Subclasses say how to build, begin and stop the object.
    """

    def __init__(self, *, stop_timeout: float = 5.0, name: str = "contract-tasks") -> None:
        self.stop_timeout = stop_timeout
        self.name = name
        self.inner = self._build(stop_timeout, name)  # touches no loop
        self._lock = threading.Lock()  # guards everything below; held for a whole stop()
        self._loop: Any = None
        self._thread: threading.Thread | None = None
        self._started = False
        self._report: Any = None

    def _build(self, stop_timeout: float, name: str) -> Any:
        raise NotImplementedError

    async def _begin(self) -> None:
        raise NotImplementedError

    def _never_started(self) -> Any:
        raise NotImplementedError

    def start(self) -> Any:
        """Start the loop's thread and the object in it; all or nothing."""
        import asyncio  # noqa: PLC0415

        with self._lock:
            if self._started or self._report is not None:
                raise RuntimeError("start() can be called once, before stop()")
            self._started = True
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name=f"{self.name}-loop")
            try:
                thread.start()
            except BaseException:
                loop.close()
                raise
            self._loop, self._thread = loop, thread
        asyncio.run_coroutine_threadsafe(self._begin(), loop).result(MUST_HAPPEN)
        return self

    def stop(self, timeout: float | None = None) -> Any:
        """The object's stop, awaited in its loop; then the loop's thread is joined."""
        import asyncio  # noqa: PLC0415

        budget = self.stop_timeout if timeout is None else timeout
        if isinstance(budget, bool) or not isinstance(budget, int | float) or not budget >= 0:
            raise ValueError(f"timeout must be a number of seconds >= 0, not {timeout!r}")
        with self._lock:
            if self._report is not None:
                return self._report
            loop, thread = self._loop, self._thread
            if loop is None or thread is None:  # never started
                self._report = self._never_started()
                return self._report
            left: list[str] | None = None  # tasks still pending once _end_tasks is done
            try:
                done = asyncio.run_coroutine_threadsafe(self.inner.stop(budget), loop)
                # min() first: budget may be an int too large for a float (10**400)
                wait = min(min(budget, threading.TIMEOUT_MAX) + NOISE, threading.TIMEOUT_MAX)
                self._report = done.result(wait)
            finally:
                try:
                    ended = asyncio.run_coroutine_threadsafe(_end_tasks(), loop)
                    left = ended.result(2 * MUST_HAPPEN + NOISE)
                finally:
                    loop.call_soon_threadsafe(loop.stop)
                    thread.join(MUST_HAPPEN)
                    if not thread.is_alive() and left == []:  # never close on a pending task
                        loop.close()
            assert left == [], f"tasks still pending after they were cancelled: {left}"
            return self._report

    def __enter__(self) -> Any:
        with self._lock:
            running = self._started and self._report is None
        return self if running else self.start()  # start() refuses a stopped one

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


async def _end_tasks() -> list[str]:
    """Let the loop's other tasks end, then cancel those left; the names of any still pending.

    An object's stop may return before its tasks have ended (a zero budget reports "not
    yet"), and a loop closed then destroys them pending ("Task was destroyed but it is
    pending!"): the task that entered a `StoppableTaskGroup`, say, is still leaving its
    ``async with``. Each wait is bounded by MUST_HAPPEN, so a task that ignores its
    cancellation fails the stop instead of hanging it.
    """
    import asyncio  # noqa: PLC0415

    others = asyncio.all_tasks() - {asyncio.current_task()}
    if not others:
        return []
    _, pending = await asyncio.wait(others, timeout=MUST_HAPPEN)
    for task in pending:
        task.cancel()
    if pending:
        _, pending = await asyncio.wait(pending, timeout=MUST_HAPPEN)
    return sorted(task.get_name() for task in pending)


class LoopThreadTaskSet(_LoopThreadAdapter):
    """A `patterns.asyncio_shutdown.TaskSet` with one task that waits until cancelled.

    Shared by tests/test_asyncio_shutdown.py and the contract test.
    """

    def _build(self, stop_timeout: float, name: str) -> Any:
        from patterns.asyncio_shutdown import TaskSet  # noqa: PLC0415 - only this helper needs it

        return TaskSet(stop_timeout=stop_timeout, name=name)

    @property
    def task_set(self) -> Any:
        """The TaskSet itself."""
        return self.inner

    async def _begin(self) -> None:
        import asyncio  # noqa: PLC0415

        self.inner.start()
        self.inner.spawn(asyncio.Event().wait(), name=f"{self.name}-waiter")

    def _never_started(self) -> Any:
        from patterns.asyncio_shutdown import TaskShutdownReport  # noqa: PLC0415

        return TaskShutdownReport(terminated=True, still_running=())


class LoopThreadConsumerPool(_LoopThreadAdapter):
    """A `patterns.async_queue.AsyncConsumerPool` of two consumers that handle nothing."""

    def _build(self, stop_timeout: float, name: str) -> Any:
        from patterns.async_queue import AsyncConsumerPool  # noqa: PLC0415

        async def handle(item: object) -> None:
            return None

        return AsyncConsumerPool(handle, consumers=2, name=name, stop_timeout=stop_timeout)

    async def _begin(self) -> None:
        self.inner.start()

    def _never_started(self) -> Any:
        import asyncio  # noqa: PLC0415

        async def stop_unstarted() -> Any:
            return await self.inner.stop()

        return asyncio.run(stop_unstarted())


class LoopThreadAsyncServer(_LoopThreadAdapter):
    """A `patterns.server_shutdown_asyncio.AsyncGracefulServer` on 127.0.0.1, no clients."""

    def _build(self, stop_timeout: float, name: str) -> Any:
        from patterns.server_shutdown_asyncio import AsyncGracefulServer  # noqa: PLC0415

        async def handle(conn: Any) -> None:
            return None

        return AsyncGracefulServer(handle, stop_timeout=stop_timeout, name=name)

    async def _begin(self) -> None:
        self.inner.start()

    def _never_started(self) -> Any:
        import asyncio  # noqa: PLC0415

        async def stop_unstarted() -> Any:
            return await self.inner.stop()

        return asyncio.run(stop_unstarted())


class Child:
    """A child interpreter whose stdout arrives line by line; every read has a timeout."""

    def __init__(self, code: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        self.out: queue.Queue[str] = queue.Queue()
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self.out.put)),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self.err.append)),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _pump(stream: IO[str], put: Any) -> None:
        for line in stream:
            put(line.rstrip("\n"))

    def expect(self, line: str, timeout: float = MUST_HAPPEN) -> None:
        """Read the next stdout line and check it is ``line``."""
        try:
            got = self.out.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"child never printed {line!r}; stderr: {''.join(self.err)[-2000:]}"
            ) from None
        assert got == line, f"expected {line!r}, got {got!r}; stderr: {self.err[-20:]}"

    def rest(self) -> list[str]:
        """Wait for the child to exit (bounded) and return the stdout lines not yet read."""
        self.proc.wait(MUST_HAPPEN)
        for reader in self._readers:
            reader.join(MUST_HAPPEN)
        lines = []
        while not self.out.empty():
            lines.append(self.out.get())
        return lines

    def close(self) -> None:
        """Kill the child if it still runs, join the readers, close the pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(MUST_HAPPEN)
        for reader in self._readers:
            reader.join(MUST_HAPPEN)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):  # stdin: a broken pipe on flush
                    stream.close()


@contextmanager
def child(code: str) -> Iterator[Child]:
    """Run ``code`` in a child interpreter; kill it if the test leaves it running."""
    c = Child(code)
    try:
        yield c
    finally:
        c.close()


class FakeClock:
    """A store's (and a worker's) clock, in seconds since the epoch, moved only by the test.

    Thread-safe: handler, claimer and heartbeat threads read it while the test moves it.
    """

    def __init__(self, now: float = 1_000_000.0) -> None:
        self._lock = threading.Lock()
        self._now = now

    def __call__(self) -> float:
        """The current fake time."""
        return self.now

    @property
    def now(self) -> float:
        """The current fake time; a test may set it."""
        with self._lock:
            return self._now

    @now.setter
    def now(self, value: float) -> None:
        with self._lock:
            self._now = value

    def advance(self, seconds: float) -> float:
        """Move time forward and return the new reading."""
        with self._lock:
            self._now += seconds
            return self._now


class ChildLines:
    """Lines of a child's pipe, read on a thread, awaited with a deadline."""

    def __init__(self, pipe: IO[str]) -> None:
        self.seen: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(pipe,), daemon=True).start()

    def _read(self, pipe: IO[str]) -> None:
        for line in pipe:
            self._lines.put(line)
        self._lines.put(None)

    def expect(self, text: str) -> str:
        """The first line (from here on) that contains ``text``; fails after MUST_HAPPEN."""
        while True:
            try:
                line = self._lines.get(timeout=MUST_HAPPEN)
            except queue.Empty:
                raise AssertionError(f"no line with {text!r} in:\n{''.join(self.seen)}") from None
            if line is None:
                raise AssertionError(f"ended without {text!r}:\n{''.join(self.seen)}")
            self.seen.append(line)
            if text in line:
                return line

    def rest(self) -> str:
        """Everything, once the pipe has closed."""
        while (line := self._lines.get(timeout=MUST_HAPPEN)) is not None:
            self.seen.append(line)
        return "".join(self.seen)
