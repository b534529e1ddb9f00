"""Each collective of a step as the tracer keeps it for the log's `calls` message: its issue, its
completion and the wait on it named by its handle, in ms from the step's start; at most
MAX_CALLS_PER_STEP of them, the rest counted; and the message itself, log-only: written to the
rank's log and never sent, without a gap in the wire's `seq` (a real sender, a real socket)."""

from __future__ import annotations

import pytest
import zmq
from conftest import poll_until

from ringtop.agent.instruments.comm_tracer import CommTracer, call_records
from ringtop.agent.transport.relay_checks import real
from ringtop.agent.transport.telemetry import Telemetry
from ringtop.protocol import (
    Bye,
    CollectiveCall,
    CollectiveCalls,
    Heartbeat,
    decode,
    encode,
    free_tcp_port,
    read_log,
)
from ringtop.protocol.messages import MAX_CALLS_PER_STEP, MAX_GROUP_CHARS

MS = 1_000_000


def test_a_wait_named_by_its_handle_is_that_collectives_and_times_are_from_the_step_start():
    tracer = CommTracer()
    a = tracer.begin("all_reduce", 64, 2, "world")
    b = tracer.begin("all_gather", 128, 2, "0-1")
    ledger = {e.kind: e for e in tracer.ledger}
    ledger["all_reduce"].issued_ns, ledger["all_gather"].issued_ns = 1_000 * MS + 2 * MS, 1_000 * MS + 3 * MS
    tracer.end(a)
    tracer.end(b)
    ledger["all_reduce"].done_ns, ledger["all_gather"].done_ns = 1_000 * MS + 9 * MS, 1_000 * MS + 7 * MS
    tracer.blocked(1_000 * MS + 5 * MS, 1_000 * MS + 9 * MS, a)  # waited on `a`
    tracer.blocked(1_000 * MS + 9 * MS, 1_000 * MS + 12 * MS, a)  # a second wait does not replace the first
    tracer.blocked(1_000 * MS + 20 * MS, 1_000 * MS + 21 * MS)  # a wait on nothing named: no call's
    summary = tracer.drain()
    records = call_records(summary.calls, 1_000 * MS)
    assert records == [
        CollectiveCall(kind="all_reduce", group="world", seq=1, bytes=64, issued_ms=2.0, done_ms=9.0,
                       wait_start_ms=5.0, wait_end_ms=9.0),
        CollectiveCall(kind="all_gather", group="0-1", seq=1, bytes=128, issued_ms=3.0, done_ms=7.0),
    ]
    assert summary.exposed_comm_ms > 0, "the waits still count as exposed time"
    tracer.blocked(0, 1, a)  # after the drain: the step's records are gone, nothing to name
    assert tracer.drain().calls == []


def test_a_step_keeps_its_first_calls_and_counts_the_rest():
    tracer = CommTracer()
    tracer.max_calls = 3
    handles = [tracer.begin("broadcast", 8, 2) for _ in range(5)]
    for h in handles:
        tracer.end(h)
    tracer.blocked(0, 1, handles[4])  # a dropped one's wait: counted as exposed, listed nowhere
    summary = tracer.drain()
    assert [c.entry.seq for c in summary.calls] == [1, 2, 3] and summary.calls_dropped == 2
    again = tracer.drain()
    assert again.calls == [] and again.calls_dropped == 0
    assert CommTracer().max_calls == MAX_CALLS_PER_STEP


def test_a_long_group_name_is_cut_to_what_the_message_takes():
    tracer = CommTracer()
    group = ",".join(str(r) for r in range(0, 400, 3))
    tracer.end(tracer.begin("all_reduce", 4, 134, group))
    (record,) = call_records(tracer.drain().calls, 0)
    assert len(record.group) == MAX_GROUP_CHARS and record.group.endswith("…")
    msg = CollectiveCalls(step=1, calls=[record])
    assert decode(encode(msg)) == msg, "it decodes: within the bounds checked on entry"


def test_the_messages_bounds_are_checked_on_entry():
    from ringtop.protocol import InvalidMessageError, from_json_line

    too_many = b'{"type":"calls","v":1,"step":1,"calls":[' + b",".join(
        [b'["all_reduce","world",1,4,0.5]'] * (MAX_CALLS_PER_STEP + 1)) + b"]}"
    with pytest.raises(InvalidMessageError):
        from_json_line(too_many)
    with pytest.raises(InvalidMessageError):
        from_json_line(b'{"type":"calls","v":1,"step":1,"calls":[["all_reduce","world",-1,4,0.5]]}')
    ok = from_json_line(b'{"type":"calls","v":1,"step":2,"calls":[["p2p","p2p",3,8,0.5,1.0,null,null,false]]}')
    assert ok.calls[0].done_ms == 1.0 and ok.calls[0].wait_start_ms is None


def _received(sock: zmq.Socket, count: int, timeout_ms: int = 10_000) -> list:
    """`count` messages off the socket, each within the timeout (a bounded wait, never a sleep)."""
    out = []
    while len(out) < count:
        assert sock.poll(timeout_ms), f"{len(out)} of {count} messages arrived"
        frames = sock.recv_multipart()
        if len(frames) == 2:
            out.append(decode(frames[1]))
    return out


@pytest.mark.timeout(60)
def test_calls_go_to_the_log_and_never_to_the_socket_and_leave_no_gap_in_seq(tmp_path):
    address = f"tcp://127.0.0.1:{free_tcp_port()}"
    ctx = zmq.Context()
    inbox = ctx.socket(zmq.XSUB)
    inbox.bind(address)
    sender = Telemetry(rank=0, relay_address=address, log_dir=str(tmp_path), context=ctx)
    try:
        calls = CollectiveCalls(step=1, calls=[CollectiveCall(kind="all_reduce", group="world", seq=1, bytes=4,
                                                              issued_ms=0.5)])
        sender.emit(Heartbeat(step=1))
        # subscribe to everything, as the relay does, until the sender has seen it (else it only logs)
        poll_until(lambda: inbox.send(b"\x01") or sender._subscribed, 10, "the sender to see the subscription")
        sender.emit(calls)
        sender.emit(Heartbeat(step=2))
        sender.close(Bye(reason="done", ok=True))
        got = _received(inbox, 3)
        assert [type(m) for m in got] == [Heartbeat, Heartbeat, Bye]
        assert [m.seq for m in got] == [0, 1, 2], "no gap where the log-only message was"
        assert not inbox.poll(200), "nothing more on the wire"
    finally:
        inbox.close(linger=0)
        ctx.term()
    logged = read_log(tmp_path / "rank-0.jsonl", log_only=True)
    assert [type(m) for m in logged] == [Heartbeat, CollectiveCalls, Heartbeat, Bye]
    assert [type(m) for m in read_log(tmp_path / "rank-0.jsonl")] == [Heartbeat, Heartbeat, Bye], \
        "left out for the readers that want only what was sent"
    from ringtop.tui.sources.replay import load_replay

    replayed = load_replay(tmp_path)
    assert [type(m) for m in replayed.messages] == [Heartbeat, Heartbeat, Bye] and replayed.problems == []
    assert logged[1].seq == logged[0].seq and logged[1].calls == calls.calls
    forged = encode(CollectiveCalls(rank=0, step=1))
    assert real(b"calls.0", forged, None, None, None) is None, "a relay forwards none"
    assert real(b"heartbeat.0", encode(Heartbeat(rank=0, step=1)), None, None, None) is not None
