"""Hugging Face `Trainer` under ringtop: `ringtop.hf.watch(trainer)` before `trainer.train()`.

Needs `transformers` (and `accelerate`, which its Trainer needs): `pip install -e ".[hf]"`. The
Trainer's DDP (or FSDP2) model and optimizer are watched by a `ringtop.Monitor` from train begin to
train end; each optimizer step is a ringtop step, its loss the mean of its micro-batches' model
losses. Its FLOPs are the Trainer's own count (`Trainer.floating_point_ops`, accumulated in
`current_flos` over the step's micro-batches: 6 x tokens x non-embedding parameters for a
`PreTrainedModel`, 0 for a model it cannot count), its tokens the Trainer's `num_input_tokens_seen`
(gathered over the ranks, so divided by the world size) where `include_num_input_tokens_seen` asks
for it; TFLOP/s are n/a where the Trainer counts no FLOPs. The UI's checkpoint runs
`trainer.save_model(directory)`; its stop ends training at the step's end
(`control.should_training_stop`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from ringtop.agent.loop.monitor import Monitor
from ringtop.agent.loop.own_loop import MonitorError


class RingtopCallback(TrainerCallback):
    """Made by `watch`; holds its Trainer (a callback is not given it) and the Monitor while training."""

    def __init__(self, trainer: Any, **monitor_options: Any) -> None:
        self.trainer = trainer
        self.options = monitor_options
        self.monitor: Monitor | None = None
        self._losses: list[torch.Tensor] = []
        self._tap = None
        self._flos_at_begin = 0.0
        self._tokens_at_begin = 0

    def on_train_begin(self, args, state, control, **kwargs):
        trainer = self.trainer
        optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate's wrapper
        try:
            self.monitor = Monitor(trainer.model_wrapped, optimizer, save_fn=self._save,
                                   **{"trainer": "hf", **self.options})
        except MonitorError as exc:  # a model ringtop cannot watch: training goes on unwatched
            print(f"ringtop: not watching this Trainer: {exc}", file=sys.stderr, flush=True)
            return
        self._tap = trainer.model_wrapped.register_forward_hook(self._loss_of)

    def _loss_of(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if torch.is_grad_enabled() and isinstance(loss, torch.Tensor):
            self._losses.append(loss.detach())

    def _save(self, directory: Path, step: int) -> None:
        self.trainer.save_model(str(directory))

    def on_step_begin(self, args, state, control, **kwargs):
        self._flos_at_begin = float(getattr(self.trainer, "current_flos", 0.0))
        self._tokens_at_begin = int(getattr(state, "num_input_tokens_seen", 0) or 0)

    def on_step_end(self, args, state, control, **kwargs):
        if self.monitor is None:
            return
        losses, self._losses = self._losses, []
        loss = losses[0] if len(losses) == 1 else (torch.stack(losses).mean() if losses else None)
        flops = float(getattr(self.trainer, "current_flos", 0.0)) - self._flos_at_begin
        tokens = None
        if getattr(args, "include_num_input_tokens_seen", "no") not in ("no", False):
            seen = int(getattr(state, "num_input_tokens_seen", 0) or 0) - self._tokens_at_begin
            tokens = seen // max(1, args.world_size)
        self.monitor.step_end(loss, tokens=tokens, flops=flops if flops > 0 else None)
        if self.monitor.should_stop:
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        if self._tap is not None:
            self._tap.remove()
            self._tap = None
        if self.monitor is not None:
            self.monitor.close()
            self.monitor = None


def watch(trainer: Any, **monitor_options: Any) -> RingtopCallback:
    """Add ringtop's callback to `trainer` (options: those of `ringtop.Monitor`)."""
    callback = RingtopCallback(trainer, **monitor_options)
    trainer.add_callback(callback)
    return callback
