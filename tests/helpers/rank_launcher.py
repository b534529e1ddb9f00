"""The suite's launcher of gloo ranks on one node: `python rank_launcher.py NPROC CMD...`.

It does for a test what `torchrun --standalone --nproc_per_node=NPROC` does for the rank side of
a run, without torchrun's own process importing torch and running an elastic agent (about 1.5 s
of a 2-core machine per launch, a hundred launches a suite). The ranks get torchrun's variables
(RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT), each in a
session of its own as torchrun starts them; a stop signal to the launcher goes on to every rank;
a rank that fails stops the others (SIGTERM, then SIGKILL after GRACE_S), and the launcher exits
with 1, naming the rank, as torchrun does. Tests of torchrun itself (its rendezvous, its report)
launch it directly.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from ringtop.agent.lifecycle import exit_with_parent

GRACE_S = 30.0
"""As torchrun: how long the other ranks get to stop after one failed, or after a stop signal."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(ranks: list[subprocess.Popen], sig: int) -> None:
    for p in ranks:
        if p.poll() is None:
            try:
                p.send_signal(sig)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + GRACE_S
    for p in ranks:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in ranks:
        if p.poll() is None:
            p.kill()
            p.wait()


class _Stopped(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_stopped(signum, frame):
    raise _Stopped(signum)


def _ignore_stops() -> None:
    """The ranks are being stopped (or have ended): one stop at a time."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


def _rank_env(rank: int, nproc: int, port: int, base: dict[str, str]) -> dict[str, str]:
    return dict(base, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit() or int(argv[0]) < 1:
        print("usage: rank_launcher.py NPROC CMD...", file=sys.stderr)
        return 2
    nproc, cmd = int(argv[0]), argv[1:]
    port = _free_port()
    ranks: list = []
    for rank in range(nproc):
        env = _rank_env(rank, nproc, port, dict(os.environ))
        ranks.append(subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=exit_with_parent))
    by_pid = {p.pid: (rank, p) for rank, p in enumerate(ranks)}
    failed: tuple[int, int] | None = None
    try:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, _raise_stopped)  # out of the blocking wait below
        while by_pid and failed is None:
            pid, status = os.wait()  # the next rank to end
            rank, proc = by_pid.pop(pid, (None, None))
            if proc is None:
                continue
            proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
            if proc.returncode != 0:
                failed = (rank, proc.returncode)
    except _Stopped as stop:
        _ignore_stops()
        _stop(ranks, stop.signum)
        return 128 + stop.signum
    _ignore_stops()
    if failed is not None:
        _stop(ranks, signal.SIGTERM)
        rank, code = failed
        print(f"rank_launcher: rank {rank} (pid {ranks[rank].pid}) exited with {code}; the others were stopped",
              file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
