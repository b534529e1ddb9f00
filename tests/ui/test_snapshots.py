"""Every tab of the real app, drawn from a replayed run, compared with the SVG screenshots under
`tests/ui/__snapshots__/` (pytest-textual-snapshot) at 160×48 and 100×30. A change to what a screen
shows fails here until the new screenshots are looked at and accepted with
`python -m pytest tests/ui/test_snapshots.py --snapshot-update`.

Every message is constructed with fixed numbers and wall-clock times, the UI's own notes are given
a fixed clock and times are shown in UTC, so a screenshot does not depend on when or where it is taken.
"""

from __future__ import annotations

import math
import time
import types

import hang_scenario
import pytest
import scale_scenario
from test_pipeline_view import gpipe_equal, pp_hello, pp_step, timeline
from textual.widgets import TabbedContent

from ringtop.protocol import CommStat, Event, Hello, MemorySample, Prediction, Sharding, Step
from ringtop.tui.app import RingtopApp
from ringtop.tui.state import view_model

SIZES = {"160x48": (160, 48), "100x30": (100, 30)}
TABS = {"overview": "1", "memory": "2", "comm": "3", "events": "5"}
MiB = 2**20
T0 = 1_780_000_000.0
"""2026-05-28 20:26:40 UTC: the replayed run's wall clock."""


@pytest.fixture(autouse=True)
def fixed_clock_and_zone(monkeypatch):
    """UTC for every clock shown; the view model's own notes ("replay loaded …") at a fixed time."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.setattr(view_model, "time", types.SimpleNamespace(time=lambda: T0 + 100.0,
                                                                    monotonic=time.monotonic))
    yield
    monkeypatch.undo()
    time.tzset()


def zero2_run(steps: int = 60) -> list:
    """Four ZeRO-2 ranks on two hosts; rank 3 computes 40 % longer and the others wait for it in the
    all-reduce (their idle share grows); rank 0 holds more memory; rank 0's diagnosis says so."""
    msgs: list = []
    seq = [0, 0, 0, 0]  # per rank, without gaps: a gap would be counted as lost telemetry

    def next_seq(rank: int) -> int:
        seq[rank] += 1
        return seq[rank]

    for r in range(4):
        pred = Prediction(params_bytes=40 * MiB, grads_bytes=10 * MiB, optimizer_bytes=30 * MiB,
                          comm_payload_bytes={"reduce_scatter": 40 * MiB, "all_gather": 40 * MiB},
                          comm_sent_bytes=60 * MiB)
        msgs.append(Hello(rank=r, seq=0, ts=T0 + r * 0.01, run_id="snap0001", world_size=4, host=f"node-{r // 2}",
                          pid=7000 + r, backend="gloo", device="cpu", strategy="zero2",
                          sharding=Sharding(params=False, grads=True, optimizer=True), dtype="fp32",
                          optimizer_bytes_per_param=12, prediction=pred, model="tiny-gpt-10m",
                          param_count=10_485_760, batch_size=8, seq_len=128, steps=500))
    for n in range(1, steps + 1):
        for r in range(4):
            compute = 140.0 if r == 3 else 100.0
            wait = 4.0 if r == 3 else 44.0
            wobble = 6.0 * math.sin(n / 5.0)  # a shape to draw, the same on every machine
            step_ms = compute + wait + wobble
            msgs.append(Step(
                rank=r, seq=next_seq(r), ts=T0 + 1 + n * 0.15 + r * 0.001, step=n,
                loss=round(7.0 * math.exp(-n / 40) + 3.0, 4),
                step_ms=step_ms, data_ms=3.0, forward_ms=compute * 0.3, backward_ms=compute * 0.6,
                optimizer_ms=compute * 0.1 - 3.0, exposed_comm_ms=wait + wobble, comm_busy_ms=wait + 20.0,
                tokens=1024, tokens_per_s=1024 / step_ms * 1e3,
                mem=MemorySample(params_bytes=40 * MiB, grads_bytes=10 * MiB, optimizer_bytes=30 * MiB,
                                 rss_bytes=(900 if r == 0 else 600) * MiB),
                comm=[CommStat(kind="reduce_scatter", count=4, bytes=40 * MiB, busy_ms=14.0, group_size=4),
                      CommStat(kind="all_gather", count=4, bytes=40 * MiB, busy_ms=12.0, group_size=4)],
                cpu_percent=95.0, idle_ms=3.0 + wait + wobble, grad_norm=round(1.5 * math.exp(-n / 25) + 0.4, 4)))
        if n == 20:
            msgs.append(Event(rank=0, seq=next_seq(0), ts=T0 + 1 + n * 0.15, level="info", kind="checkpoint",
                              text="sharded checkpoint of step 20: runs/snap/checkpoints/step-00000020-sharded",
                              step=n))
        if n == 40:
            msgs.append(Event(rank=0, seq=next_seq(0), ts=T0 + 1 + n * 0.15, level="warn", kind="verdict",
                              text="rank 3 is a straggler: compute 140 ms per step, +40 % over the others",
                              step=n, data={"rule": "straggler", "rank": 3, "evidence": {"compute_ms": 140.0}}))
    return msgs


def pipeline_run(steps: int = 12) -> list:
    msgs: list = [pp_hello(0), pp_hello(1)]
    s0, s1, window = gpipe_equal(2)
    for n in range(1, steps + 1):
        # per rank: its step, then its stage's timeline, numbered without gaps
        msgs += [pp_step(r, n, idle_ms=40.0, seq=2 * n - 1) for r in (0, 1)]
        msgs += [timeline(r, n, spans, window=window, seq=2 * n) for r, spans in ((0, s0), (1, s1))]
    return msgs


def loaded(tab_key: str):
    """Replayed, the tab shown and laid out at the terminal's size, then drawn once more: what a
    panel fits (a large run's rows and heat-strip lines) is read from its size, so a picture taken
    before the layout settled would be of a different screen."""
    async def run_before(pilot) -> None:
        app = pilot.app
        deadline = time.monotonic() + 20
        while not app.replay_loaded and time.monotonic() < deadline:
            await pilot.pause(0.05)
        await pilot.press(tab_key)
        pane = app.query_one(TabbedContent).active_pane
        while not (pane is not None and pane.size.height > 0 and all(w.size.height > 0 for w in pane.children)) \
                and time.monotonic() < deadline:
            await pilot.pause(0.05)
        app.refresh_view()
        await pilot.pause()
        app.refresh_view()  # what the first drawing's layout changed (a row or line shown) is drawn
        await pilot.pause()
    return run_before


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("tab", TABS)
def test_tab(snap_compare, tab, size):
    app = RingtopApp(messages=zero2_run(), source="runs/snap/telemetry")
    assert snap_compare(app, terminal_size=SIZES[size], run_before=loaded(TABS[tab]))


@pytest.mark.parametrize("size", SIZES)
def test_pipeline_tab(snap_compare, size):
    app = RingtopApp(messages=pipeline_run(), source="runs/pp/telemetry")
    assert snap_compare(app, terminal_size=SIZES[size], run_before=loaded("4"))


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("tab", {"overview": "1", "hang": "6"})
def test_hung_run(snap_compare, tab, size):
    """Rank 3 still in its forward while ranks 0–2 wait for it in an all-reduce: the Overview's banner
    and the Hang view (the culprit first, its stack)."""
    app = RingtopApp(messages=hang_scenario.hung_run(), source="runs/hang/telemetry")
    assert snap_compare(app, terminal_size=SIZES[size], run_before=loaded({"overview": "1", "hang": "6"}[tab]))


def test_many_ranks_overview(snap_compare):
    """1024 ranks on 8 nodes, rank 517 30 % slower: one row per node (its node first), the heat
    strip of every rank, the slowest ranks and the robust outliers, the charts still on screen."""
    app = RingtopApp(messages=scale_scenario.run(), source="runs/scale/telemetry")
    assert snap_compare(app, terminal_size=SIZES["160x48"], run_before=loaded("1"))
