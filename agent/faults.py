"""Injected faults for tests and demos: a rank that hangs, one out of step, (see also --inject-nan).

A hang is a loop of short sleeps that only the end of the process ends, as a stuck data loader or
a deadlock would be: signals reach the main thread's handlers between the sleeps, so a rank hung
in `forward` stops on SIGTERM like a healthy one, while its peers, stuck inside the collective it
never joined, are the ones the stall watch has to get out.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

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


def hang_in_forward(module: torch.nn.Module, should_hang) -> torch.utils.hooks.RemovableHandle:
    """A forward pre-hook on `module` (a block inside the model, so the stack shows the model's own
    forward calling it) that hangs when `should_hang()` says so."""
    def pre_hook(_module, _inputs):
        if should_hang():
            hang_forever()
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
