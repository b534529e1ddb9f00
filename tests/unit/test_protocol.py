"""The wire and disk contract: round trips for every message, every kind of bad input, commands,
endpoints, and one real ROUTER/DEALER exchange.

Expected values are written out by hand here (the wire maps, error codes, defaults), never taken
from the code under test, so a change to the contract makes these tests fail.
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import msgspec
import pytest
import zmq

from ringtop.protocol import (
    COMMANDS,
    IMMEDIATE_COMMANDS,
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    UI_RANK,
    BadArgumentsError,
    Bye,
    Command,
    CommStat,
    Digest,
    EndpointError,
    Endpoints,
    Event,
    GpuSample,
    GroupCursor,
    HangReport,
    Heartbeat,
    Hello,
    InFlight,
    InvalidMessageError,
    MalformedError,
    MemorySample,
    OversizeError,
    Prediction,
    ProtocolError,
    RankExit,
    RankLook,
    RecentSteps,
    Reply,
    Sample,
    Sharding,
    StageSpan,
    Stall,
    Step,
    StepBrief,
    Timeline,
    UnknownCommandError,
    UnknownTypeError,
    VersionError,
    check_bind_safe,
    decode,
    encode,
    free_tcp_port,
    from_json_line,
    parse_tcp,
    to_json_line,
    validate_command,
)
from ringtop.protocol.batch import MAX_BATCH_BYTES, MAX_BATCH_MESSAGES, decode_batch, encode_batch
from ringtop.protocol.codec import MAX_DEPTH
from ringtop.protocol.commands import CheckpointArgs, StatusArgs, StopArgs
from ringtop.protocol.endpoints import is_loopback, with_port
from ringtop.protocol.messages import MAX_WORLD_SIZE

README = Path(__file__).resolve().parents[2] / "protocol" / "README.md"

# ------------------------------------------------------------------ one full example of each type
# Each entry: the struct built in Python, and the wire map written out by hand. Every field holds
# a non-default value, so a field that is dropped, renamed or defaulted on decode is caught.

ENV = {"v": 1, "rank": 3, "seq": 41, "ts": 1767225600.125}

HELLO = Hello(
    rank=3, seq=41, ts=1767225600.125,
    run_id="7f3a", world_size=8, local_rank=3, host="node-a", pid=4242, backend="nccl",
    device="cuda:3", strategy="zero2", strategy_options={"overlap": True, "bucket_mb": 25},
    sharding=Sharding(params=False, grads=True, optimizer=True), dtype="bf16",
    optimizer_bytes_per_param=12, grad_clip=1.0, link_peak_gbps=450.0,
    link_peak_gbps_by_group={"tp": 450.0, "dp": 50.0},
    prediction=Prediction(
        params_bytes=50_000_000, grads_bytes=6_250_000, optimizer_bytes=37_500_000,
        comm_payload_bytes={"reduce_scatter": 50_000_000, "all_gather": 50_000_000},
        comm_sent_bytes=87_500_000, note="ceil(P/N) shards"),
    model="tiny-gpt", param_count=25_000_000, torch_version="2.13.0", ringtop_version="0.1.0", batch_size=16,
    seq_len=512, steps=1000, start_step=200, lr=3e-4, seed=17, device_mem_total_bytes=80 << 30,
    accelerator="NVIDIA H100 80GB HBM3", flops_per_token=1.5e8, flops_source="formula 6N+12LHS",
    peak_tflops=989.0, peak_source="H100 SXM bf16 dense", tflops_ceiling=989.0,
    tflops_ceiling_source="the dense bf16 peak (H100 SXM bf16 dense)",
    process_started_ts=1767225590.5, restart_count=2, max_restarts=3, restart_cause="rank 1: error: RuntimeError: x",
    publish="tcp://127.0.0.1:5555", control="tcp://127.0.0.1:5557",
    switch_unavailable={"zero1": "DeepSpeed is not installed"},
)
HELLO_WIRE = {
    **ENV, "type": "hello",
    "run_id": "7f3a", "world_size": 8, "local_rank": 3, "host": "node-a", "pid": 4242,
    "backend": "nccl", "device": "cuda:3", "strategy": "zero2",
    "strategy_options": {"overlap": True, "bucket_mb": 25},
    "sharding": {"params": False, "grads": True, "optimizer": True},
    "dtype": "bf16", "optimizer_bytes_per_param": 12, "grad_clip": 1.0, "link_peak_gbps": 450.0,
    "link_peak_gbps_by_group": {"tp": 450.0, "dp": 50.0},
    # zero2, 25M params on 8 ranks, bf16 params/grads, 12 optimizer bytes per param:
    # params 25e6 x 2; grads 25e6/8 x 2; optimizer 25e6/8 x 12; sent 2 x 7/8 x 50e6
    "prediction": {"params_bytes": 50000000, "grads_bytes": 6250000, "optimizer_bytes": 37500000,
                   "comm_payload_bytes": {"reduce_scatter": 50000000, "all_gather": 50000000},
                   "comm_payload_bytes_by_group": {}, "comm_sent_bytes": 87500000, "note": "ceil(P/N) shards"},
    "model": "tiny-gpt",
    "param_count": 25000000, "torch_version": "2.13.0", "ringtop_version": "0.1.0",
    "batch_size": 16, "seq_len": 512, "steps": 1000, "start_step": 200, "lr": 0.0003, "seed": 17,
    "device_mem_total_bytes": 85899345920, "accelerator": "NVIDIA H100 80GB HBM3",
    "flops_per_token": 1.5e8, "flops_source": "formula 6N+12LHS", "peak_tflops": 989.0,
    "peak_source": "H100 SXM bf16 dense", "tflops_ceiling": 989.0,
    "tflops_ceiling_source": "the dense bf16 peak (H100 SXM bf16 dense)", "process_started_ts": 1767225590.5,
    "restart_count": 2, "max_restarts": 3, "restart_cause": "rank 1: error: RuntimeError: x",
    "publish": "tcp://127.0.0.1:5555", "control": "tcp://127.0.0.1:5557",
    "switch_unavailable": {"zero1": "DeepSpeed is not installed"},
}

STEP = Step(
    rank=3, seq=41, ts=1767225600.125,
    step=1204, loss=2.91, step_ms=212.4, grad_norm=0.75, data_ms=1.5, forward_ms=60.25, backward_ms=120.5,
    optimizer_ms=9.75, exposed_comm_ms=18.5, comm_busy_ms=30.25, tokens=8192, tokens_per_s=41200.0,
    tflops=5.79, mem=MemorySample(params_bytes=100, grads_bytes=200, optimizer_bytes=400, rss_bytes=5000,
                     cuda_allocated_bytes=6000, cuda_reserved_bytes=7000, cuda_peak_bytes=6500,
                     cuda_peak_reserved_bytes=7500, cuda_alloc_retries=3, cuda_ooms=1),
    comm=[CommStat(kind="all_reduce", count=4, bytes=1 << 20, busy_ms=12.5, group_size=8, group="tp"),
          CommStat(kind="broadcast", count=1, bytes=64, busy_ms=0.25, group_size=8)],
    cpu_percent=98.5, drops=2, idle_ms=20.0, skipped=True,
    collectives=[GroupCursor(group="world", issued=412, completed=411, count=4, digest="9a0c13fe")],
)
STEP_WIRE = {
    **ENV, "type": "step",
    "step": 1204, "loss": 2.91, "step_ms": 212.4, "grad_norm": 0.75, "data_ms": 1.5, "forward_ms": 60.25,
    "backward_ms": 120.5, "optimizer_ms": 9.75, "exposed_comm_ms": 18.5, "comm_busy_ms": 30.25,
    "tokens": 8192, "tokens_per_s": 41200.0, "tflops": 5.79,
    "mem": {"params_bytes": 100, "grads_bytes": 200, "optimizer_bytes": 400, "rss_bytes": 5000,
            "cuda_allocated_bytes": 6000, "cuda_reserved_bytes": 7000, "cuda_peak_bytes": 6500,
            "cuda_peak_reserved_bytes": 7500, "cuda_alloc_retries": 3, "cuda_ooms": 1},
    "comm": [
        {"kind": "all_reduce", "count": 4, "bytes": 1048576, "busy_ms": 12.5, "group_size": 8, "group": "tp"},
        {"kind": "broadcast", "count": 1, "bytes": 64, "busy_ms": 0.25, "group_size": 8, "group": ""},
    ],
    "cpu_percent": 98.5, "drops": 2, "idle_ms": 20.0, "skipped": True,
    "collectives": [{"group": "world", "issued": 412, "completed": 411, "count": 4, "digest": "9a0c13fe"}],
}

SAMPLE = Sample(
    rank=3, seq=41, ts=1767225600.125,
    cpu_percent=97.0, rss_bytes=123456,
    gpu=GpuSample(index=3, name="NVIDIA H200", util_percent=88.5, mem_used_bytes=31 << 30,
                  mem_total_bytes=141 << 30, power_w=612.5, temperature_c=61.0,
                  pcie_tx_bytes_per_s=1.5e9, pcie_rx_bytes_per_s=0.5e9, pcie_generation=5, pcie_width=16,
                  nvlink_tx_bytes_per_s=300e9, nvlink_rx_bytes_per_s=290e9, nvlink_links=18, nvlink_version=4),
)
SAMPLE_WIRE = {
    **ENV, "type": "sample", "cpu_percent": 97.0, "rss_bytes": 123456,
    "gpu": {"index": 3, "name": "NVIDIA H200", "util_percent": 88.5, "mem_used_bytes": 33285996544,
            "mem_total_bytes": 151397597184, "power_w": 612.5, "temperature_c": 61.0,
            "pcie_tx_bytes_per_s": 1.5e9, "pcie_rx_bytes_per_s": 0.5e9, "pcie_generation": 5, "pcie_width": 16,
            "nvlink_tx_bytes_per_s": 300e9, "nvlink_rx_bytes_per_s": 290e9, "nvlink_links": 18,
            "nvlink_version": 4},
}

# GPipe, 2 stages, 2 micro-batches, stage 1's view of step 1204: F1 F2 then B1 B2, times in ms from the
# start of this stage's step window (a 70 ms window, 60 ms busy: bubble 1 - 60/70 = 1/7; theory
# (N-1)/(N+M-1) = 1/3). Each span is a 4-element array [micro_batch, op, start_ms, end_ms].
TIMELINE = Timeline(
    rank=3, seq=41, ts=1767225600.125,
    step=1204, stage=1, stages=2, micro_batches=2, schedule="gpipe", window_ms=70.0, window_start_ms=8_123_456.5,
    spans=[StageSpan(0, "F", 10.0, 20.0), StageSpan(1, "F", 20.0, 30.0),
           StageSpan(0, "B", 30.0, 50.0), StageSpan(1, "B", 50.0, 70.0)],
    bubble=0.142857, bubble_theory=0.333333,
)
TIMELINE_WIRE = {
    **ENV, "type": "timeline",
    "step": 1204, "stage": 1, "stages": 2, "micro_batches": 2, "schedule": "gpipe", "window_ms": 70.0,
    "window_start_ms": 8123456.5,
    "spans": [[0, "F", 10.0, 20.0], [1, "F", 20.0, 30.0], [0, "B", 30.0, 50.0], [1, "B", 50.0, 70.0]],
    "bubble": 0.142857, "bubble_theory": 0.333333,
}

HEARTBEAT = Heartbeat(rank=3, seq=41, ts=1767225600.125, step=1204, drops=7, queued=5)
HEARTBEAT_WIRE = {**ENV, "type": "heartbeat", "step": 1204, "drops": 7, "queued": 5}

EVENT = Event(rank=3, seq=41, ts=1767225600.125, level="error", kind="hang",
              text="rank 1 has not entered all_reduce #14", step=1200, data={"rank": 5, "over_median": 0.35},
              hang=HangReport(verdict="hang", culprits=[1], waiting=[0, 2, 3], group="world", seq=14,
                              collective="all_reduce", wait_s=41.5, step=1200))
EVENT_WIRE = {**ENV, "type": "event", "level": "error", "kind": "hang",
              "text": "rank 1 has not entered all_reduce #14", "step": 1200, "data": {"rank": 5, "over_median": 0.35},
              "hang": {"verdict": "hang", "culprits": [1], "waiting": [0, 2, 3], "group": "world", "seq": 14,
                       "collective": "all_reduce", "wait_s": 41.5, "step": 1200, "where": {}, "lasted_s": 0.0}}

STALL = Stall(rank=3, seq=41, ts=1767225600.125, state="snapshot", request="ui-7", step=1205, phase="forward",
              running_s=41.5, threshold_s=4.5, where="model.py:57 in forward",
              stack=["train.py:10 in main", "model.py:57 in forward"],
              in_flight=[InFlight(group="0-3", seq=412, kind="all_reduce", bytes=4 << 20, shapes="1b2c3d4e",
                                  age_s=41.25)],
              groups=[GroupCursor(group="0-3", issued=412, completed=411)], gone_peers=[2])
STALL_WIRE = {**ENV, "type": "stall", "state": "snapshot", "request": "ui-7", "step": 1205, "phase": "forward",
              "running_s": 41.5, "threshold_s": 4.5, "where": "model.py:57 in forward",
              "stack": ["train.py:10 in main", "model.py:57 in forward"],
              "in_flight": [{"group": "0-3", "seq": 412, "kind": "all_reduce", "bytes": 4194304,
                             "shapes": "1b2c3d4e", "age_s": 41.25}],
              "groups": [{"group": "0-3", "issued": 412, "completed": 411, "count": 0, "digest": ""}],
              "gone_peers": [2]}

BYE = Bye(rank=3, seq=41, ts=1767225600.125, reason="crashed", step=1205, ok=False)
BYE_WIRE = {**ENV, "type": "bye", "reason": "crashed", "step": 1205, "ok": False}

COMMAND = Command(rank=-1, seq=41, ts=1767225600.125, id="ui-1", cmd="checkpoint",
                  args={"kind": "full"})
COMMAND_WIRE = {**ENV, "rank": -1, "type": "command", "id": "ui-1", "cmd": "checkpoint",
                "args": {"kind": "full"}}

REPLY = Reply(rank=3, seq=41, ts=1767225600.125, id="ui-1", status="error", cmd="checkpoint",
              result={"step": 1205}, error="disk full", code="checkpoint_failed")
REPLY_WIRE = {**ENV, "type": "reply", "id": "ui-1", "status": "error", "cmd": "checkpoint",
              "result": {"step": 1205}, "error": "disk full", "code": "checkpoint_failed"}

DIGEST = Digest(rank=-1, seq=7, ts=1767225600.25, interval_s=0.25, steps=[STEP],
                briefs=[StepBrief(3, 1203, 1767225599.9, 214.0, None, 0.5, True)], briefs_dropped=1, relay_gaps=2,
                relay_skipped=7)
DIGEST_WIRE = {**ENV, "rank": -1, "seq": 7, "ts": 1767225600.25, "type": "digest", "interval_s": 0.25,
               "steps": [STEP_WIRE], "briefs": [[3, 1203, 1767225599.9, 214.0, None, 0.5, True]],
               "briefs_dropped": 1, "relay_gaps": 2, "relay_skipped": 7}

RECENT = RecentSteps(rank=-1, seq=2, ts=1767225600.5, briefs=[StepBrief(3, 1203, 1767225599.9, 214.0, 2.5, None)])
RECENT_WIRE = {**ENV, "rank": -1, "seq": 2, "ts": 1767225600.5, "type": "recent",
               "briefs": [[3, 1203, 1767225599.9, 214.0, 2.5, None, False]]}

EXIT = RankExit(rank=-1, seq=3, ts=1767225601.0, of_rank=1, pid=4242, host="node-b", how="killed by SIGKILL",
                detail="pid 4242, seen by its node's watcher", step=1203)
EXIT_WIRE = {**ENV, "rank": -1, "seq": 3, "ts": 1767225601.0, "type": "exit", "of_rank": 1, "pid": 4242,
             "host": "node-b", "how": "killed by SIGKILL", "detail": "pid 4242, seen by its node's watcher",
             "step": 1203}

LOOK = RankLook(seq=4, ts=1767225602.0, of_rank=3, pid=4243, host="node-b", state="S",
                words="stuck (alive, GIL held, CPU 0%) in sleep", silent_s=6.5)
LOOK_WIRE = {**ENV, "rank": -1, "seq": 4, "ts": 1767225602.0, "type": "look", "of_rank": 3, "pid": 4243,
             "host": "node-b", "state": "S", "words": "stuck (alive, GIL held, CPU 0%) in sleep", "silent_s": 6.5}

CASES = {
    "hello": (HELLO, HELLO_WIRE),
    "look": (LOOK, LOOK_WIRE),
    "exit": (EXIT, EXIT_WIRE),
    "recent": (RECENT, RECENT_WIRE),
    "digest": (DIGEST, DIGEST_WIRE),
    "step": (STEP, STEP_WIRE),
    "sample": (SAMPLE, SAMPLE_WIRE),
    "timeline": (TIMELINE, TIMELINE_WIRE),
    "heartbeat": (HEARTBEAT, HEARTBEAT_WIRE),
    "event": (EVENT, EVENT_WIRE),
    "stall": (STALL, STALL_WIRE),
    "bye": (BYE, BYE_WIRE),
    "command": (COMMAND, COMMAND_WIRE),
    "reply": (REPLY, REPLY_WIRE),
}
ALL_TYPES = sorted(CASES)


def mp(obj) -> bytes:
    """Bytes as a foreign client would send them: plain MessagePack of a plain map."""
    return msgspec.msgpack.encode(obj)


def base(type_: str, **fields) -> dict:
    return {"v": 1, "type": type_, **fields}


# ------------------------------------------------------------------ constants


def test_constants():
    assert PROTOCOL_VERSION == 1
    assert UI_RANK == -1
    assert MAX_FRAME_BYTES == 1_048_576


def test_cases_cover_every_type_and_every_field():
    assert set(CASES) == {"hello", "step", "sample", "timeline", "heartbeat", "event", "stall", "bye", "command",
                          "reply", "digest", "recent", "exit", "look"}
    for name, (msg, wire) in CASES.items():
        fields = set(msg.__struct_fields__) | {"type"}
        assert set(wire) == fields, f"{name}: fixture and struct disagree on fields"
    # every optional top-level field is set to something other than its default
    fresh = {
        "hello": Hello(run_id="x", world_size=1), "step": Step(step=0, loss=0.0, step_ms=0.0),
        "sample": Sample(), "heartbeat": Heartbeat(),
        "timeline": Timeline(step=0, stage=0, stages=0, micro_batches=0), "event": Event(), "bye": Bye(),
        "stall": Stall(),
        "command": Command(id="", cmd=""), "reply": Reply(id="", status="ack"), "digest": Digest(interval_s=1.0),
        "recent": RecentSteps(), "exit": RankExit(of_rank=0), "look": RankLook(of_rank=0),
    }
    for name, (msg, _) in CASES.items():
        for f in msg.__struct_fields__:
            if f in ("v",) or (name == "hello" and f in ("run_id", "world_size")):
                continue
            if name in ("command", "reply") and f in ("id", "cmd", "status"):
                continue
            if name == "step" and f in ("step", "loss", "step_ms"):
                continue
            if name == "timeline" and f in ("step", "stage", "stages", "micro_batches"):
                continue
            if name in ("exit", "look") and f in ("rank", "of_rank"):  # the watchers': UI_RANK is their default
                continue
            assert getattr(msg, f) != getattr(fresh[name], f), f"{name}.{f} is left at its default"


# ------------------------------------------------------------------ round trips


@pytest.mark.parametrize("name", ALL_TYPES)
def test_msgpack_round_trip(name):
    msg, wire = CASES[name]
    data = encode(msg)
    assert isinstance(data, bytes)
    # the bytes are a plain MessagePack map with exactly the documented keys and values
    assert msgspec.msgpack.decode(data) == wire
    back = decode(data)
    assert type(back) is type(msg)
    assert back == msg
    # and a map written by any other MessagePack library decodes to the same message
    assert decode(mp(wire)) == msg


@pytest.mark.parametrize("name", ALL_TYPES)
def test_json_line_round_trip(name):
    msg, wire = CASES[name]
    line = to_json_line(msg)
    assert isinstance(line, bytes)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == wire
    back = from_json_line(line)
    assert type(back) is type(msg)
    assert back == msg
    # str input, a line written by another JSON library, and a CRLF ending all decode the same
    assert from_json_line(line.decode()) == msg
    assert from_json_line(json.dumps(wire)) == msg
    assert from_json_line(json.dumps(wire) + "\r\n") == msg


def test_json_wire_bytes_are_compact_and_type_first():
    line = to_json_line(Heartbeat(rank=1, seq=2, ts=3.5, step=4, drops=5, queued=6))
    assert line == (b'{"type":"heartbeat","v":1,"rank":1,"seq":2,"ts":3.5,'
                    b'"step":4,"drops":5,"queued":6}\n')


def test_defaults_fill_omitted_fields():
    msg = decode(mp({"v": 1, "type": "step", "step": 5, "loss": 1.25, "step_ms": 10.0}))
    assert msg == Step(step=5, loss=1.25, step_ms=10.0)
    assert (msg.rank, msg.seq, msg.ts) == (0, 0, 0.0)
    assert msg.mem == MemorySample(params_bytes=0, grads_bytes=0, optimizer_bytes=0)
    assert msg.comm == [] and msg.drops == 0
    assert msg.tflops == 0.0  # an older agent's Step: no TFLOP/s known
    old = from_json_line(json.dumps({"type": "step", "v": 1, "step": 1, "loss": 1.0, "step_ms": 1.0,
                                     "comm": [{"kind": "all_reduce", "bytes": 8, "group_size": 2}]}))
    assert old.comm == [CommStat(kind="all_reduce", bytes=8, group_size=2, group="")]  # a log before `group`
    ev = decode(mp(base("event")))
    assert (ev.level, ev.kind, ev.text, ev.step, ev.data) == ("info", "", "", -1, {})
    bye = decode(mp(base("bye")))
    assert (bye.reason, bye.step, bye.ok) == ("", 0, True)
    sample = decode(mp(base("sample")))
    assert sample.gpu is None
    hello = decode(mp(base("hello", run_id="r", world_size=2)))
    assert hello.sharding == Sharding(params=False, grads=False, optimizer=False)
    assert hello.strategy_options == {}
    assert (hello.dtype, hello.optimizer_bytes_per_param, hello.grad_clip) == ("fp32", 8, 0.0)
    assert hello.prediction is None
    assert (hello.flops_per_token, hello.peak_tflops, hello.accelerator) == (0.0, 0.0, "")
    pred = decode(mp(base("hello", run_id="r", world_size=2, prediction={}))).prediction
    assert pred == Prediction(params_bytes=0, grads_bytes=0, optimizer_bytes=0, comm_payload_bytes={},
                              comm_sent_bytes=0, note="")


def test_hello_without_prediction_round_trips_as_nil():
    msg = Hello(run_id="r", world_size=2, prediction=None)
    assert msgspec.msgpack.decode(encode(msg))["prediction"] is None
    assert json.loads(to_json_line(msg))["prediction"] is None
    assert decode(encode(msg)) == msg
    assert from_json_line(to_json_line(msg)) == msg


def test_sample_without_gpu_round_trips_as_nil():
    msg = Sample(rank=1, cpu_percent=5.0, rss_bytes=10, gpu=None)
    assert msgspec.msgpack.decode(encode(msg))["gpu"] is None
    assert json.loads(to_json_line(msg))["gpu"] is None
    assert decode(encode(msg)) == msg
    assert from_json_line(to_json_line(msg)) == msg


def test_timeline_spans_are_four_element_arrays():
    line = to_json_line(Timeline(rank=1, step=7, stage=1, stages=2, micro_batches=1, window_ms=3.5,
                                 spans=[StageSpan(0, "F", 0.5, 1.5), StageSpan(0, "B", 2.0, 3.5)]))
    assert b'"spans":[[0,"F",0.5,1.5],[0,"B",2.0,3.5]]' in line
    assert msgspec.msgpack.decode(encode(TIMELINE))["spans"][0] == [0, "F", 10.0, 20.0]
    # ints are fine for the times; an element past the fourth (a later protocol's) is ignored
    msg = decode(mp(base("timeline", step=1, stage=0, stages=2, micro_batches=1,
                         spans=[[0, "F", 0, 2, "later"], [0, "B", 2, 5.5]])))
    assert msg.spans == [StageSpan(micro_batch=0, op="F", start_ms=0.0, end_ms=2.0),
                         StageSpan(micro_batch=0, op="B", start_ms=2.0, end_ms=5.5)]


def test_timeline_and_idle_defaults():
    msg = decode(mp(base("timeline", step=3, stage=0, stages=4, micro_batches=8)))
    assert msg == Timeline(step=3, stage=0, stages=4, micro_batches=8)
    assert (msg.schedule, msg.window_ms, msg.window_start_ms, msg.spans, msg.bubble, msg.bubble_theory) == \
        ("", 0.0, 0.0, [], 0.0, 0.0)
    assert decode(mp(base("step", step=1, loss=1.0, step_ms=2.0))).idle_ms == 0.0


def test_foreign_client_liberties_are_accepted():
    # key order does not matter, ints are fine for float fields, float32 is fine
    assert decode(mp({"rank": 2, "ts": 5, "type": "heartbeat", "v": 1})) == Heartbeat(rank=2, ts=5.0)
    float32_map = b"\x83\xa1v\x01\xa4type\xa3bye\xa2ts\xca\x3f\xc0\x00\x00"  # ts = 1.5 as float32
    assert decode(float32_map) == Bye(ts=1.5)
    assert from_json_line('{"ts":7,"type":"bye","v":1}') == Bye(ts=7.0)


@pytest.mark.parametrize("field, value", [("loss", float("nan")), ("step_ms", float("inf")),
                                          ("grad_norm", -float("inf")), ("idle_ms", 1e300)])
def test_non_finite_and_absurd_floats_are_refused_at_decode(field, value):
    """MessagePack can carry NaN and infinities (JSON cannot); a receiver refuses them, naming the field."""
    fields = {"step": 1, "loss": 1.0, "step_ms": 1.0, field: value}
    with pytest.raises(InvalidMessageError, match=rf"\$\.{field}"):
        decode(mp(base("step", **fields)))


@pytest.mark.parametrize("fields, where", [
    ({"step": -1}, "step"), ({"drops": -5}, "drops"), ({"rank": 1 << 20}, "rank"), ({"rank": -2}, "rank"),
    ({"mem": {"rss_bytes": -1}}, "mem.rss_bytes"), ({"comm": [{"kind": "x", "bytes": -3}]}, r"comm\[0\]\.bytes"),
])
def test_negative_counters_and_impossible_ranks_are_refused_at_decode(fields, where):
    with pytest.raises(InvalidMessageError, match=rf"\$\.{where}"):
        decode(mp(base("step", **{"step": 1, "loss": 1.0, "step_ms": 1.0, **fields})))


def test_a_world_size_beyond_any_cluster_is_refused():
    with pytest.raises(InvalidMessageError, match=r"\$\.world_size"):
        decode(mp(base("hello", run_id="r", world_size=1_000_000_000)))
    assert decode(mp(base("hello", run_id="r", world_size=MAX_WORLD_SIZE))).world_size == MAX_WORLD_SIZE


def test_a_non_finite_loss_travels_as_null_on_wire_and_disk():
    line = to_json_line(Step(step=1, loss=None, step_ms=1.0))
    assert b'"loss":null' in line
    assert from_json_line(line).loss is None
    assert decode(encode(Step(step=1, loss=None, step_ms=1.0))).loss is None


# ------------------------------------------------------------------ forward compatibility


def test_unknown_fields_are_ignored_at_every_level():
    wire = json.loads(json.dumps(STEP_WIRE))
    wire["future_top"] = {"anything": [1, 2, 3]}
    wire["mem"]["future_mem"] = 1
    wire["comm"][0]["future_comm"] = "x"
    assert decode(mp(wire)) == STEP
    assert from_json_line(json.dumps(wire)) == STEP

    hello = json.loads(json.dumps(HELLO_WIRE))
    hello["sharding"]["future_sharding"] = True
    hello["prediction"]["future_prediction"] = [1]
    hello["new_field"] = 1.5
    assert decode(mp(hello)) == HELLO

    sample = json.loads(json.dumps(SAMPLE_WIRE))
    sample["gpu"]["fan_percent"] = 40.0
    assert decode(mp(sample)) == SAMPLE


# ------------------------------------------------------------------ bad input


def raises(exc_type, data, *, via=decode, match=None):
    with pytest.raises(exc_type) as info:
        via(data)
    err = info.value
    assert isinstance(err, ProtocolError) and isinstance(err, ValueError)
    assert err.message == str(err) and err.message
    if match is not None:
        assert re.search(match, err.message), err.message
    return err


def test_error_codes_are_stable():
    expected = {
        ProtocolError: "protocol_error",
        OversizeError: "oversize",
        MalformedError: "malformed",
        VersionError: "bad_version",
        UnknownTypeError: "unknown_type",
        InvalidMessageError: "invalid",
        UnknownCommandError: "unknown_command",
        BadArgumentsError: "bad_arguments",
    }
    for cls, code in expected.items():
        assert cls.code == code
        assert issubclass(cls, ProtocolError)
        assert cls("x").code == code


@pytest.mark.parametrize("data", [
    b"\xc1",                          # an opcode MessagePack never uses
    b"\xc1\xc1\xc1garbage",
    b"\xff\x00\x13\x37" * 8,
    b"",
])
def test_garbage_bytes_are_malformed(data):
    raises(MalformedError, data, match="MessagePack")


def test_truncated_msgpack_is_malformed():
    data = encode(STEP)
    for cut in (1, len(data) // 2, len(data) - 1):
        raises(MalformedError, data[:cut], match="truncated")


@pytest.mark.parametrize("value", [5, -1, 1.5, "step", [1, 2], [{"v": 1, "type": "bye"}], None, True])
def test_non_map_is_malformed(value):
    raises(MalformedError, mp(value), match="not a MessagePack map")
    raises(MalformedError, json.dumps(value), via=from_json_line, match="not a JSON map")


@pytest.mark.parametrize("v", [2, 0, -1, "1", 1.5, None, True, 1.0])
def test_wrong_version(v):
    wire = dict(BYE_WIRE, v=v)
    err = raises(VersionError, mp(wire), match="version")
    assert repr(v) in err.message and "1" in err.message
    raises(VersionError, json.dumps(wire), via=from_json_line, match=re.escape(repr(v)))


def test_wrong_version_wins_over_other_faults():
    # a future version may change fields and types; say "version", not "field X is wrong"
    raises(VersionError, mp({"v": 2, "type": "step", "step": "later"}), match="2")
    raises(VersionError, mp({"v": 2, "type": "telemetry-v2"}), match="2")


def test_missing_version_is_rejected():
    wire = dict(HEARTBEAT_WIRE)
    del wire["v"]
    err = raises(VersionError, mp(wire), match="version")
    assert "`v`" in err.message
    raises(VersionError, json.dumps(wire), via=from_json_line, match="`v`")


@pytest.mark.parametrize("extra", [0, 20])  # a fixmap, a map16
def test_missing_version_is_rejected_in_msgspecs_key_order_too(extra):
    """The tag first, then the envelope: the order msgspec writes, where decode looks for `v` at once."""
    fields = {f"x{i}": i for i in range(extra)}
    assert decode(mp({"type": "heartbeat", "v": 1, "rank": 1, **fields})) == Heartbeat(rank=1)
    raises(VersionError, mp({"type": "heartbeat", "rank": 1, **fields}), match="`v`")
    raises(VersionError, mp({"type": "heartbeat", "x": {"v": 1}, **fields}), match="`v`")


def test_a_batch_holds_messages_in_order_and_anything_else_is_no_batch():
    messages = [[b"step.1", encode(Step(rank=1, step=i, loss=1.0, step_ms=1.0))] for i in range(3)]
    assert decode_batch(encode_batch(messages)) == [frame for m in messages for frame in m]
    assert decode_batch(encode_batch([])) == []
    too_many = [[b"t", b"m"]] * (MAX_BATCH_MESSAGES + 1)
    for frame in (b"\xc1", mp([b"step.1"]), mp([1, 2]), mp({"a": b"b"}), encode_batch(too_many),
                  mp([b"t", b"x" * MAX_BATCH_BYTES])):
        assert decode_batch(frame) is None


@pytest.mark.parametrize("type_", ["nope", "STEP", "", 7])
def test_unknown_type(type_):
    err = raises(UnknownTypeError, mp({"v": 1, "type": type_}), match="unknown message type")
    assert repr(type_) in err.message
    # the message lists what is known, so the sender can see the mistake
    for known in ("bye", "command", "event", "heartbeat", "hello", "reply", "sample", "step", "timeline"):
        assert known in err.message
    raises(UnknownTypeError, json.dumps({"v": 1, "type": type_}), via=from_json_line)


def test_missing_type():
    raises(UnknownTypeError, mp({"v": 1, "rank": 0}), match="None")


@pytest.mark.parametrize("type_, wire, field", [
    ("step", {"loss": 1.0, "step_ms": 1.0}, "step"),
    ("step", {"step": 1, "step_ms": 1.0}, "loss"),
    ("step", {"step": 1, "loss": 1.0}, "step_ms"),
    ("hello", {"world_size": 2}, "run_id"),
    ("hello", {"run_id": "r"}, "world_size"),
    ("command", {"cmd": "status"}, "id"),
    ("command", {"id": "1"}, "cmd"),
    ("reply", {"id": "1"}, "status"),
    ("reply", {"status": "ack"}, "id"),
    ("step", {"step": 1, "loss": 1.0, "step_ms": 1.0, "comm": [{"count": 1}]}, "kind"),
    ("timeline", {"stage": 0, "stages": 2, "micro_batches": 4}, "step"),
    ("timeline", {"step": 1, "stages": 2, "micro_batches": 4}, "stage"),
    ("timeline", {"step": 1, "stage": 0, "micro_batches": 4}, "stages"),
    ("timeline", {"step": 1, "stage": 0, "stages": 2}, "micro_batches"),
])
def test_missing_required_field(type_, wire, field):
    err = raises(InvalidMessageError, mp(base(type_, **wire)), match="missing required field")
    assert f"`{field}`" in err.message
    assert repr(type_) in err.message
    raises(InvalidMessageError, json.dumps(base(type_, **wire)), via=from_json_line,
           match=f"`{field}`")


@pytest.mark.parametrize("type_, fields, path", [
    ("step", {"step": "12", "loss": 1.0, "step_ms": 1.0}, r"\$\.step"),
    ("step", {"step": 1, "loss": "high", "step_ms": 1.0}, r"\$\.loss"),
    ("step", {"step": 1, "loss": 1.0, "step_ms": 1.0, "comm": {"kind": "x"}}, r"\$\.comm"),
    ("step", {"step": 1, "loss": 1.0, "step_ms": 1.0, "comm": [{"kind": 3}]}, r"\$\.comm\[0\]\.kind"),
    ("step", {"step": 1, "loss": 1.0, "step_ms": 1.0, "mem": {"rss_bytes": 1.5}}, r"\$\.mem\.rss_bytes"),
    ("heartbeat", {"rank": "0"}, r"\$\.rank"),
    ("heartbeat", {"seq": 1.0}, r"\$\.seq"),
    ("heartbeat", {"ts": "now"}, r"\$\.ts"),
    ("bye", {"ok": 1}, r"\$\.ok"),
    ("event", {"level": "fatal"}, r"\$\.level"),
    ("event", {"data": [1]}, r"\$\.data"),
    ("reply", {"id": "1", "status": "maybe"}, r"\$\.status"),
    ("command", {"id": 5, "cmd": "status"}, r"\$\.id"),
    ("command", {"id": "1", "cmd": "status", "args": "now"}, r"\$\.args"),
    ("sample", {"gpu": 3}, r"\$\.gpu"),
    ("hello", {"run_id": "r", "world_size": 2, "sharding": {"params": "yes"}}, r"\$\.sharding\.params"),
    ("hello", {"run_id": "r", "world_size": 2, "dtype": 16}, r"\$\.dtype"),
    ("hello", {"run_id": "r", "world_size": 2, "optimizer_bytes_per_param": 8.5}, r"\$\.optimizer_bytes_per_param"),
    ("hello", {"run_id": "r", "world_size": 2, "prediction": 5}, r"\$\.prediction"),
    ("hello", {"run_id": "r", "world_size": 2, "prediction": {"comm_payload_bytes": {"all_gather": 1.5}}},
     r"\$\.prediction\.comm_payload_bytes"),
    ("step", {"step": 1, "loss": 1.0, "step_ms": 1.0, "idle_ms": "none"}, r"\$\.idle_ms"),
    ("timeline", {"step": 1, "stage": 0, "stages": 2, "micro_batches": 1, "window_ms": "long"}, r"\$\.window_ms"),
    # a span is an array [micro_batch, op, start_ms, end_ms], not a map; op is "F" or "B"
    ("timeline", {"step": 1, "stage": 0, "stages": 2, "micro_batches": 1,
                  "spans": [{"micro_batch": 0, "op": "F", "start_ms": 0.0, "end_ms": 1.0}]}, r"\$\.spans\[0\]"),
    ("timeline", {"step": 1, "stage": 0, "stages": 2, "micro_batches": 1, "spans": [[0, "W", 0.0, 1.0]]},
     r"\$\.spans\[0\]\[1\]"),
    ("timeline", {"step": 1, "stage": 0, "stages": 2, "micro_batches": 1, "spans": [[0, "F", 0.0]]},
     r"\$\.spans\[0\]"),
    ("timeline", {"step": 1, "stage": 0, "stages": 2, "micro_batches": 1, "spans": [["0", "F", 0.0, 1.0]]},
     r"\$\.spans\[0\]\[0\]"),
])
def test_wrong_field_type(type_, fields, path):
    err = raises(InvalidMessageError, mp(base(type_, **fields)), match=path)
    assert err.message.startswith(f"invalid '{type_}' message")
    assert "Expected" in err.message or "Invalid" in err.message
    raises(InvalidMessageError, json.dumps(base(type_, **fields)), via=from_json_line, match=path)


def test_msgpack_bin_is_not_a_string():
    raises(InvalidMessageError, mp(base("command", id=b"ui-1", cmd="status")), match=r"\$\.id")


def _event_of_encoded_size(n: int, fmt: str) -> bytes:
    """An Event whose encoding is exactly n bytes (text sized to fit)."""
    enc = encode if fmt == "msgpack" else (lambda m: to_json_line(m).rstrip(b"\n"))
    probe = 1 << 19  # same string-length header size as the final text
    overhead = len(enc(Event(text="x" * probe))) - probe
    data = enc(Event(text="x" * (n - overhead)))
    assert len(data) == n
    return data


def test_oversize_msgpack():
    over = _event_of_encoded_size(1_048_577, "msgpack")
    err = raises(OversizeError, over, match="1048577")
    assert "1048576" in err.message
    at_limit = _event_of_encoded_size(1_048_576, "msgpack")
    assert decode(at_limit).text == "x" * len(decode(at_limit).text)
    assert isinstance(decode(at_limit), Event)
    under = _event_of_encoded_size(1_048_575, "msgpack")
    assert isinstance(decode(under), Event)


def test_oversize_is_checked_before_parsing():
    raises(OversizeError, b"\xc1" * 1_048_577)
    raises(OversizeError, "x" * 1_048_577, via=from_json_line)


def test_oversize_json_line():
    over = _event_of_encoded_size(1_048_577, "json")
    raises(OversizeError, over + b"\n", via=from_json_line, match="1048577")
    at_limit = _event_of_encoded_size(1_048_576, "json")
    assert isinstance(from_json_line(at_limit + b"\n"), Event)  # the newline is not counted


def test_max_bytes_can_be_lowered():
    data = encode(STEP)
    raises(OversizeError, data, via=lambda d: decode(d, max_bytes=len(data) - 1))
    assert decode(data, max_bytes=len(data)) == STEP


def test_json_torn_line():
    line = to_json_line(STEP)
    for cut in (1, 10, len(line) // 2, len(line) - 2):
        raises(MalformedError, line[:cut], via=from_json_line, match="JSON")
    raises(MalformedError, b"", via=from_json_line)
    raises(MalformedError, b'{"v":1,"type":"bye"}{"v":1', via=from_json_line)  # two glued lines
    raises(MalformedError, b"not json at all\n", via=from_json_line)


# ------------------------------------------------------------------ commands


def cmd(name, **args):
    return Command(rank=-1, id="c-1", cmd=name, args=args)


def test_command_table():
    assert set(COMMANDS) == {"status", "checkpoint", "stop", "switch", "set", "profile", "stacks", "dump"}
    assert IMMEDIATE_COMMANDS == {"status", "stacks", "dump"}


def test_validate_good_commands():
    assert validate_command(cmd("status")) == StatusArgs()
    assert validate_command(cmd("checkpoint", kind="full")).kind == "full"
    assert validate_command(cmd("checkpoint")).kind == "full"
    assert isinstance(validate_command(cmd("checkpoint")), CheckpointArgs)
    assert validate_command(cmd("stop", reason="enough")).reason == "enough"
    assert validate_command(cmd("stop")).reason == "stopped by user"
    assert isinstance(validate_command(cmd("stop")), StopArgs)
    sharded = validate_command(cmd("checkpoint", kind="sharded", **{"async": True}))
    assert (sharded.kind, sharded.background) == ("sharded", True)
    switch = validate_command(cmd("switch", strategy="fsdp", fsdp_sharding="grad-op"))
    assert (switch.strategy, switch.fsdp_sharding, switch.ds_config) == ("fsdp", "grad-op", None)
    assert validate_command(cmd("set", micro_batches=8)).micro_batches == 8
    assert validate_command(cmd("profile")).steps == 3


def test_validate_command_after_the_wire():
    # args decoded from MessagePack are validated the same way as args built in Python
    c = decode(mp(base("command", id="x", cmd="stop", args={"reason": "wire"})))
    assert validate_command(c).reason == "wire"


@pytest.mark.parametrize("name", ["explode", "", "STATUS", "checkpoint "])
def test_unknown_command(name):
    err = raises(UnknownCommandError, cmd(name), via=validate_command, match="unknown command")
    assert repr(name) in err.message
    assert "checkpoint, dump, profile, set, stacks, status, stop, switch" in err.message
    assert err.code == "unknown_command"


@pytest.mark.parametrize("name, args, unknown", [
    ("status", {"force": True}, "force"),
    ("checkpoint", {"kind": "full", "path": "/tmp"}, "path"),
    ("stop", {"now": 1}, "now"),
])
def test_unknown_argument(name, args, unknown):
    err = raises(BadArgumentsError, cmd(name, **args), via=validate_command, match=f"`{unknown}`")
    assert f"bad arguments for '{name}'" in err.message
    assert err.code == "bad_arguments"


@pytest.mark.parametrize("name, args, path", [
    ("checkpoint", {"kind": 1}, r"\$\.kind"),
    ("checkpoint", {"kind": "half"}, r"\$\.kind"),
    ("checkpoint", {"async": "yes"}, r"\$\.async"),
    ("switch", {"strategy": "zero9"}, r"\$\.strategy"),
    ("switch", {"strategy": "fsdp", "fsdp_sharding": "half"}, r"\$\.fsdp_sharding"),
    ("set", {"micro_batches": 0}, r"\$\.micro_batches"),
    ("profile", {"steps": 101}, r"\$\.steps"),
    ("stop", {"reason": 5}, r"\$\.reason"),
    ("stop", {"reason": None}, r"\$\.reason"),
])
def test_wrong_argument_type(name, args, path):
    err = raises(BadArgumentsError, cmd(name, **args), via=validate_command, match=path)
    assert f"bad arguments for '{name}'" in err.message


# ------------------------------------------------------------------ endpoints


def test_default_endpoints():
    e = Endpoints()
    assert e.publish == "tcp://127.0.0.1:5555"
    assert e.relay == "tcp://127.0.0.1:5556"
    assert e.control == "tcp://127.0.0.1:5557"


@pytest.mark.parametrize("address, expected", [
    ("tcp://127.0.0.1:5555", ("127.0.0.1", 5555)),
    ("tcp://localhost:1", ("localhost", 1)),
    ("tcp://node-a.example.org:65535", ("node-a.example.org", 65535)),
    ("tcp://[::1]:5557", ("::1", 5557)),
    ("tcp://0.0.0.0:5556", ("0.0.0.0", 5556)),
])
def test_parse_tcp_good(address, expected):
    assert parse_tcp(address) == expected


@pytest.mark.parametrize("address", [
    "127.0.0.1:5555", "udp://127.0.0.1:5555", "ipc:///tmp/ringtop", "tcp://127.0.0.1",
    "tcp://:5555", "tcp://127.0.0.1:port", "tcp://127.0.0.1:70000", "", "tcp://",
])
def test_parse_tcp_bad(address):
    with pytest.raises(EndpointError) as info:
        parse_tcp(address)
    assert "tcp://HOST:PORT" in str(info.value)
    assert repr(address) in str(info.value)


def test_with_port():
    assert with_port("tcp://127.0.0.1:5555", 6000) == "tcp://127.0.0.1:6000"
    assert with_port("tcp://[::1]:5555", 6000) == "tcp://[::1]:6000"
    assert parse_tcp(with_port("tcp://[::1]:5555", 6000)) == ("::1", 6000)


@pytest.mark.parametrize("address", [
    "tcp://127.0.0.1:5555", "tcp://localhost:5555", "tcp://[::1]:5555", "tcp://127.0.0.2:5555",
])
def test_check_bind_safe_allows_loopback(address):
    check_bind_safe(address, allow_remote=False)
    check_bind_safe(address, allow_remote=True)


@pytest.mark.parametrize("address", [
    "tcp://0.0.0.0:5555", "tcp://203.0.113.7:5555", "tcp://8.8.8.8:5557", "tcp://[::]:5555",
    "tcp://*:5555", "tcp://node-a:5555", "tcp://192.168.1.10:5555",
])
def test_check_bind_safe_refuses_remote(address):
    with pytest.raises(EndpointError) as info:
        check_bind_safe(address, allow_remote=False)
    text = str(info.value)
    assert address in text and "ssh -L" in text and "--allow-remote" in text
    check_bind_safe(address, allow_remote=True)  # the user's explicit choice


def test_check_bind_safe_rejects_bad_address_even_when_remote_allowed():
    with pytest.raises(EndpointError):
        check_bind_safe("0.0.0.0:5555", allow_remote=True)


def test_is_loopback():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1") and not is_loopback("*")


def test_free_tcp_port_is_bindable():
    port = free_tcp_port()
    assert isinstance(port, int) and 1024 <= port <= 65535
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))


# ------------------------------------------------------------------ a real exchange


def _recv(sock: zmq.Socket, timeout_ms: int = 5000) -> list[bytes]:
    assert sock.poll(timeout_ms, zmq.POLLIN), "no message within the timeout"
    return sock.recv_multipart()


@pytest.mark.timeout(30)
def test_router_dealer_exchange_on_loopback():
    address = f"tcp://127.0.0.1:{free_tcp_port()}"
    check_bind_safe(address, allow_remote=False)
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    dealer = ctx.socket(zmq.DEALER)
    try:
        for s in (router, dealer):
            s.setsockopt(zmq.LINGER, 0)
        router.bind(address)
        dealer.connect(address)

        sent = Command(rank=UI_RANK, seq=1, ts=1767225600.5, id="ui-42", cmd="stop",
                       args={"reason": "test over"})
        dealer.send(encode(sent))

        # server side: [identity, payload], one payload frame
        frames = _recv(router)
        assert len(frames) == 2
        identity, payload = frames
        got = decode(payload)
        assert got == sent
        assert validate_command(got).reason == "test over"
        router.send_multipart([identity, encode(Reply(id=got.id, status="ack", cmd=got.cmd))])
        router.send_multipart([identity, encode(
            Reply(id=got.id, status="done", cmd=got.cmd, result={"step": 7}))])

        # a frame that does not decode gets an error reply with id ""
        dealer.send(b"\xc1 not msgpack")
        identity2, bad = _recv(router)
        assert identity2 == identity
        try:
            decode(bad)
        except ProtocolError as exc:
            router.send_multipart([identity, encode(
                Reply(id="", status="error", error=exc.message, code=exc.code))])

        # client side: single-frame replies, in order
        replies = []
        for _ in range(3):
            frames = _recv(dealer)
            assert len(frames) == 1
            replies.append(decode(frames[0]))
        assert [(r.id, r.status) for r in replies] == [("ui-42", "ack"), ("ui-42", "done"), ("", "error")]
        assert replies[1].result == {"step": 7}
        assert replies[2].code == "malformed"
        assert all(isinstance(r, Reply) and r.rank == 0 for r in replies)
    finally:
        dealer.close(0)
        router.close(0)
        ctx.term()


# ------------------------------------------------------------------ the README stays in step


def test_readme_documents_every_type_field_and_code():
    text = README.read_text()
    for name, (msg, _) in CASES.items():
        assert f"`{name}`" in text, name
        for f in msg.__struct_fields__:
            assert f"`{f}`" in text, f"{name}.{f} missing from protocol/README.md"
    for nested in (MemorySample, CommStat, GpuSample, Sharding, Prediction, StageSpan, HangReport):
        for f in nested.__struct_fields__:
            assert f"`{f}`" in text, f"{nested.__name__}.{f} missing from protocol/README.md"
    for code in ("oversize", "malformed", "bad_version", "unknown_type", "invalid",
                 "unknown_command", "bad_arguments"):
        assert f"`{code}`" in text
    for cmd_name in ("status", "checkpoint", "stop", "switch", "set", "profile"):
        assert f"`{cmd_name}`" in text
    assert "ssh -L 5555:127.0.0.1:5555 -L 5557:127.0.0.1:5557" in text


def test_read_log_returns_the_decodable_messages_and_skips_a_torn_line(tmp_path):
    from ringtop.protocol import read_log

    path = tmp_path / "rank-0.jsonl"
    path.write_bytes(to_json_line(STEP) + b"not json\n" + to_json_line(HEARTBEAT) + b'{"type":"st')
    assert read_log(path) == [STEP, HEARTBEAT]
    assert read_log(tmp_path / "missing.jsonl") == []


# ------------------------------------------------------------------ nesting


def nested(depth: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"k": value}
    return value


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 200, 1000, 100_000])
def test_deep_nesting_is_refused_without_recursion(depth):
    """A 3 KB frame nested 1000 deep once killed the control thread with a RecursionError."""
    frame = (b"\x85" + mp("v") + mp(1) + mp("type") + mp("command") + mp("id") + mp("d") + mp("cmd") + mp("status")
             + mp("args") + b"\x81\xa1k" * depth + b"\x01")  # by hand: an encoder would recurse itself
    with pytest.raises(MalformedError, match="nested deeper than"):
        decode(frame)
    # deep after a field that is already invalid (the diagnosis re-reads the frame), and deep in `type`
    bad_id_first = (b"\x85" + mp("v") + mp(1) + mp("type") + mp("command") + mp("id") + mp(5) + mp("cmd")
                    + mp("status") + mp("args") + b"\x81\xa1k" * depth + b"\x01")
    deep_type = b"\x83" + mp("v") + mp(1) + mp("type") + b"\x81\xa1k" * depth + b"\x01" + mp("x") + mp(1)
    for other in (bad_id_first, deep_type):
        with pytest.raises((MalformedError, InvalidMessageError, UnknownTypeError)):
            decode(other)
    line = b'{"v":1,"type":"event","data":' + b'{"k":' * depth + b"1" + b"}" * depth + b"}"
    with pytest.raises(MalformedError, match="nested deeper than"):
        from_json_line(line, max_bytes=len(line))


def test_nesting_up_to_the_limit_is_fine():
    msg = decode(mp(base("command", id="d", cmd="status", args={"x": nested(MAX_DEPTH - 1)})))
    assert msg.args["x"]["k"]
