# SPDX-License-Identifier: MIT
# From shutdown-patterns, a reference for stopping concurrent Python programs correctly.
# For CPython 3.11, 3.12 and 3.13. Copy this file alone: it needs only the standard library.
"""Stop on SIGTERM or Ctrl-C the orderly way: drain, clean up, exit; a second signal exits now.

TL;DR: ``with SignalHandlers(stop.set):`` (or ``install_signal_handlers(stop.set)``, started
for you) turns the first SIGTERM or SIGINT into one call of ``on_stop`` in a thread of its
own. `run_until_signalled` is the whole shape of a worker process: run, drain within a
budget, clean up.

Guarantees:
    * Once `SignalHandlers.start` returns, the first of its signals calls ``on_stop``
      exactly once, promptly, in a thread that is not the main thread, even while the
      main thread is blocked in ``Event.wait()``. A second signal ends the process with
      status ``128 + signum`` within ``FORCE_FLUSH_TIMEOUT`` (0.5 s), whatever threads do.
    * ``start()`` is all or nothing. After ``stop()`` every handled signal has exactly the
      handler it had before, and the wakeup fd is what it was, even if a handler put back
      raises on the way (re-raised afterwards); ``stop()`` waits at most ``stop_timeout``
      and its report stays true after a Ctrl-C interrupted an earlier ``stop()``.
    * ``sys.exit(code)`` in ``on_stop`` ends the program with ``code``; any other exception
      from it is logged. A child forked while started gets the handlers it had before.

Python:
    3.11+, POSIX (the wakeup fd is a pipe); checked on 3.11.7, 3.12.1 and 3.13.0. 3.12.1
    refuses threads in `atexit` handlers (:gh:`104690`, fixed in 3.12.3 by :gh:`113964`), so
    there `force_exit` exits without its flush. An asyncio loop's ``add_signal_handler``
    takes the wakeup fd, so ``start()`` refuses to run while one is set.

Docs: docs/patterns/signal_handlers.md; what runs at exit, and why, is in exit_hooks.py.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import FrameType
from typing import Any, NoReturn, Self

__all__ = [
    "DEFAULT_SIGNALS",
    "DEFAULT_STOP_TIMEOUT",
    "FORCE_FLUSH_TIMEOUT",
    "SignalHandlers",
    "SignalHandlersReport",
    "force_exit",
    "install_signal_handlers",
    "run_until_signalled",
]

logger = logging.getLogger(__name__)

#: The signals a service stops on, SIGTERM (``kill``, Docker, systemd, Kubernetes) and SIGINT.
DEFAULT_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)

#: Seconds `SignalHandlers.stop` waits, in all, for its helper threads (a slow ``on_stop``).
DEFAULT_STOP_TIMEOUT = 1.0

#: Seconds `force_exit` spends flushing logging and stdio before it calls `os._exit`.
FORCE_FLUSH_TIMEOUT = 0.5

_CLOSE = 0  # the byte stop() writes to the pipe to end the dispatcher; no signal is 0

_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


@dataclass(frozen=True)
class SignalHandlersReport:
    """What `SignalHandlers.stop` left behind."""

    terminated: bool  # the dispatcher and on_stop's thread ended within the budget
    still_running: tuple[str, ...]  # the names of those that had not
    first_signal: signal.Signals | None  # the signal that called on_stop, if one came

    def __post_init__(self) -> None:
        if self.terminated and self.still_running:
            raise ValueError(
                f"a report cannot say terminated=True with still_running={self.still_running}"
            )


def _wake_only(signum: int, frame: FrameType | None) -> None:
    """The Python-level handler: the C-level one has already written ``signum`` to the pipe.

    It only keeps the signal's default action (die, or raise `KeyboardInterrupt`) from
    happening, and takes no lock, so it cannot deadlock on one the main thread holds (E1).
    Its one act: raising the `SystemExit` an ``on_stop`` handed to the main thread.
    """
    handlers = _installed  # runs in the main thread, the only one that takes the exit
    if handlers is not None and handlers._exit is not None:
        exit_, handlers._exit = handlers._exit, None
        raise exit_


class SignalHandlers:
    """Stop on the first of ``signals``, exit on the second; ``stop()`` puts back what was there.

    ``with`` starts a handle never started and enters a running one as it is. A `SystemExit`
    from ``on_stop`` would end only its thread, silently (P8): it is logged and raised in the
    main thread instead, by one of our signals sent there (or by ``stop()``, once begun).
    """

    def __init__(
        self,
        on_stop: Callable[[], object],
        signals: Iterable[int] = DEFAULT_SIGNALS,
        *,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
    ) -> None:
        try:
            self._signals = tuple(dict.fromkeys(signal.Signals(s) for s in signals))
        except ValueError as exc:
            raise ValueError(f"signals: {exc}") from None
        if not self._signals:
            raise ValueError("signals must name at least one signal")
        self.stop_timeout = _seconds(stop_timeout, "stop_timeout")
        self._on_stop = on_stop
        # Guards the state below; never held while anything waits or on_stop runs. Reentrant:
        # a stop() from a signal handler that interrupted its holder must not wait (E1, R4).
        self._lock = threading.RLock()
        self._started = False
        self._closed = False  # set by stop() or a failed start(): no signal is acted on after
        self._received: list[signal.Signals] = []
        self._exit: SystemExit | None = None  # on_stop's, for the main thread to raise
        self._self_signals = 0  # signals sent to main for it: not a second signal
        # Each thread sets its own "ended" event as it ends: the truth even after a join() that
        # a Ctrl-C interrupted (gh-90882 marks a live thread finished on 3.11/3.12).
        self._dispatcher: threading.Thread | None = None
        self._on_stop_thread: threading.Thread | None = None
        self._dispatcher_ended, self._on_stop_ended = threading.Event(), threading.Event()
        self._stopper: int | None = None  # the ident of the thread inside stop()
        self._report: SignalHandlersReport | None = None
        self._stop_done = threading.Event()  # set once _report is recorded
        self._previous: dict[signal.Signals, _Handler] = {}  # replaced by us, not yet put back
        self._wakeup_fd = -1  # the pipe's write end while it is the wakeup fd
        self._pipe: tuple[int, ...] = ()  # closed by the last of stop() and the dispatcher
        self._to_close = False  # the dispatcher reads the pipe until stop() writes _CLOSE

    @property
    def signals(self) -> tuple[signal.Signals, ...]:
        """The signals these handlers react to."""
        return self._signals

    @property
    def first_signal(self) -> signal.Signals | None:
        """The signal that asked to stop, or None if none has arrived yet."""
        with self._lock:
            return self._received[0] if self._received else None

    @property
    def stopped(self) -> bool:
        """Whether `stop` has been called (or `start` failed)."""
        with self._lock:
            return self._closed

    def start(self) -> Self:
        """Take the wakeup fd, install the handlers, start the dispatcher; all or nothing.

        `RuntimeError` outside the main thread, when called twice or after `stop`, or when a
        wakeup fd is already set; `ValueError` for a handler installed outside Python.
        """
        _require_main_thread("SignalHandlers.start()")
        with self._lock:
            if self._started or self._closed:
                raise RuntimeError("SignalHandlers.start() can be called once, before stop()")
            self._started = True
        try:
            self._install()
        except BaseException as exc:
            with self._lock:
                self._closed = True  # a signal already in the pipe must not call on_stop now
            failure = _restore_all(self, _deadline(self.stop_timeout))
            if failure is not None:
                raise failure from exc
            raise
        return self

    def stop(self, timeout: float | None = None) -> SignalHandlersReport:
        """Put back the previous handlers and wakeup fd; wait at most ``timeout`` for the threads.

        None means ``stop_timeout``. Only the main thread stops a started handle: from its own
        threads or a signal handler, this is a request answered at once (``terminated=False``);
        from another thread it waits for the main thread's ``stop()``, or raises `RuntimeError`.
        """
        budget = self.stop_timeout if timeout is None else _seconds(timeout, "timeout")
        report = _unless_this_call_stops(self, budget)  # the stopper hand-off
        if report is not None:
            return report
        try:
            return self._stop(budget)
        finally:
            with self._lock:
                self._stopper = None

    def _stop(self, budget: float) -> SignalHandlersReport:
        deadline = _deadline(budget)
        with self._lock:
            self._closed = True  # from now on no signal is acted on
            on_stop_thread = self._on_stop_thread
        failure = _restore_all(self, deadline)  # handlers, wakeup fd, dispatcher, pipe
        if on_stop_thread is not None and not _wait(self._on_stop_ended, deadline):
            logger.warning("on_stop is still running %.3gs after stop()", budget)
        with self._lock:
            if self._report is None:
                self._report = _report_now(self, final=True)
                self._stop_done.set()
            report = self._report
        # on_stop's SystemExit that no signal carried to main yet: only a started handle has
        # one, and only the main thread stops a started handle.
        exit_, self._exit = self._exit, None
        if exit_ is not None:  # the exit on_stop asked for wins over a Ctrl-C met on the way
            raise exit_ from failure
        if failure is not None:
            raise failure
        return report

    def __enter__(self) -> Self:
        """Start if never started; a running object is returned as is (``with x.start():``)."""
        with self._lock:
            running = self._started and not self._closed
        return self if running else self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def on_signal(self, signum: int) -> None:
        """Act on one signal; the dispatcher thread calls it for each signal it reads.

        The first of ours runs ``on_stop`` in a thread of its own, the second exits at once
        (`force_exit`); others are ignored. A subclass may override it to answer more signals
        (call ``super().on_signal(signum)`` for the rest); it must not block, or the second
        signal goes unread.
        """
        with self._lock:
            # Every signal with a Python-level handler writes to the wakeup fd (pytest's
            # SIGALRM, say), so only ours count, and none after close() has started.
            if self._closed or signum not in self._signals:
                return
            if self._self_signals:  # _run_on_stop's, carrying its SystemExit: not a second signal
                self._self_signals -= 1
                return
            signum = signal.Signals(signum)
            self._received.append(signum)
            count = len(self._received)
            run_here = False
            if count == 1:
                # on_stop may block: the dispatcher must stay free for the second signal.
                thread = threading.Thread(
                    target=self._run_on_stop, args=(signum,), name="on-stop", daemon=True
                )
                try:
                    thread.start()
                    self._on_stop_thread = thread
                except RuntimeError:  # no thread to be had: a resource limit, or shutdown
                    run_here = True
        if run_here:
            logger.warning("could not start a thread for on_stop; running it in the dispatcher")
            self._run_on_stop(signum)
        if count == 2:
            force_exit(128 + signum, f"second signal ({signum.name}) while stopping")

    def _run_on_stop(self, signum: signal.Signals) -> None:
        logger.warning("%s received: stopping (send it again to exit at once)", signum.name)
        try:
            self._on_stop()
        except SystemExit as exc:
            # sys.exit() in a thread other than main ends only that thread, silently (P8).
            logger.error(
                "on_stop raised SystemExit(%r) in thread %s; passing it to the main thread",
                exc.code,
                threading.current_thread().name,
                exc_info=True,
            )
            # One of our signals makes _wake_only raise it in the main thread, even in
            # Event.wait(); sent under the lock, so before stop() marks us closed and puts
            # the previous handler back. Once closed, stop() raises it when done.
            with self._lock:
                self._exit = exc
                main = threading.main_thread().ident
                if not self._closed and main is not None:
                    self._self_signals += 1
                    signal.pthread_kill(main, signum)
        except BaseException:
            logger.exception("on_stop failed; a second signal still forces the exit")
        finally:
            self._on_stop_ended.set()

    def _dispatch(self, read_fd: int) -> None:
        """Read signal numbers until stop() writes _CLOSE; close the pipe if stop() is done."""
        try:
            while True:
                for signum in os.read(read_fd, 64):
                    if signum == _CLOSE:
                        return
                    self.on_signal(signum)
        finally:
            self._dispatcher_ended.set()
            _close_pipe_once_unused(self)

    def _install(self) -> None:
        global _installed  # noqa: PLW0603 - the one handle the fork hooks must know about
        foreign = [s.name for s in self._signals if signal.getsignal(s) is None]
        if foreign:
            raise ValueError(
                f"{', '.join(foreign)} has a handler installed outside Python "
                "(signal.getsignal() returns None); it could not be put back after stop(), "
                "so SignalHandlers leaves it alone: leave it out of signals="
            )
        self._pipe = read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # for the C-level handler: a full pipe drops a byte
        previous_fd = signal.set_wakeup_fd(write_fd)
        if previous_fd != -1:
            signal.set_wakeup_fd(previous_fd)
            raise RuntimeError(
                "a signal wakeup fd is already set (by another SignalHandlers, or by an "
                "asyncio event loop's add_signal_handler): stop that first"
            )
        self._wakeup_fd = write_fd
        _installed = self
        for signum in self._signals:
            # Recorded before it is replaced: putting back a handler that was not replaced
            # yet is harmless, losing one is not.
            self._previous[signum] = signal.getsignal(signum)
            try:
                signal.signal(signum, _wake_only)
            except (OSError, ValueError):  # not replaced (SIGKILL, say): nothing to put back
                del self._previous[signum]
                raise
        # Started last: a signal caught while installing waits in the pipe, and is read
        # only if installing succeeds.
        self._dispatcher = threading.Thread(
            target=self._dispatch, args=(read_fd,), name="signal-dispatcher", daemon=True
        )
        try:
            self._to_close = True  # from here on the pipe may have a reader
            self._dispatcher.start()
        except BaseException:
            self._dispatcher_ended.set()  # it never ran, so it has ended
            raise

    def _forget_after_fork(self) -> None:
        """In a child forked while started: put back the previous handlers, let go of the pipe.

        The pipe is the parent's (a signal written there would stop the parent), and its
        threads are not here: the child gets the handlers it would have had without us.
        """
        self._lock = threading.RLock()  # the dispatcher may have held it at the fork
        self._closed = True
        first = self._received[0] if self._received else None
        self._report = SignalHandlersReport(True, (), first)  # the parent's threads are not here
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        if self._wakeup_fd != -1:
            signal.set_wakeup_fd(-1)
        self._dispatcher, self._to_close = None, False  # the parent's, and so is the pipe
        _close_pipe_once_unused(self)


def install_signal_handlers(
    on_stop: Callable[[], object],
    *,
    signals: Iterable[int] = DEFAULT_SIGNALS,
    stop_timeout: float = DEFAULT_STOP_TIMEOUT,
) -> SignalHandlers:
    """`SignalHandlers` started; its ``stop()`` puts everything back. Raises as ``start()``."""
    return SignalHandlers(on_stop, signals, stop_timeout=stop_timeout).start()


# The same code as in exit_hooks.py, where the exit sequence it skips is told (a module is
# copied alone); pinned by tests/test_copies.py.
def force_exit(
    status: int, reason: str = "forced exit", *, flush_timeout: float = FORCE_FLUSH_TIMEOUT
) -> NoReturn:
    """Log ``reason``, flush logging and stdio for at most ``flush_timeout`` s, `os._exit`.

    The flush runs in a helper thread, because a stream can block and the exit must not
    wait for it (P19). Where no thread can be started (during finalization; in an `atexit`
    handler on 3.12.1) it exits without the flush.
    """
    budget = _seconds(flush_timeout, "flush_timeout")
    if sys.is_finalizing():
        # No thread can start now: 3.12+ raise, and on 3.11 Thread.start() waits forever
        # for a thread that cannot get going. Exit without the flush.
        os._exit(status)
    flusher = threading.Thread(
        target=_log_and_flush, args=(status, reason), name="force-exit-flush", daemon=True
    )
    try:
        flusher.start()
    except RuntimeError:  # 3.12.0-3.12.2 refuse new threads in atexit handlers (gh-104690)
        os._exit(status)
    flusher.join(min(budget, threading.TIMEOUT_MAX))  # not interrupted: nothing to trust
    os._exit(status)


def _log_and_flush(status: int, reason: str) -> None:
    stuck = [
        t.name
        for t in threading.enumerate()
        if not t.daemon and t is not threading.current_thread() and t.is_alive()
    ]
    logger.critical(
        "%s: exiting now with status %d, skipping finally blocks and atexit handlers "
        "(non-daemon threads still running: %s)",
        reason,
        status,
        ", ".join(stuck) or "none",
    )
    logging.shutdown()  # flushes and closes every handler
    for stream in (sys.stdout, sys.stderr):
        # None without a console, a broken pipe, or already closed: nothing to save.
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()


def run_until_signalled(
    work: Callable[[threading.Event], object],
    *,
    drain_timeout: float,
    cleanup: Callable[[], object] | None = None,
    signals: Iterable[int] = DEFAULT_SIGNALS,
) -> bool:
    """Run ``work(stop)`` in a non-daemon thread until it returns or a signal asks to stop.

    ``work`` watches ``stop`` and, once it is set, finishes or hands back what it holds and
    returns, within ``drain_timeout`` of the first signal; then ``cleanup`` runs, with the
    handlers still installed, so a second signal in the drain or the cleanup forces the exit.
    Returns whether ``work`` ended; if not (logged at ERROR), its thread still holds the
    interpreter's exit: call `force_exit` rather than returning from ``main``.
    """
    drain = _seconds(drain_timeout, "drain_timeout")
    stop = threading.Event()  # set by on_stop (first signal); work watches it
    wake = threading.Event()  # set by on_stop or when work ends; the main thread waits on it
    ended = threading.Event()  # set when work ends: trusted even after an interrupted wait

    def on_stop() -> None:
        stop.set()
        wake.set()

    def body() -> None:
        try:
            work(stop)
        finally:
            ended.set()
            wake.set()

    worker = threading.Thread(target=body, name="worker")
    with SignalHandlers(on_stop, signals):
        worker.start()
        try:
            wake.wait()  # safe without a timeout: on_stop never runs in this thread
            if stop.is_set():
                logger.info("draining: waiting up to %.3gs for work to stop", drain)
            drained = _wait(ended, _deadline(drain))
            if not drained:
                logger.error("work did not stop within %.3gs; abandoning it", drain)
        finally:
            if cleanup is not None:
                cleanup()
    return drained


# --- forked children: the handlers they had before, no wakeup fd, no pipe -----------------
# (os.fork, multiprocessing's "fork"); subprocess children exec, which does all that for us.

_installed: SignalHandlers | None = None  # the handle whose wakeup fd is set (only one can be)
_fork_mask = threading.local()  # the forking thread's signal mask, saved by _before_fork


def _before_fork() -> None:
    # Block our signals in the forking thread, so the child starts with them blocked: until
    # _after_fork_in_child has run, it still has our handlers and the parent's wakeup fd, and
    # a signal would go into the parent's pipe. Blocked, it meets the child's restored handler.
    handlers = _installed
    if handlers is not None:
        _fork_mask.saved = signal.pthread_sigmask(signal.SIG_BLOCK, handlers.signals)


def _after_fork_in_parent() -> None:
    saved: set[signal.Signals] | None = getattr(_fork_mask, "saved", None)
    if saved is not None:
        del _fork_mask.saved
        signal.pthread_sigmask(signal.SIG_SETMASK, saved)


def _after_fork_in_child() -> None:
    global _installed
    handlers, _installed = _installed, None
    if handlers is not None:
        handlers._forget_after_fork()
    _after_fork_in_parent()  # unblock: whatever arrived meanwhile meets the old handler


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)


# --- the lifecycle contract: stop hand-off, Ctrl-C-safe restore, seconds and deadlines ----


def _unless_this_call_stops(h: SignalHandlers, budget: float) -> SignalHandlersReport | None:
    """None if the calling thread is now ``h``'s stopper, else the report to return.

    At once from ``h``'s own threads or a signal handler inside the stopper; from a caller
    that finds a stop under way, after waiting at most ``budget`` for its report.
    """
    me = threading.get_ident()
    with h._lock:
        if h._report is not None:
            return h._report
        own = me in (t.ident for t in (h._dispatcher, h._on_stop_thread) if t is not None)
        if not own and h._stopper is None:
            if h._started and threading.current_thread() is not threading.main_thread():
                _require_main_thread("SignalHandlers.stop()")
            h._stopper = me
            return None
        waits = not own and h._stopper != me
    if waits:
        _wait(h._stop_done, _deadline(budget))
    return h._report or _report_now(h, final=False)


def _report_now(h: SignalHandlers, *, final: bool) -> SignalHandlersReport:
    """The threads whose own "ended" event is not set; a report not final says terminated=False."""
    with h._lock:
        threads = [(h._dispatcher, h._dispatcher_ended), (h._on_stop_thread, h._on_stop_ended)]
        alive = tuple(t.name for t, ended in threads if t is not None and not ended.is_set())
        first = h._received[0] if h._received else None
    return SignalHandlersReport(final and not alive, alive, first)


def _restore_all(h: SignalHandlers, deadline: float) -> BaseException | None:
    """Undo everything _install did; return what a handler put back raised on the way."""
    failure: BaseException | None = None
    # Each call makes progress (every step is marked done once done), so a few calls
    # always suffice; the bound only guards against a step that fails every time.
    for _ in range(len(h._previous) + 4):
        try:
            _restore(h, deadline)
        except BaseException as exc:  # noqa: BLE001 - returned, raised by the caller
            failure = failure or exc
        else:
            break
    return failure


def _restore(h: SignalHandlers, deadline: float) -> None:
    """Handlers (Python callables last), wakeup fd, dispatcher, pipe; each step once."""
    global _installed  # noqa: PLW0603 - see _install
    # A previous handler that is a Python callable can raise (default_int_handler raises
    # KeyboardInterrupt) as soon as it is back; putting those back last keeps that
    # window at the end, and _restore_all calls this again to finish the rest.
    for signum, previous in sorted(h._previous.items(), key=lambda i: callable(i[1])):
        signal.signal(signum, previous)
        del h._previous[signum]
    if h._wakeup_fd != -1:
        current = signal.set_wakeup_fd(-1)
        if current not in (h._wakeup_fd, -1):  # someone replaced ours: leave theirs
            signal.set_wakeup_fd(current)
            logger.warning("the signal wakeup fd was replaced while handlers were installed")
        h._wakeup_fd = -1
    if h._to_close:  # written twice after a Ctrl-C here: harmless, the pipe is still open
        os.write(h._pipe[1], bytes([_CLOSE]))
        h._to_close = False
    if h._dispatcher is not None:
        _wait(h._dispatcher_ended, deadline)  # not join() or is_alive(): gh-90882, see __init__
    _close_pipe_once_unused(h)  # or, past the deadline, the dispatcher does as it ends
    if _installed is h:
        _installed = None


def _close_pipe_once_unused(h: SignalHandlers) -> None:
    """Close the pipe if stop() has written _CLOSE and no dispatcher reads it: both call this.

    Each end once, taken out first: a redo after a Ctrl-C never closes a reused number.
    """
    with h._lock:
        if h._to_close or not (h._dispatcher is None or h._dispatcher_ended.is_set()):
            return
        while h._pipe:
            fd, h._pipe = h._pipe[0], h._pipe[1:]
            with contextlib.suppress(OSError):  # closed by someone else: nothing left to do
                os.close(fd)


def _require_main_thread(what: str) -> None:
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            f"{what} must be called from the main thread: Python runs signal handlers only "
            "there, and signal.signal() and signal.set_wakeup_fd() refuse other threads"
        )


# The seconds family, the same code in every pattern module that holds it; pinned by
# tests/test_copies.py.
def _seconds(value: object, name: str, *, allow_none: bool = False) -> float:
    """A number of seconds >= 0 as a float; ``math.inf`` means "as long as it takes"."""
    if value is None and allow_none:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return math.inf if value > sys.float_info.max else float(value)  # 10**400: no overflow


def _deadline(seconds: float) -> float:
    """The monotonic time ``seconds`` from now (inf for "as long as it takes")."""
    return time.monotonic() + seconds


def _left(deadline: float) -> float:
    """Seconds until ``deadline``, never below 0, capped at what a C-level wait accepts."""
    return min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)


def _wait(event: threading.Event, deadline: float) -> bool:
    """Wait for ``event`` until ``deadline`` (may be inf); whether it was set."""
    while not event.wait(_left(deadline)):
        if time.monotonic() >= deadline:
            return False
    return True
