"""The UI's TFLOP/s and MFU: the Overview's columns and the header, from a JSONL log replayed (the
Step is logged as it is sent) and from messages posted as the receive thread posts them."""

from __future__ import annotations

import re

import pytest
from textual.widgets import DataTable, Static
from ui_waits import eventually, repainted

from ringtop.protocol import Hello, Step, to_json_line
from ringtop.tui.app import RingtopApp
from ringtop.tui.header.render import facts_text
from ringtop.tui.sources.feeds import TelemetryBatch
from ringtop.tui.sources.replay import load_replay
from ringtop.tui.state.view_model import RunView
from ringtop.tui.tabs.overview.render import overview_columns

SIZE = (160, 40)
T0 = 1_780_000_000.0


def run_messages(accelerator: str, peak_tflops: float, peak_source: str, steps: int = 4) -> list:
    msgs = []
    for rank in (0, 1):
        msgs.append(Hello(rank=rank, seq=0, ts=T0, run_id="mfu1", world_size=2, host="node-a", strategy="ddp",
                          backend="nccl", device=f"cuda:{rank}", dtype="bf16", accelerator=accelerator,
                          flops_per_token=1e9, peak_tflops=peak_tflops, peak_source=peak_source))
        for n in range(1, steps + 1):
            # 1e9 FLOPs per token x 65,536 tokens in 200 ms: 327.68 TFLOP/s
            msgs.append(Step(rank=rank, seq=n, ts=T0 + n, step=n, loss=2.0, step_ms=200.0, tokens=65_536,
                             tokens_per_s=327_680.0, tflops=327.68))
    return msgs


def _assert(ok: bool) -> None:
    assert ok


def header(app: RingtopApp) -> str:
    return str(app.query_one("#facts", Static).content)


def labels(app: RingtopApp) -> dict[str, str]:
    return {str(k.value): str(c.label) for k, c in app.query_one("#ranks", DataTable).columns.items()}


def cell(app: RingtopApp, row: str, column: str) -> str:
    return str(app.query_one("#ranks", DataTable).get_cell(row, column)).strip()


@pytest.mark.timeout(60)
async def test_a_replayed_log_shows_tflops_and_mfu_n_a_for_an_unknown_device(tmp_path):
    for rank in (0, 1):
        lines = [to_json_line(m) for m in run_messages("NVIDIA Mystery 9000", 0.0, "unknown device NVIDIA Mystery 9000")
                 if m.rank == rank]
        (tmp_path / f"rank-{rank}.jsonl").write_bytes(b"".join(lines))
    log = load_replay(tmp_path)
    assert [m.tflops for m in log.messages if isinstance(m, Step)][:2] == [327.68, 327.68]
    app = RingtopApp(messages=log.messages, problems=log.problems, source=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await eventually(pilot, lambda: _assert(app.replay_loaded), timeout_s=20)
        await repainted(pilot)

        def shown():
            assert labels(app).get("tflops") == "TFLOP/s"
            assert "mfu" not in labels(app)  # no rank's peak is known: no column of n/a
            assert cell(app, "r0", "tflops") == "328"
            text = header(app)
            assert "655 TFLOP/s" in text  # the run's: both ranks summed
            assert "MFU n/a (unknown device NVIDIA Mystery 9000)" in text
            assert re.search(r"MFU \d", text) is None  # never a figure against a guessed peak
        await eventually(pilot, shown)


@pytest.mark.timeout(60)
async def test_posted_messages_with_a_known_peak_show_mfu_in_the_table_and_header():
    app = RingtopApp(messages=[], source="live")
    async with app.run_test(size=SIZE) as pilot:
        app.post_message(TelemetryBatch(run_messages("NVIDIA H100 80GB HBM3", 989.0, "H100 SXM bf16 dense"), []))
        await repainted(pilot)

        def shown():
            assert labels(app).get("mfu") == "MFU"
            assert cell(app, "r1", "mfu") == "33.1%"  # 327.68 / 989
            assert cell(app, "r1", "tflops") == "328"
            assert "MFU 33.1%" in header(app)
        await eventually(pilot, shown)


def test_a_cpu_run_shows_tflops_and_no_mfu_unless_it_has_a_peak():
    view = RunView()
    for m in run_messages("", 0.0, "no accelerator; pass --peak-tflops"):
        view.apply(m, now=T0 + 10)
    text = facts_text(view, replay=True, source="x").plain
    assert "655 TFLOP/s" in text and "MFU" not in text
    assert view.mfu is None
    view = RunView()
    for m in run_messages("", 1000.0, "--peak-tflops"):
        view.apply(m, now=T0 + 10)
    assert view.mfu == pytest.approx(327.68 / 1000.0)
    assert "MFU 32.8%" in facts_text(view, replay=True, source="x").plain


def test_the_tflops_and_mfu_columns_go_by_width_priority_before_the_essential_ones():
    keys = [c.key for c in overview_columns([], 0, 160, peak_known=True)]
    assert keys.index("tflops") + 1 == keys.index("mfu")
    middle = [c.key for c in overview_columns([], 0, 118, peak_known=True)]
    assert "tflops" not in middle and "mfu" in middle  # TFLOP/s goes first, MFU says more
    narrow = [c.key for c in overview_columns([], 0, 70, peak_known=True)]
    assert "mfu" not in narrow and "tflops" not in narrow
    assert {"rank", "step_ms", "idle_pct", "note"} <= set(narrow)
