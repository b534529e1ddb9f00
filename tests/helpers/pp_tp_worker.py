"""3D on 4 gloo ranks without replicas (2 pipeline stages x tp 2), driven through the strategy
itself for what an agent run cannot show: the same training with the fused qkv split as q|k|v
(the layout trap), and live switches ddp -> pp with tp -> ddp through the agent's switch.

`python tests/helpers/rank_launcher.py 4 python pp_tp_worker.py STEPS BATCH SEQ LR OUT`: rank 0 writes
OUT/rank-0.pt (per layout: losses, gradient norms, the final full state; the switching run),
every rank OUT/rank-R.json (what it found).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ringtop.agent.models.model import MODEL_SIZES, build_tiny_gpt
from ringtop.strategies import tensor_parallel
from ringtop.strategies.base import DistContext
from ringtop.strategies.pipeline import PipelineStrategy

sys.path.insert(0, str(Path(__file__).resolve().parent))
import worker_results  # noqa: E402
from tp_worker import SEED, SIZE, run_plan, trainer_args  # noqa: E402
from tp_worker import trained as tp_trained  # noqa: E402

OPTIONS = {"stages": 2, "tp": 2, "micro_batches": 2, "schedule": "1f1b"}
SWITCHED_PLAN = ("ddp", ("pp", OPTIONS), ("pp", OPTIONS), "ddp")
"""ddp, then 3D (one replica: every rank reads the one batch), then ddp again."""


def trained(ctx: DistContext, steps: int, batch: int, seq: int, lr: float, by_head: bool):
    return tp_trained(ctx, steps, batch, seq, lr, by_head, PipelineStrategy(options=dict(OPTIONS)))


def main() -> int:
    steps, batch, seq, lr, out = trainer_args()
    rank, ctx = worker_results.gloo_rank()
    found: dict = {}
    saved: dict = {}
    for by_head in (True, False):
        strategy, losses, norms = trained(ctx, steps, batch, seq, lr, by_head)
        model_state = strategy.full_state_dict()[0]  # complete on rank 0
        saved["by_head" if by_head else "qkv"] = {"losses": losses, "norms": norms, "state": model_state}
        if by_head:
            found["position"] = [strategy.replica, strategy.stage_index, strategy.tp_index]
            found["local_heads"] = [b.n_head for b in strategy.module.blocks.values()]
        strategy.teardown()
    tensor_parallel.QKV_BY_HEAD = True
    saved["switched"], found["switch_diffs"] = run_plan(
        ctx, SWITCHED_PLAN, lambda: build_tiny_gpt(SIZE, SEED), MODEL_SIZES[SIZE].vocab_size, batch, seq, lr)
    return worker_results.finish(out, rank, found, saved)


if __name__ == "__main__":
    worker_results.run(main)
