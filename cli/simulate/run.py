"""The simulated run as the parent process runs it: rank 0's services, this process's ranks, the
workers holding the others, the status file, and the end with every rank's Bye."""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import deque
from typing import Any, Callable

import zmq

from ringtop.cli.simulate.config import DRAIN_S, SimConfig, SimResult, node_ranks, process_shares
from ringtop.cli.simulate.head import answer_queued_commands, start_head
from ringtop.cli.simulate.ranks import raise_fd_limit
from ringtop.cli.simulate.stepping import Stepper
from ringtop.cli.simulate.worker import WorkerPool
from ringtop.metrics.timing import status_step_ms
from ringtop.protocol import Bye, Event, HangReport, connection_file, curve
from ringtop.protocol.safe_files import write_output


class Simulation(Stepper):
    """One simulated run; `run()` does everything on the calling thread, which owns its ranks'
    sockets (and its workers), until `stop` is set or `--seconds` have passed, and ends with every
    rank's Bye."""

    def __init__(self, cfg: SimConfig, stop: threading.Event | None = None,
                 on_ready: Callable[[connection_file.ConnectionInfo], None] | None = None) -> None:
        cfg.validate()
        super().__init__(cfg, cfg.run_id or f"sim{random.Random().getrandbits(24):06x}", stop)
        self.on_ready = on_ready
        self.head = None
        self.workers = WorkerPool()
        self._rank0_out: deque[Any] = deque()
        """Rank 0's own messages from other threads (control replies, the hang watch's events)."""

    @property
    def relay(self):
        return self.head.relay if self.head else None

    def _rank0_event(self, level: str, kind: str, text: str, data: dict[str, Any] | HangReport) -> None:
        """From the head's threads (the hang watch's typed report, refused connections): sent by
        rank 0 on the publishing thread."""
        if isinstance(data, HangReport):
            event = Event(level=level, kind=kind, text=text, step=self.step, hang=data)
        else:
            event = Event(level=level, kind=kind, text=text, step=self.step, data=data)
        self._rank0_out.append(event)

    def _snapshot(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "step": self.step, "steps": self.scenario.total_steps(), "strategy": "ddp",
                "world_size": self.cfg.ranks, "loss": self.last_loss, **status_step_ms(self.step_window),
                "last_checkpoint": "", "refused_connections": self.head.refused_connections if self.head else 0,
                "simulated": True}

    def _flush_rank0(self) -> None:
        if 0 in self.ranks.socks:
            while self._rank0_out:
                self.ranks.send(0, self._rank0_out.popleft())

    def _counts(self) -> dict[str, int]:
        """This process's ranks' counters plus the workers' latest."""
        theirs = self.workers.counts()
        return {"sent": self.sent + theirs["sent"], "send_drops": self.send_drops + theirs["send_drops"],
                "lost": theirs["lost"]}

    def _status(self, started: float, final: bool = False) -> None:
        if not self.cfg.status_file:
            return
        relay = self.relay
        status = {"run_id": self.run_id, "step": self.step, "ts": time.time(), "elapsed_s": time.monotonic() - started,
                  **self._counts(), "forwarded": relay.forwarded, "dropped": relay.dropped,
                  "gaps": relay.gaps, "slowest_step": min([self.step, *self.workers.steps(started_only=True)]),
                  "procs": 1 + len(self.workers),
                  "final": final}
        write_output(self.cfg.status_file, json.dumps(status).encode())  # never through a planted link

    def _setup_of(self, keys: curve.RunKeys, share: list[int]) -> dict[str, Any]:
        """What the worker holding `share` (nodes, or with --rank-procs ranks) needs: its ranks' and
        nodes' keys only (on its stdin)."""
        if self.cfg.rank_procs:
            nodes, ranks = [], share
        else:
            nodes, ranks = share, [r for node in share for r in node_ranks(self.cfg.ranks, self.cfg.nodes)[node]]
        cfg = {k: v for k, v in vars(self.cfg).items() if k in ("ranks", "nodes", "hz", "straggler", "hang", "seconds",
                                                                "seed", "rank_procs")}
        return {"cfg": dict(cfg, run_id=self.run_id, procs=self.cfg.procs), "parent": os.getpid(),
                "relay": self.relay.relay_address, "publish": self.publish_address, "control": self.control_address,
                "server_public": keys.server_public, "nodes": nodes,
                "node_keys": {n: [keys.node_public[n - 1], keys.node_secret[n - 1]] for n in nodes},
                "rank_keys": {r: [keys.rank_public[r], keys.rank_secret[r]] for r in ranks}}

    def run(self) -> SimResult:
        cfg = self.cfg
        mine, shares = process_shares(cfg)
        raise_fd_limit((cfg.ranks if cfg.rank_procs else len(mine)) * 4 + cfg.nodes * 2 + 256)
        keys = curve.generate(cfg.ranks, cfg.nodes - 1 if cfg.node_relays else 0)
        ctx = zmq.Context(io_threads=2)
        ctx.set(zmq.MAX_SOCKETS, len(mine) + 64)
        started = time.monotonic()
        steps = 0
        try:
            self._start_head(keys)
            for share in shares:  # they connect theirs meanwhile
                self.workers.start(self._setup_of(keys, share))
            head = self.relay.relay_address
            self.ranks.connect_all(ctx, mine, lambda rank: (head, keys.for_rank(rank)))
            self.workers.await_ready(self.stop)
            if not self.stop.is_set():  # else stopped while connecting: no rank has said anything yet
                steps = self._step_to_the_end(started)
            self._status(started, final=True)
            counts = self._counts()
            return SimResult(run_id=self.run_id, steps=steps, sent=counts["sent"], send_drops=counts["send_drops"],
                             forwarded=self.relay.forwarded, dropped=self.relay.dropped,
                             seconds=time.monotonic() - started, refused=self.head.refused_connections,
                             lost=counts["lost"], gaps=self.relay.gaps, procs=cfg.processes)
        finally:
            self.workers.close()
            if self.head is not None:
                self.head.remove_connection_file()
            self.ranks.close()
            ctx.term()
            if self.head is not None:
                self.head.stop(DRAIN_S)  # the relay ends once nothing is left to forward

    def _start_head(self, keys: curve.RunKeys) -> None:
        self.head = start_head(self.cfg, self.run_id, keys, self._snapshot, self._rank0_event, self._rank0_out.append)
        self.publish_address, self.control_address = self.head.endpoints.publish, self.head.endpoints.control
        info = self.head.write_connection_file()
        if self.on_ready is not None:
            self.on_ready(info)

    def _step_to_the_end(self, started: float) -> int:
        """Hellos, steps until the end, Byes; the last step any process published."""
        process_started = time.time()
        t0_wall = process_started + 0.05  # every worker has it before step 1 is due
        self.workers.tell({"go": t0_wall, "started": process_started})
        self._t0 = time.monotonic() + (t0_wall - time.time())
        self._say_hello(process_started)
        self._loop(started)
        self.workers.tell({"stop": self.step})  # each publishes up to this step (if behind), then its Byes
        self._flush_rank0()  # before rank 0's Bye: a Bye is a rank's last message
        self.ranks.send_all(lambda rank: Bye(reason="the simulation ended", step=self.step, ok=True))
        self.workers.await_final()
        steps = max([self.step, *self.workers.steps()])
        self._await_forwarded()
        return steps

    def _await_forwarded(self, timeout_s: float = DRAIN_S) -> None:
        """The Byes through the relay before the sockets close (they are the ranks' last word)."""
        deadline = time.monotonic() + timeout_s
        seen, progress_at = -1, time.monotonic()
        while True:
            counts = self._counts()
            if self.relay.forwarded + self.relay.dropped + self.relay.skipped >= counts["sent"] - counts["lost"]:
                return
            if time.monotonic() >= deadline:
                return
            if self.relay.forwarded != seen:
                seen, progress_at = self.relay.forwarded, time.monotonic()
            elif time.monotonic() - progress_at > 2.0:
                return  # nothing moves: what is missing was lost on the way, waiting will not bring it
            time.sleep(0.02)

    def _final_step(self) -> int | None:
        """Here (rank 0's process) at once, when stopped or at --seconds; a worker at the step the
        parent tells it."""
        if self.stop.is_set() or (self.cfg.seconds and time.monotonic() >= self._end):
            return self.step
        return None

    def _after_step(self, started: float) -> None:
        self._status(started)

    def _between(self) -> None:
        if self.head is not None:
            answer_queued_commands(self.head)
        self._flush_rank0()
