"""The Overview of a large run, without the app: the robust outlier rule (hand-computed values), the
per-node figures, the window of rows on screen, the panel's node rows, a node opened, and the
rank cells rebuilt only for ranks that changed. Steps fold in without a test over every rank."""

from __future__ import annotations

import math

import pytest
import scale_scenario as sc

from ringtop.metrics.rules.outliers import mad_outliers, robust_z, top_k
from ringtop.protocol import Event
from ringtop.tui.large_run.nav import OverviewNav
from ringtop.tui.large_run.spreads import TIME_FLOOR
from ringtop.tui.state.nodes import filter_ranks, node_summaries, rank_figures, sort_nodes
from ringtop.tui.state.reducers import steps as steps_module
from ringtop.tui.state.view_model import RunView
from ringtop.tui.tabs.comm.panel import CommTab
from ringtop.tui.tabs.memory.panel import MemoryTab
from ringtop.tui.tabs.overview.panel import OverviewTab

# ---------------------------------------------------------------------- the robust rule


def test_robust_z_is_0_6745_deviation_over_mad():
    # median 12; deviations 2, 1, 0, 1, 38: MAD 1
    z = robust_z({0: 10.0, 1: 11.0, 2: 12.0, 3: 13.0, 4: 50.0})
    assert z[4] == pytest.approx(0.6745 * 38) and z[0] == pytest.approx(-0.6745 * 2) and z[2] == 0.0
    assert mad_outliers({0: 10.0, 1: 11.0, 2: 12.0, 3: 13.0, 4: 50.0}) == [(4, pytest.approx(25.631))]


def test_mad_0_falls_back_to_the_mean_absolute_deviation_and_equal_values_flag_nothing():
    # four ties at 100: MAD 0; MeanAD = 30 / 5 = 6; z = 30 / (1.253314 x 6) = 3.989
    values = {0: 100.0, 1: 100.0, 2: 100.0, 3: 100.0, 4: 130.0}
    assert robust_z(values)[4] == pytest.approx(30 / (1.253314 * 6))
    assert mad_outliers(values) == [(4, pytest.approx(3.9894, abs=1e-4))]
    assert robust_z({0: 7.0, 1: 7.0, 2: 7.0}) == {0: 0.0, 1: 0.0, 2: 0.0}
    assert mad_outliers({0: 7.0, 1: 7.0, 2: 7.0}) == [] and robust_z({}) == {}


def test_a_large_z_from_a_tight_spread_needs_the_floor_too_and_nan_is_ignored():
    # median 100.1; deviations .1 0 .1 0 1.4: MAD .1, z = 0.6745 x 1.4 / 0.1 = 9.44, but 1.4 ms is jitter
    values = {0: 100.0, 1: 100.1, 2: 100.2, 3: 100.1, 4: 101.5, 5: math.nan}
    assert mad_outliers(values) == [(4, pytest.approx(9.443))]
    assert mad_outliers(values, floor=TIME_FLOOR) == []
    assert 5 not in robust_z(values)


def test_top_k_largest_first_lower_rank_on_a_tie():
    assert top_k({0: 5.0, 1: 9.0, 2: 9.0, 3: math.nan, 4: 1.0}, 2) == [(1, 9.0), (2, 9.0)]
    assert top_k({0: 1.0}, 0) == []


# ---------------------------------------------------------------------- a large run's view


@pytest.fixture(scope="module")
def big() -> RunView:
    v = RunView(watch_liveness=False)
    v.apply_many(sc.run(steps=6), now=1.0)
    return v


def test_steps_fold_in_without_a_set_test_over_all_ranks_per_message(monkeypatch):
    """The cross-rank history asks whether every live rank reported a step only once the count
    says it can have: about once per step, not once per message (O(ranks) each at 1024 ranks)."""
    calls = []
    real = steps_module._complete

    def counted(got, live):
        done = real(got, live)
        calls.append(len(got) >= len(live))
        return done
    monkeypatch.setattr(steps_module, "_complete", counted)
    v = RunView(watch_liveness=False)
    v.apply_many(sc.run(steps=4, world=256), now=1.0)
    assert [p.ranks for p in v.steps] == [256] * 4
    assert sum(calls) <= 4 + 1  # the full test ran about once per step


def test_nodes_give_min_median_max_and_name_their_slowest_rank(big):
    figures = rank_figures(big)
    nodes = {n.host: n for n in node_summaries(figures)}
    assert sorted(nodes) == [f"node-{i}" for i in range(8)] and len(nodes["node-0"].ranks) == 128
    n4 = nodes["node-4"]
    assert n4.slowest_rank == sc.STRAGGLER and n4.step_max_ms == pytest.approx(130.0)
    assert n4.step_min_ms == pytest.approx(100.0) and n4.step_median_ms == pytest.approx(100.3)
    assert nodes["node-0"].mem_max_bytes == 602 * sc.MiB and nodes["node-0"].idle_median_pct == pytest.approx(4.0,
                                                                                                             abs=0.1)
    assert sort_nodes(list(nodes.values()), "step")[0].host == "node-4"
    assert [n.host for n in sort_nodes(list(nodes.values()), "rank")][:2] == ["node-0", "node-1"]


def test_filter_by_ranks_or_host(big):
    rows = list(big.ranks.values())
    assert filter_ranks("5-7", rows, sc.WORLD) == [5, 6, 7]
    assert filter_ranks("0-1023/256", rows, sc.WORLD) == [0, 256, 512, 768]
    assert filter_ranks("NODE-7", rows, sc.WORLD) == list(range(896, 1024))


def test_the_window_keeps_the_cursor_on_screen():
    nav = OverviewNav()
    assert nav.window(100, 10) == (0, 0)
    nav.move(12)
    assert nav.window(100, 10) == (3, 12)
    nav.to_end(True)
    assert nav.window(100, 10) == (90, 99)
    assert nav.window(5, 10) == (0, 4)  # fewer rows now: the cursor stays within them


def test_builder_draws_node_rows_then_a_nodes_ranks_only_the_rows_on_screen(big):
    b, nav = OverviewTab(), OverviewNav()
    m = b.model(big, 2.0, replay=True, table_width=150, nav=nav, visible_rows=5)
    assert [k for k, _ in m.rows] == ["nnode-4", "nnode-0", "nnode-1", "nnode-2", "nnode-3"]
    assert m.cursor == 0 and m.cursor_key == "nnode-4"
    cells = dict(m.rows)["nnode-4"]
    assert cells["slowest"].plain == f"r{sc.STRAGGLER}" and cells["step_max"].plain == "130.0"
    assert "8 nodes · 1,024 ranks" in m.caption.plain and "rows 1–5 of 8" in m.caption.plain
    strip_lines = m.strip.plain.split("\n")
    assert strip_lines[0].startswith("heat: 1 cell per rank") and sum(len(line) for line in strip_lines[1:]) == 1024
    cells_start = m.strip.plain.index("\n")
    red = [m.strip.plain[sp.start:sp.end] for sp in m.strip.spans if str(sp.style) == "red" and sp.start > cells_start]
    assert red == ["█"]  # the straggler's one cell, 30 % over the median
    assert "r517 node-4 130.0 ms +30%" in m.standouts.plain
    assert "outliers (robust z ≥ 3.5): step time r517" in m.standouts.plain
    nav.open("node-4")
    m = b.model(big, 2.0, replay=True, table_width=150, nav=nav, visible_rows=5)
    assert [k for k, _ in m.rows][0] == f"r{sc.STRAGGLER}" and len(m.rows) == 5
    assert "node node-4: 128 ranks" in m.caption.plain
    assert nav.back() and nav.host is None


def test_rank_cells_are_rebuilt_only_for_ranks_that_moved_on():
    v = RunView(watch_liveness=False)
    v.apply_many(sc.run(steps=3, world=8), now=1.0)
    b = OverviewTab()
    first = dict(b.model(v, 2.0, replay=True).rows)
    v.apply(sc.step(3, 4, seq=4, world=8), now=2.0)
    again = dict(b.model(v, 2.0, replay=True).rows)
    assert again["r0"] is first["r0"] and again["r3"] is not first["r3"]


def test_node_rows_sum_their_ranks_tflops_and_give_mfu_only_where_every_rank_has_a_peak():
    """Rank r reports (1 + r % 3) TFLOP/s; node-1's ranks have a 10 TFLOP/s peak, node-2 has one
    rank without a peak (no MFU then), the others none (MFU column only once a peak is known)."""
    import msgspec

    from ringtop.protocol import Hello, Step

    def with_figures(m):
        if isinstance(m, Step):
            return msgspec.structs.replace(m, tflops=float(1 + m.rank % 3))
        if isinstance(m, Hello) and m.host in ("node-1", "node-2") and m.rank != 300:
            return msgspec.structs.replace(m, peak_tflops=10.0)
        return m
    v = RunView(watch_liveness=False)
    v.apply_many([with_figures(m) for m in sc.run(steps=3)], now=1.0)
    nodes = {n.host: n for n in node_summaries(rank_figures(v))}
    for host, ranks in (("node-1", range(128, 256)), ("node-2", range(256, 384))):
        assert nodes[host].tflops == pytest.approx(sum(1 + r % 3 for r in ranks))
    assert nodes["node-1"].mfu == pytest.approx(sum(1 + r % 3 for r in range(128, 256)) / (128 * 10.0))
    assert nodes["node-2"].mfu is None and nodes["node-0"].mfu is None
    m = OverviewTab().model(v, 2.0, replay=True, table_width=150, nav=OverviewNav(), visible_rows=8)
    cells = dict(m.rows)
    assert {"tflops", "mfu"} <= {c.key for c in m.columns}
    assert cells["nnode-1"]["tflops"].plain == f"{sum(1 + r % 3 for r in range(128, 256)):,.0f}"
    assert cells["nnode-1"]["mfu"].plain == "20.0%"  # 256 of 1280 TFLOP/s: (1+2+3)/3 = 2 per rank
    assert cells["nnode-2"]["mfu"].plain == "n/a"
    plain = RunView(watch_liveness=False)
    plain.apply_many(sc.run(steps=3), now=1.0)
    m = OverviewTab().model(plain, 2.0, replay=True, table_width=150, nav=OverviewNav(), visible_rows=8)
    assert not {"tflops", "mfu"} & {c.key for c in m.columns}


@pytest.mark.parametrize("sort", ["step", "mem", "idle", "rank"])
def test_a_hung_rank_is_marked_wherever_it_appears(sort):
    """Issue 28: at 1,024 ranks with rank 700 hung, the banner named it, but its node's row was
    neither moved up nor marked in any sort, and a filter to rank 700 showed a healthy-looking row."""
    seq = sc.hs.Seq()
    v = RunView(watch_liveness=False)
    v.apply_many(sc.run(steps=6, seq=seq), now=1.0)
    healthy = OverviewTab().model(v, 2.0, replay=True, table_width=150, nav=nav_sorted(sort), visible_rows=8)
    v.apply_many(sc.hung_reports(seq, steps=6), now=1.5)
    v.apply(Event(rank=0, seq=seq(0), ts=sc.T0 + 2, level="warn", kind="verdict", text="rank 517 is a straggler",
                  step=6, data={"rule": "straggler", "rank": sc.STRAGGLER}), now=1.5)
    assert list(v.hang_verdict().culprits) == [sc.HUNG]
    b = OverviewTab()
    m = b.model(v, 2.0, replay=True, table_width=150, nav=nav_sorted(sort), visible_rows=8)
    hung_node = sc.host(sc.HUNG)
    assert m.rows[0][0] == f"n{hung_node}", [k for k, _ in m.rows]  # first, whatever the order
    note = dict(m.rows)[f"n{hung_node}"]["note"]
    assert "rank 700" in note.plain and "1 hung" in note.plain and "red" in str(note.style)
    # then the node of a rank a verdict flags
    assert m.rows[1][0] == f"n{sc.host(sc.STRAGGLER)}"
    assert dict(m.rows)[m.rows[1][0]]["note"].plain == "⚠ rank 517 · 1 flagged"
    # the check bites: before the hang the order was the sort's own, the note empty
    assert healthy.rows[0][0] != f"n{hung_node}"
    assert dict(healthy.rows)[f"n{hung_node}"]["note"].plain == ""
    for opened in (lambda nav: nav.set_filter("700"), lambda nav: nav.open(hung_node)):
        nav = nav_sorted(sort)
        opened(nav)
        m = b.model(v, 2.0, replay=True, table_width=150, nav=nav, visible_rows=8)
        assert m.rows[0][0] == f"r{sc.HUNG}", [k for k, _ in m.rows]  # its own row, first in its node
        assert dict(m.rows)[f"r{sc.HUNG}"]["note"].plain == "✖ hung: the others wait for it"


def nav_sorted(sort: str) -> OverviewNav:
    nav = OverviewNav()
    while nav.sort_key(sc.WORLD) != sort:
        nav.next_sort(sc.WORLD)
    return nav


def test_the_memory_and_comm_tabs_put_the_hung_ranks_node_first_and_name_it():
    from ringtop.tui.large_run.nav import comm_nav, memory_nav

    seq = sc.hs.Seq()
    v = RunView(watch_liveness=False)
    v.apply_many(sc.run(steps=6, seq=seq), now=1.0)
    before = [MemoryTab().model(v, 150, nav=memory_nav(), visible_rows=8).rows[0][0],
              CommTab().model(v, None, 150, nav=comm_nav(), visible_rows=8).ranks_rows[0][0]]
    assert f"n{sc.host(sc.HUNG)}" not in before  # the check bites: not first before the hang
    v.apply_many(sc.hung_reports(seq, steps=6), now=1.5)
    for rows in (MemoryTab().model(v, 150, nav=memory_nav(), visible_rows=8).rows,
                 CommTab().model(v, None, 150, nav=comm_nav(), visible_rows=8).ranks_rows):
        key, cells = rows[0]
        assert key == f"n{sc.host(sc.HUNG)}" and cells["note"].plain.startswith("✖ rank 700 hung"), rows[0]
