"""The pipeline strategy inside the agent: timelines on the wire, idle time, `set micro_batches`,
training that still equals one process with the same batch."""

from __future__ import annotations

import pytest
from numerics import LOSS_RTOL, assert_series_close
from reference import reference_run

from ringtop.protocol import Event, Hello, Step, Timeline

pytestmark = pytest.mark.timeout(240)
BATCH, SEQ, LR = 8, 32, 1e-3


def test_a_two_stage_pipeline_publishes_timelines_and_changes_micro_batches_live(launch_agents):
    run = launch_agents(2, "--strategy", "pp", "--micro-batches", "2", "--steps", "0", "--batch-size", str(BATCH),
                        "--seq-len", str(SEQ), "--lr", str(LR))
    run.wait_for_step(6)
    bad = list(run.send_command("set", {"micro_batches": 3}, timeout_s=60))[-1]
    assert bad.status == "error" and "does not divide" in bad.error
    done = list(run.send_command("set", {"micro_batches": 4}, timeout_s=60))[-1]
    assert done.status == "done", done.error
    run.wait_for_step(done.result["step"] + 7)
    assert list(run.send_command("stop", {}, timeout_s=60))[-1].status == "done"
    assert run.wait(60) == 0, run.output()[-3000:]

    for rank in (0, 1):
        hellos = [m for m in run.messages(rank) if isinstance(m, Hello)]
        assert hellos[0].strategy_options["micro_batches"] == 2 and hellos[-1].strategy_options["micro_batches"] == 4
        timelines = [m for m in run.messages(rank) if isinstance(m, Timeline)]
        assert {t.micro_batches for t in timelines} == {2, 4}
        for t in timelines:
            assert t.stage == rank and t.stages == 2
            assert sorted((s.op, s.micro_batch) for s in t.spans) == sorted(
                [("F", m) for m in range(t.micro_batches)] + [("B", m) for m in range(t.micro_batches)])
            assert all(0 <= s.start_ms <= s.end_ms <= t.window_ms * 1.001 for s in t.spans)
            assert t.bubble_theory == pytest.approx(1 / (1 + t.micro_batches))  # (N-1)/(N+M-1), N=2
            assert 0 < t.bubble < 1
        steps = run.steps(rank)
        assert all(s.idle_ms > 0 for s in steps)
        assert any(c.kind == "p2p" for s in steps for c in s.comm), "activations between stages are traced"

    # One replica: every rank reports its replica's loss, which equals one process on the same batch.
    losses = [s.loss for s in run.steps(0)]
    assert losses == [s.loss for s in run.steps(1)]
    expected = reference_run(len(losses), BATCH, SEQ, LR)
    assert_series_close(losses, expected.losses, rtol=LOSS_RTOL, what="loss")


def test_switching_into_and_out_of_the_pipeline_keeps_training(launch_agents):
    run = launch_agents(2, "--steps", "0", "--batch-size", str(BATCH), "--seq-len", str(SEQ), "--lr", str(LR))
    run.wait_for_step(2)
    refused = list(run.send_command("set", {"micro_batches": 2}, timeout_s=60))[-1]
    assert refused.status == "error" and "ddp has no micro-batches; switch to pp first" in refused.error
    for args in ({"strategy": "pp", "micro_batches": 2}, {"strategy": "fsdp"},
                 {"strategy": "pp", "pp_schedule": "1f1b", "micro_batches": 4}, {"strategy": "ddp"}):
        done = list(run.send_command("switch", args, timeout_s=120))[-1]
        assert done.status == "done", done.error
        run.wait_for_step(done.result["step"] + 2)
    assert list(run.send_command("stop", {}, timeout_s=60))[-1].status == "done"
    assert run.wait(60) == 0, run.output()[-3000:]

    for rank in (0, 1):  # a switch into pp predicts what the stage then holds, not the whole model
        msgs = run.messages(rank)
        hello_at = [i for i, m in enumerate(msgs) if isinstance(m, Hello)] + [len(msgs)]
        pp_spans = [(i, end) for i, end in zip(hello_at, hello_at[1:]) if msgs[i].strategy == "pp"]
        assert len(pp_spans) == 2
        for i, end in pp_spans:
            predicted = msgs[i].prediction.params_bytes
            following = [m.mem.params_bytes for m in msgs[i + 1:end] if isinstance(m, Step)]
            assert predicted < 4 * msgs[i].param_count and predicted in following, (rank, predicted, following)
    # Under data parallelism each rank takes half the global batch of 2 x BATCH; a 2-stage pipeline
    # has one replica, which takes BATCH per step. The stream position carries over either way.
    hellos = [m for m in run.messages(0) if isinstance(m, Hello)]
    assert [h.strategy for h in hellos] == ["ddp", "pp", "fsdp", "pp", "ddp"]
    switched_at = [e.data["step"] for e in run.messages(0) if isinstance(e, Event) and e.kind == "switch"]
    a, b = ({s.step: s.loss for s in run.steps(r)} for r in (0, 1))
    last = max(a)

    def strategy_at(step):
        return sum(step > s for s in switched_at)  # index into ddp, pp, fsdp, pp, ddp

    in_pipeline = {step: strategy_at(step) in (1, 3) for step in range(1, last + 1)}
    batches = [BATCH if in_pipeline[step] else 2 * BATCH for step in range(1, last + 1)]
    expected = reference_run(last, batches, SEQ, LR)
    losses = [a[step] if in_pipeline[step] else (a[step] + b[step]) / 2 for step in range(1, last + 1)]
    assert_series_close(losses, expected.losses, rtol=LOSS_RTOL, what="loss")
