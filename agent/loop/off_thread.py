"""What a rank answers without its training thread, which may be stuck: from the telemetry thread
(what rank 0 sent down: a stack, a dump, a stop), from rank 0's control thread (`dump`, a `stop`
queued while stuck, the operations restated), from the relay's and node relay's threads (their
events). Each only emits or writes; none waits for the training thread."""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ringtop.protocol import Command, Event, HangReport, safe_files
from ringtop.protocol.downlink import Downlink, decode_downlink

if TYPE_CHECKING:
    from ringtop.agent.loop.runner import Runner


class OffThread:
    def __init__(self, run: Runner) -> None:
        self.run = run

    def event(self, level: str, kind: str, text: str, data: dict[str, Any] | HangReport) -> None:
        """The head's events (the hang watch's verdicts, typed; refused connections) from its
        threads: rank 0's training thread may be stuck."""
        if self.run.telemetry is not None:
            if isinstance(data, HangReport):
                event = Event(level=level, kind=kind, text=text, step=self.run.step, hang=data)
            else:
                event = Event(level=level, kind=kind, text=text, step=self.run.step, data=data)
            self.run.telemetry.emit(event)

    def node_relay_event(self, level: str, text: str, data: dict[str, Any]) -> None:
        """From the node relay's thread: its head lost or found again."""
        self.run.event(level, "relay", text, data)

    def watcher_lost(self, why: str) -> None:
        """From the watcher link's thread: training goes on; what the UIs no longer get is said
        (in this rank's log, and to a UI once a relay takes the ranks' messages again)."""
        text = f"{why}: UIs get no telemetry from this run now; training goes on and every rank's log keeps its record"
        print(f"ringtop agent [rank 0]: {text}", file=sys.stderr, flush=True)
        self.run.event("error", "watcher", text, {})

    def node_watcher_lost(self, why: str) -> None:
        """From the node watcher's link thread: this node's ranks no longer reach the head."""
        ranks = self.run.layout.nodes[self.run.layout.node_of(self.run.ctx.rank)]
        text = (f"{why}: ranks {','.join(map(str, ranks))} reach no UI now; training goes on and every rank's "
                "log keeps its record")
        print(f"ringtop agent [rank {self.run.ctx.rank}]: {text}", file=sys.stderr, flush=True)
        self.run.event("error", "watcher", text, {})

    def publish_reply(self, reply) -> None:
        self.run.telemetry.emit(reply)

    def restate_operations(self, operations: dict[str, Any]) -> None:
        """From the control thread, never the training thread's step path."""
        if self.run.telemetry is not None:
            self.run.event("info", "operations_recent", "recent operations", operations)

    def stop_commanded(self, reason: str) -> None:
        """On rank 0's control thread, as a `stop` is queued: if the training thread is stuck and
        cannot apply it, the watch stops every rank (through the relay) and this one."""
        if self.run.watch is not None:
            said = reason if reason.startswith("stopped by user") else f"stopped by user: {reason}"
            self.run.watch.request_stop(said, only_if_stalled=True)

    def command_dump(self, command: Command, args) -> dict[str, Any]:
        run = self.run
        run.head.send_down(Downlink(action="dump", id=command.id))
        return {"directory": str(self.dump_directory()), "ranks": run.ctx.world_size,
                "flight_recorder": run.ctx.backend == "nccl"}

    def dump_directory(self) -> Path:
        return Path(self.run.cfg.log_dir or self.run.cfg.checkpoint_dir) / "dumps"

    def downlink(self, frame: bytes) -> None:
        """On this rank's telemetry thread: what rank 0 sent down."""
        run = self.run
        message = decode_downlink(frame)
        if message is None or run.watch is None:
            return
        if message.action == "stacks":
            run.telemetry.emit(run.watch.report("snapshot", request=message.id))
        elif message.action == "stop" and run.ctx.rank != 0:
            run.watch.request_stop(message.reason, only_if_stalled=True)
        elif message.action == "dump":
            self.write_dump()

    def write_dump(self) -> None:
        """This rank's ledger as JSON and, on NCCL, PyTorch's Flight Recorder buffer where its
        `fr_trace` analyser looks for it (`<dir>/nccl_trace_rank_<R>`)."""
        run = self.run
        rank = run.ctx.rank
        directory = self.dump_directory()
        try:
            ledger = {"rank": rank, "step": run.step, "host": socket.gethostname(),
                      "collectives": run.tracer.ledger_entries() if run.tracer is not None else [],
                      "wall_ts": time.time(), "perf_ns": time.perf_counter_ns()}  # places the ledger in `trace`
            files = {f"ledger-rank-{rank}.json": json.dumps(ledger).encode()}
            if run.ctx.backend == "nccl":
                from torch._C._distributed_c10d import _dump_nccl_trace

                files[f"nccl_trace_rank_{rank}"] = _dump_nccl_trace()
            safe_files.write_files(directory, files, what="dump folder")
            run.event("info", "dump", f"rank {rank} wrote its collective ledger to {directory}",
                      {"directory": str(directory)})
        except Exception as exc:  # a dump that fails is said, never fatal
            run.event("error", "dump", f"rank {rank} could not write its dump: {exc}")
