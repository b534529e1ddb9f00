"""`ringtop plan`'s text: the plan (`make_plan`'s dict) as the tables a terminal shows; the
same dict is what `--json` prints."""

from __future__ import annotations

from ringtop.cli import plan_mesh
from ringtop.metrics import fmt
from ringtop.metrics.costs.memory_model import DEEPSPEED_ADAM, TORCH_ADAM

KIND_COLUMNS = ("all_reduce", "reduce_scatter", "all_gather")
"""The collectives the communication table has a column for; others are listed by name."""


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(row: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def render_table(plan: dict) -> str:
    m, link = plan["model"], plan["link"]
    implementation = plan["state_model"] == "implementation"
    optimizer = plan["strategies"][0]["optimizer_state"]["words"] if plan["strategies"] else ""
    lines = [
        f"ringtop plan: {m['params']:,} params ({m['params'] / 1e9:.2f} B), {plan['ranks']} ranks, {m['dtype']}",
        "state: each strategy as ringtop's implementation holds it between steps (torch strategies: fp32 params "
        f"and grads, {TORCH_ADAM.words}; ZeRO: params and grads in {m['dtype']}, {DEEPSPEED_ADAM.words})"
        if implementation else
        f"state: params+grads in {m['dtype']} ({m['param_bytes']}+{m['grad_bytes']} B/param), optimizer: {optimizer}",
        f"link {link['name']}: {link['per_direction_gbps']:g} GB/s per direction "
        f"({link['bidirectional_gbps']:g} GB/s bidirectional); compute step {plan['compute_step_s']:g} s; "
        f"backend {plan['backend']}",
        "Sizes in binary units (MiB = 2^20, GiB = 2^30 bytes), rates in GB/s (1e9 bytes/s). Comm time = bytes "
        "each rank sends / per-direction bandwidth; overhead = comm / compute step.",
        *_definition_lines(plan),
    ]
    if plan["mesh"]:
        lines += plan_mesh.render(plan["mesh"])
        lines += ["", f"For comparison, each strategy alone over the {plan['ranks']} ranks:"]
    lines += ["", f"Memory per rank, fit in {fmt.nbytes(plan['mem_capacity_bytes'])} with "
                  f"{fmt.nbytes(plan['other_bytes'])} for activations/other:"]
    lines += _table(
        ["strategy", "params", "grads", "optimizer", "total", "fits", "sharded", "optimizer state"],
        [[r["strategy"], fmt.nbytes(r["memory"]["params_bytes"]), fmt.nbytes(r["memory"]["grads_bytes"]),
          fmt.nbytes(r["memory"]["optimizer_bytes"]), fmt.nbytes(r["memory"]["total_bytes"]),
          "yes" if r["fits"] else f"no(+{fmt.nbytes(-r['headroom_bytes'])})", r["sharded"],
          r["optimizer_state"]["short"]] for r in plan["strategies"]])
    notes = {n for r in plan["strategies"] for n in r["notes"] if not n.startswith("optimizer: ")}
    lines += [f"  {r['strategy']}: {n}" for r in plan["strategies"] for n in r["notes"] if n in notes]
    lines += ["", f"Communication per rank per step (bytes sent) on {link['name']}:"]
    body = []
    for r in plan["strategies"]:
        kinds = r["comm"]["by_kind"]
        extra = sorted(set(kinds) - set(KIND_COLUMNS))
        body.append([r["strategy"],
                     *(fmt.nbytes(kinds[k]["sent_bytes"]) if k in kinds else "-" for k in KIND_COLUMNS),
                     fmt.nbytes(r["comm"]["sent_bytes"]), fmt.seconds(r["comm_s"]), f"{100 * r['comm_overhead']:.1f}",
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
        f"  activations per micro-batch{' (activation checkpointing)' if d['activation_checkpointing'] else ''}: "
        f"{fmt.nbytes(d['activation_bytes_per_micro_batch'])} (flash/SDPA attention; "
        f"{fmt.nbytes(d['activation_bytes_per_micro_batch_eager_attention'])} with eager attention); the rank's "
        f"whole batch, {fmt.nbytes(d['activation_bytes_per_rank'])}, is counted in the fit below",
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
