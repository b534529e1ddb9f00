"""Read a telemetry log directory (`rank-R.jsonl`, one JSON message per line) for replay.

The files are written by each rank's FileSink while the run goes on, so the last line of a file may
be cut off mid-write (a torn write) — that line is skipped and reported, never fatal. A bad line in
the middle is skipped and reported with its line number. The ranks' streams are merged by `ts`
(each file's own order is kept, so a rank's Hello still comes before its Steps and Bye). Log-only
lines (each step's collectives, for `ringtop trace`) are skipped: the screen has no use for them.
"""

from __future__ import annotations

import heapq
import re
from pathlib import Path
from typing import Any, NamedTuple

from ringtop.protocol import ProtocolError, from_json_line
from ringtop.protocol.codec import log_only_line
from ringtop.protocol.messages import LOG_ONLY
from ringtop.tui.sanitize import sanitized

RANK_FILE = re.compile(r"^rank-(\d+)\.jsonl$")


class ReplayError(Exception):
    """The log directory cannot be replayed at all (missing, empty, nothing readable)."""


class ReplayLog(NamedTuple):
    messages: list[Any]
    """Decoded messages from every rank, merged by timestamp."""
    problems: list[str]
    """One line per skipped line, saying which file, which line and why."""


def rank_files(logdir: str | Path) -> list[tuple[int, Path]]:
    """The `rank-R.jsonl` files in `logdir`, by rank. Raises ReplayError when there are none."""
    path = Path(logdir)
    if not path.exists():
        raise ReplayError(f"log directory {str(path)!r} does not exist")
    if not path.is_dir():
        raise ReplayError(f"{str(path)!r} is not a directory (expected a log directory of rank-R.jsonl files)")
    found = []
    for p in path.iterdir():
        m = RANK_FILE.match(p.name)
        if m and p.is_file():
            found.append((int(m.group(1)), p))
    if not found:
        raise ReplayError(f"no rank-R.jsonl files in {str(path)!r}")
    return sorted(found)


def read_rank_file(path: Path) -> tuple[list[Any], list[str]]:
    """Messages of one file, plus problems (torn last line, bad lines)."""
    messages: list[Any] = []
    problems: list[str] = []
    try:
        data = path.read_bytes()
    except OSError as exc:
        return [], [f"{path.name}: cannot read: {exc.strerror or exc}"]
    lines = data.split(b"\n")
    # data ending in b"\n" leaves an empty last element: every line was complete
    last_index = len(lines) - 1
    while last_index >= 0 and not lines[last_index].strip():
        last_index -= 1
    for i, raw in enumerate(lines[: last_index + 1]):
        if not raw.strip() or log_only_line(raw):  # each step's collectives: the screen has no use for them
            continue
        try:
            msg = from_json_line(raw)
            if type(msg) not in LOG_ONLY:
                messages.append(sanitized(msg))
        except ProtocolError as exc:
            if i == last_index:
                problems.append(f"{path.name}: last line is incomplete (torn write), skipped")
            else:
                problems.append(f"{path.name}: line {i + 1} skipped: {exc.message}")
        except Exception as exc:  # whatever a file holds, the replay goes on without that line
            problems.append(f"{path.name}: line {i + 1} skipped: unreadable ({type(exc).__name__})")
    return messages, problems


def load_replay(logdir: str | Path) -> ReplayLog:
    """All messages of a log directory merged by `ts`, plus the problems met on the way."""
    files = rank_files(logdir)
    streams: list[list[Any]] = []
    problems: list[str] = []
    for _, path in files:
        msgs, probs = read_rank_file(path)
        streams.append(msgs)
        problems.extend(probs)
    merged = list(heapq.merge(*streams, key=lambda m: m.ts))
    if not merged:
        detail = ("; " + "; ".join(problems[:3])) if problems else ""
        raise ReplayError(f"no readable messages in {str(Path(logdir))!r}{detail}")
    return ReplayLog(merged, problems)
