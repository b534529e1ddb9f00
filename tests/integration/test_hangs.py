"""Hung, stuck and out-of-step ranks in real 2–3 rank gloo runs: each injected fault is named with the
right rank, collective and step; a stuck run still stops; a healthy run raises nothing."""

from __future__ import annotations

import os
import signal

import pytest
from conftest import further, poll_until

from ringtop.protocol import Bye, Event, Stall

SMALL = ("--batch-size", "2", "--seq-len", "32")
FAST_WATCH = ("--stall-floor", "2")


def events(run, kind: str, rank: int = 0) -> list[Event]:
    return [m for m in run.messages(rank) if isinstance(m, Event) and m.kind == kind]


def byes(run) -> dict[int, Bye]:
    return {r: m for r in range(run.nproc) for m in run.messages(r) if isinstance(m, Bye)}


def hello_pid(run, rank: int) -> int:
    return next(m.pid for m in run.messages(rank) if m.__struct_config__.tag == "hello")


def first_hang(run, timeout_s: float = 60) -> Event:
    return poll_until(lambda: next((e for e in events(run, "hang") if e.level == "error"), None), timeout_s,
                      "a hang event from rank 0", interval_s=0.1, detail=lambda: run.output()[-3000:])


@pytest.mark.timeout(150)
def test_a_rank_hung_in_forward_is_named_its_stack_fetched_and_a_stuck_peer_stops_on_sigterm(launch_agents):
    run = launch_agents(2, "--steps", "0", "--inject-hang", "1:6", *FAST_WATCH, *SMALL)
    hang = first_hang(run)
    seq = hang.hang.seq
    assert hang.hang.verdict == "hang" and hang.hang.culprits == [1] and hang.hang.waiting == [0]
    assert hang.hang.step == 6 and hang.hang.group == "world" and hang.hang.collective == "all_reduce"
    assert hang.text.startswith(f"rank 1 has not entered all_reduce #{seq} on group world")
    assert "rank 1 is in forward at model.py:" in hang.text

    replies = list(run.send_command("stacks", {}, timeout_s=30))
    result = replies[-1].result
    assert replies[-1].status == "done" and result["answered"] == 2 and result["missing"] == []
    by_rank = {g["ranks"][0]: g for g in result["groups"]}
    assert by_rank[1]["phase"] == "forward" and by_rank[1]["where"].startswith("model.py:")
    assert any(frame.endswith("in forward") and "model.py" in frame for frame in by_rank[1]["stack"])
    assert any(f"all_reduce #{seq} on group world" in op for op in by_rank[0]["in_flight"])

    os.kill(hello_pid(run, 0), signal.SIGTERM)  # rank 0 waits inside the all-reduce: no Python handler runs
    bye = poll_until(lambda: byes(run).get(0), 30, "rank 0's Bye", detail=lambda: run.output()[-3000:])
    assert not bye.ok
    assert bye.reason.startswith("interrupted: SIGTERM while stuck at step 6 in backward")
    assert bye.reason.endswith(f"inside all_reduce #{seq} on group world")


@pytest.mark.timeout(150)
def test_ctl_stop_ends_a_run_stuck_before_a_collective_on_every_rank(launch_agents):
    run = launch_agents(2, "--steps", "0", "--inject-hang", "1:5:before-collective", *FAST_WATCH, *SMALL)
    hang = first_hang(run)
    assert hang.hang.culprits == [1] and hang.hang.step == 5
    assert "rank 1 is in backward" in hang.text, "the hook hangs in backward, where DDP issues its all-reduce"
    stalls = [m for m in run.messages(1) if isinstance(m, Stall) and m.state == "stalled"]
    assert stalls and stalls[-1].in_flight == [], "rank 1 never issued it"

    replies = list(run.send_command("stop", {"reason": "3am"}, timeout_s=30))
    assert [r.status for r in replies] == ["ack", "done"]
    assert "stuck" in replies[-1].result
    assert run.wait(30) != 0
    reasons = {r: b.reason for r, b in byes(run).items()}
    assert set(reasons) == {0, 1}, reasons
    assert reasons[0].startswith("stopped by user: 3am while stuck at step 5 in backward"), reasons
    assert reasons[1].startswith("stopped by user: 3am while stuck at step 5 in backward"), reasons


@pytest.mark.timeout(150)
def test_a_collective_of_another_size_is_named_as_a_desync_in_its_step(launch_agents):
    """Gloo fills rank 2's larger broadcast buffer without complaint: only the digests differ."""
    run = launch_agents(3, "--steps", "7", "--inject-desync", "2:5", *SMALL)
    assert run.wait(120) == 0, run.output()[-3000:]
    desyncs = events(run, "desync")
    assert [(e.hang.step, e.hang.group, e.hang.culprits, e.hang.waiting) for e in desyncs] == \
        [(5, "world", [2], [0, 1])]
    assert desyncs[0].text.startswith("desync in step 5 on group world: rank 2 issued")


@pytest.mark.timeout(150)
@further  # test_diagnosis.py's healthy run (40 steps) holds the same check
def test_a_healthy_run_of_100_steps_raises_no_alarm(launch_agents):
    run = launch_agents(2, "--steps", "100", *SMALL)
    assert run.wait(140) == 0, run.output()[-3000:]
    assert len(run.steps(0)) == 100
    for rank in range(2):
        assert [m for m in run.messages(rank) if isinstance(m, Stall)] == []
    assert events(run, "hang") == [] and events(run, "desync") == []
