"""A run's log folder read back: each rank's messages (`rank-R.jsonl`), cut into the attempts of a
run its launcher restarted, and the messages goodput counts. One reading for `summary`, `report`
and rank 0 of a restarted run (which starts its relay's count from the run's start)."""

from __future__ import annotations

from pathlib import Path

from ringtop.protocol.codec import read_log
from ringtop.protocol.messages import Bye, Hello, Stall


def rank_logs(log_dir: Path) -> list[tuple[int, list]]:
    """(rank, its messages in file order) for each `rank-R.jsonl` of `log_dir`, by rank."""
    found = []
    for path in log_dir.glob("rank-*.jsonl"):
        number = path.stem.split("-", 1)[1]
        if number.isascii() and number.isdigit():
            found.append((int(number), path))
    return [(rank, read_log(path)) for rank, path in sorted(found)]


def attempts(messages: list) -> list[list]:
    """A rank's log cut where a new process of it begins (its `seq` starts again: a new attempt's
    first message may come before its Hello) or a Hello says another restart count: the messages
    of each attempt of the run, in order."""
    cut: list[list] = [[]]
    count, prev_seq = None, None
    for m in messages:
        seq = getattr(m, "seq", None)
        new_process = prev_seq is not None and type(seq) is int and seq < prev_seq
        new_attempt = isinstance(m, Hello) and count is not None and m.restart_count != count
        if (new_process or new_attempt) and cut[-1]:
            cut.append([])
            count = None
        if isinstance(m, Hello):
            count = m.restart_count
        if type(seq) is int:
            prev_seq = seq
        cut[-1].append(m)
    return cut


def attempt_of(part: list) -> int:
    """The restart count of an attempt's messages (its Hello's; 0 without one)."""
    hello = next((m for m in part if isinstance(m, Hello)), None)
    return hello.restart_count if hello is not None else 0


def goodput_inputs(logs: list[tuple[int, list]]) -> list:
    """What goodput takes from a run's logs, merged in time order (metrics/goodput.py): all of rank
    0's messages; of the others their Hellos, stalls, Byes and where their log ends."""
    messages = []
    for rank, logged in logs:
        if rank == 0:
            messages += logged
        else:
            messages += [m for m in logged if isinstance(m, (Hello, Stall, Bye))] + logged[-1:]
    return sorted(messages, key=lambda m: m.ts)
