"""A rank of a node as its node relay sees one, for tests/integration/test_node_watcher.py: it
publishes its Hello (its own pid and start) and a step every 20 ms to ADDRESS with the keys read
as JSON from stdin, until it is killed; with STUCK_AT, at that step it sleeps in libc holding the
GIL (ctypes.PyDLL), as a rank stuck in native code does: no thread of it sends anything more.

    python fake_node_rank.py RANK WORLD_SIZE RUN_ID ADDRESS [STUCK_AT] < keys.json
"""

from __future__ import annotations

import ctypes
import socket
import sys
import time

import msgspec
import psutil

from ringtop.agent.transport.telemetry import Telemetry
from ringtop.protocol import Hello, Step
from ringtop.protocol.curve import ClientKeys


def main(rank: int, world_size: int, run_id: str, address: str, stuck_at: int = 0) -> None:
    keys = msgspec.json.decode(sys.stdin.buffer.read(), type=ClientKeys)
    telemetry = Telemetry(rank, address, None, keys=keys)
    telemetry.emit(Hello(run_id=run_id, world_size=world_size, host=socket.gethostname(), pid=psutil.Process().pid,
                         process_started_ts=psutil.Process().create_time()))
    step = 0
    while True:
        step += 1
        telemetry.step = step
        telemetry.emit(Step(step=step, loss=1.0, step_ms=20.0))
        time.sleep(0.02)
        if step == stuck_at:
            deadline = time.monotonic() + 10
            while telemetry.queued and time.monotonic() < deadline:  # its last step handed to ZeroMQ,
                time.sleep(0.01)  # whose own thread sends it while this one holds the GIL
            ctypes.PyDLL(None).sleep(600)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], *map(int, sys.argv[5:6]))
