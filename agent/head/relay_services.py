"""The relay half of rank 0's services: the head relay and what watches the messages it forwards
(the hang watch, the stack requests, the Prometheus exporter, a capture trigger, the alerts), with
the gatekeeper of its two sockets. Torch-free: it runs in the head node's watcher process
(agent/watcher/), outside every rank, so a rank's death, rank 0's included, leaves the UIs their
relay; `ringtop simulate` and `--no-watcher` run it inside rank 0's process instead."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from ringtop.agent.alerts import Alerts, AlertTargets
from ringtop.agent.control.capture import CaptureSettings, CaptureTrigger
from ringtop.agent.control.stacks import StackRequests
from ringtop.agent.health.hang_watch import EmitEvent, HangWatch
from ringtop.agent.transport.gatekeeper import Gatekeeper
from ringtop.agent.transport.relay import Relay
from ringtop.protocol import Endpoints, connection_file, curve

ALERTS_DRAIN_S = 3.0
"""At the run's end, how long the alerts' thread may take to send what is queued."""

Inject = Callable[[str, dict[str, Any]], bool]
"""Queue a command of the run's own on the control server (a capture on trigger)."""


class RelayServices:
    """Bound at construction (the addresses actually bound are in `publish_address` and
    `relay_address`), started by `start`, ended by `stop`. `on_event(level, kind, text, data)`:
    what they have to say, from their own threads. `inject`: the control server's, wherever it
    runs (None: no capture). `print_refusals`: the gatekeeper's reports on stderr too (not in
    the watcher, whose reports rank 0 prints)."""

    def __init__(self, endpoints: Endpoints, *, run_id: str, world_size: int, keys: curve.RunKeys | None,
                 on_event: EmitEvent, movable: Collection[str] = (), metrics: tuple[str, int] | None = None,
                 carriers: Mapping[str, Collection[int]] | None = None, capture: CaptureSettings | None = None,
                 inject: Inject | None = None, alerts: AlertTargets | None = None, log_dir: str = "",
                 gate: Gatekeeper | None = None, print_refusals: bool = True) -> None:
        self._on_event = on_event
        self.gate = gate
        self._own_gate = gate is None and keys is not None
        if self._own_gate:
            self.gate = Gatekeeper(keys, on_refusal=self._refused, printed=print_refusals)
        self.hang_watch = HangWatch(world_size, on_event)
        self.stack_requests = StackRequests(world_size)
        observers = [self.hang_watch.observe, self.stack_requests.observe]
        self.exporter = None
        """The Prometheus endpoint (--metrics), fed as a relay observer."""
        if metrics is not None:
            from ringtop.agent.prometheus.exporter import MetricsExporter  # prometheus_client: only with --metrics

            self.exporter = MetricsExporter(*metrics)
            observers.append(self.exporter.observe)
        self.capture: CaptureTrigger | None = None
        """--capture-on: profiles the suspects of a verdict (agent/control/capture.py)."""
        self.alerts: Alerts | None = None
        """--alert-webhook / --alert-command (agent/alerts.py), with a thread of its own."""
        self._stopped = False
        self.relay: Relay | None = None
        try:
            self.relay = Relay(endpoints.relay, endpoints.publish, run_id=run_id, world_size=world_size,
                               gate=self.gate, movable=movable, observers=observers, carriers=carriers)
        except BaseException:
            self._stop_gate()
            raise
        if capture is not None and capture.on and inject is not None:
            self.capture = CaptureTrigger(capture, world_size, inject,
                                          say=lambda level, kind, text, data: on_event(level, kind, text, data))
            self.relay.observers.append(self.capture.observe)
        if alerts is not None and alerts.any:
            self.alerts = Alerts(alerts, run_id, log_dir, say=lambda level, kind, text: on_event(level, kind, text, {}))
            self.relay.observers.append(self.alerts.observe)

    @property
    def publish_address(self) -> str:
        return self.relay.publish_address

    @property
    def relay_address(self) -> str:
        return self.relay.relay_address

    # What the head asks of its relay half, here or in the watcher (agent/watcher/link.py: the same).

    def refused(self) -> int:
        """Connections its own gatekeeper refused (0 where it shares the head's)."""
        return self.gate.refused if self.gate is not None and self._own_gate else 0

    def gaps(self) -> int:
        return self.relay.gaps

    def said_bye(self) -> set[int]:
        return set(self.hang_watch.said_bye)

    def send_down(self, frame: bytes) -> None:
        self.relay.send_down(frame)

    def write_connection_file(self, info: connection_file.ConnectionInfo) -> str:
        """Its path (raises OSError or ConnectionFileError)."""
        return str(connection_file.write(info))

    def remove_connection_file(self, path: str) -> None:
        connection_file.remove(Path(path))

    def start(self) -> None:
        if self._own_gate:
            self.gate.start()
        if self.alerts is not None:
            self.alerts.start()
        self.relay.start()
        if self.exporter is not None:
            self.exporter.start()

    def stop(self, relay_drain_s: float = 2.0) -> None:
        """The relay (after the Byes are in), then the exporter, then the gatekeeper, whose context
        ends the relay's sockets: never under a relay still running."""
        if self._stopped:
            return
        self._stopped = True
        if self.relay is not None:
            self.relay.stop(relay_drain_s)
        if self.exporter is not None:
            self.exporter.stop()  # no thread or port outlives the run
        if self.alerts is not None:
            self.alerts.stop(timeout_s=ALERTS_DRAIN_S)  # the run's last resolutions, within a bound
        if not (self.relay is not None and self.relay.is_alive()):
            self._stop_gate()

    def _stop_gate(self) -> None:
        if self._own_gate and self.gate is not None:
            self.gate.stop()

    def _refused(self, text: str, refused: int) -> None:
        """The gatekeeper's (rate-limited) report of connections it refused."""
        self._on_event("warn", "auth", text, {"refused": refused})

    def open_stacks(self, request_id: str, timeout_s: float) -> Callable[[float], dict[str, Any] | None]:
        """Ask every rank's telemetry thread for its stack; the poller answers once all have, or
        at the timeout."""
        from ringtop.protocol.downlink import Downlink, encode_downlink

        request = self.stack_requests.open(request_id, timeout_s)
        self.relay.send_down(encode_downlink(Downlink(action="stacks", id=request_id)))

        def answer(now: float) -> dict[str, Any] | None:
            result = request.poll(now)
            if result is not None:
                self.stack_requests.close(request_id)
            return result
        return answer
