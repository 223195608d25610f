# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""A leak check for tests: fail a block that leaves a thread, process, task or fd running.

TL;DR::

    with no_leaks():                 # or @no_leaks() on a test, or `async with no_leaks():`
        run_the_code_under_test()    # LeakError if a thread, child process, asyncio task or
                                     # fd it started is still there after a 2 s grace
    # pytest, one line: addopts = "-p patterns.leak_check --leak-check"

Pitfall: a test passes while the thread, child process or socket it started keeps running.
The next test inherits it, the suite slows down or hangs at exit, and the test that failed
is never the one that leaked. A plain ``threading.enumerate()`` diff says *what* is left,
not *who* started it.

Pattern: snapshot what runs before the block (threads, children, pending tasks, open fds),
give what is new one bounded grace period to end, and name each survivor by the first frame
outside the standard library that started it. While a check runs, ``Thread.start``,
``BaseProcess.start``, ``Popen.__init__``, ``socket.__init__`` and
``BaseEventLoop.create_task`` are wrapped; each wrapper walks a few frames with
``sys._getframe`` (no traceback, no source read) and keeps ``(file, line, function)`` in a
weak mapping. For tasks the loop's ``create_task`` is the hook: ``asyncio.create_task``,
``ensure_future`` and ``TaskGroup.create_task`` all call it, while ``asyncio.Task`` is a C
type that cannot be patched and a task factory would have to be set on every loop.

Guarantees:
    * Leaving a `LeakCheck` (``with``, ``async with``, or the decorated function) takes at
      most ``grace`` seconds plus scheduling noise: every wait shares one deadline and none
      is unbounded. ``grace`` must be a finite number of seconds >= 0.
    * It raises `LeakError` (an `AssertionError`) naming every thread, child process,
      pending asyncio task and file descriptor that appeared in the block and is still
      there, unless its name matches an ``allow`` pattern (`re.search`). When the block
      itself raised, the leaks are logged at WARNING and the block's exception propagates.
    * Each leak says where it was started (file, line, function of the first frame outside
      the standard library and this module) when a hook saw the start; fds other than
      sockets, and things started before tracking began, say ``unknown``.
    * As a pytest plugin it does nothing unless ``--leak-check`` or ``leak_check = true``
      is set; the module never imports pytest.

Python: 3.11+, standard library only; checked on 3.11.7, 3.12 and 3.13.

Docs: docs/patterns/leak_check.md (the mechanism, its limits: /proc is Linux's, uvloop's
tasks are not seen; its cost on this project's suite).
See also: ``daemon_threads`` and ``process_shutdown`` for stopping what this check finds.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import math
import multiprocessing.process
import os
import re
import select
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import FrameType, ModuleType, TracebackType
from typing import Any, NamedTuple, ParamSpec, Self, TypeVar

__all__ = [
    "Leak",
    "LeakCheck",
    "LeakError",
    "Site",
    "no_leaks",
    "start_tracking",
    "stop_tracking",
]

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

DEFAULT_GRACE = 2.0


class Site(NamedTuple):
    """Where something was started: the first frame outside the stdlib and this module."""

    filename: str
    lineno: int
    function: str

    def __str__(self) -> str:
        name = self.filename
        relative = os.path.relpath(name) if os.path.isabs(name) else name
        if not relative.startswith(".."):
            name = relative
        return f"{name}:{self.lineno} in {self.function}"


@dataclass(frozen=True)
class Leak:
    """One thing still running after the block and its grace period.

    Attributes:
        kind: ``"thread"``, ``"process"``, ``"task"`` or ``"fd"``.
        name: what the thing is called: the thread's name, the child's name or command
            line, the task's name and coroutine, ``"7 -> socket:[1234]"`` for an fd.
        started_at: where it was started, or None when no hook saw the start.
        detail: more to read, such as where a thread is now.
    """

    kind: str
    name: str
    started_at: Site | None
    detail: str = ""

    def __str__(self) -> str:
        where = self.started_at or "unknown (not seen by a start hook)"
        verb = "opened" if self.kind == "fd" else "started"
        text = f"{self.kind:<7} {self.name}  {verb} at {where}"
        return f"{text}; {self.detail}" if self.detail else text


class LeakError(AssertionError):
    """What a block left running, as one message that lists every leak."""

    def __init__(self, leaks: Iterable[Leak], grace: float = DEFAULT_GRACE) -> None:
        self.leaks = tuple(leaks)
        super().__init__(format_leaks(self.leaks, grace))


def format_leaks(leaks: Iterable[Leak], grace: float) -> str:
    """One block: a heading line, then one line per leak."""
    lines = [str(leak) for leak in leaks]
    head = f"{len(lines)} left running after the block and a {grace:g} s grace period:"
    return "\n".join([head, *(f"  {line}" for line in lines)])


# --- where things start: five cheap hooks --------------------------------------------------

# (thread -> site), (task -> site): weak, so tracking never keeps a finished thing alive.
_THREAD_SITES: weakref.WeakKeyDictionary[threading.Thread, Site] = weakref.WeakKeyDictionary()
_TASK_SITES: weakref.WeakKeyDictionary[asyncio.Task[Any], Site] = weakref.WeakKeyDictionary()
# pid -> (the Popen or Process object while it lives, its name, site); fd -> site for sockets.
_CHILDREN: dict[int, tuple[weakref.ref[Any], str, Site | None]] = {}
_SOCKET_SITES: dict[int, Site | None] = {}

_STDLIB = tuple(
    os.path.normcase(sysconfig.get_paths()[key]) + os.sep for key in ("stdlib", "platstdlib")
)
_SITE_PACKAGES = tuple(
    os.path.normcase(sysconfig.get_paths()[key]) + os.sep for key in ("purelib", "platlib")
)
_OWN_FILE = os.path.normcase(__file__)
_INTERNAL: dict[str, bool] = {}  # filename -> skipped when naming a start site (a cache)
_MAX_FRAMES = 40


def _internal(filename: str) -> bool:
    known = _INTERNAL.get(filename)
    if known is None:
        name = os.path.normcase(filename)
        stdlib = name.startswith(_STDLIB) and not name.startswith(_SITE_PACKAGES)
        stdlib = stdlib and "site-packages" not in name and "dist-packages" not in name
        known = _INTERNAL[filename] = stdlib or name == _OWN_FILE or name.startswith("<frozen ")
    return known


def _site(skip: int = 2) -> Site | None:
    """The first caller outside the stdlib and this module, ``skip`` frames up; cheap."""
    frame: FrameType | None = sys._getframe(skip)  # cheaper than inspect.stack()
    for _ in range(_MAX_FRAMES):
        if frame is None:
            return None
        code = frame.f_code
        if not _internal(code.co_filename):
            return Site(code.co_filename, frame.f_lineno, code.co_name)
        frame = frame.f_back
    return None


_ORIGINAL: dict[tuple[type, str], Callable[..., Any]] = {}
_TRACKING_LOCK = threading.Lock()  # guards _ORIGINAL and _users: installing and removing hooks
_users = 0


def _thread_start(self: threading.Thread) -> None:
    site = _site()
    if site is not None:
        _THREAD_SITES[self] = site
    _ORIGINAL[threading.Thread, "start"](self)


def _process_start(self: multiprocessing.process.BaseProcess) -> None:
    site = _site()
    _ORIGINAL[multiprocessing.process.BaseProcess, "start"](self)
    if self.pid is not None:
        _CHILDREN[self.pid] = (weakref.ref(self), self.name, site)


def _popen_init(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
    site = _site()
    _ORIGINAL[subprocess.Popen, "__init__"](self, *args, **kwargs)
    cmd = self.args
    command = os.fsdecode(cmd) if isinstance(cmd, str | bytes | os.PathLike) else _join(cmd)
    _CHILDREN[self.pid] = (weakref.ref(self), command, site)


def _socket_init(self: socket.socket, *args: Any, **kwargs: Any) -> None:
    _ORIGINAL[socket.socket, "__init__"](self, *args, **kwargs)
    _SOCKET_SITES[self.fileno()] = _site()


def _create_task(self: asyncio.BaseEventLoop, *args: Any, **kwargs: Any) -> asyncio.Task[Any]:
    task: asyncio.Task[Any] = _ORIGINAL[asyncio.BaseEventLoop, "create_task"](self, *args, **kwargs)
    site = _site()
    if site is not None:
        _TASK_SITES[task] = site
    return task


_HOOKS: tuple[tuple[type, str, Callable[..., Any]], ...] = (
    (threading.Thread, "start", _thread_start),
    (multiprocessing.process.BaseProcess, "start", _process_start),
    (subprocess.Popen, "__init__", _popen_init),
    (socket.socket, "__init__", _socket_init),
    (asyncio.BaseEventLoop, "create_task", _create_task),
)
for _cls, _attr, _hook in _HOOKS:  # each hook reads as the method it wraps
    functools.update_wrapper(_hook, getattr(_cls, _attr))


def start_tracking() -> None:
    """Install the start hooks (counted: each call needs its own `stop_tracking`)."""
    global _users  # noqa: PLW0603 (one process-wide count, under the lock)
    with _TRACKING_LOCK:
        _users += 1
        if _users > 1:
            return
        for cls, attr, hook in _HOOKS:
            _ORIGINAL[cls, attr] = getattr(cls, attr)
            setattr(cls, attr, hook)


def stop_tracking() -> None:
    """Remove the start hooks once the last user has stopped; what was recorded stays."""
    global _users  # noqa: PLW0603
    with _TRACKING_LOCK:
        if _users == 0:
            return
        _users -= 1
        if _users:
            return
        for cls, attr, hook in _HOOKS:
            if cls.__dict__.get(attr) is hook:
                setattr(cls, attr, _ORIGINAL.pop((cls, attr)))
            else:  # someone patched over ours: leave theirs, which may call ours
                logger.warning("leak_check: %s.%s was replaced; hook left", cls.__name__, attr)


# --- the check ------------------------------------------------------------------------------


def no_leaks(*, grace: float = DEFAULT_GRACE, allow: Iterable[str] = ()) -> LeakCheck:
    """A `LeakCheck`: use it as ``with``, ``async with`` or a decorator."""
    return LeakCheck(grace=grace, allow=allow)


class LeakCheck:
    """Fails a block that leaves threads, child processes, tasks or fds behind.

    Args:
        grace: seconds, shared by everything new, to end after the block (finite, >= 0).
        allow: regular expressions; a leak whose name matches one (`re.search`) is allowed.
    """

    def __init__(self, *, grace: float = DEFAULT_GRACE, allow: Iterable[str] = ()) -> None:
        if isinstance(grace, bool) or not isinstance(grace, int | float) or not grace >= 0:
            raise ValueError(f"grace must be a finite number of seconds >= 0, not {grace!r}")
        if math.isinf(grace):
            raise ValueError("grace must be finite: the check never waits forever")
        self.grace = float(grace)
        self.allow = tuple(re.compile(pattern) for pattern in allow)
        self._before: _Snapshot | None = None

    def begin(self) -> None:
        """Start tracking and remember what runs now."""
        start_tracking()
        self._before = _snapshot()

    def end(self) -> tuple[Leak, ...]:
        """Wait up to ``grace`` for what is new to end; return what is still there."""
        if self._before is None:
            raise RuntimeError("end() before begin()")
        before, self._before = self._before, None
        try:
            deadline = time.monotonic() + self.grace
            return self._leaks(before, deadline)
        finally:
            stop_tracking()

    def __enter__(self) -> Self:
        self.begin()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._report(self.end(), raised=exc is not None)

    async def __aenter__(self) -> Self:
        self.begin()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._before is None:
            raise RuntimeError("__aexit__ before __aenter__")
        before, self._before = self._before, None
        try:
            deadline = time.monotonic() + self.grace
            mine = [t for t in _new_tasks(before) if t.get_loop() is asyncio.get_running_loop()]
            if mine:  # these need this loop to end: wait for them without blocking it
                await asyncio.wait(mine, timeout=max(0.0, deadline - time.monotonic()))
            leaks = self._leaks(before, deadline)
        finally:
            stop_tracking()
        self._report(leaks, raised=exc is not None)

    def __call__(self, func: Callable[P, T]) -> Callable[P, T]:
        """Check each call of ``func`` (a coroutine function is checked around its await)."""
        grace, allow = self.grace, [p.pattern for p in self.allow]
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def checked_async(*args: P.args, **kwargs: P.kwargs) -> Any:
                async with LeakCheck(grace=grace, allow=allow):
                    return await func(*args, **kwargs)

            return checked_async  # type: ignore[return-value]

        @functools.wraps(func)
        def checked(*args: P.args, **kwargs: P.kwargs) -> T:
            with LeakCheck(grace=grace, allow=allow):
                return func(*args, **kwargs)

        return checked

    def _report(self, leaks: tuple[Leak, ...], *, raised: bool) -> None:
        if not leaks:
            return
        if raised:  # never hide the block's own exception behind ours
            logger.warning("%s", format_leaks(leaks, self.grace))
            return
        raise LeakError(leaks, self.grace)

    def _allowed(self, name: str) -> bool:
        return any(pattern.search(name) for pattern in self.allow)

    def _leaks(self, before: _Snapshot, deadline: float) -> tuple[Leak, ...]:
        # Threads and children first, on one deadline: they may be what holds the new fds.
        me = threading.current_thread()
        threads = [
            t
            for t in threading.enumerate()
            if t not in before.threads and t is not me and not self._allowed(t.name)
        ]
        for thread in threads:
            thread.join(_seconds_left(deadline))
        helper_pids, helper_fds = _stdlib_helpers()
        children = [_child(pid) for pid in _children() - before.children - helper_pids]
        children = [child for child in children if not self._allowed(child[1])]
        for pid, _, _ in children:
            _wait_child(pid, deadline)
        leaks = [_thread_leak(t) for t in threads if t.is_alive()]
        leaks += [
            Leak("process", f"{name} (pid {pid})", site)
            for pid, name, site in children
            if _running(pid)
        ]
        leaks += [
            Leak("task", name, _TASK_SITES.get(task))
            for task in _new_tasks(before)
            if not task.done() and not self._allowed(name := _task_name(task))
        ]
        leaks += self._fd_leaks(before.fds, helper_fds)
        return tuple(leaks)

    def _fd_leaks(self, before: dict[int, str], helper_fds: set[int]) -> list[Leak]:
        def new_fds() -> dict[int, str]:
            found = _fds().items()
            return {fd: to for fd, to in found if before.get(fd) != to and fd not in helper_fds}

        new = new_fds()
        if new:  # an object that only the garbage collector would close is Python's to warn about
            import gc  # noqa: PLC0415 (needed only when something looks leaked)

            gc.collect()
            new = new_fds()
        return [
            Leak("fd", name, _SOCKET_SITES.get(fd) if target.startswith("socket:") else None)
            for fd, target in sorted(new.items())
            if not self._allowed(name := f"{fd} -> {target}")
        ]


# --- snapshots: what runs now ---------------------------------------------------------------


@dataclass(frozen=True)
class _Snapshot:
    threads: frozenset[threading.Thread]
    children: frozenset[int]
    tasks: weakref.WeakSet[asyncio.Task[Any]]  # tracked tasks not done yet
    fds: dict[int, str]


def _snapshot() -> _Snapshot:
    return _Snapshot(
        frozenset(threading.enumerate()),
        frozenset(_children()),
        weakref.WeakSet(t for t in list(_TASK_SITES) if not t.done()),
        _fds(),
    )


def _seconds_left(deadline: float) -> float:
    return min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)


def _stdlib_helpers() -> tuple[set[int], set[int]]:
    """Pids and fds of multiprocessing's resource tracker and forkserver, if started.

    Started by the first call that needs them, they live until exit: not that call's leak.
    Read from their modules' singletons (private names, looked up defensively).
    """
    pids: set[int] = set()
    fds: set[int] = set()
    for module, singleton, pid_name, fd_name in (
        ("multiprocessing.resource_tracker", "_resource_tracker", "_pid", "_fd"),
        ("multiprocessing.forkserver", "_forkserver", "_forkserver_pid", "_forkserver_alive_fd"),
    ):
        helper = getattr(sys.modules.get(module), singleton, None)
        pid, fd = getattr(helper, pid_name, None), getattr(helper, fd_name, None)
        if isinstance(pid, int):
            pids.add(pid)
        if isinstance(fd, int):
            fds.add(fd)
    return pids, fds


def _thread_leak(thread: threading.Thread) -> Leak:
    name = f"{thread.name!r}" + (" (daemon)" if thread.daemon else "")
    frame = sys._current_frames().get(thread.ident or -1)
    now = ""
    while frame is not None:  # the innermost frame of the program's own code
        if not _internal(frame.f_code.co_filename):
            code = frame.f_code
            now = f"now at {Site(code.co_filename, frame.f_lineno, code.co_name)}"
            break
        frame = frame.f_back
    return Leak("thread", name, _THREAD_SITES.get(thread), now)


def _new_tasks(before: _Snapshot) -> list[asyncio.Task[Any]]:
    current = _current_task()
    return [t for t in list(_TASK_SITES) if t not in before.tasks and t is not current]


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop in this thread
        return None


def _task_name(task: asyncio.Task[Any]) -> str:
    coro = task.get_coro()
    what = getattr(coro, "__qualname__", type(coro).__name__)
    return f"{task.get_name()!r} (coroutine {what})"


# Children: /proc lists every child of every thread; elsewhere, the ones the hooks saw.
_PROC_TASKS = "/proc/self/task"


def _children() -> set[int]:
    pids = set()
    for pid, (ref, _, _) in list(_CHILDREN.items()):
        if _alive_object(ref):
            pids.add(pid)
        else:  # reaped: forget it, so a new child that reuses the pid is not misnamed
            _CHILDREN.pop(pid, None)
    try:
        tids = os.listdir(_PROC_TASKS)
    except OSError:
        return pids
    for tid in tids:
        try:
            with open(f"{_PROC_TASKS}/{tid}/children", encoding="ascii") as file:
                pids.update(int(pid) for pid in file.read().split())
        except OSError:  # the thread ended meanwhile, or no CONFIG_PROC_CHILDREN
            continue
    return {pid for pid in pids if _running(pid)}


def _alive_object(ref: weakref.ref[Any]) -> bool:
    obj = ref()
    if isinstance(obj, subprocess.Popen):
        return obj.poll() is None
    if isinstance(obj, multiprocessing.process.BaseProcess):
        try:
            return obj.is_alive()
        except AssertionError:  # a copy inherited by a forked child: not ours to ask
            return False
    return False


def _running(pid: int) -> bool:
    entry = _CHILDREN.get(pid)
    if entry is not None and entry[0]() is not None:
        return _alive_object(entry[0])
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as file:
            state = file.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in {"Z", "X"}  # a zombie has ended; its owner has yet to reap it


def _child(pid: int) -> tuple[int, str, Site | None]:
    """(pid, name, start site): a child no hook saw is named by its command line."""
    entry = _CHILDREN.get(pid)
    if entry is not None:
        return pid, entry[1], entry[2]
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return pid, file.read().replace(b"\0", b" ").decode(errors="replace").strip(), None
    except OSError:
        return pid, "?", None


def _wait_child(pid: int, deadline: float) -> None:
    """Wait until ``deadline`` for the child to end, through its owner's object if known."""
    entry = _CHILDREN.get(pid)
    obj = entry[0]() if entry else None
    if isinstance(obj, subprocess.Popen):
        with contextlib.suppress(subprocess.TimeoutExpired):
            obj.wait(_seconds_left(deadline))
    elif isinstance(obj, multiprocessing.process.BaseProcess):
        obj.join(_seconds_left(deadline))
    elif hasattr(os, "pidfd_open"):  # not ours to reap: wait until it exits, no more
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return
        try:
            select.select([fd], [], [], _seconds_left(deadline))
        finally:
            os.close(fd)


_FD_DIRS = ("/proc/self/fd", "/dev/fd")


def _fds() -> dict[int, str]:
    """Open fds and what each points at; the directory's own fd is gone by the readlink."""
    for directory in _FD_DIRS:
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        found = {}
        for name in names:
            try:
                found[int(name)] = os.readlink(f"{directory}/{name}")
            except (OSError, ValueError):
                continue
        return found
    return {}


def _join(args: Iterable[Any]) -> str:
    return " ".join(os.fsdecode(a) if isinstance(a, bytes | os.PathLike) else str(a) for a in args)


# --- the pytest plugin: plain hook functions, found by name; pytest is never imported --------
#
# Turn it on with `-p patterns.leak_check --leak-check`, or `leak_check = true` in the ini
# file when the plugin is loaded (installed, this project registers it as a `pytest11` entry
# point named like the module, so `-p patterns.leak_check` and the entry point never clash).
# Per test: @pytest.mark.leak_check(enabled=False) or (allow=[...], grace=...).

_FIXTURE_PLUGIN = "patterns.leak_check:fixture"


def pytest_addoption(parser: Any) -> None:
    """Add ``--leak-check`` and the ini options ``leak_check``, ``_grace``, ``_allow``."""
    parser.getgroup("leak_check").addoption(
        "--leak-check",
        action="store_true",
        help="fail a test that leaves a thread, child process, asyncio task or fd running",
    )
    parser.addini("leak_check", "turn the leak check on for every test", type="bool")
    parser.addini("leak_check_grace", "seconds a test's leftovers get to end", default="2.0")
    parser.addini("leak_check_allow", "regular expressions of allowed names", type="linelist")


def pytest_configure(config: Any) -> None:
    """Register the marker; when turned on, start tracking and add the autouse fixture."""
    config.addinivalue_line(
        "markers",
        "leak_check(enabled=True, allow=(), grace=None): the leak check's settings for a test",
    )
    if not (config.getoption("leak_check") or config.getini("leak_check")):
        return
    grace = float(config.getini("leak_check_grace"))
    allow = tuple(config.getini("leak_check_allow"))
    LeakCheck(grace=grace, allow=allow)  # a bad setting is an error now, not in every test
    start_tracking()
    config.pluginmanager.register(_fixture_plugin(grace, allow), _FIXTURE_PLUGIN)


def pytest_unconfigure(config: Any) -> None:
    """Remove the hooks this run installed."""
    if config.pluginmanager.get_plugin(_FIXTURE_PLUGIN) is not None:
        stop_tracking()


def _fixture_plugin(grace: float, allow: tuple[str, ...]) -> ModuleType:
    # An autouse fixture rather than hooks: higher-scoped fixtures are set up before it and
    # torn down after it, so what a session fixture runs is not the first test's leak.
    pytest: Any = sys.modules["pytest"]  # the pytest that is calling us, already imported

    def leak_check_each_test(request: Any) -> Iterator[None]:
        marker = request.node.get_closest_marker("leak_check")
        settings = dict(marker.kwargs) if marker else {}
        if not settings.get("enabled", True):
            yield
            return
        own_grace = settings.get("grace")
        check = LeakCheck(
            grace=grace if own_grace is None else own_grace,
            allow=(*allow, *settings.get("allow", ())),
        )
        check.begin()
        yield
        # Every function-scoped fixture is torn down by now, but pytest keeps their values in
        # the item until its teardown is reported: an object that frees its fds only when it
        # is collected (a terminated multiprocessing.Pool) would look leaked. Drop them here;
        # pytest drops them right after this anyway, and wider-scoped values stay cached.
        funcargs = getattr(request.node, "funcargs", None)
        if isinstance(funcargs, dict):
            funcargs.clear()
        leaks = check.end()
        if leaks:
            pytest.fail(format_leaks(leaks, check.grace), pytrace=False)

    plugin = ModuleType(_FIXTURE_PLUGIN)
    fixture = pytest.fixture(autouse=True, name="_leak_check")(leak_check_each_test)
    setattr(plugin, "leak_check_each_test", fixture)  # noqa: B010 (a fresh module's attribute)
    return plugin
