"""No silent deaths: hear about every thread and every task that fails, and notice dead workers.

TL;DR: install a `LoggingExcepthook` (``with LoggingExcepthook():``) so an uncaught exception
in any thread, ``sys.exit()`` included, is logged at ERROR; run tasks on a `LoggingExecutor`
(or add `log_failure` as a done-callback) so a failed task is logged when it fails, read or
not; run a long-lived worker under a `Supervisor`, which notices at once when it ends,
restarts it within a budget and otherwise reports itself unhealthy; end ``main`` with
``sys.exit(run_main(main))`` so a worker's failure makes the exit status non-zero.

Pitfall:
    A thread that raises ends quietly: the default `threading.excepthook` prints a
    traceback to stderr, which nobody may read, and nothing else in the program learns of
    it. A consumer that dies that way leaves its producer blocked forever on the full
    queue (P9). ``sys.exit()`` in a thread raises `SystemExit`, which the default hook
    ignores without a word: the thread ends and the program goes on (P8). A task submitted
    to an executor never reaches any hook; its exception waits in a future that nobody may
    ever read (P5b, P8b). And however a worker dies, the process still exits with status 0.

Pattern:
    Every thread and every future has an owner who hears about its failure.
    `LoggingExcepthook` is the process-wide owner of threads: it logs each uncaught
    exception (thread name, ident, traceback) through `logging`, reports `SystemExit`
    instead of swallowing it, chains to the hook installed before it and, when restored,
    puts that hook back exactly. `log_failure` and `LoggingExecutor` own futures: a
    done-callback logs the failure in the worker thread at the moment the task fails.
    `Supervisor` owns one long-lived worker: the worker's wrapper signals a condition when
    it ends, so the death is noticed at once, reported (``on_death`` and a log record),
    and the worker restarted until ``max_restarts`` restarts within ``window`` seconds are
    spent; then the supervisor is unhealthy (``on_unhealthy`` and an ERROR record).
    `produce` puts on a bounded queue only while its consumer is alive. `run_main` turns
    "a thread failed" into exit status 1.

Guarantees:
    * While a `LoggingExcepthook` is installed, every exception that escapes a thread's
      ``run()``, `SystemExit` included, is logged at ERROR with its traceback, then passed
      to the previous hook. `LoggingExcepthook.restore` leaves `threading.excepthook`
      identical (``is``) to what `LoggingExcepthook.install` found; nested hooks restore in
      reverse order, and an out-of-order restore raises instead of losing a hook.
    * A task submitted to a `LoggingExecutor`, or whose future has `log_failure` as a
      done-callback, is logged at ERROR with its traceback when it fails, before anyone
      can call ``result()``; a cancelled task is not logged.
    * A supervised worker's end is never hidden: each one that was not asked for is
      logged, passed to ``on_death`` and kept in ``deaths``; it is noticed at once (the
      supervisor waits on a condition, it does not poll), so within one ``interval``.
    * `Supervisor.start` is all or nothing: if a thread cannot be started, or a Ctrl-C
      lands part-way, what started is stopped and the error re-raised.
    * `Supervisor.stop` returns within ``timeout`` (plus scheduling noise), even while
      another thread is inside `Supervisor.start`, never raises for a thread that
      never started, is idempotent, and its `SupervisorReport` names a worker that is
      still running.
    * `produce` never blocks for longer than ``check_every`` after its consumer is gone;
      it returns the items it could not deliver.

Python:
    3.11+, standard library only. `threading.excepthook` exists since 3.8 and is
    process-wide: there is no per-thread hook. It sees `SystemExit` (the default hook
    ignores it) but never a pool task's exception, because the pool's worker catches
    every `BaseException`, ``SystemExit`` included, and stores it in the future.
    `sys.excepthook` is only for the main thread, where an uncaught exception already
    makes the exit status 1. The tests check all of this on 3.11.7, 3.12.1 and 3.13.0.
    3.13 adds ``Queue.shutdown()``: a dying consumer can call
    ``q.shutdown(immediate=True)`` in its ``finally``, so that blocked producers get
    ``queue.ShutDown`` instead of waiting; on 3.11 and 3.12, `produce` is the way out.

Java:
    ``Thread.setDefaultUncaughtExceptionHandler`` is `LoggingExcepthook`.
    ``Thread.setUncaughtExceptionHandler`` (per thread) has no Python counterpart: a hook
    can only look at ``args.thread``, or the thread's target can be wrapped, as
    `Supervisor` does. A handler set on pool threads through a ``ThreadFactory`` hears
    of ``execute()`` tasks; Python has only ``submit()``, whose failures no hook ever
    hears, so `LoggingExecutor` gives every task ``execute()``'s behaviour: the failure
    is reported. ``System.exit()`` from any thread ends the JVM; ``sys.exit()`` ends
    only the calling thread.

See also:
    ``executor_shutdown`` (its ``TrackingExecutor`` logs failures the same way and also
    tracks unfinished work), ``cancellation`` (stopping a worker cooperatively),
    ``daemon_threads`` (what interpreter exit waits for).
"""

from __future__ import annotations

import collections
import functools
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ParamSpec, Self, TypeVar

__all__ = [
    "LoggingExcepthook",
    "LoggingExecutor",
    "Supervisor",
    "SupervisorReport",
    "ThreadFailure",
    "log_failure",
    "produce",
    "run_main",
]

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

# Guards every read-modify-write of threading.excepthook done by this module, so two
# threads installing or restoring at once cannot both save the same previous hook.
# Held only for those few lines; the hook itself never takes it.
_HOOK_LOCK = threading.Lock()


@dataclass(frozen=True)
class ThreadFailure:
    """How one thread ended when it should not have: the facts, without the exception.

    The exception object is not kept, because it references its traceback, whose frames
    reference the exception again (the reference cycle the `threading.excepthook` docs
    warn about); its text is kept instead.

    Attributes:
        thread_name: the thread's name.
        thread_ident: the thread's ident, or None if it was not known.
        exc_type: the exception's class, or None if the thread returned without raising
            when it was not asked to stop.
        summary: the exception's last traceback line, such as ``"ValueError: boom"``.
        traceback: the whole formatted traceback ("" if there was none).
        ended_at: `time.monotonic` when the thread recorded its end.
    """

    thread_name: str
    thread_ident: int | None
    exc_type: type[BaseException] | None
    summary: str
    traceback: str
    ended_at: float

    @classmethod
    def from_exception(
        cls,
        thread: threading.Thread | None,
        exc_type: type[BaseException],
        exc: BaseException | None,
    ) -> ThreadFailure:
        """Record ``exc`` (of class ``exc_type``), raised in ``thread``, as it is now."""
        tb = exc.__traceback__ if exc is not None else None
        return cls(
            thread_name=thread.name if thread is not None else "<unknown>",
            thread_ident=thread.ident if thread is not None else None,
            exc_type=exc_type,
            summary="".join(traceback.format_exception_only(exc_type, exc)).strip(),
            traceback="".join(traceback.format_exception(exc_type, exc, tb)),
            ended_at=time.monotonic(),
        )


class LoggingExcepthook:
    """A `threading.excepthook` that logs at ERROR, then chains to the hook it replaced.

    Use it as a context manager (``with LoggingExcepthook() as hook:``) or call
    `install` and `restore`. While installed, an exception that escapes any thread's
    ``run()`` is logged through ``logger`` (default: this module's) with the thread's name,
    ident and full traceback, and recorded in `failures`; then the previous hook is called
    (pass ``chain=False`` to stop there, for instance when the previous hook is the default
    one and prints the same traceback to stderr). `SystemExit` from ``sys.exit()`` in a
    thread is reported as well, where the default hook would ignore it.

    Hooks nest: each instance remembers the hook it replaced and `restore` puts exactly
    that object back. Restoring an instance while another one installed later is still
    in place raises `RuntimeError`, because either choice would lose a hook.
    """

    def __init__(self, *, logger: logging.Logger | None = None, chain: bool = True) -> None:
        self.logger = logger if logger is not None else logging.getLogger(__name__)
        self.chain = chain
        # Guards _failures: the hook runs in whichever threads are dying, maybe several at once.
        self._lock = threading.Lock()
        self._failures: list[ThreadFailure] = []
        self._previous: Callable[[threading.ExceptHookArgs], object] | None = None
        self._installed = False

    def install(self) -> Self:
        """Make this the process's `threading.excepthook`; raise if it already is installed."""
        with _HOOK_LOCK:
            if self._installed:
                raise RuntimeError("this LoggingExcepthook is already installed")
            self._previous = threading.excepthook
            threading.excepthook = self
            self._installed = True
        return self

    def restore(self) -> None:
        """Put back the hook that `install` replaced, exactly; do nothing if not installed.

        Raises `RuntimeError`, changing nothing, if another hook was installed on top of
        this one and is still in place: restore that one first.
        """
        with _HOOK_LOCK:
            if not self._installed:
                return
            current = threading.excepthook
            if current is not self:
                raise RuntimeError(
                    f"cannot restore: {current!r} was installed after this hook and is still "
                    "in place; restore hooks in the reverse order of installing them"
                )
            # Exactly what install() found, even None (the stubs do not allow for that).
            threading.excepthook = self._previous  # type: ignore[assignment]
            self._installed = False

    @property
    def installed(self) -> bool:
        """Whether this hook is currently installed."""
        return self._installed

    @property
    def failures(self) -> list[ThreadFailure]:
        """Every failure this hook has seen, oldest first."""
        with self._lock:
            return list(self._failures)

    def __call__(self, args: threading.ExceptHookArgs, /) -> None:
        """Log one uncaught exception, record it, then call the previous hook."""
        try:
            failure = ThreadFailure.from_exception(args.thread, args.exc_type, args.exc_value)
            with self._lock:
                self._failures.append(failure)
            # The exception carries its traceback; exc_value is None only for odd C code.
            exc_info = args.exc_value if args.exc_value is not None else False
            if issubclass(args.exc_type, SystemExit):
                self.logger.error(
                    "sys.exit(%r) in thread %r (ident %s) ended only that thread; "
                    "the process goes on",
                    getattr(args.exc_value, "code", None),
                    failure.thread_name,
                    failure.thread_ident,
                    exc_info=exc_info,
                )
            else:
                self.logger.error(
                    "uncaught exception in thread %r (ident %s): %s",
                    failure.thread_name,
                    failure.thread_ident,
                    failure.summary,
                    exc_info=exc_info,
                )
        finally:
            # Whatever happened above, the hooks installed before this one still hear of it.
            previous = self._previous
            if self.chain and previous is not None:
                previous(args)

    def __enter__(self) -> Self:
        return self.install()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.restore()


def log_failure(future: Future[Any], /, *, task: object = None) -> None:
    """A done-callback that logs the future's exception at ERROR, with its traceback.

    Added with ``future.add_done_callback(log_failure)`` (or ``functools.partial(
    log_failure, task=fn)`` to name the task), it runs in the worker thread right after
    the task fails, whether or not anybody ever calls ``result()``. A cancelled future
    or a successful one logs nothing. It never raises.
    """
    if future.cancelled():
        return
    exc = future.exception()
    if exc is None:
        return
    logger.error(
        "task %r failed: %s",
        task if task is not None else future,
        "".join(traceback.format_exception_only(type(exc), exc)).strip(),
        exc_info=(type(exc), exc, exc.__traceback__),
    )


class LoggingExecutor(ThreadPoolExecutor):
    """A `ThreadPoolExecutor` whose every failed task is logged at ERROR when it fails.

    Python's answer to Java's ``execute()``: the exception still goes into the future,
    as ``submit()`` always does, and `log_failure` also reports it the moment the task
    fails, so dropping the future no longer hides it. A cancelled task is not logged.
    ``map()`` submits through `submit`, so it is covered too.
    """

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Submit ``fn(*args, **kwargs)`` as `ThreadPoolExecutor.submit` does, failures logged."""
        future = super().submit(fn, *args, **kwargs)
        future.add_done_callback(functools.partial(log_failure, task=fn))
        return future


@dataclass(frozen=True)
class SupervisorReport:
    """What `Supervisor.stop` achieved.

    Attributes:
        terminated: the worker and the supervisor's own thread have both ended.
        healthy: False once the restart budget was spent and the worker given up.
        restarts: how many times the worker was restarted.
        deaths: every end of the worker that was not asked for, oldest first.
        still_running: threads still running at the deadline: the worker, and the
            supervisor's own thread if a callback was holding it.
        elapsed: seconds the `Supervisor.stop` call took.
    """

    terminated: bool
    healthy: bool
    restarts: int
    deaths: list[ThreadFailure]
    still_running: list[threading.Thread]
    elapsed: float


class Supervisor:
    """Run ``target(stop)`` in a thread, notice when it ends, restart it within a budget.

    ``target`` is the worker's body; it receives a `threading.Event` that is set when
    `stop` is called, and should return soon after. Any end that was not asked for (an
    exception, or returning while ``stop`` is not set) is a death: the worker's wrapper
    logs it at ERROR with its traceback and signals the supervisor's thread, which calls
    ``on_death(failure)`` and then either restarts the worker, ``interval`` seconds later,
    or, when ``max_restarts`` restarts already happened within the last ``window``
    seconds, gives up: it logs at ERROR, becomes unhealthy and calls
    ``on_unhealthy(deaths)``.

    The death is noticed as soon as the wrapper signals, not at the next poll; the
    ``interval`` only paces restarts, so a worker that fails at once cannot spin.
    Callbacks run in the supervisor's thread; an exception from one is logged and
    ignored, and they must not call `stop` (it would wait for its own thread).

    Lifecycle: `start`, `stop` with a timeout returning a `SupervisorReport`, and a
    context manager that starts on entry and stops (with ``stop_timeout``) on exit.
    """

    def __init__(
        self,
        target: Callable[[threading.Event], object],
        *,
        name: str = "worker",
        max_restarts: int = 3,
        window: float = 60.0,
        interval: float = 1.0,
        stop_timeout: float = 5.0,
        on_death: Callable[[ThreadFailure], object] | None = None,
        on_unhealthy: Callable[[list[ThreadFailure]], object] | None = None,
    ) -> None:
        self.target = target
        self.name = name
        self.max_restarts = max_restarts
        self.window = window
        self.interval = interval
        self.stop_timeout = stop_timeout
        self.on_death = on_death
        self.on_unhealthy = on_unhealthy
        # The stop request. Set by stop(); watched by the worker (it is target's argument)
        # and by the supervisor's thread while it paces a restart.
        self._stop = threading.Event()
        # Set by the supervisor's thread when it gives up; waited on by wait_unhealthy().
        self._unhealthy = threading.Event()
        # Guards every field below. Notified by the worker's wrapper when the worker ends
        # and by stop(); waited on by the supervisor's thread. A restart happens only
        # while it is held and the stop request is not set, and start() publishes its two
        # threads while holding it, so once stop() has set the request and taken it, the
        # threads it reads are the last ones (any of them started later sees the request).
        self._changed = threading.Condition()
        # Cleared by start() while it is starting its threads, set again once both
        # Thread.start calls have returned or one raised; a racing stop() waits on it,
        # within its budget, because a thread cannot be joined before it has started.
        self._start_settled = threading.Event()
        self._start_settled.set()
        self._worker: threading.Thread | None = None
        self._ended: list[ThreadFailure | None] = []  # one entry per worker end, not yet handled
        self._deaths: list[ThreadFailure] = []
        self._restart_times: collections.deque[float] = collections.deque()
        self._restarts = 0
        self._supervisor: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the worker and the supervisor's thread; raise if already started.

        All or nothing: if either thread cannot be started, or a Ctrl-C lands part-way,
        whatever started is stopped within ``stop_timeout`` and the error re-raised.
        """
        with self._changed:
            if self._supervisor is not None or self._stop.is_set():
                raise RuntimeError(f"supervisor {self.name!r} was already started or stopped")
            self._worker = self._new_worker()
            self._supervisor = threading.Thread(
                target=self._supervise, name=f"{self.name}-supervisor"
            )
            threads = (self._worker, self._supervisor)
            self._start_settled.clear()
        try:
            for thread in threads:
                thread.start()
        except BaseException:
            self._start_settled.set()
            self.stop(self.stop_timeout)  # the caller gets nothing to stop: we do it
            raise
        self._start_settled.set()
        return self

    def stop(self, timeout: float) -> SupervisorReport:
        """Ask the worker to stop, wait up to ``timeout`` for it, and report.

        Idempotent: a second call asks nothing new, waits again up to its own
        ``timeout`` for whatever is still running, and returns a fresh report.
        """
        start = time.monotonic()
        deadline = start + timeout

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        if threading.current_thread() in (self._worker, self._supervisor):
            raise RuntimeError("stop() called from the supervised worker or a callback")
        self._stop.set()
        # Timed, so that a restart holding the lock in Thread.start cannot hold stop().
        locked_first = self._changed.acquire(timeout=left())
        try:
            if locked_first:
                self._changed.notify_all()
            # Final from here on when locked: no worker starts once the request is set.
            worker, supervisor = self._worker, self._supervisor
        finally:
            if locked_first:
                self._changed.release()
        # A start() in another thread may still be inside Thread.start: wait, within budget.
        settled = self._start_settled.wait(left()) and locked_first
        # A thread with no ident never ran: its Thread.start failed.
        threads = [t for t in (supervisor, worker) if t is not None and t.ident is not None]
        for thread in threads:  # the supervisor's first: it ends at once unless in a callback
            thread.join(left())
        locked = self._changed.acquire(timeout=left())
        try:
            if locked:
                self._collect_final_end()
            still_running = [t for t in threads if t.is_alive()]
            terminated = settled and locked and not still_running
            report = SupervisorReport(
                terminated=terminated,
                healthy=not self._unhealthy.is_set(),
                restarts=self._restarts,
                deaths=list(self._deaths),
                still_running=still_running,
                elapsed=time.monotonic() - start,
            )
        finally:
            if locked:
                self._changed.release()
        if not terminated:
            logger.error(
                "supervisor %r: worker still running %.3gs after stop was requested",
                self.name,
                timeout,
            )
        return report

    def __enter__(self) -> Self:
        if self._supervisor is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(self.stop_timeout)

    # --- state ----------------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """False once the restart budget was spent and the worker given up."""
        return not self._unhealthy.is_set()

    def wait_unhealthy(self, timeout: float | None = None) -> bool:
        """Block until the supervisor gives up on its worker; False if ``timeout`` ran out."""
        return self._unhealthy.wait(timeout)

    @property
    def restarts(self) -> int:
        """How many times the worker has been restarted."""
        with self._changed:
            return self._restarts

    @property
    def deaths(self) -> list[ThreadFailure]:
        """Every unexpected end of the worker so far, oldest first."""
        with self._changed:
            return list(self._deaths)

    # --- the worker's side ----------------------------------------------------------------

    def _new_worker(self) -> threading.Thread:
        return threading.Thread(target=self._run_worker, name=self.name)

    def _run_worker(self) -> None:
        failure: ThreadFailure | None = None
        try:
            self.target(self._stop)
            if not self._stop.is_set():
                failure = ThreadFailure(
                    self.name,
                    threading.get_ident(),
                    None,
                    "returned without being asked to stop",
                    "",
                    time.monotonic(),
                )
                logger.error("worker %r returned without being asked to stop", self.name)
        except BaseException as exc:  # any end of the worker must be reported
            failure = ThreadFailure.from_exception(threading.current_thread(), type(exc), exc)
            logger.exception("worker %r died: %s", self.name, failure.summary)
        finally:
            # The signal the supervisor waits for: always sent, however the worker ended.
            with self._changed:
                self._ended.append(failure)
                self._changed.notify_all()

    # --- the supervisor's side ------------------------------------------------------------

    def _supervise(self) -> None:
        try:
            self._supervise_loop()
        except BaseException:  # a dead supervisor would hide every later death
            logger.exception("supervisor %r crashed", self.name)
            self._give_up("the supervisor itself crashed; the worker is no longer supervised")

    def _supervise_loop(self) -> None:
        while True:
            with self._changed:
                while not self._ended and not self._stop.is_set():
                    self._changed.wait()
                if self._stop.is_set():
                    return  # stop() collects whatever end is still pending
                failure = self._ended.pop(0)
                if failure is None:  # a clean end, which needs a stop request: see above
                    continue
                self._deaths.append(failure)
            self._call(self.on_death, failure)
            if not self._may_restart():
                self._give_up(
                    f"worker died {len(self.deaths)} time(s), budget of {self.max_restarts} "
                    f"restart(s) per {self.window:g}s spent"
                )
                return
            if self._stop.wait(self.interval):  # pacing; a stop request cuts it short
                return
            with self._changed:
                if self._stop.is_set():
                    return
                worker = self._new_worker()
                worker.start()  # if it raises, _supervise gives up; _worker is the dead one
                self._worker = worker
                self._restart_times.append(time.monotonic())
                self._restarts += 1
                restarts = self._restarts
            logger.warning(
                "supervisor %r: restarted the worker (restart %d, budget %d per %gs)",
                self.name,
                restarts,
                self.max_restarts,
                self.window,
            )

    def _may_restart(self) -> bool:
        now = time.monotonic()
        with self._changed:
            while self._restart_times and now - self._restart_times[0] >= self.window:
                self._restart_times.popleft()
            return len(self._restart_times) < self.max_restarts

    def _give_up(self, reason: str) -> None:
        logger.error("supervisor %r gives up, unhealthy: %s", self.name, reason)
        self._unhealthy.set()
        self._call(self.on_unhealthy, self.deaths)

    def _collect_final_end(self) -> None:
        # Called by stop() with _changed held: a worker that failed while (or after) the
        # stop was requested is still a death, and is kept in the report.
        while self._ended:
            failure = self._ended.pop(0)
            if failure is not None:
                self._deaths.append(failure)

    def _call(self, callback: Callable[[Any], object] | None, arg: object) -> None:
        if callback is None:
            return
        try:
            callback(arg)
        except Exception:
            logger.exception("supervisor %r: callback %r failed", self.name, callback)


# --- producers and a consumer that may die ------------------------------------------------


def produce(
    q: queue.Queue[T],
    items: Iterable[T],
    *,
    alive: Callable[[], bool],
    check_every: float = 0.1,
) -> list[T]:
    """Put ``items`` on ``q`` while ``alive()`` is true; return those that were not put (P9).

    A full queue is waited on in slices of ``check_every`` seconds, and ``alive()`` is
    asked between slices, so a dead consumer stops the producer within ``check_every``
    instead of never. Typical ``alive``: ``consumer.is_alive`` or
    ``lambda: supervisor.healthy``. The undelivered items are logged and returned, so the
    caller can store, retry or drop them on purpose.
    """
    iterator = iter(items)
    for item in iterator:
        while True:
            if not alive():
                left = [item, *iterator]
                logger.error("consumer is gone: %d item(s) not delivered", len(left))
                return left
            try:
                q.put(item, timeout=check_every)
                break
            except queue.Full:
                continue
    return []


def run_main(main: Callable[[], int | None], *, failure_status: int = 1) -> int:
    """Run ``main`` with a `LoggingExcepthook`; return ``failure_status`` if a thread failed.

    Use it as ``sys.exit(run_main(main))``. A thread counts only if it failed while
    ``main`` ran, so ``main`` must join its threads before it returns; any non-daemon
    thread still running then is logged at WARNING, because its failure can no longer
    change the exit status. An exception from ``main`` itself propagates (the main
    thread's `sys.excepthook` reports it and the status is 1, as usual).
    """
    with LoggingExcepthook() as hook:
        status = main()
    still_running = [
        t.name
        for t in threading.enumerate()
        if t is not threading.main_thread() and not t.daemon and t.is_alive()
    ]
    if still_running:
        logger.warning(
            "thread(s) still running after main returned, their failures cannot change "
            "the exit status: %s",
            still_running,
        )
    failures = hook.failures
    if failures and not status:
        logger.error(
            "exiting with status %d: %d thread(s) failed: %s",
            failure_status,
            len(failures),
            [f.thread_name for f in failures],
        )
        return failure_status
    return status or 0


# --- Broken on purpose: the naive versions the tests and docs compare against ------------


def naive_consume(q: queue.Queue[T], handle: Callable[[T], object]) -> None:
    """Broken on purpose: the first exception from ``handle`` ends the thread, and nobody hears.

    The default `threading.excepthook` prints a traceback to stderr, and that is all:
    the queue stops draining and its producers block once it is full (P9).
    """
    while True:
        handle(q.get())


def naive_produce(q: queue.Queue[T], items: Iterable[T]) -> None:
    """Broken on purpose: ``put()`` on a full queue whose consumer died blocks forever (P9)."""
    for item in items:
        q.put(item)


def naive_run_main(main: Callable[[], int | None]) -> int:
    """Broken on purpose: a worker thread that failed leaves the exit status at 0."""
    return main() or 0
