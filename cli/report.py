"""`ringtop report RUN_DIR`: one self-contained HTML page of a run's plots, from its JSONL logs.

plotly's JavaScript is embedded inline (no CDN: the page opens offline). Every number comes from
the logs as the agent wrote it or from the functions `summary` and the UI use (metrics/, and
cli/summary.py for the per-rank table, goodput, diagnosis and hang lines): nothing is derived here
a second way. Log contents are hostile input: every string placed in HTML goes through
`html.escape`, and the figures travel as JSON in `type="application/json"` blocks with every `<`
written `\\u003c`, so nothing in a log can close a script or open a tag.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ringtop.cli import summary
from ringtop.metrics import fmt, step_waterfall
from ringtop.metrics.costs.busbw import busbw_factor_or_nan, rate_gbps
from ringtop.metrics.costs.flops import mfu
from ringtop.metrics.goodput import CAUSES
from ringtop.metrics.rules.outliers import median, slowest
from ringtop.metrics.units import GIB, MIB
from ringtop.protocol import Event, Hello, Stall, Step, Timeline, read_log

INSTALL_HINT = "needs plotly (its JavaScript is embedded in the page)"
"""The start of the line `ringtop report` says without plotly; `install_command("report")` follows."""

FIGURE_IDS = ("step-time", "where", "loss", "throughput", "comm", "memory", "pipeline", "goodput", "events")
"""Every section's id, in page order; a section without data says why instead of a plot."""


@dataclass
class RunLogs:
    """What the report reads from LOGDIR/rank-R.jsonl, per rank (read once)."""

    log_dir: Path
    hellos: dict[int, Hello] = field(default_factory=dict)
    steps: dict[int, list[Step]] = field(default_factory=dict)
    timelines: list[Timeline] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    stalls: list[Stall] = field(default_factory=list)

    @property
    def hello(self) -> Hello | None:
        return self.hellos.get(0) or next(iter(self.hellos.values()), None)

    @property
    def start_ts(self) -> float:
        firsts = [h.ts for h in self.hellos.values()] + [s[0].ts for s in self.steps.values() if s]
        return min(firsts, default=0.0)


def read_run(log_dir: Path) -> RunLogs:
    logs = RunLogs(log_dir)
    for path in sorted(log_dir.glob("rank-*.jsonl"), key=lambda p: int(p.stem.split("-")[1])):
        for m in read_log(path):
            if isinstance(m, Step):
                logs.steps.setdefault(m.rank, []).append(m)
            elif isinstance(m, Hello):
                logs.hellos[m.rank] = m
            elif isinstance(m, Timeline):
                logs.timelines.append(m)
            elif isinstance(m, Event):
                logs.events.append(m)
            elif isinstance(m, Stall):
                logs.stalls.append(m)
    logs.events.sort(key=lambda e: e.ts)
    return logs


@dataclass
class Section:
    id: str
    title: str
    figure: Any = None
    """A plotly Figure, or None: then `note` says why there is no plot."""
    note: str = ""
    html_extra: str = ""
    """Escaped HTML shown under the plot (tables, verdict lines)."""


def _go():
    import plotly.graph_objects as go

    return go


def _subplots(rows: int, titles: tuple[str, ...]):
    from plotly.subplots import make_subplots

    return make_subplots(rows=rows, cols=1, shared_xaxes=True, subplot_titles=titles, vertical_spacing=0.12)


def _layout(fig, height: int = 420):
    fig.update_layout(height=height, template="plotly_white", margin=dict(l=60, r=20, t=50, b=40),
                      legend=dict(orientation="h", y=-0.15))
    return fig


RANK_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
                "#17becf")


def rank_line(rank: int, dash: str = "solid") -> dict:
    """One colour per rank across every plot (ranks past ten reuse them)."""
    return dict(color=RANK_COLOURS[rank % len(RANK_COLOURS)], dash=dash)


MANY_RANKS = 16
"""Above this many ranks a per-step plot draws the spread over ranks (fewest, median, most) instead
of a line per rank: a thousand lines are unreadable, and slow to build and to draw."""


def per_rank_lines(fig, logs: RunLogs, value, name: str, row: int, dash: str = "solid", markers: bool = True) -> None:
    """`value(step)` over steps: a line per rank (named `NAME rank R`), or, past MANY_RANKS, the
    median over ranks per step (`NAME median over ranks`) inside the band of the fewest and most."""
    go = _go()
    mode = "lines+markers" if markers else "lines"
    if len(logs.steps) <= MANY_RANKS:
        for rank, steps in logs.steps.items():
            fig.add_trace(go.Scatter(x=[s.step for s in steps], y=[value(s) for s in steps], mode=mode,
                                     name=f"{name} rank {rank}".strip(), line=rank_line(rank, dash)), row=row, col=1)
        return
    by_step: dict[int, list[float]] = {}
    for steps in logs.steps.values():
        for s in steps:
            v = value(s)
            if v is not None and math.isfinite(v):
                by_step.setdefault(s.step, []).append(v)
    xs = sorted(by_step)
    label = f"{name} ".lstrip()
    fig.add_trace(go.Scatter(x=xs, y=[max(by_step[x]) for x in xs], mode="lines", line=dict(width=0),
                             name=f"{label}most of any rank", showlegend=False), row=row, col=1)
    fig.add_trace(go.Scatter(x=xs, y=[min(by_step[x]) for x in xs], mode="lines", line=dict(width=0),
                             fill="tonexty", fillcolor="rgba(31,119,180,0.25)",
                             name=f"{label}fewest to most over ranks"), row=row, col=1)
    fig.add_trace(go.Scatter(x=xs, y=[median(by_step[x]) for x in xs], mode=mode,
                             name=f"{label}median over ranks", line=dict(color=RANK_COLOURS[0], dash=dash)),
                  row=row, col=1)


def plot_text(text: str) -> str:
    """A log's string as plotly shows it: plotly reads a subset of HTML in its labels (`<a href>`,
    `<b>`, entities), so `<`, `>` and `&` go as entities and show as themselves."""
    return html.escape(text, quote=False)


def _percent(ratio: float | None) -> float | None:
    return None if ratio is None else 100 * ratio


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def step_time_section(logs: RunLogs) -> Section:
    """Step time per rank, and per step the rank with the longest step and its excess over the
    others' median (metrics.outliers.slowest's rule on step time: per step, not the Overview's
    slowest rank, which it picks on compute over a window)."""
    go = _go()
    fig = _subplots(2, ("step time per rank (ms)", "longest step each step: % over the other ranks' median"))
    by_step: dict[int, dict[int, float]] = {}
    per_rank_lines(fig, logs, lambda s: s.step_ms, "", 1)
    for rank, steps in logs.steps.items():
        for s in steps:
            by_step.setdefault(s.step, {})[rank] = s.step_ms
    found = [(step, slowest(times)) for step, times in sorted(by_step.items())]
    found = [(step, o) for step, o in found if o is not None]
    if found:
        fig.add_trace(go.Bar(x=[step for step, _ in found], y=[_finite(o.excess_pct) for _, o in found],
                             text=[f"rank {o.rank}" for _, o in found], name="longest step",
                             hovertemplate="step %{x}: %{text}, +%{y:.1f}%<extra></extra>"), row=2, col=1)
    fig.update_xaxes(title_text="step", row=2, col=1)
    return Section("step-time", "Step time", _layout(fig, 560))


def where_section(logs: RunLogs) -> Section:
    """Each rank's step as its parts (metrics/step_waterfall.py, as `summary` prints them), stacked:
    the bars' lengths are the ranks' mean step times."""
    go = _go()
    parts = {rank: summary.step_parts_of(steps, logs.hellos.get(rank, logs.hello))
             for rank, steps in sorted(logs.steps.items()) if steps}
    if not parts:
        return Section("where", "Where the step went", note="no steps in the logs")
    rows = {f"rank {r}": p for r, p in parts.items()}
    if len(parts) > MANY_RANKS:  # the run's mean and the slowest ranks, not a thousand bars
        slow = sorted(parts, key=lambda r: -sum(parts[r].values()))[:MANY_RANKS // 2]
        rows = {"run (mean)": step_waterfall.mean_parts(parts.values()),
                **{f"rank {r}": parts[r] for r in sorted(slow)}}
    fig = go.Figure()
    names = [n for n in step_waterfall.PARTS if any(n in p for p in rows.values())]
    labels = list(rows)
    for name in names:
        fig.add_trace(go.Bar(y=labels, x=[p.get(name, 0.0) for p in rows.values()], name=name, orientation="h",
                             hovertemplate=f"%{{y}}: {plot_text(name)} %{{x:.1f}} ms<extra></extra>"))
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="ms per step (mean of each rank's steps after its first)")
    return Section("where", "Where the step went", _layout(fig, max(260, 60 + 28 * len(rows))),
                   note="The parts add up to the step. Ideal: the step's FLOPs at the device's peak (where it is "
                   "known); the other parts are MFU's gap to 100 %.")


def loss_section(logs: RunLogs) -> Section:
    fig = _subplots(2, ("loss", "grad norm"))
    per_rank_lines(fig, logs, lambda s: s.loss, "loss", 1, markers=False)
    per_rank_lines(fig, logs, lambda s: s.grad_norm, "grad norm", 2, dash="dot", markers=False)
    fig.update_xaxes(title_text="step", row=2, col=1)
    return Section("loss", "Loss and grad norm", _layout(fig, 520))


def throughput_section(logs: RunLogs) -> Section:
    """tokens/s per rank (Step.tokens_per_s) and MFU per step (metrics.flops.mfu of Step.tflops
    against the Hello's peak), MFU `n/a` with the Hello's reason where no peak is known."""
    hello = logs.hello
    peak = hello.peak_tflops if hello is not None else 0.0
    titles = ("tokens/s per rank", "MFU per rank (%)") if peak > 0 else ("tokens/s per rank",)
    fig = _subplots(len(titles), titles)
    per_rank_lines(fig, logs, lambda s: s.tokens_per_s, "tokens/s", 1)
    if peak > 0:
        per_rank_lines(fig, logs, lambda s: _percent(mfu(s.tflops, peak)), "MFU", 2, markers=False)
    note = "" if peak > 0 else ("MFU n/a: the device's peak is not known"
                                + (f" ({hello.peak_source})" if hello is not None and hello.peak_source else ""))
    return Section("throughput", "Tokens/s and MFU", _layout(fig, 520 if peak > 0 else 360), note=note)


def comm_section(logs: RunLogs) -> Section:
    """Exposed communication per rank (Step.exposed_comm_ms) and busbw per collective kind per
    step: the kind's bytes over its busy time summed over ranks (metrics.busbw.rate_gbps) times
    nccl-tests' factor for its group size, as the Comm tab defines it."""
    go = _go()
    fig = _subplots(2, ("exposed communication per rank (ms)", "busbw per collective kind (GB/s)"))
    per_kind: dict[tuple[str, str], dict[int, list[float]]] = {}
    per_rank_lines(fig, logs, lambda s: s.exposed_comm_ms, "exposed", 1)
    for steps in logs.steps.values():
        for s in steps:
            for c in s.comm:
                acc = per_kind.setdefault((c.kind, c.group), {}).setdefault(s.step, [0.0, 0.0, 0.0])
                acc[0] += c.bytes
                acc[1] += c.busy_ms
                acc[2] = max(acc[2], c.group_size)
    for (kind, group), by_step in sorted(per_kind.items()):
        xs = sorted(by_step)
        ys = [_finite(rate_gbps(by_step[x][0], by_step[x][1]) * busbw_factor_or_nan(kind, int(by_step[x][2])))
              for x in xs]
        if any(y is not None for y in ys):
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=plot_text(f"{kind} {group}".strip())),
                          row=2, col=1)
    hello = logs.hello
    if hello is not None and hello.link_peak_gbps > 0:
        fig.add_hline(y=hello.link_peak_gbps, line_dash="dot", annotation_text="link peak", row=2, col=1)
    fig.update_xaxes(title_text="step", row=2, col=1)
    note = "" if per_kind else "no collectives were recorded"
    return Section("comm", "Exposed communication and busbw", _layout(fig, 560), note=note)


MEMORY_PARTS = (("params", "params_bytes"), ("grads", "grads_bytes"), ("optimizer", "optimizer_bytes"))


def size_unit(largest_bytes: float) -> tuple[int, str]:
    """A chart's size axis in binary units like every size ringtop shows (metrics/units.py): GiB
    from one GiB, else MiB; the hover text is fmt.nbytes of the bytes themselves."""
    return (GIB, "GiB") if largest_bytes >= GIB else (MIB, "MiB")


def _state_bytes(x) -> float | None:
    return None if x is None else sum(getattr(x, attr) for _, attr in MEMORY_PARTS)


def memory_section(logs: RunLogs) -> Section:
    """Per rank, the last step's measured params / grads / optimizer beside the strategy's
    prediction in its Hello (the Memory tab's two columns)."""
    go = _go()
    ranks = sorted(logs.steps)
    last = {r: logs.steps[r][-1].mem for r in ranks}
    predicted = {r: logs.hellos[r].prediction for r in ranks if r in logs.hellos}
    if len(ranks) > MANY_RANKS:
        return memory_spread_section(logs, ranks, last, predicted)
    cats = [[f"rank {r}" for r in ranks for _ in ("measured", "predicted")],
            [k for _ in ranks for k in ("measured", "predicted")]]
    peaks = [last[r].cuda_peak_bytes for r in ranks]
    scale, unit = size_unit(max((*peaks, *(_state_bytes(x) or 0 for x in (*last.values(), *predicted.values()))),
                                default=0))
    fig = go.Figure()
    for label, attr in MEMORY_PARTS:
        sizes = []
        for r in ranks:
            p = predicted.get(r)
            sizes += [getattr(last[r], attr), getattr(p, attr) if p is not None else None]
        fig.add_trace(go.Bar(x=cats, y=[None if b is None else b / scale for b in sizes], name=label,
                             hovertext=[fmt.nbytes(b) for b in sizes],
                             hovertemplate=f"%{{x}}: {label} %{{hovertext}}<extra></extra>"))
    if any(peaks):
        fig.add_trace(go.Scatter(x=[[f"rank {r}" for r in ranks], ["measured"] * len(ranks)],
                                 y=[p / scale for p in peaks], mode="markers", name="device peak allocated",
                                 hovertext=[fmt.nbytes(p) for p in peaks], hovertemplate="%{hovertext}<extra></extra>"))
    fig.update_layout(barmode="stack", yaxis_title=unit)
    note = "" if predicted and any(p is not None for p in predicted.values()) else "no prediction in the run's Hello"
    return Section("memory", "Memory per rank against the prediction", _layout(fig, 420), note=note)


def memory_spread_section(logs: RunLogs, ranks: list[int], last: dict, predicted: dict) -> Section:
    """MANY_RANKS and more: params + grads + optimizer per rank, measured and predicted, as two lines over ranks."""
    go = _go()
    measured = [_state_bytes(last[r]) for r in ranks]
    expected = [_state_bytes(predicted.get(r)) for r in ranks]
    scale, unit = size_unit(max((b or 0 for b in (*measured, *expected)), default=0))
    fig = go.Figure()
    for name, sizes, mode in (("measured", measured, "markers"), ("predicted", expected, "lines")):
        fig.add_trace(go.Scatter(x=ranks, y=[None if b is None else b / scale for b in sizes], mode=mode, name=name,
                                 hovertext=[fmt.nbytes(b) for b in sizes],
                                 hovertemplate="rank %{x}: %{hovertext}<extra></extra>"))
    fig.update_layout(xaxis_title="rank", yaxis_title=f"params + grads + optimizer ({unit})")
    note = "" if any(p is not None for p in predicted.values()) else "no prediction in the run's Hello"
    return Section("memory", "Memory per rank against the prediction", _layout(fig, 420), note=note)


def pipeline_section(logs: RunLogs) -> Section:
    """The measured bubble per stage (Timeline.bubble) against the schedule's theory the agent
    logged beside it (Timeline.bubble_theory, (N-1)/(N+M-1))."""
    if not logs.timelines:
        return Section("pipeline", "Pipeline bubble",
                       note="n/a: not a pipeline run (no pipeline timelines in the logs)")
    go = _go()
    fig = go.Figure()
    stages = sorted({t.stage for t in logs.timelines})
    for stage in stages:
        tl = sorted((t for t in logs.timelines if t.stage == stage), key=lambda t: t.step)
        fig.add_trace(go.Scatter(x=[t.step for t in tl], y=[100 * t.bubble for t in tl], mode="lines+markers",
                                 name=f"stage {stage} measured"))
    first = logs.timelines[0]
    theory = sorted(logs.timelines, key=lambda t: t.step)
    fig.add_trace(go.Scatter(x=[t.step for t in theory], y=[100 * t.bubble_theory for t in theory],
                             mode="lines+markers", line=dict(dash="dash"), marker=dict(symbol="line-ew-open", size=14),
                             name=f"theory (N-1)/(N+M-1), N={first.stages} M={first.micro_batches}"))
    fig.update_layout(xaxis_title="step", yaxis_title="bubble (% of step)", yaxis_rangemode="tozero")
    return Section("pipeline", "Pipeline bubble", _layout(fig))


def goodput_section(logs: RunLogs) -> Section:
    """Productive time and what was lost by cause: cli.summary.goodput (metrics/goodput.py)."""
    good = summary.goodput(logs.log_dir)
    if not good.known:
        return Section("goodput", "Goodput", note="n/a: no step was logged")
    go = _go()
    parts = [("productive", good.productive_s)] + [(c, good.lost_s.get(c, 0.0)) for c in CAUSES]
    fig = go.Figure()
    for name, s in parts:
        fig.add_trace(go.Bar(y=["wall time"], x=[s], name=name, orientation="h",
                             hovertemplate=f"{name}: %{{x:.3g}} s<extra></extra>"))
    fig.update_layout(barmode="stack", xaxis_title="seconds")
    line = f"<p>{html.escape(summary.goodput_line(good))}</p>"
    return Section("goodput", "Goodput", _layout(fig, 260), html_extra=line)


def events_section(logs: RunLogs) -> Section:
    """The verdict (rank 0's diagnosis, the hang watch, how the run ended) and every event over time."""
    go = _go()
    lines = [summary.lifecycle_line(summary.lifecycle_of_logs(logs.log_dir))]
    found = summary.diagnosis(logs.log_dir)
    if found is not None:
        verdicts = found.data.get("verdicts", []) if isinstance(found.data, dict) else []
        lines.append("diagnosis: " + ("no problems found" if not verdicts else ""))
        lines += [f"⚠ {v.get('text', '')} — advice: {v.get('advice', '')}" for v in verdicts if isinstance(v, dict)]
    lines += summary.hang_lines(logs.log_dir)
    extra = "<ul class='verdict'>" + "".join(f"<li>{html.escape(str(line))}</li>" for line in lines) + "</ul>"
    t0 = logs.start_ts
    stalled = [s for s in logs.stalls if s.state == "stalled"]
    if not logs.events and not stalled:
        return Section("events", "Verdict and events", note="no events were logged", html_extra=extra)
    fig = go.Figure()
    colours = {"info": "#2a9d8f", "warn": "#e9c46a", "error": "#e63946"}
    for level in ("info", "warn", "error"):
        es = [e for e in logs.events if e.level == level]
        if es:
            fig.add_trace(go.Scatter(x=[e.ts - t0 for e in es], y=[plot_text(e.kind or "event") for e in es],
                                     mode="markers",
                                     marker=dict(size=12, color=colours[level]), name=level,
                                     text=[plot_text(f"rank {e.rank}: {e.text}") for e in es],
                                     hovertemplate="%{x:.2f} s %{text}<extra></extra>"))
    if stalled:
        fig.add_trace(go.Scatter(x=[s.ts - t0 for s in stalled], y=["stall"] * len(stalled), mode="markers",
                                 marker=dict(size=12, symbol="x", color="#e63946"), name="stalled",
                                 text=[plot_text(f"rank {s.rank} step {s.step} {s.phase}") for s in stalled]))
    fig.update_layout(xaxis_title="seconds since the run started")
    rows = "".join(f"<tr><td>{html.escape(fmt.clock(e.ts))}</td><td>{e.rank}</td><td>{html.escape(e.level)}</td>"
                   f"<td>{html.escape(e.kind)}</td><td>{html.escape(e.text)}</td></tr>" for e in logs.events)
    extra += ("<table><tr><th>time</th><th>rank</th><th>level</th><th>kind</th><th>text</th></tr>"
              + rows + "</table>")
    return Section("events", "Verdict and events", _layout(fig, 320), html_extra=extra)


CONFIG_FIELDS = ("run_id", "world_size", "backend", "strategy", "strategy_options", "dtype", "model", "param_count",
                 "batch_size", "seq_len", "steps", "start_step", "lr", "seed", "grad_clip", "flops_per_token",
                 "flops_source", "peak_tflops", "peak_source", "link_peak_gbps", "torch_version", "ringtop_version")


def config_html(logs: RunLogs) -> str:
    """The run's config as its Hello says (rank 0's), and each rank's host and device."""
    hello = logs.hello
    if hello is None:
        return "<p>no Hello in the logs: the run's config is not known</p>"
    rows = "".join(f"<tr><th>{html.escape(name.replace('_', ' '))}</th>"
                   f"<td>{html.escape(str(getattr(hello, name)))}</td></tr>" for name in CONFIG_FIELDS)
    ranks = "".join(f"<tr><td>{r}</td><td>{html.escape(h.host)}</td><td>{h.local_rank}</td>"
                    f"<td>{html.escape(h.device)}</td><td>{html.escape(h.accelerator)}</td></tr>"
                    for r, h in sorted(logs.hellos.items()))
    return (f"<table class='config'>{rows}</table><table><tr><th>rank</th><th>host</th><th>local rank</th>"
            f"<th>device</th><th>accelerator</th></tr>{ranks}</table>")


SUMMARY_COLUMNS = ("rank", "steps", "first loss", "last loss", summary.STEP_MS_COLUMN, "comm/step", "exposed comm %",
                   "TFLOP/s", "MFU", "drops", "exit")


def summary_cells(row: dict) -> list[str]:
    """One rank's row of `ringtop summary`'s table, formatted as summary prints it."""
    return [str(row["rank"]), str(row["steps"]), f"{row['first_loss']:.4f}", f"{row['last_loss']:.4f}",
            fmt.ms(row["median_step_ms"]), fmt.nbytes(row["comm_bytes_per_step"]), f"{row['exposed_comm_pct']:.1f}",
            fmt.tflops(row["median_tflops"]), summary.mfu_text(row["mfu"]), str(row["drops"]), str(row["exit"])]


def summary_html(log_dir: Path) -> str:
    """`ringtop summary`'s per-rank table, in rank order; folded away past MANY_RANKS."""
    rows = summary.summarize(log_dir)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in SUMMARY_COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in summary_cells(r)) + "</tr>"
                   for r in sorted(rows, key=lambda r: r["rank"]))
    table = f"<table id='summary'><tr>{head}</tr>{body}</table>"
    if len(rows) <= MANY_RANKS:
        return table
    return f"<details><summary>{len(rows):,} ranks: show the table</summary>{table}</details>"


def script_json(text: str) -> str:
    """JSON made safe inside a <script> block: no `<` left to close it or open a comment."""
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


STYLE = """body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0;font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
.note{color:#666;font-style:italic}.plot{width:100%}"""

DRAW = """for (const block of document.querySelectorAll('script.figure')) {
  const fig = JSON.parse(block.textContent);
  Plotly.newPlot(block.dataset.target, fig.data, fig.layout, {displaylogo: false, responsive: true});
}"""


def sections(logs: RunLogs) -> list[Section]:
    return [step_time_section(logs), where_section(logs), loss_section(logs), throughput_section(logs),
            comm_section(logs), memory_section(logs), pipeline_section(logs), goodput_section(logs),
            events_section(logs)]


def render(logs: RunLogs) -> str:
    from plotly.offline import get_plotlyjs

    hello = logs.hello
    title = "ringtop report" + (f": run {hello.run_id} {hello.model} {hello.strategy} ×{hello.world_size}"
                                if hello is not None else "")
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{STYLE}</style><script id='plotly-js'>{get_plotlyjs()}</script></head><body>",
             f"<h1>{html.escape(title)}</h1>", "<h2>Per rank</h2>", summary_html(logs.log_dir)]
    for s in sections(logs):
        parts.append(f"<h2 id='{s.id}-title'>{html.escape(s.title)}</h2>")
        if s.note:
            parts.append(f"<p class='note'>{html.escape(s.note)}</p>")
        if s.figure is not None:
            parts.append(f"<div class='plot' id='fig-{s.id}'></div>"
                         f"<script type='application/json' class='figure' data-target='fig-{s.id}'>"
                         f"{script_json(s.figure.to_json())}</script>")
        parts.append(s.html_extra)
    parts += ["<h2 id='config-title'>Config</h2>", config_html(logs), f"<script>{DRAW}</script></body></html>"]
    return "".join(parts)


def write_report(log_dir: Path, out: Path) -> Path:
    """The page at `out`, 0600, by a rename beside it: a link standing at `out` is refused, never followed."""
    from ringtop.protocol import safe_files

    page = render(read_run(log_dir))
    with safe_files.output_file(out, encoding="utf-8") as f:
        f.write(page)
    return out


def human_size(n_bytes: int) -> str:
    """The written page's size as every size is shown (binary units)."""
    return fmt.nbytes(n_bytes)
