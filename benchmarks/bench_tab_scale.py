"""The Memory and Comm tabs at scale (issue 15, point 4): a `RunView` fed with N ranks' messages
(tests/scale_scenario.py: 8 nodes of N/8 ranks, one straggler), then per tab the model build
(`Builders.memory` / `Builders.comm_tab`, the first and the following 4 Hz repaints) and, in the
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import scale_scenario as sc  # noqa: E402

from ringtop.tui.app import RingtopApp  # noqa: E402
from ringtop.tui.builders import Builders  # noqa: E402
from ringtop.tui.view_model import RunView  # noqa: E402


def messages(ranks: int, steps: int) -> list:
    sc.PER_NODE = max(1, ranks // sc.NODES)
    return sc.run(steps=steps, world=ranks)


def _ms(t: float) -> float:
    return round((time.perf_counter() - t) * 1e3, 2)


def builds(msgs: list, rounds: int) -> dict:
    """Model builds without Textual: the first (a tab opened) and the next ones (repaints)."""
    view = RunView(watch_liveness=False)
    view.apply_many(msgs, now=1.0)
    out = {}
    for tab, build in (("memory", lambda b: b.memory(view, 156)), ("comm", lambda b: b.comm_tab(view, None, 156))):
        b = Builders()
        t = time.perf_counter()
        build(b)
        first = _ms(t)
        again = []
        for _ in range(rounds):
            view.versions.update(("ranks", "comm"))  # as a new step would
            t = time.perf_counter()
            build(b)
            again.append(_ms(t))
        out[tab] = {"build_first_ms": first, "build_repaint_ms_median": statistics.median(again)}
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
        row = {"ranks": n, "steps": args.steps, **builds(msgs, args.rounds)}
        row["app"] = asyncio.run(in_app(msgs, args.rounds))
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    print(json.dumps({"date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
