"""What bench_ui_scale's UI worker records over its window, in memory it takes before the window.

The worker's RSS is reported as the UI's memory, so its own records must not grow through the
window. A dict per repaint (its ~28 parts' times in a dict of their own, ~1.9 KB), a float per
lag sample and a tuple per garbage collection held ~3.9 MB after 10 minutes at 1024 ranks (1,992
repaints), ~0.4 of the 1.1 MB/min that run reported as the UI's. Here each series is an array of
floats allocated (and written, so its pages are resident) for the window's expected samples;
beyond that it grows as a list would, still correct. Also the window's statistics (p95, the RSS
slope, each part's median).
"""

from __future__ import annotations

import statistics
from array import array

CYCLE_FIELDS = ("at", "tick_ms", "paint_ms", "tick_cpu_ms", "paint_cpu_ms", "paints", "segments_cpu_ms", "parted")
"""A repaint cycle's numbers; `parted`: 1 once its parts' times are in (at the next tick)."""


class Series:
    """Floats in an array of `capacity` taken up front (8 bytes each, no object per value)."""

    __slots__ = ("_data", "n")

    def __init__(self, capacity: int) -> None:
        self._data = array("d", bytes(8 * max(1, capacity)))
        self.n = 0

    def add(self, value: float) -> None:
        if self.n < len(self._data):
            self._data[self.n] = value
        else:
            self._data.append(value)
        self.n += 1

    def add_to_last(self, value: float) -> None:
        self._data[self.n - 1] += value

    def set_last(self, value: float) -> None:
        self._data[self.n - 1] = value

    def clear(self) -> None:
        self.n = 0

    def values(self) -> list[float]:
        return self._data[:self.n].tolist()

    def __len__(self) -> int:
        return self.n


class Cycles:
    """One row per refresh tick: CYCLE_FIELDS, and a column per part's name (0 where a cycle had
    none), each a Series of the same length."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.fields = {f: Series(capacity) for f in CYCLE_FIELDS}
        self.parts: dict[str, Series] = {}

    def __len__(self) -> int:
        return len(self.fields["at"])

    def start(self, **numbers: float) -> None:
        """A new cycle: the fields given, 0 for the others and its parts."""
        for name, column in self.fields.items():
            column.add(numbers.get(name, 0.0))
        for column in self.parts.values():
            column.add(0.0)

    def add_to_last(self, name: str, value: float) -> None:
        self.fields[name].add_to_last(value)

    def set_parts(self, parts: dict[str, float]) -> None:
        """The last cycle's parts' times (a name first seen gets its column, 0 for earlier cycles)."""
        n = len(self)
        for name, ms in parts.items():
            column = self.parts.get(name)
            if column is None:
                column = self.parts[name] = Series(max(self.capacity, n))
                for _ in range(n):
                    column.add(0.0)
            column.set_last(ms)
        self.fields["parted"].set_last(1.0)

    def clear(self) -> None:
        for column in (*self.fields.values(), *self.parts.values()):
            column.clear()

    def column(self, name: str, parted_only: bool = False) -> list[float]:
        values = (self.fields.get(name) or self.parts[name]).values()
        if not parted_only:
            return values
        return [v for v, done in zip(values, self.fields["parted"].values()) if done]


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def slope_per_min(series: list[float]) -> float | None:
    """The least-squares slope of a once-a-second series, per minute (None under 10 samples): a
    memory that keeps growing, told apart from one that steps up once and stays."""
    n = len(series)
    if n < 10:
        return None
    mean_x, mean_y = (n - 1) / 2, sum(series) / n
    sxx = sum((x - mean_x) ** 2 for x in range(n))
    return round(60 * sum((x - mean_x) * (y - mean_y) for x, y in enumerate(series)) / sxx, 3)


def parts_medians(cycles: Cycles) -> dict[str, list[float]]:
    """Each part's [median, p95] ms per repaint (0 in a repaint without it), and the compositor's
    own: the paint less its layout and widget renders."""
    series = {k: cycles.column(k, parted_only=True) for k in sorted(cycles.parts)}
    series = {k: v for k, v in series.items() if any(v)}
    if not series:
        return {}
    painted = [series[k] for k in series if k.startswith("paint:")]
    series["paint: compositor (rest)"] = [
        paint - sum(p[i] for p in painted) for i, paint in enumerate(cycles.column("paint_ms", parted_only=True))]
    return {k: [round(statistics.median(v), 2), round(p95(v), 2)] for k, v in series.items()}
