"""The agent's per-step overhead on a noisy machine, with confidence intervals.

2 gloo ranks on CPU, tiny-gpt 1m, under torch's elastic launcher. Two measures (`_block_stats.py`
has the statistics: ABBA or BAAB quartets, one ratio per pair of neighbouring blocks, a 95 %
interval):

1. Telemetry, inside one run (issues 2, 4; target <= 1.01): the agent as by default, its per-step
   telemetry work (command sync, stall watch, step clock, collective tracing and ledger, the step
   report and its publishing, the diagnosis exchange) switched on and off by `_telemetry_blocks.py`
   in blocks of `--block` steps, every rank at the same step. A step is a loop iteration on rank 0
   (step, report, rules; wall time). The first `--warmup-blocks` are dropped and the first
   `--skip-first` steps of each block (they carry the previous block's telemetry, sent meanwhile
   by other threads); ratio on / off of each pair's block medians; the 20 %-trimmed mean of the
   log-ratios with a bootstrap interval (and, in the JSON, their plain mean with a t-interval).
   Blocks are short because this machine's step time drifts in spells of a few seconds (the
   correlation between neighbouring steps 0.6-0.8): the nearer the two arms, the less drift in
   their ratio. The same for the CPU time both ranks' processes spend per step, which a busy
   neighbour moves far less than the wall time.
2. Whole processes, `--run-pairs` pairs of short runs (`--steps` each, the first 5 dropped; a step
   the interval between step ends on rank 0): the
   agent with CURVE (the default) against `--insecure` (issue 12; target <= 1.01), in ABBA order, and
   a plain hand-written DDP loop (`plain_ddp.py`) beside each pair, first or last (target <= 1.03):
   ratios of run medians, t-interval over pairs. Runs are seconds apart and each pays start-up, so
   these are the weaker measures; they include what no block can switch (threads, DDP's Python comm
   hook).

`--neighbours K` keeps K busy-loop processes running for the whole measurement. `--null` (with
`--run-pairs 0`) checks the method: telemetry stays on in every block, so the ratio must be 1.
The switch-time warm-up (RINGTOP_PREWARM) is off in every agent run: a one-off start-up cost.

    python benchmarks/bench_agent_overhead.py [--pairs 300] [--run-pairs 4] [--neighbours 0] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from _block_stats import block_is_a, blocks_of, pairs_of, step_is_a, t_ratio, trimmed_ratio

from ringtop.agent.lifecycle import exit_with_parent
from ringtop.protocol import Step, free_tcp_ports, read_log

HERE = Path(__file__).resolve().parent
RUN_WARMUP_STEPS = 5
TARGETS = {"telemetry": 1.01, "curve": 1.01, "agent_over_plain": 1.03}


def launcher(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args]


def run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(result.stdout[-2000:] + result.stderr[-2000:])


def telemetry_args(work: Path, insecure: bool = False) -> list[str]:
    p = free_tcp_ports(3)
    return ["--log-dir", str(work / "logs"), "--publish", f"tcp://127.0.0.1:{p[0]}",
            "--relay", f"tcp://127.0.0.1:{p[1]}", "--control", f"tcp://127.0.0.1:{p[2]}",
            "--checkpoint-dir", str(work / "ckpt"), *(["--insecure"] if insecure else [])]


def run_median_ms(path: Path) -> float:
    ends = json.loads(path.read_text())[RUN_WARMUP_STEPS:]
    return statistics.median((b - a) * 1e3 for a, b in zip(ends, ends[1:]))


@contextlib.contextmanager
def neighbours(count: int) -> Iterator[None]:
    """`count` CPU-bound processes for the duration, each in its own session, ended with us."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True,
                              preexec_fn=exit_with_parent) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def check_toggled(log_dir: Path, steps: int, block: int, null: bool) -> int:
    """Each rank published a Step for every "on" step and none for an "off" one: the switch bites."""
    expected = [s for s in range(1, steps + 1) if null or step_is_a(s, block)]
    for rank in (0, 1):
        published = [m.step for m in read_log(log_dir / f"rank-{rank}.jsonl") if isinstance(m, Step)]
        if published != expected:
            raise SystemExit(f"rank {rank} published steps {published[:24]}..., expected the 'on' blocks' "
                             f"{expected[:24]}...: the telemetry switch did not take")
    return len(expected)


def block_ratio(step_ms: list[float], args: argparse.Namespace) -> dict:
    """Blocks, pairs and the on / off ratio of one per-iteration series."""
    blocks = blocks_of(step_ms, args.block, args.warmup_blocks, args.skip_first)
    pairs = pairs_of(blocks)
    ratios = [a.median_ms / b.median_ms for a, b in pairs]
    return {
        "on_over_off": trimmed_ratio(ratios).as_dict(), "on_over_off_t_interval": t_ratio(ratios).as_dict(),
        "blocks_measured": len(blocks),
        "on_median_ms": round(statistics.median(b.median_ms for b in blocks if b.a), 3),
        "off_median_ms": round(statistics.median(b.median_ms for b in blocks if not b.a), 3),
        "steps_measured_per_block": args.block - args.skip_first,
        "blocks": {"index": [b.index for b in blocks], "telemetry_on": [b.a for b in blocks],
                   "median_ms": [round(b.median_ms, 3) for b in blocks]},
        "pairs": {"on_block": [a.index for a, _ in pairs], "off_block": [b.index for _, b in pairs],
                  "ratio": [round(r, 4) for r in ratios]},
    }


def telemetry_blocks(args: argparse.Namespace, common: list[str], work: Path) -> dict:
    """One run, telemetry switched in blocks: rank 0's iteration wall time (the measure), and the
    CPU time both ranks' processes spent per iteration (every thread's; what other processes do
    barely moves it)."""
    steps = (args.warmup_blocks + 2 * args.pairs) * args.block + 1  # + 1: the last iteration's end
    marks = work / "iterations"
    env = {**os.environ, "RINGTOP_BENCH_BLOCK_STEPS": str(args.block), "RINGTOP_BENCH_ITERATIONS": str(marks),
           "RINGTOP_PREWARM": "0", "RINGTOP_BENCH_BLOCK_NULL": "1" if args.null else "0"}
    run(launcher(str(HERE / "_telemetry_blocks.py"), *common, "--steps", str(steps), *telemetry_args(work)), env)
    published = check_toggled(work / "logs", steps, args.block, args.null)
    ranks = [json.loads(Path(f"{marks}-rank-{r}.json").read_text()) for r in (0, 1)]

    def per_iteration(xs: list[float]) -> list[float]:
        return [(b - a) * 1e3 for a, b in zip(xs, xs[1:])]

    wall_ms = [round(x, 2) for x in per_iteration(ranks[0]["wall"])]  # as kept: the JSON reproduces itself
    cpu_ms = [round(a + b, 2) for a, b in zip(per_iteration(ranks[0]["cpu"]), per_iteration(ranks[1]["cpu"]))]
    return {"wall": block_ratio(wall_ms, args), "target": TARGETS["telemetry"],
            "cpu_both_ranks": block_ratio(cpu_ms, args), "steps": steps, "steps_published": published,
            "iteration_wall_ms_rank0": wall_ms, "iteration_cpu_ms_both_ranks": cpu_ms}


def process_runs(args: argparse.Namespace, common: list[str], work: Path) -> dict:
    """Pairs of whole runs, CURVE against plain sockets in ABBA order, a plain DDP run beside each pair
    (first in an even pair, last in an odd one, so it neighbours the CURVE run both ways)."""
    rounds = []
    for r in range(args.run_pairs):
        first, second = ("agent", "agent_insecure") if block_is_a(2 * r, seed=None) else ("agent_insecure", "agent")
        order = [first, second] if args.no_plain else (["plain", first, second] if r % 2 == 0
                                                       else [first, second, "plain"])
        medians = {}
        for arm in order:
            d = work / f"pair{r}-{arm}"
            d.mkdir()
            out = d / "steps.json"
            if arm == "plain":
                run(launcher(str(HERE / "plain_ddp.py"), *common, "--steps", str(args.steps), "--out", str(out)))
            else:
                run(launcher("-m", "ringtop.agent", *common, "--steps", str(args.steps),
                             *telemetry_args(d, insecure=arm == "agent_insecure"), "--step-times", str(out)),
                    {**os.environ, "RINGTOP_PREWARM": "0"})
            medians[arm] = run_median_ms(out)
        rounds.append({"order": order, **{k: round(v, 3) for k, v in medians.items()}})
        print(f"run pair {r + 1}/{args.run_pairs}: " + ", ".join(f"{k} {medians[k]:.1f} ms" for k in order),
              file=sys.stderr, flush=True)
    result = {"runs": rounds, "steps_per_run": args.steps, "steps_measured_per_run": args.steps - RUN_WARMUP_STEPS - 1,
              "curve_over_insecure": t_ratio([r["agent"] / r["agent_insecure"] for r in rounds]).as_dict()
              if len(rounds) > 1 else None, "target_curve": TARGETS["curve"]}
    if not args.no_plain and len(rounds) > 1:
        result["agent_over_plain"] = t_ratio([r["agent"] / r["plain"] for r in rounds]).as_dict()
        result["target_agent_over_plain"] = TARGETS["agent_over_plain"]
    return result


def compact_json(result: dict) -> str:
    """Indented, but each list of numbers or booleans on one line."""
    text = json.dumps(result, indent=1)
    return re.sub(r"\[[\w\s.,+-]*\]", lambda m: "[" + " ".join(m.group(0)[1:-1].split()) + "]", text)


def summary(result: dict) -> str:
    blocks = result["telemetry_blocks"]
    t, c = blocks["wall"]["on_over_off"], blocks["cpu_both_ranks"]["on_over_off"]
    arms = "on / on (A/A check)" if result["settings"]["null"] else "on / off"
    lines = [f"telemetry {arms}, step time (one run, {t['pairs']} block pairs): {t['ratio']:.4f}, "
             f"95% CI {t['ci95_low']:.4f}-{t['ci95_high']:.4f} (±{t['ci95_half_width']:.4f}); target <= 1.01",
             f"telemetry {arms}, CPU time of both ranks per step: {c['ratio']:.4f}, "
             f"95% CI {c['ci95_low']:.4f}-{c['ci95_high']:.4f} (±{c['ci95_half_width']:.4f})"]
    runs = result.get("process_runs") or {}
    for key, label, target in (("curve_over_insecure", "CURVE / plain sockets", 1.01),
                               ("agent_over_plain", "agent / plain DDP", 1.03)):
        c = runs.get(key)
        if c:
            lines.append(f"{label} ({c['pairs']} run pairs, weaker): {c['ratio']:.4f}, 95% CI "
                         f"{c['ci95_low']:.4f}-{c['ci95_high']:.4f} (±{c['ci95_half_width']:.4f}); target <= {target}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--block", type=int, default=2, help="steps per telemetry block")
    parser.add_argument("--pairs", type=int, default=300, help="measured pairs of telemetry blocks")
    parser.add_argument("--warmup-blocks", type=int, default=8, help="blocks dropped first (a multiple of 4)")
    parser.add_argument("--skip-first", type=int, default=1, help="steps dropped at the start of each block")
    parser.add_argument("--run-pairs", type=int, default=4, help="pairs of whole runs, CURVE vs plain sockets")
    parser.add_argument("--steps", type=int, default=20, help="steps per whole run")
    parser.add_argument("--no-plain", action="store_true", help="no plain DDP runs beside the run pairs")
    parser.add_argument("--neighbours", type=int, default=0, help="busy-loop processes running meanwhile")
    parser.add_argument("--model-size", default="1m")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--null", action="store_true",
                        help="A/A check: telemetry on in every block (the ratio must come out 1)")
    parser.add_argument("--json", action="store_true", help="print every block, pair and run as JSON")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    common = ["--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len), "--model-size", args.model_size]
    load_before = os.getloadavg()
    started = time.monotonic()
    with neighbours(args.neighbours), tempfile.TemporaryDirectory() as tmp:
        print(f"telemetry blocks: {args.warmup_blocks + 2 * args.pairs} blocks of {args.block} steps ...",
              file=sys.stderr, flush=True)
        (Path(tmp) / "blocks").mkdir()
        blocks = telemetry_blocks(args, common, Path(tmp) / "blocks")
        print(f"  on / off {blocks['wall']['on_over_off']}", file=sys.stderr, flush=True)
        runs = process_runs(args, common, Path(tmp)) if args.run_pairs else None
    result = {
        "benchmark": "bench_agent_overhead", "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "settings": {**{k: v for k, v in vars(args).items() if k != "json"}, "ranks": 2, "backend": "gloo",
                     "cpus": os.cpu_count(), "omp_num_threads": os.environ["OMP_NUM_THREADS"]},
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round(time.monotonic() - started, 1),
        "telemetry_blocks": blocks, "process_runs": runs,
    }
    print(compact_json(result) if args.json else summary(result))


if __name__ == "__main__":
    main()
