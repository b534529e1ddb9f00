"""`ringtop trace RUN_DIR`: one timeline of every rank, in the Trace Event Format's JSON (Perfetto,
chrome://tracing), from the run's logs, collective ledger dumps and `ctl profile` traces.

Memory stays bounded on a large log: the logs are streamed line by line twice (first the hosts,
the step window and the step ends per host for the clock alignment; then the events, written to
the file as they are made), never held whole. A profiler trace is read one file at a time.

Clocks: every event is placed by its rank's wall clock (`ts`, `time.time()` on its host). With
more than one host, each host's clock is shifted by the median difference of its step ends from
the reference host's (metrics/trace_events.py host_offsets_s); `--clock wall` keeps the raw clocks.
A step's collectives (the log's `calls`: issue, completion and the wait on each, in ms from the
step's start) are placed from the step's start as laid back from its `ts`, as its phases are. A
ledger dump is placed by the wall and perf clocks it read together when written (a collective the
logs already drew is not drawn again); a profiler trace by its `ProfilerStep#N` spans placed inside
the same steps as logged."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator

import msgspec

from ringtop.metrics import trace_events as te
from ringtop.protocol import from_json_line, safe_files
from ringtop.protocol.errors import ProtocolError
from ringtop.protocol.messages import Bye, CollectiveCalls, Event, Hello, Stall, Step, Timeline

DEFAULT_NAME = "trace.json"
"""Where the timeline goes without -o: in the run's folder."""
LOG_NAME = re.compile(r"rank-(\d+)\.jsonl$")
PROFILE_NAME = re.compile(r"step-(\d+)-rank-(\d+)\.json$")
PROFILE_STEP = re.compile(r"ProfilerStep#(\d+)$")
PROFILED_STEPS_MAX = 1024
"""Steps after a profile's first whose ends are kept for its alignment."""
PHASE_NAMES = {"data": "data", "forward": "forward", "backward": "backward", "optimizer": "optimizer"}
OP_NAMES = {"F": "forward", "B": "backward"}
STALL_NAMES = {"stalled": "stalled", "starting": "stalled in start-up", "recovered": "recovered",
               "snapshot": "stacks read"}


@dataclass
class StepWindow:
    first: int | None = None
    last: int | None = None

    def has(self, step: int) -> bool:
        return (self.first is None or step >= self.first) and (self.last is None or step <= self.last)


@dataclass
class RunFrame:
    """What the first pass learns: each rank's host, the hosts' clock offsets, the time origin and
    the selected steps' time window (s, on the aligned clock)."""

    hosts: dict[int, str] = field(default_factory=dict)
    offsets_s: dict[str, float] = field(default_factory=dict)
    origin_s: float = 0.0
    lo_s: float = float("-inf")
    hi_s: float = float("inf")
    steps: int = 0

    comm_lanes: dict[int, te.Lanes] = field(default_factory=dict)
    wait_lanes: dict[int, te.Lanes] = field(default_factory=dict)
    drawn: te.SeqRanges = field(default_factory=te.SeqRanges)
    """The collectives drawn from the logs' `calls`, by (rank, group, seq): a ledger's are not drawn again."""

    def wait_tid(self, rank: int, start_us: float, dur_us: float) -> int:
        """The rank's track of waits on communication where this one overlaps no other."""
        lanes = self.wait_lanes.setdefault(rank, te.Lanes(te.WAIT_LANES))
        return te.tid_of(rank, te.WAIT_LANE + lanes.place(start_us, start_us + max(dur_us, 0.0)))

    def comm_tid(self, rank: int, start_us: float, dur_us: float) -> int:
        """The rank's communication track where this span overlaps no other."""
        lanes = self.comm_lanes.setdefault(rank, te.Lanes(te.COMM_LANES))
        return te.tid_of(rank, te.COMM_LANE + lanes.place(start_us, start_us + max(dur_us, 0.0)))

    def pid(self, rank: int) -> int:
        return self._pids[self.hosts.get(rank, "")]

    def aligned_s(self, rank: int, ts: float) -> float:
        return ts - self.offsets_s.get(self.hosts.get(rank, ""), 0.0)

    def index_hosts(self) -> None:
        self._pids = {h: i + 1 for i, h in enumerate(sorted(set(self.hosts.values()) | {""}))}


def messages(path: Path) -> Iterator[Any]:
    """A log's decodable messages, one line at a time (a torn or bad line is skipped)."""
    with open(path, "rb") as f:
        for line in f:
            try:
                yield from_json_line(line)
            except ProtocolError:
                pass


def rank_logs(run_dir: Path) -> list[tuple[int, Path]]:
    found = ((LOG_NAME.search(p.name), p) for p in run_dir.glob("rank-*.jsonl"))
    return sorted((int(m.group(1)), p) for m, p in found if m)


def first_pass(logs: list[tuple[int, Path]], window: StepWindow, align: bool) -> RunFrame:
    frame = RunFrame()
    sums: dict[str, dict[int, list[float]]] = {}
    starts: dict[str, float] = {}
    ends: dict[str, float] = {}
    for rank, path in logs:
        for m in messages(path):
            if isinstance(m, Hello):
                frame.hosts[rank] = m.host
            elif isinstance(m, Step) and window.has(m.step):
                host = frame.hosts.get(rank, "")
                acc = sums.setdefault(host, {}).setdefault(m.step, [0.0, 0])
                acc[0] += m.ts
                acc[1] += 1
                starts[host] = min(starts.get(host, m.ts), m.ts - m.step_ms / 1e3)
                ends[host] = max(ends.get(host, m.ts), m.ts)
                frame.steps += 1
    means = {h: {s: total / n for s, (total, n) in per.items()} for h, per in sums.items()}
    frame.offsets_s = te.host_offsets_s(means) if align else {h: 0.0 for h in means}
    if starts:
        frame.origin_s = min(starts[h] - frame.offsets_s[h] for h in starts)
        if window.first is not None or window.last is not None:
            frame.lo_s = frame.origin_s
            frame.hi_s = max(ends[h] - frame.offsets_s[h] for h in ends)
    frame.index_hosts()
    return frame


class TraceWriter:
    """Writes events to the file as they come: '{"traceEvents": [' ... '], ...}'."""

    def __init__(self, out: IO[str]):
        self.out, self.count = out, 0
        self.tracks: set[tuple[int, int]] = set()
        self.labels: dict[tuple[int, int], str] = {}
        out.write('{"traceEvents": [\n')

    def add(self, event: dict[str, Any]) -> None:
        if event["ph"] != "M":
            self.tracks.add((event["pid"], event["tid"]))
        if self.count:
            self.out.write(",\n")
        self.out.write(json.dumps(event, separators=(",", ":")))
        self.count += 1

    def close(self, other: dict[str, Any]) -> None:
        self.out.write('\n], "displayTimeUnit": "ms", "otherData": ')
        self.out.write(json.dumps(other))
        self.out.write("}\n")


def _tracks(w: TraceWriter, frame: RunFrame) -> None:
    """Names and order of the processes (hosts) and of the threads (rank tracks) that have events:
    metadata may come anywhere in the file, so it is written last, for the tracks used."""
    names = {frame._pids[h]: h for h in frame._pids}
    for pid in sorted({pid for pid, _ in w.tracks}):
        host = names.get(pid, "")
        w.add(te.metadata("process_name", pid, None, f"host {host}" if host else "host unknown"))
        w.add(te.metadata("process_sort_index", pid, None, pid))
    for pid, tid in sorted(w.tracks):
        rank, lane = divmod(tid, te.LANES)
        if lane == te.STEP_LANE:
            label = f"rank {rank}"
        elif lane < te.COMM_LANE + te.COMM_LANES:
            label = f"rank {rank} communication" + (f" {lane - te.COMM_LANE + 1}" if lane > te.COMM_LANE else "")
        elif lane < te.WAIT_LANE + te.WAIT_LANES:
            label = f"rank {rank} waits on communication" + (f" {lane - te.WAIT_LANE + 1}" if lane > te.WAIT_LANE
                                                              else "")
        elif lane == te.PIPELINE_LANE:
            label = f"rank {rank} pipeline"
        else:
            label = w.labels.get((pid, tid), f"rank {rank} profiler")
        w.add(te.metadata("thread_name", pid, tid, label))
        w.add(te.metadata("thread_sort_index", pid, tid, tid))


def _step_events(w: TraceWriter, frame: RunFrame, rank: int, m: Step) -> float:
    """The step and its phases on the rank's track; returns the step's end (µs)."""
    pid, tid, o = frame.pid(rank), te.tid_of(rank, te.STEP_LANE), frame.origin_s
    end_s = frame.aligned_s(rank, m.ts)
    phases = {"data": m.data_ms, "forward": m.forward_ms, "backward": m.backward_ms, "optimizer": m.optimizer_ms}
    args = {"step": m.step, "step_ms": m.step_ms, "loss": m.loss, "grad_norm": m.grad_norm, "tokens": m.tokens,
            "tokens_per_s": m.tokens_per_s, "exposed_comm_ms": m.exposed_comm_ms, "comm_busy_ms": m.comm_busy_ms,
            "idle_ms": m.idle_ms, "skipped": m.skipped}
    if m.comm:
        args["collectives"] = [{"kind": c.kind, "group": c.group, "count": c.count, "bytes": c.bytes,
                                "busy_ms": c.busy_ms} for c in m.comm]
    if m.collectives:
        args["groups"] = [{"group": g.group, "seq_issued": g.issued, "seq_completed": g.completed, "calls": g.count}
                          for g in m.collectives]
    end_us = te.us(end_s, o)
    for name, start_us, dur_us in te.step_spans(end_us, m.step_ms, phases):
        if name == "step":
            w.add(te.complete(f"step {m.step}", "step", start_us, dur_us, pid, tid, args))
        else:
            w.add(te.complete(PHASE_NAMES[name], "phase", start_us, dur_us, pid, tid,
                              {"step": m.step, "ms": phases[name]}))
    return end_us


def _timeline_events(w: TraceWriter, frame: RunFrame, rank: int, t: Timeline, step_end_us: float) -> None:
    """A pipeline stage's micro-batches: its window (on the host's monotonic clock) laid to end at
    the step's logged end, the nearest wall-clock mark the logs give it."""
    pid, tid = frame.pid(rank), te.tid_of(rank, te.PIPELINE_LANE)
    start_us = step_end_us - t.window_ms * 1e3
    for sp in t.spans:
        w.add(te.complete(f"{OP_NAMES[sp.op]} micro-batch {sp.micro_batch}", "pipeline", round(start_us + sp.start_ms *
                          1e3, 3), (sp.end_ms - sp.start_ms) * 1e3, pid, tid,
                          {"step": t.step, "stage": t.stage, "micro_batch": sp.micro_batch}))


def _event_events(w: TraceWriter, frame: RunFrame, rank: int, m: Event) -> None:
    pid, tid = frame.pid(rank), te.tid_of(rank, te.STEP_LANE)
    at = te.us(frame.aligned_s(rank, m.ts), frame.origin_s)
    hang = msgspec.to_builtins(m.hang, str_keys=True) if m.hang is not None else {}
    w.add(te.instant(m.text or m.kind, m.kind or "event", at, pid, tid,
                     {"level": m.level, "step": m.step, **m.data, **hang}))
    for v in m.data.get("verdicts", []) if isinstance(m.data.get("verdicts"), list) else []:
        if isinstance(v, dict) and v.get("text"):
            w.add(te.instant(str(v["text"]), "verdict", at, pid, tid, {"advice": v.get("advice", ""),
                                                                         "rank": v.get("rank")}))


def _stall_events(w: TraceWriter, frame: RunFrame, rank: int, m: Stall) -> None:
    pid, o = frame.pid(rank), frame.origin_s
    at_s = frame.aligned_s(rank, m.ts)
    name = STALL_NAMES.get(m.state, m.state)
    if m.phase and m.state != "recovered":
        name = f"{name} in {m.phase}"
    w.add(te.instant(name, "stall", te.us(at_s, o), pid, te.tid_of(rank, te.STEP_LANE),
                     {"step": m.step, "running_s": m.running_s, "threshold_s": m.threshold_s, "where": m.where}))
    for c in m.in_flight:
        start_us, dur_us = te.us(at_s - c.age_s, o), c.age_s * 1e6
        w.add(te.complete(f"{c.kind} (in flight)", "collective", start_us, dur_us, pid,
                          frame.comm_tid(rank, start_us, dur_us), {"group": c.group, "seq": c.seq, "bytes": c.bytes,
                                                                   "shapes": c.shapes}))


def _call_events(w: TraceWriter, frame: RunFrame, rank: int, m: CollectiveCalls, step_start_us: float) -> None:
    """A step's collectives: each from its issue to its completion on the rank's communication
    tracks (an instant at its issue where it had not completed when the step was reported), and
    the wait on it on the rank's waits track, all placed from the step's start."""
    pid = frame.pid(rank)
    for c in m.calls:
        args = {"group": c.group, "seq": c.seq, "bytes": c.bytes, "step": m.step}
        if c.device:
            args["clock"] = "device: completion and wait from the step's first CUDA event"
        issued_us = round(step_start_us + c.issued_ms * 1e3, 3)
        if c.done_ms is not None:
            dur_us = (c.done_ms - c.issued_ms) * 1e3
            w.add(te.complete(c.kind, "collective", issued_us, dur_us, pid, frame.comm_tid(rank, issued_us, dur_us),
                              args))
            frame.drawn.add(rank, c.group, c.seq)
        else:
            w.add(te.instant(f"{c.kind} issued", "collective", issued_us, pid, te.tid_of(rank, te.COMM_LANE), args))
        if c.wait_start_ms is not None and c.wait_end_ms is not None:
            start_us = round(step_start_us + c.wait_start_ms * 1e3, 3)
            dur_us = (c.wait_end_ms - c.wait_start_ms) * 1e3
            w.add(te.complete(f"{c.kind} wait", "collective wait", start_us, dur_us, pid,
                              frame.wait_tid(rank, start_us, dur_us), args))
    if m.dropped:
        w.add(te.instant(f"{m.dropped} more collectives not logged", "collective", step_start_us, pid,
                         te.tid_of(rank, te.COMM_LANE), {"step": m.step, "dropped": m.dropped}))


def second_pass(w: TraceWriter, logs: list[tuple[int, Path]], frame: RunFrame, window: StepWindow,
                profiled: dict[int, list[int]]) -> dict[tuple[int, int], tuple[float, float]]:
    """Every rank's events; returns (start, end) µs of the profiled steps, for the traces' shift."""
    ends: dict[tuple[int, int], float] = {}
    for rank, path in logs:
        timelines: dict[int, Timeline] = {}
        firsts = profiled.get(rank, [])
        placed: tuple[int, float] | None = None  # the last step drawn, its start (µs): its `calls` follow it
        for m in messages(path):
            if isinstance(m, Step):
                if not window.has(m.step):
                    continue
                end_us = _step_events(w, frame, rank, m)
                start_us = end_us - m.step_ms * 1e3
                placed = (m.step, start_us)
                t = timelines.pop(m.step, None)
                if t is not None:
                    _timeline_events(w, frame, rank, t, end_us)
                timelines = {s: t for s, t in timelines.items() if s > m.step}
                if any(f <= m.step < f + PROFILED_STEPS_MAX for f in firsts):
                    ends[(rank, m.step)] = (start_us, end_us)
            elif isinstance(m, Timeline) and window.has(m.step):
                timelines[m.step] = m
            elif isinstance(m, CollectiveCalls) and placed is not None and placed[0] == m.step:
                _call_events(w, frame, rank, m, placed[1])
            elif isinstance(m, Event) and _kept(frame, window, rank, m.ts, m.step):
                _event_events(w, frame, rank, m)
            elif isinstance(m, Stall) and _kept(frame, window, rank, m.ts, m.step or -1):
                _stall_events(w, frame, rank, m)
            elif isinstance(m, Bye) and _kept(frame, window, rank, m.ts, -1):
                w.add(te.instant(f"rank {rank} ended: {m.reason}" if m.reason else f"rank {rank} ended", "end",
                                 te.us(frame.aligned_s(rank, m.ts), frame.origin_s), frame.pid(rank),
                                 te.tid_of(rank, te.STEP_LANE), {"ok": m.ok, "step": m.step}))
    return ends


def _kept(frame: RunFrame, window: StepWindow, rank: int, ts: float, step: int) -> bool:
    if step >= 0:
        return window.has(step)
    return frame.lo_s <= frame.aligned_s(rank, ts) <= frame.hi_s


def ledger_events(w: TraceWriter, frame: RunFrame, dumps: Path) -> list[str]:
    """Each collective of the ledger dumps (`ctl dump`) that the logs' `calls` did not draw, issue
    to completion, on the rank's communication track; returns what was left out and why."""
    notes = []
    for path in sorted(dumps.glob("ledger-rank-*.json")):
        try:
            ledger = json.loads(path.read_text())
            rank, wall_ts, perf_ns = int(ledger["rank"]), float(ledger["wall_ts"]), int(ledger["perf_ns"])
        except (OSError, ValueError, KeyError, TypeError):
            notes.append(f"{path.name}: no wall-clock mark (written by an older ringtop), left out")
            continue
        if rank not in frame.hosts and frame.hosts:
            continue
        pid = frame.pid(rank)
        for e in sorted(ledger.get("collectives", []), key=lambda e: e["issued_ns"]):
            issued_s = frame.aligned_s(rank, wall_ts - (perf_ns - e["issued_ns"]) / 1e9)
            if not frame.lo_s <= issued_s <= frame.hi_s or frame.drawn.has(rank, e.get("group", ""), e.get("seq", -1)):
                continue
            done = e.get("done_ns") or 0
            dur_us = ((done or perf_ns) - e["issued_ns"]) / 1e3
            name = e["kind"] if done else f"{e['kind']} (not completed)"
            start_us = te.us(issued_s, frame.origin_s)
            w.add(te.complete(name, "collective", start_us, dur_us, pid, frame.comm_tid(rank, start_us, dur_us),
                              {"group": e.get("group", ""), "seq": e.get("seq"), "bytes": e.get("nbytes", 0),
                               "shapes": e.get("shapes", ""), "group_size": e.get("group_size", 0)}))
    return notes


def profiles(run_dir: Path) -> list[tuple[int, int, Path]]:
    """(rank, first step, path) of each `ctl profile` trace in the run folder."""
    found = ((PROFILE_NAME.search(p.name), p) for p in (run_dir / "profile").glob("step-*-rank-*.json"))
    return sorted((int(m.group(2)), int(m.group(1)), p) for m, p in found if m)


def profile_events(w: TraceWriter, frame: RunFrame, rank: int, path: Path,
                   ends: dict[tuple[int, int], tuple[float, float]]) -> str | None:
    """A profiler trace's spans under the rank's profiler tracks, shifted onto the run's clock;
    a note when it was left out."""
    if frame.hosts and rank not in frame.hosts:
        return None
    try:
        events = json.loads(path.read_text()).get("traceEvents", [])
    except (OSError, ValueError, AttributeError):
        return f"{path.name}: not a readable trace, left out"
    pairs = []
    for e in events:
        m = PROFILE_STEP.match(str(e.get("name", ""))) if e.get("ph") == "X" else None
        if m and (rank, int(m.group(1))) in ends:
            start, end = ends[(rank, int(m.group(1)))]
            pairs.append((start, end, float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))))
    if not pairs:
        return f"{path.name}: none of its steps is in the selected steps, left out"
    shift = te.profiler_shift_us(pairs)
    pid = frame.pid(rank)
    threads: dict[Any, list[dict[str, Any]]] = {}
    for e in events:
        if e.get("ph") in ("X", "i") and "ts" in e:
            threads.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    lane = te.PROFILER_LANE
    for key, spans in threads.items():
        spans.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0))))
        nesting = te.NestingLanes()
        for e in spans:
            ts, dur = round(float(e["ts"]) + shift, 3), float(e.get("dur", 0))
            name, cat = str(e.get("name", "")), str(e.get("cat", "profiler"))
            if e["ph"] == "X":
                tid = te.tid_of(rank, lane + nesting.place(ts, ts + dur))
                w.add(te.complete(name, cat, ts, dur, pid, tid, e.get("args")))
            else:
                w.add(te.instant(name, cat, ts, pid, te.tid_of(rank, lane), e.get("args")))
        used = max(len(nesting._open), 1)
        for i in range(used):
            if lane + i < te.LANES:
                thread = f" ({key[1]})" if key[1] not in (None, "") else ""
                w.labels[(pid, te.tid_of(rank, lane + i))] = f"rank {rank} profiler{thread}"
        lane += used
    return None


def write_trace(run_dir: Path, out: IO[str], window: StepWindow, align: bool = True) -> dict[str, Any]:
    """The whole timeline into `out`; returns the facts also written as the file's otherData."""
    logs = rank_logs(run_dir)
    frame = first_pass(logs, window, align)
    found = profiles(run_dir)
    profiled: dict[int, list[int]] = {}
    for rank, first, _ in found:
        profiled.setdefault(rank, []).append(first)
    w = TraceWriter(out)
    ends = second_pass(w, logs, frame, window, profiled)
    notes = ledger_events(w, frame, run_dir / "dumps")
    for rank, _, path in found:
        note = profile_events(w, frame, rank, path, ends)
        if note:
            notes.append(note)
    _tracks(w, frame)
    other = {"source": "ringtop trace", "run_dir": str(run_dir), "ranks": len(logs), "steps": frame.steps,
             "clock_origin_unix_s": frame.origin_s, "clock": "aligned by step ends" if align else "wall",
             "host_offsets_ms": {h or "unknown": round(s * 1e3, 3) for h, s in frame.offsets_s.items()},
             "notes": notes}
    w.close(other)
    other["events"] = w.count
    return other


def add_arguments(parser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run's --log-dir (its rank-R.jsonl files)")
    parser.add_argument("-o", "--output", default=None, metavar="FILE",
                        help="where the timeline goes (default RUN_DIR/trace.json; - for stdout)")
    parser.add_argument("--from", dest="first", type=int, default=None, metavar="STEP", help="first step kept")
    parser.add_argument("--to", dest="last", type=int, default=None, metavar="STEP", help="last step kept")
    parser.add_argument("--clock", choices=("steps", "wall"), default="steps",
                        help="steps: hosts' clocks aligned by their step ends (default); wall: each host's own")


@contextlib.contextmanager
def _trace_file(run_dir: Path, output: str | None) -> Iterator[IO[str]]:
    """`-o FILE` where the user says (a link at its name refused); by default DEFAULT_NAME in the
    run's own folder, replaced whole (a link planted there is replaced, not followed)."""
    if output:
        with safe_files.output_file(output, encoding="utf-8") as f:
            yield f
        return
    folder = safe_files.open_dir(run_dir, create=False, what="log folder")
    try:
        with safe_files.replacing(folder, DEFAULT_NAME, encoding="utf-8") as f:
            yield f
    finally:
        os.close(folder)


def main(args) -> int:
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir() or not rank_logs(run_dir):
        print(f"ringtop trace: error: no rank-R.jsonl files in {str(run_dir)!r} (a run's --log-dir holds them)",
              file=sys.stderr)
        return 2
    if args.first is not None and args.last is not None and args.first > args.last:
        print(f"ringtop trace: error: --from {args.first} is after --to {args.last}", file=sys.stderr)
        return 2
    window = StepWindow(args.first, args.last)
    if args.output == "-":
        facts = write_trace(run_dir, sys.stdout, window, args.clock == "steps")
        return 0
    path = Path(args.output) if args.output else run_dir / DEFAULT_NAME
    try:
        with _trace_file(run_dir, args.output) as f:
            facts = write_trace(run_dir, f, window, args.clock == "steps")
    except OSError as exc:
        print(f"ringtop trace: error: {safe_files.not_written(path, exc)}", file=sys.stderr)
        return 1
    if not facts["steps"]:
        print("ringtop trace: no steps in the selected range", file=sys.stderr)
    print(f"ringtop trace: {facts['ranks']} ranks, {facts['steps']} steps, {facts['events']} events -> {path} "
          "(open it in https://ui.perfetto.dev or chrome://tracing)", file=sys.stderr)
    for note in facts["notes"]:
        print(f"  {note}", file=sys.stderr)
    return 0
