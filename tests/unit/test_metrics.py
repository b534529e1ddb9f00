"""ringtop.metrics against references worked by hand from the formulas (nccl-tests' busbw
definitions in its doc/PERFORMANCE.md, the step-time split, the others'-median rule)."""

from __future__ import annotations

import math
import typing

import pytest

from ringtop.metrics import fmt
from ringtop.metrics.costs.busbw import (
    BUSBW_FACTOR_KINDS,
    algbw_gbps,
    busbw_factor,
    busbw_factor_or_nan,
    busbw_gbps,
    rate_gbps,
)
from ringtop.metrics.rules.outliers import (
    SLOWEST_SHOWN,
    STRAGGLER,
    Threshold,
    excess_pct,
    median,
    outliers,
    slowest,
)
from ringtop.metrics.strategy_names import (
    DATA_PARALLEL_STRATEGIES,
    FSDP_SHARDINGS,
    PP_SCHEDULES,
    STRATEGIES,
    STRATEGY_CHOICES,
    ZERO_STRATEGIES,
    canonical_strategy,
    picker_label,
    sharded_label,
    strategy_label,
    switch_args,
)
from ringtop.metrics.timing import compute_ms, overlap_pct, share_pct
from ringtop.protocol import CommStat, Step, decode, encode

# ---------------------------------------------------------------------- busbw


def test_busbw_factors_are_nccl_tests():
    # all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, reduce 1
    assert busbw_factor("all_reduce", 8) == 14 / 8
    assert busbw_factor("all_reduce", 2) == 1.0
    assert busbw_factor("all_reduce", 1) == 0.0
    for kind in ("all_gather", "reduce_scatter", "all_to_all"):
        assert busbw_factor(kind, 4) == 3 / 4
    assert busbw_factor("broadcast", 16) == busbw_factor("reduce", 3) == 1.0
    assert set(BUSBW_FACTOR_KINDS) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                                       "reduce"}
    with pytest.raises(ValueError):
        busbw_factor("send", 2)
    with pytest.raises(ValueError):
        busbw_factor("all_reduce", 0)


def test_algbw_and_busbw():
    # 1 GB in 0.5 s = 2 GB/s; an all-reduce over 4 ranks: 2 x 3/4 x 2 = 3 GB/s on the bus
    assert algbw_gbps(1e9, 0.5) == 2.0
    assert busbw_gbps("all_reduce", 1e9, 0.5, 4) == 3.0
    assert busbw_gbps("all_gather", 4e9, 1.0, 4) == 3.0
    with pytest.raises(ValueError):
        algbw_gbps(1, 0.0)
    # the UI's window rate: 2 MB in 1 ms = 2 GB/s; NaN without time or bytes
    assert rate_gbps(2e6, 1.0) == pytest.approx(2.0)
    assert math.isnan(rate_gbps(2e6, 0.0)) and math.isnan(rate_gbps(math.nan, 1.0))
    assert math.isnan(busbw_factor_or_nan("send", 2)) and math.isnan(busbw_factor_or_nan("all_reduce", 0))
    assert busbw_factor_or_nan("all_reduce", 4) == 1.5


# ---------------------------------------------------------------------- timing


def test_compute_exposed_idle_and_overlap():
    assert compute_ms(200.0, 150.0, 10.0) == 40.0
    assert compute_ms(100.0, 90.0, 20.0) == 0.0  # waits longer than the step: never below 0
    assert math.isnan(compute_ms(0.0, 0.0, 0.0))
    assert share_pct(25.0, 200.0) == 12.5 and math.isnan(share_pct(1.0, 0.0))
    assert overlap_pct(20.0, 5.0) == 75.0
    assert overlap_pct(20.0, 30.0) == 0.0 and overlap_pct(20.0, -1.0) == 100.0
    assert math.isnan(overlap_pct(0.0, 0.0)) and math.isnan(overlap_pct(10.0, math.nan))


# ---------------------------------------------------------------------- the slowest-rank rule


def test_median_and_excess():
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([4.0, 1.0, 2.0, 3.0]) == 2.5 and math.isnan(median([]))
    assert excess_pct(150.0, 100.0) == 50.0
    assert excess_pct(5.0, 0.0) == math.inf and excess_pct(0.0, 0.0) == 0.0


def test_slowest_is_held_against_the_others_median():
    # 150 against median(100, 101) = 100.5, not against the median of all three (101)
    s = slowest({0: 100.0, 1: 150.0, 2: 101.0})
    assert (s.rank, s.value_ms, s.others_median_ms) == (1, 150.0, 100.5)
    assert s.excess_pct == pytest.approx(100 * (150 / 100.5 - 1)) and s.excess_ms == 49.5
    # two ranks: the other one is the baseline
    assert slowest({0: 110.0, 1: 100.0}).excess_pct == pytest.approx(10.0)
    # a tie goes to the higher rank; non-finite times are left out; fewer than two: none
    assert slowest({0: 5.0, 1: 5.0}).rank == 1
    assert slowest({0: 100.0, 1: math.nan, 2: 120.0}).others_median_ms == 100.0
    assert slowest({0: 100.0, 1: math.nan}) is None and slowest({}) is None


def test_threshold_fires_at_and_not_below_it():
    at = slowest({0: 100.0, 1: 100.0, 2: 150.0})  # +50 %, +50 ms
    assert at.meets(Threshold(50.0)) and not at.meets(Threshold(50.001))
    assert at.meets(Threshold(0.0, 50.0)) and not at.meets(Threshold(0.0, 50.001))
    # the straggler rule: +50 % and +25 ms, both at once
    assert at.meets(STRAGGLER)
    assert not slowest({0: 10.0, 1: 10.0, 2: 30.0}).meets(STRAGGLER)  # +200 % but only +20 ms
    assert slowest({0: 50.0, 1: 50.0, 2: 75.0}).meets(STRAGGLER)      # +50 %, +25 ms exactly
    assert not slowest({0: 100.0, 1: 100.0, 2: 149.0}).meets(STRAGGLER)
    # every screen marks and names the slowest rank by compute from +10 %, the verdict from +50 %
    assert slowest({0: 100.0, 1: 110.0}).meets(SLOWEST_SHOWN)
    assert not slowest({0: 100.0, 1: 109.9}).meets(SLOWEST_SHOWN)
    assert SLOWEST_SHOWN.min_excess_pct < STRAGGLER.min_excess_pct


def test_outliers_names_every_slow_rank_and_the_slowest_among_them():
    times = {0: 100.0, 1: 200.0, 2: 100.0, 3: 210.0}
    # rank 1 against median(100, 100, 210) = 100; rank 3 against median(100, 200, 100) = 100
    found = outliers(times, STRAGGLER)
    assert [(o.rank, o.others_median_ms) for o in found] == [(1, 100.0), (3, 100.0)]
    assert slowest(times).rank in {o.rank for o in found}
    assert outliers({0: 100.0, 1: 101.0}, STRAGGLER) == [] and outliers({0: 1.0}, STRAGGLER) == []
    # the others take 0 ms: any rank over the ms floor is a straggler
    assert [o.rank for o in outliers({0: 0.0, 1: 0.0, 2: 30.0}, STRAGGLER)] == [2]


# ---------------------------------------------------------------------- strategy names


def test_strategy_names_and_labels():
    assert DATA_PARALLEL_STRATEGIES == tuple(s for s in STRATEGIES if s not in ("pp", "tp"))
    assert set(ZERO_STRATEGIES) < set(STRATEGY_CHOICES)
    names = {canonical_strategy(s, sh) for s in STRATEGY_CHOICES for sh in (FSDP_SHARDINGS if s == "fsdp" else [None])}
    assert names == set(STRATEGIES)
    assert canonical_strategy("FULL_SHARD") == "fsdp-full" and canonical_strategy("fsdp(grad-op)") == "fsdp-grad-op"
    assert switch_args("fsdp-no-shard") == {"strategy": "fsdp", "fsdp_sharding": "no-shard"}
    assert switch_args("zero2") == {"strategy": "zero2"}
    for name in STRATEGIES:
        args = switch_args(name)
        assert canonical_strategy(args["strategy"], args.get("fsdp_sharding")) == name
    assert [picker_label(s) for s in ("ddp", "fsdp-grad-op")] == ["ddp", "fsdp grad-op"]
    assert strategy_label("fsdp", {"sharding": "full"}) == "fsdp(full)" and strategy_label("fsdp", {}) == "fsdp"
    assert strategy_label("pp", {"schedule": "1f1b", "stages": 2, "micro_batches": 4}) == "pp(1f1b, N=2, M=4)"
    assert strategy_label("pp", {}) == "pp" and strategy_label("zero3", {"stage": 3}) == "zero3"
    assert strategy_label("tp", {"degree": 2}) == "tp(N=2)" and strategy_label("tp", {}) == "tp"
    assert strategy_label("tp", {"degree": 2, "sequence_parallel": True}) == "tp(N=2, sequence-parallel)"
    assert strategy_label("fsdp", {"sharding": "full", "tp": 2}) == "fsdp(full, tp=2)"

    class Sh(typing.NamedTuple):
        params: bool
        grads: bool
        optimizer: bool

    assert sharded_label(Sh(True, True, True)) == "params+grads+optim"
    assert sharded_label(Sh(False, True, True)) == "grads+optim"
    assert sharded_label(Sh(False, False, False)) == "-" and sharded_label(Sh(False, False, False), "") == ""


def test_the_wire_schema_spells_the_same_lists():
    from ringtop.protocol.commands import SwitchArgs

    hints = typing.get_type_hints(SwitchArgs, include_extras=False)

    def literal(t) -> tuple:
        """The values of `Literal[...]`, or of the Literal inside `Literal[...] | None`."""
        inner = [a for a in typing.get_args(t) if typing.get_origin(a) is typing.Literal]
        return typing.get_args(inner[0] if inner else t)

    assert literal(hints["strategy"]) == STRATEGY_CHOICES
    assert literal(hints["fsdp_sharding"]) == FSDP_SHARDINGS
    assert literal(hints["pp_schedule"]) == PP_SCHEDULES


def test_the_strategy_registry_holds_the_same_names():
    pytest.importorskip("torch")
    from ringtop.strategies import fsdp, registry

    assert tuple(registry.strategy_names()) == STRATEGY_CHOICES
    assert tuple(fsdp.SHARDINGS) == FSDP_SHARDINGS


# ---------------------------------------------------------------------- formats


def test_formats():
    # sizes in binary units, the chapter's decimal GB by hand: 12.25e9 / 2**30 = 11.41, 91.2e9 -> 84.94,
    # 0.5e9 / 2**20 = 476.8 MiB
    assert [fmt.nbytes(x) for x in (12.25e9, 91.2e9, 0.5e9, 0)] == ["11.4GiB", "84.9GiB", "477MiB", "0B"]
    assert [fmt.seconds(x) for x in (0, 0.05444, 0.7656)] == ["0", "0.0544", "0.766"]
    assert [fmt.us(x) for x in (12.5, 99.99, 123.4)] == ["12.50", "99.99", "123.4"]
    assert [fmt.pct(x) for x in (math.nan, 5.26, 54.3)] == ["-", "5.3", "54"]
    assert [fmt.fraction_pct(x) for x in (0.2727, math.nan)] == ["27.3%", "-"]
    assert fmt.signed_fraction_pct(-0.012) == "\u22121.2%" and fmt.signed_fraction_pct(0.05) == "+5.0%"
    assert [fmt.delta_pct(x) for x in (0.123, -4.5, 120.0)] == ["+0.12%", "-4.5%", "+120%"]
    assert [fmt.mb_compact(x) for x in (0.001, 0.05, 7.25, 12.5, 1234.4, 12_345.0)] == \
        ["0", "0.05", "7.2", "12.5", "1234", "12k"]
    assert [fmt.gbps(x) for x in (1.048576, 13.74, 450.0)] == ["1.05", "13.7", "450"]
    assert [fmt.nbytes(x) for x in (512, 48 << 20)] == ["512B", "48.0MiB"]


# ---------------------------------------------------------------------- one struct for a kind's totals


def test_the_tracer_hands_the_step_message_its_own_struct():
    from ringtop.agent.instruments.comm_tracer import CommTracer

    t = CommTracer()
    for nbytes in (100, 300):
        t.end(t.begin("all_reduce", nbytes, 4))
    t.end(t.begin("broadcast", 8, 4))
    kinds = t.drain().kinds
    assert all(type(k) is CommStat for k in kinds)
    assert [(k.kind, k.count, k.bytes, k.group_size) for k in kinds] == [("all_reduce", 2, 400, 4),
                                                                        ("broadcast", 1, 8, 4)]
    msg = Step(rank=0, step=1, loss=1.0, step_ms=10.0, comm=kinds)
    assert decode(encode(msg)).comm == kinds


def test_the_tracer_totals_a_kind_per_mesh_dimension_it_is_told_of():
    from ringtop.agent.instruments.comm_tracer import CommTracer

    t = CommTracer(dimension_of={"0-1": "tp", "0-2/2": "dp"}.get)
    for nbytes, group in ((100, "0-1"), (300, "0-1"), (4, "world"), (50, "0-2/2")):
        t.end(t.begin("all_reduce", nbytes, 4 if group == "world" else 2, group))
    assert [(k.kind, k.group, k.count, k.bytes, k.group_size) for k in t.drain().kinds] == [
        ("all_reduce", "tp", 2, 400, 2), ("all_reduce", "", 1, 4, 4), ("all_reduce", "dp", 1, 50, 2)]
    plain = CommTracer()  # the agent's default names no dimension: one total per kind, as before
    for group in ("0-1", "world"):
        plain.end(plain.begin("all_reduce", 10, 2, group))
    assert [(k.group, k.count) for k in plain.drain().kinds] == [("", 2)]


def test_comm_stat_add_sums_calls_and_skips_a_time_that_is_not_finite():
    c = CommStat(kind="all_gather", group_size=2)
    c.add(CommStat(kind="all_gather", count=2, bytes=10, busy_ms=1.5))
    c.add(CommStat(kind="all_gather", count=1, bytes=5, busy_ms=math.nan))
    assert (c.count, c.bytes, c.busy_ms, c.group_size) == (3, 15, 1.5, 2)


def test_robust_z_and_loss_spikes_against_hand_computed_values():
    from ringtop.metrics.numerics import MAD_TO_SIGMA, loss_spike, robust_z

    # median 3, absolute deviations 2 1 0 1 2 -> MAD 1
    assert robust_z(9.0, [1, 2, 3, 4, 5]) == pytest.approx(6.0 / MAD_TO_SIGMA)
    assert robust_z(3.0, [3.0, 3.0]) == 0.0 and robust_z(4.0, [3.0, 3.0]) == math.inf
    assert math.isnan(robust_z(1.0, [])) and math.isnan(robust_z(math.nan, [1.0]))
    calm = [3.0, 3.1] * 15  # median 3.05, MAD 0.05: sigma 0.0741
    spike = loss_spike(calm, 3.6)  # 0.55 above: z 7.4
    assert spike is not None and spike.median == pytest.approx(3.05)
    assert spike.z == pytest.approx(0.55 / (MAD_TO_SIGMA * 0.05))
    assert loss_spike(calm, 3.4) is None  # z 4.7: below 6
    assert loss_spike(calm[:19], 3.6) is None  # too few steps to judge
    # one earlier spike in the window does not raise the bar for the next (a mean and std would)
    assert loss_spike(calm[:-1] + [9.0], 3.6) is not None
