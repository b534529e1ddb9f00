"""ringtop's callbacks in the real Hugging Face Trainer and the real Lightning Trainer: a tiny GPT-2
from a config in code, 2 gloo ranks under torchrun, both trainers one after the other in the
same processes. Skipped, saying why, where a trainer is not installed (the `hf` / `lightning`
extras)."""

from __future__ import annotations

import importlib.util
import uuid
from pathlib import Path

import pytest
from conftest import run_worker_script

from ringtop.protocol import Bye, Hello, Step, read_log

TESTS = Path(__file__).resolve().parents[1]
MISSING = [name for name in ("transformers", "accelerate", "lightning") if importlib.util.find_spec(name) is None]

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(bool(MISSING), reason=f"not installed: {', '.join(MISSING)} "
                                                       "(pip install -e \".[hf,lightning]\")")]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("trainers")
    mp = pytest.MonkeyPatch()
    mp.setenv("RINGTOP_TEST_RUN_ID", uuid.uuid4().hex[:8])
    try:
        ranks = run_worker_script(TESTS / "helpers" / "trainer_worker.py", ["hf,lightning"], out, nproc=2,
                                  timeout_s=220)
    finally:
        mp.undo()
    return out, ranks


@pytest.mark.parametrize("trainer", ["hf", "lightning"])
def test_the_trainers_steps_arrive_with_their_traffic_and_memory(trained, trainer):
    out, ranks = trained
    for rank in (0, 1):
        param_bytes = ranks[rank][trainer]["param_bytes"]
        messages = read_log(out / f"logs-{trainer}" / f"rank-{rank}.jsonl")
        hello = next(m for m in messages if isinstance(m, Hello))
        assert hello.strategy == "ddp" and hello.world_size == 2 and hello.strategy_options.get("loop") == "own"
        assert hello.strategy_options.get("trainer") == trainer, "the advice and the screen name the trainer's terms"
        steps = [m for m in messages if isinstance(m, Step)]
        assert [s.step for s in steps] == list(range(1, len(steps) + 1)) and 2 <= len(steps) < 500
        for s in steps:
            assert s.loss is not None and 0 < s.loss < 10, "the model's loss (cross-entropy over 64 tokens: ~4.2)"
            assert {c.kind: c.bytes for c in s.comm}["all_reduce"] == param_bytes, "DDP all-reduces the grads"
            assert s.mem.params_bytes == param_bytes and s.mem.grads_bytes == param_bytes
            assert s.tokens == 2 * 16 and s.forward_ms > 0 and s.backward_ms > 0
            # TFLOP/s from the trainer's own count (HF: floating_point_ops; Lightning: flops_per_batch)
            assert s.tflops == pytest.approx(ranks[rank][trainer]["flops_per_step"] / (s.step_ms / 1e3) / 1e12)
        bye = messages[-1]
        assert isinstance(bye, Bye) and bye.ok and bye.reason == "stopped by user: commander", bye
    commands = ranks[0][trainer]["commands"]
    assert commands["stop"]["status"] == "done"
    checkpoint = commands["checkpoint"]
    assert checkpoint["status"] == "done", checkpoint
    path = Path(checkpoint["result"]["path"])
    assert path.parent == out / f"checkpoints-{trainer}"
    assert path.name == f"step-{checkpoint['result']['step']:08d}-user"
    saved = {"hf": "model.safetensors", "lightning": "model.ckpt"}[trainer]
    assert (path / saved).stat().st_size > ranks[0][trainer]["param_bytes"] / 2, "the trainer's own save wrote it"
