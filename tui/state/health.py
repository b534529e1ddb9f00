"""One line that says whether the run is healthy and, if not, what and where — the Overview's first.

Pure: a function of the view model and the UI's clock. It gathers what other panels show in
detail (who holds the others up when ranks are stuck, active verdicts, the slowest rank, ranks
that stopped finishing steps, dead ranks, dropped messages) so that a glance at the top of the
Overview answers the 3 a.m. question.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import islice

from rich.text import Text

from ringtop.metrics.rank_sets import ranks_text
from ringtop.metrics.rules import liveness
from ringtop.metrics.rules.hang import HangVerdict
from ringtop.tui.state.nodes import nodes_cut_off
from ringtop.tui.state.readings import SLOWEST_WINDOW
from ringtop.tui.state.reducers.steps import LossSpike
from ringtop.tui.state.view_model import RunView
from ringtop.tui.words import in_step, words

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


def health_words(verdict: HangVerdict) -> tuple[str, str]:
    """(style, words) for the health line: the verdict in a few words; the banner has the rest."""
    culprits, waiting = ranks_text(verdict.culprits), ranks_text(verdict.waiting)
    where = f" in {verdict.collective} #{verdict.seq} ({verdict.group})" if verdict.collective else ""
    if verdict.kind == "stall":
        return "bold yellow", f"⏸ stalled: {culprits} {in_step(verdict.step)} for {verdict.wait_s:.0f} s"
    if verdict.kind == "desync":
        return "bold red", f"✖ desync: {culprits} out of step with {waiting}{where}"
    if verdict.kind == "dead":
        return "bold red", f"✖ hung: {culprits} died, {waiting} wait{where}"
    if not verdict.culprits:
        return "bold red", f"✖ hung: {waiting} all wait{where}, no rank missing (transport)"
    return "bold red", f"✖ hung: {culprits} holding up {waiting}{where}"


def stalled_ranks(view: RunView, now: float) -> list[Stall]:
    """Ranks still heard from (heartbeats) that have finished no step for longer than the UI's
    stall limit (`liveness.ui_stall_after_s` of their recent steps): hung in a collective or in
    their own code. None in a replay, where arrival times say nothing."""
    if not view.watch_liveness:
        return []
    least_s = liveness.ui_stall_after_s(0.0)
    out = []
    for row in view.ranks.values():
        since = row.step_seen if row.step_seen is not None else row.heard_since
        if row.ended or row.dead or since is None:
            continue
        waited = now - since
        if waited <= least_s:
            continue  # under any limit: its steps' median is not needed (1024 rows, 4 times a second)
        recent_s = [ms / 1e3 for ms in islice(reversed(row.step_ms_history), liveness.MEDIAN_OF)]
        past_start_up = row.step >= view.facts.start_step + liveness.STEPS_KNOWN  # it has a median of its own
        if waited > liveness.ui_stall_after_s(liveness.median_step_s(recent_s), past_start_up):
            out.append(Stall(row.rank, row.step, waited, seen_a_step=row.step_seen is not None))
    return sorted(out, key=lambda s: (-s.seconds, s.rank))


LIFECYCLE_MARKS = {"ended": ("■", "bold"), "stopped": ("■", "bold yellow"), "failed": ("✖", "bold red")}


def unreachable_text(view: RunView, now: float) -> str:
    """When no rank has been heard for a while and the UI cannot tell why: rank 0 carries the relay
    that every other rank's telemetry passes through, so all the UI knows is that it is unreachable."""
    if not view.watch_liveness or view.is_ended or view.state != "stale":
        return ""
    heard = [r.last_seen for r in view.ranks.values() if r.last_seen is not None and not (r.ended or r.dead)]
    if not heard:
        return ""
    return (f"✖ no rank heard for {now - max(heard):.0f} s: rank 0 (the relay) unreachable: it died, "
            "or the link to it is cut")


def health_line(view: RunView, now: float) -> Text:
    """`● healthy …` in green, or the problems, the worst first, each with where."""
    t = Text(no_wrap=True, overflow="ellipsis")
    if not view.ranks:
        t.append("○ no rank has reported yet", style="dim")
        return t
    life = view.lifecycle()
    if life.state == "restarting":  # every rank ended, one failed, and the launcher starts them again
        t.append(f"↻ restarting: {life.words}", style="bold yellow")
        return t
    if life.final:  # an ended run is never "healthy … stepping"
        mark, style = LIFECYCLE_MARKS[life.state]
        t.append(f"{mark} {life.state}", style=style)
        t.append(f": {life.words}", style=style.replace("bold ", ""))
        return t
    problems: list[tuple[str, str]] = []
    silent = unreachable_text(view, now)
    if silent:
        problems.append(("bold red", silent))
    verdict = view.hang_verdict()
    if verdict is not None:
        problems.append(health_words(verdict))
    desync = view.desync_notice()
    if desync is not None and (verdict is None or verdict.kind != "desync"):
        problems.append(("bold red", f"✖ desync: {desync.text}"))
    stuck = [r for r in view.ranks.values() if r.stuck and not (r.dead or r.ended)]
    for row in stuck[:2]:  # said whole: where it is stuck is the point
        problems.append(("bold red", f"✖ rank {row.rank} {row.stuck}"))
    if len(stuck) > 2:
        problems.append(("bold red", f"✖ {len(stuck) - 2} more ranks stuck"))
    dead = sorted(r.rank for r in view.ranks.values() if r.dead)
    if dead:
        problems.append(("bold red", f"✖ rank{'s' if len(dead) > 1 else ''} {_ranks(dead)} dead"))
    cut_off = nodes_cut_off(view)
    for node in cut_off[:3]:
        problems.append(("bold red", f"✖ node {node.host} unreachable: {ranks_text(node.ranks)} silent "
                                     f"{node.silent_s:.0f} s (its node relay or the link to it; training there "
                                     "may go on)"))
    unheard = {r for node in cut_off for r in node.ranks}
    problems += _numerics_problems(view)
    if verdict is None and not silent:  # ranks without steps, said only when no stall report says more
        problems += _stall_problems(view, now, unheard)
    verdicts = view.active_verdicts
    if verdicts:
        where = f" (rank {verdicts[0].rank})" if verdicts[0].rank is not None else ""
        more = f" +{len(verdicts) - 1} more" if len(verdicts) > 1 else ""
        problems.append(("bold yellow", f"⚠ {words(verdicts[0].rule)}{where}{more}"))
    slow = view.slowest_shown
    if slow is not None:
        problems.append(("yellow", f"▲ rank {slow.rank} slowest: compute +{slow.excess_pct:.0f}% "
                                   f"(mean of the last {SLOWEST_WINDOW} steps)"))
    if view.restart.count:
        problems.append(("yellow", restart_words(view)))
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


def _numerics_problems(view: RunView) -> list[tuple[str, str]]:
    """The health line's words for the numbers: a loss not finite, steps skipped, a loss spike."""
    out: list[tuple[str, str]] = []
    bad = view.nonfinite_ranks
    skipped = view.last_skipped_step
    if bad:
        first = view.first_nonfinite
        since = f" (first: rank {first.rank} at step {first.step:,})" if first is not None else ""
        now_skipped = "; step skipped" if skipped is not None and skipped == view.latest_step else ""
        out.append(("bold red", f"✖ loss not finite on rank{'s' if len(bad) > 1 else ''} {_ranks(bad)}{since}"
                                     f"{now_skipped}"))
    elif skipped is not None and view.latest_step - skipped <= SPIKE_SHOWN_STEPS:
        first = view.first_nonfinite
        since = f" (loss first not finite on rank {first.rank} at step {first.step:,})" if first is not None else ""
        what = (f"{view.skipped_steps:,} steps skipped, the last {skipped:,}" if view.skipped_steps > 1
                else f"step {skipped:,} skipped")
        out.append(("bold yellow", f"⚠ {what}: gradient norm not finite{since}"))
    spike = view.step_history.last_spike
    if spike is not None and view.latest_step - spike.step <= SPIKE_SHOWN_STEPS:
        out.append(("bold yellow", spike_words(spike)))
    return out


def _stall_problems(view: RunView, now: float, unheard: set[int]) -> list[tuple[str, str]]:
    """Ranks without steps by the UI's clock (at most three), those of unreachable nodes left out."""
    out: list[tuple[str, str]] = []
    stalls = [s for s in stalled_ranks(view, now) if s.rank not in unheard]
    for stall in stalls[:3]:
        last = f"last {stall.step}" if stall.step >= 0 else "none yet"
        if stall.seen_a_step:
            text = f"⏸ rank {stall.rank}: no step for {stall.seconds:.0f} s ({last})"
        else:
            text = f"⏸ rank {stall.rank}: no step in the {stall.seconds:.0f} s since this UI attached ({last})"
        out.append(("bold red", text))
    return out


def restart_words(view: RunView) -> str:
    """`↻ restarted 1× after rank 1: error: …; 8.5 s lost to restarts` (goodput's count)."""
    seen = view.restart
    lost_s = view.goodput.result().lost_s.get("restart", 0.0)
    lost = f"; {lost_s:.1f} s lost to restarts" if lost_s > 0 else ""
    return f"↻ restarted {seen.count}× {seen.after}".rstrip() + lost


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks[:8]) + (f" +{len(ranks) - 8}" if len(ranks) > 8 else "")


def spike_words(spike: LossSpike) -> str:
    """`⚠ loss spike on rank 0 at step 57: 354 against its median 7.07 (z 160)`; a spike of the
    ranks' mean says so and names the rank whose loss was highest."""
    s = spike.spike
    z = f" (z {s.z:.0f})" if math.isfinite(s.z) else ""
    if spike.own:
        return (f"⚠ loss spike on rank {spike.rank} at step {spike.step:,}: {s.loss:.3g} against its median "
                f"{s.median:.3g}{z}")
    highest = f", highest on rank {spike.rank}" if spike.rank is not None else ""
    return (f"⚠ loss spike at step {spike.step:,}: mean of ranks {s.loss:.3g}{highest}, against a median "
            f"{s.median:.3g}{z}")
