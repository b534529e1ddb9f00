"""The run's facts: rank 0's Hello (the first Hello heard until rank 0's comes), held whole and
read through (`facts.world_size`, `facts.model`, any Hello field), plus the two readings made from
it (the strategy's name and what it shards)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from ringtop.metrics.strategy_names import SHARDED_STATE, canonical_strategy, sharded_label, strategy_label
from ringtop.protocol import Hello

KEPT_WHEN_ABSENT = ("run_id", "world_size", "dtype", "model", "param_count", "backend", "device", "torch_version",
                    "ringtop_version", "batch_size", "seq_len", "steps", "start_step", "device_mem_total_bytes",
                    "accelerator")
"""Fields a later Hello that lacks them (empty, 0) leaves as they were; the others (the optimizer's
bytes, grad clip, FLOPs and peak and their sources, the switches it cannot take, the sharding)
are the latest Hello's, as it says them."""


def _no_hello() -> Hello:
    return Hello(rank=0, seq=0, ts=0.0, run_id="", world_size=0)


@dataclass
class RunFacts:
    hello: Hello = field(default_factory=_no_hello)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.hello, name)

    def take(self, msg: Hello) -> Hello:
        """The facts as of `msg` (an authoritative Hello); returns the Hello they held before. The
        strategy changes only with a Hello that names one."""
        old = self.hello
        kept = {k: getattr(old, k) for k in KEPT_WHEN_ABSENT if not getattr(msg, k)}
        if not msg.strategy:
            kept.update(strategy=old.strategy, strategy_options=old.strategy_options)
        self.hello = msgspec.structs.replace(msg, **kept) if kept else msg
        return old

    @property
    def link_peaks_by_group(self) -> dict[str, float]:
        """Hello.link_peak_gbps_by_group: the link of each mesh dimension (--link-tp ...)."""
        return self.hello.link_peak_gbps_by_group

    @property
    def strategy_name(self) -> str:
        """The strategy as the header shows it: `fsdp(full)` for FSDP with its sharding option."""
        return strategy_label(self.strategy, self.strategy_options)

    @property
    def sharding_text(self) -> str:
        """What is sharded, in the strategy's words (metrics.strategy_names.SHARDED_STATE, as the
        picker says it): `grads+optim sharded`, or `replicated`; Hello.sharding for an unknown one."""
        sh = self.sharding
        if self.strategy == "pp":
            replicas = self.strategy_options.get("replicas")
            return "layers split into stages" + (f", {replicas} replicas" if isinstance(replicas, int)
                                                 and replicas > 1 else "")
        try:
            sharding = self.strategy_options.get("sharding")
            parts = SHARDED_STATE[canonical_strategy(self.strategy, str(sharding) if sharding else None)]
        except (ValueError, KeyError, AttributeError):  # a strategy ringtop does not know: the Hello's flags
            parts = sharded_label(sh, nothing="")
        return parts + " sharded" if parts else "replicated"
