"""The agent's options: parsed from the command line once, validated once, then a frozen struct."""

from __future__ import annotations

import argparse
import re
from typing import Any

import msgspec

from ringtop.metrics.strategy_names import FSDP_SHARDINGS, STRATEGY_CHOICES, ZERO_STRATEGIES, canonical_strategy
from ringtop.protocol import EndpointError, Endpoints, check_bind_safe, parse_tcp
from ringtop.strategies.ds_config import (
    DSConfigError,
    Owned,
    check_command_ds_config,
    load_ds_config,
    merge_ds_config,
)
from ringtop.strategies.links import parse_link

BUILTIN_MODEL = "tiny-gpt"
BUILTIN_DATA = "synthetic"
MODEL_SIZE_CHOICES = ("1m", "10m", "25m", "125m")


RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
"""A run id names files (its connection file): nothing that could leave a directory."""


class ConfigError(ValueError):
    pass


class AgentConfig(msgspec.Struct, frozen=True, kw_only=True):
    strategy: str = "ddp"
    model: str = BUILTIN_MODEL
    model_size: str = "1m"
    data: str = BUILTIN_DATA
    steps: int = 100
    batch_size: int = 8
    seq_len: int = 128
    lr: float = 1e-3
    seed: int = 0
    device: str = "auto"
    log_dir: str | None = None
    endpoints: Endpoints = Endpoints()
    movable_endpoints: frozenset[str] = frozenset({"publish", "relay", "control"})
    """Endpoints left at their default: a taken port moves to a free one (agent/ports.py)."""
    allow_remote: bool = False
    insecure: bool = False
    """No CURVE: anyone who reaches the ports reads and commands the run (trusted labs only)."""
    checkpoint_dir: str = "checkpoints"
    resume: str | None = None
    checkpoint_every: int = 0
    checkpoint_kind: str = "full"
    keep: int = 0
    inject_save_delay_ms: float = 0.0
    telemetry: bool = True
    run_id: str | None = None
    print_every: int = 0
    ddp_bucket_cap_mb: float | None = None
    fsdp_sharding: str = "full"
    ds_config: str | None = None
    ds_config_from_command: bool = False
    """The config came with a `switch` command, not the launch: only keys that shape training."""
    dtype: str = "fp32"
    grad_clip: float = 0.0
    dist_timeout_s: float = 600.0
    inject_slow_rank: tuple[int, float] | None = None
    inject_comm_delay_ms: float = 0.0
    link_gbps: float = 0.0
    inject_fail_setup: str | None = None
    step_times_file: str | None = None
    pp_stages: int | None = None
    pp_schedule: str = "gpipe"
    micro_batches: int = 4
    pp_split: tuple[int, ...] | None = None

    @property
    def canonical_strategy(self) -> str:
        """The cost model's name for this strategy (`fsdp` + `grad-op` -> `fsdp-grad-op`)."""
        return canonical_strategy(self.strategy, self.fsdp_sharding)

    def strategy_options(self) -> dict[str, Any]:
        """Options for the strategy's constructor (a DeepSpeed config is loaded here, once)."""
        if self.strategy == "ddp":
            return {} if self.ddp_bucket_cap_mb is None else {"bucket_cap_mb": self.ddp_bucket_cap_mb}
        if self.strategy == "fsdp":
            return {"sharding": self.fsdp_sharding}
        if self.strategy in ZERO_STRATEGIES and self.ds_config:
            if self.ds_config_from_command:
                return {"ds_config": load_command_ds_config(self.ds_config)}
            return {"ds_config": load_ds_config(self.ds_config)}
        if self.strategy == "pp":
            options: dict[str, Any] = {"schedule": self.pp_schedule, "micro_batches": self.micro_batches}
            if self.pp_stages is not None:
                options["stages"] = self.pp_stages
            if self.pp_split is not None:
                options["split"] = list(self.pp_split)
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


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    d = AgentConfig()
    e = Endpoints()
    g = parser.add_argument_group("training")
    g.add_argument("--strategy", default=d.strategy,
                   help=f"parallel strategy: {', '.join(STRATEGY_CHOICES)} (default %(default)s)")
    g.add_argument("--fsdp-sharding", default=None, choices=FSDP_SHARDINGS,
                   help="with --strategy fsdp: full (FULL_SHARD), grad-op (SHARD_GRAD_OP), no-shard (NO_SHARD)")
    g.add_argument("--ds-config", default=None,
                   help="with --strategy zero1/2/3: a DeepSpeed JSON config; ringtop fills its \"auto\" values")
    g.add_argument("--pp-stages", type=int, default=None,
                   help="with --strategy pp: pipeline stages (default: one per rank; more ranks = replicas)")
    g.add_argument("--pp-schedule", default=None, choices=("gpipe", "1f1b"), help="with --strategy pp (default gpipe)")
    g.add_argument("--micro-batches", type=int, default=None, help="with --strategy pp: per step (default 4)")
    g.add_argument("--pp-split", default=None, help="with --strategy pp: layers per stage, e.g. 3,1 (default balanced)")
    g.add_argument("--dtype", default=None, choices=("fp32", "bf16"),
                   help="fp32, or bf16 mixed precision with fp32 master state (default fp32)")
    g.add_argument("--grad-clip", type=float, default=None,
                   help="clip gradients to this global norm, the same way in every strategy (default off)")
    g.add_argument("--model", default=d.model,
                   help="'tiny-gpt' (built in) or package.module:function returning an nn.Module "
                        "whose forward returns a loss, or (module, loss_fn)")
    g.add_argument("--model-size", default=None, choices=MODEL_SIZE_CHOICES,
                   help="size of the built-in tiny-gpt: ~1M, 10M, 25M or 125M parameters (default 1m)")
    g.add_argument("--data", default=d.data,
                   help="'synthetic' (built in) or package.module:function yielding this rank's batches")
    g.add_argument("--steps", type=int, default=d.steps, help="optimizer steps to run; 0 = until stopped")
    g.add_argument("--batch-size", type=int, default=d.batch_size, help="sequences per rank per step")
    g.add_argument("--seq-len", type=int, default=d.seq_len)
    g.add_argument("--lr", type=float, default=d.lr)
    g.add_argument("--seed", type=int, default=d.seed)
    g.add_argument("--device", default=d.device, choices=("auto", "cpu", "cuda"),
                   help="auto: CUDA with NCCL where present, else CPU with gloo")
    g.add_argument("--ddp-bucket-cap-mb", type=float, default=None, help="DDP gradient bucket size")
    g.add_argument("--dist-timeout-s", type=float, default=d.dist_timeout_s,
                   help="collective timeout before a hung rank fails the run (default %(default)s)")
    t = parser.add_argument_group("telemetry and control")
    t.add_argument("--log-dir", default=None, help="write LOGDIR/rank-R.jsonl (replay with `ringtop replay`)")
    t.add_argument("--publish", default=e.publish, help="rank 0's telemetry address for UIs (%(default)s)")
    t.add_argument("--relay", default=e.relay, help="rank 0's relay input, where ranks publish (%(default)s)")
    t.add_argument("--control", default=e.control, help="rank 0's control address (%(default)s)")
    t.add_argument("--allow-remote", action="store_true",
                   help="allow binding to non-loopback addresses (clients need the run's connection file)")
    t.add_argument("--insecure", action="store_true",
                   help="no authentication: anyone who can reach the ports reads and commands the run "
                        "(a trusted lab only; never on a shared node)")
    t.add_argument("--no-telemetry", action="store_true",
                   help="no sockets, files, tracing or sampling: a bare training loop (a baseline)")
    t.add_argument("--run-id", default=None, help="this run's id (default: random); letters, digits, "
                   "'.', '_' and '-', at most 64")
    t.add_argument("--step-times", default=None, metavar="FILE",
                   help="rank 0 writes each step's end time (s) to FILE as JSON at exit (benchmarks)")
    t.add_argument("--print-every", type=int, default=d.print_every, help="rank 0 prints a line every N steps")
    t.add_argument("--link", default=None,
                   help="the link's peak for the diagnosis: nvlink3|nvlink4|pcie4|pcie5|ib-hdr|ib-ndr"
                        " or GB/s per direction")
    f = parser.add_argument_group("fault injection (tests and demos)")
    f.add_argument("--inject-slow-rank", default=None, metavar="R:MS", help="rank R computes MS longer every step")
    f.add_argument("--inject-comm-delay", type=float, default=0.0, metavar="MS",
                   help="every collective completes MS later (a slow link)")
    f.add_argument("--inject-save-delay", type=float, default=0.0, metavar="MS",
                   help="pause MS between writing a checkpoint and publishing it (to kill a rank mid-save)")
    f.add_argument("--inject-fail-setup", default=None, metavar="STRATEGY",
                   help="a switch to STRATEGY fails while wrapping (as if out of memory), to show the rollback")
    c = parser.add_argument_group("checkpoints")
    c.add_argument("--checkpoint-dir", default=d.checkpoint_dir)
    c.add_argument("--resume", default=None, help="a checkpoint file, a checkpoint dir, or 'latest'")
    c.add_argument("--checkpoint-every", type=int, default=0, help="a checkpoint every K steps (0 = never)")
    c.add_argument("--checkpoint-kind", default="full", choices=("full", "sharded"),
                   help="kind of the periodic checkpoints (default %(default)s)")
    c.add_argument("--keep", type=int, default=0, help="keep only the K newest checkpoints (0 = all)")


def config_from_args(ns: argparse.Namespace, explicitly_set: set[str]) -> AgentConfig:
    """Check ranges and conflicts; every message says what to do instead."""
    if ns.steps < 0:
        raise ConfigError("--steps must be >= 0 (0 runs until stopped)")
    if ns.batch_size < 1:
        raise ConfigError("--batch-size must be >= 1")
    if ns.seq_len < 1:
        raise ConfigError("--seq-len must be >= 1")
    if not ns.lr > 0:
        raise ConfigError("--lr must be > 0")
    slow = None
    if ns.inject_slow_rank is not None:
        rank_text, sep, ms_text = ns.inject_slow_rank.partition(":")
        try:
            slow = (int(rank_text), float(ms_text))
        except ValueError:
            slow = None
        if not sep or slow is None or slow[0] < 0 or slow[1] < 0:
            raise ConfigError(f"--inject-slow-rank {ns.inject_slow_rank!r}: expected R:MS, e.g. 1:200")
    if ns.inject_comm_delay < 0:
        raise ConfigError("--inject-comm-delay must be >= 0")
    link_gbps = 0.0
    if ns.link is not None:
        try:
            link_gbps = parse_link(ns.link).per_direction_gbps
        except ValueError as exc:
            raise ConfigError(f"--link: {exc}") from None
    if ns.keep < 0:
        raise ConfigError("--keep must be >= 0 (0 = keep all)")
    if ns.checkpoint_every < 0:
        raise ConfigError("--checkpoint-every must be >= 0 (0 = never)")
    if ns.dist_timeout_s <= 0:
        raise ConfigError("--dist-timeout-s must be > 0")
    if ns.print_every < 0:
        raise ConfigError("--print-every must be >= 0")
    if ns.model != BUILTIN_MODEL and ns.model_size is not None:
        raise ConfigError("--model-size sizes the built-in tiny-gpt; drop it when --model is your own factory")
    if ns.model != BUILTIN_MODEL and ":" not in ns.model:
        raise ConfigError(f"--model {ns.model!r}: use 'tiny-gpt' or package.module:function")
    if ns.data != BUILTIN_DATA and ":" not in ns.data:
        raise ConfigError(f"--data {ns.data!r}: use 'synthetic' or package.module:function")
    if ns.model == BUILTIN_MODEL and ns.seq_len > 1024:
        raise ConfigError("--seq-len above 1024 exceeds tiny-gpt's context; use --seq-len <= 1024")
    if ns.no_telemetry:
        clashing = sorted(explicitly_set & {"log_dir", "publish", "relay", "control", "print_every"})
        if clashing:
            names = ", ".join("--" + n.replace("_", "-") for n in clashing)
            raise ConfigError(f"--no-telemetry turns off all telemetry and control; drop {names} "
                              "or drop --no-telemetry")
    if ns.strategy not in STRATEGY_CHOICES:
        raise ConfigError(f"unknown strategy {ns.strategy!r}; choose from {', '.join(STRATEGY_CHOICES)}")
    if ns.fsdp_sharding is not None and ns.strategy != "fsdp":
        raise ConfigError("--fsdp-sharding applies to --strategy fsdp only")
    pp_given = [n for n in ("pp_stages", "pp_schedule", "micro_batches", "pp_split") if getattr(ns, n) is not None]
    if pp_given and ns.strategy != "pp":
        raise ConfigError(f"--{pp_given[0].replace('_', '-')} applies to --strategy pp only")
    pp_split = None
    if ns.pp_split is not None:
        try:
            pp_split = tuple(int(x) for x in ns.pp_split.split(","))
        except ValueError:
            raise ConfigError(f"--pp-split {ns.pp_split!r}: expected layer counts like 3,1") from None
    if ns.micro_batches is not None and (ns.micro_batches < 1 or ns.batch_size % ns.micro_batches):
        raise ConfigError(f"--micro-batches {ns.micro_batches} must be >= 1 and divide --batch-size {ns.batch_size}")
    if ns.pp_stages is not None and ns.pp_stages < 1:
        raise ConfigError("--pp-stages must be >= 1")
    if ns.ds_config is not None and ns.strategy not in ZERO_STRATEGIES:
        raise ConfigError("--ds-config applies to --strategy zero1, zero2 or zero3 only")
    if ns.grad_clip is not None and ns.grad_clip < 0:
        raise ConfigError("--grad-clip must be >= 0 (0 = off)")
    batch_size, grad_clip, dtype = ns.batch_size, ns.grad_clip or 0.0, ns.dtype or "fp32"
    if ns.ds_config is not None:
        explicit = frozenset(n for n in ("batch_size", "grad_clip", "dtype") if n in explicitly_set)
        try:
            _, adopted = merge_ds_config(load_ds_config(ns.ds_config), int(ns.strategy[-1]), None,
                                         Owned(batch_size, grad_clip, dtype, explicit))
        except DSConfigError as exc:
            raise ConfigError(str(exc)) from None
        batch_size, grad_clip, dtype = adopted.batch_size, adopted.grad_clip, adopted.dtype
        if batch_size < 1:
            raise ConfigError("--ds-config train_micro_batch_size_per_gpu must be >= 1")
    if ns.ddp_bucket_cap_mb is not None and ns.strategy != "ddp":
        raise ConfigError("--ddp-bucket-cap-mb applies to --strategy ddp only")
    if ns.ddp_bucket_cap_mb is not None and ns.ddp_bucket_cap_mb <= 0:
        raise ConfigError("--ddp-bucket-cap-mb must be > 0")
    if ns.run_id is not None and not RUN_ID_PATTERN.fullmatch(ns.run_id):
        raise ConfigError(f"--run-id {ns.run_id!r}: use letters, digits, '.', '_' and '-' (at most 64, "
                          "not starting with '.' or '-')")
    endpoints = Endpoints(publish=ns.publish, relay=ns.relay, control=ns.control)
    try:
        ports = set()
        for name in ("publish", "relay", "control"):
            address = getattr(endpoints, name)
            _, port = parse_tcp(address)
            if port in ports:
                raise ConfigError(f"--{name} {address}: the publish, relay and control ports must differ")
            ports.add(port)
            check_bind_safe(address, ns.allow_remote)
    except EndpointError as exc:
        raise ConfigError(str(exc)) from None
    return AgentConfig(
        strategy=ns.strategy,
        model=ns.model,
        model_size=ns.model_size or "1m",
        data=ns.data,
        steps=ns.steps,
        batch_size=batch_size,
        seq_len=ns.seq_len,
        lr=ns.lr,
        seed=ns.seed,
        device=ns.device,
        log_dir=ns.log_dir,
        endpoints=endpoints,
        movable_endpoints=frozenset({"publish", "relay", "control"} - explicitly_set),
        allow_remote=ns.allow_remote,
        insecure=ns.insecure,
        checkpoint_dir=ns.checkpoint_dir,
        resume=ns.resume,
        checkpoint_every=ns.checkpoint_every,
        checkpoint_kind=ns.checkpoint_kind,
        keep=ns.keep,
        inject_save_delay_ms=ns.inject_save_delay,
        telemetry=not ns.no_telemetry,
        run_id=ns.run_id,
        print_every=ns.print_every,
        ddp_bucket_cap_mb=ns.ddp_bucket_cap_mb,
        fsdp_sharding=ns.fsdp_sharding or "full",
        ds_config=ns.ds_config,
        dtype=dtype,
        grad_clip=grad_clip,
        dist_timeout_s=ns.dist_timeout_s,
        inject_slow_rank=slow,
        inject_comm_delay_ms=ns.inject_comm_delay,
        link_gbps=link_gbps,
        inject_fail_setup=ns.inject_fail_setup,
        step_times_file=ns.step_times,
        pp_stages=ns.pp_stages,
        pp_schedule=ns.pp_schedule or "gpipe",
        micro_batches=ns.micro_batches or 4,
        pp_split=pp_split,
    )


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse calls this for unknown options and bad values
        raise ConfigError(f"{message} (see --help)")


def agent_parser(prog: str = "python -m ringtop.agent") -> argparse.ArgumentParser:
    parser = _RaisingParser(prog=prog, description="ringtop's per-rank training agent (run it under torchrun)")
    add_agent_arguments(parser)
    return parser


def explicitly_set_options(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """Names of the options the user typed, to tell a default from a deliberate choice."""
    names = set()
    for action in parser._actions:
        if any(arg == opt or arg.startswith(opt + "=") for opt in action.option_strings for arg in argv):
            names.add(action.dest)
    return names


def parse_agent_args(argv: list[str]) -> AgentConfig:
    parser = agent_parser()
    ns = parser.parse_args(argv)
    return config_from_args(ns, explicitly_set_options(parser, argv))
