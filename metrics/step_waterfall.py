"""Where a step went: its time as parts that add up to it, from the ideal (the step's FLOPs at the
device's peak, where the peak is known) down to what is left over. Pure and torch-free: one
definition for `summary`, `report`, `diff` and the UI.

A rank's step clock splits the step into consecutive phases (data, forward, backward, optimizer;
agent/instruments/step_clock.py) and the comm tracer measures, inside them, the time the training
thread waited on collectives (exposed communication) and, in a pipeline, the stage's bubble (the
step's idle time beyond its data wait: metrics/timing.py). The parts, in this order:

- ideal: step time × MFU (metrics/costs/flops.py's `mfu`): what the model's FLOPs take at peak.
- compute below peak (or compute, when the peak is not known): forward + backward less the
  waits inside them, less the ideal.
- exposed communication, pipeline bubble, data wait: the waits.
- optimizer: the optimizer step, less any wait inside it (ZeRO and FSDP gather there).
- rest: the step's time after its last phase mark (logging, hooks, the host's own work).

Every part is >= 0 and they add up to the step time; MFU's gap to 100 % is the sum of the parts
other than the ideal, each part's share of it `part / step`. A wait larger than the phases it can
sit in (a clock that disagrees with the tracer) is cut to fit, so the sum still holds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

IDEAL = "ideal"
COMPUTE_BELOW_PEAK = "compute below peak"
COMPUTE = "compute"
EXPOSED_COMM = "exposed communication"
BUBBLE = "pipeline bubble"
DATA = "data wait"
OPTIMIZER = "optimizer"
REST = "rest"
PARTS = (IDEAL, COMPUTE_BELOW_PEAK, COMPUTE, EXPOSED_COMM, BUBBLE, DATA, OPTIMIZER, REST)
"""Every part's name, in the order a waterfall draws them."""


def _ms(x: float | None) -> float:
    return x if isinstance(x, (int, float)) and math.isfinite(x) and x > 0 else 0.0


def step_parts(step_ms: float, data_ms: float, forward_ms: float, backward_ms: float, optimizer_ms: float,
               exposed_comm_ms: float, idle_ms: float = 0.0, pipeline: bool = False,
               mfu_ratio: float | None = None) -> dict[str, float]:
    """One step's parts (ms, in PARTS order, zero parts kept), adding up to `step_ms`.

    `idle_ms` is the step's idle time as the agent sent it (Step.idle_ms): in a pipeline (`pipeline`)
    it is data wait + bubble. `mfu_ratio` (0..1) is the step's MFU where the peak is known."""
    row = step_parts_row(step_ms, data_ms, forward_ms, backward_ms, optimizer_ms, exposed_comm_ms, idle_ms,
                         pipeline, mfu_ratio)
    parts = {IDEAL: row[0], COMPUTE_BELOW_PEAK: row[1]} if _known(mfu_ratio) else {COMPUTE: row[2]}
    parts.update(zip(PARTS[3:], row[3:]))
    return parts


def _known(mfu_ratio: float | None) -> bool:
    return mfu_ratio is not None and math.isfinite(mfu_ratio) and mfu_ratio > 0


def step_parts_row(step_ms: float, data_ms: float, forward_ms: float, backward_ms: float, optimizer_ms: float,
                   exposed_comm_ms: float, idle_ms: float = 0.0, pipeline: bool = False,
                   mfu_ratio: float | None = None) -> tuple[float, ...]:
    """`step_parts` as a tuple in PARTS order (0 for a part it lacks), straight-line: the live UI
    splits every rank's steps (a few µs each at 1024 ranks counts)."""
    step = _ms(step_ms)
    data_raw = _ms(data_ms)
    data = min(data_raw, step)
    compute = min(_ms(forward_ms) + _ms(backward_ms), step - data)
    optimizer = min(_ms(optimizer_ms), step - data - compute)
    rest = step - data - compute - optimizer
    waited = []
    for wait in (_ms(idle_ms - data_raw) if pipeline else 0.0, _ms(exposed_comm_ms)):  # bubble first
        t = min(wait, compute)  # forward/backward first, then the optimizer, then past the phase marks
        compute -= t
        taken = t
        t = min(wait - taken, optimizer)
        optimizer -= t
        taken += t
        t = min(wait - taken, rest)
        rest -= t
        waited.append(taken + t)
    bubble, exposed = waited
    if _known(mfu_ratio):
        ideal = min(mfu_ratio * step, compute)
        return (ideal, compute - ideal, 0.0, exposed, bubble, data, optimizer, max(0.0, rest))
    return (0.0, 0.0, compute, exposed, bubble, data, optimizer, max(0.0, rest))


def mean_parts(steps: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """The parts averaged over steps (a part a step lacks counts 0), in PARTS order."""
    total: dict[str, float] = {}
    n = 0
    for parts in steps:
        n += 1
        for name, ms in parts.items():
            total[name] = total.get(name, 0.0) + ms
    return {name: total[name] / n for name in PARTS if name in total} if n else {}


def shares(parts: Mapping[str, float]) -> dict[str, float]:
    """Each part's share of the step (0..1); the shares of the parts other than the ideal are MFU's
    gap to 100 %, attributed."""
    step = sum(parts.values())
    return {name: ms / step for name, ms in parts.items()} if step > 0 else {}


def line(parts: Mapping[str, float], digits: int = 0) -> str:
    """`compute 62% · exposed communication 21% · …` (parts under 0.5 % left out)."""
    return " · ".join(f"{name} {100 * share:.{digits}f}%" for name, share in shares(parts).items()
                      if share >= 0.005)
