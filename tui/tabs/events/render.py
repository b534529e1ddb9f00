"""The Events tab's words: the operations panel and one line per event, in time order."""

from __future__ import annotations

import time

from rich.text import Text

from ringtop.metrics import fmt
from ringtop.tui.state.reducers import CommandState, EventLine, describe_result
from ringtop.tui.state.view_model import RunView
from ringtop.tui.styles import LEVEL_STYLE, PHASE_STYLE

OPERATIONS_SHOWN = 6
RUN_KINDS = ("ended", "run", "rejected")
"""Events about the run as a whole (not one rank's, not the UI's own)."""


def operation_line(c: CommandState) -> Text:
    mark, style = PHASE_STYLE.get(c.phase, ("?", ""))
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f" {mark} {c.phase:<7} ", style=style)
    t.append(c.title, style="bold")
    t.append(f" [{c.id}]" if c.id else "", style="dim")
    if c.finished and c.sent_ts and c.finished_ts:
        t.append(f"  after {max(0.0, c.finished_ts - c.sent_ts):.1f} s", style="dim")
    elif c.sent_ts:
        t.append(f"  for {fmt.ago(max(0.0, time.time() - c.sent_ts))}", style="dim")
    if c.status == "error":
        t.append(f"  {c.error}", style="red")
    elif c.status == "done" and c.result:
        t.append("  " + describe_result(c.cmd, "done", c.result, one_line=True))
    return t


def operations_text(v: RunView, *, replay: bool = False) -> Text:
    """The latest operations and where each stands; with none, the keys that start one."""
    t = Text(no_wrap=True, overflow="ellipsis")
    recent = v.recent_commands(OPERATIONS_SHOWN)
    if not recent:
        t.append("operations: none seen by this UI", style="bold")
        if not replay:
            t.append("   S switch · c checkpoint full · C sharded async · m micro-batches (pp) · p profile · "
                     "s status · k stacks", style="dim")
        return t
    t.append("operations", style="bold")
    for c in recent:
        t.append("\n")
        t.append_text(operation_line(c))
    return t


def event_line(e: EventLine) -> Text:
    line = Text(no_wrap=False)
    line.append(fmt.clock(e.ts) + " ", style="dim")
    line.append(f"{e.level:<5} ", style=LEVEL_STYLE.get(e.level, ""))
    who = f"r{e.rank}" if e.rank is not None else ("run" if e.kind in RUN_KINDS else "ui")
    line.append(f"{who:>4} ", style="bold")
    line.append(e.text)
    return line

