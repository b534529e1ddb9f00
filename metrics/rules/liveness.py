"""When a rank counts as stuck, stalled or dead: every threshold and rule, once, with its reason.

Read by the agent (the stall watch on every rank, rank 0's hang watch), the UI (the health line,
the view model's dead ranks, the Hang view) and the exporter. Pure and torch-free.

Three questions, three rules:

- **Stalled**: a step (loop iteration) running longer than `stall_after_s` of the rank's recent
  steps. A rank's own watch measures it exactly; the UI, which sees steps only as they arrive,
  allows `DELIVERY_S` more (`ui_stall_after_s`), so that the rank's own report comes first.
- **Starting**: before `STEPS_KNOWN` steps a rank has no usual time (compilation, first
  allocations), so it is called stalled only after `WARMUP_S`. But a rank stuck in its first
  steps holds its peers up in the first collectives, and they cannot wait a minute to say so:
  in start-up every rank reports where it is (`starting` reports) once an iteration has run
  `STARTUP_REPORT_S`, and a peer waiting in collective #k names the rank whose count is lower,
  with its phase, within seconds. A `starting` report alone is no verdict.
- **Dead**: a rank that sent nothing, not even its heartbeat (every `HEARTBEAT_S`), for
  `SILENT_AFTER_S`, while others were heard — unless its process is seen alive from outside (a
  look at /proc on its host): then it is **stuck**, said with how (`stuck_words`). Its heartbeat
  is a Python thread, so a live process that cannot send it has no thread that runs Python: one
  holds the GIL in native code (a C extension, a driver call, a deadlock in a library), or the
  process is stopped.

The wait shown for a hang is one number (`waited_s`): the longest a waiting rank had waited in
the collective (or at the step boundary) as of its latest report.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

STALL_FACTOR = 2.0
"""A step is stalled past this many times the median of the rank's recent steps…"""
STALL_FLOOR_S = 4.0
"""…plus this: a fast loop's noise on a busy node (a GC pause, a slow batch) is not a stall."""
STEPS_KNOWN = 3
"""Finished steps needed before a rank's median step time is believed."""
MEDIAN_OF = 50
"""Recent steps whose median is the rank's usual step time."""
WARMUP_S = 60.0
"""Before STEPS_KNOWN steps, a step is stalled only past this: a first pass compiles and allocates."""
COMMAND_S = 120.0
"""Added for a step that applies a command or writes a checkpoint: legitimately long."""
STARTUP_REPORT_S = 5.0
"""In start-up, a rank says where it is once an iteration has run this long: a peer stuck in a
collective it has not entered is named within seconds, not after WARMUP_S. Above the usual skew
of ranks meeting at their first collective."""
DELIVERY_S = 2.0
"""The UI's allowance on top of the rank's own limit: steps arrive a step late (device times are
read lazily) and through the relays."""
HEARTBEAT_S = 1.0
"""Every rank's telemetry thread sends at least this often, training or not."""
SILENT_AFTER_S = 4.0
"""Silent this long (four heartbeats missed) while others are heard: gone — killed, or the whole
process hung with the GIL held. Used by the UI and by rank 0's hang watch alike."""


def stuck_words(state: str, stack: str = "", cpu_pct: float | None = None) -> str:
    """A silent rank whose process is alive (`state`: /proc's letter), in words: `stuck (alive, GIL
    held, CPU 0%) in sleep ← … ← forward (model.py:57)`; `stack` as protocol/native_stack.short_stack;
    `cpu_pct`: its CPU use since the last look (a spin at 100 %, a wait or a deadlock at 0 %)."""
    how = {"T": "stopped by a signal", "t": "stopped by a debugger",
           "D": "alive, in uninterruptible I/O"}.get(state, "alive, GIL held")
    cpu = f", CPU {cpu_pct:.0f}%" if cpu_pct is not None and state not in ("T", "t") else ""
    return f"stuck ({how}{cpu})" + (f" in {stack}" if stack else "")


def median_step_s(recent_step_s: Iterable[float]) -> float | None:
    """The median of the finite recent step times; None with fewer than STEPS_KNOWN."""
    finite = [s for s in recent_step_s if math.isfinite(s) and s >= 0]
    return statistics.median(finite[-MEDIAN_OF:]) if len(finite) >= STEPS_KNOWN else None


def stall_after_s(
    median_s: float | None,
    *,
    generous: bool = False,
    factor: float = STALL_FACTOR,
    floor_s: float = STALL_FLOOR_S,
    warmup_s: float = WARMUP_S,
    command_s: float = COMMAND_S,
) -> float:
    """Seconds a step may run before it is stalled: factor × median + floor once the median is
    known (`median_step_s`), max(warmup, floor) before; `command_s` more for a command's step."""
    limit = max(warmup_s, floor_s) if median_s is None else factor * median_s + floor_s
    return limit + command_s if generous else limit


def report_after_s(
    median_s: float | None, stall_limit_s: float, startup_s: float = STARTUP_REPORT_S, generous: bool = False
) -> float:
    """Seconds after which a running step's whereabouts are reported: at its stall limit, or in
    start-up (no median yet) already after `startup_s` — but not for a command's or checkpoint's
    step, whose ranks legitimately wait for each other's writes."""
    return min(startup_s, stall_limit_s) if median_s is None and not generous else stall_limit_s


def ui_stall_after_s(median_s: float | None, past_start_up: bool = False) -> float:
    """The UI's limit on the time since a rank's last step arrived: the rank's own plus DELIVERY_S.
    `past_start_up` without a median: the rank finished steps this UI did not see (it attached
    late), so its own limit is past warm-up but unknown here: the floor's."""
    if median_s is None and past_start_up:
        median_s = 0.0
    return stall_after_s(median_s) + DELIVERY_S


def is_silent(silent_s: float) -> bool:
    return silent_s > SILENT_AFTER_S


def report_wait_s(report: Any, group: str = "", seq: int = 0) -> float:
    """How long a report's rank had waited when it reported: in collective #`seq` of `group` (its
    oldest in flight when not given), else at the step boundary (the iteration's running time)."""
    ops = [op for op in report.in_flight if op.kind != "p2p"]
    if group:
        ops = [op for op in ops if op.group == group and (not seq or op.seq == seq)]
    return max((op.age_s for op in ops), default=report.running_s)


def waited_s(reports: Mapping[int, Any], ranks: Iterable[int], group: str = "", seq: int = 0) -> float:
    """The wait of a hang, the one number the Hang view, banner and health line show: the longest
    any of `ranks` had waited when it last reported (`report_wait_s`)."""
    return max((report_wait_s(reports[r], group, seq) for r in ranks if r in reports), default=0.0)
