"""Pays, in a background thread while training runs, the one-time costs a live switch would
otherwise pay on its critical path: DeepSpeed's import (and the optimizer check that imports
torch's compiler stack, 2.5 s on these CPUs), the state-dict API a first checkpoint or switch reads
the state through (DTensor and DCP, about a second) and the meta-device kernels a model is built with.

A relaunch pays these again at every start; a switch after the warm-up pays none of them.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
import time

import torch
from torch import nn


class Prewarm:
    def __init__(self) -> None:
        self.seconds: float | None = None
        self.error = ""
        self._thread = threading.Thread(target=self._run, name="ringtop-prewarm", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def done(self) -> bool:
        return self.seconds is not None

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            with torch.device("meta"):
                nn.Linear(2, 2)
                nn.Embedding(2, 2)
                nn.LayerNorm(2)
                nn.init.normal_(torch.empty(2))
                nn.init.trunc_normal_(torch.empty(2))
                nn.init.xavier_uniform_(torch.empty(2, 2))
            importlib.import_module("torch.distributed.fsdp")
            importlib.import_module("torch.distributed.checkpoint.state_dict")
            if importlib.util.find_spec("deepspeed") is not None:
                importlib.import_module("deepspeed")
                try:  # what deepspeed.initialize imports on first use, to check the optimizer
                    importlib.import_module("deepspeed.runtime.zero.muon.muon_optimizer")
                except ImportError:
                    pass
        except Exception as exc:  # a warm-up must never hurt the run
            self.error = f"{type(exc).__name__}: {exc}"
        self.seconds = time.perf_counter() - t0
