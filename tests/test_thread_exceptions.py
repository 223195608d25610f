"""Thread exceptions: each silent death forced to happen, then the pattern that hears of it."""

from __future__ import annotations

import _thread
import contextlib
import gc
import io
import logging
import queue
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from patterns.thread_exceptions import (
    LoggingExcepthook,
    LoggingExecutor,
    Supervisor,
    ThreadFailure,
    log_failure,
    naive_consume,
    naive_produce,
    produce,
    run_main,
)
from tests.support import (
    MUST_HAPPEN,
    NOISE,
    REAL_START,
    Gate,
    cannot_start,
    join_or_fail,
    pending_checkpoint,
    run_in_thread,
    spawn_python,
    start_then_interrupt,
    stays_blocked,
    thread_start_patched,
    wait_until_blocked_in,
)

MODULE_LOGGER = "patterns.thread_exceptions"


# --- helpers ------------------------------------------------------------------------------


@contextlib.contextmanager
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


def die_in_thread(target: Callable[[], object], name: str = "worker") -> threading.Thread:
    """Run ``target`` in a plain thread whose exception reaches threading.excepthook."""
    thread = threading.Thread(target=target, name=name)
    thread.start()
    join_or_fail(thread)
    return thread


def traceback_of(record: logging.LogRecord) -> str:
    """The traceback a handler would print for ``record`` ("" if it has none)."""
    if not record.exc_info:
        return ""
    return logging.Formatter().formatException(record.exc_info)


def module_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    """Records this module's logger emitted at exactly ``level``."""
    return [r for r in caplog.records if r.name == MODULE_LOGGER and r.levelno == level]


def explode() -> None:
    """A thread target or task that fails; its name shows up in every traceback."""
    raise ValueError("boom")


def call_sys_exit() -> None:
    """A worker that tries to end the program the Java way."""
    raise SystemExit(3)  # what sys.exit(3) does


class Records(logging.Handler):
    """A handler that keeps every record and sets `arrived` when the first one comes in."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.arrived = threading.Event()  # set by emit(), in the logging thread; waited by the test

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the record and signal its arrival."""
        self.records.append(record)
        self.arrived.set()


@pytest.fixture
def records() -> Iterator[Records]:
    """A `Records` handler attached to the module's logger for the test's duration."""
    handler = Records()
    module_logger = logging.getLogger(MODULE_LOGGER)
    module_logger.addHandler(handler)
    try:
        yield handler
    finally:
        module_logger.removeHandler(handler)


def run_child(code: str, timeout: float = MUST_HAPPEN) -> tuple[int, list[str], str]:
    """Run ``code`` in a child interpreter; return (exit status, stdout lines, stderr)."""
    child = spawn_python(textwrap.dedent(code))
    try:
        out, err = child.communicate(timeout=timeout)
    finally:
        child.kill()
        child.wait(MUST_HAPPEN)
    return child.returncode, out.splitlines(), err


# --- the hook: install, restore, nest -----------------------------------------------------


def test_install_and_restore_leave_threading_excepthook_identical_to_before() -> None:
    """restore() puts back the very object install() replaced, and a second restore is a no-op."""
    with recording_hook():
        before = threading.excepthook
        hook = LoggingExcepthook()

        assert hook.install() is hook
        assert threading.excepthook is hook
        assert hook.installed
        hook.restore()
        assert threading.excepthook is before
        hook.restore()
        assert threading.excepthook is before
        assert not hook.installed


def test_the_context_manager_restores_the_previous_hook_even_when_the_block_raises() -> None:
    """Leaving the with-block by an exception restores the hook just as leaving it normally does."""
    with recording_hook():
        before = threading.excepthook
        hook = LoggingExcepthook()

        def leave_by_an_exception() -> None:
            with hook:
                assert threading.excepthook is hook
                raise KeyError("leaving")

        with pytest.raises(KeyError):
            leave_by_an_exception()
        assert threading.excepthook is before


def test_nested_hooks_restore_in_reverse_order_and_each_failure_reaches_every_hook(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The inner hook logs and chains to the outer, which logs and chains to the original."""
    with recording_hook() as seen:
        original = threading.excepthook
        with LoggingExcepthook() as outer:
            with LoggingExcepthook() as inner:
                assert threading.excepthook is inner
                die_in_thread(explode)
            assert threading.excepthook is outer
        assert threading.excepthook is original

    assert seen == [(ValueError, "worker")]
    assert len(inner.failures) == len(outer.failures) == 1
    assert len(module_records(caplog, logging.ERROR)) == 2


def test_restoring_out_of_order_raises_and_changes_nothing() -> None:
    """Restoring a hook that another hook sits on would lose one of them, so it is refused."""
    with recording_hook():
        original = threading.excepthook
        first = LoggingExcepthook().install()
        second = LoggingExcepthook().install()
        with pytest.raises(RuntimeError, match="reverse order"):
            first.restore()
        assert threading.excepthook is second
        assert first.installed
        second.restore()
        first.restore()
        assert threading.excepthook is original


def test_installing_a_hook_that_is_already_installed_is_refused() -> None:
    """A second install would make the hook its own previous hook and loop forever."""
    with recording_hook():
        original = threading.excepthook
        with LoggingExcepthook() as hook:
            with pytest.raises(RuntimeError, match="already installed"):
                hook.install()
            assert threading.excepthook is hook
        assert threading.excepthook is original


# --- the hook: what it logs -----------------------------------------------------------------


def test_an_uncaught_exception_is_logged_at_error_with_thread_name_ident_and_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The record names the thread and its ident, with the traceback; the old hook hears too."""
    with recording_hook() as seen, LoggingExcepthook() as hook:
        thread = die_in_thread(explode, name="poller")

    [record] = module_records(caplog, logging.ERROR)
    assert record.getMessage() == (
        f"uncaught exception in thread 'poller' (ident {thread.ident}): ValueError: boom"
    )
    tb = traceback_of(record)
    assert tb.startswith("Traceback (most recent call last):")
    assert "in explode" in tb
    assert tb.endswith("ValueError: boom")
    assert seen == [(ValueError, "poller")]
    [failure] = hook.failures
    assert (failure.thread_name, failure.thread_ident, failure.exc_type) == (
        "poller",
        thread.ident,
        ValueError,
    )
    assert failure.summary == "ValueError: boom"
    assert "in explode" in failure.traceback


def test_sys_exit_in_a_thread_is_logged_with_its_code_and_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SystemExit, which the default hook ignores, is reported as ending only its thread."""
    with recording_hook(), LoggingExcepthook() as hook:
        thread = die_in_thread(call_sys_exit, name="quitter")

    [record] = module_records(caplog, logging.ERROR)
    assert record.getMessage() == (
        f"sys.exit(3) in thread 'quitter' (ident {thread.ident}) ended only that thread; "
        "the process goes on"
    )
    tb = traceback_of(record)
    assert "in call_sys_exit" in tb
    assert tb.endswith("SystemExit: 3")
    assert hook.failures[0].exc_type is SystemExit


def test_with_chain_false_the_previous_hook_is_not_called(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """chain=False logs and stops, for when the previous hook would print the same traceback."""
    with recording_hook() as seen, LoggingExcepthook(chain=False):
        die_in_thread(explode)
    assert seen == []
    assert len(module_records(caplog, logging.ERROR)) == 1


def test_a_hook_can_log_to_the_logger_it_is_given(caplog: pytest.LogCaptureFixture) -> None:
    """The logger argument routes thread failures to the application's own logger."""
    with recording_hook(), LoggingExcepthook(logger=logging.getLogger("app.threads")):
        die_in_thread(explode)
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.name == "app.threads"


# --- P8: sys.exit() in a worker thread -------------------------------------------------------

SYS_EXIT_CHILD = """
import logging, sys, threading
from patterns.thread_exceptions import LoggingExcepthook
logging.basicConfig(format="%(levelname)s:%(name)s:%(message)s")

def worker():
    print("worker calls sys.exit(3)", flush=True)
    sys.exit(3)

{setup}
thread = threading.Thread(target=worker, name="worker")
thread.start()
thread.join()
print("main goes on", flush=True)
"""


@pytest.mark.race("P8", "sys.exit() in a worker thread is silently ignored")
def test_naive_sys_exit_in_a_worker_thread_ends_only_that_thread_and_nothing_says_so() -> None:
    """With the default hook the worker just ends: no output, main goes on, exit status 0."""
    status, out, err = run_child(SYS_EXIT_CHILD.format(setup=""))
    assert out == ["worker calls sys.exit(3)", "main goes on"]
    assert err == ""
    assert status == 0


@pytest.mark.race("P8", "sys.exit() in a worker thread is silently ignored")
def test_logging_excepthook_reports_sys_exit_in_a_worker_thread() -> None:
    """Every uncaught exception, SystemExit included, is logged at ERROR with its traceback."""
    status, out, err = run_child(SYS_EXIT_CHILD.format(setup="LoggingExcepthook().install()"))
    assert out == ["worker calls sys.exit(3)", "main goes on"]
    lines = err.splitlines()
    assert lines[0].startswith(
        "ERROR:patterns.thread_exceptions:sys.exit(3) in thread 'worker' (ident "
    )
    assert lines[1] == "Traceback (most recent call last):"
    assert "in worker" in err
    assert lines[-1] == "SystemExit: 3"
    assert status == 0  # reported, not changed: run_main is what changes it (P8c)


# --- P8b: threading.excepthook never hears of executor tasks ---------------------------------


@pytest.mark.race("P8b", "threading.excepthook is not called for executor tasks")
def test_naive_threading_excepthook_never_hears_of_a_failed_executor_task() -> None:
    """The same function reaches the hook from a plain thread, and not from a pool task."""
    with recording_hook() as seen:
        die_in_thread(explode, name="plain")
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pool")
        future = pool.submit(explode)
        pool.shutdown(wait=True)
    assert seen == [(ValueError, "plain")]  # nothing from the pool
    assert isinstance(future.exception(), ValueError)  # it sat in the future all along


@pytest.mark.race("P8b", "threading.excepthook is not called for executor tasks")
def test_log_failure_reports_a_pool_task_that_the_hook_never_sees(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A done-callback hears what the hook cannot, and logs it beside the hook's own records."""
    with recording_hook() as seen, LoggingExcepthook():
        die_in_thread(explode, name="plain")
        pool = ThreadPoolExecutor(max_workers=1)
        pool.submit(explode).add_done_callback(log_failure)
        pool.shutdown(wait=True)  # joins the worker, so the callback has run

    assert seen == [(ValueError, "plain")]
    thread_record, task_record = module_records(caplog, logging.ERROR)
    assert thread_record.getMessage().startswith("uncaught exception in thread 'plain'")
    assert task_record.getMessage().startswith("task <Future at ")
    assert task_record.getMessage().endswith("raised ValueError> failed: ValueError: boom")
    assert "in explode" in traceback_of(task_record)


# --- P5b: a future whose result nobody reads ------------------------------------------------


@pytest.mark.race("P5b", "a failed task's exception disappears when nobody reads its future")
def test_naive_unread_future_hides_the_failure_completely(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No log record, no stderr, not even when the future is garbage-collected."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        pool = ThreadPoolExecutor(max_workers=1)
        pool.submit(explode)  # the future is dropped at once
        pool.shutdown(wait=True)
        gc.collect()
    assert stderr.getvalue() == ""
    assert caplog.records == []


@pytest.mark.race("P5b", "a failed task's exception disappears when nobody reads its future")
def test_logging_executor_logs_a_failure_when_it_happens_though_nobody_reads_the_future(
    records: Records,
) -> None:
    """The ERROR record, with traceback, arrives as the task fails, while the pool is still open."""
    gate = Gate("task about to fail")

    def fail_at_gate() -> None:
        gate.arrive()
        raise ValueError("disk full")

    pool = LoggingExecutor(max_workers=1)
    try:
        pool.submit(fail_at_gate)  # the future is dropped: nobody will ever call result()
        gate.wait_reached()
        assert records.records == []  # not failed yet, nothing to say
        gate.open()
        assert records.arrived.wait(MUST_HAPPEN)
    finally:
        gate.open()
        pool.shutdown(wait=True)

    [record] = records.records
    assert record.levelno == logging.ERROR
    message = record.getMessage()
    assert message.startswith("task <function ")
    assert "fail_at_gate at 0x" in message
    assert message.endswith("> failed: ValueError: disk full")
    tb = traceback_of(record)
    assert "in fail_at_gate" in tb
    assert tb.endswith("ValueError: disk full")


def test_cancelled_and_successful_tasks_are_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    """Only a failure is an error: a cancelled task and a task that returns log nothing."""
    gate = Gate("first task")
    pool = LoggingExecutor(max_workers=1)
    try:
        pool.submit(gate.arrive)
        queued = pool.submit(explode)
        gate.wait_reached()
        assert queued.cancel()
    finally:
        gate.open()
        pool.shutdown(wait=True)
    assert queued.cancelled()
    assert caplog.records == []


def test_log_failure_on_an_already_failed_future_logs_in_the_calling_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Added after the failure, the callback runs at once, so even a late owner hears of it."""
    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(explode)
    pool.shutdown(wait=True)
    future.add_done_callback(lambda f: log_failure(f, task="late task"))
    [record] = module_records(caplog, logging.ERROR)
    assert record.getMessage() == "task 'late task' failed: ValueError: boom"
    assert record.threadName == threading.current_thread().name


def raise_keyboard_interrupt() -> None:
    """A task that raises what Ctrl-C raises, from inside a pool thread."""
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("task", "summary"),
    [(call_sys_exit, "SystemExit: 3"), (raise_keyboard_interrupt, "KeyboardInterrupt")],
)
def test_a_system_exit_or_keyboard_interrupt_in_a_pool_task_is_logged_too(
    caplog: pytest.LogCaptureFixture, task: Callable[[], None], summary: str
) -> None:
    """The pool catches every BaseException into the future, so log_failure sees these too."""
    with LoggingExecutor(max_workers=1) as pool:
        future = pool.submit(task)
    assert type(future.exception()).__name__ == summary.split(":", maxsplit=1)[0]
    [record] = module_records(caplog, logging.ERROR)
    assert record.getMessage().endswith(f"failed: {summary}")
    assert f"in {task.__name__}" in traceback_of(record)


# --- the supervisor --------------------------------------------------------------------------


def test_supervisor_notices_each_death_within_one_interval_restarts_until_the_budget_is_spent_then_reports_unhealthy(  # noqa: E501
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each death of a worker raising after N items is reported at once; budget spent, unhealthy."""
    n_items, interval, budget = 3, 0.5, 2
    items: queue.Queue[int] = queue.Queue()
    for i in range(n_items * (budget + 1)):
        items.put(i)
    processed: list[int] = []
    started: list[float] = []
    noticed: queue.Queue[tuple[ThreadFailure, float]] = queue.Queue()
    gave_up: queue.Queue[list[ThreadFailure]] = queue.Queue()

    def worker(stop: threading.Event) -> None:
        started.append(time.monotonic())
        for _ in range(n_items):
            processed.append(items.get(timeout=MUST_HAPPEN))
        raise ValueError(f"crashed after {n_items} items")

    with Supervisor(
        worker,
        name="crashy",
        max_restarts=budget,
        window=60.0,
        interval=interval,
        on_death=lambda failure: noticed.put((failure, time.monotonic())),
        on_unhealthy=gave_up.put,
    ) as supervisor:
        for _ in range(budget + 1):
            failure, noticed_at = noticed.get(timeout=MUST_HAPPEN)
            assert failure.exc_type is ValueError
            assert failure.thread_name == "crashy"
            assert noticed_at - failure.ended_at < interval  # woken by the death, not a poll
        deaths = gave_up.get(timeout=MUST_HAPPEN)
        assert supervisor.wait_unhealthy(0)
        report = supervisor.stop(MUST_HAPPEN)

    assert processed == list(range(n_items * (budget + 1)))
    assert len(deaths) == budget + 1
    assert [d.summary for d in deaths] == ["ValueError: crashed after 3 items"] * 3
    # restarts are paced: each starts one interval after the previous death
    for death, restart in zip(deaths, started[1:], strict=False):
        assert restart - death.ended_at >= interval * 0.9
    assert report.terminated
    assert not report.healthy
    assert report.restarts == budget
    assert report.deaths == deaths
    assert report.still_running == []

    errors = module_records(caplog, logging.ERROR)
    died = [r for r in errors if r.getMessage().startswith("worker 'crashy' died")]
    assert [r.getMessage() for r in died] == [
        "worker 'crashy' died: ValueError: crashed after 3 items"
    ] * 3
    assert all("in worker" in traceback_of(r) for r in died)
    restarted = module_records(caplog, logging.WARNING)
    assert [r.getMessage() for r in restarted] == [
        "supervisor 'crashy': restarted the worker (restart 1, budget 2 per 60s)",
        "supervisor 'crashy': restarted the worker (restart 2, budget 2 per 60s)",
    ]
    [unhealthy] = [r for r in errors if "gives up" in r.getMessage()]
    assert unhealthy.getMessage() == (
        "supervisor 'crashy' gives up, unhealthy: "
        "worker died 3 time(s), budget of 2 restart(s) per 60s spent"
    )


def stoppable(ran: threading.Event | None = None) -> Callable[[threading.Event], None]:
    """A worker that announces itself and runs until asked to stop."""

    def worker(stop: threading.Event) -> None:
        if ran is not None:
            ran.set()
        stop.wait(MUST_HAPPEN)

    return worker


def test_stopping_a_healthy_worker_is_not_a_death_and_stop_is_idempotent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker that ends because it was asked to is reported as terminated, with no deaths."""
    ran = threading.Event()
    supervisor = Supervisor(stoppable(ran), name="steady").start()
    assert ran.wait(MUST_HAPPEN)
    first = supervisor.stop(MUST_HAPPEN)
    second = supervisor.stop(MUST_HAPPEN)
    for report in (first, second):
        assert report.terminated
        assert report.healthy
        assert report.deaths == []
        assert report.restarts == 0
    assert caplog.records == []
    with pytest.raises(RuntimeError, match="already started or stopped"):
        supervisor.start()


def test_stop_returns_on_time_and_names_a_worker_that_ignores_the_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker that does not look at its stop event cannot hold stop() past its timeout."""
    gate = Gate("worker that ignores stop")
    supervisor = Supervisor(lambda stop: gate.arrive(), name="deaf").start()
    try:
        gate.wait_reached()
        started = time.monotonic()
        report = supervisor.stop(0.2)
        assert time.monotonic() - started < 0.2 + NOISE
        assert not report.terminated
        assert [t.name for t in report.still_running] == ["deaf"]
        [record] = module_records(caplog, logging.ERROR)
        assert (
            record.getMessage()
            == "supervisor 'deaf': worker still running 0.2s after stop was requested"
        )
    finally:
        gate.open()
    later = supervisor.stop(MUST_HAPPEN)
    assert later.terminated
    assert later.deaths == []


def test_a_worker_that_returns_without_being_asked_is_a_death_and_is_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Ending early is also a silent death: reported, then restarted like any other."""
    generations: queue.Queue[int] = queue.Queue()
    count = iter(range(100))

    def worker(stop: threading.Event) -> None:
        generation = next(count)
        generations.put(generation)
        if generation == 0:
            return  # the bug: a worker loop that exits by mistake
        stop.wait(MUST_HAPPEN)

    with Supervisor(worker, name="quitter", interval=0) as supervisor:
        assert generations.get(timeout=MUST_HAPPEN) == 0
        assert generations.get(timeout=MUST_HAPPEN) == 1
        report = supervisor.stop(MUST_HAPPEN)
    [death] = report.deaths
    assert death.exc_type is None
    assert death.summary == "returned without being asked to stop"
    assert report.restarts == 1
    assert report.healthy
    assert [r.getMessage() for r in module_records(caplog, logging.ERROR)] == [
        "worker 'quitter' returned without being asked to stop"
    ]


def test_restarts_older_than_the_window_do_not_count_against_the_budget() -> None:
    """With a zero window every earlier restart has expired, so the budget is never spent."""
    generations: queue.Queue[int] = queue.Queue()
    count = iter(range(100))

    def worker(stop: threading.Event) -> None:
        generation = next(count)
        generations.put(generation)
        if generation < 5:
            raise RuntimeError(f"generation {generation}")
        stop.wait(MUST_HAPPEN)

    with Supervisor(worker, name="flaky", max_restarts=1, window=0.0, interval=0) as supervisor:
        assert [generations.get(timeout=MUST_HAPPEN) for _ in range(6)] == list(range(6))
        report = supervisor.stop(MUST_HAPPEN)
    assert report.healthy
    assert report.restarts == 5
    assert len(report.deaths) == 5


def test_a_failure_while_stopping_is_still_reported(caplog: pytest.LogCaptureFixture) -> None:
    """A worker that raises on its way out is a death in the report, not a clean stop."""
    ran = threading.Event()

    def worker(stop: threading.Event) -> None:
        ran.set()
        stop.wait(MUST_HAPPEN)
        raise OSError("flush failed")

    supervisor = Supervisor(worker, name="messy").start()
    assert ran.wait(MUST_HAPPEN)
    report = supervisor.stop(MUST_HAPPEN)
    assert report.terminated
    [death] = report.deaths
    assert death.summary == "OSError: flush failed"
    assert report.restarts == 0
    [record] = module_records(caplog, logging.ERROR)
    assert record.getMessage() == "worker 'messy' died: OSError: flush failed"


def test_a_failing_callback_is_logged_and_supervision_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug in on_death must not kill the supervisor, which would hide every later death."""
    generations: queue.Queue[int] = queue.Queue()
    count = iter(range(100))

    def worker(stop: threading.Event) -> None:
        generation = next(count)
        generations.put(generation)
        if generation == 0:
            raise ValueError("first generation")
        stop.wait(MUST_HAPPEN)

    def broken_callback(failure: ThreadFailure) -> None:
        raise KeyError(failure.summary)

    with Supervisor(worker, name="w", interval=0, on_death=broken_callback) as supervisor:
        assert [generations.get(timeout=MUST_HAPPEN) for _ in range(2)] == [0, 1]
        report = supervisor.stop(MUST_HAPPEN)
    assert report.restarts == 1
    callback_errors = [
        r for r in module_records(caplog, logging.ERROR) if "callback" in r.getMessage()
    ]
    assert len(callback_errors) == 1
    assert "KeyError" in traceback_of(callback_errors[0])


def test_a_crash_of_the_supervisor_itself_is_reported_as_unhealthy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A BaseException that escapes a callback would end supervision, so it is reported."""

    def worker(stop: threading.Event) -> None:
        raise ValueError("first death")

    def callback_that_exits(failure: ThreadFailure) -> None:
        raise SystemExit("a callback called sys.exit()")

    with Supervisor(worker, name="w", on_death=callback_that_exits) as supervisor:
        assert supervisor.wait_unhealthy(MUST_HAPPEN)
        report = supervisor.stop(MUST_HAPPEN)
    assert report.terminated
    assert not report.healthy
    assert report.restarts == 0
    messages = [r.getMessage() for r in module_records(caplog, logging.ERROR)]
    assert messages[-2:] == [
        "supervisor 'w' crashed",
        (
            "supervisor 'w' gives up, unhealthy: "
            "the supervisor itself crashed; the worker is no longer supervised"
        ),
    ]


def test_stop_from_the_worker_itself_is_refused() -> None:
    """The worker cannot wait for its own end; stop() says so instead of deadlocking."""
    outcome: dict[str, BaseException] = {}
    supervisor: Supervisor | None = None
    ran = threading.Event()

    def worker(stop: threading.Event) -> None:
        assert supervisor is not None
        try:
            supervisor.stop(0)
        except RuntimeError as exc:
            outcome["error"] = exc
        ran.set()
        stop.wait(MUST_HAPPEN)

    supervisor = Supervisor(worker, name="self-stopper")
    supervisor.start()
    assert ran.wait(MUST_HAPPEN)
    assert "from the supervised worker" in str(outcome["error"])
    assert supervisor.stop(MUST_HAPPEN).terminated


# --- P9: a consumer dies and its producer blocks forever -------------------------------------


def handle_until_poison(seen: list[str]) -> Callable[[str], None]:
    """A consumer's item handler that fails on the item ``"poison"``."""

    def handle(item: str) -> None:
        if item == "poison":
            raise ValueError("cannot handle poison")
        seen.append(item)

    return handle


@pytest.mark.race("P9", "a consumer thread dies and the producer blocks on a full queue forever")
def test_naive_producer_blocks_forever_once_its_consumer_died() -> None:
    """The consumer's death is only a line on stderr; the producer waits on the full queue."""
    q: queue.Queue[str] = queue.Queue(maxsize=1)
    handled: list[str] = []
    with recording_hook() as seen:
        consumer = threading.Thread(
            target=naive_consume, args=(q, handle_until_poison(handled)), name="consumer"
        )
        consumer.start()
        q.put("poison")
        join_or_fail(consumer)  # dead, and nothing but the hook was told
    assert seen == [(ValueError, "consumer")]

    producer, outcome = run_in_thread(lambda: naive_produce(q, ["a", "b"]), "producer")
    try:
        assert stays_blocked(producer)  # "a" filled the queue; "b" waits for nobody
        assert q.full()
    finally:
        assert q.get_nowait() == "a"  # the test plays consumer for one item...
        join_or_fail(producer)
    assert q.get_nowait() == "b"  # ...and only then could the blocked put() deliver "b"
    assert "error" not in outcome
    assert handled == []


def test_queue_shutdown_frees_a_blocked_producer_on_313_and_does_not_exist_before() -> None:
    """3.13's Queue.shutdown(immediate=True) wakes a producer blocked on a full queue."""
    q: queue.Queue[str] = queue.Queue(maxsize=1)
    if sys.version_info < (3, 13):
        assert not hasattr(q, "shutdown")  # on 3.11 and 3.12, produce() is the way out
        return
    q.put("a")
    producer, outcome = run_in_thread(lambda: q.put("b"), "producer")
    wait_until_blocked_in(producer, "put")
    q.shutdown(immediate=True)  # what a dying consumer would call in its finally
    join_or_fail(producer)
    assert type(outcome["error"]).__name__ == "ShutDown"
    assert q.empty()


def supervised_consumer(
    q: queue.Queue[str], handle: Callable[[str], None]
) -> Callable[[threading.Event], None]:
    """A consumer for a Supervisor: takes items until stopped, and dies if ``handle`` raises."""

    def consume(stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                item = q.get(timeout=0.05)  # a bounded wait, so the stop request is seen
            except queue.Empty:
                continue
            handle(item)

    return consume


@pytest.mark.race("P9", "a consumer thread dies and the producer blocks on a full queue forever")
def test_produce_gives_up_and_returns_what_it_could_not_deliver_once_the_consumer_is_gone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """When the supervisor gives up on the consumer, the blocked producer returns its items."""
    q: queue.Queue[str] = queue.Queue(maxsize=1)
    gate = Gate("consumer holding the poison")

    def handle(item: str) -> None:
        if item == "poison":
            gate.arrive()
            raise ValueError("cannot handle poison")

    supervisor = Supervisor(
        supervised_consumer(q, handle), name="consumer", max_restarts=0, interval=0
    ).start()
    try:
        producer, outcome = run_in_thread(
            lambda: produce(q, ["poison", "a", "b", "c"], alive=lambda: supervisor.healthy),
            "producer",
        )
        gate.wait_reached()  # the consumer took the poison; "a" fits, "b" will wait
        wait_until_blocked_in(producer, "put")
        gate.open()  # the consumer dies; no restart is allowed
        assert supervisor.wait_unhealthy(MUST_HAPPEN)
        join_or_fail(producer)  # it noticed within check_every, instead of never
    finally:
        gate.open()
        report = supervisor.stop(MUST_HAPPEN)

    assert outcome == {"result": ["b", "c"]}
    assert q.get_nowait() == "a"  # delivered to the queue, where the caller can still see it
    assert report.terminated
    assert not report.healthy
    assert "consumer is gone: 2 item(s) not delivered" in [
        r.getMessage() for r in module_records(caplog, logging.ERROR)
    ]


def test_a_restarted_consumer_keeps_the_queue_draining_so_the_producer_delivers_everything() -> (
    None
):
    """Two poison items kill two consumers; restarts keep the producer from ever getting stuck."""
    q: queue.Queue[str] = queue.Queue(maxsize=1)
    handled: list[str] = []
    items = ["a", "poison", "b", "poison", "c", "end"]
    done = threading.Event()

    def handle(item: str) -> None:
        if item == "end":
            done.set()
            return
        handle_until_poison(handled)(item)

    with Supervisor(
        supervised_consumer(q, handle), name="consumer", max_restarts=3, interval=0
    ) as supervisor:
        assert produce(q, items, alive=lambda: supervisor.healthy) == []
        assert done.wait(MUST_HAPPEN)
        report = supervisor.stop(MUST_HAPPEN)
    assert handled == ["a", "b", "c"]
    assert report.restarts == 2
    assert [d.summary for d in report.deaths] == ["ValueError: cannot handle poison"] * 2


# --- P8c: exit status when only a worker failed -----------------------------------------------

EXIT_STATUS_CHILD = """
import logging, sys, threading
from patterns.thread_exceptions import {runner}
logging.basicConfig(format="%(levelname)s:%(name)s:%(message)s")

def work():
    raise ValueError("worker failed")

def main():
    worker = threading.Thread(target=work, name="worker")
    worker.start()
    worker.join()
    print("main returns", flush=True)

sys.exit({runner}(main))
"""


@pytest.mark.race("P8c", "a worker thread's failure leaves the exit status at 0")
def test_naive_a_process_whose_worker_died_still_exits_with_status_zero() -> None:
    """The default hook prints a traceback, and the process still reports success."""
    status, out, err = run_child(EXIT_STATUS_CHILD.format(runner="naive_run_main"))
    assert out == ["main returns"]
    assert err.startswith("Exception in thread worker:\nTraceback (most recent call last):")
    assert err.splitlines()[-1] == "ValueError: worker failed"
    assert status == 0


@pytest.mark.race("P8c", "a worker thread's failure leaves the exit status at 0")
def test_run_main_exits_with_status_one_when_a_worker_failed() -> None:
    """run_main logs the failure with its traceback, and turns it into exit status 1."""
    status, out, err = run_child(EXIT_STATUS_CHILD.format(runner="run_main"))
    assert out == ["main returns"]
    lines = err.splitlines()
    assert lines[0].startswith(
        "ERROR:patterns.thread_exceptions:uncaught exception in thread 'worker' (ident "
    )
    assert lines[0].endswith("): ValueError: worker failed")
    assert "in work" in err
    assert "Exception in thread worker:" in err  # chained to the default hook, as installed
    assert lines[-1] == (
        "ERROR:patterns.thread_exceptions:exiting with status 1: 1 thread(s) failed: ['worker']"
    )
    assert status == 1


def test_run_main_keeps_a_non_zero_status_from_main_and_counts_no_failure_as_success() -> None:
    """Main's own status wins when it is non-zero; with no failed thread, 0 stays 0."""
    with recording_hook():
        original = threading.excepthook
        assert run_main(lambda: 4) == 4
        assert run_main(lambda: None) == 0
        assert threading.excepthook is original


def test_run_main_warns_about_threads_still_running_when_main_returns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A thread main did not join could still fail after the status is decided, so it is named."""
    gate = Gate("straggler")
    straggler = threading.Thread(target=gate.arrive, name="straggler")

    def main() -> None:
        straggler.start()
        gate.wait_reached()

    try:
        with recording_hook():
            assert run_main(main) == 0
    finally:
        gate.open()
        join_or_fail(straggler)
    [record] = module_records(caplog, logging.WARNING)
    assert "['straggler']" in record.getMessage()


def test_an_exception_from_main_propagates_and_the_hook_is_restored() -> None:
    """The main thread's failure is sys.excepthook's to report (status 1), not run_main's."""
    with recording_hook():
        original = threading.excepthook

        def main() -> None:
            raise LookupError("main failed")

        with pytest.raises(LookupError):
            run_main(main)
        assert threading.excepthook is original


# --- the supervisor's start() is all or nothing; stop() is bounded even while starting ------


def alive_named(*names: str) -> list[str]:
    """Which of these thread names are still alive."""
    return [t.name for t in threading.enumerate() if t.name in names and t.is_alive()]


@pytest.mark.parametrize(
    ("k", "action", "error"),
    [
        (1, cannot_start, RuntimeError),
        (2, cannot_start, RuntimeError),
        (1, start_then_interrupt, KeyboardInterrupt),
        (2, start_then_interrupt, KeyboardInterrupt),
    ],
    ids=[
        "worker-cannot-start",
        "supervisor-cannot-start",
        "ctrl-c-after-worker",
        "ctrl-c-after-both",
    ],
)
def test_a_start_that_fails_part_way_stops_what_it_started_and_reraises(
    k: int, action: Callable[[threading.Thread], None], error: type[BaseException]
) -> None:
    """Whichever thread start fails, the error propagates and no thread is left running."""
    supervisor = Supervisor(stoppable(), name="half", stop_timeout=MUST_HAPPEN)
    with thread_start_patched(k, action), pytest.raises(error):
        supervisor.start()
    assert alive_named("half", "half-supervisor") == []
    report = supervisor.stop(0)  # the caller may still call stop(): it must not raise
    assert report.terminated
    assert report.deaths == []


def test_a_restart_that_cannot_start_a_thread_makes_the_supervisor_unhealthy_and_stop_calm(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """If the restart's Thread.start fails, supervision gives up loudly; stop() still reports."""
    died = threading.Event()

    def worker(stop: threading.Event) -> None:
        died.set()
        raise ValueError("first death")

    supervisor = Supervisor(worker, name="w", interval=0)
    with thread_start_patched(3, cannot_start):  # worker, supervisor, then the restart
        supervisor.start()
        assert supervisor.wait_unhealthy(MUST_HAPPEN)
    report = supervisor.stop(MUST_HAPPEN)
    assert report.terminated
    assert not report.healthy
    assert [d.summary for d in report.deaths] == ["ValueError: first death"]
    assert any("gives up" in r.getMessage() for r in module_records(caplog, logging.ERROR))


def test_stop_racing_start_returns_within_its_budget_and_nothing_is_left_running() -> None:
    """A stop() while start() is still starting the worker keeps its budget and never raises."""
    gate = Gate("Thread.start of the worker in progress")

    def slow_start(thread: threading.Thread) -> None:
        gate.arrive()
        REAL_START(thread)

    supervisor = Supervisor(stoppable(), name="racing")
    with thread_start_patched(2, slow_start):  # the 1st start is the starter thread's
        starter, outcome = run_in_thread(supervisor.start, "starter")
        try:
            gate.wait_reached()
            started = time.monotonic()
            report = supervisor.stop(0.2)
            took = time.monotonic() - started
        finally:
            gate.open()
            join_or_fail(starter)
    assert took < 0.2 + NOISE
    assert not report.terminated  # it could not know yet: a thread was being started
    assert outcome == {"result": supervisor}  # its threads started, saw the stop, ended
    final = supervisor.stop(MUST_HAPPEN)
    assert final.terminated
    assert final.deaths == []
    assert alive_named("racing", "racing-supervisor") == []


def test_an_interrupt_in_run_main_restores_the_hook_it_installed() -> None:
    """A Ctrl-C landing in main propagates out of run_main and leaves no hook installed."""

    def main() -> None:
        _thread.interrupt_main()
        pending_checkpoint()

    with recording_hook():
        original = threading.excepthook
        with pytest.raises(KeyboardInterrupt):
            run_main(main)
        assert threading.excepthook is original
