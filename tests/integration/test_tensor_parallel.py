"""Tensor parallelism (`--strategy tp`) on 2 gloo ranks trains like one process with the global
batch (both ranks see it whole), holds and sends what the formulas say, writes checkpoints a plain
model loads, and the q|k|v layout trap is caught by the same equivalence check.

Two multi-rank runs, each checked for several things: one agent run (`tp_run`) and one run of
`tp_worker.py`, which drives the strategy itself for what an agent cannot show (logits, the trap)."""

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
    assert_trains_like_the_reference,
    bytes_by_kind,
)
from reference import reference_run

from ringtop.agent.config import MODEL_SIZE_HEADS, ConfigError, check_tensor_parallel_world, parse_agent_args
from ringtop.agent.models.model import MODEL_SIZES, build_tiny_gpt
from ringtop.protocol import Event, Hello

STEPS, BATCH, SEQ, LR = 8, 4, 32, 1e-3
CFG = MODEL_SIZES["1m"]
TESTS_DIR = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def reference():
    """One process with the global batch: a tp group is one data-parallel replica, so BATCH."""
    return reference_run(STEPS, BATCH, SEQ, LR)


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    run = finished_agents(tmp_path_factory.mktemp("tp"), 2, "--strategy", "tp", "--tp", "2", "--steps", str(STEPS),
                          "--batch-size", str(BATCH), "--seq-len", str(SEQ), "--lr", str(LR),
                          "--checkpoint-every", str(STEPS), timeout_s=200)
    return run


@pytest.mark.timeout(240)
def test_tp_trains_like_one_process_with_the_global_batch(tp_run, reference):
    # Both ranks compute the same loss from the same batch (the replicated head's logits), to the bit
    assert [s.loss for s in tp_run.steps(0)] == [s.loss for s in tp_run.steps(1)]
    # losses, both ranks' gradient norms, and every parameter of the full checkpoint at STEPS; the
    # checkpoint is read by name into the plain model's layout (shapes checked there)
    assert_trains_like_the_reference(tp_run, reference, STEPS, LR)
    hello = next(m for m in tp_run.messages(0) if isinstance(m, Hello))
    assert (hello.strategy, hello.strategy_options) == ("tp", {"degree": 2})


def split_parameters(model) -> int:
    """Parameters ColwiseParallel (qkv, fc: weight and bias) and RowwiseParallel (proj, fc_out:
    the weight; the bias is added once, after the all-reduce) split across the group."""
    return sum(b.qkv.weight.numel() + b.fc.weight.numel() + b.fc.bias.numel() + b.proj.weight.numel()
               + b.fc_out.weight.numel() for b in model.blocks)


@pytest.mark.timeout(240)
def test_each_rank_holds_its_share_and_sends_two_all_reduces_per_layer_each_way(tp_run):
    model = build_tiny_gpt("1m", 0)
    tensors = len({id(p) for p in model.parameters()})
    total = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    held = total - split_parameters(model) // 2
    activations = BATCH * SEQ * CFG.d_model * 4  # one fp32 [batch, seq, d] all-reduce
    per_step = 4 * CFG.n_layer * activations + 4  # + the gradient norm's fp32 sum of squares
    for rank in (0, 1):
        steps = tp_run.steps(rank)
        mem = steps[-1].mem
        assert (mem.params_bytes, mem.grads_bytes, mem.optimizer_bytes) == (4 * held, 4 * held,
                                                                            8 * held + 4 * tensors)
        predicted = next(m for m in tp_run.messages(rank) if isinstance(m, Hello)).prediction
        assert (predicted.params_bytes, predicted.grads_bytes, predicted.optimizer_bytes) == (
            mem.params_bytes, mem.grads_bytes, mem.optimizer_bytes), predicted.note
        assert predicted.comm_payload_bytes == {"all_reduce": per_step}
        for step in steps:
            kinds = {c.kind: c for c in step.comm}
            assert [(c.kind, c.group) for c in step.comm] == [("all_reduce", "")], step.comm  # 1D: the world
            assert (kinds["all_reduce"].count, kinds["all_reduce"].bytes, kinds["all_reduce"].group_size) == (
                4 * CFG.n_layer + 1, per_step, 2)
        # each rank does half of the work on the group's tokens
        assert steps[-1].tokens == BATCH * SEQ // 2


@pytest.mark.timeout(300)
def test_fsdp_over_tp_groups_trains_like_one_process_and_holds_and_sends_what_it_predicts(tmp_path):
    """2D on 4 ranks: --strategy fsdp --tp 2, a ("dp", "tp") mesh of 2 x 2; each tp group reads
    one data shard, so the global batch is 2 x BATCH."""
    from ringtop.agent.checkpoints.format import load_full_files

    run = finished_agents(tmp_path, 4, "--strategy", "fsdp", "--tp", "2", "--steps", str(STEPS), "--batch-size",
                          str(BATCH), "--seq-len", str(SEQ), "--lr", str(LR), "--checkpoint-every", str(STEPS),
                          timeout_s=280)
    reference = reference_run(STEPS, 2 * BATCH, SEQ, LR)
    steps = assert_2d_trains_like_the_reference(run, reference)
    model_state, _, _ = load_full_files(run.checkpoint_dir / f"step-{STEPS:08d}-full")
    assert_state_close(model_state, reference.state, steps=STEPS, lr=LR)

    model = build_tiny_gpt("1m", 0)
    held = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()) - split_parameters(model) // 2
    for rank in range(4):
        hello = next(m for m in run.messages(rank) if isinstance(m, Hello))
        assert hello.strategy_options == {"sharding": "full", "tp": 2}
        mem, predicted = steps[rank][-1].mem, hello.prediction
        assert mem.params_bytes == 4 * held // 2  # the tp share, sharded again over the 2 dp ranks
        assert (mem.params_bytes, mem.grads_bytes, mem.optimizer_bytes) == (
            predicted.params_bytes, predicted.grads_bytes, predicted.optimizer_bytes), predicted.note
        measured = bytes_by_kind(steps[rank][-1].comm)
        assert measured == predicted.comm_payload_bytes
        activations = 4 * CFG.n_layer * BATCH * SEQ * CFG.d_model * 4
        assert measured["all_reduce"] == activations + 4
        # split by mesh dimension: the activations' all-reduces on this rank's tp pair, FSDP's
        # gathers and reductions on its dp pair, the gradient norm's scalar on the world (unnamed)
        by_group = {(c.kind, c.group): (c.bytes, c.group_size) for c in steps[rank][-1].comm}
        assert by_group[("all_reduce", "tp")] == (activations, 2), steps[rank][-1].comm
        assert by_group[("all_reduce", "")] == (4, 4)
        assert {c.group for c in steps[rank][-1].comm if c.kind in ("all_gather", "reduce_scatter")} == {"dp"}
        measured_by_group: dict[str, dict[str, int]] = {}
        for c in steps[rank][-1].comm:
            measured_by_group.setdefault(c.group, {})[c.kind] = c.bytes
        assert measured_by_group == predicted.comm_payload_bytes_by_group, predicted.note
    # what the Comm tab lists for this run's logs: one row per kind and mesh dimension, each held
    # against its dimension's prediction
    from ringtop.tui.state.view_model import RunView
    from ringtop.tui.tabs.comm.figures import comm_window

    view = RunView(watch_liveness=False)
    view.apply_many([m for rank in range(4) for m in run.messages(rank)], now=1.0)
    kinds = comm_window(view).kinds
    assert sorted((k.kind, k.group, k.group_sizes) for k in kinds) == [
        ("all_gather", "dp", (2,)), ("all_reduce", "", (4,)), ("all_reduce", "tp", (2,)),
        ("reduce_scatter", "dp", (2,))]
    assert {(k.kind, k.group): k.predicted_bytes for k in kinds} == {
        (k.kind, k.group): float(k.bytes_per_step) for k in kinds}
    assert {(k.kind, k.group): k.predicted_bytes for k in kinds}[("all_reduce", "tp")] == activations
    # the tp pairs' collectives under their own groups' names ("0-1", "2-3"): no desync read into them
    assert not [m.text for m in run.messages(0) if isinstance(m, Event) and m.kind in ("desync", "hang")]


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp-worker")
    found = run_worker_script(TESTS_DIR / "helpers" / "tp_worker.py", [str(STEPS), str(BATCH), str(SEQ), str(LR)], out,
                              nproc=2, timeout_s=200)
    return found, torch.load(out / "rank-0.pt"), out


@pytest.mark.timeout(240)
def test_a_full_state_of_a_tp_model_gives_a_plain_model_its_logits(worker):
    from tp_worker import SEED, logits_of, probe_batch

    found, saved, _ = worker
    plain = build_tiny_gpt("1m", SEED + 1)
    plain.load_state_dict(saved["by_head"]["state"])  # strict: the plain model's names and shapes
    with torch.no_grad():
        logits = logits_of(plain, probe_batch(SEQ))
    tp_logits = saved["by_head"]["logits"]
    # One forward each, differing only in the order of fp32 sums (a RowwiseParallel layer adds its
    # two halves after the all-reduce): rounding, bounded like a loss's (numerics.LOSS_RTOL)
    worst = float((logits - tp_logits).abs().max())
    assert worst <= LOSS_RTOL * float(logits.abs().max()), worst
    assert found[0]["local_heads"] == [CFG.n_head // 2] * CFG.n_layer
    # a full state loaded into a fresh tp model, then one more step on both: the same bits
    for rank in found:
        assert (rank["reloaded_loss_diff"], rank["reloaded_param_diff"], rank["reloaded_moment_diff"]) == (0, 0, 0)


def check_equivalence(run: dict, reference) -> None:
    assert_series_close(run["losses"], reference.losses, rtol=LOSS_RTOL, what="loss")
    assert_series_close(run["norms"], reference.grad_norms, rtol=GRAD_NORM_RTOL, what="gradient norm")
    assert_state_close(run["state"], reference.state, steps=STEPS, lr=LR)


@pytest.mark.timeout(240)
def test_the_qkv_layout_trap_fails_the_equivalence_check(worker, reference):
    """Split as q|k|v, rank 0 gets all of q's heads and rank 1 k and v: it trains without an error."""
    _, saved, _ = worker
    check_equivalence(saved["by_head"], reference)
    trap = saved["qkv"]
    assert all(torch.isfinite(torch.tensor(trap["losses"])))
    with pytest.raises(AssertionError, match="loss: largest relative difference"):
        check_equivalence(trap, reference)


@pytest.mark.parametrize("argv, message", [
    (["--tp", "2"], "--tp applies to --strategy tp, fsdp and pp only"),
    (["--strategy", "fsdp", "--tp", "2", "--fsdp-sharding", "no-shard"], "use --fsdp-sharding full or grad-op"),
    (["--strategy", "fsdp", "--tp", "2", "--dtype", "bf16"], "--tp trains in fp32 here"),
    (["--strategy", "tp", "--tp", "3"], "must divide tiny-gpt-1m's 4 attention heads"),
    (["--strategy", "tp", "--dtype", "bf16"], "trains in fp32 here"),
    (["--strategy", "tp", "--model", "user_factories:tiny"], "of the built-in tiny-gpt and of the hf models"),
    (["--strategy", "fsdp", "--tp", "2", "--model", "user_factories:tiny"], "of the built-in tiny-gpt and of"),
    (["--strategy", "tp", "--tp", "3", "--model", "hf:gpt2-tiny"], "3 must divide hf:gpt2-tiny's 4 attention heads"),
    (["--strategy", "tp", "--tp", "4", "--model", "hf:llama-tiny"], "4 must divide hf:llama-tiny's 2 key/value heads"),
    (["--strategy", "tp", "--tp", "0"], "--tp must be >= 1"),
])
def test_bad_tensor_parallel_options_fail_with_one_line(argv, message):
    with pytest.raises(ConfigError, match=message):
        parse_agent_args(argv)


def test_the_degree_must_fit_the_world_and_the_heads():
    assert MODEL_SIZE_HEADS == {size: cfg.n_head for size, cfg in MODEL_SIZES.items()}
    check_tensor_parallel_world(parse_agent_args(["--strategy", "tp"]), 4)  # 4 heads over 4 ranks
    check_tensor_parallel_world(parse_agent_args(["--strategy", "ddp"]), 3)
    with pytest.raises(ConfigError, match="--tp 2 must divide the world size"):
        check_tensor_parallel_world(parse_agent_args(["--strategy", "tp", "--tp", "2"]), 3)
    with pytest.raises(ConfigError, match="pass --tp 4 or leave --tp out"):
        check_tensor_parallel_world(parse_agent_args(["--strategy", "tp", "--tp", "2"]), 4)
    with pytest.raises(ConfigError, match="3 must divide tiny-gpt-1m's 4 attention heads"):
        check_tensor_parallel_world(parse_agent_args(["--strategy", "tp"]), 3)
    check_tensor_parallel_world(parse_agent_args(["--strategy", "fsdp", "--tp", "2"]), 4)  # 2 groups of 2
    check_tensor_parallel_world(parse_agent_args(["--strategy", "fsdp"]), 3)  # no tp: 1D
    with pytest.raises(ConfigError, match="--tp 2 must divide the world size"):
        check_tensor_parallel_world(parse_agent_args(["--strategy", "fsdp", "--tp", "2"]), 3)


@pytest.mark.timeout(240)
def test_live_switches_ddp_to_tp_and_back_keep_the_state(worker):
    """ddp, ddp, tp, ddp through the agent's switch: the full state (weights and AdamW's moments)
    is the same to the bit across each switch, and the run trains like one process given each
    step's global batch (ddp: both ranks' shards; tp: one batch)."""
    found, saved, _ = worker
    for rank in found:
        assert rank["switch_diffs"] == [0.0, 0.0]
    run = saved["switched"]
    reference = reference_run(len(run["losses"]), run["batches"], SEQ, LR)
    assert_series_close(run["losses"], reference.losses, rtol=LOSS_RTOL, what="loss")
    assert_state_close(run["state"], reference.state, steps=len(run["losses"]), lr=LR)


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_sharded_checkpoint_of_tp_reads_into_the_plain_layout(worker):
    """What a resume into any strategy or world size reads: the plain model's full state, filled
    by DCP from the tp run's files in one process, equals the tp model's full state exactly."""
    from ringtop.agent.checkpoints import format as ckpt
    from ringtop.strategies.torch_native import full_optimizer_template

    _, saved, out = worker
    fresh = build_tiny_gpt("1m", 1)
    template = {"model": {k: v.detach().clone() for k, v in fresh.state_dict().items()},
                "optim": full_optimizer_template(fresh, lambda p: torch.optim.AdamW(p, lr=LR))}
    ckpt.load_sharded_into(out / "checkpoints" / ckpt.checkpoint_name(STEPS, ckpt.SHARDED), template, no_dist=True)
    expected = saved["by_head"]["state"]
    assert set(template["model"]) == set(expected)
    assert max(float((template["model"][k] - expected[k]).abs().max()) for k in expected) == 0.0


@further
@pytest.mark.timeout(300)
def test_live_switch_commands_into_and_out_of_tp(tmp_path):
    """The `switch` command on a running agent, ddp -> tp -> 2D (`fsdp` with `tp=2`: one replica
    of a tp pair) -> fsdp (the runner's path: its data rebuilt for the tp group's one shard, --tp
    left behind for 1D fsdp): the losses are one process's given each step's global batch (ddp,
    fsdp: 2 x BATCH; tp, 2D: BATCH). The state across
    switch_strategy itself is checked to the bit in test_live_switches_ddp_to_tp_and_back_keep_the_state."""
    run = start_agents(tmp_path, 2, "--strategy", "ddp", "--steps", "0", "--batch-size", str(BATCH),
                       "--seq-len", str(SEQ), "--lr", str(LR))
    try:
        run.wait_for_step(2, 120)
        into = list(run.send_command("switch", {"strategy": "tp"}, timeout_s=120))[-1]
        assert into.status == "done", into
        run.wait_for_step(into.result["step"] + 2, 120)
        two_d = list(run.send_command("switch", {"strategy": "fsdp", "tp": 2}, timeout_s=120))[-1]
        assert two_d.status == "done", two_d
        run.wait_for_step(two_d.result["step"] + 2, 120)
        out = list(run.send_command("switch", {"strategy": "fsdp"}, timeout_s=120))[-1]
        assert (out.status, out.result["to"]) == ("done", "fsdp(full)"), out
        run.wait_for_step(out.result["step"] + 2, 120)
        list(run.send_command("stop", {}, timeout_s=60))
        assert run.wait(60) == 0, run.output()[-3000:]
    finally:
        stop_process_group(run.proc)
    a, b = ({s.step: s.loss for s in run.steps(rank)} for rank in (0, 1))
    last = min(max(a), max(b))
    tp_steps = range(into.result["step"] + 1, out.result["step"] + 1)  # tp, then 2D of one replica: one batch
    batches = [BATCH if step in tp_steps else 2 * BATCH for step in range(1, last + 1)]
    reference = reference_run(last, batches, SEQ, LR)
    assert_series_close([(a[s] + b[s]) / 2 for s in range(1, last + 1)], reference.losses, rtol=LOSS_RTOL,
                        what="loss")



def test_a_live_switch_is_checked_for_tensor_parallelism_as_the_command_line_is():
    """What `switch` refuses at once, on every rank, before anything is let go (one line each)."""
    from ringtop.agent.config import ConfigError, check_switch_tensor_parallel, parse_agent_args
    from ringtop.protocol.commands import SwitchArgs

    assert msgspec.convert({"strategy": "fsdp", "tp": 2}, SwitchArgs).tp == 2
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"strategy": "fsdp", "tp": 0}, SwitchArgs)
    ok = parse_agent_args(["--strategy", "fsdp", "--tp", "2"])
    check_switch_tensor_parallel(ok, 4, tp_given=True)
    for change, world, words in (
            ({"strategy": "ddp", "tp": 2}, 4, "--tp applies to --strategy tp, fsdp and pp only"),
            ({"tp": 3}, 6, "must divide tiny-gpt-1m's 4 attention heads"),
            ({"tp": 2}, 3, "must divide the world size (3 ranks)"),
            ({"tp": 2, "fsdp_sharding": "no-shard"}, 4, "full or grad-op")):
        cfg = msgspec.structs.replace(ok, **change)  # what the runner builds from the command
        with pytest.raises(ConfigError, match=re.escape(words)):
            check_switch_tensor_parallel(cfg, world, tp_given=True)
