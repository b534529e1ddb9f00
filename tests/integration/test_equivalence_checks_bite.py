"""The checks that hold every strategy to the single-process reference (tests/helpers/numerics.py) fail
when a strategy really trains differently: each run here has one deliberate mistake
(tests/helpers/agent_with_mutation.py) and must fail the same assertion the strategies pass."""

from __future__ import annotations

import pytest
from conftest import TESTS_DIR
from numerics import assert_state_close, assert_trains_like_the_reference
from reference import reference_run

from ringtop.agent.checkpoints.format import load_full_files

pytestmark = pytest.mark.timeout(240)

STEPS, BATCH, SEQ, LR = 6, 4, 32, 1e-3
COMMON = ("--batch-size", str(BATCH), "--seq-len", str(SEQ), "--lr", str(LR))
MUTANT = str(TESTS_DIR / "helpers" / "agent_with_mutation.py")


@pytest.fixture(scope="module")
def reference():
    return reference_run(STEPS, 2 * BATCH, SEQ, LR)


def finished(run) -> None:
    assert run.wait(180) == 0, run.output()[-4000:]


def mutant_run(launch_agents, mutation: str, strategy: str):
    """A finished 2-rank run of STEPS steps with one mistake, its full checkpoint at the end."""
    run = launch_agents(2, "--mutation", mutation, "--strategy", strategy, "--steps", str(STEPS), *COMMON,
                        "--checkpoint-every", str(STEPS), entry=MUTANT)
    finished(run)
    return run


def test_a_gradient_scaled_by_1_001_is_caught_by_the_gradient_norm(launch_agents, reference):
    run = mutant_run(launch_agents, "grad-scale", "ddp")
    with pytest.raises(AssertionError, match=r"gradient norm: largest relative difference 0\.001"):
        assert_trains_like_the_reference(run, reference, STEPS, LR)


def test_one_rank_skipping_one_update_is_caught(launch_agents, reference):
    run = mutant_run(launch_agents, "skip-update", "fsdp")
    with pytest.raises(AssertionError, match=r"loss: largest relative difference"):
        assert_trains_like_the_reference(run, reference, STEPS, LR)
    model_state, _, _ = load_full_files(run.checkpoint_dir / f"step-{STEPS:08d}-full")
    with pytest.raises(AssertionError, match=r"largest RMS difference .*; RMS tolerance"):
        assert_state_close(model_state, reference.state, steps=STEPS, lr=LR)  # the parameters alone fail too


def test_a_shard_loaded_into_the_wrong_rank_is_caught(launch_agents, reference):
    first = launch_agents(2, "--strategy", "fsdp", "--steps", "3", *COMMON, "--checkpoint-every", "3",
                          "--checkpoint-kind", "sharded", name="first")
    finished(first)
    resumed = launch_agents(2, "--mutation", "wrong-shard", "--strategy", "fsdp", "--steps", str(STEPS), *COMMON,
                            "--checkpoint-every", str(STEPS), "--resume", str(first.checkpoint_dir),
                            name="resumed", entry=MUTANT)
    finished(resumed)
    with pytest.raises(AssertionError, match=r"loss: largest relative difference .* at step [456]"):
        assert_trains_like_the_reference(resumed, reference, STEPS, LR, first_step=4)
