"""How each rank of this node ended, seen from outside it: a relay observer learns each local
rank's process from its Hello (pid and start, so a reused pid is no witness) and its last step;
`look` reads /proc for each that has not said Bye and names one whose process is gone — from
its exit status if the kernel still holds it, else from the launcher's report under `ringtop
run`, else as gone without a word; and one that is silent but alive as stuck (`stuck`), with its
state, CPU and, where py-spy is installed, its stack. Torch-free and cheap: a `stat` read per
rank per look."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ringtop.metrics.rules.liveness import is_silent, stuck_words
from ringtop.protocol import UI_RANK, Bye, Hello, Message, RankExit, RankLook, Step
from ringtop.protocol.native_stack import StackReader
from ringtop.protocol.processes import CpuUse, look, zombie_exit_code
from ringtop.protocol.run_logs import LAUNCHER_OUTPUT, LauncherFailures, exit_words

LOOK_EVERY_S = 0.5
SAY_STUCK_EVERY_S = 1.0
"""A stuck rank is said again this often, unchanged (a UI calls a silent rank dead without it)."""
QUIET_S = 5.0
"""A rank of another node silent this long counts as done for the watcher's own end."""


@dataclass
class _Rank:
    pid: int
    started_ts: float
    step: int = -1
    ended: bool = False


class Witness:
    def __init__(self, log_dir: str = "", host: str | None = None, read_stacks: bool = True) -> None:
        self.host = host or socket.gethostname()
        self._lock = threading.Lock()
        self._local: dict[int, _Rank] = {}
        self._heard: dict[int, float] = {}
        """Every rank's last message (monotonic), this node's or not."""
        self._said_bye: set[int] = set()
        self._launcher = LauncherFailures(Path(log_dir) / LAUNCHER_OUTPUT) if log_dir else None
        self.stacks = StackReader(read_stacks)
        self._cpu = CpuUse()
        self._said_stuck: dict[int, tuple[str, float]] = {}

    def observe(self, msg: Message) -> None:
        """On the relay's thread, for each message it forwards."""
        if msg.rank < 0:
            return  # a watcher's own word
        with self._lock:
            self._heard[msg.rank] = time.monotonic()
            if isinstance(msg, Hello):
                if msg.host == self.host and msg.pid > 0:
                    self._local[msg.rank] = _Rank(msg.pid, msg.process_started_ts)
            elif isinstance(msg, Step):
                seen = self._local.get(msg.rank)
                if seen is not None and msg.step > seen.step:
                    seen.step = msg.step
            elif isinstance(msg, Bye):
                self._said_bye.add(msg.rank)
                seen = self._local.get(msg.rank)
                if seen is not None:
                    seen.ended = True

    def look(self) -> list[RankExit]:
        """The local ranks found gone since the last look, each named once."""
        with self._lock:
            suspects = [(r, s) for r, s in self._local.items() if not s.ended]
        found = []
        for rank, seen in suspects:
            if look(seen.pid, seen.started_ts) is not None:
                continue
            how, detail = self._how(seen.pid)
            exit_ = RankExit(rank=UI_RANK, ts=time.time(), of_rank=rank, pid=seen.pid, host=self.host[:256],
                             how=how, detail=detail, step=seen.step)
            with self._lock:
                seen.ended = True
            found.append(exit_)
        return found

    def stuck(self) -> list[RankLook]:
        """The local ranks silent past the silence rule whose process is alive: stuck, with their
        state, CPU and (py-spy) stack; each said again every SAY_STUCK_EVERY_S while it lasts."""
        now = time.monotonic()
        with self._lock:
            silent = [(r, s, now - self._heard.get(r, now)) for r, s in self._local.items() if not s.ended]
        found = []
        for rank, seen, silent_s in silent:
            if not is_silent(silent_s):
                self._said_stuck.pop(rank, None)
                continue
            proc = look(seen.pid, seen.started_ts)
            if proc is None:
                continue  # gone: `look` names it
            cpu_pct = self._cpu.pct(rank, proc.cpu_s, now)
            words = stuck_words(proc.state, self.stacks.latest(rank, seen.pid), cpu_pct)
            said = self._said_stuck.get(rank)
            if said is not None and said[0] == words and now - said[1] < SAY_STUCK_EVERY_S:
                continue
            self._said_stuck[rank] = (words, now)
            found.append(RankLook(ts=time.time(), of_rank=rank, pid=seen.pid, host=self.host[:256],
                                  state=proc.state[:8], words=words[:2048], silent_s=round(silent_s, 1)))
        return found

    def _how(self, pid: int) -> tuple[str, str]:
        code = zombie_exit_code(pid)
        if code is not None:
            return exit_words(code), f"pid {pid}, seen by its node's watcher"
        said = self._launcher().get(pid) if self._launcher is not None else None
        if said:
            return said, f"pid {pid}, the launcher's report"
        return "died", (f"its process {pid} is gone without a Bye or an error: a signal such as SIGKILL, "
                        "or the kernel's OOM killer")

    def silent_s(self, rank: int) -> float:
        """Seconds since `rank`'s last message (inf: never heard)."""
        with self._lock:
            heard = self._heard.get(rank)
        return time.monotonic() - heard if heard is not None else float("inf")

    def locals_known(self) -> bool:
        with self._lock:
            return bool(self._local)

    def all_ended(self) -> bool:
        """Every rank of this node that said Hello has ended, and every other rank of the run has
        said Bye or been silent QUIET_S (its last words have had their chance to pass)."""
        now = time.monotonic()
        with self._lock:
            if not self._local or not all(s.ended for s in self._local.values()):
                return False
            return all(r in self._said_bye or r in self._local or now - t >= QUIET_S
                       for r, t in self._heard.items())
