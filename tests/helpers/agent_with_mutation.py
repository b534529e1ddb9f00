"""The agent with one deliberate training mistake, to show the equivalence checks catch it:
`agent_with_mutation.py [agent options] --mutation NAME`.

- `grad-scale`: every gradient 1.001x too large (a wrong divisor in an average). AdamW is blind to
  it in the parameters; only the gradient norm shows it.
- `skip-update`: rank 1 skips its third optimizer step (under FSDP its shard then lags by one
  update for the rest of the run).
- `wrong-shard`: on resuming, each rank takes the other rank's shard of every weight (2 ranks,
  FSDP's even split along dim 0).
"""

import os
import sys

import torch

from ringtop.strategies.torch_native import TorchNativeStrategy

_at = sys.argv.index("--mutation")
MUTATION = sys.argv[_at + 1]
del sys.argv[_at:_at + 2]
RANK = int(os.environ.get("RANK", "0"))

if MUTATION == "grad-scale":
    backward = TorchNativeStrategy._backward

    def _scaled_backward(self, loss):
        backward(self, loss)
        with torch.no_grad():
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(1.001)

    TorchNativeStrategy._backward = _scaled_backward
elif MUTATION == "skip-update":
    optimizer_step = TorchNativeStrategy._optimizer_step
    calls = [0]

    def _sometimes_skipped(self):
        calls[0] += 1
        if RANK == 1 and calls[0] == 3:  # everything else of the step (the norm's collective) still runs
            step, self.optimizer.step = self.optimizer.step, lambda: None
            try:
                optimizer_step(self)
            finally:
                self.optimizer.step = step
            return
        optimizer_step(self)

    TorchNativeStrategy._optimizer_step = _sometimes_skipped
elif MUTATION == "wrong-shard":
    from ringtop.agent.loop import build

    read_resume = build.read_resume

    def _other_ranks_shard(run, fresh_model):
        """The full tensors rotated by half along dim 0: FSDP's even split of 2 then hands each
        rank the rows that were the other rank's shard."""
        model_state, optim_state, path = read_resume(run, fresh_model)
        swapped = {name: t.roll((t.shape[0] + 1) // 2, dims=0) if t.dim() else t for name, t in model_state.items()}
        return swapped, optim_state, path

    build.read_resume = _other_ranks_shard
else:
    raise SystemExit(f"unknown mutation {MUTATION!r}")

from ringtop.agent.__main__ import main  # noqa: E402
from ringtop.agent.distributed import exit_rank  # noqa: E402

exit_rank(main())
