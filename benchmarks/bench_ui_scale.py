"""The UI at scale (issue 15): the real app, headless, fed by `ringtop simulate` at N ranks x H Hz.

Per size, three processes: this driver; the simulator (`ringtop simulate`, the real relay, keys
and connection file); and a UI worker (this script with `--worker`), so the UI's CPU and memory
are its own. The worker runs the real `RingtopApp` with `App.run_test(size=(200, 60))` on the
Overview tab, fed by its normal live client from the simulator's connection file, and measures
from outside `tui/` by wrapping methods in its own process (nothing in tui/ is edited):

- repaint: one refresh tick (`RingtopApp.refresh_view`: the header's and the Overview's models
  built and handed to their widgets) plus every screen update that follows it until the next tick
  (`textual.screen.Screen._on_timer_update`: layout, the compositor rendering the changed widgets,
  and, because headless Textual skips it, the terminal output a real terminal would get:
  `CompositorUpdate.render_segments`, added in a wrapper of `App._display`);
- ingest: messages folded into the view model per second (`RunView.messages_total`; a digest of
  the relay's counts once) and steps folded into the ranks' histories per second
  (`steps_folded_per_s`: whole or by a digest's brief, counted around `RunView._fold_step`);
  from `--digests-from` ranks on (the UI's default, 128) the UI takes the relay's digests instead
  of every step (agent/transport/step_digest.py); `--digests-from 0` measures the UI taking every step;
- lag: the newest step the simulator has published (its `--status-file`, rewritten every step)
  minus the newest step on screen (the view model's newest step at the latest refresh tick),
  sampled every 0.1 s on the app's own event loop (so a blocked loop shows as lag);
- UI CPU % (user + system over wall, all threads: the receive thread's decoding included) and RSS
  (psutil), the RSS at the window's start and end ("flat" memory: the growth, `rss_growth_mb`);
  the window starts once every rank's bounded histories are full (`histories_full`), so a
  growth is memory the UI keeps taking, not its histories filling; the worker's own records of
  the window take their memory before it starts (benchmarks/_window_records.py);
- garbage collection: its longest pause, its time per second, its passes and full passes in the window;
- the head relay's forward rate: the simulator's relay `forwarded` counter over the window.

Each size is bounded (the simulator's start, the worker's window plus a margin) and everything
started is killed at the end, also on a timeout; a size that does not finish gives a row with
its error. Rows are compared with the 8-rank row of the same run (`*_vs_base`).

    python benchmarks/bench_ui_scale.py [--ranks 8,64,256,1024,4096] [--hz 10] [--seconds 12] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _window_records import Cycles, Series, p95, parts_medians, slope_per_min

from ringtop.agent.lifecycle import exit_with_parent

SIZES = (8, 64, 256, 1024, 4096)
MAX_TICKS_PER_S = 8
"""Refresh ticks a second the worker makes room for: one per digest folded, at most one per
0.15 s (tui/sources/feeds.py DIGEST_REFRESH_GAP_S), and the app's timer."""
ROW_KEYS = ("ranks", "hz", "repaint_ms_median", "repaint_ms_p95", "ingest_msgs_per_s", "lag_steps_max",
            "ui_cpu_percent", "rss_mb")


def _read_status(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------------- the UI worker


PART_TIMES: dict[str, float] = {}
"""Wall ms per part since the last refresh tick: where a repaint's time goes (`_time_parts`)."""


def _time_parts() -> None:
    """Wrap, from outside tui/, what a repaint is made of, each into PART_TIMES by name. In the
    tick (the models): the header's model, the Overview's model and, inside it, its node
    aggregates, rank rows, the run's step parts and charts. In the paint (Textual): `layout` (the
    compositor's reflow), `render <Widget>` (each widget class's lines), the rest the compositor's
    own (chops, segments). Nested names are inside their parent's time."""
    import functools

    from textual._compositor import Compositor
    from textual.widget import Widget

    from ringtop.tui.app import RingtopApp
    from ringtop.tui.state.view_model import RunView
    from ringtop.tui.tabs.overview import panel, parts

    def timed(owner, attr: str, name) -> None:
        original = getattr(owner, attr, None)
        if original is None:  # another version of the UI (a `before` run)
            return

        @functools.wraps(original)
        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return original(*a, **kw)
            finally:
                key = name(a) if callable(name) else name
                PART_TIMES[key] = PART_TIMES.get(key, 0.0) + (time.perf_counter() - t) * 1e3

        setattr(owner, attr, wrapper)

    timed(RingtopApp, "_header_model", "tick: header")
    timed(panel.OverviewTab, "model", "tick: overview")
    timed(panel.OverviewTab, "_aggregates", "tick: overview > node aggregates")
    timed(panel.OverviewTab, "_rank_rows", "tick: overview > rank rows")
    timed(panel.OverviewTab, "_charts", "tick: overview > charts")
    timed(getattr(parts, "RunParts", None), "get", "tick: overview > run step parts")
    timed(panel, "run_parts", "tick: overview > run step parts")
    timed(panel, "health_line", "tick: overview > health line")
    timed(panel, "sort_nodes", "tick: overview > node rows sorted")
    timed(RunView, "rows", "tick: overview > ranks ordered (slowest)")
    timed(RunView, "tick", "tick: view tick (liveness, verdicts)")
    timed(Compositor, "reflow", "paint: layout")
    timed(Compositor, "reflow_visible", "paint: layout")
    timed(Widget, "render_lines", lambda a: f"paint: render {type(a[0]).__name__}")


def worker(args: argparse.Namespace) -> None:
    """The UI process: the real app on the simulator's run, instrumented from outside tui/."""
    import psutil
    from textual._compositor import CompositorUpdate
    from textual.screen import Screen

    from ringtop.protocol import connection_file
    from ringtop.tui.app import RingtopApp
    from ringtop.tui.state.view_model import RunView

    info = connection_file.read(Path(args.connection))
    cycles = Cycles(int(args.seconds * MAX_TICKS_PER_S) + 64)
    """One per refresh tick: its own time and the screen updates until the next tick."""
    shown = {"step": -1, "ts": 0.0}

    def newest_step(view) -> int:
        return max((r.step for r in list(view.ranks.values())), default=-1)

    def newest_step_ts(view) -> float:
        return max((r.latest.ts for r in list(view.ranks.values()) if r.latest is not None), default=0.0)

    original_refresh = RingtopApp.refresh_view

    def refresh_view(self) -> None:
        shown["step"] = newest_step(self.view)  # what this tick puts on screen (not timed)
        shown["ts"] = newest_step_ts(self.view)
        if len(cycles):
            cycles.set_parts(PART_TIMES)
        PART_TIMES.clear()
        t, c = time.perf_counter(), time.thread_time()
        original_refresh(self)
        cycles.start(at=time.monotonic(), tick_ms=(time.perf_counter() - t) * 1e3,
                     tick_cpu_ms=(time.thread_time() - c) * 1e3)

    original_update = Screen._on_timer_update

    def on_timer_update(self) -> None:
        t, c = time.perf_counter(), time.thread_time()
        original_update(self)
        if len(cycles):
            cycles.add_to_last("paint_ms", (time.perf_counter() - t) * 1e3)
            cycles.add_to_last("paint_cpu_ms", (time.thread_time() - c) * 1e3)
            cycles.add_to_last("paints", 1)

    original_display = RingtopApp._display

    def display(self, screen, renderable) -> None:
        original_display(self, screen, renderable)
        if isinstance(renderable, CompositorUpdate) and self.is_headless:
            c = time.thread_time()
            renderable.render_segments(self.console)  # what a real terminal would be sent
            if len(cycles):
                cycles.add_to_last("segments_cpu_ms", (time.thread_time() - c) * 1e3)

    folded = {"steps": 0}
    original_fold_step = RunView._fold_step

    def fold_step(self, *a, **kw) -> None:
        folded["steps"] += 1
        original_fold_step(self, *a, **kw)

    RunView._fold_step = fold_step
    _time_parts()
    RingtopApp.refresh_view = refresh_view
    Screen._on_timer_update = on_timer_update
    RingtopApp._display = display

    gc_window = {"on": False, "max_ms": 0.0, "total_ms": 0.0, "full": 0, "passes": 0}
    """The garbage collections in the window (`on`): each holds the GIL, so every thread, the UI's
    loop included, waits through it. Added up as they come: a record of each would grow."""
    gc_started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_started[0] = time.perf_counter()
        elif gc_window["on"]:
            ms = (time.perf_counter() - gc_started[0]) * 1e3
            gc_window["max_ms"] = max(gc_window["max_ms"], ms)
            gc_window["total_ms"] += ms
            gc_window["full"] += info["generation"] == 2
            gc_window["passes"] += 1

    gc.callbacks.append(on_gc)
    proc = psutil.Process()
    app = RingtopApp(publish_addr=info.publish, control_addr=info.control, keys=info.keys,
                     **({} if args.digests_from is None else {"digest_min_ranks": args.digests_from or 1 << 21}))
    hz = args.hz

    rss_series = Series(int(args.seconds) + 8)
    """RSS (MB) each second of the window: flat once the view's bounded histories are full."""
    lags, lags_s = Series(int(args.seconds * 10) + 64), Series(int(args.seconds * 10) + 64)
    """Steps and seconds the screen is behind the simulator, every 0.1 s of the window."""

    def histories_full(view) -> bool:
        rows = list(view.ranks.values())
        return bool(rows) and all(len(r.step_ms_history) == r.step_ms_history.maxlen
                                  and len(r.comm_history) == r.comm_history.maxlen for r in rows)

    def row_so_far(start: dict, now_status: dict | None, final: bool) -> dict:
        now = time.monotonic()
        cpu = proc.cpu_times()
        wall = now - start["mono"]
        window = {k: cycles.column(k) for k in ("tick_ms", "paint_ms", "tick_cpu_ms", "paint_cpu_ms",
                                                "segments_cpu_ms", "paints")}
        repaint = [t + p for t, p in zip(window["tick_ms"], window["paint_ms"])]
        repaint_cpu = [t + p for t, p in zip(window["tick_cpu_ms"], window["paint_cpu_ms"])]
        lag_steps, lag_s, rss = lags.values(), lags_s.values(), rss_series.values()

        def median(key: str) -> float | None:
            return round(statistics.median(window[key]), 2) if repaint else None

        row = {
            "ranks": args.ranks, "hz": hz,
            "repaint_ms_median": round(statistics.median(repaint), 2) if repaint else None,
            "repaint_ms_p95": round(p95(repaint), 2) if repaint else None,
            "ingest_msgs_per_s": round((app.view.messages_total - start["applied"]) / wall, 1),
            "steps_folded_per_s": round((folded["steps"] - start["folded"]) / wall, 1),
            "digests": app.view.via_digests,
            "lag_steps_max": int(max(lag_steps)) if lag_steps else None,
            "ui_cpu_percent": round(100.0 * (cpu.user + cpu.system - start["cpu"]) / wall, 1),
            "rss_mb": round(proc.memory_info().rss / 2**20, 1),
            "rss_start_mb": round(start["rss"] / 2**20, 1),
            "rss_growth_mb": round((proc.memory_info().rss - start["rss"]) / 2**20, 1),
            "histories_full": start["full"],
            "repaint_cpu_ms_median": round(statistics.median(repaint_cpu), 2) if repaint_cpu else None,
            "repaint_cpu_ms_p95": round(p95(repaint_cpu), 2) if repaint_cpu else None,
            "repaints": len(repaint),
            "tick_ms_median": median("tick_ms"),
            "paint_ms_median": median("paint_ms"),
            "lag_steps_median": statistics.median(lag_steps) if lag_steps else None,
            "tick_cpu_ms_median": median("tick_cpu_ms"),
            "paint_cpu_ms_median": median("paint_cpu_ms"),
            "segments_cpu_ms_median": median("segments_cpu_ms"),
            "paints_per_tick_median": median("paints"),
            "lag_s_max": round(max(lag_s), 2) if lag_s else None,
            "lag_s_p95": round(p95(lag_s), 2) if lag_s else None,
            "lag_s_median": round(statistics.median(lag_s), 2) if lag_s else None,
            "received_msgs_per_s": round((app.client.received - start["received"]) / wall, 1) if app.client else None,
            "gc_pause_ms_max": round(gc_window["max_ms"], 1),
            "gc_ms_per_s": round(gc_window["total_ms"] / wall, 1),
            "gc_full_passes": gc_window["full"],
            "gc_passes": gc_window["passes"],
            "window_s": round(wall, 2), "final": final, "rss_mb_each_s": rss,
            "parts_ms_median": parts_medians(cycles),
            "rss_growth_mb_per_min": slope_per_min(rss),
        }
        if now_status and start["status"]:
            first = start["status"]
            dt = now_status["ts"] - first["ts"]
            if dt > 0:
                row["relay_forward_msgs_per_s"] = round((now_status["forwarded"] - first["forwarded"]) / dt, 1)
                row["sim_offered_msgs_per_s"] = round((now_status["sent"] - first["sent"]) / dt, 1)
                row["sim_steps_per_s"] = round((now_status["step"] - first["step"]) / dt, 2)
                row["relay_dropped"] = now_status["dropped"]
        return row

    def write(row: dict) -> None:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(row, f)
        os.replace(tmp, args.out)

    async def drive() -> None:
        async with app.run_test(size=(200, 60)) as pilot:
            deadline = time.monotonic() + args.attach_timeout
            while not app.view.ranks or len(app.view.ranks) < args.ranks:  # every rank's row is there
                if time.monotonic() > deadline:
                    break
                await pilot.pause(0.2)
            await asyncio.sleep(args.warmup)
            fill_deadline = time.monotonic() + args.fill_timeout
            while not histories_full(app.view) and time.monotonic() < fill_deadline:
                await asyncio.sleep(0.5)  # "flat" memory: measured once the bounded histories hold all they keep
            full = histories_full(app.view)
            for series in (cycles, lags, lags_s, rss_series):
                series.clear()
            gc_window.update(on=True, max_ms=0.0, total_ms=0.0, full=0, passes=0)
            start = {"mono": time.monotonic(), "cpu": sum(proc.cpu_times()[:2]), "rss": proc.memory_info().rss,
                     "applied": app.view.messages_total, "folded": folded["steps"],
                     "received": app.client.received if app.client else 0,
                     "status": _read_status(args.status_file), "full": full}
            traced = None
            if args.tracemalloc:  # where memory that stays is allocated (slows the UI: not for the numbers)
                import tracemalloc

                tracemalloc.start(1)
                traced = tracemalloc.take_snapshot()
            traced_at = start["mono"] + args.tracemalloc_after if args.tracemalloc_after > 0 else 0.0
            profile = None
            if args.profile:  # the UI thread's calls over the window (cProfile: this thread only)
                import cProfile

                profile = cProfile.Profile()
                profile.enable()
            next_write = time.monotonic() + 1.0
            end = start["mono"] + args.seconds
            while time.monotonic() < end:
                await asyncio.sleep(0.1)
                status = _read_status(args.status_file)
                if status is not None and shown["step"] >= 0:
                    lags.add(status["step"] - shown["step"])
                    lags_s.add(max(0.0, status["ts"] - shown["ts"]))
                if time.monotonic() >= next_write:
                    rss_series.add(round(proc.memory_info().rss / 2**20, 1))
                    write(row_so_far(start, status, final=False))
                    next_write += 1.0
                if traced is not None and traced_at and time.monotonic() >= traced_at:
                    traced, traced_at = tracemalloc.take_snapshot(), 0.0  # growth from here on
            if profile is not None:
                profile.disable()
                profile.dump_stats(os.path.join(args.profile, f"ui-{args.ranks}.pstats"))
            row = row_so_far(start, _read_status(args.status_file), final=True)
            if traced is not None:
                import tracemalloc

                grown = tracemalloc.take_snapshot().compare_to(traced, "lineno")
                row["tracemalloc_growth"] = [
                    {"kb": round(d.size_diff / 1024, 1), "blocks": d.count_diff,
                     "where": [f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in d.traceback][-4:]}
                    for d in grown[:15]]
            write(row)

    asyncio.run(drive())


# ---------------------------------------------------------------------- the driver


def _stop(proc: subprocess.Popen, grace_s: float) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def one_size(ranks: int, args: argparse.Namespace, workdir: Path) -> dict:
    runtime = workdir / f"runtime-{ranks}"
    runtime.mkdir(mode=0o700)
    env = dict(os.environ, RINGTOP_RUNTIME_DIR=str(runtime), PYTHONWARNINGS="ignore")
    status, out = str(workdir / f"status-{ranks}.json"), str(workdir / f"row-{ranks}.json")
    sim_log = open(workdir / f"simulate-{ranks}.txt", "wb")
    run_id = f"bench{ranks}"
    nodes = max(1, ranks // 8)
    sim = subprocess.Popen([sys.executable, "-m", "ringtop.cli.main", "simulate", "--ranks", str(ranks), "--nodes",
                            str(nodes), "--hz", str(args.hz), "--seed", "0", "--run-id", run_id, "--status-file",
                            status, "--rank-procs", str(min(args.rank_procs, ranks - 1))], stdout=sim_log,
                           stderr=subprocess.STDOUT, env=env, start_new_session=True, preexec_fn=exit_with_parent)
    ui = None
    neighbours: list[subprocess.Popen] = []
    row: dict = {"ranks": ranks, "hz": args.hz, "neighbours": args.neighbours}
    try:
        path = runtime / f"run-{run_id}.json"
        deadline = time.monotonic() + args.start_timeout
        while _read_status(status) is None:  # the simulator's first step: all ranks connected and subscribed
            if sim.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the simulator did not start within {args.start_timeout:g} s "
                                   f"(exit {sim.poll()})")
            time.sleep(0.2)
        neighbours = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True,
                                       preexec_fn=exit_with_parent) for _ in range(args.neighbours)]
        started = time.monotonic()
        ui = subprocess.Popen([sys.executable, __file__, "--worker", "--connection", str(path), "--status-file",
                               status, "--out", out, "--ranks", str(ranks), "--hz", str(args.hz), "--seconds",
                               str(args.seconds), "--warmup", str(args.warmup), "--fill-timeout",
                               str(args.fill_timeout), "--attach-timeout", str(args.attach_timeout),
                               *(["--profile", args.profile] if args.profile else []),
                               *(["--tracemalloc", "--tracemalloc-after", str(args.tracemalloc_after)]
                                 if args.tracemalloc else []),
                               *([] if args.digests_from is None else ["--digests-from", str(args.digests_from)])],
                              stdout=subprocess.DEVNULL, stderr=open(workdir / f"ui-{ranks}.txt", "wb"), env=env,
                              start_new_session=True, preexec_fn=exit_with_parent)
        budget = args.attach_timeout + args.warmup + args.fill_timeout + args.seconds + 60
        try:
            ui.wait(budget)
        except subprocess.TimeoutExpired:
            row["error"] = f"the UI did not finish within {budget:g} s (killed)"
        got = _read_status(out)
        if got is not None:
            row.update(got)
        elif "error" not in row:
            row["error"] = f"the UI wrote no row (exit {ui.returncode}): " + \
                (workdir / f"ui-{ranks}.txt").read_text(errors="replace")[-600:]
        row["ui_seconds"] = round(time.monotonic() - started, 1)
    except RuntimeError as exc:
        row["error"] = str(exc)
    finally:
        for proc in [*neighbours, *([ui] if ui is not None else [])]:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        _stop(sim, 60)
        sim_log.close()
    final = _read_status(status)
    if final is not None:
        row["sim_final"] = final
    row["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default=",".join(map(str, SIZES)), help="sizes, comma-separated (default "
                        "%(default)s; the first is the baseline)")
    parser.add_argument("--hz", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=12.0, help="measured window per size")
    parser.add_argument("--warmup", type=float, default=4.0, help="after every rank's row is on screen")
    parser.add_argument("--fill-timeout", type=float, default=60.0,
                        help="after the warmup, at most this long for every rank's bounded histories to fill")
    parser.add_argument("--start-timeout", type=float, default=180.0, help="for the simulator to connect its ranks")
    parser.add_argument("--attach-timeout", type=float, default=60.0, help="for the UI to show every rank")
    parser.add_argument("--rank-procs", type=int, default=1, metavar="K",
                        help="the simulator's ranks 1..N-1 in K processes apart from its head relay (default "
                             "%(default)s; 0: every rank in the relay's process, sharing its GIL)")
    parser.add_argument("--neighbours", type=int, default=0, metavar="K",
                        help="K busy-loop processes on the same cores while the UI runs (a CPU-bound neighbour)")
    parser.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    parser.add_argument("--tracemalloc", action="store_true", help="add the 15 allocation sites whose memory grew "
                        "most over the window (tracemalloc; slows the UI: not for the numbers)")
    parser.add_argument("--tracemalloc-after", type=float, default=0.0, metavar="S",
                        help="with --tracemalloc: the growth from S seconds into the window on (bounded "
                             "buffers that fill early left out)")
    parser.add_argument("--profile", metavar="DIR", help="write the UI thread's cProfile stats of each size's "
                        "window to DIR/ui-RANKS.pstats (slows the UI: not for the numbers)")
    parser.add_argument("--digests-from", type=int, default=None, metavar="N",
                        help="the UI's `ringtop ui --digests-from` (default: the UI's; 0: every step)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--connection", help=argparse.SUPPRESS)
    parser.add_argument("--status-file", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.ranks = int(args.ranks)
        worker(args)
        return
    sizes = [int(s) for s in args.ranks.split(",") if s]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-ui-scale-") as tmp:
        for ranks in sizes:
            t = time.monotonic()
            row = one_size(ranks, args, Path(tmp))
            rows.append(row)
            print(f"{ranks} ranks: " + ", ".join(f"{k} {row.get(k)}" for k in ROW_KEYS[2:])
                  + (f"; error: {row['error']}" if "error" in row else "") + f" ({time.monotonic() - t:.0f} s)",
                  file=sys.stderr, flush=True)
    base = rows[0]
    for row in rows:
        for key in ("repaint_ms_median", "repaint_ms_p95", "ui_cpu_percent", "rss_mb"):
            if row.get(key) is not None and base.get(key):
                row[f"{key}_vs_base"] = round(row[key] / base[key], 3)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    extra = ("steps_folded_per_s", "digests", "relay_forward_msgs_per_s")
    print("| " + " | ".join(ROW_KEYS + extra) + " |")
    print("|" + "---|" * (len(ROW_KEYS) + len(extra)))
    for row in rows:
        print("| " + " | ".join(str(row.get(k, "-")) for k in ROW_KEYS + extra) + " |")


if __name__ == "__main__":
    main()
