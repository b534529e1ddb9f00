"""Collects every rank's recent step numbers on rank 0 and publishes the diagnosis as events.

Every `every` steps all ranks all-gather the medians of their last window (a few floats over the
small gloo control group); rank 0 runs the rule set and emits a `verdict` event when a verdict
appears or changes, and `verdict_cleared` when it goes away.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Callable

import torch
import torch.distributed as dist

from ringtop.strategies.diagnosis import RankWindow, RunContext, Verdict, diagnose

FIELDS = ("step_ms", "data_ms", "blocked_ms", "comm_busy_ms", "comm_bytes", "cuda_reserved_bytes", "cuda_alloc_retries")


class Diagnostician:
    def __init__(self, rank: int, world_size: int, group: dist.ProcessGroup | None, run: RunContext,
                 emit_event: Callable[[str, str, str, dict], None], window: int = 20, every: int = 20):
        self.rank, self.world_size, self.group, self.run = rank, world_size, group, run
        self.emit_event = emit_event
        self.every = every
        self.history: collections.deque[tuple[float, ...]] = collections.deque(maxlen=window)
        self.current: dict[tuple[str, int | None], Verdict] = {}
        self.seen: dict[tuple[str, int | None], Verdict] = {}

    def record(self, step_ms: float, data_ms: float, blocked_ms: float, comm_busy_ms: float, comm_bytes: float,
               cuda_reserved_bytes: float, cuda_alloc_retries: float) -> None:
        self.history.append((step_ms, data_ms, blocked_ms, comm_busy_ms, comm_bytes, cuda_reserved_bytes,
                             cuda_alloc_retries))

    def due(self, step: int) -> bool:
        return step > 0 and step % self.every == 0

    def run_rules(self) -> list[Verdict]:
        """Collective: every rank calls it on the same step."""
        mine = [statistics.median(column) for column in zip(*self.history)] if self.history else [0.0] * len(FIELDS)
        local = torch.tensor(mine, dtype=torch.float64)
        if self.group is not None:
            gathered = [torch.zeros_like(local) for _ in range(self.world_size)]
            dist.all_gather(gathered, local, group=self.group)
        else:
            gathered = [local]
        if self.rank != 0 or not self.history:
            return []
        windows = [RankWindow(rank, **dict(zip(FIELDS, t.tolist()))) for rank, t in enumerate(gathered)]
        verdicts = diagnose(windows, self.run)
        self._publish_changes(verdicts)
        return verdicts

    def _publish_changes(self, verdicts: list[Verdict]) -> None:
        """News as `verdict` / `verdict_cleared`; the whole active set restated as `verdicts_active`
        every round, so a UI that attaches late learns what is in force."""
        now = {(v.rule, v.rank): v for v in verdicts}
        for key, v in now.items():
            if key not in self.current:
                self.emit_event("warn", "verdict", v.text,
                                {"rule": v.rule, "rank": v.rank, "evidence": v.evidence, "advice": v.advice})
            self.seen[key] = v
        for key, v in self.current.items():
            if key not in now:
                self.emit_event("info", "verdict_cleared", f"cleared: {v.text}", {"rule": v.rule, "rank": v.rank})
        self.current = now
        if now:
            self.emit_event("warn", "verdicts_active", f"{len(now)} active verdict(s)", {"verdicts": [
                {"rule": v.rule, "rank": v.rank, "text": v.text, "evidence": v.evidence, "advice": v.advice}
                for v in now.values()]})

    def summary(self) -> list[Verdict]:
        return list(self.seen.values())
