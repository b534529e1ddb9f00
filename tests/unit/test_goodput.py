"""Goodput (metrics/goodput.py) from hand-built message sequences. Each expected number is worked
out here from the sequence's own figures (step times, event seconds, wall), not read off the code."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringtop.metrics.goodput import CAUSES, Goodput, goodput_of
from ringtop.protocol import Bye, Event, GoodputSoFar, Hello, ProtocolError, Stall, Step, decode, encode

T0 = 1_780_000_000.0
"""Unix time, as messages carry it: float64 resolves it to ~0.24 µs, so sums of steps agree to µs."""


def approx(expected):
    return pytest.approx(expected, abs=1e-5)


def hello(rank: int = 0, ts: float = 0.0, run_id: str = "run1", world: int = 2, restart: int = 0) -> Hello:
    return Hello(rank=rank, ts=T0 + ts, run_id=run_id, world_size=world, restart_count=restart)


def step(n: int, end: float, ms: float = 100.0, rank: int = 0, **kw) -> Step:
    return Step(rank=rank, ts=T0 + end, step=n, loss=1.0, step_ms=ms, **kw)


def event(kind: str, ts: float, seconds: float | None, rank: int = 0) -> Event:
    return Event(rank=rank, ts=T0 + ts, kind=kind, data={} if seconds is None else {"seconds": seconds})


def stall(rank: int, ts: float, state: str = "stalled", running_s: float = 0.0) -> Stall:
    return Stall(rank=rank, ts=T0 + ts, state=state, running_s=running_s)


def bye(rank: int, ts: float) -> Bye:
    return Bye(rank=rank, ts=T0 + ts)


def steps_from(start: float, first: int, count: int, ms: float = 100.0, rank: int = 0) -> list[Step]:
    """`count` back-to-back steps of `ms` from `start` (s after T0)."""
    return [step(first + i, start + (i + 1) * ms / 1e3, ms, rank) for i in range(count)]


def checkpointed_run() -> list:
    """0.5 s start-up, 5 steps of 100 ms, a 0.5 s foreground checkpoint, 5 more steps: 2.0 s."""
    return [hello(0, 0.0), hello(1, 0.01), *steps_from(0.5, 1, 5), event("checkpoint", 1.5, 0.5),
            *steps_from(1.5, 6, 5), bye(1, 1.99), bye(0, 2.0)]


def test_ten_steps_of_100ms_in_2s_with_a_half_second_checkpoint_is_half():
    r = goodput_of(checkpointed_run())
    productive, wall = 10 * 0.100, 2.0
    assert r.productive_s == approx(productive)
    assert r.wall_s == approx(wall)
    assert r.goodput == approx(productive / wall) == approx(0.5)
    assert r.lost_s["startup"] == approx(0.5)
    assert r.lost_s["checkpoint"] == approx(0.5)
    assert r.lost_s["other"] == approx(0.0)
    assert set(r.lost_s) == set(CAUSES)
    assert r.productive_s + sum(r.lost_s.values()) == approx(r.wall_s)


def test_a_switch_counts_once_though_every_rank_reports_it_and_gaps_are_other():
    # 1.0 s start-up, 4 steps of 250 ms, a 1.5 s switch (both ranks say so), 4 steps, then a 0.5 s tail
    msgs = [hello(0, 0.0), hello(1, 0.0), *steps_from(1.0, 1, 4, 250.0), event("switch", 3.5, 1.5),
            event("switch", 3.5, 1.5, rank=1), *steps_from(3.5, 5, 4, 250.0), bye(0, 5.0)]
    r = goodput_of(msgs)
    assert r.wall_s == approx(5.0)
    assert r.productive_s == approx(8 * 0.25)
    assert r.goodput == approx(2.0 / 5.0)
    assert r.lost_s["switch"] == approx(1.5)
    assert r.lost_s["startup"] == approx(1.0)
    assert r.lost_s["other"] == approx(0.5)


def test_stalled_time_is_not_productive_and_is_counted_once_across_ranks():
    # 10 steps of 100 ms from t=0; step 11 starts at 1.0 and takes 3 s: rank 1 hangs from 1.0 to 4.0,
    # rank 0 waits for it and is reported stalled from 1.5 to 4.0 as well; 2 more steps; 4.2 s wall
    msgs = [hello(0, 0.0), hello(1, 0.0), *steps_from(0.0, 1, 10),
            stall(1, 2.0, running_s=1.0), stall(0, 2.0, running_s=0.5), stall(1, 3.0, running_s=2.0),
            step(11, 4.0, 3000.0), stall(1, 4.0, "recovered"), stall(0, 4.0, "recovered"),
            *steps_from(4.0, 12, 2)]
    r = goodput_of(msgs)
    assert r.wall_s == approx(4.2)
    assert r.lost_s["stall"] == approx(3.0)
    assert r.productive_s == approx(12 * 0.1)
    assert r.goodput == approx(1.2 / 4.2)
    assert r.productive_s + sum(r.lost_s.values()) == approx(r.wall_s)


def test_a_hang_in_progress_lowers_goodput_with_every_report():
    msgs = [hello(0, 0.0), *steps_from(0.0, 1, 10)]
    g = Goodput()
    for m in msgs:
        g.add(m)
    assert g.result().goodput == approx(1.0)
    seen = []
    for t in (12.0, 14.0, 16.0):  # stalled since 1.0, still stalled at t
        g.add(stall(0, t, running_s=t - 1.0))
        seen.append(g.result())
    assert [r.lost_s["stall"] for r in seen] == approx([11.0, 13.0, 15.0])
    assert [r.goodput for r in seen] == approx([1.0 / 12, 1.0 / 14, 1.0 / 16])
    g.add(bye(0, 17.0))  # a rank that says goodbye is no longer stalled
    g.add(Event(rank=1, ts=T0 + 18.0, kind="note"))
    assert g.result().lost_s["stall"] == approx(16.0)
    assert g.result().lost_s["other"] == approx(1.0)


def test_skipped_steps_are_lost_and_a_step_without_the_field_is_productive():
    msgs = [hello(0, 0.0), *steps_from(0.0, 1, 4), step(5, 0.5, skipped=True), step(6, 0.6, skipped=False),
            step(7, 0.7)]
    r = goodput_of(msgs)
    assert r.wall_s == approx(0.7)
    assert r.lost_s["skipped"] == approx(0.1)
    assert r.productive_s == approx(0.6)


def test_a_background_checkpoint_costs_only_what_it_did_not_overlap():
    # the save starts at 1.0 and ends at 2.0 (seconds = 1.0); steps ran from 1.0 to 1.8 meanwhile
    msgs = [hello(0, 0.0), *steps_from(0.0, 1, 10), event("checkpoint", 1.0, None),
            *steps_from(1.0, 11, 8), event("checkpoint", 2.0, 1.0), *steps_from(2.0, 19, 2)]
    r = goodput_of(msgs)
    assert r.lost_s["checkpoint"] == approx(0.2)
    assert r.productive_s == approx(2.0)
    assert r.goodput == approx(2.0 / 2.2)


def test_startup_is_the_whole_wall_before_the_first_step():
    g = Goodput()
    g.add(hello(0, 0.0))
    g.add(Event(rank=0, ts=T0 + 3.0, kind="prewarm"))
    r = g.result()
    assert not r.known and r.goodput == 0.0 and r.lost_s["startup"] == approx(3.0)
    assert math.isnan(Goodput().result().goodput)


def test_startup_counts_from_the_process_start_the_hello_carries():
    """Imports, the process group, the model's build and wrapping come before the Hello."""
    early = Hello(rank=0, ts=T0 + 4.0, run_id="run1", world_size=2, process_started_ts=T0)
    r = goodput_of([early, *steps_from(4.0, 1, 10)])  # 10 steps of 100 ms from 4.0 s
    assert r.wall_s == approx(5.0) and r.lost_s["startup"] == approx(4.0) and r.goodput == approx(1.0 / 5.0)
    implausible = Hello(rank=0, ts=T0 + 4.0, run_id="run1", world_size=2, process_started_ts=T0 + 9.0)
    assert goodput_of([implausible, *steps_from(4.0, 1, 10)]).wall_s == approx(1.0), "a start after the Hello"


def test_overlapping_step_reports_never_make_more_than_the_wall():
    # steps that claim 180 ms every 150 ms (as a replay's made-up numbers may): clipped to their gaps
    msgs = [hello(0, 0.0), *(step(n, 0.15 * n, 180.0) for n in range(1, 21))]
    r = goodput_of(msgs)
    assert r.productive_s == approx(0.15 * 20)
    assert r.goodput == approx(1.0)


def test_a_new_run_id_starts_a_new_count_and_the_uis_own_messages_are_ignored():
    g = Goodput()
    for m in checkpointed_run():
        g.add(m)
    g.add(Event(rank=-1, ts=T0 + 50.0, kind="ui"))
    assert g.result().wall_s == approx(2.0)
    g.add(hello(0, 10.0, run_id="run2"))
    g.add(step(1, 10.5, 500.0))
    r = g.result()
    assert r.wall_s == approx(0.5) and r.goodput == approx(1.0)



def mixed_run() -> list:
    """Every cause at once: 1 s start-up, 10 steps, a 0.5 s checkpoint, a 0.5 s switch, a skipped
    step, a 2 s stall inside a step, a 0.3 s tail."""
    return [hello(0, 0.0), hello(1, 0.0), *steps_from(1.0, 1, 10), event("checkpoint", 2.5, 0.5),
            event("switch", 3.0, 0.5), step(11, 3.1, skipped=True), stall(1, 4.0, running_s=0.9),
            step(12, 5.1, 2000.0), stall(1, 5.1, "recovered"), *steps_from(5.1, 13, 5), bye(0, 5.9)]


def test_mixed_run_adds_up():
    r = goodput_of(mixed_run())
    expected = {"startup": 1.0, "restart": 0.0, "checkpoint": 0.5, "switch": 0.5, "skipped": 0.1, "stall": 2.0,
                "other": 0.3}
    assert r.lost_s == approx(expected)
    assert r.productive_s == approx(15 * 0.1)
    assert r.goodput == approx(1.5 / 5.9)


@pytest.mark.parametrize("cause", ["stall", "skipped", "checkpoint", "switch"])
def test_the_numbers_are_wrong_if_a_cause_is_ignored(cause, monkeypatch):
    """The check bites: an accumulator blind to one cause gets the goodput (stalls, skipped steps)
    or the breakdown (checkpoints, switches: their time then shows as `other`) wrong."""
    right = goodput_of(mixed_run())
    msgs = mixed_run()
    if cause == "skipped":
        msgs = [msgspec.structs.replace(m, skipped=False) if isinstance(m, Step) else m for m in msgs]
    elif cause == "stall":
        monkeypatch.setattr(Goodput, "_stall", lambda self, msg, rank, ts: None)
    else:
        msgs = [m for m in msgs if not (isinstance(m, Event) and m.kind == cause)]
    wrong = goodput_of(msgs)
    if cause in ("stall", "skipped"):
        assert wrong.goodput > right.goodput + 0.01
    else:
        assert wrong.goodput == approx(right.goodput)
        assert wrong.lost_s[cause] == 0.0 and wrong.lost_s["other"] == approx(right.lost_s["other"] + 0.5)


events_st = st.lists(st.tuples(
    st.sampled_from(["step", "skip", "checkpoint", "switch", "stalled", "recovered", "bye", "hello", "restart"]),
    st.integers(0, 1), st.floats(0.0, 0.5), st.floats(0.0, 3.0)), max_size=60)


def ops_to_messages(ops) -> list:
    """A restart resumes from a step between 0 (from scratch) and the latest (no step redone)."""
    msgs, t, n, attempt = [hello(0, 0.0)], 0.0, 0, 0
    for kind, rank, dt, amount in ops:
        t += dt
        n += kind in ("step", "skip")
        if kind == "step":
            msgs.append(step(n, t, amount * 1e3, rank))
        elif kind == "skip":
            msgs.append(step(n, t, amount * 1e3, rank, skipped=True))
        elif kind == "restart":
            attempt += 1
            n = n * int(amount) // 3
            msgs.append(hello(rank, t, restart=attempt))
        elif kind in ("checkpoint", "switch"):
            msgs.append(event(kind, t, amount, rank))
        elif kind in ("stalled", "recovered"):
            msgs.append(stall(rank, t, kind, amount))
        elif kind == "bye":
            msgs.append(bye(rank, t))
        else:
            msgs.append(hello(rank, t))
    return msgs


@settings(max_examples=200, deadline=None)
@given(events_st)
def test_goodput_stays_within_0_and_1_and_every_second_is_put_down(ops):
    r = goodput_of(ops_to_messages(ops))
    assert 0.0 <= r.goodput <= 1.0 or math.isnan(r.goodput)
    assert 0.0 <= r.productive_s <= r.wall_s + 1e-9
    assert all(v >= 0 for v in r.lost_s.values())
    assert r.productive_s + sum(r.lost_s.values()) >= r.wall_s - 1e-6


def test_ringtop_summary_prints_the_goodput_and_its_breakdown(tmp_path, capsys):
    from ringtop.cli.main import main
    from ringtop.protocol import to_json_line

    run = checkpointed_run()
    for rank in (0, 1):
        (tmp_path / f"rank-{rank}.jsonl").write_bytes(b"".join(to_json_line(m) for m in run if m.rank == rank))
    assert main(["summary", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "goodput 50.0% of 2 s wall: productive 1 s; lost: startup 0.5 s, checkpoint 0.5 s\n" in out


def handed_over(prefix: list) -> GoodputSoFar:
    """What rank 0's relay sends a new subscriber after `prefix`, through the wire format."""
    from ringtop.agent.transport.relay import Relay

    relay = Relay.__new__(Relay)  # only its message builder: no sockets
    relay.goodput = Goodput()
    for m in prefix:
        relay.goodput.add(m)
    return decode(encode(relay._goodput_so_far()))


@settings(max_examples=200, deadline=None)
@given(events_st, st.integers(0, 60))
def test_a_count_handed_over_mid_run_goes_on_as_if_every_message_had_been_seen(ops, split):
    msgs = ops_to_messages([op for op in ops if op[0] not in ("checkpoint", "switch")])
    split = min(split, len(msgs) - 1) + 1
    whole = goodput_of(msgs)
    late = Goodput()
    late.add(msgs[0])  # the replayed Hello, then the relay's count, then what follows
    late.add(handed_over(msgs[:split]))
    for m in msgs[split:]:
        late.add(m)
    r = late.result()
    assert r.wall_s == approx(whole.wall_s) and r.productive_s == approx(whole.productive_s)
    assert r.steps == whole.steps
    for cause in CAUSES:
        assert r.lost_s[cause] == approx(whole.lost_s[cause]), cause


def test_a_checkpoint_reaching_back_before_the_hand_over_is_clipped_there():
    before = [hello(0, 0.0), *steps_from(0.5, 1, 5)]  # steps end at 1.0 s
    after = [event("checkpoint", 1.4, 0.6), *steps_from(1.4, 6, 5)]  # reaches back to 0.8 s
    late = Goodput()
    late.add(before[0])
    late.add(handed_over(before))
    for m in after:
        late.add(m)
    assert late.result().lost_s["checkpoint"] == approx(0.4)  # 1.0 -> 1.4; 0.8 -> 1.0 overlapped steps anyway
    assert goodput_of(before + after).lost_s["checkpoint"] == approx(0.4)


@pytest.mark.parametrize("change", [
    {"run_id": "another"}, {"productive_s": 100.0}, {"stall_closed_s": 100.0}, {"as_of_ts": T0 - 1.0},
    {"first_step_start_ts": T0 + 50.0}, {"open_stalls": [(1, T0 + 50.0)]}, {"startup_s": 100.0},
])
def test_a_hand_over_that_does_not_add_up_or_is_of_another_run_is_ignored(change):
    run = checkpointed_run()
    so_far = msgspec.structs.replace(handed_over(run[:8]), **change)
    g = Goodput()
    for m in run[:8]:
        g.add(m)
    kept = g.result()
    g.add(so_far)
    assert g.result() == kept


def test_a_hand_over_with_negative_seconds_does_not_decode():
    good = handed_over(checkpointed_run()[:8])
    with pytest.raises(ProtocolError):
        decode(encode(msgspec.structs.replace(good, productive_s=-1.0)))


# ------------------------------------------------------------------ restarts (torchrun --max-restarts)


def adds_up(r) -> bool:
    return r.productive_s + sum(r.lost_s.values()) == approx(r.wall_s)


def restarted_run(resume_from: int) -> list:
    """Attempt 0: 0.5 s start-up, steps 1..10 of 100 ms (end 1.5 s), then a crash. Attempt 1's
    Hellos at 3.0 s; it resumes after step `resume_from`: 15 steps of 100 ms from 4.0 s; ends 5.6 s."""
    return [hello(0, 0.0), hello(1, 0.0), *steps_from(0.5, 1, 10),
            hello(1, 3.0, restart=1), hello(0, 3.1, restart=1),
            *steps_from(4.0, resume_from + 1, 15), bye(1, 5.55), bye(0, 5.6)]


@pytest.mark.parametrize("resume_from", [0, 4, 10])
def test_a_restart_loses_the_gap_and_the_steps_it_redoes(resume_from):
    """From scratch (0), from an older checkpoint (4), from the latest one (10: nothing redone)."""
    r = goodput_of(restarted_run(resume_from))
    redone = 10 - resume_from  # attempt 1's steps numbered 1..10 were done before the crash
    gap = 4.0 - 1.5  # end of attempt 0's last step -> start of attempt 1's first
    assert r.wall_s == approx(5.6)
    assert r.lost_s["startup"] == approx(0.5)
    assert r.lost_s["restart"] == approx(gap + redone * 0.1)
    assert r.productive_s == approx(10 * 0.1 + (15 - redone) * 0.1)
    assert r.lost_s["other"] == approx(5.6 - 5.5)
    assert r.restarts == 1 and r.steps == 25
    assert adds_up(r)
    # The check bites: with the redo test in Goodput._step changed to `False` (redone steps counted
    # productive), the from-scratch case failed here (productive 2.5 s for 1.5 s, restart 2.5 s for 3.5 s).


def test_a_restart_in_progress_is_counted_until_the_latest_message():
    g = Goodput()
    for m in restarted_run(0)[:14]:  # ... attempt 1's Hellos: no step of it yet
        g.add(m)
    g.add(stall(1, 3.5, running_s=0.2))  # attempt 1's rank 1 stuck since 3.3 s, still
    r = g.result()
    assert r.wall_s == approx(3.5) and r.restarts == 1
    assert r.lost_s["stall"] == approx(3.5 - 3.3)
    assert r.lost_s["restart"] == approx((3.5 - 1.5) - (3.5 - 3.3))
    assert adds_up(r)


def test_a_stall_in_progress_at_the_crash_ends_with_rank_0s_last_step():
    """Rank 1 hangs from 1.0 s; rank 0's step 6 (1.0 -> 2.0 s) waits for it; the run crashes and
    attempt 1 starts at 4.0 s. Its rank 1 is stuck from 4.3 to 4.8 s (a stall, not the restart's);
    it resumes from the checkpoint at step 5: steps 6..10 from 5.0 s, step 6 redone."""
    msgs = [hello(0, 0.0), hello(1, 0.0), *steps_from(0.5, 1, 5), stall(1, 1.5, running_s=0.5),
            step(6, 2.0, 1000.0), stall(1, 3.5, running_s=2.5),
            hello(0, 4.0, restart=1), hello(1, 4.0, restart=1), stall(1, 4.6, running_s=0.3),
            stall(1, 4.8, "recovered"), *steps_from(5.0, 6, 5)]
    g = Goodput()
    for m in msgs[:10]:  # up to attempt 0's last stall report
        g.add(m)
    assert g.result().lost_s["stall"] == approx(3.5 - 1.0)  # while no restart is known: a stall
    r = goodput_of(msgs)
    stalled = (2.0 - 1.0) + (4.8 - 4.3)  # attempt 0's, to the end of step 6; attempt 1's
    assert r.wall_s == approx(5.5)
    assert r.lost_s["stall"] == approx(stalled)
    assert r.lost_s["restart"] == approx((5.0 - 2.0) - (4.8 - 4.3) + 0.1)
    assert r.productive_s == approx(5 * 0.1 + 4 * 0.1)  # step 6 was all stall in attempt 0
    assert r.lost_s["startup"] == approx(0.5) and r.lost_s["other"] == approx(0.0)
    assert adds_up(r)


def test_a_restart_before_the_first_step_is_start_up():
    msgs = [hello(0, 0.0), hello(1, 0.1), stall(1, 1.5, running_s=1.0),
            hello(0, 2.0, restart=1), hello(1, 2.1, restart=1), *steps_from(3.0, 1, 5)]
    r = goodput_of(msgs)
    assert r.restarts == 1 and r.wall_s == approx(3.5)
    assert r.lost_s["restart"] == 0.0
    assert r.lost_s["stall"] == approx(2.0 - 0.5)  # attempt 0's stall ends at attempt 1's Hello
    assert r.lost_s["startup"] == approx(3.0 - (2.0 - 0.5))
    assert r.productive_s == approx(0.5)
    assert adds_up(r)


def twice_restarted_run() -> list:
    """Attempt 0: steps 1..10 from 0.5 s (end 1.5 s). Attempt 1 (Hellos at 2.0 s) resumes after
    step 5: steps 6..11 from 3.0 s (end 3.6 s), rank 1's Hello again (for late joiners), step 12
    3.7 -> 3.8 s. Attempt 2 (Hellos at 4.5 s) resumes after step 10: steps 11..15 from 5.0 s."""
    return [hello(0, 0.0), hello(1, 0.0), *steps_from(0.5, 1, 10),
            hello(0, 2.0, restart=1), hello(1, 2.0, restart=1), *steps_from(3.0, 6, 6),
            hello(1, 3.65, restart=1), step(12, 3.8), stall(1, 4.2, running_s=0.3),
            hello(1, 4.5, restart=2), hello(0, 4.6, restart=2), *steps_from(5.0, 11, 5)]


def test_two_restarts_each_lose_their_gap_and_redone_steps():
    r = goodput_of(twice_restarted_run())
    first = (3.0 - 1.5) + 5 * 0.1  # steps 6..10 redone
    second = (5.0 - 3.8) + 2 * 0.1  # steps 11, 12 redone; attempt 1's rank 1 stall (from 3.9 s) was after its last step
    assert r.restarts == 2 and r.wall_s == approx(5.5)
    assert r.lost_s["restart"] == approx(first + second)
    assert r.productive_s == approx(10 * 0.1 + 2 * 0.1 + 3 * 0.1)
    assert r.lost_s["other"] == approx(3.7 - 3.6)  # a repeated Hello of an attempt is no new restart
    assert r.lost_s["stall"] == 0.0 and r.lost_s["startup"] == approx(0.5)
    assert adds_up(r)


def test_a_hello_without_a_believable_restart_count_begins_no_restart():
    for bad in (True, -1, "1", 1.0):
        msgs = restarted_run(0)
        msgs = [msgspec.structs.replace(m, restart_count=bad) if isinstance(m, Hello) and m.restart_count else m
                for m in msgs]
        r = goodput_of(msgs)
        assert r.restarts == 0 and r.lost_s["restart"] == 0.0, bad


def test_a_digests_brief_of_a_step_counts_as_the_step():
    """tui/state/rank_fold.py folds a digest's older steps by their numbers (Goodput.add_step)."""
    msgs = twice_restarted_run()
    g = Goodput()
    for m in msgs:
        if isinstance(m, Step):
            g.add_step(m.rank, m.ts, m.step_ms, m.skipped, m.step)
        else:
            g.add(m)
    assert g.result() == goodput_of(msgs)


@pytest.mark.parametrize("run", [twice_restarted_run, lambda: restarted_run(4)])
def test_a_count_handed_over_during_a_restart_goes_on_as_if_every_message_had_been_seen(run):
    msgs = run()
    whole = goodput_of(msgs)
    for split in range(1, len(msgs)):
        late = Goodput()
        replayed = {m.rank: m for m in msgs[:split] if isinstance(m, Hello)}  # the relay's latest of each rank
        for m in replayed.values():
            late.add(m)
        late.add(handed_over(msgs[:split]))
        for m in msgs[split:]:
            late.add(m)
        r = late.result()
        assert (r.wall_s, r.productive_s, r.steps, r.restarts) == (approx(whole.wall_s), approx(whole.productive_s),
                                                                   whole.steps, whole.restarts), split
        assert r.lost_s == approx(whole.lost_s), split


@pytest.mark.parametrize("change", [
    {"restarts": 0}, {"restart_from_ts": T0 + 50.0}, {"redo_through_step": 99}, {"restart_s": 100.0},
])
def test_a_hand_over_whose_restart_does_not_add_up_is_ignored(change):
    run = twice_restarted_run()
    cut = 14  # during attempt 1's restart: its Hellos came, none of its steps
    so_far = handed_over(run[:cut])
    assert so_far.restart_from_ts is not None and so_far.redo_through_step == 10  # what the changes spoil
    g = Goodput()
    for m in run[:cut]:
        g.add(m)
    kept = g.result()
    g.add(msgspec.structs.replace(so_far, **change))
    assert g.result() == kept
    for m in run[cut:]:
        g.add(m)
    assert g.result() == goodput_of(run)


def test_ringtop_summary_and_the_prometheus_exporter_show_the_restart(tmp_path, capsys):
    from ringtop.agent.prometheus.exporter import RunMetrics
    from ringtop.cli.main import main
    from ringtop.protocol import to_json_line

    run = restarted_run(0)
    for rank in (0, 1):  # both attempts' messages in each rank's log
        (tmp_path / f"rank-{rank}.jsonl").write_bytes(b"".join(to_json_line(m) for m in run if m.rank == rank))
    assert main(["summary", str(tmp_path)]) == 0
    assert "lost: startup 0.5 s, restart 3.5 s, other 0.1 s\n" in capsys.readouterr().out
    metrics = RunMetrics()
    for m in run:
        metrics.observe(m)
    lost = {s.labels["cause"]: s.value for fam in metrics.collect() if fam.name == "ringtop_goodput_lost_seconds"
            for s in fam.samples if s.name.endswith("_total")}
    assert lost["restart"] == approx(2.5 + 1.0) and set(lost) == set(CAUSES)
