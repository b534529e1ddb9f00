"""What a peer can cost the run, whoever it is: an authenticated client is held to its token bucket
(one `busy`, then silence), every oversize frame and every non-integer version is answered by name,
unauthenticated connections give their file descriptors back fast, and a thread that runs out of
file descriptors carries on once they are back."""

from __future__ import annotations

import collections
import itertools
import json
import os
import resource
import socket
import subprocess
import sys
import textwrap
import time

import msgspec
import pytest
import zmq
from conftest import further, poll_until

from ringtop.protocol import MAX_FRAME_BYTES, Command, Reply, decode, encode, free_tcp_port
from ringtop.protocol.rate_limit import BURST, RATE_PER_S, PeerLimiter, TokenBucket, Verdict

pytestmark = pytest.mark.timeout(180)


# ------------------------------------------------------------------ the buckets (pure)


def test_a_bucket_gives_its_burst_then_its_rate():
    bucket = TokenBucket(rate_per_s=8.0, capacity=5, now_s=100.0)
    assert [bucket.take(100.0) for _ in range(6)] == [True] * 5 + [False]
    assert not bucket.take(100.0625)  # half a token
    assert bucket.take(100.125) and not bucket.take(100.125)
    assert bucket.refill(200.0) == 5  # never more than its capacity


def flood(limiter: PeerLimiter, peer: bytes, frames: int, per_s: float, start_s: float = 0.0) -> dict[Verdict, int]:
    counts = {v: 0 for v in Verdict}
    for i in range(frames):
        counts[limiter.verdict(peer, start_s + i / per_s)] += 1
    return counts


def test_a_flood_gets_its_burst_one_busy_then_silence_until_the_bucket_is_full():
    limiter = PeerLimiter(rate_per_s=50.0, burst=100, total_rate_per_s=1e6, total_burst=10**6)
    counts = flood(limiter, b"ui", 20_000, per_s=33_333.0)  # 20k frames in 0.6 s, as the flood
    assert counts[Verdict.PASS] == 100 + 0  # 0.6 s of a silenced peer refill no more than 30: still silenced
    assert counts[Verdict.BUSY] == 1 and counts[Verdict.DROP] == 20_000 - 101
    assert limiter.verdict(b"ui", 0.6 + 1.0) is Verdict.DROP  # 50 tokens back of the 100 it needs
    assert limiter.verdict(b"ui", 0.6 + 2.0) is Verdict.PASS  # full again: heard again
    assert limiter.verdict(b"other", 0.7) is Verdict.PASS  # another peer has its own bucket


def test_a_sustained_flood_is_held_to_the_rate():
    """Ten seconds at 1 kHz: handled frames are at most the burst plus the rate's share of the time."""
    limiter = PeerLimiter()
    counts = flood(limiter, b"ui", 10_000, per_s=1000.0)
    assert counts[Verdict.PASS] <= BURST + RATE_PER_S * 10
    assert counts[Verdict.PASS] >= RATE_PER_S * 10 * 0.8  # a patient client is still served
    assert counts[Verdict.BUSY] <= 10 * RATE_PER_S / BURST + 1  # one per silence
    assert limiter.refused == counts[Verdict.BUSY] + counts[Verdict.DROP]


def test_many_peers_together_are_held_to_the_total():
    limiter = PeerLimiter(rate_per_s=50.0, burst=100, total_rate_per_s=400.0, total_burst=800)
    passed = sum(limiter.verdict(f"p{i}".encode(), i * 1e-5) is Verdict.PASS for i in range(5000))
    assert passed == int(800 + 400.0 * 4999e-5)  # the total burst, and what 0.05 s at 400/s add back


def test_a_peer_refused_by_the_shared_bucket_is_told_once_too():
    """Its own bucket still holds tokens; it gets one `busy` all the same, then 2 s of silence."""
    limiter = PeerLimiter(rate_per_s=50.0, burst=100, total_rate_per_s=1.0, total_burst=3)
    assert [limiter.verdict(b"a", 0.0) for _ in range(3)] == [Verdict.PASS] * 3  # the shared bucket is empty now
    assert [limiter.verdict(b"b", 0.001) for _ in range(4)] == [Verdict.BUSY] + [Verdict.DROP] * 3
    assert limiter.verdict(b"b", 1.9) is Verdict.DROP and limiter.verdict(b"b", 2.01) is Verdict.PASS


def test_a_polite_client_is_never_refused():
    limiter = PeerLimiter()
    assert all(limiter.verdict(b"ui", t * 0.1) is Verdict.PASS for t in range(3000))  # 10 a second for 5 min


def test_forgotten_peers_are_bounded():
    limiter = PeerLimiter(max_peers=16)
    for i in range(1000):
        limiter.verdict(f"p{i}".encode(), float(i))
    assert len(limiter._peers) == 16


@pytest.mark.parametrize("burst", [100, 10**9], ids=["limited", "bites-unlimited"])
def test_the_flood_check_bites(burst):
    """The flood check above, with a limiter that lets everything through, fails."""
    limiter = PeerLimiter(rate_per_s=float(burst), burst=burst, total_rate_per_s=1e12, total_burst=10**12)
    counts = flood(limiter, b"ui", 20_000, per_s=33_333.0)
    assert (counts[Verdict.PASS] <= BURST + RATE_PER_S) is (burst == 100)


# ------------------------------------------------------------------ the control server, real sockets


@pytest.fixture
def control():
    """Rank 0's control server on a free port (plain sockets: the limits apply to any peer) and a
    DEALER connected to it; (server, client, published replies)."""
    from ringtop.agent.control.channel import ControlServer

    published: list[Reply] = []
    server = ControlServer(f"tcp://127.0.0.1:{free_tcp_port()}", lambda: {"step": 7}, published.append)
    server.start()
    client = zmq.Context.instance().socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    client.setsockopt(zmq.SNDHWM, 0)
    client.connect(server.address)
    yield server, client, published
    client.close()
    server.stop()


def replies_until_quiet(client: zmq.Socket, quiet_ms: int = 1500, limit_s: float = 60) -> list[Reply]:
    out, deadline = [], time.monotonic() + limit_s
    while time.monotonic() < deadline and client.poll(quiet_ms):
        out.append(decode(client.recv()))
    return out


def test_a_flood_of_authentic_commands_gets_its_burst_and_one_busy(control):
    server, client, published = control
    started = time.monotonic()
    for i in range(2000):
        client.send(encode(Command(id=f"c{i}", cmd="status")), copy=False)
    got = replies_until_quiet(client)
    elapsed_s = time.monotonic() - started
    done = [r for r in got if r.status == "done"]
    busy = [r for r in got if r.code == "busy"]
    assert len(done) <= BURST + RATE_PER_S * elapsed_s and len(done) >= BURST * 0.9, (len(done), elapsed_s)
    assert 1 <= len(busy) <= elapsed_s * RATE_PER_S / BURST + 1 and "too many commands" in busy[0].error
    poll_until(lambda: len(published) >= len(got), 10, "the replies published")
    assert len(published) == len(got) < 2000  # the dropped ones are not re-published either
    deadline = time.monotonic() + 10  # once the announced silence (BURST / RATE_PER_S) is over, answered again
    after = None
    for i in itertools.count():
        assert time.monotonic() < deadline, "no answer after the silence the busy reply announced"
        client.send(encode(Command(id=f"after{i}", cmd="status")))
        if client.poll(500):
            after = decode(client.recv())
            break
    assert after.id.startswith("after") and after.status == "done"


@pytest.mark.parametrize("size", [MAX_FRAME_BYTES + 1, 16 * MAX_FRAME_BYTES + 64, 40 * MAX_FRAME_BYTES])
def test_every_oversize_frame_is_answered_oversize(control, size):
    _, client, _ = control
    client.send(b"\x91" + b"\x00" * (size - 1))
    assert client.poll(20_000), f"no reply to a frame of {size} bytes"
    reply = decode(client.recv())
    assert (reply.status, reply.code) == ("error", "oversize") and str(size) in reply.error


@pytest.mark.parametrize("v", [True, 1.0, False, 2.0])
def test_a_version_that_is_not_an_integer_is_answered_bad_version(control, v):
    _, client, _ = control
    client.send(msgspec.msgpack.encode({"type": "command", "v": v, "id": "x1", "cmd": "status", "args": {}}))
    assert client.poll(10_000)
    reply = decode(client.recv())
    assert (reply.id, reply.code) == ("x1", "bad_version"), reply


# ------------------------------------------------------------------ unauthenticated peers, a real rank


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def held_connections(addresses: list[str], n: int, keep: int | None = None) -> list[socket.socket]:
    """`n` TCP connections spread over `addresses`, kept open and silent (no handshake), as a
    local user without keys can open them; with `keep`, only the latest `keep` stay open (the
    attacker's own file limit)."""
    ports = [int(a.rsplit(":", 1)[1]) for a in addresses]
    held: collections.deque[socket.socket] = collections.deque()
    try:
        for i in range(n):
            if keep is not None and len(held) >= keep:
                held.popleft().close()
            s = socket.socket()
            s.settimeout(2.0)
            try:
                s.connect(("127.0.0.1", ports[i % len(ports)]))
            except OSError:
                s.close()  # the listen queue was full: refused, which costs rank 0 nothing
                continue
            held.append(s)
    except BaseException:  # closed here: a traceback kept by pytest would hold them past the test
        for s in held:
            s.close()
        raise
    return list(held)


def wrong_key_clients(addresses: list[str], server_public: str, n: int) -> list[zmq.Socket]:
    """`n` ZeroMQ clients, each with a key pair of its own (not the run's), that keep their sockets open."""
    out = []
    for i in range(n):
        sock = zmq.Context.instance().socket(zmq.DEALER)
        public, secret = zmq.curve_keypair()
        sock.setsockopt(zmq.CURVE_SERVERKEY, server_public.encode())
        sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
        sock.connect(addresses[i % len(addresses)])
        out.append(sock)
    return out


@pytest.mark.parametrize("n", [2_000, pytest.param(20_000, marks=further)])
def test_unauthenticated_connections_cost_rank_0_file_descriptors_only_briefly(launch_agents, n):
    """150 clients with keys of their own, then N connections held open without a handshake
    (2,000; 20,000 as a further variant): rank 0 drops the refused ones and closes its side of
    the silent ones within its handshake time while they are all still held, its sampler keeps
    sampling, and its control socket still answers the run's keys."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    keep = n if hard == resource.RLIM_INFINITY else min(n, hard - 256)
    if keep < 1000:
        pytest.skip(f"this user may hold only {hard} files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, keep + 256), hard))
    run = launch_agents(0, "--steps", "0")
    info = run.connection()
    pid = run.proc.pid
    poll_until(lambda: run.steps(0), 120, "rank 0's first step", detail=run.output)
    baseline = open_fds(pid)
    strangers, held = [], []
    try:
        strangers = wrong_key_clients([info.publish, info.control, info.relay], info.keys.server_public, 150)
        # what this process holds already (the clients' ZeroMQ sockets, earlier tests') stays within the limit
        keep = min(keep, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - open_fds(os.getpid()) - 256)
        held = held_connections([info.publish, info.control, info.relay], n, keep)
        assert len(held) > keep // 2, f"only {len(held)} of the last {keep} connections were accepted"
        poll_until(lambda: open_fds(pid) <= baseline + 64, 20, f"rank 0's files back near {baseline} "
                   "while the connections are still held", detail=lambda: str(open_fds(pid)))
        samples_before = len([m for m in run.messages(0) if type(m).__name__ == "Sample"])
        poll_until(lambda: len([m for m in run.messages(0) if type(m).__name__ == "Sample"]) > samples_before,
                   30, "a sample after the connections", detail=run.output)
        replies = list(run.send_command("status", {}, timeout_s=30))
        assert replies[-1].status == "done"
    finally:
        for s in held:
            s.close()
        for sock in strangers:
            sock.close(linger=0)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert "Too many open files" not in run.output()


def test_a_loop_backs_off_while_the_system_refuses_and_not_for_bad_input(monkeypatch, capsys):
    """10 ms doubling to 1 s while OSErrors come; a ValueError (input) costs no wait; reported a
    few times a minute, not per fault."""
    import errno

    from ringtop.protocol import guard

    waits: list[float] = []
    monkeypatch.setattr(guard.time, "sleep", waits.append)
    faults = guard.LoopFaults("test loop")
    for _ in range(10):
        faults.record(OSError(errno.EMFILE, "Too many open files"))
    assert waits == [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0, 1.0, 1.0]
    faults.record(ValueError("hostile frame"))
    assert len(waits) == 10 and faults.count == 11
    faults.record(zmq.ZMQError(errno.EMFILE))
    assert waits[-1] == 1.0
    assert capsys.readouterr().err.count("ignored an unexpected") == 5


EMFILE_SCRIPT = textwrap.dedent("""
    import json, os, resource, sys, time
    from ringtop.agent.instruments.sampler import SystemSampler

    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    samples = []
    sampler = SystemSampler(samples.append, interval_s=0.02)
    sampler.start()

    def wait_for(cond, what):
        deadline = time.monotonic() + 20
        while not cond():
            if time.monotonic() > deadline:
                sys.exit(f"not within 20 s: {what}")
            time.sleep(0.01)

    wait_for(lambda: len(samples) >= 2, "the first samples")
    hogs = []
    try:
        while True:
            hogs.append(os.open(os.devnull, os.O_RDONLY))
    except OSError as exc:
        starved = exc.errno
    wait_for(lambda: sampler.faults.count >= 3, "the sampler to meet EMFILE")
    during, met = len(samples), sampler.faults.count
    wait_for(lambda: sampler.faults.count >= met + 5, "the sampler to meet EMFILE five times more")
    stalled = len(samples) - during
    for fd in hogs:
        os.close(fd)
    wait_for(lambda: len(samples) >= during + stalled + 3, "samples again")
    print(json.dumps({"errno": starved, "faults": sampler.faults.count, "alive": sampler.is_alive(),
                      "during_starvation": stalled}))
""")


def test_the_sampler_meets_emfile_and_carries_on_once_files_are_back():
    """A process short of file descriptors (RLIMIT_NOFILE lowered in a subprocess): the sampler
    cannot read /proc, says so a few times, backs off, and samples again once files are back."""
    import errno

    out = subprocess.run([sys.executable, "-c", EMFILE_SCRIPT], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["errno"] == errno.EMFILE and result["alive"] and result["faults"] >= 3
    assert result["during_starvation"] == 0  # it really could not sample then
    assert out.stderr.count("ignored an unexpected") <= 5  # logged a few times, not once a tick


# ------------------------------------------------------------------ the metrics endpoint (no keys)


def scrape(port: int) -> bytes | None:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return response.read()
    except OSError:
        return None


@pytest.mark.parametrize("bounded", [True, pytest.param(False, marks=further)],
                         ids=["ours", "bites-prometheus-client-own-server"])
def test_idle_connections_to_the_metrics_endpoint_cost_a_bounded_number_of_threads(bounded):
    """60 silent connections: at most MAX_CONNECTIONS threads serve them, the rest are closed at
    once, the silent ones after IDLE_TIMEOUT_S, and a scrape is served again. prometheus_client's
    own server (the bites case) holds a thread for each, for as long as the peer likes."""
    import threading

    from prometheus_client import CollectorRegistry, start_http_server

    from ringtop.agent.prometheus.server import IDLE_TIMEOUT_S, MAX_CONNECTIONS, serve_metrics

    port = free_tcp_port()
    registry = CollectorRegistry()
    threads_before = threading.active_count()
    server, thread = (serve_metrics("127.0.0.1", port, registry) if bounded
                      else start_http_server(port, addr="127.0.0.1", registry=registry))
    held = held_connections([f"tcp://127.0.0.1:{port}"], 60)
    try:
        if not bounded:
            poll_until(lambda: threading.active_count() > threads_before + MAX_CONNECTIONS + 1, 20,
                       "a thread per idle connection")
            return
        poll_until(lambda: server.refused >= len(held) - MAX_CONNECTIONS, 20, "the connections past the limit closed",
                   detail=lambda: f"{server.refused} refused of {len(held)}")
        assert threading.active_count() <= threads_before + 1 + MAX_CONNECTIONS
        poll_until(lambda: scrape(port) is not None, IDLE_TIMEOUT_S + 20, "a scrape once the silent ones are closed")
    finally:
        for s in held:
            s.close()
        server.shutdown()
        server.server_close()
        thread.join(5)
