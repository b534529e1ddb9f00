"""The Overview's sparkline against Textual's own (the reference it replaces): the same glyphs in
every cell, each cell's colour within half a quantisation step of Textual's blend."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.segment import Segment
from textual.color import Color
from textual.renderables.sparkline import Sparkline

from ringtop.tui.widgets.spark import LEVELS, SparkBars

LOW, HIGH = Color(0, 40, 80), Color(0, 200, 255)


def cells(renderable, width: int) -> list[list[tuple[str, tuple[int, int, int] | None]]]:
    """Per line, per cell: its glyph and colour (None: no colour)."""
    console = Console(width=width, color_system="truecolor", legacy_windows=False)
    lines = Segment.split_lines(console.render(renderable, console.options.update_width(width)))
    out = []
    for line in lines:
        row = []
        for seg in line:
            color = seg.style.color.get_truecolor() if seg.style and seg.style.color else None
            row += [(ch, None if ch == " " else tuple(color) if color else None) for ch in seg.text]
        out.append(row)
    return out


def compare(data: list[float], width: int, height: int) -> None:
    shown = min(width, len(data))
    ours = cells(SparkBars(data, width, height, LOW, HIGH), width)
    theirs = cells(Sparkline(data, width=shown, height=height, min_color=LOW.rich_color,
                             max_color=HIGH.rich_color), shown)
    assert len(ours) == height == len(theirs)
    step = max(abs(a - b) for a, b in zip(HIGH.rgb, LOW.rgb)) / (LEVELS - 1)
    for mine, ref in zip(ours, theirs):
        assert "".join(g for g, _ in mine[:shown]) == "".join(g for g, _ in ref)
        assert all(g == " " for g, _ in mine[shown:])  # a short series: one column per value, the rest blank
        for (_, a), (_, b) in zip(mine, ref):
            assert (a is None) == (b is None)
            if a is not None:
                assert max(abs(x - y) for x, y in zip(a, b)) <= step / 2 + 1


@settings(max_examples=150, deadline=None)
@given(data=st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=2, max_size=400),
       width=st.integers(1, 220), height=st.integers(1, 6))
def test_same_bars_as_textuals_sparkline(data, width, height):
    compare(data, width, height)


def test_one_value_and_a_flat_series_and_no_data():
    compare([3.0], 20, 3)
    compare([5.0] * 30, 20, 2)
    assert cells(SparkBars([], 7, 2, LOW, HIGH), 7) == [[(" ", None)] * 7] * 2  # no baseline before data


def test_the_comparison_sees_a_wrong_bar():
    """The reference check bites: a series whose last value differs draws a different last column."""
    data = [1.0, 2.0, 3.0, 4.0]
    ours = cells(SparkBars(data[:-1] + [1.5], 4, 2, LOW, HIGH), 4)
    theirs = cells(Sparkline(data, width=4, height=2, min_color=LOW.rich_color, max_color=HIGH.rich_color), 4)
    assert ["".join(g for g, _ in line) for line in ours] != ["".join(g for g, _ in line) for line in theirs]


async def test_the_widget_draws_what_textual_draws_from_its_render_and_draws_again_on_new_data():
    """Spark keeps its drawn lines (render_line) until its data changes: each drawing equals the
    one Textual makes of the same widget's render() (Widget.render_line, through the console)."""
    from textual.app import App
    from textual.widget import Widget

    from ringtop.tui.widgets.spark import Spark

    class Charts(App):
        CSS = "Spark { height: 3; width: 40; }"

        def compose(self):
            yield Spark(id="spark")

    def lines(widget: Spark, textuals: bool) -> list[list[tuple[str, object]]]:
        draw = (lambda y: Widget.render_line(widget, y)) if textuals else widget.render_line
        if textuals:
            widget._dirty_regions.add(widget.region)  # Textual's own cache: draw afresh
        return [[(seg.text, seg.style) for seg in draw(y)] for y in range(3)]

    async with Charts().run_test(size=(60, 10)) as pilot:
        spark = pilot.app.query_one(Spark)
        drawn = []
        for data in ((1.0, 3.0, 2.0, 5.0), (5.0, 1.0, 1.0, 4.0, 2.0)):
            spark.data = data
            await pilot.pause()
            ours = lines(spark, textuals=False)
            assert ours == lines(spark, textuals=True)
            assert "".join(text for line in ours for text, _ in line).strip(), "bars were drawn"
            drawn.append(ours)
        assert drawn[0] != drawn[1], "new data, new bars"
