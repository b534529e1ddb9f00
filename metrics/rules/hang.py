"""Which rank holds the others up, and where: the one reading of stall reports and step digests.

Pure and torch-free: rank 0's relay runs it on what it forwards (so the logs and the end summary
carry the verdict even when rank 0's own training thread is the one stuck), and the UI runs it on
what it receives (so a UI names the culprit even when rank 0 cannot).

A hang reads like this. Collectives of one process group are issued in the same order on every
member, so each carries the same sequence number everywhere. Ranks stuck inside collective #S of
group G wait for the members that are not in it: those that have issued fewer than S collectives
on G have *not entered* it (they are elsewhere: their phase and stack say where), those that are
gone have died. Members in #S with different kinds, sizes or shapes are *desynchronised*. When
every member is in it, no rank is missing: the transport itself is stuck.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ringtop.metrics.fmt import nbytes
from ringtop.metrics.rank_sets import group_members, ranks_text
from ringtop.metrics.rules.liveness import waited_s

STEP_SYNC = "step-sync"
"""The phase of a rank waiting at the step boundary, where every rank agrees on the commands."""
STARTING = "starting"
"""A report's state in start-up, before the rank counts as stalled (metrics/rules/liveness.py): it
places the rank for a peer that waits for it, and is no stall on its own."""

Kind = Literal["hang", "dead", "desync", "stall"]


@dataclass(frozen=True)
class HangVerdict:
    kind: Kind
    text: str
    culprits: tuple[int, ...] = ()
    """The ranks holding the others up (not entered, dead, or out of step)."""
    waiting: tuple[int, ...] = ()
    group: str = ""
    seq: int = 0
    collective: str = ""
    wait_s: float = 0.0
    step: int = 0
    where: dict[int, str] = field(default_factory=dict)
    """Per culprit, where it is (`forward at model.py:57`), when it said."""


def _op_text(op: Any) -> str:
    size = f" ({nbytes(op.bytes)})" if op.bytes else ""
    return f"{op.kind} #{op.seq} on group {op.group}{size}"


def _whereabouts(report: Any) -> str:
    phase = report.phase or "an unknown phase"
    return f"in {phase} at {report.where}" if report.where else f"in {phase}"


def _oldest_by_group(report: Any) -> dict[str, Any]:
    oldest: dict[str, Any] = {}
    for op in report.in_flight:
        if op.kind == "p2p":
            continue  # a pipeline's sends and receives pair stages, not a group's members in order
        if op.group not in oldest or op.seq < oldest[op.group].seq:
            oldest[op.group] = op
    return oldest


def _issued(report: Any, group: str) -> int | None:
    for cursor in report.groups:
        if cursor.group == group:
            return cursor.issued
    return None


def diagnose(reports: Mapping[int, Any], world_size: int, dead: Collection[int] = ()) -> HangVerdict | None:
    """The reading of the latest stall report of each stuck rank (`Stall` messages, or anything
    with their fields); `dead`: ranks known to be gone (silent, or ended in error). None when
    nothing is stuck."""
    if not reports:
        return None
    gone = set(dead)
    for report in reports.values():
        gone.update(report.gone_peers)
    gone -= set(reports)
    oldest = {rank: _oldest_by_group(report) for rank, report in reports.items()}
    return (_desync(oldest, reports)
            or _missing_from_collective(oldest, reports, world_size, gone)
            or _missing_from_step_sync(reports, world_size, gone)
            or _lone_stall({r: report for r, report in reports.items()
                            if getattr(report, "state", "stalled") != STARTING}))


def _desync(oldest: dict[int, dict[str, Any]], reports: Mapping[int, Any]) -> HangVerdict | None:
    at: dict[tuple[str, int], dict[tuple[str, int, str], list[int]]] = {}
    for rank, ops in oldest.items():
        for op in ops.values():
            at.setdefault((op.group, op.seq), {}).setdefault((op.kind, op.bytes, op.shapes), []).append(rank)
    for (group, seq), signatures in sorted(at.items()):
        if len(signatures) < 2:
            continue
        variants = sorted(signatures.items(), key=lambda kv: (-len(kv[1]), kv[1]))
        majority, culprits = _majority([ranks for _, ranks in variants])
        parts = [f"{ranks_text(ranks)} in {kind} ({nbytes(size)}{', shapes ' + shapes if shapes else ''})"
                 for (kind, size, shapes), ranks in variants]
        text = f"desync at collective #{seq} on group {group}: " + "; ".join(parts)
        step = max(reports[r].step for r in (majority or culprits))
        return HangVerdict("desync", text, culprits=culprits, waiting=tuple(sorted(majority)), group=group, seq=seq,
                           collective=variants[0][0][0], step=step,
                           where={r: _whereabouts(reports[r]) for r in culprits})
    return None


def _missing_from_collective(oldest: dict[int, dict[str, Any]], reports: Mapping[int, Any], world_size: int,
                             gone: set[int]) -> HangVerdict | None:
    candidates = [(op.age_s, rank, op) for rank, ops in oldest.items() for op in ops.values()]
    if not candidates:
        return None
    _, _, target = max(candidates, key=lambda c: (c[0], -c[1]))
    waiting = sorted(rank for rank, ops in oldest.items()
                     if target.group in ops and ops[target.group].seq == target.seq)
    wait_s = waited_s(reports, waiting, target.group, target.seq)
    members = group_members(target.group, world_size) or frozenset(waiting)
    dead_culprits, absent, silent = [], [], []
    for m in sorted(members - set(waiting)):
        if m in gone:
            dead_culprits.append(m)
        elif m not in reports:
            silent.append(m)
        else:
            issued = _issued(reports[m], target.group)
            if issued is None or issued < target.seq:
                absent.append(m)
    op = _op_text(target)
    step = max(reports[r].step for r in waiting)
    where = {m: _whereabouts(reports[m]) + ("" if _issued(reports[m], target.group) else
                                            f", before its first collective on group {target.group}")
             for m in absent}
    who_waits = f"{ranks_text(waiting)} {'has' if len(waiting) == 1 else 'have'} waited in for {wait_s:.0f} s"
    if dead_culprits:
        text = (f"{ranks_text(dead_culprits)} {'has' if len(dead_culprits) == 1 else 'have'} died; "
                f"{ranks_text(waiting)} wait for {'it' if len(dead_culprits) == 1 else 'them'} in {op} "
                f"for {wait_s:.0f} s")
        return HangVerdict("dead", text, culprits=tuple(dead_culprits), waiting=tuple(waiting), group=target.group,
                           seq=target.seq, collective=target.kind, wait_s=wait_s, step=step)
    culprits = absent + silent
    if culprits:
        parts = [f"{ranks_text(absent + silent)} {'has' if len(culprits) == 1 else 'have'} not entered {op} "
                 f"that {who_waits}"]
        parts += [f"rank {m} is {where[m]}" for m in absent]
        if silent:
            parts.append(f"{ranks_text(silent)} sent no stall report")
        return HangVerdict("hang", "; ".join(parts), culprits=tuple(culprits), waiting=tuple(waiting),
                           group=target.group, seq=target.seq, collective=target.kind, wait_s=wait_s, step=step,
                           where=where)
    text = (f"{ranks_text(waiting)} all wait in {op} for {wait_s:.0f} s and no member is missing: "
            "the transport itself is stuck (network, backend)")
    return HangVerdict("hang", text, waiting=tuple(waiting), group=target.group, seq=target.seq,
                       collective=target.kind, wait_s=wait_s, step=step)


def _missing_from_step_sync(reports: Mapping[int, Any], world_size: int, gone: set[int]) -> HangVerdict | None:
    """No collective in flight: ranks at the step boundary wait for those that have not reached it."""
    syncing = sorted(r for r, report in reports.items() if report.phase == STEP_SYNC)
    if not syncing:
        return None
    step = max(reports[r].step for r in syncing)
    wait_s = waited_s(reports, syncing)
    others = sorted(set(range(world_size)) - set(syncing))
    dead_culprits = [r for r in others if r in gone]
    absent = [r for r in others if r not in gone and r in reports]
    silent = [r for r in others if r not in gone and r not in reports]
    boundary = f"the step boundary before step {step}"
    if dead_culprits:
        text = (f"{ranks_text(dead_culprits)} {'has' if len(dead_culprits) == 1 else 'have'} died; "
                f"{ranks_text(syncing)} wait at {boundary} for {wait_s:.0f} s")
        return HangVerdict("dead", text, culprits=tuple(dead_culprits), waiting=tuple(syncing), step=step,
                           wait_s=wait_s)
    culprits = absent + silent
    if not culprits:
        return HangVerdict("hang", f"{ranks_text(syncing)} all wait at {boundary} for {wait_s:.0f} s",
                           waiting=tuple(syncing), step=step, wait_s=wait_s)
    where = {r: _whereabouts(reports[r]) for r in absent}
    parts = [f"{ranks_text(culprits)} {'has' if len(culprits) == 1 else 'have'} not reached {boundary} "
             f"that {ranks_text(syncing)} {'has' if len(syncing) == 1 else 'have'} waited at for {wait_s:.0f} s"]
    parts += [f"rank {r} is {where[r]}" for r in absent]
    if silent:
        parts.append(f"{ranks_text(silent)} sent no stall report")
    return HangVerdict("hang", "; ".join(parts), culprits=tuple(culprits), waiting=tuple(syncing), step=step,
                       wait_s=wait_s, where=where)


def _lone_stall(reports: Mapping[int, Any]) -> HangVerdict | None:
    """Stuck ranks that wait for nobody yet (the others have not run into them)."""
    if not reports:
        return None
    ranks = sorted(reports)
    slowest = max(ranks, key=lambda r: reports[r].running_s)
    report = reports[slowest]
    text = (f"{ranks_text(ranks)} {'has' if len(ranks) == 1 else 'have'} run step {report.step} for "
            f"{report.running_s:.0f} s (stall after {report.threshold_s:.1f} s); rank {slowest} is "
            f"{_whereabouts(report)}")
    return HangVerdict("stall", text, culprits=tuple(ranks), step=report.step, wait_s=report.running_s,
                       where={r: _whereabouts(reports[r]) for r in ranks})


def _majority(variants: list[list[int]]) -> tuple[list[int], tuple[int, ...]]:
    """(the ranks of the largest variant, the others) — or ([], everyone) when no variant is larger
    than the next: two ranks that disagree do not say which is wrong."""
    if len(variants) > 1 and len(variants[0]) == len(variants[1]):
        return [], tuple(sorted(r for ranks in variants for r in ranks))
    return variants[0], tuple(sorted(r for ranks in variants[1:] for r in ranks))


@dataclass(frozen=True)
class StepDesync:
    step: int
    group: str
    culprits: tuple[int, ...]
    agreeing: tuple[int, ...]
    text: str


def step_desync(cursors_by_rank: Mapping[int, Collection[Any]], step: int) -> StepDesync | None:
    """Ranks whose collectives of one step (`Step.collectives`) differ from the other members'
    on a group: a mismatch no backend need notice (gloo delivers a broadcast into a larger buffer
    without complaint), found within the step it happened."""
    by_group: dict[str, dict[tuple[int, int, str], list[int]]] = {}
    for rank, cursors in cursors_by_rank.items():
        for c in cursors:
            if c.group.startswith("p2p"):
                continue
            by_group.setdefault(c.group, {}).setdefault((c.issued, c.count, c.digest), []).append(rank)
    for group, variants in sorted(by_group.items()):
        if len(variants) < 2:
            continue
        ordered = sorted(variants.items(), key=lambda kv: (-len(kv[1]), kv[1]))
        (issued, count, _), agreeing = ordered[0]
        agreeing, culprits = _majority([ranks for _, ranks in ordered])
        if not agreeing:
            text = (f"desync in step {step} on group {group}: "
                    + " and ".join(ranks_text(ranks) for _, ranks in ordered)
                    + " issued different collectives (no majority says which is right)")
            return StepDesync(step, group, culprits, (), text)
        details = []
        for (c_issued, c_count, _), ranks in ordered[1:]:
            if c_count != count:
                details.append(f"{ranks_text(ranks)} issued {c_count} collectives, {ranks_text(agreeing)} {count}")
            else:
                details.append(f"{ranks_text(ranks)} issued #{c_issued - c_count + 1}–#{c_issued} with other "
                               "kinds, sizes or shapes than " + ranks_text(agreeing))
        text = f"desync in step {step} on group {group}: " + "; ".join(details)
        return StepDesync(step, group, culprits, tuple(sorted(agreeing)), text)
    return None
