"""`profile STEPS` on a real 2-rank run: Chrome traces per rank, exposed communication from the
trace beside the live estimate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ringtop.protocol import Event

pytestmark = pytest.mark.timeout(180)


def test_profile_writes_a_trace_per_rank_and_reports_exposed_comm(launch_agents):
    run = launch_agents(2, "--steps", "0", "--batch-size", "4", "--seq-len", "32")
    run.wait_for_step(2)
    replies = list(run.send_command("profile", {"steps": 2}, timeout_s=120))
    assert [r.status for r in replies] == ["ack", "done"], replies[-1].error
    ranks = replies[-1].result["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        trace = json.loads(Path(r["trace"]).read_text())
        assert any(e.get("name", "").startswith("gloo:all_reduce") for e in trace["traceEvents"])
        assert 0 <= r["exposed_comm_ms_per_step_trace"] <= r["comm_ms_per_step_trace"]
        assert r["exposed_comm_ms_per_step_live"] >= 0 and 0 <= r["overlap_pct_trace"] <= 100
    bad = list(run.send_command("profile", {"steps": 0}, timeout_s=30))
    assert bad[-1].code == "bad_arguments"
    assert list(run.send_command("stop", {}, timeout_s=60))[-1].status == "done"
    assert run.wait(60) == 0
    assert any(isinstance(m, Event) and m.kind == "profile" and "from the trace" in m.text for m in run.messages(0))


def test_profile_of_a_pipeline_keeps_p2p_waits_out_of_exposed_comm(launch_agents):
    """On a 2-stage pipeline a stage's send/recv lasts until the other stage is ready: bubble. When
    the trace analysis counted it as communication (and took the whole profile window, control
    broadcasts included, as one step), its exposed comm was 745 ms/step against a live 80 (measured,
    gpipe, 4 micro-batches). Kept apart, the trace's exposed collective comm stays below the steps'
    idle time (of which it is a part), and the p2p wait is reported on its own and is the larger.
    (Trace and live estimate are not compared with each other: in a full-suite run the trace once
    said 27 ms against a live 8, where alone they agree within 2x; which to trust is for the UI to
    say, issue 13.)"""
    run = launch_agents(2, "--strategy", "pp", "--micro-batches", "4", "--steps", "0", "--batch-size", "4",
                        "--seq-len", "32")
    run.wait_for_step(3)
    replies = list(run.send_command("profile", {"steps": 3}, timeout_s=120))
    assert [r.status for r in replies] == ["ack", "done"], replies[-1].error
    ranks = replies[-1].result["ranks"]
    assert list(run.send_command("stop", {}, timeout_s=60))[-1].status == "done"
    assert run.wait(60) == 0
    for r in ranks:
        names = {e.get("name", "") for e in json.loads(Path(r["trace"]).read_text())["traceEvents"]}
        assert {"gloo:send", "gloo:recv"} <= names, "the stages exchanged activations point to point"
        profiled = [s for s in run.steps(r["rank"]) if r["first_step"] <= s.step < r["first_step"] + r["steps"]]
        assert len(profiled) == r["steps"]
        idle_ms = sum(s.idle_ms for s in profiled) / len(profiled)
        exposed, live = r["exposed_comm_ms_per_step_trace"], r["exposed_comm_ms_per_step_live"]
        assert r["p2p_wait_ms_per_step_trace"] > 0
        assert 0 <= exposed <= idle_ms, (r, idle_ms, live)
    # the waiting the old analysis called communication is the p2p wait now
    assert max(r["p2p_wait_ms_per_step_trace"] for r in ranks) > max(r["exposed_comm_ms_per_step_trace"] for r in ranks)
