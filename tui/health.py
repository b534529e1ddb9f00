"""One line that says whether the run is healthy and, if not, what and where — the Overview's first.

Pure: a function of the view model and the UI's clock. It gathers what other panels show in
detail (who holds the others up when ranks are stuck, active verdicts, the slowest rank, ranks
that stopped finishing steps, dead ranks, dropped messages) so that a glance at the top of the
Overview answers the 3 a.m. question.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rich.text import Text

from ringtop.metrics.outliers import NAMED
from ringtop.metrics.rank_sets import ranks_text

from .hang_tab import health_words
from .nodes import nodes_cut_off
from .view_model import RunView

STALL_FLOOR_S = 10.0
"""No rank is called stalled sooner than this after its last step, however fast its steps are."""
STALL_FACTOR = 5.0
"""…nor before this many of its recent median steps have passed."""
FIRST_STEP_GRACE_S = 120.0
"""Before a rank's first step (warm-up, compilation, a large model's first pass) it may take this long."""


SPIKE_SHOWN_STEPS = 50
"""A loss spike stays on the health line for this many steps after it."""


@dataclass(frozen=True)
class Stall:
    rank: int
    step: int
    seconds: float
    """Since the rank's last step arrived (UI clock), or since this UI first heard it."""
    seen_a_step: bool = True
    """False: this UI attached after the rank's last step and has seen none since."""


def stalled_ranks(view: RunView, now: float) -> list[Stall]:
    """Ranks still heard from (heartbeats) that have finished no step for max(STALL_FLOOR_S,
    STALL_FACTOR × their recent median step): hung in a collective or in their own code. None in
    a replay, where arrival times say nothing."""
    if not view.watch_liveness:
        return []
    out = []
    for row in view.ranks.values():
        since = row.step_seen if row.step_seen is not None else row.heard_since
        if row.ended or row.dead or since is None:
            continue
        recent = row.recent_step_ms()
        limit_s = max(STALL_FLOOR_S, STALL_FACTOR * recent / 1e3 if math.isfinite(recent) else 0.0)
        if row.step <= view.facts.start_step:  # its first step of the run is not done yet
            limit_s = max(limit_s, FIRST_STEP_GRACE_S)
        waited = now - since
        if waited > limit_s:
            out.append(Stall(row.rank, row.step, waited, seen_a_step=row.step_seen is not None))
    return sorted(out, key=lambda s: (-s.seconds, s.rank))


def health_line(view: RunView, now: float) -> Text:
    """`● healthy …` in green, or the problems, the worst first, each with where."""
    t = Text(no_wrap=True, overflow="ellipsis")
    if not view.ranks:
        t.append("○ no rank has reported yet", style="dim")
        return t
    problems: list[tuple[str, str]] = []
    verdict = view.hang_verdict()
    if verdict is not None:
        problems.append(health_words(verdict))
    desync = view.desync_notice()
    if desync is not None and (verdict is None or verdict.kind != "desync"):
        problems.append(("bold red", f"✖ desync: {desync.text}"))
    dead = sorted(r.rank for r in view.ranks.values() if r.dead)
    if dead:
        problems.append(("bold red", f"✖ rank{'s' if len(dead) > 1 else ''} {_ranks(dead)} dead"))
    cut_off = nodes_cut_off(view)
    for node in cut_off[:3]:
        problems.append(("bold red", f"✖ node {node.host} unreachable: {ranks_text(node.ranks)} silent "
                                     f"{node.silent_s:.0f} s (its node relay or the link to it; training there "
                                     "may go on)"))
    unheard = {r for node in cut_off for r in node.ranks}
    bad = view.nonfinite_ranks
    skipped = view.last_skipped_step
    if bad:
        first = view.first_nonfinite
        since = f" (first: rank {first.rank} at step {first.step:,})" if first is not None else ""
        now_skipped = "; step skipped" if skipped is not None and skipped == view.latest_step else ""
        problems.append(("bold red", f"✖ loss not finite on rank{'s' if len(bad) > 1 else ''} {_ranks(bad)}{since}"
                                     f"{now_skipped}"))
    elif skipped is not None and view.latest_step - skipped <= SPIKE_SHOWN_STEPS:
        first = view.first_nonfinite
        since = f" (loss first not finite on rank {first.rank} at step {first.step:,})" if first is not None else ""
        what = (f"{view.skipped_steps:,} steps skipped, the last {skipped:,}" if view.skipped_steps > 1
                else f"step {skipped:,} skipped")
        problems.append(("bold yellow", f"⚠ {what}: gradient norm not finite{since}"))
    spike = view.step_history.last_spike
    if spike is not None and view.latest_step - spike.step <= SPIKE_SHOWN_STEPS:
        problems.append(("bold yellow", f"⚠ loss spike at step {spike.step:,}: {spike.spike.loss:.3g} against a "
                                        f"median {spike.spike.median:.3g} (z {spike.spike.z:.0f})"))
    # ranks without steps, by the UI's clock: said only when no stall report says more
    for stall in [s for s in stalled_ranks(view, now) if s.rank not in unheard][:3] if verdict is None else []:
        last = f"last {stall.step}" if stall.step >= 0 else "none yet"
        if stall.seen_a_step:
            text = f"⏸ rank {stall.rank}: no step for {stall.seconds:.0f} s ({last})"
        else:
            text = f"⏸ rank {stall.rank}: no step in the {stall.seconds:.0f} s since this UI attached ({last})"
        problems.append(("bold red", text))
    verdicts = view.active_verdicts
    if verdicts:
        where = f" (rank {verdicts[0].rank})" if verdicts[0].rank is not None else ""
        more = f" +{len(verdicts) - 1} more" if len(verdicts) > 1 else ""
        problems.append(("bold yellow", f"⚠ {verdicts[0].rule}{where}{more}"))
    slow = view.slowest_rank
    if slow is not None and math.isfinite(view.slowest_excess_pct) and view.slowest_excess_pct >= NAMED.min_excess_pct:
        problems.append(("yellow", f"▲ rank {slow} slowest +{view.slowest_excess_pct:.0f}%"))
    drops = view.total_drops
    if drops:
        problems.append(("yellow", f"{drops:,} telemetry messages lost"))
    if not problems:
        steps = min((r.step for r in view.ranks.values()), default=0)
        t.append("● healthy", style="bold green")
        t.append(f"  {len(view.ranks)} rank{'s' if len(view.ranks) != 1 else ''} stepping, step {steps}, "
                 "no verdict, no stall, nothing lost", style="green")
        return t
    for i, (style, text) in enumerate(problems):
        if i:
            t.append("  ·  ", style="dim")
        t.append(text, style=style)
    return t


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks[:8]) + (f" +{len(ranks) - 8}" if len(ranks) > 8 else "")
