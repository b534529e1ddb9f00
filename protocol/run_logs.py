"""A run's log folder read back: each rank's messages (`rank-R.jsonl`), cut into the attempts of a
run its launcher restarted, and the messages goodput counts. One reading for `summary`, `report`
and rank 0 of a restarted run (which starts its relay's count from the run's start)."""

from __future__ import annotations

import re
import signal
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


LAUNCHER_OUTPUT = "agents.log"
"""Where `ringtop run` keeps its launcher's output, in the run's log folder."""
LAUNCHER_TAIL_BYTES = 4 * 2**20
_WORKER_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: \d+ \(pid: (\d+)\)")
"""torch's elastic launcher, as each worker it started fails: `failed (exitcode: -9) local_rank: 1
(pid: 2124) of binary: …` (a negative code: the signal that ended it)."""


def launcher_failures(text: str) -> dict[int, int]:
    """pid -> exit code of every worker the launcher's output says failed (every attempt's)."""
    return {int(pid): int(code) for code, pid in _WORKER_FAILED.findall(text)}


def read_launcher_failures(log_dir: Path) -> dict[int, int]:
    """`launcher_failures` of the launcher's output kept in `log_dir` (its last LAUNCHER_TAIL_BYTES)."""
    try:
        with open(log_dir / LAUNCHER_OUTPUT, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - LAUNCHER_TAIL_BYTES))
            return launcher_failures(f.read().decode("utf-8", "replace"))
    except OSError:
        return {}


class LauncherFailures:
    """The launcher's output followed as it grows (`ringtop run --ui`): pid -> how each worker it saw
    fail ended (`killed by SIGKILL`), read incrementally — at most READ_BYTES a call — so that a
    caller once a second costs next to nothing."""

    READ_BYTES = 1 << 20

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self._found: dict[int, str] = {}

    def __call__(self) -> dict[int, str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read(self.READ_BYTES)
        except OSError:
            return self._found
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()[-4096:]  # a line still being written; a runaway one is cut
        for pid, code in launcher_failures(b"\n".join(lines).decode("utf-8", "replace")).items():
            self._found[pid] = exit_words(code)
        return self._found


def exit_words(code: int) -> str:
    """A worker's exit code in words: `killed by SIGKILL`, `exited with code 1`."""
    return f"killed by {signal_name(-code)}" if code < 0 else f"exited with code {code}"


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def silent_end(part: list, failures: dict[int, int]) -> str:
    """How a rank whose attempt `part` ends without a Bye ended, as the launcher saw its process
    (`killed by SIGKILL`, `exited with code 1`), else `ended without a Bye`."""
    hello = next((m for m in part if isinstance(m, Hello)), None)
    code = failures.get(hello.pid) if hello is not None and hello.pid > 0 else None
    return "ended without a Bye" if code is None or code == 0 else exit_words(code)
