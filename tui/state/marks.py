"""The ranks in trouble and the word each gets: hung (the others wait for it), out of step, stalled,
flagged by a verdict. One reading, so that a rank is marked the same wherever it appears: its own
row's note (a node opened, or after a filter), its node's row, which sorts first in every order.
Dead, silent and ended ranks are the row's own state (RankRow) and marked from it."""

from __future__ import annotations

from typing import Callable, Iterable, NamedTuple, TypeVar

from rich.text import Text

from ringtop.metrics.rank_sets import ranks_text
from ringtop.tui.state.view_model import RunView
from ringtop.tui.words import words

T = TypeVar("T")
HUNG, FLAGGED = 0, 1
"""Severity, worst first: a node's rows and a node list sort by it."""


class Mark(NamedTuple):
    note: str
    style: str
    severity: int


HANG_NOTES = {"hang": "✖ hung: the others wait for it", "dead": "✖ hung: the others wait for it",
              "desync": "✖ out of step with the others", "stall": "⏸ stalled"}


def rank_marks(view: RunView) -> dict[int, Mark]:
    """rank -> its mark, for the ranks the hang verdict blames and those an active verdict names.
    O(culprits + verdicts), not O(ranks): read once per repaint."""
    marks: dict[int, Mark] = {}
    for v in reversed(view.active_verdicts):  # the newest wins
        if v.rank is not None:
            marks[v.rank] = Mark(f"⚠ {words(v.rule)}", "bold yellow", FLAGGED)
    verdict = view.hang_verdict()
    if verdict is not None:
        note = HANG_NOTES.get(verdict.kind, HANG_NOTES["hang"])
        if verdict.kind == "stall" and verdict.wait_s > 0:
            note = f"{note} {verdict.wait_s:.0f} s"
        for rank in verdict.culprits:
            marks[rank] = Mark(note, "bold red", HUNG)
    return marks


def trouble_of(ranks: Iterable[int], marks: dict[int, Mark], dead: int = 0) -> int:
    """The worst severity among `ranks` (a node's), dead counting as hung; len(severities) when none."""
    if dead:
        return HUNG
    return min((marks[r].severity for r in ranks if r in marks), default=FLAGGED + 1)


def troubled_first(items: list[T], ranks_of: Callable[[T], Iterable[int]], marks: dict[int, Mark],
                   dead_of: Callable[[T], int] = lambda item: 0) -> list[T]:
    """`items` (nodes or ranks, already in the order the user chose) with those in trouble first,
    the order kept within each severity: what the Memory and Comm tabs' tables do with the marks."""
    if not marks and not any(dead_of(i) for i in items):
        return items
    return sorted(items, key=lambda i: trouble_of(ranks_of(i), marks, dead_of(i)))


def marked_note(ranks: Iterable[int], marks: dict[int, Mark], note: Text) -> Text:
    """A node row's note with its marked ranks named first (`✖ rank 700 hung · 1 dead`)."""
    hit = sorted(r for r in ranks if r in marks)
    if not hit:
        return note
    worst = min(marks[r].severity for r in hit)
    t = Text(("✖ " if worst == HUNG else "⚠ ") + ranks_text(hit[:4]) + (" hung" if worst == HUNG else " flagged"),
             style="bold red" if worst == HUNG else "bold yellow")
    if note.plain:
        t.append(" · ")
        t.append_text(note)
    return t
