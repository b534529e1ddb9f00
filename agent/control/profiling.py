"""`profile STEPS`: every rank records the next STEPS steps with the PyTorch profiler, writes a
Chrome trace, and reports the exposed communication read from the trace (communication minus its
overlap with compute) beside the live estimate the tracer gave for the same steps.

Each profiled training step (the strategy's `run_step`, entered through `collective_hooks.active`) is
marked in the trace as a `ProfilerStep#N` span, so the analysis counts step by step and leaves out
what the agent does between steps (data loading, the control channel's broadcast). Point-to-point
waits (a pipeline's send/recv) are reported apart from exposed collective communication."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ringtop.agent.control.trace_analysis import analyze_trace
from ringtop.protocol import safe_files
from ringtop.strategies import collective_hooks


@dataclass
class ProfileSession:
    steps: int
    first_step: int
    directory: Path
    rank: int
    command: Any = None
    live_exposed_comm_ms: list[float] = field(default_factory=list)
    live_p2p_wait_ms: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(activities=activities)
        self.profiler.__enter__()
        collective_hooks.step_annotation = self._step_span

    def _step_span(self) -> torch.profiler.record_function:
        return torch.profiler.record_function(f"ProfilerStep#{self.first_step + len(self.live_exposed_comm_ms)}")

    def step_done(self, live_exposed_comm_ms: float, live_p2p_wait_ms: float = 0.0) -> bool:
        """Called after each profiled step; True once the last one is recorded."""
        self.profiler.step()
        self.live_exposed_comm_ms.append(live_exposed_comm_ms)
        self.live_p2p_wait_ms.append(live_p2p_wait_ms)
        return len(self.live_exposed_comm_ms) >= self.steps

    def finish(self) -> dict[str, Any]:
        if collective_hooks.step_annotation == self._step_span:
            collective_hooks.step_annotation = None
        self.profiler.__exit__(None, None, None)
        path = self.directory / f"step-{self.first_step:08d}-rank-{self.rank}.json"
        self._export(path.name)
        analysis = analyze_trace(path)
        steps = max(len(analysis.steps), 1)
        return {
            "rank": self.rank, "trace": str(path), "steps": self.steps, "first_step": self.first_step,
            "exposed_comm_ms_per_step_trace": round(analysis.exposed_comm_ms / steps, 3),
            "comm_ms_per_step_trace": round(analysis.comm_ms / steps, 3),
            "overlap_pct_trace": round(analysis.overlap_pct, 1),
            "p2p_wait_ms_per_step_trace": round(analysis.p2p_wait_ms / steps, 3),
            "step_ms_trace": round(analysis.wall_ms / steps, 3),
            "exposed_comm_ms_per_step_live": round(sum(self.live_exposed_comm_ms) / len(self.live_exposed_comm_ms), 3),
            "p2p_wait_ms_per_step_live": round(sum(self.live_p2p_wait_ms) / len(self.live_p2p_wait_ms), 3),
        }


    def _export(self, name: str) -> None:
        """The profiler writes by path: into a fresh private folder, then renamed into place."""
        folder = safe_files.open_dir(self.directory, what="profile folder")
        scratch = safe_files.temporary_name(name)
        try:
            scratch_fd = safe_files.make_dir(folder, scratch)
            try:
                self.profiler.export_chrome_trace(f"{safe_files.fd_path(scratch_fd)}/{name}")
                safe_files.set_mode(scratch_fd, name, safe_files.file_mode())
                os.rename(name, name, src_dir_fd=scratch_fd, dst_dir_fd=folder)
            finally:
                os.close(scratch_fd)
            safe_files.remove_tree(folder, scratch)
        finally:
            os.close(folder)


@dataclass
class SkippedSession:
    """A rank the profile leaves out (`profile ranks=[...]`): it steps on unprofiled, counting the
    same steps, so it meets the others at the gather after the last one."""

    steps: int
    first_step: int
    rank: int
    command: Any = None
    done: int = 0

    def step_done(self, live_exposed_comm_ms: float, live_p2p_wait_ms: float = 0.0) -> bool:
        self.done += 1
        return self.done >= self.steps

    def finish(self) -> dict[str, Any]:
        return {"rank": self.rank, "skipped": True, "steps": self.steps, "first_step": self.first_step}


def gather_results(result: dict[str, Any], group: dist.ProcessGroup | None, world_size: int) -> list[dict[str, Any]]:
    if group is None:
        return [result]
    out: list[Any] = [None] * world_size
    dist.all_gather_object(out, result, group=group)
    return out
