"""Rank 0's memory of the latest operations (commands and how they ended), kept and restated by
the control thread every few seconds as an `operations_recent` event, so that a UI attached later
(after a reconnect, or a second UI) shows what was switched and checkpointed instead of "none"."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

from ringtop.protocol import Reply

KEPT = 6
RESTATE_EVERY_S = 5.0
MAX_RESULT_BYTES = 2048
"""A reply larger than this (a profile of many ranks) is restated without its result's details."""


class OperationsLog:
    def __init__(self, kept: int = KEPT, every_s: float = RESTATE_EVERY_S) -> None:
        self._ops: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._kept = kept
        self._every_s = every_s
        self._last_s = 0.0

    def record(self, reply: Reply, encoded_bytes: int) -> None:
        """Every reply rank 0 publishes (`encoded_bytes`: its frame's size); all calls come from
        the control thread."""
        if not reply.id or reply.cmd == "status":
            return
        op = self._ops.setdefault(reply.id, {"id": reply.id, "cmd": reply.cmd, "args": {}, "status": "ack",
                                             "result": {}, "error": "", "ts": time.time()})
        self._ops.move_to_end(reply.id)
        if reply.status == "ack" and isinstance(reply.result.get("args"), dict):
            op["args"] = dict(reply.result["args"])
        if reply.status in ("done", "error"):
            op["status"], op["error"], op["finished_ts"] = reply.status, reply.error, time.time()
            op["result"] = dict(reply.result) if encoded_bytes <= MAX_RESULT_BYTES else {}
        while len(self._ops) > self._kept:
            self._ops.popitem(last=False)

    def due(self, now_s: float) -> bool:
        if not self._ops or now_s - self._last_s < self._every_s:
            return False
        self._last_s = now_s
        return True

    def restatement(self) -> dict[str, Any]:
        return {"operations": [dict(op) for op in self._ops.values()]}
