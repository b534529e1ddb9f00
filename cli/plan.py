"""`ringtop plan`: memory per rank, traffic and time per step of each strategy, from the cost model.

Torch-free with `--params`: it runs where torch is not installed (a laptop planning a cluster).
`--model hf:NAME|hf-config:PATH` takes parameters, layers and hidden size from the architecture's
definition built on the meta device (torch and transformers imported then; no weights allocated),
and adds activation memory per micro-batch, FLOPs per step and the step-time floor on the given
accelerator (metrics.peaks) and link.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import asdict

from ringtop.metrics import fmt
from ringtop.metrics.peaks import ACCELERATORS, compute_dtype, match_device
from ringtop.metrics.units import GB
from ringtop.strategies.cost_model import (
    DTYPE_BYTES,
    ModelSpec,
    activation_bytes_per_micro_batch,
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
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--params", help="parameter count, e.g. 7e9 or 7.6B")
    what.add_argument("--model", help="hf:NAME (`ringtop models`) or hf-config:PATH: counts, layers and hidden "
                      "size from the architecture built on the meta device; adds activations, FLOPs and the "
                      "step-time floor (needs torch and transformers)")
    p.add_argument("--ranks", type=int, default=None, help="number of ranks (GPUs); with --tp / --dp: tp x pp x dp")
    p.add_argument("--link", default="nvlink4",
                   help=f"{'|'.join(LINKS)} or a number of GB/s per direction (default %(default)s)")
    p.add_argument("--step-s", type=float, default=None,
                   help="compute time of one step in seconds (default: with --model and a known peak, the "
                        "compute floor; else 2)")
    p.add_argument("--seq-len", type=int, default=None,
                   help="with --model: tokens per sequence (default: the model's positions, at most 2048); "
                        "with a TP/3D layout and no --model: 4096")
    p.add_argument("--batch-size", type=int, default=8,
                   help="with --model or a TP/3D layout: sequences per data-parallel replica per step, in "
                        "--micro-batches (default %(default)s)")
    p.add_argument("--accelerator", default=None,
                   help="with --model: the device, as NVML names it or the peak table does (e.g. 'H100 SXM', "
                        "H200, 'A100 SXM', MI300X): its dense peak for --dtype gives the compute floor")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="with --model: the device's dense peak TFLOP/s instead of --accelerator")
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
    if args.model is None:
        given = [f for f, v in (("--seq-len", None if plan_mesh.wanted(args) else args.seq_len),
                                ("--accelerator", args.accelerator), ("--peak-tflops", args.peak_tflops))
                 if v is not None]
        if given:
            raise PlanError(f"{given[0]} needs --model (it sizes activations and FLOPs of an architecture)")
        params = parse_count(args.params)
    else:
        params = 0  # counted from the model
    if args.step_s is None and args.model is None:
        args.step_s = 2.0
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
    if args.step_s is not None and not (args.step_s > 0 and math.isfinite(args.step_s)):
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
    if args.seq_len is not None and not 1 <= args.seq_len <= 1 << 20:
        raise PlanError(f"--seq-len must be in [1, {1 << 20}], got {args.seq_len}")
    if not 1 <= args.batch_size <= 1 << 20:
        raise PlanError(f"--batch-size must be in [1, {1 << 20}], got {args.batch_size}")
    if args.model is not None and args.micro_batches is not None and args.batch_size % args.micro_batches:
        raise PlanError(f"--micro-batches {args.micro_batches} must divide --batch-size {args.batch_size}")
    if args.peak_tflops is not None and not (args.peak_tflops > 0 and math.isfinite(args.peak_tflops)):
        raise PlanError(f"--peak-tflops must be a positive number, got {args.peak_tflops}")
    if args.accelerator is not None and match_device(args.accelerator) is None:
        known = ", ".join(a.name for a in ACCELERATORS)
        raise PlanError(f"--accelerator {args.accelerator!r} is not one device of the peak table ({known}); "
                        "pass --peak-tflops instead")
    return params, link


def _peak(args: argparse.Namespace) -> tuple[float, str]:
    """(dense peak TFLOP/s, where it is from); 0.0 when neither --accelerator nor --peak-tflops is given."""
    if args.peak_tflops is not None:
        return args.peak_tflops, "--peak-tflops"
    if args.accelerator is None:
        return 0.0, "no --accelerator or --peak-tflops"
    row = match_device(args.accelerator)
    dtype = compute_dtype(args.dtype)
    if dtype not in row.tflops:
        raise PlanError(f"{row.name} has no {dtype} peak in the table; pass --peak-tflops")
    return row.tflops[dtype], f"{row.name} {dtype} dense, {row.source}"


def _model_definition(args: argparse.Namespace):
    """The architecture's facts from its meta-device definition; PlanError for a bad spec."""
    try:
        from ringtop.agent.hf_catalogue import ModelConfigError, check_seq_len, resolve
        from ringtop.agent.hf_models import model_facts
    except ImportError as exc:
        raise PlanError(f"--model needs torch and transformers ({exc}): pip install 'ringtop[agent,hf]'") from None
    try:
        spec = resolve(args.model)
        if args.seq_len is None:
            args.seq_len = min(spec.dims.max_positions, 2048)
        check_seq_len(spec, args.seq_len)
        return model_facts(spec)
    except ModelConfigError as exc:
        raise PlanError(str(exc)) from None
    except ImportError as exc:
        raise PlanError(f"--model needs transformers ({exc}): pip install 'ringtop[hf]'") from None


def _model_part(args: argparse.Namespace, facts, ranks: int, stages: int) -> dict:
    """Activations per micro-batch, FLOPs per step and the compute floor of the step: for the
    data-parallel strategies (every rank a replica fed --batch-size sequences) and, with
    --pp-stages, for the pipeline (each replica of S ranks fed --batch-size sequences in M
    micro-batches, its work split over the stages and stretched by the bubble)."""
    micro_batches = args.micro_batches or 1
    micro_batch_size = args.batch_size // micro_batches
    act_bytes = DTYPE_BYTES[args.dtype]

    def activations(sequences: int, flash: bool = True) -> int:
        return activation_bytes_per_micro_batch(facts.layers, facts.hidden, facts.heads, args.seq_len, sequences,
                                                facts.vocab, act_bytes, flash_attention=flash)

    flops_per_token = facts.flops_per_token(args.seq_len)
    per_rank_flops = flops_per_token * args.batch_size * args.seq_len
    peak_tflops, peak_source = _peak(args)
    floor = per_rank_flops / (peak_tflops * 1e12) if peak_tflops > 0 else None
    pipeline = None
    if stages > 1:
        bubble = gpipe_bubble_fraction(stages, micro_batches)
        pipeline = {"tokens_per_step": args.batch_size * args.seq_len * (ranks // stages),
                    "flops_per_step": flops_per_token * args.batch_size * args.seq_len * (ranks // stages),
                    "flops_per_rank_per_step": per_rank_flops / stages, "bubble": bubble,
                    "compute_floor_s": floor / stages / (1 - bubble) if floor is not None else None}
    return {
        "name": facts.name, "model_type": facts.model_type, "params": facts.params,
        "non_embedding_params": facts.non_embedding_params, "layers": facts.layers, "hidden": facts.hidden,
        "heads": facts.heads, "kv_heads": facts.kv_heads, "vocab": facts.vocab, "tied_head": facts.tied,
        "seq_len": args.seq_len, "batch_size_per_rank": args.batch_size, "micro_batches": micro_batches,
        "micro_batch_size": micro_batch_size,
        "activation_bytes_per_micro_batch": activations(micro_batch_size),
        "activation_bytes_per_micro_batch_eager_attention": activations(micro_batch_size, flash=False),
        "activation_bytes_per_rank": activations(args.batch_size),
        "flops_per_token": flops_per_token, "tokens_per_step": args.batch_size * args.seq_len * ranks,
        "flops_per_step": per_rank_flops * ranks, "flops_per_rank_per_step": per_rank_flops,
        "peak_tflops": peak_tflops, "peak_source": peak_source, "compute_floor_s": floor, "pipeline": pipeline,
        "conventions": {
            "flops_per_token": "6 x non-embedding params + 12 x layers x hidden x seq_len (PaLM appendix B)",
            "activation_bytes": "Korthikanti et al. 2022 eq. 1, s*b*h*34 per layer (+5*a*s^2*b with eager "
                                "attention), scaled to the dtype, + fp32 logits and softmax 8*s*b*V",
            "compute_floor_s": "FLOPs per rank per step / dense peak (100 % MFU); a pipeline's: its replica's "
                               "work / stages / (1 - GPipe bubble)",
        },
    }


def make_plan(args: argparse.Namespace) -> dict:
    """The plan as plain data (what --json prints and the table renders)."""
    params, link = _validate(args)
    stages = args.pp_stages or 1
    definition = facts = None
    if args.model is not None:
        facts = _model_definition(args)
        params = facts.params
        definition = _model_part(args, facts, args.ranks, stages)
        if args.step_s is None:
            args.step_s = definition["compute_floor_s"] or 2.0
    model = ModelSpec.from_dtype(params, args.dtype, args.optimizer_bytes)
    capacity = args.mem_gb * GB
    other = args.other_gb * GB
    if definition is not None:  # the rank's whole batch at once; a pipeline stage holds about 1/S of it
        other += definition["activation_bytes_per_rank"]
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
        if definition is not None and definition["compute_floor_s"] is not None:
            compute = definition["pipeline" if cost.strategy == "pp" else "compute_floor_s"]
            compute = compute["compute_floor_s"] if cost.strategy == "pp" else compute
            rows[-1]["step_floor_s"] = {"compute": compute, "overlapped": max(compute, t), "serial": compute + t}
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
    mesh = plan_mesh.mesh_plan(args, params, model, link, facts) if plan_mesh.wanted(args) else None
    return {
        "model": {**asdict(model), "dtype": args.dtype},
        "model_definition": definition,
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
        *_definition_lines(plan),
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


def _definition_lines(plan: dict) -> list[str]:
    d = plan["model_definition"]
    if d is None:
        return []
    floor = d["compute_floor_s"]
    lines = [
        "",
        f"Model {d['name']} ({d['model_type']}, from its definition on the meta device): {d['params']:,} params "
        f"({d['non_embedding_params']:,} non-embedding), {d['layers']} layers, hidden {d['hidden']}, {d['heads']} "
        f"heads ({d['kv_heads']} kv), vocab {d['vocab']:,}{', tied head' if d['tied_head'] else ''}",
        f"  sequence {d['seq_len']:,} tokens, {d['batch_size_per_rank']} sequences per rank per step in "
        f"{d['micro_batches']} micro-batch(es) of {d['micro_batch_size']}",
        f"  activations per micro-batch: {fmt.gb(d['activation_bytes_per_micro_batch'])} GB (flash/SDPA attention; "
        f"{fmt.gb(d['activation_bytes_per_micro_batch_eager_attention'])} GB with eager attention); the rank's "
        f"whole batch, {fmt.gb(d['activation_bytes_per_rank'])} GB, is counted in the fit below",
        f"  FLOPs: {d['flops_per_token']:.4g} per token (6N + 12LHS), {d['flops_per_step']:.4g} per step "
        f"({d['tokens_per_step']:,} tokens, every rank a replica), {d['flops_per_rank_per_step']:.4g} per rank",
    ]
    pipe = d["pipeline"]
    if pipe is not None:
        lines.append(f"  pipeline: {pipe['flops_per_step']:.4g} per step ({pipe['tokens_per_step']:,} tokens), "
                     f"{pipe['flops_per_rank_per_step']:.4g} per rank, bubble {100 * pipe['bubble']:.1f} %")
    if floor is None:
        lines.append(f"  step-time floor: n/a ({d['peak_source']})")
    else:
        lines.append(f"  compute floor: {fmt.seconds(floor)} s per step at 100 % MFU of {d['peak_tflops']:g} TFLOP/s "
                     f"({d['peak_source'].split(', http')[0]}); with each strategy's communication:")
        lines += ["  " + line for line in _table(
            ["strategy", "compute s", "comm s", "floor overlapped s", "floor serial s"],
            [[r["strategy"], fmt.seconds(r["step_floor_s"]["compute"]), fmt.seconds(r["comm_s"]),
              fmt.seconds(r["step_floor_s"]["overlapped"]), fmt.seconds(r["step_floor_s"]["serial"])]
             for r in plan["strategies"]])]
    return lines


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
