"""A user's DeepSpeed config merged with what ringtop owns: adopted, filled, or refused clearly."""

from __future__ import annotations

import json

import pytest

from ringtop.agent.config import ConfigError, parse_agent_args
from ringtop.strategies.ds_config import DSConfigError, Owned, merge_ds_config

# The chapter's stage-2 example (seed/distributed-training-basics.zh.txt, "DeepSpeed 配置"), with its
# gradient_accumulation_steps turned to "auto": ringtop takes one micro-batch per step.
CHAPTER_STAGE2 = {
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 2, "allgather_partitions": True, "allgather_bucket_size": 5e8,
                          "overlap_comm": True, "reduce_scatter": True, "reduce_bucket_size": 5e8,
                          "contiguous_gradients": True},
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": 1.0,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
}


def test_the_chapters_example_is_filled_and_its_settings_adopted():
    cfg, owned = merge_ds_config(CHAPTER_STAGE2, 2, 4, Owned(batch_size=8, grad_clip=0.0, dtype="fp32"))
    assert cfg["train_micro_batch_size_per_gpu"] == 8
    assert cfg["train_batch_size"] == 32 and cfg["gradient_accumulation_steps"] == 1
    assert cfg["gradient_clipping"] == 1.0 and owned.grad_clip == 1.0
    assert cfg["bf16"] == {"enabled": True} and owned.dtype == "bf16"
    assert cfg["zero_optimization"]["stage"] == 2 and cfg["zero_optimization"]["overlap_comm"] is True
    assert cfg["zero_allow_untested_optimizer"] is True
    assert CHAPTER_STAGE2["train_batch_size"] == "auto", "the user's dict is not modified"


@pytest.mark.parametrize("change, explicit, says", [
    ({"gradient_accumulation_steps": 4}, (), "gradient_accumulation_steps=4"),
    ({"gradient_clipping": 1.0}, ("grad_clip",), "gradient_clipping=1.0 but --grad-clip 0.0"),
    ({"train_micro_batch_size_per_gpu": 16}, ("batch_size",), "train_micro_batch_size_per_gpu=16 but --batch-size 8"),
    ({"train_batch_size": 100}, (), "train_batch_size=100, but 4 ranks x batch 8 make 32"),
    ({"zero_optimization": {"stage": 3}}, (), "zero_optimization.stage=3 but --strategy zero2"),
    ({"optimizer": {"type": "Adam"}}, (), "'optimizer' section"),
    ({"fp16": {"enabled": True}}, (), "enables fp16"),
    ({"bf16": {"enabled": True}}, ("dtype",), "--dtype fp32"),
])
def test_contradictions_are_refused_with_both_sides_named(change, explicit, says):
    with pytest.raises(DSConfigError) as info:
        merge_ds_config(change, 2, 4, Owned(batch_size=8, grad_clip=0.0, dtype="fp32", explicit=frozenset(explicit)))
    assert says in str(info.value)


def test_zero3_keeps_every_parameter_partitioned_unless_the_user_says_otherwise():
    cfg, _ = merge_ds_config({}, 3, 2, Owned(8, 0.0, "fp32"))
    assert cfg["zero_optimization"]["stage3_param_persistence_threshold"] == 0
    cfg, _ = merge_ds_config({"zero_optimization": {"stage3_param_persistence_threshold": 1e5}}, 3, 2, Owned(8, 0.0, "fp32"))
    assert cfg["zero_optimization"]["stage3_param_persistence_threshold"] == 1e5


def test_the_agent_adopts_the_files_batch_size_and_refuses_a_bad_file(tmp_path):
    good = tmp_path / "ds.json"
    good.write_text(json.dumps({"train_micro_batch_size_per_gpu": 6, "zero_optimization": {"stage": "auto"}}))
    cfg = parse_agent_args(["--strategy", "zero2", "--ds-config", str(good)])
    assert cfg.batch_size == 6 and cfg.strategy_options()["ds_config"]["train_micro_batch_size_per_gpu"] == 6
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        parse_agent_args(["--strategy", "zero2", "--ds-config", str(bad)])
    with pytest.raises(ConfigError, match="cannot read it"):
        parse_agent_args(["--strategy", "zero2", "--ds-config", str(tmp_path / "missing.json")])
    with pytest.raises(ConfigError, match="applies to --strategy zero1, zero2 or zero3 only"):
        parse_agent_args(["--strategy", "ddp", "--ds-config", str(good)])
