"""Everything received is hostile until validated: generated frames against every decoder and
against the live receive loops (control server, relay, UI receiver) over real ZeroMQ sockets.

Over 100k frames in all: no decoder raises anything but a ProtocolError, no loop dies, every
control frame is answered with a documented code, and after the storm the real thing still works.
"""

from __future__ import annotations

import random
import time

import msgspec
import pytest
import zmq
from background_socket import framed, relay_with_ranks, subscriber
from conftest import poll_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringtop.agent.control.channel import ControlServer
from ringtop.protocol import (
    Bye,
    Command,
    GoodputSoFar,
    Hello,
    ProtocolError,
    RankExit,
    RankLook,
    RecentSteps,
    Step,
    decode,
    encode,
    free_tcp_port,
    from_json_line,
)
from ringtop.protocol.curve import secure_client
from ringtop.protocol.messages import MESSAGE_TYPES
from ringtop.protocol.rate_limit import PeerLimiter
from ringtop.tui.sources.connection import TelemetryClient

pytestmark = pytest.mark.timeout(120)

DOCUMENTED_CODES = {"malformed", "oversize", "bad_version", "unknown_type", "invalid", "unknown_command",
                    "bad_arguments", "busy", "internal", "protocol_error"}
FIELD_NAMES = sorted({f for cls in MESSAGE_TYPES.values() for f in cls.__struct_fields__} | {"type", "v"})
def fast(examples: int) -> settings:
    """Many cheap examples, the same ones on every machine (derandomized), no example database."""
    return settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                    derandomize=True)

json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1) | st.floats(allow_nan=True)
    | st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
envelope_like = st.fixed_dictionaries(
    {"type": st.sampled_from(sorted(MESSAGE_TYPES)) | st.text(max_size=8), "v": st.sampled_from([1, 1, 0, 2, "1"])},
    optional={name: json_like for name in FIELD_NAMES[:40]},
) | st.dictionaries(st.sampled_from(FIELD_NAMES), json_like, max_size=8)


def decodes_or_refuses(data: bytes, decoder) -> None:
    try:
        decoder(data)
    except ProtocolError:
        pass


# ------------------------------------------------------------------ decoders (pure)


def random_value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth < 3 and r < 0.15:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if depth < 3 and r < 0.3:
        return {rng.choice(FIELD_NAMES): random_value(rng, depth + 1) for _ in range(rng.randrange(4))}
    return rng.choice([None, True, -1, 0, 1, 7, 1 << 40, -(1 << 63), (1 << 64) - 1, 0.5, -1e300, float("nan"),
                       float("inf"), "", "x", "\x1b[2J", "hello", "step", b"\xff", 1.0e18])


def random_map(rng: random.Random) -> dict:
    fields = {rng.choice(FIELD_NAMES): random_value(rng) for _ in range(rng.randrange(8))}
    if rng.random() < 0.8:
        fields["type"] = rng.choice(sorted(MESSAGE_TYPES))
    if rng.random() < 0.8:
        fields["v"] = rng.choice([1, 1, 1, 0, 2, "1"])
    return fields


def test_every_decoder_refuses_70k_generated_frames_cleanly():
    """Seeded, so every machine checks the same frames: random bytes, random maps over the real
    field names (MessagePack and JSON), and bit-flipped valid messages of every type."""
    rng = random.Random(2026)
    valid = [encode(m) for m in (Hello(run_id="r", world_size=2, host="h"), Step(step=1, loss=1.0, step_ms=2.0),
                                 Bye(reason="done"), Command(id="c", cmd="checkpoint", args={"kind": "full"}))]
    accepted = refused = 0
    for i in range(70_000):
        kind = i % 4
        if kind == 0:
            data = rng.randbytes(rng.randrange(0, 120))
        elif kind == 1:
            data = msgspec.msgpack.encode(random_map(rng))
        elif kind == 2:
            frame = bytearray(rng.choice(valid))
            for _ in range(rng.randrange(1, 4)):
                frame[rng.randrange(len(frame))] = rng.randrange(256)
            data = bytes(frame)
        else:
            try:
                data = msgspec.json.encode(random_map(rng))
            except (TypeError, OverflowError, msgspec.EncodeError):
                data = rng.randbytes(40)
        try:
            (from_json_line if kind == 3 else decode)(data)
            accepted += 1
        except ProtocolError:
            refused += 1
    assert accepted + refused == 70_000 and refused > 40_000 and accepted > 0, (accepted, refused)


@fast(400)
@given(envelope_like)
def test_msgpack_decoder_refuses_wrong_maps_cleanly(fields):
    decodes_or_refuses(msgspec.msgpack.encode(fields), decode)


@fast(400)
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode) | envelope_like.map(lambda d: repr(d).encode()))
def test_json_line_decoder_refuses_random_lines_cleanly(line):
    decodes_or_refuses(line, from_json_line)


# ------------------------------------------------------------------ live loops


def hostile_frames(n: int, seed: int) -> list[bytes]:
    """Random bytes, bit-flipped valid commands, wrong types, deep nesting, escape sequences."""
    rng = random.Random(seed)
    valid = [encode(Command(id=f"c{i}", cmd=c, args=a)) for i, (c, a) in enumerate(
        [("status", {}), ("checkpoint", {"kind": "full"}), ("switch", {"strategy": "fsdp"}), ("stop", {})])]
    specials = [
        b"\x85" + b"".join(msgspec.msgpack.encode(x) for x in ("v", 1, "type", "command", "id", "d", "cmd", "status",
                                                                 "args")) + b"\x81\xa1k" * 1000 + b"\x01",
        b"\x85" + b"".join(msgspec.msgpack.encode(x) for x in ("v", 1, "type", "command", "id", 5, "cmd", "status",
                                                                 "args")) + b"\x81\xa1k" * 1000 + b"\x01",
        encode(Command(id="\x1b]0;pwned\x07\x1b[2J", cmd="\x1b[31mexplode")),
        encode(Step(step=1, loss=1.0, step_ms=1.0)), encode(Bye(reason="forged")),
        msgspec.msgpack.encode({"v": 1, "type": "command", "id": "x" * 100_000, "cmd": "status"}),
        b"", b"\xc1",
    ]
    frames = [b"\x00" * (1 << 20 + 1)]  # one over the size limit
    for i in range(n - 1):
        r = rng.random()
        if r < 0.3:
            frames.append(rng.randbytes(rng.randrange(0, 200)))
        elif r < 0.8:
            frame = bytearray(rng.choice(valid))
            for _ in range(rng.randrange(1, 4)):
                frame[rng.randrange(len(frame))] = rng.randrange(256)
            frames.append(bytes(frame))
        else:
            frames.append(specials[i % len(specials)])
    return frames


def test_the_live_control_server_answers_every_hostile_frame_and_keeps_serving(gatekeeper):
    """The worst case: the frames come from a client that holds the run's keys."""
    gate, keys = gatekeeper
    address = f"tcp://127.0.0.1:{free_tcp_port()}"
    published: list = []
    # every frame meets the checks (the per-peer limit has its own tests: test_peer_limits.py)
    unlimited = PeerLimiter(rate_per_s=1e9, burst=10**9, total_rate_per_s=1e9, total_burst=10**9)
    server = ControlServer(address, lambda: {"step": 7}, published.append, gate=gate, limiter=unlimited)
    gate.start()
    server.start()
    client = zmq.Context.instance().socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    secure_client(client, keys.client)
    client.connect(address)
    frames = hostile_frames(12_000, seed=11)
    codes: dict[str, int] = {}
    try:
        for start in range(0, len(frames), 500):  # in bursts, every reply read before the next burst
            burst = frames[start:start + 500]
            for frame in burst:
                client.send(frame)
            for _ in burst:
                assert client.poll(10_000), f"no reply within 10 s (after {sum(codes.values())} replies)"
                reply = decode(client.recv())
                key = reply.code or reply.status
                codes[key] = codes.get(key, 0) + 1
                assert reply.status in ("ack", "done") or reply.code in DOCUMENTED_CODES, reply
                assert len(reply.id) <= 128
            server.take_pending()  # what the training thread would do at a step boundary
        assert server.is_alive()
        client.send(encode(Command(id="after", cmd="status")))
        assert client.poll(10_000)
        after = decode(client.recv())
        assert (after.id, after.status, after.result) == ("after", "done", {"step": 7})
    finally:
        client.close()
        server.stop()
    assert sum(codes.values()) == len(frames)
    assert codes.get("malformed", 0) > 0 and codes.get("oversize", 0) > 0, codes
    assert "internal" not in codes and server.faults.count == 0, "every frame met a specific check"


def received(sock: zmq.Socket, quiet_ms: int = 300) -> list[list[bytes]]:
    out = []
    while sock.poll(quiet_ms):
        out.append(sock.recv_multipart())
    return out


def received_until(sock: zmq.Socket, last, timeout_s: float = 30) -> list[list[bytes]]:
    """Everything received up to and including the frames `last` accepts (a bounded wait for a
    state: the relay may take a while over thousands of frames on a loaded machine)."""
    out, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sock.poll(100):
            out.append(sock.recv_multipart())
            if last(out[-1]):
                return out
    raise AssertionError(f"not received within {timeout_s} s; got {len(out)} frames")


def publish_until_seen(pub: zmq.Socket, sub: zmq.Socket, frames: list[bytes], timeout_s: float = 10) -> None:
    """PUB/SUB drop what is sent before a subscription arrives: resend a probe until it lands."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pub.send_multipart(frames)
        if sub.poll(100):
            sub.recv_multipart()
            received(sub, 100)
            return
    raise AssertionError("the subscription never arrived")


def test_the_relay_forwards_and_caches_only_what_is_real(gatekeeper):
    """The forger holds rank 0's key (a rank gone bad): the relay's checks must still hold."""
    gate, keys = gatekeeper
    with relay_with_ranks(gate, keys, "real") as (relay, publish_addr, (pub, rank1)):
        ui = subscriber(publish_addr, keys.client)
        late = None
        try:
            real_hello = Hello(run_id="real", world_size=2, rank=1, host="node-1")
            publish_until_seen(rank1, ui, framed(real_hello))
            publish_until_seen(pub, ui, framed(Step(rank=0, step=1, loss=1.0, step_ms=1.0)))
            forged = [
                framed(Bye(rank=1, reason="forged by rank 0")),  # well-formed, but not the sender's rank
                framed(Hello(run_id="forged", world_size=2, rank=0)),  # another run
                framed(Hello(run_id="real", world_size=1_000, rank=0)),  # not this run's world
                [b"bye.1", encode(Bye(rank=0, reason="forged"))],  # topic and rank disagree
                framed(Step(rank=7, step=1, loss=1.0, step_ms=1.0)),  # no such rank
                framed(RankExit(rank=0, of_rank=1, how="killed by SIGKILL")),  # the watcher's word, from a rank
                framed(RankExit(rank=-1, of_rank=1, how="killed by SIGKILL")),  # ... speaking as the watcher
                framed(RankLook(of_rank=1, words="stuck (alive)")),  # ... or saying a rank is alive
                [b"hello.0",
                 msgspec.msgpack.encode({"v": 1, "type": "hello", "run_id": "real", "world_size": 10 ** 9})],
                [b"step.0"], [b"step.0", b"\xc1", b"extra"],
            ]
            rng = random.Random(5)
            for frames in forged:
                pub.send_multipart(frames)
            for frame in hostile_frames(10_000, seed=3):
                pub.send_multipart([rng.choice([b"hello.0", b"bye.1", b"step.0", b"x"]), frame])
            real_step = Step(rank=0, step=3, loss=2.0, step_ms=5.0)
            pub.send_multipart(framed(real_step))
            got = [decode(f[1]) for f in received_until(ui, lambda frames: decode(frames[1]) == real_step)]
            assert got and got[-1] == real_step, got[-3:]
            assert all(isinstance(m, (Hello, Step)) and (not isinstance(m, Hello) or m.run_id == "real") for m in got)
            assert relay.is_alive() and relay.dropped >= len(forged)

            late = subscriber(publish_addr, keys.client)  # a UI attaching now gets only the real cached Hello
            cached = [decode(f[1]) for f in received_until(late, lambda frames: True)]
            cached += [decode(f[1]) for f in received(late, 500)]
            assert [m for m in cached if not isinstance(m, (GoodputSoFar, RecentSteps))] == [real_hello]
            recent = [b for m in cached if isinstance(m, RecentSteps) for b in m.briefs]  # the real steps only
            assert [(b.rank, b.step, b.step_ms) for b in recent] == [(0, 1, 1.0), (0, 3, 5.0)]
            so_far = [m for m in cached if isinstance(m, GoodputSoFar)]  # the relay's goodput count: of this run
            assert len(so_far) == 1 and so_far[0].run_id == "real" and so_far[0].world_size == 2
        finally:
            for sock in (ui, late):
                if sock is not None:
                    sock.close()


def test_the_ui_receiver_survives_hostile_frames_and_still_delivers():
    address = f"tcp://127.0.0.1:{free_tcp_port()}"
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.setsockopt(zmq.SNDHWM, 100_000)
    pub.bind(address)
    batches: list = []
    client = TelemetryClient(address, None, lambda batch, rejected: batches.append((list(batch), list(rejected))))
    client.start()
    try:
        probe = Step(rank=0, step=1, loss=1.0, step_ms=1.0)

        def probe_delivered():  # PUB/SUB drop what precedes the subscription: resend until one lands
            pub.send_multipart([b"step.0", encode(probe)])
            return any(batch for batch, _ in batches)
        poll_until(probe_delivered, 10, "the subscription")
        for i, frame in enumerate(hostile_frames(10_000, seed=8)):  # all fit below the send high-water mark
            pub.send_multipart([b"step.0", frame] if i % 3 else [frame])
        final = Step(rank=0, step=99, loss=1.0, step_ms=1.0)
        pub.send_multipart([b"step.0", encode(final)])
        poll_until(lambda: any(final in batch for batch, _ in batches), 20, "the receiver delivering after the storm")
        assert client.running and client.rejected > 1000 and client.faults.count == 0
    finally:
        client.stop()
        pub.close()
