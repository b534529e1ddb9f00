"""Rendering of the Memory tab: Rich text for captions and DataTable cells, from `figures.py`'s
figures. No Textual widgets here; the app puts these into its tables.

Per rank two rows: `meas` (what the agent counted, with the difference from the prediction in %)
and `pred` (the cost model), each with a stacked bar of parameters / gradients / optimizer / other.
"""

from __future__ import annotations

from rich.text import Text

from ringtop.metrics import fmt
from ringtop.metrics.costs.memory_model import DEEPSPEED_ADAM, TORCH_ADAM
from ringtop.tui.deltas import delta_text
from ringtop.tui.state.rank_row import RankRow
from ringtop.tui.state.view_model import RunView
from ringtop.tui.tables import Column, fit_to_width
from ringtop.tui.tabs.memory.figures import FitTable, StatePrediction, predicted_state

PART_STYLES = {"params": "cyan", "grads": "magenta", "optim": "yellow", "other": "bright_black"}
BAR_WIDTH = 12
NUM_W = 14  # "99.9MiB +12.5%"


def legend() -> Text:
    t = Text(no_wrap=True)
    for name, style in PART_STYLES.items():
        t.append("█", style=style)
        t.append(f" {name}  ")
    return t


def stacked_bar(parts: list[tuple[float, str]], scale: float, width: int = BAR_WIDTH) -> Text:
    """A bar of `width` cells: each part takes its share of `scale` (cumulative rounding, so the
    cells add up), and every non-zero part gets at least one cell (taken from the widest)."""
    t = Text(no_wrap=True)
    if scale <= 0 or not parts:
        return t
    cells: list[int] = []
    acc, used = 0.0, 0
    for value, _ in parts:
        acc += max(0.0, value)
        end = min(width, round(acc / scale * width))
        cells.append(max(0, end - used))
        used = max(used, end)
    for i, (value, _) in enumerate(parts):
        if value > 0 and cells[i] == 0:
            widest = max(range(len(cells)), key=cells.__getitem__)
            if cells[widest] > 1:
                cells[widest] -= 1
                cells[i] = 1
            elif sum(cells) < width:
                cells[i] = 1
    for n, (_, style) in zip(cells, parts):
        if n:
            t.append("█" * n, style=style)
    rest = width - sum(cells)
    if rest > 0:
        t.append("·" * rest, style="dim")
    return t


def _value(n: int, delta: Text | None = None, *, aligned: bool = True) -> Text:
    """`  4.0MiB +0.00%`: the value right-aligned in 7, then the difference left-aligned in 6, so the
    values line up between measured rows (with a difference) and predicted rows (without)."""
    t = Text(f"{fmt.nbytes(n):>7}")
    if delta is not None:
        t.append(" ")
        t.append_text(delta)
        t.append(" " * max(0, 6 - len(delta.plain)))
    elif aligned:
        t.append(" " * 7)
    return t


def on_gpu(view: RunView) -> bool:
    return any(r.mem_is_cuda for r in view.ranks.values()) or (view.facts.device or "").startswith("cuda")


MEMORY_PRIORITY = {"bar": 5, "reserved": 4, "peak": 3, "other": 2}
"""Columns dropped first on a narrow terminal (tables.fit_to_width): the bar (the numbers say
it too), then the allocator's figures after `alloc`."""
FIT_PRIORITY = {"sharded": 4, "grads": 3, "params": 2, "optim": 1}
"""The strategy's name says what it shards; state, need, capacity and traffic answer "would it fit"."""


def memory_columns(gpu: bool, width: int = 0) -> list[Column]:
    cols = [
        Column("rank", "rank", 8),
        Column("bar", "p/g/o/other", BAR_WIDTH),
        # left-justified: each cell lays out its own value (right-aligned in 5) and difference
        Column("params", "params", NUM_W),
        Column("grads", "grads", NUM_W),
        Column("optim", "optimizer", NUM_W),
        Column("state", "state", NUM_W),
        Column("other", "other", 7, True),
    ]
    if gpu:
        cols += [Column("total", "alloc", 7, True), Column("reserved", "reserved", 8, True),
                 Column("peak", "peak", 7, True)]
    else:
        cols.append(Column("total", "RSS", 7, True))
    return fit_to_width(cols, MEMORY_PRIORITY, width) if width else cols


def _bar_scale(view: RunView, preds: dict[int, StatePrediction | None], gpu: bool) -> float:
    if gpu:
        caps = [r.device_mem_total_bytes for r in view.ranks.values() if r.device_mem_total_bytes > 0]
        if caps:
            return float(max(caps))
    biggest = 0
    for r in view.ranks.values():
        biggest = max(biggest, r.mem_state_bytes + r.mem_other_bytes)
        p = preds.get(r.rank)
        if p is not None:
            biggest = max(biggest, p.total_bytes)
    return float(biggest)


def bar_scale(view: RunView) -> float:
    """What a full bar stands for: the device's capacity, else the most any rank holds or is predicted."""
    return _bar_scale(view, {r.rank: predicted_state(view, r) for r in view.ranks.values()}, on_gpu(view))


def memory_rows(view: RunView, rows: list[RankRow] | None = None, *, pred_rows: bool = True,
                scale: float | None = None) -> list[tuple[str, dict[str, Text]]]:
    """Per rank of `rows` (every rank by default) its measured row, and its predicted row below
    unless `pred_rows` is False (a large run's ranks: the measured row's % says it)."""
    gpu = on_gpu(view)
    rows = view.rows() if rows is None else rows
    preds = {r.rank: predicted_state(view, r) for r in rows}
    scale = _bar_scale(view, preds, gpu) if scale is None else scale
    out: list[tuple[str, dict[str, Text]]] = []
    for r in rows:
        p = preds[r.rank]
        measured = r.step >= 0 or r.mem_state_bytes > 0
        counted = r.mem_state_bytes > 0  # an agent that does not count state sends zeros
        dim = "dim" if r.ended else ""
        label = Text(f"{r.rank} ", style="bold")
        label.append("meas", style="dim")
        cells: dict[str, Text] = {"rank": label}
        if measured:
            cells["bar"] = stacked_bar([(r.mem_params_bytes, PART_STYLES["params"]),
                                        (r.mem_grads_bytes, PART_STYLES["grads"]),
                                        (r.mem_optimizer_bytes, PART_STYLES["optim"]),
                                        (r.mem_other_bytes, PART_STYLES["other"])], scale)
            for key, m, pv in (("params", r.mem_params_bytes, p and p.params_bytes),
                               ("grads", r.mem_grads_bytes, p and p.grads_bytes),
                               ("optim", r.mem_optimizer_bytes, p and p.optimizer_bytes),
                               ("state", r.mem_state_bytes, p and p.total_bytes)):
                if counted:
                    cells[key] = _value(m, delta_text(m, pv) if p is not None else None, aligned=p is not None)
                else:
                    cells[key] = Text(f"{'-':>5}", style="dim")
            cells["other"] = Text(fmt.nbytes(r.mem_other_bytes) if r.mem_bytes else "-")
            cells["total"] = Text(fmt.nbytes(r.mem_bytes) if r.mem_bytes else "-")
            if gpu:
                cells["reserved"] = Text(fmt.nbytes(r.mem_cuda_reserved_bytes) if r.mem_cuda_reserved_bytes else "-")
                cells["peak"] = Text(fmt.nbytes(r.mem_cuda_peak_bytes) if r.mem_cuda_peak_bytes else "-")
        else:
            cells["params"] = Text("-", style="dim")
        if dim:
            for c in cells.values():
                c.stylize(dim)
        out.append((f"r{r.rank}", cells))
        if p is not None and pred_rows:
            plabel = Text(" " * (len(str(r.rank)) + 1))
            plabel.append("pred" if p.source == "agent" else "pred*", style="italic")
            pcells = {
                "rank": plabel,
                "bar": stacked_bar([(p.params_bytes, PART_STYLES["params"]), (p.grads_bytes, PART_STYLES["grads"]),
                                    (p.optimizer_bytes, PART_STYLES["optim"])], scale),
                "params": _value(p.params_bytes),
                "grads": _value(p.grads_bytes),
                "optim": _value(p.optimizer_bytes),
                "state": _value(p.total_bytes),
            }
            for c in pcells.values():
                c.stylize("italic")
            out.append((f"r{r.rank}p", pcells))
    return out


def memory_caption(view: RunView) -> Text:
    f = view.facts
    t = Text()
    t.append("State per rank", style="bold")
    t.append(" — meas: counted by the agent, pred: cost model, %: meas vs pred   ")
    t.append_text(legend())
    rows = view.rows()
    preds = [predicted_state(view, r) for r in rows]
    if any(p is not None and p.source == "ui" for p in preds):
        t.append("\npred*: computed here from the cost model (the agent sent no prediction)", style="dim")
    notes = sorted({part.strip() for p in preds if p is not None and p.note for part in p.note.split(";")} - {""})
    for note in notes:
        t.append(f"\nnote: {note}", style="dim")
    if any(r.step >= 0 and r.mem_state_bytes == 0 for r in rows):
        t.append("\n-: the agent counted no parameter/gradient/optimizer bytes", style="yellow")
    if on_gpu(view):
        caps = sorted({r.device_mem_total_bytes for r in rows if r.device_mem_total_bytes > 0})
        cap = ", ".join(fmt.nbytes(c) for c in caps) or "unknown"
        t.append(f"\nother = CUDA allocated − state; device capacity {cap}", style="dim")
    else:
        t.append("\nother = process RSS − state (the interpreter, libraries, activations)", style="dim")
    if not rows:
        t.append("\nno ranks yet", style="dim")
    elif not f.param_count and not any(p is not None for p in preds):
        t.append("\nno prediction: the run's parameter count is unknown", style="dim")
    return t


def fit_columns(width: int = 0) -> list[Column]:
    cols = [
        Column("strategy", "strategy", 15),
        Column("sharded", "sharded", 18),
        Column("params", "params", 7, True),
        Column("grads", "grads", 7, True),
        Column("optim", "optim", 7, True),
        Column("state", "state", 7, True),
        Column("need", "need", 7, True),
        Column("fits", "of capacity", 12, True),
        Column("wire", "wire/step", 9, True),
    ]
    return fit_to_width(cols, FIT_PRIORITY, width) if width else cols


def fit_rows(ft: FitTable | None) -> list[tuple[str, dict[str, Text]]]:
    if ft is None:
        return []
    out = []
    for r in ft.rows:
        if r.fits is None:
            fits = Text("?", style="dim")
        elif r.fits:
            fits = Text(f"✓ {r.capacity_pct:.0f}%", style="green")
        else:
            fits = Text(f"✗ {r.capacity_pct:.0f}%", style="bold red")
        cells = {
            "strategy": Text(("▶ " if r.current else "  ") + r.strategy),
            "sharded": Text(r.sharded),
            "params": Text(fmt.nbytes(r.params_bytes)),
            "grads": Text(fmt.nbytes(r.grads_bytes)),
            "optim": Text(fmt.nbytes(r.optimizer_bytes)),
            "state": Text(fmt.nbytes(r.state_bytes)),
            "need": Text(fmt.nbytes(r.need_bytes)),
            "fits": fits,
            "wire": Text(fmt.nbytes(r.wire_bytes_per_step)),
        }
        if r.current:
            for key in ("strategy", "sharded", "state", "need"):
                cells[key].stylize("bold magenta" if key == "strategy" else "bold")
        out.append((r.strategy, cells))
    return out


def fit_caption(ft: FitTable | None, view: RunView) -> Text:
    t = Text()
    t.append("Which strategy would fit", style="bold")
    if ft is None:
        t.append(" — unknown: the run has not said its parameter count yet", style="dim")
        return t
    m = ft.model
    t.append(f" — cost model for {fmt.count(m.params)} params × {ft.ranks} rank{'s' if ft.ranks != 1 else ''}, "
             f"{view.facts.dtype}, each strategy as ringtop runs it, between steps (torch: fp32 state, "
             f"{TORCH_ADAM.words}; ZeRO: {DEEPSPEED_ADAM.words})")
    if ft.current:
        t.append(";  ▶ this run", style="bold magenta")
    else:
        t.append(f";  this run's strategy {view.facts.strategy or '?'} is not in the model", style="yellow")
    t.append("\nneed = state + other measured in this run ")
    t.append(f"({fmt.nbytes(ft.allowance_bytes)})" if ft.allowance_bytes else "(none measured yet)")
    t.append(" against ")
    t.append(ft.capacity_text, style="" if ft.capacity_bytes else "yellow")
    t.append("\nwire/step = bytes each rank sends per step (ring algorithms", style="dim")
    t.append("; on gloo a reduce-scatter runs as an all-reduce)" if ft.gloo else ")", style="dim")
    return t

