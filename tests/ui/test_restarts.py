"""A run its launcher restarts is one run: under bare `torchrun --max-restarts 1` (no --run-id), rank
1 crashes at step 4 of the first attempt (--inject-crash); every rank starts again in new
processes, with the same run id, resumes from the last checkpoint (`--resume auto`), and trains to
the end. The real UI, attached to the first rank 0,
follows the run to the new one by itself, says the restart and what caused it, and draws the new
attempt's steps; the logs hold both attempts, `summary` lists the restart, and the UI's goodput
puts the same seconds down to it as the logs' fold."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from background_socket import subscriber
from conftest import agent_env, further, poll_until, stop_process_group
from test_tui_app import header_text
from ui_waits import eventually, repainted

from ringtop.agent.restarts import launcher_run_id, restart_count
from ringtop.cli.launch import launcher_command
from ringtop.cli.summary import goodput, restart_lines
from ringtop.protocol import Bye, Hello, Step, connection_file, decode, read_log
from ringtop.tui.state.view_model import RunView

STEPS = 30
CRASH = (1, 4)
EVERY = 2
"""A checkpoint every 2 steps: the first attempt (no checkpoint yet, `--resume auto`: a fresh start)
saves step 2; the second resumes from it and does step 3 again."""
SLOW = ["--inject-slow-rank", "0:100"]
"""Steps of at least 0.1 s: the attempt after the restart lasts seconds, as a real one would, for
the UI to find it (it looks at the connection file once a second)."""


def test_the_launchers_attempt_and_a_run_id_shared_by_its_attempts_come_from_its_environment():
    torchrun = {"TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_RUN_ID": "3f0c-standalone"}
    assert restart_count(torchrun) == 2 and restart_count({}) == 0
    assert restart_count({"TORCHELASTIC_RESTART_COUNT": "-1"}) == 0  # not a count: the first attempt
    assert restart_count({"TORCHELASTIC_RESTART_COUNT": "1e9"}) == 0
    assert restart_count({"SLURM_RESTART_COUNT": "3"}) == 3
    same = launcher_run_id(torchrun)
    assert same == launcher_run_id({**torchrun, "TORCHELASTIC_RESTART_COUNT": "0"})  # every attempt
    assert same != launcher_run_id({**torchrun, "TORCHELASTIC_RUN_ID": "another-launch"})
    assert len(same) == 8 and int(same, 16) >= 0
    assert launcher_run_id({}) is None  # no launcher that restarts: rank 0 picks a new id
    slurm = {"SLURM_JOB_ID": "77"}
    assert launcher_run_id(slurm) == launcher_run_id({**slurm, "SLURM_RESTART_COUNT": "1"})


def test_ringtop_run_passes_max_restarts_to_the_launcher():
    assert "--max-restarts=3" in launcher_command(2, ["--steps", "5"], max_restarts=3)
    assert not any(a.startswith("--max-restarts") for a in launcher_command(2, ["--steps", "5"]))


def _our_run(log_dir: Path, proc: subprocess.Popen, not_pid: int = 0):
    """This test's run's connection (found by its log folder), once its rank 0 (not `not_pid`) wrote it."""
    found: list = []

    def written() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the launcher exited ({proc.returncode}) before rank 0 was up")
        found[:] = [r for r in connection_file.live_runs() if r.log_dir == str(log_dir) and r.pid != not_pid]
        return bool(found)
    poll_until(written, 90, "rank 0's connection file")
    return found[0]


@pytest.mark.timeout(240)
async def test_a_crash_under_max_restarts_is_one_run_the_ui_follows_and_summary_and_goodput_count(tmp_path):
    from ringtop.tui.app import RingtopApp
    from ringtop.tui.state.health import health_line

    log_dir = tmp_path / "logs"
    late = None
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--max-restarts=1",
           "-m", "ringtop.agent", "--steps", str(STEPS), "--batch-size", "2", "--seq-len", "16",
           "--dist-timeout-s", "60", "--log-dir", str(log_dir), "--inject-crash", f"{CRASH[0]}:{CRASH[1]}", *SLOW,
           "--resume", "auto", "--checkpoint-every", str(EVERY), "--checkpoint-dir", str(tmp_path / "checkpoints")]
    output = tmp_path / "output.txt"
    with open(output, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=agent_env(), start_new_session=True)
    try:
        first = _our_run(log_dir, proc)
        app = RingtopApp(publish_addr=first.publish, control_addr=first.control, keys=first.keys, follow=first)
        async with app.run_test(size=(200, 40)) as pilot:
            await eventually(pilot, lambda: _check(app.view.restart.count == 1), timeout_s=120)
            await eventually(pilot, lambda: _check(app.follower.current.pid != first.pid
                                                   and app.follower.current.run_id == first.run_id), timeout_s=30)
            second = app.follower.current
            late = subscriber(second.publish, second.keys)  # a UI that never saw the first attempt
            late_seen: list = []
            await eventually(pilot, lambda: _check(app.view.lifecycle().state == "ended"), timeout_s=120)
            await eventually(pilot, lambda: _check(_take(late, late_seen)), timeout_s=30)
            v = app.view
            assert [r.step for r in v.rows()] == [STEPS, STEPS]  # the new attempt's steps, heard live
            assert v.restart.cause.startswith(f"rank {CRASH[0]}: error: InjectedCrash"), v.restart.cause
            assert v.lifecycle().words == f"completed {STEPS} steps"
            ui_restart_s = v.goodput.result().lost_s["restart"]
            await repainted(pilot)
            assert "↻ 1 restart" in header_text(app)
            restarted = [e.text for e in v.event_log.lines if e.kind == "restart"]
            assert len(restarted) == 1 and "after rank 1: error: InjectedCrash" in restarted[0]
            assert health_line(v, 0.0).plain.startswith("■ ended")  # an ended run says so, restarted or not
        assert proc.wait(120) == 0, output.read_text()[-3000:]
    finally:
        stop_process_group(proc)
        if late is not None:
            late.close(0)

    for rank in (0, 1):
        hellos = [m for m in read_log(log_dir / f"rank-{rank}.jsonl") if isinstance(m, Hello)]
        assert [h.restart_count for h in hellos] == [0, 1]
        assert {h.run_id for h in hellos} == {first.run_id}
        assert hellos[0].pid != hellos[1].pid
    steps0 = [m.step for m in read_log(log_dir / "rank-0.jsonl") if isinstance(m, Step)]
    # the crash's step never finished; the new attempt resumed from the checkpoint of step 2
    assert steps0 == [*range(1, CRASH[1]), *range(EVERY + 1, STEPS + 1)]
    lines = restart_lines(log_dir)
    assert lines[0] == "restarts: 1" and f"after rank {CRASH[0]}: error: InjectedCrash" in lines[1], lines
    logs_restart_s = goodput(log_dir).lost_s["restart"]
    assert logs_restart_s > 1.0  # a new attempt's start-up alone takes seconds
    assert ui_restart_s == pytest.approx(logs_restart_s, abs=0.05)
    # the late UI: rank 0 of the new attempt read the logs, its Hello says the cause and its relay's
    # goodput count starts at the run's start
    view = RunView(watch_liveness=False)
    for msg in late_seen:
        view.apply(msg, now=1.0)
    assert view.restart.count == 1
    assert view.restart.cause.startswith(f"rank {CRASH[0]}: error: InjectedCrash"), view.restart.cause
    assert view.goodput.result().lost_s["restart"] == pytest.approx(logs_restart_s, abs=0.05)


def _check(ok: bool) -> None:
    assert ok


def _take(sock, into: list) -> bool:
    """What `sock` has now, into `into`; whether rank 0's Bye is among it (the run's end)."""
    while sock.poll(0):
        into.append(decode(sock.recv_multipart()[1]))
    return any(isinstance(m, Bye) and m.rank == 0 for m in into)


@further
@pytest.mark.timeout(240)
def test_ringtop_run_max_restarts_passes_it_on_and_its_last_lines_say_the_restart(tmp_path):
    """`ringtop run --max-restarts 1` (headless): the launcher restarts the crashed run, the run
    completes (exit 0), and the lines before its last say the restart and what caused it."""
    done = subprocess.run([sys.executable, "-m", "ringtop.cli", "run", "--nproc", "2", "--max-restarts", "1",
                           "--quiet", "--", "--steps", "6", "--batch-size", "2", "--seq-len", "16",
                           "--dist-timeout-s", "60", "--inject-crash", "1:3"],
                          capture_output=True, text=True, cwd=tmp_path, env=agent_env(), timeout=200,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if line.startswith(("ringtop:", "  restart"))]
    assert said[-1] == "ringtop: the run ended: completed 6 steps", said
    assert said[-3] == "ringtop: restarts: 1" and "after rank 1: error: InjectedCrash" in said[-2], said
