"""The TP x PP x DP cost model (metrics/costs/mesh_cost.py) and `ringtop plan --tp --pp --dp`. Expected
figures are worked out here from the layout's own arithmetic, the measured TP facts
(shared/notes/tensor-parallel-facts.md) and the chapter's 64-GPU example, not read off the code."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ringtop.metrics.costs.cost_model import ModelSpec, comm_per_step, memory_per_rank
from ringtop.metrics.costs.links import LINKS
from ringtop.metrics.costs.mesh_cost import Shape, assumed_shape, mesh_cost, tp_comm_per_step
from ringtop.metrics.parallel_dims import ParallelDims

NV, IB = LINKS["nvlink4"], LINKS["ib-ndr"]


def cost(model: ModelSpec, mesh: ParallelDims, shape: Shape, dp_strategy: str = "ddp"):
    return mesh_cost(model, mesh, shape, dp_strategy=dp_strategy, link_tp=NV, link_pp=IB, link_dp=IB)


def test_tp_all_reduces_match_what_was_measured_on_gloo():
    # 2 layers, d 64, batch 4, seq 32, fp32, TP=2: 4 all-reduces of [4, 32, 64] forward and 4
    # backward, 262,144 payload bytes per rank per step (CommDebugMode and the profiler agreed).
    shape = Shape(layers=2, hidden=64, seq_len=32, micro_batch_size=4, micro_batches=1, activation_bytes=4)
    (ar,) = tp_comm_per_step(shape, tp=2, layers_held=2).collectives
    assert ar.kind == "all_reduce" and ar.payload_bytes == 262_144 == 8 * 4 * 32 * 64 * 4
    assert ar.sent_bytes == 262_144  # a ring of 2 moves 2(N-1)/N = 1x the payload
    (ar4,) = tp_comm_per_step(shape, tp=4, layers_held=2).collectives
    assert ar4.sent_bytes == 262_144 * 2 * 3 // 4
    assert tp_comm_per_step(shape, tp=1, layers_held=2).collectives == ()


def test_the_chapters_64_gpus_8_tp_2_pp_4_dp():
    params, layers, hidden, seq, m = 7_000_000_000, 32, 4096, 4096, 8
    model = ModelSpec.from_dtype(params, "bf16", 8)
    c = cost(model, ParallelDims(tp=8, pp=2, dp=4), Shape(layers, hidden, seq, 1, m, 2))
    held = params // 16  # each rank: one of 8 TP shards of one of 2 stages
    assert c.memory.total_bytes == held * (2 + 2 + 8) == 5_250_000_000
    act = 1 * seq * hidden * 2
    tp, pp, dp = (c.group(d) for d in ("tp", "pp", "dp"))
    assert tp.comm.payload_bytes == 4 * (layers // 2) * m * act
    assert tp.comm.sent_bytes == round(2 * 7 / 8 * 4 * (layers // 2) * m * act)
    assert pp.comm.sent_bytes == 2 * m * act
    assert dp.comm.sent_bytes == round(2 * 3 / 4 * held * 2)  # DDP's all-reduce of the shard's bf16 grads
    assert tp.seconds == pytest.approx(tp.comm.sent_bytes / 450e9)
    assert dp.seconds == pytest.approx(dp.comm.sent_bytes / 50e9)
    assert c.bubble_fraction == pytest.approx(1 / 9)  # (2-1)/(2+8-1)
    assert tp.comm.sent_bytes > 20 * dp.comm.sent_bytes  # why TP needs the fastest link


def test_one_dimension_alone_is_the_plain_strategy():
    """No TP and no PP is data parallelism, and PP with DDP replicas is the `pp` strategy."""
    model = ModelSpec.from_dtype(1_000_000_000, "bf16", 12)
    shape = Shape(24, 2048, 2048)
    for strategy in ("ddp", "zero1", "zero2", "zero3", "fsdp-full"):
        c = cost(model, ParallelDims(dp=8), shape, strategy)
        assert c.memory == memory_per_rank(strategy, 8, model)
        assert c.group("dp").comm == comm_per_step(strategy, 8, model)
        assert c.group("tp").comm.sent_bytes == c.group("pp").comm.sent_bytes == 0
    c = cost(model, ParallelDims(pp=4, dp=2), shape)
    assert c.memory == memory_per_rank("pp", 8, model, pp_stages=4)
    assert c.group("dp").comm == comm_per_step("pp", 8, model, pp_stages=4)


def test_a_layout_that_cannot_work_is_refused_with_the_reason():
    model = ModelSpec.from_dtype(7_000_000_000)
    with pytest.raises(ValueError, match="must divide the hidden size"):
        cost(model, ParallelDims(tp=3), Shape(32, 4096, 4096))
    with pytest.raises(ValueError, match="cannot exceed the layers"):
        cost(model, ParallelDims(pp=64), Shape(32, 4096, 4096))
    with pytest.raises(ValueError, match="data-parallel strategy"):
        cost(model, ParallelDims(dp=2), Shape(32, 4096, 4096), "pp")
    with pytest.raises(ValueError, match=">= 1"):
        ParallelDims(tp=0)


def test_an_assumed_shape_is_the_known_models_at_their_sizes():
    assert assumed_shape(7_000_000_000) == (32, 4096)  # Llama-2-7B
    assert assumed_shape(13_000_000_000) == (40, 5120)  # Llama-2-13B
    assert assumed_shape(125_000_000) == (12, 768)  # GPT-2 small


def plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ringtop.cli", "plan", *args], capture_output=True, text=True,
                          timeout=60)


def test_plan_reproduces_the_64_gpu_layout_and_says_why_tp_stays_inside_the_node():
    res = plan("--params", "7e9", "--tp", "8", "--pp", "2", "--dp", "4", "--micro-batches", "8",
               "--link-tp", "nvlink4", "--link-dp", "ib-ndr")
    assert res.returncode == 0, res.stderr
    assert "TP 8 x PP 2 x DP 4 = 64 ranks on 8 node(s) of 8" in res.stdout
    assert "TP stays inside the node" in res.stdout and "(9.0x)" in res.stdout  # 450 / 50 GB/s
    mesh = json.loads(plan("--params", "7e9", "--tp", "8", "--pp", "2", "--dp", "4", "--micro-batches", "8",
                           "--json").stdout)["mesh"]
    assert (mesh["ranks"], mesh["nodes"], mesh["tp_within_node"]) == (64, 8, True)
    assert mesh["memory"]["total_bytes"] == 5_250_000_000
    assert mesh["groups"]["tp"]["link"] == "nvlink4" and mesh["groups"]["dp"]["link"] == "ib-ndr"
    assert mesh["tp_comm_s_across_nodes"] == pytest.approx(9 * mesh["groups"]["tp"]["comm_s"])


def test_plan_warns_when_tp_spans_nodes_and_refuses_what_does_not_add_up():
    res = plan("--params", "7e9", "--tp", "16", "--dp", "4")
    assert res.returncode == 0 and "warning: TP 16 does not fit in a node of 8" in res.stdout
    for args, message in ((("--tp", "8", "--dp", "4", "--ranks", "30"), "is not tp x pp x dp"),
                          (("--tp", "3", "--dp", "2"), "must divide the hidden size"),
                          (("--tp", "0"), "--tp must be between 1"),
                          (("--tp", "2", "--link-dp", "warp-drive"), "--link-dp"),
                          ((), "--ranks is required")):
        res = plan("--params", "7e9", *args)
        assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr, (args, res.stderr)
