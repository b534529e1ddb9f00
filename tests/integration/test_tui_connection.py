"""TelemetryClient over real ZeroMQ sockets on loopback."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from ringtop.protocol import UI_RANK, Command, Hello, Reply, Step, decode, encode, free_tcp_port
from ringtop.tui.sources.connection import TelemetryClient
from ringtop.tui.state.view_model import ControlReply


class Collector:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.messages: list = []
        self.rejected: list[str] = []
        self.batches = 0
        self.threads: set[str] = set()

    def __call__(self, messages, rejected) -> None:
        with self.lock:
            self.messages.extend(messages)
            self.rejected.extend(rejected)
            self.batches += 1
            self.threads.add(threading.current_thread().name)

    def wait(self, predicate, timeout=10.0, what="condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if predicate(self):
                    return
            time.sleep(0.01)
        raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def sockets():
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    pub_addr = f"tcp://127.0.0.1:{free_tcp_port()}"
    ctl_addr = f"tcp://127.0.0.1:{free_tcp_port()}"
    pub.bind(pub_addr)
    router.bind(ctl_addr)
    yield pub, router, pub_addr, ctl_addr
    pub.close()
    router.close()
    ctx.term()


@pytest.mark.timeout(60)
def test_receives_batches_rejects_garbage_and_sends_commands(sockets):
    pub, router, pub_addr, ctl_addr = sockets
    got = Collector()
    client = TelemetryClient(pub_addr, ctl_addr, got)
    client.start()
    try:
        hello = Hello(rank=0, seq=0, ts=1.0, run_id="r", world_size=1)
        # slow joiner: publish until the subscription is in place
        deadline = time.monotonic() + 10
        while not got.messages and time.monotonic() < deadline:
            pub.send_multipart([b"hello", encode(hello)])
            time.sleep(0.02)
        got.wait(lambda g: g.messages, what="first message")
        before = len(got.messages)
        # a single-frame message is the payload alone; then garbage and an odd multipart
        pub.send(encode(Step(rank=0, seq=1, ts=2.0, step=1, loss=1.0, step_ms=5.0)))
        pub.send_multipart([b"step", b"\xc1 not msgpack"])
        pub.send_multipart([b"a", b"b", b"c"])
        for i in range(500):
            pub.send_multipart([b"step", encode(Step(rank=0, seq=2 + i, ts=3.0, step=2 + i, loss=1.0, step_ms=5.0))])
        got.wait(lambda g: len(g.messages) >= before + 501 and len(g.rejected) >= 2, what="all frames")
        assert any(isinstance(m, Step) and m.step == 1 for m in got.messages)
        assert any("malformed" in r for r in got.rejected)
        assert any("3 frames" in r for r in got.rejected)
        assert got.threads == {"ringtop-telemetry"}
        assert got.batches < len(got.messages)  # batched, not one callback per message

        cmd_id = client.send_command("checkpoint", {"kind": "full"})
        assert router.poll(5000), "command never arrived"
        ident, payload = router.recv_multipart()
        cmd = decode(payload)
        assert isinstance(cmd, Command)
        assert (cmd.id, cmd.cmd, cmd.args, cmd.rank) == (cmd_id, "checkpoint", {"kind": "full"}, UI_RANK)
        router.send_multipart([ident, encode(Reply(rank=0, id=cmd_id, status="ack", cmd="checkpoint"))])
        router.send_multipart([ident, b"", encode(Reply(rank=0, id=cmd_id, status="done", cmd="checkpoint"))])
        router.send_multipart([ident, b"garbage"])
        router.send_multipart([ident, encode(hello)])  # not a reply: rejected on the control channel
        got.wait(lambda g: sum(isinstance(m, ControlReply) for m in g.messages) == 2, what="two replies")
        got.wait(lambda g: sum(r.startswith("control:") for r in g.rejected) == 2, what="bad replies rejected")
        assert [m.reply.status for m in got.messages if isinstance(m, ControlReply)] == ["ack", "done"]
        assert any("expected a reply" in r for r in got.rejected)
    finally:
        client.stop()
    assert not client.running


@pytest.mark.timeout(30)
def test_no_control_address_and_bad_address():
    got = Collector()
    client = TelemetryClient(f"tcp://127.0.0.1:{free_tcp_port()}", None, got)
    client.start()
    try:
        assert not client.has_control
        with pytest.raises(RuntimeError, match="no control address"):
            client.send_command("status")
    finally:
        client.stop()
    assert not client.running
    bad = TelemetryClient("not-an-address", None, got)
    with pytest.raises(zmq.ZMQError):
        bad.start()
    assert not bad.running


@pytest.mark.timeout(30)
def test_callback_errors_do_not_kill_the_thread(sockets):
    pub, _, pub_addr, _ = sockets
    calls = []

    def boom(messages, rejected):
        calls.append(len(messages))
        raise RuntimeError("UI is closing")

    client = TelemetryClient(pub_addr, None, boom)
    client.start()
    try:
        deadline = time.monotonic() + 10
        while len(calls) < 3 and time.monotonic() < deadline:
            pub.send(encode(Hello(rank=0, run_id="r", world_size=1)))
            time.sleep(0.03)
        assert len(calls) >= 3 and client.running and client.callback_errors >= 3
    finally:
        client.stop()
