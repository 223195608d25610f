"""Charts drawn for the notebooks are well-formed SVG with one mark per input."""

import xml.etree.ElementTree as ET

import pytest

from patterns.teaching.charts import bar_chart, timeline_chart

SVG = "{http://www.w3.org/2000/svg}"


def test_bar_chart_one_bar_per_input_and_well_formed() -> None:
    """Each (label, value) gives one bar and a value-with-unit label."""
    root = ET.fromstring(bar_chart([("a", 1.0), ("b", 2.5)], unit="ms"))
    assert len(root.findall(f"{SVG}rect")) == 2
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "2.5 ms" in texts


def test_bar_chart_escapes_labels() -> None:
    """Markup in labels and titles is escaped, so the SVG still parses."""
    root = ET.fromstring(bar_chart([("<a&b>", 1.0)], unit="ms", title="x<y"))
    assert "<a&b>" in [t.text for t in root.iter(f"{SVG}text")]


def test_bar_chart_refuses_empty_input() -> None:
    """No bars is a clear error, not an empty picture."""
    with pytest.raises(ValueError, match="at least one"):
        bar_chart([], unit="ms")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_bar_chart_refuses_a_value_it_cannot_draw(value: float) -> None:
    """A negative, infinite or NaN value is an error naming the bar, not a broken picture."""
    with pytest.raises(ValueError, match="'slow'"):
        bar_chart([("fast", 1.0), ("slow", value)], unit="ms")


def test_bar_chart_refuses_labels_too_long_for_any_bar() -> None:
    """A label that would squeeze the bars out is refused, not drawn off the picture."""
    with pytest.raises(ValueError, match="too long"):
        bar_chart([("x" * 80, 1.0)], unit="ms")


def _timeline(**overrides):
    arguments = {
        "times": [0.0, 0.5, 1.0, 1.5],
        "series": {"queued": [3, 2, 2, 0], "running": [1, 1, 0, 1], "done": [0, 1, 2, 3]},
        "markers": [(0.6, "SIGTERM"), (1.2, "restart")],
        "y_label": "jobs",
        "title": "jobs per state",
    }
    arguments.update(overrides)
    return ET.fromstring(timeline_chart(**arguments))


def _by_class(root, tag, name):
    return [e for e in root.iter(f"{SVG}{tag}") if e.get("class") == name]


def test_timeline_chart_one_line_and_one_legend_entry_per_series() -> None:
    """Each series is one step line, titled with its name, and one legend entry, in order."""
    root = _timeline()
    lines = _by_class(root, "path", "series")
    assert [line.find(f"{SVG}title").text for line in lines] == ["queued", "running", "done"]
    legend = [g.find(f"{SVG}text").text for g in _by_class(root, "g", "legend")]
    assert legend == ["queued", "running", "done"]
    assert len({line.get("stroke") for line in lines}) == 3  # told apart by colour
    assert len({line.get("stroke-dasharray") for line in lines}) == 3  # and by dash


def test_timeline_chart_step_line_has_one_step_per_sample() -> None:
    """A series of n samples is drawn as a move and n - 1 horizontal-then-vertical steps."""
    root = _timeline()
    d = _by_class(root, "path", "series")[0].get("d")
    assert d.startswith("M")
    assert d.count("H") == 3
    assert d.count("V") == 3


def test_timeline_chart_draws_markers_in_time_order_with_their_labels() -> None:
    """Each marker is a vertical line, left to right in time order, with its label."""
    root = _timeline(markers=[(0.2, "SIGTERM"), (0.25, "cancel"), (1.4, "restart")])
    xs = [float(line.get("x1")) for line in _by_class(root, "line", "marker")]
    assert xs == sorted(xs)
    assert len(set(xs)) == 3
    assert all(line.get("x1") == line.get("x2") for line in _by_class(root, "line", "marker"))
    labels = _by_class(root, "text", "marker-label")
    assert [t.text for t in labels] == ["SIGTERM", "cancel", "restart"]
    # Two labels 0.05 s apart would overlap: the second goes on a row of its own.
    assert labels[0].get("y") != labels[1].get("y")
    assert labels[0].get("y") == labels[2].get("y")


def test_timeline_chart_no_marker_line_crosses_a_label_below_it() -> None:
    """Close markers stack their labels downwards, each starting right of every line above."""
    root = _timeline(markers=[(0.5, "SIGTERM"), (0.52, "cancel"), (0.54, "stopped"), (0.6, "x")])
    lines = _by_class(root, "line", "marker")
    labels = _by_class(root, "text", "marker-label")
    assert len({label.get("y") for label in labels}) == 4  # four rows: each reaches the next
    for line in lines:
        for label in labels:
            if float(label.get("y")) > float(line.get("y1")):  # a label lower than the line's top
                assert float(label.get("x")) > float(line.get("x1"))


def test_timeline_chart_puts_a_label_at_the_right_edge_left_of_its_line() -> None:
    """A marker at the end of the axis has its label on the left, inside the picture."""
    root = _timeline(markers=[(2.0, "the last moment")])
    [line] = _by_class(root, "line", "marker")
    [label] = _by_class(root, "text", "marker-label")
    assert 0 <= float(label.get("x")) < float(line.get("x1"))


def test_timeline_chart_axis_covers_markers_outside_the_samples() -> None:
    """A marker after the last sample still lands inside the plot, right of every sample."""
    root = _timeline(markers=[(0.1, "SIGTERM"), (3.0, "restart")])
    [_, late] = [float(line.get("x1")) for line in _by_class(root, "line", "marker")]
    ends = [
        float(line.get("d").rsplit("H", 1)[1].split("V")[0])
        for line in _by_class(root, "path", "series")
    ]
    assert late > max(ends)
    assert late <= float(root.get("viewBox").split()[2])


def test_timeline_chart_escapes_every_text() -> None:
    """Markup in names, labels and titles is escaped, so the SVG still parses and shows it."""
    root = _timeline(
        series={"<q&a>": [1, 2, 3, 4]},
        markers=[(1.0, "kill -TERM <pid>")],
        title="a<b",
        y_label="&",
    )
    texts = {t.text for t in root.iter(f"{SVG}text")}
    assert {"<q&a>", "kill -TERM <pid>", "a<b", "&"} <= texts


def test_timeline_chart_scales_to_its_box() -> None:
    """A viewBox and a relative width: the picture shrinks to a phone's column."""
    root = _timeline()
    assert root.get("viewBox", "").startswith("0 0 ")
    assert root.get("width") == "100%"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"times": [], "series": {"queued": []}}, "at least one sample time"),
        ({"series": {}}, "at least one series"),
        ({"series": {"queued": [1, 2, 3]}}, "'queued' has 3 values for 4 sample times"),
        ({"series": {"queued": [1, float("nan"), 3, 4]}}, "'queued' has nan at sample 1"),
        ({"times": [0.0, 1.0, 0.5, 2.0]}, r"sample time 2 \(0.5\) is earlier"),
        ({"times": [0.0, float("inf"), 1.0, 2.0]}, "sample time 1 is inf"),
        (
            {"markers": [(1.2, "restart"), (0.6, "SIGTERM")]},
            "marker 'SIGTERM' at 0.6 comes before .*'restart' at 1.2",
        ),
        ({"markers": [(float("nan"), "SIGTERM")]}, "marker 'SIGTERM' is at nan"),
    ],
)
def test_timeline_chart_refuses_bad_input_naming_it(overrides, message) -> None:
    """Nothing to draw, mismatched lengths, NaNs and disorder are errors that say which."""
    with pytest.raises(ValueError, match=message):
        _timeline(**overrides)
