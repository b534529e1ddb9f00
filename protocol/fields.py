"""The bounded field types and limits every message shares: a value outside them is refused at
decode, so a receiver never guards a count that is negative or a measurement that is not finite."""

from __future__ import annotations

from typing import Annotated

import msgspec

PROTOCOL_VERSION = 1

UI_RANK = -1
"""`rank` used by messages that do not come from a training rank (the UI, `ringtop ctl`)."""

MAX_WORLD_SIZE = 1 << 20
"""More ranks than any cluster has: a larger world size or rank is refused at decode."""
MAX_COUNT = 1 << 62
MAX_REAL = 1e18

Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
"""Counters, bytes, steps, sizes: never negative."""
Real = Annotated[float, msgspec.Meta(ge=-MAX_REAL, le=MAX_REAL)]
"""Measurements: finite (NaN and infinities are refused, also where MessagePack could carry them)."""
Rank = Annotated[int, msgspec.Meta(ge=UI_RANK, lt=MAX_WORLD_SIZE)]
WorldSize = Annotated[int, msgspec.Meta(ge=1, le=MAX_WORLD_SIZE)]
MAX_ID_CHARS = 128
CommandId = Annotated[str, msgspec.Meta(max_length=MAX_ID_CHARS)]
"""A command's id, echoed in every reply to it."""
MAX_DIMENSION_CHARS = 32
"""A mesh dimension's name (`tp`, `dp`, `pp`)."""
RankIndex = Annotated[int, msgspec.Meta(ge=0, lt=MAX_WORLD_SIZE)]
"""A training rank (never UI_RANK)."""
Seconds = Annotated[float, msgspec.Meta(ge=0, le=MAX_REAL)]
