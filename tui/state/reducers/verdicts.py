"""Rank 0's diagnosis as the UI holds it: the verdicts active now, those cleared, the summary."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ringtop.protocol import Event
from ringtop.tui.words import words

VERDICT_KINDS = ("verdict", "verdict_cleared", "diagnosis", "verdicts_active")
"""Event kinds of rank 0's diagnosis: folded in here (and still listed as events), shown on their
own line rather than as the Overview's last warning."""
MAX_CLEARED_VERDICTS = 20


@dataclass
class VerdictState:
    """One finding of rank 0's diagnosis (an Event of kind `verdict`), until `verdict_cleared`."""

    rule: str
    rank: int | None
    """The rank it is about; None for the whole run (e.g. communication-bound)."""
    text: str
    evidence: dict[str, Any] = field(default_factory=dict)
    advice: str = ""
    step: int = -1
    ts: float = 0.0
    level: str = "warn"
    order: int = 0
    """Arrival order: the newest verdict has the highest."""
    cleared_step: int = -1

    @property
    def key(self) -> tuple[str, int | None]:
        return self.rule, self.rank


@dataclass
class Diagnosis:
    """The end-of-run summary (Event kind `diagnosis`): every verdict seen during the run."""

    text: str
    step: int = -1
    ts: float = 0.0
    verdicts: list[VerdictState] = field(default_factory=list)


class VerdictBoard:
    def __init__(self) -> None:
        self.verdicts: dict[tuple[str, int | None], VerdictState] = {}
        """Active verdicts: `verdict` events not yet followed by a matching `verdict_cleared`."""
        self.cleared: deque[VerdictState] = deque(maxlen=MAX_CLEARED_VERDICTS)
        self.diagnosis: Diagnosis | None = None
        self._order = 0

    @property
    def active(self) -> list[VerdictState]:
        """Active verdicts, the newest first."""
        return sorted(self.verdicts.values(), key=lambda v: -v.order)

    def on_event(self, msg: Event) -> float | None:
        """Fold one diagnosis event in; returns the link peak (GB/s) a verdict's evidence names, if any."""
        data = msg.data if isinstance(msg.data, dict) else {}
        if msg.kind == "diagnosis":
            found = data.get("verdicts")
            verdicts = []
            for d in found if isinstance(found, list) else []:
                if isinstance(d, dict):
                    v = verdict_from(d, msg, text=str(d.get("text") or ""))
                    live = self.verdicts.get(v.key)
                    if live is not None and not v.evidence:
                        v.evidence = dict(live.evidence)
                    verdicts.append(v)
            self.diagnosis = Diagnosis(text=msg.text, step=msg.step, ts=msg.ts, verdicts=verdicts)
            return None
        if msg.kind == "verdicts_active":
            found = data.get("verdicts")
            for d in found if isinstance(found, list) else []:
                if isinstance(d, dict):
                    v = verdict_from(d, msg, text=str(d.get("text") or ""))
                    if v.key not in self.verdicts:
                        self._order += 1
                        v.order = self._order
                        self.verdicts[v.key] = v
            return None
        v = verdict_from(data, msg, text=msg.text)
        if msg.kind == "verdict":
            self._order += 1
            v.order = self._order
            self.verdicts[v.key] = v
            peak = v.evidence.get("link_peak_gbps")
            if isinstance(peak, (int, float)) and peak > 0:
                return float(peak)
        else:  # verdict_cleared
            gone = self.verdicts.pop(v.key, None)
            if gone is not None:
                gone.cleared_step = msg.step
                self.cleared.append(gone)
        return None


def verdict_from(data: dict[str, Any], msg: Event, text: str) -> VerdictState:
    rule = data.get("rule")
    rank = data.get("rank")
    evidence = data.get("evidence")
    advice = data.get("advice")
    since = data.get("step")  # the first step of the evidence (the event's own: when it was raised)
    return VerdictState(
        rule=rule if isinstance(rule, str) and rule else (msg.kind or "?"),
        rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
        text=text or msg.text or words(str(rule or msg.kind)),
        evidence=dict(evidence) if isinstance(evidence, dict) else {},
        advice=advice if isinstance(advice, str) else "",
        step=since if isinstance(since, int) and not isinstance(since, bool) and since >= 0 else msg.step,
        ts=msg.ts, level=msg.level)
