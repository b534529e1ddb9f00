"""RunView: protocol messages in, rows / charts / events / connection state out. Pure, no UI."""

import math

import hang_scenario as hs
import msgspec
import pytest

from ringtop.protocol import (
    UI_RANK,
    Bye,
    CommStat,
    Event,
    HangReport,
    Heartbeat,
    Hello,
    MemorySample,
    Reply,
    Sample,
    Step,
    from_json_line,
    to_json_line,
)
from ringtop.tui.state.rank_row import RunningStat
from ringtop.tui.state.reducers.steps import STEP_LAG
from ringtop.tui.state.view_model import ControlReply, RunView


def hello(rank, seq=0, ts=1000.0, world_size=2, **kw):
    kw.setdefault("run_id", "run-abc")
    kw.setdefault("pid", 100 + rank)
    kw.setdefault("host", f"node-{rank}")
    return Hello(rank=rank, seq=seq, ts=ts, world_size=world_size,
                 backend="gloo", device="cpu", strategy="ddp", model="tiny-gpt", param_count=1_234_567,
                 torch_version="2.13.0", batch_size=8, seq_len=128, steps=100, **kw)


def step(rank, n, seq, step_ms=100.0, loss=2.5, ts=None, **kw):
    return Step(rank=rank, seq=seq, ts=1000.0 + n if ts is None else ts, step=n, loss=loss, step_ms=step_ms, **kw)


def test_hello_sets_run_facts_and_rows():
    v = RunView()
    v.apply(hello(0), now=1.0)
    v.apply(hello(1), now=1.0)
    f = v.facts
    assert (f.run_id, f.world_size, f.strategy, f.model, f.param_count) == ("run-abc", 2, "ddp", "tiny-gpt", 1_234_567)
    assert ((f.backend, f.device, f.torch_version, f.batch_size, f.seq_len, f.steps)
            == ("gloo", "cpu", "2.13.0", 8, 128, 100))
    assert [r.rank for r in v.rows()] == [0, 1]
    assert v.ranks[1].host == "node-1"
    assert [e.kind for e in v.events] == ["hello", "hello"]
    # an agent repeating its Hello for late joiners does not add lines
    v.apply(hello(0, seq=1), now=1.5)
    assert len(v.events) == 2


def test_step_fields_comm_math_and_totals():
    v = RunView()
    v.apply(hello(0), now=1.0)
    v.apply(hello(1), now=1.0)
    comm = [CommStat(kind="all_reduce", count=2, bytes=3_000_000, busy_ms=5.0),
            CommStat(kind="broadcast", count=1, bytes=1_000_000, busy_ms=1.0)]
    mem = MemorySample(params_bytes=10, grads_bytes=20, optimizer_bytes=40, rss_bytes=5 * 2**30)
    v.apply(step(0, 1, seq=1, step_ms=200.0, loss=2.75, comm=comm, exposed_comm_ms=50.0, tokens_per_s=1000.0,
                 mem=mem, cpu_percent=97.0, forward_ms=60.0, backward_ms=90.0), now=2.0)
    v.apply(step(1, 1, seq=1, step_ms=250.0, loss=2.5, tokens_per_s=800.0), now=2.0)
    r0 = v.ranks[0]
    assert (r0.step, r0.loss, r0.step_ms, r0.forward_ms, r0.backward_ms) == (1, 2.75, 200.0, 60.0, 90.0)
    assert (r0.mem_params_bytes, r0.mem_grads_bytes, r0.mem_optimizer_bytes) == (10, 20, 40)
    assert r0.mem_bytes == 5 * 2**30 and not r0.mem_is_cuda
    total_bytes = 3_000_000 + 1_000_000
    expected_mb_s = total_bytes / 0.200 / 1_000_000  # 20 MB/s
    assert r0.comm_mb_s == pytest.approx(expected_mb_s) and r0.comm_mb_s == pytest.approx(20.0)
    assert r0.comm_share_pct == pytest.approx(25.0)
    assert r0.cpu_percent == 97.0
    assert math.isnan(v.ranks[1].comm_mb_s) is False and v.ranks[1].comm_mb_s == 0.0
    assert v.tokens_per_s == pytest.approx(1800.0)
    assert v.latest_step == 1
    v.apply(step(0, 2, seq=2), now=3.0)
    assert v.latest_step == 1  # min over live ranks
    # a Sample updates cpu
    v.apply(Sample(rank=1, seq=2, ts=1003.0, cpu_percent=55.0, rss_bytes=123), now=3.0)
    assert v.ranks[1].cpu_percent == 55.0 and v.ranks[1].mem_rss_bytes == 123


def test_cuda_memory_preferred_over_rss():
    v = RunView()
    v.apply(step(0, 1, seq=1, mem=MemorySample(rss_bytes=10, cuda_allocated_bytes=7 * 2**30)), now=1.0)
    assert v.ranks[0].mem_is_cuda and v.ranks[0].mem_bytes == 7 * 2**30


def test_slowest_rank_only_with_more_than_one_rank():
    v = RunView()
    v.apply(hello(0, world_size=1), now=1.0)
    for n in range(5):
        v.apply(step(0, n, seq=n + 1, step_ms=300.0), now=1.0)
    assert v.slowest_rank is None and not v.ranks[0].slowest

    v = RunView()
    for r in range(3):
        v.apply(hello(r, world_size=3), now=1.0)
    for n in range(10):
        for r, ms in ((0, 100.0), (1, 150.0), (2, 101.0)):
            v.apply(step(r, n, seq=n + 1, step_ms=ms), now=1.0)
    assert v.slowest_rank == 1
    assert [r.rank for r in v.rows() if r.slowest] == [1]
    # against the others' median (100 and 101 -> 100.5), not the median of all three
    assert v.slowest_excess_pct == pytest.approx((150.0 / 100.5 - 1) * 100)
    # rank 1 recovers and rank 2 becomes slow: the recent window follows
    for n in range(10, 40):
        for r, ms in ((0, 100.0), (1, 100.0), (2, 180.0)):
            v.apply(step(r, n, seq=n + 1, step_ms=ms), now=1.0)
    assert v.slowest_rank == 2


def test_cross_rank_history_max_median_and_loss():
    v = RunView()
    for r in range(3):
        v.apply(hello(r, world_size=3), now=1.0)
    for r, ms, lo in ((0, 100.0, 3.0), (1, 130.0, 2.0), (2, 110.0, 1.0)):
        v.apply(step(r, 1, seq=1, step_ms=ms, loss=lo), now=1.0)
    assert len(v.steps) == 1
    p = v.steps[0]
    assert (p.step, p.max_ms, p.median_ms, p.max_rank, p.ranks) == (1, 130.0, 110.0, 1, 3)
    assert p.loss == pytest.approx(2.0)
    assert v.step_ms_max_history == [130.0] and v.loss_history == [2.0]
    # a step is not closed until every live rank reported it...
    v.apply(step(0, 2, seq=2, step_ms=90.0), now=1.0)
    assert len(v.steps) == 1
    # ...unless a rank falls far behind
    for n in range(3, 12):
        v.apply(step(0, n, seq=n, step_ms=90.0), now=1.0)
        v.apply(step(1, n, seq=n, step_ms=90.0), now=1.0)
    assert STEP_LAG == 8
    # newest step is 11, so steps up to 11 - STEP_LAG = 3 are closed without rank 2
    assert [(p.step, p.ranks) for p in v.steps] == [(1, 3), (2, 1), (3, 2)]
    # a rank that said bye stops holding steps open
    v.apply(Bye(rank=2, seq=2, ts=1020.0, reason="finished"), now=1.0)
    assert [p.step for p in v.steps][-1] == 11


def test_running_time_weighted_stats():
    s = RunningStat()
    s.update(100.0, ts=10.0, fallback_weight=0.1)  # first: weight = its own 0.1 s
    s.update(300.0, ts=10.3)  # held 0.3 s
    assert (s.count, s.min, s.max, s.last) == (2, 100.0, 300.0, 300.0)
    assert s.mean == pytest.approx((100.0 * 0.1 + 300.0 * 0.3) / 0.4)
    v = RunView()
    v.apply(step(0, 1, seq=1, step_ms=100.0, ts=10.0), now=1.0)
    v.apply(step(0, 2, seq=2, step_ms=300.0, ts=10.3), now=1.0)
    st = v.ranks[0].step_ms_stat
    assert (st.min, st.max) == (100.0, 300.0) and st.mean == pytest.approx(250.0)
    assert len(v.ranks[0].step_ms_history) == 2


def test_connection_states_with_explicit_now():
    v = RunView(stale_after_s=3.0)
    assert v.tick(100.0) == "waiting"
    v.apply(hello(0), now=100.0)
    v.apply(hello(1), now=100.0)
    assert v.tick(101.0) == "live"
    assert v.tick(103.0) == "live"
    assert v.tick(103.5) == "stale"
    v.apply(step(0, 1, seq=1), now=104.0)
    assert v.tick(104.0) == "live"
    assert v.ranks[1].silent_s == pytest.approx(4.0) and not v.ranks[1].dead
    v.apply(Heartbeat(rank=1, seq=1, step=0), now=104.5)
    v.apply(Bye(rank=0, seq=2, ts=1005.0, reason="finished", step=1), now=105.0)
    assert v.tick(105.0) == "live"  # rank 1 still running
    assert v.ranks[0].ended and v.ranks[0].bye_reason == "finished"
    v.apply(Bye(rank=1, seq=2, ts=1005.0, reason="killed", ok=False), now=105.0)
    assert v.is_ended
    assert v.tick(500.0) == "failed" and v.failure == "rank 1: killed"
    assert v.events[-1].kind == "failed" and "rank 1: killed" in v.events[-1].text
    assert any(e.level == "error" and e.rank == 1 and "killed" in e.text for e in v.events)
    clean = RunView()
    clean.apply(hello(0, world_size=1), now=1.0)
    clean.apply(Bye(rank=0, seq=1, ts=1001.0, reason="finished"), now=2.0)
    assert clean.tick(50.0) == "ended" and clean.failure is None and clean.events[-1].kind == "ended"


def test_the_rank_that_died_is_named_not_the_peer_that_failed_after_it():
    """Rank 1 is SIGKILLed: it just stops; rank 0's next collective fails and it says a failed Bye."""
    v = RunView()
    for r in (0, 1):
        v.apply(hello(r), now=10.0)
        v.apply(step(r, 1, seq=1), now=11.0)
    v.apply(Heartbeat(rank=0, seq=2, step=1), now=12.0)  # rank 1 sends nothing after t=11
    v.apply(Bye(rank=0, seq=3, ts=1013.0, reason="error: DistBackendError: connection reset by peer",
                ok=False, step=1), now=13.0)
    assert v.tick(14.0) == "live" and not v.ranks[1].dead  # 3 s: could be a slow step
    assert v.tick(15.5) == "failed"
    assert v.ranks[1].dead and not v.ranks[0].dead
    assert v.failure == "rank 1 died at step 1 (no message for 4 s)"
    assert [e.kind for e in v.events][-2:] == ["dead", "failed"] and v.events[-2].rank == 1


def test_nobody_is_dead_when_the_ui_hears_no_rank_at_all():
    v = RunView()
    for r in (0, 1):
        v.apply(hello(r), now=10.0)
    assert v.tick(100.0) == "stale" and not any(r.dead for r in v.ranks.values())


def test_a_dead_rank_that_speaks_again_is_alive():
    """Both on one host: a rank alone on its host that falls silent reads as its host cut off, not dead
    (test_unreachable_node.py)."""
    v = RunView()
    for r in (0, 1):
        v.apply(hello(r, host="node-0"), now=10.0)
    v.apply(step(0, 1, seq=1), now=16.0)
    v.tick(16.0)
    assert v.ranks[1].dead
    v.apply(step(1, 1, seq=1), now=17.0)
    assert not v.ranks[1].dead and v.tick(17.0) == "live"


def test_not_ended_while_world_size_not_all_said_bye():
    v = RunView()
    v.apply(hello(0, world_size=2), now=1.0)
    v.apply(Bye(rank=0, seq=1, ts=1001.0, reason="finished"), now=1.0)
    assert not v.is_ended and v.tick(1.0) == "live"


def test_sequence_gaps_count_as_drops():
    v = RunView()
    v.apply(hello(0, seq=0), now=1.0)
    v.apply(step(0, 1, seq=1), now=1.0)
    v.apply(step(0, 2, seq=5), now=1.0)  # 2, 3, 4 lost
    assert v.ranks[0].seq_lost == 3 and v.ranks[0].drops == 3
    v.apply(step(0, 3, seq=4), now=1.0)  # late / duplicate: not a gap
    assert v.ranks[0].seq_lost == 3
    # the agent stamps seq before its queue, so its own drops are gaps too: not counted twice
    v.apply(Heartbeat(rank=0, seq=6, ts=1007.0, step=2, drops=2), now=1.0)
    assert v.ranks[0].agent_drops == 2 and v.ranks[0].drops == 3
    # drops the agent made before the UI followed the rank show through its counter
    v.apply(step(0, 4, seq=7, drops=9), now=1.0)
    assert v.ranks[0].seq_lost == 3 and v.ranks[0].drops == 9
    v.apply(step(0, 5, seq=20, drops=9), now=1.0)  # 12 more lost on the way
    assert v.ranks[0].seq_lost == 15 and v.ranks[0].drops == 15
    assert v.total_drops == 15
    # a first message seen mid-stream (UI joined late) is no gap
    v.apply(step(1, 4, seq=5000), now=1.0)
    assert v.ranks[1].seq_lost == 0
    # an agent that repeats its Hello in its stream: the Hello takes its seq, no gap
    v.apply(hello(1, seq=5001), now=1.0)
    v.apply(step(1, 5, seq=5002), now=1.0)
    assert v.ranks[1].seq_lost == 0 and [e.kind for e in v.events].count("hello") == 2


def test_late_join_cached_hello_and_bye_are_not_gaps_or_restarts():
    """The relay re-sends each rank's cached Hello (seq 0) and Bye to every new subscriber."""
    v = RunView()
    v.apply(hello(0, seq=0, ts=1000.0), now=1.0)  # cached copy, sent when we subscribed
    v.apply(step(0, 500, seq=700), now=1.0)  # the live stream
    v.apply(step(0, 501, seq=701), now=1.0)
    assert v.ranks[0].seq_lost == 0
    v.apply(hello(0, seq=0, ts=1000.0), now=2.0)  # re-sent when another UI subscribed
    assert [e.kind for e in v.events] == ["hello"]
    v.apply(step(0, 502, seq=702), now=2.0)
    assert v.ranks[0].seq_lost == 0 and v.ranks[0].step == 502
    v.apply(Bye(rank=0, seq=703, ts=1600.0, reason="finished", step=502), now=3.0)
    v.apply(Bye(rank=0, seq=703, ts=1600.0, reason="finished", step=502), now=4.0)  # cached copy
    assert [e.kind for e in v.events].count("bye") == 1
    # a real restart: a new process with a new pid
    v.apply(hello(0, seq=0, ts=2000.0, pid=999), now=5.0)
    assert not v.ranks[0].ended and "rejoined" in v.events[-1].text
    v.apply(step(0, 503, seq=1), now=5.0)
    assert v.ranks[0].seq_lost == 0


def test_non_finite_loss_is_null_on_the_wire():
    v = RunView()
    for r in (0, 1):
        v.apply(hello(r), now=1.0)
    v.apply(step(0, 1, seq=1, loss=None), now=1.0)
    v.apply(step(1, 1, seq=1, loss=2.0), now=1.0)
    assert math.isnan(v.ranks[0].loss)
    assert v.loss_history == [2.0]
    v.apply(step(0, 2, seq=2, loss=None), now=1.0)
    v.apply(step(1, 2, seq=2, loss=None), now=1.0)
    assert v.loss_history == [2.0] and v.step_ms_max_history == [100.0, 100.0]


def test_reply_status_transitions():
    v = RunView()
    v.note_command_sent("c1", "checkpoint", {"kind": "full"})
    assert v.commands["c1"].status == "pending"
    v.apply(ControlReply(Reply(rank=0, seq=1, ts=1000.0, id="c1", status="ack", cmd="checkpoint")), now=1.0)
    assert v.commands["c1"].status == "ack"
    v.apply(ControlReply(Reply(rank=0, seq=2, ts=1001.0, id="c1", status="done", cmd="checkpoint",
                               result={"path": "/ckpt/step-7"})), now=1.0)
    c = v.commands["c1"]
    assert c.status == "done" and c.finished and c.history == ["pending", "ack", "done"]
    assert c.result == {"path": "/ckpt/step-7"}
    texts = [e.text for e in v.events if e.cmd_id == "c1"]
    assert len(texts) == 3
    assert "pending" in texts[0] and "checkpoint" in texts[0]
    assert "pending → ack → done" in texts[2] and "/ckpt/step-7" in texts[2]
    # an error reply
    v.note_command_sent("c2", "stop")
    v.apply(ControlReply(Reply(rank=0, seq=3, ts=1002.0, id="c2", status="error", cmd="stop", error="no",
                               code="bad_arguments")), now=1.0)
    assert v.commands["c2"].status == "error"
    assert v.events[-1].level == "error" and "bad_arguments" in v.events[-1].text
    assert v.last_warning is v.events[-1]
    # replies do not create rank rows
    assert v.ranks == {}


def test_reply_on_both_channels_is_shown_once_and_keeps_rank0_sequence():
    """Rank 0 answers on the control socket and publishes the same reply on telemetry, where it
    takes a seq from rank 0's telemetry stream."""
    v = RunView()
    v.apply(hello(0, seq=0), now=1.0)
    v.apply(step(0, 1, seq=1), now=1.0)
    v.note_command_sent("c1", "checkpoint", {"kind": "full"})
    ack = dict(rank=0, id="c1", status="ack", cmd="checkpoint")
    v.apply(ControlReply(Reply(seq=57, ts=1002.0, **ack)), now=2.0)  # control server's own counter
    v.apply(Reply(seq=2, ts=1002.0, **ack), now=2.0)  # the telemetry copy
    done = dict(rank=0, id="c1", status="done", cmd="checkpoint", result={"path": "/c"})
    v.apply(Reply(seq=3, ts=1003.0, **done), now=2.0)  # telemetry first this time
    v.apply(ControlReply(Reply(seq=58, ts=1003.0, **done)), now=2.0)
    v.apply(step(0, 2, seq=4), now=2.0)
    assert v.commands["c1"].history == ["pending", "ack", "done"]
    assert len([e for e in v.events if e.cmd_id == "c1"]) == 3
    assert v.ranks[0].seq_lost == 0
    # another UI's command: seen on telemetry only
    v.apply(Reply(seq=5, ts=1004.0, rank=0, id="other", status="done", cmd="status", result={"step": 2}), now=2.0)
    assert v.commands["other"].status == "done" and "status [other] done: step 2" in v.events[-1].text


def test_events_from_ranks_and_rejections():
    v = RunView()
    v.apply(Event(rank=1, seq=0, ts=1000.0, level="warn", kind="straggler", text="slow", step=12), now=1.0)
    v.apply(Event(rank=UI_RANK, seq=0, ts=1000.0, text="from ctl"), now=1.0)
    e = v.events[0]
    assert (e.level, e.rank) == ("warn", 1) and "straggler" in e.text and "step 12" in e.text
    assert v.events[1].rank is None
    v.note_rejected("malformed: not a MessagePack map", now=10.0)
    v.note_rejected("malformed: again", now=10.1)  # counted, not a new line (rate limit)
    v.note_rejected("malformed: later", now=11.5)
    assert v.rejected_total == 3
    rej = [e for e in v.events if e.kind == "rejected"]
    assert len(rej) == 2 and "not a MessagePack map" in rej[0].text and "2 frames" in rej[1].text
    seqs = [e.seq for e in v.events]
    assert seqs == list(range(len(seqs)))
    assert [e.seq for e in v.events_since(2)] == seqs[2:]


def test_events_are_bounded():
    v = RunView(max_events=10)
    for i in range(25):
        v.note(f"line {i}")
    assert len(v.events) == 10 and v.events_total == 25
    assert v.events_since(0)[0].text == "line 15"


def test_histories_are_bounded():
    v = RunView(history_points=16)
    for n in range(100):
        v.apply(step(0, n, seq=n + 1, step_ms=float(n)), now=1.0)
    assert len(v.steps) == 16 and len(v.ranks[0].step_ms_history) == 16
    assert v.step_ms_max_history[-1] == 99.0


def test_new_run_id_resets():
    v = RunView()
    v.apply(hello(0), now=1.0)
    v.apply(step(0, 5, seq=1), now=1.0)
    v.apply(hello(0, run_id="run-new"), now=2.0)
    assert v.facts.run_id == "run-new" and v.ranks[0].step == -1


def test_view_model_has_no_ui_imports():
    import ringtop.tui.state.view_model as vm

    src = open(vm.__file__).read()
    assert "textual" not in src and "import torch" not in src and "zmq" not in src


# ---------------------------------------------------------------------- strategies: sharding, comm kinds, memory


def test_strategy_name_and_sharding_text_from_hello():
    from ringtop.protocol import Sharding

    cases = [
        ("ddp", {}, Sharding(), "ddp", "replicated"),
        ("zero1", {}, Sharding(optimizer=True), "zero1", "optim sharded"),
        ("zero2", {}, Sharding(grads=True, optimizer=True), "zero2", "grads+optim sharded"),
        ("zero3", {}, Sharding(params=True, grads=True, optimizer=True), "zero3", "params+grads+optim sharded"),
        ("fsdp", {"sharding": "full"}, Sharding(params=True, grads=True, optimizer=True), "fsdp(full)",
         "params+grads+optim sharded"),
        ("fsdp", {"sharding": "no-shard"}, Sharding(), "fsdp(no-shard)", "replicated"),
    ]
    for strategy, options, sharding, name, text in cases:
        v = RunView()
        v.apply(Hello(rank=0, run_id="r", world_size=2, strategy=strategy, strategy_options=options,
                      sharding=sharding), now=1.0)
        assert (v.facts.strategy_name, v.facts.sharding_text) == (name, text)
    v = RunView()
    v.apply(hello(0, dtype="bf16", optimizer_bytes_per_param=12, grad_clip=1.0), now=1.0)
    assert (v.facts.dtype, v.facts.optimizer_bytes_per_param, v.facts.grad_clip) == ("bf16", 12, 1.0)


def test_comm_per_kind_in_the_rank_rows():
    v = RunView()
    v.apply(hello(0), now=1.0)
    comm = [CommStat(kind="all_gather", count=2, bytes=3_000_000, busy_ms=5.0),
            CommStat(kind="reduce_scatter", count=1, bytes=1_000_000, busy_ms=2.0),
            CommStat(kind="all_gather", count=1, bytes=1_000_000, busy_ms=1.0),  # same kind twice: summed
            CommStat(kind="barrier", count=1, bytes=0, busy_ms=0.1)]
    v.apply(step(0, 1, seq=1, step_ms=250.0, comm=comm), now=1.0)
    r = v.ranks[0]
    # per kind over 0.25 s: all_gather 4e6 B -> 16 MB/s, reduce_scatter 1e6 B -> 4 MB/s
    assert r.comm_kind_bytes == {"all_gather": 4_000_000, "reduce_scatter": 1_000_000, "barrier": 0}
    assert r.comm_kind_mb_s["all_gather"] == pytest.approx(16.0)
    assert r.comm_kind_mb_s["reduce_scatter"] == pytest.approx(4.0)
    assert r.comm_mb_s == pytest.approx(20.0) == pytest.approx(sum(r.comm_kind_mb_s.values()))
    # the usual order first (all_reduce, reduce_scatter, all_gather, broadcast), others after
    assert v.comm_kinds == ["reduce_scatter", "all_gather", "barrier"]
    v.apply(step(0, 2, seq=2, comm=[CommStat(kind="broadcast", bytes=8)]), now=1.0)
    assert v.comm_kinds == ["reduce_scatter", "all_gather", "broadcast", "barrier"]  # kinds seen stay
    assert v.ranks[0].comm_kind_bytes == {"broadcast": 8}
    # rank 0 announcing another strategy starts the kinds afresh
    v.apply(hello(0, seq=3, strategy_options={"bucket_mb": 1}), now=1.0)
    assert v.comm_kinds == []
    v.apply(step(0, 3, seq=4, comm=[CommStat(kind="all_reduce", bytes=8)]), now=1.0)
    assert v.comm_kinds == ["all_reduce"]


def test_memory_parts_and_prediction_per_rank():
    from ringtop.protocol import Prediction

    v = RunView()
    v.apply(hello(0, prediction=Prediction(params_bytes=100, grads_bytes=200, optimizer_bytes=400)), now=1.0)
    v.apply(hello(1), now=1.0)
    assert v.ranks[0].prediction.optimizer_bytes == 400 and v.ranks[1].prediction is None
    mem = MemorySample(params_bytes=100, grads_bytes=200, optimizer_bytes=400, rss_bytes=1000)
    v.apply(step(0, 1, seq=1, mem=mem), now=1.0)
    r0 = v.ranks[0]
    assert (r0.mem_state_bytes, r0.mem_other_bytes, r0.mem_peak_other_bytes) == (700, 300, 300)
    # on a GPU: CUDA allocated − state, and the peak for the high-water mark; never negative
    gpu = MemorySample(params_bytes=100, grads_bytes=200, optimizer_bytes=400, rss_bytes=5000,
                       cuda_allocated_bytes=600, cuda_peak_bytes=1500)
    v.apply(step(1, 1, seq=1, mem=gpu), now=1.0)
    r1 = v.ranks[1]
    assert (r1.mem_state_bytes, r1.mem_other_bytes, r1.mem_peak_other_bytes) == (700, 0, 800)


def _seed_run(strategy="zero2", options=None, world_size=8, device="cuda:0", cap=80 * 10**9, host="node-a"):
    """The chapter's model: 7.6e9 params, bf16 params and grads, optimizer 4x the param bytes (8 B)."""
    from ringtop.protocol import Sharding

    v = RunView()
    for r in range(world_size):
        v.apply(Hello(rank=r, run_id="seed", world_size=world_size, host=host, backend="nccl", device=device,
                      strategy=strategy, strategy_options=options or {}, sharding=Sharding(optimizer=True),
                      dtype="bf16", optimizer_bytes_per_param=8, param_count=7_600_000_000,
                      device_mem_total_bytes=cap), now=1.0)
    return v


def test_fit_table_gives_each_strategy_as_ringtop_runs_it_and_marks_the_run():
    """The chapter's 7.6e9-param bf16 model on 8 ranks, each strategy as ringtop implements it:
    the torch strategies keep fp32 params and grads (4 B each) and AdamW's two fp32 moments (8 B);
    DeepSpeed keeps bf16 params and grads (2 B each) and an fp32 master plus moments (12 B), the
    optimizer sharded from stage 1. Not this run's optimizer bytes applied to every strategy. State
    between steps, as the agent's prediction and the measurement: stage 1 keeps only its partition of
    the reduced gradients, SHARD_GRAD_OP reshards its parameters after backward."""
    from ringtop.tui.tabs.memory.figures import fit_table

    ft = fit_table(_seed_run())
    rows = {r.strategy: r for r in ft.rows}
    assert list(rows) == ["ddp", "zero1", "zero2", "zero3", "fsdp-full", "fsdp-grad-op", "fsdp-no-shard"]
    p = 7_600_000_000
    assert rows["ddp"].state_bytes == p * (4 + 4 + 8)  # 121.6 GB
    assert rows["fsdp-no-shard"].state_bytes == rows["ddp"].state_bytes
    assert rows["fsdp-full"].state_bytes == p * (4 + 4 + 8) // 8  # 15.2 GB
    assert rows["zero1"].state_bytes == p * 2 + p * 2 // 8 + p * 12 // 8  # 15.2 + 1.9 + 11.4 = 28.5 GB
    assert rows["zero2"].state_bytes == p * 2 + p * 2 // 8 + p * 12 // 8  # 28.5 GB
    assert rows["zero3"].state_bytes == (p * 2 + p * 2 + p * 12) // 8  # 15.2 GB
    assert rows["zero1"].optimizer_bytes == rows["zero3"].optimizer_bytes == p * 12 // 8
    assert rows["ddp"].optimizer_bytes == p * 8
    # on 80 GB devices with nothing else measured yet: only the replicating ones do not fit
    assert ft.capacity_bytes == 80 * 10**9 and ft.allowance_bytes == 0
    assert [s for s, r in rows.items() if not r.fits] == ["ddp", "fsdp-no-shard"]
    assert rows["zero1"].capacity_pct == pytest.approx(28.5 / 80 * 100)
    assert rows["fsdp-grad-op"].state_bytes == rows["fsdp-full"].state_bytes  # between steps
    assert (rows["fsdp-grad-op"].sharded, rows["zero1"].sharded) == ("grads+optim", "optim")
    assert [s for s, r in rows.items() if r.current] == ["zero2"]
    # DDP reduces fp32 gradients: a ring all-reduce of 30.4 GB over 8 sends 2 x 7/8 x 30.4 = 53.2 GB
    assert rows["ddp"].wire_bytes_per_step == 53_200_000_000
    marked = fit_table(_seed_run("fsdp", {"sharding": "grad-op"}))
    assert [r.strategy for r in marked.rows if r.current] == ["fsdp-grad-op"]


@pytest.mark.parametrize("strategy, optimizer_bytes_per_param", [("ddp", 8), ("zero3", 12)])
def test_the_fit_table_and_the_switch_picker_give_one_answer(strategy, optimizer_bytes_per_param):
    """Issue 13: under ddp the table showed ZeRO with ddp's optimizer bytes, under zero3 ddp with
    ZeRO's, while the picker was right. Whatever the run, both now give the same figures."""
    from ringtop.protocol import Sharding
    from ringtop.tui.actions import switch_rows
    from ringtop.tui.tabs.memory.figures import fit_table

    v = RunView()
    for r in range(2):
        v.apply(Hello(rank=r, run_id="x", world_size=2, host="h", backend="gloo", device="cpu", strategy=strategy,
                      sharding=Sharding(), dtype="fp32", optimizer_bytes_per_param=optimizer_bytes_per_param,
                      param_count=1_000_000), now=1.0)
    table = {r.strategy: (r.params_bytes, r.grads_bytes, r.optimizer_bytes, r.wire_bytes_per_step)
             for r in fit_table(v).rows}
    picker = {row.target.key: (row.params_bytes, row.grads_bytes, row.optimizer_bytes, row.sent_bytes)
              for row in switch_rows(v)}
    shared = set(table) & set(picker)
    assert {"ddp", "zero1", "zero2", "zero3", "fsdp-full"} <= shared
    for name in shared:
        assert table[name] == picker[name], name
    assert table["ddp"][2] == 8_000_000 and table["zero3"][2] == 12_000_000 // 2


def test_fit_capacity_on_cpu_is_this_hosts_memory_shared_by_its_ranks():
    from ringtop.tui.tabs.memory.figures import capacity_per_rank, fit_table

    v = _seed_run(world_size=2, device="cpu", cap=0, host="box")
    cap, text = capacity_per_rank(v, ui_host="box", ui_host_mem_bytes=64 * 2**30)
    assert cap == 32 * 2**30 and "2 ranks" in text
    cap, text = capacity_per_rank(v, ui_host="laptop", ui_host_mem_bytes=64 * 2**30)
    assert cap == 0 and "capacity unknown" in text and "box" in text
    ft = fit_table(v, ui_host="laptop", ui_host_mem_bytes=64 * 2**30)
    assert all(r.fits is None and math.isnan(r.capacity_pct) for r in ft.rows)
    assert fit_table(RunView()) is None  # no parameter count, no table


def test_predicted_state_prefers_the_agents_and_falls_back_to_the_cost_model():
    from ringtop.protocol import Prediction
    from ringtop.tui.deltas import pct_diff
    from ringtop.tui.tabs.memory.figures import predicted_state

    v = _seed_run(world_size=8)
    ui = predicted_state(v, v.ranks[3])
    # zero2 on 8 ranks, as DeepSpeed holds it (the one prediction, metrics.memory_model): bf16 params
    # 15.2 GB whole, grads /8, fp32 master + moments 12 B/param /8 (not the Hello's 8 B applied to it)
    assert (ui.params_bytes, ui.grads_bytes, ui.optimizer_bytes, ui.source) == \
        (15_200_000_000, 1_900_000_000, 11_400_000_000, "ui")
    v.apply(Hello(rank=3, run_id="seed", world_size=8, strategy="zero2", param_count=7_600_000_000,
                  prediction=Prediction(params_bytes=1, grads_bytes=2, optimizer_bytes=3, note="n")), now=2.0)
    agent = predicted_state(v, v.ranks[3])
    assert (agent.total_bytes, agent.source, agent.note) == (6, "agent", "n")
    assert pct_diff(110, 100) == pytest.approx(10.0) and pct_diff(0, 0) == 0.0 and math.isnan(pct_diff(1, 0))


def test_stacked_bar_and_difference_text():
    from ringtop.tui.deltas import delta_text
    from ringtop.tui.tabs.memory.render import stacked_bar

    # 10 cells for 100 bytes: 50 / 30 / 20 -> 5 / 3 / 2 cells
    bar = stacked_bar([(50, "a"), (30, "b"), (20, "c")], 100, width=10)
    assert bar.plain == "█" * 10
    assert [(s.end - s.start, str(s.style)) for s in bar.spans] == [(5, "a"), (3, "b"), (2, "c")]
    # a tiny non-zero part still gets a cell, taken from the widest; empty room is dotted
    bar = stacked_bar([(1, "a"), (60, "b")], 100, width=10)
    assert [(s.end - s.start, str(s.style)) for s in bar.spans][:2] == [(1, "a"), (5, "b")]
    assert bar.plain.endswith("····")
    assert stacked_bar([(1, "a")], 0).plain == ""
    assert delta_text(5, 5).plain == "="
    assert delta_text(101, 100).plain == "+1.0%"
    assert delta_text(1001, 1000).plain == "+0.10%"
    assert delta_text(300, 100).plain == "+200%"
    assert delta_text(1, 0).plain == "new"


def test_ranks_outside_the_world_make_no_rows_even_before_the_hello():
    v = RunView()
    v.apply(step(5000, 1, seq=1), now=1.0)  # arrived before any Hello: kept for now (the world is unknown)
    v.apply(step(1, 1, seq=1), now=1.0)
    v.apply(hello(0, world_size=2), now=2.0)
    assert set(v.ranks) == {1, 0} and v.rejected_total == 1
    v.apply(step(7, 2, seq=2), now=3.0)
    v.apply(hello(9, world_size=2), now=3.0)  # a hello from outside its own world
    assert set(v.ranks) == {0, 1} and v.rejected_total == 3
    assert any("outside the run's 2 ranks" in e.text for e in v.events)


def test_another_clients_command_is_named_from_its_ack_not_shown_as_internals():
    """Issue 13: a command sent by `ringtop ctl` appeared as `rank 0: ? [feef7f0a5189]` with
    `args=dict[2]`. Its ack carries the accepted arguments: the event log names the command."""
    v = RunView()
    v.apply(hello(0), now=1.0)
    ack = Reply(rank=0, seq=5, ts=1001.0, id="feef7f0a5189", status="ack", cmd="switch",
                result={"applies_at": "the step boundary after next", "args": {"strategy": "zero3"}})
    done = Reply(rank=0, seq=6, ts=1002.0, id="feef7f0a5189", status="done", cmd="switch",
                 result={"from": "ddp", "to": "zero3", "step": 40, "seconds": 1.5})
    v.apply(ack, now=2.0)
    v.apply(done, now=3.0)
    texts = [e.text for e in v.events if e.cmd_id == "feef7f0a5189"]
    assert texts[0] == "switch → zero3 [feef7f0a5189] ack: applies at the step boundary after next"
    assert texts[1] == "switch → zero3 [feef7f0a5189] ack → done: ddp → zero3 at step 40 in 1.50 s"
    assert not any("?" in t.split("[")[0] or "dict[" in t for t in texts), texts


def test_a_status_reply_reads_as_a_sentence_that_fits():
    """Issue 13: `s` status was cut off at the checkpoint's path."""
    from ringtop.tui.state.reducers import describe_result

    result = {"run_id": "3f2a9c1e", "step": 41, "steps": 100, "strategy": "fsdp(full)", "world_size": 8,
              "loss": 2.3125, "step_ms": 118.4,
              "last_checkpoint": "/scratch/very/long/path/of/the/team/runs/a/checkpoints/step-00000040-full",
              "refused_connections": 3}
    text = describe_result("status", "done", result)
    assert text == "step 41/100, fsdp(full) ×8, loss 2.312, 118.4 ms/step, last ckpt step-00000040-full, 3 refused"
    assert len(text) < 100
    assert describe_result("status", "done", {"step": 0, "last_checkpoint": ""}).endswith("no checkpoint yet")


def test_operations_restated_by_rank_0_fill_a_late_ui_without_event_lines():
    """A UI attached after a switch and a checkpoint learns them from `operations_recent`; what it
    saw itself stands; malformed entries are skipped."""

    v = RunView(watch_liveness=False)
    v.apply(hello(0), now=0.0)
    v.note_command_sent("mine01", "checkpoint", {"kind": "full"})
    events_before = v.events_total
    ops = [
        {"id": "aa11", "cmd": "switch", "args": {"strategy": "zero3"}, "status": "done",
         "result": {"from": "ddp", "to": "zero3", "step": 40}, "error": "", "ts": 1000.0, "finished_ts": 1001.5},
        {"id": "mine01", "cmd": "checkpoint", "args": {"kind": "sharded"}, "status": "error", "error": "x"},
        {"id": "bb22", "cmd": "checkpoint", "status": "exploded"},  # not a status
        {"id": 7, "cmd": "profile", "status": "done"},  # not an id
        "garbage",
    ]
    v.apply(Event(rank=0, seq=1, ts=1002.0, kind="operations_recent", data={"operations": ops}), now=1.0)
    assert v.events_total == events_before  # not news
    recent = {c.id: c for c in v.recent_commands()}
    assert set(recent) == {"aa11", "mine01"}
    assert recent["aa11"].title == "switch → zero3" and recent["aa11"].phase == "done"
    assert recent["aa11"].finished_ts - recent["aa11"].sent_ts == 1.5
    assert recent["mine01"].status == "pending" and recent["mine01"].args == {"kind": "full"}  # its own view stands
    v.apply(Event(rank=0, seq=2, ts=1003.0, kind="operations_recent", data={"operations": "nope"}), now=2.0)
    assert len(v.recent_commands()) == 2


# ---------------------------------------------------------------------- stuck ranks


def test_stall_reports_name_the_culprit_once_per_change_and_a_step_or_recovery_clears_them():
    seq = hs.Seq()
    v = RunView(watch_liveness=False)
    v.apply_many(hs.hung_run(seq=seq), now=1.0)
    verdict = v.hang_verdict()
    assert verdict is not None and verdict.kind == "hang"
    assert (verdict.culprits, verdict.waiting, verdict.collective, verdict.seq) == ((3,), (0, 1, 2), "all_reduce", 21)
    assert "rank 3 has not entered all_reduce #21 on group world (4.0MiB)" in verdict.text
    assert "rank 3 is in forward at model.py:57 in forward" in verdict.text
    # cached by the view's `hang` version: a heartbeat does not read the reports again
    v.apply(Heartbeat(rank=0, seq=seq(0), ts=2000.0, step=5), now=1.5)
    assert v.hang_verdict() is verdict
    # the culprit finishes its step: its report is gone, the others' still name a stall
    v.apply(step(3, 6, seq=seq(3)), now=2.0)
    assert 3 not in v.hang.stalled and v.hang_verdict() is not verdict
    # a step that is not the stuck one does not clear a report
    v.apply(step(0, 5, seq=seq(0)), now=2.0)
    assert 0 in v.hang.stalled
    v.apply_many([hs.stall(r, seq(r), state="recovered") for r in (0, 1)], now=2.5)
    v.apply(step(2, 6, seq=seq(2)), now=2.5)
    assert v.hang.stalled == {} and v.hang_verdict() is None


def test_a_rank_that_ended_in_error_is_named_dead_and_its_old_report_is_not_read():
    seq = hs.Seq()
    v = RunView(watch_liveness=False)
    v.apply_many(hs.hung_run(seq=seq), now=1.0)
    v.apply(hs.failed_bye(3, seq(3)), now=2.0)
    verdict = v.hang_verdict()
    assert verdict.kind == "dead" and verdict.culprits == (3,) and verdict.waiting == (0, 1, 2)
    assert verdict.text.startswith("rank 3 has died")


def test_stacks_snapshots_are_kept_apart_and_the_newer_stack_is_shown():
    seq = hs.Seq()
    v = RunView(watch_liveness=False)
    v.apply_many([hs.hello(r) for r in range(4)], now=1.0)
    v.apply_many([hs.stall(r, seq(r), state="snapshot", request="ui-7") for r in range(4)], now=1.0)
    assert v.hang_verdict() is None and set(v.hang.snapshots) == {0, 1, 2, 3} and v.hang.snapshot_request == "ui-7"
    assert v.hang.report_of(3)[0] == "snapshot"
    v.apply(hs.stall(3, seq(3)), now=2.0)
    assert v.hang.report_of(3)[0] == "stalled" and v.hang.report_of(0)[0] == "snapshot"
    v.apply(hs.stall(3, seq(3), state="snapshot", request="ui-8"), now=3.0)
    assert v.hang.report_of(3)[0] == "snapshot" and 3 in v.hang.stalled


def legacy_logged(event: Event) -> Event:
    """The event as an older agent logged it: its reading in `data`, read back through the codec."""
    h = event.hang
    if h.verdict == "cleared":
        data = {"cleared": True, "seconds": h.lasted_s}
    elif event.kind == "desync":
        data = {"step": h.step, "group": h.group, "culprits": h.culprits, "agreeing": h.waiting}
    else:
        data = {"verdict": h.verdict, "culprits": h.culprits, "waiting": h.waiting, "group": h.group, "seq": h.seq,
                "collective": h.collective, "wait_s": h.wait_s, "step": h.step,
                "where": {str(r): w for r, w in h.where.items()}}
    line = to_json_line(msgspec.structs.replace(event, hang=None, data=data)).replace(b',"hang":null', b"")
    back = from_json_line(line)
    assert back.data == {}, "the reading moved out of `data`"
    return back


@pytest.mark.parametrize("logged", [lambda e: e, legacy_logged], ids=["typed", "an older agent's data map"])
def test_rank_0s_hang_event_stands_in_for_reports_the_ui_never_got_and_a_desync_shows_for_60_s(logged):
    seq = hs.Seq()
    v = RunView(watch_liveness=False)
    v.apply_many([hs.hello(r) for r in range(4)], now=1.0)
    hang = logged(Event(rank=0, seq=seq(0), ts=hs.T0 + 5, level="error", kind="hang", text="rank 3 has not entered …",
                        hang=HangReport(verdict="hang", culprits=[3], waiting=[0, 1, 2], group="world", seq=21,
                                        collective="all_reduce", wait_s=41.0, step=6, where={3: "in forward"})))
    v.apply(hang, now=2.0)
    verdict = v.hang_verdict()
    assert verdict.kind == "hang" and verdict.culprits == (3,) and verdict.where == {3: "in forward"}
    assert (verdict.waiting, verdict.group, verdict.seq, verdict.wait_s) == ((0, 1, 2), "world", 21, 41.0)
    v.apply(logged(Event(rank=0, seq=seq(0), ts=hs.T0 + 9, level="info", kind="hang", text="the stall is over",
                         hang=HangReport(verdict="cleared", lasted_s=4.0))), now=3.0)
    assert v.hang_verdict() is None
    desync = logged(Event(rank=0, seq=seq(0), ts=hs.T0 + 10, level="error", kind="desync",
                          text="desync in step 7 on group world",
                          hang=HangReport(verdict="desync", step=7, group="world", culprits=[1], waiting=[0, 2, 3])))
    assert desync.hang == HangReport(verdict="desync", step=7, group="world", culprits=[1], waiting=[0, 2, 3])
    v.apply(desync, now=4.0)
    assert v.desync_notice() is desync
    v.apply(hs.step(2, 8, seq(2), ts=hs.T0 + 69), now=5.0)
    assert v.desync_notice() is desync
    v.apply(hs.step(2, 9, seq(2), ts=hs.T0 + 71), now=6.0)  # 61 s later by the run's clock
    assert v.desync_notice() is None


@pytest.mark.parametrize("world, kept", [(8, 240), (256, 240), (1024, 64), (8192, 20)])
def test_comm_histories_share_a_budget_so_memory_is_bounded_at_any_world_size(world, kept):
    """Each rank keeps HISTORY_POINTS timed steps up to 273 ranks, then its share of
    COMM_HISTORY_BUDGET (65,536 // world), never fewer than the Comm tab's window of 20: the
    expected lengths are worked out here from those numbers. Rows are bounded again when rank 0's
    Hello names another world size; the newest steps are the ones kept."""
    v = RunView()
    comm = [CommStat(kind="all_reduce", count=1, bytes=1000, busy_ms=1.0)]
    v.apply(hello(0, world_size=4), now=1.0)
    for n in range(1, 301):
        v.apply(step(3, n, seq=n, comm=comm), now=1.0)
    assert len(v.ranks[3].comm_history) == 240
    v.apply(hello(0, seq=1, world_size=world), now=1.0)  # the run's world, as a resized run's Hello says
    for n in range(301, 311):
        v.apply(step(3, n, seq=n, comm=comm), now=1.0)
    history = v.ranks[3].comm_history
    assert len(history) == kept and [t.step for t in history] == list(range(311 - kept, 311))
    v.apply(step(5, 1, seq=1, comm=comm), now=1.0)
    assert v.ranks[5].comm_history.maxlen == kept


def test_a_large_runs_comm_histories_give_the_garbage_collector_nothing_to_walk():
    """The protocol's scalar parts are gc=False and a history keeps a step's CommStats in a tuple,
    which the collector stops tracking at its first pass: 1024 ranks' histories are no longer
    walked by every full collection (which took up to 400 ms at 1024 ranks). A list of them, as
    decoded, stays tracked: that is what the check would see were the tuple a list."""
    import gc

    from ringtop.protocol import decode, encode

    v = RunView()
    v.apply(hello(0, world_size=4), now=1.0)
    comm = [CommStat(kind="all_reduce", count=1, bytes=1000, busy_ms=1.0)]
    msg = decode(encode(step(1, 1, seq=1, comm=comm, mem=MemorySample(rss_bytes=1))))
    assert not gc.is_tracked(msg.comm[0]) and not gc.is_tracked(msg.mem)
    v.apply(msg, now=1.0)
    gc.collect()
    (kept,) = v.ranks[1].comm_history
    assert not gc.is_tracked(kept) and not gc.is_tracked(kept.comm)
    assert gc.is_tracked(msg.comm)  # the decoded list: tracked for as long as it lives


def test_a_watchers_word_names_a_silent_rank_stuck_or_dead_and_the_rank_speaking_again_clears_it():
    """The watchers' RankLook and RankExit (agent/watcher/) carry UI_RANK: no row of their own."""
    from ringtop.protocol import RankExit, RankLook
    from ringtop.tui.state.liveness import DEAD_AFTER_S

    v = RunView()
    for r in (0, 1):
        v.apply(hello(r), now=1.0)
        v.apply(step(r, 1, seq=1), now=1.0)
    later = 1.0 + DEAD_AFTER_S + 5
    v.apply(step(0, 2, seq=2), now=later)
    v.apply(RankLook(of_rank=1, pid=101, words="stuck (alive, GIL held, CPU 0%) in sleep ← … ← f (m.py:7)"), now=later)
    v.tick(later)
    row = v.ranks[1]
    assert row.stuck.startswith("stuck (alive, GIL held") and not row.dead, "silent past the rule, yet alive"
    assert -1 not in v.ranks, "the watcher's word makes no row"
    v.apply(step(1, 2, seq=2), now=later + 1)
    assert row.stuck == "" and not row.dead
    v.apply(RankExit(of_rank=1, pid=101, how="killed by SIGKILL", detail="pid 101, seen by its node's watcher"),
            now=later + 2)
    assert row.dead and row.exit_how == "killed by SIGKILL"
    assert any("rank 1 killed by SIGKILL at step 2" in e.text for e in v.events)
