"""The Prometheus series rank 0 exports (`--metrics`), named once: the exporter builds its families
from this table and docs/prometheus.md is checked against it.

By Prometheus' conventions: base units (seconds, bytes, FLOP/s; never ms, MB or TFLOP/s), a
counter (a total that only goes up) ends in `_total`, a 0..1 share in `_ratio`, run facts in one
`_info` series of value 1. Every series carries `run_id` (RUN_LABELS; per rank also `rank` and
`host`), so that two runs scraped by one Prometheus do not mix and `ringtop_run_info` joins on it."""

from __future__ import annotations

from typing import Literal, NamedTuple

from ringtop.metrics.run_lifecycle import STATES

RANK_LABELS = ("run_id", "rank", "host")
RUN_LABELS = ("run_id",)


class Series(NamedTuple):
    kind: Literal["gauge", "counter"]
    doc: str
    per_rank: bool = True
    extra_labels: tuple[str, ...] = ()


SERIES: dict[str, Series] = {
    "ringtop_up": Series("gauge", "1 from a rank's Hello until its Bye"),
    "ringtop_step": Series("gauge", "The rank's latest finished optimizer step"),
    "ringtop_step_seconds": Series("gauge", "Wall time of the rank's latest step"),
    "ringtop_tokens_per_second": Series("gauge", "Tokens per second of the rank's latest step"),
    "ringtop_model_flops_per_second": Series(
        "gauge", "Achieved model FLOP/s of the rank's latest step (model FLOPs per token x tokens / step time); "
        "only once its FLOPs are known"),
    "ringtop_mfu_ratio": Series("gauge", "The rank's model FLOP/s over its device's dense peak (0..1); only for "
                                "ranks whose peak is known"),
    "ringtop_last_step_timestamp_seconds": Series("gauge", "Unix time of the rank's latest Step (alert on time() - "
                                                  "this)"),
    **{f"ringtop_memory_{name}_bytes": Series("gauge", f"Bytes of {name.replace('_', ' ')} memory the rank holds, "
                                              "at its latest step")
       for name in ("params", "grads", "optimizer", "rss", "cuda_allocated", "cuda_reserved")},
    "ringtop_comm_bytes_total": Series("counter", "Bytes the rank handed to collectives, by kind",
                                       extra_labels=("kind",)),
    "ringtop_exposed_comm_seconds_total": Series("counter", "Exposed communication (metrics.timing): seconds the "
                                                 "training thread waited on collectives"),
    "ringtop_stalled": Series("gauge", "1 while the rank reports a stalled phase (its step runs far too long); in "
                              "a hang the ranks waiting for the culprit report one too (ringtop_hang_culprit names "
                              "it)"),
    "ringtop_stall_seconds": Series("gauge", "How long the rank's stalled phase has run; 0 when not stalled"),
    "ringtop_hang_culprit": Series("gauge", "1 for a rank rank 0's hang reading names as holding the others up (not "
                                   "entered, dead, out of step), else 0"),
    "ringtop_verdicts": Series("gauge", "Active verdicts of rank 0's diagnosis", per_rank=False),
    "ringtop_run_state": Series("gauge", "1 for the run's lifecycle state (metrics/run_lifecycle.py: "
                                + ", ".join(STATES) + "), 0 for the others", per_rank=False, extra_labels=("state",)),
    "ringtop_run_info": Series("gauge", "The run: its id, strategy and world size (value 1; join on run_id)",
                               per_rank=False, extra_labels=("strategy", "world_size")),
    "ringtop_goodput_ratio": Series("gauge", "Share of the run's wall time in productive steps (0..1)",
                                    per_rank=False),
    "ringtop_goodput_productive_seconds_total": Series("counter", "Seconds of productive steps", per_rank=False),
    "ringtop_goodput_wall_seconds_total": Series("counter", "The run's wall time so far", per_rank=False),
    "ringtop_goodput_lost_seconds_total": Series("counter", "Seconds of the wall lost, by cause", per_rank=False,
                                                 extra_labels=("cause",)),
}


def labels_of(name: str) -> list[str]:
    s = SERIES[name]
    return [*(RANK_LABELS if s.per_rank else RUN_LABELS), *s.extra_labels]


SCALED_UNITS = ("_ms", "_milliseconds", "_mb", "_mib", "_gb", "_gib", "_kb", "tflops", "gflops", "_percent", "_pct")


def convention_problems(name: str, series: Series) -> list[str]:
    """What breaks Prometheus' naming conventions in one series: [] when nothing."""
    problems = []
    if not name.startswith("ringtop_"):
        problems.append("not under the ringtop_ namespace")
    if series.kind == "counter" and not name.endswith("_total"):
        problems.append("a counter's name ends in _total")
    if series.kind != "counter" and name.endswith("_total"):
        problems.append("only a counter's name ends in _total")
    problems += [f"{unit.strip('_')}: a scaled unit, not a base unit" for unit in SCALED_UNITS
                 if unit in name or name.endswith(unit.strip("_"))]
    if name.endswith("_ratio") and series.kind != "gauge":
        problems.append("a ratio is a gauge")
    return problems
