"""What the UI's actions need before they send anything: the switch targets with the cost model's
prediction for each, and the check of a micro-batch count. Pure Python (no Textual).

Predicted memory and traffic mirror the agent's conventions (agent/loop/prediction.py): DeepSpeed ZeRO
keeps params and grads in the compute dtype plus an fp32 master copy, so K = 12 optimizer bytes per
parameter; the torch strategies (DDP, FSDP) keep fp32 params and grads (mixed precision casts on
the fly) and AdamW's 8 bytes per parameter. On the wire parameters travel in the compute dtype;
DeepSpeed reduces gradients in it, torch in fp32. On gloo a reduce-scatter runs as an all-reduce.
For the strategy the run uses now, the optimizer bytes per parameter come from its Hello.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ringtop.metrics.costs.cost_model import implementation_cost
from ringtop.metrics.parallel_dims import tp_degrees
from ringtop.metrics.strategy_names import DATA_PARALLEL_STRATEGIES, picker_label, sharded_words, switch_args
from ringtop.tui.state.view_model import RunView
from ringtop.tui.tabs.memory.figures import current_strategy


@dataclass(frozen=True, slots=True)
class SwitchTarget:
    key: str
    """The cost model's name: ddp, zero1, zero2, zero3, fsdp-full, fsdp-grad-op, fsdp-no-shard;
    for a mesh, `tp` or `fsdp-full+tpT` (2D)."""
    label: str
    args: dict[str, Any]
    """The `switch` command's arguments."""


SWITCH_TARGETS: tuple[SwitchTarget, ...] = tuple(
    SwitchTarget(name, picker_label(name), switch_args(name)) for name in DATA_PARALLEL_STRATEGIES)


@dataclass(frozen=True, slots=True)
class SwitchRow:
    target: SwitchTarget
    sharded: str
    """What the target shards (`grads+optim`), or `-`."""
    params_bytes: int | None
    """None: the run's parameter count is unknown."""
    grads_bytes: int | None
    optimizer_bytes: int | None
    sent_bytes: int | None
    """Bytes each rank puts on the wire per step (ring algorithms)."""
    current: bool

    @property
    def total_bytes(self) -> int | None:
        if self.params_bytes is None:
            return None
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


def mesh_targets(world: int) -> list[SwitchTarget]:
    """Tensor parallelism over every rank and, for each degree T between that divides the world,
    2D (FSDP full over world/T replicas of tp groups of T): what `switch` takes with `tp`. The
    agent checks the model (T must divide its heads) and refuses with the reason."""
    if world < 2:
        return []
    out = [SwitchTarget("tp", f"tp ×{world}", {"strategy": "tp"})]
    for t in tp_degrees(world)[1:-1]:
        out.append(SwitchTarget(f"fsdp-full+tp{t}", f"fsdp full tp={t}",
                                {"strategy": "fsdp", "fsdp_sharding": "full", "tp": t}))
    return out


def _current_key(f: Any) -> str | None:
    tp = f.strategy_options.get("tp")
    if f.strategy == "tp":
        return "tp"
    if f.strategy == "fsdp" and isinstance(tp, int) and tp > 1:
        return f"fsdp-{f.strategy_options.get('sharding', 'full')}+tp{tp}"
    return current_strategy(f)


def switch_rows(view: RunView) -> list[SwitchRow]:
    """One row per switch target this run can take (Hello.switch_unavailable leaves out the others;
    the current strategy stays, as the picker's reference) with its predicted state per rank and
    bytes sent per step; the mesh targets (tensor parallelism, 2D) without: what they hold and send
    depends on the model's layers, which the UI does not know (the agent's Hello predicts them once
    it runs so)."""
    f = view.facts
    n = f.world_size or len(view.ranks)
    current = _current_key(f)
    mesh = [SwitchRow(t, sharded_words("tp") if t.key == "tp" else "matrices, " + sharded_words("fsdp-full"),
                      None, None, None, None, t.key == current) for t in mesh_targets(n)]
    return [r for r in (*_data_parallel_rows(f, n, current), *mesh)
            if r.current or r.target.args["strategy"] not in f.switch_unavailable]


def switch_unavailable_text(unavailable: dict[str, str]) -> str:
    """`zero1, zero2, zero3: DeepSpeed is not installed`: the targets left out, grouped by why."""
    by_why: dict[str, list[str]] = {}
    for name, why in unavailable.items():
        by_why.setdefault(why, []).append(name)
    return "; ".join(f"{', '.join(names)}: {why}" for why, names in by_why.items())


def _data_parallel_rows(f: Any, n: int, current: str | None) -> list[SwitchRow]:
    rows = []
    for t in SWITCH_TARGETS:
        sharded = sharded_words(t.key)
        params = grads = optim = sent = None
        if f.param_count > 0 and n >= 1:
            cost = implementation_cost(t.key, n, f.param_count, f.dtype or "fp32", gloo=f.backend == "gloo")
            params, grads, optim = cost.memory.params_bytes, cost.memory.grads_bytes, cost.memory.optimizer_bytes
            sent = cost.comm.sent_bytes
        rows.append(SwitchRow(t, sharded, params, grads, optim, sent, t.key == current))
    return rows


def parse_micro_batches(text: str) -> tuple[int | None, str]:
    """(M, "") for a whole number >= 1, else (None, why): what the `m` prompt accepts."""
    value = text.strip()
    if not value:
        return None, "type a whole number ≥ 1"
    try:
        m = int(value, 10)
    except ValueError:
        return None, f"{value!r} is not a whole number: type one ≥ 1"
    if m < 1:
        return None, f"{m} is less than 1: a step needs at least one micro-batch"
    return m, ""
