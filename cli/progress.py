"""The progress line a headless `ringtop run` prints every few seconds, read from the ranks' logs.

Tailing the files the ranks write anyway costs them nothing (no socket, no subscriber the relay
has to serve); a reader that fails stops printing and says nothing, the run goes on.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from ringtop.metrics import fmt
from ringtop.protocol import Hello, ProtocolError, Step
from ringtop.protocol.codec import from_json_line

PROGRESS_EVERY_S = 5.0


def progress_line(latest: dict[int, Step], total_steps: int = 0) -> str:
    """`step 120/1,000  loss 2.913  212.4 ms/step  41.2k tok/s` from each rank's latest step: the
    step every rank has reached, rank 0's loss (the lowest rank's when rank 0 has not logged),
    the slowest rank's step time (the pace of the run) and the ranks' tokens per second summed
    (as the UI's header)."""
    steps = list(latest.values())
    step = min(s.step for s in steps)
    loss = latest[min(latest)].loss
    step_ms = max(s.step_ms for s in steps)
    tokens_per_s = sum(s.tokens_per_s for s in steps)
    of = f"/{total_steps:,}" if total_steps else ""
    return (f"step {step:,}{of}  loss {fmt.loss(loss) if loss is not None else 'n/a'}  "
            f"{fmt.ms(step_ms)} ms/step  {fmt.count(tokens_per_s)} tok/s")


class RankLogTail:
    """Each rank's latest Step in LOGDIR/rank-R.jsonl, reading only what was added since the last
    read, and of that only lines from the end back to the newest step. `since_ts`: files not
    written since then are an earlier run's, in a reused --log-dir."""

    def __init__(self, log_dir: Path, since_ts: float = 0.0) -> None:
        self.log_dir = log_dir
        self.since_ts = since_ts
        self.latest: dict[int, Step] = {}
        self.total_steps = 0
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}

    def read(self) -> dict[int, Step]:
        for path in self.log_dir.glob("rank-*.jsonl"):
            if path in self._offsets or path.stat().st_mtime >= self.since_ts:
                self._read(path)
        return self.latest

    def _read(self, path: Path) -> None:
        with open(path, "rb") as f:
            f.seek(self._offsets.get(path, 0))
            chunk = f.read()
        if not chunk:
            return
        first = path not in self._offsets
        self._offsets[path] = self._offsets.get(path, 0) + len(chunk)
        lines = (self._partial.pop(path, b"") + chunk).split(b"\n")
        if lines[-1]:
            self._partial[path] = lines[-1]  # a line being written: finished next time
        complete = lines[:-1]
        if first and complete:
            hello = _decoded(complete[0])  # a log begins with its rank's Hello
            if isinstance(hello, Hello):
                self.total_steps = hello.steps
        for line in reversed(complete):
            msg = _decoded(line) if b'"step"' in line else None
            if isinstance(msg, Step):
                self.latest[msg.rank] = msg
                return


def _decoded(line: bytes):
    try:
        return from_json_line(line)
    except ProtocolError:
        return None


class ProgressPrinter:
    """A thread printing the progress line every `every_s` while the run makes steps."""

    def __init__(self, log_dir: Path, every_s: float = PROGRESS_EVERY_S, out=None) -> None:
        self._tail = RankLogTail(log_dir, since_ts=time.time() - 1.0)  # a coarse file clock's second
        self._every_s = every_s
        self._out = out
        self._printed_step = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ringtop-progress", daemon=True)

    def start(self) -> ProgressPrinter:
        self._thread.start()
        return self

    def _print_if_moved(self) -> None:
        latest = self._tail.read()
        if not latest:
            return
        step = min(s.step for s in latest.values())
        if step > self._printed_step:
            self._printed_step = step
            print(f"ringtop: {progress_line(latest, self._tail.total_steps)}", file=self._out or sys.stderr,
                  flush=True)

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self._every_s):
                self._print_if_moved()
        except Exception:
            return  # a log that cannot be read: no progress line, the run goes on

    def stop(self) -> None:
        """Stop, after a last line if the run made steps since the one before."""
        self._stop.set()
        self._thread.join(self._every_s + 2.0)
        try:
            self._print_if_moved()
        except Exception:
            pass
