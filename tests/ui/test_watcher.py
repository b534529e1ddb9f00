"""The watcher (agent/watcher/): a process per node outside the ranks that holds the head relay and
the run's connection file and names how each rank of its node ended. Real ranks, the real app:

- rank 0 killed with SIGKILL: the UI keeps its feed (rank 1's last words still arrive), the
  watcher names rank 0's death with its pid from outside, the run is never healthy again, one
  alert says so, and the watcher ends by itself, its connection file with it;
- the watcher killed: training goes on to its last step, and rank 0 says what the UIs lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import poll_until
from ui_waits import eventually
from webhook_receiver import Receiver

from ringtop.agent.watcher.wire import MAX_FRAME_BYTES, LinkClosed, read_to_watcher
from ringtop.agent.watcher.witness import Witness
from ringtop.protocol import Bye, Hello, Step, connection_file
from ringtop.protocol.processes import look, process_gone

SMALL = ("--batch-size", "2", "--seq-len", "16")


def _check(ok: bool, detail: object = "") -> None:
    assert ok, detail


def _the_watchers(detail: str) -> bool:
    """Words only the watcher writes (the UI's own look at a local rank says less)."""
    return "its node's watcher" in detail or "without a Bye" in detail


def _hello(rank: int, pid: int, host: str) -> Hello:
    seen = look(pid)
    return Hello(rank=rank, run_id="w", world_size=2, pid=pid, host=host,
                 process_started_ts=seen.started_ts if seen else 0.0)


def test_the_witness_names_a_killed_process_from_its_exit_status_and_a_bye_is_no_death():
    """A zombie (killed, its parent not yet waiting) carries its wait status: the witness says the
    signal. A rank that said Bye is not looked at again; a rank never seen is not named."""
    witness = Witness(host="this-host")
    killed = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])  # a process, until killed
    finished = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    try:
        witness.observe(_hello(0, killed.pid, "this-host"))
        witness.observe(_hello(1, finished.pid, "this-host"))
        witness.observe(Step(rank=0, step=41, loss=1.0, step_ms=1.0))
        witness.observe(Bye(rank=1, ok=True, step=41))
        assert witness.look() == [] and not witness.all_ended()
        killed.send_signal(signal.SIGKILL)
        finished.send_signal(signal.SIGKILL)  # after its Bye: not a death
        poll_until(lambda: look(killed.pid) is None, 10, "the killed process is a zombie")
        (exit_,) = witness.look()
        assert (exit_.of_rank, exit_.pid, exit_.how, exit_.step) == (0, killed.pid, "killed by SIGKILL", 41)
        assert witness.look() == [], "named once"
        assert witness.all_ended()
    finally:
        for p in (killed, finished):
            p.kill()
            p.wait()
    later = Witness(host="this-host")
    later.observe(_hello(0, killed.pid, "this-host"))  # reaped: gone without a trace of how
    (exit_,) = later.look()
    assert exit_.how == "died" and "without a Bye" in exit_.detail
    elsewhere = Witness(host="this-host")
    elsewhere.observe(_hello(0, killed.pid, "another-host"))
    assert elsewhere.look() == [] and not elsewhere.locals_known(), "another node's rank is its own watcher's"


def test_the_link_refuses_an_oversized_or_garbled_frame():
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, (MAX_FRAME_BYTES + 1).to_bytes(4, "big"))
        with pytest.raises(LinkClosed, match="at most"):
            read_to_watcher(read_end)
        os.write(write_end, (3).to_bytes(4, "big") + b"\xc1\xc1\xc1")
        with pytest.raises(LinkClosed, match="does not decode"):
            read_to_watcher(read_end)
        os.close(write_end)
        write_end = -1
        with pytest.raises(LinkClosed):
            read_to_watcher(read_end)
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


def _watcher_pid(run) -> int:
    info = run.connection()
    return info.pid


@pytest.mark.timeout(150)
async def test_rank_0_killed_is_named_by_its_watcher_and_the_ui_keeps_its_feed(launch_agents):
    from ringtop.metrics.run_lifecycle import FAILED
    from ringtop.tui.app import RingtopApp

    receiver = Receiver()
    run = launch_agents(2, "--steps", "0", *SMALL, "--alert-webhook", receiver.url)
    info = run.connection()
    watcher_pid = info.pid
    path = connection_file.file_for(run.run_id)
    app = RingtopApp(publish_addr=run.publish, control_addr=run.control, keys=run.keys)
    async with app.run_test(size=(200, 40)) as pilot:
        v = app.view
        await eventually(pilot, lambda: _check(len(v.ranks) == 2 and min(r.step for r in v.ranks.values()) >= 3),
                         timeout_s=90)
        rank0 = v.ranks[0].pid
        assert watcher_pid not in (rank0, v.ranks[1].pid), "the connection file names the watcher, no rank"
        os.kill(rank0, signal.SIGKILL)
        killed_at = time.monotonic()
        await eventually(pilot, lambda: _check(v.ranks[0].dead and _the_watchers(v.ranks[0].exit_detail),
                                               (v.ranks[0].exit_how, v.ranks[0].exit_detail)), timeout_s=20)
        named_s = time.monotonic() - killed_at
        print(f"rank 0's death named {named_s:.2f} s after its SIGKILL: {v.ranks[0].exit_how}")
        row = v.ranks[0]
        assert row.exit_how in ("killed by SIGKILL", "died") and str(rank0) in row.exit_detail
        assert named_s < 10, f"rank 0's death named {named_s:.1f} s after the kill"
        await eventually(pilot, lambda: _check(v.ranks[1].ended or v.ranks[1].dead), timeout_s=60)
        assert v.lifecycle().state == FAILED and v.lifecycle().cause.startswith("rank 0 ")
    poll_until(lambda: process_gone(watcher_pid), 30, "the watcher ends by itself once its ranks are gone")
    assert not path.exists(), "the run's connection file went with its watcher"
    receiver.close()
    deaths = [b["ringtop"] for b in receiver.bodies if b["ringtop"]["kind"] == "death"]
    assert [(d["action"], d["ranks"]) for d in deaths] == [("opened", [0])], deaths  # one alert, rank 0's


@pytest.mark.timeout(150)
def test_the_watcher_killed_leaves_training_going_and_rank_0_says_what_was_lost(launch_agents):
    run = launch_agents(2, "--steps", "30", *SMALL)
    watcher_pid = _watcher_pid(run)
    poll_until(lambda: any(m.step >= 2 for m in run.steps(0)), 90, "rank 0 stepping")
    os.kill(watcher_pid, signal.SIGKILL)
    assert run.proc.wait(timeout=120) == 0, run.output()[-3000:]
    assert [m.step for m in run.steps(0)][-1] == 30 and [m.step for m in run.steps(1)][-1] == 30
    assert f"the node's watcher (pid {watcher_pid}) is gone (killed by signal 9)" in run.output()



@pytest.mark.timeout(150)
async def test_rank_0_stuck_holding_the_gil_still_gets_its_verdict_out_through_the_watcher(launch_agents):
    """Rank 0's threads cannot run, so it can neither relay nor send what the hang watch says; the
    watcher hears it silent and publishes the verdict itself: the UI names rank 0 as the rank the
    others wait for, alive."""
    from ringtop.tui.app import RingtopApp

    run = launch_agents(2, "--steps", "0", *SMALL, "--inject-hang", "0:4:gil-held")
    app = RingtopApp(publish_addr=run.publish, control_addr=run.control, keys=run.keys)
    async with app.run_test(size=(200, 40)) as pilot:
        v = app.view

        def verdict() -> list[str]:
            return [e.text for e in v.event_log.lines if e.kind == "hang" and e.rank is None]
        await eventually(pilot, lambda: _check(any("rank 0" in t for t in verdict()), verdict()), timeout_s=90)
        assert not any("has died" in t for t in verdict()), verdict()
        assert not v.ranks[0].dead


@pytest.mark.timeout(150)
def test_no_watcher_keeps_the_relay_in_rank_0_and_the_run_whole(launch_agents):
    """`--no-watcher`: the head relay a thread of rank 0, as before the watcher; the run's file
    names rank 0's process, and the run trains to its end."""
    run = launch_agents(2, "--steps", "12", *SMALL, "--no-watcher")
    info = run.connection()
    hello = poll_until(lambda: [m for m in run.messages(0) if isinstance(m, Hello)], 60, "rank 0's Hello")[0]
    assert info.pid == hello.pid, "the relay's process is rank 0's"
    assert run.proc.wait(timeout=120) == 0, run.output()[-3000:]
    assert [m.step for m in run.steps(1)][-1] == 12


@pytest.mark.timeout(60)
def test_a_restarted_attempts_watcher_waits_for_the_one_before_to_let_go_of_its_ports():
    """Under --max-restarts with addresses given (not movable), the attempt before's watcher may
    still hold them for its grace; the new one binds once they are free, instead of failing the
    restart. Attempt 0 does not wait: a port taken then is another run's."""
    import threading

    import zmq

    from ringtop.agent.transport.ports import BindError
    from ringtop.agent.watcher.link import WatcherLink
    from ringtop.agent.watcher.wire import Setup
    from ringtop.protocol import Endpoints, free_tcp_ports

    publish, relay, control = (f"tcp://127.0.0.1:{p}" for p in free_tcp_ports(3))
    held = zmq.Context.instance().socket(zmq.PUB)
    held.setsockopt(zmq.LINGER, 0)
    held.bind(relay)
    try:
        setup = Setup(endpoints=Endpoints(publish=publish, relay=relay, control=control), run_id="w", world_size=1)
        with pytest.raises(BindError, match="cannot bind the relay input socket"):
            WatcherLink.spawn(setup, None, None, lambda why: None)
        timer = threading.Timer(1.5, held.close)
        timer.start()
        setup.attempt = 1
        link = WatcherLink.spawn(setup, None, None, lambda why: None)
        try:
            assert (link.relay_address, link.publish_address) == (relay, publish)
        finally:
            link.stop(0.5)
        timer.join()
    finally:
        held.close()
