"""`Head`: what rank 0 runs for the whole run besides training, built, started and stopped in one
place: the control server (with its operations log) and its gatekeeper, and the relay half
(agent/head/relay_services.py: the head relay, its observers, the connection file clients find
the run by), which by default runs in the node's watcher process (agent/watcher/), outside every
rank, so that the UIs keep their feed when a rank, rank 0 included, dies.

Built in three steps because the run's set-up needs them apart: `Head(...)` binds every socket
(the addresses actually bound, a taken default port moved, are then in `endpoints`, to be told to
the other ranks before anyone connects); `start()` starts the threads once rank 0's own
publisher exists; `stop_control()` then `stop()` let go, the control first so that its last
replies are published before rank 0's Bye, the relay after the Byes are through."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from ringtop.agent.alerts import AlertTargets
from ringtop.agent.control.capture import CaptureSettings
from ringtop.agent.control.channel import ControlServer
from ringtop.agent.head.relay_services import RelayServices
from ringtop.agent.health.hang_watch import EmitEvent
from ringtop.agent.transport.gatekeeper import REPORT_EVERY_S, Gatekeeper
from ringtop.protocol import Command, Endpoints, connection_file, curve
from ringtop.protocol.downlink import Downlink, encode_downlink

BYE_POLL_S = 0.02
BYE_POLL_WATCHER_S = 0.2
"""In the watcher each look is a call over its pipe: fewer of them."""


class Head:
    """Rank 0's services. `keys`: the run's (None: --insecure, plain sockets and a warning).
    `on_event(level, kind, text, data)`: what the services have to say (a verdict of the hang
    watch, refused connections), called from their own threads. `snapshot`, `publish_reply`,
    `immediate`, `on_stop`, `restate_operations`: the control server's (agent/control/channel.py);
    `stacks` is answered here unless `immediate` names its own. `movable`: which of "relay",
    "publish", "control" are defaults that move to a free port when taken. `metrics`: (host, port)
    of a Prometheus endpoint, or None. `carriers`: the ranks each node relay may carry.
    `watcher`: the relay half runs in the node's watcher process (agent/watcher/), given
    `attempt` and `on_watcher_lost`; else in this process (`relay` is then its Relay)."""

    def __init__(self, endpoints: Endpoints, *, run_id: str, world_size: int, keys: curve.RunKeys | None,
                 on_event: EmitEvent, snapshot: Callable[[], dict[str, Any]], publish_reply: Callable[[Any], None],
                 movable: Collection[str] = (), metrics: tuple[str, int] | None = None,
                 carriers: Mapping[str, Collection[int]] | None = None,
                 immediate: dict[str, Callable[[Command, Any], Any]] | None = None,
                 on_stop: Callable[[str], None] | None = None,
                 restate_operations: Callable[[dict[str, Any]], None] | None = None,
                 capture: CaptureSettings | None = None, alerts: AlertTargets | None = None,
                 log_dir: str = "", watcher: bool = False, attempt: int = 0,
                 on_watcher_lost: Callable[[str], None] | None = None) -> None:
        self.run_id, self.world_size, self.keys = run_id, world_size, keys
        self._on_event = on_event
        self.client_keys = keys.client if keys is not None else None
        self.connection_path: Path | None = None
        self.gate = Gatekeeper(keys, on_refusal=self._refused, printed=False) if keys is not None else None
        self.relay_side: Any = None
        """RelayServices here, or the WatcherLink standing for them in the watcher."""
        self.control: ControlServer | None = None
        self._control_stopped = self._stopped = False
        self._auth_said_at: float | None = None
        try:
            if watcher:
                self.relay_side = self._spawn_watcher(endpoints, world_size, keys, movable, metrics, carriers,
                                                      capture, alerts, log_dir, attempt, on_watcher_lost)
            else:
                self.relay_side = RelayServices(endpoints, run_id=run_id, world_size=world_size, keys=keys,
                                                on_event=on_event, movable=movable, metrics=metrics,
                                                carriers=carriers, capture=capture, inject=self._inject,
                                                alerts=alerts, log_dir=log_dir, gate=self.gate)
            self.control = ControlServer(endpoints.control, snapshot, publish_reply, gate=self.gate,
                                         movable="control" in movable, restate_operations=restate_operations,
                                         immediate={"stacks": self._command_stacks, **(immediate or {})},
                                         on_stop=on_stop)
        except BaseException:
            self.stop()
            raise
        self.endpoints = Endpoints(publish=self.relay_side.publish_address, relay=self.relay_side.relay_address,
                                   control=self.control.address)
        """The addresses actually bound (a taken default port moves to a free one)."""

    def _spawn_watcher(self, endpoints, world_size, keys, movable, metrics, carriers, capture, alerts, log_dir,
                       attempt, on_lost):
        from ringtop.agent.watcher.link import WatcherLink
        from ringtop.agent.watcher.wire import Setup

        capture = capture or CaptureSettings()
        alerts = alerts or AlertTargets()
        setup = Setup(endpoints=endpoints, run_id=self.run_id, world_size=world_size, keys=keys,
                      movable=sorted(set(movable) & {"relay", "publish"}), metrics=metrics,
                      carriers={k: list(v) for k, v in (carriers or {}).items()}, capture_on=list(capture.on),
                      capture_every_min=capture.every_min, capture_steps=capture.steps,
                      alert_webhook=alerts.webhook, alert_command=alerts.command,
                      alert_goodput=alerts.goodput_floor_pct, log_dir=log_dir, attempt=attempt)
        return WatcherLink.spawn(setup, self._from_watcher, self._inject, on_lost or (lambda why: None))

    def _from_watcher(self, level: str, kind: str, text: str, data: Any) -> None:
        if kind == "auth":
            self._refused(text, data.get("refused", 0) if isinstance(data, dict) else 0)
        else:
            self._on_event(level, kind, text, data)

    @property
    def relay(self):
        """The head relay when it runs in this process (None: it runs in the watcher)."""
        return getattr(self.relay_side, "relay", None)

    def lost_messages(self) -> int:
        return self.relay_side.gaps()

    @property
    def refused_connections(self) -> int:
        here = self.gate.refused if self.gate is not None else 0
        return here + (self.relay_side.refused() if self.relay_side is not None else 0)

    def _inject(self, cmd: str, args: dict[str, Any]) -> bool:
        return self.control is not None and self.control.inject(cmd, args)

    def start(self) -> None:
        """The threads, in the order they depend on each other; --insecure said loudly."""
        if self.gate is not None:
            self.gate.start()
        self.relay_side.start()
        self.control.start()
        if self.gate is None:
            ep = self.endpoints
            text = (f"--insecure: no authentication. Anyone who can reach {ep.publish} or {ep.control} can read "
                    "this run's telemetry and stop, checkpoint or switch it")
            print(f"ringtop [rank 0]: WARNING: {text}", file=sys.stderr, flush=True)
            self._on_event("warn", "insecure", text, {})

    def write_connection_file(self, log_dir: str = "", checkpoint_dir: str = "") -> connection_file.ConnectionInfo:
        """How this user's `ringtop ui`, `ctl` and `ls` find the run (protocol/connection_file.py),
        written by the process that serves its telemetry (the watcher, which removes it however
        the run ends). Raises OSError or ConnectionFileError where it cannot be written."""
        ep = self.endpoints
        info = connection_file.ConnectionInfo(
            run_id=self.run_id, pid=os.getpid(), host=socket.gethostname(), publish=ep.publish, control=ep.control,
            relay=ep.relay, world_size=self.world_size, started_ts=time.time(), log_dir=log_dir,
            checkpoint_dir=checkpoint_dir, keys=self.client_keys)
        self.connection_path = Path(self.relay_side.write_connection_file(info))
        return info

    def publish_connection_file(self, log_dir: str = "", checkpoint_dir: str = "") -> None:
        """`write_connection_file` where a file that cannot be written costs only that: the run
        goes on, and says so."""
        try:
            self.write_connection_file(log_dir, checkpoint_dir)
        except (OSError, connection_file.ConnectionFileError) as exc:
            print(f"ringtop agent [rank 0]: no connection file written ({exc}); clients need --connect",
                  file=sys.stderr)

    def remove_connection_file(self) -> None:
        if self.connection_path is not None:
            self.relay_side.remove_connection_file(str(self.connection_path))
            self.connection_path = None

    def send_down(self, message: Downlink) -> None:
        """To every rank's telemetry thread, through the relay (from any thread)."""
        self.relay_side.send_down(encode_downlink(message))

    def await_byes(self, ranks: Collection[int], timeout_s: float) -> bool:
        """Until the Byes of `ranks` came through the relay, or `timeout_s`; True: they all did."""
        wanted = set(ranks)
        deadline = time.monotonic() + timeout_s
        poll_s = BYE_POLL_S if isinstance(self.relay_side, RelayServices) else BYE_POLL_WATCHER_S
        while not wanted <= self.relay_side.said_bye():
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        return True

    def stop_control(self) -> None:
        """The connection file and the control server: its last replies are published before the Bye."""
        self.remove_connection_file()
        if self.control is not None and not self._control_stopped:
            self._control_stopped = True
            self.control.stop()

    def stop(self, relay_drain_s: float = 2.0) -> None:
        """Everything else: the relay half (after the Byes are in; the watcher drains and ends),
        then the gatekeeper, whose context ends the servers' sockets: never under a relay still
        running here."""
        self.stop_control()
        if self._stopped:
            return
        self._stopped = True
        side = self.relay_side
        if side is not None:
            side.stop(relay_drain_s)
        relay = self.relay
        if self.gate is not None and not (relay is not None and relay.is_alive()):
            self.gate.stop()

    def _refused(self, text: str, refused: int) -> None:
        """A gatekeeper's (rate-limited) report of connections it refused: rank 0's and the
        watcher's, together at most once a minute (the counts are in `status` either way), on
        stderr and as an event."""
        now = time.monotonic()
        if self._auth_said_at is not None and now - self._auth_said_at < REPORT_EVERY_S:
            return
        self._auth_said_at = now
        print(f"ringtop [rank 0]: {text}", file=sys.stderr, flush=True)
        self._on_event("warn", "auth", text, {"refused": refused})

    def _command_stacks(self, command: Command, args: Any) -> Callable[[float], dict[str, Any] | None]:
        """On the control thread: ask every rank's telemetry thread for its stack."""
        return self.relay_side.open_stacks(command.id, args.timeout_s)
