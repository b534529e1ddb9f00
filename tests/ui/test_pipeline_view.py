"""The Pipeline tab: stage timelines folded into whole steps, drawn like the chapter's diagram, the
bubble measured beside theory and beside the replayed schedule; idle per rank when the run is not a
pipeline; the Overview's idle % from Step.idle_ms. Constructed messages, hand-computed numbers, and
the real app driven by a Pilot."""

from __future__ import annotations

import math
import re

import pytest
from test_tui_app import cell, static_text, table_cell, wait_until
from textual.widgets import DataTable, TabbedContent
from ui_waits import eventually, repainted

from ringtop.protocol import Hello, MemorySample, StageSpan, Step, Timeline
from ringtop.tui.app import RingtopApp
from ringtop.tui.state.pipeline import PipelineState
from ringtop.tui.state.view_model import RunView
from ringtop.tui.tabs.pipeline.figures import draw_row

# GPipe, N = 2 stages, M = 2 micro-batches, no transfer time. Stage 0: forward 10 ms, backward 20 ms
# per micro-batch; stage 1 is slower: 15 and 30 ms. Each op starts as soon as its input is there:
#   stage 0: F1 0-10, F2 10-20,                       B1 70-90, B2 100-120
#   stage 1:          F1 10-25, F2 25-40, B1 40-70, B2 70-100
# Both windows are 120 ms. Stage 0 is busy 60 ms: bubble 60/120 = 50 %; stage 1 busy 90: 25 %;
# the pipeline 1 - 150/240 = 37.5 %. Theory (N-1)/(N+M-1) = 1/3 = 33.3 %. The replay with these
# times (no transfers, no overhead: every hand-off is immediate) gives the measured 37.5 %; with equal
# stages (12.5 / 25 ms) it gives the theory, so the imbalance adds 37.5 - 33.3 = 4.2 points.
STAGE0 = [StageSpan(0, "F", 0.0, 10.0), StageSpan(1, "F", 10.0, 20.0),
          StageSpan(0, "B", 70.0, 90.0), StageSpan(1, "B", 100.0, 120.0)]
STAGE1 = [StageSpan(0, "F", 10.0, 25.0), StageSpan(1, "F", 25.0, 40.0),
          StageSpan(0, "B", 40.0, 70.0), StageSpan(1, "B", 70.0, 100.0)]


def timeline(rank: int, step: int, spans, m: int = 2, window: float = 120.0, seq: int = 0) -> Timeline:
    busy = sum(s.end_ms - s.start_ms for s in spans)
    return Timeline(rank=rank, seq=seq, ts=1000.0 + step, step=step, stage=rank, stages=2, micro_batches=m,
                    schedule="gpipe", window_ms=window, spans=list(spans), bubble=1 - busy / window,
                    bubble_theory=1 / (1 + m))


def pp_hello(rank: int) -> Hello:
    return Hello(rank=rank, ts=1000.0, run_id="pp", world_size=2, host="node-a", pid=50 + rank, backend="gloo",
                 device="cpu", strategy="pp", strategy_options={"stages": 2, "schedule": "gpipe", "micro_batches": 2},
                 model="tiny-gpt", param_count=1_000_000, batch_size=8, steps=20)


def pp_step(rank: int, n: int, idle_ms: float, seq: int) -> Step:
    return Step(rank=rank, seq=seq, ts=1000.0 + n, step=n, loss=2.0, step_ms=130.0, data_ms=1.0,
                mem=MemorySample(rss_bytes=200 << 20), idle_ms=idle_ms)


def gpipe_equal(m: int, f: float = 10.0, b: float = 20.0):
    """GPipe N = 2 with equal stages: spans of both stages and the window (N + M - 1)(f + b)."""
    s0 = [StageSpan(i, "F", i * f, (i + 1) * f) for i in range(m)]
    s1 = [StageSpan(i, "F", (i + 1) * f, (i + 2) * f) for i in range(m)]
    t_b = (m + 1) * f  # stage 1 starts its backwards after its last forward
    s1 += [StageSpan(i, "B", t_b + i * b, t_b + (i + 1) * b) for i in range(m)]
    s0 += [StageSpan(i, "B", t_b + (i + 1) * b, t_b + (i + 2) * b) for i in range(m)]
    return s0, s1, (m + 1) * (f + b)


# ---------------------------------------------------------------------- pure


def test_draw_row_places_blocks_by_time():
    # 24 cells over 120 ms: 5 ms per cell
    row0 = "".join(c.label or ("·" if c.kind == "idle" else " ") for c in draw_row(STAGE0, 120.0, 120.0, 24))
    row1 = "".join(c.label or ("·" if c.kind == "idle" else " ") for c in draw_row(STAGE1, 120.0, 120.0, 24))
    assert row0 == "F1F2··········B1  ··B2  "
    assert row1 == "··F1 F2 B1    B2    ····"
    # a window shorter than the axis: past it nothing is drawn; an op shorter than half a cell still shows
    cells = draw_row([StageSpan(0, "F", 0.0, 1.0)], 50.0, 100.0, 10)
    assert [c.kind for c in cells] == ["F"] + ["idle"] * 4 + ["out"] * 5


def test_pipeline_state_completes_a_step_when_every_stage_arrived():
    ps = PipelineState()
    assert ps.add(timeline(0, 5, STAGE0)) is None and ps.latest is None  # stage 1 still missing
    p = ps.add(timeline(1, 5, STAGE1))
    assert p is not None and ps.latest is p and p.step == 5
    assert [line.stage for line in p.lines] == [0, 1]
    assert [line.bubble for line in p.lines] == [0.5, 0.25]
    assert [line.busy_ms for line in p.lines] == [60.0, 90.0]
    assert p.measured == pytest.approx(0.375)
    assert p.theory == pytest.approx(1 / 3)
    b = p.breakdown
    assert b is not None and b.p2p_ms == 0.0 and b.overhead_ms == 0.0
    assert b.replay_balanced == pytest.approx(1 / 3)  # equal stages: the theory
    assert b.replay_overhead == pytest.approx(0.375) and p.predicted == pytest.approx(0.375)
    assert b.from_imbalance == pytest.approx(0.375 - 1 / 3) and b.unexplained == pytest.approx(0.0, abs=1e-12)
    assert [round(p.replay_bubble(s), 6) for s in (0, 1)] == [0.5, 0.25]
    # the wait before stage 1's F1 (10 ms, receiving) and stage 0's B1 and B2 (50 + 10 ms)
    assert [line.wait_recv_ms for line in p.lines] == [60.0, 10.0]
    # a late copy of an older step changes nothing
    assert ps.add(timeline(0, 3, STAGE0)) is None and ps.latest.step == 5


def test_replica_with_the_lowest_rank_is_drawn():
    ps = PipelineState()
    late = Timeline(rank=2, step=7, stage=0, stages=2, micro_batches=2, schedule="gpipe", window_ms=120.0,
                    spans=list(STAGE0), bubble=0.5)
    ps.add(late)
    ps.add(timeline(0, 7, STAGE0))
    p = ps.add(timeline(1, 7, STAGE1))
    assert [line.rank for line in p.lines] == [0, 1]


def test_bubble_history_shrinks_as_m_grows():
    ps = PipelineState()
    step = 0
    for m in (1, 2, 4, 8):
        s0, s1, window = gpipe_equal(m)
        for _ in range(2):
            step += 5
            ps.add(timeline(0, step, s0, m=m, window=window))
            ps.add(timeline(1, step, s1, m=m, window=window))
    assert [seg.micro_batches for seg in ps.history] == [1, 2, 4, 8]
    assert [seg.samples for seg in ps.history] == [2, 2, 2, 2]
    assert [(seg.first_step, seg.last_step) for seg in ps.history] == [(5, 10), (15, 20), (25, 30), (35, 40)]
    # equal stages, free transfers: measured = replay = theory = 1/(M+1): 1/2, 1/3, 1/5, 1/9
    for seg, want in zip(ps.history, (1 / 2, 1 / 3, 1 / 5, 1 / 9)):
        assert seg.measured == pytest.approx(want) and seg.theory == pytest.approx(want)
        assert seg.predicted == pytest.approx(want)
    measured = [seg.measured for seg in ps.history]
    assert measured == sorted(measured, reverse=True)


def shifted(spans, by: float):
    return [StageSpan(sp.micro_batch, sp.op, sp.start_ms + by, sp.end_ms + by) for sp in spans]


def test_stages_on_one_host_are_lined_up_by_their_window_starts():
    # stage 1 enters its window 10 ms after stage 0 (host clock 1000 vs 1010 ms) and sends its spans
    # relative to that: its F1 at 0-15 is 10-25 on stage 0's axis. Its window is 110 ms (to 120).
    t0 = Timeline(rank=0, step=5, stage=0, stages=2, micro_batches=2, schedule="gpipe", window_ms=120.0,
                  window_start_ms=1000.0, spans=STAGE0)
    t1 = Timeline(rank=1, step=5, stage=1, stages=2, micro_batches=2, schedule="gpipe", window_ms=110.0,
                  window_start_ms=1010.0, spans=shifted(STAGE1, -10.0))
    ps = PipelineState()
    ps.add(t0, host="node-a")
    p = ps.add(t1, host="node-a")
    assert p.aligned and [line.offset_ms for line in p.lines] == [0.0, 10.0] and p.span_ms == 120.0
    # stage 1: busy 90 of its 110 ms; the pipeline 1 - 150/230; the replay is the same 37.5 %
    assert p.lines[1].bubble == pytest.approx(20 / 110) and p.measured == pytest.approx(1 - 150 / 230)
    assert p.predicted == pytest.approx(0.375) and p.breakdown.p2p_ms == 0.0
    # drawn on stage 0's axis: before its window stage 1 shows nothing, not idle time
    row1 = "".join(c.label or ("·" if c.kind == "idle" else " ")
                   for c in draw_row(p.lines[1].spans, p.lines[1].window_ms, p.span_ms, 24, p.lines[1].offset_ms))
    assert row1 == "  F1 F2 B1    B2    ····"
    # on two hosts the clocks are not comparable: each stage from its own window start
    ps = PipelineState()
    ps.add(t0, host="node-a")
    p = ps.add(t1, host="node-b")
    assert not p.aligned and [line.offset_ms for line in p.lines] == [0.0, 0.0]
    # nor when a stage sent no window start
    ps = PipelineState()
    ps.add(t0, host="node-a")
    p = ps.add(Timeline(rank=1, step=5, stage=1, stages=2, micro_batches=2, schedule="gpipe", window_ms=110.0,
                        spans=shifted(STAGE1, -10.0)), host="node-a")
    assert not p.aligned


def test_a_stage_without_some_micro_batch_gets_no_replay_but_is_still_measured():
    ps = PipelineState()
    ps.add(timeline(0, 1, STAGE0))
    p = ps.add(timeline(1, 1, STAGE1[:3]))  # stage 1's B2 missing
    assert p.breakdown is None and p.replay is None and "stage 1" in p.replay_error
    assert p.lines[1].bubble == pytest.approx(1 - 60 / 120)
    assert math.isnan(p.predicted)


def test_view_model_idle_from_step_idle_ms_with_fallback():
    v = RunView()
    v.apply(pp_hello(0), now=0.0)
    v.apply(Step(rank=0, seq=1, step=1, loss=1.0, step_ms=100.0, data_ms=1.0, exposed_comm_ms=10.0, idle_ms=25.0),
            now=0.0)
    assert v.ranks[0].idle_pct == pytest.approx(25.0) and v.ranks[0].idle_reported
    # an agent that does not send idle_ms (0): data + exposed communication
    v.apply(Step(rank=0, seq=2, step=2, loss=1.0, step_ms=100.0, data_ms=1.0, exposed_comm_ms=10.0), now=0.0)
    assert v.ranks[0].idle_pct == pytest.approx(11.0) and not v.ranks[0].idle_reported


def test_a_new_run_forgets_the_pipeline():
    v = RunView()
    for r in (0, 1):
        v.apply(pp_hello(r), now=0.0)
    v.apply(timeline(0, 5, STAGE0), now=0.0)
    v.apply(timeline(1, 5, STAGE1), now=0.0)
    assert v.pipeline.latest is not None
    v.apply(Hello(rank=0, run_id="other", world_size=2, strategy="ddp"), now=0.0)
    assert v.pipeline.latest is None and not v.pipeline.seen


# ---------------------------------------------------------------------- the app


def pp_run() -> list:
    msgs: list = [pp_hello(0), pp_hello(1)]
    seq = {0: 1, 1: 1}
    for n in range(1, 6):
        for r in (0, 1):
            msgs.append(pp_step(r, n, idle_ms=61.0 if r == 0 else 31.0, seq=seq[r]))
            seq[r] += 1
    for r, spans in ((0, STAGE0), (1, STAGE1)):
        msgs.append(timeline(r, 5, spans, seq=seq[r]))
        seq[r] += 1
    return msgs


def timeline_rows(app: RingtopApp) -> dict[str, str]:
    text = static_text(app, "#pp-timeline")
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\s*(stage \d|replay \d)\s*│(.*)│", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


async def open_pipeline(app: RingtopApp, pilot) -> None:
    await wait_until(pilot, lambda: app.replay_loaded, what="replay to load")
    await pilot.press("4")
    assert app.query_one(TabbedContent).active == "pipeline"
    await repainted(pilot)


async def test_pipeline_tab_draws_stages_and_bubble_beside_theory():
    app = RingtopApp(messages=pp_run(), source="pp")
    async with app.run_test(size=(120, 50)) as pilot:
        await open_pipeline(app, pilot)
        await wait_until(pilot, lambda: "stage 1" in static_text(app, "#pp-timeline"), what="the timeline")
        caption = static_text(app, "#pp-caption")
        assert "gpipe" in caption and "N=2 stages × M=2 micro-batches" in caption and "step 5" in caption
        rows = timeline_rows(app)
        # one row per stage, blocks in the schedule's order, and each block where its time puts it
        assert re.findall(r"[FB]\d", rows["stage 0"]) == ["F1", "F2", "B1", "B2"]
        assert re.findall(r"[FB]\d", rows["stage 1"]) == ["F1", "F2", "B1", "B2"]
        s0, s1 = rows["stage 0"], rows["stage 1"]
        assert s0.index("F1") == 0 and s1.index("F1") > s0.index("F1")  # stage 1 waits for its input
        assert s1.index("B1") < s0.index("B1")  # backward runs from the last stage back
        assert "·" in s0 and "·" in s1  # idle time is visible
        width = len(s0)  # the axis is the 120 ms window: stage 0's B1 starts at 70/120 of the width
        assert abs(s0.index("B1") - round(70 / 120 * width)) <= 1
        assert abs(s1.index("F2") - round(25 / 120 * width)) <= 1
        # the replayed schedule is drawn under them
        assert re.findall(r"[FB]\d", rows["replay 0"]) == ["F1", "F2", "B1", "B2"]
        text = static_text(app, "#pp-timeline")
        assert "idle  50.0%" in text and "idle  25.0%" in text

        bubble = " ".join(static_text(app, "#pp-bubble").split())
        assert "measured 37.5%" in bubble and "worst stage 0: 50.0%" in bubble
        assert "replay 37.5%" in bubble
        assert "theory 33.3% = (N−1)/(N+M−1) = 1/3" in bubble
        assert "schedule 33.3%" in bubble and "imbalance +4.2%" in bubble and "transfers +0.0%" in bubble
        assert "unexplained +0.0%" in bubble

        t = lambda row, col: table_cell(app, "#pp-stages", row, col)  # noqa: E731
        assert (t("s0", "fwd"), t("s0", "bwd"), t("s0", "busy"), t("s0", "bubble")) == ("10.0", "20.0", "60.0", "50.0%")
        assert (t("s1", "fwd"), t("s1", "bwd"), t("s1", "busy"), t("s1", "bubble")) == ("15.0", "30.0", "90.0", "25.0%")
        assert (t("all", "bubble"), t("all", "replay"), t("all", "theory")) == ("37.5%", "37.5%", "33.3%")
        h = lambda col: table_cell(app, "#pp-history", "h0", col)  # noqa: E731
        assert (h("m"), h("measured"), h("theory"), h("samples")) == ("2", "37.5%", "33.3%", "1")

        # the Overview's idle % is Step.idle_ms / step_ms: 61 / 130 = 46.9 and 31 / 130 = 23.8 (fmt.pct)
        await pilot.press("1")
        def _shown_1():
            assert cell(app, 0, "idle_pct") == "47" and cell(app, 1, "idle_pct") == "24"
        await eventually(pilot, _shown_1)


async def test_pipeline_tab_follows_new_steps_and_a_new_m():
    msgs = pp_run()
    s0, s1, window = gpipe_equal(4)
    msgs += [timeline(0, 10, s0, m=4, window=window, seq=20), timeline(1, 10, s1, m=4, window=window, seq=20)]
    msgs.append(timeline(0, 15, s0, m=4, window=window, seq=21))  # stage 1 of step 15 never came
    app = RingtopApp(messages=msgs, source="pp")
    async with app.run_test(size=(120, 50)) as pilot:
        await open_pipeline(app, pilot)
        await wait_until(pilot, lambda: app.query_one("#pp-history", DataTable).row_count == 2, what="history")
        assert "step 10" in static_text(app, "#pp-caption") and "M=4" in static_text(app, "#pp-caption")
        rows = timeline_rows(app)
        assert re.findall(r"[FB]\d", rows["stage 0"]) == ["F1", "F2", "F3", "F4", "B1", "B2", "B3", "B4"]
        # equal stages, M = 4: 1/5 measured, replayed and in theory
        bubble = " ".join(static_text(app, "#pp-bubble").split())
        assert "measured 20.0%" in bubble and "replay 20.0%" in bubble and "theory 20.0%" in bubble
        h = lambda row, col: table_cell(app, "#pp-history", row, col)  # noqa: E731
        assert (h("h0", "m"), h("h0", "measured")) == ("2", "37.5%")
        assert (h("h1", "m"), h("h1", "measured"), h("h1", "theory")) == ("4", "20.0%", "20.0%")


async def test_pipeline_tab_without_a_pipeline_shows_idle_per_rank():
    msgs: list = []
    for r in (0, 1):
        msgs.append(Hello(rank=r, ts=1000.0, run_id="d", world_size=2, host="h", pid=r + 1, strategy="ddp",
                          param_count=1000))
    for r, idle in ((0, 12.0), (1, 0.0)):
        msgs.append(Step(rank=r, seq=1, ts=1001.0, step=1, loss=1.0, step_ms=100.0, data_ms=2.0, exposed_comm_ms=5.0,
                         idle_ms=idle))
    app = RingtopApp(messages=msgs, source="ddp")
    async with app.run_test(size=(120, 40)) as pilot:
        await open_pipeline(app, pilot)
        caption = static_text(app, "#pp-caption")
        assert "Not a pipeline run" in caption and "strategy ddp" in caption
        lines = [" ".join(line.split()) for line in static_text(app, "#pp-timeline").splitlines()]
        # rank 0 sent idle_ms 12 of 100 ms; rank 1 sent none: data 2 + exposed 5 = 7 %
        assert any(line.startswith("0 12.0 100.0 12 2.0 5.0") for line in lines), lines
        assert any(line.startswith("1 7.0 100.0 7.0 2.0 5.0") and "the agent sent no idle time" in line
                   for line in lines), lines
        assert not app.query_one("#pp-stages").display


async def test_after_a_switch_out_of_the_pipeline_its_last_step_stays_below_the_idle_table():
    msgs = pp_run()
    # rank 0 switched the run to ddp at step 6: a new Hello with the new strategy, then ddp steps
    msgs.append(Hello(rank=0, seq=30, ts=1010.0, run_id="pp", world_size=2, host="node-a", pid=50, strategy="ddp",
                      param_count=1_000_000))
    msgs.append(Step(rank=0, seq=31, ts=1011.0, step=6, loss=1.0, step_ms=50.0, data_ms=1.0, exposed_comm_ms=4.0,
                     idle_ms=5.0))
    app = RingtopApp(messages=msgs, source="pp-then-ddp")
    async with app.run_test(size=(120, 50)) as pilot:
        await open_pipeline(app, pilot)
        caption = static_text(app, "#pp-caption")
        assert "Not a pipeline run now (strategy ddp)" in caption and "pipeline until step 5" in caption
        text = static_text(app, "#pp-timeline")
        assert "the last pipeline step seen, step 5 (gpipe, N=2, M=2)" in text
        assert any(" ".join(line.split()).startswith("0 5.0 50.0 10 ") for line in text.splitlines())
        rows = timeline_rows(app)
        assert re.findall(r"[FB]\d", rows["stage 1"]) == ["F1", "F2", "B1", "B2"]
        assert "measured 37.5%" in " ".join(static_text(app, "#pp-bubble").split())
