"""Thread exceptions: each silent death forced to happen, then the pattern that hears of it."""

from __future__ import annotations

import _thread
import ast
import contextlib
import gc
import io
import logging
import textwrap
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from patterns.thread_exceptions import (
    LoggingExcepthook,
    LoggingExecutor,
    log_failure,
    run_main,
)
from tests.support import (
    MUST_HAPPEN,
    Gate,
    join_or_fail,
    pending_checkpoint,
    recording_hook,
    spawn_python,
)

MODULE_LOGGER = "patterns.thread_exceptions"


# --- helpers ------------------------------------------------------------------------------


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
def test_naive_sys_exit_in_a_worker_thread_ends_only_that_thread_and_nothing_says_so(
    record_property: Callable[[str, object], None],
) -> None:
    """With the default hook the worker just ends: no output, main goes on, exit status 0."""
    status, out, err = run_child(SYS_EXIT_CHILD.format(setup=""))
    record_property(
        "observed",
        f"the worker called sys.exit(3), then main printed {out[1:]}, stderr {err!r},"
        f" exit status {status}",
    )
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
def test_naive_threading_excepthook_never_hears_of_a_failed_executor_task(
    record_property: Callable[[str, object], None],
) -> None:
    """The same function reaches the hook from a plain thread, and not from a pool task."""
    with recording_hook() as seen:
        die_in_thread(explode, name="plain")
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pool")
        future = pool.submit(explode)
        pool.shutdown(wait=True)
    record_property(
        "observed",
        f"excepthook heard from threads {[name for _, name in seen]}, the pool task's"
        f" {type(future.exception()).__name__} sat unread in its future",
    )
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
    record_property: Callable[[str, object], None],
) -> None:
    """No log record, no stderr, not even when the future is garbage-collected."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        pool = ThreadPoolExecutor(max_workers=1)
        pool.submit(explode)  # the future is dropped at once
        pool.shutdown(wait=True)
        gc.collect()
    record_property(
        "observed",
        f"the task's failure left no trace: stderr {stderr.getvalue()!r},"
        f" {len(caplog.records)} log records, even after gc.collect()",
    )
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


# --- P8c: exit status when only a worker failed -----------------------------------------------

EXIT_STATUS_CHILD = """
import logging, sys, threading
from patterns.thread_exceptions import run_main
from patterns.naive.thread_exceptions import naive_run_main
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
def test_naive_a_process_whose_worker_died_still_exits_with_status_zero(
    record_property: Callable[[str, object], None],
) -> None:
    """The default hook prints a traceback, and the process still reports success."""
    status, out, err = run_child(EXIT_STATUS_CHILD.format(runner="naive_run_main"))
    last_err = (err.splitlines() or [""])[-1]
    record_property("observed", f"exit status {status}, though stderr ends {last_err!r}")
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
    # Threads an earlier test left running (that test has failed for it) are named too:
    # they are still running. Only those may appear beside the straggler.
    earlier = {
        t.name for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon
    }
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
    named = ast.literal_eval(record.getMessage().rpartition(": ")[2])
    assert "straggler" in named
    assert set(named) - {"straggler"} <= earlier, named


def test_an_exception_from_main_propagates_and_the_hook_is_restored() -> None:
    """The main thread's failure is sys.excepthook's to report (status 1), not run_main's."""
    with recording_hook():
        original = threading.excepthook

        def main() -> None:
            raise LookupError("main failed")

        with pytest.raises(LookupError):
            run_main(main)
        assert threading.excepthook is original


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
