"""Charts drawn for the notebooks are well-formed SVG with one mark per input."""

import xml.etree.ElementTree as ET

import pytest

from patterns.teaching.charts import bar_chart

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
