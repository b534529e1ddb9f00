"""The UI's fold of a message into its view model, in µs per Step (issue 15: 1024 ranks × 10 Hz).

What is timed: the app's own handler, `Feeds.on_telemetry_batch`, called on a stand-in for the app
(an object with a `view` = a `RunView`), with batches of BATCH messages (what the receive thread
hands over every 50 ms at ~12k messages/s). The messages are `tests/helpers/scale_scenario.py`'s: Hellos
of every rank first (not timed), then `step(rank, n, seq)` for every rank, step by step, decoded
objects built before the clock starts. A size's µs per Step = the CPU time of the worker
process (`time.process_time`: on a shared VM a descheduled process's wall time says more about its
neighbours than about the fold; the wall time is kept too) folding all its steps / their number
(STEP_MESSAGES per size: 7,680 steps × 8 ranks, 240 × 256, 60 × 1024).

Two arms, each its own process (so neither warms the other's caches, and each imports its own
`ringtop`): `current`, the working tree as installed, and `baseline`, the code of a git ref
(`--baseline`, default `main`) exported with `git archive` into a temporary directory put first on
PYTHONPATH. Each worker says which `view_model.py` it imported, and the JSON records it. Rounds
alternate the arms (baseline first in even rounds, current first in odd ones); the row per size
is the median over rounds, and the ratio is the median of the per-round ratios current / baseline
(target ≤ 1/3). The machine is shared: see `uptime`'s load in the output.

    python benchmarks/bench_ui_ingest.py [--ranks 8,256,1024] [--rounds 5] [--baseline main] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
SIZES = (8, 256, 1024)
STEP_MESSAGES = 61_440
"""Steps folded per size (ranks × steps), so every size times the same amount of work."""
BATCH = 600
"""Messages per TelemetryBatch: 50 ms of a 1024-rank run at 10 Hz (plus heartbeats)."""
TARGET = 1 / 3


def worker(sizes: list[int]) -> dict:
    """One arm's round: µs per Step folded, per size."""
    sys.path.insert(0, str(ROOT / "tests" / "helpers"))
    import hang_scenario as hs
    import scale_scenario as sc

    import ringtop.tui.state.view_model as vm
    from ringtop.tui.sources.feeds import Feeds

    class Host(Feeds):
        def __init__(self, view: vm.RunView) -> None:
            self.view = view

    out = {"view_model": vm.__file__, "us_per_step": {}, "wall_us_per_step": {}}
    for ranks in sizes:
        steps = max(1, STEP_MESSAGES // ranks)
        seq = hs.Seq()
        hellos = [sc.hello(r, ranks) for r in range(ranks)]
        msgs = [sc.step(r, n, seq(r), ranks, straggler=ranks // 2) for n in range(1, steps + 1) for r in range(ranks)]
        batches = [SimpleNamespace(messages=msgs[i:i + BATCH], rejected=[]) for i in range(0, len(msgs), BATCH)]
        host = Host(vm.RunView())
        host.view.apply_many(hellos, now=0.0)
        w0, t0 = time.perf_counter(), time.process_time()
        for b in batches:
            Host.on_telemetry_batch(host, b)
        cpu, wall = time.process_time() - t0, time.perf_counter() - w0
        assert host.view.messages_total == len(hellos) + len(msgs)
        out["us_per_step"][str(ranks)] = cpu / len(msgs) * 1e6
        out["wall_us_per_step"][str(ranks)] = wall / len(msgs) * 1e6
    return out


def _export(ref: str, into: Path) -> str:
    """The ref's tree as a `ringtop` package under `into` (the repo root is the package)."""
    commit = subprocess.run(["git", "rev-parse", ref], cwd=ROOT, check=True, capture_output=True,
                            text=True).stdout.strip()
    pkg = into / "ringtop"
    pkg.mkdir()
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(pkg)], input=archive, check=True)
    (pkg / "__init__.py").touch()
    return commit


def _run_arm(sizes: list[int], pythonpath: str | None) -> dict:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, __file__, "--worker", "--ranks", ",".join(map(str, sizes))],
                          env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default=",".join(map(str, SIZES)))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline", default="main", help="git ref of the baseline arm")
    ap.add_argument("--json", action="store_true", help="print the JSON object only (else also a table)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [int(x) for x in args.ranks.split(",") if x]
    if args.worker:
        print(json.dumps(worker(sizes)))
        return
    load = os.getloadavg()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="bench_ui_ingest-") as tmp:
        commit = _export(args.baseline, Path(tmp))
        rounds = []
        for i in range(args.rounds):
            order = ("baseline", "current") if i % 2 == 0 else ("current", "baseline")
            got = {arm: _run_arm(sizes, tmp if arm == "baseline" else None) for arm in order}
            rounds.append(got)
            print(f"round {i}: " + ", ".join(
                f"{n}: {got['current']['us_per_step'][str(n)]:.2f} vs {got['baseline']['us_per_step'][str(n)]:.2f} µs"
                for n in sizes), file=sys.stderr)
        files = {arm: rounds[0][arm]["view_model"] for arm in ("baseline", "current")}
    assert files["baseline"].startswith(tmp) and not files["current"].startswith(tmp), files
    rows = []
    for n in sizes:
        cur = [r["current"]["us_per_step"][str(n)] for r in rounds]
        base = [r["baseline"]["us_per_step"][str(n)] for r in rounds]
        ratio = statistics.median(c / b for c, b in zip(cur, base))
        rows.append({"ranks": n, "current_us_per_step": round(statistics.median(cur), 2),
                     "baseline_us_per_step": round(statistics.median(base), 2),
                     "current_wall_us_per_step": round(statistics.median(
                         r["current"]["wall_us_per_step"][str(n)] for r in rounds), 2),
                     "baseline_wall_us_per_step": round(statistics.median(
                         r["baseline"]["wall_us_per_step"][str(n)] for r in rounds), 2),
                     "ratio": round(ratio, 3), "ratio_min": round(min(c / b for c, b in zip(cur, base)), 3),
                     "ratio_max": round(max(c / b for c, b in zip(cur, base)), 3),
                     "met": ratio <= TARGET, "current_rounds": [round(x, 2) for x in cur],
                     "baseline_rounds": [round(x, 2) for x in base]})
    result = {
        "benchmark": "bench_ui_ingest",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(time.time() - started, 1),
        "baseline_ref": args.baseline, "baseline_commit": commit,
        "view_model_files": files,
        "rounds": args.rounds, "batch": BATCH, "step_messages_per_size": STEP_MESSAGES,
        "target_ratio": round(TARGET, 3),
        "load_average_start": [round(x, 2) for x in load],
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "python": sys.version.split()[0],
        "rows": rows,
    }
    if not args.json:
        for r in rows:
            print(f"{r['ranks']:>5} ranks: {r['current_us_per_step']:.2f} µs/step vs {r['baseline_us_per_step']:.2f} "
                  f"(ratio {r['ratio']:.3f}, rounds {r['ratio_min']:.3f}–{r['ratio_max']:.3f})", file=sys.stderr)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
