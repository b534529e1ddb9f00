"""The one definition of each number (metrics/timing.py, metrics/costs/memory_model.py,
metrics/strategy_names.py), against hand arithmetic, with the cases that tell a wrong rule apart."""

from __future__ import annotations

import math

import pytest

from ringtop.metrics import fmt
from ringtop.metrics.costs.memory_model import (
    DEEPSPEED_ADAM,
    TORCH_ADAM,
    chapter_optimizer_state,
    optimizer_state_of,
    predicted_state,
    sharding_of,
)
from ringtop.metrics.strategy_names import DATA_PARALLEL_STRATEGIES, SHARDED_STATE, sharded_label, sharded_words
from ringtop.metrics.timing import idle_ms, step_idle_ms


def test_idle_is_what_the_agent_sent_else_input_plus_exposed_comm():
    assert idle_ms(2.0, 5.0, 30.0) == 30.0  # a pipeline stage's bubble, as sent
    assert idle_ms(2.0, 5.0, 0.0) == 7.0  # not sent (an older agent): input + exposed
    assert idle_ms(2.0, 5.0, math.inf) == 7.0 and idle_ms(2.0, 5.0, math.nan) == 7.0
    assert idle_ms(math.nan, 5.0) == 5.0  # a time that is not finite counts as none
    # what the agent sends: the bubble replaces exposed comm in a pipeline, input is always in
    assert step_idle_ms(2.0, 5.0) == 7.0 and step_idle_ms(2.0, 5.0, 30.0) == 32.0


P = 1_000_000


@pytest.mark.parametrize("strategy, params, grads, optimizer", [
    # torch strategies: fp32 params and grads (4 B), torch Adam's two fp32 moments (8 B)
    ("ddp", 4 * P, 4 * P, 8 * P),
    ("fsdp-full", 4 * P // 4, 4 * P // 4, 8 * P // 4),
    # SHARD_GRAD_OP reshards its parameters after backward: between steps it holds a quarter
    ("fsdp-grad-op", 4 * P // 4, 4 * P // 4, 8 * P // 4),
    ("fsdp-no-shard", 4 * P, 4 * P, 8 * P),
    # DeepSpeed in bf16: 2 B params and grads, fp32 master + moments 12 B, optimizer / N from stage 1;
    # stage 1 keeps only its partition of the reduced gradients after backward, as stage 2
    ("zero1", 2 * P, 2 * P // 4, 12 * P // 4),
    ("zero2", 2 * P, 2 * P // 4, 12 * P // 4),
    ("zero3", 2 * P // 4, 2 * P // 4, 12 * P // 4),
])
def test_predicted_state_is_each_implementations_between_steps(strategy, params, grads, optimizer):
    got = predicted_state(strategy, 4, P, "bf16").memory
    assert (got.params_bytes, got.grads_bytes, got.optimizer_bytes) == (params, grads, optimizer)


def test_step_counters_are_one_per_tensor_for_torch_and_one_for_deepspeed():
    assert predicted_state("ddp", 2, P, "fp32", param_tensors=10).memory.optimizer_bytes == 8 * P + 10 * 4
    assert predicted_state("zero3", 2, P, "fp32", param_tensors=10).memory.optimizer_bytes == 12 * P // 2 + 4


def test_optimizer_state_models_say_which_they_are():
    assert [optimizer_state_of(s) for s in ("ddp", "fsdp", "pp", "zero1", "zero3")] == \
        [TORCH_ADAM, TORCH_ADAM, TORCH_ADAM, DEEPSPEED_ADAM, DEEPSPEED_ADAM]
    assert (TORCH_ADAM.bytes_per_param, DEEPSPEED_ADAM.bytes_per_param) == (8, 12)
    chapter = chapter_optimizer_state(2)  # bf16 params: the chapter's 4 x 2 B
    assert chapter.bytes_per_param == 8 and "chapter" in chapter.words
    for m in (TORCH_ADAM, DEEPSPEED_ADAM, chapter):
        assert "B/param" in m.words and "B/param" in m.short and "-adam" not in m.words + m.short
    assert "distributed-training-basics" in chapter.words  # never "the chapter" without saying which


def test_sharding_words_are_the_strategies_own_and_match_what_the_cost_model_shards():
    assert [SHARDED_STATE[s] for s in ("ddp", "zero1", "zero2", "zero3", "fsdp-full", "fsdp-grad-op")] == \
        ["", "optim", "grads+optim", "params+grads+optim", "params+grads+optim", "grads+optim"]
    for s in DATA_PARALLEL_STRATEGIES:
        assert sharded_words(s, "") == sharded_label(sharding_of(s), ""), s
    assert sharded_words("fsdp(grad-op)") == "grads+optim" and sharded_words("ddp") == "-"


def test_sizes_are_binary_everywhere():
    """One formatter: 8e6 bytes is 7.63 MiB, never "8.0 MB"; a checkpoint of 13.2e6 B reads 12.6MiB."""
    assert fmt.nbytes(13_200_000) == "12.6MiB" and fmt.mib(8_000_000) == "7.63"
    assert fmt.nbytes(14e9) == "13.0GiB"
