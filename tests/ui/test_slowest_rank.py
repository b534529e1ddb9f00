"""One slowest rank on every screen: the Overview's ▲ (its note, health and alert lines), the Comm
tab's pick and compute cell, and the agent's straggler verdict name the same rank, picked on compute
(step − waits) over the window. The run is built so that step time and compute disagree: rank 0
waits longest in its collectives and so has the longest steps; rank 2 computes longest and the
others wait for it. The Overview used to pick on step time and marked rank 0."""

from __future__ import annotations

import statistics

import pytest

from ringtop.metrics.rules.diagnosis import RankWindow, RunContext, diagnose
from ringtop.metrics.rules.outliers import slowest
from ringtop.metrics.timing import STEP_WINDOW
from ringtop.protocol import CommStat, Hello, Step
from ringtop.tui.state.health import health_line
from ringtop.tui.state.view_model import RunView
from ringtop.tui.tabs.comm.figures import slowest_rank
from ringtop.tui.tabs.comm.render import ranks_rows
from ringtop.tui.tabs.overview.render import alert_text, row_cells

STEPS = STEP_WINDOW + 5
SHAPE = {0: (210.0, 110.0), 1: (200.0, 100.0), 2: (190.0, 10.0)}
"""rank: (step ms, exposed comm ms), no input wait. Compute = step − exposed: 100, 100, 180 ms, so
rank 2 is +80 % over the others' median 100 (+80 ms: a straggler by STRAGGLER's +50 % and 25 ms).
By step time rank 0 is the longest, +7.7 % over the others' median 195."""
SLOW = 2


def messages() -> list:
    out: list = [Hello(rank=r, seq=0, ts=1000.0, run_id="slow", world_size=3, host="h", pid=10 + r,
                       strategy="ddp") for r in SHAPE]
    for n in range(1, STEPS + 1):
        for r, (step_ms, exposed) in SHAPE.items():
            out.append(Step(rank=r, seq=n, ts=1000.0 + n, step=n, loss=2.0, step_ms=step_ms, data_ms=0.0,
                            exposed_comm_ms=exposed, comm_busy_ms=exposed + 5.0,
                            comm=[CommStat(kind="all_reduce", count=1, bytes=1_000_000, busy_ms=exposed + 5.0,
                                           group_size=3)]))
    return out


def live_view() -> RunView:
    view = RunView()
    for m in messages():
        view.apply(m, now=m.ts)
    return view


def agents_straggler() -> list[int]:
    """The agent's rule on the same steps: each rank's window of medians (as
    agent/health/diagnosis_exchange.py takes them), through metrics.rules.diagnosis."""
    windows = []
    for r, (step_ms, exposed) in SHAPE.items():
        steps = [step_ms] * STEPS
        windows.append(RankWindow(r, statistics.median(steps), 0.0, exposed, exposed + 5.0, 1e6, 0.0, 0.0))
    found = diagnose(windows, RunContext(strategy="ddp", world_size=3, param_count=1_000))
    return [v.rank for v in found if v.rule == "straggler"]


def test_the_marker_the_comm_tab_and_the_verdict_name_the_same_rank():
    view = live_view()
    old_rule = slowest({r: row.recent_step_ms() for r, row in view.ranks.items()})
    assert old_rule.rank == 0 and old_rule.excess_pct >= 3.0, "the orders differ, else the test shows nothing"
    assert agents_straggler() == [SLOW]
    assert view.slowest_rank == SLOW and view.slowest_excess_pct == pytest.approx(80.0)
    notes = {r: row_cells(view, row, replay=False)["note"].plain for r, row in view.ranks.items()}
    assert notes == {0: "", 1: "", 2: "▲ slowest: compute +80%"}
    assert "▲ rank 2 slowest: compute 180.0 ms/step (step − waits)" in alert_text(view).plain
    assert "▲ rank 2 slowest: compute +80%" in health_line(view, now=1000.0 + STEPS).plain
    pick = slowest_rank(view)
    assert pick is not None and (pick.rank, pick.compute_ms) == (SLOW, 180.0)
    rows = dict(ranks_rows(view, None))
    assert [r for r in SHAPE if rows[f"r{r}"]["note"].plain == "slowest"] == [SLOW]
    assert [r for r in SHAPE if str(rows[f"r{r}"]["compute"].style) == "yellow"] == [SLOW]


async def test_the_real_app_marks_the_rank_the_comm_tab_names():
    from test_tui_app import static_text, table_cell
    from ui_waits import eventually

    from ringtop.tui.app import RingtopApp

    app = RingtopApp(messages=messages(), source="slow")
    async with app.run_test(size=(160, 48)) as pilot:
        def overview_marked():
            assert app.replay_loaded
            notes = {r: table_cell(app, "#ranks", f"r{r}", "note") for r in SHAPE}
            assert notes == {0: "", 1: "", 2: "▲ slowest: compute +80%"}
            assert "rank 2 slowest: compute 180.0" in static_text(app, "#alert")
            assert "▲ slowest: most compute (step − waits)" in static_text(app, "#parts-legend")
        await eventually(pilot, overview_marked)
        await pilot.press("3")

        def comm_named():
            assert "slowest rank 2: compute 180.0 ms/step" in static_text(app, "#comm-caption")
            assert [r for r in SHAPE if table_cell(app, "#comm-ranks", f"r{r}", "note") == "slowest"] == [SLOW]
        await eventually(pilot, comm_named)
