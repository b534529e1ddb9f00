"""The agent's options, each written once: a field of AgentConfig whose annotation carries an
`Option` saying how the command line gives it. The parser, its help (with every default) and the
config built from what was typed all come from those fields; the checks run once, in
`config_from_options`."""

from __future__ import annotations

import argparse
import functools
import re
import types
import typing
from collections.abc import Callable, Set
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from ringtop.metrics.strategy_names import (
    FSDP_SHARDINGS,
    PP_SCHEDULES,
    STRATEGY_CHOICES,
    ZERO_STRATEGIES,
    canonical_strategy,
)
from ringtop.protocol import (
    DEFAULT_CONTROL_ADDRESS,
    DEFAULT_PUBLISH_ADDRESS,
    DEFAULT_RELAY_ADDRESS,
    EndpointError,
    Endpoints,
    check_bind_safe,
    parse_tcp,
)
from ringtop.protocol.endpoints import is_loopback
from ringtop.strategies.ds_config import (
    DSConfigError,
    Owned,
    check_command_ds_config,
    load_ds_config,
    merge_ds_config,
)
from ringtop.strategies.links import parse_link

from .hf_catalogue import ModelConfigError, check_seq_len, is_hf_spec, tensor_parallel_refusal
from .hf_catalogue import resolve as resolve_hf
from .nonfinite import MODES as NONFINITE_MODES
from .nonfinite import zero_refusal

HANG_PLACES = ("forward", "before-collective")
BUILTIN_MODEL = "tiny-gpt"
BUILTIN_DATA = "synthetic"
MODEL_SIZE_CHOICES = ("1m", "10m", "25m", "125m")
MODEL_SIZE_HEADS = {"1m": 4, "10m": 5, "25m": 7, "125m": 12}
"""Attention heads of each built-in size (agent/model.py's MODEL_SIZES, without importing torch)."""
PIPELINE_OPTIONS = ("pp_stages", "pp_schedule", "micro_batches", "pp_split")
ENDPOINT_NAMES = frozenset({"publish", "relay", "control"})


RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
"""A run id names files (its connection file): nothing that could leave a directory."""


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Option:
    """How a field of AgentConfig is given on the command line (its place in `--help`, its flag,
    its check). A bool field is a flag that turns its default around."""

    group: str
    help: str
    flag: str = ""
    """Default: `--` and the field's name with dashes."""
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    default_text: str = ""
    """What the help says the default is, where the value says too little (None, 0.0)."""
    parse: Callable[[str], Any] | None = None
    """The typed text -> the field's value, raising ConfigError: for values that are not a number
    or a word."""
    ge: float | None = None
    gt: float | None = None
    bound_note: str = ""
    """Said after a value out of bounds, e.g. `0 = never`."""


TRAINING = "training"
TELEMETRY = "telemetry and control"
FAULTS = "fault injection (tests and demos)"
CHECKPOINTS = "checkpoints"


def _slow_rank(text: str) -> tuple[int, float]:
    rank_text, sep, ms_text = text.partition(":")
    try:
        slow = (int(rank_text), float(ms_text))
    except ValueError:
        slow = None
    if not sep or slow is None or slow[0] < 0 or slow[1] < 0:
        raise ConfigError(f"--inject-slow-rank {text!r}: expected R:MS, e.g. 1:200")
    return slow


def _rank_step(flag: str, text: str) -> tuple[int, int, str]:
    """`R:STEP[:EXTRA]` of a fault injection: (rank, step, extra or "")."""
    parts = text.split(":")
    try:
        rank, step = int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        rank = step = -1
    if len(parts) not in (2, 3) or rank < 0 or step < 1:
        raise ConfigError(f"{flag} {text!r}: expected R:STEP (a rank >= 0, a step >= 1), e.g. 1:5")
    return rank, step, parts[2] if len(parts) == 3 else ""


def _hang(text: str) -> tuple[int, int, str]:
    rank, step, place = _rank_step("--inject-hang", text)
    place = place or "forward"
    if place not in HANG_PLACES:
        raise ConfigError(f"--inject-hang {text!r}: the place is one of {', '.join(HANG_PLACES)}")
    return rank, step, place


def _at_step(flag: str) -> Callable[[str], tuple[int, int]]:
    """The parser of a fault that takes `R:STEP` and nothing more."""
    def parse(text: str) -> tuple[int, int]:
        rank, step, extra = _rank_step(flag, text)
        if extra:
            raise ConfigError(f"{flag} {text!r}: expected R:STEP, e.g. 1:5")
        return rank, step
    return parse


def _layers_per_stage(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--pp-split {text!r}: expected layer counts like 3,1") from None


def _metrics_address(text: str) -> tuple[str, int]:
    host, sep, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]  # [::1]:9400
    port = int(port_text) if port_text.isdigit() else 0
    if not sep or not host or not 1 <= port <= 65535:
        raise ConfigError(f"--metrics {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9400")
    return host, port


def _link_parser(flag: str) -> Callable[[str], float]:
    def peak_gbps(text: str) -> float:
        try:
            return parse_link(text).per_direction_gbps
        except ValueError as exc:
            raise ConfigError(f"{flag}: {exc}") from None
    return peak_gbps


_link_peak_gbps = _link_parser("--link")


class AgentConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Every option of a run. The fields in `Annotated[..., Option(...)]` are the command line's,
    in the order `--help` lists them."""

    strategy: Annotated[str, Option(TRAINING, f"parallel strategy: {', '.join(STRATEGY_CHOICES)}")] = "ddp"
    fsdp_sharding: Annotated[str, Option(
        TRAINING, "with --strategy fsdp: full (FULL_SHARD), grad-op (SHARD_GRAD_OP), no-shard (NO_SHARD)",
        choices=FSDP_SHARDINGS)] = "full"
    ds_config: Annotated[str | None, Option(
        TRAINING, "with --strategy zero1/2/3: a DeepSpeed JSON config; ringtop fills its \"auto\" values",
        metavar="FILE", default_text="none")] = None
    pp_stages: Annotated[int | None, Option(
        TRAINING, "with --strategy pp: pipeline stages", ge=1,
        default_text="one per rank; more ranks = replicas")] = None
    pp_schedule: Annotated[str, Option(TRAINING, "with --strategy pp: the schedule", choices=PP_SCHEDULES)] = "gpipe"
    micro_batches: Annotated[int, Option(TRAINING, "with --strategy pp: micro-batches per step")] = 4
    pp_split: Annotated[tuple[int, ...] | None, Option(
        TRAINING, "with --strategy pp: layers per stage, e.g. 3,1", parse=_layers_per_stage,
        default_text="balanced")] = None
    tp: Annotated[int | None, Option(
        TRAINING, "with --strategy tp: ranks that split each layer's matrices (its tensor-parallel degree); they "
        "see the same batch. With --strategy fsdp: 2D, FSDP over the world size / N groups of N. With --strategy "
        "pp: 3D, each stage's layers split over N consecutive ranks (world = replicas x stages x N)",
        ge=1, metavar="N", default_text="the world size with tp; 1 with fsdp and pp")] = None
    tp_sequence_parallel: Annotated[bool, Option(
        TRAINING, "with --strategy tp, the built-in model or an hf model: sequence parallelism, the "
        "norms run on each rank's slice of the sequence (all-gather + reduce-scatter instead of all-reduces)")] = False
    dtype: Annotated[str, Option(
        TRAINING, "fp32, or bf16 mixed precision with fp32 master state", choices=("fp32", "bf16"))] = "fp32"
    grad_clip: Annotated[float, Option(
        TRAINING, "clip gradients to this global norm, the same way in every strategy; 0 = off", ge=0,
        bound_note="0 = off")] = 0.0
    model: Annotated[str, Option(
        TRAINING, f"'{BUILTIN_MODEL}' (built in); hf:NAME, a Hugging Face architecture built from a config in "
        "ringtop (`ringtop models` lists them; needs transformers, no download); hf-config:PATH, one from your "
        "config.json (llama, mistral, qwen2 or gpt2); or package.module:function returning an nn.Module whose "
        "forward returns a loss, or (module, loss_fn)")] = BUILTIN_MODEL
    model_size: Annotated[str, Option(
        TRAINING, "size of the built-in tiny-gpt: ~1M, 10M, 25M or 125M parameters",
        choices=MODEL_SIZE_CHOICES)] = "1m"
    data: Annotated[str, Option(
        TRAINING, f"'{BUILTIN_DATA}' (built in) or package.module:function yielding this rank's batches",
    )] = BUILTIN_DATA
    steps: Annotated[int, Option(
        TRAINING, "optimizer steps to run; 0 = until stopped", ge=0, bound_note="0 runs until stopped")] = 100
    batch_size: Annotated[int, Option(TRAINING, "sequences per rank per step", ge=1)] = 8
    seq_len: Annotated[int, Option(
        TRAINING, "tokens per sequence, at most 1024 with tiny-gpt (an hf model: its positions)", ge=1)] = 128
    lr: Annotated[float, Option(TRAINING, "AdamW's learning rate", gt=0)] = 1e-3
    seed: Annotated[int, Option(TRAINING, "seed of the initial weights and of the synthetic data")] = 0
    device: Annotated[str, Option(
        TRAINING, "auto: CUDA with NCCL where present, else CPU with gloo", choices=("auto", "cpu", "cuda"))] = "auto"
    ddp_bucket_cap_mb: Annotated[float | None, Option(
        TRAINING, "with --strategy ddp: DDP's gradient bucket size in MB", gt=0, default_text="DDP's own, 25")] = None
    dist_timeout_s: Annotated[float, Option(
        TRAINING, "collective timeout before a hung rank fails the run", gt=0)] = 600.0
    on_nonfinite: Annotated[str, Option(
        TRAINING, "at a step whose global gradient norm is not finite: warn (report it, train on), skip-step "
        "(leave its optimizer step out: weights and optimizer state stay as they were), stop (skip it and end "
        "the run, exit status 3), checkpoint-and-stop (skip it, checkpoint the last good step, end the run). "
        "All but warn read the norm to the host every step (one device sync on a GPU); with ZeRO only warn "
        "and stop, which acts after the step", choices=NONFINITE_MODES)] = "warn"

    log_dir: Annotated[str | None, Option(
        TELEMETRY, "write LOGDIR/rank-R.jsonl, for `ringtop replay`", metavar="LOGDIR",
        default_text="no logs")] = None
    publish: Annotated[str, Option(TELEMETRY, "rank 0's telemetry address for UIs")] = DEFAULT_PUBLISH_ADDRESS
    relay: Annotated[str, Option(TELEMETRY, "rank 0's relay input, where ranks publish")] = DEFAULT_RELAY_ADDRESS
    control: Annotated[str, Option(TELEMETRY, "rank 0's control address")] = DEFAULT_CONTROL_ADDRESS
    allow_remote: Annotated[bool, Option(
        TELEMETRY, "allow binding to non-loopback addresses (clients need the run's connection file)")] = False
    insecure: Annotated[bool, Option(
        TELEMETRY, "no authentication: anyone who can reach the ports reads and commands the run (a trusted lab "
        "only; never on a shared node)")] = False
    """No CURVE: anyone who reaches the ports reads and commands the run (trusted labs only)."""
    metrics: Annotated[tuple[str, int] | None, Option(
        TELEMETRY, "rank 0 serves Prometheus metrics at http://HOST:PORT/metrics (read-only, no authentication: "
        "loopback unless --allow-remote on an authenticated run)", metavar="HOST:PORT", parse=_metrics_address,
        default_text="off")] = None
    telemetry: Annotated[bool, Option(
        TELEMETRY, "no sockets, files, tracing or sampling: a bare training loop (a baseline)",
        flag="--no-telemetry")] = True
    run_id: Annotated[str | None, Option(
        TELEMETRY, "this run's id: letters, digits, '.', '_' and '-', at most 64", default_text="random")] = None
    step_times_file: Annotated[str | None, Option(
        TELEMETRY, "rank 0 writes each step's end time (s) to FILE as JSON at exit, for benchmarks",
        flag="--step-times", metavar="FILE", default_text="none")] = None
    print_every: Annotated[int, Option(TELEMETRY, "rank 0 prints a line every N steps; 0 = never", metavar="N",
                                       ge=0)] = 0
    stall_factor: Annotated[float, Option(
        TELEMETRY, "a step counts as stalled past FACTOR x the median of recent steps + --stall-floor",
        metavar="FACTOR", ge=1)] = 2.0
    stall_floor_s: Annotated[float, Option(
        TELEMETRY, "seconds added to the stall threshold (noise on a busy node, a slow first steps)",
        flag="--stall-floor", metavar="S", gt=0)] = 4.0
    link_gbps: Annotated[float, Option(
        TELEMETRY, "the link's peak for the diagnosis: nvlink3|nvlink4|pcie4|pcie5|ib-hdr|ib-ndr or GB/s per "
        "direction", flag="--link", metavar="LINK", parse=_link_peak_gbps, default_text="unknown")] = 0.0
    link_tp_gbps: Annotated[float, Option(
        TELEMETRY, "the link the tensor-parallel groups run on (a mesh's tp dimension: inside a node), as --link; "
        "the Comm tab holds their rows against it", flag="--link-tp", metavar="LINK", parse=_link_parser("--link-tp"),
        default_text="--link")] = 0.0
    link_dp_gbps: Annotated[float, Option(
        TELEMETRY, "the link the data-parallel groups of a mesh run on (across nodes), as --link",
        flag="--link-dp", metavar="LINK", parse=_link_parser("--link-dp"), default_text="--link")] = 0.0
    link_pp_gbps: Annotated[float, Option(
        TELEMETRY, "the link between a mesh's pipeline stages, as --link",
        flag="--link-pp", metavar="LINK", parse=_link_parser("--link-pp"), default_text="--link")] = 0.0
    peak_tflops: Annotated[float, Option(
        TELEMETRY, "the device's dense peak TFLOP/s MFU is measured against (a GPU the table does not know, a CPU)",
        metavar="TFLOPS", ge=0, bound_note="0 = from ringtop's table of known accelerators",
        default_text="the table's figure for the detected device and dtype; none: MFU n/a")] = 0.0

    inject_slow_rank: Annotated[tuple[int, float] | None, Option(
        FAULTS, "rank R computes MS longer every step", metavar="R:MS", parse=_slow_rank, default_text="none")] = None
    inject_comm_delay_ms: Annotated[float, Option(
        FAULTS, "every collective completes MS later, as over a slow link", flag="--inject-comm-delay", metavar="MS",
        ge=0)] = 0.0
    inject_save_delay_ms: Annotated[float, Option(
        FAULTS, "pause MS between writing a checkpoint and publishing it, to kill a rank mid-save",
        flag="--inject-save-delay", metavar="MS", ge=0)] = 0.0
    inject_node_relay_death: Annotated[int, Option(
        FAULTS, "on several nodes, every node relay dies after step STEP (it is started again in its place); "
        "0 = never", flag="--inject-node-relay-death", metavar="STEP", ge=0, bound_note="0 = never")] = 0
    inject_nan: Annotated[tuple[int, int] | None, Option(
        FAULTS, "rank R's loss is NaN at step STEP, before backward (a pipeline: rank R's stage output, so "
        "its replica's loss)", metavar="R:STEP", parse=_at_step("--inject-nan"), default_text="none")] = None
    inject_fail_setup: Annotated[str | None, Option(
        FAULTS, "a switch to STRATEGY fails while wrapping (as if out of memory), to show the rollback",
        metavar="STRATEGY", default_text="none")] = None
    inject_hang: Annotated[tuple[int, int, str] | None, Option(
        FAULTS, "rank R hangs at step STEP, in its model's forward or just before a collective (default forward)",
        metavar="R:STEP[:forward|before-collective]", parse=_hang, default_text="none")] = None
    inject_desync: Annotated[tuple[int, int] | None, Option(
        FAULTS, "at step STEP every rank broadcasts a buffer, rank R one element larger: a mismatched collective "
        "gloo does not notice", metavar="R:STEP", parse=_at_step("--inject-desync"), default_text="none")] = None

    checkpoint_dir: Annotated[str, Option(
        CHECKPOINTS, "where checkpoints are written; a `switch` command's ds_config must lie inside it",
    )] = "checkpoints"
    resume: Annotated[str | None, Option(
        CHECKPOINTS, "a checkpoint file, a checkpoint dir, or 'latest'", default_text="a fresh start")] = None
    checkpoint_every: Annotated[int, Option(
        CHECKPOINTS, "a checkpoint every K steps; 0 = never", metavar="K", ge=0, bound_note="0 = never")] = 0
    checkpoint_kind: Annotated[str, Option(
        CHECKPOINTS, "kind of the periodic checkpoints", choices=("full", "sharded"))] = "full"
    keep: Annotated[int, Option(
        CHECKPOINTS, "keep only the K newest checkpoints; 0 = all", metavar="K", ge=0,
        bound_note="0 = keep all")] = 0

    movable_endpoints: frozenset[str] = ENDPOINT_NAMES
    """Endpoints left at their default: a taken port moves to a free one (agent/ports.py)."""
    ds_config_from_command: bool = False
    """The config came with a `switch` command, not the launch: only keys that shape training."""

    @property
    def endpoints(self) -> Endpoints:
        """The addresses as the protocol passes them around."""
        return Endpoints(publish=self.publish, relay=self.relay, control=self.control)

    @property
    def link_peaks_by_group(self) -> dict[str, float]:
        """The links given per mesh dimension (--link-tp/-dp/-pp), keyed as CommStat.group."""
        peaks = {"tp": self.link_tp_gbps, "dp": self.link_dp_gbps, "pp": self.link_pp_gbps}
        return {group: gbps for group, gbps in peaks.items() if gbps > 0}

    @property
    def canonical_strategy(self) -> str:
        """The cost model's name for this strategy (`fsdp` + `grad-op` -> `fsdp-grad-op`)."""
        return canonical_strategy(self.strategy, self.fsdp_sharding)

    def strategy_options(self) -> dict[str, Any]:
        """Options for the strategy's constructor (a DeepSpeed config is loaded here, once)."""
        if self.strategy == "ddp":
            return {} if self.ddp_bucket_cap_mb is None else {"bucket_cap_mb": self.ddp_bucket_cap_mb}
        if self.strategy == "fsdp":
            return {"sharding": self.fsdp_sharding, **({"tp": self.tp} if self.tp is not None else {})}
        if self.strategy in ZERO_STRATEGIES and self.ds_config:
            if self.ds_config_from_command:
                return {"ds_config": load_command_ds_config(self.ds_config)}
            return {"ds_config": load_ds_config(self.ds_config)}
        if self.strategy == "tp":
            return {**({} if self.tp is None else {"degree": self.tp}),
                    **({"sequence_parallel": True} if self.tp_sequence_parallel else {})}
        if self.strategy == "pp":
            options: dict[str, Any] = {"schedule": self.pp_schedule, "micro_batches": self.micro_batches}
            if self.pp_stages is not None:
                options["stages"] = self.pp_stages
            if self.pp_split is not None:
                options["split"] = list(self.pp_split)
            if self.tp is not None and self.tp > 1:
                options["tp"] = self.tp
            return options
        return {}

    def strategy_facts(self) -> dict[str, Any]:
        """What the Hello says about the strategy's options (a config's path, not its contents)."""
        facts = {k: v for k, v in self.strategy_options().items() if k != "ds_config"}
        if self.strategy in ZERO_STRATEGIES:
            facts["stage"] = int(self.strategy[-1])
            if self.ds_config:
                facts["ds_config"] = self.ds_config
        return facts


def load_command_ds_config(path: str) -> dict[str, Any]:
    """A config named by a command: one message whether it is missing, unreadable or not JSON (a
    client learns nothing about files), then the allowlist."""
    try:
        cfg = load_ds_config(path)
    except DSConfigError:
        raise DSConfigError("ds_config: not a readable DeepSpeed JSON config inside the run's checkpoint "
                            "directory") from None
    check_command_ds_config(cfg)
    return cfg


@dataclass(frozen=True)
class CliField:
    """A field of AgentConfig that the command line sets, with its Option."""

    name: str
    option: Option
    value_type: type
    """int, float, str or bool (None taken off an optional field's type)."""
    default: Any

    @property
    def flag(self) -> str:
        return self.option.flag or "--" + self.name.replace("_", "-")

    @property
    def is_switch(self) -> bool:
        return self.value_type is bool

    def help_text(self) -> str:
        """The help, with the default for an option that takes a value (a switch's is: not given)."""
        text = self.option.help
        if not self.is_switch:
            default = self.option.default_text or self.default
            if default is None:
                raise TypeError(f"AgentConfig.{self.name}: a default of None needs Option(default_text=...)")
            text += f" (default: {default})"
        return text.replace("%", "%%")  # argparse formats help with %

    def add_to(self, group: argparse._ArgumentGroup) -> None:
        """Left out of the namespace unless given (SUPPRESS), so what was typed can be told from a default."""
        if self.is_switch:
            kind: dict[str, Any] = {"action": "store_false" if self.default else "store_true"}
        else:
            kind = {"type": str if self.option.parse else self.value_type, "choices": self.option.choices,
                    "metavar": self.option.metavar}
        group.add_argument(self.flag, dest=self.name, default=argparse.SUPPRESS, help=self.help_text(), **kind)

    def check_bounds(self, value: Any) -> None:
        o = self.option
        if value is None:
            return
        if o.ge is not None and not value >= o.ge:
            bound = f">= {o.ge:g}"
        elif o.gt is not None and not value > o.gt:
            bound = f"> {o.gt:g}"
        else:
            return
        raise ConfigError(f"{self.flag} must be {bound}" + (f" ({o.bound_note})" if o.bound_note else ""))


@functools.cache
def cli_fields() -> tuple[CliField, ...]:
    """AgentConfig's fields that carry an Option, in the struct's order."""
    out = []
    for info in msgspec.structs.fields(AgentConfig):
        if typing.get_origin(info.type) is not Annotated:
            continue
        value_type, *extras = typing.get_args(info.type)
        option = next((x for x in extras if isinstance(x, Option)), None)
        if option is None:
            continue
        if typing.get_origin(value_type) in (typing.Union, types.UnionType):
            value_type = next(t for t in typing.get_args(value_type) if t is not type(None))
        out.append(CliField(info.name, option, typing.get_origin(value_type) or value_type, info.default))
    return tuple(out)


def _flag(name: str) -> str:
    """The command-line flag of an AgentConfig field."""
    return next(f.flag for f in cli_fields() if f.name == name)


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    """One argument per field with an Option, in groups as the fields come."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for field in cli_fields():
        if field.option.group not in groups:
            groups[field.option.group] = parser.add_argument_group(field.option.group)
        field.add_to(groups[field.option.group])


def config_from_options(given: dict[str, Any]) -> AgentConfig:
    """The config of the options given (field name -> value as argparse read it) over the fields'
    defaults. Every check is here; every message says what to do instead."""
    fields = {f.name: f for f in cli_fields()}
    values = {name: fields[name].option.parse(v) if fields[name].option.parse else v for name, v in given.items()}
    cfg = AgentConfig(**values, movable_endpoints=ENDPOINT_NAMES - given.keys())
    for field in cli_fields():
        field.check_bounds(getattr(cfg, field.name))
    _check_combinations(cfg, given.keys())
    return _adopt_ds_config(cfg, given.keys())


def _check_hf_model(spec: str, seq_len: int) -> None:
    """ringtop's checks of the spec (stdlib), then transformers' of the config it becomes (imports
    torch and transformers: only for an hf model)."""
    try:
        model = resolve_hf(spec)
        check_seq_len(model, seq_len)
        from .hf_models import hf_config

        hf_config(model)
    except ModelConfigError as exc:
        raise ConfigError(str(exc)) from None
    except ImportError as exc:
        raise ConfigError(f"--model {spec}: {exc}") from None


def _check_combinations(cfg: AgentConfig, given: Set[str]) -> None:
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
        clashing = sorted(given & {"log_dir", "print_every", "metrics", *ENDPOINT_NAMES})
        if clashing:
            names = ", ".join(_flag(n) for n in clashing)
            raise ConfigError(f"--no-telemetry turns off all telemetry and control; drop {names} "
                              "or drop --no-telemetry")
    if cfg.strategy not in STRATEGY_CHOICES:
        raise ConfigError(f"unknown strategy {cfg.strategy!r}; choose from {', '.join(STRATEGY_CHOICES)}")
    if "fsdp_sharding" in given and cfg.strategy != "fsdp":
        raise ConfigError("--fsdp-sharding applies to --strategy fsdp only")
    pp_given = [n for n in PIPELINE_OPTIONS if n in given]
    if pp_given and cfg.strategy != "pp":
        raise ConfigError(f"{_flag(pp_given[0])} applies to --strategy pp only")
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


def _adopt_ds_config(cfg: AgentConfig, given: Set[str]) -> AgentConfig:
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


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse calls this for unknown options and bad values
        raise ConfigError(f"{message} (see --help)")


def agent_parser(prog: str = "python -m ringtop.agent") -> argparse.ArgumentParser:
    parser = _RaisingParser(prog=prog, description="ringtop's per-rank training agent (run it under torchrun)")
    add_agent_arguments(parser)
    return parser


def parse_agent_args(argv: list[str]) -> AgentConfig:
    return config_from_options(vars(agent_parser().parse_args(argv)))
