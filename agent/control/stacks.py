"""`ringtop ctl stacks`: every rank's stack, gathered by rank 0 without any training thread.

The control thread sends a `stacks` frame down the relay; each rank's telemetry thread answers with
a `Stall` snapshot; the relay's thread hands those to the waiting request; the control thread
replies once every rank has answered or the wait is over. Ranks with the same stack are grouped,
as a thousand ranks mostly wait in one place and the few elsewhere are the interesting ones.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ringtop.metrics.fmt import nbytes
from ringtop.metrics.rank_sets import ranks_text
from ringtop.protocol import Message, Stall

MAX_WAITING = 8


class StacksRequest:
    def __init__(self, request_id: str, world_size: int, timeout_s: float) -> None:
        self.id = request_id
        self.world_size = world_size
        self.deadline = time.monotonic() + timeout_s
        self.answers: dict[int, Stall] = {}

    def poll(self, now: float) -> dict[str, Any] | None:
        if len(self.answers) < self.world_size and now < self.deadline:
            return None
        return stacks_result(self.answers, self.world_size)


def stacks_result(answers: dict[int, Stall], world_size: int) -> dict[str, Any]:
    groups: dict[tuple, list[int]] = {}
    for rank, stall in sorted(answers.items()):
        groups.setdefault((stall.phase, stall.where, tuple(stall.stack)), []).append(rank)
    ordered = sorted(groups.items(), key=lambda kv: (len(kv[1]), kv[1]))  # the odd ones out first
    result_groups = []
    for (phase, where, stack), ranks in ordered:
        first = answers[ranks[0]]
        result_groups.append({
            "ranks": ranks, "label": ranks_text(ranks), "phase": phase, "where": where, "step": first.step,
            "running_s": round(first.running_s, 3), "stack": list(stack),
            "in_flight": [f"{op.kind} #{op.seq} on group {op.group} ({nbytes(op.bytes)}) for {op.age_s:.1f} s"
                          for op in first.in_flight],
        })
    missing = [r for r in range(world_size) if r not in answers]
    return {"answered": len(answers), "missing": missing, "groups": result_groups}


class StackRequests:
    """The open requests: the control thread adds, the relay thread answers (its observer)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._lock = threading.Lock()
        self._open: dict[str, StacksRequest] = {}

    def open(self, request_id: str, timeout_s: float) -> StacksRequest:
        with self._lock:
            if len(self._open) >= MAX_WAITING:
                raise RuntimeError(f"{MAX_WAITING} stack requests are already waiting; try again")
            request = self._open[request_id] = StacksRequest(request_id, self.world_size, timeout_s)
        return request

    def close(self, request_id: str) -> None:
        with self._lock:
            self._open.pop(request_id, None)

    def observe(self, msg: Message) -> None:
        if not isinstance(msg, Stall) or msg.state != "snapshot" or not msg.request:
            return
        with self._lock:
            request = self._open.get(msg.request)
            if request is not None:
                request.answers[msg.rank] = msg
