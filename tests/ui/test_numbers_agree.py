"""One definition per number, held across every place that shows it, on one recorded multi-strategy
run (tests/data/numbers_run/, made by tests/data/record_numbers_run.py with the real agent: 2 ranks
of ddp, a 2-stage pipeline, zero1 and fsdp grad-op on CPU/gloo).

The expected figures are computed here from the raw JSON lines (json.loads, not ringtop's codec),
by the definitions in metrics/timing.py: step ms and idle % over each rank's last STEP_WINDOW steps,
the slowest rank by compute over the same steps, where the step went by metrics/step_waterfall.py,
exposed communication as sent, memory by metrics/costs/memory_model.py's one prediction. Each surface is
read through its own builder: the Overview's cells, marker and run line, the Comm tab's rows and
caption, the node rows, the Memory tab's predicted row and fit table, the switch picker, `ctl
status` (rank 0's step ms, through the agent's own window), `summary` (its whole-run median), the
Prometheus exporter and `ringtop plan` for the same configuration.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from ringtop.cli import summary
from ringtop.cli.ctl import result_text
from ringtop.cli.plan import build_parser, make_plan
from ringtop.metrics import fmt
from ringtop.metrics import step_waterfall as wf
from ringtop.metrics.strategy_names import SHARDED_STATE, canonical_strategy
from ringtop.metrics.timing import STEP_WINDOW, StepWindow, status_step_ms
from ringtop.protocol import Bye, from_json_line
from ringtop.tui.actions import switch_rows
from ringtop.tui.sources.replay import load_replay
from ringtop.tui.state.nodes import node_summaries, rank_figures
from ringtop.tui.state.view_model import RunView
from ringtop.tui.tabs.comm.figures import comm_window
from ringtop.tui.tabs.comm.render import exposed_text, ranks_rows
from ringtop.tui.tabs.memory.figures import fit_table
from ringtop.tui.tabs.memory.render import fit_rows, memory_rows
from ringtop.tui.tabs.overview.parts import run_parts, window_parts
from ringtop.tui.tabs.overview.render import breakdown_legend, row_cells
from ringtop.tui.tabs.overview.scale import longest_step_rank, node_cells

RUNS_DIR = Path(__file__).parents[1] / "data" / "numbers_run"
RUNS = ("ddp", "pp", "zero1", "fsdp-grad-op")
DATA_PARALLEL = ("ddp", "zero1", "fsdp-grad-op")


def raw_steps(run: str) -> dict[int, list[dict]]:
    """Per rank, its Step records as plain dicts straight from the file."""
    out: dict[int, list[dict]] = {}
    for path in sorted((RUNS_DIR / run).glob("rank-*.jsonl")):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec["type"] == "step" and rec["step_ms"] > 0:
                out.setdefault(rec["rank"], []).append(rec)
    return out


def raw_hello(run: str) -> dict:
    line = (RUNS_DIR / run / "rank-0.jsonl").read_text().splitlines()[0]
    rec = json.loads(line)
    assert rec["type"] == "hello"
    return rec


def expected_idle_ms(rec: dict) -> float:
    """metrics.timing's definition, written out: what the agent sent, else input + exposed comm."""
    return rec["idle_ms"] if rec["idle_ms"] > 0 else rec["data_ms"] + rec["exposed_comm_ms"]


def window(recs: list[dict]) -> list[dict]:
    return recs[-STEP_WINDOW:]


def live_view(run: str) -> RunView:
    """The run as a UI saw it while it ran: every message but the Byes (ended ranks are not ranked)."""
    view = RunView()
    for msg in load_replay(RUNS_DIR / run).messages:
        if not isinstance(msg, Bye):
            view.apply(msg, now=msg.ts)
    return view


@pytest.fixture(scope="module", params=RUNS)
def run(request):
    return request.param, live_view(request.param), raw_steps(request.param)


def test_the_recorded_run_has_more_steps_than_the_window():
    """Else every window figure would equal the whole run's, and a window bug could not show."""
    for name in RUNS:
        steps = raw_steps(name)
        assert sorted(steps) == [0, 1]
        assert all(len(recs) > STEP_WINDOW for recs in steps.values()), name


def test_step_time_and_idle_agree_on_overview_comm_tab_and_node_rows(run):
    name, view, steps = run
    comm_rows = dict(ranks_rows(view, None))
    step_means, idles = {}, {}
    for rank, recs in steps.items():
        w = window(recs)
        step_means[rank] = statistics.fmean(r["step_ms"] for r in w)
        idles[rank] = 100 * sum(expected_idle_ms(r) for r in w) / sum(r["step_ms"] for r in w)
        cells = row_cells(view, view.ranks[rank], replay=True)
        assert cells["step_ms"].plain == fmt.ms(step_means[rank]), (name, rank)
        assert cells["idle_pct"].plain == fmt.pct(idles[rank]), (name, rank)
        comm = comm_rows[f"r{rank}"]
        assert comm["step_ms"].plain == fmt.ms(step_means[rank]), (name, rank)
        assert comm["idle"].plain == fmt.pct(idles[rank]), (name, rank)
        exposed = statistics.fmean(r["exposed_comm_ms"] for r in w)
        assert comm["exposed"].plain == fmt.ms(exposed), (name, rank)
    (node,) = node_summaries(rank_figures(view))  # both ranks on one host
    cells = node_cells(node, longest_step_rank([node]))
    assert cells["step_max"].plain == fmt.ms(max(step_means.values()))
    assert cells["idle"].plain == fmt.pct(statistics.median(idles.values()))


def test_the_slowest_marker_and_the_comm_tab_pick_the_rank_with_the_most_compute(run):
    """metrics.timing's compute (step − exposed comm − input) over each rank's window, worked out
    from the raw lines: the Overview's ▲ and the Comm tab's pick are on its largest, or on none
    under outliers.SLOWEST_SHOWN's +10 %."""
    name, view, steps = run
    compute = {rank: statistics.fmean(r["step_ms"] - r["exposed_comm_ms"] - r["data_ms"] for r in window(recs))
               for rank, recs in steps.items()}
    assert view.slowest_rank == max(compute, key=compute.get)
    marked = [rank for rank in steps if "▲" in row_cells(view, view.ranks[rank], replay=True)["note"].plain]
    comm_rows = dict(ranks_rows(view, None))
    picked = [rank for rank in steps if "slowest" in comm_rows[f"r{rank}"]["note"].plain]
    if 100 * (max(compute.values()) / min(compute.values()) - 1) >= 10.0:
        assert marked == picked == [view.slowest_rank], name
    else:
        assert marked == picked == [], name


def expected_run_parts(steps: dict[int, list[dict]], hello: dict) -> tuple[dict[str, float], float]:
    """Where the run's step went, from the raw lines by metrics/step_waterfall.py: each rank's mean
    over its window, then the mean over ranks (as `summary`'s run line); and the run's mean step."""
    pipeline, peak = hello["strategy"] == "pp", hello["peak_tflops"]
    per_rank = [wf.mean_parts(wf.step_parts(r["step_ms"], r["data_ms"], r["forward_ms"], r["backward_ms"],
                                            r["optimizer_ms"], r["exposed_comm_ms"], r["idle_ms"], pipeline,
                                            r["tflops"] / peak if peak > 0 and r["tflops"] > 0 else None)
                              for r in window(recs)) for recs in steps.values()]
    mean_step = statistics.fmean(statistics.fmean(r["step_ms"] for r in window(recs)) for recs in steps.values())
    return {k: v for k, v in wf.mean_parts(per_rank).items() if v > 0}, mean_step


def test_the_overviews_run_line_is_the_waterfall_of_the_window(run):
    """The Overview's run line (where the step went, the run's mean over the window) holds the parts
    metrics/step_waterfall.py gives from the raw lines, each in ms and %, in `summary`'s words, and
    they add up to the run's mean step; each rank's bar is its own window's (the run's mean)."""
    name, view, steps = run
    expected, mean_step = expected_run_parts(steps, raw_hello(name))
    got = run_parts(view)
    assert got.keys() == expected.keys() and list(got.values()) == pytest.approx(list(expected.values())), name
    assert sum(got.values()) == pytest.approx(mean_step)
    line = breakdown_legend(got).plain.splitlines()[-1]
    assert line.startswith(f"run {fmt.ms(mean_step)} ms/step = ")
    for part, ms in expected.items():
        assert f"{part} {fmt.ms(ms)} ms {100 * ms / mean_step:.0f}%" in line, (name, part, line)
    assert (wf.BUBBLE in got) == (name == "pp")
    per_rank = [window_parts(view.ranks[r], name == "pp") for r in steps]
    assert list(wf.mean_parts(per_rank).values()) == pytest.approx(list(got.values()))


def status_of(run: str) -> dict:
    """What `status` answers at the run's last step: rank 0's steps fed to the agent's own window
    (metrics.timing.StepWindow, as agent/loop/step_report.py feeds it) and read by the agent's
    `status_step_ms`, the fields the runner's snapshot sends."""
    window = StepWindow()
    for line in (RUNS_DIR / run / "rank-0.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["type"] == "step":
            window.add(rec["step"], rec["step_ms"])
    return {"run_id": raw_hello(run)["run_id"], "step": window.latest[0], "loss": 2.0, **status_step_ms(window)}


def test_ctl_status_step_ms_is_the_ui_cells_reading(run):
    """`ringtop ctl status` prints rank 0's step ms as the UI's rank-0 cell shows it: the mean of its
    last STEP_WINDOW steps, formatted by metrics/fmt, and says which window."""
    name, view, steps = run
    printed = dict(line.strip().split(": ", 1) for line in result_text("status", status_of(name)).splitlines())
    mean = statistics.fmean(r["step_ms"] for r in window(steps[0]))
    cell = row_cells(view, view.ranks[0], replay=True)["step_ms"].plain
    assert printed["step ms"] == f"{cell} (mean of rank 0's last {STEP_WINDOW} steps, to step {steps[0][-1]['step']})"
    assert cell == fmt.ms(mean) and "step_ms" not in printed and printed["run"] == f"numbers-{name}"
    latest = steps[0][-1]["step_ms"]
    assert fmt.ms(latest) != cell, "the latest step alone (what status sent before) would read otherwise"


def test_summarys_step_ms_is_the_whole_runs_median_and_says_so(run, capsys):
    """`summary` prints each rank's median step time over the whole run (after its first step),
    labelled as such, formatted as the UI formats a step time; the median is worked out here."""
    name, view, steps = run
    summary.print_summary(RUNS_DIR / name)
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.lstrip().startswith("rank"))
    assert "median step ms (whole run)" in header
    column = header.index("median step ms (whole run)") + len("median step ms (whole run)")
    for rank, recs in steps.items():
        row = next(line for line in out.splitlines() if line.split()[:1] == [str(rank)] and "→" in line)
        median = statistics.median(r["step_ms"] for r in recs[1:])
        assert row[:column].split()[-1] == fmt.ms(median), (name, rank, row)
    assert "the median of each rank's steps after its first" in out


def test_exposed_communication_agrees_in_the_comm_caption_summary_and_prometheus(run):
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from ringtop.agent.prometheus.exporter import RunMetrics

    name, view, steps = run
    # the Comm tab's caption: the last STEP_WINDOW step numbers over both ranks
    numbers = sorted({r["step"] for recs in steps.values() for r in recs})[-STEP_WINDOW:]
    recs = [r for rs in steps.values() for r in rs if r["step"] in numbers]
    caption = exposed_text(comm_window(view, None)).plain
    mean_exposed = statistics.fmean(r["exposed_comm_ms"] for r in recs)
    assert f"({fmt.ms(mean_exposed)} of {fmt.ms(statistics.fmean(r['step_ms'] for r in recs))} ms)" in caption
    # summary: the whole run's exposed share per rank (its window: every step)
    by_rank = {row["rank"]: row for row in summary.summarize(RUNS_DIR / name)}
    for rank, rs in steps.items():
        assert by_rank[rank]["exposed_comm_pct"] == pytest.approx(
            100 * sum(r["exposed_comm_ms"] for r in rs) / sum(r["step_ms"] for r in rs))
    # Prometheus: a counter of the same exposed time, in seconds
    metrics = RunMetrics()
    for msg in load_replay(RUNS_DIR / name).messages:
        metrics.observe(msg)
    registry = CollectorRegistry()
    registry.register(metrics)
    got = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name in ("ringtop_exposed_comm_seconds_total", "ringtop_step_seconds"):
                got[(s.name, s.labels["rank"])] = s.value
    for rank, rs in steps.items():
        assert got[("ringtop_exposed_comm_seconds_total", str(rank))] == pytest.approx(
            sum(r["exposed_comm_ms"] for r in rs) / 1e3)
        assert got[("ringtop_step_seconds", str(rank))] == pytest.approx(rs[-1]["step_ms"] / 1e3)


@pytest.mark.parametrize("name", DATA_PARALLEL)
def test_memory_prediction_and_sharding_words_agree_on_every_surface(name):
    """The agent's prediction (the Memory tab's `pred` row) = the fit table's row for this strategy =
    the picker's = `plan`'s for the same model, world size, dtype and backend; and the header, fit
    table, picker and plan say the same words for what the strategy shards."""
    view, hello = live_view(name), raw_hello(name)
    canonical = canonical_strategy(hello["strategy"], hello["strategy_options"].get("sharding"))
    pred = hello["prediction"]
    for rank, recs in raw_steps(name).items():  # what the ranks measured holding, to the byte
        held = recs[-1]["mem"]
        assert [held[k] for k in ("params_bytes", "grads_bytes", "optimizer_bytes")] == \
            [pred[k] for k in ("params_bytes", "grads_bytes", "optimizer_bytes")], (name, rank)
    shown = dict(memory_rows(view))["r0p"]
    expected = [fmt.nbytes(pred[k]) for k in ("params_bytes", "grads_bytes", "optimizer_bytes")]
    expected.append(fmt.nbytes(pred["params_bytes"] + pred["grads_bytes"] + pred["optimizer_bytes"]))
    assert [shown[k].plain.strip() for k in ("params", "grads", "optim", "state")] == expected
    fit = dict(fit_rows(fit_table(view)))[canonical]
    assert [fit[k].plain for k in ("params", "grads", "optim", "state")] == expected
    (pick,) = [r for r in switch_rows(view) if r.target.key == canonical]
    assert [fmt.nbytes(b) for b in (pick.params_bytes, pick.grads_bytes, pick.optimizer_bytes,
                                    pick.total_bytes)] == expected
    args = ["--params", str(hello["param_count"]), "--ranks", str(hello["world_size"]), "--dtype", hello["dtype"],
            "--backend", hello["backend"], "--json"]
    (row,) = [r for r in make_plan(build_parser().parse_args(args))["strategies"] if r["strategy"] == canonical]
    assert [fmt.nbytes(row["memory"][k]) for k in ("params_bytes", "grads_bytes", "optimizer_bytes",
                                                   "total_bytes")] == expected
    assert row["optimizer_state"]["bytes_per_param"] == hello["optimizer_bytes_per_param"]
    words = SHARDED_STATE[canonical]
    assert view.facts.sharding_text == (f"{words} sharded" if words else "replicated")
    assert fit["sharded"].plain == pick.sharded == row["sharded"] == (words or "-")


def test_the_pipeline_run_tells_the_bubble_apart_from_input_and_exposed_comm():
    """The check bites: on the pipeline run the agent's idle (its bubble) is not input + exposed
    communication, so a screen that used the fallback (the Comm tab did) would show another idle %."""
    steps = raw_steps("pp")
    view = live_view("pp")
    comm_rows = dict(ranks_rows(view, None))
    for rank, recs in steps.items():
        w = window(recs)
        fallback = 100 * sum(r["data_ms"] + r["exposed_comm_ms"] for r in w) / sum(r["step_ms"] for r in w)
        assert comm_rows[f"r{rank}"]["idle"].plain != fmt.pct(fallback), rank


@pytest.mark.parametrize("key, kept", [("comm_blocked_ms", True), ("comm_blockedms", False)])
def test_old_logs_exposed_comm_name_is_read_as_todays(key, kept):
    """Logs written before `exposed_comm_ms` called it `comm_blocked_ms`: replay reads it; a key that
    is neither is not taken for it (the negative case)."""
    line = next(line for line in (RUNS_DIR / "ddp" / "rank-0.jsonl").read_text().splitlines()
                if '"type":"step"' in line and json.loads(line)["exposed_comm_ms"] > 0)
    value = json.loads(line)["exposed_comm_ms"]
    old = line.replace('"exposed_comm_ms"', f'"{key}"')
    assert "exposed_comm_ms" not in old
    msg = from_json_line(old)
    assert (msg.exposed_comm_ms == value) is kept
    from ringtop.protocol import decode, encode

    wire = encode(from_json_line(line)).replace(b"\xafexposed_comm_ms", b"\xafcomm_blocked_ms")
    assert decode(wire).exposed_comm_ms == value


@pytest.mark.parametrize("name", ["pp", "fsdp-grad-op"])
async def test_the_real_app_shows_the_same_step_time_idle_and_sharding_on_overview_and_comm_tab(name):
    """Through the real app: the Overview's cells and the Comm tab's ranks table agree with the raw
    log and each other; the header says the strategy's own sharding words."""
    from textual.widgets import DataTable, Static
    from ui_waits import eventually

    from ringtop.tui.app import RingtopApp

    messages = [m for m in load_replay(RUNS_DIR / name).messages if not isinstance(m, Bye)]
    steps = raw_steps(name)
    expected = {}
    for rank, recs in steps.items():
        w = window(recs)
        expected[rank] = (fmt.ms(statistics.fmean(r["step_ms"] for r in w)),
                          fmt.pct(100 * sum(expected_idle_ms(r) for r in w) / sum(r["step_ms"] for r in w)))
    app = RingtopApp(messages=messages, source=name)
    async with app.run_test(size=(160, 48)) as pilot:
        def cell(table: str, row: str, column: str) -> str:
            return " ".join(str(app.query_one(table, DataTable).get_cell(row, column)).split())

        def overview_shown():
            assert app.replay_loaded and app.query_one("#ranks", DataTable).row_count == 2
            for rank, (step_ms, idle) in expected.items():
                assert (cell("#ranks", f"r{rank}", "step_ms"),
                        cell("#ranks", f"r{rank}", "idle_pct")) == (step_ms, idle), rank
        await eventually(pilot, overview_shown)
        parts, run_ms = expected_run_parts(steps, raw_hello(name))
        legend = str(app.query_one("#parts-legend", Static).content)
        assert f"run {fmt.ms(run_ms)} ms/step = " in legend and all(part in legend for part in parts), legend
        words = SHARDED_STATE[canonical_strategy(name)]
        facts = str(app.query_one("#facts", Static).content)
        assert (f"({words} sharded)" if words else "layers split into stages") in facts, facts
        await pilot.press("3")

        def comm_shown():
            assert app.query_one("#comm-ranks", DataTable).row_count == 2
            for rank, (step_ms, idle) in expected.items():
                assert (cell("#comm-ranks", f"r{rank}", "step_ms"), cell("#comm-ranks", f"r{rank}", "idle")) == \
                    (step_ms, idle), rank
        await eventually(pilot, comm_shown)
