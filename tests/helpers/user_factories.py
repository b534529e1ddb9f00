"""A user's own model and data, as `--model user_factories:...` / `--data user_factories:...` load them."""

import torch
from torch import nn


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x):
        return self.net(x)


def model_and_loss():
    return Regressor(), nn.functional.mse_loss


def model_returning_loss(ctx):
    class WithLoss(Regressor):
        def forward(self, x, y):
            return {"loss": nn.functional.mse_loss(super().forward(x), y)}

    return WithLoss()


def batches(ctx):
    g = torch.Generator().manual_seed(ctx.seed + ctx.rank)
    while True:
        x = torch.randn(ctx.batch_size, 8, generator=g)
        yield x, x.sum(dim=1, keepdim=True)


def broken_model():
    raise RuntimeError("weights went missing")


def not_a_module():
    return 42
