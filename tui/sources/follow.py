"""Follow a run across its restarts: when its launcher starts every rank again, the new rank 0
writes the run's connection file again, with new keys (and maybe new ports). A UI that found the
run by its id looks at that file now and then and, once it names another live rank 0, attaches to
it; the view goes on, as the run keeps its id."""

from __future__ import annotations

import time

from ringtop.protocol import connection_file
from ringtop.protocol.connection_file import ConnectionFileError, ConnectionInfo

LOOK_EVERY_S = 1.0
"""A small private file: reading it once a second costs the UI nothing it would notice."""


class RunFollower:
    """`moved(now)`: the run's connection when it is not the one attached to (a new rank 0, alive),
    else None; looks at the file at most every LOOK_EVERY_S."""

    def __init__(self, current: ConnectionInfo) -> None:
        self.current = current
        self._looked_at = time.monotonic()

    def moved(self, now: float) -> ConnectionInfo | None:
        if now - self._looked_at < LOOK_EVERY_S:
            return None
        self._looked_at = now
        try:
            info = connection_file.read(connection_file.file_for(self.current.run_id))
        except ConnectionFileError:
            return None  # not written yet (the next attempt is starting), or not to be trusted
        if info.run_id != self.current.run_id or _same(info, self.current) or not connection_file.is_alive(info.pid):
            return None
        self.current = info
        return info


def _same(a: ConnectionInfo, b: ConnectionInfo) -> bool:
    return (a.pid, a.host, a.publish, a.control, a.keys) == (b.pid, b.host, b.publish, b.control, b.keys)
