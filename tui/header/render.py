"""The header's words: the run's facts on the left, operations in flight and the connection state
on the right (pure functions of the view model)."""

from __future__ import annotations

import time

from rich.text import Text

from ringtop.metrics import fmt
from ringtop.metrics.costs.flops import missing_reason
from ringtop.metrics.lag import BEHIND_AFTER_S
from ringtop.metrics.rules.peaks import implausible
from ringtop.tui.header.model import HeaderModel
from ringtop.tui.state.health import stalled_ranks
from ringtop.tui.state.view_model import RunView
from ringtop.tui.styles import PHASE_STYLE

STATE_STYLE = {
    "live": ("● live", "bold green"),
    "starting": ("○ starting", "bold"),
    "stalled": ("⏸ stalled", "bold yellow"),
    "waiting": ("○ waiting", "dim"),
    "stale": ("◌ stale", "bold yellow"),
    "restarting": ("↻ restarting", "bold yellow"),
    "ended": ("■ ended", "bold"),
    "stopped": ("■ stopped", "bold yellow"),
    "failed": ("✖ failed", "bold red"),
}
END_WORDS_CELLS = 32
"""The header says how the run ended in short, at most this many cells (the health line says it whole),
so that the run's facts, the model's name among them, keep their place."""



def facts_text(v: RunView, *, replay: bool, source: str, refused: str = "", width: int = 0) -> Text:
    """`ringtop ─ run 1a2b3c4d  tiny-gpt 10M params  zero3 ×2 (…)  step 120/2,000  …`; before the
    first message, what the UI waits for (or why the run refuses it). Given a `width`, the facts
    that do not fit are left out whole, the least useful first, rather than cut mid-word. Long by
    design: the items in the order the header shows them, each with its priority, in one place."""
    f = v.facts
    head = Text(no_wrap=True, overflow="ellipsis")
    head.append("ringtop", style="bold")
    head.append(" ─ ", style="dim")
    if not replay and not v.ranks and not f.run_id:
        if refused:
            head.append(f"{source} refuses this UI: {refused}", style="bold red")
        else:
            head.append(f"waiting for telemetry on {source}", style="dim")
        return head
    head.append(f"run {f.run_id[:8] or '?'}", style="bold")
    items: list[tuple[int, Text]] = []  # (priority: lower stays longer, the words)

    def item(priority: int, *parts: tuple[str, str]) -> None:
        items.append((priority, Text.assemble(*parts)))

    if f.model:
        item(3, (f"  {f.model}", ""), (f" {fmt.count(f.param_count)} params" if f.param_count else "", ""))
    if f.strategy:
        item(0, (f"  {f.strategy_name}", "bold magenta"), (f" ×{f.world_size}" if f.world_size else "", ""))
        item(4, (f" ({f.sharding_text})", "magenta"))
        if f.dtype and f.dtype.lower() not in ("fp32", "float32"):
            item(1, (f" {f.dtype}", "bold"))
    elif f.world_size:
        item(0, (f"  ×{f.world_size}", ""))
    step = v.latest_step
    item(0, ("  step ", ""), (f"{step:,}" if step >= 0 else "-", "bold"), (f"/{f.steps:,}" if f.steps else "", "dim"))
    if v.tokens_per_s:
        item(5, (f"  {fmt.count(v.tokens_per_s)} tok/s", ""))
    doubtful = v.tflops > 0 and any(implausible(r.tflops, r.tflops_ceiling) for r in v.ranks.values())
    if doubtful:  # not a measurement: the tokens or FLOPs it came from are wrong
        item(2, (f"  {fmt.tflops(v.tflops)} TFLOP/s", "red"), (" ⚠ implausible", "bold red"))
    elif v.tflops:
        item(5, (f"  {fmt.tflops(v.tflops)} TFLOP/s", ""))
    elif step > 0 and f.flops_source:  # the Hello says why there are none
        item(5, ("  TFLOP/s n/a", "yellow"), (f" ({missing_reason(f.flops_per_token, f.flops_source)})", "dim"))
    ratio = None if doubtful else v.mfu  # no MFU of an implausible figure
    if ratio is not None:
        item(2, ("  MFU ", ""), (fmt.fraction_pct(ratio), "bold"))
    elif f.accelerator and not doubtful:  # a GPU without a known peak; a CPU has none (--peak-tflops gives one)
        item(5, ("  MFU n/a", "yellow"), (f" ({f.peak_source or 'peak unknown'})", "dim"))
    good = v.goodput.result()
    if good.known:  # one item: a narrow header drops it whole, after the model's name
        item(4, ("  goodput ", ""), (f"{fmt.pct(100 * good.goodput)}%", "bold"))
    if v.total_drops:
        item(1, (f"  drops {v.total_drops:,}", "yellow"))
    if v.rejected_total:
        item(1, (f"  rejected {v.rejected_total:,}", "yellow"))
    if v.restart.count:
        item(1, (f"  ↻ {v.restart.count} restart{'s' if v.restart.count > 1 else ''}", "yellow"))
    if v.stale_skipped:  # newest wins while behind: what the screen never drew
        item(1, (f"  {v.stale_skipped:,} stale skipped", "yellow"))
    if f.backend:
        # the device type: rank 0's index says little
        device = f"/{f.device.split(':')[0]}" if f.device and f.device != f.backend else ""
        item(6, (f"  {f.backend}", ""), (device, "dim"))
    kept = list(items)
    if width > 0:
        while kept and head.cell_len + sum(t.cell_len for _, t in kept) > width:
            kept.remove(max(kept, key=lambda pt: (pt[0], items.index(pt))))
    for _, t in kept:
        head.append_text(t)
    return head


def operations_text(v: RunView, *, replay: bool) -> Text:
    """The header's one line about operations in flight: `◐ checkpoint sharded async: running 3s`."""
    t = Text(no_wrap=True)
    if replay or v.is_ended:
        return t  # a log's unanswered command is not in flight now
    active = v.active_commands()
    if not active:
        return t
    c = active[-1]
    mark, style = PHASE_STYLE.get(c.phase, ("…", "yellow"))
    t.append(f"{mark} {c.title}: {c.phase}", style=style)
    if c.sent_ts:
        t.append(f" {fmt.ago(max(0.0, time.time() - c.sent_ts))}", style="dim")
    if len(active) > 1:
        t.append(f" +{len(active) - 1} more", style="dim")
    t.append("  ")
    return t


def connection_text(v: RunView, *, replay: bool, replay_pct: float | None = None, now: float | None = None) -> Text:
    """`● live`, `⏸ stalled: rank 1`, `◌ stale`, `■ stopped: by Ctrl-C …`, `✖ failed: …`; in a replay
    `▶ replay` (with its progress while loading). `now`: the UI's monotonic clock."""
    t = Text(no_wrap=True)
    t.append_text(operations_text(v, replay=replay))
    if replay:
        label = "▶ replay" if replay_pct is None else f"▶ replay {replay_pct:.0f}%"
        t.append(label, style="bold cyan")
        if v.is_ended:
            label, style = STATE_STYLE[v.lifecycle().state]
            t.append(f" {label}", style=style)
    else:
        state = v.state
        if state == "live":  # the connection is live: what the run itself does
            now = time.monotonic() if now is None else now
            life = v.lifecycle(stalled=[s.rank for s in stalled_ranks(v, now)])
            state = life.state if life.state in ("starting", "stalled") else state
        label, style = STATE_STYLE.get(state, (state, ""))
        behind = v.lag.behind_s() if state == "live" else 0.0
        if behind >= BEHIND_AFTER_S:  # live, but what is drawn is that old: never `● live` for it
            label, style = f"◐ behind by {behind:.0f} s", "bold yellow"
        t.append(label, style=style)
        if state == "stalled" and life.rank is not None:
            t.append(f": rank {life.rank}", style="yellow")
        if v.state in ("failed", "stopped"):
            life = v.lifecycle()
            words = life.words.removeprefix("stopped ")
            if v.state == "failed":  # who and how in short: `rank 1: error`, `rank 0 killed by SIGKILL`
                words = words.split(" at step ")[0]
                head, _, reason = words.partition(": ")
                words = f"{head}: {reason.split(':')[0]}" if reason else head
            if len(words) > END_WORDS_CELLS:
                words = words[:END_WORDS_CELLS - 1] + "…"
            t.append(f": {words}", style="red" if v.state == "failed" else "yellow")
    return t


def header_model(v: RunView, *, replay: bool, source: str, refused: str = "", replay_pct: float | None = None,
                 width: int = 0) -> HeaderModel:
    """`width`: the header's cells (0: unknown); the connection state on the right always fits."""
    conn = connection_text(v, replay=replay, replay_pct=replay_pct)
    facts_width = max(0, width - conn.cell_len - 4) if width else 0  # two padding cells each side
    return HeaderModel(facts_text(v, replay=replay, source=source, refused=refused, width=facts_width), conn)
