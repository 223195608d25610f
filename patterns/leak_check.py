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
The next test inherits it, the suite slows down or hangs at exit, and the failing test is
never the one that leaked. A ``threading.enumerate()`` diff says *what* is left, not *who*.

Pattern: snapshot what runs before the block (threads, children, pending tasks, open fds),
give what is new one bounded grace period to end, and name each survivor by the first frame
outside the standard library that started it: while a check runs, five start methods
(``Thread.start``, ``Popen.__init__``, the loop's ``create_task`` ...) are wrapped, and each
wrapper walks a few frames with ``sys._getframe`` (no traceback, no source read).

Guarantees:
    * Leaving a `LeakCheck` (``with``, ``async with``, a decorated function) takes at most
      ``grace`` seconds (finite, >= 0) plus scheduling noise: every wait shares one deadline.
    * It raises `LeakError` (an `AssertionError`) naming every thread, child process,
      pending task and fd that appeared in the block and is still there, unless its name
      matches an ``allow`` pattern (`re.search`); if the block raised, it logs them instead.
    * Each leak says where it was started (the first frame outside the standard library
      and this module) when a hook saw the start, else ``unknown``.
    * As a pytest plugin it does nothing unless ``--leak-check`` or ``leak_check = true``
      is set; the module never imports pytest.

Python: 3.11+, standard library only; checked on 3.11.7, 3.12 and 3.13.
Docs: docs/patterns/leak_check.md (the mechanism; its limits: /proc is Linux's, uvloop's
tasks are not seen). See also: ``daemon_threads``, ``process_shutdown``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
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

__all__ = ["Leak", "LeakCheck", "LeakError", "Site", "no_leaks", "start_tracking", "stop_tracking"]

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
        relative = os.path.relpath(self.filename) if os.path.isabs(self.filename) else None
        name = self.filename if relative is None or relative.startswith("..") else relative
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
        self._before = _Snapshot.now()

    def end(self) -> tuple[Leak, ...]:
        """Wait up to ``grace`` for what is new to end; return what is still there."""
        if self._before is None:
            raise RuntimeError("end() before begin()")
        before, self._before = self._before, None
        try:
            return self._leaks(before, time.monotonic() + self.grace)
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
                await asyncio.wait(mine, timeout=_left(deadline))
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
        if leaks and raised:  # never hide the block's own exception behind ours
            logger.warning("%s", format_leaks(leaks, self.grace))
        elif leaks:
            raise LeakError(leaks, self.grace)

    def _allowed(self, name: str) -> bool:
        return any(pattern.search(name) for pattern in self.allow)

    def _leaks(self, before: _Snapshot, deadline: float) -> tuple[Leak, ...]:
        # Threads and children first, on one deadline: they may be what holds the new fds.
        me = threading.current_thread()
        threads = [t for t in threading.enumerate() if t not in before.threads and t is not me]
        threads = [t for t in threads if not self._allowed(t.name)]
        for thread in threads:
            thread.join(_left(deadline))
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
            gc.collect()
            new = new_fds()
        return [
            Leak("fd", name, _SOCKET_SITES.get(fd) if target.startswith("socket:") else None)
            for fd, target in sorted(new.items())
            if not self._allowed(name := f"{fd} -> {target}")
        ]


# --- where things start: five cheap hooks --------------------------------------------------

# (thread -> site), (task -> site): weak, so tracking never keeps a finished thing alive.
_THREAD_SITES: weakref.WeakKeyDictionary[threading.Thread, Site] = weakref.WeakKeyDictionary()
_TASK_SITES: weakref.WeakKeyDictionary[asyncio.Task[Any], Site] = weakref.WeakKeyDictionary()
# pid -> (the Popen or Process object while it lives, its name, site); fd -> site for sockets.
_CHILDREN: dict[int, tuple[weakref.ref[Any], str, Site | None]] = {}
_SOCKET_SITES: dict[int, Site | None] = {}

_PATHS = sysconfig.get_paths()
_STDLIB = tuple(os.path.normcase(_PATHS[key]) + os.sep for key in ("stdlib", "platstdlib"))
_SITE_PACKAGES = tuple(os.path.normcase(_PATHS[key]) + os.sep for key in ("purelib", "platlib"))
_OWN_FILE = os.path.normcase(__file__)
_INTERNAL: dict[str, bool] = {}  # filename -> skipped when naming a start site (a cache)
_MAX_FRAMES = 40
_ORIGINAL: dict[tuple[type, str], Callable[..., Any]] = {}
_TRACKING_LOCK = threading.Lock()  # guards _ORIGINAL and _users: installing and removing hooks
_users = 0
# Children: /proc lists every child of every thread; elsewhere, the ones the hooks saw.
_PROC_TASKS = "/proc/self/task"
_FD_DIRS = ("/proc/self/fd", "/dev/fd")


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


def _thread_start(self: threading.Thread) -> None:
    if (site := _site()) is not None:
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
    if not isinstance(cmd, str | bytes | os.PathLike):  # a sequence of arguments
        cmd = " ".join(
            os.fsdecode(a) if isinstance(a, bytes | os.PathLike) else str(a) for a in cmd
        )
    _CHILDREN[self.pid] = (weakref.ref(self), os.fsdecode(cmd), site)


def _socket_init(self: socket.socket, *args: Any, **kwargs: Any) -> None:
    _ORIGINAL[socket.socket, "__init__"](self, *args, **kwargs)
    _SOCKET_SITES[self.fileno()] = _site()


def _create_task(self: asyncio.BaseEventLoop, *args: Any, **kwargs: Any) -> asyncio.Task[Any]:
    task: asyncio.Task[Any] = _ORIGINAL[asyncio.BaseEventLoop, "create_task"](self, *args, **kwargs)
    if (site := _site()) is not None:
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


# --- snapshots: what runs now ---------------------------------------------------------------


@dataclass(frozen=True)
class _Snapshot:
    threads: frozenset[threading.Thread]
    children: frozenset[int]
    tasks: weakref.WeakSet[asyncio.Task[Any]]  # tracked tasks not done yet
    fds: dict[int, str]

    @classmethod
    def now(cls) -> _Snapshot:
        tasks = weakref.WeakSet(t for t in list(_TASK_SITES) if not t.done())
        return cls(frozenset(threading.enumerate()), frozenset(_children()), tasks, _fds())


def _thread_leak(thread: threading.Thread) -> Leak:
    name = f"{thread.name!r}" + (" (daemon)" if thread.daemon else "")
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None and _internal(frame.f_code.co_filename):
        frame = frame.f_back  # up to the innermost frame of the program's own code
    here = frame and Site(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
    return Leak("thread", name, _THREAD_SITES.get(thread), f"now at {here}" if here else "")


def _new_tasks(before: _Snapshot) -> list[asyncio.Task[Any]]:
    try:
        current = asyncio.current_task()
    except RuntimeError:  # no running loop in this thread
        current = None
    return [t for t in list(_TASK_SITES) if t not in before.tasks and t is not current]


def _task_name(task: asyncio.Task[Any]) -> str:
    coro = task.get_coro()
    what = getattr(coro, "__qualname__", type(coro).__name__)
    return f"{task.get_name()!r} (coroutine {what})"


def _children() -> set[int]:
    pids = set()
    for pid, (ref, _, _) in list(_CHILDREN.items()):
        if _alive_object(ref):
            pids.add(pid)
        else:  # reaped: forget it, so a new child that reuses the pid is not misnamed
            _CHILDREN.pop(pid, None)
    with contextlib.suppress(OSError):  # no /proc: only the children the hooks saw
        for tid in os.listdir(_PROC_TASKS):  # OSError: it ended, or no CONFIG_PROC_CHILDREN
            children = f"{_PROC_TASKS}/{tid}/children"
            with contextlib.suppress(OSError), open(children, encoding="ascii") as file:
                pids.update(int(pid) for pid in file.read().split())
    return {pid for pid in pids if _running(pid)}


def _alive_object(ref: weakref.ref[Any]) -> bool:
    obj = ref()
    if isinstance(obj, subprocess.Popen):
        return obj.poll() is None
    if isinstance(obj, multiprocessing.process.BaseProcess):
        with contextlib.suppress(AssertionError):  # a copy inherited by a fork: not ours to ask
            return obj.is_alive()
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


def _fds() -> dict[int, str]:
    """Open fds and what each points at; the directory's own fd is gone by the readlink."""
    for directory in _FD_DIRS:
        with contextlib.suppress(OSError):  # no such directory: try the next
            names = os.listdir(directory)
            found = {}
            for name in names:
                with contextlib.suppress(OSError, ValueError):
                    found[int(name)] = os.readlink(f"{directory}/{name}")
            return found
    return {}


# --- the pytest plugin: plain hook functions, found by name; pytest is never imported --------
#
# On with `-p patterns.leak_check --leak-check`, or `leak_check = true` in the ini file once
# loaded (installed, it is a `pytest11` entry point named like the module: no clash with -p).
# Per test: @pytest.mark.leak_check(enabled=False) or (allow=[...], grace=...).

_FIXTURE_PLUGIN = "patterns.leak_check:fixture"
_MARKER = "leak_check(enabled=True, allow=(), grace=None): the leak check's settings for a test"


def pytest_addoption(parser: Any) -> None:
    """Add ``--leak-check`` and the ini options ``leak_check``, ``_grace``, ``_allow``."""
    what = "fail a test that leaves a thread, child process, asyncio task or fd running"
    parser.getgroup("leak_check").addoption("--leak-check", action="store_true", help=what)
    parser.addini("leak_check", "turn the leak check on for every test", type="bool")
    parser.addini("leak_check_grace", "seconds a test's leftovers get to end", default="2.0")
    parser.addini("leak_check_allow", "regular expressions of allowed names", type="linelist")


def pytest_configure(config: Any) -> None:
    """Register the marker; when turned on, start tracking and add the autouse fixture."""
    config.addinivalue_line("markers", _MARKER)
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
        own_grace, own_allow = settings.get("grace"), settings.get("allow", ())
        check = LeakCheck(
            grace=grace if own_grace is None else own_grace, allow=(*allow, *own_allow)
        )
        check.begin()
        yield
        # Function-scoped fixtures are torn down, but pytest keeps their values until the
        # teardown is reported: one that frees its fds only when collected (a terminated
        # multiprocessing.Pool) would look leaked. Wider-scoped values stay cached.
        funcargs = getattr(request.node, "funcargs", None)
        if isinstance(funcargs, dict):
            funcargs.clear()
        if leaks := check.end():
            pytest.fail(format_leaks(leaks, check.grace), pytrace=False)

    plugin = ModuleType(_FIXTURE_PLUGIN)
    fixture = pytest.fixture(autouse=True, name="_leak_check")(leak_check_each_test)
    setattr(plugin, "leak_check_each_test", fixture)  # noqa: B010 (a fresh module's attribute)
    return plugin


# --- the lifecycle contract: the grace period's one deadline, bounded waits -----------------


def _left(deadline: float) -> float:
    """What is left of the one deadline: never negative, never more than a wait accepts."""
    return min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)


def _wait_child(pid: int, deadline: float) -> None:
    """Wait until ``deadline`` for the child to end, through its owner's object if known."""
    entry = _CHILDREN.get(pid)
    obj = entry[0]() if entry else None
    if isinstance(obj, subprocess.Popen):
        with contextlib.suppress(subprocess.TimeoutExpired):
            obj.wait(_left(deadline))
    elif isinstance(obj, multiprocessing.process.BaseProcess):
        obj.join(_left(deadline))
    elif hasattr(os, "pidfd_open"):  # not ours to reap: wait until it exits, no more
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return
        try:
            select.select([fd], [], [], _left(deadline))
        finally:
            os.close(fd)


def _stdlib_helpers() -> tuple[set[int], set[int]]:
    """Pids and fds of multiprocessing's resource tracker and forkserver: not a leak."""
    # They live until exit, not the leak of the call that started them; private singletons.
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
