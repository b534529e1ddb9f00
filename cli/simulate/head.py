"""Rank 0's services for a simulated run: the agent's own `Head` (agent/head/), started as the
runner starts it, with the run's keys, node relay k carrying node k + 1's ranks, and a control
server that answers `status` only."""

from __future__ import annotations

from typing import Any, Callable

from ringtop.cli.simulate.config import SimConfig, node_ranks
from ringtop.protocol import Endpoints, curve


def start_head(cfg: SimConfig, run_id: str, keys: curve.RunKeys, snapshot: Callable[[], dict[str, Any]],
               on_event: Callable[..., None], publish_reply: Callable[[Any], None]):
    """Bound and started (stopped again if it fails half-way). `on_event(level, kind, text,
    data)`: the Head's, `data` a dict or the hang watch's typed report."""
    from ringtop.agent.head import Head  # torch: only the simulator pays for it
    from ringtop.agent.transport.gatekeeper import node_user
    from ringtop.agent.transport.node_relay import NodeLayout
    from ringtop.protocol import DEFAULT_CONTROL_ADDRESS, DEFAULT_PUBLISH_ADDRESS, DEFAULT_RELAY_ADDRESS

    carriers = None
    if cfg.node_relays:  # node relay k carries node k + 1's ranks, as `ringtop run` lets it
        carriers = NodeLayout(tuple(tuple(r) for r in node_ranks(cfg.ranks, cfg.nodes))).carriers(node_user)
    endpoints = Endpoints(publish=cfg.publish or DEFAULT_PUBLISH_ADDRESS, relay=cfg.relay or DEFAULT_RELAY_ADDRESS,
                          control=cfg.control or DEFAULT_CONTROL_ADDRESS)
    head = Head(endpoints, run_id=run_id, world_size=cfg.ranks, keys=keys, on_event=on_event, snapshot=snapshot,
                publish_reply=publish_reply,
                movable=[name for name in ("relay", "publish", "control") if not getattr(cfg, name)],
                carriers=carriers, immediate={"stacks": _not_simulated, "dump": _not_simulated})
    try:
        head.start()
    except BaseException:
        head.stop()
        raise
    return head


def answer_queued_commands(head: Any) -> None:
    """Every command that waits for a step boundary: refused, a simulated run only answers status."""
    for pending in head.control.take_pending():
        head.control.reply(pending.command, "error", error="a simulated run: only status is answered",
                           code="failed")


def _not_simulated(command, args):
    raise RuntimeError(f"a simulated run: {command.cmd!r} is not available (only status is answered)")
