"""Which peer is gone, when a collective fails.

A rank that dies mid-collective leaves the others with a backend error naming a socket address
("Connection closed by peer [127.0.0.1]:41234"), not a rank. Every rank learns, once at start,
each rank's host and pid; when a step fails, the ranks on the same host whose process has ended
are named in the error, the Bye and the logs.
"""

from __future__ import annotations

import os
import socket
import time
import zlib
from pathlib import Path

import torch
import torch.distributed as dist


def _host_id(name: str) -> int:
    return zlib.crc32(name.encode())


class Peers:
    def __init__(self, rank: int, pids: list[int], hosts: list[int]) -> None:
        self.rank = rank
        self.pids = pids
        self.hosts = hosts

    @classmethod
    def gather(cls, rank: int, world_size: int, group: dist.ProcessGroup | None) -> Peers:
        mine = torch.tensor([os.getpid(), _host_id(socket.gethostname())], dtype=torch.int64)
        if group is None:
            return cls(rank, [int(mine[0])], [int(mine[1])])
        everyone = [torch.empty(2, dtype=torch.int64) for _ in range(world_size)]
        dist.all_gather(everyone, mine, group=group)
        return cls(rank, [int(t[0]) for t in everyone], [int(t[1]) for t in everyone])

    def gone(self) -> list[int]:
        """Ranks on this host whose process has ended (or is a zombie its launcher has not reaped)."""
        here = self.hosts[self.rank]
        return [r for r, (pid, host) in enumerate(zip(self.pids, self.hosts))
                if r != self.rank and host == here and not _running(pid)]

    def explain(self, error: str, wait_s: float = 1.0, last_collective: str = "") -> str:
        """`error`, preceded by the peers that are gone, if any, and `last_collective` (the last
        one this rank issued, from its ledger). A peer's sockets close a moment before its process has
        ended: look again for up to `wait_s`."""
        deadline = time.monotonic() + wait_s
        while not (gone := self.gone()) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not gone:
            return error
        names = ", ".join(f"rank {r} (pid {self.pids[r]})" for r in gone)
        verb = "has" if len(gone) == 1 else "have"
        during = f"; rank {self.rank}'s last collective: {last_collective}" if last_collective else ""
        return f"{names} {verb} died{during}; {error}"


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        if Path("/proc/self/stat").exists():
            return False
        try:  # no /proc: alive or not, zombies included
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
