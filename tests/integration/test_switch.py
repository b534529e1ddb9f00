"""Live strategy switches on a real 2-rank run: a circuit through every strategy (every ordered
pair with RINGTOP_SWITCH_ALL=1), the training continuing exactly like a run that never switched;
failures roll back with the state intact."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from conftest import TESTS_DIR, further
from numerics import LOSS_RTOL, assert_series_close
from reference import reference_run

from ringtop.protocol import Bye, Event, Hello, Step

BATCH, SEQ, LR = 4, 32, 3e-4
# One step between switches keeps the whole walk (43 switches) inside ~50 steps: beyond ~70 steps
# this small-batch run becomes chaotic, and float-rounding differences between strategies (~1e-7)
# grow past any tolerance even without a switch (seen between DDP and one big-batch process).
COMMON = ("--steps", "0", "--batch-size", str(BATCH), "--seq-len", str(SEQ), "--lr", str(LR))
TARGETS = {
    "ddp": {"strategy": "ddp"},
    "fsdp-full": {"strategy": "fsdp", "fsdp_sharding": "full"},
    "fsdp-grad-op": {"strategy": "fsdp", "fsdp_sharding": "grad-op"},
    "fsdp-no-shard": {"strategy": "fsdp", "fsdp_sharding": "no-shard"},
    "zero1": {"strategy": "zero1"},
    "zero2": {"strategy": "zero2"},
    "zero3": {"strategy": "zero3"},
}
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
CIRCUIT = ["ddp", "zero3", "fsdp-full", "zero1", "fsdp-grad-op", "zero2", "fsdp-no-shard", "ddp"]
"""Every strategy switched into and out of once, DeepSpeed and FSDP alternating (7 switches)."""


@pytest.fixture(autouse=True)
def _with_the_warm_up(monkeypatch):
    """Switches here run as users' do: after the background warm-up (the suite turns it off elsewhere)."""
    monkeypatch.setenv("RINGTOP_PREWARM", "1")


def every_ordered_pair(nodes: list[str], start: str) -> list[str]:
    """A walk from `start` that crosses every ordered pair (a, b), a != b, exactly once
    (an Eulerian circuit of the complete directed graph, by Hierholzer's algorithm)."""
    unused = {a: [b for b in nodes if b != a] for a in nodes}
    stack, walk = [start], []
    while stack:
        if unused[stack[-1]]:
            stack.append(unused[stack[-1]].pop())
        else:
            walk.append(stack.pop())
    return walk[::-1]


def switch(run, **args):
    replies = list(run.send_command("switch", args, timeout_s=120))
    return replies[-1]


def mean_losses(run) -> dict[int, float]:
    a = {s.step: s.loss for s in run.steps(0)}
    b = {s.step: s.loss for s in run.steps(1)}
    return {step: (a[step] + b[step]) / 2 for step in sorted(a) if step in b}


def test_the_circuit_enters_and_leaves_every_strategy_once():
    assert sorted(CIRCUIT[:-1]) == sorted(TARGETS) and CIRCUIT[0] == CIRCUIT[-1] == "ddp"


def test_the_walk_covers_every_ordered_pair_once():
    walk = every_ordered_pair(list(TARGETS), "ddp")
    pairs = list(zip(walk, walk[1:]))
    assert len(pairs) == len(set(pairs)) == 7 * 6 and walk[0] == walk[-1] == "ddp"


@pytest.mark.timeout(420)
@pytest.mark.skipif(not HAS_DEEPSPEED, reason="DeepSpeed is not installed (pip install 'ringtop[deepspeed]')")
@pytest.mark.parametrize("route", ["circuit", pytest.param("every-pair", marks=further(env="RINGTOP_SWITCH_ALL"))])
def test_switching_through_every_pair_keeps_training_as_if_it_never_switched(launch_agents, route):
    """The circuit by default; all 42 ordered pairs (~60 s more) as a further variant."""
    run = launch_agents(2, *COMMON, name="switching")
    plain = launch_agents(2, *COMMON, name="never-switched")
    run.wait_for_step(2)
    walk = every_ordered_pair(list(TARGETS), "ddp") if route == "every-pair" else CIRCUIT
    durations = []
    for target in walk[1:]:
        done = switch(run, **TARGETS[target])
        assert done.status == "done", done.error
        durations.append(done.result["seconds"])
        run.wait_for_step(done.result["step"] + 1)
    last = max(s.step for s in run.steps(0))
    for r in (run, plain):
        r.wait_for_step(last)
        assert list(r.send_command("stop", {}, timeout_s=60))[-1].status == "done"
        assert r.wait(60) == 0, r.output()[-3000:]

    switched, never = mean_losses(run), mean_losses(plain)
    switches = [e for e in run.messages(0) if isinstance(e, Event) and e.kind == "switch"]
    assert len(switches) == len(walk) - 1 and all(e.level == "info" for e in switches)
    steps = [s for s in switched if s in never]
    assert len(steps) >= len(walk)
    worst = max(abs(switched[s] - never[s]) for s in steps)
    assert worst <= 1e-6, f"largest loss difference from the run that never switched: {worst:.2e}"
    expected = reference_run(max(steps), 2 * BATCH, SEQ, LR)
    assert_series_close([switched[s] for s in steps], [expected.losses[s - 1] for s in steps], rtol=LOSS_RTOL,
                        what="loss of the switched run")
    assert max(durations) < 30


@pytest.mark.timeout(300)
def test_failed_switches_roll_back_and_training_goes_on(launch_agents):
    run = launch_agents(2, *COMMON, "--inject-fail-setup", "fsdp",
                        entry=str(TESTS_DIR / "helpers" / "agent_without_deepspeed.py"))
    run.wait_for_step(2)
    # the Hello says so first, so that the UI's picker does not offer it (tui/actions.switch_rows)
    hello = next(m for m in run.messages(0) if type(m).__name__ == "Hello")
    assert set(hello.switch_unavailable) == {"zero1", "zero2", "zero3"}, hello.switch_unavailable
    assert "DeepSpeed is not installed" in hello.switch_unavailable["zero2"]
    not_installed = switch(run, strategy="zero2")
    assert not_installed.status == "error" and "DeepSpeed is not installed" in not_installed.error
    wrapping_fails = switch(run, strategy="fsdp")
    assert wrapping_fails.status == "error" and "rolled back" in wrapping_fails.error
    assert "injected failure while wrapping" in wrapping_fails.error
    # A config named by a command: only inside the run's checkpoint directory, and the error does
    # not tell a missing file from an existing one; inside, only keys that shape training.
    outside = [switch(run, strategy="zero1", ds_config=path).error
               for path in ("/nonexistent/ds.json", str(Path(__file__)), "../../../etc/passwd")]
    assert len(set(e.replace(str(Path(__file__)), "X") for e in outside)) == 1, outside
    assert "inside the run's checkpoint directory" in outside[0]
    run.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    written = run.checkpoint_dir.parent / "overwritten.txt"
    (run.checkpoint_dir / "profiler.json").write_text(json.dumps(
        {"zero_optimization": {"stage": 1}, "flops_profiler": {"enabled": True, "output_file": str(written)}}))
    profiler = switch(run, strategy="zero1", ds_config="profiler.json")
    assert profiler.status == "error" and "refused: flops_profiler" in profiler.error, profiler.error
    assert not written.exists()
    unknown = switch(run, strategy="zero9")
    assert unknown.code == "bad_arguments"
    rewrap = switch(run, strategy="ddp")  # the same strategy, re-wrapped through the full state
    assert rewrap.status == "done", rewrap.error
    step = max(s.step for s in run.steps(0))
    run.wait_for_step(step + 3)
    assert list(run.send_command("stop", {}, timeout_s=60))[-1].status == "done"
    assert run.wait(60) == 0, run.output()[-3000:]

    errors = [e for e in run.messages(0) if isinstance(e, Event) and e.kind == "switch" and e.level == "error"]
    assert len(errors) == 3 and all("still training with ddp" in e.text for e in errors), [e.text for e in errors]
    # A switch drops DDP's wrapper (its gradient buckets) before wrapping anew; after the rollback
    # the next step wraps the module again, comm hook included: every step still all-reduces
    # every gradient once, and is recorded.
    hello = next(m for m in run.messages(0) if isinstance(m, Hello))
    rolled_back_at = max(e.step for e in errors)
    after = [s for s in run.messages(0) if isinstance(s, Step) and s.step > rolled_back_at]
    assert after and all([(c.kind, c.bytes) for c in s.comm] == [("all_reduce", 4 * hello.param_count)]
                         for s in after)
    losses = mean_losses(run)
    expected = reference_run(max(losses), 2 * BATCH, SEQ, LR)
    assert_series_close(list(losses.values()), expected.losses, rtol=LOSS_RTOL, what="loss")


@pytest.mark.timeout(180)
def test_a_switch_that_fails_after_the_old_strategy_is_let_go_ends_the_run_with_the_reason(launch_agents):
    """Past the ranks' agreement the old state is freed as the new one is written (forced failure
    there): no strategy is left to train with, so the run must not take another step on a half-
    written state; the user gets the reason and a failed run, not a hang or silent garbage."""
    run = launch_agents(2, *COMMON, entry=str(TESTS_DIR / "helpers" / "agent_failing_after_commit.py"))
    run.wait_for_step(2)
    reply = switch(run, strategy="fsdp")
    assert reply.status == "error" and "the state is lost" in reply.error
    assert "forced failure while writing the state" in reply.error
    assert run.wait(60) != 0, run.output()[-3000:]
    for rank in (0, 1):
        messages = run.messages(rank)
        bye = messages[-1]
        assert isinstance(bye, Bye) and not bye.ok and "the state is lost" in bye.reason, bye
        assert max(s.step for s in messages if isinstance(s, Step)) == bye.step  # none after the switch
