"""Sequence parallelism (`--strategy tp --tp-sequence-parallel`) on 2 gloo ranks: the LayerNorms
run on each rank's half of the sequence, the run trains like one process with the global batch,
and each all-reduce of the activations becomes an all-gather and a reduce-scatter of them (bytes
per step by a formula here, and by the run's own prediction). One agent run."""

from __future__ import annotations

import pytest
from conftest import finished_agents
from numerics import assert_moves_what_it_predicts, assert_trains_like_the_reference
from reference import reference_run

from ringtop.agent.config import ConfigError, check_tensor_parallel_world, parse_agent_args
from ringtop.agent.models.model import MODEL_SIZES
from ringtop.protocol import Hello

STEPS, BATCH, SEQ, LR = 4, 4, 32, 1e-3
CFG = MODEL_SIZES["1m"]


@pytest.fixture(scope="module")
def sp_run(tmp_path_factory):
    run = finished_agents(tmp_path_factory.mktemp("tp-sp"), 2, "--strategy", "tp", "--tp-sequence-parallel",
                          "--steps", str(STEPS), "--batch-size", str(BATCH), "--seq-len", str(SEQ), "--lr", str(LR),
                          "--checkpoint-every", str(STEPS), timeout_s=200)
    return run


@pytest.mark.timeout(240)
def test_sequence_parallel_tp_trains_like_one_process_with_the_global_batch(sp_run):
    assert [s.loss for s in sp_run.steps(0)] == [s.loss for s in sp_run.steps(1)]
    assert_trains_like_the_reference(sp_run, reference_run(STEPS, BATCH, SEQ, LR), STEPS, LR)
    hello = next(m for m in sp_run.messages(0) if isinstance(m, Hello))
    assert hello.strategy_options == {"sequence_parallel": True, "degree": 2}


@pytest.mark.timeout(240)
def test_each_all_reduce_becomes_an_all_gather_and_a_reduce_scatter_of_the_same_activations(sp_run):
    activation = BATCH * SEQ * CFG.d_model * 4  # one fp32 [batch, seq, d]
    layers = CFG.n_layer
    # plain tp: 4 all-reduces of `activation` per layer (test_tensor_parallel). Sequence parallel:
    # per layer 2 all-gathers (Colwise inputs) and 2 reduce-scatters (Rowwise outputs) in forward,
    # the other way round in backward; 2 more gathers (the last block's output for the final
    # LayerNorm, the first block's input gradient); 4 LayerNorm gradients [d] per layer and the
    # gradient norm's scalar all-reduced
    expected = {"all_gather": (4 * layers + 2, (4 * layers + 2) * activation),
                "reduce_scatter": (4 * layers, 4 * layers * activation),
                "all_reduce": (4 * layers + 1, 4 * layers * CFG.d_model * 4 + 4)}
    assert_moves_what_it_predicts(sp_run, expected, (0, 1))
    for step in (*sp_run.steps(0), *sp_run.steps(1)):
        assert sum(c.busy_ms for c in step.comm) > 0 and 0 <= step.exposed_comm_ms <= step.step_ms


def test_on_a_ring_sequence_parallel_moves_the_all_reduces_bytes():
    """Megatron's claim (arXiv 2205.05198): all-gather + reduce-scatter send what the all-reduce
    sent; on gloo, whose reduce-scatter is an all-reduce, half as much again."""
    from ringtop.metrics.costs.mesh_cost import Shape, tp_comm_per_step

    shape = Shape(layers=4, hidden=128, seq_len=32, micro_batch_size=4, activation_bytes=4)
    for tp in (2, 4, 8):
        plain = tp_comm_per_step(shape, tp, 4)
        sp = tp_comm_per_step(shape, tp, 4, sequence_parallel=True)
        assert sp.sent_bytes == plain.sent_bytes
        assert {c.kind: c.payload_bytes for c in sp.collectives} == {
            "all_gather": plain.collectives[0].payload_bytes, "reduce_scatter": plain.collectives[0].payload_bytes}
        gloo = tp_comm_per_step(shape, tp, 4, sequence_parallel=True, gloo=True)
        assert gloo.sent_bytes == round(1.5 * plain.sent_bytes)


@pytest.mark.parametrize("argv, message", [
    (["--tp-sequence-parallel"], "--tp-sequence-parallel applies to --strategy tp only"),
    (["--strategy", "fsdp", "--tp", "2", "--tp-sequence-parallel"], "applies to --strategy tp only"),
])
def test_sequence_parallel_is_refused_where_it_does_not_apply(argv, message):
    with pytest.raises(ConfigError, match=message):
        parse_agent_args(argv)


def test_sequence_parallel_needs_the_degree_to_divide_the_sequence():
    check_tensor_parallel_world(parse_agent_args(["--strategy", "tp", "--tp-sequence-parallel", "--seq-len", "32"]), 4)
    cfg = parse_agent_args(["--strategy", "tp", "--tp-sequence-parallel", "--seq-len", "30"])
    check_tensor_parallel_world(cfg, 2)
    with pytest.raises(ConfigError, match="4 must divide --seq-len"):
        check_tensor_parallel_world(cfg, 4)
