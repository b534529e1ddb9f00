"""The Memory tab's figures: measured state per rank beside the cost model, and which strategy
would fit the device. Pure Python over a `RunView` (no Textual); the torch-free cost model
(`ringtop.metrics.costs.cost_model`) supplies the predictions.

Predicted state per rank comes from the rank's Hello (`Hello.prediction`, the agent's own call to
the cost model). When a rank sent none, the UI asks the cost model itself with the run's facts
(strategy, world size, parameter count, dtype, optimizer bytes per parameter) and says so.
"""

from __future__ import annotations

import functools
import math
import os
import socket
from dataclasses import dataclass

from ringtop.metrics import fmt
from ringtop.metrics.costs import memory_model
from ringtop.metrics.costs.cost_model import (
    DTYPE_BYTES,
    ModelSpec,
    implementation_cost,
)
from ringtop.metrics.strategy_names import DATA_PARALLEL_STRATEGIES, canonical_strategy, sharded_words
from ringtop.tui.state.facts import RunFacts
from ringtop.tui.state.rank_row import RankRow
from ringtop.tui.state.view_model import RunView


@dataclass(frozen=True, slots=True)
class StatePrediction:
    """Predicted state bytes of one rank, and where the figures came from."""

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    source: str
    """`agent` (Hello.prediction) or `ui` (computed here from the run's facts)."""
    note: str = ""

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


@dataclass(frozen=True, slots=True)
class FitRow:
    strategy: str
    sharded: str
    """What the strategy shards, e.g. `grads+optim`, or `-` (replicated)."""
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    state_bytes: int
    need_bytes: int
    """State plus the allowance for everything else (activations, buffers) measured in this run."""
    fits: bool | None
    """None when the capacity is unknown."""
    capacity_pct: float
    wire_bytes_per_step: int
    """Bytes each rank sends per step (ring algorithms)."""
    current: bool


@dataclass(frozen=True, slots=True)
class FitTable:
    rows: list[FitRow]
    capacity_bytes: int
    """Per rank; 0 = unknown."""
    capacity_text: str
    """Where the capacity comes from, or why it is unknown."""
    allowance_bytes: int
    model: ModelSpec
    ranks: int
    gloo: bool
    current: str | None


def model_spec(facts: RunFacts) -> ModelSpec | None:
    """The cost model's input for this run, or None when the parameter count is unknown."""
    if facts.param_count <= 0:
        return None
    dtype_bytes = DTYPE_BYTES.get(facts.dtype.lower(), 4)
    return ModelSpec(facts.param_count, dtype_bytes, dtype_bytes, max(0, facts.optimizer_bytes_per_param))


def current_strategy(facts: RunFacts) -> str | None:
    """This run's strategy as a cost-model name (`fsdp` + sharding -> `fsdp-full`), None if unknown."""
    if not facts.strategy:
        return None
    try:
        return canonical_strategy(facts.strategy, facts.strategy_options.get("sharding"))
    except (ValueError, AttributeError):
        return None


def world_size(view: RunView) -> int:
    return view.facts.world_size or len(view.ranks)


def predicted_state(view: RunView, row: RankRow) -> StatePrediction | None:
    """The rank's predicted state bytes: its Hello's prediction, else the cost model's for this run."""
    p = row.prediction
    if p is not None:
        return StatePrediction(p.params_bytes, p.grads_bytes, p.optimizer_bytes, "agent", p.note)
    strategy, n = current_strategy(view.facts), world_size(view)
    if view.facts.param_count <= 0 or strategy is None or n < 1:
        return None
    return _ui_prediction(strategy, n, view.facts.param_count, view.facts.dtype or "fp32")


@functools.lru_cache(maxsize=16)
def _ui_prediction(strategy: str, n: int, param_count: int, dtype: str) -> StatePrediction | None:
    """The same for every rank of the run: asked once, not once per rank and repaint; the agent's
    own function (metrics.memory_model.predicted_state)."""
    try:
        got = memory_model.predicted_state(strategy, n, param_count, dtype)
    except (ValueError, KeyError):
        return None
    m = got.memory
    return StatePrediction(m.params_bytes, m.grads_bytes, m.optimizer_bytes, "ui", "; ".join(got.notes))


def host_memory_bytes() -> int:
    """Physical memory of the machine the UI runs on (os.sysconf; 0 when unavailable)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return 0


def capacity_per_rank(view: RunView, ui_host: str | None = None,
                      ui_host_mem_bytes: int | None = None) -> tuple[int, str]:
    """(bytes per rank, how it was found). GPU: the device's capacity from the Hello. CPU: this
    machine's memory shared by the ranks on it, when the ranks run here; else 0 (unknown)."""
    rows = view.rows()
    gpu_caps = [r.device_mem_total_bytes for r in rows if r.device_mem_total_bytes > 0]
    if view.facts.device_mem_total_bytes > 0:
        gpu_caps.append(view.facts.device_mem_total_bytes)
    if gpu_caps:
        cap = min(gpu_caps)
        return cap, f"the device's {fmt.nbytes(cap)} per rank"
    device = view.facts.device or ""
    if device.startswith("cuda"):
        return 0, "capacity unknown (the agent sent no device_mem_total_bytes)"
    ui_host = socket.gethostname() if ui_host is None else ui_host
    hosts = {r.host for r in rows if r.host}
    if not hosts or hosts != {ui_host}:
        where = ", ".join(sorted(hosts)) or "an unknown host"
        return 0, f"capacity unknown (CPU ranks on {where}; this UI runs on {ui_host})"
    total = host_memory_bytes() if ui_host_mem_bytes is None else ui_host_mem_bytes
    if total <= 0:
        return 0, "capacity unknown (cannot read this host's memory)"
    sharing = max(1, len(rows))
    per = total // sharing
    ranks = f"{sharing} rank{'s' if sharing > 1 else ''}"
    return per, f"host RAM {fmt.nbytes(total)} / {ranks} = {fmt.nbytes(per)} per rank"


def fit_table(view: RunView, ui_host: str | None = None, ui_host_mem_bytes: int | None = None) -> FitTable | None:
    """Every data-parallel strategy's state per rank for this run's model and world size, and whether
    it plus the non-state memory measured now fits the capacity. None without a parameter count."""
    spec = model_spec(view.facts)
    n = world_size(view)
    if spec is None or n < 1:
        return None
    capacity, capacity_text = capacity_per_rank(view, ui_host, ui_host_mem_bytes)
    allowance = max((r.mem_peak_other_bytes for r in view.rows()), default=0)
    gloo = view.facts.backend == "gloo"
    current = current_strategy(view.facts)
    rows = []
    for strategy in DATA_PARALLEL_STRATEGIES:
        cost = implementation_cost(strategy, n, spec.params, view.facts.dtype or "fp32", gloo=gloo)
        mem = cost.memory
        need = mem.total_bytes + allowance
        sharded = sharded_words(cost.strategy)
        rows.append(FitRow(
            strategy=cost.strategy, sharded=sharded, params_bytes=mem.params_bytes, grads_bytes=mem.grads_bytes,
            optimizer_bytes=mem.optimizer_bytes, state_bytes=mem.total_bytes, need_bytes=need,
            fits=need <= capacity if capacity > 0 else None,
            capacity_pct=100.0 * need / capacity if capacity > 0 else math.nan,
            wire_bytes_per_step=cost.comm.sent_bytes, current=cost.strategy == current,
        ))
    return FitTable(rows, capacity, capacity_text, allowance, spec, n, gloo, current)
