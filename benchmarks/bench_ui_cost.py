"""What watching costs (issue 28, point 7): the UI's CPU, and the ranks' step time with and without it.

Two parts, both with the real UI:

- attached / absent: one real 2-rank agent run (gloo, tiny-gpt, `OMP_NUM_THREADS=1`, on the same
  cores as everything else), watched in alternating windows by `ringtop ui RUN_ID` in a real
  terminal (a tmux session of 200 x 50, its own tmux server: what the terminal costs counts too)
  and not watched at all (the UI process gone). The arms alternate, the order rotating every
  round; each window drops its first `--settle` seconds (the UI starting or its exit). Per rank,
  the ratio of the window medians of `Step.step_ms` per round, and their median over rounds
  (target <= 1.02). The UI's own CPU (user + system over wall, its threads together, psutil) in
  the attached windows is the 2-rank row of the second part.
- UI CPU at 8 and 64 ranks: `ringtop ui` in the same kind of tmux session on `ringtop simulate`
  at `--hz` steps a second (target <= 5 % of one core at 8 ranks); beside it, for where the time
  goes, bench_ui_scale.py's headless worker on the same sizes (the real app through `run_test`,
  its repaint timed; its CPU includes the worker's own sampling every 0.1 s).

    python benchmarks/bench_ui_cost.py [--rounds 4] [--window 10] [--sizes 8,64] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_ui_scale  # noqa: E402
from _runs import kill, start_agents  # noqa: E402

TMUX_SOCKET = f"ringtop-bench-{os.getpid()}"


def _tmux(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["tmux", "-L", TMUX_SOCKET, *args], capture_output=True, text=True, check=check, timeout=30)


def _ui_pid(run_id: str, timeout_s: float = 30.0) -> int:
    """The `ringtop ui` process inside the tmux session (the pane's process)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = _tmux("list-panes", "-a", "-F", "#{pane_pid}", check=False).stdout.split()
        if out:
            return int(out[0])
        time.sleep(0.1)
    raise RuntimeError(f"no tmux pane for the UI of {run_id}")


def attach(run_id: str, env: dict[str, str]) -> psutil.Process:
    cmd = f"exec {sys.executable} -m ringtop.cli.main ui {run_id}"
    subprocess.run(["tmux", "-L", TMUX_SOCKET, "new-session", "-d", "-x", "200", "-y", "50", cmd], env=env,
                   check=True, timeout=30)
    return psutil.Process(_ui_pid(run_id))


def detach() -> None:
    _tmux("kill-server", check=False)


def steps_between(run, rank: int, t0: float, t1: float) -> list[float]:
    return [s.step_ms for s in run.steps(rank) if t0 <= s.ts <= t1 and s.step_ms > 0]


def attached_vs_absent(args: argparse.Namespace, work: Path) -> dict:
    run_id = f"uicost{os.getpid()}"
    runtime = work / "runtime"
    runtime.mkdir(mode=0o700)
    os.environ["RINGTOP_RUNTIME_DIR"] = str(runtime)  # start_agents' ranks and the UI find the run here
    env = dict(os.environ, TERM="xterm-256color", PYTHONWARNINGS="ignore")
    run = start_agents(work / "run", 2, "--steps", "0", "--run-id", run_id, *args.agent_args.split())
    rounds: list[dict] = []
    try:
        run.wait_for_step(args.warmup_steps, timeout_s=300)
        for r in range(args.rounds):
            order = ("absent", "attached") if r % 2 == 0 else ("attached", "absent")
            medians: dict[str, dict] = {}
            for arm in order:
                ui = attach(run_id, env) if arm == "attached" else None
                time.sleep(args.settle)  # not measured: the UI starting, or the machine after its exit
                cpu0 = ui.cpu_times() if ui is not None else None
                t0 = time.time()
                time.sleep(args.window)
                t1 = time.time()
                cpu = None
                if ui is not None:
                    if not ui.is_running():
                        raise RuntimeError("the UI exited during its window (see the tmux pane)")
                    c = ui.cpu_times()
                    cpu = round(100.0 * ((c.user - cpu0.user) + (c.system - cpu0.system)) / (t1 - t0), 2)
                    detach()
                medians[arm] = {"ui_cpu_percent": cpu, **{
                    f"rank{k}_step_ms": round(statistics.median(steps_between(run, k, t0, t1)), 2) for k in (0, 1)}}
            row = {"round": r, "order": list(order), **medians,
                   **{f"rank{k}_ratio": round(medians["attached"][f"rank{k}_step_ms"]
                                              / medians["absent"][f"rank{k}_step_ms"], 4) for k in (0, 1)}}
            rounds.append(row)
            print(f"round {r}: {json.dumps(row)}", file=sys.stderr, flush=True)
    finally:
        detach()
        kill(run)
    out = {"rounds": rounds}
    for k in (0, 1):
        ratios = [row[f"rank{k}_ratio"] for row in rounds]
        out[f"rank{k}_attached_vs_absent"] = round(statistics.median(ratios), 4)
        out[f"rank{k}_ratio_range"] = [min(ratios), max(ratios)]
    out["ui_cpu_percent_2_ranks"] = round(statistics.median(row["attached"]["ui_cpu_percent"] for row in rounds), 2)
    return out


def simulated_ui_cpu(ranks: int, args: argparse.Namespace, work: Path) -> dict:
    """`ringtop ui` in tmux on `ringtop simulate --ranks N`: its CPU over `--seconds` once on screen."""
    runtime = work / f"sim-runtime-{ranks}"
    runtime.mkdir(mode=0o700)
    env = dict(os.environ, RINGTOP_RUNTIME_DIR=str(runtime), TERM="xterm-256color", PYTHONWARNINGS="ignore")
    status, run_id = work / f"sim-status-{ranks}.json", f"sim{ranks}"
    sim = subprocess.Popen([sys.executable, "-m", "ringtop.cli.main", "simulate", "--ranks", str(ranks), "--nodes",
                            str(max(1, ranks // 8)), "--hz", str(args.hz), "--seed", "0", "--run-id", run_id,
                            "--status-file", str(status), "--rank-procs", "1"], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not status.exists():
            if sim.poll() is not None or time.monotonic() > deadline:
                return {"ranks": ranks, "error": f"the simulator did not start (exit {sim.poll()})"}
            time.sleep(0.2)
        ui = attach(run_id, env)
        time.sleep(args.settle + 5)  # every rank's row on screen, its histories filling
        c0, t0 = ui.cpu_times(), time.time()
        time.sleep(args.seconds)
        c1, t1 = ui.cpu_times(), time.time()
        return {"ranks": ranks, "hz": args.hz, "nice": ui.nice(),
                "ui_cpu_percent": round(100.0 * ((c1.user - c0.user) + (c1.system - c0.system)) / (t1 - t0), 2)}
    finally:
        detach()
        sim.terminate()
        try:
            sim.wait(30)
        except subprocess.TimeoutExpired:
            sim.kill()
            sim.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--window", type=float, default=10.0, help="seconds measured per arm and round")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds dropped at each arm's start")
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--agent-args", default="", help="extra agent options, one string")
    parser.add_argument("--sizes", default="8,64", help="simulated rank counts for the UI's CPU ('' for none)")
    parser.add_argument("--hz", type=float, default=10.0, help="the simulator's steps per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="the simulated sizes' measured window")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        sys.exit("bench_ui_cost: needs tmux (apt-get install tmux)")
    result: dict = {"date": None, "cpus": os.cpu_count(), "load_average_start": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="bench-ui-cost-") as tmp:
        result["attached_vs_absent"] = attached_vs_absent(args, Path(tmp))
        scale_args = argparse.Namespace(hz=args.hz, seconds=args.seconds, warmup=4.0, fill_timeout=60.0,
                                        start_timeout=180.0, attach_timeout=60.0, rank_procs=1, profile=None,
                                        digests_from=None, neighbours=0, tracemalloc=False, tracemalloc_after=0.0)
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        result["ui_cpu_terminal"] = []
        for n in sizes:
            result["ui_cpu_terminal"].append(simulated_ui_cpu(n, args, Path(tmp)))
            print(f"ringtop ui on {n} simulated ranks: {result['ui_cpu_terminal'][-1]}", file=sys.stderr, flush=True)
        rows = []
        for n in sizes:
            row = bench_ui_scale.one_size(n, scale_args, Path(tmp))
            rows.append({k: row.get(k) for k in ("ranks", "hz", "ui_cpu_percent", "repaint_ms_median",
                                                  "ingest_msgs_per_s", "error") if k in row})
            print(f"{n} simulated ranks: {rows[-1]}", file=sys.stderr, flush=True)
        result["ui_cpu_headless"] = rows
    result["load_average_end"] = os.getloadavg()
    result["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(json.dumps(result, indent=1 if args.json else None))


if __name__ == "__main__":
    main()
