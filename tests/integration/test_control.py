"""The control channel against a real 2-rank run: status, checkpoint, bad input, stop, resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import zmq
from conftest import poll_until
from numerics import assert_state_close
from reference import reference_run
from safetensors.torch import load_file

from ringtop.cli.ctl import send_command
from ringtop.metrics.timing import STEP_WINDOW
from ringtop.protocol import UI_RANK, Bye, Command, Event, Reply, decode, encode, free_tcp_port
from ringtop.protocol.curve import secure_client

pytestmark = pytest.mark.timeout(200)

BATCH, SEQ, LR = 4, 32, 1e-3


def raw_request(run, payload: bytes, timeout_s: float = 20) -> Reply:
    """One frame as a client holding the run's keys sends it (bad input from the owner's own tools)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    secure_client(sock, run.keys)
    sock.connect(run.control)
    try:
        sock.send(payload)
        assert sock.poll(int(timeout_s * 1000)), "no reply to a bad request"
        return decode(sock.recv())
    finally:
        sock.close()


def replies(run, cmd: str, **args) -> list[Reply]:
    return list(run.send_command(cmd, args, timeout_s=60))


def test_status_checkpoint_bad_input_stop_and_resume(launch_agents):
    run = launch_agents(2, "--steps", "0", "--batch-size", str(BATCH), "--seq-len", str(SEQ), "--lr", str(LR))
    run.wait_for_step(2)

    (status,) = replies(run, "status")
    assert status.status == "done"
    assert status.result["world_size"] == 2 and status.result["strategy"] == "ddp"
    assert status.result["step"] >= 2
    # its step ms: the mean of rank 0's last steps up to the one it names, as rank 0 logged them
    last, n = status.result["step_ms_last_step"], status.result["step_ms_steps"]
    run.wait_for_step(last)
    logged = [s.step_ms for s in run.steps(0) if s.step <= last][-STEP_WINDOW:]
    assert n == len(logged) and status.result["step_ms"] == pytest.approx(sum(logged) / n, rel=1e-12)

    # Bad input gets a clear error reply and the run goes on.
    garbage = raw_request(run, b"\xc1\xff not msgpack")
    assert (garbage.status, garbage.code) == ("error", "malformed")
    unknown = raw_request(run, encode(Command(id="u1", cmd="explode", rank=UI_RANK)))
    assert (unknown.id, unknown.status, unknown.code) == ("u1", "error", "unknown_command")
    assert "explode" in unknown.error and "checkpoint" in unknown.error
    bad_args = raw_request(run, encode(Command(id="b1", cmd="checkpoint", args={"kind": "half"})))
    assert (bad_args.id, bad_args.code) == ("b1", "bad_arguments")
    old_version = raw_request(run, encode(Command(id="v1", cmd="status", v=99)))
    assert old_version.code == "bad_version"
    oversize = raw_request(run, b"\x00" * (1 << 20 + 1))
    assert oversize.code == "oversize"
    step_before = status.result["step"]
    run.wait_for_step(step_before + 2)

    ack, saved = replies(run, "checkpoint", kind="full")
    assert ack.status == "ack" and saved.status == "done", saved.error
    saved_step = saved.result["step"]
    path = Path(saved.result["path"])
    payload = torch.load(path / "state.pt")  # plain torch.load, default (weights-only) settings
    assert payload["step"] == saved_step
    assert payload["meta"]["world_size"] == 2 and payload["meta"]["strategy"] == "ddp"
    assert (run.checkpoint_dir / "latest").read_text().strip() == f"step-{saved_step:08d}-full"
    weights = load_file(path / "model.safetensors")  # plain safetensors
    expected_state = reference_run(saved_step, 2 * BATCH, SEQ, LR).state
    assert "head.weight" not in weights, "a tied weight is stored once"
    assert_state_close(weights, expected_state, steps=saved_step, lr=LR, allow_missing=frozenset({"head.weight"}))

    run.wait_for_step(saved_step + 3)

    # A UI attached from now on learns of the checkpoint: rank 0 restates its latest operations.
    def checkpoint_restated() -> bool:
        for m in run.messages(0):
            if isinstance(m, Event) and m.kind == "operations_recent":
                if any(op["id"] == saved.id and op["status"] == "done" and op["args"] == {"kind": "full"}
                       for op in m.data["operations"]):
                    return True
        return False
    poll_until(checkpoint_restated, 30, "an operations_recent event naming the checkpoint")
    ack, done = replies(run, "stop", reason="test is over")
    assert done.status == "done"
    assert run.wait(60) == 0, run.output()[-3000:]
    for rank in (0, 1):
        bye = run.messages(rank)[-1]
        assert isinstance(bye, Bye) and bye.reason == "stopped by user: test is over"
    events = [m for m in run.messages(0) if isinstance(m, Event)]
    assert any(e.kind == "checkpoint" and e.data["path"] == saved.result["path"] for e in events)
    published = [m for m in run.messages(0) if isinstance(m, Reply)]
    assert [r.status for r in published if r.cmd == "checkpoint"] == ["ack", "done"]

    # Resume into the same strategy and world size: the same losses, bit for bit.
    uninterrupted = {s.step: (s.loss, t.loss) for s, t in zip(run.steps(0), run.steps(1))}
    resumed = launch_agents(2, "--steps", str(saved_step + 3), "--batch-size", str(BATCH), "--seq-len", str(SEQ),
                            "--lr", str(LR), "--resume", str(run.checkpoint_dir), name="resumed")
    assert resumed.wait(120) == 0, resumed.output()[-3000:]
    again = {s.step: (s.loss, t.loss) for s, t in zip(resumed.steps(0), resumed.steps(1))}
    assert sorted(again) == [saved_step + 1, saved_step + 2, saved_step + 3]
    for step, losses in again.items():
        assert losses == uninterrupted[step], f"step {step}"


def test_a_command_to_an_absent_job_times_out_clearly():
    with pytest.raises(TimeoutError, match="no reply"):
        list(send_command(f"tcp://127.0.0.1:{free_tcp_port()}", "status", {}, timeout_s=0.5))


def test_every_command_but_the_immediate_ones_has_a_step_boundary_handler():
    """A command the protocol accepts but the runner cannot apply would only fail at run time."""
    from ringtop.agent.loop.commands import COMMAND_HANDLERS
    from ringtop.protocol import COMMANDS, IMMEDIATE_COMMANDS

    assert set(COMMAND_HANDLERS) == set(COMMANDS) - set(IMMEDIATE_COMMANDS)
