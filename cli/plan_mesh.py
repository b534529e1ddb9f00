"""`ringtop plan --tp T --pp P --dp D`: a TP x PP x DP layout from metrics/costs/mesh_cost.py — memory
per rank, bytes and time per step in each dimension on its own link, the bubble, and where TP's
groups land on the nodes. Torch-free, like the rest of `ringtop plan`."""

from __future__ import annotations

import argparse
import math

from ringtop.metrics import fmt
from ringtop.metrics.costs.cost_model import ModelSpec
from ringtop.metrics.costs.links import Link, parse_link
from ringtop.metrics.costs.mesh_cost import DP_STRATEGIES, Shape, assumed_shape, mesh_cost
from ringtop.metrics.parallel_dims import ParallelDims

MAX_DEGREE = 1 << 16
MAX_SHAPE = 1 << 24


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tensor / 3D parallelism (any of --tp, --dp: the ranks are tp x pp x dp)")
    g.add_argument("--tp", type=int, default=None, help="tensor-parallel degree")
    g.add_argument("--dp", type=int, default=None, help="data-parallel degree")
    g.add_argument("--dp-strategy", default="ddp",
                   help=f"what the data-parallel groups run: {', '.join(DP_STRATEGIES)} (default %(default)s)")
    g.add_argument("--link-tp", default=None, help="link of the TP groups (default: --link)")
    g.add_argument("--link-pp", default=None, help="link between pipeline stages (default: --link-dp)")
    g.add_argument("--link-dp", default="ib-ndr", help="link of the DP groups (default %(default)s)")
    g.add_argument("--gpus-per-node", type=int, default=8, help="ranks per node (default %(default)s)")
    g.add_argument("--layers", type=int, default=None,
                   help="transformer layers (default: a dense decoder's of --params)")
    g.add_argument("--hidden", type=int, default=None, help="hidden size (default: a dense decoder's of --params)")


def wanted(args: argparse.Namespace) -> bool:
    return args.tp is not None or args.dp is not None


def mesh_ranks(args: argparse.Namespace) -> int:
    """tp x pp x dp, each bounded."""
    tp, pp, dp = (_bounded(v, flag, MAX_DEGREE) or 1 for v, flag in
                  ((args.tp, "--tp"), (args.pp_stages, "--pp"), (args.dp, "--dp")))
    return ParallelDims(tp=tp, pp=pp, dp=dp).world


def _link(text: str, flag: str) -> Link:
    try:
        return parse_link(text)
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None


def _bounded(value: int | None, flag: str, most: int) -> int | None:
    if value is not None and not 1 <= value <= most:
        raise ValueError(f"{flag} must be between 1 and {most:,}, got {value}")
    return value


DEFAULT_SEQ_LEN = 4096


def mesh_plan(args: argparse.Namespace, params: int, model: ModelSpec, link: Link, facts=None) -> dict:
    """The layout's figures as plain data (the `mesh` part of `ringtop plan --json`). `facts`: the
    `--model`'s definition (its layers and hidden size), else they are --layers / --hidden or
    assumed from --params. A replica takes --batch-size sequences per step in --micro-batches."""
    tp = _bounded(args.tp, "--tp", MAX_DEGREE) or 1
    dp = _bounded(args.dp, "--dp", MAX_DEGREE) or 1
    pp = _bounded(args.pp_stages, "--pp", MAX_DEGREE) or 1
    per_node = _bounded(args.gpus_per_node, "--gpus-per-node", MAX_DEGREE)
    for flag, value in (("--layers", args.layers), ("--hidden", args.hidden), ("--seq-len", args.seq_len)):
        _bounded(value, flag, MAX_SHAPE)
    micro_batches = args.micro_batches or 1
    if args.batch_size % micro_batches:
        raise ValueError(f"--micro-batches {micro_batches} must divide --batch-size {args.batch_size}")
    mesh = ParallelDims(tp=tp, pp=pp, dp=dp)
    if args.ranks is not None and args.ranks != mesh.world:
        raise ValueError(f"--ranks {args.ranks} is not tp x pp x dp = {tp} x {pp} x {dp} = {mesh.world}")
    if facts is not None:
        guessed, source = (facts.layers, facts.hidden), args.model
    else:
        guessed, source = assumed_shape(params), None
    layers, hidden = args.layers or guessed[0], args.hidden or guessed[1]
    shape = Shape(layers, hidden, args.seq_len or DEFAULT_SEQ_LEN, args.batch_size // micro_batches, micro_batches,
                  model.param_bytes)
    link_tp = _link(args.link_tp, "--link-tp") if args.link_tp else link
    link_dp = _link(args.link_dp, "--link-dp")
    link_pp = _link(args.link_pp, "--link-pp") if args.link_pp else link_dp
    cost = mesh_cost(model, mesh, shape, dp_strategy=args.dp_strategy, link_tp=link_tp, link_pp=link_pp,
                     link_dp=link_dp)
    tp_group = cost.group("tp")
    across_s = tp_group.comm.sent_bytes / link_dp.per_direction_bytes_per_s
    return {
        "tp": tp, "pp": pp, "dp": dp, "ranks": mesh.world, "dp_strategy": cost.dp_strategy,
        "gpus_per_node": per_node, "nodes": math.ceil(mesh.world / per_node),
        "tp_within_node": tp <= per_node and per_node % tp == 0,
        "shape": {"layers": layers, "hidden": hidden, "seq_len": shape.seq_len,
                  "micro_batch_size": shape.micro_batch_size, "micro_batches": shape.micro_batches,
                  "activation_bytes": shape.activation_bytes,
                  "assumed": [] if source else [k for k, v in (("layers", args.layers), ("hidden", args.hidden))
                                                if v is None]},
        "layers_per_stage": cost.layers_per_stage,
        "memory": {"params_bytes": cost.memory.params_bytes, "grads_bytes": cost.memory.grads_bytes,
                   "optimizer_bytes": cost.memory.optimizer_bytes, "total_bytes": cost.memory.total_bytes},
        "groups": {g.dimension: {
            "ranks": g.ranks, "link": g.link.name, "per_direction_gbps": g.link.per_direction_gbps,
            "by_kind": {k: {"payload_bytes": c.payload_bytes, "sent_bytes": c.sent_bytes}
                        for k, c in g.comm.by_kind().items()},
            "sent_bytes": g.comm.sent_bytes, "comm_s": g.seconds} for g in cost.groups},
        "tp_comm_s_across_nodes": across_s,
        "bubble_fraction": cost.bubble_fraction,
    }


def render(mesh: dict) -> list[str]:
    s, groups = mesh["shape"], mesh["groups"]
    assumed = f" ({' and '.join(s['assumed'])} assumed from --params: a dense decoder's)" if s["assumed"] else ""
    lines = [
        "",
        f"3D layout: TP {mesh['tp']} x PP {mesh['pp']} x DP {mesh['dp']} = {mesh['ranks']} ranks on "
        f"{mesh['nodes']} node(s) of {mesh['gpus_per_node']}; data-parallel groups run {mesh['dp_strategy']}",
        f"  model: {s['layers']} layers x hidden {s['hidden']}{assumed}, {mesh['layers_per_stage']} layers per stage; "
        f"micro-batch {s['micro_batch_size']} x {s['seq_len']} tokens, {s['micro_batches']} per step",
        "",
        "Memory per rank: params / (TP x PP), then the DP strategy's sharding (params+grads in --dtype, "
        "optimizer as the header's textbook model says):",
        f"  params {fmt.nbytes(mesh['memory']['params_bytes'])}  grads {fmt.nbytes(mesh['memory']['grads_bytes'])}  "
        f"optimizer {fmt.nbytes(mesh['memory']['optimizer_bytes'])}  total {fmt.nbytes(mesh['memory']['total_bytes'])}",
        "",
        "Communication per rank per step, by group:",
    ]
    what = {"tp": "all-reduce of the activations, 2 per layer in forward and 2 in backward, per micro-batch",
            "pp": "activations to the next stage and their gradients back, per micro-batch",
            "dp": "the DP strategy's gradient (and parameter) traffic over its shard"}
    rows = []
    for dim in ("tp", "pp", "dp"):
        g = groups[dim]
        rows.append([dim, str(g["ranks"]), g["link"], fmt.nbytes(g["sent_bytes"]), fmt.seconds(g["comm_s"]),
                     what[dim] if g["sent_bytes"] else "-"])
    widths = [max(len(r[i]) for r in [["group", "ranks", "link", "sent", "comm s", ""], *rows]) for i in range(6)]
    for r in [["group", "ranks", "link", "sent", "comm s", "what"], *rows]:
        lines.append("  " + "  ".join(c.ljust(w) if i in (0, 2, 5) else c.rjust(w)
                                      for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    tp, dp = groups["tp"], groups["dp"]
    if mesh["tp"] > 1:
        slower = mesh["tp_comm_s_across_nodes"] / tp["comm_s"] if tp["comm_s"] else math.inf
        verdict = (f"TP stays inside the node: its {fmt.nbytes(tp['sent_bytes'])} per step take "
                   f"{fmt.seconds(tp['comm_s'])} s on {tp['link']} and would take "
                   f"{fmt.seconds(mesh['tp_comm_s_across_nodes'])} s across nodes on {dp['link']} "
                   f"({slower:.1f}x), on the critical path of every layer; DP moves "
                   f"{fmt.nbytes(dp['sent_bytes'])} once per step and PP "
                   f"{fmt.nbytes(groups['pp']['sent_bytes'])}, which the slower link carries.")
        if not mesh["tp_within_node"]:
            verdict = (f"warning: TP {mesh['tp']} does not fit in a node of {mesh['gpus_per_node']}: its "
                       f"all-reduces cross the node link, {fmt.seconds(mesh['tp_comm_s_across_nodes'])} s per step "
                       f"on {dp['link']} instead of {fmt.seconds(tp['comm_s'])} s on {tp['link']}.")
        lines += ["", verdict]
    if mesh["pp"] > 1:
        lines.append(f"Pipeline bubble (PP-1)/(PP+M-1) = {100 * mesh['bubble_fraction']:.1f} % with "
                     f"{s['micro_batches']} micro-batches (--micro-batches raises M).")
    return lines
