"""The commands applied at a step boundary, on every rank at the same step (stop, checkpoint,
switch, set micro-batches, profile), and the checkpoints they and the periodic save take. A
handler's result is the `done` reply; a handler that answers later (a background save, a
profile) returns LATER and the reply comes when it is done."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import torch

from ringtop.agent.checkpoints import format as ckpt
from ringtop.agent.checkpoints.saver import SaveFailed
from ringtop.agent.config import check_switch_tensor_parallel
from ringtop.agent.control.channel import PendingCommand
from ringtop.agent.control.profiling import ProfileSession, SkippedSession, gather_results
from ringtop.agent.control.run_paths import inside_run_directory
from ringtop.agent.health import nonfinite
from ringtop.agent.loop import build
from ringtop.agent.loop.switching import SwitchAborted, SwitchError, switch_strategy
from ringtop.protocol import Command

if TYPE_CHECKING:
    from ringtop.agent.loop.runner import Runner

LATER = object()
"""A command handler's result when the reply comes later (a background save, a profile)."""

COMMAND_HANDLERS: dict[str, str] = {
    "checkpoint": "on_checkpoint",
    "stop": "on_stop",
    "switch": "on_switch",
    "set": "on_set",
    "profile": "on_profile",
}
"""Every command applied at a step boundary (all but the immediate ones), by the name of the
Commands method for it (a subclass, the Monitor's, answers some differently)."""


class Commands:
    def __init__(self, run: Runner) -> None:
        self.run = run
        self.profiling: ProfileSession | SkippedSession | None = None
        self._checkpoint_command: Command | None = None
        """A checkpoint command whose background save is still being written."""

    def reply(self, command: Command, status: str, **fields: Any) -> None:
        """Rank 0's reply through its control server (other ranks have none)."""
        if self.run.control is not None:
            self.run.control.reply(command, status, **fields)

    def apply(self, pending: PendingCommand) -> None:
        command = pending.command
        run = self.run
        if run.watch is not None:
            run.watch.generous(f"command:{command.cmd}")
        try:
            handler = COMMAND_HANDLERS.get(command.cmd)
            if handler is None:
                raise ValueError(f"command {command.cmd!r} cannot be applied at a step boundary")
            result = getattr(self, handler)(pending)
            if result is LATER:
                return
        except Exception as exc:
            said = str(exc) if isinstance(exc, SaveFailed) else f"{type(exc).__name__}: {exc}"
            self.reply(command, "error", error=said, code="failed")
            run.event("error", "command", f"{command.cmd} failed: {exc}", {"id": command.id})
            if isinstance(exc, SwitchAborted):
                raise  # no strategy is left to train with: the run ends with this error
            return
        self.reply(command, "done", result=result)

    # ------------------------------------------------------------------ the handlers

    def on_checkpoint(self, pending: PendingCommand) -> dict[str, Any] | object:
        result = self.save(pending.args.kind, pending.args.background)
        if result is None:
            self._checkpoint_command = pending.command
            return LATER  # answered when the background save is done
        return result

    def on_stop(self, pending: PendingCommand) -> dict[str, Any]:
        self.run.stop_reason = f"stopped by user: {pending.args.reason}"
        return {"step": self.run.step}

    def on_switch(self, pending: PendingCommand) -> dict[str, Any]:
        refusal = nonfinite.zero_refusal(pending.args.strategy, self.run.cfg.on_nonfinite)
        if refusal:
            raise RuntimeError(refusal)
        if self.profiling is not None:
            raise RuntimeError("a profile is being recorded; switch after it finishes")
        if self.run.checkpoints.busy:
            raise RuntimeError("a checkpoint is being written; switch after it is done")
        return self.switch(pending.args)

    def on_set(self, pending: PendingCommand) -> dict[str, Any]:
        return self.set_micro_batches(pending.args.micro_batches)

    def on_profile(self, pending: PendingCommand) -> object:
        if self.profiling is not None:
            raise RuntimeError("a profile is already being recorded")
        run = self.run
        steps, ranks = pending.args.steps, pending.args.ranks
        if ranks is not None and not [r for r in ranks if r < run.ctx.world_size]:
            raise ValueError(f"profile ranks={ranks}: none of them is a rank of this run (0..{run.ctx.world_size - 1})")
        directory = Path(run.cfg.log_dir or ".") / "profile"
        if ranks is None or run.ctx.rank in ranks:
            self.profiling = ProfileSession(steps, run.step + 1, directory, run.ctx.rank, pending.command)
        else:
            self.profiling = SkippedSession(steps, run.step + 1, run.ctx.rank, pending.command)
        which = "" if ranks is None else f" on ranks {', '.join(map(str, sorted(set(ranks))))}"
        why = f" ({pending.args.reason})" if pending.args.reason else ""
        run.event("info", "profile", f"profiling steps {run.step + 1}..{run.step + steps}{which}{why}")
        return LATER  # answered when the last profiled step is done

    # ------------------------------------------------------------------ what they do

    def set_micro_batches(self, micro_batches: int) -> dict[str, Any]:
        run = self.run
        if not run.strategy.takes_micro_batches:
            raise RuntimeError(f"{run.strategy.describe()} has no micro-batches; switch to pp first")
        before = run.strategy.micro_batches
        run.strategy.set_micro_batches(micro_batches)  # validates; all ranks reach the same verdict
        run.cfg = msgspec.structs.replace(run.cfg, micro_batches=micro_batches)
        run.report.timeline_due = True
        run.event("info", "set", f"micro-batches {before} -> {micro_batches} from step {run.step + 1}",
                  {"micro_batches": micro_batches})
        if run.telemetry is not None:
            run.telemetry.emit(run.hello())
        return {"micro_batches": micro_batches, "step": run.step}

    def profile_step(self, live_exposed_comm_ms: float, live_p2p_wait_ms: float) -> None:
        """After each profiled step; after the last, every rank's result gathered and rank 0 replies."""
        run, session = self.run, self.profiling
        if not session.step_done(live_exposed_comm_ms, live_p2p_wait_ms):
            return
        self.profiling = None
        try:
            mine = session.finish()
        except Exception as exc:
            mine = {"rank": run.ctx.rank, "error": f"{type(exc).__name__}: {exc}"}
        results = gather_results(mine, run.control_group, run.ctx.world_size)
        if run.ctx.rank != 0:
            return
        failed = [r for r in results if "error" in r]
        if failed:
            self.reply(session.command, "error", error=f"profile failed: {failed[0]['error']}", code="failed")
            run.event("error", "profile", f"profile failed: {failed[0]['error']}")
            return
        result = {"ranks": results, "steps": session.steps}
        results = [r for r in results if not r.get("skipped")]
        text = "; ".join(f"rank {r['rank']}: exposed comm {r['exposed_comm_ms_per_step_trace']:.1f} ms/step "
                         f"from the trace vs {r['exposed_comm_ms_per_step_live']:.1f} live"
                         + (f", p2p wait {r['p2p_wait_ms_per_step_trace']:.1f} vs {r['p2p_wait_ms_per_step_live']:.1f}"
                            if r["p2p_wait_ms_per_step_trace"] or r["p2p_wait_ms_per_step_live"] else "")
                         for r in results)
        run.event("info", "profile", f"profile of {session.steps} steps: {text}", result)
        self.reply(session.command, "done", result=result)

    def switch(self, args) -> dict[str, Any]:
        run = self.run
        ds_config, from_command = args.ds_config, False
        if ds_config is not None and ds_config != run.launch_ds_config:
            ds_config, from_command = str(inside_run_directory(ds_config, run.cfg.checkpoint_dir, "ds_config")), True
        # a degree the command names; else tp keeps the run's (or all ranks), and the rest are 1D
        tp = args.tp if args.tp is not None else (run.cfg.tp if args.strategy == "tp" else None)
        new_cfg = msgspec.structs.replace(
            run.cfg, strategy=args.strategy, fsdp_sharding=args.fsdp_sharding or "full", ds_config=ds_config,
            tp=tp,
            ds_config_from_command=from_command,
            pp_schedule=args.pp_schedule or run.cfg.pp_schedule,
            micro_batches=args.micro_batches or run.cfg.micro_batches)
        check_switch_tensor_parallel(new_cfg, run.ctx.world_size, args.tp is not None)
        old = run.strategy.describe()
        try:
            new, seconds = switch_strategy(
                run.strategy, new_cfg.strategy, new_cfg.strategy_options, run.ctx, run.control_group,
                lambda: build.build_model(run), run.make_optimizer, run.settings(), run.cfg.inject_fail_setup)
        except SwitchError as exc:
            run.event("error", "switch", f"{exc}; still training with {old}", {"from": old, "to": args.strategy})
            raise
        run.strategy, run.cfg = new, new_cfg
        run.data = build.build_data(run)  # a pipeline's stages share their replica's batches
        run.report.timeline_due = True
        if run.tracer is not None:
            run.strategy.attach_comm_recorder(run.tracer)
            run.tracer.drain()
        if run.diagnostician is not None:
            run.diagnostician.run = dataclasses.replace(run.diagnostician.run, strategy=new_cfg.canonical_strategy)
        result = {"from": old, "to": new.describe(), "step": run.step, "seconds": round(seconds, 4)}
        run.event("info", "switch", f"switched {old} -> {new.describe()} at step {run.step} in {seconds:.2f} s",
                  result)
        if run.telemetry is not None:
            run.telemetry.emit(run.hello())
        return result

    # ------------------------------------------------------------------ checkpoints

    def periodic_checkpoint(self) -> None:
        run = self.run
        try:
            if run.checkpoints.busy:
                raise RuntimeError("the previous checkpoint is still being written; skipped")
            self.save(run.cfg.checkpoint_kind, background=False)
        except Exception as exc:  # a failed save is reported; the run goes on
            said = str(exc) if isinstance(exc, SaveFailed) else f"checkpoint at step {run.step} failed: {exc}"
            run.event("error", "checkpoint", said)

    def checkpoint_meta(self) -> dict[str, Any]:
        run, cfg = self.run, self.run.cfg
        return {
            "run_id": run.run_id, "strategy": run.strategy.name, "strategy_options": cfg.strategy_facts(),
            "world_size": run.ctx.world_size, "dtype": cfg.dtype,
            "model": cfg.model, "model_size": cfg.model_size, "param_count": run.param_count,
            "batch_size": cfg.batch_size, "seq_len": cfg.seq_len, "seed": cfg.seed, "lr": cfg.lr,
            "data": cfg.data, "samples_seen": run.samples_seen, "torch_version": str(torch.__version__),
            "saved_at": time.time(),
        }

    def save(self, kind: str, background: bool) -> dict[str, Any] | None:
        """Collective. The result (rank 0), {} on other ranks, or None if it went to the background."""
        run = self.run
        if run.step == 0:
            raise RuntimeError("nothing to save before step 1")
        try:
            saved = run.checkpoints.save(run.strategy, run.step, kind, self.checkpoint_meta(), background)
        except SaveFailed as exc:
            self._save_failed(exc)
            raise
        if saved is None and background:
            run.event("info", "checkpoint", f"{kind} checkpoint of step {run.step} is being written in the background")
            return None
        return self.saved(saved)

    def saved(self, saved: ckpt.SavedCheckpoint | None) -> dict[str, Any]:
        if saved is None:
            return {}
        self.run.last_checkpoint = saved.path
        result = {"path": saved.path, "step": saved.step, "kind": saved.kind, "bytes": saved.bytes,
                  "seconds": round(saved.seconds, 4)}
        self.run.event("info", "checkpoint", f"{saved.kind} checkpoint of step {saved.step}: {saved.path}", result)
        return result

    def poll_checkpoint(self) -> None:
        command, self._checkpoint_command = self._checkpoint_command, None
        try:
            saved = self.run.checkpoints.poll()
        except Exception as exc:
            if isinstance(exc, SaveFailed):
                self._save_failed(exc)
            self.run.event("error", "checkpoint", str(exc))
            if command is not None:
                self.reply(command, "error", error=str(exc), code="failed")
            return
        if self.run.checkpoints.busy:
            self._checkpoint_command = command
            return
        result = self.saved(saved)
        if command is not None:
            self.reply(command, "done", result=result)

    def finish_saves(self) -> None:
        """Until the background save (a command's) is done."""
        while self.run.checkpoints.busy:
            time.sleep(0.05)
            self.poll_checkpoint()

    def _save_failed(self, exc: SaveFailed) -> None:
        """On every rank alike (the failure is agreed): --stop-on-save-failure ends the run at this step."""
        run = self.run
        if run.cfg.stop_on_save_failure and not run.stop_reason:
            run.stop_reason = f"stopped on a failed save: {exc}"
