"""A user's DeepSpeed config merged with what ringtop owns: adopted, filled, or refused clearly."""

from __future__ import annotations

import json

import pytest

from ringtop.agent.config import ConfigError, parse_agent_args
from ringtop.strategies.ds_config import DSConfigError, Owned, check_command_ds_config, merge_ds_config

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
    cfg, _ = merge_ds_config({"zero_optimization": {"stage3_param_persistence_threshold": 1e5}}, 3, 2,
                             Owned(8, 0.0, "fp32"))
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


# ---------------------------------------------------------------- configs sent with a command


@pytest.mark.parametrize("key", ["flops_profiler", "tensorboard", "wandb", "csv_monitor", "comms_logger",
                                 "checkpoint", "autotuning", "aio", "data_efficiency"])
def test_a_command_config_may_not_hold_keys_that_touch_files(key):
    with pytest.raises(DSConfigError, match=rf"refused: {key}.*only from --ds-config at launch"):
        check_command_ds_config({"zero_optimization": {"stage": 2}, key: {"enabled": True, "output_path": "/x"}})


@pytest.mark.parametrize("key", ["offload_optimizer", "offload_param"])
def test_a_command_config_may_not_offload_to_a_path(key):
    with pytest.raises(DSConfigError, match=rf"refused: zero_optimization\.{key}"):
        check_command_ds_config({"zero_optimization": {"stage": 3, key: {"device": "nvme", "nvme_path": "/x"}}})


def test_a_command_config_that_shapes_training_is_accepted():
    check_command_ds_config(CHAPTER_STAGE2)  # the chapter's example: buckets, overlap, bf16, clipping


def test_a_command_config_file_error_says_nothing_about_the_file(tmp_path):
    from ringtop.agent.config import load_command_ds_config

    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[]")
    messages = set()
    for name in ("missing.json", "bad.json", "list.json"):
        with pytest.raises(DSConfigError) as info:
            load_command_ds_config(str(tmp_path / name))
        messages.add(str(info.value))
    assert messages == {"ds_config: not a readable DeepSpeed JSON config inside the run's checkpoint directory"}


def test_paths_in_commands_stay_inside_the_run(tmp_path):
    from ringtop.agent.control.run_paths import OutsideRunError, inside_run_directory

    run = tmp_path / "run" / "checkpoints"
    run.mkdir(parents=True)
    (tmp_path / "secret").write_text("x")
    (run / "link").symlink_to(tmp_path / "secret")
    assert inside_run_directory("ds.json", str(run), "ds_config") == (run / "ds.json").resolve()
    assert (inside_run_directory(str(run / "sub" / "a.json"), str(run), "ds_config")
            == (run / "sub" / "a.json").resolve())
    for escape in ("../secret", str(tmp_path / "secret"), "link", "sub/../../x", "/etc/passwd"):
        with pytest.raises(OutsideRunError, match="inside the run's checkpoint directory"):
            inside_run_directory(escape, str(run), "ds_config")
