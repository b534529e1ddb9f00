"""Every option of a run, each written once: a field of AgentConfig whose annotation carries an
`Option` saying how the command line gives it (options.py), in the order `--help` lists them."""

from __future__ import annotations

import functools
from typing import Annotated, Any

import msgspec

from ringtop.agent.config import values
from ringtop.agent.config.options import CliField, Option, fields_of
from ringtop.agent.health.nonfinite import MODES as NONFINITE_MODES
from ringtop.metrics.rules import liveness
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
    Endpoints,
)
from ringtop.strategies.ds_config import DSConfigError, check_command_ds_config, load_ds_config

BUILTIN_MODEL = "tiny-gpt"
BUILTIN_DATA = "synthetic"
MODEL_SIZE_CHOICES = ("1m", "10m", "25m", "125m")
MODEL_SIZE_HEADS = {"1m": 4, "10m": 5, "25m": 7, "125m": 12}
"""Attention heads of each built-in size (agent/models/model.py's MODEL_SIZES, without importing torch)."""
PIPELINE_OPTIONS = ("pp_stages", "pp_schedule", "micro_batches", "pp_split")
ENDPOINT_NAMES = frozenset({"publish", "relay", "control"})


TRAINING = "training"
TELEMETRY = "telemetry and control"
FAULTS = "fault injection (tests and demos)"
CHECKPOINTS = "checkpoints"


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
        TRAINING, "with --strategy pp: layers per stage, e.g. 3,1", parse=values.layers_per_stage,
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
    no_watcher: Annotated[bool, Option(
        TELEMETRY, "keep the head relay inside rank 0's process instead of a watcher process beside the ranks "
        "(then a UI goes blind when rank 0 dies, and nobody outside the ranks names how each ended)")] = False
    metrics: Annotated[tuple[str, int] | None, Option(
        TELEMETRY, "rank 0 serves Prometheus metrics at http://HOST:PORT/metrics (read-only, no authentication: "
        "loopback unless --allow-remote on an authenticated run)", metavar="HOST:PORT", parse=values.metrics_address,
        default_text="off")] = None
    alert_webhook: Annotated[str, Option(
        TELEMETRY, "rank 0 POSTs one JSON body (Slack-compatible `text`, every field under `ringtop`) when an "
        "incident opens (hang, death, desync, non-finite, loss spike, long stall, goodput under its floor) and "
        "one when it resolves", metavar="URL", default_text="none")] = ""
    alert_command: Annotated[str, Option(
        TELEMETRY, "rank 0 runs CMD for each such alert, the alert's JSON on its stdin and in RINGTOP_ALERT",
        metavar="CMD", default_text="none")] = ""
    alert_goodput: Annotated[float, Option(
        TELEMETRY, "alert when goodput falls under PCT % (after the run's first minute); 0 = never", metavar="PCT",
        ge=0, bound_note="0 = never")] = 0.0
    capture_on: Annotated[tuple[str, ...], Option(
        TELEMETRY, "when a loss spike, a straggler or a long stall is raised, profile the next --capture-steps "
        "steps of the suspect ranks and one healthy rank (traces in LOGDIR/profile/, in `ringtop trace`)",
        metavar="spike,straggler,stall", parse=values.capture_triggers, default_text="never")] = ()
    capture_every_min: Annotated[float, Option(
        TELEMETRY, "at most one capture every MIN minutes", flag="--capture-every", metavar="MIN", ge=0)] = 10.0
    capture_steps: Annotated[int, Option(TELEMETRY, "steps each capture profiles", metavar="N", ge=1)] = 3
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
        metavar="FACTOR", ge=1)] = liveness.STALL_FACTOR
    stall_floor_s: Annotated[float, Option(
        TELEMETRY, "seconds added to the stall threshold (noise on a busy node, a slow first steps)",
        flag="--stall-floor", metavar="S", gt=0)] = liveness.STALL_FLOOR_S
    link_gbps: Annotated[float, Option(
        TELEMETRY, "the link's peak for the diagnosis: nvlink3|nvlink4|pcie4|pcie5|ib-hdr|ib-ndr or GB/s per "
        "direction", flag="--link", metavar="LINK", parse=values.link_peak_gbps, default_text="unknown")] = 0.0
    link_tp_gbps: Annotated[float, Option(
        TELEMETRY, "the link the tensor-parallel groups run on (a mesh's tp dimension: inside a node), as --link; "
        "the Comm tab holds their rows against it", flag="--link-tp", metavar="LINK",
        parse=values.link_parser("--link-tp"), default_text="--link")] = 0.0
    link_dp_gbps: Annotated[float, Option(
        TELEMETRY, "the link the data-parallel groups of a mesh run on (across nodes), as --link",
        flag="--link-dp", metavar="LINK", parse=values.link_parser("--link-dp"), default_text="--link")] = 0.0
    link_pp_gbps: Annotated[float, Option(
        TELEMETRY, "the link between a mesh's pipeline stages, as --link",
        flag="--link-pp", metavar="LINK", parse=values.link_parser("--link-pp"), default_text="--link")] = 0.0
    peak_tflops: Annotated[float, Option(
        TELEMETRY, "the device's dense peak TFLOP/s MFU is measured against (a GPU the table does not know, a CPU)",
        metavar="TFLOPS", ge=0, bound_note="0 = from ringtop's table of known accelerators",
        default_text="the table's figure for the detected device and dtype; none: MFU n/a")] = 0.0

    inject_slow_rank: Annotated[tuple[int, float] | None, Option(
        FAULTS, "rank R computes MS longer every step", metavar="R:MS", parse=values.slow_rank,
        default_text="none")] = None
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
        "its replica's loss)", metavar="R:STEP", parse=values.at_step("--inject-nan"), default_text="none")] = None
    inject_fail_setup: Annotated[str | None, Option(
        FAULTS, "a switch to STRATEGY fails while wrapping (as if out of memory), to show the rollback",
        metavar="STRATEGY", default_text="none")] = None
    inject_hang: Annotated[tuple[int, int, str] | None, Option(
        FAULTS, "rank R hangs at step STEP, in its model's forward, just before a collective, or in its forward "
        "inside native code that holds the GIL (default forward)",
        metavar="R:STEP[:forward|before-collective|gil-held]", parse=values.hang, default_text="none")] = None
    inject_crash: Annotated[tuple[int, int] | None, Option(
        FAULTS, "rank R raises an error at step STEP, in the run's first attempt only (so that a restart under "
        "--max-restarts goes on)", metavar="R:STEP", parse=values.at_step("--inject-crash"),
        default_text="none")] = None
    inject_desync: Annotated[tuple[int, int] | None, Option(
        FAULTS, "at step STEP every rank broadcasts a buffer, rank R one element larger: a mismatched collective "
        "gloo does not notice", metavar="R:STEP", parse=values.at_step("--inject-desync"), default_text="none")] = None

    checkpoint_dir: Annotated[str, Option(
        CHECKPOINTS, "where checkpoints are written; a `switch` command's ds_config must lie inside it",
    )] = "checkpoints"
    resume: Annotated[str | None, Option(
        CHECKPOINTS, "a checkpoint file, a checkpoint dir, 'latest', or 'auto' (latest if there is one, else a fresh "
        "start: for restarts)", default_text="a fresh start")] = None
    checkpoint_every: Annotated[int, Option(
        CHECKPOINTS, "a checkpoint every K steps; 0 = never", metavar="K", ge=0, bound_note="0 = never")] = 0
    checkpoint_kind: Annotated[str, Option(
        CHECKPOINTS, "kind of the periodic checkpoints", choices=("full", "sharded"))] = "full"
    keep: Annotated[int, Option(
        CHECKPOINTS, "keep only the K newest checkpoints; 0 = all", metavar="K", ge=0,
        bound_note="0 = keep all")] = 0
    stop_on_save_failure: Annotated[bool, Option(
        CHECKPOINTS, "a checkpoint that fails (on any rank) stops the run instead of being reported while "
        "training goes on")] = False
    group_readable: Annotated[bool, Option(
        CHECKPOINTS, "logs and checkpoints readable by the owner's group (files 0640, folders 0750) for teams "
        "that share runs; by default they are the owner's alone (0600, 0700)")] = False

    movable_endpoints: frozenset[str] = ENDPOINT_NAMES
    """Endpoints left at their default: a taken port moves to a free one (agent/transport/ports.py)."""
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


@functools.cache
def cli_fields() -> tuple[CliField, ...]:
    """AgentConfig's fields that carry an Option, in the struct's order."""
    return fields_of(AgentConfig)


def flag_of(name: str) -> str:
    """The command-line flag of an AgentConfig field."""
    return next(f.flag for f in cli_fields() if f.name == name)
