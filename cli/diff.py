"""`ringtop diff RUN_A RUN_B`: what differs between two runs, from their logs, aligned by step.

Every reading is the logs' own number (Step fields as the agent wrote them; compute and idle by
metrics/timing.py; goodput by metrics/goodput.py through `summary`); whether a difference is more
than noise is metrics/run_diff.py's test. One verdict line first, then the config and environment
that differ, then every reading: the per-step means over ranks, each collective (kind and group),
memory, each rank's compute, loss, goodput. `--json` prints the same as one JSON object.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ringtop.cli import summary
from ringtop.cli.report import RunLogs, read_run
from ringtop.metrics import fmt, step_waterfall
from ringtop.metrics import run_diff as rd
from ringtop.metrics.costs.flops import mfu
from ringtop.metrics.timing import compute_ms, finite_or_0, idle_ms
from ringtop.protocol import Hello, Step

WARMUP_STEPS = 2
"""Each run's first steps are left out always (caches, buckets), then any slow ones after them
until the run settles (metrics/run_diff.py's `settled_from`)."""

PHASES = (("step time", "step_ms"), ("data", "data_ms"), ("forward", "forward_ms"), ("backward", "backward_ms"),
          ("optimizer", "optimizer_ms"), ("exposed communication", "exposed_comm_ms"),
          ("communication in flight", "comm_busy_ms"))
CAUSES = ("data", "forward", "backward", "optimizer", "exposed communication")
"""The parts of a step a verdict may name as where its time went."""

CONFIG_FLAGS = {"strategy": "--strategy", "model": "--model", "batch_size": "--batch-size", "seq_len": "--seq-len",
                "steps": "--steps", "lr": "--lr", "seed": "--seed", "dtype": "--dtype", "grad_clip": "--grad-clip",
                "world_size": "--nproc"}
"""Hello fields a user sets, by the flag that sets them."""
OPTION_FLAGS = {("ddp", "bucket_cap_mb"): "--ddp-bucket-cap-mb", ("fsdp", "sharding"): "--fsdp-sharding",
                ("fsdp", "tp"): "--tp", ("tp", "degree"): "--tp", ("tp", "sequence_parallel"): "--tp-sequence-parallel",
                ("pp", "schedule"): "--pp-schedule", ("pp", "micro_batches"): "--micro-batches",
                ("pp", "stages"): "--pp-stages", ("pp", "split"): "--pp-split"}
"""Strategy options (Hello.strategy_options) by the flag that sets them."""
OPTION_DEFAULTS = {("ddp", "bucket_cap_mb"): 25}
"""What a strategy uses when the option is not given (torch's DDP: 25 MB buckets)."""
ENVIRONMENT = ("torch_version", "ringtop_version", "backend", "device", "accelerator", "host")


@dataclass
class RunSteps:
    """One run's steps that every rank finished, after the warm-up."""

    logs: RunLogs
    by_step: dict[int, dict[int, Step]] = field(default_factory=dict)
    """step -> rank -> Step."""
    warmup: int = 0
    """Leading steps left out as warm-up."""

    @property
    def hello(self) -> Hello | None:
        return self.logs.hello

    @property
    def ranks(self) -> list[int]:
        return sorted(self.logs.steps)


def run_steps(log_dir: Path) -> RunSteps:
    logs = read_run(log_dir)
    run = RunSteps(logs)
    ranks = set(logs.steps)
    per: dict[int, dict[int, Step]] = {}
    for rank, steps in logs.steps.items():
        for s in steps:
            per.setdefault(s.step, {})[rank] = s
    first = min(per, default=0)
    full = {n: row for n, row in sorted(per.items()) if set(row) == ranks and n >= first + WARMUP_STEPS}
    slowest = [max(s.step_ms for s in row.values()) for row in full.values()]
    run.warmup = WARMUP_STEPS + (rd.settled_from(slowest) if slowest else 0)
    run.by_step = dict(list(full.items())[run.warmup - WARMUP_STEPS:])
    return run


def _mean(values: list[float]) -> float:
    values = [v for v in values if math.isfinite(v)]
    return statistics.fmean(values) if values else math.nan


def per_step(run: RunSteps, steps: list[int], value) -> list[float]:
    """`value(step)` averaged over ranks, for each step of `steps`."""
    return [_mean([value(s) for s in run.by_step[n].values()]) for n in steps]


def comm_keys(run: RunSteps, steps: list[int]) -> set[tuple[str, str]]:
    return {(c.kind, c.group) for n in steps for s in run.by_step[n].values() for c in s.comm}


def comm_per_step(run: RunSteps, steps: list[int], key: tuple[str, str], attr: str) -> list[float]:
    return per_step(run, steps, lambda s: sum(getattr(c, attr) for c in s.comm if (c.kind, c.group) == key))


def last_memory(run: RunSteps) -> dict[str, float]:
    """Each memory reading's largest value over ranks at the run's last common step."""
    if not run.by_step:
        return {}
    row = run.by_step[max(run.by_step)].values()
    return {"params + grads + optimizer": max(s.mem.params_bytes + s.mem.grads_bytes + s.mem.optimizer_bytes
                                               for s in row),
            "device peak": max(s.mem.cuda_peak_bytes for s in row),
            "host RSS": max(s.mem.rss_bytes for s in row)}


def config_changes(a: Hello | None, b: Hello | None) -> tuple[list[dict], list[dict]]:
    """(config, environment) that differ: each {"what", "flag", "a", "b"}."""
    if a is None or b is None:
        return [], []
    config = []
    for name, flag in CONFIG_FLAGS.items():
        if getattr(a, name) != getattr(b, name):
            config.append({"what": name, "flag": flag, "a": getattr(a, name), "b": getattr(b, name)})
    for key in sorted(set(a.strategy_options) | set(b.strategy_options)):
        va, vb = (_option(h, key, other) for h, other in ((a, b), (b, a)))
        if va != vb:
            owner = (b.strategy if key in b.strategy_options else a.strategy, key)
            change = {"what": key, "flag": OPTION_FLAGS.get(owner), "a": va, "b": vb}
            if owner in OPTION_DEFAULTS:
                change["default"] = OPTION_DEFAULTS[owner]
            config.append(change)
    env = [{"what": n, "flag": None, "a": getattr(a, n), "b": getattr(b, n)}
           for n in ENVIRONMENT if getattr(a, n) != getattr(b, n)]
    return config, env


NOT_APPLICABLE = "-"
"""An option of the other run's strategy, which this run's strategy does not have."""


def _option(hello: Hello, key: str, other: Hello) -> Any:
    """The run's value of a strategy option: its own, None (its strategy's default), or
    NOT_APPLICABLE when the option is the other strategy's."""
    if key in hello.strategy_options:
        return hello.strategy_options[key]
    return None if hello.strategy == other.strategy else NOT_APPLICABLE


def value_text(v: Any) -> str:
    if v is None:
        return "default"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return json.dumps(v) if isinstance(v, (dict, list)) else str(v)


def change_text(c: dict) -> str:
    def side(v):
        return f"{value_text(c['default'])} (default)" if v is None and "default" in c else value_text(v)
    return f"{c['flag'] or c['what']} {side(c['a'])} → {side(c['b'])}"


@dataclass
class Comparison:
    a_dir: Path
    b_dir: Path
    aligned: bool
    warmup: tuple[int, int]
    steps: tuple[int, int, int]
    """(first, last, count) of the steps compared."""
    config: list[dict]
    environment: list[dict]
    phases: list[rd.Difference]
    rates: list[rd.Difference]
    collectives: list[tuple[str, str, list[rd.Difference]]]
    memory: list[rd.Difference]
    ranks: list[tuple[int, rd.Difference]]
    loss: dict
    goodput: tuple[float, float]
    where: tuple[dict[str, float], dict[str, float]] = ({}, {})
    """Each run's step, where it went (metrics/step_waterfall.py), mean over ranks."""
    verdict: str = ""


def _finite_or_nan(x: float | None) -> float:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else math.nan


def compare(a_dir: Path, b_dir: Path) -> Comparison:
    a, b = run_steps(a_dir), run_steps(b_dir)
    common = sorted(set(a.by_step) & set(b.by_step))
    aligned = len(common) >= rd.MIN_BLOCKS * rd.BLOCK_STEPS
    sa, sb = (common, common) if aligned else (sorted(a.by_step), sorted(b.by_step))
    step_a = per_step(a, sa, lambda s: s.step_ms)
    part_floor = rd.MIN_REL * statistics.median(step_a) if step_a else None
    phases = [d for label, attr in PHASES
              if (d := rd.timed(label, "ms", per_step(a, sa, lambda s, f=attr: finite_or_0(getattr(s, f))),
                                per_step(b, sb, lambda s, f=attr: finite_or_0(getattr(s, f))),
                                min_shift=None if attr == "step_ms" else part_floor)) is not None]
    idle = rd.timed("idle", "ms", per_step(a, sa, lambda s: idle_ms(s.data_ms, s.exposed_comm_ms, s.idle_ms)),
                    per_step(b, sb, lambda s: idle_ms(s.data_ms, s.exposed_comm_ms, s.idle_ms)), min_shift=part_floor)
    phases += [idle] if idle is not None else []
    rates = [d for d in (rd.timed("tokens/s per rank", "tok/s", per_step(a, sa, lambda s: s.tokens_per_s),
                                  per_step(b, sb, lambda s: s.tokens_per_s)),
                         rd.timed("TFLOP/s per rank", "TFLOP/s",
                                  per_step(a, sa, lambda s: s.tflops if s.tflops > 0 else math.nan),
                                  per_step(b, sb, lambda s: s.tflops if s.tflops > 0 else math.nan)))
             if d is not None]
    peaks = (a.hello.peak_tflops if a.hello else 0.0, b.hello.peak_tflops if b.hello else 0.0)
    if all(p > 0 for p in peaks):
        m = rd.timed("MFU", "%", [100 * _finite_or_nan(mfu(t, peaks[0])) for t in per_step(a, sa, lambda s: s.tflops)],
                     [100 * _finite_or_nan(mfu(t, peaks[1])) for t in per_step(b, sb, lambda s: s.tflops)])
        rates += [m] if m is not None else []
    collectives = []
    for kind, group in sorted(comm_keys(a, sa) | comm_keys(b, sb)):
        key = (kind, group)
        rows = [rd.counted("calls per step", "", _mean(comm_per_step(a, sa, key, "count")),
                           _mean(comm_per_step(b, sb, key, "count"))),
                rd.counted("bytes per step", "B", _mean(comm_per_step(a, sa, key, "bytes")),
                           _mean(comm_per_step(b, sb, key, "bytes")))]
        busy = rd.timed("in flight", "ms", comm_per_step(a, sa, key, "busy_ms"), comm_per_step(b, sb, key, "busy_ms"),
                        min_shift=part_floor)
        collectives.append((kind, group, rows + ([busy] if busy is not None else [])))
    ma, mb = last_memory(a), last_memory(b)
    memory = [rd.counted(name, "B", ma[name], mb[name], rel_tolerance=0.05 if name == "host RSS" else 0.0)
              for name in ma if name in mb and (ma[name] or mb[name])]
    ranks = []
    for rank in sorted(set(a.ranks) & set(b.ranks)):
        def rank_compute(run, steps, r=rank):
            return [compute_ms(run.by_step[n][r].step_ms, finite_or_0(run.by_step[n][r].exposed_comm_ms),
                               finite_or_0(run.by_step[n][r].data_ms)) for n in steps]
        d = rd.timed(f"rank {rank} compute", "ms", rank_compute(a, sa), rank_compute(b, sb), min_shift=part_floor)
        if d is not None:
            ranks.append((rank, d))
    phases, rates, collectives, ranks = _adjusted(phases, rates, collectives, ranks)
    config, env = config_changes(a.hello, b.hello)
    ga, gb = summary.goodput(a_dir), summary.goodput(b_dir)
    used = sa if aligned else sorted(set(sa) | set(sb))
    c = Comparison(a_dir, b_dir, aligned, (a.warmup, b.warmup), (used[0], used[-1], len(used)) if used else (0, 0, 0),
                   config, env, phases, rates, collectives, memory, ranks, loss_difference(a, b, common),
                   (ga.goodput if ga.known else math.nan, gb.goodput if gb.known else math.nan))
    c.where = (run_parts(a, sa), run_parts(b, sb))
    c.verdict = verdict(c)
    return c


def run_parts(run: RunSteps, steps: list[int]) -> dict[str, float]:
    """The run's step parts over the compared steps: each rank's mean (as `summary` makes it),
    averaged over ranks."""
    return step_waterfall.mean_parts(
        summary.step_parts_of([run.by_step[n][r] for n in steps], run.hello, skip_first=False) for r in run.ranks)


def _adjusted(phases, rates, collectives, ranks):
    """The step time (the first phase) as tested; every other timed reading Holm-adjusted as one
    family (metrics/run_diff.py)."""
    flat = phases[1:] + rates + [d for _, _, rows in collectives for d in rows] + [d for _, d in ranks]
    done = iter(rd.holm(flat))
    phases = phases[:1] + [next(done) for _ in phases[1:]]
    rates = [next(done) for _ in rates]
    collectives = [(k, g, [next(done) for _ in rows]) for k, g, rows in collectives]
    ranks = [(r, next(done)) for r, _ in ranks]
    return phases, rates, collectives, ranks


def loss_difference(a: RunSteps, b: RunSteps, steps: list[int]) -> dict:
    """Rank 0's loss at each common step: identical (bit for bit), or the largest gap and where."""
    gaps = []
    for n in steps:
        la, lb = a.by_step[n].get(0), b.by_step[n].get(0)
        if la is not None and lb is not None and la.loss is not None and lb.loss is not None:
            gaps.append((abs(lb.loss - la.loss), n))
    if not gaps:
        return {"steps": 0, "identical": None, "max_abs": None, "at_step": None}
    gap, at = max(gaps)
    return {"steps": len(gaps), "identical": gap == 0.0, "max_abs": gap, "at_step": at if gap else None}


def _named(c: Comparison, name: str) -> rd.Difference | None:
    return next((d for d in c.phases if d.name == name), None)


def p_phrase(p: float | None) -> str:
    return "p < 0.001" if p is not None and p < 0.001 else f"p = {rd.p_text(p)}"


def counted_changes(c: Comparison, most: int = 3) -> list[str]:
    """The collectives whose calls or bytes per step differ, one phrase per kind (`all_reduce 2 → 14
    calls per step`, bytes in brackets), at most `most` and how many more."""
    out = []
    for kind, group, rows in c.collectives:
        calls, nbytes = rows[0], rows[1]
        if not (calls.significant or nbytes.significant):
            continue
        name = f"{kind}{' (' + group + ')' if group else ''}"
        size = f"{fmt.nbytes(nbytes.a)} → {fmt.nbytes(nbytes.b)}"
        if calls.significant:
            phrase = f"{name} {value_text(round(calls.a, 2))} → {value_text(round(calls.b, 2))} calls per step"
            out.append(phrase + (f" ({size})" if nbytes.significant else ""))
        else:
            out.append(f"{name} {size} per step")
    return out[:most] + ([f"{len(out) - most} more collectives"] if len(out) > most else [])


def verdict(c: Comparison) -> str:
    """One line: how B's step compares with A's, where the difference went, after which change."""
    step = _named(c, "step time")
    changes = [change_text(x) for x in c.config]
    moved = counted_changes(c)
    after = f" after {', '.join(changes)}" if changes else ""
    if step is None:
        return "no steps to compare" + (f" (config: {', '.join(changes)})" if changes else "")
    if not step.significant:
        noise = "too few steps to tell" if step.p is None else f"within noise, {p_phrase(step.p)}"
        return (f"B steps like A: {step.a:.1f} → {step.b:.1f} ms per step ({step.rel:+.0%}, {noise})"
                + (f"; {', '.join(moved)}" if moved else "") + after)
    ratio = step.b / step.a if step.a > 0 else math.inf
    if ratio >= 2 or ratio <= 0.5:
        how = f"B's step takes {ratio:.1f}× A's" if ratio >= 2 else f"B's step takes {1 / ratio:.1f}× less than A's"
    else:
        how = f"B is {abs(step.rel):.0%} {'slower' if step.delta > 0 else 'faster'} per step"
    same_way = [d for d in c.phases if d.name in CAUSES and d.significant and d.delta * step.delta > 0]
    same_way += [d for _, d in c.ranks if d.significant and d.delta * step.delta > 0]
    where = ""
    if same_way:
        top = max(same_way, key=lambda d: abs(d.delta))
        where = f": {top.name} {top.delta:+.1f} ms"
        if top.name == "exposed communication" and moved:
            where += f" ({', '.join(moved)})"
    elif moved:
        where = f": {', '.join(moved)}"
    return f"{how} ({step.a:.1f} → {step.b:.1f} ms, {p_phrase(step.p)}){where}{after}"


def _num(x: float, unit: str) -> str:
    if not math.isfinite(x):
        return "-"
    if unit == "B":
        return fmt.nbytes(x)
    return f"{x:,.3g}" if abs(x) < 100 else f"{x:,.0f}"


def _row(d: rd.Difference, indent: str = "  ") -> str:
    rel = "" if not math.isfinite(d.rel) else f"{d.rel:+.1%}"
    return (f"{indent}{d.name:<28}{_num(d.a, d.unit):>12}{_num(d.b, d.unit):>12}{rel:>9}  "
            f"{rd.p_text(d.p):>7}  {d.judgement}")


def text(c: Comparison) -> list[str]:
    lines = [c.verdict, "", f"A: {c.a_dir}", f"B: {c.b_dir}"]
    first, last, n = c.steps
    aligned = "aligned by step" if c.aligned else "each run its own: too few in common"
    lines.append(f"steps {first}–{last} ({n}, {aligned}"
                 f"; warm-up left out: A {c.warmup[0]}, B {c.warmup[1]} steps). Timed readings: the median step; "
                 f"Welch's t-test on {rd.BLOCK_STEPS}-step block medians (the step time alone, the rest "
                 f"Holm-adjusted together), significant at p < {rd.ALPHA} and a shift of {rd.MIN_REL:.0%} or more "
                 "(of the step time, for a part of the step)")
    lines += ["", "config" + ("" if c.config else ": the same")]
    lines += [f"  {change_text(x)}" for x in c.config]
    lines += ["environment" + ("" if c.environment else ": the same")]
    lines += [f"  {change_text(x)}" for x in c.environment]
    header = f"  {'':<28}{'A':>12}{'B':>12}{'Δ':>9}  {'p':>7}"
    lines += ["", "per step (ms; each step's mean over ranks)", header]
    lines += [_row(d) for d in c.phases + c.rates]
    if c.collectives:
        lines += ["", "collectives, per step and rank"]
        for kind, group, rows in c.collectives:
            lines.append(f"  {kind}" + (f" ({group})" if group else ""))
            lines += [_row(d, "    ") for d in rows]
    if c.memory:
        lines += ["", "memory, largest rank, last step"] + [_row(d) for d in c.memory]
    if c.ranks:
        lines += ["", "compute per rank (ms: step - exposed communication - data)"] + [_row(d) for _, d in c.ranks]
    loss = c.loss
    if loss["steps"]:
        same = "identical" if loss["identical"] else f"largest gap {loss['max_abs']:.4g} at step {loss['at_step']}"
        lines += ["", f"loss (rank 0, {loss['steps']} common steps): {same}"]
    if c.where[0] and c.where[1]:
        lines += ["", "where the step went (mean of the compared steps and ranks; the parts add up to the step)"]
        lines += [f"  {name} {sum(p.values()):>8.1f} ms = {step_waterfall.line(p)}" for name, p in zip("AB", c.where)]
    ga, gb = c.goodput
    if math.isfinite(ga) or math.isfinite(gb):
        lines.append(f"goodput: A {ga:.1%}  B {gb:.1%} (one value per run: no noise to test against)")
    return lines


def _difference_json(d: rd.Difference) -> dict:
    def clean(x):
        return x if isinstance(x, (int, float)) and math.isfinite(x) else None
    return {"name": d.name, "unit": d.unit, "a": clean(d.a), "b": clean(d.b), "delta": clean(d.delta),
            "rel": clean(d.rel), "p": clean(d.p), "significant": d.significant, "judgement": d.judgement}


def as_json(c: Comparison) -> dict:
    return {"verdict": c.verdict, "a": str(c.a_dir), "b": str(c.b_dir), "aligned": c.aligned,
            "steps": {"first": c.steps[0], "last": c.steps[1], "count": c.steps[2]},
            "warmup_steps": {"a": c.warmup[0], "b": c.warmup[1]},
            "test": {"name": "welch-t on block medians, holm-adjusted", "block_steps": rd.BLOCK_STEPS,
                     "alpha": rd.ALPHA, "min_rel": rd.MIN_REL},
            "config": c.config, "environment": c.environment,
            "per_step": [_difference_json(d) for d in c.phases + c.rates],
            "collectives": [{"kind": k, "group": g, "readings": [_difference_json(d) for d in rows]}
                            for k, g, rows in c.collectives],
            "memory": [_difference_json(d) for d in c.memory],
            "ranks": [dict(_difference_json(d), rank=r) for r, d in c.ranks],
            "loss": c.loss,
            "where_the_step_went_ms": {"a": c.where[0], "b": c.where[1]},
            "goodput": {"a": c.goodput[0] if math.isfinite(c.goodput[0]) else None,
                        "b": c.goodput[1] if math.isfinite(c.goodput[1]) else None}}


def add_arguments(parser) -> None:
    parser.add_argument("run_a", metavar="RUN_A", help="a run's --log-dir (its rank-R.jsonl files): the baseline")
    parser.add_argument("run_b", metavar="RUN_B", help="the run to compare with it")
    parser.add_argument("--json", action="store_true", help="print one JSON object, for scripts")


def main(args) -> int:
    for d in (args.run_a, args.run_b):
        if not Path(d).is_dir() or not any(Path(d).glob("rank-*.jsonl")):
            print(f"ringtop diff: error: no rank-R.jsonl files in {d!r} (a run's --log-dir holds them)",
                  file=sys.stderr)
            return 2
    c = compare(Path(args.run_a), Path(args.run_b))
    if args.json:
        print(json.dumps(as_json(c), indent=1, default=str))
    else:
        print("\n".join(text(c)))
    return 0
