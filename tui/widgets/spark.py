"""A sparkline that costs one segment per run of equal colour, not one per cell.

Textual's Sparkline yields a Segment with its own blended Style for every cell and buckets with
Fractions; on a 200-column screen its four Overview charts took ~40 ms of every repaint, more than
the rest of the screen together. This one draws the same bars (the bucket's max, eighth-block
glyphs, the colour between min and max by the bar's height) with the colour quantised to
`LEVELS` steps, so that neighbouring columns of similar height share one Segment.
"""

from __future__ import annotations

from typing import ClassVar, Sequence

from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.style import Style
from textual.color import Color
from textual.strip import Strip
from textual.widget import Widget

BARS = "▁▂▃▄▅▆▇█"
LEVELS = 12


def columns(data: Sequence[float], width: int) -> list[float]:
    """One value per column: the max of its bucket (`width` <= the series' length)."""
    n = len(data)
    out = []
    for c in range(width):
        out.append(max(data[c * n // width:(c + 1) * n // width]))
    return out


class SparkBars:
    """The renderable: `height` lines of `width` cells. A series shorter than `width` takes one
    column per value, left-aligned (stretched, three steps would look like plateaus); a longer one
    is bucketed."""

    def __init__(self, data: Sequence[float], width: int, height: int, min_color: Color, max_color: Color) -> None:
        self.data = data
        self.width = max(1, width)
        self.height = max(1, height)
        self.styles = [Style(color=min_color.blend(max_color, level / (LEVELS - 1)).rich_color)
                       for level in range(LEVELS)]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines = self.lines()
        for i, line in enumerate(lines):
            yield from line
            if i < len(lines) - 1:
                yield Segment.line()

    def lines(self, base: Style | None = None) -> list[list[Segment]]:
        """The bars, top line first, each exactly `width` cells; every style on `base` (what
        `Segment.apply_style` would make of them), so a widget can keep them as its strips."""
        width, height = self.width, self.height
        styles = self.styles if base is None else [base + s for s in self.styles]
        if not self.data:  # nothing measured yet: no bars (a baseline would read as zeros)
            return [[Segment(" " * width, base)] for _ in range(height)]
        parts = len(BARS) * height - 1
        if len(self.data) == 1:  # as Textual draws one value: full columns in the max colour
            ratios, bars = [1.0], [parts + 1]
        else:
            values = columns(self.data, min(width, len(self.data)))
            low = min(self.data)  # the series' own range, as the chart's axis labels give it
            extent = max(self.data) - low or 1.0
            ratios = [(v - low) / extent for v in values]
            bars = [int(r * parts) for r in ratios]
        tone = [styles[min(LEVELS - 1, int(r * (LEVELS - 1) + 0.5))] for r in ratios]
        out = []
        for line in reversed(range(height)):
            floor, ceiling = line * len(BARS), (line + 1) * len(BARS)
            segments: list[Segment] = []
            run: list[str] = []
            run_style: Style | None = None
            for bar, style in zip(bars, tone):
                if bar < floor:
                    glyph, style = " ", base
                elif bar >= ceiling:
                    glyph = "█"
                else:
                    glyph = BARS[bar % len(BARS)]
                if style is not run_style and run:
                    segments.append(Segment("".join(run), run_style))
                    run = []
                run_style = style
                run.append(glyph)
            if run:
                segments.append(Segment("".join(run), run_style))
            if len(bars) < width:
                segments.append(Segment(" " * (width - len(bars)), base))
            out.append(segments)
        return out


class Spark(Widget):
    """The widget: set `data`; colours from the same component classes as Textual's Sparkline."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"sparkline--max-color", "sparkline--min-color"}
    DEFAULT_CSS = """
    Spark { height: 1; }
    Spark > .sparkline--max-color { color: $primary; }
    Spark > .sparkline--min-color { color: $primary 30%; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._data: tuple[float, ...] = ()
        self._drawn_key: tuple = ()
        self._drawn: list[Strip] = []

    @property
    def data(self) -> tuple[float, ...]:
        return self._data

    @data.setter
    def data(self, values: Sequence[float]) -> None:
        values = tuple(values)
        if values != self._data:
            self._data = values
            self.refresh()

    def render(self) -> SparkBars:
        _, base = self.background_colors
        return SparkBars(self._data, self.size.width, self.size.height,
                         base + self.get_component_styles("sparkline--min-color").color,
                         base + self.get_component_styles("sparkline--max-color").color)

    def render_line(self, y: int) -> Strip:
        """The bars' lines, drawn once per change of the data, size or style and kept (Textual's
        way, render() through a Visual and the console, took ~2 ms a chart every repaint). They
        are what that way draws: the bars' segments on the widget's style, cut into lines."""
        width, height = self.size
        style = self.visual_style.rich_style
        key = (self._data, width, height, style, self.app.current_theme.name)
        if key != self._drawn_key:
            self._drawn = [Strip(line, width) for line in self.render().lines(style)[:height]]
            self._drawn_key = key
        return self._drawn[y] if 0 <= y < len(self._drawn) else Strip.blank(width, style)
