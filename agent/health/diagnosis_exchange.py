"""What the ranks tell rank 0 for the diagnosis rules, in O(1) bytes per rank, and the verdicts.

Every `every` steps each rank takes the medians of its last window. Rather than gathering every
rank's numbers on rank 0 (N x 7 floats arriving there, N x 7 x N moved by an all-gather), the
ranks send what the rules need and no more (metrics/rules/diagnosis.py, `RunSummary`):

- one reduce to rank 0 of fixed-bucket histograms (metrics/sketch.py) of compute, blocked, busy
  time, bytes and the blocked share, plus counts of the ranks that flagged themselves: a vector of
  the same size whatever the world size;
- `TOP_K` rounds of two all-reduces of a few numbers each, which pick the slowest ranks by compute
  (the only possible stragglers) and the worst ranks that flagged an input stall or memory
  pressure (each rank decides that on its own window), with their windows.

Rank 0 runs the rule set on each window and debounces what it finds (metrics/rules/diagnosis.py:
raised after `RAISE_AFTER` consecutive windows, cleared after `CLEAR_AFTER`): a `verdict` event,
naming the rank(s) and the step, when one is raised, `verdict_cleared` when it goes away.
"""

from __future__ import annotations

import collections
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ringtop.metrics.rules.debounce import Debounce
from ringtop.metrics.rules.diagnosis import (
    CLEAR_AFTER,
    RAISE_AFTER,
    WINDOW_STEPS,
    RankWindow,
    RunContext,
    RunSummary,
    Verdict,
    diagnose,
    diagnose_summary,
    input_score,
    input_stalled,
    memory_score,
    memory_short,
)
from ringtop.metrics.sketch import Buckets, median

FIELDS = ("step_ms", "data_ms", "exposed_comm_ms", "comm_busy_ms", "comm_bytes", "cuda_reserved_bytes",
          "cuda_alloc_retries")
TOP_K = 2
"""Stragglers, input-stalled and memory-short ranks named per round, the worst first (the rest are
counted: "and N more ranks alike")."""
MS = Buckets(0.01, 1e6, 380)
"""0.01 ms to 1000 s, ratio 1.05: a median within 2.5 %."""
BYTES = Buckets(100.0, 1e13, 522)
SHARE = Buckets(0.0, 1.0, 202, log=False)
"""Shares to 0.005."""
SKETCHED = ((MS, "compute_ms"), (MS, "exposed_comm_ms"), (MS, "comm_busy_ms"), (BYTES, "comm_bytes"), (SHARE, "share"))
COUNTS = 3
"""Ranks with a window, ranks input-stalled, ranks short of memory."""
SKETCH_LENGTH = COUNTS + sum(b.count for b, _ in SKETCHED)


def _value(w: RankWindow, name: str) -> float:
    if name == "share":
        return w.exposed_comm_ms / w.step_ms if w.step_ms > 0 else math.nan
    return getattr(w, name)


def local_sketch(w: RankWindow | None, run: RunContext) -> torch.Tensor:
    """This rank's contribution to the summed histograms (all zeros without a window)."""
    out = torch.zeros(SKETCH_LENGTH, dtype=torch.float32)  # counts: exact to 2^24 ranks
    if w is None:
        return out
    out[0], out[1], out[2] = 1.0, float(input_stalled(w)), float(memory_short(w, run))
    at = COUNTS
    for buckets, name in SKETCHED:
        value = _value(w, name)
        if not math.isnan(value):
            out[at + buckets.index(value)] += 1
        at += buckets.count
    return out


def summary_of(sketch: list[float], picked: dict[str, list[RankWindow]]) -> RunSummary:
    """Rank 0's RunSummary from the summed sketch and the picked ranks' windows."""
    counts, at, hist = sketch[:COUNTS], COUNTS, {}
    for buckets, name in SKETCHED:
        hist[name] = (buckets, sketch[at:at + buckets.count])
        at += buckets.count

    def median_of(name: str) -> float:
        return median(*hist[name])

    def without(name: str) -> Callable[[float], float]:
        return lambda value: median(*hist[name], without=value)
    return RunSummary(
        ranks=int(counts[0]), compute_median_without=without("compute_ms"),
        exposed_comm_median_without=without("exposed_comm_ms"),
        share_median=median_of("share"), exposed_comm_median=median_of("exposed_comm_ms"),
        busy_median=median_of("comm_busy_ms"),
        bytes_median=median_of("comm_bytes"), slowest=tuple(picked["compute"]),
        input_flagged=tuple(picked["input"]), input_flagged_count=int(counts[1]),
        memory_flagged=tuple(picked["memory"]), memory_flagged_count=int(counts[2]))


RANK_BITS = 21
"""A score and the rank holding it travel as one float64: floor(score x 1e3) x 2^21 + rank, exact
below 2^53 (scores to 4e6 ms), so one max names both."""


def _key(score: float, rank: int) -> float:
    if score == -math.inf or not math.isfinite(score):
        return -1.0
    return float(math.floor(max(score, 0.0) * 1e3) * (1 << RANK_BITS) + rank)


def pick_worst(w: RankWindow | None, rank: int, world_size: int, run: RunContext, group: dist.ProcessGroup,
               k: int = TOP_K) -> dict[str, list[RankWindow]]:
    """The `k` ranks with the largest compute, and the `k` worst that flagged each local rule, with
    their windows: per round one max of (score, rank) keys and one sum of the winners' windows, a
    few numbers each whatever the world size."""
    scores = [w.compute_ms, input_score(w) if input_stalled(w) else -math.inf,
              memory_score(w, run) if memory_short(w, run) else -math.inf] if w is not None else [-math.inf] * 3
    names = ("compute", "input", "memory")
    picked: dict[str, list[RankWindow]] = {n: [] for n in names}
    for _ in range(k):
        keys = torch.tensor([_key(score, rank) for score in scores], dtype=torch.float64)
        dist.all_reduce(keys, op=dist.ReduceOp.MAX, group=group)
        holders = [int(key) % (1 << RANK_BITS) if key >= 0 else world_size for key in keys.tolist()]
        records = torch.zeros(3, len(FIELDS), dtype=torch.float64)
        for i in range(3):
            if holders[i] == rank and w is not None:
                records[i] = torch.tensor([getattr(w, f) for f in FIELDS], dtype=torch.float64)
                scores[i] = -math.inf  # picked: not again
        if all(h >= world_size for h in holders):
            break  # nobody is left in the running (the same on every rank: it follows the reduction)
        dist.all_reduce(records, op=dist.ReduceOp.SUM, group=group)
        for i, name in enumerate(names):
            if holders[i] < world_size:
                picked[name].append(RankWindow(holders[i], **dict(zip(FIELDS, records[i].tolist()))))
    return picked


@dataclass
class Raised:
    """A verdict in force (or once in force): the latest window's reading, and its steps."""

    verdict: Verdict
    since_step: int
    """The first step of the first of the `RAISE_AFTER` windows that found it."""
    cleared_step: int = -1
    """-1: still in force."""

    def text(self) -> str:
        v = self.verdict
        until = f"steps {self.since_step:,}–{self.cleared_step:,}" if self.cleared_step >= 0 else \
            f"since step {self.since_step:,}"
        return f"{v.text} ({until})"

    def data(self) -> dict:
        v = self.verdict
        return {"rule": v.rule, "rank": v.rank, "ranks": list(v.ranks), "step": self.since_step,
                "cleared_step": self.cleared_step, "text": self.text(), "evidence": v.evidence, "advice": v.advice}


class Diagnostician:
    def __init__(self, rank: int, world_size: int, group: dist.ProcessGroup | None, run: RunContext,
                 emit_event: Callable[[str, str, str, dict], None], window: int = WINDOW_STEPS,
                 every: int = WINDOW_STEPS):
        self.rank, self.world_size, self.group, self.run = rank, world_size, group, run
        self.emit_event = emit_event
        self.every = every
        self.history: collections.deque[tuple[float, ...]] = collections.deque(maxlen=window)
        self.debounce: Debounce[tuple[str, int | None]] = Debounce(RAISE_AFTER, CLEAR_AFTER)
        self.current: dict[tuple[str, int | None], Raised] = {}
        """In force now."""
        self.seen: list[Raised] = []
        """Every verdict raised during the run, in the order raised."""
        self.step = 0
        """The step of the newest record."""
        self._first_found: dict[tuple[str, int | None], int] = {}
        self._fresh = 0
        """Records since the last window that counted."""
        self.bytes_sent = 0
        """Payload this rank handed to the exchange's collectives so far (for the benchmark)."""

    def record(self, step_ms: float, data_ms: float, exposed_comm_ms: float, comm_busy_ms: float, comm_bytes: float,
               cuda_reserved_bytes: float, cuda_alloc_retries: float, step: int | None = None) -> None:
        self.history.append((step_ms, data_ms, exposed_comm_ms, comm_busy_ms, comm_bytes, cuda_reserved_bytes,
                             cuda_alloc_retries))
        self.step = self.step + 1 if step is None else step
        self._fresh += 1

    def due(self, step: int) -> bool:
        return step > 0 and step % self.every == 0

    def window(self) -> RankWindow | None:
        if not self.history:
            return None
        return RankWindow(self.rank, *[statistics.median(column) for column in zip(*self.history)])

    def run_rules(self) -> list[Verdict]:
        """Collective: every rank calls it on the same step. What this window found (rank 0)."""
        mine = self.window()
        if self.group is None:
            verdicts = diagnose([mine], self.run) if mine is not None else []
        else:
            sketch = local_sketch(mine, self.run)
            dist.reduce(sketch, dst=0, group=self.group)
            picked = pick_worst(mine, self.rank, self.world_size, self.run, self.group)
            self.bytes_sent += sketch.numel() * sketch.element_size() + TOP_K * (3 + 3 * len(FIELDS)) * 8
            if self.rank != 0:
                return []
            verdicts = diagnose_summary(summary_of(sketch.tolist(), picked), self.run)
        if self.rank != 0 or mine is None:
            return []
        counts = self._fresh >= max(1, self.every // 2)  # a window of mostly new steps (not the end's restatement)
        if counts:
            self._fresh = 0
        self.judge(verdicts, counts)
        return verdicts

    def judge(self, verdicts: list[Verdict], counts: bool = True) -> None:
        """Rank 0's reading of one window's verdicts: news as `verdict` / `verdict_cleared`,
        debounced (`counts`: a window of new steps; else the evidence is refreshed only); the whole
        active set restated as `verdicts_active` every round, so a UI that attaches late learns
        what is in force."""
        found = {(v.rule, v.rank): v for v in verdicts}
        for key, v in found.items():
            if key in self.current:
                self.current[key].verdict = v  # the newest evidence of a verdict in force
        if counts:
            for key in list(self._first_found):
                if key not in found:
                    del self._first_found[key]
            for key in found:
                self._first_found.setdefault(key, self.step - len(self.history) + 1)
            raised, cleared = self.debounce.update(found)
            if any(rule == "straggler" for rule, _ in raised):  # one straggler at a time: the new worst
                for key in [k for k in self.current if k[0] == "straggler" and k not in raised]:
                    self.debounce.drop(key)
                    cleared.append(key)
            for key in cleared:
                gone = self.current.pop(key, None)
                if gone is not None:
                    gone.cleared_step = self.step
                    self.emit_event("info", "verdict_cleared", f"cleared at step {self.step:,}: {gone.text()}",
                                    gone.data())
            for key in raised:
                entry = Raised(found[key], self._first_found.get(key, self.step))
                self.current[key] = entry
                self.seen.append(entry)
                self.emit_event("warn", "verdict", entry.text(), entry.data())
        if self.current:
            self.emit_event("warn", "verdicts_active", f"{len(self.current)} active verdict(s)",
                            {"verdicts": [r.data() for r in self.current.values()]})

    def summary(self) -> list[Raised]:
        """Every verdict raised during the run, with its steps, in the order raised."""
        return list(self.seen)
