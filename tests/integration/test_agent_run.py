"""Real 2-rank gloo runs: telemetry over ZeroMQ, JSONL logs, equivalence with one big-batch process."""

from __future__ import annotations

import time

import pytest
import zmq
from conftest import further
from numerics import GRAD_NORM_RTOL, LOSS_RTOL, assert_series_close
from reference import reference_run

from ringtop.agent.models.model import build_tiny_gpt, count_params
from ringtop.protocol import Bye, Hello, ProtocolError, Step, decode
from ringtop.protocol.curve import secure_client

pytestmark = pytest.mark.timeout(150)


def collect(sub: zmq.Socket, until, timeout_s: float, rogue: zmq.Socket | None = None):
    got, rejected = [], []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not until(got):
        if rogue is not None and len(got) % 10 == 0:
            rogue.send_multipart([b"step.9", b"\xc1 garbage from a stranger"])
        if sub.poll(100):
            frames = sub.recv_multipart()
            try:
                got.append(decode(frames[-1]))
            except ProtocolError as exc:
                rejected.append(exc)
    return got, rejected


def test_both_ranks_stream_steps_to_a_subscriber_and_to_jsonl(launch_agents):
    steps = 12
    run = launch_agents(2, "--steps", str(steps), "--batch-size", "4", "--seq-len", "64")
    keys = run.keys  # the connection file's: a UI's, which may read and command but not publish as a rank
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    secure_client(sub, keys)
    sub.connect(run.publish)
    rogue = zmq.Context.instance().socket(zmq.PUB)  # a client's key gets nothing into the relay
    rogue.setsockopt(zmq.LINGER, 0)
    secure_client(rogue, keys)
    rogue.connect(run.relay)
    try:
        def seen_everything(msgs):
            return {m.rank for m in msgs if isinstance(m, Bye)} == {0, 1}

        msgs, rejected = collect(sub, seen_everything, timeout_s=100, rogue=rogue)
    finally:
        sub.close()
        rogue.close()
    assert run.wait(30) == 0, run.output()[-3000:]
    assert rejected == [], "the relay forwards only messages that decode: the rogue's garbage stays with it"

    hellos = {m.rank: m for m in msgs if isinstance(m, Hello)}
    assert set(hellos) == {0, 1}, "a subscriber that attaches late still gets every rank's Hello"
    assert hellos[0].run_id == hellos[1].run_id and hellos[0].world_size == 2
    assert hellos[0].strategy == "ddp" and hellos[0].backend == "gloo"
    assert hellos[0].param_count == count_params(build_tiny_gpt("1m", 0))

    for rank in (0, 1):
        live = [m for m in msgs if isinstance(m, Step) and m.rank == rank]
        assert live, f"no live step records from rank {rank}"
        assert [m.step for m in live] == sorted({m.step for m in live})
        logged = run.steps(rank)
        assert [s.step for s in logged] == list(range(1, steps + 1))
        for s in logged:
            assert s.step_ms > 0 and s.forward_ms > 0 and s.backward_ms > 0 and s.optimizer_ms > 0
            assert s.data_ms + s.forward_ms + s.backward_ms + s.optimizer_ms <= s.step_ms * 1.01
            assert s.tokens == 4 * 64
            # DDP all-reduces every gradient once per step: 4 bytes per fp32 parameter.
            (all_reduce,) = s.comm
            assert all_reduce.kind == "all_reduce" and all_reduce.group_size == 2
            assert all_reduce.bytes == 4 * hellos[0].param_count
            assert 0 <= s.exposed_comm_ms <= s.step_ms
            assert s.mem.params_bytes == 4 * hellos[0].param_count
            assert s.mem.grads_bytes == 4 * hellos[0].param_count
            assert s.mem.optimizer_bytes >= 2 * 4 * hellos[0].param_count  # AdamW: exp_avg + exp_avg_sq
        lines = run.messages(rank)
        assert isinstance(lines[0], Hello) and isinstance(lines[-1], Bye)
        assert lines[-1].ok and lines[-1].reason == f"completed {steps} steps"
        seqs = [m.seq for m in lines]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


@further  # test_strategies.py's DDP case (2 ranks) and test_checkpoints.py's resumes (one process) hold it
def test_two_ranks_train_exactly_like_one_process_with_the_whole_batch(launch_agents):
    steps, batch, seq_len, lr = 6, 4, 32, 1e-3
    two = launch_agents(2, "--steps", str(steps), "--batch-size", str(batch), "--seq-len", str(seq_len),
                        "--lr", str(lr), name="two")
    one = launch_agents(0, "--steps", str(steps), "--batch-size", str(2 * batch), "--seq-len", str(seq_len),
                        "--lr", str(lr), name="one")
    assert two.wait(120) == 0, two.output()[-3000:]
    assert one.wait(120) == 0, one.output()[-3000:]
    expected = reference_run(steps, 2 * batch, seq_len, lr)

    assert_series_close([s.loss for s in one.steps(0)], expected.losses, rtol=LOSS_RTOL, what="one process's loss")
    # Equal shards: the full-batch loss is the mean of the two ranks' losses.
    mean_of_ranks = [(a.loss + b.loss) / 2 for a, b in zip(two.steps(0), two.steps(1))]
    assert_series_close(mean_of_ranks, expected.losses, rtol=LOSS_RTOL, what="mean of the ranks' loss")
    for run in (one, two):
        assert_series_close([s.grad_norm for s in run.steps(0)], expected.grad_norms, rtol=GRAD_NORM_RTOL,
                            what="gradient norm")
