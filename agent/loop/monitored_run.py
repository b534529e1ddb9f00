"""The Runner under `ringtop.Monitor`: its configuration from keyword arguments and `RINGTOP_ARGS`,
the Runner's watching half over a loop it does not run, and the commands it answers differently
for such a loop (a checkpoint through the script's save function; no switch, no micro-batches)."""

from __future__ import annotations

import contextlib
import os
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from ringtop.agent.checkpoints import format as ckpt
from ringtop.agent.config import (
    CHECKPOINTS,
    TELEMETRY,
    AgentConfig,
    ConfigError,
    agent_parser,
    cli_fields,
    config_from_options,
)
from ringtop.agent.control.channel import PendingCommand, all_gather_fixed
from ringtop.agent.loop.commands import Commands
from ringtop.agent.loop.own_loop import NOT_OWNED, OwnLoop
from ringtop.agent.loop.runner import Runner
from ringtop.agent.loop.switch_offer import switch_unavailable
from ringtop.protocol import safe_files
from ringtop.strategies.base import DistContext

ARGS_ENV = "RINGTOP_ARGS"
"""The agent's telemetry and checkpoint flags for a Monitor, e.g. `--log-dir runs/a --print-every 10`
(keyword arguments given in the script win)."""
MAX_ARGS_CHARS = 4096
USER_KIND = ckpt.USER
NO_SWITCH = f"{NOT_OWNED}: it cannot switch its strategy; change the wrapping in the script and start it again"
ERROR_BYTES = 200
NOT_OPTIONS = frozenset({"telemetry", "step_times_file", "resume", "checkpoint_every", "checkpoint_kind", "keep"})
"""Flags of those groups that only ringtop's own loop can act on."""
OPTIONS = frozenset(f.name for f in cli_fields() if f.option.group in (TELEMETRY, CHECKPOINTS)) - NOT_OPTIONS \
    | {"dtype"}
"""What a Monitor takes: where it publishes and logs, its keys, its stall thresholds, the link,
the peak and dtype MFU is measured with, where checkpoints go."""

SaveFunction = Callable[[Path, int], Any]


def monitor_config(options: dict[str, Any], env_text: str) -> AgentConfig:
    """The AgentConfig of a Monitor: `RINGTOP_ARGS` flags, then the keyword arguments, checked as
    the agent checks its command line."""
    given: dict[str, Any] = {}
    if env_text:
        if len(env_text) > MAX_ARGS_CHARS:
            raise ConfigError(f"{ARGS_ENV} is longer than {MAX_ARGS_CHARS} characters")
        try:
            words = shlex.split(env_text)
        except ValueError as exc:
            raise ConfigError(f"{ARGS_ENV}: {exc}") from None
        given.update(vars(agent_parser(f"{ARGS_ENV}=").parse_args(words)))
    fields = {f.name: f for f in cli_fields()}
    for name, value in options.items():
        if name in OPTIONS and fields[name].option.parse is not None and not isinstance(value, str):
            raise ConfigError(f"ringtop.Monitor({name}=...): give it as text, as on the command line "
                              f"({fields[name].flag} {fields[name].option.metavar or 'VALUE'})")
        given[name] = value
    refused = sorted(set(given) - OPTIONS)
    if refused:
        raise ConfigError(f"ringtop.Monitor does not take {', '.join(refused)}: the script's own loop decides "
                          f"that. It takes {', '.join(sorted(OPTIONS))}")
    return config_from_options(given)


class MonitorCommands(Commands):
    """The commands a Runner cannot carry out for a loop it does not run, answered here."""

    def on_switch(self, pending: PendingCommand) -> dict[str, Any]:
        raise RuntimeError(NO_SWITCH)

    def on_set(self, pending: PendingCommand) -> dict[str, Any]:
        raise RuntimeError(f"{NOT_OWNED}: its micro-batches are the script's")

    def on_checkpoint(self, pending: PendingCommand) -> dict[str, Any]:
        """On every rank at the same boundary: the script's save function writes into a temporary
        folder; once it returned on every rank, rank 0 renames it and points `latest` at it (the
        agent's atomic convention). A failure on any rank is the command's error on all."""
        run = self.run
        if run.save_fn is None:
            raise RuntimeError("no save function registered: call mon.on_checkpoint(fn) in the script, "
                               "fn(directory, step)")
        if run.step == 0:
            raise RuntimeError("nothing to save before step 1")
        started = time.perf_counter()
        directory = Path(run.cfg.checkpoint_dir)
        tmp_name = ckpt.temporary_name(run.step, USER_KIND)
        final_name = ckpt.checkpoint_name(run.step, USER_KIND)
        fds = {"dir": -1, "tmp": -1}
        size = 0

        def prepare() -> None:
            fds["dir"] = safe_files.open_dir(directory, what="checkpoint folder")
            safe_files.remove_tree(fds["dir"], tmp_name)
            fds["tmp"] = safe_files.make_dir(fds["dir"], tmp_name)

        def publish() -> None:
            nonlocal size
            size = ckpt.finish_user(fds["tmp"], run.step, {
                "run_id": run.run_id, "strategy": run.strategy.describe(), "world_size": run.ctx.world_size,
                "model": run.model_name, "saved_at": time.time()})
            ckpt.publish(fds["dir"], tmp_name, final_name)

        failed_save = f"user checkpoint of step {run.step} failed"
        parts = ((failed_save, lambda: _error_of(prepare) if run.ctx.rank == 0 else ""),
                 ("the save function failed", lambda: _error_of(lambda: run.save_fn(directory / tmp_name, run.step))),
                 (failed_save, lambda: _error_of(publish) if run.ctx.rank == 0 else ""))
        try:
            for what, part in parts:  # each agreed by every rank before the next
                failed = self._gather_errors(part())
                if failed:
                    if fds["dir"] >= 0:
                        with contextlib.suppress(OSError):
                            safe_files.remove_tree(fds["dir"], tmp_name)
                    rank, text = failed[0]
                    raise RuntimeError(f"{what} on rank {rank}: {text}")
        finally:
            for fd in fds.values():
                if fd >= 0:
                    os.close(fd)
        if run.ctx.rank != 0:
            return {}
        return self.saved(ckpt.SavedCheckpoint(str(directory / final_name), run.step, USER_KIND, size,
                                                time.perf_counter() - started))

    def _gather_errors(self, error: str) -> list[tuple[int, str]]:
        mine = error.encode()[:ERROR_BYTES]
        if self.run.control_group is None:
            everyone = [mine]
        else:
            everyone = all_gather_fixed(mine, ERROR_BYTES, self.run.ctx.world_size, self.run.control_group)
        return [(r, e.decode(errors="replace")) for r, e in enumerate(everyone) if e]


def _error_of(part: Callable[[], Any]) -> str:
    """"" or what `part` raised (the script's save function: its failure is the command's error,
    not the run's)."""
    try:
        part()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


class MonitoredRun(Runner):
    """The Runner's watching half, over a loop it does not run."""

    commands_class = MonitorCommands

    def __init__(self, cfg: AgentConfig, ctx: DistContext, loop: OwnLoop, model_name: str) -> None:
        super().__init__(cfg, ctx)
        self.strategy = loop
        self.model_name = model_name
        self.save_fn: SaveFunction | None = None

    def hello(self):
        lr = self.strategy.optimizer.param_groups[0].get("lr", 0.0) if self.strategy.optimizer.param_groups else 0.0
        return msgspec.structs.replace(super().hello(), model=self.model_name, batch_size=0, seq_len=0, steps=0,
                                       seed=0, lr=float(lr) if isinstance(lr, (int, float)) else 0.0,
                                       switch_unavailable=switch_unavailable(own_loop=True, own_loop_reason=NO_SWITCH))

    def snapshot(self) -> dict[str, Any]:
        return {**super().snapshot(), "loop": "own"}
