"""`profile STEPS` on a real 2-rank run: Chrome traces per rank, exposed communication from the
trace beside the live estimate."""

from __future__ import annotations

import json

import pytest

from ringtop.cli.ctl import send_command
from ringtop.protocol import Event

pytestmark = pytest.mark.timeout(180)


def test_profile_writes_a_trace_per_rank_and_reports_exposed_comm(launch_agents):
    run = launch_agents(2, "--steps", "0", "--batch-size", "4", "--seq-len", "32")
    run.wait_for_step(2)
    replies = list(send_command(run.control, "profile", {"steps": 2}, timeout_s=120))
    assert [r.status for r in replies] == ["ack", "done"], replies[-1].error
    ranks = replies[-1].result["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        trace = json.loads(open(r["trace"]).read())
        assert any(e.get("name", "").startswith("gloo:all_reduce") for e in trace["traceEvents"])
        assert 0 <= r["exposed_comm_ms_per_step_trace"] <= r["comm_ms_per_step_trace"]
        assert r["exposed_comm_ms_per_step_live"] >= 0 and 0 <= r["overlap_pct_trace"] <= 100
    bad = list(send_command(run.control, "profile", {"steps": 0}, timeout_s=30))
    assert bad[-1].code == "bad_arguments"
    assert list(send_command(run.control, "stop", {}, timeout_s=60))[-1].status == "done"
    assert run.wait(60) == 0
    assert any(isinstance(m, Event) and m.kind == "profile" and "from the trace" in m.text for m in run.messages(0))
