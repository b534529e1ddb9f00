"""The end-of-run summary a headless run prints, computed from its JSONL logs."""

from __future__ import annotations

import re
import signal
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from ringtop.metrics import fmt
from ringtop.metrics.flops import mfu
from ringtop.metrics.goodput import CAUSES, GoodputResult, goodput_of
from ringtop.metrics.hang import HangVerdict, diagnose
from ringtop.metrics.rank_sets import ranks_text
from ringtop.metrics.timing import share_pct
from ringtop.metrics.units import MB
from ringtop.protocol import Bye, Event, Hello, Stall, Step, read_log


def summarize(log_dir: Path) -> list[dict]:
    rows = []
    for path in sorted(log_dir.glob("rank-*.jsonl")):
        steps: list[Step] = []
        hello = bye = None
        for msg in read_log(path):
            if isinstance(msg, Step):
                steps.append(msg)
            elif isinstance(msg, Hello):
                hello = msg
            elif isinstance(msg, Bye):
                bye = msg
        if not steps:
            continue
        step_ms = [s.step_ms for s in steps[1:]] or [steps[0].step_ms]
        tflops = [s.tflops for s in (steps[1:] or steps) if s.tflops > 0]  # the first step warms up, as above
        median_tflops = statistics.median(tflops) if tflops else 0.0
        comm_bytes = sum(c.bytes for s in steps for c in s.comm)
        rows.append({
            "rank": steps[0].rank,
            "strategy": hello.strategy if hello else "?",
            "steps": steps[-1].step,
            "first_loss": steps[0].loss,
            "last_loss": steps[-1].loss,
            "median_step_ms": statistics.median(step_ms),
            "comm_mb_per_step": comm_bytes / len(steps) / MB,
            "comm_blocked_pct": share_pct(sum(s.comm_blocked_ms for s in steps), sum(s.step_ms for s in steps)),
            "median_tflops": median_tflops,
            "mfu": mfu(median_tflops, hello.peak_tflops) if hello is not None and median_tflops > 0 else None,
            "drops": steps[-1].drops,
            "exit": bye.reason if bye else "no bye (still running or killed)",
        })
    return rows


def mfu_text(ratio: float | None) -> str:
    """The MFU column: `n/a` where the device's peak is not known (never a guessed one)."""
    return "n/a" if ratio is None else fmt.fraction_pct(ratio)


def diagnosis(log_dir: Path) -> Event | None:
    """Rank 0's end-of-run diagnosis event, if the run got that far."""
    found = [m for m in read_log(log_dir / "rank-0.jsonl") if isinstance(m, Event) and m.kind == "diagnosis"]
    return found[-1] if found else None


def goodput(log_dir: Path) -> GoodputResult:
    """The run's goodput from every rank's log, merged in time order (stalls of any rank count;
    see metrics/goodput.py)."""
    messages = []
    for path in sorted(log_dir.glob("rank-*.jsonl")):
        logged = read_log(path)
        if path.name == "rank-0.jsonl":
            messages += logged
        else:  # what goodput takes from the other ranks: their Hello, stalls, and where their log ends
            messages += [m for m in logged if isinstance(m, (Hello, Stall, Bye))] + logged[-1:]
    return goodput_of(sorted(messages, key=lambda m: m.ts))


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
            d = m.data if isinstance(m.data, dict) else {}
            key = (m.kind, d.get("verdict"), str(d.get("culprits")), d.get("group"), d.get("seq"), d.get("step"),
                   m.text if d.get("cleared") or m.kind == "desync" else "")
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
            cleared = isinstance(event.data, dict) and event.data.get("cleared")
            mark = "✓" if cleared or event.level == "info" else ("⚠" if event.level == "warn" else "✖")
            again = f" (restated {restated}×)" if restated else ""
            lines.append(f"  {mark} {fmt.clock(event.ts)} {event.kind}: {event.text}{again}")
    return lines


def print_summary(log_dir: Path) -> None:
    rows = summarize(log_dir)
    if not rows:
        print(f"no step records in {log_dir}")
        hangs = hang_lines(log_dir)  # a run can hang before its first step
        if hangs:
            print("\n" + "\n".join(hangs))
        return
    print(f"\n{'rank':>4} {'steps':>6} {'loss first→last':>18} {'step ms (median)':>17} "
          f"{'comm MB/step':>13} {'comm blocked %':>15} {'TFLOP/s':>8} {'MFU':>6} {'drops':>6}  exit")
    for r in rows:
        print(f"{r['rank']:>4} {r['steps']:>6} {r['first_loss']:>8.4f} → {r['last_loss']:<7.4f} "
              f"{r['median_step_ms']:>17.1f} {r['comm_mb_per_step']:>13.2f} {r['comm_blocked_pct']:>15.1f} "
              f"{fmt.tflops(r['median_tflops']):>8} {mfu_text(r['mfu']):>6} {r['drops']:>6}  {r['exit']}")
    good = goodput(log_dir)
    if good.known:
        print("\n" + goodput_line(good))
    found = diagnosis(log_dir)
    if found is not None:
        verdicts = found.data.get("verdicts", [])
        print("\ndiagnosis: " + ("no problems found" if not verdicts else ""))
        for v in verdicts:
            print(f"  ⚠ {v['text']}\n    advice: {v['advice']}")
    hangs = hang_lines(log_dir)
    if hangs:
        print("\n" + "\n".join(hangs))


_LAUNCHER_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def launcher_signals(launcher_output: str) -> dict[int, str]:
    """Rank -> the signal that ended it, from the failure report torch's elastic launcher prints
    (`rank : 1 (local_rank: 1)` / `exitcode : -9 (pid: ...)`)."""
    found = {}
    for rank, code in _LAUNCHER_FAILURE.findall(launcher_output):
        if int(code) < 0:
            try:
                found[int(rank)] = signal.Signals(-int(code)).name
            except ValueError:
                found[int(rank)] = f"signal {-int(code)}"
    return found


def failure_line(log_dir: Path | None, launcher_code: int, signals: dict[int, str] | None = None) -> str:
    """One line saying which rank failed first, from the ranks' logs: a rank whose log ends
    without a Bye was killed (or crashed hard) and is named before ranks whose Bye reports the
    error its death caused them; of several such, the one whose log ends first. `signals`: what
    the launcher saw end each rank (launcher_signals)."""
    signals = signals or {}
    if log_dir is None or not any(log_dir.glob("rank-*.jsonl")):
        return f"ringtop: the run failed (launcher exit code {launcher_code}); see the launcher's report above"
    silent, failed = [], []
    for path in sorted(log_dir.glob("rank-*.jsonl"), key=lambda p: int(p.stem.split("-")[1])):
        messages = read_log(path)
        rank = int(path.stem.split("-")[1])
        last_step = max((m.step for m in messages if isinstance(m, Step)), default=0)
        bye = messages[-1] if messages and isinstance(messages[-1], Bye) else None
        if bye is None:
            last_ts = messages[-1].ts if messages else 0.0
            how = f"killed by {signals[rank]}" if rank in signals else "killed by a signal, or crashed"
            silent.append((last_ts, f"rank {rank} ended without a Bye after step {last_step} ({how})"))
        elif not bye.ok:
            reason = " ".join(bye.reason.split())  # a traceback's lines, made one
            failed.append(f"rank {rank}: {reason[:160]}{'…' if len(reason) > 160 else ''}")
    causes = [text for _, text in sorted(silent)] + failed  # the log that ends first: the rank that went first
    if not causes:
        return f"ringtop: the launcher exited with code {launcher_code} after every rank said Bye"
    return "ringtop: the run failed: " + "; ".join(causes[:3]) + (" ..." if len(causes) > 3 else "")
