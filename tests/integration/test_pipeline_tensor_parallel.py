"""3D parallelism (`--strategy pp --tp N`) on real gloo ranks: 8 ranks of 2 replicas x 2 stages x tp 2
train like one process with the global batch, hold and send per mesh dimension what the formulas
say, and write a full checkpoint in the plain layout that a plain TinyGPT loads; 4 ranks of 2
stages x tp 2 (no replicas) train like it too, the q|k|v layout trap fails the same check, and
live switches into and out of 3D keep the state.

Two multi-rank runs, each checked for several things: one agent run (`run3d`) and one run of
`pp_tp_worker.py`, which drives the strategy itself for what an agent cannot show (the trap)."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest
import torch
from conftest import finished_agents, further, run_worker_script, start_agents, stop_process_group
from numerics import (
    GRAD_NORM_RTOL,
    LOSS_RTOL,
    assert_2d_trains_like_the_reference,
    assert_series_close,
    assert_state_close,
    bytes_by_kind,
)
from reference import reference_run

from ringtop.agent.config import (
    ConfigError,
    check_switch_tensor_parallel,
    check_tensor_parallel_world,
    parse_agent_args,
)
from ringtop.agent.models.data import synthetic_sample
from ringtop.agent.models.model import MODEL_SIZES, build_tiny_gpt
from ringtop.protocol import Event, Hello

STEPS, BATCH, SEQ, LR, M = 4, 4, 32, 1e-3, 2
CFG = MODEL_SIZES["1m"]
DP, PP, TP = 2, 2, 2
REPLICAS = ((0, 1, 2, 3), (4, 5, 6, 7))
"""Rank r is tp rank r % 2 of stage (r // 2) % 2 of replica r // 4: tp innermost."""
TESTS_DIR = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run3d(tmp_path_factory):
    """STEPS + 1 steps, the full checkpoint at STEPS: step STEPS + 1's loss is that state's."""
    run = finished_agents(tmp_path_factory.mktemp("pp-tp"), DP * PP * TP, "--strategy", "pp", "--tp", str(TP),
                          "--pp-stages", str(PP), "--micro-batches", str(M), "--steps", str(STEPS + 1),
                          "--batch-size", str(BATCH), "--seq-len", str(SEQ), "--lr", str(LR),
                          "--checkpoint-every", str(STEPS), timeout_s=240)
    return run


def held_by_stage() -> list[tuple[int, int]]:
    """(parameters, tensors) one rank of each stage holds, from the unsplit model: stage 0 the embeddings and
    blocks 0-1, stage 1 blocks 2-3, the final norm and its copy of the tied head; of each block
    the split matrices (qkv, fc: weight and bias by rows; proj, fc_out: the weight by columns)
    halved, the rest (LayerNorms, the Rowwise biases) whole."""
    model = build_tiny_gpt("1m", 0)

    def block(b) -> int:
        split = b.qkv.weight.numel() + b.fc.weight.numel() + b.fc.bias.numel() + b.proj.weight.numel() \
            + b.fc_out.weight.numel()
        return sum(p.numel() for p in b.parameters()) - split + split // TP

    first = model.tok_emb.weight.numel() + model.pos_emb.weight.numel() + sum(block(b) for b in model.blocks[:2])
    last = sum(block(b) for b in model.blocks[2:]) + sum(p.numel() for p in model.ln_f.parameters()) \
        + model.tok_emb.weight.numel()
    per_block = len(list(model.blocks[0].parameters()))
    return [(first, 2 + 2 * per_block), (last, 2 * per_block + len(list(model.ln_f.parameters())) + 1)]


@pytest.mark.timeout(300)
def test_pp_tp_dp_trains_like_one_process_with_the_global_batch(run3d):
    reference = reference_run(STEPS + 1, DP * BATCH, SEQ, LR)
    # every rank of a replica reports its loss to the bit; the replicas' mean and every rank's
    # gradient norm follow the single process
    assert_2d_trains_like_the_reference(run3d, reference, tp_groups=REPLICAS)
    from ringtop.agent.checkpoints.format import load_full_files

    model_state, _, payload = load_full_files(run3d.checkpoint_dir / f"step-{STEPS:08d}-full")
    assert payload["step"] == STEPS
    assert_state_close(model_state, reference_run(STEPS, DP * BATCH, SEQ, LR).state, steps=STEPS, lr=LR)
    hello = next(m for m in run3d.messages(0) if isinstance(m, Hello))
    assert hello.strategy_options == {"schedule": "gpipe", "micro_batches": M, "stages": PP, "tp": TP,
                                      "replicas": DP}
    assert (hello.sharding.params, hello.sharding.grads, hello.sharding.optimizer) == (True, True, True)
    # the groups of each dimension under their own names: no desync or hang read into them
    assert not [m.text for m in run3d.messages(0) if isinstance(m, Event) and m.kind in ("desync", "hang")]


@pytest.mark.timeout(300)
def test_each_mesh_dimension_moves_and_each_rank_holds_what_the_formula_says(run3d):
    held_tensors = held_by_stage()
    layers = CFG.n_layer // PP
    activation = (BATCH // M) * SEQ * CFG.d_model * 4  # one fp32 micro-batch [b, seq, d]
    tied = CFG.vocab_size * CFG.d_model * 4
    for rank in range(DP * PP * TP):
        stage = (rank // TP) % PP  # the rank order: held bytes tell the stage
        steps = run3d.steps(rank)
        hello = next(m for m in run3d.messages(rank) if isinstance(m, Hello))
        mem, predicted = steps[-1].mem, hello.prediction
        held, tensors = held_tensors[stage]
        assert (mem.params_bytes, mem.grads_bytes, mem.optimizer_bytes) == (
            4 * held, 4 * held, 8 * held + 4 * tensors), rank
        assert (predicted.params_bytes, predicted.grads_bytes, predicted.optimizer_bytes) == (
            mem.params_bytes, mem.grads_bytes, mem.optimizer_bytes), predicted.note
        expected = {
            # the split layers' activations, 4 per layer and micro-batch; the gradient norm's scalar
            ("all_reduce", "tp"): (4 * layers * M + 1, 4 * layers * M * activation + 4, TP),
            # the loss to every stage, the norm's sum over stages, the tied weight's two parts
            ("all_reduce", "pp"): (3, 4 + 4 + tied, PP),
            # this rank's own part of its stage's gradients, averaged over the replicas
            ("all_reduce", "dp"): (1, 4 * held, DP),
            # each micro-batch's activations to the next stage, their gradients back
            ("p2p", ""): (2 * M, 2 * M * activation, DP * PP * TP),
        }
        # the first step also runs torch's shape inference (one more forward per stage)
        for step in steps[1:]:
            assert {(c.kind, c.group): (c.count, c.bytes, c.group_size) for c in step.comm} == expected, (
                rank, step.step, step.comm)
            assert bytes_by_kind(step.comm) == predicted.comm_payload_bytes, predicted.note
            assert {group: {kind: b for (kind, g), (_, b, _) in expected.items() if g == group}
                    for (_, group) in expected} == predicted.comm_payload_bytes_by_group
        assert steps[-1].tokens == BATCH * SEQ // (PP * TP)


def test_the_planners_mesh_cost_counts_the_measured_activation_traffic(run3d):
    """`ringtop plan --tp 2 --pp 2 --dp 2` (metrics/costs/mesh_cost.py) for this model and shape: its
    tp all-reduces are the run's on "tp" less the gradient norm's scalar, its stage-to-stage bytes
    the run's point to point."""
    from ringtop.metrics.costs.cost_model import ModelSpec
    from ringtop.metrics.costs.links import parse_link
    from ringtop.metrics.costs.mesh_cost import Shape, mesh_cost
    from ringtop.metrics.parallel_dims import ParallelDims

    link = parse_link("10")
    plan = mesh_cost(ModelSpec(10**6, 4, 4, 8), ParallelDims(tp=TP, pp=PP, dp=DP),
                     Shape(layers=CFG.n_layer, hidden=CFG.d_model, seq_len=SEQ, micro_batch_size=BATCH // M,
                           micro_batches=M, activation_bytes=4), link_tp=link, link_pp=link, link_dp=link)
    for rank in range(DP * PP * TP):
        comm = {(c.kind, c.group): c.bytes for c in run3d.steps(rank)[-1].comm}
        assert plan.group("tp").comm.by_kind()["all_reduce"].payload_bytes == comm[("all_reduce", "tp")] - 4
        assert plan.group("pp").comm.by_kind()["send"].payload_bytes == comm[("p2p", "")]


@pytest.mark.timeout(300)
def test_the_full_checkpoint_is_the_plain_layout_a_plain_model_loads(run3d):
    """Strictly loaded into a plain TinyGPT, the checkpoint at STEPS gives step STEPS + 1's global
    batch the loss the 3D run reported for it; the same weights with the qkv rows left by head
    (as the ranks hold them) give another loss, so this check sees the layout."""
    from ringtop.agent.checkpoints.format import load_full_files
    from ringtop.strategies.tensor_parallel import qkv_rows_by_head

    model_state, _, _ = load_full_files(run3d.checkpoint_dir / f"step-{STEPS:08d}-full")
    rows = torch.stack([synthetic_sample(STEPS * DP * BATCH + i, SEQ, CFG.vocab_size, 0) for i in range(DP * BATCH)])
    run_loss = sum(run3d.steps(replica[0])[STEPS].loss for replica in REPLICAS) / DP
    by_head = qkv_rows_by_head(CFG.n_head, CFG.d_model // CFG.n_head)

    def loss_of(state) -> float:
        plain = build_tiny_gpt("1m", 7)
        plain.load_state_dict(state)  # strict: the plain model's names and shapes
        with torch.no_grad():
            return float(plain(rows[:, :-1], rows[:, 1:]))

    assert_series_close([run_loss], [loss_of(model_state)], rtol=LOSS_RTOL, what="next loss", first_step=STEPS + 1)
    held_layout = {k: v.index_select(0, by_head) if k.endswith(".qkv.weight") else v for k, v in model_state.items()}
    with pytest.raises(AssertionError, match="next loss: largest relative difference"):
        assert_series_close([run_loss], [loss_of(held_layout)], rtol=LOSS_RTOL, what="next loss")


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    out = tmp_path_factory.mktemp("pp-tp-worker")
    found = run_worker_script(TESTS_DIR / "helpers" / "pp_tp_worker.py",
                              [str(STEPS), str(BATCH), str(SEQ), str(LR)], out, nproc=PP * TP, timeout_s=200)
    return found, torch.load(out / "rank-0.pt")


def check_equivalence(run: dict, reference) -> None:
    assert_series_close(run["losses"], reference.losses, rtol=LOSS_RTOL, what="loss")
    assert_series_close(run["norms"], reference.grad_norms, rtol=GRAD_NORM_RTOL, what="gradient norm")
    assert_state_close(run["state"], reference.state, steps=STEPS, lr=LR)


@further  # 4 more ranks (~12 s); the 8-rank run holds 3D, test_tensor_parallel the trap and tp switches
@pytest.mark.timeout(240)
def test_pp_tp_without_replicas_trains_like_one_process_and_the_qkv_trap_fails_it(worker):
    """4 ranks, 2 stages x tp 2 (1F1B): one replica, the batch BATCH. Split as q|k|v, a stage's tp
    rank 0 gets all of q's heads and rank 1 k and v: it trains without an error."""
    found, saved = worker
    assert [f["position"] for f in found] == [[0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 1, 1]]  # replica, stage, tp
    assert all(f["local_heads"] == [CFG.n_head // TP] * (CFG.n_layer // PP) for f in found)
    reference = reference_run(STEPS, BATCH, SEQ, LR)
    check_equivalence(saved["by_head"], reference)
    trap = saved["qkv"]
    assert all(torch.isfinite(torch.tensor(trap["losses"])))
    with pytest.raises(AssertionError, match="loss: largest relative difference"):
        check_equivalence(trap, reference)


@further  # 4 more ranks (~12 s); the 8-rank run holds 3D, test_tensor_parallel the trap and tp switches
@pytest.mark.timeout(240)
def test_live_switches_ddp_to_pp_tp_and_back_keep_the_state(worker):
    """ddp, 3D, 3D, ddp through the agent's switch on 4 ranks: the full state (weights and AdamW's
    moments) is the same to the bit across each switch, and the run trains like one process given
    each step's global batch (ddp: 4 x BATCH; 3D: one replica's BATCH)."""
    found, saved = worker
    for rank in found:
        assert rank["switch_diffs"] == [0.0, 0.0]
    run = saved["switched"]
    assert run["batches"] == [4 * BATCH, BATCH, BATCH, 4 * BATCH]
    reference = reference_run(len(run["losses"]), run["batches"], SEQ, LR)
    assert_series_close(run["losses"], reference.losses, rtol=LOSS_RTOL, what="loss")
    assert_state_close(run["state"], reference.state, steps=len(run["losses"]), lr=LR)


@pytest.mark.parametrize("argv, message", [
    (["--strategy", "pp", "--tp", "3"], "3 must divide tiny-gpt-1m's 4 attention heads"),
    (["--strategy", "pp", "--tp", "2", "--model", "user_factories:tiny"], "splits the built-in tiny-gpt's stages only"),
    (["--strategy", "pp", "--tp", "2", "--dtype", "bf16"], "--tp trains in fp32 here"),
    (["--strategy", "zero1", "--tp", "2"], "--tp applies to --strategy tp, fsdp and pp only"),
])
def test_bad_3d_options_fail_with_one_line(argv, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_agent_args(argv)


def test_the_3d_mesh_must_fill_the_world():
    check_tensor_parallel_world(parse_agent_args(["--strategy", "pp", "--tp", "2", "--pp-stages", "2"]), 8)
    check_tensor_parallel_world(parse_agent_args(["--strategy", "pp", "--tp", "2"]), 4)  # 2 stages, dp 1
    check_tensor_parallel_world(parse_agent_args(["--strategy", "pp", "--pp-stages", "3"]), 3)  # no tp
    with pytest.raises(ConfigError, match=re.escape("--pp-stages 3 x --tp 2 must divide the world size (8 ranks)")):
        check_tensor_parallel_world(parse_agent_args(["--strategy", "pp", "--tp", "2", "--pp-stages", "3"]), 8)
    with pytest.raises(ConfigError, match=re.escape("--tp 2 must divide the world size (3 ranks)")):
        check_tensor_parallel_world(parse_agent_args(["--strategy", "pp", "--tp", "2"]), 3)
    assert parse_agent_args(["--strategy", "pp", "--tp", "2"]).strategy_options()["tp"] == 2
    assert "tp" not in parse_agent_args(["--strategy", "pp", "--tp", "1"]).strategy_options()
    # a live switch's target is checked the same way
    ok = parse_agent_args(["--strategy", "pp", "--tp", "2", "--pp-stages", "2"])
    check_switch_tensor_parallel(ok, 8, tp_given=True)
    for change, world, words in (({"tp": 4}, 4, "--pp-stages 2 x --tp 4 must divide the world size (4 ranks)"),
                                 ({"tp": 3}, 6, "must divide tiny-gpt-1m's 4 attention heads")):
        with pytest.raises(ConfigError, match=re.escape(words)):
            check_switch_tensor_parallel(msgspec.structs.replace(ok, **change), world, tp_given=True)


@further
@pytest.mark.timeout(300)
def test_live_switch_commands_into_and_out_of_pp_tp(tmp_path):
    """The `switch` command on a running 4-rank agent, ddp -> pp with tp 2 (2 stages, one replica:
    the runner's data rebuilt for its one shard) -> ddp: the losses are one process's given each
    step's global batch (ddp: 4 x BATCH; 3D: BATCH). The state across switch_strategy itself is
    checked to the bit in test_live_switches_ddp_to_pp_tp_and_back_keep_the_state."""
    run = start_agents(tmp_path, 4, "--strategy", "ddp", "--steps", "0", "--batch-size", str(BATCH),
                       "--seq-len", str(SEQ), "--lr", str(LR))
    try:
        run.wait_for_step(2, 120)
        into = list(run.send_command("switch", {"strategy": "pp", "tp": 2, "micro_batches": 2}, timeout_s=120))[-1]
        assert into.status == "done", into
        assert into.result["to"] == "pp(gpipe, stages=world, tp=2, M=2)", into
        run.wait_for_step(into.result["step"] + 2, 120)
        out = list(run.send_command("switch", {"strategy": "ddp"}, timeout_s=120))[-1]
        assert (out.status, out.result["to"]) == ("done", "ddp"), out
        run.wait_for_step(out.result["step"] + 2, 120)
        list(run.send_command("stop", {}, timeout_s=60))
        assert run.wait(60) == 0, run.output()[-3000:]
    finally:
        stop_process_group(run.proc)
    by_rank = [{s.step: s.loss for s in run.steps(rank)} for rank in range(4)]
    last = min(max(steps) for steps in by_rank)
    in_3d = range(into.result["step"] + 1, out.result["step"] + 1)
    batches = [BATCH if step in in_3d else 4 * BATCH for step in range(1, last + 1)]
    reference = reference_run(last, batches, SEQ, LR)
    losses = [sum(steps[s] for steps in by_rank) / 4 for s in range(1, last + 1)]
    assert_series_close(losses, reference.losses, rtol=LOSS_RTOL, what="loss")
