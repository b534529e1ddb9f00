"""Strategy names, once: what the agent takes (`--strategy`, the `switch` command), the cost
model's canonical names (one per FSDP sharding) and the labels the screens print.

The wire schema (`protocol.commands.SwitchArgs`) spells the same lists out as literals, on purpose:
a wire contract does not change when a list here does; tests/unit/test_metrics.py holds them equal.
"""

from __future__ import annotations

from typing import Any, Protocol

STRATEGY_CHOICES: tuple[str, ...] = ("ddp", "zero1", "zero2", "zero3", "fsdp", "pp", "tp")
"""What `--strategy` and the `switch` command take."""
ZERO_STRATEGIES: tuple[str, ...] = ("zero1", "zero2", "zero3")
"""The DeepSpeed ZeRO stages (they take a DeepSpeed config)."""
FSDP_SHARDINGS: tuple[str, ...] = ("full", "grad-op", "no-shard")
PP_SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b")

_FSDP = "fsdp-"


def fsdp_name(sharding: str) -> str:
    """The canonical name of FSDP with `sharding`: `full` -> `fsdp-full`."""
    return _FSDP + sharding


STRATEGIES: tuple[str, ...] = tuple(
    name for s in STRATEGY_CHOICES for name in ([fsdp_name(x) for x in FSDP_SHARDINGS] if s == "fsdp" else [s]))
"""Canonical (cost-model) names: `fsdp` + a sharding is one name per sharding (ddp, zero1-3,
fsdp-full, fsdp-grad-op, fsdp-no-shard, pp, tp)."""
MODEL_PARALLEL_STRATEGIES: tuple[str, ...] = ("pp", "tp")
"""Strategies that split the model itself (into stages, or each layer's matrices): a rank holds a
part of it, priced from the model's shape, not its parameter count alone."""
DATA_PARALLEL_STRATEGIES: tuple[str, ...] = tuple(s for s in STRATEGIES if s not in MODEL_PARALLEL_STRATEGIES)
"""What the switch picker offers and the Memory tab's fit table compares: the same model whole on
every rank, so one parameter count prices them all."""

LESS_SHARDED: dict[str, str] = {"zero3": "zero2", fsdp_name("full"): fsdp_name("grad-op")}
"""The strategy that keeps parameters gathered from forward to backward, dropping the backward
all-gather: the diagnosis' advice to a communication-bound fully sharded run."""


def canonical_strategy(strategy: str, fsdp_sharding: str | None = None) -> str:
    """One of STRATEGIES, from names like "zero2", "fsdp" + "grad-op", "fsdp(full)" or "FULL_SHARD"."""
    s = strategy.strip().lower().replace("_", "-")
    aliases = {"zero0": "ddp", "zero-0": "ddp", "zero-1": "zero1", "zero-2": "zero2", "zero-3": "zero3",
               "full-shard": fsdp_name("full"), "shard-grad-op": fsdp_name("grad-op"),
               "no-shard": fsdp_name("no-shard"), "pipeline": "pp"}
    s = aliases.get(s, s)
    if s.startswith("fsdp(") and s.endswith(")"):
        s, fsdp_sharding = "fsdp", s[5:-1]
    if s == "fsdp":
        sharding = (fsdp_sharding or "full").strip().lower().replace("_", "-")
        sharding = {"full-shard": "full", "shard-grad-op": "grad-op"}.get(sharding, sharding)
        if sharding not in FSDP_SHARDINGS:
            raise ValueError(f"unknown FSDP sharding {fsdp_sharding!r}: use one of {', '.join(FSDP_SHARDINGS)}")
        s = fsdp_name(sharding)
    if s not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES)} (or fsdp with a sharding)")
    return s


def switch_args(canonical: str) -> dict[str, str]:
    """The `switch` command's arguments for a canonical name: `fsdp-full` ->
    {"strategy": "fsdp", "fsdp_sharding": "full"}."""
    if canonical.startswith(_FSDP):
        return {"strategy": "fsdp", "fsdp_sharding": canonical[len(_FSDP):]}
    return {"strategy": canonical}


def picker_label(canonical: str) -> str:
    """A canonical name in words, for a list to pick from: `fsdp-grad-op` -> `fsdp grad-op`."""
    return " ".join(switch_args(canonical).values())


def strategy_label(strategy: str, options: dict[str, Any]) -> str:
    """A running strategy with the options that change its behaviour, as the header and the
    agent's switch events show it: `fsdp(full)`, `pp(1f1b, N=2, M=4)`."""
    if strategy == "fsdp":
        parts = [str(options["sharding"])] if options.get("sharding") else []
        if isinstance(options.get("tp"), int) and options["tp"] > 1:
            parts.append(f"tp={options['tp']}")
        return f"fsdp({', '.join(parts)})" if parts else "fsdp"
    if strategy == "pp":
        parts = [str(options["schedule"])] if options.get("schedule") else []
        if isinstance(options.get("stages"), int):
            parts.append(f"N={options['stages']}")
        if isinstance(options.get("micro_batches"), int):
            parts.append(f"M={options['micro_batches']}")
        return f"pp({', '.join(parts)})" if parts else "pp"
    if strategy == "tp":
        parts = [f"N={options['degree']}"] if isinstance(options.get("degree"), int) else []
        if options.get("sequence_parallel") is True:
            parts.append("sequence-parallel")
        return f"tp({', '.join(parts)})" if parts else "tp"
    return strategy


SHARDED_STATE: dict[str, str] = {
    "ddp": "", "zero1": "optim", "zero2": "grads+optim", "zero3": "params+grads+optim",
    fsdp_name("full"): "params+grads+optim", fsdp_name("grad-op"): "grads+optim", fsdp_name("no-shard"): "",
    "pp": "", "tp": "matrices",
}
"""What each strategy shards across its data-parallel ranks, in the words every screen uses (the
header, the switch picker, the Memory tab's fit table, `ringtop plan`): the strategy's own sharding,
not what a rank happens to hold between steps (FSDP grad-op reshards its parameters after
backward, yet gathers them whole from forward to backward: it shards grads+optim). "" = nothing
(replicated); a pipeline splits layers into stages instead, tensor parallelism each layer's matrices."""


def sharded_words(strategy: str, nothing: str = "-") -> str:
    """SHARDED_STATE for a strategy name (any spelling canonical_strategy takes), `nothing` when it
    shards nothing."""
    return SHARDED_STATE[canonical_strategy(strategy)] or nothing


class _Sharding(Protocol):
    params: bool
    grads: bool
    optimizer: bool


def sharded_label(sharding: _Sharding, nothing: str = "-") -> str:
    """What is sharded, for a table cell: `params+grads+optim`, or `nothing` when nothing is.
    Takes the cost model's `Sharding` or the one a Hello carries (the same three flags)."""
    parts = [name for name, on in (("params", sharding.params), ("grads", sharding.grads),
                                   ("optim", sharding.optimizer)) if on]
    return "+".join(parts) or nothing
