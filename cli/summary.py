"""The end-of-run summary a headless run prints, computed from its JSONL logs."""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from ringtop.metrics import fmt, step_waterfall
from ringtop.metrics.costs.flops import mfu
from ringtop.metrics.goodput import CAUSES, GoodputResult
from ringtop.metrics.rank_sets import ranks_text
from ringtop.metrics.rules.hang import HangVerdict, diagnose
from ringtop.metrics.rules.peaks import implausible
from ringtop.metrics.run_lifecycle import ENDED_SIGNAL_EXIT, STOP_SIGNALS, Lifecycle
from ringtop.metrics.run_state import RunState
from ringtop.metrics.timing import STEP_WINDOW
from ringtop.protocol import Bye, Event, Hello, Stall, Step, read_log
from ringtop.protocol.run_logs import attempts, rank_logs, read_launcher_failures, silent_end

STEP_MS_COLUMN = "median step ms (whole run)"
"""The per-rank table's step time: the whole run's median (`summarize`'s `median_step_ms`), not the
UI's window, and said so."""


class _EndedSilent(NamedTuple):
    """In a log's stream, where a rank's attempt ends without a Bye, and how it ended as far as known."""

    rank: int
    ts: float
    how: str


def run_state(log_dir: Path, signals: dict[int, str] | None = None) -> RunState:
    """The run's state from its logs: every rank's messages merged in time order into the fold the
    UI and the Prometheus exporter make (metrics/run_state). A rank's attempt that ends without a
    Bye ended as the launcher saw it: the last attempt by `signals` (rank -> the signal `ringtop
    run`'s launcher reported), the earlier ones by the failure report kept in the folder."""
    signals = signals or {}
    failures = read_launcher_failures(log_dir)
    stream: list = []
    for rank, messages in rank_logs(log_dir):
        parts = attempts(messages)
        for n, part in enumerate(parts):
            stream += part
            if part and not isinstance(part[-1], Bye):
                how = (f"killed by {signals[rank]}" if rank in signals else "ended without a Bye") \
                    if n == len(parts) - 1 else silent_end(part, failures)
                stream.append(_EndedSilent(rank, part[-1].ts, how))
    stream.sort(key=lambda m: m.ts)  # stable: each rank's own order stays
    state = RunState(whole_run=True)
    for m in stream:
        if isinstance(m, _EndedSilent):
            state.note_exit(m.rank, m.how, "", m.ts)
        else:
            state.add(m, m.ts)
    return state


def summarize(log_dir: Path, state: RunState | None = None) -> list[dict]:
    """A row per rank that stepped: the figures of the run's state (`run_state`), the step time and
    TFLOP/s as the whole run's medians."""
    state = state if state is not None else run_state(log_dir)
    rows = []
    for rank, r in sorted(state.ranks.items()):
        if not r.timed_steps:
            continue
        hello = r.hello
        median_tflops = r.median_tflops
        rows.append({
            "rank": rank,
            "strategy": hello.strategy if hello else "?",
            "steps": r.step,
            "first_loss": r.first_loss,
            "last_loss": r.loss,
            "median_step_ms": r.median_step_ms,
            "comm_bytes_per_step": r.comm_bytes_total / r.timed_steps,
            "exposed_comm_pct": r.exposed_comm_pct,
            "median_tflops": median_tflops,
            "mfu": mfu(median_tflops, hello.peak_tflops) if hello is not None and median_tflops > 0 else None,
            "implausible": hello is not None and implausible(median_tflops, hello.tflops_ceiling),
            "drops": r.agent_drops,
            "exit": r.bye_reason if r.ended else "no bye (still running or killed)",
        })
    return rows


def step_parts_of(steps: list[Step], hello: Hello | None, skip_first: bool = True) -> dict[str, float]:
    """A rank's step, where it went (metrics/step_waterfall.py), averaged over its steps (after the
    first, which warms up, as the step ms above, unless `skip_first` is False)."""
    peak = hello.peak_tflops if hello is not None else 0.0
    pipeline = hello is not None and hello.strategy == "pp"
    return step_waterfall.mean_parts(
        step_waterfall.step_parts(s.step_ms, s.data_ms, s.forward_ms, s.backward_ms, s.optimizer_ms,
                                  s.exposed_comm_ms, s.idle_ms, pipeline,
                                  mfu(s.tflops, peak) if peak > 0 and s.tflops > 0 else None)
        for s in ((steps[1:] or steps) if skip_first else steps))


def waterfall(log_dir: Path) -> dict[int, dict[str, float]]:
    """Each rank's mean step parts, from its log."""
    out = {}
    for path in sorted(log_dir.glob("rank-*.jsonl"), key=lambda p: int(p.stem.split("-")[1])):
        logged = read_log(path)
        steps = [m for m in logged if isinstance(m, Step)]
        hello = next((m for m in logged if isinstance(m, Hello)), None)
        if steps:
            out[steps[0].rank] = step_parts_of(steps, hello)
    return out


def waterfall_lines(log_dir: Path) -> list[str]:
    parts = waterfall(log_dir)
    if not parts:
        return []
    lines = ["where the step went (mean of each rank's steps after its first; the parts add up to the step):"]
    for rank, p in parts.items():
        lines.append(f"  rank {rank:<3} {sum(p.values()):>8.1f} ms = {step_waterfall.line(p)}")
    if len(parts) > 1:
        run = step_waterfall.mean_parts(parts.values())
        lines.append(f"  {'run':<8} {sum(run.values()):>8.1f} ms = {step_waterfall.line(run)}")
    if any(step_waterfall.IDEAL in p for p in parts.values()):
        lines.append("  ideal: the step's FLOPs at the device's peak; the other parts are MFU's gap to 100 %")
    return lines


def mfu_text(ratio: float | None) -> str:
    """The MFU column: `n/a` where the device's peak is not known (never a guessed one)."""
    return "n/a" if ratio is None else fmt.fraction_pct(ratio)


def tflops_text(row: dict) -> str:
    """The TFLOP/s column: `?` after a figure above the most its device can do (not a measurement)."""
    return fmt.tflops(row["median_tflops"]) + ("?" if row.get("implausible") else "")


def step_finding_lines(log_dir: Path) -> list[str]:
    """The summary's lines about the steps' numbers: steps whose gradient norm was not finite
    (skipped or applied, and whose loss was not finite), each rank's loss spikes, and TFLOP/s
    figures above what the device can do."""
    nonfinite: dict[int, Event] = {}
    skipped: set[int] = set()
    findings: list[Event] = []
    for path in sorted(log_dir.glob("rank-*.jsonl")):
        for m in read_log(path):
            if isinstance(m, Step) and m.skipped:
                skipped.add(m.step)
            elif isinstance(m, Event) and m.kind == "nonfinite":
                d = m.data if isinstance(m.data, dict) else {}
                step = d.get("step", m.step)
                if isinstance(step, int):
                    nonfinite.setdefault(step, m)
            elif isinstance(m, Event) and m.kind in ("loss_spike", "implausible_tflops"):
                findings.append(m)
    lines = []
    for was_skipped in (True, False):
        steps = sorted(skipped if was_skipped else set(nonfinite) - skipped)
        if not steps:
            continue
        ranks = sorted({r for step in steps for r in _ranks_of(nonfinite.get(step))})
        shown = ", ".join(f"{x:,}" for x in steps[:10]) + (f" … ({len(steps) - 10} more)" if len(steps) > 10 else "")
        where = f"; loss not finite on {ranks_text(ranks)}" if ranks else ""
        what = "skipped (gradient norm not finite)" if was_skipped else "with a gradient norm not finite, applied"
        lines.append(f"non-finite: {len(steps)} step{'s' if len(steps) != 1 else ''} {what}: "
                     f"step{'s' if len(steps) != 1 else ''} {shown}{where}")
    for m in sorted(findings, key=lambda m: (m.ts, m.rank)):
        lines.append(f"⚠ {m.text}")
    return lines


def _ranks_of(event: Event | None) -> list[int]:
    ranks = event.data.get("ranks") if event is not None and isinstance(event.data, dict) else None
    return [r for r in ranks if isinstance(r, int)] if isinstance(ranks, list) else []


def diagnosis(log_dir: Path) -> Event | None:
    """Rank 0's end-of-run diagnosis event, if the run got that far."""
    found = [m for m in read_log(log_dir / "rank-0.jsonl") if isinstance(m, Event) and m.kind == "diagnosis"]
    return found[-1] if found else None


def goodput(log_dir: Path, state: RunState | None = None) -> GoodputResult:
    """The run's goodput from every rank's log, merged in time order (stalls of any rank count;
    see metrics/goodput.py): the run's state's count (`run_state`)."""
    return (state if state is not None else run_state(log_dir)).goodput.result()


def goodput_line(g: GoodputResult) -> str:
    """`goodput 86.4% of 10.0 s wall: productive 8.64 s; lost: startup 1 s, other 0.355 s`."""
    lost = ", ".join(f"{cause} {fmt.seconds(g.lost_s[cause])} s" for cause in CAUSES
                     if g.lost_s.get(cause, 0) >= 5e-4)  # a float's rounding is not a cause
    return (f"goodput {fmt.fraction_pct(g.goodput)} of {fmt.seconds(g.wall_s)} s wall: productive "
            f"{fmt.seconds(g.productive_s)} s" + (f"; lost: {lost}" if lost else ""))


@dataclass
class StallEpisode:
    """A time when at least one rank was stalled, from its first `stalled` report until every
    stalled rank moved on (a `recovered`, a later step, its bye)."""

    start_ts: float
    end_ts: float | None = None
    """None: still stalled when the logs end."""
    ranks: set[int] = field(default_factory=set)
    step: int = 0
    longest_s: float = 0.0
    """The longest any rank ran its stuck step, by its own reports."""
    verdict: HangVerdict | None = None
    """`metrics.hang.diagnose` on the reports just before the first rank moved on (all stuck
    ranks have reported by then): the same reading the UI and rank 0 make."""


def stall_episodes(log_dir: Path) -> list[StallEpisode]:
    """The stall episodes of a run, from every rank's `stall` reports, steps and byes in time order."""
    msgs, world = [], 0
    for path in sorted(log_dir.glob("rank-*.jsonl")):
        for m in read_log(path):
            if isinstance(m, (Stall, Step, Bye)):
                msgs.append(m)
            elif isinstance(m, Hello):
                world = max(world, m.world_size)
    if not any(isinstance(m, Stall) and m.state == "stalled" for m in msgs):
        return []
    msgs.sort(key=lambda m: (m.ts, m.rank))
    world = world or max(m.rank for m in msgs) + 1
    episodes: list[StallEpisode] = []
    reports: dict[int, Stall] = {}
    failed: set[int] = set()
    current: StallEpisode | None = None
    fresh = False

    def read() -> None:
        nonlocal fresh
        if fresh and current is not None:
            verdict = diagnose(reports, world, failed)
            if current.verdict is None or (current.verdict.kind == "stall" and verdict and verdict.kind != "stall"):
                current.verdict = verdict
            fresh = False

    def moved_on(rank: int, ts: float, died: bool = False) -> None:
        nonlocal current, fresh
        if rank not in reports or current is None:
            return
        if died:
            fresh = True  # the death is the news: read what the others wait for once it is known
        else:
            read()
        del reports[rank]
        if not reports:
            current.end_ts = ts
            episodes.append(current)
            current = None

    for m in msgs:
        if isinstance(m, Stall) and m.state == "stalled":
            if current is None:
                current = StallEpisode(start_ts=m.ts, step=m.step)
            reports[m.rank] = m
            current.ranks.add(m.rank)
            current.longest_s = max(current.longest_s, m.running_s)
            fresh = True
        elif isinstance(m, Stall) and m.state == "recovered":
            moved_on(m.rank, m.ts)
        elif isinstance(m, Step) and m.rank in reports and m.step >= reports[m.rank].step:
            moved_on(m.rank, m.ts)
        elif isinstance(m, Bye):
            if not m.ok:
                failed.add(m.rank)
            moved_on(m.rank, m.ts, died=not m.ok)
    if current is not None:
        read()
        episodes.append(current)
    return episodes


def hang_events(log_dir: Path) -> list[tuple[Event, int]]:
    """Rank 0's `hang` and `desync` events, each with how many times it was restated (a hang
    is restated every 30 s while it lasts, with its wait grown)."""
    found: list[tuple[Event, int]] = []
    index: dict[tuple, int] = {}
    for path in sorted(log_dir.glob("rank-*.jsonl")):
        for m in read_log(path):
            if not (isinstance(m, Event) and m.kind in ("hang", "desync")):
                continue
            h = m.hang
            key = ((m.kind, h.verdict, str(h.culprits), h.group, h.seq, h.step) if h is not None else (m.kind,)) + \
                (m.text if h is None or h.verdict in ("cleared", "desync") else "",)
            if key in index:
                event, n = found[index[key]]
                found[index[key]] = (event, n + 1)
            else:
                index[key] = len(found)
                found.append((m, 0))
    return sorted(found, key=lambda f: f[0].ts)


def hang_lines(log_dir: Path) -> list[str]:
    """The end summary's lines about hangs: the stall episodes, then rank 0's verdicts."""
    episodes, events = stall_episodes(log_dir), hang_events(log_dir)
    if not episodes and not events:
        return []
    lines = []
    if episodes:
        longest = max(episodes, key=lambda e: e.longest_s)
        culprits = sorted({r for e in episodes if e.verdict is not None for r in e.verdict.culprits})
        named = f"; culprits: {ranks_text(culprits)}" if culprits else ""
        lines.append(f"stalls: {len(episodes)} episode{'s' if len(episodes) != 1 else ''}, the longest "
                     f"{longest.longest_s:.0f} s (step {longest.step:,}){named}")
        for e in episodes:
            until = fmt.clock(e.end_ts) if e.end_ts is not None else "the end of the logs"
            what = e.verdict.text if e.verdict is not None else "no reading"
            lines.append(f"  {fmt.clock(e.start_ts)}–{until}  step {e.step:,}, {ranks_text(sorted(e.ranks))} "
                         f"stalled, up to {e.longest_s:.0f} s: {what}")
    if events:
        lines.append("rank 0's hang watch:")
        for event, restated in events:
            cleared = event.hang is not None and event.hang.verdict == "cleared"
            mark = "✓" if cleared or event.level == "info" else ("⚠" if event.level == "warn" else "✖")
            again = f" (restated {restated}×)" if restated else ""
            lines.append(f"  {mark} {fmt.clock(event.ts)} {event.kind}: {event.text}{again}")
    return lines


def print_summary(log_dir: Path) -> None:
    state = run_state(log_dir)
    rows = summarize(log_dir, state)
    if not rows:
        print(f"no step records in {log_dir}")
        hangs = hang_lines(log_dir)  # a run can hang before its first step
        if hangs:
            print("\n" + "\n".join(hangs))
        return
    print(f"\n{'rank':>4} {'steps':>6} {'loss first→last':>18} {STEP_MS_COLUMN:>26} "
          f"{'comm/step':>13} {'exposed comm %':>15} {'TFLOP/s':>8} {'MFU':>6} {'drops':>6}  exit")
    for r in rows:
        print(f"{r['rank']:>4} {r['steps']:>6} {r['first_loss']:>8.4f} → {r['last_loss']:<7.4f} "
              f"{fmt.ms(r['median_step_ms']):>26} {fmt.nbytes(r['comm_bytes_per_step']):>13} "
              f"{r['exposed_comm_pct']:>15.1f} "
              f"{tflops_text(r):>8} {mfu_text(None if r['implausible'] else r['mfu']):>6} {r['drops']:>6}  "
              f"{r['exit']}")
    print(f"  {STEP_MS_COLUMN}: the median of each rank's steps after its first (the UI's step ms is the mean "
          f"of its last {STEP_WINDOW})")
    if any(r["implausible"] for r in rows):
        print("  ? above the most the device can do: the tokens or FLOPs it is computed from are wrong")
    print("\n" + lifecycle_line(state.lifecycle()))
    restarts = restart_lines(log_dir, state)
    if restarts:
        print("\n".join(restarts))
    good = goodput(log_dir, state)
    if good.known:
        print("\n" + goodput_line(good))
    found = diagnosis(log_dir)
    if found is not None:
        verdicts = found.data.get("verdicts", [])
        print("\ndiagnosis: " + ("no problems found" if not verdicts else ""))
        for v in verdicts:
            print(f"  ⚠ {v['text']}\n    advice: {v['advice']}")
    where = waterfall_lines(log_dir)
    if where:
        print("\n" + "\n".join(where))
    findings = step_finding_lines(log_dir)
    if findings:
        print("\n" + "\n".join(findings))
    hangs = hang_lines(log_dir)
    if hangs:
        print("\n" + "\n".join(hangs))


def restart_lines(log_dir: Path, state: RunState | None = None) -> list[str]:
    """`restarts: 1` and, for each, how the attempt before it ended (the run's state's restarts:
    the same fold as the run's end)."""
    state = state if state is not None else run_state(log_dir)
    if not state.restarts:
        return []
    lines = [f"restarts: {len(state.restarts)}"]
    for seen in state.restarts:
        lines.append(f"  restart {seen.count} at {fmt.clock(seen.ts)}" + (f" after {seen.cause}" if seen.cause else ""))
    return lines


def lifecycle_of_logs(log_dir: Path | None, signals: dict[int, str] | None = None) -> Lifecycle | None:
    """The run's lifecycle from its logs (the run's state's, the fold the UI makes); None without logs."""
    if log_dir is None or not any(log_dir.glob("rank-*.jsonl")):
        return None
    return run_state(log_dir, signals).lifecycle()


def lifecycle_line(life: Lifecycle | None) -> str:
    """`summary`'s line on how the run ended: `run ended: completed 100 steps`, `run stopped by Ctrl-C at
    step 40`, `run failed: rank 1 …`."""
    if life is None:
        return "run: no logs"
    if not life.final:
        return f"run {life.state}: not every rank has said Bye (still running, or killed with its logs cut short)"
    return f"run {life.words}" if life.state == "stopped" else f"run {life.state}: {life.words}"


def launcher_signals(launcher_output: str) -> dict[int, str]:
    """Rank -> the signal that ended it, from the launcher's failure report (cli/launch_report.py)."""
    from ringtop.cli.launch_report import launcher_exits
    from ringtop.protocol.run_logs import signal_name

    return {rank: signal_name(-code) for rank, code in launcher_exits(launcher_output).items() if code < 0}


def stop_line(code: int, life: Lifecycle | None) -> str | None:
    """`ringtop run`'s last line when the run did not fail: how it ended, agreeing with its exit
    code — a stop signal is a stop (never "failed"); None for a failure (launch_report says it)."""
    if code > ENDED_SIGNAL_EXIT:
        signum = code - ENDED_SIGNAL_EXIT
        name = signal.Signals(signum).name if signum in signal.valid_signals() else ""
        who = STOP_SIGNALS.get(name, name or f"signal {signum}")
        at = f" at step {life.step:,}" if life is not None and life.step >= 0 else ""
        line = f"ringtop: the run stopped by {who}{at} (exit code {code})"
        if life is not None and life.state == "failed":
            line += f"; before that {life.words}"
        return line
    if code != 0 or (life is not None and life.state == "failed"):
        return None
    if life is None:
        return "ringtop: the run ended (no logs to say more)"
    return f"ringtop: the run {life.words}" if life.state == "stopped" else f"ringtop: the run ended: {life.words}"


def report_end(code: int, log_dir: Path | None, launcher_output: str = "", report_path: Path | None = None) -> int:
    """Say how the run ended, as its lifecycle reads (a failure: launch_report's lines), and return
    `ringtop run`'s exit code: the launcher's, except that a stop by a command exits 0 also where a
    stuck rank had to be ended (the launcher then says 1)."""
    from ringtop.cli.launch_report import print_failure

    life = lifecycle_of_logs(log_dir, launcher_signals(launcher_output))
    if 0 < code < ENDED_SIGNAL_EXIT and life is not None and life.state == "stopped":
        code = life.exit_code
    restarts = restart_lines(log_dir) if log_dir is not None else []
    if restarts:  # the launcher started every rank again; the last line is how its last attempt ended
        print("ringtop: " + "\n  ".join(line.strip() for line in restarts), file=sys.stderr)
    line = stop_line(code, life)
    if line is None:
        print_failure(code, log_dir, launcher_output, report_path)
    else:
        print(line, file=sys.stderr)
    return code
