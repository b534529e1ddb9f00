"""Real gloo runs: every Step carries its TFLOP/s, each equal to the Hello's FLOPs per token times
the Step's own tokens over its own step time, with FLOPs per token worked out here from the model's
shape (not by the agent's code); on CPU the Hello says no peak is known."""

from __future__ import annotations

import statistics

import pytest

from ringtop.agent.models.model import MODEL_SIZES, build_tiny_gpt
from ringtop.cli.summary import print_summary, summarize
from ringtop.protocol import Bye, Hello, Step

pytestmark = pytest.mark.timeout(150)


def tflops_of(step: Step, flops_per_token: float) -> float:
    return flops_per_token * step.tokens / (step.step_ms / 1000) / 1e12


def test_a_two_rank_run_reports_tflops_per_step_and_no_peak_on_cpu(finished_ddp_run):
    batch, seq_len = 4, 64  # conftest.finished_ddp_run's
    run = finished_ddp_run
    cfg = MODEL_SIZES["1m"]
    model = build_tiny_gpt("1m", 0)
    # every parameter but the position table (the token table is also the head), 6 x that, plus
    # attention: 12 x layers x d_model x sequence length
    matmul_params = sum(p.numel() for name, p in model.named_parameters() if name != "pos_emb.weight")
    expected = 6 * matmul_params + 12 * cfg.n_layer * cfg.d_model * seq_len
    for rank in (0, 1):
        msgs = run.messages(rank)
        hello = next(m for m in msgs if isinstance(m, Hello))
        assert hello.flops_per_token == expected and hello.flops_source.startswith("formula")
        assert (hello.peak_tflops, hello.accelerator) == (0.0, "")
        assert "--peak-tflops" in hello.peak_source
        steps = [m for m in msgs if isinstance(m, Step)]
        assert [s.step for s in steps] == list(range(1, 7))
        for s in steps:
            assert s.tokens == batch * seq_len and s.tflops > 0
            assert s.tflops == pytest.approx(tflops_of(s, expected), rel=1e-9)
        assert isinstance(msgs[-1], Bye) and msgs[-1].ok
    summary = {r["rank"]: r for r in summarize(run.log_dir)}
    for rank in (0, 1):  # the end-of-run summary: the median over steps after the first, no MFU without a peak
        steps = run.steps(rank)
        assert summary[rank]["median_tflops"] == pytest.approx(
            statistics.median(tflops_of(s, expected) for s in steps[1:]), rel=1e-9)
        assert summary[rank]["mfu"] is None


@pytest.mark.timeout(90)
def test_a_users_module_is_counted_and_peak_tflops_gives_a_cpu_a_peak(launch_agents, capsys):
    run = launch_agents(0, "--model", "user_factories:model_and_loss", "--data", "user_factories:batches",
                        "--steps", "4", "--batch-size", "4", "--peak-tflops", "0.5")
    assert run.wait(80) == 0, run.output()[-3000:]
    msgs = run.messages(0)
    hello = next(m for m in msgs if isinstance(m, Hello))
    # Linear(8, 16) -> ReLU -> Linear(16, 1), per row: forward 2 x 8 x 16 + 2 x 16; backward both
    # weight gradients again and the second layer's input gradient (2 x 16); 8 inputs ("tokens") a row
    per_row = 2 * (2 * 8 * 16 + 2 * 16) + 2 * 16
    assert hello.flops_source == "counted" and hello.flops_per_token == per_row / 8
    assert (hello.peak_tflops, hello.peak_source) == (0.5, "--peak-tflops")
    steps = [m for m in msgs if isinstance(m, Step)]
    assert len(steps) == 4
    assert all(s.tflops == pytest.approx(tflops_of(s, per_row / 8), rel=1e-9) and s.tflops > 0 for s in steps)
    median = statistics.median(tflops_of(s, per_row / 8) for s in steps[1:])
    (row,) = summarize(run.log_dir)
    assert row["median_tflops"] == pytest.approx(median, rel=1e-9)
    assert row["mfu"] == pytest.approx(median / 0.5, rel=1e-9)
    print_summary(run.log_dir)
    header, line = capsys.readouterr().out.strip().splitlines()[:2]
    assert header.split()[-4:-2] == ["TFLOP/s", "MFU"]
    assert f"{100 * median / 0.5:.1f}%" in line.split()
