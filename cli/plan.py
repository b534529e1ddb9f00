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

from ringtop.cli import plan_mesh
from ringtop.cli.plan_table import render_table
from ringtop.metrics.costs.cost_model import (
    DTYPE_BYTES,
    RECOMPUTE_FLOPS_FACTOR,
    ModelSpec,
    StrategyCost,
    activation_bytes_per_micro_batch,
    comm_overhead,
    comm_per_step,
    comm_share_of_step,
    comm_time_s,
    gpipe_bubble_fraction,
    implementation_cost,
    memory_per_rank,
    one_f_one_b_bubble_fraction,
    peak_in_flight_micro_batches,
    which_fit,
)
from ringtop.metrics.costs.links import LINKS, Link, parse_link
from ringtop.metrics.costs.memory_model import (
    DEEPSPEED_ADAM,
    TORCH_ADAM,
    OptimizerState,
    chapter_optimizer_state,
    given_optimizer_state,
    implementation_specs,
    predicted_state,
)
from ringtop.metrics.parallel_dims import ParallelDims
from ringtop.metrics.rules.peaks import ACCELERATORS, compute_dtype, match_device
from ringtop.metrics.strategy_names import sharded_words
from ringtop.metrics.units import GB

STATE_MODELS = ("implementation", "chapter")
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
        epilog="Sizes shown in binary units (MiB, GiB); --mem-gb, --other-gb and link rates in GB = 1e9 bytes. "
               "Comm time = bytes each rank sends / the link's per-direction bandwidth "
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
    p.add_argument("--state-model", choices=STATE_MODELS, default="implementation",
                   help="implementation (default): each strategy's state and traffic as ringtop's implementation "
                        f"holds and sends them (torch strategies: fp32 params and grads, {TORCH_ADAM.words}; "
                        f"ZeRO: params and grads in --dtype, {DEEPSPEED_ADAM.words}); chapter: the textbook "
                        "model of seed/distributed-training-basics.zh.txt, params and grads in --dtype and "
                        "optimizer state 4 x the param bytes (its memory table)")
    p.add_argument("--optimizer-bytes", type=int, default=None,
                   help="optimizer state bytes per parameter for every strategy, with params and grads in "
                        "--dtype (e.g. 12: the ZeRO paper's mixed-precision Adam); overrides --state-model")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="with --model: each layer keeps only its input for backward and recomputes the rest "
                        "(activations: one input per layer + one layer's full set; compute: one more forward, "
                        "4/3 of the FLOPs)")
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
    if args.activation_checkpointing and args.model is None:
        raise PlanError("--activation-checkpointing needs --model (it sizes the activations of an architecture)")
    if args.optimizer_bytes is not None and args.optimizer_bytes < 0:
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
        from ringtop.agent.models.hf_catalogue import ModelConfigError, check_seq_len, resolve
        from ringtop.agent.models.hf_models import model_facts
    except ImportError as exc:
        from ringtop.metrics.install_hint import install_command

        raise PlanError(f"--model needs torch and transformers ({exc}): {install_command('agent,hf')}") from None
    try:
        spec = resolve(args.model)
        if args.seq_len is None:
            args.seq_len = min(spec.dims.max_positions, 2048)
        check_seq_len(spec, args.seq_len)
        return model_facts(spec)
    except ModelConfigError as exc:
        raise PlanError(str(exc)) from None
    except ImportError as exc:
        from ringtop.metrics.install_hint import install_command

        raise PlanError(f"--model needs transformers ({exc}): {install_command('hf')}") from None


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
                                                facts.vocab, act_bytes, flash_attention=flash,
                                                checkpointing=args.activation_checkpointing)

    flops_per_token = facts.flops_per_token(args.seq_len)
    recompute = RECOMPUTE_FLOPS_FACTOR if args.activation_checkpointing else 1.0
    per_rank_flops = flops_per_token * args.batch_size * args.seq_len
    peak_tflops, peak_source = _peak(args)
    floor = recompute * per_rank_flops / (peak_tflops * 1e12) if peak_tflops > 0 else None
    pipeline = None
    if stages > 1:
        bubble = gpipe_bubble_fraction(stages, micro_batches)
        replicas = ParallelDims.filling(ranks, pp=stages).dp
        pipeline = {"tokens_per_step": args.batch_size * args.seq_len * replicas,
                    "flops_per_step": flops_per_token * args.batch_size * args.seq_len * replicas,
                    "flops_per_rank_per_step": per_rank_flops / stages, "bubble": bubble,
                    "compute_floor_s": floor / stages / (1 - bubble) if floor is not None else None}
    return {
        "name": facts.name, "model_type": facts.model_type, "params": facts.params,
        "non_embedding_params": facts.non_embedding_params, "layers": facts.layers, "hidden": facts.hidden,
        "heads": facts.heads, "kv_heads": facts.kv_heads, "vocab": facts.vocab, "tied_head": facts.tied,
        "seq_len": args.seq_len, "batch_size_per_rank": args.batch_size, "micro_batches": micro_batches,
        "micro_batch_size": micro_batch_size, "activation_checkpointing": args.activation_checkpointing,
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
                               "work / stages / (1 - GPipe bubble); with activation checkpointing x 4/3 "
                               "(forward runs twice)",
            "activation_checkpointing": "each layer keeps its input (s*b*h) and one layer's full activations "
                                        "are live while it is recomputed in backward (Korthikanti et al. 2022 "
                                        "section 5, full recomputation)",
        },
    }


def _implementation_cost(strategy: str, ranks: int, params: int, dtype: str, stages: int,
                         gloo: bool) -> tuple[StrategyCost, OptimizerState, tuple[str, ...]]:
    """A strategy as ringtop's implementation holds and sends it (metrics.memory_model, the agent's
    and the UI's prediction); pp: every stage a torch module with fp32 state, its replicas all-reduce."""
    if strategy != "pp":
        state = predicted_state(strategy, ranks, params, dtype)
        return implementation_cost(strategy, ranks, params, dtype, gloo=gloo), state.optimizer, state.notes
    held, wire = implementation_specs("pp", params, dtype)
    cost = StrategyCost(strategy="pp", ranks=ranks, pp_stages=stages,
                        memory=memory_per_rank("pp", ranks, held, pp_stages=stages),
                        comm=comm_per_step("pp", ranks, wire, pp_stages=stages))
    return cost, TORCH_ADAM, ()


def _strategy_row(args: argparse.Namespace, cost: StrategyCost, optimizer: OptimizerState, state_model: str,
                  params: int, stages: int, gloo: bool, capacity: float, other: float, link: Link,
                  definition: dict | None) -> dict:
    """One strategy's memory, fit, traffic and times (and its step floor, given a model's definition)."""
    notes: tuple[str, ...] = ()
    if state_model == "implementation":
        cost, optimizer, notes = _implementation_cost(cost.strategy, args.ranks, params, args.dtype, stages, gloo)
    need = cost.memory.total_bytes + math.ceil(other)
    t = comm_time_s(cost.comm.sent_bytes, link)
    row = {
        "strategy": cost.strategy,
        "sharded": sharded_words(cost.strategy),
        "optimizer_state": {"model": optimizer.key, "bytes_per_param": optimizer.bytes_per_param,
                            "words": optimizer.words, "short": optimizer.short},
        "notes": list(notes),
        "memory": {**asdict(cost.memory), "total_bytes": cost.memory.total_bytes},
        "fits": need <= capacity,
        "need_bytes": need,
        "headroom_bytes": math.floor(capacity) - need,
        "comm": {
            "by_kind": {k: {"payload_bytes": c.payload_bytes, "sent_bytes": c.sent_bytes}
                        for k, c in cost.comm.by_kind().items()},
            "sent_bytes": cost.comm.sent_bytes,
        },
        "comm_s": t,
        "comm_overhead": comm_overhead(t, args.step_s),
        "comm_share_of_step": comm_share_of_step(t, args.step_s),
    }
    if definition is not None and definition["compute_floor_s"] is not None:
        compute = definition["pipeline" if cost.strategy == "pp" else "compute_floor_s"]
        compute = compute["compute_floor_s"] if cost.strategy == "pp" else compute
        row["step_floor_s"] = {"compute": compute, "overlapped": max(compute, t), "serial": compute + t}
    return row


def _pipeline_part(args: argparse.Namespace, stages: int) -> dict:
    """With --pp-stages: the bubble of both schedules, and GPipe's over a range of micro-batch counts."""
    m = args.micro_batches or 1
    return {
        "stages": stages,
        "micro_batches": m,
        "data_parallel": ParallelDims.filling(args.ranks, pp=stages).dp,
        "gpipe_bubble_fraction": gpipe_bubble_fraction(stages, m),
        "one_f_one_b_bubble_fraction": one_f_one_b_bubble_fraction(stages, m),
        "peak_in_flight_micro_batches": {"gpipe": peak_in_flight_micro_batches("gpipe", stages, m),
                                         "1f1b": peak_in_flight_micro_batches("1f1b", stages, m)},
        "bubble_by_micro_batches": {str(mm): gpipe_bubble_fraction(stages, mm)
                                    for mm in sorted({*BUBBLE_TABLE_M, m})},
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
    textbook_optimizer = (given_optimizer_state(args.optimizer_bytes) if args.optimizer_bytes is not None
                          else chapter_optimizer_state(DTYPE_BYTES[args.dtype]))
    model = ModelSpec.from_dtype(params, args.dtype, textbook_optimizer.bytes_per_param)
    state_model = "given" if args.optimizer_bytes is not None else args.state_model
    capacity = args.mem_gb * GB
    other = args.other_gb * GB
    if definition is not None:  # the rank's whole batch at once; a pipeline stage holds about 1/S of it
        other += definition["activation_bytes_per_rank"]
    gloo = args.backend == "gloo"
    rows = [_strategy_row(args, fit.cost, textbook_optimizer, state_model, params, stages, gloo, capacity, other,
                          link, definition)
            for fit in which_fit(model, args.ranks, capacity, other, pp_stages=stages,
                                 gloo_reduce_scatter_as_all_reduce=gloo)]
    pipeline = _pipeline_part(args, stages) if args.pp_stages is not None else None
    mesh = plan_mesh.mesh_plan(args, params, model, link, facts) if plan_mesh.wanted(args) else None
    return {
        "model": {**asdict(model), "dtype": args.dtype},
        "state_model": state_model,
        "model_definition": definition,
        "ranks": args.ranks,
        "link": {"name": link.name, "per_direction_gbps": link.per_direction_gbps,
                 "bidirectional_gbps": link.bidirectional_gbps, "description": link.description},
        "backend": args.backend,
        "compute_step_s": args.step_s,
        "mem_capacity_bytes": round(capacity),
        "other_bytes": round(other),
        "units": {"bytes": "binary (MiB = 2**20, GiB = 2**30) in the table; link rates in GB/s = 1e9 bytes/s"},
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
