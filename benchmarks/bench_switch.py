"""A live strategy switch against stopping, relaunching and resuming from a checkpoint, same run.

For each model size, 2 gloo ranks on CPU, each round runs two chains in alternating order:

- switch chain: one run started in ddp, then, once the agent has said that its background
  warm-up for switching is done (a few seconds after start; see agent/loop/prewarm.py), live `switch`
  commands ddp -> fsdp(full) -> ddp -> zero2 (a couple of steps after each). A switch's time is
  the done reply's `seconds` (what the agent
  reports) and the wall time from sending the command to the done reply (which adds the wait for
  the next step boundary).
- relaunch chain: the same transitions the way one does them without ringtop: a full checkpoint
  (the `checkpoint` command), stop (the `stop` command, until the launcher has exited), launch a
  new run in the target strategy with `--resume PATH`, until its first step record (the latest of
  the ranks' first Step `ts`). Its time runs from sending the checkpoint command to that record.

Reports per model and transition the medians, and the ratio switch / relaunch (target <= 0.1),
with the phases each side spends its time in (from benchmarks/_timed_agent.py's timers, rank 0 and
rank 1). The fsdp -> ddp leg is only the way back to ddp; it is reported too.

    python benchmarks/bench_switch.py [--models 1m,125m] [--rounds 2] [--tiny-rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _runs import command, kill, median, phase_sums, start_agents, stop

NPROC = 2
TARGETS = {
    "fsdp": {"strategy": "fsdp", "fsdp_sharding": "full"},
    "ddp": {"strategy": "ddp"},
    "zero2": {"strategy": "zero2"},
}
CHAIN = ["ddp", "fsdp", "ddp", "zero2"]
"""ddp -> fsdp(full) and ddp -> zero2 are the measured transitions; fsdp -> ddp gets back to ddp."""
WARMUP_STEP = 3
STEPS_AFTER = 2


def strategy_args(name: str) -> list[str]:
    args = ["--strategy", TARGETS[name]["strategy"]]
    if "fsdp_sharding" in TARGETS[name]:
        args += ["--fsdp-sharding", TARGETS[name]["fsdp_sharding"]]
    return args


def switch_chain(work: Path, common: list[str]) -> dict[str, dict]:
    run = start_agents(work / "switch", NPROC, *common, *strategy_args(CHAIN[0]))
    out = {}
    try:
        run.wait_for_step(WARMUP_STEP)
        prewarm_s = run.wait_for_event("prewarm").data.get("seconds")
        for old, new in pairwise(CHAIN):
            t = time.time()
            r = command(run, "switch", TARGETS[new])
            out[f"{old}->{new}"] = {
                "reply_seconds": r.result["seconds"], "wall_seconds": round(r.done_s, 4), "step": r.result["step"],
                "prewarm_seconds": prewarm_s,
                "phases_rank0": phase_sums(run.phases(0, since=t)), "phases_rank1": phase_sums(run.phases(1, since=t)),
            }
            run.wait_for_step(r.result["step"] + STEPS_AFTER)
        stop(run)
    finally:
        kill(run)
    return out


def relaunch_chain(work: Path, common: list[str]) -> dict[str, dict]:
    run = start_agents(work / "relaunch-0", NPROC, *common, *strategy_args(CHAIN[0]))
    out = {}
    try:
        run.wait_for_step(WARMUP_STEP)
        for i, (old, new) in enumerate(pairwise(CHAIN), start=1):
            t0 = time.time()
            saved = command(run, "checkpoint", {"kind": "full", "async": False})
            save_phases = phase_sums(run.phases(0, since=t0))
            t_stop = time.time()
            stop(run)
            t_launch = time.time()
            previous = run
            run = start_agents(work / f"relaunch-{i}", NPROC, *common, *strategy_args(new),
                               "--resume", saved.result["path"])
            first = run.wait_for_step(saved.result["step"] + 1)
            hello = run.hello_ts(0)
            out[f"{old}->{new}"] = {
                "relaunch_seconds": round(first - t0, 4),
                "save_wall_seconds": round(t_stop - t0, 4), "save_reply_seconds": saved.result["seconds"],
                "stop_seconds": round(t_launch - t_stop, 4),
                "launch_to_hello_seconds": round(hello - t_launch, 4) if hello else None,
                "launch_to_first_step_seconds": round(first - t_launch, 4),
                "checkpoint_bytes": saved.result["bytes"],
                "save_phases_rank0": save_phases,
                "startup_phases_rank0": phase_sums(run.phases(0)),
            }
            shutil.rmtree(previous.checkpoint_dir, ignore_errors=True)
            run.wait_for_step(saved.result["step"] + STEPS_AFTER)
        stop(run)
    finally:
        kill(run)
    return out


def bench_model(size: str, rounds: int, batch: int, seq: int, tmp: Path) -> dict:
    common = ["--steps", "0", "--model-size", size, "--batch-size", str(batch), "--seq-len", str(seq)]
    switches: list[dict] = []
    relaunches: list[dict] = []
    for r in range(rounds):
        work = tmp / f"{size}-round{r}"
        order = [("switch", switch_chain), ("relaunch", relaunch_chain)]
        if r % 2:
            order.reverse()
        for name, chain in order:
            result = chain(work, common)
            (switches if name == "switch" else relaunches).append(result)
            summary = ", ".join(f"{k} {v.get('reply_seconds', v.get('relaunch_seconds'))} s" for k, v in result.items())
            print(f"[{size}] round {r + 1}/{rounds} {name}: {summary}", file=sys.stderr, flush=True)
        shutil.rmtree(work, ignore_errors=True)
    out = {"model_size": size, "batch_size": batch, "seq_len": seq, "rounds": rounds, "transitions": {}}
    for leg in (f"{a}->{b}" for a, b in pairwise(CHAIN)):
        sw_reply = median([s[leg]["reply_seconds"] for s in switches])
        sw_wall = median([s[leg]["wall_seconds"] for s in switches])
        rl = median([x[leg]["relaunch_seconds"] for x in relaunches])
        measured = leg in ("ddp->fsdp", "ddp->zero2")
        out["transitions"][leg] = {
            "measured_for_target": measured,
            "switch_reply_seconds_median": round(sw_reply, 3),
            "switch_wall_seconds_median": round(sw_wall, 3),
            "relaunch_seconds_median": round(rl, 3),
            "ratio_switch_over_relaunch": round(sw_reply / rl, 4),
            "ratio_switch_wall_over_relaunch": round(sw_wall / rl, 4),
            "target": 0.1,
            "target_met": sw_reply / rl <= 0.1 if measured else None,
            "relaunch_parts_median": {
                k: round(median([x[leg][k] for x in relaunches if x[leg][k] is not None]), 3)
                for k in ("save_wall_seconds", "save_reply_seconds", "stop_seconds", "launch_to_hello_seconds",
                          "launch_to_first_step_seconds")
            },
            "checkpoint_bytes": relaunches[-1][leg]["checkpoint_bytes"],
            "switch_raw": [s[leg]["reply_seconds"] for s in switches],
            "relaunch_raw": [x[leg]["relaunch_seconds"] for x in relaunches],
            "switch_phases_last_round": {"rank0": switches[-1][leg]["phases_rank0"],
                                         "rank1": switches[-1][leg]["phases_rank1"]},
            "relaunch_phases_last_round": {"save_rank0": relaunches[-1][leg]["save_phases_rank0"],
                                           "startup_rank0": relaunches[-1][leg]["startup_phases_rank0"]},
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="1m,125m")
    parser.add_argument("--rounds", type=int, default=2, help="rounds for the larger models")
    parser.add_argument("--tiny-rounds", type=int, default=3, help="rounds for 1m")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--workdir", default=None, help="where runs and checkpoints go (default: a temp dir)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results = []
    started = time.time()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for size in args.models.split(","):
            rounds = args.tiny_rounds if size == "1m" else args.rounds
            results.append(bench_model(size, rounds, args.batch_size, args.seq_len, Path(tmp)))
    print(json.dumps({
        "benchmark": "switch_vs_relaunch", "ranks": NPROC, "backend": "gloo", "device": "cpu",
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "wall_seconds": round(time.time() - started, 1),
        "models": results,
    }, indent=2))


if __name__ == "__main__":
    main()
