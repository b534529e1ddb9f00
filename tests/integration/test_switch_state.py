"""The pieces that make a live switch fast, checked on their own: the full state taken on every
rank without going through rank 0, each rank loading its own part of a full state, and a new model
built on the meta device and filled from a state (tied weights kept tied).

The multi-rank part runs this file as a script under `torch.distributed.run` (2 gloo ranks); each
rank writes what it found to a JSON file that pytest reads.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from ringtop.agent.loop.switching import model_holding
from ringtop.agent.models.model import build_tiny_gpt

TESTS_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS_DIR))

from conftest import agent_env, further, run_worker_script  # noqa: E402
from numerics import cloned_state, state_max_diff  # noqa: E402

HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
STRATEGIES = {
    "default": [("ddp", {}), ("fsdp", {"sharding": "full"}),
                *([("zero2", {}), ("zero3", {})] if HAS_DEEPSPEED else [])],
    # FSDP's other shardings read and load through full's code; ZeRO-1 through ZeRO-2's (one class)
    "further": [("fsdp", {"sharding": "grad-op"}), ("fsdp", {"sharding": "no-shard"}),
                *([("zero1", {})] if HAS_DEEPSPEED else [])],
}


# ---------------------------------------------------------------- the worker (runs under rank_launcher)


def _worker(which: str, out_dir: str) -> None:
    import os

    import torch.distributed as dist

    from ringtop.agent.loop.switching import broadcast_state
    from ringtop.strategies.base import DistContext, TrainSettings
    from ringtop.strategies.registry import build_strategy

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ctx = DistContext(rank, world, int(os.environ["LOCAL_RANK"]), torch.device("cpu"), "gloo")
    group = dist.new_group(backend="gloo")
    settings = TrainSettings(batch_size=2)

    class NoPhases:
        def mark(self, phase: str) -> None:
            pass

    def adamw(params):
        return torch.optim.AdamW(params, lr=1e-3)

    def full(strategy):
        """Rank 0's full state on both ranks (full_state_dict is collective, complete on rank 0)."""
        state = strategy.full_state_dict()
        return cloned_state(broadcast_state(state if rank == 0 else None, rank, group))

    def step(strategy, seed: int) -> float:
        g = torch.Generator().manual_seed(seed * 10 + rank)
        batch = torch.randint(0, 1024, (2, 17), generator=g)
        loss = strategy.run_step(batch, lambda m, b: m(b[:, :-1], b[:, 1:]), NoPhases())
        return float(loss)

    found = {}
    for name, options in STRATEGIES[which]:
        label = f"{name}{options.get('sharding', '')}"
        source = build_strategy(name, dict(options), ctx.device)
        source.setup(build_tiny_gpt("1m", 0), adamw, ctx, settings)
        for i in range(2):
            step(source, i)
        via_rank0 = full(source)
        everywhere = cloned_state(source.full_state_dict_on_every_rank())  # it may alias live tensors
        every_rank_vs_rank0 = state_max_diff(everywhere, via_rank0)
        # Load rank 0's full state into a fresh wrapping of the same kind, whose own weights differ
        # (another seed), then read it back and train both one more step on the same batch. The
        # loaded strategy may keep the tensors it is given: it gets a copy.
        target = build_strategy(name, dict(options), ctx.device)
        target.setup(build_tiny_gpt("1m", 1), adamw, ctx, settings)
        target.load_full_state_dict(*cloned_state(via_rank0))
        loaded_reread_vs_loaded = state_max_diff(full(target), via_rank0)
        source_loss, target_loss = step(source, 7), step(target, 7)
        found[label] = {
            "every_rank_vs_rank0": every_rank_vs_rank0,
            "loaded_reread_vs_loaded": loaded_reread_vs_loaded,
            "next_loss_source": source_loss, "next_loss_target": target_loss,
            "after_next_step_diff": state_max_diff(full(target), full(source)),
        }
        source.teardown()
        target.teardown()
    Path(out_dir, f"rank-{rank}.json").write_text(json.dumps(found))
    dist.destroy_process_group()


# ---------------------------------------------------------------- the tests


@pytest.mark.timeout(300)
@pytest.mark.parametrize("which", ["default", pytest.param("further", marks=further)])
def test_every_rank_state_and_direct_load_match_the_rank0_path(tmp_path, monkeypatch, which):
    """Every strategy's state taken on every rank equals rank 0's gathered one exactly; loading a
    full state reproduces it exactly and the next step is the same as the source's. DeepSpeed's
    set-up compiles no kernel on the way (its CPU shared-memory all-reduce took 50 s to build)."""
    extensions = tmp_path / "torch_extensions"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(extensions))
    ranks = run_worker_script(Path(__file__).resolve(), [which], tmp_path / "state", nproc=2, timeout_s=280)
    assert set(ranks[0]) == {f"{n}{o.get('sharding', '')}" for n, o in STRATEGIES[which]}
    for rank, found in enumerate(ranks):
        for label, f in found.items():
            where = f"{label} on rank {rank}"
            assert f["every_rank_vs_rank0"] == 0.0, where
            assert f["loaded_reread_vs_loaded"] == 0.0, where
            tolerance = 1e-6 if label == "zero3" else 0.0
            assert abs(f["next_loss_target"] - f["next_loss_source"]) <= tolerance * abs(f["next_loss_source"]), where
            assert f["after_next_step_diff"] <= tolerance, where
    built = sorted(p.name for p in extensions.glob("*")) if extensions.exists() else []
    assert built == [], f"DeepSpeed compiled {built} during set-up"


def test_a_model_built_on_meta_holds_the_state_with_its_tied_weights_tied():
    state = build_tiny_gpt("1m", 3).state_dict()
    model = model_holding(lambda: build_tiny_gpt("1m", 0), state, torch.device("cpu"))
    assert model.head.weight is model.tok_emb.weight
    assert len(list(model.parameters())) == len(list(build_tiny_gpt("1m", 0).parameters()))
    for name, value in model.state_dict().items():
        assert value.device.type == "cpu"
        assert value.data_ptr() == state[name].data_ptr(), f"{name} was copied"


class _WithScratchBuffer(nn.Module):
    """A model with a non-persistent buffer: no state dict carries it, so a meta build would
    leave it uninitialised."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("scale", torch.full((4,), 2.0), persistent=False)


class _MetaRefusing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        if self.lin.weight.is_meta:
            raise RuntimeError("this factory reads something from real tensors")


@pytest.mark.parametrize("factory", [_WithScratchBuffer, _MetaRefusing])
def test_models_that_cannot_be_built_on_meta_are_built_for_real(factory):
    torch.manual_seed(5)
    state = factory().state_dict()
    model = model_holding(factory, state, torch.device("cpu"))
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    for name, value in model.state_dict().items():
        assert torch.equal(value, state[name]), name
    if isinstance(model, _WithScratchBuffer):
        assert torch.equal(model.scale, torch.full((4,), 2.0))


@pytest.mark.timeout(120)
def test_the_background_warm_up_imports_what_a_switch_would_wait_for():
    """In a fresh process the warm-up finishes without error and leaves DeepSpeed (when installed)
    and the state-dict API imported, so a switch or a first checkpoint does not pay for them
    (benchmarks/bench_switch.py measures the effect)."""
    script = (
        "import sys, time\n"
        "from ringtop.agent.loop.prewarm import Prewarm\n"
        "w = Prewarm(); w.start()\n"
        "deadline = time.monotonic() + 100\n"
        "while not w.done and time.monotonic() < deadline: time.sleep(0.05)\n"
        "print(w.done, repr(w.error), 'deepspeed' in sys.modules,\n"
        "      'torch.distributed.checkpoint.state_dict' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=agent_env(), timeout=110)
    assert out.returncode == 0, out.stderr[-3000:]
    done, error, deepspeed_loaded, state_dict_loaded = out.stdout.strip().splitlines()[-1].split()
    assert (done, error, state_dict_loaded) == ("True", "''", "True")
    assert deepspeed_loaded == str(HAS_DEEPSPEED)


if __name__ == "__main__":
    from ringtop.agent.distributed import exit_rank

    _worker(sys.argv[1], sys.argv[2])
    exit_rank(0)
