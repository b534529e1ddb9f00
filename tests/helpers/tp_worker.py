"""Tensor parallelism on 2 gloo ranks, driven through the strategy itself (no agent), for what an
agent run cannot show: the tp model's logits, a full state loaded back into a fresh tp model, and
the same training with the fused qkv split as q|k|v (the layout trap).

`python -m torch.distributed.run --nproc_per_node=2 tp_worker.py STEPS BATCH SEQ LR OUT`: rank 0
writes OUT/rank-0.pt (per layout: losses, gradient norms, the final full state, logits of a fixed
batch), every rank OUT/rank-R.json (what it found).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from ringtop.agent.models.data import batch_from
from ringtop.agent.models.factories import call_model
from ringtop.agent.models.model import MODEL_SIZES, build_tiny_gpt
from ringtop.strategies import tensor_parallel
from ringtop.strategies.base import DistContext, TrainSettings

sys.path.insert(0, str(Path(__file__).resolve().parent))
import worker_results  # noqa: E402
from numerics import cloned_state, state_max_diff  # noqa: E402

SIZE, SEED = "1m", 0


class _NoPhases:
    def mark(self, phase: str) -> None:
        pass


def logits_of(model: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """TinyGPT's forward up to the logits (its own forward returns the loss)."""
    x = model.tok_emb(inputs) + model.pos_emb(torch.arange(inputs.shape[1]))
    for block in model.blocks:
        x = block(x)
    return model.head(model.ln_f(x))


def probe_batch(seq: int) -> torch.Tensor:
    """Inputs no training step saw, whose logits the tp model and a plain one are compared on."""
    return batch_from(10_000, 2, seq, MODEL_SIZES[SIZE].vocab_size, SEED)[0]


def trained(ctx: DistContext, steps: int, batch: int, seq: int, lr: float, by_head: bool, strategy=None):
    """`steps` steps of `strategy` (tensor parallelism by default) on the suite's batches, its qkv
    rows by head or not (the trap): (strategy, losses, gradient norms)."""
    tensor_parallel.QKV_BY_HEAD = by_head
    strategy = strategy or tensor_parallel.TensorParallelStrategy()
    strategy.setup(build_tiny_gpt(SIZE, SEED), lambda p: torch.optim.AdamW(p, lr=lr), ctx,
                   TrainSettings(batch_size=batch))
    vocab = MODEL_SIZES[SIZE].vocab_size
    losses, norms = [], []
    for step in range(steps):
        loss = strategy.run_step(batch_from(step * batch, batch, seq, vocab, SEED), call_model, _NoPhases())
        losses.append(loss.item())
        norms.append(float(strategy.last_grad_norm()))
    return strategy, losses, norms


SWITCHED_PLAN = ("ddp", "ddp", "tp", "ddp")
"""The strategy of each step of the switching run: live switches ddp -> tp -> ddp between them."""


def run_plan(ctx: DistContext, plan, build, vocab: int, batch: int, seq: int, lr: float):
    """One step under each strategy of `plan` (a name, or (name, options)), switched between through
    the agent's own switch (state taken on every rank, a model built on meta and handed it, the new
    wrapping loaded); a
    step reads one batch per data shard (ddp: 2 x batch on 2 ranks; tp: one batch on both).
    Returns (rank 0's result: each step's loss over its global batch, each step's global batch,
    the final full state; the full state's largest difference across each switch)."""
    from ringtop.agent.loop.switching import full_state_everywhere, switch_strategy
    from ringtop.strategies.registry import build_strategy

    group = dist.new_group(backend="gloo")
    settings = TrainSettings(batch_size=batch)

    def adamw(params):
        return torch.optim.AdamW(params, lr=lr)

    plan = [(item, {}) if isinstance(item, str) else item for item in plan]
    strategy = build_strategy(plan[0][0], dict(plan[0][1]), ctx.device)
    strategy.setup(build(), adamw, ctx, settings)
    losses, batches, diffs, first = [], [], [], 0
    for name, options in plan:
        if name != strategy.name:
            before = cloned_state(full_state_everywhere(strategy, ctx.rank, group))
            strategy, _ = switch_strategy(strategy, name, lambda o=options: dict(o), ctx, group, build, adamw,
                                          settings)
            diffs.append(state_max_diff(before, cloned_state(full_state_everywhere(strategy, ctx.rank, group))))
        shard, shards = strategy.data_shard(ctx)
        loss = strategy.run_step(batch_from(first + shard * batch, batch, seq, vocab, SEED), call_model, _NoPhases())
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=group)
        losses.append(float(mean) / ctx.world_size)  # tp, pp: every rank has its replica's loss
        batches.append(shards * batch)
        first += shards * batch
    return {"losses": losses, "batches": batches, "state": cloned_state(strategy.full_state_dict()[0])}, diffs


def switched(ctx: DistContext, batch: int, seq: int, lr: float):
    """SWITCHED_PLAN on the built-in model (run_plan)."""
    tensor_parallel.QKV_BY_HEAD = True
    return run_plan(ctx, SWITCHED_PLAN, lambda: build_tiny_gpt(SIZE, SEED), MODEL_SIZES[SIZE].vocab_size,
                    batch, seq, lr)


def trainer_args() -> tuple[int, int, int, float, Path]:
    """argv: steps, batch, seq, lr, the output folder (as the tests start the workers)."""
    steps, batch, seq = (int(a) for a in sys.argv[1:4])
    return steps, batch, seq, float(sys.argv[4]), Path(sys.argv[5])


def main() -> int:
    steps, batch, seq, lr, out = trainer_args()
    rank, ctx = worker_results.gloo_rank()
    vocab = MODEL_SIZES[SIZE].vocab_size
    probe = probe_batch(seq)
    found: dict = {}
    saved: dict = {}
    for by_head in (True, False):
        strategy, losses, norms = trained(ctx, steps, batch, seq, lr, by_head)
        with torch.no_grad():
            logits = logits_of(strategy.model, probe)
        # cloned: the replicated tensors of a full state are the live ones, which the next step moves
        model_state = {k: v.clone() for k, v in strategy.full_state_dict()[0].items()}
        saved["by_head" if by_head else "qkv"] = {"losses": losses, "norms": norms, "logits": logits,
                                                  "state": model_state}
        if by_head:
            from ringtop.agent.checkpoints.saver import CheckpointManager

            group = dist.new_group(backend="gloo")
            CheckpointManager(str(out / "checkpoints"), rank, group, group).save(strategy, steps, "sharded", {},
                                                                                  background=False)
            # The full state into a fresh tp model (a resume or a switch into tp), then one more
            # step in both: the same operations on the same state, so equal to the bit.
            again = tensor_parallel.TensorParallelStrategy()
            again.setup(build_tiny_gpt(SIZE, SEED + 1), lambda p: torch.optim.AdamW(p, lr=lr), ctx,
                        TrainSettings(batch_size=batch))
            everywhere = strategy.full_state_dict_on_every_rank()
            again.load_full_state_dict(copy.deepcopy(everywhere[0]), copy.deepcopy(everywhere[1]))
            more = batch_from(steps * batch, batch, seq, vocab, SEED)
            loss_a = strategy.run_step(more, call_model, _NoPhases()).item()
            loss_b = again.run_step(more, call_model, _NoPhases()).item()
            state_a, state_b = strategy.full_state_dict_on_every_rank(), again.full_state_dict_on_every_rank()
            found["reloaded_loss_diff"] = abs(loss_a - loss_b)
            found["reloaded_param_diff"] = max(float((state_a[0][k] - state_b[0][k]).abs().max()) for k in state_a[0])
            found["reloaded_moment_diff"] = max(
                float((state_a[1]["state"][k][m] - state_b[1]["state"][k][m]).abs().max())
                for k in state_a[1]["state"] for m in ("exp_avg", "exp_avg_sq"))
            found["local_heads"] = [b.n_head for b in strategy.model.blocks]
            found["full_names"] = sorted(model_state) if rank == 0 else []
    saved["switched"], found["switch_diffs"] = switched(ctx, batch, seq, lr)
    return worker_results.finish(out, rank, found, saved)


if __name__ == "__main__":
    worker_results.run(main)
