"""Tensor parallelism's collectives (DTensor's functional collectives, waited on inside DTensor)
are timed: exposed and busy time in the same CommStat fields the other strategies fill, and a
collective not yet complete is in flight in the hang ledger. Checked against a delay injected
into one of 2 gloo ranks (tp_timing_worker.py); the same step with the timing off
(collective_functional.TIME_FUNCTIONAL_WAITS) fails the checks. A further test (RINGTOP_SUITE_ALL=1)
has the agent's stall watch name a tp rank stuck before a collective (with the timing off it
names none within 60 s: checked by hand). The last test runs the CUDA-event path
on a GPU, skipped without one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import further, run_worker_script

DELAY_S = 0.5
TESTS_DIR = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def timed(tmp_path_factory):
    return run_worker_script(TESTS_DIR / "helpers" / "tp_timing_worker.py", [str(DELAY_S)],
                             tmp_path_factory.mktemp("tp-timing"), nproc=2, timeout_s=150)


def steps_of(rank: dict, kind: str) -> list[dict]:
    return [s for s in rank["steps"] if s["kind"] == kind]


def check_waited_for_the_late_rank(step: dict, plain: list[dict]) -> None:
    """Rank 0's first all-reduce cannot complete before rank 1, DELAY_S late, joins it; until then
    rank 0 did at most a plain step's work (its steps without lateness bound that, and the
    barrier's skew), so the rest of the delay is spent waiting on the collective."""
    bound_ms = DELAY_S * 1e3 - max(s["step_ms"] for s in plain)
    assert bound_ms > DELAY_S * 1e3 / 4, f"plain steps of {plain} leave no bound to check: a machine far too loaded"
    assert step["exposed_comm_ms"] >= bound_ms, (step, bound_ms)
    assert step["exposed_comm_ms"] <= step["busy_ms"]
    (tp,) = [c for c in step["comm"] if c["kind"] == "all_reduce"]
    assert tp["busy_ms"] >= bound_ms, tp


@pytest.mark.timeout(180)
def test_rank_waiting_on_a_late_rank_shows_the_wait_as_exposed_tp_communication(timed):
    late_rank0, = steps_of(timed[0], "late")
    check_waited_for_the_late_rank(late_rank0, steps_of(timed[0], "plain"))
    # the late rank itself slept outside any collective: not communication
    late_rank1, = steps_of(timed[1], "late")
    assert late_rank1["exposed_comm_ms"] < DELAY_S * 1e3 / 2, late_rank1
    for rank in timed:
        for step in rank["steps"]:
            assert 0 <= step["exposed_comm_ms"] <= step["step_ms"], step
            assert step["in_flight_after"] == 0  # every collective closed by the step's end
    # with the timing off, the same step's wait is not seen: the check above fails
    untimed, = steps_of(timed[0], "late-untimed")
    assert untimed["step_ms"] >= DELAY_S * 1e3
    with pytest.raises(AssertionError):
        check_waited_for_the_late_rank(untimed, steps_of(timed[0], "plain"))


@pytest.mark.timeout(180)
def test_a_tp_collective_waiting_for_its_peer_is_in_flight_in_the_ledger(timed):
    seen = timed[0]["seen_in_flight"]
    (op,) = seen["late"]
    assert (op["kind"], op["group"]) == ("all_reduce", "world")
    assert op["age_s"] >= DELAY_S / 2
    assert seen["late-untimed"] == []  # closed at its issue: the ledger would not see a hang


@further
@pytest.mark.timeout(150)
def test_a_tp_rank_stuck_before_a_collective_is_named_by_its_waiting_peer(launch_agents):
    """The agent's stall watch reads the same ledger: rank 1 hangs before its first collective of
    step 4 (in forward: RowwiseParallel's all-reduce); rank 0 waits in that all-reduce inside
    DTensor, which the ledger shows in flight, so the hang is named; then the run still stops."""
    from conftest import poll_until

    from ringtop.protocol import Event

    run = launch_agents(2, "--strategy", "tp", "--steps", "0", "--inject-hang", "1:4:before-collective",
                        "--stall-floor", "2", "--batch-size", "2", "--seq-len", "32")
    hang = poll_until(lambda: next((m for m in run.messages(0) if isinstance(m, Event) and m.kind == "hang"
                                    and m.level == "error"), None), 60, "a hang event from rank 0", interval_s=0.1,
                      detail=lambda: run.output()[-3000:])
    assert hang.hang.culprits == [1] and hang.hang.waiting == [0] and hang.hang.step == 4, hang.hang
    assert (hang.hang.collective, hang.hang.group) == ("all_reduce", "world"), hang.hang
    assert "rank 1 is in forward" in hang.text, hang.text
    replies = list(run.send_command("stop", {"reason": "stuck tp"}, timeout_s=30))
    assert replies[-1].status == "done", replies
    assert run.wait(30) != 0


@further
@pytest.mark.timeout(240)
def test_a_slow_link_under_tp_gives_the_communication_bound_verdict(launch_agents):
    """--inject-comm-delay 10: every collective completes 10 ms late, inside DTensor's wait; the
    diagnosis (every 20 steps) sees the exposed time and says communication-bound."""
    from ringtop.protocol import Event

    run = launch_agents(2, "--strategy", "tp", "--steps", "41", "--batch-size", "2", "--seq-len", "32",
                        "--inject-comm-delay", "10")
    assert run.wait(200) == 0, run.output()[-3000:]
    # 17 collectives a step (16 of the activations, the norm's scalar), each 10 ms late
    assert all(s.exposed_comm_ms >= 17 * 10 * 0.9 for s in run.steps(0)[1:]), run.steps(0)
    verdicts = [m.text for m in run.messages(0) if isinstance(m, Event) and m.kind == "verdict"]
    assert any(v.startswith("communication-bound") for v in verdicts), verdicts


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CUDA-event path)")
@pytest.mark.timeout(120)
def test_functional_collective_on_a_gpu_is_timed_by_cuda_events(tmp_path):
    """One rank, NCCL: a functional all-reduce behind a long matmul on the compute stream; its
    device interval and the stream's stall on it are resolved lazily at a drain."""
    import subprocess
    import sys

    code = r'''
import json, os, socket, torch, torch.distributed as dist
from torch.distributed import _functional_collectives as funcol
from ringtop.agent.instruments.comm_tracer import CommTracer
from ringtop.strategies import collective_functional, collective_hooks
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=0, world_size=1)
collective_functional.trace_functional_collectives()
tracer = CommTracer()
a = torch.randn(4096, 4096, device="cuda")
dist.all_reduce(a)  # NCCL's communicator set up outside the traced step
torch.cuda.synchronize()
with collective_hooks.active(tracer), collective_functional.functional_collectives_traced():
    b = a @ a
    y = funcol.all_reduce(b, "sum", dist.group.WORLD)
    z = y * 2
torch.cuda.synchronize()
summary = tracer.drain()
print(json.dumps({"kinds": [[k.kind, k.count, k.bytes, k.busy_ms] for k in summary.kinds],
                  "pending": summary.pending, "in_flight": tracer.in_flight,
                  "close": bool(torch.allclose(z, 2 * b))}))
dist.destroy_process_group()
'''
    import json

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["close"] and found["pending"] == 0 and found["in_flight"] == 0
    ((kind, count, nbytes, busy_ms),) = found["kinds"]
    assert (kind, count, nbytes) == ("all_reduce", 1, 4096 * 4096 * 4)
    assert busy_ms > 0
