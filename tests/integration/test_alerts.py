"""Alerts (agent/alerts.py) against a real HTTP server and a real command on loopback: one POST
when an incident opens and one when it resolves, whatever the restatements; a dead endpoint is
said once and counted; nothing blocks the caller."""

from __future__ import annotations

import json
import sys
import time

import pytest
from conftest import poll_until
from webhook_receiver import Receiver

from ringtop.agent.alerts import Alerts, AlertTargets
from ringtop.protocol import Bye, Event, Hello, Step, decode, encode, free_tcp_port


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def wire(msg):
    """As the relay forwards it: encoded and decoded by the protocol's codec."""
    return decode(encode(msg))


def hang_event(verdict: str, culprits: list[int], text: str, step: int = 40) -> Event:
    return wire(Event(rank=0, level="error" if verdict != "cleared" else "info", kind="hang", text=text, step=step,
                      data={"verdict": verdict, "culprits": culprits, "waiting": [0], "step": step}))


def test_one_post_per_opening_and_one_per_resolution(receiver, tmp_path):
    said = []
    alerts = Alerts(AlertTargets(webhook=receiver.url), "r1", str(tmp_path / "logs"), say=lambda *a: said.append(a))
    alerts.start()
    try:
        for rank in (0, 1):
            alerts.observe(wire(Hello(rank=rank, run_id="r1", world_size=2, host=f"node{rank}")))
        for _ in range(6):  # restated every few seconds
            alerts.observe(hang_event("hang", [1], "rank 1 is stuck in forward at model.py:57"))
        poll_until(lambda: len(receiver.bodies) == 1, 10, "the opening POST")
        alerts.observe(hang_event("cleared", [], "the stall is over after 12 s: every rank is stepping again"))
        poll_until(lambda: len(receiver.bodies) == 2, 10, "the resolution POST")
        alerts.observe(wire(Step(rank=0, step=41, loss=2.0, step_ms=10)))
    finally:
        alerts.stop()
    opened, resolved = receiver.bodies
    assert opened["ringtop"]["action"] == "opened" and opened["ringtop"]["kind"] == "hang"
    assert opened["ringtop"]["ranks"] == [1] and opened["ringtop"]["hosts"] == ["node1"]
    assert opened["ringtop"]["step"] == 40 and "ringtop replay" in opened["ringtop"]["replay"]
    assert opened["text"].startswith("🔴 ringtop run r1: hang opened at step 40") and "1 (node1)" in opened["text"]
    assert resolved["ringtop"]["action"] == "resolved" and resolved["text"].startswith("✅")
    assert alerts.sent == 2 and alerts.failed == 0 and said == []


def test_a_dead_rank_resolves_with_the_run_and_the_command_gets_each_notice(tmp_path):
    out = tmp_path / "got"
    out.mkdir()
    script = tmp_path / "hook.py"
    script.write_text("import sys, json, os, uuid\n"
                      f"open(os.path.join({str(out)!r}, uuid.uuid4().hex), 'w').write(sys.stdin.read())\n")
    alerts = Alerts(AlertTargets(command=f"{sys.executable} {script}"), "r2")
    alerts.start()
    try:
        alerts.observe(hang_event("dead", [0], "rank 0 ended without a Bye after step 366 (killed by SIGKILL)"))
        alerts.observe(wire(Bye(rank=0, reason="failed")))
        poll_until(lambda: len(list(out.iterdir())) == 2, 20, "two notices through the command")
    finally:
        alerts.stop()
    got = sorted((json.loads(p.read_text())["ringtop"] for p in out.iterdir()), key=lambda b: b["ts"])
    assert [(g["kind"], g["action"]) for g in got] == [("death", "opened"), ("death", "resolved")]


def test_a_dead_endpoint_is_said_once_counted_and_never_blocks(tmp_path):
    said = []
    dead = f"http://127.0.0.1:{free_tcp_port()}/hook"
    alerts = Alerts(AlertTargets(webhook=dead), "r3", say=lambda *a: said.append(a))
    alerts.start()
    try:
        started = time.perf_counter()
        for i in range(3):  # three incidents, each opened
            alerts.observe(wire(Event(rank=0, level="warn", kind="nonfinite", text="nan", step=i)) if i == 0 else
                           hang_event("hang" if i == 1 else "desync", [1], "stuck"))
        assert time.perf_counter() - started < 0.5, "the observer only queues"
        poll_until(lambda: alerts.failed == 3, 30, "three failed sends")
    finally:
        alerts.stop()
    assert len(said) == 1 and said[0][:2] == ("warn", "alert") and "said once" in said[0][2]


def test_targets_are_validated():
    for kwargs in ({"webhook": "file:///etc/passwd"}, {"command": "  "}, {"goodput_floor_pct": 120}):
        with pytest.raises(ValueError):
            AlertTargets(**kwargs)
