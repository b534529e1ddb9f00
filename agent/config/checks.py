"""The checks of a config as a whole, once its options are read: combinations that do not go
together, what a tensor-parallel split needs, a DeepSpeed config's values adopted. Every message
says what to do instead."""

from __future__ import annotations

import re
from collections.abc import Set

import msgspec

from ringtop.agent.config.fields import (
    BUILTIN_DATA,
    BUILTIN_MODEL,
    ENDPOINT_NAMES,
    MODEL_SIZE_HEADS,
    PIPELINE_OPTIONS,
    AgentConfig,
    flag_of,
)
from ringtop.agent.config.options import ConfigError
from ringtop.agent.health.nonfinite import zero_refusal
from ringtop.agent.models.hf_catalogue import ModelConfigError, check_seq_len, is_hf_spec, tensor_parallel_refusal
from ringtop.agent.models.hf_catalogue import resolve as resolve_hf
from ringtop.metrics.strategy_names import STRATEGY_CHOICES, ZERO_STRATEGIES
from ringtop.protocol import EndpointError, check_bind_safe, parse_tcp
from ringtop.protocol.endpoints import is_loopback
from ringtop.strategies.ds_config import DSConfigError, Owned, load_ds_config, merge_ds_config

RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
"""A run id names files (its connection file): nothing that could leave a directory."""


def _check_hf_model(spec: str, seq_len: int) -> None:
    """ringtop's checks of the spec (stdlib), then transformers' of the config it becomes (imports
    torch and transformers: only for an hf model)."""
    try:
        model = resolve_hf(spec)
        check_seq_len(model, seq_len)
        from ringtop.agent.models.hf_models import hf_config

        hf_config(model)
    except ModelConfigError as exc:
        raise ConfigError(str(exc)) from None
    except ImportError as exc:
        raise ConfigError(f"--model {spec}: {exc}") from None


def check_combinations(cfg: AgentConfig, given: Set[str]) -> None:
    """The options together (`given`: the fields typed), in this order: the first clash is the one said."""
    _check_model_and_data(cfg, given)
    _check_strategy_options(cfg, given)
    _check_run_id_and_addresses(cfg)
    _check_alerts_and_capture(cfg)


def _check_alerts_and_capture(cfg: AgentConfig) -> None:
    from ringtop.agent.alerts import AlertTargets
    from ringtop.agent.control.capture import CaptureSettings

    try:
        AlertTargets(cfg.alert_webhook, cfg.alert_command, cfg.alert_goodput)
        CaptureSettings(cfg.capture_on, cfg.capture_every_min, cfg.capture_steps)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.alert_goodput and not (cfg.alert_webhook or cfg.alert_command):
        raise ConfigError("--alert-goodput needs --alert-webhook or --alert-command: where the alert goes")


def _check_model_and_data(cfg: AgentConfig, given: Set[str]) -> None:
    if cfg.model != BUILTIN_MODEL and "model_size" in given:
        raise ConfigError("--model-size sizes the built-in tiny-gpt; drop it when --model is your own factory "
                          "or an hf architecture")
    if is_hf_spec(cfg.model):
        _check_hf_model(cfg.model, cfg.seq_len)
    elif cfg.model != BUILTIN_MODEL and ":" not in cfg.model:
        raise ConfigError(f"--model {cfg.model!r}: use 'tiny-gpt' or package.module:function, or an hf "
                          "architecture: hf:NAME (`ringtop models`) or hf-config:PATH")
    if cfg.data != BUILTIN_DATA and ":" not in cfg.data:
        raise ConfigError(f"--data {cfg.data!r}: use 'synthetic' or package.module:function")
    if cfg.model == BUILTIN_MODEL and cfg.seq_len > 1024:
        raise ConfigError("--seq-len above 1024 exceeds tiny-gpt's context; use --seq-len <= 1024")
    if not cfg.telemetry:
        clashing = sorted(given & {"log_dir", "print_every", "metrics", "alert_webhook", "alert_command",
                                   "alert_goodput", "capture_on", *ENDPOINT_NAMES})
        if clashing:
            names = ", ".join(flag_of(n) for n in clashing)
            raise ConfigError(f"--no-telemetry turns off all telemetry and control; drop {names} "
                              "or drop --no-telemetry")


def _check_strategy_options(cfg: AgentConfig, given: Set[str]) -> None:
    if cfg.strategy not in STRATEGY_CHOICES:
        raise ConfigError(f"unknown strategy {cfg.strategy!r}; choose from {', '.join(STRATEGY_CHOICES)}")
    if "fsdp_sharding" in given and cfg.strategy != "fsdp":
        raise ConfigError("--fsdp-sharding applies to --strategy fsdp only")
    pp_given = [n for n in PIPELINE_OPTIONS if n in given]
    if pp_given and cfg.strategy != "pp":
        raise ConfigError(f"{flag_of(pp_given[0])} applies to --strategy pp only")
    if "micro_batches" in given and (cfg.micro_batches < 1 or cfg.batch_size % cfg.micro_batches):
        raise ConfigError(f"--micro-batches {cfg.micro_batches} must be >= 1 and divide --batch-size "
                          f"{cfg.batch_size}")
    _check_tensor_parallel(cfg, given)
    if cfg.ds_config is not None and cfg.strategy not in ZERO_STRATEGIES:
        raise ConfigError("--ds-config applies to --strategy zero1, zero2 or zero3 only")
    refusal = zero_refusal(cfg.strategy, cfg.on_nonfinite)
    if refusal:
        raise ConfigError(refusal)
    if cfg.ddp_bucket_cap_mb is not None and cfg.strategy != "ddp":
        raise ConfigError("--ddp-bucket-cap-mb applies to --strategy ddp only")


def _check_run_id_and_addresses(cfg: AgentConfig) -> None:
    if cfg.run_id is not None and not RUN_ID_PATTERN.fullmatch(cfg.run_id):
        raise ConfigError(f"--run-id {cfg.run_id!r}: use letters, digits, '.', '_' and '-' (at most 64, "
                          "not starting with '.' or '-')")
    try:
        ports = set()
        for name in ("publish", "relay", "control"):
            address = getattr(cfg, name)
            _, port = parse_tcp(address)
            if port in ports:
                raise ConfigError(f"--{name} {address}: the publish, relay and control ports must differ")
            ports.add(port)
            check_bind_safe(address, cfg.allow_remote)
    except EndpointError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.metrics is not None and not is_loopback(cfg.metrics[0]):
        where = f"--metrics {cfg.metrics[0]}:{cfg.metrics[1]}"
        if cfg.insecure:
            raise ConfigError(f"refusing {where} with --insecure: metrics reach beyond loopback only on an "
                              "authenticated run. Serve them on 127.0.0.1 (a Prometheus on this node, or ssh -L), "
                              "or drop --insecure")
        if not cfg.allow_remote:
            raise ConfigError(f"refusing {where}: it is reachable from other machines. Keep 127.0.0.1 (a "
                              "Prometheus on this node, or ssh -L), or pass --allow-remote")


def _check_tensor_parallel(cfg: AgentConfig, given: Set[str]) -> None:
    """What can be checked before the world size is known (the runner checks the rest:
    `check_tensor_parallel_world`)."""
    if "tp" in given and cfg.strategy not in ("tp", "fsdp", "pp"):
        raise ConfigError("--tp applies to --strategy tp, fsdp and pp only")
    if cfg.tp_sequence_parallel and "tp_sequence_parallel" in given:
        if cfg.strategy != "tp":
            raise ConfigError("--tp-sequence-parallel applies to --strategy tp only")
    if cfg.strategy != "tp" and not (cfg.strategy in ("fsdp", "pp") and cfg.tp is not None and cfg.tp > 1):
        return
    what = "--strategy tp" if cfg.strategy == "tp" else "--tp"
    hf = is_hf_spec(cfg.model)
    if cfg.strategy == "pp" and cfg.model != BUILTIN_MODEL:
        raise ConfigError("--strategy pp --tp splits the built-in tiny-gpt's stages only; drop --model or --tp")
    if cfg.model != BUILTIN_MODEL and not hf:
        raise ConfigError(f"{what} splits the layers of the built-in tiny-gpt and of the hf models "
                          "(--model hf:NAME or hf-config:PATH) only; drop --model or use another strategy")
    if cfg.dtype != "fp32":
        raise ConfigError(f"{what} trains in fp32 here; drop --dtype bf16")
    if cfg.strategy == "fsdp" and cfg.fsdp_sharding == "no-shard":
        raise ConfigError("--tp with --strategy fsdp shards over the data-parallel ranks: use --fsdp-sharding "
                          "full or grad-op")
    _check_splits(cfg, cfg.tp or 1)  # with the degree still unknown, what no degree splits (GPT-2)


def _check_splits(cfg: AgentConfig, degree: int) -> None:
    """The model's heads (and an hf model's key/value heads and MLP width) split whole `degree` ways."""
    if is_hf_spec(cfg.model):
        refusal = tensor_parallel_refusal(resolve_hf(cfg.model), degree)
        if refusal:
            raise ConfigError(refusal)
        return
    heads = MODEL_SIZE_HEADS[cfg.model_size]
    if heads % degree:
        raise ConfigError(f"tensor parallelism over {degree} ranks: {degree} must divide tiny-gpt-{cfg.model_size}'s "
                          f"{heads} attention heads (each rank computes whole heads); pass --tp with a divisor")


def check_switch_tensor_parallel(cfg: AgentConfig, world_size: int, tp_given: bool) -> None:
    """A live switch's target as the command line's would be checked (`tp_given`: the command
    named a degree)."""
    _check_tensor_parallel(cfg, {"tp"} if tp_given else set())
    check_tensor_parallel_world(cfg, world_size)


def check_tensor_parallel_world(cfg: AgentConfig, world_size: int) -> None:
    """The tensor-parallel degree against the run's ranks: --strategy tp runs one group over all of
    them, --strategy fsdp --tp N world size / N groups, --strategy pp --tp N replicas x stages
    groups of N (stages: --pp-stages, else world size / N)."""
    if cfg.strategy not in ("tp", "fsdp", "pp") or (cfg.strategy in ("fsdp", "pp") and cfg.tp is None):
        return
    degree = cfg.tp or world_size
    if world_size % degree:
        raise ConfigError(f"--tp {degree} must divide the world size ({world_size} ranks)")
    if cfg.strategy == "pp" and cfg.pp_stages is not None and world_size % (cfg.pp_stages * degree):
        raise ConfigError(f"--pp-stages {cfg.pp_stages} x --tp {degree} must divide the world size ({world_size} "
                          "ranks): world = replicas x stages x tp")
    if cfg.strategy == "tp" and degree != world_size:
        raise ConfigError(f"--strategy tp runs one tensor-parallel group over all {world_size} ranks; pass "
                          f"--tp {world_size} or leave --tp out; for data-parallel replicas of tp groups, "
                          f"--strategy fsdp --tp {degree}")
    if cfg.strategy == "tp" and cfg.tp_sequence_parallel and cfg.seq_len % degree:
        raise ConfigError(f"--tp-sequence-parallel over {degree} ranks: {degree} must divide --seq-len "
                          f"({cfg.seq_len}), each rank takes an equal slice of the sequence")
    _check_splits(cfg, degree)


def adopt_ds_config(cfg: AgentConfig, given: Set[str]) -> AgentConfig:
    """A DeepSpeed config's batch size, clipping and dtype, unless the command line set them."""
    if cfg.ds_config is None:
        return cfg
    explicit = frozenset(n for n in ("batch_size", "grad_clip", "dtype") if n in given)
    try:
        _, adopted = merge_ds_config(load_ds_config(cfg.ds_config), int(cfg.strategy[-1]), None,
                                     Owned(cfg.batch_size, cfg.grad_clip, cfg.dtype, explicit))
    except DSConfigError as exc:
        raise ConfigError(str(exc)) from None
    if adopted.batch_size < 1:
        raise ConfigError("--ds-config train_micro_batch_size_per_gpu must be >= 1")
    return msgspec.structs.replace(cfg, batch_size=adopted.batch_size, grad_clip=adopted.grad_clip,
                                   dtype=adopted.dtype)
