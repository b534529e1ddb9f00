"""Verdicts that hold: the rules over generated per-step series, through rank 0's debounced reading
(agent/health/diagnosis_exchange.py `Diagnostician.judge`, K = RAISE_AFTER / CLEAR_AFTER windows), the
advice in the run's own terms, and each rank's own findings (loss spikes, implausible TFLOP/s)."""

from __future__ import annotations

import dataclasses
import random
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import agent_env, run_worker_script

from ringtop.agent.health.diagnosis_exchange import Diagnostician
from ringtop.agent.health.step_findings import StepFindings
from ringtop.metrics.rules import diagnosis
from ringtop.metrics.rules.debounce import Debounce
from ringtop.metrics.rules.diagnosis import RankWindow, RunContext, diagnose, summarize
from ringtop.metrics.rules.peaks import Peak
from ringtop.protocol import Event, Hello, Step, read_log

WINDOW = diagnosis.WINDOW_STEPS


# ---------------------------------------------------------------------- the debounce itself

def test_a_key_is_raised_after_k_rounds_in_a_row_and_cleared_after_k_without():
    d = Debounce(raise_after=2, clear_after=2)
    rounds = [{"a"}, {"a"}, set(), {"a"}, set(), set(), {"a"}]
    got = [d.update(r) for r in rounds]
    assert got == [([], []), (["a"], []), ([], []), ([], []), ([], []), ([], ["a"]), ([], [])]


def test_a_finding_in_every_other_round_is_never_raised_but_flaps_with_k_1():
    alternating = [{"a"} if i % 2 == 0 else set() for i in range(10)]
    k2 = Debounce(2, 2)
    assert all(k2.update(r) == ([], []) for r in alternating)
    k1 = Debounce(1, 1)  # the bite: without a K the same rounds raise and clear five times
    raised = sum(len(k1.update(r)[0]) for r in alternating)
    assert raised == 5


# ---------------------------------------------------------------------- generated runs

def lockstep_steps(steps: int, ranks: int, seed: int, compute_ms=60.0, data_ms=2.0, comm_ms=8.0,
                   slow: dict[int, float] | None = None, bursts: list[tuple[int, int, int, float]] = (),
                   data_stall: dict[int, float] | None = None):
    """Per step, each rank's (step, data, blocked, busy, bytes, reserved, retries) in a DDP loop:
    every rank's step ends at the same all-reduce, so each waits there for the slowest arrival.
    Jitter is log-normal; `bursts` are (rank, first step, length, factor) on compute (a neighbour
    job on that host); `slow` and `data_stall` a rank's compute factor and extra data ms throughout."""
    rng = random.Random(seed)
    out = []
    for step in range(1, steps + 1):
        arrive, parts = {}, {}
        for r in range(ranks):
            c = compute_ms * rng.lognormvariate(0, 0.2) * (slow or {}).get(r, 1.0)
            for rank, first, length, factor in bursts:
                if rank == r and first <= step < first + length:
                    c *= factor
            d = data_ms * rng.lognormvariate(0, 0.5) + (data_stall or {}).get(r, 0.0)
            if rng.random() < 0.03:
                d += 25.0  # a loader hiccup
            parts[r], arrive[r] = (c, d), c + d
        end = max(arrive.values()) + comm_ms * rng.lognormvariate(0, 0.1)
        out.append({r: (end, parts[r][1], end - arrive[r], comm_ms, 4e6, 0.0, 0.0) for r in range(ranks)})
    return out


def read_run(series, run: RunContext, debounce: Debounce | None = None) -> tuple[list[tuple], Diagnostician]:
    """Rank 0's debounced reading of a generated run, window by window (exact medians of each
    rank's window, as the exchange's sketch gives them within 2.5 %): the events it emits."""
    events: list[tuple] = []
    d = Diagnostician(0, run.world_size, None, run, lambda *e: events.append(e))
    if debounce is not None:
        d.debounce = debounce
    for first in range(0, len(series), WINDOW):
        chunk = series[first:first + WINDOW]
        for step in chunk:
            d.record(*step[0])
        windows = [RankWindow(r, *[statistics.median(col) for col in zip(*[s[r] for s in chunk])])
                   for r in chunk[0]]
        d.judge(diagnose(windows, run))
    return [e for e in events if e[1] in ("verdict", "verdict_cleared")], d


DDP2 = RunContext(strategy="ddp", world_size=2, param_count=1_000_000, loop="monitor")
DDP4 = RunContext(strategy="ddp", world_size=4, param_count=1_000_000)
NEIGHBOUR_BURSTS = [(r, first, 16, 2.6) for r, first in ((1, 45), (0, 130), (1, 205), (0, 290), (1, 372), (0, 455))]
"""16-step bursts of a neighbour's job: at most one 20-step window each is mostly inside one."""


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_noisy_but_healthy_run_raises_no_verdict(seed):
    series = lockstep_steps(500, 2, seed, bursts=NEIGHBOUR_BURSTS)
    events, d = read_run(series, DDP2)
    assert events == [] and d.summary() == []


def test_the_noisy_run_would_flap_without_the_debounce():
    """The bite: the same series read window by window (K = 1) raises and clears stragglers on
    both ranks, as the issue saw ("rank 0 is a straggler" and "rank 1 is a straggler")."""
    events, _ = read_run(lockstep_steps(500, 2, 1, bursts=NEIGHBOUR_BURSTS), DDP2, Debounce(1, 1))
    raised = [e for e in events if e[1] == "verdict"]
    assert {e[3]["rank"] for e in raised} == {0, 1} and any(e[1] == "verdict_cleared" for e in events)


def test_a_real_straggler_is_one_verdict_stable_across_windows_naming_its_rank_and_step():
    series = lockstep_steps(300, 4, 7, slow={2: 2.5}, bursts=NEIGHBOUR_BURSTS)
    events, d = read_run(series, DDP4)
    assert [(e[1], e[3]["rule"], e[3]["rank"]) for e in events] == [("verdict", "straggler", 2)]
    level, kind, text, data = events[0]
    # raised at the end of the second window, naming the first window's first step
    assert data["step"] == 1 and data["ranks"] == [2] and "rank 2 is a straggler" in text and "since step 1" in text
    assert [r.verdict.rank for r in d.summary()] == [2] and d.summary()[0].cleared_step == -1


def test_at_most_one_straggler_per_window_the_slowest():
    # ranks 1 and 3 both compute far more than ranks 0 and 2; rank 3 the most
    windows = [RankWindow(0, 400, 1, 340), RankWindow(1, 400, 1, 100), RankWindow(2, 400, 1, 340),
               RankWindow(3, 400, 1, 0)]
    run = RunContext(strategy="ddp", world_size=4, param_count=1)
    assert [(v.rule, v.rank) for v in diagnose(windows, run)] == [("straggler", 3)]
    # the two slow ones tie: one is named (the higher rank, as metrics.outliers.slowest decides)
    tie = [RankWindow(0, 400, 1, 340), RankWindow(1, 400, 1, 0), RankWindow(2, 400, 1, 340), RankWindow(3, 400, 1, 0)]
    assert [(v.rule, v.rank) for v in diagnose(tie, run)] == [("straggler", 3)]


def test_a_new_worst_straggler_replaces_the_old_one():
    series = lockstep_steps(100, 4, 5, slow={1: 2.5}) + lockstep_steps(100, 4, 6, slow={3: 2.5})
    events, _ = read_run(series, DDP4)
    assert [(e[1], e[3]["rank"]) for e in events] == [("verdict", 1), ("verdict_cleared", 1), ("verdict", 3)]


def test_an_input_stall_is_data_wait_not_exposed_communication():
    # rank 1 sleeps 150 ms a step in its loader; rank 0 waits for it in the all-reduce
    series = lockstep_steps(200, 2, 11, data_stall={1: 150.0})
    events, _ = read_run(series, DDP2)
    assert [(e[1], e[3]["rule"], e[3]["rank"]) for e in events] == [("verdict", "input_stall", 1)]
    assert "DataLoader(num_workers=" in events[0][3]["advice"]
    # the bite: the waits read without the stalled rank's data wait are communication-bound (the finding)
    chunk = series[-WINDOW:]
    windows = [RankWindow(r, *[statistics.median(col) for col in zip(*[s[r] for s in chunk])]) for r in (0, 1)]
    unexplained = dataclasses.replace(summarize(windows, DDP2), input_flagged=(), input_flagged_count=0)
    assert diagnosis._comm_bound(unexplained, DDP2) != []


def test_communication_beyond_the_wait_for_a_slow_loader_is_still_comm_bound():
    # rank 3 loads 60 ms of a 200 ms step; every step also exposes 100 ms of communication
    windows = [RankWindow(r, 200.0, 1.0, 160.0) for r in range(3)] + [RankWindow(3, 200.0, 60.0, 100.0)]
    verdicts = diagnose(windows, DDP4)
    assert sorted((v.rule, v.rank) for v in verdicts) == [("comm_bound", None), ("input_stall", 3)]
    (comm,) = [v for v in verdicts if v.rule == "comm_bound"]
    assert comm.evidence["exposed_comm_share"] == pytest.approx(0.8 - 0.3) and "rank 3's input" in comm.text


# ---------------------------------------------------------------------- advice in the run's own terms

COMM_BOUND = [RankWindow(0, 100, 1, 60), RankWindow(1, 100, 1, 50)]
INPUT = [RankWindow(0, 100, 30, 1), RankWindow(1, 100, 1, 29)]


@pytest.mark.parametrize("loop, says, never", [
    ("agent", ["--ddp-bucket-cap-mb", "--batch-size"], ["DistributedDataParallel(", "TrainingArguments("]),
    ("monitor", ["DistributedDataParallel(model, bucket_cap_mb=", "no_sync()"], ["--ddp-bucket-cap-mb"]),
    ("hf", ["TrainingArguments(ddp_bucket_cap_mb=", "gradient_accumulation_steps"], ["--ddp-bucket-cap-mb"]),
    ("lightning", ["DDPStrategy(bucket_cap_mb=", "accumulate_grad_batches"], ["--ddp-bucket-cap-mb"]),
])
def test_comm_bound_advice_names_what_this_kind_of_run_can_change(loop, says, never):
    (v,) = diagnose(COMM_BOUND, RunContext(strategy="ddp", world_size=2, param_count=1, loop=loop))
    assert v.rule == "comm_bound" and v.ranks == (0, 1) and "ranks 0, 1" in v.text
    assert all(s in v.advice for s in says), v.advice
    assert not any(n in v.advice for n in never), v.advice


@pytest.mark.parametrize("loop, says", [
    ("agent", "--data function"), ("monitor", "DataLoader(num_workers="),
    ("hf", "TrainingArguments(dataloader_num_workers="), ("lightning", "DataLoader(num_workers="),
])
def test_input_advice_names_this_kind_of_runs_loader_setting(loop, says):
    (v,) = diagnose(INPUT, RunContext(strategy="ddp", world_size=2, param_count=1, loop=loop))
    assert v.rule == "input_stall" and v.rank == 0 and says in v.advice


def test_fsdp_full_advice_under_a_monitor_is_reshard_after_forward():
    run = RunContext(strategy="fsdp-full", world_size=2, param_count=1_000_000, loop="monitor")
    (v,) = diagnose(COMM_BOUND, run)
    assert "fully_shard(…, reshard_after_forward=False)" in v.advice and "S in the UI" not in v.advice


# ---------------------------------------------------------------------- each rank's own findings

def test_a_loss_spike_is_named_on_its_rank_and_step_once():
    rng = random.Random(3)
    losses = {r: [7.0 + rng.gauss(0, 0.05) for _ in range(80)] for r in (0, 1)}
    losses[0][56] *= 50  # step 57 on rank 0
    found = {r: [] for r in (0, 1)}
    for r in (0, 1):
        watch = StepFindings(r)
        for step, loss in enumerate(losses[r], start=1):
            found[r] += watch.observe(step, loss, 0.0)
    assert found[1] == []
    (spike,) = found[0]
    assert spike.kind == "loss_spike" and spike.step == 57 and spike.data["rank"] == 0
    assert "rank 0 at step 57" in spike.text and f"{losses[0][56]:.4g}"[:3] in spike.text
    # the ranks' mean would have diluted it: rank 1's losses halve the spike's height
    assert (losses[0][56] + losses[1][56]) / 2 < 0.6 * losses[0][56]


def test_tflops_above_what_the_cpu_cores_can_do_are_flagged_once():
    from ringtop.metrics.rules.peaks import tflops_ceiling

    watch = StepFindings(1)
    watch.ceiling = tflops_ceiling(Peak(0.0, "no accelerator"), "", "fp32", cpu_cores=2)
    assert watch.ceiling.tflops == pytest.approx(0.6)  # 2 cores x 0.3 (AVX-512, 2 FMA units, 4.7 GHz)
    assert watch.observe(1, 2.0, 0.5) == []
    (found,) = watch.observe(2, 2.0, 9.2)
    assert found.kind == "implausible_tflops" and "2 CPU cores" in found.text and "9.2" in found.text
    assert watch.observe(3, 2.0, 9.2) == []  # said once


# ---------------------------------------------------------------------- real ranks

@pytest.mark.timeout(240)
def test_an_own_loops_input_stall_on_real_ranks_is_input_not_comm(tmp_path, monkeypatch):
    """2 gloo ranks under ringtop.Monitor; rank 1 sleeps 60 ms in the data part of each of 60 steps."""
    import own_loop_input_stall as worker

    monkeypatch.setenv("RINGTOP_TEST_RUN_ID", uuid.uuid4().hex[:8])
    results = run_worker_script(Path(worker.__file__), ["60", "60"], tmp_path, nproc=2, timeout_s=200)
    logs = {r: read_log(tmp_path / "logs" / f"rank-{r}.jsonl") for r in (0, 1)}
    events = [m for m in logs[0] if isinstance(m, Event)]
    verdicts = [(e.data["rule"], e.data["rank"]) for e in events if e.kind == "verdict"]
    assert verdicts == [("input_stall", 1)], [e.text for e in events if e.kind.startswith("verdict")]
    (raised,) = [e for e in events if e.kind == "verdict"]
    assert "rank 1 waits on input" in raised.text and "since step" in raised.text
    assert "DataLoader(num_workers=" in raised.data["advice"] and "--" not in raised.data["advice"]
    (summary,) = [e for e in events if e.kind == "diagnosis"]
    assert [(v["rule"], v["rank"]) for v in summary.data["verdicts"]] == [("input_stall", 1)]
    for r in (0, 1):
        hello = next(m for m in logs[r] if isinstance(m, Hello))
        assert hello.tflops_ceiling > 0 and "CPU core" in hello.tflops_ceiling_source
        steps = [m for m in logs[r] if isinstance(m, Step)]
        assert len(steps) == 60 and all(s.tokens == worker.BATCH for s in steps), "the tokens given, not counted"
        for s in steps:  # TFLOP/s from what the script gave: FLOPs per token x tokens / the step's time
            assert s.tflops == pytest.approx(worker.FLOPS_PER_TOKEN * worker.BATCH / (s.step_ms / 1e3) / 1e12)
        assert [s.grad_norm for s in steps] == pytest.approx(results[r]["norms"]), "the norm clipping returned"
    rank1 = [m for m in logs[1] if isinstance(m, Step)][20:]
    assert statistics.median(s.data_ms for s in rank1) >= 60 * 0.9
    spikes = {r: [m for m in logs[r] if isinstance(m, Event) and m.kind == "loss_spike"] for r in (0, 1)}
    assert spikes[1] == [] and [(e.step, e.data["rank"]) for e in spikes[0]] == [(worker.SPIKE_STEP, 0)]

    out = subprocess.run([sys.executable, "-m", "ringtop.cli", "summary", str(tmp_path / "logs")], capture_output=True,
                         text=True, timeout=60, env=agent_env())
    assert out.returncode == 0, out.stderr
    assert "rank 1 waits on input" in out.stdout and "since step 1" in out.stdout, out.stdout
    assert "communication-bound" not in out.stdout
    assert f"loss spike on rank 0 at step {worker.SPIKE_STEP}" in out.stdout, out.stdout


def test_the_comm_tab_says_the_step_the_verdict_holds_since_not_when_it_was_raised():
    from ringtop.tui.state.view_model import RunView
    from ringtop.tui.tabs.comm.render import verdict_panel

    events, _ = read_run(lockstep_steps(60, 4, 7, slow={2: 2.5}), DDP4)
    level, kind, text, data = events[0]
    view = RunView(watch_liveness=False)
    view.apply(Hello(rank=0, seq=0, ts=1.0, run_id="v1", world_size=4), now=1.0)
    view.apply(Event(rank=0, seq=1, ts=2.0, level=level, kind=kind, text=text, step=40, data=data), now=2.0)
    panel = verdict_panel(view).plain
    assert "since step 1" in panel and "since step 40" not in panel and "rank 2" in panel, panel
