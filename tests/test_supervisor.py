"""The supervisor: a dead worker is noticed at once and restarted within a budget (P9)."""

from __future__ import annotations

import dataclasses
import logging
import math
import queue
import subprocess
import sys
import threading
import time
import typing
from collections.abc import Callable

import pytest

from patterns import thread_exceptions
from patterns.naive.supervisor import naive_consume, naive_produce
from patterns.supervisor import (
    Supervisor,
    SupervisorReport,
    ThreadFailure,
    produce_until_consumer_dies,
)
from tests.support import (
    MUST_HAPPEN,
    NOISE,
    Gate,
    cannot_start,
    handler_stops_during_stop,
    handler_stops_inside_the_stop_event_set,
    join_or_fail,
    recording_hook,
    run_in_thread,
    run_python,
    signal_main_during,
    start_at,
    start_then_interrupt,
    stays_blocked,
    thread_start_patched,
    wait_until,
    wait_until_blocked_in,
    wait_until_parked_inside,
)

MODULE_LOGGER = "patterns.supervisor"

P9 = ("P9", "a consumer thread dies and the producer blocks on a full queue forever")


def traceback_of(record: logging.LogRecord) -> str:
    """The traceback a handler would print for ``record`` ("" if it has none)."""
    if not record.exc_info:
        return ""
    return logging.Formatter().formatException(record.exc_info)


def module_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    """Records this module's logger emitted at exactly ``level``."""
    return [r for r in caplog.records if r.name == MODULE_LOGGER and r.levelno == level]


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
    assert report.deaths == tuple(deaths)
    assert report.still_running == ()

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
    assert supervisor.stop(0) is first  # the same report, whatever the second budget
    assert first == SupervisorReport(
        terminated=True,
        still_running=(),
        healthy=True,
        restarts=0,
        deaths=(),
        elapsed=first.elapsed,
    )
    assert caplog.records == []
    with pytest.raises(RuntimeError, match="already started or stopped"):
        supervisor.start()
    with pytest.raises(RuntimeError, match="was stopped"), supervisor:
        pass


def test_concurrent_stops_all_return_the_one_report() -> None:
    """Stops racing each other wait (within their budgets) for the first one's report."""
    gate = Gate("worker that ignores stop")
    supervisor = Supervisor(lambda stop: gate.arrive(), name="busy").start()
    gate.wait_reached()
    try:
        stoppers = [
            run_in_thread(lambda: supervisor.stop(MUST_HAPPEN), f"stopper-{i}") for i in range(3)
        ]
        for thread, _ in stoppers:
            wait_until_parked_inside(thread, "stop")
    finally:
        gate.open()
    for thread, _ in stoppers:
        join_or_fail(thread)
    [first, *others] = [outcome["result"] for _, outcome in stoppers]
    assert all(other is first for other in others)
    assert first.terminated
    assert supervisor.stop(0) is first


def test_entering_a_started_supervisor_enters_it_as_it_is_and_stops_it_on_exit() -> None:
    """`with supervisor.start():` works like `with open(...)`: the running object, stopped after."""
    ran = threading.Event()
    supervisor = Supervisor(stoppable(ran), name="entered", stop_timeout=MUST_HAPPEN)
    with supervisor.start() as entered:
        assert entered is supervisor
        assert ran.wait(MUST_HAPPEN)
        assert supervisor.healthy
    report = supervisor.stop(0)
    assert report.terminated
    assert alive_named("entered", "entered-supervisor") == []


def test_stop_on_a_never_started_supervisor_reports_terminated_and_then_start_is_refused() -> None:
    """Nothing ran, so nothing is still running; and it can no longer be started."""
    supervisor = Supervisor(stoppable(), name="never")
    report = supervisor.stop()
    assert report.terminated
    assert report.still_running == ()
    assert supervisor.stop(0) is report
    with pytest.raises(RuntimeError, match="already started or stopped"):
        supervisor.start()


@pytest.mark.parametrize("option", ["max_restarts", "window", "interval", "stop_timeout"])
def test_a_negative_option_is_refused_by_the_constructor(option: str) -> None:
    """Each bad option is named in the ValueError, before any thread exists."""
    with pytest.raises(ValueError, match=option):
        Supervisor(stoppable(), **{option: -1})  # type: ignore[arg-type]


def test_stop_refuses_a_negative_timeout_and_none_means_stop_timeout() -> None:
    """None is the supervisor's own budget, never "forever"; a negative timeout is an error."""
    gate = Gate("worker that ignores stop")
    supervisor = Supervisor(lambda stop: gate.arrive(), name="deaf", stop_timeout=0.2).start()
    try:
        gate.wait_reached()
        with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0"):
            supervisor.stop(-1)
        started = time.monotonic()
        report = supervisor.stop(None)
        assert time.monotonic() - started < 0.2 + NOISE
        assert report.still_running == ("deaf",)
    finally:
        gate.open()
    for thread in alive_threads("deaf", "deaf-supervisor"):
        join_or_fail(thread)


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
        assert report.still_running == ("deaf",)
        [record] = module_records(caplog, logging.ERROR)
        assert (
            record.getMessage()
            == "supervisor 'deaf': worker still running 0.2s after stop was requested"
        )
    finally:
        gate.open()
    assert supervisor.stop(MUST_HAPPEN) is report
    for thread in alive_threads("deaf", "deaf-supervisor"):
        join_or_fail(thread)  # it ends once it can, and its end is no death
    assert supervisor.deaths == []


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


def test_stop_from_the_worker_itself_is_a_request_that_returns_at_once() -> None:
    """The worker cannot wait for its own end: its stop() asks, names itself, and returns."""
    seen: dict[str, object] = {}
    supervisor: Supervisor | None = None

    def worker(stop: threading.Event) -> None:
        assert supervisor is not None
        seen["report"] = supervisor.stop(MUST_HAPPEN)
        seen["stop"] = stop.is_set()

    supervisor = Supervisor(worker, name="self-stopper")
    started = time.monotonic()
    supervisor.start()
    report = supervisor.stop(MUST_HAPPEN)
    assert time.monotonic() - started < NOISE  # the request did not wait for itself
    assert report.terminated
    assert report.deaths == ()  # it returned because it asked to stop: not a death
    assert seen["stop"] is True
    request = seen["report"]
    assert isinstance(request, SupervisorReport)
    assert not request.terminated
    assert "self-stopper" in request.still_running
    assert supervisor.stop(0) is report


def test_stop_from_a_restarted_worker_ends_supervision_without_joining_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A restarted worker is the supervisor's own thread too: its stop() is a request."""
    generation = iter(range(100))
    seen: dict[str, object] = {}

    def worker(stop: threading.Event) -> None:
        if next(generation) == 0:
            raise ValueError("first death")
        seen["report"] = supervisor.stop(MUST_HAPPEN)

    supervisor = Supervisor(worker, name="restarted", interval=0)
    with recording_hook() as uncaught:
        supervisor.start()
        wait_until(lambda: "report" in seen, "the worker recorded its report")
        report = supervisor.stop(MUST_HAPPEN)
    assert uncaught == []
    assert report.terminated
    assert report.restarts == 1
    assert [d.summary for d in report.deaths] == ["ValueError: first death"]
    request = seen["report"]
    assert isinstance(request, SupervisorReport)
    assert "restarted" in request.still_running
    assert "cannot join current thread" not in caplog.text


# --- P9: a consumer dies and its producer blocks forever -------------------------------------


def handle_until_poison(seen: list[str]) -> Callable[[str], None]:
    """A consumer's item handler that fails on the item ``"poison"``."""

    def handle(item: str) -> None:
        if item == "poison":
            raise ValueError("cannot handle poison")
        seen.append(item)

    return handle


@pytest.mark.race(*P9)
def test_naive_producer_blocks_forever_once_its_consumer_died(
    record_property: Callable[[str, object], None],
) -> None:
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
    started_at = time.monotonic()
    try:
        assert stays_blocked(producer)  # "a" filled the queue; "b" waits for nobody
        assert q.full()
    finally:
        assert q.get_nowait() == "a"  # the test plays consumer for one item...
        join_or_fail(producer)
    died_of = ", ".join(exc_type.__name__ for exc_type, _ in seen)
    record_property(
        "observed",
        f"consumer died of {died_of} (only excepthook was told), the producer blocked"
        f" {time.monotonic() - started_at:.1f}s until the test took an item",
    )
    assert q.get_nowait() == "b"  # ...and only then could the blocked put() deliver "b"
    assert "error" not in outcome
    assert handled == []


def test_queue_shutdown_frees_a_blocked_producer_on_313_and_does_not_exist_before() -> None:
    """3.13's Queue.shutdown(immediate=True) wakes a producer blocked on a full queue."""
    q: queue.Queue[str] = queue.Queue(maxsize=1)
    if sys.version_info < (3, 13):
        assert not hasattr(q, "shutdown")  # on 3.11 and 3.12: produce_until_consumer_dies
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


@pytest.mark.race(*P9)
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
            lambda: produce_until_consumer_dies(
                q, ["poison", "a", "b", "c"], alive=lambda: supervisor.healthy
            ),
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
        assert produce_until_consumer_dies(q, items, alive=lambda: supervisor.healthy) == []
        assert done.wait(MUST_HAPPEN)
        report = supervisor.stop(MUST_HAPPEN)
    assert handled == ["a", "b", "c"]
    assert report.restarts == 2
    assert [d.summary for d in report.deaths] == ["ValueError: cannot handle poison"] * 2


# --- the supervisor's start() is all or nothing; stop() is bounded even while starting ------


def alive_named(*names: str) -> list[str]:
    """Which of these thread names are still alive."""
    return [t.name for t in alive_threads(*names)]


def alive_threads(*names: str) -> list[threading.Thread]:
    """The threads of these names still alive."""
    return [t for t in threading.enumerate() if t.name in names and t.is_alive()]


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
    assert report.deaths == ()


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

    supervisor = Supervisor(stoppable(), name="racing")
    with thread_start_patched(2, start_at(gate)):  # the 1st start is the starter thread's
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
    assert report.still_running == ("racing",)
    assert outcome == {"result": supervisor}  # its threads started, saw the stop, ended
    assert supervisor.stop(MUST_HAPPEN) is report
    for thread in alive_threads("racing", "racing-supervisor"):
        join_or_fail(thread)
    assert supervisor.deaths == []


# --- the lifecycle contract on the paths users take -------------------------------

P25 = ("P25", "a Ctrl-C inside Thread.join() marks a live thread finished: the next report lies")
E1 = ("E1", "a handler that sets the event main is waiting on deadlocks")


def test_with_a_started_supervisor_enters_it_stops_it_and_the_program_exits() -> None:
    """``with Supervisor(...).start(): pass`` in a fresh interpreter ends at once with status 0."""
    code = """
from patterns.supervisor import Supervisor
with Supervisor(lambda stop: stop.wait(), name="entered").start() as supervisor:
    pass
print(supervisor.stop(0).terminated)
"""
    try:
        result = run_python(code, timeout=MUST_HAPPEN)
    except subprocess.TimeoutExpired:
        pytest.fail("the child never exited: a non-daemon thread was left running")
    assert (result.returncode, result.stdout) == (0, "True\n"), result.stderr


def test_a_report_cannot_say_terminated_while_naming_a_running_thread() -> None:
    """SupervisorReport refuses terminated=True with a non-empty still_running."""
    with pytest.raises(ValueError, match="terminated=True with still_running"):
        SupervisorReport(True, ("worker",), True, 0, (), 0.0)


def test_the_two_thread_failure_records_keep_the_same_fields() -> None:
    """supervisor.ThreadFailure is a copy of thread_exceptions.ThreadFailure: same names, types."""

    def shape(cls: type) -> list[tuple[str, object]]:
        return [(f.name, f.type) for f in dataclasses.fields(cls)]

    assert shape(ThreadFailure) == shape(thread_exceptions.ThreadFailure)
    assert typing.get_type_hints(ThreadFailure) == typing.get_type_hints(
        thread_exceptions.ThreadFailure
    )


@pytest.mark.race(*P25)
def test_ctrl_c_during_stop_propagates_and_the_next_report_still_names_the_running_worker() -> None:
    """Reports wait on each thread's own end signal, so a Ctrl-C inside stop() cannot fool them."""
    gate = Gate("worker that ignores stop")
    supervisor = Supervisor(lambda stop: gate.arrive(), name="deaf").start()
    gate.wait_reached()
    try:
        with signal_main_during("stop", parked=True), pytest.raises(KeyboardInterrupt):
            supervisor.stop(MUST_HAPPEN)
        report = supervisor.stop(0)
        assert not report.terminated
        assert "deaf" in report.still_running
    finally:
        gate.open()
    assert supervisor.stop(MUST_HAPPEN) is report
    for thread in alive_threads("deaf", "deaf-supervisor"):
        join_or_fail(thread)


@pytest.mark.parametrize("budget", [math.inf, 1e10, 1e300])
def test_an_unbounded_budget_waits_as_long_as_it_takes_and_never_overflows(budget: float) -> None:
    """Budgets of inf or huge values (stop_timeout, stop(), intervals) mean "until it ends"."""
    ran = threading.Event()
    supervisor = Supervisor(
        stoppable(ran), name="patient", stop_timeout=budget, window=budget, interval=budget
    ).start()
    assert ran.wait(MUST_HAPPEN)
    assert not supervisor.wait_unhealthy(0)
    assert supervisor.stop().terminated
    other = Supervisor(stoppable(), name="patient-too").start()
    assert other.stop(budget).terminated


@pytest.mark.parametrize("timeout", [math.inf, 1e300, None])
def test_wait_unhealthy_with_an_unbounded_timeout_waits_until_it_gives_up(
    timeout: float | None,
) -> None:
    """wait_unhealthy(inf), (1e300) and (None) block until the give-up, without overflow."""
    gate = Gate("worker about to die")

    def worker(stop: threading.Event) -> None:
        gate.arrive()
        raise ValueError("dies")

    supervisor = Supervisor(worker, name="doomed", max_restarts=0).start()
    gate.wait_reached()
    main = threading.main_thread()
    opener = threading.Thread(
        target=lambda: (wait_until_parked_inside(main, "wait_unhealthy"), gate.open()),
        name="opener",
    )
    opener.start()
    try:
        assert supervisor.wait_unhealthy(timeout)
    finally:
        gate.open()
        join_or_fail(opener)
    assert not supervisor.stop(MUST_HAPPEN).healthy


@pytest.mark.parametrize("bad", [math.nan, -1, -math.inf, True, "1", None, [1]])
def test_a_bad_number_of_seconds_is_a_value_error_naming_the_argument(bad: object) -> None:
    """nan, negative, bool and non-numbers are refused wherever seconds are taken."""
    for option in ["window", "interval", "stop_timeout"]:
        with pytest.raises(ValueError, match=f"{option} must be a number of seconds"):
            Supervisor(stoppable(), **{option: bad})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="check_every must be a number of seconds"):
        produce_until_consumer_dies(queue.Queue(), [1], alive=lambda: True, check_every=bad)  # type: ignore[arg-type]
    supervisor = Supervisor(stoppable(), name="bad")
    if bad is not None:  # None means "forever" for wait_unhealthy, stop_timeout for stop
        with pytest.raises(ValueError, match="timeout must be a number of seconds"):
            supervisor.wait_unhealthy(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="timeout must be a number of seconds"):
            supervisor.stop(bad)  # type: ignore[arg-type]
    assert supervisor.stop(0).terminated


@pytest.mark.race(*E1)
def test_stop_from_a_signal_handler_during_stop_returns_a_provisional_report_at_once() -> None:
    """A handler's stop() on the thread already inside stop() must not wait for itself."""
    setup = """
from patterns.supervisor import Supervisor
service = Supervisor(lambda stop: release.wait(20), name="w", stop_timeout=20).start()
"""
    # stop() first waits for the supervisor's thread, which ends at once; the signal must land
    # in the wait for the worker. The thread leaves threading.enumerate() only after its end
    # event has woken stop() from that first wait.
    settled = 'not any(t.name == "w-supervisor" for t in threading.enumerate())'
    assert handler_stops_during_stop(setup, settled) == "False ('w',) True True True\n"


@pytest.mark.race(*E1)
def test_stop_from_a_signal_handler_inside_the_stops_own_event_set_does_not_deadlock() -> None:
    """The handler's stop() must not set the stop event: the stop it interrupted may hold its lock.

    Forced: the signal lands inside that stop()'s ``stop.set()``. The handler's stop returns
    a provisional report at once; the interrupted stop goes on and records the end.
    """
    setup = "from patterns.supervisor import Supervisor as Kind"
    assert handler_stops_inside_the_stop_event_set(setup) == "False True True True\n"


def test_a_second_stop_waits_only_its_own_budget_and_its_report_is_not_recorded() -> None:
    """A stop racing a longer one returns provisionally on its own deadline; the first records."""
    gate = Gate("worker that ignores stop")
    supervisor = Supervisor(lambda stop: gate.arrive(), name="slow").start()
    gate.wait_reached()
    first, outcome = run_in_thread(lambda: supervisor.stop(MUST_HAPPEN), "first-stopper")
    try:
        wait_until_parked_inside(first, "stop")
        started = time.monotonic()
        second = supervisor.stop(0.2)
        assert time.monotonic() - started < 0.2 + NOISE
        assert not second.terminated
        assert second.still_running == ("slow",)
    finally:
        gate.open()
        join_or_fail(first)
    recorded = outcome["result"]
    assert recorded.terminated
    assert supervisor.stop(0) is recorded
    assert second is not recorded


def test_stop_from_a_callback_is_a_request_and_supervision_ends() -> None:
    """on_death runs on the supervisor's thread: its stop() asks and returns at once."""
    seen: dict[str, object] = {}

    def worker(stop: threading.Event) -> None:
        raise ValueError("dies once")

    def on_death(failure: ThreadFailure) -> None:
        started = time.monotonic()
        seen["report"] = supervisor.stop(MUST_HAPPEN)
        seen["took"] = time.monotonic() - started

    supervisor = Supervisor(worker, name="cb", interval=0, on_death=on_death)
    supervisor.start()
    wait_until(lambda: "took" in seen, "the callback recorded how long its stop took")
    report = supervisor.stop(MUST_HAPPEN)
    assert report.terminated
    assert report.restarts == 0  # the request came before the restart: none happened
    assert seen["took"] < NOISE
    request = seen["report"]
    assert isinstance(request, SupervisorReport)
    assert "cb-supervisor" in request.still_running
