"""The per-rank runner: build, wrap, train, measure, publish, obey commands, say goodbye.

This module holds the run's state and the step loop; its jobs live beside it: the set-up
(`build`), the Hello (`hello`), each step's report (`step_report`), the commands (`commands`),
what is answered without the training thread (`off_thread`), the end (`goodbye`), the injected
faults (`faults`); rank 0's services are one `agent.head.Head`."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ringtop.agent.alerts import AlertTargets
from ringtop.agent.checkpoints import format as ckpt
from ringtop.agent.checkpoints.saver import CheckpointManager
from ringtop.agent.config import AgentConfig, check_tensor_parallel_world
from ringtop.agent.control.capture import CaptureSettings
from ringtop.agent.control.channel import ControlServer, StepSync, broadcast_bytes
from ringtop.agent.head import Head
from ringtop.agent.health import nonfinite
from ringtop.agent.health.diagnosis_exchange import Diagnostician
from ringtop.agent.health.peers import Peers
from ringtop.agent.health.stall_watch import StallWatch, StoppedWhileStuck, WatchSettings
from ringtop.agent.health.step_findings import StepFindings
from ringtop.agent.instruments.comm_tracer import CommTracer
from ringtop.agent.instruments.sampler import SystemSampler
from ringtop.agent.instruments.step_clock import StepClock
from ringtop.agent.loop import build
from ringtop.agent.loop.commands import Commands
from ringtop.agent.loop.faults import StepFaults, check_fault_ranks
from ringtop.agent.loop.goodbye import EXIT_STOPPED_WHILE_STUCK, Goodbye
from ringtop.agent.loop.hello import hello
from ringtop.agent.loop.off_thread import OffThread
from ringtop.agent.loop.previous_attempts import take_over
from ringtop.agent.loop.prewarm import Prewarm
from ringtop.agent.loop.step_report import StepReport
from ringtop.agent.models.factories import batch_to, batch_tokens
from ringtop.agent.models.flop_count import FlopsPerToken
from ringtop.agent.models.model import count_params
from ringtop.agent.restarts import launcher_run_id, restart_count
from ringtop.agent.transport import rank_setup
from ringtop.agent.transport.gatekeeper import node_user
from ringtop.agent.transport.node_relay import NodeLayout
from ringtop.agent.transport.telemetry import Telemetry
from ringtop.metrics.fmt import nbytes
from ringtop.metrics.rules.diagnosis import RunContext
from ringtop.metrics.rules.peaks import Peak
from ringtop.metrics.timing import StepWindow, status_step_ms
from ringtop.protocol import Bye, Endpoints, Event, Hello, curve, safe_files
from ringtop.protocol.text_safety import printable
from ringtop.strategies import collective_hooks, collective_naming
from ringtop.strategies.base import DistContext, Strategy, TrainSettings, unique_parameters
from ringtop.strategies.registry import build_strategy

PREWARM_ENV = "RINGTOP_PREWARM"
"""`0`: no background warm-up for switching (a run that will not switch, on a machine short of cores)."""


class Interrupted(Exception):
    """SIGTERM from torchrun or the user: leave the loop cleanly and say why."""


class _NoPhases:
    def mark(self, phase: str) -> None:
        pass


NEXT_PHASE = {"data": "forward", "forward": "backward", "backward": "optimizer", "optimizer": "after-step"}


class WatchedPhases:
    """The step clock's marks, also telling the stall watch which phase runs now (one attribute
    write: the watch reads it from its own thread)."""

    def __init__(self, clock: Any, watch: StallWatch) -> None:
        self._clock, self._watch = clock, watch

    def mark(self, phase: str) -> None:
        self._clock.mark(phase)
        self._watch.phase(NEXT_PHASE.get(phase, phase))


class Runner:
    commands_class = Commands
    """What applies the commands at a step boundary (the Monitor's answers some differently)."""

    def __init__(self, cfg: AgentConfig, ctx: DistContext):
        self.cfg = cfg
        self.ctx = ctx
        self.launch_ds_config = cfg.ds_config
        """The --ds-config of the launch: trusted in full, also when a switch names it again."""
        self.step = 0
        self.start_step = 0
        self.stop_reason: str | None = None
        self.last_loss = float("nan")
        self.last_step_ms = 0.0
        self.step_window = StepWindow()
        """This rank's last STEP_WINDOW step times: `status`'s step ms, the UI cell's window."""
        self.last_checkpoint: str | None = None
        self.telemetry: Telemetry | None = None
        self.head: Head | None = None
        """Rank 0's services besides training (agent/head)."""
        self.control: ControlServer | None = None
        """Rank 0's control server (the head's); None on the other ranks."""
        self.endpoints: Endpoints = cfg.endpoints
        """The addresses rank 0 actually bound (a taken default port moves to a free one)."""
        self.sampler: SystemSampler | None = None
        self.tracer: CommTracer | None = None
        self.diagnostician: Diagnostician | None = None
        self.sync: StepSync | None = None
        self.prewarm: Prewarm | None = None
        self.watch: StallWatch | None = None
        self.off_thread = OffThread(self)
        self.goodbye = Goodbye(self)
        self.control_group = dist.new_group(backend="gloo") if ctx.world_size > 1 else None
        self.io_group = dist.new_group(backend="gloo") if ctx.world_size > 1 else None
        self.naming = nonfinite.AsyncNaming(ctx.world_size) if cfg.on_nonfinite == "warn" and cfg.telemetry else None
        """--on-nonfinite warn names the ranks of a non-finite loss off the step path (agent/health/nonfinite.py)."""
        self.stopped_nonfinite = False
        """--on-nonfinite stop / checkpoint-and-stop ended the run: a Bye with ok=False, exit status 3."""
        self.peers = Peers.gather(ctx.rank, ctx.world_size, self.control_group)
        self.layout = NodeLayout.from_hosts(self.peers.hosts)
        """Which ranks share a node: on several, each node's ranks publish to a node relay."""
        self.node_relay: Any = None
        """If this rank leads a node (not the head's): its watcher's link, or (--no-watcher) the relay."""
        rank_setup.check_head_reachable(self.layout, cfg.relay, cfg.telemetry)
        safe_files.set_group_readable(cfg.group_readable)
        for folder, what in ((cfg.log_dir, "log folder"), (cfg.checkpoint_dir, "checkpoint folder")):
            if folder:
                safe_files.check_dir(folder, what)  # refuse to start on a link or a folder others can write
        self.checkpoints = CheckpointManager(cfg.checkpoint_dir, ctx.rank, self.control_group, self.io_group,
                                             keep=cfg.keep, delay_s=cfg.inject_save_delay_ms / 1e3)
        self.samples_seen = 0
        """Samples of the global stream consumed so far: the data position checkpoints carry."""
        check_fault_ranks(cfg, ctx.world_size)
        check_tensor_parallel_world(cfg, ctx.world_size)
        self.run_id = self._agree_on_run_id()
        self.strategy: Strategy = build_strategy(cfg.strategy, cfg.strategy_options(), ctx.device)
        self.report = StepReport(self)
        self.commands = self.commands_class(self)
        self.data = None
        self.flops = FlopsPerToken(0.0, "not counted: no telemetry")
        """Model FLOPs per training token, found once at start: each Step's TFLOP/s is one multiply."""
        self.peak = Peak(0.0, "")
        self.step_findings = StepFindings(self.ctx.rank)
        self.accelerator = ""
        self.restart_cause = ""
        """Rank 0 of a restarted run: how the attempt before ended (agent/loop/previous_attempts.py)."""

    # ------------------------------------------------------------------ set-up

    def _agree_on_run_id(self) -> str:
        run_id = self.cfg.run_id or launcher_run_id(os.environ) or uuid.uuid4().hex[:8]
        if self.control_group is None:
            return run_id
        return broadcast_bytes(run_id.encode(), self.ctx.rank, self.control_group).decode()

    def _start_head(self, keys: curve.RunKeys | None) -> None:
        """Rank 0's services, their sockets bound (not yet started)."""
        cfg = self.cfg
        self.head = Head(cfg.endpoints, run_id=self.run_id, world_size=self.ctx.world_size, keys=keys,
                         on_event=self.off_thread.event, snapshot=self.snapshot,
                         publish_reply=self.off_thread.publish_reply, movable=cfg.movable_endpoints,
                         metrics=cfg.metrics, carriers=self.layout.carriers(node_user),
                         immediate={"dump": self.off_thread.command_dump}, on_stop=self.off_thread.stop_commanded,
                         restate_operations=self.off_thread.restate_operations,
                         capture=CaptureSettings(cfg.capture_on, cfg.capture_every_min, cfg.capture_steps),
                         alerts=AlertTargets(cfg.alert_webhook, cfg.alert_command, cfg.alert_goodput),
                         log_dir=cfg.log_dir or "", watcher=cfg.telemetry and not cfg.no_watcher,
                         attempt=restart_count(os.environ), on_watcher_lost=self.off_thread.watcher_lost)
        self.control = self.head.control
        self.endpoints = self.head.endpoints
        self.restart_cause = take_over(self.head.relay, cfg.log_dir, restart_count(os.environ))

    def _start_telemetry(self) -> None:
        """Every rank's publisher, rank 0's head, the keys shared, the node relays on several nodes."""
        cfg, rank, world = self.cfg, self.ctx.rank, self.ctx.world_size
        keys = None
        if rank == 0:
            keys = None if cfg.insecure else curve.generate(world, len(self.layout.nodes) - 1)
            self._start_head(keys)
        self.endpoints, rank_keys, rank_public = rank_setup.share_setup(
            rank, world, self.control_group, self.endpoints, keys, self.layout.multi)
        relay_address = self.endpoints.relay
        if self.layout.multi:
            self.node_relay = rank_setup.start_node_relay(rank, world, self.control_group, self.layout,
                                                          self.endpoints.relay, self.run_id, keys, rank_keys,
                                                          rank_public, watcher=not cfg.no_watcher,
                                                          on_lost=self.off_thread.node_watcher_lost)
            relay_address, rank_keys = rank_setup.node_relay_address(rank, world, self.control_group, self.layout,
                                                                     self.node_relay, self.endpoints.relay, rank_keys)
        self.telemetry = Telemetry(rank, relay_address, cfg.log_dir, keys=rank_keys)
        if self.node_relay is not None:
            self.node_relay.on_event = self.off_thread.node_relay_event
        if self.head is not None:
            self.head.start()
            self.head.publish_connection_file(self.cfg.log_dir or "", self.cfg.checkpoint_dir)
        self.sync = StepSync(rank, self.control, self.control_group)
        gpu_index = self.ctx.device.index if self.ctx.device.type == "cuda" else None
        self.sampler = SystemSampler(self.telemetry.emit, gpu_index=gpu_index)
        self.tracer = CommTracer(dimension_of=collective_naming.dimension_of)
        self.watch = StallWatch(self.tracer, self.telemetry.emit, self.peers,
                                WatchSettings(factor=cfg.stall_factor, floor_s=cfg.stall_floor_s),
                                training_thread=threading.get_ident(), escape=self.goodbye.escape)
        self.telemetry.on_downlink = self.off_thread.downlink
        capacity = (torch.cuda.get_device_properties(self.ctx.device).total_memory
                    if self.ctx.device.type == "cuda" else 0)
        run = RunContext(strategy=cfg.canonical_strategy, world_size=world, param_count=self.param_count,
                         device_capacity_bytes=capacity, link_peak_gbps=cfg.link_gbps)
        self.diagnostician = Diagnostician(rank, world, self.control_group, run, self.event)

    def settings(self) -> TrainSettings:
        return TrainSettings(batch_size=self.cfg.batch_size, grad_clip=self.cfg.grad_clip, dtype=self.cfg.dtype,
                             skip_nonfinite=self.cfg.on_nonfinite in nonfinite.SKIPPING)

    def make_optimizer(self, params) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=self.cfg.lr)

    def snapshot(self) -> dict[str, Any]:
        """Read by the control thread for `status`; plain values only."""
        head = self.head
        return {
            "run_id": self.run_id, "step": self.step, "steps": self.cfg.steps, "strategy": self.strategy.describe(),
            "world_size": self.ctx.world_size, "loss": self.last_loss, **status_step_ms(self.step_window),
            "last_checkpoint": self.last_checkpoint or "",
            "refused_connections": head.refused_connections if head is not None else 0,
            "lost_messages": head.lost_messages() if head is not None else 0,
        }

    def hello(self) -> Hello:
        return hello(self)

    # ------------------------------------------------------------------ run

    def run(self) -> int:
        previous = signal.signal(signal.SIGTERM, _raise_interrupted) if _is_main_thread() else None
        bye = Bye(reason="", ok=True)
        code = 0
        try:
            self._set_up()
            self._loop()
            bye.reason = self.stop_reason or f"completed {self.step} steps"
            bye.ok = not self.stopped_nonfinite
        except KeyboardInterrupt:
            bye.reason, bye.ok = "interrupted: SIGINT", False
            raise
        except StoppedWhileStuck:
            bye.reason, bye.ok = self.watch.stuck_reason, False
            self.goodbye.answer_while_stuck(self.watch.stuck_place)
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
            self.goodbye.shutdown(bye)
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        return code or (nonfinite.EXIT_STOPPED if self.stopped_nonfinite else 0)

    def _set_up(self) -> None:
        """The model built (or resumed), wrapped by the strategy, watched; the data built."""
        model = build.build_model(self)
        self.param_count, self.param_tensors = count_params(model), len(unique_parameters(model))
        flops_model = build.flops_before_setup(self, model) if self.cfg.telemetry else None
        resumed = build.read_resume(self, model) if self.cfg.resume else None
        if resumed is not None:
            model_state, optim_state, resumed_from = resumed
            model.load_state_dict(model_state)  # weights in before wrapping: some wrappers copy them at init
        if self.cfg.telemetry:
            collective_hooks.install()  # before the strategy's libraries look up (and keep) the functions
        self.strategy.weights_identical = resumed is not None
        self.strategy.setup(model.to(self.ctx.device), self.make_optimizer, self.ctx, self.settings())
        if resumed is not None:
            self.strategy.load_full_state_dict(model_state, optim_state, weights_loaded=True)
        if self.cfg.telemetry:
            self.start_watching(flops_model)
            del flops_model
            self.watch.catch_stop_signals()
            self.watch.setting_up(self.step + 1, "set-up")
            if os.environ.get(PREWARM_ENV, "1") != "0":
                self.prewarm = Prewarm()
                self.prewarm.start()
        if resumed is not None:
            self.event("info", "resume", f"resumed from {resumed_from} at step {self.step}",
                       {"path": str(resumed_from), "samples_seen": self.samples_seen})
        if self.data is None:
            if self.watch is not None:
                self.watch.phase("data")
            self.data = build.build_data(self)

    def start_watching(self, flops_model: torch.nn.Module | None) -> None:
        """Everything that watches the wrapped model, started: sockets, relay, control, tracer,
        sampler, stall watch, and the Hello. `flops_model`: a meta copy to count on the first batch."""
        self._start_telemetry()
        self.strategy.attach_comm_recorder(self.tracer)
        if flops_model is not None:  # a user module: counted on the first batch
            self.data = build.build_data(self)
            build.count_flops(self, flops_model)
        build.find_peak(self)
        self.telemetry.emit(self.hello())
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

    def _loop(self) -> None:
        cfg = self.cfg
        clock = StepClock(self.ctx.device) if self.telemetry is not None else None
        faults = StepFaults(cfg, self.ctx.rank, lambda: self.step + 1)
        watch = self.watch
        phases = WatchedPhases(clock, watch) if clock is not None and watch is not None else clock or _NoPhases()
        step_ends: list[float] | None = [] if cfg.step_times_file and self.ctx.rank == 0 else None
        while cfg.steps == 0 or self.step < cfg.steps:
            if self.step_boundary():
                break
            if watch is not None:
                watch.phase("data")
            if clock is not None:
                clock.begin()
            batch = batch_to(next(self.data), self.ctx.device)
            faults.after_batch(self.step + 1, self.tracer)
            phases.mark("data")
            faults.before_run(self.step + 1, self.strategy)
            loss = self.strategy.run_step(batch, faults.model_call, phases)
            self.step += 1
            if self.node_relay is not None:
                if faults.node_relay_death == self.step:
                    self.node_relay.kill()
                self.keep_node_relay()
            found = self._check_nonfinite(loss) if cfg.on_nonfinite != "warn" else None
            if step_ends is not None:
                step_ends.append(time.time())
            self.samples_seen += self.cfg.batch_size * self.strategy.data_shard(self.ctx)[1]
            if clock is not None:
                self.report.record(loss, clock, batch_tokens(batch))
            if self.checkpoints.busy:
                self.commands.poll_checkpoint()
            if found is not None and found.mode in nonfinite.STOPPING:
                if watch is not None:
                    watch.generous("checkpoint")
                self._stop_nonfinite(found)
                break
            self._after_step()
        self.end_loop()
        if step_ends is not None:  # after the collective end: a refused write stops rank 0 alone
            safe_files.write_output(cfg.step_times_file, json.dumps(step_ends).encode())

    def _after_step(self) -> None:
        """A periodic checkpoint, the rules when due, the warm-up's report once it is done."""
        if self.cfg.checkpoint_every and self.step % self.cfg.checkpoint_every == 0:
            if self.watch is not None:
                self.watch.generous("checkpoint")
            self.commands.periodic_checkpoint()
        if self.diagnostician is not None and self.diagnostician.due(self.step):
            self.diagnostician.run_rules()
        if self.prewarm is not None and self.prewarm.done:
            self._report_prewarm()

    def end_loop(self) -> None:
        """After the last step, on every rank (collective): what is in flight finished and
        published, the rules run once more, rank 0's diagnosis said."""
        if self.sync is not None:
            self.sync.close()
        if self.watch is not None:
            self.watch.idle()
        self.report.publish_ready(wait=True)
        if self.naming is not None:
            for found in self.naming.ready(wait=True):
                self.report_nonfinite(found)
        self.commands.finish_saves()
        if self.diagnostician is not None:
            self.diagnostician.run_rules()
            if self.ctx.rank == 0:
                verdicts = self.diagnostician.summary()
                text = "; ".join(v.text() for v in verdicts) or "no problems found"
                self.event("info" if not verdicts else "warn", "diagnosis", f"diagnosis: {text}",
                           {"verdicts": [v.data() for v in verdicts]})

    def step_boundary(self) -> bool:
        """Before a step, on every rank: the commands agreed for it applied. True: stop now."""
        if self.watch is not None:
            self.watch.iteration(self.step + 1, "step-sync")
        if self.sync is None:
            return False
        for pending in self.sync.commands_for_step():
            self.commands.apply(pending)
        return bool(self.stop_reason)

    def keep_node_relay(self) -> None:
        """Once a step, on a node relay's rank: one that ended while the run goes on, started again."""
        relay = self.node_relay
        successor = rank_setup.restarted(relay)
        if successor is None:
            return
        self.node_relay = successor
        self.event("warn", "relay", f"the node relay of ranks {relay.ranks_text} ended; started again in its place",
                   {"state": "restarted", "ranks": sorted(relay.ranks), "lost_total": relay.lost})

    def _check_nonfinite(self, loss: torch.Tensor) -> nonfinite.NonFinite | None:
        """--on-nonfinite skip-step / stop / checkpoint-and-stop, right after the step on every rank:
        the norm is on the host already (ZeRO: read now); on the rare step where it is not finite,
        one gather on the control group names the ranks whose own loss was not finite."""
        norm = self.strategy.grad_norm_on_host()
        if nonfinite.norm_is_finite(norm):
            return None
        ranks = nonfinite.gather_bad_ranks(math.isfinite(float(loss.detach())), self.control_group, self.ctx.world_size)
        found = nonfinite.NonFinite(self.step, ranks, self.cfg.on_nonfinite, self.strategy.last_step_skipped(), norm)
        self.report_nonfinite(found)
        return found

    def report_nonfinite(self, found: nonfinite.NonFinite) -> None:
        """One event for the run (every rank knows the same ranks): rank 0's, at the step it names
        (warn names it a step or two later)."""
        if self.ctx.rank != 0:
            return
        if self.telemetry is None:
            self.event(found.level, "nonfinite", found.text(), found.data())
        else:
            self.telemetry.emit(Event(level=found.level, kind="nonfinite", text=found.text(), step=found.step,
                                      data=found.data()))

    def _stop_nonfinite(self, found: nonfinite.NonFinite) -> None:
        """At the poisoned step's boundary, on every rank. The step was left out, so the live state
        is the last good step's: checkpoint-and-stop saves it under that step's number and data
        position (a resume runs the poisoned step's batch again)."""
        if found.mode == "checkpoint-and-stop" and found.skipped:
            self.commands.finish_saves()  # a background save (a command's) finishes first
            step, samples = self.step, self.samples_seen
            self.step -= 1
            self.samples_seen -= self.cfg.batch_size * self.strategy.data_shard(self.ctx)[1]
            try:
                name = ckpt.checkpoint_name(self.step, self.cfg.checkpoint_kind)
                if self.last_checkpoint is None or Path(self.last_checkpoint).name != name:
                    self.commands.save(self.cfg.checkpoint_kind, background=False)
            except Exception as exc:
                self.event("error", "checkpoint", f"checkpoint of the last good step {self.step} failed: {exc}")
            finally:
                self.step, self.samples_seen = step, samples
        self.stop_reason = found.stop_reason()
        self.stopped_nonfinite = True

    def _report_prewarm(self) -> None:
        warm, self.prewarm = self.prewarm, None
        if self.ctx.rank != 0:
            return
        if warm.error:
            self.event("warn", "prewarm", f"background warm-up for switching failed ({warm.error}); "
                       "a switch will pay its imports itself")
        else:
            self.event("info", "prewarm", f"warmed up for switching in the background in {warm.seconds:.1f} s",
                       {"seconds": round(warm.seconds, 3)})

    def event(self, level: str, kind: str, text: str, data: dict[str, Any] | None = None) -> None:
        if self.telemetry is not None:
            self.telemetry.emit(Event(level=level, kind=kind, text=text, step=self.step, data=data or {}))
        elif self.ctx.rank == 0:
            print(printable(f"[ringtop] {level}: {text}"), file=sys.stderr, flush=True)


def _raise_interrupted(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def _is_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
