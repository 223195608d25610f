"""The race pictures: the tracer, the SVG it draws, and the scenarios the docs build runs."""

from __future__ import annotations

import asyncio
import itertools
import signal
import sys
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from patterns.teaching.lanes import MAX_WIDTH, Event, Tracer
from patterns.teaching.scenarios import LEGEND, SCENARIOS, pair_html

from .support import join_or_fail

SVG = "{http://www.w3.org/2000/svg}"


def first(tracer: Tracer, text: str, thread: str | None = None) -> Event:
    """The first event whose text contains ``text`` (in ``thread``'s lane, if given)."""
    for event in tracer.events:
        if text in event.text and (thread is None or event.thread == thread):
            return event
    raise AssertionError(f"no event {text!r} in {[e.text for e in tracer.events]}")


def bad(tracer: Tracer) -> list[Event]:
    """The events marked as the failure."""
    return [event for event in tracer.events if event.bad]


# --- the tracer ----------------------------------------------------------------------------


def test_marks_from_many_threads_get_one_lane_each_in_first_seen_order() -> None:
    """Every mark is kept, with its thread, and indices follow the timestamps."""
    tracer = Tracer()
    tracer.mark("main first")
    start = threading.Barrier(4)

    def marker() -> None:
        start.wait(10)
        for i in range(50):
            tracer.mark(f"mark {i}")

    threads = [threading.Thread(target=marker, name=f"t{i}") for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        join_or_fail(thread)

    events = tracer.events
    assert len(events) == 1 + 4 * 50
    assert [e.index for e in events] == list(range(len(events)))
    assert all(a.t_ns <= b.t_ns for a, b in itertools.pairwise(events))
    assert tracer.lanes[0] == "MainThread"
    assert sorted(tracer.lanes[1:]) == ["t0", "t1", "t2", "t3"]
    for name in ["t0", "t1", "t2", "t3"]:  # each thread's own marks stay in its order
        assert [e.text for e in events if e.thread == name] == [f"mark {i}" for i in range(50)]


def test_a_lane_can_be_named_in_advance_or_later() -> None:
    """A label replaces the thread's name in the picture; the thread name stays in the event."""
    tracer = Tracer(lanes={"MainThread": "main"})
    tracer.mark("x")
    tracer.name_lane("MainThread", "the main thread")
    assert tracer.label("MainThread") == "the main thread"
    assert tracer.label("other") == "other"
    assert tracer.events[0].thread == "MainThread"


def test_inside_an_asyncio_task_the_lane_is_the_tasks_name() -> None:
    """Tasks sharing one thread get a lane each; a thread of to_thread keeps the thread's name."""
    tracer = Tracer(tasks=True)

    async def worker() -> None:
        tracer.mark("in the task")
        await asyncio.sleep(0)
        await asyncio.to_thread(tracer.mark, "in a thread of the default executor")
        tracer.mark("explicit", lane="elsewhere")

    async def main() -> None:
        await asyncio.gather(
            asyncio.create_task(worker(), name="task-a"),
            asyncio.create_task(worker(), name="task-b"),
        )

    asyncio.run(main())
    tracer.mark("outside any loop")
    lanes = [e.thread for e in tracer.events]
    assert lanes[:2] == ["task-a", "task-b"]
    assert [e.thread for e in tracer.events if e.text == "in the task"] == ["task-a", "task-b"]
    in_thread = {e.thread for e in tracer.events if "default executor" in e.text}
    assert in_thread.isdisjoint({"task-a", "task-b", "MainThread"})
    assert {e.thread for e in tracer.events if e.text == "explicit"} == {"elsewhere"}
    assert lanes[-1] == threading.current_thread().name


def test_a_thread_tracer_keeps_the_threads_lane_inside_an_asyncio_task() -> None:
    """As in a notebook, whose kernel runs each cell in a task: the lane is the thread's."""
    tracer = Tracer(lanes={"MainThread": "main"})

    async def cell() -> None:
        tracer.mark("in the kernel's task")

    asyncio.run(cell())
    assert [tracer.label(lane) for lane in tracer.lanes] == ["main"]


# --- the picture ---------------------------------------------------------------------------


def two_lane_trace() -> Tracer:
    """Main closes; a worker fails because of it, and says so with a < and an &."""
    tracer = Tracer("a <title> & more", {"MainThread": "main"})
    closed = tracer.mark("out.close() <now>")

    def worker() -> None:
        tracer.mark("write() failed: a < b & c > d", bad=True, after=closed)

    thread = threading.Thread(target=worker, name="worker")
    thread.start()
    join_or_fail(thread)
    return tracer


def test_the_svg_is_well_formed_with_one_lane_per_thread() -> None:
    """The SVG parses as XML, has a viewBox, a lane label per thread and a mark per event."""
    tracer = two_lane_trace()
    root = ET.fromstring(tracer.svg())

    assert root.tag == f"{SVG}svg"
    assert len(root.get("viewBox", "").split()) == 4
    lanes = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "lane"]
    assert lanes == ["main", "worker"]
    assert len(list(root.iter(f"{SVG}circle"))) == 2
    assert [c.get("class") for c in root.iter(f"{SVG}circle")].count("bad") == 1
    assert len(list(root.iter(f"{SVG}polygon"))) == 1  # the arrow from the close to the failure


def test_the_html_escapes_every_text() -> None:
    """Angle brackets and ampersands in titles and events come back intact, not as markup."""
    tracer = two_lane_trace()
    tracer.name_lane("worker", "<b>worker</b>")
    html = tracer.html()
    texts = "".join(ET.fromstring(f"<div>{html}</div>").itertext())

    assert "a <title> & more" in texts
    assert "out.close() <now>" in texts
    assert "a < b & c > d" in texts
    assert "<b>worker</b>" not in html  # escaped in the source, present in the parsed text
    assert "<b>worker</b>: write() failed" in texts
    assert ET.fromstring(tracer.svg()).find(f"{SVG}title").text == "a <title> & more"


def test_the_key_gives_each_mark_its_number_lane_and_text_and_the_failure_in_red() -> None:
    """One list item per event, numbered as its mark; the bad one red."""
    tracer = two_lane_trace()
    key = ET.fromstring(f"<div>{tracer.html()}</div>").find("ol")
    assert key is not None
    items = key.findall("li")
    assert [li.get("value") for li in items] == ["1", "2"]
    assert "".join(items[1].itertext()).endswith("worker: write() failed: a < b & c > d")
    assert [li.get("class") for li in items] == [None, "bad"]


def test_columns_widen_the_time_axis_for_a_side_by_side_pair() -> None:
    """Two pictures drawn with the same columns share one width."""
    short, long = Tracer(), Tracer()
    short.mark("one")
    for i in range(12):
        long.mark(f"event {i}")
    width = [ET.fromstring(t.svg(columns=12)).get("viewBox", "").split()[2] for t in (short, long)]
    assert width[0] == width[1]


def test_the_svg_is_drawn_at_its_own_size_so_its_text_is_not_shrunk() -> None:
    """Width and height in px equal the viewBox (scale 1); no text under 11 px."""
    tracer = two_lane_trace()
    root = ET.fromstring(tracer.svg(width=300))
    _, _, width, height = root.get("viewBox", "").split()
    assert (root.get("width"), root.get("height")) == (width, height)
    assert width == "300"
    sizes = [
        float(t.get("font-size") or root.get("font-size") or 0) for t in root.iter(f"{SVG}text")
    ]
    assert min(sizes) >= 11


@pytest.mark.parametrize("key", sorted(SCENARIOS))
def test_each_pair_fits_a_phone_unscaled_with_both_halves_one_size(key: str) -> None:
    """Both SVGs of a figure are as wide as each other, and no wider than a phone's column."""
    figure = pair_html(key)
    halves = [
        div.find(f"{SVG}svg")
        for div in ET.fromstring(figure).iter("div")
        if div.get("class") == "race-lanes-one"
    ]
    widths = {svg.get("width") for svg in halves if svg is not None}
    assert len(halves) == 2
    assert len(widths) == 1, widths
    assert int(widths.pop() or 0) <= MAX_WIDTH
    assert LEGEND in figure


# --- the scenarios -------------------------------------------------------------------------


def test_each_scenario_lives_in_the_module_named_after_its_pattern() -> None:
    """``"x.p1"`` is written in ``patterns/teaching/scenarios/x.py``, and ``x`` is a pattern."""
    root = Path(__file__).resolve().parent.parent
    misplaced = []
    for key, scenario in SCENARIOS.items():
        module = key.split(".")[0]
        written_in = {scenario.naive.__module__, scenario.fixed.__module__}
        if written_in != {f"patterns.teaching.scenarios.{module}"}:
            misplaced.append(f"{key}: written in {sorted(written_in)}")
        if not (root / "patterns" / f"{module}.py").exists():
            misplaced.append(f"{key}: no patterns/{module}.py")
    assert not misplaced, misplaced


# Pitfalls that asyncio itself fixed in 3.13: there the naive run goes right.
FIXED_IN_3_13 = {"asyncio_shutdown.a13", "asyncio_shutdown.a14"}
BROKEN_HERE = sorted(
    key for key in SCENARIOS if sys.version_info < (3, 13) or key not in FIXED_IN_3_13
)


@pytest.mark.parametrize("key", sorted(SCENARIOS))
def test_each_naive_scenario_records_its_failure(key: str) -> None:
    """The naive run goes wrong, and the trace has the moment it did, marked bad."""
    tracer = SCENARIOS[key].naive()
    if key not in BROKEN_HERE:  # the version's own fix: nothing to mark
        assert bad(tracer) == []
        return
    assert bad(tracer), [e.text for e in tracer.events]
    ET.fromstring(f"<div>{tracer.html()}</div>")


@pytest.mark.parametrize("key", sorted(SCENARIOS))
def test_each_fixed_scenario_records_no_failure(key: str) -> None:
    """The pattern holds under the same interleaving: nothing in the trace is marked bad."""
    tracer = SCENARIOS[key].fixed()
    assert bad(tracer) == []
    assert len(tracer.lanes) >= 2
    ET.fromstring(f"<div>{tracer.html()}</div>")


# Where each naive run goes wrong: the lanes its red marks are on (the lane that failed or
# is stuck, never the one that only saw it).
FAILING_LANES = {
    "executor_shutdown.p1": {"worker_0"},
    "cancellation.c1": {"worker_0"},
    "poison_pill.p10": {"consumer-A", "consumer-B", "consumer-C"},  # less the pill's taker
    "closable_queue.p14": {"consumer-0", "consumer-1", "consumer-2"},
    "thread_exceptions.silent_death": {"MainThread"},  # it returns the exit status
    "supervisor.p9": {"producer"},
    "daemon_threads.p15": {"export"},
    "signal_handlers.p18": {"worker"},
    "signal_handlers.p22": {"MainThread"},
    "bulkhead.b1": {"request-0", "request-1"},
    "async_queue.a1": {"consumer-1", "consumer-2"},  # consumer-0 takes the one STOP
    "asyncio_shutdown.a7": {"stopper"},
    "asyncio_shutdown.a10": {"service", "save"},  # it leaves early; the save is cut
    "asyncio_shutdown.a11": {"save"},  # its failure reaches nobody
    "asyncio_shutdown.a12": {"owner"},  # held in its group past the deadline
    "asyncio_shutdown.a13": {"owner"},  # it goes on (3.11, 3.12)
    "asyncio_shutdown.a14": {"owner"},  # its count stays at 1 (3.11, 3.12)
    "asyncio_signals.a6": {"MainThread"},  # killed where its work waited
    "process_shutdown.m3": {"careful"},
    "process_shutdown.m8": {"worker"},
    "process_shutdown.m9": {"parent"},  # its join() waits as long as the item
    "process_shutdown.m10": {"parent"},  # its map() waits for a result that never comes
    "process_shutdown.m11": {"parent"},  # its terminate() waits for the deaf worker
    "process_shutdown.m12": {"parent"},  # its join() waits on the dead worker's lock
    "server_shutdown.w2": {"handler A", "handler B"},
}


@pytest.mark.parametrize("key", BROKEN_HERE)
def test_the_red_mark_is_on_the_lane_that_fails(key: str) -> None:
    """Not on the observer's lane: on the thread, task or process that is stuck or failed."""
    tracer = SCENARIOS[key].naive()
    expected = set(FAILING_LANES[key])
    if key == "poison_pill.p10":  # any one of the three may take the one pill
        expected.discard(first(tracer, "took a pill").thread)
    assert {e.thread for e in bad(tracer)} == expected


def test_the_main_lane_is_main_when_drawn_from_inside_an_asyncio_task() -> None:
    """A notebook's kernel runs each cell in an asyncio task: the picture still says "main"."""

    async def cell() -> list[list[str]]:
        return [
            [tracer.label(lane) for lane in tracer.lanes]
            for key, scenario in SCENARIOS.items()
            if not key.startswith(
                (
                    "asyncio_signals",
                    "daemon_threads",
                    "process_shutdown",
                    "server_shutdown",
                    "signal_handlers",
                )
            )
            for tracer in (scenario.naive(), scenario.fixed())
        ]

    labels = asyncio.run(cell())
    assert all("main" in lanes for lanes in labels), labels
    assert not [lane for lanes in labels for lane in lanes if lane.startswith("Task-")]


def test_p1_naive_close_comes_before_the_failed_write_and_fixed_after_the_write() -> None:
    """P1: naive, the close overtakes the write; fixed, the close waits for it."""
    naive = SCENARIOS["executor_shutdown.p1"].naive()
    close, [failed] = first(naive, "out.close()"), bad(naive)
    assert (close.thread, failed.thread) == ("MainThread", "worker_0")
    assert close.index < failed.index
    assert failed.after == close.index
    assert "closed file" in failed.text

    fixed = SCENARIOS["executor_shutdown.p1"].fixed()
    assert first(fixed, "write('result') done").index < first(fixed, "out.close()").index
    assert "'result'" in first(fixed, "when it was closed").text


def test_c1_naive_runs_steps_after_the_cancel_and_fixed_stops_after_the_current_one() -> None:
    """C1: every step after the cancel runs naive; none does with crunch."""
    naive = SCENARIOS["cancellation.c1"].naive()
    cancel, [late] = first(naive, "token.cancel"), bad(naive)
    assert cancel.index < late.index
    assert late.text.startswith("step(1)")
    assert "returned 4" in first(naive, "returned", "worker_0").text

    fixed = SCENARIOS["cancellation.c1"].fixed()
    assert [e.text for e in fixed.events if e.text.startswith("step(")] == ["step(0)"]
    assert first(fixed, "token.cancel").index < first(fixed, "raised Cancelled").index


def test_p10_naive_strands_two_consumers_and_fixed_ends_all_three() -> None:
    """P10: after one pill exactly one consumer returns before the failure; fixed, all three."""
    naive = SCENARIOS["poison_pill.p10"].naive()
    stranded = bad(naive)[0]
    returned = [e for e in naive.events if e.text.startswith("took a pill")]
    assert len([e for e in returned if e.index < stranded.index]) == 1
    assert returned[0].thread not in {e.thread for e in bad(naive)}
    assert len(returned) == 3  # the two others only after the scenario's extra pills

    fixed = SCENARIOS["poison_pill.p10"].fixed()
    returned = [e for e in fixed.events if e.text.startswith("took a pill")]
    assert len(returned) == 3
    assert all(first(fixed, "send_pills").index < e.index for e in returned)


def test_p14_naive_ignores_the_flag_and_fixed_wakes_every_consumer_on_shutdown() -> None:
    """P14: the flag changes nothing until wake-up items come; shutdown() wakes all three."""
    naive = SCENARIOS["closable_queue.p14"].naive()
    stop = first(naive, "stop.set()")
    assert all(stop.index < e.index for e in bad(naive))
    assert len([e for e in bad(naive) if "as if it were data" in e.text]) == 3

    fixed = SCENARIOS["closable_queue.p14"].fixed()
    shutdown = first(fixed, "q.shutdown()")
    woken = [e for e in fixed.events if "ShutDown" in e.text]
    assert len(woken) == 3
    assert all(e.after == shutdown.index for e in woken)


def test_silent_death_naive_exits_0_and_fixed_logs_and_exits_1() -> None:
    """A worker's ValueError leaves status 0 naive; run_main logs it and returns 1."""
    naive = SCENARIOS["thread_exceptions.silent_death"].naive()
    assert bad(naive)[-1].text.startswith("exit status 0")
    assert first(naive, "raises ValueError").thread == "worker"

    fixed = SCENARIOS["thread_exceptions.silent_death"].fixed()
    logged = first(fixed, "logs ERROR", "worker")
    assert "bad row 3" in logged.text
    assert logged.index < first(fixed, "exit status 1").index


def test_p9_naive_producer_blocks_after_the_death_and_fixed_returns_what_is_left() -> None:
    """P9: naive, the put blocks after the consumer died; fixed, the producer returns 'b'."""
    naive = SCENARIOS["supervisor.p9"].naive()
    [blocked] = bad(naive)
    assert first(naive, "dies of ValueError", "consumer").index < blocked.index

    fixed = SCENARIOS["supervisor.p9"].fixed()
    died = first(fixed, "died", "consumer")
    returned = first(fixed, "returned ['b']", "producer")
    assert first(fixed, "lets the consumer fail").index < died.index < returned.index


def test_b1_naive_light_waits_for_the_heavy_query_and_fixed_is_answered_during_it() -> None:
    """B1: naive, /light is answered only after the heavy query; fixed, while it runs."""
    naive = SCENARIOS["bulkhead.b1"].naive()
    ends = first(naive, "the heavy query ends")
    assert bad(naive)[0].index < ends.index < first(naive, "answers /light").index

    fixed = SCENARIOS["bulkhead.b1"].fixed()
    assert "503" in first(fixed, "answers /heavy (2)").text
    assert first(fixed, "answers /light: 200").index < first(fixed, "the heavy query ends").index


def test_p15_naive_child_leaves_the_file_without_end_and_fixed_writes_it_before_exit() -> None:
    """P15 in a child: naive, no finally and no END; fixed, the finally runs after main."""
    naive = SCENARIOS["daemon_threads.p15"].naive()
    export = [e.text for e in naive.events if e.thread == "export"]
    assert export[-2:] == ["writes row 2", "abandoned at exit: its finally never ran"]
    assert "'row 2'" in first(naive, "child exited 0").text

    fixed = SCENARIOS["daemon_threads.p15"].fixed()
    assert first(fixed, "main returns").index < first(fixed, "finally: writes END").index
    assert "'END'" in first(fixed, "child exited 0").text


def test_a6_naive_child_dies_where_it_waits_and_fixed_runs_its_finally_then_exits_0() -> None:
    """A6 in a child: naive, SIGTERM ends asyncio.run with no finally; fixed, a clean stop."""
    naive = SCENARIOS["asyncio_signals.a6"].naive()
    assert [e.text for e in naive.events if e.thread == "MainThread"] == [
        "work: serves; waits for stop",
        "killed where it waited: no finally",
    ]
    assert first(naive, f"child exited {-signal.SIGTERM}").index > first(naive, "SIGTERM").index

    fixed = SCENARIOS["asyncio_signals.a6"].fixed()
    after = [e.text for e in fixed.events if e.index > first(fixed, "SIGTERM").index]
    assert after == [
        "stop is set: finishes what is in flight, returns",
        "finally runs",
        "asyncio.run returned",
        "child exited 0",
    ]


def test_p18_naive_child_dies_in_its_job_and_fixed_hands_it_back_and_cleans_up() -> None:
    """P18 in a child: naive, SIGTERM ends it with nothing run; fixed, every cleanup, then 0."""
    naive = SCENARIOS["signal_handlers.p18"].naive()
    sigterm = first(naive, "SIGTERM", "parent")
    assert [e.text for e in naive.events if e.thread == "worker"] == [
        "takes job b; looks at stop between steps",
        "killed in job b: not finished, not handed back",
    ]
    assert not [e for e in naive.events if e.index > sigterm.index and e.thread == "MainThread"]
    assert first(naive, f"child exited {-signal.SIGTERM}").index > sigterm.index

    fixed = SCENARIOS["signal_handlers.p18"].fixed()
    after = [e.text for e in fixed.events if e.index > first(fixed, "SIGTERM").index]
    assert after == [
        "stop is set: hands job b back, returns",
        "cleanup: closes the session",
        "finally runs",
        "atexit handler runs",
        "child exited 0",
    ]


def test_b1_the_naive_title_and_the_caption_name_the_same_executor() -> None:
    """One worker and an unbounded queue, in the title and in the caption alike."""
    title, caption = SCENARIOS["bulkhead.b1"].naive().title, SCENARIOS["bulkhead.b1"].caption
    assert "1 worker, unbounded queue" in title
    assert "one worker and an unbounded queue" in caption


def test_p22_naive_child_sleeps_through_a_workers_signal_and_fixed_wakes() -> None:
    """P22 in a child: naive, on_stop waits for the parent's second signal; fixed, it does not."""
    naive = SCENARIOS["signal_handlers.p22"].naive()
    [asleep] = bad(naive)
    assert first(naive, "signal delivered", "helper").index < asleep.index
    assert asleep.index < first(naive, "on_stop()").index
    assert first(naive, "on_stop()").thread == "MainThread"

    fixed = SCENARIOS["signal_handlers.p22"].fixed()
    assert first(fixed, "on_stop()").thread not in {"MainThread", "parent"}
    assert first(fixed, "on_stop()").index < first(fixed, "wakes: stopped").index
    assert not any("to the process" in e.text for e in fixed.events)


def test_a1_naive_stop_ends_one_consumer_task_and_fixed_shutdown_ends_all_three() -> None:
    """A1, tasks as lanes: naive, one task returns and two wait; fixed, all three after shutdown."""
    naive = SCENARIOS["async_queue.a1"].naive()
    waiting = bad(naive)[0]
    returned = [e for e in naive.events if e.text.startswith("took STOP")]
    assert [e.thread for e in returned if e.index < waiting.index] == [returned[0].thread]
    assert len(returned) == 3  # the two others only after the scenario's extra STOPs
    assert returned[0].thread not in {e.thread for e in bad(naive)}
    handled = [e for e in naive.events if e.text.startswith("handles item")]
    assert len(handled) == 6
    assert all(e.index < waiting.index for e in handled)
    assert {e.thread for e in naive.events} == {"main", "consumer-0", "consumer-1", "consumer-2"}

    fixed = SCENARIOS["async_queue.a1"].fixed()
    shutdown = first(fixed, "q.shutdown()", "main")
    ended = [e for e in fixed.events if "QueueShutDown" in e.text]
    assert len(ended) == 3
    assert all(e.after == shutdown.index for e in ended)
    assert max(e.index for e in fixed.events if e.text.startswith("handles item")) < min(
        e.index for e in ended
    )
    assert "6 items handled" in first(fixed, "gather() returned", "main").text


def test_a7_naive_gather_waits_for_the_stubborn_task_and_fixed_names_it_on_the_deadline() -> None:
    """A7: naive, gather ends only when the scenario releases the task; fixed, before that."""
    naive = SCENARIOS["asyncio_shutdown.a7"].naive()
    caught = first(naive, "catches CancelledError", "stubborn")
    [hanging] = bad(naive)
    assert first(naive, "cancel each", "stopper").index == caught.after
    assert caught.index < hanging.index < first(naive, "released", "stubborn").index
    assert first(naive, "released").index < first(naive, "gather returned", "stopper").index

    fixed = SCENARIOS["asyncio_shutdown.a7"].fixed()
    returned = first(fixed, "returned: terminated=False", "stopper")
    assert "still_running=('stubborn',)" in returned.text
    assert "cancelled=('sleeper',)" in returned.text
    assert first(fixed, "catches CancelledError").index < returned.index
    assert returned.index < first(fixed, "released", "stubborn").index


def test_m3_naive_terminate_leaves_no_cleanup_and_fixed_stop_runs_finally_and_atexit() -> None:
    """M3, processes as lanes: naive, the child's last mark is its wait; fixed, cleanup, exit 0."""
    naive = SCENARIOS["process_shutdown.m3"].naive()
    assert naive.lanes == ("parent", "careful")
    assert [e.text for e in naive.events if e.thread == "careful"] == [
        "ready; waits in stop.wait()",
        # the parent's mark, from the exit code
        "ended by SIGTERM inside stop.wait(): no finally, no atexit",
    ]
    [failed] = bad(naive)
    assert first(naive, "terminate()", "parent").index < failed.index
    assert first(naive, f"exit code {-signal.SIGTERM}", "parent").index > failed.index

    fixed = SCENARIOS["process_shutdown.m3"].fixed()
    child = [e.text.split(":")[0] for e in fixed.events if e.thread == "careful"]
    assert child == [
        "ready; waits in stop.wait()",
        "stop.wait() returned",
        "finally",
        "atexit handler runs",
    ]
    asked = first(fixed, "child.stop()", "parent")
    returned = first(fixed, "stop() returned: exit code 0, escalation none", "parent")
    assert asked.index < first(fixed, "stop.wait() returned", "careful").index
    assert first(fixed, "atexit", "careful").index < returned.index


def test_w2_naive_exits_under_both_requests_and_fixed_answers_a_and_closes_b_first() -> None:
    """W2: naive, no client is answered; fixed, /ready fails, A is answered, B forced, exit 0."""
    naive = SCENARIOS["server_shutdown.w2"].naive()
    assert [e.text for e in naive.events if e.thread == "clients"] == [
        "A gets no answer (RemoteDisconnected)",
        "B gets no answer (RemoteDisconnected)",
    ]
    fixed = SCENARIOS["server_shutdown.w2"].fixed()
    texts = [e.text for e in fixed.events]
    assert "GET /ready: 503" in texts
    assert "A gets 200 b'ok\\n', Connection: close" in texts
    assert texts.index("listener closed") < texts.index("closing B")
    assert "report: completed 1, interrupted 1" in texts
    assert texts[-1] == "the server exited 0"


def test_an_asyncio_scenario_runs_even_where_an_event_loop_already_runs() -> None:
    """As in a notebook, whose kernel runs a loop: the scenario's loop gets a thread of its own."""

    async def from_inside_a_loop() -> Tracer:
        return SCENARIOS["async_queue.a1"].naive()

    assert bad(asyncio.run(from_inside_a_loop()))


def test_the_caption_says_what_a_lane_is() -> None:
    """Thread pictures say threads; asyncio pictures say tasks."""
    assert "Each lane is an asyncio task" in pair_html("asyncio_shutdown.a7")
    assert "Each lane is a thread;" in pair_html("cancellation.c1")


def test_a_foreign_event_older_than_the_last_one_is_refused() -> None:
    """Events from a child are merged in time order; one out of order is an error, not a guess."""
    tracer = Tracer()
    tracer.record(200, "child", "late")
    with pytest.raises(ValueError, match="older than the last one"):
        tracer.record(100, "child", "early")


def test_a10_naive_service_ends_before_its_save_is_cut_and_fixed_after_it_is_written() -> None:
    """A10: the naive service leaves at once and its save is cut; shielded waits for the save."""
    naive = SCENARIOS["asyncio_shutdown.a10"].naive()
    left, cut = first(naive, "CancelledError at once"), first(naive, "cancelled by asyncio.run")
    assert (left.thread, cut.thread) == ("service", "save")
    assert left.index < cut.index
    assert not [e for e in naive.events if e.text == "the state is written"]

    fixed = SCENARIOS["asyncio_shutdown.a10"].fixed()
    written, raised = first(fixed, "the state is written"), first(fixed, "the save ended")
    assert written.index < raised.index
    assert not bad(fixed)


def test_m9_naive_join_blocks_until_the_item_ends_and_fixed_gives_the_item_up_on_its_deadline() -> (
    None
):
    """M9: join() returns only after the item; shutdown_mp_pool ends it and names it lost."""
    naive = SCENARIOS["process_shutdown.m9"].naive()
    blocked, done = first(naive, "join() still blocked"), first(naive, "the item is done", "worker")
    returned = first(naive, "join() returned only now")
    assert blocked.bad
    assert blocked.index < done.index < returned.index

    fixed = SCENARIOS["process_shutdown.m9"].fixed()
    ended, returned = first(fixed, "ended by terminate()", "worker"), first(fixed, "returned on")
    assert ended.index < returned.index
    assert "lost=('item',)" in returned.text
    assert not [e for e in fixed.events if e.text.startswith("the item is done")]
    assert not bad(fixed)


def test_m10_naive_map_gets_nothing_after_the_kill_and_fixed_returns_at_once_with_it_lost() -> None:
    """M10: the pool replaces the killed worker silently; shutdown_mp_pool names the loss."""
    naive = SCENARIOS["process_shutdown.m10"].naive()
    kill, replaced = first(naive, "os.kill"), first(naive, "a new worker in its place")
    nothing = first(naive, "no result and no error")
    assert kill.index < replaced.index < nothing.index
    assert bad(naive) == [nothing]

    fixed = SCENARIOS["process_shutdown.m10"].fixed()
    kill, returned = first(fixed, "os.kill"), first(fixed, "returned at once")
    assert kill.index < returned.index
    assert "lost=('map',)" in returned.text
    assert not [e for e in fixed.events if e.text.startswith("finally")]


def test_a11_naive_failure_is_only_reported_when_freed_and_fixed_is_logged_before_the_cancel() -> (
    None
):
    """A11: the naive service leaves first, the save's OSError is heard of only at the free."""
    naive = SCENARIOS["asyncio_shutdown.a11"].naive()
    left, fails = first(naive, "ends at once", "service"), first(naive, "raises OSError", "save")
    (unheard,) = bad(naive)
    assert left.index < fails.index < unheard.index
    assert unheard.thread == "save"
    assert "Task exception was never retrieved" in unheard.text

    fixed = SCENARIOS["asyncio_shutdown.a11"].fixed()
    fails = first(fixed, "raises OSError", "save")
    logged = first(fixed, "logs ERROR: save failed", "service")
    raised = first(fixed, "CancelledError is raised now", "service")
    assert fails.index < logged.index < raised.index
    assert not [e for e in fixed.events if "never retrieved" in e.text]


def test_a12_naive_owner_outlives_its_deadline_and_fixed_stop_names_the_child_on_time() -> None:
    """A12: the naive owner stays in its group; stop() returns first, naming the stubborn child."""
    naive = SCENARIOS["asyncio_shutdown.a12"].naive()
    caught, cancels = first(naive, "catches a cancel", "stubborn"), first(naive, "cancel() twice")
    (held,) = bad(naive)
    released = first(naive, "released", "stubborn")
    assert caught.index < cancels.index < held.index < released.index
    assert held.thread == "owner"

    fixed = SCENARIOS["asyncio_shutdown.a12"].fixed()
    returned = first(fixed, "stop() returned on its deadline", "main")
    released = first(fixed, "released", "stubborn")
    assert returned.index < released.index
    assert "('stubborn',)" in returned.text
    assert first(fixed, "leaves the group", "owner").index > released.index


def test_a13_the_naive_owner_goes_on_before_3_13_and_fixed_stops_on_every_version() -> None:
    """A13: after its except*, the naive owner goes on (3.11, 3.12); the fixed one stops."""
    expected = "CancelledError at its next await" if sys.version_info >= (3, 13) else "goes on"
    naive = SCENARIOS["asyncio_shutdown.a13"].naive()
    fails = first(naive, "its finally fails", "child")
    logged = first(naive, "logs ERROR", "owner")
    assert fails.index < logged.index < first(naive, expected, "owner").index
    assert f"{sys.version_info[0]}.{sys.version_info[1]}" in naive.title

    fixed = SCENARIOS["asyncio_shutdown.a13"].fixed()
    handled = first(fixed, "except* OSError: 1 failure", "owner")
    assert handled.index < first(fixed, "CancelledError at its next await", "owner").index


def test_a14_the_naive_count_stays_at_1_before_3_13_and_fixed_is_0_on_every_version() -> None:
    """A14: after the recipe stopped the group, cancelling() is 1 (3.11, 3.12); fixed, 0."""
    count = 0 if sys.version_info >= (3, 13) else 1
    naive = SCENARIOS["asyncio_shutdown.a14"].naive()
    raised = first(naive, "raises _Stop", "stopper")
    left = first(naive, f"cancelling() is {count}", "owner")
    assert raised.index < left.index
    assert left.bad == bool(count)

    fixed = SCENARIOS["asyncio_shutdown.a14"].fixed()
    cancelled = first(fixed, "cancelled by the group", "idle")
    assert cancelled.index < first(fixed, "cancelling() is 0", "owner").index
    assert "Drawn on Python" in SCENARIOS["asyncio_shutdown.a14"].caption


def test_m11_naive_terminate_waits_past_the_ignored_sigterm_and_fixed_kills_on_its_budget() -> None:
    """M11: the deaf worker holds terminate() until killed; shutdown_mp_pool kills it itself."""
    naive = SCENARIOS["process_shutdown.m11"].naive()
    ignored = first(naive, "SIGTERM arrives: ignored", "worker")
    (waiting,) = bad(naive)
    killed, left = (
        first(naive, "killed by the scenario", "worker"),
        first(naive, "returned only now"),
    )
    assert ignored.index < waiting.index < killed.index < left.index

    fixed = SCENARIOS["process_shutdown.m11"].fixed()
    ignored = first(fixed, "SIGTERM arrives: ignored", "worker")
    killed = first(fixed, "killed by SIGKILL", "worker")
    returned = first(fixed, "returned within its budget", "parent")
    assert ignored.index < killed.index < returned.index
    assert "lost=('item',)" in returned.text


def test_m12_naive_join_hangs_on_the_dead_workers_lock_and_fixed_ends_the_pool() -> None:
    """M12: the replacement starves and join() waits; shutdown_mp_pool reaps and frees the lock."""
    naive = SCENARIOS["process_shutdown.m12"].naive()
    fixed = SCENARIOS["process_shutdown.m12"].fixed()
    for run in (naive, fixed):
        killed = first(run, "killed, the lock still held", "worker")
        assert killed.index < first(run, "waits for the lock", "replacement").index
    (waiting,) = bad(naive)
    assert "join() still blocked" in waiting.text
    freed, returned = first(naive, "frees the lock"), first(naive, "returned only now")
    assert waiting.index < freed.index < returned.index

    reaped = first(fixed, "killed and reaped", "replacement")
    assert reaped.index < first(fixed, "terminated=True", "parent").index
