"""The watcher of a node other than the head's: its node relay (agent/transport/node_relay.py),
out of the node's first rank, so that rank's death leaves its node's other ranks their way to the
head, and the witness's word of how it ended goes up with them (the head takes a RankExit from a
node relay only for a rank that relay carries). A node relay that ends while the run goes on is
started again in its place here, as its rank did before."""

from __future__ import annotations

from typing import Any

from ringtop.agent.transport.node_relay import NodeRelay
from ringtop.agent.watcher.process import Watcher
from ringtop.agent.watcher.wire import Call, Ready, Say, Setup


class NodeWatcher(Watcher):
    def __init__(self, setup: Setup, out_fd: int) -> None:
        super().__init__(setup, out_fd)
        self.leader = min(setup.ranks)
        self.relay = NodeRelay(setup.head_relay, setup.node_keys, setup.ranks, setup.rank_public or None,
                               run_id=setup.run_id, world_size=setup.world_size, on_event=self._relay_event,
                               observers=[self.witness.observe])
        self._stopping = False

    def start_services(self) -> Ready:
        self.relay.start()
        return Ready(relay=self.relay.address, server_public=self.relay.server_public)

    def stop_services(self, drain_s: float) -> None:
        self._stopping = True
        self.relay.stop(max(drain_s, 0.5))

    def publish(self, msg: Any, keep: bytes | None = None) -> None:
        self.relay.publish_own(msg)

    def answer(self, call: Call) -> Any:
        if call.op == "kill_relay":  # --inject-node-relay-death
            self.relay.kill()
        return None

    def tend(self) -> None:
        """A node relay that ended while the run goes on, started again on its address and keys
        (its ranks reconnect by themselves); said as its rank said it before."""
        relay = self.relay
        if self._stopping or relay.is_alive() or relay.stopping:
            return
        successor = relay.successor()
        if successor is None:
            return  # its port is not free yet: at the next look
        relay.stop(0)  # its gatekeeper: the thread has ended
        successor.start()
        self.relay = successor
        self._relay_event("warn", f"the node relay of ranks {relay.ranks_text} ended; started again in its place",
                          {"state": "restarted", "ranks": sorted(relay.ranks), "lost_total": relay.lost})

    def _relay_event(self, level: str, text: str, data: dict) -> None:
        """The node relay's words (the head lost, found again, itself restarted), sent by the
        node's first rank as its `relay` event while it lives."""
        if self._link_open:
            self._send(Say(level=level, kind="relay", text=text, data=data))
