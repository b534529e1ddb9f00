"""Injected faults for tests and demos: a rank that hangs, one out of step, (see also --inject-nan).

A hang is a loop of short sleeps that only the end of the process ends, as a stuck data loader or
a deadlock would be: signals reach the main thread's handlers between the sleeps, so a rank hung
in `forward` stops on SIGTERM like a healthy one, while its peers, stuck inside the collective it
never joined, are the ones the stall watch has to get out.
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from ringtop.agent.config import ConfigError
from ringtop.agent.models.factories import call_model
from ringtop.agent.restarts import restart_count
from ringtop.strategies import collective_hooks

DESYNC_ELEMENTS = 1024


def hang_forever() -> None:
    while True:
        time.sleep(0.05)


def hang_before_collectives(should_hang):
    """A `collective_hooks.before_issue` that hangs when `should_hang()` says so."""
    def before_issue(kind: str) -> None:
        if should_hang():
            hang_forever()
    return before_issue


SENT_WAIT_S = 2.0
"""How long an injected GIL hang waits for what the rank has queued to go out first."""


def hang_holding_the_gil(queued: Callable[[], int] = lambda: 0) -> None:
    """Stuck in native code that keeps the GIL, as a C extension or a driver call can be: libc's
    sleep called through ctypes.PyDLL (which does not release the GIL), so no other thread of the
    process runs (no heartbeat, no stall report). A signal ends the sleep early; its Python
    handler then runs between two sleeps, so a stop still stops the rank. `queued`: the
    telemetry the rank has not sent yet, let out first (up to SENT_WAIT_S), so the injected
    hang starts after the last step's report, the same on every machine."""
    deadline = time.monotonic() + SENT_WAIT_S
    while queued() and time.monotonic() < deadline:
        time.sleep(0.01)
    libc = ctypes.PyDLL(None)
    while True:
        libc.sleep(3600)


def hang_in_forward(module: torch.nn.Module, should_hang, gil_held: bool = False,
                    queued: Callable[[], int] = lambda: 0) -> torch.utils.hooks.RemovableHandle:
    """A forward pre-hook on `module` (a block inside the model, so the stack shows the model's own
    forward calling it) that hangs when `should_hang()` says so; `gil_held`: holding the GIL (its
    telemetry, `queued`, out first)."""
    def pre_hook(_module, _inputs):
        if should_hang():
            hang_holding_the_gil(queued) if gil_held else hang_forever()
    return module.register_forward_pre_hook(pre_hook)


def inner_module(model: torch.nn.Module) -> torch.nn.Module:
    """A module the model's forward calls: its first child with children of its own (a block of a
    ModuleList), else its first child, else the model."""
    for child in model.modules():
        if child is not model and any(True for _ in child.children()) and not isinstance(
                child, (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential)):
            return child
    children = list(model.children())
    return children[0] if children else model


def desynchronised_broadcast(rank: int, culprit: int) -> None:
    """Every rank broadcasts DESYNC_ELEMENTS floats on the world group, `culprit` into one more:
    gloo fills the larger buffer without complaint, so only the ranks' collective digests differ."""
    source = 0 if culprit != 0 else 1
    buffer = torch.zeros(DESYNC_ELEMENTS + (1 if rank == culprit else 0))
    dist.broadcast(buffer, src=source)


class InjectedCrash(RuntimeError):
    """--inject-crash: an error as a bug in the training code would raise, so the rank exits as
    it would (traceback, exit code 1) and its launcher may start the run again."""


checkpoint_fault = None
"""Tests' hook into a checkpoint save: `checkpoint_fault(stage, kind)` is called on every rank as
the save starts (stage "prepare", before the checkpoint folder is opened), before a rank opens the
temporary folder it writes into ("open") and inside the writer ("write"). Whatever it raises, or
breaks on disk, the save must fail on every rank, named."""


class StepFaults:
    """The --inject-* faults of the step loop aimed at this rank, set up once before it: a slow
    rank's model call, a collective delay, a hang before a collective, a desynchronised broadcast,
    a non-finite step, a node relay killed."""

    def __init__(self, cfg: Any, rank: int, next_step: Callable[[], int]) -> None:
        self.rank = rank
        self.model_call = call_model
        if cfg.inject_slow_rank is not None and cfg.inject_slow_rank[0] == rank:
            extra_s = cfg.inject_slow_rank[1] / 1e3

            def slow_call(model, batch):
                time.sleep(extra_s)  # injected: this rank computes longer
                return call_model(model, batch)
            self.model_call = slow_call
        collective_hooks.comm_delay_s = cfg.inject_comm_delay_ms / 1e3
        hang = cfg.inject_hang
        if hang is not None and hang[0] == rank and hang[2] == "before-collective":
            collective_hooks.before_issue = hang_before_collectives(lambda: next_step() == hang[1])
        self.desync = cfg.inject_desync
        self.nan_step = cfg.inject_nan[1] if cfg.inject_nan is not None and cfg.inject_nan[0] == rank else None
        self.node_relay_death = cfg.inject_node_relay_death
        crash = cfg.inject_crash
        self.crash_step = (crash[1] if crash is not None and crash[0] == rank and restart_count(os.environ) == 0
                           else None)

    def after_batch(self, step: int, tracer: Any) -> None:
        """Before step `step` runs, its batch loaded: the desynchronised broadcast, traced."""
        if self.desync is not None and self.desync[1] == step:
            with collective_hooks.active(tracer):
                desynchronised_broadcast(self.rank, self.desync[0])

    def before_run(self, step: int, strategy: Any) -> None:
        if self.crash_step == step:
            raise InjectedCrash(f"rank {self.rank} crashed at step {step} (--inject-crash)")
        if self.nan_step == step:
            strategy.inject_nan_next_step()


def check_fault_ranks(cfg: Any, world_size: int) -> None:
    """An injected fault aimed at a rank this run does not have would silently do nothing."""
    for flag, fault in (("--inject-hang", cfg.inject_hang), ("--inject-crash", cfg.inject_crash),
                        ("--inject-desync", cfg.inject_desync),
                        ("--inject-nan", cfg.inject_nan), ("--inject-slow-rank", cfg.inject_slow_rank)):
        if fault is not None and fault[0] >= world_size:
            raise ConfigError(f"{flag}: rank {fault[0]} is not in this run of {world_size} "
                              f"rank{'s' if world_size > 1 else ''}")
