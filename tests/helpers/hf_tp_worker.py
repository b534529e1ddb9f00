"""An hf model on 2 gloo ranks through a plan of strategies, one a step, switched live through the
agent's own switch (`switch_strategy`), driven without an agent; or under tp with the fused qkv
split as it is (`trap`: QKV_BY_HEAD off, the layout trap); or under tp with sequence parallelism
and the norms' partial gradients left unsummed (`sp-trap`: SUM_NORM_GRADS off).

`python tests/helpers/rank_launcher.py ... hf_tp_worker.py MODEL PLAN BATCH SEQ LR OUT` (MODEL: hf:NAME;
PLAN: the strategies, comma-separated, or `trap` or `sp-trap`): rank 0 writes OUT/rank-0.pt (each step's loss
over its global batch, each step's global batch, the final full state), every rank
OUT/rank-R.json (the full state's largest difference across each switch).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import worker_results
from tp_worker import run_plan

from ringtop.agent.models.hf_models import build_hf_model
from ringtop.strategies import tensor_parallel
from ringtop.strategies.base import DistContext

SEED = 0
TRAP_STEPS = 5


def main() -> int:
    model, plan = sys.argv[1], sys.argv[2].split(",")
    batch, seq = (int(a) for a in sys.argv[3:5])
    lr, out = float(sys.argv[5]), Path(sys.argv[6])
    if plan == ["trap"]:
        tensor_parallel.QKV_BY_HEAD = False
        plan = ["tp"] * TRAP_STEPS
    elif plan == ["sp-trap"]:
        tensor_parallel.SUM_NORM_GRADS = False
        plan = [("tp", {"sequence_parallel": True})] * TRAP_STEPS
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)
    ctx = DistContext(rank, world, rank, torch.device("cpu"), "gloo")
    vocab = build_hf_model(model, SEED).spec.dims.vocab
    result, diffs = run_plan(ctx, plan, lambda: build_hf_model(model, SEED), vocab, batch, seq, lr)
    return worker_results.finish(out, rank, {"switch_diffs": diffs}, result)


if __name__ == "__main__":
    worker_results.run(main)
