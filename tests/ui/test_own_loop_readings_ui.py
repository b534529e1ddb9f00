"""What the screen says of an own loop's numbers it was not given, or that cannot be true: TFLOP/s
n/a with what to give, a figure above what the device can do marked implausible (never shown as
a measurement, no MFU of it), the grad-norm chart n/a with why (not "waiting for steps" forever)."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable, Static
from ui_waits import eventually, repainted

from ringtop.protocol import Hello, Step
from ringtop.tui.app import RingtopApp
from ringtop.tui.header.render import facts_text
from ringtop.tui.sources.feeds import TelemetryBatch
from ringtop.tui.state.view_model import RunView
from ringtop.tui.tabs.overview.render import row_cells

SIZE = (160, 44)
T0 = 1_780_000_000.0


def own_loop(tflops: float, *, flops_per_token: float = 1e6, steps: int = 6, peak: float = 0.0) -> list:
    """2 CPU ranks of a ringtop.Monitor loop (ceiling 0.6 TFLOP/s: 2 cores x 0.3) whose steps carry
    `tflops` each and no grad norm (the script gave none)."""
    msgs = []
    for rank in (0, 1):
        msgs.append(Hello(rank=rank, seq=0, ts=T0, run_id="own1", world_size=2, host="node-a", strategy="ddp",
                          strategy_options={"loop": "own"}, backend="gloo", device="cpu",
                          flops_per_token=flops_per_token, flops_source="given to ringtop.Monitor",
                          peak_tflops=peak, tflops_ceiling=peak or 0.6,
                          tflops_ceiling_source="what 2 CPU cores can do at fp32 (0.3 TFLOP/s each at most)"))
        for n in range(1, steps + 1):
            msgs.append(Step(rank=rank, seq=n, ts=T0 + n, step=n, loss=2.0, step_ms=100.0, tflops=tflops))
    return msgs


def text_of(app: RingtopApp, selector: str) -> str:
    return str(app.query_one(selector, Static).content)


@pytest.mark.timeout(60)
async def test_an_own_loop_without_tokens_or_norms_says_n_a_and_what_to_give():
    app = RingtopApp(messages=[], source="live")
    async with app.run_test(size=SIZE) as pilot:
        app.post_message(TelemetryBatch(own_loop(0.0), []))
        await repainted(pilot)

        def shown():
            header = text_of(app, "#facts")
            assert "TFLOP/s n/a (give tokens per step)" in header, header
            label = text_of(app, "#grad-norm-label")
            assert "n/a: the loop gives none" in label and "clip_grad_norm_" in label, label
            assert "waiting for steps" not in label
        await eventually(pilot, shown)


@pytest.mark.timeout(60)
async def test_tflops_above_what_two_cpu_cores_can_do_are_marked_implausible():
    app = RingtopApp(messages=[], source="live")
    async with app.run_test(size=SIZE) as pilot:
        app.post_message(TelemetryBatch(own_loop(4.6), []))  # the MLP: 1.9-9.2 on 2 shared cores
        await repainted(pilot)

        def shown():
            header = text_of(app, "#facts")
            assert "9.2 TFLOP/s ⚠ implausible" in header, header
            assert str(app.query_one("#ranks", DataTable).get_cell("r0", "tflops")).strip() == "4.6 ?"
        await eventually(pilot, shown)


@pytest.mark.parametrize("tflops, implausible", [(0.25, False), (0.59, False), (0.61, True), (4.6, True)])
def test_the_mark_is_by_the_ceiling_and_an_implausible_figure_has_no_mfu(tflops, implausible):
    view = RunView()
    for m in own_loop(tflops, peak=0.6 if tflops > 0.6 else 0.0):
        view.apply(m, now=T0 + 10)
    header = facts_text(view, replay=True, source="x").plain
    cell = row_cells(view, view.ranks[0], replay=True)["tflops"].plain
    assert ("⚠ implausible" in header) is implausible and cell.endswith("?") is implausible
    if implausible:
        assert "MFU" not in header  # not 767 % of a peak


@pytest.mark.parametrize("tflops, marked", [(0.3, False), (4.6, True)])
def test_summary_marks_an_implausible_figure_and_gives_no_mfu(tmp_path, capsys, tflops, marked):
    from ringtop.cli.main import main
    from ringtop.protocol import to_json_line

    msgs = own_loop(tflops, peak=0.6 if marked else 0.0)
    for rank in (0, 1):
        (tmp_path / f"rank-{rank}.jsonl").write_bytes(b"".join(to_json_line(m) for m in msgs if m.rank == rank))
    assert main(["summary", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert ("4.6?" in out and "above the most the device can do" in out) is marked, out
    assert "767" not in out  # no MFU of it


@pytest.mark.parametrize("options, why", [
    ({"loop": "own"}, "set step.grad_norm"),
    ({"loop": "own", "trainer": "hf"}, "the trainer hands its callbacks no norm"),
    ({}, ""),  # ringtop's own loop: every strategy's steps carry the norm
])
def test_the_grad_norm_chart_says_why_it_is_empty_in_the_runs_terms(options, why):
    from ringtop.tui.tabs.overview.render import grad_norm_missing

    view = RunView()
    view.apply(Hello(rank=0, seq=0, ts=T0, run_id="own2", world_size=1, strategy="ddp", strategy_options=options),
               now=T0)
    assert (why in grad_norm_missing(view)) if why else grad_norm_missing(view) == ""
