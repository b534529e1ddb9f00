"""A node row's min / median / max and its worst rank, against Python's own statistics over the
same ranks' values; the Memory tab's node rows and most-memory rank from random figures."""

from __future__ import annotations

import math
import statistics

from hypothesis import given, settings
from hypothesis import strategies as st

from ringtop.tui.state.nodes import spread
from ringtop.tui.tabs.memory.scale import MemFigures, memory_nodes, most_memory, sort_memory_nodes

values = st.one_of(st.floats(min_value=0, max_value=1e12, allow_nan=False), st.just(math.nan))


def reference(by_rank: dict[int, float]) -> tuple[float, float, float, int | None]:
    finite = {r: v for r, v in by_rank.items() if not math.isnan(v)}
    if not finite:
        return math.nan, math.nan, math.nan, None
    top = max(finite.values())
    return min(finite.values()), statistics.median(finite.values()), top, min(r for r, v in finite.items() if v == top)


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(0, 4095), values, max_size=40))
def test_spread_is_min_median_max_of_the_finite_values_and_the_lowest_rank_at_the_max(by_rank):
    got = spread(by_rank)
    lo, mid, hi, worst = reference(by_rank)
    assert same(got.min, lo) and same(got.max, hi) and got.worst == worst
    assert same(got.median, mid) or math.isclose(got.median, mid, rel_tol=1e-15)  # mean of the middle two


def figures(mem: dict[int, float], hosts: dict[int, str]) -> dict[int, MemFigures]:
    return {r: MemFigures(rank=r, host=hosts[r], mem=v, state=v / 2, other=v / 4, peak=v * 1.1,
                          pred_pct=math.nan, dead=False, ended=False) for r, v in mem.items()}


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.integers(0, 255), st.floats(min_value=1, max_value=1e11, allow_nan=False),
                       min_size=1, max_size=48),
       st.integers(1, 5))
def test_memory_node_rows_are_each_hosts_own_statistics(mem, n_hosts):
    hosts = {r: f"node-{r % n_hosts}" for r in mem}
    nodes = memory_nodes(figures(mem, hosts))
    assert [n.host for n in nodes] == sorted(set(hosts.values()))
    for node in nodes:
        own = {r: mem[r] for r in mem if hosts[r] == node.host}
        assert node.ranks == tuple(sorted(own))
        lo, mid, hi, worst = reference(own)
        m = node.spreads["mem"]
        assert (m.min, m.max, m.worst) == (lo, hi, worst) and math.isclose(m.median, mid, rel_tol=1e-12)
        assert node.spreads["state"].max == hi / 2
    top = max(mem.values())
    assert most_memory(figures(mem, hosts)) == min(r for r, v in mem.items() if v == top)
    order = sort_memory_nodes(nodes, "mem")
    assert [n.spreads["mem"].max for n in order] == sorted((n.spreads["mem"].max for n in nodes), reverse=True)


def test_the_reference_tells_one_nodes_figures_from_anothers():
    """The comparison bites: node-1's row does not pass as node-0's."""
    mem = {0: 1.0, 1: 10.0, 2: 3.0, 3: 30.0}
    nodes = {n.host: n for n in memory_nodes(figures(mem, {r: f"node-{r % 2}" for r in mem}))}
    lo, mid, hi, worst = reference({0: 1.0, 2: 3.0})
    other = nodes["node-1"].spreads["mem"]
    assert (other.min, other.median, other.max, other.worst) != (lo, mid, hi, worst)
    mine = nodes["node-0"].spreads["mem"]
    assert (mine.min, mine.median, mine.max, mine.worst) == (lo, mid, hi, worst)
