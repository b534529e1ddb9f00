"""Rank 0's end of its node's watcher: starts the process, hands it the relay half of rank 0's
services (agent/head/relay_services.py), then asks it what those services alone know (stacks, who
said Bye, lost messages) and sends its verdicts on as rank 0's events while rank 0 lives.

Nothing here runs on the training thread's step path: calls come from the control thread and the
run's set-up and end, each bounded by a timeout, and the watcher's words come on a thread of
their own."""

from __future__ import annotations

import itertools
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ringtop.agent.transport.ports import BindError
from ringtop.agent.watcher.wire import (
    Answer,
    Call,
    Inject,
    LinkClosed,
    Ready,
    Say,
    Setup,
    read_from_watcher,
    write_frame,
)
from ringtop.protocol.connection_file import ConnectionInfo

READY_TIMEOUT_S = 30.0
"""From the watcher's start to its sockets bound: a Python start and two binds (~0.3 s here)."""
CALL_TIMEOUT_S = 5.0

OnSay = Callable[[str, str, str, Any], None]


class WatcherGone(RuntimeError):
    pass


class WatcherLink:
    """`spawn` it; then it stands where the in-process RelayServices would (agent/head)."""

    def __init__(self, proc: subprocess.Popen, ready: Ready, on_say: OnSay | None,
                 inject: Callable[[str, dict[str, Any]], bool] | None, on_lost: Callable[[str], None]) -> None:
        self.proc = proc
        self.publish_address, self.relay_address = ready.publish, ready.relay
        self.server_public = ready.server_public
        """A node watcher's relay's public key."""
        self.on_event: Callable[[str, str, dict], None] | None = None
        """A node watcher's relay events (level, text, data), when `on_say` is None."""
        self._on_say, self._inject, self._on_lost = on_say, inject, on_lost
        self._ids = itertools.count(1)
        self._answers: dict[int, Any] = {}
        self._cond = threading.Condition()
        self._write_lock = threading.Lock()
        self.closed = False
        self._stopping = False
        self._reader = threading.Thread(target=self._read_loop, name="ringtop-watcher-link", daemon=True)
        self._reader.start()

    @classmethod
    def spawn(cls, setup: Setup, on_say: OnSay | None, inject: Callable[[str, dict[str, Any]], bool] | None,
              on_lost: Callable[[str], None]) -> WatcherLink:
        """The watcher started and its sockets bound, or BindError (as rank 0's own bind would
        raise) or WatcherGone. Its own session: a Ctrl-C meant for the ranks does not end it
        before it has told what became of them; it ends itself once they are gone."""
        proc = subprocess.Popen([sys.executable, "-m", "ringtop.agent.watcher"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, start_new_session=True, close_fds=True)
        try:
            write_frame(proc.stdin.fileno(), setup)
            ready = _await_ready(proc)
        except BaseException:
            _end(proc)
            raise
        if ready.error:
            _end(proc)
            raise BindError(ready.error)
        return cls(proc, ready, on_say, inject, on_lost)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def call(self, op: str, timeout_s: float = CALL_TIMEOUT_S, **fields: Any) -> Any:
        """The watcher's answer, or None: it did not answer in time, or it is gone."""
        if self.closed:
            return None
        call_id = next(self._ids)
        try:
            with self._write_lock:
                write_frame(self.proc.stdin.fileno(), Call(id=call_id, op=op, **fields))
        except (OSError, ValueError):
            self._lost("its pipe is closed")
            return None
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while call_id not in self._answers:
                left = deadline - time.monotonic()
                if left <= 0 or self.closed:
                    return None
                self._cond.wait(left)
            return self._answers.pop(call_id)

    # What the head asks of its relay half (agent/head/services.py), answered by the watcher.

    def send_down(self, frame: bytes) -> None:
        self.call("down", frame=frame)

    def state(self) -> dict[str, Any]:
        got = self.call("state")
        return got if isinstance(got, dict) else {}

    def said_bye(self) -> set[int]:
        return {r for r in self.state().get("said_bye", ()) if isinstance(r, int)}

    def gaps(self) -> int:
        return int(self.state().get("gaps", 0) or 0)

    def refused(self) -> int:
        """Connections the watcher's gatekeeper refused."""
        return int(self.state().get("refused", 0) or 0)

    def open_stacks(self, request_id: str, timeout_s: float) -> Callable[[float], dict[str, Any] | None]:
        self.call("stacks_open", text=request_id, number=timeout_s)
        deadline = time.monotonic() + timeout_s + 2.0

        def answer(now: float) -> dict[str, Any] | None:
            got = self.call("stacks_poll", text=request_id)
            if isinstance(got, dict):
                return got
            if self.closed or time.monotonic() > deadline:
                return {"error": "the node's watcher did not answer", "ranks": {}}
            return None
        return answer

    def write_connection_file(self, info: ConnectionInfo) -> str:
        """Its path, written by the watcher under the watcher's pid (raises OSError)."""
        got = self.call("connection_write", info=info)
        if not isinstance(got, str) or not got or got.startswith("error: "):
            raise OSError(got.removeprefix("error: ") if isinstance(got, str) and got else
                          "the node's watcher did not answer")
        info.pid = self.pid
        return got

    def remove_connection_file(self, path: str) -> None:
        self.call("connection_remove")

    def start(self) -> None:
        """Started at `spawn`: its threads run in the watcher."""

    def stop(self, relay_drain_s: float = 2.0) -> None:
        """The watcher drains its relay and ends; waited for, within a bound, so that under a
        clean end no process outlives the run's last rank by more than that."""
        self._stopping = True
        self.call("stop", number=relay_drain_s, timeout_s=relay_drain_s + CALL_TIMEOUT_S)
        try:
            self.proc.wait(timeout=relay_drain_s + CALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _end(self.proc)
        self._close_pipes()

    @property
    def address(self) -> str:
        """A node watcher's relay input, where its node's ranks publish."""
        return self.relay_address

    def kill(self) -> None:
        """--inject-node-relay-death: the node watcher's relay ends as if it had died (the watcher
        starts it again)."""
        self.call("kill_relay")

    def _read_loop(self) -> None:
        fd = self.proc.stdout.fileno()
        while True:
            try:
                msg = read_from_watcher(fd)
            except (LinkClosed, OSError) as exc:
                self._lost(str(exc))
                return
            try:
                if isinstance(msg, Answer):
                    with self._cond:
                        self._answers[msg.id] = msg.value
                        if len(self._answers) > 1024:  # answers nobody waits for any more
                            self._answers.pop(next(iter(self._answers)))
                        self._cond.notify_all()
                elif isinstance(msg, Say) and self._on_say is not None:
                    self._on_say(msg.level, msg.kind, msg.text, msg.hang if msg.hang is not None else msg.data)
                elif isinstance(msg, Say) and self.on_event is not None:
                    self.on_event(msg.level, msg.text, msg.data)
                elif isinstance(msg, Inject) and self._inject is not None:
                    self._inject(msg.cmd, msg.args)
            except Exception as exc:  # a bug in a handler must not end the link
                print(f"ringtop agent [rank 0]: the watcher's word was not handled: {exc!r}", file=sys.stderr)

    def _lost(self, why: str) -> None:
        with self._cond:
            if self.closed:
                return
            self.closed = True
            self._cond.notify_all()
        if not self._stopping:
            code = self.proc.poll()
            how = f"exit status {code}" if code is not None and code >= 0 else (
                f"killed by signal {-code}" if code is not None else why)
            self._on_lost(f"the node's watcher (pid {self.proc.pid}) is gone ({how})")

    def _close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


def _await_ready(proc: subprocess.Popen) -> Ready:
    fd = proc.stdout.fileno()
    readable, _, _ = select.select([fd], [], [], READY_TIMEOUT_S)
    if not readable:
        raise WatcherGone(f"the watcher (pid {proc.pid}) did not start in {READY_TIMEOUT_S:.0f} s")
    try:
        msg = read_from_watcher(fd)
    except (LinkClosed, OSError) as exc:
        raise WatcherGone(f"the watcher (pid {proc.pid}) ended at its start ({exc}); see its output above") from None
    if not isinstance(msg, Ready):
        raise WatcherGone(f"the watcher (pid {proc.pid}) said {type(msg).__name__} before it was ready")
    return msg


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    for pipe in (proc.stdin, proc.stdout):
        try:
            pipe.close()
        except OSError:
            pass
