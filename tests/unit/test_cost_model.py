"""The torch-free cost model against the chapter's and the ZeRO paper's numbers.

Expected values are literals from those sources (cited beside each) or hand arithmetic written
out in the test — never values computed by the code under test.
"""

from __future__ import annotations

import pytest

from ringtop.metrics.costs.busbw import algbw_gbps, busbw_factor, busbw_gbps
from ringtop.metrics.costs.cost_model import (
    CollectiveBytes,
    CommPerStep,
    ModelSpec,
    comm_overhead,
    comm_per_step,
    comm_share_of_step,
    comm_time_s,
    fits,
    gpipe_bubble_fraction,
    memory_per_rank,
    one_f_one_b_bubble_fraction,
    peak_in_flight_micro_batches,
    pipeline_p2p_sent_bytes,
    ring_all_reduce_sent_bytes,
    sharding_of,
    strategy_cost,
    which_fit,
)
from ringtop.metrics.costs.links import LINKS, Link, parse_link
from ringtop.metrics.strategy_names import canonical_strategy

GB = 1e9

# The chapter's 7B table (seed/distributed-training-basics.zh.txt, 11.3): its 15.2 GB of bf16
# params is 7.6e9 params x 2 bytes; optimizer state 4x the param bytes = 8 bytes/param.
CHAPTER_MODEL = ModelSpec(params=7_600_000_000, param_bytes=2, grad_bytes=2, optimizer_bytes_per_param=8)
# The ZeRO paper (arXiv 1910.02054), Figure 1: Psi = 7.5B, mixed-precision Adam, K = 12, N_d = 64.
ZERO_PAPER_MODEL = ModelSpec(params=7_500_000_000, param_bytes=2, grad_bytes=2, optimizer_bytes_per_param=12)
# The chapter's communication example (11.1): 7B params, bf16 grads -> 14 GB.
COMM_MODEL = ModelSpec(params=7_000_000_000, param_bytes=2, grad_bytes=2, optimizer_bytes_per_param=8)


def gb(n: float) -> float:
    return n / GB


# ------------------------------------------------------------------ memory


@pytest.mark.parametrize("strategy, params_gb, grads_gb, optimizer_gb, total_gb", [
    # chapter 11.3: "模型参数 15.2 GB, 梯度 15.2 GB, 优化器状态 60.8 / 8 = 7.6 GB, 总计 ~38 GB"
    ("zero1", 15.2, 15.2, 7.6, 38.0),
    # "梯度 15.2 / 8 = 1.9 GB, 优化器状态 7.6 GB, 总计 ~24.7 GB"
    ("zero2", 15.2, 1.9, 7.6, 24.7),
    # "模型参数 15.2 / 8 = 1.9 GB, 梯度 1.9 GB, 优化器状态 7.6 GB, 总计 ~11.4 GB"
    ("zero3", 1.9, 1.9, 7.6, 11.4),
    # plain DDP: 15.2 + 15.2 + 60.8 (the chapter's parts); their sum is 91.2 (the chapter says "~95")
    ("ddp", 15.2, 15.2, 60.8, 91.2),
])
def test_chapter_memory_table(strategy, params_gb, grads_gb, optimizer_gb, total_gb):
    mem = memory_per_rank(strategy, 8, CHAPTER_MODEL)
    assert gb(mem.params_bytes) == pytest.approx(params_gb, abs=0.05)
    assert gb(mem.grads_bytes) == pytest.approx(grads_gb, abs=0.05)
    assert gb(mem.optimizer_bytes) == pytest.approx(optimizer_gb, abs=0.05)
    assert gb(mem.total_bytes) == pytest.approx(total_gb, abs=0.05)


def test_chapter_ddp_total_is_about_95_gb():
    # The chapter's "原来是 ~95 GB" is loose: 15.2 + 15.2 + 60.8 = 91.2, within 5 % of 95.
    total = gb(memory_per_rank("ddp", 8, CHAPTER_MODEL).total_bytes)
    assert abs(total - 95) / 95 < 0.05


@pytest.mark.parametrize("strategy, total_gb", [
    ("ddp", 120.0),    # ZeRO paper Fig. 1 baseline: (2 + 2 + K) Psi = 16 x 7.5 = 120 GB
    ("zero1", 31.4),   # P_os: 4 Psi + K Psi / N_d = 30 + 1.406 = 31.4 GB
    ("zero2", 16.6),   # P_os+g: 2 Psi + (2 + K) Psi / N_d = 15 + 1.641 = 16.6 GB
    ("zero3", 1.9),    # P_os+g+p: (2 + 2 + K) Psi / N_d = 120 / 64 = 1.875 -> 1.9 GB
])
def test_zero_paper_figure_1(strategy, total_gb):
    assert gb(memory_per_rank(strategy, 64, ZERO_PAPER_MODEL).total_bytes) == pytest.approx(total_gb, abs=0.05)


def test_fsdp_shardings_map_to_zero_stages():
    # chapter 11.4: FULL_SHARD ~ ZeRO-3, SHARD_GRAD_OP ~ ZeRO-2, NO_SHARD = DDP
    for fsdp, zero in (("full", "zero3"), ("grad-op", "zero2"), ("no-shard", "ddp")):
        name = canonical_strategy("fsdp", fsdp)
        assert memory_per_rank(name, 8, CHAPTER_MODEL) == memory_per_rank(zero, 8, CHAPTER_MODEL)
    assert canonical_strategy("fsdp", "FULL_SHARD") == "fsdp-full"
    assert canonical_strategy("fsdp(grad-op)") == "fsdp-grad-op"
    assert canonical_strategy("SHARD_GRAD_OP") == "fsdp-grad-op"
    assert sharding_of("zero1").optimizer and not sharding_of("zero1").grads
    assert sharding_of("zero3").params
    with pytest.raises(ValueError, match="unknown strategy"):
        canonical_strategy("zero4")
    with pytest.raises(ValueError, match="sharding"):
        canonical_strategy("fsdp", "hybrid")


def test_sharded_state_rounds_up_to_equal_shards():
    # 10 params over 4 ranks: shards of ceil(10/4) = 3 params; fp32 -> 12 bytes
    mem = memory_per_rank("zero3", 4, ModelSpec(10, 4, 4, 8))
    assert (mem.params_bytes, mem.grads_bytes, mem.optimizer_bytes) == (12, 12, 24)


def test_dtype_bytes():
    assert ModelSpec.from_dtype(100, "fp32") == ModelSpec(100, 4, 4, 8)
    assert ModelSpec.from_dtype(100, "bf16", 12) == ModelSpec(100, 2, 2, 12)
    with pytest.raises(ValueError, match="dtype"):
        ModelSpec.from_dtype(100, "int3")


def test_pipeline_memory_splits_layers_over_stages():
    # 8 ranks, 4 stages: each stage holds 7e9 / 4 = 1.75e9 params: 3.5 + 3.5 + 14 = 21 GB
    mem = memory_per_rank("pp", 8, COMM_MODEL, pp_stages=4)
    assert gb(mem.params_bytes) == pytest.approx(3.5)
    assert gb(mem.total_bytes) == pytest.approx(21.0)
    with pytest.raises(ValueError, match="multiple"):
        memory_per_rank("pp", 8, COMM_MODEL, pp_stages=3)


# ------------------------------------------------------------------ bytes on the wire


def test_ddp_sends_ring_all_reduce_volume():
    # chapter 11.1: 2 x (N-1)/N x 14 GB = 2 x 7/8 x 14 = 24.5 GB per rank
    comm = comm_per_step("ddp", 8, COMM_MODEL)
    (ar,) = comm.collectives
    assert ar.kind == "all_reduce"
    assert ar.payload_bytes == 14_000_000_000
    assert ar.sent_bytes == 24_500_000_000
    assert ring_all_reduce_sent_bytes(14_000_000_000, 8) == 24_500_000_000


def test_zero1_and_zero2_are_reduce_scatter_plus_all_gather_at_ddp_volume():
    # (N-1)/N x 14 GB = 12.25 GB each way
    for name in ("zero1", "zero2", "fsdp-grad-op"):
        kinds = comm_per_step(name, 8, COMM_MODEL).by_kind()
        assert set(kinds) == {"reduce_scatter", "all_gather"}
        assert kinds["reduce_scatter"].sent_bytes == 12_250_000_000
        assert kinds["all_gather"].sent_bytes == 12_250_000_000
        assert comm_per_step(name, 8, COMM_MODEL).sent_bytes == 24_500_000_000


def test_zero3_sends_one_and_a_half_times_ddp():
    # two all-gathers of params (forward, backward) + one reduce-scatter: 3 x 7/8 x 14 = 36.75 GB
    # = 1.5 x 24.5 (chapter 11.3: Stage 3 "通信量是 Stage 2 的约 1.5 倍")
    for name in ("zero3", "fsdp-full"):
        comm = comm_per_step(name, 8, COMM_MODEL)
        kinds = comm.by_kind()
        assert kinds["all_gather"].payload_bytes == 28_000_000_000
        assert kinds["all_gather"].sent_bytes == 24_500_000_000
        assert kinds["reduce_scatter"].sent_bytes == 12_250_000_000
        assert comm.sent_bytes == 36_750_000_000
        assert comm.sent_bytes / 24_500_000_000 == 1.5


def test_gloo_reduce_scatter_moves_twice_the_bytes():
    # gloo runs reduce_scatter_tensor as an all-reduce of the full input: 2 x 7/8 x 14 = 24.5 GB
    # instead of 7/8 x 14 = 12.25 GB (shared/notes/cpu-distributed-facts.md)
    nccl = comm_per_step("zero2", 8, COMM_MODEL).by_kind()["reduce_scatter"]
    gloo = comm_per_step("zero2", 8, COMM_MODEL, gloo_reduce_scatter_as_all_reduce=True).by_kind()["reduce_scatter"]
    assert nccl.payload_bytes == gloo.payload_bytes == 14_000_000_000
    assert (nccl.sent_bytes, gloo.sent_bytes) == (12_250_000_000, 24_500_000_000)
    # DDP has no reduce-scatter: the option leaves it alone
    assert comm_per_step("ddp", 8, COMM_MODEL, gloo_reduce_scatter_as_all_reduce=True).sent_bytes == 24_500_000_000


def test_mixed_dtypes_use_grad_bytes_for_reductions_and_param_bytes_for_gathers():
    # 800 params, fp32 grads (3200 B), bf16 params (1600 B), 4 ranks: RS 3/4 x 3200, AG 3/4 x 1600
    kinds = comm_per_step("zero2", 4, ModelSpec(800, param_bytes=2, grad_bytes=4)).by_kind()
    assert kinds["reduce_scatter"].sent_bytes == 2400
    assert kinds["all_gather"].sent_bytes == 1200


def test_one_rank_sends_nothing():
    assert comm_per_step("zero3", 1, COMM_MODEL).sent_bytes == 0


def test_pipeline_comm():
    # 8 ranks, 4 stages -> 2 copies of each stage: all-reduce 2 x 1/2 x (1.75e9 x 2 B) = 3.5 GB
    comm = comm_per_step("pp", 8, COMM_MODEL, pp_stages=4)
    assert comm.sent_bytes == 3_500_000_000
    # a middle stage sends activations forward and their grads back: 2 x M x A
    assert pipeline_p2p_sent_bytes(1000, 8) == 16_000
    comm = comm_per_step("pp", 4, COMM_MODEL, pp_stages=4, activation_bytes_per_micro_batch=1000, micro_batches=8)
    assert comm.by_kind() == {"send": CollectiveBytes("send", 16_000, 16_000)}


def test_by_kind_sums_entries_of_one_kind():
    comm = CommPerStep((CollectiveBytes("all_gather", 10, 5), CollectiveBytes("all_gather", 10, 5)))
    assert comm.by_kind() == {"all_gather": CollectiveBytes("all_gather", 20, 10)}


def test_strategy_cost_bundles_memory_and_comm():
    cost = strategy_cost("fsdp", 8, CHAPTER_MODEL)
    assert cost.strategy == "fsdp-full"
    assert cost.memory == memory_per_rank("zero3", 8, CHAPTER_MODEL)
    assert cost.comm.sent_bytes == comm_per_step("zero3", 8, CHAPTER_MODEL).sent_bytes


# ------------------------------------------------------------------ time and overhead


def test_chapter_all_reduce_times():
    sent = 24_500_000_000  # 2 x 7/8 x 14 GB
    nvlink = comm_time_s(sent, LINKS["nvlink4"])
    pcie = comm_time_s(sent, LINKS["pcie4"])
    assert nvlink == pytest.approx(24.5 / 450)  # 900 GB/s bidirectional = 450 per direction
    assert pcie == pytest.approx(24.5 / 32)  # 64 GB/s bidirectional = 32 per direction
    assert round(nvlink, 2) == 0.05  # chapter: "通信时间约 0.05 秒"
    assert round(pcie, 1) == 0.8  # chapter: "通信时间约 0.8 秒"
    # against a 2 s compute step: NVLink "2.5%", PCIe "30%+"
    nv_pct = 100 * comm_overhead(nvlink, 2.0)
    pcie_pct = 100 * comm_overhead(pcie, 2.0)
    assert nv_pct == pytest.approx(24.5 / 450 / 2 * 100)  # 2.72 %
    assert abs(nv_pct - 2.5) < 0.5
    assert pcie_pct > 30  # 38.3 %
    # comm / (compute + comm) would be 27.7 % on PCIe: not the chapter's "30%+"
    assert 100 * comm_share_of_step(pcie, 2.0) == pytest.approx(100 * 0.765625 / 2.765625)
    assert comm_time_s(45_000_000_000, 450.0) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        comm_time_s(1, 0)
    with pytest.raises(ValueError):
        comm_overhead(1.0, 0)


# ------------------------------------------------------------------ pipeline bubble


@pytest.mark.parametrize("micro_batches, expected, pct", [
    (1, 3 / 4, 75),    # chapter 11.2: "bubble 占比是 3/4 = 75%"
    (8, 3 / 11, 27),   # "bubble 降到 3/11 ≈ 27%"
    (32, 3 / 35, 9),   # "bubble 降到 3/35 ≈ 9%"
])
def test_bubble_fraction(micro_batches, expected, pct):
    for fn in (gpipe_bubble_fraction, one_f_one_b_bubble_fraction):
        assert fn(4, micro_batches) == pytest.approx(expected)
        assert round(100 * fn(4, micro_batches)) == pct


def test_bubble_rejects_bad_inputs_and_1f1b_holds_fewer_activations():
    with pytest.raises(ValueError):
        gpipe_bubble_fraction(0, 4)
    with pytest.raises(ValueError):
        one_f_one_b_bubble_fraction(4, 0)
    assert gpipe_bubble_fraction(1, 1) == 0
    assert peak_in_flight_micro_batches("gpipe", 4, 32) == 32
    assert peak_in_flight_micro_batches("1f1b", 4, 32) == 4
    assert peak_in_flight_micro_batches("1f1b", 4, 32, stage=3) == 1
    assert peak_in_flight_micro_batches("1f1b", 4, 2) == 2
    with pytest.raises(ValueError):
        peak_in_flight_micro_batches("zb", 4, 2)


# ------------------------------------------------------------------ busbw


@pytest.mark.parametrize("kind, n, factor", [
    ("all_reduce", 8, 2 * 7 / 8),  # nccl-tests PERFORMANCE.md: 2(n-1)/n
    ("all_gather", 8, 7 / 8),       # (n-1)/n
    ("reduce_scatter", 8, 7 / 8),
    ("all_to_all", 8, 7 / 8),
    ("broadcast", 8, 1.0),
    ("reduce", 8, 1.0),
    ("all_reduce", 2, 1.0),
    ("all_gather", 1, 0.0),
])
def test_busbw_factors(kind, n, factor):
    assert busbw_factor(kind, n) == pytest.approx(factor)


def test_algbw_and_busbw():
    # 14 GB all-reduced in 0.1 s over 8 ranks: algbw 140 GB/s, busbw 140 x 1.75 = 245 GB/s
    assert algbw_gbps(14e9, 0.1) == pytest.approx(140.0)
    assert busbw_gbps("all_reduce", 14e9, 0.1, 8) == pytest.approx(245.0)
    with pytest.raises(ValueError):
        busbw_factor("gossip", 8)
    with pytest.raises(ValueError):
        algbw_gbps(1, 0)


# ------------------------------------------------------------------ what fits


def test_which_fit_on_80_gb():
    # chapter model on 8 x 80 GB: DDP 91.2 GB does not fit; ZeRO-1 38.0, ZeRO-2 24.7, ZeRO-3 11.4 do
    res = {r.strategy: r for r in which_fit(CHAPTER_MODEL, 8, 80e9)}
    assert not res["ddp"].fits and not res["fsdp-no-shard"].fits
    assert all(res[s].fits for s in ("zero1", "zero2", "zero3", "fsdp-full", "fsdp-grad-op"))
    assert res["ddp"].headroom_bytes == 80_000_000_000 - 91_200_000_000
    assert "pp" not in res
    # with 20 GB for activations: 38.0 + 20 = 58 fits, on a 40 GB card only ZeRO-3 (11.4 + 20 = 31.4) fits
    res40 = {r.strategy: r.fits for r in which_fit(CHAPTER_MODEL, 8, 40e9, 20e9)}
    assert res40 == {"ddp": False, "zero1": False, "zero2": False, "zero3": True,
                     "fsdp-full": True, "fsdp-grad-op": False, "fsdp-no-shard": False}
    # exactly full is a fit
    mem = memory_per_rank("zero1", 8, CHAPTER_MODEL)
    assert fits(mem, 38_000_000_000) and not fits(mem, 38_000_000_000, 1)


def test_which_fit_includes_pp_when_staged():
    res = {r.strategy: r for r in which_fit(COMM_MODEL, 8, 80e9, pp_stages=4)}
    assert res["pp"].fits and res["pp"].need_bytes == 21_000_000_000


# ------------------------------------------------------------------ links


def test_named_links_are_per_direction_halves_of_the_chapters_bidirectional_figures():
    # chapter 11.5: NVLink 3.0 600, NVLink 4.0 900 GB/s bidirectional; PCIe Gen4 64 (11.1);
    # HDR 200 Gbps = 25 GB/s, NDR 400 Gbps = 50 GB/s
    assert LINKS["nvlink3"].bidirectional_gbps == 600
    assert LINKS["nvlink4"].bidirectional_gbps == 900
    assert LINKS["pcie4"].per_direction_gbps == 32 and LINKS["pcie4"].bidirectional_gbps == 64
    assert LINKS["pcie5"].per_direction_gbps == 64
    assert LINKS["ib-hdr"].per_direction_gbps == 25
    assert LINKS["ib-ndr"].per_direction_gbps == 50


def test_parse_link():
    assert parse_link("NVLink4") is LINKS["nvlink4"]
    assert parse_link("123").per_direction_gbps == 123.0
    assert parse_link("12.5GB/s").per_direction_gbps == 12.5
    assert isinstance(parse_link("ib-ndr"), Link)
    for bad in ("foo", "0", "-3", "inf", "nan", ""):
        with pytest.raises(ValueError):
            parse_link(bad)

