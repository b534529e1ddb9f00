"""The per-rank telemetry sender on its own: real files, a real thread."""

from __future__ import annotations

import pytest

from ringtop.agent.transport import telemetry as telemetry_module
from ringtop.agent.transport.telemetry import Telemetry
from ringtop.protocol import Bye, Heartbeat, read_log


@pytest.mark.timeout(60)
def test_bye_is_the_last_line_even_when_a_heartbeat_is_due_at_close(tmp_path, monkeypatch):
    """A heartbeat decided just before close used to land after the Bye (seen once in CI)."""
    monkeypatch.setattr(telemetry_module, "HEARTBEAT_INTERVAL_S", 0.0)  # a beat is due on every turn
    for attempt in range(40):
        log_dir = tmp_path / str(attempt)
        sender = Telemetry(rank=0, relay_address=None, log_dir=str(log_dir))
        sender.step = 3
        for _ in range(5):
            sender.emit(Heartbeat(step=3))
        sender.close(Bye(reason="", ok=True))
        messages = list(read_log(log_dir / "rank-0.jsonl"))
        assert isinstance(messages[-1], Bye), f"attempt {attempt}: {type(messages[-1]).__name__} after the Bye"
        assert sum(isinstance(m, Bye) for m in messages) == 1


def test_nothing_is_emitted_after_the_bye(tmp_path):
    sender = Telemetry(rank=1, relay_address=None, log_dir=str(tmp_path))
    sender.close(Bye(reason="stopped", ok=True))
    sender.emit(Heartbeat(step=9))
    messages = list(read_log(tmp_path / "rank-1.jsonl"))
    assert [type(m) for m in messages] == [Bye]
    assert messages[0].rank == 1 and messages[0].reason == "stopped"


@pytest.mark.timeout(60)
def test_the_log_keeps_the_bye_when_the_socket_is_gone(tmp_path):
    """A rank stopped while it flushes: its ZeroMQ context is terminated under the telemetry thread
    (seen in CI: the launcher's SIGTERM, then the exit path's term). Sends fail; the log still ends
    with the Bye."""
    import zmq

    from ringtop.protocol import free_tcp_port

    ctx = zmq.Context()
    sender = Telemetry(rank=0, relay_address=f"tcp://127.0.0.1:{free_tcp_port()}", log_dir=str(tmp_path),
                       context=ctx)
    sender._subscribed = True  # as if the relay had subscribed: every message goes to the socket too
    sender.emit(Heartbeat(step=1))
    ctx.destroy(linger=0)  # closes the sender's socket under it
    sender.close(Bye(reason="interrupted: SIGTERM", ok=False))
    messages = list(read_log(tmp_path / "rank-0.jsonl"))
    assert isinstance(messages[-1], Bye) and messages[-1].reason == "interrupted: SIGTERM"
    assert sender.drops >= 1, "what the socket could not send is counted"
