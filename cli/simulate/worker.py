"""A worker process of a simulated run, both ends of its pipe: its setup (keys included) goes
down its stdin, never in its argv or environment, which other users of the node can read; its
counters come back on its stdout, one JSON line each. It starts stepping on the parent's word, on
the same global step clock, ends with its ranks' Byes on the parent's word, and dies with the
parent (PR_SET_PDEATHSIG); its stdin's end stops it too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import zmq

from ringtop.cli.simulate.config import DRAIN_S, SimConfig, node_ranks
from ringtop.cli.simulate.ranks import SUBSCRIBE_WAIT_S, Where, raise_fd_limit
from ringtop.cli.simulate.stepping import Stepper
from ringtop.protocol import Bye, curve

WORKER_READY_S = 300.0
"""How long a worker may take to start its node relays and connect its ranks (thousands of CURVE
handshakes on a loaded machine)."""
WORKER_EXIT_S = 15.0
REPORT_EVERY_S = 0.1
"""A worker's counters reach the parent at most this often (and once at the end)."""
SWITCH_INTERVAL_S = 0.05
"""A worker's GIL hand-over interval (Python's default 5 ms): its node relays' and gatekeepers'
threads, hundreds at thousands of ranks, each forcing the publishing thread to yield at every
wake-up leave it a fraction of the CPU; they only move a few frames each time."""


class WorkerProcess:
    """The parent's side of a worker."""

    def __init__(self, index: int, setup: dict[str, Any]) -> None:
        from ringtop.agent.lifecycle import exit_with_parent

        self.index = index
        self.report: dict[str, Any] = {}
        self.ready = threading.Event()
        self.final = threading.Event()
        self.started = False
        self.proc = subprocess.Popen([sys.executable, "-c", "from ringtop.cli.simulate.worker import worker_main; "
                                      "worker_main()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     preexec_fn=lambda: exit_with_parent(signal.SIGKILL))
        self._reader = threading.Thread(target=self._read, name=f"ringtop-sim-worker-{index}", daemon=True)
        self._reader.start()
        self.tell(setup)

    def tell(self, message: dict[str, Any]) -> None:
        if message.get("go") is not None:
            self.started = True
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # it has ended: its exit status says so

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                report = json.loads(line)
            except ValueError:
                continue
            if report.get("ready"):
                self.ready.set()
            else:
                self.report = report
                if report.get("final"):
                    self.final.set()

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass

    def wait_or_kill(self, timeout_s: float) -> None:
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._reader.join(5)
        self.proc.stdout.close()


class WorkerPool:
    """The parent's workers together: started with their setups, told the same word, waited for."""

    def __init__(self) -> None:
        self.workers: list[WorkerProcess] = []

    def __len__(self) -> int:
        return len(self.workers)

    def start(self, setup: dict[str, Any]) -> None:
        """One more worker; it connects its ranks meanwhile."""
        self.workers.append(WorkerProcess(len(self.workers) + 1, setup))

    def tell(self, message: dict[str, Any]) -> None:
        for worker in self.workers:
            worker.tell(message)

    def counts(self) -> dict[str, int]:
        """The workers' latest counters, summed."""
        out = {"sent": 0, "send_drops": 0, "lost": 0}
        for worker in self.workers:
            for key in out:
                out[key] += worker.report.get(key, 0)
        return out

    def steps(self, started_only: bool = False) -> list[int]:
        """Each worker's last step published (`started_only`: of those told to go)."""
        return [w.report.get("step", 0) for w in self.workers if w.started or not started_only]

    def await_ready(self, stop: threading.Event) -> None:
        deadline = time.monotonic() + WORKER_READY_S
        for worker in self.workers:
            while not worker.ready.wait(0.05):
                if stop.is_set():
                    return
                if worker.proc.poll() is not None:
                    raise RuntimeError(f"simulator worker {worker.index} exited with {worker.proc.returncode} "
                                       "before its ranks were connected (its stderr says why)")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"simulator worker {worker.index} did not connect its ranks within "
                                       f"{WORKER_READY_S:g} s")

    def await_final(self) -> None:
        """Each worker's last counts: its ranks' Byes handed to its node relays, and forwarded by them."""
        deadline = time.monotonic() + DRAIN_S
        for worker in self.workers:
            while not worker.final.wait(0.05) and worker.proc.poll() is None and time.monotonic() < deadline:
                pass

    def close(self) -> None:
        """Their stdin's end: each stops its node relays and exits (killed if it does not)."""
        for worker in self.workers:
            worker.close()
        for worker in self.workers:
            worker.wait_or_kill(WORKER_EXIT_S)


class Worker(Stepper):
    """A worker process's side: its share of the nodes, each with a real NodeRelay to the head
    relay, and their ranks publishing to it over loopback with their own keys (with
    --rank-procs: its share of the ranks, straight to the head relay)."""

    def __init__(self, setup: dict[str, Any], out) -> None:
        super().__init__(SimConfig(**setup["cfg"]), setup["cfg"]["run_id"])
        self.setup = setup
        self.out = out
        self.publish_address, self.control_address = setup["publish"], setup["control"]
        self.go = threading.Event()
        self.closed = threading.Event()
        self._go: dict[str, Any] = {}
        self._stop_at: int | None = None
        self.node_relays: list[Any] = []
        self._reported_at = 0.0
        self._rank_keys = {int(r): pair for r, pair in setup["rank_keys"].items()}

    def _listen(self, stdin) -> None:
        """The parent's word: go (the clock's start), stop (at which step); its end stops everything."""
        for line in stdin:
            message = json.loads(line)
            if "go" in message:
                self._go = message
                self.go.set()
            elif "stop" in message:
                self._stop_at = int(message["stop"])
                self.stop.set()
        self.closed.set()
        self.stop.set()

    def _final_step(self) -> int | None:
        if not self.stop.is_set():
            return None
        return self._stop_at if self._stop_at is not None else self.step

    def _after_step(self, started: float) -> None:
        if time.monotonic() - self._reported_at >= REPORT_EVERY_S:
            self._report()

    def _report(self, **extra: Any) -> None:
        self._reported_at = time.monotonic()
        lost = sum(r.lost for r in self.node_relays)
        line = {"step": self.step, "sent": self.sent, "send_drops": self.send_drops, "lost": lost, **extra}
        self.out.write(json.dumps(line) + "\n")
        self.out.flush()

    def _start_node_relays(self) -> dict[int, Any]:
        """Each of its nodes' relay, started; rank -> the relay it publishes to."""
        from ringtop.agent.transport.node_relay import NodeRelay

        setup, where = self.setup, {}
        for node in setup["nodes"]:
            public, secret = setup["node_keys"][str(node)]
            members = list(node_ranks(self.cfg.ranks, self.cfg.nodes)[node])
            relay = NodeRelay(setup["relay"], curve.ClientKeys(server_public=setup["server_public"],
                                                               client_public=public, client_secret=secret),
                              members, {r: self._rank_keys[r][0] for r in members}, run_id=self.run_id,
                              world_size=self.cfg.ranks)
            relay.start()
            self.node_relays.append(relay)
            where.update({r: relay for r in members})
        return where

    def _where(self, relays: dict[int, Any]) -> Where:
        setup = self.setup
        if self.cfg.rank_procs:  # straight to the head relay, each rank with its own keys
            def to(r):
                public, secret = self._rank_keys[r]
                return setup["relay"], curve.ClientKeys(server_public=setup["server_public"],
                                                        client_public=public, client_secret=secret)
        else:
            def to(r):
                return relays[r].address, relays[r].client_keys(*self._rank_keys[r])
        return to

    def run_worker(self, stdin) -> None:
        ranks = sorted(self._rank_keys)
        raise_fd_limit(len(ranks) * 6 + len(self.setup["nodes"]) * 32 + 256)
        threading.Thread(target=self._listen, args=(stdin,), name="ringtop-sim-parent", daemon=True).start()
        ctx = zmq.Context(io_threads=2)
        ctx.set(zmq.MAX_SOCKETS, len(ranks) + 64)
        try:
            self.ranks.connect_all(ctx, ranks, self._where(self._start_node_relays()))
            if not self._ready():
                return
            self._t0 = time.monotonic() + (self._go["go"] - time.time())
            self._say_hello(self._go["started"])
            self._loop(time.monotonic())
            self.ranks.send_all(lambda rank: Bye(reason="the simulation ended", step=self.step, ok=True))
            self._await_taken()
            self._report(final=True)
            self.closed.wait(DRAIN_S + WORKER_EXIT_S)  # the parent closes once the head has them all
        finally:
            self.ranks.close()
            ctx.term()
            for relay in self.node_relays:
                relay.stop()

    def _ready(self) -> bool:
        """Its node relays up, said so to the parent, and the parent's go received (False: stopped first)."""
        deadline = time.monotonic() + SUBSCRIBE_WAIT_S
        while not all(r.head_up for r in self.node_relays) and not self.stop.is_set():
            if time.monotonic() > deadline:
                raise RuntimeError("a node relay never reached the head relay")
            self.stop.wait(0.02)
        self.out.write(json.dumps({"ready": True}) + "\n")
        self.out.flush()
        while not self.go.wait(0.05):
            if self.stop.is_set():
                return False
        return True

    def _await_taken(self) -> None:
        """Every message its ranks sent handed on by their node relays (the Byes last). Ranks
        straight to the head: their sockets stay open until the parent, which counts what the head
        forwarded, closes this worker's stdin."""
        if not self.node_relays:
            return
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline and not self.closed.is_set():
            if sum(r.forwarded + r.dropped + r.lost for r in self.node_relays) >= self.sent:
                return
            time.sleep(0.01)


def worker_main() -> None:
    """A worker process (`WorkerProcess` starts it): dies with its parent; Ctrl-C and SIGTERM are
    the parent's to handle (it tells the workers to end, with their ranks' Byes)."""
    from ringtop.agent.lifecycle import exit_with_parent

    exit_with_parent(signal.SIGKILL)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # only the reports go to the parent's pipe
    stdin = sys.stdin.buffer
    setup = json.loads(stdin.readline() or "null")
    if setup is None or os.getppid() != setup["parent"]:
        return  # the parent is gone already
    try:
        Worker(setup, out).run_worker(stdin)
    except Exception as exc:
        print(f"ringtop simulate: worker of nodes {setup['nodes'][0]}-{setup['nodes'][-1]} failed: {exc}",
              file=sys.stderr)
        sys.exit(1)
