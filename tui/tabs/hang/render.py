"""What the Hang view and the Overview's hang banner show, from the view model: the verdict (who holds
the others up, and where), one row per rank (or per set of ranks stuck alike), the selected rank's
stack, and the latest `stacks` reply. Pure: no Textual widgets here (widget.py draws it).

With a thousand ranks most wait in the same place and a few are elsewhere, so past GROUP_ABOVE
ranks identical rows (same state, phase, frame and collective waited in) become one row named by
their ranks (`ranks 0–2, 4–999`), the culprits first.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text

from ringtop.metrics import fmt
from ringtop.metrics.rank_sets import ranks_text
from ringtop.metrics.rules.hang import STARTING, HangVerdict
from ringtop.metrics.rules.liveness import report_wait_s
from ringtop.protocol import GroupCursor, InFlight, Stall
from ringtop.tui.stacks_text import StackLine, stacks_lines, where_index
from ringtop.tui.state.view_model import RunView
from ringtop.tui.tables import Column, fit_to_width

HANG_TAB_KEY = "6"
STACKS_KEY = "k"
GROUP_ABOVE = 16
"""More ranks than this: identical rows are one row."""
MAX_ROWS = 64
"""Rows shown at most; the rest are counted in a last row."""
IN_FLIGHT_SHOWN = 8
LABEL = {"hang": ("✖ HANG", "bold white on red"), "dead": ("✖ HANG", "bold white on red"),
         "desync": ("✖ DESYNC", "bold white on red"), "stall": ("⏸ STALL", "bold black on yellow")}
TEXT_STYLE = {"stall": "bold yellow"}
"""The verdict's words: red, but a lone stall (no rank waits for another yet) in yellow."""
LINE_STYLE = {"summary": "bold", "group": "bold", "in_flight": "yellow", "heading": "dim", "frame": "",
              "where": "bold yellow", "missing": "bold red"}
"""A stacks reply's lines (stacks_text.StackLine roles)."""


def verdict_line(verdict: HangVerdict) -> Text:
    label, style = LABEL.get(verdict.kind, LABEL["hang"])
    t = Text()
    t.append(f" {label} ", style=style)
    t.append(" " + verdict.text, style=TEXT_STYLE.get(verdict.kind, "bold red"))
    return t


def desync_line(view: RunView) -> Text | None:
    e = view.desync_notice()
    if e is None:
        return None
    t = Text()
    t.append(f" {LABEL['desync'][0]} ", style=LABEL["desync"][1])
    t.append(f" {e.text}", style="bold red")
    t.append(f"  (rank 0, {fmt.clock(e.ts)})", style="dim")
    return t


def banner_text(view: RunView, *, replay: bool) -> Text:
    """The Overview's banner: the verdict, a desync rank 0 found, and the key to the Hang view;
    empty (the banner hidden) when nothing is stuck."""
    verdict, desync = view.hang_verdict(), desync_line(view)
    if verdict is None and desync is None:
        return Text("")
    lines = ([verdict_line(verdict)] if verdict is not None else []) + ([desync] if desync is not None else [])
    hint = f"{HANG_TAB_KEY} Hang view: each rank's phase, the collective it waits in, its stack"
    if not replay:
        hint += f"  ·  {STACKS_KEY} fetch every rank's stack now"
    lines.append(Text(hint, style="dim"))
    return Text("\n").join(lines)


# ---------------------------------------------------------------------- per rank


@dataclass(frozen=True)
class RankState:
    rank: int
    state: str
    """waits (in the verdict's collective), stalled, starting, stepping, dead, ended, no report."""
    stalled_s: float
    """For `waits`: how long it has waited (the verdict's own measure, `liveness.report_wait_s`);
    else how long its step has run."""
    step: int
    phase: str
    where: str
    waiting: str
    """The oldest collective in flight: `all_reduce #412 world 4.0MiB` (how long: the state cell)."""
    waiting_key: tuple
    groups: str
    culprit: bool
    waits: bool


def _oldest(report: Stall) -> InFlight | None:
    ops = [op for op in report.in_flight if op.kind != "p2p"] or list(report.in_flight)
    return max(ops, key=lambda op: (op.age_s, -op.seq)) if ops else None


def live_cursors(view: RunView, rank: int, report: Stall | None) -> tuple[list[GroupCursor], int | None]:
    """(the rank's issued/completed per group, the finished step they are from — None: from the
    report): its latest step's once it finished a step after the report, so they stay live while
    it steps."""
    row = view.ranks.get(rank)
    latest = row.latest if row is not None else None
    if latest is not None and latest.collectives and (report is None or latest.step >= report.step):
        return list(latest.collectives), latest.step
    return (list(report.groups) if report is not None else []), None


def rank_states(view: RunView, verdict: HangVerdict | None) -> list[RankState]:
    """Every rank of the run (those not heard from too), from its stall report, else its latest
    stacks snapshot, else its row."""
    world = view.facts.world_size
    ranks = range(world) if world else sorted(view.ranks)
    culprits = set(verdict.culprits) if verdict is not None else set()
    waits = set(verdict.waiting) if verdict is not None else set()
    out = []
    for rank in ranks:
        row = view.ranks.get(rank)
        stalled = view.hang.stalled.get(rank)
        got = view.hang.report_of(rank)
        report = got[1] if got is not None else None
        if row is not None and (row.dead or (row.ended and not row.bye_ok)):
            state = "dead"
        elif row is not None and row.ended:
            state = "ended"
        elif stalled is not None and rank in waits:
            state = "waits"
        elif stalled is not None:
            state = STARTING if stalled.state == STARTING else "stalled"
        elif row is None or row.step_seen is None or (verdict is not None and rank in culprits):
            state = "no report"
        else:
            state = "stepping"
        op = _oldest(report) if report is not None else None
        waiting = f"{op.kind} #{op.seq} {op.group} {fmt.nbytes(op.bytes)}" if op else ""
        more = len(report.in_flight) - 1 if report is not None and op is not None else 0
        if stalled is None:
            stalled_s = 0.0
        elif state == "waits" and verdict is not None:
            stalled_s = report_wait_s(stalled, verdict.group, verdict.seq)
        else:
            stalled_s = stalled.running_s
        cursors, _ = live_cursors(view, rank, report)
        out.append(RankState(
            rank=rank, state=state, stalled_s=stalled_s,
            step=stalled.step if stalled is not None else (row.step if row is not None else -1),
            phase=report.phase if report is not None else "", where=report.where if report is not None else "",
            waiting=waiting + (f" +{more}" if more > 0 else ""),
            waiting_key=(op.kind, op.seq, op.group, op.bytes) if op else (),
            groups=" ".join(f"{c.group} {c.issued}/{c.completed}" for c in cursors),
            culprit=rank in culprits, waits=rank in waits))
    return out


@dataclass(frozen=True)
class HangRow:
    key: str
    ranks: tuple[int, ...]
    cells: dict


def _state_cell(states: list[RankState]) -> Text:
    s = states[0]
    if s.state in ("waits", "stalled", STARTING):
        lo, hi = min(x.stalled_s for x in states), max(x.stalled_s for x in states)
        span = f"{hi:.0f}" if round(lo) == round(hi) else f"{lo:.0f}–{hi:.0f}"
        return Text(f"{s.state} {span} s", style="bold red" if s.culprit else "yellow")
    style = {"dead": "bold red", "stepping": "green", "no report": "bold red" if s.culprit else "dim",
             "ended": "dim"}.get(s.state, "")
    return Text(s.state, style=style)


def hang_rows(states: list[RankState], group: bool) -> list[HangRow]:
    """One row per rank, or per set of ranks alike when `group`; culprits first, then the ranks
    that wait for them, then the rest; at most MAX_ROWS."""
    buckets: dict[tuple, list[RankState]] = {}
    for s in states:
        key = (s.culprit, s.waits, s.state, s.phase, s.where, s.waiting_key) if group else (s.rank,)
        buckets.setdefault(key, []).append(s)
    ordered = sorted(buckets.values(), key=lambda b: (not b[0].culprit, not b[0].waits, b[0].rank))
    rows = []
    for bucket in ordered[:MAX_ROWS]:
        s = bucket[0]
        ranks = tuple(x.rank for x in bucket)
        label = ranks_text(ranks).removeprefix("ranks ").removeprefix("rank ")
        steps = [x.step for x in bucket if x.step >= 0]
        step = "-" if not steps else (f"{min(steps):,}" if min(steps) == max(steps) else
                                     f"{min(steps):,}–{max(steps):,}")
        mark = "bold red" if s.culprit else ""
        cells = {
            "rank": Text(("▶ " if s.culprit else "  ") + label, style=mark or "bold"),
            "state": _state_cell(bucket),
            "step": Text(step),
            "phase": Text(s.phase or "-", style=mark),
            "where": Text(s.where or "-", style=mark),
            "waiting": Text(s.waiting or "-", style="yellow" if s.waiting else "dim"),
            "groups": Text(s.groups or "-", style="" if s.groups else "dim"),
        }
        rows.append(HangRow(f"h{ranks[0]}", ranks, cells))
    rest = ordered[MAX_ROWS:]
    if rest:
        n = sum(len(b) for b in rest)
        rows.append(HangRow("more", (), {"rank": Text(f"… {n:,} more", style="dim"),
                                         "state": Text(f"in {len(rest):,} rows", style="dim")}))
    return rows


WHERE_MIN, WHERE_MAX = 24, 60


def hang_columns(rows: list[HangRow], table_width: int) -> list[Column]:
    """The rank table's columns for `table_width` cells: the least needed dropped first, `where`
    taking what is left."""
    def widest(key: str, least: int, most: int) -> int:
        return min(most, max([least] + [len(r.cells[key].plain) for r in rows if key in r.cells]))

    cols = [Column("rank", "rank", widest("rank", 4, 26)), Column("state", "state", widest("state", 9, 16)),
            Column("step", "step", 7, True), Column("phase", "phase", widest("phase", 8, 16)),
            Column("where", "where", WHERE_MIN), Column("waiting", "waiting in (oldest)", widest("waiting", 19, 40)),
            Column("groups", "issued/completed", widest("groups", 16, 30))]
    priority = {"waiting": 1, "phase": 2, "step": 3, "groups": 4}
    kept = fit_to_width(cols, priority, table_width)
    spare = max(0, table_width - sum(c.width + 2 for c in kept))
    return [c._replace(width=min(WHERE_MAX, WHERE_MIN + spare)) if c.key == "where" else c for c in kept]


# ---------------------------------------------------------------------- the stack, the reply


def stack_text(view: RunView, rank: int | None) -> Text:
    """The selected rank's stack, innermost frame last, from its stall report or stacks snapshot
    (the newer), with the collectives it waits in."""
    t = Text()
    if rank is None:
        return t
    got = view.hang.report_of(rank)
    if got is None:
        t.append(f"rank {rank}: no stall report and no stacks snapshot", style="bold")
        t.append(f" — {STACKS_KEY} asks every rank for its stack", style="dim")
        return t
    source, s = got
    t.append(f"rank {rank}", style="bold")
    if source == "stalled":
        what = "start-up report" if s.state == STARTING else "stall report"
    else:
        what = f"stacks snapshot [{s.request}]" if s.request else "snapshot"
    t.append(f"  {what} at {fmt.clock(s.ts)}: step {s.step:,}, {s.phase or 'phase unknown'}, "
             f"running {s.running_s:.1f} s", style="")
    if s.threshold_s:
        t.append(f" (a stall after {s.threshold_s:.1f} s)", style="dim")
    if s.gone_peers:
        t.append(f"\n  ended on its host: {ranks_text(s.gone_peers)}", style="bold red")
    for op in s.in_flight[:IN_FLIGHT_SHOWN]:
        shapes = f", shapes {op.shapes}" if op.shapes else ""
        t.append(f"\n  waiting in {op.kind} #{op.seq} on group {op.group} ({fmt.nbytes(op.bytes)}{shapes}) "
                 f"for {op.age_s:.1f} s", style="yellow")
    if len(s.in_flight) > IN_FLIGHT_SHOWN:
        t.append(f"\n  … {len(s.in_flight) - IN_FLIGHT_SHOWN} more in flight", style="dim")
    cursors, from_step = live_cursors(view, rank, s)
    since = f" (at its step {from_step:,})" if from_step is not None else ""
    for c in cursors:
        t.append(f"\n  group {c.group}: issued #{c.issued}, completed #{c.completed}{since}", style="dim")
    if not s.stack:
        t.append("\n  no stack (the training thread was not found)", style="dim")
        return t
    t.append("\n  stack, innermost last:", style="dim")
    marked = where_index(list(s.stack), s.where)
    for i, frame in enumerate(s.stack):
        t.append(f"\n    {frame}", style=LINE_STYLE["where" if i == marked else "frame"])
    return t


def styled_lines(lines: list[StackLine]) -> Text:
    return Text("\n").join(Text("  " * line.indent + line.text, style=LINE_STYLE.get(line.role, ""))
                           for line in lines)


def stacks_reply_text(view: RunView) -> Text:
    """The latest `stacks` command (this UI's or another client's) and its answer."""
    found = [c for c in view.commands.values() if c.cmd == "stacks"]
    if not found:
        return Text("")
    c = found[-1]
    t = Text()
    t.append(f"stacks [{c.id}] {c.phase}", style="bold")
    if c.sent_ts:
        t.append(f"  sent {fmt.clock(c.sent_ts)}", style="dim")
    if c.status == "error":
        t.append(f"\n{c.error}", style="bold red")
    elif c.status == "done":
        t.append("\n")
        t.append_text(styled_lines(stacks_lines(c.result)))
    return t


def hang_caption(view: RunView, verdict: HangVerdict | None, *, replay: bool) -> Text:
    """The verdict and what the keys do; one line when nothing is stuck."""
    keys = "↑↓ a rank's stack" + ("" if replay else f"  ·  {STACKS_KEY} fetch every rank's stack now")
    desync = desync_line(view)
    if verdict is None:
        t = Text()
        t.append("✓ nothing is stuck", style="bold green")
        snap = view.hang.snapshot_request
        shown = f", the last stacks snapshot [{snap}] below" if view.hang.snapshots else ""
        t.append(f": no rank reports a stall{shown}   ", style="green")
        t.append(keys, style="dim")
    else:
        t = verdict_line(verdict)
        source = "rank 0's reading (this UI holds no stall report)" if not view.hang.stalled else \
            "this UI's reading of the stall reports"
        t.append(f"\n{source}; waits: s in the collective (a row's range: least–most)   {keys}", style="dim")
    if desync is not None:
        t = Text("\n").join([t, desync])
    return t
