"""The run's lifecycle (metrics/run_lifecycle.py), one fold for every surface: each transition
from the ranks' ends, a user's stop told from a crash, and the words each surface then shows —
the view model, the health line, the header, the commands, `ringtop run`'s last line and exit
code, `summary` and Prometheus."""

from __future__ import annotations

import threading
import time

import msgspec
import pytest
import zmq
from rich.text import Text
from ui_waits import eventually

from ringtop.metrics.run_lifecycle import (
    ENDED,
    FAILED,
    LIVE,
    STALLED,
    STARTING,
    STOPPED,
    RankEnd,
    fold,
    stop_source,
)
from ringtop.protocol import Bye, Heartbeat, Hello, Step, decode, encode, free_tcp_ports, to_json_line
from ringtop.tui.header.render import header_model
from ringtop.tui.state.health import health_line
from ringtop.tui.state.view_model import RunView

CRASH = "error: RuntimeError: CUDA error: an illegal memory access was encountered"


def bye(rank, step, reason, ok=True, at=10.0):
    return RankEnd(rank, step, ok, reason, at=at)


# ------------------------------------------------------------------ the fold, every transition


def test_before_any_message_and_before_any_step_the_run_is_starting():
    assert fold([], world_size=2, running=0, heard=False).state == STARTING
    assert fold([], world_size=2, running=2, stepped=False).state == STARTING
    assert fold([], world_size=2, running=2).state == LIVE


def test_a_stalled_or_dead_rank_makes_a_going_run_stalled_not_over():
    life = fold([], world_size=2, running=2, stalled=[1])
    assert (life.state, life.rank) == (STALLED, 1) and not life.final
    dead = fold([RankEnd(1, 5, None, how="died")], world_size=2, running=1)
    assert dead.state == STALLED and dead.rank == 1 and not dead.final
    # rank 0 waits in a collective for rank 1, which is stuck (alive, silent): rank 1 is named
    held = fold([], world_size=4, running=4, stalled=[0, 2], stuck=[3])
    assert (held.state, held.rank, held.words) == (STALLED, 3, "ranks 3, 0, 2 not stepping")
    # one rank already said a good Bye, the other still trains: live, not over
    assert fold([bye(0, 9, "completed 9 steps")], world_size=2, running=1).state == LIVE


def test_every_rank_completed_is_ended():
    life = fold([bye(0, 100, "completed 100 steps"), bye(1, 100, "completed 100 steps")], world_size=2)
    assert (life.state, life.words, life.exit_code) == (ENDED, "completed 100 steps", 0) and life.final


@pytest.mark.parametrize("reasons, by, code", [
    (("interrupted: SIGINT", "interrupted: SIGINT"), "Ctrl-C", 130),
    (("interrupted: SIGTERM", "interrupted: SIGTERM while stuck at step 6 in backward"), "SIGTERM", 143),
    (("stopped by user: stopped by user", "completed 40 steps"), "ctl stop", 0),
    (("stopped by user: from the UI", "completed 40 steps"), "the UI", 0),
], ids=["ctrl-c", "sigterm", "ctl-stop", "ui"])
def test_a_users_stop_is_stopped_by_whom_never_failed(reasons, by, code):
    ok = not reasons[0].startswith("interrupted")  # a signal's Bye says ok=False: still a stop
    life = fold([bye(0, 40, reasons[0], ok), bye(1, 40, reasons[1], ok)], world_size=2)
    assert (life.state, life.by, life.exit_code) == (STOPPED, by, code)
    assert life.words == f"stopped by {by} at step 40"


def test_a_crash_is_failed_although_its_peer_says_it_was_interrupted_by_sigterm():
    """The launcher SIGTERMs the survivors of a crash: their Bye reads like a stop, the crash is the cause."""
    ends = [bye(0, 12, "interrupted: SIGTERM", ok=False, at=11.0), bye(1, 12, CRASH, ok=False, at=10.5)]
    life = fold(ends, world_size=2)
    assert (life.state, life.rank, life.exit_code) == (FAILED, 1, 1)
    assert life.words == f"rank 1: {CRASH}"
    # the same Byes with the crash taken away: a stop (the check bites on the crash alone)
    assert fold([ends[0], bye(1, 12, "interrupted: SIGTERM", ok=False)], world_size=2).state == STOPPED


def test_a_rank_killed_without_a_bye_is_named_before_the_peer_its_death_failed():
    ends = [bye(0, 7, "error: rank 1 (pid 42) has died", ok=False, at=9.0),
            RankEnd(1, 7, None, how="killed by SIGKILL", detail="the launcher's report", at=9.5)]
    life = fold(ends, world_size=2)
    assert (life.state, life.rank) == (FAILED, 1)
    assert life.words == "rank 1 killed by SIGKILL at step 7 (the launcher's report)"
    # rank 0 that carried the relay, killed: named, though both fell silent together
    both = [RankEnd(0, 30, None, how="killed by SIGKILL", at=5.0), RankEnd(1, 30, None, how="died", at=5.0)]
    assert fold(both, world_size=2).words.startswith("rank 0 killed by SIGKILL at step 30")


def test_the_run_is_not_over_until_every_rank_of_the_world_has_ended():
    assert not fold([bye(0, 5, "completed 5 steps")], world_size=2).final
    assert fold([bye(0, 5, "completed 5 steps")], world_size=0).final  # world unknown: those known


def test_a_command_stop_of_a_stuck_run_is_still_a_stop_and_exits_0(tmp_path):
    """The stall watch ends a stuck rank (its agent exits 3, the launcher 1): the stop stands."""
    from ringtop.cli.summary import report_end

    stuck = "stopped by user while stuck at step 6 in backward at model.py:57"
    write_logs(tmp_path / "logs", [Bye(rank=0, reason=stuck, ok=False, step=6)] * 2)
    assert report_end(1, tmp_path / "logs") == 0
    write_logs(tmp_path / "crash", [Bye(rank=0, reason=CRASH, ok=False, step=6)] * 2)
    assert report_end(1, tmp_path / "crash") == 1


@pytest.mark.parametrize("reason, who", [
    ("interrupted: SIGINT", "Ctrl-C"), ("interrupted: SIGHUP", "SIGHUP (the session closed)"),
    ("stopped by user: nightly budget spent", "nightly budget spent"), ("completed 10 steps", ""),
    ("error: Interrupted: SIGTERM", ""), ("interrupted: SIGSEGV", ""), ("", ""),
])
def test_stop_source_reads_only_stops(reason, who):
    assert stop_source(reason) == who


# ------------------------------------------------------------------ the view model and the screen's words


def hello(rank, **kw):
    return Hello(rank=rank, seq=0, ts=1000.0, run_id="lc1", world_size=2, host=f"node-{rank}", pid=4000 + rank,
                 model="tiny-gpt", param_count=1_000_000, strategy="ddp", **kw)


def ran(view: RunView, steps: int = 3) -> None:
    for r in (0, 1):
        view.apply(hello(r), now=1.0)
    for n in range(1, steps + 1):
        for r in (0, 1):
            view.apply(Step(rank=r, seq=n, ts=1000.0 + n, step=n, step_ms=50.0, loss=2.0), now=1.0 + n)


def plain(t: Text) -> str:
    return t.plain


@pytest.mark.parametrize("reason, ok, state, words", [
    ("completed 3 steps", True, "ended", "ended: completed 3 steps"),
    ("interrupted: SIGINT", False, "stopped", "stopped: stopped by Ctrl-C at step 3"),
    ("stopped by user: from the UI", True, "stopped", "stopped: stopped by the UI at step 3"),
    (CRASH, False, "failed", f"failed: rank 1: {CRASH}"),
], ids=["completed", "ctrl-c", "ui", "crash"])
def test_an_ended_run_is_never_healthy_and_the_header_says_how(reason, ok, state, words):
    v = RunView()
    ran(v)
    assert plain(health_line(v, 5.0)).startswith("● healthy")  # the same run before its end
    assert "tiny-gpt" in header_model(v, replay=False, source="tcp://x", width=90).facts.plain
    survivor = "interrupted: SIGTERM" if reason == CRASH else reason  # the launcher stops a crash's peer
    v.apply(Bye(rank=0, seq=4, ts=1010.0, reason=survivor, ok=ok, step=3), now=6.0)
    v.apply(Bye(rank=1, seq=4, ts=1010.0, reason=reason, ok=ok, step=3), now=6.0)
    assert v.tick(6.0) == state
    line = plain(health_line(v, 6.0))
    assert "healthy" not in line and "stepping" not in line and line.endswith(words), line
    header = header_model(v, replay=False, source="tcp://x", width=90)
    assert "tiny-gpt" in header.facts.plain, "the model's name stays after the end"
    assert header.connection.plain.startswith({"ended": "■ ended", "stopped": "■ stopped",
                                               "failed": "✖ failed"}[state])


def test_a_failed_attempt_with_restarts_left_is_restarting_then_the_last_one_failed():
    """Under torchrun --max-restarts 1: the first attempt's failure is no failed run (the launcher
    starts every rank again); the second attempt's, with no restart left, is."""
    v = RunView()
    for r in (0, 1):
        v.apply(hello(r, max_restarts=1), now=1.0)
    v.apply(Step(rank=0, seq=1, ts=1001.0, step=1, step_ms=50.0, loss=2.0), now=2.0)
    v.apply(Bye(rank=1, seq=2, ts=1002.0, reason=CRASH, ok=False, step=1), now=3.0)
    v.apply(Bye(rank=0, seq=2, ts=1002.5, reason="interrupted: SIGTERM", ok=False, step=1), now=3.0)
    assert v.tick(3.0) == "restarting"
    life = v.lifecycle()
    assert (life.state, life.rank, life.final, life.exit_code) == ("restarting", 1, False, 0)
    assert life.words == f"rank 1: {CRASH}; the launcher starts every rank again (1 restart left)"
    assert plain(health_line(v, 3.0)) == f"↻ restarting: {life.words}"
    assert header_model(v, replay=False, source="x", width=200).connection.plain.startswith("↻ restarting")
    assert [e.text for e in v.event_log.lines if e.kind == "failed"] == [f"the attempt failed: {life.words}"]
    for r in (0, 1):  # the launcher's second attempt, the last it allows
        v.apply(Hello(rank=r, seq=0, ts=1010.0, run_id="lc1", world_size=2, host=f"node-{r}", pid=5000 + r,
                      restart_count=1, max_restarts=1), now=4.0)
    assert v.lifecycle().state == "starting" and v.restart.count == 1
    assert v.restart.cause == f"rank 1: {CRASH}"
    v.apply(Bye(rank=1, seq=1, ts=1011.0, reason=CRASH, ok=False, step=0), now=5.0)
    v.apply(Bye(rank=0, seq=1, ts=1011.5, reason="interrupted: SIGTERM", ok=False, step=0), now=5.0)
    assert v.lifecycle().state == "failed" and v.lifecycle().final


def test_the_header_says_starting_then_live_then_stalled_with_the_rank():
    from ringtop.tui.header.render import connection_text

    v = RunView()
    for r in (0, 1):
        v.apply(hello(r), now=1.0)
    v.tick(1.5)
    assert connection_text(v, replay=False, now=1.5).plain == "○ starting"
    ran(v)
    v.tick(4.0)
    assert connection_text(v, replay=False, now=4.0).plain == "● live"
    for t in range(5, 30):  # rank 1 heartbeats but finishes no step; rank 0 steps on
        v.apply(Heartbeat(rank=1, seq=10 + t, step=3), now=float(t))
        v.apply(Step(rank=0, seq=10 + t, ts=1000.0 + t, step=t, step_ms=50.0, loss=2.0), now=float(t))
    v.tick(29.0)
    assert connection_text(v, replay=False, now=29.0).plain == "⏸ stalled: rank 1"


def test_a_command_in_flight_when_the_run_ends_resolves_not_run():
    v = RunView()
    ran(v)
    v.note_command_sent("c1", "checkpoint", {"kind": "full"})
    v.note_command_sent("s1", "stop", {"reason": "from the UI"})
    assert [c.phase for c in v.active_commands()] == ["pending", "pending"]
    v.apply(Bye(rank=0, seq=10, ts=1010.0, reason="completed 3 steps", step=3), now=6.0)
    assert len(v.active_commands()) == 2, "one rank still runs: nothing resolved yet"
    v.apply(Bye(rank=1, seq=10, ts=1010.0, reason="completed 3 steps", step=3), now=6.0)
    assert v.active_commands() == []
    assert (v.commands["c1"].phase, v.commands["c1"].error) == ("failed", "not run: the run ended")
    assert v.commands["s1"].phase == "done"
    assert any("not run: the run ended" in e.text for e in v.events)


def test_rank_0_dead_with_the_relay_reads_unreachable_until_a_witness_says_how():
    """Rank 0 carries the relay: when it is SIGKILLed the UI hears no rank at all."""
    v = RunView(stale_after_s=3.0)
    ran(v)
    v.apply(Heartbeat(rank=0, seq=9, step=3), now=4.5)
    v.apply(Heartbeat(rank=1, seq=9, step=3), now=4.5)
    v.tick(20.0)
    line = plain(health_line(v, 20.0))
    assert "rank 0 (the relay) unreachable" in line and "healthy" not in line, line
    v.note_rank_exit(0, "killed by SIGKILL", "the launcher's report")
    v.note_rank_exit(1, "ended without a Bye", "the launcher has exited")
    assert v.tick(21.0) == "failed"
    assert v.failure == "rank 0 killed by SIGKILL at step 3 (the launcher's report)"
    assert plain(health_line(v, 21.0)).startswith("✖ failed: rank 0 killed by SIGKILL at step 3")


def test_the_exit_probe_names_a_rank_whose_process_is_gone_on_this_host(tmp_path):
    """A real process that ended (its pid reaped) and one that lives (this test's own)."""
    import os
    import subprocess
    import sys

    from ringtop.tui.sources.exit_probe import ExitProbe, process_gone

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert process_gone(gone.pid) and not process_gone(os.getpid())
    v = RunView()
    for r, pid in ((0, gone.pid), (1, os.getpid())):
        v.apply(Hello(rank=r, seq=0, ts=1000.0, run_id="p", world_size=2, host="here", pid=pid), now=1.0)
    ExitProbe(host="here").probe(v, 10.0)
    assert v.ranks[0].dead and v.ranks[0].exit_how == "died" and not v.ranks[1].dead
    both = RunView()  # rank 0 carried the relay: both fall silent, rank 1 heard last from before rank 0
    for r in (0, 1):
        both.apply(Hello(rank=r, seq=0, ts=1000.0, run_id="q", world_size=2, host="here", pid=gone.pid), now=2.0 - r)
    ExitProbe(host="here").probe(both, 10.0)
    assert both.lifecycle().state == "failed" and both.lifecycle().rank == 0
    other = RunView()
    other.apply(Hello(rank=0, seq=0, ts=1000.0, run_id="p", world_size=1, host="there", pid=gone.pid), now=1.0)
    ExitProbe(host="here").probe(other, 10.0)
    assert not other.ranks[0].dead, "a pid on another host says nothing"


# ------------------------------------------------------------------ the logs: `ringtop run`'s last line, summary


def write_logs(log_dir, ends):
    log_dir.mkdir()
    for rank, last in enumerate(ends):
        lines = [to_json_line(hello(rank)),
                 to_json_line(Step(rank=rank, seq=1, ts=1001.0, step=40, step_ms=5.0, loss=2.0))]
        if last is not None:
            lines.append(to_json_line(msgspec.structs.replace(last, rank=rank, seq=2, ts=1002.0)))
        (log_dir / f"rank-{rank}.jsonl").write_bytes(b"".join(lines))


@pytest.mark.parametrize("ends, code, said", [
    ([Bye(rank=0, reason="interrupted: SIGINT", ok=False, step=40)] * 2, 130,
     ["ringtop: the run stopped by Ctrl-C at step 40 (exit code 130)"]),
    ([Bye(rank=0, reason="stopped by user: stopped by user", step=40)] * 2, 0,
     ["ringtop: the run stopped by ctl stop at step 40"]),
    ([Bye(rank=0, reason="completed 40 steps", step=40)] * 2, 0, ["ringtop: the run ended: completed 40 steps"]),
    ([Bye(rank=0, reason="error: rank 1 (pid 9) has died", ok=False, step=40), None], 1,
     ["ringtop: the run failed:", "  rank 1: ended without a Bye after step 40 (killed by SIGKILL)",
      "  rank 0: error: rank 1 (pid 9) has died"]),
], ids=["ctrl-c", "ctl-stop", "completed", "killed"])
def test_the_last_words_agree_with_the_exit_code(tmp_path, capsys, ends, code, said):
    from ringtop.cli.summary import report_end

    write_logs(tmp_path / "logs", ends)
    report = "rank : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 9)" if None in ends else ""
    assert report_end(code, tmp_path / "logs", report) == code
    assert capsys.readouterr().err.splitlines() == said


@pytest.mark.parametrize("reason, ok, said", [
    ("interrupted: SIGINT", False, "run stopped by Ctrl-C at step 40"),
    ("error: ValueError: bad batch", False, "run failed: rank 0: error: ValueError: bad batch"),
], ids=["ctrl-c", "error"])
def test_summary_says_how_the_run_ended(tmp_path, capsys, reason, ok, said):
    from ringtop.cli.summary import print_summary

    write_logs(tmp_path / "logs", [Bye(rank=0, reason=reason, ok=ok, step=40)] * 2)
    print_summary(tmp_path / "logs")
    assert said in capsys.readouterr().out.splitlines()


def test_prometheus_says_the_lifecycle_state_of_the_run():
    from ringtop.agent.prometheus.exporter import RunMetrics

    def state(m):
        return {s.labels["state"]: s.value for f in m.collect() if f.name == "ringtop_run_state" for s in f.samples}

    m = RunMetrics()
    for r in (0, 1):
        m.observe(hello(r))
        m.observe(Step(rank=r, seq=1, ts=1001.0, step=1, step_ms=5.0, loss=2.0))
    assert state(m)["live"] == 1.0 and sum(state(m).values()) == 1.0
    m.observe(Bye(rank=0, seq=2, ts=1002.0, reason="interrupted: SIGINT", ok=False, step=1))
    m.observe(Bye(rank=1, seq=2, ts=1002.0, reason="interrupted: SIGINT", ok=False, step=1))
    assert state(m)["stopped"] == 1.0 and state(m)["failed"] == 0.0


# ------------------------------------------------------------------ the real app (Pilot), over real sockets


class EndingRun:
    """A PUB publishing two ranks' Hello and steps (repeated: PUB/SUB's slow joiner) until `end` is
    set, then their Byes with `bye_reason`; a ROUTER standing in for rank 0's control server that
    keeps every command and answers none (a command in flight), or ends the run on `stop`."""

    def __init__(self, bye_reason: str = "completed {n} steps") -> None:
        pub_port, ctl_port = free_tcp_ports(2)
        self.pub_addr = f"tcp://127.0.0.1:{pub_port}"
        self.ctl_addr = f"tcp://127.0.0.1:{ctl_port}"
        self.bye_reason = bye_reason
        self.end = threading.Event()
        self.done = threading.Event()
        self.commands: list = []
        self.threads = [threading.Thread(target=self._publish, daemon=True),
                        threading.Thread(target=self._control, daemon=True)]

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        for t in self.threads:
            t.join(5)

    def _publish(self) -> None:
        pub = zmq.Context.instance().socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.bind(self.pub_addr)
        seq, n, ended_ts = {0: 0, 1: 0}, 0, 0.0
        try:
            while not self.done.is_set():
                for rank in (0, 1):
                    if self.end.is_set():  # the same Bye again (as the relay's cached copy is)
                        ended_ts = ended_ts or time.time()
                        msg = Bye(rank=rank, seq=seq[rank], ts=ended_ts, reason=self.bye_reason.format(n=n),
                                  ok=not self.bye_reason.startswith("interrupted"), step=n)
                    elif n % 10 == 0:
                        msg = hello(rank)
                        msg = msgspec.structs.replace(msg, seq=seq[rank], ts=time.time())
                    else:
                        msg = Step(rank=rank, seq=seq[rank], ts=time.time(), step=n, step_ms=20.0, loss=2.0)
                    seq[rank] += 1
                    pub.send_multipart([msg.__struct_config__.tag.encode(), encode(msg)])
                n += 0 if self.end.is_set() else 1
                time.sleep(0.02)
        finally:
            pub.close()

    def _control(self) -> None:
        router = zmq.Context.instance().socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(self.ctl_addr)
        try:
            while not self.done.is_set():
                if router.poll(20):
                    cmd = decode(router.recv_multipart()[-1])
                    self.commands.append(cmd)
                    if cmd.cmd == "stop":
                        self.end.set()
        finally:
            router.close()


def shown_keys(app) -> set[str]:
    """The keys the footer draws now."""
    from textual.widgets._footer import FooterKey

    return {k.key for k in app.query(FooterKey)}


def widget_text(app, selector: str) -> str:
    from textual.widgets import Static

    return str(app.query_one(selector, Static).content)


@pytest.mark.timeout(60)
async def test_an_ended_run_offers_no_command_refuses_one_at_once_and_resolves_the_one_in_flight():
    from ringtop.tui.app import RingtopApp
    from ringtop.tui.run_commands import RUN_COMMANDS

    with EndingRun() as run:
        app = RingtopApp(publish_addr=run.pub_addr, control_addr=run.ctl_addr)
        async with app.run_test(size=(140, 32)) as pilot:
            await eventually(pilot, lambda: _assert(app.client is not None and app.client.has_control
                                                    and app.view.latest_step > 0 and "● healthy" in
                                                    widget_text(app, "#health")), timeout_s=20)
            await eventually(pilot, lambda: _assert({"c", "X"} <= shown_keys(app)))
            assert len(list(app.run_system_commands())) >= 6
            await pilot.press("c")
            await eventually(pilot, lambda: _assert([c.cmd for c in run.commands] == ["checkpoint"]))
            assert [c.phase for c in app.view.active_commands()] == ["pending"]
            run.end.set()

            def ended():
                health = widget_text(app, "#health")
                assert health.startswith("■ ended: completed") and "healthy" not in health, health
                assert "■ ended" in widget_text(app, "#conn")
            await eventually(pilot, ended)
            assert app.view.active_commands() == []
            assert next(iter(app.view.commands.values())).error == "not run: the run ended"
            await eventually(pilot, lambda: _assert(not ({c.key for c in RUN_COMMANDS} & shown_keys(app))))
            assert list(app.run_system_commands()) == [], "the palette offers no command either"
            await pilot.press("c")
            assert app.view.events[-1].text == "Checkpoint (full): refused, the run has ended"
            assert len(run.commands) == 1, "nothing was sent to the ended run"


def _assert(ok: bool) -> None:
    assert ok


@pytest.mark.timeout(60)
async def test_stop_asks_first_and_the_run_then_reads_stopped_from_the_ui():
    from ringtop.tui.app import RingtopApp
    from ringtop.tui.confirm import ConfirmStop

    with EndingRun(bye_reason="stopped by user: from the UI") as run:
        app = RingtopApp(publish_addr=run.pub_addr, control_addr=run.ctl_addr)
        async with app.run_test(size=(140, 32)) as pilot:
            await eventually(pilot, lambda: _assert(app.client is not None and app.client.has_control
                                                    and app.view.latest_step > 0), timeout_s=20)
            await pilot.press("X")
            assert isinstance(app.screen, ConfirmStop)
            await pilot.press("n")  # cancelled: nothing is sent
            assert not isinstance(app.screen, ConfirmStop) and run.commands == []
            await pilot.press("X")
            await pilot.press("y")
            await eventually(pilot, lambda: _assert([(c.cmd, c.args) for c in run.commands]
                                                    == [("stop", {"reason": "from the UI"})]))

            def stopped():
                assert widget_text(app, "#health").startswith("■ stopped: stopped by the UI at step")
                assert widget_text(app, "#conn").startswith("■ stopped: by the UI")
            await eventually(pilot, stopped)
            assert app.view.commands[run.commands[0].id].phase == "done"


@pytest.mark.timeout(150)
async def test_rank_0_killed_by_sigkill_is_named_dead_with_its_signal_by_the_ui(launch_agents):
    """A real 2-rank run under torch's launcher; rank 0 carries the relay, so once it is gone the UI
    hears no rank: it says so, and names the signal once the launcher's report has it."""
    import os
    import signal as signals

    from ringtop.cli.training import launcher_exits_for_ui
    from ringtop.tui.app import RingtopApp

    run = launch_agents(2, "--steps", "0", "--batch-size", "2", "--seq-len", "16", torchrun=True)
    app = RingtopApp(publish_addr=run.publish, control_addr=run.control, keys=run.keys,
                     launcher_exits=launcher_exits_for_ui(run.proc, run.output_path))
    async with app.run_test(size=(140, 32)) as pilot:
        await eventually(pilot, lambda: _assert(len(app.view.ranks) == 2 and app.view.latest_step > 0
                                                and app.view.ranks[0].pid > 0), timeout_s=90)
        os.kill(app.view.ranks[0].pid, signals.SIGKILL)
        killed = time.monotonic()
        healthy_after: list[float] = []

        def named():
            health = widget_text(app, "#health")
            if "healthy" in health:
                healthy_after.append(time.monotonic() - killed)
            assert health.startswith("✖ failed: rank 0 killed by SIGKILL at step "), health
        await eventually(pilot, named, timeout_s=60)
        assert "✖ failed: rank 0 killed by SIGKILL" in widget_text(app, "#conn")
        assert max(healthy_after, default=0.0) < app.view.stale_after_s + 2.0, "healthy long after the kill"
