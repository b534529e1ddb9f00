"""`Head`: what rank 0 runs for the whole run besides training, built, started and stopped in one
place. The head relay (with its step digests and its observers: the hang watch, the stack
requests, the Prometheus exporter), the control server (with its operations log), the
gatekeeper that authenticates both, and the connection file clients find the run by.

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

from ringtop.agent.alerts import Alerts, AlertTargets
from ringtop.agent.control.capture import CaptureSettings, CaptureTrigger
from ringtop.agent.control.channel import ControlServer
from ringtop.agent.control.stacks import StackRequests
from ringtop.agent.health.hang_watch import EmitEvent, HangWatch
from ringtop.agent.transport.gatekeeper import Gatekeeper
from ringtop.agent.transport.relay import Relay
from ringtop.protocol import Command, Endpoints, connection_file, curve
from ringtop.protocol.downlink import Downlink, encode_downlink

BYE_POLL_S = 0.02
ALERTS_DRAIN_S = 3.0
"""At the run's end, how long the alerts' thread may take to send what is queued."""


class Head:
    """Rank 0's services. `keys`: the run's (None: --insecure, plain sockets and a warning).
    `on_event(level, kind, text, data)`: what the services have to say (a verdict of the hang
    watch, refused connections), called from their own threads. `snapshot`, `publish_reply`,
    `immediate`, `on_stop`, `restate_operations`: the control server's (agent/control/channel.py);
    `stacks` is answered here unless `immediate` names its own. `movable`: which of "relay",
    "publish", "control" are defaults that move to a free port when taken. `metrics`: (host, port)
    of a Prometheus endpoint, or None. `carriers`: the ranks each node relay may carry."""

    def __init__(self, endpoints: Endpoints, *, run_id: str, world_size: int, keys: curve.RunKeys | None,
                 on_event: EmitEvent, snapshot: Callable[[], dict[str, Any]], publish_reply: Callable[[Any], None],
                 movable: Collection[str] = (), metrics: tuple[str, int] | None = None,
                 carriers: Mapping[str, Collection[int]] | None = None,
                 immediate: dict[str, Callable[[Command, Any], Any]] | None = None,
                 on_stop: Callable[[str], None] | None = None,
                 restate_operations: Callable[[dict[str, Any]], None] | None = None,
                 capture: CaptureSettings | None = None, alerts: AlertTargets | None = None,
                 log_dir: str = "") -> None:
        self.run_id, self.world_size, self.keys = run_id, world_size, keys
        self._on_event = on_event
        self.client_keys = keys.client if keys is not None else None
        self.connection_path: Path | None = None
        self.gate = Gatekeeper(keys, on_refusal=self._refused) if keys is not None else None
        self.hang_watch = HangWatch(world_size, on_event)
        self.stack_requests = StackRequests(world_size)
        observers = [self.hang_watch.observe, self.stack_requests.observe]
        self.exporter = None
        """The Prometheus endpoint (--metrics), fed as a relay observer."""
        if metrics is not None:
            from ringtop.agent.prometheus.exporter import MetricsExporter  # prometheus_client: only with --metrics

            self.exporter = MetricsExporter(*metrics)
            observers.append(self.exporter.observe)
        self.relay: Relay | None = None
        self.control: ControlServer | None = None
        self.capture: CaptureTrigger | None = None
        """--capture-on: profiles the suspects of a verdict (agent/control/capture.py), a relay observer."""
        self.alerts: Alerts | None = None
        """--alert-webhook / --alert-command (agent/alerts.py), a relay observer with a thread of its own."""
        self._control_stopped = self._stopped = False
        try:
            self.relay = Relay(endpoints.relay, endpoints.publish, run_id=run_id, world_size=world_size,
                               gate=self.gate, movable=movable, observers=observers, carriers=carriers)
            self.control = ControlServer(endpoints.control, snapshot, publish_reply, gate=self.gate,
                                         movable="control" in movable, restate_operations=restate_operations,
                                         immediate={"stacks": self._command_stacks, **(immediate or {})},
                                         on_stop=on_stop)
        except BaseException:
            self.stop()
            raise
        self.endpoints = Endpoints(publish=self.relay.publish_address, relay=self.relay.relay_address,
                                   control=self.control.address)
        if capture is not None and capture.on:
            self.capture = CaptureTrigger(capture, world_size, self.control.inject,
                                          say=lambda level, kind, text, data: on_event(level, kind, text, data))
            self.relay.observers.append(self.capture.observe)
        if alerts is not None and alerts.any:
            self.alerts = Alerts(alerts, run_id, log_dir, say=lambda level, kind, text: on_event(level, kind, text, {}))
            self.relay.observers.append(self.alerts.observe)
        """The addresses actually bound (a taken default port moves to a free one)."""

    @property
    def refused_connections(self) -> int:
        return self.gate.refused if self.gate is not None else 0

    def start(self) -> None:
        """The threads, in the order they depend on each other; --insecure said loudly."""
        if self.gate is not None:
            self.gate.start()
        if self.alerts is not None:
            self.alerts.start()
        self.relay.start()
        self.control.start()
        if self.exporter is not None:
            self.exporter.start()
        if self.gate is None:
            ep = self.endpoints
            text = (f"--insecure: no authentication. Anyone who can reach {ep.publish} or {ep.control} can read "
                    "this run's telemetry and stop, checkpoint or switch it")
            print(f"ringtop [rank 0]: WARNING: {text}", file=sys.stderr, flush=True)
            self._on_event("warn", "insecure", text, {})

    def write_connection_file(self, log_dir: str = "", checkpoint_dir: str = "") -> connection_file.ConnectionInfo:
        """How this user's `ringtop ui`, `ctl` and `ls` find the run (protocol/connection_file.py).
        Raises OSError or ConnectionFileError where it cannot be written."""
        ep = self.endpoints
        info = connection_file.ConnectionInfo(
            run_id=self.run_id, pid=os.getpid(), host=socket.gethostname(), publish=ep.publish, control=ep.control,
            relay=ep.relay, world_size=self.world_size, started_ts=time.time(), log_dir=log_dir,
            checkpoint_dir=checkpoint_dir, keys=self.client_keys)
        self.connection_path = connection_file.write(info)
        return info

    def remove_connection_file(self) -> None:
        if self.connection_path is not None:
            connection_file.remove(self.connection_path)
            self.connection_path = None

    def send_down(self, message: Downlink) -> None:
        """To every rank's telemetry thread, through the relay (from any thread)."""
        self.relay.send_down(encode_downlink(message))

    def await_byes(self, ranks: Collection[int], timeout_s: float) -> bool:
        """Until the Byes of `ranks` came through the relay, or `timeout_s`; True: they all did."""
        wanted = set(ranks)
        deadline = time.monotonic() + timeout_s
        while not wanted <= self.hang_watch.said_bye:
            if time.monotonic() >= deadline:
                return False
            time.sleep(BYE_POLL_S)
        return True

    def stop_control(self) -> None:
        """The connection file and the control server: its last replies are published before the Bye."""
        self.remove_connection_file()
        if self.control is not None and not self._control_stopped:
            self._control_stopped = True
            self.control.stop()

    def stop(self, relay_drain_s: float = 2.0) -> None:
        """Everything else: the relay (after the Byes are in), then the exporter, then the
        gatekeeper, whose context ends the servers' sockets: never under a relay still running."""
        self.stop_control()
        if self._stopped:
            return
        self._stopped = True
        if self.relay is not None:
            self.relay.stop(relay_drain_s)
        if self.exporter is not None:
            self.exporter.stop()  # no thread or port outlives the run
        if self.alerts is not None:
            self.alerts.stop(timeout_s=ALERTS_DRAIN_S)  # the run's last resolutions, within a bound
        if self.gate is not None and not (self.relay is not None and self.relay.is_alive()):
            self.gate.stop()

    def _refused(self, text: str, refused: int) -> None:
        """The gatekeeper's (rate-limited) report of connections it refused."""
        self._on_event("warn", "auth", text, {"refused": refused})

    def _command_stacks(self, command: Command, args: Any) -> Callable[[float], dict[str, Any] | None]:
        """On the control thread: ask every rank's telemetry thread for its stack."""
        request = self.stack_requests.open(command.id, args.timeout_s)
        self.send_down(Downlink(action="stacks", id=command.id))

        def answer(now: float) -> dict[str, Any] | None:
            result = request.poll(now)
            if result is not None:
                self.stack_requests.close(command.id)
            return result
        return answer
