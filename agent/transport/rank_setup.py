"""Before any rank connects: rank 0's actual addresses and every rank's own key pair, told to all
ranks over the control group; on several nodes, each node's relay started by its first rank and
told to its node's ranks (they publish there, over loopback, instead of to rank 0's relay)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from ringtop.agent.config import ConfigError
from ringtop.agent.control.channel import all_gather_fixed, broadcast_bytes, scatter_fixed
from ringtop.agent.transport.node_relay import NodeLayout, NodeRelay
from ringtop.protocol import Endpoints, curve
from ringtop.protocol.endpoints import is_loopback, parse_tcp

KEY_PAIR_BYTES = 80
"""A rank's public and secret key, 40 Z85 characters each."""
NODE_RELAY_BYTES = 256
"""A node relay's address and public key, as its leader tells every rank."""


class RankSetup(msgspec.Struct, frozen=True):
    """What rank 0 tells every rank before they connect ("" server key: --insecure)."""

    endpoints: Endpoints
    server_public: str
    rank_public: list[str] = []
    """Every rank's public key, on several nodes: what each node relay admits."""


def _pair(raw: bytes, server_public: str) -> curve.ClientKeys:
    return curve.ClientKeys(server_public=server_public, client_public=raw[:40].decode(),
                            client_secret=raw[40:].decode())


def share_setup(rank: int, world_size: int, group: Any, endpoints: Endpoints, keys: curve.RunKeys | None,
                multi: bool) -> tuple[Endpoints, curve.ClientKeys | None, list[str]]:
    """Collective. Rank 0's actual addresses (a taken default port moved) on every rank, and each
    rank's own key pair to publish with (scattered: a rank learns only its own secret). On several
    nodes also every rank's public key (for the node relays). `keys`, `endpoints`: rank 0's."""
    mine = keys.for_rank(0) if keys is not None else None
    if group is None:
        return endpoints, mine, []
    setup = RankSetup(endpoints=endpoints, server_public=keys.server_public if keys else "",
                      rank_public=list(keys.rank_public) if keys is not None and multi else [])
    payload = msgspec.msgpack.encode(setup) if rank == 0 else b""
    setup = msgspec.msgpack.decode(broadcast_bytes(payload, rank, group), type=RankSetup)
    if not setup.server_public:
        return setup.endpoints, None, []
    pairs = [(keys.rank_public[r] + keys.rank_secret[r]).encode() for r in range(world_size)] if rank == 0 else []
    pair = scatter_fixed(pairs, KEY_PAIR_BYTES, rank, group)
    return setup.endpoints, _pair(pair, setup.server_public), setup.rank_public


def start_node_relay(rank: int, world_size: int, group: Any, layout: NodeLayout, head_relay: str, run_id: str,
                     keys: curve.RunKeys | None, rank_keys: curve.ClientKeys | None,
                     rank_public: list[str], watcher: bool = False,
                     on_lost: Callable[[str], None] | None = None) -> Any:
    """Collective, on several nodes: each node's first rank starts its node relay, with the node
    key rank 0 scatters it: in the node's watcher process (`watcher`: agent/watcher/node.py; its
    link stands for the relay, `on_lost` told if it dies), else as a thread of this rank. The
    relay (or link) this rank started (None: it leads no node)."""
    node_keys = None
    if rank_keys is not None:
        pairs = [b"\0" * KEY_PAIR_BYTES] * world_size
        if rank == 0:
            for k, ranks in enumerate(layout.nodes[1:]):
                pairs[ranks[0]] = (keys.node_public[k] + keys.node_secret[k]).encode()
        pair = scatter_fixed(pairs if rank == 0 else [], KEY_PAIR_BYTES, rank, group)
        if layout.leads(rank):
            node_keys = _pair(pair, rank_keys.server_public)
    if not layout.leads(rank):
        return None
    ranks = layout.nodes[layout.node_of(rank)]
    admitted = {r: rank_public[r] for r in ranks} if rank_keys is not None else None
    if watcher:
        from ringtop.agent.watcher.link import WatcherLink
        from ringtop.agent.watcher.wire import Setup

        setup = Setup(role="node", run_id=run_id, world_size=world_size, head_relay=head_relay, node_keys=node_keys,
                      ranks=list(ranks), rank_public=admitted or {})
        return WatcherLink.spawn(setup, None, None, on_lost or (lambda why: None))
    node_relay = NodeRelay(head_relay, node_keys, ranks, admitted, run_id=run_id, world_size=world_size)
    node_relay.start()
    return node_relay


def node_relay_address(rank: int, world_size: int, group: Any, layout: NodeLayout, node_relay: NodeRelay | None,
                       head_relay: str, rank_keys: curve.ClientKeys | None) -> tuple[str, curve.ClientKeys | None]:
    """Collective: every node leader tells every rank where its relay is. (address, keys) this
    rank publishes with: a rank off the head's node, to its node's relay over loopback."""
    told = f"{node_relay.address} {node_relay.server_public}".encode() if node_relay is not None else b""
    everyone = all_gather_fixed(told, NODE_RELAY_BYTES, world_size, group)
    node = layout.node_of(rank)
    if node == 0:
        return head_relay, rank_keys
    address, _, server_public = everyone[layout.nodes[node][0]].decode().partition(" ")
    if rank_keys is None:
        return address, None
    return address, curve.ClientKeys(server_public=server_public, client_public=rank_keys.client_public,
                                     client_secret=rank_keys.client_secret)


def restarted(relay: Any) -> NodeRelay | None:
    """Once a step, on a node relay's rank: one that ended while the run goes on is started again
    in its place (its ranks reconnect by themselves); None: it runs, or its port is not free yet,
    or it runs in the node's watcher, which does this itself. Binding a socket: microseconds."""
    if not isinstance(relay, NodeRelay) or relay.is_alive() or relay.stopping:
        return None
    successor = relay.successor()
    if successor is None:
        return None
    relay.stop(0)  # its gatekeeper: the thread has ended
    successor.start()
    return successor


def check_head_reachable(layout: NodeLayout, relay: str, telemetry: bool) -> None:
    """On several nodes the other nodes' relays must reach rank 0's: same check on every rank
    (same arguments), before any of them waits for another. `relay`: the --relay address."""
    if not (layout.multi and telemetry):
        return
    host, _ = parse_tcp(relay)
    if is_loopback(host) or host in ("0.0.0.0", "::", "*"):
        raise ConfigError(f"this run spans {len(layout.nodes)} nodes: the other nodes' relays must reach "
                          f"rank 0's relay, which --relay {relay} does not. Pass --relay "
                          "tcp://ADDRESS:PORT with rank 0's node's address on the network between the nodes, "
                          "and --allow-remote")
