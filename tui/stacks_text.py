"""A `stacks` reply's result in words, line by line: `ringtop ctl stacks` prints the lines, the Hang
view styles them by their role. Pure (no Textual, no Rich), and the result is wire data: anything of
the wrong type is left out rather than trusted.

Per group of ranks with the same stack (the odd ones out first, as rank 0 orders them): who, where
and since when; the collectives it waits in; then the stack, innermost frame last (where a
traceback ends), the frame it is in marked.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from ringtop.metrics.rank_sets import ranks_text


class StackLine(NamedTuple):
    indent: int
    text: str
    role: str
    """`summary`, `group`, `in_flight`, `heading`, `frame`, `where` (the frame the ranks are in),
    `missing`."""


def _ranks(value: Any) -> list[int]:
    return [r for r in value if isinstance(r, int) and not isinstance(r, bool)] if isinstance(value, list) else []


def _num(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def where_index(stack: list[str], where: str) -> int:
    """The innermost frame of `stack` that is `where` (`model.py:57 in forward`: the frame's file
    name, line and function), or -1."""
    if where:
        for i in range(len(stack) - 1, -1, -1):
            frame = stack[i]
            if frame == where or frame.endswith("/" + where) or frame.endswith("\\" + where):
                return i
    return -1


def group_heading(group: dict[str, Any]) -> str:
    """`ranks 0–2 (3): step-sync, train.py:88 in step, step 412, running 41.0 s`."""
    ranks = _ranks(group.get("ranks"))
    label = group.get("label") if isinstance(group.get("label"), str) and group.get("label") else ranks_text(ranks)
    parts = [str(group.get("phase") or "phase unknown"), str(group.get("where") or "where unknown")]
    step = group.get("step")
    if isinstance(step, int) and not isinstance(step, bool):
        parts.append(f"step {step:,}")
    running = _num(group.get("running_s"))
    if running is not None:
        parts.append(f"running {running:.1f} s")
    return f"{label} ({len(ranks)}): " + ", ".join(parts)


def stacks_lines(result: dict[str, Any]) -> list[StackLine]:
    r = result if isinstance(result, dict) else {}
    groups = [g for g in r.get("groups", []) if isinstance(g, dict)] if isinstance(r.get("groups"), list) else []
    missing = _ranks(r.get("missing"))
    answered = r.get("answered")
    total = answered + len(missing) if isinstance(answered, int) and not isinstance(answered, bool) else None
    summary = (f"{answered} of {total} ranks answered" if total is not None else "ranks answered: ?") + \
        f", {len(groups)} distinct stack{'s' if len(groups) != 1 else ''}"
    lines = [StackLine(0, summary, "summary")]
    for g in groups:
        lines.append(StackLine(0, group_heading(g), "group"))
        in_flight = [str(op) for op in g.get("in_flight", [])] if isinstance(g.get("in_flight"), list) else []
        for op in in_flight:
            lines.append(StackLine(1, f"waiting in {op}", "in_flight"))
        stack = [str(f) for f in g.get("stack", [])] if isinstance(g.get("stack"), list) else []
        if not stack:
            lines.append(StackLine(1, "no stack (the training thread was not found)", "heading"))
            continue
        lines.append(StackLine(1, "stack, innermost last:", "heading"))
        marked = where_index(stack, str(g.get("where") or ""))
        lines += [StackLine(2, frame, "where" if i == marked else "frame") for i, frame in enumerate(stack)]
    if missing:
        lines.append(StackLine(0, f"missing: {ranks_text(missing)} did not answer in time (stuck whole, dead, "
                                  "or its telemetry thread is blocked)", "missing"))
    return lines


def stacks_plain(result: dict[str, Any]) -> str:
    """The lines as text, two spaces per indent level (`ringtop ctl stacks`)."""
    return "\n".join("  " * line.indent + line.text for line in stacks_lines(result))
