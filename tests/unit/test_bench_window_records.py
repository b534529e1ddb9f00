"""bench_ui_scale's records of its window (benchmarks/_window_records.py): the worker's RSS is
reported as the UI's memory, so what it records per repaint, per lag sample and per second takes
its memory before the window and none during it."""

from __future__ import annotations

import importlib.util
import statistics
import sys
import tracemalloc
from pathlib import Path

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "_window_records.py"
_spec = importlib.util.spec_from_file_location("bench_window_records", PATH)
records = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = records
_spec.loader.exec_module(records)

PARTS = [f"paint: render W{i}" for i in range(18)] + [f"tick: part {i}" for i in range(12)]
"""About as many parts as a 1024-rank repaint is timed in."""


def _repaint(cycles, i: int) -> None:
    cycles.start(at=float(i), tick_ms=1.0 + i % 7, tick_cpu_ms=0.5)
    cycles.add_to_last("paint_ms", 2.0)
    cycles.add_to_last("paints", 1)
    cycles.set_parts({name: 0.01 * (k + 1) for k, name in enumerate(PARTS)})


def test_a_window_of_repaints_takes_no_memory_while_it_runs():
    capacity = 2_000
    cycles, lags = records.Cycles(capacity), records.Series(capacity)
    _repaint(cycles, 0)  # every part's column made, as in the warm-up before the window
    cycles.clear()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(capacity):
            _repaint(cycles, i)
            lags.add(float(i % 5))
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(cycles) == capacity and len(lags) == capacity
    assert grown < 16 * 1024, f"{grown} bytes taken by {capacity} repaints' records"


def test_a_series_past_its_capacity_keeps_every_value():
    s = records.Series(3)
    for v in range(5):
        s.add(float(v))
    s.add_to_last(0.5)
    assert s.values() == [0.0, 1.0, 2.0, 3.0, 4.5]
    s.clear()
    s.add(7.0)
    assert s.values() == [7.0]


def test_parts_are_the_repaints_that_have_them_and_a_part_first_seen_late_is_zero_before():
    cycles = records.Cycles(8)
    for i in range(3):
        cycles.start(at=float(i), tick_ms=1.0)
        cycles.add_to_last("paint_ms", 10.0)
        cycles.set_parts({"paint: layout": 2.0, **({"paint: render Late": 4.0} if i == 2 else {})})
    cycles.start(at=3.0, tick_ms=1.0)  # the cycle in progress: no parts yet
    medians = records.parts_medians(cycles)
    assert medians["paint: layout"] == [2.0, 2.0]
    assert medians["paint: render Late"] == [statistics.median([0.0, 0.0, 4.0]), 4.0]
    assert medians["paint: compositor (rest)"] == [8.0, 8.0], "the paint less its parts"
    assert cycles.column("paint_ms") == [10.0, 10.0, 10.0, 0.0]
