"""`ringtop plan`: memory per rank, traffic and time per step of each strategy, from the cost model.

Torch-free: it runs where torch is not installed (a laptop planning a cluster).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import asdict

from ringtop.metrics import fmt
from ringtop.metrics.units import GB
from ringtop.strategies.cost_model import (
    ModelSpec,
    comm_overhead,
    comm_share_of_step,
    comm_time_s,
    gpipe_bubble_fraction,
    one_f_one_b_bubble_fraction,
    peak_in_flight_micro_batches,
    which_fit,
)
from ringtop.strategies.links import LINKS, Link, parse_link

from . import plan_mesh

KIND_COLUMNS = ("all_reduce", "reduce_scatter", "all_gather")
BUBBLE_TABLE_M = (1, 2, 4, 8, 16, 32)
_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


class PlanError(ValueError):
    """A bad input to `ringtop plan`; the CLI prints it and exits 2."""


def parse_count(text: str) -> int:
    """A parameter count: 7e9, 7600000000, 7.6B, 125M, 1.5T."""
    m = re.fullmatch(r"\s*([-+]?[0-9.]+(?:e[-+]?[0-9]+)?)\s*([kmbgt]?)\s*", text, re.IGNORECASE)
    try:
        value = float(m.group(1)) * _SUFFIX.get(m.group(2).lower(), 1) if m else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 1:
        raise PlanError(f"--params must be a positive number of parameters (e.g. 7e9 or 7B), got {text!r}")
    return round(value)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ringtop plan",
        description="Predict memory per rank and communication per step of each parallel strategy.",
        epilog="GB = 1e9 bytes. Comm time = bytes each rank sends / the link's per-direction bandwidth "
               "(half the bidirectional figure vendors quote); overhead = comm time / compute step. "
               "Links: " + "; ".join(f"{k}: {v.description}" for k, v in LINKS.items()) + ".")
    p.add_argument("--params", required=True, help="parameter count, e.g. 7e9 or 7.6B")
    p.add_argument("--ranks", type=int, default=None, help="number of ranks (GPUs); with --tp / --dp: tp x pp x dp")
    p.add_argument("--link", default="nvlink4",
                   help=f"{'|'.join(LINKS)} or a number of GB/s per direction (default %(default)s)")
    p.add_argument("--step-s", type=float, default=2.0,
                   help="compute time of one step in seconds (default %(default)s)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"),
                   help="dtype of parameters and gradients (default %(default)s)")
    p.add_argument("--optimizer-bytes", type=int, default=8,
                   help="optimizer state bytes per parameter: 8 = the chapter's 4x bf16 params (also fp32 "
                        "Adam's two moments), 12 = the ZeRO paper's mixed-precision Adam (default %(default)s)")
    p.add_argument("--pp-stages", "--pp", dest="pp_stages", type=int, default=None,
                   help="pipeline stages (adds a pp row and the bubble)")
    p.add_argument("--micro-batches", type=int, default=None, help="micro-batches per step (needs --pp-stages)")
    p.add_argument("--mem-gb", type=float, default=80.0, help="device memory per rank in GB (default %(default)s)")
    p.add_argument("--other-gb", type=float, default=0.0,
                   help="allowance per rank for activations, buffers and CUDA context in GB (default %(default)s)")
    p.add_argument("--backend", default="nccl", choices=("nccl", "gloo"),
                   help="gloo runs reduce-scatter as a full all-reduce: twice its wire bytes (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan_mesh.add_arguments(p)
    return p


def _validate(args: argparse.Namespace) -> tuple[int, Link]:
    params = parse_count(args.params)
    try:
        link = parse_link(args.link)
    except ValueError as exc:
        raise PlanError(f"--link: {exc}") from None
    if args.ranks is None:
        if not plan_mesh.wanted(args):
            raise PlanError("--ranks is required (or give the layout: --tp, --pp, --dp)")
        args.ranks = plan_mesh.mesh_ranks(args)
    if args.ranks < 1:
        raise PlanError(f"--ranks must be >= 1, got {args.ranks}")
    if not (args.step_s > 0 and math.isfinite(args.step_s)):
        raise PlanError(f"--step-s must be a positive number of seconds, got {args.step_s}")
    if args.optimizer_bytes < 0:
        raise PlanError(f"--optimizer-bytes must be >= 0, got {args.optimizer_bytes}")
    if not (args.mem_gb > 0 and math.isfinite(args.mem_gb)):
        raise PlanError(f"--mem-gb must be a positive number of GB, got {args.mem_gb}")
    if not (args.other_gb >= 0 and math.isfinite(args.other_gb)):
        raise PlanError(f"--other-gb must be >= 0, got {args.other_gb}")
    if args.micro_batches is not None and args.pp_stages is None:
        raise PlanError("--micro-batches needs --pp-stages (micro-batches only matter in a pipeline)")
    if args.pp_stages is not None:
        if args.pp_stages < 1:
            raise PlanError(f"--pp-stages must be >= 1, got {args.pp_stages}")
        if args.ranks % args.pp_stages and not plan_mesh.wanted(args):
            raise PlanError(f"--ranks ({args.ranks}) must be a multiple of --pp-stages ({args.pp_stages}): "
                            "the pp row puts ranks/stages data-parallel copies of each stage")
    if args.micro_batches is not None and args.micro_batches < 1:
        raise PlanError(f"--micro-batches must be >= 1, got {args.micro_batches}")
    return params, link


def make_plan(args: argparse.Namespace) -> dict:
    """The plan as plain data (what --json prints and the table renders)."""
    params, link = _validate(args)
    model = ModelSpec.from_dtype(params, args.dtype, args.optimizer_bytes)
    stages = args.pp_stages or 1
    capacity = args.mem_gb * GB
    other = args.other_gb * GB
    rows = []
    for fit in which_fit(model, args.ranks, capacity, other, pp_stages=stages,
                         gloo_reduce_scatter_as_all_reduce=args.backend == "gloo"):
        cost = fit.cost
        t = comm_time_s(cost.comm.sent_bytes, link)
        rows.append({
            "strategy": cost.strategy,
            "memory": {**asdict(cost.memory), "total_bytes": cost.memory.total_bytes},
            "fits": fit.fits,
            "need_bytes": fit.need_bytes,
            "headroom_bytes": fit.headroom_bytes,
            "comm": {
                "by_kind": {k: {"payload_bytes": c.payload_bytes, "sent_bytes": c.sent_bytes}
                            for k, c in cost.comm.by_kind().items()},
                "sent_bytes": cost.comm.sent_bytes,
            },
            "comm_s": t,
            "comm_overhead": comm_overhead(t, args.step_s),
            "comm_share_of_step": comm_share_of_step(t, args.step_s),
        })
    pipeline = None
    if args.pp_stages is not None:
        m = args.micro_batches or 1
        pipeline = {
            "stages": stages,
            "micro_batches": m,
            "data_parallel": args.ranks // stages,
            "gpipe_bubble_fraction": gpipe_bubble_fraction(stages, m),
            "one_f_one_b_bubble_fraction": one_f_one_b_bubble_fraction(stages, m),
            "peak_in_flight_micro_batches": {"gpipe": peak_in_flight_micro_batches("gpipe", stages, m),
                                             "1f1b": peak_in_flight_micro_batches("1f1b", stages, m)},
            "bubble_by_micro_batches": {str(mm): gpipe_bubble_fraction(stages, mm)
                                        for mm in sorted({*BUBBLE_TABLE_M, m})},
        }
    mesh = plan_mesh.mesh_plan(args, params, model, link) if plan_mesh.wanted(args) else None
    return {
        "model": {**asdict(model), "dtype": args.dtype},
        "ranks": args.ranks,
        "link": {"name": link.name, "per_direction_gbps": link.per_direction_gbps,
                 "bidirectional_gbps": link.bidirectional_gbps, "description": link.description},
        "backend": args.backend,
        "compute_step_s": args.step_s,
        "mem_capacity_bytes": round(capacity),
        "other_bytes": round(other),
        "units": {"GB": 1e9},
        "conventions": {
            "comm_s": "bytes each rank sends / link per-direction bandwidth (bidirectional / 2)",
            "comm_overhead": "comm_s / compute_step_s",
            "comm_share_of_step": "comm_s / (compute_step_s + comm_s)",
            "payload_bytes": "full logical tensor per collective (nccl-tests size); sent = payload x busbw factor",
        },
        "strategies": rows,
        "pipeline": pipeline,
        "mesh": mesh,
    }


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(row: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def render_table(plan: dict) -> str:
    m, link = plan["model"], plan["link"]
    mem_gb = plan["mem_capacity_bytes"] / GB
    lines = [
        f"ringtop plan: {m['params']:,} params ({m['params'] / 1e9:.2f} B), {plan['ranks']} ranks, "
        f"{m['dtype']} params+grads ({m['param_bytes']}+{m['grad_bytes']} bytes/param), "
        f"optimizer {m['optimizer_bytes_per_param']} bytes/param",
        f"link {link['name']}: {link['per_direction_gbps']:g} GB/s per direction "
        f"({link['bidirectional_gbps']:g} GB/s bidirectional); compute step {plan['compute_step_s']:g} s; "
        f"backend {plan['backend']}",
        "GB = 1e9 bytes. Comm time = bytes each rank sends / per-direction bandwidth; overhead = comm / compute step.",
    ]
    if plan["mesh"]:
        lines += plan_mesh.render(plan["mesh"])
        lines += ["", f"For comparison, each strategy alone over the {plan['ranks']} ranks:"]
    lines += ["", f"Memory per rank (GB), fit in {mem_gb:g} GB with {plan['other_bytes'] / GB:g} GB "
                  "for activations/other:"]
    lines += _table(
        ["strategy", "params", "grads", "optimizer", "total", "fits"],
        [[r["strategy"], fmt.gb(r["memory"]["params_bytes"]), fmt.gb(r["memory"]["grads_bytes"]),
          fmt.gb(r["memory"]["optimizer_bytes"]), fmt.gb(r["memory"]["total_bytes"]),
          "yes" if r["fits"] else f"no ({fmt.gb(-r['headroom_bytes'])} over)"] for r in plan["strategies"]])
    lines += ["", f"Communication per rank per step (GB sent) on {link['name']}:"]
    body = []
    for r in plan["strategies"]:
        kinds = r["comm"]["by_kind"]
        extra = sorted(set(kinds) - set(KIND_COLUMNS))
        body.append([r["strategy"],
                     *(fmt.gb(kinds[k]["sent_bytes"]) if k in kinds else "-" for k in KIND_COLUMNS),
                     fmt.gb(r["comm"]["sent_bytes"]), fmt.seconds(r["comm_s"]), f"{100 * r['comm_overhead']:.1f}",
                     ", ".join(extra)])
    header = ["strategy", "all-reduce", "reduce-scatter", "all-gather", "total", "comm s", "overhead %", "other kinds"]
    if not any(r[-1] for r in body):
        header, body = header[:-1], [r[:-1] for r in body]
    lines += _table(header, body)
    pipe = plan["pipeline"]
    if pipe:
        lines += ["", f"Pipeline: {pipe['stages']} stages x {pipe['data_parallel']} data-parallel, "
                      f"{pipe['micro_batches']} micro-batches: bubble (S-1)/(S+M-1) = "
                      f"{100 * pipe['gpipe_bubble_fraction']:.1f} % for GPipe and "
                      f"{100 * pipe['one_f_one_b_bubble_fraction']:.1f} % for 1F1B; activations held by "
                      f"stage 0: GPipe {pipe['peak_in_flight_micro_batches']['gpipe']}, "
                      f"1F1B {pipe['peak_in_flight_micro_batches']['1f1b']} micro-batches.",
                  "  micro-batches  " + "  ".join(f"{k:>6}" for k in pipe["bubble_by_micro_batches"]),
                  "  bubble %       " + "  ".join(f"{100 * v:>6.1f}" for v in pipe["bubble_by_micro_batches"].values())]
        lines.append("  (pp comm counts the gradient all-reduce among a stage's copies; activation "
                     "send/recv depends on activation size and is not included)")
    return "\n".join(lines)


def _glue_negative_numbers(argv: list[str]) -> list[str]:
    """`--params -7e9` -> `--params=-7e9`: argparse takes "-7e9" for an option and would say only
    "expected one argument"; glued, the value reaches our check and its clear message."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and re.fullmatch(r"-[0-9.][0-9.eE+-]*", arg):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_glue_negative_numbers(sys.argv[1:] if argv is None else argv))
    try:
        plan = make_plan(args)
    except (PlanError, ValueError) as exc:
        parser.exit(2, f"ringtop plan: error: {exc}\n")
    print(json.dumps(plan, indent=2) if args.json else render_table(plan))
    return 0
