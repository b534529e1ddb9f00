"""`ringtop simulate`: N simulated ranks through the real relay, keys and connection file.

Each test receives the run as a UI does: a SUB socket with the client keys of the connection file
the simulator wrote, on the relay's publish address."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import statistics
import subprocess
import sys
import threading
import time

import psutil
import pytest
import zmq
from conftest import poll_until

from ringtop.agent.lifecycle import exit_with_parent
from ringtop.cli.main import main as ringtop_main
from ringtop.cli.simulate import STRAGGLER_FACTOR, SimConfig, Simulation
from ringtop.metrics.rules.hang import diagnose
from ringtop.protocol import (
    Bye,
    Heartbeat,
    Hello,
    Sample,
    Stall,
    Step,
    connection_file,
    curve,
    decode,
    free_tcp_ports,
)
from ringtop.protocol.curve import secure_client

pytestmark = pytest.mark.timeout(60)


def on_own_ports(cfg: SimConfig) -> SimConfig:
    """Ports picked now: a neighbour's client knocking on a default port is not this run's refusal."""
    return dataclasses.replace(cfg, **{name: f"tcp://127.0.0.1:{p}"
                                       for name, p in zip(("relay", "publish", "control"), free_tcp_ports(3))})


class Subscriber:
    """A UI's receiving side: every message of the run, decoded, on a thread of its own."""

    def __init__(self, info: connection_file.ConnectionInfo) -> None:
        self.messages: list = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(info,), daemon=True)
        self._thread.start()
        assert self._ready.wait(5)

    def _run(self, info) -> None:
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        secure_client(sub, info.keys)
        sub.connect(info.publish)
        self._ready.set()
        try:
            while not self._stop.is_set():
                if sub.poll(50):
                    self.messages.append(decode(sub.recv_multipart()[1]))
        finally:
            sub.close(0)
            ctx.term()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def of(self, kind: type, rank: int | None = None) -> list:
        return [m for m in list(self.messages) if isinstance(m, kind) and (rank is None or m.rank == rank)]


def simulate(cfg: SimConfig, until=None, timeout_s: float = 30.0):
    """Run the simulation on a thread, received by a Subscriber from its connection file; returns
    (result, subscriber) once it has ended (or `until(subscriber)` held and it was stopped)."""
    stop = threading.Event()
    ready: list = []
    out: dict = {}
    sim = Simulation(on_own_ports(cfg), stop, on_ready=lambda info: ready.append(Subscriber(connection_file.read(
        connection_file.file_for(info.run_id)))))

    def run() -> None:
        try:
            out["result"] = sim.run()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the test's thread
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        poll_until(lambda: ready or "error" in out, 20, "the simulation's connection file")
        if until is not None:
            poll_until(lambda: until(ready[0]) or "error" in out, timeout_s, "the awaited messages")
            stop.set()
        thread.join(timeout_s)
        assert not thread.is_alive(), "the simulation did not end"
        if "error" in out:
            raise out["error"]
        sub = ready[0]
        poll_until(lambda: len(sub.of(Bye)) >= cfg.ranks, 5, "every rank's Bye")
        return out["result"], sub
    finally:
        stop.set()
        for s in ready:
            s.close()


@pytest.mark.parametrize("nodes, procs, rank_procs", [(2, 1, 0), (4, 3, 0), (2, None, 2)])
def test_every_rank_says_hello_steps_together_and_nothing_is_dropped(nodes, procs, rank_procs):
    """One process (--procs 1); the real multi-node path: nodes 1.. in workers, each node's ranks
    through its own node relay (4 nodes in 2 workers); and ranks 1..15 apart from the head relay
    in 2 workers, straight to it (--rank-procs 2)."""
    cfg = SimConfig(ranks=16, nodes=nodes, hz=10, seconds=3, seed=1, procs=procs, rank_procs=rank_procs)
    result, sub = simulate(cfg)
    assert result.procs == cfg.processes == (procs or 1 + rank_procs)
    assert result.dropped == 0 and result.send_drops == 0 and result.refused == 0
    assert result.gaps == 0 and result.lost == 0
    assert result.forwarded >= result.sent  # and rank 0's replies/events, if any
    per_node = 16 // nodes
    for rank in range(16):
        hello = sub.of(Hello, rank)
        assert hello, f"rank {rank} said no hello"
        assert hello[0].host == f"node-{rank // per_node:03d}" and hello[0].local_rank == rank % per_node
        assert hello[0].world_size == 16 and hello[0].strategy == "ddp" and hello[0].run_id == result.run_id
        steps = [m.step for m in sub.of(Step, rank)]
        assert steps == sorted(set(steps)) and len(steps) >= 20, steps
        assert steps[-1] == result.steps  # one global step clock
        assert len(sub.of(Heartbeat, rank)) >= 2 and len(sub.of(Sample, rank)) >= 2
        seqs = [m.seq for m in sub.messages if m.rank == rank and not isinstance(m, Hello)]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"rank {rank}: a gap in its seqs"
        assert sub.of(Bye, rank)[-1].step == result.steps
    losses = [m.loss for m in sub.of(Step, 0)]
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("nodes, procs, straggler", [(4, 3, 5)])
def test_straggler_steps_take_longer_by_the_rule(nodes, procs, straggler):
    """The straggler's median step time / the others' median: the rule's 1.3, within 5 %. Noise is
    3 % per step, so over >= 30 steps each median is within ~0.7 % (1.25 x 3 % / sqrt(30)): 5 % is
    about 6 standard deviations of the ratio, and the run is deterministic for its seed anyway.
    Also for a rank of a worker's node (rank 5: node 2 of 4, in the second worker)."""
    cfg = SimConfig(ranks=8, nodes=nodes, hz=20, seconds=2, straggler=straggler, seed=2, procs=procs)
    _, sub = simulate(cfg)
    medians = {r: statistics.median(m.step_ms for m in sub.of(Step, r)) for r in range(8)}
    assert all(len(sub.of(Step, r)) >= 30 for r in range(8))
    others = statistics.median(v for r, v in medians.items() if r != straggler)
    assert STRAGGLER_FACTOR * 0.95 <= medians[straggler] / others <= STRAGGLER_FACTOR * 1.05, medians


def test_hang_is_read_as_the_hung_rank_not_entering_the_collective():
    """Rank 5 is on node 1, in the worker: every process stops at the same step."""
    cfg = SimConfig(ranks=8, nodes=2, hz=10, hang=5, seed=3, procs=2)
    result, sub = simulate(cfg, until=lambda s: {m.rank for m in s.of(Stall)} == set(range(8)))
    reports = {}
    for m in sub.of(Stall):
        reports[m.rank] = m
    verdict = diagnose(reports, world_size=8)
    assert verdict is not None and verdict.kind == "hang", verdict
    assert verdict.culprits == (5,) and verdict.group == "world" and 5 not in verdict.waiting, verdict
    assert "forward" in verdict.where[5]
    steps = sub.of(Step)
    assert max(m.step for m in steps) == result.steps  # nobody stepped after the hang
    beats = [m for m in sub.of(Heartbeat) if m.ts > reports[0].ts - reports[0].running_s]
    assert beats, "heartbeats stopped with the steps"


def test_the_simulation_leaves_no_thread_behind():
    before = {t.ident for t in threading.enumerate()}
    simulate(SimConfig(ranks=2, hz=10, seconds=1))

    def left():
        return [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()
                and t.name.startswith("ringtop")]
    poll_until(lambda: not left(), 5, "the simulation's threads to end", detail=lambda: str(left()))


@pytest.mark.parametrize("argv, message", [
    (["--ranks", "0"], "--ranks must be >= 1"),
    (["--ranks", "4", "--nodes", "0"], "--nodes must be between 1 and --ranks (4)"),
    (["--ranks", "4", "--nodes", "5"], "--nodes must be between 1 and --ranks (4)"),
    (["--hz", "0"], "--hz must be > 0 and <= 1000"),
    (["--hz", "1001"], "--hz must be > 0 and <= 1000"),
    (["--ranks", "4", "--straggler", "4"], "--straggler: rank 4 is not in this run of 4 ranks"),
    (["--ranks", "4", "--hang", "-1"], "--hang: rank -1 is not in this run of 4 ranks"),
    (["--seconds", "-1"], "--seconds must be >= 0"),
    (["--ranks", "8", "--nodes", "4", "--procs", "0"], "--procs must be between 1 and --nodes (4)"),
    (["--ranks", "8", "--nodes", "4", "--procs", "5"], "--procs must be between 1 and --nodes (4)"),
    (["--ranks", "4", "--rank-procs", "4"], "--rank-procs must be between 0 and --ranks - 1 (3)"),
    (["--ranks", "4", "--rank-procs", "-1"], "--rank-procs must be between 0 and --ranks - 1 (3)"),
    (["--ranks", "8", "--nodes", "4", "--procs", "2", "--rank-procs", "1"], "--rank-procs and --procs > 1 exclude"),
])
def test_bad_arguments_fail_with_the_reason(argv, message, capsys):
    assert ringtop_main(["simulate", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_status_file_planted_as_a_link_is_refused_before_the_run_starts(tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.write_text("kept")
    (tmp_path / "status.json").symlink_to(victim)
    assert ringtop_main(["simulate", "--ranks", "2", "--status-file", str(tmp_path / "status.json")]) == 2
    assert "status.json: it is a symbolic link" in capsys.readouterr().err
    assert victim.read_text() == "kept"


def test_ctrl_c_ends_the_command_with_every_ranks_bye():
    """`ringtop simulate` as a user runs it, found by its connection file alone (as `ringtop ui`
    finds it), stopped with Ctrl-C (SIGINT)."""
    runtime = connection_file.runtime_dir()
    existing = set(runtime.glob("run-*.json")) if runtime.exists() else set()
    ports = [f"--{name}=tcp://127.0.0.1:{p}" for name, p in zip(("relay", "publish", "control"), free_tcp_ports(3))]
    proc = subprocess.Popen([sys.executable, "-m", "ringtop.cli.main", "simulate", "--ranks", "4", "--nodes", "2",
                             *ports],
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONWARNINGS="ignore"),
                            preexec_fn=exit_with_parent)
    sub = None
    try:
        path = poll_until(lambda: next(iter(set(runtime.glob("run-*.json")) - existing), None), 30,
                          "the simulator's connection file")
        info = poll_until(lambda: _readable(path), 5, "a complete connection file")
        assert info.pid == proc.pid and info.world_size == 4
        assert [info.relay, info.publish, info.control] == [p.split("=", 1)[1] for p in ports]
        sub = Subscriber(info)
        poll_until(lambda: {m.rank for m in sub.of(Step)} == set(range(4)), 20, "every rank's steps")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 0, proc.stderr.read()
        poll_until(lambda: {m.rank for m in sub.of(Bye)} == set(range(4)), 5, "every rank's Bye")
        assert not path.exists(), "the connection file outlived the run"
        assert "relay forwarded" in proc.stderr.read()
    finally:
        if sub is not None:
            sub.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_the_workers_get_their_keys_on_a_pipe_and_end_with_the_run(monkeypatch):
    """No secret in a worker's argv or environment (other users of the node can read those), and
    no worker left once `run()` returns."""
    made = []
    generate = curve.generate
    monkeypatch.setattr(curve, "generate", lambda *a: made.append(generate(*a)) or made[-1])
    me = psutil.Process()
    before = {c.pid for c in me.children(recursive=True)}  # e.g. multiprocessing's resource tracker
    seen: dict = {}

    def look(sub) -> bool:
        for child in _new_children(me, before):
            try:
                seen[child.pid] = (child.cmdline(), child.environ())
            except psutil.Error:
                pass
        return len(seen) >= 2 and {m.rank for m in sub.of(Step)} == set(range(16))
    try:
        result, _ = simulate(SimConfig(ranks=16, nodes=4, hz=10, procs=3, seed=4), until=look)
        assert result.procs == 3 and len(seen) == 2, seen
        secrets = [*made[0].rank_secret, *made[0].node_secret, made[0].server_secret]
        for cmdline, environ in seen.values():
            text = " ".join(cmdline) + " ".join(f"{k}={v}" for k, v in environ.items())
            assert not any(secret in text for secret in secrets), "a secret in a worker's argv or environment"
        poll_until(lambda: not _new_children(me, before), 5, "the workers to end")
    finally:
        _kill_children(me, before)


def _new_children(proc: psutil.Process, before: set[int]) -> list[psutil.Process]:
    return [c for c in proc.children(recursive=True) if c.pid not in before]


def _kill_children(proc: psutil.Process, before: set[int] = frozenset()) -> None:
    """Whatever a failed test left: no process outlives it (those it found already are not its own)."""
    for child in _new_children(proc, before):
        try:
            child.kill()
        except psutil.Error:
            pass


def test_ctrl_c_ends_every_worker_with_every_ranks_bye():
    """16 ranks on 4 nodes in 2 workers, stopped with Ctrl-C (SIGINT to the command, as a
    terminal sends it to the whole process group): every worker ends, every rank's Bye arrives."""
    ports = [f"--{name}=tcp://127.0.0.1:{p}" for name, p in zip(("relay", "publish", "control"), free_tcp_ports(3))]
    proc = subprocess.Popen([sys.executable, "-m", "ringtop.cli.main", "simulate", "--ranks", "16", "--nodes", "4",
                             "--procs", "3", "--run-id", f"ctrlc{os.getpid()}", *ports],
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONWARNINGS="ignore"),
                            preexec_fn=exit_with_parent, start_new_session=True)
    sub = None
    command = psutil.Process(proc.pid)
    try:
        path = connection_file.file_for(f"ctrlc{os.getpid()}")
        info = poll_until(lambda: _readable(path) if path.exists() else _still_running(proc), 30,
                          "the simulator's connection file")
        sub = Subscriber(info)
        poll_until(lambda: {m.rank for m in sub.of(Step)} == set(range(16)), 30, "every rank's steps")
        workers = command.children(recursive=True)
        assert len(workers) == 2, workers
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(30) == 0, proc.stderr.read()
        poll_until(lambda: {m.rank for m in sub.of(Bye)} == set(range(16)), 5, "every rank's Bye")
        poll_until(lambda: not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers), 5,
                   "the workers to end")
        assert not path.exists(), "the connection file outlived the run"
        assert "node relays lost 0" in proc.stderr.read()
    finally:
        if sub is not None:
            sub.close()
        if command.is_running():
            _kill_children(command)
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def _still_running(proc: subprocess.Popen) -> None:
    """None while `proc` runs (a poll goes on); its end and its stderr as the failure otherwise."""
    if proc.poll() is not None:
        raise AssertionError(f"the command ended with {proc.returncode}:\n{proc.stderr.read()[-3000:]}")


def _readable(path):
    try:
        return connection_file.read(path)
    except connection_file.ConnectionFileError:
        return None


async def test_the_ui_attaches_with_no_arguments_as_ringtop_ui_does():
    """`ringtop ui` with no arguments: the only live run's connection file (`connection_file.find`)."""
    from ringtop.tui.app import RingtopApp

    stop = threading.Event()
    sim = Simulation(on_own_ports(SimConfig(ranks=8, nodes=2, hz=10)), stop)
    thread = threading.Thread(target=sim.run, daemon=True)
    thread.start()
    try:
        info = await asyncio.to_thread(poll_until, lambda: _only_run(sim.run_id), 20, "the connection file")
        app = RingtopApp(publish_addr=info.publish, control_addr=info.control, keys=info.keys)
        async with app.run_test(size=(160, 48)) as pilot:
            deadline = time.monotonic() + 20
            # A UI that attaches mid-run may get a few live steps before the relay's replay of the
            # cached Hellos (its subscription is read between forwards): wait for the Hellos too.
            while not (len(app.view.ranks) == 8
                       and all(r.step > 0 and r.said_hello for r in app.view.ranks.values())):
                hellos = sum(r.said_hello for r in app.view.ranks.values())
                notes = [e.text for e in app.view.event_log.since(0)][-8:]
                assert time.monotonic() < deadline, f"{len(app.view.ranks)} ranks, {hellos} Hellos: {notes}"
                await pilot.pause(0.1)
            assert {r.host for r in app.view.ranks.values()} == {"node-000", "node-001"}
            assert app.view.facts.world_size == 8 and app.view.facts.strategy == "ddp"
    finally:
        stop.set()
        thread.join(20)
    assert not thread.is_alive()


def _only_run(run_id: str):
    """As `ringtop ui` finds a run with no arguments; by its id only where another test's run is live too."""
    try:
        return connection_file.find(None)
    except connection_file.ConnectionFileError as exc:
        return connection_file.find(run_id) if "several runs" in str(exc) else None
