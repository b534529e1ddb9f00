"""The Memory and Comm tabs at scale (issue 15, point 4): a `RunView` fed with N ranks' messages
(tests/helpers/scale_scenario.py: 8 nodes of N/8 ranks, one straggler), then per tab the model build
(`MemoryTab.model` / `CommTab.model`: the first, then live 4 Hz repaints with a new step of
every rank between them) and, in the
real app (`App.run_test`), the tab's key pressed until the panel has drawn, and a repaint there.

    python benchmarks/bench_tab_scale.py [--ranks 32,1024] [--steps 40] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "helpers"))

import scale_scenario as sc  # noqa: E402

from ringtop.tui.app import RingtopApp  # noqa: E402
from ringtop.tui.state.view_model import RunView  # noqa: E402
from ringtop.tui.tabs.comm.panel import CommTab  # noqa: E402
from ringtop.tui.tabs.memory.panel import MemoryTab  # noqa: E402


def messages(ranks: int, steps: int) -> list:
    sc.PER_NODE = max(1, ranks // sc.NODES)
    return sc.run(steps=steps, world=ranks)


def _ms(t: float) -> float:
    return round((time.perf_counter() - t) * 1e3, 2)


def _call(build, *args, **live):
    """The panels' builds before the tabs' scaling work took no `now` / `replay` (to compare with them)."""
    try:
        return build(*args, **live)
    except TypeError:
        return build(*args)


def builds(msgs: list, rounds: int, ranks: int, steps: int) -> dict:
    """Model builds without Textual: the first (the tab opened), then live 4 Hz repaints, each after
    a new step of every rank was folded in (not timed): their median and their worst."""
    view = RunView(watch_liveness=False)
    view.apply_many(msgs, now=1.0)
    seq = sc.hs.Seq()
    for _ in range(steps):
        for r in range(ranks):
            seq(r)
    out = {}
    step = steps
    for tab, panel, build in (("memory", MemoryTab, lambda b, now: _call(b.model, view, 156, now=now, replay=False)),
                              ("comm", CommTab, lambda b, now: _call(b.model, view, None, 156, now=now, replay=False))):
        b, now = panel(), 10.0
        t = time.perf_counter()
        build(b, now)
        first = _ms(t)
        again = []
        for _ in range(rounds * 4):
            step += 1
            view.apply_many([sc.step(r, step, seq(r), ranks) for r in range(ranks)], now=now)
            now += 0.25
            t = time.perf_counter()
            build(b, now)
            again.append(_ms(t))
        out[tab] = {"build_first_ms": first, "build_repaint_ms_median": statistics.median(again),
                    "build_repaint_ms_max": max(again)}
    return out


async def in_app(msgs: list, rounds: int) -> dict:
    """The real app: press the tab's key, wait until its panel drew; then repaints on that tab."""
    app = RingtopApp(messages=msgs, source="bench")
    out: dict = {}
    async with app.run_test(size=(160, 48)) as pilot:
        while not app.replay_loaded:
            await pilot.pause(0.05)
        app.refresh_view()
        await pilot.pause()
        for key, tab in (("2", "memory"), ("3", "comm"), ("1", "overview"), ("2", "memory"), ("3", "comm")):
            t = time.perf_counter()
            await pilot.press(key)
            await pilot.pause()
            switch = _ms(t)
            reps = []
            for _ in range(rounds):
                app.view.versions.update(("ranks", "comm"))
                t = time.perf_counter()
                app.refresh_view()
                await pilot.pause()
                reps.append(_ms(t))
            out.setdefault(tab, []).append({"switch_ms": switch, "repaint_ms_median": statistics.median(reps)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", default="32,1024")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for n in (int(x) for x in args.ranks.split(",")):
        msgs = messages(n, args.steps)
        row = {"ranks": n, "steps": args.steps, **builds(msgs, args.rounds, n, args.steps)}
        row["app"] = asyncio.run(in_app(msgs, args.rounds))
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    print(json.dumps({"date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
