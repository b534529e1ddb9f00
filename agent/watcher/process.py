"""The watcher: one process per node, outside every rank (`python -m ringtop.agent.watcher`,
started by the node's first rank: users change nothing under `ringtop run`, bare torchrun or
Slurm). On the head node it holds the head relay and its observers (agent/head/relay_services.py)
and the run's connection file, so a UI keeps its feed and everything up to the moment a rank,
rank 0 included, dies; on another node its node relay (node.py). On every node it names how each
rank of its node ended, or that a silent one is stuck, alive (agent/watcher/witness.py).

It reads its rank's calls on stdin until the pipe ends (that rank gone), and ends by itself once
every rank of its node has ended and its grace (`Setup.grace_s`, 3 s) has passed for the last
messages to reach the UIs, or when its rank stops it at a clean end. No process outlives its run
by more than that grace."""

from __future__ import annotations

import abc
import os
import queue
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ringtop.agent.alerts import AlertTargets
from ringtop.agent.control.capture import CaptureSettings
from ringtop.agent.head.relay_services import RelayServices
from ringtop.agent.transport.ports import BindError
from ringtop.agent.watcher.wire import (
    Answer,
    Call,
    Inject,
    LinkClosed,
    Ready,
    Say,
    Setup,
    read_to_watcher,
    write_frame,
)
from ringtop.agent.watcher.witness import LOOK_EVERY_S, Witness
from ringtop.metrics.rules.liveness import is_silent
from ringtop.protocol import UI_RANK, Event, HangReport, connection_file

ALONE_S = 10.0
"""Rank 0 gone and no rank of this node ever said Hello: the watcher ends after this long."""
SAY_QUEUE = 256
RESTART_BIND_SLACK_S = 5.0
"""Beyond its grace, how long a restarted attempt waits for the watcher before it to let go."""


class Watcher(abc.ABC):
    """What every watcher does: the link to its rank (a thread each way, never blocking the
    services), the witness, and the watch until its end. A role fills in its services."""

    leader = 0
    """The rank that started it and speaks for it while it lives."""

    def __init__(self, setup: Setup, out_fd: int) -> None:
        self.setup = setup
        self._out_fd = out_fd
        self._out: queue.Queue[Any] = queue.Queue(maxsize=SAY_QUEUE)
        self._link_open = True
        self._stop = threading.Event()
        self.witness = Witness(setup.log_dir)
        self._drain_s = setup.grace_s

    # ------------------------------------------------------------------ what a role fills in

    @abc.abstractmethod
    def start_services(self) -> Ready:
        """Started; the addresses for its rank (raises OSError where they cannot be had)."""

    @abc.abstractmethod
    def stop_services(self, drain_s: float) -> None:
        """Drained (at most `drain_s`) and ended."""

    @abc.abstractmethod
    def publish(self, msg: Any, keep: bytes | None = None) -> None:
        """Its own message (a RankExit, a RankLook), to the UIs."""

    def answer(self, call: Call) -> Any:
        return None

    def tend(self) -> None:  # noqa: B027 - a role may have nothing to tend
        """Once a look: what keeps the services going."""

    def removal(self) -> None:  # noqa: B027 - a role may have nothing to remove
        """At its end, before the services stop."""

    # ------------------------------------------------------------------ to its rank

    def _inject(self, cmd: str, args: dict[str, Any]) -> bool:
        return self._link_open and self._send(Inject(cmd=cmd, args=args))

    def _send(self, message: Any) -> bool:
        try:
            self._out.put_nowait(message)
        except queue.Full:
            return False
        return True

    def _write_loop(self) -> None:
        while True:
            message = self._out.get()
            if message is None:
                return
            try:
                write_frame(self._out_fd, message)
            except OSError:
                self._link_open = False
            except Exception as exc:  # a frame that does not encode is this one lost, not the link
                print(f"ringtop watcher: a word to rank {self.leader} was not sent: {exc!r}", file=sys.stderr,
                      flush=True)

    def _read_loop(self, in_fd: int) -> None:
        while not self._stop.is_set():
            try:
                call = read_to_watcher(in_fd)
            except (LinkClosed, OSError):
                break
            if isinstance(call, Call):
                self._send(Answer(id=call.id, value=self.answer(call)))
                if call.op == "stop":
                    self._drain_s = max(0.0, min(call.number, 30.0))
                    self._stop.set()
        self._link_open = False

    # ------------------------------------------------------------------ the watch

    def run(self, in_fd: int) -> int:
        """The services started: the watch, until its end."""
        writer = threading.Thread(target=self._write_loop, name="ringtop-watcher-out", daemon=True)
        writer.start()
        threading.Thread(target=self._read_loop, args=(in_fd,), name="ringtop-watcher-in", daemon=True).start()
        started = time.monotonic()
        ended_since: float | None = None
        try:
            while not self._stop.wait(LOOK_EVERY_S):
                for exit_ in self.witness.look():
                    self.publish(exit_, keep=f"exit.{exit_.of_rank}".encode())
                for stuck in self.witness.stuck():
                    self.publish(stuck)
                self.tend()
                if self.witness.all_ended() or (not self._link_open and not self.witness.locals_known()
                                                and time.monotonic() - started > ALONE_S):
                    ended_since = ended_since or time.monotonic()
                    if time.monotonic() - ended_since >= self.setup.grace_s:
                        break
                else:
                    ended_since = None
        finally:
            self.removal()
            self.stop_services(self._drain_s)
            self._out.put(None)
            writer.join(timeout=2.0)
        return 0


class HeadWatcher(Watcher):
    """The head node's: rank 0's relay half and the run's connection file."""

    def __init__(self, setup: Setup, out_fd: int) -> None:
        super().__init__(setup, out_fd)
        self._connection_path: Path | None = None
        self._stacks: dict[str, Any] = {}
        self.services = RelayServices(
            setup.endpoints, run_id=setup.run_id, world_size=setup.world_size, keys=setup.keys, on_event=self.say,
            movable=setup.movable, metrics=setup.metrics, carriers=setup.carriers,
            capture=CaptureSettings(tuple(setup.capture_on), setup.capture_every_min, setup.capture_steps),
            inject=self._inject, alerts=AlertTargets(setup.alert_webhook, setup.alert_command, setup.alert_goodput),
            log_dir=setup.log_dir, print_refusals=False)
        self.services.relay.observers.insert(0, self.witness.observe)

    def start_services(self) -> Ready:
        services = self.services
        if self.setup.attempt:
            from ringtop.agent.loop.previous_attempts import take_over

            take_over(services.relay, self.setup.log_dir, self.setup.attempt)
        try:
            services.start()
        except OSError:  # --metrics cannot listen (MetricsError): rank 0 says it and ends
            services.stop(0)
            raise
        return Ready(publish=services.publish_address, relay=services.relay_address)

    def stop_services(self, drain_s: float) -> None:
        self.services.stop(drain_s)

    def publish(self, msg: Any, keep: bytes | None = None) -> None:
        self.services.relay.publish_own(msg, keep)

    def say(self, level: str, kind: str, text: str, data: dict[str, Any] | HangReport) -> None:
        """From the services' threads: rank 0 sends it as its own event (its log keeps it) while
        the link is open and rank 0 is heard; once rank 0 is gone, or silent (stuck holding the
        GIL, its threads cannot send), the watcher publishes it itself. Never blocks."""
        hang = data if isinstance(data, HangReport) else None
        if self._link_open and not is_silent(self.witness.silent_s(0)):
            self._send(Say(level=level, kind=kind, text=text, data={} if hang else data, hang=hang))
            return
        self.publish(Event(rank=UI_RANK, ts=time.time(), level=level, kind=kind, text=text,
                           data={} if hang else data, hang=hang))

    def answer(self, call: Call) -> Any:
        services = self.services
        if call.op == "down":
            services.relay.send_down(call.frame)
        elif call.op == "state":
            return {"said_bye": sorted(services.said_bye()), "gaps": services.gaps(), "refused": services.refused()}
        elif call.op == "stacks_open":
            self._stacks[call.text] = services.open_stacks(call.text, call.number)
            while len(self._stacks) > 64:
                self._stacks.pop(next(iter(self._stacks)))
        elif call.op == "stacks_poll":
            poll = self._stacks.get(call.text)
            result = poll(time.monotonic()) if poll is not None else None
            if result is not None:
                self._stacks.pop(call.text, None)
            return result
        elif call.op == "connection_write" and call.info is not None:
            return self._write_connection(call.info)
        elif call.op in ("connection_remove", "stop"):
            self.removal()
        return None

    def _write_connection(self, info: connection_file.ConnectionInfo) -> str:
        info.pid, info.host = os.getpid(), socket.gethostname()  # the process that serves its addresses
        try:
            self._connection_path = connection_file.write(info)
        except (OSError, connection_file.ConnectionFileError) as exc:
            return f"error: {exc}"
        return str(self._connection_path)

    def removal(self) -> None:
        """The connection file, only while it is still this watcher's: a restarted attempt of the
        run writes its own under the same name, which an old watcher ending late must leave."""
        path, self._connection_path = self._connection_path, None
        if path is None:
            return
        try:
            mine = connection_file.read(path).pid == os.getpid()
        except (OSError, connection_file.ConnectionFileError):
            mine = False
        if mine:
            connection_file.remove(path)


def _head_watcher(setup: Setup, out_fd: int) -> HeadWatcher:
    """A restarted attempt's addresses may still be held by the attempt before's watcher, for its
    grace: those given (not movable) are tried again until it has gone."""
    deadline = time.monotonic() + (setup.grace_s + RESTART_BIND_SLACK_S if setup.attempt else 0.0)
    while True:
        try:
            return HeadWatcher(setup, out_fd)
        except BindError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.25)


def main() -> int:
    in_fd, out_fd = sys.stdin.fileno(), sys.stdout.fileno()
    sys.stdout = sys.stderr  # the pipe is the link's alone
    try:
        setup = read_to_watcher(in_fd)
    except (LinkClosed, OSError):
        return 2
    if not isinstance(setup, Setup):
        return 2
    try:
        if setup.role == "node":
            from ringtop.agent.watcher.node import NodeWatcher

            watcher: Watcher = NodeWatcher(setup, out_fd)
        else:
            watcher = _head_watcher(setup, out_fd)
        ready = watcher.start_services()
    except OSError as exc:  # a port taken (BindError), --metrics that cannot listen (MetricsError)
        write_frame(out_fd, Ready(error=str(exc)))
        return 1
    write_frame(out_fd, ready)
    return watcher.run(in_fd)
