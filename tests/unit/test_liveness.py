"""The liveness rules (metrics/rules/liveness.py) and where they are read: pure, on numbers and
hand-built reports whose answer the test works out by hand; a start-up hang read from `starting`
reports; one wait for one hang on one screen; Prometheus's culprit."""

from __future__ import annotations

import math

import hang_scenario as hs
import msgspec
import pytest

from ringtop.agent.prometheus.exporter import RunMetrics
from ringtop.metrics.rules import liveness
from ringtop.metrics.rules.hang import diagnose
from ringtop.protocol import Event, GroupCursor, HangReport, InFlight, Stall
from ringtop.tui.state.health import health_words
from ringtop.tui.state.view_model import RunView
from ringtop.tui.tabs.hang.render import banner_text, hang_rows, rank_states, stack_text

# ---------------------------------------------------------------------- the thresholds


def test_a_known_step_time_stalls_past_twice_its_median_plus_the_floor():
    assert liveness.stall_after_s(0.1) == pytest.approx(2 * 0.1 + 4.0)
    assert liveness.stall_after_s(3.0) == pytest.approx(2 * 3.0 + 4.0)
    assert liveness.stall_after_s(0.1, generous=True) == pytest.approx(0.2 + 4.0 + 120.0), "a checkpoint's step"
    assert liveness.stall_after_s(0.1, factor=1.0, floor_s=0.3) == pytest.approx(0.4), "the agent's flags"


def test_before_its_step_time_is_known_a_rank_stalls_only_after_the_warm_up():
    assert liveness.stall_after_s(None) == 60.0
    assert liveness.stall_after_s(None, warmup_s=1.0, floor_s=4.0) == 4.0, "never under the floor"


def test_the_median_needs_three_finite_steps_and_reads_the_recent_fifty():
    assert liveness.median_step_s([0.1, 0.2]) is None
    assert liveness.median_step_s([0.1, math.nan, 0.2, -1.0]) is None, "NaN and negatives are not steps"
    assert liveness.median_step_s([0.1, 0.3, 0.2]) == pytest.approx(0.2)
    assert liveness.median_step_s([10.0] * 50 + [1.0] * 50) == 1.0, "the older fifty are forgotten"


def test_in_start_up_where_a_rank_is_goes_out_after_seconds_not_at_its_stall_limit():
    assert liveness.report_after_s(None, liveness.stall_after_s(None)) == 5.0
    assert liveness.report_after_s(0.1, liveness.stall_after_s(0.1)) == pytest.approx(4.2), "warm: at the stall"
    assert liveness.report_after_s(None, 0.3) == 0.3, "never after the rank's own stall limit"
    assert liveness.report_after_s(None, 180.0, generous=True) == 180.0, "a checkpoint's ranks wait for its writes"


def test_the_ui_allows_the_delivery_on_top_of_the_ranks_own_limit():
    assert liveness.ui_stall_after_s(0.1) == pytest.approx(4.2 + 2.0)
    assert liveness.ui_stall_after_s(None) == 62.0, "a rank in its first steps"
    assert liveness.ui_stall_after_s(None, past_start_up=True) == 6.0, "attached late: the floor's"


@pytest.mark.parametrize("silent_s, gone", [(3.9, False), (4.0, False), (4.1, True), (60.0, True)])
def test_a_rank_is_gone_after_four_missed_heartbeats(silent_s, gone):
    assert liveness.is_silent(silent_s) is gone


# ---------------------------------------------------------------------- start-up


def report(
    rank: int,
    state: str,
    *,
    phase: str,
    issued: int,
    in_flight: int = 0,
    age_s: float = 5.3,
    step: int = 2,
    where: str = "model.py:57 in forward",
) -> Stall:
    ops = [InFlight(group="world", seq=in_flight, kind="all_reduce", bytes=1024, age_s=age_s)] if in_flight else []
    return Stall(
        rank=rank,
        state=state,
        step=step,
        phase=phase,
        running_s=age_s + 0.2,
        threshold_s=60.0,
        where=where,
        in_flight=ops,
        groups=[GroupCursor(group="world", issued=issued, completed=issued - bool(in_flight))],
    )


def test_a_rank_stuck_in_its_first_steps_is_named_from_starting_reports_with_its_phase():
    waiting = report(0, "starting", phase="backward", issued=2, in_flight=2, where="train.py:9 in main")
    stuck = report(1, "starting", phase="forward", issued=1)
    verdict = diagnose({0: waiting, 1: stuck}, world_size=2)
    assert (verdict.kind, verdict.culprits, verdict.waiting, verdict.seq) == ("hang", (1,), (0,), 2)
    assert verdict.wait_s == pytest.approx(5.3)
    assert verdict.text.endswith("rank 1 is in forward at model.py:57 in forward")


def test_a_rank_that_never_issued_a_collective_is_said_to_be_before_its_first():
    waiting = report(0, "starting", phase="backward", issued=1, in_flight=1, step=1)
    stuck = report(1, "starting", phase="data", issued=0, step=1, where="train.py:20 in main")
    verdict = diagnose({0: waiting, 1: stuck}, world_size=2)
    assert verdict.culprits == (1,)
    assert "rank 1 is in data at train.py:20 in main, before its first collective on group world" in verdict.text


@pytest.mark.parametrize("state, named", [("starting", False), ("stalled", True)])
def test_ranks_slow_in_their_first_step_and_waiting_for_nobody_are_no_verdict_until_they_stall(state, named):
    """A slow first step (compilation) on every rank: `starting` reports place them, no alarm;
    the same reports as stalls are one (the check bites)."""
    reports = {r: report(r, state, phase="forward", issued=0) for r in (0, 1)}
    verdict = diagnose(reports, world_size=2)
    assert (verdict is not None) is named
    if named:
        assert verdict.kind == "stall" and verdict.culprits == (0, 1)


def test_the_hang_view_calls_a_start_up_report_so_and_its_culprit_starting():
    view = RunView()
    for r in (0, 1):
        view.apply(hs.hello(r, world=2))
    view.apply(msgspec.structs.replace(report(0, "starting", phase="backward", issued=2, in_flight=2), seq=1))
    view.apply(msgspec.structs.replace(report(1, "starting", phase="forward", issued=1), seq=1))
    verdict = view.hang_verdict()
    assert verdict.culprits == (1,)
    states = {s.rank: s for s in rank_states(view, verdict)}
    assert (states[0].state, states[1].state) == ("waits", "starting")
    assert stack_text(view, 1).plain.startswith("rank 1  start-up report at ")


# ---------------------------------------------------------------------- one wait on one screen


def test_a_hangs_wait_is_one_number_in_the_banner_the_health_line_and_the_hang_view():
    """Ranks report at different times (a thousand do): the waiting row's range ends at the wait
    the banner and the health line give, measured in the collective, not in the step."""
    seq, world = hs.Seq(), 40
    view = RunView()
    for m in hs.hung_run(world=world, culprit=7, reports=1, seq=seq):
        view.apply(m)
    for r in range(0, world, 2):  # half the ranks' newer reports: they have waited 4 s more
        view.apply(hs.stall(r, seq(r), culprit=7, k=2))
    verdict = view.hang_verdict()
    newest = hs.stall(0, 0, culprit=7, k=2).in_flight[0].age_s
    assert verdict.culprits == (7,) and verdict.wait_s == newest == 40.0
    assert verdict.wait_s == liveness.waited_s(view.hang.stalled, verdict.waiting, verdict.group, verdict.seq)
    assert f"waited in for {newest:.0f} s" in banner_text(view, replay=False).plain
    states = rank_states(view, verdict)
    rows = hang_rows(states, group=True)
    waiting_cells = [r.cells["state"].plain for r in rows if r.ranks and 7 not in r.ranks]
    assert waiting_cells == ["waits 36–40 s"], waiting_cells
    culprit = next(r for r in rows if r.ranks == (7,))
    assert culprit.cells["state"].plain.startswith("stalled"), "the culprit's own step, not a wait"
    assert "holding up" in health_words(verdict)[1]


def test_a_stepping_ranks_issued_and_completed_counts_follow_its_steps():
    seq = hs.Seq()
    view = RunView()
    for m in hs.hung_run(world=2, culprit=1, reports=1, seq=seq):
        view.apply(m)
    snapshot = msgspec.structs.replace(hs.stall(0, seq(0), culprit=1), state="snapshot", request="k1")
    view.apply(snapshot)
    for m in hs.recovered(2, seq):  # both step on: the snapshot's counts are old
        view.apply(m)
    view.apply(hs.step(0, 7, seq(0), ts=hs.T0 + 41))
    groups = {s.rank: s.groups for s in rank_states(view, None)}
    assert groups[0] == f"world {7 * hs.PER_STEP}/{7 * hs.PER_STEP}", "its latest step's, not the snapshot's 22/20"
    assert (
        f"group world: issued #{7 * hs.PER_STEP}, completed #{7 * hs.PER_STEP} (at its step 7)"
        in stack_text(view, 0).plain
    )


# ---------------------------------------------------------------------- Prometheus


def culprit_series(m: RunMetrics) -> dict[str, float]:
    family = next(f for f in m.collect() if f.name == "ringtop_hang_culprit")
    return {s.labels["rank"]: s.value for s in family.samples}


def test_prometheus_marks_only_the_culprit_of_a_hang_and_clears_it():
    m = RunMetrics()
    for msg in hs.hung_run(world=3, culprit=2, reports=1):
        m.observe(msg)
    assert culprit_series(m) == {"0": 0.0, "1": 0.0, "2": 0.0}, "stalled reports alone name no culprit"
    m.observe(
        Event(
            rank=0,
            ts=hs.T0 + 5,
            level="error",
            kind="hang",
            text="rank 2 has not entered …",
            hang=HangReport(verdict="hang", culprits=[2], waiting=[0, 1]),
        )
    )
    assert culprit_series(m) == {"0": 0.0, "1": 0.0, "2": 1.0}
    m.observe(
        Event(
            rank=0,
            ts=hs.T0 + 9,
            level="info",
            kind="hang",
            text="the stall is over",
            hang=HangReport(verdict="cleared"),
        )
    )
    assert culprit_series(m) == {"0": 0.0, "1": 0.0, "2": 0.0}
