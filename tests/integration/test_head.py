"""Rank 0's services as one object (agent/head): real sockets, the run's real keys, a real client.
Started in one place, answering `status` through the control server, seeing a rank's Bye through
the relay, and stopped in one place: threads ended, connection file gone, ports free again, also
when its set-up fails half-way."""

from __future__ import annotations

import socket
import threading

import pytest
import zmq
from conftest import poll_until

from ringtop.agent.head import Head
from ringtop.agent.transport.ports import BindError
from ringtop.agent.transport.telemetry import Telemetry
from ringtop.cli.ctl import send_command
from ringtop.protocol import Bye, Endpoints, connection_file, curve, free_tcp_ports


def endpoints(ports: list[int]) -> Endpoints:
    publish, relay, control = (f"tcp://127.0.0.1:{p}" for p in ports)
    return Endpoints(publish=publish, relay=relay, control=control)


def can_bind(address: str) -> bool:
    """Whether a listener could bind `address` now. A plain socket, closed before this returns: a
    zmq socket's close is finished later by its I/O thread, so a zmq probe would itself hold the
    port for a moment after saying it is free (the retry below then failed on it, in CI)."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as zmq's own listeners do
        try:
            sock.bind((host, int(port)))
            return True
        except OSError:
            return False


def ringtop_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("ringtop-") and t.is_alive()}


@pytest.mark.timeout(60)
def test_the_head_starts_answers_sees_a_bye_and_lets_everything_go():
    keys = curve.generate(world_size=1)
    events: list[tuple[str, str]] = []
    before = ringtop_threads()
    head = Head(endpoints(free_tcp_ports(3)), run_id="headtest", world_size=1, keys=keys,
                on_event=lambda level, kind, text, data: events.append((level, kind)),
                snapshot=lambda: {"run_id": "headtest", "step": 7}, publish_reply=lambda reply: None)
    telemetry = None
    try:
        head.start()
        info = head.write_connection_file(log_dir="logs")
        assert connection_file.read(head.connection_path).control == head.endpoints.control == info.control
        replies = list(send_command(head.endpoints.control, "status", {}, timeout_s=10, keys=head.client_keys))
        assert replies[-1].status == "done" and replies[-1].result["step"] == 7
        assert not head.await_byes([0], 0.1), "no Bye yet"
        telemetry = Telemetry(0, head.endpoints.relay, None, keys=keys.for_rank(0))
        telemetry.emit(Bye(reason="done", ok=True, step=7))
        assert head.await_byes([0], 20), "rank 0's Bye came through the relay to the hang watch"
    finally:
        if telemetry is not None:
            telemetry.close()
        path = head.connection_path
        head.stop()
    assert path is not None and not path.exists(), "the connection file is removed"
    poll_until(lambda: ringtop_threads() <= before, 10, "the head's threads ended",
               detail=lambda: ringtop_threads() - before)
    for address in (head.endpoints.publish, head.endpoints.relay, head.endpoints.control):
        poll_until(lambda a=address: can_bind(a), 10, f"{address} free again")
    assert ("warn", "insecure") not in events, "an authenticated head does not warn"


@pytest.mark.timeout(60)
def test_a_head_whose_control_port_is_taken_fails_and_frees_the_relay_it_had_bound():
    """The check bites: the relay's ports stay bound (and a retry fails) unless the half-built
    head closes the sockets of a relay it never started."""
    ep = endpoints(free_tcp_ports(3))
    holder = zmq.Context.instance().socket(zmq.ROUTER)
    holder.setsockopt(zmq.LINGER, 0)
    holder.bind(ep.control)
    try:
        with pytest.raises(BindError, match="--control"):
            Head(ep, run_id="headtest", world_size=1, keys=curve.generate(world_size=1),
                 on_event=lambda *a: None, snapshot=dict, publish_reply=lambda reply: None)
    finally:
        holder.close()
    poll_until(lambda: can_bind(ep.relay) and can_bind(ep.publish), 10, "the relay's ports free again")
    poll_until(lambda: can_bind(ep.control), 10, "the holder's close finished")
    head = Head(ep, run_id="headtest", world_size=1, keys=None, on_event=lambda *a: None, snapshot=dict,
                publish_reply=lambda reply: None)
    head.stop()  # never started: let go all the same
    poll_until(lambda: can_bind(ep.control), 10, "the control port free again")


@pytest.mark.timeout(60)
def test_a_connection_file_that_cannot_be_written_costs_only_that(tmp_path, monkeypatch, capsys):
    """A runtime folder others can write is refused: the head says so and serves on."""
    unsafe = tmp_path / "runtime"
    unsafe.mkdir()
    unsafe.chmod(0o777)
    monkeypatch.setenv(connection_file.RUNTIME_ENV, str(unsafe))
    head = Head(endpoints(free_tcp_ports(3)), run_id="nofile", world_size=1, keys=curve.generate(world_size=1),
                on_event=lambda *e: None, snapshot=lambda: {"run_id": "nofile"}, publish_reply=lambda reply: None)
    try:
        head.start()
        head.publish_connection_file()
        assert head.connection_path is None and not list(unsafe.iterdir())
        assert "no connection file written" in capsys.readouterr().err and head.relay.is_alive()
    finally:
        head.stop()
