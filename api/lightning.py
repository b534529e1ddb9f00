"""Lightning under ringtop: `Trainer(callbacks=[ringtop.lightning.RingtopCallback()])`.

Needs `lightning`: `pip install -e ".[lightning]"`. The strategy's DDP (or FSDP2) model and the
first optimizer are watched by a `ringtop.Monitor` from train start to train end; each training
batch is a ringtop step, its loss the one `training_step` returned. Its FLOPs are the module's
`flops_per_batch`, as Lightning's `ThroughputMonitor` reads them (set it with
`lightning.fabric.utilities.throughput.measure_flops`); tokens are what the callback is given
(`RingtopCallback(tokens_per_step=…)`): Lightning counts none of its own, and ringtop guesses none.
The UI's checkpoint runs
`trainer.save_checkpoint(directory / "model.ckpt")`; its stop sets `trainer.should_stop`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from ringtop.agent.loop.monitor import Monitor
from ringtop.agent.loop.own_loop import MonitorError


class RingtopCallback(pl.Callback):
    def __init__(self, **monitor_options: Any) -> None:
        self.options = monitor_options
        self.monitor: Monitor | None = None
        self._trainer: pl.Trainer | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.optimizers:
            print("ringtop: not watching: this Trainer has no optimizer", file=sys.stderr, flush=True)
            return
        self._trainer = trainer
        try:
            flops = getattr(pl_module, "flops_per_batch", None)
            given = {"flops_per_step": float(flops)} if isinstance(flops, (int, float)) and flops > 0 else {}
            self.monitor = Monitor(trainer.strategy.model, trainer.optimizers[0], save_fn=self._save,
                                   **{"trainer": "lightning", **given, **self.options})
        except MonitorError as exc:
            print(f"ringtop: not watching this Trainer: {exc}", file=sys.stderr, flush=True)

    def _save(self, directory: Path, step: int) -> None:
        self._trainer.save_checkpoint(str(directory / "model.ckpt"))

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.monitor is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        self.monitor.step_end(loss if isinstance(loss, torch.Tensor) else None)
        if self.monitor.should_stop:
            trainer.should_stop = True

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.monitor is not None:
            self.monitor.close()
            self.monitor = None
