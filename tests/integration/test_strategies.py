"""Every strategy on 2 gloo ranks trains like DDP, and DDP like one process with the whole batch;
what each rank holds matches the cost model's prediction to the byte."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import finished_agents, further
from numerics import GRAD_NORM_RTOL, LOSS_RTOL, assert_series_close, assert_trains_like_the_reference, mean_losses
from reference import reference_run

from ringtop.protocol import Hello

STEPS, BATCH, SEQ, LR = 20, 4, 32, 1e-3
COMMON = ("--steps", str(STEPS), "--batch-size", str(BATCH), "--seq-len", str(SEQ), "--lr", str(LR),
          "--checkpoint-every", str(STEPS))
needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason="DeepSpeed is not installed (pip install 'ringtop[deepspeed]')")

STRATEGIES = [
    pytest.param(("--strategy", "ddp"), id="ddp"),
    pytest.param(("--strategy", "fsdp", "--fsdp-sharding", "full"), id="fsdp-full"),
    pytest.param(("--strategy", "fsdp", "--fsdp-sharding", "grad-op"), id="fsdp-grad-op"),
    pytest.param(("--strategy", "fsdp", "--fsdp-sharding", "no-shard"), id="fsdp-no-shard", marks=further),
    pytest.param(("--strategy", "zero1"), id="zero1", marks=[needs_deepspeed, further]),  # in the switch circuit
    pytest.param(("--strategy", "zero2"), id="zero2", marks=needs_deepspeed),
    pytest.param(("--strategy", "zero3"), id="zero3", marks=needs_deepspeed),
]


@pytest.fixture(scope="module")
def reference():
    return reference_run(STEPS, 2 * BATCH, SEQ, LR)


def finished_run(workdir, strategy_args):
    return finished_agents(workdir, 2, *strategy_args, *COMMON, timeout_s=200)


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """The DDP run every other strategy is compared with (and which is itself one of the cases)."""
    return finished_run(tmp_path_factory.mktemp("ddp"), ("--strategy", "ddp"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("strategy_args", STRATEGIES)
def test_strategy_trains_like_ddp_and_holds_what_the_model_predicts(tmp_path, strategy_args, reference, ddp_run):
    run = ddp_run if strategy_args == ("--strategy", "ddp") else finished_run(tmp_path, strategy_args)
    ddp_losses = mean_losses(ddp_run)
    assert_trains_like_the_reference(run, reference, STEPS, LR)
    assert_series_close(mean_losses(run), ddp_losses, rtol=LOSS_RTOL, what="loss against DDP")

    for rank in (0, 1):
        hello = next(m for m in run.messages(rank) if isinstance(m, Hello))
        predicted = hello.prediction
        measured = [s.mem for s in run.steps(rank)][-1]
        assert (measured.params_bytes, measured.grads_bytes, measured.optimizer_bytes) == (
            predicted.params_bytes, predicted.grads_bytes, predicted.optimizer_bytes), predicted.note
        assert predicted.params_bytes > 0 and predicted.optimizer_bytes > 0


CLIP = 0.05  # small enough that every step of this run is clipped


@pytest.fixture(scope="module")
def clipped_reference():
    return reference_run(8, 2 * BATCH, SEQ, LR, grad_clip=CLIP)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("strategy_args", [
    pytest.param(("--strategy", "fsdp"), id="fsdp-full"),  # DDP clips through the same code as FSDP
    pytest.param(("--strategy", "zero2"), id="zero2", marks=needs_deepspeed),
])
def test_gradient_clipping_is_applied_the_same_way_in_every_strategy(tmp_path, strategy_args, clipped_reference):
    run = finished_agents(tmp_path, 2, *strategy_args, "--steps", "8", "--batch-size", str(BATCH), "--seq-len",
                          str(SEQ), "--lr", str(LR), "--grad-clip", str(CLIP), timeout_s=180)
    expected = clipped_reference
    unclipped = reference_run(8, 2 * BATCH, SEQ, LR)
    assert min(expected.grad_norms) > CLIP, "every step is clipped"
    assert expected.losses[-1] != pytest.approx(unclipped.losses[-1], rel=1e-4), "the clip must bite in this test"
    assert_series_close(mean_losses(run), expected.losses, rtol=LOSS_RTOL, what="loss")
    assert_series_close([s.grad_norm for s in run.steps(0)], expected.grad_norms, rtol=GRAD_NORM_RTOL,
                        what="gradient norm before clipping")
    assert next(m for m in run.messages(0) if isinstance(m, Hello)).grad_clip == CLIP
