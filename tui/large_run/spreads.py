"""What the large-run tables of every tab share: the top-k and outlier lines below a table, the
spread columns of a node table, a node row's state note, and the table's caption (where the user
is, how it is sorted, the keys that move on)."""

from __future__ import annotations

import math

from rich.text import Text

from ringtop.metrics.rank_sets import ranks_text
from ringtop.metrics.rules.outliers import MAD_Z_FLAG, Threshold
from ringtop.tui.state.nodes import SORT_LABELS
from ringtop.tui.tables import Column, fit_to_width

TOP_K = 5
"""The slowest ranks named below the heat strip."""
TIME_FLOOR = Threshold(min_excess_pct=5.0, min_excess=2.0)
"""A robust outlier must also be this far above the median (tight steps make 1 ms a large z)."""
MEMORY_FLOOR = Threshold(min_excess_pct=5.0, min_excess=64 * 2**20)


def standouts(title: str, top: list[tuple[int, float]], describe, none: str,
              found: list[tuple[str, list[tuple[int, float]]]], width: int = 0) -> Text:
    """Two lines any tab's large table has below it: `▲ TITLE: rN <describe(N, value)> · …` for its
    top-k ranks, and the robust outliers per figure (`found`: (word, [(rank, z)])), cut to `width`."""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f"▲ {title}: ", style="bold yellow")
    if not top:
        t.append(none, style="dim")
    for i, (rank, value) in enumerate(top):
        if i:
            t.append(" · ", style="dim")
        t.append(f"r{rank}", style="bold")
        t.append(describe(rank, value))
    t.append("\n")
    t.append(f"◆ outliers (robust z ≥ {MAD_Z_FLAG:g}): ", style="bold yellow")
    parts = [(word, hits) for word, hits in found if hits]
    if not parts:
        t.append("none", style="dim")
    for i, (word, hits) in enumerate(parts):
        if i:
            t.append("; ", style="dim")
        t.append(f"{word} ")
        t.append(", ".join(f"r{r} z {z:.0f}" if math.isfinite(z) else f"r{r}" for r, z in hits[:4]), style="bold")
        if len(hits) > 4:
            t.append(f" +{len(hits) - 4}", style="dim")
    if width > 0:
        lines = t.split("\n")
        for line in lines:
            line.truncate(width, overflow="ellipsis")
        t = Text("\n", no_wrap=True).join(lines)
    return t


def spread_columns(spec: tuple[tuple[str, str, int, bool, int], ...], table_width: int) -> list[Column]:
    """A node table's columns from (key, label, width, right-aligned, priority): those that fit,
    the spare width given to the `note` column."""
    cols = [Column(k, label, w, right) for k, label, w, right, _ in spec]
    kept = fit_to_width(cols, {k: p for k, _, _, _, p in spec}, table_width)
    spare = max(0, table_width - sum(c.width + 2 for c in kept))
    return [c._replace(width=min(40, c.width + spare)) if c.key == "note" else c for c in kept]


def state_note(dead: int, ended: int, hung: int = 0, silent: int = 0, unreachable: bool = False, flagged: int = 0,
               marked: tuple[int, ...] = ()) -> Text:
    """A node row's note: unreachable (none of its ranks heard), or how many are dead, hung,
    flagged (by a verdict), silent, ended, with the ranks in trouble named (`✖ r700 · 1 hung`)."""
    if unreachable:
        return Text("✖ unreachable", style="bold red")
    notes = [f"{count} {what}" for count, what in ((dead, "dead"), (hung, "hung"), (flagged, "flagged"),
                                                   (silent, "silent"), (ended, "ended")) if count]
    if marked:
        notes.insert(0, ("✖ " if dead or hung else "⚠ ") + ranks_text(marked))
    return Text(" · ".join(notes), style="bold red" if dead or hung else "bold yellow" if flagged else
                "yellow" if silent else "dim")


def table_caption(level: str, *, nodes: int, ranks: int, shown: int, first: int, total: int, sort: str,
                  host: str | None, filter_text: str) -> Text:
    """Where the user is, the order, the rows on screen, and the keys that move on."""
    t = Text(no_wrap=True, overflow="ellipsis")
    if level == "nodes":
        t.append(f"{nodes} nodes · {ranks:,} ranks", style="bold")
        keys = "↑↓ PgUp/PgDn move · Enter a node's ranks · o sort · / filter"
    elif level == "node":
        t.append(f"node {host}: {total} ranks", style="bold")
        keys = "↑↓ PgUp/PgDn move · Esc the nodes · o sort · / filter"
    else:
        t.append(f"filter {filter_text!r}: {total:,} of {ranks:,} ranks", style="bold")
        keys = "↑↓ PgUp/PgDn move · Esc clear the filter · o sort"
    t.append(f" · by {SORT_LABELS.get(sort, sort)}", style="bold")
    if total > shown:
        t.append(f" · rows {first + 1}–{first + shown} of {total:,}")
    t.append(f"   {keys}", style="dim")
    return t
