# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""Say which thread, hook or child holds a program that will not exit.

TL;DR::

    python -m patterns.exit_doctor --after 5 my_program.py args...   # or: -m my.module
    # in a service's own code, once, early:
    doctor = exit_doctor.install(after=10, kill=False, stream=sys.stderr)

Pitfall:
    ``main`` returns, and the process stays. The interpreter is joining a non-daemon thread,
    an executor's worker, a ``multiprocessing`` queue's feeder thread, or running an
    ``atexit`` handler, each with no timeout, and it says nothing about which.
    ``faulthandler`` prints stacks, but not which of them the exit waits for, nor where the
    thread came from.

Pattern:
    A daemon watchdog thread, started at install, waits for a sign that the program is on
    its way out: the main code returned or raised, a SIGTERM or SIGINT arrived, or
    ``asyncio.run`` began waiting for its default executor. If the process is still there
    ``after`` seconds later, it writes one report: where the main thread is in the exit
    sequence (``threading._shutdown``, which atexit handler), every non-daemon thread with
    its stack and where it was started, queue feeder threads, executors' busy workers and
    live child processes. With ``kill=True`` it then ends the process with `KILL_STATUS`.

Guarantees:
    * The doctor never holds the exit itself: its only thread is a daemon, and it takes no
      lock that the program's threads or signal handlers could hold (the watchdog's inbox
      is a `queue.SimpleQueue`, whose ``put`` is safe from a signal handler).
    * A program that exits on time sees no output and keeps its own exit status.
    * The program's signal handlers still run: the doctor wraps them, in place and for
      handlers installed later, and ``signal.getsignal`` returns the program's own.
    * ``install()`` is idempotent (a second call returns the first handle);
      ``uninstall()`` restores every patched function and handler.

Python: 3.11+, standard library only; the exit sequences it reads were checked on 3.11.7,
3.12.1 and 3.13.0. It reads private names (``threading._shutdown``,
``concurrent.futures.thread._threads_queues``, ``Thread._args``) and degrades to a
shorter report where one is missing.

Java: ``jstack`` (or ``kill -QUIT``) on a JVM that will not exit shows the non-daemon
threads; a ``Runtime.addShutdownHook`` thread stuck in a hook is this report's atexit case.

See also: docs/patterns/exit_doctor.md; the patterns that fix what it finds:
daemon_threads, executor_shutdown, process_shutdown, exit_hooks, asyncio_shutdown.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import math
import os
import queue
import runpy
import signal
import subprocess
import sys
import sysconfig
import textwrap
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from types import CodeType, FrameType, TracebackType
from typing import Any, TextIO

__all__ = ["KILL_STATUS", "Doctor", "diagnose", "install", "main"]

#: The exit status of a process the doctor ended (``kill=True``, ``--kill``).
KILL_STATUS = 3

_WATCHED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_STDLIB = tuple(
    {os.path.normcase(sysconfig.get_paths()[key]) + os.sep for key in ("stdlib", "platstdlib")}
)


class Doctor:
    """The handle `install` returns: the watchdog and the patches, undone by `uninstall`.

    Its inbox (a `queue.SimpleQueue`) is the only channel from the program to the watchdog
    thread: the main thread and signal handlers put ``(kind, key, text, when)`` messages
    there, the watchdog alone reads them, so nothing on the program's side takes a lock.
    """

    def __init__(self, after: float, kill: bool, stream: TextIO | None) -> None:
        self.after = after
        self.kill = kill
        self.stream = stream
        self.main_finished = False
        self.installed = False
        self._pid = os.getpid()
        self._inbox: queue.SimpleQueue[tuple[str, object, str, float]] = queue.SimpleQueue()
        self._started_at: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._popens: weakref.WeakSet[subprocess.Popen[Any]] = weakref.WeakSet()
        self._atexits: dict[CodeType, str] = {}  # handler's code -> "name, registered at ..."
        self._undo: list[Callable[[], None]] = []
        self._watchdog = threading.Thread(target=self._watch, name="exit-doctor", daemon=True)

    # -- the program tells the watchdog -------------------------------------------------

    def arm(self, key: object, why: str) -> None:
        """Start the countdown for ``key`` (the first arm of a key counts); safe in a handler."""
        if self.installed and os.getpid() == self._pid:
            self._inbox.put(("arm", key, why, time.monotonic()))

    def disarm(self, key: object) -> None:
        """Cancel the countdown for ``key``: that way out ended without the process ending."""
        if self.installed and os.getpid() == self._pid:
            self._inbox.put(("disarm", key, "", time.monotonic()))

    def main_returned(self) -> None:
        """The main code returned or raised: the interpreter's exit sequence starts now."""
        if self.installed and not self.main_finished:
            self.main_finished = True
            self.arm("main", "the main thread finished")

    # -- the watchdog ----------------------------------------------------------------------

    def _watch(self) -> None:
        armed: dict[object, tuple[str, float]] = {}
        reported = False
        while True:
            timeout = None
            if armed and not reported:
                why, since = min(armed.values(), key=lambda item: item[1])
                timeout = _left(since + self.after)
            try:
                kind, key, text, when = self._inbox.get(timeout=timeout)
            except queue.Empty:
                reported = True
                self._report(f"the process has not exited {self.after:g} s after {why}")
                continue
            if kind == "stop":
                return
            if kind == "arm":
                armed.setdefault(key, (text, when))
            elif kind == "disarm":
                armed.pop(key, None)
                reported = reported and bool(armed)

    def _report(self, headline: str) -> None:
        try:
            text = diagnose(self, headline)
        except Exception as exc:  # noqa: BLE001 - a failed report must not stop the kill
            text = f"exit-doctor: {headline}; the report failed: {exc!r}\n"
        if self.kill:
            text += f"exit-doctor: ending the process with status {KILL_STATUS} (kill=True)\n"
        else:
            text += "exit-doctor: leaving the process as it is (kill=False)\n"
        _write(self.stream or sys.stderr or sys.__stderr__, text)
        if self.kill:
            os._exit(KILL_STATUS)

    # -- what the doctor records, through the patches ------------------------------------

    def started_at(self, thread: threading.Thread) -> str | None:
        """Where ``thread.start()`` was called, if the doctor was installed by then."""
        return self._started_at.get(thread)

    def registered_atexit(self, code: CodeType) -> str | None:
        """The name and registration place of the atexit handler whose code is ``code``."""
        return self._atexits.get(code)

    def popens(self) -> list[tuple[subprocess.Popen[Any], str]]:
        """The `subprocess.Popen` objects made since install, with where each was made."""
        return [(p, self._started_at.get(p, "an unknown place")) for p in list(self._popens)]

    def uninstall(self) -> None:
        """Undo every patch and wrapped handler, and end the watchdog; idempotent."""
        global _installed  # noqa: PLW0603 - the one handle install() hands out
        if not self.installed:
            return
        self.installed = False
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        self._inbox.put(("stop", None, "", 0.0))
        if _installed is self:
            _installed = None


_installed: Doctor | None = None


def install(after: float = 5.0, *, kill: bool = False, stream: TextIO | None = None) -> Doctor:
    """Watch this process's exit from now on; a second call returns the first handle.

    ``after``: seconds to wait, once the process is on its way out, before reporting.
    ``kill``: after the report, end the process with `KILL_STATUS` instead of waiting.
    ``stream``: where the report goes; ``None`` means ``sys.stderr`` at report time.
    Call it from the main thread to wrap SIGTERM and SIGINT handlers (elsewhere it skips
    them). It imports ``asyncio`` and ``concurrent.futures`` so that their exit hooks are
    registered before the doctor's own.
    """
    global _installed  # noqa: PLW0603 - see Doctor.uninstall
    if _installed is not None:
        return _installed
    doctor = Doctor(_seconds(after, "after"), kill, stream)
    import asyncio.base_events  # noqa: PLC0415 - their exit hooks must come first
    import concurrent.futures.process  # noqa: PLC0415
    import concurrent.futures.thread  # noqa: PLC0415, F401

    doctor.installed = True
    _patch_thread_start(doctor)
    _patch_atexit_register(doctor)
    _patch_popen(doctor)
    _patch_default_executor_shutdown(doctor, asyncio.base_events.BaseEventLoop)
    if threading.current_thread() is threading.main_thread():
        _wrap_signals(doctor)
    # Runs first in threading._shutdown (hooks run newest first): the main code has ended.
    threading._register_atexit(doctor.main_returned)  # type: ignore[attr-defined]
    doctor._watchdog.start()
    _installed = doctor
    return doctor


def _origin(frame: FrameType | None) -> str:
    """Where a call came from: the first frame outside the standard library, and the caller.

    Walks at most 30 frames, so recording it costs a few attribute reads per thread start.
    """
    caller = frame
    depth = 0
    while frame is not None and depth < 30:
        filename = frame.f_code.co_filename
        if not (os.path.normcase(filename).startswith(_STDLIB) or filename == __file__):
            break
        frame, depth = frame.f_back, depth + 1
    else:
        frame = None
    if caller is None:
        return "an unknown place"
    if frame is None or frame is caller:
        shown = frame or caller
        return f"{shown.f_code.co_filename}:{shown.f_lineno} in {shown.f_code.co_name}"
    via = f"{os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name} (via {via})"


def _code_of(func: object) -> CodeType | None:
    """The code object a call of ``func`` runs first, for functions, methods and partials."""
    while isinstance(func, functools.partial):
        func = func.func
    func = getattr(func, "__func__", func)
    code = getattr(func, "__code__", None)
    return code if isinstance(code, CodeType) else None


def _replace(doctor: Doctor, owner: object, name: str, new: object) -> None:
    old = getattr(owner, name)
    setattr(owner, name, new)
    doctor._undo.append(lambda: setattr(owner, name, old))


def _patch_thread_start(doctor: Doctor) -> None:
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        doctor._started_at[self] = _origin(sys._getframe(1))
        real_start(self)

    _replace(doctor, threading.Thread, "start", start)


def _patch_atexit_register(doctor: Doctor) -> None:
    real_register = atexit.register

    def register(func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        code = _code_of(func)
        if code is not None:
            name = getattr(func, "__qualname__", code.co_name)
            doctor._atexits[code] = f"{name}, registered at {_origin(sys._getframe(1))}"
        return real_register(func, *args, **kwargs)

    _replace(doctor, atexit, "register", register)


def _patch_popen(doctor: Doctor) -> None:
    real_init = subprocess.Popen.__init__

    def __init__(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:  # noqa: N807
        where = _origin(sys._getframe(1))
        real_init(self, *args, **kwargs)
        doctor._started_at[self] = where  # only a child that started is worth a line
        doctor._popens.add(self)

    _replace(doctor, subprocess.Popen, "__init__", __init__)


def _patch_default_executor_shutdown(doctor: Doctor, loop_class: type) -> None:
    real = loop_class.shutdown_default_executor  # type: ignore[attr-defined]

    async def shutdown_default_executor(self: object, *args: Any, **kwargs: Any) -> None:
        key = object()
        doctor.arm(key, "asyncio.run began waiting for its default executor")
        try:
            await real(self, *args, **kwargs)
        finally:
            doctor.disarm(key)

    _replace(doctor, loop_class, "shutdown_default_executor", shutdown_default_executor)


class _Chained:
    """A signal handler that tells the doctor, then calls the program's own handler."""

    def __init__(self, doctor: Doctor, handler: Callable[[int, FrameType | None], Any]) -> None:
        self.doctor = doctor
        self.handler = handler

    def __call__(self, signum: int, frame: FrameType | None) -> Any:
        self.doctor.arm(("signal", signum), f"{signal.Signals(signum).name} arrived")
        return self.handler(signum, frame)


def _wrap_signals(doctor: Doctor) -> None:
    """Wrap SIGTERM's and SIGINT's Python handlers, now and whenever the program sets one.

    ``SIG_DFL`` and ``SIG_IGN`` stay as they are: the default SIGTERM ends the process at
    once (nothing holds that exit) and an ignored signal starts no exit.
    """
    real_signal, real_getsignal = signal.signal, signal.getsignal

    def unwrap(handler: Any) -> Any:
        return handler.handler if isinstance(handler, _Chained) else handler

    def set_handler(signalnum: int, handler: Any) -> Any:
        if signalnum in _WATCHED_SIGNALS and callable(handler) and doctor.installed:
            handler = _Chained(doctor, unwrap(handler))
        return unwrap(real_signal(signalnum, handler))

    def get_handler(signalnum: int) -> Any:
        return unwrap(real_getsignal(signalnum))

    for signum in _WATCHED_SIGNALS:
        set_handler(signum, real_getsignal(signum))
    _replace(doctor, signal, "signal", set_handler)
    _replace(doctor, signal, "getsignal", get_handler)

    def restore() -> None:
        if threading.current_thread() is threading.main_thread():
            for signum in _WATCHED_SIGNALS:
                real_signal(signum, unwrap(real_getsignal(signum)))

    doctor._undo.insert(0, restore)  # runs last, once signal.signal is the real one again


# --- the report ---------------------------------------------------------------------------


def _stack(frame: FrameType) -> str:
    """The stack, outermost call first, without the doctor's, runpy's and Thread's own frames."""
    kept = [
        entry
        for entry in traceback.extract_stack(frame)
        if entry.filename not in (__file__, runpy.__file__, threading.__file__, "<frozen runpy>")
        or entry.name not in _PLUMBING
    ]
    lines = traceback.StackSummary.from_list(kept).format()
    return "".join(textwrap.indent(line, "  ") for line in lines)


# Frames that only carry the program to its code: the CLI and runpy, a thread's bootstrap.
_PLUMBING = frozenset(
    {"main", "<module>", "run_path", "run_module", "_run_module_as_main", "_run_module_code"}
    | {"_run_code", "_bootstrap", "_bootstrap_inner", "run"}
)


def _root(frame: FrameType) -> FrameType:
    while frame.f_back is not None:
        frame = frame.f_back
    return frame


def _is_runner_close(frame: FrameType) -> bool:
    code = frame.f_code
    return code.co_qualname == "Runner.close" and code.co_filename.endswith("runners.py")


def _main_thread_story(doctor: Doctor | None, frame: FrameType) -> str:  # noqa: PLR0911
    """Which step of the exit sequence the main thread is in, from its outermost frame."""
    root = _root(frame)
    names = {f.f_code.co_name for f, _ in traceback.walk_stack(frame)}
    if doctor is not None and not doctor.main_finished:
        if any(_is_runner_close(f) for f, _ in traceback.walk_stack(frame)):
            return "is in asyncio.run, which waits for its default executor's threads"
        return "is still running the program"
    if root.f_code is getattr(threading._shutdown, "__code__", None):  # type: ignore[attr-defined]
        if "_python_exit" in names:
            return (
                "is in threading._shutdown, in concurrent.futures' exit hook, "
                "which joins every executor worker thread"
            )
        return "is in threading._shutdown, which joins every non-daemon thread"
    for f, _ in traceback.walk_stack(frame):
        known = doctor.registered_atexit(f.f_code) if doctor is not None else None
        if known is not None:
            return f"is running the atexit handler {known}"
    if root.f_code.co_name == "_exit_function" and "multiprocessing" in root.f_code.co_filename:
        return (
            "is running multiprocessing's atexit handler, which joins queue feeder threads "
            "and non-daemon child processes"
        )
    if doctor is None:  # no record of whether the main code has finished
        return "is running"
    return f"is running {root.f_code.co_qualname} at exit (an atexit handler or a finalizer)"


def _thread_line(doctor: Doctor | None, thread: threading.Thread, what: str) -> str:
    where = doctor.started_at(thread) if doctor is not None else None
    origin = f"started at {where}" if where else "started before the doctor was installed"
    return f"{what} {thread.name!r} ({origin}):\n"


def _executor_lines(frames: dict[int, FrameType]) -> list[str]:
    """Executors whose worker threads are alive, and what each busy worker runs."""
    module = sys.modules.get("concurrent.futures.thread")
    threads_queues = getattr(module, "_threads_queues", None)
    if threads_queues is None:
        return []
    lines: list[str] = []
    for thread in list(threads_queues):
        if not thread.is_alive() or thread.ident not in frames:
            continue
        running = "idle, waiting for work"
        for f, _ in traceback.walk_stack(frames[thread.ident]):
            if f.f_code.co_name == "run" and "_WorkItem" in f.f_code.co_qualname:
                fn = getattr(f.f_locals.get("self"), "fn", None)
                code = _code_of(fn)
                where = f" ({code.co_filename}:{code.co_firstlineno})" if code else ""
                running = f"running {getattr(fn, '__qualname__', repr(fn))}{where}"
        lines.append(f"executor worker {thread.name!r}: {running}\n")
    return lines


def diagnose(doctor: Doctor | None = None, headline: str = "a report asked for") -> str:
    """The report: the main thread's place in the exit sequence, then what it waits for.

    ``doctor`` (default: the installed one, if any) adds where threads were started and
    which atexit handler runs; without one the report still lists threads and stacks.
    """
    doctor = doctor if doctor is not None else _installed
    frames = sys._current_frames()
    main = threading.main_thread()
    out = [f"exit-doctor: {headline}; what holds the exit:\n"]
    if main.ident in frames:
        story = _main_thread_story(doctor, frames[main.ident])
        out.append(f"main thread {story}:\n{_stack(frames[main.ident])}")
    for thread in threading.enumerate():
        frame = frames.get(thread.ident or -1)
        if thread is main or frame is None:
            continue
        if not thread.daemon:
            out.append(_thread_line(doctor, thread, "non-daemon thread"))
            out.append(_stack(frame))
        elif thread.name == "QueueFeederThread":
            kind = "multiprocessing queue feeder thread (a daemon, but joined at exit)"
            out.append(_thread_line(doctor, thread, kind))
            out.append(_stack(frame))
    out.extend(_executor_lines(frames))
    mp = sys.modules.get("multiprocessing")
    for child in mp.active_children() if mp is not None else []:
        held = "daemon: terminated at exit" if child.daemon else "non-daemon: joined at exit"
        out.append(f"child process {child.name!r} pid {child.pid} ({held})\n")
    for popen, where in doctor.popens() if doctor is not None else []:
        if popen.poll() is None:
            out.append(f"subprocess pid {popen.pid} {popen.args!r} (started at {where})\n")
    return "".join(out)


# --- the command line ---------------------------------------------------------------------


def _program_traceback(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without the doctor's and runpy's frames: the traceback the program would show."""
    while tb is not None and tb.tb_frame.f_code.co_filename in (
        __file__,
        runpy.__file__,
        "<frozen runpy>",
    ):
        tb = tb.tb_next
    return tb


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m patterns.exit_doctor [--after S] [--kill] (script.py | -m module) args...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    split = 0
    while split < len(args) and args[split].startswith("-") and args[split] != "-m":
        split += 2 if args[split] == "--after" else 1
    parser = argparse.ArgumentParser(
        prog="python -m patterns.exit_doctor",
        description="Run a Python program; if it has not exited AFTER seconds after its main "
        "code finished or it got SIGTERM/SIGINT, report what holds the exit.",
    )
    parser.add_argument("--after", type=float, default=5.0, help="seconds (default 5)")
    parser.add_argument(
        "--kill", action="store_true", help=f"after the report, exit with status {KILL_STATUS}"
    )
    options = parser.parse_args(args[:split])
    target = args[split:]
    if not target or (target[0] == "-m" and len(target) < 2):
        parser.error("name a script, or -m and a module")
    if target[0] != "-m" and not os.path.exists(target[0]):
        parser.error(f"can't open file {target[0]!r}: no such file")
    try:
        doctor = install(options.after, kill=options.kill)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        if target[0] == "-m":
            sys.argv = target[1:]
            runpy.run_module(target[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = target
            sys.path[0] = os.path.dirname(os.path.abspath(target[0]))
            runpy.run_path(target[0], run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:  # noqa: BLE001 - shown as the program's own traceback
        program_tb = _program_traceback(exc.__traceback__)  # the hook may read either one
        sys.excepthook(type(exc), exc.with_traceback(program_tb), program_tb)
        raise SystemExit(1) from None
    finally:
        doctor.main_returned()


# --- the lifecycle contract: seconds, a bounded countdown, a report that cannot fail ----------
#
# The seconds family is the same code in every module that holds it, since a module is
# copied alone (tests/test_copies.py).


def _seconds(value: object, name: str, *, allow_none: bool = False) -> float:
    """Seconds >= 0 as a float; ``math.inf`` (or more than a float holds) means never report."""
    if value is None and allow_none:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return math.inf if value > sys.float_info.max else float(value)


def _left(deadline: float) -> float:
    """Seconds until ``deadline`` for the watchdog's wait: never negative, never too long."""
    return min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)


def _write(stream: TextIO | None, text: str) -> None:
    """Write the report; a closed or broken stream must not stop the kill that follows."""
    try:
        if stream is not None:
            stream.write(text)
            stream.flush()
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    main()
