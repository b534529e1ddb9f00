"""Sets of ranks as short text, both ways: process-group names on the wire, rank lists in sentences.

A group is named by its members so that every rank names it alike without talking: `world`, a
range `0-3`, a strided range `0-6/2` (0, 2, 4, 6), or a list `1,5,9`. A thousand-rank world stays
one word; a data-parallel group of a 3D layout stays one strided range.
"""

from __future__ import annotations

from collections.abc import Iterable

WORLD = "world"
MAX_LISTED = 4096
"""A name that lists more ranks than this is not parsed (hostile input)."""


def group_name(ranks: Iterable[int], world_size: int | None = None) -> str:
    members = sorted(set(ranks))
    if not members:
        return ""
    if world_size is not None and members == list(range(world_size)):
        return WORLD
    if len(members) == 1:
        return str(members[0])
    stride = members[1] - members[0]
    if all(b - a == stride for a, b in zip(members, members[1:])):
        return f"{members[0]}-{members[-1]}" if stride == 1 else f"{members[0]}-{members[-1]}/{stride}"
    return ",".join(map(str, members))


def group_members(name: str, world_size: int) -> frozenset[int] | None:
    """The ranks a group name stands for; None when the name is not one (never raises)."""
    if name == WORLD:
        return frozenset(range(world_size))
    try:
        if "," in name:
            parts = name.split(",")
            if len(parts) > MAX_LISTED:
                return None
            members = [int(p) for p in parts]
        else:
            span, _, stride_text = name.partition("/")
            first, dash, last = span.partition("-")
            stride = int(stride_text) if stride_text else 1
            lo = int(first)
            hi = int(last) if dash else lo
            if stride < 1 or hi < lo or (hi - lo) // stride >= MAX_LISTED:
                return None
            members = list(range(lo, hi + 1, stride))
    except ValueError:
        return None
    if any(not 0 <= m < world_size for m in members):
        return None
    return frozenset(members)


def ranks_text(ranks: Iterable[int]) -> str:
    """`rank 3`, `ranks 0–2`, `ranks 0–2, 4, 6–9`: runs of consecutive ranks joined by an en dash."""
    members = sorted(set(ranks))
    if not members:
        return "no rank"
    runs: list[tuple[int, int]] = []
    for r in members:
        if runs and r == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], r)
        else:
            runs.append((r, r))
    text = ", ".join(str(a) if a == b else (f"{a}, {b}" if b == a + 1 else f"{a}–{b}") for a, b in runs)
    return f"rank {text}" if len(members) == 1 else f"ranks {text}"
