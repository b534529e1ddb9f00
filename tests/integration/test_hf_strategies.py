"""Hugging Face architectures (`--model hf:...`) train under ringtop's strategies like one process
with the whole batch, on 2 gloo ranks; what each rank holds matches the cost model to the byte, and
its Hello carries the FLOPs per token of the 6N + 12LHS formula, counted here from the model.

One run per case, a handful of steps: the llama (untied, GQA) under DDP, FSDP full-shard, a
2-stage pipeline and tensor parallelism, the GPT-2 (tied head, learned positions) under a 2-stage
pipeline, whose split tied weight is the case a Llama does not have; with RINGTOP_SUITE_ALL=1 also every other strategy
(ZeRO-1/2/3, the other FSDP shardings; GPT-2 under DDP, ZeRO-2/3 and FSDP)."""

from __future__ import annotations

import functools
import importlib.util

import pytest
from conftest import finished_agents, further
from numerics import (
    GRAD_NORM_RTOL,
    LOSS_RTOL,
    assert_2d_trains_like_the_reference,
    assert_series_close,
    assert_state_close,
    bytes_by_kind,
    mean_losses,
)
from reference import reference_run

from ringtop.protocol import Hello

pytest.importorskip("transformers", reason="the hf models need transformers (pip install 'ringtop[hf]')")
pytestmark = pytest.mark.timeout(240)

STEPS, BATCH, SEQ, LR = 5, 4, 16, 1e-3
needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason="DeepSpeed is not installed (pip install 'ringtop[deepspeed]')")
PP = ("--strategy", "pp", "--micro-batches", "2")
CASES = [
    pytest.param("llama-tiny", ("--strategy", "ddp"), id="llama-ddp", marks=further),  # the simplest wrapper
    pytest.param("llama-tiny", ("--strategy", "fsdp", "--fsdp-sharding", "full"), id="llama-fsdp-full"),
    pytest.param("llama-tiny", PP, id="llama-pp2", marks=further),  # gpt2-pp2 splits an hf model, tie too
    # DeepSpeed's import makes this the slowest case; ZeRO-3 runs the built-in model by default
    pytest.param("gpt2-tiny", ("--strategy", "zero3"), id="gpt2-zero3", marks=[needs_deepspeed, further]),
    pytest.param("gpt2-tiny", PP, id="gpt2-pp2"),
    # Every other strategy, for RINGTOP_SUITE_ALL=1: the strategies wrap any module the same way,
    # and the default suite runs each of them on the built-in model
    *(pytest.param("llama-tiny", args, id=f"llama-{label}", marks=[further, *marks]) for label, args, marks in (
        ("zero1", ("--strategy", "zero1"), [needs_deepspeed]), ("zero2", ("--strategy", "zero2"), [needs_deepspeed]),
        ("zero3", ("--strategy", "zero3"), [needs_deepspeed]),
        ("fsdp-grad-op", ("--strategy", "fsdp", "--fsdp-sharding", "grad-op"), []),
        ("fsdp-no-shard", ("--strategy", "fsdp", "--fsdp-sharding", "no-shard"), []))),
    *(pytest.param("gpt2-tiny", args, id=f"gpt2-{label}", marks=[further, *marks]) for label, args, marks in (
        ("ddp", ("--strategy", "ddp"), []), ("zero2", ("--strategy", "zero2"), [needs_deepspeed]),
        ("fsdp-full", ("--strategy", "fsdp", "--fsdp-sharding", "full"), []))),
]


@functools.cache
def reference(name: str, global_batch: int):
    return reference_run(STEPS, global_batch, SEQ, LR, model=f"hf:{name}")


def expected_flops_per_token(name: str) -> float:
    """6 x (parameters but the look-up tables; a tied head once) + 12 x layers x hidden x S, from
    the reference's own model and config, not from ringtop's flop code."""
    from ringtop.agent.models.hf_models import build_meta_model

    model = build_meta_model(f"hf:{name}")
    params = {id(p): p for p in model.parameters()}
    lookups = [n for n, _ in model.named_parameters() if n.endswith(("embed_tokens.weight", "wte.weight",
                                                                     "wpe.weight"))]
    n = sum(p.numel() for p in params.values()) - sum(model.get_parameter(k).numel() for k in lookups)
    if model.get_parameter("lm_head.weight") is model.get_parameter(lookups[0]):
        n += model.get_parameter("lm_head.weight").numel()
    d = model.spec.dims
    return 6 * n + 12 * d.layers * d.hidden * SEQ


def without_key_bias(actual: dict, expected: dict) -> tuple[dict, dict]:
    """GPT-2's attention has a key bias, the one parameter with no true gradient (a vector added to
    every key shifts each softmax row by a constant, which softmax ignores: tests/README.md). Its
    gradient is rounding noise, on which Adam moves it by up to ~lr a step in a direction that
    differs per summation order (7e-7 RMS in 5 steps between 1 and 2 threads of the same process,
    everything else 1e-8), so it is held to the per-element bound only (steps x lr); its query and
    value thirds, which have true gradients, stay under both bounds."""
    actual, expected = dict(actual), dict(expected)
    for name in [k for k in expected if k.endswith("attn.c_attn.bias")]:
        got, want = actual.pop(name).double(), expected.pop(name).double()
        (gq, gk, gv), (wq, wk, wv) = got.chunk(3), want.chunk(3)
        assert float((gk - wk).abs().max()) <= STEPS * LR, f"{name}: key third beyond steps x lr"
        actual[f"{name}[query]"], actual[f"{name}[value]"] = gq, gv
        expected[f"{name}[query]"], expected[f"{name}[value]"] = wq, wv
    return actual, expected


@pytest.mark.parametrize("name,strategy_args", CASES)
def test_an_hf_model_trains_like_one_process_and_holds_what_the_model_predicts(tmp_path, name, strategy_args):
    run = finished_agents(tmp_path, 2, "--model", f"hf:{name}", *strategy_args, "--steps", str(STEPS), "--batch-size",
                          str(BATCH), "--seq-len", str(SEQ), "--lr", str(LR), "--checkpoint-every", str(STEPS),
                          timeout_s=200)
    from ringtop.agent.checkpoints.format import load_full_files

    pipeline = strategy_args[1] == "pp"
    # data parallel: each rank half of 2 x BATCH; a 2-stage pipeline is one replica fed BATCH
    expected = reference(name, BATCH if pipeline else 2 * BATCH)
    losses = [s.loss for s in run.steps(0)] if pipeline else mean_losses(run)
    if pipeline:
        assert losses == [s.loss for s in run.steps(1)], "every stage reports its replica's loss"
    assert_series_close(losses, expected.losses, rtol=LOSS_RTOL, what="loss")
    for rank in (0, 1):
        assert_series_close([s.grad_norm for s in run.steps(rank)], expected.grad_norms, rtol=GRAD_NORM_RTOL,
                            what=f"rank {rank}'s gradient norm")
    model_state, _, payload = load_full_files(run.checkpoint_dir / f"step-{STEPS:08d}-full")
    assert payload["step"] == STEPS
    assert set(model_state) == set(expected.state), "the checkpoint keeps transformers' parameter names"
    assert_state_close(*without_key_bias(model_state, expected.state), steps=STEPS, lr=LR)

    flops = expected_flops_per_token(name)
    for rank in (0, 1):
        hello = next(m for m in run.messages(rank) if isinstance(m, Hello))
        assert hello.model == f"hf:{name}"
        assert hello.flops_per_token == pytest.approx(flops, rel=1e-12) and hello.flops_source.startswith("formula")
        predicted = hello.prediction
        measured = run.steps(rank)[-1].mem
        assert (measured.params_bytes, measured.grads_bytes, measured.optimizer_bytes) == (
            predicted.params_bytes, predicted.grads_bytes, predicted.optimizer_bytes), predicted.note
        if pipeline:  # a stage holds its own layers, not the whole model
            assert 0 < predicted.params_bytes < 4 * hello.param_count
        assert all(s.tflops > 0 for s in run.steps(rank))


TP_SPLIT = {"llama": ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "gate_proj.weight",
                      "up_proj.weight", "down_proj.weight"),
            "gpt2": ("c_attn.weight", "c_attn.bias", "attn.c_proj.weight", "c_fc.weight", "c_fc.bias",
                     "mlp.c_proj.weight")}
"""What tensor parallelism divides between the ranks: the matrices split by output (with their
biases) and by input (without theirs: added once, after the all-reduce); llama-tiny has no biases."""


def split_by_tensor_parallelism(model) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if n.endswith(TP_SPLIT[model.spec.dims.model_type]))


@pytest.mark.parametrize("name", ["llama-tiny", pytest.param("gpt2-tiny", marks=further)])
def test_an_hf_model_under_tensor_parallelism_trains_like_one_process_and_a_plain_transformers_model_loads_it(
        tmp_path, name):
    """`--strategy tp --tp 2`: both ranks see the one batch (the reference's BATCH), split each
    decoder layer's projections (GPT-2's fused c_attn reordered by rank first), and write a
    checkpoint at STEPS; one more step's loss, the tp model's on the checkpointed weights, is the
    loss of transformers' own model (its own forward) loaded with that checkpoint."""
    import torch
    import torch.nn.functional as F
    import transformers

    from ringtop.agent.checkpoints.format import load_full_files
    from ringtop.agent.models.data import synthetic_sample
    from ringtop.agent.models.hf_catalogue import resolve
    from ringtop.agent.models.hf_models import build_meta_model, hf_config

    run = finished_agents(tmp_path, 2, "--model", f"hf:{name}", "--strategy", "tp", "--tp", "2", "--steps",
                          str(STEPS + 1), "--batch-size", str(BATCH), "--seq-len", str(SEQ), "--lr", str(LR),
                          "--checkpoint-every", str(STEPS), timeout_s=200)
    expected = reference(name, BATCH)
    steps = {rank: run.steps(rank) for rank in (0, 1)}
    assert [s.loss for s in steps[0]] == [s.loss for s in steps[1]], "one batch, one replicated head: one loss"
    assert_series_close([s.loss for s in steps[0]][:STEPS], expected.losses, rtol=LOSS_RTOL, what="loss")
    for rank in (0, 1):
        assert_series_close([s.grad_norm for s in steps[rank]][:STEPS], expected.grad_norms, rtol=GRAD_NORM_RTOL,
                            what=f"rank {rank}'s gradient norm")
    model_state, _, _ = load_full_files(run.checkpoint_dir / f"step-{STEPS:08d}-full")
    assert set(model_state) == set(expected.state), "the checkpoint keeps transformers' parameter names"
    assert_state_close(*without_key_bias(model_state, expected.state), steps=STEPS, lr=LR)

    spec = resolve(f"hf:{name}")
    plain = transformers.AutoModelForCausalLM.from_config(hf_config(spec))
    plain.load_state_dict(model_state, strict=True)  # transformers' names and whole (unsplit) shapes
    rows = torch.stack([synthetic_sample(STEPS * BATCH + i, SEQ, spec.dims.vocab, 0) for i in range(BATCH)])
    with torch.no_grad():
        logits = plain(input_ids=rows[:, :-1]).logits
    plain_loss = float(F.cross_entropy(logits.reshape(-1, logits.size(-1)), rows[:, 1:].reshape(-1)))
    assert_series_close([steps[0][STEPS].loss], [plain_loss], rtol=LOSS_RTOL, what="loss on the checkpoint")

    meta = build_meta_model(f"hf:{name}")
    total = sum(p.numel() for p in {id(p): p for p in meta.parameters()}.values())
    held = total - split_by_tensor_parallelism(meta) // 2
    tensors = len({id(p) for p in meta.parameters()})
    d = spec.dims
    per_step = 4 * d.layers * BATCH * SEQ * d.hidden * 4 + 4  # 2 fp32 activation all-reduces per layer each way
    for rank in (0, 1):
        hello = next(m for m in run.messages(rank) if isinstance(m, Hello))
        assert (hello.strategy, hello.strategy_options) == ("tp", {"degree": 2})
        mem, predicted = steps[rank][-1].mem, hello.prediction
        assert (mem.params_bytes, mem.grads_bytes, mem.optimizer_bytes) == (4 * held, 4 * held,
                                                                            8 * held + 4 * tensors)
        assert (predicted.params_bytes, predicted.grads_bytes, predicted.optimizer_bytes) == (
            mem.params_bytes, mem.grads_bytes, mem.optimizer_bytes), predicted.note
        assert predicted.comm_payload_bytes == {"all_reduce": per_step}
        for step in steps[rank]:
            assert [(c.kind, c.count, c.bytes) for c in step.comm] == [("all_reduce", 4 * d.layers + 1, per_step)]
        assert steps[rank][-1].tokens == BATCH * SEQ // 2


@further
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["llama-tiny", "gpt2-tiny"])
def test_an_hf_model_under_fsdp_over_tensor_parallel_groups_trains_like_one_process(tmp_path, name):
    """2D on 4 ranks, `--strategy fsdp --tp 2`: 2 tp groups, each one data shard (global batch
    2 x BATCH); memory and bytes per kind as predicted."""
    from ringtop.agent.checkpoints.format import load_full_files

    run = finished_agents(tmp_path, 4, "--model", f"hf:{name}", "--strategy", "fsdp", "--tp", "2", "--steps",
                          str(STEPS), "--batch-size", str(BATCH), "--seq-len", str(SEQ), "--lr", str(LR),
                          "--checkpoint-every", str(STEPS), timeout_s=280)
    expected = reference(name, 2 * BATCH)
    steps = assert_2d_trains_like_the_reference(run, expected)
    for rank in range(4):
        hello = next(m for m in run.messages(rank) if isinstance(m, Hello))
        mem, predicted = steps[rank][-1].mem, hello.prediction
        assert (mem.params_bytes, mem.grads_bytes, mem.optimizer_bytes) == (
            predicted.params_bytes, predicted.grads_bytes, predicted.optimizer_bytes), predicted.note
        assert bytes_by_kind(steps[rank][-1].comm) == predicted.comm_payload_bytes
    model_state, _, _ = load_full_files(run.checkpoint_dir / f"step-{STEPS:08d}-full")
    assert set(model_state) == set(expected.state)
    assert_state_close(*without_key_bias(model_state, expected.state), steps=STEPS, lr=LR)


@further
@pytest.mark.parametrize("name", ["llama-tiny", "gpt2-tiny"])
def test_live_switches_of_an_hf_model_into_and_out_of_tp_keep_the_state(tmp_path, name):
    """ddp -> tp -> fsdp through the agent's switch (tests/helpers/hf_tp_worker.py): the full state
    (weights and AdamW's moments, transformers' names and layout: GPT-2's c_attn columns back in
    q|k|v order) is the same to the bit across each switch, and the run trains like one process
    given each step's global batch (tp: one batch)."""
    from pathlib import Path

    import torch
    from conftest import run_worker_script

    found = run_worker_script(Path(__file__).resolve().parents[1] / "helpers" / "hf_tp_worker.py",
                              [f"hf:{name}", "ddp,tp,tp,fsdp", str(BATCH), str(SEQ), str(LR)], tmp_path, nproc=2,
                              timeout_s=200)
    assert [rank["switch_diffs"] for rank in found] == [[0.0, 0.0]] * 2
    run = torch.load(tmp_path / "rank-0.pt")
    assert run["batches"] == [2 * BATCH, BATCH, BATCH, 2 * BATCH]
    expected = reference_run(len(run["losses"]), run["batches"], SEQ, LR, model=f"hf:{name}")
    assert_series_close(run["losses"], expected.losses, rtol=LOSS_RTOL, what="loss")
    assert set(run["state"]) == set(expected.state)
    assert_state_close(*without_key_bias(run["state"], expected.state), steps=len(run["losses"]), lr=LR)


@further
def test_gpt2s_q_k_v_columns_split_as_they_are_fail_the_equivalence_check(tmp_path):
    """The layout trap in GPT-2's fused c_attn: split in rank blocks without the reordering, rank 0
    gets all of q and half of k, and trains without an error, but not like one process."""
    from pathlib import Path

    import torch
    from conftest import run_worker_script

    run_worker_script(Path(__file__).resolve().parents[1] / "helpers" / "hf_tp_worker.py",
                      ["hf:gpt2-tiny", "trap", str(BATCH), str(SEQ), str(LR)], tmp_path, nproc=2, timeout_s=200)
    run = torch.load(tmp_path / "rank-0.pt")
    assert run["batches"] == [BATCH] * STEPS and all(torch.isfinite(torch.tensor(run["losses"])))
    with pytest.raises(AssertionError, match="loss: largest relative difference"):
        assert_series_close(run["losses"], reference("gpt2-tiny", BATCH).losses, rtol=LOSS_RTOL, what="loss")
