"""Tensor parallelism against data parallelism on the same built-in model: TP=2 vs DDP=2.

Each round starts two real agent runs (`python -m ringtop.agent` under torch's elastic launcher,
2 gloo ranks on CPU, benchmarks/_runs.py), one `--strategy ddp` and one `--strategy tp --tp 2`, in
an order that alternates from round to round. Both train tiny-gpt on the same global batch per
step: DDP reads `--batch-size B` per rank (2B in all), a TP group reads one batch of 2B that both
of its ranks see whole. From the runs' telemetry (rank-R.jsonl):

- step time: the median of rank 0's `step_ms` after the warm-up steps; the ratio TP / DDP per
  round (DDP the baseline of the same round), and its median over rounds;
- bytes per step per rank: the sum of a step's CommStat bytes (what was handed to collectives),
  each rank's median over the measured steps;
- TP's measured bytes against the cost model's (the Hello's Prediction.comm_payload_bytes,
  agent/loop/prediction.py predict_tensor_parallel) and against the formula written out here
  (4 all-reduces of fp32 [2B, seq, d_model] per layer, plus the gradient norm's fp32 scalar);
  target: equal payload. DDP's measured bytes are compared with its prediction the same way.

    python benchmarks/bench_tp.py [--rounds 4] [--steps 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _runs import AgentRun, kill, start_agents  # noqa: E402

from ringtop.agent.models.model import MODEL_SIZES  # noqa: E402
from ringtop.protocol import Hello, Step  # noqa: E402

WARMUP_STEPS = 3
NORM_BYTES = 4
"""The fp32 sum of squares TP all-reduces for the global gradient norm."""


def tp_formula_bytes(layers: int, batch: int, seq: int, hidden: int) -> int:
    """TP's payload per step per rank: 2 all-reduces of the block's output activations per layer
    in forward (attention, MLP) and 2 of their input gradients in backward, fp32, plus the norm."""
    return 4 * layers * batch * seq * hidden * 4 + NORM_BYTES


def measured(run: AgentRun, nproc: int) -> dict:
    """Rank 0's median step time and, per rank, the median bytes per step and the prediction."""
    steps0 = [s for s in run.steps(0) if s.step > WARMUP_STEPS]
    if not steps0:
        raise SystemExit(f"no measured steps:\n{run.output()[-3000:]}")
    per_rank = []
    for rank in range(nproc):
        steps = [s for s in run.steps(rank) if s.step > WARMUP_STEPS]
        hello = next(m for m in run.messages(rank) if isinstance(m, Hello))
        per_rank.append({
            "bytes_per_step": int(statistics.median(step_bytes(s) for s in steps)),
            "bytes_by_kind": by_kind(steps[-1]),
            "predicted_bytes_per_step": sum(hello.prediction.comm_payload_bytes.values()),
            "predicted_by_kind": dict(hello.prediction.comm_payload_bytes),
        })
    return {"step_ms_median": round(statistics.median(s.step_ms for s in steps0), 2), "steps": len(steps0),
            "ranks": per_rank}


def step_bytes(step: Step) -> int:
    return sum(c.bytes for c in step.comm)


def by_kind(step: Step) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in step.comm:
        out[c.kind] = out.get(c.kind, 0) + c.bytes
    return out


def one_run(workdir: Path, strategy: str, args: argparse.Namespace) -> dict:
    batch = args.batch_size if strategy == "ddp" else 2 * args.batch_size
    extra = ["--tp", "2"] if strategy == "tp" else []
    run = start_agents(workdir, 2, "--strategy", strategy, *extra, "--model-size", args.model_size,
                       "--steps", str(WARMUP_STEPS + args.steps), "--batch-size", str(batch),
                       "--seq-len", str(args.seq_len))
    try:
        code = run.proc.wait(args.timeout_s)
    except Exception:
        kill(run)
        raise
    if code != 0:
        raise SystemExit(f"{strategy} run exited {code}:\n{run.output()[-3000:]}")
    return measured(run, 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10, help="measured steps per run, after the warm-up")
    parser.add_argument("--batch-size", type=int, default=8, help="DDP's per rank; TP's group reads twice this")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--model-size", default="1m", choices=sorted(MODEL_SIZES))
    parser.add_argument("--timeout-s", type=float, default=300)
    parser.add_argument("--json", action="store_true", help="the result as JSON (else a short table)")
    args = parser.parse_args()
    if not (1 <= args.rounds <= 20 and 1 <= args.steps <= 1000 and 1 <= args.batch_size <= 4096
            and 1 <= args.seq_len <= 4096):
        raise SystemExit("bench_tp: --rounds 1..20, --steps 1..1000, --batch-size and --seq-len 1..4096")
    cfg = MODEL_SIZES[args.model_size]
    os.environ.setdefault("RINGTOP_PREWARM", "0")  # no switch here: no background warm-up on 2 cores
    t0 = time.perf_counter()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = ("ddp", "tp") if r % 2 == 0 else ("tp", "ddp")
            arms = {}
            for strategy in order:
                print(f"round {r + 1}: {strategy}", file=sys.stderr)
                arms[strategy] = one_run(Path(tmp) / f"r{r}-{strategy}", strategy, args)
            arms["tp_over_ddp"] = round(arms["tp"]["step_ms_median"] / arms["ddp"]["step_ms_median"], 4)
            rounds.append(arms)
    formula = tp_formula_bytes(cfg.n_layer, 2 * args.batch_size, args.seq_len, cfg.d_model)
    last = rounds[-1]
    tp_bytes = [rank["bytes_per_step"] for r in rounds for rank in r["tp"]["ranks"]]
    tp_predicted = [rank["predicted_bytes_per_step"] for r in rounds for rank in r["tp"]["ranks"]]
    ddp_bytes = [rank["bytes_per_step"] for r in rounds for rank in r["ddp"]["ranks"]]
    ddp_predicted = [rank["predicted_bytes_per_step"] for r in rounds for rank in r["ddp"]["ranks"]]
    ratios = [r["tp_over_ddp"] for r in rounds]
    result = {
        "benchmark": "tp", "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "model_size": args.model_size, "layers": cfg.n_layer, "d_model": cfg.d_model,
        "ddp_batch_per_rank": args.batch_size, "tp_batch_per_group": 2 * args.batch_size,
        "seq_len": args.seq_len, "warmup_steps": WARMUP_STEPS, "measured_steps": args.steps,
        "rounds": rounds,
        "ddp_step_ms_median": statistics.median(r["ddp"]["step_ms_median"] for r in rounds),
        "tp_step_ms_median": statistics.median(r["tp"]["step_ms_median"] for r in rounds),
        "tp_over_ddp_step_ms": round(statistics.median(ratios), 4),
        "ratio_range": [min(ratios), max(ratios)],
        "tp_bytes_per_step_per_rank": last["tp"]["ranks"][0]["bytes_per_step"],
        "tp_predicted_bytes_per_step": last["tp"]["ranks"][0]["predicted_bytes_per_step"],
        "tp_formula_bytes_per_step": formula,
        "tp_measured_equals_predicted": len(set(tp_bytes) | set(tp_predicted)) == 1,
        "tp_measured_equals_formula": set(tp_bytes) == {formula},
        "ddp_bytes_per_step_per_rank": last["ddp"]["ranks"][0]["bytes_per_step"],
        "ddp_predicted_bytes_per_step": last["ddp"]["ranks"][0]["predicted_bytes_per_step"],
        "ddp_measured_equals_predicted": len(set(ddp_bytes) | set(ddp_predicted)) == 1,
        "tp_over_ddp_bytes": round(last["tp"]["ranks"][0]["bytes_per_step"]
                                   / max(1, last["ddp"]["ranks"][0]["bytes_per_step"]), 4),
        "wall_s": round(time.perf_counter() - t0, 1), "load_average": os.getloadavg(),
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"step ms (median of rank 0, rounds' median): DDP {result['ddp_step_ms_median']}, "
          f"TP {result['tp_step_ms_median']}, TP / DDP {result['tp_over_ddp_step_ms']} "
          f"(rounds {result['ratio_range']})")
    print(f"bytes per step per rank: DDP {result['ddp_bytes_per_step_per_rank']:,} "
          f"(predicted {result['ddp_predicted_bytes_per_step']:,}), TP {result['tp_bytes_per_step_per_rank']:,} "
          f"(predicted {result['tp_predicted_bytes_per_step']:,}, formula {formula:,})")


if __name__ == "__main__":
    main()
