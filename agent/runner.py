"""The per-rank step loop: build, wrap, train, measure, publish, obey commands, say goodbye."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import signal
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import msgspec
import torch
import torch.distributed as dist

from ringtop.metrics.flops import achieved_tflops
from ringtop.metrics.fmt import nbytes
from ringtop.metrics.peaks import Peak, compute_dtype, resolve_peak
from ringtop.protocol import (
    Bye,
    Command,
    Endpoints,
    Event,
    Hello,
    MemorySample,
    Sharding,
    StageSpan,
    Step,
    Timeline,
    connection_file,
    curve,
)
from ringtop.protocol.downlink import Downlink, decode_downlink, encode_downlink
from ringtop.protocol.endpoints import is_loopback, parse_tcp
from ringtop.strategies import collective_hooks
from ringtop.strategies.base import DistContext, Strategy, TrainSettings, unique_parameters
from ringtop.strategies.diagnosis import RunContext
from ringtop.strategies.registry import build_strategy
from ringtop.strategies.torch_native import full_optimizer_template

from . import checkpoint_format as ckpt
from . import nonfinite
from .checkpoint_saver import CheckpointManager
from .config import (
    BUILTIN_DATA,
    BUILTIN_MODEL,
    AgentConfig,
    ConfigError,
    check_switch_tensor_parallel,
    check_tensor_parallel_world,
)
from .control import ControlServer, PendingCommand, StepSync, all_gather_fixed, broadcast_bytes, scatter_fixed
from .data import synthetic_batches
from .diagnosis_exchange import Diagnostician
from .factories import BuildContext, batch_to, batch_tokens, call_model, user_data, user_model
from .faults import desynchronised_broadcast, hang_before_collectives, hang_in_forward, inner_module
from .flop_count import FlopsPerToken, counted_flops_per_token, meta_copy, tiny_gpt_flops_per_token
from .gatekeeper import Gatekeeper, node_user
from .hang_watch import HangWatch
from .hf_catalogue import is_hf_spec
from .hf_catalogue import resolve as resolve_hf
from .hf_models import HFCausalLM, build_hf_model
from .instruments.comm_tracer import CommSummary, CommTracer
from .instruments.sampler import SystemSampler, device_name
from .instruments.step_clock import StepClock, StepTiming, apply_device_phases, device_phases_ready
from .model import MODEL_SIZES, TinyGPT, build_tiny_gpt, count_params
from .node_relay import NodeLayout, NodeRelay
from .peers import Peers
from .prediction import predict, predict_pipeline_stage, predict_pipeline_tensor_parallel, predict_tensor_parallel
from .prewarm import Prewarm
from .profiling import ProfileSession, gather_results
from .relay import Relay
from .run_paths import inside_run_directory
from .stacks import StackRequests
from .stall_watch import StallWatch, StoppedWhileStuck, WatchSettings
from .switching import SwitchAborted, SwitchError, switch_strategy
from .telemetry import Telemetry

RINGTOP_VERSION = "0.1.0"
HELD_BYTES_EVERY = 20
PREWARM_ENV = "RINGTOP_PREWARM"
"""`0`: no background warm-up for switching (a run that will not switch, on a machine short of cores)."""
TIMELINE_EVERY = 5
"""A pipeline stage publishes its timeline for every 5th step (and the first after a change)."""


class Interrupted(Exception):
    """SIGTERM from torchrun or the user: leave the loop cleanly and say why."""


@dataclass
class _PendingStep:
    step: int
    loss: torch.Tensor
    timing: StepTiming
    marks: Any
    comm: CommSummary
    tokens: int
    grad_norm: Any = None
    """The strategy's norm of this step (a tensor read when the step is published)."""
    bubble: Any = None
    """A pipeline stage's StageBubble of this step."""
    timeline: list | None = None
    timeline_start_ms: float = 0.0
    skipped: bool = False
    """The optimizer step was left out (--on-nonfinite, a norm not finite)."""


class RankSetup(msgspec.Struct, frozen=True):
    """What rank 0 tells every rank before they connect ("" server key: --insecure)."""

    endpoints: Endpoints
    server_public: str
    rank_public: list[str] = []
    """Every rank's public key, on several nodes: what each node relay admits."""


KEY_PAIR_BYTES = 80
"""A rank's public and secret key, 40 Z85 characters each."""
NODE_RELAY_BYTES = 256
"""A node relay's address and public key, as its leader tells every rank."""


class _NoPhases:
    def mark(self, phase: str) -> None:
        pass


NEXT_PHASE = {"data": "forward", "forward": "backward", "backward": "optimizer", "optimizer": "after-step"}


class _WatchedPhases:
    """The step clock's marks, also telling the stall watch which phase runs now (one attribute
    write: the watch reads it from its own thread)."""

    def __init__(self, clock: Any, watch: StallWatch) -> None:
        self._clock, self._watch = clock, watch

    def mark(self, phase: str) -> None:
        self._clock.mark(phase)
        self._watch.phase(NEXT_PHASE.get(phase, phase))


EXIT_STOPPED_WHILE_STUCK = 3
"""A rank the stall watch ended because its training thread could not (a stop while stuck)."""


class Runner:
    def __init__(self, cfg: AgentConfig, ctx: DistContext):
        self.cfg = cfg
        self.ctx = ctx
        self.launch_ds_config = cfg.ds_config
        """The --ds-config of the launch: trusted in full, also when a switch names it again."""
        self.step = 0
        self.start_step = 0
        self.stop_reason: str | None = None
        self.last_loss = float("nan")
        self._loss_was_finite = True
        self.last_step_ms = 0.0
        self.last_checkpoint: str | None = None
        self.telemetry: Telemetry | None = None
        self.relay: Relay | None = None
        self.exporter = None
        """Rank 0's Prometheus endpoint (--metrics), fed by a relay observer."""
        self.control: ControlServer | None = None
        self.gate: Gatekeeper | None = None
        self.endpoints: Endpoints = cfg.endpoints
        """The addresses rank 0 actually bound (a taken default port moves to a free one)."""
        self.client_keys: curve.ClientKeys | None = None
        self._connection_path: Path | None = None
        self.sampler: SystemSampler | None = None
        self.tracer: CommTracer | None = None
        self.diagnostician: Diagnostician | None = None
        self.profiling: ProfileSession | None = None
        self.sync: StepSync | None = None
        self.prewarm: Prewarm | None = None
        self.watch: StallWatch | None = None
        self.hang_watch: HangWatch | None = None
        self.stack_requests: StackRequests | None = None
        self._ending = threading.Lock()
        """Held by whoever ends the process: the training thread's shutdown or the watch's escape."""
        self.control_group = dist.new_group(backend="gloo") if ctx.world_size > 1 else None
        self.io_group = dist.new_group(backend="gloo") if ctx.world_size > 1 else None
        self.naming = nonfinite.AsyncNaming(ctx.world_size) if cfg.on_nonfinite == "warn" and cfg.telemetry else None
        """--on-nonfinite warn names the ranks of a non-finite loss off the step path (agent/nonfinite.py)."""
        self.stopped_nonfinite = False
        """--on-nonfinite stop / checkpoint-and-stop ended the run: a Bye with ok=False, exit status 3."""
        self.peers = Peers.gather(ctx.rank, ctx.world_size, self.control_group)
        self.layout = NodeLayout.from_hosts(self.peers.hosts)
        """Which ranks share a node: on several, each node's ranks publish to a node relay."""
        self.node_relay: NodeRelay | None = None
        self._check_head_reachable()
        self.checkpoints = CheckpointManager(cfg.checkpoint_dir, ctx.rank, self.control_group, self.io_group,
                                             keep=cfg.keep, delay_s=cfg.inject_save_delay_ms / 1e3)
        self._checkpoint_command = None
        self.samples_seen = 0
        """Samples of the global stream consumed so far: the data position checkpoints carry."""
        self._timeline_due = True
        self._check_fault_ranks()
        check_tensor_parallel_world(cfg, ctx.world_size)
        self.run_id = self._agree_on_run_id()
        self.strategy: Strategy = build_strategy(cfg.strategy, cfg.strategy_options(), ctx.device)
        self._pending: list[_PendingStep] = []
        self._data = None
        self.flops = FlopsPerToken(0.0, "not counted: no telemetry")
        """Model FLOPs per training token, found once at start: each Step's TFLOP/s is one multiply."""
        self.peak = Peak(0.0, "")
        self.accelerator = ""

    # ------------------------------------------------------------------ set-up

    def _check_fault_ranks(self) -> None:
        """An injected fault aimed at a rank this run does not have would silently do nothing."""
        cfg = self.cfg
        for flag, fault in (("--inject-hang", cfg.inject_hang), ("--inject-desync", cfg.inject_desync),
                            ("--inject-nan", cfg.inject_nan), ("--inject-slow-rank", cfg.inject_slow_rank)):
            if fault is not None and fault[0] >= self.ctx.world_size:
                raise ConfigError(f"{flag}: rank {fault[0]} is not in this run of {self.ctx.world_size} "
                                  f"rank{'s' if self.ctx.world_size > 1 else ''}")

    def _check_head_reachable(self) -> None:
        """On several nodes the other nodes' relays must reach rank 0's: same check on every rank
        (same arguments), before any of them waits for another."""
        if not (self.layout.multi and self.cfg.telemetry):
            return
        host, _ = parse_tcp(self.cfg.relay)
        if is_loopback(host) or host in ("0.0.0.0", "::", "*"):
            raise ConfigError(f"this run spans {len(self.layout.nodes)} nodes: the other nodes' relays must reach "
                              f"rank 0's relay, which --relay {self.cfg.relay} does not. Pass --relay "
                              "tcp://ADDRESS:PORT with rank 0's node's address on the network between the nodes, "
                              "and --allow-remote")

    def _agree_on_run_id(self) -> str:
        run_id = self.cfg.run_id or uuid.uuid4().hex[:8]
        if self.control_group is None:
            return run_id
        return broadcast_bytes(run_id.encode(), self.ctx.rank, self.control_group).decode()

    def _build_context(self) -> BuildContext:
        return BuildContext(
            rank=self.ctx.rank, world_size=self.ctx.world_size, batch_size=self.cfg.batch_size,
            seq_len=self.cfg.seq_len, seed=self.cfg.seed, start_step=self.start_step, device=self.ctx.device,
            samples_seen=self.samples_seen,
        )

    def _build_model(self) -> torch.nn.Module:
        if self.cfg.model == BUILTIN_MODEL:
            model = build_tiny_gpt(self.cfg.model_size, self.cfg.seed)
        elif is_hf_spec(self.cfg.model):
            # On a GPU, built there; never when a caller builds under a device of its own (a switch's meta)
            on_gpu = self.ctx.device.type == "cuda" and torch.empty(0).device.type == "cpu"
            model = build_hf_model(resolve_hf(self.cfg.model), self.cfg.seed, self.ctx.device if on_gpu else None)
        else:
            torch.manual_seed(self.cfg.seed)
            model = user_model(self.cfg.model, self._build_context())
        hang = self.cfg.inject_hang
        if hang is not None and hang[0] == self.ctx.rank and hang[2] == "forward":
            hang_in_forward(inner_module(model), lambda: self.step + 1 == hang[1])
        return model

    def _flops_before_setup(self, model: torch.nn.Module) -> torch.nn.Module | None:
        """The built-in model's FLOPs per token by the formula; for another module, its meta copy to
        count once a batch is at hand. Before the strategy wraps it: a shard's parameter count or a
        wrapper's hooks (an FSDP all-gather) would be wrong to count or to run."""
        if isinstance(model, TinyGPT):
            self.flops = tiny_gpt_flops_per_token(model, self.cfg.seq_len)
            return None
        if isinstance(model, HFCausalLM):
            self.flops = FlopsPerToken(model.flops_per_token(self.cfg.seq_len), "formula 6N+12LHS")
            return None
        try:
            return meta_copy(model)
        except Exception as exc:  # a module deepcopy cannot copy
            self.flops = FlopsPerToken(0.0, f"not counted: no meta copy ({type(exc).__name__}: {exc})"[:200])
            return None

    def _count_flops(self, meta_model: torch.nn.Module) -> None:
        """Counts the meta copy on the first batch, which stays the first the loop trains on."""
        first = next(self._data, None)
        if first is None:
            self.flops = FlopsPerToken(0.0, "not counted: the data gave no batch")
            return
        self._data = itertools.chain([first], self._data)
        self.flops = counted_flops_per_token(meta_model, first)

    def _find_peak(self) -> None:
        """The accelerator's name (NVML, read once) and the dense peak MFU is measured against."""
        if self.ctx.device.type == "cuda":
            self.accelerator = device_name(self.ctx.device.index or 0)
        tf32 = self.ctx.device.type == "cuda" and torch.get_float32_matmul_precision() != "highest"
        self.peak = resolve_peak(self.accelerator, compute_dtype(self.cfg.dtype, tf32), self.cfg.peak_tflops)

    def _build_data(self):
        if self.cfg.data == BUILTIN_DATA:
            if self.cfg.model == BUILTIN_MODEL:
                vocab = MODEL_SIZES[self.cfg.model_size].vocab_size
            elif is_hf_spec(self.cfg.model):
                vocab = resolve_hf(self.cfg.model).dims.vocab
            else:
                vocab = 1024
            shard, shards = self.strategy.data_shard(self.ctx)
            return synthetic_batches(shard, shards, self.cfg.batch_size, self.cfg.seq_len, vocab, self.cfg.seed,
                                     self.samples_seen)
        return user_data(self.cfg.data, self._build_context())

    def _start_telemetry(self) -> None:
        cfg = self.cfg
        keys = None
        if self.ctx.rank == 0:
            keys = None if cfg.insecure else curve.generate(self.ctx.world_size, len(self.layout.nodes) - 1)
            if keys is not None:
                self.gate = Gatekeeper(keys, on_refusal=self._refused)
            self.hang_watch = HangWatch(self.ctx.world_size, self._event_from_relay)
            self.stack_requests = StackRequests(self.ctx.world_size)
            observers = [self.hang_watch.observe, self.stack_requests.observe]
            if cfg.metrics is not None:
                from .exporter import MetricsExporter  # prometheus_client: only with --metrics

                self.exporter = MetricsExporter(*cfg.metrics)
                observers.append(self.exporter.observe)
            self.relay = Relay(cfg.endpoints.relay, cfg.endpoints.publish, run_id=self.run_id,
                               world_size=self.ctx.world_size, gate=self.gate, movable=cfg.movable_endpoints,
                               observers=observers, carriers=self.layout.carriers(node_user))
            self.control = ControlServer(cfg.endpoints.control, self.snapshot, self._publish_reply, gate=self.gate,
                                         movable="control" in cfg.movable_endpoints,
                                         restate_operations=self._restate_operations,
                                         immediate={"stacks": self._command_stacks, "dump": self._command_dump},
                                         on_stop=self._stop_commanded)
            self.endpoints = Endpoints(publish=self.relay.publish_address, relay=self.relay.relay_address,
                                       control=self.control.address)
            self.client_keys = keys.client if keys is not None else None
        self.endpoints, rank_keys, rank_public = self._share_setup(keys)
        relay_address = self.endpoints.relay
        if self.layout.multi:
            relay_address, rank_keys = self._join_node_relay(keys, rank_keys, rank_public)
        self.telemetry = Telemetry(self.ctx.rank, relay_address, cfg.log_dir, keys=rank_keys)
        if self.node_relay is not None:
            self.node_relay.on_event = self._node_relay_event
        if self.ctx.rank == 0:
            if self.gate is not None:
                self.gate.start()
            self.relay.start()
            self.control.start()
            if self.exporter is not None:
                self.exporter.start()
            if cfg.insecure:
                self._warn_insecure()
            self._write_connection_file()
        self.sync = StepSync(self.ctx.rank, self.control, self.control_group)
        gpu_index = self.ctx.device.index if self.ctx.device.type == "cuda" else None
        self.sampler = SystemSampler(self.telemetry.emit, gpu_index=gpu_index)
        self.tracer = CommTracer(dimension_of=collective_hooks.dimension_of)
        self.watch = StallWatch(self.tracer, self.telemetry.emit, self.peers,
                                WatchSettings(factor=cfg.stall_factor, floor_s=cfg.stall_floor_s),
                                training_thread=threading.get_ident(), escape=self._escape)
        self.telemetry.on_downlink = self._downlink
        capacity = (torch.cuda.get_device_properties(self.ctx.device).total_memory
                    if self.ctx.device.type == "cuda" else 0)
        canonical = self.cfg.canonical_strategy
        run = RunContext(strategy=canonical, world_size=self.ctx.world_size, param_count=self.param_count,
                         device_capacity_bytes=capacity, link_peak_gbps=self.cfg.link_gbps)
        self.diagnostician = Diagnostician(self.ctx.rank, self.ctx.world_size, self.control_group, run, self._event)

    def _share_setup(self, keys: curve.RunKeys | None) -> tuple[Endpoints, curve.ClientKeys | None, list[str]]:
        """Rank 0's actual addresses (a taken default port moved) on every rank, and each rank's
        own key pair to publish with (scattered: a rank learns only its own secret), before any
        rank connects. On several nodes also every rank's public key (for the node relays)."""
        mine = keys.for_rank(0) if keys is not None else None
        if self.control_group is None:
            return self.endpoints, mine, []
        setup = RankSetup(endpoints=self.endpoints, server_public=keys.server_public if keys else "",
                          rank_public=list(keys.rank_public) if keys is not None and self.layout.multi else [])
        payload = msgspec.msgpack.encode(setup) if self.ctx.rank == 0 else b""
        setup = msgspec.msgpack.decode(broadcast_bytes(payload, self.ctx.rank, self.control_group), type=RankSetup)
        if not setup.server_public:
            return setup.endpoints, None, []
        pairs = [(keys.rank_public[r] + keys.rank_secret[r]).encode() for r in range(self.ctx.world_size)] \
            if self.ctx.rank == 0 else []
        pair = scatter_fixed(pairs, KEY_PAIR_BYTES, self.ctx.rank, self.control_group)
        return setup.endpoints, curve.ClientKeys(server_public=setup.server_public, client_public=pair[:40].decode(),
                                                 client_secret=pair[40:].decode()), setup.rank_public

    def _join_node_relay(self, keys: curve.RunKeys | None, rank_keys: curve.ClientKeys | None,
                         rank_public: list[str]) -> tuple[str, curve.ClientKeys | None]:
        """On several nodes: each node's first rank starts its node relay (with the node key rank 0
        scatters it) and tells every rank where it is; a rank off the head's node then publishes
        there, over loopback, instead of to rank 0's relay. (address, keys) to publish with."""
        rank, layout = self.ctx.rank, self.layout
        node = layout.node_of(rank)
        node_keys = None
        if rank_keys is not None:
            pairs = [b"\0" * KEY_PAIR_BYTES] * self.ctx.world_size
            if rank == 0:
                for k, ranks in enumerate(layout.nodes[1:]):
                    pairs[ranks[0]] = (keys.node_public[k] + keys.node_secret[k]).encode()
            pair = scatter_fixed(pairs if rank == 0 else [], KEY_PAIR_BYTES, rank, self.control_group)
            if layout.leads(rank):
                node_keys = curve.ClientKeys(server_public=rank_keys.server_public, client_public=pair[:40].decode(),
                                             client_secret=pair[40:].decode())
        told = b""
        if layout.leads(rank):
            ranks = layout.nodes[node]
            self.node_relay = NodeRelay(self.endpoints.relay, node_keys, ranks,
                                        {r: rank_public[r] for r in ranks} if rank_keys is not None else None,
                                        run_id=self.run_id, world_size=self.ctx.world_size)
            self.node_relay.start()
            told = f"{self.node_relay.address} {self.node_relay.server_public}".encode()
        everyone = all_gather_fixed(told, NODE_RELAY_BYTES, self.ctx.world_size, self.control_group)
        if node == 0:
            return self.endpoints.relay, rank_keys
        address, _, server_public = everyone[layout.nodes[node][0]].decode().partition(" ")
        if rank_keys is None:
            return address, None
        return address, curve.ClientKeys(server_public=server_public, client_public=rank_keys.client_public,
                                         client_secret=rank_keys.client_secret)

    def _keep_node_relay(self) -> None:
        """Once a step, on a node relay's rank: one that ended while the run goes on is started
        again in its place (its ranks reconnect by themselves). Binding a socket: microseconds."""
        relay = self.node_relay
        if relay.is_alive() or relay.stopping:
            return
        successor = relay.successor()
        if successor is None:
            return  # its port is not free yet: at the next step
        relay.stop(0)  # its gatekeeper: the thread has ended
        successor.start()
        self.node_relay = successor
        self._event("warn", "relay", f"the node relay of ranks {relay.ranks_text} ended; started again in its place",
                    {"state": "restarted", "ranks": sorted(relay.ranks), "lost_total": relay.lost})

    def _node_relay_event(self, level: str, text: str, data: dict[str, Any]) -> None:
        """From the node relay's thread: its head lost or found again."""
        self._event(level, "relay", text, data)

    def _publish_reply(self, reply) -> None:
        self.telemetry.emit(reply)

    def _restate_operations(self, operations: dict[str, Any]) -> None:
        """From the control thread, never the training thread's step path."""
        if self.telemetry is not None:
            self._event("info", "operations_recent", "recent operations", operations)

    def _event_from_relay(self, level: str, kind: str, text: str, data: dict[str, Any]) -> None:
        """The hang watch's verdicts, from the relay's thread (rank 0's training thread may be stuck)."""
        if self.telemetry is not None:
            self.telemetry.emit(Event(level=level, kind=kind, text=text, step=self.step, data=data))

    # ------------------------------------------------------------------ without the training thread

    def _command_stacks(self, command: Command, args) -> Callable[[float], dict[str, Any] | None]:
        """On rank 0's control thread: ask every rank's telemetry thread for its stack."""
        request = self.stack_requests.open(command.id, args.timeout_s)
        self.relay.send_down(encode_downlink(Downlink(action="stacks", id=command.id)))

        def answer(now: float) -> dict[str, Any] | None:
            result = request.poll(now)
            if result is not None:
                self.stack_requests.close(command.id)
            return result
        return answer

    def _command_dump(self, command: Command, args) -> dict[str, Any]:
        self.relay.send_down(encode_downlink(Downlink(action="dump", id=command.id)))
        return {"directory": str(self._dump_directory()), "ranks": self.ctx.world_size,
                "flight_recorder": self.ctx.backend == "nccl"}

    def _dump_directory(self) -> Path:
        return Path(self.cfg.log_dir or self.cfg.checkpoint_dir) / "dumps"

    def _stop_commanded(self, reason: str) -> None:
        """On rank 0's control thread, as a `stop` is queued: if the training thread is stuck and
        cannot apply it, the watch stops every rank (through the relay) and this one."""
        if self.watch is not None:
            said = reason if reason.startswith("stopped by user") else f"stopped by user: {reason}"
            self.watch.request_stop(said, only_if_stalled=True)

    def _downlink(self, frame: bytes) -> None:
        """On this rank's telemetry thread: what rank 0 sent down."""
        message = decode_downlink(frame)
        if message is None or self.watch is None:
            return
        if message.action == "stacks":
            self.telemetry.emit(self.watch.report("snapshot", request=message.id))
        elif message.action == "stop" and self.ctx.rank != 0:
            self.watch.request_stop(message.reason, only_if_stalled=True)
        elif message.action == "dump":
            self._write_dump()

    def _write_dump(self) -> None:
        """This rank's ledger as JSON and, on NCCL, PyTorch's Flight Recorder buffer where its
        `fr_trace` analyser looks for it (`<dir>/nccl_trace_rank_<R>`)."""
        directory = self._dump_directory()
        try:
            directory.mkdir(parents=True, exist_ok=True)
            ledger = {"rank": self.ctx.rank, "step": self.step, "host": socket.gethostname(),
                      "collectives": self.tracer.ledger_entries() if self.tracer is not None else []}
            (directory / f"ledger-rank-{self.ctx.rank}.json").write_text(json.dumps(ledger))
            if self.ctx.backend == "nccl":
                from torch._C._distributed_c10d import _dump_nccl_trace

                (directory / f"nccl_trace_rank_{self.ctx.rank}").write_bytes(_dump_nccl_trace())
            self._event("info", "dump", f"rank {self.ctx.rank} wrote its collective ledger to {directory}",
                        {"directory": str(directory)})
        except Exception as exc:  # a dump that fails is said, never fatal
            self._event("error", "dump", f"rank {self.ctx.rank} could not write its dump: {exc}")

    def _escape(self, reason: str) -> None:
        """On the watch's thread: the training thread cannot end the run (it is stuck inside a
        collective, where signal handlers never run). Say goodbye for it, naming where it is stuck,
        and end the process; rank 0 first tells the other ranks to do the same."""
        if not self._ending.acquire(blocking=False):
            return  # the training thread is already shutting down
        place = self.watch.stuck_at()
        bye = Bye(reason=f"{reason} {place}", ok=False, step=self.step)
        print(f"ringtop agent [rank {self.ctx.rank}]: {bye.reason}; leaving without the training thread",
              file=sys.stderr, flush=True)
        if self.ctx.rank == 0 and self.relay is not None:
            # the others first: a rank leaving ends its peers' collectives in errors and its launcher
            # stops them, before they could say where they were stuck
            self.relay.send_down(encode_downlink(Downlink(action="stop", reason=reason[:200])))
            others = set(range(1, self.ctx.world_size))
            deadline = time.monotonic() + self.watch.settings.grace_s + 2.0
            while not others <= self.hang_watch.said_bye and time.monotonic() < deadline:
                time.sleep(0.02)
        self._answer_commands_while_stuck(place)
        try:
            self._release_outside_world(bye)
            if self.node_relay is not None:
                self.node_relay.stop()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            os._exit(EXIT_STOPPED_WHILE_STUCK)

    def _answer_commands_while_stuck(self, place: str) -> None:
        """The commands queued for a step boundary that will not come: the stop is done, the rest ended."""
        if self.control is None:
            return
        for pending in self.control.take_pending():
            if pending.command.cmd == "stop":
                self.control.reply(pending.command, "done", result={"step": self.step, "stuck": place})
            else:
                self.control.reply(pending.command, "error", error="the run was stopped while stuck", code="ended")

    def _release_outside_world(self, bye: Bye) -> None:
        """Everything a rank holds outside itself, let go in order: the connection file, the
        sampler, the last replies, the Bye, the sockets. No collective."""
        if self._connection_path is not None:
            connection_file.remove(self._connection_path)
            self._connection_path = None
        if self.sampler is not None:
            self.sampler.stop()
        if self.control is not None:
            self.control.stop()  # its last replies are published before the Bye
        if self.telemetry is not None:
            self.telemetry.close(bye)

    def _refused(self, text: str, refused: int) -> None:
        """The gatekeeper's (rate-limited) report of connections it refused."""
        self._event("warn", "auth", text, {"refused": refused})

    def _warn_insecure(self) -> None:
        ep = self.endpoints
        text = (f"--insecure: no authentication. Anyone who can reach {ep.publish} or {ep.control} can read this "
                "run's telemetry and stop, checkpoint or switch it")
        print(f"ringtop [rank 0]: WARNING: {text}", file=sys.stderr, flush=True)
        self._event("warn", "insecure", text)

    def _strategy_facts(self) -> dict[str, Any]:
        return {**self.cfg.strategy_facts(), **self.strategy.live_facts()}

    def _settings(self) -> TrainSettings:
        return TrainSettings(batch_size=self.cfg.batch_size, grad_clip=self.cfg.grad_clip, dtype=self.cfg.dtype,
                             skip_nonfinite=self.cfg.on_nonfinite in nonfinite.SKIPPING)

    def _make_optimizer(self, params) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=self.cfg.lr)

    def snapshot(self) -> dict[str, Any]:
        """Read by the control thread for `status`; plain values only."""
        return {
            "run_id": self.run_id, "step": self.step, "steps": self.cfg.steps, "strategy": self.strategy.describe(),
            "world_size": self.ctx.world_size, "loss": self.last_loss, "step_ms": self.last_step_ms,
            "last_checkpoint": self.last_checkpoint or "",
            "refused_connections": self.gate.refused if self.gate is not None else 0,
            "lost_messages": self.relay.gaps if self.relay is not None else 0,
        }

    def _hello(self) -> Hello:
        mem_total = (torch.cuda.get_device_properties(self.ctx.device).total_memory
                     if self.ctx.device.type == "cuda" else 0)
        name = self.cfg.model if self.cfg.model != BUILTIN_MODEL else f"{BUILTIN_MODEL}-{self.cfg.model_size}"
        sharding = self.strategy.sharding
        stage = self.strategy.stage_size()
        tp = getattr(self.strategy, "tensor_parallel_shape", lambda: None)()
        if tp is not None:
            prediction, optimizer_bytes_per_param = predict_tensor_parallel(
                tp.params, tp.tensors, tp.degree, tp.layers, tp.hidden, self.cfg.batch_size, self.cfg.seq_len,
                dp=self.ctx.world_size // tp.degree,
                dp_strategy=self.cfg.canonical_strategy if self.cfg.strategy == "fsdp" else None,
                sequence_parallel=tp.sequence_parallel, gloo=self.ctx.backend == "gloo",
                norm_grad_numel=tp.norm_grad_numel if tp.sequence_parallel else None)
        elif stage is not None and getattr(self.strategy, "tp", 1) > 1:
            pp = self.strategy
            prediction, optimizer_bytes_per_param = predict_pipeline_tensor_parallel(
                *stage, stage=pp.stage_index, stages=pp.num_stages, tp=pp.tp, replicas=pp.replicas,
                layers_held=len(pp.stage_layers()), hidden=pp.hidden, micro_batch_size=self.cfg.batch_size
                // pp.micro_batches, seq_len=self.cfg.seq_len, micro_batches=pp.micro_batches,
                tied_params=pp.tied_numel)
        elif stage is not None:
            prediction, optimizer_bytes_per_param = predict_pipeline_stage(
                *stage, self.ctx.world_size, self.strategy.num_stages, getattr(self.strategy, "tied", None) is not None)
        else:
            prediction, optimizer_bytes_per_param = predict(
                self.cfg.strategy, self.cfg.fsdp_sharding, self.ctx.world_size, self.param_count,
                self.param_tensors, self.cfg.dtype, self.ctx.backend)
        return Hello(
            run_id=self.run_id, world_size=self.ctx.world_size, local_rank=self.ctx.local_rank,
            host=socket.gethostname(), pid=os.getpid(), backend=self.ctx.backend, device=str(self.ctx.device),
            strategy=self.strategy.name, strategy_options=self._strategy_facts(),
            sharding=Sharding(params=sharding.params, grads=sharding.grads, optimizer=sharding.optimizer),
            dtype=self.cfg.dtype, optimizer_bytes_per_param=optimizer_bytes_per_param, grad_clip=self.cfg.grad_clip,
            prediction=prediction, link_peak_gbps=self.cfg.link_gbps,
            link_peak_gbps_by_group=self.cfg.link_peaks_by_group, model=name, param_count=self.param_count,
            torch_version=str(torch.__version__),
            ringtop_version=RINGTOP_VERSION, batch_size=self.cfg.batch_size, seq_len=self.cfg.seq_len,
            steps=self.cfg.steps, start_step=self.start_step, lr=self.cfg.lr, seed=self.cfg.seed,
            device_mem_total_bytes=mem_total, accelerator=self.accelerator, flops_per_token=self.flops.flops,
            flops_source=self.flops.source, peak_tflops=self.peak.tflops, peak_source=self.peak.source,
            process_started_ts=_process_started_ts(),
            publish=self.endpoints.publish, control=self.endpoints.control,
        )

    # ------------------------------------------------------------------ run

    def run(self) -> int:
        previous = signal.signal(signal.SIGTERM, _raise_interrupted) if _is_main_thread() else None
        bye = Bye(reason="", ok=True)
        code = 0
        try:
            model = self._build_model()
            self.param_count, self.param_tensors = count_params(model), len(unique_parameters(model))
            flops_model = self._flops_before_setup(model) if self.cfg.telemetry else None
            resumed = self._read_resume(model) if self.cfg.resume else None
            if resumed is not None:
                model_state, optim_state, resumed_from = resumed
                model.load_state_dict(model_state)  # weights in before wrapping: some wrappers copy them at init
            if self.cfg.telemetry:
                collective_hooks.install()  # before the strategy's libraries look up (and keep) the functions
            self.strategy.weights_identical = resumed is not None
            self.strategy.setup(model.to(self.ctx.device), self._make_optimizer, self.ctx, self._settings())
            if resumed is not None:
                self.strategy.load_full_state_dict(model_state, optim_state, weights_loaded=True)
            if self.cfg.telemetry:
                self._start_watching(flops_model)
                del flops_model
                self.watch.catch_stop_signals()
                if os.environ.get(PREWARM_ENV, "1") != "0":
                    self.prewarm = Prewarm()
                    self.prewarm.start()
            if resumed is not None:
                self._event("info", "resume", f"resumed from {resumed_from} at step {self.step}",
                            {"path": str(resumed_from), "samples_seen": self.samples_seen})
            if self._data is None:
                self._data = self._build_data()
            self._loop()
            bye.reason = self.stop_reason or f"completed {self.step} steps"
            bye.ok = not self.stopped_nonfinite
        except KeyboardInterrupt:
            bye.reason, bye.ok = "interrupted: SIGINT", False
            raise
        except StoppedWhileStuck:
            bye.reason, bye.ok = self.watch.stuck_reason, False
            self._answer_commands_while_stuck(self.watch.stuck_place)
            code = EXIT_STOPPED_WHILE_STUCK
        except Interrupted as exc:
            bye.reason, bye.ok = f"interrupted: {exc}", False
            if self.peers.gone():  # the launcher stops the survivors of a dead rank: name it
                last = self._last_collective()
                bye.reason = f"error: {self.peers.explain(bye.reason, wait_s=0, last_collective=last)}"
            raise
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
            # first without the dead peer's name: a stop signal may end the look for it
            bye.reason, bye.ok = f"error: {error}", False
            bye.reason = f"error: {self.peers.explain(error, last_collective=self._last_collective())}"
            raise
        finally:
            bye.step = self.step
            self._shutdown(bye)
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        return code or (nonfinite.EXIT_STOPPED if self.stopped_nonfinite else 0)

    def _start_watching(self, flops_model: torch.nn.Module | None) -> None:
        """Everything that watches the wrapped model, started: sockets, relay, control, tracer,
        sampler, stall watch, and the Hello. `flops_model`: a meta copy to count on the first batch."""
        self._start_telemetry()
        self.strategy.attach_comm_recorder(self.tracer)
        if flops_model is not None:  # a user module: counted on the first batch
            self._data = self._build_data()
            self._count_flops(flops_model)
        self._find_peak()
        self.telemetry.emit(self._hello())
        self.telemetry.step = self.step
        self.sampler.start()
        self.watch.start()

    def _last_collective(self) -> str:
        """The collective this rank issued last (from the ledger), as the failure's context."""
        entry = self.tracer.ledger[-1] if self.tracer is not None and self.tracer.ledger else None
        if entry is None:
            return ""
        age_s = (time.perf_counter_ns() - entry.issued_ns) / 1e9
        return (f"{entry.kind} #{entry.seq} on group {entry.group} ({nbytes(entry.nbytes)}), "
                f"issued {age_s:.1f} s before")

    def _read_resume(self, fresh_model: torch.nn.Module):
        """(model state, optimizer state, path): the full state, from either kind of checkpoint,
        whatever strategy and world size wrote it; sets the step and the data position."""
        path = ckpt.resolve(self.cfg.resume, self.cfg.checkpoint_dir)
        meta = ckpt.read_meta(path)
        if meta["kind"] == ckpt.FULL:
            model_state, optim_state, _ = ckpt.load_full_files(path)
        else:
            template = {"model": {k: v.detach().clone() for k, v in fresh_model.state_dict().items()},
                        "optim": full_optimizer_template(fresh_model, self._make_optimizer)}
            ckpt.load_sharded_into(path, template, group=self.io_group)
            model_state, optim_state = template["model"], template["optim"]
        self.start_step = self.step = int(meta["step"])
        self.samples_seen = int(meta.get("samples_seen", self.step * self.ctx.world_size * self.cfg.batch_size))
        return model_state, optim_state, path

    def _loop(self) -> None:
        cfg = self.cfg
        clock = StepClock(self.ctx.device) if self.telemetry is not None else None
        phases = clock or _NoPhases()
        model_call = call_model
        if cfg.inject_slow_rank is not None and cfg.inject_slow_rank[0] == self.ctx.rank:
            extra_s = cfg.inject_slow_rank[1] / 1e3

            def model_call(model, batch):
                time.sleep(extra_s)  # injected: this rank computes longer
                return call_model(model, batch)
        collective_hooks.comm_delay_s = cfg.inject_comm_delay_ms / 1e3
        hang = cfg.inject_hang
        if hang is not None and hang[0] == self.ctx.rank and hang[2] == "before-collective":
            collective_hooks.before_issue = hang_before_collectives(lambda: self.step + 1 == hang[1])
        watch = self.watch
        if clock is not None and watch is not None:
            phases = _WatchedPhases(clock, watch)
        nan_step = cfg.inject_nan[1] if cfg.inject_nan is not None and cfg.inject_nan[0] == self.ctx.rank else None
        step_ends: list[float] | None = [] if cfg.step_times_file and self.ctx.rank == 0 else None
        while cfg.steps == 0 or self.step < cfg.steps:
            if self._step_boundary():
                break
            if watch is not None:
                watch.phase("data")
            if clock is not None:
                clock.begin()
            batch = batch_to(next(self._data), self.ctx.device)
            if cfg.inject_desync is not None and cfg.inject_desync[1] == self.step + 1:
                with collective_hooks.active(self.tracer):
                    desynchronised_broadcast(self.ctx.rank, cfg.inject_desync[0])
            phases.mark("data")
            if nan_step == self.step + 1:
                self.strategy.inject_nan_next_step()
            loss = self.strategy.run_step(batch, model_call, phases)
            self.step += 1
            if self.node_relay is not None:
                if cfg.inject_node_relay_death == self.step:
                    self.node_relay.kill()
                self._keep_node_relay()
            found = self._check_nonfinite(loss) if cfg.on_nonfinite != "warn" else None
            if step_ends is not None:
                step_ends.append(time.time())
            self.samples_seen += self.cfg.batch_size * self.strategy.data_shard(self.ctx)[1]
            if clock is not None:
                self._record_step(loss, clock, batch_tokens(batch))
            if self.checkpoints.busy:
                self._poll_checkpoint()
            if found is not None and found.mode in nonfinite.STOPPING:
                if watch is not None:
                    watch.generous("checkpoint")
                self._stop_nonfinite(found)
                break
            if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                if watch is not None:
                    watch.generous("checkpoint")
                self._periodic_checkpoint()
            if self.diagnostician is not None and self.diagnostician.due(self.step):
                self.diagnostician.run_rules()
            if self.prewarm is not None and self.prewarm.done:
                self._report_prewarm()
        if step_ends is not None:
            Path(cfg.step_times_file).write_text(json.dumps(step_ends))
        self._end_loop()

    def _end_loop(self) -> None:
        """After the last step, on every rank (collective): what is in flight finished and
        published, the rules run once more, rank 0's diagnosis said."""
        if self.sync is not None:
            self.sync.close()
        if self.watch is not None:
            self.watch.idle()
        self._publish_ready_steps(wait=True)
        if self.naming is not None:
            for found in self.naming.ready(wait=True):
                self._report_nonfinite(found)
        while self.checkpoints.busy:
            time.sleep(0.05)
            self._poll_checkpoint()
        if self.diagnostician is not None:
            self.diagnostician.run_rules()
            if self.ctx.rank == 0:
                verdicts = self.diagnostician.summary()
                text = "; ".join(v.text for v in verdicts) or "no problems found"
                self._event("info" if not verdicts else "warn", "diagnosis", f"diagnosis: {text}",
                            {"verdicts": [{"rule": v.rule, "rank": v.rank, "text": v.text, "advice": v.advice}
                                          for v in verdicts]})

    def _step_boundary(self) -> bool:
        """Before a step, on every rank: the commands agreed for it applied. True: stop now."""
        if self.watch is not None:
            self.watch.iteration(self.step + 1, "step-sync")
        if self.sync is None:
            return False
        for pending in self.sync.commands_for_step():
            self._apply(pending)
        return bool(self.stop_reason)

    def _record_step(self, loss: torch.Tensor | None, clock: StepClock, tokens: int) -> None:
        """A finished step's timing and traffic queued, and the steps whose device times are in
        published (nothing here waits for the device)."""
        timing, marks = clock.finish()
        comm = self.tracer.drain()
        self._pending.append(self._pending_step(loss, timing, marks, comm, tokens))
        self._publish_ready_steps()
        if self.profiling is not None:
            self._profile_step(comm.blocked_ms, comm.p2p_wait_ms)

    def _pending_step(self, loss, timing, marks, comm, tokens: int) -> _PendingStep:
        bubble = self.strategy.last_bubble()
        sampled = bubble is not None and not bubble.warmup and (
            self.step % TIMELINE_EVERY == 0 or self._timeline_due)
        timeline, start = None, 0
        if sampled:
            self._timeline_due = False
            start, _ = self.strategy.last_window_ns()
            timeline = [StageSpan(e.micro_batch, e.kind, (e.start_ns - start) / 1e6, (e.end_ns - start) / 1e6)
                        for e in self.strategy.last_timeline()]
        # Each stage (or tensor-parallel rank) does its share of the work on its replica's tokens.
        return _PendingStep(self.step, None if loss is None else loss.detach(), timing, marks, comm,
                            tokens // (self.strategy.num_stages * self.strategy.work_split),
                            self.strategy.last_grad_norm(), bubble, timeline, start / 1e6,
                            skipped=self.strategy.last_step_skipped())

    def _check_nonfinite(self, loss: torch.Tensor) -> nonfinite.NonFinite | None:
        """--on-nonfinite skip-step / stop / checkpoint-and-stop, right after the step on every rank:
        the norm is on the host already (ZeRO: read now); on the rare step where it is not finite,
        one gather on the control group names the ranks whose own loss was not finite."""
        norm = self.strategy.grad_norm_on_host()
        if nonfinite.norm_is_finite(norm):
            return None
        ranks = nonfinite.gather_bad_ranks(math.isfinite(float(loss.detach())), self.control_group, self.ctx.world_size)
        found = nonfinite.NonFinite(self.step, ranks, self.cfg.on_nonfinite, self.strategy.last_step_skipped(), norm)
        self._report_nonfinite(found)
        return found

    def _report_nonfinite(self, found: nonfinite.NonFinite) -> None:
        """One event for the run (every rank knows the same ranks): rank 0's, at the step it names
        (warn names it a step or two later)."""
        if self.ctx.rank != 0:
            return
        if self.telemetry is None:
            self._event(found.level, "nonfinite", found.text(), found.data())
        else:
            self.telemetry.emit(Event(level=found.level, kind="nonfinite", text=found.text(), step=found.step,
                                      data=found.data()))

    def _stop_nonfinite(self, found: nonfinite.NonFinite) -> None:
        """At the poisoned step's boundary, on every rank. The step was left out, so the live state
        is the last good step's: checkpoint-and-stop saves it under that step's number and data
        position (a resume runs the poisoned step's batch again)."""
        if found.mode == "checkpoint-and-stop" and found.skipped:
            while self.checkpoints.busy:  # a background save (a command's) finishes first
                time.sleep(0.05)
                self._poll_checkpoint()
            step, samples = self.step, self.samples_seen
            self.step -= 1
            self.samples_seen -= self.cfg.batch_size * self.strategy.data_shard(self.ctx)[1]
            try:
                name = ckpt.checkpoint_name(self.step, self.cfg.checkpoint_kind)
                if self.last_checkpoint is None or Path(self.last_checkpoint).name != name:
                    self._checkpoint(self.cfg.checkpoint_kind, background=False)
            except Exception as exc:
                self._event("error", "checkpoint", f"checkpoint of the last good step {self.step} failed: {exc}")
            finally:
                self.step, self.samples_seen = step, samples
        self.stop_reason = found.stop_reason()
        self.stopped_nonfinite = True

    def _publish_ready_steps(self, wait: bool = False) -> None:
        while self._pending and (wait or device_phases_ready(self._pending[0].marks)):
            p = self._pending.pop(0)
            if wait and p.marks is not None:
                p.marks.events[-1][1].synchronize()
            timing = apply_device_phases(p.timing, p.marks)
            self._emit_step(p, timing)

    def _emit_step(self, p: _PendingStep, timing: StepTiming) -> None:
        loss = float("nan") if p.loss is None else float(p.loss)
        grad_norm = None if p.grad_norm is None else float(p.grad_norm)
        norm_finite = nonfinite.norm_is_finite(grad_norm)
        if self.naming is not None:
            self.naming.observe(p.step, grad_norm, math.isfinite(loss))
            for found in self.naming.ready():
                self._report_nonfinite(found)
        if p.loss is not None and not math.isfinite(loss) and self._loss_was_finite and norm_finite:
            # (a non-finite norm: the nonfinite event says it)
            self._event("warn", "loss", f"loss is {loss} at step {p.step}")
        self._loss_was_finite = math.isfinite(loss)
        self.last_loss, self.last_step_ms = loss, timing.step_ms
        self.telemetry.step = p.step
        if p.step <= self.start_step + 2 or p.step % HELD_BYTES_EVERY == 0:
            self.strategy.measure_next_step()
        held = self.strategy.held_bytes()
        mem = MemorySample(params_bytes=held.params, grads_bytes=held.grads,
                           optimizer_bytes=held.optimizer, rss_bytes=self.sampler.latest.rss_bytes)
        if self.ctx.device.type == "cuda":
            mem.cuda_allocated_bytes = torch.cuda.memory_allocated(self.ctx.device)
            mem.cuda_reserved_bytes = torch.cuda.memory_reserved(self.ctx.device)
            stats = torch.cuda.memory_stats(self.ctx.device)  # allocator counters: no device sync
            mem.cuda_peak_bytes = stats.get("active_bytes.all.peak", 0)
            mem.cuda_peak_reserved_bytes = stats.get("reserved_bytes.all.peak", 0)
            mem.cuda_alloc_retries = stats.get("num_alloc_retries", 0)
            mem.cuda_ooms = stats.get("num_ooms", 0)
        ph = timing.phase_ms
        idle_ms = ph.get("data", 0.0) + p.comm.blocked_ms
        if p.bubble is not None:
            idle_ms = ph.get("data", 0.0) + p.bubble.idle_ms
            if p.timeline is not None:
                b = p.bubble
                self.telemetry.emit(Timeline(
                    step=p.step, stage=b.stage, stages=b.stages, micro_batches=b.micro_batches, schedule=b.schedule,
                    window_ms=b.window_ms, window_start_ms=p.timeline_start_ms, spans=p.timeline, bubble=b.bubble,
                    bubble_theory=b.theory))
        self.diagnostician.record(timing.step_ms, ph.get("data", 0.0), p.comm.blocked_ms, p.comm.busy_ms,
                                  sum(k.bytes for k in p.comm.kinds), mem.cuda_reserved_bytes,
                                  mem.cuda_alloc_retries)
        self.telemetry.emit(Step(
            step=p.step, loss=loss if math.isfinite(loss) else None, step_ms=timing.step_ms,
            grad_norm=grad_norm if grad_norm is not None and norm_finite else None, skipped=p.skipped,
            data_ms=ph.get("data", 0.0),
            forward_ms=ph.get("forward", 0.0), backward_ms=ph.get("backward", 0.0),
            optimizer_ms=ph.get("optimizer", 0.0), comm_blocked_ms=p.comm.blocked_ms,
            comm_busy_ms=p.comm.busy_ms, tokens=p.tokens,
            tokens_per_s=p.tokens / (timing.step_ms / 1e3) if timing.step_ms > 0 else 0.0,
            tflops=achieved_tflops(self.flops.flops, p.tokens, timing.step_ms), mem=mem,
            comm=p.comm.kinds, collectives=p.comm.collectives,
            cpu_percent=self.sampler.latest.cpu_percent, drops=self.telemetry.drops, idle_ms=idle_ms,
        ))
        if self.ctx.rank == 0 and self.cfg.print_every and p.step % self.cfg.print_every == 0:
            print(f"[ringtop] step {p.step}/{self.cfg.steps or '∞'}  loss {loss:.4f}  "
                  f"{timing.step_ms:.1f} ms/step  {p.tokens * self.ctx.world_size / (timing.step_ms / 1e3):,.0f} tok/s",
                  file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ commands

    def _apply(self, pending: PendingCommand) -> None:
        """One command, on every rank at the same step boundary: its handler's result is the
        `done` reply; a handler that answers later (a background save, a profile) returns LATER."""
        command = pending.command
        if self.watch is not None:
            self.watch.generous(f"command:{command.cmd}")
        try:
            handler = COMMAND_HANDLERS.get(command.cmd)
            if handler is None:
                raise ValueError(f"command {command.cmd!r} cannot be applied at a step boundary")
            result = getattr(self, handler)(pending)
            if result is LATER:
                return
        except Exception as exc:
            if self.control is not None:
                self.control.reply(command, "error", error=f"{type(exc).__name__}: {exc}", code="failed")
            self._event("error", "command", f"{command.cmd} failed: {exc}", {"id": command.id})
            if isinstance(exc, SwitchAborted):
                raise  # no strategy is left to train with: the run ends with this error
            return
        if self.control is not None:
            self.control.reply(command, "done", result=result)

    def _command_checkpoint(self, pending: PendingCommand) -> dict[str, Any] | object:
        result = self._checkpoint(pending.args.kind, pending.args.background)
        if result is None:
            self._checkpoint_command = pending.command
            return LATER  # answered when the background save is done
        return result

    def _command_stop(self, pending: PendingCommand) -> dict[str, Any]:
        self.stop_reason = f"stopped by user: {pending.args.reason}"
        return {"step": self.step}

    def _command_switch(self, pending: PendingCommand) -> dict[str, Any]:
        refusal = nonfinite.zero_refusal(pending.args.strategy, self.cfg.on_nonfinite)
        if refusal:
            raise RuntimeError(refusal)
        if self.profiling is not None:
            raise RuntimeError("a profile is being recorded; switch after it finishes")
        if self.checkpoints.busy:
            raise RuntimeError("a checkpoint is being written; switch after it is done")
        return self._switch(pending.args)

    def _command_set(self, pending: PendingCommand) -> dict[str, Any]:
        return self._set_micro_batches(pending.args.micro_batches)

    def _command_profile(self, pending: PendingCommand) -> object:
        if self.profiling is not None:
            raise RuntimeError("a profile is already being recorded")
        steps = pending.args.steps
        directory = Path(self.cfg.log_dir or ".") / "profile"
        self.profiling = ProfileSession(steps, self.step + 1, directory, self.ctx.rank, pending.command)
        self._event("info", "profile", f"profiling steps {self.step + 1}..{self.step + steps}")
        return LATER  # answered when the last profiled step is done

    def _set_micro_batches(self, micro_batches: int) -> dict[str, Any]:
        if not self.strategy.takes_micro_batches:
            raise RuntimeError(f"{self.strategy.describe()} has no micro-batches; switch to pp first")
        before = self.strategy.micro_batches
        self.strategy.set_micro_batches(micro_batches)  # validates; all ranks reach the same verdict
        self.cfg = msgspec.structs.replace(self.cfg, micro_batches=micro_batches)
        self._timeline_due = True
        self._event("info", "set", f"micro-batches {before} -> {micro_batches} from step {self.step + 1}",
                    {"micro_batches": micro_batches})
        if self.telemetry is not None:
            self.telemetry.emit(self._hello())
        return {"micro_batches": micro_batches, "step": self.step}

    def _profile_step(self, live_blocked_ms: float, live_p2p_wait_ms: float) -> None:
        session = self.profiling
        if not session.step_done(live_blocked_ms, live_p2p_wait_ms):
            return
        self.profiling = None
        try:
            mine = session.finish()
        except Exception as exc:
            mine = {"rank": self.ctx.rank, "error": f"{type(exc).__name__}: {exc}"}
        results = gather_results(mine, self.control_group, self.ctx.world_size)
        if self.ctx.rank != 0:
            return
        failed = [r for r in results if "error" in r]
        if failed:
            if self.control is not None:
                self.control.reply(session.command, "error", error=f"profile failed: {failed[0]['error']}",
                                   code="failed")
            self._event("error", "profile", f"profile failed: {failed[0]['error']}")
            return
        result = {"ranks": results, "steps": session.steps}
        text = "; ".join(f"rank {r['rank']}: exposed comm {r['exposed_comm_ms_per_step_trace']:.1f} ms/step "
                         f"from the trace vs {r['exposed_comm_ms_per_step_live']:.1f} live"
                         + (f", p2p wait {r['p2p_wait_ms_per_step_trace']:.1f} vs {r['p2p_wait_ms_per_step_live']:.1f}"
                            if r["p2p_wait_ms_per_step_trace"] or r["p2p_wait_ms_per_step_live"] else "")
                         for r in results)
        self._event("info", "profile", f"profile of {session.steps} steps: {text}", result)
        if self.control is not None:
            self.control.reply(session.command, "done", result=result)

    def _switch(self, args) -> dict[str, Any]:
        ds_config, from_command = args.ds_config, False
        if ds_config is not None and ds_config != self.launch_ds_config:
            ds_config, from_command = str(inside_run_directory(ds_config, self.cfg.checkpoint_dir, "ds_config")), True
        # a degree the command names; else tp keeps the run's (or all ranks), and the rest are 1D
        tp = args.tp if args.tp is not None else (self.cfg.tp if args.strategy == "tp" else None)
        new_cfg = msgspec.structs.replace(
            self.cfg, strategy=args.strategy, fsdp_sharding=args.fsdp_sharding or "full", ds_config=ds_config,
            tp=tp,
            ds_config_from_command=from_command,
            pp_schedule=args.pp_schedule or self.cfg.pp_schedule,
            micro_batches=args.micro_batches or self.cfg.micro_batches)
        check_switch_tensor_parallel(new_cfg, self.ctx.world_size, args.tp is not None)
        old = self.strategy.describe()
        try:
            new, seconds = switch_strategy(
                self.strategy, new_cfg.strategy, new_cfg.strategy_options, self.ctx, self.control_group,
                self._build_model, self._make_optimizer, self._settings(), self.cfg.inject_fail_setup)
        except SwitchError as exc:
            self._event("error", "switch", f"{exc}; still training with {old}", {"from": old, "to": args.strategy})
            raise
        self.strategy, self.cfg = new, new_cfg
        self._data = self._build_data()  # a pipeline's stages share their replica's batches
        self._timeline_due = True
        if self.tracer is not None:
            self.strategy.attach_comm_recorder(self.tracer)
            self.tracer.drain()
        if self.diagnostician is not None:
            self.diagnostician.run = dataclasses.replace(self.diagnostician.run, strategy=new_cfg.canonical_strategy)
        result = {"from": old, "to": new.describe(), "step": self.step, "seconds": round(seconds, 4)}
        self._event("info", "switch", f"switched {old} -> {new.describe()} at step {self.step} in {seconds:.2f} s",
                    result)
        if self.telemetry is not None:
            self.telemetry.emit(self._hello())
        return result

    def _periodic_checkpoint(self) -> None:
        try:
            if self.checkpoints.busy:
                raise RuntimeError("the previous checkpoint is still being written; skipped")
            self._checkpoint(self.cfg.checkpoint_kind, background=False)
        except Exception as exc:  # a failed save is reported; the run goes on
            self._event("error", "checkpoint", f"checkpoint at step {self.step} failed: {exc}")

    def _checkpoint_meta(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "strategy": self.strategy.name, "strategy_options": self.cfg.strategy_facts(),
            "world_size": self.ctx.world_size, "dtype": self.cfg.dtype,
            "model": self.cfg.model, "model_size": self.cfg.model_size, "param_count": self.param_count,
            "batch_size": self.cfg.batch_size, "seq_len": self.cfg.seq_len, "seed": self.cfg.seed, "lr": self.cfg.lr,
            "data": self.cfg.data, "samples_seen": self.samples_seen, "torch_version": str(torch.__version__),
            "saved_at": time.time(),
        }

    def _checkpoint(self, kind: str, background: bool) -> dict[str, Any] | None:
        """Collective. The result (rank 0), {} on other ranks, or None if it went to the background."""
        if self.step == 0:
            raise RuntimeError("nothing to save before step 1")
        saved = self.checkpoints.save(self.strategy, self.step, kind, self._checkpoint_meta(), background)
        if saved is None and background:
            self._event("info", "checkpoint",
                        f"{kind} checkpoint of step {self.step} is being written in the background")
            return None
        return self._saved(saved)

    def _saved(self, saved: ckpt.SavedCheckpoint | None) -> dict[str, Any]:
        if saved is None:
            return {}
        self.last_checkpoint = saved.path
        result = {"path": saved.path, "step": saved.step, "kind": saved.kind, "bytes": saved.bytes,
                  "seconds": round(saved.seconds, 4)}
        self._event("info", "checkpoint", f"{saved.kind} checkpoint of step {saved.step}: {saved.path}", result)
        return result

    def _poll_checkpoint(self) -> None:
        command, self._checkpoint_command = self._checkpoint_command, None
        try:
            saved = self.checkpoints.poll()
        except Exception as exc:
            self._event("error", "checkpoint", str(exc))
            if command is not None and self.control is not None:
                self.control.reply(command, "error", error=str(exc), code="failed")
            return
        if self.checkpoints.busy:
            self._checkpoint_command = command
            return
        result = self._saved(saved)
        if command is not None and self.control is not None:
            self.control.reply(command, "done", result=result)

    def _report_prewarm(self) -> None:
        warm, self.prewarm = self.prewarm, None
        if self.ctx.rank != 0:
            return
        if warm.error:
            self._event("warn", "prewarm", f"background warm-up for switching failed ({warm.error}); "
                        "a switch will pay its imports itself")
        else:
            self._event("info", "prewarm", f"warmed up for switching in the background in {warm.seconds:.1f} s",
                        {"seconds": round(warm.seconds, 3)})

    def _event(self, level: str, kind: str, text: str, data: dict[str, Any] | None = None) -> None:
        if self.telemetry is not None:
            self.telemetry.emit(Event(level=level, kind=kind, text=text, step=self.step, data=data or {}))
        elif self.ctx.rank == 0:
            print(f"[ringtop] {level}: {text}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ shutdown

    def _write_connection_file(self) -> None:
        """How this user's `ringtop ui`, `ctl` and `ls` find the run (protocol/connection_file.py).
        A file that cannot be written costs only that: the run goes on, and says so."""
        ep = self.endpoints
        info = connection_file.ConnectionInfo(
            run_id=self.run_id, pid=os.getpid(), host=socket.gethostname(), publish=ep.publish, control=ep.control,
            relay=ep.relay, world_size=self.ctx.world_size, started_ts=time.time(), log_dir=self.cfg.log_dir or "",
            checkpoint_dir=self.cfg.checkpoint_dir, keys=self.client_keys)
        try:
            self._connection_path = connection_file.write(info)
        except (OSError, connection_file.ConnectionFileError) as exc:
            print(f"ringtop agent [rank 0]: no connection file written ({exc}); clients need --connect",
                  file=sys.stderr)

    def _shutdown(self, bye: Bye) -> None:
        """Says goodbye and lets go. A stop signal from here on (the launcher stops the survivors
        of a dead rank moments after it died) must not cut this short: the Bye would be lost."""
        if _is_main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if not self._ending.acquire(blocking=False):
            # the watch is ending the process for a stuck training thread: let it say the Bye
            self._ending.acquire(timeout=15)
            return
        if self.watch is not None:
            self.watch.cancel_interrupt()
            self.watch.stop()
            if not bye.reason and self.watch.stuck_reason:  # the stop landed before the reason was set
                bye.reason, bye.ok = self.watch.stuck_reason, False
        self._release_outside_world(bye)
        if (bye.ok or self.stopped_nonfinite) and self.control_group is not None:  # every rank is here
            dist.barrier(group=self.control_group)
        if self.node_relay is not None:
            self.node_relay.stop()
        if self.relay is not None:
            if self.layout.multi:  # the other nodes' Byes come a hop later
                deadline = time.monotonic() + 3.0
                while (len(self.hang_watch.said_bye) < self.ctx.world_size and time.monotonic() < deadline):
                    time.sleep(0.02)
            self.relay.stop()
        if self.exporter is not None:
            self.exporter.stop()  # after the relay: the Byes are in; no thread or port outlives the run
        if self.gate is not None:
            self.gate.stop()
        self.strategy.teardown()


LATER = object()
"""A command handler's result when the reply comes later (a background save, a profile)."""

COMMAND_HANDLERS: dict[str, str] = {
    "checkpoint": "_command_checkpoint",
    "stop": "_command_stop",
    "switch": "_command_switch",
    "set": "_command_set",
    "profile": "_command_profile",
}
"""Every command applied at a step boundary (all but the immediate `status`), by the name of the
Runner's method for it (a subclass, the Monitor's, answers some differently)."""


def _raise_interrupted(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def _process_started_ts() -> float:
    """This process's start (Unix s), from the kernel; 0.0 where it cannot say."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - psutil missing or /proc unreadable: not known
        return 0.0


def _is_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
