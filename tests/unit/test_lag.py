"""The screen's lag (metrics/lag.py) and the header that says it: a clock offset between hosts
is no lag; messages folded late are, and then the header says `behind by N s`, not `● live`."""

from __future__ import annotations

from ringtop.metrics.lag import BASELINE_WINDOW_S, BEHIND_AFTER_S, Lag
from ringtop.protocol import Hello, Step
from ringtop.tui.header.render import connection_text
from ringtop.tui.state.view_model import RunView


def test_a_clock_offset_is_no_lag_and_queueing_is():
    lag = Lag()
    offset = 1000.0  # the rank's clock is 1000 s behind the UI's: every delay reads 1000 s more
    for t in range(10):
        lag.observe(offset + 0.05, float(t))
    assert lag.behind_s() == 0.0
    lag.observe(offset + 8.05, 10.0)  # this batch waited 8 s more on its way
    assert lag.behind_s() == 8.0
    lag.observe(offset + 0.05, 11.0)
    assert lag.behind_s() == 0.0, "caught up"


def test_the_quickest_path_is_forgotten_after_the_window():
    lag = Lag()
    lag.observe(0.0, 0.0)
    lag.observe(5.0, 10.0)
    assert lag.behind_s() == 5.0
    lag.observe(5.0, BASELINE_WINDOW_S + 20)  # a clock stepped by 5 s long ago: no lag any more
    assert lag.behind_s() == 0.0


def test_the_header_says_behind_instead_of_live():
    view = RunView()
    view.apply(Hello(rank=0, run_id="r", world_size=1), now=100.0)
    view.apply(Step(rank=0, step=1, loss=1.0, step_ms=10.0), now=100.0)
    view.lag.observe(0.1, 100.0)
    view.tick(100.5)
    assert connection_text(view, replay=False, now=100.5).plain.endswith("● live")
    view.lag.observe(0.1 + 8.0, 100.5)
    assert connection_text(view, replay=False, now=100.5).plain.endswith("◐ behind by 8 s")
    view.lag.observe(0.1 + BEHIND_AFTER_S * 0.9, 100.6)
    assert connection_text(view, replay=False, now=100.6).plain.endswith("● live")
