"""Bounded staleness (issue 33): where telemetry waits because a reader is behind, a rank's newer
step, sample or heartbeat replaces its older one, what was replaced is counted as skipped (never
as lost), events always go through, and rank 0's steps are never skipped (goodput counts each).

Real parts: rank 0's `Relay` and a `NodeRelay` with their ZeroMQ sockets, the UI's
`TelemetryClient` on a real SUB socket."""

from __future__ import annotations

import time

import pytest
import zmq
from conftest import poll_until

from ringtop.agent.transport.node_relay import NodeRelay
from ringtop.agent.transport.relay import BURST_MESSAGES, CONFLATE_AFTER_S, Relay
from ringtop.agent.transport.relay_checks import skip_report
from ringtop.metrics.lag import BEHIND_AFTER_S
from ringtop.protocol import Digest, Event, Heartbeat, Hello, Step, encode, free_tcp_port
from ringtop.tui.header.render import facts_text
from ringtop.tui.sources.connection import CONFLATE_AFTER_S as UI_CONFLATE_AFTER_S
from ringtop.tui.sources.connection import MAX_WAITING, MAX_WAITING_BYTES, MAX_WAITING_DIGESTS, TelemetryClient
from ringtop.tui.sources.feeds import newest_rank_ts
from ringtop.tui.state.view_model import RunView
from tests.helpers.background_socket import framed

pytestmark = pytest.mark.timeout(60)


def _addr() -> str:
    return f"tcp://127.0.0.1:{free_tcp_port()}"


def _step(rank: int, step: int, seq: int, ts: float | None = None) -> Step:
    return Step(rank=rank, step=step, seq=seq, loss=1.0, step_ms=10.0, ts=time.time() if ts is None else ts)


def _until(condition, timeout_s: float = 20.0, what: str = "") -> None:
    poll_until(condition, timeout_s, what, interval_s=0.01)


@pytest.fixture
def relay():
    r = Relay(_addr(), _addr(), run_id="r", world_size=4, count_goodput=False)
    seen: list = []
    r.observers.append(seen.append)
    r.seen = seen
    try:
        yield r
    finally:
        r.stop()


def _burst(messages) -> list[tuple[list[bytes], None]]:
    return [(framed(m), None) for m in messages]


def test_a_relay_behind_forwards_each_ranks_newest_and_counts_the_rest(relay):
    steps = [_step(rank, n, seq=n) for n in range(1, 6) for rank in (0, 1, 2)]
    event = Event(rank=1, seq=6, kind="note", text="kept")
    beats = [Heartbeat(rank=2, seq=6, step=5), Heartbeat(rank=2, seq=7, step=5)]
    relay.forward_burst(_burst([*steps, event, *beats]), full=True)

    got = [(type(m).__name__, m.rank, getattr(m, "step", None), m.seq) for m in relay.seen]
    assert [g for g in got if g[1] == 0] == [("Step", 0, n, n) for n in range(1, 6)], "rank 0: every step"
    assert [g for g in got if g[1] == 1] == [("Step", 1, 5, 5), ("Event", 1, -1, 6)]
    assert [g for g in got if g[1] == 2] == [("Step", 2, 5, 5), ("Heartbeat", 2, 5, 7)]
    assert relay.skipped == 4 + 4 + 1 and relay.forwarded == len(got)

    relay.forward_burst(_burst([_step(1, 6, seq=7), _step(2, 6, seq=8)]), full=False)
    assert relay.gaps == 0, "a skipped message is no gap in its rank's seq"
    relay.forward_burst(_burst([_step(1, 8, seq=9)]), full=False)
    assert relay.gaps == 1, "a message that never came still is"


def test_a_relay_that_keeps_up_forwards_every_reading(relay):
    steps = [_step(rank, n, seq=n) for n in range(1, 6) for rank in (1, 2)]
    relay.forward_burst(_burst(steps), full=False)
    assert relay.skipped == 0 and len(relay.seen) == len(steps)


def test_the_relay_conflates_once_its_input_is_late(relay):
    """Not only a full burst: messages stamped late (queued upstream) switch it on, and off again."""
    for n in range(1, 4):  # on time: the quickest path
        relay.forward_burst(_burst([_step(1, n, seq=n)]), full=False)
    late = time.time() - 10 * CONFLATE_AFTER_S
    relay.forward_burst(_burst([_step(1, 4, seq=4, ts=late)]), full=False)
    assert relay.lag.behind_s() >= CONFLATE_AFTER_S
    relay.forward_burst(_burst([_step(1, 5, seq=5, ts=late), _step(1, 6, seq=6, ts=late)]), full=False)
    assert relay.skipped == 1
    relay.forward_burst(_burst([_step(1, 7, seq=7)]), full=False)  # caught up
    relay.forward_burst(_burst([_step(1, 8, seq=8), _step(1, 9, seq=9)]), full=False)
    assert relay.skipped == 1 and relay.gaps == 0


def test_one_sender_cannot_make_another_ranks_readings_skipped():
    r = Relay(_addr(), _addr(), run_id="r", world_size=4, count_goodput=False, carriers={"node-b": [2, 3]})
    try:
        seen: list = []
        r.observers.append(seen.append)
        node_b, rank1 = r._carried["node-b"], frozenset({1})
        burst = [(framed(_step(1, 1, seq=1)), rank1), (framed(_step(1, 2, seq=2)), node_b)]  # a forged rank 1 step
        r.forward_burst(burst, full=True)
        assert [(m.rank, m.step) for m in seen] == [(1, 1)] and r.skipped == 0 and r.dropped == 1

        r.forward_burst([([*skip_report({2: 5}), *framed(_step(2, 7, seq=7))], node_b)], full=False)
        r.forward_burst([(framed(_step(2, 1, seq=1)), node_b)], full=False)
        assert r.skipped == 5 and r.gaps == 0
        r.forward_burst([(skip_report({1: 3}), rank1)], full=False)  # a rank's own key: no report of skips
        r.forward_burst([(skip_report({1: 3}), node_b)], full=False)  # a node's report of another node's rank
        assert r.skipped == 5
    finally:
        r.stop()


def test_a_node_relay_whose_head_is_away_keeps_each_ranks_newest_and_tells_the_head():
    head_addr = _addr()
    node = NodeRelay(head_addr, None, [1, 2], None, run_id="r", world_size=4)
    node.start()
    pub = zmq.Context.instance().socket(zmq.XPUB)
    pub.setsockopt(zmq.XPUB_NODROP, 1)
    pub.setsockopt(zmq.SNDHWM, 100_000)
    pub.setsockopt(zmq.LINGER, 0)
    head = None
    try:
        pub.connect(node.address)
        _until(lambda: pub.poll(10) and pub.recv()[:1] == b"\x01", what="the node relay's subscription")
        seq = {1: 0, 2: 0}
        sent = events = 0
        for n in range(1, 201):
            for rank in (1, 2):
                seq[rank] += 1
                pub.send_multipart(framed(_step(rank, n, seq=seq[rank])))
                sent += 1
            if n % 50 == 0:
                seq[1] += 1
                pub.send_multipart(framed(Event(rank=1, seq=seq[1], kind="note", text=f"e{n}")))
                events += 1
        _until(lambda: sum(1 for f in list(node._queue) if f) + node.skipped == sent + events,
               what="every message taken in by the node relay")
        assert node.skipped > 0 and node.lost == 0

        head = Relay(head_addr, _addr(), run_id="r", world_size=4, count_goodput=False)
        seen: list = []
        head.observers.append(seen.append)
        head.start()
        _until(lambda: len(seen) + head.skipped >= sent + events, what="everything at the head")
        for rank in (1, 2):
            mine = [m.step for m in seen if isinstance(m, Step) and m.rank == rank]
            assert mine == sorted(mine) and mine[-1] == 200, "in order, the newest last"
        assert sum(isinstance(m, Event) for m in seen) == events, "every event"
        assert head.skipped == node.skipped and head.gaps == 0 and node.lost == 0, "skipped, not lost"
    finally:
        pub.close(0)
        node.stop()
        if head is not None:
            head.stop()


def test_the_ui_receiver_folds_the_newest_while_the_ui_is_behind():
    """The UI folds its first batch only late: meanwhile nothing more is handed to it, and what
    waits longer than CONFLATE_AFTER_S keeps each rank's newest (rank 0's steps: all)."""
    address = _addr()
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.setsockopt(zmq.SNDHWM, 100_000)
    pub.bind(address)
    batches: list[list] = []
    client = TelemetryClient(address, None, lambda batch, rejected: batches.append(list(batch)), folds_later=True)
    client.start()
    try:
        probe = framed(_step(0, 0, seq=0))
        _until(lambda: pub.send_multipart(probe) or bool(batches), what="the first batch")
        posted = time.monotonic()
        sent, n = {0: 0, 1: 0}, 0
        while client.skipped < 20:
            assert time.monotonic() - posted < 30, "the receiver never skipped"
            n += 1
            expected = client.received + 2
            for rank in (0, 1):
                pub.send_multipart(framed(_step(rank, n, seq=n)))
                sent[rank] += 1
            _until(lambda expected=expected: client.received >= expected, what="the pair received")
        assert time.monotonic() - posted >= UI_CONFLATE_AFTER_S
        pub.send_multipart(framed(Event(rank=1, seq=n + 1, kind="note", text="kept")))
        assert len(batches) == 1, "nothing more handed to a UI that has not folded its batch"

        def acked_until_the_event() -> bool:
            client.ack()
            return any(isinstance(m, Event) for b in batches for m in b)

        _until(acked_until_the_event, what="the event, once the UI folds again")
        later = [m for b in batches[1:] for m in b]
        rank0 = [m.step for m in later if isinstance(m, Step) and m.rank == 0 and m.step > 0]
        rank1 = [m.step for m in later if isinstance(m, Step) and m.rank == 1]
        assert rank0 == list(range(1, n + 1)), "rank 0's steps: every one"
        assert rank1 == sorted(rank1) and rank1[-1] == n and len(rank1) + client.skipped == sent[1]
    finally:
        client.stop()
        pub.close(0)


@pytest.fixture
def publisher():
    """A publisher that drops nothing and hears its subscribers (XPUB), and its address."""
    address = _addr()
    sock = zmq.Context.instance().socket(zmq.XPUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.bind(address)
    try:
        yield sock, address
    finally:
        sock.close(0)


def _behind_client(publisher, probe: list[bytes], digests: bool = False) -> tuple[TelemetryClient, list[list]]:
    """A client whose UI has not folded its first batch (the probe's) for CONFLATE_AFTER_S."""
    pub, address = publisher
    batches: list[list] = []
    client = TelemetryClient(address, None, lambda batch, rejected: batches.append(list(batch)),
                             folds_later=True)
    client.want_digests(digests)
    client.start()
    _until(lambda: pub.poll(10) and pub.recv()[:1] == b"\x01", what="the client's subscription")
    pub.send_multipart(probe)  # one, so that every frame the client counts from here on is the test's
    _until(lambda: bool(batches) and client.digests == digests, what="the first batch")
    posted = time.monotonic()
    _until(lambda: time.monotonic() - posted >= UI_CONFLATE_AFTER_S, what="the UI behind")
    return client, batches


def _handed_after_ack(client: TelemetryClient, batches: list[list], received: int) -> list:
    _until(lambda: client.received >= received, what="every frame received")
    handed = len(batches)
    _until(lambda: client.ack() or len(batches) > handed, what="the waiting batch, once the UI folds")
    return [m for b in batches[handed:] for m in b]


def test_what_waits_for_a_ui_behind_is_bounded_in_bytes(publisher):
    """Events are never replaced by newer ones, so only the bytes bound holds them: of frames
    adding up to more than MAX_WAITING_BYTES, the newest that fit wait, the rest are skipped."""
    client, batches = _behind_client(publisher, framed(Event(rank=1, seq=0, kind="note", text="probe")))
    try:
        received = client.received
        frames = [framed(Event(rank=1, seq=i, step=i, kind="note", text="x" * 500_000)) for i in range(1, 41)]
        assert sum(len(f[1]) for f in frames) > MAX_WAITING_BYTES
        for f in frames:
            publisher[0].send_multipart(f)
        handed = _handed_after_ack(client, batches, received + len(frames))
        steps = [m.step for m in handed if isinstance(m, Event) and m.step > 0]
        assert steps and steps == list(range(41 - len(steps), 41)), "the newest wait, in order"
        assert sum(len(encode(m)) for m in handed) <= MAX_WAITING_BYTES
        assert len(steps) + client.skipped == len(frames), "the others counted as skipped"
    finally:
        client.stop()


def test_a_trim_by_count_leaves_each_digest_slot_replaceable(publisher):
    """Heartbeats replaced by newer ones fill the batch up to MAX_WAITING: the oldest half goes;
    digests in the half that stays are still replaced by newer ones, so no more than
    MAX_WAITING_DIGESTS of them wait (not twice as many)."""
    def digest(seq: int) -> list[bytes]:
        return framed(Digest(rank=-1, seq=seq, ts=time.time(), interval_s=0.2))

    def beats(first: int, n: int) -> list[list[bytes]]:
        return [framed(Heartbeat(rank=1, seq=i, step=i)) for i in range(first, first + n)]

    client, batches = _behind_client(publisher, digest(1), digests=True)
    try:
        received = client.received
        early, late = 3 * MAX_WAITING // 4, MAX_WAITING // 4
        frames = [*beats(1, early), *(digest(100 + i) for i in range(MAX_WAITING_DIGESTS)),
                  *beats(early + 1, late), *(digest(200 + i) for i in range(MAX_WAITING_DIGESTS))]
        for f in frames:
            publisher[0].send_multipart(f)
        handed = _handed_after_ack(client, batches, received + len(frames))
        seqs = [m.seq for m in handed if isinstance(m, Digest)]
        assert seqs == [200 + i for i in range(MAX_WAITING_DIGESTS)], "the newest digests, each slot's once"
    finally:
        client.stop()


def test_the_screens_lag_is_the_ranks_stamps_not_the_relays():
    old, now = 1000.0, 1010.0
    digest = Digest(rank=-1, seq=1, ts=now, interval_s=0.2, steps=[_step(3, 5, seq=5, ts=old)])
    assert newest_rank_ts([digest]) == old, "a digest sent now of steps that waited"
    assert newest_rank_ts([digest, Heartbeat(rank=2, seq=1, step=5, ts=old + 1)]) == old + 1
    assert newest_rank_ts([Hello(rank=-1, run_id="r", world_size=1, ts=now)]) == 0.0


def test_the_header_says_how_many_stale_readings_were_skipped():
    view = RunView()
    view.apply(Hello(rank=0, run_id="r", world_size=2), now=1.0)
    assert "stale skipped" not in facts_text(view, replay=False, source="").plain
    view.relay_skipped, view.receiver_skipped = 1200, 34
    assert "1,234 stale skipped" in facts_text(view, replay=False, source="").plain
    assert BEHIND_AFTER_S <= 1.0, "the header says `behind` within about a second"
    assert BURST_MESSAGES >= 1024
